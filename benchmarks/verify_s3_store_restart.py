"""A ``txlake verify`` campaign on S3 (a SeaweedFS server of its own, tests/s3_server.py) under
object-store faults and the process fault ``store-restart``: the server is stopped and started
again (same ports and data) once in every trial, while the producers and consumers run.

    .venv/bin/python benchmarks/verify_s3_store_restart.py TRIALS SEED

Prints the campaign's lines and one summary line (trials, operations, anomalies by kind, roots
reopened after a lost race, process and object-store faults by kind, seconds); exits 1 on any
anomaly. The figures are in docs/reliability.md.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from s3_server import SeaweedS3Server  # noqa: E402

from txlake.catalog.faults import injected_totals  # noqa: E402
from txlake.verify.campaign import run_campaign  # noqa: E402

#: the object-store faults of the run (docs/reliability.md, "Object-store faults")
FAULTS = {"storage.faults.cas.race.rate": 0.02, "storage.faults.list.lag.rate": 0.3,
          "storage.faults.list.lag.ms": 500, "storage.faults.get.error.rate": 0.02,
          "storage.faults.put.error.rate": 0.02, "storage.faults.put.timeout.rate": 0.02}


def main(trials: int, seed: int) -> int:
    with SeaweedS3Server() as server:
        options = {**server.storage_options(), **FAULTS, "storage.faults.seed": seed}
        conf = {"storage.url": f"s3://{server.bucket}/{uuid.uuid4().hex}", "storage.options": options}
        t0 = time.monotonic()
        report = run_campaign(conf, trials, seed, process_faults=("store-restart",), store_restart=server.restart)
        print(f"{report.trials} trials, {report.operations} operations, anomalies {report.anomalies}, "
              f"reopened {report.reopened}, process faults {report.process_faults}, "
              f"object-store faults {injected_totals()}, {time.monotonic() - t0:.0f} s")
    return 0 if report.clean else 1


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
