"""``confluent_kafka.cimpl``'s names under txlake: the clients, value types, constants,
errors, version functions and key partitioners, so ``from confluent_kafka.cimpl import X``
moves over as ``from txlake.cimpl import X``.

The partitioner functions take ``(key, partition_count)`` and return the partition
librdkafka's partitioner of that name gives: ``murmur2`` (the Java client's placement,
Kafka's ``Utils.murmur2``), ``consistent`` (CRC32) and ``fnv1a``.
"""

from __future__ import annotations

from txlake.engine.partitioner import consistent_partition, fnv1a_partition, partition_for_key

from .admin_group_types import Uuid
from .consumer import Consumer
from .error import KafkaError, KafkaException
from .producer import Producer
from .types import (OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, OFFSET_STORED, TIMESTAMP_CREATE_TIME,
                    TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE, Message, TopicPartition)
from .version import libversion, version


def murmur2(key: bytes, partition_count: int) -> int:
    """The partition of ``key`` under librdkafka's ``murmur2`` partitioner (Java's default)."""
    return partition_for_key(key, partition_count)


def consistent(key: bytes, partition_count: int) -> int:
    """The partition of ``key`` under librdkafka's ``consistent`` partitioner (CRC32)."""
    return consistent_partition(key, partition_count)


def fnv1a(key: bytes, partition_count: int) -> int:
    """The partition of ``key`` under librdkafka's ``fnv1a`` partitioner."""
    return fnv1a_partition(key, partition_count)


__all__ = [
    "Consumer", "KafkaError", "KafkaException", "Message", "Producer", "TopicPartition", "Uuid",
    "OFFSET_BEGINNING", "OFFSET_END", "OFFSET_INVALID", "OFFSET_STORED", "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME", "TIMESTAMP_NOT_AVAILABLE", "consistent", "fnv1a", "libversion", "murmur2", "version",
]
