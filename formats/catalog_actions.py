"""Catalog actions: the Parquet layout of catalog commits and checkpoints.

The catalog is a log of *actions* (create topic, add segment, ...). A commit object holds
the actions of one commit; a checkpoint holds the actions that rebuild the whole state
at its version. Both use one wide schema: ``action`` names the kind, and each kind fills
the columns it needs (the rest are null) -- the same tagged-row layout Delta Lake uses
for its checkpoints, and queryable as-is with DuckDB.

This module only encodes and decodes rows; what an action *means* is the catalog's
business (:mod:`txlake.catalog.actions`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pyarrow as pa

from .versioning import check_schema, check_tags, encode_parquet, open_parquet, read_all, stamp

COMMIT_KIND = "catalog-commit"
CHECKPOINT_KIND = "catalog-checkpoint"
VERSION = 1

ACTION_SCHEMA = pa.schema(
    [
        pa.field("action", pa.string(), nullable=False),
        pa.field("topic", pa.string()),
        pa.field("topic_id", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("num_partitions", pa.int32()),
        pa.field("config", pa.map_(pa.string(), pa.string())),
        pa.field("path", pa.string()),
        pa.field("base_offset", pa.int64()),
        pa.field("last_offset", pa.int64()),
        pa.field("record_count", pa.int64()),
        pa.field("size_bytes", pa.int64()),
        pa.field("min_timestamp", pa.int64()),
        pa.field("max_timestamp", pa.int64()),
        pa.field("row_group_start", pa.int32()),
        pa.field("row_group_count", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("high_watermark", pa.int64()),
        pa.field("last_stable_offset", pa.int64()),
        pa.field("producer_id", pa.int64()),
        pa.field("producer_epoch", pa.int16()),
        pa.field("owner", pa.string()),
        pa.field("lease_epoch", pa.int64()),
        pa.field("lease_ms", pa.int64()),
        pa.field("timestamp_ms", pa.int64()),
        pa.field("info", pa.string()),
    ]
)
FIELDS = frozenset(ACTION_SCHEMA.names)


def encode_actions(rows: Sequence[Mapping[str, Any]], kind: str, version_number: int) -> bytes:
    """Encode action rows (dicts keyed by column name; missing keys are null) as Parquet.

    Args:
        kind: :data:`COMMIT_KIND` or :data:`CHECKPOINT_KIND`.
        version_number: the catalog version this object is (commit N / checkpoint at N).

    Raises:
        ValueError: a row names a column the schema does not have.
    """
    assert rows, "a catalog object always holds at least one action"
    for row in rows:
        unknown = set(row) - FIELDS
        if unknown:
            raise ValueError(f"catalog action has unknown fields {sorted(unknown)}")
    table = pa.Table.from_pylist(
        [{**row, "config": list(row["config"].items()) if row.get("config") is not None else None} for row in rows],
        schema=stamp(ACTION_SCHEMA, kind, VERSION, {"txlake.catalog.version": str(version_number)}),
    )
    # a commit is a few rows: no statistics or dictionaries (readers read it whole)
    return encode_parquet(table, small=kind == COMMIT_KIND)


def decode_actions(data: bytes, kind: str, location: str) -> list[dict[str, Any]]:
    """Decode a commit or checkpoint object into action rows (null columns omitted).

    Raises:
        CorruptObjectError, UnsupportedFormatVersionError: naming ``location``.
    """
    pf = open_parquet(data, location)
    check_tags(pf.schema_arrow.metadata, kind, VERSION, location)
    check_schema(pf.schema_arrow, ACTION_SCHEMA, location)
    rows = read_all(pf, location).to_pylist()
    out = []
    for row in rows:
        clean = {k: v for k, v in row.items() if v is not None}
        if "config" in clean:
            clean["config"] = dict(clean["config"])
        out.append(clean)
    return out
