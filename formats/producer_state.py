"""Producer-state snapshots: the Parquet layout of ProducerStateManager snapshots.

Kafka writes one ``.snapshot`` file per partition (ProducerStateManager); txlake writes
ONE object for all partitions of a storage root (object PUTs cost money), one row per
(partition, producer id). Recovery loads the latest snapshot and replays the log from
each partition's ``end offset`` (stored in the object's metadata as JSON
``{topic: {"topic_id": id, "end_offsets": [offset per partition]}}``).

Columns (format version 1): topic, partition, producer_id, producer_epoch,
coordinator_epoch, last_timestamp (ms), txn_first_offset (offset of the open
transaction's first record, null when none), and ``batches``: the last (up to 5)
batches' sequence and offset ranges, used for duplicate detection (KIP-98).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import pyarrow as pa

from .errors import CorruptObjectError
from .versioning import check_schema, check_tags, encode_parquet, open_parquet, read_all, stamp

KIND = "producer-state"
VERSION = 1
END_OFFSETS_KEY = b"txlake.snapshot.end_offsets"

BATCH_TYPE = pa.struct(
    [
        pa.field("first_seq", pa.int32(), nullable=False),
        pa.field("last_seq", pa.int32(), nullable=False),
        pa.field("first_offset", pa.int64(), nullable=False),
        pa.field("last_offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
    ]
)

SNAPSHOT_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("producer_id", pa.int64(), nullable=False),
        pa.field("producer_epoch", pa.int16(), nullable=False),
        pa.field("coordinator_epoch", pa.int32(), nullable=False),
        pa.field("last_timestamp", pa.int64(), nullable=False),
        pa.field("txn_first_offset", pa.int64()),
        pa.field("batches", pa.list_(BATCH_TYPE), nullable=False),
    ]
)


def encode_snapshot(rows: list[Mapping[str, Any]], end_offsets: Mapping[str, Mapping[str, Any]]) -> bytes:
    """Encode producer entries and the per-partition end offsets they cover."""
    schema = stamp(SNAPSHOT_SCHEMA, KIND, VERSION)
    schema = schema.with_metadata({**schema.metadata, END_OFFSETS_KEY: json.dumps(end_offsets).encode()})
    table = pa.Table.from_pylist(list(rows), schema=schema)
    return encode_parquet(table)


def decode_snapshot(data: bytes, location: str) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """Decode a snapshot into ``(rows, end_offsets)``.

    Raises:
        CorruptObjectError, UnsupportedFormatVersionError: naming ``location``.
    """
    pf = open_parquet(data, location)
    meta = pf.schema_arrow.metadata
    check_tags(meta, KIND, VERSION, location)
    check_schema(pf.schema_arrow, SNAPSHOT_SCHEMA, location)
    try:
        end_offsets = json.loads(meta[END_OFFSETS_KEY])
    except (KeyError, ValueError) as exc:
        raise CorruptObjectError(location, f"producer-state snapshot has no readable end offsets ({exc})") from exc
    return read_all(pf, location).to_pylist(), end_offsets
