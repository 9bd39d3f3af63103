"""The committed view of a topic: which objects, row groups and rows a reader may see.

Shared by every engine that reads txlake data without a broker (DuckDB, Spark). The
catalog alone decides what is committed (DESIGN.md "Storage model"); per partition a
reader sees the records with

* ``log_start_offset <= offset < last_stable_offset`` (read_committed) or
  ``< high_watermark`` (read_uncommitted),
* from the segments the catalog names (an object may also hold rows the catalog no
  longer names -- e.g. a partition compacted into another object, or a deleted
  topic -- which must never show up, or show up twice),
* that are not control records (transaction markers),
* and that do not belong to an aborted transaction: a record of producer ``pid`` with
  ``first_offset <= offset <= last_offset`` of an aborted transaction of its partition
  (Kafka's aborted-transaction index). The catalog will carry these per partition;
  :func:`aborted_transactions` is the one place that reads them.

:func:`topic_view` turns a catalog state into a :class:`TopicView`: the objects to scan
and, per object, whether a topic/offset-range filter is exact for it (``exact=False``:
every row group of the object is named by the catalog, so rows of the topic inside the
committed offset bounds are exactly the committed records) or whether its rows must be
matched against the object's own segments (``exact=True``: the object holds row
groups the catalog no longer names). Knowing which is which needs each object's
row-group count, read once from its Parquet footer (one ranged read) and cached for the
life of the process -- data objects are immutable and their names never reused.

The engines turn a view into their own filter language: :meth:`TopicView.arrow_filter`
gives a ``pyarrow.dataset`` expression; :mod:`txlake.duckdb` builds SQL.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable

from txlake.catalog.state import AbortedTxn, CatalogState, PartitionState, SegmentInfo
from txlake.catalog.storage import ObjectStore
from txlake.formats.errors import FormatError
from txlake.formats.records import KIND as RECORD_KIND
from txlake.formats.records import RECORD_SCHEMA
from txlake.formats.records import VERSION as RECORD_VERSION
from txlake.formats.versioning import check_schema, check_tags, open_parquet

__all__ = [
    "READ_COMMITTED", "READ_UNCOMMITTED", "AbortedTxn", "ObjectScan", "PartitionBounds", "TopicView",
    "aborted_transactions", "object_row_groups", "topic_view", "topic_views", "verify_objects",
]

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"
_ISOLATION_LEVELS = (READ_COMMITTED, READ_UNCOMMITTED)
_FOOTER_THREADS = 16


@dataclass(frozen=True)
class PartitionBounds:
    """Offsets of one partition a reader may see: ``start <= offset < end``.

    Attributes:
        start: the log start offset.
        end: the last stable offset (read_committed) or the high watermark (read_uncommitted).
        high_watermark / last_stable_offset: as the catalog records them.
    """

    partition: int
    start: int
    end: int
    high_watermark: int
    last_stable_offset: int


@dataclass(frozen=True)
class ObjectScan:
    """One object to scan for a topic.

    Attributes:
        key: object key under the storage root; ``uri``: its full URL.
        segments: this topic's live segments in the object, in (partition, offset) order
            (including any wholly outside the partition bounds; see :meth:`TopicView.visible_segments`).
        exact: True when the object holds row groups the catalog does not name, so its
            rows must be matched against ``segments`` (partition and offset range)
            rather than by topic and partition bounds only.
        num_row_groups: row groups in the object (-1 when not checked).
    """

    key: str
    uri: str
    segments: tuple[SegmentInfo, ...]
    exact: bool
    num_row_groups: int = -1


@dataclass
class TopicView:
    """What a reader of one topic scans, and which rows of it are committed.

    Attributes:
        topic / topic_id: the topic (the id changes when a name is deleted and re-created).
        catalog_version: the catalog version the view was built from.
        isolation_level: ``read_committed`` (bounded by the LSO) or ``read_uncommitted``.
        partitions: bounds per partition id (every partition of the topic, even empty ones).
        objects: objects holding visible records, sorted by key; empty for a topic without records.
        aborted: aborted transactions per partition (only partitions that have some).
    """

    topic: str
    topic_id: str
    catalog_version: int
    isolation_level: str
    partitions: dict[int, PartitionBounds]
    objects: list[ObjectScan] = field(default_factory=list)
    aborted: dict[int, list[AbortedTxn]] = field(default_factory=dict)

    @property
    def record_upper_bound(self) -> int:
        """Rows in the named segments of this topic (>= the committed record count)."""
        return sum(s.record_count for o in self.objects for s in o.segments)

    def bounded_partitions(self) -> list[PartitionBounds]:
        """Partitions whose segments hold offsets outside their bounds (they need an offset filter).

        In the common case (no truncated log start, no open transaction) this is empty
        and a scan needs no offset filter at all.
        """
        lo: dict[int, int] = {}
        hi: dict[int, int] = {}
        for obj in self.objects:
            for s in obj.segments:
                lo[s.partition] = min(lo.get(s.partition, s.base_offset), s.base_offset)
                hi[s.partition] = max(hi.get(s.partition, s.last_offset), s.last_offset)
        return [b for p, b in sorted(self.partitions.items())
                if p in lo and (lo[p] < b.start or hi[p] >= b.end)]

    def visible_segments(self) -> list[tuple[ObjectScan, SegmentInfo, int, int]]:
        """``(object, segment, first, last)`` of every segment with visible offsets ``first..last`` (inclusive)."""
        out = []
        for obj in self.objects:
            for s in obj.segments:
                b = self.partitions[s.partition]
                first, last = max(s.base_offset, b.start), min(s.last_offset, b.end - 1)
                if first <= last:
                    out.append((obj, s, first, last))
        return out

    def arrow_filter(self, obj: ObjectScan | None = None):
        """A ``pyarrow.dataset`` expression selecting the committed records of this topic.

        Args:
            obj: the object the expression is applied to; its segments are matched
                exactly when ``obj.exact``. None gives the topic-wide filter (exact for
                objects with ``exact=False``).

        Columns used: topic, partition, offset, is_control, producer_id.
        """
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        f = (ds.field("topic") == self.topic) & ~ds.field("is_control")
        if obj is not None and obj.exact:
            ranges = None
            for o, s, first, last in self.visible_segments():
                if o.key != obj.key:
                    continue
                r = ((ds.field("partition") == s.partition) & (ds.field("offset") >= first)
                     & (ds.field("offset") <= last))
                ranges = r if ranges is None else ranges | r
            f = f & (ranges if ranges is not None else pc.scalar(False))
        else:
            for b in self.bounded_partitions():
                f = f & ~((ds.field("partition") == b.partition)
                          & ((ds.field("offset") < b.start) | (ds.field("offset") >= b.end)))
        for p, txns in sorted(self.aborted.items()):
            for t in txns:
                f = f & ~((ds.field("partition") == p) & (ds.field("producer_id") == t.producer_id)
                          & (ds.field("offset") >= t.first_offset) & (ds.field("offset") <= t.last_offset))
        return f


def aborted_transactions(partition: PartitionState) -> list[AbortedTxn]:
    """The aborted-transaction index of a partition, as the catalog publishes it."""
    return list(partition.aborted_transactions)


# ------------------------------------------------------------------------ footers
_row_groups_cache: dict[tuple[str, str], int] = {}
_cache_lock = threading.Lock()


def object_row_groups(store: ObjectStore, key: str) -> int:
    """Row groups in the record-segment object at ``key`` (read from its footer once, then cached).

    Raises:
        ObjectNotFoundError: the object is gone (names its url).
        CorruptObjectError / UnsupportedFormatVersionError: not a readable segment object
            of a format version this txlake knows, or a column of the record schema is missing
            or of another type (names its url).
        StorageError: any other backend failure.
    """
    cache_key = (store.url, key)
    with _cache_lock:
        n = _row_groups_cache.get(cache_key)
    if n is not None:
        return n
    n = _checked_row_groups(store, key)
    with _cache_lock:
        _row_groups_cache[cache_key] = n
    return n


def _checked_row_groups(store: ObjectStore, key: str) -> int:
    """Read the footer of the segment object at ``key``, check its tags and columns, and return
    its row-group count (errors as :func:`object_row_groups`)."""
    location = store.uri(key)

    def read(f) -> int:
        pf = open_parquet(f, location)
        check_tags(pf.schema_arrow.metadata, RECORD_KIND, RECORD_VERSION, location)
        check_schema(pf.schema_arrow, RECORD_SCHEMA, location)  # else a scan fails, naming no object
        return pf.metadata.num_row_groups
    return store.read_object(key, read)  # retried on a transient failure (503, reset)


def verify_objects(store: ObjectStore, keys: Iterable[str]) -> None:
    """Check the segment objects at ``keys`` again, reading their footers (not the cache): what
    an engine calls when a scan of them failed, to name the object at fault.

    Raises:
        CorruptObjectError / UnsupportedFormatVersionError / ObjectNotFoundError / StorageError:
            the first object that is not a readable segment (names its url).
    """
    for key in keys:
        _checked_row_groups(store, key)


def _row_group_counts(store: ObjectStore, keys: Iterable[str]) -> dict[str, int]:
    keys = list(keys)
    _prefetch_row_groups(store, keys)
    return {k: object_row_groups(store, k) for k in keys}


def _prefetch_row_groups(store: ObjectStore, keys: list[str]) -> None:
    """Read the footers of ``keys`` not cached yet, in parallel. An unreadable object is
    skipped here: it raises when its row groups are asked for (by the topic that names it)."""
    with _cache_lock:
        missing = [k for k in keys if (store.url, k) not in _row_groups_cache]
    if len(missing) > 1:
        def read(key: str) -> None:
            try:
                object_row_groups(store, key)
            except (FormatError, OSError):
                pass

        with ThreadPoolExecutor(min(_FOOTER_THREADS, len(missing)), thread_name_prefix="txlake-footer") as pool:
            list(pool.map(read, missing))


# ------------------------------------------------------------------------ views
def topic_view(store: ObjectStore, state: CatalogState, topic: str, isolation_level: str = READ_COMMITTED,
               check_objects: bool = True) -> TopicView:
    """The committed view of ``topic`` in catalog ``state``.

    Args:
        store: the storage root the state belongs to.
        state: a catalog state (read it under the catalog's lock or from a private Catalog).
        isolation_level: ``read_committed`` (offsets below the LSO, aborted records
            dropped) or ``read_uncommitted`` (below the high watermark, aborted records kept).
        check_objects: read each object's footer (once per process) to learn whether it
            holds row groups the catalog no longer names; False assumes none do (only
            safe before compaction or topic deletion ever ran on the root).

    Raises:
        UnknownTopicError: no such topic.
        ValueError: unknown isolation level.
        CorruptObjectError / UnsupportedFormatVersionError / ObjectNotFoundError /
            StorageError: an object the catalog names is unreadable (with check_objects).
    """
    if isolation_level not in _ISOLATION_LEVELS:
        raise ValueError(f"isolation level must be one of {', '.join(_ISOLATION_LEVELS)}, got {isolation_level!r}")
    t = state.topics.get(topic)
    if t is None:
        from txlake.catalog.errors import UnknownTopicError

        raise UnknownTopicError(f"Unknown topic: {topic}")
    committed = isolation_level == READ_COMMITTED
    bounds: dict[int, PartitionBounds] = {}
    by_key: dict[str, list[SegmentInfo]] = {}
    aborted: dict[int, list[AbortedTxn]] = {}
    visible: set[str] = set()
    for p in t.partitions:
        end = p.last_stable_offset if committed else p.high_watermark
        bounds[p.partition] = PartitionBounds(p.partition, p.log_start_offset, end, p.high_watermark, p.last_stable_offset)
        for s in p.segments:
            by_key.setdefault(s.path, []).append(s)
            if s.last_offset >= p.log_start_offset and s.base_offset < end:
                visible.add(s.path)
        if committed:
            txns = [a for a in aborted_transactions(p) if a.last_offset >= p.log_start_offset and a.first_offset < end]
            if txns:
                aborted[p.partition] = txns
    by_key = {k: v for k, v in by_key.items() if k in visible}
    counts: dict[str, int] = {}
    named: dict[str, set[int]] = {}
    if check_objects and by_key:
        counts = _row_group_counts(store, sorted(by_key))
        for other in state.topics.values():
            for p in other.partitions:
                for s in p.segments:
                    if s.path in by_key:
                        named.setdefault(s.path, set()).update(s.row_groups)
    objects = []
    for key in sorted(by_key):
        segs = tuple(sorted(by_key[key], key=lambda s: (s.partition, s.base_offset)))
        n = counts.get(key, -1)
        if check_objects and max(named.get(key, {-1})) >= n:
            from txlake.formats.errors import CorruptObjectError

            raise CorruptObjectError(store.uri(key), f"has {n} row groups, but the catalog names row group "
                                                     f"{max(named[key])} of it; the object is truncated or was replaced")
        exact = check_objects and named.get(key, set()) != set(range(n))
        objects.append(ObjectScan(key, store.uri(key), segs, exact, n))
    return TopicView(topic, t.topic_id, state.version, isolation_level, bounds, objects, aborted)


def topic_views(store: ObjectStore, state: CatalogState, topics: Iterable[str] | None = None,
                isolation_level: str = READ_COMMITTED, check_objects: bool = True,
                errors: dict[str, Exception] | None = None) -> dict[str, TopicView]:
    """:func:`topic_view` of several topics (all of them by default), reading footers in parallel.

    Args:
        errors: when given, a topic whose objects cannot be read (CorruptObjectError,
            UnsupportedFormatVersionError, ObjectNotFoundError, StorageError -- the message
            names the object) is left out of the result and its error is put here under its
            name, so one unreadable topic does not hide the others; by default the first
            such error is raised.

    Raises:
        as :func:`topic_view` (unreadable objects only without ``errors``).
    """
    names = sorted(state.topics) if topics is None else list(topics)
    if check_objects:
        keys = {s.path for n in names if n in state.topics
                for p in state.topics[n].partitions for s in p.segments}
        _prefetch_row_groups(store, sorted(keys))
    views = {}
    for n in names:
        try:
            views[n] = topic_view(store, state, n, isolation_level, check_objects)
        except (FormatError, OSError) as exc:
            if errors is None:
                raise
            errors[n] = exc
    return views

