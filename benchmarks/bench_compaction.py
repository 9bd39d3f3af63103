"""Compaction benchmarks (issue "Compaction engine"): throughput of ``compact()`` against a raw
pyarrow read + rewrite of the same objects, and DuckDB / Spark scans of a topic before and after
its small flush objects are merged. (The day-long object count is bench_compaction_day.py.)

Run:  .venv/bin/python benchmarks/bench_compaction.py [--flushes 500] [--records-per-flush 600]
          [--partitions 8] [--keys 10000] [--runs 3] [--only merge|key|scan]

* **merge** (``cleanup.policy=delete``, a pure small-file merge): ``--flushes`` flush objects of
  ``--records-per-flush`` 1 KB records (random bytes, string keys, Kafka's default partitioner
  over ``--partitions`` partitions), each produced by ``Producer.produce_arrow`` + the flush it
  ends with (``storage.flush.linger.ms`` is 60 s, so each call is exactly one flush object).
  ``compact(broker, [topic])`` merges them into one segment per partition. Baseline ("raw"):
  ``pq.ParquetFile(path).read()`` of exactly the objects the topic's segments name, concatenated,
  + ``pq.write_table`` of each partition's rows (``partition`` filter, in offset order) into its
  own file, with the engine's settings: same compression, same rows per row group
  (``rewrite_segments``' formula), same dictionary and statistics columns (``encode_segments``).
  "raw_read_table" is the same with ``pq.read_table(paths)`` (pyarrow's datasets layer), which is
  slower here, so "raw" is the stricter baseline. The engine fsyncs every object it writes (the
  baseline does not), so the baseline is also reported with an ``fsync`` of its files.
* **key** (``cleanup.policy=compact``, key compaction): the same log with ``--keys`` distinct keys
  (each key's records land in one partition), so most records are superseded. ``compact()`` runs
  key compaction (offset map over the key columns, then the rewrite of the survivors) and the
  merge. Baselines: the same raw read + rewrite of all rows, and a raw read + "latest record per
  key" (pyarrow ``group_by(key).max(offset)``) + rewrite of the survivors.
* Throughput = bytes of the input objects / wall time; ratio = raw time / compaction time (goal
  >= 0.7). Each measurement runs in a child process (its own interpreter: timing covers only
  the operation, and VmHWM is the peak RSS of that process alone; the RSS before the operation
  is reported too). Compaction runs on a fresh copy of the built root (synced to disk first);
  the broker is opened and the writer lease taken before the clock starts. One warm-up round,
  then ``--runs`` rounds, raw and compaction interleaved (order alternating); medians reported.
* **scan**: ``--scan-flushes`` flushes (default 1 000) of ``--scan-records-per-flush`` 1 KB records
  over ``--scan-partitions`` partitions; the root is copied and the copy compacted; then
  ``SELECT count(*), sum(octet_length(value)) FROM topic`` on ``txlake.duckdb.connect(url)`` views and
  ``spark.read.format("txlake")`` + the same aggregate (bench_spark.py's SparkSession) are timed
  on both roots, interleaved, one warm-up each; medians of ``--runs`` (results checked equal).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import (copy_root, fresh_root, machine, peak_rss_mb, records_table, remove_root, root_path,  # noqa: E402
                    rss_mb, run_child)

VALUE_BYTES = 1000  # 1 KB records
#: engine settings of every root here: one flush object per produce_arrow call, no background rounds
ENGINE = {"storage.flush.linger.ms": 60_000, "storage.compaction.interval.ms": 0, "storage.lease.ms": 60_000}


# ------------------------------------------------------------------ building a log
def build_log(url: str, topic: str, policy: str, flushes: int, per_flush: int, partitions: int, keys: int,
              seed: int = 1) -> None:
    """Create ``topic`` (``cleanup.policy=policy``) and fill it with ``flushes`` flush objects."""
    from txlake import AdminClient, NewTopic, Producer
    from txlake.engine.registry import close_all

    conf = {"storage.url": url, **ENGINE}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(topic, partitions, config={"cleanup.policy": policy})])[topic].result()
    p = Producer(conf)
    for f in range(flushes):
        p.produce_arrow(topic, records_table(per_flush, VALUE_BYTES, seed=seed * 1_000_003 + f, keys=keys))
    p.close()
    close_all()


def topic_objects(url: str, topic: str) -> dict:
    """The data objects ``topic``'s segments name: local paths, total bytes, segments, records."""
    from txlake.catalog.catalog import Catalog
    from txlake.catalog.storage import ObjectStore

    state = Catalog.open(ObjectStore(url)).state
    segs = [s for p in state.topics[topic].partitions for s in p.segments]
    paths = sorted({s.path for s in segs})
    files = [os.path.join(root_path(url), p) for p in paths]
    return {"files": files, "bytes": sum(os.path.getsize(f) for f in files), "segments": len(segs),
            "records": sum(s.record_count for s in segs), "partitions": len(state.topics[topic].partitions)}


# ------------------------------------------------------------------ the measurements (child processes)
def child_raw(spec: dict) -> dict:
    """Baseline: read the objects (``pq.ParquetFile(path).read()`` each, or ``pq.read_table(paths)``),
    one ``pq.write_table`` per partition (engine settings)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from txlake.engine.requests import BrokerConfig
    from txlake.engine.segment_merge import ROW_GROUP_BYTES
    from txlake.formats.records import RECORD_SCHEMA

    engine = BrokerConfig()
    dictionary_columns = [n for n in RECORD_SCHEMA.names if n != "value"]  # as encode_segments
    stats_columns = [n for n in RECORD_SCHEMA.names if n not in ("value", "headers")]
    out = spec["out"]
    rss0 = rss_mb()
    start = time.perf_counter()
    if spec.get("reader") == "read_table":  # through pyarrow's datasets layer
        table = pq.read_table(spec["files"])
    else:  # each object on its own: the leanest pyarrow read
        table = pa.concat_tables([pq.ParquetFile(f).read() for f in spec["files"]])
    read_s = time.perf_counter() - start
    written, paths = 0, []
    for p in range(spec["partitions"]):
        t = table.filter(pc.equal(table.column("partition"), p))
        if spec.get("dedup"):  # keep each key's latest record
            latest = (pa.table({"key": t.column("key"), "offset": t.column("offset")})
                      .group_by("key", use_threads=False).aggregate([("offset", "max")]))
            t = t.filter(pc.is_in(t.column("offset"), latest.column("offset_max")))
        offsets = t.column("offset").to_numpy()
        assert len(offsets) < 2 or bool((np.diff(offsets) > 0).all()), "rows in offset order"
        rows_per_group = max(1, min(engine.row_group_rows, int(ROW_GROUP_BYTES * t.num_rows // max(t.nbytes, 1))))
        path = os.path.join(out, f"{p}.parquet")
        pq.write_table(t, path, compression=engine.compression, row_group_size=rows_per_group,
                       use_dictionary=dictionary_columns, write_statistics=stats_columns)
        written += t.num_rows
        paths.append(path)
    took = time.perf_counter() - start
    for path in paths:  # the engine fsyncs each object it writes: the durable equivalent
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    took_fsync = time.perf_counter() - start
    return {"s": took, "s_fsync": took_fsync, "read_s": read_s, "rows_out": written,
            "bytes_out": sum(os.path.getsize(x) for x in paths), "rss_before_mb": rss0, "peak_rss_mb": peak_rss_mb()}


def child_compact(spec: dict) -> dict:
    """``compact(broker, [topic])`` on the root (the broker opened and the lease taken first)."""
    from txlake.config import parse_config
    from txlake.engine.compaction import compact
    from txlake.engine.registry import acquire_broker, close_all

    cfg = parse_config({"storage.url": spec["url"], **ENGINE}, "admin")
    broker = acquire_broker(cfg.storage_url, cfg.storage_options, cfg.broker_config())
    broker.ensure_writer()
    phase_end: dict[str, float] = {}

    def progress(phase: str, done: int, total: int) -> None:
        phase_end[phase] = time.perf_counter()

    profile = spec.get("cprofile")
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    rss0 = rss_mb()
    start = time.perf_counter()
    summary = compact(broker, [spec["topic"]], progress=progress)
    took = time.perf_counter() - start
    if profile:
        prof.disable()
        prof.dump_stats(profile)
    peak = peak_rss_mb()
    close_all()
    phases, last = {}, start
    for phase in ("retention", "key compaction", "merge", "cleaning"):
        if phase in phase_end:
            phases[phase] = phase_end[phase] - last
            last = phase_end[phase]
    return {"s": took, "phases": phases, "summary": summary.__dict__, "rss_before_mb": rss0, "peak_rss_mb": peak}


# ------------------------------------------------------------------ throughput
def bench_throughput(args, kind: str, results: dict) -> None:
    topic, policy = ("m", "delete") if kind == "merge" else ("k", "compact")
    url = fresh_root()
    start = time.perf_counter()
    build_log(url, topic, policy, args.flushes, args.records_per_flush, args.partitions, args.keys,
              seed=1 if kind == "merge" else 2)
    os.sync()
    info = topic_objects(url, topic)
    print(f"# {kind}: built {info['records']:,} records, {len(info['files'])} objects, {info['segments']} segments, "
          f"{info['bytes'] / 1e6:.1f} MB in {time.perf_counter() - start:.1f} s", flush=True)
    baselines = ["raw"] + (["raw_dedup"] if kind == "key" else ["raw_read_table"])
    runs: dict[str, list[dict]] = {name: [] for name in ["compact", *baselines]}
    script = os.path.abspath(__file__)
    for r in range(args.runs + 1):  # round 0 is the warm-up
        order = ["compact", *baselines] if r % 2 else [*baselines, "compact"]
        for name in order:
            if name == "compact":
                copy = copy_root(url)
                try:
                    res = run_child(script, {"kind": "compact", "url": copy, "topic": topic})
                finally:
                    remove_root(copy)
                s = res["summary"]
                assert s["objects_before"] == len(info["files"]) and s["records_before"] == info["records"], s
                if kind == "merge":
                    assert s["records_after"] == info["records"] and s["segments_after"] == info["partitions"], s
                else:
                    assert s["key_compacted_partitions"] == info["partitions"], s
            else:
                out = tempfile.mkdtemp(prefix="txlake-bench-raw-")
                try:
                    res = run_child(script, {"kind": "raw", "files": info["files"], "out": out,
                                             "partitions": info["partitions"], "dedup": name == "raw_dedup",
                                             "reader": "read_table" if name == "raw_read_table" else "file"})
                finally:
                    shutil.rmtree(out, True)
                if name != "raw_dedup":
                    assert res["rows_out"] == info["records"], res
            tag = "warm-up" if r == 0 else f"run {r}"
            print(f"#   {tag:8s} {name:10s} {res['s']:7.2f} s  peak RSS {res['peak_rss_mb']:6.0f} MB"
                  + (f"  phases {json.dumps({k: round(v, 2) for k, v in res['phases'].items()})}"
                     if "phases" in res else f"  (+fsync {res['s_fsync']:.2f} s, read {res['read_s']:.2f} s)"),
                  flush=True)
            if r:
                runs[name].append(res)
    remove_root(url)

    mb = info["bytes"] / 1e6
    med = {name: statistics.median(x["s"] for x in rs) for name, rs in runs.items()}
    raw_fsync = statistics.median(x["s_fsync"] for x in runs["raw"])
    p = f"{kind}_"
    results[p + "input_objects"] = len(info["files"])
    results[p + "input_MB"] = mb
    results[p + "input_records"] = info["records"]
    summary = runs["compact"][-1]["summary"]
    results[p + "records_after"] = summary["records_after"]
    results[p + "objects_after"] = summary["objects_after"]
    results[p + "compact_s"] = med["compact"]
    results[p + "raw_s"] = med["raw"]
    results[p + "raw_fsync_s"] = raw_fsync
    results[p + "compact_MB_per_s"] = mb / med["compact"]
    results[p + "raw_MB_per_s"] = mb / med["raw"]
    results[p + "ratio_raw_over_compact"] = med["raw"] / med["compact"]
    results[p + "ratio_raw_fsync_over_compact"] = raw_fsync / med["compact"]
    if "raw_read_table" in med:
        results[p + "raw_read_table_s"] = med["raw_read_table"]
        results[p + "ratio_raw_read_table_over_compact"] = med["raw_read_table"] / med["compact"]
    if "raw_dedup" in med:
        results[p + "raw_dedup_s"] = med["raw_dedup"]
        results[p + "ratio_raw_dedup_over_compact"] = med["raw_dedup"] / med["compact"]
    for name, rs in runs.items():
        results[f"{p}{name}_peak_rss_MB"] = statistics.median(x["peak_rss_mb"] for x in rs)
        results[f"{p}{name}_rss_before_MB"] = statistics.median(x["rss_before_mb"] for x in rs)
    phases = runs["compact"][0]["phases"]
    for phase in phases:
        results[f"{p}compact_phase_{phase.replace(' ', '_')}_s"] = statistics.median(
            x["phases"].get(phase, 0.0) for x in runs["compact"])
    print("# " + kind + " runs (s): " + "; ".join(f"{n} " + " ".join(f"{x['s']:.2f}" for x in rs)
                                                 for n, rs in runs.items()), flush=True)


# ------------------------------------------------------------------ scans before / after merging
def bench_scan(args, results: dict) -> None:
    from bench_spark import session  # the SparkSession of the Spark benchmark

    from txlake import duckdb as txduck
    from txlake.config import parse_config
    from txlake.engine.compaction import compact
    from txlake.engine.registry import acquire_broker, close_all

    before = fresh_root()
    start = time.perf_counter()
    build_log(before, "s", "delete", args.scan_flushes, args.scan_records_per_flush, args.scan_partitions,
              keys=1000, seed=3)
    os.sync()
    info = topic_objects(before, "s")
    print(f"# scan: built {info['records']:,} records, {len(info['files'])} objects, {info['segments']} segments, "
          f"{info['bytes'] / 1e6:.1f} MB in {time.perf_counter() - start:.1f} s", flush=True)
    after = copy_root(before)
    cfg = parse_config({"storage.url": after, **ENGINE}, "admin")
    broker = acquire_broker(cfg.storage_url, cfg.storage_options, cfg.broker_config())
    t0 = time.perf_counter()
    summary = compact(broker, ["s"])
    results["scan_compact_s"] = time.perf_counter() - t0
    close_all()
    os.sync()
    assert summary.records_after == info["records"], summary
    results["scan_objects_before"] = summary.objects_before
    results["scan_objects_after"] = summary.objects_after
    results["scan_input_MB"] = info["bytes"] / 1e6
    roots = {"before": before, "after": after}
    expected = (info["records"], info["records"] * VALUE_BYTES)

    sql = "SELECT count(*), sum(octet_length(value)) FROM s"
    cons, connect_s = {}, {}
    for name, url in roots.items():
        t0 = time.perf_counter()
        cons[name] = txduck.connect(url, topics=["s"])
        connect_s[name] = time.perf_counter() - t0

    def duck(name: str) -> float:
        t0 = time.perf_counter()
        got = cons[name].execute(sql).fetchone()
        took = time.perf_counter() - t0
        assert tuple(got) == expected, (name, got, expected)
        return took

    spark = session()

    def spark_scan(name: str) -> float:
        t0 = time.perf_counter()
        df = spark.read.format("txlake").option("storage.url", roots[name]).option("subscribe", "s").load()
        got = df.selectExpr("count(*)", "sum(length(value))").collect()[0]
        took = time.perf_counter() - t0
        assert tuple(got) == expected, (name, got, expected)
        return took

    times: dict[str, list[float]] = {f"{e}_{n}": [] for e in ("duckdb", "spark") for n in roots}
    try:
        for r in range(args.runs + 1):  # round 0 is the warm-up
            order = ["before", "after"] if r % 2 else ["after", "before"]
            for engine, fn in (("duckdb", duck), ("spark", spark_scan)):
                for name in order:
                    took = fn(name)
                    if r:
                        times[f"{engine}_{name}"].append(took)
        t0 = time.perf_counter()
        cons["before"].close()
        cons["before"] = txduck.connect(before, topics=["s"])
        connect_s["before"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        cons["after"].close()
        cons["after"] = txduck.connect(after, topics=["s"])
        connect_s["after"] = time.perf_counter() - t0
    finally:
        spark.stop()
        for con in cons.values():
            con.close()
        remove_root(before)
        remove_root(after)
    for key, ts in times.items():
        print(f"# scan {key} (s): " + " ".join(f"{t:.3f}" for t in ts), flush=True)
        results[f"scan_{key}_s"] = statistics.median(ts)
    results["scan_duckdb_connect_before_s"] = connect_s["before"]
    results["scan_duckdb_connect_after_s"] = connect_s["after"]
    results["scan_duckdb_speedup"] = results["scan_duckdb_before_s"] / results["scan_duckdb_after_s"]
    results["scan_spark_speedup"] = results["scan_spark_before_s"] / results["scan_spark_after_s"]


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        spec = json.loads(sys.argv[2])
        out = child_raw(spec) if spec["kind"] == "raw" else child_compact(spec)
        print(json.dumps(out))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--flushes", type=int, default=500, help="flush objects of the throughput logs")
    ap.add_argument("--records-per-flush", type=int, default=600, help="1 KB records per flush")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--keys", type=int, default=10_000, help="distinct keys of the key-compaction log")
    ap.add_argument("--runs", type=int, default=3, help="measured rounds after one warm-up (medians reported)")
    ap.add_argument("--scan-flushes", type=int, default=1000)
    ap.add_argument("--scan-records-per-flush", type=int, default=100)
    ap.add_argument("--scan-partitions", type=int, default=4)
    ap.add_argument("--only", choices=["merge", "key", "scan"], action="append", help="run only these parts")
    args = ap.parse_args()
    parts = args.only or ["merge", "key", "scan"]
    results: dict[str, float] = {}
    start = time.perf_counter()
    load0 = os.getloadavg()[0]
    for kind in ("merge", "key"):
        if kind in parts:
            bench_throughput(args, kind, results)
    if "scan" in parts:
        bench_scan(args, results)
    print(f"# compaction benchmarks ({args.flushes} flushes x {args.records_per_flush} records of 1 KB, "
          f"{args.partitions} partitions, {args.keys:,} keys for key compaction; scan: {args.scan_flushes} flushes x "
          f"{args.scan_records_per_flush} records, {args.scan_partitions} partitions; medians of {args.runs} "
          f"interleaved runs; {machine()}; load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end; "
          f"{time.perf_counter() - start:.0f} s)")
    for k, v in results.items():
        print(f"{k:44s} {v:12.3f}" if isinstance(v, float) else f"{k:44s} {v:12,d}")


if __name__ == "__main__":
    main()
