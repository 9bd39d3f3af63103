"""The internal topics (``__transaction_state``, ``__consumer_offsets``) belong to the coordinators.

A client's write to them is refused with Kafka's answer and nothing reaches the log (exact
high watermarks before and after), and the coordinators go on working: ``init_transactions``,
``committed()``, transactions with offsets. Reading them stays open to everyone.

* Produce: INVALID_TOPIC_EXCEPTION "Cannot append to internal topic X" (Kafka's
  ``ReplicaManager.appendToLocalLog`` with ``internalTopicsAllowed`` false);
* a transactional produce: AddPartitionsToTxn answers TOPIC_AUTHORIZATION_FAILED for the
  internal partitions, OPERATION_NOT_ATTEMPTED for the others (Kafka's ``KafkaApis``);
* DeleteRecords: INVALID_TOPIC_EXCEPTION "Cannot delete records of internal topic X"
  (``ReplicaManager.deleteRecordsOnLocalLog``);
* CreateTopics: INVALID_REQUEST "Creation of internal topic X is prohibited." and DeleteTopics:
  INVALID_TOPIC_EXCEPTION -- stricter than Kafka's broker (see docs/operations.md).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from click.testing import CliRunner

from txlake import AdminClient, Consumer, KafkaException, NewTopic, Producer, TopicPartition
from txlake.cli import main
from txlake.engine.errors import Errors
from txlake.engine.group_offsets import partition_for as group_partition
from txlake.engine.registry import acquire_broker, close_all, release_broker
from txlake.engine.transaction_state_manager import partition_for as txn_partition

from helpers import open_catalog

INTERNAL = ("__consumer_offsets", "__transaction_state")
N = 2  # partitions of each internal topic
CONF = {"transaction.state.log.num.partitions": N, "offsets.topic.num.partitions": N, "storage.flush.linger.ms": 1}
GROUP, TID = "g", "copier"
#: where the coordinators keep GROUP's offsets and TID's state: the partitions garbage would break
TARGET = {"__consumer_offsets": group_partition(GROUP, N), "__transaction_state": txn_partition(TID, N)}
INVALID_TOPIC_EXCEPTION, TOPIC_AUTHORIZATION_FAILED, INVALID_REQUEST = 17, 29, 42


@pytest.fixture(params=["file", "memory"])
def backend(request):
    return request.param


@pytest.fixture
def fresh(storage):
    """Client config of an empty root (no internal topic yet) with topics ``in`` and ``out``."""
    conf = {**storage.conf(), **CONF}
    with AdminClient(conf) as admin:
        for name in ("in", "out"):
            admin.create_topics([NewTopic(name, 2)])[name].result()
    yield conf
    close_all()


@pytest.fixture
def conf(fresh):
    """:func:`fresh` after one committed transaction of TID (1 record to out-0, offsets in-0: 5,
    in-1: 7 for GROUP): both internal topics exist and hold the coordinators' records."""
    run_transaction(fresh, TID, value=b"first", offsets={0: 5, 1: 7})
    return fresh


def run_transaction(conf, tid, value, offsets, producer=None):
    """One committed transaction: ``value`` to out-0 and GROUP's offsets of ``in`` sent with it."""
    p = producer if producer is not None else Producer({**conf, "transactional.id": tid})  # (len(p) may be 0)
    if producer is None:
        p.init_transactions(10)
    p.begin_transaction()
    p.produce("out", value=value, partition=0)
    p.send_offsets_to_transaction([TopicPartition("in", q, o) for q, o in offsets.items()], GROUP, 10)
    p.commit_transaction(10)
    if producer is None:
        p.close()


def committed(conf, group=GROUP):
    with Consumer({**conf, "group.id": group}) as c:
        return {tp.partition: tp.offset for tp in c.committed([TopicPartition("in", 0), TopicPartition("in", 1)], 10)}


def watermarks(storage, topics=INTERNAL):
    """``{(topic, partition): (log start offset, high watermark)}`` of the internal topics, as an
    outside reader sees them (a fresh catalog view)."""
    state = open_catalog(storage).state
    return {(name, p.partition): (p.log_start_offset, p.high_watermark)
            for name in topics if name in state.topics for p in state.topics[name].partitions}


def out_values(conf):
    """The values a read_committed consumer reads from out-0."""
    with Consumer({**conf, "isolation.level": "read_committed"}) as c:
        c.assign([TopicPartition("out", 0, 0)])
        return [m.value() for m in c.consume(100, 2.0) if m.error() is None]


def assert_coordinators_work(conf):
    """GROUP's offsets are readable, TID re-initialises (fencing its last instance) and commits
    another transaction with offsets, which GROUP then sees."""
    assert committed(conf) == {0: 5, 1: 7}
    run_transaction(conf, TID, value=b"again", offsets={0: 6, 1: 9})
    assert committed(conf) == {0: 6, 1: 9}
    assert out_values(conf) == [b"first", b"again"]


def failure(future):
    with pytest.raises(KafkaException) as info:
        future.result()
    err = info.value.args[0]
    return err.code(), err.name(), err.str()


# ---------------------------------------------------------------------------- Produce
@pytest.mark.parametrize("topic", INTERNAL)
@pytest.mark.parametrize("idempotence", [False, True], ids=["plain", "idempotent"])
def test_a_producer_cannot_append_to_an_internal_topic(conf, storage, topic, idempotence):
    before = watermarks(storage)
    reports = []
    p = Producer({**conf, "enable.idempotence": idempotence})
    p.produce(topic, key=b"garbage", value=b"\x00\x01garbage", partition=TARGET[topic],
              on_delivery=lambda err, msg: reports.append((err, msg.topic(), msg.partition())))
    assert p.flush(10) == 0
    ((err, reported_topic, reported_partition),) = reports
    assert err is not None, f"the record was appended to {topic}"
    assert (err.code(), err.name(), err.str()) == (INVALID_TOPIC_EXCEPTION, "TOPIC_EXCEPTION",
                                                   f"Cannot append to internal topic {topic}")
    assert (reported_topic, reported_partition) == (topic, TARGET[topic])
    assert not err.retriable() and not err.fatal()
    # the same producer goes on writing user topics (out-1 is empty: offset 0)
    p.produce("out", value=b"user", partition=1, on_delivery=lambda err, msg: reports.append((err, msg.offset())))
    assert p.flush(10) == 0
    assert reports[1] == (None, 0)
    p.close()
    assert watermarks(storage) == before
    assert_coordinators_work(conf)


def test_a_transaction_cannot_add_an_internal_partition(conf, storage):
    """AddPartitionsToTxn refuses the internal partition with TOPIC_AUTHORIZATION_FAILED: the record
    fails with it, the transaction must abort; after the abort the producer goes on."""
    before = watermarks(storage, ["__consumer_offsets"])
    p = Producer({**conf, "transactional.id": TID})
    p.init_transactions(10)
    p.begin_transaction()
    reports = []
    p.produce("__consumer_offsets", key=b"garbage", value=b"garbage", partition=TARGET["__consumer_offsets"],
              on_delivery=lambda err, msg: reports.append(err))
    p.flush(10)
    (err,) = reports
    assert err is not None, "the record was appended to __consumer_offsets"
    assert (err.code(), err.name()) == (TOPIC_AUTHORIZATION_FAILED, "TOPIC_AUTHORIZATION_FAILED")
    assert err.txn_requires_abort() and not err.fatal()
    with pytest.raises(KafkaException) as info:
        p.commit_transaction(10)
    assert info.value.args[0].code() == TOPIC_AUTHORIZATION_FAILED and info.value.args[0].txn_requires_abort()
    p.abort_transaction(10)
    assert watermarks(storage, ["__consumer_offsets"]) == before   # (TID's own state records go on)
    run_transaction(conf, TID, value=b"again", offsets={0: 6, 1: 9}, producer=p)
    p.close()
    assert committed(conf) == {0: 6, 1: 9}
    assert out_values(conf) == [b"first", b"again"]


def test_add_partitions_to_txn_with_an_internal_partition_adds_none(conf):
    """Kafka's per-partition answer: the internal partition is refused, the others are not attempted,
    and none joins the transaction (a data partition added next is the transaction's only one)."""
    p = Producer({**conf, "transactional.id": TID})
    p.init_transactions(10)
    broker = acquire_broker(conf["storage.url"])
    try:
        coordinator = broker.transaction_coordinator()
        pid, epoch = p._txn.producer_id, p._txn.epoch
        answers = coordinator.handle_add_partitions_to_txn(TID, pid, epoch, [("out", 1), ("__transaction_state", 0)])
        assert answers == {("out", 1): Errors.OPERATION_NOT_ATTEMPTED,
                           ("__transaction_state", 0): Errors.TOPIC_AUTHORIZATION_FAILED}
        assert coordinator.handle_add_partitions_to_txn(TID, pid, epoch, [("out", 0)]) == {("out", 0): Errors.NO_ERROR}
        metadata = coordinator.state.get_transaction_state(TID).transaction_metadata
        assert (metadata.state.state_name, set(metadata.topic_partitions)) == ("Ongoing", {("out", 0)})
    finally:
        release_broker(broker)
        p.close()


# ---------------------------------------------------------------------------- CreateTopics
def test_a_client_cannot_create_an_internal_topic(fresh, storage):
    """Created early with another layout, __transaction_state would fail init_transactions for
    good (INVALID_PARTITIONS): the coordinators create their topics themselves."""
    with AdminClient(fresh) as admin:
        for validate_only in (True, False):
            futures = admin.create_topics([NewTopic(name, 5) for name in INTERNAL], validate_only=validate_only)
            for name in INTERNAL:
                assert failure(futures[name]) == (INVALID_REQUEST, "INVALID_REQUEST",
                                                  f"Creation of internal topic {name} is prohibited.")
        assert not set(INTERNAL) & set(admin.list_topics().topics)
    run_transaction(fresh, TID, value=b"first", offsets={0: 5, 1: 7})
    assert committed(fresh) == {0: 5, 1: 7}
    assert {name: len(t.partitions) for name, t in open_catalog(storage).state.topics.items() if name in INTERNAL} \
        == {"__consumer_offsets": N, "__transaction_state": N}
    with AdminClient(fresh) as admin:   # once they exist: the same answer (not TOPIC_ALREADY_EXISTS)
        futures = admin.create_topics([NewTopic("__consumer_offsets", N)])
        assert failure(futures["__consumer_offsets"])[0] == INVALID_REQUEST


# ---------------------------------------------------------------------------- DeleteTopics
def test_a_client_cannot_delete_an_internal_topic_even_with_a_transaction_open(conf, storage):
    p = Producer({**conf, "transactional.id": "open"})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("out", value=b"open", partition=0)
    p.send_offsets_to_transaction([TopicPartition("in", 0, 11)], GROUP, 10)
    assert p.flush(10) == 0
    before = watermarks(storage)
    with AdminClient(conf) as admin:
        futures = admin.delete_topics(list(INTERNAL))
        for name in INTERNAL:
            assert failure(futures[name]) == (
                INVALID_TOPIC_EXCEPTION, "TOPIC_EXCEPTION",  # librdkafka's name of 17
                f"Topic {name} is a kafka internal topic and is not allowed to be marked for deletion.")
    assert watermarks(storage) == before
    p.commit_transaction(10)   # the open transaction completes: its offset and record become visible
    p.close()
    assert committed(conf) == {0: 11, 1: 7}
    assert out_values(conf) == [b"first", b"open"]


# ---------------------------------------------------------------------------- DeleteRecords
@pytest.mark.parametrize("topic", INTERNAL)
def test_a_client_cannot_delete_records_of_an_internal_topic(conf, storage, topic):
    before = watermarks(storage)
    with AdminClient(conf) as admin:
        futures = admin.delete_records([TopicPartition(topic, TARGET[topic], -1)])
        # DeleteRecords answers carry no message on the wire, in-process neither: the client names
        # the partition, with Kafka's text of the code
        assert failure(futures[TopicPartition(topic, TARGET[topic], -1)]) == (
            INVALID_TOPIC_EXCEPTION, "TOPIC_EXCEPTION",
            f"{topic} [{TARGET[topic]}]: For a request which attempts to access an invalid topic (e.g. one which has "
            "an illegal name), or if an attempt is made to write to an internal topic (such as the consumer offsets "
            "topic).")
    assert watermarks(storage) == before
    assert_coordinators_work(conf)


# ---------------------------------------------------------------------------- the CLI and Spark's sink
@pytest.mark.parametrize("command, expected", [
    (["produce", "__consumer_offsets", "-f", "{data}", "-k", "k"],
     "INVALID_TOPIC_EXCEPTION: Cannot append to internal topic __consumer_offsets"),
    (["topics", "create", "__transaction_state"],
     "INVALID_REQUEST: Creation of internal topic __transaction_state is prohibited."),
    (["topics", "delete", "__consumer_offsets"],
     "INVALID_TOPIC_EXCEPTION: Topic __consumer_offsets is a kafka internal topic and is not allowed to be "
     "marked for deletion."),
], ids=["produce", "topics-create", "topics-delete"])
def test_the_cli_reports_the_refusal(conf, storage, tmp_path, command, expected):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"k": "x", "v": "garbage"}\n')   # a keyed record: a compacted topic takes it
    before = watermarks(storage)
    args = [a.format(data=data) for a in command] + ["--storage", conf["storage.url"]]
    result = CliRunner().invoke(main, args, catch_exceptions=False, env={"COLUMNS": "200"})
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stderr.strip() == f"Error: {expected}"
    assert watermarks(storage) == before
    assert_coordinators_work(conf)


@pytest.mark.parametrize("backend", ["file"])
def test_the_spark_sink_cannot_write_an_internal_topic(conf, storage):
    """The sink's commit is a transactional produce: TOPIC_AUTHORIZATION_FAILED, aborted, nothing written
    (the sink's own transactional id gets its state records in __transaction_state, as always)."""
    from pyspark.sql.types import StringType, StructField, StructType

    from txlake.spark_connector.batch_write import TxlakeBatchWriter

    before = watermarks(storage, ["__consumer_offsets"])
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    options = {"storage.url": storage.url, "topic": "__consumer_offsets", **{f"kafka.{k}": str(v) for k, v in CONF.items()}}
    writer = TxlakeBatchWriter(options, schema, False)
    message = writer.write(iter([pa.record_batch([pa.array(["k"]), pa.array(["garbage"])], names=["key", "value"])]))
    with pytest.raises(KafkaException) as info:
        writer.commit([message])
    assert info.value.args[0].code() == TOPIC_AUTHORIZATION_FAILED
    assert watermarks(storage, ["__consumer_offsets"]) == before
    assert_coordinators_work(conf)


# ---------------------------------------------------------------------------- reading stays open
def test_clients_and_duckdb_read_the_internal_topics(fresh, storage):
    from txlake.duckdb import connect

    with Consumer({**fresh, "group.id": "plain"}) as c:
        for offset in (3, 4):
            c.commit(offsets=[TopicPartition("in", 0, offset), TopicPartition("in", 1, offset)], asynchronous=False)
    partition = group_partition("plain", N)
    assert watermarks(storage)[("__consumer_offsets", partition)] == (0, 4)
    with Consumer({**fresh, "isolation.level": "read_uncommitted"}) as c:
        c.assign([TopicPartition("__consumer_offsets", partition, 0)])
        assert [m.offset() for m in c.consume(100, 2.0) if m.error() is None] == [0, 1, 2, 3]
    con = connect(storage.url)
    assert con.execute('SELECT partition, count(*) FROM "__consumer_offsets" GROUP BY 1').fetchall() == [(partition, 4)]
