"""Topic and admin APIs: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs, DeleteRecords, DescribeProducers.

Kafka answers the first five on its controller (``ControllerApis`` with
``ReplicationControlManager`` and ``ConfigurationControlManager``) after the broker's own
checks (``ConfigAdminManager.preprocess``, ``ConfigHelper.describeConfigs``), DeleteRecords
and DescribeProducers on the partition leader (``ReplicaManager``). txlake is one node that is
all of them: the handlers here do the request-level checks Kafka does (duplicates, replication
factors, manual assignments, null values, resource names) with Kafka's codes and messages, and
route the rest to the engine, which the in-process ``AdminClient`` calls too:
:meth:`Broker.create_topics` / ``delete_topics`` / ``create_partitions`` / ``alter_topic_configs``
/ ``delete_records``, :mod:`txlake.catalog.topic_config` (names, defaults, validation) and
:meth:`TransactionAdmin.handle_describe_producers`.

Where txlake is stricter than Kafka's broker (docs/operations.md): the internal topics
``__consumer_offsets`` and ``__transaction_state`` cannot be created, deleted or grown by a
client (their coordinators read a fixed layout), and no broker config can be changed while
the server runs (every broker config is read-only; IncrementalAlterConfigs of the BROKER
resource answers INVALID_REQUEST "Cannot update these configs dynamically: Set(...)", Kafka's
answer for a non-dynamic broker config).

Versions are Kafka 4's: CreateTopics 2-7, DeleteTopics 1-6, CreatePartitions 0-3,
DescribeConfigs 1-4, AlterConfigs 0-2, IncrementalAlterConfigs 0-1, DeleteRecords 0-2, DescribeProducers 0
(librdkafka 2.x asks CreateTopics 4, DeleteTopics 4, CreatePartitions 2, DescribeConfigs 1,
IncrementalAlterConfigs 1, DeleteRecords 2; kafka-python 3 and the Java client the newest).
"""

from __future__ import annotations

import functools
import uuid
from collections import Counter
from typing import Any, Callable

from kafka.protocol.admin import (AlterConfigsResponse, CreatePartitionsResponse, CreateTopicsResponse, DeleteRecordsResponse,
                                  DeleteTopicsResponse, DescribeConfigsResponse, DescribeProducersResponse,
                                  IncrementalAlterConfigsResponse)
from kafka.protocol.api_key import ApiKey

from txlake.catalog.errors import InvalidTopicError
from txlake.catalog.topic_config import OP_DELETE, OP_NAMES, OP_SET, TOPIC_CONFIGS, effective_config
from txlake.catalog.topic_names import is_internal, validate_topic_name

from ..errors import ApiError, Errors
from ..transaction_admin import TransactionAdmin
from .api_spec import ApiNode, ApiSpec, RequestContext

_ZERO_UUID = uuid.UUID(int=0)

# Kafka's default messages (``Errors.message()``) where its answer is ``new ApiError(error)``
UNKNOWN_TOPIC_OR_PARTITION_MESSAGE = "This server does not host this topic-partition."
UNKNOWN_TOPIC_ID_MESSAGE = "This server does not host this topic ID."

# ConfigResource.Type ids
RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_CLIENT_METRICS, RESOURCE_GROUP = 2, 4, 8, 16, 32
_RESOURCE_NAMES = {RESOURCE_TOPIC: "TOPIC", RESOURCE_BROKER: "BROKER", RESOURCE_BROKER_LOGGER: "BROKER_LOGGER",
                   RESOURCE_CLIENT_METRICS: "CLIENT_METRICS", RESOURCE_GROUP: "GROUP"}

# DescribeConfigsResponse.ConfigSource ids
SOURCE_TOPIC_CONFIG = 1
SOURCE_STATIC_BROKER_CONFIG = 4
SOURCE_DEFAULT_CONFIG = 5

# DescribeConfigsResponse.ConfigType ids, by the ConfigDef type names topic_config uses
CONFIG_TYPES = {"BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6, "LIST": 7, "CLASS": 8,
                "PASSWORD": 9}

#: each topic config's broker-level synonym (Kafka's ``ServerTopicConfigSynonyms.TOPIC_CONFIG_SYNONYMS``),
#: None where Kafka's broker config has no default (so Kafka lists no synonym for the topic config)
BROKER_SYNONYMS: dict[str, str | None] = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": None,  # log.flush.interval.ms
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "min.insync.replicas": "min.insync.replicas",
    "preallocate": "log.preallocate",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": None,  # log.retention.ms (log.retention.hours=168 is the one with a default)
    "segment.bytes": "log.segment.bytes",
    "segment.index.bytes": "log.index.size.max.bytes",
    "segment.jitter.ms": None,  # log.roll.jitter.ms
    "segment.ms": None,  # log.roll.ms (log.roll.hours=168)
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}

#: DescribeConfigs documentation (v3+ ``include_documentation``) of each topic config, after
#: Kafka's ``TopicConfig`` docs, with what txlake does with it
TOPIC_CONFIG_DOCS: dict[str, str] = {
    "cleanup.policy": "Comma-separated retention policies of old log segments: \"delete\" removes them by time or "
                      "size (retention.ms, retention.bytes), \"compact\" keeps the latest record of each key.",
    "compression.type": "Compression of the topic's records (Kafka's codecs, or \"producer\" to keep the "
                        "producer's); txlake stores Parquet with the storage codec either way.",
    "delete.retention.ms": "How long (ms) delete tombstones are kept on a compacted topic, so a consumer that "
                           "started at offset 0 sees them.",
    "file.delete.delay.ms": "How long (ms) to wait before deleting a file from storage once no segment names it.",
    "flush.messages": "Kafka's fsync interval in messages; txlake commits each flush to object storage and "
                      "ignores it.",
    "flush.ms": "Kafka's fsync interval in ms; txlake commits each flush to object storage and ignores it.",
    "max.compaction.lag.ms": "The longest time (ms) a record stays ineligible for compaction.",
    "max.message.bytes": "The largest record batch size (bytes) the topic accepts.",
    "message.timestamp.type": "Whether a record's timestamp is the producer's (CreateTime) or the broker's "
                              "append time (LogAppendTime).",
    "message.timestamp.before.max.ms": "The largest allowed amount (ms) a CreateTime timestamp may be before "
                                       "the broker's time.",
    "message.timestamp.after.max.ms": "The largest allowed amount (ms) a CreateTime timestamp may be after "
                                      "the broker's time.",
    "min.cleanable.dirty.ratio": "How dirty a compacted log must be (dirty bytes over total bytes) before the "
                                 "cleaner compacts it.",
    "min.compaction.lag.ms": "The shortest time (ms) a record stays uncompacted.",
    "min.insync.replicas": "Kafka's minimum in-sync replicas for acks=all; txlake's one copy is the object "
                           "store's, so any value >= 1 holds.",
    "preallocate": "Kafka's segment file preallocation; meaningless on object storage.",
    "retention.bytes": "The largest size (bytes) a partition may grow to before old segments are deleted "
                       "(cleanup.policy delete); -1 means no limit.",
    "retention.ms": "The longest time (ms) a record is kept before its segment is deleted (cleanup.policy "
                    "delete); -1 means no limit.",
    "segment.bytes": "The target size (bytes) of a log segment (merged segments on object storage).",
    "segment.index.bytes": "Kafka's offset index size; txlake's index is the catalog.",
    "segment.jitter.ms": "Random jitter (ms) subtracted from segment.ms.",
    "segment.ms": "After this long (ms) a segment is closed even if not full, so retention can delete it.",
    "unclean.leader.election.enable": "Kafka's unclean leader election; txlake has one leader, the lease holder.",
}


def _wire_error(exc: ApiError) -> tuple[Errors, str]:
    """An engine ApiError as a broker answers it: client-local codes (negative) never go on the wire;
    a writer that lost its lease is no longer the partitions' leader (NOT_LEADER_OR_FOLLOWER)."""
    if exc.error >= Errors.UNKNOWN_SERVER_ERROR:
        return exc.error, exc.message
    if exc.error == Errors._FENCED:
        return Errors.NOT_LEADER_OR_FOLLOWER, exc.message
    return Errors.UNKNOWN_SERVER_ERROR, exc.message


def _no_id(topic_id: Any) -> bool:
    return topic_id is None or topic_id == _ZERO_UUID


# ---------------------------------------------------------------------------- CreateTopics

def _topic_configs(names_values: dict[str, str], overrides: dict[str, str]) -> list:
    """CreateTopics v5+ configs of a new topic: every config, sorted by name (Kafka's order)."""
    return [CreateTopicsResponse.CreatableTopicResult.CreatableTopicConfigs(
        name=name, value=value, read_only=False, is_sensitive=False,
        config_source=SOURCE_TOPIC_CONFIG if name in overrides else SOURCE_DEFAULT_CONFIG)
        for name, value in sorted(names_values.items())]


def _check_layout(apis: ApiNode, topic: Any) -> tuple[Errors, str] | int:
    """Kafka's ``ReplicationControlManager.createTopic`` checks of the partition count, replication
    factor and manual assignments: the error, or the partition count (-1 = ``num.partitions``)."""
    if topic.assignments:
        if topic.replication_factor != -1:
            return Errors.INVALID_REQUEST, ("A manual partition assignment was specified, but replication "
                                            "factor was not set to -1.")
        if topic.num_partitions != -1:
            return Errors.INVALID_REQUEST, ("A manual partition assignment was specified, but numPartitions "
                                            "was not set to -1.")
        seen: set[int] = set()
        for assignment in topic.assignments:
            if assignment.partition_index in seen:
                return Errors.INVALID_REPLICA_ASSIGNMENT, ("Found multiple manual partition assignments for "
                                                           f"partition {assignment.partition_index}")
            problem = _check_replicas(apis, assignment.broker_ids)
            if problem is not None:
                return Errors.INVALID_REPLICA_ASSIGNMENT, problem
            seen.add(assignment.partition_index)
        if seen != set(range(len(seen))):
            return Errors.INVALID_REPLICA_ASSIGNMENT, "partitions should be a consecutive 0-based integer sequence"
        return len(seen)
    rf = topic.replication_factor
    if rf < -1 or rf == 0:
        return Errors.INVALID_REPLICATION_FACTOR, "Replication factor must be larger than 0, or -1 to use the default value."
    if topic.num_partitions < -1 or topic.num_partitions == 0:
        return Errors.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value."
    if rf > 1:  # Kafka's StripedReplicaPlacer with this one registered broker
        return Errors.INVALID_REPLICATION_FACTOR, (f"Unable to replicate the partition {rf} time(s): The target "
                                                   f"replication factor of {rf} cannot be reached because only 1 "
                                                   "broker(s) are registered or some brokers have all their "
                                                   "log directories cordoned.")
    return topic.num_partitions


def _check_replicas(apis: ApiNode, broker_ids: list[int]) -> str | None:
    """Kafka's ``validateManualPartitionAssignment`` with one registered broker and replication factor 1."""
    if not broker_ids:
        return "The manual partition assignment includes an empty replica list."
    previous = None
    for broker_id in sorted(broker_ids):
        if broker_id != apis.node_id:
            return f"The manual partition assignment includes broker {broker_id}, but no such broker is registered."
        if broker_id == previous:
            return f"The manual partition assignment includes the broker {previous} more than once."
        previous = broker_id
    return None


def handle_create_topics(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """CreateTopics (Kafka's ``ControllerApis.createTopics`` / ``ReplicationControlManager.createTopics``).

    Checks in Kafka's order: a name given twice (INVALID_REQUEST "Duplicate topic name.", one
    answer per name, after the others); the name (INVALID_TOPIC_EXCEPTION), an existing topic
    (TOPIC_ALREADY_EXISTS), internal topics (INVALID_REQUEST), the configs (INVALID_CONFIG; a null
    value: "Null value not supported for topic configs: ..."), then the replication factor (-1
    or 1; 0, < -1 or > 1: INVALID_REPLICATION_FACTOR), the partition count (-1 = the server's
    ``num.partitions``; 0 or < -1: INVALID_PARTITIONS) and manual assignments (every partition
    on this node: INVALID_REPLICA_ASSIGNMENT otherwise). The valid topics are created in one
    catalog commit (none with ``validate_only``). v5+ answers carry the new topic's partition
    count, replication factor 1 and every config with its source; v7 its topic id (the zero
    id for ``validate_only``, which creates none).
    """
    version = context.api_version
    broker = apis.broker
    counts = Counter(t.name for t in request.topics)
    unique = [t for t in request.topics if counts[t.name] == 1]
    answers: dict[str, tuple[Errors, str | None]] = {}
    # the name, existence, internal-topic and config checks of the engine, without creating anything
    checked = broker.create_topics([(t.name, -1, _config_map(t)) for t in unique if _null_configs(t) is None],
                                   validate_only=True)
    checked_iter = iter(checked)
    layouts: dict[str, int] = {}
    for t in unique:
        nulls = _null_configs(t)
        if nulls is None:
            error, message = next(checked_iter)
            if error != Errors.NO_ERROR:
                answers[t.name] = (error, message)
                continue
        else:
            try:
                validate_topic_name(t.name)
            except InvalidTopicError as exc:
                answers[t.name] = (Errors.INVALID_TOPIC_EXCEPTION, str(exc))
                continue
            answers[t.name] = (Errors.INVALID_CONFIG, f"Null value not supported for topic configs: {nulls}")
            continue
        layout = _check_layout(apis, t)
        if isinstance(layout, tuple):
            answers[t.name] = layout
            continue
        layouts[t.name] = layout
    creatable = [t for t in unique if t.name in layouts]
    if creatable:
        try:
            created = broker.create_topics([(t.name, layouts[t.name], _config_map(t)) for t in creatable],
                                           validate_only=request.validate_only)
        except ApiError as exc:  # this process cannot be the writer
            created = [_wire_error(exc)] * len(creatable)
        for t, (error, message) in zip(creatable, created):
            answers[t.name] = (error, message or None)
    topics_now = broker.topics()
    results = []
    for t in unique:
        error, message = answers[t.name]
        result = CreateTopicsResponse.CreatableTopicResult(name=t.name, error_code=int(error), error_message=message)
        if error == Errors.NO_ERROR:
            result.error_message = None
            overrides = _config_map(t)
            made = topics_now.get(t.name)
            if request.validate_only or made is None:
                n = layouts[t.name] if layouts[t.name] != -1 else broker.config.num_partitions
                config = effective_config({k: str(v) for k, v in overrides.items()})
                result.topic_id = _ZERO_UUID
            else:
                n, overrides, config = len(made.partitions), made.config, effective_config(made.config)
                result.topic_id = uuid.UUID(made.topic_id)
            if version >= 5:
                result.num_partitions = n
                result.replication_factor = 1
                result.configs = _topic_configs(config, overrides)
                result.topic_config_error_code = 0
        results.append(result)
    for name in (n for n, c in counts.items() if c > 1):
        results.append(CreateTopicsResponse.CreatableTopicResult(
            name=name, error_code=int(Errors.INVALID_REQUEST), error_message="Duplicate topic name."))
    return CreateTopicsResponse(throttle_time_ms=0, topics=results)


def _config_map(topic: Any) -> dict[str, str]:
    return {c.name: c.value for c in topic.configs}


def _null_configs(topic: Any) -> str | None:
    nulls = [c.name for c in topic.configs if c.value is None]
    return ",".join(nulls) if nulls else None


def _create_topics_error(request: Any, version: int, error: Errors) -> Any:
    return CreateTopicsResponse(throttle_time_ms=0, topics=[
        CreateTopicsResponse.CreatableTopicResult(name=t.name, error_code=int(error), error_message=None)
        for t in request.topics])


# ---------------------------------------------------------------------------- DeleteTopics

def handle_delete_topics(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DeleteTopics (Kafka's ``ControllerApis.deleteTopics``): by name (v0-5 ``topic_names``, v6
    ``topics[].name``) or by topic id (v6 ``topics[].topic_id``).

    Answers: NO_ERROR with the topic's name and id; UNKNOWN_TOPIC_OR_PARTITION for a name and
    UNKNOWN_TOPIC_ID for an id that does not exist (Kafka's default messages); INVALID_REQUEST
    "Duplicate topic name." / "Duplicate topic id." / "You may not specify both topic name and
    topic id." / "Neither topic name nor id were specified." / "The provided topic name maps to
    an ID that was already supplied."; INVALID_TOPIC_EXCEPTION for an internal topic (the
    engine's answer, docs/operations.md). The deletions are one catalog commit.
    """
    broker = apis.broker
    broker.refresh()
    topics = broker.topics()
    by_id = {uuid.UUID(t.topic_id): t.name for t in topics.values()}
    results: list[Any] = []

    def answer(name: str | None, topic_id: uuid.UUID, error: Errors, message: str | None) -> None:
        results.append(DeleteTopicsResponse.DeletableTopicResult(name=name, topic_id=topic_id, error_code=int(error),
                                                                 error_message=message))

    names: list[str] = []
    ids: list[uuid.UUID] = []
    if context.api_version < 6:
        names = list(request.topic_names)
    else:
        for t in request.topics:
            if t.name is None:
                if _no_id(t.topic_id):
                    answer(None, _ZERO_UUID, Errors.INVALID_REQUEST, "Neither topic name nor id were specified.")
                else:
                    ids.append(t.topic_id)
            elif _no_id(t.topic_id):
                names.append(t.name)
            else:
                answer(t.name, t.topic_id, Errors.INVALID_REQUEST, "You may not specify both topic name and topic id.")
    name_counts, id_counts = Counter(names), Counter(ids)
    for name in (n for n, c in name_counts.items() if c > 1):
        answer(name, _ZERO_UUID, Errors.INVALID_REQUEST, "Duplicate topic name.")
    duplicate_ids = {i for i, c in id_counts.items() if c > 1}
    for topic_id in duplicate_ids:
        answer(None, topic_id, Errors.INVALID_REQUEST, "Duplicate topic id.")
    to_delete: dict[uuid.UUID, str] = {}
    for topic_id in (i for i, c in id_counts.items() if c == 1):
        if topic_id in by_id:
            to_delete[topic_id] = by_id[topic_id]
        else:
            answer(None, topic_id, Errors.UNKNOWN_TOPIC_ID, UNKNOWN_TOPIC_ID_MESSAGE)
    refused: list[str] = []  # internal topics: the engine refuses them, whether they exist or not
    for name in (n for n, c in name_counts.items() if c == 1):
        topic = topics.get(name)
        if is_internal(name):
            refused.append(name)
            continue
        if topic is None:
            answer(name, _ZERO_UUID, Errors.UNKNOWN_TOPIC_OR_PART, UNKNOWN_TOPIC_OR_PARTITION_MESSAGE)
            continue
        topic_id = uuid.UUID(topic.topic_id)
        if topic_id in duplicate_ids or topic_id in to_delete:
            to_delete.pop(topic_id, None)
            duplicate_ids.add(topic_id)
            answer(name, topic_id, Errors.INVALID_REQUEST, "The provided topic name maps to an ID that was already supplied.")
            continue
        to_delete[topic_id] = name
    targets = list(to_delete.items()) + [(uuid.UUID(topics[n].topic_id) if n in topics else _ZERO_UUID, n)
                                         for n in refused]
    if targets:
        try:
            deleted = broker.delete_topics([name for _, name in targets])
        except ApiError as exc:
            deleted = [_wire_error(exc)] * len(targets)
        for (topic_id, name), (error, message) in zip(targets, deleted):
            if error == Errors.UNKNOWN_TOPIC_OR_PART:  # deleted meanwhile
                message = UNKNOWN_TOPIC_OR_PARTITION_MESSAGE
            answer(name, topic_id, error, message or None)
    return DeleteTopicsResponse(throttle_time_ms=0, responses=results)


def _delete_topics_error(request: Any, version: int, error: Errors) -> Any:
    if version < 6:
        entries = [(name, _ZERO_UUID) for name in request.topic_names]
    else:
        entries = [(t.name, t.topic_id if not _no_id(t.topic_id) else _ZERO_UUID) for t in request.topics]
    return DeleteTopicsResponse(throttle_time_ms=0, responses=[
        DeleteTopicsResponse.DeletableTopicResult(name=name, topic_id=topic_id, error_code=int(error), error_message=None)
        for name, topic_id in entries])


# ---------------------------------------------------------------------------- CreatePartitions

def handle_create_partitions(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """CreatePartitions (Kafka's ``ControllerApis.createPartitions`` / ``ReplicationControlManager.createPartitions``):
    grow each topic to ``count`` partitions (the new ones empty and writable at once).

    Answers: NO_ERROR; UNKNOWN_TOPIC_OR_PARTITION (no message, as Kafka); INVALID_PARTITIONS
    "Topic already has N partition(s)." / "The topic T currently has N partition(s); C would not
    be an increase."; INVALID_REPLICA_ASSIGNMENT for manual assignments that are not one per new
    partition, each on this node; INVALID_REQUEST "Duplicate topic name." and for an internal
    topic. Nothing changes with ``validate_only``.
    """
    broker = apis.broker
    counts = Counter(t.name for t in request.topics)
    topics_now = broker.topics()
    answers: dict[str, tuple[Errors, str | None]] = {}
    growable = []
    for t in request.topics:
        if counts[t.name] > 1:
            continue
        current = topics_now.get(t.name)
        if current is not None and t.assignments is not None and t.count > len(current.partitions):
            additional = t.count - len(current.partitions)
            problem = None
            if len(t.assignments) != additional:
                problem = (f"Attempted to add {additional} additional partition(s), but only {len(t.assignments)} "
                           "assignment(s) were specified.")
            else:
                problem = next((p for p in (_check_replicas(apis, a.broker_ids) for a in t.assignments) if p), None)
            if problem is not None:
                answers[t.name] = (Errors.INVALID_REPLICA_ASSIGNMENT, problem)
                continue
        growable.append(t)
    if growable:
        try:
            grown = broker.create_partitions([(t.name, t.count) for t in growable], request.validate_only)
        except ApiError as exc:
            grown = [_wire_error(exc)] * len(growable)
        for t, answer in zip(growable, grown):
            answers[t.name] = answer
    results = [CreatePartitionsResponse.CreatePartitionsTopicResult(
        name=t.name, error_code=int(answers[t.name][0]), error_message=answers[t.name][1])
        for t in request.topics if counts[t.name] == 1]
    results += [CreatePartitionsResponse.CreatePartitionsTopicResult(
        name=name, error_code=int(Errors.INVALID_REQUEST), error_message="Duplicate topic name.")
        for name, c in counts.items() if c > 1]
    return CreatePartitionsResponse(throttle_time_ms=0, results=results)


def _create_partitions_error(request: Any, version: int, error: Errors) -> Any:
    return CreatePartitionsResponse(throttle_time_ms=0, results=[
        CreatePartitionsResponse.CreatePartitionsTopicResult(name=t.name, error_code=int(error), error_message=None)
        for t in request.topics])


# ---------------------------------------------------------------------------- DescribeConfigs

_Result = DescribeConfigsResponse.DescribeConfigsResult
_Entry = _Result.DescribeConfigsResourceResult
_Synonym = _Entry.DescribeConfigsSynonym


def _topic_entries(overrides: dict[str, str], keys: list[str] | None, synonyms: bool, docs: bool) -> list:
    """Kafka's ``ConfigHelper.createTopicConfigEntry`` for every (or every asked) topic config:
    source TOPIC_CONFIG for an override, else DEFAULT_CONFIG; synonyms the override then the
    broker-level default."""
    out = []
    for name, value in sorted(effective_config(overrides).items()):
        if keys and name not in keys:
            continue
        chain = []
        if name in overrides:
            chain.append(_Synonym(name=name, value=value, source=SOURCE_TOPIC_CONFIG))
        broker_name = BROKER_SYNONYMS.get(name)
        if broker_name is not None:
            chain.append(_Synonym(name=broker_name, value=TOPIC_CONFIGS[name].default, source=SOURCE_DEFAULT_CONFIG))
        out.append(_Entry(name=name, value=value, read_only=False, is_sensitive=False,
                          config_source=chain[0].source if chain else SOURCE_DEFAULT_CONFIG,
                          synonyms=chain if synonyms else [], config_type=CONFIG_TYPES[TOPIC_CONFIGS[name].type],
                          documentation=TOPIC_CONFIG_DOCS.get(name) if docs else None))
    return out


def broker_configs(apis: ApiNode) -> dict[str, tuple[str, int, str, str]]:
    """This node's broker configs: name -> ``(value, source, type, documentation)``. None of them
    can change while the server runs (all read-only)."""
    config = apis.broker.config
    default = type(config)()
    out: dict[str, tuple[str, int, str, str]] = {
        "node.id": (str(apis.node_id), SOURCE_DEFAULT_CONFIG, "INT", "This server's node id (one node)."),
        "broker.id": (str(apis.node_id), SOURCE_DEFAULT_CONFIG, "INT", "The broker id, the same as node.id."),
        "advertised.listeners": (f"PLAINTEXT://{apis.host}:{apis.port}", SOURCE_STATIC_BROKER_CONFIG, "STRING",
                                 "The listener Metadata names (txlake serve --advertised-listener)."),
        "num.partitions": (str(config.num_partitions),
                           SOURCE_DEFAULT_CONFIG if config.num_partitions == default.num_partitions
                           else SOURCE_STATIC_BROKER_CONFIG, "INT",
                           "The partition count of a topic created with num_partitions -1."),
        "default.replication.factor": ("1", SOURCE_DEFAULT_CONFIG, "INT",
                                       "The replication factor of a new topic (the object store keeps the copies)."),
        "auto.create.topics.enable": ("false", SOURCE_STATIC_BROKER_CONFIG, "BOOLEAN",
                                      "Metadata never creates topics on txlake serve."),
        "delete.topic.enable": ("true", SOURCE_DEFAULT_CONFIG, "BOOLEAN", "DeleteTopics deletes topics."),
        "producer.id.expiration.ms": (str(config.producer_id_expiration_ms),
                                      SOURCE_DEFAULT_CONFIG if config.producer_id_expiration_ms
                                      == default.producer_id_expiration_ms else SOURCE_STATIC_BROKER_CONFIG, "INT",
                                      "How long (ms) a producer's state is kept after its last write."),
        "log.retention.hours": ("168", SOURCE_DEFAULT_CONFIG, "INT", "The default retention.ms, in hours."),
        "log.roll.hours": ("168", SOURCE_DEFAULT_CONFIG, "INT", "The default segment.ms, in hours."),
    }
    for topic_name, broker_name in BROKER_SYNONYMS.items():
        if broker_name is not None:
            d = TOPIC_CONFIGS[topic_name]
            out[broker_name] = (d.default, SOURCE_DEFAULT_CONFIG, d.type,
                                f"The default {topic_name} of topics. {TOPIC_CONFIG_DOCS[topic_name]}")
    return out


def _broker_entries(apis: ApiNode, keys: list[str] | None, synonyms: bool, docs: bool) -> list:
    out = []
    for name, (value, source, kind, doc) in sorted(broker_configs(apis).items()):
        if keys and name not in keys:
            continue
        chain = [_Synonym(name=name, value=value, source=source)]
        out.append(_Entry(name=name, value=value, read_only=True, is_sensitive=False, config_source=source,
                          synonyms=chain if synonyms else [], config_type=CONFIG_TYPES[kind],
                          documentation=doc if docs else None))
    return out


def _broker_id(name: str, message: str) -> int:
    try:
        return int(name)
    except ValueError:
        raise ApiError(Errors.INVALID_REQUEST, message) from None


def handle_describe_configs(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DescribeConfigs (Kafka's ``ConfigHelper.describeConfigs``).

    * TOPIC: every topic config (or the ``configuration_keys`` asked), with its value, source
      (TOPIC_CONFIG = 1 for an override, DEFAULT_CONFIG = 5 otherwise), type (v3+), synonyms
      (v1+ ``include_synonyms``: the override, then the broker-level default) and documentation
      (v3+ ``include_documentation``). A topic that does not exist: UNKNOWN_TOPIC_OR_PARTITION
      with no message; a name Kafka refuses: INVALID_TOPIC_EXCEPTION.
    * BROKER "1" (this node): its configs, all read-only; "" (cluster-wide dynamic defaults):
      none; another id: INVALID_REQUEST "Unexpected broker id, expected 1 or empty string, but
      received N"; not a number: INVALID_REQUEST "Broker id must be an integer, but it is: X".
    * BROKER_LOGGER, CLIENT_METRICS, GROUP and unknown types: INVALID_REQUEST
      "Unsupported resource type: ..." (txlake has none of them).
    """
    broker = apis.broker
    broker.refresh(min_interval_ms=apis.metadata_refresh_ms)
    topics = broker.topics()
    synonyms = bool(request.include_synonyms)
    docs = context.api_version >= 3 and bool(request.include_documentation)
    results = []
    for resource in request.resources:
        keys = list(resource.configuration_keys) if resource.configuration_keys else None
        rtype, name = resource.resource_type, resource.resource_name
        try:
            if rtype == RESOURCE_TOPIC:
                try:
                    validate_topic_name(name)
                except InvalidTopicError as exc:
                    raise ApiError(Errors.INVALID_TOPIC_EXCEPTION, str(exc)) from None
                topic = topics.get(name)
                if topic is None:
                    results.append(_Result(error_code=int(Errors.UNKNOWN_TOPIC_OR_PART), error_message=None,
                                           resource_type=rtype, resource_name=name, configs=[]))
                    continue
                entries = _topic_entries(topic.config, keys, synonyms, docs)
            elif rtype == RESOURCE_BROKER:
                if not name:
                    entries = []  # no cluster-wide dynamic defaults: nothing is dynamic
                elif _broker_id(name, f"Broker id must be an integer, but it is: {name}") == apis.node_id:
                    entries = _broker_entries(apis, keys, synonyms, docs)
                else:
                    raise ApiError(Errors.INVALID_REQUEST, f"Unexpected broker id, expected {apis.node_id} or empty "
                                                           f"string, but received {name}")
            else:
                raise ApiError(Errors.INVALID_REQUEST,
                               f"Unsupported resource type: {_RESOURCE_NAMES.get(rtype, 'UNKNOWN')}")
        except ApiError as exc:
            results.append(_Result(error_code=int(exc.error), error_message=exc.message, resource_type=rtype,
                                   resource_name=name, configs=[]))
            continue
        results.append(_Result(error_code=0, error_message=None, resource_type=rtype, resource_name=name,
                               configs=entries))
    return DescribeConfigsResponse(throttle_time_ms=0, results=results)


def _describe_configs_error(request: Any, version: int, error: Errors) -> Any:
    return DescribeConfigsResponse(throttle_time_ms=0, results=[
        _Result(error_code=int(error), error_message=None, resource_type=r.resource_type,
                resource_name=r.resource_name, configs=[]) for r in request.resources])


# ---------------------------------------------------------------------------- IncrementalAlterConfigs

def handle_incremental_alter_configs(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """IncrementalAlterConfigs (KIP-339; Kafka's ``ConfigAdminManager.preprocess`` on the broker,
    then ``ConfigurationControlManager.incrementalAlterConfigs`` on the controller).

    Per resource: INVALID_REQUEST for a resource given twice ("Each resource must appear at most
    once."), a config named twice ("Error due to duplicate config keys"), a null value outside
    DELETE ("Null value not supported for : a, b"), an unknown operation ("Unknown operations
    type N") or resource type ("Unknown resource type N"). TOPIC: SET / DELETE / APPEND /
    SUBTRACT on the topic's overrides, validated as Kafka does (INVALID_CONFIG with Kafka's
    messages; INVALID_REQUEST "Default topic resources are not allowed." for the empty name;
    UNKNOWN_TOPIC_OR_PARTITION "The topic 'T' does not exist."), committed together (nothing
    with ``validate_only``). BROKER: this node's configs cannot change while it runs: INVALID_REQUEST
    "Cannot update these configs dynamically: Set(...)" (a wrong or non-numeric node id first:
    "Unexpected broker id, ..." / "Node id must be an integer, ...").
    """
    def check(resource: Any) -> None:
        if len({c.name for c in resource.configs}) != len(resource.configs):
            raise ApiError(Errors.INVALID_REQUEST, "Error due to duplicate config keys")
        nulls = [c.name for c in resource.configs if c.config_operation != OP_DELETE and c.value is None]
        if nulls:
            raise ApiError(Errors.INVALID_REQUEST, f"Null value not supported for : {', '.join(nulls)}")
        bad_op = next((c.config_operation for c in resource.configs if c.config_operation not in OP_NAMES), None)
        if bad_op is not None:
            raise ApiError(Errors.INVALID_REQUEST, f"Unknown operations type {bad_op}")

    return _alter_resources(apis, request, IncrementalAlterConfigsResponse, check,
                            lambda resource: [(c.name, c.config_operation, c.value) for c in resource.configs])


def _alter_error(response: Any, request: Any, version: int, error: Errors) -> Any:
    """An (Incremental)AlterConfigs ``response`` answering ``error`` for every resource."""
    return response(throttle_time_ms=0, responses=[response.AlterConfigsResourceResponse(
        error_code=int(error), error_message=None, resource_type=r.resource_type, resource_name=r.resource_name)
        for r in request.resources])


_incremental_alter_configs_error = functools.partial(_alter_error, IncrementalAlterConfigsResponse)


def _alter_resources(apis: ApiNode, request: Any, response: Any, check: Callable[[Any], None],
                     topic_ops: Callable[[Any], list]) -> Any:
    """Answer an (Incremental)AlterConfigs ``request`` with ``response``: per resource, INVALID_REQUEST
    for one given twice, then ``check(resource)`` (raises ApiError), then INVALID_REQUEST for the
    empty topic name or an unknown type; a TOPIC's ``topic_ops(resource)`` are committed with the
    other topics' (:func:`_alter_topics`); the BROKER gets :func:`_check_broker_alteration`."""
    answers: dict[int, tuple[Errors, str | None]] = {}
    keys = Counter((r.resource_type, r.resource_name) for r in request.resources)
    topic_changes: list[tuple[int, str, list[tuple[str, int, str | None]]]] = []
    for index, resource in enumerate(request.resources):
        rtype, name = resource.resource_type, resource.resource_name
        try:
            if keys[(rtype, name)] > 1:
                raise ApiError(Errors.INVALID_REQUEST, "Each resource must appear at most once.")
            check(resource)
            if rtype == RESOURCE_TOPIC:
                if not name:
                    raise ApiError(Errors.INVALID_REQUEST, "Default topic resources are not allowed.")
                topic_changes.append((index, name, topic_ops(resource)))
                continue
            if rtype == RESOURCE_BROKER:
                _check_broker_alteration(apis, name, [c.name for c in resource.configs])
                answers[index] = (Errors.NO_ERROR, None)
                continue
            raise ApiError(Errors.INVALID_REQUEST, f"Unknown resource type {rtype}")
        except ApiError as exc:
            answers[index] = (exc.error, exc.message)
    _alter_topics(apis, topic_changes, request.validate_only, answers)
    return response(throttle_time_ms=0, responses=[response.AlterConfigsResourceResponse(
        error_code=int(answers[i][0]), error_message=answers[i][1], resource_type=r.resource_type,
        resource_name=r.resource_name) for i, r in enumerate(request.resources)])


def _alter_topics(apis: ApiNode, changes: list[tuple[int, str, list[tuple[str, int, str | None]]]],
                  validate_only: bool, answers: dict[int, tuple[Errors, str | None]]) -> None:
    """Commit the topics' config ``changes`` (``(resource index, topic, ops)``) together
    (:meth:`Broker.alter_topic_configs`) and put each one's ``(error, message)`` in ``answers``."""
    if not changes:
        return
    try:
        altered = apis.broker.alter_topic_configs([(name, ops) for _, name, ops in changes], validate_only)
    except ApiError as exc:
        altered = [_wire_error(exc)] * len(changes)
    for (index, _, _), answer in zip(changes, altered):
        answers[index] = answer


def _check_broker_alteration(apis: ApiNode, name: str, config_names: list[str]) -> None:
    """Kafka's answer to altering this node's configs: none can change while it runs.

    Raises:
        ApiError: INVALID_REQUEST "Node id must be an integer, ..." / "Unexpected broker id, ..."
            for a name that is not this node, "Cannot update these configs dynamically: Set(...)"
            when ``config_names`` is not empty.
    """
    if name and _broker_id(name, f"Node id must be an integer, but it is: {name}") != apis.node_id:
        raise ApiError(Errors.INVALID_REQUEST, f"Unexpected broker id, expected {apis.node_id}, but received {name}")
    if config_names:
        raise ApiError(Errors.INVALID_REQUEST, f"Cannot update these configs dynamically: Set({', '.join(config_names)})")


# ---------------------------------------------------------------------------- AlterConfigs

def handle_alter_configs(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """AlterConfigs, the legacy whole-replacement form (Kafka 4.3 still answers it: the broker
    forwards it to the controller's ``ConfigurationControlManager.legacyAlterConfigs``): each TOPIC
    resource's overrides become exactly the configs given -- every override not named goes back to
    its default -- validated and committed as IncrementalAlterConfigs' SET and DELETE
    (:meth:`Broker.alter_topic_configs`; nothing changes with ``validate_only``). A null value
    leaves the config at its default.

    Per resource: INVALID_REQUEST for a resource given twice ("Each resource must appear at most
    once."), the empty topic name ("Default topic resources are not allowed."), a BROKER resource
    with configs (none can change while the node runs: "Cannot update these configs dynamically:
    Set(...)"; with none it answers NO_ERROR, as Kafka with no dynamic broker configs) or an unknown
    resource type ("Unknown resource type N"); INVALID_CONFIG (Kafka's messages, e.g. "Unknown topic
    config name: x"); UNKNOWN_TOPIC_OR_PARTITION "The topic 'T' does not exist."
    """
    def topic_ops(resource: Any) -> list[tuple[str, int, str | None]]:
        wanted = {c.name: c.value for c in resource.configs if c.value is not None}
        return [(n, OP_DELETE, None) for n in TOPIC_CONFIGS if n not in wanted] + [(n, OP_SET, v) for n, v in wanted.items()]

    return _alter_resources(apis, request, AlterConfigsResponse, lambda resource: None, topic_ops)


_alter_configs_error = functools.partial(_alter_error, AlterConfigsResponse)


# ---------------------------------------------------------------------------- DeleteRecords

def handle_delete_records(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DeleteRecords (Kafka's ``ReplicaManager.deleteRecords``): move each partition's log start
    offset to ``offset`` (-1 = the high watermark) and answer the new low watermark, or -1 with
    UNKNOWN_TOPIC_OR_PARTITION, OFFSET_OUT_OF_RANGE (below -1 or past the high watermark),
    INVALID_TOPIC_EXCEPTION (an internal topic) or POLICY_VIOLATION (``cleanup.policy`` without
    ``delete``) -- :meth:`Broker.delete_records`, which commits them together within ``timeout_ms``
    (REQUEST_TIMED_OUT for every partition otherwise)."""
    wanted = [(t.name, p.partition_index, p.offset) for t in request.topics for p in t.partitions]
    try:
        answers = [(e, low) for e, low, _ in apis.broker.delete_records(wanted, max(int(request.timeout_ms), 1))]
    except ApiError as exc:
        error, _ = _wire_error(exc)
        answers = [(error, -1)] * len(wanted)
    it = iter(answers)
    topics = []
    for t in request.topics:
        partitions = []
        for p in t.partitions:
            error, low = next(it)
            partitions.append(DeleteRecordsResponse.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
                partition_index=p.partition_index, low_watermark=low if error == Errors.NO_ERROR else -1,
                error_code=int(error)))
        topics.append(DeleteRecordsResponse.DeleteRecordsTopicResult(name=t.name, partitions=partitions))
    return DeleteRecordsResponse(throttle_time_ms=0, topics=topics)


def _delete_records_error(request: Any, version: int, error: Errors) -> Any:
    return DeleteRecordsResponse(throttle_time_ms=0, topics=[
        DeleteRecordsResponse.DeleteRecordsTopicResult(name=t.name, partitions=[
            DeleteRecordsResponse.DeleteRecordsTopicResult.DeleteRecordsPartitionResult(
                partition_index=p.partition_index, low_watermark=-1, error_code=int(error)) for p in t.partitions])
        for t in request.topics])


# ---------------------------------------------------------------------------- DescribeProducers

_PartitionResponse = DescribeProducersResponse.TopicResponse.PartitionResponse


def handle_describe_producers(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DescribeProducers (KIP-664; Kafka's ``ReplicaManager.activeProducerState``): the producers
    with state on each partition (live state: the server is the writer), sorted by producer id,
    with the first offset of their open transaction; UNKNOWN_TOPIC_OR_PARTITION (no message, as
    Kafka) for a partition that does not exist."""
    wanted = [(t.name, p) for t in request.topics for p in t.partition_indexes]
    answers = iter(TransactionAdmin(apis.broker).handle_describe_producers(wanted))
    topics = []
    for t in request.topics:
        partitions = []
        for p in t.partition_indexes:
            a = next(answers)
            if a.error != Errors.NO_ERROR:
                partitions.append(_PartitionResponse(partition_index=p, error_code=int(a.error), error_message=None,
                                                     active_producers=[]))
                continue
            partitions.append(_PartitionResponse(partition_index=p, error_code=0, error_message=None, active_producers=[
                _PartitionResponse.ProducerState(
                    producer_id=s.producer_id, producer_epoch=s.producer_epoch, last_sequence=s.last_sequence,
                    last_timestamp=s.last_timestamp, coordinator_epoch=s.coordinator_epoch,
                    current_txn_start_offset=s.current_txn_start_offset) for s in a.active_producers]))
        topics.append(DescribeProducersResponse.TopicResponse(name=t.name, partitions=partitions))
    return DescribeProducersResponse(throttle_time_ms=0, topics=topics)


def _describe_producers_error(request: Any, version: int, error: Errors) -> Any:
    return DescribeProducersResponse(throttle_time_ms=0, topics=[
        DescribeProducersResponse.TopicResponse(name=t.name, partitions=[
            _PartitionResponse(partition_index=p, error_code=int(error), error_message=None, active_producers=[])
            for p in t.partition_indexes]) for t in request.topics])


APIS = [
    ApiSpec(ApiKey.CreateTopics, 2, 7, handle_create_topics, _create_topics_error),
    ApiSpec(ApiKey.DeleteTopics, 1, 6, handle_delete_topics, _delete_topics_error),
    ApiSpec(ApiKey.CreatePartitions, 0, 3, handle_create_partitions, _create_partitions_error),
    ApiSpec(ApiKey.DescribeConfigs, 1, 4, handle_describe_configs, _describe_configs_error),
    ApiSpec(ApiKey.AlterConfigs, 0, 2, handle_alter_configs, _alter_configs_error),
    ApiSpec(ApiKey.IncrementalAlterConfigs, 0, 1, handle_incremental_alter_configs, _incremental_alter_configs_error),
    ApiSpec(ApiKey.DeleteRecords, 0, 2, handle_delete_records, _delete_records_error),
    ApiSpec(ApiKey.DescribeProducers, 0, 0, handle_describe_producers, _describe_producers_error),
]
