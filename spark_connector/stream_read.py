"""``spark.readStream.format("txlake")``: a Structured Streaming source of committed records.

The stream offset is Spark's Kafka-source offset: a JSON object ``{topic: {partition:
next_offset}}`` (partition numbers as strings), ``next_offset`` being the offset after the
last one read, like ``KafkaConsumer.position()``. Spark's driver-side Python process keeps
one :class:`TxlakeStreamReader` for the life of a query and asks it, per micro-batch:

* :meth:`~TxlakeStreamReader.initialOffset` -- only for a query without a checkpoint:
  ``startingOffsets`` (default ``latest``), ``startingTimestamp`` or
  ``startingOffsetsByTimestamp`` resolved against the catalog;
* :meth:`~TxlakeStreamReader.latestOffset` -- the catalog is refreshed and every
  subscribed partition's end is its last stable offset (read_committed; high watermark
  under read_uncommitted), so a micro-batch never holds an undecided transaction's
  records; ``maxOffsetsPerTrigger`` (:class:`ReadMaxRows`) then caps the batch, split
  across partitions in proportion to their backlog exactly as Spark's Kafka source does;
  partitions that appear (a topic created that the subscription covers) start at their
  log start offset;
* :meth:`~TxlakeStreamReader.partitions` -- the batch's ranges turned into input partitions
  (segments and aborted transactions from a fresh catalog snapshot, which agrees with any
  older one below the LSO), read by tasks exactly as batch reads are.

A micro-batch ``[start, end)`` reads the committed records of those offsets; as both ends
are at most the LSO of some snapshot, replaying it after a restart (Spark re-runs the last
batch of its offset log that has no commit) reads exactly the same records. Offsets that
are gone when a batch runs (retention, a deleted or re-created topic) are data loss:
with ``failOnDataLoss`` (default) the query fails, otherwise they are skipped with a warning.

``Trigger.AvailableNow`` is supported (:class:`SupportsTriggerAvailableNow`): the ends
seen when the query starts are the target; batches (still capped by
``maxOffsetsPerTrigger``) stop there.
"""

from __future__ import annotations

import logging
import math
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from .batch_read import (DataLossError, TxlakeInputPartition, _check_schema, arrow_schema, bounds, check_range,
                         kafka_struct, object_store, open_snapshot, plan_input_partitions, read_input_partition,
                         resolve_offsets, subscribed_partitions)
from .options import parse_read_options

log = logging.getLogger(__name__)

__all__ = ["TxlakeStreamReader", "offset_json", "parse_offset", "rate_limit"]

PartitionOffsets = dict[tuple[str, int], int]


def offset_json(offsets: PartitionOffsets) -> dict:
    """``{(topic, partition): offset}`` -> the stream offset ``{topic: {"partition": offset}}``.

    Canonical order (topics, then partitions numerically): Spark compares offsets by their
    JSON text, so equal offsets must serialise alike.
    """
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(off)
    return out


def parse_offset(offset: dict | None) -> PartitionOffsets:
    """The stream offset (as Spark hands it back, e.g. from a checkpoint) -> ``{(topic, partition): offset}``.

    Raises:
        ValueError: not an offset of this source.
    """
    out: PartitionOffsets = {}
    for topic, parts in (offset or {}).items():
        if not isinstance(parts, dict):
            raise ValueError(f"not a txlake stream offset (topic {topic!r} maps to {parts!r}): {offset!r}")
        for p, off in parts.items():
            out[(topic, int(p))] = int(off)
    return out


def rate_limit(limit: int, start: PartitionOffsets, end: PartitionOffsets,
               earliest: PartitionOffsets) -> PartitionOffsets:
    """Spark's Kafka ``rateLimit``: at most about ``limit`` offsets from ``start`` towards ``end``.

    Each partition with a backlog gets ``limit * backlog / total`` offsets (rounded down,
    but at least 1 so small partitions are not starved); partitions not in ``start``
    (new ones) begin at ``earliest``. Offsets, not records, are counted: control records
    and aborted records use offsets too, as in Kafka.
    """
    sizes = {}
    for tp, until in end.items():
        begin = start.get(tp, earliest.get(tp))
        if begin is not None and until - begin > 0:
            sizes[tp] = until - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(end)
    out = {}
    for tp, until in end.items():
        size = sizes.get(tp)
        if size is None:
            out[tp] = until
            continue
        begin = start.get(tp, earliest.get(tp))
        prorate = limit * (size / total)
        n = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(until, begin + n)
    return out


class TxlakeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch reader of ``spark.readStream.format("txlake")`` (see the module docstring).

    Args:
        options: the data source options (strings; see :mod:`.options` and docs/spark.md);
            ``maxOffsetsPerTrigger`` caps each micro-batch, ending options are refused.
        schema: the ``StructType`` Spark resolved: the Kafka-source schema or a declared subset of
            it (``batch_read._check_schema``); None builds the former.

    Raises:
        OptionError: invalid options (naming the option), an unknown subscribed topic when
            the query starts.
        DataLossError: offsets of a micro-batch are gone and ``failOnDataLoss`` is true.
    """

    def __init__(self, options: dict, schema=None):
        self.opts = parse_read_options(options, streaming=True)
        self.schema = schema if schema is not None else kafka_struct(self.opts.include_headers)
        _check_schema(self.schema, self.opts.include_headers)
        self._store = None
        self._catalog = None
        self._target: PartitionOffsets | None = None
        self._latest: PartitionOffsets | None = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_store"] = state["_catalog"] = None  # a catalog holds a lock; tasks need none
        return state

    # -- catalog -----------------------------------------------------------------------
    def _state(self):
        """The catalog state, refreshed to the newest commit (opened on first use)."""
        if self._catalog is None:
            self._store, self._catalog = open_snapshot(self.opts)
        else:
            self._catalog.refresh()
        return self._catalog.state

    def _ends(self, state) -> PartitionOffsets:
        """Every subscribed partition's end now: its LSO (read_committed) or high watermark."""
        tps = subscribed_partitions(state, self.opts.subscription, self._store.url, strict=False)
        return {tp: bounds(state, tp[0], tp[1], self.opts.isolation_level)[1] for tp in tps}

    # -- the DataSourceStreamReader protocol ---------------------------------------------
    def initialOffset(self) -> dict:
        """Where a new query starts: ``startingOffsets`` (default latest) or the starting timestamps.

        Raises:
            OptionError: an unknown subscribed topic or assigned partition; per-partition
                starting offsets that do not name exactly the subscribed partitions; a
                starting timestamp no offset matches (strategy ``error``).
        """
        state = self._state()
        tps = subscribed_partitions(state, self.opts.subscription, self._store.url, strict=True)
        offsets = resolve_offsets(self.opts.starting, tps, self._store, state, self.opts.isolation_level,
                                  starting=True)
        return offset_json(offsets)

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxOffsetsPerTrigger)`` when the option is set, else ``ReadAllAvailable``."""
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next micro-batch: each partition's LSO (or the AvailableNow target),
        capped by ``limit`` when it is a :class:`ReadMaxRows`."""
        begin = parse_offset(start)
        state = self._state()
        latest = dict(self._target) if self._target is not None else self._ends(state)
        self._latest = latest
        if isinstance(limit, ReadMaxRows):
            new = {tp: state.partition(*tp).log_start_offset for tp in latest
                   if tp not in begin and self._exists(state, tp)}
            latest = rate_limit(limit.max_rows, begin, latest, new)
        return offset_json(latest)

    def reportLatestOffset(self) -> dict | None:
        """The ends seen by the last :meth:`latestOffset` (for the query's progress metrics)."""
        return offset_json(self._latest) if self._latest else None

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target of a ``Trigger.AvailableNow`` run: every subscribed partition's end now."""
        self._target = self._ends(self._state())

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        """Input partitions reading ``start <= offset < end`` of every partition in ``end``.

        A partition missing from ``start`` is new and starts at its log start offset.
        Partitions in ``start`` but not in ``end`` are gone; offsets below a log start or an
        end above the current LSO (a re-created topic) are data loss (see the module docstring).
        """
        s, e = parse_offset(start), parse_offset(end)
        opts = self.opts
        state = self._state()
        gone = sorted(set(s) - set(e))
        if gone:
            self._data_loss(f"partitions {', '.join(f'{t}-{p}' for t, p in gone)} are gone")
        starts, ends = {}, {}
        for tp, until in sorted(e.items()):
            if not self._exists(state, tp):
                self._data_loss(f"partition {tp[0]}-{tp[1]} is gone (its topic was deleted)")
                continue
            log_start, bound = bounds(state, tp[0], tp[1], opts.isolation_level)
            begin = s.get(tp)
            if begin is None:
                begin = log_start
                if log_start != 0:
                    self._data_loss(f"added partition {tp[0]}-{tp[1]} starts from {log_start} instead of 0")
            if until > bound:
                self._data_loss(f"offsets up to {until} of {tp[0]}-{tp[1]} were read but the partition now ends "
                                f"at {bound} (was its topic deleted and re-created?)")
                until = bound
            r = check_range(tp[0], tp[1], begin, until, log_start, opts.fail_on_data_loss, streaming=True)
            if r is not None:
                starts[tp], ends[tp] = r
        return list(plan_input_partitions(state, opts, starts, ends))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The committed records of one input partition, as ``pyarrow.RecordBatch`` es."""
        if not isinstance(partition, TxlakeInputPartition):
            return iter(())
        return read_input_partition(object_store(self.opts), partition, arrow_schema(self.schema),
                                    self.opts.include_headers, None, self.opts.open_log)

    def commit(self, end: dict) -> None:
        """Nothing to do: the source keeps no state per offset (Spark's checkpoint holds it)."""

    def stop(self) -> None:
        """Drop the catalog view."""
        self._catalog = None

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _exists(state, tp) -> bool:
        t = state.topics.get(tp[0])
        return t is not None and tp[1] < len(t.partitions)

    def _data_loss(self, message: str) -> None:
        """Spark's ``reportDataLoss``: fail with ``failOnDataLoss``, else warn."""
        if self.opts.fail_on_data_loss:
            raise DataLossError(message + ". Some data may have been lost; set the option failOnDataLoss=false "
                                          "to go on without it")
        log.warning("%s. Some data may have been lost (failOnDataLoss=false)", message)
