"""Consumer groups as stored in ``__consumer_offsets``, read without the writer lease (what
``txlake groups list|describe`` shows, like ``kafka-consumer-groups.sh``).

The view replays the group records of every ``__consumer_offsets`` partition into a
private, passive :class:`~txlake.engine.group_coordinator.GroupCoordinator` (it never
writes and runs no timers), so it shows the last *persisted* state of each group: the
generation, protocol and members with their assignments as of the last completed
rebalance. Groups that only ever committed offsets (assign()-based consumers) appear as
Empty with no members, as Kafka's "simple" groups do. Committed offsets are the stable
ones (pending transactional offsets are not counted until their COMMIT marker).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from txlake.catalog.topic_names import CONSUMER_OFFSETS_TOPIC
from txlake.engine.group_coordinator import GroupCoordinator

from .assignors import decode_assignment

if TYPE_CHECKING:
    from txlake.engine.broker import Broker


@dataclass(frozen=True)
class GroupListing:
    """One group: id, state (Stable, Empty, ...), protocol type ("consumer", or "" for offsets only)."""

    group_id: str
    state: str
    protocol_type: str


@dataclass(frozen=True)
class PartitionLag:
    """A partition of a group: committed offset (-1 if none), log end offset, lag, owner."""

    topic: str
    partition: int
    current_offset: int
    log_end_offset: int
    lag: int | None
    member_id: str
    client_id: str


@dataclass
class GroupDetails:
    """DescribeGroups + the group's committed offsets, per partition."""

    group_id: str
    state: str
    generation_id: int
    protocol: str
    leader_id: str
    partitions: list[PartitionLag] = field(default_factory=list)


def _load(broker: "Broker") -> tuple[GroupCoordinator, set[str]]:
    """Replay every ``__consumer_offsets`` partition once: a passive coordinator holding the
    persisted groups, and the ids of every group with an offset-commit record."""
    coordinator = GroupCoordinator()                   # keeps nothing, schedules nothing
    offset_groups: set[str] = set()
    offsets = broker.group_offsets()
    topic = broker.topics().get(CONSUMER_OFFSETS_TOPIC)
    for p in range(len(topic.partitions) if topic is not None else 0):
        records = list(offsets.records(p))
        coordinator.load(records, f"{CONSUMER_OFFSETS_TOPIC}-{p}")
        for key, _ in records:
            k = json.loads(key)
            if "type" not in k:
                offset_groups.add(k["group"])
    return coordinator, offset_groups


def list_groups(broker: "Broker") -> list[GroupListing]:
    """Every consumer group of the storage root, sorted by id."""
    broker.refresh()
    coordinator, offset_groups = _load(broker)
    _, overviews = coordinator.handle_list_groups()
    listed = {o.group_id: GroupListing(o.group_id, o.state, o.protocol_type) for o in overviews}
    for group in offset_groups - set(listed):
        listed[group] = GroupListing(group, "Empty", "")
    return [listed[g] for g in sorted(listed)]


def describe_group(broker: "Broker", group_id: str) -> GroupDetails:
    """The group's state and, per partition it owns or has committed, offsets and lag
    (lag = high watermark - committed offset)."""
    broker.refresh()
    coordinator, _ = _load(broker)
    (desc,) = coordinator.handle_describe_groups([group_id])
    owner: dict[tuple[str, int], tuple[str, str]] = {}
    for m in desc.members:
        if m.assignment:
            for tp in decode_assignment(m.assignment).partitions:
                owner[tuple(tp)] = (m.member_id, m.client_id)
    committed = {tp: om for tp, (om, _) in broker.group_offsets().fetch(group_id, None, False).items() if om}
    details = GroupDetails(group_id, desc.state, desc.generation_id, desc.protocol, desc.leader_id)
    if desc.state == "Dead" and committed:
        details.state = "Empty"
    topics = broker.topics()
    for topic, partition in sorted(set(owner) | set(committed)):
        t = topics.get(topic)
        end = t.partitions[partition].high_watermark if t is not None and partition < len(t.partitions) else -1
        om = committed.get((topic, partition))
        current = om.offset if om is not None else -1
        member, client = owner.get((topic, partition), ("-", "-"))
        details.partitions.append(PartitionLag(topic, partition, current, end,
                                               end - current if current >= 0 and end >= 0 else None, member, client))
    return details
