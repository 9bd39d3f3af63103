"""``txlake serve``: start-up, cluster metadata, versions and defences against bad frames (issue 16).

Real clients (confluent-kafka, kafka-python) and raw sockets against the server subprocess.
"""

from __future__ import annotations

import socket
import struct

import pytest
from confluent_kafka.admin import AdminClient
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse

from server_support import read_frame as _read_frame
from server_support import roundtrip as _roundtrip
from txlake.engine.apis.kafka_apis import cluster_id_for


def test_metadata_names_one_broker_and_the_cluster_id(served):
    md = AdminClient({"bootstrap.servers": served.bootstrap}).list_topics(timeout=10)
    assert md.cluster_id == cluster_id_for(served.storage.object_store().url)
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {1: ("127.0.0.1", served.port)}
    assert md.controller_id == 1
    assert md.topics == {}


def test_api_versions_advertises_what_is_implemented(served):
    frame = _roundtrip(served.port, ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
    (correlation_id,) = struct.unpack(">i", frame[:4])
    assert correlation_id == 7
    answer = ApiVersionsResponse.decode(frame[4:], version=3)
    assert answer.error_code == 0
    versions = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
    assert versions[18] == (0, 4)   # ApiVersions
    assert versions[3] == (0, 12)   # Metadata
    assert 58 not in versions        # Envelope: not a client API


def test_api_versions_of_an_unknown_version_answers_unsupported_version_at_v0(served):
    # KIP-511: a client newer than the broker sends ApiVersions v127; the broker answers v0 with
    # UNSUPPORTED_VERSION (35) and its own list, so the client can retry
    header = struct.pack(">hhih", 18, 127, 99, 3) + b"new" + b"\x00"
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(header) + 2) + header + b"\x00\x00")
        frame = _read_frame(sock)
    assert struct.unpack(">i", frame[:4]) == (99,)
    answer = ApiVersionsResponse.decode(frame[4:], version=0)
    assert answer.error_code == 35
    assert (18, 0, 4) in {(k.api_key, k.min_version, k.max_version) for k in answer.api_keys}


def test_metadata_of_a_missing_topic_is_unknown_topic_or_partition(served):
    request = MetadataRequest[12](topics=[MetadataRequest.MetadataRequestTopic(name="nope", topic_id=None)],
                                  allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    frame = _roundtrip(served.port, request, 12)
    answer = MetadataResponse.decode(frame[5:], version=12)  # response header v1: correlation id + tagged fields
    assert [(t.name, t.error_code) for t in answer.topics] == [("nope", 3)]


#: frames a client might send that are not requests the server can answer, and what its log
#: line names for each
BAD_FRAMES = [
    (struct.pack(">i", 200_000_000), "larger than socket.request.max.bytes=104857600"),
    (struct.pack(">i", 6) + b"\x00\x03\x00\x0c\x00\x01", "shorter than a request header"),
    (struct.pack(">i", 10) + struct.pack(">hhih", 999, 0, 1, 0), "unknown API key 999"),
    (struct.pack(">i", 13) + struct.pack(">hhih", 3, 12, 1, 0) + b"\x00\xff\xff", "cannot decode MetadataRequest v12"),
    (struct.pack(">i", 10) + struct.pack(">hhih", 3, 12, 1, 0), "MetadataRequest v12: truncated varint"),
]


def test_bad_frames_close_the_connection_with_a_log_line_and_the_server_keeps_serving(served):
    """Each bad frame, one after the other on one server: the connection is closed with nothing
    answered, the log names what was wrong, and a client's next request is answered."""
    for n, (payload, what) in enumerate(BAD_FRAMES, 1):
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(payload)
            assert sock.recv(1) == b"", what  # closed by the server, nothing answered
        md = AdminClient({"bootstrap.servers": served.bootstrap}).list_topics(timeout=10)
        assert md.cluster_id, what
        log = served.log_text()
        assert log.count("closing the connection from 127.0.0.1:") == n, log[-2000:]
        assert what in log, log[-2000:]


def test_a_second_server_on_the_same_root_is_refused_naming_the_holder(serve_root, tmp_path):
    from server_support import ServedRoot

    serve_root.settings["storage.lease.ms"] = 3000   # the second start waits out one lease, then gives up
    served = serve_root.start()
    second = ServedRoot(served.storage, tmp_path / "second")
    (tmp_path / "second").mkdir()
    with pytest.raises(AssertionError) as failed:
        second.start()
    text = str(failed.value)
    assert "waiting" in text and "is held by writer" in text and "a second writer cannot start" in text, text


def test_docs_server_page_lists_exactly_the_versions_advertised():
    """docs/server.md's table of APIs and versions is what ApiVersions advertises."""
    import re
    from pathlib import Path

    from kafka.protocol.api_key import ApiKey

    from txlake.engine.apis.kafka_apis import default_specs

    text = (Path(__file__).resolve().parent.parent / "docs" / "server.md").read_text()
    table = text.split("checked against the code by tests/test_server_cluster.py -->", 1)[1].split("\n\n", 1)[0]
    documented = {(name, int(key), int(low), int(high))
                  for name, key, low, high in re.findall(r"^\| (\w+) \| (\d+) \| (\d+)-(\d+) \|$", table, re.M)}
    advertised = {(ApiKey(s.key).name, int(s.key), s.min_version, s.max_version) for s in default_specs()}
    assert documented == advertised


def test_a_version_above_the_advertised_one_answers_unsupported_version(served):
    """Fetch v13 is in Kafka's schema but above the v12 advertised: the answer is
    UNSUPPORTED_VERSION (35) in the response's top-level error, and the connection stays usable."""
    import uuid

    from kafka.protocol.consumer import FetchRequest, FetchResponse

    request = FetchRequest[13](
        replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0, session_id=0,
        session_epoch=-1, topics=[FetchRequest.FetchTopic(topic_id=uuid.uuid4(), partitions=[
            FetchRequest.FetchTopic.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0,
                                                   last_fetched_epoch=-1, log_start_offset=-1,
                                                   partition_max_bytes=1 << 20)])],
        forgotten_topics_data=[], rack_id="")
    frame = _roundtrip(served.port, request, 13)
    answer = FetchResponse.decode(frame[5:], version=13)
    assert answer.error_code == 35
    md = AdminClient({"bootstrap.servers": served.bootstrap}).list_topics(timeout=10)
    assert md.cluster_id
