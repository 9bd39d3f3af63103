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
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from bench_server import (TOPIC, bench_consume_wire, bench_produce_inprocess, cpu_seconds, create,  # noqa: E402,F401
                          start_server, workload, workload_parser)
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
        for run in range(args.runs):
            server0, client0 = cpu_seconds(proc.pid), time.process_time()
            elapsed = bench_consume_wire(bootstrap, args.records, args.partitions)
            server1, client1 = cpu_seconds(proc.pid), time.process_time()
            print(f"run {run} ({'cold' if run == 0 else 'warm'}): {mb / elapsed:7.1f} MB/s; server CPU "
                  f"{(server1 - server0) / mb * 1000:.1f} ms/MB, client CPU {(client1 - client0) / mb * 1000:.1f} ms/MB",
                  flush=True)
    finally:
        proc.terminate()
        proc.wait(60)


if __name__ == "__main__":
    main()
