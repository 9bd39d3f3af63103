"""Delta table publication (issue 19): what it costs in PUTs and time, and how fresh the tables are.

Run:  .venv/bin/python benchmarks/bench_publish.py [--transactions 60] [--freshness 50]

One process, an embedded engine (the writer) on a fresh local root per run; every PUT of the
process is counted by kind as benchmarks/bench_trickle.py counts them (``ObjectStore.put`` and
``put_if_absent`` wrapped; ``tables/`` keys are the tables' commits, checkpoints and
deletion-vector files). Publications write no checkpoints: the compaction round does
(``storage.compaction.interval.ms``, 5 minutes, so none runs within a run here; docs/tables.md
"Checkpoints"), so a "table checkpoints" column appears only if one did.

(a) Publication cost. A transactional producer commits ``--transactions`` transactions, one
every ``--pace-ms`` ms, each of ``--records`` records spread round-robin over every partition
(so every flush object holds commit markers the tables' deletion vectors hide), on a topic of
1 and of 64 partitions, with the writer publishing every ``--interval-ms`` ms
(``lake.publish.interval.ms``) and with publication off (0); after the last commit it waits one
more interval. Printed per run: flushes (data-object PUTs), PUTs by kind (the tables' split into commits,
checkpoints and deletion-vector files; "checkpoints" alone are the catalog's), PUTs per flush, the
tables' PUTs per publish interval (goal: at most one, whatever the partition count), and the
latency of each publication of a table (``TablePublisher.publish``, timed around the call)
p50 / p99.

(b) Freshness. With ``lake.publish.interval.ms`` = ``--interval-ms`` (1000), ``--freshness``
transactions of 10 records each on a 4-partition topic, each committed after a random pause of
0 to one interval (so commits fall at every phase of the publisher's schedule): the time from
``commit_transaction()`` returning to the rows being visible through delta-rs
(``pa.table(DeltaTable(uri).scan())`` holding every record committed so far), polled every
``--poll-ms`` ms. The figure includes the reader's own open and scan. Goal: p99 at most one
interval + 1 s.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_trickle import PutCounter, fmt_table, kind_of  # noqa: E402
from common import fresh_root, machine  # noqa: E402

import pyarrow as pa  # noqa: E402

from txlake import AdminClient, NewTopic, Producer  # noqa: E402
from txlake.engine import table_publisher  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402
from txlake.tables import table_uri  # noqa: E402

TOPIC = "pub"
#: the tables' objects by name (engine/table_publisher.py, docs/tables.md)
TABLE_KINDS = (("deletion_vector_", "table DV files"), ("checkpoint", "table checkpoints"), ("", "table commits"))


def kind(key: str) -> str:
    """bench_trickle's kinds, the tables' PUTs split into commits, checkpoints (the checkpoint
    and ``_last_checkpoint``) and deletion-vector files."""
    if not key.startswith("tables/"):
        return kind_of(key)
    name = key.rsplit("/", 1)[-1]
    return next(k for part, k in TABLE_KINDS if part in name)


class PublishTimer:
    """Times every ``TablePublisher.publish`` call of this process (seconds; committed or not)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.committed = 0
        self.lock = threading.Lock()
        original = table_publisher.TablePublisher.publish
        timer = self

        def timed(publisher, *args, **kwargs):
            t = time.perf_counter()
            result = original(publisher, *args, **kwargs)
            with timer.lock:
                timer.seconds.append(time.perf_counter() - t)
                timer.committed += bool(result.committed)
            return result

        table_publisher.TablePublisher.publish = timed

    def take(self) -> tuple[list[float], int]:
        with self.lock:
            out, self.seconds = self.seconds, []
            committed, self.committed = self.committed, 0
        return out, committed


def pct(values: list[float], q: int) -> float:
    """The q-th percentile (q in 1..99) of ``values`` (the value itself when there is one)."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def new_producer(partitions: int, interval_ms: int, name: str) -> tuple[Producer, str]:
    url = fresh_root()
    conf = {"storage.url": url, "lake.publish.interval.ms": interval_ms}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(TOPIC, partitions)])[TOPIC].result()
    p = Producer({**conf, "transactional.id": name})
    p.init_transactions(60)
    return p, url


def cost_run(partitions: int, interval_ms: int, args, puts: PutCounter, timer: PublishTimer) -> dict:
    """One run of (a): PUTs by kind and the publications' latencies."""
    p, _ = new_producer(partitions, interval_ms, f"cost-{partitions}-{interval_ms}")
    value = os.urandom(100)
    timer.take()
    before = puts.snapshot()
    start = time.monotonic()
    for n in range(args.transactions):
        time.sleep(max(0.0, start + n * args.pace_ms / 1000 - time.monotonic()))
        p.begin_transaction()
        for i in range(args.records):
            p.produce(TOPIC, value, partition=i % partitions)
        p.commit_transaction(60)
    time.sleep((interval_ms or args.interval_ms) / 1000)  # the publication of the last commits
    elapsed = time.monotonic() - start
    counts = puts.snapshot() - before
    latencies, committed = timer.take()
    p.close()
    close_all()
    flushes = counts["data objects"]
    total = sum(counts.values())
    intervals = elapsed / (args.interval_ms / 1000)
    return {"partitions": partitions, "interval_ms": interval_ms, "seconds": elapsed, "counts": counts,
            "flushes": flushes, "puts": total, "puts_per_flush": total / flushes if flushes else float("nan"),
            "table_puts": sum(counts[k] for _, k in TABLE_KINDS),
            "table_puts_per_interval": sum(counts[k] for _, k in TABLE_KINDS) / intervals,
            "commits_per_interval": counts["table commits"] / intervals,
            "publications": len(latencies), "committed": committed,
            "p50_ms": pct(latencies, 50) * 1000, "p99_ms": pct(latencies, 99) * 1000}


def freshness(args) -> list[float]:
    """(b): seconds from commit_transaction() returning to the rows being read through delta-rs."""
    from deltalake import DeltaTable

    p, url = new_producer(4, args.interval_ms, "freshness")
    uri = table_uri(url, TOPIC)
    rng = random.Random(7)
    out: list[float] = []
    expected = 0
    for n in range(args.freshness):
        time.sleep(rng.uniform(0, args.interval_ms / 1000))
        p.begin_transaction()
        for i in range(10):
            p.produce(TOPIC, f"{n}:{i}".encode(), partition=i % 4)
        p.commit_transaction(60)
        committed_at = time.monotonic()
        expected += 10
        while True:
            try:
                rows = pa.table(DeltaTable(uri).scan()).num_rows
            except Exception:  # noqa: BLE001 - no table yet (the first publication is still to come)
                rows = -1
            if rows >= expected:
                out.append(time.monotonic() - committed_at)
                break
            if time.monotonic() - committed_at > 60:
                raise RuntimeError(f"transaction {n} not visible in {uri} after 60 s ({rows} of {expected} rows)")
            time.sleep(args.poll_ms / 1000)
        assert rows == expected, (rows, expected)  # nothing more than was committed
    p.close()
    close_all()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--transactions", type=int, default=60, help="(a) transactions per run")
    ap.add_argument("--records", type=int, default=256, help="(a) records per transaction (100-byte values)")
    ap.add_argument("--pace-ms", type=int, default=200, help="(a) one transaction every this many ms")
    ap.add_argument("--interval-ms", type=int, default=1000, help="lake.publish.interval.ms")
    ap.add_argument("--freshness", type=int, default=50, help="(b) transactions measured")
    ap.add_argument("--poll-ms", type=int, default=20, help="(b) delta-rs polling period")
    args = ap.parse_args(argv)
    print(f"bench_publish {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M UTC}; {machine()}")
    puts = PutCounter(kind)
    timer = PublishTimer()

    runs = [cost_run(parts, interval, args, puts, timer) for parts in (1, 64) for interval in (0, args.interval_ms)]
    print(f"\n(a) publication cost: {args.transactions} transactions of {args.records} records, one every "
          f"{args.pace_ms} ms; lake.publish.interval.ms {args.interval_ms} (on) or 0 (off)")
    kinds = sorted(set().union(*(r["counts"] for r in runs)))
    rows = [[f"{r['partitions']} partitions, publication {'on' if r['interval_ms'] else 'off'}", f"{r['seconds']:.1f}",
             r["flushes"], *(r["counts"][k] for k in kinds), r["puts"], f"{r['puts_per_flush']:.2f}",
             f"{r['table_puts_per_interval']:.2f}",
             f"{r['publications']} ({r['committed']})" if r["interval_ms"] else "-",
             f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f}" if r["interval_ms"] else "-"] for r in runs]
    print(fmt_table(rows, ["run", "s", "flushes", *kinds, "PUTs", "PUTs/flush", "table PUTs/interval",
                           "publications (committed)", "publish ms p50 / p99"]))
    for parts in (1, 64):
        off, on = [r for r in runs if r["partitions"] == parts]
        extra = on["puts_per_flush"] - off["puts_per_flush"]
        print(f"{parts} partitions: publication adds {extra:+.2f} PUTs per flush; tables' PUTs per interval "
              f"{on['table_puts_per_interval']:.2f} ({on['commits_per_interval']:.2f} of them commits) -> goal (<= 1) "
              f"{'MET' if on['table_puts_per_interval'] <= 1 else 'NOT MET'}")

    seconds = freshness(args)
    p50, p99 = pct(seconds, 50), pct(seconds, 99)
    goal = args.interval_ms / 1000 + 1
    print(f"\n(b) freshness, lake.publish.interval.ms {args.interval_ms}, {len(seconds)} transactions: commit_transaction() "
          f"-> visible through delta-rs p50 {p50:.2f} s, p99 {p99:.2f} s, min {min(seconds):.2f} s, max {max(seconds):.2f} s "
          f"-> goal (p99 <= {goal:g} s) {'MET' if p99 <= goal else 'NOT MET'}")


if __name__ == "__main__":
    main()
