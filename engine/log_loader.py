"""Rebuilding producer state when a process becomes the writer (Kafka's ``LogLoader`` /
``UnifiedLog.loadProducerState``): the latest snapshot, then a replay of each partition's
log from the snapshot's end offset to its high watermark.

A missing or corrupt snapshot is not fatal: the state is rebuilt from the whole log,
because every row carries its batch's producer id, epoch, base sequence, base offset and
last offset delta.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import pyarrow.compute as pc

from txlake.catalog.state import CatalogState
from txlake.catalog.storage import ObjectStore, retry_storage
from txlake.formats.errors import FormatError
from txlake.formats.producer_state import decode_snapshot

from .log_reader import LogReader
from .producer_state import ProducerStateManager, increment_sequence

log = logging.getLogger(__name__)


def load_producer_states(store: ObjectStore, state: CatalogState, reader: LogReader) -> dict[tuple[str, int], ProducerStateManager]:
    """Producer state of every partition of ``state``: snapshot + replay of the log after it.

    Raises:
        CorruptObjectError, ObjectNotFoundError: a segment that must be replayed is unreadable.
    """
    rows_by_tp: dict[tuple[str, int], list] = defaultdict(list)
    ends: dict = {}
    if state.producer_snapshot:
        try:
            key = state.producer_snapshot
            rows, ends = decode_snapshot(retry_storage(lambda: store.get(key), store.uri(key), "reading"),
                                         store.uri(key))
            for row in rows:
                rows_by_tp[(row["topic"], row["partition"])].append(row)
        except (FormatError, FileNotFoundError) as exc:
            log.warning("producer-state snapshot unusable (%s); rebuilding from the whole log", exc)
            rows_by_tp, ends = defaultdict(list), {}
    managers = {}
    for topic in state.topics.values():
        covered = ends.get(topic.name)
        for p in topic.partitions:
            psm = ProducerStateManager(topic.name, p.partition)
            start = p.log_start_offset
            if covered and covered.get("topic_id") == topic.topic_id:
                psm.load_rows(rows_by_tp.get((topic.name, p.partition), []))
                start = max(start, covered["end_offsets"][p.partition])
            replay_producer_state(reader, psm, start, p.high_watermark)
            managers[(topic.name, p.partition)] = psm
    return managers


def replay_producer_state(reader: LogReader, psm: ProducerStateManager, start: int, end: int) -> None:
    """Apply the batches (data and transaction markers) of offsets ``[start, end)`` of
    ``psm``'s partition, in offset order, as Kafka's ``ProducerStateManager`` does on load."""
    if start >= end:
        return
    table = reader.read(psm.topic, psm.partition, start, end)
    table = table.filter(pc.greater_equal(table.column("producer_id"), 0))
    if table.num_rows == 0:
        return
    batches = table.group_by(["producer_id", "base_offset"], use_threads=False).aggregate([
        ("producer_epoch", "max"), ("base_sequence", "max"), ("last_offset_delta", "max"),
        ("timestamp", "max"), ("is_transactional", "max"), ("is_control", "max"),
        ("coordinator_epoch", "max")]).sort_by("base_offset")
    for b in batches.to_pylist():
        if b["is_control_max"]:
            psm.complete_txn(b["producer_id"], b["producer_epoch_max"], b["coordinator_epoch_max"], b["timestamp_max"])
            continue
        last_seq = increment_sequence(b["base_sequence_max"], b["last_offset_delta_max"])
        psm.update(b["producer_id"], b["producer_epoch_max"], b["base_sequence_max"], last_seq, b["base_offset"],
                   b["base_offset"] + b["last_offset_delta_max"], b["timestamp_max"], b["is_transactional_max"])
