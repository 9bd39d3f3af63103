"""A compaction SIGKILLed at any point leaves the log exactly as before or exactly as after.

A real writer process (tests/helpers/writer_proc.py) produces several flushes, then runs a
compaction that kills the process (SIGKILL) either after its new objects are written but
before the swap commit, or right after the commit. Every committed record (all columns)
is then compared with what was there before, read by a fresh reader; the catalog's segments
are exactly the old ones (before) or hold the swap (after); and a new writer taking over
removes the crash's orphans, finishes the compaction and loses nothing.
"""

from __future__ import annotations

import signal

import pytest

from compaction_support import QUIET, committed_tables, data_objects, fresh_catalog, referenced, writer_broker
from helpers import writer_procs  # noqa: F401
from txlake.engine.compaction import compact


def _layout(catalog, topic: str) -> dict[int, list]:
    return {p.partition: list(p.segments) for p in catalog.state.topics[topic].partitions}


@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
@pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_killed_compaction_leaves_the_log_as_before_or_as_after(storage, point, writer_procs):
    w = writer_procs(storage, QUIET)
    w.request("create_topic", "created", topic="k", partitions=2)
    # a flush of partition 0 alone, one of partition 1 alone, one shared by both: whichever
    # partition is merged first has objects no other partition references
    for r, partition in enumerate((0, 1, -1)):
        assert w.request("produce", "produced", topic="k", n=12, prefix=f"r{r}", partition=partition)["errors"] == 0
    before_cat = fresh_catalog(storage)
    before = committed_tables(storage, "k", before_cat)
    layout = _layout(before_cat, "k")
    assert sum(t.num_rows for t in before.values()) == 36 and all(len(s) >= 2 for s in layout.values())
    objects = data_objects(storage)

    w.request("crash_in_compaction", "armed", point=point)
    crash = w.wait_event("crashing", w.send("compact"))
    w.wait_exit(expect=-signal.SIGKILL)
    new_objects = set(crash["paths"])
    assert new_objects and new_objects <= data_objects(storage)

    after_cat = fresh_catalog(storage)
    after = committed_tables(storage, "k", after_cat)
    assert after.keys() == before.keys()
    for p, table in before.items():
        assert after[p].equals(table), f"partition {p} changed"
    assert objects <= data_objects(storage)  # nothing was deleted
    if point == "before_commit":  # exactly as before: the new objects are orphans
        assert after_cat.version == before_cat.version and _layout(after_cat, "k") == layout
        assert not new_objects & (referenced(after_cat) | set(after_cat.state.retired))
    else:  # exactly as after the swap: one partition merged, its old objects retired, still there
        changed = [p for p, segs in _layout(after_cat, "k").items() if segs != layout[p]]
        assert len(changed) == 1
        (merged,) = _layout(after_cat, "k")[changed[0]]
        assert merged.path in new_objects and merged.record_count == before[changed[0]].num_rows
        exclusive = {s.path for s in layout[changed[0]]} - referenced(after_cat)
        assert exclusive and exclusive <= objects
        assert set(after_cat.state.retired) == exclusive  # retired, not yet deleted

    # a new writer takes over: orphans go (grace 0), the compaction completes, nothing is lost
    broker = writer_broker(storage, {"storage.lease.force": True, "storage.orphan.grace.ms": 0,
                                     "storage.file.delete.delay.ms": 0})
    summary = compact(broker)
    final = fresh_catalog(storage)
    assert all(len(segs) == 1 for segs in _layout(final, "k").values())
    for p, table in committed_tables(storage, "k", final).items():
        assert table.equals(before[p])
    assert summary.records_removed == 0
    assert final.state.retired == {}
    assert data_objects(storage) == referenced(final)  # no orphan, no retired object left
