"""Reading a flush object once for all the partitions' segments it holds
(``formats.records.read_row_group_sets``, ``LogReader.prefetch``), as a compaction batch does.

Proved here: every segment prefetched equals what a per-segment read returns (all columns);
each object is opened exactly once per prefetch however many partitions it holds; cached
segments are not read again; a zero-byte cache still hands the tables back; a record count
that disagrees with the catalog, or a row group the object lacks, is a CorruptObjectError
naming the object; overlapping row-group sets are refused.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from compaction_support import committed_tables, fresh_catalog, produce_varied_log, writer_broker
from helpers import close_engines, payload  # noqa: F401
from txlake.engine.log_reader import LogReader, SegmentCache
from txlake.formats.errors import CorruptObjectError
from txlake.formats.records import encode_segments, read_row_group_sets, read_segment

backends = pytest.mark.parametrize("backend", ["memory"])


def _segments(catalog, topic):
    return [s for p in catalog.state.topics[topic].partitions for s in p.segments]


def _counting_opens(store, monkeypatch) -> Counter:
    opened: Counter = Counter()
    original = store.open_input

    def open_input(path):
        opened[path] += 1
        return original(path)

    monkeypatch.setattr(store, "open_input", open_input)
    return opened


def _three_flushes_of_three_partitions(storage):
    """Three flush objects, each holding a segment of each of 3 partitions (one produce call
    of 3 batches is one flush)."""
    from txlake.engine.broker import ProduceBatch

    broker = writer_broker(storage)
    assert broker.create_topics([("t", 3, {})])[0][0] == 0
    for f in range(3):
        results = broker.produce([ProduceBatch("t", p, payload(4, 10 * f + p), -1, -1, -1) for p in range(3)])
        assert [r.error for r in results] == [0, 0, 0]
    return fresh_catalog(storage)


@backends
def test_prefetch_reads_each_object_once_and_equals_per_segment_reads(storage, close_engines, monkeypatch):
    catalog = _three_flushes_of_three_partitions(storage)
    segments = _segments(catalog, "t")
    paths = Counter(s.path for s in segments)
    assert len(segments) == 9 and list(paths.values()) == [3, 3, 3]
    expected = {(s.path, s.row_group_start): LogReader(catalog, SegmentCache(0)).segment_table(s) for s in segments}

    reader = LogReader(catalog, SegmentCache(None))
    opened = _counting_opens(reader.store, monkeypatch)
    fetched = reader.prefetch(segments, threads=2)
    assert opened == Counter(dict.fromkeys(paths, 1))
    assert fetched.keys() == expected.keys()
    for key, table in expected.items():
        assert fetched[key].equals(table), key
        assert reader.cache.get(key).equals(table)
    # cached: nothing is read again, segment_table answers from the cache
    assert reader.prefetch(segments, threads=2) == {}
    assert all(reader.segment_table(s).equals(expected[(s.path, s.row_group_start)]) for s in segments)
    assert opened == Counter(dict.fromkeys(paths, 1))


@backends
def test_a_zero_byte_cache_still_returns_the_tables(storage, close_engines):
    produce_varied_log(storage, "t", partitions=2, flushes=2, transactions=False)
    catalog = fresh_catalog(storage)
    segments = _segments(catalog, "t")
    reader = LogReader(catalog, SegmentCache(0))
    fetched = reader.prefetch(segments)
    assert sorted(t.num_rows for t in fetched.values()) == sorted(s.record_count for s in segments)
    assert all(reader.cache.get(k) is None for k in fetched)


@backends
def test_a_record_count_the_catalog_disagrees_with_names_the_object(storage, close_engines):
    produce_varied_log(storage, "t", partitions=2, flushes=1, transactions=False)
    catalog = fresh_catalog(storage)
    seg = _segments(catalog, "t")[0]
    wrong = type(seg)(**{**seg.__dict__, "record_count": seg.record_count + 1})
    with pytest.raises(CorruptObjectError) as err:
        LogReader(catalog, SegmentCache(None)).prefetch([wrong])
    assert seg.path in str(err.value) and f"the catalog expects {seg.record_count + 1}" in str(err.value)


@backends
def test_row_group_sets_are_slices_of_one_decode_and_checked(storage, close_engines):
    produce_varied_log(storage, "t", partitions=1, flushes=1, transactions=False)
    records = committed_tables(storage, "t")[0]
    assert records.num_rows == 12
    full = [records.slice(0, 5), records.slice(5, 3), records.slice(8, 4)]
    data, ranges = encode_segments(full, "snappy", 2)  # row groups of 2 rows: 3 + 2 + 2 groups
    (s0, n0), (s1, n1), (s2, n2) = ranges
    assert (n0, n1, n2) == (3, 2, 2)
    sets = [list(range(s2, s2 + n2)), list(range(s0, s0 + n0))]
    out = read_row_group_sets(data, "mem://x", sets)
    assert out[0].equals(read_segment(data, "mem://x", sets[0]))
    assert out[1].equals(read_segment(data, "mem://x", sets[1]))
    assert out[0].equals(records.slice(8, 4)) and out[1].equals(records.slice(0, 5))
    # non-adjacent row groups of one set are gathered in row-group order
    gathered = read_row_group_sets(data, "mem://x", [[s0, s2]])[0]
    assert gathered.equals(pa.concat_tables([records.slice(0, 2), records.slice(8, 2)]))
    with pytest.raises(ValueError, match="overlap"):
        read_row_group_sets(data, "mem://x", [[s0], [s0, s0 + 1]])
    with pytest.raises(CorruptObjectError, match="mem://x.*has 7 row groups"):
        read_row_group_sets(data, "mem://x", [[s2 + n2]])


def test_in_batches_cuts_by_bytes_and_keeps_order():
    from txlake.engine.segment_merge import in_batches

    assert in_batches([5, 5, 5, 20, 1, 1], lambda n: n, 10) == [[5, 5], [5], [20], [1, 1]]
    assert in_batches([], lambda n: n, 10) == []
    assert in_batches([30], lambda n: n, 10) == [[30]]


@backends
@pytest.mark.parametrize("batch_bytes", [1, 10**12])
def test_a_round_in_many_batches_gives_the_one_batch_result(storage, close_engines, batch_bytes):
    """Batches of one run each (1 byte) or one batch for all: the same segments, record for record."""
    import dataclasses

    from txlake.engine.compaction import compact

    produce_varied_log(storage, "m", partitions=3, flushes=4)
    produce_varied_log(storage, "c", partitions=3, flushes=4, topic_config={"cleanup.policy": "compact",
                                                                           "min.cleanable.dirty.ratio": "0.01"})
    before = {t: committed_tables(storage, t) for t in ("m", "c")}
    broker = writer_broker(storage)
    broker.config = dataclasses.replace(broker.config, compaction_batch_bytes=batch_bytes)
    summary = compact(broker, ["m", "c"])
    assert summary.merges >= 3 and summary.key_compacted_partitions == 3 and summary.skipped == 0
    catalog = fresh_catalog(storage)
    assert all(len(p.segments) == 1 for p in catalog.state.topics["m"].partitions)
    for p, table in committed_tables(storage, "m", catalog).items():
        assert table.equals(before["m"][p])
    after = committed_tables(storage, "c", catalog)
    removed = sum(before["c"][p].num_rows - after[p].num_rows for p in after)
    assert removed == summary.records_removed > 0
