"""Consumer.commit as confluent-kafka: ``asynchronous=True`` returns None at once and the
result reaches ``on_commit(err, partitions)`` from poll()/consume()/close();
``asynchronous=False`` waits and returns the committed partitions or raises. Commits are
sent in call order; auto-commit reports to ``on_commit`` too and skips partitions that did
not move (librdkafka: stored offset > committed offset); metadata strings round-trip.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from txlake import (OFFSET_INVALID, AdminClient, Consumer, KafkaError, KafkaException, NewTopic, Producer,
                    TopicPartition)
from txlake.engine.group_offsets import OFFSET_METADATA_MAX_BYTES, GroupOffsets
from txlake.engine.registry import close_all

BROKER_CONF = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 100,
               "transaction.state.log.num.partitions": 3, "storage.flush.linger.ms": 1}
MEMBER_CONF = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 30, "max.poll.interval.ms": 5000,
               "auto.offset.reset": "earliest"}
G = "g"
UNKNOWN_MEMBER_ID, OFFSET_METADATA_TOO_LARGE = 25, 12


@pytest.fixture(params=["file", "memory"])
def backend(request):
    return request.param


@pytest.fixture
def conf(storage):
    """A storage root with topic ``in``: 3 partitions holding 3 records each."""
    c = {**storage.conf(), **BROKER_CONF}
    with AdminClient(c) as admin:
        admin.create_topics([NewTopic("in", 3)])["in"].result()
    produce(c, {0: 3, 1: 3, 2: 3})
    yield c
    close_all()


def produce(conf: dict, counts: dict[int, int]) -> None:
    with Producer(conf) as p:
        for partition, n in counts.items():
            for i in range(n):
                p.produce("in", value=f"p{partition}-{i}".encode(), partition=partition)
        assert p.flush(10) == 0


class Reports:
    """An on_commit callback that records ``(error code, [(topic, partition, offset, metadata,
    error code)])`` per call, and the thread it ran in."""

    def __init__(self):
        self.calls: list[tuple[int | None, list[tuple]]] = []
        self.threads: set[int] = set()

    def __call__(self, err, partitions):
        self.threads.add(threading.get_ident())
        self.calls.append((err.code() if err is not None else None,
                           [(tp.topic, tp.partition, tp.offset, tp.metadata, tp.error.code() if tp.error else None)
                            for tp in partitions]))


@pytest.fixture
def gate(monkeypatch):
    """Holds every OffsetCommit at the engine until ``opened`` is set (``entered`` once one arrived)."""
    opened, entered = threading.Event(), threading.Event()
    original = GroupOffsets.commit

    def held(self, *args, **kwargs):
        entered.set()
        assert opened.wait(10)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GroupOffsets, "commit", held)
    return SimpleNamespace(opened=opened, entered=entered)


def committed(conf: dict, group: str = G, partitions=(0, 1, 2)) -> list[tuple[int, str | None]]:
    with Consumer({**conf, "group.id": group}) as c:
        return [(tp.offset, tp.metadata) for tp in c.committed([TopicPartition("in", p) for p in partitions], timeout=10)]


def simple(conf: dict, reports: Reports | None = None, **extra) -> Consumer:
    """An assign()-based consumer of ``in`` (generation -1 commits)."""
    c = Consumer({**conf, "group.id": G, "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  **({"on_commit": reports} if reports is not None else {}), **extra})
    c.assign([TopicPartition("in", p) for p in range(3)])
    return c


def poll_until(consumer: Consumer, condition, what: str, timeout: float = 15, poll: bool = True) -> None:
    """Check ``condition`` until it holds, polling in between (``poll=False``: the condition polls)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if poll:
            consumer.poll(0.02)


def consume_records(consumer: Consumer, count: int, timeout: float = 15) -> list:
    """consume() until ``count`` records came (error events aside). Only consume() runs: a
    subscribed consumer's first assignment arrives from its group thread at any poll, whose
    records must not go to a poll() that drops them."""
    seen = []
    poll_until(consumer, lambda: seen.extend(m for m in consumer.consume(100, 0.02) if m.error() is None)
               or len(seen) >= count, f"{count} records", timeout, poll=False)
    assert len(seen) == count
    return seen


def code(excinfo) -> int:
    return excinfo.value.args[0].code()


# ---------------------------------------------------------------------------- asynchronous
def test_async_commit_returns_at_once_and_reports_from_poll(conf, gate):
    reports = Reports()
    c = simple(conf, reports)
    assert c.commit(offsets=[TopicPartition("in", 1, 3), TopicPartition("in", 0, 2, "meta-a")],
                    asynchronous=True) is None
    assert gate.entered.wait(10)                 # the commit thread holds it; the caller did not wait
    assert committed(conf) == [(OFFSET_INVALID, None)] * 3
    c.poll(0.05)
    assert reports.calls == []                   # not answered yet: nothing to report
    gate.opened.set()
    poll_until(c, lambda: reports.calls, "the commit's report")
    assert reports.calls == [(None, [("in", 0, 2, "meta-a", None), ("in", 1, 3, None, None)])]
    assert reports.threads == {threading.get_ident()}   # served by poll(), in the application's thread
    assert committed(conf) == [(2, "meta-a"), (3, ""), (OFFSET_INVALID, None)]
    c.poll(0.05)
    assert len(reports.calls) == 1               # each result is reported once
    c.close()


def test_async_commits_are_sent_and_reported_in_call_order(conf):
    reports = Reports()
    c = simple(conf, reports)
    for offset in range(1, 21):
        assert c.commit(offsets=[TopicPartition("in", 0, offset, f"m{offset}")], asynchronous=True) is None
    # a synchronous commit queues behind them: when it returns they are all stored
    assert [(tp.partition, tp.offset) for tp in c.commit(offsets=[TopicPartition("in", 1, 9)],
                                                         asynchronous=False)] == [(1, 9)]
    assert committed(conf) == [(20, "m20"), (9, ""), (OFFSET_INVALID, None)]
    assert reports.calls == []                   # reports wait for poll(); sync commits have none
    c.poll(0)
    assert reports.calls == [(None, [("in", 0, n, f"m{n}", None)]) for n in range(1, 21)]
    c.close()


def test_async_commit_failure_reports_the_error_per_partition(conf):
    member = Consumer({**conf, **MEMBER_CONF, "group.id": G, "client.id": "m", "enable.auto.commit": False})
    member.subscribe(["in"])
    poll_until(member, lambda: len(member.assignment()) == 3, "the member's assignment")
    reports = Reports()
    outsider = simple(conf, reports)             # generation -1 while the group has a member
    assert outsider.commit(offsets=[TopicPartition("in", 0, 1), TopicPartition("in", 2, 2)]) is None
    poll_until(outsider, lambda: reports.calls, "the failed commit's report")
    assert reports.calls == [(UNKNOWN_MEMBER_ID, [("in", 0, 1, None, UNKNOWN_MEMBER_ID),
                                                  ("in", 2, 2, None, UNKNOWN_MEMBER_ID)])]
    with pytest.raises(KafkaException) as exc:
        outsider.commit(offsets=[TopicPartition("in", 0, 1)], asynchronous=False)
    assert code(exc) == KafkaError.UNKNOWN_MEMBER_ID
    assert committed(conf) == [(OFFSET_INVALID, None)] * 3
    outsider.close()
    member.close()


def test_nothing_to_commit(conf):
    reports = Reports()
    c = simple(conf, reports)
    c.assign([])                                          # no partition: no position to commit
    with pytest.raises(KafkaException) as exc:
        c.commit(asynchronous=False)
    assert code(exc) == KafkaError._NO_OFFSET
    assert c.commit() is None                             # asynchronous: the error goes to on_commit
    assert c.commit(offsets=[]) is None
    poll_until(c, lambda: len(reports.calls) == 2, "two reports")
    assert reports.calls == [(KafkaError._NO_OFFSET, [])] * 2
    c.close()


def test_commit_of_positions_skips_partitions_not_past_their_committed_offset(conf):
    c = simple(conf)
    seen = []
    poll_until(c, lambda: seen.extend(m for m in c.consume(100, 0.02) if m.error() is None) or len(seen) == 9,
               "9 records")
    assert [(tp.partition, tp.offset, tp.metadata) for tp in c.commit(asynchronous=False)] == \
        [(0, 3, None), (1, 3, None), (2, 3, None)]
    with pytest.raises(KafkaException) as exc:            # librdkafka: stored offset not > committed offset
        c.commit(asynchronous=False)
    assert code(exc) == KafkaError._NO_OFFSET
    produce(conf, {1: 2})
    poll_until(c, lambda: c.position([TopicPartition("in", 1)])[0].offset == 5, "partition 1 moves on")
    assert [(tp.partition, tp.offset) for tp in c.commit(asynchronous=False)] == [(1, 5)]
    msg = TopicPartition("in", 2, 1)                       # explicit offsets are always sent, even backwards
    assert [(tp.partition, tp.offset) for tp in c.commit(offsets=[msg], asynchronous=False)] == [(2, 1)]
    assert committed(conf) == [(3, ""), (5, ""), (1, "")]
    c.close()


def test_commit_message_and_argument_errors(conf):
    c = simple(conf)
    msg = None
    while msg is None or msg.error() is not None:
        msg = c.poll(5)
    assert [(tp.topic, tp.partition, tp.offset) for tp in c.commit(message=msg, asynchronous=False)] == \
        [("in", msg.partition(), msg.offset() + 1)]
    with pytest.raises(ValueError):
        c.commit(message=msg, offsets=[TopicPartition("in", 0, 1)])
    c.close()
    with pytest.raises(RuntimeError):
        c.commit(offsets=[TopicPartition("in", 0, 1)])
    no_group = Consumer({**conf})
    with pytest.raises(KafkaException) as exc:             # at once, also when asynchronous
        no_group.commit(offsets=[TopicPartition("in", 0, 1)], asynchronous=True)
    assert code(exc) == KafkaError._INVALID_ARG
    no_group.close()


def test_close_waits_for_queued_commits_and_serves_their_reports(conf, gate):
    reports = Reports()
    c = simple(conf, reports)
    assert c.commit(offsets=[TopicPartition("in", 2, 7, "last")]) is None
    assert gate.entered.wait(10)
    threading.Timer(0.2, gate.opened.set).start()
    c.close()
    assert reports.calls == [(None, [("in", 2, 7, "last", None)])]
    assert committed(conf) == [(OFFSET_INVALID, None), (OFFSET_INVALID, None), (7, "last")]


# ---------------------------------------------------------------------------- metadata
def test_offset_metadata_round_trips_and_is_limited_to_4096(conf):
    reports = Reports()
    c = simple(conf, reports)
    longest = "x" * OFFSET_METADATA_MAX_BYTES
    text = "caf\u00e9 \u2713 \U0001F389 {\"k\": [1, 2]}\n"
    assert [(tp.partition, tp.metadata) for tp in c.commit(
        offsets=[TopicPartition("in", 0, 1, longest), TopicPartition("in", 1, 2, text), TopicPartition("in", 2, 3, "")],
        asynchronous=False)] == [(0, longest), (1, text), (2, "")]
    assert committed(conf) == [(1, longest), (2, text), (3, "")]
    # one UTF-16 unit too many: OFFSET_METADATA_TOO_LARGE for that partition, the others are stored
    too_long = "\U0001F389" * (OFFSET_METADATA_MAX_BYTES // 2) + "x"   # an emoji is 2 UTF-16 units, as Java counts
    c.commit(offsets=[TopicPartition("in", 0, 4, too_long), TopicPartition("in", 1, 5, "fine")])
    poll_until(c, lambda: reports.calls, "the report")
    assert reports.calls == [(OFFSET_METADATA_TOO_LARGE, [("in", 0, 4, too_long, OFFSET_METADATA_TOO_LARGE),
                                                          ("in", 1, 5, "fine", None)])]
    with pytest.raises(KafkaException) as exc:
        c.commit(offsets=[TopicPartition("in", 2, 6, "y" * (OFFSET_METADATA_MAX_BYTES + 1))], asynchronous=False)
    assert code(exc) == KafkaError.OFFSET_METADATA_TOO_LARGE
    assert committed(conf) == [(1, longest), (5, "fine"), (3, "")]
    c.close()
    # metadata of plain and transactional commits survives an engine restart
    t = Producer({**conf, "transactional.id": "t"})
    t.init_transactions(10)
    t.begin_transaction()
    t.send_offsets_to_transaction([TopicPartition("in", 2, 8, "txn " + text)], G, 10)
    t.commit_transaction(10)
    t.close()
    close_all()
    assert committed(conf) == [(1, longest), (5, "fine"), (8, "txn " + text)]


# ---------------------------------------------------------------------------- auto-commit
def _auto_committing_consumer(conf: dict) -> tuple[Consumer, Reports]:
    """A consumer auto-committing every 50 ms that has read the 9 records of ``in``."""
    reports = Reports()
    c = Consumer({**conf, **MEMBER_CONF, "group.id": G, "client.id": "a", "on_commit": reports,
                  "enable.auto.commit": True, "auto.commit.interval.ms": 50})
    c.subscribe(["in"])
    consume_records(c, 9)
    return c, reports


def test_auto_commit_reports_to_on_commit_and_skips_unmoved_partitions(conf):
    c, reports = _auto_committing_consumer(conf)
    poll_until(c, lambda: committed(conf) == [(3, ""), (3, ""), (3, "")], "the auto-commit of offset 3")
    poll_until(c, lambda: reports.calls and reports.calls[-1][1][-1][2] == 3, "its report")
    # every report succeeded, with offsets that only move forward, ending at 3 on every partition
    assert all(err is None for err, _ in reports.calls)
    last = {}
    for _, parts in reports.calls:
        for topic, partition, offset, metadata, error in parts:
            assert (topic, metadata, error) == ("in", None, None) and offset > last.get(partition, 0)
            last[partition] = offset
    assert last == {0: 3, 1: 3, 2: 3}
    before = len(reports.calls)
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:                 # six intervals: nothing moved, nothing is committed
        c.poll(0.02)
    assert len(reports.calls) == before
    produce(conf, {1: 2})
    # poll() hands out one record per call and auto-commits first, so a stall of over one
    # interval between the calls returning offsets 3 and 4 commits 4 on its own before 5
    poll_until(c, lambda: len(reports.calls) > before and reports.calls[-1][1][-1][2] == 5, "the auto-commit of 5")
    moved = reports.calls[before:]
    assert moved in ([(None, [("in", 1, 5, None, None)])],
                     [(None, [("in", 1, 4, None, None)]), (None, [("in", 1, 5, None, None)])])
    c.close()
    assert committed(conf) == [(3, ""), (5, ""), (3, "")]


def test_auto_commit_does_not_resend_offsets_while_its_last_commit_is_in_flight(conf, monkeypatch):
    """A slow OffsetCommit (here 0.3 s, six auto-commit intervals) must not make the next
    intervals send the same offsets again: they are not noted as committed until answered,
    so each interval would otherwise repeat them (and report an unmoved partition again)."""
    c, reports = _auto_committing_consumer(conf)
    poll_until(c, lambda: reports.calls and reports.calls[-1][1][-1][2] == 3, "the auto-commit of offset 3")
    slow_commit = GroupOffsets.commit

    def commit(self, *args, **kwargs):
        time.sleep(0.3)
        return slow_commit(self, *args, **kwargs)

    monkeypatch.setattr(GroupOffsets, "commit", commit)  # the engine makes a GroupOffsets per call
    before = len(reports.calls)
    produce(conf, {1: 2})
    poll_until(c, lambda: len(reports.calls) > before, "the next auto-commit")
    deadline = time.monotonic() + 0.8             # 16 intervals: nothing moved since, nothing is sent again
    while time.monotonic() < deadline:
        c.poll(0.02)
    moved = [p for _, parts in reports.calls[before:] for p in parts]
    assert [(t, p) for t, p, _, _, _ in moved] == [("in", 1)] * len(moved)
    offsets_reported = [o for _, _, o, _, _ in moved]
    assert offsets_reported[-1] == 5 and offsets_reported == sorted(set(offsets_reported))  # never twice
    c.close()
    assert committed(conf) == [(3, ""), (5, ""), (3, "")]


def test_close_auto_commits_and_reports_before_leaving(conf):
    reports = Reports()
    c = Consumer({**conf, **MEMBER_CONF, "group.id": G, "client.id": "a", "on_commit": reports,
                  "enable.auto.commit": True, "auto.commit.interval.ms": 60_000})
    c.subscribe(["in"])
    consume_records(c, 9)
    assert reports.calls == []                        # the interval has not passed
    c.close()
    assert reports.calls == [(None, [("in", 0, 3, None, None), ("in", 1, 3, None, None), ("in", 2, 3, None, None)])]
    assert committed(conf) == [(3, ""), (3, ""), (3, "")]
