"""The writer lease: one writer process per storage root, any number of readers.

What is proved here (DESIGN.md "Processes", the writer-lease issue):

* a second writer -- in another process, or a second engine in this one -- is refused
  with NOT_LEADER_OR_FOLLOWER (6) and a message naming the holder (host, pid) and what
  to do; nothing already committed is lost;
* a SIGKILLed holder's lease is taken over once it expires (by its last heartbeat), at
  once with ``storage.lease.force``; everything the dead writer acknowledged stays at
  its offsets;
* a zombie holder (lease taken over while it still runs) commits nothing more: its
  writes fail with _FENCED (-144), at the catalog level with WriterFencedError;
* a writer that exits cleanly (close() or interpreter exit) releases the lease at once;
* readers (Consumer, Catalog.open, listing) never take the lease and tail new commits
  while a writer runs in another process; the lease is taken on the first write only.

Cross-process tests run a real writer process (tests/helpers/writer_proc.py) on file://
and s3:// (memory:// is private to one process); in-process tests run on all three.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

import txlake.duckdb

from helpers import (client_conf, close_engines, consume_all, open_catalog, read_partition, read_topic,  # noqa: F401
                     writer_procs)
from txlake import (OFFSET_BEGINNING, AdminClient, Consumer, KafkaError, KafkaException, NewTopic, Producer,
                    TopicPartition)
from txlake.catalog.catalog import Catalog, commit_key
from txlake.catalog.errors import WriterFencedError, WriterLeaseHeldError
from txlake.catalog.state import CREATE_TOPIC, LEASE
from txlake.catalog.writer_lease import WriterLease, heartbeat_key
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.engine.errors import ApiError, Errors
from txlake.formats.catalog_actions import COMMIT_KIND, decode_actions
from txlake.formats.records import PAYLOAD_SCHEMA

FENCED_FLUSH_HELPER = str(Path(__file__).resolve().parent / "helpers" / "fenced_flush_proc.py")

#: Cross-process tests: a storage root two processes can share.
cross_process = pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])


def _now_ms() -> int:
    return int(time.time() * 1000)


def _records(values: list[str]) -> pa.Table:
    return pa.Table.from_pylist([{"timestamp": 1_700_000_000_000, "key": None, "value": v.encode(), "headers": None}
                                 for v in values], schema=PAYLOAD_SCHEMA)


def _topic_action(name: str) -> dict:
    return {"action": CREATE_TOPIC, "topic": name, "topic_id": name + "-id", "num_partitions": 1, "config": {}}


class _Reports:
    """Delivery reports collected by an on_delivery callback."""

    def __init__(self):
        self.ok: list[tuple[int, int, str]] = []
        self.errors: list[KafkaError] = []

    def __call__(self, err, msg) -> None:
        if err is None:
            self.ok.append((msg.partition(), msg.offset(), msg.value().decode()))
        else:
            self.errors.append(err)


def _expiry_ms(storage) -> tuple[int, object]:
    """When the catalog's current lease lapses by its last heartbeat (ms since the epoch)."""
    cat = open_catalog(storage)
    lease = cat.state.lease
    beat = cat.store.get_or_none(heartbeat_key(lease.epoch))
    renewed = max(lease.acquired_ms, json.loads(beat)["renewed_at_ms"] if beat else 0)
    return renewed + lease.lease_ms, lease


def _assert_acked_present(storage, acks: list[dict], topic: str) -> dict[int, list[tuple[int, str]]]:
    """Every acknowledged record is committed at its acknowledged offset; offsets are 0..HW-1."""
    log = read_topic(storage, topic)
    by_offset = {p: dict(rows) for p, rows in log.items()}
    for ack in acks:
        assert by_offset[ack["partition"]].get(ack["offset"]) == ack["value"], f"acknowledged record lost: {ack}"
    for p, rows in log.items():
        assert [o for o, _ in rows] == list(range(len(rows))), f"offsets of partition {p} are not 0..HW-1"
    return log


# ----------------------------------------------------------------------------------------
# 1. A second writer in another process is refused; nothing committed is lost.
# ----------------------------------------------------------------------------------------
@cross_process
def test_second_writer_in_another_process_is_refused(storage, writer_procs):
    w = writer_procs(storage, {"storage.lease.ms": 60_000})
    assert w.request("create_topic", "created", topic="orders", partitions=2)["error"] is None
    w.request("produce", "produced", topic="orders", n=20, prefix="first")
    assert len(w.acks()) == 20
    _, lease = _expiry_ms(storage)
    assert lease.info["pid"] == w.pid and not lease.released
    version_before = open_catalog(storage).version

    conf = client_conf(storage, {"storage.lease.ms": 1500})
    producer = Producer(conf)
    with pytest.raises(KafkaException) as excinfo:
        producer.produce("orders", value=b"intruder", partition=0)
    err = excinfo.value.args[0]
    assert err.code() == KafkaError.NOT_LEADER_OR_FOLLOWER == 6
    assert err.name() == "NOT_LEADER_FOR_PARTITION"  # librdkafka's name of NOT_LEADER_OR_FOLLOWER (6)
    text = err.str()
    assert f"host {w.host}" in text and f"pid {w.pid}" in text, text      # names the holder
    assert storage.url in text, text                                        # and the storage root
    assert "storage.lease.force" in text and "expires in" in text, text     # and what to do
    assert len(producer) == 0  # nothing was queued
    plain = Producer({**conf, "enable.idempotence": False})  # refused at once too, not after a timeout
    with pytest.raises(KafkaException) as excinfo:
        plain.produce("orders", value=b"intruder", partition=1)
    assert excinfo.value.args[0].code() == KafkaError.NOT_LEADER_OR_FOLLOWER
    assert f"pid {w.pid}" in excinfo.value.args[0].str()
    plain.close()

    admin = AdminClient(conf)
    fut = admin.create_topics([NewTopic("other", num_partitions=1)])["other"]
    with pytest.raises(KafkaException) as excinfo:
        fut.result()
    assert excinfo.value.args[0].code() == KafkaError.NOT_LEADER_OR_FOLLOWER
    assert f"pid {w.pid}" in excinfo.value.args[0].str()

    # The refused writers changed nothing: same lease, no new commit, no topic.
    cat = open_catalog(storage)
    assert cat.version == version_before
    assert cat.state.lease.epoch == lease.epoch and not cat.state.lease.released
    assert "other" not in cat.state.topics

    # The holder keeps working, and nothing it committed is lost.
    w.request("produce", "produced", topic="orders", n=10, prefix="second")
    log = _assert_acked_present(storage, w.acks(), "orders")
    assert sorted(v for rows in log.values() for _, v in rows) == sorted(a["value"] for a in w.acks())
    assert len(w.acks()) == 30

    # Once the holder closes, the refused client itself can write (no force, no waiting).
    w.request("close", "closed")
    reports = _Reports()
    producer.produce("orders", value=b"after", partition=0, on_delivery=reports)
    assert producer.flush(10) == 0
    hw0 = len(log[0])
    assert reports.ok == [(0, hw0, "after")]
    assert open_catalog(storage).state.lease.info["pid"] == os.getpid()
    producer.close()
    admin.close()
    w.send("exit")
    w.wait_exit()


def test_second_engine_in_same_process_is_refused(storage, close_engines):
    """Two engines of one process on one root (not via the registry) obey the same lease."""
    a = Broker(storage.object_store(), BrokerConfig(lease_ms=60_000))
    b = Broker(storage.object_store(), BrokerConfig(lease_ms=60_000))
    try:
        assert a.create_topics([("t", 1, {})]) == [(Errors.NO_ERROR, "")]
        with pytest.raises(ApiError) as excinfo:
            b.ensure_writer()
        assert excinfo.value.error == Errors.NOT_LEADER_OR_FOLLOWER
        assert f"pid {os.getpid()}" in excinfo.value.message
        (res,) = b.produce([ProduceBatch("t", 0, _records(["x"]))])
        assert res.error == Errors.NOT_LEADER_OR_FOLLOWER
        assert not b.is_writer
        assert open_catalog(storage).state.partition("t", 0).high_watermark == 0
        (res,) = a.produce([ProduceBatch("t", 0, _records(["a"]))])
        assert (res.error, res.base_offset) == (Errors.NO_ERROR, 0)
    finally:
        b.close()
        a.close()


# ----------------------------------------------------------------------------------------
# 2. A SIGKILLed holder: takeover after expiry, or at once when forced.
# ----------------------------------------------------------------------------------------
@cross_process
def test_killed_holder_lease_expires_then_new_writer_takes_over(storage, writer_procs):
    w = writer_procs(storage, {"storage.lease.ms": 2500})
    assert w.request("create_topic", "created", topic="t", partitions=2)["error"] is None
    w.request("stream", "streaming", topic="t", prefix="dead", pause_ms=5, batch=10)
    w.wait_acks(40)
    w.kill()  # while records are in flight
    acks = w.acks()
    expiry, lease = _expiry_ms(storage)
    assert lease.info["pid"] == w.pid and not lease.released
    assert _now_ms() < expiry - 300, "the lease lapsed before the test could look (machine too slow)"

    producer = Producer(client_conf(storage, {"storage.lease.ms": 1500}))
    with pytest.raises(KafkaException) as excinfo:
        producer.produce("t", value=b"early", partition=0)
    assert _now_ms() < expiry
    err = excinfo.value.args[0]
    assert err.code() == KafkaError.NOT_LEADER_OR_FOLLOWER
    assert f"pid {w.pid}" in err.str() and "expires in" in err.str()

    # Retry until the lease lapses: refused before the expiry, accepted after it.
    reports = _Reports()
    while True:
        try:
            producer.produce("t", value=b"new", partition=0, on_delivery=reports)
            break
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.NOT_LEADER_OR_FOLLOWER
            assert _now_ms() < expiry + 5000, "the dead holder's lease never lapsed"
            time.sleep(0.05)
    taken_at = _now_ms()
    assert taken_at >= expiry, "took over a lease that had not lapsed yet"
    assert producer.flush(10) == 0
    cat = open_catalog(storage)
    assert cat.state.lease.epoch == lease.epoch + 1 and cat.state.lease.info["pid"] == os.getpid()

    # Everything the dead writer acknowledged is still there, at the same offsets.
    log = _assert_acked_present(storage, acks, "t")
    assert reports.ok == [(0, len(log[0]) - 1, "new")]
    producer.close()


@cross_process
def test_killed_holder_forced_takeover_is_immediate(storage, writer_procs):
    w = writer_procs(storage, {"storage.lease.ms": 20_000})
    assert w.request("create_topic", "created", topic="t", partitions=2)["error"] is None
    w.request("stream", "streaming", topic="t", prefix="dead", pause_ms=5, batch=10)
    w.wait_acks(40)
    w.kill()
    acks = w.acks()
    expiry, lease = _expiry_ms(storage)

    producer = Producer(client_conf(storage, {"storage.lease.ms": 1500, "storage.lease.force": True}))
    reports = _Reports()
    producer.produce("t", value=b"forced", partition=1, on_delivery=reports)
    assert producer.flush(10) == 0
    assert _now_ms() < expiry, "a forced takeover must not wait for the lease to lapse"
    cat = open_catalog(storage)
    assert cat.state.lease.epoch == lease.epoch + 1 and cat.state.lease.info["pid"] == os.getpid()
    log = _assert_acked_present(storage, acks, "t")
    assert reports.ok == [(1, len(log[1]) - 1, "forced")]
    producer.close()


# ----------------------------------------------------------------------------------------
# 3. Zombie fencing: the old holder commits nothing after a takeover.
# ----------------------------------------------------------------------------------------
def test_zombie_broker_is_fenced(storage, close_engines):
    a = Broker(storage.object_store(), BrokerConfig(lease_ms=60_000))
    b = Broker(storage.object_store(), BrokerConfig(lease_ms=60_000, lease_force=True))
    try:
        assert a.create_topics([("t", 1, {})]) == [(Errors.NO_ERROR, "")]
        _, pid, epoch = a.init_producer_id()
        (res,) = a.produce([ProduceBatch("t", 0, _records(["a0", "a1"]), pid, epoch, 0)])
        assert (res.error, res.base_offset) == (Errors.NO_ERROR, 0)
        a_epoch = a.lease.epoch

        (res,) = b.produce([ProduceBatch("t", 0, _records(["b0"]))])  # B force-takes the lease
        assert (res.error, res.base_offset) == (Errors.NO_ERROR, 2)
        assert b.lease.epoch == a_epoch + 1
        version, hw = b.catalog.version, 3

        # A does not know yet; its next write is refused, and every one after it.
        (res,) = a.produce([ProduceBatch("t", 0, _records(["a2"]), pid, epoch, 2)])
        assert res.error == Errors._FENCED == -144
        assert "lost the writer lease" in res.message
        (res,) = a.produce([ProduceBatch("t", 0, _records(["a3"]), pid, epoch, 3)])
        assert res.error == Errors._FENCED
        with pytest.raises(ApiError) as excinfo:
            a.create_topics([("zombie", 1, {})])
        assert excinfo.value.error == Errors._FENCED
        with pytest.raises(ApiError) as excinfo:
            a.init_producer_id()
        assert excinfo.value.error == Errors._FENCED
        a.close()  # a zombie's close releases nothing of B's

        cat = open_catalog(storage)
        assert cat.version == version
        assert cat.state.partition("t", 0).high_watermark == hw
        assert "zombie" not in cat.state.topics
        assert cat.state.lease.epoch == b.lease.epoch and not cat.state.lease.released
        assert read_partition(storage, "t", 0) == [(0, "a0"), (1, "a1"), (2, "b0")]

        (res,) = b.produce([ProduceBatch("t", 0, _records(["b1"]))])  # B's data and writes are intact
        assert (res.error, res.base_offset) == (Errors.NO_ERROR, 3)
        assert read_partition(storage, "t", 0) == [(0, "a0"), (1, "a1"), (2, "b0"), (3, "b1")]
    finally:
        a.close()
        b.close()
    assert open_catalog(storage).state.lease.released


def test_zombie_catalog_commit_raises_writer_fenced(storage):
    cat_a = Catalog.open(storage.object_store())
    lease_a = WriterLease(cat_a, 60_000)
    a_epoch = lease_a.acquire()
    cat_a.commit([_topic_action("a")], lease_epoch=a_epoch)

    cat_b = Catalog.open(storage.object_store())
    lease_b = WriterLease(cat_b, 60_000)
    with pytest.raises(WriterLeaseHeldError) as excinfo:
        lease_b.acquire()
    assert f"pid {os.getpid()}" in excinfo.value.holder and 0 < excinfo.value.expires_in_ms <= 60_000
    b_epoch = lease_b.acquire(force=True)
    assert b_epoch == a_epoch + 1

    with pytest.raises(WriterFencedError, match="lost the writer lease"):
        cat_a.commit([_topic_action("zombie")], lease_epoch=a_epoch)
    with pytest.raises(WriterFencedError):  # after catching up it still refuses
        cat_a.commit([_topic_action("zombie")], lease_epoch=a_epoch)
    cat_b.commit([_topic_action("b")], lease_epoch=b_epoch)

    lease_a.release()  # a zombie's release must not release B's lease
    fresh = open_catalog(storage)
    assert set(fresh.state.topics) == {"a", "b"}
    assert fresh.state.lease.epoch == b_epoch and not fresh.state.lease.released
    lease_b.release()
    assert open_catalog(storage).state.lease.released
    with pytest.raises(WriterFencedError):  # a released lease commits nothing either
        cat_b.commit([_topic_action("late")], lease_epoch=b_epoch)


def test_lease_lapses_without_heartbeats_and_heartbeats_keep_it(storage):
    cat_a = Catalog.open(storage.object_store())
    # 1 s leases: at 300 ms a heartbeat thread stalled by a loaded machine let the challenger in
    lease_a = WriterLease(cat_a, 1000)
    a_epoch = lease_a.acquire()
    lease_a.start_heartbeats()
    challenger = WriterLease(Catalog.open(storage.object_store()), 1000)
    try:
        deadline = time.monotonic() + 2.5  # 2.5 lease periods: the heartbeats keep it
        while time.monotonic() < deadline:
            with pytest.raises(WriterLeaseHeldError):
                challenger.acquire()
            time.sleep(0.1)
        lease_a.stop_heartbeats()
        lapsed_at = time.monotonic()
        while True:
            try:
                b_epoch = challenger.acquire()
                break
            except WriterLeaseHeldError:
                assert time.monotonic() - lapsed_at < 6, "a lease without heartbeats never lapsed"
                time.sleep(0.05)
        assert b_epoch == a_epoch + 1
        with pytest.raises(WriterFencedError):
            cat_a.commit([_topic_action("zombie")], lease_epoch=a_epoch)
    finally:
        lease_a.stop_heartbeats()


def test_racing_challengers_exactly_one_wins(storage):
    first = WriterLease(Catalog.open(storage.object_store()), 60_000)
    first.acquire()
    first.release()
    contenders = [WriterLease(Catalog.open(storage.object_store()), 60_000) for _ in range(4)]
    barrier = threading.Barrier(len(contenders))
    outcome: list = [None] * len(contenders)

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcome[i] = contenders[i].acquire()
        except WriterLeaseHeldError as exc:
            outcome[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(contenders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    winners = [i for i, o in enumerate(outcome) if isinstance(o, int)]
    assert len(winners) == 1, outcome
    winner = contenders[winners[0]]
    assert outcome[winners[0]] == 2
    for i, o in enumerate(outcome):
        if i != winners[0]:
            assert isinstance(o, WriterLeaseHeldError), o
            assert winner.owner in o.holder
    assert open_catalog(storage).state.lease.owner == winner.owner


def test_forced_takeover_is_not_starved_by_a_busy_writer(storage):
    cat_a = Catalog.open(storage.object_store())
    a_epoch = WriterLease(cat_a, 60_000).acquire()
    store_b = storage.object_store()
    cat_b = Catalog.open(store_b)
    busy = {"left": 12}  # the busy writer wins the next commit number 12 times in a row, then pauses
    original = store_b.put_if_absent

    def put_if_absent(key, data):
        if key.startswith("_catalog/commits/") and busy["left"] > 0:
            busy["left"] -= 1
            cat_a.commit([_topic_action(f"busy-{busy['left']}")], lease_epoch=a_epoch)
        return original(key, data)

    store_b.put_if_absent = put_if_absent
    b_epoch = WriterLease(cat_b, 60_000).acquire(force=True)
    assert b_epoch == a_epoch + 1
    with pytest.raises(WriterFencedError):
        cat_a.commit([_topic_action("zombie")], lease_epoch=a_epoch)


@cross_process
def test_forced_takeover_fences_live_holder_in_other_process(storage, writer_procs):
    w = writer_procs(storage, {"storage.lease.ms": 60_000, "storage.checkpoint.interval": 10})
    assert w.request("create_topic", "created", topic="t", partitions=2)["error"] is None
    # (a writer that commits flat out can starve a forced takeover: see
    # test_forced_takeover_is_not_starved_by_a_busy_writer)
    w.request("stream", "streaming", topic="t", prefix="zombie", pause_ms=50, batch=5)
    w.wait_acks(30)

    producer = Producer(client_conf(storage, {"storage.lease.force": True}))
    reports = _Reports()
    producer.produce("t", value=b"taker", partition=0, on_delivery=reports)
    assert producer.flush(10) == 0
    assert len(reports.ok) == 1
    taken = open_catalog(storage)
    assert taken.state.lease.info["pid"] == os.getpid()
    # The old holder keeps producing but commits nothing more; it learns it was fenced.
    deadline = time.monotonic() + 10
    while not any("lost the writer lease" in line for line in w.stderr):
        assert time.monotonic() < deadline, f"the zombie never noticed it was fenced\n{w.describe()}"
        time.sleep(0.05)
    time.sleep(0.3)
    assert w.proc.poll() is None  # still running, still trying
    w.kill()  # (a fenced writer process cannot stop cleanly: see test_fenced_writer_process_can_flush_and_close)
    assert not w.of("ack_error") or all(e["code"] == KafkaError._FENCED and e["fatal"] for e in w.of("ack_error"))

    cat = open_catalog(storage)
    assert cat.version == taken.version, "the zombie committed after the takeover"
    assert cat.state.lease.info["pid"] == os.getpid() and not cat.state.lease.released
    log = read_topic(storage, "t")
    zombie_rows = {(p, o, v) for p, rows in log.items() for o, v in rows if v.startswith("zombie")}
    acked = {(a["partition"], a["offset"], a["value"]) for a in w.acks()}
    assert acked <= zombie_rows  # nothing it acknowledged is lost
    assert reports.ok[0] == (0, len(log[0]) - 1, "taker")  # the taker's record is the last one
    for p, rows in log.items():
        assert [o for o, _ in rows] == list(range(len(rows)))
    producer.close()


def test_fenced_producer_gets_fatal_fenced_reports(storage, close_engines):
    """A zombie Producer (its engine's lease taken over in-process) commits nothing more:
    its delivery reports fail with _FENCED (-144), fatal."""
    producer = Producer(client_conf(storage, {"storage.lease.ms": 60_000}))
    admin = AdminClient(client_conf(storage))
    admin.create_topics([NewTopic("t", num_partitions=1)])["t"].result()
    reports = _Reports()
    producer.produce("t", value=b"before", on_delivery=reports)
    assert producer.flush(10) == 0 and reports.ok == [(0, 0, "before")]
    taker = Broker(storage.object_store(), BrokerConfig(lease_force=True))
    try:
        taker.ensure_writer()
        version = open_catalog(storage).version
        producer.produce("t", value=b"zombie-0", on_delivery=reports)
        assert producer.flush(10) == 0
        for i in (1, 2):  # the producer is in the fatal state now: every later call fails
            with pytest.raises(KafkaException) as fatal:
                producer.produce("t", value=f"zombie-{i}".encode(), on_delivery=reports)
            assert fatal.value.args[0].code() == KafkaError._FATAL and fatal.value.args[0].fatal()
        assert [e.code() for e in reports.errors] == [KafkaError._FENCED]
        assert all(e.fatal() and not e.retriable() for e in reports.errors)
        assert "lost the writer lease" in reports.errors[0].str()
        cat = open_catalog(storage)
        assert cat.version == version and cat.state.partition("t", 0).high_watermark == 1
        assert read_partition(storage, "t", 0) == [(0, "before")]
    finally:
        taker.close()
        producer.close()
        admin.close()


def test_fenced_writer_process_can_flush_and_close():
    """A zombie's producer must fail its records and return, not hang (deterministic replay of
    the interleaving in a throw-away process: tests/helpers/fenced_flush_proc.py)."""
    proc = subprocess.run([sys.executable, FENCED_FLUSH_HELPER], capture_output=True, text=True, timeout=60)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert events, proc.stderr[-3000:]
    result = events[-1]
    assert result["event"] == "completed", result


def test_fenced_producer_raises_fatal_on_next_produce(storage, close_engines):
    producer = Producer(client_conf(storage, {"storage.lease.ms": 60_000}))
    admin = AdminClient(client_conf(storage))
    admin.create_topics([NewTopic("t", num_partitions=1)])["t"].result()
    reports = _Reports()
    producer.produce("t", value=b"before", on_delivery=reports)
    assert producer.flush(10) == 0
    taker = Broker(storage.object_store(), BrokerConfig(lease_force=True))
    try:
        taker.ensure_writer()
        producer.produce("t", value=b"zombie", on_delivery=reports)
        producer.flush(10)
        assert [e.code() for e in reports.errors] == [KafkaError._FENCED]
        with pytest.raises(KafkaException) as excinfo:
            producer.produce("t", value=b"after-fatal")
        assert excinfo.value.args[0].code() == KafkaError._FATAL
    finally:
        taker.close()
        producer.close()
        admin.close()


# ----------------------------------------------------------------------------------------
# 4. A clean exit releases the lease at once.
# ----------------------------------------------------------------------------------------
@cross_process
@pytest.mark.parametrize("how", ["close", "interpreter-exit"])
def test_clean_exit_releases_lease_at_once(storage, writer_procs, how, request):
    w = writer_procs(storage, {"storage.lease.ms": 60_000})
    assert w.request("create_topic", "created", topic="t", partitions=1)["error"] is None
    w.request("produce", "produced", topic="t", n=10, prefix="old")
    if how == "close":
        w.request("close", "closed")  # Producer.close() and AdminClient.close()
    w.send("exit")                    # otherwise atexit (registry.close_all) releases it
    w.wait_exit(expect=0)
    cat = open_catalog(storage)
    assert cat.state.lease.released and cat.state.lease.info["pid"] == w.pid
    old_epoch = cat.state.lease.epoch

    started = time.monotonic()
    producer = Producer(client_conf(storage, {"storage.lease.ms": 60_000}))  # no force
    reports = _Reports()
    producer.produce("t", value=b"next", on_delivery=reports)
    assert producer.flush(10) == 0
    assert time.monotonic() - started < 10  # did not wait out the 60 s lease
    assert reports.ok == [(0, 10, "next")]
    cat = open_catalog(storage)
    assert cat.state.lease.epoch == old_epoch + 1 and cat.state.lease.info["pid"] == os.getpid()
    _assert_acked_present(storage, w.acks(), "t")
    producer.close()


# ----------------------------------------------------------------------------------------
# 5. Readers never take the lease; the first write does.
# ----------------------------------------------------------------------------------------
@cross_process
def test_readers_work_and_tail_while_writer_runs_elsewhere(storage, writer_procs):
    w = writer_procs(storage, {"storage.lease.ms": 60_000, "storage.checkpoint.interval": 10})
    assert w.request("create_topic", "created", topic="t", partitions=1)["error"] is None
    w.request("produce", "produced", topic="t", n=10, prefix="pre")
    _, lease = _expiry_ms(storage)
    assert lease.info["pid"] == w.pid

    conf = client_conf(storage, {"group.id": "readers", "auto.offset.reset": "earliest",
                                 "enable.auto.commit": False})
    consumer = Consumer(conf)
    tp = TopicPartition("t", 0, OFFSET_BEGINNING)
    consumer.assign([tp])
    first = consume_all(consumer, 10)
    assert [(m.offset(), m.value()) for m in first] == [(i, f"pre-{i}".encode()) for i in range(10)]
    assert consumer.get_watermark_offsets(TopicPartition("t", 0)) == (0, 10)

    # Tailing: records committed after the consumer started arrive while the writer runs.
    w.request("stream", "streaming", topic="t", prefix="live", pause_ms=40, batch=5)
    tailed = consume_all(consumer, 30)
    assert len(tailed) >= 30 and all(m.offset() >= 10 for m in tailed)
    # Other readers work meanwhile: Catalog.open, listing, metadata.
    cat = open_catalog(storage)
    assert cat.state.partition("t", 0).high_watermark >= 40
    assert any(o.key.startswith("data/") for o in cat.store.list("data/"))
    admin = AdminClient(client_conf(storage))
    assert "t" in admin.list_topics().topics
    assert "t" in consumer.list_topics().topics
    # DuckDB views and the CLI's read commands read (and tail) too.
    con = txlake.duckdb.connect(storage.url, dict(storage.options))
    seen = con.execute('SELECT count(*) FROM "t"').fetchone()[0]
    assert seen >= 40
    deadline = time.monotonic() + 10
    while True:
        txlake.duckdb.refresh(con)
        now_seen = con.execute('SELECT count(*), max("offset") + 1 FROM "t"').fetchone()
        if now_seen[0] > seen:
            break
        assert time.monotonic() < deadline, "the DuckDB view never saw a new commit"
        time.sleep(0.05)
    assert now_seen[0] == now_seen[1]  # offsets 0..n-1, exactly the committed records
    con.close()
    w.request("stop_stream", "stream_stopped")

    # The CLI's read commands, while the writer process still runs and holds the lease.
    acks = w.acks()
    cli = _storage_args(storage)
    assert _cli(["topics", "list", *cli]).stdout.split() == ["t"]
    assert "Topic: t" in _cli(["topics", "describe", "t", *cli]).stdout
    out = _cli(["consume", "t", "--from-beginning", "--max-messages", "12", "--value-only", *cli]).stdout
    assert out.split() == [f"pre-{i}" for i in range(10)] + ["live-0", "live-1"]
    out = _cli(["sql", 'SELECT count(*) AS n FROM "t"', "--format", "jsonl", *cli]).stdout
    assert json.loads(out.strip().splitlines()[0]) == {"n": len(acks)}
    rest = consume_all(consumer, len(acks) - len(first) - len(tailed))
    got = [(m.offset(), m.value().decode()) for m in first + tailed + rest]
    assert got == sorted((a["offset"], a["value"]) for a in acks)
    assert got == [(i, v) for i, v in enumerate(v for _, v in got)]

    # The readers never touched the lease; the writer still holds it and still writes.
    after = open_catalog(storage).state.lease
    assert (after.epoch, after.owner, after.released) == (lease.epoch, lease.owner, False)
    w.request("produce", "produced", topic="t", n=5, prefix="post")
    assert len(consume_all(consumer, 5)) == 5
    consumer.close()
    admin.close()
    assert open_catalog(storage).state.lease.owner == lease.owner


def _storage_args(storage) -> list[str]:
    args = ["--storage", storage.url]
    for k, v in storage.options.items():
        args += ["-O", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    return args


def _cli(args: list[str]):
    from click.testing import CliRunner

    from txlake.cli import main

    result = CliRunner().invoke(main, args, catch_exceptions=False, env={"COLUMNS": "200"})
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def test_consumer_of_a_superseded_writer_process_keeps_tailing(storage, close_engines):
    conf = client_conf(storage, {"storage.lease.ms": 60_000})
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("t", num_partitions=1)])["t"].result()
    producer = Producer(conf)
    producer.produce("t", value=b"old")
    assert producer.flush(10) == 0
    consumer = Consumer({**conf, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
    assert [m.value() for m in consume_all(consumer, 1)] == [b"old"]
    taker = Broker(storage.object_store(), BrokerConfig(lease_force=True))  # another writer takes over
    try:
        (res,) = taker.produce([ProduceBatch("t", 0, _records(["new"]))])
        assert (res.error, res.base_offset) == (Errors.NO_ERROR, 1)
        assert [m.value() for m in consume_all(consumer, 1, timeout=0.6)] == [b"new"]
        assert consumer.get_watermark_offsets(TopicPartition("t", 0)) == (0, 2)
    finally:
        taker.close()
        consumer.close()
        producer.close()
        admin.close()


def _commit_actions(storage, version: int) -> list[dict]:
    store = storage.object_store()
    return decode_actions(store.get(commit_key(version)), COMMIT_KIND, store.uri(commit_key(version)))


def test_lease_taken_on_first_write_only(storage, close_engines):
    store = storage.object_store()
    conf = client_conf(storage, {"storage.lease.ms": 60_000})
    producer = Producer(conf)
    admin = AdminClient(conf)
    consumer = Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest"})
    producer.list_topics()
    admin.list_topics()
    consumer.list_topics()
    producer.poll(0)
    assert producer.flush(1) == 0
    validated = admin.create_topics([NewTopic("t", num_partitions=1)], validate_only=True)["t"]
    assert validated.result() is None
    assert store.list("_catalog/") == [], "opening clients, reading metadata or validating must not write"
    assert open_catalog(storage).state.lease is None

    admin.create_topics([NewTopic("t", num_partitions=1)])["t"].result()  # the first write
    cat = open_catalog(storage)
    assert [a["action"] for a in _commit_actions(storage, 1)] == [LEASE]
    assert cat.state.lease.epoch == 1 and cat.state.lease.info == {"host": socket.gethostname(), "pid": os.getpid()}
    for client in (producer, admin, consumer):
        client.close()
    cat = open_catalog(storage)
    assert cat.state.lease.released
    version = cat.version

    # Reading an existing topic takes nothing; the first produce takes the lease.
    producer = Producer(conf)
    consumer = Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
    assert consumer.consume(10, timeout=0.2) == []
    assert consumer.get_watermark_offsets(TopicPartition("t", 0)) == (0, 0)
    cat = open_catalog(storage)
    assert cat.version == version and cat.state.lease.epoch == 1 and cat.state.lease.released
    producer.produce("t", value=b"v")
    assert producer.flush(10) == 0
    cat = open_catalog(storage)
    assert cat.state.lease.epoch == 2 and not cat.state.lease.released
    assert [a["action"] for a in _commit_actions(storage, version + 1)] == [LEASE]
    assert [m.value() for m in consume_all(consumer, 1)] == [b"v"]
    producer.close()
    consumer.close()


def test_lease_taken_when_its_first_heartbeat_put_fails(tmp_path):
    """Soak seeds 276 and 330 (benchmarks/soak_verify.py, PUT errors): the lease's catalog commit
    landed but the first heartbeat PUT failed (503/reset), and acquire raised -- the request that
    needed the lease failed, and every later one answered NOT_LEADER_OR_FOLLOWER, "held by" this
    very process's failed attempt, until the lease expired. Now the lease stands from its commit
    (the commit's PUT passes, every attempt of the heartbeat's fails: the heartbeat is retried
    since), and others see it held."""
    from txlake.catalog.catalog import Catalog
    from txlake.catalog.storage import ObjectStore, StorageError
    from txlake.catalog.writer_lease import WriterLease, WriterLeaseHeldError, heartbeat_key

    url = f"file://{tmp_path}/root"
    store = ObjectStore(url)
    put, failed = store.put, []

    def put_failing_heartbeats(key, *args, **kwargs):
        if key == heartbeat_key(1):
            failed.append(key)
            raise StorageError(store.uri(key), "PUT", "503 SlowDown (made to fail by the test)")
        return put(key, *args, **kwargs)

    store.put = put_failing_heartbeats
    assert WriterLease(Catalog.open(store), 15_000).acquire() == 1
    assert len(failed) >= 1
    assert ObjectStore(url).get_or_none(heartbeat_key(1)) is None
    with pytest.raises(WriterLeaseHeldError, match=r"lease epoch 1\); a second writer cannot start"):
        WriterLease(Catalog.open(ObjectStore(url)), 15_000).acquire()
