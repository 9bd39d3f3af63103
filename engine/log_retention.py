"""Time and size retention (``cleanup.policy=delete``): which whole segments go, as Kafka's
``UnifiedLog.deleteOldSegments`` decides it (``deleteRetentionMsBreachedSegments`` and
``deleteRetentionSizeBreachedSegments``).

This module only decides. The caller applies a decision with ``Broker.delete_records``,
which advances the log start offset, drops the segments below it and keeps the producer
state they produced (KIP-360). Rules:

* Only topics whose ``cleanup.policy`` includes ``delete``.
* ``retention.ms`` (-1: unlimited): a segment goes when ``now - max_timestamp > retention.ms``
  (its newest record is older than the retention).
* ``retention.bytes`` (-1: unlimited): oldest segments go while the partition stays at or
  above ``retention.bytes`` without them.
* Segments go from the start of the log only, and only while each one qualifies: the
  first segment that does not qualify stops the deletion (Kafka's ``deletableSegments``).
* A segment goes only if it lies wholly below the high watermark, so the log start
  offset never passes it. Every segment the catalog names is committed, hence below it.

The new log start offset is the base offset of the first remaining segment, or the high
watermark when none remains.
"""

from __future__ import annotations

from dataclasses import dataclass

from txlake.catalog.state import CatalogState, PartitionState, SegmentInfo
from txlake.catalog.topic_config import cleanup_policies, effective_config


@dataclass(frozen=True)
class RetentionTarget:
    """A partition whose log start offset retention moves forward.

    Attributes:
        log_start_offset: the new log start offset (an offset, exclusive end of what goes).
        segments: how many segments go; bytes: their total size (bytes).
    """

    topic: str
    partition: int
    log_start_offset: int
    segments: int
    bytes: int


def _deletable(p: PartitionState, retention_ms: int, retention_bytes: int, now_ms: int) -> list[SegmentInfo]:
    """The leading segments of ``p`` that time or size retention deletes."""
    live = [s for s in p.segments if s.last_offset >= p.log_start_offset]
    gone: list[SegmentInfo] = []
    excess = p.size_bytes() - retention_bytes if retention_bytes >= 0 else -1
    for seg in live:
        if seg.last_offset >= p.high_watermark:  # never past the high watermark
            break
        by_time = retention_ms >= 0 and now_ms - seg.max_timestamp > retention_ms
        by_size = retention_bytes >= 0 and excess - seg.size_bytes >= 0
        if not (by_time or by_size):
            break
        gone.append(seg)
        excess -= seg.size_bytes
    return gone


def retention_targets(state: CatalogState, now_ms: int) -> list[RetentionTarget]:
    """The partitions of ``state`` whose segments ``retention.ms`` / ``retention.bytes`` delete.

    Args:
        state: the catalog state (committed segments only).
        now_ms: the current time, ms since the epoch.

    Returns:
        One target per partition that loses at least one segment, in topic and partition order.
    """
    targets: list[RetentionTarget] = []
    for name in sorted(state.topics):
        topic = state.topics[name]
        config = effective_config(topic.config)
        if "delete" not in cleanup_policies(config):
            continue
        retention_ms, retention_bytes = int(config["retention.ms"]), int(config["retention.bytes"])
        if retention_ms < 0 and retention_bytes < 0:
            continue
        for p in topic.partitions:
            gone = _deletable(p, retention_ms, retention_bytes, now_ms)
            if not gone:
                continue
            remaining = [s for s in p.segments if s.base_offset > gone[-1].last_offset]
            start = remaining[0].base_offset if remaining else p.high_watermark
            assert p.log_start_offset < start <= p.high_watermark, "retention only moves the log start forward"
            targets.append(RetentionTarget(name, p.partition, start, len(gone), sum(s.size_bytes for s in gone)))
    return targets
