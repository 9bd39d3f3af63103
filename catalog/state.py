"""The catalog's state and how each action changes it.

State = latest checkpoint + replay of the commits after it (an event-sourced log, as
Delta Lake's and Iceberg's metadata logs). :meth:`CatalogState.apply` is the only code
that interprets actions, and :meth:`CatalogState.checkpoint_actions` is its inverse: the
actions that rebuild the state from nothing.

Per partition the catalog keeps what a reader needs to build the committed view
without scanning records: the segments (object, row groups, offset range, stats), the
log start offset, the high watermark and the last stable offset (LSO).

Per object it counts the segments naming it. When a commit drops the last one (a
compaction swap, DeleteRecords, DeleteTopics) the object is *retired*: no new reader finds
it, but scans that started earlier may still read it, so it is deleted only a grace period
after it was retired (Kafka's ``file.delete.delay.ms``) and then *forgotten*
(``retire_object`` / ``forget_object`` actions; :mod:`txlake.engine.object_cleaner`).
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
from typing import Any

from .errors import CatalogError

# Action kinds.
CREATE_TOPIC = "create_topic"
DELETE_TOPIC = "delete_topic"
#: a topic's config overrides replaced by ``config`` (IncrementalAlterConfigs; Kafka's ``ConfigRecord``)
TOPIC_CONFIG = "topic_config"
#: a topic grows to ``num_partitions`` partitions, the new ones empty (CreatePartitions; Kafka's ``PartitionRecord``)
ADD_PARTITIONS = "add_partitions"
ADD_SEGMENT = "add_segment"
REMOVE_SEGMENT = "remove_segment"
LOG_START_OFFSET = "log_start_offset"
PARTITION_STATE = "partition_state"
LEASE = "lease"
LEASE_RELEASE = "lease_release"
PRODUCER_ID_BLOCK = "producer_id_block"
PRODUCER_SNAPSHOT = "producer_snapshot"
ABORTED_TXN = "aborted_txn"
#: an object no segment references any more, and since when (ms): deleted after the grace period
RETIRE_OBJECT = "retire_object"
#: a retired object was deleted: the catalog stops tracking it
FORGET_OBJECT = "forget_object"
#: the marker ``txlake catalog repair --accept-loss`` commits at the number of a lost commit
#: (``info``: JSON of what was restored and what is lost); it changes no state (catalog/check.py)
LOST_COMMIT = "lost_commit"


def _base_offset(segment: "SegmentInfo") -> int:
    return segment.base_offset


@dataclass(frozen=True)
class SegmentInfo:
    """One partition's records in one object: offsets ``base_offset..last_offset`` (inclusive).

    ``size_bytes`` is the compressed size of the partition's row groups;
    timestamps are ms since the epoch.
    """

    topic: str
    partition: int
    path: str
    base_offset: int
    last_offset: int
    record_count: int
    size_bytes: int
    min_timestamp: int
    max_timestamp: int
    row_group_start: int
    row_group_count: int

    @property
    def row_groups(self) -> list[int]:
        """Row-group indexes of this partition inside the object."""
        return list(range(self.row_group_start, self.row_group_start + self.row_group_count))

    def to_action(self, high_watermark: int, last_stable_offset: int) -> dict[str, Any]:
        """The ``add_segment`` action that adds this segment and moves the partition's offsets."""
        return {
            "action": ADD_SEGMENT, "topic": self.topic, "partition": self.partition, "path": self.path,
            "base_offset": self.base_offset, "last_offset": self.last_offset,
            "record_count": self.record_count, "size_bytes": self.size_bytes,
            "min_timestamp": self.min_timestamp, "max_timestamp": self.max_timestamp,
            "row_group_start": self.row_group_start, "row_group_count": self.row_group_count,
            "high_watermark": high_watermark, "last_stable_offset": last_stable_offset,
        }


@dataclass(frozen=True)
class AbortedTxn:
    """An entry of a partition's aborted-transaction index (Kafka's ``AbortedTxn``).

    Records of ``producer_id`` with ``first_offset <= offset <= last_offset`` belong to an
    aborted transaction; ``last_offset`` is the offset of its ABORT marker. A
    read_committed reader drops them without scanning control records.
    """

    producer_id: int
    first_offset: int
    last_offset: int

    def to_action(self, topic: str, partition: int) -> dict[str, Any]:
        """The ``aborted_txn`` action that records this entry."""
        return {"action": ABORTED_TXN, "topic": topic, "partition": partition, "producer_id": self.producer_id,
                "base_offset": self.first_offset, "last_offset": self.last_offset}


@dataclass
class PartitionState:
    """Offsets and segments of one partition.

    Invariants: segments are sorted by base_offset and do not overlap;
    ``last_stable_offset <= high_watermark``; ``aborted_transactions`` are sorted by
    their marker offset (``last_offset``).
    """

    topic: str
    partition: int
    log_start_offset: int = 0
    high_watermark: int = 0
    last_stable_offset: int = 0
    segments: list[SegmentInfo] = field(default_factory=list)
    aborted_transactions: list[AbortedTxn] = field(default_factory=list)

    def aborted_in(self, start: int, end: int) -> list[AbortedTxn]:
        """Aborted transactions with records in ``[start, end)`` (Kafka's ``collectAbortedTxns``)."""
        return [a for a in self.aborted_transactions if a.last_offset >= start and a.first_offset < end]

    def drop_aborted_below_log_start(self) -> None:
        """Forget the aborted transactions whose ABORT marker is below the log start offset: no
        record of theirs can be read any more (Kafka deletes a segment's aborted-transaction
        index with the segment). A new list: one a reader holds stays whole."""
        if self.aborted_transactions and self.aborted_transactions[0].last_offset < self.log_start_offset:
            self.aborted_transactions = [a for a in self.aborted_transactions if a.last_offset >= self.log_start_offset]

    def segments_from(self, offset: int) -> list[SegmentInfo]:
        """Segments holding offsets >= ``offset`` (in offset order)."""
        idx = bisect.bisect_right([s.last_offset for s in self.segments], offset - 1)
        return self.segments[idx:]

    def size_bytes(self) -> int:
        """Sum of the segments' sizes (bytes)."""
        return sum(s.size_bytes for s in self.segments)


@dataclass
class TopicState:
    """A topic: its id (a new one each time the name is created), config overrides, partitions."""

    name: str
    topic_id: str
    config: dict[str, str]
    partitions: list[PartitionState]


@dataclass
class LeaseState:
    """The writer lease as the catalog records it (see :mod:`txlake.catalog.writer_lease`)."""

    owner: str
    epoch: int
    lease_ms: int
    acquired_ms: int
    info: dict[str, Any]
    released: bool = False


@dataclass
class CatalogState:
    """Everything the catalog knows at one version.

    ``retired`` maps objects no segment names any more to the time (ms) they stopped being
    named (None until the object cleaner stamps them); they stay until ``forget_object``.
    """

    version: int = 0
    topics: dict[str, TopicState] = field(default_factory=dict)
    lease: LeaseState | None = None
    next_producer_id: int = 0
    producer_snapshot: str | None = None
    #: objects no segment references any more -> when they stopped being referenced (ms since the
    #: epoch), or None when the commit that dropped their last segment did not say (DeleteRecords,
    #: DeleteTopics): the object cleaner (engine/object_cleaner.py) stamps those with a
    #: ``retire_object`` action, and deletes an object ``file.delete.delay.ms`` after its stamp.
    retired: dict[str, int | None] = field(default_factory=dict)
    #: object key -> number of segments naming it (kept by :meth:`apply`; see :meth:`reference_count`)
    _path_refs: dict[str, int] = field(default_factory=dict, repr=False)

    # -- reading -------------------------------------------------------------------
    def partition(self, topic: str, partition: int) -> PartitionState:
        """The state of one partition.

        Raises:
            CatalogError: the topic or partition does not exist.
        """
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            from .errors import UnknownTopicError

            raise UnknownTopicError(f"Unknown topic or partition: {topic} [{partition}]")
        return t.partitions[partition]

    def referenced_paths(self) -> set[str]:
        """Every object key the state references (segments and the producer snapshot)."""
        paths = {s.path for t in self.topics.values() for p in t.partitions for s in p.segments}
        if self.producer_snapshot:
            paths.add(self.producer_snapshot)
        return paths

    def reference_count(self, path: str) -> int:
        """How many segments (of any topic and partition) name the object ``path``."""
        return self._path_refs.get(path, 0)

    def _unreference(self, path: str, timestamp_ms: int | None) -> None:
        """One segment naming ``path`` left the catalog; the last one retires the object."""
        left = self._path_refs.get(path, 0) - 1
        if left > 0:
            self._path_refs[path] = left
            return
        self._path_refs.pop(path, None)
        if self.retired.get(path) is None:
            self.retired[path] = timestamp_ms

    # -- changing ------------------------------------------------------------------
    def apply(self, action: dict[str, Any]) -> None:
        """Apply one action. Raises CatalogError for an action that breaks an invariant."""
        kind = action["action"]
        if kind == CREATE_TOPIC:
            name = action["topic"]
            n = action["num_partitions"]
            self.topics[name] = TopicState(
                name, action["topic_id"], dict(action.get("config") or {}),
                [PartitionState(name, i) for i in range(n)],
            )
        elif kind == DELETE_TOPIC:
            gone = self.topics.pop(action["topic"], None)
            for p in gone.partitions if gone is not None else ():
                for s in p.segments:
                    self._unreference(s.path, action.get("timestamp_ms"))
        elif kind in (TOPIC_CONFIG, ADD_PARTITIONS):
            t = self.topics.get(action["topic"])
            if t is None or t.topic_id != action["topic_id"]:
                raise CatalogError(f"{kind} names topic {action['topic']} with id {action['topic_id']}, which does not exist")
            # a new TopicState: one a reader holds (Broker.topics()) stays whole
            if kind == TOPIC_CONFIG:
                self.topics[t.name] = TopicState(t.name, t.topic_id, dict(action.get("config") or {}), t.partitions)
            else:
                n = action["num_partitions"]
                if n < len(t.partitions):
                    raise CatalogError(f"{kind} would shrink {t.name} from {len(t.partitions)} to {n} partitions")
                self.topics[t.name] = TopicState(t.name, t.topic_id, t.config, t.partitions + [
                    PartitionState(t.name, i) for i in range(len(t.partitions), n)])
        elif kind == ADD_SEGMENT:
            p = self.partition(action["topic"], action["partition"])
            seg = SegmentInfo(
                action["topic"], action["partition"], action["path"], action["base_offset"], action["last_offset"],
                action["record_count"], action["size_bytes"], action["min_timestamp"], action["max_timestamp"],
                action["row_group_start"], action["row_group_count"],
            )
            if p.segments and seg.base_offset <= p.segments[-1].last_offset:
                idx = bisect.bisect_left(p.segments, seg.base_offset, key=_base_offset)
                if idx < len(p.segments) and p.segments[idx].base_offset <= seg.last_offset:
                    raise CatalogError(f"segment {seg.path} overlaps {p.segments[idx].path} in {seg.topic} [{seg.partition}]")
                p.segments.insert(idx, seg)
            else:
                p.segments.append(seg)
            self._path_refs[seg.path] = self._path_refs.get(seg.path, 0) + 1
            self.retired.pop(seg.path, None)
            p.high_watermark = max(p.high_watermark, action.get("high_watermark", seg.last_offset + 1))
            p.last_stable_offset = action.get("last_stable_offset", p.high_watermark)
        elif kind == REMOVE_SEGMENT:
            p = self.partition(action["topic"], action["partition"])
            # segments are in base-offset order and never overlap: at most one starts there
            idx = bisect.bisect_left(p.segments, action["base_offset"], key=_base_offset)
            if idx < len(p.segments) and p.segments[idx].base_offset == action["base_offset"] \
                    and p.segments[idx].path == action["path"]:
                p.segments = p.segments[:idx] + p.segments[idx + 1:]  # a new list: a held one stays whole
                self._unreference(action["path"], action.get("timestamp_ms"))
        elif kind == LOG_START_OFFSET:
            p = self.partition(action["topic"], action["partition"])
            p.log_start_offset = max(p.log_start_offset, action["offset"])
            if p.log_start_offset > p.high_watermark:
                raise CatalogError(f"log start offset {p.log_start_offset} of {p.topic} [{p.partition}] is past its "
                                   f"high watermark {p.high_watermark}")
            p.last_stable_offset = max(p.last_stable_offset, p.log_start_offset)
            p.drop_aborted_below_log_start()
        elif kind == PARTITION_STATE:
            p = self.partition(action["topic"], action["partition"])
            p.log_start_offset = action["offset"]
            p.high_watermark = action["high_watermark"]
            p.last_stable_offset = action["last_stable_offset"]
        elif kind == LEASE:
            self.lease = LeaseState(action["owner"], action["lease_epoch"], action["lease_ms"],
                                    action["timestamp_ms"], json.loads(action.get("info") or "{}"))
        elif kind == LEASE_RELEASE:
            if self.lease is not None and self.lease.epoch == action["lease_epoch"]:
                self.lease.released = True
        elif kind == PRODUCER_ID_BLOCK:
            self.next_producer_id = max(self.next_producer_id, action["producer_id"])
        elif kind == PRODUCER_SNAPSHOT:
            self.producer_snapshot = action["path"]
        elif kind == ABORTED_TXN:
            p = self.partition(action["topic"], action["partition"])
            p.aborted_transactions.append(AbortedTxn(action["producer_id"], action["base_offset"], action["last_offset"]))
        elif kind == RETIRE_OBJECT:
            # a stamp for an object still named by a segment is ignored: its grace starts when its
            # last segment goes (the remove_segment actions precede this action in their commit)
            path, stamp = action["path"], action.get("timestamp_ms")
            if path not in self._path_refs:
                known = self.retired.get(path)
                self.retired[path] = stamp if known is None else (known if stamp is None else min(known, stamp))
        elif kind == FORGET_OBJECT:
            self.retired.pop(action["path"], None)
        elif kind == LOST_COMMIT:
            pass
        else:
            raise CatalogError(f"unknown catalog action {kind!r}")

    def checkpoint_actions(self) -> list[dict[str, Any]]:
        """Actions that rebuild this state from an empty one (the content of a checkpoint)."""
        out: list[dict[str, Any]] = []
        if self.lease is not None:
            lease = self.lease
            out.append({"action": LEASE, "owner": lease.owner, "lease_epoch": lease.epoch,
                        "lease_ms": lease.lease_ms, "timestamp_ms": lease.acquired_ms, "info": json.dumps(lease.info)})
            if lease.released:
                out.append({"action": LEASE_RELEASE, "owner": lease.owner, "lease_epoch": lease.epoch})
        if self.next_producer_id:
            out.append({"action": PRODUCER_ID_BLOCK, "producer_id": self.next_producer_id})
        if self.producer_snapshot:
            out.append({"action": PRODUCER_SNAPSHOT, "path": self.producer_snapshot})
        for t in self.topics.values():
            out.append({"action": CREATE_TOPIC, "topic": t.name, "topic_id": t.topic_id,
                        "num_partitions": len(t.partitions), "config": dict(t.config)})
            for p in t.partitions:
                for s in p.segments:
                    out.append(s.to_action(p.high_watermark, p.last_stable_offset))
                for a in p.aborted_transactions:
                    if a.last_offset >= p.log_start_offset:  # older ones can no longer be read
                        out.append(a.to_action(t.name, p.partition))
                out.append({"action": PARTITION_STATE, "topic": t.name, "partition": p.partition,
                            "offset": p.log_start_offset, "high_watermark": p.high_watermark,
                            "last_stable_offset": p.last_stable_offset})
        for path, stamp in sorted(self.retired.items()):  # after the segments: they must not name these
            out.append({"action": RETIRE_OBJECT, "path": path, "timestamp_ms": stamp})
        return out
