"""Peak RSS of each phase of the trickle's compaction rounds, in minutes instead of an hour
(issue 14, defect 4: the 40-minute round of ``bench_trickle.py`` peaked 50-60 MB above the
20-minute one).

Run:  .venv/bin/python benchmarks/bench_round_memory.py [--rounds 8] [--skip PHASE ...] [--no-publish]

One process, the trickle's writer configuration (``bench_trickle.py``: default client settings,
delete delay 0, orphan grace 60 s, catalog retention 30 min), except that time is compressed:
each "round" produces the records of five trickle minutes (``--records``, 60 000 of 50 B) with
``storage.flush.interval.ms`` 50 instead of 500, so a round has the trickle round's ~600 flushes
and catalog commits in ~30 s; the background compaction thread is off and the benchmark calls
``compact()`` after each round's records, as that thread would. The Delta publication runs
beside it as in the trickle (``lake.publish.interval.ms`` 5 000, off with ``--no-publish``), and
the producer keeps producing during each round. Rounds 4 and 8 are the 4R tier merges (the
trickle's 20- and 40-minute rounds). From ``--cleanup-from`` (default 8) on, the catalog log
cleanup and the Delta log cleanup see a clock ``--shift`` (31 min) ahead, so they find the commits
and checkpoints of the first rounds expired, as the trickle's 40-minute round does.

Each phase of a round (the names of :func:`txlake.engine.compaction.compact`'s steps: merge,
clean_objects, drop_deleted_tables, checkpoint_tables, clean_dv_files, clean_table_logs,
clean_catalog_log) is wrapped: its peak RSS (``VmHWM``, reset before the phase through
``/proc/self/clear_refs``) over the RSS before it, and the highest Arrow pool bytes seen every
10 ms. ``--skip PHASE`` replaces a phase with a no-op, to see what the round costs without it.
Before each round it prints what the process holds: RSS, RssAnon, Arrow's pool, glibc malloc in
use and its arenas' total, Python's blocks and the decoded-segment cache.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(__file__))
from bench_trickle import _mallinfo2, add_writer_memory_options  # noqa: E402
from common import fresh_root, peak_rss_mb, rss_mb  # noqa: E402

from txlake import AdminClient, NewTopic, Producer  # noqa: E402
from txlake.catalog.catalog import MIN_LOG_RETENTION_MS  # noqa: E402
from txlake.engine import compaction as compaction_module  # noqa: E402
from txlake.engine.memory import configure_writer_memory  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402

PHASES = ("rewrite_runs", "clean_objects", "drop_deleted_tables", "checkpoint_tables", "clean_dv_files",
          "clean_table_logs", "clean_catalog_log", "release_unused_memory")
#: the phases that judge age by the clock (shifted from --cleanup-from on): the index of their now_ms
CLOCKED = {"clean_table_logs": 1, "clean_catalog_log": 2}


def held(broker) -> str:
    """What the process holds now: RSS and RssAnon, Arrow's pool, glibc malloc (in use / its
    arenas' total), Python's blocks and the decoded-segment cache's charge."""
    with open("/proc/self/status") as f:
        anon = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024
    info = _mallinfo2() if _mallinfo2 is not None else None
    malloc = (f"malloc in use {(info.uordblks + info.hblkhd) / 2**20:.1f} of {(info.arena + info.hblkhd) / 2**20:.1f} MB"
              if info is not None else "malloc n/a")
    cache = broker.reader.cache
    return (f"RSS {rss_mb():.0f} MB (anon {anon:.0f}), Arrow pool {pa.total_allocated_bytes() / 2**20:.1f} MB, "
            f"{malloc}, Python blocks {sys.getallocatedblocks()}, cache {getattr(cache, '_bytes', 0) / 2**20:.1f} MB "
            f"in {len(cache._items)} tables")


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class PhaseMeter:
    """Wraps the phases in ``compaction_module``'s namespace; ``rows`` gets one per call."""

    def __init__(self, skip: set[str], shift_ms: int) -> None:
        self.rows: list[tuple] = []
        self.round = 0
        self.shift_ms = 0
        self.shift_from_ms = shift_ms
        for name in PHASES:
            self._wrap(name, name in skip)

    def _wrap(self, name: str, skipped: bool) -> None:
        original = getattr(compaction_module, name)
        meter = self

        def wrapped(*args, **kwargs):
            if skipped:
                if name == "rewrite_runs":
                    raise compaction_module.MergeCancelled("skipped")
                return _empty(name)
            if name in CLOCKED and meter.shift_ms:
                args = list(args)
                args[CLOCKED[name]] += meter.shift_ms
            before = rss_mb()
            reset_peak()
            high = [pa.total_allocated_bytes()]
            done = threading.Event()

            def watch():
                while not done.wait(0.01):
                    high[0] = max(high[0], pa.total_allocated_bytes())

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            t0 = time.monotonic()
            try:
                return original(*args, **kwargs)
            finally:
                done.set()
                watcher.join()
                meter.rows.append((meter.round, name, before, peak_rss_mb(), rss_mb(), high[0] / 2**20,
                                   time.monotonic() - t0))

        setattr(compaction_module, name, wrapped)


def _empty(name: str):
    from txlake.catalog.log_cleanup import CatalogLogCleanup
    from txlake.engine.object_cleaner import ObjectCleanup

    return {"clean_catalog_log": CatalogLogCleanup(), "clean_objects": ObjectCleanup()}.get(name, [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--records", type=int, default=60_000, help="records per round (five trickle minutes)")
    ap.add_argument("--rate", type=float, default=2_000.0, help="records per second")
    ap.add_argument("--record-bytes", type=int, default=50)
    ap.add_argument("--flush-ms", type=int, default=50, help="storage.flush.interval.ms")
    ap.add_argument("--skip", action="append", default=[], choices=PHASES)
    ap.add_argument("--no-publish", action="store_true", help="lake.publish.interval.ms=0")
    ap.add_argument("--cleanup-from", type=int, default=8, help="first round whose cleanups see the shifted clock")
    ap.add_argument("--shift", type=float, default=31.0, help="minutes the cleanups' clock is ahead")
    add_writer_memory_options(ap)
    args = ap.parse_args()
    memory = configure_writer_memory(args.memory_pool, args.malloc_arenas)

    url = fresh_root()
    conf = {"storage.url": url, "storage.file.delete.delay.ms": 0, "storage.orphan.grace.ms": 60_000,
            "storage.catalog.retention.ms": MIN_LOG_RETENTION_MS, "storage.flush.interval.ms": args.flush_ms,
            "storage.compaction.interval.ms": 0}
    if args.no_publish:
        conf["lake.publish.interval.ms"] = 0
    print(f"bench_round_memory: {args.rounds} rounds of {args.records} records at {args.rate:g}/s, flush "
          f"{args.flush_ms} ms, publish {'off' if args.no_publish else 'on'}, skip {args.skip or 'nothing'}; "
          f"{memory}", flush=True)
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("trickle", 1)])["trickle"].result()
    meter = PhaseMeter(set(args.skip), int(args.shift * 60_000))
    producer = Producer(conf)
    broker = producer._broker
    sent = 0

    def produce_for(n: int) -> None:
        nonlocal sent
        start, target = time.monotonic(), sent + n
        base = sent
        while sent < target:
            due = base + int((time.monotonic() - start) * args.rate)
            while sent < min(due, target):
                producer.produce("trickle", value=os.urandom(args.record_bytes))
                sent += 1
            producer.poll(0)
            time.sleep(0.005)

    for r in range(1, args.rounds + 1):
        produce_for(args.records)
        meter.round = r
        print(f"before round {r}: {held(broker)}", flush=True)
        meter.shift_ms = meter.shift_from_ms if r >= args.cleanup_from else 0
        # the trickle goes on during the round (200 records/s), as the writer's producers do
        done = threading.Event()
        result = {}

        def run_round():
            before = rss_mb()
            reset_peak()
            t0 = time.monotonic()
            s = compaction_module.compact(broker)
            result.update(before=before, peak=peak_rss_mb(), after=rss_mb(), s=s, secs=time.monotonic() - t0)
            done.set()

        th = threading.Thread(target=run_round)
        th.start()
        while not done.is_set():
            producer.produce("trickle", value=os.urandom(args.record_bytes))
            sent += 1
            producer.poll(0)
            time.sleep(0.005)
        th.join()
        s = result["s"]
        result["peak"] = max([result["peak"]] + [x[3] for x in meter.rows if x[0] == r])
        print(f"round {r}: {s.merges} merges, {s.catalog_commits_deleted} commits + {s.catalog_checkpoints_deleted} "
              f"checkpoints of the catalog log deleted; RSS {result['before']:.0f} -> peak {result['peak']:.0f} -> "
              f"{result['after']:.0f} MB ({result['secs']:.1f} s)", flush=True)
        for row in [x for x in meter.rows if x[0] == r]:
            _, name, before, peak, after, pool, secs = row
            print(f"    {name:22s} RSS {before:6.0f} -> peak {peak:6.0f} (+{peak - before:5.1f}) -> {after:6.0f} MB; "
                  f"Arrow pool highest {pool:6.1f} MB; {secs:5.2f} s", flush=True)
    producer.flush(60)
    producer.close()
    close_all()


if __name__ == "__main__":
    main()
