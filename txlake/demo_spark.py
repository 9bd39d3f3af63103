"""The demo's last step: Spark over the committed data (issues 5 and 19).

With one transaction left open and one aborted on ``flights``, the topic's Delta table is
published (:func:`txlake.tables.publish`: the log's own objects, deletion vectors hiding the
open and the aborted records) and the committed record count of ``flights`` is taken four
ways -- the Consumer (read_committed), DuckDB's committed view, Spark's ``txlake`` source and
Spark's ``format("delta")`` over the table (delta-spark) -- and must agree; Spark's
read_uncommitted count must show the extra records. The table's URI is printed for any Delta
reader. Without delta-spark (no release for the installed PySpark, its jars not fetched, or a
root Spark's Hadoop cannot read) the Delta count is skipped, saying why, and the rest runs. Then a Spark query joins the copier's output (``route-delays``: route,
arrival delay, source position) back to ``flights`` (key = carrier) and ranks carriers by
average arrival delay. Finally the open transaction is aborted, leaving the root clean.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Iterator

#: extra records in the transaction left open / the aborted one (fewer if partition 0 holds fewer)
OPEN_RECORDS = 100
ABORTED_RECORDS = 50
#: transaction.timeout.ms of the transaction left open (it is aborted at the end of the step)
OPEN_TRANSACTION_TIMEOUT_MS = 600_000
#: the oldest Java and PySpark the step runs on (Spark 4 needs Java 17+; txlake's source needs PySpark 4.1+)
MIN_JAVA = 17
MIN_PYSPARK = (4, 1)
#: how to get what is missing
HOW_TO_GET_JAVA = ("install a Java 17 or 21 runtime (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; "
                   "macOS: brew install openjdk@17) and put its bin/ on PATH or set JAVA_HOME to it")
HOW_TO_GET_PYSPARK = "pip install 'txlake[spark]' (in a checkout: pip install -e '.[spark]'; ./dev/setup.sh does it)"

CARRIER_DELAYS_SQL = """
SELECT CAST(f.key AS STRING) AS carrier,
       count(*) AS flights,
       round(avg(get_json_object(CAST(r.value AS STRING), '$.arr_delay') :: double), 2) AS avg_arr_delay
FROM route_delays r
JOIN flights f
  ON f.partition = get_json_object(CAST(r.value AS STRING), '$.src[0]') :: int
 AND f.offset = get_json_object(CAST(r.value AS STRING), '$.src[1]') :: bigint
GROUP BY 1
ORDER BY avg_arr_delay DESC
LIMIT 5
"""


@dataclass
class SparkStageResult:
    """What the Spark step established (counts are records of ``flights``)."""

    source_rows: int = 0
    consumer_committed: int = 0
    duckdb_committed: int = 0
    spark_committed: int = 0
    spark_uncommitted: int = 0
    #: the flights' Delta table: its URI, the version published, and Spark's count over it
    #: (None: not read, ``delta_missing`` says why)
    table_uri: str = ""
    table_version: int = -1
    delta_committed: int | None = None
    delta_missing: str = ""
    open_records: int = 0
    aborted_records: int = 0
    carriers: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    session_seconds: float = 0.0
    query_seconds: float = 0.0
    #: of ``query_seconds``: the count over the Delta table (its log replayed, deletion vectors applied)
    delta_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """The committed counts (Consumer, DuckDB, Spark's source, and Spark over the Delta table
        when it was read) equal the flights loaded, and only read_uncommitted sees the open and
        the aborted transaction."""
        delta = self.spark_committed if self.delta_committed is None else self.delta_committed
        return (self.consumer_committed == self.duckdb_committed == self.spark_committed == delta == self.source_rows
                and bool(self.table_uri) and (self.delta_committed is not None or bool(self.delta_missing))
                and self.open_records > 0 and self.aborted_records > 0
                and self.spark_uncommitted == self.source_rows + self.open_records + self.aborted_records
                and len(self.carriers) > 0)

    @property
    def agreement(self) -> str:
        """What :attr:`ok` asserts, in words (the step's verdict)."""
        readers = "Spark (txlake's source and the Delta table)" if self.delta_committed is not None else "Spark"
        return (f"{readers}, DuckDB and the Consumer agree on the committed flights; only read_uncommitted sees "
                "the open and the aborted transaction")


@dataclass
class SparkPrerequisites:
    """Whether this machine can run the Spark step, found by :func:`spark_prerequisites`.

    Attributes:
        java: the java executable Spark would run (``$JAVA_HOME/bin/java``, else ``java`` on
            PATH, as Spark's ``bin/spark-class`` picks it), None when there is none.
        java_version: its version text (``"17.0.15"``), "" when unknown.
        pyspark_version: the importable PySpark's version, None when it cannot be imported.
        missing: one line per missing piece: what is missing and how to get it.
    """

    java: str | None = None
    java_version: str = ""
    pyspark_version: str | None = None
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Java and PySpark are both there, new enough."""
        return not self.missing


def spark_prerequisites() -> SparkPrerequisites:
    """Check for what the Spark step needs before starting it: a Java 17+ runtime (found as
    Spark's launcher finds it) and an importable PySpark 4.1+ (the ``spark`` extra).

    Runs ``java -version`` (a second or less). Never raises: what is missing is listed in
    :attr:`SparkPrerequisites.missing` with how to get it.
    """
    pre = SparkPrerequisites()
    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not (os.path.isfile(java) and os.access(java, os.X_OK)):
            pre.missing.append(f"Java: JAVA_HOME is {home}, which has no bin/java; {HOW_TO_GET_JAVA}")
            java = None
    else:
        java = shutil.which("java")
        if java is None:
            pre.missing.append(f"Java: no java on PATH and JAVA_HOME is not set; {HOW_TO_GET_JAVA}")
    if java is not None:
        pre.java = java
        try:
            out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60,
                                 stdin=subprocess.DEVNULL)
            text = out.stderr + out.stdout
        except (OSError, subprocess.SubprocessError) as exc:
            text, out = "", None
            pre.missing.append(f"Java: {java} -version failed ({type(exc).__name__}: {exc}); {HOW_TO_GET_JAVA}")
        if out is not None:
            m = re.search(r'version "([^"]+)"', text)
            pre.java_version = m.group(1) if m else ""
            major = _java_major(pre.java_version)
            if out.returncode != 0 or major is None:
                first = text.strip().splitlines()[0] if text.strip() else f"exit status {out.returncode}"
                pre.missing.append(f"Java: {java} -version did not tell its version ({first}); {HOW_TO_GET_JAVA}")
            elif major < MIN_JAVA:
                pre.missing.append(f"Java: {java} is Java {pre.java_version}, Spark 4 needs {MIN_JAVA} or newer; "
                                   f"{HOW_TO_GET_JAVA}")
    try:
        import pyspark
    except ImportError as exc:
        pre.missing.append(f"PySpark: it cannot be imported ({type(exc).__name__}: {exc}); {HOW_TO_GET_PYSPARK}")
    else:
        pre.pyspark_version = str(getattr(pyspark, "__version__", ""))
        version = tuple(int(x) for x in re.findall(r"\d+", pre.pyspark_version)[:2])
        if version < MIN_PYSPARK:
            pre.missing.append(f"PySpark: version {pre.pyspark_version or '?'} is installed, txlake's Spark source "
                               f"needs {'.'.join(map(str, MIN_PYSPARK))} or newer; {HOW_TO_GET_PYSPARK}")
    return pre


def _java_major(version: str) -> int | None:
    """17 for "17.0.15", 8 for "1.8.0_381", None when it is no version."""
    parts = re.findall(r"\d+", version)
    if not parts:
        return None
    major = int(parts[0])
    return int(parts[1]) if major == 1 and len(parts) > 1 else major


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def spark_session(app: str = "txlake-demo", *, log: IO[str] | None = None, delta: bool = False,
                  s3_options: dict | None = None, **conf: str):
    """A local SparkSession set up for the txlake source (filter pushdown on, workers on this
    interpreter so they import this txlake, the source registered); ``conf`` adds or overrides
    Spark settings (dotted keys: pass them as ``**{"spark.driver.memory": "2g"}``).

    With ``delta=True`` the session also loads delta-spark (``format("delta")``, for the topics'
    Delta tables): the jars ``dev/fetch_delta_jars.py`` fetched for this PySpark on ``spark.jars``
    (else ``spark.jars.packages``, resolved by Spark at start), Delta's session extension and
    catalog (:func:`txlake.spark_connector.delta.delta_conf`), and Delta's snapshot state in one
    partition (``spark.databricks.delta.snapshotPartitions``: its default 50 makes every table
    load run 50 tasks, seconds each on a small machine). Only a new JVM takes these settings.
    With ``s3_options`` (txlake's s3fs storage options of an ``s3://`` root) it also loads
    Hadoop's S3A for that store (:func:`txlake.spark_connector.delta.s3a_session_conf`), so
    delta-spark reads ``s3://`` tables.

    When no Spark JVM runs in this process yet, this starts it (PySpark's ``launch_gateway``)
    with ``PYTHONSAFEPATH=1`` in its environment, so the Python workers it starts never put
    their working directory on ``sys.path`` (a folder named ``txlake`` there would shadow the
    installed package), and with its stdout and stderr -- Spark's, log4j's and Hadoop's
    messages, and the Python workers' stderr -- written to ``log`` when given (a file with a
    file descriptor) instead of this process's terminal. A JVM already running keeps how it
    was started.

    Raises:
        ImportError: PySpark is not installed (``pip install 'txlake[spark]'``).
        pyspark.errors.PySparkRuntimeError: JAVA_GATEWAY_EXITED, the JVM did not start
            (no Java, see :func:`spark_prerequisites`; its output is in ``log``).
        txlake.spark_connector.delta.DeltaUnavailableError: ``delta=True`` and no delta-spark
            release is built for the installed PySpark, or ``s3_options`` and no S3A jars.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # the demo uses no pandas through Spark: its pandas-version warning would only be noise here
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from txlake.spark_connector.jvm import jar_path

    jar = jar_path()  # txlake.DefaultSource: the default save mode for df.write (docs/spark.md)
    settings = {"spark.sql.python.filterPushdown.enabled": "true", "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "8",
                "spark.sql.session.timeZone": "UTC", **({"spark.jars": str(jar)} if jar else {})}
    if delta:
        from txlake.spark_connector.delta import delta_session_conf

        settings = delta_session_conf(settings, allow_download=True)
    if s3_options is not None:
        from txlake.spark_connector.delta import s3a_session_conf

        settings = s3a_session_conf(settings, s3_options)
    settings.update(conf)
    if SparkContext._gateway is None:  # no JVM in this process yet: start it here, its output where we say
        from pyspark.java_gateway import launch_gateway

        spark_conf = SparkConf().setMaster("local[2]").setAppName(app)
        for key, value in settings.items():
            spark_conf.set(key, value)
        with _environment(PYTHONSAFEPATH="1"):
            gateway = launch_gateway(spark_conf, popen_kwargs={"stdout": log, "stderr": log} if log else None)
        SparkContext(conf=spark_conf, gateway=gateway)
    builder = SparkSession.builder.master("local[2]").appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # explicit registration: discovery (pyspark_txlake) depends on how txlake was installed
    from txlake.spark_connector.source import TxlakeDataSource

    spark.dataSource.register(TxlakeDataSource)
    return spark


def spark_stage(url: str, options: dict, source_rows: int, topic: str, copier_target: str, console,
                step: int = 8, log: IO[str] | None = None, log_name: str | None = None) -> SparkStageResult:
    """Run the Spark step against ``url`` (see the module docstring).

    Args:
        log / log_name: where the JVM's output goes (see :func:`spark_session`) and its name
            for the narrative.

    Raises whatever stops it (e.g. JAVA_GATEWAY_EXITED); the open transaction is aborted first.
    """
    from rich.markup import escape
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from . import Consumer, Producer, TopicPartition
    from . import duckdb as txduck
    from . import tables

    res = SparkStageResult(source_rows=source_rows)
    started = time.perf_counter()
    conf: dict[str, Any] = {"storage.url": url, "storage.options": options}
    sample, parts = _first_values(conf, topic, OPEN_RECORDS)
    aborted_sample = sample[:ABORTED_RECORDS]
    res.table_uri = tables.table_uri(url, topic, options)
    res.delta_missing = delta_unavailable(res.table_uri)
    console.print(f"\n[bold]{step}. Spark[/] reads the committed data at the LSO: a transaction of {len(sample)} "
                  f"flights is left open and one of {len(aborted_sample)} is aborted, then Spark, DuckDB and the "
                  "Consumer count the committed flights"
                  + ("" if res.delta_missing else ", Spark also through the topic's Delta table"))
    # a generous transaction timeout: the open transaction must outlive the SparkSession's start
    txn_conf = {**conf, "transaction.timeout.ms": OPEN_TRANSACTION_TIMEOUT_MS}
    aborted = Producer({**txn_conf, "transactional.id": "demo-spark-aborted"})
    pending = None
    try:
        aborted.init_transactions(30)
        aborted.begin_transaction()
        for i, value in enumerate(aborted_sample):
            aborted.produce(topic, value, key=b"ABORTED", partition=i % parts)
        aborted.flush(30)
        aborted.abort_transaction(30)
        res.aborted_records = len(aborted_sample)
        pending = Producer({**txn_conf, "transactional.id": "demo-spark-open"})
        pending.init_transactions(30)
        pending.begin_transaction()
        for i, value in enumerate(sample):
            pending.produce(topic, value, key=b"OPEN", partition=i % parts)
        pending.flush(30)  # durable, not committed: the LSO of partitions 0 (and 1) stays below it
        res.open_records = len(sample)
        # the table as of this moment: the open and the aborted records hidden by its deletion vectors
        published = tables.publish(url, topic, storage_options=options)[0]
        res.table_version = published.version
        res.consumer_committed = _consumer_count(conf, topic, Consumer, TopicPartition)
        con = txduck.connect(url, options, topics=[topic])
        try:
            res.duckdb_committed = con.sql(f'SELECT count(*) FROM "{topic}"').fetchall()[0][0]
        finally:
            con.close()
        where = f" (its JVM's output goes to {log_name})" if log_name else ""
        if console.is_terminal:  # a spinner with the seconds elapsed, phase by phase
            progress = Progress(SpinnerColumn(), TextColumn("   {task.description}"), TimeElapsedColumn(),
                                console=console, transient=True)
        else:                    # a log or a pipe: one line saying what the wait is
            console.print(f"   starting a local SparkSession{where}, then the Spark queries (this takes a minute or "
                          "two) …", soft_wrap=True)
            progress = _NoProgress()
        with progress:
            task = progress.add_task(f"starting a local SparkSession{where}")
            t = time.perf_counter()
            s3 = not res.delta_missing and url.startswith("s3://")
            spark = spark_session(log=log, delta=not res.delta_missing,  # one JVM for both readers
                                  s3_options=(options or {}) if s3 else None)
            res.session_seconds = time.perf_counter() - t
            progress.update(task, description="Spark: counting the flights read_committed and read_uncommitted")
            t = time.perf_counter()
            reader = spark.read.format("txlake").option("storage.url", url)
            for key, value in _flat_options(options).items():
                reader = reader.option(key, value)
            flights = reader.option("subscribe", topic).load()
            res.spark_committed = flights.count()
            res.spark_uncommitted = (reader.option("subscribe", topic).option("isolation.level", "read_uncommitted")
                                     .load().count())
            if not res.delta_missing:
                progress.update(task, description="Spark: counting the flights in the topic's Delta table")
                t_delta = time.perf_counter()
                res.delta_committed = spark.read.format("delta").load(res.table_uri).count()
                res.delta_seconds = time.perf_counter() - t_delta
            progress.update(task, description="Spark: joining route-delays to flights, ranking carriers by delay")
            flights.createOrReplaceTempView("flights")
            reader.option("subscribe", copier_target).load().createOrReplaceTempView("route_delays")
            res.carriers = [row.asDict() for row in spark.sql(CARRIER_DELAYS_SQL).collect()]
            res.query_seconds = time.perf_counter() - t
        console.print(f"   a local SparkSession started{where} in {res.session_seconds:.1f} s; its queries took "
                      f"{res.query_seconds:.1f} s"
                      + ("" if res.delta_committed is None else f" (the Delta table's count {res.delta_seconds:.1f} s)"))
        console.print(f"   committed flights: Consumer {res.consumer_committed:,} · DuckDB {res.duckdb_committed:,} · "
                      f"Spark {res.spark_committed:,}"
                      + ("" if res.delta_committed is None else f" · Spark over the Delta table {res.delta_committed:,}")
                      + f"; Spark read_uncommitted {res.spark_uncommitted:,} "
                      f"({res.spark_uncommitted - res.spark_committed:+,}: {res.open_records} open, "
                      f"{res.aborted_records} aborted)")
        console.print(f"   the flights' Delta table (version {res.table_version}, published with the transaction open, "
                      f"the log's objects in place): {res.table_uri}", soft_wrap=True)
        if res.delta_missing:
            console.print(f"   Spark over the Delta table skipped: {escape(res.delta_missing)}", soft_wrap=True)
        if options:  # the store's options (secrets included) are the reader's to pass, never printed
            console.print(f"   open it with any Delta reader, e.g. deltalake: pa.table(deltalake.DeltaTable("
                          f"{res.table_uri!r}, storage_options=txlake.tables.delta_storage_options(OPTIONS)).scan()), "
                          "OPTIONS being this root's storage options (the -O options printed at the end)", soft_wrap=True)
        else:
            console.print(f"   open it with any Delta reader, e.g. deltalake: "
                          f"pa.table(deltalake.DeltaTable({res.table_uri!r}).scan())", soft_wrap=True)
    finally:
        if pending is not None:
            try:
                pending.abort_transaction(30)
            finally:
                pending.close()
        aborted.close()
    res.seconds = time.perf_counter() - started
    _print_carriers(console, res)
    return res


def delta_unavailable(table_uri: str) -> str:
    """Why this process's Spark cannot read the Delta table at ``table_uri`` ("" when it can):
    no delta-spark release for the installed PySpark, its jars not fetched
    (``dev/fetch_delta_jars.py``; :func:`txlake.spark_connector.delta.delta_conf`), or an
    ``s3://`` root without Hadoop's S3A jars (``dev/fetch_delta_jars.py --s3a``; docs/spark.md,
    "Delta tables on S3"), or a root of another scheme. Never raises, downloads nothing."""
    from txlake.spark_connector.delta import DeltaUnavailableError, delta_conf, s3a_jars

    scheme = table_uri.split(":", 1)[0]
    if scheme not in ("file", "s3"):
        return f"delta-spark is not set up here for {scheme}:// roots; delta-rs (deltalake) reads the table"
    try:
        delta_conf()
        if scheme == "s3" and s3a_jars() is None:
            return ("Hadoop's S3A jars, by which delta-spark reads s3:// tables, are not fetched "
                    "(python dev/fetch_delta_jars.py --s3a); delta-rs (deltalake) reads the table")
    except DeltaUnavailableError as exc:
        return str(exc)
    return ""


class _NoProgress:
    """Stands in for a rich Progress where nothing is drawn."""

    def __enter__(self) -> "_NoProgress":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str) -> int:
        return 0

    def update(self, task: int, description: str = "") -> None:
        return None


def _first_values(conf: dict, topic: str, n: int) -> tuple[list[bytes], int]:
    """The values of the first ``n`` records of partition 0 of ``topic`` (fewer if it holds fewer),
    and how many partitions the extra transactions write to (2, or 1 for a one-partition topic)."""
    from . import Consumer, TopicPartition

    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    try:
        parts = min(2, len(c.list_topics(topic).topics[topic].partitions))
        c.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        while len(values) < n and (msgs := c.consume(n - len(values), 2.0)):
            values.extend(m.value() for m in msgs if m.error() is None)
        return values, parts
    finally:
        c.close()


def _consumer_count(conf: dict, topic: str, consumer_cls, tp_cls) -> int:
    """Records a read_committed Consumer reads from every partition of ``topic`` (it stops at
    each partition's LSO; the scan ends at the first empty poll of 1 s)."""
    c = consumer_cls({**conf, "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    try:
        partitions = c.list_topics(topic).topics[topic].partitions
        c.assign([tp_cls(topic, p, 0) for p in partitions])
        count = 0
        while msgs := c.consume(50_000, 1.0):
            count += sum(1 for m in msgs if m.error() is None)
        return count
    finally:
        c.close()


def _flat_options(options: dict, prefix: str = "storage.options.") -> dict[str, str]:
    """fsspec options as Spark string options (``storage.options.<key>``; nested dicts dotted)."""
    out: dict[str, str] = {}
    for key, value in options.items():
        if isinstance(value, dict):
            out.update(_flat_options(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)
    return out


def _print_carriers(console, res: SparkStageResult) -> None:
    from rich.table import Table

    table = Table(show_edge=False, title="Spark: carriers by average arrival delay (route-delays ⋈ flights)")
    for col in ("Carrier", "Flights", "Avg arrival delay (min)"):
        table.add_column(col, justify="left" if col == "Carrier" else "right")
    for row in res.carriers:
        table.add_row(row["carrier"], f"{row['flights']:,}", f"{row['avg_arr_delay']:.2f}")
    console.print(table)
