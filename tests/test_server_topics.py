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
                                  DescribeConfigsRequest, DescribeConfigsResponse,
                                  IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse)

from server_support import decode_response, roundtrip
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
    frame = roundtrip(port, request, version, correlation_id=11, timeout_s=TIMEOUT)
    assert struct.unpack(">i", frame[:4]) == (11,)
    return decode_response(response_cls, frame, version)


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
        17, "Topic name is invalid: 'bad name' contains one or more characters other than ASCII alphanumerics, '.', "
            "'_' and '-'")
    assert _error(done["a_b"]) == (17, "Topic 'a_b' collides with existing topic: a.b")
    assert _error(done["cfg"]) == (  # INVALID_CONFIG
        40, "Invalid value soon for configuration retention.ms: Not a number of type LONG")
    assert _error(done["unknown-cfg"]) == (40, "Unknown topic config name: retention.minutes")
    assert _error(done["rf3"]) == (  # INVALID_REPLICATION_FACTOR
        38, "Unable to replicate the partition 3 time(s): The target replication factor of 3 cannot be reached "
            "because only 1 broker(s) are registered or some brokers have all their log directories cordoned.")
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


def _write_records(served, topic: str, counts: dict[int, int]) -> None:
    """Produce ``counts[partition]`` records to each partition of ``topic`` through the server
    with an idempotent confluent-kafka producer (values ``p<partition>-<i>``)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": served.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for partition, n in counts.items():
        for i in range(n):
            producer.produce(topic, value=f"p{partition}-{i}".encode(), key=f"k{i}".encode(), partition=partition)
    assert producer.flush(30) == 0


def _committed_rows(served, topic: str) -> list[tuple[int, int, bytes]]:
    """``(partition, offset, value)`` of the committed records DuckDB sees on the served root."""
    from txlake.duckdb import connect
    from txlake.engine.registry import close_all

    try:
        con = connect(served.storage.url, served.storage.options)
        return con.execute(f'SELECT "partition", "offset", value FROM "{topic}" ORDER BY 1, 2').fetchall()
    finally:
        close_all()


# ---------------------------------------------------------------------------- CreatePartitions

def test_create_partitions_with_confluent_kafka_grows_the_topic_for_writers_and_readers(served):
    admin = _admin(served)
    admin.create_topics([NewTopic("grow", 1, 1)])["grow"].result(TIMEOUT)
    dry = admin.create_partitions([NewPartitions("grow", 5)], validate_only=True)
    assert dry["grow"].result(TIMEOUT) is None
    assert len(admin.list_topics(timeout=TIMEOUT).topics["grow"].partitions) == 1
    done = admin.create_partitions([NewPartitions("grow", 3), NewPartitions("missing", 2)])
    assert done["grow"].result(TIMEOUT) is None
    assert _error(done["missing"]) == (3, "Broker: Unknown topic or partition")  # Kafka sends no message
    assert sorted(admin.list_topics(timeout=TIMEOUT).topics["grow"].partitions) == [0, 1, 2]
    same = admin.create_partitions([NewPartitions("grow", 3)])
    assert _error(same["grow"]) == (37, "Topic already has 3 partition(s).")  # INVALID_PARTITIONS
    fewer = admin.create_partitions([NewPartitions("grow", 2)])
    assert _error(fewer["grow"]) == (37, "The topic grow currently has 3 partition(s); 2 would not be an increase.")
    elsewhere = admin.create_partitions([NewPartitions("grow", 4, replica_assignment=[[2]])])
    assert _error(elsewhere["grow"]) == (  # INVALID_REPLICA_ASSIGNMENT
        39, "The manual partition assignment includes broker 2, but no such broker is registered.")
    out = _describe_topics_cli(served)
    assert "Topic: grow" in out and "PartitionCount: 3" in out
    # the new partitions take records at once (the writer's partition state exists) and readers see them
    _write_records(served, "grow", {0: 1, 2: 2})
    assert _committed_rows(served, "grow") == [(0, 0, b"p0-0"), (2, 0, b"p2-0"), (2, 1, b"p2-1")]
    # and after a restart of the server on the same root
    assert served.stop() == 0
    served.start()
    assert sorted(_admin(served).list_topics(timeout=TIMEOUT).topics["grow"].partitions) == [0, 1, 2]
    _write_records(served, "grow", {1: 1})
    assert _committed_rows(served, "grow") == [(0, 0, b"p0-0"), (1, 0, b"p1-0"), (2, 0, b"p2-0"), (2, 1, b"p2-1")]


def test_create_partitions_raw_duplicates_and_assignment_counts(served):
    admin = _admin(served)
    admin.create_topics([NewTopic("t", 1, 1)])["t"].result(TIMEOUT)
    T = CreatePartitionsRequest.CreatePartitionsTopic
    A = T.CreatePartitionsAssignment
    answer = _roundtrip(served.port, CreatePartitionsRequest(topics=[
        T(name="t", count=3, assignments=[A(broker_ids=[1])]), T(name="d", count=2, assignments=None),
        T(name="d", count=2, assignments=None)], timeout_ms=5000, validate_only=False), 3, CreatePartitionsResponse)
    assert [(r.name, r.error_code, r.error_message) for r in answer.results] == [
        ("t", 39, "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified."),
        ("d", 42, "Duplicate topic name."),
    ]
    answer = _roundtrip(served.port, CreatePartitionsRequest(topics=[
        T(name="t", count=3, assignments=[A(broker_ids=[1]), A(broker_ids=[1])])], timeout_ms=5000,
        validate_only=False), 3, CreatePartitionsResponse)
    assert [(r.name, r.error_code, r.error_message) for r in answer.results] == [("t", 0, None)]


# ---------------------------------------------------------------------------- DescribeConfigs

def test_describe_configs_of_topics_and_this_broker_with_confluent_kafka(served):
    admin = _admin(served)
    admin.create_topics([NewTopic("t", 1, 1, config={"retention.ms": "3600000"})])["t"].result(TIMEOUT)
    topic, broker, missing = (ConfigResource(ResourceType.TOPIC, "t"), ConfigResource(ResourceType.BROKER, "1"),
                              ConfigResource(ResourceType.TOPIC, "nope"))
    done = admin.describe_configs([topic, broker, missing], request_timeout=TIMEOUT)
    entries = done[topic].result(TIMEOUT)
    assert sorted(entries) == sorted(TOPIC_CONFIGS)
    retention = entries["retention.ms"]
    assert (retention.value, retention.source, retention.is_default, retention.is_read_only) == (
        "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value, False, False)
    segment = entries["segment.bytes"]
    assert (segment.value, segment.source, segment.is_default) == ("1073741824", ConfigSource.DEFAULT_CONFIG.value, True)
    node = done[broker].result(TIMEOUT)
    assert node["num.partitions"].value == "1" and node["num.partitions"].is_read_only
    assert node["advertised.listeners"].value == f"PLAINTEXT://127.0.0.1:{served.port}"
    assert node["log.segment.bytes"].value == "1073741824"
    assert all(e.is_read_only for e in node.values())
    assert _error(done[missing]) == (3, "Broker: Unknown topic or partition")


def test_describe_configs_raw_resource_checks(served):
    R = DescribeConfigsRequest.DescribeConfigsResource
    answer = _roundtrip(served.port, DescribeConfigsRequest(resources=[
        R(resource_type=4, resource_name="2", configuration_keys=None),
        R(resource_type=4, resource_name="b", configuration_keys=None),
        R(resource_type=4, resource_name="", configuration_keys=None),
        R(resource_type=4, resource_name="1", configuration_keys=["num.partitions", "nope"]),
        R(resource_type=2, resource_name="bad name", configuration_keys=None),
        R(resource_type=8, resource_name="1", configuration_keys=None),
    ], include_synonyms=False, include_documentation=True), 4, DescribeConfigsResponse)
    assert [(r.resource_name, r.error_code, r.error_message, [c.name for c in r.configs]) for r in answer.results] == [
        ("2", 42, "Unexpected broker id, expected 1 or empty string, but received 2", []),
        ("b", 42, "Broker id must be an integer, but it is: b", []),
        ("", 0, None, []),  # no cluster-wide dynamic defaults
        ("1", 0, None, ["num.partitions"]),
        ("bad name", 17, "Topic name is invalid: 'bad name' contains one or more characters other than ASCII "
                         "alphanumerics, '.', '_' and '-'", []),
        ("1", 42, "Unsupported resource type: BROKER_LOGGER", []),
    ]
    (entry,) = answer.results[3].configs
    assert (entry.value, entry.read_only, entry.config_source, entry.config_type) == ("1", True, 5, 3)  # DEFAULT, INT
    assert entry.documentation == "The partition count of a topic created with num_partitions -1."


def test_describe_configs_v4_with_synonyms_and_documentation_with_kafka_python(served):
    client = _kafka_python(served)
    try:
        client.create_topics({"t": {"num_partitions": 1, "replication_factor": 1,
                                    "configs": {"segment.bytes": "1048576"}}})
        from kafka.admin import ConfigResource as KConfigResource, ConfigResourceType

        answer = client.describe_configs([KConfigResource(ConfigResourceType.TOPIC, "t")], include_synonyms=True,
                                         config_filter="all")
        configs = answer["topic"]["t"]
        segment = configs["segment.bytes"]
        assert segment["value"] == "1048576" and segment["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert [(s["name"], s["value"], s["source"]) for s in segment["synonyms"]] == [
            ("segment.bytes", "1048576", "DYNAMIC_TOPIC_CONFIG"), ("log.segment.bytes", "1073741824", "DEFAULT_CONFIG")]
        assert configs["retention.ms"]["synonyms"] == []  # Kafka's log.retention.ms has no default
        modified = client.describe_configs([KConfigResource(ConfigResourceType.TOPIC, "t")])
        assert sorted(modified["topic"]["t"]) == ["segment.bytes"]
    finally:
        client.close()


# ---------------------------------------------------------------------------- IncrementalAlterConfigs

def _alter(admin, resource: ConfigResource, *entries: tuple[str, str | None, AlterConfigOpType], **kwargs):
    resource = ConfigResource(resource.restype, resource.name, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op) for name, value, op in entries])
    return admin.incremental_alter_configs([resource], **kwargs)[resource]


def test_incremental_alter_configs_with_confluent_kafka(served):
    admin = _admin(served)
    admin.create_topics([NewTopic("t", 1, 1, config={"segment.bytes": "1048576"})])["t"].result(TIMEOUT)
    topic = ConfigResource(ResourceType.TOPIC, "t")
    S, D, A, U = AlterConfigOpType.SET, AlterConfigOpType.DELETE, AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT
    assert _alter(admin, topic, ("retention.ms", "1000", S), validate_only=True).result(TIMEOUT) is None
    assert "retention.ms=1000" not in _describe_topics_cli(served)
    assert _alter(admin, topic, ("retention.ms", "1000", S), ("cleanup.policy", "compact", A),
                  ("segment.bytes", None, D)).result(TIMEOUT) is None
    entries = admin.describe_configs([topic])[topic].result(TIMEOUT)
    assert entries["retention.ms"].value == "1000" and entries["cleanup.policy"].value == "delete,compact"
    assert entries["segment.bytes"].value == "1073741824" and entries["segment.bytes"].is_default
    assert "Configs: cleanup.policy=delete,compact,retention.ms=1000" in _describe_topics_cli(served)
    assert _alter(admin, topic, ("cleanup.policy", "delete", U)).result(TIMEOUT) is None
    assert admin.describe_configs([topic])[topic].result(TIMEOUT)["cleanup.policy"].value == "compact"
    # the engine follows the new config: a compacted topic refuses DeleteRecords
    deleted = admin.delete_records([TopicPartition("t", 0, 0)])
    assert _error(deleted[TopicPartition("t", 0, 0)])[0] == 44  # POLICY_VIOLATION
    # errors: Kafka's codes and messages, nothing changed
    assert _error(_alter(admin, topic, ("retention.ms", "soon", S))) == (
        40, "Invalid value soon for configuration retention.ms: Not a number of type LONG")
    assert _error(_alter(admin, topic, ("retention.ms", "5", A))) == (
        40, "Can't APPEND to key retention.ms because its type is not LIST.")
    assert _error(_alter(admin, topic, ("retention.minutes", "5", S))) == (40, "Unknown topic config name: retention.minutes")
    assert _error(_alter(admin, ConfigResource(ResourceType.TOPIC, "nope"), ("retention.ms", "5", S))) == (
        3, "The topic 'nope' does not exist.")
    assert _error(_alter(admin, ConfigResource(ResourceType.BROKER, "1"), ("num.partitions", "3", S))) == (
        42, "Cannot update these configs dynamically: Set(num.partitions)")
    assert admin.describe_configs([topic])[topic].result(TIMEOUT)["retention.ms"].value == "1000"


def test_incremental_alter_configs_raw_request_checks(served):
    admin = _admin(served)
    admin.create_topics([NewTopic("t", 1, 1)])["t"].result(TIMEOUT)
    R = IncrementalAlterConfigsRequest.AlterConfigsResource
    C = R.AlterableConfig
    answer = _roundtrip(served.port, IncrementalAlterConfigsRequest(resources=[
        R(resource_type=2, resource_name="t", configs=[C(name="retention.ms", config_operation=0, value="1"),
                                                       C(name="retention.ms", config_operation=0, value="2")]),
        R(resource_type=2, resource_name="x", configs=[C(name="retention.ms", config_operation=0, value=None)]),
        R(resource_type=2, resource_name="y", configs=[C(name="retention.ms", config_operation=9, value="1")]),
        R(resource_type=2, resource_name="", configs=[]),
        R(resource_type=4, resource_name="b", configs=[]),
        R(resource_type=4, resource_name="7", configs=[C(name="num.partitions", config_operation=0, value="3")]),
        R(resource_type=99, resource_name="z", configs=[]),
    ], validate_only=False), 1, IncrementalAlterConfigsResponse)
    assert [(r.resource_name, r.error_code, r.error_message) for r in answer.responses] == [
        ("t", 42, "Error due to duplicate config keys"),
        ("x", 42, "Null value not supported for : retention.ms"),
        ("y", 42, "Unknown operations type 9"),
        ("", 42, "Default topic resources are not allowed."),
        ("b", 42, "Node id must be an integer, but it is: b"),
        ("7", 42, "Unexpected broker id, expected 1, but received 7"),
        ("z", 42, "Unknown resource type 99"),
    ]


# ---------------------------------------------------------------------------- DeleteRecords

def test_delete_records_with_confluent_kafka(served):
    admin = _admin(served)
    admin.create_topics([NewTopic("logs", 2, 1)])["logs"].result(TIMEOUT)
    _write_records(served, "logs", {0: 10, 1: 3})
    done = admin.delete_records([TopicPartition("logs", 0, 4), TopicPartition("logs", 1, 7),
                                 TopicPartition("nope", 0, 1)], request_timeout=TIMEOUT)
    assert done[TopicPartition("logs", 0, 4)].result(TIMEOUT).low_watermark == 4
    assert _error(done[TopicPartition("logs", 1, 7)])[0] == 1      # OFFSET_OUT_OF_RANGE: past the high watermark 3
    assert _error(done[TopicPartition("nope", 0, 1)])[0] == 3      # UNKNOWN_TOPIC_OR_PARTITION
    rows = _committed_rows(served, "logs")
    assert [(p, o) for p, o, _ in rows] == [(0, 4), (0, 5), (0, 6), (0, 7), (0, 8), (0, 9), (1, 0), (1, 1), (1, 2)]
    # -1 (OFFSET_END): the high watermark; the low watermark never moves back
    done = admin.delete_records([TopicPartition("logs", 1, -1), TopicPartition("logs", 0, 2)])
    assert done[TopicPartition("logs", 1, -1)].result(TIMEOUT).low_watermark == 3
    assert done[TopicPartition("logs", 0, 2)].result(TIMEOUT).low_watermark == 4
    assert [(p, o) for p, o, _ in _committed_rows(served, "logs")] == [(0, 4), (0, 5), (0, 6), (0, 7), (0, 8), (0, 9)]


# ---------------------------------------------------------------------------- DescribeProducers

def test_describe_producers_with_kafka_python(served):
    from kafka import TopicPartition as KTopicPartition

    admin = _admin(served)
    admin.create_topics([NewTopic("p", 2, 1)])["p"].result(TIMEOUT)
    _write_records(served, "p", {0: 5})
    client = _kafka_python(served)
    try:
        answer = client.describe_producers([KTopicPartition("p", 0), KTopicPartition("p", 1)])
        (state,) = answer[KTopicPartition("p", 0)].active_producers
        assert (state.producer_epoch, state.last_sequence, state.coordinator_epoch,
                state.current_transaction_start_offset) == (0, 4, -1, -1)
        assert state.producer_id >= 0 and state.last_timestamp > 0
        assert answer[KTopicPartition("p", 1)].active_producers == []
    finally:
        client.close()


def test_grown_partitions_and_altered_configs_survive_a_catalog_checkpoint():
    """``add_partitions`` and ``topic_config`` change the state a checkpoint rebuilds (its
    ``create_topic`` carries the partition count and the overrides), and refuse a topic id that
    is not the topic's (a stale action never lands on a re-created topic)."""
    from txlake.catalog.errors import CatalogError
    from txlake.catalog.state import ADD_PARTITIONS, CREATE_TOPIC, TOPIC_CONFIG, CatalogState

    state = CatalogState()
    state.apply({"action": CREATE_TOPIC, "topic": "t", "topic_id": "a1", "num_partitions": 1, "config": {"x": "1"}})
    held = state.topics["t"]
    state.apply({"action": ADD_PARTITIONS, "topic": "t", "topic_id": "a1", "num_partitions": 3})
    state.apply({"action": TOPIC_CONFIG, "topic": "t", "topic_id": "a1", "config": {"retention.ms": "5"}})
    assert len(held.partitions) == 1 and held.config == {"x": "1"}  # what a reader held stays whole
    rebuilt = CatalogState()
    for action in state.checkpoint_actions():
        rebuilt.apply(action)
    t = rebuilt.topics["t"]
    assert ([p.partition for p in t.partitions], t.config) == ([0, 1, 2], {"retention.ms": "5"})
    with pytest.raises(CatalogError, match="names topic t with id b2, which does not exist"):
        state.apply({"action": ADD_PARTITIONS, "topic": "t", "topic_id": "b2", "num_partitions": 4})
    with pytest.raises(CatalogError, match="would shrink t from 3 to 2 partitions"):
        state.apply({"action": ADD_PARTITIONS, "topic": "t", "topic_id": "a1", "num_partitions": 2})
