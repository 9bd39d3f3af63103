"""The Spark sink: ``df.write.format("txlake")`` and ``writeStream.format("txlake")``, exactly once.

Facts these tests live with:

* Spark runs data source code -- the write tasks AND the writer's ``commit()`` -- in
  separate Python worker processes, never in this test process. ``memory://`` roots are
  per process, so only the ``file`` and ``s3`` backends are used here.
* One process per storage root may write (the writer lease). This test process creates
  the topics through an AdminClient, whose engine would hold the lease while open, so
  every test calls :func:`txlake.engine.registry.close_all` before a Spark write (the
  ``release`` helper): the Spark worker that commits can then take the lease. Two tests
  keep it: the commit is then handed to this process (engine/handoff.py), or refused with
  an error naming it when this process does not take it in time.
* The session is ``local[2,2]`` (tests/spark_support.py): a task that raises is retried
  once, as on a cluster. A retried attempt is also made by killing the first attempt
  (``SparkContext.killTaskAttempt`` kills and reschedules it, as speculation does to a
  losing attempt).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from spark_support import backend, file_storage, spark  # noqa: F401
from txlake import AdminClient, Consumer, NewTopic, TopicPartition
from txlake.engine import registry
from txlake.engine.partitioner import partition_for_key
from txlake.spark_connector.batch_write import TxlakeBatchWriter
from txlake.spark_connector.staged_commit import (BatchFenceError, commit_staged, last_committed_batch)
from txlake.spark_connector.staging import (STAGING_PREFIX, delete_stale_staged, murmur2_partitions, stage_task,
                                            write_columns)
from txlake.spark_connector.stream_write import TxlakeStreamWriter

#: ``key string, value string``, built without a SparkContext (``StructType.fromDDL`` needs one)
KEY_VALUE = StructType([StructField("key", StringType()), StructField("value", StringType())])


def release() -> None:
    """Close every txlake engine of this process, so it holds no writer lease (see the module docstring)."""
    registry.close_all()


def spark_options(target, **extra) -> dict[str, str]:
    """The Spark options of a storage target (``storage.options.*`` as strings; dicts as JSON)."""
    out = {"storage.url": target.url}
    for k, v in target.options.items():
        out[f"storage.options.{k}"] = json.dumps(v) if isinstance(v, (dict, list)) else str(v)
    out.update({k: str(v) for k, v in extra.items()})
    return out


def create_topics(target, **topics: int) -> None:
    with AdminClient(target.conf()) as admin:
        futures = admin.create_topics([NewTopic(name, n) for name, n in topics.items()])
        for f in futures.values():
            f.result()
    release()


def read_committed(target, topic: str, partitions: int, expected: int | None = None, timeout: float = 30.0) -> list:
    """Every record a read_committed Consumer sees in ``topic``: ``(key, value, partition, headers)``.

    Reads until ``expected`` records arrived (then looks 0.5 s more for extras: duplicates),
    or until nothing arrives for 1 s when ``expected`` is None.
    """
    c = Consumer({**target.conf(), "group.id": "verify", "isolation.level": "read_committed",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    deadline = time.monotonic() + timeout
    idle_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            batch = [m for m in c.consume(1000, 0.25) if m.error() is None]
            out.extend((m.key(), m.value(), m.partition(), m.headers()) for m in batch)
            if batch:
                idle_since = time.monotonic()
            if expected is not None and len(out) >= expected and time.monotonic() - idle_since > 0.5:
                break
            if expected is None and time.monotonic() - idle_since > 1.0:
                break
    finally:
        c.close()
        release()
    return out


def staged_objects(target) -> list[str]:
    return [o.key for o in target.object_store().list(STAGING_PREFIX)]


def write(df, target, mode: str | None = "append", **options) -> None:
    writer = df.write.format("txlake").mode(mode)          # None: Spark's default mode
    for k, v in spark_options(target, **options).items():
        writer = writer.option(k, v)
    writer.save()


# ------------------------------------------------------------------------------------ batch
def test_vectorised_partitioner_is_kafkas_default_partitioner():
    """Tasks partition keys with a vectorised murmur2: the same partition as engine/partitioner.py."""
    rnd = random.Random(7)
    keys = [bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 40))) for _ in range(5000)]
    keys += [b"", b"a", b"ab", b"abc", b"abcd", "héllo".encode()]
    for n in (1, 3, 10, 2**31 - 1):
        assert murmur2_partitions(pa.array(keys, pa.binary()), n).tolist() == [partition_for_key(k, n) for k in keys]
    sliced = pa.array(keys, pa.binary()).slice(10, 100)
    assert murmur2_partitions(sliced, 6).tolist() == [partition_for_key(k, 6) for k in keys[10:110]]
    assert murmur2_partitions(pa.array(["héllo"]), 6).tolist() == [partition_for_key("héllo".encode(), 6)]


def test_write_all_rows_visible_exactly_once_with_keys_values_partitions_headers(storage):
    """A successful job: every row appears once, on the partition Kafka's producer would pick."""
    create_topics(storage, orders=3)
    rows = []
    for i in range(60):
        key = None if i % 10 == 9 else f"k{i % 13}"
        partition = (i % 3) if i % 4 == 0 else None
        headers = [("h", f"{i}".encode()), ("n", None)] if i % 5 == 0 else None
        rows.append((key, f"v{i}".encode(), partition, headers))
    df = spark().createDataFrame(
        rows, "key string, value binary, partition int, headers array<struct<key: string, value: binary>>"
    ).repartition(3)
    write(df, storage, topic="orders")
    got = read_committed(storage, "orders", 3, expected=60)
    assert len(got) == 60
    by_value = {v: (k, p, h) for k, v, p, h in got}
    assert len(by_value) == 60
    for key, value, partition, headers in rows:
        k, p, h = by_value[value]
        assert k == (key.encode() if key is not None else None)
        if partition is not None:
            assert p == partition
        elif key is not None:
            assert p == partition_for_key(key.encode(), 3)       # Kafka's default partitioner
        assert h == (headers if headers else None)
    assert staged_objects(storage) == []


def test_rows_of_a_spark_partition_keep_their_order_in_each_kafka_partition(file_storage):
    """Tasks stage each batch grouped by Kafka partition (the commit then slices instead of
    copying): within a Kafka partition the rows still come in the Spark partition's order."""
    create_topics(file_storage, t=3)
    rows = [(f"k{(i * 7) % 11}" if i % 3 else None, f"v{i:04d}", (i * 5) % 3 if i % 2 else None) for i in range(300)]
    df = spark().createDataFrame(rows, "key string, value string, partition int").coalesce(1)
    write(df, file_storage, topic="t")
    got = read_committed(file_storage, "t", 3, expected=300)
    assert sorted(v for _, v, _, _ in got) == sorted(f"v{i:04d}".encode() for i in range(300))
    for p in range(3):
        values = [v for _, v, partition, _ in got if partition == p]
        assert values == sorted(values) and len(values) > 50, p  # v0000 < v0001 < ...: input order


def test_a_task_stages_batches_of_stage_batch_rows_grouped_by_partition(file_storage, monkeypatch):
    """Spark's small input batches are gathered into staged Arrow batches of STAGE_BATCH_ROWS
    rows (the last one shorter), each grouped by partition with the input order kept inside."""
    from txlake.spark_connector import staging

    monkeypatch.setattr(staging, "STAGE_BATCH_ROWS", 25)
    create_topics(file_storage, t=3)
    store = file_storage.object_store()
    columns = write_columns(KEY_VALUE, spark_options(file_storage, topic="t"))
    batches = [pa.record_batch([pa.array([f"k{(b * 7 + i) % 5}" for i in range(7)]),
                                pa.array([f"{b * 7 + i:02d}" for i in range(7)])], names=["key", "value"])
               for b in range(10)]
    message = stage_task(store, f"{STAGING_PREFIX}gather/", columns, batches)
    (staged,) = message.files
    assert staged.rows == 70 and staged.topics == (("t", 70),)
    got = list(pa.ipc.open_stream(store.get(staged.key)))
    assert [b.num_rows for b in got] == [28, 28, 14]
    for b in got:
        parts = b.column("partition").to_pylist()
        assert parts == sorted(parts)
        for p in set(parts):  # inside a partition: input order
            values = [v for v, q in zip(b.column("value").to_pylist(), parts) if q == p]
            assert values == sorted(values)
        assert all(partition_for_key(k, 3) == q for k, q in zip(b.column("key").to_pylist(), parts))


def test_topic_column_and_topic_option_overriding_it(file_storage):
    create_topics(file_storage, a=1, b=2, c=1)
    df = spark().createDataFrame([(t, f"{t}{i}") for i, t in enumerate("abababa")], "topic string, value string")
    write(df, file_storage)
    assert sorted(v for _, v, _, _ in read_committed(file_storage, "a", 1, expected=4)) == [b"a0", b"a2", b"a4", b"a6"]
    assert sorted(v for _, v, _, _ in read_committed(file_storage, "b", 2, expected=3)) == [b"b1", b"b3", b"b5"]
    write(df, file_storage, topic="c")                 # the option wins over the column, as in Spark's Kafka sink
    assert len(read_committed(file_storage, "c", 1, expected=7)) == 7
    assert len(read_committed(file_storage, "a", 1, expected=4)) == 4


@pytest.mark.parametrize("ddl, options, mode, message", [
    ("key string", {"topic": "t"}, "append", "Required attribute 'value' not found"),
    ("value int", {"topic": "t"}, "append", "value attribute type must be a StringType or BinaryType"),
    ("key int, value string", {"topic": "t"}, "append", "key attribute type must be a StringType or BinaryType"),
    ("value string", {}, "append", "topic option required when no 'topic' attribute is present"),
    ("topic int, value string", {}, "append", "Topic type must be a StringType"),
    ("value string, partition long", {"topic": "t"}, "append", "partition attribute type must be an IntegerType"),
    ("value string, headers array<string>", {"topic": "t"}, "append", "headers attribute type must be"),
    ("value string", {"topic": "t", "kafka.linger.ms": "soon"}, "append", "linger.ms"),
    ("value string", {"topic": "t", "staging.maxFileByte": "9"}, "append",
     "unknown option 'staging.maxfilebyte' .*did you mean 'staging.maxFileBytes'"),
    ("value string", {"topic": "t", "storage.uri": "x"}, "append", "storage.uri"),
    ("value string", {"topic": "t", "transactional.id": "x"}, "append", "applies to streaming writes only"),
])
def test_bad_input_is_refused_at_planning_as_by_the_kafka_sink(file_storage, ddl, options, mode, message):
    create_topics(file_storage, t=1)
    session = spark()  # first: parsing a DDL string needs a live SparkContext
    df = session.createDataFrame([], StructType.fromDDL(ddl))
    with pytest.raises(Exception, match=message):
        write(df, file_storage, mode=mode, **options)
    assert staged_objects(file_storage) == []


# ----------------------------------------------------- save modes: txlake.DefaultSource (the jar)
needs_jar = pytest.mark.skipif(shutil.which("javac") is None,
                               reason="no JDK (javac) here: txlake's Spark jar cannot be built")


@needs_jar
@pytest.mark.parametrize("mode", [None, "append"])      # None: Spark's default, ErrorIfExists
def test_default_and_append_save_modes_append_every_row_once(file_storage, mode):
    """As Spark's Kafka sink, ErrorIfExists (Spark's default) and Append append the rows, exactly
    once; ``spark.read.format("txlake")`` reads them back. Without txlake.DefaultSource Spark
    refused the default mode with UNSUPPORTED_DATA_SOURCE_SAVE_MODE before any txlake code ran."""
    create_topics(file_storage, t=2)
    rows = [(f"k{i}", f"v{i}", i % 2) for i in range(6)]
    df = spark().createDataFrame(rows, "key string, value string, partition int")
    write(df, file_storage, mode=mode, topic="t")
    got = read_committed(file_storage, "t", 2, expected=6)
    assert sorted((k, v, p) for k, v, p, _ in got) == sorted((k.encode(), v.encode(), p) for k, v, p in rows)
    back = spark().read.format("txlake").options(**spark_options(file_storage, subscribe="t")).load().collect()
    assert sorted((r.partition, r.offset) for r in back) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert sorted((bytes(r.key), bytes(r.value), r.partition) for r in back) == sorted(
        (k.encode(), v.encode(), p) for k, v, p in rows)
    assert staged_objects(file_storage) == []


@needs_jar
@pytest.mark.parametrize("mode", ["ignore", "overwrite"])
def test_ignore_and_overwrite_are_refused_with_the_kafka_sinks_message(file_storage, mode):
    """Spark's Kafka sink: "Save mode Overwrite not allowed for Kafka. Allowed save modes are
    Append and ErrorIfExists (default)." (``KafkaSourceProvider.createRelation``); nothing is
    staged or written."""
    from pyspark.errors import AnalysisException

    create_topics(file_storage, t=1)
    df = spark().createDataFrame([("v",)], "value string")
    with pytest.raises(AnalysisException) as refused:
        write(df, file_storage, mode=mode, topic="t")
    assert str(refused.value).splitlines()[0] == (
        f"Save mode {mode.capitalize()} not allowed for txlake. Allowed save modes are Append and "
        "ErrorIfExists (default).")
    assert staged_objects(file_storage) == []
    assert read_committed(file_storage, "t", 1) == []


@needs_jar
def test_format_txlake_is_the_jvm_class_and_streams_read_through_it(file_storage, tmp_path):
    """With the jar on ``spark.jars``, ``format("txlake")`` resolves to ``txlake.DefaultSource``
    (a class name, ahead of Python data source names) and ``readStream`` still reads through it:
    a ``Trigger.AvailableNow`` query gets exactly the committed records."""
    session = spark()
    looked_up = session._jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
        "txlake", session._jsparkSession.sessionState().conf())
    assert looked_up.getName() == "txlake.DefaultSource"
    create_topics(file_storage, t=2)
    write(session.createDataFrame([("a", 0), ("b", 1), ("c", 0)], "value string, partition int"),
          file_storage, mode=None, topic="t")
    stream = session.readStream.format("txlake").options(
        **spark_options(file_storage, subscribe="t", startingOffsets="earliest")).load()
    query = (stream.selectExpr("partition", "offset", "CAST(value AS STRING) AS value").writeStream
             .format("memory").queryName("txlake_stream_through_jar")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None, query.exception()
    rows = session.sql("SELECT * FROM txlake_stream_through_jar").collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(0, 0), (0, 1), (1, 0)]
    assert sorted((r.partition, r.value) for r in rows) == [(0, "a"), (0, "c"), (1, "b")]


@pytest.mark.parametrize("rows, ddl, options, message", [
    ([("x", "v")], "topic string, value string", {}, "Unknown topic 'x'"),
    ([(None, "v")], "topic string, value string", {}, "null topic present in the data"),
    ([("v", 7)], "value string, partition int", {"topic": "t"},
     r"partition 7 out of range for topic 't' \(2 partitions"),
    ([("v" * 1_000_001, 0)], "value string, partition int", {"topic": "t"},
     "a record of 1000001 bytes .* is larger than message.max.bytes=1000000"),
])
def test_bad_rows_fail_the_job_and_nothing_is_visible(file_storage, rows, ddl, options, message):
    create_topics(file_storage, t=2)
    good = [("t", "ok")] * 5 if ddl.startswith("topic") else [("ok", 0)] * 5
    df = spark().createDataFrame(good + rows, ddl).coalesce(1)
    with pytest.raises(Exception, match=message):
        write(df, file_storage, **options)
    assert read_committed(file_storage, "t", 2) == []
    assert staged_objects(file_storage) == []


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_killed_and_retried_task_attempt_writes_no_duplicates(file_storage, tmp_path):
    """Partition 1's first attempt stages part of its rows, then hangs and is killed; Spark
    reschedules it (attempt 1). Only attempt 1's objects are appended; attempt 0's are deleted."""
    create_topics(file_storage, events=2)
    marks = tmp_path / "marks"
    marks.mkdir()
    n1 = 25_000      # > 2 Arrow batches (spark.sql.execution.arrow.maxRecordsPerBatch = 10 000)

    def rows(index, it):
        from pyspark import TaskContext

        tc = TaskContext.get()
        (marks / f"{index}-{tc.attemptNumber()}-{tc.taskAttemptId()}").write_text("")
        count = 10 if index == 0 else n1
        for i in range(count):
            yield (f"p{index}-{i}", str(i))
        if index == 1 and tc.attemptNumber() == 0:
            time.sleep(120)      # hang: the test kills this attempt

    df = spark().createDataFrame(spark().sparkContext.parallelize([0], 2).mapPartitionsWithIndex(rows),
                                 "key string, value string")
    errors = []

    def killer():
        try:
            name = _wait_for(lambda: [p.name for p in marks.iterdir() if p.name.startswith("1-0-")], 120,
                             "partition 1's first attempt")[0]
            _wait_for(lambda: [k for k in staged_objects(file_storage) if "/00001-0-" in k], 120,
                      "objects staged by the first attempt")
            task_id = int(name.split("-")[2])
            assert spark().sparkContext._jsc.sc().killTaskAttempt(task_id, True, "test: a lost attempt")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    write(df, file_storage, topic="events", **{"staging.maxFileBytes": "1"})
    thread.join(10)
    assert not errors, errors
    assert any(p.name.startswith("1-1-") for p in marks.iterdir()), "partition 1 was retried"
    got = read_committed(file_storage, "events", 2, expected=10 + n1)
    assert len(got) == 10 + n1
    assert len({k for k, _, _, _ in got}) == 10 + n1
    assert staged_objects(file_storage) == []


def test_a_task_failing_once_and_retried_writes_no_duplicates(file_storage):
    """The first attempt of partition 1 raises after yielding some rows; Spark retries it.
    Needs a master that retries tasks (``local[N,F]`` with F > 1): ``local[2]`` fails the job at once."""
    master = spark().sparkContext.master
    retries = master.startswith("local[") and "," in master and int(master[:-1].split(",")[1]) > 1
    if not retries:
        pytest.skip(f"master {master} does not retry failed tasks; see "
                    "test_a_killed_and_retried_task_attempt_writes_no_duplicates for the retried attempt")
    create_topics(file_storage, events=2)

    def rows(index, it):
        from pyspark import TaskContext

        for i in range(50):
            if index == 1 and i == 30 and TaskContext.get().attemptNumber() == 0:
                raise RuntimeError("first attempt fails")
            yield (f"p{index}-{i}", str(i))

    df = spark().createDataFrame(spark().sparkContext.parallelize([0], 2).mapPartitionsWithIndex(rows),
                                 "key string, value string")
    write(df, file_storage, topic="events")
    got = read_committed(file_storage, "events", 2, expected=100)
    assert sorted(k for k, _, _, _ in got) == sorted(f"p{p}-{i}".encode() for p in range(2) for i in range(50))
    assert staged_objects(file_storage) == []


def test_only_the_attempts_spark_commits_are_appended(file_storage):
    """Two attempts of one partition both staged everything (as with speculation); the commit
    gets one message: its rows appear once and both attempts' objects are deleted."""
    create_topics(file_storage, t=1)
    schema = KEY_VALUE
    writer = TxlakeBatchWriter(spark_options(file_storage, topic="t"), schema, False)
    batch = pa.record_batch([pa.array(["a", "b"]), pa.array(["1", "2"])], names=["key", "value"])
    first = writer.write(iter([batch]))
    second = writer.write(iter([batch]))
    assert len(staged_objects(file_storage)) == 2
    writer.commit([second])
    assert writer.result.records == 2
    assert sorted(read_committed(file_storage, "t", 1, expected=2)) == [(b"a", b"1", 0, None), (b"b", b"2", 0, None)]
    assert staged_objects(file_storage) == []
    assert first.files[0].key not in staged_objects(file_storage)


def test_a_job_failing_after_some_tasks_finished_leaves_nothing(file_storage):
    """Partition 0 stages and finishes; then partition 1 fails: nothing is visible, nothing stays staged."""
    create_topics(file_storage, t=2)
    store = file_storage.object_store()

    def rows(index, it):
        if index == 1:
            deadline = time.monotonic() + 60
            while not [o for o in store.list(STAGING_PREFIX) if "/00000-" in o.key]:
                if time.monotonic() > deadline:
                    raise TimeoutError("partition 0 never staged")
                time.sleep(0.05)
            raise RuntimeError("simulated failure after partition 0 finished")
        for i in range(100):
            yield (f"k{i}", f"v{i}")

    df = spark().createDataFrame(spark().sparkContext.parallelize([0], 2).mapPartitionsWithIndex(rows),
                                 "key string, value string")
    with pytest.raises(Exception, match="simulated failure after partition 0 finished"):
        write(df, file_storage, topic="t")
    assert read_committed(file_storage, "t", 2) == []
    assert staged_objects(file_storage) == []


def test_commit_is_handed_to_this_process_while_it_holds_the_lease(file_storage):
    """Issue 5 "Writer processes": this process keeps its engine open -- it created the topic
    and a producer is still writing -- so the Spark worker cannot take the writer lease. Its
    commit is handed to this process (engine/handoff.py), which runs it: the rows become
    visible as one transaction, this process stays the writer and keeps producing."""
    from txlake import Producer
    from txlake.catalog.catalog import Catalog

    admin = AdminClient(file_storage.conf())
    producer = Producer(file_storage.conf())
    try:
        admin.create_topics([NewTopic("t", 1)])["t"].result()
        producer.produce("t", b"before", key=b"notebook")
        producer.flush(10)
        epoch = Catalog.open(file_storage.object_store()).state.lease.epoch
        df = spark().createDataFrame([("a", "1"), ("b", "2")], "key string, value string")
        write(df, file_storage, topic="t")
        producer.produce("t", b"after", key=b"notebook")
        producer.flush(10)
        lease = Catalog.open(file_storage.object_store()).state.lease
        assert (lease.epoch, lease.info["pid"]) == (epoch, os.getpid())  # no takeover: this process wrote the rows
        assert staged_objects(file_storage) == []
    finally:
        producer.close()
        admin.close()
        release()
    got = read_committed(file_storage, "t", 1, expected=4)
    assert [(k, v) for k, v, _, _ in got] == [(b"notebook", b"before"), (b"a", b"1"), (b"b", b"2"),
                                             (b"notebook", b"after")]


def test_commit_refused_when_the_holder_does_not_take_it_names_it(file_storage):
    """A lease holder that does not take the handed-over commit in time (it looks for
    hand-overs only every 60 s here): the error names the holder and says what to do.
    Nothing becomes visible."""
    admin = AdminClient({**file_storage.conf(), "storage.handoff.poll.ms": 60_000})
    try:
        admin.create_topics([NewTopic("t", 1)])["t"].result()
        df = spark().createDataFrame([("a", "1"), ("b", "2")], "key string, value string")
        with pytest.raises(Exception) as info:
            write(df, file_storage, topic="t", **{"storage.handoff.timeout.ms": 1500})
        text = str(info.value)
        assert "writer lease is held by" in text
        assert f"pid {os.getpid()}" in text
        assert "close its txlake Producer/Consumer/AdminClient" in text and "wait for the lease to lapse" in text
        assert "did not take it within 2 s (storage.handoff.timeout.ms)" in text
        assert staged_objects(file_storage) == []
    finally:
        admin.close()
        release()
    assert read_committed(file_storage, "t", 1) == []


# ------------------------------------------------------------------------------------ streaming
def _json_file(folder, name: str, rows: list[tuple[str, str]]) -> None:
    tmp = folder / f".{name}.tmp"
    tmp.write_text("".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in rows))
    tmp.rename(folder / name)


def _run_stream(source, checkpoint, target, **options):
    df = (spark().readStream.schema("key string, value string").option("maxFilesPerTrigger", 1)
          .json(str(source)))
    writer = df.writeStream.format("txlake").option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    for k, v in spark_options(target, **options).items():
        writer = writer.option(k, v)
    query = writer.start()
    query.awaitTermination(180)
    assert not query.isActive
    assert query.exception() is None, query.exception()
    return query


def test_stream_restarted_from_its_checkpoint_writes_every_batch_exactly_once(storage, tmp_path):
    """Two micro-batches; then the checkpoint loses its last commit mark (a crash after the
    sink committed, before Spark recorded it): the restart re-runs that batch, which writes
    nothing, then writes a new one. Every row once; a re-commit of a committed batch id is a no-op."""
    create_topics(storage, out=2)
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    files = {f"f{i}.json": [(f"k{i}-{j}", f"v{i}-{j}") for j in range(10)] for i in range(3)}
    _json_file(source, "f0.json", files["f0.json"])
    _json_file(source, "f1.json", files["f1.json"])
    query = _run_stream(source, checkpoint, storage, topic="out")
    group = f"txlake-spark-sink-{query.id}"
    assert last_committed_batch(storage.conf(), group)[0] == 1
    assert len(read_committed(storage, "out", 2, expected=20)) == 20

    (checkpoint / "commits" / "1").unlink()           # Spark will re-run batch 1
    crc = checkpoint / "commits" / ".1.crc"
    if crc.exists():
        crc.unlink()
    _json_file(source, "f2.json", files["f2.json"])
    restarted = _run_stream(source, checkpoint, storage, topic="out")
    assert restarted.id == query.id                  # the id lives in the checkpoint
    assert restarted.lastProgress["batchId"] == 2
    assert last_committed_batch(storage.conf(), group) == (2, str(query.id))
    got = read_committed(storage, "out", 2, expected=30)
    expected = sorted((k.encode(), v.encode()) for rows in files.values() for k, v in rows)
    assert sorted((k, v) for k, v, _, _ in got) == expected
    assert staged_objects(storage) == []

    # the sink's commit of an already committed batch id, invoked again: nothing is written
    schema = KEY_VALUE
    writer = TxlakeStreamWriter(spark_options(storage, topic="out"), schema, False)
    batch = pa.record_batch([pa.array(["again"]), pa.array(["x"])], names=["key", "value"])
    message = writer.write(iter([batch]))
    message.query_id = str(query.id)
    writer.commit([message], 2)
    assert writer.result.skipped and writer.result.last_batch_id == 2
    assert staged_objects(storage) == []
    assert len(read_committed(storage, "out", 2, expected=30)) == 30


def test_stream_commit_twice_for_one_batch_id_writes_once(file_storage):
    """The sink's commit(messages, batchId), invoked twice for the same batch id (Spark's
    re-run of a batch whose commit it did not record), appends the batch once."""
    create_topics(file_storage, t=1)
    schema = KEY_VALUE
    options = spark_options(file_storage, topic="t", **{"transactional.id": "orders-sink"})

    def run(batch_id: int, values: list[str], query_id: str | None = None):
        writer = TxlakeStreamWriter(options, schema, False)     # Spark makes one per commit
        message = writer.write(iter([pa.record_batch([pa.array(values), pa.array(values)], names=["key", "value"])]))
        message.query_id = query_id
        writer.commit([message], batch_id)
        return writer.result

    assert run(0, ["a", "b"]).records == 2
    assert run(0, ["a", "b"]).skipped
    assert run(1, ["c"]).records == 1
    assert run(1, ["c"]).skipped
    assert run(0, ["a", "b"]).skipped                            # an older batch id: also done
    got = read_committed(file_storage, "t", 1, expected=3)
    assert [k for k, _, _, _ in got] == [b"a", b"b", b"c"]
    assert last_committed_batch(file_storage.conf(), "orders-sink") == (1, None)
    assert staged_objects(file_storage) == []
    release()
    # a different query (a fresh checkpoint) reusing the id is refused, not silently skipped
    run(2, ["d"], query_id="q-1")
    with pytest.raises(BatchFenceError, match="keeps its id only with its checkpoint"):
        run(0, ["x"], query_id="q-2")
    release()


def test_every_commit_sweeps_staged_objects_older_than_seven_days(file_storage):
    """Leftovers of writes whose driver died before committing are deleted by a later commit."""
    store = file_storage.object_store()
    store.put(f"{STAGING_PREFIX}dead-job/00000-0-1-abc-00000.arrows", b"old")
    store.put(f"{STAGING_PREFIX}running-job/00000-0-2-def-00000.arrows", b"new")
    old = time.time() - 8 * 24 * 3600
    os.utime(store.fs_path(f"{STAGING_PREFIX}dead-job/00000-0-1-abc-00000.arrows"), (old, old))
    assert delete_stale_staged(store) == 1
    assert staged_objects(file_storage) == [f"{STAGING_PREFIX}running-job/00000-0-2-def-00000.arrows"]


def test_commit_staged_with_nothing_staged_commits_nothing(file_storage):
    """An empty job appends nothing and opens no transaction: not even the writer lease is taken."""
    from txlake.catalog.catalog import Catalog

    create_topics(file_storage, t=1)
    version = Catalog.open(file_storage.object_store()).state.version
    result = commit_staged(file_storage.conf(), "empty", [])
    assert result.records == 0 and not result.skipped
    assert Catalog.open(file_storage.object_store()).state.version == version


@pytest.mark.parametrize("damage", ["batch_dropped", "garbage"])
def test_a_damaged_staged_object_fails_the_commit_naming_it_and_nothing_is_visible(file_storage, damage):
    """Staged objects are written without fsync (scratch data): one that lost its last Arrow
    batch -- still a valid stream -- or that is garbage fails the commit, naming the object;
    the transaction is aborted, so none of the write's rows are visible."""
    from txlake.formats.errors import CorruptObjectError

    create_topics(file_storage, t=2)
    writer = TxlakeBatchWriter(spark_options(file_storage, topic="t"), KEY_VALUE, False)
    batches = [pa.record_batch([pa.array([f"k{i}", f"j{i}"]), pa.array([f"{i}", f"{i}"])], names=["key", "value"])
               for i in range(3)]
    message = writer.write(iter(batches))
    (staged,) = message.files
    store = file_storage.object_store()
    if damage == "garbage":
        store.put(staged.key, b"not an arrow stream")
    else:
        reader = pa.ipc.open_stream(store.get(staged.key))
        kept = list(reader)[:-1]
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, reader.schema) as w:
            for rb in kept:
                w.write_batch(rb)
        store.put(staged.key, sink.getvalue().to_pybytes())
    with pytest.raises(CorruptObjectError, match=staged.key.replace(".", r"\.")):
        writer.commit([message])
    assert read_committed(file_storage, "t", 2) == []
