"""One partition's log as the writer appends to it (the writer's side of Kafka's ``UnifiedLog``
and ``Partition``).

A :class:`PartitionLog` owns what the writer decides alone for a partition: the log end
offset (queued batches included, so offsets are assigned at append time), the producer
state (:class:`~.producer_state.ProducerStateManager`), the validation of every appended
batch (Kafka's ``LogValidator`` and ``UnifiedLog.analyzeAndValidateProducerState``), the
KIP-890 verification of a transactional batch that opens a transaction, the COMMIT/ABORT
markers with the aborted-transaction entries they make, and the first unstable offset the
LSO is computed from. An accepted batch comes back as a :class:`~.group_commit.PendingBatch`
for the group commit, which makes many partitions' batches durable in one object and one
catalog commit; the high watermark, the LSO and the committed aborted-transaction index
then live in the catalog's ``PartitionState``, where readers in every process see them.

Not thread-safe: the broker calls it under its append lock (offsets, producer state and the
commit queue change together).
"""

from __future__ import annotations

import struct
from concurrent.futures import Future
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa

from txlake.catalog.topic_config import LONG_MAX, cleanup_policies
from txlake.formats.records import (CONTROL_ABORT, CONTROL_COMMIT, HEADER_TYPE, PAYLOAD_SCHEMA, TIMESTAMP_CREATE_TIME,
                                    TIMESTAMP_LOG_APPEND_TIME)

from .errors import ApiError, Errors
from .group_commit import PendingBatch, now_ms
from .producer_state import ProducerStateManager, increment_sequence
from .requests import ProduceBatch, ProduceResult, TxnMarker

#: a record without a timestamp (Kafka's ``RecordBatch.NO_TIMESTAMP``): never validated
NO_TIMESTAMP = -1

__all__ = ["PartitionLog", "TxnVerifier"]

#: KIP-890 partition verification: ``(producer_id, producer_epoch, topic, partition) -> Errors``
#: (NO_ERROR when the transaction coordinator has the partition in the producer's transaction)
TxnVerifier = Callable[[int, int, str, int], Errors]


class PartitionLog:
    """The writer's log of one partition (Kafka's ``UnifiedLog`` as its leader appends).

    Args:
        topic / partition: the partition.
        log_end_offset: the next offset to assign (the high watermark when the writer loads
            its state: nothing is queued then).
        producers: the partition's producer state (empty for a new partition).
    """

    def __init__(self, topic: str, partition: int, log_end_offset: int = 0,
                 producers: ProducerStateManager | None = None):
        self.topic = topic
        self.partition = partition
        self.log_end_offset = log_end_offset
        self.producers = producers if producers is not None else ProducerStateManager(topic, partition)

    def append(self, batch: ProduceBatch, config: Mapping[str, str],
               verifier: TxnVerifier | None = None) -> PendingBatch | ProduceResult:
        """Validate ``batch`` and assign its offsets (Kafka's ``UnifiedLog.appendAsLeader``).

        Checks, in Kafka's order: the batch's size against the topic's ``max.message.bytes``
        (MESSAGE_TOO_LARGE; the record batch as the client sent it, or the Arrow bytes of an
        in-process batch), a record without key on a compacted topic (INVALID_RECORD, Kafka's
        ``LogValidator``), a CreateTime timestamp outside ``message.timestamp.before.max.ms`` /
        ``after.max.ms`` (INVALID_TIMESTAMP, KIP-937), then for an idempotent or transactional
        producer its epoch and sequence (INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER,
        INVALID_TXN_STATE: :meth:`ProducerStateManager.check_append`) and, for a transactional
        batch that opens a transaction here, ``verifier`` (KIP-890: the coordinator must have
        the partition in the transaction, else its error, e.g. INVALID_TXN_STATE).

        Args:
            batch: the records (at least one) with their producer fields.
            config: the topic's effective config (``effective_config`` of its overrides).
            verifier: the transaction coordinator's KIP-890 check; None checks nothing.

        Returns:
            A :class:`PendingBatch` (its offsets from :attr:`log_end_offset`, which moves past
            it, and the producer state updated) for the caller to queue for the commit; or a
            :class:`ProduceResult` that answers at once: an error (nothing changed), or a
            duplicate of a batch already appended (NO_ERROR with the original base offset,
            ``duplicate`` True; KIP-98).
        """
        n = batch.records.num_rows
        assert n > 0, "a batch holds at least one record"
        size = batch.records.nbytes if batch.size_in_bytes is None else batch.size_in_bytes
        max_bytes = int(config["max.message.bytes"])
        if size > max_bytes:
            return ProduceResult(Errors.MESSAGE_TOO_LARGE, message=(
                f"The batch of {n} records for {batch.topic} [{batch.partition}] is {size} bytes, "
                f"larger than max.message.bytes={max_bytes} of the topic"))
        if "compact" in cleanup_policies(config) and batch.records.column("key").null_count:
            # Kafka's LogValidator: a compacted topic keeps the latest record per key, so every record needs one
            return ProduceResult(Errors.INVALID_RECORD, message=(
                f"Compacted topic cannot accept message without key in topic partition {batch.topic}-{batch.partition}."))
        timestamp_error = _timestamp_error(batch, config)
        if timestamp_error is not None:
            return ProduceResult(Errors.INVALID_TIMESTAMP, message=timestamp_error)
        if batch.producer_id >= 0:
            last_seq = increment_sequence(batch.base_sequence, n - 1)
            try:
                dup = self.producers.check_append(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                                                  last_seq, batch.is_transactional)
            except ApiError as exc:
                return ProduceResult(exc.error, message=exc.message)
            if dup is not None:
                return ProduceResult(Errors.NO_ERROR, dup.first_offset, -1, duplicate=True)
            if batch.is_transactional and verifier is not None:
                entry = self.producers.last_entry(batch.producer_id)
                if entry is None or entry.current_txn_first_offset is None:
                    verdict = verifier(batch.producer_id, batch.producer_epoch, batch.topic, batch.partition)
                    if verdict != Errors.NO_ERROR:
                        return ProduceResult(verdict, message=(
                            f"{batch.topic} [{batch.partition}] is not part of producer {batch.producer_id}'s "
                            "transaction at the coordinator (KIP-890 verification)"))
        now = now_ms()
        ts_type = TIMESTAMP_LOG_APPEND_TIME if config["message.timestamp.type"] == "LogAppendTime" else TIMESTAMP_CREATE_TIME
        base = self.log_end_offset
        self.log_end_offset += n
        if batch.producer_id >= 0:
            max_ts = now if ts_type == TIMESTAMP_LOG_APPEND_TIME else int(_timestamps(batch).max())
            self.producers.update(batch.producer_id, batch.producer_epoch, batch.base_sequence, last_seq, base,
                                  base + n - 1, max_ts, batch.is_transactional)
        return PendingBatch(batch, base, ts_type, now, Future())

    def append_marker(self, marker: TxnMarker, urgent: bool = True) -> PendingBatch | Errors:
        """Validate and append a COMMIT or ABORT control batch (Kafka's ``UnifiedLog.appendAsLeader``
        of a marker, ``ProducerStateManager`` ``appendEndTxnMarker``).

        Returns:
            INVALID_PRODUCER_EPOCH (an older producer epoch) or TRANSACTION_COORDINATOR_FENCED
            (an older coordinator epoch), nothing changed; else the :class:`PendingBatch` of the
            one-record control batch at :attr:`log_end_offset`, the producer's transaction closed,
            and for an ABORT of a transaction that wrote here the first offset of that
            transaction (``aborted_first_offset``: the aborted-transaction index entry the
            commit records). ``urgent`` False lets it wait for the writer's linger.
        """
        try:
            self.producers.check_marker(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch)
        except ApiError as exc:
            return exc.error
        now = now_ms()
        control_type = CONTROL_COMMIT if marker.committed else CONTROL_ABORT
        records = pa.Table.from_arrays(
            [pa.array([now], pa.int64()), pa.array([struct.pack(">hh", 0, control_type)], pa.binary()),
             pa.array([struct.pack(">hi", 0, marker.coordinator_epoch)], pa.binary()), pa.nulls(1, HEADER_TYPE)],
            schema=PAYLOAD_SCHEMA)
        batch = ProduceBatch(self.topic, self.partition, records, marker.producer_id, marker.producer_epoch, -1,
                             is_transactional=True, is_control=True, control_type=control_type,
                             coordinator_epoch=marker.coordinator_epoch, urgent=urgent)
        base = self.log_end_offset
        self.log_end_offset += 1
        first = self.producers.complete_txn(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch, now)
        return PendingBatch(batch, base, TIMESTAMP_CREATE_TIME, now, Future(),
                            first if not marker.committed else None)

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest transaction open on this partition (the LSO is the
        smaller of it and the high watermark), or None when none is open."""
        return self.producers.first_unstable_offset()

    def remove_expired_producers(self, now: int, expiration_ms: int) -> list[int]:
        """Forget the producers idle for ``expiration_ms`` with no transaction open (Kafka's
        ``UnifiedLog.removeExpiredProducers``); returns their ids, ascending."""
        return self.producers.remove_expired_producers(now, expiration_ms)

    def snapshot_rows(self) -> list[dict]:
        """The producer state as snapshot rows (:meth:`ProducerStateManager.snapshot_rows`)."""
        return self.producers.snapshot_rows()


def _timestamp_error(batch: ProduceBatch, config: Mapping[str, str]) -> str | None:
    """Kafka's ``LogValidator.validateTimestamp`` (KIP-937): on a CreateTime topic, a record
    timestamp more than ``message.timestamp.before.max.ms`` before now or more than
    ``message.timestamp.after.max.ms`` after it makes the batch INVALID_TIMESTAMP (-1, "no
    timestamp", is never checked). Returns the message, or None when the batch is valid."""
    if config["message.timestamp.type"] != "CreateTime" or batch.is_control:
        return None
    before, after = int(config["message.timestamp.before.max.ms"]), int(config["message.timestamp.after.max.ms"])
    if before >= LONG_MAX and after >= LONG_MAX:
        return None
    ts = _timestamps(batch)
    low = int(ts.min())
    if low == NO_TIMESTAMP:
        ts = ts[ts != NO_TIMESTAMP]
        if len(ts) == 0:
            return None
        low = int(ts.min())
    high = int(ts.max())
    now = now_ms()
    if now - low > before:
        return (f"Timestamp {low} of a message in {batch.topic}-{batch.partition} is out of range: it is more than "
                f"message.timestamp.before.max.ms={before} before the broker's time {now}")
    if high - now > after:
        return (f"Timestamp {high} of a message in {batch.topic}-{batch.partition} is out of range: it is more than "
                f"message.timestamp.after.max.ms={after} after the broker's time {now}")
    return None


def _timestamps(batch: ProduceBatch) -> np.ndarray:
    """The batch's record timestamps (ms; the column is not nullable) as numpy int64, without a
    copy for a one-chunk column. numpy, not pyarrow.compute: a compute call releases the GIL,
    and taking it back waits for the switch interval (5 ms) while another thread -- the
    flushers, the application -- runs Python code; a bulk load validates hundreds of batches."""
    return batch.records.column("timestamp").to_numpy()
