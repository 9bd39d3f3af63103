"""Every public call fails with the error confluent-kafka's contract names (API.md "Errors").

A call raises KafkaException -- its KafkaError with Kafka's code, the retriable flag and a
message naming the object, the underlying error chained as ``__cause__`` -- or the
TypeError/ValueError confluent-kafka raises for the same misuse. One bad record never
blocks the queue behind it (issue 14, defects 6, 8 and 9).
"""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import duckdb
import pytest
from click.testing import CliRunner

import txlake.duckdb as txduck
from test_formats import _retag
from txlake import AdminClient, Consumer, KafkaError, KafkaException, NewTopic, Producer, TopicPartition
from txlake.catalog.catalog import Catalog
from txlake.catalog.storage import ObjectStore
from txlake.cli import main
from txlake.engine import registry
from txlake.engine.group_offsets import partition_for as offsets_partition_for
from txlake.engine.requests import ProduceBatch
from txlake.engine.transaction_state_manager import partition_for as txn_partition_for
from txlake.formats.errors import CorruptObjectError, UnsupportedFormatVersionError
from txlake.formats.records import PAYLOAD_SCHEMA
from txlake.formats.versioning import VERSION_KEY


@pytest.fixture
def root(tmp_path):
    url = f"file://{tmp_path}/root"
    yield url
    registry.close_all()


@pytest.fixture
def conf(root):
    return {"storage.url": root, "storage.flush.linger.ms": 1}


def create(conf, name, partitions=1):
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(name, partitions)])[name].result()


def kafka_error(excinfo) -> KafkaError:
    assert type(excinfo.value) is KafkaException
    return excinfo.value.args[0]


def newest_commit(store: ObjectStore) -> str:
    return [o.key for o in store.list("_catalog/commits/")][-1]


def append_raw(url, topic, partition, key, value=b"{}"):
    """Append one record to ``topic`` [``partition``] through the engine (no client checks)."""
    broker = registry.acquire_broker(url)
    try:
        broker.ensure_writer()
        (result,) = broker.produce([ProduceBatch(topic, partition, pa.table(
            {"timestamp": [1], "key": [key], "value": [value], "headers": [None]}, schema=PAYLOAD_SCHEMA))],
            internal_topics_allowed=True)   # as a coordinator appends (a client is refused)
        assert result.error.name == "NO_ERROR"
    finally:
        registry.release_broker(broker)
        registry.close_all()


# ------------------------------------------------------------------ defect 6: produce timestamps
@pytest.mark.parametrize("timestamp, kind", [("now", str), (1.5, float), (None, type(None)), (b"1", bytes)])
def test_a_timestamp_that_is_not_an_int_is_a_type_error_at_produce(conf, timestamp, kind):
    create(conf, "t")
    p = Producer(conf)
    with pytest.raises(TypeError, match=f"^timestamp must be an int \\(ms since the epoch\\), not {kind.__name__}$"):
        p.produce("t", b"v", timestamp=timestamp)
    assert len(p) == 0
    assert p.flush(5) == 0
    assert p.close(5) is True


@pytest.mark.parametrize("timestamp", [2**70, 2**63, -2, -5])
def test_a_timestamp_out_of_kafkas_range_is_refused_at_produce_and_never_blocks_the_queue(conf, timestamp):
    create(conf, "t")
    p = Producer(conf)
    reports = []
    p.produce("t", b"before", on_delivery=lambda err, msg: reports.append((err, msg.value())))
    with pytest.raises(KafkaException) as info:
        p.produce("t", b"bad", timestamp=timestamp, on_delivery=lambda err, msg: reports.append((err, msg.value())))
    err = kafka_error(info)
    assert (err.code(), err.retriable(), err.fatal()) == (KafkaError._INVALID_ARG, False, False)
    assert err.str() == (f"Invalid timestamp {timestamp} for a record to t: a timestamp is -1 (none: the producer "
                         "uses the current time) or 0..9223372036854775807 ms since the epoch")
    p.produce("t", b"after", timestamp=1_700_000_000_000, on_delivery=lambda err, msg: reports.append((err, msg.value())))
    assert p.flush(10) == 0          # returns: nothing is stuck behind the refused record
    assert reports == [(None, b"before"), (None, b"after")]
    assert p.close(10) is True
    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("t", 0)])
    got = c.consume(10, 5)
    assert [(m.offset(), m.value()) for m in got] == [(0, b"before"), (1, b"after")]
    assert got[1].timestamp()[1] == 1_700_000_000_000
    c.close()


def test_kafkas_boundary_timestamps_are_accepted(conf):
    """-1 (NO_TIMESTAMP) and 0 mean now; the largest int64 is kept as it is on a topic whose
    ``message.timestamp.after.max.ms`` allows it. Under Kafka 4's default (1 h) it is refused
    with INVALID_TIMESTAMP, as Apache Kafka does (tests/test_differential_basic.py)."""
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("t", 1, config={"message.timestamp.after.max.ms": str(2**63 - 1)}),
                             NewTopic("default", 1)])["t"].result()
    with Producer(conf) as p:
        reports = []
        p.produce("default", b"x", timestamp=2**63 - 1, on_delivery=lambda err, msg: reports.append(err))
        p.flush(10)
        assert [err.code() for err in reports] == [KafkaError.INVALID_TIMESTAMP]
    before = int(time.time() * 1000)
    with Producer(conf) as p:
        for ts in (-1, 0, 2**63 - 1):
            p.produce("t", str(ts).encode(), timestamp=ts)
        assert p.flush(10) == 0
    after = int(time.time() * 1000)
    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("t", 0)])
    stamps = {m.value(): m.timestamp()[1] for m in c.consume(10, 5)}
    c.close()
    assert before <= stamps[b"-1"] <= after and before <= stamps[b"0"] <= after
    assert stamps[b"9223372036854775807"] == 2**63 - 1


def test_produce_arrow_refuses_a_timestamp_column_below_minus_one_and_stamps_none_with_now(conf):
    create(conf, "t")
    with Producer(conf) as p:
        with pytest.raises(KafkaException) as info:
            p.produce_arrow("t", pa.table({"value": [b"a", b"b"], "ts": [5, -7]}), key=None, timestamp="ts")
        err = kafka_error(info)
        assert (err.code(), err.retriable()) == (KafkaError._INVALID_ARG, False)
        assert err.str().startswith("timestamp column 'ts' for t holds -7: a timestamp is -1")
        before = int(time.time() * 1000)
        p.produce_arrow("t", pa.table({"value": [b"x", b"y", b"z"], "ts": pa.array([None, -1, 42], pa.int64())}),
                        key=None, timestamp="ts")
        after = int(time.time() * 1000)
    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("t", 0)])
    stamps = {m.value(): m.timestamp()[1] for m in c.consume(10, 5)}
    c.close()
    assert set(stamps) == {b"x", b"y", b"z"}
    assert before <= stamps[b"x"] <= after and before <= stamps[b"y"] <= after and stamps[b"z"] == 42


def test_records_that_cannot_be_encoded_fail_alone_with_a_delivery_report(conf, monkeypatch):
    """What produce() cannot tell is bad (here: its timestamp check switched off) fails its
    batch with a delivery report; flush() and close() return and other partitions deliver."""
    import txlake.producer as producer_module

    create(conf, "t", 2)
    monkeypatch.setattr(producer_module, "_timestamp", lambda ts, topic: ts, raising=False)  # old code: no check
    p = Producer(conf)
    reports = []
    p.produce("t", b"bad", partition=0, timestamp=2**70, on_delivery=lambda err, msg: reports.append((err, msg)))
    p.produce("t", b"good", partition=1, timestamp=7, on_delivery=lambda err, msg: reports.append((err, msg)))
    started = time.monotonic()
    assert p.flush(10) == 0
    assert p.close(10) is True
    assert time.monotonic() - started < 10
    by_value = {msg.value(): (err, msg) for err, msg in reports}
    err, msg = by_value[b"bad"]
    assert (err.code(), msg.topic(), msg.partition(), msg.offset()) == (KafkaError._BAD_MSG, "t", 0, -1001)
    assert err.str().startswith("1 record(s) for t [0] cannot be encoded: OverflowError")
    err, msg = by_value[b"good"]
    assert err is None and (msg.partition(), msg.offset()) == (1, 0)


# ------------------------------------------------------------------ defect 8: errors are KafkaException
def _corrupt_newest_commit(root, how):
    registry.close_all()
    store = ObjectStore(root)
    key = newest_commit(store)
    data = store.get(key)
    store.delete(key)
    store.put(key, b"PAR1 truncated" if how == "corrupt" else _retag(data, **{VERSION_KEY.decode(): "99"}))
    return store.uri(key)


@pytest.mark.parametrize("client", [Producer, Consumer, AdminClient])
@pytest.mark.parametrize("how, code, cause", [("corrupt", KafkaError.CORRUPT_MESSAGE, CorruptObjectError),
                                              ("newer", KafkaError.UNSUPPORTED_VERSION, UnsupportedFormatVersionError)])
def test_constructors_raise_kafka_exception_naming_an_unreadable_catalog_commit(conf, root, client, how, code, cause):
    create(conf, "t")
    url = _corrupt_newest_commit(root, how)
    with pytest.raises(KafkaException) as info:
        client(conf)
    err = kafka_error(info)
    assert (err.code(), err.retriable(), err.fatal()) == (code, False, False)
    assert err.str().startswith(f"{client.__name__}: cannot open storage.url {root}: {url}: ")
    assert type(info.value.__cause__) is cause and info.value.__cause__.location == url


@pytest.mark.parametrize("key, code, cause, text", [
    (b"garbage", KafkaError.CORRUPT_MESSAGE, CorruptObjectError, "the key of a transaction-log record is not UTF-8 JSON"),
    (json.dumps({"v": 9, "transactional_id": "tx"}).encode(), KafkaError.UNSUPPORTED_VERSION,
     UnsupportedFormatVersionError, "transaction-log key format version 9 is not supported"),
])
def test_init_transactions_raises_kafka_exception_naming_an_unreadable_transaction_log_record(conf, root, key, code,
                                                                                             cause, text):
    with Producer({**conf, "transactional.id": "tx"}) as p:
        p.init_transactions(10)
    registry.close_all()
    append_raw(root, "__transaction_state", txn_partition_for("tx"), key)
    p = Producer({**conf, "transactional.id": "tx"})
    with pytest.raises(KafkaException) as info:
        p.init_transactions(10)
    err = kafka_error(info)
    assert (err.code(), err.retriable(), err.fatal()) == (code, False, False)
    location = f"__transaction_state-{txn_partition_for('tx')}@1"
    assert err.str().startswith(f"InitProducerId of transactional id 'tx': {location}: {text}")
    assert type(info.value.__cause__) is cause
    p.close(5)


def test_committed_raises_kafka_exception_naming_an_unreadable_offsets_partition(conf, root, caplog):
    create(conf, "t")
    c = Consumer({**conf, "group.id": "g"})
    c.commit(offsets=[TopicPartition("t", 0, 3)], asynchronous=False)
    c.close()
    registry.close_all()
    store = ObjectStore(root)
    partition = offsets_partition_for("g")
    (segment,) = Catalog.open(store).state.partition("__consumer_offsets", partition).segments
    store.put(segment.path, b"not parquet at all")
    c = Consumer({**conf, "group.id": "g"})
    with caplog.at_level(logging.WARNING, logger="txlake.engine.apis.group_apis"):
        with pytest.raises(KafkaException) as info:
            c.committed([TopicPartition("t", 0)])
    err = kafka_error(info)
    assert err.code() == KafkaError.CORRUPT_MESSAGE
    # OffsetFetch's response carries only the code (the in-process client calls engine/apis as
    # a wire client does); the engine's log names the partition and the object
    assert err.str() == "committed(): OffsetFetch of group g answered CORRUPT_MESSAGE (the engine's log says what failed)"
    (line,) = [r.getMessage() for r in caplog.records if r.name == "txlake.engine.apis.group_apis"]
    assert line.startswith(f"OffsetFetch of group g: cannot read __consumer_offsets-{partition}: cannot read "
                           f"__consumer_offsets [{partition}] at offset 0: {store.uri(segment.path)}")
    c.close()


def test_consume_reports_a_catalog_entry_naming_an_invalid_object_key_as_corrupt(root):
    from txlake.catalog.writer_lease import WriterLease

    catalog = Catalog.open(ObjectStore(root))
    lease = WriterLease(catalog, lease_ms=60_000)
    epoch = lease.acquire()
    catalog.commit([{"action": "create_topic", "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    catalog.commit([{"action": "add_segment", "topic": "t", "partition": 0, "path": "../outside", "base_offset": 0,
                     "last_offset": 0, "record_count": 1, "size_bytes": 100, "min_timestamp": 1, "max_timestamp": 1,
                     "row_group_start": 0, "row_group_count": 1, "high_watermark": 1, "last_stable_offset": 1}], epoch)
    lease.release()
    c = Consumer({"storage.url": root, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("t", 0)])
    (event,) = c.consume(5, 2)
    assert (event.topic(), event.partition(), event.error().code()) == ("t", 0, KafkaError.CORRUPT_MESSAGE)
    assert event.error().str() == ("cannot read t [0] at offset 0: invalid object key '../outside': empty, '.' "
                                   "or '..' path component")
    c.close()


def test_consume_raises_kafka_exception_naming_a_corrupt_catalog_commit_it_tails(conf, root):
    create(conf, "t")
    registry.close_all()
    c = Consumer({**conf, "auto.offset.reset": "earliest"})   # a reader: it tails the catalog
    c.assign([TopicPartition("t", 0)])
    assert c.consume(1, 0.1) == []
    store = ObjectStore(root)
    next_version = int(newest_commit(store).rsplit("/", 1)[1].split(".")[0]) + 1
    bad = f"_catalog/commits/{next_version:020d}.parquet"
    store.put(bad, b"PAR1 truncated")
    with pytest.raises(KafkaException) as info:
        c.consume(1, 2)
    err = kafka_error(info)
    assert (err.code(), err.retriable()) == (KafkaError.CORRUPT_MESSAGE, False)
    assert err.str().startswith(f"consume() from {root}: {store.uri(bad)}: ")
    assert type(info.value.__cause__) is CorruptObjectError
    c.close()


def test_produce_raises_kafka_exception_naming_a_corrupt_catalog_commit_it_meets_looking_up_a_topic(conf, root):
    create(conf, "t")
    registry.close_all()
    p = Producer(conf)
    store = ObjectStore(root)
    next_version = int(newest_commit(store).rsplit("/", 1)[1].split(".")[0]) + 1
    bad = f"_catalog/commits/{next_version:020d}.parquet"
    store.put(bad, b"PAR1 truncated")
    with pytest.raises(KafkaException) as info:
        p.produce("new-topic", b"v")
    err = kafka_error(info)
    assert (err.code(), err.retriable()) == (KafkaError.CORRUPT_MESSAGE, False)
    assert err.str().startswith(f"looking up topic new-topic in {root}: {store.uri(bad)}: ")
    assert len(p) == 0 and p.close(5) is True


def test_send_offsets_to_transaction_with_positions_of_the_wrong_type_raises_type_error(conf):
    create(conf, "t")
    p = Producer({**conf, "transactional.id": "tx"})
    p.init_transactions(10)
    p.begin_transaction()
    with pytest.raises(TypeError) as info:
        p.send_offsets_to_transaction(("t", 0, 5), "g", 10)
    assert str(info.value) == "send_offsets_to_transaction() requires list of TopicPartition, not tuple"
    p.abort_transaction(10)
    p.close(5)


@pytest.mark.parametrize("call, message", [
    (lambda c: c.assign("ok"), "assign() requires list of TopicPartition, not str"),
    (lambda c: c.assign(["ok"]), "assign() requires list of TopicPartition: got a str ('ok')"),
    (lambda c: c.assign(None), "assign() requires list of TopicPartition, not NoneType"),
    (lambda c: c.incremental_assign(("t", 0)), "incremental_assign() requires list of TopicPartition, not tuple"),
    (lambda c: c.incremental_unassign([0]), "incremental_unassign() requires list of TopicPartition: got a int (0)"),
    (lambda c: c.committed("t"), "committed() requires list of TopicPartition, not str"),
    (lambda c: c.position(None), "position() requires list of TopicPartition, not NoneType"),
    (lambda c: c.offsets_for_times(5), "offsets_for_times() requires list of TopicPartition, not int"),
    (lambda c: c.commit(offsets="t", asynchronous=False), "commit() requires list of TopicPartition, not str"),
    (lambda c: c.commit(message="t", asynchronous=False), "commit() requires a Message, not str"),
    (lambda c: c.seek("t"), "seek() requires a TopicPartition, not str"),
    (lambda c: c.get_watermark_offsets(("t", 0)), "get_watermark_offsets() requires a TopicPartition, not tuple"),
])
def test_consumer_calls_with_arguments_of_the_wrong_type_raise_type_error(conf, call, message):
    create(conf, "t")
    c = Consumer({**conf, "group.id": "g"})
    with pytest.raises(TypeError) as info:
        call(c)
    assert str(info.value) == message
    assert c.assignment() == []
    c.close()


@pytest.mark.parametrize("args, message", [
    ((None,), "TopicPartition topic must be a str, not NoneType"),
    ((b"t", 0), "TopicPartition topic must be a str, not bytes"),
    (("t", "0"), "TopicPartition partition must be an int, not str"),
    (("t", 0, 1.5), "TopicPartition offset must be an int, not float"),
    (("t", 0, 5, 7), "TopicPartition metadata must be a str or None, not int"),
])
def test_topic_partition_refuses_arguments_of_the_wrong_type(args, message):
    with pytest.raises(TypeError) as info:
        TopicPartition(*args)
    assert str(info.value) == message


def _replace_without_column(store, key, column):
    table = pq.read_table(io.BytesIO(store.get(key)))
    sink = io.BytesIO()
    pq.write_table(table.drop_columns([column]).replace_schema_metadata(table.schema.metadata), sink)
    store.put(key, sink.getvalue())


def test_duckdb_names_a_segment_object_that_lacks_a_column(conf, root):
    create(conf, "t")
    with Producer(conf) as p:
        p.produce("t", b"v")
        assert p.flush(10) == 0
    registry.close_all()
    store = ObjectStore(root)
    (segment,) = Catalog.open(store).state.partition("t", 0).segments
    _replace_without_column(store, segment.path, "is_control")
    with pytest.warns(txduck.UnreadableTopicWarning, match="column 'is_control' is missing"):
        con = txduck.connect(root)   # the topic's view is an error, never the connection (defect 7)
    with pytest.raises(duckdb.Error, match="column 'is_control' is missing") as info:
        con.sql("SELECT * FROM t").fetchall()
    assert store.uri(segment.path) in str(info.value) and "topic 't' cannot be read" in str(info.value)
    con.close()


def test_duckdb_refresh_names_an_object_replaced_after_it_was_first_read(conf, root):
    """The footer cache already vouched for the object: the failed DuckDB bind is traced to it."""
    create(conf, "t")
    with Producer(conf) as p:
        p.produce("t", b"one")
        assert p.flush(10) == 0
    store = ObjectStore(root)
    (first,) = Catalog.open(store).state.partition("t", 0).segments
    con = txduck.connect(root)
    assert con.sql('SELECT value FROM t').fetchall() == [(b"one",)]
    _replace_without_column(store, first.path, "is_control")
    with Producer(conf) as p:
        p.produce("t", b"two")
        assert p.flush(10) == 0
    with pytest.warns(txduck.UnreadableTopicWarning, match="column 'is_control' is missing"):
        txduck.refresh(con)   # DuckDB's bind fails; the object at fault is found and named
    assert txduck.unreadable_topics(con)["t"].startswith(
        f"txlake: topic 't' cannot be read: CorruptObjectError: {store.uri(first.path)}")
    with pytest.raises(duckdb.Error, match="column 'is_control' is missing"):
        con.sql("SELECT * FROM t").fetchall()
    con.close()


# ------------------------------------------------------------------ defect 9: validation
@pytest.mark.parametrize("client", [Producer, Consumer, AdminClient])
@pytest.mark.parametrize("url", ["", "   "])
def test_an_empty_storage_url_is_invalid_naming_the_key(client, url, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))        # the old fallback would have made ~/.txlake/data here
    monkeypatch.delenv("TXLAKE_STORAGE", raising=False)
    with pytest.raises(KafkaException) as info:
        client({"storage.url": url})
    err = kafka_error(info)
    assert (err.code(), err.retriable()) == (KafkaError._INVALID_ARG, False)
    assert err.str() == (f'Invalid value "{url}" for configuration property "storage.url": expected a storage root '
                         "URL (file:///path, s3://bucket/prefix or memory://name), not an empty string")
    assert not (tmp_path / ".txlake").exists()


def test_the_cli_refuses_an_empty_storage_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TXLAKE_STORAGE", raising=False)
    result = CliRunner().invoke(main, ["topics", "list", "--storage", ""], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.stderr.endswith("Error: Invalid value for --storage: must name a storage root, not an empty string\n")
    assert not (tmp_path / ".txlake").exists()


def test_a_missing_s3_bucket_is_an_error_naming_the_bucket(s3_server):
    options = s3_server.storage_options()
    url = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/root"
    bucket = url[5:].split("/")[0]
    args = ["topics", "list", "--storage", url] + [x for k, v in options.items()
                                                   for x in ("-O", f"{k}={v if isinstance(v, str) else json.dumps(v)}")]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (f"Error: BucketNotFoundError: storage list failed for {url}/_catalog/checkpoints/: the "
                             f"S3 bucket {bucket!r} does not exist (create it, or fix the storage url)\n")
    conf = {"storage.url": url, "storage.options": options}
    for client in (Consumer, AdminClient):
        with pytest.raises(KafkaException) as info:
            client(conf)
        err = kafka_error(info)
        assert (err.code(), err.retriable()) == (KafkaError.KAFKA_STORAGE_ERROR, False)
        assert err.str().endswith(f"the S3 bucket {bucket!r} does not exist (create it, or fix the storage url)")
        assert type(info.value.__cause__).__name__ == "BucketNotFoundError"

    from txlake.catalog.storage import BucketNotFoundError

    store = ObjectStore(url, options)
    with pytest.raises(BucketNotFoundError) as info:
        store.list("")
    assert info.value.bucket == bucket
    assert str(info.value) == (f"storage list failed for {url}/: the S3 bucket {bucket!r} does not exist (create it, "
                               "or fix the storage url)")
    with pytest.raises(BucketNotFoundError):
        store.exists("x")
    with pytest.raises(BucketNotFoundError):
        store.put_if_absent("x", b"1")


def test_offset_commits_for_unknown_topics_and_partitions_answer_unknown_topic_or_partition(conf):
    create(conf, "t", 2)
    results = []
    c = Consumer({**conf, "group.id": "g", "on_commit": lambda err, parts: results.append((err, parts))})
    with pytest.raises(KafkaException) as info:
        c.commit(offsets=[TopicPartition("t", 0, 5), TopicPartition("t", 2, 1), TopicPartition("nope", 0, 3)],
                 asynchronous=False)
    err = kafka_error(info)
    assert (err.code(), err.name(), err.retriable()) == (3, "UNKNOWN_TOPIC_OR_PART", True)
    assert err.str() == "offset commit of t [2] failed: UNKNOWN_TOPIC_OR_PART"   # the last failed partition's
    c.commit(offsets=[TopicPartition("nope", 1, 9)], asynchronous=True)
    assert c.poll(1) is None
    ((async_err, parts),) = results
    assert async_err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert [(tp.topic, tp.partition, tp.offset, tp.error.code()) for tp in parts] == [("nope", 1, 9, 3)]
    assert [(tp.topic, tp.partition, tp.offset) for tp in c.committed(
        [TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("nope", 0)])] == [
        ("t", 0, 5), ("t", 1, -1001), ("nope", 0, -1001)]
    c.close()


@pytest.mark.parametrize("url, scheme", [("ftp://127.0.0.1:1/root", "ftp"), ("http://127.0.0.1:1/root", "http"),
                                         ("gs://bucket/root", "gs")])
def test_an_unsupported_storage_scheme_is_one_clear_error(url, scheme):
    with pytest.raises(KafkaException) as info:
        Consumer({"storage.url": url})
    err = kafka_error(info)
    assert (err.code(), err.retriable()) == (KafkaError._INVALID_ARG, False)
    assert err.str() == (f"Consumer: cannot open storage.url {url}: unsupported storage url {url!r}: scheme "
                         f"{scheme!r} is not supported; txlake stores objects under file:// (or a plain path), "
                         "memory:// or s3:// (s3a://), the backends with a verified atomic create-if-absent")
    assert f"{scheme}://{scheme}://" not in err.str()


def test_the_cli_prints_one_line_for_an_ftp_storage_url_and_no_traceback():
    """A real process: fsspec's FTPFileSystem.__del__ noise would show on stderr at exit."""
    url = "ftp://127.0.0.1:1/root"
    proc = subprocess.run([sys.executable, "-m", "txlake.cli", "topics", "list", "--storage", url],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (f"Error: InvalidStorageUrlError: unsupported storage url {url!r}: scheme 'ftp' is not "
                           "supported; txlake stores objects under file:// (or a plain path), memory:// or s3:// "
                           "(s3a://), the backends with a verified atomic create-if-absent\n")


def test_an_integer_config_below_its_minimum_names_the_bound(root):
    with pytest.raises(KafkaException) as info:
        Producer({"storage.url": root, "storage.lease.ms": 5})
    assert kafka_error(info).str() == 'Invalid value "5" for configuration property "storage.lease.ms": value must be >= 100'
    with pytest.raises(KafkaException) as info:
        Consumer({"storage.url": root, "session.timeout.ms": 0})
    assert kafka_error(info).str() == ('Invalid value "0" for configuration property "session.timeout.ms": '
                                       "value must be 1..3600000")


def test_consume_takes_confluent_kafkas_range_of_num_messages(conf):
    """confluent-kafka accepts 0..1000000 (0: nothing) and names the range in its ValueError."""
    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    try:
        assert c.consume(0, timeout=5) == []
        for bad in (-100, 1_000_001):
            with pytest.raises(ValueError) as info:
                c.consume(bad)
            assert str(info.value) == "num_messages must be between 0 and 1000000 (1M)"
    finally:
        c.close()
