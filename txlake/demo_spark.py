"""The demo's last step: Spark over the committed data (issue 5).

With one transaction left open and one aborted on ``flights``, the committed record count of
``flights`` is taken three ways -- the Consumer (read_committed), DuckDB's committed view
and Spark's ``txlake`` source -- and must agree; Spark's read_uncommitted count must show
the extra records. Then a Spark query joins the copier's output (``route-delays``: route,
arrival delay, source position) back to ``flights`` (key = carrier) and ranks carriers by
average arrival delay. Finally the open transaction is aborted, leaving the root clean.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

#: extra records in the transaction left open / the aborted one
OPEN_RECORDS = 100
ABORTED_RECORDS = 50
#: transaction.timeout.ms of the transaction left open (it is aborted at the end of the step)
OPEN_TRANSACTION_TIMEOUT_MS = 600_000

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
    open_records: int = 0
    aborted_records: int = 0
    carriers: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """The three committed counts equal the flights loaded, and only read_uncommitted sees
        the open and the aborted transaction."""
        return (self.consumer_committed == self.duckdb_committed == self.spark_committed == self.source_rows
                and self.spark_uncommitted == self.source_rows + self.open_records + self.aborted_records
                and len(self.carriers) > 0)


def spark_session(app: str = "txlake-demo", **conf: str):
    """A local SparkSession set up for the txlake source (filter pushdown on, workers on this
    interpreter so they import this txlake, the source registered); ``conf`` adds or overrides
    Spark settings (dotted keys: pass them as ``**{"spark.driver.memory": "2g"}``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # the demo uses no pandas through Spark: its pandas-version warning would only be noise here
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from pyspark.sql import SparkSession

    settings = {"spark.sql.python.filterPushdown.enabled": "true", "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "8",
                "spark.sql.session.timeZone": "UTC", **conf}
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
                step: int = 8) -> SparkStageResult:
    """Run the Spark step against ``url`` (see the module docstring)."""
    from . import Consumer, Producer, TopicPartition
    from . import duckdb as txduck

    res = SparkStageResult(source_rows=source_rows)
    started = time.perf_counter()
    conf: dict[str, Any] = {"storage.url": url, "storage.options": options}
    console.print(f"\n[bold]{step}. Spark[/] reads the committed data at the LSO: a transaction of {OPEN_RECORDS} "
                  f"flights is left open and one of {ABORTED_RECORDS} is aborted, then Spark, DuckDB and the "
                  "Consumer count the committed flights")
    sample = _first_values(conf, topic, OPEN_RECORDS)
    # a generous transaction timeout: the open transaction must outlive the SparkSession's start
    txn_conf = {**conf, "transaction.timeout.ms": OPEN_TRANSACTION_TIMEOUT_MS}
    aborted = Producer({**txn_conf, "transactional.id": "demo-spark-aborted"})
    aborted.init_transactions(30)
    aborted.begin_transaction()
    for i, value in enumerate(sample[:ABORTED_RECORDS]):
        aborted.produce(topic, value, key=b"ABORTED", partition=i % 2)
    aborted.flush(30)
    aborted.abort_transaction(30)
    res.aborted_records = ABORTED_RECORDS
    pending = Producer({**txn_conf, "transactional.id": "demo-spark-open"})
    pending.init_transactions(30)
    pending.begin_transaction()
    for i, value in enumerate(sample):
        pending.produce(topic, value, key=b"OPEN", partition=i % 2)
    pending.flush(30)  # durable, not committed: the LSO of partitions 0 and 1 stays below it
    res.open_records = OPEN_RECORDS
    try:
        res.consumer_committed = _consumer_count(conf, topic, Consumer, TopicPartition)
        con = txduck.connect(url, options, topics=[topic])
        try:
            res.duckdb_committed = con.sql(f'SELECT count(*) FROM "{topic}"').fetchall()[0][0]
        finally:
            con.close()
        console.print("   starting a local SparkSession ...")
        spark = spark_session()
        reader = spark.read.format("txlake").option("storage.url", url)
        for key, value in _flat_options(options).items():
            reader = reader.option(key, value)
        flights = reader.option("subscribe", topic).load()
        res.spark_committed = flights.count()
        res.spark_uncommitted = (reader.option("subscribe", topic).option("isolation.level", "read_uncommitted")
                                 .load().count())
        console.print(f"   committed flights: Consumer {res.consumer_committed:,} · DuckDB {res.duckdb_committed:,} · "
                      f"Spark {res.spark_committed:,}; Spark read_uncommitted {res.spark_uncommitted:,} "
                      f"(+{OPEN_RECORDS} open, +{ABORTED_RECORDS} aborted)")
        flights.createOrReplaceTempView("flights")
        reader.option("subscribe", copier_target).load().createOrReplaceTempView("route_delays")
        res.carriers = [row.asDict() for row in spark.sql(CARRIER_DELAYS_SQL).collect()]
    finally:
        pending.abort_transaction(30)
        pending.close()
        aborted.close()
    res.seconds = time.perf_counter() - started
    _print_carriers(console, res)
    return res


def _first_values(conf: dict, topic: str, n: int) -> list[bytes]:
    from . import Consumer, TopicPartition

    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        return [m.value() for m in c.consume(n, 10)]
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
