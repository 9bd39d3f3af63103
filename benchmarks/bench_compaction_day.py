"""Object count of a storage root after a day of 64 partitions flushing every 250 ms, with and
without compaction (issue "Compaction engine").

Run:  .venv/bin/python benchmarks/bench_compaction_day.py [--hours 24] [--partition-bytes 16000]
          [--interval-ms 300000] [--delete-delay-ms 3600000] [--engine-flushes 480] [--engine-scale 40]
          [--engine-record-bytes 8000]

A real day is 345 600 flushes of 64 partitions. The engine cannot flush that fast here (a
64-partition flush of tiny records takes 0.1-0.3 s on this machine), so the day is simulated in
two parts, both with a simulated clock (flush k happens at k * 250 ms):

1. **The real engine, time-compressed** (``--engine-flushes``, ``--engine-scale`` S): a
   ``memory://`` root, a 64-partition topic, real flushes through ``Broker.produce``
   (one record of ``--engine-record-bytes`` random bytes per partition, one object per flush),
   and ``compact(broker, now_ms=<simulated>)`` every ``storage.compaction.interval.ms`` / S of
   simulated time with ``storage.file.delete.delay.ms`` / S as the grace: the real policy, real
   rewrites, real catalog commits, real object deletion; data objects counted by listing the store after every
   round. The same schedule is then replayed by the model below (same flushes, interval and grace,
   the engine's own flush-segment size and merged bytes per record, since a merged segment has
   no per-flush headers and the size tiering's 1 MiB floor is in bytes), and both counts are
   printed side by side. (Records of a few bytes make flush segments mostly Parquet footer:
   hence 8 KB records.)
2. **The model, a whole day** (``--hours``): no objects, no Parquet. A
   :class:`~txlake.catalog.state.CatalogState` is built with the real catalog actions: every flush
   applies one ``add_segment`` per partition (``SegmentInfo.to_action``) naming one new object of
   ``64 * --partition-bytes`` bytes; every ``storage.compaction.interval.ms`` (5 simulated minutes)
   a round runs the real policy (``plan_merges`` with the objects' sizes), turns each run into the
   segments ``rewrite_segments`` would write (about ``segment.bytes`` each, bytes = the inputs'
   bytes: what a merge of incompressible records writes), commits the real ``swap_actions``, and
   then deletes the retired objects whose ``storage.file.delete.delay.ms`` (1 hour) has passed
   (``due_for_deletion`` + ``forget_object``), as ``compact()`` does. One shortcut, checked: the
   ``remove_segment`` actions of a commit are applied to a partition in one pass
   (``CatalogState.apply`` rebuilds the partition's segment list once per action, which makes a
   merge of 1 200 segments quadratic); for the first ``--check-rounds`` rounds the same commits are
   also applied one by one with ``CatalogState.apply`` to a copy and the states compared.

Without compaction nothing deletes a data object within a day (retention.ms is 7 days), so that
count is the number of flushes (computed, not simulated). Catalog objects are counted apart: one
commit object per flush and per compaction commit, a checkpoint every 100 commits; nothing
deletes them.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import uuid
from collections import defaultdict

sys.path.insert(0, os.path.dirname(__file__))
from common import machine  # noqa: E402

from txlake.catalog.state import (ADD_SEGMENT, CREATE_TOPIC, FORGET_OBJECT, REMOVE_SEGMENT,  # noqa: E402
                                  CatalogState, SegmentInfo)
from txlake.engine.object_cleaner import due_for_deletion  # noqa: E402
from txlake.engine.requests import BrokerConfig  # noqa: E402
from txlake.engine.segment_merge import SegmentRewrite, plan_merges, swap_actions  # noqa: E402

PARTITIONS = 64
FLUSH_MS = 250
DEFAULTS = BrokerConfig()  # storage.compaction.interval.ms, storage.file.delete.delay.ms
SEGMENT_BYTES = 1024 ** 3  # topic default segment.bytes
CHECKPOINT_INTERVAL = 100  # catalog checkpoint every this many commits


# ------------------------------------------------------------------ the model
def apply_commit(state: CatalogState, actions: list[dict]) -> None:
    """``state.apply`` of every action, except that consecutive ``remove_segment`` actions are
    applied per partition in one pass (same result: each removes the segments matching its path
    and base offset and unreferences their object once per segment)."""
    i = 0
    while i < len(actions):
        if actions[i]["action"] != REMOVE_SEGMENT:
            state.apply(actions[i])
            i += 1
            continue
        j = i
        gone: dict[tuple[str, int], set[tuple[str, int]]] = defaultdict(set)
        while j < len(actions) and actions[j]["action"] == REMOVE_SEGMENT:
            a = actions[j]
            gone[(a["topic"], a["partition"])].add((a["path"], a["base_offset"]))
            j += 1
        for (topic, partition), keys in gone.items():
            p = state.partition(topic, partition)
            kept = []
            for s in p.segments:
                if (s.path, s.base_offset) in keys:
                    state._unreference(s.path, None)
                else:
                    kept.append(s)
            p.segments = kept
        i = j


def _same_state(a: CatalogState, b: CatalogState) -> bool:
    return ({n: [p.segments for p in t.partitions] for n, t in a.topics.items()}
            == {n: [p.segments for p in t.partitions] for n, t in b.topics.items()}
            and a.retired == b.retired and a._path_refs == b._path_refs)


def merged_segments(run, now_ms: int, seq: int, record_bytes: int | None = None) -> list[SegmentInfo]:
    """The segments ``rewrite_segments`` writes for ``run`` (sizes: ``record_bytes`` per record when
    given, else the inputs' bytes shared by records)."""
    records, size = run.record_count, run.size_bytes
    first = run.segments[0]
    assert run.segments[-1].last_offset - first.base_offset + 1 == records, "offsets without gaps"
    per_segment = max(1, int(run.target_bytes * records // max(size, 1)))
    lo = min(s.min_timestamp for s in run.segments)
    hi = max(s.max_timestamp for s in run.segments)
    out = []
    for start in range(0, records, per_segment):
        n = min(per_segment, records - start)
        out.append(SegmentInfo(run.topic, run.partition, f"data/{now_ms:013d}-m{seq}-{len(out)}.parquet",
                               first.base_offset + start, first.base_offset + start + n - 1, n,
                               max(1, n * record_bytes if record_bytes else size * n // records), lo, hi, 0, 1))
    return out


class Model:
    """A root's catalog state and data objects under the simulated workload (see the module docstring)."""

    def __init__(self, partition_bytes: int, records_per_flush: int, interval_ms: int, delay_ms: int,
                 segment_bytes: int = SEGMENT_BYTES, check_rounds: int = 0, merged_record_bytes: int | None = None):
        self.partition_bytes = partition_bytes
        self.merged_record_bytes = merged_record_bytes
        self.records = records_per_flush
        self.interval_ms, self.delay_ms = interval_ms, delay_ms
        self.check_rounds = check_rounds
        self.state = CatalogState()
        config = {} if segment_bytes == SEGMENT_BYTES else {"segment.bytes": str(segment_bytes)}
        self.state.apply({"action": CREATE_TOPIC, "topic": "t", "topic_id": "day", "num_partitions": PARTITIONS,
                          "config": config})
        self.sizes: dict[str, int] = {}  # data objects in storage -> bytes
        self.hw = [0] * PARTITIONS
        self.flushes = self.rounds = self.commits = self.merges = self.deleted = self.checked = 0
        self.merged_bytes = 0
        self.seq = 0
        self._ref: CatalogState | None = None

    def flush(self, now_ms: int) -> None:
        path = f"data/{now_ms:013d}-f{self.flushes}.parquet"
        n, apply = self.records, self.state.apply
        for p in range(PARTITIONS):
            base = self.hw[p]
            self.hw[p] = base + n
            apply({"action": ADD_SEGMENT, "topic": "t", "partition": p, "path": path, "base_offset": base,
                   "last_offset": base + n - 1, "record_count": n, "size_bytes": self.partition_bytes,
                   "min_timestamp": now_ms, "max_timestamp": now_ms, "row_group_start": p, "row_group_count": 1,
                   "high_watermark": base + n, "last_stable_offset": base + n})
        self.sizes[path] = self.partition_bytes * PARTITIONS
        self.flushes += 1
        self.commits += 1

    def _commit(self, actions: list[dict]) -> None:
        apply_commit(self.state, actions)
        if self._ref is not None:  # the shortcut against CatalogState.apply, action by action
            for a in actions:
                self._ref.apply(a)
            self.checked += 1
        self.commits += 1

    def compact(self, now_ms: int) -> None:
        """One round: the merge (``plan_merges`` + ``swap_actions``), then object cleaning."""
        self._ref = copy.deepcopy(self.state) if self.rounds < self.check_rounds else None
        self._round(now_ms)
        if self._ref is not None:
            assert _same_state(self._ref, self.state), "apply_commit differs from CatalogState.apply"
        self._ref = None
        self.rounds += 1

    def _round(self, now_ms: int) -> None:
        for run in plan_merges(self.state, ["t"], self.sizes):
            segs = [] if run.drop else merged_segments(run, now_ms, self.seq, self.merged_record_bytes)
            self.seq += 1
            rewrite = SegmentRewrite(run, segs, run.record_count, run.record_count, run.size_bytes,
                                     sum(s.size_bytes for s in segs))
            for s in segs:
                self.sizes[s.path] = s.size_bytes
            self._commit(swap_actions(self.state, rewrite, now_ms))
            self.merges += 1
            self.merged_bytes += run.size_bytes
        due = due_for_deletion(self.state, now_ms, self.delay_ms)
        for path in due:
            del self.sizes[path]
        if due:
            self._commit([{"action": FORGET_OBJECT, "path": p} for p in due])
            self.deleted += len(due)

    def counts(self) -> dict[str, int]:
        named = {s.path for p in self.state.topics["t"].partitions for s in p.segments}
        return {"objects": len(self.sizes), "named": len(named), "retired": len(self.state.retired),
                "segments": sum(len(p.segments) for p in self.state.topics["t"].partitions),
                "max_segments_per_partition": max(len(p.segments) for p in self.state.topics["t"].partitions)}


def run_model(flushes: int, partition_bytes: int, records_per_flush: int, interval_ms: int, delay_ms: int,
              check_rounds: int = 0, every_ms: int = 3_600_000, on_round=None,
              merged_record_bytes: int | None = None) -> tuple[Model, list[tuple]]:
    """Simulate ``flushes`` flushes with a round every ``interval_ms``; a row every ``every_ms``:
    (simulated ms, flushes, counts, peak objects so far)."""
    m = Model(partition_bytes, records_per_flush, interval_ms, delay_ms, check_rounds=check_rounds,
              merged_record_bytes=merged_record_bytes)
    rows, peak, next_round, next_row = [], 0, interval_ms, every_ms
    for k in range(flushes):
        m.flush(k * FLUSH_MS)
        now = (k + 1) * FLUSH_MS  # the clock after flush k
        if now >= next_round:  # a round right after this flush
            peak = max(peak, len(m.sizes))  # just before a round: the most objects
            m.compact(now)
            next_round += interval_ms
            if on_round is not None:
                on_round(m, now)
        if now >= next_row:
            rows.append((now, m.flushes, m.counts(), max(peak, len(m.sizes))))
            next_row += every_ms
    if not rows or rows[-1][1] != m.flushes:  # the end, when not on an hour
        rows.append((flushes * FLUSH_MS, m.flushes, m.counts(), max(peak, len(m.sizes))))
    return m, rows


# ------------------------------------------------------------------ the real engine, time-compressed
def run_engine(flushes: int, interval: int, delay: int, record_bytes: int) -> tuple[list[dict], int, int, float]:
    """Real flushes and ``compact(now_ms=...)`` rounds on a memory:// root (see the module docstring).
    Returns per-round counts, the flush segments' mean size, the merged segments' bytes per record
    (a merged segment has no per-flush headers: the size tiering's floor is in bytes), and the wall
    time."""
    import pyarrow as pa

    from txlake.config import parse_config
    from txlake.engine.compaction import compact
    from txlake.engine.registry import acquire_broker, close_all
    from txlake.engine.requests import ProduceBatch
    from txlake.formats.records import PAYLOAD_SCHEMA

    url = f"memory://txlake-bench-day-{uuid.uuid4().hex}"
    cfg = parse_config({"storage.url": url, "storage.compaction.interval.ms": 0, "storage.flush.linger.ms": 60_000,
                        "storage.lease.ms": 60_000, "storage.file.delete.delay.ms": delay}, "admin")
    broker = acquire_broker(cfg.storage_url, cfg.storage_options, cfg.broker_config())
    store = broker.store
    try:
        [(error, message)] = broker.create_topics([("t", PARTITIONS, {})])
        assert not error, message
        t0 = int(time.time() * 1000)
        rounds, segment_bytes, start = [], 0, time.perf_counter()
        next_round = interval
        for k in range(flushes):
            rec = pa.table({"timestamp": pa.array([t0 + k * FLUSH_MS], pa.int64()), "key": pa.array([b"k"]),
                            "value": pa.array([os.urandom(record_bytes)]),
                            "headers": pa.nulls(1, PAYLOAD_SCHEMA.field("headers").type)}, schema=PAYLOAD_SCHEMA)
            results = broker.produce([ProduceBatch("t", p, rec, urgent=p == PARTITIONS - 1) for p in range(PARTITIONS)])
            assert all(r.error == 0 for r in results), results[0]
            if k == 0:
                segs = [p.segments[0] for p in broker.catalog.state.topics["t"].partitions]
                segment_bytes = sum(s.size_bytes for s in segs) // len(segs)
            now = (k + 1) * FLUSH_MS  # the clock after flush k
            if now >= next_round:  # a round right after this flush
                before = sum(1 for _ in store.list("data/"))
                summary = compact(broker, now_ms=t0 + now)
                with broker.catalog.lock:
                    state = broker.catalog.state
                    named = {s.path for p in state.topics["t"].partitions for s in p.segments}
                    retired = len(state.retired)
                rounds.append({"sim_ms": now, "flushes": k + 1, "objects_before_round": before,
                               "objects": sum(1 for _ in store.list("data/")), "named": len(named),
                               "retired": retired, "merges": summary.merges, "deleted": summary.deleted_objects})
                next_round += interval
        wall = time.perf_counter() - start
        commits = broker.catalog.version
        with broker.catalog.lock:
            merged = [s for p in broker.catalog.state.topics["t"].partitions for s in p.segments if s.record_count > 1]
        merged_record_bytes = sum(s.size_bytes for s in merged) // max(1, sum(s.record_count for s in merged))
    finally:
        close_all()
        root = "/" + url[len("memory://"):]  # fsspec's memory filesystem is a process-global dict
        for key in [k for k in list(store.fs.store) if k == root or k.startswith(root + "/")]:
            store.fs.store.pop(key, None)
    rounds.append({"commits": commits})
    return rounds, segment_bytes, merged_record_bytes, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hours", type=float, default=24.0, help="simulated hours of the model")
    ap.add_argument("--partition-bytes", type=int, default=16_000,
                    help="bytes per partition per flush in the model (16 000: 4 MB/s over 64 partitions)")
    ap.add_argument("--record-bytes", type=int, default=1000, help="record size of the model (records per flush)")
    ap.add_argument("--interval-ms", type=int, default=DEFAULTS.compaction_interval_ms,
                    help="storage.compaction.interval.ms (simulated)")
    ap.add_argument("--delete-delay-ms", type=int, default=DEFAULTS.file_delete_delay_ms,
                    help="storage.file.delete.delay.ms (simulated)")
    ap.add_argument("--check-rounds", type=int, default=2, help="model rounds whose commits are checked "
                    "against CatalogState.apply action by action")
    ap.add_argument("--engine-flushes", type=int, default=480, help="flushes of the real-engine run (0: skip it)")
    ap.add_argument("--engine-record-bytes", type=int, default=8000,
                    help="value bytes of the one record per partition and flush of the real-engine run")
    ap.add_argument("--engine-scale", type=int, default=40, help="the real-engine run divides the compaction "
                    "interval and the delete delay by this")
    args = ap.parse_args()
    interval, delay = args.interval_ms, args.delete_delay_ms
    load0 = os.getloadavg()[0]

    if args.engine_flushes:
        s = args.engine_scale
        rounds, seg_bytes, merged_record_bytes, wall = run_engine(args.engine_flushes, interval // s, delay // s, args.engine_record_bytes)
        commits = rounds.pop()["commits"]
        model_rounds: list[dict] = []

        def note(m: Model, now: int) -> None:
            c = m.counts()
            model_rounds.append({"objects": c["objects"], "named": c["named"], "retired": c["retired"]})

        t0 = time.perf_counter()
        m, _ = run_model(args.engine_flushes, seg_bytes, 1, interval // s, delay // s, on_round=note,
                         merged_record_bytes=merged_record_bytes)
        print(f"# real engine, time-compressed {s}x: {args.engine_flushes} flushes of {PARTITIONS} partitions "
              f"(1 record of {args.engine_record_bytes:,} random bytes each, {seg_bytes:,} B per flush segment, "
              f"{merged_record_bytes:,} B per record merged), "
              f"a compact() round every {interval // s / 1000:g} simulated s ({interval // s // FLUSH_MS} flushes), "
              f"delete delay {delay // s / 1000:g} s ({delay // s // FLUSH_MS} flushes); {wall:.0f} s wall; "
              f"{commits} catalog commits; "
              f"model replay {time.perf_counter() - t0:.1f} s")
        print(f"{'round':>5} {'flushes':>7} | {'engine: objects before':>22} {'after':>6} {'named':>6} "
              f"{'retired':>7} {'merges':>6} {'deleted':>7} | {'model: objects':>14} {'named':>6} {'retired':>7}")
        for i, (r, mr) in enumerate(zip(rounds, model_rounds), 1):
            print(f"{i:5d} {r['flushes']:7d} | {r['objects_before_round']:22d} {r['objects']:6d} {r['named']:6d} "
                  f"{r['retired']:7d} {r['merges']:6d} {r['deleted']:7d} | {mr['objects']:14d} {mr['named']:6d} "
                  f"{mr['retired']:7d}")

    flushes = int(args.hours * 3_600_000 // FLUSH_MS)
    records = max(1, args.partition_bytes // args.record_bytes)
    t0 = time.perf_counter()
    m, rows = run_model(flushes, args.partition_bytes, records, interval, delay, check_rounds=args.check_rounds)
    wall = time.perf_counter() - t0
    rate = args.partition_bytes * PARTITIONS * 1000 / FLUSH_MS / 1e6
    print(f"# model: {args.hours:g} simulated hours, {flushes:,} flushes of {PARTITIONS} partitions x "
          f"{args.partition_bytes:,} B ({rate:.1f} MB/s, {records} records per partition flush), round every "
          f"{interval / 60000:g} min, delete delay {delay / 60000:g} min, segment.bytes {SEGMENT_BYTES:,}; "
          f"{m.rounds} rounds, {m.merges:,} merge commits, {m.merged_bytes / 1e9:,.1f} GB rewritten "
          f"({m.merged_bytes / max(1, flushes * PARTITIONS * args.partition_bytes):.2f}x the data); "
          f"{m.checked} commits checked against CatalogState.apply; {wall:.0f} s wall")
    print(f"{'hour':>5} {'flushes':>8} | {'without compaction':>18} | {'with: objects':>13} {'peak':>6} {'named':>6} "
          f"{'retired (grace)':>15} {'segments':>8} {'max/partition':>13}")
    for ms, n, c, peak in rows:
        print(f"{ms / 3_600_000:5.1f} {n:8,d} | {n:18,d} | {c['objects']:13,d} {peak:6,d} {c['named']:6,d} "
              f"{c['retired']:15,d} {c['segments']:8,d} {c['max_segments_per_partition']:13,d}")
    commits_without = flushes
    commits_with = m.commits
    print(f"# catalog objects at the end (never deleted): without compaction {commits_without:,} commits + "
          f"{commits_without // CHECKPOINT_INTERVAL:,} checkpoints; with compaction {commits_with:,} commits + "
          f"{commits_with // CHECKPOINT_INTERVAL:,} checkpoints")
    print(f"# {machine()}; load average {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
