"""Kafka record batches on the wire (message format v2, KIP-98) <-> the log's Arrow columns.

A Produce request carries, for each partition, a ``records`` field holding record
batches; a Fetch response carries them back. This module is the codec between those
bytes and the rows txlake keeps (:mod:`.records`):

* :func:`decode_batches` parses a Produce request's ``records`` of one partition into
  :class:`WireBatch` values (the batch header, decoded, and the records as rows of
  :data:`~.records.PAYLOAD_SCHEMA`), with the checks a Kafka broker makes before it
  appends (``ProduceRequest.validateRecords``, ``UnifiedLog.analyzeAndValidateRecords``,
  ``LogValidator.validateBatch``, ``DefaultRecordBatch`` / ``DefaultRecord.readFrom``).
* :func:`encode_batches` turns rows of :data:`~.records.RECORD_SCHEMA` (what the log
  reader returns for a Fetch) into the bytes of a Fetch response's ``records``.

Wire layout (Kafka's ``DefaultRecordBatch``; all integers big-endian)::

    baseOffset int64 | batchLength int32 (bytes after this field) | partitionLeaderEpoch int32
    | magic int8 (= 2) | crc uint32 (CRC-32C of attributes .. end) | attributes int16
    | lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 | producerId int64
    | producerEpoch int16 | baseSequence int32 | recordCount int32 | records

    attributes: bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd),
                bit 3 timestamp type (1 LogAppendTime), bit 4 transactional, bit 5 control

Each record (``DefaultRecord``; varint = zig-zag LEB128 as in Protocol Buffers)::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
    | keyLength varint (-1: null) | key | valueLength varint (-1: null) | value
    | headerCount varint | [headerKeyLength varint | headerKey (UTF-8)
                           | headerValueLength varint (-1: null) | headerValue]

With compression, everything after ``recordCount`` is one compressed stream of the
records: gzip, snappy (raw, or the xerial/Java framing Kafka's Java client writes), the
LZ4 frame format (independent blocks), or zstd frames. A control batch (transaction
marker, KIP-98) holds one record: key = version int16 0 + type int16 (0 ABORT, 1 COMMIT,
Kafka's ``ControlRecordType``), value = version int16 0 + coordinator epoch int32
(Kafka's ``EndTransactionMarker``) -- exactly the key and value the engine stores on a
marker row, so those bytes pass through unchanged.
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from itertools import accumulate

import cramjam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c as _crc32c

from .errors import RecordBatchError
from .records import HEADER_TYPE, PAYLOAD_SCHEMA, TIMESTAMP_LOG_APPEND_TIME

__all__ = ["WireBatch", "decode_batches", "encode_batches", "COMPRESSION_TYPES",
           "CORRUPT_MESSAGE", "INVALID_RECORD", "NO_PARTITION_LEADER_EPOCH"]

#: Kafka error names a :class:`~.errors.RecordBatchError` carries
CORRUPT_MESSAGE = "CORRUPT_MESSAGE"
INVALID_RECORD = "INVALID_RECORD"

#: Kafka's ``CompressionType`` names, by id (the low three bits of a batch's attributes)
COMPRESSION_TYPES = ("none", "gzip", "snappy", "lz4", "zstd")
_COMPRESSION_IDS = {name: i for i, name in enumerate(COMPRESSION_TYPES)}

#: ``RecordBatch.NO_PARTITION_LEADER_EPOCH``: a batch that names no leader epoch
NO_PARTITION_LEADER_EPOCH = -1

MAGIC_V2 = 2
LOG_OVERHEAD = 12  # baseOffset + batchLength
_MAGIC_OFFSET = 16
_HEADER_SIZE_UP_TO_MAGIC = 17
_ATTRIBUTES_OFFSET = 21  # the CRC covers attributes .. end of batch
RECORD_BATCH_OVERHEAD = 61  # DefaultRecordBatch.RECORD_BATCH_OVERHEAD: a batch with no records
_RECORD_OVERHEAD_V0 = 14  # LegacyRecord.RECORD_OVERHEAD_V0: the least batchLength Kafka's framing reads on

_HEADER = struct.Struct(">qiibIhiqqqhii")  # the whole 61-byte header
_PREFIX = struct.Struct(">qiibI")  # baseOffset .. crc (21 bytes, not covered by the CRC)
_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. recordCount (40 bytes)
_INT32 = struct.Struct(">i")
_CONTROL_KEY = struct.Struct(">hh")  # version, type (ControlRecordType)
_CONTROL_VALUE = struct.Struct(">hi")  # version, coordinator epoch (EndTransactionMarker)

_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20

#: the xerial snappy framing (SnappyOutputStream, what Kafka's Java client writes): magic,
#: then version and compatible version (int32 each), then blocks of int32 length + raw snappy
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024  # SnappyOutputStream's default block size
#: compression level by codec id when the caller names none: Kafka's defaults for gzip (6,
#: ``compression.gzip.level``) and zstd (3, ``compression.zstd.level``); LZ4's fast mode (1)
#: where Kafka's producer defaults to 9 (LZ4-HC, about ten times slower to write)
_DEFAULT_LEVELS = {1: 6, 3: 1, 4: 3}

_INT32_MAX = (1 << 31) - 1


@dataclass(slots=True)
class WireBatch:
    """One decoded record batch (message format v2) of a partition's ``records``.

    Attributes:
        base_offset: the batch's first offset (0 in a producer's batch; the log assigns offsets).
        partition_leader_epoch: the leader epoch the batch names (-1: none).
        compression: ``"none"``, ``"gzip"``, ``"snappy"``, ``"lz4"`` or ``"zstd"``.
        timestamp_type: 0 CreateTime, 1 LogAppendTime (:data:`.records.TIMESTAMP_LOG_APPEND_TIME`).
        is_transactional / is_control: the batch's attribute bits (KIP-98).
        last_offset_delta: last offset of the batch minus ``base_offset``.
        base_timestamp / max_timestamp: ms since the epoch, from the header (-1: none).
        producer_id / producer_epoch / base_sequence: -1 when the producer is not idempotent.
        record_count: the header's record count (equal to ``records.num_rows``).
        records: rows of :data:`~.records.PAYLOAD_SCHEMA`: timestamp (ms; base_timestamp +
            the record's delta, or max_timestamp for LogAppendTime, as Kafka's record
            iterator gives it), key and value (null when absent), headers (null when none).
        position: byte position of the batch in the partition's ``records``.
        size_in_bytes: the batch's size on the wire, its 12 bytes of offset and length included.
    """

    base_offset: int
    partition_leader_epoch: int
    compression: str
    timestamp_type: int
    is_transactional: bool
    is_control: bool
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    records: pa.Table
    position: int = 0
    size_in_bytes: int = 0

    @property
    def last_offset(self) -> int:
        """``base_offset + last_offset_delta``."""
        return self.base_offset + self.last_offset_delta

    @property
    def has_producer_id(self) -> bool:
        """The batch names a producer id (Kafka's ``RecordBatch.hasProducerId``)."""
        return self.producer_id >= 0


class _Malformed(Exception):
    """A fault inside a batch's records: turned into a RecordBatchError by the caller."""

    def __init__(self, error_name: str, reason: str, position: int | None = None):
        super().__init__(reason)
        self.error_name = error_name
        self.reason = reason
        #: byte position of the fault in the (decompressed) records, when known
        self.position = position


# ---------------------------------------------------------------------------------- decode


def decode_batches(data: bytes | bytearray | memoryview, *, topic: str, partition: int,
                   client: bool = True) -> list[WireBatch]:
    """Decode one partition's ``records`` field of a Produce request (zero or more v2 batches).

    Args:
        data: the bytes of the ``records`` field (batches back to back, each framed by its
            ``batchLength``).
        topic, partition: the topic-partition the records are for (named in errors).
        client: apply the checks Kafka makes on records a client produces
            (``AppendOrigin.CLIENT``): exactly one batch (``ProduceRequest.validateRecords``),
            ``baseOffset`` 0 (``UnifiedLog.analyzeAndValidateRecords``), a positive record
            count equal to ``lastOffsetDelta + 1``, no control batch, and a base sequence
            when the batch names a producer id (``LogValidator.validateBatch``). False
            decodes any well-formed v2 batches, e.g. ones :func:`encode_batches` wrote.

    Returns:
        The batches in order, each with its records as rows of :data:`~.records.PAYLOAD_SCHEMA`.

    Raises:
        RecordBatchError: naming the topic-partition, the batch index, the byte position
            and the fault; its ``error_name`` is the Kafka error a broker answers with:

            * ``CORRUPT_MESSAGE`` (``CorruptRecordException``): a ``batchLength`` below 14,
              a magic byte outside 0..2, a batch shorter than the 61-byte v2 header, a CRC-32C
              that does not match, an unknown compression id (5..7; Kafka fails these with an
              unexpected ``IllegalArgumentException``), or compressed records that do not
              decompress (Kafka answers those with its generic ``KafkaException``, i.e.
              UNKNOWN_SERVER_ERROR; a corrupt payload is the truthful name).
            * ``INVALID_RECORD`` (``InvalidRecordException``): magic 0 or 1 (Kafka 4 accepts
              only v2 in Produce v3+), truncated input, a negative record count, records
              that end before the declared count or bytes left after it, a record whose
              length, header count or header key length is impossible, and the ``client``
              checks above.

        Nothing else is raised, whatever the bytes.

    Record offset deltas are read but not checked: the log places the records at
    consecutive offsets in their order, as Kafka's ``LogValidator`` rewrites a batch whose
    inner offsets are not 0..n-1 rather than refusing it. A header key that is not UTF-8
    is decoded with replacement characters, as Java's ``new String(bytes, UTF_8)`` does.
    """
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
    total = len(view)

    def fail(error_name: str, index: int, position: int, reason: str) -> RecordBatchError:
        return RecordBatchError(error_name, topic, partition, index, position, reason)

    # framing first (ByteBufferLogInputStream.nextBatchSize), so that the whole request's
    # shape is known before any batch is checked, as ProduceRequest.validateRecords sees it
    spans: list[tuple[int, int]] = []
    pos = 0
    while pos < total:
        index = len(spans)
        remaining = total - pos
        if remaining < LOG_OVERHEAD:
            raise fail(INVALID_RECORD, index, pos, f"{remaining} trailing bytes, fewer than the {LOG_OVERHEAD} of a "
                                                   "batch's offset and length: the records are truncated")
        length = _INT32.unpack_from(view, pos + 8)[0]
        if length < _RECORD_OVERHEAD_V0:
            raise fail(CORRUPT_MESSAGE, index, pos, f"batch length {length} is less than the minimum record "
                                                    f"overhead ({_RECORD_OVERHEAD_V0})")
        if remaining < _HEADER_SIZE_UP_TO_MAGIC:
            raise fail(INVALID_RECORD, index, pos, f"batch length {length} needs {length + LOG_OVERHEAD} bytes, "
                                                   f"only {remaining} remain: the records are truncated")
        magic = view[pos + _MAGIC_OFFSET]
        magic = magic - 256 if magic > 127 else magic
        if magic < 0 or magic > MAGIC_V2:
            raise fail(CORRUPT_MESSAGE, index, pos, f"invalid magic {magic} (Kafka knows 0, 1 and 2)")
        if magic != MAGIC_V2:
            raise fail(INVALID_RECORD, index, pos, f"magic {magic} (message format v{magic}): Produce requests "
                                                   "(v3 and later) may only contain record batches with magic 2")
        size = length + LOG_OVERHEAD
        if remaining < size:
            raise fail(INVALID_RECORD, index, pos, f"batch length {length} needs {size} bytes, only {remaining} "
                                                   "remain: the records are truncated")
        spans.append((pos, size))
        pos += size

    if client and len(spans) != 1:
        what = "no record batch" if not spans else f"{len(spans)} record batches"
        raise fail(INVALID_RECORD, min(len(spans), 1), spans[1][0] if len(spans) > 1 else 0,
                   f"{what}: a Produce request must contain exactly one record batch per partition")

    batches = []
    for index, (pos, size) in enumerate(spans):
        batches.append(_decode_batch(view, pos, size, index, client, fail))
    return batches


def _decode_batch(view: memoryview, pos: int, size: int, index: int, client: bool, fail) -> WireBatch:
    if size < RECORD_BATCH_OVERHEAD:
        raise fail(CORRUPT_MESSAGE, index, pos, f"the batch size {size} is smaller than the minimum allowed "
                                                f"overhead {RECORD_BATCH_OVERHEAD}")
    (base_offset, _, epoch, _, crc, attributes, last_offset_delta, base_timestamp, max_timestamp,
     producer_id, producer_epoch, base_sequence, count) = _HEADER.unpack_from(view, pos)
    if client and base_offset != 0:
        raise fail(INVALID_RECORD, index, pos, f"the base offset of a produced batch must be 0, it is {base_offset}")
    computed = _crc32c(view[pos + _ATTRIBUTES_OFFSET:pos + size])
    if computed != crc:
        raise fail(CORRUPT_MESSAGE, index, pos, f"stored crc = {crc}, computed crc = {computed}")
    codec = attributes & 0x07
    if codec >= len(COMPRESSION_TYPES):
        raise fail(CORRUPT_MESSAGE, index, pos, f"unknown compression type id {codec}")
    is_control = bool(attributes & _CONTROL_BIT)
    if client:
        last_offset = base_offset + last_offset_delta
        if last_offset_delta < 0:
            raise fail(INVALID_RECORD, index, pos, f"invalid offset range [{base_offset}, {last_offset}]")
        if count <= 0:
            raise fail(INVALID_RECORD, index, pos, f"invalid reported count for record batch: {count}")
        if last_offset_delta + 1 != count:
            raise fail(INVALID_RECORD, index, pos, f"inconsistent batch offset range [{base_offset}, {last_offset}] "
                                                   f"and count of records {count}")
        if is_control:
            raise fail(INVALID_RECORD, index, pos, "clients are not allowed to write control records")
        if producer_id >= 0 and base_sequence < 0:
            raise fail(INVALID_RECORD, index, pos, f"invalid sequence number {base_sequence} in record batch with "
                                                   f"producer id {producer_id}")
    if count < 0:
        raise fail(INVALID_RECORD, index, pos, f"invalid record count {count}")
    body = view[pos + RECORD_BATCH_OVERHEAD:pos + size]
    timestamp_type = (attributes & _TIMESTAMP_TYPE_BIT) >> 3
    try:
        if codec:
            try:
                buf = _decompress(codec, body)
            except _Malformed:
                raise
            except Exception as exc:  # noqa: BLE001 -- whatever the codec library raises on garbage
                raise _Malformed(CORRUPT_MESSAGE, f"{COMPRESSION_TYPES[codec]} records do not decompress: {exc}")
        else:
            buf = bytes(body)
        records = _decode_records(buf, 0, len(buf), count, base_timestamp,
                                  max_timestamp if timestamp_type == TIMESTAMP_LOG_APPEND_TIME else None)
    except _Malformed as exc:
        if exc.position is None:
            raise fail(exc.error_name, index, pos, exc.reason) from None
        if codec:  # a position in the decompressed records: name it, point at the batch
            raise fail(exc.error_name, index, pos, f"{exc.reason} (at byte {exc.position} of the decompressed "
                                                   "records)") from None
        raise fail(exc.error_name, index, pos + RECORD_BATCH_OVERHEAD + exc.position, exc.reason) from None
    return WireBatch(base_offset, epoch, COMPRESSION_TYPES[codec], timestamp_type,
                     bool(attributes & _TRANSACTIONAL_BIT), is_control, last_offset_delta, base_timestamp,
                     max_timestamp, producer_id, producer_epoch, base_sequence, count, records, pos, size)


#: the most bytes one batch's records may decompress to (a compression bomb -- a small request
#: that expands to gigabytes -- is refused as MESSAGE_TOO_LARGE instead of exhausting memory;
#: Kafka's own default ``message.max.bytes`` is 1 MB of *compressed* batch)
MAX_DECOMPRESSED_BYTES = 128 * 1024 * 1024
MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"


def _decompress(codec: int, body: memoryview, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """The decompressed records, written into a buffer of ``limit`` bytes (reserved, not
    touched, until written) so that no input can make it allocate more."""
    if codec == 2 and len(body) >= 16 and body[:8] == _XERIAL_MAGIC:
        return _xerial_decode(body, limit)
    into = {1: cramjam.gzip.decompress_into, 2: cramjam.snappy.decompress_raw_into,
            3: cramjam.lz4.decompress_into, 4: cramjam.zstd.decompress_into}[codec]
    return _bounded(into, body, limit)


def _bounded(into, body: memoryview, limit: int) -> bytes:
    """``into(body, buffer)`` with a buffer that starts at 4x the compressed size (64 KiB at
    least) and grows 8x while the records do not fit, up to ``limit`` bytes: a usual batch is
    decompressed once into a small buffer, a bomb stops at the limit."""
    size = min(limit + 1, max(1 << 16, 4 * len(body)))
    while True:
        out = np.empty(size, dtype=np.uint8)
        try:
            n = into(body, out)
        except Exception as exc:  # noqa: BLE001 -- cramjam says "failed to write whole buffer" / "smaller than required"
            text = str(exc)
            if "whole buffer" not in text and "smaller than required" not in text:
                raise
            if size > limit:
                raise _Malformed(MESSAGE_TOO_LARGE, f"the records decompress to more than {limit} bytes "
                                                    f"(MAX_DECOMPRESSED_BYTES)") from None
            size = min(limit + 1, size * 8)
            continue
        if n > limit:
            raise _Malformed(MESSAGE_TOO_LARGE, f"the records decompress to more than {limit} bytes (MAX_DECOMPRESSED_BYTES)")
        return out[:n].tobytes()


def _xerial_decode(body: memoryview, limit: int = MAX_DECOMPRESSED_BYTES) -> bytes:
    """The xerial snappy framing: 16-byte header, then blocks of int32 length + raw snappy."""
    out = []
    total = 0
    pos, end = 16, len(body)
    while pos < end:
        if end - pos < 4:
            raise _Malformed(CORRUPT_MESSAGE, f"snappy (xerial) block header truncated at byte {pos} of the "
                                              "compressed records")
        length = _INT32.unpack_from(body, pos)[0]
        pos += 4
        if length < 0 or pos + length > end:
            raise _Malformed(CORRUPT_MESSAGE, f"snappy (xerial) block of {length} bytes at byte {pos - 4} does not "
                                              f"fit the {end} bytes of compressed records")
        try:
            block = _bounded(cramjam.snappy.decompress_raw_into, body[pos:pos + length], limit - total)
        except _Malformed as exc:
            if exc.error_name != MESSAGE_TOO_LARGE:
                raise
            raise _Malformed(MESSAGE_TOO_LARGE, f"the records decompress to more than {limit} bytes "
                                                "(MAX_DECOMPRESSED_BYTES)") from None
        total += len(block)
        out.append(block)
        pos += length
    return b"".join(out)


def _varint_slow(buf: bytes, pos: int, max_bytes: int, bits: int) -> tuple[int, int]:
    """A zig-zag varint of up to ``max_bytes`` bytes at ``pos`` (5 for int32, 10 for int64),
    wrapped to ``bits`` bits as Java's ``ByteUtils.readVarint``/``readVarlong`` read it."""
    value = 0
    shift = 0
    end = len(buf)
    for _ in range(max_bytes):
        if pos >= end:
            raise _Malformed(INVALID_RECORD, "found invalid record structure: a varint runs past the end of the records")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            value &= (1 << bits) - 1
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
    raise _Malformed(INVALID_RECORD, f"found invalid record structure: a varint longer than {max_bytes} bytes")


def _decode_records(buf: bytes, pos: int, end: int, count: int, base_timestamp: int,
                    log_append_time: int | None) -> pa.Table:
    """Parse ``count`` records of ``buf[pos:end]`` into PAYLOAD_SCHEMA rows (DefaultRecord.readFrom).

    One pass of plain Python over the bytes, with the one- and two-byte varints (every
    length below 8 KiB) read inline; the columns are built from buffers at the end."""
    keys: list = []
    values: list = []
    timestamps: list = []
    headers: list = []
    any_headers = False
    add_key, add_value, add_timestamp, add_headers = keys.append, values.append, timestamps.append, headers.append
    slow = _varint_slow
    index = 0
    record_start = pos
    try:
        for index in range(count):
            if pos >= end:
                raise _Malformed(INVALID_RECORD, f"incorrect declared batch size, premature EOF reached: the records "
                                                 f"end after {index} of the {count} the batch declares")
            record_start = pos
            # length
            v = buf[pos]
            if v < 0x80:
                pos += 1
                length = (v >> 1) ^ -(v & 1)
            elif buf[pos + 1] < 0x80:
                v = (v & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
                length = (v >> 1) ^ -(v & 1)
            else:
                length, pos = slow(buf, pos, 5, 32)
            start = pos
            if length < 0 or length > end - start:
                raise _Malformed(INVALID_RECORD, f"invalid record size: expected {length} bytes in record payload, "
                                                 f"but the records have only {end - start} remaining bytes")
            pos += 1  # the record's attributes: unused
            # timestamp delta (varlong)
            v = buf[pos]
            if v < 0x80:
                pos += 1
                add_timestamp(base_timestamp + ((v >> 1) ^ -(v & 1)))
            else:
                v, pos = slow(buf, pos, 10, 64)
                add_timestamp(base_timestamp + v)
            # offset delta: read, not kept (the log assigns consecutive offsets)
            if buf[pos] < 0x80:
                pos += 1
            else:
                _, pos = slow(buf, pos, 5, 32)
            # key
            v = buf[pos]
            if v < 0x80:
                pos += 1
                n = (v >> 1) ^ -(v & 1)
            elif buf[pos + 1] < 0x80:
                v = (v & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
                n = (v >> 1) ^ -(v & 1)
            else:
                n, pos = slow(buf, pos, 5, 32)
            if n < 0:
                add_key(None)
            else:
                add_key(buf[pos:pos + n])
                pos += n
            # value
            v = buf[pos]
            if v < 0x80:
                pos += 1
                n = (v >> 1) ^ -(v & 1)
            elif buf[pos + 1] < 0x80:
                v = (v & 0x7F) | (buf[pos + 1] << 7)
                pos += 2
                n = (v >> 1) ^ -(v & 1)
            else:
                n, pos = slow(buf, pos, 5, 32)
            if n < 0:
                add_value(None)
            else:
                add_value(buf[pos:pos + n])
                pos += n
            # headers
            v = buf[pos]
            if v == 0:
                pos += 1
                add_headers(None)
            else:
                n, pos = slow(buf, pos, 5, 32)
                if n < 0:
                    raise _Malformed(INVALID_RECORD, f"found invalid number of record headers {n}")
                if n > end - pos:
                    raise _Malformed(INVALID_RECORD, f"found invalid number of record headers: {n} is larger than "
                                                     f"the {end - pos} remaining bytes")
                pairs = []
                for _ in range(n):
                    hk, pos = slow(buf, pos, 5, 32)
                    if hk < 0:
                        raise _Malformed(INVALID_RECORD, f"invalid negative header key size {hk}")
                    key = buf[pos:pos + hk].decode("utf-8", "replace")
                    pos += hk
                    hv, pos = slow(buf, pos, 5, 32)
                    if hv < 0:
                        pairs.append({"key": key, "value": None})
                    else:
                        pairs.append({"key": key, "value": buf[pos:pos + hv]})
                        pos += hv
                add_headers(pairs)
                any_headers = True
            if pos - start != length:
                raise _Malformed(INVALID_RECORD, f"invalid record size: expected to read {length} bytes in record "
                                                 f"payload, but instead read {pos - start}")
    except IndexError:
        raise _Malformed(INVALID_RECORD, f"found invalid record structure: record {index} runs past the end of "
                                         "the records", record_start) from None
    except _Malformed as exc:
        exc.position = record_start
        raise
    if pos != end:
        raise _Malformed(INVALID_RECORD, f"incorrect declared batch size: {end - pos} bytes remain after the "
                                         f"{count} records the batch declares", pos)
    n = len(keys)
    if log_append_time is not None:
        stamps = array("q", [log_append_time]) * n
    else:
        try:
            stamps = array("q", timestamps)
        except OverflowError:  # Java's long addition wraps
            stamps = array("q", [((t + (1 << 63)) % (1 << 64)) - (1 << 63) for t in timestamps])
    return pa.Table.from_arrays(
        [pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(stamps)]), _binary_array(keys),
         _binary_array(values), pa.array(headers, HEADER_TYPE) if any_headers else pa.nulls(n, HEADER_TYPE)],
        schema=PAYLOAD_SCHEMA)


def _binary_array(items: list) -> pa.Array:
    """A binary array of ``items`` (bytes or None), built from one joined buffer and its
    offsets (``pa.array`` on a list of bytes is several times slower on small batches)."""
    n = len(items)
    validity = None
    null_count = 0
    if None in items:
        valid = [item is not None for item in items]
        null_count = n - sum(valid)
        validity = pa.py_buffer(np.packbits(np.array(valid, dtype=bool), bitorder="little"))
        items = [b"" if item is None else item for item in items]
    data = b"".join(items)
    if len(data) > _INT32_MAX:
        raise _Malformed(INVALID_RECORD, f"the records hold {len(data)} bytes of keys or values, more than the "
                                         f"{_INT32_MAX} one column of a batch can hold")
    offsets = array("i", [0])
    offsets.extend(accumulate(map(len, items)))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=null_count)


# ---------------------------------------------------------------------------------- encode


def _varint(z: int) -> bytes:
    """LEB128 of an already zig-zagged (non-negative) value."""
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


#: LEB128 bytes of every zig-zagged value that fits two bytes (|n| < 8192)
_VARINT_TABLE = tuple(_varint(z) for z in range(1 << 14))
_NULL = b"\x01"  # varint -1: a null key, value or header value
_ZERO = b"\x00"  # varint 0: no headers; also a record's attributes byte


def _zigzag_bytes(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    return _VARINT_TABLE[z] if z < 16384 else _varint(z)


def _encode_headers(pairs) -> bytes:
    if not pairs:
        return _ZERO
    out = [_zigzag_bytes(len(pairs))]
    for pair in pairs:
        key = pair["key"].encode("utf-8")
        out.append(_zigzag_bytes(len(key)))
        out.append(key)
        value = pair["value"]
        if value is None:
            out.append(_NULL)
        else:
            out.append(_zigzag_bytes(len(value)))
            out.append(value)
    return b"".join(out)


def _compress(codec: int, data: bytes, level: int | None) -> bytes:
    if codec == 1:
        return bytes(cramjam.gzip.compress(data, level=_DEFAULT_LEVELS[1] if level is None else level))
    if codec == 2:
        view = memoryview(data)
        out = [_XERIAL_HEADER]
        for start in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK]))
            out.append(_INT32.pack(len(block)))
            out.append(block)
        return b"".join(out)
    if codec == 3:
        # Kafka's Lz4BlockInputStream reads only frames of independent blocks
        compressor = cramjam.lz4.Compressor(level=_DEFAULT_LEVELS[3] if level is None else level,
                                            content_checksum=False, block_linked=False)
        compressor.compress(data)
        return bytes(compressor.finish())
    return bytes(cramjam.zstd.compress(data, level=_DEFAULT_LEVELS[4] if level is None else level))


#: the 61-byte v2 batch header as a numpy record (big-endian, unaligned): every batch's
#: header of a Fetch is built at once
_HEADER_DTYPE = np.dtype([("base_offset", ">i8"), ("batch_length", ">i4"), ("partition_leader_epoch", ">i4"),
                          ("magic", "i1"), ("crc", ">u4"), ("attributes", ">i2"), ("last_offset_delta", ">i4"),
                          ("base_timestamp", ">i8"), ("max_timestamp", ">i8"), ("producer_id", ">i8"),
                          ("producer_epoch", ">i2"), ("base_sequence", ">i4"), ("record_count", ">i4")])
assert _HEADER_DTYPE.itemsize == RECORD_BATCH_OVERHEAD
_CRC = struct.Struct(">I")
_CRC_OFFSET = 17
#: a zig-zagged value needs one LEB128 byte more at each of these thresholds (2**7, 2**14, ...)
_VARINT_THRESHOLDS = tuple(np.uint64(1 << (7 * i)) for i in range(1, 10))
_SEVEN = np.uint64(7)


def _zigzag(values: np.ndarray) -> np.ndarray:
    """Zig-zag of int64 values, as uint64 (Kafka's ``ByteUtils.writeVarlong``)."""
    values = values.astype(np.int64, copy=False)
    return ((values << 1) ^ (values >> 63)).view(np.uint64)


def _varint_sizes(z: np.ndarray, max_bytes: int) -> np.ndarray:
    """Bytes of each zig-zagged value's LEB128 (1 .. ``max_bytes``: 5 for an int32, 10 for an int64)."""
    sizes = np.ones(len(z), dtype=np.int64)
    for threshold in _VARINT_THRESHOLDS[:max_bytes - 1]:
        sizes += z >= threshold
    return sizes


def _put_varints(out: np.ndarray, positions: np.ndarray, z: np.ndarray, sizes: np.ndarray) -> None:
    """Write the LEB128 of each ``z`` (``sizes`` bytes, from :func:`_varint_sizes`) at ``out[positions]``:
    one vectorized pass per byte of the longest."""
    while len(positions):
        more = sizes > 1
        out[positions] = (z & np.uint64(0x7F)).astype(np.uint8) | (more.astype(np.uint8) << 7)
        if not more.any():
            return
        positions, z, sizes = positions[more] + 1, z[more] >> _SEVEN, sizes[more] - 1


def _varint_column(z: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, data)`` of a binary column holding each value's LEB128."""
    offsets = np.zeros(len(z) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    _put_varints(data, offsets[:-1], z, sizes)
    return offsets, data


def _binary_column(offsets: np.ndarray, data: np.ndarray, large: bool) -> pa.Array:
    kind, width = (pa.large_binary(), np.int64) if large else (pa.binary(), np.int32)
    return pa.Array.from_buffers(kind, len(offsets) - 1, [None, pa.py_buffer(offsets.astype(width, copy=False)),
                                                           pa.py_buffer(data)])


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _lengths(column: pa.Array) -> np.ndarray:
    """Byte length of each item, -1 where null (the record's keyLength / valueLength)."""
    return pc.fill_null(pc.binary_length(column), -1).to_numpy().astype(np.int64, copy=False)


def _control_records(rows: pa.Table, keys: pa.Array, values: pa.Array, control: np.ndarray, starts: np.ndarray,
                     counts: np.ndarray, offsets: np.ndarray) -> tuple[pa.Array, pa.Array]:
    """Keys and values with each null key / value of a control batch's rows replaced by the
    ``ControlRecordType`` key (version 0, the batch's control_type) / ``EndTransactionMarker``
    value (version 0, its coordinator_epoch; stays null without one)."""
    batch_of_row = np.repeat(np.arange(len(starts)), counts)
    in_control = control[batch_of_row]
    need_key = in_control & ~keys.is_valid().to_numpy(zero_copy_only=False)
    need_value = in_control & ~values.is_valid().to_numpy(zero_copy_only=False)
    if need_key.any():
        control_types = rows.column("control_type").take(pa.array(starts)).to_pylist()
        replacements = []
        for k in np.flatnonzero(need_key).tolist():
            control_type = control_types[batch_of_row[k]]
            if control_type is None:
                raise ValueError(f"control row at offset {offsets[k]} has neither a key nor a control_type")
            replacements.append(_CONTROL_KEY.pack(0, control_type))
        keys = pc.replace_with_mask(keys, pa.array(need_key), pa.array(replacements, pa.binary()))
    if need_value.any():
        epochs = rows.column("coordinator_epoch").take(pa.array(starts)).to_pylist()
        replaced = [k for k in np.flatnonzero(need_value).tolist() if epochs[batch_of_row[k]] is not None]
        if replaced:
            mask = np.zeros(len(need_value), dtype=bool)
            mask[replaced] = True
            values = pc.replace_with_mask(values, pa.array(mask), pa.array(
                [_CONTROL_VALUE.pack(0, epochs[batch_of_row[k]]) for k in replaced], pa.binary()))
    return keys, values


def encode_batches(rows: pa.Table, *, compression: str = "none", compression_level: int | None = None,
                   partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH) -> memoryview:
    """Encode one partition's log rows as the ``records`` of a Fetch response.

    Args:
        rows: rows of :data:`~.records.RECORD_SCHEMA` (the columns offset, timestamp,
            timestamp_type, key, value, headers, producer_id, producer_epoch, base_sequence,
            base_offset, last_offset_delta, is_transactional, is_control, control_type and
            coordinator_epoch are read) of one partition in offset order, as the log reader
            returns them: possibly starting in the middle of a batch, possibly with gaps
            left by compaction or aborted-record removal.
        compression: ``"none"``, ``"gzip"``, ``"snappy"`` (xerial framing, as Kafka's Java
            client writes), ``"lz4"`` (LZ4 frame, independent 64 KiB blocks, as Kafka's
            ``Lz4BlockInputStream`` requires) or ``"zstd"``. Control batches are never
            compressed, as Kafka writes transaction markers.
        compression_level: the codec's level; None: gzip 6 and zstd 3 (Kafka's defaults),
            lz4 1 (LZ4's fast mode; Kafka's producer default, 9, is LZ4-HC). Ignored for
            none and snappy.
        partition_leader_epoch: the epoch written in every batch header (-1: none).

    Returns:
        A memoryview of the bytes (one buffer, no copy of it is made here: pass it on as it
        is; ``bytes()`` copies it): one v2 batch per run of rows sharing ``base_offset``,
        back to back: baseOffset and lastOffsetDelta from the columns, each record's offset
        delta = its offset minus baseOffset (so a client sees the exact offsets, gaps
        included, although a partial batch holds fewer records than ``lastOffsetDelta +
        1``), producer id, epoch and base sequence of the batch (a record's sequence stays
        baseSequence + its offset delta), the attribute bits from the flag columns,
        baseTimestamp = the first row's timestamp, maxTimestamp = the largest, CRC-32C over
        attributes .. end. A control row's record is its key and value as stored, or, where
        they are null, the ``ControlRecordType`` key (version 0, control_type) and
        ``EndTransactionMarker`` value (version 0, coordinator_epoch). Empty input gives
        an empty view.

    Raises:
        ValueError: an unknown ``compression``; offsets not increasing; a row whose offset
            is below its base_offset, more than 2**31 - 1 above it, or beyond its batch's
            last offset; a control row with neither a key nor a control_type.

    The records are built column-wise, with no Python object per record: each record's
    varints (length, timestamp delta, offset delta, key and value lengths) are computed as
    arrays and written into one buffer of record prefixes (the batch header in front of a
    batch's first record), and Arrow's ``binary_join_element_wise`` then concatenates
    prefix, key, value-length varint, value and headers of every record into one buffer
    (one copy of the keys and values); each batch's CRC-32C is then written in place.
    Only rows with headers are encoded one by one (their header section).
    """
    codec = _COMPRESSION_IDS.get(compression)
    if codec is None:
        raise ValueError(f"unknown compression {compression!r}: Kafka's compression types are "
                         f"{', '.join(COMPRESSION_TYPES)}")
    total = rows.num_rows
    if total == 0:
        return memoryview(b"")

    def numpy(name: str) -> np.ndarray:
        return rows.column(name).to_numpy()

    offsets = numpy("offset").astype(np.int64, copy=False)
    base_offsets = numpy("base_offset").astype(np.int64, copy=False)
    last_deltas = numpy("last_offset_delta").astype(np.int64, copy=False)
    if total > 1 and not (offsets[1:] > offsets[:-1]).all():
        bad = int(np.flatnonzero(offsets[1:] <= offsets[:-1])[0])
        raise ValueError(f"rows are not in offset order: offset {offsets[bad + 1]} follows {offsets[bad]}")
    offset_deltas = offsets - base_offsets
    wrong = (offset_deltas < 0) | (offset_deltas > last_deltas) | (offset_deltas > _INT32_MAX)
    if wrong.any():
        bad = int(np.flatnonzero(wrong)[0])
        raise ValueError(f"offset {offsets[bad]} lies outside its batch [{base_offsets[bad]}, "
                         f"{base_offsets[bad] + last_deltas[bad]}]")
    starts = np.concatenate(([0], np.flatnonzero(base_offsets[1:] != base_offsets[:-1]) + 1))
    counts = np.diff(np.append(starts, total))
    timestamps = numpy("timestamp").astype(np.int64, copy=False)
    first_ts = timestamps[starts]
    take = pa.array(starts)

    def per_batch(name: str) -> np.ndarray:
        return rows.column(name).take(take).to_numpy(zero_copy_only=False)

    control = per_batch("is_control").astype(bool, copy=False)
    keys, values = _one_chunk(rows.column("key")), _one_chunk(rows.column("value"))
    if control.any():
        keys, values = _control_records(rows, keys, values, control, starts, counts, offsets)
    key_lengths, value_lengths = _lengths(keys), _lengths(values)
    header_column = rows.column("headers")
    if header_column.null_count < total:  # the header sections, one by one (Python objects)
        suffix = pa.array([_ZERO if h is None else _encode_headers(h) for h in header_column.to_pylist()],
                          pa.binary())
        suffix_lengths = pc.binary_length(suffix).to_numpy().astype(np.int64)
    else:  # headerCount 0 for every record
        suffix = None
        suffix_lengths = np.ones(total, dtype=np.int64)

    # the varints of every record, and so its size
    ts_z = _zigzag(timestamps - np.repeat(first_ts, counts))
    offset_z = _zigzag(offset_deltas)
    key_z, value_z = _zigzag(key_lengths), _zigzag(value_lengths)
    ts_n, offset_n = _varint_sizes(ts_z, 10), _varint_sizes(offset_z, 5)
    key_n, value_n = _varint_sizes(key_z, 5), _varint_sizes(value_z, 5)
    key_bytes, value_bytes = np.maximum(key_lengths, 0), np.maximum(value_lengths, 0)
    size = 1 + ts_n + offset_n + key_n + key_bytes + value_n + value_bytes + suffix_lengths
    size_z = (size << 1).view(np.uint64)
    size_n = _varint_sizes(size_z, 5)

    # the batch headers (CRC 0 until the records are in place)
    head = np.zeros(len(starts), dtype=_HEADER_DTYPE)
    head["base_offset"] = base_offsets[starts]
    head["batch_length"] = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + np.add.reduceat(size_n + size, starts)
    head["partition_leader_epoch"] = partition_leader_epoch
    head["magic"] = MAGIC_V2
    head["attributes"] = (np.where(per_batch("timestamp_type") == TIMESTAMP_LOG_APPEND_TIME, _TIMESTAMP_TYPE_BIT, 0)
                          | np.where(per_batch("is_transactional"), _TRANSACTIONAL_BIT, 0)
                          | np.where(control, _CONTROL_BIT, 0))
    head["last_offset_delta"] = last_deltas[starts]
    head["base_timestamp"] = first_ts
    head["max_timestamp"] = np.maximum.reduceat(timestamps, starts)
    head["producer_id"] = per_batch("producer_id")
    head["producer_epoch"] = per_batch("producer_epoch")
    head["base_sequence"] = per_batch("base_sequence")
    head["record_count"] = counts

    # each record's prefix: [batch header] length | attributes (0) | timestampDelta | offsetDelta | keyLength
    first = np.zeros(total, dtype=np.int64)
    first[starts] = RECORD_BATCH_OVERHEAD
    prefix_offsets = np.zeros(total + 1, dtype=np.int64)
    np.cumsum(first + size_n + 1 + ts_n + offset_n + key_n, out=prefix_offsets[1:])
    prefix = np.zeros(int(prefix_offsets[-1]), dtype=np.uint8)
    prefix[(prefix_offsets[starts][:, None] + np.arange(RECORD_BATCH_OVERHEAD)).ravel()] = head.view(np.uint8)
    at = prefix_offsets[:-1] + first
    _put_varints(prefix, at, size_z, size_n)
    at = at + size_n + 1
    _put_varints(prefix, at, ts_z, ts_n)
    at += ts_n
    _put_varints(prefix, at, offset_z, offset_n)
    at += offset_n
    _put_varints(prefix, at, key_z, key_n)
    middle_offsets, middle = _varint_column(value_z, value_n)  # valueLength

    out_size = int(prefix_offsets[-1] + key_bytes.sum() + middle_offsets[-1] + value_bytes.sum() + suffix_lengths.sum())
    large = out_size > _INT32_MAX  # beyond an Arrow binary column's int32 offsets
    kind = pa.large_binary() if large else pa.binary()
    if suffix is None:
        suffix = _binary_column(np.arange(total + 1, dtype=np.int64), np.zeros(total, dtype=np.uint8), large)
    parts = [_binary_column(prefix_offsets, prefix, large), keys, _binary_column(middle_offsets, middle, large),
             values, suffix]
    joined = pc.binary_join_element_wise(*[p.cast(kind) if p.type != kind else p for p in parts],
                                         pa.scalar(b"", kind), null_handling="replace", null_replacement="")
    _, offsets_buffer, data = joined.buffers()
    record_offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if large else np.int32)[
        joined.offset:joined.offset + total + 1]
    begin, end = int(record_offsets[0]), int(record_offsets[-1])
    assert end - begin == out_size, (end - begin, out_size)
    out = memoryview(data)[begin:end]
    if out.readonly:  # Arrow allocates a kernel's output mutable; should that change, copy once
        out = memoryview(bytearray(out))
    positions = (record_offsets[starts] - begin).tolist()
    limits = positions[1:] + [out_size]
    pack_crc = _CRC.pack_into
    for pos, limit in zip(positions, limits):
        pack_crc(out, pos + _CRC_OFFSET, _crc32c(out[pos + _ATTRIBUTES_OFFSET:limit]))
    if not codec:
        return out

    pieces: list = []
    for b, (pos, limit) in enumerate(zip(positions, limits)):
        if control[b]:  # markers are never compressed
            pieces.append(out[pos:limit])
            continue
        body = _compress(codec, bytes(out[pos + RECORD_BATCH_OVERHEAD:limit]), compression_level)
        header = bytearray(out[pos:pos + RECORD_BATCH_OVERHEAD])
        _INT32.pack_into(header, LOG_OVERHEAD - 4, RECORD_BATCH_OVERHEAD - LOG_OVERHEAD + len(body))
        header[_ATTRIBUTES_OFFSET + 1] |= codec
        pack_crc(header, _CRC_OFFSET, _crc32c(body, _crc32c(header[_ATTRIBUTES_OFFSET:])))
        pieces.append(header)
        pieces.append(body)
    return memoryview(b"".join(pieces))
