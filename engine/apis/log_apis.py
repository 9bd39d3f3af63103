"""Log APIs: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, InitProducerId (Kafka's
``KafkaApis.handleProduceRequest``, ``handleFetchRequest``, ``handleListOffsetRequest``,
``handleOffsetForLeaderEpochRequest``, ``handleInitProducerIdRequest``).

Record batches cross this layer as Kafka's wire bytes (message format v2): a Produce's
``records`` are decoded into the log's Arrow columns by :mod:`txlake.formats.record_batch`
(offsets are assigned by the log), a Fetch's are encoded from the rows the log reader
returns, batch by batch with their producer id, epoch, sequence and control flag, so
clients see exactly the batches and offsets the log holds.

In-process callers (the embedded clients, :meth:`KafkaApis.call`) pass records as objects
instead, as Kafka's ``Records`` abstraction lets a request carry ``MemoryRecords`` rather
than bytes: a Produce partition's ``records`` may be a :class:`ProduceBatch` (already in the
log's columns), and a Fetch answered to a context with ``in_process`` carries
:class:`FetchedRecords` (the same rows the wire would encode). Nothing is encoded only to be
decoded again; everything else -- validation, idempotence, byte limits, LSO, aborted
transactions, errors -- is the same code for both.

Leader epochs: every partition's leader epoch is the writer lease's epoch
(:attr:`KafkaApis.leader_epoch`). A Fetch or ListOffsets naming an older current leader
epoch answers FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH (KIP-320). The log
never truncates what it acknowledged, so OffsetForLeaderEpoch answers the high watermark as
the end offset of any epoch up to the current one: a client never has to truncate.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any, Callable

import numpy as np
from kafka.protocol.api_key import ApiKey
from kafka.protocol.consumer import (FetchResponse, ListOffsetsResponse,
                                     OffsetForLeaderEpochResponse)
from kafka.protocol.producer import InitProducerIdResponse, ProduceResponse

from txlake.formats.errors import RecordBatchError
from txlake.formats.record_batch import decode_batches, encode_batches
from txlake.formats.records import RECORD_SCHEMA

from ..errors import ApiError, Errors
from ..group_coordinator import append_error_to_response_error
from ..requests import FetchedRecords, ProduceBatch, ProduceResult
from ..transaction_metadata import ProducerIdAndEpoch
from .api_spec import ApiNode, ApiSpec, RequestContext
from .group_apis import _CoordinatorError
from .txn_apis import PRODUCE_V2_SINCE, for_version, implicit_add_error, transaction_coordinator

log = logging.getLogger(__name__)

#: Kafka's ``READ_COMMITTED`` isolation level in Fetch and ListOffsets
READ_COMMITTED = 1
#: the client id whose Produce requests may write to internal topics (Kafka's ``KafkaApis``)
ADMIN_CLIENT_ID = "__admin_client"
#: a Fetch reads at most this many records of a partition per request
MAX_FETCH_RECORDS = 50_000
#: a Fetch first reads ``limit // FETCH_READ_BYTES_PER_ROW`` rows of a partition (at least
#: FETCH_READ_MIN_ROWS), and more only while they all fit the byte limit (:func:`_read_within`)
FETCH_READ_BYTES_PER_ROW = 64
FETCH_READ_MIN_ROWS = 500
#: bytes a record costs in a v2 batch besides its key and value (length, attributes, deltas)
RECORD_OVERHEAD_BYTES = 20
_ZERO_UUID = uuid.UUID(int=0)
#: the records of an in-process Fetch partition without rows
_NO_ROWS = RECORD_SCHEMA.empty_table()


def _leader_epoch_error(apis: ApiNode, current_leader_epoch: int) -> Errors | None:
    """KIP-320: a client that names a current leader epoch must name ours."""
    if current_leader_epoch < 0:
        return None
    ours = apis.leader_epoch
    if current_leader_epoch < ours:
        return Errors.FENCED_LEADER_EPOCH
    if current_leader_epoch > ours:
        return Errors.UNKNOWN_LEADER_EPOCH
    return None


def _topic_name(apis: ApiNode, name: str | None, topic_id: Any) -> str | None:
    """The topic a request part names: by name (up to v12), or by topic id (v13+)."""
    if topic_id is not None and topic_id != _ZERO_UUID and not name:
        for topic in apis.broker.topics().values():
            if topic.topic_id == str(topic_id):
                return topic.name
        return None
    return name


# ---------------------------------------------------------------------------------- Produce
#: Produce versions that get TRANSACTION_ABORTABLE for a batch KIP-890 verification refused
#: (Kafka's ``KafkaApis.handleProduceRequest``: ``genericError`` for ``apiVersion > 10``; older
#: versions get INVALID_TXN_STATE, which they know)
TRANSACTION_ABORTABLE_PRODUCE_SINCE = 11


def handle_produce(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """Produce: take each partition's record batch (wire bytes decoded, or an in-process
    caller's :class:`ProduceBatch` as it is: :func:`_produce_batch`), append it, answer after the catalog
    commit that makes it durable (acks=1 and acks=all alike: the leader's log *is* object
    storage), or at once with no response for acks=0.

    Per partition: NO_ERROR with the base offset (and the log-append time for a
    LogAppendTime topic); CORRUPT_MESSAGE or INVALID_RECORD with ``record_errors`` for a
    batch that does not decode; UNKNOWN_TOPIC_OR_PARTITION; the engine's validation errors
    (MESSAGE_TOO_LARGE, INVALID_PRODUCER_EPOCH, OUT_OF_ORDER_SEQUENCE_NUMBER, ...). acks
    other than -1, 0, 1: INVALID_REQUIRED_ACKS for every partition.

    Transactional batches (KIP-98) need the request's ``transactional_id``: without it every
    partition answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED (Kafka's check). A transactional
    batch that opens the producer's transaction on a partition is verified against the
    transaction coordinator (KIP-890 part 1): a partition not added by AddPartitionsToTxn
    answers INVALID_TXN_STATE and nothing is appended. From v12 (transaction version 2, KIP-890
    part 2) the broker adds the partition to the transaction itself first
    (:func:`_add_partitions_implicitly`): a late batch of an ended transaction, whose epoch the
    EndTxn bumped, answers INVALID_PRODUCER_EPOCH and is never appended.
    """
    broker = apis.broker
    answers: list[tuple[str | None, Any, int, ProduceResult | Future]] = []
    batches: list[ProduceBatch] = []
    slots: list[int] = []
    for topic_data in request.topic_data:
        topic_id = getattr(topic_data, "topic_id", None)
        name = _topic_name(apis, getattr(topic_data, "name", None), topic_id)
        for part in topic_data.partition_data:
            where = (getattr(topic_data, "name", None), topic_id, part.index)
            if request.acks not in (-1, 0, 1):
                answers.append((*where, ProduceResult(Errors.INVALID_REQUIRED_ACKS)))
                continue
            if name is None:
                error = Errors.UNKNOWN_TOPIC_ID if topic_id is not None else Errors.UNKNOWN_TOPIC_OR_PART
                answers.append((*where, ProduceResult(error)))
                continue
            batch = _produce_batch(context, name, part)
            if isinstance(batch, ProduceResult):
                answers.append((*where, batch))
                continue
            slots.append(len(answers))
            answers.append((*where, ProduceResult(Errors.NO_ERROR)))
            batches.append(batch)
    if any(b.is_transactional for b in batches):
        if request.transactional_id is None:
            # Kafka's handleProduceRequest: transactional records need the request's transactional id
            return None if request.acks == 0 else _produce_error(
                request, context.api_version, Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        if broker.txn_verifier is None:
            _start_transaction_coordinator(apis)
        if context.api_version >= PRODUCE_V2_SINCE:
            refused = _add_partitions_implicitly(apis, request.transactional_id, batches)
            for i, error in refused.items():
                answers[slots[i]] = (*answers[slots[i]][:3], ProduceResult(error))
            if refused:
                kept = [i for i in range(len(batches)) if i not in refused]
                batches, slots = [batches[i] for i in kept], [slots[i] for i in kept]
    futures = broker.produce_async(batches, internal_topics_allowed=context.client_id == ADMIN_CLIENT_ID) if batches else []
    for slot, fut in zip(slots, futures):
        answers[slot] = (*answers[slot][:3], fut)
    if request.acks == 0:
        return None
    transactional = {slot for slot, batch in zip(slots, batches) if batch.is_transactional}
    # the in-process producer (txlake's, whose error handling is librdkafka's) keeps INVALID_TXN_STATE
    wire_v11 = context.api_version >= TRANSACTION_ABORTABLE_PRODUCE_SINCE and not context.in_process
    abortable = transactional if wire_v11 else set()
    return _when_all(answers, request.timeout_ms,
                     lambda done: _produce_response(apis, _verification_abortable(done, abortable)))


def _add_partitions_implicitly(apis: ApiNode, transactional_id: str, batches: list[ProduceBatch]) -> dict[int, Errors]:
    """Transaction version 2 (Produce v12+, KIP-890 part 2; Kafka's ``ReplicaManager`` with
    ``AddPartitionsToTxnManager`` in its "add" form): add the partitions of the transactional
    batches that are not yet in their producer's transaction, through the coordinator
    (:meth:`TransactionCoordinator.handle_add_partitions_to_txn` at transaction version 2).
    Returns the refused batches by index, with the error their partition answers
    (:func:`implicit_add_error`: PRODUCER_FENCED is INVALID_PRODUCER_EPOCH); the others are
    then appended and verified as in part 1. Batches of more than one producer in one request
    answer INVALID_PRODUCER_ID_MAPPING (Kafka's ``InvalidPidMappingException``)."""
    txn = [(i, b) for i, b in enumerate(batches) if b.is_transactional]
    if len({(b.producer_id, b.producer_epoch) for _, b in txn}) > 1:
        return {i: Errors.INVALID_PRODUCER_ID_MAPPING for i, _ in txn}
    try:
        coordinator = transaction_coordinator(apis)
    except _CoordinatorError as exc:
        return {i: implicit_add_error(exc.error) for i, _ in txn}
    missing = {(b.topic, b.partition) for _, b in txn
               if coordinator.verify_partition(b.producer_id, b.producer_epoch, b.topic, b.partition) != Errors.NO_ERROR}
    if not missing:
        return {}
    producer_id, producer_epoch = txn[0][1].producer_id, txn[0][1].producer_epoch
    added = coordinator.handle_add_partitions_to_txn(transactional_id, producer_id, producer_epoch, missing,
                                                     transaction_version=2)
    return {i: implicit_add_error(added[(b.topic, b.partition)]) for i, b in txn
            if added.get((b.topic, b.partition), Errors.NO_ERROR) != Errors.NO_ERROR}


def _verification_abortable(answers: list[tuple], slots: set[int]) -> list[tuple]:
    """``answers`` with INVALID_TXN_STATE of the answers at ``slots`` (transactional batches, for
    which only KIP-890 verification answers it: the producer state refuses a *non*-transactional
    batch of an open transaction with it) turned into TRANSACTION_ABORTABLE."""
    return [(*where, dataclasses.replace(result, error=Errors.TRANSACTION_ABORTABLE))
            if i in slots and result.error == Errors.INVALID_TXN_STATE else (*where, result)
            for i, (*where, result) in enumerate(answers)]


def _start_transaction_coordinator(apis: ApiNode) -> None:
    """Start the transaction coordinator before a transactional batch is appended, so that the
    batch is verified against it (KIP-890 part 1: its verifier is installed when it starts; the
    writer starts it on taking the lease, on a thread of its own, which may not be done yet)."""
    try:
        transaction_coordinator(apis)
    except _CoordinatorError as exc:
        log.warning("transactional records arrived but the transaction coordinator is not available: %s",
                    exc.error.name)


def _when_all(answers: list[tuple], timeout_ms: int, build) -> Future:
    """A Future of ``build(answers with every Future replaced by its result)``; a Future not
    done within ``timeout_ms`` counts as REQUEST_TIMED_OUT (Kafka's produce purgatory)."""
    out: Future = Future()
    pending = [a[3] for a in answers if isinstance(a[3], Future)]
    lock = threading.Lock()
    state = {"left": len(pending), "done": False}

    def finish() -> None:
        with lock:
            if state["done"]:
                return
            state["done"] = True
        resolved = []
        for *where, value in answers:
            if isinstance(value, Future):
                if value.done() and value.exception() is None:
                    value = value.result()
                elif value.done():
                    value = ProduceResult(Errors.UNKNOWN_SERVER_ERROR, message=str(value.exception()))
                else:
                    value = ProduceResult(Errors.REQUEST_TIMED_OUT, message=f"not committed within {timeout_ms} ms")
            resolved.append((*where, value))
        try:
            out.set_result(build(resolved))
        except Exception as exc:
            out.set_exception(exc)

    def one_done(_: Future) -> None:
        with lock:
            state["left"] -= 1
            last = state["left"] == 0
        if last:
            finish()

    if not pending:
        finish()
        return out
    for fut in pending:
        fut.add_done_callback(one_done)
    if not out.done():   # refusals are answered at once: only a batch waiting for its commit waits here
        expiry = _PURGATORY.call_at(time.monotonic() + max(timeout_ms, 0) / 1000, finish)
        out.add_done_callback(lambda _: _PURGATORY.cancel(expiry))
    return out


class _Purgatory:
    """Runs each waiting request's expiry at its deadline from one thread (Kafka's
    ``DelayedOperationPurgatory`` timer): a Produce waiting for its commit costs a heap entry,
    not a thread of its own. Callbacks run on the purgatory's thread; a cancelled entry is
    dropped when it reaches the head (or when cancelled ones are most of the heap)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[list] = []   # [deadline (monotonic s), sequence, callback or None]
        self._seq = 0
        self._cancelled = 0
        self._thread: threading.Thread | None = None

    def call_at(self, deadline: float, callback: Callable[[], None]) -> list:
        """Run ``callback`` at ``deadline`` (``time.monotonic()`` s) unless cancelled; the entry."""
        with self._cond:
            self._seq += 1
            entry = [deadline, self._seq, callback]
            heapq.heappush(self._heap, entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="txlake-request-purgatory", daemon=True)
                self._thread.start()
            if self._heap[0] is entry:
                self._cond.notify()
        return entry

    def cancel(self, entry: list) -> None:
        """Forget ``entry`` (its callback will not run)."""
        with self._cond:
            if entry[2] is None:
                return
            entry[2] = None
            self._cancelled += 1
            if self._cancelled > 64 and self._cancelled * 2 > len(self._heap):
                self._heap = [e for e in self._heap if e[2] is not None]
                heapq.heapify(self._heap)
                self._cancelled = 0

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    while self._heap and self._heap[0][2] is None:
                        heapq.heappop(self._heap)
                        self._cancelled -= 1
                    if not self._heap:
                        self._cond.wait()
                        continue
                    wait = self._heap[0][0] - time.monotonic()
                    if wait <= 0:
                        entry = heapq.heappop(self._heap)
                        callback, entry[2] = entry[2], None
                        break
                    self._cond.wait(wait)
            try:
                callback()
            except Exception:  # noqa: BLE001 - the purgatory thread must survive one failed expiry
                log.exception("a request's expiry failed")


_PURGATORY = _Purgatory()


def _produce_batch(context: RequestContext, topic: str, part: Any) -> ProduceBatch | ProduceResult:
    """The batch a Produce partition carries, or the error answering it.

    ``part.records`` is either a record batch v2 as the wire carries it (decoded here into the
    log's Arrow columns: CORRUPT_MESSAGE / INVALID_RECORD for one that does not decode,
    UNSUPPORTED_COMPRESSION_TYPE for zstd below v7, KIP-110) or, from an in-process caller, a
    :class:`ProduceBatch` already in those columns (Kafka's ``MemoryRecords`` rather than bytes:
    nothing is encoded to be decoded again). Either way the batch then goes through the same
    validation, idempotence checks and append (:meth:`Broker.produce_async`). An in-process
    batch must name the partition it is sent for (INVALID_REQUEST otherwise).
    """
    records = part.records
    if isinstance(records, ProduceBatch):
        if (records.topic, records.partition) != (topic, part.index):
            return ProduceResult(Errors.INVALID_REQUEST, message=(
                f"the batch for {records.topic} [{records.partition}] was sent as {topic} [{part.index}]"))
        return records
    try:
        decoded = decode_batches(records or b"", topic=topic, partition=part.index)
    except RecordBatchError as exc:
        return ProduceResult(Errors[exc.error_name], message=str(exc))
    (wire,) = decoded  # decode_batches with client checks yields exactly one batch
    if wire.compression == "zstd" and context.api_version < 7:
        # KIP-110: zstd needs Produce v7+ (an older client cannot have negotiated it)
        return ProduceResult(Errors.UNSUPPORTED_COMPRESSION_TYPE, message=(
            f"zstd-compressed records need Produce v7 or later, the request is v{context.api_version}"))
    return ProduceBatch(topic, part.index, wire.records, wire.producer_id, wire.producer_epoch,
                        wire.base_sequence, wire.is_transactional, size_in_bytes=wire.size_in_bytes)


def _produce_response(apis: ApiNode, answers: list[tuple]) -> Any:
    topics: dict[tuple, list] = {}
    state = apis.broker.catalog.state
    for name, topic_id, index, result in answers:
        log_start = -1
        if result.error == Errors.NO_ERROR and name is not None and name in state.topics:
            log_start = state.partition(name, index).log_start_offset
        part = ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
            index=index, error_code=int(result.error), base_offset=result.base_offset,
            log_append_time_ms=result.log_append_time, log_start_offset=log_start,
            record_errors=[], error_message=result.message or None)
        if result.error in (Errors.CORRUPT_MESSAGE, Errors.INVALID_RECORD):
            part.record_errors = [ProduceResponse.TopicProduceResponse.PartitionProduceResponse.BatchIndexAndErrorMessage(
                batch_index=0, batch_index_error_message=result.message or None)]
        topics.setdefault((name, topic_id), []).append(part)
    return ProduceResponse(
        responses=[ProduceResponse.TopicProduceResponse(name=name, topic_id=topic_id or _ZERO_UUID, partition_responses=parts)
                   for (name, topic_id), parts in topics.items()],
        throttle_time_ms=0)


def _produce_error(request: Any, version: int, error: Errors) -> Any:
    answers = [(getattr(t, "name", None), getattr(t, "topic_id", None), p.index, ProduceResult(error))
               for t in request.topic_data for p in t.partition_data]
    topics: dict[tuple, list] = {}
    for name, topic_id, index, result in answers:
        topics.setdefault((name, topic_id), []).append(ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
            index=index, error_code=int(result.error), base_offset=-1, record_errors=[]))
    return ProduceResponse(responses=[ProduceResponse.TopicProduceResponse(name=n, topic_id=i or _ZERO_UUID,
                                                                           partition_responses=p)
                                      for (n, i), p in topics.items()], throttle_time_ms=0)


# ---------------------------------------------------------------------------------- Fetch
class CommitSignal:
    """Wakes fetches waiting for new data (Kafka's fetch purgatory, keyed by nothing: any
    catalog commit may have moved a high watermark or LSO)."""

    def __init__(self, catalog) -> None:
        self._cond = threading.Condition()
        self._version = 0
        catalog.add_listener(self._committed)

    def _committed(self, version: int, actions: list) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    @property
    def version(self) -> int:
        return self._version

    def wait_past(self, seen: int, timeout_s: float) -> None:
        """Block until a commit after the one counted as ``seen``, or ``timeout_s``."""
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen, timeout=timeout_s)


_signals_lock = threading.Lock()


def _commit_signal(apis: ApiNode) -> CommitSignal:
    with _signals_lock:
        signal = getattr(apis, "_commit_signal", None)
        if signal is None:
            signal = CommitSignal(apis.broker.catalog)
            apis._commit_signal = signal  # type: ignore[attr-defined]
        return signal


def handle_fetch(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """Fetch: committed records from each partition's fetch offset, up to the high watermark
    (read_uncommitted) or the last stable offset (read_committed), with the aborted
    transactions of the fetched range under read_committed (the client drops their
    records) and control batches as they are in the log (the client skips them).

    Waits up to ``max_wait_ms`` while fewer than ``min_bytes`` are available. At least one
    whole batch is returned even above ``max_bytes`` / ``partition_max_bytes`` (KIP-74).
    No fetch sessions (KIP-227): the response's session id is 0, so clients send full requests.

    In-process (``context.in_process``) every answered partition's ``records`` is a
    :class:`FetchedRecords`: the rows the wire would encode (no rows on an error or at the end),
    the leader epoch its batch headers would carry, their size as counted against the byte
    limits, and the engine's error message (e.g. CORRUPT_MESSAGE naming the object).
    """
    signal = _commit_signal(apis)
    deadline = time.monotonic() + max(request.max_wait_ms, 0) / 1000
    while True:
        seen = signal.version
        topics, total = _read_fetch(apis, context, request)
        remaining = deadline - time.monotonic()
        if total >= max(request.min_bytes, 1) or remaining <= 0 or _has_error(topics):
            return FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=topics)
        signal.wait_past(seen, remaining)


def _has_error(topics: list) -> bool:
    return any(p.error_code for t in topics for p in t.partitions)


def _read_fetch(apis: ApiNode, context: RequestContext, request: Any) -> tuple[list, int]:
    broker = apis.broker
    committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    isolation = "read_committed" if committed else "read_uncommitted"
    budget = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
    total = 0
    out = []
    for topic in request.topics:
        topic_id = getattr(topic, "topic_id", None)
        name = _topic_name(apis, getattr(topic, "topic", None), topic_id)
        parts = []
        for p in topic.partitions:
            part = FetchResponse.FetchableTopicResponse.PartitionData(
                partition_index=p.partition, error_code=0, high_watermark=-1, last_stable_offset=-1,
                log_start_offset=-1, aborted_transactions=None, preferred_read_replica=-1,
                records=FetchedRecords(_NO_ROWS, apis.leader_epoch) if context.in_process else b"")
            parts.append(part)
            if name is None:
                part.error_code = int(Errors.UNKNOWN_TOPIC_ID if topic_id is not None else Errors.UNKNOWN_TOPIC_OR_PART)
                continue
            epoch_error = _leader_epoch_error(apis, getattr(p, "current_leader_epoch", -1))
            if epoch_error is not None:
                part.error_code = int(epoch_error)
                continue
            limit = min(p.partition_max_bytes, budget - total) if total else p.partition_max_bytes
            result, rows, size = _read_within(broker, name, p.partition, p.fetch_offset, isolation, limit)
            part.error_code = int(result.error)
            part.high_watermark = result.high_watermark
            part.last_stable_offset = result.last_stable_offset
            part.log_start_offset = result.log_start_offset
            if committed:
                part.aborted_transactions = []
            if context.in_process:
                part.records.error_message = result.message
            if rows is None:
                continue
            if context.in_process:
                part.records = FetchedRecords(rows, apis.leader_epoch, size)
            else:
                part.records = encode_batches(rows, partition_leader_epoch=apis.leader_epoch)
                size = len(part.records)
            total += size
            if committed:
                last = rows.column("offset")[rows.num_rows - 1].as_py()
                part.aborted_transactions = [
                    FetchResponse.FetchableTopicResponse.PartitionData.AbortedTransaction(
                        producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in result.aborted_transactions if a.first_offset <= last]
            if total >= budget:
                budget = total  # later partitions get nothing more this time (they still answer)
        out.append(FetchResponse.FetchableTopicResponse(topic=name if name is not None else getattr(topic, "topic", None),
                                                        topic_id=topic_id or _ZERO_UUID, partitions=parts))
    return out, total


def _read_within(broker, topic: str, partition: int, offset: int, isolation: str, limit: int):
    """``(FetchResult, rows, size)``: a partition's rows from ``offset`` cut to ``limit`` bytes
    (:func:`_within_bytes`; rows None on an error or with nothing to read).

    Reads only about as many rows as the limit can take -- ``limit // ``:data:`FETCH_READ_BYTES_PER_ROW`
    first, four times more while they all fit (or the first batch is not whole yet), at most
    :data:`MAX_FETCH_RECORDS` -- rather than always the most, which for a log of small
    objects meant slicing and joining segments the limit then dropped."""
    want = min(MAX_FETCH_RECORDS, max(limit // FETCH_READ_BYTES_PER_ROW, FETCH_READ_MIN_ROWS))
    while True:
        result = broker.fetch(topic, partition, offset, want, isolation)
        read = result.records
        if result.error != Errors.NO_ERROR or read is None or read.num_rows == 0:
            return result, None, 0
        rows, size = _within_bytes(read, limit)
        if read.num_rows < want or want >= MAX_FETCH_RECORDS or rows.num_rows < read.num_rows:
            return result, rows, size
        want = min(MAX_FETCH_RECORDS, want * 4)   # everything read fits: there may be more room


def _within_bytes(rows, limit: int):
    """``(rows, size)``: the leading rows whose encoded size stays within ``limit`` bytes, but
    at least the whole first batch (KIP-74: a fetch always makes progress), and their size
    (bytes, about their v2 encoding: keys, values and :data:`RECORD_OVERHEAD_BYTES` each).
    Rows are in offset order, so each batch's rows (one ``base_offset``) are contiguous."""
    cumulative = np.arange(RECORD_OVERHEAD_BYTES, RECORD_OVERHEAD_BYTES * (rows.num_rows + 1), RECORD_OVERHEAD_BYTES,
                           dtype=np.int64)
    for name in ("key", "value"):
        lengths = _cumulative_bytes(rows.column(name))
        if lengths is not None:
            cumulative += lengths
    n = int(np.searchsorted(cumulative, max(limit, 0), side="right"))
    bases = rows.column("base_offset").to_numpy()
    first_batch = int(np.searchsorted(bases, bases[0], side="right"))
    n = max(n, first_batch)
    if n < rows.num_rows and n > first_batch and bases[n - 1] == bases[n]:
        # end on a batch boundary when possible, so no batch is cut in two across responses
        n = int(np.searchsorted(bases, bases[n], side="left"))
    return rows.slice(0, n), int(cumulative[n - 1]) if n else 0


def _cumulative_bytes(column) -> np.ndarray | None:
    """The running total of a binary column's value lengths (bytes; null counts 0), read from
    the arrays' offsets (the data itself is not touched); None when every value is null."""
    if column.null_count == len(column):
        return None
    parts = []
    total = 0
    for chunk in column.chunks:
        size = len(chunk)
        if not size:
            continue
        buffer = chunk.buffers()[1]
        if buffer is None or chunk.null_count == size:
            running = np.full(size, total, dtype=np.int64)
        else:
            offsets = np.frombuffer(buffer, dtype=np.int32, count=chunk.offset + size + 1)[chunk.offset:]
            if chunk.null_count:   # a null's slot may have a length: count it 0
                lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
                lengths[~chunk.is_valid().to_numpy(zero_copy_only=False)] = 0
                running = np.cumsum(lengths)
            else:
                running = offsets[1:].astype(np.int64)
                running -= int(offsets[0])
            running += total
        total = int(running[-1])
        parts.append(running)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _fetch_error(request: Any, version: int, error: Errors) -> Any:
    return FetchResponse(throttle_time_ms=0, error_code=int(error), session_id=0, responses=[])


# ---------------------------------------------------------------------------------- ListOffsets
def handle_list_offsets(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """ListOffsets: per partition the offset for a timestamp (ms) or for -2 (earliest), -1
    (latest: the high watermark, or the LSO under read_committed), -3 (the record with the
    largest timestamp, KIP-734), -4 (earliest local: the log start offset, KIP-405). A timestamp
    past every record answers offset -1, timestamp -1, leader epoch -1."""
    isolation = "read_committed" if getattr(request, "isolation_level", 0) == READ_COMMITTED else "read_uncommitted"
    topics = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            part = ListOffsetsResponse.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                partition_index=p.partition_index, error_code=0, timestamp=-1, offset=-1, leader_epoch=-1)
            parts.append(part)
            epoch_error = _leader_epoch_error(apis, getattr(p, "current_leader_epoch", -1))
            if epoch_error is not None:
                part.error_code = int(epoch_error)
                continue
            timestamp = -2 if p.timestamp == -4 else p.timestamp
            error, offset, ts = apis.broker.list_offsets(topic.name, p.partition_index, timestamp, isolation)
            part.error_code = int(error)
            if error == Errors.NO_ERROR:
                # no record at or after the timestamp: offset -1, timestamp -1 and no leader epoch (Kafka's
                # ``TimestampAndOffset(-1, -1, Optional.empty())``)
                part.offset, part.timestamp, part.leader_epoch = offset, ts, apis.leader_epoch if offset >= 0 else -1
        topics.append(ListOffsetsResponse.ListOffsetsTopicResponse(name=topic.name, partitions=parts))
    return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


def _list_offsets_error(request: Any, version: int, error: Errors) -> Any:
    R = ListOffsetsResponse.ListOffsetsTopicResponse
    return ListOffsetsResponse(throttle_time_ms=0, topics=[
        R(name=t.name, partitions=[R.ListOffsetsPartitionResponse(partition_index=p.partition_index, error_code=int(error))
                                   for p in t.partitions]) for t in request.topics])


# ---------------------------------------------------------------------------------- OffsetForLeaderEpoch
def handle_offset_for_leader_epoch(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """OffsetForLeaderEpoch (KIP-101/KIP-320): the end offset of the requested epoch. The log
    never truncates acknowledged records, so every epoch up to the current one ends at the
    high watermark; a later epoch answers UNKNOWN_LEADER_EPOCH."""
    R = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
    ours = apis.leader_epoch
    state = apis.broker.catalog.state
    topics = []
    for topic in request.topics:
        parts = []
        for p in topic.partitions:
            part = R.EpochEndOffset(error_code=0, partition=p.partition, leader_epoch=-1, end_offset=-1)
            parts.append(part)
            error = _leader_epoch_error(apis, getattr(p, "current_leader_epoch", -1))
            if error is None and topic.topic not in state.topics:
                error = Errors.UNKNOWN_TOPIC_OR_PART
            if error is None and not 0 <= p.partition < len(state.topics[topic.topic].partitions):
                error = Errors.UNKNOWN_TOPIC_OR_PART
            if error is None and p.leader_epoch > ours:
                error = Errors.UNKNOWN_LEADER_EPOCH
            if error is not None:
                part.error_code = int(error)
                continue
            part.leader_epoch = p.leader_epoch
            part.end_offset = state.partition(topic.topic, p.partition).high_watermark
        topics.append(R(topic=topic.topic, partitions=parts))
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=topics)


def _offset_for_leader_epoch_error(request: Any, version: int, error: Errors) -> Any:
    R = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
    return OffsetForLeaderEpochResponse(throttle_time_ms=0, topics=[
        R(topic=t.topic, partitions=[R.EpochEndOffset(error_code=int(error), partition=p.partition)
                                     for p in t.partitions]) for t in request.topics])


# ---------------------------------------------------------------------------------- InitProducerId
def handle_init_producer_id(apis: ApiNode, context: RequestContext, request: Any) -> Any:
    """InitProducerId (Kafka's ``handleInitProducerIdRequest``): a new producer id (epoch 0) for an
    idempotent producer (null transactional id); for a transactional id, the transaction
    coordinator's answer (:meth:`TransactionCoordinator.handle_init_producer_id`: KIP-98 fencing of
    older instances, and from v3 KIP-360's producer id and epoch of a producer that bumps its
    epoch). Only one of producer id / epoch set (the other -1) answers INVALID_REQUEST; a
    coordinator that is not here NOT_COORDINATOR; PRODUCER_FENCED is INVALID_PRODUCER_EPOCH
    below v4; INVALID_TRANSACTION_TIMEOUT, CONCURRENT_TRANSACTIONS as the coordinator answers."""
    version = context.api_version
    producer_id = request.producer_id if version >= 3 else -1
    producer_epoch = request.producer_epoch if version >= 3 else -1
    if (producer_id == -1) != (producer_epoch == -1):
        return _init_producer_id_error(request, version, Errors.INVALID_REQUEST)
    if request.transactional_id is None:
        try:
            error, pid, epoch = apis.broker.init_producer_id()
        except ApiError as exc:
            # the producer ids cannot be allocated here (the writer lease is held elsewhere or
            # lost, the catalog commit failed): answered as Kafka's coordinator answers, with the
            # engine's reason logged (the response has no message)
            log.warning("InitProducerId from %s: %s", context.client_host or "in-process", exc.message)
            error, pid, epoch = append_error_to_response_error(exc.error), -1, -1
    else:
        expected = ProducerIdAndEpoch(producer_id, producer_epoch) if producer_id >= 0 else None
        try:
            coordinator = transaction_coordinator(apis)
        except _CoordinatorError as exc:
            return _init_producer_id_error(request, version, exc.error)
        error, pid, epoch = coordinator.handle_init_producer_id(request.transactional_id,
                                                               request.transaction_timeout_ms, expected)
        error = for_version(error, ApiKey.InitProducerId, version)
    return InitProducerIdResponse(throttle_time_ms=0, error_code=int(error), producer_id=pid, producer_epoch=epoch)


def _init_producer_id_error(request: Any, version: int, error: Errors) -> Any:
    return InitProducerIdResponse(throttle_time_ms=0, error_code=int(error), producer_id=-1, producer_epoch=-1)


APIS = [
    ApiSpec(ApiKey.Produce, 3, 12, handle_produce, _produce_error),
    ApiSpec(ApiKey.Fetch, 4, 12, handle_fetch, _fetch_error),
    ApiSpec(ApiKey.ListOffsets, 1, 8, handle_list_offsets, _list_offsets_error),
    ApiSpec(ApiKey.OffsetForLeaderEpoch, 2, 4, handle_offset_for_leader_epoch, _offset_for_leader_epoch_error),
    ApiSpec(ApiKey.InitProducerId, 0, 5, handle_init_producer_id, _init_producer_id_error),
]
