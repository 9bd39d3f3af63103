"""Reading committed records of a partition from its segments (Kafka's ``LogSegment.read``).

The catalog says which object and row groups hold which offsets; this module reads
them (through a bounded cache of decoded row groups, so a consumer polling a partition
does not decode the same object twice) and slices the requested offset range.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import numpy as np
import pyarrow as pa

from txlake.catalog.catalog import Catalog
from txlake.catalog.state import SegmentInfo
from txlake.formats.errors import FormatError
from txlake.formats.records import RECORD_SCHEMA, read_row_group_sets, read_segment

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class SegmentCache:
    """An LRU of decoded segments keyed by (object key, first row group), bounded in bytes.

    Args:
        max_bytes: bound on the decoded bytes kept (a table over a quarter of it is not
            kept); None keeps everything until :meth:`clear` -- a compaction batch pins
            what it prefetched (:meth:`LogReader.prefetch`) until its rewrites are done.
    """

    def __init__(self, max_bytes: int | None = DEFAULT_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, int], tuple[pa.Table, int]] = OrderedDict()  # key -> (table, nbytes)
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> pa.Table | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: tuple[str, int], table: pa.Table) -> None:
        if self.max_bytes == 0:
            return  # keeps nothing (``table.nbytes`` is not free)
        size = table.nbytes
        if self.max_bytes is not None and size > self.max_bytes // 4:
            return  # too big to be worth keeping
        with self._lock:
            if key in self._items:
                return
            self._items[key] = (table, size)
            self._bytes += size
            while self.max_bytes is not None and self._bytes > self.max_bytes and self._items:
                _, (_, old_size) = self._items.popitem(last=False)
                self._bytes -= old_size

    def discard(self, key: tuple[str, int]) -> None:
        """Drop one table (if kept)."""
        with self._lock:
            item = self._items.pop(key, None)
            if item is not None:
                self._bytes -= item[1]

    def clear(self) -> None:
        """Drop every table."""
        with self._lock:
            self._items.clear()
            self._bytes = 0


class LogReader:
    """Reads committed records of any partition of a catalog.

    Args:
        catalog: the catalog whose segments are read (its state is read under its lock).
        cache: shared decoded-segment cache.
    """

    def __init__(self, catalog: Catalog, cache: SegmentCache | None = None):
        self.catalog = catalog
        self.store = catalog.store
        self.cache = cache or SegmentCache()

    def segment_table(self, segment: SegmentInfo) -> pa.Table:
        """All records of one segment (RECORD_SCHEMA), decoded once and cached."""
        key = (segment.path, segment.row_group_start)
        table = self.cache.get(key)
        if table is None:
            with self.store.open_input(segment.path) as f:
                table = read_segment(f, self.store.uri(segment.path), segment.row_groups)
            self._check_count(segment, table)
            self.cache.put(key, table)
        return table

    def prefetch(self, segments: Iterable[SegmentInfo],
                 threads: int = 1) -> dict[tuple[str, int], pa.Table]:
        """Decode ``segments`` into the cache, reading each object ONCE for all the segments
        it holds (:func:`~txlake.formats.records.read_row_group_sets`): a flush object holds
        a segment of every partition it flushed, and a merge of many partitions would
        otherwise open and parse it once per partition. Objects are read ``threads`` at a
        time (Parquet decoding releases the GIL). Segments already cached are skipped.

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
            with self.store.open_input(path) as f:
                tables = read_row_group_sets(f, self.store.uri(path), [s.row_groups for s in segs])
            for seg, table in zip(segs, tables):
                self._check_count(seg, table)
                key = (seg.path, seg.row_group_start)
                self.cache.put(key, table)
                read[key] = table  # dict item assignment is atomic

        if threads <= 1 or len(by_path) < 2:
            for path in by_path:
                read_object(path)
            return read
        with ThreadPoolExecutor(min(threads, len(by_path)), thread_name_prefix="txlake-prefetch") as pool:
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
