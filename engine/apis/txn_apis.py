"""Transaction APIs: AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit,
DescribeTransactions, ListTransactions, WriteTxnMarkers (Kafka's
``KafkaApis.handleAddPartitionsToTxnRequest`` ... ``handleListTransactionsRequest``, KIP-98,
KIP-447, KIP-664, KIP-890 part 1). InitProducerId is :mod:`.log_apis`' handler (one for the
idempotent and the transactional form); FindCoordinator for TRANSACTION keys is
:mod:`.group_apis`' (this node coordinates every transactional id).

The handlers translate Kafka's request messages into calls of the engine's transaction
coordinator (:class:`~txlake.engine.transaction_coordinator.TransactionCoordinator`), of the
consumer-group offsets (TxnOffsetCommit: :meth:`~txlake.engine.group_offsets.GroupOffsets.commit_transactional`)
and of the KIP-664 admin (:class:`~txlake.engine.transaction_admin.TransactionAdmin`), and
their answers back, with Kafka's version-dependent error codes: PRODUCER_FENCED is answered
INVALID_PRODUCER_EPOCH to AddPartitionsToTxn, AddOffsetsToTxn and EndTxn below v2 and to
InitProducerId below v4; COORDINATOR_LOAD_IN_PROGRESS is answered COORDINATOR_NOT_AVAILABLE
to TxnOffsetCommit below v2. A coordinator that is not here (this server lost the writer
lease) answers NOT_COORDINATOR, so a client looks it up again.

**Versions** (each the highest of Kafka's schema this engine honours): AddPartitionsToTxn 0-5
(v0-3 the client form; v4+ the brokers' batched form, with ``verify_only``; without it the
transaction version 2 add), AddOffsetsToTxn 0-4, EndTxn 0-5, TxnOffsetCommit 0-5,
DescribeTransactions 0, ListTransactions 0-2 (duration filter v1+, KIP-994; transactional id
pattern v2+, KIP-1152), WriteTxnMarkers 1-2.

**Transaction version 2** (KIP-890 part 2; a client uses it when ApiVersions finalizes the
``transaction.version`` feature at 2, :func:`finalized_transaction_version`): EndTxn v5 bumps
the producer epoch at every commit and abort and answers the new producer id and epoch;
TxnOffsetCommit v5 adds the group's ``__consumer_offsets`` partition to the transaction itself
(no AddOffsetsToTxn), as Produce v12 does with its partitions (:mod:`.log_apis`). Older
versions keep part 1: the client adds, the broker only verifies.
"""

from __future__ import annotations

import logging
from typing import Any

from kafka.protocol.admin import (DescribeTransactionsResponse, ListTransactionsResponse)
from kafka.protocol.api_key import ApiKey
from kafka.protocol.producer import (AddOffsetsToTxnResponse, AddPartitionsToTxnResponse, EndTxnResponse,
                                     TxnOffsetCommitResponse, WriteTxnMarkersResponse)

from txlake.catalog.topic_names import is_internal

from ..errors import ApiError, Errors
from ..group_coordinator import append_error_to_response_error
from ..group_offsets import OffsetAndMetadata, TopicPartitionKey
from ..requests import TxnMarker
from ..transaction_admin import DescribedTransaction, TransactionAdmin
from ..transaction_coordinator import TransactionCoordinator
from .api_spec import ApiNode, RequestContext
from .group_apis import _CoordinatorError, _spec

log = logging.getLogger(__name__)

#: the first version of each API that understands PRODUCER_FENCED (older ones get INVALID_PRODUCER_EPOCH)
PRODUCER_FENCED_SINCE = {ApiKey.AddPartitionsToTxn: 2, ApiKey.AddOffsetsToTxn: 2, ApiKey.EndTxn: 2,
                         ApiKey.InitProducerId: 4}
#: the first TxnOffsetCommit version told TRANSACTION_ABORTABLE when KIP-890 verification finds the
#: group's partition outside the transaction (Kafka's ``CoordinatorPartitionWriter``: ``genericError``
#: from v4; older versions get INVALID_TXN_STATE, which the Java client takes as fatal)
TXN_OFFSET_COMMIT_ABORTABLE_SINCE = 4
#: AddPartitionsToTxn: versions 4+ are the brokers' batched form (Kafka's ``EARLIEST_BROKER_VERSION``)
ADD_PARTITIONS_BROKER_VERSION = 4
#: the first EndTxn / TxnOffsetCommit / Produce version of a transaction version 2 client (KIP-890
#: part 2; Kafka's ``EndTxnRequest.isTransactionV2Requested`` and its siblings)
END_TXN_V2_SINCE = 5
TXN_OFFSET_COMMIT_V2_SINCE = 5
PRODUCE_V2_SINCE = 12
#: Kafka's feature name of the transaction version (``TransactionVersion.FEATURE_NAME``) and the levels served
TRANSACTION_VERSION_FEATURE = "transaction.version"
TRANSACTION_VERSION_LEVELS = (0, 2)


def finalized_transaction_version(apis: ApiNode) -> int:
    """The ``transaction.version`` feature level this server finalizes in ApiVersions (the
    broker config ``transaction.version``, default 2; Kafka's level set with
    ``kafka-storage format --feature transaction.version=N`` or ``kafka-features.sh upgrade``).
    A Kafka 4.x client uses transaction version 2 only when it is 2."""
    return apis.broker.transaction_version()


def implicit_add_error(error: Errors) -> Errors:
    """A transaction version 2 implicit add's refusal as a Produce or TxnOffsetCommit answers it
    (Kafka's ``AddPartitionsToTxnManager`` and ``ReplicaManager.handleProduceAppend``):
    PRODUCER_FENCED is INVALID_PRODUCER_EPOCH; a refusal the client should simply retry
    (CONCURRENT_TRANSACTIONS, the coordinator loading, moving or unavailable) is
    NOT_ENOUGH_REPLICAS, which every client retries without a metadata refresh."""
    if error == Errors.PRODUCER_FENCED:
        return Errors.INVALID_PRODUCER_EPOCH
    if error in (Errors.CONCURRENT_TRANSACTIONS, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                 Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR):
        return Errors.NOT_ENOUGH_REPLICAS
    return error


def transaction_coordinator(apis: ApiNode) -> TransactionCoordinator:
    """The engine's transaction coordinator (started on first use), or :class:`_CoordinatorError`
    with Kafka's answer for a coordinator that is not here: NOT_COORDINATOR when this process
    cannot be the writer (another holds the lease, or it lost it), COORDINATOR_NOT_AVAILABLE
    when the engine is closing or the coordinator failed to load."""
    try:
        return apis.broker.transaction_coordinator()
    except ApiError as exc:
        log.warning("the transaction coordinator is not available: %s %s", exc.error.name, exc.message)
        fenced = exc.error in (Errors.NOT_LEADER_OR_FOLLOWER, Errors._FENCED, Errors.NOT_COORDINATOR)
        raise _CoordinatorError(Errors.NOT_COORDINATOR if fenced else Errors.COORDINATOR_NOT_AVAILABLE) from exc


def for_version(error: Errors, key: ApiKey, version: int) -> Errors:
    """``error`` as a client of ``key`` at ``version`` understands it (Kafka's ``finalError``)."""
    if error == Errors.PRODUCER_FENCED and version < PRODUCER_FENCED_SINCE.get(key, 0):
        return Errors.INVALID_PRODUCER_EPOCH
    return error


def _wire(error: Errors) -> Errors:
    """No client-local (negative) code goes on the wire: a lost lease is NOT_LEADER_OR_FOLLOWER."""
    if error >= Errors.UNKNOWN_SERVER_ERROR:
        return error
    return Errors.NOT_LEADER_OR_FOLLOWER if error == Errors._FENCED else Errors.UNKNOWN_SERVER_ERROR


# ---------------------------------------------------------------------------- AddPartitionsToTxn
#: one transaction of an AddPartitionsToTxn: (transactional id, producer id, epoch, verify only, partitions)
_Txn = tuple[str, int, int, bool, list[TopicPartitionKey]]


def _transactions(request: Any, version: int) -> list[_Txn]:
    """The transactions of a request: one (the v0-3 client form) or a batch (v4+)."""
    def partitions(topics) -> list[TopicPartitionKey]:
        return [(t.name, p) for t in topics for p in t.partitions]
    if version < ADD_PARTITIONS_BROKER_VERSION:
        return [(request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
                 request.v3_and_below_producer_epoch, False, partitions(request.v3_and_below_topics))]
    return [(t.transactional_id, t.producer_id, t.producer_epoch, bool(t.verify_only), partitions(t.topics))
            for t in request.transactions]


def _topic_results(answers: dict[TopicPartitionKey, Errors]) -> list:
    R = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
    by_topic: dict[str, list] = {}
    for (topic, partition), error in answers.items():
        by_topic.setdefault(topic, []).append(R.AddPartitionsToTxnPartitionResult(
            partition_index=partition, partition_error_code=int(error)))
    return [R(name=topic, results_by_partition=parts) for topic, parts in by_topic.items()]


def _add_partitions_response(results: list[tuple[str, dict[TopicPartitionKey, Errors]]], version: int,
                             error: Errors = Errors.NO_ERROR) -> Any:
    if version < ADD_PARTITIONS_BROKER_VERSION:
        ((_, answers),) = results
        return AddPartitionsToTxnResponse(throttle_time_ms=0, results_by_topic_v3_and_below=_topic_results(answers))
    return AddPartitionsToTxnResponse(throttle_time_ms=0, error_code=int(error), results_by_transaction=[
        AddPartitionsToTxnResponse.AddPartitionsToTxnResult(transactional_id=tid, topic_results=_topic_results(answers))
        for tid, answers in results])


def _add_partitions_error(request: Any, version: int, error: Errors) -> Any:
    if version < ADD_PARTITIONS_BROKER_VERSION:
        return _add_partitions_response([(tid, dict.fromkeys(parts, error))
                                         for tid, _, _, _, parts in _transactions(request, version)], version)
    return _add_partitions_response([], version, error)  # Kafka's top-level error of the batched form


def _checked_partitions(apis: ApiNode, partitions: list[TopicPartitionKey], client: bool) -> dict | None:
    """Kafka's checks before the coordinator sees the partitions: a client (v0-3) may not add an
    internal topic (TOPIC_AUTHORIZATION_FAILED: internal topics are outside a client's WRITE
    authorization); a partition the catalog does not have answers UNKNOWN_TOPIC_OR_PARTITION.
    Any failure fails the whole transaction: the other partitions answer OPERATION_NOT_ATTEMPTED.
    None when every partition passed."""
    topics = apis.broker.topics()
    failed: dict[TopicPartitionKey, Errors] = {}
    for topic, partition in partitions:
        if client and is_internal(topic):
            failed[(topic, partition)] = Errors.TOPIC_AUTHORIZATION_FAILED
        elif topic not in topics or not 0 <= partition < len(topics[topic].partitions):
            failed[(topic, partition)] = Errors.UNKNOWN_TOPIC_OR_PART
    if not failed:
        return None
    return {tp: failed.get(tp, Errors.OPERATION_NOT_ATTEMPTED) for tp in partitions}


def handle_add_partitions_to_txn(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """AddPartitionsToTxn: add each transaction's partitions to it
    (:meth:`TransactionCoordinator.handle_add_partitions_to_txn`), or with ``verify_only`` (v4+,
    KIP-890 part 1) only check that they are in it
    (:meth:`TransactionCoordinator.handle_verify_partitions_in_transaction`: TRANSACTION_ABORTABLE
    for a partition that is not).

    Per partition: NO_ERROR; TOPIC_AUTHORIZATION_FAILED (an internal topic, v0-3),
    UNKNOWN_TOPIC_OR_PARTITION, and OPERATION_NOT_ATTEMPTED for the other partitions of such a
    transaction; else the coordinator's one answer for all of them (INVALID_PRODUCER_ID_MAPPING,
    PRODUCER_FENCED -- INVALID_PRODUCER_EPOCH below v2 --, CONCURRENT_TRANSACTIONS, ...). A v4+
    transaction without a transactional id makes the whole request INVALID_REQUEST (Kafka's
    ``InvalidRequestException``)."""
    version = context.api_version
    txns = _transactions(request, version)
    if any(tid is None for tid, *_ in txns):
        return _add_partitions_error(request, version, Errors.INVALID_REQUEST)
    client = version < ADD_PARTITIONS_BROKER_VERSION
    results = []
    for tid, producer_id, epoch, verify_only, partitions in txns:
        answers = _checked_partitions(apis, partitions, client)
        if answers is None:
            coordinator = transaction_coordinator(apis)
            if verify_only:
                answers = coordinator.handle_verify_partitions_in_transaction(tid, producer_id, epoch, partitions)
            else:  # from a broker (v4+) it is the implicit add of a transaction version 2 Produce
                answers = coordinator.handle_add_partitions_to_txn(tid, producer_id, epoch, partitions,
                                                                   transaction_version=0 if client else 2)
            answers = {tp: for_version(e, ApiKey.AddPartitionsToTxn, version) for tp, e in answers.items()}
        results.append((tid, {tp: answers[tp] for tp in partitions}))
    return _add_partitions_response(results, version)


# ---------------------------------------------------------------------------- AddOffsetsToTxn / EndTxn
def _add_offsets_error(request: Any, version: int, error: Errors) -> Any:
    return AddOffsetsToTxnResponse(throttle_time_ms=0, error_code=int(error))


def handle_add_offsets_to_txn(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """AddOffsetsToTxn: the group's ``__consumer_offsets`` partition joins the transaction
    (:meth:`TransactionCoordinator.handle_add_offsets_to_txn`); INVALID_GROUP_ID for an empty
    group id, else the coordinator's answer as for AddPartitionsToTxn."""
    error = transaction_coordinator(apis).handle_add_offsets_to_txn(
        request.transactional_id, request.producer_id, request.producer_epoch, request.group_id)
    return _add_offsets_error(request, context.api_version, for_version(error, ApiKey.AddOffsetsToTxn,
                                                                         context.api_version))


def _end_txn_error(request: Any, version: int, error: Errors, producer_id: int = -1, producer_epoch: int = -1) -> Any:
    return EndTxnResponse(throttle_time_ms=0, error_code=int(error), producer_id=producer_id,
                          producer_epoch=producer_epoch)


def handle_end_txn(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """EndTxn: commit or abort (:meth:`TransactionCoordinator.handle_end_transaction`), answered
    once the markers and CompleteCommit/CompleteAbort are written. NO_ERROR for a retry after
    completion; INVALID_TXN_STATE (the opposite outcome, or no transaction),
    CONCURRENT_TRANSACTIONS, PRODUCER_FENCED (INVALID_PRODUCER_EPOCH below v2),
    INVALID_PRODUCER_ID_MAPPING. v5+ is transaction version 2 (KIP-890 part 2): the epoch is
    bumped and the response carries the producer id and epoch the client uses next."""
    version = context.api_version
    coordinator = transaction_coordinator(apis)
    if version >= END_TXN_V2_SINCE:
        error, producer_id, producer_epoch = coordinator.handle_end_transaction(
            request.transactional_id, request.producer_id, request.producer_epoch, bool(request.committed),
            transaction_version=2)
    else:
        error, producer_id, producer_epoch = coordinator.handle_end_txn(
            request.transactional_id, request.producer_id, request.producer_epoch, bool(request.committed)), -1, -1
    return _end_txn_error(request, version, for_version(error, ApiKey.EndTxn, version), producer_id, producer_epoch)


# ---------------------------------------------------------------------------- TxnOffsetCommit
def _txn_offset_commit_response(answers: list[tuple[str, list[tuple[int, Errors]]]], version: int) -> Any:
    T = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
    if version < 2:  # KAFKA-7296: clients before 2.0 do not retry COORDINATOR_LOAD_IN_PROGRESS
        answers = [(name, [(p, Errors.COORDINATOR_NOT_AVAILABLE if e == Errors.COORDINATOR_LOAD_IN_PROGRESS else e)
                           for p, e in parts]) for name, parts in answers]
    return TxnOffsetCommitResponse(throttle_time_ms=0, topics=[
        T(name=name, partitions=[T.TxnOffsetCommitResponsePartition(partition_index=p, error_code=int(e))
                                 for p, e in parts]) for name, parts in answers])


def _txn_offset_commit_error(request: Any, version: int, error: Errors) -> Any:
    return _txn_offset_commit_response([(t.name, [(p.partition_index, error) for p in t.partitions])
                                        for t in request.topics], version)


def handle_txn_offset_commit(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """TxnOffsetCommit (KIP-98; KIP-447's generation id, member id and group instance id from
    v3): the offsets are written to the group's ``__consumer_offsets`` partition inside the
    producer's transaction (:meth:`GroupOffsets.commit_transactional`) and count once it commits;
    until then OffsetFetch with ``require_stable`` answers UNSTABLE_OFFSET_COMMIT for them.

    Per partition: UNKNOWN_TOPIC_OR_PARTITION (not in the catalog, Kafka's metadata check);
    INVALID_GROUP_ID (empty group id); the group coordinator's fencing (ILLEGAL_GENERATION,
    UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID); OFFSET_METADATA_TOO_LARGE; INVALID_TXN_STATE when
    the group's partition is not in the producer's transaction at the coordinator (KIP-890
    verification: AddOffsetsToTxn did not add it, or -- after a crash -- its answer was not yet
    durable), TRANSACTION_ABORTABLE for that from v4 (:data:`TXN_OFFSET_COMMIT_ABORTABLE_SINCE`),
    so the client aborts and retries the transaction; INVALID_PRODUCER_EPOCH for a fenced
    epoch; NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE.

    v5+ (transaction version 2, KIP-890 part 2): the group's partition is first added to the
    transaction by the coordinator itself (no AddOffsetsToTxn); its refusal answers every
    partition (:func:`implicit_add_error`)."""
    version = context.api_version
    topics = apis.broker.topics()
    offsets: dict[TopicPartitionKey, OffsetAndMetadata] = {}
    answers: dict[TopicPartitionKey, Errors] = {}
    for topic in request.topics:
        known = topics.get(topic.name)
        for p in topic.partitions:
            tp = (topic.name, p.partition_index)
            if known is None or not 0 <= p.partition_index < len(known.partitions):
                answers[tp] = Errors.UNKNOWN_TOPIC_OR_PART
                continue
            epoch = p.committed_leader_epoch if version >= 2 else -1
            offsets[tp] = OffsetAndMetadata(p.committed_offset, p.committed_metadata or "",
                                            leader_epoch=epoch if epoch >= 0 else None)
    if offsets:
        added = Errors.NO_ERROR
        if request.group_id and version >= TXN_OFFSET_COMMIT_V2_SINCE:
            added = implicit_add_error(transaction_coordinator(apis).handle_add_offsets_to_txn(
                request.transactional_id, request.producer_id, request.producer_epoch, request.group_id,
                transaction_version=2))
        if not request.group_id:
            answers.update(dict.fromkeys(offsets, Errors.INVALID_GROUP_ID))
        elif added != Errors.NO_ERROR:
            answers.update(dict.fromkeys(offsets, added))
        else:
            group_offsets = apis.broker.group_offsets()
            committed = group_offsets.commit_transactional(
                request.group_id, offsets, request.producer_id, request.producer_epoch,
                request.generation_id if version >= 3 else -1, (request.member_id or "") if version >= 3 else "",
                request.group_instance_id if version >= 3 else None)
            answers.update({tp: append_error_to_response_error(e) for tp, e in committed.items()})
            if version >= TXN_OFFSET_COMMIT_ABORTABLE_SINCE:
                answers.update({tp: Errors.TRANSACTION_ABORTABLE for tp in offsets
                                if answers[tp] == Errors.INVALID_TXN_STATE})
    return _txn_offset_commit_response([(t.name, [(p.partition_index, _wire(answers[(t.name, p.partition_index)]))
                                                  for p in t.partitions]) for t in request.topics], version)


# ---------------------------------------------------------------------------- DescribeTransactions / ListTransactions
def _describe_transactions_response(described: list) -> Any:
    """The response; an entry with an error carries only its code and transactional id, its
    other fields at the schema's zero defaults (producer id 0, epoch 0, start time 0), as
    Kafka's ``TransactionCoordinator.handleDescribeTransactions`` answers."""
    S = DescribeTransactionsResponse.TransactionState
    states = []
    for d in described:
        if d.error != Errors.NO_ERROR:
            states.append(S(error_code=int(_wire(d.error)), transactional_id=d.transactional_id, transaction_state="",
                            transaction_timeout_ms=0, transaction_start_time_ms=0, producer_id=0, producer_epoch=0,
                            topics=[]))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, partition in d.topic_partitions:
            by_topic.setdefault(topic, []).append(partition)
        states.append(S(error_code=int(_wire(d.error)), transactional_id=d.transactional_id,
                        transaction_state=d.state, transaction_timeout_ms=d.transaction_timeout_ms,
                        transaction_start_time_ms=d.transaction_start_time_ms, producer_id=d.producer_id,
                        producer_epoch=d.producer_epoch,
                        topics=[S.TopicData(topic=t, partitions=ps) for t, ps in by_topic.items()]))
    return DescribeTransactionsResponse(throttle_time_ms=0, transaction_states=states)


def _describe_transactions_error(request: Any, version: int, error: Errors) -> Any:
    return _describe_transactions_response([DescribedTransaction(tid, error) for tid in request.transactional_ids])


def handle_describe_transactions(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """DescribeTransactions (KIP-664; Kafka's ``TransactionCoordinator.handleDescribeTransactions``):
    per id its state, producer id and epoch, timeout, start time (ms, -1 if none) and partitions;
    TRANSACTIONAL_ID_NOT_FOUND (unknown or expired), INVALID_REQUEST (empty id)."""
    return _describe_transactions_response(
        TransactionAdmin(apis.broker).handle_describe_transactions(list(request.transactional_ids)))


def _list_transactions_error(request: Any, version: int, error: Errors) -> Any:
    return ListTransactionsResponse(throttle_time_ms=0, error_code=int(error), unknown_state_filters=[],
                                    transaction_states=[])


def handle_list_transactions(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """ListTransactions (KIP-664): the transactional ids with their producer id and state,
    filtered by state names (unknown ones are answered back), producer ids, v1+ a minimum
    running time (ms, KIP-994) and v2+ a regular expression the whole id must match (KIP-1152;
    INVALID_REGULAR_EXPRESSION when it does not compile)."""
    version = context.api_version
    listed = TransactionAdmin(apis.broker).handle_list_transactions(
        list(request.state_filters), list(request.producer_id_filters),
        request.duration_filter if version >= 1 else -1,
        request.transactional_id_pattern if version >= 2 else None)
    return ListTransactionsResponse(
        throttle_time_ms=0, error_code=int(_wire(listed.error)), unknown_state_filters=list(listed.unknown_state_filters),
        transaction_states=[ListTransactionsResponse.TransactionState(
            transactional_id=t.transactional_id, producer_id=t.producer_id, transaction_state=t.state)
            for t in listed.transaction_states])


# ---------------------------------------------------------------------------- WriteTxnMarkers
def _write_txn_markers_response(request: Any, answers: list[dict[TopicPartitionKey, Errors]]) -> Any:
    R = WriteTxnMarkersResponse.WritableTxnMarkerResult
    markers = []
    for marker, answer in zip(request.markers, answers):
        markers.append(R(producer_id=marker.producer_id, topics=[
            R.WritableTxnMarkerTopicResult(name=t.name, partitions=[
                R.WritableTxnMarkerTopicResult.WritableTxnMarkerPartitionResult(
                    partition_index=p, error_code=int(_wire(answer[(t.name, p)]))) for p in t.partition_indexes])
            for t in marker.topics]))
    return WriteTxnMarkersResponse(markers=markers)


def _write_txn_markers_error(request: Any, version: int, error: Errors) -> Any:
    return _write_txn_markers_response(request, [
        {(t.name, p): error for t in m.topics for p in t.partition_indexes} for m in request.markers])


def handle_write_txn_markers(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """WriteTxnMarkers (as ``Admin.abortTransaction`` / ``kafka-transactions.sh abort`` send it to
    the partition leader): append each marker's COMMIT or ABORT control batch to its partitions
    and answer once committed (:meth:`TransactionAdmin.handle_write_txn_markers`). Per partition:
    NO_ERROR, UNKNOWN_TOPIC_OR_PARTITION, INVALID_PRODUCER_EPOCH (an older producer epoch),
    TRANSACTION_COORDINATOR_FENCED (an older coordinator epoch), REQUEST_TIMED_OUT."""
    markers = [TxnMarker(m.producer_id, m.producer_epoch, m.coordinator_epoch, bool(m.transaction_result),
                         tuple((t.name, p) for t in m.topics for p in t.partition_indexes))
               for m in request.markers]
    answers = TransactionAdmin(apis.broker).handle_write_txn_markers(markers)
    return _write_txn_markers_response(request, [{tp: error for tp, (error, _) in a.items()} for a in answers])


APIS = [
    _spec(ApiKey.AddPartitionsToTxn, 0, 5, handle_add_partitions_to_txn, _add_partitions_error),
    _spec(ApiKey.AddOffsetsToTxn, 0, 4, handle_add_offsets_to_txn, _add_offsets_error),
    _spec(ApiKey.EndTxn, 0, 5, handle_end_txn, _end_txn_error),
    _spec(ApiKey.TxnOffsetCommit, 0, 5, handle_txn_offset_commit, _txn_offset_commit_error),
    _spec(ApiKey.DescribeTransactions, 0, 0, handle_describe_transactions, _describe_transactions_error),
    _spec(ApiKey.ListTransactions, 0, 2, handle_list_transactions, _list_transactions_error),
    _spec(ApiKey.WriteTxnMarkers, 1, 2, handle_write_txn_markers, _write_txn_markers_error),
]
