"""The argument and result types of the AdminClient's group, offset, topic and election calls,
named and shaped as confluent-kafka's (``confluent_kafka`` and ``confluent_kafka.admin``):
``ConsumerGroupTopicPartitions``, ``ConsumerGroupState``, ``ConsumerGroupType``,
``ConsumerGroupListing``, ``ListConsumerGroupsResult``, ``MemberAssignment``,
``MemberDescription``, ``ConsumerGroupDescription``, ``OffsetSpec``, ``IsolationLevel``,
``ListOffsetsResultInfo``, ``TopicCollection``, ``TopicPartitionInfo``, ``TopicDescription``,
``Uuid``, ``ElectionType``. Enum values are librdkafka's (``ConsumerGroupState.STABLE`` is 3), so
code written against confluent-kafka runs with only the import changed; the mapping to Kafka's
wire names (``"Stable"``, ``"classic"``) is here too.
"""

from __future__ import annotations

import base64
import uuid
from enum import Enum
from typing import Any

from .types import TopicPartition


def _enum(value: Any, kind: type[Enum]) -> Enum:
    """``value`` as a member of ``kind``: a member, its name (any case) or its number (as
    confluent-kafka's ``ConversionUtil.convert_to_enum``).

    Raises:
        ValueError: a name or number ``kind`` does not have. TypeError: anything else.
    """
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        try:
            return kind[value.upper()]
        except KeyError:
            raise ValueError(f'Unknown value "{value}": should be a {kind.__name__}') from None
    if isinstance(value, int):
        return kind(value)
    raise TypeError(f'Unknown value "{value}": should be a {kind.__name__}')


class _Ordered(Enum):
    """An enum ordered by value (confluent-kafka's enums define ``__lt__``)."""

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, type(self)):
            return NotImplemented
        return self.value < other.value


class ConsumerGroupState(_Ordered):
    """A classic group's state (confluent-kafka's ``ConsumerGroupState``; librdkafka's numbers).
    :attr:`kafka_name` is Kafka's name of it (ListGroups/DescribeGroups ``group_state``)."""

    UNKNOWN = 0
    UNKOWN = 0  # confluent-kafka's deprecated misspelling, an alias of UNKNOWN
    PREPARING_REBALANCING = 1
    COMPLETING_REBALANCING = 2
    STABLE = 3
    DEAD = 4
    EMPTY = 5

    @property
    def kafka_name(self) -> str:
        """Kafka's state name ("PreparingRebalance", "CompletingRebalance", "Stable", "Dead",
        "Empty"; "Unknown" for UNKNOWN)."""
        return _KAFKA_STATE_NAMES.get(self, "Unknown")

    @classmethod
    def from_kafka_name(cls, name: str) -> "ConsumerGroupState":
        """The state Kafka calls ``name`` (case-insensitive), UNKNOWN for any other name."""
        return _STATES_BY_KAFKA_NAME.get((name or "").lower(), cls.UNKNOWN)


_KAFKA_STATE_NAMES = {ConsumerGroupState.PREPARING_REBALANCING: "PreparingRebalance",
                      ConsumerGroupState.COMPLETING_REBALANCING: "CompletingRebalance",
                      ConsumerGroupState.STABLE: "Stable", ConsumerGroupState.DEAD: "Dead",
                      ConsumerGroupState.EMPTY: "Empty"}
_STATES_BY_KAFKA_NAME = {name.lower(): state for state, name in _KAFKA_STATE_NAMES.items()}


class ConsumerGroupType(_Ordered):
    """A group's type (confluent-kafka's ``ConsumerGroupType``, KIP-848): every group here is CLASSIC."""

    UNKNOWN = 0
    CONSUMER = 1
    CLASSIC = 2

    @property
    def kafka_name(self) -> str:
        """Kafka's name of the type (ListGroups v5 ``group_type``): "consumer", "classic"."""
        return self.name.lower()

    @classmethod
    def from_kafka_name(cls, name: str | None) -> "ConsumerGroupType":
        """The type Kafka calls ``name`` (case-insensitive), UNKNOWN for any other."""
        return {"consumer": cls.CONSUMER, "classic": cls.CLASSIC}.get((name or "").lower(), cls.UNKNOWN)


class IsolationLevel(_Ordered):
    """ListOffsets' isolation level (confluent-kafka's ``IsolationLevel``; Kafka's ids): under
    READ_COMMITTED the latest offset is the last stable offset (LSO), else the high watermark."""

    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


class ElectionType(_Ordered):
    """A leader election type (confluent-kafka's ``ElectionType``; Kafka's ``ElectionType`` ids, KIP-460)."""

    PREFERRED = 0
    UNCLEAN = 1


class ConsumerGroupTopicPartitions:
    """A group and some of its partitions (confluent-kafka's ``ConsumerGroupTopicPartitions``):
    the argument of ``list_consumer_group_offsets`` (partitions None = every partition with a
    committed offset) and ``alter_consumer_group_offsets`` (partitions with the offsets to commit),
    and the result of both (each TopicPartition with its offset, metadata, leader epoch and error)."""

    def __init__(self, group_id: str, topic_partitions: list[TopicPartition] | None = None):
        self.group_id = group_id
        self.topic_partitions = topic_partitions

    def __repr__(self) -> str:
        return f"ConsumerGroupTopicPartitions({self.group_id!r}, {self.topic_partitions!r})"


class ConsumerGroupListing:
    """One group as ``list_consumer_groups`` lists it (confluent-kafka's ``ConsumerGroupListing``).

    Attributes:
        group_id: the group.
        is_simple_consumer_group: True when its protocol type is empty (a group that only
            commits offsets, e.g. from ``assign()`` consumers or ``alter_consumer_group_offsets``).
        state: a :class:`ConsumerGroupState`. type: a :class:`ConsumerGroupType`.
    """

    def __init__(self, group_id: str, is_simple_consumer_group: bool,
                 state: ConsumerGroupState | str | int | None = None, type: ConsumerGroupType | str | int | None = None):
        self.group_id = group_id
        self.is_simple_consumer_group = is_simple_consumer_group
        if state is not None:
            self.state = _enum(state, ConsumerGroupState)
        if type is not None:
            self.type = _enum(type, ConsumerGroupType)

    def __repr__(self) -> str:
        return (f"ConsumerGroupListing({self.group_id!r}, simple={self.is_simple_consumer_group}, "
                f"state={getattr(self, 'state', None)}, type={getattr(self, 'type', None)})")


class ListConsumerGroupsResult:
    """``list_consumer_groups``' result (confluent-kafka's ``ListConsumerGroupsResult``): ``valid``,
    the :class:`ConsumerGroupListing` of every group; ``errors``, the KafkaException of a coordinator
    that could not list (COORDINATOR_LOAD_IN_PROGRESS with the groups loaded so far)."""

    def __init__(self, valid: list[ConsumerGroupListing] | None = None, errors: list[Exception] | None = None):
        self.valid = valid
        self.errors = errors


class MemberAssignment:
    """The partitions assigned to a group member (confluent-kafka's ``MemberAssignment``)."""

    def __init__(self, topic_partitions: list[TopicPartition] | None):
        self.topic_partitions = topic_partitions or []


class MemberDescription:
    """A group member as DescribeGroups describes it (confluent-kafka's ``MemberDescription``).

    Attributes:
        member_id / client_id / group_instance_id: as the member joined.
        host: the member's host as the coordinator saw it (``"/127.0.0.1"`` over the network; ""
            for an in-process consumer).
        assignment: its :class:`MemberAssignment` (empty unless the group is Stable).
        target_assignment: None (KIP-848 groups only).
    """

    def __init__(self, member_id: str, client_id: str, host: str, assignment: MemberAssignment,
                 group_instance_id: str | None = None, target_assignment: MemberAssignment | None = None):
        self.member_id = member_id
        self.client_id = client_id
        self.host = host
        self.assignment = assignment
        self.target_assignment = target_assignment
        self.group_instance_id = group_instance_id

    def __repr__(self) -> str:
        return f"MemberDescription({self.member_id!r}, client_id={self.client_id!r})"


class ConsumerGroupDescription:
    """A group as ``describe_consumer_groups`` describes it (confluent-kafka's ``ConsumerGroupDescription``).

    Attributes:
        group_id: the group. is_simple_consumer_group: its protocol type is empty.
        members: :class:`MemberDescription` list. partition_assignor: the selected protocol
            (e.g. "range"), "" when none.
        state: :class:`ConsumerGroupState` (DEAD for a group that does not exist, as
            confluent-kafka reports it). type: :class:`ConsumerGroupType` (CLASSIC).
        coordinator: the coordinator's :class:`~txlake.admin_types.Node`.
        authorized_operations: ``AclOperation`` list when asked for, else None.
    """

    def __init__(self, group_id: str, is_simple_consumer_group: bool, members: list[MemberDescription],
                 partition_assignor: str, state: ConsumerGroupState | str | int | None, coordinator: Any,
                 authorized_operations: list | None = None,
                 type: ConsumerGroupType | str | int = ConsumerGroupType.UNKNOWN):
        from .admin_acl_types import AclOperation

        self.group_id = group_id
        self.is_simple_consumer_group = is_simple_consumer_group
        self.members = members
        self.authorized_operations = [_enum(op, AclOperation) for op in authorized_operations] \
            if authorized_operations else None
        self.partition_assignor = partition_assignor
        if state is not None:
            self.state = _enum(state, ConsumerGroupState)
        if type is not None:
            self.type = _enum(type, ConsumerGroupType)
        self.coordinator = coordinator

    def __repr__(self) -> str:
        return f"ConsumerGroupDescription({self.group_id!r}, state={getattr(self, 'state', None)}, members={self.members})"


class OffsetSpec:
    """Which offset ``list_offsets`` asks for (confluent-kafka's ``OffsetSpec``): :meth:`earliest`
    (the log start offset), :meth:`latest` (the high watermark, or the LSO under READ_COMMITTED),
    :meth:`max_timestamp` (the record with the largest timestamp, KIP-734) or
    :meth:`for_timestamp` (the first offset whose timestamp is >= ``timestamp`` ms). ``OffsetSpec(n)``
    is the spec of ListOffsets' timestamp ``n`` (-2 earliest, -1 latest, -3 max timestamp, >= 0 a
    timestamp), as in confluent-kafka."""

    _value: int = 0

    def __new__(cls, index: int):
        if cls is OffsetSpec:
            if index >= 0:
                return TimestampSpec(index)
            try:
                return _FIXED[index]
            except KeyError:
                raise KeyError(index) from None
        return object.__new__(cls)

    @classmethod
    def earliest(cls) -> "OffsetSpec":
        return _FIXED[-2]

    @classmethod
    def latest(cls) -> "OffsetSpec":
        return _FIXED[-1]

    @classmethod
    def max_timestamp(cls) -> "OffsetSpec":
        return _FIXED[-3]

    @classmethod
    def for_timestamp(cls, timestamp: int) -> "OffsetSpec":
        return TimestampSpec(timestamp)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, OffsetSpec):
            return NotImplemented
        return self._value < other._value


class TimestampSpec(OffsetSpec):
    """The first offset whose timestamp is >= ``timestamp`` (ms)."""

    def __new__(cls, timestamp: int):
        return object.__new__(cls)

    def __init__(self, timestamp: int):
        self.timestamp = timestamp

    @property
    def _value(self) -> int:  # type: ignore[override]
        return self.timestamp


class EarliestSpec(OffsetSpec):
    """The log start offset."""

    _value = -2

    def __new__(cls):
        return object.__new__(cls)


class LatestSpec(OffsetSpec):
    """The high watermark (READ_UNCOMMITTED) or the LSO (READ_COMMITTED)."""

    _value = -1

    def __new__(cls):
        return object.__new__(cls)


class MaxTimestampSpec(OffsetSpec):
    """The offset of the record with the largest timestamp (KIP-734)."""

    _value = -3

    def __new__(cls):
        return object.__new__(cls)


_FIXED: dict[int, OffsetSpec] = {-2: EarliestSpec(), -1: LatestSpec(), -3: MaxTimestampSpec()}


class ListOffsetsResultInfo:
    """``list_offsets``' answer for a partition (confluent-kafka's ``ListOffsetsResultInfo``).

    Attributes:
        offset: the offset (-1 when no record has a timestamp at or after the one asked for).
        timestamp: ms, the record's timestamp (for_timestamp / max_timestamp); -1 for earliest and latest.
        leader_epoch: the partition's leader epoch (the writer lease's epoch), None when -1.
    """

    def __init__(self, offset: int, timestamp: int, leader_epoch: int):
        self.offset = offset
        self.timestamp = timestamp
        self.leader_epoch: int | None = leader_epoch if leader_epoch >= 0 else None

    def __repr__(self) -> str:
        return f"ListOffsetsResultInfo(offset={self.offset}, timestamp={self.timestamp}, leader_epoch={self.leader_epoch})"


class TopicCollection:
    """Topics by name (confluent-kafka's ``TopicCollection``), the argument of ``describe_topics``."""

    def __init__(self, topic_names: list[str]):
        self.topic_names = topic_names


class TopicPartitionInfo:
    """A partition as ``describe_topics`` describes it (confluent-kafka's ``TopicPartitionInfo``):
    its id, leader :class:`~txlake.admin_types.Node`, replicas and in-sync replicas (the one node)."""

    def __init__(self, id: int, leader: Any, replicas: list, isr: list):
        self.id = id
        self.leader = leader
        self.replicas = replicas
        self.isr = isr


class Uuid:
    """A 128-bit id such as a topic id (confluent-kafka's ``Uuid``): ``str()`` is librdkafka's
    ``rd_kafka_Uuid_base64str``, the 16 bytes in 22 characters of standard base64 without padding
    (Kafka's own ``Uuid.toString`` uses the url-safe alphabet: ``-_`` where this has ``+/``).

    Args:
        most_significant_bits / least_significant_bits: the two signed 64-bit halves (Java's).
    """

    __slots__ = ("_msb", "_lsb")

    def __init__(self, most_significant_bits: int, least_significant_bits: int):
        self._msb = int(most_significant_bits)
        self._lsb = int(least_significant_bits)

    @classmethod
    def _from_uuid(cls, value: uuid.UUID) -> "Uuid":
        def signed(x: int) -> int:
            return x - (1 << 64) if x >= 1 << 63 else x
        return cls(signed(value.int >> 64), signed(value.int & ((1 << 64) - 1)))

    def get_most_significant_bits(self) -> int:
        return self._msb

    def get_least_significant_bits(self) -> int:
        return self._lsb

    def __str__(self) -> str:
        raw = (self._msb & ((1 << 64) - 1)).to_bytes(8, "big") + (self._lsb & ((1 << 64) - 1)).to_bytes(8, "big")
        return base64.b64encode(raw).decode().rstrip("=")

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Uuid):
            return NotImplemented
        return (self._msb, self._lsb) == (other._msb, other._lsb)

    def __hash__(self) -> int:
        return hash((self._msb, self._lsb))


class TopicDescription:
    """A topic as ``describe_topics`` describes it (confluent-kafka's ``TopicDescription``).

    Attributes:
        name: the topic. topic_id: its :class:`Uuid` (the catalog's topic id).
        is_internal: True for ``__consumer_offsets`` and ``__transaction_state``.
        partitions: :class:`TopicPartitionInfo` by partition id.
        authorized_operations: None (Metadata reports none: there is no authorizer).
    """

    def __init__(self, name: str, topic_id: Uuid, is_internal: bool, partitions: list[TopicPartitionInfo],
                 authorized_operations: list | None = None):
        from .admin_acl_types import AclOperation

        self.name = name
        self.topic_id = topic_id
        self.is_internal = is_internal
        self.partitions = partitions
        self.authorized_operations = [_enum(op, AclOperation) for op in authorized_operations] \
            if authorized_operations else None

    def __repr__(self) -> str:
        return f"TopicDescription({self.name!r}, topic_id={self.topic_id}, partitions={len(self.partitions)})"


class GroupMember:
    """A member of a group as the legacy :meth:`~txlake.admin.AdminClient.list_groups` reports it
    (confluent-kafka's ``GroupMember``, from DescribeGroups).

    Attributes:
        id: the member id; client_id / client_host: as the member joined; metadata: its
        protocol metadata (bytes; the consumer protocol's subscription); assignment: its
        assignment (bytes; empty until the group is Stable).
    """

    def __init__(self) -> None:
        self.id: str | None = None
        self.client_id: str | None = None
        self.client_host: str | None = None
        self.metadata: bytes | None = None
        self.assignment: bytes | None = None


class GroupMetadata:
    """A group as the legacy :meth:`~txlake.admin.AdminClient.list_groups` reports it
    (confluent-kafka's ``GroupMetadata``; librdkafka's ``rd_kafka_group_info``).

    Attributes:
        broker: the coordinator as a ``BrokerMetadata``; id: the group id; error: a KafkaError
        or None; state: Kafka's state name (``"Stable"``, ``"Empty"``, ``"Dead"``, ...);
        protocol_type (``"consumer"``, or ``""`` for a group with committed offsets only);
        protocol: the assignor (``"range"``); members: a list of :class:`GroupMember`.
    """

    def __init__(self) -> None:
        self.broker: Any = None
        self.id: str | None = None
        self.error: Any = None
        self.state: str | None = None
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.members: list[GroupMember] = []

    def __repr__(self) -> str:
        return f"GroupMetadata({self.id}, {self.error})" if self.error is not None else f"GroupMetadata({self.id})"

    def __str__(self) -> str:
        return str(self.id)
