"""AdminClient: topic, config and transaction administration as confluent-kafka's ``AdminClient``.

Calls return ``dict[name, concurrent.futures.Future]``; a future's ``result()`` is None
on success or raises ``KafkaException`` with Kafka's error (TOPIC_ALREADY_EXISTS,
INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_CONFIG, UNKNOWN_TOPIC_OR_PART, ...).

**One request surface.** Every call that has a Kafka API sends that API's request to the
engine's request surface, :func:`txlake.engine.apis.local_apis` -- the handlers ``txlake serve``
answers its network clients with -- and reads the response: CreateTopics, DeleteTopics,
CreatePartitions, Metadata (``list_topics``, ``describe_topics``), DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs, DescribeCluster, DeleteRecords, DescribeProducers, ListOffsets, ListGroups,
DescribeGroups, DeleteGroups, OffsetFetch, OffsetCommit, ElectLeaders, the ACL and SCRAM APIs (no
authorizer, no SASL: docs/server.md). So an embedded AdminClient gets the answers,
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
import warnings
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kafka.errors import for_code
from kafka.protocol.admin import (AlterConfigsRequest, DescribeTransactionsRequest, ListTransactionsRequest, AlterUserScramCredentialsRequest, CreateAclsRequest,
                                  CreatePartitionsRequest, CreateTopicsRequest, DeleteAclsRequest, DeleteGroupsRequest,
                                  DeleteRecordsRequest, DeleteTopicsRequest, DescribeAclsRequest, DescribeClusterRequest,
                                  DescribeConfigsRequest, DescribeGroupsRequest, DescribeProducersRequest,
                                  DescribeUserScramCredentialsRequest, ElectLeadersRequest,
                                  IncrementalAlterConfigsRequest, ListGroupsRequest)
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.consumer.group import OffsetCommitRequest, OffsetFetchRequest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import WriteTxnMarkersRequest

from txlake.engine.apis import UnsupportedRequest, local_apis
from txlake.engine.broker import Broker
from txlake.engine.errors import ApiError, Errors
from txlake.engine.group_metadata import CONSUMER_PROTOCOL_TYPE
from txlake.engine.registry import acquire_broker, release_broker
from txlake.engine.transaction_admin import COORDINATOR_ID, ActiveProducer, TransactionAdmin
from txlake.engine.transaction_metadata import TransactionState

from .admin_acl_types import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType,
                              ScramCredentialInfo, ScramMechanism, UserScramCredentialAlteration,
                              UserScramCredentialDeletion, UserScramCredentialsDescription,
                              UserScramCredentialUpsertion)
from .admin_group_types import (GroupMember, GroupMetadata, ConsumerGroupDescription, ConsumerGroupListing, ConsumerGroupState,
                                ConsumerGroupTopicPartitions, ConsumerGroupType, ElectionType, IsolationLevel,
                                ListConsumerGroupsResult, ListOffsetsResultInfo, MemberAssignment, MemberDescription,
                                OffsetSpec, TopicCollection, TopicDescription, TopicPartitionInfo, Uuid)
from .admin_types import (AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, DescribeClusterResult,
                          NewPartitions, Node, ResourceType, kafka_resource_type)
from .assignors import ConsumerProtocolError, decode_assignment
from .config import constructor_conf, parse_config
from .error import KafkaError, KafkaException, from_api_error, kafka_errors
from .types import OFFSET_INVALID, TopicPartition

__all__ = [
    "AclBinding", "AclBindingFilter", "AclOperation", "AclPermissionType", "AdminClient", "AlterConfigOpType",
    "BrokerMetadata", "ClusterMetadata", "ConfigEntry", "ConfigResource", "ConfigSource", "ConsumerGroupDescription",
    "ConsumerGroupListing", "ConsumerGroupState", "ConsumerGroupTopicPartitions", "ConsumerGroupType",
    "DeletedRecords", "DescribeClusterResult", "ElectionType", "GroupMember", "GroupMetadata", "HangingTransaction",
    "IsolationLevel",
    "ListConsumerGroupsResult", "ListOffsetsResultInfo", "MemberAssignment", "MemberDescription", "NewPartitions",
    "NewTopic", "Node", "OffsetSpec", "PartitionMetadata", "PartitionProducerState", "ProducerState",
    "ResourcePatternType", "ResourceType", "ScramCredentialInfo", "ScramMechanism", "TopicCollection",
    "TopicDescription", "TopicMetadata", "TopicPartitionInfo", "TransactionDescription", "TransactionListing",
    "UserScramCredentialAlteration", "UserScramCredentialDeletion", "UserScramCredentialsDescription",
    "UserScramCredentialUpsertion", "Uuid",
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
_FindCoordinator = FindCoordinatorRequest[4]
_ListGroups = ListGroupsRequest[5]
#: v5, as librdkafka asks: a group that does not exist is described Dead (v6 answers GROUP_ID_NOT_FOUND)
_DescribeGroups = DescribeGroupsRequest[5]
_DeleteGroups = DeleteGroupsRequest[2]
_OffsetFetch = OffsetFetchRequest[8]
_OffsetCommit = OffsetCommitRequest[9]
_ListOffsets = ListOffsetsRequest[8]
_AlterConfigs = AlterConfigsRequest[2]
_ElectLeaders = ElectLeadersRequest[2]
_CreateAcls = CreateAclsRequest[3]
_DescribeAcls = DescribeAclsRequest[3]
_DeleteAcls = DeleteAclsRequest[3]
_DescribeUserScramCredentials = DescribeUserScramCredentialsRequest[0]
_AlterUserScramCredentials = AlterUserScramCredentialsRequest[0]
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


def check_sasl_credentials(username: Any, password: Any) -> None:
    """``set_sasl_credentials``'s argument check (the call itself has no effect: no SASL
    against object storage). Raises TypeError when either is not a str."""
    if not isinstance(username, str) or not isinstance(password, str):
        raise TypeError("username and password must be strings")


def cluster_id_of(broker: Broker) -> str:
    """The storage root's cluster id, as a Metadata request naming no topic answers it."""
    return _call(broker, _Metadata(topics=[], allow_auto_topic_creation=False), "cluster_id()").cluster_id


def _done(value: Any = None) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


def _answer(error: KafkaError | None, value: Any = None) -> Future:
    """A completed future: ``value``, or KafkaException(``error``)."""
    return _done(value) if error is None else _failed(KafkaException(error))


def _timeout_ms(timeout_s: float | None, default_ms: int = 30_000) -> int:
    """An AdminClient call's ``request_timeout``/``operation_timeout`` (s; None = the default) in ms.

    Raises:
        TypeError: not a number (confluent-kafka's ``"must be real number, not str"``).
        ValueError: negative or beyond an hour, as librdkafka's admin options refuse it.
    """
    if timeout_s is None:
        return default_ms
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool):
        raise TypeError(f"must be real number, not {type(timeout_s).__name__}")
    if not 0 <= timeout_s * 1000 <= 3_600_000:
        raise ValueError('Invalid value type for "request_timeout": expecting integer in range 0..3600000')
    return int(timeout_s * 1000)


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

    #: a subclass whose ``__init__`` never called this one's is closed: every call raises
    #: RuntimeError, as confluent-kafka's (its handle is NULL)
    _closed = True

    def __init__(self, conf: dict | None = None, **kwargs: Any):
        self._cfg = parse_config(constructor_conf(conf, kwargs), "admin")
        with kafka_errors(f"{type(self).__name__}: cannot open storage.url {self._cfg.storage_url}"):
            self._broker = acquire_broker(self._cfg.storage_url, self._cfg.storage_options, self._cfg.broker_config())
        self._closed = False

    def create_topics(self, new_topics: list[NewTopic], operation_timeout: float = 0, request_timeout: float | None = None,
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
        self._check_open()
        _timeout_ms(request_timeout)
        if not isinstance(new_topics, list) or not all(isinstance(t, NewTopic) for t in new_topics):
            raise TypeError("Expected list of NewTopic")
        _non_empty(new_topics, "NewTopic objects")
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

    def delete_topics(self, topics: list[str], operation_timeout: float = 0, request_timeout: float | None = None) -> dict[str, Future]:
        """DeleteTopics: one future per topic (None, or KafkaException UNKNOWN_TOPIC_OR_PART,
        NOT_LEADER_OR_FOLLOWER, ...).

        An internal topic (``__consumer_offsets``, ``__transaction_state``) is never deleted:
        its future fails with INVALID_TOPIC_EXCEPTION (see docs/operations.md).

        Raises:
            TypeError: not a list of topic names. ValueError: a topic named twice.
        """
        self._check_open()
        _timeout_ms(request_timeout)
        if not isinstance(topics, list):
            raise TypeError("Expected list of topic names")
        _non_empty(topics, "topic strings")
        for name in topics:
            if not isinstance(name, str):
                raise ValueError(f"Expected list of topic strings, not {type(name).__name__}")
        names = list(topics)
        if len(set(names)) != len(names):
            raise ValueError("Duplicate topic names in request")
        state = _DeleteTopics.DeleteTopicState
        answer = _call(self._broker, _DeleteTopics(topics=[state(name=n, topic_id=_NO_TOPIC_ID) for n in names],
                                                   timeout_ms=_timeout_ms(operation_timeout, 0)), "delete_topics()")
        return _topic_futures(names, answer.responses)

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """Metadata of all topics (or one), as of the newest catalog commit (a Metadata request)."""
        self._check_open("Handle has been closed")
        return cluster_metadata(self._broker, topic)

    def create_partitions(self, new_partitions: list[NewPartitions], operation_timeout: float = 0,
                          request_timeout: float | None = None, validate_only: bool = False) -> dict[str, Future]:
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
        self._check_open()
        _timeout_ms(request_timeout)
        if not isinstance(new_partitions, list):
            raise TypeError("Expected list of NewPartitions")
        _non_empty(new_partitions, "NewPartitions objects")
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

    def describe_configs(self, resources: list[ConfigResource], request_timeout: float | None = None,
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
        self._check_open()
        _timeout_ms(request_timeout)
        if not isinstance(resources, list) or not all(isinstance(r, ConfigResource) for r in resources):
            raise ValueError(f"Expected list of {ConfigResource!r}")
        _non_empty(resources, "ConfigResource objects")
        R = _DescribeConfigs.DescribeConfigsResource
        request = _DescribeConfigs(resources=[R(resource_type=kafka_resource_type(r.restype), resource_name=r.name,
                                                configuration_keys=None) for r in resources],
                                   include_synonyms=True, include_documentation=False)
        answer = _call(self._broker, request, "describe_configs()")
        return {r: _answer(_error(result.error_code, result.error_message),
                           {e.name: _config_entry(e) for e in result.configs})
                for r, result in zip(resources, answer.results)}

    def incremental_alter_configs(self, resources: list[ConfigResource], validate_only: bool = False,
                                  request_timeout: float | None = None, broker: int = -1) -> dict[ConfigResource, Future]:
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
                ConfigEntry with a str name and an AlterConfigOpType ``incremental_operation``.
            ValueError: an empty list, a resource without incremental configs, a resource
                named twice. (A config named twice in one resource fails every future with
                ``_INVALID_ARG`` "Duplicate ConfigEntry found", as librdkafka.)
        """
        self._check_open()
        _timeout_ms(request_timeout)
        if not isinstance(resources, list) or not all(isinstance(r, ConfigResource) for r in resources):
            raise TypeError(f"Expected list of {ConfigResource!r}")
        _non_empty(resources, "ConfigResource objects")
        if len(set(resources)) != len(resources):
            raise ValueError("Duplicate ConfigResource in request")
        R = _IncrementalAlterConfigs.AlterConfigsResource
        wire = []
        duplicated = set()
        for r in resources:
            configs = []
            if not r.incremental_configs:
                raise ValueError("expected non-empty list of ConfigEntry to alter incrementally in "
                                 "incremental_configs field")
            for index, entry in enumerate(r.incremental_configs):
                if not isinstance(entry, ConfigEntry):
                    raise TypeError(f"expected ConfigEntry type in incremental_configs field, index {index}")
                if not isinstance(entry.name, str):
                    raise TypeError(f"Expected .name to be str type, not {type(entry.name).__name__}")
                if not isinstance(entry.incremental_operation, AlterConfigOpType):
                    raise TypeError(f"{r!r}: expected ConfigEntry with an AlterConfigOpType incremental_operation, "
                                    f"got {entry!r}")
                op = entry.incremental_operation
                configs.append(R.AlterableConfig(name=entry.name, config_operation=op.value,
                                                 value=None if op is AlterConfigOpType.DELETE or entry.value is None
                                                 else str(entry.value)))
            if len({c.name for c in configs}) != len(configs):
                duplicated.add(r)
            wire.append(R(resource_type=kafka_resource_type(r.restype), resource_name=r.name, configs=configs))
        if duplicated:  # librdkafka refuses the request before sending it, failing every future
            error = KafkaError(KafkaError._INVALID_ARG, "Duplicate ConfigEntry found")
            return {r: _answer(error) for r in resources}
        answer = _call(self._broker, _IncrementalAlterConfigs(resources=wire, validate_only=bool(validate_only)),
                       "incremental_alter_configs()")
        return {r: _answer(_error(result.error_code, result.error_message))
                for r, result in zip(resources, answer.responses)}

    def describe_cluster(self, request_timeout: float | None = None, include_authorized_operations: bool = False) -> Future:
        """DescribeCluster (KIP-700; confluent-kafka's ``AdminClient.describe_cluster``): a future of
        :class:`DescribeClusterResult` -- the one node (node 1 at ``localhost:0`` in-process), which
        is also the controller, and the storage root's cluster id. ``authorized_operations`` is
        None (no authorizer)."""
        self._check_open()
        _timeout_ms(request_timeout)
        answer = _call(self._broker, _DescribeCluster(include_cluster_authorized_operations=False),
                       "describe_cluster()")
        nodes = [Node(b.broker_id, b.host, b.port, b.rack) for b in answer.brokers]
        controller = next((n for n in nodes if n.id == answer.controller_id), None)
        return _answer(_error(answer.error_code, answer.error_message),
                       DescribeClusterResult(controller, nodes, answer.cluster_id))

    def delete_records(self, topic_partition_offsets: list[TopicPartition], request_timeout: float | None = None,
                       operation_timeout: float | None = None) -> dict[TopicPartition, Future]:
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
        self._check_open()
        partitions = _partition_list(topic_partition_offsets, "Expected Request to be a list, got '{}' ",
                                     "Element of the request list must be of type 'TopicPartition' got '{}' ",
                                     "'partition' cannot be negative")
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

    # ------------------------------------------------------------------ consumer groups
    def _coordinator_node(self) -> Node:
        """The group coordinator (FindCoordinator: this node for every group)."""
        answer = _call(self._broker, _FindCoordinator(key_type=0, coordinator_keys=[""]), "describe_consumer_groups()")
        (c,) = answer.coordinators
        return Node(c.node_id, c.host, c.port)

    def list_consumer_groups(self, request_timeout: float | None = None, states: set | None = None,
                             types: set | None = None) -> Future:
        """ListGroups (KIP-518 states filter, KIP-848 types filter; confluent-kafka's
        ``AdminClient.list_consumer_groups``).

        Args:
            states: a set of :class:`ConsumerGroupState`: keep only groups in these states; None = all.
            types: a set of :class:`ConsumerGroupType`: keep only groups of these types (every
                group here is CLASSIC); None = all.

        Returns:
            A future of :class:`ListConsumerGroupsResult`: ``valid`` lists every group sorted by id
            as :class:`ConsumerGroupListing` (a group that only has committed offsets is a simple
            group, Empty); ``errors`` holds the coordinator's error (COORDINATOR_LOAD_IN_PROGRESS)
            beside the groups listed so far.

        Raises:
            TypeError: ``states``/``types`` not a set of ConsumerGroupState/ConsumerGroupType.
        """
        self._check_open()
        _timeout_ms(request_timeout)
        for value, kind, name in ((states, ConsumerGroupState, "states"), (types, ConsumerGroupType, "types")):
            if value is not None:
                if not isinstance(value, set):
                    raise TypeError(f"'{name}' must be a set")
                if not all(isinstance(v, kind) for v in value):
                    raise TypeError(f"All elements of {name} must be of type {kind.__name__}")
        request = _ListGroups(states_filter=[s.kafka_name for s in states or ()],
                              types_filter=[t.kafka_name for t in types or ()])
        answer = _call(self._broker, request, "list_consumer_groups()")
        valid = [ConsumerGroupListing(g.group_id, not g.protocol_type, ConsumerGroupState.from_kafka_name(g.group_state),
                                      ConsumerGroupType.from_kafka_name(g.group_type)) for g in answer.groups]
        errors = [] if answer.error_code == Errors.NO_ERROR else [KafkaException(KafkaError(answer.error_code))]
        return _done(ListConsumerGroupsResult(valid, errors))

    def describe_consumer_groups(self, group_ids: list[str], request_timeout: float | None = None,
                                 include_authorized_operations: bool = False) -> dict[str, Future]:
        """DescribeGroups (confluent-kafka's ``AdminClient.describe_consumer_groups``).

        Returns:
            One future per group id; its result is a :class:`ConsumerGroupDescription`: state,
            protocol (``partition_assignor``, e.g. "range"), members with their assignments
            (while the group is Stable), the coordinator :class:`Node`. A group that does not exist
            is described DEAD with no members, as confluent-kafka reports it. With
            ``include_authorized_operations`` the operations are READ, DELETE, DESCRIBE (no
            authorizer). A future raises KafkaException with the coordinator's error.

        Raises:
            TypeError: ``group_ids`` is not a list. ValueError: it is empty.
        """
        self._check_open()
        _timeout_ms(request_timeout)
        if not isinstance(group_ids, list):
            raise TypeError("Expected input to be list of group ids to be described")
        if not group_ids:
            raise ValueError("Expected at least one group to be described")
        request = _DescribeGroups(groups=list(dict.fromkeys(group_ids)),
                                  include_authorized_operations=bool(include_authorized_operations))
        answer = _call(self._broker, request, "describe_consumer_groups()")
        coordinator = self._coordinator_node()
        by_id = {g.group_id: g for g in answer.groups}
        out: dict[str, Future] = {}
        for group_id in group_ids:
            g = by_id[group_id]
            if g.error_code != Errors.NO_ERROR:
                out[group_id] = _answer(KafkaError(g.error_code, g.error_message or None))
                continue
            consumer = g.protocol_type == CONSUMER_PROTOCOL_TYPE
            members = [MemberDescription(m.member_id, m.client_id, m.client_host,
                                         MemberAssignment(_assigned(m.member_assignment) if consumer else []),
                                         m.group_instance_id) for m in g.members]
            operations = sorted(g.authorized_operations) if isinstance(g.authorized_operations, (set, frozenset)) \
                else None
            out[group_id] = _done(ConsumerGroupDescription(
                g.group_id, not g.protocol_type, members, g.protocol_data or "",
                ConsumerGroupState.from_kafka_name(g.group_state), coordinator, operations, ConsumerGroupType.CLASSIC))
        return out

    def list_groups(self, group: str | None = None, timeout: float = -1) -> list[GroupMetadata]:
        """The groups with their members (confluent-kafka's legacy ``list_groups``, deprecated there
        since 2.0.2 in favour of :meth:`list_consumer_groups` and :meth:`describe_consumer_groups`;
        librdkafka's ``rd_kafka_list_groups``: ListGroups, then DescribeGroups of each group).

        Args:
            group: only this group (none when ListGroups does not list it, as librdkafka
                filters ListGroups' answer); None = every group, in ListGroups' order.
            timeout: accepted for confluent-kafka's signature (s); the answer is immediate.

        Returns:
            A list of :class:`GroupMetadata`.

        Raises:
            RuntimeError: ``"Handle has been closed"`` after :meth:`close`.
            KafkaException: a request failed as a whole (e.g. COORDINATOR_LOAD_IN_PROGRESS), as
                ``"Failed to list groups: ..."``.
        """
        warnings.warn("list_groups() is deprecated, use list_consumer_groups() and describe_consumer_groups() "
                      "instead.", DeprecationWarning, stacklevel=2)
        self._check_open("Handle has been closed")
        if group is not None and not isinstance(group, str):
            raise TypeError(f"group must be a str or None, not {type(group).__name__}")
        _timeout_ms(None if timeout == -1 else timeout)
        listed = _call(self._broker, _ListGroups(states_filter=[], types_filter=[]), "list_groups()")
        if listed.error_code != Errors.NO_ERROR:
            raise KafkaException(KafkaError(listed.error_code, f"Failed to list groups: "
                                            f"{KafkaError(listed.error_code).str()}"))
        ids = [g.group_id for g in listed.groups if group is None or g.group_id == group]
        if not ids:
            return []
        answer = _call(self._broker, _DescribeGroups(groups=ids, include_authorized_operations=False), "list_groups()")
        node = self._coordinator_node()
        out = []
        for g in answer.groups:
            meta = GroupMetadata()
            meta.broker = BrokerMetadata(node.id, node.host, node.port)
            meta.id, meta.error = g.group_id, _error(g.error_code, g.error_message)
            meta.state, meta.protocol_type, meta.protocol = g.group_state, g.protocol_type, g.protocol_data
            for m in g.members:
                member = GroupMember()
                member.id, member.client_id, member.client_host = m.member_id, m.client_id, m.client_host
                member.metadata, member.assignment = bytes(m.member_metadata), bytes(m.member_assignment)
                meta.members.append(member)
            out.append(meta)
        return out

    def cluster_id(self, timeout: float = -1) -> str:
        """The cluster id (confluent-kafka's ``cluster_id``, from Metadata as librdkafka's
        ``rd_kafka_clusterid``): the storage root's, 22 url-safe base64 characters, the one
        ``txlake serve`` on the same root reports and ``describe_cluster()`` gives.

        Raises:
            RuntimeError: ``"Handle has been closed"`` after :meth:`close`.
        """
        self._check_open("Handle has been closed")
        _timeout_ms(None if timeout == -1 else timeout)
        return cluster_id_of(self._broker)

    def delete_consumer_groups(self, group_ids: list[str], request_timeout: float | None = None) -> dict[str, Future]:
        """DeleteGroups (confluent-kafka's ``AdminClient.delete_consumer_groups``): an Empty group is
        removed with its committed offsets.

        Returns:
            One future per group id; its result is None, or it raises KafkaException
            NON_EMPTY_GROUP (it has members), GROUP_ID_NOT_FOUND, INVALID_GROUP_ID, or the write's
            error (NOT_COORDINATOR when another process holds the writer lease).

        Raises:
            TypeError: ``group_ids`` is not a list of str. ValueError: it is empty.
        """
        self._check_open()
        _timeout_ms(request_timeout)
        if not isinstance(group_ids, list):
            raise TypeError("Expected input to be list of group ids to be deleted")
        if not group_ids:
            raise ValueError("Expected at least one group to be deleted")
        if not all(isinstance(g, str) for g in group_ids):
            raise ValueError(f"Expected list of {str!r}")
        answer = _call(self._broker, _DeleteGroups(groups_names=list(dict.fromkeys(group_ids))),
                       "delete_consumer_groups()")
        by_id = {r.group_id: r.error_code for r in answer.results}
        return {g: _answer(None if by_id[g] == Errors.NO_ERROR else KafkaError(by_id[g])) for g in group_ids}

    def list_consumer_group_offsets(self, list_consumer_group_offsets_request: list[ConsumerGroupTopicPartitions],
                                    request_timeout: float | None = None, require_stable: bool = False) -> dict[str, Future]:
        """OffsetFetch (confluent-kafka's ``AdminClient.list_consumer_group_offsets``) of one group.

        Args:
            list_consumer_group_offsets_request: one :class:`ConsumerGroupTopicPartitions`; its
                ``topic_partitions`` None asks for every partition the group has an offset for.
            require_stable: KIP-447: a partition with a pending transactional commit answers
                UNSTABLE_OFFSET_COMMIT (its ``error``) instead of the last committed offset.

        Returns:
            ``{group_id: future}``; the result is a :class:`ConsumerGroupTopicPartitions` whose
            TopicPartitions carry the committed offset (OFFSET_INVALID -1001 when none), the
            metadata (None when empty), the leader epoch (None when none) and a per-partition
            ``error``; the future raises KafkaException for a group-level error (INVALID_GROUP_ID,
            NOT_COORDINATOR, ...).

        Raises:
            TypeError / ValueError: as confluent-kafka checks the request (one group, a non-empty
                group id, partitions without offsets).
        """
        self._check_open()
        _timeout_ms(request_timeout)
        _check_group_request(list_consumer_group_offsets_request, "listing", offsets_allowed=False)
        (req,) = list_consumer_group_offsets_request
        G = _OffsetFetch.OffsetFetchRequestGroup
        topics = None if req.topic_partitions is None else [
            G.OffsetFetchRequestTopics(name=name, partition_indexes=[tp.partition for tp in tps])
            for name, tps in _by_topic(req.topic_partitions).items()]
        answer = _call(self._broker, _OffsetFetch(groups=[G(group_id=req.group_id, topics=topics)],
                                                  require_stable=bool(require_stable)),
                       "list_consumer_group_offsets()")
        (group,) = answer.groups
        if group.error_code != Errors.NO_ERROR:
            return {req.group_id: _answer(KafkaError(group.error_code))}
        partitions = []
        for t in group.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition_index,
                                    p.committed_offset if p.committed_offset >= 0 else OFFSET_INVALID,
                                    p.metadata or None,
                                    p.committed_leader_epoch if p.committed_leader_epoch >= 0 else None)
                tp.error = None if p.error_code == Errors.NO_ERROR else KafkaError(p.error_code)
                partitions.append(tp)
        return {req.group_id: _done(ConsumerGroupTopicPartitions(req.group_id, partitions))}

    def alter_consumer_group_offsets(self, alter_consumer_group_offsets_request: list[ConsumerGroupTopicPartitions],
                                     request_timeout: float | None = None) -> dict[str, Future]:
        """OffsetCommit as an admin (generation -1, no member: Kafka's commit for a group without
        members; confluent-kafka's ``AdminClient.alter_consumer_group_offsets``) of one group: each
        partition's offset, metadata and leader epoch. A consumer of the group that starts (or
        rejoins) afterwards resumes at these offsets.

        Returns:
            ``{group_id: future}``; the result is a :class:`ConsumerGroupTopicPartitions` with each
            partition's ``error`` (None, or UNKNOWN_TOPIC_OR_PART for a partition the catalog
            does not have, ...). A group with members answers UNKNOWN_MEMBER_ID (Kafka's
            answer to a commit from outside a live group).

        Raises:
            TypeError / ValueError: as confluent-kafka checks the request (one group, a non-empty
                group id, partitions with non-negative offsets).
        """
        self._check_open()
        _timeout_ms(request_timeout)
        _check_group_request(alter_consumer_group_offsets_request, "altering", offsets_allowed=True)
        (req,) = alter_consumer_group_offsets_request
        T = _OffsetCommit.OffsetCommitRequestTopic
        topics = [T(name=name, partitions=[T.OffsetCommitRequestPartition(
            partition_index=tp.partition, committed_offset=tp.offset,
            committed_leader_epoch=-1 if tp.leader_epoch is None else tp.leader_epoch,
            committed_metadata=tp.metadata) for tp in tps]) for name, tps in _by_topic(req.topic_partitions).items()]
        answer = _call(self._broker, _OffsetCommit(group_id=req.group_id, generation_id_or_member_epoch=-1,
                                                   member_id="", group_instance_id=None, topics=topics),
                       "alter_consumer_group_offsets()")
        errors = {(t.name, p.partition_index): p.error_code for t in answer.topics for p in t.partitions}
        partitions = []
        for given in req.topic_partitions:
            tp = TopicPartition(given.topic, given.partition, given.offset, given.metadata, given.leader_epoch)
            code = errors[(given.topic, given.partition)]
            tp.error = None if code == Errors.NO_ERROR else KafkaError(code)
            partitions.append(tp)
        return {req.group_id: _done(ConsumerGroupTopicPartitions(req.group_id, partitions))}

    # ------------------------------------------------------------------ offsets and topics
    def list_offsets(self, topic_partition_offsets: dict[TopicPartition, OffsetSpec], request_timeout: float | None = None,
                     isolation_level: IsolationLevel = IsolationLevel.READ_UNCOMMITTED) -> dict[TopicPartition, Future]:
        """ListOffsets (KIP-734 max timestamp; confluent-kafka's ``AdminClient.list_offsets``).

        Args:
            topic_partition_offsets: ``{TopicPartition: OffsetSpec}``: earliest (the log start
                offset), latest (the high watermark; under READ_COMMITTED the last stable offset,
                which an open transaction holds back), max_timestamp, for_timestamp(ms).
            isolation_level: an :class:`IsolationLevel` (default READ_UNCOMMITTED, as confluent-kafka).

        Returns:
            One future per TopicPartition (keyed by ``TopicPartition(topic, partition, spec value)``,
            as confluent-kafka keys them); its result is a :class:`ListOffsetsResultInfo`, or it
            raises KafkaException as librdkafka's does: UNKNOWN_TOPIC_OR_PART for a topic the
            catalog does not have, _UNKNOWN_PARTITION for a partition past its topic's count,
            and, when no partition asked for exists, _NOENT "Failed to query partition
            leaders: No leaders found" for every one.

        Raises:
            TypeError / ValueError: as confluent-kafka checks the argument.
        """
        self._check_open()
        if not isinstance(topic_partition_offsets, dict):
            raise TypeError("Expected topic_partition_offsets to be dict of [TopicPartitions,OffsetSpec] for list "
                            "offsets request")
        for tp, spec in topic_partition_offsets.items():
            if not isinstance(tp, TopicPartition):
                raise TypeError("partition must be a TopicPartition")
            if not tp.topic:
                raise ValueError("partition topic name cannot be empty")
            if tp.partition < 0:
                raise ValueError("partition index must be non-negative")
            if not isinstance(spec, OffsetSpec):
                raise TypeError("Value must be a OffsetSpec")
        if not isinstance(isolation_level, IsolationLevel):
            raise TypeError("isolation_level argument should be an IsolationLevel")
        _timeout_ms(request_timeout)
        keys = [TopicPartition(tp.topic, tp.partition, int(spec._value)) for tp, spec in topic_partition_offsets.items()]
        # librdkafka first looks the partitions' leaders up in Metadata: a topic that does not
        # exist fails its partitions with UNKNOWN_TOPIC_OR_PART, a partition past the topic's
        # count with _UNKNOWN_PARTITION, and with no leader for any partition the whole request
        # fails with _NOENT (rd_kafka_ListOffsets_leaders_queried_cb)
        meta = _call(self._broker, _Metadata(topics=[_Metadata.MetadataRequestTopic(name=n) for n in _by_topic(keys)],
                                             allow_auto_topic_creation=False), "list_offsets()")
        counts = {t.name: len(t.partitions) for t in meta.topics if t.error_code == Errors.NO_ERROR}
        unplaced = {(tp.topic, tp.partition): KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART) if tp.topic not in counts
                    else KafkaError(KafkaError._UNKNOWN_PARTITION) for tp in keys
                    if tp.topic not in counts or tp.partition >= counts[tp.topic]}
        asked = [tp for tp in keys if (tp.topic, tp.partition) not in unplaced]
        if not asked:
            error = KafkaError(KafkaError._NOENT, "Failed to query partition leaders: No leaders found")
            return {key: _answer(error) for key in keys}
        T = _ListOffsets.ListOffsetsTopic
        request = _ListOffsets(replica_id=-1, isolation_level=isolation_level.value, topics=[
            T(name=name, partitions=[T.ListOffsetsPartition(partition_index=tp.partition, current_leader_epoch=-1,
                                                            timestamp=tp.offset) for tp in tps])
            for name, tps in _by_topic(asked).items()])
        answer = _call(self._broker, request, "list_offsets()")
        results = {(t.name, p.partition_index): p for t in answer.topics for p in t.partitions}
        out: dict[TopicPartition, Future] = {}
        for key in keys:
            if (key.topic, key.partition) in unplaced:
                out[key] = _answer(unplaced[(key.topic, key.partition)])
                continue
            p = results[(key.topic, key.partition)]
            out[key] = _answer(None if p.error_code == Errors.NO_ERROR else KafkaError(p.error_code),
                               ListOffsetsResultInfo(p.offset, p.timestamp, p.leader_epoch))
        return out

    def describe_topics(self, topics: TopicCollection, request_timeout: float | None = None,
                        include_authorized_operations: bool = False) -> dict[str, Future]:
        """Metadata of the named topics as confluent-kafka's ``AdminClient.describe_topics`` gives it.

        Returns:
            One future per name; its result is a :class:`TopicDescription` (the topic id as a
            :class:`Uuid`, ``is_internal``, one :class:`TopicPartitionInfo` per partition whose leader,
            replicas and ISR are the one :class:`Node`; ``authorized_operations`` None: no
            authorizer), or it raises KafkaException UNKNOWN_TOPIC_OR_PART.

        Raises:
            TypeError: not a TopicCollection of a list of names.
        """
        self._check_open()
        if not isinstance(include_authorized_operations, bool):
            raise TypeError("Expected include_authorized_operations to be bool type, "
                            f"not {type(include_authorized_operations).__name__}")
        _timeout_ms(request_timeout)
        if not isinstance(topics, TopicCollection):
            raise TypeError("Expected input to be instance of TopicCollection")
        names = topics.topic_names
        if not isinstance(names, list):
            raise TypeError("Expected list of topic names to be described")
        if not all(isinstance(n, str) for n in names):
            raise TypeError("Expected list of topic names to be described")
        if not names:
            return {}
        request = _Metadata(topics=[_Metadata.MetadataRequestTopic(name=n) for n in dict.fromkeys(names)],
                            allow_auto_topic_creation=False, include_topic_authorized_operations=False)
        answer = _call(self._broker, request, "describe_topics()")
        nodes = {b.node_id: Node(b.node_id, b.host, b.port, b.rack) for b in answer.brokers}
        out: dict[str, Future] = {}
        for t in answer.topics:
            if t.error_code != Errors.NO_ERROR:
                out[t.name] = _answer(KafkaError(t.error_code))
                continue
            partitions = [TopicPartitionInfo(p.partition_index, nodes.get(p.leader_id),
                                             [nodes[n] for n in p.replica_nodes if n in nodes],
                                             [nodes[n] for n in p.isr_nodes if n in nodes])
                          for p in sorted(t.partitions, key=lambda p: p.partition_index)]
            out[t.name] = _done(TopicDescription(t.name, Uuid._from_uuid(t.topic_id), bool(t.is_internal), partitions))
        return out

    def alter_configs(self, resources: list[ConfigResource], request_timeout: float | None = None,
                      validate_only: bool = False) -> dict[ConfigResource, Future]:
        """AlterConfigs, the deprecated whole replacement (confluent-kafka's ``AdminClient.alter_configs``;
        warns DeprecationWarning as it does): each TOPIC resource's overrides become exactly its
        ``set_config`` -- every config it does not name goes back to its default -- as Kafka 4.3
        answers it. Nothing changes with ``validate_only``. Prefer :meth:`incremental_alter_configs`.

        Returns:
            One future per resource; its result is None, or it raises KafkaException INVALID_CONFIG
            (Kafka's message, e.g. "Unknown topic config name: x"), UNKNOWN_TOPIC_OR_PART
            ("The topic 'T' does not exist."), INVALID_REQUEST (a BROKER resource with configs:
            none can change while the engine runs).

        Raises:
            ValueError: not a list of ConfigResource (as confluent-kafka).
        """
        self._check_open()
        _timeout_ms(request_timeout)
        warnings.warn("alter_configs has been deprecated. Use incremental_alter_configs instead.",
                      category=DeprecationWarning, stacklevel=2)
        if not isinstance(resources, list) or not all(isinstance(r, ConfigResource) for r in resources):
            raise ValueError(f"Expected list of {ConfigResource!r}")
        _non_empty(resources, "ConfigResource objects")
        R = _AlterConfigs.AlterConfigsResource
        wire = [R(resource_type=kafka_resource_type(r.restype), resource_name=r.name, configs=[
            R.AlterableConfig(name=k, value=None if v is None else str(v)) for k, v in r.set_config_dict.items()])
            for r in resources]
        answer = _call(self._broker, _AlterConfigs(resources=wire, validate_only=bool(validate_only)), "alter_configs()")
        return {r: _answer(_error(result.error_code, result.error_message))
                for r, result in zip(resources, answer.responses)}

    def elect_leaders(self, election_type: ElectionType, partitions: list[TopicPartition] | None = None,
                      request_timeout: float | None = None, operation_timeout: float | None = None) -> Future:
        """ElectLeaders (KIP-460; confluent-kafka's ``AdminClient.elect_leaders``): every partition has
        one replica, the one node, which leads it, so no election is ever needed.

        Returns:
            A future of ``dict[TopicPartition, KafkaError | None]``: ELECTION_NOT_NEEDED (84) for
            each partition named, UNKNOWN_TOPIC_OR_PART ("No such topic as T" / "No such partition
            as T-P") for one that does not exist; ``{}`` for ``partitions`` None (every partition:
            Kafka lists only the partitions that needed an election).

        Raises:
            TypeError: ``election_type`` not an ElectionType, ``partitions`` not a list of
                TopicPartition. ValueError: a negative partition.
        """
        self._check_open()
        _timeout_ms(request_timeout)
        if not isinstance(election_type, ElectionType):
            raise TypeError("Expected 'election_type' to be of type 'ElectionType'")
        if partitions is not None:
            _partition_list(partitions, "Expected 'partitions' to be a list, got '{}'",
                            "Element of the 'partitions' list must be of type 'TopicPartition' got '{}' ",
                            "Elements of the 'partitions' list must not have negative value for 'partition' field")
        T = _ElectLeaders.TopicPartitions
        wanted = None if partitions is None else [T(topic=name, partitions=[tp.partition for tp in tps])
                                                  for name, tps in _by_topic(partitions).items()]
        answer = _call(self._broker, _ElectLeaders(election_type=election_type.value, topic_partitions=wanted,
                                                   timeout_ms=_timeout_ms(operation_timeout)), "elect_leaders()")
        if answer.error_code != Errors.NO_ERROR:
            return _answer(KafkaError(answer.error_code))
        return _done({TopicPartition(r.topic, p.partition_id): None if p.error_code == Errors.NO_ERROR
                      else KafkaError(p.error_code, p.error_message or None)
                      for r in answer.replica_election_results for p in r.partition_result})

    # ------------------------------------------------------------------ ACLs and SCRAM (no authorizer, no SASL)
    def create_acls(self, acls: list[AclBinding], request_timeout: float | None = None) -> dict[AclBinding, Future]:
        """CreateAcls (confluent-kafka's ``AdminClient.create_acls``). There is no authorizer: every
        future raises KafkaException SECURITY_DISABLED (54) "No Authorizer is configured.", as
        Kafka without ``authorizer.class.name`` answers.

        Raises:
            ValueError: duplicate bindings, or not a list of AclBinding (as confluent-kafka).
        """
        self._check_open()
        _timeout_ms(request_timeout)
        _check_unique(acls, AclBinding, "ACL bindings")
        C = _CreateAcls.AclCreation
        answer = _call(self._broker, _CreateAcls(creations=[C(
            resource_type=a.restype_int, resource_name=a.name, resource_pattern_type=a.resource_pattern_type_int,
            principal=a.principal, host=a.host, operation=a.operation_int, permission_type=a.permission_type_int)
            for a in acls]), "create_acls()")
        return {a: _answer(_error(r.error_code, r.error_message)) for a, r in zip(acls, answer.results)}

    def describe_acls(self, acl_binding_filter: AclBindingFilter, request_timeout: float | None = None) -> Future:
        """DescribeAcls (confluent-kafka's ``AdminClient.describe_acls``): a future of ``[]``. There
        is no authorizer: the response says SECURITY_DISABLED "No Authorizer is configured on the
        broker", which confluent-kafka reports as an empty list of bindings (checked against Apache
        Kafka 4.3); so does this call.

        Raises:
            TypeError: not an AclBindingFilter.
        """
        self._check_open()
        _timeout_ms(request_timeout)
        if not isinstance(acl_binding_filter, AclBindingFilter):
            raise TypeError("Expected an AclBindingFilter object")
        f = acl_binding_filter
        answer = _call(self._broker, _DescribeAcls(
            resource_type_filter=f.restype_int, resource_name_filter=f.name, pattern_type_filter=f.resource_pattern_type_int,
            principal_filter=f.principal, host_filter=f.host, operation=f.operation_int,
            permission_type=f.permission_type_int), "describe_acls()")
        if answer.error_code not in (Errors.NO_ERROR, Errors.SECURITY_DISABLED):
            return _answer(_error(answer.error_code, answer.error_message))
        return _done([AclBinding(r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation,
                                 a.permission_type) for r in answer.resources for a in r.acls])

    def delete_acls(self, acl_binding_filters: list[AclBindingFilter],
                    request_timeout: float | None = None) -> dict[AclBindingFilter, Future]:
        """DeleteAcls (confluent-kafka's ``AdminClient.delete_acls``). There is no authorizer: every
        future raises KafkaException SECURITY_DISABLED (54) "No Authorizer is configured.".

        Raises:
            ValueError: duplicate filters, or not a list of AclBindingFilter (as confluent-kafka).
        """
        self._check_open()
        _timeout_ms(request_timeout)
        _check_unique(acl_binding_filters, AclBindingFilter, "ACL binding filters")
        F = _DeleteAcls.DeleteAclsFilter
        answer = _call(self._broker, _DeleteAcls(filters=[F(
            resource_type_filter=f.restype_int, resource_name_filter=f.name,
            pattern_type_filter=f.resource_pattern_type_int, principal_filter=f.principal, host_filter=f.host,
            operation=f.operation_int, permission_type=f.permission_type_int) for f in acl_binding_filters]),
            "delete_acls()")
        return {f: _answer(_error(r.error_code, r.error_message),
                           [AclBinding(m.resource_type, m.resource_name, m.pattern_type, m.principal, m.host,
                                       m.operation, m.permission_type) for m in r.matching_acls])
                for f, r in zip(acl_binding_filters, answer.filter_results)}

    def describe_user_scram_credentials(self, users: list[str] | None = None,
                                        request_timeout: float | None = None) -> Future | dict[str, Future]:
        """DescribeUserScramCredentials (confluent-kafka's ``AdminClient.describe_user_scram_credentials``).
        There are no SCRAM credentials (no SASL): for ``users`` None a future of ``{}``; else one
        future per user raising KafkaException RESOURCE_NOT_FOUND (91) "Attempt to describe a user
        credential that does not exist: U" (DUPLICATE_RESOURCE for a user named twice), as Kafka
        with no credentials answers.

        Raises:
            TypeError / ValueError: as confluent-kafka checks ``users``.
        """
        self._check_open()
        _timeout_ms(request_timeout)
        if users is not None:
            if not isinstance(users, list):
                raise TypeError("Expected input to be list of String")
            for user in users:
                if user is None:
                    raise TypeError("'user' cannot be None")
                if not isinstance(user, str):
                    raise TypeError("Each value should be a string")
                if not user:
                    raise ValueError("'user' cannot be empty")
        U = _DescribeUserScramCredentials.UserName
        answer = _call(self._broker, _DescribeUserScramCredentials(
            users=None if users is None else [U(name=u) for u in users]), "describe_user_scram_credentials()")
        if answer.error_code != Errors.NO_ERROR:
            failed = _answer(_error(answer.error_code, answer.error_message))
            return failed if users is None else {u: failed for u in users}
        results = {r.user: _answer(_error(r.error_code, r.error_message), UserScramCredentialsDescription(
            r.user, [ScramCredentialInfo(ScramMechanism(c.mechanism), c.iterations) for c in r.credential_infos]))
            for r in answer.results}
        if users is None:
            return _done({user: fut.result() for user, fut in results.items()})
        return {u: results[u] for u in users}

    def alter_user_scram_credentials(self, alterations: list[UserScramCredentialAlteration],
                                     request_timeout: float | None = None) -> dict[str, Future]:
        """AlterUserScramCredentials (confluent-kafka's ``AdminClient.alter_user_scram_credentials``).
        There is no SASL, so no credential is ever stored: one future per user raising
        KafkaException -- a deletion RESOURCE_NOT_FOUND (91) "Attempt to delete a user credential
        that does not exist" (as Kafka with no credentials); an upsertion UNSUPPORTED_SASL_MECHANISM
        (33), after Kafka's own checks (UNACCEPTABLE_CREDENTIAL "Too few iterations" below 4096,
        DUPLICATE_RESOURCE for a user and mechanism altered twice). See docs/server.md.

        Raises:
            TypeError / ValueError: as confluent-kafka checks the alterations.
        """
        self._check_open()
        _timeout_ms(request_timeout)
        _check_scram_alterations(alterations)
        A = _AlterUserScramCredentials
        upserts = [a for a in alterations if isinstance(a, UserScramCredentialUpsertion)]
        deletes = [a for a in alterations if isinstance(a, UserScramCredentialDeletion)]
        answer = _call(self._broker, A(
            deletions=[A.ScramCredentialDeletion(name=d.user, mechanism=d.mechanism.value) for d in deletes],
            upsertions=[A.ScramCredentialUpsertion(
                name=u.user, mechanism=u.scram_credential_info.mechanism.value,
                iterations=u.scram_credential_info.iterations, salt=u.salt or b"", salted_password=u.password)
                for u in upserts]), "alter_user_scram_credentials()")
        first_error: dict[str, KafkaError | None] = {}
        for r in answer.results:
            error = _error(r.error_code, r.error_message)
            if first_error.get(r.user) is None:
                first_error[r.user] = error
        return {user: _answer(first_error.get(user)) for user in dict.fromkeys(a.user for a in alterations)}

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """confluent-kafka's ``set_sasl_credentials``: accepted with no effect (there is no SASL
        against object storage; docs/confluent-kafka.md).

        Raises:
            TypeError: ``username`` or ``password`` is not a str.
        """
        self._check_open()
        check_sasl_credentials(username, password)

    def poll(self, timeout: float | None = None) -> int:
        """confluent-kafka's ``AdminClient.poll``: serves callbacks; the in-process AdminClient has
        none (every future completes before its call returns), so it returns 0 at once."""
        self._check_open()
        return 0

    # ------------------------------------------------------------------ transactions (KIP-664)
    def _transactions(self) -> TransactionAdmin:
        return TransactionAdmin(self._broker)

    def list_transactions(self, states: list[str] | None = None, producer_ids: list[int] | None = None,
                          duration_filter: int | None = None, request_timeout: float | None = None,
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
        self._check_open()
        _timeout_ms(request_timeout)
        states = _list_arg(states, "states", str)
        producer_ids = _list_arg(producer_ids, "producer_ids", int)
        unknown = [s for s in states if TransactionState.from_name(s) is None]
        if unknown:
            names = ", ".join(t.state_name for t in TransactionState)
            raise KafkaException(KafkaError(Errors._INVALID_ARG, f"Unknown transaction state(s) {unknown}: expected {names}"))
        if transactional_id_pattern is not None and not isinstance(transactional_id_pattern, str):
            raise TypeError(f"transactional_id_pattern must be a str, got {type(transactional_id_pattern).__name__}")
        request = ListTransactionsRequest[2](
            state_filters=states, producer_id_filters=producer_ids,
            duration_filter=-1 if duration_filter is None else int(duration_filter),
            transactional_id_pattern=transactional_id_pattern or None)
        answer = _call(self._broker, request, "list_transactions()")
        if answer.error_code == Errors.INVALID_REGULAR_EXPRESSION:
            return _failed(KafkaException(KafkaError(answer.error_code, f"Failed to list transactions: transactional id "
                                                                       f"pattern {transactional_id_pattern!r} is not a "
                                                                       "valid regular expression")))
        if answer.error_code != Errors.NO_ERROR:
            return _failed(KafkaException(KafkaError(answer.error_code, "Failed to list transactions: "
                                                                       f"{Errors(answer.error_code).name}")))
        fut: Future = Future()
        fut.set_result(sorted((TransactionListing(t.transactional_id, t.producer_id, t.transaction_state)
                               for t in answer.transaction_states), key=lambda t: t.transactional_id))
        return fut

    def describe_transactions(self, transactional_ids: list[str], request_timeout: float | None = None) -> dict[str, Future]:
        """DescribeTransactions (KIP-664; Java ``Admin.describeTransactions``).

        Returns:
            One future per transactional id; its result is a :class:`TransactionDescription`,
            or it raises KafkaException TRANSACTIONAL_ID_NOT_FOUND (105) for an id the
            coordinator does not know (never used, or expired after
            ``transactional.id.expiration.ms``), INVALID_REQUEST for an empty id.

        Raises:
            TypeError: not a list of strings.
        """
        self._check_open()
        _timeout_ms(request_timeout)
        ids = list(dict.fromkeys(_list_arg(transactional_ids, "transactional_ids", str)))
        out: dict[str, Future] = {}
        answer = _call(self._broker, DescribeTransactionsRequest[0](transactional_ids=ids), "describe_transactions()")
        for d in answer.transaction_states:
            error = _error(d.error_code, where=f"transactional id {d.transactional_id!r}")
            if error is not None:
                out[d.transactional_id] = _failed(KafkaException(error))
                continue
            fut: Future = Future()
            fut.set_result(TransactionDescription(
                d.transactional_id, COORDINATOR_ID, d.transaction_state, d.producer_id, d.producer_epoch,
                d.transaction_timeout_ms, d.transaction_start_time_ms if d.transaction_start_time_ms >= 0 else None,
                [TopicPartition(t.topic, p) for t in d.topics for p in t.partitions]))
            out[d.transactional_id] = fut
        return out

    def describe_producers(self, partitions: list[TopicPartition], request_timeout: float | None = None) -> dict[TopicPartition, Future]:
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
        self._check_open()
        _timeout_ms(request_timeout)
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
                          coordinator_epoch: int, request_timeout: float | None = None) -> Future:
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
        self._check_open()
        _timeout_ms(request_timeout)
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
        self._check_open()
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

    def _check_open(self, message: str = "AdminClient has been closed") -> None:
        """Every call after :meth:`close` (or the ``with`` block's end) raises RuntimeError with
        confluent-kafka's message (``list_topics``: ``"Handle has been closed"``)."""
        if self._closed:
            raise RuntimeError(message)

    def close(self) -> None:
        """Release the storage root. Idempotent; afterwards every call raises RuntimeError."""
        if not self._closed:
            self._closed = True
            release_broker(self._broker)

    def __len__(self) -> int:
        """0: the in-process AdminClient has no requests outstanding (every future completes
        before its call returns); confluent-kafka's counts its queued events."""
        return 0

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _failed(exc: KafkaException) -> Future:
    fut: Future = Future()
    fut.set_exception(exc)
    return fut


def _partition_list(value: Any, not_a_list: str, not_a_partition: str, negative: str) -> list[TopicPartition]:
    """A request's list of TopicPartition, checked with confluent-kafka's texts (``{}`` is the
    offending type's name).

    Raises:
        TypeError: not a list, or an element not a TopicPartition. ValueError: a negative partition.
    """
    if not isinstance(value, list):
        raise TypeError(not_a_list.format(type(value).__name__))
    for tp in value:
        if not isinstance(tp, TopicPartition):
            raise TypeError(not_a_partition.format(type(tp).__name__))
        if tp.partition < 0:
            raise ValueError(negative)
    return list(value)


def _non_empty(items: list, what: str) -> None:
    """confluent-kafka refuses an empty request list: ValueError ``"Expected non-empty list of {what}"``."""
    if not items:
        raise ValueError(f"Expected non-empty list of {what}")


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


def _assigned(data: bytes) -> list[TopicPartition]:
    """The partitions of a consumer-protocol member assignment: Kafka's ``ConsumerProtocol``
    Assignment (what network clients send) or txlake's in-process consumer's JSON form
    (:func:`txlake.assignors.decode_assignment`, which starts with ``{``); [] when it is neither."""
    if not data:
        return []
    data = bytes(data)
    try:
        if data[:1] == b"{":
            return [TopicPartition(t, p) for t, p in decode_assignment(data).partitions]
        decoded = ConsumerProtocolAssignment.decode(data)
        return [TopicPartition(t.topic, p) for t in decoded.assigned_partitions for p in t.partitions]
    except (ConsumerProtocolError, ValueError, TypeError, EOFError, IndexError, KeyError):
        return []


def _check_group_request(request: Any, verb: str, offsets_allowed: bool) -> None:
    """confluent-kafka's checks of a list/alter_consumer_group_offsets request (one group).

    Raises:
        TypeError / ValueError: with confluent-kafka's messages.
    """
    if request is None:
        raise TypeError("request cannot be None")
    if not isinstance(request, list):
        raise TypeError("request must be a list")
    if len(request) != 1:
        raise ValueError(f"Currently we support {verb} offsets for a single consumer group only")
    (req,) = request
    if not isinstance(req, ConsumerGroupTopicPartitions):
        raise TypeError("Expected list of 'ConsumerGroupTopicPartitions'")
    if req.group_id is None:
        raise TypeError("'group_id' cannot be None")
    if not isinstance(req.group_id, str):
        raise TypeError("'group_id' must be a string")
    if not req.group_id:
        raise ValueError("'group_id' cannot be empty")
    if req.topic_partitions is None:
        if offsets_allowed:
            raise ValueError("'topic_partitions' cannot be null")
        return
    if not isinstance(req.topic_partitions, list):
        raise TypeError("'topic_partitions' must be a list" + ("" if offsets_allowed else " or None"))
    if not req.topic_partitions:
        raise ValueError("'topic_partitions' cannot be empty")
    for tp in req.topic_partitions:
        if tp is None:
            raise ValueError("Element of 'topic_partitions' cannot be None")
        if not isinstance(tp, TopicPartition):
            raise TypeError("Element of 'topic_partitions' must be of type TopicPartition")
        if not tp.topic:
            raise ValueError("Element of 'topic_partitions' must not have 'topic' attribute as Empty")
        if tp.partition < 0:
            raise ValueError("Element of 'topic_partitions' must not have negative 'partition' value")
        if offsets_allowed and tp.offset < 0:
            raise ValueError("Element of 'topic_partitions' must not have negative value for 'offset' field")
        if not offsets_allowed and tp.offset != OFFSET_INVALID:
            raise ValueError("Element of 'topic_partitions' must not have 'offset' value")


def _check_unique(items: Any, kind: type, what: str) -> None:
    """confluent-kafka's checks of create_acls/delete_acls' list.

    Raises:
        TypeError: None (confluent-kafka iterates it: "'NoneType' object is not iterable").
        ValueError: not a list of ``kind``, an empty list, or an item twice ("duplicate ACL
            bindings not allowed").
    """
    if items is None:
        raise TypeError("'NoneType' object is not iterable")
    if not isinstance(items, list) or not all(isinstance(i, kind) for i in items):
        raise ValueError(f"Expected list of {kind!r}")
    if not items:
        raise ValueError(f"Expected non-empty list of {kind.__name__} objects")
    if len(set(items)) != len(items):
        raise ValueError(f"duplicate {what} not allowed")


def _check_scram_alterations(alterations: Any) -> None:
    """confluent-kafka's checks of alter_user_scram_credentials' list.

    Raises:
        TypeError / ValueError: with confluent-kafka's messages.
    """
    if not isinstance(alterations, list):
        raise TypeError("Expected input to be list")
    if not alterations:
        raise ValueError("Expected at least one alteration")
    for a in alterations:
        if not isinstance(a, UserScramCredentialAlteration):
            raise TypeError("Expected each element of list to be subclass of UserScramCredentialAlteration")
        if a.user is None:
            raise TypeError("'user' cannot be None")
        if not isinstance(a.user, str):
            raise TypeError("'user' must be a string")
        if not a.user:
            raise ValueError("'user' cannot be empty")
        if isinstance(a, UserScramCredentialUpsertion):
            if a.password is None:
                raise TypeError("'password' cannot be None")
            if not isinstance(a.password, bytes):
                raise TypeError("'password' must be bytes")
            if not a.password:
                raise ValueError("'password' cannot be empty")
            if a.salt is not None and not a.salt:
                raise ValueError("'salt' can be None but cannot be empty")
            if a.salt and not isinstance(a.salt, bytes):
                raise TypeError("'salt' must be bytes")
            if not isinstance(a.scram_credential_info, ScramCredentialInfo):
                raise TypeError("Expected credential_info to be ScramCredentialInfo Type")
            if a.scram_credential_info.iterations < 1:
                raise ValueError("Iterations should be positive")
            if not isinstance(a.scram_credential_info.mechanism, ScramMechanism):
                raise TypeError("Expected the mechanism to be ScramMechanism Type")
        elif isinstance(a, UserScramCredentialDeletion):
            if not isinstance(a.mechanism, ScramMechanism):
                raise TypeError("Expected the mechanism to be ScramMechanism Type")
        else:
            raise TypeError("Expected each element of list 'alterations' to be either a UserScramCredentialUpsertion "
                            "or a UserScramCredentialDeletion")


def _producer_state(a: ActiveProducer) -> ProducerState:
    return ProducerState(a.producer_id, a.producer_epoch, a.last_sequence, a.last_timestamp, a.coordinator_epoch,
                         a.current_txn_start_offset)


def _marker_error(answer: Any) -> int:
    """The error code of the one partition of a one-marker WriteTxnMarkers response."""
    ((partition,),) = [t.partitions for m in answer.markers for t in m.topics]
    return partition.error_code
