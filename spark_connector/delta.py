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

Tables on ``s3://`` need Hadoop's S3A too: :func:`fetch_s3a_jars` (``dev/fetch_delta_jars.py
--s3a``) fetches hadoop-aws of PySpark's Hadoop version and the AWS SDK v2 bundle into
``dev/s3a-lib/<hadoop version>/``; :func:`s3a_conf` maps txlake's s3fs storage options to S3A
settings, :func:`s3a_session_conf` adds them and the jars to a new session's settings and
:func:`apply_s3a_conf` sets a bucket's on a running one (docs/spark.md, "Delta tables on S3").

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

__all__ = ["DELTA_FOR_SPARK", "DeltaUnavailableError", "apply_s3a_conf", "delta_conf", "delta_coordinates",
           "delta_jars", "delta_session_conf", "delta_version", "fetch_jars", "fetch_s3a_jars", "hadoop_version",
           "main", "s3a_conf", "s3a_jars", "s3a_session_conf"]

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
#: where :func:`fetch_s3a_jars` puts hadoop-aws and the AWS SDK bundle (git-ignored); ``TXLAKE_S3A_LIB`` overrides
S3A_LIB_DIR = Path(__file__).resolve().parent.parent / "dev" / "s3a-lib"
#: Hadoop's S3A file system, for both ``s3a://`` and the ``s3://`` URIs txlake's tables use
S3A_FS = "org.apache.hadoop.fs.s3a.S3AFileSystem"
#: Delta's log store for S3 (delta-storage; safe for one writer, any number of readers)
S3_LOG_STORE = "io.delta.storage.S3SingleDriverLogStore"


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
    return _mvn_copy(mvn, ("io.delta", "delta-spark_2.13", version), _lib_dir() / version,
                     f"delta-spark_2.13-{version}.jar", _PROVIDED_GROUPS)


def _mvn_copy(mvn: str | None, coordinates: tuple[str, str, str], folder: Path, expect: str,
              exclude_groups: tuple[str, ...] = ()) -> Path:
    """Resolve ``(group, artifact, version)`` and its runtime dependencies (less ``exclude_groups``)
    with Maven into ``folder``, atomically (a complete folder holds :data:`_MARKER`; kept as is).

    Raises:
        DeltaUnavailableError: no ``mvn`` on PATH, or Maven failed or did not produce ``expect``
            (its last output lines are in the message).
    """
    if (folder / _MARKER).is_file():
        return folder
    group, artifact, version = coordinates
    mvn = mvn or shutil.which("mvn")
    if mvn is None:
        raise DeltaUnavailableError(f"mvn (Apache Maven) is not on PATH: {group}:{artifact}:{version} cannot be fetched")
    folder.parent.mkdir(parents=True, exist_ok=True)
    pom = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txlake.dev</groupId><artifactId>{artifact}-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version></dependency>
  </dependencies>
</project>
"""
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        (Path(tmp) / "pom.xml").write_text(pom)
        partial = Path(tmp) / "jars"
        args = [mvn, "-q", "-B", "-f", str(Path(tmp) / "pom.xml"), "dependency:copy-dependencies",
                "-DincludeScope=runtime", f"-DoutputDirectory={partial}"]
        if exclude_groups:
            args.append(f"-DexcludeGroupIds={','.join(exclude_groups)}")
        done = subprocess.run(args, capture_output=True, text=True)
        if done.returncode != 0 or not (partial / expect).is_file():
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
            raise DeltaUnavailableError(f"Maven could not fetch {group}:{artifact}:{version}:\n{tail}")
        (partial / _MARKER).write_text(version + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        partial.replace(folder)
    return folder


# ------------------------------------------------------------------ s3:// tables: Hadoop's S3A
def hadoop_version() -> str:
    """The Hadoop version the installed PySpark ships (its ``jars/hadoop-client-api-<v>.jar``),
    e.g. ``"3.5.0"`` for PySpark 4.2.1; hadoop-aws must be that very version.

    Raises:
        DeltaUnavailableError: PySpark is not installed, or its jars/ holds no Hadoop client.
    """
    _spark_version()
    import pyspark

    found = sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("hadoop-client-api-*.jar"))
    if not found:
        raise DeltaUnavailableError(f"no hadoop-client-api-*.jar in {Path(pyspark.__file__).parent / 'jars'}")
    return found[-1].name[len("hadoop-client-api-"):-len(".jar")]


def _s3a_dir() -> Path:
    return Path(os.environ.get("TXLAKE_S3A_LIB") or S3A_LIB_DIR) / hadoop_version()


def s3a_jars() -> list[Path] | None:
    """hadoop-aws (PySpark's Hadoop version) and its AWS SDK v2 ``bundle`` as fetched by
    :func:`fetch_s3a_jars` (sorted), or None when not fetched.

    Raises:
        DeltaUnavailableError: as :func:`hadoop_version`.
    """
    folder = _s3a_dir()
    if not (folder / _MARKER).is_file():
        return None
    return sorted(folder.glob("*.jar"))


def fetch_s3a_jars(mvn: str | None = None) -> Path:
    """Resolve ``org.apache.hadoop:hadoop-aws:<hadoop_version()>`` and its runtime dependencies
    (``software.amazon.awssdk:bundle``, about 690 MB for Hadoop 3.5.0) with Maven into the
    git-ignored ``dev/s3a-lib/<hadoop version>/``; a complete folder is kept as is.

    Returns:
        the folder.

    Raises:
        DeltaUnavailableError: no PySpark, no ``mvn`` on PATH, or Maven failed.
    """
    version = hadoop_version()
    return _mvn_copy(mvn, ("org.apache.hadoop", "hadoop-aws", version), _s3a_dir(), f"hadoop-aws-{version}.jar")


#: txlake's (s3fs) storage options -> S3A settings (the part after ``fs.s3a.``)
_S3A_NAMES = {"key": "access.key", "secret": "secret.key", "token": "session.token"}


def s3a_conf(storage_options: dict | None, bucket: str | None = None) -> dict[str, str]:
    """Hadoop settings by which Spark (and delta-spark) reads ``s3://`` and ``s3a://`` URIs of
    the S3 store that txlake's fsspec/s3fs ``storage_options`` describe: ``fs.s3.impl`` and
    ``fs.s3a.impl`` = S3AFileSystem (and ``fs.AbstractFileSystem.s3.impl``), then ``endpoint_url``
    -> ``fs.s3a.endpoint`` with path-style access (``fs.s3a.path.style.access``; ``http://``
    also turns ``fs.s3a.connection.ssl.enabled`` off), ``key`` / ``secret`` / ``token`` ->
    ``fs.s3a.access.key`` / ``secret.key`` / ``session.token`` (with the simple or temporary
    credentials provider), ``anon=True`` -> the anonymous provider,
    ``client_kwargs.region_name`` -> ``fs.s3a.endpoint.region``. Without options S3A uses its
    default AWS credential chain.

    Keys are Hadoop's (``fs.s3a.endpoint``); a session builder takes them with the
    ``spark.hadoop.`` prefix (:func:`s3a_session_conf`), a running session through
    :func:`apply_s3a_conf`.

    Args:
        bucket: set the store's settings for this bucket only (S3A's per-bucket
            ``fs.s3a.bucket.<bucket>.*``), so one session reads several stores.

    Raises:
        ValueError: an option S3A has no equivalent for (named, with the supported ones).
    """
    options = dict(storage_options or {})
    prefix = f"fs.s3a.bucket.{bucket}." if bucket else "fs.s3a."
    out = {"fs.s3.impl": S3A_FS, "fs.s3a.impl": S3A_FS, "fs.AbstractFileSystem.s3.impl": "org.apache.hadoop.fs.s3a.S3A"}
    endpoint = options.pop("endpoint_url", None)
    if endpoint:
        out[prefix + "endpoint"] = str(endpoint)
        out[prefix + "path.style.access"] = "true"
        if str(endpoint).startswith("http://"):
            out[prefix + "connection.ssl.enabled"] = "false"
    for name, s3a in _S3A_NAMES.items():
        value = options.pop(name, None)
        if value is not None:
            out[prefix + s3a] = str(value)
    provider = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider" if prefix + "access.key" in out else None
    if prefix + "session.token" in out:
        provider = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    if options.pop("anon", False):
        provider = "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"
    if provider:
        out[prefix + "aws.credentials.provider"] = provider
    client_kwargs = dict(options.pop("client_kwargs", None) or {})
    region = client_kwargs.pop("region_name", None)
    if region:
        out[prefix + "endpoint.region"] = str(region)
    unknown = sorted(options) + [f"client_kwargs.{k}" for k in sorted(client_kwargs)]
    if unknown:
        raise ValueError(f"storage options {', '.join(unknown)} have no S3A equivalent (supported: endpoint_url, "
                         f"key, secret, token, anon, client_kwargs.region_name)")
    return out


def s3a_session_conf(settings: dict[str, str], storage_options: dict | None = None,
                     bucket: str | None = None) -> dict[str, str]:
    """``settings`` (a new session's Spark settings) plus S3A: the fetched jars on
    ``spark.driver.extraClassPath`` (Hadoop's classes load from the JVM's class path; local
    sessions: on a cluster the executors need them too), :func:`s3a_conf` with the
    ``spark.hadoop.`` prefix, and ``spark.delta.logStore.s3.impl`` =
    ``io.delta.storage.S3SingleDriverLogStore`` (Delta's default for ``s3``, made explicit).

    Raises:
        DeltaUnavailableError: the S3A jars are not fetched (names ``dev/fetch_delta_jars.py``).
        ValueError: as :func:`s3a_conf`.
    """
    jars = s3a_jars()
    if not jars:
        raise DeltaUnavailableError(f"hadoop-aws {hadoop_version()}'s jars are not in {_s3a_dir()}: run "
                                    f"`python dev/fetch_delta_jars.py --s3a` (needs Maven)")
    out = dict(settings)
    path = os.pathsep.join(str(j) for j in jars)
    key = "spark.driver.extraClassPath"
    out[key] = f"{out[key]}{os.pathsep}{path}" if out.get(key) else path
    out.update({f"spark.hadoop.{k}": v for k, v in s3a_conf(storage_options, bucket).items()})
    out["spark.delta.logStore.s3.impl"] = S3_LOG_STORE
    out["spark.delta.logStore.s3a.impl"] = S3_LOG_STORE
    return out


def apply_s3a_conf(spark, storage_options: dict | None, bucket: str | None = None) -> None:
    """Set :func:`s3a_conf` on a running session's Hadoop configuration (one started with
    :func:`s3a_session_conf`'s class path), e.g. ``bucket``'s endpoint and credentials. S3A
    reads them when it first opens that bucket: set them before the bucket's first read.

    Raises:
        ValueError: as :func:`s3a_conf`.
    """
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3a_conf(storage_options, bucket).items():
        hadoop.set(key, value)


def main(argv: list[str] | None = None) -> int:
    """``python dev/fetch_delta_jars.py [--s3a]``: fetch delta-spark's jars (with ``--s3a`` also
    hadoop-aws and the AWS SDK bundle, about 690 MB, for ``s3://`` tables), print their folders.
    Exit status 0 fetched (or present), 2 not fetchable here (no release for this PySpark, no
    Maven, or Maven failed; the reason is printed)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        print(fetch_jars())
    except DeltaUnavailableError as e:
        print(f"delta-spark's jars were not fetched: {e}", file=sys.stderr)
        return 2
    if "--s3a" in argv:
        try:
            print(fetch_s3a_jars())
        except DeltaUnavailableError as e:
            print(f"Hadoop's S3A jars (hadoop-aws, AWS SDK bundle) were not fetched: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
