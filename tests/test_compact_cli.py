"""``txlake compact [--topic …] [--dry-run]``: progress, summary, errors."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from compaction_support import QUIET, committed_tables, fresh_catalog, produce_varied_log
from helpers import close_engines, writer_procs  # noqa: F401
from txlake.cli import main

file_only = pytest.mark.parametrize("backend", ["file"])


def _run(storage, *args: str, code: int = 0):
    result = CliRunner().invoke(main, ["compact", "--storage", storage.url, *args], catch_exceptions=False,
                                env={"COLUMNS": "200", "TXLAKE_STORAGE_OPTIONS": None})
    assert result.exit_code == code, (result.stdout, result.stderr)
    return result


def _row(output: str, name: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.strip().startswith(name))
    return [cell for cell in re.split(r"\s{2,}|\s*│\s*", line.strip())[1:] if cell]


@file_only
def test_dry_run_then_compact(storage, close_engines):
    produce_varied_log(storage, "t", partitions=2, flushes=3, per_flush=8, transactions=False)
    produce_varied_log(storage, "u", partitions=1, flushes=2, per_flush=4, transactions=False)
    before = fresh_catalog(storage)
    records = committed_tables(storage, "t", before)
    objects = len({s.path for p in before.state.topics["t"].partitions for s in p.segments})

    plan = _run(storage, "--topic", "t", "--dry-run").stdout
    assert "Dry run: nothing was changed" in plan and "Merging segments" in plan
    assert _row(plan, "Objects") == [str(objects), "2"]
    assert "Segment merges would be done: 2" in plan
    assert fresh_catalog(storage).version == before.version

    out = _run(storage, "-t", "t").stdout
    assert "Compacted in" in out and "Cleaning objects" in out and "100%" in out
    assert _row(out, "Objects") == [str(objects), "2"]
    assert _row(out, "Records") == ["24", "24"] and "Records removed: 0" in out
    assert "Segment merges done: 2" in out
    after = fresh_catalog(storage)
    assert [len(p.segments) for p in after.state.topics["t"].partitions] == [1, 1]
    assert len(after.state.topics["u"].partitions[0].segments) == 2  # not asked for
    assert all(committed_tables(storage, "t", after)[p].equals(t) for p, t in records.items())

    bad = _run(storage, "--topic", "nope", code=1)
    assert "Unknown topic: nope" in bad.stderr and "Traceback" not in bad.stderr


@file_only
def test_only_dry_run_while_another_process_is_the_writer(storage, writer_procs):
    w = writer_procs(storage, QUIET)
    w.request("create_topic", "created", topic="w", partitions=1)
    for r in range(2):
        w.request("produce", "produced", topic="w", n=5, prefix=f"r{r}")
    refused = _run(storage, code=1)
    assert "NOT_LEADER_OR_FOLLOWER" in refused.stderr and "Traceback" not in refused.stderr
    plan = _run(storage, "--dry-run").stdout
    assert "Segment merges would be done: 1" in plan, plan
    done = w.request("compact", "compacted")  # the writer compacts itself
    assert done["merges"] == 1 and done["objects_after"] == 1


@file_only
def test_compact_deletes_catalog_commits_older_than_the_retention(storage, close_engines):
    import os
    import time

    from txlake.engine.registry import close_all

    produce_varied_log(storage, "t", partitions=1, flushes=5, per_flush=3, transactions=False,
                       extra_conf={"storage.checkpoint.interval": 3})
    close_all()  # the writer exits; the command takes the lease
    store = storage.object_store()
    aged = fresh_catalog(storage).version
    newest = aged - aged % 3
    assert [o.key for o in store.list("_catalog/checkpoints/")] == [
        f"_catalog/checkpoints/{v:020d}.parquet" for v in range(3, newest + 1, 3)]
    two_hours_ago = time.time() - 7200
    for o in store.list("_catalog/"):  # as if all written two hours ago (the retention is one hour)
        os.utime(store.fs_path(o.key), (two_hours_ago, two_hours_ago))
    floor = newest - 3  # the newest expired checkpoint stays, and the one below it is the floor
    out = _run(storage).stdout
    assert (f"Catalog commits deleted: {floor} (and {floor // 3 - 1} checkpoints; older than "
            "storage.catalog.retention.ms)") in out
    versions = [int(o.key.rsplit("/", 1)[-1].split(".")[0]) for o in store.list("_catalog/commits/")]
    assert versions == list(range(floor + 1, versions[-1] + 1)) and versions[-1] > aged
    assert fresh_catalog(storage).version == versions[-1]
