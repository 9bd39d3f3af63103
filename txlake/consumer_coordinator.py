"""The consumer's side of group membership (Kafka's client ``ConsumerCoordinator`` /
``AbstractCoordinator``, classic protocol), run as librdkafka runs its ``rd_kafka_cgrp_t``.

**Two threads.** A subscribed :class:`~txlake.Consumer` owns one :class:`ConsumerCoordinator`,
which runs the group protocol on a background thread of its own (``txlake-cgrp-<group>``),
like librdkafka's main thread serving the cgrp state machine: JoinGroup (KIP-394: the first
answer is MEMBER_ID_REQUIRED with an id), the leader's assignment, SyncGroup, a Heartbeat
every ``heartbeat.interval.ms``, the ``max.poll.interval.ms`` check, the retries. That thread
never waits for the group: JoinGroup and SyncGroup are the group coordinator's delayed
answers (Futures, Kafka's parked requests) whose completion wakes it, so a join parked until
the other members rejoin blocks neither the application nor the engine, and ``close()``
stops the thread at once.

**One request surface.** The member speaks Kafka's group protocol to the engine's request
surface (``engine/apis``, :func:`~txlake.engine.apis.local_apis`), the handlers ``txlake serve``
answers network consumers with: JoinGroup v9, SyncGroup v5, Heartbeat v4, LeaveGroup v5, and
Metadata for the subscribed topics and the leader's partition counts. JoinGroup and SyncGroup
go through :meth:`KafkaApis.submit <txlake.engine.apis.KafkaApis.submit>`, which hands back the
Future of the response without waiting. There is no FindCoordinator: in-process the engine's
one node is the coordinator of every group.

The application's thread sees the group only through the *rebalance ops* the background
thread queues (librdkafka's rebalance op queue), served by :meth:`ConsumerCoordinator.poll`
-- which every ``Consumer.poll()``/``consume()`` calls -- and by :meth:`ConsumerCoordinator.close`.
The callbacks are confluent-kafka's: ``on_assign(consumer, partitions)``,
``on_revoke(consumer, partitions)``, ``on_lost(consumer, partitions)`` (``on_revoke`` when
``on_lost`` is not given). They run only there, in the application's thread; the assignment
changes only when an op is served: if the callback does not change the assignment itself,
the consumer applies the change (``assign``/``incremental_assign``/``unassign``), so
``Consumer.assignment()`` is always what was applied. The background thread goes on with the
protocol only once the ops it queued were served (a revocation must be done before the
member rejoins), and keeps heartbeating meanwhile.

Rebalance protocols (KIP-429): with ``range``/``roundrobin`` (EAGER) every owned partition
is revoked (an op the application serves) before the member rejoins; with
``cooperative-sticky`` (COOPERATIVE) the member rejoins at once keeping its partitions, only
those that move are revoked, after the new assignment, and the member then rejoins once more
so that they can be handed to their new owner. With ``enable.auto.commit`` the positions are
committed before a revocation (not before a loss), as librdkafka commits what it unassigns.

Losing the membership: a Heartbeat answered UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION means the
partitions are lost (an ``on_lost`` op); a member that does not poll for
``max.poll.interval.ms`` leaves the group (LeaveGroup, not for a static member), its next poll
returns a ``_MAX_POLL_EXCEEDED`` error event, the poll after it serves the loss, and it rejoins
only once the application polls again (librdkafka's ``rd_kafka_cgrp_max_poll_interval_check_tmr_cb``).
``consumer_group_metadata()`` and commits carry the identity of the last completed join
(SyncGroup), kept after the membership is lost so that a zombie is fenced.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from kafka.protocol.consumer.group import HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest

from txlake.engine.apis import local_apis
from txlake.engine.errors import Errors

from .admin import cluster_metadata
from .assignors import (CONSUMER_PROTOCOL_TYPE, RebalanceProtocol, Subscription, create_assignor, decode_assignment,
                        encode_subscription, perform_assignment)
from .error import KafkaError, KafkaException, kafka_exception
from .types import OFFSET_INVALID, Message, TopicPartition

if TYPE_CHECKING:
    from txlake.engine.broker import Broker

    from .consumer import Consumer

log = logging.getLogger(__name__)

#: answers after which the member simply tries again (after a short backoff)
_RETRY = frozenset({Errors.REBALANCE_IN_PROGRESS, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                    Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR, Errors.REQUEST_TIMED_OUT})
RETRY_BACKOFF_S = 0.05
#: how long the background thread waits before trying again after an unexpected failure (s)
FAILURE_BACKOFF_S = 1.0
#: the background thread looks at its state at least this often (s)
MAX_IDLE_S = 1.0
#: how long close() waits for the background thread to finish the step it is in (s); its steps
#: never wait for the group, so this bounds only a stalled engine call
CLOSE_JOIN_TIMEOUT_S = 10.0
_NO_GENERATION = -1
#: the request versions sent (the newest the engine answers: KIP-394 member ids, KIP-345 static
#: members, KIP-800 reasons, KIP-814 skip_assignment)
_JoinGroup, _SyncGroup, _Heartbeat, _LeaveGroup = JoinGroupRequest[9], SyncGroupRequest[5], HeartbeatRequest[4], \
    LeaveGroupRequest[5]

Partitions = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class _RebalanceOp:
    """What the background thread hands the application's thread (librdkafka's rebalance op).

    ``kind``: ``"assign"`` (``partitions``, ``incremental``), ``"revoke"`` (``partitions``, or
    None for everything owned when it is served), ``"lost"`` (everything owned when served), or
    ``"error"`` (``error``, returned by poll as an error event).
    """

    kind: str
    partitions: Partitions | None = None
    incremental: bool = False
    error: KafkaError | None = None


class ConsumerCoordinator:
    """Group membership of one subscribed consumer, run by a background thread.

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
        self._apis = local_apis(broker)
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
        # Everything below is guarded by _cond (its lock is re-entrant).
        self._cond = threading.Condition()
        self.member_id = ""
        self.generation_id = _NO_GENERATION
        # (generation, member id) of the last completed join: what consumer_group_metadata() and
        # commits carry (Kafka's ``groupMetadata``, set only in ``onJoinComplete``). The live pair
        # above is reset as soon as the membership is lost; a paused member must still present
        # its old identity, so that the coordinator fences it instead of taking a -1/"" commit
        # as a standalone one (accepted while the group is Empty, and always for TxnOffsetCommit).
        self._joined_identity: tuple[int, str] = (_NO_GENERATION, "")
        #: the partitions the application's thread applied (changed only by serving ops)
        self.owned: set[tuple[str, int]] = set()
        self.topics: list[str] = []
        self._joined_topics: list[str] | None = None   # what the last JoinGroup subscribed to
        self._pattern: re.Pattern | None = None
        self.on_assign: Callable | None = None
        self.on_revoke: Callable | None = None
        self.on_lost: Callable | None = None
        self._ops: deque[_RebalanceOp] = deque()
        self._serving = 0                 # ops taken by the application's thread and not done yet
        self._request: Future | None = None   # the JoinGroup or SyncGroup awaiting its answer
        self._request_kind = ""           # "join" or "sync"
        self._joined = None               # the JoinGroup response the SyncGroup belongs to
        self._answering = False           # the group thread is handling a JoinGroup or SyncGroup answer
        self._rejoin_needed = True
        self._stable = False              # between a completed SyncGroup and the next rejoin (heartbeats only then)
        self._max_poll_exceeded = False   # left for max.poll.interval.ms: no rejoin until the application polls
        self._fatal: KafkaError | None = None
        self._last_poll = time.monotonic()
        self._last_auto_commit = time.monotonic()
        self._next_heartbeat = 0.0
        self._join_not_before = 0.0
        self._wait_s: float | None = MAX_IDLE_S
        self._terminate = False
        self._closed = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ API for the consumer
    def subscribe(self, topics: list[str], on_assign=None, on_revoke=None, on_lost=None) -> None:
        """Set the subscription (names, or regexes starting with ``^`` as in librdkafka); the
        background thread joins (or rejoins) the group at once."""
        with self._cond:
            self.topics = [t for t in topics if not t.startswith("^")]
            patterns = [t for t in topics if t.startswith("^")]
            self._pattern = re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None
            self.on_assign, self.on_revoke, self.on_lost = on_assign, on_revoke, on_lost
            self._rejoin_needed = True
            self._cond.notify_all()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"txlake-cgrp-{self.group_id}", daemon=True)
                self._thread.start()

    def group_metadata(self) -> tuple[str, int, str, str | None]:
        """``(group id, generation id, member id, group instance id)`` of the last completed join,
        for send_offsets_to_transaction (kept after the membership is lost, so a zombie is fenced)."""
        with self._cond:
            return self.group_id, *self._joined_identity, self.group_instance_id

    def commit_identity(self) -> tuple[int, str, str | None]:
        """``(generation, member id, group instance id)`` of the last completed join, for an OffsetCommit."""
        with self._cond:
            return *self._joined_identity, self.group_instance_id

    def poll(self) -> None:
        """Called by every consumer poll, in the application's thread: note the poll (for
        ``max.poll.interval.ms``), serve the queued rebalance ops -- callbacks, assignment
        changes -- up to the first error event, which :meth:`events` hands to the application
        (the ops queued after it are served by the next poll: librdkafka returns it first too),
        and auto-commit every ``auto.commit.interval.ms``.

        Raises:
            KafkaException: FENCED_INSTANCE_ID (fatal: another consumer has this
                ``group.instance.id``); whatever a callback raised. (Another JoinGroup error,
                e.g. INVALID_SESSION_TIMEOUT, is an error event returned by poll(), as librdkafka's.)
        """
        with self._cond:
            self._last_poll = time.monotonic()
            if self._max_poll_exceeded:
                self._cond.notify_all()     # the member may rejoin now
            fatal = self._fatal
        if fatal is not None:
            raise KafkaException(fatal)
        if self._serve_ops():
            return
        with self._cond:
            due = (self.auto_commit and self._stable and not self._rejoin_needed and not self._ops
                   and time.monotonic() - self._last_auto_commit >= self.auto_commit_interval_s)
        if due:
            self._auto_commit(wait=False)

    def events(self, limit: int) -> list[Message]:
        """Up to ``limit`` error events waiting at the head of the op queue (``_MAX_POLL_EXCEEDED``),
        as messages whose ``error()`` is set, for the consumer's poll to return."""
        out: list[Message] = []
        with self._cond:
            while len(out) < limit and self._ops and self._ops[0].kind == "error":
                out.append(Message(error=self._ops.popleft().error, offset=OFFSET_INVALID))
            if out:
                self._cond.notify_all()
        return out

    def close(self) -> None:
        """Leave the group (librdkafka's consumer close, Kafka's ``maybeLeaveGroup``), in the
        caller's thread: complete a join the coordinator already answered (its SyncGroup, for at
        most the session timeout and 10 s), stop the background thread, serve the revocations and
        losses still queued (assignments never applied are dropped), auto-commit, revoke what is
        owned (``on_revoke``), then LeaveGroup -- not for a static member, whose partitions wait
        for it to return until its session times out (KIP-345). A JoinGroup still parked at the
        coordinator (the other members have not rejoined) is not waited for: the LeaveGroup
        answers it. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True          # the group thread starts nothing new, it only reads answers
            self._cond.notify_all()
            thread = self._thread
            # A join the coordinator answered (a SyncGroup in flight, or a JoinGroup answer not read
            # yet) moved the group to a new generation that waits for this member's SyncGroup: a
            # commit with the last completed generation would be refused (ILLEGAL_GENERATION, or
            # REBALANCE_IN_PROGRESS while the group completes the rebalance), and the positions
            # read since would be read again. The group thread completes that join first, bounded
            # by the session timeout; the commit then carries the new generation. A JoinGroup still
            # parked leaves the group preparing the rebalance, where the last generation's commit is
            # accepted (Kafka's GroupCoordinator.handleCommitOffsets), and the LeaveGroup answers it.
            deadline = time.monotonic() + min(CLOSE_JOIN_TIMEOUT_S, self.session_timeout_ms / 1000)
            while (thread is not None and thread.is_alive() and time.monotonic() < deadline
                   and (self._answering or (self._request is not None
                                            and (self._request_kind == "sync" or self._request.done())))):
                self._cond.wait(0.01)
            self._terminate = True
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_JOIN_TIMEOUT_S)
            if thread.is_alive():
                log.warning("the group thread of a consumer of group %s did not stop within %.0f s",
                            self.group_id, CLOSE_JOIN_TIMEOUT_S)
        with self._cond:
            pending = [op for op in self._ops if op.kind in ("revoke", "lost")]
            self._ops.clear()
            request, self._request = self._request, None
            if request is not None and request.done() and self._request_kind == "join":
                answer = request.result()
                if answer.error_code in (Errors.NO_ERROR, Errors.MEMBER_ID_REQUIRED) and answer.member_id:
                    self.member_id = answer.member_id    # answered, not read yet: leave with that id
        for op in pending:
            self._apply(op)
        with self._cond:
            owned = sorted(self.owned)
            in_generation = self.generation_id >= 0
            member = self.member_id
            self.member_id, self.generation_id, self._stable = "", _NO_GENERATION, False
        if owned:
            if self.auto_commit and in_generation:
                self._auto_commit(wait=True)
            self._give_up(owned, self.on_revoke)
        if member and self.group_instance_id is None:
            self._leave(member, "the consumer is being closed")

    # ------------------------------------------------------------------ the application's side
    def _serve_ops(self) -> bool:
        """Serve the queued ops in order, up to an error event or the end. True if anything is
        left (an error event) or was served: no auto-commit in that poll (the assignment changed,
        the new partitions have not been read yet)."""
        served = False
        while True:
            with self._cond:
                if not self._ops or self._ops[0].kind == "error":
                    return served or bool(self._ops)
                op = self._ops.popleft()
                self._serving += 1
            try:
                served = True
                self._apply(op)
            finally:
                with self._cond:
                    self._serving -= 1
                    self._cond.notify_all()

    def _apply(self, op: _RebalanceOp) -> None:
        """Run one op's callback and apply its assignment change (application's thread)."""
        if op.kind == "assign":
            self._assign(list(op.partitions or ()), op.incremental)
        elif op.kind == "revoke":
            with self._cond:
                partitions = sorted(self.owned if op.partitions is None else set(op.partitions) & self.owned)
                in_generation = self.generation_id >= 0
            if partitions:
                if self.auto_commit and in_generation:
                    self._auto_commit(wait=True)   # Kafka's onJoinPrepare / librdkafka's commit on unassign
                self._give_up(partitions, self.on_revoke)
        elif op.kind == "lost":
            with self._cond:
                partitions = sorted(self.owned)
            if partitions:
                self._give_up(partitions, self.on_lost or self.on_revoke)

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
        with self._cond:
            if not incremental:
                self.owned.clear()
            self.owned |= set(partitions)

    def _give_up(self, partitions: list[tuple[str, int]], callback: Callable | None) -> None:
        tps = [TopicPartition(t, p) for t, p in partitions]
        before = self.consumer._assignment_version
        if callback is not None:
            callback(self.consumer, tps)
        if self.consumer._assignment_version == before:
            self.consumer.incremental_unassign(tps)
        with self._cond:
            self.owned -= set(partitions)

    def _auto_commit(self, wait: bool) -> None:
        """``enable.auto.commit``: every ``auto.commit.interval.ms`` from poll without waiting
        (Kafka's ``maybeAutoCommitOffsetsAsync``), and waiting before a revocation or close
        (``maybeAutoCommitOffsetsSync``). Results go to ``on_commit``."""
        with self._cond:
            self._last_auto_commit = time.monotonic()
        self.consumer._auto_commit(wait)

    # ------------------------------------------------------------------ the background thread
    def _run(self) -> None:
        """The group thread: pick the next step under the lock, run it outside the lock."""
        while True:
            with self._cond:
                step = self._next_step()
                while step is None:
                    if self._terminate:
                        return
                    self._cond.wait(self._wait_s)
                    step = self._next_step()
            try:
                step()
            except Exception as exc:  # the thread must survive: back off and rejoin
                log.error("group %s: %s failed: %s", self.group_id, getattr(step, "__name__", step), exc,
                          exc_info=True)
                with self._cond:
                    if self._request is None and not self._stable:
                        self._rejoin_needed = True
                    self._join_not_before = time.monotonic() + FAILURE_BACKOFF_S
            finally:
                with self._cond:
                    self._answering = False

    def _next_step(self) -> Callable[[], None] | None:
        """What the group thread does next (lock held), or None after setting ``_wait_s``."""
        self._wait_s = MAX_IDLE_S
        if self._terminate:
            return None
        if self._fatal is not None:
            self._wait_s = None         # nothing more to do until close()
            return None
        now = time.monotonic()
        waits = [MAX_IDLE_S]
        if self._request is not None and self._request.done():
            self._answering = True      # until the handler returned (it clears _request first)
            return self._on_sync_answer if self._request_kind == "sync" else self._on_join_answer
        if self._closed:
            return None                 # close() waits for the answers of a join in flight, nothing more
        if self._stable:
            poll_deadline = self._last_poll + self.max_poll_interval_ms / 1000
            if now > poll_deadline:
                return self._leave_on_max_poll
            if now >= self._next_heartbeat:
                return self._heartbeat
            waits += [self._next_heartbeat - now, poll_deadline - now]
        if self._max_poll_exceeded and (now - self._last_poll) * 1000 <= self.max_poll_interval_ms:
            self._max_poll_exceeded = False     # the application polled: the member may rejoin
        if (self._request is None and not self._max_poll_exceeded and not self._ops and not self._serving
                and (self._rejoin_needed or not self._stable)):
            if now >= self._join_not_before:
                return self._join
            waits.append(self._join_not_before - now)
        self._wait_s = max(0.0, min(waits))
        return None

    def _wake(self, _future: Future | None = None) -> None:
        with self._cond:
            self._cond.notify_all()

    def _post(self, op: _RebalanceOp) -> None:
        """Queue an op for the application's thread (lock held)."""
        self._ops.append(op)

    def _lose(self) -> None:
        """The membership is gone (lock held): drop the assignment changes not served yet and
        queue the loss of everything owned (``on_lost``; they may already belong to another member)."""
        self._ops = deque(op for op in self._ops if op.kind == "error")
        self._post(_RebalanceOp("lost"))

    def _subscribed_topics(self, existing: Iterable[str] | None = None) -> list[str]:
        """The topic names subscribed, with those a pattern matches among ``existing`` (default:
        the topics a Metadata request names now; none is asked for without a pattern)."""
        topics = set(self.topics)
        if self._pattern is not None:
            if existing is None:
                existing = cluster_metadata(self.broker).topics
            topics |= {t for t in existing if not t.startswith("__") and self._pattern.fullmatch(t)}
        return sorted(topics)

    def _join(self) -> None:
        """Start a join (Kafka's ``ensureActiveGroup`` / librdkafka's ``rd_kafka_cgrp_join``).
        EAGER: revoke everything owned first (an op; the join follows once it was served)."""
        with self._cond:
            if self.protocol is RebalanceProtocol.EAGER and self.owned:
                self._post(_RebalanceOp("revoke"))
                return
            owned = sorted(self.owned) if self.protocol is RebalanceProtocol.COOPERATIVE else []
            member_id, generation = self.member_id, self.generation_id
            self._rejoin_needed = False
            self._stable = False
        topics = self._subscribed_topics(cluster_metadata(self.broker).topics)   # as of the newest catalog commit
        protocols = []
        for name, assignor in self.assignors.items():
            sub = Subscription(tuple(topics), assignor.subscription_user_data(topics), tuple(owned), generation)
            protocols.append(_JoinGroup.JoinGroupRequestProtocol(name=name, metadata=encode_subscription(sub)))
        future = self._apis.submit(_JoinGroup(
            group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.max_poll_interval_ms, member_id=member_id,
            group_instance_id=self.group_instance_id, protocol_type=CONSUMER_PROTOCOL_TYPE, protocols=protocols,
            reason="rebalance"), self.client_id)
        with self._cond:
            self._joined_topics = topics
            self._request, self._request_kind = future, "join"
        future.add_done_callback(self._wake)

    def _on_join_answer(self) -> None:
        """The JoinGroup answer: the leader runs the assignor; then SyncGroup."""
        with self._cond:
            joined = self._request.result()   # a JoinGroupResponse
            self._request = None
        if joined.error_code != Errors.NO_ERROR:
            self._join_error(Errors(joined.error_code), joined.member_id, "JoinGroup")
            return
        with self._cond:
            self.member_id, self.generation_id = joined.member_id, joined.generation_id
        assignments = []
        if joined.leader == joined.member_id and not joined.skip_assignment:
            counts = {t: len(meta.partitions) for t, meta in cluster_metadata(self.broker).topics.items()}
            assigned = perform_assignment(self.assignors[joined.protocol_name], joined.members, counts, self.protocol)
            assignments = [_SyncGroup.SyncGroupRequestAssignment(member_id=m, assignment=a)
                           for m, a in assigned.items()]
        future = self._apis.submit(_SyncGroup(
            group_id=self.group_id, generation_id=joined.generation_id, member_id=joined.member_id,
            group_instance_id=self.group_instance_id, protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocol_name=joined.protocol_name, assignments=assignments), self.client_id)
        with self._cond:
            self._request, self._request_kind, self._joined = future, "sync", joined
        future.add_done_callback(self._wake)

    def _on_sync_answer(self) -> None:
        """The SyncGroup answer: the join is complete (Kafka's ``onJoinComplete``); queue the
        assignment change for the application."""
        with self._cond:
            synced = self._request.result()   # a SyncGroupResponse
            joined = self._joined
            self._request = self._joined = None
            member_id = self.member_id
        if synced.error_code != Errors.NO_ERROR:
            self._join_error(Errors(synced.error_code), member_id, "SyncGroup")
            return
        assignment = decode_assignment(synced.assignment)
        self.assignors[joined.protocol_name].on_assignment(assignment, joined.generation_id)
        new = set(assignment.partitions)
        with self._cond:
            self._stable = True
            self._joined_identity = (joined.generation_id, joined.member_id)
            self._next_heartbeat = time.monotonic() + self.heartbeat_interval_s
            if self.protocol is RebalanceProtocol.COOPERATIVE:
                revoked, added = self.owned - new, new - self.owned
                if revoked:
                    self._post(_RebalanceOp("revoke", tuple(sorted(revoked))))
                    self._rejoin_needed = True   # the revoked partitions go to their new owner next round
                self._post(_RebalanceOp("assign", tuple(sorted(added)), incremental=True))
            else:
                self._post(_RebalanceOp("assign", tuple(sorted(new))))

    def _join_error(self, error: Errors, member_id: str, api: str) -> None:
        """Kafka's JoinGroup/SyncGroup (``api``) response handling: update the member state for a
        retry; FENCED_INSTANCE_ID is fatal, any other unexpected error an error event (JoinGroup)."""
        with self._cond:
            self._rejoin_needed = True
            self._stable = False
            backoff = RETRY_BACKOFF_S
            if error == Errors.MEMBER_ID_REQUIRED:
                self.member_id = member_id            # KIP-394: join again with the id we were given
                backoff = 0.0
            elif error in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION):
                if error == Errors.UNKNOWN_MEMBER_ID:
                    self.member_id = ""
                self.generation_id = _NO_GENERATION
                if self.owned:
                    self._lose()
                backoff = 0.0
            elif error == Errors.FENCED_INSTANCE_ID:
                self._fatal = KafkaError(error, f"group.instance.id {self.group_instance_id} of group {self.group_id} "
                                                "is used by a newer consumer", fatal=True)
            elif error not in _RETRY:
                # librdkafka (rd_kafka_cgrp_handle_JoinGroup): a permanent JoinGroup error is an
                # error event for poll() and the join is tried again after its 1 s join interval;
                # a SyncGroup error only rejoins
                backoff = FAILURE_BACKOFF_S
                if api == "JoinGroup":
                    self._ops.append(_RebalanceOp("error", error=KafkaError(
                        error, f"JoinGroup failed: {KafkaError(error).str()}")))
                log.info("group %s: %s failed: %s; joining again in %.0f s", self.group_id, api, error.name, backoff)
            self._join_not_before = time.monotonic() + backoff

    def _heartbeat(self) -> None:
        """Kafka's Heartbeat: REBALANCE_IN_PROGRESS asks for a rejoin; UNKNOWN_MEMBER_ID /
        ILLEGAL_GENERATION mean the partitions are lost; FENCED_INSTANCE_ID is fatal. A pattern
        subscription that matches a topic created since the join rejoins too."""
        with self._cond:
            member, generation = self.member_id, self.generation_id
            self._next_heartbeat = time.monotonic() + self.heartbeat_interval_s
        answer = self._apis.call(_Heartbeat(group_id=self.group_id, generation_id=generation, member_id=member,
                                            group_instance_id=self.group_instance_id), client_id=self.client_id)
        error = Errors(answer.error_code)
        with self._cond:
            if not self._stable or (self.member_id, self.generation_id) != (member, generation):
                return   # the member is rejoining, or rejoined: the answer is about an old generation
            if error == Errors.REBALANCE_IN_PROGRESS:
                self._rejoin_needed = True
            elif error in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION):
                log.info("group %s: heartbeat of member %s answered %s: the partitions are lost", self.group_id,
                         member, error.name)
                if error == Errors.UNKNOWN_MEMBER_ID:
                    self.member_id = ""
                self.generation_id = _NO_GENERATION
                self._stable = False
                self._rejoin_needed = True
                self._lose()
            elif error == Errors.FENCED_INSTANCE_ID:
                self._fatal = KafkaError(error, f"group.instance.id {self.group_instance_id} of group "
                                                f"{self.group_id} is used by a newer consumer", fatal=True)
            pattern, joined_topics = self._pattern, self._joined_topics
        if pattern is not None and self._subscribed_topics() != joined_topics:
            with self._cond:
                self._rejoin_needed = True   # a new topic matches the pattern (metadata refresh)

    def _leave_on_max_poll(self) -> None:
        """The application did not poll for ``max.poll.interval.ms``: leave the group (LeaveGroup,
        not for a static member, KIP-345), queue a ``_MAX_POLL_EXCEEDED`` error event and the loss
        of the partitions; rejoin only once the application polls again (librdkafka)."""
        with self._cond:
            exceeded_ms = int((time.monotonic() - self._last_poll) * 1000) - self.max_poll_interval_ms
            member = self.member_id
            self._max_poll_exceeded = True
            self.member_id, self.generation_id = "", _NO_GENERATION   # leaving invalidates the member id
            self._stable = False
            self._rejoin_needed = True
            self._lose()
            self._ops.appendleft(_RebalanceOp("error", error=KafkaError(
                KafkaError._MAX_POLL_EXCEEDED, f"Application maximum poll interval ({self.max_poll_interval_ms}ms) "
                                               f"exceeded by {exceeded_ms}ms")))
        log.warning("consumer of group %s did not poll for max.poll.interval.ms=%d (exceeded by %d ms): leaving the "
                    "group", self.group_id, self.max_poll_interval_ms, exceeded_ms)
        if member and self.group_instance_id is None:
            self._leave(member, "consumer poll timeout has expired")

    def _leave(self, member: str, reason: str) -> None:
        answer = self._apis.call(_LeaveGroup(group_id=self.group_id, members=[_LeaveGroup.MemberIdentity(
            member_id=member, group_instance_id=self.group_instance_id, reason=reason)]), client_id=self.client_id)
        errors = [Errors(answer.error_code)] + [Errors(m.error_code) for m in answer.members]
        if any(e != Errors.NO_ERROR for e in errors):
            log.info("LeaveGroup of %s answered %s", member, ", ".join(e.name for e in errors))
