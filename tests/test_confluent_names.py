"""confluent-kafka's module-level names under txlake (issue 17): every KafkaError code with
librdkafka's name, number and text, ``txlake.cimpl``, version functions, ThrottleEvent, the
Message constructor and setters, TopicPartition ordering, and the key partitioners.

Each check compares against the installed confluent-kafka itself (a test dependency), so a
difference -- or a newer librdkafka with codes we lack -- fails here.
"""

from __future__ import annotations

import random

import confluent_kafka
import pytest

import txlake
import txlake.cimpl
from txlake import KafkaError, Message, TopicPartition


def _codes(error_class) -> dict[str, int]:
    return {name: getattr(error_class, name) for name in dir(error_class)
            if not name.startswith("__") and isinstance(getattr(error_class, name), int)}


def test_every_librdkafka_error_code_has_its_name_number_and_text():
    theirs = _codes(confluent_kafka.KafkaError)
    assert len(theirs) == 188
    ours = _codes(KafkaError)
    assert {name: ours.get(name) for name in theirs} == theirs
    for name, code in theirs.items():
        a, b = confluent_kafka.KafkaError(code), KafkaError(code)
        assert (b.code(), b.name(), b.str(), repr(b), str(b)) == (a.code(), a.name(), a.str(), repr(a), str(a)), name
    # a reason given replaces the text, as confluent-kafka's
    assert repr(KafkaError(3, "custom")) == repr(confluent_kafka.KafkaError(3, "custom"))
    # Kafka's own names stay as aliases of the same numbers
    assert (KafkaError.INVALID_TOPIC_EXCEPTION, KafkaError.TOPIC_EXCEPTION) == (17, 17)
    assert (KafkaError.NOT_LEADER_OR_FOLLOWER, KafkaError.NOT_LEADER_FOR_PARTITION) == (6, 6)


def test_kafka_name_is_kafkas_for_the_cli():
    from txlake.error import kafka_name

    assert [kafka_name(c) for c in (17, 6, -1, 3, -185, 9999)] == [
        "INVALID_TOPIC_EXCEPTION", "NOT_LEADER_OR_FOLLOWER", "UNKNOWN_SERVER_ERROR", "UNKNOWN_TOPIC_OR_PART",
        "_TIMED_OUT", "ERR_9999?"]


def test_cimpl_has_every_name_a_program_imports_from_confluent_kafka_cimpl():
    wanted = {"Consumer", "Producer", "Message", "TopicPartition", "KafkaError", "KafkaException", "OFFSET_BEGINNING",
              "OFFSET_END", "OFFSET_INVALID", "OFFSET_STORED", "TIMESTAMP_CREATE_TIME", "TIMESTAMP_LOG_APPEND_TIME",
              "TIMESTAMP_NOT_AVAILABLE", "murmur2", "consistent", "fnv1a", "version", "libversion"}
    assert wanted <= set(dir(confluent_kafka.cimpl))
    assert wanted - set(dir(txlake.cimpl)) == set()
    for name in wanted:
        assert getattr(txlake, name) is getattr(txlake.cimpl, name), name
    for name in ("OFFSET_BEGINNING", "OFFSET_END", "OFFSET_INVALID", "OFFSET_STORED", "TIMESTAMP_CREATE_TIME",
                 "TIMESTAMP_LOG_APPEND_TIME", "TIMESTAMP_NOT_AVAILABLE"):
        assert getattr(txlake.cimpl, name) == getattr(confluent_kafka.cimpl, name), name


def test_version_and_libversion_have_confluent_kafkas_shape():
    # confluent-kafka 2.x: version() is the module's version string, libversion() (string, int)
    assert type(confluent_kafka.version()) is str and type(confluent_kafka.libversion()) is tuple
    assert txlake.version() == txlake.__version__
    assert "Using txlake %s" % txlake.version() == f"Using txlake {txlake.__version__}"
    sver, iver = txlake.libversion()
    assert sver == txlake.__version__
    major, minor, revision = (int(x) for x in sver.split(".")[:3])
    assert iver == (major << 24) | (minor << 16) | (revision << 8) | 0xFF
    assert "%s (0x%x)" % txlake.libversion() == f"{sver} (0x{iver:x})"


def test_throttle_event_as_confluent_kafka():
    event = txlake.ThrottleEvent("broker", 0, 10.0)
    assert (event.broker_name, event.broker_id, event.throttle_time) == ("broker", 0, 10.0)
    assert str(event) == str(confluent_kafka.ThrottleEvent("broker", 0, 10.0)) == "broker/0 throttled for 10000 ms"


def _message_fields(m) -> tuple:
    return (m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.headers(), m.error(), m.timestamp(),
            m.latency(), m.leader_epoch(), m.delivery_count(), len(m))


def test_message_constructor_order_defaults_and_setters():
    args = ("t", 1, 5, b"k", b"value", [("h", b"1")], None, (1, 123), 0.5, 3, 2)
    assert _message_fields(Message(*args)) == _message_fields(confluent_kafka.Message(*args))
    assert _message_fields(Message()) == _message_fields(confluent_kafka.Message())
    ours, theirs = Message(topic="t", timestamp=(2, 9)), confluent_kafka.Message(topic="t", timestamp=(2, 9))
    for m, err in ((ours, KafkaError(3)), (theirs, confluent_kafka.KafkaError(3))):
        m.set_topic("x")
        m.set_key(b"K")
        m.set_value(b"V")
        m.set_headers([("a", b"b")])
        m.set_error(err)
    assert _message_fields(ours)[:6] == _message_fields(theirs)[:6] == ("x", None, None, b"K", b"V", [("a", b"b")])
    assert ours.error().code() == theirs.error().code() == 3
    for bad in ({"timestamp": 5}, {"timestamp": (1,)}, {"partition": "x"}):
        with pytest.raises(TypeError):
            confluent_kafka.Message(**bad)
        with pytest.raises(TypeError):
            Message(**bad)
    with pytest.raises(TypeError, match=r"timestamp must be a tuple of \(int, int\)"):
        Message(timestamp=(1, "x"))  # confluent-kafka 2.16 raises SystemError here


def test_topic_partition_ordering_and_repr():
    def order(tp_class) -> list[tuple[str, int]]:
        parts = [tp_class("b", 1), tp_class("a", 2), tp_class("a", 1), tp_class("b", 0)]
        return [(tp.topic, tp.partition) for tp in sorted(parts)]

    assert order(TopicPartition) == order(confluent_kafka.TopicPartition) == [("a", 1), ("a", 2), ("b", 0), ("b", 1)]
    a1, a2, b0 = TopicPartition("a", 1), TopicPartition("a", 2), TopicPartition("b", 0)
    assert (a1 < a2, a1 <= TopicPartition("a", 1), b0 > a2, a1 >= a2, a1 != TopicPartition("a", 1)) == (
        True, True, True, False, False)
    for args, kwargs in ((("a", 1, 5), {}), (("a", 1, 5), {"leader_epoch": 3})):
        assert repr(TopicPartition(*args, **kwargs)) == repr(confluent_kafka.TopicPartition(*args, **kwargs))
        assert str(TopicPartition(*args, **kwargs)) == str(confluent_kafka.TopicPartition(*args, **kwargs))


def test_key_partitioners_place_keys_as_librdkafka():
    rng = random.Random(17)
    for _ in range(3000):
        key = rng.randbytes(rng.randint(0, 24))
        n = rng.randint(1, 64)
        assert (txlake.murmur2(key, n), txlake.consistent(key, n), txlake.fnv1a(key, n)) == (
            confluent_kafka.murmur2(key, n), confluent_kafka.consistent(key, n), confluent_kafka.fnv1a(key, n)), (key, n)


# ---------------------------------------------------------------- configuration carries over
def test_every_librdkafka_property_is_known_to_txlake():
    """The generated table is librdkafka's own list: every property confluent-kafka accepts
    (probed on a real confluent-kafka producer/consumer with librdkafka's default value)."""
    from txlake.librdkafka_config import LIBRDKAFKA_PROPERTIES

    assert len(LIBRDKAFKA_PROPERTIES) > 180
    for key in ("security.protocol", "sasl.mechanisms", "ssl.ca.location", "socket.keepalive.enable",
                "statistics.interval.ms", "partitioner", "message.timeout.ms", "enable.auto.offset.store"):
        assert key in LIBRDKAFKA_PROPERTIES, key
    with pytest.raises(confluent_kafka.KafkaException, match="No such configuration property"):
        confluent_kafka.Producer({"no.such.property": 1})


def test_a_confluent_kafka_config_dict_is_accepted_and_its_network_keys_ignored(caplog, monkeypatch):
    from txlake import Consumer, Producer, config

    monkeypatch.setattr(config, "_ignored_logged", set())  # as in a fresh process

    network = {"security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN", "sasl.username": "u",
               "sasl.password": "p", "ssl.ca.location": "/etc/ssl/certs", "socket.keepalive.enable": True,
               "statistics.interval.ms": 1000, "stats_cb": lambda stats: None, "throttle_cb": lambda event: None,
               "api.version.request": True, "client.rack": "r1"}
    with caplog.at_level("WARNING", logger="txlake.config"):
        p = Producer({"storage.url": "memory://confluent-conf", **network, "group.id": "only-for-consumers"})
        p.flush(1)
        Producer({"storage.url": "memory://confluent-conf", **network}).flush(1)  # logged once per process
        c = Consumer({"storage.url": "memory://confluent-conf", "group.id": "g", **network})
        c.close()
    ignored = sorted(r.getMessage().split('"')[1] for r in caplog.records if "has no effect" in r.getMessage())
    assert ignored == sorted([*network, "group.id", *network])  # the producer's set (+ group.id), then the consumer's


@pytest.mark.parametrize("extra,message", [
    ({"lingr.ms": 5}, 'No such configuration property: "lingr.ms" (did you mean "linger.ms"?)'),
    ({"enable.idempotance": True}, 'No such configuration property: "enable.idempotance" (did you mean "enable.idempotence"?)'),
    ({"xyzzy": 1}, 'No such configuration property: "xyzzy"'),
    ({"statistics.interval.ms": "abc"}, 'Invalid value "abc" for configuration property "statistics.interval.ms": expected an integer'),
    ({"statistics.interval.ms": 86_400_001}, 'Invalid value "86400001" for configuration property "statistics.interval.ms": value must be 0..86400000'),
    ({"security.protocol": "tls"}, 'Invalid value "tls" for configuration property "security.protocol": expected one of plaintext, ssl, sasl_plaintext, sasl_ssl'),
    ({"socket.keepalive.enable": "maybe"}, 'Invalid value "maybe" for configuration property "socket.keepalive.enable": expected true or false'),
    ({"stats_cb": 5}, 'Invalid value "5" for configuration property "stats_cb": expected a callable'),
])
def test_typos_and_bad_values_of_ignored_properties_are_refused(extra, message):
    from txlake import KafkaException, Producer

    with pytest.raises(KafkaException) as exc:
        Producer({"storage.url": "memory://confluent-conf", **extra})
    assert (exc.value.args[0].code(), exc.value.args[0].str()) == (KafkaError._INVALID_ARG, message)
