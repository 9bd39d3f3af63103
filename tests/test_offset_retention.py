"""Offset retention (KIP-211, ``offsets.retention.minutes``): which committed offsets expire
when, their tombstones in ``__consumer_offsets``, Empty groups going Dead, pending
transactional offsets (KIP-447), a restart, and the scheduler.

Kafka's rules (``GroupMetadataManager.cleanupGroupMetadata``,
``ClassicGroup.offsetExpirationCondition``, ``OffsetExpirationConditionImpl``): an offset
expires once ``now - base >= retention``. The base is the time the group became Empty for
a group with a protocol type, the offset's commit time for a group that only stores
offsets (assign()); an explicit expire timestamp (OffsetCommit ``retention_time_ms``) wins.
Expiration runs at a given ``now_ms`` here (``cleanup_group_metadata(now_ms=...)``), so no
test waits for minutes.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from txlake import (OFFSET_INVALID, AdminClient, Consumer, KafkaError, KafkaException, NewTopic, Producer,
                    TopicPartition)
from txlake.catalog.errors import InvalidConfigError
from txlake.config import parse_config
from txlake.engine.errors import Errors
from txlake.engine.group_coordinator import GroupConfig
from txlake.engine.group_metadata import GroupState
from txlake.engine.group_offsets import OffsetAndMetadata
from txlake.engine.registry import acquire_broker, close_all, release_broker

RETENTION_MIN = 1
RETENTION = RETENTION_MIN * 60_000          # ms
BROKER_CONF = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 100,
               "transaction.state.log.num.partitions": 3, "storage.flush.linger.ms": 1,
               "offsets.retention.minutes": RETENTION_MIN}
MEMBER_CONF = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 30, "max.poll.interval.ms": 5000,
               "auto.offset.reset": "earliest", "enable.auto.commit": False}
IN0, IN1, IN2 = ("in", 0), ("in", 1), ("in", 2)


@pytest.fixture(params=["file", "memory"])
def backend(request):
    """file:// and memory://; the restart test also runs on s3:// (:data:`ALL_BACKENDS`)."""
    return request.param


ALL_BACKENDS = pytest.mark.parametrize("backend", ["file", "memory", pytest.param("s3", marks=pytest.mark.s3)],
                                       indirect=True)


class Env:
    """A storage root with topic ``in`` (3 partitions, 3 records each) and its broker."""

    def __init__(self, storage):
        self.storage = storage
        self.conf = {**storage.conf(), **BROKER_CONF}
        self._open()
        self.admin.create_topics([NewTopic("in", 3)])["in"].result()
        p = Producer(self.conf)
        for partition in range(3):
            for i in range(3):
                p.produce("in", value=f"p{partition}-{i}".encode(), partition=partition)
        assert p.flush(10) == 0
        p.close()

    def _open(self) -> None:
        self.admin = AdminClient(self.conf)                   # the first client fixes the broker settings
        self.broker = acquire_broker(self.storage.url, dict(self.storage.options))

    def close(self) -> None:
        self.admin.close()
        release_broker(self.broker)
        close_all()

    def restart(self) -> None:
        """Close the engine (the coordinator goes away) and open it again: it replays __consumer_offsets."""
        self.close()
        self._open()

    @property
    def coordinator(self):
        return self.broker.group_coordinator()

    def cleanup(self, now_ms: int) -> int:
        return self.coordinator.cleanup_group_metadata(now_ms=now_ms)

    def stored(self, group: str) -> dict[tuple[str, int], OffsetAndMetadata]:
        """The group's committed offsets (OffsetFetch, not requiring stable offsets)."""
        return {tp: om for tp, (om, _) in self.broker.group_offsets().fetch(group, None, False).items()}

    def committed(self, group: str, partitions=(0, 1, 2)) -> list[tuple[int, str | None]]:
        with Consumer({**self.conf, "group.id": group}) as c:
            return [(tp.offset, tp.metadata) for tp in
                    c.committed([TopicPartition("in", p) for p in partitions], timeout=10)]

    def log(self, group: str) -> list[tuple]:
        """The group's records in its __consumer_offsets partition, in log order:
        ``("group", "record"|None)`` for its metadata, ``((topic, partition), offset|None)`` for offsets."""
        offsets = self.broker.group_offsets()
        out = []
        for key, value in offsets.records(offsets.partition_for(group)):
            k = json.loads(key)
            if k["group"] != group:
                continue
            if k.get("type") == "group":
                out.append(("group", None if value is None else "record"))
            else:
                out.append(((k["topic"], k["partition"]), None if value is None else json.loads(value)["offset"]))
        return out


@pytest.fixture
def env(storage):
    e = Env(storage)
    yield e
    e.close()


def commit_later(env: Env, group: str, tp: tuple[str, int], offset: int, after_ms: int, **kw) -> OffsetAndMetadata:
    """A standalone commit of ``tp`` whose commit timestamp is later than ``after_ms``; returns the stored offset."""
    while int(time.time() * 1000) <= after_ms:
        time.sleep(0.001)
    assert env.broker.group_offsets().commit(group, {tp: OffsetAndMetadata(offset, f"m{offset}")}, **kw) == \
        {tp: Errors.NO_ERROR}
    return env.stored(group)[tp]


def join_and_leave(env: Env, group: str, commit: bool) -> int:
    """A subscribed member reads ``in`` (3 x 3 records), commits if asked, closes: the group is
    Empty. Returns the time (ms) it became Empty."""
    c = Consumer({**env.conf, **MEMBER_CONF, "group.id": group, "client.id": "a"})
    c.subscribe(["in"])
    seen = 0
    deadline = time.monotonic() + 15
    while seen < 9 and time.monotonic() < deadline:
        seen += sum(1 for m in c.consume(100, 0.05) if m.error() is None)
    assert seen == 9
    if commit:
        assert [(tp.partition, tp.offset) for tp in c.commit(asynchronous=False)] == [(0, 3), (1, 3), (2, 3)]
    c.close()
    group_state = env.coordinator.get_group(group)
    assert group_state.state is GroupState.EMPTY
    return group_state.state_timestamp


# ---------------------------------------------------------------------------- configuration
def test_retention_config_defaults_validation_and_plumbing(env):
    assert GroupConfig().offsets_retention_minutes == 10_080
    assert GroupConfig().offsets_retention_ms == 604_800_000
    assert GroupConfig().offsets_retention_check_interval_ms == 600_000
    assert GroupConfig.from_properties({"offsets.retention.minutes": "5",
                                        "offsets.retention.check.interval.ms": "1000"}) == \
        GroupConfig(offsets_retention_minutes=5, offsets_retention_check_interval_ms=1000)
    for key, bad in [("offsets.retention.minutes", 0), ("offsets.retention.check.interval.ms", 0),
                     ("offsets.retention.minutes", "x")]:
        with pytest.raises(InvalidConfigError, match=key.replace(".", r"\.")):
            GroupConfig.from_properties({key: bad})
    defaults = parse_config({}, "consumer")
    assert (defaults["offsets.retention.minutes"], defaults["offsets.retention.check.interval.ms"]) == \
        (10_080, 600_000)
    for key, bad in [("offsets.retention.minutes", 0), ("offsets.retention.minutes", 2**31),
                     ("offsets.retention.check.interval.ms", 0), ("offsets.retention.check.interval.ms", "soon")]:
        with pytest.raises(KafkaException) as exc:
            parse_config({key: bad}, "admin")
        assert exc.value.args[0].code() == KafkaError._INVALID_ARG
        assert f'"{key}"' in exc.value.args[0].str()
    # the broker of the storage root took them from its first client's config
    assert env.coordinator.config.offsets_retention_minutes == RETENTION_MIN
    assert env.coordinator.config.offsets_retention_check_interval_ms == 600_000


# ---------------------------------------------------------------------------- standalone groups
def test_standalone_offsets_expire_retention_after_their_commit(env):
    g = "simple"
    first = commit_later(env, g, IN0, 5, 0)
    second = commit_later(env, g, IN1, 7, first.commit_timestamp)
    assert (first.offset, first.metadata, first.expire_timestamp) == (5, "m5", None)
    assert second.commit_timestamp > first.commit_timestamp
    assert env.coordinator.get_group(g) is None                 # a group that only stores offsets
    assert env.cleanup(first.commit_timestamp + RETENTION - 1) == 0
    assert sorted(env.stored(g)) == [IN0, IN1]
    assert env.cleanup(first.commit_timestamp + RETENTION) == 1  # now - commit >= retention: expired
    assert env.stored(g) == {IN1: second}
    assert env.committed(g) == [(OFFSET_INVALID, None), (7, "m7"), (OFFSET_INVALID, None)]
    # a standalone group has no record to tombstone (Kafka: generation 0 only stores offsets)
    assert env.log(g) == [(IN0, 5), (IN1, 7), (IN0, None)]
    assert env.cleanup(first.commit_timestamp + RETENTION) == 0  # nothing more to do
    assert env.cleanup(second.commit_timestamp + RETENTION) == 1
    assert env.stored(g) == {}
    assert env.log(g) == [(IN0, 5), (IN1, 7), (IN0, None), (IN1, None)]


def test_a_new_commit_restarts_the_retention_of_its_partition(env):
    g = "simple"
    old = commit_later(env, g, IN0, 5, 0)
    new = commit_later(env, g, IN0, 6, old.commit_timestamp)
    assert env.cleanup(old.commit_timestamp + RETENTION) == 0
    assert env.stored(g) == {IN0: new}
    assert env.cleanup(new.commit_timestamp + RETENTION) == 1
    assert env.log(g) == [(IN0, 5), (IN0, 6), (IN0, None)]


def test_an_explicit_expire_timestamp_wins_over_the_retention(env):
    g = "simple"
    kept = commit_later(env, g, IN0, 1, 0)
    short = commit_later(env, g, IN1, 2, kept.commit_timestamp, retention_time_ms=5_000)
    long = commit_later(env, g, IN2, 3, short.commit_timestamp, retention_time_ms=10 * RETENTION)
    assert short.expire_timestamp == short.commit_timestamp + 5_000
    assert long.expire_timestamp == long.commit_timestamp + 10 * RETENTION
    assert env.cleanup(short.commit_timestamp + 4_999) == 0
    assert env.cleanup(short.commit_timestamp + 5_000) == 1              # before offsets.retention.minutes
    assert sorted(env.stored(g)) == [IN0, IN2]
    assert env.cleanup(long.commit_timestamp + RETENTION) == 1           # IN0 by retention, IN2 not yet
    assert env.stored(g) == {IN2: long}
    assert env.cleanup(long.expire_timestamp - 1) == 0
    assert env.cleanup(long.expire_timestamp) == 1
    assert env.log(g) == [(IN0, 1), (IN1, 2), (IN2, 3), (IN1, None), (IN0, None), (IN2, None)]


# ---------------------------------------------------------------------------- groups with members
def test_group_offsets_expire_retention_after_the_group_became_empty_then_it_is_dead(env):
    g = "managed"
    empty_since = join_and_leave(env, g, commit=True)
    committed_at = {tp: om.commit_timestamp for tp, om in env.stored(g).items()}
    assert sorted(committed_at) == [IN0, IN1, IN2]
    assert max(committed_at.values()) <= empty_since
    before = env.log(g)
    assert before == [("group", "record"), (IN0, 3), (IN1, 3), (IN2, 3), ("group", "record")]
    # retention counts from when the group became Empty, not from the commits
    assert env.cleanup(max(committed_at.values()) + RETENTION - 1) == 0
    assert env.cleanup(empty_since + RETENTION - 1) == 0
    assert env.coordinator.get_group(g).state is GroupState.EMPTY
    assert env.log(g) == before
    assert env.cleanup(empty_since + RETENTION) == 3
    assert env.stored(g) == {}
    assert env.coordinator.get_group(g) is None
    assert env.coordinator.handle_describe_groups([g])[0].state == "Dead"
    assert env.log(g) == before + [(IN0, None), (IN1, None), (IN2, None), ("group", None)]
    assert env.committed(g) == [(OFFSET_INVALID, None)] * 3


def test_stable_group_keeps_subscribed_offsets_and_expires_unsubscribed_ones(env):
    """KIP-496: in a Stable consumer group, offsets of topics no member subscribes to expire
    by their commit time; the subscribed topic's offsets never do while the group lives."""
    env.admin.create_topics([NewTopic("old", 1)])["old"].result()
    g = "stable"
    c = Consumer({**env.conf, **MEMBER_CONF, "group.id": g, "client.id": "a"})
    c.subscribe(["in"])
    deadline = time.monotonic() + 15
    while len(c.assignment()) < 3 and time.monotonic() < deadline:
        c.consume(100, 0.05)
    assert env.coordinator.get_group(g).state is GroupState.STABLE
    assert env.coordinator.get_group(g).subscribed_topics() == {"in"}
    c.commit(offsets=[TopicPartition("in", 0, 2, "keep"), TopicPartition("old", 0, 4, "drop")], asynchronous=False)
    committed_at = env.stored(g)[("old", 0)].commit_timestamp
    assert env.cleanup(committed_at + RETENTION - 1) == 0
    assert env.cleanup(committed_at + 100 * RETENTION) == 1
    assert {tp: (om.offset, om.metadata) for tp, om in env.stored(g).items()} == {IN0: (2, "keep")}
    assert env.coordinator.get_group(g).state is GroupState.STABLE
    assert env.log(g) == [("group", "record"), (IN0, 2), (("old", 0), 4), (("old", 0), None)]
    c.close()


def test_empty_group_without_offsets_is_removed_at_the_next_cleanup(env):
    g = "idle"
    empty_since = join_and_leave(env, g, commit=False)
    assert env.cleanup(empty_since) == 0                     # no offset to remove, but the group goes
    assert env.coordinator.get_group(g) is None
    assert env.log(g) == [("group", "record"), ("group", "record"), ("group", None)]


# ---------------------------------------------------------------------------- transactions (KIP-447)
def test_pending_transactional_offsets_never_expire_then_follow_the_normal_rule(env):
    g = "simple"
    old = commit_later(env, g, IN0, 1, 0)
    other = commit_later(env, g, IN1, 2, old.commit_timestamp)
    t = Producer({**env.conf, "transactional.id": "t"})
    t.init_transactions(10)
    t.begin_transaction()
    t.send_offsets_to_transaction([TopicPartition("in", 0, 7, "txn")], g, 10)   # pending: no marker yet
    far = other.commit_timestamp + 100 * RETENTION
    assert env.cleanup(far) == 1                            # IN1 expires; IN0 has a pending transactional commit
    assert env.stored(g) == {IN0: old}
    assert env.broker.group_offsets().fetch(g, [IN0], True) == {IN0: (None, Errors.UNSTABLE_OFFSET_COMMIT)}
    t.commit_transaction(10)
    txn = env.stored(g)[IN0]
    assert (txn.offset, txn.metadata) == (7, "txn")
    assert txn.commit_timestamp > other.commit_timestamp
    assert env.cleanup(txn.commit_timestamp + RETENTION - 1) == 0
    assert env.cleanup(txn.commit_timestamp + RETENTION) == 1
    assert env.stored(g) == {}
    assert env.log(g) == [(IN0, 1), (IN1, 2), (IN0, 7), (IN1, None), (IN0, None)]
    t.close()


def test_empty_group_with_only_pending_transactional_offsets_is_not_removed(env):
    g = "managed"
    empty_since = join_and_leave(env, g, commit=False)
    t = Producer({**env.conf, "transactional.id": "t"})
    t.init_transactions(10)
    t.begin_transaction()
    t.send_offsets_to_transaction([TopicPartition("in", 2, 9)], g, 10)   # the Empty group accepts generation -1
    assert env.cleanup(empty_since + 100 * RETENTION) == 0
    assert env.coordinator.get_group(g).state is GroupState.EMPTY
    t.abort_transaction(10)
    assert env.cleanup(empty_since + 100 * RETENTION) == 0
    assert env.coordinator.get_group(g) is None
    assert env.log(g) == [("group", "record"), ("group", "record"), (IN2, 9), ("group", None)]
    t.close()


def test_a_tombstone_does_not_drop_a_transactional_offset_written_before_it(env):
    """Kafka's replay: a tombstone removes the committed offset; a transactional offset written
    before it but committed after it still applies (so an expiration racing a
    TxnOffsetCommit never loses the transaction's offset)."""
    g = "simple"
    commit_later(env, g, IN0, 1, 0)
    t = Producer({**env.conf, "transactional.id": "t"})
    t.init_transactions(10)
    t.begin_transaction()
    t.send_offsets_to_transaction([TopicPartition("in", 0, 7)], g, 10)
    offsets = env.broker.group_offsets()
    assert offsets.delete_offsets(offsets.partition_for(g), {g: [IN0]}) == Errors.NO_ERROR
    assert env.stored(g) == {}
    t.commit_transaction(10)
    assert env.stored(g)[IN0].offset == 7
    assert env.log(g) == [(IN0, 1), (IN0, 7), (IN0, None)]
    t.close()


# ---------------------------------------------------------------------------- restart, guard, scheduler
@ALL_BACKENDS
def test_expired_offsets_and_dead_groups_stay_gone_after_a_restart(env):
    simple, managed = "simple", "managed"
    empty_since = join_and_leave(env, managed, commit=True)
    gone = commit_later(env, simple, IN0, 4, empty_since)
    kept = commit_later(env, simple, IN1, 6, gone.commit_timestamp)
    now = max(empty_since, gone.commit_timestamp) + RETENTION
    assert now < kept.commit_timestamp + RETENTION
    assert env.cleanup(now) == 4                           # 3 of the managed group, IN0 of the simple one
    simple_log, managed_log = env.log(simple), env.log(managed)
    env.restart()
    assert env.coordinator.get_group(managed) is None      # its tombstone is replayed
    assert env.coordinator.handle_list_groups()[1] == []
    assert env.stored(simple) == {IN1: kept}
    assert env.committed(simple) == [(OFFSET_INVALID, None), (6, "m6"), (OFFSET_INVALID, None)]
    assert env.committed(managed) == [(OFFSET_INVALID, None)] * 3
    assert env.cleanup(now) == 0                           # the replayed state is the same: nothing to redo
    assert (env.log(simple), env.log(managed)) == (simple_log, managed_log)
    assert env.cleanup(kept.commit_timestamp + RETENTION) == 1
    env.restart()
    assert env.stored(simple) == {}


def test_expiration_waits_for_an_offset_commit_in_progress(env):
    g = "simple"
    old = commit_later(env, g, IN0, 1, 0)
    done = threading.Event()
    removed = []

    def expire():
        removed.append(env.cleanup(old.commit_timestamp + RETENTION))
        done.set()

    with env.coordinator.offset_commit_guard(g):           # as an OffsetCommit holds it
        worker = threading.Thread(target=expire)
        worker.start()
        assert not done.wait(0.3)                          # the group's partition is not expired meanwhile
    worker.join(10)
    assert removed == [1]


def test_the_scheduler_expires_offsets_every_check_interval(storage):
    conf = {**storage.conf(), **BROKER_CONF, "offsets.retention.check.interval.ms": 50}
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("in", 1)])["in"].result()
    broker = acquire_broker(storage.url, dict(storage.options))
    try:
        offsets = broker.group_offsets()
        assert broker.group_coordinator().config.offsets_retention_check_interval_ms == 50
        assert offsets.commit("simple", {IN0: OffsetAndMetadata(3)}, retention_time_ms=1) == {IN0: Errors.NO_ERROR}
        deadline = time.monotonic() + 10
        while offsets.fetch("simple", None, False) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert offsets.fetch("simple", None, False) == {}
    finally:
        admin.close()
        release_broker(broker)
        close_all()
