"""Group commit: Kafka's acks=all path on object storage (DESIGN.md "Group commit").

Produce requests are queued after the broker has validated them and given them
offsets. A flusher thread waits ``flush_linger_ms`` (or until ``flush_max_bytes`` are
queued), then writes ONE data object holding the queued batches of every partition,
then ONE catalog commit naming them, and only then completes the requests: object PUTs
per flush do not grow with the number of partitions. A producer-state snapshot, when
due, is written with the same commit, so it never describes batches that were not
committed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlake.catalog.catalog import Catalog
from txlake.catalog.errors import WriterFencedError
from txlake.catalog.state import PRODUCER_SNAPSHOT, SegmentInfo
from txlake.catalog.storage import ObjectStore
from txlake.formats.producer_state import encode_snapshot
from txlake.formats.records import RECORD_SCHEMA, TIMESTAMP_LOG_APPEND_TIME, encode_segments

from .errors import ApiError, Errors
from .log_reader import SegmentCache
from .requests import BrokerConfig, ProduceBatch, ProduceResult

log = logging.getLogger(__name__)

DATA_PREFIX = "data/"
SNAPSHOT_PREFIX = "producer-state/"


def now_ms() -> int:
    """Wall-clock time in ms since the epoch."""
    return int(time.time() * 1000)


@dataclass
class PendingBatch:
    """A validated batch with its offsets, waiting for the commit that makes it durable."""

    batch: ProduceBatch
    base_offset: int
    timestamp_type: int
    append_time: int
    future: Future


@dataclass
class _FlushWork:
    pending: list[PendingBatch] = field(default_factory=list)
    snapshot_rows: list | None = None
    snapshot_ends: dict | None = None


class GroupCommitter:
    """The queue of validated batches and the flusher thread that commits them.

    Args:
        store / catalog: where objects and commits go.
        config: linger, size, Parquet layout and snapshot interval.
        cache: decoded-segment cache; a committed partition table goes straight into it.
        commit: ``commit(actions) -> version`` (the broker's lease-checked catalog commit).
        capture_snapshot: ``() -> (rows, end_offsets)`` of all producer state, called under
            :attr:`lock` (so it matches exactly the batches taken for the flush).
        is_live: ``(topic, partition) -> bool``; batches of deleted topics are answered
            UNKNOWN_TOPIC_OR_PART instead of committed.
        on_fatal: called with the exception when a flush fails (the writer stops).

    The broker appends under :attr:`lock` (offsets, producer state and the queue change
    together); :attr:`commit_lock` serialises catalog commits. Futures are completed
    only after both are released: their callbacks run client code.
    """

    def __init__(self, store: ObjectStore, catalog: Catalog, config: BrokerConfig, cache: SegmentCache,
                 commit: Callable[[list[dict[str, Any]]], int],
                 capture_snapshot: Callable[[], tuple[list, dict]],
                 is_live: Callable[[str, int], bool], on_fatal: Callable[[Exception], None]):
        self.store = store
        self.catalog = catalog
        self.config = config
        self.cache = cache
        self._commit = commit
        self._capture_snapshot = capture_snapshot
        self._is_live = is_live
        self._on_fatal = on_fatal
        self.lock = threading.RLock()
        self.commit_lock = threading.RLock()
        self._wake = threading.Condition(self.lock)
        self._pending: list[PendingBatch] = []
        self._pending_bytes = 0
        self._first_pending_at = 0.0
        self._flush_requested = False
        self._flushes = 0
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the flusher thread."""
        self._thread = threading.Thread(target=self._loop, name="txlake-flusher", daemon=True)
        self._thread.start()

    def enqueue(self, pending: PendingBatch, nbytes: int) -> None:
        """Queue a batch for the next flush. The caller holds :attr:`lock`."""
        if not self._pending:
            self._first_pending_at = time.monotonic()
            self._wake.notify_all()  # the flusher sleeps without a timeout while nothing is queued
        self._pending.append(pending)
        self._pending_bytes += nbytes
        if self._pending_bytes >= self.config.flush_max_bytes:
            self._wake.notify_all()

    def flush(self, timeout_ms: int = 60_000) -> None:
        """Wait until every batch queued so far is committed (or failed)."""
        with self.lock:
            futures = [p.future for p in self._pending]
            self._flush_requested = True
            self._wake.notify_all()
        for fut in futures:
            fut.exception(timeout=timeout_ms / 1000)

    def stop(self, final_snapshot: bool) -> None:
        """Commit what is queued (with a producer-state snapshot if asked), then stop the thread."""
        if final_snapshot:
            try:
                self.flush()
                self.flush_once(force_snapshot=True)
            except Exception as exc:
                log.warning("final flush of %s failed: %s", self.store.url, exc)
        with self.lock:
            self._stopped = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            with self.lock:
                while not self._stopped and not self._due():
                    timeout = None
                    if self._pending:
                        timeout = max(0.0, self._first_pending_at + self.config.flush_linger_ms / 1000 - time.monotonic())
                    self._wake.wait(timeout)
                if self._stopped and not self._pending:
                    return
            self.flush_once()

    def _due(self) -> bool:
        if not self._pending:
            return False
        return (self._flush_requested or self._pending_bytes >= self.config.flush_max_bytes
                or (time.monotonic() - self._first_pending_at) * 1000 >= self.config.flush_linger_ms)

    def flush_once(self, force_snapshot: bool = False) -> None:
        """Write one object and one commit for everything queued now."""
        completions: list[tuple[Future, ProduceResult]] = []
        try:
            with self.commit_lock:
                work = _FlushWork()
                with self.lock:
                    work.pending, self._pending = self._pending, []
                    self._pending_bytes = 0
                    self._flush_requested = False
                    live = []
                    for p in work.pending:
                        if self._is_live(p.batch.topic, p.batch.partition):
                            live.append(p)
                        else:
                            completions.append((p.future, ProduceResult(Errors.UNKNOWN_TOPIC_OR_PART,
                                                                         message="topic was deleted")))
                    work.pending = live
                    self._flushes += 1
                    if force_snapshot or (work.pending and self._flushes % self.config.producer_snapshot_interval == 0):
                        work.snapshot_rows, work.snapshot_ends = self._capture_snapshot()
                if not work.pending and work.snapshot_rows is None:
                    return
                try:
                    self._write_and_commit(work)
                    completions.extend((p.future, ProduceResult(
                        Errors.NO_ERROR, p.base_offset,
                        p.append_time if p.timestamp_type == TIMESTAMP_LOG_APPEND_TIME else -1)) for p in work.pending)
                except Exception as exc:
                    log.error("flush of %d batches failed: %s", len(work.pending), exc)
                    self._on_fatal(exc)
                    code = Errors._FENCED if isinstance(exc, (WriterFencedError, ApiError)) else Errors.KAFKA_STORAGE_ERROR
                    completions.extend((p.future, ProduceResult(code, message=str(exc))) for p in work.pending)
        finally:
            for future, result in completions:
                if not future.done():
                    future.set_result(result)

    def _write_and_commit(self, work: _FlushWork) -> None:
        by_tp: dict[tuple[str, int], list[PendingBatch]] = defaultdict(list)
        for p in work.pending:
            by_tp[(p.batch.topic, p.batch.partition)].append(p)
        actions: list[dict] = []
        tables: list[pa.Table] = []
        keys = sorted(by_tp)
        path = f"{DATA_PREFIX}{now_ms():013d}-{uuid.uuid4().hex}.parquet"
        if keys:
            tables = [record_table(topic, partition, by_tp[(topic, partition)]) for topic, partition in keys]
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
            snap_key = f"{SNAPSHOT_PREFIX}{now_ms():013d}-{uuid.uuid4().hex}.parquet"
            self.store.put(snap_key, encode_snapshot(work.snapshot_rows, work.snapshot_ends))
            actions.append({"action": PRODUCER_SNAPSHOT, "path": snap_key})
        self._commit(actions)
        for table, action in zip(tables, actions):
            self.cache.put((path, action["row_group_start"]), table)


def _share(object_bytes: int, table: pa.Table, tables: list[pa.Table]) -> int:
    """Bytes of an object attributed to one partition's table, by its share of the rows' memory."""
    total = sum(t.nbytes for t in tables) or 1
    return max(1, object_bytes * table.nbytes // total)


def record_table(topic: str, partition: int, pending: list[PendingBatch]) -> pa.Table:
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
