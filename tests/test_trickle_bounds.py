"""A low-rate producer must not grow memory or storage without limit (issue 14).

Proved here: the decoded-segment cache charges each table the memory it really holds (its
Arrow buffers as allocated, plus a fixed cost per column chunk), so a cache of many one-row
segments stays under its bound as the Arrow allocator measures it, and slices of one decoded
object are charged their shared buffers once; the writer forgets the cached tables of objects
compaction replaced; a catalog checkpoint holds the live state only (no retired object once
deleted, no aborted transaction below the log start offset), whatever the history; the
checkpoint cadence rule (at least ``checkpoint_interval`` commits, holding at least the last
checkpoint's bytes) and the producer-state snapshot cadence rule (at least
``producer_snapshot_interval`` flushes, holding at least the last snapshot's bytes of payload)
hold exactly; a steady stream of produce requests makes at most one flush per
``storage.flush.interval.ms`` after its burst allowance.
"""

from __future__ import annotations

import gc
import time
from collections import Counter

import pyarrow as pa
import pytest

from helpers import broker_past_its_burst, client_conf, close_engines, payload  # noqa: F401
from txlake.catalog.catalog import Catalog, checkpoint_key, checkpoint_versions, version_of
from txlake.catalog.state import CREATE_TOPIC
from txlake.catalog.writer_lease import WriterLease
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.engine.compaction import compact
from txlake.engine.errors import Errors
from txlake.engine.flush_schedule import FLUSH_BURST, INTERVAL_EXEMPT_BYTES
from txlake.engine.log_reader import SegmentCache, table_memory
from txlake.formats.catalog_actions import CHECKPOINT_KIND, decode_actions
from txlake.formats.records import read_row_group_sets, read_segment

FILE_ONLY = pytest.mark.parametrize("backend", ["file"])

#: engine settings of these tests: no background compaction, deletes at once, fast flushes
QUIET = {"storage.lease.ms": 60_000, "storage.compaction.interval.ms": 0, "storage.file.delete.delay.ms": 0,
         "storage.flush.linger.ms": 1, "transaction.state.log.num.partitions": 1}


def _one_record_objects(storage, partitions: int = 1) -> bytes:
    """The bytes of a real flush object holding one record of each of ``partitions`` partitions."""
    broker = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, lease_ms=60_000))
    try:
        broker.create_topics([("t", partitions, {})])
        results = broker.produce([ProduceBatch("t", p, payload(1)) for p in range(partitions)])
        assert [r.error for r in results] == [Errors.NO_ERROR] * partitions
        (path,) = {s.path for p in broker.catalog.state.topics["t"].partitions for s in p.segments}
        return broker.store.get(path)
    finally:
        broker.close()


@FILE_ONLY
def test_a_cache_of_one_row_segments_stays_under_its_bound_as_arrow_allocates_them(storage):
    """2 000 decoded one-row segments into a 1 MiB cache. Each holds ~1.6 KB of Arrow buffers
    (28 buffers of at least 64 bytes) but has a ``Table.nbytes`` of ~130 bytes: counted by
    nbytes the cache kept all 2 000 (3.2 MB, 3x its bound)."""
    data = _one_record_objects(storage)
    bound = 1024 * 1024
    cache = SegmentCache(bound)
    gc.collect()
    before = pa.total_allocated_bytes()
    for i in range(2000):
        cache.put((f"data/{i}", 0), read_segment(data, f"data/{i}"))
    held = pa.total_allocated_bytes() - before  # only the cache holds decoded tables now
    assert held <= bound, f"the cache holds {held} bytes of Arrow buffers, over its {bound}-byte bound"
    assert held <= cache.bytes <= bound
    assert 0 < len(cache) < 2000
    fixed, _, buffer_bytes = table_memory(read_segment(data, "x"))
    assert len(cache) == bound // (fixed + buffer_bytes)
    cache.clear()
    assert (cache.bytes, len(cache)) == (0, 0)


@FILE_ONLY
def test_slices_of_one_decoded_object_are_charged_their_buffers_once(storage):
    """A flush object of 3 partitions read in one pass gives 3 zero-copy slices of one decoded
    table: its buffers are charged once while any slice is kept, and go with the last one."""
    data = _one_record_objects(storage, partitions=3)
    slices = read_row_group_sets(data, "obj", [[0], [1], [2]])
    measured = [table_memory(t) for t in slices]
    assert len({backing for _, backing, _ in measured}) == 1  # one allocation behind the three
    fixed, _, buffer_bytes = measured[0]
    assert all(m[0] == fixed and m[2] == buffer_bytes for m in measured)
    cache = SegmentCache(10 * 1024 * 1024)
    for rg, table in enumerate(slices):
        cache.put(("obj", rg), table)
    assert cache.bytes == 3 * fixed + buffer_bytes
    cache.discard(("obj", 0))
    cache.discard(("obj", 2))
    assert cache.bytes == fixed + buffer_bytes
    cache.discard_object("obj")
    assert (cache.bytes, len(cache)) == (0, 0)


@FILE_ONLY
def test_the_writer_forgets_cached_tables_of_objects_compaction_replaced(storage, close_engines):
    from txlake import AdminClient, NewTopic, Producer

    conf = client_conf(storage, QUIET)
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("t", 2)])["t"].result()
    producer = Producer(conf)
    for flush in range(3):
        for i in range(4):
            producer.produce("t", value=b"v%d" % i, partition=i % 2)
        assert producer.flush(30) == 0
    broker = producer._broker
    flushed = {(s.path, s.row_group_start) for p in broker.catalog.state.topics["t"].partitions for s in p.segments}
    assert len(flushed) == 6 and all(broker.reader.cache.get(k) is not None for k in flushed)
    summary = compact(broker)
    assert summary.merges == 2
    assert [k for k in flushed if broker.reader.cache.get(k) is not None] == []
    producer.close()


@FILE_ONLY
def test_compaction_rounds_leave_a_merged_segment_until_three_times_its_records_join_it(storage):
    """Four compaction rounds, each after 8 flushes of 2 500 incompressible records (2 MB a
    round, over TIER_FLOOR_BYTES once merged): rounds 2 and 3 merge only their new flushes and
    leave the segments of the rounds before as they are (same objects); round 4 brings 3x the
    first segment's records and merges the four rounds into one segment. Before (bytes
    tiering, flush segments counted at their catalog bytes), round 2 rewrote round 1's
    segment with its flushes, and so on every round: a round's work grew with the partition."""
    import os

    from txlake.formats.records import PAYLOAD_SCHEMA

    broker = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, flush_interval_ms=0, lease_ms=60_000,
                                                         compaction_interval_ms=0))
    try:
        broker.create_topics([("t", 1, {})])
        n = 2500
        layouts = []
        for _ in range(4):
            for _ in range(8):
                records = pa.Table.from_pydict({"timestamp": [int(time.time() * 1000)] * n, "key": [None] * n,
                                                "value": [os.urandom(100) for _ in range(n)], "headers": [None] * n},
                                               schema=PAYLOAD_SCHEMA)
                assert [r.error for r in broker.produce([ProduceBatch("t", 0, records)])] == [Errors.NO_ERROR]
            assert compact(broker).skipped == 0
            layouts.append([(s.path, s.base_offset, s.record_count)
                            for s in broker.catalog.state.topics["t"].partitions[0].segments])
        r = 8 * n
        assert [[(base, count) for _, base, count in layout] for layout in layouts] == [
            [(0, r)], [(0, r), (r, r)], [(0, r), (r, r), (2 * r, r)], [(0, 4 * r)]]
        assert layouts[1][0] == layouts[0][0] and layouts[2][:2] == layouts[1]  # not rewritten
        assert broker.catalog.state.topics["t"].partitions[0].segments[0].size_bytes >= 4 * 1024 * 1024
    finally:
        broker.close()


@FILE_ONLY
def test_a_checkpoint_holds_the_live_state_whatever_the_history(storage, close_engines):
    """Four cycles of: an aborted transaction, three flushes, DeleteRecords up to the cycle's
    first offset, a compaction round (``storage.file.delete.delay.ms`` 0). Each cycle's
    checkpoint names one segment, exactly one retired object -- the previous cycle's merged
    segment, which DeleteRecords dropped: the round stamps it and the next one deletes it (the
    objects the round's own merge replaced are deleted at once) -- and exactly one aborted
    transaction, the cycle's own: the older ones are below the log start offset, where no
    reader can see their records."""
    from txlake import AdminClient, NewTopic, Producer

    conf = client_conf(storage, QUIET)
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("t", 1)])["t"].result()
    txn = Producer({**conf, "transactional.id": "aborter"})
    txn.init_transactions(30)
    plain = Producer(conf)
    broker = plain._broker
    store = broker.store
    shapes = []
    for cycle in range(4):
        start = broker.catalog.state.partition("t", 0).high_watermark
        txn.begin_transaction()
        txn.produce("t", value=b"aborted-1", partition=0)
        txn.produce("t", value=b"aborted-2", partition=0)
        txn.abort_transaction(30)
        for i in range(3):
            plain.produce("t", value=b"kept-%d" % i, partition=0)
            assert plain.flush(30) == 0
        assert broker.delete_records([("t", 0, start)])[0][:2] == (Errors.NO_ERROR, start)
        summary = compact(broker)
        key = broker.catalog.write_checkpoint()
        actions = decode_actions(store.get(key), CHECKPOINT_KIND, store.uri(key))
        kinds = Counter(a["action"] for a in actions)
        retired = [a["path"] for a in actions if a["action"] == "retire_object"]
        assert retired == ([] if cycle == 0 else [previous]) and summary.pending_deletion == len(retired)
        if cycle > 1:  # the one the round before stamped is gone from storage and from the catalog
            assert not store.exists(before_previous) and before_previous not in broker.catalog.state.retired
        aborted = [(a["base_offset"], a["last_offset"]) for a in actions if a["action"] == "aborted_txn"]
        assert aborted == [(start, start + 2)]  # records at start, start + 1; the ABORT marker at start + 2
        p = broker.catalog.state.partition("t", 0)
        assert p.log_start_offset == start and p.high_watermark == start + 6
        named = [a["path"] for a in actions if a["action"] == "add_segment" and a["topic"] == "t"]
        assert named == [s.path for s in p.segments] and len(named) == 1  # merged into one
        before_previous, previous = (previous if cycle else None), named[0]
        shapes.append(sorted(kinds.items()))
    assert shapes[2:] == shapes[1:2] * 2  # the same actions every cycle: nothing accumulates
    txn.close()
    plain.close()


def _segment(i: int) -> dict:
    return {"action": "add_segment", "topic": "t", "partition": 0, "path": f"data/{i:06d}", "base_offset": i,
            "last_offset": i, "record_count": 1, "size_bytes": 100, "min_timestamp": 1, "max_timestamp": 2,
            "row_group_start": 0, "row_group_count": 1, "high_watermark": i + 1, "last_stable_offset": i + 1}


@FILE_ONLY
def test_checkpoint_cadence_needs_the_interval_and_the_checkpoints_bytes_of_commits(storage):
    """Interval 3. Commit 3 adds 5 000 segments: a big state, so the checkpoint at 3 is far
    bigger than a one-segment commit. The next checkpoint comes at the first version at least 3
    commits on whose commits since hold at least the checkpoint's bytes -- not at 6, where a
    fixed count put it and rewrote the whole state every 3 small commits."""
    store = storage.object_store()
    catalog = Catalog.open(store, checkpoint_interval=3)
    epoch = WriterLease(catalog, 60_000).acquire()  # commit 1
    catalog.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)  # 2
    catalog.commit([_segment(i) for i in range(5000)], epoch)  # 3
    assert checkpoint_versions(store) == [3]  # the first one: no checkpoint's bytes to match yet
    n = 5000
    while len(checkpoint_versions(store)) < 3:
        catalog.commit([_segment(n)], epoch)
        n += 1
    sizes = {version_of(o.key): o.size for o in store.list("_catalog/commits/")}
    ckpt_sizes = {version_of(o.key): o.size for o in store.list("_catalog/checkpoints/")}

    def next_checkpoint(after: int | None) -> int | None:
        v, logged = after, 0
        while after in ckpt_sizes and v + 1 in sizes:
            v += 1
            logged += sizes[v]
            if v - after >= 3 and logged >= ckpt_sizes[after]:
                return v
        return None

    second = next_checkpoint(3)
    third = next_checkpoint(second)
    assert checkpoint_versions(store) == [3, second, third] and second > 6 and catalog.version == third
    # a view reopened from the newest checkpoint goes on by the same rule
    again = Catalog.open(store, checkpoint_interval=3)
    assert (again.checkpoint_version, again.checkpoint_bytes, again.log_bytes_since_checkpoint) == \
        (third, ckpt_sizes[third], 0)
    assert [s.path for s in again.state.partition("t", 0).segments] == \
        [s.path for s in catalog.state.partition("t", 0).segments]


@FILE_ONLY
def test_producer_snapshot_cadence_needs_the_interval_and_the_snapshots_bytes_of_payload(storage):
    """Snapshot interval 2; 300 idempotent producers make a snapshot of some KB. Then 20 flushes
    of one 10-byte record: none holds the snapshot's bytes, so no snapshot after the first
    (a fixed count wrote one every 2 flushes). Then one flush of more payload than the snapshot
    holds: the next snapshot."""
    broker = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, flush_interval_ms=0, lease_ms=60_000,
                                                         producer_snapshot_interval=2))
    try:
        broker.create_topics([("t", 1, {})])
        snapshots = []
        broker.catalog.add_listener(lambda v, actions: snapshots.extend(
            v for a in actions if a["action"] == "producer_snapshot"))
        pids = [broker.init_producer_id()[1] for _ in range(300)]
        assert {r.error for r in broker.produce([ProduceBatch("t", 0, payload(1), pid, 0, 0) for pid in pids])} \
            == {Errors.NO_ERROR}
        first = broker.catalog.version
        assert broker.produce([ProduceBatch("t", 0, payload(1))])[0].error == Errors.NO_ERROR
        assert snapshots == [first + 1]  # flush 2 of the interval: the first snapshot
        (snapshot_bytes,) = [o.size for o in broker.store.list("producer-state/")]
        assert snapshot_bytes > 20 * payload(1).nbytes
        for _ in range(20):
            assert broker.produce([ProduceBatch("t", 0, payload(1))])[0].error == Errors.NO_ERROR
        assert snapshots == [first + 1]
        big = payload(1, size=snapshot_bytes)  # its payload alone holds the snapshot's bytes
        assert broker.produce([ProduceBatch("t", 0, big)])[0].error == Errors.NO_ERROR
        assert snapshots == [first + 1, broker.catalog.version]
    finally:
        broker.close()


@FILE_ONLY
def test_a_steady_stream_makes_at_most_one_flush_per_interval_after_its_burst(storage):
    """One batch every 10 ms for 2 s with a 1 ms linger and a 200 ms flush interval: at most
    FLUSH_BURST + elapsed / 200 ms + 1 flushes (each one catalog commit). Without the interval
    every batch was a flush of its own (~200 commits)."""
    broker = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, flush_interval_ms=200, lease_ms=60_000))
    try:
        broker.create_topics([("t", 1, {})])
        broker.produce([ProduceBatch("t", 0, payload(1))])
        before = broker.catalog.version
        futures = []
        started = time.monotonic()
        while time.monotonic() - started < 2.0:
            futures += broker.produce_async([ProduceBatch("t", 0, payload(1))])
            time.sleep(0.01)
        results = [f.result(timeout=30) for f in futures]
        elapsed = time.monotonic() - started
        assert {r.error for r in results} == {Errors.NO_ERROR}
        assert [r.base_offset for r in results] == list(range(1, len(results) + 1))
        flushes = broker.catalog.version - before
        assert flushes <= FLUSH_BURST + elapsed / 0.2 + 1, f"{flushes} flushes of {len(results)} batches in {elapsed:.2f} s"
        assert len(results) > 3 * flushes  # so the bound above is not met by a slow machine alone
    finally:
        broker.close()


@FILE_ONLY
def test_past_the_burst_a_small_flush_waits_for_the_interval_and_a_mebibyte_does_not(storage):
    """A 60 s flush interval: ten one-record produce calls in a row each commit after the linger
    (the burst); the eleventh waits for the interval (its 300 ms produce times out); a batch
    of 1 MiB queued behind it ends the wait: the queue commits after the linger, both batches."""
    with broker_past_its_burst(storage) as (broker, version, small):
        half = INTERVAL_EXEMPT_BYTES // 2  # two batches: one of 1 MiB is over max.message.bytes
        big = [ProduceBatch("t", 0, payload(1, FLUSH_BURST + 1 + i, size=half)) for i in range(2)]
        assert [r.base_offset for r in broker.produce(big, timeout_ms=20_000)] == [FLUSH_BURST + 1, FLUSH_BURST + 2]
        assert small.result(timeout=0).base_offset == FLUSH_BURST
        assert broker.catalog.version == version + 1  # one flush holding all three


def test_flush_interval_setting():
    from txlake.config import parse_config
    from txlake.error import KafkaException

    assert parse_config({}, "producer").broker_config().flush_interval_ms == BrokerConfig().flush_interval_ms == 500
    assert parse_config({"storage.flush.interval.ms": 0}, "producer").broker_config().flush_interval_ms == 0
    with pytest.raises(KafkaException, match="storage.flush.interval.ms"):
        parse_config({"storage.flush.interval.ms": -1}, "producer")


@FILE_ONLY
def test_big_flushes_take_no_interval_token_so_a_fast_streams_small_tail_does_not_wait(storage):
    """A 2 s flush interval: thirty flushes of 1 MiB each (exempt from the interval) in a row,
    then a one-record batch: it commits after its linger -- the bucket still holds its burst.
    Before, every big flush pushed the bucket 2 s further ahead and the small tail waited
    about a minute (in txlake serve: a producer's stream stalled 10 s at its end)."""
    broker = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, flush_interval_ms=2_000, lease_ms=60_000))
    try:
        broker.create_topics([("t", 1, {})])
        half = INTERVAL_EXEMPT_BYTES // 2
        offset = 0
        for _ in range(30):
            big = [ProduceBatch("t", 0, payload(1, offset + i, size=half + 1024)) for i in range(2)]
            assert [r.error for r in broker.produce(big, timeout_ms=20_000)] == [Errors.NO_ERROR] * 2
            offset += 2
        (small,) = broker.produce_async([ProduceBatch("t", 0, payload(1, offset))])
        assert small.result(timeout=1.5).base_offset == offset   # not 2 s x 30 later
    finally:
        broker.close()
