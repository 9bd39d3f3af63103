"""The compaction runner: retention, key compaction, small-file merge and object cleaning.

One round (:func:`compact`) does, in the writer and in this order:

1. **Retention** (``cleanup.policy=delete``): :func:`txlake.engine.log_retention.retention_targets`
   decides which leading segments ``retention.ms`` / ``retention.bytes`` delete, and
   ``Broker.delete_records`` applies it (Kafka's ``UnifiedLog.deleteOldSegments``).
2. **Key compaction** (``cleanup.policy=compact``): :func:`key_compaction` offers each
   partition's cleanable segments to :func:`txlake.engine.log_cleaner.row_filter`.
3. **Small-file merge**: :func:`txlake.engine.segment_merge.plan_merges` /
   :func:`~txlake.engine.segment_merge.replace_segments`.
4. **Object cleaning**: retired objects past ``file.delete.delay.ms`` and orphans past
   ``storage.orphan.grace.ms`` are deleted (:mod:`.object_cleaner`), and so are the catalog
   commits and checkpoints a kept checkpoint covers once older than
   ``storage.catalog.retention.ms`` (:mod:`txlake.catalog.log_cleanup`).

Every commit goes through the writer's lease and commit lock (``Broker.commit_under_lock``,
``Broker.delete_records``), so it serialises with flushes; only segments already in the
catalog are ever touched. Offsets never change, readers are never disturbed (old objects
stay for the grace period) and a crash at any point leaves the log as before or as after
the swap in progress (docs/compaction.md).

The writer runs a round every ``storage.compaction.interval.ms`` (:class:`CompactionThread`);
``txlake compact`` runs one on demand.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from txlake.catalog.errors import UnknownTopicError
from txlake.catalog.log_cleanup import clean_catalog_log
from txlake.catalog.state import CatalogState, PartitionState, SegmentInfo
from txlake.catalog.topic_config import cleanup_policies, effective_config

from .group_commit import DATA_PREFIX, SNAPSHOT_PREFIX
from .log_cleaner import row_filter as make_row_filter
from .log_reader import LogReader, SegmentCache
from .log_retention import retention_targets
from .object_cleaner import ObjectCleanup, clean_objects
from .partition_writer import PartitionWriter
from .segment_merge import (MergeCancelled, MergeRun, RoundWorkers, RowFilter, SegmentRewrite, commit_rewrite,
                            discard_rewrite, in_batches, plan_merges, release_unused_memory, replace_segments,
                            rewrite_runs)
from .table_publisher import checkpoint_tables, clean_dv_files, clean_table_logs, drop_deleted_tables, tables_name


log = logging.getLogger(__name__)

__all__ = ["CompactionSummary", "CompactionThread", "ProgressCallback", "apply_retention", "compact", "key_compaction",
           "measure_after", "measure_before", "release_unused_memory", "round_lock", "selected_topics"]

#: ``progress(phase, done, total)``: phase is "retention" (partitions), "key compaction" and
#: "merge" (bytes of input segments) or "cleaning" (steps); called as work completes.
ProgressCallback = Callable[[str, int, int], None]

#: one compaction at a time per writer (the background thread and an on-demand call)
_round_locks: "weakref.WeakKeyDictionary[Any, threading.Lock]" = weakref.WeakKeyDictionary()
_round_locks_guard = threading.Lock()


@dataclass
class CompactionSummary:
    """What a compaction round did (or, with ``dry_run``, would do).

    Objects and bytes are those of the data objects the selected topics' segments name
    (bytes: object sizes from a listing); objects retired this round still occupy storage
    until their grace passes (``pending_deletion``).

    Attributes:
        objects_before / objects_after: distinct data objects named by the selected topics.
        bytes_before / bytes_after: their total size (bytes).
        segments_before / segments_after: segments of the selected topics.
        records_before / records_after: records in those segments.
        merges: segment rewrites committed (planned, with ``dry_run``).
        retention_partitions: partitions whose log start offset retention moved.
        key_compacted_partitions: partitions key compaction rewrote.
        deleted_objects: retired objects deleted (their grace had passed).
        orphans_deleted: never-committed objects deleted (older than ``storage.orphan.grace.ms``).
        pending_deletion: retired objects still within their grace.
        catalog_commits_deleted / catalog_checkpoints_deleted: catalog commits and checkpoints
            deleted because a kept checkpoint covers them and they are older than
            ``storage.catalog.retention.ms`` (:mod:`txlake.catalog.log_cleanup`).
        skipped: rewrites not committed because their segments changed meanwhile.
    """

    dry_run: bool = False
    objects_before: int = 0
    objects_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    segments_before: int = 0
    segments_after: int = 0
    records_before: int = 0
    records_after: int = 0
    merges: int = 0
    retention_partitions: int = 0
    key_compacted_partitions: int = 0
    deleted_objects: int = 0
    orphans_deleted: int = 0
    pending_deletion: int = 0
    catalog_commits_deleted: int = 0
    catalog_checkpoints_deleted: int = 0
    skipped: int = 0

    @property
    def records_removed(self) -> int:
        """Records retention and key compaction removed (the merge removes none)."""
        return self.records_before - self.records_after


def round_lock(writer: PartitionWriter) -> threading.Lock:
    """The lock that lets one compaction round at a time run on ``writer`` (the background
    thread, ``txlake compact`` and the Spark job's driver)."""
    with _round_locks_guard:
        lock = _round_locks.get(writer)
        if lock is None:
            lock = _round_locks[writer] = threading.Lock()
        return lock


def selected_topics(state: CatalogState, topics: Iterable[str] | None) -> list[str]:
    """``topics`` sorted (every topic of ``state`` when None). Raises UnknownTopicError for a missing one."""
    if topics is None:
        return sorted(state.topics)
    names = sorted(set(topics))
    missing = [n for n in names if n not in state.topics]
    if missing:
        raise UnknownTopicError(f"Unknown topic: {', '.join(missing)}")
    return names


def _segments(state: CatalogState, names: list[str]) -> dict[tuple[str, int], list[SegmentInfo]]:
    """Each partition's segment list (a copy) for the topics ``names``."""
    return {(n, p.partition): list(p.segments) for n in names if n in state.topics for p in state.topics[n].partitions}


def _footprint(segments: dict[tuple[str, int], list[SegmentInfo]], sizes: dict[str, int]) -> tuple[int, int, int, int]:
    """``(objects, bytes, segments, records)`` of a segment layout; an object's bytes come from
    ``sizes`` (the listing), else the sum of its segments' catalog sizes."""
    objects: dict[str, int] = {}
    n_segments = records = 0
    for segs in segments.values():
        for s in segs:
            objects[s.path] = objects.get(s.path, 0) + s.size_bytes
            n_segments += 1
            records += s.record_count
    return len(objects), sum(sizes.get(k, v) for k, v in objects.items()), n_segments, records


def measure_before(writer: PartitionWriter, topics: Iterable[str] | None,
                   summary: "CompactionSummary") -> tuple[list[str], dict[str, int]]:
    """Start a round: fill ``summary``'s before-columns (objects, bytes, segments, records).

    Returns:
        ``(names, sizes)``: the selected topics and every data object's size (bytes) as listed now.
    """
    with writer.catalog.lock:
        names = selected_topics(writer.catalog.state, topics)
        before = _segments(writer.catalog.state, names)
    sizes = {o.key: o.size for o in writer.store.list(DATA_PREFIX)}
    (summary.objects_before, summary.bytes_before, summary.segments_before,
     summary.records_before) = _footprint(before, sizes)
    return names, sizes


def measure_after(writer: PartitionWriter, names: list[str], sizes: dict[str, int], summary: "CompactionSummary",
                  planned: dict[tuple[str, int], list[SegmentInfo]] | None = None) -> None:
    """End a round: fill ``summary``'s after-columns from the catalog (or from ``planned``, a dry
    run's estimate); ``sizes`` holds the sizes of the objects the round wrote."""
    if planned is None:
        with writer.catalog.lock:
            planned = _segments(writer.catalog.state, names)
    (summary.objects_after, summary.bytes_after, summary.segments_after,
     summary.records_after) = _footprint(planned, sizes)


def key_compaction(writer: PartitionWriter, names: list[str], now_ms: int,
                   progress: ProgressCallback | None, cancel: threading.Event | None,
                   workers: RoundWorkers | None = None) -> tuple[int, int]:
    """Key compaction of every partition of ``names`` whose ``cleanup.policy`` includes
    ``compact``, with the rules of :func:`txlake.engine.log_cleaner.row_filter`
    (``row_filter(partition, config, reader, now_ms) -> RowFilter | None``). ``partition`` is a snapshot
    (:class:`~txlake.catalog.state.PartitionState` with copies of its segment list and
    aborted-transaction index) whose ``segments`` are only the cleanable ones: wholly below
    the LSO (Kafka's first uncleanable offset: records of open transactions are never
    cleaned) and never the partition's last segment (Kafka's active segment, so the log's
    last record survives and consumers reach the high watermark); ``config`` is the topic's
    effective config; ``reader`` (a :class:`LogReader` holding the batch of partitions being
    cleaned, prefetched once) reads segments (``reader.segment_table(segment)``), e.g. to
    build Kafka's offset map. The factory returns the filter for this round, or None when
    nothing is worth cleaning (e.g. below ``min.cleanable.dirty.ratio``). The cleanable
    segments are then cut into groups of at most ``segment.bytes`` (Kafka's
    ``groupSegmentsBySize``) and each group is rewritten through the filter and swapped in
    with :func:`~txlake.engine.segment_merge.replace_segments`. The filter sees one group's
    records (RECORD_SCHEMA, offset order) and returns the ones to keep.

    Reads and rewrites run on ``workers`` (the round's :class:`RoundWorkers`, whose memory
    the caller releases) or, when None, on workers of the call's own, released at its end.

    Returns:
        ``(partitions rewritten, groups skipped because their segments changed meanwhile)``.
    """
    offered: list[tuple[PartitionState, dict[str, str]]] = []
    with writer.catalog.lock:  # snapshots only: the factory may read, and must not hold up commits
        for name in names:
            t = writer.catalog.state.topics[name]
            config = effective_config(t.config)
            if "compact" not in cleanup_policies(config):
                continue
            for p in t.partitions:
                # never the last segment (Kafka never cleans the active segment): the log's last
                # record survives, so a consumer's position always reaches the high watermark
                cleanable = [s for s in p.segments[:-1] if s.last_offset < p.last_stable_offset]
                if cleanable:
                    offered.append((PartitionState(name, p.partition, p.log_start_offset, p.high_watermark,
                                                   p.last_stable_offset, cleanable, list(p.aborted_transactions)),
                                    config))
    if not offered:
        return 0, 0
    total = sum(s.size_bytes for snapshot, _ in offered for s in snapshot.segments)
    done = skipped = 0
    partitions: set[tuple[str, int]] = set()
    # batches of partitions: each batch's segments are prefetched once (a flush object shared by
    # its partitions is read once) and serve both the offset maps and the rewrites
    batch_reader = LogReader(writer.catalog, SegmentCache(None))
    with contextlib.nullcontext(workers) if workers is not None else RoundWorkers() as round_workers:
        pool = round_workers.encode
        for batch in in_batches(offered, lambda item: sum(s.size_bytes for s in item[0].segments),
                                writer.config.compaction_batch_bytes):
            if cancel is not None and cancel.is_set():
                break
            batch_reader.prefetch([s for snapshot, _ in batch for s in snapshot.segments], pool=round_workers.read)
            work: list[tuple[RowFilter, MergeRun]] = []
            for snapshot, config in batch:
                row_filter = make_row_filter(snapshot, config, batch_reader, now_ms)
                if row_filter is None:
                    done += sum(s.size_bytes for s in snapshot.segments)
                    continue
                work += [(row_filter, run) for run in _size_groups(snapshot, int(config["segment.bytes"]))]
            futures = [pool.submit(_merge_run, writer, batch_reader, run, now_ms, cancel, row_filter)
                       for row_filter, run in work]
            for (_, run), future in zip(work, futures):
                outcome = future.result()
                if outcome is False:
                    continue
                if outcome is None:
                    skipped += 1
                else:
                    partitions.add((run.topic, run.partition))
                done += run.size_bytes
                if progress is not None:
                    progress("key compaction", done, total)
            batch_reader.cache.clear()
    return len(partitions), skipped


def _size_groups(snapshot: PartitionState, target: int) -> list[MergeRun]:
    """The cleanable segments cut into groups of at most ``target`` bytes (Kafka's
    ``groupSegmentsBySize``)."""
    runs: list[MergeRun] = []
    group: list[SegmentInfo] = []
    group_bytes = 0  # a running sum: a partition may have thousands of small segments
    for s in snapshot.segments:
        if group and group_bytes + s.size_bytes > target:
            runs.append(MergeRun(snapshot.topic, snapshot.partition, tuple(group), target))
            group, group_bytes = [], 0
        group.append(s)
        group_bytes += s.size_bytes
    runs.append(MergeRun(snapshot.topic, snapshot.partition, tuple(group), target))
    return runs


def apply_retention(writer: PartitionWriter, names: list[str], now_ms: int, dry_run: bool,
               progress: ProgressCallback | None) -> list[tuple[str, int, int]]:
    """Retention's ``(topic, partition, new log start offset)`` targets for ``names``, applied with
    ``Broker.delete_records`` unless ``dry_run``."""
    with writer.catalog.lock:
        found = retention_targets(writer.catalog.state, now_ms)
    wanted = set(names)
    targets = [(t.topic, t.partition, t.log_start_offset) for t in found if t.topic in wanted]
    if targets and not dry_run:
        # the log's own retention, not a client's DeleteRecords: internal topics are no exception
        answers = writer.delete_records(targets, internal_topics_allowed=True)
        for (topic, partition, _), (error, _, message) in zip(targets, answers):
            if error:
                log.warning("retention of %s [%d] failed: %s %s", topic, partition, error.name, message or "")
    if progress is not None:
        progress("retention", len(targets), len(targets))
    return targets


def compact(writer: PartitionWriter, topics: Iterable[str] | None = None, *, dry_run: bool = False,
            progress: ProgressCallback | None = None, now_ms: int | None = None,
            cancel: threading.Event | None = None) -> CompactionSummary:
    """Run one compaction round on ``writer``'s storage root (see the module docstring).

    Args:
        writer: the storage root's partition writer (the embedded broker); it takes the writer
            lease unless ``dry_run``.
        topics: topics to retain, key-compact and merge (all when None). Object cleaning
            always covers the whole root.
        dry_run: plan only: nothing is written, committed or deleted; the summary's "after"
            figures are estimates (merged outputs sized from the inputs; key compaction not
            estimated).
        progress: called as work completes (:data:`ProgressCallback`).
        now_ms: the current time (ms since the epoch; wall clock when None): retention, the
            retirement stamps and the grace of retired objects use it.
        cancel: when set, the round stops after the rewrite in progress (the writer's close).

    Returns:
        A :class:`CompactionSummary`.

    Raises:
        UnknownTopicError: a name in ``topics`` is not a topic.
        ApiError: NOT_LEADER_OR_FOLLOWER when another process holds the writer lease;
            _FENCED when this one lost it.
        CorruptObjectError / ObjectNotFoundError / StorageError: an object could not be
            read or written (what was committed before stays committed).
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if dry_run:
        if not writer.is_writer:
            writer.refresh()
    else:
        writer.ensure_writer()
    summary = CompactionSummary(dry_run=dry_run)
    with round_lock(writer):
        store = writer.store
        names, sizes = measure_before(writer, topics, summary)

        # 1. retention
        targets = apply_retention(writer, names, now, dry_run, progress)
        summary.retention_partitions = len(targets)
        # steps 2 and 3 decode and encode on the round's workers: on leaving, each gives back the
        # pages the round freed (segment_merge.RoundWorkers), then this thread does
        with RoundWorkers() as workers:
            # 2. key compaction
            if not dry_run:
                summary.key_compacted_partitions, skipped = key_compaction(writer, names, now, progress, cancel,
                                                                           workers)
                summary.skipped += skipped
            # 3. merge
            with writer.catalog.lock:
                state = writer.catalog.state
                runs = plan_merges(state, names, sizes)
                planned = _segments(state, names)
            total = sum(r.size_bytes for r in runs if not r.drop)
            done = 0
            if dry_run:
                summary.merges = len(runs)
                for topic, partition, start in targets:
                    planned[(topic, partition)] = [s for s in planned[(topic, partition)] if s.last_offset >= start]
                _estimate_merges(planned, runs, sizes)
                if progress is not None and runs:
                    progress("merge", total, total)
            else:
                # the merge streams (segment_merge.rewrite_runs): a batch's objects are read once for
                # all its runs, a few at a time, and each run holds one row group in progress
                merge_reader = LogReader(writer.catalog, SegmentCache(0))
                for batch in in_batches(runs, lambda run: run.size_bytes, writer.config.compaction_batch_bytes):
                    if cancel is not None and cancel.is_set():
                        break
                    try:
                        rewrites = rewrite_runs(merge_reader, batch, compression=writer.config.compression,
                                                max_row_group_rows=writer.config.row_group_rows, now_ms=now,
                                                cancel=cancel, workers=workers)
                    except MergeCancelled:
                        break
                    for i, (run, rewrite) in enumerate(zip(batch, rewrites)):
                        try:
                            outcome = commit_rewrite(merge_reader.store, writer.commit_under_lock, rewrite, now)
                        except BaseException:
                            for later in rewrites[i + 1:]:  # never committed: nothing will name them
                                discard_rewrite(merge_reader.store, later)
                            raise
                        if outcome is None:
                            summary.skipped += 1
                        else:
                            summary.merges += 1
                            for s in outcome.segments:
                                sizes[s.path] = s.size_bytes
                        if not run.drop:
                            done += run.size_bytes
                            if progress is not None:
                                progress("merge", done, total)
        if runs or summary.key_compacted_partitions:
            release_unused_memory()
        if progress is not None and not runs:
            progress("merge", 0, 0)
        # 4. object cleaning (not when the writer is closing)
        if cancel is None or not cancel.is_set():
            cleanup: ObjectCleanup = clean_objects(
                store, writer.catalog, writer.commit_under_lock, delete_delay_ms=writer.config.file_delete_delay_ms,
                orphan_grace_ms=writer.config.orphan_grace_ms, orphan_prefixes=[DATA_PREFIX, SNAPSHOT_PREFIX],
                now_ms=now, dry_run=dry_run,
                table_guard=lambda: tables_name(store, now, writer.config.file_delete_delay_ms))
            summary.deleted_objects = len(cleanup.deleted)
            if not dry_run:  # the Delta tables' maintenance (docs/tables.md "Cleaning up")
                drop_deleted_tables(store, lambda: writer.catalog.state, now, writer.config.file_delete_delay_ms)
                checkpoint_tables(store, now, writer.config.file_delete_delay_ms)
                clean_dv_files(store, now, writer.config.file_delete_delay_ms)
                clean_table_logs(store, now, writer.config.catalog_retention_ms)
            summary.orphans_deleted = len(cleanup.orphans)
            summary.pending_deletion = len(cleanup.pending)
            log_cleanup = clean_catalog_log(writer.catalog, writer.config.catalog_retention_ms, now, dry_run, cancel)
            summary.catalog_commits_deleted = len(log_cleanup.commits)
            summary.catalog_checkpoints_deleted = len(log_cleanup.checkpoints)
        if progress is not None:
            progress("cleaning", 1, 1)
        measure_after(writer, names, sizes, summary, planned if dry_run else None)
    return summary


def _merge_run(writer: PartitionWriter, reader: LogReader, run: MergeRun, now_ms: int,
               cancel: threading.Event | None, row_filter: RowFilter | None = None) -> SegmentRewrite | None | bool:
    """Rewrite one run through ``row_filter`` (:func:`~txlake.engine.segment_merge.replace_segments`)
    and unpin its segments from ``reader``'s batch cache. Returns the committed rewrite, None
    when its segments changed meanwhile, False when ``cancel`` was set before it started."""
    if cancel is not None and cancel.is_set():
        return False
    try:
        return replace_segments(reader, writer.commit_under_lock, run.segments, target_bytes=run.target_bytes,
                                row_filter=row_filter, compression=writer.config.compression,
                                max_row_group_rows=writer.config.row_group_rows, now_ms=now_ms, drop=run.drop)
    finally:
        for s in run.segments:  # memory: a batch's records go as its runs are written
            reader.cache.discard((s.path, s.row_group_start))


def _estimate_merges(planned: dict[tuple[str, int], list[SegmentInfo]], runs: list[MergeRun],
                     sizes: dict[str, int]) -> None:
    """Dry run: replace each run's segments in ``planned`` by the segments it would produce
    (``ceil(bytes / segment.bytes)`` objects of equal share; sizes entered in ``sizes``)."""
    for i, run in enumerate(runs):
        key = (run.topic, run.partition)
        gone = set(run.segments)
        segs = [s for s in planned.get(key, []) if s not in gone]
        if not run.drop:
            n = max(1, math.ceil(run.size_bytes / max(run.target_bytes, 1)))
            for j in range(n):
                path = f"(planned {i}.{j})"
                size = run.size_bytes // n
                sizes[path] = size
                records = run.record_count // n + (j < run.record_count % n)
                base = run.segments[0].base_offset + j
                segs.append(SegmentInfo(run.topic, run.partition, path, base, base, records, size, 0, 0, 0, 1))
        planned[key] = segs


class CompactionThread:
    """The writer's background compaction: a round every ``interval_ms`` (Kafka's cleaner and
    retention threads in one). Started when the broker becomes the writer, stopped by its
    close; it ends by itself when the process stops being the writer.

    Args:
        writer: the partition writer of the storage root (the broker that holds the lease).
        interval_ms: time between rounds (ms), from the end of one to the start of the next.
    """

    def __init__(self, writer: PartitionWriter, interval_ms: int):
        assert interval_ms > 0
        self.writer = writer
        self.interval_ms = interval_ms
        self.stopped = threading.Event()
        self.rounds = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (daemon, named ``txlake-compaction``)."""
        self._thread = threading.Thread(target=self._loop, name="txlake-compaction", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the thread to stop (after the rewrite in progress) and wait for it."""
        self.stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval_ms / 1000):
            if not self.writer.is_writer:
                return
            try:
                summary = compact(self.writer, cancel=self.stopped)
                self.rounds += 1
                if summary.merges or summary.deleted_objects or summary.retention_partitions:
                    log.info("compaction of %s: %d merges, objects %d -> %d, %d retired objects deleted",
                             self.writer.store.url, summary.merges, summary.objects_before, summary.objects_after,
                             summary.deleted_objects)
            except Exception as exc:  # one bad round must not end the job
                log.warning("compaction of %s failed: %s", self.writer.store.url, exc)
