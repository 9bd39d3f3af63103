"""engine/partition_log.PartitionLog alone: offsets, validation, producer state, markers, LSO source.

The broker-level tests (test_broker, test_transactions, test_kip360, ...) cover the same rules
through Produce; these pin down that a refused batch changes nothing of the log and what an
accepted one and a marker hand to the group commit.
"""

from __future__ import annotations

from txlake.catalog.topic_config import effective_config
from txlake.engine.errors import Errors
from txlake.engine.group_commit import PendingBatch
from txlake.engine.partition_log import PartitionLog
from txlake.engine.requests import ProduceBatch, ProduceResult, TxnMarker
from txlake.formats.records import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME

from helpers import payload

CONFIG = effective_config({})
PID, EPOCH = 7, 0


def _state(log: PartitionLog) -> tuple:
    return log.log_end_offset, log.snapshot_rows()


def test_an_accepted_batch_takes_its_offsets_from_the_log_end_offset():
    log = PartitionLog("t", 1, log_end_offset=5)
    first = log.append(ProduceBatch("t", 1, payload(3)), CONFIG)
    second = log.append(ProduceBatch("t", 1, payload(2)), effective_config({"message.timestamp.type": "LogAppendTime"}))
    assert isinstance(first, PendingBatch) and isinstance(second, PendingBatch)
    assert (first.base_offset, first.timestamp_type, first.aborted_first_offset) == (5, TIMESTAMP_CREATE_TIME, None)
    assert (second.base_offset, second.timestamp_type) == (8, TIMESTAMP_LOG_APPEND_TIME)
    assert not first.future.done() and log.log_end_offset == 10
    assert log.snapshot_rows() == []  # no producer id: no producer state


def test_a_refused_batch_changes_nothing():
    log = PartitionLog("t", 0, log_end_offset=3)
    assert isinstance(log.append(ProduceBatch("t", 0, payload(2), PID, EPOCH, 0), CONFIG), PendingBatch)
    before = _state(log)
    refused = [
        (log.append(ProduceBatch("t", 0, payload(1)), effective_config({"max.message.bytes": "10"})),
         Errors.MESSAGE_TOO_LARGE),
        (log.append(ProduceBatch("t", 0, payload(1).set_column(1, "key", [[None]])),
                    effective_config({"cleanup.policy": "compact"})), Errors.INVALID_RECORD),
        (log.append(ProduceBatch("t", 0, payload(1), PID, EPOCH, 5), CONFIG), Errors.OUT_OF_ORDER_SEQUENCE_NUMBER),
    ]
    assert [(type(r), r.error) for r, _ in refused] == [(ProduceResult, e) for _, e in refused]
    assert refused[1][0].message == "Compacted topic cannot accept message without key in topic partition t-0."
    assert _state(log) == before


def test_a_retried_batch_answers_its_original_offsets():
    log = PartitionLog("t", 0)
    log.append(ProduceBatch("t", 0, payload(3), PID, EPOCH, 0), CONFIG)
    log.append(ProduceBatch("t", 0, payload(2), PID, EPOCH, 3), CONFIG)
    before = _state(log)
    retry = log.append(ProduceBatch("t", 0, payload(3), PID, EPOCH, 0), CONFIG)
    assert retry == ProduceResult(Errors.NO_ERROR, 0, -1, duplicate=True)
    assert _state(log) == before


def test_kip890_verification_runs_for_the_batch_that_opens_the_transaction_only():
    asked = []
    verdicts = iter([Errors.INVALID_TXN_STATE, Errors.NO_ERROR])

    def verifier(producer_id: int, producer_epoch: int, topic: str, partition: int) -> Errors:
        asked.append((producer_id, producer_epoch, topic, partition))
        return next(verdicts)

    log = PartitionLog("t", 2, log_end_offset=10)
    refused = log.append(ProduceBatch("t", 2, payload(1), PID, EPOCH, 0, is_transactional=True), CONFIG, verifier)
    assert (refused.error, log.log_end_offset, log.first_unstable_offset()) == (Errors.INVALID_TXN_STATE, 10, None)
    opened = log.append(ProduceBatch("t", 2, payload(2), PID, EPOCH, 0, is_transactional=True), CONFIG, verifier)
    more = log.append(ProduceBatch("t", 2, payload(1), PID, EPOCH, 2, is_transactional=True), CONFIG, verifier)
    assert (opened.base_offset, more.base_offset) == (10, 12)
    assert asked == [(PID, EPOCH, "t", 2)] * 2  # not for the batch of an open transaction
    assert log.first_unstable_offset() == 10


def test_an_abort_marker_closes_the_transaction_and_carries_its_aborted_index_entry():
    log = PartitionLog("t", 0, log_end_offset=4)
    log.append(ProduceBatch("t", 0, payload(2), PID, EPOCH, 0, is_transactional=True), CONFIG)
    assert log.append_marker(TxnMarker(PID, EPOCH - 1, 3, False, (("t", 0),))) == Errors.INVALID_PRODUCER_EPOCH
    assert (log.log_end_offset, log.first_unstable_offset()) == (6, 4)
    marker = log.append_marker(TxnMarker(PID, EPOCH, 3, False, (("t", 0),)), urgent=False)
    assert isinstance(marker, PendingBatch)
    assert (marker.base_offset, marker.aborted_first_offset, marker.batch.is_control, marker.batch.urgent) == (6, 4, True, False)
    assert (marker.batch.topic, marker.batch.partition, marker.batch.records.num_rows) == ("t", 0, 1)
    assert (log.log_end_offset, log.first_unstable_offset()) == (7, None)
    assert log.append_marker(TxnMarker(PID, EPOCH, 2, True, (("t", 0),))) == Errors.TRANSACTION_COORDINATOR_FENCED
    commit = log.append_marker(TxnMarker(PID, EPOCH, 3, True, (("t", 0),)))
    assert (commit.base_offset, commit.aborted_first_offset) == (7, None)  # a COMMIT makes no index entry
