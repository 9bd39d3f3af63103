"""txlake.duckdb: one view per topic holding exactly the committed records (file, memory, s3)."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import duckdb
import pyarrow as pa
import pytest

import txlake.duckdb as txduck
from txlake import AdminClient, NewTopic, Producer
from txlake.catalog.catalog import Catalog
from txlake.catalog.state import LOG_START_OFFSET, PARTITION_STATE, REMOVE_SEGMENT
from txlake.committed_view import AbortedTxn, topic_view
from txlake.engine import registry
from txlake.engine.broker import ProduceBatch
from txlake.formats.records import PAYLOAD_SCHEMA, encode_segments, read_segment

EXPECTED_TYPES = [
    ("key", "BLOB"), ("value", "BLOB"), ("topic", "VARCHAR"), ("partition", "INTEGER"), ("offset", "BIGINT"),
    ("timestamp", "TIMESTAMP"), ("timestampType", "INTEGER"), ("headers", 'STRUCT("key" VARCHAR, "value" BLOB)[]'),
]
BASE_TS = 1_700_000_000_123  # ms


@pytest.fixture(autouse=True)
def _close_engines():
    yield
    registry.close_all()


def create(storage, name, partitions, **config):
    with AdminClient(storage.conf()) as admin:
        admin.create_topics([NewTopic(name, partitions, config=config)])[name].result()


def produce(storage, topic, rows):
    """Produce ``rows`` = [(partition, key, value, timestamp_ms, headers)]; returns the expected view rows."""
    delivered = []

    def on_delivery(err, msg):
        assert err is None, err
        delivered.append(msg)

    p = Producer({**storage.conf(), "linger.ms": 1})
    for part, key, value, ts, headers in rows:
        p.produce(topic, value=value, key=key, partition=part, timestamp=ts, headers=headers, on_delivery=on_delivery)
    assert p.flush(30) == 0
    p.close()
    out = []
    for m in delivered:
        hdrs = [{"key": k, "value": v} for k, v in m.headers()] if m.headers() else None
        out.append({
            "key": m.key(), "value": m.value(), "topic": m.topic(), "partition": m.partition(), "offset": m.offset(),
            "timestamp": datetime.fromtimestamp(m.timestamp()[1] / 1000, timezone.utc).replace(tzinfo=None),
            "timestampType": 0, "headers": hdrs,
        })
    return sorted(out, key=lambda r: (r["partition"], r["offset"]))


def scalar(con, sql):
    return con.sql(sql).fetchall()[0][0]


def rows_of(con, view):
    rel = con.sql(f'SELECT * FROM {txduck.quote_ident(view)} ORDER BY partition, "offset"')
    cols = rel.columns
    return [dict(zip(cols, r)) for r in rel.fetchall()]


def sample_rows(n, partitions, start=0):
    rows = []
    for i in range(start, start + n):
        key = None if i % 7 == 0 else f"k{i % 5}".encode()
        value = None if i % 11 == 5 else f"value-{i}".encode() + bytes([0, 255])
        headers = [("h", f"{i}".encode()), ("empty", None)] if i % 3 == 0 else None
        rows.append((i % partitions, key, value, BASE_TS + i * 1000, headers))
    return rows


def test_view_holds_exactly_the_produced_records(storage):
    topic = "orders.v1-eu"
    create(storage, topic, 3)
    expected = produce(storage, topic, sample_rows(40, 3))
    con = txduck.connect(storage.url, storage.options)
    try:
        assert [(r[0], r[1]) for r in con.sql(f'DESCRIBE "{topic}"').fetchall()] == EXPECTED_TYPES
        got = rows_of(con, topic)
        assert got == expected
        assert len(got) == 40
        # timestamps are UTC with ms precision
        assert got[0]["timestamp"] == datetime(2023, 11, 14, 22, 13, 20, 123000)
        assert scalar(con, f'SELECT count(*) FROM "{topic}" WHERE key IS NULL') == \
            sum(1 for r in expected if r["key"] is None)
        assert len(txduck.topic_relation(con, topic).fetchall()) == 40
    finally:
        con.close()


def test_empty_topic_has_a_typed_empty_view_and_names_are_quoted(storage):
    create(storage, "a-b.c", 2)
    create(storage, "select", 1)
    con = txduck.connect(storage.url, storage.options)
    try:
        assert [(r[0], r[1]) for r in con.sql('DESCRIBE "a-b.c"').fetchall()] == EXPECTED_TYPES
        assert scalar(con, 'SELECT count(*) FROM "a-b.c"') == 0
        assert scalar(con, 'SELECT count(*) FROM "select"') == 0
    finally:
        con.close()


def test_refresh_picks_up_new_commits_topics_and_deletions(storage):
    create(storage, "t1", 2)
    first = produce(storage, "t1", sample_rows(10, 2))
    con = txduck.connect(storage.url, storage.options)
    try:
        assert rows_of(con, "t1") == first
        more = produce(storage, "t1", sample_rows(6, 2, start=10))
        create(storage, "t2", 1)
        t2 = produce(storage, "t2", [(0, b"x", b"y", BASE_TS, None)])
        assert len(rows_of(con, "t1")) == 10  # frozen at the version it was built from
        changed = txduck.refresh(con)
        assert sorted(changed) == ["t1", "t2"]
        assert rows_of(con, "t1") == sorted(first + more, key=lambda r: (r["partition"], r["offset"]))
        assert rows_of(con, "t2") == t2
        assert txduck.refresh(con) == []
        with AdminClient(storage.conf()) as admin:
            admin.delete_topics(["t2"])["t2"].result()
        assert txduck.refresh(con) == ["t2"]
        names = {r[0] for r in con.sql("SELECT table_name FROM information_schema.tables").fetchall()}
        assert "t2" not in names and "t1" in names
        # re-calling connect on a new connection sees the same
        con2 = txduck.connect(storage.url, storage.options)
        assert rows_of(con2, "t1") == rows_of(con, "t1")
        con2.close()
    finally:
        con.close()


def _writer(storage):
    broker = registry.acquire_broker(storage.url, storage.options)
    broker.ensure_writer()
    return broker


def test_view_respects_log_start_offset_and_last_stable_offset(storage):
    create(storage, "bounded", 2)
    expected = produce(storage, "bounded", sample_rows(30, 2))  # 15 records per partition, offsets 0..14
    broker = _writer(storage)
    try:
        broker.catalog.commit([
            {"action": LOG_START_OFFSET, "topic": "bounded", "partition": 0, "offset": 4},
            {"action": PARTITION_STATE, "topic": "bounded", "partition": 1, "offset": 2,
             "high_watermark": 15, "last_stable_offset": 9},
        ], broker.lease.epoch)
    finally:
        registry.release_broker(broker)
    want = [r for r in expected if (r["partition"] == 0 and r["offset"] >= 4)
            or (r["partition"] == 1 and 2 <= r["offset"] < 9)]
    con = txduck.connect(storage.url, storage.options)
    try:
        assert rows_of(con, "bounded") == want
        assert con.sql('SELECT partition, min("offset"), max("offset"), count(*) FROM bounded GROUP BY ALL '
                       'ORDER BY 1').fetchall() == [(0, 4, 14, 11), (1, 2, 8, 7)]
    finally:
        con.close()
    unc = txduck.connect(storage.url, storage.options, isolation_level="read_uncommitted")
    try:
        assert unc.sql('SELECT partition, min("offset"), max("offset") FROM bounded GROUP BY ALL ORDER BY 1'
                       ).fetchall() == [(0, 4, 14), (1, 2, 14)]
    finally:
        unc.close()


def test_rows_the_catalog_no_longer_names_never_show(storage):
    """A partially compacted object (one partition's segment moved to a new object) and a
    deleted topic sharing an object: their rows stay in the old object but never show."""
    create(storage, "shared", 2)
    create(storage, "gone", 1)
    # one Produce request with batches of both topics: one group-commit object holds them all
    broker = _writer(storage)
    try:
        def batch(topic, part, values):
            return ProduceBatch(topic, part, pa.table({"timestamp": [BASE_TS] * len(values), "key": [None] * len(values),
                                                       "value": values, "headers": [None] * len(values)},
                                                      schema=PAYLOAD_SCHEMA))
        results = broker.produce([batch("shared", 0, [f"s{i}".encode() for i in range(0, 8, 2)]),
                                  batch("shared", 1, [f"s{i}".encode() for i in range(1, 8, 2)]),
                                  batch("gone", 0, [f"g{i}".encode() for i in range(8)])])
        assert [r.error.name for r in results] == ["NO_ERROR"] * 3
    finally:
        registry.release_broker(broker)
    store = storage.object_store()
    state = Catalog.open(store).state
    seg0 = state.topics["shared"].partitions[0].segments[0]
    assert seg0.path == state.topics["shared"].partitions[1].segments[0].path == \
        state.topics["gone"].partitions[0].segments[0].path, "expected one group-commit object"
    # "compact" partition 0 into its own object: same rows, same offsets
    with store.open_input(seg0.path) as f:
        rows = read_segment(f, seg0.path, seg0.row_groups)
    data, ranges = encode_segments([rows])
    store.put("data/compacted-p0.parquet", data)
    broker = _writer(storage)
    try:
        p0 = broker.catalog.state.topics["shared"].partitions[0]
        moved = {**seg0.to_action(p0.high_watermark, p0.last_stable_offset), "path": "data/compacted-p0.parquet",
                 "row_group_start": ranges[0][0], "row_group_count": ranges[0][1]}
        broker.catalog.commit([{"action": REMOVE_SEGMENT, "topic": "shared", "partition": 0, "path": seg0.path,
                                "base_offset": seg0.base_offset}, moved], broker.lease.epoch)
    finally:
        registry.release_broker(broker)
    with AdminClient(storage.conf()) as admin:
        admin.delete_topics(["gone"])["gone"].result()
    view = topic_view(store, Catalog.open(store).state, "shared")
    assert {(o.key, o.exact) for o in view.objects} == {(seg0.path, True), ("data/compacted-p0.parquet", False)}
    con = txduck.connect(storage.url, storage.options)
    try:
        got = con.sql('SELECT partition, "offset", decode(value) FROM shared ORDER BY 1, 2').fetchall()
        assert got == sorted((i % 2, i // 2, f"s{i}") for i in range(8))
        assert "gone" not in {r[0] for r in con.sql("SELECT table_name FROM information_schema.tables").fetchall()}
        # a topic re-created under the old name starts empty, though old rows remain in the shared object
        create(storage, "gone", 1)
        txduck.refresh(con)
        assert scalar(con, 'SELECT count(*) FROM gone') == 0
    finally:
        con.close()


def test_aborted_transactions_are_filtered(storage):
    """The catalog will carry aborted (producer id, first, last offset) per partition; the view drops them."""
    create(storage, "txn", 1)
    produce(storage, "txn", [(0, None, f"v{i}".encode(), BASE_TS, None) for i in range(10)])
    store = storage.object_store()
    state = Catalog.open(store).state
    seg = state.topics["txn"].partitions[0].segments[0]
    with store.open_input(seg.path) as f:
        pid = read_segment(f, seg.path, seg.row_groups).column("producer_id")[0].as_py()
    assert pid >= 0
    state.topics["txn"].partitions[0].aborted_transactions = [AbortedTxn(pid, 3, 5), AbortedTxn(pid + 1, 0, 9)]
    view = topic_view(store, state, "txn")
    assert view.aborted == {0: [AbortedTxn(pid, 3, 5), AbortedTxn(pid + 1, 0, 9)]}
    con = txduck.connect(storage.url, storage.options)
    try:
        got = [r[0] for r in con.sql(f'SELECT "offset" FROM ({txduck.view_sql(store, view)}) ORDER BY 1').fetchall()]
        assert got == [0, 1, 2, 6, 7, 8, 9]
    finally:
        con.close()
    # the same filter as a pyarrow.dataset expression (for the Spark connector)
    import pyarrow.dataset as ds

    obj = view.objects[0]
    frag = ds.ParquetFileFormat().make_fragment(store.fs_path(obj.key), filesystem=store.arrow_filesystem())
    table = ds.FileSystemDataset([frag], frag.physical_schema, ds.ParquetFileFormat(),
                                 store.arrow_filesystem()).to_table(filter=view.arrow_filter(obj))
    assert sorted(table.column("offset").to_pylist()) == [0, 1, 2, 6, 7, 8, 9]
    unc = topic_view(store, state, "txn", isolation_level="read_uncommitted")
    assert unc.aborted == {}


def test_committed_files_and_view_prefix(storage):
    create(storage, "files", 2)
    produce(storage, "files", sample_rows(4, 2))
    files = txduck.committed_files(storage.url, "files", storage.options)
    state = Catalog.open(storage.object_store()).state
    assert files == sorted({storage.object_store().uri(s.path)
                            for p in state.topics["files"].partitions for s in p.segments})
    assert all(f.startswith(storage.object_store().url + "/data/") for f in files)
    con = txduck.connect(storage.url, storage.options)
    try:
        with pytest.raises(ValueError, match="already holds topic"):
            txduck.connect(storage.url, storage.options, connection=con)
        txduck.connect(storage.url, storage.options, connection=con, prefix="copy_")
        assert scalar(con, 'SELECT count(*) FROM copy_files') == 4
        assert con.sql(txduck.topic_sql(storage.url, "files", storage.options) + ' ORDER BY partition, "offset"').fetchall() \
            == con.sql('SELECT * FROM files ORDER BY partition, "offset"').fetchall()
    finally:
        con.close()


def test_json_values_keeps_types_and_order():
    rb = pa.record_batch({"a": [1, None, 3], "b": ["x", 'y"', None], "c d": [1.5, 2.0, None]})
    assert txduck.json_values(rb).to_pylist() == [
        '{"a":1,"b":"x","c d":1.5}', '{"a":null,"b":"y\\"","c d":2.0}', '{"a":3,"b":null,"c d":null}']


def test_unreadable_objects_fail_loudly_naming_the_object(storage):
    from txlake.formats.errors import CorruptObjectError

    create(storage, "c", 3)
    broker = _writer(storage)
    try:
        def batch(part):
            return ProduceBatch("c", part, pa.table({"timestamp": [BASE_TS], "key": [None], "value": [b"v"],
                                                     "headers": [None]}, schema=PAYLOAD_SCHEMA))
        assert [r.error.name for r in broker.produce([batch(0), batch(1), batch(2)])] == ["NO_ERROR"] * 3
    finally:
        registry.release_broker(broker)
    store = storage.object_store()
    seg = Catalog.open(store).state.topics["c"].partitions[2].segments[0]
    assert seg.row_group_start == 2
    with store.open_input(seg.path) as f:
        one = read_segment(f, seg.path, [0])
    store.put(seg.path, encode_segments([one])[0])  # replaced by an object with 1 row group
    with pytest.raises(CorruptObjectError, match="has 1 row groups, but the catalog names row group 2") as info:
        txduck.topic_sql(storage.url, "c", storage.options)
    assert info.value.location == store.uri(seg.path)
    # connect() does not fail: the topic's view does, when queried (tests/test_duckdb_corrupt.py)
    expected = f"txlake: topic 'c' cannot be read: CorruptObjectError: {store.uri(seg.path)}: has 1 row groups, " \
               "but the catalog names row group 2"
    with pytest.warns(txduck.UnreadableTopicWarning, match="has 1 row groups, but the catalog names row group 2"):
        con = txduck.connect(storage.url, storage.options)
    with pytest.raises(duckdb.InvalidInputException, match=re.escape(expected)):
        con.sql("SELECT count(*) FROM c").fetchall()
    con.close()
    create(storage, "d", 1)
    produce(storage, "d", [(0, None, b"x", BASE_TS, None)])
    seg_d = Catalog.open(store).state.topics["d"].partitions[0].segments[0]
    store.put(seg_d.path, b"not parquet at all")
    with pytest.warns(txduck.UnreadableTopicWarning, match="not a readable Parquet object"):
        con = txduck.connect(storage.url, storage.options, topics=["d"])
    assert txduck.unreadable_topics(con)["d"].startswith(
        f"txlake: topic 'd' cannot be read: CorruptObjectError: {store.uri(seg_d.path)}: not a readable Parquet object")
    with pytest.raises(duckdb.InvalidInputException, match="not a readable Parquet object"):
        con.sql("SELECT * FROM d").fetchall()
    con.close()


def test_log_append_time_topic(storage):
    create(storage, "appended", 1, **{"message.timestamp.type": "LogAppendTime"})
    before = datetime.now(timezone.utc).replace(tzinfo=None)
    produce(storage, "appended", [(0, b"k", b"v", BASE_TS, None)])
    after = datetime.now(timezone.utc).replace(tzinfo=None)
    con = txduck.connect(storage.url, storage.options)
    try:
        ((ts, ts_type),) = con.sql('SELECT timestamp, timestampType FROM appended').fetchall()
    finally:
        con.close()
    assert ts_type == 1
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= ts <= after
    assert ts.microsecond % 1000 == 0
