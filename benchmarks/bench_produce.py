"""Produce benchmarks: bulk load vs pyarrow.parquet.write_table, per-record produce() rate,
object PUTs per flush, and peak memory of a streamed bulk load.

Run:  .venv/bin/python benchmarks/bench_produce.py [--records 1000000] [--repeat 3]
      .venv/bin/python benchmarks/bench_produce.py --bulk-only --served   # the ratios alone
      .venv/bin/python benchmarks/bench_produce.py --bounds               # what bounds the bulk load
                                                                          # (and what-if loads)

``--served`` adds the same records produced through ``txlake serve`` by confluent-kafka
(idempotent, acks=all; default requests and bigger ones), against ``write_table`` of the same
table timed beside each run.

Ratios are "raw tool time / txlake time" on the same data in the same run (1.0 = as fast
as the raw tool; the goals are >= 0.5 for the bulk load).
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(__file__))
from common import best, fresh_root, machine, records_table, root_path, scratch_dir  # noqa: E402

from txlake import AdminClient, NewTopic, Producer  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402
from txlake.formats.records import encode_segments, read_segment  # noqa: E402
from txlake.producer import _partition_keys  # noqa: E402


def create(url: str, topic: str, partitions: int) -> None:
    with AdminClient({"storage.url": url}) as admin:
        admin.create_topics([NewTopic(topic, partitions)])[topic].result()


def bench_served(n: int, results: dict, repeat: int = 1) -> None:
    """Bulk produce through ``txlake serve``: confluent-kafka sends the records of
    ``records_table(n)`` (idempotent, acks=all, round-robin over 8 partitions) until the last
    delivery report, with librdkafka's default requests and with bigger ones; each run beside
    a ``write_table`` of the same table. Best of ``repeat``; the server's CPU s per run too."""
    from bench_server import BIG_REQUESTS, bench_produce_wire, cpu_seconds, start_server
    from bench_server import create as create_served

    table = records_table(n)
    keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
    folder = scratch_dir("txlake-bench-raw-")  # removed at exit (600 MB of raw files per run)
    for name, extra in (("served", {}), ("served_big_requests", BIG_REQUESTS)):
        raw, wire, cpu = [], [], []
        for i in range(repeat):
            start = time.perf_counter()
            pq.write_table(table, os.path.join(folder, f"raw-{name}{i}.parquet"))
            raw.append(time.perf_counter() - start)
            url = fresh_root()
            create_served(url, 8)
            proc, bootstrap = start_server(url, [])
            try:
                cpu0 = cpu_seconds(proc.pid)
                wire.append(bench_produce_wire(bootstrap, keys, values, 8, **extra))
                cpu.append(cpu_seconds(proc.pid) - cpu0)
            finally:
                proc.terminate()
                proc.wait(60)
        results[f"{name}_s"] = min(wire)
        results[f"{name}_ratio"] = min(raw) / min(wire)
        results[f"{name}_server_cpu_s"] = min(cpu)


def bench_bulk(n: int, results: dict, repeat: int = 3) -> None:
    """Best of ``repeat`` runs each: raw write_table (with and without fsync) vs produce_arrow,
    after one untimed warm-up round; each round runs the three side by side, so the median of
    the rounds' own ratios (``bulk_ratio_median``) compares them under the same load. Both
    sides' files stay until the process exits (as a real load's do: the page cache fills up
    alike). Also the
    process CPU seconds (user + system, median) of the raw write and of the load: on a machine
    shared with other work the wall times swing with the load, the CPU less."""
    table = records_table(n)
    folder = scratch_dir("txlake-bench-raw-")  # removed at exit (600 MB of raw files per run)
    raw, raw_fsync, lake, raw_cpu, lake_cpu = [], [], [], [], []
    for i in range(repeat + 1):
        cpu0, start = os.times(), time.perf_counter()
        pq.write_table(table, os.path.join(folder, f"raw{i}.parquet"))
        raw.append(time.perf_counter() - start)
        raw_cpu.append(_cpu_since(cpu0))
        # the same, made durable as txlake's acks=all commit is (fsync before answering)
        start = time.perf_counter()
        with open(os.path.join(folder, f"raw-fsync{i}.parquet"), "wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        raw_fsync.append(time.perf_counter() - start)
        url = fresh_root()
        create(url, "bulk", 8)
        p = Producer({"storage.url": url})
        cpu0, start = os.times(), time.perf_counter()
        r = p.produce_arrow("bulk", table)
        lake.append(time.perf_counter() - start)
        lake_cpu.append(_cpu_since(cpu0))
        assert r.records == n
        p.close()
        close_all()
        if i == 0:  # the warm-up round
            raw, raw_fsync, lake, raw_cpu, lake_cpu = [], [], [], [], []
    results["raw_write_table_s"] = min(raw)
    results["raw_write_table_fsync_s"] = min(raw_fsync)
    results["txlake_bulk_s"] = min(lake)
    results["bulk_ratio"] = results["raw_write_table_s"] / results["txlake_bulk_s"]
    results["bulk_ratio_vs_fsync"] = results["raw_write_table_fsync_s"] / results["txlake_bulk_s"]
    results["bulk_ratios_each_run"] = " ".join(f"{r / t:.2f}" for r, t in zip(raw, lake))
    results["bulk_ratio_median"] = statistics.median(r / t for r, t in zip(raw, lake))
    results["raw_write_table_cpu_s"] = statistics.median(raw_cpu)
    results["txlake_bulk_cpu_s"] = statistics.median(lake_cpu)
    results["bulk_cpu_ratio"] = results["raw_write_table_cpu_s"] / results["txlake_bulk_cpu_s"]


def bench_bounds(n: int, results: dict, repeat: int = 5) -> None:
    """What bounds the bulk load on this machine, each figure against the raw tool in the same
    run (:func:`_encode_bounds`, :func:`_two_thread_speedups`, :func:`_what_if_loads`)."""
    table = records_table(n)
    url = fresh_root()
    create(url, "bulk", 8)
    p = Producer({"storage.url": url})
    p.produce_arrow("bulk", table)
    p.close()
    close_all()
    # the load's records as its objects hold them (17 columns), in one table
    paths = sorted(glob.glob(os.path.join(root_path(url), "data", "*.parquet")))
    segment = pa.concat_tables(read_segment(path, path) for path in paths).combine_chunks()
    assert segment.num_rows == n
    _encode_bounds(table, segment, results, repeat)
    _two_thread_speedups(segment, results, repeat)
    del segment
    _what_if_loads(table, results, repeat)


def _encode(segment: pa.Table, row_group_rows: int) -> None:
    encode_segments([segment], row_group_rows=row_group_rows, as_buffer=True)


def _encode_bounds(table: pa.Table, segment: pa.Table, results: dict, repeat: int) -> None:
    """``object_encode_vs_write_table``: the CPU time (one thread, best of ``repeat`` after a
    warm-up, into memory) of ``write_table`` of the load's table (key, value) against encoding
    the same records as a segment object -- in one row group, and in the 16 Ki-row groups of a
    load's flushes."""
    def cpu_best(fn) -> float:
        return best(fn, repeat, warmup=True, clock=time.thread_time)

    raw = cpu_best(lambda: pq.write_table(table, pa.BufferOutputStream()))
    one = cpu_best(lambda: _encode(segment, segment.num_rows))
    small = cpu_best(lambda: _encode(segment, 16_384))
    results["write_table_cpu_ms"] = raw * 1000
    results["object_encode_cpu_ms"] = one * 1000
    results["object_encode_16k_groups_cpu_ms"] = small * 1000
    results["object_encode_vs_write_table"] = raw / one
    results["object_encode_16k_groups_vs_write_table"] = raw / small


def _two_thread_speedups(segment: pa.Table, results: dict, repeat: int) -> None:
    """``copy_two_threads_speedup_*`` and ``encode_two_threads_speedup_*``: how much faster two
    threads do the same work side by side than one after the other -- four 64 MB copies each;
    the two halves of the segment object encoded -- in each of ``repeat`` rounds (after a
    warm-up) and their median. 2.0 is two full cores."""
    sources = [np.ones(64 << 20, np.uint8) for _ in range(2)]
    targets = [np.empty_like(a) for a in sources]
    half = segment.num_rows // 2
    halves = [segment.slice(0, half), segment.slice(half)]
    work = {"copy": lambda i: [np.copyto(targets[i], sources[i]) for _ in range(4)],
            "encode": lambda i: _encode(halves[i], 16_384)}
    for name, fn in work.items():
        speedups = []
        for _ in range(repeat + 1):
            start = time.perf_counter()
            fn(0)
            fn(1)
            serial = time.perf_counter() - start
            threads = [threading.Thread(target=fn, args=(i,)) for i in (0, 1)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            speedups.append(serial / (time.perf_counter() - start))
        results[f"{name}_two_threads_speedup_median"] = statistics.median(speedups[1:])
        results[f"{name}_two_threads_speedups_each"] = " ".join(f"{x:.2f}" for x in speedups[1:])


#: the columns a flush object keeps in the what-if of :func:`_flushes_without_batch_columns`
RECORD_COLUMNS = ("offset", "timestamp", "key", "value", "headers")


@contextmanager
def _flushes_without_batch_columns():
    """A what-if, not a format: while inside, the flushers build and encode only the record
    columns (:data:`RECORD_COLUMNS`; offsets as today, the segment writer's encodings), as a
    layout that kept the batch fields once per batch instead of once per row would. The objects
    written are not readable by txlake; the benchmark only times the load."""
    import txlake.engine.group_commit as group_commit
    from txlake.formats.records import RECORD_SCHEMA, STATISTICS_COLUMNS, STAMPED_SCHEMA

    schema = pa.schema([RECORD_SCHEMA.field(name) for name in RECORD_COLUMNS]).with_metadata(STAMPED_SCHEMA.metadata)

    def record_table(topic, partition, pending):
        payload = pa.concat_tables([q.batch.records for q in pending])
        lengths = np.array([q.batch.records.num_rows for q in pending], dtype=np.int64)
        starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
        base_offsets = np.repeat(np.array([q.base_offset for q in pending], dtype=np.int64), lengths)
        offsets = base_offsets + (np.arange(int(lengths.sum()), dtype=np.int64) - starts)
        return pa.Table.from_arrays([pa.array(offsets)] + [payload.column(name) for name in RECORD_COLUMNS[1:]],
                                    schema=schema)

    def encode_segments(tables, compression, row_group_rows, as_buffer, target):
        sink = pa.FixedSizeBufferWriter(target)
        ranges, first = [], 0
        with pq.ParquetWriter(sink, schema, compression=compression,
                              use_dictionary=[n for n in RECORD_COLUMNS if n not in ("value", "offset")],
                              column_encoding={"offset": "DELTA_BINARY_PACKED"}, write_batch_size=65_536,
                              write_statistics=[n for n in STATISTICS_COLUMNS if n in RECORD_COLUMNS]) as writer:
            for table in tables:
                writer.write_table(table, row_group_size=row_group_rows)
                count = -(-table.num_rows // row_group_rows)
                ranges.append((first, count))
                first += count
        return target.slice(0, sink.tell()), ranges

    saved = group_commit.record_table, group_commit.encode_segments
    group_commit.record_table, group_commit.encode_segments = record_table, encode_segments
    try:
        yield
    finally:
        group_commit.record_table, group_commit.encode_segments = saved


def _what_if_loads(table: pa.Table, results: dict, repeat: int) -> None:
    """Four loads of the same records, each against ``write_table`` timed just before it, in
    ``repeat`` rounds (after a warm-up) that run all four in turn (as :func:`bench_bulk`):

    * ``keyed``: the load as it is (the partitioner places the keys; the split copies);
    * ``presorted``: the records already grouped by partition (``partition=`` a column): no
      split copy, whole partitions per run of batches -- what the load reaches if the split
      cost nothing;
    * ``keyed_no_batch_columns`` and ``presorted_no_batch_columns``: the same two with flush
      objects of the record columns only (:func:`_flushes_without_batch_columns`).

    Reports each one's median ratio (``<load>_ratio_median``), the rounds' ratios and its best
    wall time (s)."""
    parts = _partition_keys(table.column("key").combine_chunks(), 8, 0)
    order = np.argsort(parts, kind="stable")
    grouped = table.take(pa.array(order)).append_column("p", pa.array(parts[order]))
    loads = {"keyed": (table, {}, False), "presorted": (grouped, {"partition": "p"}, False),
             "keyed_no_batch_columns": (table, {}, True),
             "presorted_no_batch_columns": (grouped, {"partition": "p"}, True)}
    folder = scratch_dir("txlake-bench-raw-")
    ratios: dict[str, list[float]] = {name: [] for name in loads}
    walls: dict[str, list[float]] = {name: [] for name in loads}
    for i in range(repeat + 1):
        for name, (data, kwargs, without) in loads.items():
            start = time.perf_counter()
            pq.write_table(table, os.path.join(folder, f"raw-{name}{i}.parquet"))
            raw_s = time.perf_counter() - start
            url = fresh_root()
            create(url, "bulk", 8)
            p = Producer({"storage.url": url})
            with _flushes_without_batch_columns() if without else nullcontext():
                start = time.perf_counter()
                p.produce_arrow("bulk", data, **kwargs)
                lake_s = time.perf_counter() - start
                p.close()
            close_all()
            if i:  # the first round warms up
                ratios[name].append(raw_s / lake_s)
                walls[name].append(lake_s)
    for name in loads:
        results[f"{name}_ratio_median"] = statistics.median(ratios[name])
        results[f"{name}_ratios_each"] = " ".join(f"{r:.2f}" for r in ratios[name])
        results[f"{name}_best_s"] = min(walls[name])


def _cpu_since(before) -> float:
    """User + system CPU seconds of this process (all threads) since ``os.times()`` ``before``."""
    now = os.times()
    return now.user - before.user + now.system - before.system


def bench_per_record(n: int, results: dict) -> None:
    url = fresh_root()
    create(url, "rec", 8)
    p = Producer({"storage.url": url, "queue.buffering.max.messages": 2_000_000})
    value = b"x" * 100
    keys = [b"key-%d" % i for i in range(1000)]
    start = time.perf_counter()
    for i in range(n):
        p.produce("rec", value, keys[i % 1000])
    produce_s = time.perf_counter() - start
    assert p.flush(120) == 0
    total_s = time.perf_counter() - start
    p.close()
    close_all()
    results["produce_calls_per_s"] = n / produce_s
    results["produce_delivered_per_s"] = n / total_s


def bench_puts(results: dict) -> None:
    from txlake.catalog.storage import ObjectStore
    from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
    from txlake.formats.records import PAYLOAD_SCHEMA

    for partitions in (1, 64):
        store = ObjectStore(fresh_root())
        broker = Broker(store, BrokerConfig(flush_linger_ms=100))
        broker.create_topics([("t", partitions, {})])
        _, pid, _ = broker.init_producer_id()
        puts = []
        real_put, real_pia = store.put, store.put_if_absent
        store.put = lambda k, d: (puts.append(k), real_put(k, d))[1]
        store.put_if_absent = lambda k, d: (puts.append(k), real_pia(k, d))[1]
        flushes = 5
        for f in range(flushes):
            payload = pa.table({"timestamp": [1] * 10, "key": [b"k"] * 10, "value": [b"v"] * 10,
                                "headers": pa.nulls(10, PAYLOAD_SCHEMA.field("headers").type)}, schema=PAYLOAD_SCHEMA)
            futs = broker.produce_async([ProduceBatch("t", p, payload, pid, 0, f * 10) for p in range(partitions)])
            [fu.result() for fu in futs]
        store.put, store.put_if_absent = real_put, real_pia
        counted = [k for k in puts if not k.startswith("_catalog/leases/")]
        results[f"puts_per_flush_{partitions}_partitions"] = len(counted) / flushes
        broker.close()


def bench_memory(n: int, results: dict, suffix: str = "") -> None:
    """Peak RSS of a streamed bulk load of ``n`` records, in a fresh process, vs the data size."""
    code = f"""
import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
from common import records_table, fresh_root, peak_rss_mb
from txlake import AdminClient, NewTopic, Producer
import pyarrow as pa
url = fresh_root()
AdminClient({{"storage.url": url}}).create_topics([NewTopic("m", 8)])["m"].result()
base = peak_rss_mb()
def chunks():
    for i in range({n} // 100_000):
        yield from records_table(100_000, seed=i).to_batches()
p = Producer({{"storage.url": url}})
p.produce_arrow("m", chunks())
p.close()
print(base, peak_rss_mb())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    base, peak = float(out[0]), float(out[1])
    results[f"stream_load_data_mb{suffix}"] = n * 100 / 2**20
    results[f"stream_load_rss_before_mb{suffix}"] = base
    results[f"stream_load_peak_rss_mb{suffix}"] = peak


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of the bulk load (best is reported)")
    ap.add_argument("--bulk-only", action="store_true", help="only the bulk-load ratios")
    ap.add_argument("--served", action="store_true", help="also produce through txlake serve")
    ap.add_argument("--bounds", action="store_true", help="only what bounds the bulk load (bench_bounds)")
    ap.add_argument("--memory-pool", choices=("default", "mimalloc", "jemalloc", "system"), default="default",
                    help="the process's Arrow memory pool (txlake.engine.memory.use_memory_pool, as "
                         "`txlake serve --memory-pool`)")
    ap.add_argument("--decay-ms", type=int, default=1000, help="jemalloc's decay time (ms) with --memory-pool jemalloc")
    args = ap.parse_args()
    if args.memory_pool != "default":
        from txlake.engine.memory import use_memory_pool

        use_memory_pool(args.memory_pool, args.decay_ms)
    results: dict = {}
    if args.bounds:
        bench_bounds(args.records, results, args.repeat)
    else:
        bench_bulk(args.records, results, args.repeat)
    if args.served:
        bench_served(args.records, results)
    if not args.bulk_only and not args.bounds:
        bench_per_record(args.records, results)
        bench_puts(results)
        for factor in (3, 6):
            bench_memory(args.records * factor, results, suffix=f"_{factor}x")
    print(f"# produce benchmarks ({args.records:,} records, 100-byte values; {machine()}; Arrow memory pool "
          f"{pa.default_memory_pool().backend_name}; load average {os.getloadavg()[0]:.1f} at the end)")
    for k, v in results.items():
        print(f"{k:36s} {v:12.3f}" if isinstance(v, float) else f"{k:36s} {v}")


if __name__ == "__main__":
    main()
