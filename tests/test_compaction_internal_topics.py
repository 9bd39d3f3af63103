"""The coordinators' own logs (``__transaction_state``, ``__consumer_offsets``) are compacted by
the same code as user topics, and the coordinators recover from the compacted logs to the
same state as from the uncompacted ones."""

import time

from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from txlake.engine.broker import Broker, BrokerConfig
from txlake.engine.compaction import compact

from helpers import client_conf, close_engines  # noqa: F401

DAY_MS = 86_400_000
COORDINATORS = {"transaction.state.log.num.partitions": 2}
GROUPS = {"offsets.topic.num.partitions": 2}
INTERNAL = ("__transaction_state", "__consumer_offsets")


def open_broker(storage):
    return Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, lease_ms=60_000, compaction_interval_ms=0,
                                                       transaction=dict(COORDINATORS), group=dict(GROUPS)))


def coordinator_state(storage):
    """Everything both coordinators rebuild from their logs, read by a freshly started writer."""
    b = open_broker(storage)
    try:
        manager = b.transaction_coordinator().state
        listed = manager.list_transaction_states()
        txns = {}
        for t in listed.transaction_states:
            # TransactionMetadata compares by value: ids, epochs, state, partitions, timeout, timestamps
            txns[t.transactional_id] = manager.get_transaction_state(t.transactional_id).transaction_metadata
        offsets = b.group_offsets()
        groups = {}
        for partition in range(GROUPS["offsets.topic.num.partitions"]):
            for group, state in offsets.replay(partition).items():
                groups[group] = ({tp: (o, m.offset, m.metadata) for tp, (o, m) in state.committed.items()},
                                 sorted(state.pending))
        return txns, groups
    finally:
        b.close()


def internal_records(storage):
    b = open_broker(storage)
    try:
        state = b.catalog.state
        return {name: sum(s.record_count for p in state.topics[name].partitions for s in p.segments) for name in INTERNAL}
    finally:
        b.close()


def test_coordinators_recover_the_same_state_from_compacted_logs(storage, close_engines):
    conf = client_conf(storage, {"storage.flush.linger.ms": 1, "storage.compaction.interval.ms": 0,
                                 **COORDINATORS, **GROUPS})
    admin = AdminClient(conf)
    for name in ("in", "out"):
        admin.create_topics([NewTopic(name, 2)])[name].result()
    feeder = Producer(conf)
    for i in range(40):
        feeder.produce("in", value=f"in-{i}", partition=i % 2)
    assert feeder.flush(10) == 0
    feeder.close()

    # transactional copiers: commits and aborts, offsets sent to group g1 inside the transactions
    for tid, rounds in (("a", 4), ("b", 3), ("c", 2)):
        p = Producer({**conf, "transactional.id": tid})
        p.init_transactions(10)
        for r in range(rounds):
            p.begin_transaction()
            p.produce("out", value=f"{tid}-{r}", partition=r % 2)
            p.send_offsets_to_transaction([TopicPartition("in", r % 2, 5 * (r + 1), f"{tid}{r}")], "g1", 10)
            if r % 3 == 2:
                p.abort_transaction(10)
            else:
                p.commit_transaction(10)
        p.close()
    # plain group commits, overwritten several times; one partition's offset deleted later on
    consumer = Consumer({**conf, "group.id": "g2", "enable.auto.commit": False})
    for r in range(5):
        consumer.commit(offsets=[TopicPartition("in", 0, 3 * r), TopicPartition("in", 1, 2 * r)], asynchronous=False)
    consumer.close()
    # an id that expires (tombstone in __transaction_state), then a transaction left open
    broker = admin._broker
    manager = broker.transaction_coordinator().state
    assert sorted(manager.remove_expired_transactional_ids(now=int(time.time() * 1000) + 8 * DAY_MS,
                                                    expiration_ms=7 * DAY_MS)) == ["a", "b", "c"]
    d = Producer({**conf, "transactional.id": "d"})
    d.init_transactions(10)
    d.begin_transaction()
    d.produce("out", value="open", partition=0)
    d.send_offsets_to_transaction([TopicPartition("in", 1, 33)], "g1", 10)
    # 30 s: one clean-clone CI run on S3 saw this record still undelivered after 10 s (not
    # reproduced since; recorded in the session-9 note as an open question)
    assert d.flush(30) == 0
    e = Producer({**conf, "transactional.id": "e"})
    e.init_transactions(10)
    e.begin_transaction()
    e.produce("out", value="e-0", partition=1)
    e.commit_transaction(10)
    broker.flush()
    for client in (d, e, admin):   # d's transaction stays open: its records are never cleaned
        client.close()

    before = coordinator_state(storage)
    txns, groups = before
    assert sorted(txns) == ["d", "e"]
    assert (txns["d"].state.state_name, txns["e"].state.state_name) == ("Ongoing", "CompleteCommit")
    assert sorted(tp[0] for tp in txns["d"].topic_partitions) == ["__consumer_offsets", "out"]
    assert sorted(groups) == ["g1", "g2"]
    assert {tp: v[1] for tp, v in groups["g2"][0].items()} == {("in", 0): 12, ("in", 1): 8}
    # c's commits came last; a's and b's third transactions were aborted
    assert {tp: v[1] for tp, v in groups["g1"][0].items()} == {("in", 0): 5, ("in", 1): 10}
    assert groups["g1"][1] == [("in", 1)]                                  # d's offset is pending
    records_before = internal_records(storage)

    b = open_broker(storage)
    try:
        summary = compact(b, list(INTERNAL), now_ms=int(time.time() * 1000) + 3 * DAY_MS)
    finally:
        b.close()
    assert summary.key_compacted_partitions >= 2
    records_after = internal_records(storage)
    assert all(records_after[n] < records_before[n] for n in INTERNAL), (records_before, records_after)

    assert coordinator_state(storage) == before
