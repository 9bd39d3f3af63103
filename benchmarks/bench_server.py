"""``txlake serve`` benchmarks (issue 16): a real Kafka client against the server subprocess.

Run:  .venv/bin/python benchmarks/bench_server.py [--records 100000] [--value-bytes 1000]

* produce: confluent-kafka's Producer (idempotent, linger.ms=5, acks=all) -> ``txlake serve``
  on a fresh file:// root: MB/s and records/s of payload (key + value) until the last
  delivery report, against the in-process ``txlake.Producer`` writing the same records to
  another fresh root in the same run (ratio = server / in-process).
* consume: confluent-kafka's Consumer reading the same records back from the server
  (read_committed), against a raw DuckDB scan of the same segment objects
  (``read_parquet`` of the topic's objects, every column; ratio = DuckDB time / consumer time).
* latency: produce at a fixed rate (default 1 000 records/s) with the default linger;
  p50 / p99 of send-to-delivery-report.
* server CPU: user+system CPU seconds of the server process per MB produced and consumed
  (from /proc/PID/stat), to say where the time goes.
* Apache Kafka as the reference (issue 18): whenever dev/kafka_reference.sh has fetched its
  jars (``--no-reference`` skips it), the same produce, bigger-request produce, consume and
  latency runs against one Apache Kafka 4.3.1 KRaft node on this machine
  (tests/kafka_reference.py, heap 1 GiB as Kafka's start script), started after txlake's
  server stopped: MB/s of each, the ratios txlake / Kafka, the broker JVM's CPU per MB, and
  Kafka's consume rate against the same raw DuckDB scan.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from common import fresh_root, machine  # noqa: E402

from txlake import AdminClient, NewTopic, Producer  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402

TOPIC = "bench"


def create(url: str, partitions: int) -> None:
    """The benchmark topic; its max.message.bytes (16 MiB) admits the bigger requests' 4 MB batches."""
    with AdminClient({"storage.url": url}) as admin:
        admin.create_topics([NewTopic(TOPIC, partitions, config={"max.message.bytes": str(16 << 20)})])[TOPIC].result()
    close_all()


def start_server(url: str, settings: list[str]) -> tuple[subprocess.Popen, str]:
    extra = [a for s in settings for a in ("--config", s)]
    proc = subprocess.Popen([sys.executable, "-m", "txlake.cli", "serve", "--storage", url, "--listen", "127.0.0.1:0", *extra],
                            stdout=subprocess.PIPE, stderr=open(os.devnull, "wb"))
    line = proc.stdout.readline().decode().strip()
    assert line.startswith("txlake serve: listening on "), line
    return proc, line.rsplit(" ", 1)[1]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def payloads(n: int, value_bytes: int) -> tuple[list[bytes], list[bytes]]:
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=n * value_bytes, dtype=np.uint8).tobytes()
    values = [raw[i * value_bytes:(i + 1) * value_bytes] for i in range(n)]
    keys = [b"key-%d" % (i % 1000) for i in range(n)]
    return keys, values


def produce_all(producer, keys, values, partitions: int, **kwargs) -> float:
    """Produce every record round-robin over the partitions (waiting when the queue is full),
    then flush: the wall time (s) until the last delivery report."""
    start = time.perf_counter()
    for i, (k, v) in enumerate(zip(keys, values)):
        while True:
            try:
                producer.produce(TOPIC, value=v, key=k, partition=i % partitions, **kwargs)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(300) == 0
    return time.perf_counter() - start


#: the producer settings of the "bigger requests" run: librdkafka's defaults cap a request at
#: message.max.bytes (1 MB), and an idempotent producer keeps at most 5 requests in flight
BIG_REQUESTS = {"message.max.bytes": 10_000_000, "batch.size": 4_000_000}


def bench_produce_wire(bootstrap: str, keys, values, partitions: int, **extra) -> float:
    from confluent_kafka import Producer as KafkaProducer

    p = KafkaProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                       "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 2_000_000,
                       **extra})
    failed: list = []
    elapsed = produce_all(p, keys, values, partitions,
                          on_delivery=lambda err, msg: failed.append(err) if err else None)
    assert not failed, failed[:3]
    return elapsed


def bench_produce_inprocess(url: str, keys, values, partitions: int) -> float:
    p = Producer({"storage.url": url, "enable.idempotence": True, "linger.ms": 5,
                  "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 2_000_000})
    elapsed = produce_all(p, keys, values, partitions)
    close_all()
    return elapsed


def bench_consume_wire(bootstrap: str, n: int, partitions: int) -> float:
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import TopicPartition

    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                       "isolation.level": "read_committed", "fetch.max.bytes": 52_428_800,
                       "max.partition.fetch.bytes": 10_485_760})
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(partitions)])
    got = 0
    start = time.perf_counter()
    while got < n:
        for m in c.consume(10_000, 1.0):
            if m.error() is None:
                got += 1
    elapsed = time.perf_counter() - start
    c.close()
    return elapsed


def bench_duckdb_scan(url: str) -> float:
    import duckdb

    files = glob.glob(url[len("file://"):] + "/**/*.parquet", recursive=True)
    files = [f for f in files if "/data/" in f or "/segments/" in f] or files
    con = duckdb.connect()
    start = time.perf_counter()
    con.sql(f"SELECT * FROM read_parquet({files!r})").arrow()
    return time.perf_counter() - start


def bench_latency(bootstrap: str, rate: int, seconds: float) -> tuple[float, float]:
    from confluent_kafka import Producer as KafkaProducer

    p = KafkaProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    latencies: list[float] = []
    interval = 1.0 / rate
    start = time.perf_counter()
    sent = 0
    while time.perf_counter() - start < seconds:
        due = start + sent * interval
        now = time.perf_counter()
        if now < due:
            p.poll(due - now)
            continue
        t0 = time.perf_counter()
        p.produce(TOPIC, value=b"x" * 100, partition=0,
                  on_delivery=lambda err, msg, t0=t0: latencies.append(time.perf_counter() - t0))
        sent += 1
    p.flush(60)
    ms = np.array(latencies) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def workload_parser() -> argparse.ArgumentParser:
    """The options every server benchmark shares: --records, --value-bytes, --partitions,
    --no-reference."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the Apache Kafka reference (run by default when dev/kafka_reference.sh fetched it)")
    return parser


def start_reference(args: argparse.Namespace):
    """Apache Kafka 4.3.1 (one KRaft node, tests/kafka_reference.py) with the benchmark topic
    (``args.partitions`` partitions, max.message.bytes 16 MiB as txlake's), or None with a
    note when ``--no-reference`` or its jars are not fetched. The caller stops it."""
    if args.no_reference:
        return None
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from kafka_reference import ApacheKafka, kafka_jars_present

    if not kafka_jars_present():
        print("# Apache Kafka reference skipped: its jars are not fetched (run dev/kafka_reference.sh)")
        return None
    from confluent_kafka.admin import AdminClient as KafkaAdmin
    from confluent_kafka.admin import NewTopic as KafkaNewTopic

    kafka = ApacheKafka(heap="1g").start()
    admin = KafkaAdmin({"bootstrap.servers": kafka.bootstrap})
    admin.create_topics([KafkaNewTopic(TOPIC, args.partitions, 1, config={"max.message.bytes": str(16 << 20)})
                         ])[TOPIC].result(60)
    while len(admin.list_topics(TOPIC, timeout=30).topics[TOPIC].partitions) < args.partitions:
        time.sleep(0.05)
    print(f"# Apache Kafka 4.3.1 on {kafka.bootstrap}: started in {kafka.start_seconds:.1f} s")
    return kafka


def workload(args: argparse.Namespace) -> tuple[list[bytes], list[bytes], float]:
    """The records of ``args`` (keys, values) and their payload in MB; prints the run's header line."""
    keys, values = payloads(args.records, args.value_bytes)
    mb = sum(len(k) + len(v) for k, v in zip(keys, values)) / 1e6
    print(f"# {machine()}; {args.records} records of {args.value_bytes} B values, {args.partitions} partitions")
    return keys, values, mb


def main() -> None:
    parser = workload_parser()
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--server-config", action="append", default=[], metavar="KEY=VALUE",
                        help="an engine setting for the server (repeatable), e.g. storage.flush.interval.ms=100")
    args = parser.parse_args()
    keys, values, mb = workload(args)

    local = fresh_root()
    create(local, args.partitions)
    t_local = bench_produce_inprocess(local, keys, values, args.partitions)

    url = fresh_root()
    create(url, args.partitions)
    proc, bootstrap = start_server(url, args.server_config)
    try:
        cpu0 = cpu_seconds(proc.pid)
        t_wire = bench_produce_wire(bootstrap, keys, values, args.partitions)
        cpu1 = cpu_seconds(proc.pid)
        t_consume = bench_consume_wire(bootstrap, args.records, args.partitions)
        cpu2 = cpu_seconds(proc.pid)
        t_big = bench_produce_wire(bootstrap, keys, values, args.partitions, **BIG_REQUESTS)
        p50, p99 = bench_latency(bootstrap, args.rate, args.latency_seconds)
    finally:
        proc.terminate()
        proc.wait(60)
    t_duck = bench_duckdb_scan(url)
    kafka = start_reference(args)
    if kafka is not None:
        try:
            k0 = cpu_seconds(kafka.pid)
            k_wire = bench_produce_wire(kafka.bootstrap, keys, values, args.partitions)
            k1 = cpu_seconds(kafka.pid)
            k_consume = bench_consume_wire(kafka.bootstrap, args.records, args.partitions)
            k2 = cpu_seconds(kafka.pid)
            k_big = bench_produce_wire(kafka.bootstrap, keys, values, args.partitions, **BIG_REQUESTS)
            k_p50, k_p99 = bench_latency(kafka.bootstrap, args.rate, args.latency_seconds)
        finally:
            kafka.stop()
    results = {
        "produce_wire_mb_s": mb / t_wire, "produce_wire_records_s": args.records / t_wire,
        "produce_inprocess_mb_s": mb / t_local, "produce_wire_big_requests_mb_s": mb / t_big, "produce_ratio_wire_vs_inprocess": t_local / t_wire,
        "server_cpu_s_per_mb_produce": (cpu1 - cpu0) / mb,
        "consume_wire_mb_s": mb / t_consume, "consume_ratio_vs_duckdb_scan": t_duck / t_consume,
        "server_cpu_s_per_mb_consume": (cpu2 - cpu1) / mb,
        "latency_p50_ms": p50, "latency_p99_ms": p99, "latency_rate_records_s": args.rate,
    }
    print(f"produce  confluent-kafka -> txlake serve: {mb / t_wire:7.1f} MB/s {args.records / t_wire:9.0f} records/s "
          f"(in-process Producer {mb / t_local:.1f} MB/s; ratio {t_local / t_wire:.2f}); "
          f"server CPU {(cpu1 - cpu0) / mb * 1000:.1f} ms/MB")
    print(f"produce  the same with {BIG_REQUESTS}: {mb / t_big:7.1f} MB/s {args.records / t_big:9.0f} records/s")
    print(f"consume  txlake serve -> confluent-kafka: {mb / t_consume:7.1f} MB/s (raw DuckDB scan of the objects "
          f"{mb / t_duck:.1f} MB/s; ratio {t_duck / t_consume:.2f}); server CPU {(cpu2 - cpu1) / mb * 1000:.1f} ms/MB")
    print(f"latency  {args.rate} records/s, default linger: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
    if kafka is not None:
        results.update({
            "kafka_produce_mb_s": mb / k_wire, "kafka_produce_big_requests_mb_s": mb / k_big,
            "kafka_consume_mb_s": mb / k_consume, "kafka_cpu_s_per_mb_produce": (k1 - k0) / mb,
            "kafka_cpu_s_per_mb_consume": (k2 - k1) / mb, "kafka_latency_p50_ms": k_p50, "kafka_latency_p99_ms": k_p99,
            "ratio_txlake_vs_kafka_produce": k_wire / t_wire, "ratio_txlake_vs_kafka_produce_big_requests": k_big / t_big,
            "ratio_txlake_vs_kafka_consume": k_consume / t_consume, "kafka_consume_ratio_vs_duckdb_scan": t_duck / k_consume,
        })
        print("Apache Kafka 4.3.1, the same client and records on this machine:")
        print(f"produce  confluent-kafka -> Kafka:       {mb / k_wire:7.1f} MB/s {args.records / k_wire:9.0f} records/s; "
              f"broker CPU {(k1 - k0) / mb * 1000:.1f} ms/MB; txlake / Kafka {k_wire / t_wire:.2f}")
        print(f"produce  the same with bigger requests:  {mb / k_big:7.1f} MB/s; txlake / Kafka {k_big / t_big:.2f}")
        print(f"consume  Kafka -> confluent-kafka:       {mb / k_consume:7.1f} MB/s; broker CPU "
              f"{(k2 - k1) / mb * 1000:.1f} ms/MB; txlake / Kafka {k_consume / t_consume:.2f}; "
              f"Kafka / raw DuckDB scan {t_duck / k_consume:.3f}")
        print(f"latency  {args.rate} records/s, default linger: p50 {k_p50:.1f} ms, p99 {k_p99:.1f} ms")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
