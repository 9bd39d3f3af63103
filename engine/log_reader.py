"""Reading committed records of a partition from its segments (Kafka's ``LogSegment.read``).

The catalog says which object and row groups hold which offsets; this module reads
them (through a bounded cache of decoded row groups, so a consumer polling a partition
does not decode the same object twice) and slices the requested offset range.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import pyarrow as pa

from txlake.catalog.catalog import Catalog
from txlake.catalog.state import SegmentInfo
from txlake.formats.errors import FormatError
from txlake.formats.records import RECORD_SCHEMA, read_segment

DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class SegmentCache:
    """An LRU of decoded segments keyed by (object key, first row group), bounded in bytes."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._items: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int]) -> pa.Table | None:
        with self._lock:
            table = self._items.get(key)
            if table is not None:
                self._items.move_to_end(key)
            return table

    def put(self, key: tuple[str, int], table: pa.Table) -> None:
        size = table.nbytes
        if size > self.max_bytes // 4:
            return  # too big to be worth keeping
        with self._lock:
            if key in self._items:
                return
            self._items[key] = table
            self._bytes += size
            while self._bytes > self.max_bytes and self._items:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes


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
            if segment.record_count != table.num_rows:
                from txlake.formats.errors import CorruptObjectError

                raise CorruptObjectError(self.store.uri(segment.path),
                                         f"holds {table.num_rows} records of {segment.topic} [{segment.partition}], "
                                         f"the catalog expects {segment.record_count}")
            self.cache.put(key, table)
        return table

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
