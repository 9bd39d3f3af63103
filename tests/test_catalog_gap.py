"""A lost catalog commit (issue 14, defect 1): readers stop at the gap with an error naming the
missing object, writers never commit into it, `txlake catalog check` reports it and `txlake
catalog repair` closes it -- restoring what the log proves was there, saying exactly what is
lost. Commits the log cleanup deleted below a checkpoint are no gap."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from click.testing import CliRunner
from test_catalog import _segment, _writer
from test_catalog_log_cleanup import RETENTION, _later, _ten_commits

import txlake.catalog.catalog as catalog_module
from txlake import OFFSET_BEGINNING, AdminClient, Consumer, KafkaException, NewTopic, Producer, TopicPartition
from txlake.catalog.catalog import Catalog, checkpoint_key, commit_key
from txlake.catalog.errors import CatalogGapError
from txlake.catalog.log_cleanup import clean_catalog_log
from txlake.catalog.state import ADD_SEGMENT, CREATE_TOPIC, LOST_COMMIT
from txlake.catalog.writer_lease import WriterLease
from txlake.cli import main
from txlake.engine import registry
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.engine.errors import Errors
from txlake.formats.catalog_actions import COMMIT_KIND, decode_actions
from txlake.formats.records import PAYLOAD_SCHEMA
from test_cli import _close_engines  # noqa: E402,F401 - autouse: unsets TXLAKE_STORAGE*, closes the engines

RECORDS = 30




def _conf(storage, **extra):
    return {"storage.url": storage.url, "storage.options": dict(storage.options), **extra}


def _produce(storage, values, topic="t"):
    """Produce ``values`` to ``topic`` [0], one flush (one catalog commit) each, then close the engine
    (which releases the writer lease)."""
    p = Producer(_conf(storage))
    for v in values:
        p.produce(topic, value=v.encode(), partition=0)
        assert p.flush(30) == 0
    registry.close_all()


def _root_with_records(storage, n=RECORDS):
    """Topic ``t`` (1 partition) holding records "0".."n-1" at offsets 0..n-1, one commit each."""
    AdminClient(_conf(storage)).create_topics([NewTopic("t", 1)])["t"].result()
    _produce(storage, [str(i) for i in range(n)])


def _commits(store) -> dict[str, bytes]:
    """Every commit object: key -> bytes."""
    return {o.key: store.get(o.key) for o in store.list("_catalog/commits/")}


def _commit_writing(store, offset: int) -> tuple[int, str]:
    """``(commit number, data object)`` of the commit that appended ``offset`` of t [0]."""
    for key in _commits(store):
        version = int(key.rsplit("/", 1)[1].split(".")[0])
        for a in decode_actions(store.get(key), COMMIT_KIND, key):
            if a["action"] == ADD_SEGMENT and a["topic"] == "t" and a["base_offset"] == offset:
                return version, a["path"]
    raise AssertionError(f"no commit appended offset {offset}")


def _head(store) -> int:
    return max(int(o.key.rsplit("/", 1)[1].split(".")[0]) for o in store.list("_catalog/commits/"))


def _read_all(storage) -> list[tuple[int, bytes]]:
    """``(offset, value)`` of every committed record of t [0] (read_committed, from the beginning)."""
    c = Consumer({**_conf(storage), "group.id": "check", "enable.partition.eof": True})
    c.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
    out = []
    try:
        while True:
            m = c.poll(5)
            assert m is not None, "no end of partition within 5 s"
            if m.error() is not None:
                assert m.error().code() == m.error()._PARTITION_EOF, m.error()
                return out
            out.append((m.offset(), m.value()))
    finally:
        c.close()


def _cli(storage, *args):
    opts = []
    for k, v in storage.options.items():
        opts += ["-O", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    return CliRunner().invoke(main, ["catalog", *args, "--storage", storage.url, *opts], catch_exceptions=False,
                              env={"COLUMNS": "200"})


# ------------------------------------------------------------------------------------- readers
def test_a_reader_refuses_to_load_past_a_missing_commit_naming_it(storage):
    _root_with_records(storage)
    store = storage.object_store()
    n, _ = _commit_writing(store, 17)
    store.delete(commit_key(n))
    # before: the reader loaded up to n - 1 without a word (17 of 30 records, high watermark 17)
    with pytest.raises(CatalogGapError) as caught:
        Catalog.open(storage.object_store())
    err = caught.value
    assert (err.key, err.version, err.evidence, err.location) == (commit_key(n), n, commit_key(n + 1),
                                                                  store.uri(commit_key(n)))
    assert str(err).startswith(f"{store.uri(commit_key(n))}: catalog commit {n} is missing, but "
                               f"{store.uri(commit_key(n + 1))} exists past it: the catalog log has a gap")
    # every client's engine opens the catalog the same way
    with pytest.raises(KafkaException, match=f"catalog commit {n} is missing") as caught:
        Consumer({**_conf(storage), "group.id": "g"})
    assert isinstance(caught.value.__cause__, CatalogGapError)  # a client raises KafkaException, cause chained


def test_a_tailing_reader_finds_a_gap_when_it_reads_past_it_or_its_look_is_due_and_never_lists_between(
        storage, monkeypatch):
    _root_with_records(storage, 3)
    store = storage.object_store()
    looks = []
    real_first_key_after = store.first_key_after
    monkeypatch.setattr(store, "first_key_after", lambda prefix, after: looks.append(prefix)
                        or real_first_key_after(prefix, after))
    reader = Catalog.open(store)
    assert looks == ["_catalog/commits/"]  # opening costs one look past the end (the checkpoints were listed)
    seen = reader.version
    _produce(storage, ["3", "4", "5"])
    assert reader.refresh() is True and looks == ["_catalog/commits/"]  # caught up by number
    head = reader.version
    _produce(storage, ["6", "7", "8"])
    backup = store.get(commit_key(head + 1))
    store.delete(commit_key(head + 1))  # the next writer's lease commit
    listed = []
    real_list = store.list
    monkeypatch.setattr(store, "list", lambda prefix="", **kw: listed.append(prefix) or real_list(prefix, **kw))
    # the next number is missing and nothing read ahead says more: no look until the interval passes
    assert reader.refresh() is False and reader.version == head and listed == [] and len(looks) == 1
    reader.gap_check_ms = 0
    with pytest.raises(CatalogGapError, match=f"catalog commit {head + 1} is missing"):
        reader.refresh()
    assert reader.version == head and looks[1:] == ["_catalog/commits/", "_catalog/checkpoints/"]
    with pytest.raises(CatalogGapError, match=f"catalog commit {head + 1} is missing"):
        reader.refresh()  # the same gap again, found by the probe alone
    assert len(looks) == 3
    store.put(commit_key(head + 1), backup)  # restored from a backup
    assert reader.refresh() is True and reader.version == Catalog.open(storage.object_store()).version > head > seen


def test_a_reader_catching_up_finds_a_gap_in_what_it_reads_ahead_whatever_the_interval(storage):
    writer, epoch = _writer(storage)  # no checkpoint
    writer.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    for i in range(8):
        writer.commit([_segment("t", 0, f"data/{i}", i * 10, i * 10 + 9)], epoch)
    store = storage.object_store()
    store.delete(commit_key(5))  # numbers 4..7 are read side by side: 6 and 7 exist
    lagging = Catalog(store)
    # as if it had looked and confirmed a moment ago
    lagging._gap_checked_at = lagging._confirmed_at = catalog_module.elapsed_clock()
    with pytest.raises(CatalogGapError, match="catalog commit 5 is missing"):
        lagging.refresh()
    assert lagging.version == 4


# ------------------------------------------------------------------------------------- writers
def test_a_broker_that_opened_before_the_gap_refuses_to_write_into_it(storage):
    _root_with_records(storage, 3)
    early = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, lease_ms=60_000))
    try:
        _produce(storage, ["3", "4", "5"])  # another process took the lease, wrote, released it
        store = storage.object_store()
        gap = early.catalog.version + 1  # the other writer's lease commit: the number `early` would take
        store.delete(commit_key(gap))
        before = _commits(store)
        payload = pa.table({"timestamp": [1], "key": [None], "value": [b"x"], "headers": [None]}, schema=PAYLOAD_SCHEMA)
        (result,) = early.produce([ProduceBatch("t", 0, payload)])
        assert result.error == Errors.KAFKA_STORAGE_ERROR
        assert result.message.startswith(f"{store.uri(commit_key(gap))}: catalog commit {gap} is missing")
        assert _commits(store) == before  # nothing written: no commit at the gap, the later ones untouched
    finally:
        early.close()


def test_a_producer_refuses_to_open_a_root_with_a_gap_and_writes_nothing(storage):
    _root_with_records(storage)
    store = storage.object_store()
    n, _ = _commit_writing(store, 17)
    store.delete(commit_key(n))
    before = _commits(store)
    # before: it took the lease at commit n, failed with "commit n+1 was written by another process",
    # and left 29 of 30 records readable
    with pytest.raises(KafkaException, match=f"catalog commit {n} is missing") as caught:
        Producer(_conf(storage, **{"storage.lease.force": True}))
    assert isinstance(caught.value.__cause__, CatalogGapError)
    assert _commits(store) == before


def test_a_writer_idle_longer_than_its_lease_looks_past_its_next_number(storage, monkeypatch):
    """A writer paused past its lease whose successor's first commit was then lost: it must not
    commit at that number (it used to, and only the number after fenced it)."""
    zombie, zombie_epoch = _writer(storage)
    zombie.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], zombie_epoch)
    successor = Catalog.open(storage.object_store())
    epoch = WriterLease(successor, lease_ms=60_000).acquire(force=True)
    successor.commit([_segment("t", 0, "data/a", 0, 9)], epoch)
    store = storage.object_store()
    store.delete(commit_key(3))  # the successor's lease commit
    before = _commits(store)
    now = catalog_module.elapsed_clock()
    monkeypatch.setattr(catalog_module, "elapsed_clock", lambda: now + 61)  # paused longer than lease_ms
    with pytest.raises(CatalogGapError, match="catalog commit 3 is missing"):
        zombie.commit([_segment("t", 0, "data/zombie", 0, 0)], zombie_epoch)
    assert _commits(store) == before


def test_a_busy_writer_does_not_look_before_its_commits(storage, monkeypatch):
    catalog, epoch = _writer(storage)
    listed = []
    real_list = catalog.store.list
    monkeypatch.setattr(catalog.store, "list", lambda prefix="", **kw: listed.append(prefix) or real_list(prefix, **kw))
    catalog.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    for i in range(5):
        catalog.commit([_segment("t", 0, f"data/{i}", i * 10, i * 10 + 9)], epoch)
    assert catalog.version == 7 and listed == []


# ------------------------------------------------------------------------------------- check
def test_check_reports_a_healthy_catalog_and_a_gap_naming_the_missing_object(storage):
    _root_with_records(storage)
    store = storage.object_store()
    head = _head(store)
    ok = _cli(storage, "check")
    assert ok.exit_code == 0, ok.output
    assert ok.output.splitlines() == [
        f"Catalog of {store.url}", f"Version: {head} (head {head})", "Checkpoints: none",
        f"Commits: 1..{head} ({head} present)", "Gaps: none", "Status: healthy"]
    n, _ = _commit_writing(store, 17)
    store.delete(commit_key(n))
    bad = _cli(storage, "check")
    assert bad.exit_code == 1
    lines = bad.output.splitlines()
    assert lines[:6] == [
        f"Catalog of {store.url}", f"Version: readers cannot load it (head {head})", "Checkpoints: none",
        f"Commits: 1..{head} ({head - 1} present)",
        f"Gap: commit {n} missing, {store.uri(commit_key(n + 1))} exists past it (readers stop here, writers refuse to commit)",
        f"  missing: {store.uri(commit_key(n))}"]
    assert lines[6].startswith(f"Load: CatalogGapError: {store.uri(commit_key(n))}: catalog commit {n} is missing")
    assert lines[7:] == ["Status: UNHEALTHY: 1 missing commit; `txlake catalog repair` shows what can be restored"]


def test_check_reports_unreadable_objects_and_objects_the_catalog_names_that_are_gone(storage):
    _root_with_records(storage, 3)
    store = storage.object_store()
    n, path = _commit_writing(store, 1)
    store.delete(path)
    gone = _cli(storage, "check")
    assert gone.exit_code == 1
    assert f"Missing object named by the catalog: {store.uri(path)}" in gone.output.splitlines()
    assert gone.output.splitlines()[-1] == "Status: UNHEALTHY: 1 missing object; restore the objects named above from a backup"
    store.delete(commit_key(n))
    store.put(commit_key(n), b"PAR1 truncated")
    bad = _cli(storage, "check")
    assert bad.exit_code == 1
    assert any(line.startswith(f"Unreadable commit {n}: CorruptObjectError: {store.uri(commit_key(n))}")
               for line in bad.output.splitlines())


# ------------------------------------------------------------------------------------- repair
def test_repair_restores_a_lost_flush_whose_data_object_is_still_there(storage):
    _root_with_records(storage)
    store = storage.object_store()
    n, path = _commit_writing(store, 17)
    head = _head(store)
    store.delete(commit_key(n))
    plan = _cli(storage, "repair")
    assert plan.exit_code == 1
    assert plan.output.splitlines() == [
        f"Catalog of {store.url}",
        f"Missing: commit {n} ({store.uri(commit_key(n))})",
        f"Restore: t [0] offsets 17..17 (1 record) from {store.uri(path)}, into commit {n}",
        "Unknown: anything else the lost commit held (topic changes, aborted-transaction entries, producer snapshots, "
        "lease changes); producer ids skip one block",
        "Nothing written: 1 segment can be restored and 0 offsets are lost. Run `txlake catalog repair --accept-loss` "
        "to write this, or restore the missing commit objects from a backup instead."]
    assert commit_key(n) not in _commits(store)  # a plan writes nothing
    done = _cli(storage, "repair", "--accept-loss")
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[-1] == (f"Wrote repair marker commit {n}: readers load up to version {head}; "
                                            "1 segment restored, 0 offsets lost.")
    marker = decode_actions(store.get(commit_key(n)), COMMIT_KIND, commit_key(n))
    assert [a["action"] for a in marker] == [LOST_COMMIT, "producer_id_block", ADD_SEGMENT]
    assert json.loads(marker[0]["info"])["restored"] == [
        {"topic": "t", "partition": 0, "path": path, "first_offset": 17, "last_offset": 17}]
    assert _read_all(storage) == [(i, str(i).encode()) for i in range(RECORDS)]
    # and the root takes writes again
    _produce(storage, ["30"])
    assert _read_all(storage) == [(i, str(i).encode()) for i in range(RECORDS + 1)]
    again = _cli(storage, "check")
    assert again.exit_code == 0
    assert again.output.splitlines()[-2:] == [
        f"Repaired: commit {n} was lost and marked by `txlake catalog repair` at "
        f"{json.loads(marker[0]['info'])['repaired_at']} (1 segment restored, 0 offsets lost)", "Status: healthy"]


def test_repair_with_accept_loss_marks_what_is_gone_and_later_commits_replay(storage):
    _root_with_records(storage)
    store = storage.object_store()
    n, path = _commit_writing(store, 17)
    m, _ = _commit_writing(store, 20)
    store.delete(commit_key(n))
    store.delete(path)  # the data object went with it
    store.delete(commit_key(m))  # and a second gap, its object still there
    plan = _cli(storage, "repair")
    assert plan.exit_code == 1
    lines = plan.output.splitlines()
    assert f"Lost: t [0] offsets 17..17 (1 offset, commit {n}): no object that no commit names holds exactly these " \
           "offsets" in lines
    assert any(line.startswith(f"Restore: t [0] offsets 20..20 (1 record) from ") for line in lines)
    assert lines[-1].startswith("Nothing written: 1 segment can be restored and 1 offset is lost.")
    with pytest.raises(CatalogGapError):
        Catalog.open(storage.object_store())
    done = _cli(storage, "repair", "--accept-loss")
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[-1].startswith(f"Wrote repair marker commits {n}, {m}: readers load up to version ")
    assert done.output.splitlines()[-1].endswith("1 segment restored, 1 offset lost.")
    assert _read_all(storage) == [(i, str(i).encode()) for i in range(RECORDS) if i != 17]
    _produce(storage, ["30"])
    assert _read_all(storage)[-1] == (30, b"30")
    assert _cli(storage, "check").exit_code == 0
    assert _cli(storage, "repair").output.splitlines() == [
        f"Catalog of {store.url}: no gap that readers stop at; nothing to repair."]


def test_repair_refuses_when_later_commits_cannot_replay_without_the_lost_one(storage):
    _root_with_records(storage, 3)
    store = storage.object_store()
    created = next(k for k, data in _commits(store).items()
                   if any(a["action"] == CREATE_TOPIC for a in decode_actions(data, COMMIT_KIND, k)))
    store.delete(created)
    before = _commits(store)
    result = _cli(storage, "repair", "--accept-loss")
    assert result.exit_code == 1
    assert any(line.startswith("Cannot repair: commit ") and "cannot be replayed without the lost commit(s): "
               "Unknown topic or partition: t [0]. Restore the missing commit from a backup." in line
               for line in result.output.splitlines()), result.output
    assert _commits(store) == before


# ------------------------------------------------------------------------------------- not gaps
def test_commits_the_cleanup_deleted_below_a_checkpoint_are_not_a_gap(storage):
    catalog, _ = _ten_commits(storage)
    clean_catalog_log(catalog, RETENTION, _later())  # commits 1..6 and checkpoint 3 deleted
    store = storage.object_store()
    for i in range(9):
        store.put(f"data/{i}", b"the segments the commits name")
    result = _cli(storage, "check")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"Catalog of {store.url}", "Version: 10 (head 10)", "Checkpoints: 6, 9; readers start from 9",
        "Commits: 7..10 (4 present); 1..6 cleaned up below a checkpoint", "Gaps: none", "Status: healthy"]
    reader = Catalog.open(storage.object_store())
    assert reader.version == 10
    late = Catalog(storage.object_store())  # a view with nothing applied: restarts from checkpoint 9
    late.gap_check_ms = 0
    assert late.refresh() is True and late.version == 10
    writer = Catalog.open(storage.object_store(), checkpoint_interval=3)
    epoch = WriterLease(writer, lease_ms=60_000).acquire(force=True)
    assert writer.commit([_segment("t", 0, "data/8", 80, 89)], epoch) == 12
    # a gap below the checkpoint readers start from is covered: a warning, not a failure
    store.delete(commit_key(8))
    covered = _cli(storage, "check")
    assert covered.exit_code == 0
    assert f"Gap: commit 8 missing, {store.uri(commit_key(9))} exists past it (covered: readers start from " \
           f"checkpoint 12 past it)" in covered.output.splitlines()
    assert covered.output.splitlines()[-1] == "Status: healthy (1 warning)"
    assert Catalog.open(storage.object_store()).version == 12
    assert checkpoint_key(12) in {o.key for o in store.list("_catalog/checkpoints/")}


def test_first_key_after(storage, monkeypatch):
    store = storage.object_store()
    for n in (1, 3, 5):
        store.put(f"k/{n:03d}", b"x")
    if storage.backend == "s3":  # one ListObjectsV2 request (StartAfter), however many keys follow
        calls = []
        real = store.fs.call_s3
        monkeypatch.setattr(store.fs, "call_s3", lambda method, *a, **kw: calls.append(method) or real(method, *a, **kw))
        assert store.first_key_after("k/", "k/002") == "k/003" and calls == ["list_objects_v2"]
    assert store.first_key_after("k/", "k/000") == "k/001"
    assert store.first_key_after("k/", "k/001") == "k/003"
    assert store.first_key_after("k/", "k/004") == "k/005"
    assert store.first_key_after("k/", "k/005") is None
    assert store.first_key_after("nothing/", "nothing/1") is None


def test_repair_rebuilds_the_aborted_transaction_entry_of_a_restored_abort_marker(storage):
    AdminClient(_conf(storage)).create_topics([NewTopic("t", 1)])["t"].result()
    tx = Producer({**_conf(storage), "transactional.id": "tx"})
    tx.init_transactions(30)
    tx.begin_transaction()  # offsets 0, 1: a committed record and its COMMIT marker
    tx.produce("t", value=b"committed", partition=0)
    tx.commit_transaction(30)
    tx.begin_transaction()  # offsets 2, 3 and the ABORT marker at 4
    for v in (b"aborted-0", b"aborted-1"):
        tx.produce("t", value=v, partition=0)
    assert tx.flush(30) == 0
    tx.abort_transaction(30)
    plain = Producer(_conf(storage))
    plain.produce("t", value=b"after", partition=0)
    assert plain.flush(30) == 0
    registry.close_all()
    store = storage.object_store()
    n, marker = next((int(k.rsplit("/", 1)[1].split(".")[0]), a) for k, data in _commits(store).items()
                     for a in decode_actions(data, COMMIT_KIND, k) if a["action"] == "aborted_txn")
    assert (marker["topic"], marker["base_offset"], marker["last_offset"]) == ("t", 2, 4)
    store.delete(commit_key(n))
    done = _cli(storage, "repair", "--accept-loss")
    assert done.exit_code == 0, done.output
    restore = [line for line in done.output.splitlines() if line.startswith("Restore: t [0]")]
    assert len(restore) == 1 and restore[0].endswith(
        f"into commit {n}, with the aborted transaction of producer {marker['producer_id']} at offsets 2..4")
    # read_committed still skips the aborted records; the marker is back in the log
    assert _read_all(storage) == [(0, b"committed"), (5, b"after")]
    state = Catalog.open(storage.object_store()).state.partition("t", 0)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in state.aborted_transactions] == [
        (marker["producer_id"], 2, 4)]  # exactly the entry the lost commit held
    assert state.high_watermark == 6


def test_a_running_writers_next_checkpoint_covers_a_gap_in_its_tail(storage):
    writer, epoch = _writer(storage, interval=5)
    writer.commit([{"action": CREATE_TOPIC, "topic": "t", "topic_id": "x", "num_partitions": 1}], epoch)
    for i in range(5):
        writer.commit([_segment("t", 0, f"data/{i}", i * 10, i * 10 + 9)], epoch)
    store = storage.object_store()
    store.delete(commit_key(6))  # the writer still holds it in memory
    with pytest.raises(CatalogGapError, match="catalog commit 6 is missing"):
        Catalog.open(storage.object_store())
    for i in range(5, 8):  # it goes on at the head (8, 9, 10) and checkpoints version 10 from memory
        writer.commit([_segment("t", 0, f"data/{i}", i * 10, i * 10 + 9)], epoch)
    reader = Catalog.open(storage.object_store())
    assert reader.version == 10
    assert [s.path for s in reader.state.partition("t", 0).segments] == [f"data/{i}" for i in range(8)]
