"""Reading committed records of a partition from its segments (Kafka's ``LogSegment.read``).

The catalog says which object and row groups hold which offsets; this module reads
them (through a bounded cache of decoded row groups, so a consumer polling a partition
does not decode the same object twice) and slices the requested offset range.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import numpy as np
import pyarrow as pa

from txlake.catalog.catalog import Catalog
from txlake.catalog.state import REMOVE_SEGMENT, RETIRE_OBJECT, SegmentInfo
from txlake.formats.errors import FormatError
from txlake.formats.records import RECORD_SCHEMA, read_row_group_sets, read_segment

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
#: Arrow allocates buffers in multiples of 64 bytes (its alignment and padding)
BUFFER_ALIGNMENT = 64
#: bytes one buffer costs besides its data: the C++ ``Buffer`` and its shared_ptr control block,
#: or the numpy array a zero-copy buffer keeps alive, and the allocator's header
BUFFER_OVERHEAD = 64
#: bytes one column chunk costs besides its buffers: the C++ ``Array``, ``ArrayData`` and
#: ``ChunkedArray`` objects and their vectors (measured: a one-row table of the 17 record
#: columns costs about 23 KiB of RSS, whether decoded from Parquet or built by a flush, against
#: 126 bytes of ``Table.nbytes``; docs/benchmarks.md "Trickle")
ARRAY_OVERHEAD = 1024
#: bytes one cached table costs besides its columns: the ``Table``, its key and the LRU's entry
ENTRY_OVERHEAD = 1024


def _buffers(array: pa.Array) -> list[pa.Buffer]:
    """Every buffer ``array`` keeps alive: its own and its children's and, for a dictionary
    array, its dictionary's (``Array.buffers()`` leaves the dictionary out)."""
    if pa.types.is_dictionary(array.type):
        return [b for b in array.buffers() if b is not None] + _buffers(array.dictionary)
    return [b for b in array.buffers() if b is not None]


def table_memory(table: pa.Table) -> tuple[int, int, int]:
    """What keeping ``table`` costs in memory: ``(fixed bytes, backing, buffer bytes)``.

    ``buffer bytes`` are the allocated sizes of the buffers the table keeps alive, each
    rounded up to Arrow's 64-byte allocation and counted with :data:`BUFFER_OVERHEAD` (a
    slice keeps its parent's whole buffers alive, so they count whole); the fixed bytes are
    :data:`ENTRY_OVERHEAD` plus :data:`ARRAY_OVERHEAD` per column chunk. ``backing``
    identifies those buffers (the address of the first one): the slices of one decoded
    object -- the segments of several partitions read in one pass -- share it, and their
    buffers are one allocation. (``Table.nbytes`` counts none of this: a one-row segment has
    an ``nbytes`` of about 130 bytes and costs about 23 KiB.)
    """
    fixed = ENTRY_OVERHEAD
    backing = 0
    seen: dict[int, int] = {}
    for column in table.columns:
        for chunk in column.chunks:
            fixed += ARRAY_OVERHEAD
            for buf in _buffers(chunk):
                size = -(-buf.size // BUFFER_ALIGNMENT) * BUFFER_ALIGNMENT + BUFFER_OVERHEAD
                if seen.get(buf.address, 0) < size:
                    seen[buf.address] = size
                backing = backing or buf.address
    return fixed, backing, sum(seen.values())


class SegmentCache:
    """An LRU of decoded segments keyed by (object key, first row group), bounded by the
    memory its tables really hold.

    Each table is charged what :func:`table_memory` says it costs: its buffers' allocated
    sizes (buffers several kept tables share -- slices of one decoded flush object -- count
    once, while any of them is kept) plus a fixed cost per column chunk and per table. So
    many tiny segments (a trickle of small flushes) fill the bound as fast as their real
    memory does.

    Args:
        max_bytes: bound on the bytes kept (a table costing over a quarter of it is not
            kept); None keeps everything until :meth:`clear` -- a compaction batch pins
            what it prefetched (:meth:`LogReader.prefetch`) until its rewrites are done.
    """

    def __init__(self, max_bytes: int | None = DEFAULT_CACHE_BYTES):
        self.max_bytes = max_bytes
        #: key -> (table, fixed bytes, backing)
        self._items: OrderedDict[tuple[str, int], tuple[pa.Table, int, int]] = OrderedDict()
        #: backing -> [buffer bytes, number of kept tables on it]
        self._backings: dict[int, list[int]] = {}
        #: object key -> the first row groups of its kept tables
        self._by_path: dict[str, set[int]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """The memory (bytes) the kept tables are charged, shared buffers once."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: tuple[str, int]) -> pa.Table | None:
        """The kept table of ``key`` (now the most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: tuple[str, int], table: pa.Table) -> None:
        """Keep ``table`` under ``key`` (a key already kept keeps its table), evicting the
        least recently used tables until the charged bytes are within ``max_bytes``."""
        if self.max_bytes == 0:
            return  # keeps nothing (measuring a table is not free)
        fixed, backing, buffer_bytes = table_memory(table)
        if self.max_bytes is not None and fixed + buffer_bytes > self.max_bytes // 4:
            return  # too big to be worth keeping
        with self._lock:
            if key in self._items:
                return
            self._items[key] = (table, fixed, backing)
            self._by_path.setdefault(key[0], set()).add(key[1])
            shared = self._backings.get(backing)
            if shared is None:
                self._backings[backing] = [buffer_bytes, 1]
                self._bytes += fixed + buffer_bytes
            else:
                shared[1] += 1
                self._bytes += fixed
                if buffer_bytes > shared[0]:
                    self._bytes += buffer_bytes - shared[0]
                    shared[0] = buffer_bytes
            while self.max_bytes is not None and self._bytes > self.max_bytes and self._items:
                self._drop(next(iter(self._items)))

    def _drop(self, key: tuple[str, int]) -> None:
        """Forget one kept table (caller holds the lock)."""
        _, fixed, backing = self._items.pop(key)
        self._bytes -= fixed
        shared = self._backings[backing]
        shared[1] -= 1
        if shared[1] == 0:
            del self._backings[backing]
            self._bytes -= shared[0]
        groups = self._by_path[key[0]]
        groups.discard(key[1])
        if not groups:
            del self._by_path[key[0]]

    def discard(self, key: tuple[str, int]) -> None:
        """Drop one table (if kept)."""
        with self._lock:
            if key in self._items:
                self._drop(key)

    def discard_object(self, path: str) -> None:
        """Drop every kept table of the object ``path`` (no segment names it any more)."""
        with self._lock:
            for first_row_group in list(self._by_path.get(path, ())):
                self._drop((path, first_row_group))

    def clear(self) -> None:
        """Drop every table."""
        with self._lock:
            self._items.clear()
            self._backings.clear()
            self._by_path.clear()
            self._bytes = 0


class LogReader:
    """Reads committed records of any partition of a catalog.

    Args:
        catalog: the catalog whose segments are read (its state is read under its lock).
        cache: shared decoded-segment cache.
        drop_retired: drop the cached tables of an object as soon as a commit leaves it
            named by no segment (a compaction swap, DeleteRecords): new reads never ask for
            them again, so they would only crowd out live segments until evicted. For a
            long-lived reader (the broker's); it adds a listener to ``catalog``.
    """

    def __init__(self, catalog: Catalog, cache: SegmentCache | None = None, *, drop_retired: bool = False):
        self.catalog = catalog
        self.store = catalog.store
        self.cache = cache if cache is not None else SegmentCache()
        if drop_retired:
            catalog.add_listener(self._drop_unreferenced)

    def _drop_unreferenced(self, version: int, actions: list[dict]) -> None:
        """Catalog listener: forget the cached tables of objects this commit left unreferenced."""
        state = self.catalog.state
        for path in {a["path"] for a in actions if a["action"] in (REMOVE_SEGMENT, RETIRE_OBJECT)}:
            if state.reference_count(path) == 0:
                self.cache.discard_object(path)

    def segment_table(self, segment: SegmentInfo) -> pa.Table:
        """All records of one segment (RECORD_SCHEMA), decoded once and cached."""
        key = (segment.path, segment.row_group_start)
        table = self.cache.get(key)
        if table is None:
            table = self.store.read_object(
                segment.path, lambda f: read_segment(f, self.store.uri(segment.path), segment.row_groups))
            self._check_count(segment, table)
            self.cache.put(key, table)
        return table

    def prefetch(self, segments: Iterable[SegmentInfo], threads: int = 1,
                 pool: ThreadPoolExecutor | None = None) -> dict[tuple[str, int], pa.Table]:
        """Decode ``segments`` into the cache, reading each object ONCE for all the segments
        it holds (:func:`~txlake.formats.records.read_row_group_sets`): a flush object holds
        a segment of every partition it flushed, and a merge of many partitions would
        otherwise open and parse it once per partition. Objects are read ``threads`` at a
        time (Parquet decoding releases the GIL), or on ``pool`` when given (a compaction
        round's workers, which release their memory at its end). Segments already cached are
        skipped.

        Returns:
            The tables read, by cache key ``(object key, first row group)`` -- also when the
            cache declined to keep them (a small or zero-byte cache).

        Raises:
            as :meth:`segment_table` (the first failing object's error).
        """
        by_path: dict[str, list[SegmentInfo]] = {}
        for seg in segments:
            if self.cache.get((seg.path, seg.row_group_start)) is None:
                by_path.setdefault(seg.path, []).append(seg)

        read: dict[tuple[str, int], pa.Table] = {}

        def read_object(path: str) -> None:
            segs = by_path[path]
            tables = self.store.read_object(
                path, lambda f: read_row_group_sets(f, self.store.uri(path), [s.row_groups for s in segs]))
            for seg, table in zip(segs, tables):
                self._check_count(seg, table)
                key = (seg.path, seg.row_group_start)
                self.cache.put(key, table)
                read[key] = table  # dict item assignment is atomic

        if pool is None and (threads <= 1 or len(by_path) < 2):
            for path in by_path:
                read_object(path)
            return read
        with contextlib.nullcontext(pool) if pool is not None else \
                ThreadPoolExecutor(min(threads, len(by_path)), thread_name_prefix="txlake-prefetch") as pool:
            futures = [pool.submit(read_object, path) for path in by_path]
            try:
                for f in futures:
                    f.result()
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        return read

    def _check_count(self, segment: SegmentInfo, table: pa.Table) -> None:
        if segment.record_count != table.num_rows:
            from txlake.formats.errors import CorruptObjectError

            raise CorruptObjectError(self.store.uri(segment.path),
                                     f"holds {table.num_rows} records of {segment.topic} [{segment.partition}], "
                                     f"the catalog expects {segment.record_count}")

    def read(self, topic: str, partition: int, start: int, end: int, max_records: int | None = None) -> pa.Table:
        """Records with ``start <= offset < end`` (at most ``max_records``), in offset order.

        Offsets may have gaps (control records, compaction); an empty table means no
        committed record in the range. Reading stops before an unreadable segment if
        records precede it.

        Raises:
            UnknownTopicError: a missing partition.
            CorruptObjectError, UnsupportedFormatVersionError, ObjectNotFoundError: the
                first segment to read is unreadable (the error names its object).
        """
        with self.catalog.lock:
            segments = self.catalog.state.partition(topic, partition).segments_from(start)
        pieces: list[pa.Table] = []
        count = 0
        for seg in segments:
            if seg.base_offset >= end or (max_records is not None and count >= max_records):
                break
            try:
                table = self.segment_table(seg)
            except (FormatError, FileNotFoundError):
                if pieces:
                    break  # return what precedes the unreadable segment; the next read reports it
                raise
            if seg.base_offset < start or seg.last_offset >= end:
                # offsets ascend within a segment: a zero-copy slice, found by binary search
                offsets = table.column("offset").to_numpy()
                lo, hi = np.searchsorted(offsets, [start, end])
                table = table.slice(int(lo), int(hi - lo))
            if max_records is not None and count + table.num_rows > max_records:
                table = table.slice(0, max_records - count)
            if table.num_rows:
                pieces.append(table)
                count += table.num_rows
        if not pieces:
            return RECORD_SCHEMA.empty_table()
        return pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]


def visible_records(table: pa.Table, aborted: list) -> pa.Table:
    """The records a consumer returns from fetched rows: control records dropped, and the
    records of ``aborted`` transactions (entries of the aborted-transaction index with
    ``producer_id``, ``first_offset``, ``last_offset``) dropped -- what Kafka's consumer
    does with a read_committed fetch. With ``aborted=[]`` only control records go
    (read_uncommitted)."""
    control = table.column("is_control").to_numpy(zero_copy_only=False)
    if not aborted and not control.any():
        return table
    keep = ~control
    if aborted:
        pids = table.column("producer_id").to_numpy()
        offsets = table.column("offset").to_numpy()
        transactional = table.column("is_transactional").to_numpy(zero_copy_only=False)
        for txn in aborted:
            keep &= ~(transactional & (pids == txn.producer_id)
                      & (offsets >= txn.first_offset) & (offsets <= txn.last_offset))
    return table.filter(pa.array(keep))
