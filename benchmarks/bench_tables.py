"""Spark over a topic's Delta table (issue 19) vs Spark's own Parquet reader over the same objects.

Run:  python benchmarks/bench_tables.py [--records 1000000] [--repeat 3]

Needs a PySpark that a delta-spark release is built for (docs/spark.md, "Delta tables": 4.0-4.2;
none for 4.3 yet) and its jars (``python dev/fetch_delta_jars.py``). One local SparkSession
(``local[2]``, ``spark_session(delta=True)``).

The topic (4 partitions) is loaded by a transactional producer in transactions of about
``--records / 8`` records, so every segment object ends with commit markers that the table's
deletion vectors hide: the Delta read pays for its deletion vectors. The table is published
once (``txlake.tables.publish``), then, interleaved round by round after one warm-up:

* one-column aggregate: ``sum(length(value)), count(*)`` over
  ``spark.read.format("delta").load(table)`` vs ``spark.read.parquet(<the same objects>)``;
* full-row scan: ``count(*), sum(hash(*))`` (every column of every row), same two sides.

The raw Parquet side cannot be filtered to the committed view the way the table is (the
commit markers' rows, and in general other topics' rows, aborted transactions and rows past
the LSO, are not identifiable row by row without the catalog), so it reads all rows of the
same files: a few more rows (the markers) than the table, and no deletion vectors to apply.
It is the ceiling Spark's vectorized reader reaches on those bytes; the ratio parquet / delta
says how close the table gets (goal >= 0.8 for both queries).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import fresh_root, interleaved, machine, records_table  # noqa: E402

from txlake import AdminClient, NewTopic, Producer  # noqa: E402
from txlake.duckdb import committed_files  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402

PARTITIONS = 4
TOPIC = "read"


def load(url: str, n: int) -> None:
    """``n`` records (7-9 byte keys, 100-byte values) in 8 transactions over 4 partitions."""
    with AdminClient({"storage.url": url}) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS)])[TOPIC].result()
    p = Producer({"storage.url": url, "transactional.id": "bench-tables"})
    p.init_transactions(60)
    data = records_table(n)
    step = -(-n // 8)
    for start in range(0, n, step):
        p.begin_transaction()
        p.produce_arrow(TOPIC, data.slice(start, step))
        p.commit_transaction(120)
    p.close()
    close_all()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    n = args.records

    from txlake.demo_spark import spark_session
    from txlake.tables import publish

    url = fresh_root()
    load(url, n)
    (result,) = publish(url, TOPIC)
    uri = result.uri
    files = committed_files(url, TOPIC)
    spark = spark_session("bench_tables", delta=True, **{"spark.driver.memory": "2g",
                                                         "spark.sql.shuffle.partitions": "4"})
    expected = n * 100
    raw = tuple(spark.read.parquet(*files).selectExpr("sum(length(value))", "count(*)").collect()[0])
    raw_rows = raw[1]

    def delta_agg():
        total, rows = spark.read.format("delta").load(uri).selectExpr("sum(length(value))", "count(*)").collect()[0]
        assert (total, rows) == (expected, n), (total, rows)

    def parquet_agg():
        total, rows = spark.read.parquet(*files).selectExpr("sum(length(value))", "count(*)").collect()[0]
        assert (total, rows) == raw, (total, rows)

    # hash(*) reads and combines every column of every row (Spark's noop sink would do too, but
    # delta-spark 4.4 refuses a deletion-vector table as the source of a write to it: "Cannot work
    # with a non-pinned table snapshot of the TahoeFileIndex")
    def delta_scan():
        rows, _ = spark.read.format("delta").load(uri).selectExpr("count(*)", "sum(hash(*))").collect()[0]
        assert rows == n, rows

    def parquet_scan():
        rows, _ = spark.read.parquet(*files).selectExpr("count(*)", "sum(hash(*))").collect()[0]
        assert rows == raw_rows, rows

    results = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
               "spark": spark.version, "records": n, "objects": len(files), "raw_rows": raw_rows,
               "raw_value_bytes": raw[0],
               "table_version": result.version}
    times = interleaved({"delta_agg": delta_agg, "parquet_agg": parquet_agg,
                         "delta_scan": delta_scan, "parquet_scan": parquet_scan}, args.repeat)
    for side, runs in times.items():
        results[f"{side}_s"] = round(min(runs), 3)
        results[f"{side}_median_s"] = round(statistics.median(runs), 3)
    results["agg_ratio_parquet_over_delta"] = round(results["parquet_agg_s"] / results["delta_agg_s"], 3)
    results["scan_ratio_parquet_over_delta"] = round(results["parquet_scan_s"] / results["delta_scan_s"], 3)
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
