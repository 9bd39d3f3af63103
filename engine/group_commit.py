"""Group commit: Kafka's acks=all path on object storage (DESIGN.md "Group commit").

Produce requests are queued after the broker has validated them and given them
offsets. A flusher thread waits ``flush_linger_ms`` after the first queued batch, and
at least ``flush_interval_ms`` after the previous flush took the queue (or until
``flush_max_bytes`` are queued, or someone waits for a batch: ``urgent``), then encodes
ONE data object holding the queued batches of every partition;
the flusher PUTs it; an uploader thread makes ONE catalog commit naming it, and only then completes
the requests: object PUTs per flush do not grow with the number of partitions. The
threads form a pipeline (flush N+1 is encoded and PUT while flush N is committed); commits keep
the order in which the flushes took their batches, whatever order their encodings end in.
A producer-state snapshot, when due, is written with the same commit, so it never
describes batches that were not committed. A periodic snapshot is due after at least
``producer_snapshot_interval`` flushes that carried at least as many payload bytes as the
last snapshot holds: snapshots never add more to storage than the data they cover (many
producers writing little each do not rewrite a big snapshot every few flushes), and a
writer taking over replays at most that much of the log.

There are :data:`FLUSH_THREADS` flushers. One takes the queue whenever a flush is due;
a second starts encoding beside it only when a backlog has built up (``flush_max_bytes
/ 4`` queued, or a flush asked for by ``flush()`` or an urgent batch), so that under
light load every flush still holds everything that accumulated while the previous one
was encoded (as few objects as with one flusher), and under a backlog -- a bulk load,
the tail of a transaction its commit waits for -- Parquet encoding, which runs without
the GIL, uses two cores: a flush then takes half of the queue when the other flusher is
idle (:meth:`GroupCommitter._half_to_leave` says when it may not).

Why an interval as well as a linger: object storage bills per request, and every flush
is two PUTs (the data object and the catalog commit). The linger alone lets a trickle of
produce requests -- each alone in its client batch -- make a flush every few ms (a
producer of 200 records/s made 95 flushes/s: 684 000 PUTs an hour). The interval bounds
the flushes a steady stream makes to ``3600 s / interval`` an hour whatever its rate (a
token bucket: up to :data:`.flush_schedule.FLUSH_BURST` flushes may follow one another after their linger
alone, one more is allowed every interval), while a write to an idle engine, or a short
burst of them, still commits after the linger alone, and so does a flush of at least
:data:`.flush_schedule.INTERVAL_EXEMPT_BYTES` (1 MiB: its PUTs cost less than storing its bytes) and a queue
that has stopped growing because its producers wait for their acknowledgements (at most one
every ``flush_min_interval_ms``): :mod:`.flush_schedule` decides. Urgent batches (``flush()``,
transaction markers and coordinator records somebody waits for) and a full
``flush_max_bytes`` never wait for it.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
import pyarrow as pa

from txlake.catalog.catalog import Catalog
from txlake.catalog.errors import WriterFencedError
from txlake.catalog.state import PRODUCER_SNAPSHOT, AbortedTxn, SegmentInfo
from txlake.catalog.storage import ObjectStore, retry_storage
from txlake.formats.producer_state import encode_snapshot
from txlake.formats.records import RECORD_SCHEMA, TIMESTAMP_LOG_APPEND_TIME, encode_buffer_size, encode_segments

from .errors import ApiError, Errors
from .flush_schedule import FlushSchedule
from .log_reader import SegmentCache
from .memory import bulk_memory_pool
from .requests import BrokerConfig, ProduceBatch, ProduceResult

log = logging.getLogger(__name__)

DATA_PREFIX = "data/"
SNAPSHOT_PREFIX = "producer-state/"
#: flusher threads (encoding flushes side by side when a backlog has built up)
FLUSH_THREADS = 2
#: flushes taken from the queue and not yet committed, at most (bounds the pipeline's memory
#: to about this many flushes of ``flush_max_bytes``, plus the one being uploaded)
MAX_FLUSHES_IN_PIPELINE = 3
#: seconds the flushers keep their encode buffers while idle (a bulk load leaves them idle
#: between its slices; after that, the memory goes back to the allocator)
BUFFER_KEEP_S = 2.0

#: attempts of each object PUT of a flush before the flush fails (:func:`_put_retrying`)
OBJECT_PUT_ATTEMPTS = 6


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
    #: for an ABORT marker: the first offset of the transaction it aborts here (else None)
    aborted_first_offset: int | None = None
    #: payload bytes counted for the flush (set by :meth:`GroupCommitter.enqueue`)
    nbytes: int = 0


@dataclass
class _FlushWork:
    """One flush, encoded by the flusher and committed by the uploader."""

    pending: list[PendingBatch]
    path: str = ""
    data: bytes | pa.Buffer = b""
    #: the reusable buffer ``data`` was encoded into (:meth:`GroupCommitter._encode_buffer`), until its PUT ends
    buffer: pa.Buffer | None = None
    segments: list[SegmentInfo] = field(default_factory=list)
    tables: list[pa.Table] = field(default_factory=list)
    unstable: dict[tuple[str, int], int | None] = field(default_factory=dict)
    aborted: list[tuple[str, int, AbortedTxn]] = field(default_factory=list)
    snapshot_key: str | None = None
    snapshot_data: bytes | None = None
    #: catalog actions committed with this flush (:meth:`GroupCommitter.commit_with_snapshot`), with their futures
    extra: list[tuple[list[dict[str, Any]], Future]] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    #: key of the batches this flush took from the queue in :attr:`GroupCommitter._taken`
    taken: int = 0
    #: its place in the commit order (the order flushes took their batches from the queue)
    seq: int = 0
    #: why its objects could not be PUT (the uploader fails the flush, in its commit order)
    put_error: Exception | None = None


class _Taken(NamedTuple):
    """What a flush took from the queue, with the state that matches it exactly."""

    pending: list[PendingBatch]
    live: list[PendingBatch]  # of partitions that still exist
    dropped: list[PendingBatch]  # of deleted topics
    extra: list[tuple[list[dict[str, Any]], Future]]
    snapshot: tuple | None  # producer state (rows, end offsets) to write with the commit
    unstable: dict[tuple[str, int], int | None]  # first unstable offset per partition


class GroupCommitter:
    """The queue of validated batches and the flusher thread that commits them.

    Args:
        store / catalog: where objects and commits go.
        config: linger, size, Parquet layout and snapshot interval.
        cache: decoded-segment cache; a committed partition table goes straight into it.
        commit: ``commit(actions) -> version`` (the broker's lease-checked catalog commit).
        capture_snapshot: ``() -> (rows, end_offsets)`` of all producer state, called under
            :attr:`lock` (so it matches exactly the batches taken for the flush).
        first_unstable_offset: ``(topic, partition) -> offset | None``, called under
            :attr:`lock` at the same moment: the LSO a flush publishes never passes a
            transaction whose marker is not in that flush or an earlier one.
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
                 first_unstable_offset: Callable[[str, int], int | None],
                 is_live: Callable[[str, int], bool], on_fatal: Callable[[Exception], None]):
        self.store = store
        self.catalog = catalog
        self.config = config
        self.cache = cache
        self._commit = commit
        self._capture_snapshot = capture_snapshot
        self._first_unstable_offset = first_unstable_offset
        self._is_live = is_live
        self._on_fatal = on_fatal
        self.lock = threading.RLock()
        self.commit_lock = threading.RLock()
        self._wake = threading.Condition(self.lock)
        self._pending: list[PendingBatch] = []
        self._extra: list[tuple[list[dict[str, Any]], Future]] = []
        #: batches taken from the queue by a flush that has not finished (flush() waits for them too)
        self._taken: dict[int, list[PendingBatch]] = {}
        #: when the queue's flush is due (the linger, the interval's bucket, a stalled queue)
        self.schedule = FlushSchedule(config)
        self._flush_requested = False
        #: flushes and payload bytes since the last producer-state snapshot, and its size (bytes)
        self._flushes_since_snapshot = 0
        self._bytes_since_snapshot = 0
        self.snapshot_bytes = 0
        self._stopped = False
        self._failed: Exception | None = None
        # the commit order, under :attr:`lock`: a flush gets the next ``seq`` when it takes the
        # queue; encoded flushes wait in ``_ready`` (None: a flush that had nothing to commit)
        # until the uploader's ``_next_commit`` reaches them
        self._next_seq = 0
        self._next_commit = 0
        self._ready: dict[int, _FlushWork | None] = {}
        self._uploadable = threading.Condition(self.lock)
        self._preparing = 0
        self._flushers = 0
        self._threads: list[threading.Thread] = []
        # encode buffers whose objects are PUT, for the next flushes (under :attr:`lock`):
        # see :meth:`_encode_buffer`
        self._buffers: list[pa.Buffer] = []
        self._buffers_used_at = 0.0  # time.monotonic() a buffer was last taken or kept

    def start(self) -> None:
        """Start the flusher and uploader threads."""
        self._flushers = FLUSH_THREADS
        targets = [(self._loop, f"txlake-flusher-{i}") for i in range(FLUSH_THREADS)]
        for target, name in targets + [(self._upload_loop, "txlake-uploader")]:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def enqueue(self, pending: PendingBatch, nbytes: int) -> None:
        """Queue a batch for the next flush; an ``urgent`` batch ends the linger at once.
        The caller holds :attr:`lock`."""
        if not self._pending:
            self._wake.notify_all()  # the flusher sleeps without a timeout while nothing is queued
        pending.nbytes = nbytes
        self._pending.append(pending)
        backlog = self.schedule.pending_bytes < self._backlog_bytes() <= self.schedule.pending_bytes + nbytes
        sooner = self.schedule.queued(nbytes)
        if pending.batch.urgent:
            self._flush_requested = True
            self._wake.notify_all()
        elif backlog or sooner or self.schedule.pending_bytes >= self.config.flush_max_bytes:
            self._wake.notify_all()

    def answer_duplicate(self, topic: str, partition: int, answer: ProduceResult) -> Future:
        """The answer to an exact retry of a batch (``answer``: NO_ERROR at the original's base
        offset, ``duplicate`` True; KIP-98), given only once the original is committed: a
        retry of a batch still queued or being flushed -- a client's ``request.timeout.ms`` (30 s)
        ran out before the flush -- must not acknowledge records that a crash would lose
        (Kafka's duplicate answer, too, waits for the high watermark to pass it with acks=all).
        If the original's flush fails, the retry gets its error. The caller holds :attr:`lock`.

        Returns:
            A future set to ``answer`` once the original is committed (at once if it is), or to
            the original's failure.
        """
        future: Future = Future()
        original = next((p.future for batches in (self._pending, *self._taken.values()) for p in batches
                         if p.base_offset == answer.base_offset and p.batch.partition == partition
                         and p.batch.topic == topic), None)
        if original is None:  # committed already
            future.set_result(answer)
            return future

        def relay(done: Future) -> None:
            result = done.result()
            future.set_result(answer if result.error == Errors.NO_ERROR else result)

        original.add_done_callback(relay)
        return future

    def _backlog_bytes(self) -> int:
        """Queued bytes from which a second flusher starts beside a busy one."""
        return max(1, self.config.flush_max_bytes // 4)

    def commit_with_snapshot(self, actions: list[dict[str, Any]]) -> Future:
        """Commit catalog ``actions`` with the next flush, in the same catalog commit as a
        producer-state snapshot (e.g. a log start offset that drops segments: the state
        they produced must outlive them, KIP-360). Ordered after every batch queued before.

        Returns:
            A future set to None once committed, or to the ``ApiError`` that stopped the writer.
        """
        future: Future = Future()
        with self.lock:
            self._extra.append((actions, future))
            self._flush_requested = True
            self._wake.notify_all()
        return future

    def request_flush(self) -> None:
        """End the linger now: what is queued is flushed at once (without waiting for it)."""
        with self.lock:
            if self._pending:
                self._flush_requested = True
                self._wake.notify_all()

    def flush(self, timeout_ms: int = 60_000) -> None:
        """Wait until every batch queued so far is committed (or failed), including the batches
        of flushes already under way."""
        with self.lock:
            futures = [p.future for p in self._pending] + [p.future for taken in self._taken.values() for p in taken]
        # only when something is queued: a request left behind would cut a later batch's linger short
        self.request_flush()
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
        for thread in self._threads:
            thread.join(timeout=30)
        with self.lock:
            self._buffers.clear()

    def _loop(self) -> None:
        while True:
            with self.lock:
                while not self._may_start():
                    if self._stopped and not self._pending and not self._extra:
                        self._flushers -= 1
                        self._uploadable.notify_all()  # the uploader stops once the last flusher has
                        return
                    if self._due():  # due, but held back: woken when a flush ends or a backlog builds up
                        timeout = 0.05
                    elif self._pending:
                        timeout = max(0.0, self.schedule.due_at() - self.schedule.clock())
                    elif self._buffers:  # idle: the kept encode buffers go after BUFFER_KEEP_S of it
                        timeout = self._buffers_used_at + BUFFER_KEEP_S - time.monotonic()
                        if timeout <= 0:
                            self._buffers.clear()
                            timeout = None
                    else:
                        timeout = None
                    self._wake.wait(timeout)
            self._prepare(force_snapshot=False, may_split=True)

    def _may_start(self) -> bool:
        """Whether a flusher takes the queue now (caller holds :attr:`lock`): a flush is due, the
        pipeline has room, and either no flush is being encoded or a backlog has built up."""
        if not self._due() or self._next_seq - self._next_commit >= MAX_FLUSHES_IN_PIPELINE:
            return False
        return self._preparing == 0 or self._flush_requested or self.schedule.pending_bytes >= self._backlog_bytes()

    def _deliver(self, seq: int, work: _FlushWork | None) -> None:
        """Hand an encoded flush (None: nothing to commit) to the uploader, in its commit place."""
        with self.lock:
            self._ready[seq] = work
            self._preparing -= 1
            self._uploadable.notify_all()
            self._wake.notify_all()  # a flusher held back while this one encoded may start

    def _upload_loop(self) -> None:
        while True:
            with self.lock:
                while self._next_commit not in self._ready:
                    if self._flushers == 0 and self._next_commit == self._next_seq:
                        return  # stopped, and every flush taken is committed
                    self._uploadable.wait()
                work = self._ready.pop(self._next_commit)
            if work is not None:
                self._execute(work)
            with self.lock:
                self._next_commit += 1
                self._wake.notify_all()  # the pipeline has room again

    def _due(self) -> bool:
        if not self._pending:
            return bool(self._extra)
        return (self._flush_requested or self.schedule.pending_bytes >= self.config.flush_max_bytes
                or self.schedule.clock() >= self.schedule.due_at())

    def flush_once(self, force_snapshot: bool = False) -> None:
        """Flush everything queued now (with a producer-state snapshot if forced) and wait for its commit."""
        work = self._prepare(force_snapshot)
        if work is not None:
            work.done.wait()

    def _prepare(self, force_snapshot: bool, may_split: bool = False) -> _FlushWork | None:
        """Stage 1 (flusher): take the queue, build the partition tables, encode the objects;
        then hand the flush to the uploader (:meth:`_deliver`). Returns it (None: nothing to commit).
        ``may_split``: the flusher loop's flushes may take half of a backlog (:meth:`_take`)."""
        work = None
        with self.lock:
            # the commit order is the order of taking the queue: the two happen under one lock
            seq = self._next_seq
            self._next_seq += 1
            self._preparing += 1
            try:
                taken = self._take(force_snapshot, may_split)
            except BaseException:
                self._deliver(seq, None)
                raise
        try:
            work = self._encode(taken)
            if work is not None:
                self._put_objects(work)
        finally:
            self._deliver(seq, work)
        return work

    def _put_objects(self, work: _FlushWork) -> None:
        """PUT a flush's objects from its flusher, so PUTs of flushes run side by side (only the
        catalog commits need their order). An object PUT but never committed -- this flush or
        an earlier one failed -- is an orphan, deleted after ``storage.orphan.grace.ms``."""
        try:
            if work.segments:
                try:
                    _put_retrying(self.store, work.path, work.data)
                finally:  # its size is in the segments; the bytes are not needed any more
                    work.data = b""
                    if work.buffer is not None:
                        self._release_buffer(work.buffer)
                        work.buffer = None
            if work.snapshot_key is not None:
                _put_retrying(self.store, work.snapshot_key, work.snapshot_data)
                work.snapshot_data = None
        except Exception as exc:
            work.put_error = exc

    def _encode_buffer(self, size: int) -> pa.Buffer:
        """A buffer of at least ``size`` bytes to encode a flush's object into: one a previous
        flush's PUT is done with when one fits, else a new one. Reused pages are already mapped:
        a fresh buffer's pages fault in and are zeroed by the kernel on first touch, which cost as
        much CPU as the encoding into them (``encode_buffer_size``'s measurement). The kept
        buffers go once the flushers have been idle for :data:`BUFFER_KEEP_S`; one more than 4x
        (+8 MiB) too big for a flush is dropped (a trickle after a bulk load does not hold the
        load's buffers)."""
        with self.lock:
            self._buffers_used_at = time.monotonic()
            self._buffers = [b for b in self._buffers if b.size <= 4 * size + (8 << 20)]
            fits = [b for b in self._buffers if b.size >= size]
            if fits:
                chosen = min(fits, key=lambda b: b.size)
                self._buffers = [b for b in self._buffers if b is not chosen]
                return chosen
        # a quarter more, in whole MiB: the next flushes, a little bigger or smaller, fit it too
        # (pages never written cost address space, not memory)
        return pa.allocate_buffer(-(-(size * 5 // 4) // (1 << 20)) << 20, memory_pool=bulk_memory_pool())

    def _release_buffer(self, buffer: pa.Buffer) -> None:
        """Keep ``buffer`` (its object's PUT is done) for a next flush: at most one per flusher,
        the biggest."""
        with self.lock:
            self._buffers_used_at = time.monotonic()
            self._buffers.append(buffer)
            self._buffers.sort(key=lambda b: b.size, reverse=True)
            del self._buffers[FLUSH_THREADS:]

    def _take(self, force_snapshot: bool, may_split: bool = False) -> _Taken:
        """Take the queued batches, with the producer-state snapshot and first unstable offsets
        that match them exactly (caller holds :attr:`lock`): all of them, or under a backlog the
        first half (:meth:`_half_to_leave`) for another flusher to encode the rest beside this one."""
        pending, self._pending = self._pending, []
        cut = self._half_to_leave(pending, force_snapshot) if may_split else 0
        if cut:
            pending, self._pending = pending[:cut], pending[cut:]
        self._taken[id(pending)] = pending
        taken_bytes = self.schedule.taken()
        self._flush_requested = False
        if cut:  # the rest stays queued, due now: the other flusher takes it
            taken_bytes = sum(p.nbytes for p in pending)
            for p in self._pending:
                self.schedule.queued(p.nbytes)
            self._flush_requested = True
            self._wake.notify_all()
        live = [p for p in pending if self._is_live(p.batch.topic, p.batch.partition)]
        dropped = [p for p in pending if p not in live] if len(live) != len(pending) else []
        extra, self._extra = self._extra, []
        snapshot = None
        if live:
            self._flushes_since_snapshot += 1
            self._bytes_since_snapshot += taken_bytes
        if force_snapshot or extra or self.snapshot_due():
            snapshot = self._capture_snapshot()
            self._flushes_since_snapshot = self._bytes_since_snapshot = 0
        unstable = {(p.batch.topic, p.batch.partition): None for p in live}
        for tp in unstable:
            unstable[tp] = self._first_unstable_offset(*tp)
        return _Taken(pending, live, dropped, extra, snapshot, unstable)

    def _half_to_leave(self, pending: list[PendingBatch], force_snapshot: bool) -> int:
        """Where to cut ``pending`` so this flush takes its first half and leaves the rest to
        another flusher (0: take it all). Under a backlog (:meth:`_backlog_bytes` queued) with a
        flusher idle, one flush of everything queued left the other flusher idle while the
        producer waited for the commit (a bulk load's 30 MB slices were encoded one at a time);
        halves are encoded side by side. Only when nothing else must match the batches taken
        exactly: no producer-state snapshot is due and no actions wait to be committed (each
        describes everything appended so far), and no control batch is left behind -- a
        marker already ended its transaction in the producer state, so the first unstable
        offset this flush commits would pass the transaction's records before the marker is
        committed. Caller holds :attr:`lock`."""
        if (force_snapshot or self._extra or self._preparing >= FLUSH_THREADS
                or self.schedule.pending_bytes < self._backlog_bytes() or len(pending) < 2):
            return 0
        total, half = 0, self.schedule.pending_bytes / 2
        for cut, p in enumerate(pending, 1):
            total += p.nbytes
            if total >= half:
                break
        if cut >= len(pending) or any(p.batch.is_control for p in pending[cut:]):
            return 0
        # a snapshot that the first half alone would make due covers the rest too: take it all
        if (self._flushes_since_snapshot + 1 >= self.config.producer_snapshot_interval
                and self._bytes_since_snapshot + total >= self.snapshot_bytes):
            return 0
        return cut

    def snapshot_due(self) -> bool:
        """Whether a periodic producer-state snapshot is due (the rule of the module docstring):
        at least ``producer_snapshot_interval`` flushes since the last snapshot, holding at
        least its bytes of payload."""
        return (self._flushes_since_snapshot >= self.config.producer_snapshot_interval
                and self._bytes_since_snapshot >= self.snapshot_bytes)

    def _encode(self, taken: _Taken) -> _FlushWork | None:
        """The flush of batches :meth:`_take` took: partition tables and the encoded objects."""
        pending, live, dropped, extra, snapshot, unstable = taken
        _complete([(p.future, ProduceResult(Errors.UNKNOWN_TOPIC_OR_PART, message="topic was deleted")) for p in dropped])
        if not live and snapshot is None:
            self._untake(id(pending))
            return None
        work = _FlushWork(live, unstable=unstable, taken=id(pending), extra=extra)
        work.aborted = [(p.batch.topic, p.batch.partition, AbortedTxn(p.batch.producer_id, p.aborted_first_offset, p.base_offset))
                        for p in live if p.aborted_first_offset is not None]
        try:
            by_tp: dict[tuple[str, int], list[PendingBatch]] = defaultdict(list)
            for p in live:
                by_tp[(p.batch.topic, p.batch.partition)].append(p)
            keys = sorted(by_tp)
            if keys:
                work.path = f"{DATA_PREFIX}{now_ms():013d}-{uuid.uuid4().hex}.parquet"
                work.tables = [record_table(topic, partition, by_tp[(topic, partition)]) for topic, partition in keys]
                buffer = self._encode_buffer(encode_buffer_size(work.tables))
                work.data, ranges = encode_segments(work.tables, self.config.compression, self.config.row_group_rows,
                                                   as_buffer=True, target=buffer)
                if work.data.address == buffer.address:
                    work.buffer = buffer
                else:  # outgrew the estimate: encoded into a stream of its own
                    self._release_buffer(buffer)
                memory = [t.nbytes for t in work.tables]
                total_memory = sum(memory) or 1
                for (topic, partition), table, (rg_start, rg_count), mem in zip(keys, work.tables, ranges, memory):
                    offsets = table.column("offset")
                    # numpy, not pyarrow.compute: a compute call releases the GIL, and taking it back
                    # waits a switch interval (5 ms) while the application's thread runs Python code
                    ts = table.column("timestamp").to_numpy()
                    # the object's bytes attributed to this partition, by its share of the rows' memory
                    size = max(1, len(work.data) * mem // total_memory)
                    work.segments.append(SegmentInfo(
                        topic, partition, work.path, offsets[0].as_py(), offsets[-1].as_py(), table.num_rows,
                        size, int(ts.min()), int(ts.max()), rg_start, rg_count))
            if snapshot is not None:
                work.snapshot_key = f"{SNAPSHOT_PREFIX}{now_ms():013d}-{uuid.uuid4().hex}.parquet"
                work.snapshot_data = encode_snapshot(*snapshot)
                self.snapshot_bytes = len(work.snapshot_data)
        except Exception as exc:  # encoding failed: nothing was written, but offsets were given out
            self._fail(work, exc)
            return None
        return work

    def _execute(self, work: _FlushWork) -> None:
        """Stage 2 (uploader): commit the flush's objects (PUT by its flusher), answer the requests."""
        completions: list[tuple[Future, ProduceResult]] = []
        try:
            if self._failed is not None:
                raise self._failed
            if work.put_error is not None:
                raise work.put_error
            with self.commit_lock:
                state = self.catalog.state
                actions = []
                for seg in work.segments:
                    assert seg.base_offset >= state.partition(seg.topic, seg.partition).high_watermark, \
                        "segments append in offset order"
                    hw = seg.last_offset + 1
                    first_unstable = work.unstable.get((seg.topic, seg.partition))
                    lso = hw if first_unstable is None else min(first_unstable, hw)
                    # records below the log start offset are gone: the LSO never points below it (Kafka's
                    # UnifiedLog.maybeIncrementFirstUnstableOffset)
                    lso = max(lso, state.partition(seg.topic, seg.partition).log_start_offset)
                    actions.append(seg.to_action(hw, lso))
                actions.extend(a.to_action(topic, partition) for topic, partition, a in work.aborted)
                if work.snapshot_key is not None:
                    actions.append({"action": PRODUCER_SNAPSHOT, "path": work.snapshot_key})
                actions.extend(a for extra_actions, _ in work.extra for a in extra_actions)
                self._commit(actions)
            for seg, table in zip(work.segments, work.tables):
                self.cache.put((work.path, seg.row_group_start), table)
            completions = [(p.future, ProduceResult(
                Errors.NO_ERROR, p.base_offset, p.append_time if p.timestamp_type == TIMESTAMP_LOG_APPEND_TIME else -1))
                for p in work.pending]
        except Exception as exc:
            self._fail(work, exc)
        finally:
            _complete(completions)
            for _, future in work.extra:
                if not future.done():
                    future.set_result(None)
            self._untake(work.taken)
            work.done.set()

    def _untake(self, key: int) -> None:
        with self.lock:
            self._taken.pop(key, None)

    def _fail(self, work: _FlushWork, exc: Exception) -> None:
        """A flush that cannot commit stops the writer: answer its requests with the error."""
        if self._failed is None:
            log.error("flush of %d batches failed: %s", len(work.pending), exc)
            self._failed = exc
            self._on_fatal(exc)
        code = Errors._FENCED if isinstance(exc, (WriterFencedError, ApiError)) else Errors.KAFKA_STORAGE_ERROR
        _complete([(p.future, ProduceResult(code, message=str(exc))) for p in work.pending])
        for _, future in work.extra:
            if not future.done():
                future.set_exception(ApiError(code, str(exc)))
        self._untake(work.taken)
        work.done.set()


def _put_retrying(store: ObjectStore, key: str, data) -> None:
    """``store.put(key, data)``, retried up to :data:`OBJECT_PUT_ATTEMPTS` times in all on a
    StorageError (a 503, a reset, a timeout whose outcome is unknown): a flush's objects have
    keys of their own, so PUTting the same bytes again is harmless whether or not the failed
    attempt was applied. Only when every attempt fails does the flush fail (and the writer stop).

    Raises:
        StorageError: the last attempt's error.
    """
    retry_storage(lambda: store.put(key, data), store.uri(key), "PUT of", OBJECT_PUT_ATTEMPTS)


def _complete(completions: list[tuple[Future, ProduceResult]]) -> None:
    """Answer requests -- always outside the broker's locks: the callbacks run client code."""
    for future, result in completions:
        if not future.done():
            future.set_result(result)


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
        "topic": _repeated_string(topic, total),
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
        "is_control": per_batch([p.batch.is_control for p in pending], np.bool_),
        "control_type": _nullable_per_batch([p.batch.control_type for p in pending], lengths, pa.int16()),
        "coordinator_epoch": _nullable_per_batch([p.batch.coordinator_epoch for p in pending], lengths, pa.int32()),
    }
    return pa.Table.from_pydict(columns, schema=RECORD_SCHEMA)


def _repeated_string(text: str, count: int) -> pa.Array:
    """``text`` on ``count`` rows, as a plain string array built from its buffers. (No pyarrow
    compute call: each one releases the GIL, and taking it back waits for the switch interval
    while an application thread runs Python code -- 5 ms per call on a busy producer.)"""
    data = text.encode()
    offsets = np.arange(count + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(offsets), pa.py_buffer(data * count)])


def _nullable_per_batch(values: list, lengths: np.ndarray, type_: pa.DataType) -> pa.Array:
    """A batch-level nullable field repeated on each row of its batch."""
    if all(v is None for v in values):
        return pa.nulls(int(lengths.sum()), type_)
    return pa.array([v for v, n in zip(values, lengths.tolist()) for _ in range(n)], type_)
