"""The group commit's flush pipeline (engine/group_commit.py): two flushers encode side by side
only under a backlog, and the uploader commits flushes in the order they took their batches."""

import threading
import time

import pytest

from txlake.engine import group_commit
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.engine.errors import Errors
from helpers import payload


class GatedEncoder:
    """``encode_segments`` that holds the flush of topic ``t`` offset 0 until released, and
    records how many encodings ran at once."""

    def __init__(self, real):
        self.real = real
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.calls: list[int] = []  # first offset of topic t in each encoding, in start order
        self.first_started = threading.Event()
        self.release_first = threading.Event()
        self.later_done = threading.Event()

    def __call__(self, tables, *args, **kwargs):
        mine = [t for t in tables if t.column("topic")[0].as_py() == "t"]
        first = mine[0].column("offset")[0].as_py() if mine else None
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            if first is not None:
                self.calls.append(first)
        try:
            if first == 0:
                self.first_started.set()
                assert self.release_first.wait(30), "the test never released the first flush"
            return self.real(tables, *args, **kwargs)
        finally:
            with self.lock:
                self.running -= 1
            if first not in (None, 0):
                self.later_done.set()


@pytest.fixture
def gate(monkeypatch):
    g = GatedEncoder(group_commit.encode_segments)
    monkeypatch.setattr(group_commit, "encode_segments", g)
    yield g
    g.release_first.set()


def open_broker(storage, **config):
    broker = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, lease_ms=60_000, **config))
    broker.create_topics([("t", 1, {})])
    return broker


def test_under_a_backlog_a_second_flusher_encodes_and_commits_wait_their_turn(storage, gate):
    # a quarter of flush.max.bytes is below one batch: every queued batch is a backlog
    broker = open_broker(storage, flush_max_bytes=64)
    try:
        first = broker.produce_async([ProduceBatch("t", 0, payload(10))])[0]
        assert gate.first_started.wait(10)
        second = broker.produce_async([ProduceBatch("t", 0, payload(5, 10))])[0]
        assert gate.later_done.wait(10), "the second flusher did not encode beside the held one"
        time.sleep(0.2)
        # encoded, but its commit waits for the earlier flush: nothing is committed yet
        assert not first.done() and not second.done()
        assert broker.catalog.state.partition("t", 0).high_watermark == 0
        gate.release_first.set()
        assert (first.result(10).error, first.result(10).base_offset) == (Errors.NO_ERROR, 0)
        assert (second.result(10).error, second.result(10).base_offset) == (Errors.NO_ERROR, 10)
        segments = broker.catalog.state.partition("t", 0).segments
        assert [(s.base_offset, s.last_offset) for s in segments] == [(0, 9), (10, 14)]
        assert len({s.path for s in segments}) == 2  # one object per flush
        assert gate.most == 2 and gate.calls == [0, 10]
        assert broker.fetch("t", 0, 0).records.column("offset").to_pylist() == list(range(15))
    finally:
        broker.close()


def test_without_a_backlog_one_flusher_works_until_a_flush_is_asked_for(storage, gate):
    broker = open_broker(storage)  # flush.max.bytes 64 MiB: a few small batches are no backlog
    try:
        first = broker.produce_async([ProduceBatch("t", 0, payload(10))])[0]
        assert gate.first_started.wait(10)
        later = [broker.produce_async([ProduceBatch("t", 0, payload(2, 10 + 2 * i))])[0] for i in range(3)]
        time.sleep(0.3)  # far past the 1 ms linger: the later batches wait for the busy flusher
        assert gate.calls == [0] and gate.most == 1
        # flush() asks for everything now: the second flusher takes the queue beside the held one
        flushed = threading.Thread(target=broker.flush, daemon=True)
        flushed.start()
        assert gate.later_done.wait(10)
        assert gate.calls == [0, 10] and gate.most == 2
        assert not first.done() and not any(f.done() for f in later)
        gate.release_first.set()
        flushed.join(10)
        assert [f.result(10).base_offset for f in [first, *later]] == [0, 10, 12, 14]
        segments = broker.catalog.state.partition("t", 0).segments
        assert [(s.base_offset, s.last_offset) for s in segments] == [(0, 9), (10, 15)]  # the three in one flush
    finally:
        broker.close()


def test_a_failed_encoding_fails_its_batches_and_later_flushes_do_not_commit(storage, monkeypatch):
    """A flush that cannot be encoded stops the writer (its offsets were given out): its batches
    and every later one are answered with an error, and nothing after it is committed."""
    real = group_commit.encode_segments

    def broken(tables, *args, **kwargs):
        if any(t.column("topic")[0].as_py() == "t" and t.column("offset")[0].as_py() == 10 for t in tables):
            raise OSError("disk on fire")
        return real(tables, *args, **kwargs)

    monkeypatch.setattr(group_commit, "encode_segments", broken)
    broker = open_broker(storage)
    try:
        assert broker.produce([ProduceBatch("t", 0, payload(10))])[0].error == Errors.NO_ERROR
        assert broker.produce([ProduceBatch("t", 0, payload(5, 10))])[0].error == Errors.KAFKA_STORAGE_ERROR
        assert broker.produce([ProduceBatch("t", 0, payload(5, 15))])[0].error != Errors.NO_ERROR
        assert [(s.base_offset, s.last_offset) for s in broker.catalog.state.partition("t", 0).segments] == [(0, 9)]
    finally:
        broker.close()


def test_a_failed_put_fails_its_flush_in_commit_order(storage):
    """Flushers PUT their objects; a PUT that fails is reported by the uploader, in the flush's
    commit place: its batches get KAFKA_STORAGE_ERROR and nothing of it is committed."""
    broker = open_broker(storage)
    try:
        assert broker.produce([ProduceBatch("t", 0, payload(10))])[0].error == Errors.NO_ERROR
        real_put = broker.store.put

        def failing_put(key, data):
            if key.startswith("data/"):
                raise OSError(f"PUT {key} refused")
            return real_put(key, data)

        broker.store.put = failing_put
        result = broker.produce([ProduceBatch("t", 0, payload(5, 10))])[0]
        assert result.error == Errors.KAFKA_STORAGE_ERROR and "refused" in result.message
        assert [(s.base_offset, s.last_offset) for s in broker.catalog.state.partition("t", 0).segments] == [(0, 9)]
    finally:
        broker.close()


def test_encode_buffers_are_reused_one_per_flusher_and_dropped_when_far_too_big(storage):
    """A flush encodes its object into a buffer a previous flush's PUT is done with (its pages
    are mapped already); at most one per flusher is kept, and one more than 4x (+8 MiB) too big
    for a flush is dropped rather than held. They come from the engine's bulk pool."""
    from txlake.engine.memory import bulk_memory_pool

    broker = open_broker(storage)
    try:
        committer = broker._committer
        # a quarter more than asked, in whole MiB (a slightly bigger next flush fits it too)
        a, b, c = (committer._encode_buffer(size) for size in (100, 2 << 20, 3 << 20))
        assert [x.size for x in (a, b, c)] == [1 << 20, 3 << 20, 4 << 20]
        for x in (a, b, c):
            committer._release_buffer(x)
        assert [x.size for x in committer._buffers] == [4 << 20, 3 << 20]  # FLUSH_THREADS, the biggest
        assert committer._encode_buffer(1 << 20) is b  # the smallest that fits
        assert committer._encode_buffer(5 << 20).size == 7 << 20  # none fits: a new one
        # from the engine's bulk pool (issue 20: freed on another thread than it was allocated on)
        pool = bulk_memory_pool()
        before = pool.bytes_allocated()
        big = committer._encode_buffer(64 << 20)
        assert pool.bytes_allocated() - before == 80 << 20
        committer._release_buffer(big)
        assert [x.size for x in committer._buffers] == [80 << 20, 4 << 20]
        assert committer._encode_buffer(1 << 20) is c and committer._buffers == []  # big is > 4x + 8 MiB: dropped
    finally:
        broker.close()


def test_objects_encoded_into_reused_buffers_are_intact(storage, monkeypatch):
    """Flush after flush reuses one encode buffer (released when its object's PUT ends), and
    every object in storage holds exactly its flush's records, also under a backlog (two
    flushers); after BUFFER_KEEP_S idle, the buffers are let go."""
    from txlake.formats.records import read_segment

    targets = []
    real = group_commit.encode_segments

    def recording(tables, *args, **kwargs):
        targets.append(kwargs["target"].address)
        return real(tables, *args, **kwargs)

    monkeypatch.setattr(group_commit, "encode_segments", recording)
    monkeypatch.setattr(group_commit, "BUFFER_KEEP_S", 600)  # kept between the produce calls below
    broker = open_broker(storage, flush_max_bytes=64)  # every queued batch is a backlog
    try:
        for i in range(4):  # one flush at a time: each encodes into the buffer the one before used
            assert broker.produce([ProduceBatch("t", 0, payload(50, 50 * i, size=2_000))])[0].base_offset == 50 * i
        assert len(targets) == 4 and len(set(targets)) == 1
        futures = [broker.produce_async([ProduceBatch("t", 0, payload(50, 50 * i, size=2_000))])[0]
                   for i in range(4, 30)]
        assert [f.result(30).base_offset for f in futures] == [50 * i for i in range(4, 30)]
        values = []
        for seg in broker.catalog.state.partition("t", 0).segments:
            data = broker.store.get(seg.path)
            values += read_segment(data, seg.path, seg.row_groups).column("value").to_pylist()
        assert values == [(b"v%d-" % i).ljust(2_000, b"x") for i in range(1_500)]
        monkeypatch.setattr(group_commit, "BUFFER_KEEP_S", 0.05)  # the flush below idles the flushers again
        assert broker.produce([ProduceBatch("t", 0, payload(1, 1_500))])[0].base_offset == 1_500
        deadline = time.monotonic() + 10
        while broker._committer._buffers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert broker._committer._buffers == []
    finally:
        broker.close()


def test_a_flusher_takes_half_of_a_backlog_and_leaves_the_rest_to_the_idle_one(storage):
    """Under a backlog, with the other flusher idle, a flush takes the first half of the queued
    batches and the other flusher encodes the rest beside it (one flush of everything left the
    second flusher idle while a bulk load waited for the commit): two objects, in offset order."""
    broker = open_broker(storage, flush_max_bytes=64 * 1024)  # a backlog from 16 KiB queued
    try:
        # four 20 KB batches queued under one lock: the flush is due (64 KiB) once all are queued
        # (keys k10..k49: batches of equal bytes)
        futures = broker.produce_async([ProduceBatch("t", 0, payload(10, 10 + 10 * i, size=2_000)) for i in range(4)])
        assert [f.result(30).base_offset for f in futures] == [0, 10, 20, 30]
        segments = broker.catalog.state.partition("t", 0).segments
        # the first flush took the first two batches; the rest went in one flush, or in two when
        # the first had ended before the second flusher took them (the split's rule again)
        assert [(s.base_offset, s.last_offset) for s in segments] in (
            [(0, 19), (20, 39)], [(0, 19), (20, 29), (30, 39)])
        assert len({s.path for s in segments}) == len(segments)
        assert broker.fetch("t", 0, 0).records.column("offset").to_pylist() == list(range(40))
    finally:
        broker.close()


def test_a_backlog_is_taken_whole_when_a_marker_snapshot_or_busy_flusher_needs_it():
    """The half a flush leaves behind may hold no control batch (the marker already ended its
    transaction in the producer state: the first unstable offset committed with the first half
    would pass the transaction's records), and the backlog is taken whole when a producer-state
    snapshot or committed actions must match everything appended, or no flusher is idle."""
    from concurrent.futures import Future

    from txlake.engine.flush_schedule import FlushSchedule
    from txlake.engine.group_commit import GroupCommitter, PendingBatch

    committer = GroupCommitter.__new__(GroupCommitter)  # the rule alone: no threads, no storage
    committer.config = BrokerConfig(flush_max_bytes=64 * 1024, producer_snapshot_interval=10)
    committer.schedule = FlushSchedule(committer.config)
    committer._extra, committer._preparing = [], 1
    committer._flushes_since_snapshot, committer._bytes_since_snapshot, committer.snapshot_bytes = 0, 0, 0

    def queue(*controls):
        batches = [PendingBatch(ProduceBatch("t", 0, payload(1), is_control=c), i, 0, 0, Future(), nbytes=10_000)
                   for i, c in enumerate(controls)]
        committer.schedule.pending_bytes = 10_000 * len(batches)
        return batches

    assert committer._half_to_leave(queue(False, False, False, False), False) == 2
    assert committer._half_to_leave(queue(False, False, False, True), False) == 0  # a marker left behind
    assert committer._half_to_leave(queue(False, True, False, False), False) == 2  # a marker taken: fine
    assert committer._half_to_leave(queue(False), False) == 0  # one batch: nothing to halve
    assert committer._half_to_leave(queue(False, False, False, False), True) == 0  # a snapshot forced
    committer._flushes_since_snapshot = 9  # the next flush makes a periodic snapshot due
    assert committer._half_to_leave(queue(False, False, False, False), False) == 0
    committer._flushes_since_snapshot = 0
    committer._extra = [([{"action": "x"}], Future())]
    assert committer._half_to_leave(queue(False, False, False, False), False) == 0
    committer._extra, committer._preparing = [], 2  # both flushers busy: nobody takes the rest
    assert committer._half_to_leave(queue(False, False, False, False), False) == 0
