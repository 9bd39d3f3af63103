"""Record-batch codec benchmark: formats/record_batch.py against kafka-python's own record
codec (kafka.record: MemoryRecords / DefaultRecordBatch, pure Python) on the same data.

Run:  .venv/bin/python benchmarks/bench_record_batch.py [--records 20000] [--repeat 5]

For each record size (1 KB and 100 B values, 16-byte keys, no headers), batch size (16 KiB,
the Java producer's default ``batch.size``, and 1 MiB) and compression (none, lz4, zstd):

* decode: a Produce request's records field, one batch at a time -> ours
  ``decode_batches`` (header + PAYLOAD_SCHEMA table) vs kafka-python reading every
  record's offset, timestamp, key, value and headers;
* encode: the log's RECORD_SCHEMA rows -> a Fetch response's records: ours
  ``encode_batches`` on the table vs kafka-python's ``MemoryRecordsBuilder`` appending
  the same records (as Python objects) batch by batch.

Values are random hex digits (4 bits of entropy a byte: compressible about 2x). Prints
records/s and MB/s (of values) of ours and the ratio ours/kafka-python (> 1: ours faster).
The server's goal is >= 50 MB/s of 1 KB records on 2 cores, i.e. ~50 000 records/s through
each direction, besides everything else it does. kafka-python's snappy/lz4/zstd run on
cramjam here (its usual libraries are not installed), as ours do.
"""

from __future__ import annotations

import argparse
import os
import sys

import cramjam
import kafka.codec
import numpy as np
import pyarrow as pa
from kafka.record import default_records
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

sys.path.insert(0, os.path.dirname(__file__))
from common import interleaved, machine  # noqa: E402

from txlake.formats.record_batch import COMPRESSION_TYPES, decode_batches, encode_batches  # noqa: E402
from txlake.formats.records import RECORD_SCHEMA  # noqa: E402


def _kafka_python_over_cramjam() -> None:
    """kafka-python's codecs for snappy/lz4/zstd, which import libraries not installed here."""

    class Snappy:
        compress = staticmethod(lambda data: bytes(cramjam.snappy.compress_raw(bytes(data))))
        decompress = staticmethod(lambda data: bytes(cramjam.snappy.decompress_raw(bytes(data))))

    def lz4_encode(data):  # python-lz4's lz4.frame.compress: fast mode, independent blocks
        compressor = cramjam.lz4.Compressor(level=0, block_linked=False)
        compressor.compress(bytes(data))
        return bytes(compressor.finish())

    kafka.codec.snappy = Snappy
    kafka.codec.has_snappy = kafka.codec.has_lz4 = kafka.codec.has_zstd = lambda: True
    default_records.lz4_encode = lz4_encode
    default_records.lz4_decode = lambda data: bytes(cramjam.lz4.decompress(bytes(data)))
    default_records.zstd_encode = lambda data: bytes(cramjam.zstd.compress(bytes(data), level=3))
    default_records.zstd_decode = lambda data: bytes(cramjam.zstd.decompress(bytes(data)))


def make_records(n: int, value_bytes: int, seed: int = 7) -> tuple[list, list, list]:
    rng = np.random.default_rng(seed)
    hexdigits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    raw = hexdigits[rng.integers(0, 16, size=n * value_bytes)].tobytes()
    values = [raw[i * value_bytes:(i + 1) * value_bytes] for i in range(n)]
    keys = [b"key-%012d" % (i % 1000) for i in range(n)]
    timestamps = (1_700_000_000_000 + np.arange(n) // 10).tolist()
    return timestamps, keys, values


def produce_batches(timestamps, keys, values, per_batch: int, codec: int) -> list[bytes]:
    """The records as a producer sends them: kafka-python-built v2 batches (idempotent producer)."""
    out = []
    for start in range(0, len(values), per_batch):
        builder = MemoryRecordsBuilder(magic=2, compression_type=codec, batch_size=1 << 30, producer_id=1000,
                                       producer_epoch=0, base_sequence=start)
        for i in range(start, min(start + per_batch, len(values))):
            builder.append(timestamp=timestamps[i], key=keys[i], value=values[i], headers=[])
        builder.close()
        out.append(bytes(builder.buffer()))
    return out


def log_rows(timestamps, keys, values, per_batch: int) -> pa.Table:
    """The same records as the log holds them (RECORD_SCHEMA, one batch per ``per_batch`` rows)."""
    n = len(values)
    offsets = np.arange(n, dtype=np.int64)
    base = offsets - offsets % per_batch
    last = np.minimum(base + per_batch, n) - 1 - base
    return pa.table({
        "topic": pa.array(["bench"] * n, pa.string()), "partition": pa.array(np.zeros(n, np.int32)),
        "offset": offsets, "timestamp": pa.array(timestamps, pa.int64()),
        "timestamp_type": pa.array(np.zeros(n, np.int8)), "key": pa.array(keys, pa.binary()),
        "value": pa.array(values, pa.binary()), "headers": pa.nulls(n, RECORD_SCHEMA.field("headers").type),
        "producer_id": pa.array(np.full(n, 1000, np.int64)), "producer_epoch": pa.array(np.zeros(n, np.int16)),
        "base_sequence": pa.array(base.astype(np.int32)), "base_offset": base,
        "last_offset_delta": pa.array(last.astype(np.int32)), "is_transactional": pa.array(np.zeros(n, bool)),
        "is_control": pa.array(np.zeros(n, bool)), "control_type": pa.nulls(n, pa.int16()),
        "coordinator_epoch": pa.nulls(n, pa.int32()),
    }, schema=RECORD_SCHEMA)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000, help="records per case (100 B cases use 5x)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    _kafka_python_over_cramjam()
    print(f"record-batch codec vs kafka-python's record codec -- {machine()}")
    print(f"{'case':<34} {'direction':<7} {'ours rec/s':>11} {'ours MB/s':>9} {'kp rec/s':>10} {'ratio':>6}")
    for value_bytes, n in ((1000, args.records), (100, args.records * 5)):
        timestamps, keys, values = make_records(n, value_bytes)
        for batch_bytes in (16 * 1024, 1024 * 1024):
            per_batch = max(1, batch_bytes // (value_bytes + 30))
            rows = log_rows(timestamps, keys, values, per_batch)
            for compression in ("none", "lz4", "zstd"):
                codec = COMPRESSION_TYPES.index(compression)
                wire = produce_batches(timestamps, keys, values, per_batch, codec)

                def ours_decode():
                    for data in wire:
                        decode_batches(data, topic="bench", partition=0)

                def kp_decode():
                    for data in wire:
                        records = MemoryRecords(data)
                        while records.has_next():
                            [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records.next_batch()]

                def ours_encode():
                    encode_batches(rows, compression=compression)

                def kp_encode():
                    for start in range(0, n, per_batch):
                        builder = MemoryRecordsBuilder(magic=2, compression_type=codec, batch_size=1 << 30,
                                                       producer_id=1000, producer_epoch=0, base_sequence=start)
                        for i in range(start, min(start + per_batch, n)):
                            builder.append(timestamp=timestamps[i], key=keys[i], value=values[i], headers=[])
                        builder.close()
                        builder.buffer()

                case = f"{value_bytes} B values, {batch_bytes // 1024} KiB batches, {compression}"
                times = interleaved({"od": ours_decode, "kd": kp_decode, "oe": ours_encode, "ke": kp_encode},
                                    repeat=args.repeat)
                for direction, ours, theirs in (("decode", "od", "kd"), ("encode", "oe", "ke")):
                    o, k = min(times[ours]), min(times[theirs])
                    print(f"{case:<34} {direction:<7} {n / o:>11,.0f} {n * value_bytes / o / 1e6:>9.1f} "
                          f"{n / k:>10,.0f} {k / o:>6.2f}")
                    sys.stdout.flush()


if __name__ == "__main__":
    main()
