"""Spark reads the topics' Delta tables (issue 19): after each step of a log's life --
idempotent records in objects shared with another topic, a committed, an aborted and an open
transaction across three partitions, a compaction round -- ``spark.read.format("delta").load(uri)``
(delta-spark, Spark's own Parquet reader applying the deletion vectors) returns exactly what a
read_committed Consumer returns: partition, offset, key, value, headers.

The scenario and the publication checks are tests/test_tables.py's (``Log``, ``check``: each
step is also read by delta-rs there). Spark shares the test process's session
(tests/spark_support.py), which loads delta-spark when dev/fetch_delta_jars.py fetched a
release for the installed PySpark; without one (no delta-spark is built for Spark 4.3 yet) the
test skips saying so. On ``file://`` and on the local S3 server (SeaweedFS): delta-spark reads the
``s3://`` tables through Hadoop's S3A (hadoop-aws and the AWS SDK bundle that
``dev/fetch_delta_jars.py --s3a`` fetches; the bucket's endpoint and credentials are set on the
shared session from the root's storage options by ``txlake.spark_connector.delta.apply_s3a_conf``).
"""

from __future__ import annotations

import time

import pytest

from spark_support import close_engines, delta_spark  # noqa: F401
from test_tables import Log, check

pytest.importorskip("deltalake")

from txlake.engine.compaction import compact  # noqa: E402
from txlake.engine.table_publisher import TablePublisher, checkpoint_tables, clean_table_logs  # noqa: E402

from compaction_support import writer_broker  # noqa: E402

pytestmark = pytest.mark.usefixtures("close_engines")


def spark_rows(spark, uri: str) -> list[tuple]:
    """``(partition, offset, key, value, headers)`` of the table's newest version read by Spark,
    in the shape of test_tables.consumer_rows (bytes, headers as a list of pairs or None)."""
    def b(x):
        return None if x is None else bytes(x)

    df = spark.read.format("delta").load(uri).select("partition", "offset", "key", "value", "headers")
    out = [(r.partition, r.offset, b(r.key), b(r.value),
            [(h.key, b(h.value)) for h in r.headers] if r.headers else None) for r in df.collect()]
    return sorted(out, key=lambda r: r[:2])


@pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_spark_reads_exactly_the_committed_records_through_a_logs_life(storage):
    spark = delta_spark(storage)
    log = Log(storage)
    publisher = TablePublisher(storage.object_store())
    try:
        log.produce(log.producer, 4)                             # idempotent records, objects shared with audit
        result, rows = check(log, publisher, 0)
        assert len(rows) == 12 and spark_rows(spark, result.uri) == rows

        log.txn.begin_transaction()                              # a committed transaction
        log.produce(log.txn, 2)
        log.txn.commit_transaction(30)
        result, rows = check(log, publisher, 1)
        assert spark_rows(spark, result.uri) == rows

        log.txn.begin_transaction()                              # an aborted one: hidden by deletion vectors
        log.produce(log.txn, 3)
        log.txn.abort_transaction(30)
        result, rows = check(log, publisher, 2)
        assert len(rows) == 18 and spark_rows(spark, result.uri) == rows

        log.txn.begin_transaction()                              # an open one, and records past its LSO
        log.produce(log.txn, 2)
        log.produce(log.producer, 1)
        result, rows = check(log, publisher, 2, changed=False)
        assert len(rows) == 18 and spark_rows(spark, result.uri) == rows
        log.txn.commit_transaction(30)
        result, rows = check(log, publisher, 3)
        assert len(rows) == 27 and spark_rows(spark, result.uri) == rows

        assert compact(writer_broker(storage)).merges > 0      # the swaps: removes and adds in one version
        result, rows = check(log, publisher, 4)
        assert result.removed > 0 and spark_rows(spark, result.uri) == rows
        # column pruning and a pushed filter on Delta: one column of one partition
        values = spark.read.format("delta").load(result.uri).where("partition = 1").select("value").collect()
        assert sorted((bytes(r.value) for r in values if r.value is not None)) == \
            sorted(r[3] for r in rows if r[0] == 1 and r[3] is not None)
        # the compaction round's checkpoint (forced here at 5 versions), the commits it covers deleted:
        # delta-spark reads the table from txlake's Parquet checkpoint
        store = storage.object_store()
        now = int(time.time() * 1000)
        assert checkpoint_tables(store, now, 3_600_000, interval=1)[0].endswith(f"{4:020d}.checkpoint.parquet")
        assert clean_table_logs(store, now + 3_600_000, 60_000)[-1].endswith(f"{3:020d}.json")
        spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # open the log anew, not the cached snapshot
        assert spark_rows(spark, result.uri) == rows
    finally:
        log.close()
