"""Committed consumer-group offsets in ``__consumer_offsets`` (the offsets half of Kafka's
group coordinator: ``GroupMetadataManager`` / ``OffsetMetadataManager``, KIP-98, KIP-447).

Offsets are records of the compacted topic ``__consumer_offsets`` (50 partitions by
default, ``offsets.topic.num.partitions``); a group's partition is
``abs(javaHashCode(group)) % partitions``, where ``partitions`` is the existing topic's
partition count whatever this process's ``offsets.topic.num.partitions`` says (the setting
only decides the count the topic is created with: Kafka's broker passes
``metadataCache.numPartitions(topic).getOrElse(offsetsTopicPartitions)``). A plain OffsetCommit writes them directly; a
transactional producer writes them inside its transaction (TxnOffsetCommit), and they
count only once the transaction's COMMIT marker lands (an ABORT drops them).

OffsetFetch replays the group's partition: in log order, plain commits apply at once;
transactional ones are held per producer until its marker. Between a transactional and
a plain commit of the same partition, the later offset record in the log wins (Kafka's
``completePendingTxnOffsetCommit``). A tombstone (an expired or deleted offset) removes the
committed offset; a transactional offset written before it still applies at its COMMIT
marker (Kafka's ``OffsetMetadataManager.replay``). With ``require_stable``, a partition with a
transactional commit still pending answers UNSTABLE_OFFSET_COMMIT (KIP-447).

Offsets expire (``offsets.retention.minutes``, KIP-211): the group coordinator decides
which (:meth:`~.group_coordinator.GroupCoordinator.cleanup_group_metadata`) from
:meth:`GroupOffsets.replay`, and :meth:`GroupOffsets.delete_offsets` writes their tombstones.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Callable, ContextManager, Iterable, Iterator, Protocol

import pyarrow as pa

from txlake.catalog.topic_config import INTERNAL_TOPIC_CONFIG
from txlake.catalog.topic_names import CONSUMER_OFFSETS_TOPIC
from txlake.formats.errors import CorruptObjectError
from txlake.formats.records import CONTROL_COMMIT, HEADER_TYPE, PAYLOAD_SCHEMA

from .errors import ApiError, Errors
from .partition_writer import PartitionWriter
from .producer_state import increment_sequence
from .requests import ProduceBatch
from .transaction_state_manager import java_string_hash_code, kafka_abs

OFFSETS_TOPIC_NUM_PARTITIONS = 50
RECORD_VERSION = 1
#: OffsetCommit's ``retention_time_ms`` when the request sets none (Kafka's
#: ``OffsetCommitRequest.DEFAULT_RETENTION_TIME``): ``offsets.retention.minutes`` applies
DEFAULT_RETENTION_TIME = -1
#: the longest metadata string an offset commit may carry, in UTF-16 code units (Kafka's
#: ``offset.metadata.max.bytes`` default); longer ones answer OFFSET_METADATA_TOO_LARGE
OFFSET_METADATA_MAX_BYTES = 4096

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True)
class OffsetAndMetadata:
    """A committed offset (Kafka's ``OffsetAndMetadata``).

    Attributes:
        offset: the next offset to consume.
        metadata: the application's metadata string (round-trips unchanged).
        commit_timestamp: when the coordinator stored it (ms since the epoch); -1 before.
        expire_timestamp: an explicit expiry (ms since the epoch), set only by an OffsetCommit
            with a ``retention_time_ms`` (OffsetCommit v2-v4); None: the offset expires by
            ``offsets.retention.minutes`` (KIP-211).
        leader_epoch: the leader epoch of the last consumed record, as the client committed it
            (OffsetCommit v6+ ``committed_leader_epoch``, KIP-320); None when not sent (-1 on the
            wire). OffsetFetch answers it back unchanged (Kafka's ``OffsetCommitValue`` v3).
    """

    offset: int
    metadata: str = ""
    commit_timestamp: int = -1
    expire_timestamp: int | None = None
    leader_epoch: int | None = None


@dataclass
class GroupOffsetsState:
    """One group's offsets after a replay of its ``__consumer_offsets`` partition (the state
    Kafka's ``OffsetMetadataManager`` keeps in memory).

    Attributes:
        committed: ``{(topic, partition): (record offset in __consumer_offsets, OffsetAndMetadata)}``.
        pending: partitions with a transactional commit whose marker has not been written yet.
    """

    committed: dict[TopicPartitionKey, tuple[int, OffsetAndMetadata]] = field(default_factory=dict)
    pending: set[TopicPartitionKey] = field(default_factory=set)


def partition_for(group_id: str, num_partitions: int = OFFSETS_TOPIC_NUM_PARTITIONS) -> int:
    """The ``__consumer_offsets`` partition of a group (Kafka's ``partitionFor``)."""
    return kafka_abs(java_string_hash_code(group_id)) % num_partitions


def _wall_ms() -> int:
    return int(time.time() * 1000)


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    """The key of a committed offset in ``__consumer_offsets`` (Kafka's ``OffsetCommitKey``)."""
    return json.dumps({"v": RECORD_VERSION, "group": group_id, "topic": topic, "partition": partition},
                      separators=(",", ":")).encode()


def _payload(keys: list[bytes], values: list[bytes | None], timestamp_ms: int) -> pa.Table:
    """Records of ``__consumer_offsets`` (PAYLOAD_SCHEMA); a None value is a tombstone."""
    n = len(keys)
    return pa.Table.from_arrays([pa.array([timestamp_ms] * n, pa.int64()), pa.array(keys, pa.binary()),
                                 pa.array(values, pa.binary()), pa.nulls(n, HEADER_TYPE)], schema=PAYLOAD_SCHEMA)


def offset_records(group_id: str, offsets: dict[TopicPartitionKey, OffsetAndMetadata],
                   now_ms: int | None = None) -> pa.Table:
    """The records (PAYLOAD_SCHEMA) of an offset commit: key = group/topic/partition, value =
    offset, metadata, commit timestamp ``now_ms`` (default: the wall clock, ms), and the explicit
    expire timestamp and the committed leader epoch if the offset has them (Kafka's
    ``OffsetCommitValue``; records without ``leader_epoch`` read back as None)."""
    now = _wall_ms() if now_ms is None else now_ms
    keys, values = [], []
    for (topic, partition), om in sorted(offsets.items()):
        keys.append(offset_key(group_id, topic, partition))
        value = {"v": RECORD_VERSION, "offset": om.offset, "metadata": om.metadata, "commit_timestamp": now}
        if om.expire_timestamp is not None:
            value["expire_timestamp"] = om.expire_timestamp
        if om.leader_epoch is not None:
            value["leader_epoch"] = om.leader_epoch
        values.append(json.dumps(value, separators=(",", ":")).encode())
    return _payload(keys, values, now)


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
    om = OffsetAndMetadata(v["offset"], v.get("metadata", ""), v.get("commit_timestamp", -1),
                           v.get("expire_timestamp"), v.get("leader_epoch")) if v else None
    return k["group"], (k["topic"], k["partition"]), om


class OffsetCommitValidator(Protocol):
    """What an OffsetCommit asks of the group coordinator
    (:class:`~.group_coordinator.GroupCoordinator` implements it)."""

    def offset_commit_guard(self, group_id: str) -> ContextManager[None]:
        """Held around an OffsetCommit's check and write (no offset expiration meanwhile)."""

    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                               group_instance_id: str | None = None) -> Errors:
        """Kafka's ``validateOffsetCommit``: may this member store offsets now?"""


def offset_commit_append_error(error: Errors) -> Errors:
    """What a failed append of committed offsets answers the client (Kafka's
    ``GroupMetadataManager.storeOffsets``, which turns the log's append errors into retriable
    coordinator errors): UNKNOWN_TOPIC_OR_PART is COORDINATOR_NOT_AVAILABLE;
    NOT_LEADER_OR_FOLLOWER and KAFKA_STORAGE_ERROR (txlake: the object store failed) are
    NOT_COORDINATOR, as is a writer that lost its lease (``_FENCED``); MESSAGE_TOO_LARGE,
    RECORD_LIST_TOO_LARGE and INVALID_FETCH_SIZE are INVALID_COMMIT_OFFSET_SIZE; any other
    error (NO_ERROR included) passes through."""
    if error == Errors.UNKNOWN_TOPIC_OR_PART:
        return Errors.COORDINATOR_NOT_AVAILABLE
    if error in (Errors.NOT_LEADER_OR_FOLLOWER, Errors.KAFKA_STORAGE_ERROR, Errors._FENCED):
        return Errors.NOT_COORDINATOR
    if error in (Errors.MESSAGE_TOO_LARGE, Errors.RECORD_LIST_TOO_LARGE, Errors.INVALID_FETCH_SIZE):
        return Errors.INVALID_COMMIT_OFFSET_SIZE
    return error


class GroupOffsets:
    """Offset commits and fetches of consumer groups over ``__consumer_offsets``.

    Args:
        writer: the partition writer of the storage root (commits take the writer lease;
            fetches only read).
        num_partitions: ``offsets.topic.num.partitions``: the partition count ``__consumer_offsets``
            is created with. Once the topic exists, its own count places the groups
            (:attr:`num_partitions`).
        group_coordinator: returns the group coordinator (started on first use, in the writer;
            raises ApiError when this process cannot be the writer): a commit checks the
            membership with it.
    """

    def __init__(self, writer: PartitionWriter, num_partitions: int = OFFSETS_TOPIC_NUM_PARTITIONS, *,
                 group_coordinator: Callable[[], OffsetCommitValidator]):
        self.writer = writer
        self.configured_partitions = num_partitions
        self._existing_partitions: int | None = None
        self._group_coordinator = group_coordinator

    @property
    def num_partitions(self) -> int:
        """The partition count the groups are placed by: the existing ``__consumer_offsets``
        topic's, else ``offsets.topic.num.partitions`` (the count :meth:`ensure_topic` creates
        it with). Kafka's rule (``GroupCoordinatorService.startup`` gets
        ``metadataCache.numPartitions(topic).getOrElse(config.offsetsTopicPartitions)``): the
        setting applies only to a topic yet to be created, so processes with other settings
        agree on every group's partition.

        A look at the catalog state this process holds, no storage read; the count is kept
        once seen (an internal topic can neither grow nor be deleted: CreatePartitions and
        DeleteTopics refuse it)."""
        if self._existing_partitions is None:
            topic = self.writer.topics().get(CONSUMER_OFFSETS_TOPIC)
            if topic is None:
                return self.configured_partitions
            self._existing_partitions = len(topic.partitions)
        return self._existing_partitions

    def partition_for(self, group_id: str) -> int:
        """The group's ``__consumer_offsets`` partition among :attr:`num_partitions` partitions."""
        return partition_for(group_id, self.num_partitions)

    def ensure_topic(self) -> None:
        """Create ``__consumer_offsets`` (compacted) with ``offsets.topic.num.partitions``
        partitions if missing (an existing topic keeps its count)."""
        if CONSUMER_OFFSETS_TOPIC in self.writer.topics():
            return
        ((error, message),) = self.writer.create_topics(
            [(CONSUMER_OFFSETS_TOPIC, self.configured_partitions, dict(INTERNAL_TOPIC_CONFIG))],
            internal_topics_allowed=True)
        if error not in (Errors.NO_ERROR, Errors.TOPIC_ALREADY_EXISTS):
            raise ApiError(error, f"cannot create {CONSUMER_OFFSETS_TOPIC}: {message}")

    def commit(self, group_id: str, offsets: dict[TopicPartitionKey, OffsetAndMetadata], generation_id: int = -1,
               member_id: str = "", group_instance_id: str | None = None,
               retention_time_ms: int = DEFAULT_RETENTION_TIME) -> dict[TopicPartitionKey, Errors]:
        """OffsetCommit (Kafka's ``OffsetMetadataManager.commitOffset``). One error per partition.

        A partition of a topic the catalog does not have (or beyond its partition count) answers
        UNKNOWN_TOPIC_OR_PART and is not stored (Kafka's ``KafkaApis.handleOffsetCommitRequest``
        checks the metadata cache before the coordinator sees the request).

        The group coordinator first checks the membership (Kafka's ``validateOffsetCommit``):
        a member's commit carries its generation and member id (ILLEGAL_GENERATION,
        UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, REBALANCE_IN_PROGRESS); an assign()-based
        consumer's commit carries generation -1 and is accepted only while the group has no
        members. Then, per partition, a metadata string longer than
        :data:`OFFSET_METADATA_MAX_BYTES` answers OFFSET_METADATA_TOO_LARGE (the other partitions
        are stored).

        Every stored offset gets the commit timestamp now (wall clock, ms). ``retention_time_ms``
        (OffsetCommit v2-v4's field, ms; -1 = not set) gives them the explicit expire timestamp
        ``now + retention_time_ms``; otherwise ``offsets.retention.minutes`` applies (KIP-211).

        The commit holds the coordinator's commit guard of the group's ``__consumer_offsets``
        partition from the check to the write, so an offset expiration never tombstones an
        offset committed while it looked (what Kafka's ``pendingOffsetCommits`` ensure).
        """
        if not group_id:
            return {tp: Errors.INVALID_GROUP_ID for tp in offsets}
        try:
            coordinator = self._group_coordinator()
        except ApiError as exc:
            return {tp: exc.error for tp in offsets}
        topics = self.writer.topics()
        unknown = {tp: Errors.UNKNOWN_TOPIC_OR_PART for tp in offsets
                   if tp[0] not in topics or not 0 <= tp[1] < len(topics[tp[0]].partitions)}
        if len(unknown) == len(offsets):
            return unknown
        with coordinator.offset_commit_guard(group_id):
            error = coordinator.validate_offset_commit(group_id, generation_id, member_id, group_instance_id)
            if error != Errors.NO_ERROR:
                return {tp: unknown.get(tp, error) for tp in offsets}
            answers = {tp: Errors.OFFSET_METADATA_TOO_LARGE for tp, om in offsets.items()
                       if tp not in unknown and _utf16_length(om.metadata) > OFFSET_METADATA_MAX_BYTES}
            answers.update(unknown)
            now = _wall_ms()
            expire = None if retention_time_ms == DEFAULT_RETENTION_TIME else now + retention_time_ms
            stored = {tp: replace(om, expire_timestamp=expire) for tp, om in offsets.items() if tp not in answers}
            if stored:
                (result,) = self.writer.produce([ProduceBatch(CONSUMER_OFFSETS_TOPIC, self.partition_for(group_id),
                                                              offset_records(group_id, stored, now), urgent=True)],
                                                internal_topics_allowed=True)
                answers.update(dict.fromkeys(stored, offset_commit_append_error(result.error)))
        return {tp: answers[tp] for tp in offsets}

    def commit_transactional(self, group_id: str, offsets: dict[TopicPartitionKey, OffsetAndMetadata],
                             producer_id: int, producer_epoch: int, generation_id: int = -1, member_id: str = "",
                             group_instance_id: str | None = None) -> dict[TopicPartitionKey, Errors]:
        """TxnOffsetCommit (KIP-98, KIP-447; Kafka's ``OffsetMetadataManager.commitTransactionalOffset``):
        write the offsets as a transactional batch of ``producer_id``/``producer_epoch`` to the
        group's ``__consumer_offsets`` partition; they count once the transaction's COMMIT marker
        lands there. One error per partition.

        The group coordinator checks the member as for a plain commit (Kafka's
        ``validateTransactionalOffsetCommit``): ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
        FENCED_INSTANCE_ID; an unknown group with generation < 0 is a simple group (accepted);
        INVALID_GROUP_ID for an empty id. A metadata string over
        :data:`OFFSET_METADATA_MAX_BYTES` answers OFFSET_METADATA_TOO_LARGE for its partition.
        The append itself answers the log's errors: INVALID_TXN_STATE when the partition is not
        in the producer's transaction (KIP-890 verification: AddOffsetsToTxn comes first),
        INVALID_PRODUCER_EPOCH for a fenced epoch, and the append's failures as the log answers
        them (the caller maps them as Kafka maps a coordinator's append errors:
        ``append_error_to_response_error``).

        The batch's sequence continues the producer's last sequence on the partition (0 under a
        new epoch): the coordinator writes it, as Kafka's does, so the client keeps no sequence
        for ``__consumer_offsets``. Callers serialise the commits of one producer (a producer has
        at most one TxnOffsetCommit under way, as Kafka's ``TransactionManager``).
        """
        try:
            coordinator = self._group_coordinator()
        except ApiError as exc:
            return {tp: exc.error for tp in offsets}
        partition = self.partition_for(group_id)
        with coordinator.offset_commit_guard(group_id):
            error = coordinator.validate_offset_commit(group_id, generation_id, member_id, group_instance_id,
                                                       is_transactional=True)
            if error != Errors.NO_ERROR:
                return {tp: error for tp in offsets}
            answers = {tp: Errors.OFFSET_METADATA_TOO_LARGE for tp, om in offsets.items()
                       if _utf16_length(om.metadata) > OFFSET_METADATA_MAX_BYTES}
            stored = {tp: om for tp, om in offsets.items() if tp not in answers}
            if stored:
                rows = self.writer.producer_state_rows(CONSUMER_OFFSETS_TOPIC, partition) or []
                entry = next((r for r in rows if r["producer_id"] == producer_id), None)
                sequence = 0
                if entry is not None and entry["producer_epoch"] == producer_epoch and entry["batches"]:
                    sequence = increment_sequence(entry["batches"][-1]["last_seq"], 1)
                (result,) = self.writer.produce([ProduceBatch(
                    CONSUMER_OFFSETS_TOPIC, partition, offset_records(group_id, stored), producer_id, producer_epoch,
                    sequence, is_transactional=True, urgent=True)], internal_topics_allowed=True)
                answers.update(dict.fromkeys(stored, result.error))
        return {tp: answers[tp] for tp in offsets}

    def delete_offsets(self, partition: int, offsets: dict[str, Iterable[TopicPartitionKey]]) -> Errors:
        """Write one batch of offset tombstones to ``__consumer_offsets`` partition ``partition``:
        the offsets of each group (``{group id: [(topic, partition)]}``), as Kafka's
        ``cleanupGroupMetadata`` does for expired offsets. NO_ERROR when there is nothing to write.

        Raises:
            ValueError: a group that does not belong to ``partition``.
        """
        keys = []
        for group_id, tps in sorted(offsets.items()):
            if self.partition_for(group_id) != partition:
                raise ValueError(f"group {group_id} belongs to {CONSUMER_OFFSETS_TOPIC}-{self.partition_for(group_id)}, "
                                 f"not -{partition}")
            keys.extend(offset_key(group_id, topic, p) for topic, p in sorted(tps))
        if not keys:
            return Errors.NO_ERROR
        (result,) = self.writer.produce([ProduceBatch(CONSUMER_OFFSETS_TOPIC, partition,
                                                      _payload(keys, [None] * len(keys), _wall_ms()), urgent=True)],
                                        internal_topics_allowed=True)
        return result.error

    def append_group_record(self, group_id: str, key: bytes, value: bytes | None) -> Errors:
        """The group coordinator's ``append``: one group record (None = tombstone) to the group's partition."""
        try:
            self.ensure_topic()
        except ApiError as exc:
            return exc.error
        (result,) = self.writer.produce([ProduceBatch(CONSUMER_OFFSETS_TOPIC, self.partition_for(group_id),
                                                      _payload([key], [value], _wall_ms()), urgent=True)],
                                        internal_topics_allowed=True)
        return result.error

    def records(self, partition: int) -> Iterator[tuple[bytes, bytes | None]]:
        """``(key, value)`` of every data record of one ``__consumer_offsets`` partition, in log order."""
        self.writer.refresh()
        for table in self._tables(partition):
            for key, value, control in zip(table.column("key").to_pylist(), table.column("value").to_pylist(),
                                           table.column("is_control").to_pylist()):
                if not control:
                    yield key, value

    def _tables(self, partition: int) -> Iterator[pa.Table]:
        """The record tables of one partition from its log start, in offset order (read_uncommitted),
        as of the catalog state this process holds (callers refresh it first)."""
        topic = self.writer.topics().get(CONSUMER_OFFSETS_TOPIC)
        if topic is None:
            return
        offset = topic.partitions[partition].log_start_offset
        while True:
            result = self.writer.fetch(CONSUMER_OFFSETS_TOPIC, partition, offset, 10_000, "read_uncommitted")
            if result.error != Errors.NO_ERROR:
                raise ApiError(result.error, f"cannot read {CONSUMER_OFFSETS_TOPIC}-{partition}: {result.message}")
            table = result.records
            if table is None or table.num_rows == 0:
                return
            yield table
            offset = table.column("offset")[-1].as_py() + 1

    def fetch(self, group_id: str, partitions: Iterable[TopicPartitionKey] | None,
              require_stable: bool) -> dict[TopicPartitionKey, tuple[OffsetAndMetadata | None, Errors]]:
        """OffsetFetch: the committed offset of each partition (None if never committed, or
        expired). ``partitions`` None: every partition the group has an offset for.

        With ``require_stable``, a partition with a pending transactional commit answers
        UNSTABLE_OFFSET_COMMIT (the consumer backs off and retries).
        """
        self.writer.refresh()  # before placing the group: the topic may be new to this process
        state = self._replay(self.partition_for(group_id), group_id).get(group_id) or GroupOffsetsState()
        wanted = list(partitions) if partitions is not None else sorted(state.committed)
        out = {}
        for tp in wanted:
            if require_stable and tp in state.pending:
                out[tp] = (None, Errors.UNSTABLE_OFFSET_COMMIT)
            else:
                entry = state.committed.get(tp)
                out[tp] = (entry[1] if entry else None, Errors.NO_ERROR)
        return out

    def replay(self, partition: int, group_id: str | None = None) -> dict[str, GroupOffsetsState]:
        """Replay one ``__consumer_offsets`` partition from its log start (read_uncommitted):
        every group's committed offsets and the partitions it has a transactional commit
        pending for -- only ``group_id``'s when given. Groups with neither are left out.

        In log order: a plain commit applies at once; a transactional one is held per producer
        id until the producer's marker (COMMIT applies it unless a later record of the
        partition is already applied, ABORT drops it); a plain tombstone removes the committed
        offset; a transactional tombstone drops the producer's pending offset (Kafka's
        ``OffsetMetadataManager.replay`` / ``replayEndTransactionMarker``).

        Raises:
            CorruptObjectError: an offset record that cannot be read.
            ApiError: the partition cannot be read.
        """
        self.writer.refresh()
        return self._replay(partition, group_id)

    def _replay(self, partition: int, group_id: str | None) -> dict[str, GroupOffsetsState]:
        """:meth:`replay` over the catalog state this process holds (no refresh)."""
        location = f"{CONSUMER_OFFSETS_TOPIC}-{partition}"
        committed: dict[str, dict[TopicPartitionKey, tuple[int, OffsetAndMetadata]]] = {}
        #: producer id -> {(group, tp): (record offset, offset)}: transactional commits awaiting their marker
        pending: dict[int, dict[tuple[str, TopicPartitionKey], tuple[int, OffsetAndMetadata]]] = {}
        for table in self._tables(partition):
            columns = [table.column(c).to_pylist() for c in
                       ("offset", "key", "value", "producer_id", "is_transactional", "is_control", "control_type")]
            for rec_offset, key, value, pid, txn, control, control_type in zip(*columns):
                if control:
                    held = pending.pop(pid, {})
                    if control_type == CONTROL_COMMIT:
                        for (group, tp), (held_offset, om) in held.items():
                            offsets = committed.setdefault(group, {})
                            if tp not in offsets or offsets[tp][0] < held_offset:
                                offsets[tp] = (held_offset, om)
                    continue
                decoded = _decode(key, value, location)
                if decoded is None or (group_id is not None and decoded[0] != group_id):
                    continue
                group, tp, om = decoded
                if txn:
                    if om is None:
                        pending.get(pid, {}).pop((group, tp), None)
                    else:
                        pending.setdefault(pid, {})[(group, tp)] = (rec_offset, om)
                elif om is None:
                    committed.get(group, {}).pop(tp, None)
                else:
                    committed.setdefault(group, {})[tp] = (rec_offset, om)
        states = {group: GroupOffsetsState(offsets) for group, offsets in committed.items() if offsets}
        for held in pending.values():
            for group, tp in held:
                states.setdefault(group, GroupOffsetsState()).pending.add(tp)
        return states


def _utf16_length(text: str) -> int:
    """The length of ``text`` as Java counts it (UTF-16 code units), for Kafka's metadata limit."""
    return len(text.encode("utf-16-le")) // 2
