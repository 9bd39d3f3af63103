"""txlake's JVM class for Spark, ``txlake.DefaultSource``: where its jar is and how it is built.

Why a JVM class at all: every Python data source is a DSv2 table that supports batch
writes, and for such a table Spark's ``DataFrameWriter.save()`` refuses the save modes
ErrorIfExists (Spark's default) and Ignore with ``UNSUPPORTED_DATA_SOURCE_SAVE_MODE`` before
any Python code runs. Spark's Kafka sink accepts ErrorIfExists and Append on Spark's V1 save
path (``CreatableRelationProvider``), which only a JVM class can take. The two Java files in
``java/txlake/`` are that class and the table it wraps around the Python source's; they hand
reads, streams and the write itself to the Python source (the files' comments say how).

The jar is never committed: :func:`build_jar` compiles it with ``javac`` against the jars of
the installed PySpark (``pyspark/jars``) into ``java/build/`` (git-ignored), named after the
PySpark version, since it uses Spark classes that are not public API
(``PythonDataSourceV2``, ``DataSourceManager``). ``dev/setup.sh`` runs it through
``dev/build_spark_jar.py``. Spark loads it only when it is on ``spark.jars``
(:func:`jar_path` gives the path); without it ``format("txlake")`` is the Python source alone
(docs/spark.md, "Writing").
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: the Java sources (package ``txlake``)
JAVA_SOURCES = Path(__file__).resolve().parent / "java"
#: where :func:`build_jar` writes the jar (git-ignored)
JAR_DIR = JAVA_SOURCES / "build"
#: Java release the classes target (Spark 4 needs Java 17+)
JAVA_RELEASE = "17"


class JarBuildError(RuntimeError):
    """The jar could not be built; the message says what is missing or what javac said."""


def _sources() -> list[Path]:
    return sorted(JAVA_SOURCES.glob("txlake/*.java"))


def _pyspark() -> tuple[str, Path] | None:
    """The installed PySpark's version and jars folder, or None without PySpark."""
    try:
        import pyspark
    except ImportError:
        return None
    return pyspark.__version__, Path(pyspark.__file__).resolve().parent / "jars"


def jar_file(pyspark_version: str) -> Path:
    """The jar's path for ``pyspark_version`` (whether it exists or not)."""
    return JAR_DIR / f"txlake-spark-{pyspark_version}.jar"


def jar_path() -> Path | None:
    """The jar to put on ``spark.jars``: built for the installed PySpark and not older than
    the Java sources; None otherwise (not built, PySpark missing or upgraded, sources changed,
    or a txlake installed without its Java sources)."""
    found = _pyspark()
    sources = _sources()
    if found is None or not sources:
        return None
    jar = jar_file(found[0])
    if not jar.is_file() or jar.stat().st_mtime < max(s.stat().st_mtime for s in sources):
        return None
    return jar


def build_jar(force: bool = False) -> Path:
    """Compile ``java/txlake/*.java`` against the installed PySpark's jars and package them
    as :func:`jar_file` (a few seconds); an up-to-date jar is kept unless ``force``.

    Returns:
        the jar's path.

    Raises:
        JarBuildError: no PySpark, no ``javac``/``jar`` (a JDK 17+) on PATH, no Java
            sources, or javac's errors (e.g. a PySpark whose internal classes changed).
    """
    found = _pyspark()
    if found is None:
        raise JarBuildError("PySpark is not installed in this Python (pip install 'txlake[spark]')")
    version, spark_jars = found
    sources = _sources()
    if not sources:
        raise JarBuildError(f"no Java sources in {JAVA_SOURCES / 'txlake'} (they ship with a txlake checkout)")
    if not force and jar_path() is not None:
        return jar_file(version)
    javac, jar_tool = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar_tool is None:
        raise JarBuildError("no javac/jar on PATH: a JDK 17 or newer is needed to build txlake's Spark jar "
                            "(e.g. apt-get install openjdk-17-jdk-headless)")
    JAR_DIR.mkdir(parents=True, exist_ok=True)
    target = jar_file(version)
    with tempfile.TemporaryDirectory(dir=JAR_DIR) as tmp:
        classes = Path(tmp) / "classes"
        done = subprocess.run([javac, "--release", JAVA_RELEASE, "-Xlint:all,-path",
                               "-cp", str(spark_jars / "*"), "-d", str(classes), *map(str, sources)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise JarBuildError(f"javac failed against PySpark {version} ({spark_jars}):\n"
                                f"{done.stderr.strip() or done.stdout.strip()}")
        partial = Path(tmp) / target.name
        done = subprocess.run([jar_tool, "--create", "--file", str(partial), "-C", str(classes), "."],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise JarBuildError(f"jar failed: {done.stderr.strip() or done.stdout.strip()}")
        partial.replace(target)  # atomic: a reader never sees half a jar
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m txlake.spark_connector.jvm [--force]``: build the jar, print its path.

    Exit status 0 when built (or up to date), 2 when it cannot be built here (no PySpark, no
    JDK: txlake then works without it, docs/spark.md), 1 when javac fails."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        print(build_jar(force="--force" in argv))
    except JarBuildError as e:
        print(f"txlake's Spark jar was not built: {e}", file=sys.stderr)
        return 1 if str(e).startswith(("javac failed", "jar failed")) else 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
