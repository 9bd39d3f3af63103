"""Trickle benchmark (issue 14): a low-rate producer for a long time -- memory, objects, bytes
and PUTs, then a compaction round.

Run:  .venv/bin/python benchmarks/bench_trickle.py [--rate 200] [--record-bytes 50] [--duration 3600]

One process: an embedded engine on a fresh local root and a ``Producer`` (default client
settings: ``linger.ms`` 5) producing ``--rate`` records a second of ``--record-bytes`` random
(incompressible) bytes to a 1-partition topic for ``--duration`` seconds, serving its delivery
reports as it goes. Every ``--sample`` seconds it records the process's RSS, its peak RSS since
the sample before (``VmHWM``, reset at each sample, so a compaction round's peak is never
missed), the decoded-segment cache's charged bytes and the objects under the root by kind.
Every PUT the engine makes is counted by kind (the ``ObjectStore`` of this process is
wrapped). Then the producer flushes and one compaction round runs (``compact()``, as the writer's background thread does every
``storage.compaction.interval.ms``), and the root is measured again.

Grace periods are shortened so deletes happen within the run (the defaults keep everything
for an hour): ``storage.file.delete.delay.ms`` 0 (nothing reads the root but this process, so
an object may go the moment compaction replaces it), ``storage.orphan.grace.ms`` 60 s
(superseded producer-state snapshots go by age), ``storage.catalog.retention.ms`` 30 min (the
smallest allowed: catalog commits and checkpoints a newer checkpoint covers go once older).
Everything else is the default; ``--conf KEY=VALUE`` overrides any client setting (e.g.
``--conf storage.flush.interval.ms=0`` to see the engine without its flush interval).

Goals (issue 14): RSS flat (the highest RSS of the second half at most 10% above the highest
of the first half; judged on the samples and on the peaks between them), stored bytes at most
3x the payload after the compaction round. Also printed: PUTs per hour by kind against the
documented formula, objects and bytes per MB of payload by kind, the delivery latency (produce() to its delivery report) median and p99.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import os
import statistics
import sys
import threading
import time
from array import array

import pyarrow as pa

sys.path.insert(0, os.path.dirname(__file__))
from common import fresh_root, machine, peak_rss_mb, root_path, rss_mb  # noqa: E402

from txlake import AdminClient, NewTopic, Producer  # noqa: E402
from txlake.catalog.catalog import MIN_LOG_RETENTION_MS  # noqa: E402
from txlake.catalog.storage import ObjectStore  # noqa: E402
from txlake.engine.compaction import compact  # noqa: E402
from txlake.engine.memory import MEMORY_POOL_BACKENDS, configure_writer_memory  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402

#: object kinds by key prefix
KINDS = {"_catalog/commits/": "commits", "_catalog/checkpoints/": "checkpoints", "_catalog/leases/": "heartbeats",
         "data/": "data objects", "producer-state/": "snapshots", "tables/": "tables"}


def kind_of(key: str) -> str:
    for prefix, kind in KINDS.items():
        if key.startswith(prefix):
            return kind
    return "other"


class PutCounter:
    """Counts the PUTs (``put`` / ``put_if_absent``) of every ObjectStore of this process, by kind
    (``kind(key)``, default :func:`kind_of`)."""

    def __init__(self, kind=None) -> None:
        kind = kind or kind_of
        self.counts: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        counter = self
        for name in ("put", "put_if_absent"):
            original = getattr(ObjectStore, name)

            def wrapped(store, key, data, *args, _original=original, **kwargs):
                with counter.lock:
                    counter.counts[kind(key)] += 1
                return _original(store, key, data, *args, **kwargs)

            setattr(ObjectStore, name, wrapped)

    def snapshot(self) -> collections.Counter:
        with self.lock:
            return collections.Counter(self.counts)


def stored(url: str) -> dict[str, list[int]]:
    """``kind -> [objects, bytes]`` under the local root ``url`` (temporary files skipped)."""
    root = root_path(url)
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            key = os.path.relpath(path, root).replace(os.sep, "/")
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:  # deleted while listing
                continue
            entry = out[kind_of(key)]
            entry[0] += 1
            entry[1] += size
    return dict(out)


def window_peak_mb() -> float | None:
    """The highest RSS of this process (MiB) since the last call: ``VmHWM``, then reset through
    ``/proc/self/clear_refs`` (Linux 4.0+). A sample of RSS every 30 s sees a compaction round
    (a second or two) only by chance; this sees every peak. None when the reset is refused."""
    peak = peak_rss_mb()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    return peak


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


try:
    _mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    _mallinfo2.restype = _Mallinfo2
except (OSError, AttributeError):  # not glibc 2.33+
    _mallinfo2 = None


def malloc_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back (``mallinfo2``: uordblks + hblkhd);
    0 where unavailable."""
    if _mallinfo2 is None:
        return 0
    info = _mallinfo2()
    return info.uordblks + info.hblkhd


def held_now() -> str:
    """What holds the RSS now: RssAnon, Arrow's pool (live bytes), glibc malloc in use and its
    arenas' total (``mallinfo2``: uordblks + hblkhd, arena + hblkhd) and Python's blocks -- so a
    step between two samples can be told apart: live memory, or memory an allocator keeps."""
    with open("/proc/self/status") as f:
        anon = next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024
    malloc = "n/a"
    if _mallinfo2 is not None:
        info = _mallinfo2()
        malloc = f"{(info.uordblks + info.hblkhd) / 2**20:.1f} of {(info.arena + info.hblkhd) / 2**20:.1f} MB"
    return (f"RssAnon {anon:.0f} MB, Arrow pool {pa.total_allocated_bytes() / 2**20:.1f} MB, malloc in use {malloc}, "
            f"Python blocks {sys.getallocatedblocks()}")


def parse_conf(items: list[str]) -> dict:
    conf = {}
    for item in items:
        key, _, value = item.partition("=")
        conf[key] = int(value) if value.lstrip("-").isdigit() else value
    return conf


def fmt_table(rows: list[list], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
              for r in rows]
    return "\n".join(lines)


def add_writer_memory_options(ap: argparse.ArgumentParser) -> None:
    """``--memory-pool`` and ``--malloc-arenas``: the process's allocators, set up as ``txlake serve``
    sets up its own (``configure_writer_memory``), with the same defaults."""
    ap.add_argument("--memory-pool", choices=("auto", "default") + MEMORY_POOL_BACKENDS, default="auto",
                    help="the process's Arrow memory pool, as `txlake serve --memory-pool` (auto: jemalloc when "
                         "pyarrow has it; default: pyarrow's, mimalloc)")
    ap.add_argument("--malloc-arenas", type=int, default=2,
                    help="the most glibc malloc arenas, as `txlake serve --malloc-arenas` (0: glibc's default)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=200.0, help="records per second")
    ap.add_argument("--record-bytes", type=int, default=50, help="value bytes per record (no key)")
    ap.add_argument("--duration", type=float, default=3600.0, help="seconds of producing")
    ap.add_argument("--sample", type=float, default=10.0, help="seconds between RSS samples")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="client setting override")
    add_writer_memory_options(ap)
    ap.add_argument("--keep", action="store_true", help="keep the storage root (its path is printed)")
    args = ap.parse_args()

    memory = configure_writer_memory(args.memory_pool, args.malloc_arenas)
    url = fresh_root(keep=args.keep)
    conf = {"storage.url": url, "storage.file.delete.delay.ms": 0, "storage.orphan.grace.ms": 60_000,
            "storage.catalog.retention.ms": MIN_LOG_RETENTION_MS, **parse_conf(args.conf)}
    print(f"bench_trickle: {args.rate:g} records/s of {args.record_bytes} B for {args.duration:g} s; {memory}; {machine()}")
    print(f"root {url}; settings: " + ", ".join(f"{k}={v}" for k, v in conf.items() if k != "storage.url"))
    puts = PutCounter()
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("trickle", 1)])["trickle"].result()
    # one C double per record (8 B), not a Python float object (24 B + a list slot): an hour's
    # 720 000 latencies would otherwise add ~20 MB of the benchmark's own to the RSS it measures
    latencies = array("d")
    failed = []

    def delivered(err, msg, sent_at):
        if err is not None:
            failed.append(err)
        else:
            latencies.append(time.monotonic() - sent_at)

    # one line per background compaction round: what it did, RSS around it (the round's peak is in
    # the next sample's window), the records it rewrote and the catalog log it cleaned
    from txlake.engine import compaction as compaction_module
    plain_compact = compaction_module.compact
    start_box = [time.monotonic()]

    def reported_compact(writer, *a, **kw):
        rss_before, t0 = rss_mb(), time.monotonic()
        malloc_before, blocks_before = malloc_in_use(), sys.getallocatedblocks()
        merged_before = {(s.path, s.base_offset): s.record_count for t in writer.catalog.state.topics.values()
                         if t.name == "trickle" for p in t.partitions for s in p.segments}
        done = threading.Event()
        # seen every 20 ms during the round: RSS (MB), Arrow pool (bytes), glibc malloc in use
        # (bytes, mallinfo2's uordblks + hblkhd) and Python's allocated blocks
        highs = [0.0, 0, 0, 0, 0.0, 0.0, 0]  # ... and RssAnon, RssFile (MB) and threads

        def status() -> dict[str, int]:
            with open("/proc/self/status") as f:
                return {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in f)
                        if k in ("RssAnon", "RssFile", "Threads")}

        def watch():
            while not done.wait(0.02):
                highs[0] = max(highs[0], rss_mb())
                highs[1] = max(highs[1], pa.total_allocated_bytes())
                highs[2] = max(highs[2], malloc_in_use())
                highs[3] = max(highs[3], sys.getallocatedblocks())
                now = status()
                highs[4] = max(highs[4], now["RssAnon"] / 1024)
                highs[5] = max(highs[5], now["RssFile"] / 1024)
                highs[6] = max(highs[6], now["Threads"])

        anon_before = status()["RssAnon"] / 1024
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            summary = plain_compact(writer, *a, **kw)
        finally:
            done.set()
            watcher.join()
        after = {(s.path, s.base_offset) for t in writer.catalog.state.topics.values()
                 if t.name == "trickle" for p in t.partitions for s in p.segments}
        rewritten = sum(n for k, n in merged_before.items() if k not in after)
        print(f"  round at {(t0 - start_box[0]) / 60:5.1f} min ({time.monotonic() - t0:.1f} s): {summary.merges} merges "
              f"of {rewritten} records ({summary.segments_before} -> {summary.segments_after} segments), "
              f"{summary.deleted_objects} retired + {summary.orphans_deleted} orphans deleted, catalog log "
              f"{summary.catalog_commits_deleted} commits + {summary.catalog_checkpoints_deleted} checkpoints deleted; "
              f"RSS {rss_before:.0f} -> {rss_mb():.0f} MB (highest seen during it {highs[0]:.0f}), Arrow pool "
              f"{pa.total_allocated_bytes() / 2**20:.1f} MB (highest {highs[1] / 2**20:.1f}), glibc malloc in use "
              f"{malloc_before / 2**20:.1f} -> {malloc_in_use() / 2**20:.1f} MB (highest {highs[2] / 2**20:.1f}), "
              f"Python blocks {blocks_before} -> {sys.getallocatedblocks()} (highest {highs[3]}), RssAnon "
              f"{anon_before:.0f} -> {status()['RssAnon'] / 1024:.0f} MB (highest {highs[4]:.0f}), RssFile highest "
              f"{highs[5]:.0f} MB, threads highest {highs[6]}", flush=True)
        return summary

    compaction_module.compact = reported_compact
    producer = Producer(conf)
    broker = producer._broker  # the embedded engine of this process (its cache and catalog are measured)
    cache = broker.reader.cache
    # (t, rss MB, cache bytes, cache entries, pool bytes, peak RSS MB since the sample before or None)
    samples: list[tuple[float, float, int, int, int, float | None]] = []
    puts_before = puts.snapshot()
    start = start_box[0] = time.monotonic()
    next_sample = start
    window_peak_mb()  # the first window starts here
    next_report = start + 60
    sent = 0
    while True:
        now = time.monotonic()
        elapsed = now - start
        if elapsed >= args.duration:
            break
        due = int(elapsed * args.rate)
        while sent < due:
            sent_at = time.monotonic()
            producer.produce("trickle", value=os.urandom(args.record_bytes),
                             on_delivery=lambda err, msg, t=sent_at: delivered(err, msg, t))
            sent += 1
        producer.poll(0)
        if now >= next_sample:
            samples.append((elapsed, rss_mb(), getattr(cache, "bytes", getattr(cache, "_bytes", 0)),
                            len(cache._items), pa.total_allocated_bytes(), window_peak_mb()))
            next_sample += args.sample
        if now >= next_report:
            kinds = stored(url)
            peak = max((s[5] or 0) for s in samples[-int(60 / args.sample) - 1:])
            print(f"  {elapsed / 60:5.1f} min: {sent} records, RSS {samples[-1][1]:.0f} MB (peak {peak:.0f}), cache "
                  f"{samples[-1][2] / 2**20:.1f} MB in {samples[-1][3]} tables; {held_now()}; objects "
                  + ", ".join(f"{k} {v[0]}" for k, v in sorted(kinds.items())), flush=True)
            next_report += 60
        time.sleep(min(0.005, max(0.0, start + (sent + 1) / args.rate - time.monotonic())))
    assert producer.flush(60) == 0, "records left undelivered"
    produced_s = time.monotonic() - start
    puts_after = puts.snapshot() - puts_before
    payload = sent * args.record_bytes
    before = stored(url)

    compaction_module.compact = plain_compact
    t = time.perf_counter()
    summary = compact(broker)
    compact_s = time.perf_counter() - t
    after = stored(url)
    rss_end = rss_mb()
    producer.close()
    close_all()

    # ---- report
    mb = payload / 1e6
    print(f"\nproduced {sent} records ({payload} B of payload = {mb:.2f} MB) in {produced_s:.0f} s; "
          f"{len(failed)} failed deliveries")
    if latencies:
        q = statistics.quantiles(latencies, n=100)
        print(f"delivery latency (produce() to report): median {statistics.median(latencies) * 1000:.0f} ms, "
              f"p99 {q[98] * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms")
    per_hour = 3600 / produced_s
    rows = [[k, puts_after[k], f"{puts_after[k] * per_hour:,.0f}"] for k in sorted(puts_after)]
    rows.append(["total", sum(puts_after.values()), f"{sum(puts_after.values()) * per_hour:,.0f}"])
    print("\nPUTs while producing (before the final compaction round):")
    print(fmt_table(rows, ["kind", "PUTs", "per hour"]))
    interval_ms = conf.get("storage.flush.interval.ms", getattr(broker.config, "flush_interval_ms", 0))
    if interval_ms:
        print(f"formula: 3600 s / {interval_ms / 1000:g} s x 2 = {3600 / (interval_ms / 1000) * 2:,.0f} PUTs/h of "
              f"flushes + checkpoints + snapshots + heartbeats (3600 s / {broker.config.lease_ms / 3000:g} s = "
              f"{3600 / (broker.config.lease_ms / 3000):,.0f}/h) + compaction rounds")

    kinds = sorted(set(before) | set(after))
    rows = []
    for k in kinds:
        b, a = before.get(k, [0, 0]), after.get(k, [0, 0])
        rows.append([k, b[0], f"{b[1]:,}", f"{b[0] / mb:.1f}", f"{b[1] / payload:.2f}",
                     a[0], f"{a[1]:,}", f"{a[1] / payload:.2f}"])
    tb, ta = sum(v[1] for v in before.values()), sum(v[1] for v in after.values())
    rows.append(["total", sum(v[0] for v in before.values()), f"{tb:,}", f"{sum(v[0] for v in before.values()) / mb:.1f}",
                 f"{tb / payload:.2f}", sum(v[0] for v in after.values()), f"{ta:,}", f"{ta / payload:.2f}"])
    print(f"\nstored under the root, before and after the compaction round ({compact_s:.1f} s: {summary.merges} "
          f"merges, {summary.deleted_objects} retired objects and {summary.orphans_deleted} orphans deleted, "
          f"{summary.catalog_commits_deleted} commits and {summary.catalog_checkpoints_deleted} checkpoints of "
          f"the catalog log deleted):")
    print(fmt_table(rows, ["kind", "objects", "bytes", "objects/MB", "bytes/payload", "objects after",
                           "bytes after", "bytes/payload after"]))

    rss = [s[1] for s in samples]
    half = len(samples) // 2
    first_max, second_max = max(rss[:max(half, 1)]), max(rss[half:] or rss)
    print(f"\nRSS: first {rss[0]:.0f} MB, last {rss[-1]:.0f} MB (after the round {rss_end:.0f} MB), max {max(rss):.0f} MB; "
          f"max of the first half {first_max:.0f} MB, of the second half {second_max:.0f} MB")
    pool = [s[4] for s in samples]
    print(f"Arrow memory pool (live buffers): first {pool[0] / 2**20:.1f} MB, last {pool[-1] / 2**20:.1f} MB, "
          f"max {max(pool) / 2**20:.1f} MB")
    step = max(1, len(samples) // 12)
    print("RSS over time (min: MB, cache MB / tables): " + "; ".join(
        f"{s[0] / 60:.0f}: {s[1]:.0f}, {s[2] / 2**20:.1f}/{s[3]}" for s in samples[::step]))
    peaks = [s[5] for s in samples[1:]]  # each: the highest RSS since the sample before
    if peaks and None not in peaks:
        cut = max(len(samples) // 2 - 1, 1)  # peaks[i] is the window ending at samples[i + 1]
        peak_first, peak_second = max(peaks[:cut]), max(peaks[cut:] or peaks)
        print(f"peak RSS between samples (VmHWM, every compaction round included): max of the first half "
              f"{peak_first:.0f} MB, of the second half {peak_second:.0f} MB; over time (min: MB): " + "; ".join(
                  f"{s[0] / 60:.0f}: {s[5]:.0f}" for s in samples[1::step]))
    flat = second_max <= 1.10 * first_max
    ratio = ta / payload
    print(f"\ngoal: flat RSS (second-half max <= 1.10 x first-half max): {second_max:.0f} vs {first_max:.0f} MB -> "
          f"{'MET' if flat else 'NOT MET'}")
    if peaks and None not in peaks:
        print(f"      the same on the peaks between samples: {peak_second:.0f} vs {peak_first:.0f} MB -> "
              f"{'MET' if peak_second <= 1.10 * peak_first else 'NOT MET'}")
    print(f"goal: stored bytes <= 3 x payload after a compaction round: {ratio:.2f}x -> {'MET' if ratio <= 3 else 'NOT MET'}")


if __name__ == "__main__":
    main()
