"""AdminClient: topic, config and transaction administration as confluent-kafka's ``AdminClient``.

Calls return ``dict[name, concurrent.futures.Future]``; a future's ``result()`` is None
on success or raises ``KafkaException`` with Kafka's error (TOPIC_ALREADY_EXISTS,
INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_CONFIG, UNKNOWN_TOPIC_OR_PART, ...).

**One request surface.** Every call that has a Kafka API sends that API's request to the
engine's request surface, :func:`txlake.engine.apis.local_apis` -- the handlers ``txlake serve``
answers its network clients with -- and reads the response: CreateTopics, DeleteTopics,
CreatePartitions, Metadata (``list_topics``), DescribeConfigs, IncrementalAlterConfigs,
DescribeCluster, DeleteRecords, DescribeProducers. So an embedded AdminClient gets the answers,
error codes and messages a confluent-kafka client of the server gets; where a response carries
no message (DeleteRecords, DescribeProducers, Metadata), the error's text is Kafka's description
of the code. Metadata names the one in-process broker: node 1 at ``localhost:0``.

Transaction administration (KIP-664) follows Kafka's Java ``Admin`` (confluent-kafka has
no such calls): ``list_transactions``, ``describe_transactions``, ``abort_transaction`` and
the check of ``kafka-transactions.sh find-hanging`` call the engine's transaction
administration (:class:`~txlake.engine.transaction_admin.TransactionAdmin`) directly: the
request surface has no ListTransactions, DescribeTransactions or WriteTxnMarkers handler yet.
``describe_producers`` is DescribeProducers. The Java result classes are dataclasses here
(``TransactionListing``, ``TransactionDescription``, ``ProducerState``, ...) under snake_case
names. See docs/operations.md.
"""

from __future__ import annotations

import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kafka.errors import for_code
from kafka.protocol.admin import (CreatePartitionsRequest, CreateTopicsRequest, DeleteRecordsRequest,
                                  DeleteTopicsRequest, DescribeClusterRequest, DescribeConfigsRequest,
                                  DescribeProducersRequest, IncrementalAlterConfigsRequest)
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import WriteTxnMarkersRequest

from txlake.engine.apis import UnsupportedRequest, local_apis
from txlake.engine.broker import Broker
from txlake.engine.errors import ApiError, Errors
from txlake.engine.registry import acquire_broker, release_broker
from txlake.engine.transaction_admin import COORDINATOR_ID, ActiveProducer, TransactionAdmin
from txlake.engine.transaction_metadata import TransactionState

from .admin_types import (AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, DescribeClusterResult,
                          NewPartitions, Node, ResourceType, kafka_resource_type)
from .config import parse_config
from .error import KafkaError, KafkaException, from_api_error, kafka_errors
from .types import TopicPartition

__all__ = [
    "AdminClient", "AlterConfigOpType", "BrokerMetadata", "ClusterMetadata", "ConfigEntry", "ConfigResource",
    "ConfigSource", "DeletedRecords", "DescribeClusterResult", "HangingTransaction", "NewPartitions", "NewTopic",
    "Node", "PartitionMetadata", "PartitionProducerState", "ProducerState", "ResourceType", "TopicMetadata",
    "TransactionDescription", "TransactionListing",
]

#: the request versions sent: the newest the engine answers (engine/apis)
_CreateTopics = CreateTopicsRequest[7]
_DeleteTopics = DeleteTopicsRequest[6]
_CreatePartitions = CreatePartitionsRequest[3]
_DescribeConfigs = DescribeConfigsRequest[4]
_IncrementalAlterConfigs = IncrementalAlterConfigsRequest[1]
_DeleteRecords = DeleteRecordsRequest[2]
_DescribeProducers = DescribeProducersRequest[0]
_DescribeCluster = DescribeClusterRequest[1]
_Metadata = MetadataRequest[12]
#: DeleteTopics v6 names a topic by name with the zero topic id
_NO_TOPIC_ID = uuid.UUID(int=0)


class NewTopic:
    """A topic to create (confluent-kafka's ``NewTopic``; Kafka's CreateTopics ``CreatableTopic``).

    Args:
        topic: the name.
        num_partitions: the partition count; -1 takes the engine's ``num.partitions``.
        replication_factor: -1 or 1 (the object store keeps the copies; more answers
            INVALID_REPLICATION_FACTOR, as a one-broker Kafka cluster does).
        replica_assignment: optional, one list of broker ids per partition (node 1 here), with
            ``num_partitions`` and ``replication_factor`` left at -1, as Kafka requires.
        config: topic config overrides, name -> value (docs/operations.md lists them).
    """

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
    """A partition as Metadata describes it: the one broker (node 1 in-process) leads it and is its only replica."""

    id: int
    leader: int = -1
    replicas: list[int] = field(default_factory=list)
    isrs: list[int] = field(default_factory=list)
    error: KafkaError | None = None


@dataclass
class TopicMetadata:
    """A topic as Metadata describes it (``error``: UNKNOWN_TOPIC_OR_PART for a topic asked for that does not exist)."""

    topic: str
    partitions: dict[int, PartitionMetadata]
    error: KafkaError | None = None


@dataclass
class BrokerMetadata:
    """A broker as Metadata names it (in-process: node 1 at ``localhost:0``, no socket)."""

    id: int
    host: str
    port: int


@dataclass
class ClusterMetadata:
    """confluent-kafka's ``ClusterMetadata``: ``topics`` by name, ``brokers`` by id, the cluster id
    (the storage root's: 22 url-safe base64 characters, the same ``txlake serve`` reports)."""

    cluster_id: str
    controller_id: int
    brokers: dict[int, BrokerMetadata]
    topics: dict[str, TopicMetadata]
    orig_broker_id: int = -1
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


def _error(code: int, message: str | None = None, where: str = "") -> KafkaError | None:
    """A response's error code as the client's KafkaError (None for NO_ERROR): the response's
    message, or, when the response carries none, ``"{where}: "`` and Kafka's description of the
    code (``Errors.message()``)."""
    if code == Errors.NO_ERROR:
        return None
    if message:
        return KafkaError(code, message)
    description = for_code(code).description
    return KafkaError(code, f"{where}: {description}" if where else description)


def _call(broker: Broker, request: Any, context: str) -> Any:
    """Send ``request`` to the engine's request surface and return the response. A handler that
    fails without an error response to answer with (Metadata) fails the call as the engine's
    error maps (:func:`~txlake.error.as_kafka_exception`: storage errors are KAFKA_STORAGE_ERROR, ...)."""
    with kafka_errors(context):
        try:
            return local_apis(broker).call(request)
        except UnsupportedRequest as exc:
            raise exc.__cause__ or exc from None


def cluster_metadata(broker: Broker, topic: str | None = None) -> ClusterMetadata:
    """Metadata of one topic or all topics (Kafka's Metadata request, answered by the engine's
    request surface as of the newest catalog commit).

    Raises:
        KafkaException: KAFKA_STORAGE_ERROR (and the other codes of :func:`~txlake.error.as_kafka_exception`)
            when the catalog cannot be read.
    """
    wanted = None if topic is None else [_Metadata.MetadataRequestTopic(name=topic)]
    answer = _call(broker, _Metadata(topics=wanted, allow_auto_topic_creation=False), "list_topics()")
    topics = {t.name: TopicMetadata(t.name, {p.partition_index: PartitionMetadata(
        p.partition_index, p.leader_id, list(p.replica_nodes), list(p.isr_nodes), _error(p.error_code))
        for p in t.partitions}, _error(t.error_code)) for t in answer.topics}
    brokers = {b.node_id: BrokerMetadata(b.node_id, b.host, b.port) for b in answer.brokers}
    first = answer.brokers[0]
    return ClusterMetadata(answer.cluster_id, answer.controller_id, brokers, topics, first.node_id,
                           f"{first.host}:{first.port}/{first.node_id}")


def _done(value: Any = None) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


def _answer(error: KafkaError | None, value: Any = None) -> Future:
    """A completed future: ``value``, or KafkaException(``error``)."""
    return _done(value) if error is None else _failed(KafkaException(error))


def _timeout_ms(timeout_s: float | None, default_ms: int = 30_000) -> int:
    """confluent-kafka's timeout argument (s; None or negative = the default) in ms."""
    return default_ms if timeout_s is None or timeout_s < 0 else int(timeout_s * 1000)


def _config_entry(entry: Any) -> ConfigEntry:
    """A DescribeConfigs result entry as confluent-kafka's ConfigEntry: ``source`` is the
    :class:`ConfigSource` number, as confluent-kafka's describe_configs gives it, and
    ``is_default`` says the source is DEFAULT_CONFIG (librdkafka's ``rd_kafka_ConfigEntry``)."""
    default = ConfigSource.DEFAULT_CONFIG.value
    synonyms = {s.name: ConfigEntry(s.name, s.value, s.source, is_read_only=entry.read_only,
                                    is_default=s.source == default, is_sensitive=entry.is_sensitive, is_synonym=True)
                for s in entry.synonyms}
    return ConfigEntry(entry.name, None if entry.is_sensitive else entry.value, entry.config_source, entry.read_only,
                       entry.config_source == default, entry.is_sensitive, False, synonyms)


def _topic_futures(names: list[str], results: list[Any]) -> dict[str, Future]:
    """One future per topic name from CreateTopics/DeleteTopics/CreatePartitions results (each
    with ``name``, ``error_code``, ``error_message``)."""
    by_name = {r.name: r for r in results}
    return {name: _answer(_error(by_name[name].error_code, by_name[name].error_message)) for name in names}


class AdminClient:
    """Topic, config and transaction administration of a storage root (confluent-kafka's ``AdminClient``).

    Write operations (creating or deleting topics, adding partitions, altering configs,
    deleting records, aborting a transaction) take the storage root's writer lease (first
    write); listing and describing do not: in a process that is not the writer they read the
    last committed state. A write refused because another process holds the lease fails its
    futures with NOT_LEADER_OR_FOLLOWER, naming the holder.
    """

    def __init__(self, conf: dict | None = None, **kwargs: Any):
        self._cfg = parse_config({**(conf or {}), **kwargs}, "admin")
        with kafka_errors(f"{type(self).__name__}: cannot open storage.url {self._cfg.storage_url}"):
            self._broker = acquire_broker(self._cfg.storage_url, self._cfg.storage_options, self._cfg.broker_config())
        self._closed = False

    def create_topics(self, new_topics: list[NewTopic], operation_timeout: float = 0, request_timeout: float = -1,
                      validate_only: bool = False) -> dict[str, Future]:
        """CreateTopics: one future per topic (None, or KafkaException with Kafka's error and message:
        TOPIC_ALREADY_EXISTS, INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR,
        INVALID_REPLICA_ASSIGNMENT, INVALID_CONFIG, NOT_LEADER_OR_FOLLOWER, ...). Nothing is created
        with ``validate_only``.

        ``__consumer_offsets`` and ``__transaction_state`` are created by their coordinators
        only: asking for one fails with INVALID_REQUEST (see docs/operations.md).

        Raises:
            TypeError: not a list of NewTopic. ValueError: a topic named twice.
        """
        if not isinstance(new_topics, list) or not all(isinstance(t, NewTopic) for t in new_topics):
            raise TypeError("Expected list of NewTopic")
        if len({t.topic for t in new_topics}) != len(new_topics):
            raise ValueError("Duplicate topic names in request")
        T = _CreateTopics.CreatableTopic
        topics = []
        for t in new_topics:
            assigned = t.replica_assignment or []
            topics.append(T(
                name=t.topic, num_partitions=-1 if assigned else t.num_partitions,
                replication_factor=-1 if assigned else t.replication_factor,
                assignments=[T.CreatableReplicaAssignment(partition_index=i, broker_ids=list(ids))
                             for i, ids in enumerate(assigned)],
                configs=[T.CreatableTopicConfig(name=k, value=None if v is None else str(v))
                         for k, v in t.config.items()]))
        answer = _call(self._broker, _CreateTopics(topics=topics, timeout_ms=_timeout_ms(operation_timeout, 0),
                                                   validate_only=bool(validate_only)), "create_topics()")
        return _topic_futures([t.topic for t in new_topics], answer.topics)

    def delete_topics(self, topics: list[str], operation_timeout: float = 0, request_timeout: float = -1) -> dict[str, Future]:
        """DeleteTopics: one future per topic (None, or KafkaException UNKNOWN_TOPIC_OR_PART,
        NOT_LEADER_OR_FOLLOWER, ...).

        An internal topic (``__consumer_offsets``, ``__transaction_state``) is never deleted:
        its future fails with INVALID_TOPIC_EXCEPTION (see docs/operations.md).

        Raises:
            TypeError: not a list of topic names. ValueError: a topic named twice.
        """
        if not isinstance(topics, list):
            raise TypeError("Expected list of topic names")
        names = _list_arg(topics, "topics", str)
        if len(set(names)) != len(names):
            raise ValueError("Duplicate topic names in request")
        state = _DeleteTopics.DeleteTopicState
        answer = _call(self._broker, _DeleteTopics(topics=[state(name=n, topic_id=_NO_TOPIC_ID) for n in names],
                                                   timeout_ms=_timeout_ms(operation_timeout, 0)), "delete_topics()")
        return _topic_futures(names, answer.responses)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """Metadata of all topics (or one), as of the newest catalog commit (a Metadata request)."""
        return cluster_metadata(self._broker, topic)

    def create_partitions(self, new_partitions: list[NewPartitions], operation_timeout: float = 0,
                          request_timeout: float = -1, validate_only: bool = False) -> dict[str, Future]:
        """CreatePartitions (confluent-kafka's ``AdminClient.create_partitions``): grow each topic to
        ``new_total_count`` partitions; the new ones are empty and writable at once, and producers,
        consumers (a subscription rebalances onto them) and DuckDB views see them. Nothing changes
        with ``validate_only``.

        Returns:
            One future per topic name; its result is None, or it raises KafkaException
            UNKNOWN_TOPIC_OR_PART, INVALID_PARTITIONS ("Topic already has N partition(s)." /
            "The topic T currently has N partition(s); C would not be an increase."),
            INVALID_REPLICA_ASSIGNMENT (an assignment that is not one list per new partition on
            node 1), INVALID_REQUEST (an internal topic), NOT_LEADER_OR_FOLLOWER.

        Raises:
            TypeError: not a list of NewPartitions. ValueError: a topic named twice.
        """
        if not isinstance(new_partitions, list):
            raise TypeError("Expected list of NewPartitions")
        wanted = _list_arg(new_partitions, "new_partitions", NewPartitions)
        if len({p.topic for p in wanted}) != len(wanted):
            raise ValueError("Duplicate topic names in request")
        T = _CreatePartitions.CreatePartitionsTopic
        topics = [T(name=p.topic, count=p.new_total_count,
                    assignments=None if p.replica_assignment is None else
                    [T.CreatePartitionsAssignment(broker_ids=list(ids)) for ids in p.replica_assignment])
                  for p in wanted]
        answer = _call(self._broker, _CreatePartitions(topics=topics, timeout_ms=_timeout_ms(operation_timeout, 0),
                                                       validate_only=bool(validate_only)), "create_partitions()")
        return _topic_futures([p.topic for p in wanted], answer.results)

    def describe_configs(self, resources: list[ConfigResource], request_timeout: float = -1,
                         broker: int = -1) -> dict[ConfigResource, Future]:
        """DescribeConfigs (confluent-kafka's ``AdminClient.describe_configs``): every config of each
        resource, with its source and synonyms.

        A TOPIC resource lists every topic config (an override has source DYNAMIC_TOPIC_CONFIG,
        the others DEFAULT_CONFIG); the BROKER resource "1" (the one node) lists the engine's
        broker configs, all read-only. ``broker`` is accepted for confluent-kafka's signature (one node).

        Returns:
            One future per resource; its result is ``dict[name, ConfigEntry]``, or it raises
            KafkaException UNKNOWN_TOPIC_OR_PART, INVALID_TOPIC_EXCEPTION, or INVALID_REQUEST
            (another broker id; a resource type without configs here, e.g. GROUP).

        Raises:
            ValueError: not a list of ConfigResource (confluent-kafka raises ValueError here).
        """
        if not isinstance(resources, list) or not all(isinstance(r, ConfigResource) for r in resources):
            raise ValueError(f"Expected list of {ConfigResource!r}")
        R = _DescribeConfigs.DescribeConfigsResource
        request = _DescribeConfigs(resources=[R(resource_type=kafka_resource_type(r.restype), resource_name=r.name,
                                                configuration_keys=None) for r in resources],
                                   include_synonyms=True, include_documentation=False)
        answer = _call(self._broker, request, "describe_configs()")
        return {r: _answer(_error(result.error_code, result.error_message),
                           {e.name: _config_entry(e) for e in result.configs})
                for r, result in zip(resources, answer.results)}

    def incremental_alter_configs(self, resources: list[ConfigResource], validate_only: bool = False,
                                  request_timeout: float = -1, broker: int = -1) -> dict[ConfigResource, Future]:
        """IncrementalAlterConfigs (KIP-339; confluent-kafka's ``AdminClient.incremental_alter_configs``):
        apply each resource's ``incremental_configs`` -- :class:`ConfigEntry` with an
        ``incremental_operation`` SET, DELETE (back to the default), APPEND or SUBTRACT (list
        configs such as ``cleanup.policy``) -- leaving its other configs as they are. A topic's
        changes are committed together; nothing changes with ``validate_only``.

        Returns:
            One future per resource; its result is None, or it raises KafkaException with the
            engine's answer: INVALID_CONFIG (an unknown config name or a bad value, with Kafka's
            message), UNKNOWN_TOPIC_OR_PART, INVALID_REQUEST (a config named twice, a broker
            config: none can change while the engine runs, a resource type without configs).

        Raises:
            TypeError: not a list of ConfigResource, or an incremental config that is not a
                ConfigEntry with an AlterConfigOpType ``incremental_operation``.
            ValueError: a resource named twice.
        """
        if not isinstance(resources, list) or not all(isinstance(r, ConfigResource) for r in resources):
            raise TypeError(f"Expected list of {ConfigResource!r}")
        if len(set(resources)) != len(resources):
            raise ValueError("Duplicate ConfigResource in request")
        R = _IncrementalAlterConfigs.AlterConfigsResource
        wire = []
        for r in resources:
            configs = []
            for entry in r.incremental_configs:
                if not isinstance(entry, ConfigEntry) or not isinstance(entry.incremental_operation, AlterConfigOpType):
                    raise TypeError(f"{r!r}: expected ConfigEntry with an AlterConfigOpType incremental_operation, "
                                    f"got {entry!r}")
                op = entry.incremental_operation
                configs.append(R.AlterableConfig(name=entry.name, config_operation=op.value,
                                                 value=None if op is AlterConfigOpType.DELETE or entry.value is None
                                                 else str(entry.value)))
            wire.append(R(resource_type=kafka_resource_type(r.restype), resource_name=r.name, configs=configs))
        answer = _call(self._broker, _IncrementalAlterConfigs(resources=wire, validate_only=bool(validate_only)),
                       "incremental_alter_configs()")
        return {r: _answer(_error(result.error_code, result.error_message))
                for r, result in zip(resources, answer.responses)}

    def describe_cluster(self, request_timeout: float = -1, include_authorized_operations: bool = False) -> Future:
        """DescribeCluster (KIP-700; confluent-kafka's ``AdminClient.describe_cluster``): a future of
        :class:`DescribeClusterResult` -- the one node (node 1 at ``localhost:0`` in-process), which
        is also the controller, and the storage root's cluster id. ``authorized_operations`` is
        None (no authorizer)."""
        answer = _call(self._broker, _DescribeCluster(include_cluster_authorized_operations=False),
                       "describe_cluster()")
        nodes = [Node(b.broker_id, b.host, b.port, b.rack) for b in answer.brokers]
        controller = next((n for n in nodes if n.id == answer.controller_id), None)
        return _answer(_error(answer.error_code, answer.error_message),
                       DescribeClusterResult(controller, nodes, answer.cluster_id))

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
            NOT_LEADER_OR_FOLLOWER (another process holds the writer lease) or REQUEST_TIMED_OUT
            (not committed within ``request_timeout``, default 30 s). DeleteRecords answers carry
            no message: the error's text is Kafka's description of the code.

        Raises:
            TypeError: not a list of TopicPartition. ValueError: a partition named twice.
        """
        partitions = _list_arg(topic_partition_offsets, "topic_partition_offsets", TopicPartition)
        if len({(tp.topic, tp.partition) for tp in partitions}) != len(partitions):
            raise ValueError("Duplicate partitions in request")
        T = _DeleteRecords.DeleteRecordsTopic
        topics = [T(name=name, partitions=[T.DeleteRecordsPartition(partition_index=tp.partition, offset=tp.offset)
                                           for tp in tps]) for name, tps in _by_topic(partitions).items()]
        answer = _call(self._broker, _DeleteRecords(topics=topics, timeout_ms=_timeout_ms(request_timeout)),
                       "delete_records()")
        results = {(t.name, p.partition_index): p for t in answer.topics for p in t.partitions}
        out: dict[TopicPartition, Future] = {}
        for tp in partitions:
            p = results[(tp.topic, tp.partition)]
            error = _error(p.error_code, None, f"{tp.topic} [{tp.partition}]")
            out[tp] = _answer(error, DeletedRecords(p.low_watermark))
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
        each partition, with the first offset of their open transaction (in a process that is not
        the writer: as of the last producer-state snapshot and the log after it).

        Returns:
            One future per partition (keyed by the given :class:`TopicPartition`); its result
            is a :class:`PartitionProducerState`, or it raises KafkaException
            UNKNOWN_TOPIC_OR_PART.

        Raises:
            TypeError: not a list of TopicPartition.
        """
        partitions = _list_arg(partitions, "partitions", TopicPartition)
        T = _DescribeProducers.TopicRequest
        request = _DescribeProducers(topics=[T(name=name, partition_indexes=[tp.partition for tp in tps])
                                             for name, tps in _by_topic(partitions).items()])
        answer = _call(self._broker, request, "describe_producers()")
        results = {(t.name, p.partition_index): p for t in answer.topics for p in t.partitions}
        out: dict[TopicPartition, Future] = {}
        for tp in partitions:
            p = results[(tp.topic, tp.partition)]
            error = _error(p.error_code, p.error_message, f"{tp.topic} [{tp.partition}]")
            out[tp] = _answer(error, PartitionProducerState([
                ProducerState(s.producer_id, s.producer_epoch, s.last_sequence, s.last_timestamp, s.coordinator_epoch,
                              s.current_txn_start_offset) for s in p.active_producers]))
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

        The marker is Kafka's WriteTxnMarkers request, answered by the engine's request
        surface. When another process holds the writer lease (a running application, the usual
        case for a hanging transaction), the same request is handed to it through the storage
        root (engine/apis/handoff.py, hand-over kind ``kafka.request``) and answered by its
        engine: the same marker and answers, as Kafka's WriteTxnMarkers goes to whichever
        broker leads the partition.

        Raises:
            TypeError: ``partition`` is not a TopicPartition.
        """
        if not isinstance(partition, TopicPartition):
            raise TypeError("Expected a TopicPartition")
        timeout_ms = 30_000 if request_timeout is None or request_timeout < 0 else int(request_timeout * 1000)
        marker = WriteTxnMarkersRequest.WritableTxnMarker(
            producer_id=int(producer_id), producer_epoch=int(producer_epoch), transaction_result=False,
            topics=[WriteTxnMarkersRequest.WritableTxnMarker.WritableTxnMarkerTopic(
                name=partition.topic, partition_indexes=[partition.partition])],
            coordinator_epoch=int(coordinator_epoch))
        request = WriteTxnMarkersRequest[1](markers=[marker])
        where = f"{partition.topic} [{partition.partition}]"
        answer = _call(self._broker, request, f"abort_transaction({where})")
        if _marker_error(answer) == Errors.NOT_LEADER_OR_FOLLOWER:
            answer = self._hand_over(request, timeout_ms)
            if isinstance(answer, KafkaError):
                return _failed(KafkaException(answer))
        error = _error(_marker_error(answer), where=where)
        if error is None:
            fut: Future = Future()
            fut.set_result(None)
            return fut
        return _failed(KafkaException(error))

    def _hand_over(self, request: Any, timeout_ms: int) -> Any:
        """Have the writer-lease holder answer ``request`` (engine/apis/handoff.py): its
        response, or the KafkaError saying why no holder answered."""
        from txlake.engine.apis.handoff import hand_over
        from txlake.engine.handoff import HandoffCancelled, HandoffError

        url = self._broker.store.url
        try:
            return hand_over(self._broker.store, request, timeout_ms / 1000)
        except HandoffCancelled:
            return KafkaError(Errors.NOT_LEADER_OR_FOLLOWER, (
                f"another process holds the writer lease of {url}; the request was handed to that process, "
                f"which did not take it within {timeout_ms / 1000:.0f} s"))
        except HandoffError as exc:
            return KafkaError(Errors.UNKNOWN_SERVER_ERROR, f"the writer-lease holder of {url} failed to answer: {exc}")

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
            topics = cluster_metadata(self._broker).topics
            wanted = []
            for tp in _list_arg(partitions, "partitions", TopicPartition):
                if tp.partition < 0 and tp.topic in topics:
                    wanted += [(tp.topic, p) for p in sorted(topics[tp.topic].partitions)]
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


def _by_topic(partitions: list[TopicPartition]) -> dict[str, list[TopicPartition]]:
    """The partitions grouped by topic, in the order first named (a request's topic entries)."""
    out: dict[str, list[TopicPartition]] = {}
    for tp in partitions:
        out.setdefault(tp.topic, []).append(tp)
    return out


def _producer_state(a: ActiveProducer) -> ProducerState:
    return ProducerState(a.producer_id, a.producer_epoch, a.last_sequence, a.last_timestamp, a.coordinator_epoch,
                         a.current_txn_start_offset)


def _marker_error(answer: Any) -> int:
    """The error code of the one partition of a one-marker WriteTxnMarkers response."""
    ((partition,),) = [t.partitions for m in answer.markers for t in m.topics]
    return partition.error_code
