"""The event-sourced catalog: commits by create-if-absent, checkpoints, replay, names, configs."""

import threading

import pytest

from txlake.catalog.catalog import Catalog, checkpoint_key, commit_key
from txlake.catalog.errors import CommitConflictError, InvalidConfigError, InvalidTopicError
from txlake.catalog.state import CREATE_TOPIC
from txlake.catalog.storage import ObjectStore
from txlake.catalog.topic_config import effective_config, validate_topic_config
from txlake.catalog.topic_names import validate_topic_name
from txlake.catalog.writer_lease import WriterLease
from txlake.formats.errors import CorruptObjectError


def _segment(topic, partition, path, base, last):
    return {"action": "add_segment", "topic": topic, "partition": partition, "path": path, "base_offset": base,
            "last_offset": last, "record_count": last - base + 1, "size_bytes": 100, "min_timestamp": 1,
            "max_timestamp": 2, "row_group_start": 0, "row_group_count": 1, "high_watermark": last + 1,
            "last_stable_offset": last + 1}


def _writer(storage, interval=100):
    catalog = Catalog.open(storage.object_store(), checkpoint_interval=interval)
    lease = WriterLease(catalog, lease_ms=60_000)
    return catalog, lease.acquire()


def test_commits_replay_to_the_same_state(storage):
    catalog, epoch = _writer(storage)
    catalog.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "id1", "num_partitions": 2,
                     "config": {"cleanup.policy": "compact"}}], epoch)
    catalog.commit([_segment("t", 0, "data/a", 0, 9), _segment("t", 1, "data/a", 0, 4)], epoch)
    catalog.commit([_segment("t", 0, "data/b", 10, 19)], epoch)
    reader = Catalog.open(storage.object_store())
    assert reader.version == catalog.version == 4
    p0 = reader.state.partition("t", 0)
    assert [(s.path, s.base_offset, s.last_offset) for s in p0.segments] == [("data/a", 0, 9), ("data/b", 10, 19)]
    assert (p0.high_watermark, p0.log_start_offset) == (20, 0)
    assert reader.state.partition("t", 1).high_watermark == 5
    assert reader.state.topics["t"].config == {"cleanup.policy": "compact"}
    assert reader.state.referenced_paths() == {"data/a", "data/b"}


def test_reader_tails_new_commits(storage):
    catalog, epoch = _writer(storage)
    reader = Catalog.open(storage.object_store())
    assert reader.refresh() is False
    catalog.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    assert reader.refresh() is True
    assert "t" in reader.state.topics and reader.version == catalog.version


def test_checkpoint_then_replay_and_corrupt_checkpoint_fallback(storage):
    catalog, epoch = _writer(storage, interval=3)
    catalog.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    for i in range(5):
        catalog.commit([_segment("t", 0, f"data/{i}", i * 10, i * 10 + 9)], epoch)
    store = storage.object_store()
    assert [o.key for o in store.list("_catalog/checkpoints/")] == [checkpoint_key(3), checkpoint_key(6)]
    expected = [(s.path, s.base_offset) for s in catalog.state.partition("t", 0).segments]
    again = Catalog.open(store)
    assert again.version == 7 and [(s.path, s.base_offset) for s in again.state.partition("t", 0).segments] == expected
    store.put(checkpoint_key(6), b"garbage that is not parquet")
    fallback = Catalog.open(storage.object_store())
    assert fallback.version == 7
    assert [(s.path, s.base_offset) for s in fallback.state.partition("t", 0).segments] == expected


def test_corrupt_commit_is_refused_naming_it(storage):
    catalog, epoch = _writer(storage)
    catalog.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    store = storage.object_store()
    store.delete(commit_key(2))
    store.put(commit_key(2), b"PAR1 truncated")
    with pytest.raises(CorruptObjectError, match=r"_catalog/commits/00000000000000000002\.parquet"):
        Catalog.open(store)



def test_catching_up_reads_ahead_in_order_and_stops_at_the_first_missing_commit(storage, monkeypatch):
    """A reader far behind fetches 1, 2, 4, ... commit numbers at once: it applies them in
    order, one GET per missing number only at the end; a corrupt commit inside a window raises
    naming it, with every commit before it applied."""
    catalog, epoch = _writer(storage)
    catalog.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    for i in range(38):
        catalog.commit([_segment("t", 0, f"data/{i}", i * 10, i * 10 + 9)], epoch)
    assert catalog.version == 40
    store = storage.object_store()
    asked: list[int] = []
    real_get = store.get_or_none

    def counted(key):
        if key.startswith("_catalog/commits/"):
            asked.append(int(key.rsplit("/", 1)[-1].split(".")[0]))
        return real_get(key)

    monkeypatch.setattr(store, "get_or_none", counted)
    reader = Catalog(store)
    applied: list[int] = []
    reader.add_listener(lambda version, actions: applied.append(version))
    assert reader.refresh() is True
    assert applied == list(range(1, 41)) and reader.version == 40
    assert [(s.base_offset, s.path) for s in reader.state.partition("t", 0).segments] == \
        [(i * 10, f"data/{i}") for i in range(38)]
    # windows 1, 2, 4, 8, 16, then 16 from 32: 1..47, each number asked once
    assert sorted(asked) == list(range(1, 48))
    asked.clear()
    assert reader.refresh() is False and asked == [41]  # nothing new: one GET

    store.delete(commit_key(37))
    store.put(commit_key(37), b"PAR1 truncated")
    late = Catalog(store)
    with pytest.raises(CorruptObjectError, match=r"_catalog/commits/00000000000000000037\.parquet"):
        late.refresh()
    assert late.version == 36

def test_racing_commits_exactly_one_wins(storage):
    catalog, epoch = _writer(storage)
    racers = [Catalog.open(storage.object_store()) for _ in range(6)]
    barrier = threading.Barrier(len(racers))
    outcomes = []

    def race(cat, i):
        barrier.wait()
        try:
            cat.commit([{"action": CREATE_TOPIC, "topic": f"t{i}", "topic_id": str(i), "num_partitions": 1}], None)
            outcomes.append(("won", i))
        except CommitConflictError:
            outcomes.append(("lost", i))

    threads = [threading.Thread(target=race, args=(c, i)) for i, c in enumerate(racers)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    winners = [i for what, i in outcomes if what == "won"]
    assert len(winners) == 1 and len(outcomes) == 6
    final = Catalog.open(storage.object_store())
    assert set(final.state.topics) == {f"t{winners[0]}"}


@pytest.mark.parametrize("name,message", [
    ("", "the empty string is not allowed"), (".", "'.' is not allowed"), ("..", "'..' is not allowed"),
    ("a" * 250, f"the length of '{'a' * 250}' is longer than the max allowed length 249"),
    ("../etc", "'../etc' contains one or more characters other than ASCII alphanumerics, '.', '_' and '-'"),
    ("a/b", "'a/b' contains one or more characters other than"), ("é", "'é' contains one or more characters"),
    ("a b", "'a b' contains one or more characters"),
])
def test_invalid_topic_names(name, message):
    """Kafka 4.3's ``Topic.validate`` messages, "Topic name is invalid: " and what is wrong
    (tests/test_differential_basic.py compares them with Apache Kafka's)."""
    with pytest.raises(InvalidTopicError) as raised:
        validate_topic_name(name)
    assert str(raised.value).startswith("Topic name is invalid: " + message), str(raised.value)


def test_valid_topic_names():
    for name in ["a", "a" * 249, "orders.v1_x-y", "__consumer_offsets", "..."]:
        assert validate_topic_name(name) == name


def test_topic_config_validation():
    assert validate_topic_config({"retention.ms": 1000, "cleanup.policy": "compact,delete"}) == {
        "retention.ms": "1000", "cleanup.policy": "compact,delete"}
    with pytest.raises(InvalidConfigError, match="Unknown topic config name: retention.mss"):
        validate_topic_config({"retention.mss": "1"})
    with pytest.raises(InvalidConfigError, match="Invalid value abc for configuration retention.ms: Not a number of type LONG"):
        validate_topic_config({"retention.ms": "abc"})
    with pytest.raises(InvalidConfigError, match="cleanup.policy"):
        validate_topic_config({"cleanup.policy": "forever"})
    with pytest.raises(InvalidConfigError, match="min.cleanable.dirty.ratio"):
        validate_topic_config({"min.cleanable.dirty.ratio": "1.5"})
    assert effective_config({"retention.ms": "5"})["retention.ms"] == "5"
    assert effective_config({})["max.message.bytes"] == "1048588"
