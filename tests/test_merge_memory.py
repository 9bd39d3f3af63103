"""The small-file merge streams its records (issue 14: a low-rate producer's RSS must stay flat).

Proved here: merging a run of many flush segments holds a few row groups of decoded records
at once, not the run -- the peak of Arrow's memory pool while ``rewrite_segments`` merges
~40 MB of records stays under a quarter of the run's decoded size (the whole-run read held
all of it, plus its encoding); the streamed output is exactly the input, with row groups of
about ``row_group_bytes`` and objects cut at ``segment.bytes``; a segment whose rows are not
in offset order (never written by txlake, but the old merge sorted it) is still merged in
offset order.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from compaction_support import committed_tables
from helpers import close_engines  # noqa: F401
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.engine.errors import Errors
from txlake.engine.log_reader import LogReader, SegmentCache
from txlake.engine.segment_merge import rewrite_segments
from txlake.formats.records import PAYLOAD_SCHEMA, encode_segments, read_segment

FILE_ONLY = pytest.mark.parametrize("backend", ["file"])

#: the merge in a fresh interpreter: its Arrow pool's peak (``max_memory``) is the merge's alone
MERGE_CHILD = r"""
import json, sys
import pyarrow as pa
from txlake.catalog.catalog import Catalog
from txlake.catalog.storage import ObjectStore
from txlake.engine.log_reader import LogReader, SegmentCache
from txlake.engine.segment_merge import rewrite_segments

spec = json.loads(sys.argv[1])
catalog = Catalog.open(ObjectStore(spec["url"]))
segments = list(catalog.state.topics["m"].partitions[0].segments)[:spec["segments"]]
reader = LogReader(catalog, SegmentCache(0))
pool = pa.default_memory_pool()
before = pool.bytes_allocated()
rewrite = rewrite_segments(reader, segments, target_bytes=spec["target_bytes"],
                           row_group_bytes=spec["row_group_bytes"])
print(json.dumps({"peak": pool.max_memory() - before, "records_out": rewrite.records_out,
                  "segments": [[s.path, s.base_offset, s.last_offset, s.record_count, s.row_group_count]
                               for s in rewrite.segments]}))
"""


def _produce_flushes(storage, flushes: int, records: int, value_bytes: int) -> Broker:
    """A 1-partition topic ``m`` of ``flushes`` flush objects of ``records`` records each
    (random, incompressible values of ``value_bytes``)."""
    broker = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, flush_interval_ms=0, lease_ms=60_000,
                                                         compaction_interval_ms=0))
    broker.create_topics([("m", 1, {})])
    rng = np.random.default_rng(7)
    for f in range(flushes):
        values = [rng.bytes(value_bytes) for _ in range(records)]
        batch = pa.Table.from_pydict({"timestamp": [1_000 + f * records + i for i in range(records)],
                                      "key": [b"k%d" % i for i in range(records)], "value": values,
                                      "headers": [None] * records}, schema=PAYLOAD_SCHEMA)
        (result,) = broker.produce([ProduceBatch("m", 0, batch)])
        assert result.error == Errors.NO_ERROR
    assert len(broker.catalog.state.topics["m"].partitions[0].segments) == flushes
    return broker


def _merge_in_child(storage, segments: int, row_group_bytes: int) -> dict:
    """Merge the first ``segments`` segments of ``m`` (segment.bytes 1 GiB: one output object)
    in a fresh interpreter: ``{"peak": bytes, "records_out": n, "segments": [[path, base, last,
    records, row groups], ...]}``."""
    spec = {"url": storage.url, "segments": segments, "target_bytes": 1 << 30, "row_group_bytes": row_group_bytes}
    out = subprocess.run([sys.executable, "-c", MERGE_CHILD, json.dumps(spec)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@FILE_ONLY
def test_a_merge_holds_a_few_row_groups_not_the_run(storage, close_engines):
    flushes, records, value_bytes = 40, 1_000, 1_000  # ~43 MB of records, ~1 MB a flush segment
    broker = _produce_flushes(storage, flushes, records, value_bytes)
    before = committed_tables(storage, "m")[0]
    decoded = before.nbytes
    assert decoded > 40 * 10**6
    broker.close()

    row_group_bytes = 2 * 2**20
    quarter = _merge_in_child(storage, flushes // 4, row_group_bytes)
    whole = _merge_in_child(storage, flushes, row_group_bytes)
    # The whole-run read held every decoded record, then the encoded object in a growing
    # buffer: 116 MB of Arrow memory at its peak for the 40 segments, 29 MB for 10. Streamed:
    # READ_THREADS + 1 flush segments (~1 MB each), the row group being filled (2 MiB) and its
    # encoding (the object goes to a spool file), the same ~11 MB for 10 segments or 40.
    assert whole["peak"] < decoded / 3, (whole["peak"], decoded)
    assert whole["peak"] < 1.5 * quarter["peak"], (whole["peak"], quarter["peak"])
    assert whole["records_out"] == flushes * records
    ((path, base, last, count, groups),) = whole["segments"]
    assert (base, last, count) == (0, flushes * records - 1, flushes * records)
    assert abs(groups - decoded / row_group_bytes) <= 2, groups  # row groups of about row_group_bytes
    merged = read_segment(storage.object_store().get(path), path)
    assert merged.equals(before)


@FILE_ONLY
def test_a_segment_out_of_offset_order_is_merged_in_offset_order(storage, close_engines):
    broker = _produce_flushes(storage, 3, 20, 10)
    before = committed_tables(storage, "m")[0]
    segments = list(broker.catalog.state.topics["m"].partitions[0].segments)
    # the middle segment's object rewritten with its rows reversed (same records, same row group)
    middle = segments[1]
    rows = read_segment(broker.store.get(middle.path), middle.path)
    broker.store.put(middle.path, encode_segments([rows.take(pa.array(range(rows.num_rows - 1, -1, -1)))])[0])
    rewrite = rewrite_segments(LogReader(broker.catalog, SegmentCache(0)), segments, target_bytes=1 << 30)
    (seg,) = rewrite.segments
    assert (seg.base_offset, seg.last_offset, seg.record_count) == (0, 59, 60)
    assert read_segment(broker.store.get(seg.path), seg.path).equals(before)
    # the objects the streamed attempt wrote before it met the reversed rows are gone again
    referenced = {s.path for s in segments} | {seg.path}
    assert {o.key for o in broker.store.list("data/")} == referenced


@FILE_ONLY
def test_segments_the_reader_holds_are_merged_in_place_with_the_ones_it_reads(storage, close_engines):
    broker = _produce_flushes(storage, 7, 5, 10)
    before = committed_tables(storage, "m")[0]
    segments = list(broker.catalog.state.topics["m"].partitions[0].segments)
    reader = LogReader(broker.catalog, SegmentCache(None))
    for seg in (segments[0], segments[2], segments[3], segments[6]):  # cached; the others are read
        reader.segment_table(seg)
    rewrite = rewrite_segments(reader, segments, target_bytes=1 << 30)
    (seg,) = rewrite.segments
    assert (seg.base_offset, seg.last_offset, seg.record_count) == (0, 34, 35)
    assert read_segment(broker.store.get(seg.path), seg.path).equals(before)
