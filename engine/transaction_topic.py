"""``__transaction_state`` as the transaction coordinator's log.

The coordinator's log is a topic stored like any other (DESIGN.md "Internal logs are
topics"): 50 partitions by default (``transaction.state.log.num.partitions``),
``cleanup.policy=compact``. This adapter gives the TransactionStateManager the two
operations it needs -- a durable append (acks=all) and a full read of one partition
for replay -- on top of the broker's Produce and Fetch handlers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import pyarrow as pa

from txlake.catalog.topic_config import INTERNAL_TOPIC_CONFIG
from txlake.catalog.topic_names import TRANSACTION_STATE_TOPIC
from txlake.formats.records import HEADER_TYPE, PAYLOAD_SCHEMA

from .errors import ApiError, Errors
from .group_commit import now_ms
from .requests import ProduceBatch

if TYPE_CHECKING:
    from .broker import Broker

READ_BATCH_RECORDS = 10_000


class TransactionTopicLog:
    """The TransactionStateManager's ``TransactionLog`` over the ``__transaction_state`` topic.

    Args:
        broker: the writer's broker.
        num_partitions: partitions of the topic (created on first use with this count).
    """

    def __init__(self, broker: "Broker", num_partitions: int):
        self.broker = broker
        self.num_partitions = num_partitions

    def ensure_topic(self) -> None:
        """Create ``__transaction_state`` (compacted) if it does not exist yet.

        Raises:
            ApiError: the topic exists with another partition count, or cannot be created.
        """
        existing = self.broker.topics().get(TRANSACTION_STATE_TOPIC)
        if existing is not None:
            if len(existing.partitions) != self.num_partitions:
                raise ApiError(Errors.INVALID_PARTITIONS,
                               f"{TRANSACTION_STATE_TOPIC} has {len(existing.partitions)} partitions but "
                               f"transaction.state.log.num.partitions is {self.num_partitions}; it cannot change")
            return
        ((error, message),) = self.broker.create_topics(
            [(TRANSACTION_STATE_TOPIC, self.num_partitions, dict(INTERNAL_TOPIC_CONFIG))])
        if error not in (Errors.NO_ERROR, Errors.TOPIC_ALREADY_EXISTS):
            raise ApiError(error, f"cannot create {TRANSACTION_STATE_TOPIC}: {message}")

    def append(self, partition: int, key: bytes, value: bytes | None) -> int:
        """Append one record and wait for its commit; return its offset.

        Raises:
            ApiError: the broker refused or could not commit the record.
        """
        records = pa.Table.from_arrays(
            [pa.array([now_ms()], pa.int64()), pa.array([key], pa.binary()), pa.array([value], pa.binary()),
             pa.nulls(1, HEADER_TYPE)], schema=PAYLOAD_SCHEMA)
        (result,) = self.broker.produce([ProduceBatch(TRANSACTION_STATE_TOPIC, partition, records, urgent=True)])
        if result.error != Errors.NO_ERROR:
            raise ApiError(result.error, f"append to {TRANSACTION_STATE_TOPIC}-{partition} failed: {result.message}")
        return result.base_offset

    def read(self, partition: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        """Every record of one partition, in offset order: ``(offset, key, value)``."""
        with self.broker.catalog.lock:
            offset = self.broker.catalog.state.partition(TRANSACTION_STATE_TOPIC, partition).log_start_offset
        while True:
            result = self.broker.fetch(TRANSACTION_STATE_TOPIC, partition, offset, READ_BATCH_RECORDS, "read_uncommitted")
            if result.error != Errors.NO_ERROR:
                raise ApiError(result.error, f"cannot read {TRANSACTION_STATE_TOPIC}-{partition}: {result.message}")
            table = result.records
            if table is None or table.num_rows == 0:
                return
            for o, k, v, control in zip(table.column("offset").to_pylist(), table.column("key").to_pylist(),
                                        table.column("value").to_pylist(), table.column("is_control").to_pylist()):
                if not control:
                    yield o, k, v
            offset = table.column("offset")[-1].as_py() + 1
