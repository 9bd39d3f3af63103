"""How a Spark session outside the checkout finds the ``txlake`` source (issue 15).

PySpark registers Python data sources by discovery: the first time a session resolves one,
a Python worker (``pyspark.sql.worker.lookup_data_sources``) imports every top-level module
named ``pyspark_*`` that ``pkgutil.iter_modules()`` lists and registers its
``DefaultSource``. Spark starts that worker in its own working directory -- where the
driver was started -- so this test runs the driver in a subprocess whose working
directory is a temporary one outside the checkout, with this interpreter (the project's
venv) and without ``PYTHONPATH``: only the installed txlake can be found there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_support import SPARK_CONF, TXLAKE_JAR, file_storage  # noqa: F401
from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from txlake.engine import registry

CHECKOUT = Path(__file__).resolve().parents[1]

#: the driver of the subprocess: argv[1] Spark settings (JSON), argv[2] storage url. Nothing
#: registers the source. It reads topic ``t``, saves one row to it in Spark's default save mode
#: (ErrorIfExists) and prints, as JSON on its last line, the rows read and how the save ended:
#: "saved" or the error condition Spark raised.
READ_AND_SAVE_WITHOUT_REGISTRATION = """
import json, sys
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

builder = SparkSession.builder.master("local[1]").appName("txlake-discovery")
for key, value in json.loads(sys.argv[1]).items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
df = spark.read.format("txlake").option("storage.url", sys.argv[2]).option("subscribe", "t").load()
rows = sorted([r.topic, r.partition, r.offset, bytes(r.key).decode(), bytes(r.value).decode()] for r in df.collect())
try:
    spark.createDataFrame([("k3", "v3", 1)], "key string, value string, partition int").write \\
        .format("txlake").option("storage.url", sys.argv[2]).option("topic", "t").save()
    saved = "saved"
except AnalysisException as e:
    saved = e.getCondition()
print(json.dumps([rows, saved]))
spark.stop()
"""

LIST_PYSPARK_MODULES = ("import json, pkgutil; "
                        "print(json.dumps([m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')]))")


def outside_env() -> dict[str, str]:
    """This process's environment without ``PYTHONPATH``; Spark's workers run this interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def errors(stderr: str) -> str:
    """The lines of a Spark driver's stderr that say what failed (no JVM stack frames)."""
    return "\n".join([line for line in stderr.splitlines() if not line.lstrip().startswith("at ")][-30:])


@pytest.mark.parametrize("jar", [
    pytest.param(True, marks=pytest.mark.skipif(TXLAKE_JAR is None, reason="no JDK: txlake's Spark jar is not built")),
    False])
def test_format_txlake_is_found_from_a_directory_outside_the_checkout(file_storage, tmp_path, jar):
    """From a working directory outside the checkout, ``pkgutil.iter_modules()`` lists
    ``pyspark_txlake`` (what PySpark's lookup worker iterates) and a new Spark session
    reads ``format("txlake")`` without ``spark.dataSource.register``: exactly the
    records produced. With setuptools' default editable install (``dev/setup.sh``) this
    failed with DATA_SOURCE_NOT_FOUND: its import hook is invisible to ``iter_modules``.

    A save in Spark's default mode (ErrorIfExists) then appends, as Spark's Kafka sink does,
    when txlake's jar is on ``spark.jars`` (``txlake.DefaultSource`` hands reads and the write
    to the discovered Python source); without the jar ``format("txlake")`` is the Python source
    alone, for which Spark refuses that mode (docs/spark.md, "Writing")."""
    with AdminClient(file_storage.conf()) as admin:
        admin.create_topics([NewTopic("t", 2)])["t"].result()
    p = Producer(file_storage.conf())
    for i, partition in enumerate((0, 1, 0)):
        p.produce("t", key=f"k{i}", value=f"v{i}", partition=partition)
    p.flush(30)
    p.close()
    registry.close_all()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert not elsewhere.resolve().is_relative_to(CHECKOUT)
    env = outside_env()
    conf = {k: v for k, v in SPARK_CONF.items() if k != "spark.jars"}
    if jar:
        conf["spark.jars"] = TXLAKE_JAR

    done = subprocess.run([sys.executable, "-c", READ_AND_SAVE_WITHOUT_REGISTRATION, json.dumps(conf),
                           file_storage.url], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    listed = subprocess.run([sys.executable, "-c", LIST_PYSPARK_MODULES], cwd=elsewhere, env=env,
                            capture_output=True, text=True, timeout=60, check=True)
    assert done.returncode == 0, (
        f"{errors(done.stderr)}\npkgutil.iter_modules() outside the checkout lists {listed.stdout.strip()}; if "
        "pyspark_txlake is missing, reinstall txlake (dev/setup.sh or pip install -e .)")
    rows, saved = json.loads(done.stdout.strip().splitlines()[-1])
    assert rows == [["t", 0, 0, "k0", "v0"], ["t", 0, 1, "k2", "v2"], ["t", 1, 0, "k1", "v1"]]
    assert "pyspark_txlake" in json.loads(listed.stdout)
    c = Consumer({**file_storage.conf(), "group.id": "verify", "enable.auto.commit": False})
    c.assign([TopicPartition("t", 1, 0)])
    got = [(m.offset(), m.key(), m.value()) for m in c.consume(10, 2.0) if m.error() is None]
    c.close()
    registry.close_all()
    if jar:
        assert saved == "saved"
        assert got == [(0, b"k1", b"v1"), (1, b"k3", b"v3")]       # then the commit marker at 2
    else:
        assert saved == "UNSUPPORTED_DATA_SOURCE_SAVE_MODE"
        assert got == [(0, b"k1", b"v1")]
