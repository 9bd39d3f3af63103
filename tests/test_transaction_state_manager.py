"""TransactionStateManager: partitioning, the log round trip, replay after a restart, timeouts, expiration.

Expected outcomes follow Kafka's TransactionStateManager / TransactionCoordinator and
TransactionStateManagerTest.
"""

from __future__ import annotations

import json
import threading

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from txlake.catalog.errors import InvalidConfigError
from txlake.engine.errors import ApiError, Errors
from txlake.engine.transaction_metadata import (NO_PRODUCER_EPOCH, SHORT_MAX_VALUE, IllegalStateError,
                                                ProducerIdAndEpoch, TransactionMetadata, TransactionResult,
                                                TransactionState, TxnTransitMetadata)
from txlake.engine.transaction_state_manager import (EXPIRATION_BATCH_SIZE, InMemoryTransactionLog, TransactionConfig,
                                                     TransactionLog, TransactionStateManager,
                                                     TransactionalIdAndProducerIdEpoch, java_string_hash_code,
                                                     kafka_abs, partition_for)
from txlake.formats import transaction_log
from txlake.formats.errors import CorruptObjectError, UnsupportedFormatVersionError

S = TransactionState
T0 = 1_700_000_000_000


class Clock:
    def __init__(self, now: int = T0):
        self.now = now

    def __call__(self) -> int:
        return self.now

    def sleep(self, ms: int) -> None:
        self.now += ms


def independent_hash(s: str) -> int:
    """Java's String.hashCode by its definition: sum of c[i] * 31^(n-1-i), reduced to a signed int32."""
    units = []
    for ch in s:
        cp = ord(ch)
        if cp > 0xFFFF:  # a supplementary character is two UTF-16 code units
            cp -= 0x10000
            units += [0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF)]
        else:
            units.append(cp)
    n = len(units)
    total = sum(u * 31 ** (n - 1 - i) for i, u in enumerate(units)) % 2**32
    return total - 2**32 if total >= 2**31 else total


# ---------------------------------------------------------------------------- partitioning
@pytest.mark.parametrize("s,expected", [
    ("", 0), ("a", 97), ("b", 98), ("ab", 3105), ("Aa", 2112), ("BB", 2112),
    ("one", 110182), ("two", 115276), ("hello", 99162322),
    ("😀", 0xD83D * 31 + 0xDE00),                 # surrogate pair: 1772899
    ("polygenelubricants", -(2**31)),           # the classic Integer.MIN_VALUE hash
])
def test_java_string_hash_code_known_values(s, expected):
    assert java_string_hash_code(s) == expected == independent_hash(s)


@given(st.text(max_size=60))
def test_java_string_hash_code_matches_its_definition(s):
    assert java_string_hash_code(s) == independent_hash(s)


def test_kafka_utils_abs():
    assert kafka_abs(5) == 5 and kafka_abs(-5) == 5 and kafka_abs(0) == 0
    assert kafka_abs(-(2**31)) == 0
    assert kafka_abs(2**31 - 1) == 2**31 - 1


def test_partition_for():
    assert partition_for("a", 2) == 1 and partition_for("b", 2) == 0      # Kafka's testDeletePartition
    assert partition_for("one", 2) == 0 and partition_for("two", 2) == 0  # Kafka's test ids share partition 0
    assert partition_for("hello") == 99162322 % 50 == 22
    assert partition_for("polygenelubricants", 7) == 0                     # Utils.abs(MIN_VALUE) = 0
    ids = [f"copier-{i}" for i in range(200)] + ["transactional-id-with-a-long-name-0123456789"]
    negatives = [t for t in ids if independent_hash(t) < 0]
    assert negatives, "some ids must hash negative to test Utils.abs"
    for t in ids:
        assert partition_for(t) == abs(independent_hash(t)) % 50
    assert partition_for(negatives[0]) == -independent_hash(negatives[0]) % 50
    with pytest.raises(ValueError):
        partition_for("a", 0)


# ---------------------------------------------------------------------------- config
def test_config_defaults_are_kafkas():
    c = TransactionConfig()
    assert c.transaction_log_num_partitions == 50
    assert c.transaction_max_timeout_ms == 900_000
    assert c.transactional_id_expiration_ms == 604_800_000
    assert c.abort_timed_out_transactions_interval_ms == 10_000
    assert c.remove_expired_transactional_ids_interval_ms == 3_600_000


def test_config_from_properties():
    c = TransactionConfig.from_properties({"transaction.state.log.num.partitions": "3",
                                           "transaction.max.timeout.ms": 1000,
                                           "transactional.id.expiration.ms": "5000",
                                           "transaction.abort.timed.out.transaction.cleanup.interval.ms": 7,
                                           "transaction.remove.expired.transaction.cleanup.interval.ms": 9,
                                           "unrelated.key": "x"})
    assert (c.transaction_log_num_partitions, c.transaction_max_timeout_ms, c.transactional_id_expiration_ms,
            c.abort_timed_out_transactions_interval_ms, c.remove_expired_transactional_ids_interval_ms) == \
        (3, 1000, 5000, 7, 9)
    for bad in ("0", "-1", "abc", 2**31):
        with pytest.raises(InvalidConfigError, match="transaction.state.log.num.partitions"):
            TransactionConfig.from_properties({"transaction.state.log.num.partitions": bad})


def test_validate_transaction_timeout():
    m = TransactionStateManager(InMemoryTransactionLog())
    assert m.validate_transaction_timeout_ms(1)
    assert not m.validate_transaction_timeout_ms(0) and not m.validate_transaction_timeout_ms(-1)
    assert m.validate_transaction_timeout_ms(900_000) and not m.validate_transaction_timeout_ms(900_001)


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def tlog():
    return InMemoryTransactionLog(num_partitions=2)


CONFIG = TransactionConfig(transaction_log_num_partitions=2)


def new_manager(tlog, clock, epoch=10, load=True, nothing_pending=True) -> TransactionStateManager:
    mgr = TransactionStateManager(tlog, CONFIG, time_ms=clock)
    if load:
        for p in range(2):
            pending = mgr.load_transactions_for_partition(p, epoch)
            assert not nothing_pending or pending == []
    return mgr


def created(tid: str, pid: int, clock, timeout=1000) -> TransactionMetadata:
    """What InitProducerId caches for an unknown transactional id."""
    return TransactionMetadata(tid, pid, txn_timeout_ms=timeout, txn_last_update_timestamp=clock())


def apply(mgr: TransactionStateManager, tid: str, prepare, epoch=10) -> Errors:
    """Prepare under the metadata lock, then append (what the coordinator does)."""
    md = mgr.get_transaction_state(tid).transaction_metadata
    with md.lock:
        transit = prepare(md)
    return mgr.append_transaction_to_log(tid, epoch, transit)


def init(mgr, tid, pid, clock, epoch=10, timeout=1000) -> TransactionMetadata:
    md = mgr.put_transaction_state_if_not_exists(created(tid, pid, clock, timeout)).transaction_metadata
    assert apply(mgr, tid, lambda m: m.prepare_increment_producer_epoch(timeout, None, clock()), epoch) == Errors.NO_ERROR
    return md


def drive(mgr, tid, pid, clock, target: str, epoch=10) -> TransactionMetadata:
    """Bring ``tid`` to a named situation through the coordinator's calls."""
    md = init(mgr, tid, pid, clock, epoch)
    if target == "Empty":
        return md
    clock.sleep(1)
    assert apply(mgr, tid, lambda m: m.prepare_add_partitions({("orders", 0), ("orders", 1)}, clock()), epoch) == 0
    if target == "Ongoing":
        return md
    clock.sleep(1)
    if target == "FencedPrepareAbort":
        with md.lock:
            fence = md.prepare_fence_producer_epoch()
            transit = md.prepare_abort_after_epoch_fence(fence, clock())
        assert mgr.append_transaction_to_log(tid, epoch, transit) == 0
        return md
    end = S.PREPARE_COMMIT if "Commit" in target else S.PREPARE_ABORT
    assert apply(mgr, tid, lambda m: m.prepare_abort_or_commit(end, clock()), epoch) == 0
    if target.startswith("Prepare"):
        return md
    clock.sleep(1)
    assert apply(mgr, tid, lambda m: m.prepare_complete(clock()), epoch) == 0
    assert target.startswith("Complete")
    return md


# ---------------------------------------------------------------------------- ownership and lookups
def test_protocol_is_satisfied_by_the_in_memory_log(tlog):
    assert isinstance(tlog, TransactionLog)


def test_not_coordinator_before_load(tlog, clock):
    mgr = new_manager(tlog, clock, load=False)
    with pytest.raises(ApiError) as err:
        mgr.get_transaction_state("one")
    assert err.value.error is Errors.NOT_COORDINATOR
    with pytest.raises(ApiError):
        mgr.put_transaction_state_if_not_exists(created("one", 1, clock))


def test_put_and_get(tlog, clock):
    mgr = new_manager(tlog, clock)
    assert mgr.get_transaction_state("one") is None
    a = created("one", 1, clock)
    assert mgr.put_transaction_state_if_not_exists(a) == (10, a)
    assert mgr.get_transaction_state("one") == (10, a)
    assert mgr.put_transaction_state_if_not_exists(created("one", 99, clock)).transaction_metadata is a
    assert mgr.owned_partitions() == {0: 10, 1: 10} and mgr.coordinator_epoch_for(0) == 10


class BlockingLog(InMemoryTransactionLog):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.reading = threading.Event()
        self.release = threading.Event()

    def read(self, partition):
        self.reading.set()
        assert self.release.wait(10)
        return super().read(partition)


def test_load_in_progress_then_loaded(clock):
    blog = BlockingLog(num_partitions=2)
    mgr = TransactionStateManager(blog, CONFIG, time_ms=clock)
    t = threading.Thread(target=mgr.load_transactions_for_partition, args=(0, 3))
    t.start()
    assert blog.reading.wait(10)
    assert mgr.is_loading(0)
    with pytest.raises(ApiError) as err:
        mgr.get_transaction_state("one")
    assert err.value.error is Errors.COORDINATOR_LOAD_IN_PROGRESS
    assert mgr.list_transaction_states().error is Errors.COORDINATOR_LOAD_IN_PROGRESS
    blog.release.set()
    t.join()
    assert not mgr.is_loading(0) and mgr.get_transaction_state("one") is None and mgr.coordinator_epoch_for(0) == 3


def test_unload_during_load_discards_the_load(clock):
    blog = BlockingLog(num_partitions=2)
    mgr = TransactionStateManager(blog, CONFIG, time_ms=clock)
    t = threading.Thread(target=mgr.load_transactions_for_partition, args=(0, 0))
    t.start()
    assert blog.reading.wait(10)
    mgr.remove_transactions_for_partition(0)
    assert not mgr.is_loading(0)
    blog.release.set()
    t.join()
    with pytest.raises(ApiError) as err:
        mgr.get_transaction_state("one")
    assert err.value.error is Errors.NOT_COORDINATOR


def test_remove_partition_drops_only_its_ids(tlog, clock):
    mgr = new_manager(tlog, clock)
    mgr.put_transaction_state_if_not_exists(created("b", 5, clock))   # partition 0
    mgr.put_transaction_state_if_not_exists(created("a", 10, clock))  # partition 1
    mgr.remove_transactions_for_partition(0, 10)
    with pytest.raises(ApiError):
        mgr.get_transaction_state("b")
    assert mgr.get_transaction_state("a").transaction_metadata.producer_id == 10


def test_reload_under_a_new_epoch_replaces_the_cache(tlog, clock):
    mgr = new_manager(tlog, clock)
    drive(mgr, "one", 1, clock, "PrepareCommit")
    mgr.load_transactions_for_partition(0, 0)
    pending = mgr.load_transactions_for_partition(0, 1)
    assert [p.transactional_id for p in pending] == ["one"] and pending[0].coordinator_epoch == 1
    assert mgr.coordinator_epoch_for(0) == 1


# ---------------------------------------------------------------------------- appending
def test_append_completes_the_transition(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = init(mgr, "one", 1, clock)
    assert (md.state, md.producer_epoch, md.pending_state) == (S.EMPTY, 0, None)
    assert apply(mgr, "one", lambda m: m.prepare_add_partitions({("topic1", 0), ("topic1", 1)}, clock())) == 0
    assert md.state is S.ONGOING and md.pending_state is None
    records = tlog.read(0)
    assert len(records) == 2
    assert transaction_log.decode_key(records[-1][1], "x") == "one"
    assert transaction_log.decode_value(records[-1][2], "x") == md.to_log_value()


@pytest.mark.parametrize("error,answer", [
    (ApiError(Errors.UNKNOWN_TOPIC_OR_PART), Errors.COORDINATOR_NOT_AVAILABLE),
    (ApiError(Errors.REQUEST_TIMED_OUT), Errors.COORDINATOR_NOT_AVAILABLE),
    (ApiError(Errors._TIMED_OUT), Errors.COORDINATOR_NOT_AVAILABLE),
    (ApiError(Errors.NOT_LEADER_OR_FOLLOWER), Errors.NOT_COORDINATOR),
    (ApiError(Errors.KAFKA_STORAGE_ERROR), Errors.NOT_COORDINATOR),
    (ApiError(Errors._FENCED), Errors.NOT_COORDINATOR),
    (OSError("disk gone"), Errors.NOT_COORDINATOR),
    (ApiError(Errors.MESSAGE_TOO_LARGE), Errors.UNKNOWN_SERVER_ERROR),
    (ApiError(Errors.RECORD_LIST_TOO_LARGE), Errors.UNKNOWN_SERVER_ERROR),
    (ApiError(Errors.INVALID_REQUEST), Errors.INVALID_REQUEST),
])
def test_failed_append_maps_the_error_and_clears_the_pending_state(tlog, clock, error, answer):
    mgr = new_manager(tlog, clock)
    md = init(mgr, "one", 1, clock)
    before = tlog.read(0)
    tlog.fail_next(error)
    assert apply(mgr, "one", lambda m: m.prepare_add_partitions({("topic2", 0)}, clock())) is answer
    assert md.pending_state is None and md.state is S.EMPTY
    assert tlog.read(0) == before


def test_pending_state_kept_when_the_caller_retries(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = init(mgr, "one", 1, clock)
    with md.lock:
        transit = md.prepare_add_partitions({("topic2", 0)}, clock())
    tlog.fail_next(ApiError(Errors.UNKNOWN_TOPIC_OR_PART))
    retry = lambda e: e is Errors.COORDINATOR_NOT_AVAILABLE  # noqa: E731
    assert mgr.append_transaction_to_log("one", 10, transit, retry) is Errors.COORDINATOR_NOT_AVAILABLE
    assert md.pending_state is S.ONGOING
    assert mgr.append_transaction_to_log("one", 10, transit, retry) is Errors.NO_ERROR
    assert md.state is S.ONGOING and md.pending_state is None


def test_append_under_another_coordinator_epoch_is_not_coordinator(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = init(mgr, "one", 1, clock)
    before = tlog.read(0)
    with md.lock:
        transit = md.prepare_add_partitions({("topic1", 0)}, clock())
    assert mgr.append_transaction_to_log("one", 9, transit) is Errors.NOT_COORDINATOR
    assert tlog.read(0) == before
    assert md.pending_state is S.ONGOING  # as in Kafka: a stale caller does not touch the metadata


def test_append_after_unload_or_reload(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = init(mgr, "one", 1, clock)
    with md.lock:
        transit = md.prepare_add_partitions({("topic1", 0)}, clock())
    mgr.remove_transactions_for_partition(0, 10)
    assert mgr.append_transaction_to_log("one", 10, transit) is Errors.NOT_COORDINATOR
    mgr.load_transactions_for_partition(0, 11)
    assert mgr.append_transaction_to_log("one", 10, transit) is Errors.NOT_COORDINATOR
    assert len(tlog.read(0)) == 1


def test_append_while_pending_state_vanished_is_illegal(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = init(mgr, "one", 1, clock)
    with md.lock:
        transit = md.prepare_add_partitions({("topic1", 0)}, clock())
        md.pending_state = None
    with pytest.raises(IllegalStateError, match="does not have a pending state"):
        mgr.append_transaction_to_log("one", 10, transit)


def test_fence_and_dead_are_never_written(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = drive(mgr, "one", 1, clock, "Ongoing")
    n = len(tlog.read(0))
    with md.lock:
        fence = md.prepare_fence_producer_epoch()
    with pytest.raises(IllegalStateError, match="never written"):
        mgr.append_transaction_to_log("one", 10, fence)
    dead = TxnTransitMetadata(1, 1, -1, 0, -1, 1000, S.DEAD, frozenset(), -1, clock())
    with pytest.raises(IllegalStateError, match="never written"):
        mgr.append_transaction_to_log("one", 10, dead)
    assert len(tlog.read(0)) == n


def test_concurrent_appends_from_many_threads(clock):
    tlog = InMemoryTransactionLog(num_partitions=2)
    mgr = new_manager(tlog, clock)
    errors = []

    def worker(i):
        try:
            tid = f"worker-{i}"
            md = init(mgr, tid, 100 + i, clock)
            for n in range(20):
                assert apply(mgr, tid, lambda m: m.prepare_add_partitions({("t", n)}, clock())) == 0
                assert apply(mgr, tid, lambda m: m.prepare_abort_or_commit(S.PREPARE_COMMIT, clock())) == 0
                assert apply(mgr, tid, lambda m: m.prepare_complete(clock())) == 0
            assert md.state is S.COMPLETE_COMMIT
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    reloader = TransactionStateManager(tlog, CONFIG, time_ms=clock)
    for t in threads:
        t.join()
    assert not errors
    for p in range(2):
        reloader.load_transactions_for_partition(p, 11)
    for i in range(8):
        assert reloader.get_transaction_state(f"worker-{i}").transaction_metadata == \
            mgr.get_transaction_state(f"worker-{i}").transaction_metadata


# ---------------------------------------------------------------------------- replay after restart
SITUATIONS = ["Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort",
              "FencedPrepareAbort"]


@pytest.mark.parametrize("situation", SITUATIONS)
def test_restart_in_every_state(tlog, clock, situation):
    mgr = new_manager(tlog, clock)
    md = drive(mgr, "one", 1, clock, situation)
    other = drive(mgr, "two", 2, clock, "CompleteCommit")  # same partition, must be untouched
    clock.sleep(100)

    restarted = TransactionStateManager(tlog, CONFIG, time_ms=clock)
    pending = restarted.load_transactions_for_partition(0, 11)
    restarted.load_transactions_for_partition(1, 11)
    loaded = restarted.get_transaction_state("one").transaction_metadata
    assert loaded == md  # every field, last epoch and previous producer id included
    assert restarted.get_transaction_state("two").transaction_metadata == other
    if situation in ("PrepareCommit", "PrepareAbort", "FencedPrepareAbort"):
        assert len(pending) == 1
        p = pending[0]
        assert (p.transactional_id, p.coordinator_epoch, p.txn_metadata) == ("one", 11, loaded)
        assert p.transaction_metadata is p.txn_metadata
        assert p.result is (TransactionResult.COMMIT if situation == "PrepareCommit" else TransactionResult.ABORT)
        done = S.COMPLETE_COMMIT if situation == "PrepareCommit" else S.COMPLETE_ABORT
        assert p.transit_metadata.txn_state is done and loaded.pending_state is done
        assert p.transit_metadata.txn_last_update_timestamp == clock()
        if situation == "FencedPrepareAbort":
            assert loaded.producer_epoch == 1  # the fenced epoch survived the restart
        # the coordinator writes the markers, then completes the transaction
        assert restarted.append_transaction_to_log("one", 11, p.transit_metadata) is Errors.NO_ERROR
        assert loaded.state is done and not loaded.topic_partitions
        again = TransactionStateManager(tlog, CONFIG, time_ms=clock)
        assert again.load_transactions_for_partition(0, 12) == []
        assert again.get_transaction_state("one").transaction_metadata == loaded
    else:
        assert pending == [] and loaded.pending_state is None


def test_restart_keeps_kip360_retry_information(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = init(mgr, "one", 1, clock)
    assert apply(mgr, "one", lambda m: m.prepare_increment_producer_epoch(1000, ProducerIdAndEpoch(1, 0), clock())) == 0
    assert (md.producer_epoch, md.last_producer_epoch) == (1, 0)
    restarted = new_manager(tlog, clock, epoch=11)
    loaded = restarted.get_transaction_state("one").transaction_metadata
    assert (loaded.producer_epoch, loaded.last_producer_epoch) == (1, 0)
    # the producer's retry of its bump (expected epoch 0) gets the same epoch again
    with loaded.lock:
        transit = loaded.prepare_increment_producer_epoch(1000, ProducerIdAndEpoch(1, 0), clock())
    assert transit.producer_epoch == 1


def test_restart_after_rotation(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = mgr.put_transaction_state_if_not_exists(
        TransactionMetadata("one", 1, producer_epoch=SHORT_MAX_VALUE - 2, txn_timeout_ms=1000)).transaction_metadata
    assert apply(mgr, "one", lambda m: m.prepare_increment_producer_epoch(1000, None, clock())) == 0
    assert md.is_producer_epoch_exhausted
    assert apply(mgr, "one", lambda m: m.prepare_producer_id_rotation(2, 1000, clock(), True)) == 0
    restarted = new_manager(tlog, clock, epoch=11)
    loaded = restarted.get_transaction_state("one").transaction_metadata
    assert loaded == md
    assert (loaded.producer_id, loaded.previous_producer_id, loaded.producer_epoch, loaded.last_producer_epoch) == \
        (2, 1, 0, SHORT_MAX_VALUE - 1)


def test_last_record_wins_and_tombstones_remove(tlog, clock):
    mgr = new_manager(tlog, clock)
    drive(mgr, "one", 1, clock, "CompleteAbort")
    two = drive(mgr, "two", 2, clock, "Ongoing")
    tlog.append(0, transaction_log.encode_key("one"), None)
    restarted = new_manager(tlog, clock, epoch=11)
    assert restarted.get_transaction_state("one") is None
    assert restarted.get_transaction_state("two").transaction_metadata == two
    # a transactional id re-created after its tombstone
    three = init(restarted, "one", 7, clock, epoch=11)
    again = new_manager(tlog, clock, epoch=12)
    assert again.get_transaction_state("one").transaction_metadata == three


def test_replay_of_a_compacted_log_is_the_same(tlog, clock):
    mgr = new_manager(tlog, clock)
    for i, situation in enumerate(SITUATIONS * 3):
        drive(mgr, f"id-{i}", 100 + i, clock, situation)
    mgr.remove_expired_transactional_ids(now=clock() + CONFIG.transactional_id_expiration_ms)
    full = new_manager(tlog, clock, epoch=11, nothing_pending=False)
    for p in range(2):
        tlog.compact(p, drop_tombstones=True)
    compacted = new_manager(tlog, clock, epoch=12, nothing_pending=False)
    for i in range(len(SITUATIONS) * 3):
        a, b = full.get_transaction_state(f"id-{i}"), compacted.get_transaction_state(f"id-{i}")
        assert (a is None and b is None) or a.transaction_metadata == b.transaction_metadata


def _write(tlog, partition, key: bytes, value):
    tlog.append(partition, key, value)


def test_corrupt_record_refuses_the_load(tlog, clock):
    mgr = new_manager(tlog, clock)
    drive(mgr, "one", 1, clock, "Ongoing")
    _write(tlog, 0, transaction_log.encode_key("two"), b"{not json")
    restarted = TransactionStateManager(tlog, CONFIG, time_ms=clock)
    with pytest.raises(CorruptObjectError, match=r"__transaction_state-0@2"):
        restarted.load_transactions_for_partition(0, 11)
    assert not restarted.is_loading(0)
    with pytest.raises(ApiError) as err:
        restarted.get_transaction_state("one")
    assert err.value.error is Errors.NOT_COORDINATOR


def test_newer_record_version_refuses_the_load(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = drive(mgr, "one", 1, clock, "Ongoing")
    obj = md.to_log_value().to_json()
    obj["v"] = 2
    _write(tlog, 0, transaction_log.encode_key("one"), json.dumps(obj).encode())
    with pytest.raises(UnsupportedFormatVersionError, match="upgrade txlake"):
        TransactionStateManager(tlog, CONFIG).load_transactions_for_partition(0, 11)
    _write(tlog, 1, b'{"v":3,"transactional_id":"a"}', None)
    with pytest.raises(UnsupportedFormatVersionError, match="__transaction_state-1@0"):
        TransactionStateManager(tlog, CONFIG).load_transactions_for_partition(1, 11)


def test_record_in_the_wrong_partition_is_corrupt(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = drive(mgr, "one", 1, clock, "Empty")
    _write(tlog, 1, transaction_log.encode_key("one"), transaction_log.encode_value(md.to_log_value()))
    with pytest.raises(CorruptObjectError, match="belongs to partition 0, not 1"):
        TransactionStateManager(tlog, CONFIG).load_transactions_for_partition(1, 11)


def test_epoch_fence_record_loads_as_ongoing_and_dead_as_a_tombstone(tlog, clock):
    fenced = TxnTransitMetadata(1, 1, -1, 4, -1, 1000, S.PREPARE_EPOCH_FENCE, frozenset({("t", 0)}), T0, T0)
    _write(tlog, 0, transaction_log.encode_key("one"), transaction_log.encode_value(fenced.to_log_value()))
    dead = TxnTransitMetadata(2, 2, -1, 0, -1, 1000, S.DEAD, frozenset(), -1, T0)
    _write(tlog, 0, transaction_log.encode_key("two"), transaction_log.encode_value(dead.to_log_value()))
    mgr = new_manager(tlog, clock)
    md = mgr.get_transaction_state("one").transaction_metadata
    assert (md.state, md.producer_epoch, md.topic_partitions) == (S.ONGOING, 4, {("t", 0)})
    assert mgr.get_transaction_state("two") is None
    # the old producer is fenced; the fenced transaction times out and is aborted as usual
    assert mgr.timed_out_transactions(now=T0 + 1001) == [TransactionalIdAndProducerIdEpoch("one", 1, 4)]


def test_load_of_an_unknown_partition(tlog, clock):
    with pytest.raises(ValueError):
        TransactionStateManager(tlog, CONFIG).load_transactions_for_partition(2, 0)


# ---------------------------------------------------------------------------- timeouts
def test_only_ongoing_transactions_past_their_timeout_are_aborted(tlog, clock):
    mgr = new_manager(tlog, clock)
    for tid, pid, state, timeout in [("ongoing", 0, S.ONGOING, 1000), ("not-expiring", 1, S.ONGOING, 10_000),
                                     ("prepare-commit", 2, S.PREPARE_COMMIT, 1000),
                                     ("prepare-abort", 3, S.PREPARE_ABORT, 1000),
                                     ("complete-commit", 4, S.COMPLETE_COMMIT, 1000),
                                     ("complete-abort", 5, S.COMPLETE_ABORT, 1000), ("empty", 6, S.EMPTY, 1000)]:
        mgr.put_transaction_state_if_not_exists(TransactionMetadata(
            tid, pid, producer_epoch=0, txn_timeout_ms=timeout, state=state, txn_start_timestamp=clock(),
            txn_last_update_timestamp=clock()))
    clock.sleep(2000)
    assert mgr.timed_out_transactions() == [TransactionalIdAndProducerIdEpoch("ongoing", 0, 0)]


def test_timeout_boundary_is_strict_and_pending_is_skipped(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = drive(mgr, "one", 1, clock, "Ongoing")
    start = md.txn_start_timestamp
    assert mgr.timed_out_transactions(now=start + 1000) == []
    assert mgr.timed_out_transactions(now=start + 1001) == [("one", 1, 0)]
    with md.lock:
        md.prepare_abort_or_commit(S.PREPARE_COMMIT, clock())
    assert mgr.timed_out_transactions(now=start + 5000) == []


def test_timed_out_transaction_abort_fences_the_producer(tlog, clock):
    """The coordinator's abortTimedOutTransactions path end to end over the manager."""
    mgr = new_manager(tlog, clock)
    md = drive(mgr, "one", 1, clock, "Ongoing")
    clock.sleep(5000)
    [(tid, pid, epoch)] = mgr.timed_out_transactions()
    with md.lock:
        assert md.producer_id == pid and not md.pending_transition_in_progress
        abort = md.prepare_abort_after_epoch_fence(md.prepare_fence_producer_epoch(), clock())
    assert mgr.append_transaction_to_log(tid, 10, abort) == Errors.NO_ERROR
    assert (md.state, md.producer_epoch) == (S.PREPARE_ABORT, epoch + 1)
    assert apply(mgr, tid, lambda m: m.prepare_complete(clock())) == Errors.NO_ERROR
    assert (md.state, md.producer_epoch) == (S.COMPLETE_ABORT, 1)
    # the old producer (epoch 0) now fails KIP-360's check
    with pytest.raises(ApiError) as err, md.lock:
        md.prepare_increment_producer_epoch(1000, ProducerIdAndEpoch(1, 0), clock())
    assert err.value.error is Errors.PRODUCER_FENCED


def test_failed_fence_write_is_flagged_and_not_bumped_again(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = drive(mgr, "one", 1, clock, "Ongoing")
    with md.lock:
        abort = md.prepare_abort_after_epoch_fence(md.prepare_fence_producer_epoch(), clock())
    tlog.fail_next(ApiError(Errors.NOT_LEADER_OR_FOLLOWER))
    assert mgr.append_transaction_to_log("one", 10, abort) is Errors.NOT_COORDINATOR
    md.has_failed_epoch_fence = True  # what TransactionCoordinator.endTransaction does on this failure
    assert (md.state, md.producer_epoch, md.pending_state) == (S.ONGOING, 1, None)
    with md.lock:
        abort = md.prepare_abort_after_epoch_fence(md.prepare_fence_producer_epoch(), clock())
    assert abort.producer_epoch == 1
    assert mgr.append_transaction_to_log("one", 10, abort) is Errors.NO_ERROR


# ---------------------------------------------------------------------------- expiration
def _expiry_setup(tlog, clock, state: TransactionState):
    mgr = new_manager(tlog, clock)
    exp = CONFIG.transactional_id_expiration_ms
    one = TransactionMetadata("one", 1, producer_epoch=0, txn_timeout_ms=1000, state=state,
                              topic_partitions=[("t", 0)] if state is not S.EMPTY else (),
                              txn_start_timestamp=clock() - exp if state is not S.EMPTY else -1,
                              txn_last_update_timestamp=clock() - exp)
    two = TransactionMetadata("two", 2, producer_epoch=0, txn_timeout_ms=1000, txn_last_update_timestamp=clock())
    mgr.put_transaction_state_if_not_exists(one)
    mgr.put_transaction_state_if_not_exists(two)
    return mgr, one, two


@pytest.mark.parametrize("state", [S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT], ids=str)
def test_idle_ids_expire_with_a_tombstone(tlog, clock, state):
    mgr, one, two = _expiry_setup(tlog, clock, state)
    assert mgr.remove_expired_transactional_ids() == ["one"]
    assert tlog.read(0) == [(0, transaction_log.encode_key("one"), None)]
    assert mgr.get_transaction_state("one") is None
    assert mgr.get_transaction_state("two").transaction_metadata is two and two.pending_state is None
    assert one.pending_state is S.DEAD  # a request still holding it answers CONCURRENT_TRANSACTIONS
    assert new_manager(tlog, clock, epoch=11).get_transaction_state("one") is None


@pytest.mark.parametrize("state", [S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT], ids=str)
def test_open_transactions_never_expire(tlog, clock, state):
    mgr, one, two = _expiry_setup(tlog, clock, state)
    assert mgr.remove_expired_transactional_ids() == []
    assert tlog.read(0) == []
    assert mgr.get_transaction_state("one").transaction_metadata is one and one.pending_state is None


def test_expiration_boundary_is_inclusive_and_pending_is_skipped(tlog, clock):
    mgr = new_manager(tlog, clock)
    md = drive(mgr, "one", 1, clock, "CompleteCommit")
    exp = CONFIG.transactional_id_expiration_ms
    last = md.txn_last_update_timestamp
    assert mgr.remove_expired_transactional_ids(now=last + exp - 1) == []
    with md.lock:
        md.prepare_add_partitions({("t", 0)}, clock())
    assert mgr.remove_expired_transactional_ids(now=last + exp) == []
    md.pending_state = None
    assert mgr.remove_expired_transactional_ids(now=last + exp) == ["one"]


def test_expiration_with_a_custom_expiration(tlog, clock):
    mgr = new_manager(tlog, clock)
    drive(mgr, "one", 1, clock, "Empty")
    assert mgr.remove_expired_transactional_ids(now=clock() + 10, expiration_ms=10) == ["one"]


def test_failed_tombstone_keeps_the_id(tlog, clock):
    mgr, one, two = _expiry_setup(tlog, clock, S.COMPLETE_ABORT)
    tlog.fail_next(ApiError(Errors.NOT_LEADER_OR_FOLLOWER))
    assert mgr.remove_expired_transactional_ids() == []
    assert mgr.get_transaction_state("one").transaction_metadata is one and one.pending_state is None
    assert one.state is S.COMPLETE_ABORT


def test_never_initialised_metadata_expires(tlog, clock):
    """Kafka's testTransactionExpirationShouldNotFailWithUninitializedTransactionMetadata."""
    mgr = new_manager(tlog, clock)
    mgr.put_transaction_state_if_not_exists(created("id", 1, clock))  # epoch -1: InitProducerId's write failed
    clock.sleep(CONFIG.transactional_id_expiration_ms + 1)
    assert mgr.remove_expired_transactional_ids() == ["id"]


class OneByOneLog(InMemoryTransactionLog):
    """A log without append_many (the protocol's minimum)."""

    append_many = None  # type: ignore[assignment]

    def append(self, partition, key, value):
        return InMemoryTransactionLog.append_many(self, partition, [(key, value)])


@pytest.mark.parametrize("log_cls", [InMemoryTransactionLog, OneByOneLog])
def test_many_expirations_are_batched(clock, log_cls):
    tlog = log_cls(num_partitions=2)
    mgr = new_manager(tlog, clock)
    ids = [f"id_{i}" for i in range(2 * EXPIRATION_BATCH_SIZE + 500)]
    for i, tid in enumerate(ids):
        mgr.put_transaction_state_if_not_exists(TransactionMetadata(tid, i, producer_epoch=0, txn_timeout_ms=1000,
                                                                    txn_last_update_timestamp=clock()))
    appends = tlog.appends
    removed = mgr.remove_expired_transactional_ids(now=clock() + CONFIG.transactional_id_expiration_ms)
    assert sorted(removed) == sorted(ids)
    n = tlog.appends - appends
    if log_cls is InMemoryTransactionLog:
        per_partition = [sum(1 for t in ids if partition_for(t, 2) == p) for p in range(2)]
        assert n == sum(-(-k // EXPIRATION_BATCH_SIZE) for k in per_partition)
    else:
        assert n == len(ids)
    restarted = new_manager(tlog, clock, epoch=11)
    assert all(restarted.get_transaction_state(t) is None for t in ids)


def test_expiration_scheduler(tlog):
    clock = Clock()
    config = TransactionConfig(transaction_log_num_partitions=2, remove_expired_transactional_ids_interval_ms=5,
                               transactional_id_expiration_ms=1000)
    mgr = TransactionStateManager(tlog, config, time_ms=clock)
    for p in range(2):
        mgr.load_transactions_for_partition(p, 0)
    mgr.put_transaction_state_if_not_exists(TransactionMetadata("one", 1, producer_epoch=0,
                                                                txn_last_update_timestamp=clock()))
    mgr.enable_transactional_id_expiration()
    clock.sleep(1000)
    done = threading.Event()
    for _ in range(400):
        if mgr.get_transaction_state("one") is None:
            done.set()
            break
        threading.Event().wait(0.01)
    mgr.shutdown()
    assert done.is_set()
    with pytest.raises(ApiError):
        mgr.get_transaction_state("one")


# ---------------------------------------------------------------------------- ListTransactions
def test_list_transactions_filtering(tlog, clock):
    mgr = new_manager(tlog, clock)

    def put(tid, pid, state):
        mgr.put_transaction_state_if_not_exists(TransactionMetadata(tid, pid, producer_epoch=0, state=state,
                                                                    txn_start_timestamp=clock(),
                                                                    txn_last_update_timestamp=clock()))

    put("t0", 0, S.ONGOING)
    put("t1", 1, S.ONGOING)
    put("my-special-0", 0, S.ONGOING)
    clock.sleep(1000)
    put("t2", 2, S.PREPARE_COMMIT)
    put("t3", 3, S.PREPARE_ABORT)
    put("your-special-1", 0, S.PREPARE_ABORT)
    clock.sleep(1000)
    put("t4", 4, S.COMPLETE_COMMIT)
    put("t5", 5, S.COMPLETE_ABORT)
    put("t6", 6, S.COMPLETE_ABORT)
    put("t7", 7, S.PREPARE_EPOCH_FENCE)
    put("their-special-2", 7, S.COMPLETE_ABORT)
    clock.sleep(1000)
    put("t8", 8, S.DEAD)

    def listed(**kw):
        result = mgr.list_transaction_states(**kw)
        assert result.error is Errors.NO_ERROR
        return {t.transactional_id for t in result.transaction_states}, set(result.unknown_state_filters)

    special = {"my-special-0", "your-special-1", "their-special-2"}
    everyone = {f"t{i}" for i in range(8)} | special
    assert listed() == (everyone, set())
    assert listed(filter_duration_ms=0) == (everyone, set())
    assert listed(filter_duration_ms=1000) == ({"t0", "t1", "t2", "t3", "my-special-0", "your-special-1"}, set())
    assert listed(filter_duration_ms=2000) == ({"t0", "t1", "my-special-0"}, set())
    assert listed(filter_duration_ms=3000) == (set(), set())
    assert listed(filter_state_names=["Ongoing"]) == ({"t0", "t1", "my-special-0"}, set())
    assert listed(filter_state_names=["Ongoing", "UnknownState"]) == ({"t0", "t1", "my-special-0"}, {"UnknownState"})
    assert listed(filter_state_names=["PrepareCommit", "CompleteCommit"]) == ({"t2", "t4"}, set())
    assert listed(filter_state_names=["UnknownState"]) == (set(), {"UnknownState"})
    assert listed(filter_producer_ids=[5]) == ({"t5"}, set())
    assert listed(filter_producer_ids=[5, 6, 8, 9]) == ({"t5", "t6"}, set())
    assert listed(filter_producer_ids=[4, 5], filter_state_names=["CompleteCommit"]) == ({"t4"}, set())
    assert listed(filter_state_names=["Dead"]) == (set(), set())
    # KIP-1152: the transactional id pattern, with every other filter (Kafka's own cases)
    assert listed(filter_transactional_id_pattern=".*special-.*") == (special, set())
    assert listed(filter_transactional_id_pattern="nothing") == (set(), set())
    assert listed(filter_duration_ms=1000, filter_transactional_id_pattern=".*special-.*") == (
        {"my-special-0", "your-special-1"}, set())
    assert listed(filter_producer_ids=[7], filter_state_names=["CompleteCommit", "CompleteAbort"],
                  filter_transactional_id_pattern=".*special-.*") == ({"their-special-2"}, set())
    # the whole id must match (Java's Matcher.matches), and an empty pattern is no filter
    assert listed(filter_transactional_id_pattern="special") == (set(), set())
    assert listed(filter_transactional_id_pattern="t[0-3]") == ({"t0", "t1", "t2", "t3"}, set())
    assert listed(filter_transactional_id_pattern="") == (everyone, set())
    bad = mgr.list_transaction_states(filter_transactional_id_pattern="(ab(cd")
    assert (bad.error, bad.transaction_states, bad.unknown_state_filters) == (Errors.INVALID_REGULAR_EXPRESSION, [], [])
    assert Errors.INVALID_REGULAR_EXPRESSION == 128


# ---------------------------------------------------------------------------- random operations (hypothesis)
TIDS = ["one", "two", "a"]  # "one" and "two" share partition 0, "a" is in partition 1
PARTS = [("orders", 0), ("orders", 1), ("flights", 3), ("__consumer_offsets", 12)]
RAW_PREPARES = ["increment", "increment-current", "rotation", "add", "commit", "abort", "complete", "dead", "fence",
                "raw-empty", "raw-ongoing", "raw-prepare-commit", "raw-dead", "raw-negative-epoch"]
FAILURES = [ApiError(Errors.NOT_LEADER_OR_FOLLOWER), ApiError(Errors.REQUEST_TIMED_OUT),
            ApiError(Errors.MESSAGE_TOO_LARGE), OSError("storage unavailable")]


class CoordinatorMachine(RuleBasedStateMachine):
    """Drives TransactionMetadata through the coordinator's calls and raw prepare calls.

    After every step: no pending state is left behind, every state change followed
    Kafka's validPreviousStates, the per-state invariants hold, and a fresh manager
    replaying the log has exactly the coordinator's in-memory state.
    """

    def __init__(self):
        super().__init__()
        self.tlog = InMemoryTransactionLog(num_partitions=2)
        self.clock = Clock()
        self.coordinator_epoch = 0
        self.next_pid = 1000
        self.mgr = TransactionStateManager(self.tlog, CONFIG, time_ms=self.clock)
        for p in range(2):
            assert self.mgr.load_transactions_for_partition(p, self.coordinator_epoch) == []

    # -- helpers
    def _md(self, tid) -> TransactionMetadata | None:
        entry = self.mgr.get_transaction_state(tid)
        return None if entry is None else entry.transaction_metadata

    def _append(self, tid, transit) -> Errors:
        md = self._md(tid)
        before = md.state
        error = self.mgr.append_transaction_to_log(tid, self.coordinator_epoch, transit)
        if error is Errors.NO_ERROR:
            assert md.state is transit.txn_state and before in md.state.valid_previous_states, (tid, before, md)
        else:
            assert md.state is before and md.pending_state is None
        return error

    # -- rules
    @rule(ms=st.integers(0, 3000))
    def tick(self, ms):
        self.clock.sleep(ms)

    @rule(errors=st.lists(st.sampled_from(FAILURES), min_size=1, max_size=2))
    def fail_next_appends(self, errors):
        self.tlog.fail_next(*errors)

    @rule(tid=st.sampled_from(TIDS), expected=st.sampled_from(["none", "none", "current", "current", "last", "stale", "other-pid"]),
          start_epoch=st.sampled_from([NO_PRODUCER_EPOCH, NO_PRODUCER_EPOCH, SHORT_MAX_VALUE - 3]))
    def init_producer_id(self, tid, expected, start_epoch):
        """TransactionCoordinator.handleInitProducerId."""
        md = self._md(tid)
        if md is None:
            md = self.mgr.put_transaction_state_if_not_exists(TransactionMetadata(
                tid, self._new_pid(), producer_epoch=start_epoch, txn_timeout_ms=1000,
                txn_last_update_timestamp=self.clock())).transaction_metadata
        with md.lock:
            if md.pending_transition_in_progress:
                return
            ident = {"none": None, "current": ProducerIdAndEpoch(md.producer_id, md.producer_epoch),
                     "last": ProducerIdAndEpoch(md.producer_id, md.last_producer_epoch),
                     "stale": ProducerIdAndEpoch(md.producer_id, max(md.producer_epoch - 2, 0)),
                     "other-pid": ProducerIdAndEpoch(md.producer_id + 5000, 0)}[expected]
            if ident is not None and not md.is_valid_expected_producer_id(ident):
                return  # PRODUCER_FENCED
            if md.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                return  # CONCURRENT_TRANSACTIONS
            if md.state is S.ONGOING:
                event("InitProducerId fences an ongoing transaction")
                fence = md.prepare_fence_producer_epoch()
                transit = md.prepare_abort_after_epoch_fence(fence, self.clock())
                fencing = True
            elif md.is_producer_epoch_exhausted and (ident is None or ident.epoch == md.producer_epoch):
                event("producer id rotation")
                transit = md.prepare_producer_id_rotation(self._new_pid(), 1000, self.clock(), ident is not None)
                fencing = False
            else:
                try:
                    transit = md.prepare_increment_producer_epoch(1000, ident, self.clock())
                except ApiError as exc:
                    assert exc.error is Errors.PRODUCER_FENCED and md.pending_state is None
                    event("InitProducerId fenced")
                    return
                except IllegalStateError:
                    assert md.is_producer_epoch_exhausted and md.pending_state is None
                    return
                fencing = False
        error = self._append(tid, transit)
        if fencing and error is not Errors.NO_ERROR:
            md.has_failed_epoch_fence = True

    def _new_pid(self) -> int:
        self.next_pid += 1
        return self.next_pid

    @rule(tid=st.sampled_from(TIDS), parts=st.sets(st.sampled_from(PARTS), min_size=1, max_size=3))
    def add_partitions(self, tid, parts):
        md = self._md(tid)
        if md is None:
            return
        with md.lock:
            if md.pending_transition_in_progress or md.producer_epoch < 0:
                return
            if md.state not in (S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                return  # CONCURRENT_TRANSACTIONS
            transit = md.prepare_add_partitions(parts, self.clock())
        self._append(tid, transit)

    @rule(tid=st.sampled_from(TIDS), commit=st.booleans(), markers_written=st.booleans())
    def end_txn(self, tid, commit, markers_written):
        md = self._md(tid)
        if md is None:
            return
        with md.lock:
            if md.pending_transition_in_progress or md.state is not S.ONGOING:
                return
            transit = md.prepare_abort_or_commit(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, self.clock())
        if self._append(tid, transit) is Errors.NO_ERROR and markers_written:
            self.complete(tid)

    @rule(tid=st.sampled_from(TIDS))
    def complete(self, tid):
        """Markers written: complete the transaction (TransactionMarkerChannelManager)."""
        md = self._md(tid)
        if md is None:
            return
        with md.lock:
            if md.pending_transition_in_progress or md.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                return
            transit = md.prepare_complete(self.clock())
        self._append(tid, transit)

    @rule()
    def abort_timed_out(self):
        for tid, pid, _epoch in self.mgr.timed_out_transactions():
            event("timed-out transaction aborted")
            md = self._md(tid)
            with md.lock:
                if md.producer_id != pid or md.pending_transition_in_progress:
                    continue
                transit = md.prepare_abort_after_epoch_fence(md.prepare_fence_producer_epoch(), self.clock())
            if self._append(tid, transit) is not Errors.NO_ERROR:
                md.has_failed_epoch_fence = True

    @rule(ms=st.sampled_from([0, 10, 0, 0, 0, CONFIG.transactional_id_expiration_ms]))
    def expire(self, ms):
        before = {t: self._md(t) for t in TIDS}
        removed = self.mgr.remove_expired_transactional_ids(now=self.clock() + ms)
        for tid in removed:
            assert before[tid].state.is_expiration_allowed
            event("transactional id expired")

    @rule(tid=st.sampled_from(TIDS), method=st.sampled_from(RAW_PREPARES), keep=st.booleans())
    def raw_prepare(self, tid, method, keep):
        """Any prepare in any state: Kafka's outcome, and a refused one changes nothing."""
        md = self._md(tid)
        if md is None:
            return
        now = self.clock()
        calls = {
            "increment": lambda: md.prepare_increment_producer_epoch(1000, None, now),
            "increment-current": lambda: md.prepare_increment_producer_epoch(
                1000, ProducerIdAndEpoch(md.producer_id, md.producer_epoch), now),
            "rotation": lambda: md.prepare_producer_id_rotation(self._new_pid(), 1000, now, False),
            "add": lambda: md.prepare_add_partitions({PARTS[0]}, now),
            "commit": lambda: md.prepare_abort_or_commit(S.PREPARE_COMMIT, now),
            "abort": lambda: md.prepare_abort_or_commit(S.PREPARE_ABORT, now),
            "complete": lambda: md.prepare_complete(now),
            "dead": lambda: md.prepare_dead(),
            "fence": lambda: md.prepare_fence_producer_epoch(),
            "raw-empty": lambda: md.prepare_transition_to(S.EMPTY),
            "raw-ongoing": lambda: md.prepare_transition_to(S.ONGOING),
            "raw-prepare-commit": lambda: md.prepare_transition_to(S.PREPARE_COMMIT),
            "raw-dead": lambda: md.prepare_transition_to(S.DEAD),
            "raw-negative-epoch": lambda: md.prepare_transition_to(S.ONGOING, producer_epoch=-3),
        }
        with md.lock:
            if md.pending_transition_in_progress:
                return
            before = (md._key(), md.has_failed_epoch_fence)
            try:
                transit = calls[method]()
            except (IllegalStateError, ValueError, ApiError) as exc:
                event(f"raw {method} refused")
                if isinstance(exc, ApiError):
                    assert exc.error is Errors.PRODUCER_FENCED
                assert (md._key(), md.has_failed_epoch_fence) == before and md.pending_state is None
                return
            event(f"raw {method} allowed")
            assert md._key() == before[0], "a prepare changes nothing but the pending state"
            assert md.state in transit.txn_state.valid_previous_states
            assert md.pending_state is transit.txn_state
            writable = (not method.startswith("raw") and method not in ("fence", "dead")
                        and md.producer_epoch >= 0)
            if not (keep and writable):
                md.pending_state = None  # dropped, as after a failed write
                return
        self._append(tid, transit)

    @rule()
    def restart(self):
        """A new coordinator (epoch + 1) replays the log and completes PrepareCommit/PrepareAbort."""
        self.coordinator_epoch += 1
        mgr = TransactionStateManager(self.tlog, CONFIG, time_ms=self.clock)
        pending = []
        for p in range(2):
            pending += mgr.load_transactions_for_partition(p, self.coordinator_epoch)
        self.mgr = mgr
        for p in pending:
            event("restart completes a prepared transaction")
            assert p.txn_metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)
            if self.mgr.append_transaction_to_log(p.transactional_id, self.coordinator_epoch,
                                                  p.transit_metadata) is not Errors.NO_ERROR:
                assert p.txn_metadata.pending_state is None  # retried by the `complete` rule

    # -- invariants
    @invariant()
    def states_are_legal(self):
        for tid in TIDS:
            md = self._md(tid)
            if md is None:
                continue
            assert md.pending_state is None, (tid, md)
            event(f"state {md.state}")
            assert md.state not in (S.DEAD, S.PREPARE_EPOCH_FENCE)
            assert NO_PRODUCER_EPOCH <= md.producer_epoch <= SHORT_MAX_VALUE
            if md.producer_epoch == NO_PRODUCER_EPOCH:
                assert md.state is S.EMPTY
            if md.state is S.EMPTY:
                assert not md.topic_partitions and md.txn_start_timestamp == -1
            if md.state in (S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT):
                assert md.topic_partitions and md.txn_start_timestamp != -1
            if md.state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                assert not md.topic_partitions and md.txn_start_timestamp != -1
            if md.state in (S.COMPLETE_ABORT, S.PREPARE_ABORT, S.COMPLETE_COMMIT, S.PREPARE_COMMIT, S.ONGOING):
                assert md.producer_epoch >= 0

    @invariant()
    def replay_reproduces_memory(self):
        replay = TransactionStateManager(self.tlog, CONFIG, time_ms=self.clock)
        for p in range(2):
            replay.load_transactions_for_partition(p, 10_000)
        for tid in TIDS:
            mine, theirs = self._md(tid), replay.get_transaction_state(tid)
            if mine is None:
                assert theirs is None, tid
                continue
            if theirs is None:
                # only a metadata whose very first write (InitProducerId) failed exists in memory alone
                assert mine.state is S.EMPTY and mine.producer_epoch in (NO_PRODUCER_EPOCH, SHORT_MAX_VALUE - 3)
                continue
            loaded = theirs.transaction_metadata
            if mine.has_failed_epoch_fence and loaded != mine:
                event("failed epoch fence")
                # Kafka bumps the epoch in memory before the fence is durable; all else matches
                assert mine.state is S.ONGOING and loaded.state is S.ONGOING
                assert mine.producer_epoch == loaded.producer_epoch + 1
                mine_at_log_epoch = TransactionMetadata.from_log_value(tid, mine.to_log_value())
                mine_at_log_epoch.producer_epoch = loaded.producer_epoch
                mine_at_log_epoch.last_producer_epoch = loaded.last_producer_epoch
                assert mine_at_log_epoch == loaded
                continue
            assert loaded == mine, (tid, loaded, mine)


TestCoordinatorMachine = CoordinatorMachine.TestCase
TestCoordinatorMachine.settings = settings(max_examples=500, stateful_step_count=50, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
