"""Consumer groups through the clients: subscribe() with range / roundrobin /
cooperative-sticky, rebalance callbacks, committed offsets and auto-commit, static
membership (KIP-345), max.poll.interval.ms expiry, and the KIP-447 fencing of
send_offsets_to_transaction (stale generation, unknown member, replaced static member,
UNSTABLE_OFFSET_COMMIT, a zombie worker).

The members of a group run as threads of this process (the group coordinator lives in
the writer of the storage root). Every member has its own ``client.id`` ("a", "b", ...),
so dynamic member ids (``<client.id>-<uuid>``) sort in that order: the assignors' results
are exact.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import Future

import pytest
from kafka.protocol.api_key import ApiKey

from txlake import (OFFSET_INVALID, AdminClient, Consumer, ConsumerGroupMetadata, KafkaError, KafkaException, NewTopic,
                    Producer, TopicPartition)
from txlake.assignors import decode_assignment
from txlake.engine.apis import local_apis
from txlake.engine.errors import Errors
from txlake.engine.group_metadata import GroupState
from txlake.engine.group_offsets import OffsetAndMetadata
from txlake.engine.registry import acquire_broker, close_all, release_broker

GROUP = "g"
#: broker settings: the first client of the storage root fixes them (engine/registry.py)
BROKER_CONF = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 100,
               "transaction.state.log.num.partitions": 3, "storage.flush.linger.ms": 1}
MEMBER_CONF = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 30, "max.poll.interval.ms": 5000,
               "auto.offset.reset": "earliest", "enable.auto.commit": False}
WAIT_S = 15


@pytest.fixture(params=["file", "memory"])
def backend(request):
    """Group tests run on file:// and memory://. Membership and assignment are the same code
    on every backend, so only the tests whose outcome rides on transactional offsets and
    markers in ``__consumer_offsets`` also run on s3:// (:data:`ALL_BACKENDS`)."""
    return request.param


ALL_BACKENDS = pytest.mark.parametrize("backend", ["file", "memory", pytest.param("s3", marks=pytest.mark.s3)],
                                       indirect=True)


@pytest.fixture
def env(storage):
    """Client config of a fresh storage root, and its broker (held open for the whole test,
    so the group coordinator lives as long as the test)."""
    conf = {**storage.conf(), **BROKER_CONF}
    admin = AdminClient(conf)
    broker = acquire_broker(storage.url, dict(storage.options))
    yield Env(conf, admin, broker)
    for member in list(Member.running):
        member.stop()
    admin.close()
    release_broker(broker)
    close_all()


class Env:
    def __init__(self, conf: dict, admin: AdminClient, broker):
        self.conf = conf
        self.admin = admin
        self.broker = broker

    def topic(self, name: str, partitions: int, records: int = 0) -> None:
        """Create a topic; with ``records``, write ``p<partition>-<i>`` for i < records to each partition."""
        self.admin.create_topics([NewTopic(name, partitions)])[name].result()
        if records:
            self.produce(name, {p: range(records) for p in range(partitions)})

    def produce(self, topic: str, values: dict[int, range]) -> None:
        p = Producer(self.conf)
        for partition, indexes in values.items():
            for i in indexes:
                p.produce(topic, value=f"p{partition}-{i}".encode(), partition=partition)
        assert p.flush(10) == 0
        p.close()

    def group(self, group_id: str = GROUP):
        return self.broker.group_coordinator().get_group(group_id)

    def read_committed(self, topic: str, partitions: int) -> list[str]:
        c = Consumer({**self.conf, "auto.offset.reset": "earliest"})
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        out = []
        while msgs := c.consume(500, 0.3):
            out.extend(m.value().decode() for m in msgs if m.error() is None)
        c.close()
        return sorted(out)

    def committed(self, topic: str, partitions: int, group_id: str = GROUP) -> list[tuple[int, str | None]]:
        c = Consumer({**self.conf, "group.id": group_id})
        out = [(tp.offset, tp.metadata) for tp in c.committed([TopicPartition(topic, p) for p in range(partitions)],
                                                               timeout=10)]
        c.close()
        return out


class Member:
    """A subscribed consumer polled by its own thread; it records what it consumed and
    every rebalance callback as ``(kind, partitions, generation)``."""

    running: set["Member"] = set()

    def __init__(self, env: Env, name: str, topics: list[str], group_id: str = GROUP, **conf):
        self.name = name
        self.consumer = Consumer({**env.conf, **MEMBER_CONF, "group.id": group_id, "client.id": name, **conf})
        self.events: list[tuple[str, list[int], int]] = []
        self.records: list[tuple[int, int, str]] = []
        self.error: KafkaError | None = None
        self.error_events: list[KafkaError] = []     # error events consume() returned
        self._lock = threading.Lock()
        self._polling = threading.Event()
        self._idle = threading.Event()
        self._stop = threading.Event()
        self.consumer.subscribe(topics, on_assign=self._callback("assign"), on_revoke=self._callback("revoke"),
                                on_lost=self._callback("lost"))
        self._thread = threading.Thread(target=self._loop, name=f"member-{name}", daemon=True)
        self._polling.set()
        Member.running.add(self)
        self._thread.start()

    def _callback(self, kind: str):
        def record(consumer, partitions):
            generation = consumer.consumer_group_metadata().generation_id
            with self._lock:
                self.events.append((kind, sorted(tp.partition for tp in partitions), generation))
        return record

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self._polling.is_set():
                self._idle.set()
                time.sleep(0.002)
                continue
            self._idle.clear()
            try:
                msgs = self.consumer.consume(100, 0.02)
            except KafkaException as exc:
                self.error = exc.args[0]
                self._idle.set()
                return
            with self._lock:
                self.records.extend((m.partition(), m.offset(), m.value().decode()) for m in msgs if m.error() is None)
                self.error_events.extend(m.error() for m in msgs if m.error() is not None)

    def pause(self) -> None:
        """Stop polling (returns once the thread is out of its current poll)."""
        self._polling.clear()
        assert self._idle.wait(WAIT_S)

    def resume(self) -> None:
        self._polling.set()

    def stop(self) -> None:
        """Stop the thread and close the consumer (LeaveGroup for a dynamic member)."""
        self._stop.set()
        self._thread.join(WAIT_S)
        Member.running.discard(self)
        self.consumer.close()

    def partitions(self) -> list[int]:
        return sorted(tp.partition for tp in self.consumer.assignment())

    def generation(self) -> int:
        return self.consumer.consumer_group_metadata().generation_id

    def member_id(self) -> str:
        return self.consumer.consumer_group_metadata().member_id

    def kinds(self, kind: str) -> list[tuple[list[int], int]]:
        with self._lock:
            return [(parts, gen) for k, parts, gen in self.events if k == kind]

    def consumed(self) -> list[tuple[int, int, str]]:
        with self._lock:
            return list(self.records)


def wait_until(condition, what: str, timeout: float = WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def wait_stable(env: Env, members: list[Member], partitions: int, group_id: str = GROUP) -> int:
    """Wait until the group is Stable, every member is in its generation and has applied exactly
    what the group assigned it in that generation (its group thread completes the join before
    the member's poll runs the callbacks), and the members' assignments cover the topic's
    partitions exactly once; returns the generation."""
    def stable():
        group = env.group(group_id)
        if group is None or group.state is not GroupState.STABLE:
            return None
        for m in members:
            stored = group.members.get(m.member_id())
            if m.generation() != group.generation_id or stored is None or \
                    sorted(p for _, p in decode_assignment(stored.assignment).partitions) != m.partitions():
                return None
        owned = sorted(p for m in members for p in m.partitions())
        return group.generation_id if owned == list(range(partitions)) else None
    return wait_until(stable, f"a stable assignment of {partitions} partitions to {[m.name for m in members]}")


def code(excinfo) -> int:
    return excinfo.value.args[0].code()


# ---------------------------------------------------------------------------- the request surface
def test_a_member_speaks_kafkas_group_protocol_to_engine_apis(env):
    """The consumer's group membership is Kafka's requests answered by the engine's request
    surface (issue 16), the handlers ``txlake serve`` answers the network with: the handlers
    are wrapped (they still answer) to record each request's API, version and answer."""
    env.topic("t", 2)
    apis = local_apis(env.broker)   # the clients of the root share its engine and request surface
    seen: list[tuple[str, int, int]] = []
    keys = (ApiKey.Metadata, ApiKey.JoinGroup, ApiKey.SyncGroup, ApiKey.Heartbeat, ApiKey.LeaveGroup)
    originals = {key: apis.specs[key] for key in keys}

    def recording(spec):
        def handler(node, context, request):
            answer = spec.handler(node, context, request)
            name = ApiKey(context.api_key).name

            def record(response):
                code = getattr(response, "error_code", 0)
                if not seen or seen[-1] != (name, context.api_version, code):   # heartbeats: once
                    seen.append((name, context.api_version, code))
            if isinstance(answer, Future):
                answer.add_done_callback(lambda done: record(done.result()))
            else:
                record(answer)
            return answer
        return dataclasses.replace(spec, handler=handler)

    for key, spec in originals.items():
        apis.specs[key] = recording(spec)
    try:
        member = Member(env, "a", ["t"])
        assert member.consumer._broker is env.broker
        assert wait_stable(env, [member], 2) == 1
        wait_until(lambda: ("Heartbeat", 4, 0) in seen, "a heartbeat")
        member.stop()
    finally:
        apis.specs.update(originals)
    assert seen == [
        ("Metadata", 12, 0), ("JoinGroup", 9, Errors.MEMBER_ID_REQUIRED),   # KIP-394: rejoin with the id
        ("Metadata", 12, 0), ("JoinGroup", 9, 0),
        ("Metadata", 12, 0), ("SyncGroup", 5, 0),                          # the leader's partition counts
        ("Heartbeat", 4, 0), ("LeaveGroup", 5, 0)]


# ---------------------------------------------------------------------------- assignment
EXPECTED = {
    # after a joins, after b joins, after c joins, after c leaves: (a, b, c) partitions
    "range": [([0, 1, 2, 3, 4, 5],), ([0, 1, 2], [3, 4, 5]), ([0, 1], [2, 3], [4, 5]), ([0, 1, 2], [3, 4, 5])],
    "roundrobin": [([0, 1, 2, 3, 4, 5],), ([0, 2, 4], [1, 3, 5]), ([0, 3], [1, 4], [2, 5]), ([0, 2, 4], [1, 3, 5])],
    # sticky: owned partitions are kept up to the quota (lowest first), the others go round-robin
    "cooperative-sticky": [([0, 1, 2, 3, 4, 5],), ([0, 1, 2], [3, 4, 5]), ([0, 1], [3, 4], [2, 5]),
                           ([0, 1, 2], [3, 4, 5])],
}
#: generations after each step: a cooperative join takes two rebalances (revoke, then assign)
GENERATIONS = {"range": [1, 2, 3, 4], "roundrobin": [1, 2, 3, 4], "cooperative-sticky": [1, 3, 5, 6]}


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_three_members_share_six_partitions(env, strategy):
    env.topic("t", 6)
    members: list[Member] = []
    steps = []
    for name in "abc":
        members.append(Member(env, name, ["t"], **{"partition.assignment.strategy": strategy}))
        generation = wait_stable(env, members, 6)
        steps.append((generation, tuple(m.partitions() for m in members)))
    assert [m.member_id() for m in members] == sorted(m.member_id() for m in members)
    a, b, c = members
    c.stop()
    generation = wait_stable(env, [a, b], 6)
    steps.append((generation, (a.partitions(), b.partitions())))
    assert steps == list(zip(GENERATIONS[strategy], EXPECTED[strategy]))
    assert c.kinds("revoke")[-1][0] == EXPECTED[strategy][2][2]       # close() revokes what it owned
    assert a.kinds("lost") == b.kinds("lost") == c.kinds("lost") == []
    if strategy == "cooperative-sticky":
        # only the partitions that move are revoked; a member never loses what it keeps
        assert a.kinds("revoke") == [([3, 4, 5], 2), ([2], 4)]
        assert b.kinds("revoke") == [([5], 4)]
        for member, kept in ((a, {0, 1}), (b, {3, 4})):
            assert not kept & {p for parts, _ in member.kinds("revoke") for p in parts}
        assert [p for p, _ in a.kinds("assign") if p] == [[0, 1, 2, 3, 4, 5], [2]]
        assert [p for p, _ in b.kinds("assign") if p] == [[3, 4, 5], [5]]
        assert [p for p, _ in c.kinds("assign") if p] == [[2, 5]]
    else:
        # eager: everything is revoked before every rejoin
        assert a.kinds("revoke") == [(list(range(6)), 1), (EXPECTED[strategy][1][0], 2), (EXPECTED[strategy][2][0], 3)]
        assert b.kinds("revoke") == [(EXPECTED[strategy][1][1], 2), (EXPECTED[strategy][2][1], 3)]
        assert [gen for _, gen in a.kinds("assign")] == [1, 2, 3, 4]
    a.stop()
    b.stop()


# ---------------------------------------------------------------------------- offsets
def test_auto_commit_and_takeover_resumes_after_the_committed_offset(env):
    env.topic("in", 2, records=5)
    auto = {"enable.auto.commit": True, "auto.commit.interval.ms": 50}
    a = Member(env, "a", ["in"], **auto)
    assert wait_stable(env, [a], 2) == 1
    wait_until(lambda: len(a.consumed()) == 10, "a consumes 10 records")
    # the auto-commit of a running member (not the one of close())
    wait_until(lambda: env.committed("in", 2) == [(5, ""), (5, "")], "auto-commit of offset 5")
    b = Member(env, "b", ["in"], **auto)
    assert wait_stable(env, [a, b], 2) == 2
    assert (a.partitions(), b.partitions()) == ([0], [1])
    assert b.consumer.position([TopicPartition("in", 1)])[0].offset == 5      # the committed offset
    env.produce("in", {0: range(5, 8), 1: range(5, 8)})
    wait_until(lambda: len(a.consumed()) == 13 and len(b.consumed()) == 3, "the new records")
    assert sorted(a.consumed()) == [(0, i, f"p0-{i}") for i in range(8)] + [(1, i, f"p1-{i}") for i in range(5)]
    assert b.consumed() == [(1, i, f"p1-{i}") for i in range(5, 8)]
    wait_until(lambda: env.committed("in", 2) == [(8, ""), (8, "")], "auto-commit of offset 8")
    a.stop()
    b.stop()


def test_commit_metadata_and_member_checks(env):
    env.topic("in", 2, records=3)
    a = Member(env, "a", ["in"])
    assert wait_stable(env, [a], 2) == 1
    wait_until(lambda: len(a.consumed()) == 6, "a consumes")
    old = a.consumer.consumer_group_metadata()
    assert (old.group_id, old.generation_id, old.group_instance_id) == (GROUP, 1, None)
    assert old.member_id.startswith("a-")
    committed = a.consumer.commit(offsets=[TopicPartition("in", 0, 2, "checkpoint-2"), TopicPartition("in", 1, 3)],
                                  asynchronous=False)
    assert [(tp.partition, tp.offset, tp.metadata) for tp in committed] == [(0, 2, "checkpoint-2"), (1, 3, None)]
    got = a.consumer.committed([TopicPartition("in", 0), TopicPartition("in", 1)])
    assert [(tp.offset, tp.metadata) for tp in got] == [(2, "checkpoint-2"), (3, "")]
    assert env.committed("in", 2) == [(2, "checkpoint-2"), (3, "")]
    b = Member(env, "b", ["in"])
    assert wait_stable(env, [a, b], 2) == 2
    offsets = env.broker.group_offsets()
    tp0 = ("in", 0)
    # a commit of the generation before the rebalance: ILLEGAL_GENERATION
    assert offsets.commit(GROUP, {tp0: OffsetAndMetadata(1)}, old.generation_id, old.member_id) == \
        {tp0: Errors.ILLEGAL_GENERATION}
    assert offsets.commit(GROUP, {tp0: OffsetAndMetadata(1)}, 2, "a-not-a-member") == {tp0: Errors.UNKNOWN_MEMBER_ID}
    # a consumer outside the group (assign(), no member id) cannot commit while the group has members
    outsider = Consumer({**env.conf, "group.id": GROUP})
    outsider.assign([TopicPartition("in", 0)])
    with pytest.raises(KafkaException) as unknown:
        outsider.commit(offsets=[TopicPartition("in", 0, 1)], asynchronous=False)
    assert code(unknown) == KafkaError.UNKNOWN_MEMBER_ID
    outsider.close()
    # the current member's commit goes through
    assert offsets.commit(GROUP, {tp0: OffsetAndMetadata(1, "m")}, 2, a.member_id()) == {tp0: Errors.NO_ERROR}
    assert env.committed("in", 2) == [(1, "m"), (3, "")]
    a.stop()
    b.stop()


# ---------------------------------------------------------------------------- KIP-447
@ALL_BACKENDS
def test_txn_offset_commit_is_fenced_by_generation_member_and_static_instance(env):
    env.topic("in", 2, records=4)
    env.topic("out", 1)
    w = Member(env, "w", ["in"])
    assert wait_stable(env, [w], 2) == 1
    stale = w.consumer.consumer_group_metadata()
    x = Member(env, "x", ["in"])
    assert wait_stable(env, [w, x], 2) == 2
    x.stop()
    assert wait_stable(env, [w], 2) == 3
    current = w.consumer.consumer_group_metadata()
    assert (current.generation_id, current.member_id) == (3, stale.member_id)
    t = Producer({**env.conf, "transactional.id": "t-447"})
    t.init_transactions(10)
    offsets = [TopicPartition("in", 0, 2), TopicPartition("in", 1, 3)]

    def fenced(metadata, value: str, expected: int):
        t.begin_transaction()
        t.produce("out", value=value.encode(), partition=0)
        with pytest.raises(KafkaException) as exc:
            t.send_offsets_to_transaction(offsets, metadata, 10)
        err = exc.value.args[0]
        assert (err.code(), err.txn_requires_abort(), err.fatal()) == (expected, True, False)
        with pytest.raises(KafkaException) as again:
            t.commit_transaction(10)
        assert code(again) == expected
        t.abort_transaction(10)

    fenced(stale, "stale", KafkaError.ILLEGAL_GENERATION)
    fenced(ConsumerGroupMetadata(GROUP, 3, "w-nobody", None), "unknown", KafkaError.UNKNOWN_MEMBER_ID)
    # the producer stays usable: the next transaction commits
    t.begin_transaction()
    t.produce("out", value=b"ok", partition=0)
    t.send_offsets_to_transaction(offsets, w.consumer.consumer_group_metadata(), 10)
    t.commit_transaction(10)
    assert env.committed("in", 2) == [(2, ""), (3, "")]
    # a static member replaced by a new consumer with its group.instance.id
    s1 = Member(env, "s1", ["in"], group_id="gs", **{"group.instance.id": "worker-1"})
    assert wait_stable(env, [s1], 2, "gs") == 1
    s1_metadata = s1.consumer.consumer_group_metadata()
    assert s1_metadata.group_instance_id == "worker-1"
    s1.pause()
    s2 = Member(env, "s2", ["in"], group_id="gs", **{"group.instance.id": "worker-1"})
    assert wait_stable(env, [s2], 2, "gs") == 1                       # no rebalance for a static member
    assert s2.member_id() != s1_metadata.member_id
    fenced(s1_metadata, "zombie", KafkaError.FENCED_INSTANCE_ID)
    t.begin_transaction()
    t.produce("out", value=b"ok-static", partition=0)
    t.send_offsets_to_transaction([TopicPartition("in", 0, 4)], s2.consumer.consumer_group_metadata(), 10)
    t.commit_transaction(10)
    assert env.committed("in", 2, "gs") == [(4, ""), (OFFSET_INVALID, None)]
    assert env.read_committed("out", 1) == ["ok", "ok-static"]
    t.close()
    for m in (w, s1, s2):
        m.stop()


@ALL_BACKENDS
@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_unstable_offsets_hold_back_the_new_owner(env, outcome):
    env.topic("in", 1, records=10)
    tp = TopicPartition("in", 0)
    w = Member(env, "w", ["in"])
    assert wait_stable(env, [w], 1) == 1
    w.consumer.commit(offsets=[TopicPartition("in", 0, 2)], asynchronous=False)
    t = Producer({**env.conf, "transactional.id": "t-unstable"})
    t.init_transactions(10)
    t.begin_transaction()
    t.send_offsets_to_transaction([TopicPartition("in", 0, 6)], w.consumer.consumer_group_metadata(), 10)
    w.stop()                        # leaves (the group goes Empty: generation 2); the transaction stays open
    r = Member(env, "r", ["in"])                                      # read_committed (the default)
    assert wait_stable(env, [r], 1) == 3
    assert r.kinds("assign") == [([0], 3)]
    time.sleep(0.2)
    assert r.consumed() == []
    assert r.consumer.position([tp])[0].offset == OFFSET_INVALID
    with pytest.raises(KafkaException) as unstable:
        r.consumer.committed([tp], timeout=0.1)
    assert code(unstable) == KafkaError._TIMED_OUT
    if outcome == "commit":
        t.commit_transaction(10)
        start = 6
    else:
        t.abort_transaction(10)
        start = 2
    wait_until(lambda: len(r.consumed()) == 10 - start, "the records after the committed offset")
    assert r.consumed() == [(0, i, f"p0-{i}") for i in range(start, 10)]
    assert r.consumer.committed([tp])[0].offset == start
    t.close()
    r.stop()


# ---------------------------------------------------------------------------- static membership
def test_static_member_returns_without_rebalance_and_duplicate_is_fenced(env):
    env.topic("t", 6)
    static = {"session.timeout.ms": 3000}
    a = Member(env, "a", ["t"], **{"group.instance.id": "inst-a"}, **static)
    assert wait_stable(env, [a], 6) == 1
    b = Member(env, "b", ["t"], **{"group.instance.id": "inst-b"}, **static)
    generation = wait_stable(env, [a, b], 6)
    assert generation == 2
    assert (a.partitions(), b.partitions()) == ([0, 1, 2], [3, 4, 5])
    a_events = len(a.events)
    b.stop()                                     # a static member sends no LeaveGroup
    assert env.group().state is GroupState.STABLE and env.group().generation_id == generation
    b2 = Member(env, "b2", ["t"], **{"group.instance.id": "inst-b"}, **static)
    assert wait_stable(env, [a, b2], 6) == generation
    assert (a.partitions(), b2.partitions()) == ([0, 1, 2], [3, 4, 5])
    assert b2.kinds("assign") == [([3, 4, 5], generation)]
    assert len(a.events) == a_events             # a saw no rebalance
    # a second consumer with inst-a: it takes over, the old one is fenced for good
    old_a = a.member_id()
    a2 = Member(env, "a2", ["t"], **{"group.instance.id": "inst-a"}, **static)
    assert wait_stable(env, [a2, b2], 6) == generation
    assert a2.partitions() == [0, 1, 2] and a2.member_id() != old_a
    wait_until(lambda: a.error is not None, "the old inst-a member to be fenced")
    assert (a.error.code(), a.error.fatal()) == (KafkaError.FENCED_INSTANCE_ID, True)
    with pytest.raises(KafkaException) as again:
        a.consumer.poll(0)
    assert code(again) == KafkaError.FENCED_INSTANCE_ID
    assert env.group().generation_id == generation
    for m in (a, a2, b2):
        m.stop()


# ---------------------------------------------------------------------------- poll interval
def test_max_poll_interval_expiry_loses_the_partitions(env):
    env.topic("t", 6)
    # 2 s, not less: on a loaded 2-core machine a member's poll loop can stall for several hundred ms,
    # and an expiry during the rejoin below would add generations (CI saw 6 instead of 4 at 400 ms)
    poll = {"max.poll.interval.ms": 2000}
    a = Member(env, "a", ["t"], **poll)
    assert wait_stable(env, [a], 6) == 1
    b = Member(env, "b", ["t"], **poll)
    generation = wait_stable(env, [a, b], 6)
    assert generation == 2
    assert (a.partitions(), b.partitions()) == ([0, 1, 2], [3, 4, 5])
    a.pause()
    paused = time.monotonic()
    # a's heartbeat thread leaves the group once a has not polled for 2 s; b gets everything
    wait_until(lambda: b.partitions() == [0, 1, 2, 3, 4, 5] and b.generation() == generation + 1,
               "b to take a's partitions")
    assert time.monotonic() - paused >= 1.9          # a's last poll was a few ms before the pause returned
    assert a.kinds("lost") == [] and a.partitions() == [0, 1, 2]    # a learns it at its next poll
    a.resume()
    assert wait_stable(env, [a, b], 6) == generation + 2
    # librdkafka: the next poll returns _MAX_POLL_EXCEEDED, the one after it runs on_lost
    assert [(e.code(), e.str().startswith("Application maximum poll interval (2000ms) exceeded by "))
            for e in a.error_events] == [(KafkaError._MAX_POLL_EXCEEDED, True)]
    assert b.error_events == []
    assert a.kinds("lost") == [([0, 1, 2], generation)]
    assert a.kinds("revoke") == [([0, 1, 2, 3, 4, 5], 1)]                # only when b joined
    assert [parts for parts, _ in a.kinds("assign")][-1] == [0, 1, 2]
    a.stop()
    b.stop()


# ---------------------------------------------------------------------------- zombie worker
class FrozenHeartbeats:
    """Simulates a paused process (GC pause, SIGSTOP) for one consumer: its heartbeats hang
    until :meth:`thaw`; the answers they get afterwards are recorded."""

    def __init__(self, consumer: Consumer):
        self._membership = consumer._membership
        self._thawed = threading.Event()
        self.answers: list[Errors] = []
        apis = self._membership._apis   # the engine's request surface the member sends its requests to
        frozen = self

        class Proxy:
            def __getattr__(self, name):
                return getattr(apis, name)

            def call(self, request, *args, **kwargs):
                if request.API_KEY != ApiKey.Heartbeat:
                    return apis.call(request, *args, **kwargs)
                frozen._thawed.wait()
                answer = apis.call(request, *args, **kwargs)
                frozen.answers.append(Errors(answer.error_code))
                return answer

        self._membership._apis = Proxy()

    def thaw(self) -> None:
        self._thawed.set()


@ALL_BACKENDS
@pytest.mark.parametrize("offsets_sent", [False, True])
def test_zombie_worker_cannot_commit_into_the_new_generation(env, offsets_sent):
    env.topic("in", 2)
    env.topic("out", 2)
    zombie_conf = {"session.timeout.ms": 1500}  # short for the test, long enough for a loaded machine
    a = Member(env, "a", ["in"], **zombie_conf)
    assert wait_stable(env, [a], 2) == 1
    b = Member(env, "b", ["in"])
    generation = wait_stable(env, [a, b], 2)
    assert generation == 2
    assert (a.partitions(), b.partitions()) == ([0], [1])
    env.produce("in", {0: range(6), 1: range(6)})
    wait_until(lambda: len(a.consumed()) == 6 and len(b.consumed()) == 6, "both consume their partition")
    ta = Producer({**env.conf, "transactional.id": "worker-a"})
    tb = Producer({**env.conf, "transactional.id": "worker-b"})
    ta.init_transactions(10)
    tb.init_transactions(10)

    def copy(producer, worker, records):
        for partition, _, value in records:
            producer.produce("out", value=f"{worker}|{value}".encode(), partition=partition)

    # a copies 3 records, b its 6, each committing offsets in its transaction
    ta.begin_transaction()
    copy(ta, "A", a.consumed()[:3])
    ta.send_offsets_to_transaction([TopicPartition("in", 0, 3)], a.consumer.consumer_group_metadata(), 10)
    ta.commit_transaction(10)
    tb.begin_transaction()
    copy(tb, "B", b.consumed())
    tb.send_offsets_to_transaction([TopicPartition("in", 1, 6)], b.consumer.consumer_group_metadata(), 10)
    tb.commit_transaction(10)
    # a's next transaction is open when a freezes past its session timeout
    a_metadata = a.consumer.consumer_group_metadata()
    ta.begin_transaction()
    copy(ta, "A", a.consumed()[3:])
    if offsets_sent:
        ta.send_offsets_to_transaction([TopicPartition("in", 0, 6)], a_metadata, 10)
    assert ta.flush(10) == 0
    a.pause()
    frozen = FrozenHeartbeats(a.consumer)
    wait_until(lambda: b.partitions() == [0, 1] and b.generation() == generation + 1, "b to take over in-0")
    assert b.kinds("assign")[-1] == ([0, 1], generation + 1)
    if offsets_sent:
        # KIP-447: b waits for a's pending offsets; a's transaction may still commit them
        time.sleep(0.2)
        assert b.consumer.position([TopicPartition("in", 0)])[0].offset == OFFSET_INVALID
        assert len(b.consumed()) == 6
        frozen.thaw()
        wait_until(lambda: frozen.answers, "a's first heartbeat after the pause")
        assert frozen.answers[0] == Errors.UNKNOWN_MEMBER_ID
        ta.commit_transaction(10)
        wait_until(lambda: b.consumer.position([TopicPartition("in", 0)])[0].offset == 6, "b to start at offset 6")
        assert len(b.consumed()) == 6
        expected = [f"A|p0-{i}" for i in range(6)] + [f"B|p1-{i}" for i in range(6)]
    else:
        # b starts at the last committed offset, 3, and copies the rest itself
        wait_until(lambda: len(b.consumed()) == 9, "b to read in-0 from offset 3")
        assert b.consumed()[6:] == [(0, i, f"p0-{i}") for i in range(3, 6)]
        tb.begin_transaction()
        copy(tb, "B", b.consumed()[6:])
        tb.send_offsets_to_transaction([TopicPartition("in", 0, 6)], b.consumer.consumer_group_metadata(), 10)
        tb.commit_transaction(10)
        # a wakes up: its heartbeat learns it is gone, and its offsets are refused
        frozen.thaw()
        wait_until(lambda: frozen.answers, "a's first heartbeat after the pause")
        assert frozen.answers[0] == Errors.UNKNOWN_MEMBER_ID
        time.sleep(0.1)                                     # the heartbeat thread has digested it
        with pytest.raises(KafkaException) as zombie:
            ta.send_offsets_to_transaction([TopicPartition("in", 0, 6)], a.consumer.consumer_group_metadata(), 10)
        err = zombie.value.args[0]
        assert (err.code(), err.txn_requires_abort(), err.fatal()) == (KafkaError.UNKNOWN_MEMBER_ID, True, False)
        ta.abort_transaction(10)
        expected = [f"A|p0-{i}" for i in range(3)] + [f"B|p0-{i}" for i in range(3, 6)] + \
                   [f"B|p1-{i}" for i in range(6)]
    assert env.read_committed("out", 2) == sorted(expected)
    assert env.committed("in", 2) == [(6, ""), (6, "")]
    # a polls again: its partition is reported lost, then it rejoins
    a.resume()
    assert wait_stable(env, [a, b], 2) == generation + 2
    assert a.kinds("lost") == [([0], generation)]
    assert (a.partitions(), b.partitions()) == ([0], [1])
    ta.close()
    tb.close()
    a.stop()
    b.stop()


def test_member_whose_session_expired_cannot_commit(env):
    env.topic("in", 1, records=3)
    a = Member(env, "a", ["in"], **{"session.timeout.ms": 1000})  # short, but no stall of a loaded machine expires it
    assert wait_stable(env, [a], 1) == 1
    wait_until(lambda: len(a.consumed()) == 3, "a consumes")
    a.pause()
    frozen = FrozenHeartbeats(a.consumer)
    wait_until(lambda: env.group().state is GroupState.EMPTY, "a's session to expire")
    assert env.group().generation_id == 2
    frozen.thaw()
    wait_until(lambda: frozen.answers, "a's first heartbeat after the pause")
    assert frozen.answers[0] == Errors.UNKNOWN_MEMBER_ID
    time.sleep(0.1)                                         # the heartbeat thread has digested it
    # the group is Empty, but a still presents its old member id: refused, not taken as a
    # commit of a consumer outside the group
    assert a.consumer.consumer_group_metadata().generation_id == 1
    with pytest.raises(KafkaException) as exc:
        a.consumer.commit(asynchronous=False)
    assert code(exc) == KafkaError.UNKNOWN_MEMBER_ID
    assert env.committed("in", 1) == [(OFFSET_INVALID, None)]
    a.resume()
    assert wait_stable(env, [a], 1) == 3
    assert a.kinds("lost") == [([0], 1)]
    # nothing was committed: a reads its partition again from the start (auto.offset.reset)
    wait_until(lambda: len(a.consumed()) == 6, "a re-reads in-0")
    assert a.consumed() == [(0, i, f"p0-{i}") for i in range(3)] * 2
    a.consumer.commit(asynchronous=False)
    assert env.committed("in", 1) == [(3, "")]
    a.stop()
