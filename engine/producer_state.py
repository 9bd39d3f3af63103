"""Producer state per partition: Kafka's ``ProducerStateManager`` and ``ProducerAppendInfo``.

For every producer id that wrote to a partition the broker keeps its epoch and the
metadata of its last 5 batches (KIP-98). A new batch is checked against it before it is
appended:

* an exact retry of one of the last 5 batches (same epoch, same sequence range) is a
  *duplicate*: the original offsets are returned and nothing is written -- unless the batch
  is transactional and the retained one belongs to a transaction that has already ended
  (a COMMIT/ABORT marker followed it): no client retries a batch of an ended transaction,
  so that is a producer reusing sequence numbers without an epoch bump (librdkafka does
  after an abort purged records of unknown outcome, docs/reliability.md), and the answer
  is OUT_OF_ORDER_SEQUENCE_NUMBER. Kafka answers it as a duplicate, so the new records are
  acknowledged at the old, aborted ones' offsets and never written (a silent loss); this
  is txlake's one deliberate difference in duplicate detection (docs/server.md);
* an older epoch -> INVALID_PRODUCER_EPOCH;
* a newer epoch must start at sequence 0 -> else OUT_OF_ORDER_SEQUENCE_NUMBER;
* the same epoch must continue at ``last_seq + 1`` (with wrap-around from 2^31-1 to 0)
  -> else OUT_OF_ORDER_SEQUENCE_NUMBER (a gap or a partial overlap);
* a producer with no state left (it expired after ``producer.id.expiration.ms`` without a
  write) may write any sequence (Kafka's behaviour since KIP-360); a transactional write
  is still verified with the transaction coordinator first (KIP-890), so a zombie whose
  state expired can never write into a transaction that has ended;
* a non-transactional batch from a producer with a transaction open on the partition
  -> INVALID_TXN_STATE.

Transactions (KIP-98): a transactional batch opens the producer's transaction on the
partition (its first offset is kept: the first unstable offset is the smallest of them);
a COMMIT/ABORT marker closes it. A marker with an older producer epoch ->
INVALID_PRODUCER_EPOCH; from an older coordinator epoch -> TRANSACTION_COORDINATOR_FENCED
(Kafka's ``ProducerAppendInfo.appendEndTxnMarker``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from .errors import ApiError, Errors

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1
#: Kafka's ``ProducerStateEntry.NUM_BATCHES_TO_RETAIN``.
NUM_BATCHES_TO_RETAIN = 5


def _wall_ms() -> int:
    return int(time.time() * 1000)


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's ``DefaultRecordBatch.incrementSequence``: add with wrap-around past 2^31-1."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """True if ``next_seq`` directly follows ``last_seq`` (wrapping from 2^31-1 to 0)."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


@dataclass(frozen=True)
class BatchMetadata:
    """Sequence and offset range of one appended batch; timestamp in ms."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass
class ProducerStateEntry:
    """What a partition remembers of one producer id (Kafka's ``ProducerStateEntry``)."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: deque = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    coordinator_epoch: int = -1
    last_timestamp: int = -1
    current_txn_first_offset: int | None = None
    #: the broker's clock (ms) at the producer's last write here, or when this process loaded
    #: the entry; expiry counts from it (not persisted)
    last_write_ms: int = field(default_factory=lambda: _wall_ms())

    @property
    def last_seq(self) -> int:
        """Last sequence of the newest batch, or -1 with no batch."""
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        """Last offset of the newest batch, or -1 with no batch."""
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The retained batch with exactly this epoch and sequence range, if any."""
        if epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None

    def in_current_txn(self, batch: BatchMetadata) -> bool:
        """True if ``batch`` (one of :attr:`batches`) belongs to the producer's transaction
        still open on this partition; False once a COMMIT/ABORT marker has followed it."""
        return self.current_txn_first_offset is not None and batch.first_offset >= self.current_txn_first_offset

    def add_batch(self, epoch: int, batch: BatchMetadata) -> None:
        """Record an appended batch; a new epoch forgets the old epoch's batches."""
        if epoch != self.producer_epoch:
            self.batches.clear()
            self.producer_epoch = epoch
        self.batches.append(batch)
        self.last_timestamp = batch.timestamp


class ProducerStateManager:
    """Producer state of one partition (Kafka's ``ProducerStateManager``).

    Not thread-safe: the broker serialises appends per partition.
    """

    def __init__(self, topic: str, partition: int):
        self.topic = topic
        self.partition = partition
        self.producers: dict[int, ProducerStateEntry] = {}

    def check_append(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
                     is_transactional: bool) -> BatchMetadata | None:
        """Validate a batch before it is appended.

        Returns:
            The original batch's metadata if this batch is an exact duplicate (nothing
            must be written), else None (append it, then call :meth:`update`).

        Raises:
            ApiError: INVALID_PRODUCER_EPOCH or OUT_OF_ORDER_SEQUENCE_NUMBER, with Kafka's message.
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            return None  # unknown producer: any sequence is accepted (KIP-360)
        tp = f"{self.topic}-{self.partition}"
        duplicate = entry.find_duplicate(epoch, first_seq, last_seq)
        if duplicate is not None:
            if is_transactional and not entry.in_current_txn(duplicate):
                raise ApiError(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                               f"Sequence numbers {first_seq}..{last_seq} of producer {producer_id} (epoch {epoch}) "
                               f"in partition {tp} were used by the batch at offsets {duplicate.first_offset}.."
                               f"{duplicate.last_offset}, in a transaction that has ended: the producer reused them "
                               f"without bumping its epoch (expected sequence {increment_sequence(entry.last_seq, 1)})")
            return duplicate
        if not is_transactional and entry.current_txn_first_offset is not None:
            raise ApiError(Errors.INVALID_TXN_STATE,
                           f"Expected transactional write from producer {producer_id} at offset {entry.last_offset + 1} "
                           f"in partition {tp}: it has a transaction open since offset {entry.current_txn_first_offset}")
        if epoch < entry.producer_epoch:
            raise ApiError(Errors.INVALID_PRODUCER_EPOCH,
                           f"Epoch of producer {producer_id} at offset {entry.last_offset + 1} in {tp} is {epoch}, "
                           f"which is smaller than the last seen epoch {entry.producer_epoch}")
        if epoch != entry.producer_epoch:
            if first_seq != 0 and entry.producer_epoch != NO_PRODUCER_EPOCH:
                raise ApiError(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                               f"Invalid sequence number for new epoch of producer {producer_id} in partition {tp}: "
                               f"{epoch} (request epoch), {first_seq} (seq. number), {entry.producer_epoch} (current producer epoch)")
        elif entry.producer_epoch != NO_PRODUCER_EPOCH and entry.batches and not in_sequence(entry.last_seq, first_seq):
            raise ApiError(Errors.OUT_OF_ORDER_SEQUENCE_NUMBER,
                           f"Out of order sequence number for producer {producer_id} in partition {tp}: "
                           f"{first_seq} (incoming seq. number), {entry.last_seq} (current end sequence number)")
        return None

    def update(self, producer_id: int, epoch: int, first_seq: int, last_seq: int, first_offset: int,
               last_offset: int, timestamp: int, is_transactional: bool) -> None:
        """Record an appended (or replayed) data batch of ``producer_id``."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerStateEntry(producer_id)
        entry.add_batch(epoch, BatchMetadata(first_seq, last_seq, first_offset, last_offset, timestamp))
        entry.last_write_ms = _wall_ms()
        if is_transactional and entry.current_txn_first_offset is None:
            entry.current_txn_first_offset = first_offset

    def check_marker(self, producer_id: int, epoch: int, coordinator_epoch: int) -> None:
        """Validate a COMMIT/ABORT marker before it is appended (Kafka's ``appendEndTxnMarker``).

        Raises:
            ApiError: INVALID_PRODUCER_EPOCH for an older producer epoch,
                TRANSACTION_COORDINATOR_FENCED for an older coordinator epoch.
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        tp = f"{self.topic}-{self.partition}"
        if epoch < entry.producer_epoch:
            raise ApiError(Errors.INVALID_PRODUCER_EPOCH,
                           f"Transaction marker of producer {producer_id} in {tp} has epoch {epoch}, "
                           f"older than the current epoch {entry.producer_epoch}")
        if coordinator_epoch < entry.coordinator_epoch:
            raise ApiError(Errors.TRANSACTION_COORDINATOR_FENCED,
                           f"Invalid coordinator epoch for producer {producer_id} in {tp}: {coordinator_epoch} "
                           f"(zombie), {entry.coordinator_epoch} (current)")

    def complete_txn(self, producer_id: int, epoch: int, coordinator_epoch: int, timestamp: int) -> int | None:
        """Apply an appended (or replayed) marker: close the producer's transaction on this partition.

        Returns:
            The first offset of the transaction it closed, or None when the producer had no
            records in it here (an empty transaction leaves no aborted-index entry).
        """
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerStateEntry(producer_id, epoch)
        if epoch != entry.producer_epoch:
            entry.batches.clear()
            entry.producer_epoch = epoch
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp = timestamp
        entry.last_write_ms = _wall_ms()
        first, entry.current_txn_first_offset = entry.current_txn_first_offset, None
        return first

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Forget producers idle for ``expiration_ms`` (``producer.id.expiration.ms``) or more.

        A producer expires when it has no transaction open on this partition and no write
        reached the partition for ``expiration_ms`` before ``now_ms`` (Kafka's
        ``ProducerStateManager.removeExpiredProducers``). Idleness is measured on the
        broker's clock (:attr:`ProducerStateEntry.last_write_ms`), where Kafka uses the
        batches' max timestamps: a producer importing historical data (old CreateTime
        timestamps) would otherwise lose its state at once and see its retries written
        twice. An entry loaded after a restart counts as written at load time, so a
        restart only ever extends the retention. Nothing else removes an entry: since
        KIP-360 the state outlives the segments that produced it (retention,
        DeleteRecords, compaction).

        Returns:
            The expired producer ids, in ascending order.
        """
        expired = sorted(pid for pid, e in self.producers.items()
                         if e.current_txn_first_offset is None and now_ms - e.last_write_ms >= expiration_ms)
        for pid in expired:
            del self.producers[pid]
        return expired

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest open transaction on this partition, if any."""
        open_txns = [e.current_txn_first_offset for e in self.producers.values() if e.current_txn_first_offset is not None]
        return min(open_txns) if open_txns else None

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        """The entry of ``producer_id``, if the partition has one."""
        return self.producers.get(producer_id)

    # -- snapshots ------------------------------------------------------------------
    def snapshot_rows(self) -> list[dict[str, Any]]:
        """Rows of :data:`txlake.formats.producer_state.SNAPSHOT_SCHEMA` for this partition."""
        return [
            {"topic": self.topic, "partition": self.partition, "producer_id": e.producer_id,
             "producer_epoch": e.producer_epoch, "coordinator_epoch": e.coordinator_epoch,
             "last_timestamp": e.last_timestamp, "txn_first_offset": e.current_txn_first_offset,
             "batches": [vars(b) for b in e.batches]}
            for e in self.producers.values()
        ]

    def load_rows(self, rows: Iterable[dict[str, Any]]) -> None:
        """Restore entries from snapshot rows of this partition."""
        for row in rows:
            entry = ProducerStateEntry(row["producer_id"], row["producer_epoch"],
                                       deque((BatchMetadata(**b) for b in row["batches"]), maxlen=NUM_BATCHES_TO_RETAIN),
                                       row["coordinator_epoch"], row["last_timestamp"], row["txn_first_offset"])
            self.producers[entry.producer_id] = entry
