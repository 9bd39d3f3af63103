"""TransactionMetadata (Kafka's state machine) and the ``__transaction_state`` record format.

Expected outcomes follow Kafka's TransactionMetadata / TransactionState and their tests
(TransactionMetadataTest, TransactionLogTest), transaction version 0/1.
"""

from __future__ import annotations

import json

import pytest

from txlake.engine.errors import ApiError, Errors
from txlake.engine.transaction_metadata import (NO_PRODUCER_EPOCH, NO_PRODUCER_ID, SHORT_MAX_VALUE,
                                                VALID_PREVIOUS_STATES, IllegalStateError, ProducerIdAndEpoch,
                                                TransactionMetadata, TransactionResult, TransactionState,
                                                TxnTransitMetadata, is_epoch_exhausted)
from txlake.formats import transaction_log
from txlake.formats.errors import CorruptObjectError, UnsupportedFormatVersionError
from txlake.formats.transaction_log import TxnLogValue

S = TransactionState
PID = 23423
TID = "txnlId"
NOW = 1_700_000_000_000
ALL_STATES = list(TransactionState)


def md(state=S.EMPTY, *, epoch=1, last_epoch=NO_PRODUCER_EPOCH, partitions=(), start=-1, pid=PID,
       prev=NO_PRODUCER_ID, timeout=30_000, update=NOW) -> TransactionMetadata:
    if start == -1 and state in (S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
        start = NOW - 10
    return TransactionMetadata(TID, pid, previous_producer_id=prev, producer_epoch=epoch, last_producer_epoch=last_epoch,
                               txn_timeout_ms=timeout, state=state, topic_partitions=partitions,
                               txn_start_timestamp=start, txn_last_update_timestamp=update)


def snapshot(m: TransactionMetadata):
    return (m._key(), m.pending_state, m.has_failed_epoch_fence)


# ---------------------------------------------------------------------------- states
def test_state_ids_and_names_are_kafkas():
    expected = {S.EMPTY: (0, "Empty"), S.ONGOING: (1, "Ongoing"), S.PREPARE_COMMIT: (2, "PrepareCommit"),
                S.PREPARE_ABORT: (3, "PrepareAbort"), S.COMPLETE_COMMIT: (4, "CompleteCommit"),
                S.COMPLETE_ABORT: (5, "CompleteAbort"), S.DEAD: (6, "Dead"),
                S.PREPARE_EPOCH_FENCE: (7, "PrepareEpochFence")}
    assert set(expected) == set(TransactionState)
    for state, (state_id, name) in expected.items():
        assert state.id == state_id and state.state_name == name and str(state) == name
        assert TransactionState.from_id(state_id) is state
        assert TransactionState.from_name(name) is state
    assert tuple(s.state_name for s in TransactionState) == transaction_log.STATE_NAMES
    assert TransactionState.from_name("Unknown") is None
    with pytest.raises(IllegalStateError, match="Unknown transaction state id 8"):
        TransactionState.from_id(8)


def test_valid_previous_states_are_kafkas():
    assert VALID_PREVIOUS_STATES == {
        S.EMPTY: {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.ONGOING: {S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.PREPARE_COMMIT: {S.ONGOING},
        # Kafka 4.x: a transaction version 2 abort of a transaction that added no partition
        S.PREPARE_ABORT: {S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT},
        S.COMPLETE_COMMIT: {S.PREPARE_COMMIT},
        S.COMPLETE_ABORT: {S.PREPARE_ABORT},
        S.DEAD: {S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT},
        S.PREPARE_EPOCH_FENCE: {S.ONGOING},
    }
    for state in TransactionState:
        assert state.valid_previous_states == VALID_PREVIOUS_STATES[state]


def test_expiration_allowed_only_when_no_transaction_is_open():
    assert {s for s in TransactionState if s.is_expiration_allowed} == {S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}


def test_transaction_result_values_are_control_types():
    assert TransactionResult.ABORT.value == 0 and TransactionResult.COMMIT.value == 1


@pytest.mark.parametrize("epoch,exhausted", [(-1, False), (0, False), (32764, False), (32765, False),
                                             (32766, True), (32767, True)])
def test_epoch_exhaustion_boundary(epoch, exhausted):
    assert is_epoch_exhausted(epoch) is exhausted
    assert md(epoch=epoch).is_producer_epoch_exhausted is exhausted


# ---------------------------------------------------------------------------- every transition
@pytest.mark.parametrize("current", ALL_STATES, ids=str)
@pytest.mark.parametrize("target", ALL_STATES, ids=str)
def test_prepare_transition_to_every_pair(current, target):
    m = md(current, partitions=[("t", 0)] if current not in (S.EMPTY,) else ())
    before = snapshot(m)
    if current in target.valid_previous_states:
        transit = m.prepare_transition_to(target)
        assert m.pending_state is target and transit.txn_state is target
        assert transit.previous_producer_id == PID
        assert m._key() == before[0]  # nothing but the pending state changed
    else:
        with pytest.raises(IllegalStateError, match="not a valid previous state"):
            m.prepare_transition_to(target)
        assert snapshot(m) == before


PREPARES = {
    "increment_epoch": lambda m: m.prepare_increment_producer_epoch(30_000, None, NOW),
    "rotation": lambda m: m.prepare_producer_id_rotation(PID + 1, 30_000, NOW, False),
    "add_partitions": lambda m: m.prepare_add_partitions({("t", 1)}, NOW),
    "commit": lambda m: m.prepare_abort_or_commit(S.PREPARE_COMMIT, NOW),
    "abort": lambda m: m.prepare_abort_or_commit(S.PREPARE_ABORT, NOW),
    "complete": lambda m: m.prepare_complete(NOW),
    "dead": lambda m: m.prepare_dead(),
    "fence": lambda m: m.prepare_fence_producer_epoch(),
}
# Kafka's outcome of each prepare method in each state: the target state, or None = IllegalStateException
OUTCOMES = {
    "increment_epoch": {S.EMPTY: S.EMPTY, S.COMPLETE_COMMIT: S.EMPTY, S.COMPLETE_ABORT: S.EMPTY},
    "rotation": {S.EMPTY: S.EMPTY, S.COMPLETE_COMMIT: S.EMPTY, S.COMPLETE_ABORT: S.EMPTY},
    "add_partitions": {S.EMPTY: S.ONGOING, S.ONGOING: S.ONGOING, S.COMPLETE_COMMIT: S.ONGOING,
                       S.COMPLETE_ABORT: S.ONGOING},
    "commit": {S.ONGOING: S.PREPARE_COMMIT},
    "abort": {S.ONGOING: S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE: S.PREPARE_ABORT},
    "complete": {S.PREPARE_COMMIT: S.COMPLETE_COMMIT, S.PREPARE_ABORT: S.COMPLETE_ABORT},
    "dead": {S.EMPTY: S.DEAD, S.COMPLETE_COMMIT: S.DEAD, S.COMPLETE_ABORT: S.DEAD},
    "fence": {S.ONGOING: S.PREPARE_EPOCH_FENCE},
}


@pytest.mark.parametrize("state", ALL_STATES, ids=str)
@pytest.mark.parametrize("method", list(PREPARES))
def test_each_prepare_method_in_each_state(method, state):
    m = md(state, partitions=[("t", 0)] if state is not S.EMPTY else ())
    before = snapshot(m)
    target = OUTCOMES[method].get(state)
    if target is None:
        with pytest.raises(IllegalStateError):
            PREPARES[method](m)
        assert snapshot(m) == before
    else:
        transit = PREPARES[method](m)
        assert transit.txn_state is target and m.pending_state is target


@pytest.mark.parametrize("first", list(PREPARES))
def test_a_pending_transition_blocks_every_other(first):
    state = next(iter(OUTCOMES[first]))
    m = md(state, partitions=[("t", 0)] if state is not S.EMPTY else ())
    PREPARES[first](m)
    assert m.pending_transition_in_progress
    for name, prepare in PREPARES.items():
        before = snapshot(m)
        with pytest.raises(IllegalStateError):
            prepare(m)
        assert snapshot(m) == before, name


# ---------------------------------------------------------------------------- InitProducerId (epochs)
def test_initialize_epoch():
    m = md(epoch=NO_PRODUCER_EPOCH)
    m.complete_transition_to(m.prepare_increment_producer_epoch(30_000, None, NOW))
    assert (m.producer_id, m.producer_epoch, m.last_producer_epoch, m.state) == (PID, 0, NO_PRODUCER_EPOCH, S.EMPTY)
    assert m.pending_state is None


def test_normal_epoch_bump():
    m = md(epoch=735)
    m.complete_transition_to(m.prepare_increment_producer_epoch(30_000, None, NOW))
    assert (m.producer_id, m.producer_epoch, m.last_producer_epoch) == (PID, 736, NO_PRODUCER_EPOCH)


def test_bump_not_allowed_when_epochs_exhausted():
    m = md(epoch=SHORT_MAX_VALUE - 1)
    assert m.is_producer_epoch_exhausted
    with pytest.raises(IllegalStateError, match="Cannot allocate any more producer epochs"):
        m.prepare_increment_producer_epoch(30_000, None, NOW)
    assert m.pending_state is None


def test_epoch_bump_tolerates_time_going_back_and_resets_start():
    m = md(epoch=1, start=1)
    m.complete_transition_to(m.prepare_increment_producer_epoch(30_000, ProducerIdAndEpoch(PID, 1), NOW - 1))
    assert (m.producer_epoch, m.last_producer_epoch) == (2, 1)
    assert m.txn_start_timestamp == -1 and m.txn_last_update_timestamp == NOW - 1


def test_epoch_bump_takes_the_new_timeout():
    m = md(epoch=4, timeout=30_000)
    m.complete_transition_to(m.prepare_increment_producer_epoch(45_000, None, NOW))
    assert m.txn_timeout_ms == 45_000


def test_rotate_producer_id():
    m = md(epoch=SHORT_MAX_VALUE - 1)
    m.complete_transition_to(m.prepare_producer_id_rotation(9893, 30_000, NOW, record_last_epoch=True))
    assert (m.producer_id, m.previous_producer_id, m.producer_epoch, m.last_producer_epoch) == \
        (9893, PID, 0, SHORT_MAX_VALUE - 1)


def test_rotation_tolerates_time_going_back_and_can_forget_the_last_epoch():
    m = md(epoch=1, start=1)
    m.complete_transition_to(m.prepare_producer_id_rotation(PID + 1, 30_000, NOW - 1, record_last_epoch=False))
    assert (m.producer_id, m.producer_epoch, m.last_producer_epoch) == (PID + 1, 0, NO_PRODUCER_EPOCH)
    assert m.txn_start_timestamp == -1 and m.txn_last_update_timestamp == NOW - 1


@pytest.mark.parametrize("state", [S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT], ids=str)
def test_rotation_refused_with_a_transaction_open(state):
    m = md(state, epoch=SHORT_MAX_VALUE - 1, partitions=[("t", 0)])
    with pytest.raises(IllegalStateError, match="Cannot rotate producer ids while a transaction is still pending"):
        m.prepare_producer_id_rotation(9893, 30_000, NOW, False)


def test_negative_producer_id_or_epoch_is_an_illegal_argument():
    m = md()
    with pytest.raises(ValueError, match="Illegal new producer id -5"):
        m.prepare_producer_id_rotation(-5, 30_000, NOW, False)
    with pytest.raises(ValueError, match="Illegal new producer epoch -1"):
        m.prepare_transition_to(S.EMPTY, producer_epoch=-1)
    assert m.pending_state is None
    fresh = md(epoch=NO_PRODUCER_EPOCH)
    assert fresh.prepare_dead().producer_epoch == NO_PRODUCER_EPOCH  # Dead may keep epoch -1


# KIP-360: InitProducerId naming the producer's current identity
def test_kip360_newly_created_metadata_accepts_any_expected_epoch():
    m = md(epoch=NO_PRODUCER_EPOCH)
    m.complete_transition_to(m.prepare_increment_producer_epoch(30_000, ProducerIdAndEpoch(777, 735), NOW))
    assert (m.producer_id, m.producer_epoch, m.last_producer_epoch) == (PID, 0, NO_PRODUCER_EPOCH)


def test_kip360_current_epoch_bumps_and_remembers_it():
    m = md(epoch=735)
    m.complete_transition_to(m.prepare_increment_producer_epoch(30_000, ProducerIdAndEpoch(PID, 735), NOW))
    assert (m.producer_epoch, m.last_producer_epoch) == (736, 735)


def test_kip360_last_epoch_is_a_retry_answered_without_a_bump():
    m = md(epoch=735, last_epoch=734)
    m.complete_transition_to(m.prepare_increment_producer_epoch(30_000, ProducerIdAndEpoch(PID, 734), NOW))
    assert (m.producer_epoch, m.last_producer_epoch) == (735, 734)


def test_kip360_bare_epoch_is_accepted_like_kafkas_optional_short():
    m = md(epoch=735, last_epoch=734)
    m.complete_transition_to(m.prepare_increment_producer_epoch(30_000, 734, NOW))
    assert (m.producer_epoch, m.last_producer_epoch) == (735, 734)


def test_kip360_fenced_epoch():
    m = md(epoch=735, last_epoch=734, prev=PID)
    with pytest.raises(ApiError) as err:
        m.prepare_increment_producer_epoch(30_000, ProducerIdAndEpoch(PID, 733), NOW)
    assert err.value.error is Errors.PRODUCER_FENCED
    assert m.pending_state is None


def test_kip360_other_producer_id_is_fenced():
    m = md(epoch=735)
    with pytest.raises(ApiError) as err:
        m.prepare_increment_producer_epoch(30_000, ProducerIdAndEpoch(PID + 7, 735), NOW)
    assert err.value.error is Errors.PRODUCER_FENCED


def test_kip360_retry_after_rotation_with_previous_producer_id():
    # the producer had epoch 32766 of PID; the coordinator rotated to PID+1 but the answer was lost
    m = md(epoch=SHORT_MAX_VALUE - 1)
    m.complete_transition_to(m.prepare_producer_id_rotation(PID + 1, 30_000, NOW, record_last_epoch=True))
    retry = ProducerIdAndEpoch(PID, SHORT_MAX_VALUE - 1)
    assert m.is_valid_expected_producer_id(retry)
    transit = m.prepare_increment_producer_epoch(30_000, retry, NOW + 1)
    assert (transit.producer_id, transit.producer_epoch) == (PID + 1, 0)  # the same answer again
    m.complete_transition_to(transit)
    # not exhausted: the previous producer id is no identity
    assert not m.is_valid_expected_producer_id(ProducerIdAndEpoch(PID, 5))


# ---------------------------------------------------------------------------- transactions
def test_add_partitions_start_time_set_once():
    m = md(epoch=1, start=NOW)
    m.complete_transition_to(m.prepare_add_partitions({("topic1", 0)}, NOW - 1))
    assert m.topic_partitions == {("topic1", 0)} and m.state is S.ONGOING
    assert m.txn_start_timestamp == NOW - 1 and m.txn_last_update_timestamp == NOW - 1
    m.complete_transition_to(m.prepare_add_partitions({("topic2", 0)}, NOW - 2))
    assert m.topic_partitions == {("topic1", 0), ("topic2", 0)}
    assert m.txn_start_timestamp == NOW - 1 and m.txn_last_update_timestamp == NOW - 2
    assert (m.producer_id, m.producer_epoch, m.last_producer_epoch) == (PID, 1, NO_PRODUCER_EPOCH)


@pytest.mark.parametrize("end", [S.PREPARE_COMMIT, S.PREPARE_ABORT], ids=str)
def test_end_txn_keeps_identity_and_start(end):
    m = md(S.ONGOING, epoch=1, start=1, partitions=[("t", 0)])
    m.complete_transition_to(m.prepare_abort_or_commit(end, NOW - 1))
    assert m.state is end and (m.producer_id, m.producer_epoch, m.last_producer_epoch) == (PID, 1, NO_PRODUCER_EPOCH)
    assert m.txn_start_timestamp == 1 and m.txn_last_update_timestamp == NOW - 1
    assert m.topic_partitions == {("t", 0)}


def test_end_txn_needs_a_prepare_state():
    with pytest.raises(IllegalStateError):
        md(S.ONGOING).prepare_abort_or_commit(S.COMPLETE_COMMIT, NOW)


@pytest.mark.parametrize("prepared,done", [(S.PREPARE_COMMIT, S.COMPLETE_COMMIT), (S.PREPARE_ABORT, S.COMPLETE_ABORT)],
                         ids=str)
def test_complete_clears_partitions_keeps_epochs(prepared, done):
    m = md(prepared, epoch=1, last_epoch=0, start=1, partitions=[("t", 0), ("u", 3)])
    m.complete_transition_to(m.prepare_complete(NOW - 1))
    assert m.state is done and not m.topic_partitions
    assert (m.producer_id, m.producer_epoch, m.last_producer_epoch) == (PID, 1, 0)
    assert m.txn_start_timestamp == 1 and m.txn_last_update_timestamp == NOW - 1


def test_full_transaction_cycle_then_next_transaction():
    m = md(epoch=NO_PRODUCER_EPOCH)
    m.complete_transition_to(m.prepare_increment_producer_epoch(30_000, None, NOW))
    for n in range(3):
        m.complete_transition_to(m.prepare_add_partitions({("a", n)}, NOW + 10 * n + 1))
        m.complete_transition_to(m.prepare_add_partitions({("b", n)}, NOW + 10 * n + 2))
        m.complete_transition_to(m.prepare_abort_or_commit(S.PREPARE_COMMIT if n % 2 == 0 else S.PREPARE_ABORT,
                                                           NOW + 10 * n + 3))
        m.complete_transition_to(m.prepare_complete(NOW + 10 * n + 4))
        assert m.state is (S.COMPLETE_COMMIT if n % 2 == 0 else S.COMPLETE_ABORT)
        assert m.txn_start_timestamp == NOW + 10 * n + 1
    assert m.producer_epoch == 0


def test_remove_partition_only_while_writing_markers():
    m = md(S.PREPARE_COMMIT, partitions=[("t", 0), ("t", 1)])
    m.remove_partition(("t", 0))
    assert m.topic_partitions == {("t", 1)}
    for state in (S.EMPTY, S.ONGOING, S.COMPLETE_ABORT):
        with pytest.raises(IllegalStateError, match="whose txn marker has been sent"):
            md(state, partitions=[("t", 0)]).remove_partition(("t", 0))


# ---------------------------------------------------------------------------- epoch fence
def test_fence_then_abort_under_the_bumped_epoch():
    m = md(S.ONGOING, epoch=5, last_epoch=4, partitions=[("t", 0)])
    fence = m.prepare_fence_producer_epoch()
    assert (fence.txn_state, fence.producer_epoch, fence.last_producer_epoch) == (S.PREPARE_EPOCH_FENCE, 6, -1)
    assert m.pending_state is S.PREPARE_EPOCH_FENCE and m.producer_epoch == 5
    abort = m.prepare_abort_after_epoch_fence(fence, NOW)
    assert (abort.txn_state, abort.producer_epoch, abort.last_producer_epoch) == (S.PREPARE_ABORT, 6, -1)
    assert abort.topic_partitions == {("t", 0)}
    m.complete_transition_to(abort)
    assert (m.state, m.producer_epoch, m.last_producer_epoch) == (S.PREPARE_ABORT, 6, -1)
    m.complete_transition_to(m.prepare_complete(NOW + 1))
    assert (m.state, m.producer_epoch) == (S.COMPLETE_ABORT, 6)


def test_fence_after_epochs_exhausted_reaches_short_max():
    m = md(S.ONGOING, epoch=SHORT_MAX_VALUE - 1)
    fence = m.prepare_fence_producer_epoch()
    assert fence.producer_epoch == SHORT_MAX_VALUE and fence.last_producer_epoch == NO_PRODUCER_EPOCH
    m.complete_transition_to(m.prepare_abort_after_epoch_fence(fence, NOW))
    assert m.producer_id == PID and m.producer_epoch == SHORT_MAX_VALUE


def test_fence_at_short_max_keeps_the_epoch(caplog):
    """KAFKA-20090: no overflow, no exception -- the transaction can still be aborted."""
    m = md(S.ONGOING, epoch=SHORT_MAX_VALUE, partitions=[("t", 0)])
    fence = m.prepare_fence_producer_epoch()
    assert (fence.txn_state, fence.producer_epoch) == (S.PREPARE_EPOCH_FENCE, SHORT_MAX_VALUE)
    assert "Short.MaxValue" in caplog.text
    m.complete_transition_to(m.prepare_abort_after_epoch_fence(fence, NOW))
    m.complete_transition_to(m.prepare_complete(NOW + 1))
    assert (m.state, m.producer_epoch) == (S.COMPLETE_ABORT, SHORT_MAX_VALUE)
    # the next InitProducerId must rotate the producer id
    assert m.is_producer_epoch_exhausted
    m.complete_transition_to(m.prepare_producer_id_rotation(PID + 1, 30_000, NOW + 2, True))
    assert (m.producer_id, m.producer_epoch, m.last_producer_epoch) == (PID + 1, 0, SHORT_MAX_VALUE)


@pytest.mark.parametrize("state", [S.COMPLETE_COMMIT, S.COMPLETE_ABORT, S.EMPTY], ids=str)
def test_fence_only_from_ongoing(state):
    with pytest.raises(IllegalStateError):
        md(state, epoch=SHORT_MAX_VALUE - 1).prepare_fence_producer_epoch()


def test_failed_fence_write_does_not_bump_twice():
    m = md(S.ONGOING, epoch=5, partitions=[("t", 0)])
    abort = m.prepare_abort_after_epoch_fence(m.prepare_fence_producer_epoch(), NOW)
    # the PrepareAbort write failed: the coordinator clears the pending state and flags the fence
    m.pending_state = None
    m.has_failed_epoch_fence = True
    assert m.producer_epoch == 6 and m.state is S.ONGOING
    fence2 = m.prepare_fence_producer_epoch()
    assert fence2.producer_epoch == 6
    abort2 = m.prepare_abort_after_epoch_fence(fence2, NOW + 1)
    assert abort2.producer_epoch == abort.producer_epoch == 6
    m.complete_transition_to(abort2)
    m.complete_transition_to(m.prepare_complete(NOW + 2))
    assert not m.has_failed_epoch_fence


def test_abort_after_fence_needs_a_pending_fence():
    m = md(S.ONGOING, partitions=[("t", 0)])
    fake = TxnTransitMetadata(PID, PID, -1, 2, -1, 30_000, S.PREPARE_EPOCH_FENCE, frozenset(), 1, 1)
    with pytest.raises(IllegalStateError, match="no pending epoch fence"):
        m.prepare_abort_after_epoch_fence(fake, NOW)


# ---------------------------------------------------------------------------- complete_transition_to checks
def test_complete_without_pending_state():
    m = md()
    with pytest.raises(IllegalStateError, match="does not have a pending state"):
        m.complete_transition_to(m.prepare_no_transit())


def _replace(transit: TxnTransitMetadata, **changes) -> TxnTransitMetadata:
    return TxnTransitMetadata(**{**transit.__dict__, **changes})


BAD_COMPLETIONS = [
    # (state, prepare, mutation of the transit)
    (S.EMPTY, "increment_epoch", {"producer_epoch": 7}),               # neither same, +1, nor 0 with new id
    (S.EMPTY, "increment_epoch", {"topic_partitions": frozenset({("t", 0)})}),
    (S.EMPTY, "increment_epoch", {"txn_start_timestamp": 5}),
    (S.EMPTY, "rotation", {"producer_id": PID}),                       # epoch 0 without a new producer id
    (S.ONGOING, "add_partitions", {"producer_epoch": 2}),
    (S.ONGOING, "add_partitions", {"producer_id": PID + 1}),
    (S.ONGOING, "add_partitions", {"topic_partitions": frozenset({("t", 1)})}),  # drops ("t", 0)
    (S.ONGOING, "add_partitions", {"txn_timeout_ms": 1}),
    (S.ONGOING, "commit", {"topic_partitions": frozenset()}),
    (S.ONGOING, "commit", {"txn_start_timestamp": 99}),
    (S.ONGOING, "abort", {"txn_timeout_ms": 1}),
    (S.ONGOING, "abort", {"producer_epoch": 9}),
    (S.PREPARE_COMMIT, "complete", {"txn_start_timestamp": -1}),
    (S.PREPARE_COMMIT, "complete", {"producer_epoch": 9}),
    (S.PREPARE_ABORT, "complete", {"txn_timeout_ms": 1}),
    (S.ONGOING, "commit", {"txn_state": S.PREPARE_ABORT}),             # not the pending state
]


@pytest.mark.parametrize("state,prepare,changes", BAD_COMPLETIONS)
def test_complete_refuses_inconsistent_snapshots(state, prepare, changes):
    m = md(state, epoch=1, partitions=[("t", 0)] if state is not S.EMPTY else ())
    transit = PREPARES[prepare](m)
    before = m._key()
    with pytest.raises(IllegalStateError, match="due to unexpected metadata"):
        m.complete_transition_to(_replace(transit, **changes))
    assert m._key() == before  # nothing applied; the pending state stays, as in Kafka
    m.complete_transition_to(transit)  # the genuine snapshot still completes
    assert m.state is transit.txn_state


def test_epoch_fence_and_dead_are_never_completed():
    m = md(S.ONGOING, partitions=[("t", 0)])
    with pytest.raises(IllegalStateError):
        m.complete_transition_to(m.prepare_fence_producer_epoch())
    m2 = md(S.COMPLETE_COMMIT)
    with pytest.raises(IllegalStateError, match="was being expired"):
        m2.complete_transition_to(m2.prepare_dead())


def test_prepare_no_transit_sets_nothing_pending():
    m = md(S.ONGOING, epoch=3, partitions=[("t", 0)])
    t = m.prepare_no_transit()
    assert m.pending_state is None
    assert (t.txn_state, t.producer_epoch, t.topic_partitions) == (S.ONGOING, 3, frozenset({("t", 0)}))


def test_metadata_equality_ignores_pending_state():
    a, b = md(S.ONGOING, partitions=[("t", 0)]), md(S.ONGOING, partitions=[("t", 0)])
    assert a == b
    a.prepare_abort_or_commit(S.PREPARE_COMMIT, NOW)
    assert a == b
    b.producer_epoch += 1
    assert a != b


# ---------------------------------------------------------------------------- log values
@pytest.mark.parametrize("state", [s for s in ALL_STATES], ids=str)
def test_log_value_round_trip_in_every_state(state):
    m = md(state, epoch=7, last_epoch=6, prev=PID - 1,
           partitions=[("orders", 2), ("orders", 0), ("x", 1)] if state is not S.EMPTY else ())
    m.next_producer_id = 42
    value = m.to_log_value()
    assert value.state == state.state_name and value.last_producer_epoch == 6
    assert value.topic_partitions == (() if state is S.EMPTY else (("orders", 0), ("orders", 2), ("x", 1)))
    data = transaction_log.encode_value(value)
    back = TransactionMetadata.from_log_value(TID, transaction_log.decode_value(data, "mem://x"))
    assert back == m and back.pending_state is None


def test_empty_state_partitions_are_not_written_and_ignored_when_read():
    t = TxnTransitMetadata(PID, PID, -1, 1, -1, 1000, S.EMPTY, frozenset({("t", 0)}), -1, NOW)
    with pytest.raises(IllegalStateError, match="not expected to have any partitions"):
        t.to_log_value()
    value = TxnLogValue(PID, -1, -1, 1, -1, 1000, "Empty", (("t", 0),), -1, NOW)
    assert TransactionMetadata.from_log_value(TID, value).topic_partitions == set()


# ---------------------------------------------------------------------------- record format
def _value(**changes) -> TxnLogValue:
    base = dict(producer_id=4000, previous_producer_id=-1, next_producer_id=-1, producer_epoch=3,
                last_producer_epoch=-1, txn_timeout_ms=60_000, state="Ongoing",
                topic_partitions=(("orders", 0), ("orders", 2)), txn_start_timestamp=NOW,
                txn_last_update_timestamp=NOW + 42)
    base.update(changes)
    return TxnLogValue(**base)


def test_value_is_compact_versioned_json():
    data = transaction_log.encode_value(_value())
    assert data == (b'{"v":1,"producer_id":4000,"previous_producer_id":-1,"next_producer_id":-1,"producer_epoch":3,'
                    b'"last_producer_epoch":-1,"txn_timeout_ms":60000,"state":"Ongoing",'
                    b'"topic_partitions":[["orders",0],["orders",2]],"txn_start_timestamp":1700000000000,'
                    b'"txn_last_update_timestamp":1700000000042}')
    assert transaction_log.decode_value(data, "loc") == _value()


@pytest.mark.parametrize("tid", ["copier-1", "", "café", "交易", "😀 emoji", 'quote"back\\slash', "x" * 1000])
def test_key_round_trip_and_determinism(tid):
    key = transaction_log.encode_key(tid)
    assert key == transaction_log.encode_key(tid)
    assert json.loads(key) == {"v": 1, "transactional_id": tid}
    assert transaction_log.decode_key(key, "loc") == tid
    assert key.startswith(b'{"v":1,')


def test_key_of_a_lone_surrogate_is_refused():
    with pytest.raises(ValueError, match="lone surrogate"):
        transaction_log.encode_key("bad\ud800")
    with pytest.raises(ValueError):
        transaction_log.encode_key(5)


def test_tombstone_decodes_to_none():
    assert transaction_log.decode_value(None, "loc") is None


def test_partitions_are_sorted_and_deduplicated():
    v = _value(topic_partitions=[["b", 1], ("a", 3), ("b", 1), ["a", 0]])
    assert v.topic_partitions == (("a", 0), ("a", 3), ("b", 1))


def test_unknown_fields_are_ignored():
    obj = json.loads(transaction_log.encode_value(_value()))
    obj["future_tagged_field"] = [1, 2]
    assert transaction_log.decode_value(json.dumps(obj).encode(), "loc") == _value()


@pytest.mark.parametrize("data,message", [
    (b"", "not UTF-8 JSON"),
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"{truncated", "not UTF-8 JSON"),
    (b"[1,2]", "not a JSON object"),
    (b'{"producer_id":1}', "no format version"),
    (b'{"v":"1"}', "unreadable format version"),
    (b'{"v":true}', "unreadable format version"),
    (b'{"v":1,"producer_id":1}', "lacks"),
])
def test_malformed_values_are_corrupt_naming_the_location(data, message):
    with pytest.raises(CorruptObjectError, match=f"__transaction_state-3@17: .*{message}") as err:
        transaction_log.decode_value(data, "__transaction_state-3@17")
    assert err.value.location == "__transaction_state-3@17"


@pytest.mark.parametrize("field,bad", [
    ("state", "Finished"), ("producer_epoch", 40000), ("producer_epoch", -2), ("producer_epoch", True),
    ("producer_id", -7), ("producer_id", 1.5), ("txn_timeout_ms", 2**31), ("txn_start_timestamp", "now"),
    ("topic_partitions", [["t"]]), ("topic_partitions", [["t", -1]]), ("topic_partitions", [["", 0]]),
    ("topic_partitions", "t-0"), ("topic_partitions", [{"t": 0, "u": 1}]), ("last_producer_epoch", None),
])
def test_invalid_field_values_are_corrupt(field, bad):
    obj = json.loads(transaction_log.encode_value(_value()))
    obj[field] = bad
    with pytest.raises(CorruptObjectError, match="s3://b/x"):
        transaction_log.decode_value(json.dumps(obj).encode(), "s3://b/x")


@pytest.mark.parametrize("version", [2, 99, 0, -1])
def test_unknown_value_version_is_refused(version):
    obj = json.loads(transaction_log.encode_value(_value()))
    obj["v"] = version
    with pytest.raises(UnsupportedFormatVersionError, match=f"loc: transaction-log value format version {version}"):
        transaction_log.decode_value(json.dumps(obj).encode(), "loc")


def test_unknown_key_version_and_bad_keys():
    with pytest.raises(UnsupportedFormatVersionError, match="key format version 2"):
        transaction_log.decode_key(b'{"v":2,"transactional_id":"a"}', "loc")
    with pytest.raises(CorruptObjectError, match="no string \"transactional_id\""):
        transaction_log.decode_key(b'{"v":1,"transactional_id":7}', "loc")
    with pytest.raises(CorruptObjectError, match="not bytes"):
        transaction_log.decode_key(None, "loc")


def test_encode_value_needs_a_txn_log_value():
    with pytest.raises(ValueError):
        transaction_log.encode_value({"state": "Empty"})
    with pytest.raises(ValueError, match="unknown transaction state"):
        _value(state="Bogus")
