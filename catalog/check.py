"""Checking and repairing the catalog log: ``txlake catalog check`` and ``txlake catalog repair``.

:func:`check_catalog` reads the whole log as it is on storage -- one listing of the commits
and of the checkpoints, every object decoded -- and says what a reader would make of it:
the head (newest number), the checkpoints, the commits present, every *gap* (a missing
commit number with a commit or checkpoint past it, :class:`~.errors.CatalogGapError`),
every unreadable commit or checkpoint, and whether the state it loads names objects that
are gone. Commits deleted by the log cleanup below the checkpoint readers start from are
reported as cleaned up, not as a gap; a gap below that checkpoint is *covered* (readers
never need it) and only warned about.

:func:`plan_repair` / :func:`repair_catalog` close the gaps readers stop at. What a lost
commit held cannot be known in general, so the repair never guesses silently; it

* restores what the rest of the log proves was there: records of a partition whose next
  append starts past the high watermark the log had before the gap were written by the lost
  commit, and if exactly one object no commit names holds exactly those offsets of that
  partition (a flush's data object outlives its commit), its ``add_segment`` is rebuilt,
  with the aborted-transaction index entry of each ABORT marker among them;
* lists every offset range nothing could be found for, as lost;
* writes, only when the operator accepts that loss (``accept_loss``), a commit at each
  missing number holding a ``lost_commit`` marker (JSON: what was restored, what is lost,
  when, by whom), the rebuilt segments, and a producer-id block that skips the block the
  lost commit may have handed out (so no producer id is given twice). Later commits then
  replay again;
* refuses when a later commit cannot be replayed without the lost one (e.g. it writes to a
  topic the lost commit created), or when a commit after the start is unreadable: then
  only a backup can help, and the message says which object to restore.

Records at the very end of a partition (its last append was the lost commit) leave no trace
in the log; an object no commit names that holds records past a partition's high watermark
is reported, never restored: it may as well be a flush that never committed (a crash
between its PUT and its commit), whose records were never acknowledged.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from txlake.formats.catalog_actions import CHECKPOINT_KIND, COMMIT_KIND, decode_actions, encode_actions
from txlake.formats.errors import FormatError
from txlake.formats.records import CONTROL_ABORT, open_segment

from .catalog import (CHECKPOINTS_PREFIX, COMMITS_PREFIX, Catalog, _reader_pool, checkpoint_key, commit_key,
                      version_of)
from .errors import CatalogError
from .state import ADD_SEGMENT, LOST_COMMIT, PRODUCER_ID_BLOCK, AbortedTxn, CatalogState, SegmentInfo
from .storage import ObjectStore

log = logging.getLogger(__name__)

#: missing keys ``check`` prints per gap (then how many more, and the last one)
MAX_KEYS_SHOWN = 20

__all__ = ["CatalogReport", "Gap", "RepairPlan", "Restored", "Lost", "check_catalog", "plan_repair",
           "repair_catalog", "describe_report", "describe_plan"]


@dataclass
class Gap:
    """Missing commit numbers ``first..last`` (inclusive) with a commit or checkpoint past them.

    Attributes:
        evidence: key of the first object past the gap.
        covered_by: the readable checkpoint readers start from when it lies at or past ``last``
            (the gap is then harmless to them); None when readers stop at the gap.
    """

    first: int
    last: int
    evidence: str
    covered_by: int | None = None

    @property
    def keys(self) -> list[str]:
        """The object keys of the missing commits (``_catalog/commits/<20 digits>.parquet``)."""
        return [commit_key(n) for n in range(self.first, self.last + 1)]

    @property
    def open(self) -> bool:
        """True when readers stop at this gap (no readable checkpoint at or past it)."""
        return self.covered_by is None


@dataclass
class CatalogReport:
    """What :func:`check_catalog` found.

    Attributes:
        url: the storage root.
        head: the newest commit or checkpoint number (0: an empty catalog).
        checkpoints: versions of the checkpoints present, ascending.
        unreadable_checkpoints: version -> the decoding error.
        start: the newest readable checkpoint, where readers start (0: from commit 1).
        commits: versions of the commits present, ascending.
        cleaned_up_to: commits ``1..cleaned_up_to`` were deleted by the log cleanup below a
            readable checkpoint (0: none).
        gaps: every gap, ascending (open and covered).
        unreadable_commits: version -> the decoding error.
        lost_commits: markers written by earlier repairs: version -> their JSON ``info``.
        version: the version a reader loads (None when it cannot load).
        load_error: why a reader cannot load (``Type: message``), else None.
        missing_objects: objects the loaded state names that do not exist (their reads fail).
    """

    url: str
    head: int = 0
    checkpoints: list[int] = field(default_factory=list)
    unreadable_checkpoints: dict[int, str] = field(default_factory=dict)
    start: int = 0
    commits: list[int] = field(default_factory=list)
    cleaned_up_to: int = 0
    gaps: list[Gap] = field(default_factory=list)
    unreadable_commits: dict[int, str] = field(default_factory=dict)
    lost_commits: dict[int, dict] = field(default_factory=dict)
    version: int | None = None
    load_error: str | None = None
    missing_objects: list[str] = field(default_factory=list)
    #: decoded commits (version -> actions) and the start checkpoint's actions, for the repair
    _actions: dict[int, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    _start_actions: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def open_gaps(self) -> list[Gap]:
        """The gaps readers stop at."""
        return [g for g in self.gaps if g.open]

    @property
    def healthy(self) -> bool:
        """True when a reader loads the whole log and every object it names exists (covered
        gaps, skipped unreadable checkpoints and unreadable commits below the start are warnings)."""
        return (self.load_error is None and not self.open_gaps and not self.missing_objects
                and not any(v > self.start for v in self.unreadable_commits))


def _decode(store: ObjectStore, key: str, kind: str) -> tuple[list[dict[str, Any]] | None, str | None]:
    try:
        return decode_actions(store.get(key), kind, store.uri(key)), None
    except (FormatError, FileNotFoundError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


def check_catalog(store: ObjectStore, progress: Callable[[int, int], None] | None = None) -> CatalogReport:
    """Check the catalog log under ``store`` (read only: nothing is written).

    Cost: one listing of the commits, one of the checkpoints, one GET per commit and
    checkpoint (fetched side by side), one :meth:`Catalog.open`, and one listing of each
    folder holding objects the state names.

    Args:
        progress: called as ``progress(done, total)`` while the commits are read.

    Returns:
        A :class:`CatalogReport`; ``healthy`` tells whether readers load everything.

    Raises:
        StorageError: a listing or a read failed for another reason than a missing object.
    """
    report = CatalogReport(store.url)
    report.commits = sorted(v for v in (version_of(o.key) for o in store.list(COMMITS_PREFIX)) if v is not None)
    report.checkpoints = sorted(v for v in (version_of(o.key) for o in store.list(CHECKPOINTS_PREFIX)) if v is not None)
    report.head = max(report.commits[-1:] + report.checkpoints[-1:] + [0])
    readable: dict[int, list[dict[str, Any]]] = {}
    for v in reversed(report.checkpoints):  # newest first: the newest readable one is the start
        actions, error = _decode(store, checkpoint_key(v), CHECKPOINT_KIND)
        if actions is None:
            report.unreadable_checkpoints[v] = error
        elif not readable:
            readable[v] = actions
    if readable:
        report.start, report._start_actions = next(iter(readable.items()))
    total = len(report.commits)
    done = 0
    pool = _reader_pool()
    for v, (actions, error) in zip(report.commits,
                                   pool.map(lambda v: _decode(store, commit_key(v), COMMIT_KIND), report.commits)):
        if actions is None:
            report.unreadable_commits[v] = error
        else:
            if v > report.start:  # what a repair replays (older ones are only checked)
                report._actions[v] = actions
            for a in actions:
                if a["action"] == LOST_COMMIT:
                    report.lost_commits[v] = json.loads(a.get("info") or "{}")
        done += 1
        if progress is not None and (done % 100 == 0 or done == total):
            progress(done, total)
    _find_gaps(report)
    try:
        catalog = Catalog.open(store)
    except (FormatError, CatalogError, FileNotFoundError) as exc:
        report.load_error = f"{type(exc).__name__}: {exc}"
    else:
        report.version = catalog.version
        report.missing_objects = _missing_objects(store, catalog.state)
    return report


def _find_gaps(report: CatalogReport) -> None:
    commits, checkpoints = report.commits, report.checkpoints
    ranges = []
    prev = 0
    for c in commits:
        if c > prev + 1:
            ranges.append((prev + 1, c - 1))
        prev = c
    if report.head > prev:  # past the newest commit, up to a checkpoint
        ranges.append((prev + 1, report.head))
    for first, last in ranges:
        i = bisect.bisect_right(commits, last)
        j = bisect.bisect_left(checkpoints, first)
        later_commit = commits[i] if i < len(commits) else None
        later_checkpoint = checkpoints[j] if j < len(checkpoints) else None
        evidence = commit_key(later_commit) if later_commit is not None and (
            later_checkpoint is None or later_commit <= later_checkpoint) else checkpoint_key(later_checkpoint)
        covered = report.start if report.start >= last else None
        if first == 1 and (covered is not None or last in checkpoints):
            # the log cleanup's doing: it deletes a prefix and keeps the checkpoint just below what it keeps
            # (when that checkpoint is unreadable too, ``load_error`` says so)
            report.cleaned_up_to = last
        else:
            report.gaps.append(Gap(first, last, evidence, covered))


def _missing_objects(store: ObjectStore, state: CatalogState) -> list[str]:
    referenced = state.referenced_paths()
    folders = sorted({p.rpartition("/")[0] + "/" for p in referenced})
    present = {o.key for folder in folders for o in store.list(folder)}
    return sorted(referenced - present)


def describe_report(report: CatalogReport) -> list[str]:
    """The report as the lines ``txlake catalog check`` prints (plain text, one fact a line)."""
    out = [f"Catalog of {report.url}"]
    if report.load_error is None:
        out.append(f"Version: {report.version} (head {report.head})")
    else:
        out.append(f"Version: readers cannot load it (head {report.head})")
    cps = ", ".join(str(v) + (" (unreadable)" if v in report.unreadable_checkpoints else "") for v in report.checkpoints)
    out.append(f"Checkpoints: {cps or 'none'}" + (f"; readers start from {report.start}" if report.start else ""))
    if report.commits:
        out.append(f"Commits: {report.commits[0]}..{report.commits[-1]} ({len(report.commits)} present)"
                   + (f"; 1..{report.cleaned_up_to} cleaned up below a checkpoint" if report.cleaned_up_to else ""))
    else:
        out.append("Commits: none")
    if not report.gaps:
        out.append("Gaps: none")
    for g in report.gaps:
        numbers = f"commit {g.first}" if g.first == g.last else f"commits {g.first}..{g.last}"
        status = (f"covered: readers start from checkpoint {g.covered_by} past it" if not g.open
                  else "readers stop here, writers refuse to commit")
        out.append(f"Gap: {numbers} missing, {store_uri(report.url, g.evidence)} exists past it ({status})")
        shown = range(g.first, min(g.last, g.first + MAX_KEYS_SHOWN - 1) + 1)
        out.extend(f"  missing: {store_uri(report.url, commit_key(n))}" for n in shown)
        if g.last > shown[-1]:
            out.append(f"  missing: ... and {g.last - shown[-1]} more, up to {store_uri(report.url, commit_key(g.last))}")
    for v, error in sorted(report.unreadable_commits.items()):
        out.append(f"Unreadable commit {v}: {error}" + ("" if v > report.start else " (below the start checkpoint)"))
    for v, error in sorted(report.unreadable_checkpoints.items()):
        out.append(f"Unreadable checkpoint {v}: {error}")
    if report.lost_commits:
        infos = report.lost_commits.values()
        restored = sum(len(i.get("restored") or []) for i in infos)
        lost = sum(x["last_offset"] - x["first_offset"] + 1 for i in infos for x in i.get("lost") or [])
        when = sorted({i.get("repaired_at", "?") for i in infos})
        out.append(f"Repaired: commit{'s' if len(report.lost_commits) != 1 else ''} {_ranges(sorted(report.lost_commits))} "
                   f"{'were' if len(report.lost_commits) != 1 else 'was'} lost and marked by `txlake catalog repair` at "
                   f"{', '.join(when)} ({_count(restored, 'segment')} restored, {_count(lost, 'offset')} lost)")
    if report.load_error is not None:
        out.append(f"Load: {report.load_error}")
    for key in report.missing_objects:
        out.append(f"Missing object named by the catalog: {store_uri(report.url, key)}")
    if report.healthy:
        warn = len([g for g in report.gaps if not g.open]) + len(report.unreadable_checkpoints) + len(report.unreadable_commits)
        out.append("Status: healthy" + (f" ({warn} warning{'s' if warn != 1 else ''})" if warn else ""))
    else:
        why = []
        if report.open_gaps:
            n = sum(g.last - g.first + 1 for g in report.open_gaps)
            why.append(f"{n} missing commit{'s' if n != 1 else ''}")
        bad = [v for v in report.unreadable_commits if v > report.start]
        if bad:
            why.append(f"{len(bad)} unreadable commit{'s' if len(bad) != 1 else ''}")
        if report.missing_objects:
            why.append(f"{len(report.missing_objects)} missing object{'s' if len(report.missing_objects) != 1 else ''}")
        if not why:
            why.append("readers cannot load it")
        hint = "; `txlake catalog repair` shows what can be restored" if report.open_gaps else \
            "; restore the objects named above from a backup"
        out.append(f"Status: UNHEALTHY: {', '.join(why)}{hint}")
    return out


def _ranges(numbers: list[int]) -> str:
    """``[5, 6, 7, 9]`` -> ``"5..7, 9"``."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in runs)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def store_uri(url: str, key: str) -> str:
    """``url/key`` (the full URL of an object under the storage root ``url``)."""
    return f"{url}/{key}"


# ---------------------------------------------------------------------------------------- repair
@dataclass
class Restored:
    """A segment rebuilt from an object no commit names: ``topic [partition]`` offsets
    ``base_offset..last_offset`` in ``path``, put back in the marker of commit ``version``.

    For each ABORT marker among the records, the aborted-transaction index entry the lost
    commit held is rebuilt (``aborted``): the producer's records from the offset after its
    previous marker in the partition (or the log start offset) up to the ABORT marker, as
    Kafka's log recovery rebuilds the index from the markers (``ProducerStateManager``)."""

    version: int
    topic: str
    partition: int
    path: str
    base_offset: int
    last_offset: int
    record_count: int
    #: aborted-transaction index entries rebuilt for the ABORT markers among its records
    aborted: list[AbortedTxn] = field(default_factory=list)


@dataclass
class Lost:
    """Offsets ``first_offset..last_offset`` of ``topic [partition]`` that lost commit
    ``version`` wrote and that no object could be found for (``reason`` says why)."""

    version: int
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    reason: str


@dataclass
class RepairPlan:
    """What :func:`plan_repair` found and :func:`repair_catalog` did.

    Attributes:
        report: the check it started from.
        markers: missing commit number -> the actions of the commit the repair writes there.
        restored: segments rebuilt from objects no commit names.
        lost: offset ranges nothing was found for.
        unplaced: objects no commit names that hold records past a partition's high watermark
            (``(key, topic, partition, first offset, last offset)``): not restored, see the module doc.
        refused: why the repair cannot close the gaps (then nothing is written), or None.
        written: versions of the marker commits written (empty for a plan).
        version: the version a reader loads after the repair (None before or when it failed).
    """

    report: CatalogReport
    markers: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    restored: list[Restored] = field(default_factory=list)
    lost: list[Lost] = field(default_factory=list)
    unplaced: list[tuple[str, str, int, int, int]] = field(default_factory=list)
    refused: str | None = None
    written: list[int] = field(default_factory=list)
    version: int | None = None


@dataclass
class _Chunk:
    """The rows of one partition in one object (consecutive row groups)."""

    path: str
    topic: str
    partition: int
    base_offset: int
    last_offset: int
    records: int
    size_bytes: int
    min_timestamp: int
    max_timestamp: int
    row_group_start: int
    row_group_count: int
    #: ``(offset, producer id, control type)`` of its control records (transaction markers)
    controls: list[tuple[int, int, int]]

    def to_segment(self) -> SegmentInfo:
        return SegmentInfo(self.topic, self.partition, self.path, self.base_offset, self.last_offset, self.records,
                           self.size_bytes, self.min_timestamp, self.max_timestamp, self.row_group_start,
                           self.row_group_count)


def _chunks(store: ObjectStore, key: str) -> list[_Chunk]:
    """The partitions' rows in a record object, one :class:`_Chunk` per run of row groups of
    one partition; [] when the object is not a record segment."""
    try:
        with store.open_input(key) as f:
            pf = open_segment(f, store.uri(key))
            out: list[_Chunk] = []
            for rg in range(pf.num_row_groups):
                t = pf.read_row_group(rg, columns=["topic", "partition", "offset", "timestamp", "producer_id",
                                                   "is_control", "control_type"])
                if t.num_rows == 0:
                    continue
                topics, parts = set(t.column("topic").to_pylist()), set(t.column("partition").to_pylist())
                if len(topics) != 1 or len(parts) != 1:
                    return []  # not a layout the writer produces: never guess
                offsets = t.column("offset").to_pylist()
                ts = t.column("timestamp").to_pylist()
                controls = [(o, pid, ct) for o, pid, c, ct in zip(offsets, t.column("producer_id").to_pylist(),
                                                                  t.column("is_control").to_pylist(),
                                                                  t.column("control_type").to_pylist()) if c]
                meta = pf.metadata.row_group(rg)
                size = sum(meta.column(i).total_compressed_size for i in range(meta.num_columns))
                topic, partition = topics.pop(), parts.pop()
                prev = out[-1] if out else None
                if prev is not None and (prev.topic, prev.partition) == (topic, partition) \
                        and prev.row_group_start + prev.row_group_count == rg and prev.last_offset < offsets[0]:
                    prev.last_offset = offsets[-1]
                    prev.records += t.num_rows
                    prev.size_bytes += size
                    prev.min_timestamp, prev.max_timestamp = min(prev.min_timestamp, min(ts)), max(prev.max_timestamp, max(ts))
                    prev.row_group_count += 1
                    prev.controls.extend(controls)
                else:
                    out.append(_Chunk(key, topic, partition, offsets[0], offsets[-1], t.num_rows, size, min(ts), max(ts),
                                      rg, 1, controls))
            return out
    except (FormatError, FileNotFoundError, OSError) as exc:
        log.warning("repair: %s is not a readable record object (%s): not used", store.uri(key), exc)
        return []


def _previous_control(store: ObjectStore, state: CatalogState, topic: str, partition: int, producer_id: int,
                      before: int) -> int | None:
    """The offset of the newest transaction marker of ``producer_id`` below offset ``before`` in
    the segments ``state`` names for ``topic [partition]`` (None when there is none): the end
    of that producer's previous transaction there."""
    from txlake.formats.records import read_segment

    for seg in reversed(state.partition(topic, partition).segments):
        if seg.base_offset >= before:
            continue
        with store.open_input(seg.path) as f:
            t = read_segment(f, store.uri(seg.path), seg.row_groups, ["offset", "producer_id", "is_control"])
        found = [o for o, pid, c in zip(t.column("offset").to_pylist(), t.column("producer_id").to_pylist(),
                                        t.column("is_control").to_pylist()) if c and pid == producer_id and o < before]
        if found:
            return max(found)
    return None


def _replay(report: CatalogReport, markers: dict[int, list[dict[str, Any]]],
            on_gap: Callable[[int, CatalogState], None] | None = None,
            on_append: Callable[[int, dict[str, Any], CatalogState], None] | None = None) -> CatalogState:
    """The start checkpoint + every commit after it, with ``markers`` at the missing numbers.
    ``on_gap(n, state)`` before each missing number, ``on_append(version, action, state)``
    before each ``add_segment`` that appends (starts at or past the high watermark)."""
    state = CatalogState(version=report.start)
    for action in report._start_actions:
        state.apply(action)
    last = report.commits[-1] if report.commits else report.start
    for v in range(report.start + 1, last + 1):
        actions = report._actions.get(v)
        if actions is None:
            if on_gap is not None:
                on_gap(v, state)
            actions = markers.get(v, [])
        for action in actions:
            try:
                if on_append is not None and action["action"] == ADD_SEGMENT:
                    p = state.partition(action["topic"], action["partition"])
                    if action["base_offset"] >= p.high_watermark:
                        on_append(v, action, state)
                state.apply(action)
            except CatalogError as exc:
                raise CatalogError(f"commit {v} cannot be replayed without the lost commit(s): {exc}") from exc
        state.version = v
    return state


def plan_repair(store: ObjectStore, data_prefixes: list[str], producer_id_block_size: int,
                report: CatalogReport | None = None) -> RepairPlan:
    """Work out how to close the gaps readers stop at (read only: nothing is written).

    Args:
        data_prefixes: where record objects live (the engine's flush prefix, ``data/``): the
            objects no commit names are looked for there.
        producer_id_block_size: the engine's producer-id block (Kafka's ProducerIdManager block,
            1000): each marker skips one block.
        report: a fresh :func:`check_catalog` of ``store`` (made when None).

    Returns:
        A :class:`RepairPlan` (``refused`` set when the gaps cannot be closed).
    """
    report = report if report is not None else check_catalog(store)
    plan = RepairPlan(report)
    gaps = report.open_gaps
    if not gaps:
        return plan
    bad = sorted(v for v in report.unreadable_commits if v > report.start)
    if bad:
        plan.refused = (f"commit {bad[0]} ({store.uri(commit_key(bad[0]))}) is unreadable: the repair cannot replay "
                        "past it. Restore it from a backup (or, to give it up as lost, delete it and run the repair again).")
        return plan
    newest_commit = report.commits[-1] if report.commits else 0
    beyond = [g for g in gaps if g.last > newest_commit]
    if beyond:
        plan.refused = (f"commits {beyond[0].first}..{beyond[0].last} are missing and only the unreadable checkpoint "
                        f"{store.uri(beyond[0].evidence)} lies past them: restore that checkpoint from a backup.")
        return plan
    missing = [n for g in gaps for n in range(g.first, g.last + 1)]

    # 1. replay without the lost commits: which offsets did they write? An append that starts past the
    # high watermark the partition had before a gap is preceded by records only a lost commit can hold.
    hw_at_gap: dict[int, dict[tuple[str, int], tuple[int, int]]] = {}
    pid_at_gap: dict[int, int] = {}
    holes: list[tuple[int, str, int, int, int]] = []  # (gap, topic, partition, first, end)

    def on_gap(n: int, state: CatalogState) -> None:
        hw_at_gap[n] = {(t.name, p.partition): (p.high_watermark, p.last_stable_offset, p.log_start_offset)
                        for t in state.topics.values() for p in t.partitions}
        pid_at_gap[n] = state.next_producer_id

    def on_append(v: int, action: dict[str, Any], state: CatalogState) -> None:
        tp = (action["topic"], action["partition"])
        hw = state.partition(*tp).high_watermark
        if action["base_offset"] > hw:
            n = next((n for n in missing if n < v and hw_at_gap[n].get(tp, (None,))[0] == hw), None)
            if n is not None:
                holes.append((n, tp[0], tp[1], hw, action["base_offset"]))

    try:
        final = _replay(report, {}, on_gap, on_append)
    except CatalogError as exc:
        plan.refused = f"{exc}. Restore the missing commit from a backup."
        return plan

    # 2. the objects no commit names, by partition
    referenced = final.referenced_paths() | set(final.retired)
    unnamed = [o.key for prefix in data_prefixes for o in store.list(prefix) if o.key not in referenced]
    chunks = [c for key in unnamed for c in _chunks(store, key)]

    # 3. the marker of each missing number
    now = int(time.time() * 1000)
    restored_at: dict[int, list[dict[str, Any]]] = {n: [] for n in missing}
    for n, topic, partition, first, end in holes:
        fits = [c for c in chunks if (c.topic, c.partition, c.base_offset, c.last_offset) == (topic, partition, first, end - 1)
                and c.records == end - first]
        reason = None
        if not fits:
            reason = "no object that no commit names holds exactly these offsets"
        elif len(fits) > 1:
            reason = f"{len(fits)} objects hold these offsets ({', '.join(c.path for c in fits)}): which one was committed is unknown"
        if reason is not None:
            plan.lost.append(Lost(n, topic, partition, first, end - 1, reason))
            continue
        c = fits[0]
        _, lso, log_start = hw_at_gap[n][(topic, partition)]
        restored_at[n].append(c.to_segment().to_action(end, lso))
        # an ABORT marker's aborted-transaction index entry was in the lost commit too (the flush that
        # writes a marker adds it): the transaction spans the producer's records since its previous marker
        aborted = []
        for offset, producer_id, control_type in c.controls:
            if control_type != CONTROL_ABORT:
                continue
            earlier = [o for o, pid, _ in c.controls if pid == producer_id and o < offset]
            prev = max(earlier) if earlier else _previous_control(store, final, topic, partition, producer_id, offset)
            entry = AbortedTxn(producer_id, max(prev + 1, log_start) if prev is not None else log_start, offset)
            restored_at[n].append(entry.to_action(topic, partition))
            aborted.append(entry)
        plan.restored.append(Restored(n, topic, partition, c.path, first, end - 1, c.records, aborted))
    hws = {(t.name, p.partition): p.high_watermark for t in final.topics.values() for p in t.partitions}
    for c in chunks:
        hw = hws.get((c.topic, c.partition))
        if hw is not None and c.last_offset >= hw:
            plan.unplaced.append((c.path, c.topic, c.partition, c.base_offset, c.last_offset))
    host = f"{socket.gethostname()}:{os.getpid()}"
    for lost_so_far, n in enumerate(missing, 1):
        info = {"version": n, "repaired_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now / 1000)),
                "repaired_by": host,
                "restored": [{"topic": r.topic, "partition": r.partition, "path": r.path, "first_offset": r.base_offset,
                              "last_offset": r.last_offset,
                              **({"aborted": [[a.producer_id, a.first_offset, a.last_offset] for a in r.aborted]}
                                 if r.aborted else {})}
                             for r in plan.restored if r.version == n],
                "lost": [{"topic": x.topic, "partition": x.partition, "first_offset": x.first_offset,
                          "last_offset": x.last_offset, "reason": x.reason} for x in plan.lost if x.version == n],
                "note": "what else this commit held (configs, aborted-transaction entries, producer snapshots, "
                        "lease changes) is unknown"}
        plan.markers[n] = ([{"action": LOST_COMMIT, "timestamp_ms": now, "info": json.dumps(info, sort_keys=True)},
                            # each lost commit may have handed out one block (an upper bound: skipping more is harmless)
                            {"action": PRODUCER_ID_BLOCK, "producer_id": pid_at_gap[n] + lost_so_far * producer_id_block_size}]
                           + restored_at[n])

    # 4. the log must replay with the markers
    try:
        _replay(report, plan.markers)
    except CatalogError as exc:  # pragma: no cover - the rebuilt segments fill holes only
        plan.refused = f"{exc}. Nothing was written."
    return plan


def repair_catalog(store: ObjectStore, data_prefixes: list[str], producer_id_block_size: int,
                   accept_loss: bool = False) -> RepairPlan:
    """Plan the repair (:func:`plan_repair`) and, with ``accept_loss``, write it: one commit at
    each missing number, by create-if-absent, in ascending order.

    Without ``accept_loss`` nothing is written (the plan says what would be). A repair needs no
    writer lease: no writer commits at a gap's number (they refuse), and a running writer goes
    on at the head.

    Returns:
        The :class:`RepairPlan`, with ``written`` and the ``version`` a reader then loads.

    Raises:
        CatalogError: a missing number was taken meanwhile (another repair ran): check again.
        StorageError: a write failed (run the repair again: the markers written stay valid).
    """
    plan = plan_repair(store, data_prefixes, producer_id_block_size)
    if plan.refused is not None or not plan.markers or not accept_loss:
        return plan
    for n in sorted(plan.markers):
        if not store.put_if_absent(commit_key(n), encode_actions(plan.markers[n], COMMIT_KIND, n)):
            raise CatalogError(f"catalog commit {n} at {store.uri(commit_key(n))} was written by another process while "
                               "the repair ran; run `txlake catalog check` again")
        plan.written.append(n)
        log.info("catalog commit %s was lost: wrote the repair marker there", store.uri(commit_key(n)))
    plan.version = Catalog.open(store).version
    return plan


def describe_plan(plan: RepairPlan, accept_loss: bool) -> list[str]:
    """The plan as the lines ``txlake catalog repair`` prints."""
    report = plan.report
    url = report.url
    if not report.open_gaps:
        lines = [f"Catalog of {url}: no gap that readers stop at; nothing to repair."]
        lines += [f"Gap: commits {g.first}..{g.last} lie below checkpoint {g.covered_by}, which readers start from: "
                  "nothing to do (the log cleanup deletes them in time)" for g in report.gaps]
        if not report.healthy:
            lines.append("The catalog is not healthy for another reason (see `txlake catalog check`): restore the "
                         "objects it names from a backup.")
        return lines
    lines = [f"Catalog of {url}"]
    for g in report.open_gaps:
        shown = range(g.first, min(g.last, g.first + MAX_KEYS_SHOWN - 1) + 1)
        lines.extend(f"Missing: commit {n} ({store_uri(url, commit_key(n))})" for n in shown)
        if g.last > shown[-1]:
            lines.append(f"Missing: ... and {g.last - shown[-1]} more, up to commit {g.last}")
    if plan.refused is not None:
        lines.append(f"Cannot repair: {plan.refused}")
        return lines
    for r in plan.restored:
        aborted = "".join(f", with the aborted transaction of producer {a.producer_id} at offsets "
                          f"{a.first_offset}..{a.last_offset}" for a in r.aborted)
        lines.append(f"Restore: {r.topic} [{r.partition}] offsets {r.base_offset}..{r.last_offset} "
                     f"({_count(r.record_count, 'record')}) from {store_uri(url, r.path)}, into commit {r.version}{aborted}")
    for x in plan.lost:
        n = x.last_offset - x.first_offset + 1
        lines.append(f"Lost: {x.topic} [{x.partition}] offsets {x.first_offset}..{x.last_offset} ({n} offset"
                     f"{'s' if n != 1 else ''}, commit {x.version}): {x.reason}")
    for key, topic, partition, first, last in plan.unplaced:
        lines.append(f"Not restored: {store_uri(url, key)} holds {topic} [{partition}] offsets {first}..{last}, past "
                     "the high watermark: it may be a flush that never committed. It is an orphan the writer deletes "
                     "after storage.orphan.grace.ms: copy it now if you need it")
    lost = sum(x.last_offset - x.first_offset + 1 for x in plan.lost)
    lines.append(f"Unknown: anything else the lost commit{'s' if len(plan.markers) != 1 else ''} held (topic changes, "
                 "aborted-transaction entries, producer snapshots, lease changes); producer ids skip one block")
    unplaced = f" ({_count(len(plan.unplaced), 'object')} past a high watermark not restored)" if plan.unplaced else ""
    if plan.written:
        lines.append(f"Wrote repair marker commit{'s' if len(plan.written) != 1 else ''} "
                     f"{_ranges(plan.written)}: readers load up to version {plan.version}; "
                     f"{_count(len(plan.restored), 'segment')} restored, {_count(lost, 'offset')} lost{unplaced}.")
    elif not accept_loss:
        lines.append(f"Nothing written: {_count(len(plan.restored), 'segment')} can be restored and "
                     f"{_count(lost, 'offset')} {'is' if lost == 1 else 'are'} lost{unplaced}. Run `txlake catalog repair --accept-loss` to write "
                     "this, or restore the missing commit objects from a backup instead.")
    return lines
