"""``txlake serve``: the topic and admin APIs (issue 16) -- CreateTopics, DeleteTopics,
CreatePartitions, DescribeConfigs, IncrementalAlterConfigs, DeleteRecords, DescribeProducers.

Real clients against the server subprocess (``served``: file:// and S3): confluent-kafka's
``AdminClient`` (librdkafka) and kafka-python's ``KafkaAdminClient``, raw requests for what
neither client sends, and the readers beside the server (``txlake topics describe`` in its own
process, DuckDB) on the same root.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   NewPartitions, NewTopic, ResourceType)
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import (CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
                                  CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
                                  IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse)

from txlake.catalog.topic_config import TOPIC_CONFIGS

TIMEOUT = 15


def _admin(served) -> AdminClient:
    return AdminClient({"bootstrap.servers": served.bootstrap})


def _error(future) -> tuple[int, str]:
    """The (Kafka error code, message) a confluent-kafka future fails with."""
    with pytest.raises(KafkaException) as failed:
        future.result(TIMEOUT)
    err = failed.value.args[0]
    return err.code(), err.str()


def _kafka_python(served) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=served.bootstrap, request_timeout_ms=TIMEOUT * 1000)


def _roundtrip(port: int, request, version: int, response_cls):
    """Send one request at ``version`` on a fresh connection; the decoded response."""
    request.with_header(correlation_id=11, client_id="raw-test")
    data = request.encode(version=version, header=True, framed=True)
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(data)
        (size,) = struct.unpack(">i", _recv(sock, 4))
        frame = _recv(sock, size)
    assert struct.unpack(">i", frame[:4]) == (11,)
    header = 5 if response_cls.flexible_version_q(version) else 4  # v1 header: tagged fields after the id
    return response_cls.decode(frame[header:], version=version)


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def _cli(served, *args: str) -> subprocess.CompletedProcess:
    """A ``txlake`` command in its own process on the served root (a reader beside the server)."""
    env = dict(os.environ, TXLAKE_STORAGE_OPTIONS=json.dumps(served.storage.options), COLUMNS="250")
    return subprocess.run([sys.executable, "-m", "txlake.cli", *args, "--storage", served.storage.url],
                          capture_output=True, text=True, env=env, timeout=120)


def _describe_topics_cli(served) -> str:
    done = _cli(served, "topics", "describe")
    assert done.returncode == 0, done.stderr
    return done.stdout


# ---------------------------------------------------------------------------- CreateTopics

def test_create_topics_with_confluent_kafka_and_readers_beside_the_server_see_them(served):
    admin = _admin(served)
    done = admin.create_topics([NewTopic("orders", 3, 1, config={"retention.ms": "3600000", "cleanup.policy": "compact"}),
                                NewTopic("events", -1, -1)])
    for future in done.values():
        assert future.result(TIMEOUT) is None
    md = admin.list_topics(timeout=TIMEOUT)
    assert {name: sorted(t.partitions) for name, t in md.topics.items()} == {"orders": [0, 1, 2], "events": [0]}
    # validate_only creates nothing
    dry = admin.create_topics([NewTopic("dry", 2, 1)], validate_only=True)
    assert dry["dry"].result(TIMEOUT) is None
    assert "dry" not in admin.list_topics(timeout=TIMEOUT).topics
    # readers beside the server: the CLI in its own process, and DuckDB
    out = _describe_topics_cli(served)
    assert "Topic: orders" in out and "PartitionCount: 3" in out
    assert "Configs: cleanup.policy=compact,retention.ms=3600000" in out
    assert "Topic: events" in out and "dry" not in out
    from txlake.duckdb import connect
    from txlake.engine.registry import close_all

    try:
        con = connect(served.storage.url, served.storage.options)
        assert con.execute("SELECT count(*) FROM orders").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM events").fetchone() == (0,)
    finally:
        close_all()


def test_create_topics_errors_are_kafkas(served):
    admin = _admin(served)
    for future in admin.create_topics([NewTopic("orders", 1, 1), NewTopic("a.b", 1, 1)]).values():
        assert future.result(TIMEOUT) is None
    done = admin.create_topics([
        NewTopic("orders", 1, 1),
        NewTopic("bad name", 1, 1),
        NewTopic("a_b", 1, 1),
        NewTopic("cfg", 1, 1, config={"retention.ms": "soon"}),
        NewTopic("unknown-cfg", 1, 1, config={"retention.minutes": "5"}),
        NewTopic("rf3", 1, 3),
        NewTopic("__consumer_offsets", 1, 1),
    ])
    assert _error(done["orders"]) == (36, "Topic 'orders' already exists.")  # TOPIC_ALREADY_EXISTS
    assert _error(done["bad name"]) == (  # INVALID_TOPIC_EXCEPTION
        17, "Topic name \"bad name\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'")
    assert _error(done["a_b"]) == (17, "Topic 'a_b' collides with existing topic: a.b")
    assert _error(done["cfg"]) == (  # INVALID_CONFIG
        40, "Invalid value soon for configuration retention.ms: Not a number of type LONG")
    assert _error(done["unknown-cfg"]) == (40, "Unknown topic config name: retention.minutes")
    assert _error(done["rf3"]) == (  # INVALID_REPLICATION_FACTOR
        38, "Unable to replicate the partition 3 time(s): The target replication factor of 3 cannot be reached "
            "because only 1 broker(s) are registered.")
    assert _error(done["__consumer_offsets"]) == (  # INVALID_REQUEST
        42, "Creation of internal topic __consumer_offsets is prohibited.")
    assert sorted(admin.list_topics(timeout=TIMEOUT).topics) == ["a.b", "orders"]
    # the same answers to validate_only
    again = admin.create_topics([NewTopic("orders", 1, 1), NewTopic("rf3", 1, 3)], validate_only=True)
    assert _error(again["orders"])[0] == 36
    assert _error(again["rf3"])[0] == 38


def test_create_topics_v7_answers_the_topic_layout_configs_and_id_with_kafka_python(served):
    client = _kafka_python(served)
    try:
        answer = client.create_topics({"orders": {"num_partitions": 2, "replication_factor": 1,
                                                   "configs": {"cleanup.policy": "compact"}}})
        (topic,) = answer["topics"]
        assert (topic["name"], topic["error_code"], topic["error_message"]) == ("orders", 0, None)
        assert (topic["num_partitions"], topic["replication_factor"]) == (2, 1)
        configs = topic["configs"]
        assert sorted(configs) == sorted(TOPIC_CONFIGS)
        assert configs["cleanup.policy"]["value"] == "compact"
        assert configs["cleanup.policy"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"  # 1
        assert configs["retention.ms"]["value"] == "604800000"
        assert configs["retention.ms"]["config_source"] == "DEFAULT_CONFIG"  # 5
        (described,) = client.describe_topics(["orders"])
        assert uuid.UUID(str(described["topic_id"])) == uuid.UUID(str(topic["topic_id"]))
        # errors with kafka-python: code and message
        failed = client.create_topics({"orders": {"num_partitions": 1, "replication_factor": 1},
                                       "zero": {"num_partitions": 0, "replication_factor": 1},
                                       "rf0": {"num_partitions": 1, "replication_factor": 0}},
                                      raise_errors=False)
        by_name = {t["name"]: (t["error_code"], t["error_message"]) for t in failed["topics"]}
        assert by_name == {
            "orders": (36, "Topic 'orders' already exists."),
            "zero": (37, "Number of partitions was set to an invalid non-positive value."),
            "rf0": (38, "Replication factor must be larger than 0, or -1 to use the default value."),
        }
    finally:
        client.close()


def test_create_topics_raw_duplicates_null_configs_and_manual_assignments(served):
    T = CreateTopicsRequest.CreatableTopic
    A = T.CreatableReplicaAssignment
    C = T.CreatableTopicConfig
    request = CreateTopicsRequest(topics=[
        T(name="dup", num_partitions=1, replication_factor=1, assignments=[], configs=[]),
        T(name="dup", num_partitions=1, replication_factor=1, assignments=[], configs=[]),
        T(name="nulls", num_partitions=1, replication_factor=1, assignments=[],
          configs=[C(name="retention.ms", value=None)]),
        T(name="manual", num_partitions=-1, replication_factor=-1, assignments=[
            A(partition_index=0, broker_ids=[1]), A(partition_index=1, broker_ids=[1])], configs=[]),
        T(name="elsewhere", num_partitions=-1, replication_factor=-1,
          assignments=[A(partition_index=0, broker_ids=[2])], configs=[]),
        T(name="gap", num_partitions=-1, replication_factor=-1,
          assignments=[A(partition_index=1, broker_ids=[1])], configs=[]),
        T(name="mixed", num_partitions=2, replication_factor=-1,
          assignments=[A(partition_index=0, broker_ids=[1])], configs=[]),
    ], timeout_ms=10_000, validate_only=False)
    answer = _roundtrip(served.port, request, 4, CreateTopicsResponse)  # librdkafka's version
    assert [(t.name, t.error_code, t.error_message) for t in answer.topics] == [
        ("nulls", 40, "Null value not supported for topic configs: retention.ms"),
        ("manual", 0, None),
        ("elsewhere", 39, "The manual partition assignment includes broker 2, but no such broker is registered."),
        ("gap", 39, "partitions should be a consecutive 0-based integer sequence"),
        ("mixed", 42, "A manual partition assignment was specified, but numPartitions was not set to -1."),
        ("dup", 42, "Duplicate topic name."),
    ]
    md = _admin(served).list_topics(timeout=TIMEOUT)
    assert {name: len(t.partitions) for name, t in md.topics.items()} == {"manual": 2}


# ---------------------------------------------------------------------------- DeleteTopics

def test_delete_topics_with_confluent_kafka(served):
    admin = _admin(served)
    for future in admin.create_topics([NewTopic("a", 1, 1), NewTopic("b", 2, 1)]).values():
        future.result(TIMEOUT)
    done = admin.delete_topics(["a", "missing", "__transaction_state"], operation_timeout=10)
    assert done["a"].result(TIMEOUT) is None
    # librdkafka asks DeleteTopics v4, which carries no message: it names the code itself
    assert _error(done["missing"]) == (3, "Broker: Unknown topic or partition")  # UNKNOWN_TOPIC_OR_PARTITION
    assert _error(done["__transaction_state"]) == (17, "Broker: Invalid topic")  # INVALID_TOPIC_EXCEPTION
    assert sorted(admin.list_topics(timeout=TIMEOUT).topics) == ["b"]
    out = _describe_topics_cli(served)
    assert "Topic: b" in out and "Topic: a\t" not in out


def test_delete_topics_by_name_and_by_topic_id_with_kafka_python(served):
    client = _kafka_python(served)
    try:
        created = client.create_topics({"x": {"num_partitions": 1, "replication_factor": 1},
                                        "y": {"num_partitions": 1, "replication_factor": 1}})
        ids = {t["name"]: uuid.UUID(str(t["topic_id"])) for t in created["topics"]}
        gone = client.delete_topics([ids["x"], "y"])
        assert sorted((t["name"], uuid.UUID(str(t["topic_id"])), t["error_code"], t["error_message"])
                      for t in gone["topics"]) == [("x", ids["x"], 0, None), ("y", ids["y"], 0, None)]
        unknown = uuid.uuid4()
        failed = client.delete_topics([unknown, "y"], raise_errors=False)
        assert sorted(((t["name"] or ""), t["error_code"], t["error_message"]) for t in failed["topics"]) == [
            ("", 100, "This server does not host this topic ID."),
            ("y", 3, "This server does not host this topic-partition."),
        ]
        assert client.list_topics() == []
    finally:
        client.close()


def test_delete_topics_raw_v6_request_checks(served):
    admin = _admin(served)
    admin.create_topics([NewTopic("t", 1, 1)])["t"].result(TIMEOUT)
    topic_id = uuid.UUID(str(_kafka_python_topic_id(served, "t")))
    S = DeleteTopicsRequest.DeleteTopicState
    answer = _roundtrip(served.port, DeleteTopicsRequest(topics=[
        S(name="t", topic_id=topic_id), S(name=None, topic_id=None), S(name="d", topic_id=None),
        S(name="d", topic_id=None)], timeout_ms=5000), 6, DeleteTopicsResponse)
    assert sorted((r.name or "", r.error_code, r.error_message) for r in answer.responses) == [
        ("", 42, "Neither topic name nor id were specified."),
        ("d", 42, "Duplicate topic name."),
        ("t", 42, "You may not specify both topic name and topic id."),
    ]
    # a name and the id it maps to, in one request
    answer = _roundtrip(served.port, DeleteTopicsRequest(topics=[S(name=None, topic_id=topic_id), S(name="t", topic_id=None)],
                                                         timeout_ms=5000), 6, DeleteTopicsResponse)
    assert [(r.name, r.error_code, r.error_message) for r in answer.responses] == [
        ("t", 42, "The provided topic name maps to an ID that was already supplied.")]
    assert "t" in admin.list_topics(timeout=TIMEOUT).topics


def _kafka_python_topic_id(served, name: str):
    client = _kafka_python(served)
    try:
        (described,) = client.describe_topics([name])
        return described["topic_id"]
    finally:
        client.close()
