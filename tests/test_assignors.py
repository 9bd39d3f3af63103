"""The consumer-side assignors: range, roundrobin, cooperative-sticky, and the protocol bytes.

Scenarios and expected assignments are Kafka's own (RangeAssignorTest, RoundRobinAssignorTest,
AbstractStickyAssignorTest and CooperativeStickyAssignorTest, without racks). Kafka runs the
sticky tests for the cooperative assignor with a verification that performs the follow-up
rebalances while partitions are being revoked; :func:`verify_cooperative` does the same.
"""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txlake.assignors import (ASSIGNORS, DEFAULT_GENERATION, Assignment, ConsumerProtocolError,
                              CooperativeStickyAssignor, RangeAssignor, RebalanceProtocol, RoundRobinAssignor,
                              StickyAssignmentError, Subscription, create_assignor, decode_assignment,
                              decode_subscription, encode_assignment, encode_subscription, java_hash_map_order,
                              perform_assignment, validate_cooperative_assignment)
from txlake.engine.group_metadata import JoinGroupMember

GENERATION = 1  # Kafka's test ``generationId``
topic, topic1, topic2, topic3 = "topic", "topic1", "topic2", "topic3"
consumer, consumer1, consumer2, consumer3, consumer4 = "consumer", "consumer1", "consumer2", "consumer3", "consumer4"


def tp(t: str, p: int) -> tuple[str, int]:
    return (t, p)


def sub(topics, instance=None) -> Subscription:
    """Kafka's ``subscription(topics, i)``: no owned partitions, no generation."""
    return Subscription(tuple(topics), group_instance_id=instance)


def owned(topics, partitions, generation=GENERATION) -> Subscription:
    """Kafka's ``buildSubscriptionV2Above``: owned partitions and a generation."""
    return Subscription(tuple(topics), None, tuple(partitions), generation)


def as_sets(assignment):
    return {m: set(tps) for m, tps in assignment.items()}


def is_fully_balanced(assignment) -> bool:
    sizes = [len(tps) for tps in assignment.values()]
    return max(sizes) - min(sizes) <= 1


def verify_validity_and_balance(subscriptions, assignment, partitions_per_topic):
    """Kafka's ``verifyValidityAndBalance``: members get only subscribed topics, no partition
    twice, and two members 2+ partitions apart share no topic (else one could have moved)."""
    assert set(subscriptions) == set(assignment)
    members = sorted(assignment)
    for i, a in enumerate(members):
        for t, p in assignment[a]:
            assert t in subscriptions[a].topics, f"{(t, p)} assigned to {a}, which is not subscribed to {t}"
            assert 0 <= p < partitions_per_topic[t]
        for b in members[i + 1:]:
            assert not set(assignment[a]) & set(assignment[b]), f"{a} and {b} share partitions"
            if abs(len(assignment[a]) - len(assignment[b])) > 1:
                shared = {t for t, _ in assignment[a]} & {t for t, _ in assignment[b]}
                assert not shared, f"partitions of {shared} could move between {a} and {b} for a better balance"


def cooperative_revokes(subscriptions, assignment) -> bool:
    """Kafka's ``verifyCooperativeValidity``: no partition is added while still being revoked;
    True when something is revoked (a follow-up rebalance will come)."""
    added, revoked = set(), set()
    for member_id, partitions in assignment.items():
        mine = set(subscriptions[member_id].owned_partitions)
        added |= set(partitions) - mine
        revoked |= mine - set(partitions)
    assert not added & revoked, f"{added & revoked} given to a new owner in the rebalance that revokes them"
    return bool(revoked)


def verify_cooperative(assignor, subscriptions, assignment, partitions_per_topic):
    """Kafka's CooperativeStickyAssignorTest ``verifyValidityAndBalance``: run the follow-up
    rebalances (owned = the last assignment) while partitions are revoked, then verify. Mutates
    ``subscriptions`` and ``assignment`` as Kafka's does."""
    rebalances = 0
    while cooperative_revokes(subscriptions, assignment):
        for member_id, partitions in assignment.items():
            subscriptions[member_id] = owned(subscriptions[member_id].topics, partitions)
        new = assignor.assign(partitions_per_topic, subscriptions)
        assignment.clear()
        assignment.update(new)
        rebalances += 1
        assert rebalances <= 4
    verify_validity_and_balance(subscriptions, assignment, partitions_per_topic)


# ---------------------------------------------------------------------------- protocol bytes
def test_subscription_round_trip_and_canonical_bytes():
    s = Subscription(("b", "a"), b"\x00\x01", (("b", 1), ("a", 0)), 7, group_instance_id="i1")
    data = encode_subscription(s)
    assert json.loads(data) == {"v": 1, "topics": ["a", "b"], "owned_partitions": [["a", 0], ["b", 1]],
                                "generation_id": 7, "user_data": "AAE="}
    back = decode_subscription(data, "i1")
    assert back == Subscription(("a", "b"), b"\x00\x01", (("a", 0), ("b", 1)), 7, "i1")
    assert encode_subscription(Subscription(("a", "b"), b"\x00\x01", (("a", 0), ("b", 1)), 7)) == data
    assert decode_subscription(encode_subscription(sub(["t"]))) == Subscription(("t",))
    assert sub(["t"]).generation is None and owned(["t"], [], 0).generation == 0


def test_assignment_round_trip_and_empty_bytes():
    a = Assignment((("t", 2), ("t", 0)), b"x")
    assert json.loads(encode_assignment(a)) == {"v": 1, "partitions": [["t", 2], ["t", 0]], "user_data": "eA=="}
    assert decode_assignment(encode_assignment(a)) == a
    assert decode_assignment(b"") == Assignment(())


@pytest.mark.parametrize("data", [b"not json", b"[]", b'{"v": 2, "topics": []}', b'{"v": 1, "topics": "t"}',
                                  b'{"v": 1, "topics": [], "owned_partitions": [["t"]]}',
                                  b'{"v": 1, "topics": [], "user_data": "!!"}'])
def test_bad_subscription_bytes_are_refused(data):
    with pytest.raises(ConsumerProtocolError):
        decode_subscription(data)


def test_bad_assignment_bytes_are_refused():
    with pytest.raises(ConsumerProtocolError, match="unknown version 9"):
        decode_assignment(b'{"v": 9}')


def test_assignor_names_and_protocols():
    assert sorted(ASSIGNORS) == ["cooperative-sticky", "range", "roundrobin"]
    assert isinstance(create_assignor("range"), RangeAssignor)
    assert RangeAssignor().supported_protocols() == [RebalanceProtocol.EAGER]
    assert RoundRobinAssignor().supported_protocols() == [RebalanceProtocol.EAGER]
    assert CooperativeStickyAssignor().supported_protocols() == [RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER]
    with pytest.raises(ValueError, match="unknown partition assignor 'sticky'"):
        create_assignor("sticky")


def test_java_hash_map_order():
    # Java's String.hashCode of "consumer1".."consumer4" are consecutive; the spread hash puts
    # them in buckets 12, 11, 10, 9 of a 16-slot table: a HashMap iterates them backwards
    assert java_hash_map_order(["consumer1", "consumer2", "consumer3", "consumer4"]) == \
        ["consumer4", "consumer3", "consumer2", "consumer1"]
    assert java_hash_map_order([]) == []


# ---------------------------------------------------------------------------- RangeAssignorTest
def test_range_one_consumer_no_topic():
    assert RangeAssignor().assign({}, {consumer1: sub([])}) == {consumer1: []}


def test_range_one_consumer_nonexistent_topic():
    assert RangeAssignor().assign({}, {consumer1: sub([topic1])}) == {consumer1: []}


def test_range_one_consumer_one_topic():
    assert RangeAssignor().assign({topic1: 3}, {consumer1: sub([topic1])}) == \
        {consumer1: [tp(topic1, 0), tp(topic1, 1), tp(topic1, 2)]}


def test_range_only_assigns_partitions_from_subscribed_topics():
    assert RangeAssignor().assign({topic1: 3, "other": 3}, {consumer1: sub([topic1])}) == \
        {consumer1: [tp(topic1, 0), tp(topic1, 1), tp(topic1, 2)]}


def test_range_one_consumer_multiple_topics():
    assert RangeAssignor().assign({topic1: 1, topic2: 2}, {consumer1: sub([topic1, topic2])}) == \
        {consumer1: [tp(topic1, 0), tp(topic2, 0), tp(topic2, 1)]}


def test_range_two_consumers_one_topic_one_partition():
    assert RangeAssignor().assign({topic1: 1}, {consumer1: sub([topic1]), consumer2: sub([topic1])}) == \
        {consumer1: [tp(topic1, 0)], consumer2: []}


def test_range_two_consumers_one_topic_two_partitions():
    assert RangeAssignor().assign({topic1: 2}, {consumer1: sub([topic1]), consumer2: sub([topic1])}) == \
        {consumer1: [tp(topic1, 0)], consumer2: [tp(topic1, 1)]}


def test_range_two_consumers_one_topic_three_partitions():
    # the first consumer gets the extra partition
    assert RangeAssignor().assign({topic1: 3}, {consumer1: sub([topic1]), consumer2: sub([topic1])}) == \
        {consumer1: [tp(topic1, 0), tp(topic1, 1)], consumer2: [tp(topic1, 2)]}


def test_range_multiple_consumers_mixed_topics():
    result = RangeAssignor().assign({topic1: 3, topic2: 2}, {consumer1: sub([topic1]), consumer2: sub([topic1, topic2]),
                                                             consumer3: sub([topic1])})
    assert result == {consumer1: [tp(topic1, 0)], consumer2: [tp(topic1, 1), tp(topic2, 0), tp(topic2, 1)],
                      consumer3: [tp(topic1, 2)]}


def test_range_two_consumers_two_topics_six_partitions():
    result = RangeAssignor().assign({topic1: 3, topic2: 3}, {consumer1: sub([topic1, topic2]),
                                                             consumer2: sub([topic1, topic2])})
    assert result == {consumer1: [tp(topic1, 0), tp(topic1, 1), tp(topic2, 0), tp(topic2, 1)],
                      consumer2: [tp(topic1, 2), tp(topic2, 2)]}


def test_range_two_static_consumers_are_ordered_by_instance_id():
    # "consumer-a" sorts before "consumer-b", but their instance ids decide
    result = RangeAssignor().assign({topic1: 3, topic2: 3}, {"consumer-b": sub([topic1, topic2], "instance1"),
                                                             "consumer-a": sub([topic1, topic2], "instance2")})
    assert result == {"consumer-b": [tp(topic1, 0), tp(topic1, 1), tp(topic2, 0), tp(topic2, 1)],
                      "consumer-a": [tp(topic1, 2), tp(topic2, 2)]}


def test_range_static_consumer_goes_before_dynamic_one():
    result = RangeAssignor().assign({topic1: 3, topic2: 3}, {"consumer-b": sub([topic1, topic2], "instance1"),
                                                             "consumer-a": sub([topic1, topic2])})
    assert result == {"consumer-b": [tp(topic1, 0), tp(topic1, 1), tp(topic2, 0), tp(topic2, 1)],
                      "consumer-a": [tp(topic1, 2), tp(topic2, 2)]}


def test_range_static_member_assignment_persistent():
    consumers = {f"consumer{i}": sub([topic1, topic2], f"instance{i}") for i in (1, 2, 3)}
    consumers[consumer4] = sub([topic1, topic2])
    expected = {consumer1: [tp(topic1, 0), tp(topic1, 1), tp(topic2, 0)], consumer2: [tp(topic1, 2), tp(topic2, 1)],
                consumer3: [tp(topic1, 3), tp(topic2, 2)], consumer4: [tp(topic1, 4), tp(topic2, 3)]}
    assert RangeAssignor().assign({topic1: 5, topic2: 4}, consumers) == expected
    # a new dynamic member replaces the dynamic one: the static members keep theirs
    del consumers[consumer4]
    consumers["consumer5"] = sub([topic1, topic2])
    expected["consumer5"] = expected.pop(consumer4)
    assert RangeAssignor().assign({topic1: 5, topic2: 4}, consumers) == expected


def by_instance(assignment, consumers):
    return {consumers[m].group_instance_id: tps for m, tps in assignment.items()}


@pytest.mark.parametrize("assignor, expected", [
    (RangeAssignor(), {"instance1": [tp(topic1, 0), tp(topic1, 1), tp(topic2, 0), tp(topic2, 1)],
                       "instance2": [tp(topic1, 2), tp(topic1, 3), tp(topic2, 2), tp(topic2, 3)],
                       "instance3": [tp(topic1, 4), tp(topic2, 4)]}),
    (RoundRobinAssignor(), {"instance1": [tp(topic1, 0), tp(topic1, 3), tp(topic2, 1), tp(topic2, 4)],
                            "instance2": [tp(topic1, 1), tp(topic1, 4), tp(topic2, 2)],
                            "instance3": [tp(topic1, 2), tp(topic2, 0), tp(topic2, 3)]}),
])
def test_static_member_assignment_persistent_after_member_id_changes(assignor, expected):
    consumers = {f"consumer{i}": sub([topic1, topic2], f"instance{i}") for i in (1, 2, 3)}
    assert by_instance(assignor.assign({topic1: 5, topic2: 5}, consumers), consumers) == expected
    consumers[consumer4] = consumers.pop(consumer3)
    consumers["consumer5"] = consumers.pop(consumer2)
    assert by_instance(assignor.assign({topic1: 5, topic2: 5}, consumers), consumers) == expected


# ---------------------------------------------------------------------------- RoundRobinAssignorTest
def test_roundrobin_one_consumer():
    rr = RoundRobinAssignor()
    assert rr.assign({}, {consumer: sub([])}) == {consumer: []}
    assert rr.assign({}, {consumer: sub([topic])}) == {consumer: []}
    assert rr.assign({topic: 3}, {consumer: sub([topic])}) == {consumer: [tp(topic, 0), tp(topic, 1), tp(topic, 2)]}
    assert rr.assign({topic: 3, "other": 3}, {consumer: sub([topic])}) == \
        {consumer: [tp(topic, 0), tp(topic, 1), tp(topic, 2)]}
    assert rr.assign({topic1: 1, topic2: 2}, {consumer: sub([topic1, topic2])}) == \
        {consumer: [tp(topic1, 0), tp(topic2, 0), tp(topic2, 1)]}


def test_roundrobin_two_consumers_one_topic():
    rr = RoundRobinAssignor()
    assert rr.assign({topic: 1}, {consumer1: sub([topic]), consumer2: sub([topic])}) == \
        {consumer1: [tp(topic, 0)], consumer2: []}
    assert rr.assign({topic: 2}, {consumer1: sub([topic]), consumer2: sub([topic])}) == \
        {consumer1: [tp(topic, 0)], consumer2: [tp(topic, 1)]}


def test_roundrobin_multiple_consumers_mixed_topics():
    result = RoundRobinAssignor().assign({topic1: 3, topic2: 2}, {consumer1: sub([topic1]),
                                                                  consumer2: sub([topic1, topic2]),
                                                                  consumer3: sub([topic1])})
    assert result == {consumer1: [tp(topic1, 0)], consumer2: [tp(topic1, 1), tp(topic2, 0), tp(topic2, 1)],
                      consumer3: [tp(topic1, 2)]}


def test_roundrobin_skips_members_not_subscribed():
    # the javadoc's example: t0 (1), t1 (2), t2 (3) partitions
    result = RoundRobinAssignor().assign({"t0": 1, "t1": 2, "t2": 3}, {"C0": sub(["t0"]), "C1": sub(["t0", "t1"]),
                                                                       "C2": sub(["t0", "t1", "t2"])})
    assert result == {"C0": [tp("t0", 0)], "C1": [tp("t1", 0)], "C2": [tp("t1", 1), tp("t2", 0), tp("t2", 1),
                                                                        tp("t2", 2)]}


@pytest.mark.parametrize("instances", [(None, None), ("instance1", "instance2"), ("instance1", None)])
def test_roundrobin_two_consumers_two_topics_six_partitions(instances):
    # dynamic: by member id; static: by instance id ("consumer-b" first); one static: it goes first
    names = (consumer1, consumer2) if instances == (None, None) else ("consumer-b", "consumer-a")
    result = RoundRobinAssignor().assign({topic1: 3, topic2: 3}, {names[0]: sub([topic1, topic2], instances[0]),
                                                                  names[1]: sub([topic1, topic2], instances[1])})
    assert result == {names[0]: [tp(topic1, 0), tp(topic1, 2), tp(topic2, 1)],
                      names[1]: [tp(topic1, 1), tp(topic2, 0), tp(topic2, 2)]}


def test_roundrobin_static_member_assignment_persistent():
    consumers = {f"consumer{i}": sub([topic1, topic2], f"instance{i}") for i in (1, 2, 3)}
    consumers[consumer4] = sub([topic1, topic2])
    expected = {consumer1: [tp(topic1, 0), tp(topic2, 1)], consumer2: [tp(topic1, 1), tp(topic2, 2)],
                consumer3: [tp(topic1, 2)], consumer4: [tp(topic2, 0)]}
    assert RoundRobinAssignor().assign({topic1: 3, topic2: 3}, consumers) == expected
    del consumers[consumer4]
    consumers["consumer5"] = sub([topic1, topic2])
    expected["consumer5"] = expected.pop(consumer4)
    assert RoundRobinAssignor().assign({topic1: 3, topic2: 3}, consumers) == expected


# ---------------------------------------------------------------------------- sticky (AbstractStickyAssignorTest)
@pytest.fixture
def sticky():
    return CooperativeStickyAssignor()


def test_sticky_one_consumer(sticky):
    assert sticky.assign({}, {consumer: sub([])}) == {consumer: []}
    assert sticky.assign({}, {consumer: sub([topic])}) == {consumer: []}
    assert sticky.assign({topic: 3}, {consumer: sub([topic])}) == {consumer: [tp(topic, 0), tp(topic, 1), tp(topic, 2)]}
    assert sticky.partitions_transferring_ownership == {}
    assert sticky.assign({topic1: 1, topic2: 2}, {consumer: sub([topic1, topic2])}) == \
        {consumer: [tp(topic1, 0), tp(topic2, 0), tp(topic2, 1)]}


def test_sticky_only_assigns_partitions_from_subscribed_topics(sticky):
    subscriptions = {consumer: owned([topic], [tp(topic, 0), tp(topic, 1), tp("other", 0), tp("other", 1)])}
    assert sticky.assign({topic: 2}, subscriptions) == {consumer: [tp(topic, 0), tp(topic, 1)]}
    assert sticky.partitions_transferring_ownership == {}


def test_sticky_two_consumers_one_topic(sticky):
    ppt = {topic: 1}
    subscriptions = {consumer1: sub([topic]), consumer2: sub([topic])}
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {}
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    ppt = {topic: 2}
    subscriptions = {consumer1: sub([topic]), consumer2: sub([topic])}
    assert sticky.assign(ppt, subscriptions) == {consumer2: [tp(topic, 1)], consumer1: [tp(topic, 0)]}


def test_sticky_multiple_consumers_mixed_topic_subscriptions(sticky):
    ppt = {topic1: 3, topic2: 2}
    subscriptions = {consumer1: sub([topic1]), consumer2: sub([topic1, topic2]), consumer3: sub([topic1])}
    assignment = sticky.assign(ppt, subscriptions)
    assert assignment == {consumer1: [tp(topic1, 0), tp(topic1, 2)], consumer2: [tp(topic2, 0), tp(topic2, 1)],
                          consumer3: [tp(topic1, 1)]}
    assert sticky.partitions_transferring_ownership is None  # the general algorithm
    verify_cooperative(sticky, subscriptions, assignment, ppt)


def test_sticky_two_consumers_two_topics_six_partitions(sticky):
    ppt = {topic1: 3, topic2: 3}
    assignment = sticky.assign(ppt, {consumer1: sub([topic1, topic2]), consumer2: sub([topic1, topic2])})
    assert assignment[consumer1] == [tp(topic1, 0), tp(topic1, 2), tp(topic2, 1)]
    assert assignment[consumer2] == [tp(topic1, 1), tp(topic2, 0), tp(topic2, 2)]


def test_sticky_consumer_owning_min_quota_expected_max_quota(sticky):
    ppt = {topic1: 2, topic2: 3}
    topics = [topic1, topic2]
    assignment = sticky.assign(ppt, {consumer1: owned(topics, [tp(topic1, 0), tp(topic2, 1)]),
                                     consumer2: owned(topics, [tp(topic1, 1), tp(topic2, 2)])})
    assert assignment[consumer1] == [tp(topic1, 0), tp(topic2, 1), tp(topic2, 0)]
    assert assignment[consumer2] == [tp(topic1, 1), tp(topic2, 2)]
    assert sticky.partitions_transferring_ownership == {}


def test_sticky_max_quota_consumers_more_than_expected(sticky):
    ppt = {topic1: 2, topic2: 2}
    topics = [topic1, topic2]
    subscriptions = {consumer1: owned(topics, [tp(topic1, 0), tp(topic2, 0)]),
                     consumer2: owned(topics, [tp(topic1, 1), tp(topic2, 1)]),
                     consumer3: owned(topics, [])}
    assignment = sticky.assign(ppt, subscriptions)
    # consumer2 comes first in Kafka's HashMap order: it keeps both; consumer1 gives topic2-0 up
    assert sticky.partitions_transferring_ownership == {tp(topic2, 0): consumer3}
    assert assignment == {consumer3: [], consumer2: [tp(topic1, 1), tp(topic2, 1)], consumer1: [tp(topic1, 0)]}
    verify_cooperative(sticky, subscriptions, assignment, ppt)  # the follow-up hands topic2-0 over
    assert assignment == {consumer3: [tp(topic2, 0)], consumer2: [tp(topic1, 1), tp(topic2, 1)],
                          consumer1: [tp(topic1, 0)]}
    assert is_fully_balanced(assignment)


def test_sticky_all_consumers_under_min_quota(sticky):
    ppt = {topic1: 2, topic2: 3}
    topics = [topic1, topic2]
    assignment = sticky.assign(ppt, {consumer1: owned(topics, [tp(topic1, 0)]),
                                     consumer2: owned(topics, [tp(topic1, 1)]), consumer3: owned(topics, [])})
    assert sticky.partitions_transferring_ownership == {}
    assert assignment[consumer1] == [tp(topic1, 0), tp(topic2, 1)]
    assert assignment[consumer2] == [tp(topic1, 1), tp(topic2, 2)]
    assert assignment[consumer3] == [tp(topic2, 0)]


def test_sticky_add_remove_consumer_one_topic(sticky):
    ppt = {topic: 3}
    subscriptions = {consumer1: sub([topic])}
    assignment = sticky.assign(ppt, subscriptions)
    assert assignment[consumer1] == [tp(topic, 0), tp(topic, 1), tp(topic, 2)]

    subscriptions[consumer1] = owned([topic], assignment[consumer1])
    subscriptions[consumer2] = owned([topic], [])
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {tp(topic, 2): consumer2}
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    assert assignment[consumer1] == [tp(topic, 0), tp(topic, 1)]
    assert assignment[consumer2] == [tp(topic, 2)]

    del subscriptions[consumer1]
    subscriptions[consumer2] = owned([topic], assignment[consumer2])
    assignment = sticky.assign(ppt, subscriptions)
    assert set(assignment[consumer2]) == {tp(topic, 0), tp(topic, 1), tp(topic, 2)}
    assert sticky.partitions_transferring_ownership == {}


def test_sticky_topic_balance_after_reassignment(sticky):
    ppt = {topic1: 12, topic2: 12}
    topics = [topic1, topic2]

    def per_topic(assignment, expected):
        for tps in assignment.values():
            assert sum(t == topic1 for t, _ in tps) == expected and sum(t == topic2 for t, _ in tps) == expected

    subscriptions = {consumer1: sub(topics)}
    assignment = sticky.assign(ppt, subscriptions)
    per_topic(assignment, 12)
    subscriptions[consumer1] = owned(topics, assignment[consumer1])
    subscriptions[consumer2] = owned(topics, [])
    assignment = sticky.assign(ppt, subscriptions)
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    per_topic(assignment, 6)
    for c in (consumer1, consumer2):
        subscriptions[c] = owned(topics, assignment[c])
    subscriptions[consumer3] = owned(topics, [])
    subscriptions[consumer4] = owned(topics, [])
    assignment = sticky.assign(ppt, subscriptions)
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    per_topic(assignment, 3)
    del subscriptions[consumer1], subscriptions[consumer2]
    for c in (consumer3, consumer4):
        subscriptions[c] = owned(topics, assignment[c])
    assignment = sticky.assign(ppt, subscriptions)
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    per_topic(assignment, 6)
    assert sticky.partitions_transferring_ownership == {}


def test_sticky_add_remove_two_consumers_two_topics(sticky):
    ppt = {topic1: 3, topic2: 4}
    topics = [topic1, topic2]
    subscriptions = {consumer1: sub(topics), consumer2: sub(topics)}
    assignment = sticky.assign(ppt, subscriptions)
    assert assignment[consumer1] == [tp(topic1, 0), tp(topic1, 2), tp(topic2, 1), tp(topic2, 3)]
    assert assignment[consumer2] == [tp(topic1, 1), tp(topic2, 0), tp(topic2, 2)]
    assert sticky.partitions_transferring_ownership == {}

    # add 2 consumers
    subscriptions = {consumer1: owned(topics, assignment[consumer1]), consumer2: owned(topics, assignment[consumer2]),
                     consumer3: owned(topics, []), consumer4: owned(topics, [])}
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {tp(topic1, 2): consumer3, tp(topic2, 3): consumer3,
                                                        tp(topic2, 2): consumer4}
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    assert assignment[consumer1] == [tp(topic1, 0), tp(topic2, 1)]
    assert assignment[consumer2] == [tp(topic2, 0), tp(topic1, 1)]
    assert assignment[consumer3] == [tp(topic1, 2), tp(topic2, 3)]
    assert assignment[consumer4] == [tp(topic2, 2)]

    # remove 2 consumers
    del subscriptions[consumer1], subscriptions[consumer2]
    subscriptions[consumer3] = owned(topics, assignment[consumer3])
    subscriptions[consumer4] = owned(topics, assignment[consumer4])
    assignment = sticky.assign(ppt, subscriptions)
    assert assignment[consumer3] == [tp(topic1, 2), tp(topic2, 3), tp(topic1, 0), tp(topic2, 1)]
    assert assignment[consumer4] == [tp(topic2, 2), tp(topic1, 1), tp(topic2, 0)]
    assert sticky.partitions_transferring_ownership == {}


def test_sticky_poor_round_robin_assignment_scenario(sticky):
    ppt = {f"topic{i}": (i % 2) + 1 for i in range(1, 6)}
    all_topics = [f"topic{i}" for i in range(1, 6)]
    subscriptions = {"consumer1": sub(all_topics), "consumer2": sub(["topic1", "topic3", "topic5"]),
                     "consumer3": sub(["topic1", "topic3", "topic5"]), "consumer4": sub(all_topics)}
    assignment = sticky.assign(ppt, subscriptions)
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    assert sorted(len(tps) for tps in assignment.values()) == [2, 2, 2, 2]


def test_sticky_add_remove_topic_two_consumers(sticky):
    ppt = {topic: 3}
    subscriptions = {consumer1: sub([topic]), consumer2: sub([topic])}
    first = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {} and is_fully_balanced(first)
    ppt[topic2] = 3
    subscriptions = {c: owned([topic, topic2], first[c]) for c in (consumer1, consumer2)}
    second = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {}
    assert len(second[consumer1]) == len(second[consumer2]) == 3
    assert all(set(first[c]) <= set(second[c]) for c in first)  # sticky
    del ppt[topic]
    subscriptions = {c: owned([topic2], second[c]) for c in (consumer1, consumer2)}
    third = sticky.assign(ppt, subscriptions)
    assert sorted(len(tps) for tps in third.values()) == [1, 2]
    assert all(set(third[c]) <= set(second[c]) for c in third)


def name(prefix: str, i: int, max_num: int) -> str:
    """Kafka's ``getCanonicalName``: zero-padded to the digits of ``max_num``."""
    return f"{prefix}{i:0{len(str(max_num))}d}"


def test_sticky_reassignment_after_one_consumer_leaves(sticky):
    ppt = {name("t", i, 20): i for i in range(1, 20)}
    subscriptions = {name("c", i, 20): sub([name("t", j, 20) for j in range(1, i + 1)]) for i in range(1, 20)}
    assignment = sticky.assign(ppt, subscriptions)
    verify_validity_and_balance(subscriptions, assignment, ppt)
    subscriptions = {c: owned(s.topics, assignment[c]) for c, s in subscriptions.items()}
    del subscriptions["c10"]
    assignment = sticky.assign(ppt, subscriptions)
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    assert sticky.is_sticky()


def test_sticky_reassignment_after_one_consumer_added(sticky):
    ppt = {"topic": 20}
    subscriptions = {name("c", i, 10): sub(["topic"]) for i in range(1, 10)}
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {}
    verify_validity_and_balance(subscriptions, assignment, ppt)
    subscriptions[name("c", 10, 10)] = sub(["topic"])
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {}
    verify_cooperative(sticky, subscriptions, assignment, ppt)


def test_sticky_same_subscriptions(sticky):
    ppt = {name("t", i, 15): i for i in range(1, 15)}
    topics = list(ppt)
    subscriptions = {name("c", i, 9): sub(topics) for i in range(1, 9)}
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {}
    verify_validity_and_balance(subscriptions, assignment, ppt)
    subscriptions = {c: owned(topics, assignment[c]) for c in subscriptions}
    del subscriptions[name("c", 5, 9)]
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {}
    verify_cooperative(sticky, subscriptions, assignment, ppt)


def test_sticky_new_subscription(sticky):
    ppt = {name("t", i, 5): 1 for i in range(1, 5)}
    subscriptions = {name("c", i, 3): sub([name("t", j, 5) for j in range(i, 3 * i - 1)]) for i in range(3)}
    assignment = sticky.assign(ppt, subscriptions)
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    c0 = name("c", 0, 3)
    subscriptions[c0] = dataclasses.replace(subscriptions[c0], topics=subscriptions[c0].topics + (name("t", 1, 5),))
    assignment = sticky.assign(ppt, subscriptions)
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    assert sticky.is_sticky()


def test_sticky_move_existing_assignments(sticky):
    ppt = {f"topic{i}": 1 for i in range(1, 7)}
    subscriptions = {consumer1: owned([topic1, topic2], [tp(topic1, 0)]),
                     consumer2: owned([topic1, topic2, topic3, "topic4"], [tp(topic2, 0), tp(topic3, 0)]),
                     consumer3: owned([topic2, topic3, "topic4", "topic5", "topic6"],
                                      [tp("topic4", 0), tp("topic5", 0), tp("topic6", 0)])}
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership is None
    verify_cooperative(sticky, subscriptions, assignment, ppt)


def test_sticky_stickiness(sticky):
    ppt = {topic1: 3}
    subscriptions = {c: sub([topic1]) for c in (consumer1, consumer2, consumer3, consumer4)}
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {}
    assert all(len(tps) <= 1 for tps in assignment.values())
    before = {c: tps[0] for c, tps in assignment.items() if tps}
    del subscriptions[consumer1]  # the potential group leader
    subscriptions = {c: owned([topic1], assignment[c]) for c in subscriptions}
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {}
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    for c, tps in assignment.items():
        assert len(tps) == 1
        assert c not in before or tps == [before[c]], f"stickiness was not honored for {c}"


def test_sticky_assignment_updated_for_deleted_topic(sticky):
    assignment = sticky.assign({topic1: 1, topic3: 100}, {consumer: sub([topic1, topic2, topic3])})
    assert sticky.partitions_transferring_ownership == {}
    assert list(assignment) == [consumer] and len(assignment[consumer]) == 101


def test_sticky_no_exception_when_only_subscribed_topic_deleted(sticky):
    assignment = sticky.assign({topic: 3}, {consumer: sub([topic])})
    assignment = sticky.assign({}, {consumer: owned([topic], assignment[consumer])})
    assert assignment == {consumer: []} and sticky.partitions_transferring_ownership == {}


def test_sticky_all_consumers_reach_expected_quota(sticky):
    assignment = sticky.assign({topic: 4}, {consumer1: owned([topic], [tp(topic, 0), tp(topic, 1)]),
                                            consumer2: owned([topic], [tp(topic, 2)]), consumer3: owned([topic], [])})
    assert assignment == {consumer3: [tp(topic, 3)], consumer2: [tp(topic, 2)], consumer1: [tp(topic, 0), tp(topic, 1)]}
    assert sticky.partitions_transferring_ownership == {}


@pytest.mark.parametrize("stale_generation", [9, DEFAULT_GENERATION])
def test_sticky_owned_partitions_invalidated_for_stale_or_no_generation(sticky, stale_generation):
    ppt = {topic: 3, topic2: 3}
    claimed = [tp(topic, 0), tp(topic, 2), tp(topic2, 1)]
    subscriptions = {consumer1: owned([topic, topic2], claimed, 10),
                     consumer2: owned([topic, topic2], claimed, stale_generation)}
    assignment = sticky.assign(ppt, subscriptions)
    assert as_sets(assignment) == {consumer1: set(claimed), consumer2: {tp(topic, 1), tp(topic2, 0), tp(topic2, 2)}}
    assert sticky.partitions_transferring_ownership == {}
    assert sticky.max_generation == 10
    verify_cooperative(sticky, subscriptions, assignment, ppt)


def test_sticky_partition_claimed_by_multiple_consumers_in_same_generation(sticky):
    ppt = {topic: 3}
    subscriptions = {consumer1: owned([topic], [tp(topic, 0), tp(topic, 1)]),
                     consumer2: owned([topic], [tp(topic, 0), tp(topic, 2)]), consumer3: owned([topic], [])}
    assignment = sticky.assign(ppt, subscriptions)
    assert sticky.partitions_transferring_ownership == {tp(topic, 0): consumer3}
    # cooperative: topic-0 counts as owned until both claimants revoked it
    assert assignment == {consumer3: [], consumer2: [tp(topic, 2)], consumer1: [tp(topic, 1)]}
    verify_cooperative(sticky, subscriptions, assignment, ppt)
    assert assignment == {consumer3: [tp(topic, 0)], consumer2: [tp(topic, 2)], consumer1: [tp(topic, 1)]}


def test_cooperative_claimed_by_multiple_consumers_with_unequal_partitions_per_consumer(sticky):
    assignment = sticky.assign({topic: 4}, {consumer1: owned([topic], [tp(topic, 0), tp(topic, 1)]),
                                            consumer2: owned([topic], [tp(topic, 0), tp(topic, 2)]),
                                            consumer3: owned([topic], [])})
    assert assignment[consumer1] == [tp(topic, 1), tp(topic, 3)]
    assert assignment[consumer2] == [tp(topic, 2)]
    assert assignment[consumer3] == []


def test_sticky_ensure_partitions_assigned_to_highest_generation(sticky):
    ppt = {topic: 3, topic2: 3, topic3: 3}
    topics = [topic, topic2, topic3]
    subscriptions = {consumer1: owned(topics, [tp(topic, 0), tp(topic2, 0), tp(topic3, 0)], 10),
                     consumer2: owned(topics, [tp(topic, 1), tp(topic2, 1), tp(topic3, 1)], 9),
                     consumer3: owned(topics, [tp(topic2, 1), tp(topic3, 0), tp(topic3, 2)], 8)}
    assignment = sticky.assign(ppt, subscriptions)
    assert as_sets(assignment) == {consumer1: {tp(topic, 0), tp(topic2, 0), tp(topic3, 0)},
                                   consumer2: {tp(topic, 1), tp(topic2, 1), tp(topic3, 1)},
                                   consumer3: {tp(topic, 2), tp(topic2, 2), tp(topic3, 2)}}
    assert sticky.partitions_transferring_ownership == {}


def test_sticky_no_reassignment_on_current_members(sticky):
    ppt = {topic: 3, topic1: 3, topic2: 3, topic3: 3}
    topics = [topic, topic2, topic3, topic1]
    subscriptions = {consumer1: owned(topics, [], DEFAULT_GENERATION),
                     consumer2: owned(topics, [tp(topic, 0), tp(topic2, 0), tp(topic1, 0)], 9),
                     consumer3: owned(topics, [tp(topic3, 2), tp(topic2, 2), tp(topic1, 1)], 8),
                     consumer4: owned(topics, [tp(topic3, 1), tp(topic, 1), tp(topic, 2)], 7)}
    assignment = sticky.assign(ppt, subscriptions)
    assert set(assignment[consumer1]) == {tp(topic1, 2), tp(topic2, 1), tp(topic3, 0)}
    assert sticky.partitions_transferring_ownership == {}
    verify_cooperative(sticky, subscriptions, assignment, ppt)


def test_sticky_owned_partitions_invalidated_with_multiple_generations(sticky):
    ppt = {topic: 3, topic2: 3}
    subscriptions = {consumer1: owned([topic, topic2], [tp(topic, 0), tp(topic2, 1), tp(topic, 1)], 10),
                     consumer2: owned([topic, topic2], [tp(topic, 0), tp(topic2, 1), tp(topic2, 2)], 8)}
    assignment = sticky.assign(ppt, subscriptions)
    assert as_sets(assignment) == {consumer1: {tp(topic, 0), tp(topic2, 1), tp(topic, 1)},
                                   consumer2: {tp(topic, 2), tp(topic2, 2), tp(topic2, 0)}}
    assert sticky.partitions_transferring_ownership == {}


# ---------------------------------------------------------------------------- CooperativeStickyAssignorTest
def test_cooperative_encodes_generation_in_user_data():
    assignor = CooperativeStickyAssignor()
    data = assignor.subscription_user_data([topic])
    assert data == struct.pack(">i", -1)
    assert assignor.member_data(Subscription((topic,), data)) == ((), DEFAULT_GENERATION)
    assignor.on_assignment(Assignment(()), 10)
    assert assignor.member_data(Subscription((topic,), assignor.subscription_user_data([topic]))) == ((), 10)
    assert assignor.member_data(Subscription((topic,))) == ((), None)
    assert assignor.member_data(Subscription((topic,), b"\x01")) == ((), DEFAULT_GENERATION)  # unreadable


def test_cooperative_member_data_prefers_the_subscription_fields():
    assignor = CooperativeStickyAssignor()
    assignor.on_assignment(Assignment(()), GENERATION)
    user_data = assignor.subscription_user_data([topic])
    # no generation in the subscription: the user data's, with the subscription's owned partitions
    assert assignor.member_data(Subscription((topic,), user_data, (tp(topic, 0),))) == ((tp(topic, 0),), GENERATION)
    # a generation in the subscription wins, with its (empty) owned partitions
    assignor.on_assignment(Assignment(()), GENERATION - 1)
    older = assignor.subscription_user_data([topic])
    assert assignor.member_data(Subscription((topic,), older, (), GENERATION)) == ((), GENERATION)


def test_cooperative_with_old_version_subscriptions():
    # members whose generation is only in the user data (Kafka's V1 subscriptions)
    assignor = CooperativeStickyAssignor()
    assignor.on_assignment(Assignment(()), GENERATION)
    user_data = assignor.subscription_user_data([topic1])
    subscriptions = {consumer1: Subscription((topic1,), user_data, (tp(topic1, 0),)),
                     consumer2: Subscription((topic1,), user_data, (tp(topic1, 1),)),
                     consumer3: owned([topic1], [])}
    assert assignor.assign({topic1: 3}, subscriptions) == {consumer3: [tp(topic1, 2)], consumer2: [tp(topic1, 1)],
                                                           consumer1: [tp(topic1, 0)]}


def test_cooperative_general_case_holds_back_moving_partitions():
    # unequal subscriptions: the partitions transferring ownership are computed afterwards
    assignor = CooperativeStickyAssignor()
    ppt = {topic1: 4, topic2: 1}
    subscriptions = {consumer1: owned([topic1, topic2], [tp(topic1, 0), tp(topic1, 1), tp(topic1, 2), tp(topic1, 3)]),
                     consumer2: owned([topic1], [])}
    assignment = assignor.assign(ppt, subscriptions)
    assert assignor.partitions_transferring_ownership is None
    assert assignment[consumer2] == []  # what it will get is still owned by consumer1
    assert len(assignment[consumer1]) < 5
    verify_cooperative(assignor, subscriptions, assignment, ppt)
    assert sorted(len(tps) for tps in assignment.values()) == [2, 3]


def test_validate_cooperative_assignment():
    validate_cooperative_assignment({"a": [tp(topic, 0)]}, {"a": [], "b": []})
    with pytest.raises(StickyAssignmentError, match=r"\[\('topic', 0\)\]"):
        validate_cooperative_assignment({"a": [tp(topic, 0)], "b": []}, {"a": [], "b": [tp(topic, 0)]})


def test_perform_assignment_decodes_runs_and_encodes():
    members = [JoinGroupMember("m-2", None, encode_subscription(sub([topic]))),
               JoinGroupMember("m-1", "static-1", encode_subscription(sub([topic])))]
    result = perform_assignment(RangeAssignor(), members, {topic: 3})
    assert {m: decode_assignment(b).partitions for m, b in result.items()} == \
        {"m-1": (tp(topic, 0), tp(topic, 1)), "m-2": (tp(topic, 2),)}


def test_perform_assignment_refuses_a_cooperative_violation():
    class Stealing(RangeAssignor):
        def supported_protocols(self):
            return [RebalanceProtocol.COOPERATIVE]

    members = [JoinGroupMember("a", None, encode_subscription(owned([topic], [tp(topic, 0), tp(topic, 1)]))),
               JoinGroupMember("b", None, encode_subscription(owned([topic], [])))]
    with pytest.raises(StickyAssignmentError):
        perform_assignment(Stealing(), members, {topic: 2})
    assert perform_assignment(Stealing(), members, {topic: 2}, RebalanceProtocol.EAGER)


# ---------------------------------------------------------------------------- properties
MEMBER_NAMES = st.text(alphabet="abcxyz019-", min_size=1, max_size=8)


@st.composite
def groups(draw):
    topics = [f"t{i}" for i in range(draw(st.integers(1, 4)))]
    counts = {t: draw(st.integers(0, 7)) for t in topics}
    members = draw(st.lists(MEMBER_NAMES, min_size=1, max_size=6, unique=True))
    equal = draw(st.booleans())
    subscriptions = {m: sub(topics if equal else draw(st.lists(st.sampled_from(topics), min_size=1, unique=True)))
                     for m in members}
    return counts, subscriptions, equal


def check_exactly_once(counts, subscriptions, assignment):
    """Every partition of a subscribed topic is assigned once, to a subscriber."""
    seen = [p for tps in assignment.values() for p in tps]
    assert len(seen) == len(set(seen))
    subscribed = {t for s in subscriptions.values() for t in s.topics}
    assert set(seen) == {(t, p) for t in subscribed for p in range(counts[t])}
    for m, tps in assignment.items():
        assert all(t in subscriptions[m].topics for t, _ in tps)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups())
def test_property_range_and_roundrobin(group):
    counts, subscriptions, equal = group
    for assignor in (RangeAssignor(), RoundRobinAssignor()):
        assignment = assignor.assign(counts, subscriptions)
        check_exactly_once(counts, subscriptions, assignment)
        if equal and isinstance(assignor, RoundRobinAssignor):
            assert is_fully_balanced(assignment)
        if equal and isinstance(assignor, RangeAssignor):
            for t in counts:  # range balances each topic
                per_member = [sum(x == t for x, _ in tps) for tps in assignment.values()]
                assert max(per_member) - min(per_member) <= 1


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups(), st.lists(st.tuples(st.booleans(), MEMBER_NAMES), max_size=4))
def test_property_cooperative_sticky_over_membership_changes(group, changes):
    """Rounds of rebalances as members come and go: no partition goes to a new owner in the
    rebalance that revokes it; once nothing is revoked every partition is assigned exactly
    once, and equal subscriptions are balanced within one partition."""
    counts, subscriptions, equal = group
    assignor = CooperativeStickyAssignor()
    topics = next(iter(subscriptions.values())).topics
    assignment: dict = {}
    generation = 0
    for change in [None] + changes:
        if change is not None:
            add, member = change
            if add and member not in subscriptions:
                subscriptions[member] = owned(topics, [], DEFAULT_GENERATION)
            elif not add and len(subscriptions) > 1:
                subscriptions.pop(next(iter(subscriptions)))
        for _ in range(5):  # the rebalance, then the follow-ups it triggers
            generation += 1
            assignment = assignor.assign(counts, subscriptions)
            validate_cooperative_assignment({m: s.owned_partitions for m, s in subscriptions.items()}, assignment)
            revoked = cooperative_revokes(subscriptions, assignment)
            subscriptions = {m: dataclasses.replace(s, owned_partitions=tuple(assignment[m]), generation_id=generation)
                             for m, s in subscriptions.items()}
            if not revoked:
                break
        else:
            pytest.fail("the follow-up rebalances did not converge")
        check_exactly_once(counts, subscriptions, assignment)
        verify_validity_and_balance(subscriptions, assignment, counts)
        if equal:
            assert is_fully_balanced(assignment)
