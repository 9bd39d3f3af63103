"""The in-process AdminClient sends Kafka's requests to the engine's request surface
(``engine/apis`` through ``local_apis``, issue 16) and answers as confluent-kafka's AdminClient
against ``txlake serve`` answers (tests/test_server_topics.py runs the same scenarios on the wire):
CreateTopics (replication factor, manual assignments), Metadata, CreatePartitions,
DescribeConfigs, IncrementalAlterConfigs, DescribeCluster (issue 17's missing calls).
"""

from __future__ import annotations

import pytest

import txlake.duckdb as txduck
from txlake import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, Consumer,
                    DescribeClusterResult, KafkaError, KafkaException, NewPartitions, NewTopic, Node, Producer,
                    ResourceType, TopicPartition)
from helpers import open_catalog
from txlake.admin import BrokerMetadata
from txlake.catalog.catalog import commit_key
from txlake.catalog.topic_config import TOPIC_CONFIGS
from txlake.engine.apis.kafka_apis import cluster_id_for
from txlake.engine.registry import close_all
from txlake.formats.errors import CorruptObjectError

#: Kafka's description of UNKNOWN_TOPIC_OR_PARTITION: the text where the response carries no message
UNKNOWN_TOPIC_TEXT = "This request is for a topic or partition that does not exist on this broker."
S, D, A, U = AlterConfigOpType.SET, AlterConfigOpType.DELETE, AlterConfigOpType.APPEND, AlterConfigOpType.SUBTRACT


@pytest.fixture
def admin(storage):
    client = AdminClient({**storage.conf(), "storage.flush.linger.ms": 1})
    yield client
    client.close()
    close_all()


def error_of(future) -> tuple[int, str]:
    """The (code, message) a future fails with."""
    with pytest.raises(KafkaException) as failed:
        future.result(10)
    err = failed.value.args[0]
    return err.code(), err.str()


def alter(admin, resource: ConfigResource, *entries: tuple[str, str | None, AlterConfigOpType], **kwargs):
    resource = ConfigResource(resource.restype, resource.name, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op) for name, value, op in entries])
    return admin.incremental_alter_configs([resource], **kwargs)[resource]


def test_create_topics_checks_replication_and_assignments_as_the_server(admin, storage):
    """The old in-process path ignored ``replication_factor`` and ``replica_assignment``: a topic
    asked with 3 replicas was created. Kafka (and the server) refuse it on a one-broker cluster."""
    done = admin.create_topics([
        NewTopic("r3", 1, 3), NewTopic("manual", replica_assignment=[[1], [1]]),
        NewTopic("elsewhere", replica_assignment=[[2]]), NewTopic("gap", replica_assignment=[[1], [1, 1]])])
    assert error_of(done["r3"]) == (KafkaError.INVALID_REPLICATION_FACTOR, (
        "Unable to replicate the partition 3 time(s): The target replication factor of 3 cannot be reached "
        "because only 1 broker(s) are registered or some brokers have all their log directories cordoned."))
    assert done["manual"].result() is None
    assert error_of(done["elsewhere"]) == (KafkaError.INVALID_REPLICA_ASSIGNMENT, (
        "The manual partition assignment includes broker 2, but no such broker is registered."))
    assert error_of(done["gap"]) == (KafkaError.INVALID_REPLICA_ASSIGNMENT,
                                     "The manual partition assignment includes the broker 1 more than once.")
    md = admin.list_topics()
    assert sorted(md.topics) == ["manual"]
    assert (md.cluster_id, md.controller_id, md.brokers) == (
        cluster_id_for(storage.url), 1, {1: BrokerMetadata(1, "localhost", 0)})
    assert [(p.id, p.leader, p.replicas, p.isrs, p.error) for p in md.topics["manual"].partitions.values()] == [
        (0, 1, [1], [1], None), (1, 1, [1], [1], None)]
    missing = admin.list_topics("nope").topics["nope"]
    assert (missing.partitions, missing.error.code()) == ({}, KafkaError.UNKNOWN_TOPIC_OR_PART)


def test_create_partitions_grows_the_topic_for_producers_consumers_and_duckdb(admin, storage):
    conf = {**storage.conf(), "storage.flush.linger.ms": 1}
    admin.create_topics([NewTopic("grow", 1)])["grow"].result()
    dry = admin.create_partitions([NewPartitions("grow", 5)], validate_only=True)
    assert dry["grow"].result() is None
    assert sorted(admin.list_topics("grow").topics["grow"].partitions) == [0]
    done = admin.create_partitions([NewPartitions("grow", 3), NewPartitions("missing", 2)])
    assert done["grow"].result() is None
    assert error_of(done["missing"]) == (
        KafkaError.UNKNOWN_TOPIC_OR_PART, UNKNOWN_TOPIC_TEXT)
    assert sorted(admin.list_topics("grow").topics["grow"].partitions) == [0, 1, 2]
    assert error_of(admin.create_partitions([NewPartitions("grow", 3)])["grow"]) == (
        KafkaError.INVALID_PARTITIONS, "Topic already has 3 partition(s).")
    assert error_of(admin.create_partitions([NewPartitions("grow", 2)])["grow"]) == (
        KafkaError.INVALID_PARTITIONS, "The topic grow currently has 3 partition(s); 2 would not be an increase.")
    assert error_of(admin.create_partitions([NewPartitions("grow", 4, replica_assignment=[[2]])])["grow"]) == (
        KafkaError.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes broker 2, but no such broker "
                                               "is registered.")
    with pytest.raises(TypeError):
        admin.create_partitions([NewTopic("grow", 4)])
    with pytest.raises(ValueError):
        admin.create_partitions([NewPartitions("grow", 4), NewPartitions("grow", 5)])
    # the new partitions take records at once, and a consumer and DuckDB read them
    with Producer(conf) as producer:
        for partition, value in ((0, b"p0-0"), (2, b"p2-0"), (2, b"p2-1")):
            producer.produce("grow", value=value, partition=partition)
        assert producer.flush(10) == 0
    consumer = Consumer({**conf, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("grow", p) for p in range(3)])
    got = []
    while len(got) < 3:
        batch = consumer.consume(10, 5)
        assert batch, f"only {got} arrived"
        got += [(m.partition(), m.offset(), m.value()) for m in batch]
    consumer.close()
    assert sorted(got) == [(0, 0, b"p0-0"), (2, 0, b"p2-0"), (2, 1, b"p2-1")]
    con = txduck.connect(storage.url, storage.options)
    try:
        assert con.sql('SELECT partition, "offset", value FROM grow ORDER BY 1, 2').fetchall() == [
            (0, 0, b"p0-0"), (2, 0, b"p2-0"), (2, 1, b"p2-1")]
    finally:
        con.close()


def test_describe_configs_of_a_topic_and_the_broker(admin):
    admin.create_topics([NewTopic("t", 1, config={"retention.ms": "3600000"})])["t"].result()
    topic, broker, missing, group = (ConfigResource(ResourceType.TOPIC, "t"), ConfigResource("broker", "1"),
                                     ConfigResource(ResourceType.TOPIC, "nope"),
                                     ConfigResource(ResourceType.GROUP, "g"))
    done = admin.describe_configs([topic, broker, missing, group])
    assert list(done) == [topic, broker, missing, group]
    entries = done[topic].result()
    assert sorted(entries) == sorted(TOPIC_CONFIGS)
    retention = entries["retention.ms"]
    # confluent-kafka's ConfigEntry from describe_configs carries the source as its number
    assert (retention.value, retention.source, retention.is_default, retention.is_read_only, retention.is_synonym) == (
        "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value, False, False, False)
    assert [(s.name, s.value, s.source, s.is_synonym) for s in retention.synonyms.values()] == [
        ("retention.ms", "3600000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value, True)]
    policy = entries["cleanup.policy"]
    assert (policy.value, policy.source, policy.is_default) == ("delete", ConfigSource.DEFAULT_CONFIG.value, True)
    assert [(s.name, s.value, s.source) for s in policy.synonyms.values()] == [
        ("log.cleanup.policy", "delete", ConfigSource.DEFAULT_CONFIG.value)]
    node = done[broker].result()
    assert (node["node.id"].value, node["num.partitions"].value) == ("1", "1")
    assert node["advertised.listeners"].value == "PLAINTEXT://localhost:0"
    assert all(e.is_read_only for e in node.values())
    assert error_of(done[missing]) == (
        KafkaError.UNKNOWN_TOPIC_OR_PART, UNKNOWN_TOPIC_TEXT)
    assert error_of(done[group]) == (KafkaError.INVALID_REQUEST, "Unsupported resource type: GROUP")
    wrong_node = ConfigResource(ResourceType.BROKER, "2")
    assert error_of(admin.describe_configs([wrong_node])[wrong_node]) == (
        KafkaError.INVALID_REQUEST, "Unexpected broker id, expected 1 or empty string, but received 2")
    with pytest.raises(ValueError):
        admin.describe_configs([("topic", "t")])


def test_incremental_alter_configs_set_append_subtract_delete_and_kafkas_errors(admin):
    admin.create_topics([NewTopic("t", 1, config={"segment.bytes": "1048576"})])["t"].result()
    topic = ConfigResource(ResourceType.TOPIC, "t")

    def described(name: str) -> tuple[str, int]:
        entry = admin.describe_configs([topic])[topic].result()[name]
        return entry.value, entry.source

    assert alter(admin, topic, ("retention.ms", "1000", S), validate_only=True).result() is None
    assert described("retention.ms") == (TOPIC_CONFIGS["retention.ms"].default, ConfigSource.DEFAULT_CONFIG.value)
    assert alter(admin, topic, ("retention.ms", "1000", S), ("cleanup.policy", "compact", A),
                 ("segment.bytes", "ignored for DELETE", D)).result() is None
    assert described("retention.ms") == ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert described("cleanup.policy") == ("delete,compact", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert described("segment.bytes") == ("1073741824", ConfigSource.DEFAULT_CONFIG.value)
    assert alter(admin, topic, ("cleanup.policy", "delete", U)).result() is None
    assert described("cleanup.policy") == ("compact", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    # the engine follows the new config: a compacted topic refuses DeleteRecords
    tp = TopicPartition("t", 0, 0)
    assert error_of(admin.delete_records([tp])[tp])[0] == KafkaError.POLICY_VIOLATION
    # errors: the codes and messages the server answers (tests/test_server_topics.py), nothing changed
    assert error_of(alter(admin, topic, ("retention.minutes", "5", S))) == (
        KafkaError.INVALID_CONFIG, "Unknown topic config name: retention.minutes")
    assert error_of(alter(admin, topic, ("retention.ms", "soon", S))) == (
        KafkaError.INVALID_CONFIG, "Invalid value soon for configuration retention.ms: Not a number of type LONG")
    assert error_of(alter(admin, topic, ("retention.ms", "5", A))) == (
        KafkaError.INVALID_CONFIG, "Can't APPEND to key retention.ms because its type is not LIST.")
    assert error_of(alter(admin, ConfigResource(ResourceType.TOPIC, "nope"), ("retention.ms", "5", S))) == (
        KafkaError.UNKNOWN_TOPIC_OR_PART, "The topic 'nope' does not exist.")
    assert error_of(alter(admin, ConfigResource(ResourceType.BROKER, "1"), ("num.partitions", "3", S))) == (
        KafkaError.INVALID_REQUEST, "Cannot update these configs dynamically: Set(num.partitions)")
    assert described("retention.ms") == ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    with pytest.raises(TypeError):
        admin.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, "t",
                                                        incremental_configs=[ConfigEntry("retention.ms", "5")])])
    with pytest.raises(ValueError):
        admin.incremental_alter_configs([topic, ConfigResource(ResourceType.TOPIC, "t")])


def test_describe_cluster_names_the_one_node(admin, storage):
    result = admin.describe_cluster().result()
    assert isinstance(result, DescribeClusterResult)
    assert result.cluster_id == cluster_id_for(storage.url)
    assert [(n.id, n.host, n.port, n.rack) for n in result.nodes] == [(1, "localhost", 0, None)]
    assert isinstance(result.controller, Node) and result.controller.id == 1
    assert result.authorized_operations is None


def test_list_topics_raises_kafka_exception_naming_an_unreadable_commit(storage):
    """API.md: failing calls raise KafkaException. The old list_topics let the catalog's
    CorruptObjectError out as it was; now the Metadata request fails and the call raises
    KafkaException CORRUPT_MESSAGE naming the object, with the cause chained."""
    conf = storage.conf()
    with AdminClient(conf) as writer:
        writer.create_topics([NewTopic("t", 1)])["t"].result()
    close_all()
    admin = AdminClient(conf)   # a reader: it takes no lease
    try:
        store = storage.object_store()
        key = commit_key(open_catalog(storage).version + 1)   # the next commit the reader reads
        store.put(key, b"PAR1 truncated")
        with pytest.raises(KafkaException) as info:
            admin.list_topics()
        err = info.value.args[0]
        assert (err.code(), err.retriable()) == (KafkaError.CORRUPT_MESSAGE, False)
        assert err.str().startswith(f"list_topics(): {store.uri(key)}: ")
        assert type(info.value.__cause__) is CorruptObjectError
    finally:
        admin.close()
        close_all()
