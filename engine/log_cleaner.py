"""Key compaction (``cleanup.policy=compact``): which records a cleaning keeps, and when a
partition is due for one -- Kafka's log cleaner as pure functions over plain data.

Nothing here touches storage: the caller reads the records, writes the survivors into new
segments and commits them (with the new :class:`CleanerCheckpoint`, if it keeps one).

* :func:`cleanable_range` -- *when and how far* (Kafka's ``LogCleanerManager``:
  ``cleanableOffsets``, ``calculateCleanableBytes``, ``maxCompactionDelay``,
  ``grabFilthiestCompactedLog``): the first dirty offset (the persisted clean point), the
  first uncleanable offset (the *cleaning point*: never past the LSO, the high watermark,
  the first unstable offset, an active segment, or segments younger than
  ``min.compaction.lag.ms``), the dirty ratio against ``min.cleanable.dirty.ratio`` and the
  ``max.compaction.lag.ms`` override. :func:`grab_filthiest` picks the partition to clean.
* :func:`clean_records` -- *what stays* (Kafka's ``Cleaner``: ``buildOffsetMap``,
  ``cleanSegments``/``cleanInto``, ``shouldDiscardBatch``, ``shouldRetainRecord`` and
  ``CleanedTransactionMetadata``, with the KIP-534 delete horizon of tombstones and
  transaction markers) over one table. The same two passes are available chunk by chunk
  for logs larger than memory: :class:`OffsetMapBuilder` (first pass, reads no values) ->
  :class:`CleaningPlan` -> :meth:`CleaningPlan.apply` (second pass, any chunk).
* :func:`row_filter` -- the factory the compaction runner (``engine/compaction.py``) calls
  per partition and round; stateless, so it uses record-timestamp delete horizons.

The rules, in Kafka's words where it has them (docs/key-compaction.md gives each rule its
Kafka reference):

1. Only records below the cleaning point are cleaned; records at or after it pass through
   untouched and do not take part in the offset map.
2. The offset map holds, for every key, the offset of its latest record below the cleaning
   point, counting only data records that are not part of an aborted transaction. A keyed
   data record stays only if it is the latest for its key.
3. A tombstone (null value) that is the latest for its key stays until its *delete horizon*
   (the time of the cleaning that first kept it + ``delete.retention.ms``) has passed; a
   cleaning at or after the horizon removes it. A tombstone always survives its first
   cleaning, even with ``delete.retention.ms=0`` (KIP-534).
4. Records of aborted transactions (the aborted-transaction index) are removed.
5. A COMMIT/ABORT marker stays while any record of its transaction is in the log being
   cleaned. The first cleaning that finds none sets the marker's delete horizon
   (now + ``delete.retention.ms``); a cleaning at or after it removes the marker, and the
   aborted-transaction index entry of a removed ABORT marker goes with it.
6. Records with a null key: Kafka refuses them on a compacted topic at produce time, and
   its cleaner drops any it meets. Here they are kept by default (a topic switched from
   ``delete`` to ``compact`` may hold them, and a compaction should not lose data the
   producer was allowed to write); ``discard_null_keys=True`` drops them as Kafka does.
7. Offsets never change: the output is a subset of the input rows, gaps appear.

Kafka keeps the delete horizon in each rewritten batch header (``deleteHorizonMs``). Our
rows have no batch header, so the horizon lives in the :class:`CleanerCheckpoint` the
caller persists per partition next to the clean point (Kafka's
``cleaner-offset-checkpoint``): for tombstones one ``(end_offset, horizon_ms)`` entry per
cleaning run (the run that first cleaned an offset range sets the horizon of every
tombstone in it, which is exactly when Kafka stamps the batch), and for markers one
``(offset, horizon_ms)`` entry per marker whose transaction is empty but whose horizon has
not yet passed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlake.catalog.state import AbortedTxn, PartitionState, SegmentInfo
from txlake.catalog.topic_config import cleanup_policies, effective_config

__all__ = [
    "HORIZON_CHECKPOINT", "HORIZON_RECORD_TIMESTAMP", "MAP_COLUMNS",
    "CleanerCheckpoint", "CleanStats", "CleanResult", "CleaningPlan", "OffsetMapBuilder", "CleanableRange",
    "clean_records", "cleanable_range", "grab_filthiest", "is_compacted", "row_filter",
]

_REQUIRED_COLUMNS = ("offset", "timestamp", "key", "producer_id", "is_transactional", "is_control")


# ----------------------------------------------------------------------------- state
@dataclass(frozen=True)
class CleanerCheckpoint:
    """What the cleaner of one partition remembers between runs; the caller persists it.

    Kafka keeps the clean point in ``cleaner-offset-checkpoint`` and the KIP-534 delete
    horizons in the headers of the batches it rewrote. txlake's rows have no batch
    header, so both live here (plain ints, JSON-able through :meth:`to_dict`).

    Attributes:
        clean_offset: the first dirty offset, i.e. the cleaning point of the last run
            (an offset; ``None`` = never cleaned, the log start offset is used).
        tombstone_horizons: ``((end_offset, delete_horizon_ms), ...)`` with ascending
            ``end_offset``. Entry ``i`` covers offsets ``[end_offset[i-1], end_offset[i])``
            (the first from 0): the run that first cleaned that range stamped its
            tombstones with ``delete_horizon_ms`` (ms since the epoch). Offsets at or
            above the last ``end_offset`` have never been cleaned.
        marker_horizons: ``((marker_offset, delete_horizon_ms), ...)`` with ascending
            offsets: COMMIT/ABORT markers whose transaction has no record left, and the
            time from which a cleaning may remove them.
    """

    clean_offset: int | None = None
    tombstone_horizons: tuple[tuple[int, int], ...] = ()
    marker_horizons: tuple[tuple[int, int], ...] = ()

    def tombstone_horizon(self, offset: int) -> int | None:
        """The delete horizon (ms) of a tombstone at ``offset``; None if never cleaned."""
        ends = [e for e, _ in self.tombstone_horizons]
        i = bisect.bisect_right(ends, offset)
        return self.tombstone_horizons[i][1] if i < len(ends) else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (lists of ``[offset, ms]`` pairs)."""
        return {"clean_offset": self.clean_offset,
                "tombstone_horizons": [list(p) for p in self.tombstone_horizons],
                "marker_horizons": [list(p) for p in self.marker_horizons]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "CleanerCheckpoint":
        """The inverse of :meth:`to_dict`; ``None`` or ``{}`` gives a never-cleaned checkpoint.

        Raises:
            ValueError: pairs that are not ``[int, int]`` or not in ascending offset order.
        """
        if not data:
            return cls()
        clean = data.get("clean_offset")

        def pairs(name: str) -> tuple[tuple[int, int], ...]:
            out = tuple((int(a), int(b)) for a, b in data.get(name) or ())
            if any(out[i][0] >= out[i + 1][0] for i in range(len(out) - 1)):
                raise ValueError(f"cleaner checkpoint: {name} must have strictly ascending offsets, got {out}")
            return out

        return cls(None if clean is None else int(clean), pairs("tombstone_horizons"), pairs("marker_horizons"))


@dataclass(frozen=True)
class CleanStats:
    """Counts of one :func:`clean_records` call (Kafka's ``CleanerStats``), in records.

    Attributes:
        records_read: rows below the cleaning point that were examined.
        records_retained: of those, how many stay.
        superseded: keyed data records with a later record for the same key.
        tombstones: tombstones whose delete horizon had passed.
        aborted: records of aborted transactions.
        markers: COMMIT/ABORT markers of empty transactions whose horizon had passed.
        null_keys: data records without a key (only with ``discard_null_keys``).
        passed_through: rows at or after the cleaning point (kept untouched).
    """

    records_read: int = 0
    records_retained: int = 0
    superseded: int = 0
    tombstones: int = 0
    aborted: int = 0
    markers: int = 0
    null_keys: int = 0
    passed_through: int = 0

    @property
    def removed(self) -> int:
        """Records removed, all reasons together."""
        return self.records_read - self.records_retained


@dataclass(frozen=True)
class CleanResult:
    """The outcome of :func:`clean_records`.

    Attributes:
        table: the rows that stay, same schema and offsets as the input, in offset order.
        stats: counts by reason.
        checkpoint: the new :class:`CleanerCheckpoint` (persist it with the rewrite).
        aborted_transactions: the aborted-transaction index after cleaning (input entries
            minus those whose ABORT marker was removed).
        removed_aborted_transactions: the entries that went with their marker.
    """

    table: pa.Table
    stats: CleanStats
    checkpoint: CleanerCheckpoint
    aborted_transactions: list[AbortedTxn] = field(default_factory=list)
    removed_aborted_transactions: list[AbortedTxn] = field(default_factory=list)


# ----------------------------------------------------------------------------- cleaning
#: how tombstones and markers get their delete horizon (see :func:`clean_records`)
HORIZON_CHECKPOINT = "checkpoint"
HORIZON_RECORD_TIMESTAMP = "record_timestamp"


def _head(table: pa.Table, name: str, n: int) -> pa.ChunkedArray:
    col = table.column(name)
    return col if n == table.num_rows else col.slice(0, n)


def _np(table: pa.Table, name: str, n: int) -> np.ndarray:
    """The first ``n`` values of a non-null column as a numpy array."""
    return _head(table, name, n).to_numpy()


def _null_mask(table: pa.Table, name: str, n: int) -> np.ndarray:
    col = _head(table, name, n)
    if col.null_count == 0:
        return np.zeros(n, dtype=bool)
    return col.is_null().to_numpy()


def _in_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """``values[i] in sorted_set`` for every i (``sorted_set`` ascending, unique)."""
    if not len(sorted_set) or not len(values):
        return np.zeros(len(values), dtype=bool)
    i = np.searchsorted(sorted_set, values)
    return (i < len(sorted_set)) & (sorted_set[np.minimum(i, len(sorted_set) - 1)] == values)


def _lookup(sorted_keys: np.ndarray, values: np.ndarray, probe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact-match lookup of ``probe`` in ``sorted_keys``: ``(found, value)`` (value undefined where not found)."""
    if not len(sorted_keys):
        return np.zeros(len(probe), bool), np.zeros(len(probe), values.dtype)
    i = np.searchsorted(sorted_keys, probe)
    ic = np.minimum(i, len(sorted_keys) - 1)
    return (i < len(sorted_keys)) & (sorted_keys[ic] == probe), values[ic]


def _check_records(table: pa.Table, previous_last: int | None) -> np.ndarray:
    """The offsets of ``table`` after checking its columns and offset order."""
    missing = [c for c in _REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"log cleaner: the records table lacks the column(s) {missing}")
    offsets = table.column("offset").to_numpy()
    if len(offsets) and ((len(offsets) > 1 and not np.all(offsets[1:] > offsets[:-1]))
                         or (previous_last is not None and offsets[0] <= previous_last)):
        raise ValueError("log cleaner: offsets must be strictly ascending (one partition, sorted by offset, "
                         "chunks in log order)")
    return offsets


class _AbortedIndex:
    """The aborted-transaction index as arrays (what ``CleanedTransactionMetadata`` keeps)."""

    def __init__(self, aborted: Sequence[AbortedTxn]):
        self.entries = tuple(aborted)
        m = len(self.entries)
        self.pid = np.fromiter((a.producer_id for a in self.entries), np.int64, m)
        self.first = np.fromiter((a.first_offset for a in self.entries), np.int64, m)
        self.last = np.fromiter((a.last_offset for a in self.entries), np.int64, m)

    def rows(self, offsets: np.ndarray, pids: np.ndarray, txn_data: np.ndarray) -> np.ndarray:
        """Rows of an aborted transaction: transactional data rows of ``producer_id`` with
        ``first_offset <= offset <= last_offset`` for some entry (Kafka's ``onBatchRead``).

        Vectorized: entries and rows sorted together by (producer id, offset); a row looks
        at the last entry at or before it. A producer has one transaction at a time, so its
        entries do not overlap and that entry is the only candidate.
        """
        out = np.zeros(len(offsets), dtype=bool)
        rows = np.flatnonzero(txn_data)
        m = len(self.entries)
        if not m or not len(rows):
            return out
        pid_all = np.concatenate([self.pid, pids[rows].astype(np.int64, copy=False)])
        off_all = np.concatenate([self.first, offsets[rows]])
        kind = np.concatenate([np.zeros(m, np.int8), np.ones(len(rows), np.int8)])  # entries sort first
        order = np.lexsort((kind, off_all, pid_all))
        is_entry = order < m
        last_entry_pos = np.maximum.accumulate(np.where(is_entry, np.arange(len(order)), -1))
        row_pos = np.flatnonzero(~is_entry)
        ep = last_entry_pos[row_pos]
        found = ep >= 0
        entry = np.where(found, order[np.maximum(ep, 0)], 0)
        j = order[row_pos] - m  # the row's index in ``rows``
        hit = found & (self.pid[entry] == pid_all[m + j]) & (off_all[m + j] <= self.last[entry])
        out[rows[j[hit]]] = True
        return out


def _reduce_latest(parts: list[pa.Table]) -> pa.Table:
    """(key, offset) tables -> one row per key with its greatest offset (a hash aggregation;
    single-threaded: with many distinct keys, merging per-thread tables costs more than it saves)."""
    if len(parts) == 1:
        return parts[0]
    table = pa.concat_tables(parts)
    agg = table.group_by("key", use_threads=False).aggregate([("offset", "max")])
    return pa.table({"key": agg.column("key"), "offset": agg.column("offset_max")})


def _latest_of_chunk(keys: pa.ChunkedArray | pa.Array, offsets: np.ndarray) -> pa.Table:
    """One row per distinct key of a chunk with its last offset (``offsets`` ascending).

    Dictionary-encodes the keys (one hash pass) and takes each dictionary entry's last
    position with a numpy scatter-max -- cheaper than a hash aggregation.
    """
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks() if keys.num_chunks != 1 else keys.chunk(0)
    encoded = pc.dictionary_encode(keys)
    idx = encoded.indices.to_numpy(zero_copy_only=False)
    last = np.full(len(encoded.dictionary), -1, np.int64)
    np.maximum.at(last, idx, np.arange(len(idx), dtype=np.int64))
    return pa.table({"key": encoded.dictionary, "offset": pa.array(offsets[last], pa.int64())})


@dataclass(frozen=True, eq=False)
class CleaningPlan:
    """What the first pass over a log learnt; :meth:`apply` then filters records with it.

    Attributes:
        cleaning_point: the first uncleanable offset (records at/after it are not cleaned).
        latest_offsets: ascending offsets of the latest committed keyed data record of
            every key below the cleaning point (Kafka's ``OffsetMap``, with exact keys).
        empty_markers: ascending offsets of COMMIT/ABORT markers below the cleaning point
            whose transaction has no data record in the log (Kafka's ``onControlBatchRead``
            answering "discardable").
        empty_marker_timestamps: their record timestamps (ms), aligned with ``empty_markers``.
        records: rows below the cleaning point seen; keyed_records: committed keyed data
            rows among them; aborted_records: rows of aborted transactions among them.
    """

    cleaning_point: int
    latest_offsets: np.ndarray
    empty_markers: np.ndarray
    empty_marker_timestamps: np.ndarray
    records: int
    keyed_records: int
    aborted_records: int
    aborted_index: _AbortedIndex = field(repr=False)

    @property
    def superseded(self) -> int:
        """Keyed data records with a later record of their key: every keyed record but the latest."""
        return self.keyed_records - len(self.latest_offsets)

    def removable_now(self, now_ms: int, delete_retention_ms: int) -> int:
        """A lower bound of the records a cleaning now removes, known without values:
        superseded and aborted records, and empty markers whose record timestamp is
        ``delete.retention.ms`` old (tombstones are not counted: seeing them needs values)."""
        markers = int(np.count_nonzero(self.empty_marker_timestamps + delete_retention_ms <= now_ms))
        return self.superseded + self.aborted_records + markers

    def apply(self, records: pa.Table, now_ms: int, delete_retention_ms: int, *,
              checkpoint: CleanerCheckpoint | None = None, horizons: str = HORIZON_CHECKPOINT,
              discard_null_keys: bool = False) -> tuple[pa.Table, CleanStats, list[tuple[int, int]], np.ndarray]:
        """Filter one chunk of the log (any consecutive rows, e.g. one rewrite group).

        Rows at or after the cleaning point pass untouched. See :func:`clean_records` for
        the rules, ``horizons`` and ``checkpoint``.

        Returns:
            ``(kept rows, stats, marker horizons, removed marker offsets)``: the marker
            horizons are ``(offset, delete_horizon_ms)`` of the empty markers kept (with
            ``horizons="checkpoint"``; empty otherwise).

        Raises:
            ValueError: a missing column, offsets not ascending, an unknown ``horizons``.
        """
        if horizons not in (HORIZON_CHECKPOINT, HORIZON_RECORD_TIMESTAMP):
            raise ValueError(f"horizons must be {HORIZON_CHECKPOINT!r} or {HORIZON_RECORD_TIMESTAMP!r}, got {horizons!r}")
        checkpoint = checkpoint or CleanerCheckpoint()
        all_offsets = _check_records(records, None)
        if "value" not in records.column_names:
            raise ValueError("log cleaner: the records table lacks the column(s) ['value']")
        nb = int(np.searchsorted(all_offsets, self.cleaning_point))  # rows [0, nb) are below the cleaning point
        offsets = all_offsets[:nb]
        control = _np(records, "is_control", nb).astype(bool, copy=False)
        transactional = _np(records, "is_transactional", nb).astype(bool, copy=False)
        pids = _np(records, "producer_id", nb)
        key_null = _null_mask(records, "key", nb)
        data = ~control
        by_record_time = horizons == HORIZON_RECORD_TIMESTAMP

        # records of aborted transactions
        is_aborted = self.aborted_index.rows(offsets, pids, transactional & data)
        # the offset map: a committed keyed data record stays only if it is its key's latest
        keyed = data & ~is_aborted & ~key_null
        latest = keyed & _in_sorted(offsets, self.latest_offsets)
        superseded = keyed & ~latest
        # tombstones past their delete horizon
        tomb = latest & _null_mask(records, "value", nb) if latest.any() else latest
        expired_tomb = np.zeros(nb, dtype=bool)
        if tomb.any():
            t_idx = np.flatnonzero(tomb)
            if by_record_time:
                stamps = _np(records, "timestamp", nb)[t_idx]
                expired_tomb[t_idx[now_ms >= stamps + delete_retention_ms]] = True
            elif checkpoint.tombstone_horizons:
                ends = np.fromiter((e for e, _ in checkpoint.tombstone_horizons), np.int64)
                hz = np.fromiter((h for _, h in checkpoint.tombstone_horizons), np.int64)
                i = np.searchsorted(ends, offsets[t_idx], side="right")
                cleaned_before = i < len(ends)  # at/above the last end: first cleaning, always kept
                expired_tomb[t_idx[cleaned_before & (now_ms >= hz[np.minimum(i, len(ends) - 1)])]] = True
        # markers of empty transactions past their delete horizon
        removed_marker = np.zeros(nb, dtype=bool)
        marker_horizons: list[tuple[int, int]] = []
        m_idx = np.flatnonzero(control & _in_sorted(offsets, self.empty_markers)) if len(self.empty_markers) else []
        if len(m_idx):
            m_off = offsets[m_idx]
            if by_record_time:
                remove = now_ms >= _np(records, "timestamp", nb)[m_idx] + delete_retention_ms
            else:
                prev = checkpoint.marker_horizons
                mo = np.fromiter((o for o, _ in prev), np.int64, len(prev))
                mh = np.fromiter((h for _, h in prev), np.int64, len(prev))
                found, h = _lookup(mo, mh, m_off)
                remove = found & (now_ms >= h)  # no horizon yet: this cleaning sets it, the marker stays
                stay = ~remove
                horizon = np.where(found, h, now_ms + delete_retention_ms)
                marker_horizons = list(zip(m_off[stay].tolist(), horizon[stay].tolist()))
            removed_marker[m_idx[remove]] = True
        # null keys
        dropped_null = (data & ~is_aborted & key_null) if discard_null_keys else np.zeros(nb, dtype=bool)

        removed = is_aborted | superseded | expired_tomb | removed_marker | dropped_null
        n_removed = int(np.count_nonzero(removed))
        if n_removed:
            keep = np.ones(records.num_rows, dtype=bool)
            keep[:nb] = ~removed
            out = records.filter(pa.array(keep))
        else:
            out = records
        stats = CleanStats(
            records_read=nb, records_retained=nb - n_removed, superseded=int(np.count_nonzero(superseded)),
            tombstones=int(np.count_nonzero(expired_tomb)), aborted=int(np.count_nonzero(is_aborted)),
            markers=int(np.count_nonzero(removed_marker)), null_keys=int(np.count_nonzero(dropped_null)),
            passed_through=records.num_rows - nb,
        )
        return out, stats, marker_horizons, offsets[removed_marker]


class OffsetMapBuilder:
    """The first pass of a cleaning, fed the log one chunk at a time (e.g. one segment).

    Kafka's ``Cleaner.buildOffsetMap`` with the ``CleanedTransactionMetadata`` it keeps:
    for every key, the offset of its latest record below the cleaning point, skipping
    control records and records of aborted transactions; and for every COMMIT/ABORT
    marker, whether its transaction has any data record in the log. Keys are kept exactly
    (no hashing), reduced per chunk, so memory grows with the number of distinct keys.

    Feed chunks in log order with :meth:`add`, then call :meth:`finish`.
    """

    #: chunk results kept before they are reduced into one
    _MAX_PARTIALS = 16

    def __init__(self, aborted: Iterable[AbortedTxn], cleaning_point: int):
        self.cleaning_point = cleaning_point
        self._aborted = _AbortedIndex(list(aborted))
        self._partials: list[pa.Table] = []
        self._last: int | None = None
        self._carry_pids = np.empty(0, np.int64)  # producer id -> its last transactional row is data
        self._carry_data = np.empty(0, bool)
        self._markers: list[np.ndarray] = []
        self._marker_stamps: list[np.ndarray] = []
        self._records = self._keyed = self._aborted_rows = 0

    def add(self, records: pa.Table) -> None:
        """Take the next chunk of the log: rows in ascending offset order, after the previous
        chunk's. Columns: at least ``offset, timestamp, key, producer_id, is_transactional,
        is_control`` (``value`` is not needed). Rows at/after the cleaning point are ignored.

        Raises:
            ValueError: a missing column or offsets out of order.
        """
        offsets_all = _check_records(records, self._last)
        if len(offsets_all):
            self._last = int(offsets_all[-1])
        nb = int(np.searchsorted(offsets_all, self.cleaning_point))
        if not nb:
            return
        offsets = offsets_all[:nb]
        control = _np(records, "is_control", nb).astype(bool, copy=False)
        transactional = _np(records, "is_transactional", nb).astype(bool, copy=False)
        pids = _np(records, "producer_id", nb).astype(np.int64, copy=False)
        data = ~control
        is_aborted = self._aborted.rows(offsets, pids, transactional & data)
        keyed = data & ~is_aborted & ~_null_mask(records, "key", nb)
        self._records += nb
        self._aborted_rows += int(np.count_nonzero(is_aborted))
        idx = np.flatnonzero(keyed)
        if len(idx):
            self._keyed += len(idx)
            keys = _head(records, "key", nb)
            if len(idx) != nb:
                keys = keys.take(pa.array(idx))
            self._partials.append(_latest_of_chunk(keys, offsets[idx]))
            if len(self._partials) >= self._MAX_PARTIALS:
                self._partials = [_reduce_latest(self._partials)]
        self._add_markers(offsets, pids, transactional, control, records, nb)

    def _add_markers(self, offsets: np.ndarray, pids: np.ndarray, transactional: np.ndarray,
                     control: np.ndarray, records: pa.Table, nb: int) -> None:
        """Markers of this chunk whose transaction is empty: the producer's previous
        transactional row (in this chunk, else carried from earlier ones) is not data."""
        txn_rows = np.flatnonzero(transactional | control)
        if not len(txn_rows):
            return
        order = np.argsort(pids[txn_rows], kind="stable")  # offsets ascend: (pid, offset) order
        rows = txn_rows[order]
        sp, sc = pids[rows], control[rows]
        same_as_prev = np.zeros(len(rows), dtype=bool)
        same_as_prev[1:] = sp[1:] == sp[:-1]
        prev_is_data = np.zeros(len(rows), dtype=bool)
        prev_is_data[1:] = same_as_prev[1:] & ~sc[:-1]
        first = np.flatnonzero(~same_as_prev)
        found, carried = _lookup(self._carry_pids, self._carry_data, sp[first])
        prev_is_data[first] = found & carried
        markers = rows[sc & ~prev_is_data]
        if len(markers):
            markers.sort()
            self._markers.append(offsets[markers])
            self._marker_stamps.append(_np(records, "timestamp", nb)[markers])
        # carry each producer's last transactional row kind into the next chunk
        last = np.ones(len(rows), dtype=bool)
        last[:-1] = sp[:-1] != sp[1:]
        all_p = np.concatenate([self._carry_pids, sp[last]])
        all_d = np.concatenate([self._carry_data, ~sc[last]])
        o = np.argsort(all_p, kind="stable")
        all_p, all_d = all_p[o], all_d[o]
        keep = np.ones(len(all_p), dtype=bool)
        keep[:-1] = all_p[:-1] != all_p[1:]  # the later (this chunk's) entry wins
        self._carry_pids, self._carry_data = all_p[keep], all_d[keep]

    def finish(self) -> CleaningPlan:
        """The :class:`CleaningPlan` of everything added."""
        latest = np.sort(_reduce_latest(self._partials).column("offset").to_numpy()) if self._partials \
            else np.empty(0, np.int64)
        markers = np.concatenate(self._markers) if self._markers else np.empty(0, np.int64)
        stamps = np.concatenate(self._marker_stamps) if self._marker_stamps else np.empty(0, np.int64)
        return CleaningPlan(self.cleaning_point, latest, markers, stamps, self._records, self._keyed,
                            self._aborted_rows, self._aborted)


def _next_tombstone_horizons(previous: tuple[tuple[int, int], ...], cleaning_point: int, now_ms: int,
                             delete_retention_ms: int) -> tuple[tuple[int, int], ...]:
    """The tombstone horizon ranges after a run: the run's new range is added, and ranges
    whose horizon has passed (every tombstone in them was just removed) are dropped,
    except the last, which marks how far cleaning has reached."""
    entries = list(previous)
    if cleaning_point > (entries[-1][0] if entries else 0):
        entries.append((cleaning_point, now_ms + delete_retention_ms))
    kept = [(end, h) for i, (end, h) in enumerate(entries)
            if i == len(entries) - 1 or not (h <= now_ms and end <= cleaning_point)]
    merged: list[tuple[int, int]] = []
    for end, h in kept:  # neighbours with one horizon are one range
        if merged and merged[-1][1] == h:
            merged[-1] = (end, h)
        else:
            merged.append((end, h))
    return tuple(merged)


def clean_records(table: pa.Table, aborted: Iterable[AbortedTxn], cleaning_point: int, now_ms: int,
                  delete_retention_ms: int, *, checkpoint: CleanerCheckpoint | None = None,
                  last_stable_offset: int | None = None, discard_null_keys: bool = False,
                  horizons: str = HORIZON_CHECKPOINT) -> CleanResult:
    """Key-compact the records of one partition (Kafka's ``Cleaner.doClean`` over one log).

    One call = :class:`OffsetMapBuilder` over ``table`` + :meth:`CleaningPlan.apply` to it.

    Args:
        table: the partition's committed records in ascending offset order, with at least
            the columns ``offset, timestamp, key, value, producer_id, is_transactional,
            is_control`` (normally :data:`~txlake.formats.records.RECORD_SCHEMA`). It must
            hold every record from the log start offset up to ``cleaning_point`` (Kafka
            cleans the whole log below the cleaning point, clean section included). Rows at
            or after ``cleaning_point`` may be included: they are returned untouched and
            take no part in the offset map (Kafka maps only up to the first uncleanable offset).
        aborted: the aborted-transaction index of the partition -- at least every entry
            with records below ``cleaning_point`` (``PartitionState.aborted_transactions``).
        cleaning_point: the first uncleanable offset (exclusive end of the cleaning), e.g.
            :attr:`CleanableRange.first_uncleanable_offset`; at most the LSO.
        now_ms: the time of this cleaning, ms since the epoch (Kafka's ``currentTime``).
        delete_retention_ms: the topic's ``delete.retention.ms`` (ms, >= 0).
        checkpoint: the partition's :class:`CleanerCheckpoint` from the previous run (None:
            never cleaned -- every tombstone then survives this run).
        last_stable_offset: when given, ``cleaning_point`` is checked against it.
        discard_null_keys: drop data records with a null key, as Kafka's cleaner does
            (default: keep them; see the module notes).
        horizons: ``"checkpoint"`` (default, KIP-534): a tombstone's delete horizon is the
            time of the run that first cleaned it + ``delete_retention_ms``, a marker's the
            time of the first run that found its transaction empty + ``delete_retention_ms``,
            both remembered in the returned checkpoint. ``"record_timestamp"`` (stateless,
            for callers that cannot persist a checkpoint; close to Kafka's pre-KIP-534 rule):
            the horizon is the record's own timestamp + ``delete_retention_ms``.

    Returns:
        A :class:`CleanResult`: the rows that stay (same schema and offsets), counts by
        reason, the new checkpoint (``clean_offset = cleaning_point``) and the aborted
        index after cleaning.

    Raises:
        ValueError: a missing column, offsets not strictly ascending, a negative
            ``delete_retention_ms``, a cleaning point past ``last_stable_offset`` or an
            unknown ``horizons``.
    """
    if delete_retention_ms < 0:
        raise ValueError(f"delete.retention.ms must be at least 0, got {delete_retention_ms}")
    if last_stable_offset is not None and cleaning_point > last_stable_offset:
        raise ValueError(f"the cleaning point {cleaning_point} is past the last stable offset {last_stable_offset}: "
                         "records of open transactions would be cleaned; clean below the LSO")
    checkpoint = checkpoint or CleanerCheckpoint()
    aborted = list(aborted)
    builder = OffsetMapBuilder(aborted, cleaning_point)
    builder.add(table)
    out, stats, marker_horizons, removed_markers = builder.finish().apply(
        table, now_ms, delete_retention_ms, checkpoint=checkpoint, horizons=horizons,
        discard_null_keys=discard_null_keys)

    gone = set(removed_markers.tolist())
    kept_aborted = [a for a in aborted if a.last_offset not in gone]
    gone_aborted = [a for a in aborted if a.last_offset in gone]
    # horizons of markers at or after the cleaning point were not looked at: they stay
    marker_horizons += [(o, h) for o, h in checkpoint.marker_horizons if o >= cleaning_point]
    new_checkpoint = CleanerCheckpoint(
        clean_offset=cleaning_point,
        tombstone_horizons=_next_tombstone_horizons(checkpoint.tombstone_horizons, cleaning_point, now_ms,
                                                    delete_retention_ms),
        marker_horizons=tuple(sorted(marker_horizons)),
    )
    return CleanResult(out, stats, new_checkpoint, kept_aborted, gone_aborted)


# ----------------------------------------------------------------------------- when
@dataclass(frozen=True)
class CleanableRange:
    """The cleanable part of one partition's log (Kafka's ``OffsetsToClean`` + ``LogToClean``).

    Attributes:
        topic, partition: the partition.
        compact: whether ``cleanup.policy`` includes ``compact``.
        first_dirty_offset: where the dirty section starts (the clean point to use).
        first_uncleanable_offset: the cleaning point: the exclusive end of this cleaning,
            on a segment boundary, ``>= first_dirty_offset`` (pass it to :func:`clean_records`).
        force_update_checkpoint: the persisted clean point was invalid (below the log start
            or past the high watermark) and was reset to the log start offset: persist
            ``first_dirty_offset`` even if no cleaning runs.
        bound: what set the cleaning point: ``"last_stable_offset"``, ``"high_watermark"``,
            ``"first_unstable_offset"``, ``"active_segment"``, ``"min_compaction_lag"`` or
            ``"first_dirty_offset"`` (nothing cleanable).
        clean_bytes: bytes of the segments wholly below the first dirty offset.
        cleanable_bytes: bytes of the segments from the first dirty offset to the cleaning point.
        total_bytes: ``clean_bytes + cleanable_bytes``.
        cleanable_ratio: ``cleanable_bytes / total_bytes`` (0.0 when empty): the dirty ratio.
        min_cleanable_ratio: the topic's ``min.cleanable.dirty.ratio``.
        max_compaction_delay_ms: how long past ``max.compaction.lag.ms`` the oldest dirty
            record is (ms; 0 = not overdue).
        should_clean: a compacted topic with bytes to clean whose dirty ratio exceeds
            ``min.cleanable.dirty.ratio``, or that is overdue by ``max.compaction.lag.ms``.
    """

    topic: str
    partition: int
    compact: bool
    first_dirty_offset: int
    first_uncleanable_offset: int
    force_update_checkpoint: bool
    bound: str
    clean_bytes: int
    cleanable_bytes: int
    total_bytes: int
    cleanable_ratio: float
    min_cleanable_ratio: float
    max_compaction_delay_ms: int
    should_clean: bool

    @property
    def needs_compaction_now(self) -> bool:
        """``max.compaction.lag.ms`` has passed for the oldest dirty record (Kafka's ``needCompactionNow``)."""
        return self.max_compaction_delay_ms > 0


def is_compacted(topic_config: Mapping[str, str]) -> bool:
    """Whether ``cleanup.policy`` (overrides or an effective config) includes ``compact``."""
    return "compact" in cleanup_policies(topic_config)


def _live_segments(p: PartitionState) -> list[SegmentInfo]:
    return [s for s in p.segments if s.last_offset >= p.log_start_offset]


def _segment_floor(segments: list[SegmentInfo], offset: int) -> int:
    """``offset`` moved down to the base offset of the segment holding it (Kafka cleans
    whole segments: ``calculateCleanableBytes`` rounds the uncleanable offset down)."""
    i = bisect.bisect_left([s.last_offset for s in segments], offset)
    if i < len(segments) and segments[i].base_offset < offset:
        return segments[i].base_offset
    return offset


def cleanable_range(partition: PartitionState, topic_config: Mapping[str, str], now_ms: int,
                    first_unstable_offset: int | None = None, *, last_clean_offset: int | None = None,
                    active_segment_base_offset: int | None = None) -> CleanableRange:
    """How far a cleaning of ``partition`` may go now, and whether it is due.

    Follows Kafka's ``LogCleanerManager.cleanableOffsets`` (first dirty and first
    uncleanable offsets), ``calculateCleanableBytes`` and ``LogToClean`` (dirty ratio),
    ``maxCompactionDelay`` (``max.compaction.lag.ms``) and the selection test of
    ``grabFilthiestCompactedLog``.

    Args:
        partition: the partition's catalog state (segments, log start, high watermark, LSO).
        topic_config: the topic's config overrides or effective config (Kafka's names).
        now_ms: the current time, ms since the epoch.
        first_unstable_offset: the first offset of the earliest open transaction, if the
            caller knows one fresher than ``partition.last_stable_offset`` (None: none).
        last_clean_offset: the persisted clean point (``CleanerCheckpoint.clean_offset``);
            None = never cleaned, start at the log start offset.
        active_segment_base_offset: the base offset of a segment still being appended to,
            which Kafka never cleans. txlake segments are immutable objects, so by default
            there is none and the high watermark / LSO bound the cleaning instead.

    Returns:
        A :class:`CleanableRange`. Sizes are in bytes (``SegmentInfo.size_bytes``),
        times in ms. Segments are judged by ``SegmentInfo.max_timestamp`` for
        ``min.compaction.lag.ms`` and ``min_timestamp`` for ``max.compaction.lag.ms``.

    Raises:
        ValueError: a config value that is not a number (a catalog's configs are validated).
    """
    config = effective_config(topic_config)
    compact = is_compacted(config)
    segments = _live_segments(partition)
    log_start, hw = partition.log_start_offset, partition.high_watermark

    # first dirty offset: the checkpoint, reset to the log start when it is out of range
    checkpoint = log_start if last_clean_offset is None else last_clean_offset
    force = False
    if checkpoint < log_start or checkpoint > hw:
        first_dirty, force = log_start, last_clean_offset is not None
    else:
        first_dirty = checkpoint

    # first uncleanable offset: the least of the bounds (Kafka: LSO, active segment, min lag)
    bounds: list[tuple[int, str]] = [(partition.last_stable_offset, "last_stable_offset"), (hw, "high_watermark")]
    if first_unstable_offset is not None:
        bounds.append((first_unstable_offset, "first_unstable_offset"))
    if active_segment_base_offset is not None:
        bounds.append((active_segment_base_offset, "active_segment"))
    min_lag = max(int(config["min.compaction.lag.ms"]), 0)
    dirty_segments = [s for s in segments if s.last_offset >= first_dirty]
    if active_segment_base_offset is not None:
        dirty_segments = [s for s in dirty_segments if s.base_offset < active_segment_base_offset]
    if min_lag > 0:
        young = next((s for s in dirty_segments if s.max_timestamp > now_ms - min_lag), None)
        if young is not None:
            bounds.append((young.base_offset, "min_compaction_lag"))
    raw, bound = min(bounds, key=lambda b: b[0])
    uncleanable = _segment_floor(segments, max(first_dirty, raw))
    if uncleanable <= first_dirty:
        uncleanable, bound = first_dirty, ("first_dirty_offset" if raw < first_dirty else bound)

    # sizes and the dirty ratio (LogToClean.cleanableRatio)
    clean_bytes = sum(s.size_bytes for s in segments if s.last_offset < first_dirty)
    cleanable_bytes = sum(s.size_bytes for s in segments if s.last_offset >= first_dirty and s.base_offset < uncleanable)
    total = clean_bytes + cleanable_bytes
    ratio = cleanable_bytes / total if total > 0 else 0.0
    min_ratio = float(config["min.cleanable.dirty.ratio"])

    # max.compaction.lag.ms (maxCompactionDelay): the oldest dirty record's overdue time
    max_lag = max(int(config["max.compaction.lag.ms"]), 0)
    stamps = [s.min_timestamp for s in dirty_segments if s.min_timestamp > 0]
    clean_until = now_ms - max_lag
    earliest = min(stamps) if stamps else None
    delay = clean_until - earliest if earliest is not None and earliest < clean_until else 0

    should = compact and total > 0 and ((delay > 0 and cleanable_bytes > 0) or ratio > min_ratio)
    return CleanableRange(partition.topic, partition.partition, compact, first_dirty, uncleanable, force, bound,
                          clean_bytes, cleanable_bytes, total, ratio, min_ratio, delay, should)


def grab_filthiest(ranges: Iterable[CleanableRange]) -> CleanableRange | None:
    """The partition to clean next: the highest dirty ratio among those that should be
    cleaned (Kafka's ``grabFilthiestCompactedLog``); None when none should."""
    due = [r for r in ranges if r.should_clean]
    return max(due, key=lambda r: r.cleanable_ratio) if due else None


# ----------------------------------------------------------------------------- the compaction round's row filter
#: columns the first pass reads (not ``value`` or ``headers``: the offset map needs neither)
MAP_COLUMNS = ("offset", "timestamp", "key", "producer_id", "is_transactional", "is_control")


def _read_map_columns(reader: Any, segment: SegmentInfo) -> pa.Table:
    """The :data:`MAP_COLUMNS` of one segment: from the reader's cache when a compaction batch
    prefetched the segment (``LogReader.prefetch``), else only those columns are decoded when
    the reader exposes its object store, else the whole segment through ``segment_table``."""
    cache = getattr(reader, "cache", None)
    cached = cache.get((segment.path, segment.row_group_start)) if cache is not None else None
    if cached is not None:
        return cached.select(list(MAP_COLUMNS))
    store = getattr(reader, "store", None)
    if store is None:
        return reader.segment_table(segment)
    from txlake.formats.records import read_segment

    return store.read_object(segment.path, lambda f: read_segment(f, store.uri(segment.path), segment.row_groups,
                                                                  columns=list(MAP_COLUMNS)))


def row_filter(partition: PartitionState, config: Mapping[str, str], reader: Any,
               now_ms: int) -> Callable[[pa.Table], pa.Table] | None:
    """The key-compaction filter of one round for one partition: the factory that
    ``engine/compaction.py`` (``key_compaction``) calls.

    The runner persists no :class:`CleanerCheckpoint`, so this adapter is stateless:

    * the cleaning point is :func:`cleanable_range` over ``partition.segments`` (the runner
      offers only segments wholly below the LSO, never the last one) with the clean point
      unknown, i.e. the whole offered log is dirty;
    * the first pass (:class:`OffsetMapBuilder`) reads the :data:`MAP_COLUMNS` of every
      offered segment, so values are read once, by the rewrite;
    * the dirty-ratio test uses what this round would remove: superseded and aborted
      records and expired markers (a lower bound: tombstones are seen only in the rewrite)
      as a share of the records read, against ``min.cleanable.dirty.ratio``; with nothing
      removable there is no rewrite, so rounds never rewrite a log for nothing.
      ``max.compaction.lag.ms`` forces a rewrite of a log with anything removable;
    * delete horizons are ``"record_timestamp"`` ones (see :func:`clean_records`).

    Args:
        partition: a snapshot of the partition (segments: the cleanable ones, in order;
            ``aborted_transactions``: the index).
        config: the topic's config (overrides or effective).
        reader: a :class:`~txlake.engine.log_reader.LogReader` (``store`` and
            ``segment_table(segment)``).
        now_ms: the time of this round, ms since the epoch.

    Returns:
        ``filter(records) -> kept records`` for consecutive chunks of the offered segments
        (RECORD_SCHEMA, offset order), or None when the partition is not due.
    """
    config = effective_config(config)
    if not is_compacted(config):
        return None
    rng = cleanable_range(partition, config, now_ms)
    cp = rng.first_uncleanable_offset
    builder = OffsetMapBuilder(partition.aborted_transactions, cp)
    for seg in _live_segments(partition):
        if seg.base_offset >= cp:
            break
        builder.add(_read_map_columns(reader, seg))
    plan = builder.finish()
    retention = int(config["delete.retention.ms"])
    removable = plan.removable_now(now_ms, retention)
    if not plan.records or not removable:
        return None
    if not (removable / plan.records > float(config["min.cleanable.dirty.ratio"]) or rng.needs_compaction_now):
        return None

    def clean_chunk(records: pa.Table) -> pa.Table:
        return plan.apply(records, now_ms, retention, horizons=HORIZON_RECORD_TIMESTAMP)[0]

    return clean_chunk
