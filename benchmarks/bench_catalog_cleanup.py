"""Catalog log cleanup benchmark: one round of ``clean_catalog_log`` against a raw deletion of
exactly the same files.

Run:  .venv/bin/python benchmarks/bench_catalog_cleanup.py [--commits 10000] [--runs 3]

A local storage root gets ``--commits`` catalog commits (one ``add_segment`` each, a checkpoint
every 100, as the writer does under load: one commit per flush). Each run copies that root
twice. On one copy the cleanup runs with every object past the retention (a ``now_ms`` one hour
and a minute ahead): it lists the checkpoints, decodes the floor, lists the commits and deletes
every commit up to the floor and every checkpoint below it. On the other copy the baseline
("raw") removes the same files with ``os.scandir`` + ``os.remove``. Ratio = raw time / cleanup
time. The steady-state round (nothing left to delete) is timed as well.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from txlake.catalog.catalog import CHECKPOINTS_PREFIX, COMMITS_PREFIX, Catalog, version_of
from txlake.catalog.log_cleanup import DEFAULT_LOG_RETENTION_MS, clean_catalog_log
from txlake.catalog.storage import ObjectStore
from txlake.catalog.writer_lease import WriterLease


def build(root: str, commits: int) -> None:
    catalog = Catalog.open(ObjectStore(root), 100)
    epoch = WriterLease(catalog, 60_000).acquire()
    catalog.commit([{"action": "create_topic", "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    for i in range(commits):
        catalog.commit([{"action": "add_segment", "topic": "t", "partition": 0, "path": f"data/{i}", "base_offset": i,
                         "last_offset": i, "record_count": 1, "size_bytes": 100, "min_timestamp": 1,
                         "max_timestamp": 2, "row_group_start": 0, "row_group_count": 1, "high_watermark": i + 1,
                         "last_stable_offset": i + 1}], epoch)


def raw_delete(root: str, floor: int) -> int:
    """Remove the commits up to ``floor`` and the checkpoints below it with plain os calls."""
    removed = 0
    for prefix, keep in ((COMMITS_PREFIX, lambda v: v > floor), (CHECKPOINTS_PREFIX, lambda v: v >= floor)):
        folder = os.path.join(root, prefix)
        for entry in os.scandir(folder):
            v = version_of(entry.name)
            if v is not None and not keep(v):
                os.remove(entry.path)
                removed += 1
    return removed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--commits", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="txlake-bench-cleanup-")
    source = os.path.join(work, "source")
    t = time.perf_counter()
    build(source, args.commits)
    print(f"built {args.commits} commits in {time.perf_counter() - t:.1f} s")
    later = int(time.time() * 1000) + DEFAULT_LOG_RETENTION_MS + 60_000
    cleanup_s, raw_s, steady_s = [], [], []
    for run in range(args.runs):
        a, b = os.path.join(work, f"a{run}"), os.path.join(work, f"b{run}")
        shutil.copytree(source, a)
        shutil.copytree(source, b)
        os.sync()
        catalog = Catalog.open(ObjectStore(a))
        t = time.perf_counter()
        done = clean_catalog_log(catalog, DEFAULT_LOG_RETENTION_MS, later)
        cleanup_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        clean_catalog_log(catalog, DEFAULT_LOG_RETENTION_MS, later)
        steady_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        removed = raw_delete(b, done.floor)
        raw_s.append(time.perf_counter() - t)
        assert removed == len(done.commits) + len(done.checkpoints), (removed, done)
        print(f"run {run}: deleted {len(done.commits)} commits + {len(done.checkpoints)} checkpoints (floor "
              f"{done.floor}): cleanup {cleanup_s[-1]:.2f} s, raw {raw_s[-1]:.2f} s, steady round {steady_s[-1]:.3f} s")
        shutil.rmtree(a)
        shutil.rmtree(b)
    c, r = statistics.median(cleanup_s), statistics.median(raw_s)
    print(f"median: cleanup {c:.2f} s, raw {r:.2f} s, ratio raw/cleanup {r / c:.2f}; "
          f"steady-state round {statistics.median(steady_s) * 1000:.0f} ms")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
