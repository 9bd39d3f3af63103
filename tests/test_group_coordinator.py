"""The group coordinator: JoinGroup/SyncGroup/Heartbeat/LeaveGroup, expiry, static membership,
the KIP-447 commit checks, and the group records replayed after a restart.

Expected answers follow Kafka's GroupCoordinator / GroupMetadataManager classic-group paths
and their tests (GroupMetadataManagerTest, ClassicGroupTest). Time is an injected clock and
deadlines fire only in ``check_expirations``, so every test is deterministic.
"""

from __future__ import annotations

import base64
import itertools
import json
import queue
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from txlake.assignors import (RangeAssignor, Subscription, decode_assignment, encode_subscription,
                              perform_assignment)
from txlake.catalog.errors import InvalidConfigError
from txlake.engine import group_offsets
from txlake.engine.errors import Errors
from txlake.engine.group_coordinator import (GroupConfig, GroupCoordinator, MemberIdentity,
                                             append_error_to_response_error)
from txlake.engine.group_metadata import (VALID_PREVIOUS_STATES, GroupMember, GroupMetadata, GroupState,
                                          IllegalGroupStateError, JoinGroupResult, decode_group_record,
                                          group_metadata_key)
from txlake.formats.errors import CorruptObjectError, UnsupportedFormatVersionError

S = GroupState
G = "group"
T0 = 1_700_000_000_000
SESSION = 10_000
REBALANCE = 30_000
DELAY = 100
TOPIC = "orders"
PARTITIONS = {TOPIC: 6}
RANGE = [("range", encode_subscription(Subscription((TOPIC,))))]


class Clock:
    def __init__(self, now: int = T0):
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class Log:
    """The group records the coordinator appends; ``fail_with`` makes the next append fail."""

    def __init__(self):
        self.records: list[tuple[str, bytes, bytes | None]] = []
        self.fail_with: Errors | None = None

    def append(self, group_id: str, key: bytes, value: bytes | None) -> Errors:
        if self.fail_with is not None:
            error, self.fail_with = self.fail_with, None
            return error
        self.records.append((group_id, key, value))
        return Errors.NO_ERROR

    def values(self) -> list[dict | None]:
        return [json.loads(v) if v is not None else None for _, _, v in self.records]

    def replay(self):
        return [(k, v) for _, k, v in self.records]


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def log():
    return Log()


def make(clock, log=None, **config) -> GroupCoordinator:
    counter = itertools.count(1)
    return GroupCoordinator(append=log.append if log else None,
                            config=GroupConfig(group_initial_rebalance_delay_ms=DELAY, **config),
                            time_ms=clock, new_uuid=lambda: f"u{next(counter)}")


def join(coord, member_id="", client="client", instance=None, protocols=RANGE, protocol_type="consumer",
         session=SESSION, rebalance=REBALANCE, group=G, **kw) -> Future:
    return coord.handle_join_group(group, member_id, protocol_type, protocols, session, rebalance,
                                   group_instance_id=instance, client_id=client, **kw)


def done(future: Future):
    assert future.done(), "the coordinator has not answered yet"
    return future.result(timeout=0)


@dataclass
class Member:
    client: str
    member_id: str
    instance: str | None
    generation: int
    leader: str
    partitions: tuple


def sync_all(coord, joins: dict[str, JoinGroupResult], instances: dict[str, str | None]) -> dict[str, Member]:
    """Followers sync first (they wait), then the leader sends the range assignment."""
    leader = [c for c, r in joins.items() if r.is_leader]
    assert len(leader) == 1
    futures = {c: coord.handle_sync_group(G, r.generation_id, r.member_id, group_instance_id=instances[c])
               for c, r in joins.items() if not r.is_leader}
    assert not any(f.done() for f in futures.values()), "followers must wait for the leader's assignment"
    r = joins[leader[0]]
    futures[leader[0]] = coord.handle_sync_group(G, r.generation_id, r.member_id,
                                                 perform_assignment(RangeAssignor(), r.members, PARTITIONS),
                                                 group_instance_id=instances[leader[0]])
    out = {}
    for c, f in futures.items():
        result = done(f)
        assert result.error == Errors.NO_ERROR
        assert (result.protocol_type, result.protocol_name) == ("consumer", "range")
        out[c] = Member(c, joins[c].member_id, instances[c], joins[c].generation_id, joins[c].leader_id,
                        decode_assignment(result.assignment).partitions)
    return out


def settle(coord, clock, futures) -> None:
    """Let the initial rebalance delay pass (extended while members kept joining)."""
    for _ in range(5):
        if all(f.done() for f in futures):
            return
        clock.advance(DELAY)
        coord.check_expirations()
    raise AssertionError("the join phase did not complete")


def form_group(coord, clock, specs) -> dict[str, Member]:
    """Members join a new group (dynamic ones through MEMBER_ID_REQUIRED), the initial delay
    passes, everybody syncs: generation 1, Stable."""
    futures = {}
    for client, instance in specs:
        if instance is None:
            first = done(join(coord, client=client))
            assert first.error == Errors.MEMBER_ID_REQUIRED
            futures[client] = join(coord, first.member_id, client=client)
        else:
            futures[client] = join(coord, client=client, instance=instance)
    # the initial delay: each time members joined during it, it is extended once more
    for _ in range(2 if len(specs) > 1 else 1):
        assert not any(f.done() for f in futures.values())
        clock.advance(DELAY)
        coord.check_expirations()
    members = sync_all(coord, {c: done(f) for c, f in futures.items()}, dict(specs))
    assert coord.get_group(G).state is S.STABLE
    return members


def rejoin(coord, m: Member, **kw) -> Future:
    return join(coord, m.member_id, client=m.client, instance=m.instance, **kw)


def heartbeat(coord, m: Member, generation=None) -> Errors:
    return coord.handle_heartbeat(G, m.generation if generation is None else generation, m.member_id, m.instance)


# ---------------------------------------------------------------------------- the group's state machine
def test_valid_previous_states_are_kafkas():
    assert VALID_PREVIOUS_STATES == {
        S.PREPARING_REBALANCE: {S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY},
        S.COMPLETING_REBALANCE: {S.PREPARING_REBALANCE},
        S.STABLE: {S.COMPLETING_REBALANCE},
        S.DEAD: {S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD},
        S.EMPTY: {S.PREPARING_REBALANCE},
    }
    assert [s.value for s in GroupState] == ["Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"]
    assert GroupState.parse("stable") is S.STABLE and GroupState.parse("nope") is None


@pytest.mark.parametrize("target", list(GroupState))
def test_transitions_are_checked(target):
    for state in GroupState:
        group = GroupMetadata(G, state, T0)
        if state in VALID_PREVIOUS_STATES[target]:
            group.transition_to(target, T0 + 1)
            assert (group.state, group.previous_state, group.state_timestamp) == (target, state, T0 + 1)
        else:
            with pytest.raises(IllegalGroupStateError, match=f"before moving to {target.value} state"):
                group.transition_to(target, T0 + 1)
            assert group.state is state


def member(member_id, protocols, instance=None) -> GroupMember:
    return GroupMember(member_id, instance, "client", "", REBALANCE, SESSION, "consumer",
                       [(p, b"") for p in protocols])


def test_protocol_selection_votes_among_protocols_every_member_supports():
    group = GroupMetadata(G, S.PREPARING_REBALANCE, T0)
    with pytest.raises(IllegalGroupStateError, match="empty group"):
        group.select_protocol()
    group.add(member("a", ["range", "roundrobin"]))
    group.add(member("b", ["roundrobin", "range"]))
    group.add(member("c", ["roundrobin", "range", "sticky"]))
    assert group.candidate_protocols() == {"range", "roundrobin"}
    assert group.select_protocol() == "roundrobin"  # two votes to one
    assert group.leader_id == "a"
    group.remove("b")
    assert group.select_protocol() == "range"  # a tie goes to the smallest name
    assert not group.supports_protocols("consumer", {"sticky"})
    assert not group.supports_protocols("connect", {"range"})
    assert group.supports_protocols("consumer", {"sticky", "range"})
    # an Empty group takes any protocol type and protocols, but not none
    empty = GroupMetadata(G, S.EMPTY, T0)
    assert empty.supports_protocols("connect", {"x"}) and not empty.supports_protocols("consumer", set())


def test_add_remove_and_leader_hand_over():
    group = GroupMetadata(G, S.EMPTY, T0)
    group.add(member("a", ["range"], instance="i-a"))
    group.add(member("b", ["range"]))
    assert group.static_members == {"i-a": "a"} and group.leader_id == "a"
    with pytest.raises(IllegalGroupStateError, match="already a member"):
        group.add(member("c", ["range"], instance="i-a"))
    with pytest.raises(IllegalGroupStateError, match="protocol type"):
        group.add(GroupMember("x", None, "c", "", 1, 1, "connect", [("range", b"")]))
    group.remove("a")
    assert group.leader_id == "b" and group.static_members == {}
    group.remove("b")
    assert group.leader_id is None and group.size == 0


def test_record_round_trip():
    group = GroupMetadata(G, S.EMPTY, T0)
    group.add(member("a", ["range"], instance="i-a"))
    group.add(member("b", ["range"]))
    group.generation_id, group.protocol_name = 3, "range"
    key, value = group.to_record({"a": b"\x01", "b": b""})
    assert json.loads(key) == {"v": 1, "type": "group", "group": G}
    decoded = decode_group_record(key, value, "loc")
    assert decoded[0] == G and decoded[1]["generation"] == 3
    back = GroupMetadata.from_record(G, decoded[1], T0 + 5)
    assert (back.state, back.generation_id, back.protocol_type, back.protocol_name, back.leader_id) == \
        (S.STABLE, 3, "consumer", "range", "a")
    assert [(m.member_id, m.group_instance_id, m.assignment) for m in back.members.values()] == \
        [("a", "i-a", b"\x01"), ("b", None, b"")]
    assert decode_group_record(key, None, "loc") == (G, None)


@pytest.mark.parametrize("key, value, error, match", [
    (b"garbage", None, CorruptObjectError, "unreadable record key"),
    (b'{"v": 2, "type": "group", "group": "g"}', None, UnsupportedFormatVersionError, "unknown version 2"),
    (b'{"v": 1, "type": "group"}', None, CorruptObjectError, "without a group id"),
    (group_metadata_key(G), b"{", CorruptObjectError, "unreadable group metadata value"),
    (group_metadata_key(G), b'{"v": 1, "generation": 1}', CorruptObjectError, "lacks"),
    (group_metadata_key(G), b'{"v": 3}', UnsupportedFormatVersionError, "unknown version 3"),
])
def test_bad_group_records_are_refused_with_their_location(key, value, error, match):
    with pytest.raises(error, match=match) as info:
        decode_group_record(key, value, "__consumer_offsets-7")
    assert "__consumer_offsets-7" in str(info.value)


def test_offset_commit_records_are_not_group_records():
    key = json.dumps({"v": 1, "group": G, "topic": "t", "partition": 0}).encode()
    assert decode_group_record(key, b'{"v": 1, "offset": 3}', "loc") is None


def test_config_defaults_and_validation():
    c = GroupConfig()
    assert (c.group_min_session_timeout_ms, c.group_max_session_timeout_ms, c.group_max_size,
            c.group_initial_rebalance_delay_ms, c.offsets_topic_num_partitions) == (6000, 1_800_000, 2**31 - 1, 3000, 50)
    assert GroupConfig.from_properties({"group.initial.rebalance.delay.ms": "0", "other": 1}) == \
        GroupConfig(group_initial_rebalance_delay_ms=0)
    with pytest.raises(InvalidConfigError, match="group.max.size"):
        GroupConfig.from_properties({"group.max.size": 0})
    with pytest.raises(InvalidConfigError, match="Not a number"):
        GroupConfig.from_properties({"group.min.session.timeout.ms": "x"})
    with pytest.raises(InvalidConfigError, match="must not exceed"):
        GroupConfig(group_min_session_timeout_ms=10, group_max_session_timeout_ms=5)


def test_partition_for_is_the_offsets_partition(clock):
    assert make(clock).partition_for("my-group") == group_offsets.partition_for("my-group")


def test_append_errors_map_as_kafka():
    assert append_error_to_response_error(Errors.UNKNOWN_TOPIC_OR_PART) == Errors.COORDINATOR_NOT_AVAILABLE
    assert append_error_to_response_error(Errors.REQUEST_TIMED_OUT) == Errors.COORDINATOR_NOT_AVAILABLE
    assert append_error_to_response_error(Errors.NOT_LEADER_OR_FOLLOWER) == Errors.NOT_COORDINATOR
    assert append_error_to_response_error(Errors._FENCED) == Errors.NOT_COORDINATOR
    assert append_error_to_response_error(Errors.MESSAGE_TOO_LARGE) == Errors.UNKNOWN_SERVER_ERROR
    assert append_error_to_response_error(Errors.INVALID_RECORD) == Errors.INVALID_RECORD


# ---------------------------------------------------------------------------- JoinGroup / SyncGroup
def test_first_join_answers_member_id_required(clock):
    coord = make(clock)
    first = done(join(coord, client="client-a"))
    assert first == JoinGroupResult(Errors.MEMBER_ID_REQUIRED, "client-a-u1")
    group = coord.get_group(G)
    assert group.state is S.EMPTY and group.pending_members == {"client-a-u1"} and group.size == 0
    # the pending member joins with its id; a second one never comes back
    parked = join(coord, "client-a-u1", client="client-a")
    assert done(join(coord, client="client-b")).member_id == "client-b-u2"
    clock.advance(DELAY)
    coord.check_expirations()
    result = done(parked)
    assert (result.error, result.member_id, result.generation_id, result.leader_id) == \
        (Errors.NO_ERROR, "client-a-u1", 1, "client-a-u1")
    assert [m.member_id for m in result.members] == ["client-a-u1"]
    assert group.pending_members == {"client-b-u2"}
    clock.advance(SESSION - DELAY)  # the pending member's session timeout
    coord.check_expirations()
    assert group.pending_members == set()
    # an unknown member id for an unknown group
    assert done(join(coord, "ghost-1", group="other")).error == Errors.UNKNOWN_MEMBER_ID


def test_join_without_kip394_adds_the_member_at_once(clock):
    coord = make(clock)
    parked = join(coord, client="c", require_known_member_id=False)
    assert not parked.done() and coord.get_group(G).size == 1
    clock.advance(DELAY)
    coord.check_expirations()
    assert done(parked).member_id == "c-u1" and done(parked).generation_id == 1


def test_concurrent_joins_form_one_generation_with_one_leader(clock, log):
    coord = make(clock, log)
    registered: queue.Queue = queue.Queue()

    def consumer(client: str):
        first = coord.handle_join_group(G, "", "consumer", RANGE, SESSION, REBALANCE, client_id=client).result(5)
        assert first.error == Errors.MEMBER_ID_REQUIRED
        parked = coord.handle_join_group(G, first.member_id, "consumer", RANGE, SESSION, REBALANCE, client_id=client)
        registered.put(first.member_id)
        joined = parked.result(5)
        assignment = perform_assignment(RangeAssignor(), joined.members, PARTITIONS) if joined.is_leader else None
        synced = coord.handle_sync_group(G, joined.generation_id, joined.member_id, assignment).result(5)
        return joined, synced, assignment

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(consumer, f"client-{c}") for c in "abc"]
        member_ids = {registered.get(timeout=5) for _ in range(3)}
        group = coord.get_group(G)
        assert group.state is S.PREPARING_REBALANCE and group.num_members_awaiting_join == 3
        for _ in range(2):  # parked until the initial delay (extended once: others joined) passes
            assert not any(f.done() for f in futures)
            clock.advance(DELAY)
            coord.check_expirations()
        results = [f.result(10) for f in futures]
    assert {r[0].member_id for r in results} == member_ids
    assert sorted(int(m.rsplit("-u", 1)[1]) for m in member_ids) == [1, 2, 3]
    assert {r[0].generation_id for r in results} == {1}
    leaders = [r for r in results if r[0].is_leader]
    assert len(leaders) == 1 and {r[0].leader_id for r in results} == {leaders[0][0].member_id}
    assert sorted(m.member_id for m in leaders[0][0].members) == sorted(member_ids)
    assert all(r[0].members == () for r in results if not r[0].is_leader)
    computed = leaders[0][2]
    assert {r[0].member_id: r[1].assignment for r in results} == computed
    assert sorted(p for r in results for p in decode_assignment(r[1].assignment).partitions) == \
        [(TOPIC, p) for p in range(6)]
    assert group.state is S.STABLE and group.generation_id == 1
    # the generation's record holds every member's assignment
    record = log.values()[-1]
    assert record["generation"] == 1 and record["protocol"] == "range" and record["leader"] == leaders[0][0].member_id
    assert {m["member_id"]: m["assignment"] for m in record["members"]} == \
        {m: base64.b64encode(b).decode() for m, b in computed.items()}


def test_range_assignment_through_the_group(clock):
    members = form_group(make(clock), clock, [("client-a", None), ("client-b", None), ("client-c", None)])
    assert {c: (m.member_id, m.generation, m.leader, m.partitions) for c, m in members.items()} == {
        "client-a": ("client-a-u1", 1, "client-a-u1", ((TOPIC, 0), (TOPIC, 1))),
        "client-b": ("client-b-u2", 1, "client-a-u1", ((TOPIC, 2), (TOPIC, 3))),
        "client-c": ("client-c-u3", 1, "client-a-u1", ((TOPIC, 4), (TOPIC, 5))),
    }


def test_initial_rebalance_delay_is_extended_by_new_members_up_to_the_rebalance_timeout(clock):
    coord = make(clock)
    kw = dict(rebalance=250, require_known_member_id=False)
    a = join(coord, client="a", **kw)
    clock.advance(50)
    b = join(coord, client="b", **kw)
    clock.advance(50)  # T0+100: b joined meanwhile -> wait another 100 ms (150 of 250 left)
    coord.check_expirations()
    clock.advance(50)
    c = join(coord, client="c", **kw)
    clock.advance(50)  # T0+200: c joined -> wait min(100, 50 left) ms
    coord.check_expirations()
    assert not any(f.done() for f in (a, b, c))
    clock.advance(49)
    coord.check_expirations()
    assert not a.done()
    clock.advance(1)  # T0+250: the rebalance timeout is used up
    coord.check_expirations()
    assert [done(f).generation_id for f in (a, b, c)] == [1, 1, 1]
    assert done(a).leader_id == "a-u1" and len(done(a).members) == 3


def test_a_new_member_triggers_a_rebalance_and_heartbeats_answer_rebalance_in_progress(clock):
    coord = make(clock)
    members = form_group(coord, clock, [("client-a", None), ("client-b", None)])
    a, b = members["client-a"], members["client-b"]
    assert heartbeat(coord, a) == heartbeat(coord, b) == Errors.NO_ERROR
    first = done(join(coord, client="client-c"))
    newcomer = join(coord, first.member_id, client="client-c")
    group = coord.get_group(G)
    assert group.state is S.PREPARING_REBALANCE and group.generation_id == 1
    assert heartbeat(coord, a) == heartbeat(coord, b) == Errors.REBALANCE_IN_PROGRESS
    # a SyncGroup of the old generation is told to rejoin too
    assert done(coord.handle_sync_group(G, 1, a.member_id)).error == Errors.REBALANCE_IN_PROGRESS
    fa = rejoin(coord, a)
    assert not fa.done()
    fb = rejoin(coord, b)  # the last member rejoined: the join phase completes at once
    results = {c: done(f) for c, f in (("client-a", fa), ("client-b", fb), ("client-c", newcomer))}
    assert {c: (r.generation_id, r.leader_id) for c, r in results.items()} == \
        {c: (2, "client-a-u1") for c in results}
    assert group.state is S.COMPLETING_REBALANCE
    assert heartbeat(coord, a) == Errors.ILLEGAL_GENERATION
    assert heartbeat(coord, a, generation=2) == Errors.NO_ERROR
    synced = sync_all(coord, results, {c: None for c in results})
    assert [synced[c].partitions for c in ("client-a", "client-b", "client-c")] == \
        [((TOPIC, 0), (TOPIC, 1)), ((TOPIC, 2), (TOPIC, 3)), ((TOPIC, 4), (TOPIC, 5))]


def test_rejoins_in_a_stable_group(clock):
    coord = make(clock)
    members = form_group(coord, clock, [("client-a", None), ("client-b", None)])
    a, b = members["client-a"], members["client-b"]
    # a follower with unchanged metadata just gets the current generation back
    again = done(rejoin(coord, b))
    assert (again.error, again.generation_id, again.leader_id, again.members) == (Errors.NO_ERROR, 1, a.member_id, ())
    assert coord.get_group(G).state is S.STABLE
    # the leader rejoining forces a rebalance (its metadata may have changed)
    leader = rejoin(coord, a)
    assert coord.get_group(G).state is S.PREPARING_REBALANCE and not leader.done()
    fb = rejoin(coord, b)
    assert done(leader).generation_id == done(fb).generation_id == 2


def test_rejoin_during_completing_rebalance(clock):
    coord = make(clock)
    futures = {}
    for client in ("a", "b"):
        futures[client] = join(coord, client=client, require_known_member_id=False)
    settle(coord, clock, futures.values())
    a = done(futures["a"])
    # same metadata: the same answer again (it may have missed it)
    assert done(join(coord, a.member_id, client="a")) == a
    # other metadata: a new rebalance; a follower waiting for its assignment is told to rejoin
    waiting = coord.handle_sync_group(G, 1, done(futures["b"]).member_id)
    other = [("range", encode_subscription(Subscription((TOPIC, "more"))))]
    again = join(coord, a.member_id, client="a", protocols=other)
    assert done(waiting).error == Errors.REBALANCE_IN_PROGRESS
    assert coord.get_group(G).state is S.PREPARING_REBALANCE and not again.done()


def test_session_timeout_expiry_removes_the_member_and_rebalances(clock):
    coord = make(clock)
    members = form_group(coord, clock, [("client-a", None), ("client-b", None)])
    a, b = members["client-a"], members["client-b"]  # a leads
    clock.advance(SESSION - 1)
    assert heartbeat(coord, b) == Errors.NO_ERROR
    coord.check_expirations()
    assert coord.get_group(G).size == 2
    clock.advance(1)  # a's session ran out; b heartbeated 1 ms ago
    next_deadline = coord.check_expirations()
    group = coord.get_group(G)
    assert list(group.members) == [b.member_id] and group.leader_id == b.member_id
    assert group.state is S.PREPARING_REBALANCE
    assert next_deadline == clock.now - 1 + SESSION  # b's session; the join phase ends at now + REBALANCE
    assert heartbeat(coord, a) == Errors.UNKNOWN_MEMBER_ID
    assert heartbeat(coord, b) == Errors.REBALANCE_IN_PROGRESS
    result = done(rejoin(coord, b))
    assert (result.generation_id, result.leader_id, [m.member_id for m in result.members]) == \
        (2, b.member_id, [b.member_id])


def test_a_valid_commit_counts_as_a_heartbeat(clock):
    coord = make(clock)
    members = form_group(coord, clock, [("client-a", None), ("client-b", None)])
    a = members["client-a"]
    clock.advance(SESSION - 1)
    assert coord.validate_offset_commit(G, 1, a.member_id) == Errors.NO_ERROR
    assert heartbeat(coord, members["client-b"]) == Errors.NO_ERROR
    clock.advance(SESSION - 1)
    coord.check_expirations()
    assert coord.get_group(G).size == 2
    # a transactional commit does not (Kafka reschedules only for OffsetCommit)
    assert coord.validate_offset_commit(G, 1, a.member_id, is_transactional=True) == Errors.NO_ERROR
    assert heartbeat(coord, members["client-b"]) == Errors.NO_ERROR
    clock.advance(1)
    coord.check_expirations()
    assert list(coord.get_group(G).members) == [members["client-b"].member_id]


def test_rebalance_timeout_removes_dynamic_members_that_did_not_rejoin_but_keeps_static_ones(clock):
    coord = make(clock)
    members = form_group(coord, clock, [("a", None), ("b", None), ("s", "static-s")])
    a, b, s = members["a"], members["b"], members["s"]
    first = done(join(coord, client="c"))
    fc = join(coord, first.member_id, client="c")
    fa = rejoin(coord, a)
    for _ in range(2):  # b and s keep their sessions alive but do not rejoin
        clock.advance(REBALANCE // 2 - 1)
        assert heartbeat(coord, b) == heartbeat(coord, s) == Errors.REBALANCE_IN_PROGRESS
        coord.check_expirations()
    assert not fa.done()
    clock.advance(2)
    coord.check_expirations()
    group = coord.get_group(G)
    assert sorted(group.members) == sorted([a.member_id, first.member_id, s.member_id])
    assert done(fa).generation_id == done(fc).generation_id == 2
    assert heartbeat(coord, b) == Errors.UNKNOWN_MEMBER_ID
    assert heartbeat(coord, s) == Errors.ILLEGAL_GENERATION  # still a member: it must rejoin
    # the leader assigns to the static member too; it rejoins and fetches its assignment
    leader_join = done(fa)
    assert {m.member_id for m in leader_join.members} == set(group.members)
    fs_sync_later = coord.handle_sync_group(G, 2, first.member_id)
    done(coord.handle_sync_group(G, 2, a.member_id, perform_assignment(RangeAssignor(), leader_join.members,
                                                                       PARTITIONS)))
    assert done(fs_sync_later).error == Errors.NO_ERROR
    s_join = done(rejoin(coord, s))
    assert (s_join.error, s_join.generation_id) == (Errors.NO_ERROR, 2)
    s_sync = done(coord.handle_sync_group(G, 2, s.member_id, group_instance_id="static-s"))
    assert decode_assignment(s_sync.assignment).partitions  # static members sort first: a range of its own


def test_members_that_do_not_sync_in_time_are_removed(clock):
    coord = make(clock)
    # sessions longer than the rebalance timeout: only the missing SyncGroup can remove b
    futures = {c: join(coord, client=c, require_known_member_id=False, session=2 * REBALANCE) for c in ("a", "b")}
    settle(coord, clock, futures.values())
    a, b = done(futures["a"]), done(futures["b"])
    assert a.is_leader
    done(coord.handle_sync_group(G, 1, a.member_id, perform_assignment(RangeAssignor(), a.members, PARTITIONS)))
    assert coord.get_group(G).state is S.STABLE
    clock.advance(REBALANCE - 1)
    assert coord.handle_heartbeat(G, 1, b.member_id) == Errors.NO_ERROR  # alive, yet no SyncGroup
    coord.check_expirations()
    clock.advance(1)
    coord.check_expirations()
    group = coord.get_group(G)
    assert list(group.members) == [a.member_id] and group.state is S.PREPARING_REBALANCE
    assert coord.handle_heartbeat(G, 1, b.member_id) == Errors.UNKNOWN_MEMBER_ID


def test_a_failed_assignment_write_is_answered_and_the_group_rebalances(clock, log):
    coord = make(clock, log)
    futures = {c: join(coord, client=c, require_known_member_id=False) for c in ("a", "b")}
    settle(coord, clock, futures.values())
    a, b = done(futures["a"]), done(futures["b"])
    follower = coord.handle_sync_group(G, 1, b.member_id)
    log.fail_with = Errors.NOT_LEADER_OR_FOLLOWER
    leader = coord.handle_sync_group(G, 1, a.member_id, perform_assignment(RangeAssignor(), a.members, PARTITIONS))
    assert done(leader) == done(follower) == type(done(leader))(Errors.NOT_COORDINATOR)
    assert coord.get_group(G).state is S.PREPARING_REBALANCE
    assert coord.handle_heartbeat(G, 1, a.member_id) == Errors.REBALANCE_IN_PROGRESS
    assert log.records == []


# ---------------------------------------------------------------------------- error answers
def test_join_errors(clock):
    coord = make(clock)
    assert done(join(coord, group="")).error == Errors.INVALID_GROUP_ID
    assert done(join(coord, session=5999)).error == Errors.INVALID_SESSION_TIMEOUT
    assert done(join(coord, session=1_800_001)).error == Errors.INVALID_SESSION_TIMEOUT
    assert done(join(coord, protocols=[])).error == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert done(join(coord, protocol_type="")).error == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert coord.get_group(G) is None  # a refused first JoinGroup leaves no group behind
    members = form_group(coord, clock, [("a", None), ("b", None)])
    # another protocol type, or no protocol in common with every member
    assert done(join(coord, protocol_type="connect")) == JoinGroupResult(Errors.INCONSISTENT_GROUP_PROTOCOL, "")
    rr = [("roundrobin", encode_subscription(Subscription((TOPIC,))))]
    assert done(join(coord, protocols=rr)).error == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert done(rejoin(coord, members["a"], protocols=rr)) == \
        JoinGroupResult(Errors.INCONSISTENT_GROUP_PROTOCOL, members["a"].member_id)
    assert done(join(coord, "a-u99")).error == Errors.UNKNOWN_MEMBER_ID



def test_group_max_size(clock):
    coord = make(clock, group_max_size=2)
    form_group(coord, clock, [("a", None), ("b", None)])
    # checked before anything else: a third member is refused
    assert done(join(coord, client="c", require_known_member_id=False)) == \
        JoinGroupResult(Errors.GROUP_MAX_SIZE_REACHED, "")
    assert done(join(coord, client="c", protocol_type="connect")).error == Errors.GROUP_MAX_SIZE_REACHED
    assert coord.get_group(G).size == 2


def test_heartbeat_errors(clock):
    coord = make(clock)
    members = form_group(coord, clock, [("a", None), ("s", "static-s")])
    a, s = members["a"], members["s"]
    assert coord.handle_heartbeat("", 1, a.member_id) == Errors.INVALID_GROUP_ID
    assert coord.handle_heartbeat("other", 1, a.member_id) == Errors.UNKNOWN_MEMBER_ID
    assert coord.handle_heartbeat(G, 1, "nobody") == Errors.UNKNOWN_MEMBER_ID
    assert coord.handle_heartbeat(G, 0, a.member_id) == Errors.ILLEGAL_GENERATION
    assert coord.handle_heartbeat(G, 2, a.member_id) == Errors.ILLEGAL_GENERATION
    assert coord.handle_heartbeat(G, 1, a.member_id, "static-s") == Errors.FENCED_INSTANCE_ID
    assert coord.handle_heartbeat(G, 1, s.member_id, "static-other") == Errors.UNKNOWN_MEMBER_ID
    assert coord.handle_heartbeat(G, 1, s.member_id, "static-s") == Errors.NO_ERROR


def test_sync_errors(clock):
    coord = make(clock)
    members = form_group(coord, clock, [("a", None), ("s", "static-s")])
    a = members["a"]

    def sync(group=G, generation=1, member_id=a.member_id, **kw):
        return done(coord.handle_sync_group(group, generation, member_id, **kw)).error

    assert sync(group="") == Errors.INVALID_GROUP_ID
    assert sync(group="other") == Errors.UNKNOWN_MEMBER_ID
    assert sync(member_id="nobody") == Errors.UNKNOWN_MEMBER_ID
    assert sync(generation=2) == Errors.ILLEGAL_GENERATION
    assert sync(group_instance_id="static-s") == Errors.FENCED_INSTANCE_ID
    assert sync(protocol_type="connect") == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert sync(protocol_name="roundrobin") == Errors.INCONSISTENT_GROUP_PROTOCOL
    assert sync(protocol_type="consumer", protocol_name="range") == Errors.NO_ERROR
    # in a Stable group the current assignment is answered
    stable = done(coord.handle_sync_group(G, 1, a.member_id))
    assert decode_assignment(stable.assignment).partitions == a.partitions


def test_offset_commit_validation(clock):
    """Kafka's ClassicGroup.validateOffsetCommit, plain and transactional (KIP-447)."""
    coord = make(clock)
    v = coord.validate_offset_commit
    # no group yet: only commits outside group management (generation -1)
    assert v(G, -1, "") == Errors.NO_ERROR
    assert v(G, -1, "", is_transactional=True) == Errors.NO_ERROR
    assert v(G, 1, "m") == Errors.ILLEGAL_GENERATION
    assert v(G, 1, "m", is_transactional=True) == Errors.ILLEGAL_GENERATION
    assert v("", -1, "") == Errors.NO_ERROR  # the empty group id is valid for OffsetCommit
    assert v("", -1, "", is_transactional=True) == Errors.INVALID_GROUP_ID
    members = form_group(coord, clock, [("a", None), ("s", "static-s")])
    a, s = members["a"], members["s"]
    for txn in (False, True):
        assert v(G, 1, a.member_id, is_transactional=txn) == Errors.NO_ERROR
        assert v(G, 1, s.member_id, "static-s", is_transactional=txn) == Errors.NO_ERROR
        assert v(G, 0, a.member_id, is_transactional=txn) == Errors.ILLEGAL_GENERATION
        assert v(G, 1, "nobody", is_transactional=txn) == Errors.UNKNOWN_MEMBER_ID
        assert v(G, 1, a.member_id, "static-s", is_transactional=txn) == Errors.FENCED_INSTANCE_ID
        assert v(G, -1, a.member_id, is_transactional=txn) == Errors.ILLEGAL_GENERATION
    # generation -1 without a member while the group has members
    assert v(G, -1, "") == Errors.UNKNOWN_MEMBER_ID
    assert v(G, -1, "", is_transactional=True) == Errors.NO_ERROR
    # CompletingRebalance: a plain commit must wait for the assignment; a transactional one may go on
    fa, fs = rejoin(coord, a), rejoin(coord, s)
    assert done(fa).generation_id == done(fs).generation_id == 2
    assert coord.get_group(G).state is S.COMPLETING_REBALANCE
    assert v(G, 2, a.member_id) == Errors.REBALANCE_IN_PROGRESS
    assert v(G, 2, a.member_id, is_transactional=True) == Errors.NO_ERROR
    assert v(G, 1, a.member_id, is_transactional=True) == Errors.ILLEGAL_GENERATION  # a zombie's old generation
    # Empty again: generation -1 is fine
    coord.handle_leave_group(G, [MemberIdentity(a.member_id), MemberIdentity(s.member_id, "static-s")])
    assert coord.get_group(G).state is S.EMPTY
    assert v(G, -1, "") == Errors.NO_ERROR
    assert v(G, 2, a.member_id) == Errors.UNKNOWN_MEMBER_ID


# ---------------------------------------------------------------------------- LeaveGroup
def test_leave_group_batch(clock):
    coord = make(clock)
    members = form_group(coord, clock, [("a", None), ("b", None), ("s", "static-s"), ("t", "static-t")])
    a, b, t = members["a"], members["b"], members["t"]
    result = coord.handle_leave_group(G, [
        MemberIdentity(a.member_id, reason="closing"),
        MemberIdentity("", "static-s"),           # an administrator removes a static member by instance id
        MemberIdentity("nobody"),
        MemberIdentity("", "static-unknown"),
        MemberIdentity(b.member_id, "static-t"),   # the instance id belongs to another member id
    ])
    assert result.error == Errors.NO_ERROR
    assert [(r.member_id, r.group_instance_id, r.error) for r in result.members] == [
        (a.member_id, None, Errors.NO_ERROR), ("", "static-s", Errors.NO_ERROR),
        ("nobody", None, Errors.UNKNOWN_MEMBER_ID), ("", "static-unknown", Errors.UNKNOWN_MEMBER_ID),
        (b.member_id, "static-t", Errors.FENCED_INSTANCE_ID)]
    group = coord.get_group(G)
    assert sorted(group.members) == sorted([b.member_id, t.member_id]) and group.static_members == {"static-t":
                                                                                                   t.member_id}
    assert group.state is S.PREPARING_REBALANCE
    fb, ft = rejoin(coord, b), rejoin(coord, t)
    assert done(fb).generation_id == done(ft).generation_id == 2
    assert done(fb).leader_id == b.member_id  # the leader left: the first remaining member leads
    assert coord.handle_leave_group("other", [MemberIdentity("x")]).error == Errors.UNKNOWN_MEMBER_ID
    assert coord.handle_leave_group("", [MemberIdentity("x")]).error == Errors.INVALID_GROUP_ID


def test_last_members_leaving_empty_the_group_and_write_it(clock, log):
    coord = make(clock, log)
    members = form_group(coord, clock, [("a", None)])
    result = coord.handle_leave_group(G, [MemberIdentity(members["a"].member_id)])
    assert result.members[0].error == Errors.NO_ERROR
    group = coord.get_group(G)
    assert (group.state, group.generation_id, group.protocol_name) == (S.EMPTY, 2, None)
    empty = log.values()[-1]
    assert (empty["generation"], empty["members"], empty["protocol"]) == (2, [], None)


def test_leaving_while_parked_answers_the_parked_request(clock):
    coord = make(clock)
    parked = join(coord, client="a", require_known_member_id=False)
    member_id = coord.get_group(G).leader_id
    assert coord.handle_leave_group(G, [MemberIdentity(member_id)]).members[0].error == Errors.NO_ERROR
    assert done(parked) == JoinGroupResult(Errors.UNKNOWN_MEMBER_ID, "")
    pending = done(join(coord, client="b"))
    assert coord.handle_leave_group(G, [MemberIdentity(pending.member_id)]).members[0].error == Errors.NO_ERROR
    assert coord.get_group(G).pending_members == set()


# ---------------------------------------------------------------------------- static membership
def test_static_member_restart_gets_its_assignment_back_without_rebalance(clock, log):
    coord = make(clock, log)
    members = form_group(coord, clock, [("one", "static-1"), ("two", "static-2")])
    one, two = members["one"], members["two"]
    assert (one.member_id, two.member_id, one.leader) == ("static-1-u1", "static-2-u2", "static-1-u1")
    records = len(log.records)
    # "two" restarts: it knows its instance id only
    again = done(join(coord, client="two", instance="static-2"))
    assert (again.error, again.member_id, again.generation_id, again.leader_id, again.skip_assignment,
            again.members) == (Errors.NO_ERROR, "static-2-u3", 1, "static-1-u1", False, ())
    group = coord.get_group(G)
    assert (group.state, group.generation_id) == (S.STABLE, 1)
    assert group.static_members == {"static-1": "static-1-u1", "static-2": "static-2-u3"}
    synced = done(coord.handle_sync_group(G, 1, "static-2-u3", group_instance_id="static-2"))
    assert decode_assignment(synced.assignment).partitions == two.partitions
    # the group record now names the new member id
    assert len(log.records) == records + 1
    assert [m["member_id"] for m in log.values()[-1]["members"]] == ["static-1-u1", "static-2-u3"]
    # the old instance is fenced everywhere
    assert coord.handle_heartbeat(G, 1, "static-2-u2", "static-2") == Errors.FENCED_INSTANCE_ID
    assert done(coord.handle_sync_group(G, 1, "static-2-u2", group_instance_id="static-2")).error == \
        Errors.FENCED_INSTANCE_ID
    assert coord.validate_offset_commit(G, 1, "static-2-u2", "static-2", is_transactional=True) == \
        Errors.FENCED_INSTANCE_ID
    assert done(join(coord, "static-2-u2", instance="static-2")).error == Errors.FENCED_INSTANCE_ID
    assert coord.handle_leave_group(G, [MemberIdentity("static-2-u2", "static-2")]).members[0].error == \
        Errors.FENCED_INSTANCE_ID
    assert coord.handle_heartbeat(G, 1, "static-2-u2") == Errors.UNKNOWN_MEMBER_ID
    assert coord.handle_heartbeat(G, 1, "static-1-u1", "static-1") == Errors.NO_ERROR


def test_static_leader_restart_skips_the_assignment(clock):
    coord = make(clock)
    members = form_group(coord, clock, [("one", "static-1"), ("two", "static-2")])
    again = done(join(coord, client="one", instance="static-1"))
    assert (again.member_id, again.leader_id, again.skip_assignment) == ("static-1-u3", "static-1-u3", True)
    assert sorted(m.member_id for m in again.members) == ["static-1-u3", "static-2-u2"]
    synced = done(coord.handle_sync_group(G, 1, "static-1-u3", {}, group_instance_id="static-1"))
    assert decode_assignment(synced.assignment).partitions == members["one"].partitions
    assert coord.get_group(G).state is S.STABLE
    # before JoinGroup v9 the old leader id is named so the member does not run the assignor
    old = done(join(coord, client="one", instance="static-1", supports_skip_assignment=False))
    assert (old.member_id, old.leader_id, old.skip_assignment) == ("static-1-u4", "static-1-u3", False)


def test_static_restart_that_changes_the_selected_protocol_rebalances(clock):
    coord = make(clock)
    both = RANGE + [("roundrobin", encode_subscription(Subscription((TOPIC,))))]
    parked = join(coord, client="one", instance="static-1", protocols=both)
    clock.advance(DELAY)
    coord.check_expirations()
    first = done(parked)
    assert first.protocol_name == "range"
    done(coord.handle_sync_group(G, 1, first.member_id, {}, group_instance_id="static-1"))
    again = done(join(coord, client="one", instance="static-1", protocols=list(reversed(both))))
    assert (again.generation_id, again.protocol_name, again.member_id) == (2, "roundrobin", "static-1-u2")


def test_failed_static_member_write_reverts_to_the_old_member_id(clock, log):
    coord = make(clock, log)
    form_group(coord, clock, [("one", "static-1"), ("two", "static-2")])
    log.fail_with = Errors.REQUEST_TIMED_OUT
    again = done(join(coord, client="two", instance="static-2"))
    assert (again.error, again.member_id) == (Errors.COORDINATOR_NOT_AVAILABLE, "")
    assert coord.get_group(G).static_members["static-2"] == "static-2-u2"
    assert coord.handle_heartbeat(G, 1, "static-2-u2", "static-2") == Errors.NO_ERROR


def test_static_member_rejoining_during_completing_rebalance_restarts_the_rebalance(clock):
    coord = make(clock)
    futures = {c: join(coord, client=c, instance=f"static-{c}") for c in ("a", "b")}
    settle(coord, clock, futures.values())
    waiting = coord.handle_sync_group(G, 1, done(futures["b"]).member_id, group_instance_id="static-b")
    restarted = join(coord, client="b", instance="static-b")
    assert done(waiting).error == Errors.FENCED_INSTANCE_ID  # the old member id is fenced at once
    assert coord.get_group(G).state is S.PREPARING_REBALANCE and not restarted.done()
    fa = join(coord, done(futures["a"]).member_id, client="a", instance="static-a")
    assert done(fa).generation_id == done(restarted).generation_id == 2


# ---------------------------------------------------------------------------- describe / list / delete
def test_describe_and_list_groups(clock):
    coord = make(clock)
    members = form_group(coord, clock, [("a", None), ("s", "static-s")])
    (desc,) = coord.handle_describe_groups([G])
    assert (desc.error, desc.state, desc.protocol_type, desc.protocol, desc.generation_id, desc.leader_id) == \
        (Errors.NO_ERROR, "Stable", "consumer", "range", 1, members["a"].member_id)
    assert [(m.member_id, m.group_instance_id, m.client_id, decode_assignment(m.assignment).partitions)
            for m in desc.members] == [(members[c].member_id, members[c].instance, c, members[c].partitions)
                                       for c in ("a", "s")]
    assert desc.members[0].metadata == RANGE[0][1]
    (unknown,) = coord.handle_describe_groups(["nope"])
    assert (unknown.error, unknown.state, unknown.members) == (Errors.NO_ERROR, "Dead", ())
    join(coord, "x", group="other")  # refused: creates nothing
    join(coord, client="c", group="other", require_known_member_id=False)
    (rebalancing,) = coord.handle_describe_groups(["other"])
    assert (rebalancing.state, rebalancing.protocol, rebalancing.members[0].metadata) == ("PreparingRebalance", "", b"")
    assert coord.handle_list_groups() == (Errors.NO_ERROR, [
        type(coord.get_group(G).overview())("group", "consumer", "Stable"),
        type(coord.get_group(G).overview())("other", "consumer", "PreparingRebalance")])
    assert [o.group_id for o in coord.handle_list_groups(["preparingrebalance"])[1]] == ["other"]


def test_delete_groups(clock, log):
    coord = make(clock, log)
    members = form_group(coord, clock, [("a", None)])
    assert coord.handle_delete_groups([G, "nope"]) == {G: Errors.NON_EMPTY_GROUP, "nope": Errors.GROUP_ID_NOT_FOUND}
    coord.handle_leave_group(G, [MemberIdentity(members["a"].member_id)])
    assert coord.handle_delete_groups([G]) == {G: Errors.NO_ERROR}
    assert log.records[-1] == (G, group_metadata_key(G), None)  # the tombstone
    assert coord.get_group(G) is None
    assert coord.handle_describe_groups([G])[0].state == "Dead"
    assert coord.handle_delete_groups([G]) == {G: Errors.GROUP_ID_NOT_FOUND}
    restarted = make(clock)
    assert restarted.load(log.replay()) == 0 and restarted.get_group(G) is None
    # a failed tombstone is answered with the mapped error
    form = make(clock, log)
    form_group(form, clock, [("b", None)])
    form.handle_leave_group(G, [MemberIdentity(form.get_group(G).leader_id)])
    log.fail_with = Errors.NOT_LEADER_OR_FOLLOWER
    assert form.handle_delete_groups([G]) == {G: Errors.NOT_COORDINATOR}


# ---------------------------------------------------------------------------- persistence
def test_replay_after_restart_restores_groups_members_and_assignments(clock, log):
    coord = make(clock, log)
    members = form_group(coord, clock, [("a", None), ("b", "static-b"), ("c", None)])
    coord.handle_leave_group(G, [MemberIdentity(members["c"].member_id)])  # PreparingRebalance, not written
    fa, fb = rejoin(coord, members["a"]), rejoin(coord, members["b"])
    joins = {"a": done(fa), "b": done(fb)}
    members = sync_all(coord, joins, {"a": None, "b": "static-b"})
    before = coord.handle_describe_groups([G])[0]
    assert before.generation_id == 2
    # another group, deleted; and an offset commit in the same partition
    other = [(group_metadata_key("gone"), b'{"v":1,"protocol_type":"consumer","generation":4,"protocol":null,'
                                          b'"leader":null,"current_state_timestamp":1,"members":[]}'),
             (json.dumps({"v": 1, "group": G, "topic": TOPIC, "partition": 0}).encode(), b'{"v":1,"offset":5}'),
             (group_metadata_key("gone"), None)]
    coord.shutdown()

    clock.advance(1000)
    restarted = make(clock)
    assert restarted.load(log.replay() + other, "__consumer_offsets-12") == 1
    after = restarted.handle_describe_groups([G])[0]
    assert after == before
    group = restarted.get_group(G)
    assert (group.state, group.generation_id, group.leader_id, group.protocol_name) == \
        (S.STABLE, 2, members["a"].member_id, "range")
    assert group.static_members == {"static-b": members["b"].member_id}
    assert restarted.get_group("gone") is None
    # members go on with their generation; their sessions started at the load
    a, b = members["a"], members["b"]
    assert heartbeat(restarted, a) == Errors.NO_ERROR
    synced = done(restarted.handle_sync_group(G, 2, b.member_id, group_instance_id="static-b"))
    assert decode_assignment(synced.assignment).partitions == b.partitions
    assert restarted.validate_offset_commit(G, 2, b.member_id, "static-b", is_transactional=True) == Errors.NO_ERROR
    assert restarted.validate_offset_commit(G, 1, b.member_id, "static-b", is_transactional=True) == \
        Errors.ILLEGAL_GENERATION
    clock.advance(SESSION - 1)
    assert heartbeat(restarted, a) == Errors.NO_ERROR
    clock.advance(SESSION - 1)
    restarted.check_expirations()  # b synced at the load + 0 and has not heartbeated since
    assert list(restarted.get_group(G).members) == [a.member_id]
    assert heartbeat(restarted, a) == Errors.REBALANCE_IN_PROGRESS


def test_loaded_members_that_never_come_back_expire(clock, log):
    coord = make(clock, log)
    form_group(coord, clock, [("a", None)])
    restarted = make(clock)
    restarted.load(log.replay())
    clock.advance(SESSION - 1)
    restarted.check_expirations()
    group = restarted.get_group(G)
    assert (group.state, group.size) == (S.STABLE, 1)
    clock.advance(1)  # the last member is gone: nobody to wait for, the group is Empty at once
    restarted.check_expirations()
    assert (group.state, group.generation_id, group.size) == (S.EMPTY, 2, 0)


def test_requests_while_loading(clock, log):
    coord = make(clock, log)
    form_group(coord, clock, [("a", None)])
    restarted = make(clock)
    seen = {}

    def records():
        seen["join"] = done(join(restarted, client="x")).error
        seen["sync"] = done(restarted.handle_sync_group(G, 1, "a-u1")).error
        seen["heartbeat"] = restarted.handle_heartbeat(G, 1, "a-u1")
        seen["leave"] = restarted.handle_leave_group(G, [MemberIdentity("a-u1")]).error
        seen["commit"] = restarted.validate_offset_commit(G, 1, "a-u1")
        seen["list"] = restarted.handle_list_groups()[0]
        yield from log.replay()

    restarted.load(records())
    assert seen == {"join": Errors.COORDINATOR_LOAD_IN_PROGRESS, "sync": Errors.REBALANCE_IN_PROGRESS,
                    "heartbeat": Errors.NO_ERROR, "leave": Errors.COORDINATOR_LOAD_IN_PROGRESS,
                    "commit": Errors.COORDINATOR_LOAD_IN_PROGRESS, "list": Errors.COORDINATOR_LOAD_IN_PROGRESS}
    assert restarted.handle_heartbeat(G, 1, "a-u1") == Errors.NO_ERROR


def test_corrupt_group_record_fails_the_load(clock):
    coord = make(clock)
    with pytest.raises(CorruptObjectError, match="__consumer_offsets-3"):
        coord.load([(group_metadata_key(G), b"{oops")], "__consumer_offsets-3")
    assert coord.handle_heartbeat(G, 1, "m") == Errors.UNKNOWN_MEMBER_ID  # no longer loading


# ---------------------------------------------------------------------------- lifecycle
def test_shutdown_answers_parked_requests(clock):
    coord = make(clock)
    parked = join(coord, client="a", require_known_member_id=False)
    coord.shutdown()
    assert done(parked).error == Errors.NOT_COORDINATOR
    assert done(join(coord, client="b")).error == Errors.COORDINATOR_NOT_AVAILABLE
    assert coord.handle_heartbeat(G, 1, "a-u1") == Errors.COORDINATOR_NOT_AVAILABLE
    assert coord.handle_list_groups() == (Errors.COORDINATOR_NOT_AVAILABLE, [])


def test_the_scheduler_thread_fires_deadlines_on_its_own():
    coord = GroupCoordinator(config=GroupConfig(group_initial_rebalance_delay_ms=20))
    coord.startup()
    try:
        result = join(coord, client="a", require_known_member_id=False).result(timeout=5)
        assert (result.error, result.generation_id) == (Errors.NO_ERROR, 1)
    finally:
        coord.shutdown()


def test_done_callbacks_may_call_the_coordinator(clock):
    coord = make(clock)
    seen = []
    parked = join(coord, client="a", require_known_member_id=False)
    parked.add_done_callback(lambda f: seen.append(coord.handle_heartbeat(G, f.result().generation_id,
                                                                          f.result().member_id)))
    clock.advance(DELAY)
    coord.check_expirations()
    assert seen == [Errors.NO_ERROR]
