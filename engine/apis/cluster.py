"""Cluster APIs: ApiVersions, Metadata, DescribeCluster, ElectLeaders (Kafka's
``KafkaApis.handleApiVersionsRequest``, ``handleTopicMetadataRequest``, ``handleDescribeCluster``,
the controller's ``ReplicationControlManager.electLeaders``).

txlake is one broker node over one storage root: Metadata names exactly that node (the
advertised listener) as the leader and only replica of every partition, with the writer
lease's epoch as every partition's leader epoch.
"""

from __future__ import annotations

import uuid
from typing import Any

from kafka.protocol.admin import DescribeClusterResponse, ElectLeadersResponse
from kafka.protocol.api_key import ApiKey
from kafka.protocol.metadata import ApiVersionsResponse, MetadataResponse

from txlake.catalog.topic_names import is_internal

from ..errors import Errors
from .api_spec import ApiNode, ApiSpec, RequestContext
from .txn_apis import TRANSACTION_VERSION_FEATURE, TRANSACTION_VERSION_LEVELS, finalized_transaction_version

#: the epoch of the finalized features (Kafka's metadata offset of the last feature change): the
#: level is fixed for the server's lifetime, so one epoch
FINALIZED_FEATURES_EPOCH = 1
#: Kafka's "authorized operations not requested" (``Integer.MIN_VALUE``)
AUTHORIZED_OPERATIONS_OMITTED = -2147483648
_ZERO_UUID = uuid.UUID(int=0)


def handle_api_versions(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """ApiVersions: the versions of every API implemented. A request version this broker does
    not know is answered at version 0 with UNSUPPORTED_VERSION and the same list, so the client
    can retry with one it finds there (KIP-511); the server encodes that answer at v0.

    v3+ also lists the features (KIP-584): ``transaction.version`` supported 0..2 and finalized
    at the broker config ``transaction.version`` (default 2; KIP-890 part 2)."""
    keys = [ApiVersionsResponse.ApiVersion(api_key=key, min_version=low, max_version=high)
            for key, (low, high) in apis.supported_versions().items()]
    spec = apis.specs[int(ApiKey.ApiVersions)]
    error = Errors.NO_ERROR if spec.min_version <= context.api_version <= spec.max_version else Errors.UNSUPPORTED_VERSION
    if context.api_version < 3 or error != Errors.NO_ERROR:
        return ApiVersionsResponse(error_code=int(error), api_keys=keys, throttle_time_ms=0)
    # the transaction.version feature (KIP-890; Kafka 4.x clients use transaction version 2 only
    # when it is finalized at 2); a level-0 feature is not listed as finalized, as in Kafka
    level = finalized_transaction_version(apis)
    low, high = TRANSACTION_VERSION_LEVELS
    R = ApiVersionsResponse
    return R(error_code=int(error), api_keys=keys, throttle_time_ms=0,
             supported_features=[R.SupportedFeatureKey(name=TRANSACTION_VERSION_FEATURE, min_version=low, max_version=high)],
             finalized_features_epoch=FINALIZED_FEATURES_EPOCH,
             finalized_features=[R.FinalizedFeatureKey(name=TRANSACTION_VERSION_FEATURE, max_version_level=level,
                                                       min_version_level=level)] if level else [])


def _topic_uuid(topic_id: str) -> uuid.UUID:
    return uuid.UUID(topic_id)


def handle_metadata(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """Metadata: the broker, the cluster id and the requested topics (all of them for a null
    list, or an empty one before v1). A topic that does not exist answers
    UNKNOWN_TOPIC_OR_PARTITION (topics are not created by Metadata: ``auto.create.topics.enable``
    is false here; docs/server.md); a topic asked for by id (v10+) that does not exist answers
    UNKNOWN_TOPIC_ID."""
    broker = apis.broker
    broker.refresh(min_interval_ms=apis.metadata_refresh_ms)
    topics_state = broker.topics()
    by_id = {t.topic_id: t for t in topics_state.values()}
    epoch = apis.leader_epoch
    wanted = request.topics
    if wanted is None or (context.api_version == 0 and not wanted):
        selected = [(t.name, None) for t in sorted(topics_state.values(), key=lambda t: t.name)]
    else:
        selected = []
        for entry in wanted:
            name = entry.name
            topic_id = getattr(entry, "topic_id", None)
            if name is None and topic_id is not None and topic_id != _ZERO_UUID:
                found = by_id.get(str(topic_id))
                selected.append((found.name if found else None, topic_id))
            else:
                selected.append((name, None))
    topics = []
    for name, asked_id in selected:
        topic = topics_state.get(name) if name is not None else None
        if topic is None:
            error = Errors.UNKNOWN_TOPIC_ID if asked_id is not None else Errors.UNKNOWN_TOPIC_OR_PART
            topics.append(MetadataResponse.MetadataResponseTopic(
                error_code=int(error), name=name, topic_id=asked_id or _ZERO_UUID, is_internal=False, partitions=[]))
            continue
        partitions = [MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
            error_code=0, partition_index=p.partition, leader_id=apis.node_id, leader_epoch=epoch,
            replica_nodes=[apis.node_id], isr_nodes=[apis.node_id], offline_replicas=[])
            for p in topic.partitions]
        topics.append(MetadataResponse.MetadataResponseTopic(
            error_code=0, name=topic.name, topic_id=_topic_uuid(topic.topic_id), is_internal=is_internal(topic.name),
            partitions=partitions))
    return MetadataResponse(
        throttle_time_ms=0,
        brokers=[MetadataResponse.MetadataResponseBroker(node_id=apis.node_id, host=apis.host, port=apis.port, rack=None)],
        cluster_id=apis.cluster_id, controller_id=apis.node_id, topics=topics)


def handle_describe_cluster(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DescribeCluster (KIP-700): this one broker, which is also the controller."""
    return DescribeClusterResponse(
        throttle_time_ms=0, error_code=0, error_message=None, cluster_id=apis.cluster_id,
        controller_id=apis.node_id,
        brokers=[DescribeClusterResponse.DescribeClusterBroker(broker_id=apis.node_id, host=apis.host,
                                                               port=apis.port, rack=None)])


def _describe_cluster_error(request: Any, version: int, error: Errors) -> Any:
    return DescribeClusterResponse(throttle_time_ms=0, error_code=int(error), error_message=None, brokers=[])


#: ElectLeaders' election types (Kafka's ``ElectionType``: PREFERRED 0, UNCLEAN 1)
ELECTION_TYPES = (0, 1)
ELECTION_NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."


def handle_elect_leaders(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """ElectLeaders (KIP-183, KIP-460): every partition has one replica, this node, which leads it,
    so no election is ever needed. A named partition answers ELECTION_NOT_NEEDED (84) "Leader
    election not needed for topic partition.", or UNKNOWN_TOPIC_OR_PARTITION "No such topic as T" /
    "No such partition as T-P"; a null partition list (every partition) answers each topic with no
    partition results, as Kafka leaves out the partitions that needed no election. An election
    type other than PREFERRED (0) or UNCLEAN (1) (v1+) answers INVALID_REQUEST."""
    version = context.api_version
    if version >= 1 and request.election_type not in ELECTION_TYPES:
        return _elect_leaders_error(request, version, Errors.INVALID_REQUEST)
    topics = apis.broker.topics()
    R = ElectLeadersResponse.ReplicaElectionResult
    if request.topic_partitions is None:
        results = [R(topic=name, partition_result=[]) for name in sorted(topics)]
    else:
        results = []
        for entry in request.topic_partitions:
            topic = topics.get(entry.topic)
            parts = []
            for p in entry.partitions:
                if topic is None:
                    error, message = Errors.UNKNOWN_TOPIC_OR_PART, f"No such topic as {entry.topic}"
                elif not 0 <= p < len(topic.partitions):
                    error, message = Errors.UNKNOWN_TOPIC_OR_PART, f"No such partition as {entry.topic}-{p}"
                else:
                    error, message = Errors.ELECTION_NOT_NEEDED, ELECTION_NOT_NEEDED_MESSAGE
                parts.append(R.PartitionResult(partition_id=p, error_code=int(error), error_message=message))
            results.append(R(topic=entry.topic, partition_result=parts))
    return ElectLeadersResponse(throttle_time_ms=0, error_code=0, replica_election_results=results)


def _elect_leaders_error(request: Any, version: int, error: Errors) -> Any:
    return ElectLeadersResponse(throttle_time_ms=0, error_code=int(error), replica_election_results=[])


APIS = [
    ApiSpec(ApiKey.ApiVersions, 0, 4, handle_api_versions, any_version=True),
    ApiSpec(ApiKey.Metadata, 0, 12, handle_metadata),
    ApiSpec(ApiKey.DescribeCluster, 0, 1, handle_describe_cluster, _describe_cluster_error),
    ApiSpec(ApiKey.ElectLeaders, 0, 2, handle_elect_leaders, _elect_leaders_error),
]
