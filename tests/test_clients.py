"""Producer, Consumer and AdminClient through the public API (confluent-kafka semantics)."""

import logging
import threading
import time

import pytest

from txlake import (OFFSET_BEGINNING, OFFSET_END, TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, AdminClient,
                    Consumer, KafkaError, KafkaException, NewTopic, Producer, TopicPartition)
from txlake.engine.partitioner import consistent_partition, partition_for_key
from txlake.engine.registry import close_all


@pytest.fixture
def conf(storage):
    c = {**storage.conf(), "storage.flush.linger.ms": 1}
    yield c
    close_all()


def create(conf, name, partitions=1, **config):
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(name, partitions, config=config)])[name].result()


def consume_all(conf, topic, partitions, **extra):
    c = Consumer({**conf, "auto.offset.reset": "earliest", **extra})
    c.assign([TopicPartition(topic, p) for p in range(partitions)])
    out = []
    while True:
        batch = c.consume(1000, 0.3)
        if not batch:
            break
        out.extend(batch)
    c.close()
    return out


def test_produce_consume_round_trip_with_delivery_reports(conf):
    create(conf, "orders", 3)
    p = Producer(conf)
    reports = []
    for i in range(30):
        p.produce("orders", value=f"v{i}", key=f"k{i % 7}", headers=[("h", b"1"), ("n", None)] if i == 0 else None,
                  timestamp=1_000 + i, on_delivery=lambda err, msg: reports.append((err, msg)))
    assert len(p) == 30
    assert p.flush(10) == 0 and len(p) == 0
    assert len(reports) == 30 and all(err is None for err, _ in reports)
    by_partition = {}
    for _, msg in reports:
        assert msg.partition() == consistent_partition(msg.key(), 3)   # librdkafka's default: consistent_random (CRC32)
        by_partition.setdefault(msg.partition(), []).append(msg.offset())
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))
    msgs = consume_all(conf, "orders", 3)
    assert sorted((m.key(), m.value()) for m in msgs) == sorted((f"k{i % 7}".encode(), f"v{i}".encode()) for i in range(30))
    first = next(m for m in msgs if m.value() == b"v0")
    assert first.headers() == [("h", b"1"), ("n", None)]
    assert first.timestamp() == (TIMESTAMP_CREATE_TIME, 1_000)
    assert {(m.partition(), m.offset()) for m in msgs} == {(m.partition(), m.offset()) for _, m in reports}
    p.close()


def test_known_murmur2_partitions():
    # Values from Kafka's DefaultPartitioner over 3 and 12 partitions (murmur2 of the UTF-8 key).
    assert [partition_for_key(k, 12) for k in (b"21", b"foobar", b"abc")] == [
        (-973932308 & 0x7FFFFFFF) % 12, (-790332482 & 0x7FFFFFFF) % 12, (479470107 & 0x7FFFFFFF) % 12]


def test_consumer_seek_position_watermarks_and_times(conf):
    create(conf, "t", 1)
    p = Producer(conf)
    for i in range(10):
        p.produce("t", value=b"%d" % i, partition=0, timestamp=10_000 + i * 100)
    p.flush(10)
    c = Consumer({**conf, "auto.offset.reset": "earliest", "enable.partition.eof": True})
    tp = TopicPartition("t", 0)
    c.assign([TopicPartition("t", 0, 4)])
    assert [m.offset() for m in c.consume(3, 5)] == [4, 5, 6]
    assert c.position([tp])[0].offset == 7
    c.seek(TopicPartition("t", 0, OFFSET_BEGINNING))
    assert c.poll(5).offset() == 0
    c.seek(TopicPartition("t", 0, OFFSET_END))
    eof = c.poll(2)
    assert eof.error().code() == KafkaError._PARTITION_EOF and eof.offset() == 10
    assert c.get_watermark_offsets(tp) == (0, 10)
    times = c.offsets_for_times([TopicPartition("t", 0, 10_250), TopicPartition("t", 0, 99_999)])
    assert [x.offset for x in times] == [3, -1]
    with pytest.raises(KafkaException) as exc:
        c.seek(TopicPartition("t", 1, 0))
    assert exc.value.args[0].code() == KafkaError._STATE
    c.close()


def test_consumed_records_commits_and_positions_keep_the_leader_epoch_in_process(conf):
    """KIP-320: a consumed record carries its partition's leader epoch (the writer lease's epoch,
    as the wire's batch headers say), position() reports it, and commit(message=...) and a
    commit of the positions store it with the offset; committed() returns it (issue 16: the
    in-process TopicPartition.leader_epoch is not dropped)."""
    create(conf, "t", 2)
    p = Producer(conf)
    for i in range(4):
        p.produce("t", value=b"%d" % i, partition=i % 2)
    p.flush(10)
    epoch = p._broker.lease.epoch
    assert isinstance(epoch, int) and epoch >= 1
    c = Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
    msgs = sorted(c.consume(4, 5), key=lambda m: (m.partition(), m.offset()))
    assert [(m.partition(), m.offset(), m.leader_epoch()) for m in msgs] == [(0, 0, epoch), (0, 1, epoch),
                                                                             (1, 0, epoch), (1, 1, epoch)]
    assert [(tp.offset, tp.leader_epoch) for tp in c.position([TopicPartition("t", 0), TopicPartition("t", 1)])] == [
        (2, epoch), (2, epoch)]
    c.commit(message=msgs[0], asynchronous=False)       # partition 0: offset 1, by message
    tps = [TopicPartition("t", 0), TopicPartition("t", 1)]
    assert [(tp.offset, tp.leader_epoch) for tp in c.committed(tps, 10)] == [(1, epoch), (-1001, None)]
    c.commit(asynchronous=False)                        # the positions: 2 and 2
    assert [(tp.offset, tp.leader_epoch) for tp in c.committed(tps, 10)] == [(2, epoch), (2, epoch)]
    c.close()
    # a new member starts from the committed offsets with their epochs
    c = Consumer({**conf, "group.id": "g", "enable.auto.commit": False})
    c.assign(tps)
    assert [(tp.offset, tp.leader_epoch) for tp in c.position(tps)] == [(2, epoch), (2, epoch)]
    c.close()
    p.close()


def test_auto_offset_reset(conf):
    create(conf, "t", 1)
    p = Producer(conf)
    for i in range(3):
        p.produce("t", value=b"x", partition=0)
    p.flush(10)
    latest = Consumer(conf)  # Kafka's default auto.offset.reset is latest
    latest.assign([TopicPartition("t", 0)])
    assert latest.poll(0.3) is None
    assert latest.position([TopicPartition("t", 0)])[0].offset == 3
    err = Consumer({**conf, "auto.offset.reset": "error"})
    err.assign([TopicPartition("t", 0, 99)])
    msg = err.poll(2)
    assert msg.error().code() == KafkaError._AUTO_OFFSET_RESET
    out_of_range = Consumer({**conf, "auto.offset.reset": "earliest"})
    out_of_range.assign([TopicPartition("t", 0, 99)])
    assert out_of_range.poll(2).offset() == 0
    for c in (latest, err, out_of_range):
        c.close()


def test_log_append_time_topic(conf):
    create(conf, "lat", 1, **{"message.timestamp.type": "LogAppendTime"})
    p = Producer(conf)
    got = []
    before = int(time.time() * 1000)
    p.produce("lat", value=b"x", timestamp=5, on_delivery=lambda e, m: got.append(m))
    p.flush(10)
    assert got[0].timestamp()[0] == TIMESTAMP_LOG_APPEND_TIME and got[0].timestamp()[1] >= before
    (msg,) = consume_all(conf, "lat", 1)
    assert msg.timestamp() == got[0].timestamp()


def test_producer_errors(conf):
    create(conf, "t", 2)
    p = Producer(conf)
    with pytest.raises(KafkaException) as big:
        p.produce("t", value=b"x" * 1_000_001)
    assert big.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE == 10
    with pytest.raises(KafkaException) as part:
        p.produce("t", value=b"x", partition=2)
    assert part.value.args[0].code() == KafkaError._UNKNOWN_PARTITION
    with pytest.raises(TypeError):
        p.produce("t", value=123)
    p.close()


def test_a_producer_dropped_without_close_stops_and_releases_the_root(conf, caplog):
    """confluent-kafka's dealloc (librdkafka's rd_kafka_destroy): a Producer dropped without
    close() -- a transactional one after its commit, an idempotent one with a record still
    lingering -- is collected. Its threads end, the lingering record is dropped with a warning
    naming how many, and the last release closes the root's engine (and gives its writer lease
    back). Before, their threads held them: both ran, and held the engine, until the process
    exited."""
    create(conf, "t")
    committed = Producer({**conf, "transactional.id": "dropped"})
    committed.init_transactions(30)
    committed.begin_transaction()
    committed.produce("t", value=b"committed")
    committed.commit_transaction(30)
    lingering = Producer({**conf, "linger.ms": 60_000})
    lingering.produce("t", value=b"never sent")
    threads = [committed._sender, committed._txn_thread, lingering._sender]
    broker = committed._broker
    assert lingering._broker is broker and all(t.is_alive() for t in threads)
    with caplog.at_level(logging.WARNING, logger="txlake.producer"):
        del committed, lingering
        for thread in threads:
            thread.join(5)
    assert [t.name for t in threads if t.is_alive()] == []
    assert broker._closed
    assert caplog.text.count("dropped without close() with 1 records still queued or in flight") == 1
    assert [m.value() for m in consume_all(conf, "t", 1, **{"isolation.level": "read_committed"})] == [b"committed"]


def test_oversize_for_topic_fails_delivery(conf):
    create(conf, "small", 1, **{"max.message.bytes": "200"})
    p = Producer(conf)
    got = []
    p.produce("small", value=b"x" * 500, on_delivery=lambda e, m: got.append((e, m)))
    p.flush(10)
    err, msg = got[0]
    assert err.code() == KafkaError.MSG_SIZE_TOO_LARGE and "max.message.bytes=200" in err.str()
    assert consume_all(conf, "small", 1) == []


@pytest.mark.parametrize("extra,message", [
    ({"enable.idempotence": True, "acks": 1},
     "Must set acks to all in order to use the idempotent producer. Otherwise we cannot guarantee idempotence."),
    ({"enable.idempotence": True, "retries": 0}, "Must set retries to non-zero when using the idempotent producer."),
    ({"enable.idempotence": True, "max.in.flight.requests.per.connection": 6},
     "Must set max.in.flight.requests.per.connection to at most 5 to use the idempotent producer."),
    ({"transactional.id": "x", "enable.idempotence": False}, "Cannot set a transactional.id without also enabling idempotence."),
    ({"no.such.key": 1}, 'No such configuration property: "no.such.key"'),
    ({"acks": "some"}, 'Invalid value "some" for configuration property "acks"'),
    ({"linger.ms": -1}, 'Invalid value "-1" for configuration property "linger.ms"'),
])
def test_invalid_producer_config(conf, extra, message):
    with pytest.raises(KafkaException) as exc:
        Producer({**conf, **extra})
    assert exc.value.args[0].code() == KafkaError._INVALID_ARG
    assert message in str(exc.value)


def test_implicit_idempotence_is_dropped_by_conflicting_config(conf):
    create(conf, "t", 1)
    p = Producer({**conf, "acks": 1})
    got = []
    p.produce("t", value=b"x", on_delivery=lambda e, m: got.append(m))
    p.flush(10)
    p.close()
    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("t", 0)])
    assert c.poll(5).offset() == 0
    c.close()


def test_invalid_consumer_config(conf):
    for bad in ({"isolation.level": "dirty"}, {"auto.offset.reset": "sometimes"}, {"group.idd": "x"}):
        with pytest.raises(KafkaException) as exc:
            Consumer({**conf, **bad})
        assert exc.value.args[0].code() == KafkaError._INVALID_ARG and list(bad)[0] in str(exc.value)


def test_admin_create_list_delete(conf):
    admin = AdminClient(conf)
    fs = admin.create_topics([NewTopic("a", 2), NewTopic("b", config={"cleanup.policy": "compact"}),
                              NewTopic("bad name"), NewTopic("c", 0)])
    assert fs["a"].result() is None and fs["b"].result() is None
    with pytest.raises(KafkaException) as bad:
        fs["bad name"].result()
    assert bad.value.args[0].code() == KafkaError.INVALID_TOPIC_EXCEPTION == KafkaError.TOPIC_EXCEPTION
    with pytest.raises(KafkaException) as zero:
        fs["c"].result()
    assert zero.value.args[0].name() == "INVALID_PARTITIONS"
    with pytest.raises(KafkaException) as exists:
        admin.create_topics([NewTopic("a", 1)])["a"].result()
    assert exists.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    md = admin.list_topics()
    assert sorted(md.topics) == ["a", "b"] and sorted(md.topics["a"].partitions) == [0, 1]
    assert len(md.topics["b"].partitions) == 1  # num.partitions default
    assert admin.list_topics("zzz").topics["zzz"].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert admin.delete_topics(["a"])["a"].result() is None
    with pytest.raises(KafkaException) as gone:
        admin.delete_topics(["a"])["a"].result()
    assert gone.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    assert sorted(admin.list_topics().topics) == ["b"]
    admin.close()


def test_bulk_arrow_load(conf):
    import pyarrow as pa

    create(conf, "bulk", 4)
    keys = [f"key{i % 13}" for i in range(20_000)]
    table = pa.table({"key": keys, "value": [f"value-{i}" for i in range(20_000)]})
    p = Producer(conf)
    result = p.produce_arrow("bulk", table, batch_rows=3_000)
    assert result.records == 20_000
    msgs = consume_all(conf, "bulk", 4)
    assert len(msgs) == 20_000
    assert sorted(m.value() for m in msgs) == sorted(v.encode() for v in table.column("value").to_pylist())
    assert all(m.partition() == consistent_partition(m.key(), 4) for m in msgs)   # consistent_random, the default
    per_part = {}
    for m in msgs:
        per_part.setdefault(m.partition(), []).append(m.offset())
    assert {p_: (min(o), max(o)) for p_, o in per_part.items()} == result.offsets
    p.close()


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "interleaved"])
def test_bulk_arrow_load_by_partition_column_keeps_row_order(conf, grouped):
    """A partition column grouped by partition is cut into slices, an interleaved one
    grouped by a stable sort: either way each partition gets its rows in table order, at offsets 0, 1, ..."""
    import pyarrow as pa

    create(conf, "bulk", 3)
    parts = sorted(i % 3 for i in range(9_000)) if grouped else [(i * 7) % 3 for i in range(9_000)]
    table = pa.table({"value": [f"v{i:05d}" for i in range(9_000)], "p": pa.array(parts, pa.int32())})
    with Producer(conf) as p:
        result = p.produce_arrow("bulk", table, key=None, partition="p", batch_rows=1_000)
    assert result.records == 9_000 and result.offsets == {0: (0, 2_999), 1: (0, 2_999), 2: (0, 2_999)}
    msgs = consume_all(conf, "bulk", 3)
    for part in range(3):
        got = [m.value().decode() for m in msgs if m.partition() == part]
        assert got == [f"v{i:05d}" for i in range(9_000) if parts[i] == part]
        assert [m.offset() for m in msgs if m.partition() == part] == list(range(3_000))


@pytest.mark.parametrize("with_headers", [True, False], ids=["headers", "no-headers"])
def test_split_by_partition_copies_only_the_columns_that_vary(with_headers):
    """The bulk load groups interleaved rows by partition with one take per column, except for
    columns whose rows are all equal (all null, or named uniform: the load time standing in for
    absent timestamps), which are kept as they are: every partition still gets exactly its rows,
    in table order, with their own timestamp, key, value and headers."""
    import numpy as np
    import pyarrow as pa

    from txlake.formats.records import HEADER_TYPE, PAYLOAD_SCHEMA
    from txlake.producer import _split_by_partition

    n = 1_000
    parts = np.array([(i * 7) % 3 for i in range(n)], dtype=np.int32)
    headers = ([[{"key": "h", "value": b"%d" % i}] if i % 4 == 0 else None for i in range(n)] if with_headers
               else [None] * n)
    payload = pa.table({"timestamp": pa.array(range(1_000, 1_000 + n), pa.int64()),
                        "key": [b"k%d" % i for i in range(n)], "value": [b"v%d" % i for i in range(n)],
                        "headers": pa.array(headers, HEADER_TYPE)}, schema=PAYLOAD_SCHEMA)
    got = {p: t.to_pylist() for p, t in _split_by_partition(payload, parts)}
    rows = payload.to_pylist()
    assert got == {p: [rows[i] for i in range(n) if parts[i] == p] for p in range(3)}
    # a uniform timestamp column is kept, not taken: every row still has the one time
    now = payload.set_column(0, "timestamp", pa.array(np.full(n, 5, dtype=np.int64)))
    got = {p: t.to_pylist() for p, t in _split_by_partition(now, parts, uniform=("timestamp",))}
    rows = now.to_pylist()
    assert got == {p: [rows[i] for i in range(n) if parts[i] == p] for p in range(3)}


def test_the_split_copies_rows_into_the_engine_s_bulk_pool_not_the_default_pool():
    """The rows a bulk load regroups by partition are allocated from the engine's bulk pool
    (jemalloc, else the system allocator), whatever the process's default pool: the flushers
    free them on other threads, which mimalloc, pyarrow's default, does not reuse on the
    allocating thread (each slice of a load faulted in fresh pages: issue 20, 0.64-0.70 CPU-s a
    1 M-record load against 0.45-0.51)."""
    import numpy as np
    import pyarrow as pa

    from txlake.engine.memory import bulk_memory_pool
    from txlake.formats.records import HEADER_TYPE, PAYLOAD_SCHEMA
    from txlake.producer import _split_by_partition

    pool = bulk_memory_pool()
    assert pool.backend_name in ("jemalloc", "system")
    n, value_bytes = 20_000, 500
    parts = (np.arange(n) % 4).astype(np.int32)  # interleaved: the rows are copied
    payload = pa.table({"timestamp": pa.array(np.arange(n), pa.int64()), "key": pa.nulls(n, pa.binary()),
                        "value": pa.array([bytes([i % 251]) * value_bytes for i in range(n)], pa.binary()),
                        "headers": pa.nulls(n, HEADER_TYPE)}, schema=PAYLOAD_SCHEMA)
    before = pool.bytes_allocated()
    grouped = list(_split_by_partition(payload, parts))
    held = pool.bytes_allocated() - before
    assert held >= n * value_bytes  # the values, copied once, in the bulk pool
    assert [(p, t.num_rows) for p, t in grouped] == [(p, n // 4) for p in range(4)]
    assert grouped[1][1].column("value")[0].as_py() == bytes([1]) * value_bytes
    del grouped
    assert pool.bytes_allocated() - before < n * value_bytes  # and given back with the rows


def test_kafka_error_api():
    err = KafkaError(KafkaError.CONCURRENT_TRANSACTIONS)
    assert (err.code(), err.name(), err.retriable(), err.fatal()) == (51, "CONCURRENT_TRANSACTIONS", True, False)
    assert KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER == 45 and KafkaError.DUPLICATE_SEQUENCE_NUMBER == 46
    assert KafkaError.PRODUCER_FENCED == 90 and KafkaError.TRANSACTION_ABORTABLE == 120
    assert KafkaError._INVALID_ARG == -186 and KafkaError._PARTITION_EOF == -191 and KafkaError._FENCED == -144
    assert KafkaError(KafkaError._STATE, "nope").str() == "nope"
    exc = KafkaException(KafkaError(KafkaError.INVALID_TXN_STATE, "bad", txn_requires_abort=True))
    assert exc.args[0].txn_requires_abort() and exc.args[0] == KafkaError.INVALID_TXN_STATE
