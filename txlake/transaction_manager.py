"""The transactional producer's state machine (Kafka's client ``TransactionManager``).

States: UNINITIALIZED -> (init_transactions) -> READY -> (begin_transaction) ->
IN_TRANSACTION -> (commit/abort) -> READY; any state -> ABORTABLE_ERROR (a failed send
or coordinator request: only ``abort_transaction`` leaves it) or FATAL_ERROR (fenced:
every later call fails ``fatal()``). Calls out of order raise ``_STATE``, as librdkafka.

KIP-360 (safe epoch bumps): an abortable error that leaves the producer's sequences or
its producer id unusable -- a failed batch of the transaction, or UNKNOWN_PRODUCER_ID /
INVALID_PRODUCER_ID_MAPPING from the coordinator -- also sets
:attr:`TransactionManager.epoch_bump_required`. ``abort_transaction`` then ends the
transaction (EndTxn ABORT, skipped after INVALID_PRODUCER_ID_MAPPING, which the
coordinator would refuse) and sends InitProducerId naming the current producer id and
epoch: the coordinator answers with the next epoch (a new producer id once the epoch is
exhausted, a fresh one if the transactional id expired), the producer restarts every
partition's sequence at 0, and the next transaction goes on. PRODUCER_FENCED there means
a newer instance took over meanwhile: fatal. This is Kafka's ``beginCompletingTransaction``
/ ``InitProducerIdHandler(isEpochBump)`` path.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from enum import Enum
from typing import TYPE_CHECKING, Callable

from kafka.protocol.producer import (AddOffsetsToTxnRequest, AddPartitionsToTxnRequest, EndTxnRequest,
                                     InitProducerIdRequest, TxnOffsetCommitRequest)

from txlake.engine.apis import local_apis
from txlake.engine.errors import ApiError, Errors
from txlake.engine.transaction_metadata import ProducerIdAndEpoch

from .error import KafkaError, KafkaException, as_kafka_exception

if TYPE_CHECKING:
    from txlake.engine.broker import Broker

#: coordinator answers that mean "try again shortly"
_RETRY = frozenset({Errors.CONCURRENT_TRANSACTIONS, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                    Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR, Errors.REQUEST_TIMED_OUT})
#: coordinator answers that fence this producer for good (Kafka's ``fatalError`` answers; the
#: AddPartitionsToTxn, AddOffsetsToTxn and EndTxn handlers treat INVALID_TXN_STATE as fatal too:
#: the client and the coordinator disagree on the transaction, no abort can mend that)
_FATAL = frozenset({Errors.PRODUCER_FENCED, Errors.INVALID_PRODUCER_EPOCH, Errors._FENCED,
                    Errors.TRANSACTIONAL_ID_NOT_FOUND, Errors.TRANSACTION_COORDINATOR_FENCED,
                    Errors.INVALID_TRANSACTION_TIMEOUT, Errors.INVALID_TXN_STATE})
#: coordinator answers that are abortable when the coordinator can bump the epoch (Kafka's
#: ``abortableErrorIfPossible``; this coordinator always can): abort re-initialises the producer id/epoch
_ABORTABLE_WITH_BUMP = frozenset({Errors.UNKNOWN_PRODUCER_ID, Errors.INVALID_PRODUCER_ID_MAPPING})
#: produce answers that fence the producer (a failed batch is otherwise abortable, KIP-588:
#: INVALID_PRODUCER_EPOCH from a partition is abortable; the abort's EndTxn then tells a real fence)
_FATAL_BATCH = frozenset({Errors.PRODUCER_FENCED, Errors._FENCED, Errors._FATAL})
#: TxnOffsetCommit also retries an unknown topic or partition (Kafka's ``TxnOffsetCommitHandler``,
#: librdkafka alike: the metadata may not have reached the coordinator yet)
_RETRY_TXN_OFFSET_COMMIT = _RETRY | {Errors.UNKNOWN_TOPIC_OR_PART}
#: answers after which the client looks the coordinator up again (Kafka's ``lookupCoordinator``)
_LOOKUP = frozenset({Errors.NOT_COORDINATOR, Errors.COORDINATOR_NOT_AVAILABLE, Errors.UNKNOWN_SERVER_ERROR})
RETRY_BACKOFF_S = 0.02
#: the versions the in-process client sends (the highest with the semantics it implements:
#: KIP-360's producer id and epoch, PRODUCER_FENCED; KIP-890 part 1)
INIT_PRODUCER_ID_VERSION, ADD_PARTITIONS_VERSION, ADD_OFFSETS_VERSION, END_TXN_VERSION = 4, 3, 3, 3
TXN_OFFSET_COMMIT_VERSION = 3
#: how long a TxnOffsetCommit without a timeout is retried (s)
TXN_OFFSET_COMMIT_TIMEOUT_S = 30.0


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
    """Client side of one ``transactional.id`` (Kafka's client ``TransactionManager``).

    Every coordinator request is a Kafka request (InitProducerId, AddPartitionsToTxn,
    AddOffsetsToTxn, EndTxn) answered by the engine's request surface
    (:func:`txlake.engine.apis.local_apis`), exactly as ``txlake serve`` answers a network client.

    Args:
        transactional_id / timeout_ms: the producer's ``transactional.id`` and ``transaction.timeout.ms``.
        broker: the storage root's engine (its request surface answers; its transaction
            coordinator is looked up -- the writer lease taken -- when an answer says it is not there).
        on_identity: called with ``(producer_id, epoch)`` whenever InitProducerId hands out a new
            identity (``init_transactions`` and the KIP-360 bump of ``abort_transaction``); the
            producer then restarts every partition's sequence at 0. Called without any lock held.

    Attributes:
        producer_id / epoch: the identity in use (-1 before ``init_transactions``).
        partitions: ``(topic, partition)`` pairs added to the current transaction.
        error: the error of ABORTABLE_ERROR / FATAL_ERROR (and of the abort that follows one).
        epoch_bump_required: the next ``abort_transaction`` bumps the epoch (KIP-360).
    """

    def __init__(self, transactional_id: str, timeout_ms: int, broker: "Broker",
                 on_identity: Callable[[int, int], None] | None = None):
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self._broker = broker
        self._client_id = f"txlake-txn-{transactional_id}"
        self._on_identity = on_identity
        self.state = TxnState.UNINITIALIZED
        self.producer_id = -1
        self.epoch = -1
        self.partitions: set[tuple[str, int]] = set()
        self.error: KafkaError | None = None
        self.epoch_bump_required = False
        #: EndTxn of the transaction being completed has been answered NO_ERROR (a resumed
        #: abort_transaction must not send it again: after the bump it would be fenced)
        self._end_txn_done = False
        #: requests a timed-out call left under way, by operation ("InitProducerId", "EndTxn
        #: COMMIT", ...): calling again waits for their answer instead of sending another
        self._pending: dict[str, Future] = {}
        #: ``(producer id, epoch)`` of the last InitProducerId answer
        self._init_answer: tuple[int, int] = (-1, -1)

    # ------------------------------------------------------------------ state checks
    def _require(self, *states: TxnState, operation: str) -> None:
        if self.state is TxnState.FATAL_ERROR:
            raise KafkaException(self.error)
        if self.state not in states:
            if self.state is TxnState.ABORTABLE_ERROR and self.error is not None:
                raise KafkaException(self.error)
            raise KafkaException(KafkaError(Errors._STATE, f"Operation not valid in state {self.state.value}: {operation}"))

    @property
    def has_error(self) -> bool:
        """True in ABORTABLE_ERROR or FATAL_ERROR (Kafka's ``hasError``): nothing more may be sent."""
        return self.state in (TxnState.ABORTABLE_ERROR, TxnState.FATAL_ERROR)

    def _ask(self, request):
        """Send one request to the engine's request surface (the answer, a Kafka response message)."""
        return local_apis(self._broker).call(request, client_id=self._client_id)

    def _looked_up(self, error: Errors) -> Errors:
        """``error``; when it says the coordinator is not there (NOT_COORDINATOR,
        COORDINATOR_NOT_AVAILABLE, or UNKNOWN_SERVER_ERROR: the handler failed), first look the
        coordinator up again, as Kafka's client does: the lookup takes the writer lease and starts
        the coordinator, raising the engine's reason when it cannot (ApiError
        NOT_LEADER_OR_FOLLOWER naming the lease holder, a corrupt ``__transaction_state`` record, ...)."""
        if error in _LOOKUP:
            self._broker.transaction_coordinator()
        return error

    def _fail(self, error: Errors, message: str, abortable: bool | None = None,
              epoch_bump: bool = False) -> KafkaException:
        """Move to FATAL_ERROR (``abortable=False``; by default for the coordinator's fencing
        answers) or ABORTABLE_ERROR (with ``epoch_bump``: the abort must re-initialise the
        producer id/epoch); return the exception to raise. An abort in progress stays
        ABORTING_TRANSACTION (Kafka's
        ``transitionToAbortableError`` skips it; calling ``abort_transaction`` again resumes it)
        but remembers the error and a required bump."""
        if abortable is None:
            abortable = error not in _FATAL
        if not abortable:
            self.state = TxnState.FATAL_ERROR
            self.error = KafkaError(error, message, fatal=True)
            return KafkaException(self.error)
        self.epoch_bump_required = self.epoch_bump_required or epoch_bump
        self.error = KafkaError(error, message, txn_requires_abort=True)
        if self.state is not TxnState.ABORTING_TRANSACTION:
            self.state = TxnState.ABORTABLE_ERROR
        return KafkaException(self.error)

    def _call(self, request: Callable[[], Errors], timeout: float | None, what: str,
              resumable: bool = False, retry: frozenset[Errors] = _RETRY) -> Errors:
        """Send a coordinator request, retrying the answers in ``retry`` until ``timeout`` (s; None
        or negative: no limit). ``resumable``: see :meth:`_send`.

        Raises:
            KafkaException: ``_TIMED_OUT`` (retriable) when ``timeout`` passed; the engine's
                error, mapped by :func:`~txlake.error.as_kafka_exception` (e.g. CORRUPT_MESSAGE for
                an unreadable ``__transaction_state`` record, naming it).
        """
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            try:
                error = self._send(request, deadline, what, resumable)
            except ApiError as exc:
                error = exc.error
            except KafkaException:
                raise
            except Exception as exc:  # noqa: BLE001 - the engine failed: a KafkaException naming it
                raise as_kafka_exception(exc, f"{what} of transactional id {self.transactional_id!r}") from exc
            if error not in retry:
                return error
            if deadline is not None and time.monotonic() >= deadline:
                raise KafkaException(KafkaError(Errors._TIMED_OUT, f"{what} timed out (last answer {error.name})",
                                                retriable=True))
            time.sleep(RETRY_BACKOFF_S)

    def _send(self, request: Callable[[], Errors], deadline: float | None, what: str, resumable: bool) -> Errors:
        """One coordinator request. Without a ``deadline`` (monotonic s) it runs in this thread;
        with one it runs on a thread of its own and this call returns by the deadline: a
        coordinator request waits for its records to be committed to storage, which a storage
        outage can hold up for long (Kafka bounds a request by ``request.timeout.ms`` the same way).

        A ``resumable`` request (InitProducerId, EndTxn) still under way at the deadline is kept:
        the next call of the same operation waits for its answer instead of sending another
        (Kafka's ``TransactionManager`` keeps the pending result of a timed-out
        ``initTransactions`` / ``commitTransaction`` / ``abortTransaction``, and a retry of the
        call awaits it). Any other request is abandoned: its late answer is ignored.

        Raises:
            KafkaException: ``_TIMED_OUT`` (retriable) at the deadline.
        """
        future = self._pending.pop(what, None) if resumable else None
        if future is None:
            if deadline is None:
                return request()
            future = Future()

            def run() -> None:
                try:
                    future.set_result(request())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)

            threading.Thread(target=run, name=f"txlake-txn-{what}", daemon=True).start()
        try:
            return future.result(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            if future.done():
                raise  # the request itself failed with a TimeoutError (an OSError)
            if resumable:
                self._pending[what] = future
            raise KafkaException(KafkaError(
                Errors._TIMED_OUT, f"{what} of transactional id {self.transactional_id!r} timed out: the coordinator "
                "has not answered yet (storage slow or unavailable?); call again to wait for its answer",
                retriable=True)) from None

    def _init_producer_id(self, timeout: float | None, expected: ProducerIdAndEpoch | None) -> Errors:
        """InitProducerId (``expected`` = the current identity for a KIP-360 bump); on NO_ERROR the
        new identity is taken and announced to ``on_identity``."""

        def request() -> Errors:
            answer = self._ask(InitProducerIdRequest[INIT_PRODUCER_ID_VERSION](
                transactional_id=self.transactional_id, transaction_timeout_ms=self.timeout_ms,
                producer_id=expected.producer_id if expected is not None else -1,
                producer_epoch=expected.epoch if expected is not None else -1))
            self._init_answer = (answer.producer_id, answer.producer_epoch)
            return self._looked_up(Errors(answer.error_code))

        error = self._call(request, timeout, "InitProducerId", resumable=True)
        if error == Errors.NO_ERROR:
            self.producer_id, self.epoch = self._init_answer
            if self._on_identity is not None:
                self._on_identity(self.producer_id, self.epoch)
        return error

    # ------------------------------------------------------------------ API
    def init_transactions(self, timeout: float | None) -> None:
        """InitProducerId: fence older instances, complete their transactions; UNINITIALIZED -> READY.

        Raises:
            KafkaException: ``_STATE`` when already initialized; ``_TIMED_OUT`` (retriable, call
                again); any refusal is fatal (PRODUCER_FENCED, INVALID_TRANSACTION_TIMEOUT, ...).
        """
        self._require(TxnState.UNINITIALIZED, TxnState.INITIALIZING, operation="init_transactions")
        self.state = TxnState.INITIALIZING
        error = self._init_producer_id(timeout, None)
        if error != Errors.NO_ERROR:
            raise self._fail(error, f"init_transactions failed: {error.name}", abortable=False)
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
        FATAL_ERROR (PRODUCER_FENCED and other fencing answers) or ABORTABLE_ERROR (with an
        epoch bump for UNKNOWN_PRODUCER_ID / INVALID_PRODUCER_ID_MAPPING, KIP-360; without one
        for TOPIC_AUTHORIZATION_FAILED, a partition of an internal topic). In an error
        state nothing is sent and the state's error is returned (Kafka's
        ``maybeTerminateRequestWithError``).
        """
        if self.has_error and self.error is not None:
            return Errors(self.error.code())

        def request() -> Errors:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(partitions):
                by_topic.setdefault(topic, []).append(partition)
            answer = self._ask(AddPartitionsToTxnRequest[ADD_PARTITIONS_VERSION](
                v3_and_below_transactional_id=self.transactional_id, v3_and_below_producer_id=self.producer_id,
                v3_and_below_producer_epoch=self.epoch, v3_and_below_topics=[
                    AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in by_topic.items()]))
            answers = {(t.name, p.partition_index): self._looked_up(Errors(p.partition_error_code))
                       for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition}
            # one answer for all the partitions, except that when some are refused (TOPIC_AUTHORIZATION_FAILED)
            # the others answer OPERATION_NOT_ATTEMPTED: the refusal is the answer (Kafka's AddPartitionsToTxnHandler)
            return next((e for e in answers.values() if e != Errors.OPERATION_NOT_ATTEMPTED),
                        Errors.OPERATION_NOT_ATTEMPTED)

        try:
            error = self._call(request, timeout, "AddPartitionsToTxn")
        except KafkaException as exc:  # retriable answers until the delivery timeout
            error = Errors(exc.args[0].code())
        if error == Errors.NO_ERROR:
            self.partitions |= partitions
        elif self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION, TxnState.ABORTING_TRANSACTION):
            names = ", ".join(f"{t} [{p}]" for t, p in sorted(partitions))
            self._fail(error, f"adding {names} to the transaction failed: {error.name}",
                       epoch_bump=error in _ABORTABLE_WITH_BUMP)
        return error

    def add_offsets(self, group_id: str, partition: int) -> tuple[str, int]:
        """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition (``partition``) joins the transaction.

        Raises:
            KafkaException: fatal when fenced; abortable otherwise (with an epoch bump for
                UNKNOWN_PRODUCER_ID / INVALID_PRODUCER_ID_MAPPING, KIP-360).
        """
        self._require(TxnState.IN_TRANSACTION, operation="send_offsets_to_transaction")
        tp = ("__consumer_offsets", partition)
        error = self._call(lambda: self._looked_up(Errors(self._ask(AddOffsetsToTxnRequest[ADD_OFFSETS_VERSION](
            transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.epoch,
            group_id=group_id)).error_code)), None, "AddOffsetsToTxn")
        if error != Errors.NO_ERROR:
            raise self._fail(error, f"AddOffsetsToTxn for group {group_id} failed: {error.name}",
                             epoch_bump=error in _ABORTABLE_WITH_BUMP)
        self.partitions.add(tp)
        return tp

    def commit_offsets(self, group_id: str, offsets: dict[tuple[str, int], tuple[int, str]], generation_id: int,
                       member_id: str, group_instance_id: str | None, timeout: float | None) -> Errors:
        """TxnOffsetCommit (KIP-98; KIP-447's generation id, member id and group instance id): the
        offsets ``{(topic, partition): (offset, metadata)}`` join the transaction (after
        :meth:`add_offsets`); retriable answers (UNKNOWN_TOPIC_OR_PARTITION too, as Kafka's
        ``TxnOffsetCommitHandler``) are retried for up to ``timeout`` s (default 30). Returns the first partition's error other than NO_ERROR (ILLEGAL_GENERATION,
        UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, INVALID_TXN_STATE, PRODUCER_FENCED, ...), else
        NO_ERROR; the caller decides the state it leaves the transaction in.

        Raises:
            KafkaException: ``_TIMED_OUT`` (retriable) when retriable answers lasted ``timeout``.
        """
        self._require(TxnState.IN_TRANSACTION, operation="send_offsets_to_transaction")
        by_topic: dict[str, list] = {}
        for (topic, partition), (offset, metadata) in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append(TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic.TxnOffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=metadata))
        request = TxnOffsetCommitRequest[TXN_OFFSET_COMMIT_VERSION](
            transactional_id=self.transactional_id, group_id=group_id, producer_id=self.producer_id,
            producer_epoch=self.epoch, generation_id=generation_id, member_id=member_id,
            group_instance_id=group_instance_id, topics=[
                TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()])

        def send() -> Errors:
            answer = self._ask(request)
            errors = [Errors(p.error_code) for t in answer.topics for p in t.partitions]
            return self._looked_up(next((e for e in errors if e != Errors.NO_ERROR), Errors.NO_ERROR))

        return self._call(send, TXN_OFFSET_COMMIT_TIMEOUT_S if timeout is None else timeout, "TxnOffsetCommit",
                          retry=_RETRY_TXN_OFFSET_COMMIT)

    def send_failed(self, error: KafkaError, epoch_bump: bool = True) -> None:
        """A record of the transaction could not be written (Kafka's ``maybeTransitionToErrorState``).

        A fenced producer (PRODUCER_FENCED, ``_FENCED``: this process lost the writer lease)
        becomes fatal; any other failure is abortable, and -- because the partition's sequence
        now has a gap or an unknown end -- requires an epoch bump (KIP-360), unless
        ``epoch_bump=False`` (a refusal that involved no sequence, e.g. a TxnOffsetCommit the
        group coordinator refused). During an abort only the bump is remembered.
        """
        code = Errors(error.code()) if error.code() in Errors._value2member_map_ else Errors._FAIL
        message = f"a record of the transaction failed: {error.str()}"
        if code in _FATAL_BATCH:
            if self.state is not TxnState.FATAL_ERROR:
                self._fail(code, message, abortable=False)
        elif self.state in (TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION, TxnState.ABORTABLE_ERROR,
                            TxnState.ABORTING_TRANSACTION):
            if self.state in (TxnState.ABORTABLE_ERROR, TxnState.ABORTING_TRANSACTION):  # keep the first error
                self.epoch_bump_required = self.epoch_bump_required or epoch_bump
            else:
                self._fail(code, message, abortable=True, epoch_bump=epoch_bump)

    def end_transaction(self, committed: bool, timeout: float | None, flush: Callable[[float | None], int],
                        hand_over: Callable[[float | None], int] | None = None) -> None:
        """commit_transaction / abort_transaction: flush (or, for a commit, ``hand_over`` every
        record to the engine without waiting for its commit), then EndTxn; -> READY.

        An abort after an error that requires it (:attr:`epoch_bump_required`) then bumps the
        epoch (KIP-360, Kafka's ``beginCompletingTransaction``): EndTxn ABORT first -- skipped
        when the last error is INVALID_PRODUCER_ID_MAPPING, which the coordinator would answer
        again -- then InitProducerId with the current producer id and epoch.

        Both callables return the records not delivered / not handed over in time. ``timeout``
        (s) bounds the whole call. A call that raised ``_TIMED_OUT`` may be repeated: it resumes
        where it stopped -- an EndTxn still under way (e.g. its records wait for a storage outage
        to end) is not sent again, the repeated call waits for its answer.

        Raises:
            KafkaException: ``_TIMED_OUT`` (retriable: call again); for a commit, the error of a
                failed record or request (``txn_requires_abort()``); PRODUCER_FENCED and other
                fencing answers (``fatal()``), including a bump refused because a newer
                instance took the transactional id over.
        """
        if committed:
            self._require(TxnState.IN_TRANSACTION, TxnState.COMMITTING_TRANSACTION, operation="commit_transaction")
            self.state = TxnState.COMMITTING_TRANSACTION
        else:
            self._require(TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, TxnState.ABORTING_TRANSACTION,
                          operation="abort_transaction")
            self.state = TxnState.ABORTING_TRANSACTION
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout

        def remaining() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        left = (hand_over or flush)(remaining()) if committed else flush(remaining())
        if left:
            raise KafkaException(KafkaError(Errors._TIMED_OUT, f"{left} records not delivered in time", retriable=True))
        if committed and self.state is TxnState.ABORTABLE_ERROR:
            raise KafkaException(self.error)
        if self.state is TxnState.FATAL_ERROR:
            raise KafkaException(self.error)
        last_error = Errors(self.error.code()) if self.error is not None else None
        if self.partitions and not self._end_txn_done and not (
                not committed and self.epoch_bump_required and last_error == Errors.INVALID_PRODUCER_ID_MAPPING):
            error = self._call(lambda: self._looked_up(Errors(self._ask(EndTxnRequest[END_TXN_VERSION](
                transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.epoch,
                committed=committed)).error_code)), remaining(),
                f"EndTxn {'COMMIT' if committed else 'ABORT'}", resumable=True)
            if error != Errors.NO_ERROR:
                raise self._fail(error, f"{'commit' if committed else 'abort'}_transaction failed: {error.name}",
                                 epoch_bump=error in _ABORTABLE_WITH_BUMP)
            self._end_txn_done = True
        if not committed and self.epoch_bump_required:
            self._bump_epoch(remaining())
        if committed and hand_over is not None:
            # the records were committed before the Complete record: serve their reports
            left = flush(remaining())
            if left:
                raise KafkaException(KafkaError(Errors._TIMED_OUT, f"{left} delivery reports not served in time",
                                                retriable=True))
        self.partitions.clear()
        self.error = None
        self.epoch_bump_required = False
        self._end_txn_done = False
        self.state = TxnState.READY

    def _bump_epoch(self, timeout: float | None) -> None:
        """KIP-360: InitProducerId naming the current producer id and epoch (Kafka's
        ``InitProducerIdHandler`` with ``isEpochBump``). The answer is the next epoch of the same
        producer id, a new producer id at epoch 0 once the epoch is exhausted, or a fresh producer
        id when the transactional id had expired; a retry of a bump the coordinator already made
        gets the same answer. PRODUCER_FENCED / INVALID_PRODUCER_EPOCH (a newer instance took the
        transactional id over) and any other refusal are fatal."""
        expected = ProducerIdAndEpoch(self.producer_id, self.epoch)
        error = self._init_producer_id(timeout, expected)
        if error in (Errors.PRODUCER_FENCED, Errors.INVALID_PRODUCER_EPOCH):
            raise self._fail(Errors.PRODUCER_FENCED,
                             f"bumping the epoch of producer {expected.producer_id} (epoch {expected.epoch}) of "
                             f"{self.transactional_id!r} failed: {error.name}, a newer instance took the "
                             "transactional id over", abortable=False)
        if error != Errors.NO_ERROR:
            raise self._fail(error, f"bumping the epoch of {self.transactional_id!r} failed: {error.name}",
                             abortable=False)
