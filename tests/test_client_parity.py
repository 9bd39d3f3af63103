"""The embedded Producer and Consumer behave as confluent-kafka's (issue 17: a drop-in).

Where confluent-kafka can run without a broker (``confluent_kafka.Producer({})``: purge,
close, bool, len, a raising delivery callback) the same scenario runs on both clients and
the outcomes are compared; the rest asserts librdkafka's documented behaviour exactly.
"""

from __future__ import annotations

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
    p.close()  # before the fix len() stayed 1 and this flush() waited forever


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
