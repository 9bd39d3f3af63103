"""Consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete (Kafka's
``KafkaApis.handleFindCoordinatorRequest`` ... ``handleOffsetDeleteRequest`` with
``GroupCoordinatorService``'s classic-group paths).

txlake is one node: it is the coordinator of every group and every transactional id
(FindCoordinator always names :attr:`KafkaApis.node_id` at the advertised listener). The
handlers translate Kafka's request messages into calls of the engine's group coordinator
(:class:`~txlake.engine.group_coordinator.GroupCoordinator`: membership, rebalances, the
group records) and of the committed offsets (:class:`~txlake.engine.group_offsets.GroupOffsets`
over ``__consumer_offsets``), the same calls the in-process consumer makes, and their
answers back into Kafka's response messages. JoinGroup and SyncGroup are parked until the
rebalance decides: the handler returns a Future of the response.

**Simple groups.** Kafka creates an Empty group without a protocol type for a group that only
commits offsets (an ``assign()``-based consumer, ``alter_consumer_group_offsets``: Kafka's
"simple consumer group", ``OffsetMetadataManager.validateOffsetCommit`` and ``replay``). The
engine's coordinator keeps only groups with membership records, so these handlers treat a
group the coordinator does not know but that has committed (or pending transactional)
offsets as such a group: ListGroups lists it Empty with protocol type "", DescribeGroups
describes it Empty, DeleteGroups and OffsetDelete delete its offsets. ListGroups replays
every ``__consumer_offsets`` partition to find them (unless its states filter excludes
Empty).

**Versions** (each the highest of Kafka's schema whose fields are all honoured):
FindCoordinator 0-6 (batched keys v4+; key type SHARE answers INVALID_REQUEST below v6 and
COORDINATOR_NOT_AVAILABLE at v6: there are no share groups), JoinGroup 0-9, SyncGroup 0-5,
Heartbeat 0-4, LeaveGroup 0-5, OffsetCommit 2-10 (topic ids v10), OffsetFetch 1-10 (batched
groups v8+, member id/epoch v9+ are not checked for classic groups, as Kafka's
``ClassicGroup.validateOffsetFetch``; topic ids v10), ListGroups 0-5, DescribeGroups 0-6,
DeleteGroups 0-2, OffsetDelete 0.
"""

from __future__ import annotations

import functools
import logging
import uuid
from concurrent.futures import Future
from typing import Any, Callable, Iterable

from kafka.errors import for_code
from kafka.protocol.admin import (DeleteGroupsResponse, DescribeGroupsResponse, ListGroupsResponse)
from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer.group import (HeartbeatResponse, JoinGroupResponse, LeaveGroupResponse,
                                           OffsetCommitResponse, OffsetDeleteResponse, OffsetFetchResponse,
                                           SyncGroupResponse)
from kafka.protocol.metadata import FindCoordinatorResponse

from txlake.catalog.storage import StorageError
from txlake.catalog.topic_names import CONSUMER_OFFSETS_TOPIC

from ..errors import ApiError, Errors
from ..group_coordinator import GroupCoordinator, MemberIdentity, append_error_to_response_error
from ..group_metadata import CONSUMER_PROTOCOL_TYPE, GroupState, JoinGroupResult, SyncGroupResult
from ..group_offsets import GroupOffsetsState, OffsetAndMetadata, TopicPartitionKey
from .api_spec import ApiNode, ApiSpec, RequestContext

log = logging.getLogger(__name__)

#: FindCoordinator key types (Kafka's ``CoordinatorType``)
KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION, KEY_TYPE_SHARE = 0, 1, 2
#: DescribeGroups' "authorized operations not requested" (``Integer.MIN_VALUE`` on the wire:
#: kafka-python encodes its bit-field type from a set of operation codes, None for this)
AUTHORIZED_OPERATIONS_OMITTED = None
#: what a principal may do with a group here (no authorizer: every operation the server
#: implements for groups, Kafka's ``AclEntry.supportedOperations(GROUP)``): the ``AclOperation``
#: codes READ (3), DELETE (6), DESCRIBE (8), sent as Kafka's 32-bit field
GROUP_AUTHORIZED_OPERATIONS = frozenset({3, 6, 8})
#: the group type of every group here (ListGroups v5, KIP-848)
CLASSIC_GROUP_TYPE = "classic"
#: "no offset" in OffsetFetch (Kafka's ``OffsetFetchResponse.INVALID_OFFSET``)
INVALID_OFFSET = -1
_NO_NODE = (-1, "", -1)


class _CoordinatorError(Exception):
    """The group coordinator cannot answer (not started, lease lost): answer ``error`` everywhere."""

    def __init__(self, error: Errors):
        super().__init__(error.name)
        self.error = error


def _coordinator(apis: ApiNode) -> GroupCoordinator:
    """The engine's group coordinator (started on first use), or :class:`_CoordinatorError`
    with Kafka's answer for a coordinator that is not here (NOT_COORDINATOR when this server
    lost the writer lease)."""
    try:
        return apis.broker.group_coordinator()
    except ApiError as exc:
        raise _CoordinatorError(append_error_to_response_error(exc.error)) from exc


def _message(error: Errors) -> str | None:
    """Kafka's default message of an error code (``Errors.message()``), None for NO_ERROR."""
    if error == Errors.NO_ERROR:
        return None
    return for_code(int(error)).description


def _client_host(context: RequestContext) -> str:
    """The member's host as Kafka records it (``InetAddress.toString``: "/127.0.0.1")."""
    return f"/{context.client_host}" if context.client_host else ""


def _mapped(future: Future, convert: Callable[[Any], Any]) -> Future:
    """A Future of ``convert(result)`` once ``future`` completes (its exception passes through)."""
    out: Future = Future()

    def done(source: Future) -> None:
        exc = source.exception()
        if exc is not None:
            out.set_exception(exc)
            return
        try:
            out.set_result(convert(source.result()))
        except Exception as failure:  # KafkaApis answers UNKNOWN_SERVER_ERROR
            out.set_exception(failure)

    future.add_done_callback(done)
    return out


def _topic_ids(apis: ApiNode) -> tuple[dict[uuid.UUID, str], dict[str, uuid.UUID]]:
    """``(topic id -> name, name -> topic id)`` of the catalog's topics (OffsetCommit/OffsetFetch v10)."""
    by_id, by_name = {}, {}
    for topic in apis.broker.topics().values():
        topic_id = uuid.UUID(topic.topic_id)
        by_id[topic_id] = topic.name
        by_name[topic.name] = topic_id
    return by_id, by_name


def _offsets_state(apis: ApiNode, group_id: str) -> GroupOffsetsState | None:
    """The group's committed and pending offsets, or None when it has neither."""
    offsets = apis.broker.group_offsets()
    return offsets.replay(offsets.partition_for(group_id), group_id).get(group_id)


def _is_simple_group(coordinator: GroupCoordinator, apis: ApiNode, group_id: str) -> bool:
    """Whether ``group_id`` is one of Kafka's simple groups here: unknown to the coordinator,
    with committed or pending offsets (module docstring)."""
    group = coordinator.get_group(group_id)
    if group is not None and not group.is_in(GroupState.DEAD):
        return False
    state = _offsets_state(apis, group_id)
    return state is not None and bool(state.committed or state.pending)


def _delete_all_offsets(coordinator: GroupCoordinator, apis: ApiNode, group_id: str) -> Errors:
    """Tombstone every committed and pending offset of the group (Kafka's ``deleteAllOffsets``)."""
    offsets = apis.broker.group_offsets()
    partition = offsets.partition_for(group_id)
    with coordinator.offset_commit_guard(group_id):
        state = offsets.replay(partition, group_id).get(group_id)
        if state is None:
            return Errors.NO_ERROR
        error = offsets.delete_offsets(partition, {group_id: set(state.committed) | state.pending})
    return append_error_to_response_error(error)


def _guarded(handler: Callable, error_response: Callable) -> Callable:
    """``handler``, answering ``error_response`` when the coordinator is not available or the
    engine answers an :class:`ApiError` (its code, mapped as Kafka maps a coordinator's append
    errors: a lost writer lease is NOT_COORDINATOR) or the object store fails (a
    :class:`StorageError`, e.g. creating ``__consumer_offsets`` or reading the catalog: Kafka's
    KAFKA_STORAGE_ERROR of the coordinator's log, answered NOT_COORDINATOR so the client looks
    the coordinator up again and retries)."""

    @functools.wraps(handler)
    def run(apis: ApiNode, context: RequestContext, request: Any) -> Any:
        try:
            return handler(apis, context, request)
        except _CoordinatorError as exc:
            return error_response(request, context.api_version, exc.error)
        except ApiError as exc:
            log.warning("%s v%d from %s: %s", ApiKey(context.api_key).name, context.api_version,
                        context.client_host or "in-process", exc)
            return error_response(request, context.api_version, append_error_to_response_error(exc.error))
        except StorageError as exc:  # the object store failed (Kafka: a KafkaStorageException of the log)
            log.warning("%s v%d from %s: %s", ApiKey(context.api_key).name, context.api_version,
                        context.client_host or "in-process", exc)
            return error_response(request, context.api_version,
                                  append_error_to_response_error(Errors.KAFKA_STORAGE_ERROR))

    return run


# ---------------------------------------------------------------------------- FindCoordinator
def _coordinator_keys(request: Any, version: int) -> list[str]:
    return list(request.coordinator_keys) if version >= 4 else [request.key]


def _find_coordinator_error(request: Any, version: int, error: Errors) -> Any:
    if version >= 4:
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=[
            FindCoordinatorResponse.Coordinator(key=key, node_id=-1, host="", port=-1, error_code=int(error),
                                                error_message=_message(error))
            for key in _coordinator_keys(request, version)])
    node_id, host, port = _NO_NODE
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=int(error), error_message=_message(error),
                                   node_id=node_id, host=host, port=port)


def handle_find_coordinator(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """FindCoordinator: this node for every GROUP and TRANSACTION key (batched v4+, KIP-699).

    A SHARE key (KIP-932) answers INVALID_REQUEST below v6 and COORDINATOR_NOT_AVAILABLE at v6
    (no share coordinator), as Kafka's ``getCoordinator`` without share groups; any other key
    type answers INVALID_REQUEST for the whole request (Kafka's ``CoordinatorType.forId``
    throws ``InvalidRequestException``)."""
    version = context.api_version
    key_type = request.key_type if version >= 1 else KEY_TYPE_GROUP
    if key_type in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
        error = Errors.NO_ERROR
    elif key_type == KEY_TYPE_SHARE:
        error = Errors.INVALID_REQUEST if version < 6 else Errors.COORDINATOR_NOT_AVAILABLE
    else:
        log.warning("FindCoordinator v%d from %s: unknown key type %d", version, context.client_host or "in-process",
                    key_type)
        return _find_coordinator_error(request, version, Errors.INVALID_REQUEST)
    if error != Errors.NO_ERROR:
        return _find_coordinator_error(request, version, error)
    node = (apis.node_id, apis.host, apis.port)
    if version >= 4:
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=[
            FindCoordinatorResponse.Coordinator(key=key, node_id=node[0], host=node[1], port=node[2], error_code=0,
                                                error_message=None)
            for key in request.coordinator_keys])
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=0, error_message=None, node_id=node[0],
                                   host=node[1], port=node[2])


# ---------------------------------------------------------------------------- JoinGroup / SyncGroup
def _join_response(result: JoinGroupResult, version: int) -> Any:
    ok = result.error == Errors.NO_ERROR
    protocol_name = result.protocol_name if ok else None
    if protocol_name is None and version < 7:
        protocol_name = ""  # not nullable before v7 (Kafka's UNKNOWN_PROTOCOL_NAME)
    return JoinGroupResponse(
        throttle_time_ms=0, error_code=int(result.error), generation_id=result.generation_id,
        protocol_type=result.protocol_type if ok else None, protocol_name=protocol_name,
        leader=result.leader_id or "", skip_assignment=result.skip_assignment, member_id=result.member_id or "",
        members=[JoinGroupResponse.JoinGroupResponseMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                                           metadata=m.metadata) for m in result.members])


def _join_group_error(request: Any, version: int, error: Errors) -> Any:
    return _join_response(JoinGroupResult(error, ""), version)


def handle_join_group(apis: ApiNode, context: RequestContext, request: Any) -> Future:
    """JoinGroup: a Future of the response, completed when the rebalance's join phase decides
    (:meth:`GroupCoordinator.handle_join_group`). v4+ requires a known member id (KIP-394:
    MEMBER_ID_REQUIRED first); v5+ static members (KIP-345); v9+ ``skip_assignment`` for a
    static leader rejoining a Stable group. v0 has no rebalance timeout: the session timeout
    applies."""
    version = context.api_version
    future = _coordinator(apis).handle_join_group(
        request.group_id, request.member_id or "", request.protocol_type,
        [(p.name, p.metadata) for p in request.protocols], request.session_timeout_ms,
        request.rebalance_timeout_ms if version >= 1 else -1,
        group_instance_id=request.group_instance_id if version >= 5 else None, client_id=context.client_id,
        client_host=_client_host(context), require_known_member_id=version >= 4,
        supports_skip_assignment=version >= 9, reason=request.reason if version >= 8 else None)
    return _mapped(future, lambda result: _join_response(result, version))


def _sync_response(result: SyncGroupResult) -> Any:
    ok = result.error == Errors.NO_ERROR
    return SyncGroupResponse(throttle_time_ms=0, error_code=int(result.error),
                             protocol_type=result.protocol_type if ok else None,
                             protocol_name=result.protocol_name if ok else None,
                             assignment=result.assignment if ok else b"")


def _sync_group_error(request: Any, version: int, error: Errors) -> Any:
    return _sync_response(SyncGroupResult(error))


def handle_sync_group(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """SyncGroup: a Future of the member's assignment (:meth:`GroupCoordinator.handle_sync_group`;
    the leader's request carries everyone's). From v5 the protocol type and name are mandatory:
    a request without them answers INCONSISTENT_GROUP_PROTOCOL (Kafka's
    ``areMandatoryProtocolTypeAndNamePresent``)."""
    version = context.api_version
    if version >= 5 and (request.protocol_type is None or request.protocol_name is None):
        return _sync_response(SyncGroupResult(Errors.INCONSISTENT_GROUP_PROTOCOL))
    assignments = {a.member_id: bytes(a.assignment) for a in request.assignments}
    future = _coordinator(apis).handle_sync_group(
        request.group_id, request.generation_id, request.member_id, assignments,
        group_instance_id=request.group_instance_id if version >= 3 else None,
        protocol_type=request.protocol_type if version >= 5 else None,
        protocol_name=request.protocol_name if version >= 5 else None)
    return _mapped(future, _sync_response)


# ---------------------------------------------------------------------------- Heartbeat / LeaveGroup
def _heartbeat_error(request: Any, version: int, error: Errors) -> Any:
    return HeartbeatResponse(throttle_time_ms=0, error_code=int(error))


def handle_heartbeat(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """Heartbeat (:meth:`GroupCoordinator.handle_heartbeat`): REBALANCE_IN_PROGRESS tells the
    member to rejoin; UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID as Kafka."""
    error = _coordinator(apis).handle_heartbeat(
        request.group_id, request.generation_id, request.member_id,
        request.group_instance_id if context.api_version >= 3 else None)
    return _heartbeat_error(request, context.api_version, error)


def _leave_group_error(request: Any, version: int, error: Errors) -> Any:
    return LeaveGroupResponse(throttle_time_ms=0, error_code=int(error), members=[])


def handle_leave_group(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """LeaveGroup (:meth:`GroupCoordinator.handle_leave_group`): one member before v3, a batch
    of members by member id or group instance id from v3 (KIP-345), with a reason from v5.
    Before v3 the response has one error: the top-level one, else the member's (Kafka's
    ``LeaveGroupResponse`` for old versions)."""
    version = context.api_version
    if version >= 3:
        members = [MemberIdentity(m.member_id or "", m.group_instance_id, m.reason if version >= 5 else None)
                   for m in request.members]
    else:
        members = [MemberIdentity(request.member_id or "")]
    result = _coordinator(apis).handle_leave_group(request.group_id, members)
    if version < 3:
        error = result.error
        if error == Errors.NO_ERROR:
            error = next((m.error for m in result.members if m.error != Errors.NO_ERROR), Errors.NO_ERROR)
        return LeaveGroupResponse(throttle_time_ms=0, error_code=int(error))
    return LeaveGroupResponse(throttle_time_ms=0, error_code=int(result.error), members=[
        LeaveGroupResponse.MemberResponse(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                          error_code=int(m.error)) for m in result.members])


# ---------------------------------------------------------------------------- OffsetCommit
def _offset_commit_response(topics: list[tuple[Any, Any, list[tuple[int, Errors]]]], version: int) -> Any:
    """``topics``: ``[(name, topic id, [(partition, error)])]`` in request order."""
    Topic = OffsetCommitResponse.OffsetCommitResponseTopic
    return OffsetCommitResponse(throttle_time_ms=0, topics=[
        Topic(name=name if version < 10 else None, topic_id=topic_id if version >= 10 else None, partitions=[
            Topic.OffsetCommitResponsePartition(partition_index=p, error_code=int(error)) for p, error in parts])
        for name, topic_id, parts in topics])


def _offset_commit_error(request: Any, version: int, error: Errors) -> Any:
    return _offset_commit_response([(t.name if version < 10 else None, t.topic_id if version >= 10 else None,
                                     [(p.partition_index, error) for p in t.partitions]) for t in request.topics],
                                   version)


def handle_offset_commit(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """OffsetCommit (:meth:`GroupOffsets.commit`, which checks the membership with
    :meth:`GroupCoordinator.validate_offset_commit` under the partition's commit guard).

    Each partition's offset, metadata (null stored as "") and, v6+, committed leader epoch
    (-1: none) are stored; v2-v4's retention time gives the offsets an explicit expiry. A topic
    the catalog does not have answers UNKNOWN_TOPIC_OR_PARTITION (by id, v10: UNKNOWN_TOPIC_ID).
    A generation >= 0 for a group that does not exist answers ILLEGAL_GENERATION before v9 and
    GROUP_ID_NOT_FOUND from v9 (Kafka's ``OffsetMetadataManager.validateOffsetCommit``).
    A partition named twice is stored once (the last one) and answered twice.
    """
    version = context.api_version
    coordinator = _coordinator(apis)
    by_id = _topic_ids(apis)[0] if version >= 10 else {}
    offsets: dict[TopicPartitionKey, OffsetAndMetadata] = {}
    for topic in request.topics:
        name = topic.name if version < 10 else by_id.get(topic.topic_id)
        if name is None:
            continue
        for p in topic.partitions:
            epoch = p.committed_leader_epoch if version >= 6 else -1
            offsets[(name, p.partition_index)] = OffsetAndMetadata(
                p.committed_offset, p.committed_metadata or "", leader_epoch=epoch if epoch >= 0 else None)
    group_id, generation = request.group_id, request.generation_id_or_member_epoch
    answers = apis.broker.group_offsets().commit(
        group_id, offsets, generation, request.member_id or "",
        request.group_instance_id if version >= 7 else None,
        request.retention_time_ms if 2 <= version <= 4 else -1) if offsets else {}
    if version >= 9 and generation >= 0 and Errors.ILLEGAL_GENERATION in answers.values():
        group = coordinator.get_group(group_id)
        if group is None or group.is_in(GroupState.DEAD):
            answers = {tp: Errors.GROUP_ID_NOT_FOUND if e == Errors.ILLEGAL_GENERATION else e
                       for tp, e in answers.items()}
    topics = []
    for topic in request.topics:
        name = topic.name if version < 10 else by_id.get(topic.topic_id)
        topics.append((topic.name if version < 10 else None, topic.topic_id if version >= 10 else None,
                       [(p.partition_index, Errors.UNKNOWN_TOPIC_ID if name is None else answers[(name, p.partition_index)])
                        for p in topic.partitions]))
    return _offset_commit_response(topics, version)


# ---------------------------------------------------------------------------- OffsetFetch
#: one group's answer: (error, [(topic name, topic id, [(partition, offset, leader epoch, metadata, error)])])
_GroupOffsets = tuple[Errors, list[tuple[str | None, Any, list[tuple[int, int, int, str, Errors]]]]]


def _requested_groups(request: Any, version: int) -> list[tuple[str, list | None]]:
    """``[(group id, topics or None for all)]``; topics are ``(name or None, topic id or None, [partitions])``."""
    def topics_of(topics: Iterable | None) -> list | None:
        if topics is None:
            return None
        return [(t.name if version < 10 else None, t.topic_id if version >= 10 else None, list(t.partition_indexes))
                for t in topics]
    if version >= 8:
        return [(g.group_id, topics_of(g.topics)) for g in request.groups]
    return [(request.group_id, topics_of(request.topics))]


def _fetch_group_offsets(apis: ApiNode, group_id: str, topics: list | None, require_stable: bool,
                         version: int) -> _GroupOffsets:
    """OffsetFetch of one group (:meth:`GroupOffsets.fetch`); an unknown group has no offsets.

    A node that never held the writer lease (an in-process reader of the root: it never
    became the coordinator) answers from the committed ``__consumer_offsets`` log, as every
    reader of the root can, without taking the lease; a node that holds it, or held it and
    lost it (NOT_COORDINATOR), answers as the coordinator. A partition that cannot be read
    answers its error (the engine's message is logged: the response has no field for it).
    """
    if not group_id:
        return Errors.INVALID_GROUP_ID, []
    if apis.broker.lease is not None:
        try:
            _coordinator(apis)
        except _CoordinatorError as exc:
            return exc.error, []
    by_id, by_name = _topic_ids(apis) if version >= 10 else ({}, {})
    offsets = apis.broker.group_offsets()
    wanted: list[TopicPartitionKey] | None = None
    if topics is not None:
        wanted = []
        for name, topic_id, partitions in topics:
            name = name if version < 10 else by_id.get(topic_id)
            if name is not None:
                wanted.extend((name, p) for p in partitions)
    try:
        answer = offsets.fetch(group_id, wanted, require_stable)
    except ApiError as exc:
        log.warning("OffsetFetch of group %s: %s", group_id, exc.message)
        return append_error_to_response_error(exc.error), []

    def entry(tp: TopicPartitionKey) -> tuple[int, int, int, str, Errors]:
        om, error = answer[tp]
        if om is None or error != Errors.NO_ERROR:
            return tp[1], INVALID_OFFSET, -1, "", error
        return tp[1], om.offset, om.leader_epoch if om.leader_epoch is not None else -1, om.metadata, error

    out = []
    if topics is None:
        grouped: dict[str, list] = {}
        for tp in answer:
            grouped.setdefault(tp[0], []).append(entry(tp))
        for name, parts in grouped.items():
            if version >= 10 and name not in by_name:
                continue  # a topic deleted since: it has no id to name it by
            out.append((name, by_name.get(name), parts))
        return Errors.NO_ERROR, out
    for name, topic_id, partitions in topics:
        resolved = name if version < 10 else by_id.get(topic_id)
        if resolved is None:
            out.append((name, topic_id, [(p, INVALID_OFFSET, -1, "", Errors.UNKNOWN_TOPIC_ID) for p in partitions]))
        else:
            out.append((name, topic_id, [entry((resolved, p)) for p in partitions]))
    return Errors.NO_ERROR, out


def _offset_fetch_response(groups: list[tuple[str, list | None, _GroupOffsets]], version: int) -> Any:
    """``groups``: ``[(group id, requested topics, answer)]`` (one group before v8)."""
    if version >= 8:
        G = OffsetFetchResponse.OffsetFetchResponseGroup
        T = G.OffsetFetchResponseTopics
        return OffsetFetchResponse(throttle_time_ms=0, groups=[
            G(group_id=group_id, error_code=int(error), topics=[
                T(name=name if version < 10 else None, topic_id=topic_id if version >= 10 else None, partitions=[
                    T.OffsetFetchResponsePartitions(partition_index=p, committed_offset=o, committed_leader_epoch=e,
                                                    metadata=m, error_code=int(pe)) for p, o, e, m, pe in parts])
                for name, topic_id, parts in topics])
            for group_id, _, (error, topics) in groups])
    ((_, requested, (error, topics)),) = groups
    if version < 2 and error != Errors.NO_ERROR:
        # no top-level error before v2: every requested partition carries it (Kafka's getErrorResponse)
        topics = [(name, None, [(p, INVALID_OFFSET, -1, "", error) for p in partitions])
                  for name, _, partitions in requested or []]
    T = OffsetFetchResponse.OffsetFetchResponseTopic
    return OffsetFetchResponse(throttle_time_ms=0, error_code=int(error), topics=[
        T(name=name, partitions=[
            T.OffsetFetchResponsePartition(partition_index=p, committed_offset=o, committed_leader_epoch=e,
                                           metadata=m, error_code=int(pe)) for p, o, e, m, pe in parts])
        for name, _, parts in topics])


def _offset_fetch_error(request: Any, version: int, error: Errors) -> Any:
    return _offset_fetch_response([(group_id, topics, (error, [])) for group_id, topics
                                   in _requested_groups(request, version)], version)


def handle_offset_fetch(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """OffsetFetch: each group's committed offset, leader epoch and metadata per partition
    (offset -1, epoch -1, metadata "" when none); a null topic list (v2+) asks for every
    partition the group has an offset for; v8+ asks for several groups. With
    ``require_stable`` (v7+, KIP-447) a partition with a pending transactional commit answers
    UNSTABLE_OFFSET_COMMIT. A group-level failure is the top-level error (v2-v7), the group's
    error (v8+), or every partition's (v1)."""
    version = context.api_version
    require_stable = version >= 7 and bool(request.require_stable)
    groups = [(group_id, topics, _fetch_group_offsets(apis, group_id, topics, require_stable, version))
              for group_id, topics in _requested_groups(request, version)]
    return _offset_fetch_response(groups, version)


# ---------------------------------------------------------------------------- ListGroups / DescribeGroups
def _list_groups_error(request: Any, version: int, error: Errors) -> Any:
    return ListGroupsResponse(throttle_time_ms=0, error_code=int(error), groups=[])


def handle_list_groups(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """ListGroups (:meth:`GroupCoordinator.handle_list_groups`) plus the simple groups (module
    docstring), filtered by state (v4+, KIP-518, case-insensitive) and type (v5+: every
    group here is "classic"). COORDINATOR_LOAD_IN_PROGRESS comes with the groups loaded so far."""
    version = context.api_version
    states = [s for s in request.states_filter] if version >= 4 else []
    types = {t.lower() for t in request.types_filter} if version >= 5 else set()
    if types and CLASSIC_GROUP_TYPE not in types:
        return ListGroupsResponse(throttle_time_ms=0, error_code=0, groups=[])
    coordinator = _coordinator(apis)
    error, overviews = coordinator.handle_list_groups(states)
    listed = {(o.group_id): (o.protocol_type, o.state) for o in overviews}
    if error == Errors.NO_ERROR and (not states or GroupState.EMPTY.value.lower() in {s.lower() for s in states}):
        for group_id in sorted(_offset_groups(apis) - set(listed)):
            group = coordinator.get_group(group_id)
            if group is None or group.is_in(GroupState.DEAD):
                listed[group_id] = ("", GroupState.EMPTY.value)
    return ListGroupsResponse(throttle_time_ms=0, error_code=int(error), groups=[
        ListGroupsResponse.ListedGroup(group_id=group_id, protocol_type=protocol_type, group_state=state,
                                       group_type=CLASSIC_GROUP_TYPE)
        for group_id, (protocol_type, state) in sorted(listed.items())])


def _offset_groups(apis: ApiNode) -> set[str]:
    """Every group with committed or pending offsets (one replay of each ``__consumer_offsets`` partition)."""
    topic = apis.broker.topics().get(CONSUMER_OFFSETS_TOPIC)
    if topic is None:
        return set()
    offsets = apis.broker.group_offsets()
    groups: set[str] = set()
    for partition in range(len(topic.partitions)):
        groups.update(offsets.replay(partition))
    return groups


def _described(group_id: str, error: Errors, state: str = "", message: str | None = None) -> Any:
    return DescribeGroupsResponse.DescribedGroup(
        error_code=int(error), error_message=message, group_id=group_id, group_state=state, protocol_type="",
        protocol_data="", members=[], authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)


def _describe_groups_error(request: Any, version: int, error: Errors) -> Any:
    return DescribeGroupsResponse(throttle_time_ms=0, groups=[_described(g, error) for g in request.groups])


def handle_describe_groups(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DescribeGroups (:meth:`GroupCoordinator.handle_describe_groups`): state, protocol type,
    the selected protocol and members (their metadata and assignments only when Stable).

    A group that does not exist is Dead with NO_ERROR before v6 and GROUP_ID_NOT_FOUND
    ("Group G not found.") from v6 (KIP-1043); a simple group (module docstring) is Empty with
    protocol type "". ``include_authorized_operations`` (v3+) answers READ, DELETE and DESCRIBE
    (there is no authorizer)."""
    version = context.api_version
    coordinator = _coordinator(apis)
    with_operations = version >= 3 and bool(request.include_authorized_operations)
    groups = []
    for desc in coordinator.handle_describe_groups(list(request.groups)):
        if desc.error == Errors.NO_ERROR and desc.state == GroupState.DEAD.value and not desc.members:
            if _is_simple_group(coordinator, apis, desc.group_id):
                described = _described(desc.group_id, Errors.NO_ERROR, GroupState.EMPTY.value)
            elif version >= 6:
                described = _described(desc.group_id, Errors.GROUP_ID_NOT_FOUND, GroupState.DEAD.value,
                                       f"Group {desc.group_id} not found.")
            else:
                described = _described(desc.group_id, Errors.NO_ERROR, GroupState.DEAD.value)
        elif desc.error != Errors.NO_ERROR:
            described = _described(desc.group_id, desc.error)
        else:
            described = DescribeGroupsResponse.DescribedGroup(
                error_code=0, error_message=None, group_id=desc.group_id, group_state=desc.state,
                protocol_type=desc.protocol_type, protocol_data=desc.protocol or "", members=[
                    DescribeGroupsResponse.DescribedGroup.DescribedGroupMember(
                        member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                        client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
                    for m in desc.members],
                authorized_operations=AUTHORIZED_OPERATIONS_OMITTED)
        if with_operations and described.error_code == 0:
            described.authorized_operations = set(GROUP_AUTHORIZED_OPERATIONS)
        groups.append(described)
    return DescribeGroupsResponse(throttle_time_ms=0, groups=groups)


# ---------------------------------------------------------------------------- DeleteGroups / OffsetDelete
def _delete_groups_response(results: list[tuple[str, Errors]]) -> Any:
    return DeleteGroupsResponse(throttle_time_ms=0, results=[
        DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=int(e)) for g, e in results])


def _delete_groups_error(request: Any, version: int, error: Errors) -> Any:
    return _delete_groups_response([(g, error) for g in dict.fromkeys(request.groups_names)])


def handle_delete_groups(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DeleteGroups: an Empty group is removed with its committed and pending offsets
    (:meth:`GroupCoordinator.handle_delete_groups`, then the offsets' tombstones: Kafka's
    ``deleteAllOffsets``); a simple group (module docstring) loses its offsets. Per group:
    NO_ERROR, NON_EMPTY_GROUP (it has members), GROUP_ID_NOT_FOUND, or the write's error.
    Each group is answered once, however often it is named."""
    coordinator = _coordinator(apis)
    group_ids = list(dict.fromkeys(request.groups_names))
    answers = coordinator.handle_delete_groups(group_ids)
    results = []
    for group_id in group_ids:
        error = answers[group_id]
        if error == Errors.GROUP_ID_NOT_FOUND and _is_simple_group(coordinator, apis, group_id):
            error = Errors.NO_ERROR
        if error == Errors.NO_ERROR:
            error = _delete_all_offsets(coordinator, apis, group_id)
        results.append((group_id, error))
    return _delete_groups_response(results)


def _offset_delete_error(request: Any, version: int, error: Errors) -> Any:
    return OffsetDeleteResponse(error_code=int(error), throttle_time_ms=0, topics=[])


def handle_offset_delete(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """OffsetDelete (KIP-496): delete the group's committed offsets of some partitions.

    Top-level: INVALID_GROUP_ID (empty id), GROUP_ID_NOT_FOUND (no such group, nor a simple
    group), NON_EMPTY_GROUP (a group with members that does not use the consumer protocol:
    its subscriptions are unknown). Per partition: UNKNOWN_TOPIC_OR_PARTITION (not in the
    catalog), GROUP_SUBSCRIBED_TO_TOPIC (a member subscribes to the topic), else NO_ERROR and a
    tombstone when the partition has a committed or pending offset (Kafka's
    ``OffsetMetadataManager.deleteOffsets``)."""
    group_id = request.group_id
    if not group_id:
        return _offset_delete_error(request, context.api_version, Errors.INVALID_GROUP_ID)
    coordinator = _coordinator(apis)
    group = coordinator.get_group(group_id)
    if group is not None and group.is_in(GroupState.DEAD):
        group = None
    state = _offsets_state(apis, group_id)
    if group is None and (state is None or not (state.committed or state.pending)):
        return _offset_delete_error(request, context.api_version, Errors.GROUP_ID_NOT_FOUND)
    uses_consumer_protocol = group is not None and group.protocol_type == CONSUMER_PROTOCOL_TYPE
    if group is not None and not group.is_in(GroupState.EMPTY) and not uses_consumer_protocol:
        return _offset_delete_error(request, context.api_version, Errors.NON_EMPTY_GROUP)
    subscribed = group.subscribed_topics() if group is not None else frozenset()
    topics = apis.broker.topics()
    present = (set(state.committed) | state.pending) if state is not None else set()
    tombstones: set[TopicPartitionKey] = set()
    answers = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            meta = topics.get(topic.name)
            if meta is None or not 0 <= p.partition_index < len(meta.partitions):
                error = Errors.UNKNOWN_TOPIC_OR_PART
            elif (topic.name in subscribed) if subscribed is not None else uses_consumer_protocol:
                error = Errors.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                error = Errors.NO_ERROR
                if (topic.name, p.partition_index) in present:
                    tombstones.add((topic.name, p.partition_index))
            parts.append((p.partition_index, error))
        answers.append((topic.name, parts))
    if tombstones:
        offsets = apis.broker.group_offsets()
        with coordinator.offset_commit_guard(group_id):
            error = append_error_to_response_error(
                offsets.delete_offsets(offsets.partition_for(group_id), {group_id: tombstones}))
        if error != Errors.NO_ERROR:
            return _offset_delete_error(request, context.api_version, error)
    T = OffsetDeleteResponse.OffsetDeleteResponseTopic
    return OffsetDeleteResponse(error_code=0, throttle_time_ms=0, topics=[
        T(name=name, partitions=[T.OffsetDeleteResponsePartition(partition_index=p, error_code=int(e)) for p, e in parts])
        for name, parts in answers])


def _spec(key: ApiKey, low: int, high: int, handler: Callable, error_response: Callable) -> ApiSpec:
    return ApiSpec(key, low, high, _guarded(handler, error_response), error_response)


APIS = [
    _spec(ApiKey.FindCoordinator, 0, 6, handle_find_coordinator, _find_coordinator_error),
    _spec(ApiKey.JoinGroup, 0, 9, handle_join_group, _join_group_error),
    _spec(ApiKey.SyncGroup, 0, 5, handle_sync_group, _sync_group_error),
    _spec(ApiKey.Heartbeat, 0, 4, handle_heartbeat, _heartbeat_error),
    _spec(ApiKey.LeaveGroup, 0, 5, handle_leave_group, _leave_group_error),
    _spec(ApiKey.OffsetCommit, 2, 10, handle_offset_commit, _offset_commit_error),
    _spec(ApiKey.OffsetFetch, 1, 10, handle_offset_fetch, _offset_fetch_error),
    _spec(ApiKey.ListGroups, 0, 5, handle_list_groups, _list_groups_error),
    _spec(ApiKey.DescribeGroups, 0, 6, handle_describe_groups, _describe_groups_error),
    _spec(ApiKey.DeleteGroups, 0, 2, handle_delete_groups, _delete_groups_error),
    _spec(ApiKey.OffsetDelete, 0, 0, handle_offset_delete, _offset_delete_error),
]
