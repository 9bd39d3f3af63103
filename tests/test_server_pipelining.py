"""``txlake serve``: pipelined requests of one connection reach the engine in order.

Kafka's SocketServer mutes a connection while one of its requests is being handled, so a
client that pipelines requests (the Java producer has up to five Produce requests in flight
per connection with idempotence on, librdkafka up to five as well) sees them applied in the
order sent. An idempotent producer relies on it: batch ``n+1``'s base sequence follows batch
``n``'s last one, and a partition that saw ``n+1`` first answers OUT_OF_ORDER_SEQUENCE_NUMBER
(Kafka's ``ProducerStateManager`` check), which the Java client turns into an abortable
error in a transaction: in one 20 000-record TransactionalMessageCopier run over ``txlake
serve``, 100 of the copiers' 241 aborts came from it before the server kept the order).
"""

from __future__ import annotations

import socket

import pytest
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecordsBuilder

from conftest import StorageTarget
from server_support import ServedRoot, decode_response, read_frame, roundtrip
from test_server_log import create_topic

TS = 1_700_000_000_000
#: Produce requests written back to back on one connection before any answer is read
PIPELINED = 40
PRODUCE_VERSION = 9
INIT_PID_VERSION = 4


@pytest.fixture
def server(tmp_path):
    """``txlake serve`` on a fresh file:// root with topic ``p`` (one partition)."""
    root = ServedRoot(StorageTarget(url=f"file://{tmp_path}/root", options={}, backend="file"), tmp_path,
                      {"storage.flush.interval.ms": 20})
    create_topic(root.storage, "p", 1)
    root.start()
    yield root
    code = root.stop()
    assert code == 0, f"txlake serve exited {code}; log {root.log_path}:\n{root.log_text()[-3000:]}"


def _batch(pid: int, epoch: int, sequence: int) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 16, transactional=False,
                                   producer_id=pid, producer_epoch=epoch, base_sequence=sequence)
    builder.append(timestamp=TS, key=None, value=b"v%03d" % sequence, headers=[])
    builder.close()
    return bytes(builder.buffer())


def test_pipelined_idempotent_produce_requests_are_appended_in_the_order_sent(server):
    """:data:`PIPELINED` Produce requests of one idempotent producer (one record each, sequences
    0, 1, 2, ...) written back to back on one connection: every one answers NO_ERROR at base
    offset = its sequence, in correlation-id order (before the fix the server handed them to
    its worker threads at once and some answered OUT_OF_ORDER_SEQUENCE_NUMBER, error 45)."""
    init = decode_response(InitProducerIdResponse, roundtrip(server.port, InitProducerIdRequest[INIT_PID_VERSION](
        transactional_id=None, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1), INIT_PID_VERSION),
        INIT_PID_VERSION)
    assert init.error_code == 0
    frames = b""
    for seq in range(PIPELINED):
        request = ProduceRequest[PRODUCE_VERSION](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
            ProduceRequest.TopicProduceData(name="p", partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(
                    index=0, records=_batch(init.producer_id, init.producer_epoch, seq))])])
        request.with_header(correlation_id=1000 + seq, client_id="pipeline-test")
        frames += request.encode(version=PRODUCE_VERSION, header=True, framed=True)
    answers = []
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(frames)
        for _ in range(PIPELINED):
            frame = read_frame(sock)
            correlation_id = int.from_bytes(frame[:4], "big", signed=True)
            part = decode_response(ProduceResponse, frame, PRODUCE_VERSION).responses[0].partition_responses[0]
            answers.append((correlation_id, part.error_code, part.base_offset))
    assert answers == [(1000 + seq, 0, seq) for seq in range(PIPELINED)]
