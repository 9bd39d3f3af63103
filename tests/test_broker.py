"""The embedded broker: group commit, idempotent produce (KIP-98), fetch, list offsets, recovery."""

import time

import pyarrow as pa
import pytest

from txlake.catalog.storage import ObjectStore
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.engine.errors import Errors
from txlake.engine.flush_schedule import FLUSH_BURST
from txlake.engine.producer_state import INT32_MAX
from txlake.engine.requests import ProduceResult
from helpers import broker_past_its_burst, payload, simulate_crash


@pytest.fixture
def broker(storage):
    b = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, lease_ms=60_000))
    yield b
    b.close()


def reopen(broker, storage, **cfg):
    broker.close()
    return Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, lease_ms=60_000, **cfg))


def test_idempotent_produce_duplicates_gaps_epochs(broker):
    assert broker.create_topics([("t", 2, {})]) == [(Errors.NO_ERROR, "")]
    err, pid, epoch = broker.init_producer_id()
    assert (err, epoch) == (Errors.NO_ERROR, 0)
    first = ProduceBatch("t", 0, payload(5), pid, 0, 0)
    second = ProduceBatch("t", 0, payload(3, 5), pid, 0, 5)
    r = broker.produce([first, second])
    assert [(x.error, x.base_offset, x.duplicate) for x in r] == [(Errors.NO_ERROR, 0, False), (Errors.NO_ERROR, 5, False)]
    # exact retries of both: the original offsets, nothing written
    r = broker.produce([first, second])
    assert [(x.error, x.base_offset, x.duplicate) for x in r] == [(Errors.NO_ERROR, 0, True), (Errors.NO_ERROR, 5, True)]
    assert broker.fetch("t", 0, 0).high_watermark == 8
    gap = broker.produce([ProduceBatch("t", 0, payload(1), pid, 0, 9)])[0]
    assert gap.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    overlap = broker.produce([ProduceBatch("t", 0, payload(4), pid, 0, 6)])[0]
    assert overlap.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    bumped = broker.produce([ProduceBatch("t", 0, payload(1), pid, 1, 3)])[0]
    assert bumped.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert broker.produce([ProduceBatch("t", 0, payload(1), pid, 1, 0)])[0].base_offset == 8
    stale = broker.produce([ProduceBatch("t", 0, payload(1), pid, 0, 8)])[0]
    assert stale.error == Errors.INVALID_PRODUCER_EPOCH
    # the other partition has its own sequence space
    assert broker.produce([ProduceBatch("t", 1, payload(2), pid, 0, 0)])[0].base_offset == 0
    fetched = broker.fetch("t", 0, 0)
    assert fetched.records.column("offset").to_pylist() == list(range(9))
    assert fetched.records.column("base_sequence").to_pylist() == [0] * 5 + [5] * 3 + [0]
    assert fetched.records.column("producer_epoch").to_pylist() == [0] * 8 + [1]


def test_a_retry_of_a_batch_not_yet_committed_is_answered_after_its_commit(storage):
    """An idempotent batch waits in the queue (60 s flush interval, the burst spent); its exact
    retry -- a client whose request.timeout.ms ran out -- is a duplicate (KIP-98), and its
    answer waits for the original's commit: not done after 300 ms, then, once a flush commits
    the queue, NO_ERROR at the original's base offset with ``duplicate`` True. Before, the
    retry was answered NO_ERROR at once, acknowledging records a crash would lose (Kafka's
    duplicate answer waits for the high watermark too, acks=all)."""
    with broker_past_its_burst(storage) as (broker, version, small):
        _, pid, _ = broker.init_producer_id()
        batch = ProduceBatch("t", 0, payload(2, 100), pid, 0, 0)
        (original,) = broker.produce_async([batch])
        (retry,) = broker.produce_async([batch])
        with pytest.raises(TimeoutError):
            retry.result(timeout=0.3)
        assert not original.done()
        broker.flush(timeout_ms=20_000)
        base = FLUSH_BURST + 1
        assert original.result(timeout=0) == ProduceResult(Errors.NO_ERROR, base, -1)
        assert retry.result(timeout=5) == ProduceResult(Errors.NO_ERROR, base, -1, duplicate=True)
        assert broker.fetch("t", 0, 0).high_watermark == base + 2
        # a retry of a committed batch is answered at once, as before
        (again,) = broker.produce_async([batch])
        assert again.result(timeout=0) == ProduceResult(Errors.NO_ERROR, base, -1, duplicate=True)


def test_sequence_wraps_around(broker):
    broker.create_topics([("t", 1, {})])
    _, pid, _ = broker.init_producer_id()
    assert broker.produce([ProduceBatch("t", 0, payload(2), pid, 0, INT32_MAX - 1)])[0].error == Errors.NO_ERROR
    assert broker.produce([ProduceBatch("t", 0, payload(2), pid, 0, 0)])[0].base_offset == 2
    assert broker.produce([ProduceBatch("t", 0, payload(1), pid, 0, 3)])[0].error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER


@pytest.mark.parametrize("partitions", [1, 64])
def test_one_flush_is_one_data_object_and_one_commit(storage, partitions):
    store = storage.object_store()
    broker = Broker(store, BrokerConfig(flush_linger_ms=200, lease_ms=60_000))
    try:
        broker.create_topics([("t", partitions, {})])
        _, pid, _ = broker.init_producer_id()
        puts = []
        real_put, real_pia = store.put, store.put_if_absent
        store.put = lambda key, data: (puts.append(key), real_put(key, data))[1]
        store.put_if_absent = lambda key, data: (puts.append(key), real_pia(key, data))[1]
        futures = broker.produce_async([ProduceBatch("t", p, payload(10), pid, 0, 0) for p in range(partitions)])
        results = [f.result(timeout=30) for f in futures]
        store.put, store.put_if_absent = real_put, real_pia
        assert {r.error for r in results} == {Errors.NO_ERROR}
        data_puts = [k for k in puts if k.startswith("data/")]
        commit_puts = [k for k in puts if k.startswith("_catalog/commits/")]
        assert len(data_puts) == 1 and len(commit_puts) == 1, puts
        assert [k for k in puts if not k.startswith("_catalog/leases/")] == data_puts + commit_puts
        segs = [broker.catalog.state.partition("t", p).segments for p in range(partitions)]
        assert all(len(s) == 1 and s[0].path == data_puts[0] for s in segs)
        assert {s[0].row_group_count for s in segs} == {1}
    finally:
        broker.close()


def test_fetch_list_offsets_and_timestamps(broker):
    broker.create_topics([("t", 1, {}), ("lat", 1, {"message.timestamp.type": "LogAppendTime"})])
    broker.produce([ProduceBatch("t", 0, payload(5, ts=1_000)), ProduceBatch("t", 0, payload(5, 5, ts=2_000))])
    assert broker.fetch("t", 0, 3, max_records=4).records.column("offset").to_pylist() == [3, 4, 5, 6]
    assert broker.fetch("t", 0, 10).records.num_rows == 0
    out = broker.fetch("t", 0, 11)
    assert (out.error, out.high_watermark) == (Errors.OFFSET_OUT_OF_RANGE, 10)
    assert broker.list_offsets("t", 0, -2) == (Errors.NO_ERROR, 0, -1)
    assert broker.list_offsets("t", 0, -1) == (Errors.NO_ERROR, 10, -1)
    assert broker.list_offsets("t", 0, 1_003) == (Errors.NO_ERROR, 3, 1_003)
    assert broker.list_offsets("t", 0, 1_500) == (Errors.NO_ERROR, 5, 2_000)
    assert broker.list_offsets("t", 0, 9_999) == (Errors.NO_ERROR, -1, -1)
    assert broker.list_offsets("t", 0, -3) == (Errors.NO_ERROR, 9, 2_004)
    assert broker.list_offsets("nope", 0, -1)[0] == Errors.UNKNOWN_TOPIC_OR_PART
    before = int(time.time() * 1000)
    r = broker.produce([ProduceBatch("lat", 0, payload(2, ts=5))])[0]
    assert r.log_append_time >= before
    got = broker.fetch("lat", 0, 0).records
    assert got.column("timestamp").to_pylist() == [r.log_append_time] * 2
    assert got.column("timestamp_type").to_pylist() == [1, 1]


def test_bad_requests(broker):
    broker.create_topics([("small", 1, {"max.message.bytes": "100"})])
    r = broker.produce([ProduceBatch("small", 0, payload(1, size=500))])[0]
    assert r.error == Errors.MESSAGE_TOO_LARGE and "max.message.bytes=100" in r.message
    assert broker.produce([ProduceBatch("nope", 0, payload(1))])[0].error == Errors.UNKNOWN_TOPIC_OR_PART
    # a compacted topic refuses a record without a key (Kafka's LogValidator), and writes nothing
    broker.create_topics([("keyed", 1, {"cleanup.policy": "compact,delete"})])
    unkeyed = payload(2).set_column(1, "key", pa.array([b"k", None], pa.binary()))
    r = broker.produce([ProduceBatch("keyed", 0, unkeyed)])[0]
    assert r.error == Errors.INVALID_RECORD and "without key" in r.message and "keyed-0" in r.message
    assert broker.produce([ProduceBatch("keyed", 0, payload(2))])[0].base_offset == 0
    assert broker.produce([ProduceBatch("small", 3, payload(1))])[0].error == Errors.UNKNOWN_TOPIC_OR_PART
    results = broker.create_topics([("ok", 1, {}), ("bad/x", 1, {}), ("zero", 0, {}), ("cfg", 1, {"nope": "1"}),
                                    ("small", 1, {}), ("sma_ll", 1, {}), ("sma.ll", 1, {})])
    assert [e for e, _ in results] == [Errors.NO_ERROR, Errors.INVALID_TOPIC_EXCEPTION, Errors.INVALID_PARTITIONS,
                                       Errors.INVALID_CONFIG, Errors.TOPIC_ALREADY_EXISTS, Errors.NO_ERROR,
                                       Errors.INVALID_TOPIC_EXCEPTION]
    assert results[6][1] == "Topic 'sma.ll' collides with existing topic: sma_ll"
    assert broker.delete_topics(["ok", "ghost"]) == [(Errors.NO_ERROR, ""), (Errors.UNKNOWN_TOPIC_OR_PART, "Topic 'ghost' does not exist")]
    assert "ok" not in broker.topics()


def test_producer_ids_are_unique_across_restarts(broker, storage):
    ids = {broker.init_producer_id()[1] for _ in range(3)}
    again = reopen(broker, storage)
    try:
        ids2 = {again.init_producer_id()[1] for _ in range(3)}
        assert len(ids | ids2) == 6
    finally:
        again.close()


@pytest.mark.parametrize("snapshot_interval", [1, 1000])
def test_duplicate_detected_after_restart(storage, snapshot_interval):
    cfg = dict(flush_linger_ms=1, lease_ms=60_000, producer_snapshot_interval=snapshot_interval)
    b = Broker(storage.object_store(), BrokerConfig(**cfg))
    b.create_topics([("t", 1, {})])
    _, pid, _ = b.init_producer_id()
    batches = [ProduceBatch("t", 0, payload(3, i * 3), pid, 0, i * 3) for i in range(4)]
    for batch in batches:
        b.produce([batch])
    simulate_crash(b)
    b2 = Broker(storage.object_store(), BrokerConfig(**cfg, lease_force=True))
    try:
        r = b2.produce([batches[2]])[0]
        assert (r.error, r.base_offset, r.duplicate) == (Errors.NO_ERROR, 6, True)
        assert b2.produce([ProduceBatch("t", 0, payload(1), pid, 0, 13)])[0].error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
        assert b2.produce([ProduceBatch("t", 0, payload(1), pid, 0, 12)])[0].base_offset == 12
        assert b2.fetch("t", 0, 0).high_watermark == 13
    finally:
        b2.close()
