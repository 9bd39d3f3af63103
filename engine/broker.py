"""The embedded broker: Kafka's request handlers over the catalog and partition logs.

One :class:`Broker` serves one storage root inside a process; every client of that
process shares it. Its public methods are named after Kafka's APIs (CreateTopics,
DeleteTopics, Metadata, Produce, Fetch, ListOffsets, InitProducerId) and take and return
plain data with Kafka error codes, so the future network server is a thin layer.

Writes: a produce request is validated against the partition's producer state, given
offsets and queued; :mod:`.group_commit` makes the queue durable (one object and one
catalog commit per flush) and only then answers (acks=all). The high watermark moves
at the commit.

Reads never need the writer lease; the first write takes it, and with it the process
starts the transaction coordinator (timeouts, half-ended transactions), whatever client wrote.

The internal topics (``__consumer_offsets``, ``__transaction_state``) belong to the
coordinators: a client's Produce, CreateTopics, DeleteTopics and DeleteRecords on them are
refused (Kafka's ``ReplicaManager`` ``internalTopicsAllowed``); the coordinators' own calls pass
``internal_topics_allowed=True``. Fetch and ListOffsets of them stay open to everyone.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any, Callable

import numpy as np
import pyarrow.compute as pc

from txlake.catalog.catalog import Catalog
from txlake.catalog.errors import (CatalogError, CatalogGapError, InvalidConfigError, InvalidTopicError, UnknownTopicError,
                                   WriterFencedError, WriterLeaseHeldError)
from txlake.catalog.state import (ADD_PARTITIONS, CREATE_TOPIC, DELETE_TOPIC, LOG_START_OFFSET, PRODUCER_ID_BLOCK,
                                  REMOVE_SEGMENT, TOPIC_CONFIG, CatalogState, TopicState)
from txlake.catalog.storage import InvalidObjectKeyError, ObjectStore
from txlake.catalog.topic_config import alter_topic_config, cleanup_policies, effective_config, validate_topic_config
from txlake.catalog.topic_names import (CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, is_internal,
                                         unify_collision_chars, validate_topic_name)
from txlake.catalog.writer_lease import WriterLease
from txlake.formats.errors import FormatError
from txlake.formats.records import RECORD_SCHEMA

from . import log_loader
from .compaction import CompactionThread
from .errors import ApiError, Errors
from .group_coordinator import GroupConfig, GroupCoordinator
from .group_offsets import GroupOffsets
from .group_commit import DATA_PREFIX, SNAPSHOT_PREFIX, GroupCommitter, now_ms
from .handoff import Handler, HandoffServer
from .log_reader import LogReader
from .orphans import delete_orphans
from .partition_log import PartitionLog, TxnVerifier
from .requests import BrokerConfig, FetchResult, ProduceBatch, ProduceResult, TxnMarker
from .transaction_coordinator import TransactionCoordinator
from .transaction_state_manager import TransactionConfig

log = logging.getLogger(__name__)

__all__ = ["Broker", "BrokerConfig", "FetchResult", "ProduceBatch", "ProduceResult", "TxnMarker",
           "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "MAX_TIMESTAMP"]

PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdManager block size

# ListOffsets special timestamps (Kafka's ListOffsetsRequest).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3


class Broker:
    """Kafka's broker for one storage root, embedded in this process (thread-safe).

    Args:
        store: the storage root.
        config: broker settings.
    """

    def __init__(self, store: ObjectStore, config: BrokerConfig | None = None):
        self.config = config or BrokerConfig()
        self.store = store
        self.catalog = Catalog.open(store, self.config.checkpoint_interval)
        self.reader = LogReader(self.catalog, drop_retired=True)
        self.lease: WriterLease | None = None
        self._committer = GroupCommitter(store, self.catalog, self.config, self.reader.cache, self._commit,
                                         self._snapshot_producer_state, self._first_unstable_offset,
                                         lambda t, p: (t, p) in self._partitions, self._set_fatal)
        #: KIP-890 partition verification: ``(producer_id, epoch, topic, partition) -> Errors``; the
        #: transaction coordinator installs it. A transactional batch that opens a transaction on a
        #: partition is refused unless the coordinator has added the partition to the transaction.
        self.txn_verifier: TxnVerifier | None = None
        self._txn_coordinator: TransactionCoordinator | None = None
        self._txn_starting: TransactionCoordinator | None = None  # a start-up in progress (close cancels it)
        self._txn_election: threading.Thread | None = None  # starts the coordinator when the lease is taken
        self._txn_closing = threading.Event()
        self._group_coordinator: GroupCoordinator | None = None
        self._group_config = GroupConfig.from_properties(self.config.group)
        self._coordinator_lock = threading.Lock()
        self._group_coordinator_lock = threading.Lock()
        self._append_lock = self._committer.lock   # offsets, producer state and the queue change together
        self._commit_lock = self._committer.commit_lock  # one catalog writer at a time
        self._partitions: dict[tuple[str, int], PartitionLog] = {}  # the writer's partition logs
        self._fatal: Exception | None = None
        self._closed = False
        self._flusher_started = False
        self._next_producer_id = 0
        self._producer_id_block_end = 0
        self._last_refresh = 0.0
        self._handoff: HandoffServer | None = None
        #: hand-over kinds this broker's request surface answers (:meth:`serve_handoff`)
        self._handoff_handlers: dict[str, Handler] = {}
        self._group_offsets: GroupOffsets | None = None
        self._expiration_stop = threading.Event()
        self._expiration_thread: threading.Thread | None = None
        self._compaction: CompactionThread | None = None  # engine/compaction.py, started with the writer
        self._publication = None  # engine/table_publisher.py TablePublishThread, started with the writer

    def serve_handoff(self, kind: str, handler: Handler) -> None:
        """Answer hand-over requests of ``kind`` (engine/handoff.py) with ``handler(store,
        payload) -> result`` while this broker holds the writer lease: the request surface
        (engine/apis) registers the Kafka requests other processes hand over. Replaces an
        earlier handler of the kind."""
        self._handoff_handlers[kind] = handler

    # ---------------------------------------------------------------- writer start-up
    @property
    def is_writer(self) -> bool:
        """True while this process holds the writer lease (False once it learns it was fenced, or closed)."""
        return self.lease is not None and self.lease.held and self._fatal is None and not self._closed

    def ensure_writer(self) -> None:
        """Take the writer lease (first write), rebuild producer state, start the flusher.

        Raises:
            ApiError: NOT_LEADER_OR_FOLLOWER when another live writer holds the lease (the
                message names it and says what to do); _FENCED after this process lost it;
                KAFKA_STORAGE_ERROR when the catalog log has a gap at the number the lease
                would take (the message names the missing commit; docs/operations.md).
        """
        if self.is_writer:
            return
        if self._fatal is not None:  # checked before any lock: a fenced writer answers at once
            raise ApiError(Errors._FENCED, str(self._fatal))
        with self._commit_lock:
            if self._fatal is not None:
                raise ApiError(Errors._FENCED, str(self._fatal))
            if self._closed:
                raise ApiError(Errors._STATE, f"the engine of {self.store.url} is closed")
            if self.is_writer:
                return
            lease = WriterLease(self.catalog, self.config.lease_ms)
            try:
                lease.acquire(force=self.config.lease_force)
            except WriterLeaseHeldError as exc:
                raise ApiError(Errors.NOT_LEADER_OR_FOLLOWER, str(exc)) from exc
            except CatalogGapError as exc:  # the log lost a commit: as Kafka answers for a log dir it cannot use
                raise ApiError(Errors.KAFKA_STORAGE_ERROR, str(exc)) from exc
            lease.start_heartbeats()
            try:
                self._load_writer_state()
            except Exception as exc:  # not the writer until its state is loaded: give the lease back
                lease.release()
                raise ApiError(Errors.KAFKA_STORAGE_ERROR, f"loading the writer state of {self.store.url} "
                                                           f"failed: {exc}") from exc
            self.lease = lease
            self._committer.start()
            self._flusher_started = True
            self._expiration_thread = threading.Thread(target=self._expire_producers_loop, daemon=True,
                                                       name="txlake-producer-id-expiration")
            self._expiration_thread.start()
            # writes other processes hand over while this one holds the lease (engine/handoff.py)
            self._handoff = HandoffServer(self.store, self.config.handoff_poll_ms,
                                          lambda: self.is_writer, self._handoff_handlers)
            self._handoff.start()
            try:
                removed = delete_orphans(self.store, self.catalog, [DATA_PREFIX, SNAPSHOT_PREFIX],
                                         self.config.orphan_grace_ms)
                if removed:
                    log.info("deleted %d orphaned objects under %s", len(removed), self.store.url)
            except Exception as exc:  # cleaning is best effort; it never blocks writing
                log.warning("orphan cleanup failed: %s", exc)
            if self.config.compaction_interval_ms > 0:
                self._compaction = CompactionThread(self, self.config.compaction_interval_ms)
                self._compaction.start()
            if self.config.publish_interval_ms > 0:
                from .table_publisher import TablePublishThread, table_configuration

                self._publication = TablePublishThread(self, self.config.publish_interval_ms, table_configuration(
                    self.config.catalog_retention_ms, self.config.file_delete_delay_ms))
                self._publication.start()
            # taking the lease is the transaction coordinator's election (Kafka's onElection): it
            # starts now, whatever client took the lease, so that transactions left Ongoing or
            # half-ended by an earlier writer are timed out and finished with no transactional client
            self._txn_election = threading.Thread(target=self._elect_transaction_coordinator, daemon=True,
                                                  name="txlake-txn-coordinator-election")
            self._txn_election.start()

    def _load_writer_state(self) -> None:
        """Producer ids continue after the last block; producer state = snapshot + log replay."""
        state = self.catalog.state
        self._next_producer_id = self._producer_id_block_end = state.next_producer_id
        managers = log_loader.load_producer_states(self.store, state, self.reader)
        for topic in state.topics.values():
            for p in topic.partitions:
                self._partitions[(topic.name, p.partition)] = PartitionLog(
                    topic.name, p.partition, p.high_watermark, managers[(topic.name, p.partition)])

    def _first_unstable_offset(self, topic: str, partition: int) -> int | None:
        log_ = self._partitions.get((topic, partition))
        return log_.first_unstable_offset() if log_ is not None else None

    def _snapshot_producer_state(self) -> tuple[list, dict]:
        """Rows and per-partition end offsets of all producer state (called under the append lock)."""
        rows: list = []
        ends: dict = {}
        state = self.catalog.state
        for (topic, partition), log_ in self._partitions.items():
            rows.extend(log_.snapshot_rows())
            t = state.topics[topic]
            entry = ends.setdefault(topic, {"topic_id": t.topic_id, "end_offsets": [0] * len(t.partitions)})
            entry["end_offsets"][partition] = log_.log_end_offset
        return rows, ends

    # ---------------------------------------------------------------- metadata / admin
    def refresh(self, min_interval_ms: int = 0) -> bool:
        """Look for commits this process did not write (rate-limited to one look per ``min_interval_ms``).

        A reader applies them. A writer normally finds none; if it does, another process
        took the lease over: this writer is fenced from then on (its writes answer
        ``_FENCED``) and it goes on as a reader, so its consumers keep tailing.
        """
        now = time.monotonic()
        if (now - self._last_refresh) * 1000 < min_interval_ms:
            return False
        self._last_refresh = now
        if self.is_writer:
            with self._commit_lock:
                if not self.catalog.has_foreign_commit():
                    return False
                self._set_fatal(WriterFencedError(
                    f"another process committed to {self.store.url} after catalog version {self.catalog.version}: "
                    "this process lost the writer lease and can commit nothing more"))
        return self.catalog.refresh()

    def topics(self) -> dict[str, TopicState]:
        """The topics as of the catalog version this process has seen (Metadata)."""
        with self.catalog.lock:
            return dict(self.catalog.state.topics)

    def create_topics(self, specs: list[tuple[str, int, dict]], validate_only: bool = False,
                      internal_topics_allowed: bool = False) -> list[tuple[Errors, str]]:
        """CreateTopics: ``specs`` of ``(name, num_partitions or -1, config overrides)``.

        Returns one ``(error, message)`` per spec: NO_ERROR, INVALID_REQUEST (an internal
        topic, see below), INVALID_TOPIC_EXCEPTION, TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS,
        INVALID_CONFIG. All valid topics are created in one catalog commit.

        ``__consumer_offsets`` and ``__transaction_state`` are created only by their
        coordinators (``internal_topics_allowed=True``, as Kafka's ``AutoTopicCreationManager``
        creates them), with the partition count and config the coordinators read them with;
        a client's request answers INVALID_REQUEST "Creation of internal topic X is
        prohibited." -- the answer Kafka's ``ControllerApis.createTopics`` gives for its
        prohibited internal topic. (Kafka's broker lets a client create these two; a txlake
        coordinator cannot work with another layout, so txlake refuses them too.)
        """
        results: list[tuple[Errors, str]] = []
        actions = []
        with self._commit_lock:
            if not validate_only:
                self.ensure_writer()
            state = self.catalog.state
            seen = {unify_collision_chars(n): n for n in state.topics}
            for name, num_partitions, config in specs:
                if is_internal(name) and not internal_topics_allowed:
                    results.append((Errors.INVALID_REQUEST, f"Creation of internal topic {name} is prohibited."))
                    continue
                try:
                    validate_topic_name(name)
                    if name in state.topics or name in {a["topic"] for a in actions}:
                        raise ApiError(Errors.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
                    other = seen.get(unify_collision_chars(name))
                    if other is not None:
                        raise ApiError(Errors.INVALID_TOPIC_EXCEPTION, f"Topic '{name}' collides with existing topic: {other}")
                    n = self.config.num_partitions if num_partitions in (None, -1) else num_partitions
                    if not isinstance(n, int) or n < 1:
                        raise ApiError(Errors.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
                    overrides = validate_topic_config(config)
                except InvalidTopicError as exc:
                    results.append((Errors.INVALID_TOPIC_EXCEPTION, str(exc)))
                    continue
                except InvalidConfigError as exc:
                    results.append((Errors.INVALID_CONFIG, str(exc)))
                    continue
                except ApiError as exc:
                    results.append((exc.error, exc.message))
                    continue
                seen[unify_collision_chars(name)] = name
                actions.append({"action": CREATE_TOPIC, "topic": name, "topic_id": uuid.uuid4().hex,
                                "num_partitions": n, "config": overrides})
                results.append((Errors.NO_ERROR, ""))
            if actions and not validate_only:
                self._commit(actions)
                with self._append_lock:
                    for a in actions:
                        for p in range(a["num_partitions"]):
                            self._partitions[(a["topic"], p)] = PartitionLog(a["topic"], p)
        return results

    def delete_topics(self, names: list[str]) -> list[tuple[Errors, str]]:
        """DeleteTopics: one ``(error, message)`` per name (UNKNOWN_TOPIC_OR_PART if missing).

        Queued records of a deleted topic are flushed first; its objects become orphans
        that the cleaner removes after the grace period.

        An internal topic (``__consumer_offsets``, ``__transaction_state``) is never deleted:
        INVALID_TOPIC_EXCEPTION, the code Kafka's broker refuses a destructive request on an
        internal topic with (DeleteRecords), with the message of Kafka's ``TopicCommand``
        ("... is a kafka internal topic and is not allowed to be marked for deletion."). Kafka's
        broker itself deletes them on request; txlake keeps every group's offsets and every
        open transaction's state instead.
        """
        self.ensure_writer()
        self.flush()
        results = []
        with self._commit_lock:
            actions = []
            for name in names:
                if is_internal(name):
                    results.append((Errors.INVALID_TOPIC_EXCEPTION, f"Topic {name} is a kafka internal topic and is "
                                    "not allowed to be marked for deletion."))
                    continue
                topic = self.catalog.state.topics.get(name)
                if topic is None:
                    results.append((Errors.UNKNOWN_TOPIC_OR_PART, f"Topic '{name}' does not exist"))
                    continue
                actions.append({"action": DELETE_TOPIC, "topic": name, "topic_id": topic.topic_id})
                results.append((Errors.NO_ERROR, ""))
            if actions:
                self._commit(actions)
                with self._append_lock:
                    gone = {a["topic"] for a in actions}
                    self._partitions = {k: v for k, v in self._partitions.items() if k[0] not in gone}
        return results

    def create_partitions(self, specs: list[tuple[str, int]], validate_only: bool = False) -> list[tuple[Errors, str | None]]:
        """CreatePartitions: grow each topic of ``specs`` ``(name, new total partition count)``
        (Kafka's ``ReplicationControlManager.createPartitions``).

        Returns one ``(error, message)`` per spec: NO_ERROR; UNKNOWN_TOPIC_OR_PART (message
        None, as Kafka); INVALID_PARTITIONS "Topic already has N partition(s)." or "The topic T
        currently has N partition(s); C would not be an increase."; INVALID_REQUEST for an
        internal topic (its coordinator reads a fixed partition count; Kafka's broker would
        grow it). All growths commit in one catalog commit (``add_partitions`` actions); the new
        partitions are empty (log start offset = high watermark = 0) and writable at once.
        Records keep their partitions: keys hash to other partitions from then on, as in Kafka.

        Raises:
            ApiError: NOT_LEADER_OR_FOLLOWER / _FENCED when this process cannot be the writer.
        """
        def plan(state: CatalogState, spec: tuple[str, int]) -> tuple[Errors, str | None, dict | None]:
            name, count = spec
            topic = state.topics.get(name)
            if topic is None:
                return Errors.UNKNOWN_TOPIC_OR_PART, None, None
            if is_internal(name):
                return Errors.INVALID_REQUEST, (f"Cannot add partitions to internal topic {name}: its coordinator "
                                                f"reads a fixed partition count ({len(topic.partitions)})."), None
            current = len(topic.partitions)
            if count == current:
                return Errors.INVALID_PARTITIONS, f"Topic already has {current} partition(s).", None
            if count < current:
                return Errors.INVALID_PARTITIONS, (f"The topic {name} currently has {current} partition(s); "
                                                   f"{count} would not be an increase."), None
            return Errors.NO_ERROR, None, {"action": ADD_PARTITIONS, "topic": name, "topic_id": topic.topic_id,
                                           "num_partitions": count}

        results, actions = self._plan_and_commit(specs, plan, validate_only)
        if actions and not validate_only:
            # the writer state of the new partitions: a Produce to one answers UNKNOWN_TOPIC_OR_PART
            # (retriable) until it exists, never appends before the catalog has the partition
            with self._append_lock:
                for a in actions:
                    for p in range(a["num_partitions"]):
                        if (a["topic"], p) not in self._partitions:
                            self._partitions[(a["topic"], p)] = PartitionLog(a["topic"], p)
        return results

    def alter_topic_configs(self, changes: list[tuple[str, list[tuple[str, int, str | None]]]],
                            validate_only: bool = False) -> list[tuple[Errors, str | None]]:
        """IncrementalAlterConfigs of topics: apply each ``(topic, ops)`` (see
        :func:`txlake.catalog.topic_config.alter_topic_config`) to the topic's overrides (Kafka's
        ``ConfigurationControlManager.incrementalAlterConfigs``).

        Returns one ``(error, message)`` per change: NO_ERROR; INVALID_TOPIC_EXCEPTION (a name
        Kafka refuses); INVALID_CONFIG (an unknown name, an invalid value, APPEND/SUBTRACT on a
        non-LIST config: Kafka's messages); UNKNOWN_TOPIC_OR_PART "The topic 'T' does not exist."
        (checked after the configs, as Kafka). The changed topics commit in one catalog commit
        (``topic_config`` actions holding the whole new override set); the engine reads a topic's
        config at each use, so a change holds from the next append, fetch or compaction round.

        Raises:
            ApiError: NOT_LEADER_OR_FOLLOWER / _FENCED when this process cannot be the writer.
        """
        def plan(state: CatalogState, change: tuple[str, list]) -> tuple[Errors, str | None, dict | None]:
            name, ops = change
            topic = state.topics.get(name)
            try:
                validate_topic_name(name)
                new = alter_topic_config(topic.config if topic is not None else {}, ops)
            except InvalidTopicError as exc:
                return Errors.INVALID_TOPIC_EXCEPTION, str(exc), None
            except InvalidConfigError as exc:
                return Errors.INVALID_CONFIG, str(exc), None
            if topic is None:
                return Errors.UNKNOWN_TOPIC_OR_PART, f"The topic '{name}' does not exist.", None
            if new == topic.config:
                return Errors.NO_ERROR, None, None
            return Errors.NO_ERROR, None, {"action": TOPIC_CONFIG, "topic": name, "topic_id": topic.topic_id,
                                           "config": new}

        return self._plan_and_commit(changes, plan, validate_only)[0]

    def _plan_and_commit(self, items: list, plan: Callable[[CatalogState, Any], tuple[Errors, str | None, dict | None]],
                         validate_only: bool) -> tuple[list[tuple[Errors, str | None]], list[dict]]:
        """Under the commit lock (as the writer, unless ``validate_only``): ``plan(state, item) ->
        (error, message, action or None)`` for each item, then one catalog commit of the actions
        (none when ``validate_only``). Returns the ``(error, message)`` per item and the actions."""
        results: list[tuple[Errors, str | None]] = []
        actions: list[dict] = []
        with self._commit_lock:
            if not validate_only:
                self.ensure_writer()
            state = self.catalog.state
            for item in items:
                error, message, action = plan(state, item)
                results.append((error, message))
                if action is not None:
                    actions.append(action)
            if actions and not validate_only:
                self._commit(actions)
        return results, actions

    def _commit(self, actions: list[dict]) -> int:
        try:
            return self.catalog.commit(actions, self.lease.epoch if self.lease else None)
        except (WriterFencedError, CatalogError) as exc:
            self._set_fatal(exc)
            raise ApiError(Errors._FENCED, str(exc)) from exc

    def commit_under_lock(self, build: Callable[[CatalogState], list[dict] | None]) -> int | None:
        """Commit the actions ``build(state)`` computes from the current catalog state, under the
        commit lock (so nothing commits in between) and the writer lease: compaction's segment
        swaps and object retirement (engine/compaction.py). ``build`` returns None to commit nothing
        and may raise to refuse (nothing is committed).

        Returns:
            The new catalog version, or None when nothing was committed.

        Raises:
            ApiError: NOT_LEADER_OR_FOLLOWER / _FENCED / _STATE when this process cannot commit.
        """
        self.ensure_writer()
        with self._commit_lock:
            if self._closed:
                raise ApiError(Errors._STATE, f"the engine of {self.store.url} is closed")
            actions = build(self.catalog.state)
            return self._commit(actions) if actions else None

    # ---------------------------------------------------------------- producer ids
    def init_producer_id(self) -> tuple[Errors, int, int]:
        """InitProducerId for an idempotent (non-transactional) producer: ``(error, producer_id, epoch 0)``.

        Ids come from blocks of 1000 recorded in the catalog (Kafka's ProducerIdManager),
        so no id is ever handed out twice, across restarts and writers.
        """
        self.ensure_writer()
        with self._commit_lock:
            if self._next_producer_id >= self._producer_id_block_end:
                end = self.catalog.state.next_producer_id + PRODUCER_ID_BLOCK_SIZE
                self._commit([{"action": PRODUCER_ID_BLOCK, "producer_id": end}])
                self._next_producer_id = end - PRODUCER_ID_BLOCK_SIZE
                self._producer_id_block_end = end
            pid = self._next_producer_id
            self._next_producer_id += 1
        return Errors.NO_ERROR, pid, 0

    # ---------------------------------------------------------------- produce
    def produce(self, batches: list[ProduceBatch], timeout_ms: int = 30_000,
                internal_topics_allowed: bool = False) -> list[ProduceResult]:
        """Produce (acks=all): append and wait until the batches are committed (see :meth:`produce_async`)."""
        futures = self.produce_async(batches, internal_topics_allowed)
        deadline = time.monotonic() + timeout_ms / 1000
        results = []
        for fut in futures:
            try:
                results.append(fut.result(timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                results.append(ProduceResult(Errors.REQUEST_TIMED_OUT, message="commit did not complete in time"))
        return results

    def produce_async(self, batches: list[ProduceBatch], internal_topics_allowed: bool = False) -> list[Future]:
        """Validate and queue ``batches``; each future resolves to a :class:`ProduceResult` after the commit.

        Validation errors (UNKNOWN_TOPIC_OR_PART, MESSAGE_TOO_LARGE, INVALID_PRODUCER_EPOCH,
        OUT_OF_ORDER_SEQUENCE_NUMBER, ...) resolve at once; a duplicate resolves at once
        to the original offsets (KIP-98).

        ``internal_topics_allowed`` (Kafka's ``ReplicaManager.appendRecords`` argument): only
        the coordinators' own appends pass True. Otherwise a batch for ``__consumer_offsets`` or
        ``__transaction_state`` answers INVALID_TOPIC_EXCEPTION "Cannot append to internal topic
        X" and nothing is appended. (Kafka's ``KafkaApis`` passes True for a Produce request
        whose client id is ``__admin_client``; a wire server does the same.)
        """
        try:
            self.ensure_writer()
        except ApiError as exc:
            return [_done(ProduceResult(exc.error, message=exc.message)) for _ in batches]
        with self._append_lock:
            return [self._append(batch, internal_topics_allowed) for batch in batches]

    def _append(self, batch: ProduceBatch, internal_topics_allowed: bool) -> Future:
        """Route one batch to its partition log (Kafka's ``ReplicaManager.appendRecords``; the
        caller holds the append lock): the partition must exist and, unless
        ``internal_topics_allowed``, not be internal; :meth:`PartitionLog.append` validates and
        assigns offsets; the accepted batch joins the commit queue."""
        if self._fatal is not None:
            return _done(ProduceResult(Errors._FENCED, message=str(self._fatal)))
        log_ = self._partitions.get((batch.topic, batch.partition))
        topic = self.catalog.state.topics.get(batch.topic)
        if log_ is None or topic is None:
            return _done(ProduceResult(Errors.UNKNOWN_TOPIC_OR_PART,
                                       message=f"Unknown topic or partition: {batch.topic} [{batch.partition}]"))
        if not internal_topics_allowed and is_internal(batch.topic):
            return _done(ProduceResult(Errors.INVALID_TOPIC_EXCEPTION,
                                       message=f"Cannot append to internal topic {batch.topic}"))
        appended = log_.append(batch, effective_config(topic.config), self.txn_verifier)
        if isinstance(appended, ProduceResult) and appended.duplicate:
            return self._committer.answer_duplicate(batch.topic, batch.partition, appended)
        if isinstance(appended, ProduceResult):
            return _done(appended)
        self._committer.enqueue(appended, batch.records.nbytes)
        return appended.future

    def flush(self, timeout_ms: int = 60_000) -> None:
        """Wait until every batch queued so far is committed (or failed)."""
        self._committer.flush(timeout_ms)

    def request_flush(self) -> None:
        """Commit what is queued now instead of after the writer's linger; does not wait."""
        self._committer.request_flush()

    # ---------------------------------------------------------------- producer state retention
    def remove_expired_producers(self, now: int | None = None) -> dict[tuple[str, int], list[int]]:
        """Forget, on every partition, the producers idle for ``producer.id.expiration.ms``
        with no transaction open (Kafka's ``UnifiedLog.removeExpiredProducers``, run every
        ``producer.id.expiration.check.interval.ms``). The next snapshot no longer holds them.

        Args:
            now: the current time (ms since the epoch); the wall clock when None.

        Returns:
            ``{(topic, partition): [expired producer ids]}`` for the partitions that lost any.
        """
        now = now_ms() if now is None else now
        expired: dict[tuple[str, int], list[int]] = {}
        with self._append_lock:
            for tp, log_ in self._partitions.items():
                gone = log_.remove_expired_producers(now, self.config.producer_id_expiration_ms)
                if gone:
                    expired[tp] = gone
        return expired

    def _expire_producers_loop(self) -> None:
        interval = self.config.producer_id_expiration_check_interval_ms / 1000
        while not self._expiration_stop.wait(interval):
            try:
                self.remove_expired_producers()
            except Exception as exc:  # one bad round must not end the job
                log.warning("removing expired producers failed: %s", exc)

    # ---------------------------------------------------------------- DeleteRecords
    def delete_records(self, requests: list[tuple[str, int, int]], timeout_ms: int = 30_000,
                       internal_topics_allowed: bool = False) -> list[tuple[Errors, int, str | None]]:
        """DeleteRecords: advance each partition's log start offset (Kafka's
        ``ReplicaManager.deleteRecords`` / ``UnifiedLog.maybeIncrementLogStartOffset``).

        Args:
            requests: ``(topic, partition, offset)``; offset -1 means the high watermark
                (Kafka's ``DeleteRecordsRequest.HIGH_WATERMARK``).

        Returns:
            ``(error, low_watermark, message)`` per request, in order: the partition's log
            start offset after the call (it never moves back), or -1 with UNKNOWN_TOPIC_OR_PART,
            INVALID_TOPIC_EXCEPTION (an internal topic, unless ``internal_topics_allowed``: Kafka's
            ``ReplicaManager.deleteRecordsOnLocalLog`` answers "Cannot delete records of internal
            topic X"; only the engine's own retention passes True), OFFSET_OUT_OF_RANGE (an
            offset below -1 or past the high watermark) or POLICY_VIOLATION (the topic's
            ``cleanup.policy`` lacks ``delete``).

        Records below the new log start offset become unreadable at once (Fetch answers
        OFFSET_OUT_OF_RANGE, committed views start there); segments wholly below it leave
        the catalog. The producer state they produced stays (KIP-360): the same catalog
        commit holds a producer-state snapshot, so a restart does not need those segments.

        Raises:
            ApiError: NOT_LEADER_OR_FOLLOWER / _FENCED when this process cannot be the writer;
                REQUEST_TIMED_OUT when the commit does not happen within ``timeout_ms``.
        """
        self.ensure_writer()
        answers: list[tuple[Errors, int, str | None]] = []
        actions: list[dict] = []
        targets: dict[tuple[str, int], int] = {}
        with self.catalog.lock:
            state = self.catalog.state
            for topic, partition, offset in requests:
                try:
                    p = state.partition(topic, partition)
                except UnknownTopicError as exc:
                    answers.append((Errors.UNKNOWN_TOPIC_OR_PART, -1, str(exc)))
                    continue
                if not internal_topics_allowed and is_internal(topic):
                    answers.append((Errors.INVALID_TOPIC_EXCEPTION, -1, f"Cannot delete records of internal topic {topic}"))
                    continue
                if "delete" not in cleanup_policies(state.topics[topic].config):
                    answers.append((Errors.POLICY_VIOLATION, -1, f"Records of partition {topic}-{partition} can not "
                                    "be deleted due to the configured policy (cleanup.policy has no 'delete')"))
                    continue
                target = p.high_watermark if offset == -1 else offset
                if target < 0 or target > p.high_watermark:
                    answers.append((Errors.OFFSET_OUT_OF_RANGE, -1, f"Cannot increment the log start offset of "
                                    f"{topic}-{partition} to {offset}: it is past the high watermark {p.high_watermark}"))
                    continue
                new_start = max(targets.get((topic, partition), p.log_start_offset), target)
                targets[(topic, partition)] = new_start
                answers.append((Errors.NO_ERROR, new_start, None))
            for (topic, partition), new_start in targets.items():
                p = state.partition(topic, partition)
                if new_start <= p.log_start_offset:
                    continue
                actions.append({"action": LOG_START_OFFSET, "topic": topic, "partition": partition, "offset": new_start})
                actions.extend({"action": REMOVE_SEGMENT, "topic": topic, "partition": partition, "path": seg.path,
                                "base_offset": seg.base_offset} for seg in p.segments if seg.last_offset < new_start)
        if actions:
            try:
                self._committer.commit_with_snapshot(actions).result(timeout=timeout_ms / 1000)
            except TimeoutError:
                raise ApiError(Errors.REQUEST_TIMED_OUT, f"DeleteRecords was not committed within {timeout_ms} ms") from None
        return answers

    # ---------------------------------------------------------------- transaction coordinator
    def transaction_coordinator(self) -> TransactionCoordinator:
        """The transaction coordinator of this storage root (it runs in the writer).

        Its coordinator epoch is the writer-lease epoch. Taking the lease starts it on a thread
        of its own (:meth:`ensure_writer`, Kafka's ``onElection``), whatever client took the
        lease; this call waits for that start-up, or starts it. Starting loads
        ``__transaction_state`` (without creating it), finishes the transactions a previous
        writer left in PrepareCommit/PrepareAbort, and starts the scheduler that aborts
        transactions past their ``transaction.timeout.ms``
        (``transaction.abort.timed.out.transaction.cleanup.interval.ms``).

        Raises:
            ApiError: NOT_LEADER_OR_FOLLOWER / _FENCED when this process cannot be the writer;
                _STATE when the engine is closing.
        """
        self.ensure_writer()
        # not the commit lock: starting up writes markers, which wait for commits
        with self._coordinator_lock:
            if self._txn_coordinator is None:
                if self._txn_closing.is_set():
                    raise ApiError(Errors._STATE, f"the engine of {self.store.url} is closed")
                coordinator = TransactionCoordinator(self, self.lease.epoch, self._transaction_config(),
                                                     group_partition_for=self.group_offsets().partition_for)
                self._txn_starting = coordinator
                if self._txn_closing.is_set():  # close() may have looked for it just before
                    coordinator.cancel()
                try:
                    coordinator.startup()
                except BaseException:
                    coordinator.shutdown()
                    raise
                finally:
                    self._txn_starting = None
                if coordinator.cancelled:  # close() stopped the start-up
                    coordinator.shutdown()
                    raise ApiError(Errors._STATE, f"the engine of {self.store.url} is closed")
                self.txn_verifier = coordinator.verify_partition
                self._txn_coordinator = coordinator
            return self._txn_coordinator

    def transaction_version(self) -> int:
        """The finalized level of Kafka's ``transaction.version`` feature (KIP-890) that ApiVersions
        advertises: the broker config ``transaction.version`` (0..2), default 2 (Kafka 4.x's
        default for a new cluster). Clients use transaction version 2 only at level 2."""
        return int(self.config.transaction.get("transaction.version", 2))

    def _transaction_config(self) -> TransactionConfig:
        """The coordinator's configs; the partition count of an existing ``__transaction_state``
        wins over ``transaction.state.log.num.partitions`` (Kafka's coordinator takes the count from
        the topic, its config only for a topic yet to be created), so any writer -- whatever its
        config -- can load it."""
        config = TransactionConfig.from_properties(self.config.transaction)
        existing = self.topics().get(TRANSACTION_STATE_TOPIC)
        if existing is not None and len(existing.partitions) != config.transaction_log_num_partitions:
            config = dataclasses.replace(config, transaction_log_num_partitions=len(existing.partitions))
        return config

    def _elect_transaction_coordinator(self) -> None:
        """Start the coordinator of the writer that just took the lease (on its own thread, so the
        first write never waits for the load). A failure is logged; the next transactional request
        tries again."""
        try:
            self.transaction_coordinator()
        except ApiError as exc:
            if not self._txn_closing.is_set():
                log.warning("the transaction coordinator of %s did not start: %s %s", self.store.url,
                            exc.error.name, exc.message)
        except Exception as exc:  # noqa: BLE001 - a thread of its own: nobody else would see it
            log.error("the transaction coordinator of %s did not start (transactions left open or "
                      "half-ended are not finished until it does): %s", self.store.url, exc)

    def group_offsets(self) -> GroupOffsets:
        """Consumer-group offsets in ``__consumer_offsets`` (commits take the writer lease; fetches read)."""
        if self._group_offsets is None:   # one per broker: it keeps the topic's partition count once seen
            self._group_offsets = GroupOffsets(self, self._group_config.offsets_topic_num_partitions,
                                               group_coordinator=self.group_coordinator)
        return self._group_offsets

    def group_coordinator(self) -> GroupCoordinator:
        """The group coordinator of this storage root (started on first use, in the writer).

        Starting it replays the group records of every ``__consumer_offsets`` partition
        (Kafka's ``GroupMetadataManager`` load): groups come back with their generation,
        members and assignments. Its records are appended to the group's partition.

        Raises:
            ApiError: NOT_LEADER_OR_FOLLOWER / _FENCED when this process cannot be the writer.
        """
        self.ensure_writer()
        with self._group_coordinator_lock:
            if self._group_coordinator is None:
                offsets = self.group_offsets()
                offsets.ensure_topic()
                coordinator = GroupCoordinator(offsets.append_group_record, self._group_config, offsets=offsets)
                for partition in range(offsets.num_partitions):  # the topic's count, whatever the config
                    coordinator.load(offsets.records(partition), f"{CONSUMER_OFFSETS_TOPIC}-{partition}")
                coordinator.startup()
                self._group_coordinator = coordinator
            return self._group_coordinator

    # ---------------------------------------------------------------- transaction markers
    def write_txn_markers(self, markers: list[TxnMarker], timeout_ms: int = 30_000) -> list[dict[tuple[str, int], Errors]]:
        """WriteTxnMarkers: append a COMMIT or ABORT control batch to each partition of each marker.

        Answers per marker, per partition: NO_ERROR once the marker is committed;
        UNKNOWN_TOPIC_OR_PART; INVALID_PRODUCER_EPOCH (older producer epoch);
        TRANSACTION_COORDINATOR_FENCED (older coordinator epoch). An ABORT marker adds an
        entry to the partition's aborted-transaction index when the producer wrote to it.
        """
        return self.await_txn_markers(self.append_txn_markers(markers), timeout_ms)

    def append_txn_markers(self, markers: list[TxnMarker],
                           urgent: bool = True) -> list[dict[tuple[str, int], "Errors | Future"]]:
        """The first half of :meth:`write_txn_markers`: validate and queue the markers.

        Answers per marker, per partition: an error (the marker was refused) or a Future of
        its :class:`ProduceResult`. Queued markers commit in queue order with everything
        appended after them: anything appended later is never durable without them.
        ``urgent`` False lets them wait for the writer's linger, for a caller that queues an
        urgent record right behind them (they then commit in the same flush).
        """
        try:
            self.ensure_writer()
        except ApiError as exc:
            return [{tp: exc.error for tp in m.partitions} for m in markers]
        answers: list[dict[tuple[str, int], Errors | Future]] = []
        with self._append_lock:
            for marker in markers:
                answer: dict[tuple[str, int], Errors | Future] = {}
                for tp in marker.partitions:
                    answer[tp] = self._append_marker(marker, tp, urgent)
                answers.append(answer)
        return answers

    @staticmethod
    def await_txn_markers(answers: list[dict[tuple[str, int], "Errors | Future"]],
                          timeout_ms: int = 30_000) -> list[dict[tuple[str, int], Errors]]:
        """The second half of :meth:`write_txn_markers`: wait for the queued markers' commit."""
        deadline = time.monotonic() + timeout_ms / 1000
        out = []
        for answer in answers:
            resolved = {}
            for tp, value in answer.items():
                if isinstance(value, Future):
                    try:
                        value = value.result(timeout=max(0.0, deadline - time.monotonic())).error
                    except TimeoutError:
                        value = Errors.REQUEST_TIMED_OUT
                resolved[tp] = value
            out.append(resolved)
        return out

    def _append_marker(self, marker: TxnMarker, tp: tuple[str, int], urgent: bool) -> Errors | Future:
        if self._fatal is not None:
            return Errors._FENCED
        log_ = self._partitions.get(tp)
        if log_ is None:
            return Errors.UNKNOWN_TOPIC_OR_PART
        appended = log_.append_marker(marker, urgent)
        if isinstance(appended, Errors):
            return appended
        self._committer.enqueue(appended, appended.batch.records.nbytes)
        return appended.future

    def _set_fatal(self, exc: Exception) -> None:
        if self._fatal is None:
            self._fatal = exc
            log.error("the writer of %s stops: %s", self.store.url, exc)

    # ---------------------------------------------------------------- reads
    def fetch(self, topic: str, partition: int, offset: int, max_records: int = 10_000,
              isolation_level: str = "read_uncommitted") -> FetchResult:
        """Fetch committed records from ``offset`` up to the high watermark (read_uncommitted)
        or the LSO (read_committed). OFFSET_OUT_OF_RANGE outside [log start, high watermark]."""
        with self.catalog.lock:
            try:
                p = self.catalog.state.partition(topic, partition)
            except UnknownTopicError as exc:
                return FetchResult(Errors.UNKNOWN_TOPIC_OR_PART, message=str(exc))
            hw, lso, start = p.high_watermark, p.last_stable_offset, p.log_start_offset
            aborted = p.aborted_in(offset, lso) if isolation_level == "read_committed" else []
        bound = lso if isolation_level == "read_committed" else hw
        if offset < start or offset > hw:
            return FetchResult(Errors.OFFSET_OUT_OF_RANGE, hw, lso, start,
                               message=f"offset {offset} is out of range [{start}, {hw}] for {topic} [{partition}]")
        try:
            records = self.reader.read(topic, partition, offset, bound, max_records) if offset < bound else RECORD_SCHEMA.empty_table()
        except (FormatError, FileNotFoundError, InvalidObjectKeyError) as exc:
            # Kafka answers CORRUPT_MESSAGE for a record batch it cannot read; the message names the object
            # (or the invalid object key a corrupt catalog entry names).
            return FetchResult(Errors.CORRUPT_MESSAGE, hw, lso, start,
                               message=f"cannot read {topic} [{partition}] at offset {offset}: {exc}")
        return FetchResult(Errors.NO_ERROR, hw, lso, start, records, aborted_transactions=aborted)

    def list_offsets(self, topic: str, partition: int, timestamp: int,
                     isolation_level: str = "read_uncommitted") -> tuple[Errors, int, int]:
        """ListOffsets: ``(error, offset, timestamp)`` for a timestamp (ms) or -2 earliest / -1 latest / -3 max.

        For a timestamp: the earliest offset whose timestamp is >= it, or -1 if none
        (Kafka's ``fetchOffsetByTimestamp``).
        """
        with self.catalog.lock:
            try:
                p = self.catalog.state.partition(topic, partition)
            except UnknownTopicError:
                return Errors.UNKNOWN_TOPIC_OR_PART, -1, -1
            segments = list(p.segments)
            start, hw, lso = p.log_start_offset, p.high_watermark, p.last_stable_offset
        bound = lso if isolation_level == "read_committed" else hw
        if timestamp == EARLIEST_TIMESTAMP:
            return Errors.NO_ERROR, start, -1
        if timestamp == LATEST_TIMESTAMP:
            return Errors.NO_ERROR, bound, -1
        if timestamp == MAX_TIMESTAMP:
            best = (-1, -1)
            for seg in segments:
                if seg.max_timestamp >= best[1]:
                    t = self.reader.segment_table(seg)
                    t = t.filter(pc.and_(pc.greater_equal(t.column("offset"), start), pc.less(t.column("offset"), bound)))
                    if t.num_rows:
                        ts = t.column("timestamp").to_numpy()
                        i = int(np.argmax(ts))
                        if ts[i] >= best[1]:
                            best = (t.column("offset")[i].as_py(), int(ts[i]))
            return Errors.NO_ERROR, best[0], best[1]
        for seg in segments:
            if seg.max_timestamp < timestamp or seg.last_offset < start:
                continue
            t = self.reader.segment_table(seg)
            mask = pc.and_(pc.greater_equal(t.column("timestamp"), timestamp), pc.greater_equal(t.column("offset"), start))
            t = t.filter(pc.and_(mask, pc.less(t.column("offset"), bound)))
            if t.num_rows:
                return Errors.NO_ERROR, t.column("offset")[0].as_py(), t.column("timestamp")[0].as_py()
        return Errors.NO_ERROR, -1, -1

    # ---------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Clean exit: commit what is queued, snapshot producer state, release the lease at once."""
        if self._closed:
            return
        if self._handoff is not None:
            self._handoff.stop()
        if self._compaction is not None:
            self._compaction.stop()
        if self._publication is not None:
            self._publication.stop()
        self._expiration_stop.set()
        self._txn_closing.set()
        starting = self._txn_starting
        if starting is not None:  # a start-up still loading: stop it at its next step
            starting.cancel()
        if self._txn_election is not None:
            self._txn_election.join()
        with self._coordinator_lock:  # waits for any other start-up in progress
            coordinator = self._txn_coordinator
        if coordinator is not None:
            coordinator.shutdown()
        if self._group_coordinator is not None:
            self._group_coordinator.shutdown()
        if self._flusher_started:
            self._committer.stop(final_snapshot=self.is_writer)
        self._closed = True
        if self.lease is not None:
            if self._fatal is None:
                self.lease.release()
            else:
                self.lease.stop_heartbeats()

    # ---------------------------------------------------------------- transaction admin (KIP-664)
    def producer_state_rows(self, topic: str, partition: int) -> list[dict] | None:
        """The partition's producer state as this writer holds it now (what DescribeProducers reads):
        one snapshot row per producer id (:meth:`ProducerStateManager.snapshot_rows`), copied under
        the append lock. None when this process is not the writer or has no such partition."""
        with self._append_lock:
            log_ = self._partitions.get((topic, partition)) if self.is_writer else None
            return None if log_ is None else log_.snapshot_rows()


def _done(result: ProduceResult) -> Future:
    fut: Future = Future()
    fut.set_result(result)
    return fut
