"""The embedded Producer and Consumer behave as confluent-kafka's (issue 17: a drop-in).

Where confluent-kafka can run without a broker (``confluent_kafka.Producer({})``: purge,
close, bool, len, a raising delivery callback) the same scenario runs on both clients and
the outcomes are compared; the rest asserts librdkafka's documented behaviour exactly.
"""

from __future__ import annotations

import time

import pytest

from txlake import (OFFSET_INVALID, AdminClient, Consumer, KafkaError, KafkaException, NewTopic, Producer,
                    TopicPartition)
from txlake.engine import registry

confluent_kafka = pytest.importorskip("confluent_kafka")


@pytest.fixture
def conf(tmp_path):
    yield {"storage.url": f"file://{tmp_path}/root", "storage.flush.linger.ms": 1}
    registry.close_all()


def create(conf, name, partitions=1):
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(name, partitions)])[name].result()


def _boom(err, msg):
    raise ValueError(f"callback failed for {msg.value()!r}")


# ---------------------------------------------------------------- 1a: a raising delivery callback
def _raising_callback_outcome(producer, topic, flush_timeout):
    """Two records, the first's callback raises: what flush() raises, whether the second's
    report is still served by the next poll, and len() then (librdkafka's len() in between
    counts its queue's events, not records: not compared)."""
    seen = []
    producer.produce(topic, b"first", on_delivery=_boom)
    producer.produce(topic, b"second", on_delivery=lambda err, msg: seen.append(msg.value()))
    if isinstance(producer, confluent_kafka.Producer):
        producer.purge()  # no broker: purging makes the reports ready
    with pytest.raises(ValueError) as info:
        producer.flush(flush_timeout)
    producer.poll(0)
    return str(info.value), seen, len(producer)


def test_a_raising_delivery_callback_propagates_from_flush_and_keeps_len_right(conf):
    create(conf, "t")
    with Producer(conf) as p:
        ours = _raising_callback_outcome(p, "t", 10)
        assert len(p) == 0
    theirs = _raising_callback_outcome(confluent_kafka.Producer({}), "t", 10)
    assert ours == ("callback failed for b'first'", [b"second"], 0)
    assert theirs == ours


def test_close_without_timeout_returns_after_a_raising_callback(conf):
    create(conf, "t")
    p = Producer(conf)
    p.produce("t", b"first", on_delivery=_boom)
    with pytest.raises(ValueError, match="callback failed for b'first'"):
        p.flush()
    assert len(p) == 0
    assert p.close() is True  # before the fix len() stayed 1 and this flush() waited forever


# ---------------------------------------------------------------- 1b: send_offsets_to_transaction
def test_send_offsets_to_transaction_drops_partitions_without_a_valid_offset(conf):
    create(conf, "in", 2)
    create(conf, "out")
    with Producer({**conf, "transactional.id": "tx1"}) as p, Consumer({**conf, "group.id": "g"}) as c:
        p.init_transactions(10)
        p.begin_transaction()
        p.produce("out", b"v")
        # OFFSET_INVALID (e.g. position() of a partition that consumed nothing) is left out
        p.send_offsets_to_transaction([TopicPartition("in", 0, OFFSET_INVALID), TopicPartition("in", 1, 5)], "g", 10)
        p.commit_transaction(10)
        assert [(tp.partition, tp.offset) for tp in c.committed([TopicPartition("in", 0), TopicPartition("in", 1)], 10)] \
            == [(0, OFFSET_INVALID), (1, 5)]
        # nothing valid: nothing is sent, no error (librdkafka: "this is not an error, do nothing")
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition("in", 0, OFFSET_INVALID)], "g", 10)
        p.commit_transaction(10)
        assert [tp.offset for tp in c.committed([TopicPartition("in", 0), TopicPartition("in", 1)], 10)] \
            == [OFFSET_INVALID, 5]


# ---------------------------------------------------------------- 1c: Consumer.commit parity
def test_commit_of_a_message_and_of_offsets(conf):
    create(conf, "t", 2)
    with Producer(conf) as p:
        for i in range(3):
            p.produce("t", f"v{i}".encode(), partition=0)
    with Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": False}) as c:
        c.assign([TopicPartition("t", 0)])
        msgs = c.consume(3, 10)
        assert [m.offset() for m in msgs] == [0, 1, 2]
        done = c.commit(message=msgs[1], asynchronous=False)
        assert [(tp.topic, tp.partition, tp.offset) for tp in done] == [("t", 0, 2)]
        assert c.commit(msgs[2]) is None  # asynchronous by default, positional message as confluent-kafka's
        done = c.commit(offsets=[TopicPartition("t", 1, 7, "m")], asynchronous=False)
        assert [(tp.partition, tp.offset, tp.metadata) for tp in done] == [(1, 7, "m")]
        got = c.committed([TopicPartition("t", 0), TopicPartition("t", 1)], 10)
        assert [(tp.partition, tp.offset) for tp in got] == [(0, 3), (1, 7)]


# ---------------------------------------------------------------- 2: close, bool, purge, produce_batch
def _closed_outcome(producer):
    """What close() returns (twice), bool() and len() after it, and what each call raises then."""
    out = {"close": producer.close(), "again": producer.close(), "bool": bool(producer), "len": len(producer)}
    for name, call in (("produce", lambda: producer.produce("t", b"v")), ("poll", lambda: producer.poll(0)),
                       ("flush", lambda: producer.flush(0)), ("purge", lambda: producer.purge()),
                       ("produce_batch", lambda: producer.produce_batch("t", [{"value": b"v"}]))):
        with pytest.raises(Exception) as info:
            call()
        out[name] = repr(info.value)
    return out


def test_close_returns_true_and_every_later_call_raises_runtime_error(conf):
    create(conf, "t")
    p = Producer(conf)
    assert bool(p) is True and len(p) == 0  # __len__ exists, yet an idle producer is not falsy
    p.produce("t", b"v")
    ours = _closed_outcome(p)
    theirs = _closed_outcome(confluent_kafka.Producer({}))
    closed = "RuntimeError('Producer has been closed')"
    assert ours == {"close": True, "again": True, "bool": True, "len": 0, "produce": closed, "poll": closed,
                    "flush": closed, "purge": closed, "produce_batch": closed}
    assert theirs == ours


def _purge_outcome(producer, topic):
    reports = []
    producer.produce(topic, b"a", key=b"k", on_delivery=lambda err, msg: reports.append((err.code(), err.str(), msg.value())))
    producer.produce(topic, b"b", on_delivery=lambda err, msg: reports.append((err.code(), err.str(), msg.value())))
    producer.purge()
    served = producer.poll(0)
    return served, sorted(reports), len(producer)


def test_purge_reports_purge_queue_for_records_not_sent(conf):
    create(conf, "t")
    with Producer({**conf, "linger.ms": 60_000}) as p:  # the records stay in the producer's queue
        ours = _purge_outcome(p, "t")
        assert ours == (2, [(KafkaError._PURGE_QUEUE, "Local: Purged in queue", b"a"),
                            (KafkaError._PURGE_QUEUE, "Local: Purged in queue", b"b")], 0)
        assert p.flush(10) == 0
        # the producer goes on: nothing purged was written, the next record is offset 0
        offsets = []
        p.produce("t", b"c", on_delivery=lambda err, msg: offsets.append((err, msg.offset())))
        assert p.flush(10) == 0 and offsets == [(None, 0)]
    theirs = _purge_outcome(confluent_kafka.Producer({}), "t")
    assert theirs[1] == ours[1]


def test_purge_in_flight_only_leaves_the_queue(conf):
    create(conf, "t")
    with Producer({**conf, "linger.ms": 60_000}) as p:
        reports = []
        p.produce("t", b"a", on_delivery=lambda err, msg: reports.append(err))
        p.purge(in_queue=False)
        assert p.poll(0) == 0 and len(p) == 1
        assert p.flush(10) == 0 and reports == [None]


def test_produce_batch_returns_the_records_queued_and_marks_the_refused(conf):
    create(conf, "t", 2)
    with Producer({**conf, "message.max.bytes": 1000}) as p:
        got = []
        messages = [{"value": b"a", "partition": 1}, {"value": "b", "key": "k", "partition": 7},
                    {"value": b"x" * 2000}, {"value": b"c", "callback": lambda err, msg: got.append(("own", msg.value()))}]
        assert p.produce_batch("t", messages, partition=0,
                               on_delivery=lambda err, msg: got.append((msg.partition(), msg.offset(), msg.value()))) == 2
        assert "_error" not in messages[0] and "_error" not in messages[3]
        assert messages[1]["_error"].code() == KafkaError._UNKNOWN_PARTITION
        assert messages[2]["_error"].code() == KafkaError.MSG_SIZE_TOO_LARGE
        assert p.flush(10) == 0
        assert sorted(got, key=str) == [("own", b"c"), (1, 0, b"a")]
        assert p.produce_batch("t", []) == 0
        for bad, text in (("x", "messages must be a list"), ([1], "Message at index 0 must be a dict"),
                          ([{"value": 1}], "Message value at index 0 must be bytes or str"),
                          ([{"key": 1}], "Message key at index 0 must be bytes or str"),
                          ([{"partition": "x"}], "Message partition at index 0 must be int")):
            with pytest.raises(TypeError) as info:
                p.produce_batch("t", bad)
            assert str(info.value) == text
            with pytest.raises(TypeError) as theirs:
                confluent_kafka.Producer({}).produce_batch("t", bad)
            assert str(theirs.value) == text
        with pytest.raises(NotImplementedError, match="^Message timestamps are not currently supported in batch mode$"):
            p.produce_batch("t", [{"value": b"v", "timestamp": 5}])
        assert len(p) == 0


def test_produce_batch_queue_full_is_a_per_message_error(conf):
    create(conf, "t")
    with Producer({**conf, "queue.buffering.max.messages": 1, "linger.ms": 60_000}) as p:
        messages = [{"value": b"1"}, {"value": b"2"}]
        assert p.produce_batch("t", messages) == 1
        assert "_error" not in messages[0]
        assert (messages[1]["_error"].code(), messages[1]["_error"].str()) == (KafkaError._QUEUE_FULL,
                                                                                "Message failed: Local: Queue full")
        assert p.flush(10) == 0


def test_purge_reports_purge_inflight_for_a_batch_the_engine_has_not_answered(tmp_path):
    conf = {"storage.url": f"file://{tmp_path}/root", "storage.flush.linger.ms": 2000}
    create(conf, "t")
    try:
        with Producer({**conf, "linger.ms": 0}) as p:
            reports = []
            p.produce("t", b"a", on_delivery=lambda err, msg: reports.append(err.code() if err else None))
            deadline = time.monotonic() + 10
            while not p._inflight and time.monotonic() < deadline:  # sent, waiting for the engine's commit
                time.sleep(0.001)
            p.purge(in_queue=False)
            assert p.poll(0) == 1 and reports == [KafkaError._PURGE_INFLIGHT] and len(p) == 0
            # the engine may still write it (librdkafka: "the message may still be delivered")
            p.produce("t", b"b", on_delivery=lambda err, msg: reports.append(err))
            assert p.flush(10) == 0 and reports[1:] == [None]
    finally:
        registry.close_all()
