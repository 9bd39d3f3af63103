"""Record segments: the Parquet layout of partition data (one row per record).

A *flush object* holds the new records of every partition that changed in one group
commit; each partition's records form their own row groups, so a reader of one
partition reads only its row groups (the catalog records which ones). Compaction later
rewrites them into per-partition segments with the same schema.

Columns (format version 1) -- record fields, then the batch fields Kafka keeps in a
RecordBatch header (KIP-98 message format v2), repeated on each row of the batch:

=================  ==========  ==========================================================
column             type        meaning
=================  ==========  ==========================================================
topic              string      topic name
partition          int32       partition id
offset             int64       the record's offset in its partition
timestamp          int64       ms since the epoch
timestamp_type     int8        0 CreateTime, 1 LogAppendTime
key                binary      null for a null key
value              binary      null for a tombstone
headers            list<...>   list of {key: string, value: binary}; null when none
producer_id        int64       -1 when not idempotent
producer_epoch     int16       -1 when not idempotent
base_sequence      int32       the batch's first sequence number, -1 when none
base_offset        int64       offset of the batch's first record
last_offset_delta  int32       last offset of the batch minus base_offset
is_transactional   bool        the batch belongs to a transaction
is_control         bool        a control record (transaction marker)
control_type       int16       0 ABORT, 1 COMMIT (Kafka's ControlRecordType); null otherwise
coordinator_epoch  int32       the transaction coordinator's epoch on a marker; else null
=================  ==========  ==========================================================
"""

from __future__ import annotations

from typing import Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from .versioning import check_schema, check_tags, open_parquet, read_all, stamp

KIND = "record-segment"
VERSION = 1

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]))

#: Columns a producer supplies for each record (the payload of a batch before the log assigns offsets).
PAYLOAD_SCHEMA = pa.schema(
    [
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE),
    ]
)

RECORD_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("timestamp_type", pa.int8(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE),
        pa.field("producer_id", pa.int64(), nullable=False),
        pa.field("producer_epoch", pa.int16(), nullable=False),
        pa.field("base_sequence", pa.int32(), nullable=False),
        pa.field("base_offset", pa.int64(), nullable=False),
        pa.field("last_offset_delta", pa.int32(), nullable=False),
        pa.field("is_transactional", pa.bool_(), nullable=False),
        pa.field("is_control", pa.bool_(), nullable=False),
        pa.field("control_type", pa.int16()),
        pa.field("coordinator_epoch", pa.int32()),
    ]
)
STAMPED_SCHEMA = stamp(RECORD_SCHEMA, KIND, VERSION)

TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1
CONTROL_ABORT = 0
CONTROL_COMMIT = 1

#: Columns whose Parquet min/max statistics a segment object carries: the DuckDB views push
#: topic, partition, offset and ``NOT is_control`` down to them, the Spark source prunes by
#: offset and timestamp, and a user's key filter can use them.
STATISTICS_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "is_control")

#: Default rows per row group: large enough for efficient Spark/DuckDB scans.
DEFAULT_ROW_GROUP_ROWS = 1024 * 1024


def segment_writer(sink, compression: str = "snappy") -> pq.ParquetWriter:
    """A Parquet writer of one segment object (:data:`STAMPED_SCHEMA`) on ``sink`` (a path or
    Arrow output stream), with the encodings every segment object uses: what
    :func:`encode_segments` writes, and what a compaction merge streams row group by row
    group (:func:`write_records`). The caller closes it (it is a context manager).
    """
    # Values are mostly unique payloads and offsets always are: dictionary-encoding them costs
    # time and saves nothing (offsets: 5x the encoding time of the delta encoding below, which
    # stores consecutive offsets in a few bits each). Nor do min/max statistics of payloads
    # help any reader; min/max statistics are kept for the columns readers prune row groups by
    # (:data:`STATISTICS_COLUMNS`), not for the other batch fields (about a quarter of the batch fields'
    # encoding time, and no reader filters on them).
    dictionary_columns = [name for name in RECORD_SCHEMA.names if name not in ("value", "offset")]
    stats_columns = list(STATISTICS_COLUMNS)
    # values are handed to the column encoders 64 Ki at a time (Arrow's default: 1 Ki): ~10% faster
    return pq.ParquetWriter(sink, STAMPED_SCHEMA, compression=compression, use_dictionary=dictionary_columns,
                            column_encoding={"offset": "DELTA_BINARY_PACKED"}, write_batch_size=65_536,
                            write_statistics=stats_columns)


def write_records(writer: pq.ParquetWriter, table: pa.Table, row_group_rows: int = DEFAULT_ROW_GROUP_ROWS) -> int:
    """Append ``table`` (:data:`RECORD_SCHEMA` rows of one partition, offset order, at least one
    row) to a :func:`segment_writer` as new row groups of at most ``row_group_rows`` rows.

    Returns:
        The number of row groups written.
    """
    assert table.num_rows > 0, "never write an empty partition chunk"
    table = table.cast(RECORD_SCHEMA) if not table.schema.equals(RECORD_SCHEMA) else table
    writer.write_table(table.replace_schema_metadata(STAMPED_SCHEMA.metadata), row_group_size=row_group_rows)
    return -(-table.num_rows // row_group_rows)


def encode_segments(tables: Sequence[pa.Table], compression: str = "snappy",
                    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
                    as_buffer: bool = False,
                    target: pa.Buffer | None = None) -> tuple[bytes | pa.Buffer, list[tuple[int, int]]]:
    """Encode the record tables of several partitions into one Parquet object.

    Args:
        tables: one table per partition, each with :data:`RECORD_SCHEMA` and sorted by offset.
        compression: Parquet codec name.
        row_group_rows: maximum rows per row group.
        as_buffer: return the encoded object as the ``pyarrow.Buffer`` it was written to
            (``ObjectStore.put`` takes it; ``len()`` is its size) instead of a copy as bytes.
        target: a mutable buffer of at least :func:`encode_buffer_size` ``(tables)`` bytes to
            encode into (with ``as_buffer``, the result is a slice of it: the caller must not
            reuse it while the result is in use). None: a fresh one. Reusing one saves the
            kernel zeroing fresh pages (see :func:`encode_buffer_size`).

    Returns:
        ``(data, ranges)`` where ``ranges[i] = (first_row_group, row_group_count)`` of ``tables[i]``.
    """
    assert tables, "a segment object holds at least one partition"
    if target is None or target.size < encode_buffer_size(tables):
        target = pa.allocate_buffer(encode_buffer_size(tables))
    try:
        buffer, ranges = _encode_into(tables, compression, row_group_rows, pa.FixedSizeBufferWriter(target), target)
    except OSError as exc:  # the object outgrew its estimate: a stream that grows as needed
        if "out of bounds" not in str(exc):
            raise
        buffer, ranges = _encode_into(tables, compression, row_group_rows, pa.BufferOutputStream(), None)
    assert buffer.size, "a Parquet object is never empty"
    return (buffer if as_buffer else buffer.to_pybytes()), ranges


def encode_buffer_size(tables: Sequence[pa.Table]) -> int:
    """Bytes of a buffer big enough for the object of ``tables`` in all but pathological cases:
    the tables' Arrow bytes plus a quarter (snappy's worst expansion is a sixth; Parquet's
    plain encoding of a column is no bigger than its Arrow buffers) plus 1 MiB of headers and
    footer. A ``BufferOutputStream`` grows by doubling: each growth allocates fresh memory
    (page faults, zeroed by the kernel) and copies what was written, which cost as much CPU as
    encoding the batch columns (1 M records of 100 bytes, one measurement on a shared machine:
    0.26 CPU-s to encode into a growing stream, 0.17 into a presized buffer). Pages of the buffer never written are never touched,
    so the headroom costs address space, not memory. A fresh buffer's pages still fault in and
    are zeroed on first touch: encoding the six flushes of a 1 M-record load into fresh buffers
    took 0.19-0.46 CPU-s (median 0.30), into reused ones 0.16-0.18 (median 0.17), alternating
    on one thread; hence ``encode_segments(target=)``.
    """
    return sum(t.nbytes for t in tables) * 5 // 4 + (1 << 20)


def _encode_into(tables: Sequence[pa.Table], compression: str, row_group_rows: int,
                 sink: pa.NativeFile, target: pa.Buffer | None) -> tuple[pa.Buffer, list[tuple[int, int]]]:
    """Write ``tables`` as one object into ``sink`` (a native sink: writing to a Python file
    object takes the GIL for every page, and each take waits for the switch interval while an
    application thread runs Python code): a ``BufferOutputStream``, or a writer over ``target``.
    Returns the written bytes and the row-group ranges."""
    ranges: list[tuple[int, int]] = []
    next_rg = 0
    with segment_writer(sink, compression) as writer:
        for table in tables:
            n_groups = write_records(writer, table, row_group_rows)
            ranges.append((next_rg, n_groups))
            next_rg += n_groups
    if target is None:
        return sink.getvalue(), ranges
    return target.slice(0, sink.tell()), ranges


def open_segment(source, location: str) -> pq.ParquetFile:
    """Open a segment object and check its format tags.

    Raises:
        CorruptObjectError, UnsupportedFormatVersionError: naming ``location``.
    """
    pf = open_parquet(source, location)
    check_tags(pf.schema_arrow.metadata, KIND, VERSION, location)
    check_schema(pf.schema_arrow, RECORD_SCHEMA, location)
    return pf


def _check_row_groups(pf: pq.ParquetFile, location: str, row_groups: list[int]) -> None:
    if any(not 0 <= rg < pf.num_row_groups for rg in row_groups):
        from .errors import CorruptObjectError

        raise CorruptObjectError(location, f"has {pf.num_row_groups} row groups, the catalog names {row_groups}")


def read_segment(source, location: str, row_groups: Iterable[int] | None = None,
                 columns: Sequence[str] | None = None) -> pa.Table:
    """Read records from a segment object (bytes or seekable file).

    Args:
        row_groups: the row groups to read (all when None).
        columns: subset of columns (all when None).

    Raises:
        CorruptObjectError, UnsupportedFormatVersionError: naming ``location``.
    """
    pf = open_segment(source, location)
    rgs = list(row_groups) if row_groups is not None else None
    if rgs is not None:
        _check_row_groups(pf, location, rgs)
    table = read_all(pf, location, rgs, columns)
    return table.replace_schema_metadata(None)


def read_row_group_sets(source, location: str, sets: Sequence[Sequence[int]]) -> list[pa.Table]:
    """Read several disjoint sets of row groups of one segment object in ONE pass (one open,
    one footer parse, one decode of their union): the records of several partitions' segments
    of a flush object, as a merge needs them. Each set is read as :func:`read_segment` would
    (all columns, no schema metadata); the returned tables are zero-copy slices of the one
    decoded table, in the order of ``sets``.

    Raises:
        CorruptObjectError, UnsupportedFormatVersionError: naming ``location`` (also for a row
            group the object does not have).
        ValueError: two sets share a row group.
    """
    pf = open_segment(source, location)
    union = sorted(rg for groups in sets for rg in groups)
    if len(set(union)) != len(union):
        raise ValueError(f"row-group sets of {location} overlap: {list(sets)}")
    _check_row_groups(pf, location, union)
    table = read_all(pf, location, union).replace_schema_metadata(None)
    position, row = {}, 0  # row group -> its first row in ``table``
    for rg in union:
        position[rg] = row
        row += pf.metadata.row_group(rg).num_rows
    assert row == table.num_rows, f"{location}: row groups hold {row} rows, {table.num_rows} decoded"
    out = []
    for groups in sets:
        pieces = [table.slice(position[g], pf.metadata.row_group(g).num_rows) for g in sorted(groups)]
        # a segment's row groups are contiguous, so its pieces are adjacent: one slice
        contiguous = all(b == a + 1 for a, b in zip(sorted(groups), sorted(groups)[1:]))
        if not pieces:
            out.append(table.slice(0, 0))
        elif contiguous:
            out.append(table.slice(position[min(groups)], sum(p.num_rows for p in pieces)))
        else:
            out.append(pa.concat_tables(pieces))
    return out
