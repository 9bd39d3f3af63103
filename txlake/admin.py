"""AdminClient: topic and transaction administration as confluent-kafka's ``AdminClient``.

Calls return ``dict[name, concurrent.futures.Future]``; a future's ``result()`` is None
on success or raises ``KafkaException`` with Kafka's error (TOPIC_ALREADY_EXISTS,
INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_CONFIG, UNKNOWN_TOPIC_OR_PART, ...).

Transaction administration (KIP-664) follows Kafka's Java ``Admin`` (confluent-kafka has
no such calls): ``list_transactions``, ``describe_transactions``, ``describe_producers``,
``abort_transaction`` and the check of ``kafka-transactions.sh find-hanging``, with the
Java result classes as dataclasses (``TransactionListing``, ``TransactionDescription``,
``ProducerState``, ...) under snake_case names. See docs/operations.md.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from txlake.engine.broker import Broker
from txlake.engine.errors import ApiError, Errors
from txlake.engine.registry import acquire_broker, release_broker
from txlake.engine.requests import TxnMarker
from txlake.engine.transaction_admin import COORDINATOR_ID, ActiveProducer, TransactionAdmin
from txlake.engine.transaction_metadata import TransactionState

from .config import parse_config
from .error import KafkaError, KafkaException, from_api_error, kafka_errors
from .types import TopicPartition


class NewTopic:
    """A topic to create (confluent-kafka's ``NewTopic``); ``num_partitions=-1`` takes ``num.partitions``."""

    def __init__(self, topic: str, num_partitions: int = -1, replication_factor: int = -1,
                 replica_assignment: list | None = None, config: dict[str, str] | None = None):
        self.topic = topic
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        self.replica_assignment = replica_assignment
        self.config = dict(config or {})

    def __repr__(self) -> str:
        return f"NewTopic(topic={self.topic}, num_partitions={self.num_partitions})"


@dataclass
class PartitionMetadata:
    """A partition as Metadata describes it; there is one embedded broker (id 0) holding every partition."""

    id: int
    leader: int = 0
    replicas: list[int] = field(default_factory=lambda: [0])
    isrs: list[int] = field(default_factory=lambda: [0])
    error: KafkaError | None = None


@dataclass
class TopicMetadata:
    """A topic as Metadata describes it."""

    topic: str
    partitions: dict[int, PartitionMetadata]
    error: KafkaError | None = None


@dataclass
class BrokerMetadata:
    """The embedded broker (id 0) serving the storage root."""

    id: int
    host: str
    port: int


@dataclass
class ClusterMetadata:
    """confluent-kafka's ``ClusterMetadata``: ``topics`` by name, ``brokers`` by id."""

    cluster_id: str
    controller_id: int
    brokers: dict[int, BrokerMetadata]
    topics: dict[str, TopicMetadata]
    orig_broker_id: int = 0
    orig_broker_name: str = ""


@dataclass
class TransactionListing:
    """One transaction as ListTransactions lists it (Kafka's ``TransactionListing``, KIP-664).

    ``state`` is Kafka's name: Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit,
    CompleteAbort, PrepareEpochFence (Dead is never listed).
    """

    transactional_id: str
    producer_id: int
    state: str


@dataclass
class TransactionDescription:
    """A transactional id as the coordinator describes it (Kafka's ``TransactionDescription``, KIP-664).

    Attributes:
        transactional_id: the id (txlake addition; Kafka keys its results by it).
        coordinator_id: the coordinator's broker id (0, the embedded broker).
        state: Kafka's state name (see :class:`TransactionListing`).
        producer_id / producer_epoch: the identity the coordinator hands out now.
        transaction_timeout_ms: the producer's ``transaction.timeout.ms``.
        transaction_start_time_ms: ms since the epoch when the current (or last) transaction
            started; None when the id never had one (Kafka's empty ``OptionalLong``).
        topic_partitions: the partitions of the Ongoing transaction (or of a
            PrepareCommit/PrepareAbort one); empty once it is complete.
    """

    transactional_id: str
    coordinator_id: int
    state: str
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int | None
    topic_partitions: list[TopicPartition] = field(default_factory=list)


@dataclass
class ProducerState:
    """A producer with state on a partition (Kafka's ``ProducerState``, KIP-664).

    Attributes:
        producer_id / producer_epoch: the producer and its newest epoch on the partition.
        last_sequence: last sequence number of its newest batch (-1 if none).
        last_timestamp: ms, newest timestamp of its batches or markers on the partition.
        coordinator_epoch: coordinator epoch of its last COMMIT/ABORT marker there, -1 if none.
        current_transaction_start_offset: first offset of its open transaction on the
            partition, -1 if none (it holds the partition's LSO at most there).
    """

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_transaction_start_offset: int


@dataclass
class PartitionProducerState:
    """DescribeProducers' answer for a partition (Kafka's ``DescribeProducersResult.PartitionProducerState``):
    its active producers, sorted by producer id."""

    active_producers: list[ProducerState]


@dataclass
class HangingTransaction:
    """An open transaction the coordinator will never close (the ``OpenTransaction`` rows of
    ``kafka-transactions.sh find-hanging``): its partition and the producer's state there.
    Clear it with :meth:`AdminClient.abort_transaction`."""

    topic_partition: TopicPartition
    producer_state: ProducerState


@dataclass(frozen=True)
class DeletedRecords:
    """The result of DeleteRecords for one partition (confluent-kafka's ``DeletedRecords``):
    ``low_watermark`` is the partition's log start offset after the call."""

    low_watermark: int


def cluster_metadata(broker: Broker, topic: str | None = None) -> ClusterMetadata:
    """Metadata of one topic or all topics as the broker sees them now."""
    topics = broker.topics()
    out: dict[str, TopicMetadata] = {}
    for name, t in topics.items():
        if topic is None or name == topic:
            out[name] = TopicMetadata(name, {p.partition: PartitionMetadata(p.partition) for p in t.partitions})
    if topic is not None and topic not in out:
        out[topic] = TopicMetadata(topic, {}, KafkaError(Errors.UNKNOWN_TOPIC_OR_PART, f"Unknown topic: {topic}"))
    return ClusterMetadata(broker.store.url, 0, {0: BrokerMetadata(0, broker.store.url, 0)}, out,
                           orig_broker_name=broker.store.url)


def _future(error: Errors, message: str) -> Future:
    fut: Future = Future()
    if error == Errors.NO_ERROR:
        fut.set_result(None)
    else:
        fut.set_exception(KafkaException(KafkaError(error, message)))
    return fut


class AdminClient:
    """Topic and transaction administration of a storage root (confluent-kafka's ``AdminClient``).

    Write operations (creating or deleting topics, aborting a transaction) take the storage
    root's writer lease (first write); listing and describing do not: in a process that is
    not the writer they read the last committed state (engine/transaction_admin.py).
    """

    def __init__(self, conf: dict | None = None, **kwargs: Any):
        self._cfg = parse_config({**(conf or {}), **kwargs}, "admin")
        with kafka_errors(f"{type(self).__name__}: cannot open storage.url {self._cfg.storage_url}"):
            self._broker = acquire_broker(self._cfg.storage_url, self._cfg.storage_options, self._cfg.broker_config())
        self._closed = False

    def create_topics(self, new_topics: list[NewTopic], operation_timeout: float = 0, request_timeout: float = -1,
                      validate_only: bool = False) -> dict[str, Future]:
        """CreateTopics: one future per topic (None, or KafkaException with Kafka's error).

        ``__consumer_offsets`` and ``__transaction_state`` are created by their coordinators
        only: asking for one fails with INVALID_REQUEST (see docs/operations.md).
        """
        if not isinstance(new_topics, list) or not all(isinstance(t, NewTopic) for t in new_topics):
            raise TypeError("Expected list of NewTopic")
        if len({t.topic for t in new_topics}) != len(new_topics):
            raise ValueError("Duplicate topic names in request")
        try:
            results = self._broker.create_topics([(t.topic, t.num_partitions, t.config) for t in new_topics], validate_only)
        except ApiError as exc:
            return {t.topic: _failed(from_api_error(exc)) for t in new_topics}
        return {t.topic: _future(err, msg) for t, (err, msg) in zip(new_topics, results)}

    def delete_topics(self, topics: list[str], operation_timeout: float = 0, request_timeout: float = -1) -> dict[str, Future]:
        """DeleteTopics: one future per topic (None, or KafkaException with Kafka's error).

        An internal topic (``__consumer_offsets``, ``__transaction_state``) is never deleted:
        its future fails with INVALID_TOPIC_EXCEPTION (see docs/operations.md).
        """
        if not isinstance(topics, list):
            raise TypeError("Expected list of topic names")
        try:
            results = self._broker.delete_topics(topics)
        except ApiError as exc:
            return {t: _failed(from_api_error(exc)) for t in topics}
        return {t: _future(err, msg) for t, (err, msg) in zip(topics, results)}

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """Metadata of all topics (or one), as of the newest catalog commit."""
        self._broker.refresh()
        return cluster_metadata(self._broker, topic)

    def delete_records(self, topic_partition_offsets: list[TopicPartition], request_timeout: float = -1,
                       operation_timeout: float = -1) -> dict[TopicPartition, Future]:
        """DeleteRecords (confluent-kafka's ``AdminClient.delete_records``): move each partition's
        log start offset to ``tp.offset`` (``OFFSET_END``, -1, = the high watermark). Records
        below it become unreadable; segments wholly below it are dropped; the producer state
        they produced is kept (KIP-360), so live idempotent and transactional producers go on.

        Returns:
            One future per partition; its result is :class:`DeletedRecords`, or it raises
            KafkaException UNKNOWN_TOPIC_OR_PART, INVALID_TOPIC_EXCEPTION (an internal topic,
            as Kafka), OFFSET_OUT_OF_RANGE (past the high watermark), POLICY_VIOLATION
            (``cleanup.policy`` without ``delete``),
            NOT_LEADER_OR_FOLLOWER (another process holds the writer lease) or REQUEST_TIMED_OUT.

        Raises:
            TypeError: not a list of TopicPartition. ValueError: a partition named twice.
        """
        partitions = _list_arg(topic_partition_offsets, "topic_partition_offsets", TopicPartition)
        if len({(tp.topic, tp.partition) for tp in partitions}) != len(partitions):
            raise ValueError("Duplicate partitions in request")
        timeout_ms = 30_000 if request_timeout is None or request_timeout < 0 else int(request_timeout * 1000)
        try:
            answers = self._broker.delete_records([(tp.topic, tp.partition, tp.offset) for tp in partitions], timeout_ms)
        except ApiError as exc:
            return {tp: _failed(from_api_error(exc)) for tp in partitions}
        out: dict[TopicPartition, Future] = {}
        for tp, (error, low_watermark, message) in zip(partitions, answers):
            if error != Errors.NO_ERROR:
                out[tp] = _failed(KafkaException(KafkaError(error, message)))
                continue
            fut: Future = Future()
            fut.set_result(DeletedRecords(low_watermark))
            out[tp] = fut
        return out

    # ------------------------------------------------------------------ transactions (KIP-664)
    def _transactions(self) -> TransactionAdmin:
        return TransactionAdmin(self._broker)

    def list_transactions(self, states: list[str] | None = None, producer_ids: list[int] | None = None,
                          duration_filter: int | None = None, request_timeout: float = -1,
                          transactional_id_pattern: str | None = None) -> Future:
        """ListTransactions (KIP-664; Java ``Admin.listTransactions``).

        Args:
            states: keep only these states (Kafka's names, e.g. ``["Ongoing"]``); None = all.
            producer_ids: keep only these producer ids; None = all.
            duration_filter: ms; keep only transactions running longer than this (now minus
                their start time, KIP-994 ``filterOnDuration``); None or < 0 = no filter.
            transactional_id_pattern: a regular expression the whole transactional id must
                match (KIP-1152 ``filterOnTransactionalIdPattern``; Java's ``Matcher.matches``);
                None or "" = no filter. A pattern that does not compile fails the future with
                INVALID_REGULAR_EXPRESSION (128). All filters given must hold.

        Returns:
            A future whose result is ``list[TransactionListing]`` sorted by transactional id;
            it raises KafkaException with the coordinator's error (e.g. COORDINATOR_LOAD_IN_PROGRESS).

        Raises:
            KafkaException: _INVALID_ARG for a state name Kafka does not have.
            TypeError: ``states`` or ``producer_ids`` is not a list.
        """
        states = _list_arg(states, "states", str)
        producer_ids = _list_arg(producer_ids, "producer_ids", int)
        unknown = [s for s in states if TransactionState.from_name(s) is None]
        if unknown:
            names = ", ".join(t.state_name for t in TransactionState)
            raise KafkaException(KafkaError(Errors._INVALID_ARG, f"Unknown transaction state(s) {unknown}: expected {names}"))
        if transactional_id_pattern is not None and not isinstance(transactional_id_pattern, str):
            raise TypeError(f"transactional_id_pattern must be a str, got {type(transactional_id_pattern).__name__}")
        answer = self._transactions().handle_list_transactions(
            states, producer_ids, -1 if duration_filter is None else int(duration_filter), transactional_id_pattern)
        if answer.error == Errors.INVALID_REGULAR_EXPRESSION:
            return _failed(KafkaException(KafkaError(answer.error, f"Failed to list transactions: transactional id "
                                                                  f"pattern {transactional_id_pattern!r} is not a valid "
                                                                  "regular expression")))
        if answer.error != Errors.NO_ERROR:
            return _failed(KafkaException(KafkaError(answer.error, f"Failed to list transactions: {answer.error.name}")))
        fut: Future = Future()
        fut.set_result(sorted((TransactionListing(t.transactional_id, t.producer_id, t.state)
                               for t in answer.transaction_states), key=lambda t: t.transactional_id))
        return fut

    def describe_transactions(self, transactional_ids: list[str], request_timeout: float = -1) -> dict[str, Future]:
        """DescribeTransactions (KIP-664; Java ``Admin.describeTransactions``).

        Returns:
            One future per transactional id; its result is a :class:`TransactionDescription`,
            or it raises KafkaException TRANSACTIONAL_ID_NOT_FOUND (105) for an id the
            coordinator does not know (never used, or expired after
            ``transactional.id.expiration.ms``), INVALID_REQUEST for an empty id.

        Raises:
            TypeError: not a list of strings.
        """
        ids = list(dict.fromkeys(_list_arg(transactional_ids, "transactional_ids", str)))
        out: dict[str, Future] = {}
        for d in self._transactions().handle_describe_transactions(ids):
            if d.error != Errors.NO_ERROR:
                out[d.transactional_id] = _failed(KafkaException(KafkaError(d.error, d.message)))
                continue
            fut: Future = Future()
            fut.set_result(TransactionDescription(
                d.transactional_id, COORDINATOR_ID, d.state, d.producer_id, d.producer_epoch, d.transaction_timeout_ms,
                d.transaction_start_time_ms if d.transaction_start_time_ms >= 0 else None,
                [TopicPartition(t, p) for t, p in d.topic_partitions]))
            out[d.transactional_id] = fut
        return out

    def describe_producers(self, partitions: list[TopicPartition], request_timeout: float = -1) -> dict[TopicPartition, Future]:
        """DescribeProducers (KIP-664; Java ``Admin.describeProducers``): the active producers of
        each partition, with the first offset of their open transaction.

        Returns:
            One future per partition (keyed by the given :class:`TopicPartition`); its result
            is a :class:`PartitionProducerState`, or it raises KafkaException
            UNKNOWN_TOPIC_OR_PART.

        Raises:
            TypeError: not a list of TopicPartition.
        """
        partitions = _list_arg(partitions, "partitions", TopicPartition)
        out: dict[TopicPartition, Future] = {}
        answers = self._transactions().handle_describe_producers([(tp.topic, tp.partition) for tp in partitions])
        for tp, answer in zip(partitions, answers):
            if answer.error != Errors.NO_ERROR:
                out[tp] = _failed(KafkaException(KafkaError(answer.error, answer.message)))
                continue
            fut: Future = Future()
            fut.set_result(PartitionProducerState([_producer_state(a) for a in answer.active_producers]))
            out[tp] = fut
        return out

    def abort_transaction(self, partition: TopicPartition, producer_id: int, producer_epoch: int,
                          coordinator_epoch: int, request_timeout: float = -1) -> Future:
        """Abort a hanging transaction on one partition (KIP-664; Java ``Admin.abortTransaction``
        with an ``AbortTransactionSpec``): write an ABORT marker for ``producer_id`` to the
        partition, as the coordinator would have (WriteTxnMarkers to the partition leader).
        The future resolves once the marker is committed: the transaction's records are in
        the aborted-transaction index and the partition's LSO has moved past them.

        Only for a transaction the coordinator will never end (see
        :meth:`find_hanging_transactions`): a live transaction's records on the partition
        would be aborted under the producer's feet. Takes the writer lease, or hands the
        marker to the process that holds it (below).

        Args:
            coordinator_epoch: written into the marker; use the producer's coordinator epoch
                from :meth:`describe_producers`, or 0 when it has none (-1), as
                kafka-transactions.sh does.
            request_timeout: seconds to wait for the marker's commit (default 30).

        Returns:
            A future whose result is None, or that raises KafkaException:
            UNKNOWN_TOPIC_OR_PART; INVALID_PRODUCER_EPOCH (47, the producer has a newer
            epoch on the partition); TRANSACTION_COORDINATOR_FENCED (52, a marker with a newer
            coordinator epoch was written for it); NOT_LEADER_OR_FOLLOWER (another process
            holds the writer lease and did not take the hand-over in time); REQUEST_TIMED_OUT;
            UNKNOWN_SERVER_ERROR (the lease holder failed while writing the marker).

        When another process holds the writer lease (a running application, the usual case for
        a hanging transaction), the abort is handed to it through the storage root
        (engine/handoff.py, kind ``txn.abort``) and written by its engine: the same marker
        and answers, as Kafka's WriteTxnMarkers goes to whichever broker leads the partition.

        Raises:
            TypeError: ``partition`` is not a TopicPartition.
        """
        if not isinstance(partition, TopicPartition):
            raise TypeError("Expected a TopicPartition")
        timeout_ms = 30_000 if request_timeout is None or request_timeout < 0 else int(request_timeout * 1000)
        marker = TxnMarker(int(producer_id), int(producer_epoch), int(coordinator_epoch), False,
                           ((partition.topic, partition.partition),))
        error, message = self._write_abort_marker(marker, timeout_ms)
        if error == Errors.NOT_LEADER_OR_FOLLOWER:
            error, message = self._hand_over_abort_marker(marker, timeout_ms, message)
        if error == Errors.NO_ERROR:
            fut: Future = Future()
            fut.set_result(None)
            return fut
        return _failed(KafkaException(KafkaError(error, message)))

    def _write_abort_marker(self, marker: TxnMarker, timeout_ms: int) -> tuple[Errors, str]:
        """WriteTxnMarkers of one ABORT marker to its one partition, on this process's engine."""
        (answer,) = self._transactions().handle_write_txn_markers([marker], timeout_ms)
        return answer[marker.partitions[0]]

    def _hand_over_abort_marker(self, marker: TxnMarker, timeout_ms: int, held: str) -> tuple[Errors, str]:
        """Have the writer-lease holder write the ABORT marker (``held``: why this process could not)."""
        from txlake.engine.handoff import HandoffCancelled, HandoffError, submit
        from txlake.handoff_handlers import TXN_ABORT

        (topic, partition), = marker.partitions
        payload = {"topic": topic, "partition": partition, "producer_id": marker.producer_id,
                   "producer_epoch": marker.producer_epoch, "coordinator_epoch": marker.coordinator_epoch,
                   "timeout_ms": timeout_ms}
        try:
            answer = submit(self._broker.store, TXN_ABORT, payload, timeout_ms / 1000)
        except HandoffCancelled:
            return Errors.NOT_LEADER_OR_FOLLOWER, (f"{held}; the abort was handed to that process, which did not "
                                                   f"take it within {timeout_ms / 1000:.0f} s")
        except HandoffError as exc:
            return Errors.UNKNOWN_SERVER_ERROR, f"the writer-lease holder failed to write the ABORT marker: {exc}"
        return Errors(answer["error"]), answer["message"]

    def find_hanging_transactions(self, partitions: list[TopicPartition] | None = None,
                                  max_transaction_timeout_ms: int | None = None) -> list[HangingTransaction]:
        """Open transactions the coordinator will never close: the check of
        ``kafka-transactions.sh find-hanging`` (Kafka's ``FindHangingTransactionsCommand``).

        A transaction is hanging when it is open on a partition, its producer's last
        timestamp there is more than ``max_transaction_timeout_ms`` ago (no live transaction
        can be that old: the coordinator aborts it after its timeout), and the coordinator
        does not know the producer as having a transaction that holds the partition (the
        producer id maps to no transactional id, the id is gone, or its transaction is
        another one). Such a transaction holds the partition's LSO -- read_committed
        consumers stop there -- until :meth:`abort_transaction` clears it.

        Args:
            partitions: where to look; a TopicPartition with partition -1 means every
                partition of its topic; None = every partition of every non-internal topic.
            max_transaction_timeout_ms: default ``transaction.max.timeout.ms`` (900000).

        Returns:
            The hanging transactions, by partition.

        Raises:
            KafkaException: UNKNOWN_TOPIC_OR_PART, or the coordinator's error.
            TypeError: ``partitions`` is not a list of TopicPartition.
        """
        wanted = None
        if partitions is not None:
            self._broker.refresh()
            topics = self._broker.topics()
            wanted = []
            for tp in _list_arg(partitions, "partitions", TopicPartition):
                if tp.partition < 0 and tp.topic in topics:
                    wanted += [(tp.topic, p.partition) for p in topics[tp.topic].partitions]
                else:
                    wanted.append((tp.topic, tp.partition))
        try:
            found = self._transactions().find_hanging_transactions(wanted, max_transaction_timeout_ms)
        except ApiError as exc:
            raise from_api_error(exc) from None
        return [HangingTransaction(TopicPartition(h.topic, h.partition), _producer_state(h.producer))
                for h in sorted(found, key=lambda h: (h.topic, h.partition, h.producer.producer_id))]

    def close(self) -> None:
        """Release the storage root. Idempotent."""
        if not self._closed:
            self._closed = True
            release_broker(self._broker)

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _failed(exc: KafkaException) -> Future:
    fut: Future = Future()
    fut.set_exception(exc)
    return fut


def _list_arg(value, name: str, kind: type) -> list:
    """``value`` as a list of ``kind`` (None = empty), as confluent-kafka checks its list arguments."""
    if value is None:
        return []
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(isinstance(v, kind) for v in value):
        raise TypeError(f"Expected {name} to be a list of {kind.__name__}")
    return list(value)


def _producer_state(a: ActiveProducer) -> ProducerState:
    return ProducerState(a.producer_id, a.producer_epoch, a.last_sequence, a.last_timestamp, a.coordinator_epoch,
                         a.current_txn_start_offset)


def abort_handed_over(conf: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """The writer-lease holder's side of a handed-over :meth:`AdminClient.abort_transaction`
    (engine/handoff.py kind ``txn.abort``): write the ABORT marker with this process's engine
    (``conf`` names the holder's storage root) and answer ``{"error": code, "message": str}``."""
    marker = TxnMarker(int(payload["producer_id"]), int(payload["producer_epoch"]), int(payload["coordinator_epoch"]),
                       False, ((str(payload["topic"]), int(payload["partition"])),))
    with AdminClient(conf) as admin:
        error, message = admin._write_abort_marker(marker, int(payload["timeout_ms"]))
    return {"error": int(error), "message": message}
