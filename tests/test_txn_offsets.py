"""Transactional offset commits in ``__consumer_offsets`` (KIP-98 / KIP-447): markers apply
per producer and per group partition, log order between plain and transactional commits,
and pending offsets across an engine restart."""

from __future__ import annotations

import pytest

from txlake import AdminClient, Consumer, KafkaError, KafkaException, NewTopic, Producer, TopicPartition
from txlake.engine.group_offsets import partition_for
from txlake.engine.registry import close_all

TXN_CONF = {"transaction.state.log.num.partitions": 3}


@pytest.fixture
def conf(storage):
    c = {**storage.conf(), **TXN_CONF}
    with AdminClient(c) as admin:
        admin.create_topics([NewTopic("in", 2)])["in"].result()
    yield c
    close_all()


def committed(conf, group, partitions=(0, 1), timeout=10):
    with Consumer({**conf, "group.id": group}) as c:
        return [tp.offset for tp in c.committed([TopicPartition("in", p) for p in partitions], timeout=timeout)]


def producer(conf, tid):
    p = Producer({**conf, "transactional.id": tid})
    p.init_transactions(10)
    return p


def test_plain_then_transactional_commit_log_order_wins(conf):
    with Consumer({**conf, "group.id": "g"}) as plain:
        t = producer(conf, "t")
        plain.commit(offsets=[TopicPartition("in", 0, 30)], asynchronous=False)
        t.begin_transaction()
        t.send_offsets_to_transaction([TopicPartition("in", 0, 20)], "g")   # written after the plain one
        t.commit_transaction(10)
        assert committed(conf, "g", (0,)) == [20]
        t.begin_transaction()
        t.send_offsets_to_transaction([TopicPartition("in", 0, 25)], "g")
        plain.commit(offsets=[TopicPartition("in", 0, 40)], asynchronous=False)   # after it, before its marker
        t.commit_transaction(10)
        assert committed(conf, "g", (0,)) == [40]
        t.close()


def test_two_producers_in_one_group_markers_apply_per_producer(conf):
    a, b = producer(conf, "a"), producer(conf, "b")
    a.begin_transaction()
    b.begin_transaction()
    a.send_offsets_to_transaction([TopicPartition("in", 0, 7)], "g")
    b.send_offsets_to_transaction([TopicPartition("in", 1, 9)], "g")
    b.abort_transaction(10)                     # b's ABORT marker must not drop a's pending offsets
    with pytest.raises(KafkaException) as unstable:
        committed(conf, "g", (0,), timeout=0.3)  # a's are still pending
    assert unstable.value.args[0].code() == KafkaError._TIMED_OUT
    assert committed(conf, "g", (1,)) == [-1001]
    a.commit_transaction(10)
    assert committed(conf, "g") == [7, -1001]
    a.close()
    b.close()


def test_one_producer_across_two_groups(conf):
    groups = ["g1", "g2", "g3"]
    assert len({partition_for(g) for g in groups}) > 1    # at least two __consumer_offsets partitions
    t = producer(conf, "t")
    t.begin_transaction()
    for i, g in enumerate(groups):
        t.send_offsets_to_transaction([TopicPartition("in", 0, 10 + i)], g)
    t.commit_transaction(10)
    assert [committed(conf, g, (0,)) for g in groups] == [[10], [11], [12]]
    t.begin_transaction()
    for g in groups:
        t.send_offsets_to_transaction([TopicPartition("in", 0, 99)], g)
    t.abort_transaction(10)
    assert [committed(conf, g, (0,)) for g in groups] == [[10], [11], [12]]
    # a group the transaction never touched is unaffected by its markers
    assert committed(conf, "other", (0,)) == [-1001]
    t.close()


def test_pending_offsets_survive_an_engine_restart_then_are_aborted_by_the_successor(conf):
    t = producer(conf, "t")
    t.begin_transaction()
    t.send_offsets_to_transaction([TopicPartition("in", 0, 5)], "g")
    t.commit_transaction(10)
    t.begin_transaction()
    t.send_offsets_to_transaction([TopicPartition("in", 0, 8)], "g")    # pending, durable
    t.close()                                       # close() does not end the transaction
    close_all()                                     # the engine goes away with the transaction open
    with pytest.raises(KafkaException) as unstable:  # a new engine replays __consumer_offsets: still pending
        committed(conf, "g", (0,), timeout=0.3)
    assert unstable.value.args[0].code() == KafkaError._TIMED_OUT
    successor = producer(conf, "t")                  # init_transactions aborts the open transaction
    assert committed(conf, "g", (0,)) == [5]
    successor.begin_transaction()
    successor.send_offsets_to_transaction([TopicPartition("in", 0, 12)], "g")
    successor.commit_transaction(10)
    successor.close()
    close_all()
    assert committed(conf, "g", (0,)) == [12]       # and a committed transactional offset survives a restart


def test_send_offsets_of_an_unknown_topic_is_refused_and_writes_nothing(conf):
    """send_offsets_to_transaction is a TxnOffsetCommit request: its handler answers
    UNKNOWN_TOPIC_OR_PARTITION for a topic the catalog does not have (Kafka's metadata check),
    which the producer retries until its timeout, as Kafka's client does; no offset of the
    unknown topic is written, the transaction stays usable and commits the offsets of "in"."""
    t = producer(conf, "t")
    t.begin_transaction()
    with pytest.raises(KafkaException) as refused:
        t.send_offsets_to_transaction([TopicPartition("in", 0, 4), TopicPartition("gone", 0, 7)], "g", timeout=0.3)
    err = refused.value.args[0]
    assert (err.code(), err.retriable(), err.txn_requires_abort(), err.fatal()) == (KafkaError._TIMED_OUT, True,
                                                                                      False, False)
    t.send_offsets_to_transaction([TopicPartition("in", 0, 4)], "g")
    t.commit_transaction(10)
    with Consumer({**conf, "group.id": "g"}) as c:
        assert [(tp.topic, tp.partition, tp.offset) for tp in c.committed(
            [TopicPartition("in", 0), TopicPartition("gone", 0)], timeout=10)] == [("in", 0, 4), ("gone", 0, -1001)]
    t.close()
