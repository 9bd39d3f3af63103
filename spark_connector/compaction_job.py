"""Compaction as a Spark job: :func:`compact_with_spark`, the engine's round with the rewrites
spread over Spark tasks.

For topics too large for one machine. The result is the one ``engine.compaction.compact``
gives on the same log at the same time (``now_ms``): the same records (every column), the
same segment layout (offset ranges, record counts), the same offsets; only object names
differ. The engine does the deciding and the rewriting; this module only moves the work:

* **Driver** (the calling process) plans what the engine plans, with the engine's own
  functions, phase by phase on the catalog state the previous phase left:

  1. retention -- the engine's retention step (``retention_targets`` + DeleteRecords);
  2. key compaction -- one Spark task per partition of every topic whose ``cleanup.policy``
     includes ``compact``;
  3. small-file merge -- :func:`~txlake.engine.segment_merge.plan_merges` (with the object
     sizes listed at the start of the round, as the engine does); one Spark task per
     merge run (runs that only drop segments below the log start offset read nothing and
     are built on the driver).

  Object cleaning (step 4 of the engine's round) is NOT done: the Spark job deletes
  nothing. The objects its swaps retire go through the normal grace-period deletion
  (``storage.file.delete.delay.ms``, engine/object_cleaner.py) at the writer's next round.
* **Tasks** (Spark's Python workers) get one partition's snapshot (a one-partition
  :class:`~txlake.catalog.state.CatalogState`) and rewrite its segments through the engine:
  key compaction runs :func:`txlake.engine.compaction.key_compaction` itself (the
  ``row_filter`` seam of engine/log_cleaner.py, its cleanable-segment rule, its grouping
  by ``segment.bytes``), a merge run runs :func:`~txlake.engine.segment_merge.replace_segments`
  (i.e. :func:`~txlake.engine.segment_merge.rewrite_segments`). Both are given a
  :class:`RecordingCommitter` in place of the writer's commit: it evaluates the swap the
  engine asks for against the snapshot and keeps the rewrite instead of committing it. A
  task returns its :class:`~txlake.engine.segment_merge.SegmentRewrite` s: the new
  objects are written, nothing is committed, and they are plain picklable data.
* **Commit** (driver): each rewrite is swapped in with
  :func:`~txlake.engine.segment_merge.swap_actions`, ONE catalog commit per rewrite in the
  engine's order (as ``compact`` does: the same retirement stamps), by
  :func:`commit_rewrites`. A rewrite whose segments changed meanwhile (DeleteRecords, a
  deleted topic, the writer's own compaction) is refused (``StaleRewriteError``) and its
  objects are deleted at once. Who commits:

  - if this process can take the writer lease, it does, through ``Broker.commit_under_lock``
    (it stays the writer until the job ends, as ``txlake compact`` does);
  - if another live process holds it, each phase's commits are **handed over** to that
    process (engine/handoff.py, kind :data:`HANDOFF_KIND`, registered in
    txlake/handoff_handlers.py): it runs :func:`run_handed_over` -- the same
    :func:`commit_rewrites` on its own engine -- and answers which rewrites it committed.
    The holder needs no pyspark for this. If it does not take a request within
    ``storage.handoff.timeout.ms`` this process tries the lease once more, and otherwise
    fails with ``WriterLeaseUnavailable`` (the new objects of the phase are deleted;
    nothing of it was committed).

Failures: a task that fails deletes the objects it wrote; a killed task attempt, a losing
speculative attempt, or a job that fails after some tasks finished leaves objects nothing
ever named -- orphans, deleted by the writer's orphan cleaner after
``storage.orphan.grace.ms`` (1 hour), exactly like a crashed local compaction. A crash of the
driver leaves the log as before or as after each swap (the engine's guarantee, per swap).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Iterable, Mapping, Sequence

from txlake.catalog.state import (ADD_SEGMENT, REMOVE_SEGMENT, CatalogState, PartitionState, SegmentInfo,
                                  TopicState)
from txlake.catalog.storage import ObjectStore
from txlake.catalog.topic_config import effective_config
from txlake.engine.compaction import (CompactionSummary, ProgressCallback, apply_retention, compact, key_compaction,
                                      measure_after, measure_before, round_lock)
from txlake.engine.log_cleaner import is_compacted
from txlake.engine.log_reader import LogReader, SegmentCache
from txlake.engine.object_cleaner import Committer
from txlake.engine.segment_merge import (MergeRun, SegmentRewrite, StaleRewriteError, discard_rewrite, plan_merges,
                                         replace_segments, swap_actions)

log = logging.getLogger(__name__)

__all__ = ["HANDOFF_KIND", "HANDOFF_BATCH", "HandedOverCompactionError", "RecordingCommitter", "RewriteTask",
           "commit_rewrites", "compact_with_spark", "rewrite_from_dict", "rewrite_to_dict", "run_handed_over",
           "run_rewrite_task"]

#: the hand-over kind the writer-lease holder runs (registered in txlake/handoff_handlers.py)
HANDOFF_KIND = "spark.compaction_swap"
#: at most this many rewrites per handed-over request (each is one catalog commit at the holder,
#: which must answer within ``storage.handoff.timeout.ms``)
HANDOFF_BATCH = 200


class HandedOverCompactionError(RuntimeError):
    """The writer-lease holder ran handed-over compaction commits and one failed (e.g. it lost
    the lease): the swaps before it are committed, the objects of the one in flight are left to
    the orphan cleaner, those of the rest were deleted."""


# ---------------------------------------------------------------------------- rewrites as data
def rewrite_to_dict(rewrite: SegmentRewrite) -> dict[str, Any]:
    """A :class:`SegmentRewrite` as JSON-able data (segments as dicts of their fields)."""
    run = rewrite.run
    return {"topic": run.topic, "partition": run.partition, "target_bytes": run.target_bytes, "drop": run.drop,
            "old": [asdict(s) for s in run.segments], "new": [asdict(s) for s in rewrite.segments],
            "records_in": rewrite.records_in, "records_out": rewrite.records_out,
            "bytes_in": rewrite.bytes_in, "bytes_out": rewrite.bytes_out}


def rewrite_from_dict(data: Mapping[str, Any]) -> SegmentRewrite:
    """The inverse of :func:`rewrite_to_dict`.

    Raises:
        KeyError / TypeError: ``data`` is not what :func:`rewrite_to_dict` makes.
    """
    run = MergeRun(data["topic"], int(data["partition"]), tuple(SegmentInfo(**s) for s in data["old"]),
                   int(data["target_bytes"]), bool(data["drop"]))
    return SegmentRewrite(run, [SegmentInfo(**s) for s in data["new"]], int(data["records_in"]),
                          int(data["records_out"]), int(data["bytes_in"]), int(data["bytes_out"]))


def _rewrite_of_swap(state: CatalogState, actions: Sequence[Mapping[str, Any]]) -> SegmentRewrite:
    """The rewrite a swap commit of :func:`swap_actions` (evaluated on ``state``) swaps in:
    the removed segments (as ``state`` names them) and the added ones."""
    removed = [a for a in actions if a["action"] == REMOVE_SEGMENT]
    added = [SegmentInfo(**{f.name: a[f.name] for f in fields(SegmentInfo)})
             for a in actions if a["action"] == ADD_SEGMENT]
    topic, partition = removed[0]["topic"], removed[0]["partition"]
    named = {(s.path, s.base_offset): s for s in state.partition(topic, partition).segments}
    old = tuple(named[(a["path"], a["base_offset"])] for a in removed)
    target = int(effective_config(state.topics[topic].config)["segment.bytes"])
    return SegmentRewrite(MergeRun(topic, partition, old, target), added, sum(s.record_count for s in old),
                          sum(s.record_count for s in added), sum(s.size_bytes for s in old),
                          sum(s.size_bytes for s in added))


class RecordingCommitter:
    """A :data:`~txlake.engine.object_cleaner.Committer` that commits nothing: each swap the
    engine asks for (``build(state) -> actions``) is evaluated on a snapshot -- so a rewrite that
    does not fit it is refused with ``StaleRewriteError`` as a real commit would -- and the
    rewrite it would swap in is kept in :attr:`rewrites` (in call order).

    Args:
        state: the snapshot the rewrites were planned on (the task's one-partition state).
    """

    def __init__(self, state: CatalogState):
        self.state = state
        self.rewrites: list[SegmentRewrite] = []

    def __call__(self, build: Callable[[CatalogState], "list[dict[str, Any]] | None"]) -> None:
        actions = build(self.state)
        if actions:
            self.rewrites.append(_rewrite_of_swap(self.state, actions))
        return None


# ---------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class RewriteTask:
    """One Spark task: rewrite segments of one partition (picklable; runs anywhere).

    Attributes:
        store: the storage root (its fsspec options travel with it).
        state: a snapshot holding only this partition (the other partitions of the topic empty).
        topic / partition: the partition.
        run: the merge run to rewrite, or None for key compaction of the partition.
        now_ms: the round's time (ms since the epoch): key compaction's delete horizons and
            the new objects' names.
        compression / row_group_rows: Parquet codec and most rows per row group of the new objects.
        batch_bytes: the engine's ``storage.compaction.batch.bytes`` (a task reads one partition,
            so this only bounds what key compaction decodes at once).
    """

    store: ObjectStore
    state: CatalogState
    topic: str
    partition: int
    run: MergeRun | None
    now_ms: int
    compression: str
    row_group_rows: int
    batch_bytes: int

    @property
    def size_bytes(self) -> int:
        """Bytes of the segments the task may read (catalog sizes)."""
        if self.run is not None:
            return self.run.size_bytes
        return self.state.partition(self.topic, self.partition).size_bytes()


class _SnapshotCatalog:
    """What the engine's readers and ``key_compaction`` use of a catalog: a store, a lock, a state."""

    def __init__(self, store: ObjectStore, state: CatalogState):
        import threading

        self.store = store
        self.state = state
        self.lock = threading.RLock()


class _SnapshotWriter:
    """What ``engine.compaction.key_compaction`` uses of a broker, over a snapshot, with a
    :class:`RecordingCommitter` as its commit."""

    def __init__(self, catalog: _SnapshotCatalog, commit: RecordingCommitter, task: RewriteTask):
        from types import SimpleNamespace

        self.catalog = catalog
        self.commit_under_lock = commit
        self.config = SimpleNamespace(compression=task.compression, row_group_rows=task.row_group_rows,
                                      compaction_batch_bytes=task.batch_bytes)


def run_rewrite_task(task: RewriteTask) -> list[SegmentRewrite]:
    """Run one task (on an executor): write the new segment objects, commit nothing.

    Key compaction (``task.run`` None) is ``engine.compaction.key_compaction`` over the
    partition's snapshot; a merge run is ``engine.segment_merge.replace_segments`` (a drop
    run reads and writes nothing). Both commit through a :class:`RecordingCommitter`.

    Returns:
        The rewrites, in the order the engine would commit them (empty when key compaction
        finds nothing worth cleaning).

    Raises:
        CorruptObjectError / ObjectNotFoundError / StorageError: a segment could not be read
            or an object written; the objects this task wrote are deleted first.
    """
    catalog = _SnapshotCatalog(task.store, task.state)
    reader = LogReader(catalog, SegmentCache(0))  # every segment is read once
    recorder = RecordingCommitter(task.state)
    try:
        if task.run is None:
            key_compaction(_SnapshotWriter(catalog, recorder, task), [task.topic], task.now_ms, None, None)
            return recorder.rewrites
        run = task.run
        rewrite = replace_segments(reader, recorder, run.segments, target_bytes=run.target_bytes,
                                   compression=task.compression, max_row_group_rows=task.row_group_rows,
                                   now_ms=task.now_ms, drop=run.drop)
        assert rewrite is not None, "a snapshot refuses none of its own segments"
        return [rewrite]
    except BaseException:
        for rewrite in recorder.rewrites:
            discard_rewrite(task.store, rewrite)
        raise


def _one_partition(state: CatalogState, topic: str, partition: int) -> CatalogState:
    """A snapshot of ``state`` holding only ``topic [partition]`` (copied; the topic's other
    partitions are empty, so partition numbers stay valid)."""
    t = state.topics[topic]
    p = t.partitions[partition]
    parts = [PartitionState(topic, i) for i in range(len(t.partitions))]
    parts[partition] = PartitionState(topic, partition, p.log_start_offset, p.high_watermark, p.last_stable_offset,
                                      list(p.segments), list(p.aborted_transactions))
    return CatalogState(version=state.version, topics={topic: TopicState(t.name, t.topic_id, dict(t.config), parts)})


def _run_indexed(item: tuple[int, RewriteTask]) -> tuple[int, list[SegmentRewrite]]:
    return item[0], run_rewrite_task(item[1])


def _run_tasks(spark, tasks: list[RewriteTask], description: str) -> list[list[SegmentRewrite]]:
    """Run ``tasks`` as one Spark job, one Spark partition each, the largest scheduled first;
    returns each task's rewrites in the order of ``tasks``."""
    if not tasks:
        return []
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i].size_bytes)
    sc = spark.sparkContext
    sc.setJobDescription(description)
    try:
        results = (sc.parallelize([(i, tasks[i]) for i in order], len(tasks))
                   .map(_run_indexed)
                   .collect())
    finally:
        sc.setJobDescription(None)
    out: list[list[SegmentRewrite]] = [[] for _ in tasks]
    for i, rewrites in results:
        out[i] = rewrites
    return out


# ---------------------------------------------------------------------------- commit
def commit_rewrites(commit: Committer, store: ObjectStore, rewrites: Sequence[SegmentRewrite],
                    now_ms: int) -> list[bool]:
    """Swap each rewrite in with its own catalog commit (:func:`swap_actions` computed under the
    writer's commit lock from the state at that moment; retired objects stamped ``now_ms``), in order.

    Args:
        commit: the writer's commit (``Broker.commit_under_lock``).
        store: where the rewrites' new objects are (stale ones are deleted there).
        rewrites: written, uncommitted rewrites.
        now_ms: the retirement stamp of the replaced objects (ms since the epoch).

    Returns:
        Per rewrite: True when committed, False when refused as stale (its segments changed
        since the rewrite was planned; its new objects were deleted).

    Raises:
        ApiError: _FENCED / NOT_LEADER_OR_FOLLOWER / _STATE from ``commit``; the objects of the
            rewrites not yet tried are deleted, those of the one in flight stay for the orphan
            cleaner (whether its commit landed is not known).
    """
    out: list[bool] = []
    for i, rewrite in enumerate(rewrites):
        try:
            commit(lambda state, rw=rewrite: swap_actions(state, rw, now_ms))
        except StaleRewriteError as exc:
            log.info("compaction rewrite not committed: %s", exc)
            discard_rewrite(store, rewrite)
            out.append(False)
            continue
        except BaseException:
            for later in rewrites[i + 1:]:
                discard_rewrite(store, later)
            raise
        out.append(True)
    return out


def run_handed_over(store: ObjectStore, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The writer-lease holder's side of a handed-over compaction step (engine/handoff.py
    handler, kind :data:`HANDOFF_KIND`), run on the holder's own engine of ``store``.

    Payloads (JSON): ``{"op": "retention", "topics": [...], "now_ms": n}`` applies the engine's
    retention to those topics and answers ``{"targets": [[topic, partition, log start], ...]}``;
    ``{"op": "swap", "rewrites": [rewrite_to_dict(...), ...], "now_ms": n}`` runs
    :func:`commit_rewrites` and answers ``{"committed": [bool, ...]}``.

    Raises:
        ValueError: an unknown ``op``.
        ApiError: this process cannot commit (it lost the lease meanwhile).
    """
    from txlake.engine.registry import acquire_broker, release_broker

    broker = acquire_broker(store.url, dict(store.storage_options))  # the holder's own open engine
    try:
        op, now = payload.get("op"), int(payload["now_ms"])
        if op == "retention":
            return {"targets": [list(t) for t in apply_retention(broker, list(payload["topics"]), now, False, None)]}
        if op == "swap":
            rewrites = [rewrite_from_dict(d) for d in payload["rewrites"]]
            return {"committed": commit_rewrites(broker.commit_under_lock, broker.store, rewrites, now)}
        raise ValueError(f"unknown compaction hand-over op {op!r}")
    finally:
        release_broker(broker)


class _Writer:
    """How the driver commits: here (this process holds the writer lease) or handed over to
    the process that holds it. Both read the catalog through this process's engine."""

    def __init__(self, broker, handoff_timeout_ms: int):
        from txlake.engine.errors import ApiError, Errors

        self.broker = broker
        self.timeout_s = handoff_timeout_ms / 1000
        try:
            broker.ensure_writer()
            self.local = True
        except ApiError as exc:
            if exc.error != Errors.NOT_LEADER_OR_FOLLOWER:
                raise
            self.local = False
            log.info("compaction of %s: another process is the writer; its commits are handed over to it",
                     broker.store.url)

    def refresh(self) -> None:
        """Make the engine's catalog state current (commits of the holder included)."""
        if not self.local:
            self.broker.refresh()

    def retention(self, names: list[str], now_ms: int) -> list[tuple[str, int, int]]:
        if self.local:
            return apply_retention(self.broker, names, now_ms, False, None)
        answer = self._hand_over({"op": "retention", "topics": names, "now_ms": now_ms}, [])
        if answer is None:  # took the lease meanwhile
            return self.retention(names, now_ms)
        return [tuple(t) for t in answer["targets"]]

    def swap(self, rewrites: list[SegmentRewrite], now_ms: int) -> list[bool]:
        out: list[bool] = []
        start = 0
        while start < len(rewrites):
            if self.local:
                return out + commit_rewrites(self.broker.commit_under_lock, self.broker.store, rewrites[start:], now_ms)
            batch = rewrites[start:start + HANDOFF_BATCH]
            try:
                answer = self._hand_over({"op": "swap", "rewrites": [rewrite_to_dict(r) for r in batch],
                                          "now_ms": now_ms}, rewrites[start:])
            except HandedOverCompactionError:
                for later in rewrites[start + len(batch):]:  # never sent
                    discard_rewrite(self.broker.store, later)
                raise
            if answer is not None:  # else this process took the lease: the loop commits the rest here
                out += [bool(x) for x in answer["committed"]]
                start += len(batch)
        return out

    def _hand_over(self, payload: dict[str, Any], pending: Sequence[SegmentRewrite]) -> dict[str, Any] | None:
        """Hand ``payload`` to the lease holder; None when it did not take it but this process
        could take the lease after all (the caller then does the work here)."""
        from txlake.catalog.catalog import Catalog
        from txlake.catalog.writer_lease import WriterLease
        from txlake.engine.errors import ApiError
        from txlake.engine.handoff import HandoffCancelled, HandoffError, submit

        from .staged_commit import WriterLeaseUnavailable

        store = self.broker.store
        try:
            return submit(store, HANDOFF_KIND, payload, self.timeout_s)
        except HandoffError as exc:
            raise HandedOverCompactionError(
                f"txlake: the writer-lease holder of {store.url} ran this compaction's {payload['op']} commit and "
                f"it failed: {exc}") from None
        except HandoffCancelled:
            pass  # never ran: try the lease here once more
        try:
            self.broker.ensure_writer()
        except ApiError as exc:
            for rewrite in pending:
                discard_rewrite(store, rewrite)
            holder, expires_in = WriterLease(Catalog.open(store)).describe_holder()
            raise WriterLeaseUnavailable(
                f"txlake: cannot commit the Spark compaction of {store.url}: the storage root's writer lease is held "
                f"by {holder}, which did not take the handed-over commit within {self.timeout_s:g} s "
                "(storage.handoff.timeout.ms; its engine may be busy or a txlake without hand-over). What was still to "
                "commit was not committed, and its new objects were deleted. What to do: run the compaction in that "
                "process (or let its background compaction do it), or close its txlake clients so it releases the "
                f"lease, then run it again. ({exc.message})", store.url, holder, expires_in) from None
        self.local = True
        return None


# ---------------------------------------------------------------------------- the job
def compact_with_spark(spark, storage_url: str, storage_options: Mapping[str, Any] | None = None,
                       topics: Iterable[str] | None = None, *, config: Mapping[str, Any] | None = None,
                       dry_run: bool = False, progress: ProgressCallback | None = None,
                       now_ms: int | None = None) -> CompactionSummary:
    """One compaction round of ``storage_url`` with the segment rewrites run as Spark tasks
    (see the module docstring): the same result as ``engine.compaction.compact``.

    Args:
        spark: a SparkSession with a SparkContext (classic, not Spark Connect); its Python
            workers must import this txlake (``PYSPARK_PYTHON``, docs/spark.md) and reach the
            storage root.
        storage_url: the storage root (``file://`` or ``s3://`` ...; not ``memory://``, which
            Spark's workers cannot see).
        storage_options: its fsspec options (sent to the tasks, which write the new objects).
        topics: topics to retain, key-compact and merge (all when None).
        config: other txlake client settings of this process's engine (``storage.lease.ms``,
            ``storage.handoff.timeout.ms``, ``storage.file.delete.delay.ms``, ...).
        dry_run: plan only, as ``compact(dry_run=True)`` (no Spark job runs).
        progress: ``progress(phase, done, total)`` as for ``compact``: "retention" (partitions),
            "key compaction" and "merge" (bytes of input segments), each reported when its
            Spark job and commits are done.
        now_ms: the round's time (ms since the epoch; wall clock when None): retention, key
            compaction's delete horizons and the retirement stamps.

    Returns:
        A :class:`~txlake.engine.compaction.CompactionSummary` as ``compact`` gives, except
        ``deleted_objects`` and ``orphans_deleted`` (always 0: nothing is deleted here) and
        ``pending_deletion`` (every retired object still in the catalog).

    Raises:
        UnknownTopicError: a name in ``topics`` is not a topic.
        ValueError: a ``memory://`` root.
        KafkaException: an invalid ``config`` key or value.
        WriterLeaseUnavailable: another process holds the writer lease and did not take the
            handed-over commits (the message names it and says what to do).
        HandedOverCompactionError: the holder took them and failed.
        ApiError: _FENCED when this process lost the lease during the job.
        Py4JJavaError / PythonException: a Spark task failed (a segment unreadable, an object
            not writable); nothing of that phase was committed.
    """
    from txlake.config import parse_config
    from txlake.engine.registry import acquire_broker, release_broker

    conf = {"storage.compaction.interval.ms": 0, **(config or {}), "storage.url": storage_url,
            "storage.options": dict(storage_options or {})}
    cfg = parse_config(conf, "admin")
    if ObjectStore(cfg.storage_url, cfg.storage_options).protocol == "memory":
        raise ValueError(f"{storage_url}: a memory:// root exists inside one process only; Spark's workers cannot "
                         "read or write it (use file:// or s3://, or compact it with engine.compaction.compact)")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    broker = acquire_broker(cfg.storage_url, cfg.storage_options, cfg.broker_config())
    try:
        if dry_run:
            return compact(broker, topics, dry_run=True, progress=progress, now_ms=now)
        writer = _Writer(broker, cfg["storage.handoff.timeout.ms"])
        with round_lock(broker):
            return _round(spark, writer, topics, now, progress)
    finally:
        release_broker(broker)


def _round(spark, writer: _Writer, topics: Iterable[str] | None, now: int,
           progress: ProgressCallback | None) -> CompactionSummary:
    broker = writer.broker
    store, bcfg = broker.store, broker.config
    summary = CompactionSummary()
    writer.refresh()
    names, sizes = measure_before(broker, topics, summary)

    def task(state: CatalogState, topic: str, partition: int, run: MergeRun | None) -> RewriteTask:
        return RewriteTask(store, _one_partition(state, topic, partition), topic, partition, run, now,
                           bcfg.compression, bcfg.row_group_rows, bcfg.compaction_batch_bytes)

    # 1. retention
    summary.retention_partitions = len(writer.retention(names, now))
    if progress is not None:
        progress("retention", summary.retention_partitions, summary.retention_partitions)

    # 2. key compaction: one task per partition of the compacted topics
    writer.refresh()
    with broker.catalog.lock:
        state = broker.catalog.state
        tasks = [task(state, name, p.partition, None) for name in names
                 if is_compacted(state.topics[name].config) for p in state.topics[name].partitions]
    rewrites = [rw for rws in _run_tasks(spark, tasks, f"txlake compaction of {store.url}: key compaction of "
                                                       f"{len(tasks)} partitions") for rw in rws]
    committed = writer.swap(rewrites, now) if rewrites else []
    summary.key_compacted_partitions = len({(rw.run.topic, rw.run.partition)
                                            for rw, ok in zip(rewrites, committed) if ok})
    summary.skipped += committed.count(False)
    if progress is not None:
        total = sum(rw.bytes_in for rw in rewrites)
        progress("key compaction", total, total)

    # 3. merge: the engine's plan on the state key compaction left, with the sizes listed at the start
    writer.refresh()
    with broker.catalog.lock:
        state = broker.catalog.state
        runs = plan_merges(state, names, sizes)
        tasks = [task(state, run.topic, run.partition, run) for run in runs]
    reads = [i for i, run in enumerate(runs) if not run.drop]
    done = _run_tasks(spark, [tasks[i] for i in reads],
                      f"txlake compaction of {store.url}: {len(reads)} segment merges")
    per_run: list[list[SegmentRewrite]] = [[] for _ in runs]
    for i, rws in zip(reads, done):
        per_run[i] = rws
    for i, run in enumerate(runs):
        if run.drop:  # nothing to read or write: built here
            per_run[i] = run_rewrite_task(tasks[i])
    rewrites = [rw for rws in per_run for rw in rws]
    committed = writer.swap(rewrites, now) if rewrites else []
    summary.merges = committed.count(True)
    summary.skipped += committed.count(False)
    for rw, ok in zip(rewrites, committed):
        if ok:
            sizes.update((s.path, s.size_bytes) for s in rw.segments)
    if progress is not None:
        total = sum(r.size_bytes for r in runs if not r.drop)
        progress("merge", total, total)

    writer.refresh()
    with broker.catalog.lock:
        summary.pending_deletion = len(broker.catalog.state.retired)
    measure_after(broker, names, sizes, summary)
    return summary
