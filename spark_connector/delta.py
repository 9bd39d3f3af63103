"""Delta Lake for Spark sessions: which delta-spark release fits the installed PySpark, where
its jars are, and the session settings that load it (issue 19: ``spark.read.format("delta")``
over the topics' committed-view tables).

delta-spark uses Spark internals, so each release runs only on the Spark minor version it is
built for (Delta's "Compatibility with Apache Spark" table; an older release on a newer Spark
fails at the first query with ``NoSuchMethodError``, e.g. delta-spark 4.4.0 on Spark 4.3:
``LogicalRDD.<init>``). :data:`DELTA_FOR_SPARK` maps a Spark minor version to the newest
delta-spark release built for it.

The jars come from Maven Central by the project's own files: :func:`fetch_jars` (run by
``dev/setup.sh`` through ``dev/fetch_delta_jars.py``) resolves
``io.delta:delta-spark_2.13:<version>`` with Maven into the git-ignored ``dev/delta-lib/<version>/``
of a txlake checkout, leaving out what Spark's own ``jars/`` already holds (Hadoop, Jackson,
Parquet, Scala, logging, codecs). A session then loads them with ``spark.jars`` and never
downloads anything; without them :func:`delta_conf` can fall back to ``spark.jars.packages``
(Spark's Ivy resolution at session start, which needs Maven Central then).

Use::

    builder = SparkSession.builder
    for key, value in delta_conf().items():
        builder = builder.config(key, value)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["DELTA_FOR_SPARK", "DeltaUnavailableError", "delta_conf", "delta_coordinates", "delta_jars",
           "delta_session_conf", "delta_version", "fetch_jars", "main"]

#: Spark ``major.minor`` -> the newest delta-spark (``io.delta:delta-spark_2.13``) built for it
#: (each release's POM names the Spark it is compiled against). Spark 4.3 has none yet.
DELTA_FOR_SPARK = {"4.0": "4.0.1", "4.1": "4.3.1", "4.2": "4.4.0"}
#: delta-spark's session extension and catalog (Delta's "Set up Apache Spark with Delta Lake")
EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
#: where :func:`fetch_jars` puts the jars of a checkout (git-ignored); ``TXLAKE_DELTA_LIB`` overrides
LIB_DIR = Path(__file__).resolve().parent.parent / "dev" / "delta-lib"
#: groups delta-spark depends on that Spark's own jars/ already provide (Spark's copies win anyway)
_PROVIDED_GROUPS = ("org.apache.hadoop", "com.fasterxml.jackson.core", "com.fasterxml.jackson.datatype",
                    "com.fasterxml.jackson.module", "org.apache.parquet", "org.scala-lang",
                    "org.apache.logging.log4j", "org.slf4j", "org.xerial.snappy", "com.github.luben",
                    "io.airlift", "org.roaringbitmap", "commons-logging", "commons-pool",
                    "com.google.code.findbugs", "javax.annotation", "org.locationtech.jts")
_MARKER = ".complete"


class DeltaUnavailableError(RuntimeError):
    """No delta-spark release fits the installed PySpark, or its jars are not fetched; the
    message says which and what to run."""


def _lib_dir() -> Path:
    return Path(os.environ.get("TXLAKE_DELTA_LIB") or LIB_DIR)


def _spark_version() -> str:
    try:
        import pyspark
    except ImportError:
        raise DeltaUnavailableError("PySpark is not installed in this Python (pip install 'txlake[spark]')") from None
    return pyspark.__version__


def delta_version(spark_version: str | None = None) -> str:
    """The delta-spark release for ``spark_version`` (default: the installed PySpark's), e.g.
    ``"4.4.0"`` for ``"4.2.1"``.

    Raises:
        DeltaUnavailableError: no delta-spark release is built for that Spark minor version
            (the message names the versions that have one).
    """
    spark_version = spark_version or _spark_version()
    minor = ".".join(spark_version.split(".")[:2])
    found = DELTA_FOR_SPARK.get(minor)
    if found is None:
        known = ", ".join(f"Spark {s}: delta-spark {d}" for s, d in DELTA_FOR_SPARK.items())
        raise DeltaUnavailableError(
            f"no delta-spark release is built for Spark {spark_version} (PySpark's version); delta-spark only "
            f"runs on the Spark it is compiled for ({known}). Read the tables with delta-rs (deltalake) instead, "
            f"or use a PySpark of a listed minor version")
    return found


def delta_coordinates(spark_version: str | None = None) -> str:
    """The Maven coordinates ``io.delta:delta-spark_2.13:<version>`` for ``spark.jars.packages``.

    Raises:
        DeltaUnavailableError: as :func:`delta_version`.
    """
    return f"io.delta:delta-spark_2.13:{delta_version(spark_version)}"


def delta_jars(spark_version: str | None = None) -> list[Path] | None:
    """The fetched jars of the delta-spark release for ``spark_version`` (sorted), or None when
    :func:`fetch_jars` has not completed for it.

    Raises:
        DeltaUnavailableError: as :func:`delta_version`.
    """
    folder = _lib_dir() / delta_version(spark_version)
    if not (folder / _MARKER).is_file():
        return None
    return sorted(folder.glob("*.jar"))


def delta_conf(spark_version: str | None = None, allow_download: bool = False) -> dict[str, str]:
    """Spark settings that put delta-spark on a new session: ``spark.jars`` (the fetched jars),
    ``spark.sql.extensions`` and ``spark.sql.catalog.spark_catalog``. A session that has its
    own ``spark.jars`` (txlake's jar) joins both lists with a comma.

    Args:
        spark_version: the Spark the session runs (default: the installed PySpark's).
        allow_download: without fetched jars, set ``spark.jars.packages`` to
            :func:`delta_coordinates` instead (Spark resolves them with Ivy at session start).

    Raises:
        DeltaUnavailableError: no release for that Spark (:func:`delta_version`), or no fetched
            jars and not ``allow_download`` (the message names ``dev/fetch_delta_jars.py``).
    """
    jars = delta_jars(spark_version)
    conf = {"spark.sql.extensions": EXTENSION, "spark.sql.catalog.spark_catalog": CATALOG}
    if jars:
        conf["spark.jars"] = ",".join(str(j) for j in jars)
    elif allow_download:
        conf["spark.jars.packages"] = delta_coordinates(spark_version)
    else:
        raise DeltaUnavailableError(
            f"delta-spark {delta_version(spark_version)}'s jars are not in {_lib_dir()}: run "
            f"`python dev/fetch_delta_jars.py` (needs Maven), or pass allow_download=True")
    return conf


def delta_session_conf(settings: dict[str, str], spark_version: str | None = None,
                       allow_download: bool = False) -> dict[str, str]:
    """``settings`` (a session's Spark settings) plus :func:`delta_conf`: ``spark.jars`` lists
    joined with a comma, and ``spark.databricks.delta.snapshotPartitions=1`` unless set (Delta
    rebuilds a table's state in that many shuffle partitions, 50 by default: 50 tasks per table
    load, slow on a small local session; one is plenty for the topics' tables).

    Raises:
        DeltaUnavailableError: as :func:`delta_conf`.
    """
    out = dict(settings)
    for key, value in delta_conf(spark_version, allow_download).items():
        out[key] = f"{out[key]},{value}" if key == "spark.jars" and out.get(key) else value
    out.setdefault("spark.databricks.delta.snapshotPartitions", "1")
    return out


def fetch_jars(spark_version: str | None = None, mvn: str | None = None) -> Path:
    """Resolve delta-spark for ``spark_version`` with Maven into ``dev/delta-lib/<version>/``
    (all runtime dependencies but those Spark ships); a complete folder is kept as is.

    Returns:
        the folder.

    Raises:
        DeltaUnavailableError: no release for that Spark, no ``mvn`` on PATH, or Maven failed
            (its last output lines are in the message).
    """
    version = delta_version(spark_version)
    folder = _lib_dir() / version
    if (folder / _MARKER).is_file():
        return folder
    mvn = mvn or shutil.which("mvn")
    if mvn is None:
        raise DeltaUnavailableError("mvn (Apache Maven) is not on PATH: delta-spark's jars cannot be fetched")
    folder.parent.mkdir(parents=True, exist_ok=True)
    pom = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txlake.dev</groupId><artifactId>delta-spark-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>io.delta</groupId><artifactId>delta-spark_2.13</artifactId><version>{version}</version></dependency>
  </dependencies>
</project>
"""
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        (Path(tmp) / "pom.xml").write_text(pom)
        partial = Path(tmp) / "jars"
        done = subprocess.run([mvn, "-q", "-B", "-f", str(Path(tmp) / "pom.xml"), "dependency:copy-dependencies",
                               "-DincludeScope=runtime", f"-DexcludeGroupIds={','.join(_PROVIDED_GROUPS)}",
                               f"-DoutputDirectory={partial}"], capture_output=True, text=True)
        if done.returncode != 0 or not (partial / f"delta-spark_2.13-{version}.jar").is_file():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
            raise DeltaUnavailableError(f"Maven could not fetch io.delta:delta-spark_2.13:{version}:\n{tail}")
        (partial / _MARKER).write_text(version + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        partial.replace(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    """``python dev/fetch_delta_jars.py``: fetch the jars, print their folder. Exit status 0
    fetched (or present), 2 not fetchable here (no release for this PySpark, no Maven, or
    Maven failed; the reason is printed)."""
    del argv
    try:
        print(fetch_jars())
    except DeltaUnavailableError as e:
        print(f"delta-spark's jars were not fetched: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
