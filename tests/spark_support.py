"""One local SparkSession per test process (xdist worker), shared by every Spark test.

Starting a JVM costs seconds, so the session is created on first use and kept until the
process exits. It runs ``local[2,2]`` (2 threads; a failed task is retried once, as on a
cluster) with the txlake data source registered by discovery (``pyspark_txlake``), txlake's Spark jar on
``spark.jars`` (built here when missing and a JDK is on PATH: :data:`TXLAKE_JAR`), filter pushdown
to Python data sources enabled, no UI, and the Python workers running this very interpreter (so
they import the same txlake).

When dev/fetch_delta_jars.py has fetched delta-spark for the installed PySpark, the same session
also loads it (``format("delta")``; txlake.spark_connector.delta): one JVM serves both, and the
extension leaves every other query alone. :func:`delta_spark` gives the session to the tests
of the topics' Delta tables, and skips them, saying why, when delta-spark is not there (no
release for this PySpark, or its jars not fetched).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import warnings

import pytest

from kafka_reference import FAST_START_JVM_OPTIONS
from txlake.spark_connector import jvm

_lock = threading.Lock()
_session = None


def _txlake_jar() -> str | None:
    """txlake's Spark jar for the installed PySpark, built if missing; None without a JDK."""
    try:
        return str(jvm.build_jar())
    except jvm.JarBuildError as e:
        if shutil.which("javac") is not None:
            raise  # a JDK is here: the jar must build
        warnings.warn(f"Spark tests run without txlake's Spark jar: {e}")
        return None


#: the jar on every test session's ``spark.jars`` (None: no JDK here, the jar's tests are skipped)
TXLAKE_JAR = _txlake_jar()

#: the session config docs/spark.md recommends, plus test-only settings
SPARK_CONF = {
    "spark.sql.python.filterPushdown.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "1g",
    "spark.sql.session.timeZone": "UTC",
    "spark.python.worker.reuse": "true",
    # test-only: a test's driver JVM lives seconds to a minute, mostly starting up; C1 alone
    # (no C2 recompilation) and the serial collector cut its CPU by about a third on 2 cores
    "spark.driver.extraJavaOptions": " ".join(FAST_START_JVM_OPTIONS),
    **({"spark.jars": TXLAKE_JAR} if TXLAKE_JAR else {}),
}


def _with_delta(conf: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """``conf`` with delta-spark's settings, or ``conf`` and why delta-spark is not available."""
    from txlake.spark_connector.delta import DeltaUnavailableError, delta_session_conf

    try:
        return delta_session_conf(conf), None
    except DeltaUnavailableError as e:
        return conf, str(e)


SPARK_CONF, DELTA_MISSING = _with_delta(SPARK_CONF)


def _with_s3a(conf: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """``conf`` with Hadoop's S3A (jars on the driver's class path, ``s3://`` -> S3AFileSystem),
    or ``conf`` and why S3A is not available (dev/fetch_delta_jars.py --s3a not run)."""
    from txlake.spark_connector.delta import DeltaUnavailableError, s3a_session_conf

    try:
        return s3a_session_conf(conf), None
    except DeltaUnavailableError as e:
        return conf, str(e)


SPARK_CONF, S3A_MISSING = _with_s3a(SPARK_CONF)


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


def delta_spark(storage=None):
    """The process's SparkSession with delta-spark on it. Skips the test (naming the reason)
    only when no delta-spark release exists for the installed PySpark (a PySpark the test
    extra does not pin); when one exists but its jars were not fetched, the test fails naming
    the script that fetches them, so a set-up that lost them cannot pass silently.

    ``storage`` (a conftest ``StorageTarget``) on ``s3``: its bucket's endpoint and credentials
    are set on the running session (S3A's per-bucket settings); the test fails, naming the
    script, when the S3A jars are not fetched."""
    if DELTA_MISSING is not None:
        from txlake.spark_connector.delta import DeltaUnavailableError, delta_version

        try:
            delta_version()
        except DeltaUnavailableError:
            pytest.skip(f"delta-spark is not on the Spark session: {DELTA_MISSING}")
        pytest.fail(f"delta-spark is not on the Spark session: {DELTA_MISSING} "
                    f"(run dev/setup.sh or .venv/bin/python dev/fetch_delta_jars.py)")
    s3 = storage is not None and storage.backend == "s3"
    if s3 and S3A_MISSING is not None:
        pytest.fail(f"Hadoop's S3A is not on the Spark session: {S3A_MISSING} "
                    f"(run dev/setup.sh or .venv/bin/python dev/fetch_delta_jars.py --s3a)")
    session = spark()
    if s3:
        from txlake.spark_connector.delta import apply_s3a_conf

        apply_s3a_conf(session, storage.options, bucket=storage.url[len("s3://"):].split("/", 1)[0])
    return session


# ---------------------------------------------------------------------------- shared fixtures
# (a Spark test module imports them: ``from spark_support import backend, file_storage, ...``)
@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def backend(request) -> str:
    """Spark tests run on ``file`` and ``s3`` (``memory://`` is not shared with Spark's workers)."""
    return request.param


@pytest.fixture
def file_storage(tmp_path):
    """A local storage root, for the tests that need no S3 variant."""
    from conftest import StorageTarget

    return StorageTarget(url=f"file://{tmp_path}/root", options={}, backend="file")


@pytest.fixture
def close_engines():
    """Close this process's txlake engines after the test (no writer lease left behind)."""
    yield
    from txlake.engine import registry

    registry.close_all()


def source_options(target, **extra) -> dict[str, str]:
    """Spark options of a storage root: its fsspec options as one JSON ``storage.options``."""
    out = {"storage.url": target.url}
    if target.options:
        out["storage.options"] = json.dumps(target.options)
    out.update({k: str(v) for k, v in extra.items()})
    return out
