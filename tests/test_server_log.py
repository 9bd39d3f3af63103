"""``txlake serve``: Produce, Fetch, ListOffsets and leader epochs with real Kafka clients (issue 16).

confluent-kafka (librdkafka) and kafka-python against the server subprocess, on file://
and the local S3 server; raw requests (kafka-python's protocol classes) where an exact
error code is the point. Readers beside the server (DuckDB, the catalog) must see what a
read_committed client of the server sees.
"""

from __future__ import annotations

import itertools
import time

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from kafka.protocol.consumer import FetchRequest, FetchResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

import txlake
from server_support import roundtrip as _raw
from txlake.engine.registry import close_all

TS = 1_700_000_000_000


def create_topic(storage, name: str, partitions: int, **config: str) -> None:
    """Create a topic through the embedded engine (before the server takes the lease)."""
    with txlake.AdminClient(storage.conf()) as admin:
        admin.create_topics([txlake.NewTopic(name, partitions, config=config)])[name].result()
    close_all()


def produce_confluent(bootstrap: str, records: list[tuple], **conf) -> list[tuple]:
    """Produce ``(topic, partition, key, value, headers, timestamp)`` tuples; the delivery reports
    as ``(error, topic, partition, offset, key)`` in delivery order."""
    reports: list[tuple] = []
    producer = KafkaProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, **conf})
    for topic, partition, key, value, headers, ts in records:
        producer.produce(topic, value=value, key=key, partition=partition, headers=headers, timestamp=ts,
                         on_delivery=lambda err, msg: reports.append(
                             (err, msg.topic(), msg.partition(), msg.offset(), msg.key())))
    assert producer.flush(60) == 0
    return reports


def consume_confluent(bootstrap: str, partitions: list[tuple[str, int, int]], expected: int,
                      isolation: str = "read_committed", timeout_s: float = 30.0) -> list[tuple]:
    """Assign and read until ``expected`` records: ``(topic, partition, offset, key, value, headers, ts)``."""
    consumer = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False,
                              "isolation.level": isolation})
    consumer.assign([KafkaTopicPartition(t, p, o) for t, p, o in partitions])
    out: list[tuple] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers(),
                        msg.timestamp()[1]))
        # nothing more arrives (no duplicates, no aborted records)
        extra = consumer.poll(1.0)
        assert extra is None or extra.error() is not None, (extra.partition(), extra.offset(), extra.value())
    finally:
        consumer.close()
    return sorted(out, key=lambda r: (r[0], r[1], r[2]))


def test_idempotent_produce_and_consume_with_exact_offsets_keys_headers_timestamps(serve_root):
    served = serve_root
    create_topic(served.storage, "orders", 2)
    served.start()
    records = [("orders", i % 2, b"k%d" % i, b"v%d" % i, [("h", b"%d" % i)] if i % 3 else None, TS + i)
               for i in range(40)]
    reports = produce_confluent(served.bootstrap, records)
    assert all(err is None for err, *_ in reports)
    assert sorted((p, o, k) for _, _, p, o, k in reports) == sorted(
        (i % 2, i // 2, b"k%d" % i) for i in range(40))
    got = consume_confluent(served.bootstrap, [("orders", 0, 0), ("orders", 1, 0)], 40)
    assert got == [("orders", i % 2, i // 2, b"k%d" % i, b"v%d" % i, [("h", b"%d" % i)] if i % 3 else None, TS + i)
                   for i in sorted(range(40), key=lambda i: (i % 2, i))]
    lo_hi = KafkaConsumer({"bootstrap.servers": served.bootstrap, "group.id": "w"})
    try:
        assert lo_hi.get_watermark_offsets(KafkaTopicPartition("orders", 0), timeout=10) == (0, 20)
        found = lo_hi.offsets_for_times([KafkaTopicPartition("orders", 1, TS + 11)], timeout=10)
        assert [(tp.partition, tp.offset) for tp in found] == [(1, 5)]   # record 11 is partition 1's 6th
        late = lo_hi.offsets_for_times([KafkaTopicPartition("orders", 1, TS + 1_000)], timeout=10)
        assert [tp.offset for tp in late] == [-1]  # Kafka's "no such offset": none at or after it
    finally:
        lo_hi.close()
    # a reader beside the server sees the same committed rows
    con = txlake.duckdb.connect(served.storage.url, served.storage.options)
    assert con.execute('SELECT count(*), sum("offset") FROM orders').fetchone() == (40, 2 * sum(range(20)))


def test_kafka_python_producer_and_consumer(serve_root):
    from kafka import KafkaConsumer as PyConsumer
    from kafka import KafkaProducer as PyProducer
    from kafka import TopicPartition as PyTopicPartition

    served = serve_root
    create_topic(served.storage, "events", 1)
    served.start()
    producer = PyProducer(bootstrap_servers=served.bootstrap, enable_idempotence=True, acks="all")
    offsets = [producer.send("events", key=b"k%d" % i, value=b"v%d" % i, timestamp_ms=TS + i).get(timeout=30).offset
               for i in range(5)]
    producer.close()
    assert offsets == [0, 1, 2, 3, 4]
    consumer = PyConsumer(bootstrap_servers=served.bootstrap, enable_auto_commit=False,
                          isolation_level="read_committed", consumer_timeout_ms=5000)
    tp = PyTopicPartition("events", 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    # the first 5 records (or what came before 5 s without one): no longer waits 5 s after the
    # 5th; that there is no 6th the end offset shows
    got = [(m.offset, m.key, m.value, m.timestamp) for m in itertools.islice(consumer, 5)]
    assert got == [(i, b"k%d" % i, b"v%d" % i, TS + i) for i in range(5)]
    assert consumer.end_offsets([tp]) == {tp: 5}
    consumer.close()


def test_read_committed_skips_aborted_transactions_and_markers(serve_root):
    """A root holding a committed and an aborted transaction (written in-process before the
    server starts): read_committed over the wire sees only the committed records, at their
    offsets; read_uncommitted sees the aborted ones too; neither sees the markers."""
    served = serve_root
    create_topic(served.storage, "txn", 1)
    conf = {**served.storage.conf(), "transaction.state.log.num.partitions": 1}
    producer = txlake.Producer({**conf, "transactional.id": "t"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(3):
        producer.produce("txn", value=b"c%d" % i, partition=0)
    producer.commit_transaction(30)          # offsets 0..2, COMMIT marker at 3
    producer.begin_transaction()
    for i in range(2):
        producer.produce("txn", value=b"a%d" % i, partition=0)
    producer.abort_transaction(30)           # offsets 4..5, ABORT marker at 6
    producer.begin_transaction()
    producer.produce("txn", value=b"c3", partition=0)
    producer.commit_transaction(30)          # offset 7, COMMIT marker at 8
    producer.close() if hasattr(producer, "close") else None
    close_all()
    served.start()
    committed = consume_confluent(served.bootstrap, [("txn", 0, 0)], 4, "read_committed")
    assert [(o, v) for _, _, o, _, v, _, _ in committed] == [(0, b"c0"), (1, b"c1"), (2, b"c2"), (7, b"c3")]
    everything = consume_confluent(served.bootstrap, [("txn", 0, 0)], 6, "read_uncommitted")
    assert [(o, v) for _, _, o, _, v, _, _ in everything] == [
        (0, b"c0"), (1, b"c1"), (2, b"c2"), (4, b"a0"), (5, b"a1"), (7, b"c3")]


def test_fetch_with_a_stale_or_future_leader_epoch_is_fenced_or_unknown(serve_root):
    served = serve_root
    create_topic(served.storage, "t", 1)
    served.start()  # this server's lease epoch is 2 (the embedded engine took 1)

    def fetch(epoch: int) -> int:
        request = FetchRequest[12](
            replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
            session_epoch=-1, topics=[FetchRequest.FetchTopic(topic="t", partitions=[FetchRequest.FetchTopic.FetchPartition(
                partition=0, current_leader_epoch=epoch, fetch_offset=0, last_fetched_epoch=-1, log_start_offset=-1,
                partition_max_bytes=1 << 20)])], forgotten_topics_data=[], rack_id="")
        answer = FetchResponse.decode(_raw(served.port, request, 12)[5:], version=12)
        return answer.responses[0].partitions[0].error_code

    assert fetch(2) == 0
    assert fetch(-1) == 0
    assert fetch(1) == 74   # FENCED_LEADER_EPOCH
    assert fetch(3) == 75   # UNKNOWN_LEADER_EPOCH


def test_produce_errors_corrupt_batch_and_invalid_acks(serve_root):
    served = serve_root
    create_topic(served.storage, "t", 1)
    served.start()
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    builder.append(timestamp=TS, key=b"k", value=b"v", headers=[])
    builder.close()
    good = bytes(builder.buffer())
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF  # the CRC no longer matches

    def produce(records: bytes, acks: int) -> tuple[int, int, str | None, list]:
        request = ProduceRequest[9](transactional_id=None, acks=acks, timeout_ms=30_000, topic_data=[
            ProduceRequest.TopicProduceData(name="t", partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])])
        answer = ProduceResponse.decode(_raw(served.port, request, 9)[5:], version=9)
        part = answer.responses[0].partition_responses[0]
        return part.error_code, part.base_offset, part.error_message, [e.batch_index for e in part.record_errors]

    code, base, message, batches = produce(bytes(corrupt), -1)
    assert (code, base, batches) == (2, -1, [0])  # CORRUPT_MESSAGE, batch 0 named
    assert "t [0]" in message or "t-0" in message, message
    assert produce(good, 5)[0] == 21               # INVALID_REQUIRED_ACKS
    assert produce(good, -1)[:2] == (0, 0)
    assert produce(good, 1)[:2] == (0, 1)
    close = consume_confluent(served.bootstrap, [("t", 0, 0)], 2)
    assert [(o, v) for _, _, o, _, v, _, _ in close] == [(0, b"v"), (1, b"v")]


def test_sigkill_mid_stream_then_restart_keeps_every_acknowledged_record_exactly_once(serve_root):
    served = serve_root
    served.settings["storage.lease.ms"] = 3000  # the restart waits out the dead server's lease: keep it short
    create_topic(served.storage, "s", 3)
    served.start()
    acked: list[tuple[int, int, bytes]] = []
    producer = KafkaProducer({"bootstrap.servers": served.bootstrap, "enable.idempotence": True, "linger.ms": 2,
                              "message.timeout.ms": 120_000})

    def report(err, msg):
        if err is None:
            acked.append((msg.partition(), msg.offset(), msg.value()))

    sent = 0
    while len(acked) < 300:
        producer.produce("s", value=b"r%05d" % sent, key=b"%d" % (sent % 7), on_delivery=report)
        sent += 1
        producer.poll(0.001)
    served.kill()
    for _ in range(200):
        producer.produce("s", value=b"r%05d" % sent, key=b"%d" % (sent % 7), on_delivery=report)
        sent += 1
    served.start()  # same root, same port: the lease is taken over once the dead holder's heartbeats stop
    assert producer.flush(120) == 0
    assert len(acked) == sent  # every record was acknowledged in the end (idempotent retries)
    got = consume_confluent(served.bootstrap, [("s", p, 0) for p in range(3)], sent, timeout_s=60)
    values = [v for *_, v, _, _ in got]
    assert sorted(values) == sorted(b"r%05d" % i for i in range(sent))   # each exactly once
    assert {(p, o) for p, o, _ in acked} == {(p, o) for _, p, o, *_ in got}  # at the acknowledged offsets


def test_max_message_bytes_measures_the_compressed_batch_as_kafka_does(serve_root):
    """A zstd batch of 4 MB of compressible values is well under 1 MB on the wire: Kafka checks
    max.message.bytes against the batch as sent, so it is accepted; a batch over the limit on
    the wire is MESSAGE_TOO_LARGE naming the sizes."""
    served = serve_root
    create_topic(served.storage, "big", 1, **{"max.message.bytes": "1000000"})
    served.start()
    reports = produce_confluent(served.bootstrap, [("big", 0, None, b"a" * 400_000, None, TS + i) for i in range(10)],
                                **{"compression.type": "zstd", "linger.ms": 50, "message.max.bytes": 10_000_000,
                                   "batch.size": 10_000_000})
    assert [(err, o) for err, _, _, o, _ in reports] == [(None, i) for i in range(10)]
    random_value = __import__("os").urandom(1_200_000)
    failed = produce_confluent(served.bootstrap, [("big", 0, None, random_value, None, TS)],
                               **{"compression.type": "none", "message.max.bytes": 10_000_000})
    assert [err.code() if err else None for err, *_ in failed] == [10]  # MESSAGE_TOO_LARGE


def test_zstd_in_produce_below_v7_is_unsupported_compression_type(serve_root):
    """KIP-110: a zstd batch in a Produce request older than v7 answers UNSUPPORTED_COMPRESSION_TYPE (76)."""
    import pyarrow as pa

    from txlake.formats.record_batch import encode_batches
    from txlake.formats.records import RECORD_SCHEMA

    served = serve_root
    create_topic(served.storage, "z", 1)
    served.start()
    row = {"topic": "z", "partition": 0, "offset": 0, "timestamp": TS, "timestamp_type": 0, "key": b"k",
           "value": b"v", "headers": None, "producer_id": -1, "producer_epoch": -1, "base_sequence": -1,
           "base_offset": 0, "last_offset_delta": 0, "is_transactional": False, "is_control": False,
           "control_type": None, "coordinator_epoch": None}
    records = encode_batches(pa.Table.from_pylist([row], RECORD_SCHEMA), compression="zstd")

    def produce(version: int) -> int:
        request = ProduceRequest[version](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
            ProduceRequest.TopicProduceData(name="z", partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)])])
        frame = _raw(served.port, request, version)
        body = frame[5:] if version >= 9 else frame[4:]
        return ProduceResponse.decode(body, version=version).responses[0].partition_responses[0].error_code

    assert produce(6) == 76
    assert produce(7) == 0


def test_timestamps_outside_the_topics_window_are_invalid_timestamp(serve_root):
    """KIP-937: message.timestamp.before.max.ms / after.max.ms bound CreateTime timestamps
    (INVALID_TIMESTAMP, 32); the engine checks them for every writer, the wire included."""
    served = serve_root
    create_topic(served.storage, "w", 1, **{"message.timestamp.before.max.ms": "3600000",
                                             "message.timestamp.after.max.ms": "60000"})
    served.start()
    now = int(time.time() * 1000)
    codes = []
    for value, ts in ((b"ok", now), (b"old", now - 2 * 3_600_000), (b"future", now + 600_000)):
        (report,) = produce_confluent(served.bootstrap, [("w", 0, None, value, None, ts)])
        codes.append(report[0].code() if report[0] else None)
    assert codes == [None, 32, 32]   # a batch with any such record is refused whole, as Kafka does
    assert consume_confluent(served.bootstrap, [("w", 0, 0)], 1)[0][4] == b"ok"


def test_the_in_process_consumer_and_the_cli_read_beside_the_server(serve_root):
    """A storage.url Consumer (assign, no commits) and `txlake consume` read the root while the
    server holds its lease, and see exactly what a read_committed client of the server sees."""
    import subprocess
    import sys

    served = serve_root
    create_topic(served.storage, "side", 2)
    served.start()
    produce_confluent(served.bootstrap, [("side", i % 2, b"k%d" % i, b"v%d" % i, None, TS + i) for i in range(10)])
    wire = consume_confluent(served.bootstrap, [("side", 0, 0), ("side", 1, 0)], 10)
    consumer = txlake.Consumer({**served.storage.conf(), "group.id": "side-reader", "enable.auto.commit": False})
    consumer.assign([txlake.TopicPartition("side", p, 0) for p in (0, 1)])
    local = []
    deadline = time.monotonic() + 30
    while len(local) < 10 and time.monotonic() < deadline:
        for m in consumer.consume(100, 1.0):
            assert m.error() is None, m.error()
            local.append((m.topic(), m.partition(), m.offset(), m.key(), m.value()))
    consumer.close()
    assert sorted(local) == [(t, p, o, k, v) for t, p, o, k, v, _, _ in wire]
    if served.storage.backend == "file":
        out = subprocess.run([sys.executable, "-m", "txlake.cli", "consume", "side", "--storage", served.storage.url,
                              "--from-beginning", "--max-messages", "10", "--value-only"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert sorted(line for line in out.stdout.splitlines() if line.startswith("v")) == sorted(
            "v%d" % i for i in range(10))
