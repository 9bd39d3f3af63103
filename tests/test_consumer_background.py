"""The consumer runs the group protocol on a background thread (librdkafka's cgrp model):
``poll``/``consume``/``close`` return within their timeouts whatever the group is doing, and
the rebalance callbacks run inside them, in the application's thread.

Before, ``poll()`` ran JoinGroup/SyncGroup itself and waited up to ``max.poll.interval.ms +
session.timeout.ms`` (about 305 s with the defaults used here) for the other members to
rejoin: two consumers of one group polled in turn from one thread deadlocked. Each scenario
runs in an "application" thread of its own that the test joins with a deadline, so the old
code fails the test instead of hanging the suite.

Every consumer has its own ``client.id`` ("a", "b"), so the member ids sort in that order and
the assignors' splits are exact; records are ``p<partition>-<i>`` at offset i.
"""

from __future__ import annotations

import threading
import time

import pytest

from txlake import Consumer
from txlake.engine.group_metadata import GroupState
from test_groups import GROUP, Env, backend, env  # noqa: F401  (backend, env: the fixtures)

#: the whole scenario must end within this (the old code blocked ~305 s in one poll)
SCENARIO_BOUND_S = 30
#: a poll(0.5) or a close() may take this long at most: the behaviour under test, generous slack
CALL_BOUND_S = 2.0
#: two consumers polled in turn must have split the topic within this
SPLIT_BOUND_S = 10.0
ALL = [0, 1, 2, 3, 4, 5]


class App:
    """One consumer of the application: what it consumed, and every rebalance callback as
    ``(kind, partitions, generation of consumer_group_metadata() in the callback)`` with the
    thread it ran in. Defaults: librdkafka's ``max.poll.interval.ms`` (300000) and an
    auto-commit that only commits before a revocation and on close (its interval is a minute)."""

    def __init__(self, env: Env, name: str, **conf):
        self.name = name
        self.consumer = Consumer({**env.conf, "group.id": GROUP, "client.id": name, "session.timeout.ms": 6000,
                                  "heartbeat.interval.ms": 50, "auto.offset.reset": "earliest",
                                  "enable.auto.commit": True, "auto.commit.interval.ms": 60_000, **conf})
        self.events: list[tuple[str, list[int], int]] = []
        self.threads: set[int] = set()
        self.records: list[tuple[int, int, str]] = []

    def subscribe(self) -> None:
        self.consumer.subscribe(["t"], on_assign=self._callback("assign"), on_revoke=self._callback("revoke"),
                                on_lost=self._callback("lost"))

    def _callback(self, kind: str):
        def record(consumer, partitions):
            self.threads.add(threading.get_ident())
            self.events.append((kind, sorted(tp.partition for tp in partitions),
                                consumer.consumer_group_metadata().generation_id))
        return record

    def poll(self, timeout: float) -> float:
        """One poll; returns how long it took (s)."""
        start = time.monotonic()
        msg = self.consumer.poll(timeout)
        took = time.monotonic() - start
        if msg is not None:
            assert msg.error() is None, msg.error()
            self.records.append((msg.partition(), msg.offset(), msg.value().decode()))
        return took

    def partitions(self) -> list[int]:
        return sorted(tp.partition for tp in self.consumer.assignment())

    def member_id(self) -> str:
        return self.consumer.consumer_group_metadata().member_id

    def close(self) -> float:
        """close(); returns how long it took (s)."""
        start = time.monotonic()
        self.consumer.close()
        return time.monotonic() - start


def in_turn(apps: list[App], done, what: str, timeout: float = SPLIT_BOUND_S) -> float:
    """Poll the consumers one after the other (poll(0.05) each) from this one thread until
    ``done()``; returns how long it took (s)."""
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what} did not happen within {timeout} s of polling in turn")
        for app in apps:
            app.poll(0.05)
    return time.monotonic() - start


def run_bounded(scenario) -> None:
    """Run ``scenario(progress)`` in an application thread; fail if it is still running after
    :data:`SCENARIO_BOUND_S` (naming the last step it reached), re-raise what it raised."""
    progress: list[str] = ["started"]
    failure: list[BaseException] = []

    def run() -> None:
        try:
            scenario(progress)
        except BaseException as exc:  # handed to the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="application", daemon=True)
    thread.start()
    thread.join(SCENARIO_BOUND_S)
    if thread.is_alive():
        pytest.fail(f"the application thread is still blocked after {SCENARIO_BOUND_S} s, in: {progress[-1]}")
    if failure:
        raise failure[0]


def described(env: Env) -> tuple[str, list[str]]:
    """The group's DescribeGroups: its state and its member ids, sorted."""
    (description,) = env.broker.group_coordinator().handle_describe_groups([GROUP])
    return description.state, sorted(m.member_id for m in description.members)


def group_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("txlake-cgrp-"))


def records(partitions: list[int], offsets: range) -> list[tuple[int, int, str]]:
    return [(p, i, f"p{p}-{i}") for p in partitions for i in offsets]


# ---------------------------------------------------------------------------- polled in turn
#: (a's partitions, b's partitions) once b joined, as the assignor decides
SPLITS = {"range": ([0, 1, 2], [3, 4, 5]), "roundrobin": ([0, 2, 4], [1, 3, 5]),
          "cooperative-sticky": ([0, 1, 2], [3, 4, 5])}


def expected_callbacks(strategy: str) -> tuple[list, list]:
    """a's and b's callbacks ``(kind, partitions, generation)``, from a's first join to both closes."""
    mine, yours = SPLITS[strategy]
    if strategy == "cooperative-sticky":
        # KIP-429: generation 2 takes 3-5 from a (a keeps 0-2), generation 3 gives them to b
        return ([("assign", ALL, 1), ("revoke", [3, 4, 5], 2), ("assign", [], 2), ("assign", [], 3),
                 ("revoke", mine, 3)],
                [("assign", [], 2), ("assign", yours, 3), ("revoke", yours, 3)])
    # EAGER: a revokes everything before it rejoins
    return ([("assign", ALL, 1), ("revoke", ALL, 1), ("assign", mine, 2), ("revoke", mine, 2)],
            [("assign", yours, 2), ("revoke", yours, 2)])


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_two_consumers_polled_in_turn_from_one_thread_split_the_topic(env, strategy):
    env.topic("t", 6, records=5)
    a = App(env, "a", **{"partition.assignment.strategy": strategy})
    b = App(env, "b", **{"partition.assignment.strategy": strategy})
    took: dict[str, float] = {}
    app_thread: list[int] = []

    def scenario(progress: list[str]) -> None:
        app_thread.append(threading.get_ident())
        progress.append("a reads the topic alone")
        a.subscribe()
        in_turn([a], lambda: len(a.records) == 30, "a reading 30 records")
        progress.append("b joins; a and b polled in turn")
        b.subscribe()
        group = env.group()
        took["split"] = in_turn([a, b], lambda: (a.partitions(), b.partitions()) == SPLITS[strategy]
                                and group.is_in(GroupState.STABLE), "the split")
        progress.append("the new records, polled in turn")
        env.produce("t", {p: range(5, 10) for p in range(6)})
        in_turn([a, b], lambda: len(a.records) + len(b.records) == 60, "reading the 30 new records")
        for _ in range(5):          # nothing more comes, in particular no record twice
            a.poll(0.05)
            b.poll(0.05)
        progress.append("closing")
        took["close a"], took["close b"] = a.close(), b.close()

    run_bounded(scenario)
    assert took["split"] < SPLIT_BOUND_S
    mine, yours = SPLITS[strategy]
    # every record once across the two consumers: a read 0-4 everywhere, then 5-9 of its
    # partitions; b started at what a committed before its revocation
    assert sorted(a.records) == sorted(records(ALL, range(5)) + records(mine, range(5, 10)))
    assert sorted(b.records) == records(yours, range(5, 10))
    assert (a.events, b.events) == expected_callbacks(strategy)
    assert a.threads == b.threads == {app_thread[0]}          # callbacks only in the application's thread
    assert took["close a"] < CALL_BOUND_S and took["close b"] < CALL_BOUND_S
    assert env.committed("t", 6) == [(10, "")] * 6
    assert described(env) == ("Empty", [])
    assert group_threads() == 0


# ---------------------------------------------------------------------------- poll while a join is pending
def test_poll_returns_within_its_timeout_while_a_join_is_pending(env):
    env.topic("t", 6)
    # a session of 1 s: a is not polled for 2 s below, and only its heartbeats keep it in the group
    a = App(env, "a", **{"session.timeout.ms": 1000})
    b = App(env, "b", **{"session.timeout.ms": 1000})
    polls: list[float] = []
    seen: dict[str, object] = {}

    def scenario(progress: list[str]) -> None:
        a.subscribe()
        in_turn([a], lambda: a.partitions() == ALL, "a's assignment")
        a_id = a.member_id()
        progress.append("b joins; only b polls, poll(0.5) x 4")
        b.subscribe()
        for _ in range(4):
            polls.append(b.poll(0.5))
        # b's JoinGroup is still parked: the rebalance waits for a, whose revocation runs in a's poll
        seen["group"] = described(env)
        metadata = b.consumer.consumer_group_metadata()
        seen["a_id"], seen["b_metadata"] = a_id, (metadata.generation_id, metadata.member_id)
        seen["pending"] = (a.partitions(), list(a.events), b.partitions(), list(b.events))
        progress.append("a and b polled in turn")
        in_turn([a, b], lambda: (a.partitions(), b.partitions()) == ([0, 1, 2], [3, 4, 5])
                and env.group().is_in(GroupState.STABLE), "the split")
        seen["generation"] = (a.consumer.consumer_group_metadata().generation_id,
                              b.consumer.consumer_group_metadata().generation_id, env.group().generation_id)
        a.close()
        b.close()

    run_bounded(scenario)
    assert len(polls) == 4 and all(0.5 <= took < CALL_BOUND_S for took in polls), polls
    state, members = seen["group"]
    assert seen["b_metadata"] == (-1, "")       # no join of b's is complete yet
    assert state == "PreparingRebalance" and len(members) == 2 and seen["a_id"] in members
    assert [m.split("-")[0] for m in members] == ["a", "b"]
    # the group is rebalancing, but a's assignment changes only when its poll runs the callback
    assert seen["pending"] == (ALL, [("assign", ALL, 1)], [], [])
    assert seen["generation"] == (2, 2, 2)
    assert a.events == [("assign", ALL, 1), ("revoke", ALL, 1), ("assign", [0, 1, 2], 2), ("revoke", [0, 1, 2], 2)]
    assert b.events == [("assign", [3, 4, 5], 2), ("revoke", [3, 4, 5], 2)]
    assert group_threads() == 0


# ---------------------------------------------------------------------------- close during a rebalance
@pytest.mark.parametrize("closing", ["joining", "revoking"])
def test_close_during_a_rebalance_returns_promptly_and_the_member_leaves(env, closing):
    """b's JoinGroup is parked until a rejoins, and a owes the rebalance its revocation. Either
    one closes: close() returns at once (the revoking one runs on_revoke and commits first),
    LeaveGroup removes it, and the other one ends up alone with every partition, starting at
    the committed offsets."""
    env.topic("t", 6, records=5)
    a, b = App(env, "a"), App(env, "b")
    seen: dict[str, object] = {}

    def scenario(progress: list[str]) -> None:
        a.subscribe()
        in_turn([a], lambda: len(a.records) == 30, "a reading 30 records")
        progress.append("b joins; b.poll(0.5)")
        b.subscribe()
        b.poll(0.5)
        seen["before"] = described(env)
        seen["a_id"], seen["threads before"] = a.member_id(), group_threads()
        progress.append(f"closing the {closing} member")
        leaving, staying = (b, a) if closing == "joining" else (a, b)
        seen["close"] = leaving.close()
        seen["after"] = described(env)
        seen["threads after"] = group_threads()
        progress.append("the other member polls alone")
        in_turn([staying], lambda: staying.partitions() == ALL and env.group().is_in(GroupState.STABLE),
                "the remaining member's assignment")
        seen["stable"] = described(env)
        seen["staying_id"] = staying.member_id()
        env.produce("t", {p: range(5, 10) for p in range(6)})
        in_turn([staying], lambda: len(staying.records) == (60 if staying is a else 30), "the new records")
        for _ in range(5):
            staying.poll(0.05)
        staying.close()

    run_bounded(scenario)
    assert seen["close"] < CALL_BOUND_S
    state, members = seen["before"]
    assert state == "PreparingRebalance" and len(members) == 2 and seen["threads before"] == 2
    a_id = seen["a_id"]
    b_id = next(m for m in members if m != a_id)
    if closing == "joining":
        # b leaves while its JoinGroup is parked; a's revocation is still owed
        assert seen["after"] == ("PreparingRebalance", [a_id])
        assert seen["stable"] == ("Stable", [a_id])
        assert a.events == [("assign", ALL, 1), ("revoke", ALL, 1), ("assign", ALL, 2), ("revoke", ALL, 2)]
        assert b.events == [] and b.records == []
        assert sorted(a.records) == records(ALL, range(10))
    else:
        # a's close runs its revocation (and the commit before it), then leaves: b's parked
        # join completes the rebalance without a
        assert a.events == [("assign", ALL, 1), ("revoke", ALL, 1)]
        assert seen["after"][1] == [b_id]
        assert seen["stable"] == ("Stable", [b_id]) and seen["staying_id"] == b_id
        assert b.events == [("assign", ALL, 2), ("revoke", ALL, 2)]
        assert sorted(a.records) == records(ALL, range(5))
        assert sorted(b.records) == records(ALL, range(5, 10))
    assert seen["threads after"] == 1          # the closed member's group thread is gone
    assert env.committed("t", 6) == [(10, "")] * 6
    assert described(env) == ("Empty", [])
    assert group_threads() == 0


def test_close_while_a_rejoin_awaits_its_syncgroup_commits_what_was_read(env, monkeypatch):
    """a leaves; b (cooperative-sticky, so it keeps 3-5 through the rebalance) rejoins from its
    group thread and its JoinGroup is answered, but its SyncGroup answers 1 s late, and b is
    closed meanwhile. The group is in a new generation that waits for that SyncGroup: a commit
    with b's last completed generation was refused (ILLEGAL_GENERATION) and b's reads of 5-9
    stayed uncommitted (found by a full run on 4 workers). close() completes the join first, so
    its commit carries the new generation: every partition ends committed at 10."""
    from txlake.engine.group_coordinator import GroupCoordinator

    handle_sync_group = GroupCoordinator.handle_sync_group
    late: list[float] = []

    def answered_late(self, *args, **kwargs):
        if late:
            time.sleep(late[0])
        return handle_sync_group(self, *args, **kwargs)

    monkeypatch.setattr(GroupCoordinator, "handle_sync_group", answered_late)
    env.topic("t", 6, records=5)
    a, b = (App(env, name, **{"partition.assignment.strategy": "cooperative-sticky"}) for name in ("a", "b"))
    seen: dict[str, object] = {}

    def scenario(progress: list[str]) -> None:
        a.subscribe()
        in_turn([a], lambda: len(a.records) == 30, "a reading 30 records")
        b.subscribe()
        in_turn([a, b], lambda: (a.partitions(), b.partitions()) == SPLITS["cooperative-sticky"]
                and env.group().is_in(GroupState.STABLE), "the split")
        env.produce("t", {p: range(5, 10) for p in range(6)})
        in_turn([a, b], lambda: len(a.records) + len(b.records) == 60, "reading the 30 new records")
        progress.append("a closes; b's rejoin is answered, its SyncGroup 1 s late")
        late.append(1.0)
        a.close()
        deadline = time.monotonic() + 5
        while env.group().generation_id < 4 and time.monotonic() < deadline:   # b's JoinGroup answered
            time.sleep(0.01)
        seen["generation"] = env.group().generation_id
        seen["state"] = described(env)[0]
        progress.append("b closes while its SyncGroup is in flight")
        seen["close b"] = b.close()

    run_bounded(scenario)
    assert seen["generation"] == 4 and seen["state"] == "CompletingRebalance"
    assert seen["close b"] < CALL_BOUND_S
    assert sorted(b.records) == records([3, 4, 5], range(5, 10))
    assert env.committed("t", 6) == [(10, "")] * 6
    assert described(env) == ("Empty", [])
    assert group_threads() == 0
