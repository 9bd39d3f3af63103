"""``txlake serve`` consume path alone (issue 16): confluent-kafka reading the same records
several times from one server, to tell the cold read (Parquet decode) from the warm one
(the reader's cache of decoded segments) and to profile the Fetch path.

Run:  .venv/bin/python benchmarks/bench_server_consume.py [--records 100000] [--runs 4] [--pid-file F]

The records (1 KB values, 4 partitions) are written by the in-process Producer before the
server starts, so run 0 decodes every segment and later runs are served from the cache.
Per run: MB/s of payload, the server's CPU (user + system, from /proc) per MB and this
process's CPU per MB (confluent-kafka: librdkafka's threads and the Python loop). With
``--pid-file``, the server's pid is written there and the runs wait 3 s, so that a profiler
can attach: ``.venv/bin/py-spy record -p PID -f raw -o out.txt --nonblocking``.

Then a raw DuckDB scan of the same objects (``read_parquet``, every column), and, whenever
dev/kafka_reference.sh fetched its jars (``--no-reference`` skips it), Apache Kafka 4.3.1 on
this machine as the reference (issue 18): the same records produced into it with
confluent-kafka, then read back the same way ``--runs`` times (the broker's page cache holds
them: every run is warm). Printed: each side's best MB/s, the ratio txlake / Kafka, and each
one's ratio to the raw DuckDB scan, which tells whether a Kafka client can reach issue 16's
consume goal (>= 0.5 of the scan) on this machine at all.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_server import (TOPIC, bench_consume_wire, bench_duckdb_scan, bench_produce_inprocess,  # noqa: E402,F401
                          bench_produce_wire, cpu_seconds, create, start_reference, start_server, workload,
                          workload_parser)
from common import fresh_root  # noqa: E402


def main() -> None:
    parser = workload_parser()
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--pid-file")
    args = parser.parse_args()
    keys, values, mb = workload(args)
    url = fresh_root()
    create(url, args.partitions)
    bench_produce_inprocess(url, keys, values, args.partitions)
    proc, bootstrap = start_server(url, [])
    try:
        if args.pid_file:
            with open(args.pid_file, "w") as f:
                f.write(str(proc.pid))
            time.sleep(3)
        txlake = consume_runs("txlake serve", proc.pid, bootstrap, args, mb)
    finally:
        proc.terminate()
        proc.wait(60)
    t_duck = bench_duckdb_scan(url)
    print(f"raw DuckDB scan of the same objects: {mb / t_duck:7.1f} MB/s; txlake serve (best warm run) / scan "
          f"{mb / min(txlake[1:] or txlake) / (mb / t_duck):.3f}", flush=True)
    kafka = start_reference(args)
    if kafka is None:
        return
    try:
        bench_produce_wire(kafka.bootstrap, keys, values, args.partitions)
        ref = consume_runs("Apache Kafka", kafka.pid, kafka.bootstrap, args, mb)
    finally:
        kafka.stop()
    best_txlake, best_kafka = min(txlake[1:] or txlake), min(ref)
    print(f"best: txlake serve {mb / best_txlake:.1f} MB/s, Apache Kafka {mb / best_kafka:.1f} MB/s: txlake / Kafka "
          f"{best_kafka / best_txlake:.2f}; Kafka / raw DuckDB scan {t_duck / best_kafka:.3f}; "
          f"txlake / raw DuckDB scan {t_duck / best_txlake:.3f}")


def consume_runs(name: str, pid: int, bootstrap: str, args, mb: float) -> list[float]:
    """``args.runs`` reads of every record from ``bootstrap`` (the broker's process ``pid``),
    each printed with MB/s and the broker's and this process's CPU per MB; their wall times (s)."""
    times = []
    for run in range(args.runs):
        server0, client0 = cpu_seconds(pid), time.process_time()
        elapsed = bench_consume_wire(bootstrap, args.records, args.partitions)
        server1, client1 = cpu_seconds(pid), time.process_time()
        times.append(elapsed)
        print(f"{name} run {run} ({'cold' if run == 0 and name == 'txlake serve' else 'warm'}): {mb / elapsed:7.1f} "
              f"MB/s; server CPU {(server1 - server0) / mb * 1000:.1f} ms/MB, client CPU "
              f"{(client1 - client0) / mb * 1000:.1f} ms/MB", flush=True)
    return times


if __name__ == "__main__":
    main()
