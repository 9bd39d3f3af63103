"""Consumer-side partition assignors and the consumer protocol's metadata bytes.

The group leader runs one of these over the members' subscriptions it gets in its
JoinGroup response and sends the result with SyncGroup (Kafka's
``ConsumerPartitionAssignor``). Results are Kafka's, partition for partition:

* ``range`` -- :class:`RangeAssignor` (Kafka's ``RangeAssignor``, without racks): per topic,
  the subscribers in order -- static members first, by ``group.instance.id``, then dynamic
  ones by member id -- get consecutive ranges; the first ``partitions % members`` get one more.
* ``roundrobin`` -- :class:`RoundRobinAssignor`: all subscribed partitions sorted by topic and
  partition are dealt to the members in the same order, skipping members not subscribed
  to the partition's topic.
* ``cooperative-sticky`` -- :class:`CooperativeStickyAssignor` (Kafka's ``AbstractStickyAssignor``
  and ``CooperativeStickyAssignor``, without racks): balanced and sticky to the partitions
  members owned in the last generation, and cooperative (KIP-429): a partition that changes
  owner is only taken from its owner in this rebalance; it is handed to its new owner in
  the follow-up rebalance its owner triggers after revoking it.

Where Kafka's result depends on the iteration order of a ``java.util.HashMap`` (which
member keeps its owned partitions when quotas run out), the same order is reproduced from
Java's hash codes, so the results match Kafka's tests.

The metadata bytes -- a member's :class:`Subscription` in JoinGroup, its :class:`Assignment`
in SyncGroup -- are versioned JSON (:func:`encode_subscription`, :func:`encode_assignment`).
"""

from __future__ import annotations

import base64
import bisect
import json
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Iterable, Mapping

from txlake.engine.transaction_state_manager import java_string_hash_code
from txlake.formats.errors import TxlakeError

__all__ = ["Assignment", "ConsumerPartitionAssignor", "ConsumerProtocolError", "CooperativeStickyAssignor",
           "RangeAssignor", "RebalanceProtocol", "RoundRobinAssignor", "Subscription", "ASSIGNORS",
           "CONSUMER_PROTOCOL_TYPE", "DEFAULT_GENERATION", "create_assignor", "decode_assignment",
           "decode_subscription", "encode_assignment", "encode_subscription", "perform_assignment",
           "validate_cooperative_assignment"]

TopicPartition = tuple[str, int]
#: The generation of a member that has none (Kafka's ``AbstractStickyAssignor.DEFAULT_GENERATION``).
DEFAULT_GENERATION = -1
#: The JoinGroup protocol type of consumers (Kafka's ``ConsumerProtocol.PROTOCOL_TYPE``).
CONSUMER_PROTOCOL_TYPE = "consumer"
#: Version of the subscription/assignment JSON.
PROTOCOL_VERSION = 1


class RebalanceProtocol(Enum):
    """Kafka's ``RebalanceProtocol``: EAGER revokes everything before a rebalance; COOPERATIVE
    (KIP-429) revokes only the partitions that move."""

    EAGER = 0
    COOPERATIVE = 1


class ConsumerProtocolError(TxlakeError):
    """Subscription or assignment bytes that are not this protocol (Kafka's ``SchemaException``)."""


@dataclass(frozen=True)
class Subscription:
    """A member's subscription (Kafka's ``ConsumerPartitionAssignor.Subscription``).

    Attributes:
        topics: the topics it subscribes to.
        user_data: the assignor's opaque data, or None.
        owned_partitions: what it owned in its last generation (cooperative/sticky assignors).
        generation_id: that generation, or -1.
        group_instance_id: its ``group.instance.id`` (from JoinGroup, not from the bytes).
    """

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    generation_id: int = DEFAULT_GENERATION
    group_instance_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "topics", tuple(self.topics))
        object.__setattr__(self, "owned_partitions", tuple((t, int(p)) for t, p in self.owned_partitions))

    @property
    def generation(self) -> int | None:
        """The generation, None when unknown (Kafka's ``Optional`` ``generationId``)."""
        return self.generation_id if self.generation_id >= 0 else None


@dataclass(frozen=True)
class Assignment:
    """A member's assignment (Kafka's ``ConsumerPartitionAssignor.Assignment``)."""

    partitions: tuple[TopicPartition, ...]
    user_data: bytes | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", tuple((t, int(p)) for t, p in self.partitions))


# ---------------------------------------------------------------------------- metadata bytes
def _b64(data: bytes | None) -> str | None:
    return base64.b64encode(data).decode("ascii") if data is not None else None


def _load(data: bytes, what: str) -> dict:
    try:
        doc = json.loads(data)
    except (ValueError, TypeError) as exc:
        raise ConsumerProtocolError(f"unreadable consumer protocol {what} ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("v") != PROTOCOL_VERSION:
        version = doc.get("v") if isinstance(doc, dict) else None
        raise ConsumerProtocolError(f"consumer protocol {what} of unknown version {version!r}")
    return doc


def _partitions(items, what: str) -> tuple[TopicPartition, ...]:
    try:
        return tuple((str(t), int(p)) for t, p in items)
    except (TypeError, ValueError) as exc:
        raise ConsumerProtocolError(f"bad partitions in consumer protocol {what}: {items!r}") from exc


def _user_data(doc: dict, what: str) -> bytes | None:
    raw = doc.get("user_data")
    if raw is None:
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except (ValueError, TypeError) as exc:
        raise ConsumerProtocolError(f"bad user data in consumer protocol {what}") from exc


def encode_subscription(subscription: Subscription) -> bytes:
    """The JoinGroup protocol metadata of a member::

        {"v": 1, "topics": [sorted], "owned_partitions": [[topic, partition], ...sorted],
         "generation_id": int, "user_data": base64 | null}

    The encoding is canonical (sorted, compact), so an unchanged subscription gives the same
    bytes and the coordinator sees no metadata change."""
    doc = {"v": PROTOCOL_VERSION, "topics": sorted(set(subscription.topics)),
           "owned_partitions": [list(tp) for tp in sorted(set(subscription.owned_partitions))],
           "generation_id": subscription.generation_id, "user_data": _b64(subscription.user_data)}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_subscription(data: bytes, group_instance_id: str | None = None) -> Subscription:
    """Decode :func:`encode_subscription` bytes (``group_instance_id`` comes from JoinGroup).

    Raises:
        ConsumerProtocolError: not a subscription of this version.
    """
    doc = _load(data, "subscription")
    topics = doc.get("topics")
    if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
        raise ConsumerProtocolError(f"bad topics in consumer protocol subscription: {topics!r}")
    generation = doc.get("generation_id", DEFAULT_GENERATION)
    if isinstance(generation, bool) or not isinstance(generation, int):
        raise ConsumerProtocolError(f"bad generation in consumer protocol subscription: {generation!r}")
    return Subscription(tuple(topics), _user_data(doc, "subscription"),
                        _partitions(doc.get("owned_partitions", []), "subscription"), generation, group_instance_id)


def encode_assignment(assignment: Assignment) -> bytes:
    """The SyncGroup assignment bytes: ``{"v": 1, "partitions": [[topic, partition], ...], "user_data": ...}``."""
    doc = {"v": PROTOCOL_VERSION, "partitions": [list(tp) for tp in assignment.partitions],
           "user_data": _b64(assignment.user_data)}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_assignment(data: bytes) -> Assignment:
    """Decode :func:`encode_assignment` bytes; empty bytes (a member the leader left out, or a
    failed SyncGroup) are an empty assignment, as Kafka.

    Raises:
        ConsumerProtocolError: not an assignment of this version.
    """
    if not data:
        return Assignment(())
    doc = _load(data, "assignment")
    return Assignment(_partitions(doc.get("partitions", []), "assignment"), _user_data(doc, "assignment"))


# ---------------------------------------------------------------------------- Java iteration order
def _spread(hash_code: int) -> int:
    h = hash_code & 0xFFFFFFFF
    return h ^ (h >> 16)


def _capacity(size: int) -> int:
    """The table size of a default ``java.util.HashMap`` that received ``size`` entries."""
    capacity = 16
    while size > capacity * 3 // 4:
        capacity *= 2
    return capacity


def java_hash_map_order(keys: Iterable[str]) -> list[str]:
    """The iteration order of a ``new HashMap<>()`` of String keys put in this order: by hash
    bucket, then insertion order within a bucket (Java 8+ keeps it across resizes)."""
    keys = list(dict.fromkeys(keys))
    mask = _capacity(len(keys)) - 1
    return sorted(keys, key=lambda k: _spread(java_string_hash_code(k)) & mask)


def _topic_partition_hash(tp: TopicPartition) -> int:
    """Java's ``TopicPartition.hashCode``: ``31 * (31 + partition) + topic.hashCode()``."""
    return (31 * (31 + tp[1]) + java_string_hash_code(tp[0])) & 0xFFFFFFFF


class _JavaHashSet:
    """A set of partitions that knows which one a ``java.util.HashSet`` iterator returns first."""

    def __init__(self) -> None:
        self._items: dict[TopicPartition, int] = {}
        self._seq = 0
        self._capacity = 16

    def add(self, tp: TopicPartition) -> None:
        if tp not in self._items:
            self._seq += 1
            self._items[tp] = self._seq
            self._capacity = max(self._capacity, _capacity(len(self._items)))  # tables never shrink

    def remove(self, tp: TopicPartition) -> None:
        self._items.pop(tp, None)

    def __bool__(self) -> bool:
        return bool(self._items)

    def first(self) -> TopicPartition:
        mask = self._capacity - 1
        return min(self._items, key=lambda tp: (_spread(_topic_partition_hash(tp)) & mask, self._items[tp]))


# ---------------------------------------------------------------------------- assignors
def _member_order(member_id: str, subscription: Subscription) -> tuple:
    """Kafka's ``MemberInfo`` order: static members first by ``group.instance.id``, then dynamic
    members by member id."""
    if subscription.group_instance_id is not None:
        return (0, subscription.group_instance_id)
    return (1, member_id)


class ConsumerPartitionAssignor(ABC):
    """Kafka's ``ConsumerPartitionAssignor`` / ``AbstractPartitionAssignor``."""

    #: the protocol name members send in JoinGroup
    name: str = ""

    def supported_protocols(self) -> list[RebalanceProtocol]:
        """The rebalance protocols it supports, most preferred first."""
        return [RebalanceProtocol.EAGER]

    def subscription_user_data(self, topics: Iterable[str]) -> bytes | None:
        """The user data to put in this member's next subscription."""
        return None

    def on_assignment(self, assignment: Assignment, generation_id: int) -> None:
        """Called on the member with its new assignment and generation after SyncGroup."""

    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        """The assignment of every member: ``{member id: [(topic, partition), ...]}``.

        Args:
            partitions_per_topic: partition counts of the topics that exist (others are skipped,
                as are topics nobody subscribes to and topics without partitions).
            subscriptions: member id -> subscription; the mapping's order is the order in which
                Kafka's leader would have put them in its ``HashMap``.
        """
        subscribed = {t for s in subscriptions.values() for t in s.topics}
        counts = {t: n for t, n in partitions_per_topic.items() if t in subscribed and n > 0}
        return self._assign(counts, subscriptions)

    @abstractmethod
    def _assign(self, partitions_per_topic: dict[str, int],
                subscriptions: Mapping[str, Subscription]) -> dict[str, list[TopicPartition]]:
        ...


class RangeAssignor(ConsumerPartitionAssignor):
    """Kafka's ``RangeAssignor`` (``range``), without rack awareness. Each member's partitions
    are listed sorted by topic, then partition."""

    name = "range"

    def _assign(self, partitions_per_topic, subscriptions):
        assignment: dict[str, list[TopicPartition]] = {member_id: [] for member_id in subscriptions}
        for topic in sorted(partitions_per_topic):
            members = sorted((m for m, s in subscriptions.items() if topic in s.topics),
                             key=lambda m: _member_order(m, subscriptions[m]))
            if not members:
                continue
            per_member, extra = divmod(partitions_per_topic[topic], len(members))
            start = 0
            for i, member_id in enumerate(members):
                count = per_member + (1 if i < extra else 0)
                assignment[member_id].extend((topic, p) for p in range(start, start + count))
                start += count
        return assignment


class RoundRobinAssignor(ConsumerPartitionAssignor):
    """Kafka's ``RoundRobinAssignor`` (``roundrobin``)."""

    name = "roundrobin"

    def _assign(self, partitions_per_topic, subscriptions):
        assignment: dict[str, list[TopicPartition]] = {member_id: [] for member_id in subscriptions}
        members = sorted(subscriptions, key=lambda m: _member_order(m, subscriptions[m]))
        topics = sorted({t for s in subscriptions.values() for t in s.topics if t in partitions_per_topic})
        i = 0
        for topic in topics:
            for partition in range(partitions_per_topic[topic]):
                while topic not in subscriptions[members[i]].topics:
                    i = (i + 1) % len(members)
                assignment[members[i]].append((topic, partition))
                i = (i + 1) % len(members)
        return assignment


class _SortedMembers:
    """Kafka's ``TreeSet`` of members ordered by (number of assigned partitions, member id).
    A member's count may change only while it is out of the set."""

    def __init__(self, current: dict[str, list[TopicPartition]]):
        self._current = current
        self._entries: list[tuple[int, str]] = []

    def add(self, member_id: str) -> None:
        entry = (len(self._current[member_id]), member_id)
        i = bisect.bisect_left(self._entries, entry)
        if i == len(self._entries) or self._entries[i] != entry:
            self._entries.insert(i, entry)

    def remove(self, member_id: str) -> None:
        entry = (len(self._current[member_id]), member_id)
        i = bisect.bisect_left(self._entries, entry)
        if i < len(self._entries) and self._entries[i] == entry:
            del self._entries[i]

    def first(self) -> str:
        return self._entries[0][1]

    def last(self) -> str:
        return self._entries[-1][1]

    def __iter__(self):
        return iter([m for _, m in self._entries])


class _PartitionMovements:
    """The partitions moved during one general-case sticky assignment, to keep it sticky
    (Kafka's ``PartitionMovements``)."""

    def __init__(self) -> None:
        self._by_topic: dict[str, dict[tuple[str, str], _JavaHashSet]] = {}
        self._moves: dict[TopicPartition, tuple[str, str]] = {}

    def _remove_record(self, tp: TopicPartition) -> tuple[str, str]:
        pair = self._moves.pop(tp)
        pairs = self._by_topic[tp[0]]
        pairs[pair].remove(tp)
        if not pairs[pair]:
            del pairs[pair]
        if not pairs:
            del self._by_topic[tp[0]]
        return pair

    def _add_record(self, tp: TopicPartition, pair: tuple[str, str]) -> None:
        self._moves[tp] = pair
        self._by_topic.setdefault(tp[0], {}).setdefault(pair, _JavaHashSet()).add(tp)

    def move(self, tp: TopicPartition, old: str, new: str) -> None:
        if tp in self._moves:
            src, _ = self._remove_record(tp)
            if src != new:  # not moving back to where it came from
                self._add_record(tp, (src, new))
        else:
            self._add_record(tp, (old, new))

    def partition_to_move(self, tp: TopicPartition, old: str, new: str) -> TopicPartition:
        """Moving a partition of ``tp``'s topic from ``old`` to ``new``: if one already moved the
        other way, move that one back instead (Kafka's ``getTheActualPartitionToBeMoved``)."""
        pairs = self._by_topic.get(tp[0])
        if pairs is None:
            return tp
        if tp in self._moves:
            old = self._moves[tp][0]
        reverse = pairs.get((new, old))
        return reverse.first() if reverse else tp

    def is_sticky(self) -> bool:
        """False when partitions of one topic moved both ways between two members."""
        for pairs in self._by_topic.values():
            if any((dst, src) in pairs for src, dst in pairs):
                return False
        return True


class _AbstractStickyAssignor(ConsumerPartitionAssignor):
    """Kafka's ``AbstractStickyAssignor`` without rack awareness.

    Attributes:
        partitions_transferring_ownership: after :meth:`assign`, the partitions given to a new
            owner in this assignment (``{partition: new owner}``); None after the general
            (unequal subscriptions) algorithm, which does not track them.
        max_generation: the highest generation among the subscriptions of the last assignment.
    """

    def __init__(self) -> None:
        self.partitions_transferring_ownership: dict[TopicPartition, str] | None = {}
        self.max_generation = DEFAULT_GENERATION
        self._movements = _PartitionMovements()

    @abstractmethod
    def member_data(self, subscription: Subscription) -> tuple[tuple[TopicPartition, ...], int | None]:
        """``(owned partitions, generation or None)`` of a member (Kafka's ``memberData``)."""

    def is_sticky(self) -> bool:
        """Whether the last general-case assignment moved no partitions of a topic both ways
        between two members (Kafka's ``isSticky``)."""
        return self._movements.is_sticky()

    def _assign(self, partitions_per_topic, subscriptions):
        # Kafka keeps maxGeneration across calls; per call it is the same, and resetting it keeps
        # a recreated group (generations starting over) from being judged against the old one
        self.max_generation = DEFAULT_GENERATION
        self._movements = _PartitionMovements()
        order = java_hash_map_order(subscriptions)
        owned: dict[str, list[TopicPartition]] = {}
        multiply_claimed: set[TopicPartition] = set()
        if self._all_subscriptions_equal(partitions_per_topic, subscriptions, order, owned, multiply_claimed):
            self.partitions_transferring_ownership = {}
            return _ConstrainedAssignment(self, partitions_per_topic, owned, multiply_claimed).build()
        self.partitions_transferring_ownership = None
        return _GeneralAssignment(self, partitions_per_topic, owned, subscriptions, order).build()

    def _all_subscriptions_equal(self, partitions_per_topic, subscriptions, order, owned_by, multiply_claimed) -> bool:
        """Kafka's ``allSubscriptionsEqual``: also collects each member's still-valid owned
        partitions; a partition claimed by two members keeps the one of the higher generation,
        and is dropped from both when their generations are equal."""
        equal = True
        subscribed: set[str] = set()
        previous_owner: dict[TopicPartition, str] = {}
        for member_id in order:
            subscription = subscriptions[member_id]
            if not subscribed:
                subscribed.update(subscription.topics)
            elif equal and set(subscription.topics) != subscribed:
                equal = False
            partitions, generation = self.member_data(subscription)
            generation = DEFAULT_GENERATION if generation is None else generation
            self.max_generation = max(self.max_generation, generation)
            owned: list[TopicPartition] = []
            owned_by[member_id] = owned
            for tp in partitions:
                if tp[0] not in partitions_per_topic or not 0 <= tp[1] < partitions_per_topic[tp[0]]:
                    continue
                other = previous_owner.get(tp)
                if other is None:
                    owned.append(tp)
                    previous_owner[tp] = member_id
                    continue
                other_generation = subscriptions[other].generation_id
                if generation == other_generation:
                    multiply_claimed.add(tp)
                    _discard(owned_by[other], tp)
                    previous_owner[tp] = member_id
                elif generation > other_generation:
                    owned.append(tp)
                    _discard(owned_by[other], tp)
                    previous_owner[tp] = member_id
        return equal


def _discard(items: list, item) -> None:
    try:
        items.remove(item)
    except ValueError:
        pass


class StickyAssignmentError(TxlakeError):
    """The sticky algorithm reached a state Kafka reports with ``IllegalStateException`` (a bug)."""


class _ConstrainedAssignment:
    """Kafka's ``ConstrainedAssignmentBuilder``: every member subscribes to the same topics.

    1. Each member keeps its owned partitions up to its quota (``maxQuota`` for the first
       ``partitions % members`` members that own that many, else ``minQuota``);
    2. the rest are dealt round-robin to the members under quota, sorted by member id, then
       to those at ``minQuota`` that may still take one more.
    """

    def __init__(self, assignor: _AbstractStickyAssignor, partitions_per_topic: dict[str, int],
                 owned: dict[str, list[TopicPartition]], multiply_claimed: set[TopicPartition]):
        self.assignor = assignor
        self.partitions_per_topic = partitions_per_topic
        self.owned = owned
        self.multiply_claimed = multiply_claimed
        self.maybe_revoked: dict[TopicPartition, str] = {}
        total = sum(partitions_per_topic.values())
        members = len(owned)
        self.min_quota = total // members
        self.max_quota = -(-total // members)
        self.expected_over_min = total % members
        self.current_over_min = 0
        self.assignment: dict[str, list[TopicPartition]] = {m: [] for m in owned}
        self.under_min: list[str] = []
        self.exactly_min: list[str] = []

    def build(self) -> dict[str, list[TopicPartition]]:
        assigned = self._assign_owned_partitions()
        unassigned = [(t, p) for t in sorted(self.partitions_per_topic) for p in range(self.partitions_per_topic[t])
                      if (t, p) not in assigned]
        self.under_min.sort()
        self.exactly_min.sort()
        self._assign_round_robin(unassigned)
        self._verify_unfilled_members()
        return self.assignment

    def _assign_owned_partitions(self) -> set[TopicPartition]:
        assigned: set[TopicPartition] = set()
        for member_id, owned in self.owned.items():
            partitions = sorted(owned, key=lambda tp: (tp[1], tp[0]))
            partitions = [tp for tp in partitions if tp not in self.multiply_claimed]
            if len(partitions) < self.min_quota:
                keep = partitions
                self.under_min.append(member_id)
            elif len(partitions) >= self.max_quota and self.current_over_min < self.expected_over_min:
                self.current_over_min += 1
                if self.current_over_min == self.expected_over_min:
                    self.exactly_min.clear()
                keep = partitions[:self.max_quota]
            else:
                keep = partitions[:self.min_quota]
                if self.current_over_min < self.expected_over_min:
                    self.exactly_min.append(member_id)
            for tp in partitions[len(keep):]:
                self.maybe_revoked[tp] = member_id
            self.assignment[member_id].extend(keep)
            assigned.update(keep)
        return assigned

    def _assign_round_robin(self, unassigned: list[TopicPartition]) -> None:
        i = 0  # Kafka's iterator over the members under minQuota
        for tp in unassigned:
            from_iterator = True
            if i < len(self.under_min):
                member_id = self.under_min[i]
                i += 1
            elif not self.under_min and not self.exactly_min:
                raise StickyAssignmentError(f"No more unfilled consumers to be assigned; {tp} is left")
            elif not self.under_min:
                member_id = self.exactly_min.pop(0)
                from_iterator = False
            else:
                member_id, i = self.under_min[0], 1
            count = self._assign_new_partition(tp, member_id)
            if count == self.min_quota:
                if not from_iterator:
                    raise StickyAssignmentError(f"member {member_id} reached minQuota from the maxQuota candidates")
                i -= 1
                del self.under_min[i]
                self.exactly_min.append(member_id)
            elif count == self.max_quota:
                self.current_over_min += 1

    def _assign_new_partition(self, tp: TopicPartition, member_id: str) -> int:
        self.assignment[member_id].append(tp)
        # every owned partition within quota was kept: this one is new to the member
        previous = self.maybe_revoked.get(tp)
        if (previous is not None and previous != member_id) or tp in self.multiply_claimed:
            self.assignor.partitions_transferring_ownership[tp] = member_id
        return len(self.assignment[member_id])

    def _verify_unfilled_members(self) -> None:
        if not self.under_min:
            return
        if self.current_over_min != self.expected_over_min:
            raise StickyAssignmentError("We haven't reached the expected number of members with more than the "
                                        "minQuota partitions, but no more partitions to be assigned")
        for member_id in self.under_min:
            if len(self.assignment[member_id]) != self.min_quota:
                raise StickyAssignmentError(f"Consumer: [{member_id}] doesn't reach minQuota partitions, and no "
                                            "more partitions to be assigned")


class _GeneralAssignment:
    """Kafka's ``GeneralAssignmentBuilder``: members subscribe to different topics.

    Keep every owned partition still subscribed, give the unassigned ones to the least loaded
    subscriber, then move partitions from members with 2+ more than another subscriber until
    balanced -- preferring to move a partition back to its owner of the previous generation,
    and keeping the result only if it is better balanced than before.
    """

    def __init__(self, assignor: _AbstractStickyAssignor, partitions_per_topic: dict[str, int],
                 current: dict[str, list[TopicPartition]], subscriptions: Mapping[str, Subscription],
                 order: list[str]):
        self.assignor = assignor
        self.partitions_per_topic = partitions_per_topic
        self.subscriptions = subscriptions
        self.order = order
        self.current = current
        self.total = sum(partitions_per_topic.values())
        self.topic_members: dict[str, list[str]] = {t: [] for t in partitions_per_topic}
        self.member_topics: dict[str, list[str]] = {}
        for member_id in order:
            topics = [t for t in subscriptions[member_id].topics if t in partitions_per_topic]
            self.member_topics[member_id] = topics
            for topic in topics:
                self.topic_members[topic].append(member_id)
            current.setdefault(member_id, [])
        self.owner = {tp: m for m, tps in current.items() for tp in tps}
        topics = sorted(self.topic_members, key=lambda t: (len(self.topic_members[t]), t))
        self.sorted_partitions = [(t, p) for t in topics for p in range(partitions_per_topic[t])]
        self.sorted_members = _SortedMembers(current)
        self.revocation_required = False

    def build(self) -> dict[str, list[TopicPartition]]:
        previous = self._previous_assignment()
        assigned = self._assign_owned_partitions()
        unassigned = [tp for tp in self.sorted_partitions if tp not in assigned]
        for member_id in self.current:
            self.sorted_members.add(member_id)
        self._balance(previous, unassigned)
        return self.current

    def _previous_assignment(self) -> dict[TopicPartition, tuple[str, int]]:
        """Partitions of members of older generations: ``{partition: (member, generation)}``,
        the newest such owner wins (Kafka's ``prepopulateCurrentAssignments``)."""
        previous: dict[TopicPartition, tuple[str, int]] = {}
        max_generation = self.assignor.max_generation
        for member_id in self.order:
            partitions, generation = self.assignor.member_data(self.subscriptions[member_id])
            if generation is not None and generation < max_generation:
                pass
            elif generation is None and max_generation > DEFAULT_GENERATION:
                generation = DEFAULT_GENERATION
            else:
                continue
            for tp in partitions:
                if tp not in previous or generation > previous[tp][1]:
                    previous[tp] = (member_id, generation)
        return previous

    def _assign_owned_partitions(self) -> set[TopicPartition]:
        assigned: set[TopicPartition] = set()
        for member_id, partitions in self.current.items():
            topics = self.subscriptions[member_id].topics
            for tp in list(partitions):
                if tp[0] not in self.topic_members:
                    partitions.remove(tp)
                    self.owner.pop(tp, None)
                elif tp[0] not in topics:
                    partitions.remove(tp)  # no longer subscribed: revoked
                    self.revocation_required = True
                else:
                    assigned.add(tp)
        return assigned

    def _max_assignment_size(self, topics: list[str]) -> int:
        if len(topics) == len(self.partitions_per_topic):
            return self.total
        return sum(self.partitions_per_topic[t] for t in topics)

    def _is_balanced(self) -> bool:
        smallest = len(self.current[self.sorted_members.first()])
        largest = len(self.current[self.sorted_members.last()])
        if smallest >= largest - 1:
            return True
        owner = {tp: m for m, tps in self.current.items() for tp in tps}
        for member_id in self.sorted_members:
            partitions = self.current[member_id]
            count = len(partitions)
            topics = self.member_topics[member_id]
            if count == self._max_assignment_size(topics):
                continue
            held = set(partitions)
            for topic in topics:
                for p in range(self.partitions_per_topic[topic]):
                    other = owner.get((topic, p))
                    if (topic, p) not in held and other is not None and count + 1 < len(self.current[other]):
                        return False
        return True

    @staticmethod
    def _balance_score(assignment: dict[str, list[TopicPartition]]) -> int:
        sizes = [len(tps) for tps in assignment.values()]
        return sum(abs(a - b) for i, a in enumerate(sizes) for b in sizes[i + 1:])

    def _can_topic_participate(self, topic: str) -> bool:
        return len(self.topic_members[topic]) >= 2

    def _can_member_participate(self, member_id: str) -> bool:
        partitions = self.current[member_id]
        if len(partitions) < self._max_assignment_size(self.member_topics[member_id]):
            return True
        return any(self._can_topic_participate(tp[0]) for tp in partitions)

    def _assign_to_least_loaded(self, tp: TopicPartition) -> None:
        for member_id in self.sorted_members:
            if tp[0] in self.member_topics[member_id]:
                self.sorted_members.remove(member_id)
                self.current[member_id].append(tp)
                self.owner[tp] = member_id
                self.sorted_members.add(member_id)
                return

    def _balance(self, previous: dict[TopicPartition, tuple[str, int]], unassigned: list[TopicPartition]) -> None:
        initializing = not self.current[self.sorted_members.last()]
        for tp in unassigned:
            if self.topic_members[tp[0]]:
                self._assign_to_least_loaded(tp)
        # only partitions with 2+ potential owners, and members that may change, take part
        fixed = {(t, p) for t in self.topic_members if not self._can_topic_participate(t)
                 for p in range(self.partitions_per_topic[t])}
        self.sorted_partitions = [tp for tp in self.sorted_partitions if tp not in fixed]
        unassigned = [tp for tp in unassigned if tp not in fixed]
        fixed_members: dict[str, list[TopicPartition]] = {}
        for member_id in list(self.member_topics):
            if not self._can_member_participate(member_id):
                self.sorted_members.remove(member_id)
                fixed_members[member_id] = self.current.pop(member_id)
        before = {m: list(tps) for m, tps in self.current.items()}
        owner_before = dict(self.owner)
        if not self.revocation_required:
            self._perform_reassignments(unassigned, previous)
        reassigned = self._perform_reassignments(self.sorted_partitions, previous)
        if not initializing and reassigned and self._balance_score(self.current) >= self._balance_score(before):
            self.current.clear()
            self.current.update(before)
            self.owner = owner_before
        for member_id, partitions in fixed_members.items():
            self.current[member_id] = partitions
            self.sorted_members.add(member_id)

    def _perform_reassignments(self, partitions: list[TopicPartition],
                               previous: dict[TopicPartition, tuple[str, int]]) -> bool:
        reassigned = False
        while True:
            modified = False
            for tp in partitions:
                if self._is_balanced():
                    break
                member_id = self.owner.get(tp)
                if member_id is None or member_id not in self.current:
                    continue
                size = len(self.current[member_id])
                prior = previous.get(tp)
                if (prior is not None and prior[0] in self.current and tp[0] in self.member_topics[prior[0]]
                        and size > len(self.current[prior[0]]) + 1):
                    self._reassign(tp, prior[0])
                    reassigned = modified = True
                    continue
                for other in self.topic_members[tp[0]]:
                    if other in self.current and size > len(self.current[other]) + 1:
                        self._reassign(tp, next(m for m in self.sorted_members if tp[0] in self.member_topics[m]))
                        reassigned = modified = True
                        break
            if not modified:
                return reassigned

    def _reassign(self, tp: TopicPartition, new_owner: str) -> None:
        movements = self.assignor._movements
        tp = movements.partition_to_move(tp, self.owner[tp], new_owner)
        old_owner = self.owner[tp]
        self.sorted_members.remove(old_owner)
        self.sorted_members.remove(new_owner)
        movements.move(tp, old_owner, new_owner)
        self.current[old_owner].remove(tp)
        self.current[new_owner].append(tp)
        self.owner[tp] = new_owner
        self.sorted_members.add(new_owner)
        self.sorted_members.add(old_owner)


class CooperativeStickyAssignor(_AbstractStickyAssignor):
    """Kafka's ``CooperativeStickyAssignor`` (``cooperative-sticky``, KIP-429).

    Its user data is the member's last generation (a big-endian int32, as Kafka's), which it
    learns from :meth:`on_assignment`; subscriptions carry the generation themselves too.
    A partition moving to a new owner is removed from the result (it stays unassigned until
    its owner revoked it and the follow-up rebalance hands it over).
    """

    name = "cooperative-sticky"

    def __init__(self) -> None:
        super().__init__()
        self.generation = DEFAULT_GENERATION

    def supported_protocols(self) -> list[RebalanceProtocol]:
        return [RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER]

    def on_assignment(self, assignment: Assignment, generation_id: int) -> None:
        self.generation = generation_id

    def subscription_user_data(self, topics: Iterable[str]) -> bytes | None:
        return struct.pack(">i", self.generation)

    def member_data(self, subscription: Subscription) -> tuple[tuple[TopicPartition, ...], int | None]:
        if subscription.generation is not None:
            return subscription.owned_partitions, subscription.generation
        if subscription.user_data is None:
            return subscription.owned_partitions, None
        try:
            (generation,) = struct.unpack(">i", subscription.user_data)
        except struct.error:
            generation = DEFAULT_GENERATION
        return subscription.owned_partitions, generation

    def _assign(self, partitions_per_topic, subscriptions):
        assignment = super()._assign(partitions_per_topic, subscriptions)
        moving = self.partitions_transferring_ownership
        if moving is None:
            moving = _partitions_transferring_ownership(subscriptions, assignment)
        for tp, member_id in moving.items():
            _discard(assignment[member_id], tp)
        return assignment


def _partitions_transferring_ownership(subscriptions: Mapping[str, Subscription],
                                       assignment: dict[str, list[TopicPartition]]) -> dict[TopicPartition, str]:
    """Partitions assigned to a member that did not own them while another member loses them
    (Kafka's ``computePartitionsTransferringOwnership``)."""
    added: dict[TopicPartition, str] = {}
    revoked: set[TopicPartition] = set()
    for member_id, partitions in assignment.items():
        owned = set(subscriptions[member_id].owned_partitions)
        added.update((tp, member_id) for tp in partitions if tp not in owned)
        revoked.update(owned.difference(partitions))
    return {tp: m for tp, m in added.items() if tp in revoked}


#: The assignors by ``partition.assignment.strategy`` name.
ASSIGNORS: dict[str, Callable[[], ConsumerPartitionAssignor]] = {
    RangeAssignor.name: RangeAssignor,
    RoundRobinAssignor.name: RoundRobinAssignor,
    CooperativeStickyAssignor.name: CooperativeStickyAssignor,
}


def create_assignor(name: str) -> ConsumerPartitionAssignor:
    """A new assignor called ``name`` (``range``, ``roundrobin``, ``cooperative-sticky``).

    Raises:
        ValueError: an unknown name.
    """
    try:
        return ASSIGNORS[name]()
    except KeyError:
        raise ValueError(f"unknown partition assignor {name!r}; expected one of {sorted(ASSIGNORS)}") from None


def validate_cooperative_assignment(owned: Mapping[str, Iterable[TopicPartition]],
                                    assignment: Mapping[str, Iterable[TopicPartition]]) -> None:
    """With the COOPERATIVE protocol no partition may go to a new owner while another member
    still owns it (Kafka's ``ConsumerCoordinator.validateCooperativeAssignment``).

    Raises:
        StickyAssignmentError: the assignor broke that rule (names the partitions).
    """
    added: set[TopicPartition] = set()
    revoked: set[TopicPartition] = set()
    for member_id, partitions in assignment.items():
        partitions = set(partitions)
        mine = set(owned.get(member_id, ()))
        added |= partitions - mine
        revoked |= mine - partitions
    both = sorted(added & revoked)
    if both:
        raise StickyAssignmentError(f"Assignor supporting the COOPERATIVE protocol violates its requirements: "
                                    f"partitions {both} are reassigned while still owned by other members")


def perform_assignment(assignor: ConsumerPartitionAssignor, members: Iterable,
                       partitions_per_topic: Mapping[str, int],
                       protocol: RebalanceProtocol | None = None) -> dict[str, bytes]:
    """The leader's part of SyncGroup (Kafka's ``ConsumerCoordinator.onLeaderElected``): decode
    the members of a JoinGroup response, run the assignor, check the cooperative rule, and
    encode each member's assignment.

    Args:
        members: the JoinGroup response's members -- objects with ``member_id``,
            ``group_instance_id`` and ``metadata`` (``JoinGroupMember``), in response order.
        partitions_per_topic: partition counts of the existing topics.
        protocol: the group's rebalance protocol (default: the assignor's preferred one).

    Returns:
        member id -> assignment bytes, for every member.

    Raises:
        ConsumerProtocolError: a member's metadata cannot be decoded.
        StickyAssignmentError: a cooperative assignment reassigns an owned partition.
    """
    subscriptions = {m.member_id: decode_subscription(m.metadata, m.group_instance_id) for m in members}
    result = assignor.assign(partitions_per_topic, subscriptions)
    if (protocol or assignor.supported_protocols()[0]) is RebalanceProtocol.COOPERATIVE:
        validate_cooperative_assignment({m: s.owned_partitions for m, s in subscriptions.items()}, result)
    return {member_id: encode_assignment(Assignment(tuple(result.get(member_id, ()))))
            for member_id in subscriptions}
