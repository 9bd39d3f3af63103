"""The rewrite primitive and the small-file merge (engine/segment_merge.py).

Proved here: a merge keeps every committed record exactly (all columns: offsets,
timestamps and their types, keys, values, headers, producer fields, control records) and
the partition's high watermark, LSO, log start offset and aborted-transaction index; flush
objects become per-partition segments of about ``segment.bytes``; a row filter (key
compaction's) leaves offset gaps that Fetch, the DuckDB view and the Spark reader all
read, and a range it empties has no segment; a rewrite whose segments changed meanwhile is
never committed; the merge policy; the catalog's retired-object bookkeeping.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from compaction_support import (QUIET, committed_tables, data_objects, fresh_catalog, partition_offsets,
                                produce_varied_log, referenced, writer_broker)
from helpers import client_conf, close_engines, consume_all  # noqa: F401
from txlake.catalog.state import (ADD_SEGMENT, CREATE_TOPIC, DELETE_TOPIC, FORGET_OBJECT, LOG_START_OFFSET,
                                  REMOVE_SEGMENT, RETIRE_OBJECT, CatalogState, SegmentInfo)
from txlake.engine.compaction import compact
from txlake.engine.log_reader import LogReader, SegmentCache
from txlake.engine.segment_merge import (MergeRun, StaleRewriteError, plan_merges, replace_segments,
                                         rewrite_segments, swap_actions)
from txlake.formats.records import RECORD_SCHEMA, read_segment


#: the tests of logic run on the in-memory backend; the record-equality test on the local one and S3
local_backends = pytest.mark.parametrize("backend", ["memory"])


def _reader(broker) -> LogReader:
    return LogReader(broker.catalog, SegmentCache(0))


# ----------------------------------------------------------------------------------- merge
@pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_merge_keeps_every_record_and_column_and_the_partition_offsets(storage, close_engines):
    produce_varied_log(storage, "t", partitions=3, flushes=4)
    before_cat = fresh_catalog(storage)
    before = committed_tables(storage, "t", before_cat)
    offsets_before = partition_offsets(before_cat, "t")
    assert sum(t.num_rows for t in before.values()) == 4 * 12 + 2 * 3 + 2 * 3  # records, txn records, markers
    assert any(pc.any(t.column("is_control")).as_py() for t in before.values())
    assert all(len(p.segments) >= 4 for p in before_cat.state.topics["t"].partitions)
    objects_before = referenced(before_cat)

    broker = writer_broker(storage)
    summary = compact(broker, ["t"])

    after_cat = fresh_catalog(storage)
    after = committed_tables(storage, "t", after_cat)
    for p, table in before.items():
        assert after[p].equals(table), f"partition {p} changed"
        assert after[p].schema.equals(RECORD_SCHEMA)
    assert partition_offsets(after_cat, "t") == offsets_before
    # one segment per partition, each its own object, row groups from 0
    paths = set()
    for p in after_cat.state.topics["t"].partitions:
        assert len(p.segments) == 1, p.segments
        (seg,) = p.segments
        assert seg.row_group_start == 0 and seg.record_count == before[p.partition].num_rows
        assert (seg.base_offset, seg.last_offset) == (0, p.high_watermark - 1)
        assert seg.size_bytes == len(storage.object_store().get(seg.path))
        paths.add(seg.path)
        on_disk = read_segment(storage.object_store().get(seg.path), seg.path)
        assert on_disk.equals(before[p.partition])  # the object holds exactly the partition, in offset order
    assert len(paths) == 3 and not paths & objects_before
    # the old objects no segment names any more (flush objects also held __transaction_state's
    # records, which were not compacted) are retired, stamped, and still there for running scans
    gone = objects_before - referenced(after_cat)
    assert gone and set(after_cat.state.retired) == gone
    assert all(stamp is not None for stamp in after_cat.state.retired.values())
    assert objects_before <= data_objects(storage)
    assert (summary.segments_before, summary.segments_after) == (sum(len(p.segments) for p in
                                                                     before_cat.state.topics["t"].partitions), 3)
    assert summary.objects_after == 3 and summary.objects_before == len(referenced(before_cat, "t"))
    assert summary.records_before == summary.records_after and summary.records_removed == 0
    assert summary.bytes_after == sum(len(storage.object_store().get(p)) for p in paths)
    # a second round finds nothing to merge
    again = compact(broker, ["t"])
    assert again.merges == 0 and fresh_catalog(storage).version == after_cat.version


def test_segment_bytes_cuts_the_merged_output(tmp_path, close_engines):
    from conftest import StorageTarget

    storage = StorageTarget(url=f"file://{tmp_path}/root")
    produce_varied_log(storage, "s", partitions=1, flushes=8, per_flush=40, transactions=False,
                       topic_config={"segment.bytes": "6000"})
    before_cat = fresh_catalog(storage)
    before = committed_tables(storage, "s", before_cat)
    total = sum(s.size_bytes for s in before_cat.state.topics["s"].partitions[0].segments)
    assert total > 2 * 6000

    compact(writer_broker(storage, {"storage.orphan.grace.ms": 3_600_000}))
    segs = fresh_catalog(storage).state.topics["s"].partitions[0].segments
    assert committed_tables(storage, "s")[0].equals(before[0])
    assert len(segs) >= 2 and len({s.path for s in segs}) == len(segs)
    for prev, seg in zip(segs, segs[1:]):
        assert seg.base_offset == prev.last_offset + 1  # contiguous: no offset lost or duplicated
    assert all(s.size_bytes <= 2 * 6000 for s in segs), [s.size_bytes for s in segs]


@local_backends
def test_row_groups_are_bounded_by_rows(storage, close_engines):
    produce_varied_log(storage, "r", partitions=1, flushes=3, per_flush=30, transactions=False)
    broker = writer_broker(storage)
    (p,) = broker.catalog.state.topics["r"].partitions
    before = committed_tables(storage, "r")[0]
    rewrite = replace_segments(_reader(broker), broker.commit_under_lock, list(p.segments), target_bytes=1 << 30,
                               max_row_group_rows=25)
    (seg,) = rewrite.segments
    assert seg.row_group_count == -(-90 // 25)
    assert committed_tables(storage, "r")[0].equals(before)


# ----------------------------------------------------------------------------------- row filter / gaps
def _drop_odd(table: pa.Table) -> pa.Table:
    return table.filter(pc.equal(pc.bit_wise_and(table.column("offset"), 1), 0))


@pytest.mark.parametrize("backend", ["file"])
def test_row_filter_gaps_are_read_by_fetch_duckdb_and_spark(storage, close_engines):
    from txlake import OFFSET_BEGINNING, Consumer, TopicPartition

    produce_varied_log(storage, "g", partitions=1, flushes=6, per_flush=10, transactions=False)
    broker = writer_broker(storage)
    segs = list(broker.catalog.state.topics["g"].partitions[0].segments)
    assert len(segs) == 6
    full = committed_tables(storage, "g")[0]
    reader = _reader(broker)
    # offsets 0..19: odd ones dropped (gaps inside a segment); offsets 20..39: all dropped (no segment left)
    r1 = replace_segments(reader, broker.commit_under_lock, segs[:2], target_bytes=1 << 30, row_filter=_drop_odd)
    r2 = replace_segments(reader, broker.commit_under_lock, segs[2:4], target_bytes=1 << 30,
                          row_filter=lambda t: t.slice(0, 0))
    assert r1.records_removed == 10 and r2.records_out == 0 and r2.segments == []
    p = fresh_catalog(storage).state.topics["g"].partitions[0]
    assert [(s.base_offset, s.last_offset) for s in p.segments] == [(0, 18), (40, 49), (50, 59)]
    assert (p.log_start_offset, p.high_watermark, p.last_stable_offset) == (0, 60, 60)
    expected = full.filter(pc.or_(pc.and_(pc.less(full.column("offset"), 20),
                                          pc.equal(pc.bit_wise_and(full.column("offset"), 1), 0)),
                                  pc.greater_equal(full.column("offset"), 40)))
    assert committed_tables(storage, "g")[0].equals(expected)
    want = [(o, v) for o, v in zip(expected.column("offset").to_pylist(), expected.column("value").to_pylist())]

    # Fetch / Consumer: from the start, and from inside each kind of gap
    consumer = Consumer(client_conf(storage, {**QUIET, "group.id": "g", "enable.auto.commit": False}))
    consumer.assign([TopicPartition("g", 0, OFFSET_BEGINNING)])
    msgs = consume_all(consumer, len(want), timeout=10)
    assert [(m.offset(), m.value()) for m in msgs] == want
    assert consumer.position([TopicPartition("g", 0)])[0].offset == 60
    for start, first in ((1, 2), (25, 40)):
        consumer.seek(TopicPartition("g", 0, start))
        assert consume_all(consumer, 1, timeout=5)[0].offset() == first
    consumer.close()
    fetched = broker.fetch("g", 0, 21, isolation_level="read_committed")
    assert fetched.records.column("offset")[0].as_py() == 40

    # DuckDB committed view
    from txlake import duckdb as txduck

    con = txduck.connect(storage.url, storage.options)
    rows = con.execute('SELECT "offset", value FROM g ORDER BY "offset"').fetchall()
    assert [tuple(r) for r in rows] == want
    con.close()

    # Spark reader (planning and reading, without a SparkSession)
    from txlake.spark_connector.batch_read import OffsetRange, arrow_schema, input_partition, kafka_struct, read_input_partition

    state = fresh_catalog(storage).state
    schema = arrow_schema(kafka_struct(False))
    for start, end in ((0, 60), (1, 19), (20, 45)):
        part = input_partition(state, OffsetRange("g", 0, start, end), "read_committed")
        got = [] if part is None else [
            (o, v) for b in read_input_partition(storage.object_store(), part, schema, False)
            for o, v in zip(b.column(b.schema.get_field_index("offset")).to_pylist(),
                            b.column(b.schema.get_field_index("value")).to_pylist())]
        assert got == [(o, v) for o, v in want if start <= o < end], (start, end)
    assert input_partition(state, OffsetRange("g", 0, 20, 40), "read_committed") is None


@local_backends
def test_row_filter_may_only_drop_records(storage, close_engines):
    produce_varied_log(storage, "f", partitions=1, flushes=2, per_flush=5, transactions=False)
    broker = writer_broker(storage)
    segs = list(broker.catalog.state.topics["f"].partitions[0].segments)
    version = broker.catalog.version
    bad = [lambda t: t.take([1, 0]), lambda t: pa.concat_tables([t, t]),
           lambda t: t.set_column(2, "offset", pc.add(t.column("offset"), 100)), lambda t: t.select(["offset"])]
    for row_filter in bad:
        with pytest.raises(ValueError, match="row filter"):
            rewrite_segments(_reader(broker), segs, target_bytes=1 << 30, row_filter=row_filter)
    assert broker.catalog.version == version
    with pytest.raises(ValueError, match="offset order"):
        rewrite_segments(_reader(broker), segs[::-1], target_bytes=1 << 30)


@local_backends
def test_a_rewrite_whose_segments_changed_is_not_committed(storage, close_engines):
    produce_varied_log(storage, "d", partitions=1, flushes=4, per_flush=5, transactions=False)
    broker = writer_broker(storage)
    segs = list(broker.catalog.state.topics["d"].partitions[0].segments)
    rewrite = rewrite_segments(_reader(broker), segs, target_bytes=1 << 30)
    assert all(storage.object_store().exists(s.path) for s in rewrite.segments)
    # DeleteRecords gets there first: the first segment leaves the catalog
    broker.delete_records([("d", 0, segs[1].base_offset)])
    with pytest.raises(StaleRewriteError):
        swap_actions(broker.catalog.state, rewrite, 0)
    before = fresh_catalog(storage)
    assert replace_segments(_reader(broker), broker.commit_under_lock, segs, target_bytes=1 << 30) is None
    after = fresh_catalog(storage)
    assert after.version == before.version
    assert not (data_objects(storage) - referenced(after) - set(after.state.retired) - {s.path for s in rewrite.segments})
    # a topic that is gone
    broker.delete_topics(["d"])
    with pytest.raises(StaleRewriteError):
        swap_actions(broker.catalog.state, rewrite, 0)


# ----------------------------------------------------------------------------------- policy
def _seg(path: str, base: int, last: int, size: int, partition: int = 0, topic: str = "t") -> SegmentInfo:
    return SegmentInfo(topic, partition, path, base, last, last - base + 1, size, 0, 0, 0, 1)


def _state(segments: dict[int, list[SegmentInfo]], segment_bytes: int = 1000, log_start: int = 0) -> CatalogState:
    state = CatalogState()
    state.apply({"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": len(segments),
                 "config": {"segment.bytes": str(segment_bytes)}})
    for p, segs in segments.items():
        for s in segs:
            state.apply(dataclasses.replace(s, partition=p).to_action(s.last_offset + 1, s.last_offset + 1))
    if log_start:
        state.apply({"action": LOG_START_OFFSET, "topic": "t", "partition": 0, "offset": log_start})
    return state


def _plan(state, sizes=None) -> list[tuple[int, tuple[str, ...], bool]]:
    return [(r.partition, tuple(s.path for s in r.segments), r.drop) for r in plan_merges(state, None, sizes)]


def test_merge_policy():
    # small segments merge, cut at segment.bytes; a big one (>= half) stays and splits stretches
    state = _state({0: [_seg("a", 0, 9, 100), _seg("b", 10, 19, 100), _seg("big", 20, 29, 600),
                        _seg("c", 30, 39, 300), _seg("d", 40, 49, 300), _seg("e", 50, 59, 300),
                        _seg("f", 60, 69, 300)]})
    assert _plan(state) == [(0, ("a", "b"), False), (0, ("c", "d", "e"), False)]
    # tiering by records: a merged segment (at least TIER_FLOOR_BYTES) is rewritten only once
    # about MERGE_FACTOR - 1 (3) times its records join it -- (MERGE_FACTOR - 1) / (1 +
    # TIER_SLACK), 294.1 for 100 -- whatever the bytes (flush segments' own headers make them
    # look bigger)
    mib, gib = 1 << 20, 1 << 30
    state = _state({0: [_seg("m", 0, 99, mib), _seg("x", 100, 249, mib // 2), _seg("y", 250, 393, mib // 2)]}, gib)
    assert _plan(state) == [(0, ("x", "y"), False)]  # 294 new records: m (100) stays
    state = _state({0: [_seg("m", 0, 99, mib), _seg("x", 100, 249, mib // 2), _seg("y", 250, 394, mib // 2)]}, gib)
    assert _plan(state) == [(0, ("m", "x", "y"), False)]  # 295 new records: m joins
    # ... and then the next segment is looked at the same way: MERGE_FACTOR segments of one size merge
    state = _state({0: [_seg("m", 0, 99, mib), _seg("n", 100, 129, mib), _seg("x", 130, 159, mib),
                        _seg("y", 160, 189, mib)]}, gib)
    assert _plan(state) == []
    state = _state({0: [_seg("m", 0, 99, mib), _seg("n", 100, 129, mib), _seg("x", 130, 159, mib),
                        _seg("y", 160, 189, mib), _seg("z", 190, 219, mib)]}, gib)
    assert _plan(state) == [(0, ("n", "x", "y", "z"), False)]
    # a group that makes a segment of at least half of segment.bytes is merged whole
    state = _state({0: [_seg("m", 0, 99, 300 * mib), _seg("n", 100, 199, 300 * mib)]}, gib)
    assert _plan(state) == [(0, ("m", "n"), False)]
    state = _state({0: [_seg("m", 0, 99, 200 * mib), _seg("n", 100, 199, 300 * mib)]}, gib)
    assert _plan(state) == []
    # below the floor a segment is never left out: small segments of one size merge
    state = _state({0: [_seg("m", 0, 99, mib - 1), _seg("x", 100, 109, 2 * mib)]}, gib)
    assert _plan(state) == [(0, ("m", "x"), False)]
    state = _state({0: [_seg("f1", 0, 9, 105), _seg("f2", 10, 19, 100)]})  # two flushes of about one size
    assert _plan(state) == [(0, ("f1", "f2"), False)]
    # a lone segment stays, unless its object is mostly dead
    state = _state({0: [_seg("m", 0, 99, mib), _seg("f1", 100, 109, 100)], 1: [_seg("f1", 0, 9, 50)]}, gib)
    assert _plan(state) == []
    assert _plan(state, {"m": mib, "f1": 150}) == []
    assert _plan(state, {"m": mib, "f1": 400}) == [(0, ("f1",), False), (1, ("f1",), False)]
    # segments wholly below the log start offset are dropped, not rewritten
    state = _state({0: [_seg("a", 0, 9, 100), _seg("b", 10, 19, 100), _seg("c", 20, 29, 100)]}, log_start=10)
    assert _plan(state) == [(0, ("a",), True), (0, ("b", "c"), False)]


def test_a_rounds_rewrite_follows_the_tier_it_completes_not_the_partitions_history():
    """A trickle as the merge policy sees it (issue 14): every round brings 60 flush segments
    of 100 records whose catalog bytes are twice their data (each carries its own headers),
    and the merges of the round before are replaced by segments of the records' data size.
    Rounds rewrite R, R, R, 4R, R, R, R, 4R, ... 16R records (R = 6 000, MERGE_FACTOR 4), a
    merged segment is never rewritten while only flushes of fewer than 3x its records join it,
    and every record is rewritten at most 3 times in 16 rounds. The old bytes-tiering (a
    segment left out only while more than twice the bytes after it) rewrote the merged
    segment in most rounds: 2R, 3R, 4R, then R, 6R, ... records."""
    data_bytes = 500  # a merged record's bytes (R is 3 MB: over TIER_FLOOR_BYTES); a flush segment's are twice that
    segments: list[SegmentInfo] = []
    offset = n = 0
    rewritten: list[int] = []
    times: dict[int, int] = {}  # first offset of a flush -> times its records were rewritten
    for round_ in range(16):
        for _ in range(60):
            segments.append(_seg(f"f{offset}", offset, offset + 99, 100 * 2 * data_bytes))
            times[offset] = 0
            offset += 100
        runs = plan_merges(_state({0: segments}, segment_bytes=1 << 30), None, None)
        rewritten.append(sum(r.record_count for r in runs))
        for run in runs:
            i = segments.index(run.segments[0])
            assert tuple(segments[i:i + len(run.segments)]) == run.segments
            first, last = run.segments[0].base_offset, run.segments[-1].last_offset
            n += 1
            segments[i:i + len(run.segments)] = [_seg(f"m{n}", first, last, (last - first + 1) * data_bytes)]
            for flush in range(first, last + 1, 100):
                times[flush] += 1
        assert [s.record_count for s in segments] == sorted((s.record_count for s in segments), reverse=True)
    r = 6000
    assert rewritten == [r, r, r, 4 * r] * 3 + [r, r, r, 16 * r]
    assert [s.record_count for s in segments] == [16 * r]
    assert sorted(set(times.values())) == [1, 2, 3]  # the last round's flushes went straight into 16R


def test_segments_of_about_one_size_complete_their_tier_in_the_round_that_brings_the_last():
    """The 40-minute round of a measured trickle hour (issue 14): a 4R segment, three R
    segments of the 25-, 30- and 35-minute rounds (60 705, 60 494 and 60 701 records) and
    the round's 607 flush segments (60 728 records). The first R is 0.1% bigger than the
    mean of the others, and without TIER_SLACK it was left out: the round merged only its
    flushes, and the next round merged five R segments (303 328 records, peak RSS 329 MB
    against 269-306 MB for the 4R rounds). With it the 4R merge happens in this round."""
    mib, gib = 1 << 20, 1 << 30
    segments = [_seg("4r", 0, 241_216, 12 * mib), _seg("r25", 241_217, 301_921, 3 * mib),
                _seg("r30", 301_922, 362_415, 3 * mib), _seg("r35", 362_416, 423_116, 3 * mib)]
    offset = 423_117
    flushes = []
    for i in range(607):
        records = 100 + (i < 28)  # 60 728 records
        flushes.append(_seg(f"f{i}", offset, offset + records - 1, 10_000))
        offset += records
    runs = plan_merges(_state({0: segments + flushes}, gib), None, None)
    assert [(tuple(s.path for s in r.segments[:3]), len(r.segments), r.record_count) for r in runs] == [
        (("r25", "r30", "r35"), 3 + 607, 60_705 + 60_494 + 60_701 + 60_728)]


# ----------------------------------------------------------------------------------- catalog bookkeeping
def test_catalog_retires_objects_when_their_last_segment_goes_and_checkpoints_them():
    state = _state({0: [_seg("a", 0, 9, 100), _seg("f", 10, 19, 100)], 1: [_seg("f", 0, 9, 100)]})
    assert state.reference_count("f") == 2 and state.retired == {}
    # a compaction swap: remove + add + retire_object in one commit
    state.apply({"action": REMOVE_SEGMENT, "topic": "t", "partition": 0, "path": "a", "base_offset": 0})
    state.apply({"action": RETIRE_OBJECT, "path": "a", "timestamp_ms": 500})
    assert state.retired == {"a": 500}
    # an object still named elsewhere is not retired (a retire_object for it is ignored)
    state.apply({"action": REMOVE_SEGMENT, "topic": "t", "partition": 0, "path": "f", "base_offset": 10})
    state.apply({"action": RETIRE_OBJECT, "path": "f", "timestamp_ms": 600})
    assert "f" not in state.retired and state.reference_count("f") == 1
    # DeleteTopics (or DeleteRecords) drops the last one: retired, not yet stamped
    state.apply(_seg("n", 20, 29, 10).to_action(30, 30))
    state.apply({"action": DELETE_TOPIC, "topic": "t", "topic_id": "x"})
    assert state.retired == {"a": 500, "f": None, "n": None}
    rebuilt = CatalogState()
    for action in state.checkpoint_actions():
        rebuilt.apply(action)
    assert rebuilt.retired == state.retired
    state.apply({"action": RETIRE_OBJECT, "path": "f", "timestamp_ms": 700})
    state.apply({"action": FORGET_OBJECT, "path": "a"})
    assert state.retired == {"f": 700, "n": None}
    assert {a["action"] for a in state.checkpoint_actions()} == {RETIRE_OBJECT}


@local_backends
def test_swap_actions_keep_high_watermark_lso_and_log_start(storage, close_engines):
    produce_varied_log(storage, "w", partitions=1, flushes=3, per_flush=4, transactions=False)
    broker = writer_broker(storage)
    p = broker.catalog.state.topics["w"].partitions[0]
    rewrite = rewrite_segments(_reader(broker), list(p.segments), target_bytes=1 << 30)
    actions = swap_actions(broker.catalog.state, rewrite, 1234)
    kinds = [a["action"] for a in actions]
    assert kinds == [REMOVE_SEGMENT] * 3 + [ADD_SEGMENT] + [RETIRE_OBJECT] * 3
    (add,) = [a for a in actions if a["action"] == ADD_SEGMENT]
    assert (add["high_watermark"], add["last_stable_offset"]) == (p.high_watermark, p.last_stable_offset)
    assert all(a["timestamp_ms"] == 1234 for a in actions if a["action"] == RETIRE_OBJECT)
    assert MergeRun("w", 0, tuple(p.segments), 1).record_count == 12
