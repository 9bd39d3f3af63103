"""A transactional id's state at the transaction coordinator: Kafka's ``TransactionMetadata``.

Follows ``org.apache.kafka.coordinator.transaction.TransactionMetadata`` /
``TransactionState`` / ``TxnTransitMetadata`` (formerly
``kafka.coordinator.transaction.TransactionMetadata.scala``): KIP-98 transactions, KIP-360
safe epoch bumps, KIP-890 part 1 and -- for clients of transaction version 2 (KIP-890 part 2,
:attr:`TransactionMetadata.client_transaction_version`) -- the epoch bump at every EndTxn:
PrepareCommit/PrepareAbort carry epoch + 1 (the markers are written with it), and when that
epoch is ``Short.MAX_VALUE`` the Complete state moves to the next producer id at epoch 0.

Every change is two-phase, exactly as in Kafka:

1. a ``prepare_*`` method checks the transition, sets :attr:`TransactionMetadata.pending_state`
   and returns a :class:`TxnTransitMetadata` -- an immutable snapshot of the would-be state
   -- without changing anything else;
2. the coordinator writes that snapshot to ``__transaction_state``
   (:meth:`TransactionStateManager.append_transaction_to_log`) and only once it is durable
   calls :meth:`TransactionMetadata.complete_transition_to`, which validates the snapshot
   against the current state and applies it. A failed write clears the pending state.

While a transition is pending every other ``prepare_*`` call raises
:class:`IllegalStateError`; the coordinator checks :attr:`pending_transition_in_progress`
first and answers CONCURRENT_TRANSACTIONS.

State machine (Kafka's ``validPreviousStates``)::

    Empty          <- Empty, CompleteCommit, CompleteAbort        (InitProducerId)
    Ongoing        <- Ongoing, Empty, CompleteCommit, CompleteAbort (AddPartitions/AddOffsets)
    PrepareCommit  <- Ongoing                                      (EndTxn commit)
    PrepareAbort   <- Ongoing, PrepareEpochFence                   (EndTxn abort, fencing)
                      Empty, CompleteCommit, CompleteAbort         (version 2: abort of no partition)
    CompleteCommit <- PrepareCommit                                (markers written)
    CompleteAbort  <- PrepareAbort                                 (markers written)
    Dead           <- Empty, CompleteCommit, CompleteAbort         (transactional id expired)
    PrepareEpochFence <- Ongoing                                   (InitProducerId/timeout while Ongoing)

Methods are not thread-safe (Kafka's ``@nonthreadsafe``): hold :attr:`TransactionMetadata.lock`
(``with metadata.lock:``) around a prepare and the decisions that lead to it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass
from enum import Enum
from typing import Iterable, NamedTuple

from txlake.formats.errors import TxlakeError
from txlake.formats.transaction_log import TxnLogValue

from .errors import ApiError, Errors

log = logging.getLogger(__name__)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
#: Java's ``Short.MAX_VALUE``: the largest producer epoch.
SHORT_MAX_VALUE = 2**15 - 1

TopicPartition = tuple[str, int]


class IllegalStateError(TxlakeError):
    """A transition Kafka's TransactionMetadata refuses with ``IllegalStateException``.

    It means the caller broke the protocol (a coordinator bug or a corrupt log), never that
    a client sent a bad request: client errors are answered with Kafka error codes.
    """


def _short(value: int) -> int:
    """Java's ``(short)`` cast: wrap to a signed 16-bit integer."""
    return (value + 2**15) % 2**16 - 2**15


def is_epoch_exhausted(producer_epoch: int) -> bool:
    """Kafka's ``TransactionMetadata.isEpochExhausted``: ``epoch >= Short.MAX_VALUE - 1``.

    The last epoch is never handed to a client, so the coordinator can always fence.
    """
    return producer_epoch >= SHORT_MAX_VALUE - 1


class TransactionState(Enum):
    """Kafka's ``TransactionState``: value = its id in the log, :attr:`state_name` = Kafka's name."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def id(self) -> int:
        """The state's id (Kafka's ``TransactionState.id``)."""
        return self.value

    @property
    def state_name(self) -> str:
        """Kafka's name (``Empty``, ``PrepareCommit``...), as DescribeTransactions reports it."""
        return _STATE_NAMES[self]

    @property
    def valid_previous_states(self) -> frozenset[TransactionState]:
        """The states this one may be entered from (Kafka's ``validPreviousStates``)."""
        return VALID_PREVIOUS_STATES[self]

    @property
    def is_expiration_allowed(self) -> bool:
        """Whether an idle transactional id in this state may expire (Kafka's ``isExpirationAllowed``)."""
        return self in (TransactionState.EMPTY, TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)

    @classmethod
    def from_name(cls, name: str) -> TransactionState | None:
        """The state with Kafka's ``name``, or None (Kafka's ``TransactionState.fromName``)."""
        return _BY_NAME.get(name)

    @classmethod
    def from_id(cls, state_id: int) -> TransactionState:
        """The state with this id (Kafka's ``TransactionState.fromId``).

        Raises:
            IllegalStateError: an unknown id.
        """
        try:
            return cls(state_id)
        except ValueError:
            raise IllegalStateError(f"Unknown transaction state id {state_id} from the transaction status message") from None

    def __str__(self) -> str:
        return self.state_name


_STATE_NAMES = {
    TransactionState.EMPTY: "Empty",
    TransactionState.ONGOING: "Ongoing",
    TransactionState.PREPARE_COMMIT: "PrepareCommit",
    TransactionState.PREPARE_ABORT: "PrepareAbort",
    TransactionState.COMPLETE_COMMIT: "CompleteCommit",
    TransactionState.COMPLETE_ABORT: "CompleteAbort",
    TransactionState.DEAD: "Dead",
    TransactionState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_BY_NAME = {name: state for state, name in _STATE_NAMES.items()}

_S = TransactionState
#: Kafka's ``TransactionState.validPreviousStates`` (PrepareAbort from Empty, CompleteCommit and
#: CompleteAbort is a transaction version 2 abort of a transaction that added no partition; the
#: coordinator allows it only for version 2).
VALID_PREVIOUS_STATES: dict[TransactionState, frozenset[TransactionState]] = {
    _S.EMPTY: frozenset({_S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.ONGOING: frozenset({_S.ONGOING, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.PREPARE_COMMIT: frozenset({_S.ONGOING}),
    _S.PREPARE_ABORT: frozenset({_S.ONGOING, _S.PREPARE_EPOCH_FENCE, _S.EMPTY, _S.COMPLETE_COMMIT, _S.COMPLETE_ABORT}),
    _S.COMPLETE_COMMIT: frozenset({_S.PREPARE_COMMIT}),
    _S.COMPLETE_ABORT: frozenset({_S.PREPARE_ABORT}),
    _S.DEAD: frozenset({_S.EMPTY, _S.COMPLETE_ABORT, _S.COMPLETE_COMMIT}),
    _S.PREPARE_EPOCH_FENCE: frozenset({_S.ONGOING}),
}
del _S


class TransactionResult(Enum):
    """Kafka's ``TransactionResult``; the value is the control record type (0 ABORT, 1 COMMIT)."""

    ABORT = 0
    COMMIT = 1


class ProducerIdAndEpoch(NamedTuple):
    """Kafka's ``ProducerIdAndEpoch``: what a KIP-360 InitProducerId names as its current identity."""

    producer_id: int
    epoch: int


@dataclass(frozen=True)
class TxnTransitMetadata:
    """Immutable snapshot of a would-be state (Kafka's ``TxnTransitMetadata``).

    ``previous_producer_id`` is the producer id the metadata had when the transition was
    prepared. This is exactly what is written to ``__transaction_state``.
    """

    producer_id: int
    previous_producer_id: int
    next_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    txn_state: TransactionState
    topic_partitions: frozenset[TopicPartition]
    txn_start_timestamp: int
    txn_last_update_timestamp: int
    client_transaction_version: int = 0

    def to_log_value(self) -> TxnLogValue:
        """The ``__transaction_state`` value of this snapshot (Kafka's ``TransactionLog.valueToBytes``).

        Raises:
            IllegalStateError: an Empty state with partitions (Kafka refuses to write it).
        """
        if self.txn_state is TransactionState.EMPTY and self.topic_partitions:
            raise IllegalStateError(f"Transaction is not expected to have any partitions since its state is "
                                    f"{self.txn_state}: {self}")
        return TxnLogValue(
            producer_id=self.producer_id, previous_producer_id=self.previous_producer_id,
            next_producer_id=self.next_producer_id, producer_epoch=self.producer_epoch,
            last_producer_epoch=self.last_producer_epoch, txn_timeout_ms=self.txn_timeout_ms,
            state=self.txn_state.state_name, topic_partitions=tuple(self.topic_partitions),
            txn_start_timestamp=self.txn_start_timestamp, txn_last_update_timestamp=self.txn_last_update_timestamp,
            client_transaction_version=self.client_transaction_version)


#: Kafka's ``TransactionVersion`` levels (feature ``transaction.version``): 2 bumps the epoch at every EndTxn
TRANSACTION_VERSION_2 = 2


def supports_epoch_bump(transaction_version: int) -> bool:
    """Kafka's ``TransactionVersion.supportsEpochBump``: version 2 and above (KIP-890 part 2)."""
    return transaction_version >= TRANSACTION_VERSION_2


_UNSET = object()


class TransactionMetadata:
    """The coordinator's view of one transactional id (Kafka's ``TransactionMetadata``).

    Attributes:
        transactional_id: the id.
        producer_id / producer_epoch: the identity currently handed to the producer.
        previous_producer_id: the producer id before the last completed transition (-1 if none).
        next_producer_id: producer id for the epoch after an overflow (KIP-890 part 2; -1 here).
        last_producer_epoch: the epoch before the last KIP-360 bump, so a retried
            InitProducerId gets the same answer (-1 if none).
        txn_timeout_ms: the transaction timeout the producer asked for.
        state: the current :class:`TransactionState`.
        topic_partitions: the ``(topic, partition)`` pairs of the ongoing transaction.
        txn_start_timestamp: ms when the first partition was added (-1 if no transaction).
        txn_last_update_timestamp: ms of the last completed transition (used for expiration).
        pending_state: the state of a prepared, not yet completed transition, else None.
        client_transaction_version: the transaction version of the client's last AddPartitions
            or EndTxn (Kafka's ``clientTransactionVersion``: 2 for Produce v12+, AddPartitionsToTxn
            v4+ not verify-only, TxnOffsetCommit v5+, EndTxn v5+; else 0).
        has_failed_epoch_fence: an epoch fence was prepared but its log write failed, so the
            next fence must not bump the epoch again (Kafka's ``hasFailedEpochFence``).
        lock: guards the object (Kafka's ``inLock``); reentrant.
    """

    __hash__ = None  # mutable, compared by value

    def __init__(self, transactional_id: str, producer_id: int, *,
                 previous_producer_id: int = NO_PRODUCER_ID, next_producer_id: int = NO_PRODUCER_ID,
                 producer_epoch: int = NO_PRODUCER_EPOCH, last_producer_epoch: int = NO_PRODUCER_EPOCH,
                 txn_timeout_ms: int = 60_000, state: TransactionState = TransactionState.EMPTY,
                 topic_partitions: Iterable[TopicPartition] = (), txn_start_timestamp: int = -1,
                 txn_last_update_timestamp: int = -1, client_transaction_version: int = 0):
        self.transactional_id = transactional_id
        self.producer_id = producer_id
        self.previous_producer_id = previous_producer_id
        self.next_producer_id = next_producer_id
        self.producer_epoch = producer_epoch
        self.last_producer_epoch = last_producer_epoch
        self.txn_timeout_ms = txn_timeout_ms
        self.state = state
        self.topic_partitions: set[TopicPartition] = set(topic_partitions)
        self.txn_start_timestamp = txn_start_timestamp
        self.txn_last_update_timestamp = txn_last_update_timestamp
        self.client_transaction_version = client_transaction_version
        self.pending_state: TransactionState | None = None
        self.has_failed_epoch_fence = False
        self.lock = threading.RLock()

    # ------------------------------------------------------------------ small helpers
    @property
    def pending_transition_in_progress(self) -> bool:
        """True while a prepared transition awaits its log write (Kafka's ``pendingTransitionInProgress``)."""
        return self.pending_state is not None

    @property
    def is_producer_epoch_exhausted(self) -> bool:
        """True when the epoch is ``>= Short.MAX_VALUE - 1`` (Kafka's ``isProducerEpochExhausted``).

        The coordinator then rotates to a new producer id instead of bumping the epoch.
        """
        return is_epoch_exhausted(self.producer_epoch)

    @property
    def has_pending_transaction(self) -> bool:
        """True in Ongoing, PrepareAbort and PrepareCommit (Kafka's ``hasPendingTransaction``)."""
        return self.state in (TransactionState.ONGOING, TransactionState.PREPARE_ABORT, TransactionState.PREPARE_COMMIT)

    def add_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Add partitions in place (Kafka's ``addPartitions``; used when loading and by tests)."""
        self.topic_partitions.update(partitions)

    def remove_partition(self, topic_partition: TopicPartition) -> None:
        """Forget a partition whose marker was written (Kafka's ``removePartition``).

        Raises:
            IllegalStateError: not in PrepareCommit or PrepareAbort.
        """
        if self.state not in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
            raise IllegalStateError(
                f"Transaction metadata's current state is {self.state}, and its pending state is {self.pending_state} "
                "while trying to remove partitions whose txn marker has been sent, this is not expected")
        self.topic_partitions.discard(topic_partition)

    def is_valid_expected_producer_id(self, expected: ProducerIdAndEpoch) -> bool:
        """Whether a KIP-360 InitProducerId naming ``expected`` may proceed.

        Follows the ``isValidProducerId`` check of Kafka's
        ``TransactionCoordinator.prepareInitProducerIdTransit``: valid when the metadata was
        just created (epoch -1), when the producer id is the current one (the epoch is
        checked by :meth:`prepare_increment_producer_epoch`), or when it is the previous
        one with an exhausted epoch (a retry after a producer-id rotation).
        """
        return (self.producer_epoch == NO_PRODUCER_EPOCH
                or expected.producer_id == self.producer_id
                or (expected.producer_id == self.previous_producer_id and is_epoch_exhausted(expected.epoch)))

    # ------------------------------------------------------------------ prepare methods
    def prepare_no_transit(self) -> TxnTransitMetadata:
        """A snapshot of the current state without any transition (Kafka's ``prepareNoTransit``).

        Sets no pending state; used by tests and to write the current state as is.
        """
        return TxnTransitMetadata(
            self.producer_id, self.previous_producer_id, self.next_producer_id, self.producer_epoch,
            self.last_producer_epoch, self.txn_timeout_ms, self.state, frozenset(self.topic_partitions),
            self.txn_start_timestamp, self.txn_last_update_timestamp, self.client_transaction_version)

    def prepare_fence_producer_epoch(self) -> TxnTransitMetadata:
        """Prepare PrepareEpochFence with a bumped epoch (Kafka's ``prepareFenceProducerEpoch``).

        Used when InitProducerId or the timeout scheduler finds the transaction Ongoing: the
        epoch is bumped so the old producer is fenced, then the coordinator aborts with
        :meth:`prepare_abort_after_epoch_fence`. This transit is never written to the log.

        The epoch is not bumped again when the previous fence's write failed (that epoch
        was never handed out), nor past ``Short.MAX_VALUE``: an epoch already at the maximum
        is logged as an error and kept, so the transaction can still be aborted and the
        next InitProducerId rotates the producer id (Kafka 4.x, KAFKA-20090; earlier Kafka
        threw IllegalStateException here and left the transaction stuck).

        Raises:
            IllegalStateError: the state is not Ongoing, or a transition is pending.
        """
        if self.producer_epoch == SHORT_MAX_VALUE:
            log.error("Fencing producer %s %d with epoch equal to Short.MaxValue: this must not happen unless "
                      "there is a bug", self.transactional_id, self.producer_id)
        if self.has_failed_epoch_fence or self.producer_epoch == SHORT_MAX_VALUE:
            bumped = self.producer_epoch
        else:
            bumped = _short(self.producer_epoch + 1)
        return self.prepare_transition_to(TransactionState.PREPARE_EPOCH_FENCE, producer_epoch=bumped,
                                          last_producer_epoch=NO_PRODUCER_EPOCH)

    def prepare_abort_after_epoch_fence(self, fence: TxnTransitMetadata, update_timestamp: int) -> TxnTransitMetadata:
        """Turn a prepared epoch fence into PrepareAbort under the fenced epoch.

        Follows the ``isEpochFence`` branch of Kafka's ``TransactionCoordinator.endTransaction``
        (called with ``isFromClient = false``): the PrepareEpochFence pending state is
        dropped, the fenced epoch becomes the current epoch in memory (last epoch -1), and
        PrepareAbort is prepared. If writing that transit fails, set
        :attr:`has_failed_epoch_fence` so the next fence reuses the epoch.

        Raises:
            IllegalStateError: no epoch fence is pending, or the state is not Ongoing.
        """
        if self.pending_state is not TransactionState.PREPARE_EPOCH_FENCE or fence.txn_state is not TransactionState.PREPARE_EPOCH_FENCE:
            raise IllegalStateError(f"TransactionalId {self.transactional_id} has no pending epoch fence "
                                    f"(pending state {self.pending_state}); cannot abort under a fenced epoch")
        if self.state is not TransactionState.ONGOING:
            raise IllegalStateError(f"TransactionalId {self.transactional_id} is {self.state}; an epoch fence "
                                    "aborts only an Ongoing transaction")
        if fence.producer_id != self.producer_id or fence.producer_epoch < self.producer_epoch:
            raise IllegalStateError(f"Epoch fence {fence} does not belong to {self}")
        self.pending_state = None
        self.producer_epoch = fence.producer_epoch
        self.last_producer_epoch = NO_PRODUCER_EPOCH
        # the fence bumped the epoch already: no second bump, whatever the client's transaction
        # version (Kafka's KAFKA-19367)
        return self.prepare_abort_or_commit(TransactionState.PREPARE_ABORT, update_timestamp, client_transaction_version=0)

    def prepare_increment_producer_epoch(self, new_txn_timeout_ms: int,
                                         expected_producer_id_and_epoch: ProducerIdAndEpoch | int | None,
                                         update_timestamp: int) -> TxnTransitMetadata:
        """Prepare Empty with the next epoch: InitProducerId (Kafka's ``prepareIncrementProducerEpoch``).

        Without an expected identity the epoch is bumped and the last epoch cleared. With
        one (KIP-360; a bare int is taken as the expected epoch alone):

        * the producer id must pass :meth:`is_valid_expected_producer_id`, else PRODUCER_FENCED
          (the check of Kafka's ``TransactionCoordinator.prepareInitProducerIdTransit``);
        * no current epoch, or expected == current epoch: bump, last epoch = current epoch;
        * expected == last epoch: a retry of a bump that succeeded -- same epoch again;
        * anything else: PRODUCER_FENCED.

        Raises:
            ApiError: PRODUCER_FENCED.
            IllegalStateError: the epoch is exhausted (rotate the producer id instead with
                :meth:`prepare_producer_id_rotation`), or the transition is not legal.
        """
        expected_epoch: int | None
        if expected_producer_id_and_epoch is None:
            expected_epoch = None
        elif isinstance(expected_producer_id_and_epoch, int):
            expected_epoch = expected_producer_id_and_epoch
        else:
            expected = ProducerIdAndEpoch(*expected_producer_id_and_epoch)
            if not self.is_valid_expected_producer_id(expected):
                raise ApiError(Errors.PRODUCER_FENCED,
                               f"Producer id {expected.producer_id} of transactional id {self.transactional_id} was "
                               f"replaced by producer id {self.producer_id}: this producer has been fenced")
            expected_epoch = expected.epoch
        if self.is_producer_epoch_exhausted:
            raise IllegalStateError(f"Cannot allocate any more producer epochs for producerId {self.producer_id}")
        bumped = _short(self.producer_epoch + 1)
        if expected_epoch is None:
            epoch, last_epoch = bumped, NO_PRODUCER_EPOCH
        elif self.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == self.producer_epoch:
            epoch, last_epoch = bumped, self.producer_epoch
        elif expected_epoch == self.last_producer_epoch:
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        else:
            raise ApiError(Errors.PRODUCER_FENCED,
                           f"Expected producer epoch {expected_epoch} of transactional id {self.transactional_id} does "
                           f"not match current producer epoch {self.producer_epoch} or previous producer epoch "
                           f"{self.last_producer_epoch}: this producer has been fenced")
        return self.prepare_transition_to(TransactionState.EMPTY, producer_epoch=epoch, last_producer_epoch=last_epoch,
                                          txn_timeout_ms=new_txn_timeout_ms, topic_partitions=frozenset(),
                                          txn_start_timestamp=-1, txn_last_update_timestamp=update_timestamp)

    def prepare_producer_id_rotation(self, new_producer_id: int, new_txn_timeout_ms: int, update_timestamp: int,
                                     record_last_epoch: bool) -> TxnTransitMetadata:
        """Prepare Empty with a new producer id at epoch 0 (Kafka's ``prepareProducerIdRotation``).

        Used by InitProducerId once the epoch is exhausted. With ``record_last_epoch``
        (a KIP-360 request) the old epoch is kept as the last epoch so a retry is recognised.

        Raises:
            IllegalStateError: a transaction is Ongoing/PrepareCommit/PrepareAbort, or the
                transition is not legal.
        """
        if self.has_pending_transaction:
            raise IllegalStateError("Cannot rotate producer ids while a transaction is still pending")
        return self.prepare_transition_to(
            TransactionState.EMPTY, producer_id=new_producer_id, producer_epoch=0,
            last_producer_epoch=self.producer_epoch if record_last_epoch else NO_PRODUCER_EPOCH,
            txn_timeout_ms=new_txn_timeout_ms, topic_partitions=frozenset(), txn_start_timestamp=-1,
            txn_last_update_timestamp=update_timestamp)

    def prepare_add_partitions(self, added_topic_partitions: Iterable[TopicPartition],
                               update_timestamp: int, client_transaction_version: int = 0) -> TxnTransitMetadata:
        """Prepare Ongoing with more partitions (Kafka's ``prepareAddPartitions``).

        AddPartitionsToTxn and AddOffsetsToTxn, or their implicit form under transaction
        version 2 (a Produce v12+ or TxnOffsetCommit v5+ adds its partition). A transaction
        that starts here (from Empty, CompleteCommit or CompleteAbort) gets ``update_timestamp``
        as its start time; the snapshot records ``client_transaction_version``.

        Raises:
            IllegalStateError: the transition is not legal or one is pending.
        """
        if self.state in (TransactionState.EMPTY, TransactionState.COMPLETE_ABORT, TransactionState.COMPLETE_COMMIT):
            start = update_timestamp
        else:
            start = self.txn_start_timestamp
        return self.prepare_transition_to(
            TransactionState.ONGOING, topic_partitions=frozenset(self.topic_partitions) | frozenset(added_topic_partitions),
            txn_start_timestamp=start, txn_last_update_timestamp=update_timestamp,
            client_transaction_version=client_transaction_version)

    def prepare_abort_or_commit(self, new_state: TransactionState, update_timestamp: int,
                                client_transaction_version: int | None = None, next_producer_id: int = NO_PRODUCER_ID,
                                no_partition_added: bool = False) -> TxnTransitMetadata:
        """Prepare PrepareCommit or PrepareAbort: EndTxn (Kafka's ``prepareAbortOrCommit``).

        Transaction version 0/1 (``client_transaction_version`` below 2; None keeps the
        metadata's): producer id and epochs stay as they are. Version 2 (KIP-890 part 2):
        the epoch is bumped (the markers carry epoch + 1, fencing every request of the
        ending transaction) and the current epoch becomes the last epoch;
        ``next_producer_id`` is the producer id the Complete state moves to when the bumped
        epoch is ``Short.MAX_VALUE`` (the coordinator allocates it when the current epoch
        is exhausted), else -1. ``no_partition_added``: a version 2 abort of a transaction
        that added no partition (from Empty, CompleteCommit, CompleteAbort), whose start
        time is ``update_timestamp``.

        Raises:
            IllegalStateError: ``new_state`` is neither, or the transition is not legal (from
                another state than Ongoing only a version 2 abort is).
        """
        if new_state not in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
            raise IllegalStateError(f"EndTxn prepares PrepareCommit or PrepareAbort, not {new_state}")
        version = self.client_transaction_version if client_transaction_version is None else client_transaction_version
        if self.state not in (TransactionState.ONGOING, TransactionState.PREPARE_EPOCH_FENCE) and not (
                new_state is TransactionState.PREPARE_ABORT and supports_epoch_bump(version)):
            raise IllegalStateError(
                f"Preparing transaction state transition to {new_state} failed: only a transaction version 2 abort "
                f"may end a transaction in state {self.state} (transactional id {self.transactional_id})")
        if supports_epoch_bump(version):
            if self.producer_epoch >= SHORT_MAX_VALUE:
                raise IllegalStateError(f"Cannot bump the epoch {self.producer_epoch} of producer id {self.producer_id} "
                                        f"of transactional id {self.transactional_id} at EndTxn")
            epoch, last_epoch = self.producer_epoch + 1, self.producer_epoch
        else:
            epoch, last_epoch = self.producer_epoch, self.last_producer_epoch
        return self.prepare_transition_to(
            new_state, producer_epoch=epoch, last_producer_epoch=last_epoch, next_producer_id=next_producer_id,
            txn_start_timestamp=update_timestamp if no_partition_added else self.txn_start_timestamp,
            txn_last_update_timestamp=update_timestamp, client_transaction_version=version)

    def prepare_complete(self, update_timestamp: int) -> TxnTransitMetadata:
        """Prepare CompleteCommit/CompleteAbort once every marker is written (Kafka's ``prepareComplete``).

        The partitions are cleared; producer id, epochs and start time stay -- except after a
        transaction version 2 EndTxn that reached ``Short.MAX_VALUE`` (a next producer id is
        set): the producer id becomes the next one, at epoch 0 (the last epoch stays
        ``Short.MAX_VALUE - 1``, the last one the client saw).

        Raises:
            IllegalStateError: not in PrepareCommit/PrepareAbort, or a transition is pending.
        """
        new_state = (TransactionState.COMPLETE_COMMIT if self.state is TransactionState.PREPARE_COMMIT
                     else TransactionState.COMPLETE_ABORT)
        rotate = supports_epoch_bump(self.client_transaction_version) and self.next_producer_id != NO_PRODUCER_ID
        transit = self.prepare_transition_to(new_state, next_producer_id=NO_PRODUCER_ID, topic_partitions=frozenset(),
                                             producer_id=self.next_producer_id if rotate else self.producer_id,
                                             producer_epoch=0 if rotate else self.producer_epoch,
                                             txn_last_update_timestamp=update_timestamp)
        # the fence's abort is durable: a later fence may bump the epoch again
        self.has_failed_epoch_fence = False
        return transit

    @staticmethod
    def complete_transit_after(prepared: TxnTransitMetadata, update_timestamp: int) -> TxnTransitMetadata:
        """The CompleteCommit/CompleteAbort snapshot that follows ``prepared`` (a PrepareCommit or
        PrepareAbort snapshot), built before ``prepared`` is complete: it equals what
        :meth:`prepare_complete` gives once it is. The coordinator queues it with the markers
        right behind the PrepareCommit/PrepareAbort record, so the three commit together.

        Raises:
            IllegalStateError: ``prepared`` is not a PrepareCommit/PrepareAbort snapshot.
        """
        if prepared.txn_state not in (TransactionState.PREPARE_COMMIT, TransactionState.PREPARE_ABORT):
            raise IllegalStateError(f"only PrepareCommit/PrepareAbort is followed by a Complete state, not {prepared}")
        new_state = (TransactionState.COMPLETE_COMMIT if prepared.txn_state is TransactionState.PREPARE_COMMIT
                     else TransactionState.COMPLETE_ABORT)
        rotate = supports_epoch_bump(prepared.client_transaction_version) and prepared.next_producer_id != NO_PRODUCER_ID
        return dataclasses.replace(prepared, previous_producer_id=prepared.producer_id, next_producer_id=NO_PRODUCER_ID,
                                   producer_id=prepared.next_producer_id if rotate else prepared.producer_id,
                                   producer_epoch=0 if rotate else prepared.producer_epoch,
                                   txn_state=new_state, topic_partitions=frozenset(),
                                   txn_last_update_timestamp=update_timestamp)

    def prepare_dead(self) -> TxnTransitMetadata:
        """Prepare Dead: the transactional id expires (Kafka's ``prepareDead``).

        The coordinator writes a tombstone, never this transit, and removes the metadata.

        Raises:
            IllegalStateError: not in Empty/CompleteCommit/CompleteAbort, or a transition is pending.
        """
        return self.prepare_transition_to(TransactionState.DEAD, topic_partitions=frozenset())

    def prepare_transition_to(self, state: TransactionState, *, producer_id=_UNSET, next_producer_id=_UNSET,
                              producer_epoch=_UNSET, last_producer_epoch=_UNSET, txn_timeout_ms=_UNSET,
                              topic_partitions=_UNSET, txn_start_timestamp=_UNSET,
                              txn_last_update_timestamp=_UNSET, client_transaction_version=_UNSET) -> TxnTransitMetadata:
        """Check a transition and mark it pending (Kafka's private ``prepareTransitionTo``).

        Fields not given keep their current value. The snapshot's previous producer id is
        the current producer id.

        Raises:
            IllegalStateError: a transition is already pending, or ``state`` may not follow
                the current state.
            ValueError: a negative producer id, or a negative epoch for a state other than Dead
                (Kafka's ``IllegalArgumentException``).
        """
        if self.pending_state is not None:
            raise IllegalStateError(f"Preparing transaction state transition to {state} while it already a pending "
                                    f"state {self.pending_state} (transactional id {self.transactional_id})")
        pid = self.producer_id if producer_id is _UNSET else producer_id
        epoch = self.producer_epoch if producer_epoch is _UNSET else producer_epoch
        if pid < 0:
            raise ValueError(f"Illegal new producer id {pid}")
        # a metadata created by InitProducerId has epoch -1 until its first bump, and may be
        # expired (Dead) without ever getting one
        if state is not TransactionState.DEAD and epoch < 0:
            raise ValueError(f"Illegal new producer epoch {epoch}")
        if self.state not in state.valid_previous_states:
            raise IllegalStateError(
                f"Preparing transaction state transition to {state} failed since the target state {state} is not a "
                f"valid previous state of the current state {self.state} (transactional id {self.transactional_id})")
        transit = TxnTransitMetadata(
            producer_id=pid,
            previous_producer_id=self.producer_id,
            next_producer_id=self.next_producer_id if next_producer_id is _UNSET else next_producer_id,
            producer_epoch=epoch,
            last_producer_epoch=self.last_producer_epoch if last_producer_epoch is _UNSET else last_producer_epoch,
            txn_timeout_ms=self.txn_timeout_ms if txn_timeout_ms is _UNSET else txn_timeout_ms,
            txn_state=state,
            topic_partitions=frozenset(self.topic_partitions if topic_partitions is _UNSET else topic_partitions),
            txn_start_timestamp=self.txn_start_timestamp if txn_start_timestamp is _UNSET else txn_start_timestamp,
            txn_last_update_timestamp=(self.txn_last_update_timestamp if txn_last_update_timestamp is _UNSET
                                       else txn_last_update_timestamp),
            client_transaction_version=(self.client_transaction_version if client_transaction_version is _UNSET
                                        else client_transaction_version))
        self.pending_state = state
        return transit

    # ------------------------------------------------------------------ complete
    def complete_transition_to(self, transit: TxnTransitMetadata) -> None:
        """Apply a prepared transition once its record is durable (Kafka's ``completeTransitionTo``).

        Checks, as Kafka does, that the snapshot is the pending state and is consistent
        with the current metadata:

        * Empty (InitProducerId): same epoch, epoch + 1, or epoch 0 with a new producer id;
          no partitions; no start time;
        * Ongoing (AddPartitions): same producer id and epoch; a superset of the partitions;
          same timeout;
        * PrepareCommit/PrepareAbort (EndTxn): same producer id and epoch, partitions,
          timeout and start time;
        * CompleteCommit/CompleteAbort (markers written): same producer id and epoch and
          timeout; a start time;
        * PrepareEpochFence and Dead are never completed.

        Update timestamps may go backwards (clock shifts are tolerated, as in Kafka).
        On success every field takes the snapshot's value and the pending state is cleared.

        Raises:
            IllegalStateError: no pending state, or the snapshot fails a check (the
                metadata is left unchanged, pending state included).
        """
        to_state = self.pending_state
        if to_state is None:
            raise IllegalStateError(f"TransactionalId {self.transactional_id} completing transaction state transition "
                                    "while it does not have a pending state")
        if to_state is not transit.txn_state:
            self._transition_failure(transit)
        S = TransactionState
        same_identity = transit.producer_epoch == self.producer_epoch and transit.producer_id == self.producer_id
        if supports_epoch_bump(transit.client_transaction_version):  # Kafka's validProducerEpoch for version 2
            if to_state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                same_identity = transit.last_producer_epoch == self.producer_epoch and transit.producer_id == self.producer_id
            elif to_state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT) and transit.producer_epoch == 0:
                same_identity = (transit.last_producer_epoch == self.last_producer_epoch
                                 and transit.previous_producer_id == self.producer_id)
        if to_state is S.EMPTY:
            bump_ok = (transit.producer_epoch == _short(self.producer_epoch + 1)
                       or (transit.producer_epoch == 0 and transit.producer_id != self.producer_id))
            if ((self.producer_epoch != transit.producer_epoch and not bump_ok)
                    or transit.topic_partitions or transit.txn_start_timestamp != -1):
                self._transition_failure(transit)
        elif to_state is S.ONGOING:
            if (not same_identity or not transit.topic_partitions >= self.topic_partitions
                    or self.txn_timeout_ms != transit.txn_timeout_ms):
                self._transition_failure(transit)
        elif to_state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            # version 2 may abort a transaction that added no partition: its start time is new
            empty_abort = (to_state is S.PREPARE_ABORT and supports_epoch_bump(transit.client_transaction_version)
                           and self.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT))
            if (not same_identity or self.topic_partitions != transit.topic_partitions
                    or self.txn_timeout_ms != transit.txn_timeout_ms
                    or (self.txn_start_timestamp != transit.txn_start_timestamp and not empty_abort)):
                self._transition_failure(transit)
        elif to_state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            if not same_identity or self.txn_timeout_ms != transit.txn_timeout_ms or transit.txn_start_timestamp == -1:
                self._transition_failure(transit)
        elif to_state is S.PREPARE_EPOCH_FENCE:
            # a fence is always followed by PrepareAbort (prepare_abort_after_epoch_fence)
            self._transition_failure(transit)
        else:  # Dead
            raise IllegalStateError(
                f"TransactionalId {self.transactional_id} is trying to complete a transition to {to_state}. This "
                "means that the transactionalId was being expired, and the only acceptable completion of this "
                f"operation is to remove the transaction metadata from the cache, not to persist the {to_state} in the log.")
        self.producer_id = transit.producer_id
        self.previous_producer_id = transit.previous_producer_id
        self.next_producer_id = transit.next_producer_id
        self.producer_epoch = transit.producer_epoch
        self.last_producer_epoch = transit.last_producer_epoch
        self.txn_timeout_ms = transit.txn_timeout_ms
        self.topic_partitions = set(transit.topic_partitions)
        self.txn_start_timestamp = transit.txn_start_timestamp
        self.txn_last_update_timestamp = transit.txn_last_update_timestamp
        self.client_transaction_version = transit.client_transaction_version
        self.pending_state = None
        self.state = to_state

    def _transition_failure(self, transit: TxnTransitMetadata) -> None:
        raise IllegalStateError(f"TransactionalId {self.transactional_id} failed transition to state {transit} "
                                f"due to unexpected metadata {self!r}")

    # ------------------------------------------------------------------ log values
    def to_log_value(self) -> TxnLogValue:
        """The ``__transaction_state`` value of the current state (see :meth:`TxnTransitMetadata.to_log_value`)."""
        return self.prepare_no_transit().to_log_value()

    @classmethod
    def from_log_value(cls, transactional_id: str, value: TxnLogValue) -> TransactionMetadata:
        """Rebuild metadata from a log value (Kafka's ``TransactionLog.readTxnRecordValue``).

        Partitions of an Empty state are ignored, as Kafka does. No pending state.

        Raises:
            IllegalStateError: an unknown state name.
        """
        state = TransactionState.from_name(value.state)
        if state is None:
            raise IllegalStateError(f"Unknown transaction state {value.state!r} of transactional id {transactional_id}")
        return cls(transactional_id, value.producer_id, previous_producer_id=value.previous_producer_id,
                   next_producer_id=value.next_producer_id, producer_epoch=value.producer_epoch,
                   last_producer_epoch=value.last_producer_epoch, txn_timeout_ms=value.txn_timeout_ms, state=state,
                   topic_partitions=() if state is TransactionState.EMPTY else value.topic_partitions,
                   txn_start_timestamp=value.txn_start_timestamp,
                   txn_last_update_timestamp=value.txn_last_update_timestamp,
                   client_transaction_version=value.client_transaction_version)

    # ------------------------------------------------------------------ dunder
    def _key(self) -> tuple:
        return (self.transactional_id, self.producer_id, self.previous_producer_id, self.next_producer_id,
                self.producer_epoch, self.last_producer_epoch, self.txn_timeout_ms, self.state,
                frozenset(self.topic_partitions), self.txn_start_timestamp, self.txn_last_update_timestamp,
                self.client_transaction_version)

    def __eq__(self, other: object) -> bool:
        """Equal persisted fields (Kafka's ``equals``); pending state and locks are not compared."""
        if not isinstance(other, TransactionMetadata):
            return NotImplemented
        return self._key() == other._key()

    def __repr__(self) -> str:
        return (f"TransactionMetadata(transactionalId={self.transactional_id}, producerId={self.producer_id}, "
                f"previousProducerId={self.previous_producer_id}, nextProducerId={self.next_producer_id}, "
                f"producerEpoch={self.producer_epoch}, lastProducerEpoch={self.last_producer_epoch}, "
                f"txnTimeoutMs={self.txn_timeout_ms}, state={self.state}, pendingState={self.pending_state}, "
                f"topicPartitions={sorted(self.topic_partitions)}, txnStartTimestamp={self.txn_start_timestamp}, "
                f"txnLastUpdateTimestamp={self.txn_last_update_timestamp}, "
                f"clientTransactionVersion={self.client_transaction_version})")
