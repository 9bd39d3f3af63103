"""Spark connector benchmarks (issue 5): batch read, batch write and streaming latency of the
``txlake`` data source, each against Spark's own Parquet source on the same data.

Run:  .venv/bin/python benchmarks/bench_spark.py [--records 1000000] [--sends 20]

One local SparkSession (``local[2]``, filter pushdown on, UI off, Python workers on this
interpreter; the source registered explicitly).

* read: ``spark.read.format("txlake")...load()`` + ``sum(length(value))`` over a committed
  topic vs ``spark.read.parquet(<the topic's segment objects>)`` filtered to the same rows
  (``topic = ... AND NOT is_control``) + the same aggregate. Ratio parquet / txlake (goal >= 0.7).
  Also the *floor* of any Python data source with these columns: a source whose tasks only
  yield prebuilt Arrow batches of the same shape (Spark's Kafka columns, the same row count,
  the same partitions) and read nothing -- what PySpark's data source API itself costs.
* write: ``df.write.format("txlake").mode("append")`` of a cached key/value binary DataFrame
  vs ``df.write.parquet(path)`` of the same DataFrame. Ratio parquet / txlake (goal >= 0.5).
  Also the floor: the same write into a Python data source that drops every batch.
* stream: a ``readStream.format("txlake")`` query with a 1 s processing-time trigger and a
  ``foreachBatch`` sink; a Producer of this process sends one record every ``--interval`` s
  carrying its send time; the latency of a record is the wall clock when ``foreachBatch``
  sees it minus the time its ``flush()`` returned (= committed) -- and minus the send time.
Times are the best of ``--repeat`` runs after one warm-up run of each side (the first Python
data source call of a session starts Python workers); the sides of the read and of the write
run interleaved, round by round, and their medians are printed too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
from common import fresh_root, interleaved, machine, records_table  # noqa: E402

from txlake import AdminClient, NewTopic, Producer  # noqa: E402
from txlake.duckdb import committed_files  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402

PARTITIONS = 4


def session():
    """The demo's local SparkSession (txlake source registered), with more driver memory."""
    from txlake.demo_spark import spark_session

    return spark_session("bench_spark", **{"spark.driver.memory": "2g", "spark.sql.shuffle.partitions": "4"})


def create_topic(url: str, topic: str, partitions: int) -> None:
    with AdminClient({"storage.url": url}) as admin:
        admin.create_topics([NewTopic(topic, partitions)])[topic].result()
    close_all()


def bench_read(spark, url: str, n: int, repeat: int, results: dict) -> None:
    create_topic(url, "read", PARTITIONS)
    p = Producer({"storage.url": url})
    p.produce_arrow("read", records_table(n))
    p.close()
    close_all()
    files = committed_files(url, "read")
    expected = n * 100

    def txlake_read():
        df = spark.read.format("txlake").option("storage.url", url).option("subscribe", "read").load()
        total, rows = df.selectExpr("sum(length(value))", "count(*)").collect()[0]
        assert (total, rows) == (expected, n), (total, rows)

    def parquet_read():
        df = spark.read.parquet(*files).filter("topic = 'read' AND NOT is_control")
        total, rows = df.selectExpr("sum(length(value))", "count(*)").collect()[0]
        assert (total, rows) == (expected, n), (total, rows)

    def floor_read():
        df = spark.read.format("txlake_floor").option("rows", str(n)).option("partitions", str(PARTITIONS)).load()
        total, rows = df.selectExpr("sum(length(value))", "count(*)").collect()[0]
        assert (total, rows) == (expected, n), (total, rows)

    spark.dataSource.register(floor_source())
    results["read_objects"] = len(files)
    times = interleaved({"parquet": parquet_read, "txlake": txlake_read, "floor": floor_read}, repeat)
    for side, runs in times.items():
        results[f"read_{side}_s"] = min(runs)
        results[f"read_{side}_median_s"] = statistics.median(runs)
    results["read_ratio_parquet_over_txlake"] = results["read_parquet_s"] / results["read_txlake_s"]
    results["read_ratio_parquet_over_txlake_medians"] = results["read_parquet_median_s"] / results["read_txlake_median_s"]
    results["read_ratio_parquet_over_floor"] = results["read_parquet_s"] / results["read_floor_s"]
    results["read_ratio_floor_over_txlake"] = results["read_floor_s"] / results["read_txlake_s"]


def floor_source():
    """A Python data source with the txlake source's schema whose tasks read nothing: each yields
    one prebuilt batch of Spark's Kafka columns (7-byte keys, 100-byte values) over and over
    until it has its share of ``rows``; and whose write tasks take the Arrow batches and drop
    them, with a commit that does nothing -- the cost of the Python data source API alone."""
    from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition,
                                        WriterCommitMessage)

    from txlake.spark_connector.source import KAFKA_SCHEMA

    class FloorReader(DataSourceReader):
        def __init__(self, rows: int, partitions: int):
            self.rows, self.parts = rows, partitions

        def partitions(self):
            share = -(-self.rows // self.parts)
            return [InputPartition(min(share, self.rows - i * share)) for i in range(self.parts)]

        def read(self, partition):
            import numpy as np
            import pyarrow as pa

            from txlake.spark_connector.batch_read import BATCH_ROWS, arrow_schema, kafka_struct

            schema = arrow_schema(kafka_struct(False))
            n = min(BATCH_ROWS, partition.value)
            batch = pa.record_batch([
                pa.array([b"key-123"] * n, pa.binary()), pa.array([b"v" * 100] * n, pa.binary()),
                pa.array(["read"] * n, pa.string()), pa.array(np.zeros(n, np.int32)),
                pa.array(np.arange(n, dtype=np.int64)), pa.array(np.zeros(n, np.int64)).cast(schema.field(5).type),
                pa.array(np.zeros(n, np.int32))], schema=schema)
            left = partition.value
            while left > 0:
                yield batch.slice(0, min(n, left))
                left -= n

    class FloorWriter(DataSourceArrowWriter):
        def write(self, iterator):
            for _ in iterator:  # take every Arrow batch Spark hands over, keep nothing
                pass
            return WriterCommitMessage()

        def commit(self, messages):
            pass

    class FloorSource(DataSource):
        @classmethod
        def name(cls):
            return "txlake_floor"

        def schema(self):
            return KAFKA_SCHEMA

        def reader(self, schema):
            return FloorReader(int(self.options["rows"]), int(self.options["partitions"]))

        def writer(self, schema, overwrite):
            return FloorWriter()

    return FloorSource


def bench_write(spark, url: str, n: int, repeat: int, results: dict) -> None:
    create_topic(url, "write", PARTITIONS)
    df = spark.range(n, numPartitions=2).selectExpr(
        "CAST(concat('key-', CAST(id % 1000 AS STRING)) AS BINARY) AS key",
        "CAST(substring(concat(sha2(CAST(id AS STRING), 512), sha2(CAST(id + 1 AS STRING), 512)), 1, 100)"
        " AS BINARY) AS value").cache()
    assert df.count() == n
    out = tempfile.mkdtemp(prefix="txlake-bench-parquet-")
    written = [0]

    def parquet_write():
        df.write.mode("overwrite").parquet(os.path.join(out, "p"))

    def txlake_write():
        close_all()  # this process must not hold the writer lease: Spark's commit takes it
        (df.write.format("txlake").mode("append").option("storage.url", url)
         .option("topic", "write").save())
        written[0] += n

    def floor_write():
        df.write.format("txlake_floor").mode("append").save()

    spark.dataSource.register(floor_source())
    try:
        times = interleaved({"parquet": parquet_write, "txlake": txlake_write, "floor": floor_write}, repeat)
        for side, runs in times.items():
            results[f"write_{side}_s"] = min(runs)
            results[f"write_{side}_median_s"] = statistics.median(runs)
    finally:
        shutil.rmtree(out, True)
        df.unpersist()
    got = (spark.read.format("txlake").option("storage.url", url).option("subscribe", "write").load()
           .count())
    assert got == written[0], (got, written[0])
    results["write_ratio_parquet_over_txlake"] = results["write_parquet_s"] / results["write_txlake_s"]
    results["write_ratio_parquet_over_txlake_medians"] = (results["write_parquet_median_s"]
                                                          / results["write_txlake_median_s"])
    results["write_ratio_parquet_over_floor"] = results["write_parquet_s"] / results["write_floor_s"]
    results["write_ratio_floor_over_txlake"] = results["write_floor_s"] / results["write_txlake_s"]


def bench_stream(spark, url: str, sends: int, interval: float, results: dict) -> None:
    create_topic(url, "lat", 1)
    seen: dict[int, float] = {}
    lock = threading.Lock()

    def on_batch(batch_df, batch_id):
        rows = batch_df.select("value").collect()
        now = time.time()
        with lock:
            for r in rows:
                seen[int(bytes(r.value).split(b":")[0])] = now

    checkpoint = tempfile.mkdtemp(prefix="txlake-bench-ckpt-")
    query = (spark.readStream.format("txlake").option("storage.url", url).option("subscribe", "lat")
             .option("startingOffsets", "latest").load()
             .writeStream.foreachBatch(on_batch).trigger(processingTime="1 second")
             .option("checkpointLocation", checkpoint).start())
    p = Producer({"storage.url": url, "linger.ms": 0})
    sent: dict[int, float] = {}
    committed: dict[int, float] = {}

    def send(i: int) -> None:
        sent[i] = time.time()
        p.produce("lat", value=f"{i}:{sent[i]:.6f}".encode())
        assert p.flush(30) == 0
        committed[i] = time.time()

    def wait_for(ids, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with lock:
                if all(i in seen for i in ids):
                    return
            time.sleep(0.02)
        raise TimeoutError(f"records {sorted(set(ids) - set(seen))} not seen in {timeout} s")

    try:
        # warm up: the query must have planned its first batch (at "latest") before the sends
        while query.lastProgress is None:
            time.sleep(0.1)
        for i in range(-3, 0):  # three warm-up records, not counted
            send(i)
            wait_for([i], 60)
        for i in range(sends):
            send(i)
            time.sleep(interval)
        wait_for(range(sends), 60)
        durations = [pr["durationMs"].get("triggerExecution", 0) / 1000 for pr in query.recentProgress
                     if pr.get("numInputRows")]
    finally:
        query.stop()
        p.close()
        close_all()
        shutil.rmtree(checkpoint, True)
    from_commit = sorted(seen[i] - committed[i] for i in range(sends))
    from_send = sorted(seen[i] - sent[i] for i in range(sends))
    commit_s = sorted(committed[i] - sent[i] for i in range(sends))

    def p95(xs):
        return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]

    results["stream_latency_from_commit_median_s"] = statistics.median(from_commit)
    results["stream_latency_from_commit_p95_s"] = p95(from_commit)
    results["stream_latency_from_send_median_s"] = statistics.median(from_send)
    results["stream_latency_from_send_p95_s"] = p95(from_send)
    results["stream_produce_commit_median_s"] = statistics.median(commit_s)
    # Spark's own duration of the micro-batches that held records (plan + read + foreachBatch)
    results["stream_batch_duration_median_s"] = statistics.median(durations) if durations else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000, help="records of the read benchmark")
    ap.add_argument("--write-records", type=int, default=None, help="rows of the write benchmark (default --records)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per side (best kept)")
    ap.add_argument("--sends", type=int, default=20, help="records sent in the latency benchmark")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between two sends")
    ap.add_argument("--only", choices=["read", "write", "stream"], action="append",
                    help="run only these parts (repeatable)")
    args = ap.parse_args()
    parts = args.only or ["read", "write", "stream"]
    n = args.records
    nw = args.write_records or n
    url = fresh_root()
    start = time.perf_counter()
    spark = session()
    results: dict[str, float] = {"session_start_s": time.perf_counter() - start}
    try:
        if "read" in parts:
            bench_read(spark, url, n, args.repeat, results)
        if "write" in parts:
            bench_write(spark, url, nw, args.repeat, results)
        if "stream" in parts:
            bench_stream(spark, url, args.sends, args.interval, results)
    finally:
        spark.stop()
    import pyspark
    print(f"# spark benchmarks ({n:,} records read, {nw:,} written, 100-byte values, {PARTITIONS} partitions; "
          f"{args.sends} sends every {args.interval} s, 1 s trigger; local[2], PySpark {pyspark.__version__}; "
          f"{machine()}; load average {os.getloadavg()[0]:.1f})")
    for k, v in results.items():
        print(f"{k:40s} {v:10.3f}")


if __name__ == "__main__":
    main()
