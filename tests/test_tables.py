"""Delta tables of each topic's committed view (issue 19; docs/tables.md): after every step of a
log's life -- idempotent records, committed, aborted and open transactions, flush objects shared
with another topic, a compaction round, DeleteRecords -- the table that ``publish`` commits
returns through delta-rs exactly the records a read_committed Consumer returns."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest

from compaction_support import QUIET, fresh_catalog, writer_broker
from helpers import client_conf

deltalake = pytest.importorskip("deltalake")

from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition  # noqa: E402
from txlake.engine.compaction import compact  # noqa: E402
from txlake.engine.registry import close_all  # noqa: E402
from txlake.engine.table_publisher import TablePublisher, table_key, txn_app_id  # noqa: E402
from txlake.formats import delta_log as dl  # noqa: E402
from txlake.tables import delta_storage_options  # noqa: E402

TOPIC, OTHER = "orders", "audit"


@pytest.fixture(autouse=True)
def _close_engines():
    yield
    close_all()


def consumer_rows(conf: dict, topic: str, partitions: int) -> list[tuple]:
    """``(partition, offset, key, value, headers)`` of every record a read_committed Consumer
    returns from the start of ``topic`` (headers as a list of (key, value) or None), sorted."""
    c = Consumer({**conf, "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p) for p in range(partitions)])
    out = []
    while True:
        msgs = c.consume(1000, 0.3)
        if not msgs:
            break
        for m in msgs:
            assert m.error() is None, m.error()
            out.append((m.partition(), m.offset(), m.key(), m.value(),
                        [tuple(h) for h in m.headers()] if m.headers() else None))
    c.close()
    return sorted(out, key=lambda r: r[:2])


def table_rows(table: pa.Table) -> list[tuple]:
    """The same tuples from a table with txlake's record columns."""
    cols = table.select(["partition", "offset", "key", "value", "headers"]).to_pylist()
    out = [(r["partition"], r["offset"], r["key"], r["value"],
            [(h["key"], h["value"]) for h in r["headers"]] if r["headers"] else None) for r in cols]
    return sorted(out, key=lambda r: r[:2])


def delta_rs_rows(uri: str, storage_options: dict | None = None) -> list[tuple]:
    """Rows of the table's newest version read by delta-rs (DataFusion, which applies deletion
    vectors; delta-rs' pyarrow-dataset reader refuses tables with them)."""
    dt = deltalake.DeltaTable(uri, storage_options=delta_storage_options(storage_options))
    return table_rows(pa.table(dt.scan()))


class Log:
    """A root with topic ``orders`` (3 partitions) and ``audit`` (2) whose flushes share objects."""

    def __init__(self, storage):
        self.storage = storage
        self.conf = client_conf(storage, {**QUIET, "storage.flush.linger.ms": 20, "lake.publish.interval.ms": 0})
        self.admin = AdminClient(self.conf)
        for name, n in ((TOPIC, 3), (OTHER, 2)):
            self.admin.create_topics([NewTopic(name, n)])[name].result()
        self.producer = Producer({**self.conf, "enable.idempotence": True})
        self.txn = Producer({**self.conf, "transactional.id": "tables-txn"})
        self.txn.init_transactions(30)
        self.n = 0

    def produce(self, producer, count: int) -> None:
        """``count`` records to each partition of both topics (one flush: shared objects)."""
        for i in range(count):
            self.n += 1
            key = None if self.n % 5 == 0 else f"k{self.n % 7}".encode()
            value = None if self.n % 11 == 3 else f"v{self.n}".encode()
            headers = [("h", f"{self.n}".encode()), ("empty", None)] if self.n % 4 == 0 else None
            for p in range(3):
                producer.produce(TOPIC, value=value, key=key, partition=p, headers=headers)
            producer.produce(OTHER, value=b"other", key=key, partition=self.n % 2)
        producer.flush(30)

    def close(self):
        self.producer.close()
        self.txn.close()
        self.admin.close()


def check(log: Log, publisher: TablePublisher, expect_version: int | None, changed: bool = True):
    """Publish ``orders`` and check the table against the Consumer, its version and freshness."""
    catalog = fresh_catalog(log.storage)
    state = catalog.state
    result = publisher.publish(state, TOPIC)
    assert result.committed is changed
    if expect_version is not None:
        assert result.version == expect_version
    expected = consumer_rows(log.conf, TOPIC, 3)
    assert delta_rs_rows(result.uri, log.storage.options) == expected
    # freshness: the newest version's txn per partition is the LSO, commitInfo names the catalog version
    snap = TablePublisher(log.storage.object_store()).snapshot(TOPIC)  # a fresh reader of the log
    t = state.topics[TOPIC]
    lso = {p.partition: p.last_stable_offset for p in t.partitions}
    assert {txn_app_id(t.topic_id, p): o for p, o in lso.items()} == snap.txns
    if changed:
        params = snap.commit_info["operationParameters"]
        assert int(params["catalogVersion"]) == state.version
        assert json.loads(params["lastStableOffsets"]) == {str(p): o for p, o in lso.items()}
    return result, expected


def test_table_follows_the_committed_view_through_a_logs_life(storage):
    if storage.backend == "memory":
        pytest.skip("delta-rs cannot open memory:// (another process's address space)")
    log = Log(storage)
    publisher = TablePublisher(storage.object_store())
    try:
        log.produce(log.producer, 4)                             # idempotent records, objects shared with audit
        _, rows = check(log, publisher, 0)
        assert len(rows) == 12
        check(log, publisher, 0, changed=False)                  # nothing new: no commit

        log.txn.begin_transaction()                              # a committed transaction
        log.produce(log.txn, 2)
        log.txn.commit_transaction(30)
        check(log, publisher, 1)

        log.txn.begin_transaction()                              # an aborted one
        log.produce(log.txn, 3)
        log.txn.abort_transaction(30)
        _, rows = check(log, publisher, 2)
        assert len(rows) == 18

        log.txn.begin_transaction()                              # an open one: the LSO stops at it
        log.produce(log.txn, 2)
        log.produce(log.producer, 1)                             # past the LSO: hidden
        _, rows = check(log, publisher, 2, changed=False)        # the LSO did not move: nothing to publish
        assert len(rows) == 18
        log.txn.commit_transaction(30)                           # now both show
        _, rows = check(log, publisher, 3)
        assert len(rows) == 27

        summary = compact(writer_broker(storage))
        assert summary.merges > 0
        result, rows = check(log, publisher, 4)                  # the swaps: removes and adds in one version
        assert result.removed > 0 and result.added > 0 and len(rows) == 27

        tp = TopicPartition(TOPIC, 0, rows[3][1])                # DeleteRecords below the 4th record of p0
        log.admin.delete_records([tp])[tp].result()
        _, rows = check(log, publisher, 5)
        assert len(rows) == 24 and min(r[1] for r in rows if r[0] == 0) == tp.offset
    finally:
        log.close()


def test_deletion_vector_encoding_is_delta_conformant():
    from pyroaring import BitMap64

    rows = BitMap64([3, 4, 7, 11, 18, 29, 2**32 + 5])
    dv = dl.serialize_dv(rows)
    assert dv[:4] == (1681511377).to_bytes(4, "little")
    assert dl.deserialize_dv(dl.z85_decode(dl.z85_encode(dv), len(dv))) == rows
    body, offsets = dl.dv_file([dv, dv])
    assert body[0] == 1 and offsets == [1, 1 + 4 + len(dv) + 4]
    assert dl.dv_from_file(body, offsets[1], len(dv), "x") == dv
