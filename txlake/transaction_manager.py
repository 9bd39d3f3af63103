"""The transactional producer's state machine (Kafka's client ``TransactionManager``).

States: UNINITIALIZED -> (init_transactions) -> READY -> (begin_transaction) ->
IN_TRANSACTION -> (commit/abort) -> READY; any state -> ABORTABLE_ERROR (a failed send
or coordinator request: only ``abort_transaction`` leaves it) or FATAL_ERROR (fenced:
every later call fails ``fatal()``). Calls out of order raise ``_STATE``, as librdkafka.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import TYPE_CHECKING, Callable

from txlake.engine.errors import ApiError, Errors

from .error import KafkaError, KafkaException

if TYPE_CHECKING:
    from txlake.engine.transaction_coordinator import TransactionCoordinator

#: coordinator answers that mean "try again shortly"
_RETRY = frozenset({Errors.CONCURRENT_TRANSACTIONS, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                    Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR, Errors.REQUEST_TIMED_OUT})
#: answers that fence this producer for good
_FATAL = frozenset({Errors.PRODUCER_FENCED, Errors.INVALID_PRODUCER_EPOCH, Errors._FENCED,
                    Errors.TRANSACTIONAL_ID_NOT_FOUND, Errors.INVALID_PRODUCER_ID_MAPPING,
                    Errors.TRANSACTION_COORDINATOR_FENCED, Errors.INVALID_TRANSACTION_TIMEOUT})
RETRY_BACKOFF_S = 0.02


class TxnState(Enum):
    """Kafka's ``TransactionManager.State``."""

    UNINITIALIZED = "Uninitialized"
    INITIALIZING = "Initializing"
    READY = "Ready"
    IN_TRANSACTION = "InTransaction"
    COMMITTING_TRANSACTION = "CommittingTransaction"
    ABORTING_TRANSACTION = "AbortingTransaction"
    ABORTABLE_ERROR = "AbortableError"
    FATAL_ERROR = "FatalError"


class TransactionManager:
    """Client side of one ``transactional.id``.

    Args:
        transactional_id / timeout_ms: the producer's ``transactional.id`` and ``transaction.timeout.ms``.
        coordinator: returns the storage root's transaction coordinator (takes the writer lease).
    """

    def __init__(self, transactional_id: str, timeout_ms: int, coordinator: Callable[[], "TransactionCoordinator"]):
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self._coordinator = coordinator
        self.state = TxnState.UNINITIALIZED
        self.producer_id = -1
        self.epoch = -1
        self.partitions: set[tuple[str, int]] = set()
        self.error: KafkaError | None = None

    # ------------------------------------------------------------------ state checks
    def _require(self, *states: TxnState, operation: str) -> None:
        if self.state is TxnState.FATAL_ERROR:
            raise KafkaException(self.error)
        if self.state not in states:
            if self.state is TxnState.ABORTABLE_ERROR and self.error is not None:
                raise KafkaException(self.error)
            raise KafkaException(KafkaError(Errors._STATE, f"Operation not valid in state {self.state.value}: {operation}"))

    def _fail(self, error: Errors, message: str, abortable: bool = True) -> KafkaException:
        """Move to FATAL_ERROR (fencing answers) or ABORTABLE_ERROR; return the exception to raise."""
        if error in _FATAL or not abortable:
            self.state = TxnState.FATAL_ERROR
            self.error = KafkaError(error, message, fatal=True)
        else:
            self.state = TxnState.ABORTABLE_ERROR
            self.error = KafkaError(error, message, txn_requires_abort=True)
        return KafkaException(self.error)

    def _call(self, request: Callable[[], Errors], timeout: float | None, what: str) -> Errors:
        """Send a coordinator request, retrying retriable answers until ``timeout`` (s)."""
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            try:
                error = request()
            except ApiError as exc:
                error = exc.error
            if error not in _RETRY:
                return error
            if deadline is not None and time.monotonic() >= deadline:
                raise KafkaException(KafkaError(Errors._TIMED_OUT, f"{what} timed out (last answer {error.name})",
                                                retriable=True))
            time.sleep(RETRY_BACKOFF_S)

    # ------------------------------------------------------------------ API
    def init_transactions(self, timeout: float | None) -> None:
        """InitProducerId: fence older instances, complete their transactions; UNINITIALIZED -> READY."""
        self._require(TxnState.UNINITIALIZED, TxnState.INITIALIZING, operation="init_transactions")
        self.state = TxnState.INITIALIZING
        answer: list = []

        def request() -> Errors:
            error, pid, epoch = self._coordinator().handle_init_producer_id(self.transactional_id, self.timeout_ms)
            answer[:] = [pid, epoch]
            return error

        error = self._call(request, timeout, "init_transactions")
        if error != Errors.NO_ERROR:
            raise self._fail(error, f"init_transactions failed: {error.name}", abortable=False)
        self.producer_id, self.epoch = answer
        self.state = TxnState.READY

    def begin_transaction(self) -> None:
        """READY -> IN_TRANSACTION (no request: the transaction starts with its first partition)."""
        self._require(TxnState.READY, operation="begin_transaction")
        self.partitions.clear()
        self.state = TxnState.IN_TRANSACTION

    def check_produce(self) -> None:
        """produce() is allowed only inside a transaction."""
        self._require(TxnState.IN_TRANSACTION, operation="produce")

    def add_partitions(self, partitions: frozenset[tuple[str, int]], timeout: float | None) -> Errors:
        """AddPartitionsToTxn for every partition of ``partitions`` in one request (Kafka's Sender
        batches the new partitions of a transaction the same way); retriable answers are
        retried for up to ``timeout`` s (the producer's delivery timeout). Called by the
        producer's transaction thread, never under the producer lock.

        Returns NO_ERROR (the partitions are in the transaction), or the error after moving to
        ABORTABLE_ERROR or FATAL_ERROR (PRODUCER_FENCED and other fencing answers).
        """
        def request() -> Errors:
            answers = self._coordinator().handle_add_partitions_to_txn(
                self.transactional_id, self.producer_id, self.epoch, partitions)
            return next(iter(answers.values()))  # one answer for all the partitions

        try:
            error = self._call(request, timeout, "AddPartitionsToTxn")
        except KafkaException as exc:  # retriable answers until the delivery timeout
            error = Errors(exc.args[0].code())
        if error == Errors.NO_ERROR:
            self.partitions |= partitions
        elif self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION, TxnState.ABORTING_TRANSACTION):
            names = ", ".join(f"{t} [{p}]" for t, p in sorted(partitions))
            self._fail(error, f"adding {names} to the transaction failed: {error.name}")
        return error

    def add_offsets(self, group_id: str, partition: int) -> tuple[str, int]:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition (``partition``) joins the transaction."""
        self._require(TxnState.IN_TRANSACTION, operation="send_offsets_to_transaction")
        tp = ("__consumer_offsets", partition)
        error = self._call(lambda: self._coordinator().handle_add_offsets_to_txn(
            self.transactional_id, self.producer_id, self.epoch, group_id), None, "AddOffsetsToTxn")
        if error != Errors.NO_ERROR:
            raise self._fail(error, f"AddOffsetsToTxn for group {group_id} failed: {error.name}")
        self.partitions.add(tp)
        return tp

    def send_failed(self, error: KafkaError) -> None:
        """A record of the transaction could not be written: the transaction must be aborted."""
        if self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION):
            self._fail(Errors(error.code()) if error.code() in Errors._value2member_map_ else Errors._FAIL,
                       f"a record of the transaction failed: {error.str()}")

    def end_transaction(self, committed: bool, timeout: float | None, flush: Callable[[float | None], int],
                        hand_over: Callable[[float | None], int] | None = None) -> None:
        """commit_transaction / abort_transaction: flush (or, for a commit, ``hand_over`` every
        record to the engine without waiting for its commit), then EndTxn; -> READY.

        Both return the records not delivered / not handed over in time."""
        if committed:
            self._require(TxnState.IN_TRANSACTION, operation="commit_transaction")
        else:
            self._require(TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, operation="abort_transaction")
        self.state = TxnState.COMMITTING_TRANSACTION if committed else TxnState.ABORTING_TRANSACTION
        left = (hand_over or flush)(timeout) if committed else flush(timeout)
        if left:
            raise KafkaException(KafkaError(Errors._TIMED_OUT, f"{left} records not delivered in time", retriable=True))
        if committed and self.state is TxnState.ABORTABLE_ERROR:
            raise KafkaException(self.error)
        if self.state is TxnState.FATAL_ERROR:
            raise KafkaException(self.error)
        if self.partitions:
            error = self._call(lambda: self._coordinator().handle_end_txn(
                self.transactional_id, self.producer_id, self.epoch, committed), timeout, "EndTxn")
            if error != Errors.NO_ERROR:
                raise self._fail(error, f"{'commit' if committed else 'abort'}_transaction failed: {error.name}")
        if committed and hand_over is not None:
            # the records were committed before the Complete record: serve their reports
            left = flush(timeout)
            if left:
                raise KafkaException(KafkaError(Errors._TIMED_OUT, f"{left} delivery reports not served in time",
                                                retriable=True))
        self.partitions.clear()
        self.error = None
        self.state = TxnState.READY
