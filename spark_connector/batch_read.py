"""``spark.read.format("txlake")``: committed records of a storage root, as Spark's Kafka source.

Planning (:meth:`TxlakeBatchReader.partitions`, in a Python worker Spark starts for the
driver) opens the catalog ONCE -- one snapshot -- and resolves, per topic partition of the
subscription, the offset range to read: from ``startingOffsets`` (default earliest = the
log start offset) up to ``endingOffsets`` (default latest = the last stable offset under
``read_committed``, the high watermark under ``read_uncommitted``). Every range is cut
into Spark input partitions as Spark's ``KafkaOffsetRangeCalculator`` does (one per topic
partition at least, more for ``minPartitions`` / ``maxRecordsPerPartition``), and each
input partition carries everything its task needs: the segments (object, row groups,
offset and timestamp ranges) the snapshot names for its offsets and the aborted
transactions of that range. Tasks (:meth:`TxlakeBatchReader.read`, in Spark's Python
workers) therefore never look at the catalog again and never talk to a writer: the
result is exactly the snapshot's committed records, whatever commits meanwhile, and no
writer lease is involved.

A task reads its segments' row groups and keeps the records a read_committed Kafka
consumer returns: offsets inside the range, no control records (transaction markers),
no records of aborted transactions (``engine.log_reader.visible_records``, the
consumer's own filter). It yields ``pyarrow.RecordBatch`` es with Spark's Kafka-source
columns.

Filters Spark pushes (``spark.sql.python.filterPushdown.enabled=true``) on ``topic``,
``partition``, ``offset`` and ``timestamp`` (=, <, <=, >, >=, IN) narrow the planned
ranges, drop segments whose catalog min/max offset or timestamp cannot match, and drop
row groups whose Parquet statistics cannot match; they are then applied exactly, so
Spark does not evaluate them again.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (DataSourceReader, EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In,
                                    InputPartition, LessThan, LessThanOrEqual)

from txlake.catalog.state import CatalogState, PartitionState, SegmentInfo

from .options import (EARLIEST, LATEST, READ_COMMITTED, OffsetSpec, OptionError, ReadOptions, Subscription,
                      parse_read_options)

log = logging.getLogger(__name__)

__all__ = [
    "DataLossError", "OffsetRange", "PushedFilters", "SegmentRef", "TxlakeBatchReader", "TxlakeInputPartition",
    "arrow_schema", "kafka_struct", "open_snapshot", "plan_input_partitions", "read_input_partition",
    "resolve_offsets", "split_ranges", "subscribed_partitions",
]

#: at most this many rows, and about this many bytes, per RecordBatch a task yields
BATCH_ROWS = 65_536
BATCH_BYTES = 32 * 1024 * 1024
_MS = 1000  # microseconds per millisecond
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


class DataLossError(RuntimeError):
    """Offsets a query asks for are no longer in the log (retention, compaction, a deleted or
    re-created topic), and ``failOnDataLoss`` is true -- Spark's Kafka source fails the same way."""


# ------------------------------------------------------------------ schema
def kafka_struct(include_headers: bool):
    """Spark's Kafka-source schema as a ``StructType`` (``KafkaRecordToRowConverter.kafkaSchema``)."""
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField, StructType,
                                   TimestampType)

    fields = [StructField("key", BinaryType()), StructField("value", BinaryType()),
              StructField("topic", StringType()), StructField("partition", IntegerType()),
              StructField("offset", LongType()), StructField("timestamp", TimestampType()),
              StructField("timestampType", IntegerType())]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType(
            [StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)


def arrow_schema(schema) -> pa.Schema:
    """The Arrow schema Spark expects for RecordBatches of ``schema`` (PySpark's own conversion, UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def _check_schema(schema, include_headers: bool) -> None:
    """Accept the Kafka-source schema or a user-declared one (``.schema(...)``) made of some of
    its columns, with their types, in any order; a task then reads only those columns.

    Raises:
        OptionError: a declared column that is not a Kafka-source column (``headers`` without
            ``includeHeaders=true`` is not), one declared twice, or one of another type --
            naming the column, its declared type and the expected one.
    """
    full = kafka_struct(True)
    expected = {f.name: f.dataType for f in full.fields}
    columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in kafka_struct(include_headers).fields)
    seen = set()
    for f in schema.fields:
        if f.name in seen:
            raise OptionError(None, f"the declared schema names column '{f.name}' twice")
        seen.add(f.name)
        if f.name not in expected or (f.name == "headers" and not include_headers):
            hint = (" (it needs option includeHeaders=true)" if f.name == "headers"
                    else "; a declared schema is a subset of these columns")
            raise OptionError(None, f"the declared schema has column '{f.name}', which the txlake source does not "
                                    f"have{hint}; the source's columns are those of Spark's Kafka source: {columns}")
        if f.dataType != expected[f.name]:
            raise OptionError(None, f"the declared schema gives column '{f.name}' type {f.dataType.simpleString()}; "
                                    f"the txlake source has it as {expected[f.name].simpleString()}")
    if not schema.fields:
        raise OptionError(None, f"the declared schema has no column; the source's columns are: {columns}")


# ------------------------------------------------------------------ planned pieces
@dataclass(frozen=True)
class SegmentRef:
    """The part of :class:`~txlake.catalog.state.SegmentInfo` a task needs (object key, row groups, ranges)."""

    path: str
    row_group_start: int
    row_group_count: int
    base_offset: int
    last_offset: int
    record_count: int
    min_timestamp: int
    max_timestamp: int

    @classmethod
    def of(cls, s: SegmentInfo) -> "SegmentRef":
        return cls(s.path, s.row_group_start, s.row_group_count, s.base_offset, s.last_offset, s.record_count,
                   s.min_timestamp, s.max_timestamp)

    @property
    def row_groups(self) -> list[int]:
        return list(range(self.row_group_start, self.row_group_start + self.row_group_count))


class TxlakeInputPartition(InputPartition):
    """One Spark task: offsets ``start <= offset < end`` of one topic partition.

    Attributes:
        topic / partition / start / end: the range (``end`` exclusive, at most the snapshot's
            LSO or high watermark).
        segments: the snapshot's segments holding offsets of the range (in offset order).
        aborted: ``(producer_id, first_offset, last_offset)`` of the aborted transactions with
            records in the range (empty under read_uncommitted).
        catalog_version: the catalog version of the snapshot (for messages).
    """

    def __init__(self, topic: str, partition: int, start: int, end: int, segments: Sequence[SegmentRef],
                 aborted: Sequence[tuple[int, int, int]], catalog_version: int):
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.segments = tuple(segments)
        self.aborted = tuple(aborted)
        self.catalog_version = catalog_version

    def __repr__(self) -> str:
        return (f"TxlakeInputPartition({self.topic}-{self.partition} [{self.start}, {self.end}), "
                f"{len(self.segments)} segments, catalog v{self.catalog_version})")


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``start <= offset < end`` of ``topic``-``partition`` (Spark's ``KafkaOffsetRange``)."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


# ------------------------------------------------------------------ pushed filters
@dataclass
class PushedFilters:
    """Filters on topic, partition, offset and timestamp that the reader applies itself.

    Attributes:
        topics / partitions / offsets: allowed values (None = any).
        offset_lo / offset_hi: ``offset_lo <= offset < offset_hi``.
        ts_lo / ts_hi: ``ts_lo <= timestamp_us <= ts_hi`` (microseconds, inclusive).
        ts_in: allowed timestamps in microseconds (None = any).
        ts_ops: every timestamp comparison as ``(op, micros)``, applied exactly to rows.
    """

    topics: frozenset | None = None
    partitions: frozenset | None = None
    offsets: frozenset | None = None
    offset_lo: int = 0
    offset_hi: int | None = None
    ts_lo: int | None = None
    ts_hi: int | None = None
    ts_in: frozenset | None = None
    ts_ops: list = field(default_factory=list)

    def push(self, f: Filter) -> bool:
        """Take ``f`` if it is one the reader applies (True), else leave it to Spark (False)."""
        attr = getattr(f, "attribute", None)
        if not isinstance(f, (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual, In)):
            return False
        if attr not in (("topic",), ("partition",), ("offset",), ("timestamp",)):
            return False
        column = attr[0]
        values = tuple(f.value) if isinstance(f, In) else (f.value,)
        if column == "topic":
            if not isinstance(f, (EqualTo, In)) or not all(isinstance(v, str) for v in values):
                return False
            self.topics = _meet(self.topics, values)
            return True
        if column in ("partition", "offset"):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                return False
            if column == "partition":
                if not isinstance(f, (EqualTo, In)):
                    return False
                self.partitions = _meet(self.partitions, values)
                return True
            lo, hi = _int_bounds(f, values)
            self.offset_lo = max(self.offset_lo, lo)
            self.offset_hi = hi if self.offset_hi is None else (min(self.offset_hi, hi) if hi is not None else self.offset_hi)
            if isinstance(f, (EqualTo, In)):
                self.offsets = _meet(self.offsets, values)
            return True
        micros = [_micros(v) for v in values]
        if any(m is None for m in micros):
            return False
        if isinstance(f, (EqualTo, In)):
            self.ts_in = _meet(self.ts_in, micros)
            lo, hi = min(micros), max(micros)
        else:
            m = micros[0]
            lo = m + 1 if isinstance(f, GreaterThan) else (m if isinstance(f, GreaterThanOrEqual) else None)
            hi = m - 1 if isinstance(f, LessThan) else (m if isinstance(f, LessThanOrEqual) else None)
            self.ts_ops.append((type(f).__name__, m))
        if lo is not None:
            self.ts_lo = lo if self.ts_lo is None else max(self.ts_lo, lo)
        if hi is not None:
            self.ts_hi = hi if self.ts_hi is None else min(self.ts_hi, hi)
        return True

    def offsets_overlap(self, first: int, last: int) -> bool:
        """Whether offsets ``first..last`` (inclusive) may hold an offset the filters allow."""
        if last < self.offset_lo or (self.offset_hi is not None and first >= self.offset_hi):
            return False
        return self.offsets is None or any(first <= o <= last for o in self.offsets)

    def timestamps_overlap(self, min_ms: int, max_ms: int) -> bool:
        """Whether records with timestamps in ``[min_ms, max_ms]`` (ms) may pass the timestamp filters."""
        if self.ts_lo is not None and max_ms * _MS < self.ts_lo:
            return False
        if self.ts_hi is not None and min_ms * _MS > self.ts_hi:
            return False
        if self.ts_in is not None and not any(min_ms * _MS <= t <= max_ms * _MS for t in self.ts_in):
            return False
        return True

    @property
    def filters_timestamps(self) -> bool:
        return self.ts_lo is not None or self.ts_hi is not None or self.ts_in is not None

    def row_mask(self, offsets: np.ndarray, ts_ms: np.ndarray) -> np.ndarray | None:
        """The rows passing the offset-set and timestamp filters (None = all)."""
        mask = None
        if self.offsets is not None:
            mask = np.isin(offsets, np.fromiter(self.offsets, dtype=np.int64))
        if self.filters_timestamps:
            us = ts_ms.astype(np.int64) * _MS
            m = np.ones(len(us), dtype=bool)
            if self.ts_lo is not None:
                m &= us >= self.ts_lo
            if self.ts_hi is not None:
                m &= us <= self.ts_hi
            if self.ts_in is not None:
                m &= np.isin(us, np.fromiter(self.ts_in, dtype=np.int64))
            mask = m if mask is None else mask & m
        return mask


def _meet(current: frozenset | None, values: Iterable) -> frozenset:
    new = frozenset(values)
    return new if current is None else current & new


def _int_bounds(f: Filter, values: tuple) -> tuple[int, int | None]:
    """``[lo, hi)`` of an integer comparison."""
    if isinstance(f, (EqualTo, In)):
        return (min(values), max(values) + 1) if values else (0, 0)
    v = values[0]
    if isinstance(f, GreaterThan):
        return v + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return v, None
    if isinstance(f, LessThan):
        return 0, v
    return 0, v + 1


def _micros(value) -> int | None:
    """Microseconds since the epoch of a pushed timestamp literal (naive = UTC), or None."""
    if not isinstance(value, _dt.datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.timezone.utc)
    return (value - _EPOCH) // _dt.timedelta(microseconds=1)


# ------------------------------------------------------------------ snapshot and resolution
_STORES: dict[tuple[str, str], object] = {}
_STORES_LOCK = threading.Lock()


def object_store(opts: ReadOptions):
    """The :class:`~txlake.catalog.storage.ObjectStore` of the options' root (one per process)."""
    from txlake.catalog.storage import ObjectStore

    key = (opts.storage_url, json.dumps(opts.storage_options, sort_keys=True, default=str))
    with _STORES_LOCK:
        store = _STORES.get(key)
        if store is None:
            store = _STORES[key] = ObjectStore(opts.storage_url, dict(opts.storage_options))
        return store


def open_snapshot(opts: ReadOptions):
    """``(store, catalog)`` of the options' storage root: the catalog as of now (no writer lease)."""
    from txlake.catalog.catalog import Catalog

    store = object_store(opts)
    return store, Catalog.open(store)


def subscribed_partitions(state: CatalogState, sub: Subscription, url: str, strict: bool = True) -> list[tuple[str, int]]:
    """The ``(topic, partition)`` pairs a subscription covers in ``state``, sorted.

    ``subscribe``: every partition of the named topics; ``subscribePattern``: every
    partition of the non-internal topics in whose name the pattern is found anywhere
    (``re.search``), as Spark's Kafka source matches it (``SubscribePatternStrategy``:
    ``topicRegex.findFirstIn(name)`` over the admin client's topic listing, which leaves
    out internal topics); ``assign``: the named partitions.

    Raises:
        OptionError: with ``strict``, a named topic or an assigned partition does not
            exist (without ``strict`` they are left out -- a stream waits for them).
    """
    from txlake.catalog.topic_names import is_internal

    out: list[tuple[str, int]] = []
    if sub.kind == "subscribePattern":
        rx = re.compile(sub.pattern)
        for name in sorted(state.topics):
            if not is_internal(name) and rx.search(name):
                out += [(name, p.partition) for p in state.topics[name].partitions]
        return out
    if sub.kind == "subscribe":
        for name in sub.topics:
            t = state.topics.get(name)
            if t is None:
                if strict:
                    raise OptionError("subscribe", f"unknown topic {name!r} in {url} (topics: "
                                                   f"{', '.join(sorted(state.topics)) or 'none'})")
                continue
            out += [(name, p.partition) for p in t.partitions]
        return sorted(out)
    for name, p in sub.partitions:
        t = state.topics.get(name)
        if t is None or p >= len(t.partitions):
            if strict:
                why = (f"unknown topic {name!r}" if t is None
                       else f"topic {name!r} has no partition {p} (it has {len(t.partitions)})")
                raise OptionError("assign", f"{why} in {url}")
            continue
        out.append((name, p))
    return sorted(out)


def bounds(state: CatalogState, topic: str, partition: int, isolation_level: str) -> tuple[int, int]:
    """``(log start offset, end)`` of a partition: end is the LSO (read_committed) or the high watermark."""
    p = state.partition(topic, partition)
    return p.log_start_offset, (p.last_stable_offset if isolation_level == READ_COMMITTED else p.high_watermark)


def offset_for_timestamp(store, pstate: PartitionState, timestamp: int, end: int) -> int | None:
    """The first offset ``>= log start, < end`` whose timestamp is >= ``timestamp`` ms, or None
    (Kafka's ListOffsets by timestamp, as the txlake broker answers it)."""
    from txlake.formats.records import read_segment

    start = pstate.log_start_offset
    for seg in pstate.segments:
        if seg.max_timestamp < timestamp or seg.last_offset < start:
            continue
        if seg.base_offset >= end:
            break
        with store.open_input(seg.path) as f:
            t = read_segment(f, store.uri(seg.path), seg.row_groups, columns=["offset", "timestamp"])
        offsets = t.column("offset").to_numpy()
        stamps = t.column("timestamp").to_numpy()
        hit = np.nonzero((stamps >= timestamp) & (offsets >= start) & (offsets < end))[0]
        if len(hit):
            return int(offsets[hit[0]])
    return None


def resolve_offsets(spec: OffsetSpec, tps: Sequence[tuple[str, int]], store, state: CatalogState,
                    isolation_level: str, starting: bool) -> dict[tuple[str, int], int]:
    """Concrete offsets of ``spec`` for every partition in ``tps`` (Spark's offset resolution).

    ``earliest``/-2 is the log start offset, ``latest``/-1 the LSO (read_committed) or high
    watermark; a timestamp resolves to the first offset with a timestamp >= it, and when
    none has one to latest (an ending timestamp, or ``startingOffsetsByTimestampStrategy=
    latest``) or to an error. Per-partition specs must name exactly the partitions of the
    subscription (Spark: "you must specify all TopicPartitions").

    Raises:
        OptionError: per-partition offsets that do not name exactly ``tps``, or a
            starting timestamp no offset matches (strategy ``error``).
    """
    if spec.kind in ("offsets", "timestamps"):
        named = spec.partitions()
        if named != set(tps):
            fmt = lambda pairs: "[" + ", ".join(f"{t}-{p}" for t, p in sorted(pairs)) + "]"  # noqa: E731
            raise OptionError(spec.option, f"if it names specific partitions it must name all partitions of the "
                                           f"subscription; use -1 for latest, -2 for earliest. Named: {fmt(named)}, "
                                           f"subscribed: {fmt(tps)}")
    out: dict[tuple[str, int], int] = {}
    for tp in tps:
        start, end = bounds(state, tp[0], tp[1], isolation_level)
        if spec.kind == "earliest":
            out[tp] = start
        elif spec.kind == "latest":
            out[tp] = end
        elif spec.kind == "offsets":
            off = spec.offsets[tp]
            out[tp] = start if off == EARLIEST else end if off == LATEST else off
        else:
            ts = spec.timestamp if spec.kind == "timestamp" else spec.timestamps[tp]
            found = offset_for_timestamp(store, state.partition(*tp), ts, end)
            if found is None:
                if starting and not spec.no_match_latest:
                    raise OptionError(spec.option, f"no offset of {tp[0]}-{tp[1]} has a timestamp >= {ts}; set "
                                                   "startingOffsetsByTimestampStrategy=latest to start at the latest "
                                                   "offset instead")
                found = end
            out[tp] = found
    return out


# ------------------------------------------------------------------ ranges and input partitions
def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    out = []
    remaining, start = r.size, r.start
    for part in range(max(parts, 1)):
        this = remaining // (parts - part)
        remaining -= this
        end = min(start + this, r.end)
        out.append(OffsetRange(r.topic, r.partition, start, end))
        start = end
    return out


def split_ranges(ranges: Sequence[OffsetRange], min_partitions: int | None,
                 max_records: int | None) -> list[OffsetRange]:
    """Spark's ``KafkaOffsetRangeCalculator.getRanges``: empty ranges dropped, ranges above
    ``max_records`` offsets cut evenly, then -- while there are fewer than ``min_partitions``
    ranges -- large ranges cut in proportion to their size (small ones stay whole)."""
    ranges = [r for r in ranges if r.size > 0]
    if (min_partitions is None or len(ranges) >= min_partitions) and max_records is None:
        return ranges
    divided = ranges
    if max_records is not None:
        divided = [piece for r in ranges for piece in _divide(r, -(-r.size // max_records))]
    if min_partitions is not None and min_partitions > len(divided):
        total = sum(r.size for r in divided)
        part_count = lambda size, tot, n: max(_round_half_up(size / tot * n), 1)  # noqa: E731
        unsplit = {i for i, r in enumerate(divided) if part_count(r.size, total, min_partitions) == 1}
        split_total = total - sum(divided[i].size for i in unsplit)
        split_min = max(min_partitions - len(unsplit), 1)
        divided = [piece for i, r in enumerate(divided)
                   for piece in ([r] if i in unsplit else _divide(r, part_count(r.size, split_total, split_min)))]
    return [r for r in divided if r.size > 0]


def input_partition(state: CatalogState, r: OffsetRange, isolation_level: str,
                    filters: PushedFilters | None = None) -> TxlakeInputPartition | None:
    """The task reading ``r`` from ``state``: its segments (those the filters cannot rule out)
    and the aborted transactions of the range; None when no segment is left."""
    p = state.partition(r.topic, r.partition)
    segs = []
    for s in p.segments_from(r.start):  # offset order: from the first segment ending at or after r.start
        if s.base_offset >= r.end:
            break
        if filters is None or (filters.offsets_overlap(s.base_offset, s.last_offset)
                               and filters.timestamps_overlap(s.min_timestamp, s.max_timestamp)):
            segs.append(SegmentRef.of(s))
    if not segs:
        return None
    aborted = ([(a.producer_id, a.first_offset, a.last_offset) for a in p.aborted_in(r.start, r.end)]
               if isolation_level == READ_COMMITTED else [])
    return TxlakeInputPartition(r.topic, r.partition, r.start, r.end, segs, aborted, state.version)


def check_range(topic: str, partition: int, start: int, end: int, log_start: int, fail_on_data_loss: bool,
                what: str = "", streaming: bool = False) -> tuple[int, int] | None:
    """Spark's data-loss rules for a resolved range. Offsets below the log start offset are
    gone: an error with ``failOnDataLoss``, else reading starts at the log start. An end
    before the start is an error in a batch query (Spark: "start offset greater than end
    offset"); in a stream it is data loss (offsets went back: a re-created topic), an error
    with ``failOnDataLoss``, else the partition is skipped. Returns the range to read or None."""
    if start < log_start:
        msg = (f"offsets {start}..{log_start - 1} of {topic}-{partition} are no longer available: the log starts at "
               f"{log_start} (retention, compaction or a re-created topic removed them){what}")
        if fail_on_data_loss:
            raise DataLossError(msg + ". Some data may have been lost; set the option failOnDataLoss=false to "
                                      "read from the log start instead")
        log.warning("%s; reading from %d (failOnDataLoss=false)", msg, log_start)
        start = log_start
    if end < start:
        msg = f"the ending offset {end} of {topic}-{partition} is before its starting offset {start}{what}"
        if not streaming:
            raise OptionError(None, msg + " (an ending offset is never past the partition's last stable offset, or "
                                          "high watermark under read_uncommitted)")
        if fail_on_data_loss:
            raise DataLossError(msg + "; set the option failOnDataLoss=false to skip the partition")
        log.warning("%s; skipping it (failOnDataLoss=false)", msg)
        return None
    return start, end


def plan_input_partitions(state: CatalogState, opts: ReadOptions, starts: dict, ends: dict,
                          filters: PushedFilters | None = None) -> list[TxlakeInputPartition]:
    """Input partitions reading ``starts[tp] <= offset < ends[tp]`` of each partition, split by
    ``minPartitions`` / ``maxRecordsPerPartition`` and narrowed by the pushed filters."""
    filters = filters or PushedFilters()
    ranges = []
    for tp in sorted(ends):
        topic, partition = tp
        if filters.topics is not None and topic not in filters.topics:
            continue
        if filters.partitions is not None and partition not in filters.partitions:
            continue
        start, end = starts[tp], ends[tp]
        start, end = max(start, filters.offset_lo), end if filters.offset_hi is None else min(end, filters.offset_hi)
        if start < end:
            ranges.append(OffsetRange(topic, partition, start, end))
    out = []
    for r in split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition):
        part = input_partition(state, r, opts.isolation_level, filters)
        if part is not None:
            out.append(part)
    return out


# ------------------------------------------------------------------ reading
_COLUMNS = ["offset", "timestamp", "timestamp_type", "key", "value", "headers", "producer_id", "is_transactional",
            "is_control"]
#: the segment column each Spark column comes from (topic and partition are the input partition's)
_PARQUET_OF = {"key": "key", "value": "value", "offset": "offset", "timestamp": "timestamp",
               "timestampType": "timestamp_type", "headers": "headers"}
_ABORT_COLUMNS = ("producer_id", "is_transactional")


def _open_log(path: str | None, entry: dict) -> None:
    if path:
        line = json.dumps(entry) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def _row_group_may_match(rg_meta, col_index: dict[str, int], start: int, end: int, filters: PushedFilters) -> bool:
    """Whether a row group's Parquet statistics allow rows in ``[start, end)`` passing the filters."""
    def stats(name):
        st = rg_meta.column(col_index[name]).statistics
        if st is None or not st.has_min_max:
            return None
        return st.min, st.max

    off = stats("offset")
    if off is not None and (off[1] < start or off[0] >= end or not filters.offsets_overlap(off[0], off[1])):
        return False
    if filters.filters_timestamps:
        ts = stats("timestamp")
        if ts is not None and not filters.timestamps_overlap(ts[0], ts[1]):
            return False
    return True


def read_input_partition(store, part: TxlakeInputPartition, schema: pa.Schema, include_headers: bool,
                         filters: PushedFilters | None = None, open_log: str | None = None) -> Iterator[pa.RecordBatch]:
    """The committed records of one input partition as RecordBatches of ``schema`` (at most
    :data:`BATCH_ROWS` rows and about :data:`BATCH_BYTES` bytes each), in offset order.
    ``schema`` names the Spark columns (any subset of the Kafka-source ones, any order); only
    the segment columns they need are decoded. ``include_headers`` is unused (``schema`` says).

    Raises:
        CorruptObjectError / UnsupportedFormatVersionError: a segment object is unreadable
            or holds another number of records than the catalog says (names the object).
        ObjectNotFoundError: a segment object is gone (e.g. removed by compaction longer ago
            than the orphan grace period).
    """
    from txlake.engine.log_reader import visible_records
    from txlake.formats.errors import CorruptObjectError
    from txlake.formats.records import open_segment
    from txlake.formats.versioning import read_all

    from txlake.catalog.state import AbortedTxn

    filters = filters or PushedFilters()
    aborted = [AbortedTxn(*a) for a in part.aborted]
    # only the Parquet columns of the Spark columns asked for (a declared schema may name a few),
    # plus what selecting the committed records needs: offsets, control flags, the producer
    # columns when an aborted transaction is in range, timestamps when filtered on
    needed = {"offset", "is_control"} | {_PARQUET_OF[n] for n in schema.names if n in _PARQUET_OF}
    if aborted:
        needed |= set(_ABORT_COLUMNS)
    if filters.filters_timestamps:
        needed.add("timestamp")
    columns = [c for c in _COLUMNS if c in needed]
    batcher = _Batcher()
    for seg in part.segments:
        location = store.uri(seg.path)
        with store.open_input(seg.path) as f:
            pf = open_segment(f, location)
            meta = pf.metadata
            wanted = seg.row_groups
            if wanted and wanted[-1] >= meta.num_row_groups:
                raise CorruptObjectError(location, f"has {meta.num_row_groups} row groups, the catalog names {wanted}")
            rows = sum(meta.row_group(i).num_rows for i in wanted)
            if rows != seg.record_count:
                raise CorruptObjectError(location, f"holds {rows} records of {part.topic} [{part.partition}] in row "
                                                   f"groups {wanted}, the catalog expects {seg.record_count}")
            leaves = {pf.schema.column(i).path: i for i in range(len(pf.schema))}
            col_index = {n: leaves[n] for n in ("offset", "timestamp")}
            selected = [i for i in wanted if _row_group_may_match(meta.row_group(i), col_index, part.start, part.end, filters)]
            _open_log(open_log, {"object": seg.path, "row_groups": selected, "topic": part.topic,
                                 "partition": part.partition})
            for rgs in _runs(meta, selected):  # a few row groups at a time: memory stays bounded
                table = read_all(pf, location, rgs, columns)
                offsets = table.column("offset").to_numpy()
                keep = (offsets >= part.start) & (offsets < part.end)
                extra = filters.row_mask(offsets, table.column("timestamp").to_numpy() if "timestamp" in needed else None)
                if extra is not None:
                    keep &= extra
                if not keep.all():
                    table = table.filter(pa.array(keep))
                table = visible_records(table, aborted)
                if table.num_rows:
                    yield from batcher.add(_to_spark(table, part, schema, include_headers))
    yield from batcher.drain()


def _runs(meta, row_groups: list[int]) -> Iterator[list[int]]:
    """``row_groups`` in consecutive runs of about :data:`BATCH_ROWS` records (a row group
    alone when it is bigger): one decode call per run rather than per small row group."""
    run: list[int] = []
    rows = 0
    for rg in row_groups:
        run.append(rg)
        rows += meta.row_group(rg).num_rows
        if rows >= BATCH_ROWS:
            yield run
            run, rows = [], 0
    if run:
        yield run


class _Batcher:
    """Cuts tables into RecordBatches of :data:`BATCH_ROWS` rows (fewer when rows are big: about
    :data:`BATCH_BYTES` at most), joining small row groups and holding back a short remainder
    for the next table: every batch handed to Spark has a fixed cost in the JVM, and a row
    group holds as few records as one flush wrote to a partition."""

    def __init__(self):
        self._held: list[pa.Table] = []
        self._rows = 0
        self._bytes = 0

    def add(self, table: pa.Table) -> Iterator[pa.RecordBatch]:
        """Batches that are full once ``table`` is added (the rest is held)."""
        self._held.append(table)
        self._rows += table.num_rows
        self._bytes += table.nbytes
        if self._rows >= BATCH_ROWS or self._bytes >= BATCH_BYTES:
            yield from self._cut(keep_remainder=True)

    def drain(self) -> Iterator[pa.RecordBatch]:
        """Every held row (the last batch may be short)."""
        if self._held:
            yield from self._cut(keep_remainder=False)

    def _cut(self, keep_remainder: bool) -> Iterator[pa.RecordBatch]:
        table = self._held[0] if len(self._held) == 1 else pa.concat_tables(self._held).combine_chunks()
        size = max(1, min(BATCH_ROWS, BATCH_BYTES * table.num_rows // max(table.nbytes, 1)))
        full = table.num_rows - table.num_rows % size if keep_remainder else table.num_rows
        rest = table.slice(full)
        self._held = [rest] if rest.num_rows else []
        self._rows, self._bytes = rest.num_rows, rest.nbytes
        yield from table.slice(0, full).to_batches(max_chunksize=size)


def _to_spark(table: pa.Table, part: TxlakeInputPartition, schema: pa.Schema, include_headers: bool) -> pa.Table:
    """Records (RECORD_SCHEMA columns) -> the Spark columns ``schema`` names (Kafka-source columns,
    any subset, any order), typed as ``schema``. ``include_headers`` is unused: ``schema`` says."""
    import pyarrow.compute as pc

    del include_headers
    n = table.num_rows
    out = []
    for f in schema:
        if f.name == "topic":
            arr = pa.repeat(pa.scalar(part.topic, pa.string()), n)
        elif f.name == "partition":
            arr = pa.repeat(pa.scalar(part.partition, pa.int32()), n)
        elif f.name == "timestamp":
            arr = pc.multiply(table.column("timestamp"), pa.scalar(_MS, pa.int64()))
        else:
            arr = table.column(_PARQUET_OF[f.name])
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
        out.append(arr if arr.type.equals(f.type) else arr.cast(f.type))
    return pa.Table.from_arrays(out, schema=schema)


# ------------------------------------------------------------------ the reader
def _pushdown_enabled() -> bool:
    """Whether Spark will push filters to this reader.

    PySpark (4.1+) refuses a reader that implements ``pushFilters`` when
    ``spark.sql.python.filterPushdown.enabled`` is false (DATA_SOURCE_PUSHDOWN_DISABLED)
    instead of just not pushing. Its planning worker holds that flag in a local
    ``enable_pushdown`` of the frame that creates the reader, so the reader looks it up and,
    without pushdown, presents the default ``pushFilters``: reads then work in any session,
    and skip data when pushdown is enabled.
    """
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if "enable_pushdown" in frame.f_locals and frame.f_code.co_filename.endswith("plan_data_source_read.py"):
            return bool(frame.f_locals["enable_pushdown"])
        frame = frame.f_back
    return True


class _PushFilters:
    """``pushFilters`` of :class:`TxlakeBatchReader`: its own when pushdown is on, else PySpark's default."""

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        import types

        if obj._pushdown:
            return types.MethodType(TxlakeBatchReader._push_filters, obj)
        return types.MethodType(DataSourceReader.pushFilters, obj)


class TxlakeBatchReader(DataSourceReader):
    """The batch reader of ``spark.read.format("txlake")`` (see the module docstring).

    Args:
        options: the data source options (strings; see :mod:`.options` and docs/spark.md).
        schema: the ``StructType`` Spark resolved: the Kafka-source schema, or the user's declared
            subset of it (tasks then decode only the columns it needs); None builds the former.

    Raises:
        OptionError: invalid options (naming the option) or a declared schema that is not a
            subset of the Kafka-source columns with their types (naming the column), at planning.
        DataLossError: requested offsets are gone and ``failOnDataLoss`` is true.
    """

    pushFilters = _PushFilters()

    def __init__(self, options: dict, schema=None):
        self.opts = parse_read_options(options, streaming=False)
        self.schema = schema if schema is not None else kafka_struct(self.opts.include_headers)
        _check_schema(self.schema, self.opts.include_headers)
        self.filters = PushedFilters()
        self._pushdown = _pushdown_enabled()

    def _push_filters(self, filters: list[Filter]) -> list[Filter]:
        """Keep the filters on topic/partition/offset/timestamp (=, <, <=, >, >=, IN); return the others."""
        return [f for f in filters if not self.filters.push(f)]

    def plan(self) -> list[TxlakeInputPartition]:
        """Take the snapshot and plan the input partitions (what :meth:`partitions` returns)."""
        opts = self.opts
        store, catalog = open_snapshot(opts)
        with catalog.lock:
            state = catalog.state
            tps = subscribed_partitions(state, opts.subscription, store.url, strict=True)
            starts = resolve_offsets(opts.starting, tps, store, state, opts.isolation_level, starting=True)
            ends = resolve_offsets(opts.ending, tps, store, state, opts.isolation_level, starting=False)
            checked_starts, checked_ends = {}, {}
            for tp in tps:
                log_start, bound = bounds(state, tp[0], tp[1], opts.isolation_level)
                end = min(ends[tp], bound)  # never past the LSO (or high watermark) of the snapshot
                r = check_range(tp[0], tp[1], starts[tp], end, log_start, opts.fail_on_data_loss)
                if r is not None:
                    checked_starts[tp], checked_ends[tp] = r
            return plan_input_partitions(state, opts, checked_starts, checked_ends, self.filters)

    def partitions(self) -> list[InputPartition]:
        """One catalog snapshot, turned into input partitions (Spark's planning step)."""
        return self.plan()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The committed records of one input partition, as ``pyarrow.RecordBatch`` es."""
        if not isinstance(partition, TxlakeInputPartition):
            return iter(())  # Spark's placeholder when there is nothing to read
        return read_input_partition(object_store(self.opts), partition, arrow_schema(self.schema),
                                    self.opts.include_headers, self.filters, self.opts.open_log)
