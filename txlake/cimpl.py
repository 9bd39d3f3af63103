"""``confluent_kafka.cimpl``'s names under txlake: the clients, value types, constants,
errors, version functions and key partitioners, so ``from confluent_kafka.cimpl import X``
moves over as ``from txlake.cimpl import X``.

The partitioner functions take ``(key, partition_count)`` and return the partition
librdkafka's partitioner of that name gives: ``murmur2`` (the Java client's placement,
Kafka's ``Utils.murmur2``), ``consistent`` (CRC32) and ``fnv1a``.
"""

from __future__ import annotations

import operator

from txlake.engine.partitioner import consistent_partition, fnv1a_partition, partition_for_key

from .admin_group_types import Uuid
from .consumer import Consumer
from .error import KafkaError, KafkaException
from .producer import Producer
from .types import (OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, OFFSET_STORED, TIMESTAMP_CREATE_TIME,
                    TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE, Message, TopicPartition)
from .version import libversion, version


def _checked(key: object, partition_count: object) -> tuple[bytes, int]:
    """The partitioners' argument checks, with confluent-kafka's errors.

    Raises:
        TypeError: ``key`` not bytes-like, ``partition_count`` not an int.
        ValueError: ``partition_count`` below 1. OverflowError: beyond int32.
    """
    if isinstance(key, bytearray):
        raise TypeError("argument 1 must be read-only bytes-like object, not bytearray")
    if not isinstance(key, (bytes, memoryview)):
        raise TypeError(f"a bytes-like object is required, not '{type(key).__name__}'")
    count = operator.index(partition_count)
    if count > 2**31 - 1:
        raise OverflowError("signed integer is greater than maximum")
    if count <= 0:
        raise ValueError(f"partition_count must be > 0, got {count}")
    return bytes(key), count


def murmur2(key: bytes, partition_count: int) -> int:
    """The partition of ``key`` under librdkafka's ``murmur2`` partitioner (Java's default).
    Raises as :func:`_checked`."""
    return partition_for_key(*_checked(key, partition_count))


def consistent(key: bytes, partition_count: int) -> int:
    """The partition of ``key`` under librdkafka's ``consistent`` partitioner (CRC32).
    Raises as :func:`_checked`."""
    return consistent_partition(*_checked(key, partition_count))


def fnv1a(key: bytes, partition_count: int) -> int:
    """The partition of ``key`` under librdkafka's ``fnv1a`` partitioner. Raises as :func:`_checked`."""
    return fnv1a_partition(*_checked(key, partition_count))


__all__ = [
    "Consumer", "KafkaError", "KafkaException", "Message", "Producer", "TopicPartition", "Uuid",
    "OFFSET_BEGINNING", "OFFSET_END", "OFFSET_INVALID", "OFFSET_STORED", "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME", "TIMESTAMP_NOT_AVAILABLE", "consistent", "fnv1a", "libversion", "murmur2", "version",
]
