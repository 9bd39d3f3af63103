"""Catalog log cleanup (catalog/log_cleanup.py): commits and checkpoints a kept checkpoint
covers are deleted once older than the retention; readers that fell behind restart from a
checkpoint instead of stalling at a deleted number, and a zombie writer is fenced instead of
recreating one."""

import time

import pytest
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
