"""The embedded clients' requests to engine/apis (txlake/local_requests.py, issue 16): records
cross in-process as objects, and everything else is the handlers' own code for wire and
in-process callers alike."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.producer import ProduceRequest

from helpers import hang_data_puts

from txlake import AdminClient, NewTopic, Producer
from txlake.engine.apis import RequestContext, local_apis
from txlake.engine.errors import Errors
from txlake.engine.registry import acquire_broker, close_all, release_broker
from txlake.engine.requests import FetchedRecords, ProduceBatch
from txlake.formats.record_batch import decode_batches
from txlake.formats.records import PAYLOAD_SCHEMA
from txlake import local_requests


@pytest.fixture
def conf(tmp_path):
    c = {"storage.url": f"file://{tmp_path}/root", "storage.flush.linger.ms": 1, "storage.flush.interval.ms": 0}
    with AdminClient(c) as admin:
        admin.create_topics([NewTopic("t", 2)])["t"].result()
    yield c
    close_all()


@pytest.fixture
def broker(conf):
    b = acquire_broker(conf["storage.url"])
    b.ensure_writer()
    yield b
    release_broker(b)


def _payload(values: list[bytes]) -> pa.Table:
    n = len(values)
    return pa.Table.from_arrays([pa.array([1_000 + i for i in range(n)], pa.int64()), pa.nulls(n, pa.binary()),
                                 pa.array(values, pa.binary()), pa.nulls(n, PAYLOAD_SCHEMA.field("headers").type)],
                                schema=PAYLOAD_SCHEMA)


def test_an_in_process_produce_carries_its_batch_and_must_name_its_partition(broker):
    assert local_requests.produce(broker, ProduceBatch("t", 1, _payload([b"a", b"b"])), 10_000).result(10).base_offset == 0
    R = ProduceRequest[local_requests.PRODUCE_VERSION]
    request = R(transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[R.TopicProduceData(
        name="t", partition_data=[R.TopicProduceData.PartitionProduceData(
            index=0, records=ProduceBatch("t", 1, _payload([b"c"])))])])
    (topic,) = local_apis(broker).call(request, 10).responses
    (part,) = topic.partition_responses
    assert (part.index, part.error_code, part.base_offset, part.error_message) == (
        0, Errors.INVALID_REQUEST, -1, "the batch for t [1] was sent as t [0]")
    assert broker.catalog.state.partition("t", 0).high_watermark == 0


def test_a_produce_not_committed_in_time_answers_request_timed_out_without_a_thread_each(broker, monkeypatch):
    """Produce requests waiting for a commit that does not come (every data PUT hangs, as a stuck
    object store would) answer REQUEST_TIMED_OUT once ``timeout_ms`` passes; they wait in one
    purgatory thread, not one thread each. The batches commit once the store recovers."""
    gate = hang_data_puts(monkeypatch, broker.store)
    threads_before = threading.active_count()
    started = time.monotonic()
    futures = [local_requests.produce(broker, ProduceBatch("t", i % 2, _payload([b"%d" % i])), 300) for i in range(20)]
    threads_waiting = threading.active_count()
    results = [f.result(10) for f in futures]
    assert time.monotonic() - started >= 0.3
    assert [(r.error, r.base_offset) for r in results] == [(Errors.REQUEST_TIMED_OUT, -1)] * 20
    assert threads_waiting - threads_before <= 2   # the purgatory (once per process) and the flusher's upload
    gate.set()
    broker.flush(10_000)
    assert [broker.catalog.state.partition("t", p).high_watermark for p in (0, 1)] == [10, 10]


def _wire_fetch(broker, isolation_level: int):
    R = FetchRequest[local_requests.FETCH_VERSION]
    request = R(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=isolation_level,
                session_id=0, session_epoch=-1, topics=[R.FetchTopic(topic="t", partitions=[
                    R.FetchTopic.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)])],
                forgotten_topics_data=[], rack_id="")
    response = local_apis(broker).handle(RequestContext(1, local_requests.FETCH_VERSION), request)
    (part,) = response.responses[0].partitions
    return part


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_an_in_process_fetch_carries_the_rows_the_wire_encodes(conf, broker, isolation):
    """The same Fetch answered to the wire (v2 batches) and in-process (FetchedRecords): the same
    offsets, records, control records, watermarks and aborted transactions; the consumer's
    filter then keeps exactly the committed records."""
    p = Producer({**conf, "transactional.id": "tx"})
    p.init_transactions(10)
    for value, commit in ((b"a", True), (b"b", False), (b"c", True)):
        p.begin_transaction()
        p.produce("t", value=value, partition=0)
        p.commit_transaction(10) if commit else p.abort_transaction(10)
    p.close()
    level = local_requests.ISOLATION_LEVELS[isolation]
    wire = _wire_fetch(broker, level)
    local, records = local_requests.fetch(broker, "t", 0, 0, isolation, 1 << 20, 1 << 20)
    assert isinstance(records, FetchedRecords) and isinstance(wire.records, (bytes, memoryview))
    fields = ("error_code", "high_watermark", "last_stable_offset", "log_start_offset")
    assert [getattr(local, f) for f in fields] == [getattr(wire, f) for f in fields] == [0, 6, 6, 0]
    assert [(a.producer_id, a.first_offset) for a in local.aborted_transactions or []] == [
        (a.producer_id, a.first_offset) for a in wire.aborted_transactions or []]
    if isolation == "read_committed":
        assert [a.first_offset for a in local.aborted_transactions] == [2]
    decoded = decode_batches(wire.records, topic="t", partition=0, client=False)
    wire_rows = [(b.base_offset + i, r["value"], b.is_control) for b in decoded for i, r in enumerate(b.records.to_pylist())]
    local_rows = list(zip(records.rows.column("offset").to_pylist(), records.rows.column("value").to_pylist(),
                          records.rows.column("is_control").to_pylist()))
    assert [(o, c) for o, _, c in local_rows] == [(o, c) for o, _, c in wire_rows] == [
        (0, False), (1, True), (2, False), (3, True), (4, False), (5, True)]
    assert [v for _, v, c in local_rows if not c] == [v for _, v, c in wire_rows if not c] == [b"a", b"b", b"c"]
    assert records.partition_leader_epoch == local_apis(broker).leader_epoch == decoded[0].partition_leader_epoch
    visible = local_requests.visible(records, local.aborted_transactions)
    expected = [b"a", b"c"] if isolation == "read_committed" else [b"a", b"b", b"c"]
    assert visible.column("value").to_pylist() == expected


def test_fetch_byte_limits_count_keys_values_and_overhead_and_end_on_a_batch_boundary():
    """_within_bytes (both the wire and in-process Fetch): each record costs its key, its value
    (null: 0) and RECORD_OVERHEAD_BYTES (20); the rows end on a batch boundary, but the whole
    first batch always goes (KIP-74). Two chunks, one sliced, as the log reader hands them over."""
    from txlake.engine.apis.log_apis import _within_bytes

    keys = [b"k", None, b"kk", b"", None, b"kkk"]
    values = [b"v" * 10, b"v" * 5, None, b"v", b"v" * 7, b"v" * 2]
    bases = [0, 0, 2, 2, 2, 5]             # batches: offsets 0-1, 2-4, 5
    table = pa.table({"key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
                      "base_offset": pa.array(bases, pa.int64())})
    rows = pa.concat_tables([table.slice(0, 3), table.slice(3)]).slice(0)
    sizes = [31, 25, 22, 21, 27, 25]       # key + value + 20
    cumulative = [31, 56, 78, 99, 126, 151]
    assert [sum(sizes[:i + 1]) for i in range(6)] == cumulative

    def cut(limit):
        out, size = _within_bytes(rows, limit)
        return out.num_rows, size

    assert cut(0) == (2, 56)          # the first batch whatever the limit
    assert cut(100) == (2, 56)        # 4 rows fit, but the 4th cuts batch 2-4: back to its start
    assert cut(126) == (5, 126)       # batch 2-4 fits whole
    assert cut(150) == (5, 126)
    assert cut(151) == (6, 151)
    assert cut(1 << 20) == (6, 151)


def test_a_fetch_reads_more_rows_while_they_all_fit_its_byte_limit(broker):
    """_read_within first reads limit // 64 rows (500 here) and reads four times more while all
    of them fit: 2,000 one-record batches of 30 bytes each (10-byte value, no key, 20 overhead)
    fill a 32,000-byte limit with exactly 1,066 records, as reading everything would."""
    results = broker.produce([ProduceBatch("t", 0, _payload([b"%010d" % i])) for i in range(2000)])
    assert [r.base_offset for r in results] == list(range(2000))
    part, records = local_requests.fetch(broker, "t", 0, 0, "read_uncommitted", 1 << 20, 32_000)
    assert (part.error_code, records.rows.num_rows, records.size_in_bytes) == (0, 1066, 31_980)
    assert records.rows.column("value").to_pylist() == [b"%010d" % i for i in range(1066)]
    part, records = local_requests.fetch(broker, "t", 0, 1066, "read_uncommitted", 1 << 20, 32_000)
    assert (records.rows.num_rows, records.rows.column("offset")[0].as_py()) == (934, 1066)
