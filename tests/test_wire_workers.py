"""The demo's exactly-once workers (txlake.copier, txlake.group_copier) as Kafka clients:
confluent-kafka's Producer and Consumer through ``txlake serve`` when the config names
``bootstrap.servers``, txlake's in-process clients otherwise (issue 18)."""

from __future__ import annotations

import sys

import confluent_kafka
import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient as KafkaAdmin
from confluent_kafka.admin import NewTopic as KafkaNewTopic

import txlake
from txlake.copier import kafka_clients
from txlake.group_copier import WIRE_CONSUMER_CONF, WORKER_CONSUMER_CONF, _rewind, worker_consumer_conf


def test_the_config_picks_the_client_module(monkeypatch):
    assert kafka_clients({"storage.url": "memory://x"}) is txlake
    assert kafka_clients({"bootstrap.servers": "127.0.0.1:9092"}) is confluent_kafka
    # librdkafka refuses max.poll.interval.ms < session.timeout.ms; the in-process consumer keeps its 4 s
    assert worker_consumer_conf({"bootstrap.servers": "x"}) is WIRE_CONSUMER_CONF
    assert WIRE_CONSUMER_CONF["max.poll.interval.ms"] == WIRE_CONSUMER_CONF["session.timeout.ms"] == 6000
    assert worker_consumer_conf({"storage.url": "memory://x"}) is WORKER_CONSUMER_CONF
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)       # not installed (the test extra)
    with pytest.raises(ImportError, match=r"^a config with bootstrap\.servers needs confluent-kafka, which cannot be "
                                          r"imported \(.*\); pip install confluent-kafka \(in a checkout: pip install "
                                          r"-e '\.\[test\]'\)$"):
        kafka_clients({"bootstrap.servers": "127.0.0.1:9092"})


@pytest.mark.parametrize("serve_root", ["file"], indirect=True)
def test_rewind_seeks_a_confluent_consumer_back_to_the_committed_offsets(serve_root):
    """After an aborted transaction a group worker copies its inputs again from the group's
    committed offsets. librdkafka cannot seek to OFFSET_STORED (``_INVALID_ARG: Failed to seek to
    offset -1000``), so the committed offsets are fetched and sought: partition 0 back to its
    committed 4, partition 1 (nothing committed; auto.offset.reset earliest) to its beginning."""
    served = serve_root.start()
    conf = {"bootstrap.servers": served.bootstrap}
    admin = KafkaAdmin(conf)
    admin.create_topics([KafkaNewTopic("t", 2)])["t"].result(30)
    producer = KafkaProducer(conf)
    for i in range(20):
        producer.produce("t", value=b"v%d" % i, partition=i % 2)
    assert producer.flush(30) == 0
    consumer = KafkaConsumer({**conf, "group.id": "g", "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([KafkaTopicPartition("t", 0), KafkaTopicPartition("t", 1)])
        got = []
        while len(got) < 20:
            got += [m for m in consumer.consume(20, 1.0) if m.error() is None]
        assert sorted((m.partition(), m.offset()) for m in got) == [(p, o) for p in (0, 1) for o in range(10)]
        consumer.commit(offsets=[KafkaTopicPartition("t", 0, 4)], asynchronous=False)
        _rewind(confluent_kafka, consumer)
        again = []
        while len(again) < 16:
            again += [m for m in consumer.consume(16, 1.0) if m.error() is None]
        assert sorted((m.partition(), m.offset()) for m in again) == \
            [(0, o) for o in range(4, 10)] + [(1, o) for o in range(10)]
    finally:
        consumer.close()


@pytest.mark.parametrize("serve_root", ["file"], indirect=True)
def test_the_copier_over_the_wire_ends_when_a_partition_gives_it_no_record(serve_root):
    """librdkafka's ``position()`` is OFFSET_INVALID for a partition the consumer returned no
    message of -- an empty one, or one a killed predecessor had copied to its end. The copier's
    end check reads the committed offset (else the log start) there; it used to compare
    OFFSET_INVALID with the end and poll forever (the full demo's restarted copier did)."""
    import threading

    from txlake.copier import copy_exactly_once

    served = serve_root.start()
    conf = {"bootstrap.servers": served.bootstrap}
    admin = KafkaAdmin(conf)
    for topic in ("src", "dst"):
        admin.create_topics([KafkaNewTopic(topic, 2)])[topic].result(30)
    producer = KafkaProducer(conf)
    for i in range(10):     # partition 0 only: partition 1 stays empty
        producer.produce("src", value=b'{"origin": "EWR", "dest": "CAE", "arr_delay": %d}' % i, partition=0)
    assert producer.flush(30) == 0
    done: list[int] = []
    events: list[str] = []
    copier = threading.Thread(target=lambda: done.append(copy_exactly_once(conf, "src", "dst", "g", "t-1", 4,
                                                                           emit=events.append)), daemon=True)
    copier.start()
    copier.join(timeout=90)
    assert not copier.is_alive(), f"the copier did not end; its events: {events}"
    assert done == [10] and events == ["started", "committed 1 4", "committed 2 4", "committed 3 2", "done 10"]
