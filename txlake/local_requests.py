"""The embedded clients' requests to their engine's one request surface (issue 16).

The in-process :class:`~txlake.Producer` and :class:`~txlake.Consumer` never call the broker's
partition logs or coordinators: like a Kafka client, they send Kafka requests -- kafka-python
3's protocol messages (``ListOffsetsRequest[8](...)``) -- to
:func:`~txlake.engine.apis.local_apis` of their storage root, which answers them with the same
handlers the network server (``txlake serve``) calls. This module builds those requests and
reads their responses into the clients' shapes; it knows no Kafka semantics beyond the
protocol's fields.

Records cross in-process as objects (Kafka's ``Records`` abstraction, MemoryRecords rather
than bytes): a Produce's partition ``records`` is the client's
:class:`~txlake.engine.requests.ProduceBatch`, and a Fetch answered in-process carries the
log's rows as :class:`~txlake.engine.requests.FetchedRecords` (see
:func:`~txlake.engine.apis.log_apis.handle_produce` and ``handle_fetch``). Validation,
idempotence, the LSO and the aborted transactions are the handlers' own code for both.

Versions: the newest each handler implements that still names topics (not topic ids).

kafka-python and :mod:`txlake.engine.apis` are imported when a client is made (:func:`load`),
not with ``import txlake`` (they cost about 130 ms, which every CLI command would pay).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np
import pyarrow as pa

from txlake.engine.errors import ApiError, Errors
from txlake.engine.log_reader import visible_records
from txlake.engine.requests import FetchedRecords, ProduceBatch, ProduceResult
from txlake.formats.records import CONTROL_ABORT

if TYPE_CHECKING:
    from txlake.engine.broker import Broker

LIST_OFFSETS_VERSION = 8
OFFSET_COMMIT_VERSION = 9
OFFSET_FETCH_VERSION = 8
FETCH_VERSION = 12
PRODUCE_VERSION = 11
INIT_PRODUCER_ID_VERSION = 4
#: Kafka's ``READ_UNCOMMITTED`` / ``READ_COMMITTED`` isolation levels
ISOLATION_LEVELS = {"read_uncommitted": 0, "read_committed": 1}
#: "none" in the protocol's int fields (offsets, leader epochs)
NONE = -1

TopicPartitionKey = tuple[str, int]


def load(broker: Broker) -> None:
    """Make ``broker``'s request surface and import kafka-python's protocol messages now (the
    clients' constructors call this, so that a first ``produce()`` or ``poll()`` does not pay
    for importing every handler module)."""
    import kafka.protocol.consumer  # noqa: F401
    import kafka.protocol.producer  # noqa: F401

    from txlake.engine.apis import local_apis

    local_apis(broker)


def _by_topic(items: Iterable[tuple[str, Any]]) -> dict[str, list]:
    """``[(topic, x)]`` grouped by topic, in order of first appearance."""
    out: dict[str, list] = {}
    for topic, x in items:
        out.setdefault(topic, []).append(x)
    return out


# ---------------------------------------------------------------------------------- ListOffsets
def list_offsets(broker: Broker, wanted: list[tuple[str, int, int]], isolation: str = "read_uncommitted"
                 ) -> list[tuple[Errors, int, int]]:
    """ListOffsets: for each ``(topic, partition, timestamp)`` -- a timestamp (ms) or -2
    earliest / -1 latest / -3 max timestamp -- ``(error, offset, timestamp)`` in the same order
    (offset -1 when no record has a timestamp at or after it). One request names a partition
    once (Kafka refuses duplicates): a partition asked for again goes in a further request."""
    from kafka.protocol.consumer import ListOffsetsRequest
    from txlake.engine.apis import local_apis

    R = ListOffsetsRequest[LIST_OFFSETS_VERSION]
    T = R.ListOffsetsTopic
    out: list = [None] * len(wanted)
    todo = list(range(len(wanted)))
    while todo:
        now: dict[TopicPartitionKey, int] = {}
        later = []
        for i in todo:
            key = wanted[i][:2]
            (later.append(i) if key in now else now.__setitem__(key, i))
        request = R(replica_id=NONE, isolation_level=ISOLATION_LEVELS[isolation], topics=[
            T(name=topic, partitions=[T.ListOffsetsPartition(partition_index=p, timestamp=wanted[now[(topic, p)]][2])
                                      for p in parts])
            for topic, parts in _by_topic(now).items()])
        for t in local_apis(broker).call(request).topics:
            for p in t.partitions:
                out[now[(t.name, p.partition_index)]] = (Errors(p.error_code), p.offset, p.timestamp)
        todo = later
    return out


# ---------------------------------------------------------------------------------- OffsetCommit / OffsetFetch
def offset_commit(broker: Broker, group_id: str, offsets: Iterable[Any], generation: int, member_id: str,
                  group_instance_id: str | None) -> dict[TopicPartitionKey, Errors]:
    """OffsetCommit of ``offsets`` (TopicPartitions with ``offset``, ``metadata`` and
    ``leader_epoch``: None is sent as -1, "no epoch") by the member ``(generation, member_id,
    group_instance_id)`` (generation -1 and member id "" for a consumer outside the group
    protocol): each partition's error code."""
    from kafka.protocol.consumer import OffsetCommitRequest
    from txlake.engine.apis import local_apis

    R = OffsetCommitRequest[OFFSET_COMMIT_VERSION]
    T = R.OffsetCommitRequestTopic
    P = T.OffsetCommitRequestPartition
    request = R(group_id=group_id, generation_id_or_member_epoch=generation, member_id=member_id,
                group_instance_id=group_instance_id, topics=[
                    T(name=topic, partitions=parts) for topic, parts in _by_topic(
                        (tp.topic, P(partition_index=tp.partition, committed_offset=tp.offset,
                                     committed_leader_epoch=NONE if tp.leader_epoch is None else tp.leader_epoch,
                                     committed_metadata=tp.metadata)) for tp in offsets).items()])
    response = local_apis(broker).call(request)
    return {(t.name, p.partition_index): Errors(p.error_code) for t in response.topics for p in t.partitions}


def offset_fetch(broker: Broker, group_id: str, partitions: list[TopicPartitionKey], require_stable: bool
                 ) -> tuple[Errors, dict[TopicPartitionKey, tuple[int, int | None, str | None, Errors]]]:
    """OffsetFetch of one group: ``(group error, {(topic, partition): (offset, leader epoch,
    metadata, error)})`` -- offset -1, epoch None and metadata None where nothing is committed.
    ``require_stable`` (KIP-447): UNSTABLE_OFFSET_COMMIT where a transaction holds a pending
    offset."""
    from kafka.protocol.consumer import OffsetFetchRequest
    from txlake.engine.apis import local_apis

    R = OffsetFetchRequest[OFFSET_FETCH_VERSION]
    G = R.OffsetFetchRequestGroup
    request = R(require_stable=require_stable, groups=[G(group_id=group_id, topics=[
        G.OffsetFetchRequestTopics(name=topic, partition_indexes=parts)
        for topic, parts in _by_topic(partitions).items()])])
    (group,) = local_apis(broker).call(request).groups
    out = {}
    for t in group.topics:
        for p in t.partitions:
            none = p.committed_offset < 0
            out[(t.name, p.partition_index)] = (
                p.committed_offset, None if p.committed_leader_epoch < 0 else p.committed_leader_epoch,
                None if none else p.metadata, Errors(p.error_code))
    return Errors(group.error_code), out


# ---------------------------------------------------------------------------------- Fetch
def fetch(broker: Broker, topic: str, partition: int, offset: int, isolation: str, max_bytes: int,
          partition_max_bytes: int) -> tuple[Any, FetchedRecords]:
    """Fetch one partition from ``offset`` without waiting (max wait 0, min bytes 1): ``(the
    response's partition data, its records)``, the records being the log's rows (control and
    aborted records included: see :func:`visible`) with the engine's error message.

    Raises:
        ApiError: the request failed as a whole (UNKNOWN_SERVER_ERROR: the handler failed).
    """
    from kafka.protocol.consumer import FetchRequest
    from txlake.engine.apis import local_apis

    R = FetchRequest[FETCH_VERSION]
    T = R.FetchTopic
    request = R(replica_id=NONE, max_wait_ms=0, min_bytes=1, max_bytes=max_bytes,
                isolation_level=ISOLATION_LEVELS[isolation], session_id=0, session_epoch=NONE, topics=[
                    T(topic=topic, partitions=[T.FetchPartition(partition=partition, fetch_offset=offset,
                                                                partition_max_bytes=partition_max_bytes)])],
                forgotten_topics_data=[], rack_id="")
    response = local_apis(broker).call(request)
    if response.error_code:   # the whole request failed (the engine logged why)
        error = Errors(response.error_code)
        raise ApiError(error, f"Fetch of {topic} [{partition}] answered {error.name}")
    (answer,) = response.responses
    (part,) = answer.partitions
    return part, part.records


def visible(records: FetchedRecords, aborted_transactions: list | None) -> pa.Table:
    """The records a consumer returns from a Fetch's rows (Kafka's ``CompletedFetch``): control
    records dropped and, under read_committed, the transactional records of each aborted
    transaction -- ``(producer id, first offset)`` as the response names it -- from its first
    offset up to that producer's ABORT marker (to the end of the rows when the marker is not
    among them)."""
    rows = records.rows
    if not aborted_transactions:
        return visible_records(rows, [])
    markers = None
    ranges = []
    for txn in aborted_transactions:
        if markers is None:
            control = rows.column("is_control").to_numpy(zero_copy_only=False)
            abort = control & (rows.column("control_type").fill_null(-1).to_numpy() == CONTROL_ABORT)
            markers = (rows.column("producer_id").to_numpy()[abort], rows.column("offset").to_numpy()[abort])
        pids, offsets = markers
        ends = offsets[(pids == txn.producer_id) & (offsets >= txn.first_offset)]
        ranges.append(_AbortedRange(txn.producer_id, txn.first_offset,
                                    int(ends.min()) if ends.size else int(np.iinfo(np.int64).max)))
    return visible_records(rows, ranges)


class _AbortedRange:
    """An aborted transaction's records: ``producer_id`` from ``first_offset`` to ``last_offset``."""

    __slots__ = ("producer_id", "first_offset", "last_offset")

    def __init__(self, producer_id: int, first_offset: int, last_offset: int):
        self.producer_id, self.first_offset, self.last_offset = producer_id, first_offset, last_offset


# ---------------------------------------------------------------------------------- Produce / InitProducerId
def produce(broker: Broker, batch: ProduceBatch, timeout_ms: int, transactional_id: str | None = None) -> Future:
    """Produce one batch with acks=all: a Future of its :class:`ProduceResult` (the base
    offset and log-append time once committed, or the error and the engine's message). A
    refusal (validation, idempotence) is answered before this returns. A transactional
    batch names its producer's ``transactional_id`` (Kafka's Produce requires it)."""
    from kafka.protocol.producer import ProduceRequest
    from txlake.engine.apis import local_apis

    R = ProduceRequest[PRODUCE_VERSION]
    T = R.TopicProduceData
    request = R(transactional_id=transactional_id, acks=-1, timeout_ms=timeout_ms, topic_data=[
        T(name=batch.topic, partition_data=[T.PartitionProduceData(index=batch.partition, records=batch)])])
    out: Future = Future()

    def answered(response: Any) -> None:
        (t,) = response.responses
        (p,) = t.partition_responses
        out.set_result(ProduceResult(Errors(p.error_code), p.base_offset, p.log_append_time_ms,
                                     p.error_message or ""))

    answer = local_apis(broker).send(request)
    if isinstance(answer, Future):
        answer.add_done_callback(lambda f: out.set_exception(f.exception()) if f.exception() else answered(f.result()))
    else:
        answered(answer)
    return out


def init_producer_id(broker: Broker) -> tuple[Errors, int, int]:
    """InitProducerId of an idempotent (non-transactional) producer: ``(error, producer id, epoch)``."""
    from kafka.protocol.producer import InitProducerIdRequest
    from txlake.engine.apis import local_apis

    request = InitProducerIdRequest[INIT_PRODUCER_ID_VERSION](transactional_id=None, transaction_timeout_ms=-1,
                                                              producer_id=NONE, producer_epoch=NONE)
    response = local_apis(broker).call(request)
    return Errors(response.error_code), response.producer_id, response.producer_epoch
