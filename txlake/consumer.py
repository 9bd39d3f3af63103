"""The Consumer: confluent-kafka's API over a storage root, reading committed segments.

Reading never takes the writer lease: a consumer in another process tails the
catalog (one GET per look for the next commit) and keeps working while a writer runs.
``position()`` after a poll is the next offset to fetch, which may skip control-record
offsets. :meth:`Consumer.subscribe` makes it a member of its ``group.id`` (see
:mod:`txlake.consumer_coordinator`); the group coordinator runs in the storage root's
writer, so subscribed consumers live in the writer process.

Offset commits (:meth:`Consumer.commit`, auto-commit) are sent by one thread per consumer,
one at a time in call order, like librdkafka's: an asynchronous commit returns at once and
its result reaches the ``on_commit(err, partitions)`` callback from the next
``poll()``/``consume()`` (or ``close()``); a synchronous one waits for its turn and its answer.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable


from txlake.engine.broker import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from txlake.engine.errors import ApiError, Errors
from txlake.engine.registry import acquire_broker, release_broker

from . import local_requests
from .config import constructor_conf, parse_config
from .handle import HandleCalls
from .consumer_coordinator import ConsumerCoordinator
from .error import KafkaError, KafkaException, from_api_error, kafka_errors, kafka_exception
from .group_metadata import ConsumerGroupMetadata
from .types import (OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, OFFSET_STORED, TIMESTAMP_CREATE_TIME,
                    TIMESTAMP_LOG_APPEND_TIME, Message, TopicPartition, partition_list)

_EARLIEST = {"smallest", "earliest", "beginning"}
_LATEST = {"largest", "latest", "end"}
#: fetch position of a partition whose committed offset is held by a pending transaction
_UNSTABLE = -2001
#: how long a partition waits before asking again for an unstable committed offset (Kafka's retry.backoff.ms)
UNSTABLE_RETRY_BACKOFF_S = 0.1
REFRESH_INTERVAL_MS = 50

log = logging.getLogger(__name__)

#: a commit's answer: ``(error or None, the partitions with their offsets and per-partition errors)``
CommitResult = tuple[KafkaError | None, list[TopicPartition]]


class _Fetch:
    """Fetch state of one assigned partition: position and records fetched but not yet returned.

    ``messages[next:]`` are the records not yet returned (a list and an index, so a
    consume() of many records is one slice).
    """

    __slots__ = ("position", "epoch", "messages", "next", "eof_sent", "retry_at")

    def __init__(self, position: int, epoch: int | None = None):
        self.position = position
        #: the leader epoch of the record before ``position`` (KIP-320), None when unknown
        self.epoch = epoch
        self.messages: list[Message] = []
        self.next = 0
        self.eof_sent = False
        self.retry_at = 0.0   # monotonic time before which an unstable committed offset is not asked again

    def queued(self) -> Message | None:
        """The first record not yet returned, if any."""
        return self.messages[self.next] if self.next < len(self.messages) else None

    def take(self, limit: int) -> list[Message]:
        """Up to ``limit`` queued records, in order."""
        out = self.messages[self.next:self.next + limit]
        self.next += len(out)
        if self.next >= len(self.messages):
            self.clear()
        return out

    def push(self, messages: list[Message]) -> None:
        """Queue records (or error events) after the ones already queued."""
        if self.next:
            self.messages = self.messages[self.next:]
            self.next = 0
        self.messages.extend(messages)

    def clear(self) -> None:
        """Drop everything queued."""
        self.messages = []
        self.next = 0


@dataclass(frozen=True)
class _CommitRequest:
    """An OffsetCommit as the application asked for it: the offsets, and the member identity
    ``(generation, member id, group instance id)`` at that moment."""

    offsets: tuple[TopicPartition, ...]
    identity: tuple[int, str, str | None]



def _offset_after(message: Message) -> int:
    """The offset a commit or store of ``message`` records: the next one to read, or
    OFFSET_INVALID for a message without an offset (librdkafka skips it: nothing is committed)."""
    offset = message.offset()
    return offset + 1 if offset is not None else OFFSET_INVALID

class Consumer(HandleCalls):
    """A Kafka consumer of a txlake storage root (confluent-kafka's ``Consumer``).

    Args:
        conf: Kafka-style config; ``isolation.level`` defaults to read_committed
            (never past the LSO), ``auto.offset.reset`` to latest; ``on_commit(err, partitions)``
            receives the results of asynchronous commits and auto-commits, from poll()/consume().

    Raises:
        KafkaException: ``_INVALID_ARG`` for unknown keys or invalid values.
    """

    #: a subclass whose ``__init__`` never called this one's is closed: every call raises
    #: RuntimeError, as confluent-kafka's (its handle is NULL)
    _closed = True

    def __init__(self, conf: dict | None = None, **kwargs: Any):
        self._cfg = parse_config(constructor_conf(conf, kwargs), "consumer")
        self._isolation = self._cfg["isolation.level"]
        self._reset = self._cfg["auto.offset.reset"]
        self._eof = self._cfg["enable.partition.eof"]
        with kafka_errors(f"{type(self).__name__}: cannot open storage.url {self._cfg.storage_url}"):
            self._broker = acquire_broker(self._cfg.storage_url, self._cfg.storage_options, self._cfg.broker_config())
        local_requests.load(self._broker)
        self._lock = threading.RLock()
        self._assignment: dict[tuple[str, int], _Fetch] = {}
        self._order: deque[tuple[str, int]] = deque()
        self._assignment_version = 0    # bumped by every assignment change (rebalance callbacks)
        self._membership: ConsumerCoordinator | None = None
        self._closed = False
        self._on_commit: Callable | None = self._cfg["on_commit"]
        #: librdkafka's committed offset per partition: commits of the positions skip partitions not past it
        self._committed: dict[tuple[str, int], int] = {}
        self._commit_sender: ThreadPoolExecutor | None = None
        #: the last auto-commit sent (a Future of its result)
        self._auto_commit_sent: Future | None = None
        self._commit_reports: deque[CommitResult] = deque()
        #: enable.auto.offset.store: every record returned counts as processed (commits take the positions)
        self._auto_store: bool = self._cfg["enable.auto.offset.store"]
        #: offsets stored by store_offsets() (enable.auto.offset.store=false): what commits take
        self._stored: dict[tuple[str, int], TopicPartition] = {}
        #: partitions paused by pause(): poll()/consume() return none of their records
        self._paused: set[tuple[str, int]] = set()

    def _check_open(self, message: str = "Consumer closed") -> None:
        """confluent-kafka's answer to a call on a closed consumer (``list_topics``,
        ``cluster_id``, ``set_sasl_credentials``: ``"Handle has been closed"``)."""
        if self._closed:
            raise RuntimeError(message)

    # ------------------------------------------------------------------ assignment
    def assign(self, partitions: list[TopicPartition]) -> None:
        """Read exactly these partitions, from each one's offset (or by auto.offset.reset).

        Raises:
            TypeError: ``partitions`` is not a list of TopicPartition.
            KafkaException: the committed offsets or the log cannot be read.
        """
        self._check_open()
        partition_list(partitions, "assign")
        with self._lock, kafka_errors("assign()"):
            self._assignment_version += 1
            self._assignment = {}
            for tp in partitions:
                self._assignment[(tp.topic, tp.partition)] = _Fetch(*self._resolve(tp.topic, tp.partition, tp.offset))
            self._order = deque(self._assignment)
            self._forget_unassigned()

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """Add partitions to the assignment (errors as :meth:`assign`)."""
        self._check_open()
        partition_list(partitions, "incremental_assign")
        with self._lock, kafka_errors("incremental_assign()"):
            self._assignment_version += 1
            for tp in partitions:
                self._assignment[(tp.topic, tp.partition)] = _Fetch(*self._resolve(tp.topic, tp.partition, tp.offset))
            self._order = deque(self._assignment)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """Remove partitions from the assignment (TypeError unless a list of TopicPartition)."""
        self._check_open()
        partition_list(partitions, "incremental_unassign")
        with self._lock:
            self._assignment_version += 1
            for tp in partitions:
                self._assignment.pop((tp.topic, tp.partition), None)
            self._order = deque(self._assignment)
            self._forget_unassigned()

    def unassign(self) -> None:
        """Drop the whole assignment."""
        self._check_open()
        with self._lock:
            self._assignment_version += 1
            self._assignment = {}
            self._order = deque()
            self._forget_unassigned()

    def _forget_unassigned(self) -> None:
        """A partition that left the assignment is no longer paused and loses its stored offset
        (librdkafka's; caller holds the lock)."""
        self._paused &= self._assignment.keys()
        for key in [key for key in self._stored if key not in self._assignment]:
            del self._stored[key]

    def assignment(self) -> list[TopicPartition]:
        """The assigned partitions."""
        self._check_open()
        with self._lock:
            return [TopicPartition(t, p) for t, p in self._assignment]

    def subscribe(self, topics: list[str], on_assign=None, on_revoke=None, on_lost=None) -> None:
        """Join ``group.id`` with this subscription (topic names, or regexes starting with ``^``).

        The group's partitions are shared among its members by the assignor of
        ``partition.assignment.strategy``; the consumer's group thread joins at once (it runs the
        group protocol in the background, as librdkafka), and the callbacks run inside
        ``poll()``/``consume()``/``close()``, in the caller's thread:
        ``on_assign(consumer, partitions)``, ``on_revoke(consumer, partitions)``,
        ``on_lost(consumer, partitions)``. Assigned partitions start at the group's committed
        offsets (under read_committed, once no transaction holds a pending offset for them).

        Raises:
            TypeError: ``topics`` is not a list of str (confluent-kafka's message).
            KafkaException: ``_INVALID_ARG`` without ``group.id`` or with an invalid
                ``partition.assignment.strategy``; NOT_LEADER_OR_FOLLOWER when another process is
                the storage root's writer (the group coordinator runs there).
        """
        self._check_open()
        if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
            raise TypeError("expected list of topic unicode strings")  # confluent-kafka's
        if not self._cfg["group.id"]:
            raise kafka_exception(KafkaError._INVALID_ARG, "subscribe() needs group.id")
        if not topics:
            raise kafka_exception(KafkaError._INVALID_ARG, "subscribe() needs at least one topic")
        if self._membership is None:
            try:
                self._broker.group_coordinator()
            except ApiError as exc:
                raise from_api_error(exc) from None
            self._membership = ConsumerCoordinator(self, self._broker, self._cfg)
        self._membership.subscribe(list(topics), on_assign, on_revoke, on_lost)

    def unsubscribe(self) -> None:
        """Leave the group: revoke the assignment (``on_revoke``) and send LeaveGroup."""
        self._check_open()
        if self._membership is not None:
            membership, self._membership = self._membership, None
            membership.close()
        self.unassign()

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        """Group id, generation id, member id and group instance id of this member, for
        ``Producer.send_offsets_to_transaction`` (KIP-447). Without membership (assign()) the
        generation is -1 and the member id empty.

        Raises:
            KafkaException: ``_INVALID_ARG`` without ``group.id``.
        """
        self._check_open()
        group = self._group()
        if self._membership is None:
            return ConsumerGroupMetadata(group, -1, "", self._cfg["group.instance.id"])
        return ConsumerGroupMetadata(*self._membership.group_metadata())

    def _resolve(self, topic: str, partition: int, offset: int) -> tuple[int, int | None]:
        """A concrete fetch position for a logical offset (or OFFSET_INVALID when reset must
        fail), with the leader epoch known for it (the committed one's, KIP-320; else None).

        OFFSET_INVALID/OFFSET_STORED start from the group's committed offset when there is
        one (group.id set: OffsetFetch), else by ``auto.offset.reset`` (ListOffsets).
        """
        if (offset is None or offset in (OFFSET_INVALID, OFFSET_STORED)) and self._cfg["group.id"]:
            stored, epoch, _, error = self._offset_fetch([(topic, partition)], f"{topic} [{partition}]")[(topic, partition)]
            if error == Errors.UNSTABLE_OFFSET_COMMIT:
                return _UNSTABLE, None   # a transaction holds a pending offset: ask again at the next fetch (KIP-447)
            if error != Errors.NO_ERROR:
                raise kafka_exception(error, f"OffsetFetch of {topic} [{partition}] for group "
                                             f"{self._cfg['group.id']} failed: {error.name}")
            if stored >= 0:
                with self._lock:
                    self._committed[(topic, partition)] = stored
                return stored, epoch
        if offset is None or offset in (OFFSET_INVALID, OFFSET_STORED):
            offset = OFFSET_BEGINNING if self._reset in _EARLIEST else OFFSET_END if self._reset in _LATEST else OFFSET_INVALID
        if offset == OFFSET_BEGINNING:
            return self._list_offset(topic, partition, EARLIEST_TIMESTAMP), None
        if offset == OFFSET_END:
            return self._list_offset(topic, partition, LATEST_TIMESTAMP), None
        return offset, None

    def _list_offset(self, topic: str, partition: int, ts: int) -> int:
        """ListOffsets of one partition under the consumer's isolation level (after a catalog
        refresh when the partition is not known yet); OFFSET_INVALID on an error."""
        wanted = [(topic, partition, ts)]
        ((err, offset, _),) = local_requests.list_offsets(self._broker, wanted, self._isolation)
        if err == Errors.UNKNOWN_TOPIC_OR_PART:
            self._broker.refresh()
            ((err, offset, _),) = local_requests.list_offsets(self._broker, wanted, self._isolation)
        return offset if err == Errors.NO_ERROR else OFFSET_INVALID

    def _offset_fetch(self, partitions: list[tuple[str, int]], what: str) -> dict:
        """OffsetFetch of the group's committed offsets of ``partitions`` (stable ones under
        read_committed): ``{(topic, partition): (offset, leader epoch, metadata, error)}``.

        Raises:
            KafkaException: the group's error, the message starting with ``what`` (e.g.
                CORRUPT_MESSAGE when its ``__consumer_offsets`` partition cannot be read: the
                response has no message, the engine logs which object failed).
        """
        group = self._group()
        error, answer = local_requests.offset_fetch(self._broker, group, partitions, self._isolation == "read_committed")
        if error != Errors.NO_ERROR:
            raise kafka_exception(error, f"{what}: OffsetFetch of group {group} answered {error.name} "
                                         f"(the engine's log says what failed)")
        return answer

    def seek(self, partition: TopicPartition) -> None:
        """Set the fetch position of an assigned partition (logical offsets allowed).

        Raises:
            KafkaException: ``_STATE`` if the partition is not assigned.
            TypeError: ``partition`` is not a TopicPartition.
        """
        self._check_open()
        if not isinstance(partition, TopicPartition):
            raise TypeError(f"seek() requires a TopicPartition, not {type(partition).__name__}")
        with self._lock, kafka_errors(f"seek() of {partition.topic} [{partition.partition}]"):
            state = self._assignment.get((partition.topic, partition.partition))
            if state is None:
                raise kafka_exception(KafkaError._STATE, f"Partition {partition.topic} [{partition.partition}] is not assigned")
            state.position, state.epoch = self._resolve(partition.topic, partition.partition, partition.offset)
            state.clear()
            state.eof_sent = False

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The next offset to fetch for each partition (OFFSET_INVALID if unknown); TypeError
        unless ``partitions`` is a list of TopicPartition."""
        self._check_open()
        partition_list(partitions, "position")
        with self._lock:
            out = []
            for tp in partitions:
                state = self._assignment.get((tp.topic, tp.partition))
                pos, epoch = OFFSET_INVALID, None
                if state is not None:
                    queued = state.queued()
                    if queued is not None and queued.error() is None:
                        pos, epoch = queued.offset(), queued.leader_epoch()
                    else:
                        pos, epoch = state.position, state.epoch
                    pos = OFFSET_INVALID if pos == _UNSTABLE else pos
                out.append(TopicPartition(tp.topic, tp.partition, pos, leader_epoch=epoch))
            return out

    # ------------------------------------------------------------------ fetching
    def poll(self, timeout: float | None = None) -> Message | None:
        """The next record (or an error / partition-EOF event), waiting up to ``timeout`` s; None if none."""
        msgs = self.consume(1, -1 if timeout is None else timeout)
        return msgs[0] if msgs else None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Up to ``num_messages`` records, waiting up to ``timeout`` s (-1 = forever) for the first.

        A partition whose records cannot be read yields an error event (``msg.error()``, e.g.
        CORRUPT_MESSAGE naming the object) and the other partitions go on.

        Raises:
            ValueError: ``num_messages`` outside 0..1000000 (confluent-kafka's range and text;
                0 returns an empty list at once).
            KafkaException: the storage root's catalog cannot be read (e.g. KAFKA_STORAGE_ERROR,
                CORRUPT_MESSAGE naming the object), with the underlying error as ``__cause__``.
        """
        self._check_open()
        if not 0 <= num_messages <= 1_000_000:
            raise ValueError("num_messages must be between 0 and 1000000 (1M)")
        if num_messages == 0:
            return []
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        out: list[Message] = []
        reading = f"consume() from {self._broker.store.url}"
        while True:
            self._serve_commit_reports()
            if self._membership is not None:
                self._membership.poll()      # rejoin / rebalance callbacks / auto-commit, in this thread
            with self._lock, kafka_errors(reading):
                # what is available now, up to num_messages: each fetch is bounded by
                # max.partition.fetch.bytes, so go on while the fetches bring records
                # (librdkafka hands out its prefetched queue the same way); an error event
                # ends the call, as before, so a failing partition reports once per call
                while True:
                    before = len(out)
                    self._drain(out, num_messages)
                    if (len(out) >= num_messages or len(out) == before
                            or any(m.error() is not None for m in out[before:])):
                        break   # full, nothing more now, or an error event to hand out first
            if out:
                return out
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return out
            with kafka_errors(reading):
                if self._broker.is_writer:
                    # new data arrives through this process's own commits; a foreign commit
                    # (this writer was superseded) is noticed by a rate-limited probe
                    self._broker.refresh(REFRESH_INTERVAL_MS)
                    time.sleep(min(0.005, remaining if remaining is not None else 0.005))
                elif not self._broker.refresh(REFRESH_INTERVAL_MS):
                    time.sleep(min(REFRESH_INTERVAL_MS / 1000, remaining if remaining is not None else 1))

    def _drain(self, out: list[Message], limit: int) -> None:
        if self._membership is not None:
            out.extend(self._membership.events(limit - len(out)))   # the group's error events come first
        for _ in range(len(self._order)):
            if len(out) >= limit:
                return
            key = self._order[0]
            self._order.rotate(-1)
            if key in self._paused:
                continue
            state = self._assignment[key]
            if state.queued() is None:
                self._fetch(key, state)
            out.extend(state.take(limit - len(out)))

    def _fetch(self, key: tuple[str, int], state: _Fetch) -> None:
        topic, partition = key
        if state.position in (OFFSET_INVALID, _UNSTABLE):
            if state.position == _UNSTABLE and time.monotonic() < state.retry_at:
                return
            state.position, state.epoch = self._resolve(topic, partition, OFFSET_INVALID)
            if state.position == _UNSTABLE:
                state.retry_at = time.monotonic() + UNSTABLE_RETRY_BACKOFF_S
                return
            if state.position == OFFSET_INVALID:
                state.push([Message(topic, partition, None, error=KafkaError(
                    KafkaError._AUTO_OFFSET_RESET, f"no valid offset for {topic} [{partition}] and auto.offset.reset=error"))])
                return
        result, records = self._send_fetch(topic, partition, state.position)
        if result.error_code == Errors.OFFSET_OUT_OF_RANGE:
            if self._reset in _EARLIEST or self._reset in _LATEST:
                state.position, state.epoch = self._resolve(topic, partition, OFFSET_INVALID)
                result, records = self._send_fetch(topic, partition, state.position)
            else:
                state.push([Message(topic, partition, state.position, error=KafkaError(
                    KafkaError._AUTO_OFFSET_RESET, records.error_message))])
                return
        if result.error_code != Errors.NO_ERROR:
            state.push([Message(topic, partition, state.position, error=KafkaError(
                Errors(result.error_code), records.error_message or None))])
            return
        table = records.rows
        if table.num_rows == 0:
            bound = result.last_stable_offset if self._isolation == "read_committed" else result.high_watermark
            if self._eof and not state.eof_sent and state.position >= bound:
                state.eof_sent = True
                state.push([Message(topic, partition, state.position, error=KafkaError(
                    KafkaError._PARTITION_EOF, f"Fetch from broker reached end of partition at offset {state.position}"))])
            return
        state.eof_sent = False
        # The fetch position moves past everything fetched, control records included;
        # position() reports the first message not yet returned while some are queued.
        state.position = table.column("offset")[-1].as_py() + 1
        state.epoch = records.partition_leader_epoch
        state.push(_messages(topic, partition, local_requests.visible(records, result.aborted_transactions),
                             records.partition_leader_epoch))

    def _send_fetch(self, topic: str, partition: int, offset: int):
        """Fetch one partition from ``offset`` (no wait: ``consume()`` waits itself), within
        ``fetch.max.bytes`` / ``max.partition.fetch.bytes``: the response's partition data and
        its :class:`~txlake.engine.requests.FetchedRecords`."""
        return local_requests.fetch(self._broker, topic, partition, offset, self._isolation,
                                    self._cfg["fetch.max.bytes"], self._cfg["max.partition.fetch.bytes"])

    # ------------------------------------------------------------------ offsets
    def get_watermark_offsets(self, partition: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        """``(low, high)``: the log start offset, and the high watermark -- or the LSO under
        read_committed (the end a read_committed consumer can reach, as librdkafka's
        ListOffsets with the consumer's isolation level answers).

        Raises:
            KafkaException: UNKNOWN_TOPIC_OR_PART; the catalog cannot be read.
            TypeError: ``partition`` is not a TopicPartition.
        """
        self._check_open()
        if not isinstance(partition, TopicPartition):
            raise TypeError(f"get_watermark_offsets() requires a TopicPartition, not {type(partition).__name__}")
        tp = (partition.topic, partition.partition)
        with kafka_errors(f"get_watermark_offsets() of {partition.topic} [{partition.partition}]"):
            if not cached:
                self._broker.refresh()
            # two ListOffsets, as librdkafka's query_watermark_offsets sends (the earliest offset
            # does not depend on the isolation level)
            ((err_l, low, _),) = local_requests.list_offsets(self._broker, [(*tp, EARLIEST_TIMESTAMP)])
            ((err_h, high, _),) = local_requests.list_offsets(self._broker, [(*tp, LATEST_TIMESTAMP)], self._isolation)
        if err_l != Errors.NO_ERROR or err_h != Errors.NO_ERROR:
            raise kafka_exception(Errors.UNKNOWN_TOPIC_OR_PART, f"Unknown topic or partition: {partition.topic} [{partition.partition}]")
        return low, high

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        """For each partition whose ``offset`` holds a timestamp (ms): the earliest offset with a
        timestamp >= it, or -1 (OFFSET_END) when there is none.

        Raises:
            TypeError: ``partitions`` is not a list of TopicPartition.
            KafkaException: the catalog cannot be read.
        """
        self._check_open()
        partition_list(partitions, "offsets_for_times")
        with kafka_errors("offsets_for_times()"):
            self._broker.refresh()
            answer = local_requests.list_offsets(self._broker, [(tp.topic, tp.partition, tp.offset) for tp in partitions],
                                                 self._isolation)
        out = []
        for tp, (err, offset, _) in zip(partitions, answer):
            res = TopicPartition(tp.topic, tp.partition, offset if err == Errors.NO_ERROR else OFFSET_INVALID)
            if err != Errors.NO_ERROR:
                res.error = KafkaError(err)
            out.append(res)
        return out

    def _group(self) -> str:
        group = self._cfg["group.id"]
        if not group:
            raise kafka_exception(KafkaError._INVALID_ARG, "committing and fetching offsets needs group.id")
        return group

    def commit(self, message: Message | None = None, offsets: list[TopicPartition] | None = None,
               asynchronous: bool = True) -> list[TopicPartition] | None:
        """OffsetCommit (confluent-kafka's ``Consumer.commit``): the offset after ``message``, or
        ``offsets`` (each ``TopicPartition`` with its ``offset`` -- the next one to consume -- and
        ``metadata``, a string that :meth:`committed` returns unchanged), or else the current
        position of every assigned partition that moved past its last committed offset.

        A member commits with its generation and member id; without group membership
        (assign()) the commit carries generation -1, as Kafka's simple consumers do.

        Commits are sent one at a time, in call order, by the consumer's commit thread.

        Args:
            asynchronous: True: return None at once; the result, ``(KafkaError or None,
                [TopicPartition])``, goes to the ``on_commit`` callback, which the next
                ``poll()``/``consume()`` (or ``close()``) calls -- ``_NO_OFFSET`` when there was
                nothing to commit. False: wait for the answer.

        Returns:
            with ``asynchronous=False``, the committed partitions sorted by topic and partition,
            with their offsets and metadata.

        Raises:
            KafkaException: ``_INVALID_ARG`` without group.id; with ``asynchronous=False``,
                ``_NO_OFFSET`` when there is nothing to commit, or the commit's error (the last
                failed partition's: ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID,
                REBALANCE_IN_PROGRESS, OFFSET_METADATA_TOO_LARGE, ...; ``args[0]``).
            ValueError: both ``message`` and ``offsets``.
            TypeError: ``offsets`` is not a list of TopicPartition, ``message`` not a Message.
            RuntimeError: the consumer is closed.
        """
        self._check_open()
        if message is not None and offsets is not None:
            raise ValueError("message and offsets are mutually exclusive")
        if offsets is not None:
            partition_list(offsets, "commit")
        if message is not None and not isinstance(message, Message):
            raise TypeError(f"commit() requires a Message, not {type(message).__name__}")
        group = self._group()
        sent = self._send_commit(group, self._commit_request(message, offsets), report=asynchronous)
        if asynchronous:
            return None
        error, partitions = sent.result()
        if error is not None:
            raise KafkaException(error)
        return partitions

    def _auto_commit(self, wait: bool) -> None:
        """``enable.auto.commit``: commit the positions that moved (librdkafka's auto-commit).
        The result goes to ``on_commit``; with nothing to commit nothing happens. ``wait``:
        return once it is answered (before a rebalance and on close, as Kafka's
        ``maybeAutoCommitOffsetsSync``); else return at once (Kafka's ``maybeAutoCommitOffsetsAsync``)."""
        previous = self._auto_commit_sent
        if previous is not None and not previous.done():
            # the last auto-commit is still in flight: its offsets are not noted as committed
            # yet, so a new request would send them again (a second report of an unmoved
            # partition); the next interval takes whatever moved meanwhile
            if not wait:
                return
            previous.result()
        request = self._commit_request(None, None)
        if request.offsets:
            sent = self._auto_commit_sent = self._send_commit(self._group(), request, report=True)
            if wait:
                sent.result()

    def store_offsets(self, message: Message | None = None, offsets: list[TopicPartition] | None = None) -> None:
        """Store the offset after ``message``, or each of ``offsets`` (the next offset to consume,
        with its ``metadata``), as processed: auto-commit and :meth:`commit` without arguments
        commit the stored offsets (confluent-kafka's / librdkafka's ``store_offsets``; needs
        ``enable.auto.offset.store=false``).

        Raises:
            KafkaException: ``_INVALID_ARG`` with ``enable.auto.offset.store`` true;
                ``_UNKNOWN_PARTITION`` for a partition not assigned (the assigned ones are stored).
            ValueError: both or neither of ``message`` and ``offsets``.
            TypeError: ``message`` not a Message, ``offsets`` not a list of TopicPartition.
            RuntimeError: the consumer is closed.
        """
        self._check_open()
        if message is not None and offsets is not None:
            raise ValueError("message and offsets are mutually exclusive")
        if message is None and offsets is None:
            raise ValueError("expected either message or offsets")
        if message is not None and not isinstance(message, Message):
            raise TypeError(f"store_offsets() requires a Message, not {type(message).__name__}")
        if offsets is not None:
            partition_list(offsets, "store_offsets")
        if self._auto_store:
            raise kafka_exception(KafkaError._INVALID_ARG, "StoreOffsets failed: Local: Invalid argument or configuration "
                                                          "(set enable.auto.offset.store=false to store offsets)")
        wanted = ([TopicPartition(message.topic(), message.partition(), _offset_after(message),
                                  leader_epoch=message.leader_epoch())] if message is not None else
                  [TopicPartition(tp.topic, tp.partition, tp.offset, tp.metadata, tp.leader_epoch) for tp in offsets])
        unknown = []
        with self._lock:
            for tp in wanted:
                if (tp.topic, tp.partition) in self._assignment:
                    self._stored[(tp.topic, tp.partition)] = tp
                else:
                    unknown.append(f"{tp.topic} [{tp.partition}]")
        if unknown:
            raise kafka_exception(KafkaError._UNKNOWN_PARTITION, f"StoreOffsets failed: Local: Unknown partition "
                                                                f"(not assigned: {', '.join(unknown)})")

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Stop returning records of ``partitions`` from :meth:`poll`/:meth:`consume` until
        :meth:`resume` (confluent-kafka's ``pause``); their positions stay where they are. A
        partition that leaves the assignment is no longer paused.

        Raises:
            TypeError: ``partitions`` is not a list of TopicPartition.
            RuntimeError: the consumer is closed.
        """
        self._check_open()
        partition_list(partitions, "pause")
        with self._lock:
            self._paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        """Return records of paused ``partitions`` again (errors as :meth:`pause`)."""
        self._check_open()
        partition_list(partitions, "resume")
        with self._lock:
            self._paused -= {(tp.topic, tp.partition) for tp in partitions}

    def memberid(self) -> str | None:
        """This consumer's member id in its group (from JoinGroup), or None before it joined or
        without subscribe() (confluent-kafka's ``memberid``).

        Raises:
            RuntimeError: the consumer is closed.
        """
        self._check_open()
        membership = self._membership
        return (membership.member_id or None) if membership is not None else None

    def _commit_request(self, message: Message | None, offsets: list[TopicPartition] | None) -> _CommitRequest:
        """What a commit() asks for, taken now: copies of the absolute offsets, and the member identity."""
        if message is not None:
            wanted = [TopicPartition(message.topic(), message.partition(), _offset_after(message),
                                     leader_epoch=message.leader_epoch())]
        elif offsets is not None:
            wanted = [TopicPartition(tp.topic, tp.partition, tp.offset, tp.metadata, tp.leader_epoch) for tp in offsets]
        else:
            with self._lock:
                # librdkafka commits the stored offsets: with enable.auto.offset.store every
                # record returned is stored (the positions), else only what store_offsets() stored
                stored = (self.position(self.assignment()) if self._auto_store
                          else [self._stored[key] for key in self._assignment if key in self._stored])
                wanted = [tp for tp in stored
                          if tp.offset > self._committed.get((tp.topic, tp.partition), OFFSET_INVALID)]
        identity = (self._membership.commit_identity() if self._membership is not None
                    else (-1, "", self._cfg["group.instance.id"]))
        return _CommitRequest(tuple(sorted(tp for tp in wanted if tp.offset >= 0)), identity)

    def _send_commit(self, group: str, request: _CommitRequest, report: bool) -> Future:
        """Queue the commit on the commit thread; a Future of its :data:`CommitResult`.
        ``report``: hand the result to ``on_commit`` too."""
        with self._lock:
            if self._commit_sender is None:
                self._commit_sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txlake-commit")
            return self._commit_sender.submit(self._run_commit, group, request, report)

    def _run_commit(self, group: str, request: _CommitRequest, report: bool) -> CommitResult:
        """Send one OffsetCommit (on the commit thread) and note the offsets that were stored."""
        if not request.offsets:
            result: CommitResult = (KafkaError(KafkaError._NO_OFFSET, "Local: No offset stored"), [])
        else:
            try:
                answer = local_requests.offset_commit(self._broker, group, request.offsets, *request.identity)
            except Exception as exc:  # the engine failed: the caller still gets an answer
                log.error("offset commit of group %s failed: %s", group, exc, exc_info=True)
                answer = dict.fromkeys(((tp.topic, tp.partition) for tp in request.offsets),
                                       Errors.UNKNOWN_SERVER_ERROR)
            error, partitions = None, []
            for tp in request.offsets:
                done = TopicPartition(tp.topic, tp.partition, tp.offset, tp.metadata, tp.leader_epoch)
                code = answer[(tp.topic, tp.partition)]
                if code != Errors.NO_ERROR:
                    # librdkafka: the commit's error is that of the last partition that failed
                    error = done.error = KafkaError(code, f"offset commit of {tp.topic} [{tp.partition}] "
                                                          f"failed: {code.name}")
                else:
                    with self._lock:
                        self._committed[(tp.topic, tp.partition)] = tp.offset
                partitions.append(done)
            result = (error, partitions)
        if report:
            if self._on_commit is not None:
                self._commit_reports.append(result)
            elif result[0] is not None and result[0].code() != KafkaError._NO_OFFSET:
                log.warning("offset commit of group %s failed: %s", group, result[0].str())
        return result

    def _serve_commit_reports(self) -> None:
        """Call ``on_commit(err, partitions)`` for every commit answered since the last call, in order."""
        while self._commit_reports:
            error, partitions = self._commit_reports.popleft()
            self._on_commit(error, partitions)

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        """OffsetFetch: the group's committed offset of each partition (OFFSET_INVALID if none).

        Under read_committed the fetch requires stable offsets: while a transaction holds a
        pending offset commit for a partition (UNSTABLE_OFFSET_COMMIT), it backs off and
        retries until the transaction completes or ``timeout`` passes (KIP-447).

        Raises:
            KafkaException: ``_TIMED_OUT`` while offsets stay unstable; OffsetFetch's error for
                the group, e.g. CORRUPT_MESSAGE when its ``__consumer_offsets`` partition cannot be
                read (the engine logs the partition and object: Kafka's response has no message).
            TypeError: ``partitions`` is not a list of TopicPartition.
        """
        self._check_open()
        partition_list(partitions, "committed")
        group = self._group()
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        while True:
            with kafka_errors(f"committed() of group {group}"):
                answer = self._offset_fetch([(tp.topic, tp.partition) for tp in partitions], "committed()")
            if all(entry[3] != Errors.UNSTABLE_OFFSET_COMMIT for entry in answer.values()):
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise kafka_exception(KafkaError._TIMED_OUT,
                                      "committed offsets stayed unstable (a transaction holds pending offsets)")
            time.sleep(0.05)
        out = []
        for tp in partitions:
            offset, epoch, metadata, _ = answer[(tp.topic, tp.partition)]
            out.append(TopicPartition(tp.topic, tp.partition, offset if offset >= 0 else OFFSET_INVALID, metadata, epoch))
        return out

    def list_topics(self, topic: str | None = None, timeout: float = -1):
        """Cluster metadata (see :meth:`txlake.AdminClient.list_topics`)."""
        from .admin import cluster_metadata

        if self._closed:
            raise RuntimeError("Handle has been closed")  # confluent-kafka's text for this call
        return cluster_metadata(self._broker, topic)   # Metadata refreshes the catalog itself in-process

    def close(self) -> None:
        """Leave the group (auto-commit first, if enabled), wait for the commits still queued,
        serve their ``on_commit`` callbacks, and release the storage root. Idempotent."""
        if self._closed:
            return
        try:
            if self._membership is not None:
                self._membership.close()
        finally:
            self._closed = True
            try:
                if self._commit_sender is not None:
                    self._commit_sender.shutdown(wait=True)
                self._serve_commit_reports()
            finally:
                release_broker(self._broker)

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _messages(topic: str, partition: int, table, leader_epoch: int | None = None) -> list[Message]:
    offsets = table.column("offset").to_pylist()
    keys = table.column("key").to_pylist()
    values = table.column("value").to_pylist()
    timestamps = table.column("timestamp").to_pylist()
    ts_types = table.column("timestamp_type").to_pylist()
    headers_col = table.column("headers")
    headers = ([[(h["key"], h["value"]) for h in hs] if hs else None for hs in headers_col.to_pylist()]
               if headers_col.null_count < len(headers_col) else [None] * len(offsets))
    # Thousands of small objects at once: pause the cyclic GC, whose repeated passes over
    # the new objects would otherwise cost three times the creation itself (they hold no cycles).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return [Message._record(topic, partition, o, k, v, t, TIMESTAMP_LOG_APPEND_TIME if tt == 1 else TIMESTAMP_CREATE_TIME, h,
                                None, leader_epoch)
                for o, k, v, t, tt, h in zip(offsets, keys, values, timestamps, ts_types, headers)]
    finally:
        if gc_was_enabled:
            gc.enable()
