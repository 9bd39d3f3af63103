"""Transactions end to end (KIP-98): the transactional producer's state machine, the
transaction coordinator's answers in each state, fencing, timeouts, and recovery."""

import threading
import time
from concurrent.futures import Future

import pyarrow as pa
import pytest

from helpers import TXN_CONF, read_values, simulate_crash, transactional_conf  # noqa: F401 (fixture conf)
from txlake import AdminClient, Consumer, KafkaError, KafkaException, NewTopic, Producer, TopicPartition
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.engine.errors import ApiError, Errors
from txlake.engine.transaction_metadata import TransactionState
from txlake.formats.records import PAYLOAD_SCHEMA



def read(conf, isolation="read_committed", topic="out", partitions=2):
    return read_values(conf, topic, range(partitions), isolation)


def code(excinfo):
    return excinfo.value.args[0].code()


def test_client_state_machine(conf):
    p = Producer({**conf, "transactional.id": "t1"})
    for call in (p.begin_transaction, p.commit_transaction, p.abort_transaction, lambda: p.produce("out", b"x")):
        with pytest.raises(KafkaException) as exc:
            call()
        assert code(exc) == KafkaError._STATE
    p.init_transactions(10)
    with pytest.raises(KafkaException) as again:
        p.init_transactions(10)
    assert code(again) == KafkaError._STATE
    with pytest.raises(KafkaException) as outside:
        p.produce("out", b"x")
    assert code(outside) == KafkaError._STATE
    p.begin_transaction()
    with pytest.raises(KafkaException) as twice:
        p.begin_transaction()
    assert code(twice) == KafkaError._STATE
    p.commit_transaction(10)        # an empty transaction commits
    plain = Producer(conf)
    with pytest.raises(KafkaException) as not_configured:
        plain.init_transactions(1)
    assert code(not_configured) == KafkaError._NOT_CONFIGURED


def test_commit_makes_the_tail_and_the_end_txn_records_durable_in_one_catalog_commit(storage):
    """commit_transaction hands its last records over without urgency, and EndTxn queues
    PrepareCommit and the markers without urgency and CompleteCommit urgently: once the
    transaction's partitions are durably added, its tail and the three control writes commit
    in ONE catalog commit. A transaction whose partitions are added only by commit_transaction
    (the client's 60 s linger held its batches) takes two: AddPartitionsToTxn is answered once
    its Ongoing record is committed, then the tail and the control writes. With a 60 s engine
    linger, anything left behind non-urgent would make the commit time out instead."""
    conf = {**storage.conf(), **TXN_CONF, "storage.flush.linger.ms": 60_000}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("out", 2)])["out"].result()
    p = Producer({**conf, "transactional.id": "one-commit", "linger.ms": 60_000})
    p.init_transactions(10)
    catalog = p._broker.catalog
    for txn in range(2):
        p.begin_transaction()
        p.produce("out", value=f"{txn}-0", partition=0)
        p.produce("out", value=f"{txn}-1", partition=1)
        if txn == 0:
            p.flush(10)  # the records and the partitions' Ongoing record are durable
        for i in range(2, 6):
            p.produce("out", value=f"{txn}-{i}", partition=i % 2)
        before = catalog.version
        p.commit_transaction(10)
        assert catalog.version == before + (1 if txn == 0 else 2)
    # offsets 3 and 7 of each partition are the COMMIT markers
    assert read(conf) == [(part, offset, f"{txn}-{2 * i + part}") for part in (0, 1)
                          for txn, base in ((0, 0), (1, 4)) for i, offset in enumerate(range(base, base + 3))]
    md = p._broker.transaction_coordinator().state.get_transaction_state("one-commit").transaction_metadata
    assert md.state is TransactionState.COMPLETE_COMMIT
    p.close()


def test_commit_abort_and_visibility(conf):
    p = Producer({**conf, "transactional.id": "t1"})
    p.init_transactions(10)
    p.begin_transaction()
    for i in range(4):
        p.produce("out", value=f"c{i}", partition=i % 2)
    p.commit_transaction(10)
    p.begin_transaction()
    for i in range(4):
        p.produce("out", value=f"a{i}", partition=i % 2)
    p.abort_transaction(10)
    p.begin_transaction()
    p.produce("out", value="open", partition=0)
    p.flush(10)
    # partition 0: c0 c2 COMMIT(2) a0 a2 ABORT(5) open; partition 1: c1 c3 COMMIT a1 a3 ABORT
    assert read(conf) == [(0, 0, "c0"), (0, 1, "c2"), (1, 0, "c1"), (1, 1, "c3")]
    assert read(conf, "read_uncommitted") == [(0, 0, "c0"), (0, 1, "c2"), (0, 3, "a0"), (0, 4, "a2"), (0, 6, "open"),
                                              (1, 0, "c1"), (1, 1, "c3"), (1, 3, "a1"), (1, 4, "a3")]
    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    assert c.get_watermark_offsets(TopicPartition("out", 0)) == (0, 6)       # the LSO: "open" is undecided
    c.close()
    p.commit_transaction(10)
    assert (0, 6, "open") in read(conf)


def test_produce_arrow_inside_a_transaction(conf):
    import pyarrow as pa

    p = Producer({**conf, "transactional.id": "bulk"})
    table = pa.table({"value": [f"b{i}" for i in range(6)], "partition": [0, 1, 0, 1, 0, 1]})
    p.init_transactions(10)
    with pytest.raises(KafkaException) as outside:
        p.produce_arrow("out", table, key=None, partition="partition")
    assert code(outside) == KafkaError._STATE
    p.begin_transaction()
    assert p.produce_arrow("out", table, key=None, partition="partition").offsets == {0: (0, 2), 1: (0, 2)}
    assert read(conf) == []                          # undecided: above the LSO
    p.commit_transaction(10)
    p.begin_transaction()
    p.produce_arrow("out", table, key=None, partition="partition")   # offsets 4..6 after COMMIT at 3
    p.abort_transaction(10)
    assert read(conf) == [(0, 0, "b0"), (0, 1, "b2"), (0, 2, "b4"), (1, 0, "b1"), (1, 1, "b3"), (1, 2, "b5")]
    assert len(read(conf, "read_uncommitted")) == 12
    p.close()


def test_second_instance_fences_the_first(conf):
    p1 = Producer({**conf, "transactional.id": "t1"})
    p1.init_transactions(10)
    p1.begin_transaction()
    p1.produce("out", value="zombie-open", partition=0)
    p1.flush(10)
    p2 = Producer({**conf, "transactional.id": "t1"})
    p2.init_transactions(10)          # aborts p1's open transaction with a bumped epoch
    assert read(conf, "read_committed") == []
    with pytest.raises(KafkaException) as fenced:
        p1.produce("out", value="late", partition=1)   # AddPartitionsToTxn with the old epoch
        p1.commit_transaction(10)
    assert fenced.value.args[0].fatal() and code(fenced) == KafkaError.PRODUCER_FENCED
    with pytest.raises(KafkaException) as still:
        p1.begin_transaction()
    assert still.value.args[0].fatal()
    p2.begin_transaction()
    p2.produce("out", value="new", partition=0)
    p2.commit_transaction(10)
    assert [v for _, _, v in read(conf)] == ["new"]


def rows(*values):
    n = len(values)
    return pa.Table.from_pydict({"timestamp": [1] * n, "key": [None] * n, "value": [v.encode() for v in values],
                                 "headers": [None] * n}, schema=PAYLOAD_SCHEMA)


@pytest.fixture
def broker(storage):
    b = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, lease_ms=60_000, transaction=dict(TXN_CONF)))
    b.create_topics([("out", 2, {})])
    yield b
    b.close()


def test_coordinator_answers_in_each_state(broker):
    c = broker.transaction_coordinator()
    assert c.handle_init_producer_id("", 1000)[0] == Errors.INVALID_REQUEST
    assert c.handle_init_producer_id("x", 0)[0] == Errors.INVALID_TRANSACTION_TIMEOUT
    assert c.handle_init_producer_id("x", 900_001)[0] == Errors.INVALID_TRANSACTION_TIMEOUT
    assert c.handle_end_txn("unknown", 1, 0, True) == Errors.INVALID_PRODUCER_ID_MAPPING
    err, pid, epoch = c.handle_init_producer_id("x", 60_000)
    assert (err, epoch) == (Errors.NO_ERROR, 0)
    def state():
        return c.state.get_transaction_state("x").transaction_metadata.state
    assert state() is TransactionState.EMPTY
    assert c.handle_end_txn("x", pid, epoch, True) == Errors.INVALID_TXN_STATE          # nothing to end
    assert c.handle_end_txn("x", pid, epoch, False) == Errors.INVALID_TXN_STATE         # nor to abort (TV1)
    assert c.handle_add_partitions_to_txn("x", pid + 1, epoch, [("out", 0)])[("out", 0)] == Errors.INVALID_PRODUCER_ID_MAPPING
    assert c.handle_add_partitions_to_txn("x", pid, epoch + 1, [("out", 0)])[("out", 0)] == Errors.PRODUCER_FENCED
    assert c.handle_add_partitions_to_txn("x", pid, epoch, [("out", 0)])[("out", 0)] == Errors.NO_ERROR
    assert state() is TransactionState.ONGOING
    assert c.handle_end_txn("x", pid, epoch + 1, True) == Errors.PRODUCER_FENCED
    assert c.handle_end_txn("x", pid, epoch, True) == Errors.NO_ERROR
    assert state() is TransactionState.COMPLETE_COMMIT
    assert c.handle_end_txn("x", pid, epoch, True) == Errors.NO_ERROR                   # retry after completion
    assert c.handle_end_txn("x", pid, epoch, False) == Errors.INVALID_TXN_STATE         # the opposite outcome
    assert c.handle_add_partitions_to_txn("x", pid, epoch, [("out", 1)])[("out", 1)] == Errors.NO_ERROR
    assert c.handle_end_txn("x", pid, epoch, False) == Errors.NO_ERROR
    assert state() is TransactionState.COMPLETE_ABORT
    assert c.handle_end_txn("x", pid, epoch, False) == Errors.NO_ERROR
    assert c.handle_end_txn("x", pid, epoch, True) == Errors.INVALID_TXN_STATE
    # InitProducerId while Ongoing: the old transaction is aborted under a bumped epoch
    _, pid, epoch = c.handle_init_producer_id("x", 60_000)
    c.handle_add_partitions_to_txn("x", pid, epoch, [("out", 0)])
    broker.produce([ProduceBatch("out", 0, rows("pending"), pid, epoch, 0, is_transactional=True)])
    assert c.handle_init_producer_id("x", 60_000) == (Errors.CONCURRENT_TRANSACTIONS, -1, -1)
    assert state() is TransactionState.COMPLETE_ABORT
    err, pid2, epoch2 = c.handle_init_producer_id("x", 60_000)
    assert (err, pid2, epoch2) == (Errors.NO_ERROR, pid, epoch + 2)
    p0 = broker.catalog.state.partition("out", 0)
    assert [(a.producer_id, a.first_offset) for a in p0.aborted_transactions][-1] == (pid, p0.aborted_transactions[-1].first_offset)
    assert p0.last_stable_offset == p0.high_watermark


def test_kip890_late_write_to_an_unadded_partition_is_refused(broker):
    c = broker.transaction_coordinator()
    _, pid, epoch = c.handle_init_producer_id("x", 60_000)
    c.handle_add_partitions_to_txn("x", pid, epoch, [("out", 0)])
    (late,) = broker.produce([ProduceBatch("out", 1, rows("late"), pid, epoch, 0, is_transactional=True)])
    assert late.error == Errors.INVALID_TXN_STATE
    assert c.handle_end_txn("x", pid, epoch, True) == Errors.NO_ERROR
    (after,) = broker.produce([ProduceBatch("out", 0, rows("after end"), pid, epoch, 0, is_transactional=True)])
    assert after.error == Errors.INVALID_TXN_STATE
    assert broker.catalog.state.partition("out", 1).high_watermark == 0


class HeldTxnLog:
    """Holds every ``__transaction_state`` write of a coordinator until the test releases it:
    ``append_async`` queues the record for real, but the future it returns completes only on
    :meth:`release` (with the real outcome, or ``error``)."""

    def __init__(self, monkeypatch, coordinator):
        self.real = coordinator.txn_log.append_async
        self.queued = threading.Event()
        self.held: list[tuple[Future, Future]] = []
        monkeypatch.setattr(coordinator.txn_log, "append_async", self.append_async)

    def append_async(self, partition, key, value, urgent=True):
        held: Future = Future()
        self.held.append((self.real(partition, key, value, urgent=urgent), held))
        self.queued.set()
        return held

    def release(self, error: BaseException | None = None) -> None:
        for real, held in self.held:
            if error is None:
                held.set_result(real.result(10))
            else:
                held.set_exception(error)


@pytest.mark.parametrize("request_name", ["AddPartitionsToTxn", "AddOffsetsToTxn"])
@pytest.mark.parametrize("written", [True, False], ids=["written", "write-failed"])
def test_add_partitions_is_answered_only_once_its_ongoing_record_is_written(broker, monkeypatch, request_name, written):
    """Kafka's ``handleAddPartitionsToTransaction`` answers from ``appendTransactionToLog``'s
    callback, once the Ongoing record is replicated: while the record's write is held the request
    does not return, the transition stays pending and the KIP-890 verification refuses the
    partition; once it is written the answer is NO_ERROR, the state Ongoing with the partition.
    A failed write (the writer lost its lease) is answered NOT_COORDINATOR with nothing added,
    never NO_ERROR (issue 18: before, both answered NO_ERROR at once)."""
    c = broker.transaction_coordinator()
    _, pid, epoch = c.handle_init_producer_id("x", 60_000)
    md = c.state.get_transaction_state("x").transaction_metadata
    tp = ("out", 1) if request_name == "AddPartitionsToTxn" else ("__consumer_offsets", c._group_partition_for("g"))
    held = HeldTxnLog(monkeypatch, c)
    answers: list = []
    call = ((lambda: c.handle_add_partitions_to_txn("x", pid, epoch, [tp])[tp]) if request_name == "AddPartitionsToTxn"
            else (lambda: c.handle_add_offsets_to_txn("x", pid, epoch, "g")))
    request = threading.Thread(target=lambda: answers.append(call()))
    request.start()
    assert held.queued.wait(10)
    request.join(0.5)   # the write is held: the request must still be waiting for it
    assert (request.is_alive(), answers, md.state, md.pending_state, c.verify_partition(pid, epoch, *tp)) == (
        True, [], TransactionState.EMPTY, TransactionState.ONGOING, Errors.INVALID_TXN_STATE)
    held.release(None if written else ApiError(Errors.NOT_LEADER_OR_FOLLOWER, "the writer lease was lost"))
    request.join(10)
    if written:
        assert (answers, md.state, md.pending_state, md.topic_partitions, c.verify_partition(pid, epoch, *tp)) == (
            [Errors.NO_ERROR], TransactionState.ONGOING, None, {tp}, Errors.NO_ERROR)
    else:
        assert (answers, md.state, md.pending_state, md.topic_partitions, c.verify_partition(pid, epoch, *tp)) == (
            [Errors.NOT_COORDINATOR], TransactionState.EMPTY, None, set(), Errors.INVALID_TXN_STATE)


def test_timed_out_transaction_is_aborted_and_its_producer_fenced(conf):
    p = Producer({**conf, "transactional.id": "slow", "transaction.timeout.ms": 1000})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("out", value="too slow", partition=0)
    p.flush(10)
    coordinator = p._broker.transaction_coordinator()
    assert coordinator.abort_timed_out_transactions(now=int(time.time() * 1000) + 2_000) == ["slow"]
    assert read(conf, "read_committed") == []
    with pytest.raises(KafkaException) as fenced:
        p.commit_transaction(10)
    assert fenced.value.args[0].fatal() and code(fenced) == KafkaError.PRODUCER_FENCED


def test_end_txn_with_a_refused_marker_does_not_wait_for_the_linger(storage):
    """A marker refused when queued (its topic was deleted) leaves no urgent Complete record
    behind the non-urgent PrepareCommit: EndTxn asks the writer to flush at once, then writes
    the markers again, dropping the deleted partition (Kafka does the same). With a 60 s linger,
    waiting for it would outlast the 20 s this test allows."""
    b = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=60_000, lease_ms=60_000, transaction=dict(TXN_CONF)))
    try:
        b.create_topics([("out", 1, {}), ("gone", 1, {})])
        c = b.transaction_coordinator()
        _, pid, epoch = c.handle_init_producer_id("x", 60_000)
        assert set(c.handle_add_partitions_to_txn("x", pid, epoch, [("out", 0), ("gone", 0)]).values()) == {Errors.NO_ERROR}
        results = b.produce([ProduceBatch("out", 0, rows("a"), pid, epoch, 0, is_transactional=True, urgent=True),
                             ProduceBatch("gone", 0, rows("b"), pid, epoch, 0, is_transactional=True, urgent=True)])
        assert [r.error for r in results] == [Errors.NO_ERROR, Errors.NO_ERROR]
        assert b.delete_topics(["gone"])[0][0] == Errors.NO_ERROR
        answer = []
        worker = threading.Thread(target=lambda: answer.append(c.handle_end_txn("x", pid, epoch, True)), daemon=True)
        worker.start()
        worker.join(20)
        assert answer == [Errors.NO_ERROR]
        md = c.state.get_transaction_state("x").transaction_metadata
        assert md.state is TransactionState.COMPLETE_COMMIT and md.topic_partitions == set()
        part = b.catalog.state.partition("out", 0)
        assert (part.high_watermark, part.last_stable_offset) == (2, 2)  # the record, then its COMMIT marker
    finally:
        b.close()


@pytest.mark.parametrize("crash_after", ["prepare", "some_markers"])
def test_restart_completes_a_half_done_commit(storage, crash_after, monkeypatch):
    cfg = dict(flush_linger_ms=1, lease_ms=60_000, transaction=dict(TXN_CONF))
    b = Broker(storage.object_store(), BrokerConfig(**cfg))
    b.create_topics([("out", 2, {})])
    c = b.transaction_coordinator()
    _, pid, epoch = c.handle_init_producer_id("x", 60_000)
    c.handle_add_partitions_to_txn("x", pid, epoch, [("out", 0), ("out", 1)])
    b.produce([ProduceBatch("out", 0, rows("a"), pid, epoch, 0, is_transactional=True),
               ProduceBatch("out", 1, rows("b"), pid, epoch, 0, is_transactional=True)])
    real = b.append_txn_markers

    def crash(markers, *args, **kwargs):
        b.flush()  # PrepareCommit is only queued when the markers are appended; a real crash point is after it commits
        if crash_after == "some_markers":
            m = markers[0]
            b.await_txn_markers(real([type(m)(m.producer_id, m.producer_epoch, m.coordinator_epoch, m.committed,
                                              m.partitions[:1])]))
        raise RuntimeError("simulated crash after PrepareCommit")

    monkeypatch.setattr(b, "append_txn_markers", crash)
    with pytest.raises(RuntimeError):
        c.handle_end_txn("x", pid, epoch, True)
    simulate_crash(b)
    b2 = Broker(storage.object_store(), BrokerConfig(**cfg, lease_force=True))
    try:
        c2 = b2.transaction_coordinator()
        md = c2.state.get_transaction_state("x").transaction_metadata
        assert md.state is TransactionState.COMPLETE_COMMIT
        for partition in (0, 1):
            p = b2.catalog.state.partition("out", partition)
            assert p.last_stable_offset == p.high_watermark and p.aborted_transactions == []
        values = []
        for partition in (0, 1):
            fetched = b2.fetch("out", partition, 0, isolation_level="read_committed").records
            values += [v for v, ctl in zip(fetched.column("value").to_pylist(), fetched.column("is_control").to_pylist())
                       if not ctl]
        assert sorted(values) == [b"a", b"b"]
    finally:
        b2.close()


# ---- transactional offset commits (send_offsets_to_transaction) ---------------------------

def test_send_offsets_to_transaction_commit_abort_unstable_and_log_order(conf):
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("in", 1)])["in"].result()
    tp = TopicPartition("in", 0)
    reader = Consumer({**conf, "group.id": "g"})                        # read_committed: require_stable
    peek = Consumer({**conf, "group.id": "g", "isolation.level": "read_uncommitted"})
    plain = Consumer({**conf, "group.id": "g"})
    t = Producer({**conf, "transactional.id": "copier"})
    t.init_transactions(10)
    assert reader.committed([tp])[0].offset == -1001
    t.begin_transaction()
    t.send_offsets_to_transaction([TopicPartition("in", 0, 5, "m5")], "g")
    assert peek.committed([tp])[0].offset == -1001                      # pending: invisible until the marker
    with pytest.raises(KafkaException) as unstable:
        reader.committed([tp], timeout=0.3)                             # UNSTABLE_OFFSET_COMMIT, retried
    assert code(unstable) == KafkaError._TIMED_OUT
    t.commit_transaction(10)
    (got,) = reader.committed([tp])
    assert (got.offset, got.metadata) == (5, "m5")
    t.begin_transaction()
    t.send_offsets_to_transaction([TopicPartition("in", 0, 9)], "g")
    t.abort_transaction(10)
    assert reader.committed([tp])[0].offset == 5                        # dropped on ABORT
    # log order wins: a plain commit written after the transactional one, before its marker
    t.begin_transaction()
    t.send_offsets_to_transaction([TopicPartition("in", 0, 20)], "g")
    plain.commit(offsets=[TopicPartition("in", 0, 30)], asynchronous=False)
    t.commit_transaction(10)
    assert reader.committed([tp])[0].offset == 30
    # and a consumer of the group resumes from it
    resumed = Consumer({**conf, "group.id": "g"})
    assert resumed.committed([tp])[0].offset == 30
    for c in (reader, peek, plain, resumed):
        c.close()


def test_send_offsets_needs_a_transaction(conf):
    t = Producer({**conf, "transactional.id": "x"})
    t.init_transactions(10)
    with pytest.raises(KafkaException) as exc:
        t.send_offsets_to_transaction([TopicPartition("out", 0, 1)], "g")
    assert code(exc) == KafkaError._STATE
