"""Transaction administration (KIP-664): Kafka's ListTransactions, DescribeTransactions,
DescribeProducers and WriteTxnMarkers handlers, and the hanging-transaction check of
``kafka-transactions.sh find-hanging`` (Kafka's ``FindHangingTransactionsCommand``).

In Kafka the first two are answered by the transaction coordinator (its
``TransactionStateManager``), DescribeProducers by the partition leader (its
``ProducerStateManager``), and ``Admin.abortTransaction`` sends WriteTxnMarkers with one
ABORT marker to the partition leader. Here one embedded broker (id 0) is all of them, and
where the answers come from depends on the process:

* **the writer** (``is_writer``): the live transaction coordinator's state and the
  live producer state of every partition -- exactly what Kafka's coordinator and leader
  answer, including what is queued but not committed yet;
* **any other process** (e.g. ``txlake transactions list`` while another process holds
  the writer lease): a private, passive ``TransactionStateManager`` loaded by replaying
  ``__transaction_state``, and producer state rebuilt from the latest snapshot plus a
  replay of the log after it (what a new writer would load): the last *committed* state.
  Nothing is written and no lease is taken.

Writing a marker always needs the writer (it takes the lease when no other process holds
it). Errors are Kafka's codes (:class:`~.errors.Errors`), as a broker would answer them.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import Iterable, Protocol

from txlake.catalog.state import CatalogState
from txlake.catalog.topic_names import TRANSACTION_STATE_TOPIC, is_internal

from . import log_loader
from .errors import ApiError, Errors
from .partition_writer import PartitionWriter
from .producer_state import ProducerStateManager
from .requests import TxnMarker
from .transaction_coordinator import TransactionCoordinator
from .transaction_metadata import TransactionState
from .transaction_state_manager import (InMemoryTransactionLog, ListTransactionsResult, TransactionConfig,
                                        TransactionStateManager)
from .transaction_topic import TransactionTopicLog

__all__ = ["COORDINATOR_ID", "ActiveProducer", "DescribedTransaction", "OpenTransaction", "PartitionProducers",
           "TransactionAdmin", "hanging_transactions"]

#: the id of the embedded broker, the coordinator of every transactional id and leader of every partition
COORDINATOR_ID = 0


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class DescribedTransaction:
    """One entry of a DescribeTransactions answer (Kafka's ``DescribeTransactionsResponseData.TransactionState``).

    Attributes:
        transactional_id: the id asked for.
        error: NO_ERROR, TRANSACTIONAL_ID_NOT_FOUND (unknown or expired id), INVALID_REQUEST
            (empty id), COORDINATOR_LOAD_IN_PROGRESS / NOT_COORDINATOR (the live coordinator's).
        message: what went wrong, for an error.
        state: Kafka's state name (``Empty``, ``Ongoing``, ``PrepareCommit``, ...).
        producer_id / producer_epoch: the identity the coordinator hands out now.
        transaction_timeout_ms: the producer's ``transaction.timeout.ms``.
        transaction_start_time_ms: ms when the current (or last) transaction started, -1 if none.
        topic_partitions: ``(topic, partition)`` pairs of the transaction (sorted); empty once
            it is complete.
    """

    transactional_id: str
    error: Errors = Errors.NO_ERROR
    message: str = ""
    state: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    transaction_timeout_ms: int = 0
    transaction_start_time_ms: int = -1
    topic_partitions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class ActiveProducer:
    """A producer of a partition (Kafka's ``DescribeProducersResponseData.ProducerState``).

    Attributes:
        producer_id / producer_epoch: the producer and its newest epoch on the partition.
        last_sequence: last sequence number of its newest batch (-1 if none retained).
        last_timestamp: ms, the newest timestamp of its batches or markers on the partition.
        coordinator_epoch: coordinator epoch of its last marker on the partition (-1 if none).
        current_txn_start_offset: first offset of its open transaction on the partition, -1 if none.
    """

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


@dataclass(frozen=True)
class PartitionProducers:
    """A partition's DescribeProducers answer: its active producers (sorted by producer id), or an
    error (UNKNOWN_TOPIC_OR_PART for a topic or partition that does not exist)."""

    topic: str
    partition: int
    error: Errors = Errors.NO_ERROR
    message: str = ""
    active_producers: tuple[ActiveProducer, ...] = ()


@dataclass(frozen=True)
class OpenTransaction:
    """An open transaction on a partition (the ``OpenTransaction`` of Kafka's find-hanging tool)."""

    topic: str
    partition: int
    producer: ActiveProducer


def hanging_transactions(candidates: Iterable[OpenTransaction], transactional_ids: dict[int, str],
                         descriptions: dict[str, DescribedTransaction | None]) -> list[OpenTransaction]:
    """The candidates the coordinator will never close (Kafka's ``filterHangingTransactions``).

    Args:
        candidates: open transactions older than the maximum transaction timeout.
        transactional_ids: producer id -> transactional id, as ListTransactions found them.
        descriptions: transactional id -> its DescribeTransactions answer (None: not found).

    Returns:
        Each candidate whose producer id maps to no transactional id, whose id has no
        description, or whose description does not hold the candidate's partition (the
        coordinator lists every partition of an Ongoing transaction, and those of a
        PrepareCommit/PrepareAbort one until their markers are written).
    """
    out = []
    for candidate in candidates:
        tid = transactional_ids.get(candidate.producer.producer_id)
        description = descriptions.get(tid) if tid is not None else None
        if description is None or (candidate.topic, candidate.partition) not in description.topic_partitions:
            out.append(candidate)
    return out


class TransactionAdminHost(PartitionWriter, Protocol):
    """What the KIP-664 handlers use: the partition writer and, in the writer, the live
    transaction coordinator (:class:`~.broker.Broker` is one)."""

    def transaction_coordinator(self) -> TransactionCoordinator:
        """The live transaction coordinator (started on first use; raises ApiError in a reader)."""


class TransactionAdmin:
    """KIP-664 request handlers over one storage root (thread-safe; cheap to create).

    Args:
        host: the storage root's broker, as :class:`TransactionAdminHost` (a writer or a
            reader, see the module doc).
    """

    def __init__(self, host: TransactionAdminHost):
        self.host = host

    # ------------------------------------------------------------------ coordinator state
    def _coordinator_state(self) -> tuple[TransactionStateManager, TransactionCoordinator | None]:
        """The live coordinator's state manager (writer), else a passive one loaded from the log."""
        if self.host.is_writer:
            coordinator = self.host.transaction_coordinator()
            return coordinator.state, coordinator
        return self._load_committed_transaction_state(), None

    def _load_committed_transaction_state(self) -> TransactionStateManager:
        """Replay every ``__transaction_state`` partition into a private manager that never writes."""
        host = self.host
        host.refresh()
        config = TransactionConfig.from_properties(host.config.transaction)
        topic = host.topics().get(TRANSACTION_STATE_TOPIC)
        if topic is None:  # no transactional producer ever ran: every id is unknown
            txn_log = InMemoryTransactionLog(config.transaction_log_num_partitions)
        else:  # the topic's partition count is what the ids were placed by, whatever this process's config says
            config = dataclasses.replace(config, transaction_log_num_partitions=len(topic.partitions))
            txn_log = TransactionTopicLog(host, len(topic.partitions))
        state = TransactionStateManager(txn_log, config)
        lease = host.catalog.state.lease
        epoch = lease.epoch if lease is not None else 0
        for partition in range(config.transaction_log_num_partitions):
            state.load_transactions_for_partition(partition, epoch)
        return state

    # ------------------------------------------------------------------ ListTransactions
    def handle_list_transactions(self, state_filters: Iterable[str] = (), producer_id_filters: Iterable[int] = (),
                                 duration_filter_ms: int = -1,
                                 transactional_id_pattern: str | None = None) -> ListTransactionsResult:
        """ListTransactions (KIP-664; KIP-994 adds the duration filter, KIP-1152 the
        transactional id pattern).

        Args:
            state_filters: Kafka state names; empty = every state (Dead is never listed).
            producer_id_filters: producer ids; empty = every producer.
            duration_filter_ms: >= 0 keeps only transactions running longer than this (ms,
                now - transaction start time); < 0 = no filter.
            transactional_id_pattern: a regular expression the whole transactional id must
                match; None or empty = no filter.

        Returns:
            ``(error, transaction_states, unknown_state_filters)`` with Kafka's error codes
            (INVALID_REGULAR_EXPRESSION for a pattern that does not compile).
        """
        try:
            state, _ = self._coordinator_state()
        except ApiError as exc:
            return ListTransactionsResult(exc.error, [], [])
        return state.list_transaction_states(producer_id_filters, state_filters, duration_filter_ms,
                                             filter_transactional_id_pattern=transactional_id_pattern)

    # ------------------------------------------------------------------ DescribeTransactions
    def handle_describe_transactions(self, transactional_ids: Iterable[str]) -> list[DescribedTransaction]:
        """DescribeTransactions (KIP-664, Kafka's ``TransactionCoordinator.handleDescribeTransactions``):
        one answer per id, in order. An unknown id, or one that expired
        (``transactional.id.expiration.ms``) or is being removed (Dead), answers
        TRANSACTIONAL_ID_NOT_FOUND; an empty id INVALID_REQUEST."""
        ids = list(transactional_ids)
        try:
            state, _ = self._coordinator_state()
        except ApiError as exc:
            return [DescribedTransaction(tid, exc.error, exc.message) for tid in ids]
        return [_describe(state, tid) for tid in ids]

    # ------------------------------------------------------------------ DescribeProducers
    def handle_describe_producers(self, partitions: Iterable[tuple[str, int]]) -> list[PartitionProducers]:
        """DescribeProducers (KIP-664, Kafka's ``ReplicaManager.activeProducerState``): the
        producers with state on each partition, in order. Unknown topic or partition:
        UNKNOWN_TOPIC_OR_PART."""
        wanted = [(str(t), int(p)) for t, p in partitions]
        if self.host.is_writer:
            rows_of = {tp: self.host.producer_state_rows(*tp) for tp in dict.fromkeys(wanted)}
        else:
            managers = self._load_committed_producer_states({tp for tp in wanted})
            rows_of = {tp: managers[tp].snapshot_rows() if tp in managers else None for tp in dict.fromkeys(wanted)}
        out = []
        for topic, partition in wanted:
            rows = rows_of[(topic, partition)]
            if rows is None:
                out.append(PartitionProducers(topic, partition, Errors.UNKNOWN_TOPIC_OR_PART,
                                              f"Unknown topic or partition: {topic}-{partition}"))
                continue
            producers = sorted((_active_producer(row) for row in rows), key=lambda a: a.producer_id)
            out.append(PartitionProducers(topic, partition, active_producers=tuple(producers)))
        return out

    def _load_committed_producer_states(self, wanted: set[tuple[str, int]]) -> dict[tuple[str, int], ProducerStateManager]:
        """Producer state of the partitions of ``wanted``'s topics as committed: the latest snapshot
        plus a replay of the log after it (Kafka's ``LogLoader``), on a copy of the catalog state.
        A writer loading the same state would keep every entry (expiry counts from the load)."""
        host = self.host
        host.refresh()
        with host.catalog.lock:
            state = host.catalog.state
            topics = {name: copy.deepcopy(state.topics[name]) for name in {t for t, _ in wanted} if name in state.topics}
            view = CatalogState(version=state.version, topics=topics, producer_snapshot=state.producer_snapshot)
        return log_loader.load_producer_states(host.store, view, host.reader)

    # ------------------------------------------------------------------ WriteTxnMarkers
    def handle_write_txn_markers(self, markers: list[TxnMarker],
                                 timeout_ms: int = 30_000) -> list[dict[tuple[str, int], tuple[Errors, str]]]:
        """WriteTxnMarkers as ``Admin.abortTransaction`` sends it to the partition leader: append each
        marker's control batch to its partitions and answer once it is committed (the partition's
        LSO moves past the transaction in the same catalog commit).

        Answers per marker, per partition, ``(error, message)``: NO_ERROR; UNKNOWN_TOPIC_OR_PART;
        INVALID_PRODUCER_EPOCH (the producer has a newer epoch on the partition);
        TRANSACTION_COORDINATOR_FENCED (a marker with a newer coordinator epoch was written for
        the producer); NOT_LEADER_OR_FOLLOWER when another process holds the writer lease (the
        message names it); REQUEST_TIMED_OUT.
        """
        try:
            self.host.ensure_writer()
        except ApiError as exc:
            return [{tp: (exc.error, exc.message) for tp in m.partitions} for m in markers]
        answers = self.host.write_txn_markers(markers, timeout_ms)
        return [{tp: (error, self._marker_message(marker, tp, error)) for tp, error in answer.items()}
                for marker, answer in zip(markers, answers)]

    def _marker_message(self, marker: TxnMarker, tp: tuple[str, int], error: Errors) -> str:
        if error == Errors.NO_ERROR:
            return ""
        where = f"{tp[0]}-{tp[1]}"
        rows = self.host.producer_state_rows(*tp) or []
        entry = next((r for r in rows if r["producer_id"] == marker.producer_id), None)
        if error == Errors.INVALID_PRODUCER_EPOCH and entry is not None:
            return (f"the marker's producer epoch {marker.producer_epoch} is older than producer "
                    f"{marker.producer_id}'s epoch {entry['producer_epoch']} on {where}")
        if error == Errors.TRANSACTION_COORDINATOR_FENCED and entry is not None:
            return (f"the marker's coordinator epoch {marker.coordinator_epoch} is older than {entry['coordinator_epoch']}, "
                    f"the coordinator epoch of producer {marker.producer_id}'s last marker on {where}")
        if error == Errors.UNKNOWN_TOPIC_OR_PART:
            return f"Unknown topic or partition: {where}"
        return f"writing the marker to {where} failed: {error.name}"

    # ------------------------------------------------------------------ find-hanging
    def find_hanging_transactions(self, partitions: Iterable[tuple[str, int]] | None = None,
                                  max_transaction_timeout_ms: int | None = None,
                                  now_ms: int | None = None) -> list[OpenTransaction]:
        """Open transactions the coordinator will never close (Kafka's ``FindHangingTransactionsCommand``).

        1. DescribeProducers on ``partitions`` (default: every partition of every
           non-internal topic); candidates are open transactions whose producer's last
           timestamp on the partition is more than ``max_transaction_timeout_ms`` (default
           ``transaction.max.timeout.ms``, 900000) before ``now_ms`` -- no live transaction
           can be that old, the coordinator would have aborted it;
        2. ListTransactions filtered on the candidates' producer ids, then
           DescribeTransactions of the transactional ids found;
        3. :func:`hanging_transactions`: a candidate is hanging when its producer id has no
           transactional id, or the id's transaction does not hold the partition.

        Raises:
            ApiError: DescribeProducers, ListTransactions or DescribeTransactions failed
                (anything but TRANSACTIONAL_ID_NOT_FOUND).
        """
        if max_transaction_timeout_ms is None:
            max_transaction_timeout_ms = TransactionConfig.from_properties(self.host.config.transaction
                                                                           ).transaction_max_timeout_ms
        if partitions is None:
            self.host.refresh()
            partitions = [(name, p.partition) for name, t in sorted(self.host.topics().items())
                          if not is_internal(name) for p in t.partitions]
        now = _now_ms() if now_ms is None else now_ms
        candidates = []
        for answer in self.handle_describe_producers(partitions):
            if answer.error != Errors.NO_ERROR:
                raise ApiError(answer.error, f"Failed to describe producers for partition "
                                             f"{answer.topic}-{answer.partition}: {answer.message}")
            candidates += [OpenTransaction(answer.topic, answer.partition, producer)
                           for producer in answer.active_producers
                           if producer.current_txn_start_offset >= 0
                           and now - producer.last_timestamp > max_transaction_timeout_ms]
        if not candidates:
            return []
        producer_ids = {c.producer.producer_id for c in candidates}
        state, _ = self._coordinator_state()  # one view for the listing and the descriptions
        listed = state.list_transaction_states(producer_ids)
        if listed.error != Errors.NO_ERROR:
            raise ApiError(listed.error, f"Failed to list transactions for {len(producer_ids)} producers")
        transactional_ids = {t.producer_id: t.transactional_id for t in listed.transaction_states
                             if t.producer_id in producer_ids}
        descriptions: dict[str, DescribedTransaction | None] = {}
        for tid in transactional_ids.values():
            described = _describe(state, tid)
            if described.error == Errors.TRANSACTIONAL_ID_NOT_FOUND:
                descriptions[tid] = None
            elif described.error != Errors.NO_ERROR:
                raise ApiError(described.error, f"Failed to describe transactional id {tid!r}: {described.message}")
            else:
                descriptions[tid] = described
        return hanging_transactions(candidates, transactional_ids, descriptions)


def _describe(state: TransactionStateManager, transactional_id: str) -> DescribedTransaction:
    """One DescribeTransactions answer from ``state`` (every partition whose AddPartitionsToTxn was
    answered is in it: the coordinator answers once the Ongoing record is durable)."""
    if not transactional_id:
        return DescribedTransaction(transactional_id, Errors.INVALID_REQUEST, "an empty transactional id")
    try:
        found = state.get_transaction_state(transactional_id)
    except ApiError as exc:
        return DescribedTransaction(transactional_id, exc.error, exc.message)
    not_found = DescribedTransaction(
        transactional_id, Errors.TRANSACTIONAL_ID_NOT_FOUND,
        f"The transactionalId {transactional_id!r} could not be found: it never existed, or it expired "
        "(transactional.id.expiration.ms) and was removed from __transaction_state")
    if found is None:
        return not_found
    md = found.transaction_metadata
    with md.lock:
        if md.state is TransactionState.DEAD:  # being expired
            return not_found
        return DescribedTransaction(transactional_id, state=md.state.state_name, producer_id=md.producer_id,
                                    producer_epoch=md.producer_epoch, transaction_timeout_ms=md.txn_timeout_ms,
                                    transaction_start_time_ms=md.txn_start_timestamp,
                                    topic_partitions=tuple(sorted(md.topic_partitions)))


def _active_producer(row: dict) -> ActiveProducer:
    """An :class:`ActiveProducer` from a producer-state snapshot row."""
    batches = row["batches"]
    first = row["txn_first_offset"]
    return ActiveProducer(row["producer_id"], row["producer_epoch"], batches[-1]["last_seq"] if batches else -1,
                          row["last_timestamp"], row["coordinator_epoch"], -1 if first is None else first)
