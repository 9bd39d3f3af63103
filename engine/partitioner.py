"""Kafka's default partitioner: murmur2 of the key bytes (``Utils.murmur2``), and librdkafka's
other key hashes (``consistent``: CRC32, ``fnv1a``).

``partition = toPositive(murmur2(key)) % num_partitions`` -- the same partition a Java
Kafka producer (and librdkafka's ``murmur2_random`` partitioner, the Java-compatible
one) picks for the same key and partition count.
"""

from __future__ import annotations

import zlib
from functools import lru_cache

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 of ``data`` as a signed int (Java ``int``)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    n4 = length // 4
    for i in range(n4):
        j = i * 4
        k = data[j] | (data[j + 1] << 8) | (data[j + 2] << 16) | (data[j + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    tail = n4 * 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=65536)
def _positive_hash(key: bytes) -> int:
    return murmur2(key) & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` among ``num_partitions``."""
    assert num_partitions > 0
    return _positive_hash(key) % num_partitions


def consistent_partition(key: bytes, num_partitions: int) -> int:
    """librdkafka's ``consistent`` partitioner (the hash of its default ``consistent_random``):
    ``crc32(key) % num_partitions``."""
    assert num_partitions > 0
    return zlib.crc32(key) % num_partitions


_FNV_OFFSET_BASIS = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a_partition(key: bytes, num_partitions: int) -> int:
    """librdkafka's ``fnv1a`` partitioner (Sarama's placement): the absolute value of the
    signed 32-bit FNV-1a hash of ``key``, modulo ``num_partitions``."""
    assert num_partitions > 0
    h = _FNV_OFFSET_BASIS
    for byte in key:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return abs(h - (1 << 32) if h & 0x80000000 else h) % num_partitions
