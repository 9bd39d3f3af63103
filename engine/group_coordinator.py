"""The group coordinator for classic consumer groups (Kafka's ``GroupCoordinator``).

Request handlers named after Kafka's APIs -- JoinGroup, SyncGroup, Heartbeat, LeaveGroup
(a batch of members, KIP-345), DescribeGroups, ListGroups, DeleteGroups -- plus the
membership checks of OffsetCommit/TxnOffsetCommit (:meth:`GroupCoordinator.validate_offset_commit`,
the KIP-447 fencing of transactional offsets). They answer with Kafka's error codes and
follow ``GroupMetadataManager``'s classic-group paths (formerly
``kafka.coordinator.group.GroupCoordinator.scala``); the group's state machine is
:class:`~.group_metadata.GroupMetadata`.

**Delayed answers.** JoinGroup and SyncGroup return a :class:`concurrent.futures.Future`:
Kafka parks these requests until the rebalance decides (every member rejoined, or the
rebalance timeout removed the missing ones; the leader's assignment is stored). A client
thread calls the handler, then waits on ``future.result(timeout)``; several threads may
join at once. Futures are always completed after the coordinator's lock is released, so
their done-callbacks may call the coordinator again. Heartbeat, LeaveGroup, the commit
check, Describe/List/DeleteGroups answer at once.

**Time.** Nothing sleeps and no thread is needed for correctness: deadlines (session
timeouts, rebalance timeouts, the initial rebalance delay, pending SyncGroups, KIP-394
pending members) are entries of a timer that :meth:`GroupCoordinator.check_expirations`
fires. :meth:`GroupCoordinator.startup` runs a scheduler thread that calls it whenever
the next deadline is due; tests inject a clock (``time_ms``) and call it themselves.

**Persistence.** When a generation completes (the leader's SyncGroup, a group becoming
Empty, a static member replaced in a Stable group) the group's record is written through
the injected ``append(group_id, key, value) -> Errors`` -- the integrator appends it to the
group's ``__consumer_offsets`` partition (:meth:`GroupCoordinator.partition_for`). Appends
run outside the lock, one at a time and in order; the request they belong to is answered
when the append returns, exactly like Kafka's append callbacks. :meth:`GroupCoordinator.load`
replays those records after a restart: each group comes back Stable (or Empty) with its
generation, leader, members and assignments, and every member must heartbeat within its
session timeout from the load on.

**Offset expiration** (KIP-211, KIP-496, Kafka's ``GroupMetadataManager.cleanupGroupMetadata``).
Every ``offsets.retention.check.interval.ms`` a second thread calls
:meth:`GroupCoordinator.cleanup_group_metadata`; tests call it with ``now_ms``. Per
``__consumer_offsets`` partition it replays the committed offsets (an :class:`OffsetStore`,
the broker's :class:`~.group_offsets.GroupOffsets`), asks each group's
:meth:`~.group_metadata.GroupMetadata.offset_expiration_condition`, writes the tombstones
of the expired offsets -- never of a partition with a pending transactional commit
(KIP-447) -- and turns an Empty group left without offsets Dead, with a tombstone of its
record. Offset commits hold the partition's guard (:meth:`GroupCoordinator.offset_commit_guard`)
shared, the expiration holds it alone, so it never deletes an offset committed meanwhile.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
import typing
import uuid
from collections import Counter, deque
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, ContextManager, Hashable, Iterable, Iterator

from txlake.catalog.errors import InvalidConfigError

from .errors import Errors
from .group_metadata import (NO_GENERATION, STANDALONE_OFFSET_EXPIRATION, UNKNOWN_MEMBER_ID, GroupDescription,
                             GroupMember, GroupMetadata, GroupOverview, GroupState, IllegalGroupStateError,
                             JoinGroupMember, JoinGroupResult, Protocol, SyncGroupResult, decode_group_record,
                             group_metadata_key)
from .group_offsets import OFFSETS_TOPIC_NUM_PARTITIONS, GroupOffsetsState, TopicPartitionKey, partition_for

log = logging.getLogger(__name__)

__all__ = ["AppendFn", "GroupConfig", "GroupCoordinator", "JoinGroupMember", "JoinGroupResult", "LeaveGroupResult",
           "LeaveMemberResponse", "MemberIdentity", "NO_GENERATION", "OffsetStore", "SyncGroupResult",
           "UNKNOWN_MEMBER_ID", "append_error_to_response_error"]

#: ``append(group_id, key, value or None for a tombstone) -> Errors``: write a group record.
AppendFn = Callable[[str, bytes, "bytes | None"], Errors]

GROUP_MIN_SESSION_TIMEOUT_MS_CONFIG = "group.min.session.timeout.ms"
GROUP_MAX_SESSION_TIMEOUT_MS_CONFIG = "group.max.session.timeout.ms"
GROUP_MAX_SIZE_CONFIG = "group.max.size"
GROUP_INITIAL_REBALANCE_DELAY_MS_CONFIG = "group.initial.rebalance.delay.ms"
OFFSETS_TOPIC_NUM_PARTITIONS_CONFIG = "offsets.topic.num.partitions"
OFFSETS_RETENTION_MINUTES_CONFIG = "offsets.retention.minutes"
OFFSETS_RETENTION_CHECK_INTERVAL_MS_CONFIG = "offsets.retention.check.interval.ms"
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
#: the scheduler thread looks at the timer at least this often (s), in case the clock jumps
_MAX_SCHEDULER_WAIT_S = 1.0
#: how long DeleteGroups waits for its tombstones to be written (s)
_TOMBSTONE_TIMEOUT_S = 60.0


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class GroupConfig:
    """The coordinator's settings with Kafka's defaults (``GroupCoordinatorConfig``, classic groups).

    Attributes:
        group_min_session_timeout_ms: ``group.min.session.timeout.ms`` (6000).
        group_max_session_timeout_ms: ``group.max.session.timeout.ms`` (1800000).
        group_max_size: ``group.max.size`` (Integer.MAX_VALUE).
        group_initial_rebalance_delay_ms: ``group.initial.rebalance.delay.ms`` (3000): how long a
            new group waits for more members before its first generation (extended by that much
            for every member that joins meanwhile, up to the rebalance timeout).
        new_member_join_timeout_ms: how long a new member's JoinGroup may stay parked before it
            is dropped (Kafka's fixed ``CLASSIC_GROUP_NEW_MEMBER_JOIN_TIMEOUT_MS``, 5 minutes).
        offsets_topic_num_partitions: ``offsets.topic.num.partitions`` (50): the partition count
            of a ``__consumer_offsets`` yet to be created. With an :class:`OffsetStore` the
            existing topic's count places the groups (:attr:`GroupCoordinator.num_partitions`).
        offsets_retention_minutes: ``offsets.retention.minutes`` (10080 = 7 days): how long the
            offsets of a group outlive it -- after the group became Empty, or for a group
            without group management after each offset's commit (KIP-211).
        offsets_retention_check_interval_ms: ``offsets.retention.check.interval.ms`` (600000):
            how often expired offsets are looked for.
    """

    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    group_max_size: int = _INT32_MAX
    group_initial_rebalance_delay_ms: int = 3000
    new_member_join_timeout_ms: int = 300_000
    offsets_topic_num_partitions: int = OFFSETS_TOPIC_NUM_PARTITIONS
    offsets_retention_minutes: int = 10_080
    offsets_retention_check_interval_ms: int = 600_000

    #: dotted key -> (attribute, lowest value, highest value): Kafka's INT and LONG ranges
    _KEYS = {
        GROUP_MIN_SESSION_TIMEOUT_MS_CONFIG: ("group_min_session_timeout_ms", 0, _INT32_MAX),
        GROUP_MAX_SESSION_TIMEOUT_MS_CONFIG: ("group_max_session_timeout_ms", 0, _INT32_MAX),
        GROUP_MAX_SIZE_CONFIG: ("group_max_size", 1, _INT32_MAX),
        GROUP_INITIAL_REBALANCE_DELAY_MS_CONFIG: ("group_initial_rebalance_delay_ms", 0, _INT32_MAX),
        OFFSETS_TOPIC_NUM_PARTITIONS_CONFIG: ("offsets_topic_num_partitions", 1, _INT32_MAX),
        OFFSETS_RETENTION_MINUTES_CONFIG: ("offsets_retention_minutes", 1, _INT32_MAX),
        OFFSETS_RETENTION_CHECK_INTERVAL_MS_CONFIG: ("offsets_retention_check_interval_ms", 1, _INT64_MAX),
    }

    def __post_init__(self) -> None:
        for key, (attr, low, high) in self._KEYS.items():
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidConfigError(f"Invalid value {value!r} for configuration {key}: "
                                         f"Value must be an integer in {low}..{high}")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise InvalidConfigError(f"{GROUP_MIN_SESSION_TIMEOUT_MS_CONFIG} ({self.group_min_session_timeout_ms}) "
                                     f"must not exceed {GROUP_MAX_SESSION_TIMEOUT_MS_CONFIG} "
                                     f"({self.group_max_session_timeout_ms})")
        if self.new_member_join_timeout_ms < 1:
            raise InvalidConfigError(f"new_member_join_timeout_ms must be >= 1, got {self.new_member_join_timeout_ms}")

    @classmethod
    def from_properties(cls, props: dict) -> GroupConfig:
        """Build from Kafka's dotted keys; other keys are ignored, values may be strings.

        Raises:
            InvalidConfigError: a value that is not an integer in range.
        """
        return cls(**{spec[0]: _int_property(key, props[key]) for key, spec in cls._KEYS.items() if key in props})

    @property
    def offsets_retention_ms(self) -> int:
        """``offsets.retention.minutes`` in ms (Kafka's ``offsetsRetentionMs``)."""
        return self.offsets_retention_minutes * 60_000


def _int_property(key: str, raw: object) -> object:
    """A config value as Kafka's INT type: strings are parsed, other values checked by the config."""
    if not isinstance(raw, str):
        return raw
    try:
        return int(raw)
    except ValueError:
        raise InvalidConfigError(f"Invalid value {raw!r} for configuration {key}: Not a number of type INT") from None


@dataclass(frozen=True)
class MemberIdentity:
    """One member of a LeaveGroup request (KIP-345): by member id, or by instance id alone
    (``member_id`` empty: an administrator removing a static member)."""

    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class LeaveMemberResponse:
    member_id: str
    group_instance_id: str | None
    error: Errors


@dataclass(frozen=True)
class LeaveGroupResult:
    """A LeaveGroup response: a top-level error, else one answer per member."""

    error: Errors
    members: tuple[LeaveMemberResponse, ...] = ()


def append_error_to_response_error(error: Errors) -> Errors:
    """What a failed group-record append answers the client (Kafka's
    ``appendGroupMetadataErrorToResponseError``). A writer that lost its lease (``_FENCED``)
    is no longer the coordinator: NOT_COORDINATOR."""
    if error in (Errors.UNKNOWN_TOPIC_OR_PART, Errors.REQUEST_TIMED_OUT):
        return Errors.COORDINATOR_NOT_AVAILABLE
    if error in (Errors.NOT_LEADER_OR_FOLLOWER, Errors.KAFKA_STORAGE_ERROR, Errors._FENCED):
        return Errors.NOT_COORDINATOR
    if error in (Errors.MESSAGE_TOO_LARGE, Errors.RECORD_LIST_TOO_LARGE, Errors.INVALID_FETCH_SIZE):
        return Errors.UNKNOWN_SERVER_ERROR
    return error


@typing.runtime_checkable
class OffsetStore(typing.Protocol):
    """Where the committed offsets live, as offset expiration needs them (the broker's
    :class:`~.group_offsets.GroupOffsets` over ``__consumer_offsets``)."""

    def replay(self, partition: int, group_id: str | None = None) -> dict[str, GroupOffsetsState]:
        """Every group's committed and pending offsets in ``__consumer_offsets`` partition ``partition``."""

    def delete_offsets(self, partition: int, offsets: dict[str, Iterable[TopicPartitionKey]]) -> Errors:
        """Write the tombstones of these groups' offsets (all of ``partition``) as one batch."""

    @property
    def num_partitions(self) -> int:
        """The partition count of ``__consumer_offsets`` the groups are placed by: the existing
        topic's, else ``offsets.topic.num.partitions``."""


class _PartitionGuard:
    """One readers-writer lock per ``__consumer_offsets`` partition: offset commits hold it
    shared (they run side by side), an offset expiration holds it alone. A waiting
    expiration keeps new commits out, so a steady flow of commits cannot starve it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared: Counter[int] = Counter()
        self._waiting: Counter[int] = Counter()
        self._exclusive: set[int] = set()

    @contextmanager
    def shared(self, partition: int) -> Iterator[None]:
        with self._cond:
            while partition in self._exclusive or self._waiting[partition]:
                self._cond.wait()
            self._shared[partition] += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared[partition] -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self, partition: int) -> Iterator[None]:
        with self._cond:
            self._waiting[partition] += 1
            try:
                while partition in self._exclusive or self._shared[partition]:
                    self._cond.wait()
            finally:
                self._waiting[partition] -= 1
            self._exclusive.add(partition)
        try:
            yield
        finally:
            with self._cond:
                self._exclusive.discard(partition)
                self._cond.notify_all()


class _Timer:
    """Deadlines keyed like Kafka's coordinator timer: scheduling a key again replaces it."""

    def __init__(self) -> None:
        self._tasks: dict[Hashable, tuple[int, int, Callable[[], None]]] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self.seq = 0

    def schedule(self, key: Hashable, deadline_ms: int, task: Callable[[], None]) -> None:
        self.seq += 1
        self._tasks[key] = (deadline_ms, self.seq, task)
        heapq.heappush(self._heap, (deadline_ms, self.seq, key))

    def cancel(self, key: Hashable) -> None:
        self._tasks.pop(key, None)

    def cancel_where(self, predicate: Callable[[Hashable], bool]) -> None:
        for key in [k for k in self._tasks if predicate(k)]:
            del self._tasks[key]

    def deadline(self, key: Hashable) -> int | None:
        task = self._tasks.get(key)
        return task[0] if task is not None else None

    def pop_due(self, now_ms: int, max_seq: int) -> Callable[[], None] | None:
        """The earliest task due at ``now_ms`` that was scheduled no later than ``max_seq``."""
        later = []
        try:
            while self._heap and self._heap[0][0] <= now_ms:
                entry = heapq.heappop(self._heap)
                task = self._tasks.get(entry[2])
                if task is None or task[1] != entry[1]:
                    continue  # cancelled or rescheduled
                if entry[1] > max_seq:
                    later.append(entry)
                    continue
                del self._tasks[entry[2]]
                return task[2]
            return None
        finally:
            for entry in later:
                heapq.heappush(self._heap, entry)

    def next_deadline(self) -> int | None:
        while self._heap:
            deadline, seq, key = self._heap[0]
            task = self._tasks.get(key)
            if task is not None and task[1] == seq:
                return deadline
            heapq.heappop(self._heap)
        return None


def _join_key(group_id: str) -> tuple:
    return ("join", group_id)


def _sync_key(group_id: str) -> tuple:
    return ("sync", group_id)


def _heartbeat_key(group_id: str, member_id: str) -> tuple:
    return ("heartbeat", group_id, member_id)


class GroupCoordinator:
    """Kafka's group coordinator for classic groups, in-process and thread-safe.

    Args:
        append: writes a group record (``append(group_id, key, value or None) -> Errors``);
            the default keeps nothing and answers NO_ERROR (tests, or no persistence).
        config: Kafka's group settings.
        time_ms: the clock (ms); every deadline is computed from it.
        new_uuid: the unique part of new member ids (default: a random UUID).
        offsets: the committed offsets, for offset expiration. Default: the object ``append``
            is a bound method of, if it is an :class:`OffsetStore` (the broker passes
            ``GroupOffsets.append_group_record``); without one, offsets never expire.
    """

    def __init__(self, append: AppendFn | None = None, config: GroupConfig | None = None,
                 time_ms: Callable[[], int] | None = None, new_uuid: Callable[[], str] | None = None,
                 offsets: OffsetStore | None = None):
        self.config = config or GroupConfig()
        self._append = append or (lambda group_id, key, value: Errors.NO_ERROR)
        self._offsets = offsets
        self._offsets_guard = _PartitionGuard()
        self._expiration: threading.Thread | None = None
        self._clock = time_ms or _now_ms
        self._new_uuid = new_uuid or (lambda: str(uuid.uuid4()))
        self._lock = threading.RLock()
        self._groups: dict[str, GroupMetadata] = {}
        self._timer = _Timer()
        self._firing_at: int | None = None
        #: answers to hand out once the lock is released (shared with every group)
        self._completions: list[tuple[Future, object]] = []
        self._appends: deque = deque()
        self._appends_lock = threading.Lock()
        self._appending = False
        self._active = True
        self._loading = 0
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._scheduler: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def startup(self, schedule: bool = True) -> None:
        """Start the scheduler thread that fires deadlines as they fall due (the production
        setup) and, with an :class:`OffsetStore`, the offset-expiration thread, which runs
        :meth:`cleanup_group_metadata` every ``offsets.retention.check.interval.ms``, the first
        time one interval after startup (Kafka's ``scheduleGroupMetadataExpiration``). Without
        them, call :meth:`check_expirations` and :meth:`cleanup_group_metadata` yourself."""
        self._active = True
        if schedule and self._scheduler is None:
            self._stop.clear()
            self._scheduler = threading.Thread(target=self._schedule_loop, name="txlake-group-scheduler", daemon=True)
            self._scheduler.start()
            if self._offsets is not None:
                self._expiration = threading.Thread(target=self._expiration_loop, name="txlake-offsets-expiration",
                                                    daemon=True)
                self._expiration.start()

    def shutdown(self) -> None:
        """Stop the scheduler and unload every group (Kafka's ``onGroupUnloaded``): groups go
        Dead, parked JoinGroup/SyncGroup requests answer NOT_COORDINATOR, later requests
        answer COORDINATOR_NOT_AVAILABLE."""
        self._stop.set()
        self._wakeup.set()
        for thread in (self._scheduler, self._expiration):
            if thread is not None:
                thread.join(timeout=10)
        self._scheduler = self._expiration = None
        with self._lock:
            self._active = False
            for group in list(self._groups.values()):
                self._unload(group)
            self._groups.clear()
        self._run_deferred()

    def _schedule_loop(self) -> None:
        while not self._stop.is_set():
            self._wakeup.clear()
            try:
                next_deadline = self.check_expirations()
            except Exception as exc:  # the scheduler must survive one bad round
                log.warning("group coordinator expiration round failed: %s", exc, exc_info=True)
                next_deadline = None
            wait = _MAX_SCHEDULER_WAIT_S if next_deadline is None else \
                min(_MAX_SCHEDULER_WAIT_S, max(0.0, (next_deadline - self._clock()) / 1000))
            self._wakeup.wait(wait)

    def _expiration_loop(self) -> None:
        interval_s = min(self.config.offsets_retention_check_interval_ms / 1000, threading.TIMEOUT_MAX)
        while not self._stop.wait(interval_s):
            try:
                self.cleanup_group_metadata()
            except Exception as exc:  # the next round tries again
                log.warning("offset expiration round failed: %s", exc, exc_info=True)

    def check_expirations(self, now_ms: int | None = None) -> int | None:
        """Fire every deadline due at ``now_ms`` (default: the clock) that was scheduled before
        this call: heartbeat (session timeout) expiry, join completion (rebalance timeout,
        initial delay), pending-sync expiry, pending-member expiry. Returns the next deadline
        (ms), or None. The scheduler thread calls this; so do tests.

        Raises:
            Exception: the first exception a deadline raised (the others still ran).
        """
        failure: Exception | None = None
        with self._lock:
            now = self._clock() if now_ms is None else now_ms
            self._firing_at = now
            try:
                limit = self._timer.seq
                while (task := self._timer.pop_due(now, limit)) is not None:
                    try:
                        task()
                    except Exception as exc:
                        log.error("group coordinator deadline failed: %s", exc, exc_info=True)
                        failure = failure or exc
            finally:
                self._firing_at = None
            next_deadline = self._timer.next_deadline()
        self._run_deferred()
        if failure is not None:
            raise failure
        return next_deadline

    def _now(self) -> int:
        return self._firing_at if self._firing_at is not None else self._clock()

    # ------------------------------------------------------------------ lookups
    @property
    def num_partitions(self) -> int:
        """The partition count of ``__consumer_offsets`` that places the groups: the offset
        store's (the existing topic's count, whatever ``offsets.topic.num.partitions`` says --
        Kafka's ``GroupCoordinatorService`` takes it from the metadata cache, the config only for
        a topic yet to be created); without an :class:`OffsetStore`,
        ``offsets.topic.num.partitions``."""
        if self._offsets is not None:
            return self._offsets.num_partitions
        return self.config.offsets_topic_num_partitions

    def partition_for(self, group_id: str) -> int:
        """The group's ``__consumer_offsets`` partition: ``abs(javaHashCode(group)) % partitions``
        (``partitions`` = :attr:`num_partitions`)."""
        return partition_for(group_id, self.num_partitions)

    def get_group(self, group_id: str) -> GroupMetadata | None:
        """The group's live state, or None (for inspection; mutate it only through the handlers)."""
        with self._lock:
            return self._groups.get(group_id)

    def _status_error(self, group_id: str, allow_empty_id: bool = False) -> Errors | None:
        """Kafka's ``validateGroupStatus``: INVALID_GROUP_ID, COORDINATOR_NOT_AVAILABLE (shut
        down), COORDINATOR_LOAD_IN_PROGRESS (loading), or None."""
        if group_id is None or (not group_id and not allow_empty_id):
            return Errors.INVALID_GROUP_ID
        if not self._active:
            return Errors.COORDINATOR_NOT_AVAILABLE
        if self._loading:
            return Errors.COORDINATOR_LOAD_IN_PROGRESS
        return None

    # ------------------------------------------------------------------ JoinGroup
    def handle_join_group(self, group_id: str, member_id: str, protocol_type: str, protocols: Iterable[Protocol],
                          session_timeout_ms: int, rebalance_timeout_ms: int = -1, *,
                          group_instance_id: str | None = None, client_id: str = "", client_host: str = "",
                          require_known_member_id: bool = True, supports_skip_assignment: bool = True,
                          reason: str | None = None) -> Future:
        """JoinGroup: a Future of :class:`JoinGroupResult`, completed when the join phase decides.

        Args:
            member_id: "" for a member without one yet.
            protocols: ``[(assignor name, subscription bytes)]`` in order of preference.
            session_timeout_ms: ``session.timeout.ms``.
            rebalance_timeout_ms: ``max.poll.interval.ms`` (-1: the session timeout, JoinGroup v0).
            group_instance_id: ``group.instance.id`` of a static member (KIP-345).
            require_known_member_id: KIP-394 (JoinGroup v4+): a dynamic member without id is
                answered MEMBER_ID_REQUIRED with its new id and must join again with it.
            supports_skip_assignment: JoinGroup v9+: a static leader rejoining a Stable group
                learns it is leader with ``skip_assignment`` (it must not compute a new assignment).

        Answers (``error``): NO_ERROR with the generation, protocol, leader (and the members,
        for the leader); MEMBER_ID_REQUIRED (with the new ``member_id``); INVALID_GROUP_ID;
        INVALID_SESSION_TIMEOUT (outside ``group.min/max.session.timeout.ms``);
        INCONSISTENT_GROUP_PROTOCOL (another protocol type, or no protocol in common);
        UNKNOWN_MEMBER_ID (an unknown member id, or the member was removed while waiting);
        FENCED_INSTANCE_ID (the instance id belongs to a newer member id);
        GROUP_MAX_SIZE_REACHED; COORDINATOR_LOAD_IN_PROGRESS; COORDINATOR_NOT_AVAILABLE;
        NOT_COORDINATOR (shut down while waiting); REBALANCE_IN_PROGRESS never (Kafka parks instead).
        """
        future: Future = Future()
        protocols = [(name, bytes(metadata)) for name, metadata in protocols]
        if rebalance_timeout_ms < 0:
            rebalance_timeout_ms = session_timeout_ms
        with self._lock:
            error = self._status_error(group_id)
            if error is None and not (self.config.group_min_session_timeout_ms <= session_timeout_ms
                                      <= self.config.group_max_session_timeout_ms):
                error = Errors.INVALID_SESSION_TIMEOUT
            if error is not None:
                self._answer(future, JoinGroupResult(error, member_id))
            else:
                self._join(group_id, member_id, group_instance_id, protocol_type, protocols, session_timeout_ms,
                           rebalance_timeout_ms, client_id, client_host, require_known_member_id,
                           supports_skip_assignment, reason or "not provided", future)
                group = self._groups.get(group_id)
                if (group is not None and group.is_in(GroupState.EMPTY) and group.generation_id == 0
                        and not group.members and not group.pending_members):
                    del self._groups[group_id]  # created for a JoinGroup that was refused: forget it
        self._run_deferred()
        return future

    def _join(self, group_id, member_id, group_instance_id, protocol_type, protocols, session_timeout_ms,
              rebalance_timeout_ms, client_id, client_host, require_known_member_id, supports_skip_assignment,
              reason, future) -> None:
        is_unknown = member_id == UNKNOWN_MEMBER_ID
        group = self._groups.get(group_id)
        if group is None:
            if not is_unknown:
                # a member id for a group that does not exist: the member must rejoin without it
                self._answer(future, JoinGroupResult(Errors.UNKNOWN_MEMBER_ID, member_id))
                return
            group = GroupMetadata(group_id, GroupState.EMPTY, self._now(), completions=self._completions)
            self._groups[group_id] = group
        if not self._accept_joining_member(group, member_id):
            self._remove_member(group, member_id)
            self._answer(future, JoinGroupResult(Errors.GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER_ID))
            return
        names = {name for name, _ in protocols}
        if group.is_in(GroupState.DEAD):
            # removed meanwhile: the member looks the coordinator up again and rejoins
            self._answer(future, JoinGroupResult(Errors.COORDINATOR_NOT_AVAILABLE, member_id))
            return
        if not group.supports_protocols(protocol_type, names):
            self._answer(future, JoinGroupResult(Errors.INCONSISTENT_GROUP_PROTOCOL, member_id))
            return
        timeouts = (rebalance_timeout_ms, session_timeout_ms)
        if is_unknown:
            new_member_id = group.generate_member_id(client_id, group_instance_id, self._new_uuid())
            if group_instance_id is not None:
                existing = group.static_member_id(group_instance_id)
                if existing is not None:
                    log.info("Static member %s of group %s rejoins with an unknown member id in state %s: "
                             "replacing member %s by %s", group_instance_id, group_id, group.state, existing,
                             new_member_id)
                    self._update_static_member(group, group_instance_id, existing, new_member_id, protocols,
                                               timeouts, future, supports_skip_assignment, reason)
                else:
                    self._add_member(group, new_member_id, group_instance_id, client_id, client_host, timeouts,
                                     protocol_type, protocols, future, reason)
            elif require_known_member_id:
                group.add_pending_member(new_member_id)
                self._schedule_heartbeat_expiry(group, new_member_id, session_timeout_ms)
                self._answer(future, JoinGroupResult(Errors.MEMBER_ID_REQUIRED, new_member_id))
            else:
                self._add_member(group, new_member_id, None, client_id, client_host, timeouts, protocol_type,
                                 protocols, future, reason)
            return
        if group.is_pending_member(member_id):
            if group_instance_id is not None:  # Kafka: IllegalStateException -> UNKNOWN_SERVER_ERROR
                log.error("JoinGroup of pending member %s of %s names group.instance.id %s", member_id, group_id,
                          group_instance_id)
                self._answer(future, JoinGroupResult(Errors.UNKNOWN_SERVER_ERROR, member_id))
                return
            self._add_member(group, member_id, None, client_id, client_host, timeouts, protocol_type, protocols,
                             future, reason)
            return
        error = group.validate_member(member_id, group_instance_id)
        if error is not None:
            self._answer(future, JoinGroupResult(error, member_id))
            return
        member = group.member(member_id)
        if group.is_in(GroupState.PREPARING_REBALANCE):
            self._update_member(group, member, protocols, timeouts, future,
                                f"member {member_id} joining during {group.state}; client reason: {reason}")
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            if member.matches(protocols):
                # the same metadata: it probably missed its JoinGroup response; answer it again
                self._answer(future, self._join_result(group, member_id, group.is_leader(member_id)))
            else:
                self._update_member(group, member, protocols, timeouts, future,
                                    f"metadata of member {member_id} changed during {group.state}; client reason: {reason}")
        elif group.is_in(GroupState.STABLE):
            if group.is_leader(member_id) or not member.matches(protocols):
                # a rejoining leader forces a rebalance (its topic metadata may have changed)
                self._update_member(group, member, protocols, timeouts, future,
                                    f"member {member_id} rejoining during {group.state}; client reason: {reason}")
            else:
                self._answer(future, self._join_result(group, member_id, with_members=False))
        else:
            log.warning("Attempt to add rejoining member %s of group %s in unexpected state %s", member_id,
                        group_id, group.state)
            self._answer(future, JoinGroupResult(Errors.UNKNOWN_MEMBER_ID, member_id))

    def _join_result(self, group: GroupMetadata, member_id: str, with_members: bool, leader_id: str | None = None,
                     skip_assignment: bool = False) -> JoinGroupResult:
        return JoinGroupResult(Errors.NO_ERROR, member_id, group.generation_id, group.protocol_type,
                               group.protocol_name, group.leader_id if leader_id is None else leader_id,
                               skip_assignment, group.current_members_metadata() if with_members else ())

    def _accept_joining_member(self, group: GroupMetadata, member_id: str) -> bool:
        """Kafka's ``acceptJoiningMember``: ``group.max.size`` counts awaiting members while
        PreparingRebalance, and all members when CompletingRebalance or Stable."""
        if group.state in (GroupState.EMPTY, GroupState.DEAD):
            return True
        if group.is_in(GroupState.PREPARING_REBALANCE):
            return ((group.has_member(member_id) and group.member(member_id).is_awaiting_join)
                    or group.num_members_awaiting_join < self.config.group_max_size)
        return group.has_member(member_id) or group.size < self.config.group_max_size

    def _add_member(self, group: GroupMetadata, member_id: str, group_instance_id: str | None, client_id: str,
                    client_host: str, timeouts: tuple[int, int], protocol_type: str, protocols: list[Protocol],
                    future: Future, reason: str) -> None:
        """Kafka's ``addMemberThenRebalanceOrCompleteJoin``."""
        member = GroupMember(member_id, group_instance_id, client_id, client_host, timeouts[0], timeouts[1],
                             protocol_type, protocols)
        member.is_new = True
        if group.is_in(GroupState.PREPARING_REBALANCE) and group.previous_state is GroupState.EMPTY:
            group.new_member_added = True  # the initial rebalance may wait a little longer
        group.add(member, future)
        # a new member cannot heartbeat while its JoinGroup is parked; bound how long it may be
        self._schedule_heartbeat_expiry(group, member_id, self.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance_or_complete_join(
            group, f"adding new member {member_id} with group instance id {group_instance_id}; client reason: {reason}")

    def _update_member(self, group: GroupMetadata, member: GroupMember, protocols: list[Protocol],
                       timeouts: tuple[int, int], future: Future | None, reason: str) -> None:
        """Kafka's ``updateMemberThenRebalanceOrCompleteJoin``."""
        group.update_member(member, protocols, timeouts[0], timeouts[1], future)
        self._maybe_prepare_rebalance_or_complete_join(group, reason)

    def _update_static_member(self, group: GroupMetadata, group_instance_id: str, old_member_id: str,
                              new_member_id: str, protocols: list[Protocol], timeouts: tuple[int, int],
                              future: Future, supports_skip_assignment: bool, reason: str) -> None:
        """A known static member rejoins with an unknown member id (Kafka's
        ``updateStaticMemberThenRebalanceOrCompleteJoin``): it gets a new member id and the old
        one is fenced. In a Stable group whose selected protocol stays the same there is no
        rebalance: the group record is rewritten with the new id and the member gets the
        current generation back (its assignment comes with its SyncGroup)."""
        current_leader = group.leader_id
        member = group.replace_static_member(group_instance_id, old_member_id, new_member_id)
        self._timer.cancel(_heartbeat_key(group.group_id, old_member_id))
        self._reschedule_heartbeat(group, member)
        old_protocols, old_timeouts = list(member.supported_protocols), (member.rebalance_timeout_ms,
                                                                         member.session_timeout_ms)
        group.update_member(member, protocols, timeouts[0], timeouts[1], future)
        if group.is_in(GroupState.STABLE):
            if group.protocol_name != group.select_protocol():
                self._maybe_prepare_rebalance_or_complete_join(
                    group, f"static member {new_member_id} with instance id {group_instance_id} changes the "
                           f"selected protocol; client reason: {reason}")
                return
            log.info("Static member %s of Stable group %s rejoined without changing the selected protocol: "
                     "no rebalance", group_instance_id, group.group_id)
            key, value = group.to_record(group.group_assignment())

            def stored(error: Errors) -> None:
                if not (group.is_in(GroupState.STABLE) and member.member_id == new_member_id
                        and member.awaiting_join is future):
                    return  # a rebalance started meanwhile: it answers the member
                if error != Errors.NO_ERROR:
                    log.warning("Failed to persist static member %s of group %s (%s); reverting to member id %s",
                                new_member_id, group.group_id, error.name, old_member_id)
                    group.update_member(member, old_protocols, old_timeouts[0], old_timeouts[1], None)
                    old = group.replace_static_member(group_instance_id, new_member_id, old_member_id)
                    self._timer.cancel(_heartbeat_key(group.group_id, new_member_id))
                    self._reschedule_heartbeat(group, old)
                    self._answer(future, JoinGroupResult(append_error_to_response_error(error), UNKNOWN_MEMBER_ID,
                                                         group.generation_id, group.protocol_type,
                                                         group.protocol_name, current_leader or ""))
                elif supports_skip_assignment:
                    is_leader = group.is_leader(new_member_id)
                    group.complete_join_future(member, self._join_result(group, new_member_id, is_leader,
                                                                         skip_assignment=is_leader))
                else:
                    # before JoinGroup v9: name the old leader id so the member does not run the assignor
                    group.complete_join_future(member, self._join_result(group, new_member_id, False,
                                                                         leader_id=current_leader or ""))

            self._store(group.group_id, key, value, stored)
        elif group.is_in(GroupState.COMPLETING_REBALANCE):
            # the leader may be assigning to the old member id: start over
            self._prepare_rebalance(group, f"static member {new_member_id} with instance id {group_instance_id} "
                                           f"rejoined during {group.state}; client reason: {reason}")
        elif group.state in (GroupState.EMPTY, GroupState.DEAD):
            raise IllegalGroupStateError(f"Group {group.group_id} was not supposed to be in the state {group.state} "
                                         f"when the unknown static member {group_instance_id} rejoins.")
        else:
            self._maybe_complete_join_phase(group)

    # ------------------------------------------------------------------ rebalance
    def _maybe_prepare_rebalance_or_complete_join(self, group: GroupMetadata, reason: str) -> None:
        if group.can_rebalance:
            self._prepare_rebalance(group, reason)
        else:
            self._maybe_complete_join_phase(group)

    def _prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        """Kafka's ``prepareRebalance``: members awaiting SyncGroup are told REBALANCE_IN_PROGRESS;
        a new (Empty) group waits ``group.initial.rebalance.delay.ms``, others complete the join
        phase once every member rejoined or the rebalance timeout passed."""
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            self._reset_and_propagate_assignment_error(group, Errors.REBALANCE_IN_PROGRESS)
        self._remove_sync_expiration(group)
        initial = group.is_in(GroupState.EMPTY)
        if initial:
            delay = self.config.group_initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms - delay, 0)
            self._schedule(_join_key(group.group_id), self._now() + delay,
                           lambda: self._try_complete_initial_rebalance(group, delay, remaining))
        group.transition_to(GroupState.PREPARING_REBALANCE, self._now())
        log.info("Preparing to rebalance group %s in state %s with old generation %d (%s-%d) (reason: %s)",
                 group.group_id, group.state, group.generation_id, "__consumer_offsets",
                 self.partition_for(group.group_id), reason)
        if not initial:
            if group.has_all_members_joined:
                self._complete_join(group)
            else:
                self._schedule(_join_key(group.group_id), self._now() + group.rebalance_timeout_ms,
                               lambda: self._complete_join(group))

    def _try_complete_initial_rebalance(self, group: GroupMetadata, delay_ms: int, remaining_ms: int) -> None:
        """Kafka's ``tryCompleteInitialRebalanceElseSchedule``: a member joined during the delay
        extends it (by at most the configured delay, within the rebalance timeout)."""
        if not self._is_current(group):
            return
        if group.new_member_added and remaining_ms != 0:
            group.new_member_added = False
            new_delay = min(self.config.group_initial_rebalance_delay_ms, remaining_ms)
            new_remaining = max(remaining_ms - delay_ms, 0)
            self._schedule(_join_key(group.group_id), self._now() + new_delay,
                           lambda: self._try_complete_initial_rebalance(group, new_delay, new_remaining))
        else:
            self._complete_join(group)

    def _maybe_complete_join_phase(self, group: GroupMetadata) -> None:
        """Complete the join phase if every member rejoined, except in the initial rebalance
        (which waits for its delay) (Kafka's ``maybeCompleteJoinPhase``)."""
        if (group.is_in(GroupState.PREPARING_REBALANCE) and group.previous_state is not GroupState.EMPTY
                and group.has_all_members_joined):
            self._complete_join(group)

    def _complete_join(self, group: GroupMetadata) -> None:
        """Kafka's ``completeClassicGroupJoin``: dynamic members that did not rejoin are removed,
        the next generation starts, every waiting member gets its JoinGroup response (the
        leader with the members' metadata) and must send SyncGroup within the rebalance timeout."""
        if not self._is_current(group):
            return
        self._timer.cancel(_join_key(group.group_id))
        failed = [m.member_id for m in group.not_yet_rejoined_members() if not m.is_static]
        for member_id in failed:
            self._remove_member(group, member_id)
        if failed:
            log.info("Group %s removed dynamic members who have not rejoined: %s", group.group_id, failed)
        if group.is_in(GroupState.DEAD):
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            log.error("Group %s could not complete rebalance because no members rejoined", group.group_id)
            self._schedule(_join_key(group.group_id), self._now() + group.rebalance_timeout_ms,
                           lambda: self._complete_join(group))
            return
        group.init_next_generation(self._now())
        if group.is_in(GroupState.EMPTY):
            log.info("Group %s with generation %d is now empty", group.group_id, group.generation_id)
            key, value = group.to_record({})

            def stored(error: Errors) -> None:
                if error != Errors.NO_ERROR:  # the members are gone anyway: only warn, as Kafka
                    log.warning("Failed to write empty metadata for group %s: %s", group.group_id, error.name)

            self._store(group.group_id, key, value, stored)
            return
        log.info("Stabilized group %s generation %d with %d members", group.group_id, group.generation_id,
                 group.size)
        for member in list(group.members.values()):
            group.complete_join_future(member, self._join_result(group, member.member_id,
                                                                 group.is_leader(member.member_id)))
            self._reschedule_heartbeat(group, member)
            member.is_new = False
            group.add_pending_sync_member(member.member_id)
        generation = group.generation_id
        self._schedule(_sync_key(group.group_id), self._now() + group.rebalance_timeout_ms,
                       lambda: self._expire_pending_sync(group, generation))

    def _expire_pending_sync(self, group: GroupMetadata, generation_id: int) -> None:
        """Members that did not send SyncGroup within the rebalance timeout are removed and the
        group rebalances (Kafka's ``expirePendingSync``)."""
        if not self._is_current(group) or generation_id != group.generation_id:
            return
        if group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        if not group.has_received_sync_from_all_members:
            pending = sorted(group.pending_sync_members)
            for member_id in pending:
                self._remove_member(group, member_id)
            log.info("Group %s removed members who have not sent their SyncGroup: %s", group.group_id, pending)
            self._prepare_rebalance(group, f"removing {pending} on pending sync request expiration")

    def _remove_sync_expiration(self, group: GroupMetadata) -> None:
        group.pending_sync_members.clear()
        self._timer.cancel(_sync_key(group.group_id))

    def _remove_pending_sync_member(self, group: GroupMetadata, member_id: str) -> None:
        group.remove_pending_sync_member(member_id)
        if (group.state in (GroupState.DEAD, GroupState.EMPTY, GroupState.PREPARING_REBALANCE)
                or group.has_received_sync_from_all_members):
            self._timer.cancel(_sync_key(group.group_id))

    def _reset_and_propagate_assignment_error(self, group: GroupMetadata, error: Errors) -> None:
        if not group.is_in(GroupState.COMPLETING_REBALANCE):
            raise IllegalGroupStateError(f"Group {group.group_id} must be in CompletingRebalance state "
                                         f"but is in {group.state} state.")
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _set_and_propagate_assignment(self, group: GroupMetadata, assignment: dict[str, bytes]) -> None:
        if not group.is_in(GroupState.COMPLETING_REBALANCE):
            raise IllegalGroupStateError("The group must be in CompletingRebalance state to set and propagate "
                                         "assignment.")
        for member_id, member in group.members.items():
            member.assignment = assignment.get(member_id, b"")
        self._propagate_assignment(group, Errors.NO_ERROR)

    def _propagate_assignment(self, group: GroupMetadata, error: Errors) -> None:
        ok = error == Errors.NO_ERROR
        for member in group.members.values():
            result = SyncGroupResult(error, group.protocol_type if ok else None, group.protocol_name if ok else None,
                                     member.assignment)
            if group.complete_sync_future(member, result):
                # a session that expired while it waited for the assignment starts afresh
                self._reschedule_heartbeat(group, member)

    # ------------------------------------------------------------------ members leaving
    def _remove_member(self, group: GroupMetadata, member_id: str) -> None:
        """Remove a member or pending member and its heartbeat deadline. A JoinGroup or SyncGroup
        it still awaits is answered UNKNOWN_MEMBER_ID (Kafka leaves a parked SyncGroup to the
        client's request timeout; in-process threads must never wait on a dead future)."""
        member = group.members.get(member_id)
        if member is not None:
            group.complete_join_future(member, JoinGroupResult(Errors.UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER_ID))
            group.complete_sync_future(member, SyncGroupResult(Errors.UNKNOWN_MEMBER_ID))
        group.remove(member_id)
        self._timer.cancel(_heartbeat_key(group.group_id, member_id))

    def _remove_member_and_update_group(self, group: GroupMetadata, member: GroupMember, reason: str) -> None:
        """Kafka's ``removeMemberAndUpdateClassicGroup``."""
        self._remove_member(group, member.member_id)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(group, reason)
        elif group.is_in(GroupState.PREPARING_REBALANCE) and group.has_all_members_joined:
            self._complete_join(group)

    def _schedule_heartbeat_expiry(self, group: GroupMetadata, member_id: str, timeout_ms: int) -> None:
        self._schedule(_heartbeat_key(group.group_id, member_id), self._now() + timeout_ms,
                       lambda: self._expire_heartbeat(group, member_id))

    def _reschedule_heartbeat(self, group: GroupMetadata, member: GroupMember) -> None:
        """The member is alive: its session restarts now (Kafka's ``rescheduleClassicGroupMemberHeartbeat``)."""
        self._schedule_heartbeat_expiry(group, member.member_id, member.session_timeout_ms)

    def _expire_heartbeat(self, group: GroupMetadata, member_id: str) -> None:
        """A session (or a pending member's, or a parked new member's) deadline passed (Kafka's
        ``expireClassicGroupMemberHeartbeat``). A member awaiting its JoinGroup/SyncGroup answer
        is excused, unless it is new."""
        if not self._is_current(group) or group.is_in(GroupState.DEAD):
            return
        if group.is_pending_member(member_id):
            log.info("Pending member %s in group %s has been removed after session timeout expiration",
                     member_id, group.group_id)
            group.remove(member_id)
            if group.is_in(GroupState.PREPARING_REBALANCE) and group.has_all_members_joined:
                self._complete_join(group)
            return
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat:
            return
        log.info("Member %s in group %s has failed, removing it from the group", member_id, group.group_id)
        self._remove_member_and_update_group(group, member, f"removing member {member_id} on heartbeat expiration")

    # ------------------------------------------------------------------ SyncGroup
    def handle_sync_group(self, group_id: str, generation_id: int, member_id: str,
                          assignments: dict[str, bytes] | None = None, *, group_instance_id: str | None = None,
                          protocol_type: str | None = None, protocol_name: str | None = None) -> Future:
        """SyncGroup: a Future of :class:`SyncGroupResult` with the member's assignment.

        The leader sends ``assignments`` (member id -> bytes; members it leaves out get empty
        bytes); the group record is written, the group goes Stable and every member waiting
        in this generation gets its assignment. Followers wait for that. In a Stable group the
        current assignment is answered at once.

        Answers: NO_ERROR; UNKNOWN_MEMBER_ID (unknown member or group, or an Empty group);
        FENCED_INSTANCE_ID; ILLEGAL_GENERATION; INCONSISTENT_GROUP_PROTOCOL (a protocol type
        or name other than the group's); REBALANCE_IN_PROGRESS (a new rebalance started: rejoin;
        also while the coordinator is loading, as Kafka); the append's error, mapped by
        :func:`append_error_to_response_error`, when the group record cannot be written.
        """
        future: Future = Future()
        with self._lock:
            error = self._status_error(group_id)
            if error == Errors.COORDINATOR_LOAD_IN_PROGRESS:
                error = Errors.REBALANCE_IN_PROGRESS  # the rebalance state was lost: rejoin
            group = self._groups.get(group_id) if error is None else None
            if error is None and (group is None or group.is_in(GroupState.EMPTY)):
                error = Errors.UNKNOWN_MEMBER_ID
            if error is None:
                error = self._validate_sync(group, generation_id, member_id, group_instance_id, protocol_type,
                                            protocol_name)
            if error is not None:
                self._answer(future, SyncGroupResult(error))
            elif group.is_in(GroupState.PREPARING_REBALANCE):
                self._answer(future, SyncGroupResult(Errors.REBALANCE_IN_PROGRESS))
            elif group.is_in(GroupState.COMPLETING_REBALANCE):
                group.member(member_id).awaiting_sync = future
                self._remove_pending_sync_member(group, member_id)
                if group.is_leader(member_id):
                    self._store_assignment(group, member_id, generation_id, dict(assignments or {}))
            elif group.is_in(GroupState.STABLE):
                self._remove_pending_sync_member(group, member_id)
                member = group.member(member_id)
                self._answer(future, SyncGroupResult(Errors.NO_ERROR, group.protocol_type, group.protocol_name,
                                                     member.assignment))
                self._reschedule_heartbeat(group, member)
            else:
                raise IllegalGroupStateError(f"Reached unexpected condition for group {group_id} in {group.state}")
        self._run_deferred()
        return future

    @staticmethod
    def _validate_sync(group: GroupMetadata, generation_id: int, member_id: str, group_instance_id: str | None,
                       protocol_type: str | None, protocol_name: str | None) -> Errors | None:
        error = group.validate_generation(member_id, group_instance_id, generation_id)
        if error is not None:
            return error
        if (protocol_type is not None and group.protocol_type is not None and protocol_type != group.protocol_type) \
                or (protocol_name is not None and group.protocol_name is not None
                    and protocol_name != group.protocol_name):
            return Errors.INCONSISTENT_GROUP_PROTOCOL
        return None

    def _store_assignment(self, group: GroupMetadata, leader_id: str, generation_id: int,
                          assignment: dict[str, bytes]) -> None:
        """The leader's SyncGroup: write the group record, then go Stable and hand out the
        assignments (or, if the write failed, answer the error and rebalance)."""
        log.info("Assignment received from leader %s for group %s for generation %d. The group has %d members, "
                 "%d of which are static.", leader_id, group.group_id, generation_id, group.size,
                 len(group.static_members))
        missing = [m for m in group.members if m not in assignment]
        if missing:
            log.warning("Setting empty assignments for members %s of %s for generation %d", missing, group.group_id,
                        generation_id)
        for member_id in missing:
            assignment[member_id] = b""
        key, value = group.to_record(assignment)

        def stored(error: Errors) -> None:
            # another member may have joined meanwhile: act only on this very generation
            if not (self._is_current(group) and group.is_in(GroupState.COMPLETING_REBALANCE)
                    and group.generation_id == generation_id):
                return
            if error != Errors.NO_ERROR:
                error = append_error_to_response_error(error)
                self._reset_and_propagate_assignment_error(group, error)
                self._maybe_prepare_rebalance_or_complete_join(
                    group, f"error {error.name} when storing group assignment during SyncGroup (member: {leader_id})")
            else:
                self._set_and_propagate_assignment(group, assignment)
                group.transition_to(GroupState.STABLE, self._now())

        self._store(group.group_id, key, value, stored)

    # ------------------------------------------------------------------ Heartbeat
    def handle_heartbeat(self, group_id: str, generation_id: int, member_id: str,
                         group_instance_id: str | None = None) -> Errors:
        """Heartbeat: the member is alive; its session timeout restarts.

        Answers NO_ERROR (Stable or CompletingRebalance; also, blindly, while loading, as Kafka);
        REBALANCE_IN_PROGRESS (PreparingRebalance: rejoin); UNKNOWN_MEMBER_ID (unknown member
        or group, or an Empty group); FENCED_INSTANCE_ID; ILLEGAL_GENERATION; INVALID_GROUP_ID;
        COORDINATOR_NOT_AVAILABLE.
        """
        with self._lock:
            error = self._status_error(group_id)
            if error == Errors.COORDINATOR_LOAD_IN_PROGRESS:
                return Errors.NO_ERROR
            if error is not None:
                return error
            group = self._groups.get(group_id)
            if group is None:
                return Errors.UNKNOWN_MEMBER_ID
            error = group.validate_generation(member_id, group_instance_id, generation_id)
            if error is not None:
                return error
            if group.is_in(GroupState.EMPTY):
                return Errors.UNKNOWN_MEMBER_ID
            self._reschedule_heartbeat(group, group.member(member_id))
            if group.is_in(GroupState.PREPARING_REBALANCE):
                return Errors.REBALANCE_IN_PROGRESS
            return Errors.NO_ERROR

    # ------------------------------------------------------------------ LeaveGroup
    def handle_leave_group(self, group_id: str, members: Iterable[MemberIdentity]) -> LeaveGroupResult:
        """LeaveGroup for a batch of members (KIP-345), each by member id, or by instance id
        alone (``member_id`` ""). Leaving members start a rebalance.

        Top-level answers: NO_ERROR with one answer per member (NO_ERROR, UNKNOWN_MEMBER_ID,
        FENCED_INSTANCE_ID); UNKNOWN_MEMBER_ID for an unknown group (Kafka's current
        coordinator); INVALID_GROUP_ID; COORDINATOR_LOAD_IN_PROGRESS; COORDINATOR_NOT_AVAILABLE.
        """
        members = list(members)
        with self._lock:
            error = self._status_error(group_id)
            group = self._groups.get(group_id) if error is None else None
            if error is None and group is None:
                error = Errors.UNKNOWN_MEMBER_ID
            if error is None and group.is_in(GroupState.DEAD):
                error = Errors.COORDINATOR_NOT_AVAILABLE
            if error is not None:
                return LeaveGroupResult(error)
            answers = []
            for leaving in members:
                answers.append(LeaveMemberResponse(leaving.member_id, leaving.group_instance_id,
                                                   self._leave(group, leaving)))
            left = [a.member_id for a in answers if a.error == Errors.NO_ERROR]
            if left:
                reason = f"explicit `LeaveGroup` request for ({', '.join(left)}) members."
                if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
                    self._maybe_prepare_rebalance_or_complete_join(group, reason)
                elif group.is_in(GroupState.PREPARING_REBALANCE):
                    self._maybe_complete_join_phase(group)
        self._run_deferred()
        return LeaveGroupResult(Errors.NO_ERROR, tuple(answers))

    def _leave(self, group: GroupMetadata, leaving: MemberIdentity) -> Errors:
        reason = leaving.reason or "not provided"
        if leaving.member_id == UNKNOWN_MEMBER_ID:
            member_id = group.static_member_id(leaving.group_instance_id) if leaving.group_instance_id else None
            if member_id is None:
                return Errors.UNKNOWN_MEMBER_ID
        elif group.is_pending_member(leaving.member_id):
            group.remove(leaving.member_id)
            self._timer.cancel(_heartbeat_key(group.group_id, leaving.member_id))
            log.info("Pending member %s has left group %s; client reason: %s", leaving.member_id, group.group_id,
                     reason)
            return Errors.NO_ERROR
        else:
            error = group.validate_member(leaving.member_id, leaving.group_instance_id)
            if error is not None:
                return error
            member_id = leaving.member_id
        log.info("Member %s has left group %s through explicit `LeaveGroup`; client reason: %s", member_id,
                 group.group_id, reason)
        self._remove_member(group, member_id)
        return Errors.NO_ERROR

    # ------------------------------------------------------------------ offset commits (KIP-447)
    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                               group_instance_id: str | None = None, *, is_transactional: bool = False) -> Errors:
        """May this OffsetCommit (or, with ``is_transactional``, TxnOffsetCommit) be stored?

        Kafka's ``validateOffsetCommit`` / ``validateTransactionalOffsetCommit``:

        * unknown group: NO_ERROR for generation -1 (a "simple" group of an assign()-based
          consumer or the group-id-only ``send_offsets_to_transaction``), else ILLEGAL_GENERATION;
        * then :meth:`~.group_metadata.GroupMetadata.validate_offset_commit`: UNKNOWN_MEMBER_ID,
          FENCED_INSTANCE_ID (a static member's older member id: a zombie), ILLEGAL_GENERATION
          (a stale generation), REBALANCE_IN_PROGRESS (a plain commit while CompletingRebalance),
          COORDINATOR_NOT_AVAILABLE (Dead); generation -1 without a member only while the
          group is Empty (always for a transactional commit, as Kafka);
        * INVALID_GROUP_ID (an empty id for a transactional commit), COORDINATOR_LOAD_IN_PROGRESS,
          COORDINATOR_NOT_AVAILABLE.

        A valid plain commit of a member of a Stable or PreparingRebalance group also counts
        as its heartbeat, as in Kafka. The caller stores the offsets only on NO_ERROR.
        """
        with self._lock:
            error = self._status_error(group_id, allow_empty_id=not is_transactional)
            if error is not None:
                return error
            group = self._groups.get(group_id)
            if group is None:
                return Errors.NO_ERROR if generation_id < 0 else Errors.ILLEGAL_GENERATION
            error = group.validate_offset_commit(member_id, group_instance_id, generation_id, is_transactional)
            if (error == Errors.NO_ERROR and not is_transactional and group.has_member(member_id)
                    and group.state in (GroupState.STABLE, GroupState.PREPARING_REBALANCE)):
                self._reschedule_heartbeat(group, group.member(member_id))
            return error

    def offset_commit_guard(self, group_id: str) -> ContextManager[None]:
        """Hold this around an OffsetCommit's check and write: commits of the group's
        ``__consumer_offsets`` partition run side by side, but never while
        :meth:`cleanup_group_metadata` works on that partition (Kafka keeps such offsets in
        ``pendingOffsetCommits`` and does not expire them)."""
        return self._offsets_guard.shared(self.partition_for(group_id))

    # ------------------------------------------------------------------ offset expiration (KIP-211)
    def cleanup_group_metadata(self, now_ms: int | None = None) -> int:
        """Expire offsets and remove groups left without any (Kafka's
        ``GroupMetadataManager.cleanupGroupMetadata`` with ``OffsetMetadataManager.cleanupExpiredOffsets``).

        For each ``__consumer_offsets`` partition, each group with offsets or metadata there:

        * its :meth:`~.group_metadata.GroupMetadata.offset_expiration_condition` -- a group with
          a protocol type while Empty: ``offsets.retention.minutes`` after it became Empty; a
          Stable consumer group: the offsets of topics it no longer subscribes to (KIP-496),
          after their commit; a group without group management (offsets only, committed with
          assign()): per offset, ``offsets.retention.minutes`` after its commit; an offset with
          an explicit expire timestamp at that timestamp; any other group keeps its offsets;
        * an offset expires unless its topic is subscribed or a transactional commit of its
          partition is pending (KIP-447); the expired ones get tombstones, one batch per
          ``__consumer_offsets`` partition;
        * an Empty group left with no offsets and no pending transactional ones goes Dead and
          is forgotten; a tombstone of its record is written unless its generation is 0 (Kafka:
          such a group only stored offsets).

        Args:
            now_ms: the time to expire at (ms since the epoch); default: the coordinator's clock.

        Returns:
            the number of offsets removed (0 without an :class:`OffsetStore`).
        """
        if self._offsets is None:
            return 0
        now = self._clock() if now_ms is None else now_ms
        started = time.monotonic()
        removed = 0
        for partition in range(self.num_partitions):
            with self._lock:
                if not self._active:
                    break
            removed += self._cleanup_partition(partition, now)
        if removed:
            log.info("Removed %d expired offsets in %d milliseconds.", removed, (time.monotonic() - started) * 1000)
        return removed

    def _cleanup_partition(self, partition: int, now: int) -> int:
        """:meth:`cleanup_group_metadata` of one ``__consumer_offsets`` partition."""
        retention_ms = self.config.offsets_retention_ms
        with self._offsets_guard.exclusive(partition):
            states = self._offsets.replay(partition)
            expired: dict[str, list[TopicPartitionKey]] = {}
            emptied: list[GroupMetadata] = []
            with self._lock:
                groups = {g for g in self._groups if self.partition_for(g) == partition}
                for group_id in sorted(groups | set(states)):
                    group = self._groups.get(group_id)
                    if group is not None and group.is_in(GroupState.DEAD):
                        continue
                    condition = STANDALONE_OFFSET_EXPIRATION if group is None else group.offset_expiration_condition()
                    if condition is None:
                        continue
                    state = states.get(group_id) or GroupOffsetsState()
                    subscribed = (group.subscribed_topics() if group is not None else None) or frozenset()
                    gone = [tp for tp, (_, om) in sorted(state.committed.items())
                            if tp[0] not in subscribed and tp not in state.pending
                            and condition.is_offset_expired(om, now, retention_ms)]
                    if gone:
                        expired[group_id] = gone
                    if group is not None and len(gone) == len(state.committed) and not state.pending:
                        emptied.append(group)
            error = self._offsets.delete_offsets(partition, expired)
            if error != Errors.NO_ERROR:
                log.warning("Failed to write the tombstones of %d expired offsets to __consumer_offsets-%d: %s",
                            sum(map(len, expired.values())), partition, error.name)
                return 0
            for group_id, gone in expired.items():
                log.debug("Group %s: expired offsets of %s", group_id, gone)
            with self._lock:
                for group in emptied:
                    if self._is_current(group) and group.is_in(GroupState.EMPTY):
                        self._remove_dead_group(group)
        self._run_deferred()
        return sum(map(len, expired.values()))

    def _remove_dead_group(self, group: GroupMetadata) -> None:
        """An Empty group without offsets goes Dead and is forgotten; its record gets a tombstone
        unless its generation is 0 (caller holds the lock)."""
        group_id = group.group_id
        log.info("Group %s transitioned to Dead in generation %d", group_id, group.generation_id)
        self._unload(group)
        del self._groups[group_id]
        if group.generation_id > 0:
            def stored(error: Errors) -> None:
                if error != Errors.NO_ERROR:  # the group comes back Empty after a restart and is removed again
                    log.warning("Failed to write the tombstone of group %s: %s", group_id, error.name)

            self._store(group_id, group_metadata_key(group_id), None, stored)

    # ------------------------------------------------------------------ Describe / List / Delete
    def handle_describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        """DescribeGroups: a description per id; an unknown group is described as Dead with no
        members (NO_ERROR, as Kafka). Member metadata and assignments appear only when Stable."""
        out = []
        with self._lock:
            for group_id in group_ids:
                error = self._status_error(group_id, allow_empty_id=True)
                group = self._groups.get(group_id)
                if error is not None:
                    out.append(GroupDescription(group_id, error, "", "", ""))
                elif group is None:
                    out.append(GroupDescription(group_id, Errors.NO_ERROR, GroupState.DEAD.value, "", ""))
                else:
                    out.append(group.describe())
        return out

    def handle_list_groups(self, states_filter: Iterable[str] = ()) -> tuple[Errors, list[GroupOverview]]:
        """ListGroups: every group, or those in the given states (names, case-insensitive).
        COORDINATOR_NOT_AVAILABLE after shutdown; COORDINATOR_LOAD_IN_PROGRESS (with the groups
        loaded so far) while loading."""
        wanted = {s.lower() for s in states_filter}
        with self._lock:
            if not self._active:
                return Errors.COORDINATOR_NOT_AVAILABLE, []
            error = Errors.COORDINATOR_LOAD_IN_PROGRESS if self._loading else Errors.NO_ERROR
            groups = [g.overview() for g in self._groups.values() if not wanted or g.state.value.lower() in wanted]
        return error, sorted(groups, key=lambda o: o.group_id)

    def handle_delete_groups(self, group_ids: Iterable[str]) -> dict[str, Errors]:
        """DeleteGroups: an Empty group goes Dead, is forgotten and a tombstone of its record
        is written (the caller deletes its offsets). Answers per group: NO_ERROR;
        GROUP_ID_NOT_FOUND (unknown or already Dead); NON_EMPTY_GROUP (it has members);
        the tombstone append's error (mapped), in which case the group is gone from memory
        but comes back Empty after a restart."""
        results: dict[str, Errors] = {}
        written: dict[str, Future] = {}
        with self._lock:
            for group_id in group_ids:
                error = self._status_error(group_id, allow_empty_id=True)
                group = self._groups.get(group_id)
                if error is not None:
                    results[group_id] = error
                elif group is None or group.is_in(GroupState.DEAD):
                    results[group_id] = Errors.GROUP_ID_NOT_FOUND
                elif group.is_in(GroupState.EMPTY):
                    self._unload(group)
                    del self._groups[group_id]
                    done: Future = Future()
                    written[group_id] = done
                    self._store(group_id, group_metadata_key(group_id), None,
                                lambda err, done=done: self._answer(done, append_error_to_response_error(err)))
                else:
                    results[group_id] = Errors.NON_EMPTY_GROUP
        self._run_deferred()
        for group_id, done in written.items():
            try:
                results[group_id] = done.result(timeout=_TOMBSTONE_TIMEOUT_S)
            except TimeoutError:
                results[group_id] = Errors.REQUEST_TIMED_OUT
            if results[group_id] == Errors.NO_ERROR:
                log.info("Group %s was deleted", group_id)
        return results

    def _unload(self, group: GroupMetadata) -> None:
        """The group goes Dead (Kafka's ``onGroupUnloaded``): parked requests answer NOT_COORDINATOR."""
        previous = group.state
        group.transition_to(GroupState.DEAD, self._now())
        if previous is GroupState.PREPARING_REBALANCE:
            for member in group.members.values():
                group.complete_join_future(member, JoinGroupResult(Errors.NOT_COORDINATOR, member.member_id))
        elif previous in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            for member in group.members.values():
                group.complete_sync_future(member, SyncGroupResult(Errors.NOT_COORDINATOR))
        group_id = group.group_id
        self._timer.cancel_where(lambda key: key[1] == group_id)

    def _is_current(self, group: GroupMetadata) -> bool:
        return self._groups.get(group.group_id) is group

    # ------------------------------------------------------------------ loading
    def load(self, records: Iterable[tuple[bytes, bytes | None]], location: str = "__consumer_offsets") -> int:
        """Rebuild groups from ``__consumer_offsets`` records (``(key, value)`` in log order;
        offset-commit records are skipped; leave out control records). The last record of a
        group wins; a tombstone deletes it. Each group comes back as stored -- Stable with its
        generation, leader, members and assignments, or Empty -- and every member's session
        timeout starts now (Kafka's ``onLoaded``). A group over ``group.max.size`` rebalances.
        While loading, requests answer COORDINATOR_LOAD_IN_PROGRESS (SyncGroup:
        REBALANCE_IN_PROGRESS; Heartbeat: NO_ERROR), as Kafka.

        Returns:
            the number of groups loaded.

        Raises:
            CorruptObjectError, UnsupportedFormatVersionError: a group record that cannot be read
                (``location`` names where it came from).
        """
        with self._lock:
            self._loading += 1
        try:
            latest: dict[str, dict | None] = {}
            for key, value in records:
                decoded = decode_group_record(key, value, location)
                if decoded is not None:
                    latest[decoded[0]] = decoded[1]
            loaded = 0
            with self._lock:
                now = self._now()
                for group_id, value in latest.items():
                    old = self._groups.pop(group_id, None)
                    if old is not None and not old.is_in(GroupState.DEAD):
                        self._unload(old)
                    if value is None:
                        continue
                    group = GroupMetadata.from_record(group_id, value, now, self._completions)
                    self._groups[group_id] = group
                    loaded += 1
                    log.info("Loaded group %s in state %s with generation %d and %d members", group_id, group.state,
                             group.generation_id, group.size)
                    for member in group.members.values():
                        self._reschedule_heartbeat(group, member)
                    if group.size > self.config.group_max_size:
                        self._prepare_rebalance(group, f"freshly-loaded group {group_id} (size {group.size}) is "
                                                       f"over capacity {self.config.group_max_size}")
        finally:
            with self._lock:
                self._loading -= 1
        self._run_deferred()
        return loaded

    # ------------------------------------------------------------------ deferred work
    def _answer(self, future: Future, result: object) -> None:
        """Complete ``future`` once the lock is released (caller holds the lock)."""
        self._completions.append((future, result))

    def _schedule(self, key: tuple, deadline_ms: int, task: Callable[[], None]) -> None:
        self._timer.schedule(key, deadline_ms, task)
        self._wakeup.set()

    def _store(self, group_id: str, key: bytes, value: bytes | None, callback: Callable[[Errors], None]) -> None:
        """Queue a group record; ``callback(error)`` runs under the lock once it is appended."""
        with self._appends_lock:
            self._appends.append((group_id, key, value, callback))

    def _run_deferred(self) -> None:
        """After releasing the lock: complete queued futures, then write queued records one at a
        time, in order, each followed by its callback (which may queue more of both). If another
        thread is writing, it writes ours too."""
        while True:
            with self._lock:
                done = list(self._completions)
                self._completions.clear()
            for future, result in done:
                if not future.done():
                    future.set_result(result)
            with self._appends_lock:
                item = None if self._appending or not self._appends else self._appends.popleft()
                if item is not None:
                    self._appending = True
            if item is None:
                with self._lock:
                    if not self._completions:
                        return
                continue
            group_id, key, value, callback = item
            try:
                try:
                    error = self._append(group_id, key, value)
                except Exception as exc:  # the writer failed: answer, never leave a request parked
                    log.error("appending the record of group %s failed: %s", group_id, exc, exc_info=True)
                    error = Errors.UNKNOWN_SERVER_ERROR
                with self._lock:
                    callback(error)
            finally:
                with self._appends_lock:
                    self._appending = False
