"""The consumer's side of group membership (Kafka's client ``ConsumerCoordinator`` /
``AbstractCoordinator``, classic protocol).

A subscribed :class:`~txlake.Consumer` owns one of these. Membership is driven from the
consumer's own thread, as in Kafka's ``KafkaConsumer.poll``: every ``consume()``/``poll()``
first calls :meth:`ConsumerCoordinator.poll`, which (re)joins the group when needed --
JoinGroup, the leader's assignment, SyncGroup -- and runs the rebalance callbacks there.
A heartbeat thread keeps the session alive every ``heartbeat.interval.ms`` and only sets
flags: REBALANCE_IN_PROGRESS asks for a rejoin; UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION mean
the partitions are lost; and when the application has not polled for
``max.poll.interval.ms`` it leaves the group (Kafka's poll timeout), so the next poll reports
the partitions lost and rejoins.

Rebalance protocols (KIP-429): with ``range``/``roundrobin`` (EAGER) every owned partition
is revoked before the member rejoins; with ``cooperative-sticky`` (COOPERATIVE) only the
partitions that move are revoked, after the new assignment, and the member then rejoins
once more so that they can be handed to their new owner.

Callbacks are confluent-kafka's: ``on_assign(consumer, partitions)``,
``on_revoke(consumer, partitions)``, ``on_lost(consumer, partitions)`` (``on_revoke`` when
``on_lost`` is not given). If a callback does not change the assignment itself, the
consumer applies the change (``assign``/``incremental_assign``/``unassign``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import TYPE_CHECKING, Callable

from txlake.engine.errors import ApiError, Errors
from txlake.engine.group_coordinator import MemberIdentity

from .assignors import (CONSUMER_PROTOCOL_TYPE, Assignment, RebalanceProtocol, Subscription, create_assignor,
                        decode_assignment, encode_subscription, perform_assignment)
from .error import KafkaError, KafkaException, kafka_exception
from .types import TopicPartition

if TYPE_CHECKING:
    from txlake.engine.broker import Broker

    from .consumer import Consumer

log = logging.getLogger(__name__)

#: answers after which the member simply tries again (after a short backoff)
_RETRY = frozenset({Errors.REBALANCE_IN_PROGRESS, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                    Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR, Errors.REQUEST_TIMED_OUT})
RETRY_BACKOFF_S = 0.05
_NO_GENERATION = -1


class ConsumerCoordinator:
    """Group membership of one subscribed consumer.

    Args:
        consumer: the owning consumer (callbacks get it; assignments are applied to it).
        broker: the storage root's engine (the group coordinator runs in the writer).
        conf: the consumer's validated config (``group.id``, ``group.instance.id``,
            ``session.timeout.ms``, ``heartbeat.interval.ms``, ``max.poll.interval.ms``,
            ``partition.assignment.strategy``, ``enable.auto.commit``, ``auto.commit.interval.ms``).

    Raises:
        KafkaException: ``_INVALID_ARG`` for an unknown assignor or a mix of EAGER and
            COOPERATIVE assignors (librdkafka refuses it too).
    """

    def __init__(self, consumer: "Consumer", broker: "Broker", conf) -> None:
        self.consumer = consumer
        self.broker = broker
        self.group_id: str = conf["group.id"]
        self.group_instance_id: str | None = conf["group.instance.id"]
        self.client_id: str = conf["client.id"]
        self.session_timeout_ms: int = conf["session.timeout.ms"]
        self.heartbeat_interval_s: float = conf["heartbeat.interval.ms"] / 1000
        self.max_poll_interval_ms: int = conf["max.poll.interval.ms"]
        self.auto_commit: bool = conf["enable.auto.commit"]
        self.auto_commit_interval_s: float = conf["auto.commit.interval.ms"] / 1000
        names = [n.strip() for n in conf["partition.assignment.strategy"].split(",") if n.strip()]
        try:
            self.assignors = {n: create_assignor(n) for n in names}
        except ValueError as exc:
            raise kafka_exception(KafkaError._INVALID_ARG, f"partition.assignment.strategy: {exc}") from None
        protocols = {a.supported_protocols()[0] for a in self.assignors.values()}
        if not names or len(protocols) != 1:
            raise kafka_exception(KafkaError._INVALID_ARG, "partition.assignment.strategy: all assignors must use "
                                  "the same rebalance protocol (EAGER or COOPERATIVE)")
        self.protocol: RebalanceProtocol = protocols.pop()
        self.member_id = ""
        self.generation_id = _NO_GENERATION
        # (generation, member id) of the last completed join: what consumer_group_metadata() and
        # commits carry (Kafka's ``groupMetadata``, set only in ``onJoinComplete``). The live pair
        # above is reset as soon as the membership is lost; a paused member must still present
        # its old identity, so that the coordinator fences it instead of taking a -1/"" commit
        # as a standalone one (accepted while the group is Empty, and always for TxnOffsetCommit).
        self._joined_identity: tuple[int, str] = (_NO_GENERATION, "")
        self.owned: set[tuple[str, int]] = set()
        self.topics: list[str] = []
        self._joined_topics: list[str] | None = None   # what the last JoinGroup subscribed to
        self._pattern: re.Pattern | None = None
        self.on_assign: Callable | None = None
        self.on_revoke: Callable | None = None
        self.on_lost: Callable | None = None
        self._lock = threading.Lock()
        self._rejoin_needed = True
        self._stable = False            # between a completed SyncGroup and the next rejoin (heartbeats only then)
        self._lost = False              # set by the heartbeat thread: the owned partitions are gone
        self._fatal: KafkaError | None = None
        self._last_poll = time.monotonic()
        self._last_auto_commit = time.monotonic()
        self._closed = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # ------------------------------------------------------------------ API for the consumer
    def subscribe(self, topics: list[str], on_assign=None, on_revoke=None, on_lost=None) -> None:
        """Set the subscription (names, or regexes starting with ``^`` as in librdkafka); the
        next poll joins (or rejoins) the group."""
        with self._lock:
            self.topics = [t for t in topics if not t.startswith("^")]
            patterns = [t for t in topics if t.startswith("^")]
            self._pattern = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
            self.on_assign, self.on_revoke, self.on_lost = on_assign, on_revoke, on_lost
            self._rejoin_needed = True
        if self._heartbeat is None:
            self._heartbeat = threading.Thread(target=self._heartbeat_loop, name=f"txlake-heartbeat-{self.group_id}",
                                               daemon=True)
            self._heartbeat.start()

    def group_metadata(self) -> tuple[str, int, str, str | None]:
        """``(group id, generation id, member id, group instance id)`` of the last completed join,
        for send_offsets_to_transaction (kept after the membership is lost, so a zombie is fenced)."""
        with self._lock:
            return self.group_id, *self._joined_identity, self.group_instance_id

    def poll(self) -> None:
        """Called at every consumer poll: report lost partitions, rejoin if needed, auto-commit.

        Raises:
            KafkaException: FENCED_INSTANCE_ID (fatal: another consumer has this
                ``group.instance.id``), or an unexpected JoinGroup/SyncGroup error.
        """
        self._last_poll = time.monotonic()
        if self._fatal is not None:
            raise KafkaException(self._fatal)
        with self._lock:
            lost, self._lost = self._lost, False
            rejoin = self._rejoin_needed or self._subscription_changed()
        if lost:
            self._lose_partitions()
        if rejoin:
            self._rebalance()
            self._last_poll = time.monotonic()   # time spent rebalancing inside poll is not "not polling"
        elif self.auto_commit and time.monotonic() - self._last_auto_commit >= self.auto_commit_interval_s:
            self._auto_commit(wait=False)

    def commit_identity(self) -> tuple[int, str, str | None]:
        """``(generation, member id, group instance id)`` of the last completed join, for an OffsetCommit."""
        with self._lock:
            return *self._joined_identity, self.group_instance_id

    def close(self) -> None:
        """Leave the group (Kafka's ``maybeLeaveGroup``): auto-commit, revoke the partitions,
        then LeaveGroup -- not for a static member, whose partitions wait for it to return
        until its session times out (KIP-345)."""
        if self._closed.is_set():
            return
        try:
            if self.owned and self.generation_id >= 0:
                if self.auto_commit:
                    self._auto_commit(wait=True)
                self._revoke(sorted(self.owned))
            if self.member_id and self.group_instance_id is None:
                self._leave("the consumer is being closed")
        finally:
            self._closed.set()
            if self._heartbeat is not None:
                self._heartbeat.join(timeout=5)

    # ------------------------------------------------------------------ rebalancing
    def _coordinator(self):
        return self.broker.group_coordinator()

    def _subscribed_topics(self) -> list[str]:
        topics = set(self.topics)
        if self._pattern is not None:
            topics |= {t for t in self.broker.topics() if not t.startswith("__") and self._pattern.fullmatch(t)}
        return sorted(topics)

    def _subscription_changed(self) -> bool:
        """A pattern subscription matches a topic created since the last join (metadata refresh)."""
        return self._pattern is not None and self.generation_id >= 0 and \
            self._subscribed_topics() != self._joined_topics

    def _rebalance(self) -> None:
        """Join and sync until the member has an assignment of a generation (Kafka's
        ``ensureActiveGroup``), running the callbacks on the way."""
        if self.auto_commit and self.owned and self.generation_id >= 0:
            self._auto_commit(wait=True)   # Kafka's onJoinPrepare: commit before rejoining
        if self.protocol is RebalanceProtocol.EAGER and self.owned:
            self._revoke(sorted(self.owned))
        while not self._closed.is_set():
            with self._lock:
                self._rejoin_needed = False
                self._stable = False
            assignment = self._join_and_sync()
            if assignment is None:
                if self._fatal is not None:
                    raise KafkaException(self._fatal)
                time.sleep(RETRY_BACKOFF_S)
                continue
            self._on_join_complete(assignment)
            with self._lock:
                if not self._rejoin_needed:
                    return

    def _join_and_sync(self) -> Assignment | None:
        """One JoinGroup + SyncGroup round; None when it must be retried (member state updated)."""
        self.broker.refresh()
        topics = self._subscribed_topics()
        self._joined_topics = topics
        owned = sorted(self.owned) if self.protocol is RebalanceProtocol.COOPERATIVE else []
        protocols = []
        for name, assignor in self.assignors.items():
            sub = Subscription(tuple(topics), assignor.subscription_user_data(topics), tuple(owned),
                               self.generation_id)
            protocols.append((name, encode_subscription(sub)))
        wait = (self.max_poll_interval_ms + self.session_timeout_ms) / 1000 + 5
        try:
            joined = self._coordinator().handle_join_group(
                self.group_id, self.member_id, CONSUMER_PROTOCOL_TYPE, protocols, self.session_timeout_ms,
                self.max_poll_interval_ms, group_instance_id=self.group_instance_id, client_id=self.client_id,
                reason="rebalance").result(timeout=wait)
        except ApiError as exc:
            return self._join_error(exc.error, "")
        if joined.error != Errors.NO_ERROR:
            return self._join_error(joined.error, joined.member_id)
        with self._lock:
            self.member_id, self.generation_id = joined.member_id, joined.generation_id
        assignments = None
        if joined.leader_id == joined.member_id and not joined.skip_assignment:
            counts = {t: len(meta.partitions) for t, meta in self.broker.topics().items()}
            assignments = perform_assignment(self.assignors[joined.protocol_name], joined.members, counts, self.protocol)
        synced = self._coordinator().handle_sync_group(
            self.group_id, joined.generation_id, joined.member_id, assignments, group_instance_id=self.group_instance_id,
            protocol_type=CONSUMER_PROTOCOL_TYPE, protocol_name=joined.protocol_name).result(timeout=wait)
        if synced.error != Errors.NO_ERROR:
            return self._join_error(synced.error, self.member_id)
        assignment = decode_assignment(synced.assignment)
        self.assignors[joined.protocol_name].on_assignment(assignment, joined.generation_id)
        with self._lock:
            self._stable = True
            self._joined_identity = (joined.generation_id, joined.member_id)
        return assignment

    def _join_error(self, error: Errors, member_id: str) -> None:
        """Kafka's JoinGroup/SyncGroup response handling: update the member state for a retry."""
        lost = False
        with self._lock:
            if error == Errors.MEMBER_ID_REQUIRED:
                self.member_id = member_id            # KIP-394: join again with the id we were given
            elif error in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION):
                if error == Errors.UNKNOWN_MEMBER_ID:
                    self.member_id = ""
                self.generation_id = _NO_GENERATION
                lost = bool(self.owned)
            elif error == Errors.FENCED_INSTANCE_ID:
                self._fatal = KafkaError(error, f"group.instance.id {self.group_instance_id} of group {self.group_id} "
                                                "is used by a newer consumer", fatal=True)
            elif error not in _RETRY:
                self._fatal = KafkaError(error, f"joining group {self.group_id} failed: {error.name}")
        if lost:
            self._lose_partitions()
        return None

    def _on_join_complete(self, assignment: Assignment) -> None:
        """Apply the new assignment and run the callbacks (Kafka's ``onJoinComplete``)."""
        new = set(assignment.partitions)
        if self.protocol is RebalanceProtocol.COOPERATIVE:
            revoked = self.owned - new
            added = new - self.owned
            if revoked:
                self._revoke(sorted(revoked))
                with self._lock:
                    self._rejoin_needed = True   # the revoked partitions go to their new owner next round
            self._assign(sorted(added), incremental=True)
        else:
            self._assign(sorted(new), incremental=False)

    def _assign(self, partitions: list[tuple[str, int]], incremental: bool) -> None:
        tps = [TopicPartition(t, p) for t, p in partitions]
        before = self.consumer._assignment_version
        if self.on_assign is not None:
            self.on_assign(self.consumer, tps)
        if self.consumer._assignment_version == before:  # the callback did not assign: do it for it
            if incremental:
                self.consumer.incremental_assign(tps)
            else:
                self.consumer.assign(tps)
        self.owned |= set(partitions)

    def _revoke(self, partitions: list[tuple[str, int]]) -> None:
        self._give_up(partitions, self.on_revoke)

    def _lose_partitions(self) -> None:
        """The partitions were taken away without a revocation (session or poll timeout,
        fenced generation): ``on_lost`` -- they may already belong to another member."""
        self._give_up(sorted(self.owned), self.on_lost or self.on_revoke)

    def _give_up(self, partitions: list[tuple[str, int]], callback: Callable | None) -> None:
        tps = [TopicPartition(t, p) for t, p in partitions]
        before = self.consumer._assignment_version
        if callback is not None:
            callback(self.consumer, tps)
        if self.consumer._assignment_version == before:
            self.consumer.incremental_unassign(tps)
        self.owned -= set(partitions)

    def _auto_commit(self, wait: bool) -> None:
        """``enable.auto.commit``: every ``auto.commit.interval.ms`` from poll without waiting
        (Kafka's ``maybeAutoCommitOffsetsAsync``), and waiting before a rebalance or close
        (``maybeAutoCommitOffsetsSync``). Results go to ``on_commit``."""
        self._last_auto_commit = time.monotonic()
        self.consumer._auto_commit(wait)

    def _leave(self, reason: str) -> None:
        with self._lock:
            member, instance = self.member_id, self.group_instance_id
            self.member_id, self.generation_id = "", _NO_GENERATION
            self._stable = False
        try:
            self._coordinator().handle_leave_group(self.group_id, [MemberIdentity(member, instance, reason)])
        except ApiError as exc:
            log.info("LeaveGroup of %s failed: %s", member, exc.error.name)

    # ------------------------------------------------------------------ heartbeat thread
    def _heartbeat_loop(self) -> None:
        """Kafka's ``HeartbeatThread``: heartbeats, and the poll-interval check."""
        while not self._closed.wait(self.heartbeat_interval_s):
            with self._lock:
                member, generation = self.member_id, self.generation_id
                if not self._stable or not member or generation < 0:
                    continue   # Kafka's heartbeat thread is idle while the member (re)joins
            if (time.monotonic() - self._last_poll) * 1000 > self.max_poll_interval_ms:
                log.warning("consumer of group %s did not poll for max.poll.interval.ms=%d: leaving the group",
                            self.group_id, self.max_poll_interval_ms)
                with self._lock:
                    self._lost = bool(self.owned)
                    self._rejoin_needed = True
                if self.group_instance_id is None:
                    self._leave("consumer poll timeout has expired")
                continue
            try:
                error = self._coordinator().handle_heartbeat(self.group_id, generation, member, self.group_instance_id)
            except ApiError as exc:
                error = exc.error
            with self._lock:
                if not self._stable or (self.member_id, self.generation_id) != (member, generation):
                    continue   # the member is rejoining, or rejoined: the answer is about an old generation
                if error == Errors.REBALANCE_IN_PROGRESS:
                    self._rejoin_needed = True
                elif error in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION):
                    if error == Errors.UNKNOWN_MEMBER_ID:
                        self.member_id = ""
                    self.generation_id = _NO_GENERATION
                    self._lost = bool(self.owned)
                    self._rejoin_needed = True
                elif error == Errors.FENCED_INSTANCE_ID:
                    self._fatal = KafkaError(error, f"group.instance.id {self.group_instance_id} of group "
                                                    f"{self.group_id} is used by a newer consumer", fatal=True)
