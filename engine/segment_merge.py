"""Rewriting a partition's segments: the small-file merge, and the primitive key compaction uses.

A flush writes ONE object holding the new records of every partition that changed
(:mod:`.group_commit`), so a busy root accumulates many small objects, each naming a
few row groups of many partitions. Compaction rewrites them into per-partition segments
of about ``segment.bytes`` (the topic config), sorted by offset, in row groups sized for
Spark and DuckDB scans. This is Kafka's ``Cleaner.cleanSegments`` +
``UnifiedLog.replaceSegments`` on object storage:

* **The primitive** -- :func:`rewrite_segments`: read consecutive segments of one
  partition, pass their records through an optional row filter (``pa.Table -> pa.Table``
  that only drops rows: key compaction's), and write the survivors as new per-partition
  objects. Nothing else changes: offsets, timestamps, timestamp types, keys, values,
  headers, producer fields and control records are copied as they are; offsets may then
  have gaps, and a range that became empty simply has no segment. Without a row filter
  the records stream through a row group at a time, so a merge's memory does not grow
  with its run (see :func:`rewrite_segments`).
* **The swap** -- :func:`swap_actions`: ONE catalog commit removes the old segments, adds
  the new ones (carrying the partition's current high watermark and LSO, so neither moves;
  the log start offset is untouched) and retires every object no segment names any more,
  stamped with the commit's time. The commit is computed under the writer's commit lock
  from the current state, and refused (:class:`StaleRewriteError`) when the old segments
  are no longer exactly there (DeleteRecords or a deleted topic got there first); the new
  objects are then deleted at once, since nothing ever named them.
* **The merge policy** -- :func:`plan_merges` (see its docstring).

Crash safety: new objects are written before the commit, old ones are deleted only a
grace period after it (:mod:`.object_cleaner`). A crash before the commit leaves orphans
(deleted by age, :mod:`.orphans`) and the log exactly as before; after it, the log is
exactly as after.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlake.catalog.errors import UnknownTopicError
from txlake.catalog.state import REMOVE_SEGMENT, RETIRE_OBJECT, CatalogState, SegmentInfo
from txlake.catalog.topic_config import effective_config
from txlake.formats.errors import CorruptObjectError
from txlake.formats.records import (DEFAULT_ROW_GROUP_ROWS, RECORD_SCHEMA, read_row_group_sets, segment_writer,
                                   write_records)

from .group_commit import DATA_PREFIX
from .log_reader import LogReader
from .memory import glibc_function
from .object_cleaner import Committer

__all__ = ["COALESCE_PIECES", "DEAD_OBJECT_FRACTION", "MERGE_BATCH_BYTES", "MERGE_FACTOR", "MERGE_THREADS",
           "READ_THREADS", "ROW_GROUP_BYTES", "SMALL_SEGMENT_FRACTION", "TIER_FLOOR_BYTES", "TIER_SLACK",
           "MergeCancelled", "MergeRun", "RoundWorkers", "RowFilter", "SegmentRewrite", "StaleRewriteError",
           "commit_rewrite", "discard_rewrite", "in_batches", "plan_merges", "release_unused_memory",
           "replace_segments", "rewrite_runs", "rewrite_segments", "swap_actions"]

T = TypeVar("T")

#: ``row_filter(records) -> records``: RECORD_SCHEMA rows in offset order in, a subset of them out
#: (same schema, same order, rows unchanged). Key compaction's log cleaner is one.
RowFilter = Callable[[pa.Table], pa.Table]

#: a segment smaller than ``segment.bytes`` times this is small: a candidate for merging
SMALL_SEGMENT_FRACTION = 0.5
#: a segment whose object's live bytes fall below this share of its size is rewritten even alone
DEAD_OBJECT_FRACTION = 0.5
#: size tiering's fan-in: a merged segment is rewritten only once the newer segments after it
#: hold at least ``MERGE_FACTOR - 1`` times its records, so each merge makes a segment at least
#: this many times bigger and a record is rewritten at most about log_MERGE_FACTOR(segment /
#: flush) times (Cassandra's size-tiered ``min_threshold``, Lucene's ``mergeFactor``: 4 and 10)
MERGE_FACTOR = 4
#: a segment smaller than this (catalog bytes) is never left out by size tiering: rewriting it
#: costs little, and flushes of one size merge at once (Lucene's ``floorSegmentMB``)
TIER_FLOOR_BYTES = 1024 * 1024
#: size tiering's tolerance: a segment joins the ones after it once they hold at least
#: ``(MERGE_FACTOR - 1) / (1 + TIER_SLACK)`` times its records, so segments of ABOUT one size
#: merge together. Without it a steady stream's rounds, whose records differ by a few tenths
#: of a percent, deferred a tier's merge by a round whenever its first segment happened to be
#: the biggest, and that round then merged MERGE_FACTOR + 1 of them (issue 14: a trickle's
#: 45-minute round merged 5R records, 303 328, instead of its 40-minute round merging 4R:
#: peak RSS 329 MB against 269-306 MB for 4R rounds). Kept small: the tier k merge of a
#: steady stream lacks only 1 / (3 * 4**(k-1)) of its records one round before it is due, so
#: a slack above that merges a tier a round early (2%: never below the 64R tier)
TIER_SLACK = 0.02
#: target in-memory (uncompressed Arrow) bytes of a row group: Parquet's and Spark's 128 MiB block
ROW_GROUP_BYTES = 128 * 1024 * 1024
#: catalog bytes of the partitions key compaction reads together: each object is read once per
#: batch for all the partitions' segments it holds (a partition bigger than this is a batch
#: alone); the engine's ``storage.compaction.batch.bytes``. (The merge streams: no batches.)
MERGE_BATCH_BYTES = 512 * 1024 * 1024
#: pieces (old segments' row groups) of a streamed merge's row group in progress that are copied
#: into one table (see ``_SegmentWriter._coalesce``)
COALESCE_PIECES = 64
#: runs rewritten at once (Parquet encoding, writes and fsyncs release the GIL)
MERGE_THREADS = 2
#: objects a rewrite reads at once (Parquet decoding releases the GIL; a merge of flush objects
#: reads many small segments, each an object open + footer parse + a few row groups); a
#: streamed merge reads this many row groups ahead of the one it is writing
READ_THREADS = 2


#: seconds a worker waits for the others of its pool before releasing its memory alone
RELEASE_WAIT_S = 10.0


def release_unused_memory() -> None:
    """Hand the pages freed on THIS thread's heaps back to the OS, best effort: Arrow's memory
    pool (``MemoryPool.release_unused``) and, on glibc, every malloc arena (``malloc_trim(0)``).

    pyarrow's default pool, mimalloc, keeps a heap per thread: a buffer freed by another
    thread than the one that allocated it goes back to the allocating thread's heap, which
    only returns the page to the OS when that thread collects (``release_unused`` called on
    it, or its own later allocations). A buffer whose allocating thread has ended sits in an
    abandoned heap, which only the main thread's collection reclaims. So a compaction round
    calls this on every worker thread it used, after the round's buffers are freed and
    before the workers end (:class:`RoundWorkers`), and on its own thread. Measured (a worker
    pool decoding 80 000 small arrays, freed on another thread): RSS stayed ~150 MB above
    the start with the release on the freeing thread only, ~10 MB with it on each worker.
    ``malloc_trim`` works from any thread."""
    pa.default_memory_pool().release_unused()
    if _malloc_trim is not None:
        _malloc_trim(0)


_malloc_trim = glibc_function("malloc_trim")


class RoundWorkers:
    """The worker threads of one compaction round: ``read`` (:data:`READ_THREADS`, decoding
    old segments) and ``encode`` (:data:`MERGE_THREADS`, encoding and writing new ones), each
    started on first use. :meth:`close` (also on leaving a ``with`` block) runs
    :func:`release_unused_memory` on every thread of each pool used -- all of a pool's
    threads at once, so each runs it exactly once -- then shuts the pools down.

    Why (issue 14): the records a round's workers decode are freed on other threads (the
    round's own, or the encoders'); with per-thread heaps (mimalloc) those pages go back
    to the OS only when the thread that allocated them collects, so workers that ended
    without collecting left a writer's RSS higher after each round though nothing was alive.
    """

    def __init__(self, read_threads: int = READ_THREADS, encode_threads: int = MERGE_THREADS):
        self._sizes = {"read": read_threads, "encode": encode_threads}
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def _pool(self, name: str) -> ThreadPoolExecutor:
        with self._lock:
            pool = self._pools.get(name)
            if pool is None:
                pool = self._pools[name] = ThreadPoolExecutor(self._sizes[name],
                                                              thread_name_prefix=f"txlake-merge-{name}")
            return pool

    @property
    def read(self) -> ThreadPoolExecutor:
        """The pool that decodes old segments."""
        return self._pool("read")

    @property
    def encode(self) -> ThreadPoolExecutor:
        """The pool that encodes and writes new segments (and key compaction's rewrites)."""
        return self._pool("encode")

    def release_memory(self) -> None:
        """:func:`release_unused_memory` on every thread of each pool used so far; returns once
        all have run it. Call it when the round's decoded records are freed."""
        with self._lock:
            pools = [(pool, self._sizes[name]) for name, pool in self._pools.items()]
        for pool, threads in pools:
            barrier = threading.Barrier(threads)

            def release(barrier=barrier) -> None:
                try:  # every task holds its thread until all are running: one per thread
                    barrier.wait(RELEASE_WAIT_S)
                except threading.BrokenBarrierError:
                    pass
                release_unused_memory()

            for future in [pool.submit(release) for _ in range(threads)]:
                future.result()

    def close(self) -> None:
        """Release every worker's memory (:meth:`release_memory`), then shut the pools down."""
        try:
            self.release_memory()
        finally:
            with self._lock:
                pools, self._pools = list(self._pools.values()), {}
            for pool in pools:
                pool.shutdown()

    def __enter__(self) -> "RoundWorkers":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StaleRewriteError(Exception):
    """The segments a rewrite replaces are no longer exactly in the catalog (DeleteRecords, a
    deleted topic or another rewrite changed them): the rewrite is not committed."""


@dataclass(frozen=True)
class MergeRun:
    """Consecutive segments of one partition to rewrite together.

    Attributes:
        segments: in offset order, adjacent in the partition's segment list.
        target_bytes: the topic's ``segment.bytes``: the size the output segments aim at (bytes).
        drop: the segments lie wholly below the log start offset: they are removed, not rewritten.
    """

    topic: str
    partition: int
    segments: tuple[SegmentInfo, ...]
    target_bytes: int
    drop: bool = False

    @property
    def size_bytes(self) -> int:
        """Catalog size of the segments (compressed bytes)."""
        return sum(s.size_bytes for s in self.segments)

    @property
    def record_count(self) -> int:
        """Records in the segments."""
        return sum(s.record_count for s in self.segments)


@dataclass
class SegmentRewrite:
    """The outcome of :func:`rewrite_segments`: new objects written but not yet committed.

    Attributes:
        run: what was rewritten.
        segments: the new segments (one object each), in offset order; empty when the row
            filter dropped every record (or the run was a drop).
        records_in / records_out: records read / written.
        bytes_in / bytes_out: catalog size of the old segments / size of the new objects (bytes).
    """

    run: MergeRun
    segments: list[SegmentInfo]
    records_in: int
    records_out: int
    bytes_in: int
    bytes_out: int

    @property
    def records_removed(self) -> int:
        """Records the row filter dropped (all of them for a drop)."""
        return self.records_in - self.records_out


# ------------------------------------------------------------------ policy
def plan_merges(state: CatalogState, topics: Iterable[str] | None = None,
                object_sizes: Mapping[str, int] | None = None) -> list[MergeRun]:
    """The merges worth doing now, per partition, in topic / partition / offset order.

    The policy (documented in docs/compaction.md):

    1. Segments wholly below the log start offset are dropped (a DeleteRecords that raced a
       compaction swap can leave one; Kafka's ``deleteLogStartOffsetBreachedSegments``).
    2. A segment smaller than ``segment.bytes * SMALL_SEGMENT_FRACTION`` is *small*. Stretches
       of consecutive small segments are cut into groups of at most ``segment.bytes`` (Kafka's
       ``groupSegmentsBySize``).
    3. Size tiering, by records (not bytes: a flush segment carries its own row group and
       column-chunk headers, so its catalog size is about twice its data, while a merged
       segment's is not): a group's first segment is left out while it is at least
       ``TIER_FLOOR_BYTES`` and holds more than ``(1 + TIER_SLACK) / (MERGE_FACTOR - 1)`` of
       the records of the rest of the group together (``TIER_SLACK``: segments of about one
       size count as one size); then the next one is looked at the same way. So a
       merged segment is rewritten only once ``MERGE_FACTOR - 1`` times its records join it,
       and segments of one size pile up until ``MERGE_FACTOR`` of them merge into one of the
       next size: each record is rewritten about log_MERGE_FACTOR(segment / flush) times. A
       steady stream that brings R records a round has rounds that rewrite R, R, R, 4R, R, R,
       R, 4R, R, R, R, 4R, R, R, R, 16R, ...: the k-th tier (R * MERGE_FACTOR**k) once every
       MERGE_FACTOR**k rounds, so a round's work and memory follow the tier it completes (at
       most ``segment.bytes``, the group's bound), not the partition's history. A group that
       holds at least ``segment.bytes * SMALL_SEGMENT_FRACTION`` is merged whole: it makes a
       segment that is no longer small, never to be rewritten by the merge again (else tiers
       whose next step would pass ``segment.bytes`` would stay apart for good).
    4. Groups of two or more segments are merged.
    5. A segment not merged by 4 whose object is mostly dead -- the bytes still named in the
       object (after this round's merges) are below ``DEAD_OBJECT_FRACTION`` of its size --
       is rewritten alone, so the object can go (needs ``object_sizes``).

    Args:
        state: the catalog state (the caller holds the catalog lock or owns the state).
        topics: topics to consider (all when None); unknown names are skipped.
        object_sizes: object key -> size in bytes (from a listing), for rule 5.
    """
    live_bytes: dict[str, int] = defaultdict(int)
    for t in state.topics.values():
        for p in t.partitions:
            for s in p.segments:
                live_bytes[s.path] += s.size_bytes
    runs: list[MergeRun] = []
    singles: list[tuple[str, int, SegmentInfo, int]] = []
    for name in sorted(state.topics if topics is None else set(topics)):
        t = state.topics.get(name)
        if t is None:
            continue
        target = int(effective_config(t.config)["segment.bytes"])
        small = target * SMALL_SEGMENT_FRACTION
        for p in t.partitions:
            dead = tuple(s for s in p.segments if s.last_offset < p.log_start_offset)
            if dead:
                runs.append(MergeRun(name, p.partition, dead, target, drop=True))
            groups: list[list[SegmentInfo]] = [[]]
            group_bytes = 0  # of groups[-1] (a running sum: a partition may have thousands of small segments)
            merged: set[SegmentInfo] = set(dead)
            for s in p.segments:
                if s in merged:
                    continue
                if s.size_bytes >= small:
                    groups.append([])
                    group_bytes = 0
                    continue
                if groups[-1] and group_bytes + s.size_bytes > target:
                    groups.append([])
                    group_bytes = 0
                groups[-1].append(s)
                group_bytes += s.size_bytes
            for group in groups:
                first, rest = 0, sum(_weight(x) for x in group[1:])  # rest: records after group[first]
                whole = sum(x.size_bytes for x in group) >= small  # makes a segment that is not small
                while not whole and len(group) - first >= 2 and group[first].size_bytes >= TIER_FLOOR_BYTES and \
                        (MERGE_FACTOR - 1) * _weight(group[first]) > (1 + TIER_SLACK) * rest:
                    first += 1
                    rest -= _weight(group[first])
                group = group[first:]
                if len(group) >= 2:
                    runs.append(MergeRun(name, p.partition, tuple(group), target))
                    merged.update(group)
            singles.extend((name, p.partition, s, target) for s in p.segments if s not in merged)
    for run in runs:
        for s in run.segments:
            live_bytes[s.path] -= s.size_bytes
    if object_sizes:
        for name, partition, s, target in singles:
            size = object_sizes.get(s.path)
            if size and live_bytes[s.path] < DEAD_OBJECT_FRACTION * size:
                runs.append(MergeRun(name, partition, (s,), target))
                live_bytes[s.path] -= s.size_bytes
    runs.sort(key=lambda r: (r.topic, r.partition, r.segments[0].base_offset))
    return runs


def _weight(segment: SegmentInfo) -> int:
    """A segment's size for size tiering: its records (at least 1)."""
    return max(1, segment.record_count)


def in_batches(items: Sequence[T], size_bytes: Callable[[T], int],
               max_bytes: int = MERGE_BATCH_BYTES) -> list[list[T]]:
    """Cut ``items`` (partitions to clean) into consecutive batches of at most
    ``max_bytes`` catalog bytes (``size_bytes(item)``; a bigger item is a batch alone). A
    batch's segments are prefetched together (:meth:`LogReader.prefetch`), so a flush object
    shared by the batch's partitions is read once; the bound keeps a batch's decoded records
    near ``max_bytes``."""
    batches: list[list[T]] = []
    size = 0
    for item in items:
        n = size_bytes(item)
        if not batches or (batches[-1] and size + n > max_bytes):
            batches.append([])
            size = 0
        batches[-1].append(item)
        size += n
    return batches


# ------------------------------------------------------------------ the primitive
def _check_run(segments: Sequence[SegmentInfo]) -> None:
    assert segments, "a rewrite names at least one segment"
    first = segments[0]
    for prev, seg in zip(segments, segments[1:]):
        if (seg.topic, seg.partition) != (first.topic, first.partition):
            raise ValueError(f"segments of {first.topic} [{first.partition}] and {seg.topic} [{seg.partition}] "
                             "cannot be rewritten together")
        if seg.base_offset <= prev.last_offset:
            raise ValueError(f"segments {prev.path} and {seg.path} of {seg.topic} [{seg.partition}] are not in "
                             "offset order")


def _filtered(table: pa.Table, row_filter: RowFilter) -> pa.Table:
    """Apply ``row_filter`` and check it only dropped rows (offsets kept, in order)."""
    out = row_filter(table)
    if not isinstance(out, pa.Table) or out.schema.names != RECORD_SCHEMA.names:
        raise ValueError(f"row filter {row_filter!r} must return a table of the record columns {RECORD_SCHEMA.names}")
    if out.num_rows:
        offsets = out.column("offset").to_numpy()
        if (len(offsets) > 1 and not bool((np.diff(offsets) > 0).all())) or \
                not bool(np.isin(offsets, table.column("offset").to_numpy()).all()):
            raise ValueError(f"row filter {row_filter!r} may only drop records: it returned offsets that are not "
                             "a subset of its input in offset order")
    return out


def _read_segments(reader: LogReader, segments: Sequence[SegmentInfo]) -> list[pa.Table]:
    """Every segment's records, in order: from the reader's cache when a batch prefetched them,
    else read :data:`READ_THREADS` objects at a time (:meth:`LogReader.prefetch`)."""
    fetched = reader.prefetch(segments, READ_THREADS)
    tables = [fetched.get((s.path, s.row_group_start)) for s in segments]
    return [reader.segment_table(s) if t is None else t for s, t in zip(segments, tables)]


def _check_count(reader: LogReader, segment: SegmentInfo, rows: int) -> None:
    if rows != segment.record_count:
        raise CorruptObjectError(reader.store.uri(segment.path),
                                 f"holds {rows} records of {segment.topic} [{segment.partition}], "
                                 f"the catalog expects {segment.record_count}")


@dataclass
class _Unit:
    """One read of a streamed merge: row groups of one object, for one or more runs."""

    path: str
    #: (run index, segment, the segment's row groups read here): a flush object holds a segment
    #: of several runs (read in one pass); a bigger segment is read a row group at a time
    items: list[tuple[int, SegmentInfo, list[int]]]


def _plan_reads(runs: Sequence[MergeRun]) -> tuple[list[_Unit], list[int]]:
    """The order in which a streamed merge reads the objects of ``runs``: every object once,
    each run's segments in its own order (an object is read once every run it holds a segment
    of has reached that segment: Kahn's topological order). Returns the units and the runs
    that no such order serves (left out of the units, to be read run by run): a run naming
    one object twice apart, or runs meeting two objects in opposite orders -- neither happens
    with flush objects, which every partition meets in flush order."""
    by_path: dict[str, dict[int, list[int]]] = defaultdict(dict)  # path -> run -> segment indices
    for r, run in enumerate(runs):
        for i, seg in enumerate(run.segments):
            by_path[seg.path].setdefault(r, []).append(i)
    stuck = [r for r, run in enumerate(runs)
             if any(idx[-1] - idx[0] != len(idx) - 1 for idx in (by_path[s.path][r] for s in run.segments))]
    if stuck:
        kept = [r for r in range(len(runs)) if r not in stuck]
    else:
        heads: Counter = Counter()  # path -> runs whose next segment is in it
        ready: deque[str] = deque()

        def arrive(r: int, i: int) -> None:
            path = runs[r].segments[i].path
            heads[path] += 1
            if heads[path] == len(by_path[path]):
                ready.append(path)

        for r in range(len(runs)):
            arrive(r, 0)
        units: list[_Unit] = []
        done = [0] * len(runs)
        while ready:
            path = ready.popleft()
            items = [(r, runs[r].segments[i], list(runs[r].segments[i].row_groups))
                     for r, idx in sorted(by_path[path].items()) for i in idx]
            if len(items) == 1 and len(items[0][2]) > 1:  # one segment of many row groups: one at a time
                r, seg, rgs = items[0]
                units += [_Unit(path, [(r, seg, [rg])]) for rg in rgs]
            else:
                units.append(_Unit(path, items))
            for r, idx in by_path[path].items():
                done[r] = idx[-1] + 1
                if done[r] < len(runs[r].segments):
                    arrive(r, done[r])
        stuck = [r for r, run in enumerate(runs) if done[r] < len(run.segments)]
        if not stuck:
            return units, []
        kept = [r for r in range(len(runs)) if r not in stuck]
    if not kept:
        return [], stuck
    units, more = _plan_reads([runs[r] for r in kept])
    for unit in units:
        unit.items = [(kept[r], seg, rgs) for r, seg, rgs in unit.items]
    return units, stuck + [kept[r] for r in more]


def _read_unit(reader: LogReader, unit: _Unit) -> list[pa.Table]:
    """The records of each item of ``unit`` (RECORD_SCHEMA): from the reader's cache when it
    holds a whole segment, else all the others in one pass over the object
    (:func:`~txlake.formats.records.read_row_group_sets`)."""
    tables: list[pa.Table | None] = [reader.cache.get((seg.path, seg.row_group_start)) if rgs == seg.row_groups
                                     else None for _, seg, rgs in unit.items]
    missing = [i for i, t in enumerate(tables) if t is None]
    if missing:
        read = reader.store.read_object(unit.path, lambda f: read_row_group_sets(
            f, reader.store.uri(unit.path), [unit.items[i][2] for i in missing]))
        for i, table in zip(missing, read):
            tables[i] = table
    return tables  # type: ignore[return-value]


def _read_ahead(reader: LogReader, units: Sequence[_Unit],
                workers: RoundWorkers | None = None) -> Iterator[tuple[_Unit, list[pa.Table]]]:
    """``(unit, its tables)`` in order, read :data:`READ_THREADS` units ahead of the consumer
    (on ``workers.read`` when given, else on threads of its own): at most ``READ_THREADS + 1``
    units are decoded at once, whatever the runs' sizes."""
    if not units:
        return
    ahead: deque[Future] = deque()
    with contextlib.nullcontext(workers.read) if workers is not None else \
            ThreadPoolExecutor(min(READ_THREADS, len(units)), thread_name_prefix="txlake-merge-read") as pool:
        try:
            for unit in units[:READ_THREADS]:
                ahead.append(pool.submit(_read_unit, reader, unit))
            for i, unit in enumerate(units):
                tables = ahead.popleft().result()
                if i + READ_THREADS < len(units):
                    ahead.append(pool.submit(_read_unit, reader, units[i + READ_THREADS]))
                yield unit, tables
                del tables
        finally:
            for future in ahead:
                future.cancel()


class _OutOfOrder(Exception):
    """A streamed piece's offsets do not follow the ones before it (the run must be sorted whole)."""


class _SegmentWriter:
    """Writes a run's records, streamed in offset order, as new segment objects of one
    partition: ``rows_per_segment`` records an object, row groups of at most
    ``max_row_group_rows`` rows and about ``row_group_bytes`` of Arrow data.

    Only the row group being filled is held decoded, plus the one being encoded: a complete
    row group is encoded into a spool file (an unlinked file in the system's temporary
    folder, ``$TMPDIR``) -- on ``pool`` when given (the encodes of several runs' writers run
    side by side, each writer's in order, at most one at a time), else at once -- and a
    finished object is put from a memory map of that file, so the object being written is
    never in the process's heap (a put to S3 copies it once: s3fs takes bytes).
    """

    def __init__(self, store, run: MergeRun, max_row_group_rows: int, row_group_bytes: int, compression: str,
                 stamp: int, pool: ThreadPoolExecutor | None = None):
        self.store, self.pool = store, pool
        #: what was written so far (records_out / bytes_out / segments)
        self.out = SegmentRewrite(run, [], run.record_count, 0, run.size_bytes, 0)
        # segments of about target_bytes, estimated from the old segments' bytes per record
        self.rows_per_segment = max(1, int(run.target_bytes * run.record_count // max(run.size_bytes, 1)))
        self.max_rows, self.group_bytes = max_row_group_rows, row_group_bytes
        self.compression, self.stamp = compression, stamp
        # the caller's side: the row group being filled and the object it belongs to
        self.pending: list[pa.Table] = []
        self._coalesced = 0  # pieces at the start of pending that are already coalesced tables
        self.pending_rows = self.pending_bytes = 0
        self.taken = 0  # rows given to the current object (pending ones included)
        self.first_offset = self.last_offset = -1  # of the current object
        self.ts_min: int | None = None
        self.ts_max: int | None = None
        self.last_written = -1  # the last offset taken (the whole rewrite)
        # the encoding side (the lane's task, or the caller when there is no pool)
        self.lane: Future | None = None
        self.spool: int | None = None  # a descriptor of the current object's spool file (unlinked)
        self.sink: pa.NativeFile | None = None
        self.writer = None
        self.rows = self.groups = 0  # encoded into the current object

    def add(self, piece: pa.Table, ordered: bool = False) -> None:
        """Take ``piece``: RECORD_SCHEMA rows whose offsets ascend and follow every offset taken
        before (checked unless the caller sorted them, ``ordered``: else :class:`_OutOfOrder`,
        nothing of it taken)."""
        if not piece.num_rows:
            return
        if not ordered:
            offsets = piece.column("offset").to_numpy()
            if offsets[0] <= self.last_written or (len(offsets) > 1 and not bool((np.diff(offsets) > 0).all())):
                raise _OutOfOrder
            self.last_written = int(offsets[-1])
        if not piece.schema.equals(RECORD_SCHEMA):
            piece = piece.cast(RECORD_SCHEMA)
        row_bytes = max(1.0, piece.nbytes / piece.num_rows)
        while piece.num_rows:
            by_bytes = max(1, math.ceil((self.group_bytes - self.pending_bytes) / row_bytes))
            take = min(piece.num_rows, self.rows_per_segment - self.taken, self.max_rows - self.pending_rows, by_bytes)
            part, piece = piece.slice(0, take), piece.slice(take)
            if not self.taken:
                self.first_offset = part.column("offset")[0].as_py()
            self.last_offset = part.column("offset")[-1].as_py()
            ts = pc.min_max(part.column("timestamp"))
            lo, hi = ts["min"].as_py(), ts["max"].as_py()
            self.ts_min = lo if self.ts_min is None else min(self.ts_min, lo)
            self.ts_max = hi if self.ts_max is None else max(self.ts_max, hi)
            self.pending.append(part)
            self.pending_rows += take
            self.pending_bytes += math.ceil(take * row_bytes)
            self.taken += take
            self._coalesce()
            if self.pending_rows >= self.max_rows or self.pending_bytes >= self.group_bytes:
                self._hand_group()
            if self.taken >= self.rows_per_segment:
                self._hand_object()

    def _coalesce(self) -> None:
        """Copy the last :data:`COALESCE_PIECES` pieces of the row group being filled into one
        table when there are that many small ones: a piece costs its column chunks' fixed
        overhead (about 23 KiB for the 17 record columns, :mod:`.log_reader`) besides its
        records, which outweighs the records of a trickle's flush segments (a hundred records
        of 50 bytes). Each record is copied once."""
        tail = self.pending[self._coalesced:]
        if len(tail) >= COALESCE_PIECES:
            self.pending[self._coalesced:] = [pa.concat_tables(tail).combine_chunks()]
            self._coalesced = len(self.pending)

    def _run(self, task: Callable[..., None], *args: Any) -> None:
        """Run ``task`` on the lane: after the writer's previous task (waited for here, so at
        most one row group waits to be encoded), on the pool; at once without one."""
        if self.pool is None:
            task(*args)
            return
        if self.lane is not None:
            self.lane.result()
        self.lane = self.pool.submit(task, *args)

    def _hand_group(self) -> None:
        if self.pending:
            group = pa.concat_tables(self.pending) if len(self.pending) > 1 else self.pending[0]
            self.pending, self.pending_rows, self.pending_bytes, self._coalesced = [], 0, 0, 0
            self._run(self._encode, group)

    def _hand_object(self) -> None:
        self._hand_group()
        if self.taken:
            self._run(self._put, self.first_offset, self.last_offset, self.ts_min, self.ts_max)
            self.taken = 0
            self.ts_min = self.ts_max = None

    def _encode(self, group: pa.Table) -> None:
        if self.writer is None:
            self.spool, name = tempfile.mkstemp(prefix="txlake-merge-", suffix=".parquet")
            try:
                self.sink = pa.OSFile(name, "wb")  # native: no GIL taken per page
            finally:
                os.unlink(name)  # nothing is left behind, even by a crash
            self.writer = segment_writer(self.sink, self.compression)
        self.groups += write_records(self.writer, group, group.num_rows)
        self.rows += group.num_rows

    def _put(self, first_offset: int, last_offset: int, ts_min: int, ts_max: int) -> None:
        self.writer.close()
        self.sink.close()
        self.writer = self.sink = None
        path = f"{DATA_PREFIX}{self.stamp:013d}-{uuid.uuid4().hex}.parquet"
        with mmap.mmap(self.spool, 0, access=mmap.ACCESS_READ) as data:
            size = len(data)
            self.store.put(path, data)
        os.close(self.spool)
        self.spool = None
        run = self.out.run
        self.out.segments.append(SegmentInfo(run.topic, run.partition, path, first_offset, last_offset, self.rows,
                                             size, ts_min, ts_max, 0, self.groups))
        self.out.records_out += self.rows
        self.out.bytes_out += size
        self.rows = self.groups = 0

    def finish(self) -> None:
        """Hand over what is left (the last object); :meth:`wait` for it to be written."""
        self._hand_object()

    def wait(self) -> None:
        """Wait for the writer's tasks (raising the first task's error)."""
        if self.lane is not None:
            lane, self.lane = self.lane, None
            lane.result()

    def close(self) -> None:
        """Drop the spool file of an object in progress (after :meth:`wait` or a failure)."""
        try:
            self.wait()
        except BaseException:  # noqa: BLE001 - the writer is abandoned (its caller saw the error)
            pass
        for closing in (self.writer, self.sink):
            if closing is not None:
                try:
                    closing.close()
                except Exception:  # noqa: BLE001 - the object is abandoned anyway
                    pass
        self.writer = self.sink = None
        if self.spool is not None:
            os.close(self.spool)
            self.spool = None


class MergeCancelled(Exception):
    """:func:`rewrite_runs` stopped because its ``cancel`` event was set (nothing it wrote is kept)."""


def rewrite_runs(reader: LogReader, runs: Sequence[MergeRun], *, compression: str = "snappy",
                 max_row_group_rows: int = DEFAULT_ROW_GROUP_ROWS, row_group_bytes: int = ROW_GROUP_BYTES,
                 now_ms: int | None = None, cancel: threading.Event | None = None,
                 workers: RoundWorkers | None = None) -> list[SegmentRewrite]:
    """Merge several runs (each: consecutive segments of one partition) in ONE streamed pass
    over their objects, as :func:`rewrite_segments` without a row filter merges one.

    Each object is read once for all the runs' segments it holds (a flush object holds a
    segment of every partition it flushed; reading it once per partition made the merge of
    bench_compaction's 8 partitions about twice as slow), the objects in an order that
    serves every run its segments in offset order (:func:`_plan_reads`), :data:`READ_THREADS`
    objects ahead; a segment of many row groups (an earlier merge's) is read a row group at
    a time. Each run's records go to its own writer, which encodes a row group as soon as it
    holds about ``row_group_bytes`` (see :class:`_SegmentWriter`), :data:`MERGE_THREADS`
    runs' row groups at a time. So the pass holds ``READ_THREADS + 1`` objects' row groups
    decoded, and per run its row group in progress and the one being encoded: about two row
    groups per run at most, whatever the runs' sizes (a run smaller than a row group is held
    whole until it is written). A run is never committed here.

    A run whose segments do not hold ascending offsets (never written by txlake) is read
    again whole and sorted, as before streaming; runs no single object order serves are
    read run by run. A drop run (``run.drop``) reads nothing and writes nothing.

    Args:
        reader: reads the old segments (its store receives the new objects); segments its
            cache holds are taken from there.
        runs: the runs (their ``target_bytes``: the size the new segments aim at).
        compression / max_row_group_rows / row_group_bytes / now_ms: as :func:`rewrite_segments`.
        cancel: checked between objects; when set, everything written is deleted and
            :class:`MergeCancelled` raised.
        workers: the round's worker threads (:class:`RoundWorkers`: the caller releases
            their memory once the records are freed); None: threads of the call's own.

    Returns:
        One :class:`SegmentRewrite` per run, in the order of ``runs``.

    Raises:
        as :func:`rewrite_segments` (everything written by the pass is deleted first);
        MergeCancelled.
    """
    for run in runs:
        _check_run(run.segments)
    stamp = int(time.time() * 1000) if now_ms is None else now_ms
    live = [r for r, run in enumerate(runs) if not run.drop]
    # several runs' row groups are encoded side by side (Parquet encoding, writes and fsyncs release the GIL)
    own_pool = workers is None and len(live) > 1
    pool = None if len(live) < 2 else workers.encode if workers is not None else \
        ThreadPoolExecutor(MERGE_THREADS, thread_name_prefix="txlake-merge")
    writers = {r: _SegmentWriter(reader.store, runs[r], max_row_group_rows, row_group_bytes, compression, stamp, pool)
               for r in live}
    outs = [SegmentRewrite(run, [], run.record_count, 0, run.size_bytes, 0) for run in runs]
    done_alone: list[SegmentRewrite] = []  # written (not committed) by the calls for single runs
    try:
        units, alone = _plan_reads([runs[r] for r in live])
        rows: Counter = Counter()  # (run, path, first row group) -> rows read
        unread: dict[tuple[int, str, int], int] = {}  # (run, path, first row group) -> row groups still to read
        sorted_whole: list[int] = []
        for unit, tables in _read_ahead(reader, units, workers):
            if cancel is not None and cancel.is_set():
                raise MergeCancelled()
            for (r, seg, rgs), table in zip(unit.items, tables):
                run_index = live[r]
                key = (run_index, seg.path, seg.row_group_start)
                unread[key] = unread.get(key, len(seg.row_groups)) - len(rgs)
                rows[key] += table.num_rows
                if not unread[key]:
                    _check_count(reader, seg, rows[key])
                if run_index in sorted_whole:
                    continue
                try:
                    writers[run_index].add(table)
                except _OutOfOrder:
                    sorted_whole.append(run_index)
        for r in sorted_whole:  # sorted whole, as before streaming
            writers[r].close()
            discard_rewrite(reader.store, writers[r].out)
            writers[r] = _SegmentWriter(reader.store, runs[r], max_row_group_rows, row_group_bytes, compression,
                                        stamp, pool)
            writers[r].add(_sorted_records(reader, runs[r].segments), ordered=True)
        for r in (live[i] for i in alone):  # no order served them together: each alone
            writers[r].close()
            if len(runs) == 1:
                writers[r] = _SegmentWriter(reader.store, runs[r], max_row_group_rows, row_group_bytes,
                                            compression, stamp)
                writers[r].add(_sorted_records(reader, runs[r].segments), ordered=True)
            else:
                del writers[r]
                (outs[r],) = rewrite_runs(reader, [runs[r]], compression=compression,
                                          max_row_group_rows=max_row_group_rows, row_group_bytes=row_group_bytes,
                                          now_ms=stamp, cancel=cancel, workers=workers)
                done_alone.append(outs[r])
        for w in writers.values():
            w.finish()
        for r, w in writers.items():
            w.wait()
            outs[r] = w.out
    except BaseException:
        for w in writers.values():
            w.close()
            discard_rewrite(reader.store, w.out)
        for out in done_alone:
            discard_rewrite(reader.store, out)
        raise
    finally:
        for w in writers.values():
            w.close()
        if own_pool:
            pool.shutdown()
    return outs


def _sorted_records(reader: LogReader, segments: Sequence[SegmentInfo]) -> pa.Table:
    """Every record of ``segments`` at once, in offset order (sorted when they are not)."""
    tables = _read_segments(reader, segments)
    tables = [t if t.schema.equals(RECORD_SCHEMA) else t.cast(RECORD_SCHEMA) for t in tables]
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    offsets = table.column("offset").to_numpy()
    if len(offsets) > 1 and not bool((np.diff(offsets) > 0).all()):
        table = table.take(pa.array(np.argsort(offsets, kind="stable")))
    return table


def rewrite_segments(reader: LogReader, segments: Sequence[SegmentInfo], *, target_bytes: int,
                     row_filter: RowFilter | None = None, compression: str = "snappy",
                     max_row_group_rows: int = DEFAULT_ROW_GROUP_ROWS, row_group_bytes: int = ROW_GROUP_BYTES,
                     now_ms: int | None = None) -> SegmentRewrite:
    """Rewrite consecutive segments of one partition into new per-partition segment objects.

    The records are read (each segment's record count checked against the catalog), in
    offset order, passed through ``row_filter`` when given, and split into segments of about
    ``target_bytes`` each (estimated from the old segments' bytes per record), each its own
    object under ``data/`` with row groups of at most ``max_row_group_rows`` rows and about
    ``row_group_bytes`` of uncompressed (Arrow) data. Nothing is committed: see
    :func:`swap_actions` / :func:`replace_segments`. Kafka's ``Cleaner.cleanSegments``.

    Memory: without a row filter the records stream through (:func:`rewrite_runs`): a merge
    holds ``READ_THREADS + 1`` old row groups and one new one decoded, whatever the run's
    size. A row filter sees the run's records at once (key compaction's rules need them
    together).

    Args:
        reader: reads the old segments (its store receives the new objects); a segment its
            cache holds is taken from there.
        segments: consecutive segments of one partition, in offset order.
        target_bytes: the topic's ``segment.bytes`` (bytes).
        row_filter: drops records (key compaction); None keeps them all.
        compression: Parquet codec of the new objects.
        max_row_group_rows: rows per row group at most.
        row_group_bytes: uncompressed bytes a row group aims at.
        now_ms: time used in the new object names (ms since the epoch; wall clock when None).

    Raises:
        ValueError: segments of several partitions, out of offset order, or a row filter that
            did more than drop records.
        CorruptObjectError / UnsupportedFormatVersionError / ObjectNotFoundError: an old
            segment is unreadable (names its object).
        StorageError: writing a new object failed (the ones already written are deleted).
    """
    _check_run(segments)
    first = segments[0]
    run = MergeRun(first.topic, first.partition, tuple(segments), target_bytes)
    if row_filter is None:
        return rewrite_runs(reader, [run], compression=compression, max_row_group_rows=max_row_group_rows,
                            row_group_bytes=row_group_bytes, now_ms=now_ms)[0]
    stamp = int(time.time() * 1000) if now_ms is None else now_ms
    w = _SegmentWriter(reader.store, run, max_row_group_rows, row_group_bytes, compression, stamp)
    try:
        w.add(_filtered(_sorted_records(reader, segments), row_filter), ordered=True)
        w.finish()
        w.wait()
    except BaseException:
        discard_rewrite(reader.store, w.out)
        raise
    finally:
        w.close()
    return w.out


def discard_rewrite(store, rewrite: SegmentRewrite) -> None:
    """Delete the new objects of a rewrite that was never committed (best effort: what stays
    behind is an orphan the cleaner deletes by age)."""
    for seg in rewrite.segments:
        try:
            store.delete(seg.path)
        except Exception:  # noqa: BLE001 - an orphan is harmless
            pass


def swap_actions(state: CatalogState, rewrite: SegmentRewrite, now_ms: int) -> list[dict[str, Any]]:
    """The ONE commit that swaps a rewrite in, computed from the current ``state`` (call it under
    the writer's commit lock): ``remove_segment`` for each old segment, ``add_segment`` for each
    new one with the partition's current high watermark and LSO (neither moves), and
    ``retire_object {path, timestamp_ms=now_ms}`` for each object no segment names afterwards.
    Kafka's ``UnifiedLog.replaceSegments``.

    Raises:
        StaleRewriteError: the old segments are no longer exactly the same consecutive
            segments of the partition (nothing must be committed).
    """
    run = rewrite.run
    try:
        p = state.partition(run.topic, run.partition)
    except UnknownTopicError as exc:
        raise StaleRewriteError(str(exc)) from None
    segments = p.segments
    idx = next((i for i, s in enumerate(segments) if s == run.segments[0]), None)
    if idx is None or tuple(segments[idx:idx + len(run.segments)]) != run.segments:
        raise StaleRewriteError(f"the segments of {run.topic} [{run.partition}] from offset "
                                f"{run.segments[0].base_offset} changed since they were rewritten")
    actions: list[dict[str, Any]] = [
        {"action": REMOVE_SEGMENT, "topic": s.topic, "partition": s.partition, "path": s.path,
         "base_offset": s.base_offset} for s in run.segments]
    actions += [s.to_action(p.high_watermark, p.last_stable_offset) for s in rewrite.segments]
    for path, n in sorted(Counter(s.path for s in run.segments).items()):
        if state.reference_count(path) == n:
            actions.append({"action": RETIRE_OBJECT, "path": path, "timestamp_ms": now_ms})
    return actions


def replace_segments(reader: LogReader, commit: Committer, segments: Sequence[SegmentInfo], *,
                     target_bytes: int, row_filter: RowFilter | None = None, compression: str = "snappy",
                     max_row_group_rows: int = DEFAULT_ROW_GROUP_ROWS, now_ms: int | None = None,
                     drop: bool = False) -> SegmentRewrite | None:
    """Rewrite consecutive segments of one partition (:func:`rewrite_segments`) and swap the
    result in with one catalog commit (:func:`swap_actions`).

    Args:
        reader / segments / target_bytes / row_filter / compression / max_row_group_rows:
            as :func:`rewrite_segments`.
        commit: the writer's commit under its commit lock (``Broker.commit_under_lock``).
        now_ms: the retirement stamp of the replaced objects (wall clock at commit when None).
        drop: remove the segments without reading them (they lie below the log start offset).

    Returns:
        The committed rewrite, or None when the segments changed meanwhile (the new objects
        are deleted again; nothing was committed).

    Raises:
        as :func:`rewrite_segments`; ApiError (_FENCED, NOT_LEADER_OR_FOLLOWER) from ``commit``
        -- the new objects then stay for the orphan cleaner, since whether the commit landed
        is not known.
    """
    if drop:
        _check_run(segments)
        first = segments[0]
        run = MergeRun(first.topic, first.partition, tuple(segments), target_bytes, drop=True)
        rewrite = SegmentRewrite(run, [], run.record_count, 0, run.size_bytes, 0)
    else:
        rewrite = rewrite_segments(reader, segments, target_bytes=target_bytes, row_filter=row_filter,
                                   compression=compression, max_row_group_rows=max_row_group_rows, now_ms=now_ms)
    return commit_rewrite(reader.store, commit, rewrite, now_ms)


def commit_rewrite(store, commit: Committer, rewrite: SegmentRewrite,
                   now_ms: int | None = None) -> SegmentRewrite | None:
    """Swap a written rewrite in with ONE catalog commit (:func:`swap_actions`, computed under
    the writer's commit lock by ``commit``). Kafka's ``UnifiedLog.replaceSegments``.

    Args:
        store: the store holding the rewrite's new objects.
        commit: the writer's commit under its commit lock (``Broker.commit_under_lock``).
        rewrite: from :func:`rewrite_segments` / :func:`rewrite_runs`.
        now_ms: the retirement stamp of the replaced objects (wall clock at commit when None).

    Returns:
        ``rewrite``, or None when its segments changed meanwhile (its new objects are deleted
        again; nothing was committed).

    Raises:
        ApiError (_FENCED, NOT_LEADER_OR_FOLLOWER) from ``commit``: the new objects then stay
        for the orphan cleaner, since whether the commit landed is not known.
    """
    try:
        commit(lambda state: swap_actions(state, rewrite, int(time.time() * 1000) if now_ms is None else now_ms))
    except StaleRewriteError:
        discard_rewrite(store, rewrite)
        return None
    return rewrite
