"""confluent-kafka-python's broker-less test scenarios, in our words, on the in-process clients
(issue 17: a drop-in).

Its tests/test_Producer.py, test_Consumer.py, test_Admin.py, test_kafka_error.py,
test_message.py, test_topic_partition.py, test_misc.py, test_threads.py and test_partitioners.py
were read scenario by scenario; the ones that apply to a client on ``storage.url`` and that the
other test files (test_client_parity, test_confluent_names, test_admin_apis, test_admin_groups,
test_serialization, test_commit_async) do not cover already are here. Where confluent-kafka can
answer without a broker (value types, argument checks) the same call runs on both and the
outcomes are compared; the rest asserts librdkafka's behaviour exactly. docs/confluent-kafka.md
lists the scenarios that cannot apply and why.
"""

from __future__ import annotations

import pickle
import threading
import warnings

import pytest
from test_client_parity import conf, create  # noqa: F401 - fixture

import txlake
from txlake import (AdminClient, Consumer, KafkaError, KafkaException, Message, NewTopic, Producer,
                    TopicPartition)
from txlake.admin import (AlterConfigOpType, ConfigEntry, ConfigResource, GroupMember, GroupMetadata, NewPartitions,
                          ResourceType, TopicCollection)

confluent_kafka = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin as cadmin  # noqa: E402


def outcome(call):
    """What ``call()`` did, comparable across the two libraries: ``("ok", value)`` or
    ``(exception class name, its text)``."""
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the outcome is the point
        return type(exc).__name__, str(exc)


def read_all(conf, topic, partitions=1, expected=None):
    """Every record of ``topic`` as ``(partition, offset, key, value, headers)``, read by assign."""
    with Consumer({**conf, "group.id": "reader", "enable.partition.eof": True}) as c:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out, eof = [], set()
        while len(eof) < partitions:
            m = c.poll(10)
            assert m is not None, f"no record or EOF of {topic} within 10 s"
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF
                eof.add(m.partition())
                continue
            out.append((m.partition(), m.offset(), m.key(), m.value(), m.headers()))
    return out


# ---------------------------------------------------------------- test_message.py
EMPTY_REDUCED = (None, -1, -1001, None, None, None, None, (0, 0), -1.0, -1, -1)


@pytest.mark.parametrize("make", [
    lambda M: M(),
    lambda M: M(None, -2, -2, None, None, None, None, None, -2.0, -2),
    lambda M: M(None, -1, -1001, None, None, None, None, (0, 0), -1.0, -1, 0),
])
def test_an_empty_message_reads_none_and_pickles_as_confluent_kafkas(make):
    msg = make(Message)
    assert (len(msg), msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers(),
            msg.error(), msg.latency(), msg.leader_epoch(), msg.delivery_count(), msg.timestamp()) == (
        0, None, None, None, None, None, None, None, None, None, None, (0, 0))
    assert msg.__reduce__() == (Message, EMPTY_REDUCED)
    assert make(confluent_kafka.Message).__reduce__()[1] == EMPTY_REDUCED
    restored = pickle.loads(pickle.dumps(msg))
    assert restored is not msg and restored == msg and restored.__reduce__() == (Message, EMPTY_REDUCED)


def test_a_message_pickles_every_field_and_compares_by_value():
    args = ("t", 1, 2, b"k", b"v", [("h", b"1")], None, (1, 4), 5.67, 3, 5)
    msg = Message(*args)
    assert msg.__reduce__() == (Message, args) == (Message, confluent_kafka.Message(*args).__reduce__()[1])
    restored = pickle.loads(pickle.dumps(msg))
    assert (restored.topic(), restored.partition(), restored.offset(), restored.key(), restored.value(),
            restored.headers(), restored.timestamp(), restored.latency(), restored.leader_epoch(),
            restored.delivery_count()) == ("t", 1, 2, b"k", b"v", [("h", b"1")], (1, 4), 5.67, 3, 5)
    assert restored == msg and Message(*args) == msg
    assert Message("t", 1, 2, b"z", b"v") != Message("t", 1, 2, b"k", b"v")
    assert msg != 1 and msg != object() and msg is not None
    for other in (msg, None, object()):
        with pytest.raises(TypeError):
            msg < other  # noqa: B015 - not ordered, as confluent-kafka's
    with pytest.raises(TypeError):
        hash(msg)
    # a subclass pickles as the base class, keeping its fields
    class Sub(Message):
        pass
    assert pickle.loads(pickle.dumps(Sub("t", 0, 7))).offset() == 7


@pytest.mark.parametrize("given, read", [(1, 1), (32767, 32767), (0, None), (-1, None), (-50, None)])
def test_delivery_count_reads_none_unless_positive(given, read):
    msg = Message("t", 0, 0, None, None, None, None, (0, 0), -1.0, -1, given)
    assert msg.delivery_count() == read == confluent_kafka.Message(
        "t", 0, 0, None, None, None, None, (0, 0), -1.0, -1, given).delivery_count()
    assert pickle.loads(pickle.dumps(msg)).delivery_count() == read


@pytest.mark.parametrize("count", [32768, -32769])
def test_delivery_count_beyond_int16_is_an_overflow_error(count):
    ours = outcome(lambda: Message("t", 0, 0, None, None, None, None, (0, 0), -1.0, -1, count))
    theirs = outcome(lambda: confluent_kafka.Message("t", 0, 0, None, None, None, None, (0, 0), -1.0, -1, count))
    assert ours == theirs and ours[0] == "OverflowError"


def test_a_message_takes_any_objects_as_unit_tests_build_them():
    dummy = object()
    msg = Message(dummy, 0, 0, dummy, dummy, dummy, dummy, None, -1.0, -1)
    assert (msg.topic(), msg.key(), msg.value(), msg.headers(), msg.error()) == (dummy,) * 5
    assert (msg.partition(), msg.offset(), msg.latency(), msg.leader_epoch()) == (0, 0, None, None)
    msg = Message(topic="t", partition=1, offset=2, key="k", value="v", headers=[], error=dummy, timestamp=(0, 4),
                  latency=5.67, leader_epoch=3)
    assert (len(msg), msg.value(), msg.timestamp(), msg.latency(), msg.leader_epoch()) == (1, "v", (0, 4), 5.67, 3)


# ---------------------------------------------------------------- test_kafka_error.py
def test_an_unknown_error_code_is_named_and_described_as_librdkafka_does():
    ours, theirs = KafkaError(12345), confluent_kafka.KafkaError(12345)
    assert (ours.name(), ours.str(), str(ours)) == (theirs.name(), theirs.str(), str(theirs)) == (
        "ERR_12345?", "Err-12345?", 'KafkaError{code=ERR_12345?,val=12345,str="Err-12345?"}')
    assert (ours.fatal(), ours.retriable(), ours.txn_requires_abort()) == (False, False, False)
    assert str(KafkaException(KafkaError(12345))) == str(confluent_kafka.KafkaException(theirs))


def test_error_flags_and_a_custom_message():
    err = KafkaError(KafkaError._ALL_BROKERS_DOWN, "Mayday!")
    assert err == KafkaError._ALL_BROKERS_DOWN and err.str() == "Mayday!"
    assert (err.fatal(), err.retriable(), err.txn_requires_abort()) == (False, False, False)
    fatal = KafkaException(KafkaError(KafkaError.MEMBER_ID_REQUIRED, fatal=True)).args[0]
    assert (fatal.fatal(), fatal.retriable(), fatal.txn_requires_abort()) == (True, False, False)
    retriable = KafkaError(KafkaError.MEMBER_ID_REQUIRED, retriable=True)
    assert (retriable.fatal(), retriable.retriable()) == (False, True)


def test_kafka_exception_subclasses_with_and_without_arguments():
    class Bare(KafkaException):
        def a_method(self):
            return "yes"

    class WithCode(KafkaException):
        def __init__(self, code):
            super().__init__(KafkaError(code))

    bare = Bare()
    assert (bare.a_method(), bare.args, str(bare)) == ("yes", (), "")
    assert (bare.args, str(bare)) == (confluent_kafka.KafkaException().args, str(confluent_kafka.KafkaException()))
    with pytest.raises(KafkaException, match="Err-12345?") as info:
        raise WithCode(12345)
    assert info.value.args[0].code() == 12345 and not info.value.args[0].fatal()


# ---------------------------------------------------------------- test_topic_partition.py
def test_topic_partitions_sort_compare_and_hash_by_topic_and_partition():
    tps = [TopicPartition("t2", 1), TopicPartition("t1", 2), TopicPartition("t2", 0), TopicPartition("t1", 1, 99)]
    assert [(tp.topic, tp.partition) for tp in sorted(tps)] == [("t1", 1), ("t1", 2), ("t2", 0), ("t2", 1)]
    assert TopicPartition("t", 1, 5) == TopicPartition("t", 1, 7) and TopicPartition("t", 1) != TopicPartition("t", 2)
    assert hash(TopicPartition("t", 1, 5)) == hash(TopicPartition("t", 1, 7))
    assert len({TopicPartition("t", 1, 5), TopicPartition("t", 1, 7), TopicPartition("t", 2)}) == 2

    class Sub(TopicPartition):
        pass
    assert Sub("t", 3).partition == 3 and isinstance(Sub("t"), TopicPartition)


# ---------------------------------------------------------------- test_partitioners.py
@pytest.mark.parametrize("args", [(b"key", 0), (b"key", -1), ("string_key", 10), (b"key", "10"), (None, 10),
                                  (bytearray(b"k"), 3), (b"key", 2**40)])
@pytest.mark.parametrize("name", ["murmur2", "consistent", "fnv1a"])
def test_partitioner_functions_check_their_arguments_as_confluent_kafkas(name, args):
    ours = outcome(lambda: getattr(txlake, name)(*args))
    assert ours[0] != "ok" and ours == outcome(lambda: getattr(confluent_kafka, name)(*args))


def test_partitioner_functions_place_keys_as_confluent_kafkas():
    for key in (b"", b"a", b"test_key", bytes(range(40))):
        for name in ("murmur2", "consistent", "fnv1a"):
            assert getattr(txlake, name)(key, 10) == getattr(confluent_kafka, name)(key, 10), (name, key)


# ---------------------------------------------------------------- test_misc.py
def test_version_is_a_string_and_libversion_a_pair():
    assert "Using txlake %s" % txlake.version() == f"Using txlake {txlake.__version__}"
    assert "librdkafka %s (0x%x)" % txlake.libversion()


def test_a_none_value_resets_a_string_property_to_its_default(conf):
    # librdkafka's NULL: confluent-kafka programs pass None to drop an inherited setting
    with Producer({**conf, "bootstrap.servers": None, "client.id": None}) as p:
        assert p.cluster_id()
    assert outcome(lambda: Producer({**conf, "linger.ms": None}))[0] == "KafkaException"


def test_default_topic_config_applies_and_wins_over_the_top_level(conf):
    """librdkafka's deprecated default.topic.config: its message.timeout.ms (1 s) wins over the
    top-level one (600 s); the record to a missing topic times out with _MSG_TIMED_OUT (its
    topic.metadata.propagation.max.ms, 30 s, is still running, so the topic stays unknown and
    produce() is not refused)."""
    create(conf, "t")
    reports = []
    for topic_conf in ({"message.timeout.ms": 600000, "default.topic.config": {"message.timeout.ms": 1000}},
                       {"default.topic.config": {"message.timeout.ms": 1000}}):
        with Producer({**conf, **topic_conf}) as p:
            p.produce("mytopic", value=b"x", on_delivery=lambda err, msg: reports.append((err.code(), msg.topic())))
            assert p.flush(20) == 0
            p.produce("mytopic", value=b"y")   # not known missing: queued, not raised
            p.purge()
            p.flush(5)
    assert reports == [(KafkaError._MSG_TIMED_OUT, "mytopic")] * 2
    with pytest.raises(KafkaException) as info:
        Producer({**conf, "default.topic.config": 5})
    assert info.value.args[0].code() == KafkaError._INVALID_ARG


def test_set_sasl_credentials_and_cluster_id_on_every_client(conf):
    create(conf, "t")
    with Producer(conf) as p, Consumer({**conf, "group.id": "g"}) as c, AdminClient(conf) as a:
        ids = {p.cluster_id(), c.cluster_id(), a.cluster_id(), a.describe_cluster().result(10).cluster_id,
               p.list_topics().cluster_id, c.list_topics().cluster_id}
        assert len(ids) == 1 and len(ids.pop()) == 22
        for client in (p, c, a):
            assert client.set_sasl_credentials("user", "secret") is None
            with pytest.raises(TypeError):
                client.set_sasl_credentials("user", None)
    for closed in (p, c):
        for call in (closed.cluster_id, lambda: closed.set_sasl_credentials("u", "p"), closed.list_topics):
            assert outcome(call) == ("RuntimeError", "Handle has been closed")


# ---------------------------------------------------------------- test_threads.py
def test_threads_share_one_producer_and_every_raising_callback_surfaces_once(conf):
    """Four threads produce through one producer, each second record with a raising callback,
    and flush: every thread finishes, each raising callback surfaces in exactly one flush (in
    whichever thread served it) and all eight records are written."""
    create(conf, "t")
    raised, done = [], []

    class Intended(Exception):
        pass

    def crash(err, msg):
        raise Intended(msg.value())

    def run(p, me):
        for i in (1, 2):
            p.produce("t", value=f"{me}-{i}".encode(), on_delivery=crash if i == 2 else None)
            try:
                p.flush(30)
            except Intended as exc:
                raised.append(exc.args[0])
        done.append(me)

    with Producer(conf) as p:
        threads = [threading.Thread(target=run, args=(p, n)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        p.flush(30)
        assert len(p) == 0
    assert sorted(done) == [0, 1, 2, 3]
    assert sorted(raised) == [b"0-2", b"1-2", b"2-2", b"3-2"]
    assert sorted(r[3] for r in read_all(conf, "t")) == sorted(f"{n}-{i}".encode() for n in range(4) for i in (1, 2))


# ---------------------------------------------------------------- test_Producer.py
@pytest.mark.parametrize("client", ["Producer", "Consumer"])
def test_a_client_without_a_config_dict_is_a_type_error(client):
    for args in ((), (None,), ([1],)):
        ours = outcome(lambda: getattr(txlake, client)(*args))
        assert ours == outcome(lambda: getattr(confluent_kafka, client)(*args)) == (
            "TypeError", "expected configuration dict")


def test_headers_of_every_accepted_shape_are_written_and_malformed_ones_refused(conf):
    create(conf, "t")
    shapes = [[("a", b"1"), ("a", b"2"), ("none", None)], {"k": "Jämtland"}, [("bin", b"\xc2\xc2")], [], None]
    with Producer(conf) as p:
        for headers in shapes:
            p.produce("t", value=b"v", key=b"k", headers=headers)
        assert p.flush(10) == 0
        cp = confluent_kafka.Producer({})
        for bad in (("a", "b"), ["malformed_header"], {"anint": 1234}, [("k",)]):
            ours = outcome(lambda: p.produce("t", value=b"v", headers=bad))
            assert ours == outcome(lambda: cp.produce("t", value=b"v", headers=bad)) and ours[0] == "TypeError"
    got = [r[4] for r in read_all(conf, "t")]
    assert got == [[("a", b"1"), ("a", b"2"), ("none", None)], [("k", "Jämtland".encode())], [("bin", b"\xc2\xc2")],
                   None, None]


def test_a_partition_that_is_not_an_int_is_refused_and_the_producer_goes_on(conf):
    """produce(partition="1") raised nothing and killed the send thread (flush then hung
    until its timeout); confluent-kafka raises TypeError at once."""
    create(conf, "t", 2)
    with Producer(conf) as p:
        for bad in ("1", None, 1.5):
            ours = outcome(lambda: p.produce("t", value=b"x", partition=bad))
            assert ours == outcome(lambda: confluent_kafka.Producer({}).produce("t", value=b"x", partition=bad))
            assert ours[0] == "TypeError"
        reports = []
        p.produce("t", value=b"ok", partition=1, on_delivery=lambda err, msg: reports.append((err, msg.partition(),
                                                                                               msg.offset())))
        assert p.flush(10) == 0 and reports == [(None, 1, 0)]


def test_produce_batch_and_flush_argument_types(conf):
    with Producer(conf) as p:
        cp = confluent_kafka.Producer({})
        for call in (lambda q: q.produce_batch(123, [{"value": b"x"}]), lambda q: q.produce_batch("t", "x"),
                     lambda q: q.flush("x"), lambda q: q.produce_batch()):
            ours = outcome(lambda: call(p))
            assert ours[0] == "TypeError" and ours[0] == outcome(lambda: call(cp))[0]
        assert outcome(lambda: p.produce_batch(123, [])) == outcome(lambda: cp.produce_batch(123, [])) == (
            "TypeError", "argument 1 must be str, not int")


def test_a_subclassed_producer_works_and_a_bad_config_still_fails(conf):
    create(conf, "atopic")

    class SubProducer(Producer):
        def __init__(self, config, topic):
            super().__init__(config)
            self.topic = topic

        def produce_hi(self):
            super().produce(self.topic, value="hi")

    with SubProducer(conf, "atopic") as sp:
        sp.produce_hi()
        assert sp.flush(10) == 0
    assert [r[3] for r in read_all(conf, "atopic")] == [b"hi"]
    with pytest.raises(KafkaException) as info:
        SubProducer({**conf, "should.fail": False}, "atopic")
    assert info.value.args[0].code() == KafkaError._INVALID_ARG


def test_a_record_to_a_missing_topic_times_out_with_the_message_timeout(conf):
    """message.timeout.ms (10 ms) shorter than topic.metadata.propagation.max.ms: librdkafka
    fails the record with _MSG_TIMED_OUT, whatever its payload (issue #129's error string)."""
    reports = []
    with Producer({**conf, "message.timeout.ms": 10}) as p:
        for value in ("This is the message payload", "\xc2\xc2"):
            p.produce("mytopic", value, on_delivery=lambda err, msg: reports.append((err.code(), err.str())))
        assert p.flush(10) == 0
    assert [code for code, _ in reports] == [KafkaError._MSG_TIMED_OUT] * 2
    assert all(text.startswith("Local: Message timed out") for _, text in reports)


def test_the_producer_context_manager(conf):
    create(conf, "t")
    with Producer(conf) as outer:
        with Producer(conf) as inner:
            assert inner is not outer
            inner.produce("t", value=b"inner")
        outer.produce("t", value=b"outer")   # the inner one's exit closed only it
        with pytest.raises(RuntimeError, match="Producer has been closed"):
            inner.produce("t", value=b"late")
    with pytest.raises(ValueError, match="inside"):
        with Producer(conf) as p:
            p.produce("t", value=b"before the error")
            raise ValueError("inside")
    with pytest.raises(RuntimeError, match="Producer has been closed"):
        p.produce("t", value=b"after")
    assert sorted(r[3] for r in read_all(conf, "t")) == [b"before the error", b"inner", b"outer"]


def test_a_subclass_that_skips_init_is_a_closed_client():
    class UninitializedProducer(Producer):
        def __init__(self, config):
            pass

    class UninitializedConsumer(Consumer):
        def __init__(self, config):
            pass

    class UninitializedAdmin(AdminClient):
        def __init__(self, config):
            pass

    p, c, a = UninitializedProducer({}), UninitializedConsumer({}), UninitializedAdmin({})
    for call in (lambda: p.produce("t", value=b"x"), p.poll, p.flush, p.purge, lambda: p.produce_batch("t", []),
                 p.init_transactions, p.begin_transaction, p.commit_transaction, p.abort_transaction):
        assert outcome(call) == ("RuntimeError", "Producer has been closed")
    assert p.close() is True
    for call in (c.poll, lambda: c.subscribe(["t"]), c.assignment, lambda: c.consume(1), c.close):
        assert outcome(call) in (("RuntimeError", "Consumer closed"), ("ok", None))
    assert outcome(c.poll) == ("RuntimeError", "Consumer closed")
    for call in (lambda: a.create_topics([NewTopic("t", 1)]), lambda: a.delete_topics(["t"]), a.describe_cluster,
                 lambda: a.create_partitions([NewPartitions("t", 2)]), a.list_consumer_groups, a.poll):
        assert outcome(call) == ("RuntimeError", "AdminClient has been closed")
    assert outcome(a.list_topics) == ("RuntimeError", "Handle has been closed")


# ---------------------------------------------------------------- test_Consumer.py
def test_subscribe_needs_a_list_of_topic_names(conf):
    with Consumer({**conf, "group.id": "g"}) as c:
        cc = confluent_kafka.Consumer({"group.id": "g"})
        for bad in ("t", ("t",), {"t"}):
            ours = outcome(lambda: c.subscribe(bad))
            assert ours == outcome(lambda: cc.subscribe(bad)) == ("TypeError", "expected list of topic unicode strings")
        cc.close()
        # stricter than confluent-kafka, which takes [1] (docs/confluent-kafka.md)
        assert outcome(lambda: c.subscribe([1])) == ("TypeError", "expected list of topic unicode strings")


def test_commit_of_a_message_without_an_offset_commits_nothing(conf):
    """commit(message=Message(topic, partition)) -- confluent-kafka's test_commit_params -- crashed
    with a TypeError (None + 1); librdkafka commits nothing: _NO_OFFSET."""
    create(conf, "test")
    with Consumer({**conf, "group.id": "x", "enable.auto.commit": False}) as c:
        c.assign([TopicPartition("test", 0)])
        msg = Message(topic="test", partition=0)
        with pytest.raises(KafkaException) as info:
            c.commit(message=msg, asynchronous=False)
        assert info.value.args[0].code() == KafkaError._NO_OFFSET
        assert c.commit(message=msg) is None        # asynchronous: the error goes to on_commit
        with pytest.raises(ValueError, match="mutually exclusive"):
            c.commit(message=msg, offsets=[])


def test_a_join_group_error_is_an_error_event_and_the_consumer_goes_on(conf):
    """session.timeout.ms 1000 is below group.min.session.timeout.ms (6000): each JoinGroup is
    refused with INVALID_SESSION_TIMEOUT. librdkafka (rd_kafka_cgrp_handle_JoinGroup) hands that
    to poll() as an error event -- confluent-kafka against txlake serve returns exactly this
    message -- and joins again after its join interval; poll() raised it before."""
    create(conf, "t")
    with Consumer({**conf, "group.id": "g", "session.timeout.ms": 1000}) as c:
        c.subscribe(["t"])
        events = []
        while len(events) < 2:
            msg = c.poll(10)
            assert msg is not None, "no JoinGroup error event within 10 s"
            events.append((msg.error().code(), msg.error().str(), msg.error().fatal()))
        assert events == [(KafkaError.INVALID_SESSION_TIMEOUT, "JoinGroup failed: Broker: Invalid session timeout",
                           False)] * 2
        assert c.assignment() == []


def test_the_consumer_context_manager(conf):
    create(conf, "t")
    with Producer(conf) as p:
        p.produce("t", value=b"x")
    with Consumer({**conf, "group.id": "g"}) as c:
        c.assign([TopicPartition("t", 0, 0)])
        assert c.poll(10).value() == b"x"
    assert outcome(c.poll) == ("RuntimeError", "Consumer closed")
    with pytest.raises(KeyError):
        with Consumer({**conf, "group.id": "g"}) as c2:
            raise KeyError("inside")
    assert outcome(c2.assignment) == ("RuntimeError", "Consumer closed")


# ---------------------------------------------------------------- test_Admin.py
def _both_admins(conf):
    return AdminClient(conf), cadmin.AdminClient({"socket.timeout.ms": 10})


def test_admin_calls_refuse_empty_and_mistyped_requests_as_confluent_kafka(conf):
    ours, theirs = _both_admins(conf)
    acl = lambda m: m.AclBinding(m.ResourceType.TOPIC, "t", m.ResourcePatternType.LITERAL, "User:u", "*",  # noqa: E731
                                 m.AclOperation.READ, m.AclPermissionType.ALLOW)
    acl_filter = lambda m: m.AclBindingFilter(m.ResourceType.ANY, None, m.ResourcePatternType.ANY, None,  # noqa: E731
                                              None, m.AclOperation.ANY, m.AclPermissionType.ANY)
    calls = {
        "create_topics []": lambda a, m: a.create_topics([]),
        "delete_topics []": lambda a, m: a.delete_topics([]),
        "delete_topics [None]": lambda a, m: a.delete_topics([None, "t"]),
        "create_partitions []": lambda a, m: a.create_partitions([]),
        "describe_configs []": lambda a, m: a.describe_configs([]),
        "incremental_alter_configs []": lambda a, m: a.incremental_alter_configs([]),
        "create_acls []": lambda a, m: a.create_acls([]),
        "create_acls None": lambda a, m: a.create_acls(None),
        "delete_acls []": lambda a, m: a.delete_acls([]),
        "delete_acls None": lambda a, m: a.delete_acls(None),
        "describe_acls binding": lambda a, m: a.describe_acls(acl(m)),
        "delete_records None": lambda a, m: a.delete_records(None),
        "delete_records 1": lambda a, m: a.delete_records(1),
        "delete_records [str]": lambda a, m: a.delete_records(["test-1"]),
        "delete_records p-1": lambda a, m: a.delete_records([m.TopicPartition("t")]),
        "describe_topics ops": lambda a, m: a.describe_topics(m.TopicCollection([]),
                                                              include_authorized_operations="x"),
        "describe_topics timeout str": lambda a, m: a.describe_topics(m.TopicCollection([]), request_timeout="x"),
        "describe_consumer_groups str": lambda a, m: a.describe_consumer_groups("g"),
        "describe_cluster -1": lambda a, m: a.describe_cluster(request_timeout=-1),
        "list_consumer_groups -5": lambda a, m: a.list_consumer_groups(request_timeout=-5),
        "describe_acls -1": lambda a, m: a.describe_acls(acl_filter(m), request_timeout=-1),
        "list_offsets -1": lambda a, m: a.list_offsets({m.TopicPartition("t", 0): m.OffsetSpec.earliest()},
                                                       request_timeout=-1),
        "list_offsets str": lambda a, m: a.list_offsets({m.TopicPartition("t", 0): m.OffsetSpec.earliest()},
                                                        request_timeout="x"),
    }
    with ours:
        for name, call in calls.items():
            mine = outcome(lambda: call(ours, txlake.admin))
            assert mine[0] != "ok", name
            assert mine == outcome(lambda: call(theirs, _confluent_names())), name


def _confluent_names():
    """confluent_kafka.admin with confluent_kafka's TopicPartition/TopicCollection, as txlake.admin
    has them (a program imports them from either)."""
    import types
    names = types.SimpleNamespace(**vars(cadmin))
    names.TopicPartition, names.TopicCollection = confluent_kafka.TopicPartition, confluent_kafka.TopicCollection
    return names


def test_incremental_alter_configs_checks_each_entry_as_confluent_kafka(conf):
    create(conf, "t")
    ours, theirs = _both_admins(conf)

    def resource(m, entries, via_constructor):
        if via_constructor:
            return [m.ConfigResource(m.ResourceType.TOPIC, "t", incremental_configs=entries)]
        r = m.ConfigResource(m.ResourceType.TOPIC, "t")
        for e in entries:
            r.add_incremental_config(e)
        return [r]

    cases = {
        "None name": lambda m: [m.ConfigEntry(None, "1", incremental_operation=m.AlterConfigOpType.SET)],
        "int name": lambda m: [m.ConfigEntry(5, "1", incremental_operation=m.AlterConfigOpType.SET)],
        "no entries": lambda m: [],
        "a str": lambda m: "something",
    }
    with ours:
        for via_constructor in (True, False):
            for name, entries in cases.items():
                mine = outcome(lambda: ours.incremental_alter_configs(resource(txlake.admin, entries(txlake.admin),
                                                                              via_constructor)))
                assert mine[0] in ("TypeError", "ValueError"), name
                assert mine == outcome(lambda: theirs.incremental_alter_configs(
                    resource(cadmin, entries(cadmin), via_constructor))), name
            twice = [ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET),
                     ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE)]
            (future,) = ours.incremental_alter_configs(resource(txlake.admin, twice, via_constructor)).values()
            with pytest.raises(KafkaException) as info:
                future.result(10)
            assert (info.value.args[0].code(), info.value.args[0].str()) == (KafkaError._INVALID_ARG,
                                                                            "Duplicate ConfigEntry found")
        # nothing changed
        (entries,) = ours.describe_configs([ConfigResource(ResourceType.TOPIC, "t")]).values()
        assert entries.result(10)["retention.ms"].is_default


def test_list_groups_gives_group_metadata_with_members(conf):
    create(conf, "t", 2)
    with Consumer({**conf, "group.id": "g", "client.id": "c1", "partition.assignment.strategy": "range"}) as c, \
            AdminClient(conf) as admin:
        c.subscribe(["t"])
        for _ in range(40):
            if len(c.assignment()) == 2:
                break
            c.poll(0.5)
        assert sorted(tp.partition for tp in c.assignment()) == [0, 1]
        with pytest.warns(DeprecationWarning, match="list_groups"):
            groups = admin.list_groups(timeout=10)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            assert admin.list_groups("nope") == []
            assert [g.id for g in admin.list_groups("g")] == ["g"]
        (g,) = groups
        assert isinstance(g, GroupMetadata) and (repr(g), str(g)) == ("GroupMetadata(g)", "g")
        assert (g.id, g.error, g.state, g.protocol_type, g.protocol) == ("g", None, "Stable", "consumer", "range")
        assert (g.broker.id, g.broker.host, g.broker.port) == (1, "localhost", 0)
        (m,) = g.members
        assert isinstance(m, GroupMember) and (m.id, m.client_id) == (c.memberid(), "c1")
        # the member's protocol metadata and assignment as the coordinator holds them
        assert isinstance(m.metadata, bytes) and isinstance(m.assignment, bytes) and m.assignment


def test_the_admin_client_context_manager_closes_it(conf):
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("t", 1)])["t"].result(10)
        assert len(admin) == 0
    assert outcome(lambda: admin.create_topics([NewTopic("u", 1)])) == ("RuntimeError", "AdminClient has been closed")
    assert outcome(lambda: admin.poll(0.001)) == ("RuntimeError", "AdminClient has been closed")
    assert outcome(admin.list_topics) == ("RuntimeError", "Handle has been closed")
    assert outcome(lambda: admin.describe_topics(TopicCollection(["t"]))) == ("RuntimeError",
                                                                            "AdminClient has been closed")
    assert len(admin) == 0
    with pytest.raises(ZeroDivisionError):
        with AdminClient(conf) as other:
            1 / 0
    assert outcome(other.describe_cluster) == ("RuntimeError", "AdminClient has been closed")
    assert outcome(lambda: AdminClient(None)) == outcome(lambda: cadmin.AdminClient(None)) == (
        "TypeError", "expected configuration dict")


# ---------------------------------------------------------------- close() with a transaction open
def test_close_leaves_an_open_transaction_to_the_next_producer_of_its_id(conf):
    """librdkafka's rd_kafka_destroy (confluent-kafka's close()) flushes and sends no EndTxn: the
    transaction stays open, holding the last stable offset, until the coordinator times it out
    or the next producer with the same transactional.id (init_transactions) aborts it."""
    from txlake.admin import IsolationLevel, OffsetSpec

    create(conf, "t")
    tx = {**conf, "transactional.id": "tx-1", "transaction.timeout.ms": 60000}
    with Producer(conf) as plain:
        plain.produce("t", value=b"before")
    p = Producer(tx)
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("t", value=b"open")
    assert p.close() is True                    # flushed: "open" is written, its transaction open

    def latest(level):
        with AdminClient(conf) as admin:
            (future,) = admin.list_offsets({TopicPartition("t", 0): OffsetSpec.latest()},
                                           isolation_level=level).values()
            return future.result(10).offset
    assert (latest(IsolationLevel.READ_UNCOMMITTED), latest(IsolationLevel.READ_COMMITTED)) == (2, 1)
    with Producer(tx) as successor:
        successor.init_transactions(10)         # fences the old epoch and aborts its transaction
        successor.begin_transaction()
        successor.produce("t", value=b"after")
        successor.commit_transaction(10)
    # offsets: 0 before, 1 open (aborted), 2 ABORT marker, 3 after, 4 COMMIT marker
    assert latest(IsolationLevel.READ_COMMITTED) == 5
    assert [(r[1], r[3]) for r in read_all(conf, "t")] == [(0, b"before"), (3, b"after")]


def test_a_transaction_with_a_record_that_failed_delivery_cannot_commit(conf):
    """A record of the transaction to a topic that never appears fails its delivery report;
    librdkafka then refuses commit_transaction (the transaction requires an abort). It committed,
    which lost the record while committing the rest -- and, in a copier, the input offsets."""
    create(conf, "t")
    with Producer({**conf, "transactional.id": "tx-lost", "message.timeout.ms": 300}) as p:
        p.init_transactions(10)
        p.begin_transaction()
        p.produce("t", value=b"kept?")
        p.produce("nope", value=b"lost", on_delivery=lambda err, msg: reports.append(err.code()))
        reports = []
        with pytest.raises(KafkaException) as info:
            p.commit_transaction(20)
        p.poll(0)
        assert reports == [KafkaError._MSG_TIMED_OUT]
        err = info.value.args[0]
        assert (err.code(), err.txn_requires_abort(), err.fatal()) == (KafkaError._MSG_TIMED_OUT, True, False)
        p.abort_transaction(10)
        p.begin_transaction()
        p.produce("t", value=b"next")
        p.commit_transaction(10)
    assert [r[3] for r in read_all(conf, "t")] == [b"next"]
