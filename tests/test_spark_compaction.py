"""Compaction as a Spark job (spark_connector/compaction_job.py): the engine's result.

A varied log (tests/compaction_support.py) is copied; one copy is compacted by
``compact_with_spark`` (rewrites in Spark tasks, swaps committed by the driver), the other
by ``engine.compaction.compact``, at the same ``now_ms``. Every committed record (all
columns), the segment layout (offset ranges, record counts, row groups), the partitions'
offsets and the summary must be the same, key compaction included; readers (a
read_committed Consumer, i.e. Fetch) see the same data before and after; nothing is deleted by
the job (replaced objects wait for their grace). Also: a stale rewrite is refused and its
objects deleted; the commits are handed to another process holding the writer lease;
``txlake compact --spark``.
"""

from __future__ import annotations

import dataclasses
import shutil
import time

import pytest
from click.testing import CliRunner

from compaction_support import (QUIET, committed_tables, data_objects, fresh_catalog, partition_offsets,
                                produce_varied_log, referenced, writer_broker)
from helpers import client_conf, writer_procs  # noqa: F401
from spark_support import close_engines, file_storage, spark  # noqa: F401
from txlake import Consumer, TopicPartition
from txlake.engine import registry
from txlake.engine.compaction import compact
from txlake.engine.segment_merge import plan_merges
from txlake.spark_connector.compaction_job import RewriteTask, commit_rewrites, compact_with_spark, run_rewrite_task

KEYED = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}


def _copy(storage, tmp_path):
    """A byte-identical copy of a file:// root (no engine may be open on it)."""
    from conftest import StorageTarget

    target = tmp_path / "copy"
    shutil.copytree(storage.url[len("file://"):], target)
    return StorageTarget(url=f"file://{target}", options={}, backend="file")


def _layout(catalog, topic: str) -> dict[int, list[tuple[int, int, int, int]]]:
    """Per partition: ``(base offset, last offset, records, row groups)`` of each segment."""
    return {p.partition: [(s.base_offset, s.last_offset, s.record_count, s.row_group_count) for s in p.segments]
            for p in catalog.state.topics[topic].partitions}


def _consume(storage, topic: str, partitions: int) -> list[tuple]:
    """Everything a read_committed Consumer returns (Fetch underneath), every field."""
    c = Consumer({**client_conf(storage, QUIET), "group.id": "v", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out = []
        while msgs := c.consume(1000, 0.5):
            out += [(m.partition(), m.offset(), m.key(), m.value(), m.headers(), m.timestamp()) for m in msgs
                    if m.error() is None]
        return sorted(out)
    finally:
        c.close()
        registry.close_all()


def _summary(s) -> dict:
    d = dataclasses.asdict(s)
    for local_only in ("deleted_objects", "orphans_deleted", "pending_deletion"):  # the job deletes nothing
        d.pop(local_only)
    return d


def test_spark_compaction_gives_the_engines_result(file_storage, tmp_path, close_engines):
    produce_varied_log(file_storage, "plain", partitions=3, flushes=4, per_flush=12)
    produce_varied_log(file_storage, "keyed", partitions=2, flushes=4, per_flush=12, topic_config=KEYED)
    copy = _copy(file_storage, tmp_path)
    plain_consumer = _consume(file_storage, "plain", 3)
    before = fresh_catalog(file_storage)
    keyed_before = committed_tables(file_storage, "keyed", before)
    now = int(time.time() * 1000)

    phases = []
    done = compact_with_spark(spark(), file_storage.url, file_storage.options, config=QUIET, now_ms=now,
                              progress=lambda phase, d, t: phases.append(phase))
    registry.close_all()
    local = compact(writer_broker(copy), now_ms=now)
    registry.close_all()

    assert _summary(done) == _summary(local)
    # (__transaction_state is a compacted topic too)
    assert done.merges >= 5 and done.key_compacted_partitions >= 2 and done.skipped == 0
    assert done.records_removed > 0 and done.objects_after < done.objects_before
    assert phases == ["retention", "key compaction", "merge"]
    spark_view, local_view = fresh_catalog(file_storage), fresh_catalog(copy)
    assert set(spark_view.state.topics) == set(local_view.state.topics) >= {"plain", "keyed"}
    for topic in spark_view.state.topics:  # the internal topics too
        assert _layout(spark_view, topic) == _layout(local_view, topic)
        assert partition_offsets(spark_view, topic) == partition_offsets(local_view, topic)
        got, want = committed_tables(file_storage, topic, spark_view), committed_tables(copy, topic, local_view)
        assert got.keys() == want.keys() and all(got[p].equals(want[p]) for p in got)  # every column
    assert all(len(p.segments) < 4 for p in spark_view.state.topics["plain"].partitions)

    # the compacted topic lost superseded records only, offsets unchanged
    for p, table in committed_tables(file_storage, "keyed", spark_view).items():
        old = keyed_before[p]
        assert table.num_rows < old.num_rows
        kept = set(table.column("offset").to_pylist())
        assert old.filter([o in kept for o in old.column("offset").to_pylist()]).equals(table)
    assert _consume(file_storage, "keyed", 2) == _consume(copy, "keyed", 2)

    # readers see the same data before and after
    assert _consume(file_storage, "plain", 3) == plain_consumer

    # the job deleted nothing: replaced objects are retired (stamped now) and wait for their grace;
    # every object is either named or retired (no leftovers of the tasks)
    retired = spark_view.state.retired
    assert retired and set(retired.values()) == {now}
    assert set(retired) <= data_objects(file_storage) and set(retired) & referenced(before)
    assert data_objects(file_storage) == referenced(spark_view) | set(retired)


def test_a_stale_rewrite_is_refused_and_its_objects_deleted(file_storage, close_engines):
    """The driver's commit step: a rewrite whose segments DeleteRecords removed meanwhile is not
    committed and its new objects go at once; the others are swapped in."""
    produce_varied_log(file_storage, "s", partitions=2, flushes=3, per_flush=6, transactions=False)
    broker = writer_broker(file_storage)
    store = broker.store
    now = int(time.time() * 1000)
    with broker.catalog.lock:
        runs = plan_merges(broker.catalog.state, ["s"])
        tasks = [RewriteTask(store, broker.catalog.state, r.topic, r.partition, r, now, "snappy", 1 << 20, 1 << 29)
                 for r in runs]
    rewrites = [rw for t in tasks for rw in run_rewrite_task(t)]
    assert [rw.run.partition for rw in rewrites] == [0, 1]
    new_objects = {s.path for rw in rewrites for s in rw.segments}
    assert new_objects <= data_objects(file_storage)
    segs = broker.catalog.state.topics["s"].partitions[0].segments
    broker.delete_records([("s", 0, segs[1].base_offset)])  # the log changed under rewrite 0

    assert commit_rewrites(broker.commit_under_lock, store, rewrites, now) == [False, True]
    stale, fresh = rewrites
    assert not {s.path for s in stale.segments} & data_objects(file_storage)
    view = fresh_catalog(file_storage)
    assert [s.path for s in view.state.topics["s"].partitions[0].segments] == [s.path for s in segs[1:]]
    assert [s.path for s in view.state.topics["s"].partitions[1].segments] == [s.path for s in fresh.segments]


def test_commits_are_handed_to_the_process_holding_the_writer_lease(file_storage, writer_procs):
    """Another process is the writer: the driver plans and Spark rewrites, the holder commits the
    swaps on its own engine (engine/handoff.py), keeps its lease and keeps producing."""
    w = writer_procs(file_storage, QUIET)
    w.request("create_topic", "created", topic="w", partitions=2)
    for r in range(3):
        w.request("produce", "produced", topic="w", n=6, prefix=f"r{r}")
    before = committed_tables(file_storage, "w")
    lease = fresh_catalog(file_storage).state.lease

    summary = compact_with_spark(spark(), file_storage.url, file_storage.options, config=QUIET)
    assert (summary.merges, summary.segments_before, summary.segments_after) == (2, 6, 2)
    view = fresh_catalog(file_storage)
    assert all(len(p.segments) == 1 for p in view.state.topics["w"].partitions)
    after = committed_tables(file_storage, "w", view)
    assert all(after[p].equals(before[p]) for p in before)
    assert (view.state.lease.epoch, view.state.lease.info["pid"]) == (lease.epoch, w.pid)  # no takeover
    w.request("produce", "produced", topic="w", n=2, prefix="after")  # still the writer
    assert sum(t.num_rows for t in committed_tables(file_storage, "w").values()) == 20


def test_cli_compact_spark(file_storage, close_engines):
    from txlake.cli import main

    produce_varied_log(file_storage, "t", partitions=2, flushes=3, per_flush=8, transactions=False)
    records = committed_tables(file_storage, "t")
    spark()  # the CLI reuses the process's SparkSession (and leaves it running)
    result = CliRunner().invoke(main, ["compact", "--spark", "--storage", file_storage.url, "-t", "t"],
                                catch_exceptions=False, env={"COLUMNS": "200", "TXLAKE_STORAGE_OPTIONS": None})
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert "Compacted in" in result.stdout and "Segment merges done: 2" in result.stdout
    view = fresh_catalog(file_storage)
    assert [len(p.segments) for p in view.state.topics["t"].partitions] == [1, 1]
    assert all(committed_tables(file_storage, "t", view)[p].equals(t) for p, t in records.items())
    assert spark().sparkContext._jsc is not None  # not stopped


def test_refused_with_the_holder_named_when_it_does_not_take_the_commits(file_storage, writer_procs):
    """A holder that looks for hand-overs only every 60 s: the job fails with an error naming it
    and saying what to do; nothing is committed and no new object is left behind."""
    from txlake.spark_connector.staged_commit import WriterLeaseUnavailable

    w = writer_procs(file_storage, {**QUIET, "storage.handoff.poll.ms": 60_000})
    w.request("create_topic", "created", topic="w", partitions=1)
    for r in range(2):
        w.request("produce", "produced", topic="w", n=3, prefix=f"r{r}")
    version, objects = fresh_catalog(file_storage).version, data_objects(file_storage)
    with pytest.raises(WriterLeaseUnavailable) as info:
        compact_with_spark(spark(), file_storage.url, file_storage.options,
                           config={**QUIET, "storage.handoff.timeout.ms": 500})
    text = str(info.value)
    assert f"pid {w.pid}" in text and "did not take the handed-over commit within 0.5 s" in text
    assert "writer lease is held by" in text and "close its txlake clients" in text
    assert fresh_catalog(file_storage).version == version and data_objects(file_storage) == objects
