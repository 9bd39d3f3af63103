"""Committed consumer-group offsets in ``__consumer_offsets`` (the offsets half of Kafka's
group coordinator: ``GroupMetadataManager`` / ``OffsetMetadataManager``, KIP-98, KIP-447).

Offsets are records of the compacted topic ``__consumer_offsets`` (50 partitions by
default, ``offsets.topic.num.partitions``); a group's partition is
``abs(javaHashCode(group)) % partitions``. A plain OffsetCommit writes them directly; a
transactional producer writes them inside its transaction (TxnOffsetCommit), and they
count only once the transaction's COMMIT marker lands (an ABORT drops them).

OffsetFetch replays the group's partition: in log order, plain commits apply at once;
transactional ones are held per producer until its marker. Between a transactional and
a plain commit of the same partition, the later offset record in the log wins (Kafka's
``completePendingTxnOffsetCommit``). With ``require_stable``, a partition with a
transactional commit still pending answers UNSTABLE_OFFSET_COMMIT (KIP-447).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator

import pyarrow as pa

from txlake.catalog.topic_config import INTERNAL_TOPIC_CONFIG
from txlake.catalog.topic_names import CONSUMER_OFFSETS_TOPIC
from txlake.formats.errors import CorruptObjectError
from txlake.formats.records import CONTROL_COMMIT, HEADER_TYPE, PAYLOAD_SCHEMA

from .errors import ApiError, Errors
from .requests import ProduceBatch
from .transaction_state_manager import java_string_hash_code, kafka_abs

if TYPE_CHECKING:
    from .broker import Broker

OFFSETS_TOPIC_NUM_PARTITIONS = 50
RECORD_VERSION = 1


@dataclass(frozen=True)
class OffsetAndMetadata:
    """A committed offset: the next offset to consume, its metadata string, the commit time (ms)."""

    offset: int
    metadata: str = ""
    commit_timestamp: int = -1


def partition_for(group_id: str, num_partitions: int = OFFSETS_TOPIC_NUM_PARTITIONS) -> int:
    """The ``__consumer_offsets`` partition of a group (Kafka's ``partitionFor``)."""
    return kafka_abs(java_string_hash_code(group_id)) % num_partitions


def offset_records(group_id: str, offsets: dict[tuple[str, int], OffsetAndMetadata]) -> pa.Table:
    """The records (PAYLOAD_SCHEMA) of an offset commit: key = group/topic/partition, value = offset."""
    now = int(time.time() * 1000)
    keys, values = [], []
    for (topic, partition), om in sorted(offsets.items()):
        keys.append(json.dumps({"v": RECORD_VERSION, "group": group_id, "topic": topic, "partition": partition},
                               separators=(",", ":")).encode())
        values.append(json.dumps({"v": RECORD_VERSION, "offset": om.offset, "metadata": om.metadata,
                                  "commit_timestamp": now}, separators=(",", ":")).encode())
    n = len(keys)
    return pa.Table.from_arrays([pa.array([now] * n, pa.int64()), pa.array(keys, pa.binary()),
                                 pa.array(values, pa.binary()), pa.nulls(n, HEADER_TYPE)], schema=PAYLOAD_SCHEMA)


def _decode(key: bytes, value: bytes | None, location: str) -> tuple[str, tuple[str, int], OffsetAndMetadata | None] | None:
    """An offset-commit record as ``(group, (topic, partition), offset or None for a tombstone)``;
    None for the other records of ``__consumer_offsets`` (group metadata, keyed with a ``type``)."""
    try:
        k = json.loads(key)
        if "type" in k:
            return None
        v = json.loads(value) if value is not None else None
    except ValueError as exc:
        raise CorruptObjectError(location, f"unreadable offset commit record ({exc})") from exc
    if k.get("v") != RECORD_VERSION or (v is not None and v.get("v") != RECORD_VERSION):
        raise CorruptObjectError(location, f"offset commit record of unknown version {k.get('v')}")
    om = OffsetAndMetadata(v["offset"], v.get("metadata", ""), v.get("commit_timestamp", -1)) if v else None
    return k["group"], (k["topic"], k["partition"]), om


class GroupOffsets:
    """Offset commits and fetches of consumer groups over ``__consumer_offsets``.

    Args:
        broker: the process's broker (commits take the writer lease; fetches only read).
        num_partitions: ``offsets.topic.num.partitions``.
    """

    def __init__(self, broker: "Broker", num_partitions: int = OFFSETS_TOPIC_NUM_PARTITIONS):
        self.broker = broker
        self.num_partitions = num_partitions

    def partition_for(self, group_id: str) -> int:
        """The group's ``__consumer_offsets`` partition under ``offsets.topic.num.partitions``."""
        return partition_for(group_id, self.num_partitions)

    def ensure_topic(self) -> None:
        """Create ``__consumer_offsets`` (compacted) if missing."""
        if CONSUMER_OFFSETS_TOPIC in self.broker.topics():
            return
        ((error, message),) = self.broker.create_topics(
            [(CONSUMER_OFFSETS_TOPIC, self.num_partitions, dict(INTERNAL_TOPIC_CONFIG))])
        if error not in (Errors.NO_ERROR, Errors.TOPIC_ALREADY_EXISTS):
            raise ApiError(error, f"cannot create {CONSUMER_OFFSETS_TOPIC}: {message}")

    def commit(self, group_id: str, offsets: dict[tuple[str, int], OffsetAndMetadata], generation_id: int = -1,
               member_id: str = "", group_instance_id: str | None = None) -> dict[tuple[str, int], Errors]:
        """OffsetCommit. One error per partition.

        The group coordinator first checks the membership (Kafka's ``validateOffsetCommit``):
        a member's commit carries its generation and member id (ILLEGAL_GENERATION,
        UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, REBALANCE_IN_PROGRESS); an assign()-based
        consumer's commit carries generation -1 and is accepted only while the group has no
        members.
        """
        if not group_id:
            return {tp: Errors.INVALID_GROUP_ID for tp in offsets}
        try:
            error = self.broker.group_coordinator().validate_offset_commit(group_id, generation_id, member_id,
                                                                          group_instance_id)
        except ApiError as exc:
            error = exc.error
        if error != Errors.NO_ERROR:
            return {tp: error for tp in offsets}
        (result,) = self.broker.produce([ProduceBatch(CONSUMER_OFFSETS_TOPIC, partition_for(group_id, self.num_partitions),
                                                      offset_records(group_id, offsets), urgent=True)])
        return {tp: result.error for tp in offsets}

    def append_group_record(self, group_id: str, key: bytes, value: bytes | None) -> Errors:
        """The group coordinator's ``append``: one group record (None = tombstone) to the group's partition."""
        try:
            self.ensure_topic()
        except ApiError as exc:
            return exc.error
        records = pa.Table.from_arrays([pa.array([int(time.time() * 1000)], pa.int64()), pa.array([key], pa.binary()),
                                        pa.array([value], pa.binary()), pa.nulls(1, HEADER_TYPE)], schema=PAYLOAD_SCHEMA)
        (result,) = self.broker.produce([ProduceBatch(CONSUMER_OFFSETS_TOPIC, partition_for(group_id, self.num_partitions),
                                                      records, urgent=True)])
        return result.error

    def records(self, partition: int) -> Iterator[tuple[bytes, bytes | None]]:
        """``(key, value)`` of every data record of one ``__consumer_offsets`` partition, in log order."""
        for table in self._tables(partition):
            for key, value, control in zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                                           table.column("is_control").to_pylist()):
                if not control:
                    yield key, value

    def _tables(self, partition: int) -> Iterator[pa.Table]:
        """The record tables of one partition from its log start, in offset order (read_uncommitted)."""
        self.broker.refresh()
        topic = self.broker.topics().get(CONSUMER_OFFSETS_TOPIC)
        if topic is None:
            return
        offset = topic.partitions[partition].log_start_offset
        while True:
            result = self.broker.fetch(CONSUMER_OFFSETS_TOPIC, partition, offset, 10_000, "read_uncommitted")
            if result.error != Errors.NO_ERROR:
                raise ApiError(result.error, f"cannot read {CONSUMER_OFFSETS_TOPIC}-{partition}: {result.message}")
            table = result.records
            if table is None or table.num_rows == 0:
                return
            yield table
            offset = table.column("offset")[-1].as_py() + 1

    def fetch(self, group_id: str, partitions: Iterable[tuple[str, int]] | None,
              require_stable: bool) -> dict[tuple[str, int], tuple[OffsetAndMetadata | None, Errors]]:
        """OffsetFetch: the committed offset of each partition (None if never committed).

        With ``require_stable``, a partition with a pending transactional commit answers
        UNSTABLE_OFFSET_COMMIT (the consumer backs off and retries).
        """
        committed, pending = self._replay(group_id)
        wanted = list(partitions) if partitions is not None else sorted(committed)
        out = {}
        for tp in wanted:
            if require_stable and tp in pending:
                out[tp] = (None, Errors.UNSTABLE_OFFSET_COMMIT)
            else:
                entry = committed.get(tp)
                out[tp] = (entry[1] if entry else None, Errors.NO_ERROR)
        return out

    def _replay(self, group_id: str) -> tuple[dict, set]:
        """Replay the group's partition: ``(committed {tp: (record offset, OffsetAndMetadata)},
        tps with a transactional commit still pending)``."""
        partition = partition_for(group_id, self.num_partitions)
        location = f"{CONSUMER_OFFSETS_TOPIC}-{partition}"
        committed: dict[tuple[str, int], tuple[int, OffsetAndMetadata | None]] = {}
        pending: dict[int, dict[tuple[str, int], tuple[int, OffsetAndMetadata | None]]] = {}
        for table in self._tables(partition):
            columns = [table.column(c).to_pylist() for c in
                       ("offset", "key", "value", "producer_id", "is_transactional", "is_control", "control_type")]
            for rec_offset, key, value, pid, txn, control, control_type in zip(*columns):
                if control:
                    held = pending.pop(pid, {})
                    if control_type == CONTROL_COMMIT:
                        for tp, (held_offset, om) in held.items():
                            if tp not in committed or committed[tp][0] < held_offset:
                                committed[tp] = (held_offset, om)
                    continue
                decoded = _decode(key, value, location)
                if decoded is None or decoded[0] != group_id:
                    continue
                _, tp, om = decoded
                if txn:
                    pending.setdefault(pid, {})[tp] = (rec_offset, om)
                else:
                    committed[tp] = (rec_offset, om)
        committed = {tp: v for tp, v in committed.items() if v[1] is not None}
        return committed, {tp for held in pending.values() for tp in held}
