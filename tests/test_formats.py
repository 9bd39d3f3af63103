"""Format codecs: round trips, version tags, and refusal of corrupt or newer objects."""

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txlake.formats import catalog_actions, producer_state, records
from txlake.formats.errors import CorruptObjectError, UnsupportedFormatVersionError
from txlake.formats.versioning import VERSION_KEY


def _record_table(n=3, topic="t", partition=0, base=0):
    return pa.Table.from_pydict({
        "topic": [topic] * n, "partition": [partition] * n, "offset": list(range(base, base + n)),
        "timestamp": [1000 + i for i in range(n)], "timestamp_type": [0] * n,
        "key": [b"k%d" % i for i in range(n)], "value": [None if i == 1 else b"v%d" % i for i in range(n)],
        "headers": [[{"key": "h", "value": b"x"}] if i == 0 else None for i in range(n)],
        "producer_id": [7] * n, "producer_epoch": [0] * n, "base_sequence": [0] * n, "base_offset": [base] * n,
        "last_offset_delta": [n - 1] * n, "is_transactional": [False] * n, "is_control": [False] * n,
        "control_type": [None] * n, "coordinator_epoch": [None] * n,
    }, schema=records.RECORD_SCHEMA)


def test_segment_round_trip_with_row_group_ranges():
    a, b = _record_table(3, "a", 0), _record_table(5, "b", 2, base=10)
    data, ranges = records.encode_segments([a, b], row_group_rows=2)
    assert ranges == [(0, 2), (2, 3)]
    assert records.read_segment(data, "mem://x", [0, 1]).equals(a)
    back_b = records.read_segment(data, "mem://x", [2, 3, 4])
    assert back_b.column("offset").to_pylist() == [10, 11, 12, 13, 14]
    assert back_b.column("headers").to_pylist()[0] == [{"key": "h", "value": b"x"}]
    assert back_b.column("value").to_pylist()[1] is None


def test_segment_encoded_into_a_presized_buffer_equals_the_growing_stream_and_falls_back(monkeypatch):
    """encode_segments writes into one buffer sized from the tables; its bytes are exactly what
    a growing BufferOutputStream gets, and an object that outgrows the estimate is re-encoded
    into a growing stream, not refused."""
    a, b = _record_table(300, "a", 0), _record_table(500, "b", 2, base=10)
    growing = pa.BufferOutputStream()
    with records.segment_writer(growing) as writer:
        records.write_records(writer, a, 64)
        records.write_records(writer, b, 64)
    expected = growing.getvalue().to_pybytes()
    data, ranges = records.encode_segments([a, b], row_group_rows=64)
    assert data == expected and ranges == [(0, 5), (5, 8)]
    # a target buffer given (the flushers reuse theirs): the object is written into it, same bytes
    target = pa.allocate_buffer(records.encode_buffer_size([a, b]))
    data, ranges = records.encode_segments([a, b], row_group_rows=64, as_buffer=True, target=target)
    assert data.address == target.address and data.to_pybytes() == expected and ranges == [(0, 5), (5, 8)]
    # one smaller than the estimate is not used
    small = pa.allocate_buffer(records.encode_buffer_size([a, b]) - 1)
    data, _ = records.encode_segments([a, b], row_group_rows=64, as_buffer=True, target=small)
    assert data.address != small.address and data.to_pybytes() == expected
    monkeypatch.setattr(records, "encode_buffer_size", lambda tables: 100)
    data, ranges = records.encode_segments([a, b], row_group_rows=64, as_buffer=True)
    assert data.to_pybytes() == expected and ranges == [(0, 5), (5, 8)]


def test_segment_statistics_cover_the_columns_readers_prune_by():
    """Row groups carry min/max statistics for topic, partition, offset, timestamp, key and
    is_control (the DuckDB views' and Spark source's pruning), not for the other batch fields."""
    data, _ = records.encode_segments([_record_table(3, "a", 4, base=20)])
    rg = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0)
    columns = {rg.column(i).path_in_schema: rg.column(i) for i in range(rg.num_columns)}
    with_stats = {name for name, col in columns.items() if col.is_stats_set and col.statistics.has_min_max}
    assert with_stats == {"topic", "partition", "offset", "timestamp", "key", "is_control"}
    assert (columns["offset"].statistics.min, columns["offset"].statistics.max) == (20, 22)
    assert (columns["partition"].statistics.min, columns["topic"].statistics.max) == (4, "a")


def test_segment_row_group_outside_object_is_corrupt():
    data, _ = records.encode_segments([_record_table(3)])
    with pytest.raises(CorruptObjectError, match="mem://seg.*1 row groups"):
        records.read_segment(data, "mem://seg", [3])


@pytest.mark.parametrize("cut", [0, 10, -10])
def test_truncated_segment_is_refused_naming_it(cut):
    data, _ = records.encode_segments([_record_table(3)])
    broken = data[:cut] if cut > 0 else (data[:cut] if cut < 0 else b"")
    with pytest.raises(CorruptObjectError, match="s3://b/data/x.parquet"):
        records.read_segment(broken, "s3://b/data/x.parquet")


def _retag(data: bytes, **meta) -> bytes:
    table = pq.read_table(io.BytesIO(data))
    md = dict(table.schema.metadata)
    md.update({k.encode(): v.encode() for k, v in meta.items()})
    sink = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(md), sink)
    return sink.getvalue()


def test_newer_segment_version_is_refused():
    data, _ = records.encode_segments([_record_table(3)])
    newer = _retag(data, **{VERSION_KEY.decode(): "2"})
    with pytest.raises(UnsupportedFormatVersionError, match=r"loc: record-segment format version 2 is not supported.*1\.\.1"):
        records.read_segment(newer, "loc")
    with pytest.raises(UnsupportedFormatVersionError, match="unreadable"):
        records.read_segment(_retag(data, **{VERSION_KEY.decode(): "x"}), "loc")


def test_plain_parquet_is_not_a_segment():
    sink = io.BytesIO()
    pq.write_table(pa.table({"a": [1]}), sink)
    with pytest.raises(CorruptObjectError, match="not a txlake object"):
        records.read_segment(sink.getvalue(), "loc")


def test_segment_with_missing_column_is_refused():
    data, _ = records.encode_segments([_record_table(3)])
    table = pq.read_table(io.BytesIO(data)).drop_columns(["value"])
    sink = io.BytesIO()
    pq.write_table(table, sink)
    with pytest.raises(CorruptObjectError, match="column 'value' is missing"):
        records.read_segment(sink.getvalue(), "loc")


def test_catalog_actions_round_trip_and_kind_check():
    rows = [{"action": "create_topic", "topic": "t", "topic_id": "abc", "num_partitions": 2, "config": {"retention.ms": "1"}},
            {"action": "add_segment", "topic": "t", "partition": 1, "path": "data/x", "base_offset": 0, "last_offset": 4}]
    data = catalog_actions.encode_actions(rows, catalog_actions.COMMIT_KIND, 7)
    assert catalog_actions.decode_actions(data, catalog_actions.COMMIT_KIND, "c") == rows
    with pytest.raises(CorruptObjectError, match="is a 'catalog-commit' object, expected a 'catalog-checkpoint'"):
        catalog_actions.decode_actions(data, catalog_actions.CHECKPOINT_KIND, "c")
    with pytest.raises(ValueError, match="unknown fields"):
        catalog_actions.encode_actions([{"action": "x", "bogus": 1}], catalog_actions.COMMIT_KIND, 1)


def test_producer_snapshot_round_trip():
    rows = [{"topic": "t", "partition": 0, "producer_id": 5, "producer_epoch": 2, "coordinator_epoch": -1,
             "last_timestamp": 99, "txn_first_offset": None,
             "batches": [{"first_seq": 0, "last_seq": 4, "first_offset": 10, "last_offset": 14, "timestamp": 99}]}]
    ends = {"t": {"topic_id": "abc", "end_offsets": [15]}}
    data = producer_state.encode_snapshot(rows, ends)
    assert producer_state.decode_snapshot(data, "s") == (rows, ends)
    with pytest.raises(UnsupportedFormatVersionError):
        producer_state.decode_snapshot(_retag(data, **{VERSION_KEY.decode(): "9"}), "s")
