"""KIP-360, the producer-id lifecycle: safe epoch bumps end to end.

The coordinator side (InitProducerId naming the current producer id and epoch, its retry
answered with the same bumped epoch, producer-id rotation at epoch exhaustion, all across a
coordinator restart) and the client side: a transactional producer whose transaction
failed -- a refused batch, a delivery timeout, an expired transactional id -- aborts,
bumps its epoch and goes on; a newer instance during the bump fences it; an idempotent
producer bumps its epoch locally after a sequence error. Every test checks exact producer
ids, epochs, sequences and offsets in the log, and the exact records a read_committed
consumer gets.

Where the engine cannot produce an answer by itself (it never answers UNKNOWN_PRODUCER_ID,
nor fails a batch with TRANSACTION_ABORTABLE), :func:`refuse_next` makes the broker refuse
one batch with it -- exactly what a Kafka broker's answer would look like to the client.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pyarrow as pa
import pytest

from helpers import TXN_CONF, hang_data_puts, read_values, transactional_conf  # noqa: F401 (fixture conf)
from txlake import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch, ProduceResult
from txlake.engine.errors import Errors
from txlake.engine.transaction_metadata import ProducerIdAndEpoch, TransactionState
from txlake.formats.records import PAYLOAD_SCHEMA

BROKER_CFG = dict(flush_linger_ms=1, lease_ms=60_000, transaction=dict(TXN_CONF))
T = 60_000  # transaction.timeout.ms of the coordinator-level requests


@pytest.fixture
def broker(storage):
    """A broker of its own (restartable): ``opened[-1]`` is the live one."""
    opened = [Broker(storage.object_store(), BrokerConfig(**BROKER_CFG))]
    opened[0].create_topics([("out", 2, {})])
    yield opened
    opened[-1].close()


def restart(storage, opened: list) -> Broker:
    """Close the broker (its coordinator with it) and open a new one on the same storage; its
    coordinator loads ``__transaction_state`` again."""
    opened[-1].close()
    opened.append(Broker(storage.object_store(), BrokerConfig(**BROKER_CFG, lease_force=True)))
    return opened[-1]


def rows(*values: str) -> pa.Table:
    n = len(values)
    return pa.Table.from_pydict({"timestamp": [1] * n, "key": [None] * n, "value": [v.encode() for v in values],
                                 "headers": [None] * n}, schema=PAYLOAD_SCHEMA)


def committed(conf, partitions=(0, 1), topic="out") -> list[tuple[int, int, str]]:
    """``(partition, offset, value)`` of every record a read_committed consumer gets, sorted."""
    return read_values(conf, topic, partitions)


def log(broker: Broker, partition: int, topic: str = "out") -> list[tuple]:
    """Every row of the partition's log, control records included:
    ``(offset, value or "COMMIT"/"ABORT", producer id, producer epoch, base sequence)``."""
    table = broker.fetch(topic, partition, 0, isolation_level="read_uncommitted").records
    out = []
    for r in table.to_pylist():
        what = ("ABORT", "COMMIT")[r["control_type"]] if r["is_control"] else r["value"].decode()
        out.append((r["offset"], what, r["producer_id"], r["producer_epoch"], r["base_sequence"]))
    return out


def metadata(coordinator, transactional_id: str):
    return coordinator.state.get_transaction_state(transactional_id).transaction_metadata


def identity(md) -> tuple:
    return md.producer_id, md.producer_epoch, md.last_producer_epoch, md.state


def refuse_next(monkeypatch, broker: Broker, tp: tuple[str, int], error: Errors, times: int = 1) -> list:
    """Make the broker refuse the next ``times`` batches to ``tp`` with ``error``, appending nothing
    (``times=-1``: every one). Returns the refused batches' ``(producer id, epoch, base sequence)``."""
    real = broker.produce_async
    refused: list = []

    def produce_async(batches, internal_topics_allowed=False):
        out = []
        for b in batches:
            if (b.topic, b.partition) == tp and (times < 0 or len(refused) < times):
                refused.append((b.producer_id, b.producer_epoch, b.base_sequence))
                f: Future = Future()
                f.set_result(ProduceResult(error, message=f"{error.name} (refused by the test)"))
                out.append(f)
            else:
                out.extend(real([b], internal_topics_allowed))
        return out

    monkeypatch.setattr(broker, "produce_async", produce_async)
    return refused


def raised(call) -> KafkaError:
    with pytest.raises(KafkaException) as exc:
        call()
    return exc.value.args[0]


def kind(err: KafkaError) -> tuple:
    return err.code(), err.txn_requires_abort(), err.fatal()


# ---- the coordinator: InitProducerId with an expected producer id and epoch ---------------------

@pytest.mark.parametrize("restarted", [False, True], ids=["same-coordinator", "after-restart"])
def test_bump_with_expected_epoch_and_its_retry(storage, broker, restarted):
    b = broker[-1]
    c = b.transaction_coordinator()
    err, pid, epoch = c.handle_init_producer_id("k", T)
    assert (err, epoch) == (Errors.NO_ERROR, 0)
    assert c.handle_add_partitions_to_txn("k", pid, 0, [("out", 0)])[("out", 0)] == Errors.NO_ERROR
    (res,) = b.produce([ProduceBatch("out", 0, rows("a"), pid, 0, 0, is_transactional=True)])
    assert (res.error, res.base_offset) == (Errors.NO_ERROR, 0)
    assert c.handle_end_txn("k", pid, 0, True) == Errors.NO_ERROR
    # the bump: the next epoch of the same producer id, the old one kept as last epoch
    assert c.handle_init_producer_id("k", T, ProducerIdAndEpoch(pid, 0)) == (Errors.NO_ERROR, pid, 1)
    assert identity(metadata(c, "k")) == (pid, 1, 0, TransactionState.EMPTY)
    if restarted:
        b = restart(storage, broker)
        c = b.transaction_coordinator()
        assert identity(metadata(c, "k")) == (pid, 1, 0, TransactionState.EMPTY)
    # its retry (the answer was lost): the same epoch, no second bump
    assert c.handle_init_producer_id("k", T, ProducerIdAndEpoch(pid, 0)) == (Errors.NO_ERROR, pid, 1)
    assert c.handle_init_producer_id("k", T, ProducerIdAndEpoch(pid, 0)) == (Errors.NO_ERROR, pid, 1)
    assert identity(metadata(c, "k")) == (pid, 1, 0, TransactionState.EMPTY)
    # neither a stale epoch nor another producer id may bump
    assert c.handle_init_producer_id("k", T, ProducerIdAndEpoch(pid, 5)) == (Errors.PRODUCER_FENCED, -1, -1)
    assert c.handle_init_producer_id("k", T, ProducerIdAndEpoch(pid + 1, 1)) == (Errors.PRODUCER_FENCED, -1, -1)
    assert c.handle_add_partitions_to_txn("k", pid, 0, [("out", 0)])[("out", 0)] == Errors.PRODUCER_FENCED
    # the bumped producer writes from sequence 0 under epoch 1
    assert c.handle_add_partitions_to_txn("k", pid, 1, [("out", 0)])[("out", 0)] == Errors.NO_ERROR
    (res,) = b.produce([ProduceBatch("out", 0, rows("b"), pid, 1, 0, is_transactional=True)])
    assert (res.error, res.base_offset) == (Errors.NO_ERROR, 2)
    assert c.handle_end_txn("k", pid, 1, True) == Errors.NO_ERROR
    # a bump from the current epoch clears nothing of the past: epoch 2, last epoch 1
    assert c.handle_init_producer_id("k", T, ProducerIdAndEpoch(pid, 1)) == (Errors.NO_ERROR, pid, 2)
    assert identity(metadata(c, "k")) == (pid, 2, 1, TransactionState.EMPTY)
    assert log(b, 0) == [(0, "a", pid, 0, 0), (1, "COMMIT", pid, 0, -1), (2, "b", pid, 1, 0), (3, "COMMIT", pid, 1, -1)]


@pytest.mark.parametrize("restarted", [False, True], ids=["same-coordinator", "after-restart"])
def test_epoch_exhaustion_rotates_the_producer_id_and_its_retry_gets_the_same_id(storage, broker, restarted):
    b = broker[-1]
    c = b.transaction_coordinator()
    _, pid, _ = c.handle_init_producer_id("x", T)
    md = metadata(c, "x")
    with md.lock:  # fast-forward in memory (32 764 real bumps would take minutes); every bump below is real
        md.producer_epoch = 32764
    assert c.handle_init_producer_id("x", T, ProducerIdAndEpoch(pid, 32764)) == (Errors.NO_ERROR, pid, 32765)
    # 32765 is not exhausted: one more bump of the same producer id
    assert c.handle_init_producer_id("x", T, ProducerIdAndEpoch(pid, 32765)) == (Errors.NO_ERROR, pid, 32766)
    # 32766 (Short.MAX_VALUE - 1) is exhausted: a new producer id at epoch 0, the old epoch kept
    err, new_pid, epoch = c.handle_init_producer_id("x", T, ProducerIdAndEpoch(pid, 32766))
    assert (err, epoch) == (Errors.NO_ERROR, 0) and new_pid != pid
    md = metadata(c, "x")
    assert (md.producer_id, md.previous_producer_id, md.producer_epoch, md.last_producer_epoch) == (new_pid, pid, 0, 32766)
    if restarted:
        b = restart(storage, broker)
        c = b.transaction_coordinator()
        md = metadata(c, "x")
        assert (md.producer_id, md.previous_producer_id, md.producer_epoch, md.last_producer_epoch) == \
            (new_pid, pid, 0, 32766)
    # the retry of the rotation (the answer was lost): the same new producer id and epoch
    assert c.handle_init_producer_id("x", T, ProducerIdAndEpoch(pid, 32766)) == (Errors.NO_ERROR, new_pid, 0)
    assert identity(metadata(c, "x")) == (new_pid, 0, 32766, TransactionState.EMPTY)
    # the old producer id at another epoch is a zombie
    assert c.handle_init_producer_id("x", T, ProducerIdAndEpoch(pid, 32765)) == (Errors.PRODUCER_FENCED, -1, -1)
    # the new producer id goes on
    assert c.handle_init_producer_id("x", T, ProducerIdAndEpoch(new_pid, 0)) == (Errors.NO_ERROR, new_pid, 1)
    assert c.handle_add_partitions_to_txn("x", new_pid, 1, [("out", 1)])[("out", 1)] == Errors.NO_ERROR
    (res,) = b.produce([ProduceBatch("out", 1, rows("n"), new_pid, 1, 0, is_transactional=True)])
    assert c.handle_end_txn("x", new_pid, 1, True) == Errors.NO_ERROR
    assert log(b, 1) == [(0, "n", new_pid, 1, 0), (1, "COMMIT", new_pid, 1, -1)]


def test_fencing_an_open_transaction_at_epoch_32766_aborts_it_under_32767_then_rotates(broker):
    b = broker[-1]
    c = b.transaction_coordinator()
    _, pid, _ = c.handle_init_producer_id("x", T)
    md = metadata(c, "x")
    with md.lock:  # fast-forward in memory, as above
        md.producer_epoch = 32766
    assert c.handle_add_partitions_to_txn("x", pid, 32766, [("out", 0)])[("out", 0)] == Errors.NO_ERROR
    b.produce([ProduceBatch("out", 0, rows("open"), pid, 32766, 0, is_transactional=True)])
    # a new instance: the open transaction is aborted under the last epoch, 32767 (Short.MAX_VALUE) ...
    assert c.handle_init_producer_id("x", T) == (Errors.CONCURRENT_TRANSACTIONS, -1, -1)
    assert identity(metadata(c, "x")) == (pid, 32767, -1, TransactionState.COMPLETE_ABORT)
    # ... and its retry gets a new producer id: 32767 is never handed out
    err, new_pid, epoch = c.handle_init_producer_id("x", T)
    assert (err, epoch) == (Errors.NO_ERROR, 0) and new_pid != pid
    assert identity(metadata(c, "x")) == (new_pid, 0, -1, TransactionState.EMPTY)
    assert log(b, 0) == [(0, "open", pid, 32766, 0), (1, "ABORT", pid, 32767, -1)]


# ---- the transactional producer: abortable errors, abort, bump, go on ------------------------------

@pytest.mark.parametrize("error", [Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, Errors.UNKNOWN_PRODUCER_ID,
                                   Errors.TRANSACTION_ABORTABLE, Errors.INVALID_PRODUCER_EPOCH])
def test_failed_batch_makes_the_transaction_abortable_and_the_abort_bumps_the_epoch(conf, monkeypatch, error):
    p = Producer({**conf, "transactional.id": "t"})
    p.init_transactions(10)
    pid = p._txn.producer_id
    p.begin_transaction()
    p.produce("out", value="a0", partition=0)
    p.produce("out", value="a1", partition=1)
    p.commit_transaction(10)
    reports = []
    p.begin_transaction()
    p.produce("out", value="b1", partition=1, on_delivery=lambda e, m: reports.append((m.value(), e and e.code())))
    assert p.flush(10) == 0
    refused = refuse_next(monkeypatch, p._broker, ("out", 0), error)
    p.produce("out", value="b0", partition=0, on_delivery=lambda e, m: reports.append((m.value(), e and e.code())))
    assert p.flush(10) == 0
    assert refused == [(pid, 0, 1)]
    assert reports == [(b"b1", None), (b"b0", error)]
    # only abort_transaction is allowed now; every call says so
    assert kind(raised(lambda: p.produce("out", value="more", partition=1))) == (error, True, False)
    assert kind(raised(lambda: p.commit_transaction(10))) == (error, True, False)
    assert p._txn.epoch_bump_required
    p.abort_transaction(10)
    assert (p._txn.producer_id, p._txn.epoch, p._txn.epoch_bump_required) == (pid, 1, False)
    p.begin_transaction()
    p.produce("out", value="c0", partition=0)
    p.produce("out", value="c1", partition=1)
    p.commit_transaction(10)
    assert committed(conf) == [(0, 0, "a0"), (0, 3, "c0"), (1, 0, "a1"), (1, 4, "c1")]
    # b0 was never written; every partition's sequence restarted at 0 under epoch 1
    assert log(p._broker, 0) == [(0, "a0", pid, 0, 0), (1, "COMMIT", pid, 0, -1), (2, "ABORT", pid, 0, -1),
                                 (3, "c0", pid, 1, 0), (4, "COMMIT", pid, 1, -1)]
    assert log(p._broker, 1) == [(0, "a1", pid, 0, 0), (1, "COMMIT", pid, 0, -1), (2, "b1", pid, 0, 1),
                                 (3, "ABORT", pid, 0, -1), (4, "c1", pid, 1, 0), (5, "COMMIT", pid, 1, -1)]
    md = metadata(p._broker.transaction_coordinator(), "t")
    assert identity(md) == (pid, 1, 0, TransactionState.COMPLETE_COMMIT)
    p.close()


def test_delivery_timeout_in_a_transaction(conf, monkeypatch):
    """The engine's uploads hang once the transaction's partition is added (every PUT of a data
    object waits for ``gate``, as a stuck object store would; AddPartitionsToTxn is answered once
    its Ongoing record is durable, so the hang starts after that answer): a batch the engine
    accepted is not committed within ``delivery.timeout.ms`` and is reported ``_MSG_TIMED_OUT``
    -- its outcome unknown. The transaction must be aborted; the abort writes the ABORT marker
    after it and bumps the epoch; a new transaction commits the same records again, exactly once."""
    p = Producer({**conf, "transactional.id": "slow", "delivery.timeout.ms": 2500, "request.timeout.ms": 2000,
                  "linger.ms": 0})
    p.init_transactions(10)
    pid = p._txn.producer_id
    p.begin_transaction()
    p.produce("out", value="a0", partition=0)
    p.commit_transaction(10)
    added = threading.Event()
    gate = hang_data_puts(monkeypatch, p._broker.store, armed=added)
    coordinator = p._broker.transaction_coordinator()
    real_add = coordinator.handle_add_partitions_to_txn

    def add_then_hang(*args, **kwargs):
        answer = real_add(*args, **kwargs)
        added.set()
        return answer

    monkeypatch.setattr(coordinator, "handle_add_partitions_to_txn", add_then_hang)
    reports = []
    p.begin_transaction()
    started = time.monotonic()
    p.produce("out", value="t0", partition=0, on_delivery=lambda e, m: reports.append((m.value(), e.code(), m.offset())))
    assert p.flush(10) == 0
    assert time.monotonic() - started >= 2.4
    assert reports == [(b"t0", KafkaError._MSG_TIMED_OUT, -1001)]
    assert kind(raised(lambda: p.commit_transaction(10))) == (KafkaError._MSG_TIMED_OUT, True, False)
    assert kind(raised(lambda: p.produce("out", value="x", partition=0))) == (KafkaError._MSG_TIMED_OUT, True, False)
    gate.set()  # the store recovers: the timed-out batch commits after all, the ABORT marker after it
    p.abort_transaction(10)
    assert (p._txn.producer_id, p._txn.epoch) == (pid, 1)
    p.begin_transaction()
    p.produce("out", value="t0", partition=0)
    p.commit_transaction(10)
    assert committed(conf, (0,)) == [(0, 0, "a0"), (0, 4, "t0")]
    assert log(p._broker, 0) == [(0, "a0", pid, 0, 0), (1, "COMMIT", pid, 0, -1), (2, "t0", pid, 0, 1),
                                 (3, "ABORT", pid, 0, -1), (4, "t0", pid, 1, 0), (5, "COMMIT", pid, 1, -1)]
    # the partition's producer state moved to the new epoch
    entry = p._broker._partitions[("out", 0)].producers.last_entry(pid)
    assert (entry.producer_epoch, entry.last_seq, entry.current_txn_first_offset) == (1, 0, None)
    p.close()


def test_abort_resumes_after_a_timed_out_bump_and_a_lost_answer_gets_the_same_epoch(conf, monkeypatch):
    """The bump's InitProducerId is answered CONCURRENT_TRANSACTIONS (retriable) until
    ``abort_transaction``'s timeout: it raises ``_TIMED_OUT`` and may be called again. The second
    call resumes -- no second EndTxn, which the bumped epoch would fence -- and its first
    InitProducerId is bumped at the coordinator but the answer is lost (REQUEST_TIMED_OUT): the
    retry gets the same epoch, the coordinator bumped once."""
    p = Producer({**conf, "transactional.id": "r"})
    p.init_transactions(10)
    pid = p._txn.producer_id
    refuse_next(monkeypatch, p._broker, ("out", 0), Errors.OUT_OF_ORDER_SEQUENCE_NUMBER)
    p.begin_transaction()
    p.produce("out", value="b0", partition=0)
    p.flush(10)
    coordinator = p._broker.transaction_coordinator()
    real_init, real_end_txn = coordinator.handle_init_producer_id, coordinator.handle_end_txn
    end_txns, bumps, busy = [], [], [True]

    def end_txn(*args):
        end_txns.append(args)
        return real_end_txn(*args)

    def init_producer_id(transactional_id, timeout_ms, expected=None):
        if busy[0]:
            return Errors.CONCURRENT_TRANSACTIONS, -1, -1
        answer = real_init(transactional_id, timeout_ms, expected)
        bumps.append((expected, answer))
        return (Errors.REQUEST_TIMED_OUT, -1, -1) if len(bumps) == 1 else answer

    monkeypatch.setattr(coordinator, "handle_end_txn", end_txn)
    monkeypatch.setattr(coordinator, "handle_init_producer_id", init_producer_id)
    err = raised(lambda: p.abort_transaction(0.3))
    assert kind(err) == (KafkaError._TIMED_OUT, False, False) and err.retriable()
    assert end_txns == [("r", pid, 0, False)]
    busy[0] = False
    p.abort_transaction(10)
    assert end_txns == [("r", pid, 0, False)]
    assert bumps == [(ProducerIdAndEpoch(pid, 0), (Errors.NO_ERROR, pid, 1))] * 2
    assert (p._txn.producer_id, p._txn.epoch) == (pid, 1)
    assert identity(metadata(coordinator, "r")) == (pid, 1, 0, TransactionState.EMPTY)
    monkeypatch.undo()
    p.begin_transaction()
    p.produce("out", value="c0", partition=0)
    p.commit_transaction(10)
    assert committed(conf) == [(0, 1, "c0")]
    assert log(p._broker, 0) == [(0, "ABORT", pid, 0, -1), (1, "c0", pid, 1, 0), (2, "COMMIT", pid, 1, -1)]
    p.close()


def test_newer_instance_during_the_bump_fences_the_producer(conf, monkeypatch):
    p1 = Producer({**conf, "transactional.id": "z"})
    p1.init_transactions(10)
    pid = p1._txn.producer_id
    refuse_next(monkeypatch, p1._broker, ("out", 0), Errors.OUT_OF_ORDER_SEQUENCE_NUMBER)
    p1.begin_transaction()
    p1.produce("out", value="b0", partition=0)
    p1.flush(10)
    assert kind(raised(lambda: p1.commit_transaction(10))) == (KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, True, False)
    p2 = Producer({**conf, "transactional.id": "z"})
    coordinator = p1._broker.transaction_coordinator()
    real_end_txn = coordinator.handle_end_txn

    def end_txn_then_a_new_instance_starts(*args):
        answer = real_end_txn(*args)
        p2.init_transactions(10)  # between p1's EndTxn ABORT and its InitProducerId(expected)
        return answer

    monkeypatch.setattr(coordinator, "handle_end_txn", end_txn_then_a_new_instance_starts)
    err = raised(lambda: p1.abort_transaction(10))
    monkeypatch.setattr(coordinator, "handle_end_txn", real_end_txn)
    assert kind(err) == (KafkaError.PRODUCER_FENCED, False, True)
    assert (p2._txn.producer_id, p2._txn.epoch) == (pid, 1)
    assert identity(metadata(coordinator, "z")) == (pid, 1, -1, TransactionState.EMPTY)
    for call in (p1.begin_transaction, lambda: p1.abort_transaction(10), lambda: p1.init_transactions(10)):
        assert kind(raised(call)) == (KafkaError.PRODUCER_FENCED, False, True)
    p2.begin_transaction()
    p2.produce("out", value="c0", partition=0)
    p2.commit_transaction(10)
    assert committed(conf) == [(0, 1, "c0")]
    assert log(p2._broker, 0) == [(0, "ABORT", pid, 0, -1), (1, "c0", pid, 1, 0), (2, "COMMIT", pid, 1, -1)]
    p2.close()


@pytest.mark.parametrize("via", ["produce", "send_offsets"])
def test_expired_transactional_id_is_abortable_and_the_abort_gets_a_fresh_producer_id(conf, via):
    p = Producer({**conf, "transactional.id": "idle"})
    p.init_transactions(10)
    pid = p._txn.producer_id
    p.begin_transaction()
    p.produce("out", value="a0", partition=0)
    p.commit_transaction(10)
    coordinator = p._broker.transaction_coordinator()
    now = int(time.time() * 1000)
    assert coordinator.state.remove_expired_transactional_ids(now=now + 2_000, expiration_ms=1_000) == ["idle"]
    assert coordinator.state.get_transaction_state("idle") is None
    p.begin_transaction()
    if via == "produce":  # AddPartitionsToTxn answers INVALID_PRODUCER_ID_MAPPING; the record fails with it
        reports = []
        p.produce("out", value="b0", partition=0, on_delivery=lambda e, m: reports.append((m.value(), e.code())))
        assert p.flush(10) == 0
        assert reports == [(b"b0", KafkaError.INVALID_PRODUCER_ID_MAPPING)]
        err = raised(lambda: p.commit_transaction(10))
    else:  # AddOffsetsToTxn answers it
        err = raised(lambda: p.send_offsets_to_transaction([TopicPartition("out", 0, 1)], "g", 10))
    assert kind(err) == (KafkaError.INVALID_PRODUCER_ID_MAPPING, True, False)
    assert p._txn.epoch_bump_required
    # the abort sends no EndTxn (the coordinator knows no such producer) but InitProducerId(pid, 0):
    # the transactional id is new again, so it gets a fresh producer id at epoch 0
    p.abort_transaction(10)
    new_pid = p._txn.producer_id
    assert new_pid != pid and p._txn.epoch == 0
    assert identity(metadata(coordinator, "idle")) == (new_pid, 0, -1, TransactionState.EMPTY)
    p.begin_transaction()
    p.produce("out", value="c0", partition=0)
    p.send_offsets_to_transaction([TopicPartition("out", 0, 1)], "g", 10)
    p.commit_transaction(10)
    assert committed(conf) == [(0, 0, "a0"), (0, 2, "c0")]
    assert log(p._broker, 0) == [(0, "a0", pid, 0, 0), (1, "COMMIT", pid, 0, -1), (2, "c0", new_pid, 0, 0),
                                 (3, "COMMIT", new_pid, 0, -1)]
    with Consumer({**conf, "group.id": "g"}) as c:
        assert c.committed([TopicPartition("out", 0)], timeout=10)[0].offset == 1
    p.close()


def test_abort_at_epoch_32766_rotates_the_producer_id(conf, monkeypatch):
    p = Producer({**conf, "transactional.id": "old"})
    p.init_transactions(10)
    pid = p._txn.producer_id
    coordinator = p._broker.transaction_coordinator()
    md = metadata(coordinator, "old")
    with md.lock:  # fast-forward in memory: as if 32 766 epochs had been used
        md.producer_epoch = 32766
    p._txn.epoch = 32766
    p._set_identity(pid, 32766)
    p.begin_transaction()
    p.produce("out", value="b1", partition=1)
    assert p.flush(10) == 0
    refuse_next(monkeypatch, p._broker, ("out", 0), Errors.UNKNOWN_PRODUCER_ID)
    p.produce("out", value="b0", partition=0)
    assert p.flush(10) == 0
    assert kind(raised(lambda: p.commit_transaction(10))) == (KafkaError.UNKNOWN_PRODUCER_ID, True, False)
    p.abort_transaction(10)  # EndTxn ABORT under 32766, then InitProducerId(pid, 32766): exhausted
    new_pid = p._txn.producer_id
    assert new_pid != pid and p._txn.epoch == 0
    md = metadata(coordinator, "old")
    assert (md.producer_id, md.previous_producer_id, md.producer_epoch, md.last_producer_epoch) == (new_pid, pid, 0, 32766)
    p.begin_transaction()
    p.produce("out", value="c0", partition=0)
    p.produce("out", value="c1", partition=1)
    p.commit_transaction(10)
    assert committed(conf) == [(0, 1, "c0"), (1, 2, "c1")]
    assert log(p._broker, 0) == [(0, "ABORT", pid, 32766, -1), (1, "c0", new_pid, 0, 0), (2, "COMMIT", new_pid, 0, -1)]
    assert log(p._broker, 1) == [(0, "b1", pid, 32766, 0), (1, "ABORT", pid, 32766, -1), (2, "c1", new_pid, 0, 0),
                                 (3, "COMMIT", new_pid, 0, -1)]
    p.close()


# ---- the idempotent producer: a local epoch bump after a sequence error -----------------------------

def test_idempotent_producer_bumps_its_epoch_after_out_of_order_sequence(conf):
    """The partition's state moves past what the producer knows (here a write under the producer's
    own id and epoch that the client never sent, as after a lost acknowledgement the other way
    round): its next batch is OUT_OF_ORDER_SEQUENCE_NUMBER, refused by the broker's own check. The
    producer reports it, bumps its epoch locally (no request: the broker accepts a newer epoch
    from sequence 0) and the records produced after that land exactly once."""
    reports = []
    p = Producer({**conf, "on_delivery": lambda e, m: reports.append((m.value().decode(), e and e.code(), m.offset()))})
    p.produce("out", value="r0", partition=0)
    p.produce("out", value="s0", partition=1)
    assert p.flush(10) == 0
    pid = p._producer_id
    (ghost,) = p._broker.produce([ProduceBatch("out", 0, rows("g1", "g2"), pid, 0, 1)])
    assert (ghost.error, ghost.base_offset) == (Errors.NO_ERROR, 1)
    p.produce("out", value="r1", partition=0)       # sequence 1..1: neither a duplicate nor next
    assert p.flush(10) == 0
    p.produce("out", value="r2", partition=0)
    p.produce("out", value="s1", partition=1)
    assert p.flush(10) == 0
    assert (p._producer_id, p._epoch) == (pid, 1)
    assert sorted(reports) == [("r0", None, 0), ("r1", KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, -1001), ("r2", None, 3),
                               ("s0", None, 0), ("s1", None, 1)]
    assert committed(conf) == [(0, 0, "r0"), (0, 1, "g1"), (0, 2, "g2"), (0, 3, "r2"), (1, 0, "s0"), (1, 1, "s1")]
    assert log(p._broker, 0) == [(0, "r0", pid, 0, 0), (1, "g1", pid, 0, 1), (2, "g2", pid, 0, 1), (3, "r2", pid, 1, 0)]
    assert log(p._broker, 1) == [(0, "s0", pid, 0, 0), (1, "s1", pid, 1, 0)]
    p.close()


@pytest.mark.parametrize("epoch_before,exhausted", [(0, False), (32767, True)], ids=["epoch-0", "epoch-32767"])
def test_idempotent_producer_bumps_its_epoch_after_unknown_producer_id(conf, monkeypatch, epoch_before, exhausted):
    """UNKNOWN_PRODUCER_ID (a broker that lost the producer's state answers it): the batch fails, the
    epoch goes up by one -- or, from epoch 32767 (Short.MAX_VALUE), a new producer id comes from
    InitProducerId -- and the next records start at sequence 0."""
    reports = []
    p = Producer({**conf, "on_delivery": lambda e, m: reports.append((m.value().decode(), e and e.code(), m.offset()))})
    p.produce("out", value="r0", partition=0)
    assert p.flush(10) == 0
    pid = p._producer_id
    if epoch_before:
        with p._lock:  # fast-forward: as if 32 767 bumps had happened (a new epoch starts at sequence 0)
            p._epoch = epoch_before
            p._next_seq.clear()
    refused = refuse_next(monkeypatch, p._broker, ("out", 0), Errors.UNKNOWN_PRODUCER_ID)
    p.produce("out", value="r1", partition=0)
    assert p.flush(10) == 0
    p.produce("out", value="r2", partition=0)
    assert p.flush(10) == 0
    new_pid, new_epoch = p._producer_id, p._epoch
    if exhausted:
        assert new_pid != pid and new_epoch == 0
    else:
        assert (new_pid, new_epoch) == (pid, 1)
    assert refused == [(pid, epoch_before, 0 if epoch_before else 1)]
    assert reports == [("r0", None, 0), ("r1", KafkaError.UNKNOWN_PRODUCER_ID, -1001), ("r2", None, 1)]
    assert log(p._broker, 0) == [(0, "r0", pid, 0, 0), (1, "r2", new_pid, new_epoch, 0)]
    p.close()


def test_a_retried_batch_is_sent_before_the_later_batches_of_its_partition(conf, monkeypatch):
    """A batch answered with a retriable error keeps its sequence and goes again before any later
    batch of its partition, which wait (one batch per record here): nothing is reordered."""
    reports = []
    p = Producer({**conf, "batch.num.messages": 1, "retry.backoff.ms": 30,
                  "on_delivery": lambda e, m: reports.append((m.value().decode(), e and e.code(), m.offset()))})
    p.produce("out", value="w", partition=1)       # the producer id exists before the refusals
    assert p.flush(10) == 0
    pid = p._producer_id
    refused = refuse_next(monkeypatch, p._broker, ("out", 0), Errors.NOT_LEADER_OR_FOLLOWER, times=2)
    for i in range(4):
        p.produce("out", value=f"r{i}", partition=0)   # each its own batch, closed at once
    assert p.flush(10) == 0
    assert refused == [(pid, 0, 0), (pid, 0, 0)]
    assert reports == [("w", None, 0), ("r0", None, 0), ("r1", None, 1), ("r2", None, 2), ("r3", None, 3)]
    assert log(p._broker, 0) == [(i, f"r{i}", pid, 0, i) for i in range(4)]
    p.close()


def test_batches_queued_behind_a_failed_batch_fail_too(conf, monkeypatch):
    """The first batch of a partition is refused (retriable) until its delivery timeout: it fails
    with its sequence unused, so the batches queued behind it fail too -- none is written after a
    gap or before it. The epoch is bumped and later records are delivered from sequence 0."""
    reports = []
    p = Producer({**conf, "batch.num.messages": 1, "retry.backoff.ms": 50, "delivery.timeout.ms": 1500,
                  "request.timeout.ms": 1000, "on_delivery": lambda e, m: reports.append(
                      (m.value().decode(), e and e.code(), e and e.str().startswith("an earlier batch")))})
    p.produce("out", value="w", partition=1)
    assert p.flush(10) == 0
    pid = p._producer_id
    refused = refuse_next(monkeypatch, p._broker, ("out", 0), Errors.NOT_LEADER_OR_FOLLOWER, times=-1)
    for i in range(3):
        p.produce("out", value=f"r{i}", partition=0)
    assert p.flush(10) == 0
    assert len(refused) >= 2 and set(refused) == {(pid, 0, 0)}   # only r0 was ever sent
    assert reports == [("w", None, None), ("r0", KafkaError._MSG_TIMED_OUT, False),
                       ("r1", KafkaError._MSG_TIMED_OUT, True), ("r2", KafkaError._MSG_TIMED_OUT, True)]
    monkeypatch.undo()   # the partition is back
    p.produce("out", value="r3", partition=0)
    p.produce("out", value="x", partition=1)
    assert p.flush(10) == 0
    assert (p._producer_id, p._epoch) == (pid, 1)
    assert reports[4:] == [("r3", None, None), ("x", None, None)]
    assert log(p._broker, 0) == [(0, "r3", pid, 1, 0)]
    assert log(p._broker, 1) == [(0, "w", pid, 0, 0), (1, "x", pid, 1, 0)]
    p.close()


# ---- producer state expired on the partitions, the transactional id still known -----------------

@pytest.mark.skipif(not hasattr(Broker, "remove_expired_producers"),
                    reason="producer-state expiry (Broker.remove_expired_producers) is not there yet")
def test_expired_producer_state_and_a_new_instance_reuses_the_producer_id(conf):
    """``producer.id.expiration.ms`` later the partitions forget the producer while the coordinator
    still knows its transactional id: a new instance gets the same producer id at epoch + 1 and
    its writes from sequence 0 are accepted."""
    p1 = Producer({**conf, "transactional.id": "kept"})
    p1.init_transactions(10)
    pid = p1._txn.producer_id
    p1.begin_transaction()
    p1.produce("out", value="a0", partition=0)
    p1.produce("out", value="a1", partition=1)
    p1.commit_transaction(10)
    broker = p1._broker
    later = int(time.time() * 1000) + broker.config.producer_id_expiration_ms + 60_000
    assert broker.remove_expired_producers(later) == {("out", 0): [pid], ("out", 1): [pid]}
    assert broker._partitions[("out", 0)].producers.last_entry(pid) is None
    p2 = Producer({**conf, "transactional.id": "kept"})   # the same engine: p1 still holds it
    p1.close()
    p2.init_transactions(10)
    assert (p2._txn.producer_id, p2._txn.epoch) == (pid, 1)
    p2.begin_transaction()
    p2.produce("out", value="b0", partition=0)
    p2.produce("out", value="b1", partition=1)
    p2.commit_transaction(10)
    assert committed(conf) == [(0, 0, "a0"), (0, 2, "b0"), (1, 0, "a1"), (1, 2, "b1")]
    assert log(broker, 0) == [(0, "a0", pid, 0, 0), (1, "COMMIT", pid, 0, -1), (2, "b0", pid, 1, 0),
                              (3, "COMMIT", pid, 1, -1)]
    entry = broker._partitions[("out", 0)].producers.last_entry(pid)
    assert (entry.producer_epoch, entry.last_seq) == (1, 0)
    p2.close()


def test_end_txn_answering_invalid_txn_state_is_fatal(conf):
    """Kafka's EndTxnHandler treats INVALID_TXN_STATE as a fatal error: the client and the
    coordinator disagree on the transaction (here another EndTxn of the same producer id and
    epoch aborted it first), and no abort can mend that."""
    p = Producer({**conf, "transactional.id": "t"})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("out", value="x", partition=0)
    assert p.flush(10) == 0
    txn = p._txn
    coordinator = p._broker.transaction_coordinator()
    assert coordinator.handle_end_txn("t", txn.producer_id, txn.epoch, False) == Errors.NO_ERROR
    err = raised(lambda: p.commit_transaction(10))
    assert kind(err) == (Errors.INVALID_TXN_STATE, False, True)
    assert kind(raised(lambda: p.begin_transaction())) == (Errors.INVALID_TXN_STATE, False, True)
    assert kind(raised(lambda: p.abort_transaction(10))) == (Errors.INVALID_TXN_STATE, False, True)
    assert committed(conf) == []
    p.close()
