"""The partition count of an existing internal topic places the groups and transactional ids,
whatever the process's ``offsets.topic.num.partitions`` / ``transaction.state.log.num.partitions``.

Broker settings are not stored with the root: each process brings its own. Kafka's rule
(``GroupCoordinatorService`` / ``TransactionCoordinator`` startup get
``metadataCache.numPartitions(topic).getOrElse(config)``): the setting only decides the count
the topic is created with; once it exists, a group's ``__consumer_offsets`` partition is
``abs(javaHashCode(group)) % <the topic's count>``, and so is a transactional id's
``__transaction_state`` partition. A root whose internal topics were created with 3 partitions
and later opened with the default 50 (or the reverse) keeps every committed offset, group and
transaction where the next process looks for it.

GROUP "g" hashes to partition 1 of 3 and 3 of 50, TID "tx" to 2 of 3 and 16 of 50: placed by the
process's setting instead, they would be looked for in an empty partition (3 of 50: the offsets
"vanish") or past the end of the topic (3 or 16 of 3: IndexError, UNKNOWN_SERVER_ERROR).
"""

from __future__ import annotations

import time

import pytest

from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from txlake.engine.group_offsets import partition_for as group_partition
from txlake.engine.registry import close_all
from txlake.engine.transaction_state_manager import partition_for as txn_partition

from helpers import open_catalog

GROUP, TID, TOPIC = "g", "tx", "t"
OFFSETS = "offsets.topic.num.partitions"
TXN_LOG = "transaction.state.log.num.partitions"
QUICK = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 100, "storage.flush.linger.ms": 1}
MEMBER = {"group.id": GROUP, "session.timeout.ms": 3000, "heartbeat.interval.ms": 30, "auto.offset.reset": "earliest",
          "enable.auto.commit": False}
COUNTS = [(3, 50), (50, 3)]
WAIT_S = 15


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def backend(request):
    return request.param


@pytest.fixture(autouse=True)
def _close_engines():
    yield
    close_all()


def test_the_ids_of_this_module_land_on_other_partitions_under_each_count():
    """The premise of every test below: the two counts place GROUP and TID differently."""
    assert (group_partition(GROUP, 3), group_partition(GROUP, 50)) == (1, 3)
    assert (txn_partition(TID, 3), txn_partition(TID, 50)) == (2, 16)


def internal_partitions(storage, topic: str) -> int:
    """The partition count of ``topic`` as the root's catalog has it (a fresh reader's view)."""
    return len(open_catalog(storage).state.topics[topic].partitions)


def committed(conf: dict) -> list[tuple[int, int, str]]:
    """``(partition, offset, metadata)`` GROUP has committed for TOPIC-0 and -1, read by a Consumer of ``conf``."""
    with_group = Consumer({**conf, **MEMBER})
    try:
        return [(tp.partition, tp.offset, tp.metadata)
                for tp in with_group.committed([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], timeout=10)]
    finally:
        with_group.close()


def commit_plain(conf: dict, *offsets: TopicPartition) -> None:
    """GROUP commits ``offsets`` through a Consumer of ``conf`` that is no member (generation -1)."""
    consumer = Consumer({**conf, **MEMBER})
    consumer.commit(offsets=list(offsets), asynchronous=False)
    consumer.close()


def reopened(storage, conf: dict, count: int) -> list[tuple[int, int, str]]:
    """Every engine of this process closed: the root's ``__consumer_offsets`` still has ``count``
    partitions, and :func:`committed` as a process of ``conf`` reads it."""
    close_all()
    assert internal_partitions(storage, "__consumer_offsets") == count
    return committed(conf)


def group_views(conf: dict) -> tuple[list, list, list]:
    """What an AdminClient of ``conf`` answers about GROUP: ListGroups ``(id, simple, state)``,
    DescribeGroups ``(id, simple, state, assignor, members)``, OffsetFetch ``(partition, offset)``."""
    import txlake

    with AdminClient(conf) as admin:
        listed = admin.list_consumer_groups().result(10)
        assert listed.errors == []
        described = admin.describe_consumer_groups([GROUP])[GROUP].result(10)
        fetched = admin.list_consumer_group_offsets([txlake.ConsumerGroupTopicPartitions(GROUP)])[GROUP].result(10)
    return ([(g.group_id, g.is_simple_consumer_group, g.state.name) for g in listed.valid],
            [(described.group_id, described.is_simple_consumer_group, described.state.name,
              described.partition_assignor, described.members)],
            [(tp.partition, tp.offset) for tp in fetched.topic_partitions])


@pytest.mark.parametrize("first,second", COUNTS)
def test_committed_offsets_and_groups_are_found_under_another_offsets_topic_count(storage, first, second):
    """A member of GROUP (subscribe(), so the coordinator writes the group's record too)
    commits under ``offsets.topic.num.partitions`` = ``first``; a process with ``second`` finds
    the offsets, the group (Empty, no protocol, no members: not a simple group) and commits on top of
    them where a process with ``first`` reads them back."""
    root = {**storage.conf(), **QUICK}
    with AdminClient({**root, OFFSETS: first}) as admin:
        admin.create_topics([NewTopic(TOPIC, 2)])[TOPIC].result()
    member = Consumer({**root, OFFSETS: first, **MEMBER})
    member.subscribe([TOPIC])
    deadline = time.monotonic() + WAIT_S
    while not member.assignment():
        assert time.monotonic() < deadline, "the member got no assignment"
        member.poll(0.05)
    assert sorted(tp.partition for tp in member.assignment()) == [0, 1]
    member.commit(offsets=[TopicPartition(TOPIC, 0, 5, "m0"), TopicPartition(TOPIC, 1, 7, "m1")], asynchronous=False)
    member.close()

    other = {**root, OFFSETS: second}
    assert reopened(storage, other, first) == [(0, 5, "m0"), (1, 7, "m1")]
    assert group_views(other) == ([(GROUP, False, "EMPTY")], [(GROUP, False, "EMPTY", "", [])], [(0, 5), (1, 7)])

    commit_plain(other, TopicPartition(TOPIC, 0, 9))  # lands where a process with ``first`` looks
    assert reopened(storage, {**root, OFFSETS: first}, first) == [(0, 9, ""), (1, 7, "m1")]


@pytest.mark.parametrize("first,second", COUNTS)
def test_transactional_offsets_of_another_offsets_topic_count_commit_in_the_groups_partition(storage, first, second):
    """send_offsets_to_transaction (AddOffsetsToTxn + TxnOffsetCommit) under
    ``offsets.topic.num.partitions`` = ``second`` on a root whose ``__consumer_offsets`` has
    ``first`` partitions: the offsets commit with the transaction in GROUP's partition of the
    existing topic, where a process with ``first`` finds them."""
    root = {**storage.conf(), **QUICK}
    with AdminClient({**root, OFFSETS: first}) as admin:
        admin.create_topics([NewTopic(TOPIC, 2)])[TOPIC].result()
    commit_plain({**root, OFFSETS: first}, TopicPartition(TOPIC, 0, 5))  # creates __consumer_offsets
    close_all()

    conf = {**root, OFFSETS: second}
    producer = Producer({**conf, "transactional.id": TID})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(TOPIC, b"v", partition=1)
    metadata = Consumer({**conf, **MEMBER})
    producer.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 6), TopicPartition(TOPIC, 1, 3)],
                                         metadata.consumer_group_metadata(), 10)
    producer.commit_transaction(10)
    metadata.close()
    assert reopened(storage, {**root, OFFSETS: first}, first) == [(0, 6, ""), (1, 3, "")]


@pytest.mark.parametrize("first,second", COUNTS)
def test_a_transactional_id_is_found_and_fenced_under_another_transaction_log_count(storage, first, second):
    """A transaction of TID left open by a process with ``transaction.state.log.num.partitions`` =
    ``first``: a process with ``second`` describes it (Ongoing, producer id 0, epoch 0, TOPIC-1)
    and a new producer of TID fences it -- same producer id, epoch 2 (the abort's bump, then its
    own), the open transaction aborted -- which only the same ``__transaction_state`` partition
    can give (another one would know no TID: producer id 1, epoch 0)."""
    root = {**storage.conf(), **QUICK}
    with AdminClient(root) as admin:
        admin.create_topics([NewTopic(TOPIC, 2)])[TOPIC].result()
    old = Producer({**root, TXN_LOG: first, "transactional.id": TID})
    old.init_transactions(10)
    old.begin_transaction()
    old.produce(TOPIC, b"open", partition=1)
    assert old.flush(10) == 0
    close_all()  # the process ends with the transaction open
    assert internal_partitions(storage, "__transaction_state") == first

    conf = {**root, TXN_LOG: second}

    def described() -> tuple:
        with AdminClient(conf) as admin:
            d = admin.describe_transactions([TID])[TID].result(10)
        return d.state, d.producer_id, d.producer_epoch, [(tp.topic, tp.partition) for tp in d.topic_partitions]

    assert described() == ("Ongoing", 0, 0, [(TOPIC, 1)])
    new = Producer({**conf, "transactional.id": TID})
    new.init_transactions(10)
    assert described() == ("Empty", 0, 2, [])
    new.begin_transaction()
    new.produce(TOPIC, b"next", partition=1)
    new.commit_transaction(10)
    reader = Consumer({**conf, "group.id": "reader", "isolation.level": "read_committed",
                       "auto.offset.reset": "earliest", "enable.auto.commit": False})
    reader.assign([TopicPartition(TOPIC, 1, 0)])
    values, deadline = [], time.monotonic() + WAIT_S
    while len(values) < 1 and time.monotonic() < deadline:
        values += [m.value() for m in reader.consume(10, 0.2) if not m.error()]
    reader.close()
    assert values == [b"next"]
    close_all()
    assert internal_partitions(storage, "__transaction_state") == first


def test_served_root_created_with_3_offsets_partitions_is_read_by_a_default_embedded_client(serve_root):
    """``txlake serve --config offsets.topic.num.partitions=3`` creates ``__consumer_offsets``
    with 3 partitions and stores GROUP's offsets over the wire; an embedded client with the
    default 50 afterwards reads them, lists and describes the group, and commits on top; the
    server started again with the default answers that commit."""
    import confluent_kafka
    import confluent_kafka.admin as cadmin

    serve_root.settings.update({"group.initial.rebalance.delay.ms": 0, OFFSETS: 3})
    served = serve_root.start()
    wire = cadmin.AdminClient({"bootstrap.servers": served.bootstrap})
    wire.create_topics([cadmin.NewTopic(TOPIC, 2)])[TOPIC].result(20)
    member = confluent_kafka.Consumer({"bootstrap.servers": served.bootstrap, "group.id": GROUP,
                                       "enable.auto.commit": False})
    member.commit(offsets=[confluent_kafka.TopicPartition(TOPIC, 0, 5), confluent_kafka.TopicPartition(TOPIC, 1, 7)],
                  asynchronous=False)
    member.close()
    serve_root.stop()
    assert internal_partitions(serve_root.storage, "__consumer_offsets") == 3

    embedded = {**serve_root.storage.conf(), "storage.flush.linger.ms": 1}
    assert committed(embedded) == [(0, 5, ""), (1, 7, "")]
    assert group_views(embedded) == ([(GROUP, True, "EMPTY")], [(GROUP, True, "EMPTY", "", [])], [(0, 5), (1, 7)])
    commit_plain(embedded, TopicPartition(TOPIC, 1, 8))
    close_all()

    serve_root.settings.pop(OFFSETS)
    served = serve_root.start()
    member = confluent_kafka.Consumer({"bootstrap.servers": served.bootstrap, "group.id": GROUP})
    answer = member.committed([confluent_kafka.TopicPartition(TOPIC, 0), confluent_kafka.TopicPartition(TOPIC, 1)], 20)
    member.close()
    assert [(tp.partition, tp.offset, tp.error) for tp in answer] == [(0, 5, None), (1, 8, None)]
    assert internal_partitions(serve_root.storage, "__consumer_offsets") == 3


COMMIT_WITH_3 = """
import sys
from txlake import AdminClient, Consumer, NewTopic, TopicPartition
conf = {"storage.url": sys.argv[1], "offsets.topic.num.partitions": 3, "storage.flush.linger.ms": 1}
with AdminClient(conf) as admin:
    admin.create_topics([NewTopic("t", 2)])["t"].result()
c = Consumer({**conf, "group.id": "g"})
c.commit(offsets=[TopicPartition("t", 0, 5), TopicPartition("t", 1, 7)], asynchronous=False)
c.close()
"""


def test_a_reader_opened_before_the_offsets_topic_existed_places_the_group_by_its_count(tmp_path):
    """A Consumer of this process (default 50, no writer lease) opens the root while it has no
    ``__consumer_offsets``; another process (3 partitions) then creates it and commits GROUP's
    offsets. committed() looks at the catalog's new state before placing the group, so it
    reads them from partition 1 of 3 (placed by the stale view: partition 3, past the end)."""
    import subprocess
    import sys

    url = f"file://{tmp_path}/root"
    reader = Consumer({"storage.url": url, **MEMBER})
    try:
        subprocess.run([sys.executable, "-c", COMMIT_WITH_3, url], check=True, timeout=120)
        answer = reader.committed([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)], timeout=10)
    finally:
        reader.close()
    assert [(tp.partition, tp.offset) for tp in answer] == [(0, 5), (1, 7)]
