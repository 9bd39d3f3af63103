"""The in-process AdminClient's group, offset, topic, election, ACL and SCRAM calls (issue 17):
list/describe/delete_consumer_groups, list/alter_consumer_group_offsets, list_offsets,
describe_topics, alter_configs, elect_leaders, create/describe/delete_acls,
describe/alter_user_scram_credentials and poll, with confluent-kafka's signatures, result types
and futures, answered by the engine's request surface (engine/apis).

Where a call has a wire twin, confluent-kafka's own AdminClient against ``txlake serve`` gets the
same answer (the last tests); the ACL, SCRAM, AlterConfigs and ElectLeaders answers are Apache
Kafka 4.3.1's without an authorizer, as confluent-kafka 2.16 reported them against one.
"""

from __future__ import annotations

import warnings

import pytest
from test_admin_apis import error_of
from test_groups import Member, backend, env, wait_stable, wait_until  # noqa: F401 - fixtures

from txlake import (ConsumerGroupState, ConsumerGroupTopicPartitions, ConsumerGroupType, ElectionType,
                    IsolationLevel, KafkaError, NewTopic, Node, Producer, TopicCollection,
                    TopicPartition, Uuid)
from txlake.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, AdminClient, ConfigResource,
                          ConsumerGroupDescription, ListConsumerGroupsResult, ListOffsetsResultInfo, OffsetSpec,
                          ResourcePatternType, ResourceType, ScramCredentialInfo, ScramMechanism, TopicDescription,
                          UserScramCredentialDeletion, UserScramCredentialUpsertion)
from txlake.engine.registry import close_all

GROUP = "g"
RANGE = {"partition.assignment.strategy": "range"}


def offsets_of(result) -> list[tuple]:
    return sorted((tp.topic, tp.partition, tp.offset, tp.metadata, tp.leader_epoch,
                   None if tp.error is None else tp.error.code()) for tp in result.topic_partitions)


def test_groups_are_listed_and_described_with_members_and_assignments(env):
    env.topic("t", 4)
    first = Member(env, "c1", ["t"], **RANGE)
    second = Member(env, "c2", ["t"], **RANGE)
    wait_stable(env, [first, second], 4)
    listed = env.admin.list_consumer_groups().result(10)
    assert isinstance(listed, ListConsumerGroupsResult) and listed.errors == []
    assert [(g.group_id, g.is_simple_consumer_group, g.state, g.type) for g in listed.valid] == [
        (GROUP, False, ConsumerGroupState.STABLE, ConsumerGroupType.CLASSIC)]
    assert env.admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(10).valid == []
    assert [g.group_id for g in env.admin.list_consumer_groups(
        states={ConsumerGroupState.STABLE}, types={ConsumerGroupType.CLASSIC}).result(10).valid] == [GROUP]
    assert env.admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(10).valid == []
    with pytest.raises(TypeError):
        env.admin.list_consumer_groups(states=[ConsumerGroupState.STABLE])

    described = env.admin.describe_consumer_groups([GROUP, "missing"])
    d = described[GROUP].result(10)
    assert isinstance(d, ConsumerGroupDescription)
    assert (d.group_id, d.is_simple_consumer_group, d.partition_assignor, d.state, d.type,
            d.authorized_operations) == (GROUP, False, "range", ConsumerGroupState.STABLE, ConsumerGroupType.CLASSIC,
                                         None)
    assert (d.coordinator.id, d.coordinator.host, d.coordinator.port) == (1, "localhost", 0)
    members = sorted((m.client_id, m.member_id, m.group_instance_id,
                      sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)) for m in d.members)
    assert members == sorted([
        ("c1", first.member_id(), None, [("t", p) for p in first.partitions()]),
        ("c2", second.member_id(), None, [("t", p) for p in second.partitions()])])
    assert sorted(first.partitions() + second.partitions()) == [0, 1, 2, 3]
    missing = described["missing"].result(10)
    assert (missing.state, missing.members, missing.is_simple_consumer_group, missing.partition_assignor) == (
        ConsumerGroupState.DEAD, [], True, "")
    with_ops = env.admin.describe_consumer_groups([GROUP], include_authorized_operations=True)[GROUP].result(10)
    assert with_ops.authorized_operations == [AclOperation.READ, AclOperation.DELETE, AclOperation.DESCRIBE]
    # a group with members cannot be deleted
    assert error_of(env.admin.delete_consumer_groups([GROUP])[GROUP]) == (
        KafkaError.NON_EMPTY_GROUP, "Broker: The group is not empty")
    with pytest.raises(ValueError):
        env.admin.describe_consumer_groups([])


def test_offsets_are_listed_altered_resumed_from_and_deleted_with_the_group(env):
    env.topic("t", 2, records=10)
    admin = env.admin
    # a simple group: offsets committed by the admin, no member ever
    altered = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(GROUP, [
        TopicPartition("t", 0, 7, metadata="seven", leader_epoch=3), TopicPartition("t", 1, 4),
        TopicPartition("nope", 0, 1)])])[GROUP].result(10)
    assert offsets_of(altered) == [("nope", 0, 1, None, None, KafkaError.UNKNOWN_TOPIC_OR_PART),
                                   ("t", 0, 7, "seven", 3, None), ("t", 1, 4, None, None, None)]
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(GROUP)])[GROUP].result(10)
    assert isinstance(listed, ConsumerGroupTopicPartitions) and listed.group_id == GROUP
    assert offsets_of(listed) == [("t", 0, 7, "seven", 3, None), ("t", 1, 4, None, None, None)]
    some = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(GROUP, [
        TopicPartition("t", 1), TopicPartition("t", 5)])])[GROUP].result(10)
    assert offsets_of(some) == [("t", 1, 4, None, None, None), ("t", 5, -1001, None, None, None)]
    assert [(g.group_id, g.is_simple_consumer_group, g.state) for g in admin.list_consumer_groups().result(10).valid] \
        == [(GROUP, True, ConsumerGroupState.EMPTY)]
    # a consumer of the group resumes at the altered offsets
    member = Member(env, "c1", ["t"])
    wait_stable(env, [member], 2)
    wait_until(lambda: len(member.consumed()) == 9, "the records past the altered offsets")
    assert sorted((p, o) for p, o, _ in member.consumed()) == [(0, 7), (0, 8), (0, 9)] + [(1, o) for o in range(4, 10)]
    member.stop()
    # the group is Empty again: delete it, and its offsets are gone
    assert admin.delete_consumer_groups([GROUP])[GROUP].result(10) is None
    assert offsets_of(admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(GROUP)])[GROUP].result(10)) == []
    assert admin.list_consumer_groups().result(10).valid == []
    assert error_of(admin.delete_consumer_groups([GROUP])[GROUP]) == (
        KafkaError.GROUP_ID_NOT_FOUND, "Broker: The group id does not exist")
    # confluent-kafka's argument checks
    with pytest.raises(ValueError):
        admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(GROUP, [TopicPartition("t", 0, 3)])])
    with pytest.raises(ValueError):
        admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(GROUP, [TopicPartition("t", 0)])])
    with pytest.raises(ValueError):
        admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(GROUP, [TopicPartition("t", 0, 1)]),
                                            ConsumerGroupTopicPartitions("h", [TopicPartition("t", 0, 1)])])


def test_list_offsets_earliest_latest_max_timestamp_and_for_timestamp_under_both_isolation_levels(env):
    env.admin.create_topics([NewTopic("t", 1)])["t"].result()
    with Producer(env.conf) as p:
        for ts in (1000, 1010, 1020, 1005):
            p.produce("t", value=b"x", partition=0, timestamp=ts)
        assert p.flush(10) == 0
    tx = Producer({**env.conf, "transactional.id": "open"})
    tx.init_transactions(10)
    tx.begin_transaction()
    tx.produce("t", value=b"pending", partition=0, timestamp=2000)
    assert tx.flush(10) == 0
    tp = TopicPartition("t", 0)

    def ask(spec, level=IsolationLevel.READ_UNCOMMITTED):
        (key, future), = env.admin.list_offsets({tp: spec}, isolation_level=level).items()
        assert (key.topic, key.partition, key.offset) == ("t", 0, spec._value)
        info = future.result(10)
        assert isinstance(info, ListOffsetsResultInfo)
        return info.offset, info.timestamp, info.leader_epoch is not None

    assert ask(OffsetSpec.earliest()) == (0, -1, True)
    assert ask(OffsetSpec.latest()) == (5, -1, True)  # the high watermark: past the open transaction's record
    assert ask(OffsetSpec.latest(), IsolationLevel.READ_COMMITTED) == (4, -1, True)  # the LSO
    assert ask(OffsetSpec.max_timestamp()) == (4, 2000, True)
    assert ask(OffsetSpec.for_timestamp(1010)) == (1, 1010, True)
    assert ask(OffsetSpec.for_timestamp(1006)) == (1, 1010, True)
    assert ask(OffsetSpec.for_timestamp(99999)) == (-1, -1, False)
    tx.commit_transaction(10)
    assert ask(OffsetSpec.latest(), IsolationLevel.READ_COMMITTED) == (6, -1, True)  # past the COMMIT marker
    tx.close()
    # as librdkafka: a missing topic or partition has no leader; with none at all the request fails
    missing = env.admin.list_offsets({TopicPartition("nope", 0): OffsetSpec.latest()})
    assert error_of(missing[TopicPartition("nope", 0)]) == (KafkaError._NOENT,
                                                            "Failed to query partition leaders: No leaders found")
    mixed = env.admin.list_offsets({tp: OffsetSpec.latest(), TopicPartition("nope", 0): OffsetSpec.latest(),
                                    TopicPartition(tp.topic, 9): OffsetSpec.latest()})
    assert mixed[TopicPartition(tp.topic, 0, -1)].result(10).offset == 6
    assert error_of(mixed[TopicPartition("nope", 0, -1)]) == (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                              "Broker: Unknown topic or partition")
    assert error_of(mixed[TopicPartition(tp.topic, 9, -1)]) == (KafkaError._UNKNOWN_PARTITION,
                                                                "Local: Unknown partition")
    with pytest.raises(TypeError):
        env.admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=1)
    with pytest.raises(TypeError):
        env.admin.list_offsets({tp: -1})
    assert OffsetSpec(-1) is OffsetSpec.latest() and OffsetSpec(5).timestamp == 5


def test_describe_topics_gives_partitions_nodes_and_the_topic_id(env, storage):
    env.admin.create_topics([NewTopic("t", 3)])["t"].result()
    futures = env.admin.describe_topics(TopicCollection(["t", "nope"]))
    d = futures["t"].result(10)
    assert isinstance(d, TopicDescription)
    catalog_id = env.broker.topics()["t"].topic_id
    import uuid
    assert isinstance(d.topic_id, Uuid) and d.topic_id == Uuid._from_uuid(uuid.UUID(catalog_id))
    assert len(str(d.topic_id)) == 22
    import confluent_kafka  # librdkafka's form: standard base64 (Kafka's own toString is url-safe)
    assert [str(Uuid(m, n)) for m, n in ((123, -5), (-1, 2 ** 62))] == [
        str(confluent_kafka.Uuid(m, n)) for m, n in ((123, -5), (-1, 2 ** 62))] == ["AAAAAAAAAHv/////////+w",
                                                                                  "//////////9AAAAAAAAAAA"]
    assert (d.name, d.is_internal, d.authorized_operations) == ("t", False, None)
    assert [(p.id, str(p.leader), [str(n) for n in p.replicas], [str(n) for n in p.isr]) for p in d.partitions] == [
        (i, "(1) localhost:0 ", ["(1) localhost:0 "], ["(1) localhost:0 "]) for i in range(3)]
    assert isinstance(d.partitions[0].leader, Node)
    assert error_of(futures["nope"]) == (KafkaError.UNKNOWN_TOPIC_OR_PART, "Broker: Unknown topic or partition")
    with pytest.raises(TypeError):
        env.admin.describe_topics(["t"])


def test_alter_configs_replaces_every_override_as_kafka_does(env):
    admin = env.admin
    admin.create_topics([NewTopic("c", 1, config={"retention.ms": "1000", "cleanup.policy": "compact"})])["c"].result()
    resource = ConfigResource(ResourceType.TOPIC, "c", set_config={"retention.ms": "5000"})
    with pytest.warns(DeprecationWarning, match="alter_configs has been deprecated"):
        futures = admin.alter_configs([resource])
    assert futures[resource].result(10) is None
    described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, "c")])
    (entries,) = [f.result(10) for f in described.values()]
    assert {n: e.value for n, e in entries.items() if e.source == 1} == {"retention.ms": "5000"}
    assert entries["cleanup.policy"].value == "delete"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        bad = ConfigResource(ResourceType.TOPIC, "c", set_config={"nope.x": "1"})
        assert error_of(admin.alter_configs([bad])[bad]) == (KafkaError.INVALID_CONFIG,
                                                              "Unknown topic config name: nope.x")
        missing = ConfigResource(ResourceType.TOPIC, "missing", set_config={"retention.ms": "1"})
        assert error_of(admin.alter_configs([missing])[missing]) == (KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                                      "The topic 'missing' does not exist.")
        broker = ConfigResource(ResourceType.BROKER, "1", set_config={"log.retention.ms": "1"})
        assert error_of(admin.alter_configs([broker])[broker]) == (
            KafkaError.INVALID_REQUEST, "Cannot update these configs dynamically: Set(log.retention.ms)")
        dry = ConfigResource(ResourceType.TOPIC, "c", set_config={})
        assert admin.alter_configs([dry], validate_only=True)[dry].result(10) is None
    (entries,) = [f.result(10) for f in admin.describe_configs([ConfigResource(ResourceType.TOPIC, "c")]).values()]
    assert {n: e.value for n, e in entries.items() if e.source == 1} == {"retention.ms": "5000"}


def test_elect_leaders_is_never_needed(env):
    env.admin.create_topics([NewTopic("t", 2)])["t"].result()
    answer = env.admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("t", 0), TopicPartition("nope", 0),
                                                              TopicPartition("t", 5)]).result(10)
    assert {(tp.topic, tp.partition): (e.code(), e.str()) for tp, e in answer.items()} == {
        ("t", 0): (KafkaError.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition."),
        ("nope", 0): (KafkaError.UNKNOWN_TOPIC_OR_PART, "No such topic as nope"),
        ("t", 5): (KafkaError.UNKNOWN_TOPIC_OR_PART, "No such partition as t-5")}
    assert env.admin.elect_leaders(ElectionType.UNCLEAN, None).result(10) == {}
    with pytest.raises(TypeError):
        env.admin.elect_leaders(0, None)


ACL = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ,
                 AclPermissionType.ALLOW)
ANY_ACL = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                           AclPermissionType.ANY)


def test_acls_answer_security_disabled_and_scram_has_no_credentials(env):
    admin = env.admin
    assert error_of(admin.create_acls([ACL])[ACL]) == (KafkaError.SECURITY_DISABLED, "No Authorizer is configured.")
    assert admin.describe_acls(ANY_ACL).result(10) == []
    assert error_of(admin.delete_acls([ANY_ACL])[ANY_ACL]) == (KafkaError.SECURITY_DISABLED,
                                                               "No Authorizer is configured.")
    with pytest.raises(ValueError, match="duplicate ACL bindings not allowed"):
        admin.create_acls([ACL, ACL])
    with pytest.raises(ValueError, match="Cannot use enum operation, value ANY"):
        AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:a", "*", AclOperation.ANY,
                   AclPermissionType.ALLOW)
    assert admin.describe_user_scram_credentials().result(10) == {}
    named = admin.describe_user_scram_credentials(["alice"])
    assert error_of(named["alice"]) == (KafkaError.RESOURCE_NOT_FOUND,
                                        "Attempt to describe a user credential that does not exist: alice")
    sha256 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    altered = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion("alice", sha256, b"pw"),
        UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 100), b"pw"),
        UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_512)])
    assert error_of(altered["bob"]) == (KafkaError.RESOURCE_NOT_FOUND,
                                        "Attempt to delete a user credential that does not exist")
    assert error_of(altered["carol"]) == (KafkaError.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
    code, message = error_of(altered["alice"])
    assert code == KafkaError.UNSUPPORTED_SASL_MECHANISM and "serves no SASL mechanism" in message
    assert admin.poll(0) == 0 and admin.poll() == 0
    admin.set_sasl_credentials("u", "p")


# ---------------------------------------------------------------------------- the same over the wire
def test_confluent_kafka_over_the_wire_gets_the_in_process_answers(serve_root):
    """confluent-kafka's AdminClient against ``txlake serve`` and txlake's in-process AdminClient on
    the same root answer the same: groups, offsets, list_offsets, describe_topics, elections, ACLs,
    SCRAM, alter_configs."""
    import confluent_kafka
    import confluent_kafka.admin as cadmin

    settings = {"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 3}
    serve_root.settings.update(settings)
    served = serve_root.start()
    wire = cadmin.AdminClient({"bootstrap.servers": served.bootstrap})
    wire.create_topics([cadmin.NewTopic("t", 2)])["t"].result(20)
    producer = confluent_kafka.Producer({"bootstrap.servers": served.bootstrap})
    for ts in (1000, 1010, 1020):
        producer.produce("t", value=b"x", partition=0, timestamp=ts)
    assert producer.flush(20) == 0
    wire.alter_consumer_group_offsets([confluent_kafka.ConsumerGroupTopicPartitions(
        GROUP, [confluent_kafka.TopicPartition("t", 0, 2), confluent_kafka.TopicPartition("t", 1, 0)])])[GROUP].result(20)

    wire_answers = tour(wire, confluent_kafka, cadmin, _wire_error, 20)
    serve_root.stop()
    with AdminClient({**serve_root.storage.conf(), **settings}) as admin:
        import txlake
        import txlake.admin
        local = tour(admin, txlake, txlake.admin, error_of, 10)
    close_all()
    assert local == wire_answers
    assert wire_answers["groups"] == [(GROUP, True, "EMPTY", "CLASSIC")]
    assert wire_answers["offsets"] == [("t", 0, 2), ("t", 1, 0)]
    assert wire_answers["list_offsets"] == [(-1, 3, -1), (1005, 1, 1010), (-3, 2, 1020)]
    assert wire_answers["create_acls"] == (KafkaError.SECURITY_DISABLED, "No Authorizer is configured.")
    assert wire_answers["list_offsets_missing"] == [
        ("t", 0, 3), ("nope", 0, (KafkaError.UNKNOWN_TOPIC_OR_PART, "Broker: Unknown topic or partition")),
        ("t", 9, (KafkaError._UNKNOWN_PARTITION, "Local: Unknown partition"))]
    assert wire_answers["list_offsets_none"] == (KafkaError._NOENT, "Failed to query partition leaders: No leaders found")
    assert wire_answers["list_groups"] == [(GROUP, None, "Empty", "", "", [], 1)]
    assert wire_answers["list_groups_missing"] == []
    cluster_id, described_id = wire_answers["cluster_id"]
    assert cluster_id == described_id and len(cluster_id) == 22


def tour(admin, ck, cka, failure, timeout: float) -> dict:
    """The answers of ``admin`` -- confluent-kafka's (``ck`` = confluent_kafka, ``cka`` =
    confluent_kafka.admin) or txlake's (``ck`` = txlake, ``cka`` = txlake.admin), written once as
    confluent-kafka code -- to the calls of this module on a root with group g's offsets and topic t."""
    out: dict = {}
    g = admin.list_consumer_groups().result(timeout)
    out["groups"] = [(x.group_id, x.is_simple_consumer_group, x.state.name, x.type.name) for x in g.valid]
    d = admin.describe_consumer_groups([GROUP, "missing"])
    out["described"] = [(x.group_id, x.is_simple_consumer_group, x.state.name, x.partition_assignor, x.members,
                         x.coordinator.id) for x in (f.result(timeout) for f in d.values())]
    r = admin.list_consumer_group_offsets([ck.ConsumerGroupTopicPartitions(GROUP)])[GROUP].result(timeout)
    out["offsets"] = sorted((tp.topic, tp.partition, tp.offset) for tp in r.topic_partitions)
    out["list_offsets"] = []
    for spec in (cka.OffsetSpec.latest(), cka.OffsetSpec.for_timestamp(1005), cka.OffsetSpec.max_timestamp()):
        (key, future), = admin.list_offsets({ck.TopicPartition("t", 0): spec}).items()
        info = future.result(timeout)
        out["list_offsets"].append((key.offset, info.offset, info.timestamp))
    t = admin.describe_topics(ck.TopicCollection(["t"]))["t"].result(timeout)
    out["topic"] = (t.name, str(t.topic_id), t.is_internal, [(p.id, p.leader.id, [n.id for n in p.replicas])
                                                             for p in t.partitions])
    missing = admin.list_offsets({ck.TopicPartition("t", 0): cka.OffsetSpec.latest(),
                                  ck.TopicPartition("nope", 0): cka.OffsetSpec.latest(),
                                  ck.TopicPartition("t", 9): cka.OffsetSpec.latest()}, request_timeout=timeout)
    out["list_offsets_missing"] = [(tp.topic, tp.partition, failure(f) if f.exception(timeout) else f.result().offset)
                                   for tp, f in missing.items()]
    (nope, future), = admin.list_offsets({ck.TopicPartition("nope", 0): cka.OffsetSpec.latest()}).items()
    out["list_offsets_none"] = failure(future)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        out["list_groups"] = [(x.id, x.error, x.state, x.protocol_type, x.protocol, x.members, x.broker.id)
                              for x in admin.list_groups(timeout=timeout)]
        out["list_groups_missing"] = [(x.id, x.error, x.state, x.protocol_type, x.protocol, x.members)
                                      for x in admin.list_groups("missing", timeout=timeout)]
    out["cluster_id"] = (admin.list_topics(timeout=timeout).cluster_id, admin.describe_cluster().result(timeout).cluster_id)
    e = admin.elect_leaders(ck.ElectionType.PREFERRED, [ck.TopicPartition("t", 0)]).result(timeout)
    out["elect"] = [(tp.topic, tp.partition, err.code(), err.str()) for tp, err in e.items()]
    acl = cka.AclBinding(cka.ResourceType.TOPIC, "t", cka.ResourcePatternType.LITERAL, "User:alice", "*",
                         cka.AclOperation.READ, cka.AclPermissionType.ALLOW)
    out["create_acls"] = failure(admin.create_acls([acl])[acl])
    out["describe_acls"] = admin.describe_acls(cka.AclBindingFilter(
        cka.ResourceType.ANY, None, cka.ResourcePatternType.ANY, None, None, cka.AclOperation.ANY,
        cka.AclPermissionType.ANY)).result(timeout)
    out["scram"] = admin.describe_user_scram_credentials().result(timeout)
    out["scram_alice"] = failure(admin.describe_user_scram_credentials(["alice"])["alice"])
    deletion = cka.UserScramCredentialDeletion("bob", cka.ScramMechanism.SCRAM_SHA_256)
    out["scram_delete"] = failure(admin.alter_user_scram_credentials([deletion])["bob"])
    return out


def _wire_error(future) -> tuple[int, str]:
    """confluent-kafka's (code, text) of a failed future, without the stray byte confluent-kafka 2.16
    appends to some broker messages (tests/test_server_groups.py)."""
    with pytest.raises(confluent_kafka_exception()) as failed:
        future.result(20)
    err = failed.value.args[0]
    text = err.str()
    return err.code(), text[:-1] if text and not text[-1].isprintable() else text


def confluent_kafka_exception():
    import confluent_kafka
    return confluent_kafka.KafkaException
