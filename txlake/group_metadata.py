"""The consumer group metadata a transactional producer sends with its offsets (KIP-447)."""

from __future__ import annotations


class ConsumerGroupMetadata:
    """Group id, generation id, member id and group instance id of a consumer (KIP-447).

    ``Consumer.consumer_group_metadata()`` returns it; ``Producer.send_offsets_to_transaction``
    sends it with the offsets, and the group coordinator refuses them from a stale generation
    (ILLEGAL_GENERATION), an unknown member (UNKNOWN_MEMBER_ID) or a replaced static member
    (FENCED_INSTANCE_ID). A consumer without membership (assign()) has generation -1.
    """

    def __init__(self, group_id: str, generation_id: int = -1, member_id: str = "", group_instance_id: str | None = None):
        self.group_id = group_id
        self.generation_id = generation_id
        self.member_id = member_id
        self.group_instance_id = group_instance_id

    def __repr__(self) -> str:
        return (f"ConsumerGroupMetadata(group_id={self.group_id!r}, generation_id={self.generation_id}, "
                f"member_id={self.member_id!r}, group_instance_id={self.group_instance_id!r})")
