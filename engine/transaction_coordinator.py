"""The transaction coordinator (Kafka's ``TransactionCoordinator``, KIP-98).

Request handlers named after Kafka's APIs -- InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn -- answering with Kafka's error codes in every state. Every
state change is first written to ``__transaction_state`` (through the
:class:`~.transaction_state_manager.TransactionStateManager`), then applied. Ending a
transaction writes PrepareCommit/PrepareAbort, then the COMMIT/ABORT markers to every
partition of the transaction (the partition writer's ``append_txn_markers``), then CompleteCommit/
CompleteAbort; a coordinator that restarts in between replays the log and finishes
the job (markers are idempotent per producer epoch).

In this process-per-storage-root design the coordinator runs inside the writer, and its
**coordinator epoch** is the writer-lease epoch: a newer writer always has a larger one,
so markers of a zombie coordinator are refused (TRANSACTION_COORDINATOR_FENCED). Taking the
lease is the election: the broker starts the coordinator then, whatever client took the
lease (Kafka's ``onElection``), so timeouts and half-finished transactions are dealt with
without any transactional client. A process that only reads never holds it.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable

from txlake.catalog.topic_names import CONSUMER_OFFSETS_TOPIC, is_internal

from .errors import ApiError, Errors
from .group_offsets import partition_for as offsets_partition_for
from .partition_writer import PartitionWriter
from .requests import TxnMarker
from .transaction_metadata import (SHORT_MAX_VALUE, IllegalStateError, ProducerIdAndEpoch, TransactionMetadata,
                                   TransactionResult, TransactionState, TxnTransitMetadata, supports_epoch_bump)
from .transaction_state_manager import TransactionConfig, TransactionStateManager, TxnLogAppend
from .transaction_topic import TransactionTopicLog

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MARKER_RETRIES = 5
#: transactions a restarted coordinator finishes at once (their writes share group commits)
RECOVERY_THREADS = 32


def _now_ms() -> int:
    return int(time.time() * 1000)


def _identity_error(metadata: TransactionMetadata, producer_id: int, producer_epoch: int) -> Errors | None:
    """The answer to a request whose producer id/epoch do not match the metadata, or whose
    transactional id has a transition in progress; None when it may proceed (caller holds the lock)."""
    if metadata.producer_id != producer_id:
        return Errors.INVALID_PRODUCER_ID_MAPPING
    if metadata.producer_epoch != producer_epoch:
        return Errors.PRODUCER_FENCED
    if metadata.pending_transition_in_progress:
        return Errors.CONCURRENT_TRANSACTIONS
    return None


def _refused_at_once(append: TxnLogAppend) -> bool:
    """True when a queued ``__transaction_state`` record was refused before it could be
    committed (validation answers resolve at once and do not stop the writer, so nothing may
    be queued behind such a record)."""
    return append.refused is not None or (append.written.done() and append.written.exception() is not None)


class TransactionCoordinator:
    """Kafka's transaction coordinator for one storage root (runs inside the writer).

    Args:
        writer: the partition writer of the storage root (markers, producer ids, the
            ``__transaction_state`` topic): the broker holding the lease.
        coordinator_epoch: this coordinator's epoch (the writer-lease epoch).
        config: Kafka's transaction configs (``transaction.max.timeout.ms`` 900000, ...).
        allocate_producer_id: hands out a new producer id (the broker's ProducerIdManager);
            default ``writer.init_producer_id``.
        group_partition_for: a consumer group's ``__consumer_offsets`` partition (AddOffsetsToTxn);
            default the partition under the default ``offsets.topic.num.partitions`` (50).
    """

    def __init__(self, writer: PartitionWriter, coordinator_epoch: int, config: TransactionConfig | None = None,
                 allocate_producer_id: Callable[[], int] | None = None,
                 group_partition_for: Callable[[str], int] = offsets_partition_for):
        self.writer = writer
        self.coordinator_epoch = coordinator_epoch
        self.config = config or TransactionConfig()
        self.txn_log = TransactionTopicLog(writer, self.config.transaction_log_num_partitions)
        self.state = TransactionStateManager(self.txn_log, self.config)
        self._allocate = allocate_producer_id or (lambda: writer.init_producer_id()[1])
        self._group_partition_for = group_partition_for
        self._stop = threading.Event()
        self._scheduler: threading.Thread | None = None
        # KIP-890 verification index: producer id -> (epoch, partitions of its Ongoing transaction).
        # Guarded by a leaf lock: the broker consults it while holding its append lock.
        self._verified: dict[int, tuple[int, frozenset[tuple[str, int]]]] = {}
        self._verified_lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def startup(self, schedule: bool = True) -> None:
        """Become the coordinator of every ``__transaction_state`` partition (Kafka's
        ``onElection`` for each, then the schedulers of its ``startup``).

        Loads every partition and finishes the transactions a previous coordinator left in
        PrepareCommit/PrepareAbort (markers, then CompleteCommit/CompleteAbort); then, with
        ``schedule``, starts the timeout scheduler (every
        ``transaction.abort.timed.out.transaction.cleanup.interval.ms``, Kafka's
        ``abortTimedOutTransactions``) and the transactional-id expiration.

        The broker runs it as soon as its process takes the writer lease, whatever client took
        it, so it must be cheap where no transactional producer ever ran: the topic is not
        created here (the first InitProducerId with a transactional id creates it) and its
        partitions then load empty, without I/O. :meth:`cancel` from another thread (the writer
        is closing) stops it before the next partition, the recovery or the schedulers.

        Raises:
            ApiError: INVALID_PARTITIONS when the topic exists with another partition count.
            CorruptObjectError, UnsupportedFormatVersionError: a record cannot be decoded.
        """
        self.txn_log.exists()  # checks the partition count of an existing topic
        pending = []
        for partition in range(self.config.transaction_log_num_partitions):
            if self._stop.is_set():
                return
            pending.extend(self.state.load_transactions_for_partition(partition, self.coordinator_epoch))
        if self._stop.is_set():
            return
        # each transactional id is finished on its own, as Kafka's marker channel does; run them
        # side by side so that their markers and Complete records share group commits
        with ThreadPoolExecutor(max_workers=RECOVERY_THREADS, thread_name_prefix="txlake-txn-recovery") as pool:
            list(pool.map(lambda p: self._send_markers_and_complete(
                p.transactional_id, p.coordinator_epoch, p.result is TransactionResult.COMMIT, p.txn_metadata,
                p.transit_metadata), pending))
        listed = self.state.list_transaction_states(filter_state_names=[TransactionState.ONGOING.state_name])
        for txn in listed.transaction_states:
            found = self.state.get_transaction_state(txn.transactional_id)
            if found is not None:
                self._remember(found.transaction_metadata)
        if schedule and not self._stop.is_set():
            self._scheduler = threading.Thread(target=self._schedule, name="txlake-txn-scheduler", daemon=True)
            self._scheduler.start()
            self.state.enable_transactional_id_expiration()

    def cancel(self) -> None:
        """Ask a :meth:`startup` running in another thread to stop at its next step (it loads
        no further partition, finishes nothing more, starts no scheduler); :meth:`shutdown` is
        still needed once it returned."""
        self._stop.set()

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` or :meth:`shutdown` was called."""
        return self._stop.is_set()

    def shutdown(self) -> None:
        """Stop the schedulers."""
        self._stop.set()
        if self._scheduler is not None:
            self._scheduler.join(timeout=10)
        self.state.shutdown()

    def _schedule(self) -> None:
        interval = self.config.abort_timed_out_transactions_interval_ms / 1000
        while not self._stop.wait(interval):
            if not self.writer.is_writer:  # fenced (another process took the lease over) or closed: for good
                log.info("the transaction coordinator at epoch %d stops aborting timed-out transactions: "
                         "this process is no longer the writer", self.coordinator_epoch)
                return
            try:
                self.abort_timed_out_transactions()
            except Exception as exc:  # the scheduler must survive one bad round
                log.warning("aborting timed-out transactions failed: %s", exc)

    # ------------------------------------------------------------------ InitProducerId
    def handle_init_producer_id(self, transactional_id: str | None, transaction_timeout_ms: int,
                                expected: ProducerIdAndEpoch | None = None) -> tuple[Errors, int, int]:
        """InitProducerId: ``(error, producer_id, epoch)`` (Kafka's ``handleInitProducerId``).

        Answers INVALID_REQUEST (empty id), INVALID_TRANSACTION_TIMEOUT (timeout <= 0 or over
        ``transaction.max.timeout.ms``), CONCURRENT_TRANSACTIONS (a transition is in progress,
        or an Ongoing transaction of the previous producer is being aborted -- retry),
        PRODUCER_FENCED (a KIP-360 request naming a stale identity).
        """
        if transactional_id is None:
            return Errors.NO_ERROR, self._allocate(), 0
        if not transactional_id:
            return Errors.INVALID_REQUEST, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if not self.state.validate_transaction_timeout_ms(transaction_timeout_ms):
            return Errors.INVALID_TRANSACTION_TIMEOUT, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        try:
            self.txn_log.ensure_topic()  # the first transactional producer creates __transaction_state
            found = self.state.get_transaction_state(transactional_id)
            if found is None:
                created = TransactionMetadata(transactional_id, self._allocate(), txn_timeout_ms=transaction_timeout_ms,
                                              txn_last_update_timestamp=_now_ms())
                found = self.state.put_transaction_state_if_not_exists(created)
        except ApiError as exc:
            return exc.error, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        coordinator_epoch, metadata = found.coordinator_epoch, found.transaction_metadata
        with metadata.lock:
            try:
                transit = self._prepare_init_producer_id(metadata, transaction_timeout_ms, expected)
            except ApiError as exc:
                return exc.error, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
            except IllegalStateError as exc:  # Kafka answers an IllegalStateException with UNKNOWN_SERVER_ERROR
                log.error("InitProducerId of %s: %s", transactional_id, exc)
                return Errors.UNKNOWN_SERVER_ERROR, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if transit.txn_state is TransactionState.PREPARE_EPOCH_FENCE:
            # abort the previous producer's transaction under the fenced epoch; the client retries
            error = self._end_transaction(transactional_id, transit.producer_id, transit.producer_epoch,
                                          TransactionResult.ABORT, from_client=False, fence=transit)
            return (Errors.CONCURRENT_TRANSACTIONS if error == Errors.NO_ERROR else error), NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        error = self.state.append_transaction_to_log(transactional_id, coordinator_epoch, transit)
        if error != Errors.NO_ERROR:
            return error, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        return Errors.NO_ERROR, transit.producer_id, transit.producer_epoch

    def _prepare_init_producer_id(self, metadata: TransactionMetadata, timeout_ms: int,
                                  expected: ProducerIdAndEpoch | None) -> TxnTransitMetadata:
        """Kafka's ``prepareInitProducerIdTransit`` (caller holds the metadata lock)."""
        if metadata.pending_transition_in_progress:
            raise ApiError(Errors.CONCURRENT_TRANSACTIONS)
        if expected is not None and not metadata.is_valid_expected_producer_id(expected):
            raise ApiError(Errors.PRODUCER_FENCED)
        state = metadata.state
        if state in (TransactionState.PREPARE_ABORT, TransactionState.PREPARE_COMMIT):
            raise ApiError(Errors.CONCURRENT_TRANSACTIONS)
        if state in (TransactionState.COMPLETE_ABORT, TransactionState.COMPLETE_COMMIT, TransactionState.EMPTY):
            if metadata.is_producer_epoch_exhausted and (expected is None or expected.epoch == metadata.producer_epoch):
                return metadata.prepare_producer_id_rotation(self._allocate(), timeout_ms, _now_ms(), expected is not None)
            return metadata.prepare_increment_producer_epoch(timeout_ms, expected, _now_ms())
        if state is TransactionState.ONGOING:
            return metadata.prepare_fence_producer_epoch()
        raise IllegalStateError(f"Found transactionalId {metadata.transactional_id} with state {state}: "
                                "this is illegal as we should never have transitioned to this state")

    # ------------------------------------------------------------------ AddPartitionsToTxn
    def handle_add_partitions_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                     partitions: Iterable[tuple[str, int]],
                                     transaction_version: int = 0) -> dict[tuple[str, int], Errors]:
        """AddPartitionsToTxn from a client: one error for all the partitions (Kafka answers them alike).
        ``transaction_version`` 2: the implicit add of KIP-890 part 2 (a broker adding the
        partitions of a Produce v12+), recorded in the transaction (Kafka's ``clientTransactionVersion``).

        Returns once the Ongoing record naming the partitions is durable in
        ``__transaction_state`` (Kafka's ``handleAddPartitionsToTransaction`` answers from
        ``appendTransactionToLog``'s callback), so a coordinator restarted after the answer
        has them. INVALID_PRODUCER_ID_MAPPING (unknown id or another producer id), PRODUCER_FENCED
        (another epoch), CONCURRENT_TRANSACTIONS (a transition or an EndTxn in progress); a
        failed write: NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, ... (nothing added).

        A client never writes an internal topic: when any partition is of ``__consumer_offsets``
        or ``__transaction_state``, nothing is added and those partitions answer
        TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED (Kafka's ``KafkaApis``
        leaves internal topics out of a client's WRITE authorization). The group's
        ``__consumer_offsets`` partition joins a transaction through AddOffsetsToTxn only.
        """
        partitions = frozenset(partitions)
        if any(is_internal(topic) for topic, _ in partitions):
            return {tp: Errors.TOPIC_AUTHORIZATION_FAILED if is_internal(tp[0]) else Errors.OPERATION_NOT_ATTEMPTED
                    for tp in partitions}
        error = self._add_partitions(transactional_id, producer_id, producer_epoch, partitions, transaction_version)
        return {tp: error for tp in partitions}

    def handle_add_offsets_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                  group_id: str, transaction_version: int = 0) -> Errors:
        """AddOffsetsToTxn: add the group's ``__consumer_offsets`` partition to the transaction,
        answered as :meth:`handle_add_partitions_to_txn` (once the Ongoing record is durable);
        ``transaction_version`` 2: the implicit add of a TxnOffsetCommit v5+ (KIP-890 part 2)."""
        if not group_id:
            return Errors.INVALID_GROUP_ID
        return self._add_partitions(transactional_id, producer_id, producer_epoch,
                                    frozenset({(CONSUMER_OFFSETS_TOPIC, self._group_partition_for(group_id))}),
                                    transaction_version)

    def handle_verify_partitions_in_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                                partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], Errors]:
        """AddPartitionsToTxn v4+ with ``verify_only`` (KIP-890 part 1; Kafka's
        ``handleVerifyPartitionsInTransaction``): are the partitions in the id's transaction?
        Nothing is written.

        Per partition: NO_ERROR (in the transaction) or TRANSACTION_ABORTABLE (not in it); or
        one error for all of them: INVALID_REQUEST (empty id), INVALID_PRODUCER_ID_MAPPING
        (unknown id or another producer id), PRODUCER_FENCED (another epoch),
        CONCURRENT_TRANSACTIONS (PrepareCommit/PrepareAbort), the state manager's loading errors.
        """
        partitions = frozenset(partitions)
        error, found = self._find(transactional_id)
        if found is None:
            return {tp: error for tp in partitions}
        metadata = found.transaction_metadata
        with metadata.lock:
            if metadata.producer_id != producer_id:
                error = Errors.INVALID_PRODUCER_ID_MAPPING
            elif metadata.producer_epoch != producer_epoch:
                error = Errors.PRODUCER_FENCED
            elif metadata.state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
                error = Errors.CONCURRENT_TRANSACTIONS
            else:
                added = metadata.topic_partitions
                return {tp: Errors.NO_ERROR if tp in added else Errors.TRANSACTION_ABORTABLE for tp in partitions}
        return {tp: error for tp in partitions}

    def _find(self, transactional_id: str):
        """``(NO_ERROR, cached state)`` of an id, or ``(error, None)``: INVALID_REQUEST for an
        empty id, the error of an AddPartitionsToTxn of the id answered before its record was
        written and whose write then failed (:meth:`settle`), the manager's loading errors,
        INVALID_PRODUCER_ID_MAPPING for an unknown id."""
        if not transactional_id:
            return Errors.INVALID_REQUEST, None
        try:
            found = self.state.get_transaction_state(transactional_id)
        except ApiError as exc:
            return exc.error, None
        return (Errors.NO_ERROR, found) if found is not None else (Errors.INVALID_PRODUCER_ID_MAPPING, None)

    def _add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        partitions: frozenset[tuple[str, int]], transaction_version: int = 0) -> Errors:
        error, found = self._find(transactional_id)
        if found is None:
            return error
        metadata = found.transaction_metadata
        with metadata.lock:
            mismatch = _identity_error(metadata, producer_id, producer_epoch)
            if mismatch is not None:
                return mismatch
            if metadata.state in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
                return Errors.CONCURRENT_TRANSACTIONS
            if metadata.state is TransactionState.ONGOING and partitions <= metadata.topic_partitions:
                return Errors.NO_ERROR
            transit = metadata.prepare_add_partitions(partitions, _now_ms(), transaction_version)
        # Answer only once the Ongoing record is durable, as Kafka's appendTransactionToLog answers
        # from its callback after replication: the client may send EndTxn right after this answer,
        # and a coordinator restarted in between must know the partitions (issue 18). The record
        # is urgent (the answer waits for it, not for the writer's linger and flush interval);
        # records queued meanwhile, other transactional ids' included, share its group commit
        error = self.state.append_transaction_to_log(transactional_id, found.coordinator_epoch, transit)
        self._remember(metadata)  # the verification index follows the durable state
        return error

    def _remember(self, metadata: TransactionMetadata) -> None:
        """Set the verification entry of ``metadata``'s producer from its (durable) state."""
        with metadata.lock:
            pid = metadata.producer_id
            entry = ((metadata.producer_epoch, frozenset(metadata.topic_partitions))
                     if metadata.state is TransactionState.ONGOING else None)
        with self._verified_lock:
            if entry is None:
                self._verified.pop(pid, None)
            else:
                self._verified[pid] = entry

    def _forget(self, producer_id: int) -> None:
        with self._verified_lock:
            self._verified.pop(producer_id, None)

    def verify_partition(self, producer_id: int, producer_epoch: int, topic: str, partition: int) -> Errors:
        """KIP-890 verification: NO_ERROR when ``producer_id``'s Ongoing transaction holds the partition.

        Producer ids are unique to a transactional id, so the broker asks by producer id.
        Once PrepareCommit/PrepareAbort is logged the answer is INVALID_TXN_STATE, so a late
        write can never reopen a transaction that is ending.
        """
        with self._verified_lock:
            entry = self._verified.get(producer_id)
        if entry is not None and entry[0] == producer_epoch and (topic, partition) in entry[1]:
            return Errors.NO_ERROR
        return Errors.INVALID_TXN_STATE

    # ------------------------------------------------------------------ EndTxn
    def handle_end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool) -> Errors:
        """EndTxn: commit or abort the Ongoing transaction (Kafka's ``handleEndTransaction``).

        Answers NO_ERROR once the outcome is decided and its markers are written; NO_ERROR
        again for a retry after completion; INVALID_TXN_STATE for the opposite outcome or
        no transaction (Empty); CONCURRENT_TRANSACTIONS while one is being completed;
        PRODUCER_FENCED for another epoch; INVALID_PRODUCER_ID_MAPPING for an unknown id.
        """
        return self._end_transaction(transactional_id, producer_id, producer_epoch,
                                     TransactionResult.COMMIT if committed else TransactionResult.ABORT, from_client=True)

    def handle_end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool,
                               transaction_version: int = 0) -> tuple[Errors, int, int]:
        """EndTxn of a client of ``transaction_version`` (EndTxn v5+ is version 2, older ones 0):
        ``(error, producer_id, producer_epoch)``, the identity the client uses next (Kafka's
        ``EndTxnResponse`` v5 fields; -1, -1 below version 2 and with an error).

        Version 0/1: :meth:`handle_end_txn`. Version 2 (KIP-890 part 2, Kafka's
        ``TransactionCoordinator.endTransaction`` for ``supportsEpochBump``): PrepareCommit/
        PrepareAbort bump the epoch, the markers carry the bumped epoch, and the answer is the
        bumped epoch -- or, when it reached ``Short.MAX_VALUE``, a new producer id at epoch 0 --
        so no request of the ended transaction (a late Produce, a delayed EndTxn) can land in
        the next one. A retry of an EndTxn that completed (epoch + 1 is current, or the
        producer id was rotated from epoch ``Short.MAX_VALUE - 1``) answers NO_ERROR with the
        current identity; an abort with nothing to abort (Empty, CompleteCommit,
        CompleteAbort at the current epoch) bumps the epoch too. Otherwise PRODUCER_FENCED
        (any other epoch), INVALID_PRODUCER_ID_MAPPING, INVALID_TXN_STATE, CONCURRENT_TRANSACTIONS
        as for version 0/1.
        """
        result = TransactionResult.COMMIT if committed else TransactionResult.ABORT
        if not supports_epoch_bump(transaction_version):
            return self._end_transaction(transactional_id, producer_id, producer_epoch, result, from_client=True), -1, -1
        error, found = self._find(transactional_id)
        if found is None:
            return error, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        metadata = found.transaction_metadata
        with metadata.lock:
            decided = self._decide_end_transaction_v2(metadata, producer_id, producer_epoch, committed)
        if not isinstance(decided, TxnTransitMetadata):
            return decided
        error = self._write_end_transaction(transactional_id, found.coordinator_epoch, metadata, decided, committed)
        if error != Errors.NO_ERROR:
            return error, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if decided.next_producer_id != NO_PRODUCER_ID:
            return Errors.NO_ERROR, decided.next_producer_id, 0
        return Errors.NO_ERROR, decided.producer_id, decided.producer_epoch

    def _decide_end_transaction_v2(self, metadata: TransactionMetadata, producer_id: int, producer_epoch: int,
                                   commit: bool) -> TxnTransitMetadata | tuple[Errors, int, int]:
        """The PrepareCommit/PrepareAbort transit of a version 2 EndTxn, or its answer when
        nothing is written (caller holds the metadata lock)."""
        S = TransactionState
        state = metadata.state
        retry_on_overflow = (metadata.previous_producer_id == producer_id and producer_epoch == SHORT_MAX_VALUE - 1
                             and metadata.producer_epoch == 0)
        retry_on_bump = metadata.producer_epoch == producer_epoch + 1
        if state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            valid_epoch = retry_on_bump
        elif state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            valid_epoch = retry_on_bump or retry_on_overflow or producer_epoch == metadata.producer_epoch
        else:
            valid_epoch = producer_epoch == metadata.producer_epoch
        if metadata.producer_id != producer_id and not retry_on_overflow:
            return Errors.INVALID_PRODUCER_ID_MAPPING, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if not valid_epoch:
            return Errors.PRODUCER_FENCED, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        if metadata.pending_transition_in_progress:
            return Errors.CONCURRENT_TRANSACTIONS, NO_PRODUCER_ID, NO_PRODUCER_EPOCH
        retry = retry_on_bump or retry_on_overflow
        refused = (Errors.INVALID_TXN_STATE, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
        if state is S.ONGOING:
            no_partition_added = False
        elif state is S.COMPLETE_COMMIT or state is S.COMPLETE_ABORT:
            if retry:
                done = commit == (state is S.COMPLETE_COMMIT)
                return (Errors.NO_ERROR, metadata.producer_id, metadata.producer_epoch) if done else refused
            if commit:
                return refused
            no_partition_added = True
        elif state is S.EMPTY:
            if commit:
                return refused
            no_partition_added = True
        elif state is S.PREPARE_COMMIT or state is S.PREPARE_ABORT:
            same = commit == (state is S.PREPARE_COMMIT)
            return (Errors.CONCURRENT_TRANSACTIONS, NO_PRODUCER_ID, NO_PRODUCER_EPOCH) if same else refused
        else:
            raise IllegalStateError(f"Found transactionalId {metadata.transactional_id} with state {state}")
        # the bumped epoch would be Short.MAX_VALUE: the Complete state moves to a new producer id
        next_producer_id = self._allocate() if metadata.is_producer_epoch_exhausted else NO_PRODUCER_ID
        return metadata.prepare_abort_or_commit(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, _now_ms(),
                                                client_transaction_version=2, next_producer_id=next_producer_id,
                                                no_partition_added=no_partition_added)

    def _end_transaction(self, transactional_id: str, producer_id: int, producer_epoch: int,
                         result: TransactionResult, from_client: bool, fence: TxnTransitMetadata | None = None) -> Errors:
        error, found = self._find(transactional_id)
        if found is None:
            return error
        metadata, coordinator_epoch = found.transaction_metadata, found.coordinator_epoch
        epoch_fence = False
        with metadata.lock:
            if metadata.producer_id != producer_id:
                return Errors.INVALID_PRODUCER_ID_MAPPING
            if (from_client and producer_epoch != metadata.producer_epoch) or producer_epoch < metadata.producer_epoch:
                return Errors.PRODUCER_FENCED
            if metadata.pending_transition_in_progress and metadata.pending_state is not TransactionState.PREPARE_EPOCH_FENCE:
                return Errors.CONCURRENT_TRANSACTIONS
            state = metadata.state
            commit = result is TransactionResult.COMMIT
            if state is TransactionState.ONGOING:
                if not commit and fence is not None and metadata.pending_state is TransactionState.PREPARE_EPOCH_FENCE:
                    epoch_fence = True
                    transit = metadata.prepare_abort_after_epoch_fence(fence, _now_ms())
                else:
                    transit = metadata.prepare_abort_or_commit(
                        TransactionState.PREPARE_COMMIT if commit else TransactionState.PREPARE_ABORT, _now_ms(),
                        client_transaction_version=0)
            elif state is TransactionState.COMPLETE_COMMIT:
                return Errors.NO_ERROR if commit else Errors.INVALID_TXN_STATE
            elif state is TransactionState.COMPLETE_ABORT:
                return Errors.NO_ERROR if not commit else Errors.INVALID_TXN_STATE
            elif state is TransactionState.PREPARE_COMMIT:
                return Errors.CONCURRENT_TRANSACTIONS if commit else Errors.INVALID_TXN_STATE
            elif state is TransactionState.PREPARE_ABORT:
                return Errors.CONCURRENT_TRANSACTIONS if not commit else Errors.INVALID_TXN_STATE
            elif state is TransactionState.EMPTY:
                return Errors.INVALID_TXN_STATE
            else:
                raise IllegalStateError(f"Found transactionalId {transactional_id} with state {state}")
        return self._write_end_transaction(transactional_id, coordinator_epoch, metadata, transit,
                                           result is TransactionResult.COMMIT, epoch_fence)

    def _write_end_transaction(self, transactional_id: str, coordinator_epoch: int, metadata: TransactionMetadata,
                               transit: TxnTransitMetadata, committed: bool, epoch_fence: bool = False) -> Errors:
        """Write a prepared PrepareCommit/PrepareAbort ``transit``, the markers (with the
        transit's producer id and epoch) and CompleteCommit/CompleteAbort."""
        producer_id = transit.producer_id
        # PrepareCommit/PrepareAbort, the markers and CompleteCommit/CompleteAbort are queued back to
        # back and commit together: the writer commits in queue order and stops at its first failed
        # commit, so a marker is never durable without the Prepare record, nor the Complete record
        # without every marker (one commit instead of three on the EndTxn path). Only the Complete
        # record is urgent, so that no flusher takes the queue between them (the Prepare record
        # alone, refused markers, still commit after the writer's linger)
        decided = self.state.queue_transaction_to_log(transactional_id, coordinator_epoch, transit, urgent=False)
        completed_at = _now_ms()
        complete = TransactionMetadata.complete_transit_after(transit, completed_at)
        markers, completion = self._queue_markers_and_complete(transactional_id, coordinator_epoch, committed,
                                                               transit, complete, decided)
        error = self.state.complete_transaction_append(decided)
        if error == Errors.NO_ERROR:
            self._forget(producer_id)  # the outcome is decided: no partition can join any more
        else:
            if epoch_fence:
                with metadata.lock:
                    metadata.has_failed_epoch_fence = True
            return error
        with metadata.lock:
            mismatch = _identity_error(metadata, producer_id, transit.producer_epoch)
            if mismatch is not None:
                return mismatch
            expected = TransactionState.PREPARE_COMMIT if committed else TransactionState.PREPARE_ABORT
            if metadata.state is not expected:
                return Errors.INVALID_TXN_STATE
            prepared = metadata.prepare_complete(completed_at)
        assert prepared == complete, f"the queued Complete record {complete} differs from the transition {prepared}"
        if completion is None:  # a marker was refused when queued: write the others, with retries
            return self._send_markers_and_complete(transactional_id, coordinator_epoch, committed, metadata, complete,
                                                   already_queued=markers)
        for future in markers.values():
            error = self._marker_error(transactional_id, metadata, None, future.result().error)
            if error is not None:
                return error
        return self.state.complete_transaction_append(completion)

    def _queue_markers_and_complete(self, transactional_id: str, coordinator_epoch: int, committed: bool,
                                    prepared: TxnTransitMetadata, complete: TxnTransitMetadata,
                                    decided: TxnLogAppend) -> tuple[dict[tuple[str, int], Future], TxnLogAppend | None]:
        """Queue the markers of a transaction whose Prepare record is queued (``decided``), then
        its Complete record. Returns the queued markers' futures by partition and the queued
        Complete record; None instead of the latter when the Prepare record or a marker was
        refused at once (nothing more is queued then: the caller waits for the Prepare record
        and writes the other markers, with retries)."""
        if _refused_at_once(decided):
            return {}, None
        (answer,) = self.writer.append_txn_markers([TxnMarker(
            prepared.producer_id, prepared.producer_epoch, coordinator_epoch, committed,
            tuple(sorted(prepared.topic_partitions)))], urgent=False)
        markers = {tp: value for tp, value in answer.items()
                   if isinstance(value, Future) and not (value.done() and value.result().error != Errors.NO_ERROR)}
        if len(markers) != len(answer):
            self.writer.request_flush()  # no urgent Complete record follows: the caller waits for these
            return markers, None
        return markers, self.state.queue_transaction_to_log(transactional_id, coordinator_epoch, complete)

    def _send_markers_and_complete(self, transactional_id: str, coordinator_epoch: int, committed: bool,
                                   metadata: TransactionMetadata, complete: TxnTransitMetadata,
                                   already_queued: dict[tuple[str, int], Future] | None = None) -> Errors:
        """Write the markers to every partition of the transaction, then CompleteCommit/CompleteAbort
        (Kafka's ``TransactionMarkerChannelManager``). Retriable marker errors are retried; a
        partition whose topic is gone is dropped from the transaction, as Kafka does.
        ``already_queued``: markers queued before (their partitions get no second marker).

        The markers are queued, and CompleteCommit/CompleteAbort is appended right behind them
        without waiting for their commit: the writer commits in queue order and stops at its
        first failed commit, so the Complete record is never durable without every marker
        before it (one commit instead of two on the EndTxn path).
        """
        already_queued = already_queued or {}
        queued: list[Future] = list(already_queued.values())
        remaining = tuple(sorted(tp for tp in metadata.topic_partitions if tp not in already_queued))
        for attempt in range(MARKER_RETRIES):
            if not remaining:
                break
            (answer,) = self.writer.append_txn_markers(
                [TxnMarker(metadata.producer_id, metadata.producer_epoch, coordinator_epoch, committed, remaining)])
            retry = []
            for tp, value in answer.items():
                if isinstance(value, Future):
                    queued.append(value)
                    continue
                error = self._marker_error(transactional_id, metadata, tp, value)
                if error is not None:
                    return error
                if value.retriable and value != Errors.UNKNOWN_TOPIC_OR_PART:
                    retry.append(tp)
            remaining = tuple(retry)
            if not remaining:
                break
            time.sleep(0.05 * (attempt + 1))
        if remaining:
            with metadata.lock:
                metadata.pending_state = None
            return Errors.COORDINATOR_NOT_AVAILABLE
        completed = self.state.append_transaction_to_log(transactional_id, coordinator_epoch, complete)
        for future in queued:
            error = self._marker_error(transactional_id, metadata, None, future.result().error)
            if error is not None:
                assert completed != Errors.NO_ERROR, "a Complete record was committed before a failed marker"
                return error
        return completed

    @staticmethod
    def _marker_error(transactional_id: str, metadata: TransactionMetadata, tp, error: Errors) -> Errors | None:
        """None for a written marker, a gone topic (Kafka drops the partition) or a retriable
        refusal; else the coordinator's answer, with the pending transition cleared."""
        if error == Errors.NO_ERROR or error.retriable:
            return None
        log.error("marker for %s of %s refused with %s", tp, transactional_id, error.name)
        with metadata.lock:
            metadata.pending_state = None
        return Errors.NOT_COORDINATOR if error in (Errors._FENCED, Errors.TRANSACTION_COORDINATOR_FENCED) else error

    # ------------------------------------------------------------------ timeouts
    def abort_timed_out_transactions(self, now: int | None = None) -> list[str]:
        """Abort, with an epoch bump, every Ongoing transaction past its timeout (Kafka's
        ``abortTimedOutTransactions``): the old producer is fenced. Returns the ids aborted."""
        aborted = []
        for txn in self.state.timed_out_transactions(now):
            found = self.state.get_transaction_state(txn.transactional_id)
            if found is None:
                continue
            metadata = found.transaction_metadata
            with metadata.lock:
                if metadata.producer_id != txn.producer_id or metadata.pending_transition_in_progress:
                    continue
                fence = metadata.prepare_fence_producer_epoch()
            error = self._end_transaction(txn.transactional_id, fence.producer_id, fence.producer_epoch,
                                          TransactionResult.ABORT, from_client=False, fence=fence)
            if error == Errors.NO_ERROR:
                aborted.append(txn.transactional_id)
            else:
                log.info("aborting timed-out transaction %s failed: %s", txn.transactional_id, error.name)
        return aborted
