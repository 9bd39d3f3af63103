"""Key compaction rules (engine/log_cleaner.py): exact kept offsets for hand-built logs, one
rule at a time, the cleanable range of a partition, and a property test against a
dict-based model of read_committed reading."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import close_engines  # noqa: F401  (fixture)
from txlake.catalog.state import AbortedTxn, PartitionState, SegmentInfo
from txlake.engine.log_cleaner import (HORIZON_CHECKPOINT, HORIZON_RECORD_TIMESTAMP, CleanableRange,
                                       CleanerCheckpoint, OffsetMapBuilder, clean_records, cleanable_range,
                                       grab_filthiest, is_compacted, row_filter)
from txlake.formats.records import CONTROL_ABORT, CONTROL_COMMIT, RECORD_SCHEMA

DAY = 86_400_000


class Log:
    """A hand-built partition log: records, transactions and their markers, with offsets."""

    def __init__(self, start: int = 0):
        self.rows: list[dict] = []
        self.next = start
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: list[AbortedTxn] = []

    def put(self, key: str | None, value: str | None, pid: int | None = None, ts: int = 0) -> int:
        """A record; with ``pid`` a transactional one (opening a transaction if none is open)."""
        off = self.next
        if pid is not None:
            self.open.setdefault(pid, off)
        self.rows.append(dict(offset=off, key=None if key is None else key.encode(),
                              value=None if value is None else value.encode(),
                              producer_id=-1 if pid is None else pid, is_transactional=pid is not None,
                              is_control=False, control_type=None, timestamp=ts))
        self.next += 1
        return off

    def _marker(self, pid: int, control_type: int) -> int:
        off = self.next
        first = self.open.pop(pid, off)
        if control_type == CONTROL_ABORT:
            self.aborted.append(AbortedTxn(pid, first, off))
        self.rows.append(dict(offset=off, key=b"\x00\x00\x00" + bytes([control_type]), value=b"\x00\x00\x00\x00\x00\x00",
                              producer_id=pid, is_transactional=True, is_control=True, control_type=control_type,
                              timestamp=0))
        self.next += 1
        return off

    def commit(self, pid: int) -> int:
        return self._marker(pid, CONTROL_COMMIT)

    def abort(self, pid: int) -> int:
        return self._marker(pid, CONTROL_ABORT)

    def gap(self, n: int = 1) -> None:
        self.next += n

    @property
    def lso(self) -> int:
        return min(self.open.values(), default=self.next)

    def table(self) -> pa.Table:
        n = len(self.rows)
        cols = {name: [r.get(name) for r in self.rows] for name in
                ("offset", "timestamp", "key", "value", "producer_id", "is_transactional", "is_control",
                 "control_type")}
        full = {
            "topic": ["t"] * n, "partition": [0] * n, "offset": cols["offset"], "timestamp": cols["timestamp"],
            "timestamp_type": [0] * n, "key": cols["key"], "value": cols["value"], "headers": [None] * n,
            "producer_id": cols["producer_id"], "producer_epoch": [0] * n, "base_sequence": [-1] * n,
            "base_offset": cols["offset"], "last_offset_delta": [0] * n,
            "is_transactional": cols["is_transactional"], "is_control": cols["is_control"],
            "control_type": cols["control_type"], "coordinator_epoch": [None] * n,
        }
        return pa.Table.from_pydict(full, schema=RECORD_SCHEMA)


def offsets(table: pa.Table) -> list[int]:
    return table.column("offset").to_pylist()


def clean(log: Log, table: pa.Table | None = None, cp: int | None = None, now: int = 0, retention: int = DAY,
          checkpoint=None, aborted=None, **kw):
    return clean_records(log.table() if table is None else table, log.aborted if aborted is None else aborted,
                         log.lso if cp is None else cp, now, retention, checkpoint=checkpoint, **kw)


# ------------------------------------------------------------------ latest record per key
def test_latest_record_per_key_is_kept_offsets_unchanged():
    log = Log()
    for k, v in ["a1", "b1", "a2", "c1", "b2", "a3"]:
        log.put(k, v)
    r = clean(log)
    assert offsets(r.table) == [3, 4, 5]
    assert r.table.column("value").to_pylist() == [b"1", b"2", b"3"]
    assert r.table.schema == RECORD_SCHEMA
    assert (r.stats.records_read, r.stats.records_retained, r.stats.superseded) == (6, 3, 3)
    assert r.checkpoint.clean_offset == 6


def test_gaps_in_offsets_are_kept_and_cleaning_is_idempotent():
    log = Log(start=100)
    log.put("a", "1"); log.gap(5); log.put("b", "1"); log.gap(2); log.put("a", "2")
    r = clean(log)
    assert offsets(r.table) == [106, 109]
    again = clean_records(r.table, [], 110, 0, DAY, checkpoint=r.checkpoint)
    assert offsets(again.table) == [106, 109] and again.stats.removed == 0
    assert again.table is r.table  # nothing removed: the input comes back, no copy


def test_nothing_at_or_after_the_cleaning_point_is_touched_or_mapped():
    log = Log()
    log.put("a", "1"); log.put("a", "2"); log.put("a", "3"); log.put("b", None); log.put("a", "4")
    r = clean(log, cp=2, now=10 * DAY, retention=0)
    # a@0 is superseded by a@1; a@1 stays although a@2 (after the cleaning point) is newer
    assert offsets(r.table) == [1, 2, 3, 4]
    assert r.stats.passed_through == 3 and r.stats.records_read == 2
    assert r.table.slice(1).equals(log.table().slice(2))


def test_empty_table_and_cleaning_point_zero():
    empty = RECORD_SCHEMA.empty_table()
    r = clean_records(empty, [], 0, 0, DAY)
    assert r.table.num_rows == 0 and r.stats.records_read == 0
    log = Log(); log.put("a", "1"); log.put("a", "2")
    r = clean(log, cp=0)
    assert offsets(r.table) == [0, 1] and r.checkpoint.tombstone_horizons == ()


# ------------------------------------------------------------------ tombstones
def test_tombstone_kept_until_delete_retention_after_its_first_cleaning():
    log = Log()
    log.put("a", "1"); log.put("b", "1"); log.put("a", None)
    first = clean(log, now=1_000, retention=500)
    assert offsets(first.table) == [1, 2]  # a@0 superseded; the tombstone survives its first cleaning
    assert first.checkpoint.tombstone_horizons == ((3, 1_500),)
    before = clean(log, table=first.table, now=1_499, retention=500, checkpoint=first.checkpoint)
    assert offsets(before.table) == [1, 2]
    after = clean(log, table=first.table, now=1_500, retention=500, checkpoint=first.checkpoint)
    assert offsets(after.table) == [1] and after.stats.tombstones == 1


def test_tombstone_survives_first_cleaning_even_with_zero_retention_and_old_timestamp():
    log = Log()
    log.put("a", "1", ts=1); log.put("a", None, ts=1)  # written long ago: the record timestamp does not count
    first = clean(log, now=50 * DAY, retention=0)
    assert offsets(first.table) == [1]
    second = clean(log, table=first.table, now=50 * DAY, retention=0, checkpoint=first.checkpoint)
    assert offsets(second.table) == []


def test_each_tombstone_has_the_horizon_of_the_run_that_first_cleaned_it():
    log = Log()
    log.put("a", None)                      # 0: first cleaned by run 1
    log.put("b", "1"); log.put("b", None)   # 1, 2: first cleaned by run 2
    r1 = clean(log, cp=1, now=1_000, retention=100)
    assert offsets(r1.table) == [0, 1, 2]
    r2 = clean(log, table=r1.table, cp=3, now=1_050, retention=100, checkpoint=r1.checkpoint)
    assert offsets(r2.table) == [0, 2]
    assert r2.checkpoint.tombstone_horizons == ((1, 1_100), (3, 1_150))
    r3 = clean(log, table=r2.table, cp=3, now=1_100, retention=100, checkpoint=r2.checkpoint)
    assert offsets(r3.table) == [2]
    # the expired range went: its tombstones are gone; the last range still marks how far cleaning reached
    assert r3.checkpoint.tombstone_horizons == ((3, 1_150),)
    r4 = clean(log, table=r3.table, cp=3, now=1_150, retention=100, checkpoint=r3.checkpoint)
    assert offsets(r4.table) == []


def test_superseded_tombstone_goes_at_once_and_a_later_value_stays():
    log = Log()
    log.put("a", "1"); log.put("a", None); log.put("a", "2")
    r = clean(log, now=0, retention=DAY)
    assert offsets(r.table) == [2] and r.stats.superseded == 2


def test_without_a_checkpoint_tombstones_are_never_removed():
    log = Log()
    log.put("a", None)
    for now in (0, DAY, 100 * DAY):
        assert offsets(clean(log, now=now, retention=0).table) == [0]


# ------------------------------------------------------------------ transactions
def test_aborted_records_removed_marker_kept_while_records_remain_then_after_retention():
    log = Log()
    log.put("x", "keep")                 # 0
    log.put("x", "bad", pid=7)           # 1 aborted
    log.put("y", "bad", pid=7)           # 2 aborted
    m = log.abort(7)                     # 3
    assert log.aborted == [AbortedTxn(7, 1, 3)]
    r1 = clean(log, now=1_000, retention=100)
    # records of the aborted transaction go; they were in the log this run, so the marker stays
    assert offsets(r1.table) == [0, m] and r1.stats.aborted == 2
    assert r1.checkpoint.marker_horizons == () and r1.aborted_transactions == log.aborted
    # next run: no record of the transaction remains -> the marker's delete horizon is set
    r2 = clean(log, table=r1.table, now=2_000, retention=100, checkpoint=r1.checkpoint)
    assert offsets(r2.table) == [0, m] and r2.checkpoint.marker_horizons == ((m, 2_100),)
    r3 = clean(log, table=r2.table, now=2_099, retention=100, checkpoint=r2.checkpoint)
    assert offsets(r3.table) == [0, m]
    r4 = clean(log, table=r3.table, now=2_100, retention=100, checkpoint=r3.checkpoint)
    assert offsets(r4.table) == [0] and r4.stats.markers == 1
    assert r4.aborted_transactions == [] and r4.removed_aborted_transactions == [AbortedTxn(7, 1, 3)]
    assert r4.checkpoint.marker_horizons == ()


def test_aborted_record_never_supersedes_a_committed_one():
    log = Log()
    log.put("a", "committed")            # 0
    log.put("a", "aborted", pid=3)       # 1
    log.put("a", None, pid=3)            # 2 an aborted tombstone deletes nothing
    log.abort(3)                         # 3
    r = clean(log, now=0)
    assert offsets(r.table) == [0, 3]


def test_commit_marker_kept_while_its_records_remain():
    log = Log()
    log.put("a", "1", pid=5)             # 0
    log.put("b", "1", pid=5)             # 1 survives: b is never written again
    c = log.commit(5)                    # 2
    log.put("a", "2")                    # 3
    r = clean(log, now=0, retention=0)
    assert offsets(r.table) == [1, c, 3]
    for now in (DAY, 10 * DAY, 100 * DAY):
        r = clean(log, table=r.table, now=now, retention=0, checkpoint=r.checkpoint)
        assert offsets(r.table) == [1, c, 3] and r.checkpoint.marker_horizons == ()


def test_commit_marker_removed_after_its_records_are_compacted_away_and_retention_passes():
    log = Log()
    log.put("a", "1", pid=5)             # 0
    c = log.commit(5)                    # 1
    log.put("a", "2")                    # 2
    r1 = clean(log, now=1_000, retention=10)
    assert offsets(r1.table) == [c, 2]   # a@0 removed this run, so the marker stays without a horizon
    r2 = clean(log, table=r1.table, now=1_001, retention=10, checkpoint=r1.checkpoint)
    assert offsets(r2.table) == [c, 2] and r2.checkpoint.marker_horizons == ((c, 1_011),)
    r3 = clean(log, table=r2.table, now=1_011, retention=10, checkpoint=r2.checkpoint)
    assert offsets(r3.table) == [2] and r3.stats.markers == 1


def test_abort_marker_of_a_transaction_without_records_here():
    log = Log()
    log.put("a", "1")
    m = log.abort(4)                     # the transaction wrote nothing to this partition
    r1 = clean(log, now=0, retention=5)
    assert offsets(r1.table) == [0, m] and r1.checkpoint.marker_horizons == ((m, 5),)
    r2 = clean(log, table=r1.table, now=5, retention=5, checkpoint=r1.checkpoint)
    assert offsets(r2.table) == [0] and r2.aborted_transactions == []


def test_interleaved_transactions_of_two_producers():
    log = Log()
    log.put("a", "p1", pid=1)            # 0 committed
    log.put("a", "p2", pid=2)            # 1 aborted
    log.put("b", "p1", pid=1)            # 2 committed
    log.put("c", "p2", pid=2)            # 3 aborted
    c1 = log.commit(1)                   # 4
    a2 = log.abort(2)                    # 5
    log.put("c", "plain")                # 6
    r = clean(log, now=0)
    assert offsets(r.table) == [0, 2, c1, a2, 6]
    later = clean(log, table=r.table, now=1, retention=0, checkpoint=r.checkpoint)
    later = clean(log, table=later.table, now=2, retention=0, checkpoint=later.checkpoint)
    assert offsets(later.table) == [0, 2, c1, 6]  # p1's records remain, so its COMMIT stays


def test_records_of_an_open_transaction_are_never_touched():
    log = Log()
    log.put("a", "1")                    # 0
    log.put("a", "2")                    # 1
    log.put("a", "open", pid=9)          # 2 open transaction: LSO = 2
    log.put("a", None)                   # 3
    assert log.lso == 2
    r = clean(log, now=10 * DAY, retention=0, last_stable_offset=log.lso)
    assert offsets(r.table) == [1, 2, 3]  # a@1 is not superseded by anything at/after the LSO
    with pytest.raises(ValueError, match="last stable offset"):
        clean(log, cp=3, last_stable_offset=log.lso)


def test_transaction_decided_after_the_cleaning_point_uses_the_index():
    log = Log()
    log.put("a", "1")                    # 0
    log.put("a", "aborted", pid=6)       # 1
    log.put("b", "x")                    # 2
    log.abort(6)                         # 3 (at/after the cleaning point)
    r = clean(log, cp=3, now=0)
    assert offsets(r.table) == [0, 2, 3]  # the index says offset 1 is aborted; the marker is not cleaned


def test_committed_transaction_decided_after_the_cleaning_point_counts_as_committed():
    log = Log()
    log.put("a", "1")                    # 0
    log.put("a", "2", pid=6)             # 1 committed by the marker at 3
    log.put("b", "x")                    # 2
    log.commit(6)                        # 3
    assert offsets(clean(log, cp=3, now=0).table) == [1, 2, 3]


# ------------------------------------------------------------------ null keys, input checks
def test_null_keys_kept_by_default_dropped_like_kafka_on_request():
    log = Log()
    log.put(None, "legacy"); log.put("a", "1"); log.put(None, "legacy2"); log.put("a", "2")
    assert offsets(clean(log).table) == [0, 2, 3]
    r = clean(log, discard_null_keys=True)
    assert offsets(r.table) == [3] and r.stats.null_keys == 2


def test_bad_input_is_refused_with_a_clear_error():
    log = Log(); log.put("a", "1"); log.put("a", "2")
    table = log.table()
    with pytest.raises(ValueError, match="ascending"):
        clean_records(table.take([1, 0]), [], 2, 0, DAY)
    with pytest.raises(ValueError, match="lacks the column"):
        clean_records(table.drop_columns(["is_control"]), [], 2, 0, DAY)
    with pytest.raises(ValueError, match="delete.retention.ms"):
        clean_records(table, [], 2, 0, -1)


def test_checkpoint_round_trip():
    cp = CleanerCheckpoint(40, ((10, 5), (40, 9)), ((12, 7),))
    assert CleanerCheckpoint.from_dict(cp.to_dict()) == cp
    assert CleanerCheckpoint.from_dict(None) == CleanerCheckpoint()
    assert cp.tombstone_horizon(3) == 5 and cp.tombstone_horizon(10) == 9 and cp.tombstone_horizon(40) is None
    with pytest.raises(ValueError, match="ascending"):
        CleanerCheckpoint.from_dict({"tombstone_horizons": [[5, 1], [5, 2]]})


# ------------------------------------------------------------------ when: cleanable_range
def seg(base: int, last: int, size: int = 100, min_ts: int = 1, max_ts: int = 1) -> SegmentInfo:
    return SegmentInfo("t", 0, f"s{base}", base, last, last - base + 1, size, min_ts, max_ts, 0, 1)


def part(segments, log_start=0, hw=None, lso=None) -> PartitionState:
    hw = segments[-1].last_offset + 1 if hw is None else hw
    return PartitionState("t", 0, log_start, hw, hw if lso is None else lso, list(segments))


COMPACT = {"cleanup.policy": "compact"}


def test_cleanable_range_whole_committed_log_when_never_cleaned():
    p = part([seg(0, 9), seg(10, 19)])
    r = cleanable_range(p, COMPACT, now_ms=DAY)
    assert (r.first_dirty_offset, r.first_uncleanable_offset, r.bound) == (0, 20, "last_stable_offset")
    assert (r.clean_bytes, r.cleanable_bytes, r.cleanable_ratio, r.should_clean) == (0, 200, 1.0, True)
    assert not r.force_update_checkpoint and not r.needs_compaction_now


def test_cleanable_range_stops_at_the_segment_holding_the_lso_or_first_unstable_offset():
    p = part([seg(0, 9), seg(10, 19), seg(20, 29)], lso=15)
    r = cleanable_range(p, COMPACT, now_ms=DAY)
    assert (r.first_uncleanable_offset, r.bound) == (10, "last_stable_offset")
    r = cleanable_range(p, COMPACT, now_ms=DAY, first_unstable_offset=3)
    assert (r.first_uncleanable_offset, r.bound, r.cleanable_bytes, r.should_clean) == (0, "first_unstable_offset", 0, False)
    r = cleanable_range(part([seg(0, 9), seg(10, 19)], hw=20, lso=10), COMPACT, now_ms=DAY)
    assert r.first_uncleanable_offset == 10  # an LSO on a segment boundary needs no rounding


def test_cleanable_range_active_segment_and_min_compaction_lag():
    p = part([seg(0, 9, max_ts=100), seg(10, 19, max_ts=500), seg(20, 29, max_ts=900)])
    r = cleanable_range(p, COMPACT, now_ms=1_000, active_segment_base_offset=20)
    assert (r.first_uncleanable_offset, r.bound) == (20, "active_segment")
    lagged = {**COMPACT, "min.compaction.lag.ms": "600"}  # records newer than now - 600 = 400 stay
    r = cleanable_range(p, lagged, now_ms=1_000)
    assert (r.first_uncleanable_offset, r.bound, r.cleanable_bytes) == (10, "min_compaction_lag", 100)


def test_cleanable_range_dirty_ratio_against_min_cleanable_dirty_ratio():
    p = part([seg(0, 9, size=300), seg(10, 19, size=100)])
    r = cleanable_range(p, COMPACT, now_ms=DAY, last_clean_offset=10)
    assert (r.first_dirty_offset, r.clean_bytes, r.cleanable_bytes, r.total_bytes) == (10, 300, 100, 400)
    assert r.cleanable_ratio == 0.25 and not r.should_clean  # default ratio 0.5
    r = cleanable_range(p, {**COMPACT, "min.cleanable.dirty.ratio": "0.2"}, now_ms=DAY, last_clean_offset=10)
    assert r.should_clean
    r = cleanable_range(p, {**COMPACT, "min.cleanable.dirty.ratio": "0.25"}, now_ms=DAY, last_clean_offset=10)
    assert not r.should_clean  # the ratio must exceed the minimum


def test_cleanable_range_max_compaction_lag_forces_a_cleaning():
    p = part([seg(0, 9, size=900, min_ts=10), seg(10, 19, size=100, min_ts=1_000, max_ts=1_000)])
    config = {**COMPACT, "max.compaction.lag.ms": "5000"}
    r = cleanable_range(p, config, now_ms=5_500, last_clean_offset=10)
    assert r.max_compaction_delay_ms == 0 and not r.should_clean
    r = cleanable_range(p, config, now_ms=6_500, last_clean_offset=10)
    assert r.max_compaction_delay_ms == 500 and r.needs_compaction_now and r.should_clean


def test_cleanable_range_resets_an_invalid_checkpoint_to_the_log_start():
    p = part([seg(0, 9), seg(10, 19), seg(20, 29)], log_start=10)
    r = cleanable_range(p, COMPACT, now_ms=DAY, last_clean_offset=5)
    assert (r.first_dirty_offset, r.force_update_checkpoint) == (10, True)
    assert r.cleanable_bytes == 200  # the segment below the log start counts for nothing
    r = cleanable_range(p, COMPACT, now_ms=DAY, last_clean_offset=99)
    assert (r.first_dirty_offset, r.force_update_checkpoint) == (10, True)
    r = cleanable_range(p, COMPACT, now_ms=DAY, last_clean_offset=30)
    assert (r.first_dirty_offset, r.first_uncleanable_offset, r.bound, r.should_clean) == (30, 30, "last_stable_offset", False)


def test_only_compacted_topics_are_cleaned_and_the_filthiest_goes_first():
    p = part([seg(0, 9)])
    assert not cleanable_range(p, {}, now_ms=DAY).should_clean
    assert is_compacted({"cleanup.policy": "delete,compact"}) and not is_compacted({})
    a = cleanable_range(part([seg(0, 9, size=100), seg(10, 19, size=300)]), COMPACT, DAY, last_clean_offset=10)
    b = cleanable_range(part([seg(0, 9, size=100), seg(10, 19, size=100)]), COMPACT, DAY, last_clean_offset=10)
    assert a.cleanable_ratio == 0.75 and b.cleanable_ratio == 0.5
    assert grab_filthiest([b, a]) is a and grab_filthiest([b]) is None
    assert isinstance(a, CleanableRange)


# ------------------------------------------------------------------ property: a dict model
def committed_map(table: pa.Table, aborted: list[AbortedTxn], end: int | None = None) -> dict:
    """Apply the read_committed records below ``end`` in offset order: key -> value, a
    tombstone deletes. What a consumer restoring state from the topic ends up with."""
    state: dict = {}
    for r in table.to_pylist():
        if end is not None and r["offset"] >= end:
            break
        if r["is_control"] or r["key"] is None:
            continue
        if r["is_transactional"] and any(a.producer_id == r["producer_id"] and a.first_offset <= r["offset"]
                                         <= a.last_offset for a in aborted):
            continue
        if r["value"] is None:
            state.pop(r["key"], None)
        else:
            state[r["key"]] = r["value"]
    return state


op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from([None, "a", "b", "c", "d"]), st.sampled_from([None, "1", "2", "3"]),
              st.sampled_from([None, None, 1, 2])),
    st.tuples(st.just("commit"), st.sampled_from([1, 2])),
    st.tuples(st.just("abort"), st.sampled_from([1, 2])),
    st.tuples(st.just("gap"), st.integers(1, 3)),
)


def build(ops, endings=()) -> Log:
    """The log of ``ops``; then ``endings[i]`` ("commit"/"abort"/None) ends producer i+1's open transaction."""
    log = Log()
    for o in ops:
        if o[0] == "put":
            log.put(o[1], o[2], pid=o[3])
        elif o[0] == "gap":
            log.gap(o[1])
        elif o[0] == "commit":
            log.commit(o[1])
        else:
            log.abort(o[1])
    for pid, how in enumerate(endings, start=1):
        if how and pid in log.open:
            log.commit(pid) if how == "commit" else log.abort(pid)
    return log


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=8, max_size=80), endings=st.lists(st.sampled_from(["commit", "abort", None]), min_size=2,
                                                   max_size=2),
       points=st.lists(st.floats(0, 1), min_size=1, max_size=4), retention=st.integers(0, 3), discard=st.booleans(),
       horizons=st.sampled_from([HORIZON_CHECKPOINT, HORIZON_RECORD_TIMESTAMP]),
       cuts=st.lists(st.floats(0, 1), max_size=3))
def test_cleaning_preserves_the_read_committed_key_value_map(ops, endings, points, retention, discard, horizons, cuts):
    log = build(ops, endings)
    original = log.table()
    lso = log.lso
    table, aborted, checkpoint = original, list(log.aborted), None
    # some runs, then four at the LSO: a tombstone needs two runs to go, and its transaction's
    # marker two more (found empty, then past its horizon)
    cps = sorted(int(p * lso) for p in points) + [lso] * 4
    markers = [x for x in original.to_pylist() if x["is_control"]]
    expected = {end: committed_map(original, log.aborted, end) for end in set(cps) | {None}}
    for now, cp in enumerate(cps):
        now *= 10  # retention is 0..3 ms: a horizon set in one run has passed by the next
        before = table
        r = clean_records(table, aborted, cp, now, retention, checkpoint=checkpoint, last_stable_offset=lso,
                          discard_null_keys=discard, horizons=horizons)
        kept = offsets(r.table)
        # the same cleaning fed chunk by chunk (as the compaction runner feeds segments) gives the same rows
        bounds = sorted({0, table.num_rows, *(int(c * table.num_rows) for c in cuts)})
        chunks = [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]
        builder = OffsetMapBuilder(aborted, cp)
        for chunk in chunks:
            builder.add(chunk)
        plan = builder.finish()
        pieces = [plan.apply(c, now, retention, checkpoint=checkpoint, horizons=horizons, discard_null_keys=discard)
                  for c in chunks]
        assert offsets(pa.concat_tables([t for t, *_ in pieces] or [table.slice(0, 0)])) == kept
        assert sorted(h for *_, hs, _ in pieces for h in hs) == [h for h in r.checkpoint.marker_horizons if h[0] < cp]
        # offsets are a subset; nothing at/after the cleaning point changes
        assert set(kept) <= set(offsets(before))
        n_after = sum(1 for o in offsets(before) if o >= cp)
        assert r.table.slice(r.table.num_rows - n_after).equals(before.slice(before.num_rows - n_after))
        assert r.stats.removed == before.num_rows - r.table.num_rows
        # read_committed reading gives the same key -> value map, at the cleaning point and at the end
        for end in (cp, None):
            assert committed_map(r.table, r.aborted_transactions, end) == expected[end]
        # below the cleaning point: no aborted record, one record per key, every surviving
        # transactional record still followed by its marker
        rows = [x for x in r.table.to_pylist() if x["offset"] < cp]
        data = [x for x in rows if not x["is_control"]]
        assert not any(x["is_transactional"] and any(a.producer_id == x["producer_id"] and a.first_offset <= x["offset"]
                                                     <= a.last_offset for a in r.aborted_transactions) for x in data)
        keys = [x["key"] for x in data if x["key"] is not None]
        assert len(keys) == len(set(keys))
        if discard:
            assert all(x["key"] is not None for x in data)
        for x in data:
            if x["is_transactional"]:
                m = next((m for m in markers if m["producer_id"] == x["producer_id"] and m["offset"] > x["offset"]), None)
                assert m is not None and m["offset"] in kept
        table, aborted, checkpoint = r.table, r.aborted_transactions, r.checkpoint
    # after the final runs (time well past every horizon) nothing removable remains below the LSO
    final = table.to_pylist()
    rows = [x for x in final if x["offset"] < lso]
    assert not any(x["value"] is None and x["key"] is not None and not x["is_control"] for x in rows)  # no tombstone
    for m in (x for x in rows if x["is_control"]):
        prev = [x for x in final if x["producer_id"] == m["producer_id"] and x["offset"] < m["offset"]]
        assert prev and not prev[-1]["is_control"]  # a marker stays only while its records do


# ------------------------------------------------------------------ the compaction runner's seam
class ChunkReader:
    """A reader that serves each segment as its slice of one table (no object store)."""

    def __init__(self, table: pa.Table):
        self.table = table

    def segment_table(self, segment: SegmentInfo) -> pa.Table:
        offs = pa.compute.field("offset")
        return self.table.filter((offs >= segment.base_offset) & (offs <= segment.last_offset))


def segmented(log: Log, bounds: list[int]) -> tuple[PartitionState, ChunkReader]:
    """The log cut into segments at ``bounds`` (base offsets), all below the LSO, as the runner offers them."""
    table = log.table()
    offs = offsets(table)
    ts = table.column("timestamp").to_pylist()
    edges = bounds + [log.next]
    segs = []
    for lo, hi in zip(edges, edges[1:]):
        inside = [i for i, o in enumerate(offs) if lo <= o < hi]
        segs.append(SegmentInfo("t", 0, f"s{lo}", lo, hi - 1, len(inside), 10 * len(inside),
                                min(ts[i] for i in inside), max(ts[i] for i in inside), 0, 1))
    p = PartitionState("t", 0, 0, log.next, log.lso, segs, list(log.aborted))
    return p, ChunkReader(table)


def run_filter(p: PartitionState, reader: ChunkReader, filt) -> list[int]:
    return [o for s in p.segments for o in offsets(filt(reader.segment_table(s)))]


def test_row_filter_cleans_segment_by_segment_with_record_time_horizons():
    now = 10 * DAY
    log = Log()
    log.put("a", "1", ts=now - 5); log.put("b", "1", ts=now - 5)        # 0, 1
    log.put("a", "2", ts=now - 4); log.put("b", None, ts=now - 2 * DAY)  # 2, 3: b's tombstone is old
    log.put("c", None, ts=now - 1)                                     # 4: a recent tombstone
    log.put("x", "bad", pid=2, ts=now - 3)                             # 5 aborted
    log.abort(2)                                                       # 6 (ts 0: its records are still here)
    log.put("a", "3", ts=now - 1)                                      # 7
    p, reader = segmented(log, [0, 3, 6])
    assert row_filter(p, COMPACT, reader, now) is None  # 3 of 8 removable: not above the 0.5 ratio
    filt = row_filter(p, {**COMPACT, "min.cleanable.dirty.ratio": "0.3"}, reader, now)
    assert filt is not None
    assert run_filter(p, reader, filt) == [4, 6, 7]


def test_row_filter_returns_none_when_nothing_is_due():
    log = Log()
    for k in "abcdefghij":
        log.put(k, "1", ts=1)
    p, reader = segmented(log, [0, 5])
    assert row_filter(p, COMPACT, reader, DAY) is None  # nothing removable: no rewrite for nothing
    assert row_filter(p, {}, reader, DAY) is None        # not a compacted topic
    log.put("a", "2", ts=2)                              # 1 of 11 removable: below the 0.5 ratio
    p, reader = segmented(log, [0, 5])
    assert row_filter(p, COMPACT, reader, DAY) is None
    assert row_filter(p, {**COMPACT, "min.cleanable.dirty.ratio": "0.05"}, reader, DAY) is not None
    # max.compaction.lag.ms: the log's oldest record is older than the lag -> cleaned anyway
    filt = row_filter(p, {**COMPACT, "max.compaction.lag.ms": "1000"}, reader, DAY)
    assert filt is not None and run_filter(p, reader, filt) == list(range(1, 11))


def test_row_filter_respects_min_compaction_lag():
    now = DAY
    log = Log()
    for k, ts in [("a", 10), ("a", 20), ("b", now - 10), ("a", now - 5)]:
        log.put(k, "v", ts=ts)
    p, reader = segmented(log, [0, 2])
    filt = row_filter(p, {**COMPACT, "min.compaction.lag.ms": "1000", "min.cleanable.dirty.ratio": "0.1"}, reader, now)
    # the second segment is younger than the lag: the cleaning stops before it, a@3 supersedes nothing
    assert filt is not None and run_filter(p, reader, filt) == [1, 2, 3]


@pytest.mark.parametrize("backend", ["memory"])
def test_compaction_round_key_compacts_a_topic_end_to_end(storage, close_engines):
    """Through the runner (engine/compaction.py): the read_committed key -> value map is unchanged,
    only records below the LSO outside the last segment go, and the partition's offsets stay."""
    from compaction_support import committed_tables, fresh_catalog, produce_varied_log, writer_broker
    from txlake.engine.compaction import compact

    produce_varied_log(storage, "c", partitions=1, flushes=4, per_flush=14, topic_config={"cleanup.policy": "compact"})
    catalog = fresh_catalog(storage)
    p = catalog.state.topics["c"].partitions[0]
    before, aborted, last_base = committed_tables(storage, "c")[0], list(p.aborted_transactions), p.segments[-1].base_offset
    summary = compact(writer_broker(storage), ["c"])
    assert summary.key_compacted_partitions == 1
    after = committed_tables(storage, "c")[0]
    q = fresh_catalog(storage).state.topics["c"].partitions[0]
    assert (q.log_start_offset, q.high_watermark, q.last_stable_offset) == (p.log_start_offset, p.high_watermark,
                                                                            p.last_stable_offset)
    assert committed_map(after, q.aborted_transactions) == committed_map(before, aborted)
    assert set(offsets(after)) < set(offsets(before))
    assert after.filter(pa.compute.field("offset") >= last_base).equals(
        before.filter(pa.compute.field("offset") >= last_base))
    cleaned = [r for r in after.to_pylist() if r["offset"] < last_base and not r["is_control"] and r["key"] is not None]
    assert len({r["key"] for r in cleaned}) == len(cleaned)  # one record per key below the last segment
    # a second round finds nothing to remove: no rewrite for nothing
    assert compact(writer_broker(storage), ["c"]).key_compacted_partitions == 0
