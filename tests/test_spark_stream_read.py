"""The Spark source, streaming: ``spark.readStream.format("txlake")``.

Micro-batches end at each partition's LSO (only committed records), ``maxOffsetsPerTrigger``
splits a backlog across partitions as Spark's Kafka source does, ``Trigger.AvailableNow``
stops at the ends seen when the query started, a query restarted from its checkpoint
replays an unfinished batch with exactly the same records and then goes on without loss or
duplicates, and partitions of topics created later are read from their start.

Spark plans and reads in Python worker processes, so the Spark tests use ``file`` and
``s3`` roots (not ``memory://``). The unit tests drive :class:`TxlakeStreamReader`
directly, as Spark's driver-side Python process does.
"""

from __future__ import annotations

import time

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from spark_support import backend, close_engines, file_storage, source_options, spark  # noqa: F401
from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from txlake.engine import registry
from txlake.spark_connector.batch_read import DataLossError
from txlake.spark_connector.stream_read import TxlakeStreamReader, offset_json, parse_offset, rate_limit

pytestmark = pytest.mark.usefixtures("close_engines")  # no writer lease left behind

TXN_CONF = {"transaction.state.log.num.partitions": 3, "storage.flush.linger.ms": 1}


def create(target, **topics: int) -> None:
    with AdminClient({**target.conf(), **TXN_CONF}) as admin:
        for f in admin.create_topics([NewTopic(name, n) for name, n in topics.items()]).values():
            f.result()


def committed(target, topics: dict[str, int]) -> list[tuple]:
    """``(topic, partition, offset, value)`` of every record a read_committed Consumer reads."""
    c = Consumer({**target.conf(), "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(t, p, 0) for t, n in topics.items() for p in range(n)])
    out = []
    while msgs := c.consume(500, 0.5):
        out += [(m.topic(), m.partition(), m.offset(), m.value()) for m in msgs if m.error() is None]
    c.close()
    return sorted(out)


def put(producer, topic, partition, n, prefix):
    for i in range(n):
        producer.produce(topic, value=f"{prefix}{i}", partition=partition)
    producer.flush(30)


# ---------------------------------------------------------------- the reader, driven directly
def test_rate_limit_splits_like_sparks_kafka_source():
    a, b, c = ("t", 0), ("t", 1), ("u", 0)
    assert rate_limit(11, {a: 0, b: 0}, {a: 100, b: 10}, {}) == {a: 10, b: 1}
    assert rate_limit(5, {a: 0, b: 0}, {a: 100, b: 10}, {}) == {a: 4, b: 1}       # small backlog: at least 1
    assert rate_limit(50, {a: 90, b: 10}, {a: 100, b: 10}, {}) == {a: 100, b: 10}
    assert rate_limit(4, {a: 0}, {a: 4, c: 4}, {c: 2}) == {a: 2, c: 3}             # a new partition from its start
    assert rate_limit(4, {a: 5}, {a: 5}, {}) == {a: 5}
    assert offset_json({b: 3, a: 1, c: 7}) == {"t": {"0": 1, "1": 3}, "u": {"0": 7}}
    assert list(offset_json({("t", 10): 1, ("t", 9): 2})["t"]) == ["9", "10"]
    assert parse_offset({"t": {"0": 1, "1": 3}}) == {a: 1, b: 3}


def test_reader_bounds_batches_by_the_lso_and_reports_data_loss(file_storage):
    create(file_storage, ev=2)
    conf = {**file_storage.conf(), **TXN_CONF}
    plain, tx = Producer(conf), Producer({**conf, "transactional.id": "open"})
    put(plain, "ev", 0, 3, "p")
    put(plain, "ev", 1, 2, "q")
    tx.init_transactions(30)
    tx.begin_transaction()
    put(tx, "ev", 0, 2, "t")                       # ev-0 @3, @4: undecided, the LSO stays at 3
    put(plain, "ev", 0, 1, "r")                    # ev-0 @5, above the LSO

    reader = TxlakeStreamReader(source_options(file_storage, subscribe="ev", startingOffsets="earliest",
                                               maxOffsetsPerTrigger=3))
    start = reader.initialOffset()
    assert start == {"ev": {"0": 0, "1": 0}}
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
    assert reader.latestOffset(start, ReadAllAvailable()) == {"ev": {"0": 3, "1": 2}}
    assert reader.latestOffset(start, ReadMaxRows(3)) == {"ev": {"0": 1, "1": 1}}
    assert TxlakeStreamReader(source_options(file_storage, subscribe="ev")).initialOffset() == {"ev": {"0": 3, "1": 2}}

    reader.prepareForTriggerAvailableNow()
    tx.commit_transaction(30)                      # ev-0 now ends at 7 (COMMIT @6), past the AvailableNow target
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"ev": {"0": 3, "1": 2}}
    parts = reader.partitions(start, end)
    values = sorted((b["partition"], b["offset"], b["value"]) for part in parts for batch in reader.read(part)
                    for b in batch.to_pylist())
    assert values == [(0, 0, b"p0"), (0, 1, b"p1"), (0, 2, b"p2"), (1, 0, b"q0"), (1, 1, b"q1")]
    assert reader.partitions(end, end) == []
    later = TxlakeStreamReader(source_options(file_storage, subscribe="ev"))
    assert later.latestOffset(end, ReadAllAvailable()) == {"ev": {"0": 7, "1": 2}}

    with AdminClient(conf) as admin:
        admin.delete_topics(["ev"])["ev"].result()
    with pytest.raises(DataLossError, match="partitions ev-0, ev-1 are gone"):
        later.partitions(end, later.latestOffset(end, ReadAllAvailable()))
    tolerant = TxlakeStreamReader(source_options(file_storage, subscribe="ev", failOnDataLoss="false"))
    assert tolerant.partitions(end, {"ev": {"0": 9, "1": 2}}) == []
    for p in (plain, tx):
        p.close()


# ---------------------------------------------------------------- through Spark
class Collector:
    """foreachBatch target: rows per batch id; a batch id seen again must bring the same rows."""

    def __init__(self):
        self.batches: dict[int, list[tuple]] = {}
        self.replayed: list[int] = []

    def __call__(self, df, batch_id):
        got = sorted((r.topic, r.partition, r.offset, bytes(r.value))
                     for r in df.select("topic", "partition", "offset", "value").collect())
        if batch_id in self.batches:
            assert got == self.batches[batch_id], f"batch {batch_id} replayed with other records"
            self.replayed.append(batch_id)
        self.batches[batch_id] = got

    def records(self) -> list[tuple]:
        return sorted(r for rows in self.batches.values() for r in rows)


def run_available_now(target, checkpoint, collector, **options):
    reader = spark().readStream.format("txlake")
    for k, v in source_options(target, **options).items():
        reader = reader.option(k, v)
    query = (reader.load().writeStream.foreachBatch(collector).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert not query.isActive
    assert query.exception() is None


def test_available_now_restart_no_loss_no_duplicates(storage, tmp_path):
    """maxOffsetsPerTrigger splits the backlog into batches that stop at the LSO; a restart
    after a crash between a batch and its commit replays that batch with the same records;
    a later run picks up what was committed since and a new topic matching the pattern."""
    create(storage, ev=2, other=1)
    conf = {**storage.conf(), **TXN_CONF}
    plain = Producer(conf)
    ta, tb, tc = (Producer({**conf, "transactional.id": i}) for i in ("ta", "tb", "tc"))
    for p in (ta, tb, tc):
        p.init_transactions(30)
    put(plain, "ev", 0, 6, "p")                    # ev-0 @0..5
    put(plain, "ev", 1, 6, "q")                    # ev-1 @0..5
    ta.begin_transaction(); put(ta, "ev", 0, 2, "a"); put(ta, "ev", 1, 2, "b"); ta.commit_transaction(30)
    tb.begin_transaction(); put(tb, "ev", 0, 2, "x"); tb.abort_transaction(30)       # ev-0 @9, @10 aborted
    tc.begin_transaction(); put(tc, "ev", 1, 2, "c")                                 # ev-1 @9, @10 open: LSO 9
    put(plain, "ev", 0, 1, "r")                    # ev-0 @12
    put(plain, "other", 0, 2, "o")                 # not matched by the pattern
    checkpoint, seen = tmp_path / "checkpoint", Collector()
    options = dict(subscribePattern="ev.*", startingOffsets="earliest", maxOffsetsPerTrigger=12)

    run_available_now(storage, checkpoint, seen, **options)
    # backlog 13 + 9 offsets, 12 per batch: 12*13/22 -> 7 and 12*9/22 -> 4 (Spark's proportional split), then the rest
    assert sorted(seen.batches) == [0, 1]
    assert sorted((p, o) for _, p, o, _ in seen.batches[0]) == [(0, o) for o in range(7)] + [(1, o) for o in range(4)]
    assert seen.records() == committed(storage, {"ev": 2})
    assert all(p != 1 or o < 9 for _, p, o, _ in seen.records())

    (checkpoint / "commits" / "1").unlink()        # "crash" after batch 1 ran, before Spark recorded it
    crc = checkpoint / "commits" / ".1.crc"
    if crc.exists():
        crc.unlink()
    run_available_now(storage, checkpoint, seen, **options)
    assert seen.replayed == [1] and sorted(seen.batches) == [0, 1]

    tc.commit_transaction(30)                      # ev-1 @9, @10 committed (COMMIT @11)
    put(plain, "ev", 1, 2, "s")                    # ev-1 @12, @13
    create(storage, ev2=1)
    put(plain, "ev2", 0, 3, "n")                   # a new partition: read from its start
    run_available_now(storage, checkpoint, seen, **options)
    assert sorted(seen.batches) == [0, 1, 2]
    assert seen.records() == committed(storage, {"ev": 2, "ev2": 1})
    assert len(seen.records()) == len(set(seen.records()))
    for p in (plain, ta, tb, tc):
        p.close()


def test_running_query_sees_only_committed_records(file_storage):
    """A running query (processing-time trigger) gets a transaction's records only once it
    commits, never an aborted one's."""
    create(file_storage, live=1)
    conf = {**file_storage.conf(), **TXN_CONF}
    tx, plain = Producer({**conf, "transactional.id": "live-tx"}), Producer(conf)
    tx.init_transactions(30)
    tx.begin_transaction()
    put(tx, "live", 0, 2, "t")                     # open from offset 0: nothing is stable yet
    reader = spark().readStream.format("txlake")
    for k, v in source_options(file_storage, subscribe="live", startingOffsets="earliest").items():
        reader = reader.option(k, v)
    query = (reader.load().selectExpr("offset", "CAST(value AS STRING) AS v").writeStream.format("memory")
             .queryName("live_records").trigger(processingTime="100 milliseconds").start())
    try:
        def values():
            query.processAllAvailable()
            return sorted(tuple(r) for r in spark().sql("SELECT offset, v FROM live_records").collect())

        put(plain, "live", 0, 1, "p")              # @2, behind the open transaction
        assert values() == []
        tx.commit_transaction(30)                  # COMMIT @3
        assert values() == [(0, "t0"), (1, "t1"), (2, "p0")]
        tx.begin_transaction(); put(tx, "live", 0, 1, "x"); tx.abort_transaction(30)   # @4, ABORT @5
        put(plain, "live", 0, 1, "q")              # @6
        deadline = time.monotonic() + 30
        while (got := values()) != [(0, "t0"), (1, "t1"), (2, "p0"), (6, "q0")] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert got == [(0, "t0"), (1, "t1"), (2, "p0"), (6, "q0")]
    finally:
        query.stop()
        for p in (tx, plain):
            p.close()
