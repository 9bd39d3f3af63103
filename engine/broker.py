"""The embedded broker: Kafka's request handlers over the catalog and partition logs.

One :class:`Broker` serves one storage root inside a process; every client of that
process shares it. Its public methods are named after Kafka's APIs (CreateTopics,
DeleteTopics, Metadata, Produce, Fetch, ListOffsets, InitProducerId) and take and return
plain data with Kafka error codes, so the future network server is a thin layer.

Writes (DESIGN.md "Group commit"): a produce request is validated against the
partition's producer state, given offsets and queued; a flusher thread writes ONE data
object holding the queued batches of every partition, then ONE catalog commit, and only
then completes the requests (acks=all). The high watermark moves at the commit.

Reads never need the writer lease; the first write takes it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlake.catalog.catalog import Catalog, commit_key
from txlake.catalog.errors import (CatalogError, InvalidConfigError, InvalidTopicError, UnknownTopicError,
                                   WriterFencedError, WriterLeaseHeldError)
from txlake.catalog.state import (CREATE_TOPIC, DELETE_TOPIC, PRODUCER_ID_BLOCK, PRODUCER_SNAPSHOT, SegmentInfo,
                                  TopicState)
from txlake.catalog.storage import ObjectStore
from txlake.catalog.topic_config import effective_config, validate_topic_config
from txlake.catalog.topic_names import unify_collision_chars, validate_topic_name
from txlake.catalog.writer_lease import WriterLease
from txlake.formats.errors import FormatError
from txlake.formats.producer_state import decode_snapshot, encode_snapshot
from txlake.formats.records import (PAYLOAD_SCHEMA, RECORD_SCHEMA, TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME,
                                    encode_segments)

from .errors import ApiError, Errors
from .log_reader import LogReader
from .orphans import delete_orphans
from .producer_state import NO_PRODUCER_ID, ProducerStateManager, increment_sequence

log = logging.getLogger(__name__)

DATA_PREFIX = "data/"
SNAPSHOT_PREFIX = "producer-state/"
PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's ProducerIdManager block size

# ListOffsets special timestamps (Kafka's ListOffsetsRequest).
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3


@dataclass
class BrokerConfig:
    """Broker-side settings (the ``storage.*`` keys of a client config, with Kafka's defaults).

    Attributes:
        flush_linger_ms: how long (ms) the flusher waits to group more batches into one object.
        flush_max_bytes: flush at once when this many payload bytes are queued.
        num_partitions: partitions of a topic created with ``num_partitions=-1`` (Kafka's ``num.partitions``).
        lease_ms / lease_force: writer lease duration, and whether to take it over at once.
        checkpoint_interval: catalog checkpoint every this many commits.
        producer_snapshot_interval: producer-state snapshot every this many flushes.
        orphan_grace_ms: unreferenced objects younger than this are never deleted.
        row_group_rows: rows per Parquet row group; compression: Parquet codec.
    """

    flush_linger_ms: int = 5
    flush_max_bytes: int = 64 * 1024 * 1024
    num_partitions: int = 1
    lease_ms: int = 15_000
    lease_force: bool = False
    checkpoint_interval: int = 100
    producer_snapshot_interval: int = 50
    orphan_grace_ms: int = 3_600_000
    row_group_rows: int = 1024 * 1024
    compression: str = "snappy"


@dataclass
class ProduceBatch:
    """One partition's part of a Produce request (a Kafka RecordBatch before offsets).

    Attributes:
        records: rows of :data:`~txlake.formats.records.PAYLOAD_SCHEMA` (timestamp ms, key, value, headers).
        producer_id / producer_epoch / base_sequence: -1 for a non-idempotent producer.
    """

    topic: str
    partition: int
    records: pa.Table
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = -1
    is_transactional: bool = False


@dataclass
class ProduceResult:
    """A partition's Produce response: error code, base offset, log-append time (ms or -1).

    ``duplicate`` is True when the batch was an exact retry whose original offsets are returned.
    """

    error: Errors
    base_offset: int = -1
    log_append_time: int = -1
    message: str = ""
    duplicate: bool = False


@dataclass
class FetchResult:
    """A partition's Fetch response: records with ``offset >= fetch offset`` below the isolation bound."""

    error: Errors
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: pa.Table | None = None
    message: str = ""


@dataclass
class _Pending:
    batch: ProduceBatch
    base_offset: int
    timestamp_type: int
    append_time: int
    future: Future


@dataclass
class _WriterPartition:
    log_end_offset: int
    producers: ProducerStateManager


@dataclass
class _FlushWork:
    pending: list[_Pending] = field(default_factory=list)
    snapshot_rows: list | None = None
    snapshot_ends: dict | None = None


def _now_ms() -> int:
    return int(time.time() * 1000)


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
        self.reader = LogReader(self.catalog)
        self.lease: WriterLease | None = None
        self._append_lock = threading.RLock()   # offsets, producer state, pending queue
        self._commit_lock = threading.RLock()   # one catalog writer at a time
        self._wake = threading.Condition(self._append_lock)
        self._partitions: dict[tuple[str, int], _WriterPartition] = {}
        self._pending: list[_Pending] = []
        self._pending_bytes = 0
        self._first_pending_at = 0.0
        self._flush_requested = False
        self._flushes = 0
        self._fatal: Exception | None = None
        self._closed = False
        self._flusher: threading.Thread | None = None
        self._next_producer_id = 0
        self._producer_id_block_end = 0
        self._last_refresh = 0.0

    # ---------------------------------------------------------------- writer start-up
    @property
    def is_writer(self) -> bool:
        """True while this process holds the writer lease (False once it learns it was fenced)."""
        return self.lease is not None and self.lease.held and self._fatal is None

    def ensure_writer(self) -> None:
        """Take the writer lease (first write), rebuild producer state, start the flusher.

        Raises:
            ApiError: NOT_LEADER_OR_FOLLOWER when another live writer holds the lease (the
                message names it and says what to do); _FENCED after this process lost it.
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
            lease.start_heartbeats()
            self.lease = lease
            self._load_writer_state()
            self._flusher = threading.Thread(target=self._flush_loop, name="txlake-flusher", daemon=True)
            self._flusher.start()
            try:
                removed = delete_orphans(self.store, self.catalog, [DATA_PREFIX, SNAPSHOT_PREFIX],
                                         self.config.orphan_grace_ms)
                if removed:
                    log.info("deleted %d orphaned objects under %s", len(removed), self.store.url)
            except Exception as exc:  # cleaning is best effort; it never blocks writing
                log.warning("orphan cleanup failed: %s", exc)

    def _load_writer_state(self) -> None:
        """Producer state = latest snapshot + replay of the log after it (Kafka's loadProducerState)."""
        state = self.catalog.state
        self._next_producer_id = self._producer_id_block_end = state.next_producer_id
        rows_by_tp: dict[tuple[str, int], list] = defaultdict(list)
        ends: dict = {}
        if state.producer_snapshot:
            try:
                rows, ends = decode_snapshot(self.store.get(state.producer_snapshot), self.store.uri(state.producer_snapshot))
                for row in rows:
                    rows_by_tp[(row["topic"], row["partition"])].append(row)
            except (FormatError, FileNotFoundError) as exc:
                log.warning("producer-state snapshot unusable (%s); rebuilding from the whole log", exc)
                rows_by_tp, ends = defaultdict(list), {}
        for topic in state.topics.values():
            covered = ends.get(topic.name)
            for p in topic.partitions:
                psm = ProducerStateManager(topic.name, p.partition)
                start = p.log_start_offset
                if covered and covered.get("topic_id") == topic.topic_id:
                    psm.load_rows(rows_by_tp.get((topic.name, p.partition), []))
                    start = max(start, covered["end_offsets"][p.partition])
                self._replay_producer_state(psm, start, p.high_watermark)
                self._partitions[(topic.name, p.partition)] = _WriterPartition(p.high_watermark, psm)

    def _replay_producer_state(self, psm: ProducerStateManager, start: int, end: int) -> None:
        if start >= end:
            return
        table = self.reader.read(psm.topic, psm.partition, start, end)
        table = table.filter(pc.and_(pc.greater_equal(table.column("producer_id"), 0),
                                     pc.invert(table.column("is_control"))))
        if table.num_rows == 0:
            return
        batches = table.group_by(["producer_id", "base_offset"], use_threads=False).aggregate([
            ("producer_epoch", "max"), ("base_sequence", "max"), ("last_offset_delta", "max"),
            ("timestamp", "max"), ("is_transactional", "max")]).sort_by("base_offset")
        for b in batches.to_pylist():
            last_seq = increment_sequence(b["base_sequence_max"], b["last_offset_delta_max"])
            psm.update(b["producer_id"], b["producer_epoch_max"], b["base_sequence_max"], last_seq, b["base_offset"],
                       b["base_offset"] + b["last_offset_delta_max"], b["timestamp_max"], b["is_transactional_max"])

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
                if self.store.get_or_none(commit_key(self.catalog.version + 1)) is None:
                    return False
                self._set_fatal(WriterFencedError(
                    f"another process committed to {self.store.url} after catalog version {self.catalog.version}: "
                    "this process lost the writer lease and can commit nothing more"))
        return self.catalog.refresh()

    def topics(self) -> dict[str, TopicState]:
        """The topics as of the catalog version this process has seen (Metadata)."""
        with self.catalog.lock:
            return dict(self.catalog.state.topics)

    def create_topics(self, specs: list[tuple[str, int, dict]], validate_only: bool = False) -> list[tuple[Errors, str]]:
        """CreateTopics: ``specs`` of ``(name, num_partitions or -1, config overrides)``.

        Returns one ``(error, message)`` per spec: NO_ERROR, INVALID_TOPIC_EXCEPTION,
        TOPIC_ALREADY_EXISTS, INVALID_PARTITIONS, INVALID_CONFIG. All valid topics are
        created in one catalog commit.
        """
        results: list[tuple[Errors, str]] = []
        actions = []
        with self._commit_lock:
            if not validate_only:
                self.ensure_writer()
            state = self.catalog.state
            seen = {unify_collision_chars(n): n for n in state.topics}
            for name, num_partitions, config in specs:
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
                            self._partitions[(a["topic"], p)] = _WriterPartition(0, ProducerStateManager(a["topic"], p))
        return results

    def delete_topics(self, names: list[str]) -> list[tuple[Errors, str]]:
        """DeleteTopics: one ``(error, message)`` per name (UNKNOWN_TOPIC_OR_PART if missing).

        Queued records of a deleted topic are flushed first; its objects become orphans
        that the cleaner removes after the grace period.
        """
        self.ensure_writer()
        self.flush()
        results = []
        with self._commit_lock:
            actions = []
            for name in names:
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

    def _commit(self, actions: list[dict]) -> int:
        try:
            return self.catalog.commit(actions, self.lease.epoch if self.lease else None)
        except (WriterFencedError, CatalogError) as exc:
            self._set_fatal(exc)
            raise ApiError(Errors._FENCED, str(exc)) from exc

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
    def produce(self, batches: list[ProduceBatch], timeout_ms: int = 30_000) -> list[ProduceResult]:
        """Produce (acks=all): append and wait until the batches are committed."""
        futures = self.produce_async(batches)
        deadline = time.monotonic() + timeout_ms / 1000
        results = []
        for fut in futures:
            try:
                results.append(fut.result(timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                results.append(ProduceResult(Errors.REQUEST_TIMED_OUT, message="commit did not complete in time"))
        return results

    def produce_async(self, batches: list[ProduceBatch]) -> list[Future]:
        """Validate and queue ``batches``; each future resolves to a :class:`ProduceResult` after the commit.

        Validation errors (UNKNOWN_TOPIC_OR_PART, MESSAGE_TOO_LARGE, INVALID_PRODUCER_EPOCH,
        OUT_OF_ORDER_SEQUENCE_NUMBER, ...) resolve at once; a duplicate resolves at once
        to the original offsets (KIP-98).
        """
        try:
            self.ensure_writer()
        except ApiError as exc:
            return [_done(ProduceResult(exc.error, message=exc.message)) for _ in batches]
        futures = []
        with self._append_lock:
            for batch in batches:
                futures.append(self._append(batch))
            if self._pending_bytes >= self.config.flush_max_bytes:
                self._wake.notify_all()
        return futures

    def _append(self, batch: ProduceBatch) -> Future:
        if self._fatal is not None:
            return _done(ProduceResult(Errors._FENCED, message=str(self._fatal)))
        wp = self._partitions.get((batch.topic, batch.partition))
        topic = self.catalog.state.topics.get(batch.topic)
        if wp is None or topic is None:
            return _done(ProduceResult(Errors.UNKNOWN_TOPIC_OR_PART,
                                       message=f"Unknown topic or partition: {batch.topic} [{batch.partition}]"))
        n = batch.records.num_rows
        assert n > 0, "a batch holds at least one record"
        config = effective_config(topic.config)
        size = batch.records.nbytes
        max_bytes = int(config["max.message.bytes"])
        if size > max_bytes:
            return _done(ProduceResult(Errors.MESSAGE_TOO_LARGE,
                                       message=f"The batch of {n} records for {batch.topic} [{batch.partition}] is {size} bytes, "
                                               f"larger than max.message.bytes={max_bytes} of the topic"))
        if batch.producer_id >= 0:
            last_seq = increment_sequence(batch.base_sequence, n - 1)
            try:
                dup = wp.producers.check_append(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                                                last_seq, batch.is_transactional)
            except ApiError as exc:
                return _done(ProduceResult(exc.error, message=exc.message))
            if dup is not None:
                return _done(ProduceResult(Errors.NO_ERROR, dup.first_offset, -1, duplicate=True))
        now = _now_ms()
        ts_type = TIMESTAMP_LOG_APPEND_TIME if config["message.timestamp.type"] == "LogAppendTime" else TIMESTAMP_CREATE_TIME
        base = wp.log_end_offset
        wp.log_end_offset += n
        if batch.producer_id >= 0:
            max_ts = now if ts_type == TIMESTAMP_LOG_APPEND_TIME else pc.max(batch.records.column("timestamp")).as_py()
            wp.producers.update(batch.producer_id, batch.producer_epoch, batch.base_sequence, last_seq, base,
                                base + n - 1, max_ts, batch.is_transactional)
        fut: Future = Future()
        if not self._pending:
            self._first_pending_at = time.monotonic()
            self._wake.notify_all()  # the flusher sleeps without a timeout while nothing is queued
        self._pending.append(_Pending(batch, base, ts_type, now, fut))
        self._pending_bytes += size
        return fut

    # ---------------------------------------------------------------- flushing
    def flush(self, timeout_ms: int = 60_000) -> None:
        """Wait until every batch queued so far is committed (or failed)."""
        with self._append_lock:
            futures = [p.future for p in self._pending]
            self._flush_requested = True
            self._wake.notify_all()
        for fut in futures:
            fut.exception(timeout=timeout_ms / 1000)

    def _flush_loop(self) -> None:
        while True:
            with self._append_lock:
                while not self._closed and not self._due():
                    timeout = None
                    if self._pending:
                        timeout = max(0.0, self._first_pending_at + self.config.flush_linger_ms / 1000 - time.monotonic())
                    self._wake.wait(timeout)
                if self._closed and not self._pending:
                    return
            self._flush_once()

    def _due(self) -> bool:
        if not self._pending:
            return False
        return (self._flush_requested or self._pending_bytes >= self.config.flush_max_bytes
                or (time.monotonic() - self._first_pending_at) * 1000 >= self.config.flush_linger_ms)

    def _flush_once(self, force_snapshot: bool = False) -> None:
        # Futures are completed only after every broker lock is released: their callbacks
        # run client code (which takes client locks and may call back into the broker).
        completions: list[tuple[Future, ProduceResult]] = []
        try:
            with self._commit_lock:
                work = _FlushWork()
                with self._append_lock:
                    work.pending, self._pending = self._pending, []
                    self._pending_bytes = 0
                    self._flush_requested = False
                    live = []
                    for p in work.pending:
                        if (p.batch.topic, p.batch.partition) in self._partitions:
                            live.append(p)
                        else:
                            completions.append((p.future, ProduceResult(Errors.UNKNOWN_TOPIC_OR_PART,
                                                                         message="topic was deleted")))
                    work.pending = live
                    self._flushes += 1
                    if force_snapshot or (work.pending and self._flushes % self.config.producer_snapshot_interval == 0):
                        self._capture_snapshot(work)
                if not work.pending and work.snapshot_rows is None:
                    return
                try:
                    self._write_and_commit(work)
                    completions.extend((p.future, ProduceResult(
                        Errors.NO_ERROR, p.base_offset,
                        p.append_time if p.timestamp_type == TIMESTAMP_LOG_APPEND_TIME else -1)) for p in work.pending)
                except Exception as exc:
                    log.error("flush of %d batches failed: %s", len(work.pending), exc)
                    self._set_fatal(exc)
                    code = Errors._FENCED if isinstance(exc, (WriterFencedError, ApiError)) else Errors.KAFKA_STORAGE_ERROR
                    completions.extend((p.future, ProduceResult(code, message=str(exc))) for p in work.pending)
        finally:
            for future, result in completions:
                if not future.done():
                    future.set_result(result)

    def _capture_snapshot(self, work: _FlushWork) -> None:
        rows: list = []
        ends: dict = {}
        state = self.catalog.state
        for (topic, partition), wp in self._partitions.items():
            rows.extend(wp.producers.snapshot_rows())
            t = state.topics[topic]
            entry = ends.setdefault(topic, {"topic_id": t.topic_id, "end_offsets": [0] * len(t.partitions)})
            entry["end_offsets"][partition] = wp.log_end_offset
        work.snapshot_rows, work.snapshot_ends = rows, ends

    def _write_and_commit(self, work: _FlushWork) -> None:
        by_tp: dict[tuple[str, int], list[_Pending]] = defaultdict(list)
        for p in work.pending:
            by_tp[(p.batch.topic, p.batch.partition)].append(p)
        actions: list[dict] = []
        tables: list[pa.Table] = []
        keys = sorted(by_tp)
        path = f"{DATA_PREFIX}{_now_ms():013d}-{uuid.uuid4().hex}.parquet"
        if keys:
            tables = [_record_table(topic, partition, by_tp[(topic, partition)]) for topic, partition in keys]
            data, ranges = encode_segments(tables, self.config.compression, self.config.row_group_rows)
            self.store.put(path, data)
            state = self.catalog.state
            for (topic, partition), table, (rg_start, rg_count) in zip(keys, tables, ranges):
                offsets = table.column("offset")
                ts = table.column("timestamp")
                first, last = offsets[0].as_py(), offsets[-1].as_py()
                hw = last + 1
                seg = SegmentInfo(topic, partition, path, first, last, table.num_rows, _share(len(data), table, tables),
                                  pc.min(ts).as_py(), pc.max(ts).as_py(), rg_start, rg_count)
                assert first >= state.partition(topic, partition).high_watermark, "segments append in offset order"
                actions.append(seg.to_action(hw, hw))
        if work.snapshot_rows is not None:
            snap_key = f"{SNAPSHOT_PREFIX}{_now_ms():013d}-{uuid.uuid4().hex}.parquet"
            self.store.put(snap_key, encode_snapshot(work.snapshot_rows, work.snapshot_ends))
            actions.append({"action": PRODUCER_SNAPSHOT, "path": snap_key})
        self._commit(actions)
        for (topic, partition), table, action in zip(keys, tables, actions):
            self.reader.cache.put((path, action["row_group_start"]), table)

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
        bound = lso if isolation_level == "read_committed" else hw
        if offset < start or offset > hw:
            return FetchResult(Errors.OFFSET_OUT_OF_RANGE, hw, lso, start,
                               message=f"offset {offset} is out of range [{start}, {hw}] for {topic} [{partition}]")
        try:
            records = self.reader.read(topic, partition, offset, bound, max_records) if offset < bound else RECORD_SCHEMA.empty_table()
        except (FormatError, FileNotFoundError) as exc:
            # Kafka answers CORRUPT_MESSAGE for a record batch it cannot read; the message names the object.
            return FetchResult(Errors.CORRUPT_MESSAGE, hw, lso, start,
                               message=f"cannot read {topic} [{partition}] at offset {offset}: {exc}")
        return FetchResult(Errors.NO_ERROR, hw, lso, start, records)

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
        if self.is_writer and self._fatal is None:
            try:
                self.flush()
                self._flush_once(force_snapshot=True)
            except Exception as exc:
                log.warning("final flush of %s failed: %s", self.store.url, exc)
        with self._append_lock:
            self._closed = True
            self._wake.notify_all()
        if self._flusher is not None:
            self._flusher.join(timeout=30)
        if self.lease is not None:
            if self._fatal is None:
                self.lease.release()
            else:
                self.lease.stop_heartbeats()


def _done(result: ProduceResult) -> Future:
    fut: Future = Future()
    fut.set_result(result)
    return fut


def _share(object_bytes: int, table: pa.Table, tables: list[pa.Table]) -> int:
    """Bytes of an object attributed to one partition's table, by its share of the rows' memory."""
    total = sum(t.nbytes for t in tables) or 1
    return max(1, object_bytes * table.nbytes // total)


def _record_table(topic: str, partition: int, pending: list[_Pending]) -> pa.Table:
    """Build one partition's RECORD_SCHEMA rows from its queued batches (vectorised per column)."""
    payload = pa.concat_tables([p.batch.records for p in pending]) if len(pending) > 1 else pending[0].batch.records
    lengths = np.fromiter((p.batch.records.num_rows for p in pending), dtype=np.int64, count=len(pending))
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    base_offsets = np.repeat(np.fromiter((p.base_offset for p in pending), dtype=np.int64, count=len(pending)), lengths)
    offsets = base_offsets + (np.arange(total, dtype=np.int64) - starts)

    def per_batch(values, dtype):
        return pa.array(np.repeat(np.asarray(values, dtype=dtype), lengths))

    ts_types = [p.timestamp_type for p in pending]
    timestamps = payload.column("timestamp")
    if any(t == TIMESTAMP_LOG_APPEND_TIME for t in ts_types):
        append = np.repeat(np.fromiter((p.append_time for p in pending), dtype=np.int64, count=len(pending)), lengths)
        create = timestamps.to_numpy()
        is_append = np.repeat(np.asarray(ts_types, dtype=np.int8), lengths) == TIMESTAMP_LOG_APPEND_TIME
        timestamps = pa.array(np.where(is_append, append, create))
    columns = {
        "topic": pa.array(np.full(total, topic, dtype=object), pa.string()) if total < 64 else
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(total, dtype=np.int32)), pa.array([topic])).cast(pa.string()),
        "partition": pa.array(np.full(total, partition, dtype=np.int32)),
        "offset": pa.array(offsets),
        "timestamp": timestamps,
        "timestamp_type": per_batch(ts_types, np.int8),
        "key": payload.column("key"),
        "value": payload.column("value"),
        "headers": payload.column("headers"),
        "producer_id": per_batch([p.batch.producer_id for p in pending], np.int64),
        "producer_epoch": per_batch([p.batch.producer_epoch for p in pending], np.int16),
        "base_sequence": per_batch([p.batch.base_sequence for p in pending], np.int32),
        "base_offset": pa.array(base_offsets),
        "last_offset_delta": per_batch([p.batch.records.num_rows - 1 for p in pending], np.int32),
        "is_transactional": per_batch([p.batch.is_transactional for p in pending], np.bool_),
        "is_control": pa.array(np.zeros(total, dtype=np.bool_)),
        "control_type": pa.nulls(total, pa.int16()),
        "coordinator_epoch": pa.nulls(total, pa.int32()),
    }
    return pa.Table.from_pydict(columns, schema=RECORD_SCHEMA)
