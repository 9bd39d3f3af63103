"""Consumer-group benchmarks (the consumer-groups issue):

1. Rebalance time of a group of 10 members over a 100-partition topic, eager
   (``range``) vs cooperative (``cooperative-sticky``): (a) from the first subscribe until
   every partition is owned by exactly one member and every member has its share; (b) an
   11th member joins: from its subscribe until the assignment is complete and stable
   again (the 11th has its share), with the partitions revoked on the way (eager revokes
   all 100). Ownership is tracked with the on_assign/on_revoke/on_lost callbacks.
2. End-to-end exactly-once copy throughput (``txlake.group_copier.run_group``: one
   transactional producer per worker, ``send_offsets_to_transaction`` per batch) with 1, 2
   and 4 workers, vs a plain at-least-once copy of the same data (one consumer + the
   idempotent producer, flush then commit offsets every batch, no transactions). Every
   copy is checked with a read_committed scan of its target: as many records as the
   source, each source record once.

Run:  .venv/bin/python benchmarks/bench_groups.py [--records 200000] [--rebalance-runs 3] [--copy-runs 2]

The members and workers are threads of this process (the group coordinator lives in the
writer of the storage root), so they share the machine's cores (2 on the project's machine)
and one GIL: more workers than cores add no CPU. What extra workers can still do is overlap
one worker's Python work (decode, derive, produce) with another's wait for its flush and
commit (I/O, the GIL released). Ratios are "plain copy time / exactly-once
copy time" on the same records (1.0 = as fast as the at-least-once copy).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time

import pyarrow as pa

sys.path.insert(0, os.path.dirname(__file__))
from common import fresh_root, machine  # noqa: E402

from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from txlake.copier import derive  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402
from txlake.group_copier import run_group  # noqa: E402

#: broker settings (the first client of a storage root fixes them): no initial rebalance delay,
#: short session timeouts allowed
BROKER_CONF = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 100,
               "transaction.state.log.num.partitions": 3}
MEMBER_CONF = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 100, "max.poll.interval.ms": 10_000,
               "auto.offset.reset": "earliest", "enable.auto.commit": False}
TOPIC_PARTITIONS = 100
MEMBERS = 10
QUIET_S = 1.0          # no callback for this long after the assignment is complete: "stable"
WAIT_S = 120.0

COPY_PARTITIONS = 8
BATCH_RECORDS = 5_000


# ====================================================================== 1. rebalances
class Ownership:
    """Who owns which partition, from the members' rebalance callbacks."""

    def __init__(self, partitions: int):
        self.partitions = partitions
        self.lock = threading.Lock()
        self.owners: dict[int, set[str]] = {p: set() for p in range(partitions)}
        self.events: list[tuple[float, str, str, int]] = []   # (time, member, kind, partitions)
        self.complete_at: float | None = None                  # when the state last became complete
        self.expected: list[str] = []

    def callback(self, member: str, kind: str):
        def record(consumer, partitions):
            now = time.perf_counter()
            with self.lock:
                for tp in partitions:
                    if kind == "assign":
                        self.owners[tp.partition].add(member)
                    else:
                        self.owners[tp.partition].discard(member)
                self.events.append((now, member, kind, len(partitions)))
                if self._complete():
                    if self.complete_at is None:
                        self.complete_at = now
                else:
                    self.complete_at = None
        return record

    def expect(self, members: list[str]) -> None:
        with self.lock:
            self.expected = list(members)
            self.complete_at = None
            if self._complete():
                self.complete_at = time.perf_counter()

    def _complete(self) -> bool:
        """Every partition owned by exactly one member, every expected member has its share."""
        if not self.expected or any(len(o) != 1 for o in self.owners.values()):
            return False
        counts = {m: 0 for m in self.expected}
        for o in self.owners.values():
            (m,) = o
            if m not in counts:
                return False
            counts[m] += 1
        return min(counts.values()) >= self.partitions // len(self.expected)

    def counts(self) -> dict[str, int]:
        with self.lock:
            out: dict[str, int] = {}
            for o in self.owners.values():
                for m in o:
                    out[m] = out.get(m, 0) + 1
            return out

    def given_up_since(self, since: float) -> int:
        """Partitions revoked or lost (summed over members) since ``since``."""
        with self.lock:
            return sum(n for t, _, kind, n in self.events if t >= since and kind in ("revoke", "lost"))


class PollingMember:
    """A subscribed consumer whose thread subscribes, then consumes in a loop."""

    def __init__(self, conf: dict, name: str, topic: str, ownership: Ownership):
        self.name = name
        self.topic = topic
        self.ownership = ownership
        self.consumer = Consumer({**conf, "client.id": name})
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"member-{name}", daemon=True)

    def _run(self) -> None:
        try:
            self.consumer.subscribe([self.topic], on_assign=self.ownership.callback(self.name, "assign"),
                                    on_revoke=self.ownership.callback(self.name, "revoke"),
                                    on_lost=self.ownership.callback(self.name, "lost"))
            while not self.stop.is_set():
                self.consumer.consume(100, 0.05)
        except BaseException as exc:
            self.error = exc

    def generation(self) -> int:
        return self.consumer.consumer_group_metadata().generation_id


def wait_stable(ownership: Ownership, members: list[PollingMember], what: str) -> float:
    """Wait until the assignment is complete, every member is in the same generation and no
    callback ran for QUIET_S; return when it became complete (perf_counter time)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        errors = [m.error for m in members if m.error is not None]
        if errors:
            raise RuntimeError(f"a member failed during {what}: {errors!r}")
        with ownership.lock:
            done_at = ownership.complete_at
            last_event = ownership.events[-1][0] if ownership.events else 0.0
        if done_at is not None and time.perf_counter() - last_event >= QUIET_S \
                and len({m.generation() for m in members}) == 1:
            return done_at
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: no complete, stable assignment after {WAIT_S} s; owners per member "
                               f"{ownership.counts()}, generations {[m.generation() for m in members]}")
        time.sleep(0.01)


def rebalance_run(strategy: str) -> dict[str, float]:
    """One run on a fresh storage root: 10 members form the group, then an 11th joins."""
    conf = {"storage.url": fresh_root(), **BROKER_CONF}
    admin = AdminClient(conf)      # holds the engine open for the whole run
    admin.create_topics([NewTopic("rb", TOPIC_PARTITIONS)])["rb"].result()
    # warm-up: start the group coordinator (creates and loads __consumer_offsets) outside the timings
    with Consumer({**conf, **MEMBER_CONF, "group.id": "warmup"}) as warm:
        warm.subscribe(["rb"])
        warm.consume(1, 0.2)
    group_conf = {**conf, **MEMBER_CONF, "group.id": "bench", "partition.assignment.strategy": strategy}
    ownership = Ownership(TOPIC_PARTITIONS)
    members = [PollingMember(group_conf, f"m{i:02d}", "rb", ownership) for i in range(MEMBERS + 1)]
    first, joiner = members[:MEMBERS], members[MEMBERS]
    try:
        ownership.expect([m.name for m in first])
        start = time.perf_counter()
        for m in first:
            m.thread.start()
        formed = wait_stable(ownership, first, "the initial join") - start
        generation_before = first[0].generation()

        ownership.expect([m.name for m in members])
        joined = time.perf_counter()
        joiner.thread.start()
        rejoined = wait_stable(ownership, members, "the 11th member's join") - joined
        counts = ownership.counts()
        return {"initial_s": formed, "initial_generations": generation_before, "join_s": rejoined,
                "revoked": ownership.given_up_since(joined), "generations": members[0].generation() - generation_before,
                "joiner_partitions": counts.get(joiner.name, 0)}
    finally:
        for m in members:
            m.stop.set()
        for m in members:
            if m.thread.ident:
                m.thread.join(30)
        closers = [threading.Thread(target=m.consumer.close) for m in members]
        for t in closers:
            t.start()
        for t in closers:
            t.join(60)
        admin.close()
        close_all()


# ====================================================================== 2. copy throughput
def copy_root(n: int) -> dict:
    """A fresh storage root with the source topic (``n`` small JSON records, 8 partitions) and
    the target topic, and its group and transaction coordinators started (outside the timings).
    The same records every time."""
    conf = {"storage.url": fresh_root(), **BROKER_CONF}
    with AdminClient(conf) as admin:
        for topic in ("src", "dst"):
            admin.create_topics([NewTopic(topic, COPY_PARTITIONS)])[topic].result()
    values = [json.dumps({"origin": f"o{i % 13}", "dest": f"d{i % 101}", "arr_delay": i % 97 - 20},
                         separators=(",", ":")).encode() for i in range(n)]
    with Producer(conf) as producer:
        producer.produce_arrow("src", pa.table({"value": pa.array(values, pa.binary()),
                                                "partition": pa.array([i % COPY_PARTITIONS for i in range(n)],
                                                                      pa.int32())}),
                               key=None, partition="partition")
        producer.flush(120)
    with Consumer({**conf, "group.id": "warmup"}) as warm:     # the group coordinator
        warm.subscribe(["src"])
        warm.consume(1, 0.2)
    with Producer({**conf, "transactional.id": "warmup"}) as warm:   # the transaction coordinator
        warm.init_transactions(60)
    return conf


def plain_copy(conf: dict, n: int) -> float:
    """At-least-once: consume a batch, produce the derived records (idempotent producer), flush,
    commit the offsets; until ``n`` records are copied. Returns the seconds to the last commit."""
    consumer = Consumer({**conf, "group.id": "plain", "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "partition.assignment.strategy": "cooperative-sticky"})
    producer = Producer({**conf, "linger.ms": 5})
    start = time.perf_counter()
    consumer.subscribe(["src"])
    copied = 0
    deadline = time.monotonic() + 600
    while copied < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"plain copy stuck at {copied} of {n} records")
        msgs = [m for m in consumer.consume(BATCH_RECORDS, 0.2) if m.error() is None]
        if not msgs:
            continue
        for m in msgs:
            key, value = derive(m.value(), m.partition(), m.offset())
            producer.produce("dst", value=value, key=key, partition=m.partition())
        if producer.flush(60) != 0:
            raise RuntimeError("plain copy: records still undelivered after flush")
        consumer.commit(asynchronous=False)
        copied += len(msgs)
    took = time.perf_counter() - start
    consumer.close()
    producer.close()
    return took


def group_copy(conf: dict, n: int, workers: int) -> tuple[float, float, dict[int, int], int]:
    """Exactly-once copy by ``workers`` transactional workers (run_group). Returns the seconds to
    the last committed transaction, run_group's wall time (it also polls the committed offsets
    every 0.5 s, stops the workers and waits for every transaction to be decided), the records
    per worker and the number of aborted transactions."""
    lock = threading.Lock()
    state = {"committed": 0, "last": None, "aborted": 0}

    def emit(event: str, **fields) -> None:
        with lock:
            if event == "committed":
                state["committed"] += fields["records"]
                state["last"] = time.perf_counter()
            elif event == "aborted":
                state["aborted"] += 1

    start = time.perf_counter()
    copied = run_group(conf, "src", "dst", f"copy{workers}", workers, emit, batch_records=BATCH_RECORDS,
                       timeout_s=600)
    wall = time.perf_counter() - start
    if state["committed"] != n:
        raise RuntimeError(f"{workers} workers committed {state['committed']} records, expected {n}")
    return state["last"] - start, wall, copied, state["aborted"]


def verify_target(conf: dict, n: int) -> int:
    """read_committed scan of the target: the number of records; fails unless every source record
    (p, o) is there exactly once, in target partition p."""
    c = Consumer({**conf, "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("dst", p) for p in range(COPY_PARTITIONS)])
    seen: set[tuple[int, int]] = set()
    count = 0
    while msgs := c.consume(10_000, 0.5):
        for m in msgs:
            if m.error() is not None:
                continue
            count += 1
            src = tuple(json.loads(m.value())["src"])
            if src in seen or src[0] != m.partition():
                raise RuntimeError(f"source record {src} copied twice or to partition {m.partition()}")
            seen.add(src)
    c.close()
    if count != n:
        raise RuntimeError(f"the target holds {count} records, the source {n}")
    return count


# ====================================================================== main
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200_000, help="records of the copy benchmark")
    ap.add_argument("--rebalance-runs", type=int, default=3, help="runs per strategy (the median is printed)")
    ap.add_argument("--copy-runs", type=int, default=2, help="runs per copy configuration (the best is printed)")
    args = ap.parse_args()
    n = args.records
    load = os.getloadavg()[0]
    print(f"# consumer-group benchmarks ({machine()}; load average {load:.2f} at start)")
    print(f"# 1. rebalances: {MEMBERS} members then an 11th, {TOPIC_PARTITIONS} partitions (empty topic), "
          f"heartbeat.interval.ms={MEMBER_CONF['heartbeat.interval.ms']}, session.timeout.ms="
          f"{MEMBER_CONF['session.timeout.ms']}; median of {args.rebalance_runs} runs [min-max]", flush=True)
    for label, strategy in (("eager", "range"), ("cooperative", "cooperative-sticky")):
        runs = [rebalance_run(strategy) for _ in range(args.rebalance_runs)]
        for key, unit in (("initial_s", "s"), ("join_s", "s")):
            vals = [r[key] for r in runs]
            print(f"{label + '_' + key:40s} {statistics.median(vals):12.3f} {unit}   "
                  f"[{min(vals):.3f}-{max(vals):.3f}]")
        print(f"{label + '_initial_generations':40s} {statistics.median(r['initial_generations'] for r in runs):12.0f}"
              f"     [{min(r['initial_generations'] for r in runs)}-{max(r['initial_generations'] for r in runs)}]")
        print(f"{label + '_join_revoked_partitions':40s} {statistics.median(r['revoked'] for r in runs):12.0f}"
              f"     [{min(r['revoked'] for r in runs)}-{max(r['revoked'] for r in runs)}]")
        print(f"{label + '_join_generations':40s} {statistics.median(r['generations'] for r in runs):12.0f}"
              f"     [{min(r['generations'] for r in runs)}-{max(r['generations'] for r in runs)}]")
        print(f"{label + '_joiner_partitions':40s} {statistics.median(r['joiner_partitions'] for r in runs):12.0f}",
              flush=True)

    print(f"# 2. copy: {n:,} JSON records (~60 B) in {COPY_PARTITIONS} partitions, batches of {BATCH_RECORDS:,}; "
          f"best of {args.copy_runs} runs; time to the last commit, verified by a read_committed scan of the target")
    print(f"# the workers are threads of this process: {os.cpu_count()} cores and one GIL, so more workers than cores "
          f"add no CPU, they only overlap one worker's Python work with another's commit waits", flush=True)
    best: dict[int, tuple] = {}        # workers (0 = the plain copy) -> the fastest run's results
    for _ in range(args.copy_runs):    # interleaved, so that the machine's load drifts over all of them alike
        for workers in (0, 1, 2, 4):
            conf = copy_root(n)
            result = (plain_copy(conf, n), None, None, None) if workers == 0 else group_copy(conf, n, workers)
            verify_target(conf, n)
            close_all()
            if workers not in best or result[0] < best[workers][0]:
                best[workers] = result
    plain = best[0][0]
    print(f"{'plain_at_least_once_s':40s} {plain:12.3f} s   {n / plain:10,.0f} records/s", flush=True)
    for workers in (1, 2, 4):
        took, wall, copied, aborted = best[workers]
        print(f"{f'exactly_once_{workers}_workers_s':40s} {took:12.3f} s   {n / took:10,.0f} records/s   "
              f"ratio {plain / took:.2f}   (run_group wall {wall:.2f} s; per worker "
              f"{[copied[i] for i in sorted(copied)]}; aborted txns {aborted})", flush=True)
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
