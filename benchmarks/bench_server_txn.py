"""``txlake serve`` with transactions and Kafka's own tools, against Apache Kafka (issue 18).

Run:  .venv/bin/python benchmarks/bench_server_txn.py [--records 100000] [--value-bytes 1000]
          [--copy-records 100000] [--profile prof.txt] [--no-reference] [--only PART ...]

``--only`` (repeatable) runs only some parts: ``txn``, ``perf``, ``perf-big``, ``e2e``, ``copy``
(Apache Kafka is not started when only ``txn`` runs: it has no reference part).

* txn vs idempotent: confluent-kafka through ``txlake serve``, ``--records`` records of
  ``--value-bytes`` B over ``--partitions`` partitions, ``linger.ms=5``, acks=all: an idempotent
  producer, then a transactional one that commits every ``--commit-ms`` (100) ms (it produces for
  that long, then ``commit_transaction``), alternately ``--rounds`` times on the same server;
  ratio = idempotent time / transactional time (issue 3's goal ≥ 0.9).
* ProducerPerformance (kafka-tools 4.3.1, ``--record-size`` 1 000 B, acks=all, no throttle)
  against ``txlake serve`` and against Apache Kafka: records/s, MB/s, p50/p99 latency of each
  and the throughput ratio txlake / Kafka; once with the Java client's defaults
  (``--perf-records``), once with bigger batches (:data:`BIG_BATCHES`, ``--perf-big-records``).
* EndToEndLatency (kafka-tools, acks=all, 1 000 B): one record at a time, produce to consume;
  average and p50/p99 of each broker.
* TransactionalMessageCopier: VerifiableProducer seeds ``--copy-records`` records into a
  2-partition input topic; two copiers (one per partition, transaction size 500, the
  group-metadata API) copy it to the output; wall time from their start until both exit, and
  the ratio Kafka time / txlake time.
* ``--profile PATH``: one more ProducerPerformance run against a server started under py-spy
  (sampled at 100 Hz, idle threads left out); the raw stacks go to PATH and the functions that
  take the server's CPU are printed (self and inclusive shares of the samples).

Kafka runs after txlake's server stopped (one broker at a time on the shared cores), as
bench_server.py does; the JVM tools keep the JVM's default options (full JIT).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from bench_server import (TOPIC, cpu_seconds, create, payloads, produce_all, start_reference,  # noqa: E402
                          workload_parser)
from common import fresh_root, machine  # noqa: E402
from kafka_reference import ensure_kafka_jars, tool_command  # noqa: E402

SERVE_PREFIX = "txlake serve: listening on "
#: ProducerPerformance's summary line
PERF_LINE = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
                       r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th")


# ---------------------------------------------------------------------------- the server
def start_server(url: str, settings: list[str], profile: str | None = None) -> tuple[subprocess.Popen, int, str]:
    """``txlake serve`` on ``url`` (under ``py-spy record`` when ``profile``): the process, the
    server's own pid and its bootstrap address."""
    extra = [a for s in settings for a in ("--config", s)]
    args = [sys.executable, "-m", "txlake.cli", "serve", "--storage", url, "--listen", "127.0.0.1:0", *extra]
    if profile:
        spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        args = [spy, "record", "--rate", "100", "--format", "raw", "--nonblocking", "-o", profile, "--", *args]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    while True:
        line = proc.stdout.readline().decode()
        assert line, "txlake serve exited before listening"
        if line.startswith(SERVE_PREFIX):
            break
    pid = proc.pid
    if profile:  # the server is py-spy's child
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        pid = int(children[0])
    return proc, pid, line[len(SERVE_PREFIX):].strip()


def stop_server(proc: subprocess.Popen, pid: int) -> None:
    os.kill(pid, signal.SIGTERM)
    proc.wait(120)


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, n, 1, config={"max.message.bytes": str(16 << 20)})
                                       for t, n in topics.items()]).values():
        future.result(60)
    for topic, n in topics.items():
        while len(admin.list_topics(topic, timeout=30).topics[topic].partitions) < n:
            time.sleep(0.05)


# ---------------------------------------------------------------------------- (a) txn vs idempotent
def produce_idempotent(bootstrap: str, keys, values, partitions: int) -> float:
    from confluent_kafka import Producer as KafkaProducer

    p = KafkaProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                       "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 2_000_000})
    return produce_all(p, keys, values, partitions)


def produce_transactional(bootstrap: str, keys, values, partitions: int, commit_ms: int) -> tuple[float, int]:
    """Produce every record in transactions of ``commit_ms`` of producing each: (wall s, commits)."""
    from confluent_kafka import Producer as KafkaProducer

    p = KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:8]}",
                       "linger.ms": 5, "queue.buffering.max.messages": 1_000_000,
                       "queue.buffering.max.kbytes": 2_000_000})
    p.init_transactions(60)
    start = time.perf_counter()
    i, n, commits = 0, len(values), 0
    while i < n:
        p.begin_transaction()
        until = time.perf_counter() + commit_ms / 1000
        while i < n and time.perf_counter() < until:
            try:
                p.produce(TOPIC, value=values[i], key=keys[i], partition=i % partitions)
                i += 1
            except BufferError:
                p.poll(0.01)
            if i % 1000 == 0:
                p.poll(0)
        p.commit_transaction(120)
        commits += 1
    return time.perf_counter() - start, commits


# ---------------------------------------------------------------------------- Kafka's tools
#: ProducerPerformance's "bigger batches" run: librdkafka's default request size (1 MB batches,
#: requests up to 10 MB) instead of the Java client's 16 KB batches and 1 MB requests
BIG_BATCHES = ("batch.size=1048576", "linger.ms=50", "max.request.size=10485760", "buffer.memory=268435456")


def producer_performance(bootstrap: str, topic: str, records: int, record_size: int, props: tuple = ()) -> dict:
    """ProducerPerformance, acks=all, no throttle, the Java client's defaults unless ``props``:
    its summary as a dict (records/s, MB/s, ms)."""
    out = subprocess.run(tool_command("ProducerPerformance", "--topic", topic, "--num-records", str(records),
                                      "--record-size", str(record_size), "--throughput", "-1", "--producer-props",
                                      f"bootstrap.servers={bootstrap}", "acks=all", *props, heap="1g", jvm_options=()),
                         capture_output=True, text=True, timeout=900)
    found = [m for m in map(PERF_LINE.search, out.stdout.splitlines()) if m]
    assert out.returncode == 0 and found, f"ProducerPerformance exited {out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
    m = found[-1]
    return {"records_s": float(m[2]), "mb_s": float(m[3]), "avg_ms": float(m[4]), "max_ms": float(m[5]),
            "p50_ms": int(m[6]), "p95_ms": int(m[7]), "p99_ms": int(m[8]), "p999_ms": int(m[9])}


def end_to_end_latency(bootstrap: str, topic: str, records: int, record_size: int) -> dict:
    """EndToEndLatency, acks=all: its average and percentiles (ms)."""
    out = subprocess.run(tool_command("EndToEndLatency", "--bootstrap-server", bootstrap, "--topic", topic,
                                      "--num-records", str(records), "--producer-acks", "all",
                                      "--record-size", str(record_size), jvm_options=()),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"EndToEndLatency exited {out.returncode}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
    avg = re.search(r"Avg latency: ([\d.]+) ms", out.stdout)
    pct = re.search(r"Percentiles: 50th = (\d+), 99th = (\d+), 99.9th = (\d+)", out.stdout)
    assert avg and pct, out.stdout[-2000:]
    return {"avg_ms": float(avg[1]), "p50_ms": int(pct[1]), "p99_ms": int(pct[2]), "p999_ms": int(pct[3])}


def copy_run(bootstrap: str, records: int, transaction_size: int = 500) -> dict:
    """Seed ``records`` with VerifiableProducer into ``copy-in`` (2 partitions), then copy them to
    ``copy-out`` with one TransactionalMessageCopier per partition: seconds of each phase."""
    create_topics(bootstrap, {"copy-in": 2, "copy-out": 2})
    start = time.perf_counter()
    seed = subprocess.run(tool_command("VerifiableProducer", "--topic", "copy-in", "--max-messages", str(records),
                                       "--acks", "-1", "--bootstrap-server", bootstrap, jvm_options=()),
                          capture_output=True, text=True, timeout=900)
    assert seed.returncode == 0, seed.stderr[-2000:]
    seeded = time.perf_counter()
    copiers = [subprocess.Popen(tool_command(
        "TransactionalMessageCopier", "--broker-list", bootstrap, "--input-topic", "copy-in", "--input-partition",
        str(p), "--output-topic", "copy-out", "--transactional-id", f"copier-{p}", "--consumer-group", "copiers",
        "--max-messages", "-1", "--transaction-size", str(transaction_size), "--use-group-metadata",
        jvm_options=()), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for p in range(2)]
    copied = 0
    for c in copiers:
        out, _ = c.communicate(timeout=1800)
        assert c.returncode == 0, out[-2000:]
        last = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
        assert last["stage"] == "ShutdownComplete", last
        copied += last["totalProcessed"]
    assert copied == records, (copied, records)
    return {"seed_s": seeded - start, "copy_s": time.perf_counter() - seeded}


def run_tools(bootstrap: str, pid: int, name: str, label: str, what: str, args, parts: set, results: dict) -> None:
    """Kafka's tools against one broker (``name``: the results' prefix), the parts asked for."""
    if "perf" in parts:
        cpu0 = cpu_seconds(pid)
        results[f"{name}_perf"] = producer_performance(bootstrap, "perf", args.perf_records, args.value_bytes)
        results[f"{name}_perf_cpu_ms_per_mb"] = ((cpu_seconds(pid) - cpu0)
                                                 / (args.perf_records * args.value_bytes / 1e6) * 1000)
        print(f"ProducerPerformance -> {label}: {results[f'{name}_perf']}; {what} CPU "
              f"{results[f'{name}_perf_cpu_ms_per_mb']:.1f} ms/MB")
    if "perf-big" in parts:
        results[f"{name}_perf_big"] = producer_performance(bootstrap, "perf", args.perf_big_records, args.value_bytes,
                                                           BIG_BATCHES)
        print(f"ProducerPerformance {BIG_BATCHES} -> {label}: {results[f'{name}_perf_big']}")
    if "e2e" in parts:
        results[f"{name}_e2e"] = end_to_end_latency(bootstrap, "e2e", args.latency_records, args.value_bytes)
        print(f"EndToEndLatency -> {label}: {results[f'{name}_e2e']}")
    if "copy" in parts:
        results[f"{name}_copy"] = copy_run(bootstrap, args.copy_records)
        print(f"TransactionalMessageCopier, {args.copy_records} records -> {label}: {results[f'{name}_copy']}")


# ---------------------------------------------------------------------------- the profile
#: stacks through these frames are the server's start-up (imports, taking the lease), not the run
STARTUP_FRAMES = ("_find_and_load", "Broker.ensure_writer")
#: a sampled frame that is one of these is a thread waiting, not working
WAITING_FRAMES = ("Condition.wait", "EpollSelector.select", "_worker (thread.py)", "Event.wait", "Thread.join",
                  "lock.acquire", "sleep")


def summarise_profile(path: str, top: int = 15) -> None:
    """Print the functions with the most samples in py-spy's raw output, leaving out the
    server's start-up and waiting threads: self (the sampled frame) and inclusive (anywhere on
    the stack), as shares of the working samples."""
    self_counts: Counter = Counter()
    incl_counts: Counter = Counter()
    total = startup = waiting = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [re.sub(r" \((.*/)?([^/]+):\d+\)$", r" (\2)", f) for f in stack.split(";")]
        if any(s in f for f in frames for s in STARTUP_FRAMES):
            startup += n
            continue
        if any(frames[-1].startswith(w) for w in WAITING_FRAMES):
            waiting += n
            continue
        total += n
        self_counts[frames[-1]] += n
        for f in set(frames):
            incl_counts[f] += n
    print(f"# profile of txlake serve during ProducerPerformance: {total} working samples at 100 Hz "
          f"({startup} of start-up and {waiting} of waiting threads left out)")
    print("#   self:")
    for f, n in self_counts.most_common(top):
        print(f"#     {n / total:6.1%}  {f}")
    print("#   inclusive:")
    skip = ("_bootstrap", "Thread.run", "_worker (thread.py)", "<module>", "_run_module", "_run_code", "main (",
            "invoke (", "Command.__call__", "new_func", "serve_command", "_get_module_details")
    for f, n in [(f, n) for f, n in incl_counts.most_common(top * 3) if not any(s in f for s in skip)][:top]:
        print(f"#     {n / total:6.1%}  {f}")


#: the parts of a run (``--only``): txn vs idempotent, ProducerPerformance with the Java client's
#: defaults and with bigger batches, EndToEndLatency, TransactionalMessageCopier
PARTS = ("txn", "perf", "perf-big", "e2e", "copy")


def main() -> None:
    parser = workload_parser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--commit-ms", type=int, default=100)
    parser.add_argument("--perf-records", type=int, default=20_000,
                        help="ProducerPerformance with the Java client's defaults (16 KB batches)")
    parser.add_argument("--perf-big-records", type=int, default=100_000,
                        help="ProducerPerformance with bigger batches (BIG_BATCHES)")
    parser.add_argument("--latency-records", type=int, default=100,
                        help="EndToEndLatency sends one record at a time (about 0.5 s each through txlake serve)")
    parser.add_argument("--copy-records", type=int, default=100_000)
    parser.add_argument("--server-config", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--profile", metavar="PATH", help="profile the server with py-spy during ProducerPerformance")
    parser.add_argument("--only", action="append", choices=PARTS, metavar="PART",
                        help=f"run only these parts (repeatable; of {', '.join(PARTS)}; default all)")
    args = parser.parse_args()
    parts = set(args.only or PARTS)
    ensure_kafka_jars()
    keys, values = payloads(args.records, args.value_bytes)
    mb = sum(len(k) + len(v) for k, v in zip(keys, values)) / 1e6
    print(f"# {machine()}; {args.records} records of {args.value_bytes} B values, {args.partitions} partitions; "
          f"load average {os.getloadavg()[0]:.1f}")
    results: dict = {}

    url = fresh_root()
    create(url, args.partitions)
    proc, pid, bootstrap = start_server(url, args.server_config)
    try:
        if "txn" in parts:
            idem, txn, commits = [], [], []
            for _ in range(args.rounds):
                idem.append(produce_idempotent(bootstrap, keys, values, args.partitions))
                t, c = produce_transactional(bootstrap, keys, values, args.partitions, args.commit_ms)
                txn.append(t)
                commits.append(c)
            results["idempotent_mb_s"] = [mb / t for t in idem]
            results["transactional_mb_s"] = [mb / t for t in txn]
            results["transactional_commits"] = commits
            results["ratio_txn_vs_idempotent"] = [i / t for i, t in zip(idem, txn)]
            print(f"txn/idem  idempotent {', '.join(f'{mb / t:.1f}' for t in idem)} MB/s; transactional (commit every "
                  f"{args.commit_ms} ms) {', '.join(f'{mb / t:.1f}' for t in txn)} MB/s in {commits} commits; ratio "
                  f"{', '.join(f'{i / t:.2f}' for i, t in zip(idem, txn))}")
        create_topics(bootstrap, {"perf": args.partitions, "e2e": 1})
        run_tools(bootstrap, pid, "txlake", "txlake serve", "server", args, parts, results)
    finally:
        stop_server(proc, pid)

    kafka = start_reference(args) if parts - {"txn"} else None  # the txn part has no reference
    if kafka is not None:
        try:
            create_topics(kafka.bootstrap, {"perf": args.partitions, "e2e": 1})
            run_tools(kafka.bootstrap, kafka.pid, "kafka", "Apache Kafka", "broker", args, parts, results)
        finally:
            kafka.stop()
        ratios = [("ratio_perf_txlake_vs_kafka", "perf", "records_s", False, "ProducerPerformance txlake / Kafka"),
                  ("ratio_perf_big_txlake_vs_kafka", "perf_big", "records_s", False, "bigger batches txlake / Kafka"),
                  ("ratio_copy_kafka_vs_txlake", "copy", "copy_s", True, "copy time Kafka / txlake")]
        shown = []
        for name, part, figure, inverse, label in ratios:
            if f"txlake_{part}" in results and f"kafka_{part}" in results:
                t, k = results[f"txlake_{part}"][figure], results[f"kafka_{part}"][figure]
                results[name] = k / t if inverse else t / k
                shown.append(f"{label} {results[name]:.2f}")
        print(f"ratios: {'; '.join(shown)}")

    if args.profile:
        url = fresh_root()
        create(url, args.partitions)
        proc, pid, bootstrap = start_server(url, args.server_config, profile=args.profile)
        try:
            create_topics(bootstrap, {"perf": args.partitions})
            results["txlake_perf_profiled"] = producer_performance(bootstrap, "perf", args.perf_records, args.value_bytes)
        finally:
            stop_server(proc, pid)
        print(f"ProducerPerformance -> txlake serve under py-spy: {results['txlake_perf_profiled']}")
        summarise_profile(args.profile)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
