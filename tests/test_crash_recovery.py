"""Crash recovery: orphaned objects, SIGKILLed writers, producer-state recovery.

What is proved here (DESIGN.md "Correct under crash at any point"):

* a crash between writing a data object and committing it leaves an orphan that
  readers (Consumer, Catalog + the objects it names) never see; a new writer deletes
  orphans older than ``storage.orphan.grace.ms`` on start-up and keeps younger ones;
  nothing committed is lost;
* a writer SIGKILLed at random points of a produce loop, again and again, loses no
  acknowledged record: each is present exactly once at its acknowledged offset, offsets
  are 0..HW-1, every object the catalog names exists, and a new idempotent writer goes on;
* producer state survives a restart -- from the snapshot a clean close or
  ``storage.producer.snapshot.interval`` writes, or by replaying the log when there is
  none: a new broker answers an exact duplicate with the original offsets
  (duplicate=True, HW unchanged) and a sequence gap with OUT_OF_ORDER_SEQUENCE_NUMBER.
"""

from __future__ import annotations

import os
import random
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from helpers import client_conf, close_engines, consume_all, open_catalog, read_partition, read_topic  # noqa: F401
from helpers import writer_procs  # noqa: F401
from txlake import OFFSET_BEGINNING, AdminClient, Consumer, NewTopic, Producer, TopicPartition
from txlake.engine.group_commit import MAX_FLUSHES_IN_PIPELINE
from txlake.catalog.storage import TEMP_PREFIX
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.engine.errors import Errors
from txlake.engine import log_loader
from txlake.engine.log_reader import LogReader
from txlake.engine.registry import acquire_broker, release_broker
from txlake.formats.records import PAYLOAD_SCHEMA, read_segment

cross_process = pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])


def _records(values: list[str]) -> pa.Table:
    return pa.Table.from_pylist([{"timestamp": 1_700_000_000_000 + i, "key": None, "value": v.encode(), "headers": None}
                                 for i, v in enumerate(values)], schema=PAYLOAD_SCHEMA)


class _Reports:
    def __init__(self):
        self.ok: list[tuple[int, int, str]] = []
        self.errors: list = []

    def __call__(self, err, msg) -> None:
        if err is None:
            self.ok.append((msg.partition(), msg.offset(), msg.value().decode()))
        else:
            self.errors.append(err)


def _data_objects(storage) -> set[str]:
    return {o.key for o in storage.object_store().list("data/")}


def _assert_references_exist(storage) -> set[str]:
    """Every object the catalog names exists; returns them."""
    store = storage.object_store()
    referenced = open_catalog(storage).state.referenced_paths()
    missing = [k for k in referenced if not store.exists(k)]
    assert not missing, f"the catalog names objects that are gone: {missing}"
    return referenced


def _consume_everything(storage, topic: str, partitions: int, expected: int) -> list[tuple[int, int, str]]:
    consumer = Consumer(client_conf(storage, {"group.id": "check", "auto.offset.reset": "earliest"}))
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        msgs = consume_all(consumer, expected, timeout=10)
        msgs += consumer.consume(1000, timeout=0.2)  # nothing more may come
        return sorted((m.partition(), m.offset(), m.value().decode()) for m in msgs)
    finally:
        consumer.close()


# ----------------------------------------------------------------------------------------
# 6. Orphans: a data object no commit names.
# ----------------------------------------------------------------------------------------
def test_orphan_objects_are_ignored_by_readers_and_cleaned_by_grace(storage, close_engines):
    conf = client_conf(storage, {"storage.lease.ms": 60_000})
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("t", num_partitions=2)])["t"].result()
    producer = Producer(conf)
    reports = _Reports()
    for i in range(20):
        producer.produce("t", value=f"v{i}".encode(), key=f"k{i}".encode(), on_delivery=reports)
    assert producer.flush(10) == 0
    producer.close()
    admin.close()
    committed = sorted(reports.ok)
    assert len(committed) == 20

    # What a crash between writing a data object and committing it leaves: a complete
    # segment object no commit names (a copy of a committed one, so its rows would
    # duplicate committed offsets if read), and a half-written one.
    store = storage.object_store()
    referenced = _assert_references_exist(storage)
    source = sorted(k for k in referenced if k.startswith("data/"))[0]
    orphan = "data/0000000000000-00000000orphan0000000000000000000.parquet"
    partial = "data/0000000000001-00000000partial000000000000000000.parquet"
    store.put(orphan, store.get(source))
    store.put(partial, store.get(source)[:100])
    time.sleep(0.05)

    # Readers see exactly the committed records.
    assert _consume_everything(storage, "t", 2, 20) == committed
    assert sorted((p, o, v) for p, rows in read_topic(storage, "t").items() for o, v in rows) == committed
    assert orphan not in open_catalog(storage).state.referenced_paths()

    # A new writer with a long grace period keeps the young orphans ...
    producer = Producer({**conf, "storage.orphan.grace.ms": 3_600_000})
    producer.produce("t", value=b"w2", partition=0, on_delivery=reports)
    assert producer.flush(10) == 0
    producer.close()
    assert store.exists(orphan) and store.exists(partial)

    # ... and one with grace 0 deletes them on start-up, and nothing referenced.
    producer = Producer({**conf, "storage.orphan.grace.ms": 0})
    producer.produce("t", value=b"w3", partition=1, on_delivery=reports)
    assert producer.flush(10) == 0
    assert not store.exists(orphan) and not store.exists(partial)
    referenced = _assert_references_exist(storage)
    assert _data_objects(storage) == {k for k in referenced if k.startswith("data/")}
    producer.close()

    everything = sorted(reports.ok)
    assert len(everything) == 22
    assert sorted((p, o, v) for p, rows in read_topic(storage, "t").items() for o, v in rows) == everything
    assert _consume_everything(storage, "t", 2, 22) == everything


@pytest.mark.parametrize("backend", ["file"])
def test_orphan_grace_is_measured_by_object_age(storage, close_engines):
    conf = client_conf(storage, {"storage.lease.ms": 60_000})
    producer = Producer(conf)
    AdminClient(conf).create_topics([NewTopic("t", num_partitions=1)])["t"].result()
    producer.produce("t", value=b"v")
    assert producer.flush(10) == 0
    producer.close()
    from txlake.engine.registry import close_all

    close_all()
    store = storage.object_store()
    old, young = "data/0000000000000-old-orphan.parquet", "data/0000000000001-young-orphan.parquet"
    store.put(old, b"PAR1 half written")
    store.put(young, b"PAR1 half written")
    two_hours_ago = time.time() - 7200
    os.utime(store.fs_path(old), (two_hours_ago, two_hours_ago))
    producer = Producer({**conf, "storage.orphan.grace.ms": 3_600_000})
    producer.produce("t", value=b"w")
    assert producer.flush(10) == 0
    assert not store.exists(old), "an orphan older than the grace period was kept"
    assert store.exists(young), "an orphan younger than the grace period was deleted"
    assert [v for _, v in read_partition(storage, "t", 0)] == ["v", "w"]
    producer.close()


@pytest.mark.parametrize("backend", ["file"])
def test_crash_leftover_temp_files_are_cleaned(storage, close_engines):
    conf = client_conf(storage, {"storage.lease.ms": 60_000, "storage.orphan.grace.ms": 0})
    AdminClient(conf).create_topics([NewTopic("t", num_partitions=1)])["t"].result()
    from txlake.engine.registry import close_all

    close_all()
    store = storage.object_store()
    # What a writer killed in the middle of writing a data object leaves behind.
    leftover = os.path.join(os.path.dirname(store.fs_path("data/x.parquet")), f"{TEMP_PREFIX}deadbeef-x.parquet")
    os.makedirs(os.path.dirname(leftover), exist_ok=True)
    with open(leftover, "wb") as f:
        f.write(b"PAR1 half written")
    two_hours_ago = time.time() - 7200
    os.utime(leftover, (two_hours_ago, two_hours_ago))
    producer = Producer(conf)
    producer.produce("t", value=b"w")
    assert producer.flush(10) == 0
    producer.close()
    assert not os.path.exists(leftover), "a crash-leftover temp file under data/ is never deleted"


@cross_process
def test_crash_between_data_object_and_commit(storage, writer_procs):
    conf = client_conf(storage, {"storage.lease.ms": 60_000})
    w = writer_procs(storage, {"storage.lease.ms": 60_000})
    assert w.request("create_topic", "created", topic="t", partitions=1)["error"] is None
    w.request("produce", "produced", topic="t", n=5, prefix="ok", partition=0)
    w.request("crash_before_commit", "armed")
    w.send("produce", topic="t", n=3, prefix="lost", partition=0)
    crash = w.wait_event("crashing")
    w.wait_exit(expect=-9)
    assert [a["value"] for a in w.acks()] == [f"ok-{i}" for i in range(5)]

    # The object was written; no commit names it; it holds the lost records at offsets 5..
    store = storage.object_store()
    (orphan,) = crash["paths"]
    assert store.exists(orphan)
    cat = open_catalog(storage)
    assert orphan not in cat.state.referenced_paths()
    assert cat.state.partition("t", 0).high_watermark == 5
    lost = read_segment(store.get(orphan), store.uri(orphan))
    assert lost.column("offset").to_pylist()[0] == 5
    assert all(v.startswith(b"lost") for v in lost.column("value").to_pylist())

    # Readers ignore it.
    expected = [(0, i, f"ok-{i}") for i in range(5)]
    assert _consume_everything(storage, "t", 1, 5) == expected

    # A new writer (forced: the dead one's lease is still live) with a long grace keeps
    # the young orphan, and reuses the offsets it holds; readers see only the commit.
    reports = _Reports()
    producer = Producer({**conf, "storage.lease.force": True, "storage.orphan.grace.ms": 3_600_000})
    producer.produce("t", value=b"new-0", partition=0, on_delivery=reports)
    assert producer.flush(10) == 0
    producer.close()
    assert store.exists(orphan)
    assert reports.ok == [(0, 5, "new-0")]
    assert _consume_everything(storage, "t", 1, 6) == expected + [(0, 5, "new-0")]

    # With grace 0 the next writer deletes it; nothing committed is lost.
    producer = Producer({**conf, "storage.orphan.grace.ms": 0})
    producer.produce("t", value=b"new-1", partition=0, on_delivery=reports)
    assert producer.flush(10) == 0
    producer.close()
    assert not store.exists(orphan)
    _assert_references_exist(storage)
    final = expected + [(0, 5, "new-0"), (0, 6, "new-1")]
    assert _consume_everything(storage, "t", 1, 7) == final
    assert [(0, o, v) for o, v in read_partition(storage, "t", 0)] == final


# ----------------------------------------------------------------------------------------
# SIGKILL at random points of a produce loop, again and again.
# ----------------------------------------------------------------------------------------
ROUNDS = 5


def _last_batches(storage, topic: str, partition: int) -> list[dict]:
    """The last batch each producer id wrote to a partition, read from the log."""
    cat = open_catalog(storage)
    p = cat.state.partition(topic, partition)
    table = LogReader(cat).read(topic, partition, 0, p.high_watermark)
    table = table.filter(pc.greater_equal(table.column("producer_id"), 0))
    last: dict[int, dict] = {}
    for row in table.select(["producer_id", "producer_epoch", "base_sequence", "base_offset", "offset",
                             "timestamp", "value"]).to_pylist():
        entry = last.get(row["producer_id"])
        if entry is None or row["base_offset"] > entry["base_offset"]:
            entry = last[row["producer_id"]] = {**row, "values": [], "timestamps": []}
        if row["base_offset"] == entry["base_offset"]:
            entry["values"].append(row["value"])
            entry["timestamps"].append(row["timestamp"])
    return list(last.values())


@cross_process
def test_repeated_sigkill_loses_no_acknowledged_record(storage, writer_procs):
    rng = random.Random(20240601)
    partitions = 3
    acks: list[dict] = []
    kills = 0
    conf = {"storage.lease.ms": 60_000, "storage.lease.force": True,
            # (checkpoints and producer-state snapshots every few commits keep restarts fast:
            # recovery = latest snapshot + replay of the log after it)
            "storage.checkpoint.interval": 10, "storage.producer.snapshot.interval": 5}
    upcoming = writer_procs(storage, conf)
    for r in range(ROUNDS):
        # Each new writer force-takes the lease of the one just killed.
        w = upcoming
        if r == 0:
            assert w.request("create_topic", "created", topic="t", partitions=partitions)["error"] is None
        w.request("stream", "streaming", topic="t", prefix=f"r{r}", pause_ms=0, batch=20)
        w.wait_acks(1)
        if r + 1 < ROUNDS:
            upcoming = writer_procs(storage, conf)  # starts up while this one runs
        time.sleep(rng.uniform(0.0, 0.25))
        w.kill()
        kills += 1
        acks += w.acks()
        assert not w.of("ack_error"), w.of("ack_error")[:3]
    assert len(acks) >= ROUNDS

    # Every object the catalog names exists; what else is under data/ is an orphan: at most
    # MAX_FLUSHES_IN_PIPELINE per kill (a flush PUTs its one object, then waits its turn to
    # commit; that many flushes are between taking the queue and committing).
    referenced = _assert_references_exist(storage)
    orphans = _data_objects(storage) - referenced
    assert len(orphans) <= kills * MAX_FLUSHES_IN_PIPELINE, orphans

    # Every acknowledged record exactly once, at its offset; offsets 0..HW-1.
    log = read_topic(storage, "t")
    by_offset = {p: dict(rows) for p, rows in log.items()}
    for p, rows in log.items():
        assert [o for o, _ in rows] == list(range(len(rows))), f"offsets of partition {p} are not contiguous"
    values = [v for rows in log.values() for _, v in rows]
    assert len(values) == len(set(values)), "a record is in the log twice"
    for ack in acks:
        assert by_offset[ack["partition"]].get(ack["offset"]) == ack["value"], f"acknowledged record lost: {ack}"
    hws = {p: len(rows) for p, rows in log.items()}
    # Readers ignore the orphans.
    consumed = _consume_everything(storage, "t", partitions, sum(hws.values()))
    assert consumed == sorted((p, o, v) for p, rows in log.items() for o, v in rows)

    # A new writer (grace 0) cleans the orphans and an idempotent producer keeps writing.
    conf = client_conf(storage, {"storage.lease.ms": 60_000, "storage.lease.force": True,
                                 "storage.orphan.grace.ms": 0})
    producer = Producer(conf)
    reports = _Reports()
    for i in range(30):
        producer.produce("t", value=f"after-{i}".encode(), key=f"k{i}".encode(), on_delivery=reports)
    assert producer.flush(10) == 0 and not reports.errors
    for p in range(partitions):
        mine = sorted(o for q, o, _ in reports.ok if q == p)
        assert mine == list(range(hws[p], hws[p] + len(mine)))
    assert not (_data_objects(storage) & orphans), "orphans survived a writer start with grace 0"
    _assert_references_exist(storage)

    # Producer-state recovery: the dead producers' last batches are still known.
    cfg_broker = acquire_broker(storage.url, dict(storage.options))
    try:
        for p in range(partitions):
            hw = cfg_broker.catalog.state.partition("t", p).high_watermark
            for last in _last_batches(storage, "t", p):
                if last["value"].startswith(b"after"):
                    continue
                records = pa.Table.from_pylist(
                    [{"timestamp": ts, "key": None, "value": v, "headers": None}
                     for ts, v in zip(last["timestamps"], last["values"])], schema=PAYLOAD_SCHEMA)
                batch = ProduceBatch("t", p, records, last["producer_id"], last["producer_epoch"],
                                     last["base_sequence"])
                (res,) = cfg_broker.produce([batch])
                assert (res.error, res.base_offset, res.duplicate) == (Errors.NO_ERROR, last["base_offset"], True)
                gap = ProduceBatch("t", p, records.slice(0, 1), last["producer_id"], last["producer_epoch"],
                                   last["base_sequence"] + len(last["values"]) + 1)
                (res,) = cfg_broker.produce([gap])
                assert res.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER
            assert cfg_broker.catalog.state.partition("t", p).high_watermark == hw
    finally:
        release_broker(cfg_broker)
    producer.close()


# ----------------------------------------------------------------------------------------
# 7. Producer state survives a restart: snapshot, or log replay.
# ----------------------------------------------------------------------------------------
BATCHES = [(["v0", "v1"], 0, 0), (["v2", "v3", "v4"], 2, 2), (["v5"], 5, 5)]  # (values, base seq, base offset)


@pytest.fixture
def replay_spy(monkeypatch):
    """Record every ``(topic, partition, start, end)`` a broker replays producer state from."""
    calls: list[tuple[str, int, int, int]] = []
    original = log_loader.replay_producer_state

    def spy(reader, psm, start, end):
        calls.append((psm.topic, psm.partition, start, end))
        return original(reader, psm, start, end)

    monkeypatch.setattr(log_loader, "replay_producer_state", spy)
    return calls


def _check_recovered_state(storage, broker: Broker, pid: int, epoch: int) -> None:
    """A restarted broker knows the producer: duplicate -> original offsets; gap -> refused."""
    hw = open_catalog(storage).state.partition("t", 0).high_watermark
    assert hw == 6
    (res,) = broker.produce([ProduceBatch("t", 0, _records(["v2", "v3", "v4"]), pid, epoch, 2)])
    assert (res.error, res.base_offset, res.duplicate) == (Errors.NO_ERROR, 2, True)
    (res,) = broker.produce([ProduceBatch("t", 0, _records(["v5"]), pid, epoch, 5)])
    assert (res.error, res.base_offset, res.duplicate) == (Errors.NO_ERROR, 5, True)
    assert broker.catalog.state.partition("t", 0).high_watermark == hw
    assert open_catalog(storage).state.partition("t", 0).high_watermark == hw
    (res,) = broker.produce([ProduceBatch("t", 0, _records(["gap"]), pid, epoch, 7)])
    assert res.error == Errors.OUT_OF_ORDER_SEQUENCE_NUMBER == 45
    (res,) = broker.produce([ProduceBatch("t", 0, _records(["v6"]), pid, epoch, 6)])
    assert (res.error, res.base_offset, res.duplicate) == (Errors.NO_ERROR, 6, False)
    assert read_partition(storage, "t", 0) == [(i, f"v{i}") for i in range(7)]


@pytest.mark.parametrize("snapshot", ["intact", "corrupt"])
def test_producer_state_recovered_after_clean_close(storage, replay_spy, snapshot):
    a = Broker(storage.object_store(), BrokerConfig(lease_ms=60_000))
    try:
        assert a.create_topics([("t", 1, {})]) == [(Errors.NO_ERROR, "")]
        err, pid, epoch = a.init_producer_id()
        for values, seq, offset in BATCHES:
            (res,) = a.produce([ProduceBatch("t", 0, _records(values), pid, epoch, seq)])
            assert (res.error, res.base_offset) == (Errors.NO_ERROR, offset)
    finally:
        a.close()  # writes a producer-state snapshot and releases the lease
    cat = open_catalog(storage)
    assert cat.state.lease.released and cat.state.producer_snapshot is not None
    if snapshot == "corrupt":  # an unreadable snapshot: rebuild from the whole log
        storage.object_store().put(cat.state.producer_snapshot, b"PAR1 not a snapshot")
    replay_spy.clear()
    b = Broker(storage.object_store(), BrokerConfig(lease_ms=60_000))
    try:
        _check_recovered_state(storage, b, pid, epoch)
        start = 6 if snapshot == "intact" else 0
        assert replay_spy[0] == ("t", 0, start, 6), replay_spy
    finally:
        b.close()


@cross_process
@pytest.mark.parametrize("ending", ["sigkill-snapshot", "sigkill-replay"])
def test_producer_state_recovered_after_sigkill_of_writer_process(storage, writer_procs, replay_spy, ending):
    interval = 1 if ending == "sigkill-snapshot" else 50
    w = writer_procs(storage, {"storage.lease.ms": 60_000, "storage.producer.snapshot.interval": interval})
    assert w.request("create_topic", "created", topic="t", partitions=1)["error"] is None
    got = w.request("init_pid", "pid")
    assert got["error"] == 0
    pid, epoch = got["producer_id"], got["producer_epoch"]
    for values, seq, offset in BATCHES:
        res = w.request("broker_produce", "produce_result", topic="t", partition=0, values=values,
                        producer_id=pid, producer_epoch=epoch, base_sequence=seq)
        assert (res["error"], res["base_offset"], res["duplicate"]) == (0, offset, False), res
    w.kill()

    cat = open_catalog(storage)
    assert not cat.state.lease.released
    if ending == "sigkill-replay":
        assert cat.state.producer_snapshot is None  # nothing to start from but the log
    else:
        assert cat.state.producer_snapshot is not None
    replay_spy.clear()
    b = Broker(storage.object_store(), BrokerConfig(lease_ms=60_000, lease_force=True))
    try:
        _check_recovered_state(storage, b, pid, epoch)
        if ending == "sigkill-replay":
            start = 0
        else:  # the newest snapshot: the flushes after the first carried fewer bytes than it holds
            from txlake.formats.producer_state import decode_snapshot

            _, ends = decode_snapshot(storage.object_store().get(cat.state.producer_snapshot), "snapshot")
            start = ends["t"]["end_offsets"][0]
            assert start == 2  # the first flush's two records
        assert replay_spy[0] == ("t", 0, start, 6), replay_spy
    finally:
        b.close()
