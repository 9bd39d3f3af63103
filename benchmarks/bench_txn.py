"""Transaction benchmarks: a transactional producer committing every 100 ms vs the idempotent
producer on the same records, and a read_committed vs read_uncommitted scan of a log with 10%
aborted transactions.

Run:  .venv/bin/python benchmarks/bench_txn.py [--records 1000000] [--runs 5]

Ratios are "idempotent (or read_uncommitted) time / transactional (or read_committed) time";
the goals are >= 0.9.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import fresh_root, machine  # noqa: E402

from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402

PARTITIONS = 4
VALUE = b"x" * 1000  # 1 KB records, as Kafka's own measurement


def setup(topic: str) -> dict:
    conf = {"storage.url": fresh_root(), "transaction.state.log.num.partitions": 3}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result()
    return conf


def send(p: Producer, i: int) -> None:
    """produce() as a confluent-kafka application does: when the queue is full
    (``queue.buffering.max.messages``, default 100 000), serve delivery reports and retry."""
    while True:
        try:
            p.produce("t", VALUE, partition=i % PARTITIONS)
            return
        except BufferError:
            p.poll(0.01)


def produce_idempotent(n: int) -> float:
    conf = setup("t")
    p = Producer(conf)
    start = time.perf_counter()
    for i in range(n):
        send(p, i)
    p.flush(120)
    took = time.perf_counter() - start
    p.close()
    close_all()
    return took


def produce_transactional(n: int, commit_every_s: float = 0.1, abort_every: int = 0) -> tuple[float, dict]:
    conf = setup("t")
    p = Producer({**conf, "transactional.id": "bench"})
    p.init_transactions(30)
    start = time.perf_counter()
    p.begin_transaction()
    opened, txns = time.perf_counter(), 0
    for i in range(n):
        send(p, i)
        if i % 1000 == 999 and time.perf_counter() - opened >= commit_every_s:
            txns += 1
            if abort_every and txns % abort_every == 0:
                p.abort_transaction(30)
            else:
                p.commit_transaction(30)
            p.begin_transaction()
            opened = time.perf_counter()
    p.commit_transaction(30)
    took = time.perf_counter() - start
    p.close()
    close_all()
    return took, conf


def scan(conf: dict, isolation: str) -> tuple[float, int]:
    c = Consumer({**conf, "isolation.level": isolation, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("t", p) for p in range(PARTITIONS)])
    start = time.perf_counter()
    got = 0
    while True:
        msgs = c.consume(10_000, 0.5)
        if not msgs:
            break
        got += len(msgs)
    took = time.perf_counter() - start - 0.5  # the final empty poll waited 0.5 s
    c.close()
    close_all()
    return took, got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5, help="runs of each producer, interleaved (medians are reported)")
    args = ap.parse_args()
    n = args.records
    results: dict[str, float] = {}
    idempotent, transactional = [], []
    produce_idempotent(n)  # warm-up (imports, the heap growing to hold the queue), not measured
    produce_transactional(n)
    for _ in range(args.runs):  # interleaved, so that a noisy moment hits both
        idempotent.append(produce_idempotent(n))
        transactional.append(produce_transactional(n)[0])
    results["idempotent_produce_s"] = statistics.median(idempotent)
    results["transactional_produce_s"] = statistics.median(transactional)
    results["txn_vs_idempotent_ratio"] = results["idempotent_produce_s"] / results["transactional_produce_s"]
    results["txn_vs_idempotent_ratio_of_best_runs"] = min(idempotent) / min(transactional)
    print("# idempotent runs (s):", " ".join(f"{t:.2f}" for t in idempotent))
    print("# transactional runs (s):", " ".join(f"{t:.2f}" for t in transactional))
    _, conf = produce_transactional(n, commit_every_s=0.0, abort_every=10)  # every 10th transaction aborted
    rc, rc_n = min(scan(conf, "read_committed") for _ in range(3))
    ru, ru_n = min(scan(conf, "read_uncommitted") for _ in range(3))
    results["read_committed_scan_s"], results["read_uncommitted_scan_s"] = rc, ru
    results["read_committed_records"], results["read_uncommitted_records"] = rc_n, ru_n
    results["read_committed_vs_uncommitted_ratio"] = ru / rc
    print(f"# transaction benchmarks ({n:,} records of 1 KB, {PARTITIONS} partitions; {machine()})")
    for k, v in results.items():
        print(f"{k:40s} {v:12.3f}" if isinstance(v, float) else f"{k:40s} {v:12,d}")


if __name__ == "__main__":
    main()
