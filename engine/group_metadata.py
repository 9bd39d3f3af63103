"""A consumer group's state at the group coordinator: Kafka's classic ``ClassicGroup``.

Follows ``org.apache.kafka.coordinator.group.classic.ClassicGroup`` /
``ClassicGroupMember`` / ``ClassicGroupState`` (formerly
``kafka.coordinator.group.GroupMetadata.scala`` and ``MemberMetadata.scala``): the classic
JoinGroup/SyncGroup membership protocol with KIP-345 static membership and KIP-394
pending members. No I/O and no timers: the :class:`~.group_coordinator.GroupCoordinator`
drives it, holding its lock around every call (Kafka's ``@nonthreadsafe``).

State machine (Kafka's ``validPreviousStates``)::

    PreparingRebalance  <- Stable, CompletingRebalance, Empty   (a member joins, leaves or fails)
    CompletingRebalance <- PreparingRebalance                   (every member rejoined: new generation)
    Stable              <- CompletingRebalance                  (the leader's assignment is stored)
    Empty               <- PreparingRebalance                   (the last member left)
    Dead                <- Stable, PreparingRebalance, CompletingRebalance, Empty, Dead
                                                                (deleted or unloaded)

A transition Kafka forbids raises :class:`IllegalGroupStateError` (an
``IllegalStateException`` in Kafka): it is a coordinator bug, never a client error.

The module also defines the group's record in ``__consumer_offsets`` (Kafka's
``GroupMetadataKey``/``GroupMetadataValue``), as versioned JSON::

    key   {"v": 1, "type": "group", "group": <group id>}
    value {"v": 1, "protocol_type": str, "generation": int, "protocol": str|null,
           "leader": str|null, "current_state_timestamp": ms,
           "members": [{"member_id", "group_instance_id", "client_id", "client_host",
                        "rebalance_timeout", "session_timeout",
                        "subscription": base64, "assignment": base64}, ...]}
    value None = tombstone: the group was deleted.

The ``"type": "group"`` field tells these keys apart from the offset-commit keys of
:mod:`.group_offsets` (which have ``topic``/``partition`` and no ``type``).
"""

from __future__ import annotations

import base64
import json
import logging
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

from txlake.formats.errors import CorruptObjectError, TxlakeError, UnsupportedFormatVersionError

from .errors import Errors

if TYPE_CHECKING:
    from .group_offsets import OffsetAndMetadata

log = logging.getLogger(__name__)

#: The member id of a member that does not have one yet (Kafka's ``JoinGroupRequest.UNKNOWN_MEMBER_ID``).
UNKNOWN_MEMBER_ID = ""
#: The generation of a request outside group management (Kafka's ``NoGeneration``).
NO_GENERATION = -1
NO_LEADER = ""
NO_PROTOCOL = ""
#: The protocol type of consumers (Kafka's ``ConsumerProtocol.PROTOCOL_TYPE``).
CONSUMER_PROTOCOL_TYPE = "consumer"
#: The group record's format version.
RECORD_VERSION = 1
RECORD_TYPE = "group"

#: One protocol a member supports: ``(name, metadata bytes)``, e.g. ``("range", <subscription>)``.
Protocol = tuple[str, bytes]


class IllegalGroupStateError(TxlakeError):
    """A transition or call Kafka's ClassicGroup refuses with ``IllegalStateException``.

    It means the coordinator broke the protocol (a bug or a corrupt log), never that a
    client sent a bad request: client errors are answered with Kafka error codes.
    """


class GroupState(Enum):
    """Kafka's ``ClassicGroupState``; the value is Kafka's name (as DescribeGroups reports it)."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    @property
    def valid_previous_states(self) -> frozenset[GroupState]:
        """The states this one may be entered from (Kafka's ``validPreviousStates``)."""
        return VALID_PREVIOUS_STATES[self]

    @classmethod
    def parse(cls, name: str) -> GroupState | None:
        """The state called ``name`` (case-insensitive, as ListGroups' filter), or None."""
        return _BY_LOWER_NAME.get(name.lower())

    def __str__(self) -> str:
        return self.value


_S = GroupState
#: Kafka's ``ClassicGroupState`` valid previous states.
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    _S.PREPARING_REBALANCE: frozenset({_S.STABLE, _S.COMPLETING_REBALANCE, _S.EMPTY}),
    _S.COMPLETING_REBALANCE: frozenset({_S.PREPARING_REBALANCE}),
    _S.STABLE: frozenset({_S.COMPLETING_REBALANCE}),
    _S.DEAD: frozenset({_S.STABLE, _S.PREPARING_REBALANCE, _S.COMPLETING_REBALANCE, _S.EMPTY, _S.DEAD}),
    _S.EMPTY: frozenset({_S.PREPARING_REBALANCE}),
}
del _S
_BY_LOWER_NAME = {s.value.lower(): s for s in GroupState}


# ---------------------------------------------------------------------------- responses
@dataclass(frozen=True)
class JoinGroupMember:
    """One member in the leader's JoinGroup response: its id, instance id and protocol metadata."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinGroupResult:
    """A JoinGroup response (Kafka's ``JoinGroupResponseData``).

    ``members`` is filled for the leader only (it runs the assignor over them);
    ``skip_assignment`` tells a static leader that rejoined a Stable group to sync
    without computing a new assignment (JoinGroup v9+).
    """

    error: Errors
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = NO_LEADER
    skip_assignment: bool = False
    members: tuple[JoinGroupMember, ...] = ()

    @property
    def is_leader(self) -> bool:
        """Whether this member is the group's leader (it must compute the assignment)."""
        return self.error == Errors.NO_ERROR and self.leader_id == self.member_id


@dataclass(frozen=True)
class SyncGroupResult:
    """A SyncGroup response (Kafka's ``SyncGroupResponseData``): the member's assignment bytes."""

    error: Errors
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


# ---------------------------------------------------------------------------- offset expiration
class OffsetExpirationCondition:
    """When a committed offset expires (Kafka's ``OffsetExpirationConditionImpl``, KIP-211).

    Args:
        base_timestamp: the time (ms) the retention counts from, given the offset.
    """

    def __init__(self, base_timestamp: Callable[["OffsetAndMetadata"], int]):
        self.base_timestamp = base_timestamp

    def is_offset_expired(self, offset: "OffsetAndMetadata", now_ms: int, retention_ms: int) -> bool:
        """An offset with an explicit expire timestamp (OffsetCommit v2-v4) expires at it;
        any other once ``retention_ms`` have passed since its base timestamp (all in ms)."""
        if offset.expire_timestamp is not None:
            return now_ms >= offset.expire_timestamp
        return now_ms - self.base_timestamp(offset) >= retention_ms


#: a group without group management (no protocol type: offsets committed by assign()-based
#: consumers or admin tools): each offset expires counting from its own commit
STANDALONE_OFFSET_EXPIRATION = OffsetExpirationCondition(lambda offset: offset.commit_timestamp)


# ---------------------------------------------------------------------------- members
class GroupMember:
    """A member of a classic group (Kafka's ``ClassicGroupMember``).

    Args:
        member_id: assigned by the coordinator (``<client id or instance id>-<uuid>``).
        group_instance_id: the static member's ``group.instance.id`` (KIP-345), or None.
        client_id, client_host: who sent the JoinGroup.
        rebalance_timeout_ms: how long the coordinator waits for it to rejoin
            (the consumer's ``max.poll.interval.ms``).
        session_timeout_ms: how long it may go without a heartbeat.
        protocol_type: e.g. ``"consumer"``.
        supported_protocols: ``[(name, metadata)]`` in the member's order of preference.
        assignment: the assignment bytes the leader gave it in the current generation.
    """

    __slots__ = ("member_id", "group_instance_id", "client_id", "client_host", "rebalance_timeout_ms",
                 "session_timeout_ms", "protocol_type", "supported_protocols", "assignment",
                 "awaiting_join", "awaiting_sync", "is_new")

    def __init__(self, member_id: str, group_instance_id: str | None, client_id: str, client_host: str,
                 rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
                 supported_protocols: Iterable[Protocol], assignment: bytes = b""):
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        self.supported_protocols: list[Protocol] = [(name, bytes(md)) for name, md in supported_protocols]
        self.assignment = assignment
        #: the pending JoinGroup response (completed when the join phase completes)
        self.awaiting_join: Future | None = None
        #: the pending SyncGroup response (completed when the leader's assignment is stored)
        self.awaiting_sync: Future | None = None
        #: a member added by this rebalance: it may expire while still awaiting its JoinGroup
        self.is_new = False

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.awaiting_join is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.awaiting_sync is not None

    @property
    def has_satisfied_heartbeat(self) -> bool:
        """Whether an expiring heartbeat deadline is excused (Kafka's ``hasSatisfiedHeartbeat``):
        a member waiting for its JoinGroup/SyncGroup response counts as alive, unless it is new."""
        if self.is_new:
            return False
        return self.is_awaiting_join or self.is_awaiting_sync

    @property
    def protocol_names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.supported_protocols)

    def metadata(self, protocol: str) -> bytes:
        """The member's metadata for ``protocol``.

        Raises:
            IllegalGroupStateError: the member does not support it.
        """
        for name, md in self.supported_protocols:
            if name == protocol:
                return md
        raise IllegalGroupStateError(f"Member {self.member_id} does not support protocol {protocol}")

    def matches(self, protocols: Iterable[Protocol]) -> bool:
        """Whether ``protocols`` equal the stored ones, names, metadata and order (Kafka's ``matches``)."""
        return [(n, bytes(md)) for n, md in protocols] == self.supported_protocols

    def vote(self, candidates: frozenset[str]) -> str:
        """The member's most preferred protocol among ``candidates`` (Kafka's ``vote``)."""
        for name, _ in self.supported_protocols:
            if name in candidates:
                return name
        raise IllegalGroupStateError(f"Member {self.member_id} does not support any of the candidate protocols")

    def __repr__(self) -> str:
        return (f"GroupMember(member_id={self.member_id}, group_instance_id={self.group_instance_id}, "
                f"client_id={self.client_id}, session_timeout_ms={self.session_timeout_ms}, "
                f"rebalance_timeout_ms={self.rebalance_timeout_ms}, "
                f"supported_protocols={[n for n, _ in self.supported_protocols]})")


# ---------------------------------------------------------------------------- descriptions
@dataclass(frozen=True)
class MemberDescription:
    """One member in DescribeGroups (Kafka's ``MemberSummary``); metadata/assignment only when Stable."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes = b""
    assignment: bytes = b""


@dataclass(frozen=True)
class GroupDescription:
    """DescribeGroups of one group (Kafka's ``GroupSummary``)."""

    group_id: str
    error: Errors
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...] = ()
    generation_id: int = NO_GENERATION
    leader_id: str = NO_LEADER


@dataclass(frozen=True)
class GroupOverview:
    """ListGroups of one group (Kafka's ``GroupOverview``)."""

    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


# ---------------------------------------------------------------------------- the group
class GroupMetadata:
    """A classic group's state (Kafka's ``ClassicGroup``). Not thread-safe: the coordinator's
    lock is held around every call.

    Args:
        group_id: the group id.
        state: the initial state (Empty for a new group; Stable or Empty when loaded).
        now_ms: the current time, the timestamp of the initial state.
    """

    def __init__(self, group_id: str, state: GroupState = GroupState.EMPTY, now_ms: int = -1,
                 generation_id: int = 0, protocol_type: str | None = None, protocol_name: str | None = None,
                 leader_id: str | None = None, completions: list | None = None):
        self.group_id = group_id
        self.state = state
        #: the state before the last transition (Dead for a new group, as Kafka)
        self.previous_state = GroupState.DEAD
        #: when the group entered its state (ms); Kafka's ``currentStateTimestamp``
        self.state_timestamp = now_ms
        self.generation_id = generation_id
        self.protocol_type = protocol_type
        self.protocol_name = protocol_name
        self.leader_id = leader_id
        self.members: dict[str, GroupMember] = {}
        #: static membership: group.instance.id -> member id
        self.static_members: dict[str, str] = {}
        #: KIP-394: member ids handed out with MEMBER_ID_REQUIRED that have not joined yet
        self.pending_members: set[str] = set()
        #: members that must still send SyncGroup in this generation
        self.pending_sync_members: set[str] = set()
        self.num_members_awaiting_join = 0
        self._supported_protocols: Counter[str] = Counter()
        #: a member joined during the initial rebalance: its delay may be extended
        self.new_member_added = False
        #: answers to hand out once the coordinator's lock is released: ``[(future, result)]``
        #: (the coordinator passes one list shared by all its groups)
        self.completions: list[tuple[Future, JoinGroupResult | SyncGroupResult]] = (
            completions if completions is not None else [])

    # ------------------------------------------------------------------ state
    def is_in(self, state: GroupState) -> bool:
        return self.state is state

    def transition_to(self, state: GroupState, now_ms: int) -> None:
        """Enter ``state`` (Kafka's ``transitionTo``).

        Raises:
            IllegalGroupStateError: Kafka does not allow it from the current state.
        """
        if self.state not in state.valid_previous_states:
            raise IllegalGroupStateError(
                f"Group {self.group_id} should be in one of the states "
                f"{sorted(s.value for s in state.valid_previous_states)} before moving to {state.value} "
                f"state. Instead it is in {self.state.value} state.")
        self.previous_state = self.state
        self.state = state
        self.state_timestamp = now_ms

    @property
    def can_rebalance(self) -> bool:
        """Whether a rebalance may start from the current state (Kafka's ``canRebalance``)."""
        return self.state in GroupState.PREPARING_REBALANCE.valid_previous_states

    # ------------------------------------------------------------------ members
    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def member(self, member_id: str) -> GroupMember:
        return self.members[member_id]

    @property
    def size(self) -> int:
        return len(self.members)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    def add(self, member: GroupMember, future: Future | None = None) -> None:
        """Add a member, awaiting its JoinGroup response on ``future`` (Kafka's ``add``).

        Raises:
            IllegalGroupStateError: its instance id is already a member, its protocol type
                differs from the group's, or the group supports none of its protocols.
        """
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise IllegalGroupStateError(f"Static member with groupInstanceId={member.group_instance_id} "
                                             f"cannot be added to group {self.group_id} since it is already a member")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.protocol_type != member.protocol_type:
            raise IllegalGroupStateError("The group and member's protocol type must be the same.")
        if not self.supports_protocols(member.protocol_type, member.protocol_names):
            raise IllegalGroupStateError("None of the member's protocols can be supported.")
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self._supported_protocols.update(member.protocol_names)
        member.awaiting_join = future
        if future is not None:
            self.num_members_awaiting_join += 1
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> GroupMember | None:
        """Remove a member (or a pending member); a removed leader is replaced by the first
        remaining member (Kafka's ``remove``). Returns the removed member, if any."""
        removed = self.members.pop(member_id, None)
        if removed is not None:
            self._supported_protocols.subtract(removed.protocol_names)
            if removed.is_awaiting_join:
                self.num_members_awaiting_join -= 1
            if removed.group_instance_id is not None:
                self.static_members.pop(removed.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync_members.discard(member_id)
        return removed

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else elect the first member that did (Kafka's
        ``maybeElectNewJoinedLeader``). False when the group has no leader or nobody rejoined."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].is_awaiting_join:
            return True
        for member_id, member in self.members.items():
            if member.is_awaiting_join:
                log.info("Group leader %s of %s failed to join before the rebalance timeout; %s is the new leader",
                         self.leader_id, self.group_id, member_id)
                self.leader_id = member_id
                return True
        log.info("Group leader %s of %s failed to join before the rebalance timeout and no member joined",
                 self.leader_id, self.group_id)
        return False

    def replace_static_member(self, group_instance_id: str, old_member_id: str, new_member_id: str) -> GroupMember:
        """Give a static member a new member id, keeping everything else (Kafka's
        ``replaceStaticMember``). The old id's pending JoinGroup/SyncGroup are answered
        FENCED_INSTANCE_ID at once.

        Raises:
            IllegalGroupStateError: ``old_member_id`` is not a member.
        """
        member = self.members.pop(old_member_id, None)
        if member is None:
            raise IllegalGroupStateError(f"Cannot replace non-existing member id {old_member_id}")
        self.complete_join_future(member, JoinGroupResult(Errors.FENCED_INSTANCE_ID, old_member_id))
        self.complete_sync_future(member, SyncGroupResult(Errors.FENCED_INSTANCE_ID))
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        self.static_members[group_instance_id] = new_member_id
        return member

    def update_member(self, member: GroupMember, protocols: Iterable[Protocol], rebalance_timeout_ms: int,
                      session_timeout_ms: int, future: Future | None) -> None:
        """Replace a member's protocols and timeouts; it awaits its JoinGroup response on
        ``future`` (None: not awaiting) (Kafka's ``updateMember``)."""
        self._supported_protocols.subtract(member.protocol_names)
        member.supported_protocols = [(n, bytes(md)) for n, md in protocols]
        self._supported_protocols.update(member.protocol_names)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if future is not None and not member.is_awaiting_join:
            self.num_members_awaiting_join += 1
        elif future is None and member.is_awaiting_join:
            self.num_members_awaiting_join -= 1
        member.awaiting_join = future

    def add_pending_member(self, member_id: str) -> None:
        """KIP-394: remember a member id handed out with MEMBER_ID_REQUIRED."""
        if member_id in self.members:
            raise IllegalGroupStateError(f"Attempt to add pending member {member_id} which is already "
                                         "a stable member of the group")
        self.pending_members.add(member_id)

    def is_pending_member(self, member_id: str) -> bool:
        return member_id in self.pending_members

    def add_pending_sync_member(self, member_id: str) -> None:
        if member_id not in self.members:
            raise IllegalGroupStateError(f"Attempt to add a pending sync for member {member_id} "
                                         "which is not a member of the group")
        self.pending_sync_members.add(member_id)

    def remove_pending_sync_member(self, member_id: str) -> None:
        if member_id not in self.members:
            raise IllegalGroupStateError(f"Attempt to remove a pending sync for member {member_id} "
                                         "which is not a member of the group")
        self.pending_sync_members.discard(member_id)

    @property
    def has_received_sync_from_all_members(self) -> bool:
        return not self.pending_sync_members

    def has_static_member(self, group_instance_id: str) -> bool:
        return group_instance_id in self.static_members

    def static_member_id(self, group_instance_id: str) -> str | None:
        return self.static_members.get(group_instance_id)

    def not_yet_rejoined_members(self) -> list[GroupMember]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    @property
    def has_all_members_joined(self) -> bool:
        """Every member awaits its JoinGroup response and no pending member is outstanding."""
        return len(self.members) == self.num_members_awaiting_join and not self.pending_members

    @property
    def rebalance_timeout_ms(self) -> int:
        """The largest rebalance timeout of the members (Kafka's ``rebalanceTimeoutMs``)."""
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    @staticmethod
    def generate_member_id(client_id: str, group_instance_id: str | None, unique: str) -> str:
        """``<group.instance.id or client.id>-<unique>`` (Kafka's ``generateMemberId``, unique = a UUID)."""
        return f"{group_instance_id if group_instance_id is not None else client_id}-{unique}"

    # ------------------------------------------------------------------ protocols
    def candidate_protocols(self) -> frozenset[str]:
        """The protocols every member supports."""
        n = len(self.members)
        return frozenset(p for p, count in self._supported_protocols.items() if count == n)

    def select_protocol(self) -> str:
        """The protocol the members vote for most, among those all of them support (Kafka's
        ``selectProtocol``; each member votes for its most preferred candidate). Kafka breaks a
        tie by hash-map order; here the tie goes to the smallest name, so the choice is stable.

        Raises:
            IllegalGroupStateError: the group has no members.
        """
        if not self.members:
            raise IllegalGroupStateError("Cannot select protocol for empty group")
        candidates = self.candidate_protocols()
        votes = Counter(m.vote(candidates) for m in self.members.values())
        best = max(votes.values())
        return min(p for p, v in votes.items() if v == best)

    def supports_protocols(self, protocol_type: str, protocols: Iterable[str]) -> bool:
        """Whether a member with these protocols may join (Kafka's ``supportsProtocols``): an
        Empty group takes any non-empty type and protocol list; otherwise the type must match
        and one protocol must be supported by every member."""
        protocols = set(protocols)
        if self.is_in(GroupState.EMPTY):
            return bool(protocol_type) and bool(protocols)
        n = len(self.members)
        return self.protocol_type == protocol_type and any(self._supported_protocols[p] == n for p in protocols)

    # ------------------------------------------------------------------ responses
    def complete_join_future(self, member: GroupMember, result: JoinGroupResult) -> bool:
        """Answer the member's pending JoinGroup (Kafka's ``completeJoinFuture``); False if none.

        The future is queued on :attr:`completions`; the coordinator completes it after
        releasing its lock, so client callbacks never run under it.
        """
        future = member.awaiting_join
        if future is None:
            return False
        member.awaiting_join = None
        self.num_members_awaiting_join -= 1
        self.completions.append((future, result))
        return True

    def complete_sync_future(self, member: GroupMember, result: SyncGroupResult) -> bool:
        """Answer the member's pending SyncGroup (Kafka's ``completeSyncFuture``); False if none."""
        future = member.awaiting_sync
        if future is None:
            return False
        member.awaiting_sync = None
        self.completions.append((future, result))
        return True

    def init_next_generation(self, now_ms: int) -> None:
        """Start the next generation (Kafka's ``initNextGeneration``): with members, select the
        protocol and go to CompletingRebalance; without, go to Empty."""
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    def current_members_metadata(self) -> tuple[JoinGroupMember, ...]:
        """The members and their metadata for the selected protocol, for the leader's JoinGroup
        response (Kafka's ``currentClassicGroupMembers``).

        Raises:
            IllegalGroupStateError: the group is Dead or PreparingRebalance.
        """
        if self.state in (GroupState.DEAD, GroupState.PREPARING_REBALANCE):
            raise IllegalGroupStateError(f"Cannot obtain member metadata for group {self.group_id} "
                                         f"in state {self.state.value}")
        return tuple(JoinGroupMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                     for m in self.members.values())

    def group_assignment(self) -> dict[str, bytes]:
        """Every member's current assignment (Kafka's ``groupAssignment``)."""
        return {member_id: m.assignment for member_id, m in self.members.items()}

    # ------------------------------------------------------------------ validation
    def validate_member(self, member_id: str, group_instance_id: str | None) -> Errors | None:
        """None when ``member_id`` (and ``group_instance_id``, if given) name a current member
        (Kafka's ``validateMember``): FENCED_INSTANCE_ID when the instance id maps to another
        member id, UNKNOWN_MEMBER_ID otherwise."""
        if group_instance_id is not None:
            existing = self.static_members.get(group_instance_id)
            if existing is None:
                return Errors.UNKNOWN_MEMBER_ID
            if existing != member_id:
                log.info("Request memberId=%s for static member with groupInstanceId=%s of %s is fenced by "
                         "existing memberId=%s", member_id, group_instance_id, self.group_id, existing)
                return Errors.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return Errors.UNKNOWN_MEMBER_ID
        return None

    def validate_generation(self, member_id: str, group_instance_id: str | None, generation_id: int) -> Errors | None:
        """The checks of Heartbeat and SyncGroup (Kafka's ``validateClassicGroupHeartbeat`` /
        ``validateSyncGroup``): COORDINATOR_NOT_AVAILABLE (Dead), then :meth:`validate_member`,
        then ILLEGAL_GENERATION; None when the request is current."""
        if self.is_in(GroupState.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        error = self.validate_member(member_id, group_instance_id)
        if error is None and generation_id != self.generation_id:
            error = Errors.ILLEGAL_GENERATION
        return error

    def validate_offset_commit(self, member_id: str, group_instance_id: str | None, generation_id: int,
                               is_transactional: bool) -> Errors:
        """Kafka's ``ClassicGroup.validateOffsetCommit`` for OffsetCommit/TxnOffsetCommit.

        * Dead -> COORDINATOR_NOT_AVAILABLE;
        * generation < 0 in an Empty group -> accepted (admin client or assign()-only consumer);
        * a generation, member id or instance id given -> the member must be current
          (UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID) and the generation the group's (ILLEGAL_GENERATION);
        * none given while the group has members -> UNKNOWN_MEMBER_ID for a plain commit,
          accepted for a transactional one (older TxnOffsetCommit versions carry no member);
        * a plain commit while CompletingRebalance -> REBALANCE_IN_PROGRESS.
        """
        if self.is_in(GroupState.DEAD):
            return Errors.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and self.is_in(GroupState.EMPTY):
            return Errors.NO_ERROR
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = self.validate_member(member_id, group_instance_id)
            if error is not None:
                return error
            if generation_id != self.generation_id:
                return Errors.ILLEGAL_GENERATION
        elif not is_transactional and not self.is_in(GroupState.EMPTY):
            return Errors.UNKNOWN_MEMBER_ID
        if not is_transactional and self.is_in(GroupState.COMPLETING_REBALANCE):
            return Errors.REBALANCE_IN_PROGRESS
        return Errors.NO_ERROR

    # ------------------------------------------------------------------ offset expiration
    def subscribed_topics(self) -> frozenset[str] | None:
        """The topics the members subscribe to, read from their subscriptions for the selected
        protocol (Kafka's ``computeSubscribedTopics``): known only for the consumer protocol
        type -- empty without members -- and None when unknown (another protocol type, or a
        subscription that cannot be read)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            subscribed = _subscription_topics(member.supported_protocols, self.protocol_name)
            if subscribed is None:
                log.warning("Failed to parse the %s subscription of member %s of group %s: the coordinator is "
                            "not aware of the subscribed topics", self.protocol_name, member.member_id, self.group_id)
                return None
            topics |= subscribed
        return frozenset(topics)

    def offset_expiration_condition(self) -> OffsetExpirationCondition | None:
        """How the group's offsets expire now (Kafka's ``ClassicGroup.offsetExpirationCondition``);
        offsets of topics in :meth:`subscribed_topics` never expire:

        * a protocol type and Empty: every offset, ``offsets.retention.minutes`` after the group
          became Empty (its state timestamp; the commit timestamp if that is unknown);
        * the consumer protocol type, Stable, subscribed topics known (KIP-496): the offsets of
          topics no member subscribes to, counting from their commit;
        * no protocol type (the group only stores offsets): each offset, counting from its commit;
        * otherwise: None, nothing expires.
        """
        if not self.protocol_type:
            return STANDALONE_OFFSET_EXPIRATION
        if self.is_in(GroupState.EMPTY):
            empty_since = self.state_timestamp
            return OffsetExpirationCondition(
                lambda offset: empty_since if empty_since >= 0 else offset.commit_timestamp)
        if (self.protocol_type == CONSUMER_PROTOCOL_TYPE and self.is_in(GroupState.STABLE)
                and self.subscribed_topics() is not None):
            return STANDALONE_OFFSET_EXPIRATION
        return None

    # ------------------------------------------------------------------ describe / list
    def describe(self) -> GroupDescription:
        """DescribeGroups (Kafka's ``summary``): member metadata and assignments only when Stable."""
        if self.is_in(GroupState.STABLE):
            members = tuple(MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                              m.metadata(self.protocol_name), m.assignment)
                            for m in self.members.values())
            protocol = self.protocol_name
        else:
            members = tuple(MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host)
                            for m in self.members.values())
            protocol = NO_PROTOCOL
        return GroupDescription(self.group_id, Errors.NO_ERROR, self.state.value, self.protocol_type or "",
                                protocol, members, self.generation_id, self.leader_id or NO_LEADER)

    def overview(self) -> GroupOverview:
        return GroupOverview(self.group_id, self.protocol_type or "", self.state.value)

    # ------------------------------------------------------------------ the record
    def to_record(self, assignment: Mapping[str, bytes]) -> tuple[bytes, bytes]:
        """The group's ``(key, value)`` record in ``__consumer_offsets`` with these assignments
        (Kafka's ``newGroupMetadataRecord``): written when a generation completes."""
        value = {
            "v": RECORD_VERSION,
            "protocol_type": self.protocol_type or "",
            "generation": self.generation_id,
            "protocol": self.protocol_name,
            "leader": self.leader_id,
            "current_state_timestamp": self.state_timestamp,
            "members": [{
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "rebalance_timeout": m.rebalance_timeout_ms,
                "session_timeout": m.session_timeout_ms,
                "subscription": _b64(m.metadata(self.protocol_name)) if self.protocol_name is not None else "",
                "assignment": _b64(assignment.get(m.member_id, b"")),
            } for m in self.members.values()],
        }
        return group_metadata_key(self.group_id), json.dumps(value, separators=(",", ":")).encode()

    @classmethod
    def from_record(cls, group_id: str, value: dict, now_ms: int, completions: list | None = None) -> GroupMetadata:
        """Rebuild a group from its decoded record value (Kafka's GroupMetadata replay): Stable
        with its members and their assignments, or Empty without members. Each member supports
        only the selected protocol, with the subscription stored for it."""
        members = value["members"]
        group = cls(group_id, GroupState.STABLE if members else GroupState.EMPTY,
                    value["current_state_timestamp"] if value["current_state_timestamp"] >= 0 else now_ms,
                    value["generation"], value["protocol_type"] or None, value["protocol"], value["leader"],
                    completions)
        for m in members:
            rebalance_timeout = m["rebalance_timeout"] if m["rebalance_timeout"] != -1 else m["session_timeout"]
            group.add(GroupMember(m["member_id"], m["group_instance_id"], m["client_id"], m["client_host"],
                                  rebalance_timeout, m["session_timeout"], value["protocol_type"],
                                  [(value["protocol"], _unb64(m["subscription"]))], _unb64(m["assignment"])))
        return group


def _subscription_topics(protocols: Iterable[Protocol], protocol_name: str) -> set[str] | None:
    """The topics of a member's consumer-protocol subscription for ``protocol_name`` -- the
    ``"topics"`` of the JSON that ``txlake.assignors.encode_subscription`` writes -- or None
    when it cannot be read (as Kafka reads only the V0 prefix of ConsumerProtocol)."""
    for name, metadata in protocols:
        if name == protocol_name:
            try:
                topics = json.loads(metadata).get("topics")
            except (ValueError, TypeError, AttributeError):
                return None
            if isinstance(topics, list) and all(isinstance(t, str) for t in topics):
                return set(topics)
            return None
    return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def group_metadata_key(group_id: str) -> bytes:
    """The key of a group's record in ``__consumer_offsets`` (Kafka's ``GroupMetadataKey``)."""
    return json.dumps({"v": RECORD_VERSION, "type": RECORD_TYPE, "group": group_id}, separators=(",", ":")).encode()


_VALUE_FIELDS = ("protocol_type", "generation", "protocol", "leader", "current_state_timestamp", "members")
_MEMBER_FIELDS = ("member_id", "group_instance_id", "client_id", "client_host", "rebalance_timeout",
                  "session_timeout", "subscription", "assignment")


def decode_group_record(key: bytes, value: bytes | None, location: str) -> tuple[str, dict | None] | None:
    """Decode a ``__consumer_offsets`` record: ``(group id, value dict or None for a tombstone)``
    for a group record, None for any other record (an offset commit).

    Raises:
        CorruptObjectError: the key or value is not the JSON described above.
        UnsupportedFormatVersionError: a group record of another version.
    """
    try:
        k = json.loads(key)
    except (ValueError, TypeError) as exc:
        raise CorruptObjectError(location, f"unreadable record key in __consumer_offsets ({exc})") from exc
    if not isinstance(k, dict) or k.get("type") != RECORD_TYPE:
        return None
    if k.get("v") != RECORD_VERSION:
        raise UnsupportedFormatVersionError(location, f"group metadata record of unknown version {k.get('v')!r}; "
                                                      "upgrade txlake to read it")
    group_id = k.get("group")
    if not isinstance(group_id, str):
        raise CorruptObjectError(location, f"group metadata key without a group id: {k!r}")
    if value is None:
        return group_id, None
    try:
        v = json.loads(value)
        if v.get("v") != RECORD_VERSION:
            raise UnsupportedFormatVersionError(location, f"group metadata value of group {group_id} has unknown "
                                                          f"version {v.get('v')!r}; upgrade txlake to read it")
        missing = [f for f in _VALUE_FIELDS if f not in v]
        if not missing:
            missing = sorted({f"members[].{f}" for m in v["members"] for f in _MEMBER_FIELDS if f not in m})
        if missing:
            raise CorruptObjectError(location, f"group metadata value of group {group_id} lacks {missing}")
        for m in v["members"]:  # the payloads must decode
            _unb64(m["subscription"])
            _unb64(m["assignment"])
    except (ValueError, TypeError, AttributeError) as exc:
        raise CorruptObjectError(location, f"unreadable group metadata value of group {group_id} ({exc})") from exc
    return group_id, v
