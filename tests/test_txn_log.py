"""The log side of transactions (KIP-98): control batches, LSO, the aborted-transaction
index, read_committed vs read_uncommitted, and producer state across transactions."""

import pyarrow as pa
import pytest

from txlake import Consumer, KafkaError, TopicPartition
from txlake.catalog.catalog import Catalog
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch, TxnMarker
from txlake.engine.errors import Errors
from txlake.engine.registry import close_all
from txlake.formats.records import PAYLOAD_SCHEMA
from helpers import simulate_crash


def rows(*values):
    n = len(values)
    return pa.Table.from_pydict({"timestamp": [1_000] * n, "key": [None] * n, "value": [v.encode() for v in values],
                                 "headers": [None] * n}, schema=PAYLOAD_SCHEMA)


def log_only(broker: Broker) -> Broker:
    """Turn off the KIP-890 verification the writer's transaction coordinator installs when it
    starts with the lease: these tests write transactional batches straight to the log, with no
    AddPartitionsToTxn, as Kafka's log tests do (its ``transaction.partition.verification.enable``
    false)."""
    broker.transaction_coordinator()  # waits for the coordinator the writer started
    broker.txn_verifier = None
    return broker


@pytest.fixture
def broker(storage):
    b = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, lease_ms=60_000))
    b.create_topics([("t", 1, {})])
    log_only(b)
    yield b
    b.close()
    close_all()


def produce(broker, pid, seq, *values, txn=True, epoch=0):
    (r,) = broker.produce([ProduceBatch("t", 0, rows(*values), pid, epoch, seq, is_transactional=txn)])
    return r


def end(broker, pid, committed, epoch=0, coordinator_epoch=0, partitions=(("t", 0),)):
    (answer,) = broker.write_txn_markers([TxnMarker(pid, epoch, coordinator_epoch, committed, tuple(partitions))])
    return answer


def part(broker):
    return broker.catalog.state.partition("t", 0)


def visible(broker, isolation):
    """(offset, value) of what a consumer of this broker's root returns under ``isolation``."""
    conf = {"storage.url": broker.store.url, "storage.options": broker.store.storage_options,
            "isolation.level": isolation, "auto.offset.reset": "earliest"}
    c = Consumer(conf)
    c.assign([TopicPartition("t", 0)])
    out = []
    while True:
        msgs = c.consume(100, 0.3)
        if not msgs:
            break
        out.extend((m.offset(), m.value().decode()) for m in msgs)
    position = c.position([TopicPartition("t", 0)])[0].offset
    watermarks = c.get_watermark_offsets(TopicPartition("t", 0))
    c.close()
    return out, position, watermarks


def test_interleaved_transactions_lso_and_aborted_index(broker):
    _, p1, _ = broker.init_producer_id()
    _, p2, _ = broker.init_producer_id()
    _, p3, _ = broker.init_producer_id()
    assert produce(broker, p1, 0, "a1", "a2").base_offset == 0          # txn A (p1) opens at 0
    assert produce(broker, p2, 0, "n1", txn=False).base_offset == 2     # plain idempotent write
    assert produce(broker, p3, 0, "b1").base_offset == 3                # txn B (p3) opens at 3
    assert (part(broker).high_watermark, part(broker).last_stable_offset) == (4, 0)
    assert visible(broker, "read_committed") == ([], 0, (0, 0))
    assert end(broker, p1, committed=True) == {("t", 0): Errors.NO_ERROR}   # COMMIT marker at 4
    assert (part(broker).high_watermark, part(broker).last_stable_offset) == (5, 3)
    assert produce(broker, p3, 1, "b2").base_offset == 5
    assert end(broker, p3, committed=False) == {("t", 0): Errors.NO_ERROR}  # ABORT marker at 6
    assert (part(broker).high_watermark, part(broker).last_stable_offset) == (7, 7)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in part(broker).aborted_transactions] == [(p3, 3, 6)]
    committed, position, marks = visible(broker, "read_committed")
    assert committed == [(0, "a1"), (1, "a2"), (2, "n1")]
    assert position == 7 and marks == (0, 7)                             # position skips the markers
    uncommitted, position, marks = visible(broker, "read_uncommitted")
    assert uncommitted == [(0, "a1"), (1, "a2"), (2, "n1"), (3, "b1"), (5, "b2")]
    assert position == 7 and marks == (0, 7)
    records = broker.fetch("t", 0, 0).records
    assert records.column("is_control").to_pylist() == [False] * 4 + [True, False, True]
    assert records.column("control_type").to_pylist() == [None] * 4 + [1, None, 0]
    reader = Catalog.open(broker.store)                                   # a reader needs no control-record scan
    assert reader.state.partition("t", 0).aborted_transactions == part(broker).aborted_transactions
    assert reader.state.partition("t", 0).last_stable_offset == 7


def test_read_committed_stops_at_the_lso(broker):
    _, p1, _ = broker.init_producer_id()
    _, p2, _ = broker.init_producer_id()
    produce(broker, p2, 0, "before", txn=False)
    produce(broker, p1, 0, "open")
    produce(broker, p2, 1, "after", txn=False)
    assert (part(broker).high_watermark, part(broker).last_stable_offset) == (3, 1)
    assert visible(broker, "read_committed") == ([(0, "before")], 1, (0, 1))
    assert visible(broker, "read_uncommitted")[0] == [(0, "before"), (1, "open"), (2, "after")]
    assert broker.list_offsets("t", 0, -1, "read_committed") == (Errors.NO_ERROR, 1, -1)
    assert broker.list_offsets("t", 0, 1_000, "read_committed") == (Errors.NO_ERROR, 0, 1_000)


def test_txn_state_errors(broker):
    _, pid, _ = broker.init_producer_id()
    produce(broker, pid, 0, "x")
    plain = produce(broker, pid, 1, "plain", txn=False)
    assert plain.error == Errors.INVALID_TXN_STATE and "transaction open since offset 0" in plain.message
    assert end(broker, pid, True, epoch=1, coordinator_epoch=3) == {("t", 0): Errors.NO_ERROR}
    assert end(broker, pid, True, epoch=0, coordinator_epoch=3) == {("t", 0): Errors.INVALID_PRODUCER_EPOCH}
    assert end(broker, pid, True, epoch=1, coordinator_epoch=2) == {("t", 0): Errors.TRANSACTION_COORDINATOR_FENCED}
    assert end(broker, pid, True, partitions=(("nope", 0),), epoch=1, coordinator_epoch=3) == {
        ("nope", 0): Errors.UNKNOWN_TOPIC_OR_PART}
    assert produce(broker, pid, 0, "new epoch", epoch=1).error == Errors.NO_ERROR


def test_empty_transaction_leaves_no_unstable_offset(broker):
    _, pid, _ = broker.init_producer_id()
    assert end(broker, pid, committed=False) == {("t", 0): Errors.NO_ERROR}
    p = part(broker)
    assert (p.high_watermark, p.last_stable_offset, p.aborted_transactions) == (1, 1, [])


@pytest.mark.parametrize("snapshot_interval", [1, 1000])
def test_transaction_stays_open_across_a_restart(storage, snapshot_interval):
    cfg = dict(flush_linger_ms=1, lease_ms=60_000, producer_snapshot_interval=snapshot_interval)
    b = Broker(storage.object_store(), BrokerConfig(**cfg))
    b.create_topics([("t", 1, {})])
    log_only(b)
    _, pid, _ = b.init_producer_id()
    produce(b, pid, 0, "in-flight")
    simulate_crash(b)
    b2 = Broker(storage.object_store(), BrokerConfig(**cfg, lease_force=True))
    try:
        assert produce(b2, pid, 1, "plain", txn=False).error == Errors.INVALID_TXN_STATE
        assert produce(b2, pid, 1, "more").base_offset == 1
        assert b2.catalog.state.partition("t", 0).last_stable_offset == 0
        assert end(b2, pid, committed=False) == {("t", 0): Errors.NO_ERROR}
        p = b2.catalog.state.partition("t", 0)
        assert (p.last_stable_offset, [(a.first_offset, a.last_offset) for a in p.aborted_transactions]) == (3, [(0, 2)])
    finally:
        b2.close()


def test_kip890_verification_refuses_a_partition_not_in_the_transaction(broker):
    _, pid, _ = broker.init_producer_id()
    added = set()
    broker.txn_verifier = lambda p, e, topic, partition: (
        Errors.NO_ERROR if (p, topic, partition) in added else Errors.INVALID_TXN_STATE)
    late = produce(broker, pid, 0, "late")
    assert late.error == Errors.INVALID_TXN_STATE and "KIP-890" in late.message
    assert part(broker).high_watermark == 0
    added.add((pid, "t", 0))
    assert produce(broker, pid, 0, "ok").base_offset == 0


def test_duckdb_view_shows_committed_records_only(broker):
    import txlake

    _, p1, _ = broker.init_producer_id()
    _, p2, _ = broker.init_producer_id()
    produce(broker, p1, 0, "keep")
    produce(broker, p2, 0, "drop")
    end(broker, p1, True)
    end(broker, p2, False)
    _, p3, _ = broker.init_producer_id()
    produce(broker, p3, 0, "open")
    con = txlake.duckdb.connect(broker.store.url, broker.store.storage_options)
    assert con.sql('SELECT "offset", value FROM t ORDER BY 1').fetchall() == [(0, b"keep")]
    con = txlake.duckdb.connect(broker.store.url, broker.store.storage_options, isolation_level="read_uncommitted")
    assert con.sql('SELECT "offset", value FROM t ORDER BY 1').fetchall() == [(0, b"keep"), (1, b"drop"), (4, b"open")]
