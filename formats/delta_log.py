"""The Delta Lake transaction log, as txlake writes and reads it (pure encoding, no I/O).

txlake publishes each topic's committed view as a Delta table whose data files are the log's
own Parquet objects (docs/tables.md). This module is the protocol part of that, following
Delta's PROTOCOL.md (github.com/delta-io/delta):

* the actions of a commit (``protocol``, ``metaData``, ``add``, ``remove``, ``txn``,
  ``commitInfo``), one JSON object per line in ``_delta_log/<version:020d>.json``;
* the table schema: :data:`txlake.formats.records.RECORD_SCHEMA` mapped to Delta's types
  (:func:`delta_schema`);
* deletion vectors ("Deletion Vector Format"): a 64-bit RoaringBitmap in the portable
  serialization behind the magic number 1681511377 (little endian), stored inline as Z85
  (``storageType 'i'``) or in a deletion-vector file (``'u'``: version byte 1, then per vector
  its big-endian size, the bitmap and a big-endian CRC-32);
* :class:`TableSnapshot`: the replay of a table's log (Delta's "Action Reconciliation").

Bitmaps are pyroaring's ``BitMap64``, whose ``serialize()`` is the portable format.
"""

from __future__ import annotations

import json
import struct
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import pyarrow as pa
from pyroaring import BitMap64

from .errors import TxlakeError

#: Delta's deletion-vector protocol: reader 3 / writer 7 with the table feature ``deletionVectors``
MIN_READER_VERSION = 3
MIN_WRITER_VERSION = 7
READER_FEATURES = ["deletionVectors"]
#: ``invariants``: the schema's NOT NULL columns are invariants, and delta-spark refuses a table
#: whose metadata uses a feature its protocol does not list (DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH)
WRITER_FEATURES = ["deletionVectors", "invariants"]
#: magic number of the RoaringBitmapArray portable serialization (PROTOCOL.md "Deletion Vector Format")
DV_MAGIC = 1681511377
#: format version byte of a deletion-vector file
DV_FILE_VERSION = 1
LOG_DIR = "_delta_log"
LAST_CHECKPOINT = "_delta_log/_last_checkpoint"

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}


class DeltaLogError(TxlakeError, ValueError):
    """A Delta log entry or deletion vector that is not what the protocol says (names what and where)."""


def commit_key(version: int) -> str:
    """Key of commit ``version`` relative to the table root: ``_delta_log/00000000000000000007.json``."""
    return f"{LOG_DIR}/{version:020d}.json"


def checkpoint_key(version: int) -> str:
    """Key of the (classic, single-file) checkpoint of ``version`` relative to the table root."""
    return f"{LOG_DIR}/{version:020d}.checkpoint.parquet"


# ------------------------------------------------------------------ Z85
def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ RFC 32) of ``data``, zero-padded to a multiple of 4 bytes as Delta's
    ``Base85Codec`` does (the descriptor's ``sizeInBytes`` tells the reader the true length)."""
    data = bytes(data) + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i:i + 4], "big")
        chunk = []
        for _ in range(5):
            v, r = divmod(v, 85)
            chunk.append(_Z85[r])
        out.append("".join(reversed(chunk)))
    return "".join(out)


def z85_decode(text: str, size: int | None = None) -> bytes:
    """Inverse of :func:`z85_encode`; ``size`` trims the padding.

    Raises:
        DeltaLogError: a length not a multiple of 5, or a character outside Z85's alphabet.
    """
    if len(text) % 5:
        raise DeltaLogError(f"Z85 text of {len(text)} characters is not a multiple of 5")
    out = bytearray()
    for i in range(0, len(text), 5):
        v = 0
        for c in text[i:i + 5]:
            if c not in _Z85_INDEX:
                raise DeltaLogError(f"character {c!r} is not in Z85's alphabet")
            v = v * 85 + _Z85_INDEX[c]
        out += v.to_bytes(4, "big")
    return bytes(out[:size] if size is not None else out)


# ------------------------------------------------------------------ deletion vectors
def serialize_dv(rows: BitMap64) -> bytes:
    """A deletion vector's bytes: the magic number (int32, little endian), then ``rows`` (row
    indexes in the data file, from 0) as a 64-bit RoaringBitmap in the portable format."""
    rows.run_optimize()
    return struct.pack("<i", DV_MAGIC) + rows.serialize()


def deserialize_dv(data: bytes, where: str = "deletion vector") -> BitMap64:
    """Inverse of :func:`serialize_dv`.

    Raises:
        DeltaLogError: another magic number, or bytes that are no portable bitmap (names ``where``).
    """
    if len(data) < 4 or struct.unpack("<i", data[:4])[0] != DV_MAGIC:
        raise DeltaLogError(f"{where}: not a RoaringBitmapArray in the portable format (magic {DV_MAGIC})")
    try:
        return BitMap64.deserialize(data[4:])
    except ValueError as e:
        raise DeltaLogError(f"{where}: {e}") from e


def dv_file(vectors: list[bytes]) -> tuple[bytes, list[int]]:
    """A deletion-vector file holding ``vectors`` (each from :func:`serialize_dv`).

    Returns:
        ``(file bytes, offsets)``: the offset of each vector (its size field) for the descriptor.
    """
    body = bytearray([DV_FILE_VERSION])
    offsets = []
    for dv in vectors:
        offsets.append(len(body))
        body += struct.pack(">i", len(dv)) + dv + struct.pack(">I", zlib.crc32(dv))
    return bytes(body), offsets


def dv_from_file(data: bytes, offset: int, size: int, where: str) -> bytes:
    """The vector at ``offset`` of a deletion-vector file, checked against its size and CRC-32.

    Raises:
        DeltaLogError: bad version byte, size or checksum (names ``where``).
    """
    if not data or data[0] != DV_FILE_VERSION:
        raise DeltaLogError(f"{where}: not a deletion-vector file of format version {DV_FILE_VERSION}")
    (stored,) = struct.unpack(">i", data[offset:offset + 4])
    dv = data[offset + 4:offset + 4 + stored]
    if stored != size or len(dv) != size:
        raise DeltaLogError(f"{where}: vector at offset {offset} holds {stored} bytes, the log says {size}")
    (crc,) = struct.unpack(">I", data[offset + 4 + size:offset + 8 + size])
    if crc != zlib.crc32(dv):
        raise DeltaLogError(f"{where}: vector at offset {offset} fails its CRC-32")
    return dv


def dv_file_name(dv_uuid: uuid.UUID) -> str:
    """File name of a ``'u'`` deletion vector (no random prefix): ``deletion_vector_<uuid>.bin``."""
    return f"deletion_vector_{dv_uuid}.bin"


def inline_descriptor(dv: bytes, cardinality: int) -> dict[str, Any]:
    """The ``deletionVector`` descriptor of a vector stored inline (``storageType 'i'``)."""
    return {"storageType": "i", "pathOrInlineDv": z85_encode(dv), "sizeInBytes": len(dv), "cardinality": cardinality}


def file_descriptor(dv_uuid: uuid.UUID, offset: int, size: int, cardinality: int) -> dict[str, Any]:
    """The descriptor of a vector in the file :func:`dv_file_name` of ``dv_uuid`` under the table root."""
    return {"storageType": "u", "pathOrInlineDv": z85_encode(dv_uuid.bytes), "offset": offset,
            "sizeInBytes": size, "cardinality": cardinality}


def dv_unique_id(descriptor: dict[str, Any] | None) -> str | None:
    """Delta's derived ``uniqueId`` of a descriptor (None without a deletion vector)."""
    if not descriptor:
        return None
    base = descriptor["storageType"] + descriptor["pathOrInlineDv"]
    return base if descriptor.get("offset") is None else f"{base}@{descriptor['offset']}"


def dv_file_key(descriptor: dict[str, Any]) -> str:
    """Key of a ``'u'`` descriptor's file relative to the table root (random prefix included)."""
    text = descriptor["pathOrInlineDv"]
    prefix, encoded = text[:-20], text[-20:]
    name = dv_file_name(uuid.UUID(bytes=z85_decode(encoded, 16)))
    return f"{prefix}/{name}" if prefix else name


# ------------------------------------------------------------------ schema
def delta_type(arrow_type: pa.DataType) -> Any:
    """The Delta schema type (PROTOCOL.md "Schema Serialization Format") of an Arrow type.

    Raises:
        DeltaLogError: a type txlake's record schema does not use.
    """
    simple = {pa.int8(): "byte", pa.int16(): "short", pa.int32(): "integer", pa.int64(): "long",
              pa.binary(): "binary", pa.string(): "string", pa.bool_(): "boolean"}
    if arrow_type in simple:
        return simple[arrow_type]
    if pa.types.is_list(arrow_type):
        return {"type": "array", "elementType": delta_type(arrow_type.value_type),
                "containsNull": arrow_type.value_field.nullable}
    if pa.types.is_struct(arrow_type):
        return {"type": "struct", "fields": [delta_field(f) for f in arrow_type]}
    raise DeltaLogError(f"no Delta type for Arrow type {arrow_type}")


def delta_field(f: pa.Field) -> dict[str, Any]:
    """One Delta struct field of an Arrow field."""
    return {"name": f.name, "type": delta_type(f.type), "nullable": f.nullable, "metadata": {}}


def delta_schema(schema: pa.Schema) -> dict[str, Any]:
    """The Delta schema (a struct) of an Arrow schema; ``json.dumps`` of it is ``schemaString``."""
    return {"type": "struct", "fields": [delta_field(f) for f in schema]}


# ------------------------------------------------------------------ actions
def protocol_action() -> dict[str, Any]:
    """The ``protocol`` action of a table with deletion vectors."""
    return {"protocol": {"minReaderVersion": MIN_READER_VERSION, "minWriterVersion": MIN_WRITER_VERSION,
                         "readerFeatures": list(READER_FEATURES), "writerFeatures": list(WRITER_FEATURES)}}


def metadata_action(table_id: str, name: str, schema: pa.Schema, configuration: dict[str, str],
                    created_ms: int, description: str | None = None) -> dict[str, Any]:
    """The ``metaData`` action: an unpartitioned Parquet table of ``schema``."""
    return {"metaData": {"id": table_id, "name": name, "description": description,
                         "format": {"provider": "parquet", "options": {}},
                         "schemaString": json.dumps(delta_schema(schema)), "partitionColumns": [],
                         "configuration": dict(configuration), "createdTime": created_ms}}


def add_action(path: str, size: int, modification_ms: int, num_records: int,
               deletion_vector: dict[str, Any] | None, tags: dict[str, str] | None = None) -> dict[str, Any]:
    """An ``add`` of the data file at URI ``path`` (``size`` bytes, ``num_records`` physical rows)."""
    add: dict[str, Any] = {"path": path, "partitionValues": {}, "size": size, "modificationTime": modification_ms,
                           "dataChange": True,
                           "stats": json.dumps({"numRecords": num_records, "tightBounds": False})}
    if tags:
        add["tags"] = dict(tags)
    if deletion_vector:
        add["deletionVector"] = dict(deletion_vector)
    return {"add": add}


def remove_action(add: dict[str, Any], deletion_ms: int) -> dict[str, Any]:
    """The ``remove`` of the logical file an earlier ``add`` (its body) put in the table."""
    remove: dict[str, Any] = {"path": add["path"], "deletionTimestamp": deletion_ms, "dataChange": True,
                              "extendedFileMetadata": True, "partitionValues": {}, "size": add["size"]}
    if add.get("deletionVector"):
        remove["deletionVector"] = dict(add["deletionVector"])
    if add.get("tags"):
        remove["tags"] = dict(add["tags"])
    return {"remove": remove}


def txn_action(app_id: str, version: int, updated_ms: int) -> dict[str, Any]:
    """A ``txn`` (transaction identifier) action."""
    return {"txn": {"appId": app_id, "version": version, "lastUpdated": updated_ms}}


def commit_info_action(timestamp_ms: int, operation: str, parameters: dict[str, str],
                       engine_info: str) -> dict[str, Any]:
    """A ``commitInfo`` action (``operationParameters`` values are strings, as Delta writes them)."""
    return {"commitInfo": {"timestamp": timestamp_ms, "operation": operation,
                           "operationParameters": dict(parameters), "engineInfo": engine_info,
                           "isBlindAppend": False}}


def encode_commit(actions: Iterable[dict[str, Any]]) -> bytes:
    """A commit file: one JSON action per line (newline-terminated)."""
    return "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()


def decode_commit(data: bytes, where: str) -> list[dict[str, Any]]:
    """The actions of a commit file.

    Raises:
        DeltaLogError: a line that is not a JSON object (names ``where`` and the line).
    """
    out = []
    for n, line in enumerate(data.decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except json.JSONDecodeError as e:
            raise DeltaLogError(f"{where} line {n}: {e}") from e
        if not isinstance(action, dict):
            raise DeltaLogError(f"{where} line {n}: not a JSON object")
        out.append(action)
    return out


@dataclass
class TableSnapshot:
    """A table's state at ``version`` (-1: no commit yet): the replay of its log.

    Attributes:
        files: path -> the body of the ``add`` of each live logical file (one per path: txlake
            never adds a path twice with different deletion vectors).
        tombstones: path -> the body of the ``remove`` of files removed and not re-added.
        txns: ``appId`` -> ``version`` of the newest ``txn`` of each application.
        metadata / protocol: the newest ``metaData`` / ``protocol`` bodies (None before any).
        commit_info: the ``commitInfo`` body of the newest version (None when it had none).
    """

    version: int = -1
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    tombstones: dict[str, dict[str, Any]] = field(default_factory=dict)
    txns: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    protocol: dict[str, Any] | None = None
    commit_info: dict[str, Any] | None = None

    def apply(self, version: int, actions: list[dict[str, Any]]) -> None:
        """Replay commit ``version`` (which must be the next one)."""
        assert version == self.version + 1, f"commit {version} replayed after {self.version}"
        self.commit_info = None
        for a in actions:  # removes first: a version may remove and re-add one path
            if "remove" in a:
                r = a["remove"]
                self.files.pop(r["path"], None)
                self.tombstones[r["path"]] = r
        for a in actions:
            if "add" in a:
                self.files[a["add"]["path"]] = a["add"]
                self.tombstones.pop(a["add"]["path"], None)
            elif "txn" in a:
                self.txns[a["txn"]["appId"]] = a["txn"]["version"]
            elif "metaData" in a:
                self.metadata = a["metaData"]
            elif "protocol" in a:
                self.protocol = a["protocol"]
            elif "commitInfo" in a:
                self.commit_info = a["commitInfo"]
        self.version = version

    def copy(self) -> "TableSnapshot":
        """An independent copy (the action bodies are shared: they are never changed)."""
        return TableSnapshot(self.version, dict(self.files), dict(self.tombstones), dict(self.txns),
                             self.metadata, self.protocol, self.commit_info)


# ------------------------------------------------------------------ checkpoints
_MAP = pa.map_(pa.string(), pa.string())
_DV = pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string()), ("offset", pa.int32()),
                 ("sizeInBytes", pa.int32()), ("cardinality", pa.int64())])
#: the columns of a classic checkpoint (PROTOCOL.md "Checkpoint Schema"): one action per row
CHECKPOINT_SCHEMA = pa.schema([
    ("txn", pa.struct([("appId", pa.string()), ("version", pa.int64()), ("lastUpdated", pa.int64())])),
    ("add", pa.struct([("path", pa.string()), ("partitionValues", _MAP), ("size", pa.int64()),
                       ("modificationTime", pa.int64()), ("dataChange", pa.bool_()), ("stats", pa.string()),
                       ("tags", _MAP), ("deletionVector", _DV)])),
    ("remove", pa.struct([("path", pa.string()), ("deletionTimestamp", pa.int64()), ("dataChange", pa.bool_()),
                          ("extendedFileMetadata", pa.bool_()), ("partitionValues", _MAP), ("size", pa.int64()),
                          ("tags", _MAP), ("deletionVector", _DV)])),
    ("metaData", pa.struct([("id", pa.string()), ("name", pa.string()), ("description", pa.string()),
                            ("format", pa.struct([("provider", pa.string()), ("options", _MAP)])),
                            ("schemaString", pa.string()), ("partitionColumns", pa.list_(pa.string())),
                            ("configuration", _MAP), ("createdTime", pa.int64())])),
    ("protocol", pa.struct([("minReaderVersion", pa.int32()), ("minWriterVersion", pa.int32()),
                            ("readerFeatures", pa.list_(pa.string())), ("writerFeatures", pa.list_(pa.string()))])),
])
_MAP_FIELDS = {("add", "partitionValues"), ("add", "tags"), ("remove", "partitionValues"), ("remove", "tags"),
               ("metaData", "configuration")}


def _row(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    fields = CHECKPOINT_SCHEMA.field(kind).type
    out = {}
    for f in fields:
        v = body.get(f.name)
        if (kind, f.name) in _MAP_FIELDS and v is not None:
            v = list(v.items())
        elif kind == "metaData" and f.name == "format" and v is not None:
            v = {"provider": v.get("provider"), "options": list((v.get("options") or {}).items())}
        out[f.name] = v
    return {kind: out}


def encode_checkpoint(snapshot: "TableSnapshot", tombstones_after_ms: int = 0) -> tuple[bytes, int]:
    """The Parquet checkpoint of ``snapshot``: protocol, metaData, every ``txn``, every live
    ``add`` and the tombstones removed after ``tombstones_after_ms`` (ms since the epoch).

    Returns:
        ``(parquet bytes, number of actions)`` (the ``size`` of ``_last_checkpoint``).
    """
    rows: list[dict[str, Any]] = []
    if snapshot.protocol is not None:
        rows.append(_row("protocol", snapshot.protocol))
    if snapshot.metadata is not None:
        rows.append(_row("metaData", snapshot.metadata))
    rows += [_row("txn", {"appId": app, "version": v}) for app, v in sorted(snapshot.txns.items())]
    rows += [_row("add", {**add, "dataChange": False}) for _, add in sorted(snapshot.files.items())]
    rows += [_row("remove", r) for _, r in sorted(snapshot.tombstones.items())
             if (r.get("deletionTimestamp") or 0) > tombstones_after_ms]
    table = pa.Table.from_pylist(rows, schema=CHECKPOINT_SCHEMA)
    sink = pa.BufferOutputStream()
    import pyarrow.parquet as pq

    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes(), len(rows)


def _json_body(kind: str, value: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in value.items():
        if v is None:
            continue
        if (kind, k) in _MAP_FIELDS:
            v = dict(v)
        elif kind == "metaData" and k == "format":
            v = {"provider": v["provider"], "options": dict(v.get("options") or [])}
        elif k == "deletionVector":
            v = {dk: dv for dk, dv in v.items() if dv is not None}
        out[k] = v
    return out


def read_checkpoint(table: pa.Table, version: int) -> "TableSnapshot":
    """The snapshot a checkpoint of ``version`` holds (its ``commit_info`` is None)."""
    snap = TableSnapshot(version=version)
    for row in table.to_pylist():
        for kind, value in row.items():
            if value is None:
                continue
            body = _json_body(kind, value)
            if kind == "add":
                snap.files[body["path"]] = body
            elif kind == "remove":
                snap.tombstones[body["path"]] = body
            elif kind == "txn":
                snap.txns[body["appId"]] = body["version"]
            elif kind == "metaData":
                snap.metadata = body
            elif kind == "protocol":
                snap.protocol = body
    return snap
