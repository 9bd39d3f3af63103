"""Producer state retention (KIP-360): DeleteRecords, ``producer.id.expiration.ms``, fencing
markers that outlive their segments, and zombies whose state expired."""

import time

import pytest

from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.engine.errors import Errors
from txlake.engine.producer_state import ProducerStateManager
from txlake.engine.transaction_metadata import TransactionState

from txlake import OFFSET_END, AdminClient, Consumer, KafkaError, NewTopic, Producer, TopicPartition

from helpers import client_conf, close_engines, consume_all, payload, simulate_crash  # noqa: F401

DAY_MS = 86_400_000
CFG = dict(flush_linger_ms=1, lease_ms=60_000, transaction={"transaction.state.log.num.partitions": 2})


def open_broker(storage, **extra):
    return Broker(storage.object_store(), BrokerConfig(**CFG, **extra))


@pytest.fixture
def broker(storage):
    b = open_broker(storage)
    yield b
    b.close()


def produced(b, *batches):
    return [(r.error, r.base_offset, r.duplicate) for r in b.produce(list(batches))]


def entry(b, topic, partition, pid):
    b.ensure_writer()  # a reopened broker rebuilds producer state when it becomes the writer
    return b._partitions[(topic, partition)].producers.last_entry(pid)


# ---- ProducerStateManager.remove_expired_producers ------------------------------------------

def test_expiry_rule_idle_producers_go_open_transactions_stay():
    psm = ProducerStateManager("t", 0)
    psm.update(1, 0, 0, 4, 0, 4, 1_000, False)
    psm.update(2, 0, 0, 0, 5, 5, 1_000, True)           # transaction open since offset 5
    psm.update(3, 0, 0, 0, 6, 6, 1_000, False)
    # idleness counts on the broker's clock at each write, not on the records' timestamps
    for pid, written in ((1, 10_000), (2, 10_000), (3, 10_001)):
        psm.producers[pid].last_write_ms = written
    assert psm.remove_expired_producers(10_000 + DAY_MS - 1, DAY_MS) == []
    assert psm.remove_expired_producers(10_000 + DAY_MS, DAY_MS) == [1]          # >= expiration
    assert sorted(psm.producers) == [2, 3]
    assert psm.remove_expired_producers(10 * DAY_MS, DAY_MS) == [3]
    assert psm.first_unstable_offset() == 5             # the open transaction never expires
    psm.complete_txn(2, 0, 0, 2_000)
    now = int(time.time() * 1000)
    assert psm.remove_expired_producers(now + DAY_MS - 60_000, DAY_MS) == []     # the marker was a write
    assert psm.remove_expired_producers(now + DAY_MS + 60_000, DAY_MS) == [2]
    assert psm.producers == {}


# ---- DeleteRecords --------------------------------------------------------------------------

def test_delete_records_answers_and_bounds(broker):
    assert broker.create_topics([("t", 2, {}), ("c", 1, {"cleanup.policy": "compact"}),
                                 ("cd", 1, {"cleanup.policy": "compact,delete"})]) == [(Errors.NO_ERROR, "")] * 3
    broker.produce([ProduceBatch("t", 0, payload(4)), ProduceBatch("t", 0, payload(3, 4)),
                    ProduceBatch("t", 1, payload(2)), ProduceBatch("c", 0, payload(2)), ProduceBatch("cd", 0, payload(2))])
    answers = broker.delete_records([("t", 0, 5), ("t", 1, -1), ("t", 0, 2), ("t", 0, 8), ("t", 0, -2),
                                     ("c", 0, 1), ("cd", 0, 1), ("nope", 0, 0), ("t", 2, 0)])
    assert [(e, lw) for e, lw, _ in answers] == [
        (Errors.NO_ERROR, 5), (Errors.NO_ERROR, 2), (Errors.NO_ERROR, 5),          # never moves back
        (Errors.OFFSET_OUT_OF_RANGE, -1), (Errors.OFFSET_OUT_OF_RANGE, -1),
        (Errors.POLICY_VIOLATION, -1), (Errors.NO_ERROR, 1),
        (Errors.UNKNOWN_TOPIC_OR_PART, -1), (Errors.UNKNOWN_TOPIC_OR_PART, -1)]
    assert "high watermark 7" in answers[3][2] and "t-0" in answers[3][2]
    assert "cleanup.policy" in answers[5][2]
    p0 = broker.catalog.state.partition("t", 0)
    assert (p0.log_start_offset, p0.high_watermark, p0.last_stable_offset) == (5, 7, 7)
    assert [(s.base_offset, s.last_offset) for s in p0.segments] == [(0, 6)]      # one flush object: kept
    assert broker.fetch("t", 0, 4).error == Errors.OFFSET_OUT_OF_RANGE
    assert broker.fetch("t", 0, 5).records.column("offset").to_pylist() == [5, 6]
    assert broker.list_offsets("t", 0, -2)[:2] == (Errors.NO_ERROR, 5)
    p1 = broker.catalog.state.partition("t", 1)
    assert (p1.log_start_offset, p1.segments) == (2, [])                          # wholly below: dropped
    assert broker.fetch("t", 1, 2).records.num_rows == 0
    # a new segment after the delete starts at the high watermark
    broker.produce([ProduceBatch("t", 1, payload(1))])
    assert broker.fetch("t", 1, 2).records.column("offset").to_pylist() == [2]


def test_delete_records_survives_restart_and_readers_see_it(broker, storage):
    broker.create_topics([("t", 1, {})])
    for i in range(3):
        broker.produce([ProduceBatch("t", 0, payload(2, 2 * i))])
    assert broker.delete_records([("t", 0, 4)])[0][:2] == (Errors.NO_ERROR, 4)
    reader = open_broker(storage)                       # another process's view: catalog only
    try:
        p = reader.catalog.state.partition("t", 0)
        assert (p.log_start_offset, [s.base_offset for s in p.segments]) == (4, [4])
        assert reader.fetch("t", 0, 4).records.column("key").to_pylist() == [b"k4", b"k5"]
    finally:
        reader.close()


# ---- producer state outlives its segments -----------------------------------------------------

@pytest.mark.parametrize("restart", ["none", "clean", "crash"])
def test_live_producer_continues_after_its_segments_are_deleted(storage, restart):
    b = open_broker(storage, producer_snapshot_interval=1_000)   # no periodic snapshot: only DeleteRecords'
    b.create_topics([("t", 1, {})])
    _, pid, _ = b.init_producer_id()
    first, second = ProduceBatch("t", 0, payload(3), pid, 0, 0), ProduceBatch("t", 0, payload(2, 3), pid, 0, 3)
    assert produced(b, first, second) == [(Errors.NO_ERROR, 0, False), (Errors.NO_ERROR, 3, False)]
    assert b.delete_records([("t", 0, -1)])[0][:2] == (Errors.NO_ERROR, 5)
    assert b.catalog.state.partition("t", 0).segments == []
    if restart == "clean":
        b.close()
        b = open_broker(storage)
    elif restart == "crash":
        simulate_crash(b)
        b = open_broker(storage, lease_force=True)
    try:
        e = entry(b, "t", 0, pid)
        assert (e.producer_epoch, e.last_seq, [(x.first_seq, x.last_offset) for x in e.batches]) == (0, 4, [(0, 2), (3, 4)])
        # a retry of a deleted batch is still a duplicate; the next batch continues the sequence
        assert produced(b, second) == [(Errors.NO_ERROR, 3, True)]
        assert produced(b, ProduceBatch("t", 0, payload(1, 5), pid, 0, 5)) == [(Errors.NO_ERROR, 5, False)]
        # the state is real: a gap is still refused (it would be accepted with no state left)
        assert b.produce([ProduceBatch("t", 0, payload(1, 9), pid, 0, 9)])[0].error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        fetched = b.fetch("t", 0, 5).records
        assert (fetched.column("offset").to_pylist(), fetched.column("key").to_pylist()) == ([5], [b"k5"])
    finally:
        b.close()


def test_expired_producer_state_is_dropped_and_any_sequence_is_accepted(storage):
    b = open_broker(storage)
    b.create_topics([("t", 1, {})])
    _, pid, _ = b.init_producer_id()
    before = int(time.time() * 1000)
    b.produce([ProduceBatch("t", 0, payload(2), pid, 0, 0)])
    after = int(time.time() * 1000)
    assert b.remove_expired_producers(now=before + DAY_MS - 1) == {}
    assert b.remove_expired_producers(now=after + DAY_MS) == {("t", 0): [pid]}
    assert entry(b, "t", 0, pid) is None
    # KIP-360: a producer with no state left may write any sequence
    assert produced(b, ProduceBatch("t", 0, payload(1, 2), pid, 0, 7)) == [(Errors.NO_ERROR, 2, False)]
    b.close()


def test_old_record_timestamps_do_not_expire_a_producer_across_a_restart(storage):
    """Historical data (CreateTime years ago, as the demo's flights) keeps its producer's
    state: a retry after a crash and restart is still a duplicate."""
    b = open_broker(storage, producer_snapshot_interval=1)
    b.create_topics([("t", 1, {})])
    _, pid, _ = b.init_producer_id()
    old = ProduceBatch("t", 0, payload(3, ts=1_356_998_400_000), pid, 0, 0)       # 2013-01-01
    assert produced(b, old) == [(Errors.NO_ERROR, 0, False)]
    simulate_crash(b)
    b = open_broker(storage, lease_force=True)
    try:
        assert b.remove_expired_producers() == {}
        assert produced(b, old) == [(Errors.NO_ERROR, 0, True)]
        assert b.catalog.state.partition("t", 0).high_watermark == 3
    finally:
        b.close()


# ---- transactions: fences and zombies ----------------------------------------------------------

def test_fencing_abort_marker_keeps_the_fence_after_deletion_and_restart(storage):
    b = open_broker(storage)
    b.create_topics([("out", 1, {})])
    c = b.transaction_coordinator()
    _, pid, epoch = c.handle_init_producer_id("z", 60_000)
    assert c.handle_add_partitions_to_txn("z", pid, epoch, [("out", 0)]) == {("out", 0): Errors.NO_ERROR}
    assert produced(b, ProduceBatch("out", 0, payload(2), pid, epoch, 0, is_transactional=True)) == [
        (Errors.NO_ERROR, 0, False)]
    # a new instance fences the open transaction: ABORT marker under epoch + 1, then its own epoch + 2
    assert c.handle_init_producer_id("z", 60_000)[0] == Errors.CONCURRENT_TRANSACTIONS
    err, pid2, epoch2 = c.handle_init_producer_id("z", 60_000)
    assert (err, pid2, epoch2) == (Errors.NO_ERROR, pid, epoch + 2)
    p = b.catalog.state.partition("out", 0)
    assert (p.high_watermark, p.last_stable_offset) == (3, 3)
    assert b.delete_records([("out", 0, -1)])[0][:2] == (Errors.NO_ERROR, 3)
    simulate_crash(b)
    b = open_broker(storage, lease_force=True)
    try:
        e = entry(b, "out", 0, pid)
        assert (e.producer_epoch, e.current_txn_first_offset) == (epoch + 1, None)
        zombie = b.produce([ProduceBatch("out", 0, payload(1), pid, epoch, 2, is_transactional=True)])[0]
        assert zombie.error == Errors.INVALID_PRODUCER_EPOCH
        assert b.catalog.state.partition("out", 0).high_watermark == 3
    finally:
        b.close()


def test_zombie_whose_state_expired_cannot_write_into_a_closed_transaction(broker):
    broker.create_topics([("out", 1, {})])
    c = broker.transaction_coordinator()
    _, pid, epoch = c.handle_init_producer_id("z", 60_000)
    c.handle_add_partitions_to_txn("z", pid, epoch, [("out", 0)])
    broker.produce([ProduceBatch("out", 0, payload(2), pid, epoch, 0, is_transactional=True)])
    assert c.handle_end_txn("z", pid, epoch, True) == Errors.NO_ERROR
    assert c.state.get_transaction_state("z").transaction_metadata.state is TransactionState.COMPLETE_COMMIT
    assert broker.remove_expired_producers(now=10 * DAY_MS + 10**13) == {("out", 0): [pid]}
    # same producer id and epoch, no state left on the partition: the coordinator is asked (KIP-890)
    late = broker.produce([ProduceBatch("out", 0, payload(1, 2), pid, epoch, 2, is_transactional=True)])[0]
    assert late.error == Errors.INVALID_TXN_STATE
    p = broker.catalog.state.partition("out", 0)
    assert (p.high_watermark, p.last_stable_offset) == (3, 3)
    # the same instance's next transaction is verified and accepted at any sequence
    c.handle_add_partitions_to_txn("z", pid, epoch, [("out", 0)])
    assert produced(broker, ProduceBatch("out", 0, payload(1, 3), pid, epoch, 4, is_transactional=True)) == [
        (Errors.NO_ERROR, 3, False)]


def test_delete_records_past_an_open_transaction_moves_the_lso_to_the_log_start(broker):
    broker.create_topics([("out", 1, {})])
    c = broker.transaction_coordinator()
    _, pid, epoch = c.handle_init_producer_id("x", 60_000)
    broker.produce([ProduceBatch("out", 0, payload(3))])
    c.handle_add_partitions_to_txn("x", pid, epoch, [("out", 0)])
    broker.produce([ProduceBatch("out", 0, payload(2, 3), pid, epoch, 0, is_transactional=True)])
    broker.produce([ProduceBatch("out", 0, payload(1, 5))])
    def offsets():
        p = broker.catalog.state.partition("out", 0)
        return p.log_start_offset, p.high_watermark, p.last_stable_offset

    assert offsets() == (0, 6, 3)
    assert broker.delete_records([("out", 0, 4)])[0][:2] == (Errors.NO_ERROR, 4)
    assert offsets() == (4, 6, 4)                  # Kafka clamps the first unstable offset to the log start
    broker.produce([ProduceBatch("out", 0, payload(1, 6))])
    assert offsets() == (4, 7, 4)                  # still open, still at the log start
    assert c.handle_end_txn("x", pid, epoch, True) == Errors.NO_ERROR
    assert offsets() == (4, 8, 8)
    records = broker.fetch("out", 0, 4, isolation_level="read_committed").records
    assert records.column("offset").to_pylist() == [4, 5, 6, 7]


# ---- through the public clients -----------------------------------------------------------------

def test_live_producers_continue_after_admin_delete_records(storage, close_engines):
    """Idempotent and transactional producers keep writing while DeleteRecords drops every
    segment under them: no UNKNOWN_PRODUCER_ID, no duplicate, nothing lost."""
    conf = client_conf(storage, {"storage.flush.linger.ms": 1})
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("t", 2)])["t"].result()
    reports = []
    idem = Producer({**conf, "enable.idempotence": True})
    txn = Producer({**conf, "transactional.id": "tx"})
    txn.init_transactions(10)

    def write(round_):
        for i in range(3):
            idem.produce("t", value=f"i{round_}.{i}", partition=0, on_delivery=lambda e, m: reports.append(e))
        assert idem.flush(10) == 0
        txn.begin_transaction()
        for i in range(3):
            txn.produce("t", value=f"x{round_}.{i}", partition=1, on_delivery=lambda e, m: reports.append(e))
        txn.commit_transaction(10)

    write(1)
    futures = admin.delete_records([TopicPartition("t", 0, OFFSET_END), TopicPartition("t", 1, OFFSET_END)])
    assert {(tp.partition, f.result().low_watermark) for tp, f in futures.items()} == {(0, 3), (1, 4)}
    assert [admin.describe_producers([TopicPartition("t", p)])[TopicPartition("t", p)].result().active_producers[0]
            .last_sequence for p in (0, 1)] == [2, 2]                          # the state outlived its segments
    write(2)
    assert reports == [None] * 12
    consumer = Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("t", 0, 0), TopicPartition("t", 1, 0)])   # below the log start: reset
    got = consume_all(consumer, 6)
    assert sorted((m.partition(), m.offset(), m.value()) for m in got) == [
        (0, 3, b"i2.0"), (0, 4, b"i2.1"), (0, 5, b"i2.2"), (1, 4, b"x2.0"), (1, 5, b"x2.1"), (1, 6, b"x2.2")]
    bad = admin.delete_records([TopicPartition("t", 0, 99), TopicPartition("nope", 0, 0), TopicPartition("t", 1)])
    assert [f.exception().args[0].code() for f in bad.values()] == [
        KafkaError.OFFSET_OUT_OF_RANGE, KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.OFFSET_OUT_OF_RANGE]
    consumer.close()
