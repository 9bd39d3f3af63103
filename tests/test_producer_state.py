"""ProducerStateManager against Kafka's rules (KIP-98 / KIP-360), including a property test
against a simple reference model of "every batch lands exactly once, in order"."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txlake.engine.errors import ApiError, Errors
from txlake.engine.producer_state import INT32_MAX, ProducerStateManager, increment_sequence, in_sequence


def append(psm, pid, epoch, first_seq, count, next_offset):
    """Validate then append like the broker; returns (base_offset, duplicate)."""
    last_seq = increment_sequence(first_seq, count - 1)
    dup = psm.check_append(pid, epoch, first_seq, last_seq, False)
    if dup is not None:
        return dup.first_offset, True
    psm.update(pid, epoch, first_seq, last_seq, next_offset, next_offset + count - 1, 0, False)
    return next_offset, False


def test_increment_sequence_wraps_like_kafka():
    assert increment_sequence(5, 3) == 8
    assert increment_sequence(INT32_MAX, 1) == 0
    assert increment_sequence(INT32_MAX - 1, 3) == 1
    assert in_sequence(INT32_MAX, 0) and in_sequence(4, 5) and not in_sequence(4, 6)


def test_in_order_duplicate_gap_overlap_epoch():
    psm = ProducerStateManager("t", 0)
    assert append(psm, 1, 0, 0, 5, 0) == (0, False)        # seq 0..4 at offsets 0..4
    assert append(psm, 1, 0, 5, 5, 5) == (5, False)        # seq 5..9
    assert append(psm, 1, 0, 0, 5, 10) == (0, True)        # exact retry: original offsets
    with pytest.raises(ApiError) as gap:
        append(psm, 1, 0, 11, 1, 10)
    assert gap.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "11 (incoming seq. number), 9 (current end sequence number)" in gap.value.message
    with pytest.raises(ApiError) as overlap:
        append(psm, 1, 0, 3, 5, 10)                         # partial overlap with 0..4 / 5..9
    assert overlap.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    with pytest.raises(ApiError) as new_epoch_bad:
        append(psm, 1, 1, 10, 1, 10)                        # a new epoch must start at 0
    assert new_epoch_bad.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert append(psm, 1, 1, 0, 2, 10) == (10, False)       # new epoch at 0
    with pytest.raises(ApiError) as stale:
        append(psm, 1, 0, 10, 1, 12)
    assert stale.value.error == Errors.INVALID_PRODUCER_EPOCH
    with pytest.raises(ApiError):
        append(psm, 1, 0, 0, 5, 12)                         # old-epoch retry is not a duplicate any more


def test_only_last_five_batches_are_remembered():
    psm = ProducerStateManager("t", 0)
    for i in range(7):
        append(psm, 9, 0, i, 1, i)
    assert append(psm, 9, 0, 2, 1, 7) == (2, True)         # 5th newest: duplicate
    with pytest.raises(ApiError) as old:
        append(psm, 9, 0, 1, 1, 7)                          # 6th newest: forgotten -> out of order
    assert old.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_unknown_producer_may_start_anywhere_and_wraps():
    psm = ProducerStateManager("t", 0)
    assert append(psm, 3, 0, INT32_MAX - 1, 2, 0) == (0, False)   # no state: any sequence (KIP-360)
    assert append(psm, 3, 0, 0, 3, 2) == (2, False)               # wraps from 2^31-1 to 0
    assert append(psm, 3, 0, INT32_MAX - 1, 2, 5) == (0, True)


def test_batch_spanning_the_wrap():
    psm = ProducerStateManager("t", 0)
    append(psm, 4, 0, INT32_MAX - 2, 1, 0)
    assert append(psm, 4, 0, INT32_MAX - 1, 4, 1) == (1, False)    # seq 2^31-2 .. 1
    assert psm.last_entry(4).last_seq == 1
    assert append(psm, 4, 0, 2, 1, 5) == (5, False)


def test_snapshot_rows_round_trip():
    psm = ProducerStateManager("t", 3)
    for i in range(7):
        append(psm, 1, 2, i * 2, 2, i * 2)
    append(psm, 8, 0, 0, 1, 14)
    again = ProducerStateManager("t", 3)
    again.load_rows(psm.snapshot_rows())
    assert append(again, 1, 2, 12, 2, 15) == (12, True)
    assert append(again, 1, 2, 14, 1, 15) == (15, False)
    with pytest.raises(ApiError):
        append(again, 1, 2, 2, 2, 16)


# ---- property test: a retrying producer against a reference model ---------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(1, 4)),
        st.tuples(st.just("retry"), st.integers(1, 8)),
        st.tuples(st.just("bump"), st.just(0)),
    ),
    min_size=1, max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, start=st.sampled_from([0, INT32_MAX - 6]))
def test_retrying_producer_lands_each_batch_exactly_once(ops, start):
    """Model: the log holds each distinct batch once, in send order. A retry of one of the
    last 5 batches of the current epoch returns its original offset; any other retry fails
    (older epoch: INVALID_PRODUCER_EPOCH, else OUT_OF_ORDER_SEQUENCE_NUMBER) and writes nothing."""
    psm = ProducerStateManager("t", 0)
    sent = []           # (epoch, first_seq, count, offset) in send order
    log_end = 0
    epoch, seq = 0, start
    for op, arg in ops:
        if op == "send":
            offset, dup = append(psm, 1, epoch, seq, arg, log_end)
            assert (offset, dup) == (log_end, False)
            sent.append((epoch, seq, arg, offset))
            log_end += arg
            seq = increment_sequence(seq, arg)
        elif op == "bump":
            epoch, seq = epoch + 1, 0
        elif sent:
            b_epoch, b_seq, b_count, b_offset = sent[-min(arg, len(sent))]
            broker_epoch = sent[-1][0]  # the broker learns of a bump only from the next batch
            recent = [b for b in sent if b[0] == broker_epoch][-5:]
            try:
                result = append(psm, 1, b_epoch, b_seq, b_count, log_end)
            except ApiError as exc:
                assert (b_epoch, b_seq, b_count, b_offset) not in recent
                assert exc.error == (Errors.INVALID_PRODUCER_EPOCH if b_epoch < broker_epoch else Errors.OUT_OF_ORDER_SEQUENCE_NUMBER)
            else:
                assert (b_epoch, b_seq, b_count, b_offset) in recent
                assert result == (b_offset, True)
    # the log holds exactly the distinct batches, contiguous, in order
    assert [s[3] for s in sent] == sorted(s[3] for s in sent)
    assert sum(s[2] for s in sent) == log_end


def test_a_sequence_of_an_ended_transaction_reused_at_the_same_epoch_is_out_of_order():
    """A marker of the producer's epoch (transaction version 1) keeps its last batches (Kafka's
    ``ProducerAppendInfo.appendEndTxnMarker``), and a retry of a batch of the still open
    transaction is a duplicate. But a transactional batch that carries the epoch and sequence
    range of a batch of an ENDED transaction is no retry: it is librdkafka reusing a purged
    record's sequence (issue 20, docs/reliability.md). Kafka answers it as that batch's
    duplicate (its offsets, nothing written: the record is lost); txlake answers
    OUT_OF_ORDER_SEQUENCE_NUMBER, naming the batch and the expected sequence
    (tests/test_differential_faults.py shows both brokers). A marker of a new epoch
    (transaction version 2's bump at EndTxn) forgets the batches: sequence 0 appends."""
    psm = ProducerStateManager("t", 0)
    psm.update(4, 0, 0, 0, 0, 0, 0, True)                   # A: seq 0 at offset 0, transaction open
    assert psm.check_append(4, 0, 1, 1, True) is None
    psm.update(4, 0, 1, 1, 1, 1, 0, True)                   # B: seq 1 at offset 1
    dup = psm.check_append(4, 0, 1, 1, True)                # B retried inside its transaction: a duplicate
    assert (dup.first_seq, dup.last_seq, dup.first_offset, dup.last_offset) == (1, 1, 1, 1)
    assert psm.complete_txn(4, 0, 0, 0) == 0                # ABORT marker at 2, same epoch
    with pytest.raises(ApiError) as raised:                 # C with B's sequence
        psm.check_append(4, 0, 1, 1, True)
    assert raised.value.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert str(raised.value) == ("Sequence numbers 1..1 of producer 4 (epoch 0) in partition t-0 were used by the "
                                 "batch at offsets 1..1, in a transaction that has ended: the producer reused them "
                                 "without bumping its epoch (expected sequence 2)")
    assert psm.producers[4].current_txn_first_offset is None  # nothing appended: no transaction opened
    assert psm.check_append(4, 0, 2, 2, True) is None       # the next sequence still appends
    psm.update(4, 0, 2, 2, 3, 3, 0, True)                   # at offset 3: a new transaction
    with pytest.raises(ApiError):                           # A's range, of the ended transaction
        psm.check_append(4, 0, 0, 0, True)
    dup = psm.check_append(4, 0, 2, 2, True)                # the open transaction's batch retried
    assert (dup.first_offset, dup.last_offset) == (3, 3)
    psm.complete_txn(4, 1, 0, 0)                            # a marker of epoch 1
    assert psm.check_append(4, 1, 0, 0, True) is None
    assert list(psm.producers[4].batches) == []
