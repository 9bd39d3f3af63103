"""No request can take ``txlake serve`` down (issue 16): fuzzed frames against a live server.

Valid requests of many APIs are encoded with kafka-python's protocol classes, then
mutated by hypothesis (bytes flipped, cut, extended, the header's API key and version
changed) and sent on fresh connections. After each, the server must still answer a
Metadata request, and at the end a real client must still produce and consume exactly.
"""

from __future__ import annotations

import socket
import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import CreateTopicsRequest, DeleteRecordsRequest, DescribeConfigsRequest
from kafka.protocol.consumer import (FetchRequest, JoinGroupRequest, ListOffsetsRequest, OffsetCommitRequest,
                                     OffsetFetchRequest)
from kafka.protocol.metadata import FindCoordinatorRequest, MetadataRequest
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

from test_server_log import consume_confluent, create_topic, produce_confluent

TS = 1_700_000_000_000


def _records() -> bytes:
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i in range(3):
        builder.append(timestamp=TS + i, key=b"k%d" % i, value=b"v%d" % i, headers=[("h", b"x")])
    builder.close()
    return bytes(builder.buffer())


def _seeds() -> list[bytes]:
    """Framed valid requests (header included) of several APIs and versions."""
    requests = [
        (MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name="f", topic_id=None)],
                             allow_auto_topic_creation=False, include_topic_authorized_operations=False), 12),
        (ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=5000, topic_data=[
            ProduceRequest.TopicProduceData(name="f", partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=_records())])]), 9),
        (ProduceRequest[7](transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
            ProduceRequest.TopicProduceData(name="f", partition_data=[
                ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=_records())])]), 7),
        (FetchRequest[12](replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=1,
                          session_id=0, session_epoch=-1, topics=[FetchRequest.FetchTopic(topic="f", partitions=[
                              FetchRequest.FetchTopic.FetchPartition(partition=0, current_leader_epoch=-1,
                                                                     fetch_offset=0, last_fetched_epoch=-1,
                                                                     log_start_offset=-1,
                                                                     partition_max_bytes=1 << 20)])],
                          forgotten_topics_data=[], rack_id=""), 12),
        (ListOffsetsRequest[7](replica_id=-1, isolation_level=0, topics=[ListOffsetsRequest.ListOffsetsTopic(
            name="f", partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=-1)])]), 7),
        (InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=60000, producer_id=-1,
                                  producer_epoch=-1), 4),
        (FindCoordinatorRequest[3](key="g", key_type=0), 3),
        (JoinGroupRequest[7](group_id="g", session_timeout_ms=6000, rebalance_timeout_ms=6000, member_id="",
                             group_instance_id=None, protocol_type="consumer", protocols=[
                                 JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"\x00\x01")]), 7),
        (OffsetCommitRequest[8](group_id="g", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                                topics=[OffsetCommitRequest.OffsetCommitRequestTopic(name="f", partitions=[
                                    OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                        partition_index=0, committed_offset=1, committed_leader_epoch=-1,
                                        committed_metadata="")])]), 8),
        (OffsetFetchRequest[7](group_id="g", topics=None, require_stable=True), 7),
        (CreateTopicsRequest[5](topics=[CreateTopicsRequest.CreatableTopic(
            name="fz", num_partitions=1, replication_factor=1, assignments=[], configs=[])],
            timeout_ms=5000, validate_only=True), 5),
        (DescribeConfigsRequest[4](resources=[DescribeConfigsRequest.DescribeConfigsResource(
            resource_type=2, resource_name="f", configuration_keys=None)], include_synonyms=True,
            include_documentation=True), 4),
        (DeleteRecordsRequest[2](topics=[DeleteRecordsRequest.DeleteRecordsTopic(name="f", partitions=[
            DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition(partition_index=0, offset=0)])],
            timeout_ms=5000), 2),
    ]
    out = []
    for request, version in requests:
        request.with_header(correlation_id=5, client_id="fuzz")
        out.append(bytes(request.encode(version=version, header=True, framed=True)))
    return out


SEEDS = _seeds()


@st.composite
def mutated(draw) -> bytes:
    frame = bytearray(draw(st.sampled_from(SEEDS)))
    body = frame[4:]
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["flip", "cut", "extend", "key", "version", "count"]))
        if kind == "flip" and body:
            i = draw(st.integers(0, len(body) - 1))
            body[i] = draw(st.integers(0, 255))
        elif kind == "cut" and len(body) > 1:
            body = body[:draw(st.integers(0, len(body) - 1))]
        elif kind == "extend":
            body += draw(st.binary(min_size=1, max_size=64))
        elif kind == "key" and len(body) >= 2:
            body[0:2] = struct.pack(">h", draw(st.integers(-5, 80)))
        elif kind == "version" and len(body) >= 4:
            body[2:4] = struct.pack(">h", draw(st.integers(-3, 40)))
        elif kind == "count" and len(body) > 16:
            i = draw(st.integers(8, len(body) - 4))
            body[i:i + 4] = struct.pack(">i", draw(st.sampled_from([-2, -1, 0x7FFFFFFF, 1 << 20, 65535])))
    # the frame length stays what the body is (a lying length is covered by test_server_cluster)
    return struct.pack(">i", len(body)) + bytes(body)


def _send(port: int, frame: bytes) -> None:
    """Send one frame and wait for one response frame or the server closing (either is fine:
    the server must stay up)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(frame)
        sock.settimeout(5)
        data = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                data += chunk
                if len(data) >= 4 and len(data) >= 4 + struct.unpack(">i", data[:4])[0]:
                    return
        except (socket.timeout, ConnectionError):
            return


def _alive(port: int) -> bool:
    request = MetadataRequest[1](topics=[])
    request.with_header(correlation_id=1, client_id="alive")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(20)
        sock.sendall(request.encode(version=1, header=True, framed=True))
        head = sock.recv(4)
        return len(head) == 4 and struct.unpack(">i", head)[0] > 0


def test_fuzzed_requests_never_take_the_server_down(serve_root):
    create_topic(serve_root.storage, "f", 1)
    served = serve_root.start()

    @settings(max_examples=300, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(mutated())
    def one(frame: bytes) -> None:
        _send(served.port, frame)
        assert served.proc.poll() is None, f"txlake serve exited; log:\n{served.log_text()[-3000:]}"
        assert _alive(served.port)

    one()
    log = served.log_text()
    assert "Unhandled exception" not in log and "Task exception was never retrieved" not in log, log[-3000:]
    reports = produce_confluent(served.bootstrap, [("f", 0, b"a", b"after", None, TS)])
    assert reports[0][0] is None
    got = consume_confluent(served.bootstrap, [("f", 0, reports[0][3])], 1)
    assert [(k, v) for _, _, _, k, v, _, _ in got] == [(b"a", b"after")]
