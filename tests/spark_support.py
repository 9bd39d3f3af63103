"""One local SparkSession per test process (xdist worker), shared by every Spark test.

Starting a JVM costs seconds, so the session is created on first use and kept until the
process exits. It runs ``local[2,2]`` (2 threads; a failed task is retried once, as on a
cluster) with the txlake data source registered by discovery (``pyspark_txlake``), filter pushdown to Python data sources enabled, no UI, and the Python
workers running this very interpreter (so they import the same txlake).
"""

from __future__ import annotations

import os
import sys
import threading

_lock = threading.Lock()
_session = None

#: the session config docs/spark.md recommends, plus test-only settings
SPARK_CONF = {
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
}


def spark():
    """The process's SparkSession (created on first call)."""
    global _session
    with _lock:
        if _session is None:
            os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
            os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
            from pyspark.sql import SparkSession

            builder = SparkSession.builder.master("local[2,2]").appName("txlake-tests")
            for key, value in SPARK_CONF.items():
                builder = builder.config(key, value)
            _session = builder.getOrCreate()
            _session.sparkContext.setLogLevel("ERROR")
        return _session
