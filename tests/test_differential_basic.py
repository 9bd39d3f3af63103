"""Differential tests, basics: one confluent-kafka scenario run against Apache Kafka 4.3.1
(the ``apache_kafka`` fixture) and against ``txlake serve``; every observable outcome must be
equal (issue 18, "Apache Kafka as the reference, on this machine").

:func:`basic_scenario` takes a bootstrap address and returns a plain dict of outcomes: topic
creation, idempotent produce of keyed records with headers and timestamps (explicit
partitions and librdkafka's murmur2 partitioner), the offsets the delivery reports give, the
watermarks, the exact records a consumer reads back, ListOffsets by timestamp and by the
special timestamps -1 (latest), -2 (earliest) and -3 (max timestamp, KIP-734), a group's
committed offsets with metadata, DeleteRecords and the low watermark after it, and the
KafkaError each failing client call raises (unknown topic or partition on produce, an
existing topic, an invalid topic name, bad partition counts and replication factors,
deleting an unknown topic, DeleteRecords beyond the high watermark, fetching out of range,
committing for an unknown topic). The scenario runs once per broker (module-scoped
fixtures); each test compares one part, so a difference names itself.

txlake runs on a file:// root here: the differences under test are in the protocol layer
(engine/apis), which is the same on every storage backend.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import ConfigResource, NewPartitions, NewTopic, OffsetSpec

from differential import CALL_TIMEOUT_S, Run, outcome, outcome_message, served_txlake

TS = 1_700_000_000_000
PARTITIONS = 3


def _records() -> list[dict]:
    """30 keyed records with timestamps, every fourth without headers, to explicit
    partitions (i % 3), then 12 keyed records left to the murmur2 partitioner."""
    explicit = [dict(topic="orders", partition=i % PARTITIONS, key=b"k%02d" % i, value=b"v%02d" % i,
                     headers=None if i % 4 == 0 else [("h", b"%d" % i), ("n", None)], timestamp=TS + 10 * i)
                for i in range(30)]
    hashed = [dict(topic="orders", key=b"key-%d" % i, value=b"hashed-%d" % i, timestamp=TS + 1000 + i)
              for i in range(12)]
    return explicit + hashed


def basic_scenario(bootstrap: str) -> dict[str, Any]:
    """The scenario against ``bootstrap``: a dict of comparable outcomes (see the module)."""
    run = Run(bootstrap)
    admin = run.admin
    out: dict[str, Any] = {}
    topic = run.name("orders")

    def create(name: str, partitions: int, replication: int = -1) -> tuple[str, Any]:
        futures = admin.create_topics([NewTopic(name, partitions, replication)], operation_timeout=CALL_TIMEOUT_S)
        return outcome(lambda: futures[name].result(CALL_TIMEOUT_S))

    out["create"] = create(topic, PARTITIONS)
    run.wait_for_topic("orders", PARTITIONS)
    md = admin.list_topics(topic, timeout=CALL_TIMEOUT_S).topics[topic]
    out["metadata"] = sorted((p.id, len(p.replicas), len(p.isrs)) for p in md.partitions.values())

    described = admin.describe_configs([ConfigResource("TOPIC", topic)])
    out["topic_configs"] = {name: (entry.value, entry.source, entry.is_read_only, entry.is_sensitive)
                            for name, entry in list(described.values())[0].result(CALL_TIMEOUT_S).items()}

    # --- errors of topic administration
    out["create_existing"] = create(topic, PARTITIONS)
    out["create_invalid_name"] = create("bad name!" + run.suffix, 1)
    out["create_zero_partitions"] = create(run.name("zero"), 0)
    out["create_replication_3"] = create(run.name("three"), 1, 3)
    # the messages too: CreateTopics answers Kafka's controller's text
    out["create_dotted"] = create(run.name("a.b"), 1)
    failing = {"existing": NewTopic(topic, 1), "replication_3": NewTopic(run.name("three"), 1, 3),
               "invalid_name": NewTopic("bad name!", 1), "too_long_name": NewTopic("x" * 250, 1),
               "dot_name": NewTopic("..", 1), "zero_partitions": NewTopic(run.name("zero"), 0),
               "replication_0": NewTopic(run.name("rf0"), 1, 0), "collides": NewTopic(run.name("a_b"), 1),
               "bad_config_value": NewTopic(run.name("cfg"), 1, config={"retention.ms": "soon"}),
               "unknown_config": NewTopic(run.name("cfg2"), 1, config={"retention.minutes": "5"})}
    futures = admin.create_topics(list(failing.values()), operation_timeout=CALL_TIMEOUT_S)
    out["create_errors"] = {
        key: (outcome(lambda: futures[new.topic].result(CALL_TIMEOUT_S)),
              (outcome_message(lambda: futures[new.topic].result(CALL_TIMEOUT_S)) or "").replace(run.suffix, ""))
        for key, new in failing.items()}
    unknown = run.name("nosuch")
    out["delete_unknown_topic"] = outcome(lambda: admin.delete_topics([unknown])[unknown].result(CALL_TIMEOUT_S))
    out["create_partitions_fewer"] = outcome(
        lambda: admin.create_partitions([NewPartitions(topic, 2)])[topic].result(CALL_TIMEOUT_S))

    # --- idempotent produce: offsets per partition
    out["produce"] = run.produce(_records(), partitioner="murmur2_random")
    # unknown topic (no auto creation on either broker), unknown partition
    out["produce_unknown_topic"] = run.produce(
        [dict(topic="nosuch", key=b"k", value=b"v")], **{"message.timeout.ms": 3000,
                                                          "topic.metadata.propagation.max.ms": 1000})
    out["produce_unknown_partition"] = run.produce([dict(topic="orders", partition=7, key=b"k", value=b"v")],
                                                   **{"message.timeout.ms": 3000})

    # KIP-937: a CreateTime more than message.timestamp.after.max.ms (1 h) ahead; a batch over
    # max.message.bytes (1 MiB + 12) as the broker measures it (the client's own limit raised)
    far = int(time.time() * 1000) + 2 * 3600 * 1000
    out["produce_future_timestamp"] = run.produce([dict(topic="orders", partition=0, value=b"v", timestamp=far)],
                                                  **{"message.timeout.ms": 5000})
    out["produce_too_large"] = run.produce([dict(topic="orders", partition=0, value=b"x" * (1 << 21))],
                                           **{"message.max.bytes": 4 << 20, "batch.size": 4 << 20,
                                              "message.timeout.ms": 5000})

    # --- watermarks and the exact records read back
    reader = run.consumer()
    try:
        out["watermarks"] = [reader.get_watermark_offsets(TopicPartition(topic, p), timeout=CALL_TIMEOUT_S)
                             for p in range(PARTITIONS)]
        # ListOffsets: by timestamp (before all, an exact record's, between two, after all), and the
        # special timestamps -1 (latest), -2 (earliest); -3 is max timestamp (KIP-734)
        stamps = [TS - 1, TS, TS + 10 * 7, TS + 10 * 7 + 1, TS + 1000, TS + 1011, TS + 10 ** 6, -1, -2]
        out["offsets_for_times"] = {
            ts: [(tp.partition, tp.offset, tp.error and tp.error.name()) for tp in reader.offsets_for_times(
                [TopicPartition(topic, p, ts) for p in range(PARTITIONS)], timeout=CALL_TIMEOUT_S)]
            for ts in stamps}
        out["watermarks_unknown"] = [
            outcome(lambda: reader.get_watermark_offsets(TopicPartition(topic, 9), timeout=5)),
            outcome(lambda: reader.get_watermark_offsets(TopicPartition(run.name("nosuch"), 0), timeout=5))]
    finally:
        reader.close()
    out["records"] = run.consume("orders", {p: 0 for p in range(PARTITIONS)}, expected=42)
    out["records_from_4"] = run.consume("orders", {1: 4}, expected=len(
        [r for r in out["produce"] if r[2] == 1 and r[3] >= 4]))

    def list_offsets(spec: OffsetSpec) -> list[tuple]:
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p in range(PARTITIONS)},
                                     request_timeout=CALL_TIMEOUT_S)
        return [(tp.partition, f.result(CALL_TIMEOUT_S).offset, f.result(CALL_TIMEOUT_S).timestamp)
                for tp, f in sorted(futures.items(), key=lambda kv: kv[0].partition)]

    out["list_offsets_unknown"] = [
        outcome(lambda: list(admin.list_offsets({TopicPartition(topic, 9): OffsetSpec.latest()},
                                                request_timeout=5).values())[0].result(CALL_TIMEOUT_S).offset),
        outcome(lambda: list(admin.list_offsets({TopicPartition(run.name("nosuch"), 0): OffsetSpec.latest()},
                                                request_timeout=5).values())[0].result(CALL_TIMEOUT_S).offset)]
    out["list_offsets"] = {
        "earliest": list_offsets(OffsetSpec.earliest()),
        "latest": list_offsets(OffsetSpec.latest()),
        "max_timestamp": list_offsets(OffsetSpec.max_timestamp()),
        "for_timestamp": list_offsets(OffsetSpec.for_timestamp(TS + 100)),
    }

    # --- fetch out of range (auto.offset.reset=error)
    out["fetch_out_of_range"] = run.consume("orders", {0: 1000}, expected=0, errors=1)

    # --- committed offsets of a group
    group = run.consumer("group")
    try:
        out["commit"] = outcome(lambda: sorted(
            (tp.partition, tp.offset, tp.error and tp.error.name()) for tp in group.commit(offsets=[
                TopicPartition(topic, 0, 5, metadata="m0"), TopicPartition(topic, 1, 2)], asynchronous=False)))
        out["committed"] = sorted((tp.partition, tp.offset, tp.metadata, tp.error and tp.error.name())
                                  for tp in group.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                                            timeout=CALL_TIMEOUT_S))
        out["commit_unknown_topic"] = outcome(lambda: group.commit(
            offsets=[TopicPartition(run.name("nosuch"), 0, 1)], asynchronous=False))
    finally:
        group.close()
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(run.name("group"))])
    listed = futures[run.name("group")].result(CALL_TIMEOUT_S)
    out["list_group_offsets"] = sorted((run.logical(tp.topic), tp.partition, tp.offset, tp.metadata)
                                       for tp in listed.topic_partitions)
    fresh = run.consumer("never-committed")
    try:
        out["committed_fresh_group"] = [tp.offset for tp in fresh.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=CALL_TIMEOUT_S)]
    finally:
        fresh.close()

    # --- DeleteRecords: the low watermark moves; below it is out of range
    def delete_records(tp: TopicPartition) -> tuple[str, Any]:
        futures = admin.delete_records([tp], request_timeout=CALL_TIMEOUT_S)
        return outcome(lambda: list(futures.values())[0].result(CALL_TIMEOUT_S).low_watermark)

    out["delete_records"] = [delete_records(TopicPartition(topic, 0, 3)),
                             delete_records(TopicPartition(topic, 1, -1)),      # -1: up to the high watermark
                             delete_records(TopicPartition(topic, 0, 2)),       # below the low watermark: no-op
                             delete_records(TopicPartition(topic, 2, 10_000)),  # beyond the high watermark
                             delete_records(TopicPartition(run.name("nosuch"), 0, 1))]
    wm = run.consumer()
    try:
        out["watermarks_after_delete"] = [wm.get_watermark_offsets(TopicPartition(topic, p), timeout=CALL_TIMEOUT_S)
                                          for p in range(PARTITIONS)]
    finally:
        wm.close()
    out["list_offsets_after_delete"] = {"earliest": list_offsets(OffsetSpec.earliest()),
                                        "for_timestamp": list_offsets(OffsetSpec.for_timestamp(TS))}
    out["fetch_below_low_watermark"] = run.consume("orders", {0: 0, 1: 13}, expected=0, errors=2)
    out["records_after_delete"] = run.consume("orders", {0: 3, 1: 14}, expected=len(
        [r for r in out["produce"] if r[2] == 0 and r[3] >= 3]))
    return out


@pytest.fixture(scope="module")
def txlake_server(tmp_path_factory):
    """``txlake serve`` on a fresh file:// root for this module, as the reference broker is
    configured (differential.TXLAKE_SETTINGS)."""
    with served_txlake(tmp_path_factory.mktemp("differential")) as served:
        yield served


@pytest.fixture(scope="module")
def kafka_outcomes(apache_kafka) -> dict[str, Any]:
    return basic_scenario(apache_kafka.bootstrap)


@pytest.fixture(scope="module")
def txlake_outcomes(txlake_server) -> dict[str, Any]:
    return basic_scenario(txlake_server.bootstrap)


PARTS = ["create", "metadata", "create_existing", "create_invalid_name", "create_zero_partitions", "create_replication_3", "create_dotted", "create_errors", "delete_unknown_topic",
         "create_partitions_fewer", "produce", "produce_unknown_topic", "produce_unknown_partition", "produce_future_timestamp", "produce_too_large",
         "watermarks", "watermarks_unknown", "list_offsets_unknown",
         "offsets_for_times", "records", "records_from_4", "list_offsets", "fetch_out_of_range", "commit",
         "committed", "commit_unknown_topic", "list_group_offsets", "committed_fresh_group", "delete_records",
         "watermarks_after_delete", "list_offsets_after_delete", "fetch_below_low_watermark",
         "records_after_delete"]


#: topic configs Kafka 4.3 has and txlake does not (docs/server.md, "Behaviour that differs"):
#: KIP-390's compression levels, tiered storage's, replication throttles, the offset index's
TXLAKE_LACKS_TOPIC_CONFIGS = {
    "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
    "remote.storage.enable", "remote.log.copy.disable", "remote.log.delete.on.disable",
    "local.retention.ms", "local.retention.bytes",
    "leader.replication.throttled.replicas", "follower.replication.throttled.replicas", "index.interval.bytes"}
#: ConfigSource values (Kafka's DescribeConfigsResponse.ConfigSource)
DYNAMIC_DEFAULT_BROKER_CONFIG, DEFAULT_CONFIG = 3, 5


def test_the_scenario_covers_every_part(kafka_outcomes, txlake_outcomes):
    assert sorted(kafka_outcomes) == sorted(PARTS + ["topic_configs"]) == sorted(txlake_outcomes)


def test_topic_configs_and_their_defaults_are_kafkas(kafka_outcomes, txlake_outcomes):
    """Every topic config txlake has, with Kafka 4.3's default value, source and flags; the
    ones it lacks are exactly the documented ones. Kafka's ``min.insync.replicas`` is a
    cluster-level dynamic default (KIP-966's controller writes it when ELR is enabled);
    txlake's is the plain default (same value; documented)."""
    kafka, ours = dict(kafka_outcomes["topic_configs"]), dict(txlake_outcomes["topic_configs"])
    assert set(kafka) - set(ours) == TXLAKE_LACKS_TOPIC_CONFIGS
    assert set(ours) - set(kafka) == set()
    assert kafka["min.insync.replicas"] == ("1", DYNAMIC_DEFAULT_BROKER_CONFIG, False, False)
    kafka["min.insync.replicas"] = ("1", DEFAULT_CONFIG, False, False)
    assert {name: ours[name] for name in sorted(ours)} == {name: kafka[name] for name in sorted(ours)}


@pytest.mark.parametrize("part", PARTS)
def test_txlake_answers_as_apache_kafka(part, kafka_outcomes, txlake_outcomes):
    assert txlake_outcomes[part] == kafka_outcomes[part], f"{part}: Apache Kafka {kafka_outcomes[part]!r}"


def test_the_reference_outcomes_are_the_expected_ones(kafka_outcomes):
    """The scenario itself is sound: Apache Kafka's outcomes are the ones Kafka documents (so
    two equally broken runs cannot pass the comparison)."""
    out = kafka_outcomes
    assert out["create"] == ("ok", None)
    assert out["metadata"] == [(0, 1, 1), (1, 1, 1), (2, 1, 1)]
    explicit = out["produce"][:30]
    assert explicit == [(None, "orders", i % 3, i // 3) for i in range(30)]
    assert all(err is None for err, *_ in out["produce"])
    assert out["watermarks"] == [(0, 13), (0, 14), (0, 15)]   # 10 explicit each, 12 hashed spread 3/4/5
    assert len(out["records"]) == 42 and out["records"][0] == (0, 0, b"k00", b"v00", None, (1, TS))
    assert out["records"][1] == (0, 1, b"k03", b"v03", [("h", b"3"), ("n", None)], (1, TS + 30))
    assert out["offsets_for_times"][TS + 71] == [(0, 3, None), (1, 3, None), (2, 2, None)]
    assert out["offsets_for_times"][-1] == [(0, 13, None), (1, 14, None), (2, 15, None)]
    assert out["offsets_for_times"][-2] == [(0, 0, None), (1, 0, None), (2, 0, None)]
    assert out["offsets_for_times"][TS + 10 ** 6] == [(0, -1, None), (1, -1, None), (2, -1, None)]
    assert out["committed"] == [(0, 5, "m0", None), (1, 2, None, None), (2, -1001, None, None)]
    assert out["create_existing"] == ("error", "TOPIC_ALREADY_EXISTS")
    assert out["delete_unknown_topic"] == ("error", "UNKNOWN_TOPIC_OR_PART")
    assert out["produce_unknown_topic"][0][0] == "UNKNOWN_TOPIC_OR_PART"
    assert out["produce_unknown_partition"][0][0] == "_UNKNOWN_PARTITION"
    assert out["delete_records"] == [("ok", 3), ("ok", 14), ("ok", 3), ("error", "OFFSET_OUT_OF_RANGE"),
                                     ("error", "_NOENT")]
    assert out["watermarks_after_delete"] == [(3, 13), (14, 14), (0, 15)]
    assert out["fetch_out_of_range"] == [("error", 0, "_AUTO_OFFSET_RESET")]
    assert out["fetch_below_low_watermark"] == [("error", 0, "_AUTO_OFFSET_RESET"), ("error", 1, "_AUTO_OFFSET_RESET")]
    assert [r[:2] for r in out["records_after_delete"]] == [(0, o) for o in range(3, 13)]
