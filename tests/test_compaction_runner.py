"""The compaction runner (engine/compaction.py) and the object lifecycle (engine/object_cleaner.py).

Proved here: a scan that started before a compaction (an old catalog snapshot, a Spark
partition being read, a DuckDB connection) finishes correctly, the replaced objects are
deleted exactly ``storage.file.delete.delay.ms`` after the swap (by the catalog's stamp,
not the object's age) and a new reader then reads the new ones; objects DeleteRecords and
DeleteTopics dropped wait for the same grace and are never taken for orphans; orphans of
crashed writes go after the orphan grace; a dry run changes nothing; the background thread
compacts while producers write and stops with the writer; retention and key compaction
run through the same round.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from compaction_support import (QUIET, committed_tables, data_objects, fresh_catalog, produce_varied_log, referenced,
                                writer_broker)
from helpers import client_conf, close_engines  # noqa: F401
from txlake.catalog.errors import UnknownTopicError
from txlake.engine.compaction import compact
from txlake.engine.log_reader import LogReader, SegmentCache

DELAY = 60_000  # storage.file.delete.delay.ms of these tests; time is passed to compact() as now_ms


def _now() -> int:
    return int(time.time() * 1000)


@pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_scan_started_before_compaction_finishes_and_old_objects_go_after_the_grace(storage, close_engines):
    from txlake.spark_connector.batch_read import OffsetRange, arrow_schema, input_partition, kafka_struct, read_input_partition
    from txlake import duckdb as txduck

    produce_varied_log(storage, "t", partitions=2, flushes=3, per_flush=10, transactions=False)
    old = fresh_catalog(storage)  # a reader's snapshot, taken before the compaction
    expected = committed_tables(storage, "t", old)
    old_objects = referenced(old, "t")
    # a Spark task reading partition 0 row group by row group: one batch read before the swap
    p0 = old.state.topics["t"].partitions[0]
    part = input_partition(old.state, OffsetRange("t", 0, 0, p0.high_watermark), "read_uncommitted")
    scan = read_input_partition(storage.object_store(), part, arrow_schema(kafka_struct(False)), False)
    first = next(scan)
    con = txduck.connect(storage.url, storage.options)  # its views name the old objects
    count = con.execute("SELECT count(*) FROM t").fetchone()[0]

    broker = writer_broker(storage, {"storage.file.delete.delay.ms": DELAY, "storage.orphan.grace.ms": 0})
    now = _now()
    summary = compact(broker, now_ms=now)
    assert summary.merges >= 2 and summary.objects_after < summary.objects_before
    new = fresh_catalog(storage)
    assert not referenced(new, "t") & old_objects

    # the old snapshot still reads everything it names; the Spark task and DuckDB finish
    assert all(committed_tables(storage, "t", old)[p].equals(t) for p, t in expected.items())
    rest = list(scan)
    got = pa.Table.from_batches([first, *rest]).column("offset").to_pylist()
    assert got == expected[0].column("offset").to_pylist()
    assert con.execute("SELECT count(*) FROM t").fetchone()[0] == count

    # inside the grace nothing goes, even with orphan grace 0 (retired objects are not orphans)
    inside = compact(broker, now_ms=now + DELAY - 1)
    assert inside.deleted_objects == 0 and inside.orphans_deleted == 0
    gone = set(fresh_catalog(storage).state.retired)
    assert gone and gone <= data_objects(storage)
    # at the grace they go, and the catalog forgets them
    after = compact(broker, now_ms=now + DELAY)
    assert after.deleted_objects == len(gone)
    assert not gone & data_objects(storage)
    assert fresh_catalog(storage).state.retired == {}
    with pytest.raises(FileNotFoundError):
        committed_tables(storage, "t", old)  # a snapshot older than the grace fails, as a Kafka fetch would
    # a new reader reads the new objects: the same records
    assert all(committed_tables(storage, "t")[p].equals(t) for p, t in expected.items())
    txduck.refresh(con)
    assert con.execute("SELECT count(*) FROM t").fetchone()[0] == count
    con.close()
    # every object left is named by the catalog (nothing leaks)
    assert data_objects(storage) == referenced(fresh_catalog(storage))


@pytest.mark.parametrize("backend", ["memory"])
def test_objects_dropped_by_delete_records_and_delete_topics_wait_for_the_grace(storage, close_engines):
    produce_varied_log(storage, "d", partitions=1, flushes=3, per_flush=5, transactions=False)
    produce_varied_log(storage, "x", partitions=1, flushes=1, per_flush=5, transactions=False)
    broker = writer_broker(storage, {"storage.file.delete.delay.ms": DELAY, "storage.orphan.grace.ms": 0})
    segs = broker.catalog.state.topics["d"].partitions[0].segments
    dropped = {segs[0].path, segs[1].path}
    x_objects = referenced(broker.catalog, "x")
    broker.delete_records([("d", 0, segs[2].base_offset)])
    broker.delete_topics(["x"])
    state = fresh_catalog(storage).state
    assert {p: state.retired.get(p, "missing") for p in dropped | x_objects} == {p: None for p in dropped | x_objects}

    now = _now()
    first = compact(broker, now_ms=now)  # stamps them; orphan grace 0 must not take them (the orphans
    assert first.deleted_objects == 0      # it deletes are replaced producer-state snapshots)
    assert dropped | x_objects <= data_objects(storage)
    assert all(fresh_catalog(storage).state.retired[p] == now for p in dropped | x_objects)
    assert compact(broker, now_ms=now + DELAY - 1).deleted_objects == 0
    assert compact(broker, now_ms=now + DELAY).deleted_objects == len(dropped | x_objects)
    assert not (dropped | x_objects) & data_objects(storage)
    assert [(o, v) for o, v in zip(*[committed_tables(storage, "d")[0].column(c).to_pylist()
                                     for c in ("offset", "value")])][0][0] == segs[2].base_offset


@pytest.mark.parametrize("backend", ["file"])
def test_orphans_of_crashed_writes_go_after_their_grace(storage, close_engines):
    produce_varied_log(storage, "o", partitions=1, flushes=2, per_flush=5, transactions=False)
    broker = writer_broker(storage)
    store = storage.object_store()
    source = sorted(referenced(broker.catalog, "o"))[0]
    orphan = "data/0000000000000-0000000000000000000000000orphan.parquet"
    store.put(orphan, store.get(source))
    time.sleep(0.02)
    assert compact(broker).orphans_deleted == 0 and store.exists(orphan)  # 1 hour of orphan grace
    broker.config.orphan_grace_ms = 0
    assert compact(broker, dry_run=True).orphans_deleted == 1 and store.exists(orphan)
    assert compact(broker).orphans_deleted == 1 and not store.exists(orphan)
    assert committed_tables(storage, "o")[0].num_rows == 10


@pytest.mark.parametrize("backend", ["memory"])
def test_dry_run_changes_nothing(storage, close_engines):
    produce_varied_log(storage, "n", partitions=2, flushes=4, per_flush=6, transactions=False)
    broker = writer_broker(storage)
    version, objects = fresh_catalog(storage).version, data_objects(storage)
    phases = []
    plan = compact(broker, dry_run=True, progress=lambda phase, done, total: phases.append(phase))
    assert plan.dry_run and plan.merges == 2
    assert (plan.objects_before, plan.objects_after) == (len(objects), 2)
    assert plan.records_after == plan.records_before == 24 and plan.segments_after == 2
    assert fresh_catalog(storage).version == version and data_objects(storage) == objects
    assert "merge" in phases and phases[-1] == "cleaning"
    done = compact(broker)
    assert (done.objects_after, done.segments_after, done.merges) == (2, 2, 2)
    with pytest.raises(UnknownTopicError, match="nope"):
        compact(broker, ["n", "nope"])


@pytest.mark.parametrize("backend", ["file"])
def test_background_compaction_runs_while_producers_write_and_stops_with_the_writer(storage, close_engines):
    from txlake import AdminClient, NewTopic, Producer

    conf = client_conf(storage, {**QUIET, "storage.compaction.interval.ms": 50})
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("b", num_partitions=2)])["b"].result()
    producer = Producer(conf)
    acked: list[tuple[int, int, bytes]] = []
    lock = threading.Lock()

    def on_delivery(err, msg):
        assert err is None, err
        with lock:
            acked.append((msg.partition(), msg.offset(), msg.value()))

    broker = producer._broker
    thread = broker._compaction
    deadline = time.monotonic() + 20
    i = 0
    while (thread.rounds < 4 or i < 200) and time.monotonic() < deadline:
        for _ in range(10):
            producer.produce("b", value=b"v%d" % i, key=b"k%d" % i, on_delivery=on_delivery)
            i += 1
        producer.flush(10)
    assert thread.rounds >= 4
    producer.flush(10)
    tables = committed_tables(storage, "b")
    got = sorted((p, o, v) for p, t in tables.items()
                 for o, v in zip(t.column("offset").to_pylist(), t.column("value").to_pylist()))
    assert got == sorted(acked) and len(got) == i  # every acknowledged record once, at its offset
    for p, t in tables.items():
        assert t.column("offset").to_pylist() == list(range(t.num_rows))
    assert max(len(p.segments) for p in fresh_catalog(storage).state.topics["b"].partitions) < i // 20
    producer.close()
    admin.close()
    assert broker._closed and not thread._thread.is_alive()


@pytest.mark.parametrize("backend", ["memory"])
def test_retention_moves_the_log_start_in_the_same_round(storage, close_engines):
    from txlake import AdminClient, NewTopic, Producer

    conf = client_conf(storage, QUIET)
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("r", num_partitions=1, config={"retention.ms": "60000"})])["r"].result()
    producer = Producer(conf)
    now = _now()
    for f in range(4):
        for i in range(5):
            producer.produce("r", value=b"v%d.%d" % (f, i), timestamp=now - (200_000 if f < 2 else 0))
        producer.flush(10)
    broker = producer._broker
    summary = compact(broker, ["r"], now_ms=now)
    p = broker.catalog.state.topics["r"].partitions[0]
    assert summary.retention_partitions == 1 and p.log_start_offset == 10
    assert summary.records_removed == 10 and summary.records_after == 10
    assert len(p.segments) == 1 and committed_tables(storage, "r")[0].column("offset").to_pylist() == list(range(10, 20))
    producer.close()
    admin.close()


@pytest.mark.parametrize("backend", ["memory"])
def test_key_compaction_rewrites_compacted_topics_below_the_lso(storage, close_engines, monkeypatch):
    import txlake.engine.compaction

    calls = []

    def row_filter(partition, config, reader, now_ms):
        calls.append((partition.topic, partition.partition, [s.base_offset for s in partition.segments]))
        latest = {}
        for seg in partition.segments:
            t = reader.segment_table(seg)
            for key, offset in zip(t.column("key").to_pylist(), t.column("offset").to_pylist()):
                latest[key] = offset
        keep = set(latest.values())
        return lambda table: table.filter(pa.array([o in keep for o in table.column("offset").to_pylist()]))

    # a plain latest-per-key filter in place of log_cleaner.row_filter: the runner's part alone
    monkeypatch.setattr(txlake.engine.compaction, "make_row_filter", row_filter)

    produce_varied_log(storage, "c", partitions=1, flushes=3, per_flush=14, transactions=False,
                       topic_config={"cleanup.policy": "compact"})
    produce_varied_log(storage, "plain", partitions=1, flushes=2, per_flush=5, transactions=False)
    before = committed_tables(storage, "c")[0]
    plain = committed_tables(storage, "plain")[0]
    segments = fresh_catalog(storage).state.topics["c"].partitions[0].segments
    active = segments[-1].base_offset  # the last segment is never cleaned (Kafka's active segment)
    summary = compact(writer_broker(storage), ["c", "plain"])
    assert calls == [("c", 0, [s.base_offset for s in segments[:-1]])] and summary.key_compacted_partitions == 1
    after = committed_tables(storage, "c")[0]
    last = {k: o for k, o in zip(before.column("key").to_pylist(), before.column("offset").to_pylist()) if o < active}
    kept = sorted(set(last.values())) + list(range(active, 42))
    assert after.column("offset").to_pylist() == kept
    assert after.equals(before.filter(pc.is_in(before.column("offset"), pa.array(kept))))
    assert summary.records_removed == before.num_rows - after.num_rows > 0
    p = fresh_catalog(storage).state.topics["c"].partitions[0]
    assert (p.log_start_offset, p.high_watermark, p.segments[-1].last_offset) == (0, 42, 41)
    assert committed_tables(storage, "plain")[0].equals(plain)


@pytest.mark.parametrize("backend", ["memory"])
def test_a_reader_of_an_old_snapshot_with_a_log_reader_cache(storage, close_engines):
    """The LogReader of a consumer that polled before the swap keeps working through it."""
    produce_varied_log(storage, "q", partitions=1, flushes=3, per_flush=5, transactions=False)
    old = fresh_catalog(storage)
    reader = LogReader(old, SegmentCache())
    first = reader.read("q", 0, 0, 7)
    compact(writer_broker(storage))
    rest = reader.read("q", 0, 7, 15)
    assert first.column("offset").to_pylist() + rest.column("offset").to_pylist() == list(range(15))


@pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_catalog_commits_a_kept_checkpoint_covers_go_after_the_retention(storage, close_engines):
    """Every flush is a catalog commit: a round deletes those a kept checkpoint covers once older
    than ``storage.catalog.retention.ms``, and readers starting afterwards read the same records."""
    from txlake import Consumer, TopicPartition
    from txlake import duckdb as txduck
    from txlake.catalog.log_cleanup import DEFAULT_LOG_RETENTION_MS

    extra = {"storage.checkpoint.interval": 4}
    conf = produce_varied_log(storage, "t", partitions=2, flushes=6, per_flush=4, extra_conf=extra)
    expected = committed_tables(storage, "t")
    broker = writer_broker(storage, extra)
    young = compact(broker, now_ms=_now())
    assert (young.catalog_commits_deleted, young.catalog_checkpoints_deleted) == (0, 0)
    store = storage.object_store()
    assert store.exists("_catalog/commits/00000000000000000001.parquet")

    later = compact(broker, now_ms=_now() + DEFAULT_LOG_RETENTION_MS + 60_000)
    version = broker.catalog.version
    floor = 4 * (version // 4 - 1)  # every checkpoint is expired: the floor is the one below the newest
    assert (later.catalog_commits_deleted, later.catalog_checkpoints_deleted) == (floor, floor // 4 - 1)
    assert [o.key for o in store.list("_catalog/checkpoints/")] == [
        f"_catalog/checkpoints/{v:020d}.parquet" for v in (floor, floor + 4)]
    assert [o.key for o in store.list("_catalog/commits/")] == [
        f"_catalog/commits/{v:020d}.parquet" for v in range(floor + 1, version + 1)]

    # new readers: a catalog view, DuckDB and a consumer see every record, exactly
    fresh = fresh_catalog(storage)
    assert fresh.version == version
    assert all(committed_tables(storage, "t", fresh)[p].equals(t) for p, t in expected.items())
    con = txduck.connect(storage.url, storage.options, isolation_level="read_uncommitted")
    rows = con.execute("SELECT partition, \"offset\" FROM t ORDER BY partition, \"offset\"").fetchall()
    con.close()
    data = {p: [o for o, c in zip(t.column("offset").to_pylist(), t.column("is_control").to_pylist()) if not c]
            for p, t in expected.items()}
    assert rows == [(p, o) for p in sorted(data) for o in data[p]]
    with Consumer({**conf, "group.id": "after-cleanup", "isolation.level": "read_uncommitted"}) as c:
        c.assign([TopicPartition("t", p, 0) for p in expected])
        got: dict[int, list[int]] = {p: [] for p in expected}
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < sum(map(len, data.values())) and time.monotonic() < deadline:
            for m in c.consume(100, 0.1):
                assert m.error() is None
                got[m.partition()].append(m.offset())
    assert got == data
