"""The serialization layer (issue 17): txlake.serialization, SerializingProducer,
DeserializingConsumer and the errors of txlake.error, checked against the installed
confluent-kafka (the specification: its serializers' bytes, its errors, its names)."""

import inspect
import math
import struct
import subprocess
import sys

import confluent_kafka.error as ck_error
import confluent_kafka.serialization as ck
import pytest

import txlake.error as tx_error
import txlake.serialization as tx
from txlake import (OFFSET_BEGINNING, AdminClient, Consumer, DeserializingConsumer, KafkaError, KafkaException, NewTopic,
                    Producer, SerializingProducer, TopicPartition)
from txlake.engine.registry import close_all
from txlake.error import (ConsumeError, KeyDeserializationError, KeySerializationError, ProduceError, SerializationError,
                          ValueDeserializationError, ValueSerializationError)
from txlake.serialization import MessageField


@pytest.fixture
def backend():
    """memory:// only: the layer above the clients does not depend on the storage."""
    return "memory"


@pytest.fixture
def conf(storage):
    c = {**storage.conf(), "storage.flush.linger.ms": 1}
    with AdminClient(c) as admin:
        admin.create_topics([NewTopic(t, 1) for t in ("strings", "ints", "doubles", "t")])["t"].result()
    yield c
    close_all()


def _reader(conf, cls=Consumer, **extra):
    """A consumer (of ``cls``) of ``conf``'s root reading from the earliest offset."""
    return cls({**conf, "auto.offset.reset": "earliest", **extra})


def _read_all(consumer, topic, n):
    """The first ``n`` records of ``topic`` partition 0 through ``consumer.poll``."""
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    out = []
    while len(out) < n:
        msg = consumer.poll(5)
        assert msg is not None, f"only {len(out)} of {n} records of {topic} came"
        assert msg.error() is None, msg.error()
        out.append(msg)
    return out


# Inputs of each built-in serializer, at the edges of its range.
STRINGS = ["", "plain", "ü€😀", "x" * 1000]
INTS = [0, 1, -1, 2**31 - 1, -(2**31), 256]
DOUBLES = [0.0, -0.0, 1.5, -2.25e-308, 1.7976931348623157e308, math.inf, -math.inf, math.nan]

# (topic, serializer class name, key/value pairs) of the round trip.
CASES = [
    ("strings", "String", [(s, STRINGS[-1 - i]) for i, s in enumerate(STRINGS)] + [(None, "null key"), ("null value", None)]),
    ("ints", "Integer", [(i, -i if i != -(2**31) else 7) for i in INTS] + [(None, 5), (6, None)]),
    ("doubles", "Double", [(d, d / 2) for d in DOUBLES] + [(None, 1.0), (2.0, None)]),
]


def _same(a, b):
    """Equality that holds for NaN and tells -0.0 from 0.0 (the bytes decide)."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack(">d", a) == struct.pack(">d", b)
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("writer, reader", [(tx, tx), (ck, tx), (tx, ck)], ids=["txlake", "ck-serializers", "ck-deserializers"])
def test_round_trip_of_str_int_double_keys_and_values(conf, writer, reader):
    """SerializingProducer -> DeserializingConsumer gives back every key and value exactly, at
    offsets 0..n-1; the stored bytes are confluent-kafka's serializers' output; confluent-kafka's
    own (de)serializers work on txlake's clients in either place."""
    for topic, kind, pairs in CASES:
        ser = getattr(writer, f"{kind}Serializer")
        p = SerializingProducer({**conf, "key.serializer": ser(), "value.serializer": ser()})
        reports = []
        for k, v in pairs:
            p.produce(topic, key=k, value=v, on_delivery=lambda err, msg: reports.append((err, msg.offset())))
        assert p.flush(10) == 0
        assert reports == [(None, i) for i in range(len(pairs))]
        p.close()

        deser = getattr(reader, f"{kind}Deserializer")
        c = _reader(conf, DeserializingConsumer, **{"key.deserializer": deser(), "value.deserializer": deser()})
        got = _read_all(c, topic, len(pairs))
        c.close()
        assert [m.offset() for m in got] == list(range(len(pairs)))
        for m, (k, v) in zip(got, pairs):
            assert _same(m.key(), k) and _same(m.value(), v), (topic, m.offset(), m.key(), m.value(), k, v)
            assert m.deserialized_key() is m.key() and m.deserialized_value() is m.value()

        raw = _read_all(_reader(conf), topic, len(pairs))
        reference = getattr(ck, f"{kind}Serializer")()
        assert [(m.key(), m.value()) for m in raw] == [(reference(k), reference(v)) for k, v in pairs]


def test_builtin_serializers_match_confluent_kafka_byte_for_byte_and_error_for_error():
    """Every built-in (de)serializer gives confluent-kafka's bytes and objects, and fails with the
    same exception class name and text, for good and bad inputs and several codecs."""

    def outcome(fn, arg):
        try:
            return "ok", fn(arg, None)
        except Exception as exc:  # noqa: BLE001 - compared below
            return type(exc).__name__, str(exc)

    cases = [
        ("StringSerializer", (), STRINGS + [None, 5, b"bytes"]),
        ("StringSerializer", ("ascii",), ["abc", "é"]),
        ("StringSerializer", ("latin_1",), ["é", "€"]),
        ("StringSerializer", ("utf_16",), ["ü€"]),
        ("StringDeserializer", (), [b"", "ü€😀".encode(), b"\xff", None]),
        ("StringDeserializer", ("ascii",), [b"abc", b"\xe9"]),
        ("IntegerSerializer", (), INTS + [None, 2**31, -(2**31) - 1, 1.5, "1"]),
        ("IntegerDeserializer", (), [b"\x00\x00\x00\x01", b"\xff\xff\xff\xff", b"\x80\x00\x00\x00", b"abc", b"abcde", b"", None]),
        ("DoubleSerializer", (), DOUBLES[:-1] + [None, 3, "1.0", 10**400]),
        ("DoubleDeserializer", (), [struct.pack(">d", d) for d in DOUBLES[:-1]] + [b"1234567", b"", None]),
    ]
    for name, args, inputs in cases:
        ours, theirs = getattr(tx, name)(*args), getattr(ck, name)(*args)
        for arg in inputs:
            assert outcome(ours, arg) == outcome(theirs, arg), (name, args, arg)
    nan = struct.pack(">d", math.nan)
    assert tx.DoubleSerializer()(math.nan) == ck.DoubleSerializer()(math.nan)
    assert math.isnan(tx.DoubleDeserializer()(nan))
    assert tx.IntegerSerializer()(-2) == b"\xff\xff\xff\xfe" and tx.DoubleSerializer()(1.5) == b"\x3f\xf8" + bytes(6)
    assert tx.StringSerializer().codec == "utf_8" and tx.StringDeserializer("latin_1").codec == "latin_1"


def test_names_constructors_and_bases_are_confluent_kafkas():
    """Every name of confluent_kafka.serialization is in txlake.serialization, every error class
    of confluent_kafka.error is in txlake.error, with the same constructor parameters and the
    same base classes (by name); errors carry the same codes, text and attributes."""
    assert set(ck.__all__) <= set(tx.__all__) and all(hasattr(tx, n) for n in ck.__all__)
    assert [(f.name, f.value, str(f)) for f in tx.MessageField] == [(f.name, f.value, str(f)) for f in ck.MessageField]
    assert MessageField.KEY == "key" and f"{MessageField.VALUE}" == "value"
    ctx = tx.SerializationContext("t", MessageField.KEY)
    assert (ctx.topic, ctx.field, ctx.headers) == ("t", "key", None)
    for name in ["ConsumeError", "KeyDeserializationError", "ValueDeserializationError", "ProduceError",
                 "KeySerializationError", "ValueSerializationError", "SerializationError"]:
        ours, theirs = getattr(tx_error, name), getattr(ck_error, name)
        assert [c.__name__ for c in ours.__mro__] == [c.__name__ for c in theirs.__mro__], name
        if name != "SerializationError":   # theirs is a C exception's subclass: no signature to read
            assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters), name
    cause = ValueError("boom")
    pairs = [(tx_error.KeySerializationError(cause), ck_error.KeySerializationError(cause)),
             (tx_error.ValueSerializationError(cause), ck_error.ValueSerializationError(cause)),
             (tx_error.KeyDeserializationError(cause, "m"), ck_error.KeyDeserializationError(cause, "m")),
             (tx_error.ValueDeserializationError(cause, "m"), ck_error.ValueDeserializationError(cause, "m")),
             (tx_error.ConsumeError(KafkaError(KafkaError._PARTITION_EOF), None, "m"),
              ck_error.ConsumeError(ck_error.KafkaError(-191), None, "m")),
             (tx_error.ProduceError(KafkaError(KafkaError._FAIL, "x")), ck_error.ProduceError(ck_error.KafkaError(-196, "x"))),
             (tx_error.KeySerializationError(), ck_error.KeySerializationError())]
    for a, b in pairs:
        assert (a.code, a.name, str(a), repr(a), a.exception, a.kafka_message) == \
               (b.code, b.name, str(b), repr(b), b.exception, b.kafka_message)
        assert (a.args[0].str(), a.args[0].retriable(), a.args[0].fatal()) == \
               (b.args[0].str(), b.args[0].retriable(), b.args[0].fatal())
    for args in [("text",), (), ("a", "b")]:
        a, b = SerializationError(*args), ck.SerializationError(*args)
        assert (a.args, str(a), repr(a)) == (b.args, str(b), repr(b))
        assert isinstance(a, KafkaException)


def test_serializer_errors_raise_key_and_value_serialization_error_with_the_cause(conf):
    """A failing key serializer raises KeySerializationError (_KEY_SERIALIZATION, the cause as
    .exception and __cause__), a failing value serializer ValueSerializationError; nothing is
    queued, and the producer goes on; a closed producer and a non-str topic fail before any
    serializer runs."""
    calls = []

    class Boom(Exception):
        pass

    def value_serializer(obj, ctx):
        calls.append(obj)
        if obj == "bad":
            raise Boom("no bytes for 'bad'")
        return obj.encode()

    p = SerializingProducer({**conf, "key.serializer": tx.IntegerSerializer(), "value.serializer": value_serializer})
    with pytest.raises(KeySerializationError) as err:
        p.produce("t", key=2**31, value="v")
    e = err.value
    assert isinstance(e, ProduceError) and isinstance(e, SerializationError) and isinstance(e, KafkaException)
    assert type(e.exception) is SerializationError and e.__cause__ is e.exception
    assert str(e.exception) == "'i' format requires -2147483648 <= number <= 2147483647"
    assert (e.code, e.name, e.args[0].str(), e.kafka_message) == (-162, "_KEY_SERIALIZATION", str(e.exception), None)
    assert calls == [] and len(p) == 0   # the value serializer never ran: the key failed first

    with pytest.raises(ValueSerializationError) as err:
        p.produce("t", key=1, value="bad")
    e = err.value
    assert type(e.exception) is Boom and e.__cause__ is e.exception
    assert (e.code, e.name, e.args[0].str()) == (KafkaError._VALUE_SERIALIZATION, "_VALUE_SERIALIZATION", "no bytes for 'bad'")
    assert len(p) == 0

    with pytest.raises(ValueSerializationError) as err:   # a str method called on an int: any exception counts
        p.produce("t", key=1, value=7)
    assert type(err.value.exception) is AttributeError

    p.produce("t", key=2, value="good")
    assert p.flush(10) == 0
    [m] = _read_all(_reader(conf), "t", 1)
    assert (m.offset(), m.key(), m.value()) == (0, b"\x00\x00\x00\x02", b"good")

    with pytest.raises(TypeError, match="topic must be a str, not int"):
        p.produce(5, key=3, value="x")
    p.close()
    calls.clear()
    with pytest.raises(RuntimeError, match="Producer has been closed"):
        p.produce("t", key=3, value="x")
    assert calls == []


def test_value_that_fails_to_deserialize_raises_with_the_message_and_the_consumer_goes_on(conf):
    """A record whose value is not 4 bytes raises ValueDeserializationError carrying that record
    (its offset, raw key and value); the next poll returns the record after it. A failing key
    deserializer raises KeyDeserializationError likewise."""
    p = Producer(conf)
    for value in (b"\x00\x00\x00\x01", b"abc", b"\x00\x00\x00\x03"):
        p.produce("t", value=value, key=b"k", partition=0)
    assert p.flush(10) == 0
    p.close()

    c = _reader(conf, DeserializingConsumer, **{"value.deserializer": tx.IntegerDeserializer()})
    c.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
    first = c.poll(5)
    assert (first.offset(), first.key(), first.value()) == (0, b"k", 1)
    with pytest.raises(ValueDeserializationError) as err:
        c.poll(5)
    e = err.value
    assert isinstance(e, ConsumeError) and isinstance(e, SerializationError)
    assert (e.code, e.name) == (-159, "_VALUE_DESERIALIZATION")
    assert type(e.exception) is SerializationError and str(e.exception) == "unpack requires a buffer of 4 bytes"
    assert e.args[0].str() == "unpack requires a buffer of 4 bytes" and e.__cause__ is e.exception
    bad = e.kafka_message
    assert (bad.topic(), bad.partition(), bad.offset(), bad.key(), bad.value()) == ("t", 0, 1, b"k", b"abc")
    third = c.poll(5)
    assert (third.offset(), third.value()) == (2, 3)
    c.close()

    def key_deserializer(data, ctx):
        raise ValueError(f"cannot read key {data!r}")

    c = _reader(conf, DeserializingConsumer, **{"key.deserializer": key_deserializer,
                                                "value.deserializer": tx.IntegerDeserializer()})
    c.assign([TopicPartition("t", 0, 2)])
    with pytest.raises(KeyDeserializationError) as err:
        c.poll(5)
    e = err.value
    assert (e.code, e.name, e.args[0].str()) == (-160, "_KEY_DESERIALIZATION", "cannot read key b'k'")
    assert (e.kafka_message.offset(), e.kafka_message.value()) == (2, b"\x00\x00\x00\x03")
    c.close()


def test_headers_topic_and_field_reach_the_context(conf):
    """Each (de)serializer call sees the topic, KEY then VALUE, and the record's headers."""
    seen = []

    def recording(name):
        def serde(data, ctx):
            seen.append((name, ctx.topic, ctx.field, ctx.headers, data))
            return data
        return serde

    headers = [("trace", b"abc"), ("empty", None)]
    p = SerializingProducer({**conf, "key.serializer": recording("ser"), "value.serializer": recording("ser")})
    p.produce("t", key=b"k", value=b"v", headers=headers)
    p.produce("t", key=b"k2", value=b"v2", headers={"h": b"1"})
    assert p.flush(10) == 0
    p.close()
    assert seen == [("ser", "t", MessageField.KEY, headers, b"k"), ("ser", "t", MessageField.VALUE, headers, b"v"),
                    ("ser", "t", MessageField.KEY, {"h": b"1"}, b"k2"), ("ser", "t", MessageField.VALUE, {"h": b"1"}, b"v2")]

    seen.clear()
    c = _reader(conf, DeserializingConsumer, **{"key.deserializer": recording("de"), "value.deserializer": recording("de")})
    got = _read_all(c, "t", 2)
    c.close()
    assert [(m.key(), m.value(), m.headers()) for m in got] == [(b"k", b"v", headers), (b"k2", b"v2", [("h", b"1")])]
    assert seen == [("de", "t", MessageField.KEY, headers, b"k"), ("de", "t", MessageField.VALUE, headers, b"v"),
                    ("de", "t", MessageField.KEY, [("h", b"1")], b"k2"),
                    ("de", "t", MessageField.VALUE, [("h", b"1")], b"v2")]


def test_error_events_raise_consume_error_and_consume_is_not_implemented(conf):
    """poll() raises ConsumeError for an error event (here _PARTITION_EOF, with the event as
    kafka_message); consume() raises NotImplementedError, as confluent-kafka's."""
    p = SerializingProducer({**conf, "value.serializer": tx.StringSerializer()})
    p.produce("t", value="only")
    assert p.flush(10) == 0
    p.close()
    c = _reader(conf, DeserializingConsumer, **{"value.deserializer": tx.StringDeserializer(),
                                                "enable.partition.eof": True})
    c.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
    assert c.poll(5).value() == "only"
    with pytest.raises(ConsumeError) as err:
        c.poll(5)
    e = err.value
    assert type(e) is ConsumeError and (e.code, e.name, e.exception) == (-191, "_PARTITION_EOF", None)
    assert (e.kafka_message.topic(), e.kafka_message.partition(), e.kafka_message.offset()) == ("t", 0, 1)
    with pytest.raises(NotImplementedError):
        c.consume(1, 0)
    assert c.poll(0.2) is None
    c.close()


@pytest.mark.parametrize("cls, prop", [(SerializingProducer, "value.serializer"), (SerializingProducer, "key.serializer"),
                                       (DeserializingConsumer, "key.deserializer"),
                                       (DeserializingConsumer, "value.deserializer")])
def test_builders_and_bad_serializers_are_refused_naming_the_property(conf, cls, prop):
    """``*.builder`` is refused (_INVALID_ARG, naming it: no Schema Registry builders); a
    serializer and its builder together is confluent-kafka's ValueError; a non-callable is
    _INVALID_ARG naming the property; the caller's dict is left as it was."""
    given = {**conf, prop + ".builder": object()}
    with pytest.raises(KafkaException) as err:
        cls(given)
    assert err.value.args[0].code() == KafkaError._INVALID_ARG
    assert f'"{prop}.builder" is not supported: Schema Registry builders are not supported' in err.value.args[0].str()
    assert prop + ".builder" in given
    with pytest.raises(ValueError, match=f"Cannot configure both {prop} and {prop}.builder; use one or the other"):
        cls({**given, prop: tx.StringSerializer()})
    with pytest.raises(KafkaException, match=f'"{prop}": expected a callable .* not str'):
        cls({**conf, prop: "StringSerializer"})
    with pytest.raises(KafkaException, match='No such configuration property: "value.serializers"'):
        cls({**conf, "value.serializers": tx.StringSerializer()})


def test_txlake_does_not_import_confluent_kafka():
    """confluent-kafka is a test dependency only: importing txlake and its serialization layer
    loads none of it."""
    code = ("import sys, txlake, txlake.serialization, txlake.error; "
            "print(sorted(m for m in sys.modules if m.startswith('confluent_kafka')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
