"""Time and size retention (Kafka's ``deleteOldSegments``): which segments go, and applying it
with DeleteRecords."""

import pytest

from txlake.catalog.state import CREATE_TOPIC, CatalogState, SegmentInfo
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.engine.errors import Errors
from txlake.engine.log_retention import retention_targets

from helpers import payload

HOUR = 3_600_000


@pytest.fixture
def broker(storage):
    b = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, lease_ms=60_000))
    yield b
    b.close()


def segments(broker, topic, partition=0):
    p = broker.catalog.state.partition(topic, partition)
    return [(s.base_offset, s.last_offset, s.max_timestamp) for s in p.segments]


def fill(broker, topic, stamps, n=2):
    """One flush (segment) of ``n`` records per timestamp in ``stamps`` (ms)."""
    for i, ts in enumerate(stamps):
        broker.produce([ProduceBatch(topic, 0, payload(n, n * i, ts=ts - n + 1))])


def test_time_retention_deletes_leading_expired_segments_only(broker):
    broker.create_topics([("t", 1, {"retention.ms": str(HOUR)})])
    now = 100 * HOUR
    fill(broker, "t", [now - 3 * HOUR, now - 2 * HOUR, now - HOUR, now - 3 * HOUR, now])
    assert [s[:2] for s in segments(broker, "t")] == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
    # now - max_timestamp > retention.ms: exactly one hour old is kept; the 4th segment expired
    # too, but stays: the 3rd stops the deletion
    (target,) = retention_targets(broker.catalog.state, now)
    assert (target.topic, target.partition, target.log_start_offset, target.segments) == ("t", 0, 4, 2)
    p = broker.catalog.state.partition("t", 0)
    assert target.bytes == sum(s.size_bytes for s in p.segments[:2])
    (target,) = retention_targets(broker.catalog.state, now + 1)
    assert (target.log_start_offset, target.segments) == (8, 4)
    assert broker.delete_records([("t", 0, target.log_start_offset)])[0][:2] == (Errors.NO_ERROR, 8)
    assert [s[:2] for s in segments(broker, "t")] == [(8, 9)]
    assert retention_targets(broker.catalog.state, now + 1) == []
    # everything expired: the log start offset reaches the high watermark
    (target,) = retention_targets(broker.catalog.state, now + HOUR + 1)
    assert (target.log_start_offset, target.segments) == (10, 1)


def state_with_segments(sizes, config):
    """A catalog state with one partition of ``sizes`` (bytes) segments of 10 records each."""
    state = CatalogState()
    state.apply({"action": CREATE_TOPIC, "topic": "t", "topic_id": "id", "num_partitions": 1, "config": config})
    for i, size in enumerate(sizes):
        state.apply(SegmentInfo("t", 0, f"o{i}", 10 * i, 10 * i + 9, 10, size, 0, 0, 0, 1)
                    .to_action(10 * i + 10, 10 * i + 10))
    return state


@pytest.mark.parametrize("limit, start, count", [
    (1000, 20, 2),       # 1500 - 300 - 200 = 1000 >= 1000: two go
    (1001, 10, 1),       # one byte more: one goes
    (1200, 10, 1),       # 1500 - 300 = 1200 >= 1200
    (1201, None, 0),     # nothing can go without dropping below the limit
    (0, 50, 5),          # retention.bytes=0 empties the log: 1500 - 1500 = 0 >= 0
])
def test_size_retention_keeps_the_partition_at_or_above_retention_bytes(limit, start, count):
    state = state_with_segments([300, 200, 400, 100, 500], {"retention.bytes": str(limit), "retention.ms": "-1"})
    targets = retention_targets(state, 10**13)
    if start is None:
        assert targets == []
    else:
        (target,) = targets
        assert (target.log_start_offset, target.segments, target.bytes) == (start, count, [0, 300, 500, 900, 1000, 1500][count])


def test_policies_and_unlimited_retention_delete_nothing(broker):
    old = 1_000
    broker.create_topics([("compacted", 1, {"cleanup.policy": "compact", "retention.ms": "1"}),
                          ("both", 1, {"cleanup.policy": "compact,delete", "retention.ms": "1"}),
                          ("forever", 1, {"retention.ms": "-1"}),
                          ("default", 1, {})])
    for topic in ("compacted", "both", "forever", "default"):
        fill(broker, topic, [old])
    targets = retention_targets(broker.catalog.state, 10**13)
    assert [(t.topic, t.log_start_offset) for t in targets] == [("both", 2), ("default", 2)]
    # default retention.ms is 7 days
    assert [t.topic for t in retention_targets(broker.catalog.state, old + 7 * 24 * HOUR)] == ["both"]
