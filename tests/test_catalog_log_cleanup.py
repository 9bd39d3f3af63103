"""Catalog log cleanup (catalog/log_cleanup.py): commits and checkpoints a kept checkpoint
covers are deleted once older than the retention; readers that fell behind restart from a
checkpoint instead of stalling at a deleted number, and a zombie writer is fenced instead of
recreating one."""

import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_catalog import _segment, _writer

from txlake import Producer
from txlake.catalog.catalog import MIN_LOG_RETENTION_MS, Catalog, checkpoint_key, commit_key
from txlake.catalog.errors import WriterFencedError
from txlake.catalog.log_cleanup import clean_catalog_log
from txlake.catalog.state import CREATE_TOPIC
from txlake.catalog.writer_lease import WriterLease, heartbeat_key
from txlake.config import parse_config
from txlake.error import KafkaException
from txlake.formats.errors import CorruptObjectError

RETENTION = MIN_LOG_RETENTION_MS


def _later() -> int:
    """A time (ms since the epoch) at which every object written so far is past the retention."""
    return int(time.time() * 1000) + RETENTION + 60_000


def _log(store) -> tuple[list[int], list[int]]:
    """``(commit versions, checkpoint versions)`` present under ``store``."""
    def versions(prefix):
        return [int(o.key.rsplit("/", 1)[-1].split(".")[0]) for o in store.list(prefix)]
    return versions("_catalog/commits/"), versions("_catalog/checkpoints/")


def _segments(catalog) -> list[tuple[str, int, int]]:
    return [(s.path, s.base_offset, s.last_offset) for s in catalog.state.partition("t", 0).segments]


def _ten_commits(storage):
    """A writer with checkpoints every 3 commits at version 10: the lease (1), topic ``t``
    (2) and 8 segments (3..10); checkpoints 3, 6, 9."""
    catalog, epoch = _writer(storage, interval=3)
    catalog.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    for i in range(8):
        catalog.commit([_segment("t", 0, f"data/{i}", i * 10, i * 10 + 9)], epoch)
    assert catalog.version == 10
    return catalog, epoch


def test_cleanup_keeps_the_floor_checkpoint_below_the_newest_expired_and_everything_after_it(storage):
    catalog, epoch = _ten_commits(storage)
    store = catalog.store
    assert _log(store) == (list(range(1, 11)), [3, 6, 9])
    # nothing is old enough yet
    young = clean_catalog_log(catalog, RETENTION, int(time.time() * 1000))
    assert (young.floor, young.commits, young.checkpoints) == (None, [], [])
    # all three checkpoints expired: 9 is the newest, so 6 is the floor
    planned = clean_catalog_log(catalog, RETENTION, _later(), dry_run=True)
    assert (planned.floor, planned.commits, planned.checkpoints) == (6, [1, 2, 3, 4, 5, 6], [3])
    assert _log(store) == (list(range(1, 11)), [3, 6, 9])  # a dry run deletes nothing
    done = clean_catalog_log(catalog, RETENTION, _later())
    assert (done.floor, done.commits, done.checkpoints) == (6, [1, 2, 3, 4, 5, 6], [3])
    assert _log(store) == ([7, 8, 9, 10], [6, 9])
    # a new reader starts from checkpoint 9 and sees exactly the writer's state
    reader = Catalog.open(storage.object_store())
    assert reader.version == 10 and _segments(reader) == _segments(catalog) == [
        (f"data/{i}", i * 10, i * 10 + 9) for i in range(8)]
    # the writer goes on committing; a second round has nothing more to delete
    catalog.commit([_segment("t", 0, "data/8", 80, 89)], epoch)
    again = clean_catalog_log(catalog, RETENTION, _later())
    assert (again.floor, again.commits, again.checkpoints) == (6, [], [])


def test_a_corrupt_newest_checkpoint_falls_back_to_the_kept_floor(storage):
    catalog, _ = _ten_commits(storage)
    clean_catalog_log(catalog, RETENTION, _later())
    store = storage.object_store()
    store.put(checkpoint_key(9), b"garbage that is not parquet")
    fallback = Catalog.open(store)  # checkpoint 6 + commits 7..10
    assert fallback.version == 10 and _segments(fallback) == _segments(catalog)
    # the floor unreadable as well: the commits both summarise are gone -> a clear error, not a silent empty catalog
    store.put(checkpoint_key(6), b"garbage that is not parquet")
    with pytest.raises(CorruptObjectError, match=r"_catalog/checkpoints/00000000000000000009\.parquet: catalog checkpoint "
                                                 r"is unreadable and the commits it summarises from version 1 on were "
                                                 r"already cleaned up"):
        Catalog.open(store)


def test_a_cancelled_cleanup_stops_between_batches_and_reports_only_what_it_deleted(storage, monkeypatch):
    import threading

    import txlake.catalog.log_cleanup as log_cleanup

    catalog, _ = _ten_commits(storage)
    store = catalog.store
    monkeypatch.setattr(log_cleanup, "DELETE_BATCH", 2)
    cancel = threading.Event()
    real_delete_many = store.delete_many
    batches = []

    def delete_many(keys):
        batches.append(len(keys))
        real_delete_many(keys)
        cancel.set()  # the writer starts closing during the first batch

    monkeypatch.setattr(store, "delete_many", delete_many)
    done = clean_catalog_log(catalog, RETENTION, _later(), cancel=cancel)
    assert batches == [2] and (done.floor, done.commits, done.checkpoints) == (6, [1, 2], [])
    assert _log(store) == (list(range(3, 11)), [3, 6, 9])
    assert Catalog.open(storage.object_store()).version == 10
    cancel.clear()
    rest = clean_catalog_log(catalog, RETENTION, _later())  # the next round finishes the work
    assert (rest.commits, rest.checkpoints) == ([3, 4, 5, 6], [3]) and _log(store) == ([7, 8, 9, 10], [6, 9])


def test_an_unreadable_checkpoint_is_never_the_floor(storage):
    catalog, _ = _ten_commits(storage)
    store = catalog.store
    store.put(checkpoint_key(6), b"garbage that is not parquet")
    done = clean_catalog_log(catalog, RETENTION, _later())
    assert (done.floor, done.commits, done.checkpoints) == (3, [1, 2, 3], [])
    assert _log(store) == (list(range(4, 11)), [3, 6, 9])
    store.put(checkpoint_key(9), b"garbage that is not parquet")
    # 9 and 6 unreadable: 3 + commits 4..10 still load
    assert Catalog.open(storage.object_store()).version == 10


def test_a_lagging_reader_restarts_from_a_checkpoint_instead_of_stalling_at_a_deleted_commit(storage):
    catalog, epoch = _writer(storage, interval=3)
    catalog.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    reader = Catalog.open(storage.object_store())
    assert reader.version == 2
    for i in range(8):
        catalog.commit([_segment("t", 0, f"data/{i}", i * 10, i * 10 + 9)], epoch)
    clean_catalog_log(catalog, RETENTION, _later())
    assert commit_key(3) not in {o.key for o in catalog.store.list("_catalog/commits/")}
    # by the time commit 3 could be cleaned up, the reader has not confirmed its view for longer than
    # TAIL_STALE_MS (the retention is at least twice that): simulated by making any age stale
    reader.tail_stale_ms = 0
    assert reader.refresh() is True
    assert reader.version == 10 and _segments(reader) == _segments(catalog)
    catalog.commit([_segment("t", 0, "data/8", 80, 89)], epoch)
    assert reader.refresh() is True and reader.version == 11  # and tails on by number from there


def test_a_reader_that_confirmed_recently_tails_by_number_without_listing(storage, monkeypatch):
    catalog, epoch = _ten_commits(storage)
    reader = Catalog.open(storage.object_store())
    listed = []
    real_list = reader.store.list
    monkeypatch.setattr(reader.store, "list", lambda prefix="", **kw: listed.append(prefix) or real_list(prefix, **kw))
    catalog.commit([_segment("t", 0, "data/8", 80, 89)], epoch)
    assert reader.refresh() is True and reader.version == 11
    assert listed == []
    reader.tail_stale_ms = 0
    assert reader.refresh() is False and listed == ["_catalog/checkpoints/"]  # stale: one LIST, no newer checkpoint


def test_a_zombie_writer_is_fenced_instead_of_recreating_a_deleted_commit(storage):
    zombie, zombie_epoch = _ten_commits(storage)
    # another process takes the lease over (the zombie's heartbeats stopped) and commits on
    successor = Catalog.open(storage.object_store(), checkpoint_interval=3)
    successor_epoch = WriterLease(successor, lease_ms=60_000).acquire(force=True)
    for i in range(8, 14):
        successor.commit([_segment("t", 0, f"data/{i}", i * 10, i * 10 + 9)], successor_epoch)
    assert successor.version == 17
    done = clean_catalog_log(successor, RETENTION, _later())
    assert (done.floor, done.commits[-1]) == (12, 12)  # the zombie's next number, 11, is gone
    zombie.tail_stale_ms = 0  # it was frozen for longer than the retention
    with pytest.raises(WriterFencedError, match=r"lost the writer lease \(epoch 1\).*lease epoch 2"):
        zombie.commit([_segment("t", 0, "data/zombie", 999, 999)], zombie_epoch)
    assert commit_key(11) not in {o.key for o in storage.object_store().list("_catalog/commits/")}
    assert Catalog.open(storage.object_store()).version == 17


def test_a_stale_writer_notices_a_foreign_commit_through_a_newer_checkpoint(storage):
    writer, _ = _ten_commits(storage)
    other = Catalog.open(storage.object_store(), checkpoint_interval=3)
    other_epoch = WriterLease(other, lease_ms=60_000).acquire(force=True)
    other.commit([_segment("t", 0, "data/8", 80, 89)], other_epoch)   # 12: checkpoint
    assert writer.has_foreign_commit() is True  # commit 11 exists
    writer.store.delete(commit_key(11))  # as if cleaned up (only possible after the retention)
    # a view that confirmed recently trusts the probe: by number alone the gap reads as "nothing new"
    assert writer.has_foreign_commit() is False
    writer.tail_stale_ms = 0
    assert writer.has_foreign_commit() is True  # a stale view lists: checkpoint 12 is past its version 10


def test_old_lease_heartbeats_are_deleted_with_the_log(storage):
    catalog, _ = _ten_commits(storage)
    successor = Catalog.open(storage.object_store(), checkpoint_interval=3)
    WriterLease(successor, lease_ms=60_000).acquire(force=True)
    store = successor.store
    assert [o.key for o in store.list("_catalog/leases/")] == [heartbeat_key(1), heartbeat_key(2)]
    done = clean_catalog_log(successor, RETENTION, _later())
    assert done.heartbeats == [heartbeat_key(1)]
    assert [o.key for o in store.list("_catalog/leases/")] == [heartbeat_key(2)]


def test_retention_below_the_minimum_is_refused(storage):
    catalog, _ = _ten_commits(storage)
    with pytest.raises(ValueError, match=f"at least {MIN_LOG_RETENTION_MS} ms"):
        clean_catalog_log(catalog, MIN_LOG_RETENTION_MS - 1, _later())
    assert parse_config({"storage.url": storage.url, "storage.catalog.retention.ms": MIN_LOG_RETENTION_MS},
                        "producer").broker_config().catalog_retention_ms == MIN_LOG_RETENTION_MS
    with pytest.raises(KafkaException, match="storage.catalog.retention.ms"):
        Producer({"storage.url": storage.url, "storage.catalog.retention.ms": 60_000})


# ---------------------------------------------------------------------------- simulation (hypothesis)
MINUTE = 60_000


def _simulated_root(monkeypatch):
    """A fresh memory:// root whose clock is simulated: ``clock[0]`` is now (ms). Objects are
    stamped with the simulated time they were created at, and every view measures elapsed
    time on the same clock."""
    import uuid

    import txlake.catalog.catalog as catalog_module
    from txlake.catalog.storage import ObjectInfo, ObjectStore

    clock = [1_000_000_000_000]
    monkeypatch.setattr(catalog_module, "elapsed_clock", lambda: clock[0] / 1000)
    url = f"memory://txlake-sim-{uuid.uuid4().hex}"
    created: dict[str, int] = {}
    real_put_if_absent, real_list = ObjectStore.put_if_absent, ObjectStore.list

    def put_if_absent(self, key, data):
        won = real_put_if_absent(self, key, data)
        if won:
            created[key] = clock[0]
        return won

    def listing(self, prefix="", include_temporary=False):
        return [ObjectInfo(o.key, o.size, created.get(o.key, clock[0])) for o in real_list(self, prefix, include_temporary)]

    monkeypatch.setattr(ObjectStore, "put_if_absent", put_if_absent)
    monkeypatch.setattr(ObjectStore, "list", listing)
    return url, clock


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.tuples(st.just("commit"), st.integers(1, 8)),
                          # around the stale time (15 min), the retention (30 min) and beyond
                          st.tuples(st.just("wait"), st.sampled_from([MINUTE, 14 * MINUTE, 16 * MINUTE, 29 * MINUTE,
                                                                     31 * MINUTE, 45 * MINUTE, 61 * MINUTE])),
                          st.tuples(st.just("clean"), st.just(0)),
                          st.tuples(st.just("refresh"), st.integers(0, 2)),
                          st.tuples(st.just("open"), st.integers(0, 2))), max_size=60))
# a reader confirms, the next commits age past the retention under two newer checkpoints and
# are cleaned: its refresh 35 minutes after confirming must not trust the gap
@example([("refresh", 0), ("commit", 4), ("commit", 4), ("wait", 35 * MINUTE), ("clean", 0), ("refresh", 0)])
def test_simulated_readers_always_reach_the_writers_state_whatever_the_cleanup_deleted(monkeypatch, ops):
    """A writer commits, time passes, the cleanup runs with the minimum retention, and three
    readers refresh or reopen at arbitrary moments: every refresh brings a reader exactly to
    the writer's version and segments (none stalls at a deleted commit), and a reader never
    applies a commit twice or out of order."""
    from txlake.catalog.storage import ObjectStore

    url, clock = _simulated_root(monkeypatch)
    writer = Catalog.open(ObjectStore(url), checkpoint_interval=3)
    epoch = WriterLease(writer, lease_ms=60_000).acquire()
    writer.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    readers = [Catalog.open(ObjectStore(url)) for _ in range(3)]
    applied: list[list[int]] = [[], [], []]
    for i, r in enumerate(readers):
        r.add_listener(lambda version, actions, i=i: applied[i].append(version))
    offset = 0
    try:
        for op, n in ops:
            if op == "commit":
                for _ in range(n):
                    writer.commit([_segment("t", 0, f"data/{offset}", offset, offset + 9)], epoch)
                    offset += 10
                    clock[0] += 1_000
            elif op == "wait":
                clock[0] += n
            elif op == "clean":
                clean_catalog_log(writer, RETENTION, clock[0])
            else:
                if op == "open":
                    readers[n] = Catalog.open(ObjectStore(url))
                    applied[n] = []
                    readers[n].add_listener(lambda version, actions, i=n: applied[i].append(version))
                else:
                    readers[n].refresh()
                assert readers[n].version == writer.version
                assert _segments(readers[n]) == _segments(writer)
                assert applied[n] == sorted(set(applied[n]))  # each commit applied once, in order
    finally:
        import fsspec

        fs = fsspec.filesystem("memory")
        root = "/" + url.removeprefix("memory://")
        for path in [p for p in list(fs.store) if p.startswith(root + "/")]:
            fs.store.pop(path, None)
