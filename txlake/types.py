"""Value types of the client API, as confluent-kafka defines them: TopicPartition, Message."""

from __future__ import annotations

import operator
from typing import Any

from .error import KafkaError

# Logical offsets (librdkafka's RD_KAFKA_OFFSET_*).
OFFSET_BEGINNING = -2
OFFSET_END = -1
OFFSET_STORED = -1000
OFFSET_INVALID = -1001

# Message.timestamp() types (confluent-kafka's constants).
TIMESTAMP_NOT_AVAILABLE = 0
TIMESTAMP_CREATE_TIME = 1
TIMESTAMP_LOG_APPEND_TIME = 2


class TopicPartition:
    """A topic partition, optionally with an offset (confluent-kafka's ``TopicPartition``).

    Args:
        topic: topic name; partition: id (-1 = unset); offset: an offset or a logical
        offset (OFFSET_BEGINNING -2, OFFSET_END -1, OFFSET_STORED -1000, OFFSET_INVALID -1001).

    Raises:
        TypeError: ``topic`` is not a str, ``partition``/``offset``/``leader_epoch`` not an int,
            ``metadata`` not a str (what confluent-kafka raises).
    """

    __slots__ = ("topic", "partition", "offset", "metadata", "leader_epoch", "error")

    def __init__(self, topic: str, partition: int = -1, offset: int = OFFSET_INVALID,
                 metadata: str | None = None, leader_epoch: int | None = None):
        if not isinstance(topic, str):
            raise TypeError(f"TopicPartition topic must be a str, not {type(topic).__name__}")
        partition = _int_arg("partition", partition)
        offset = _int_arg("offset", offset)
        if leader_epoch is not None:
            leader_epoch = _int_arg("leader_epoch", leader_epoch)
        if metadata is not None and not isinstance(metadata, str):
            raise TypeError(f"TopicPartition metadata must be a str or None, not {type(metadata).__name__}")
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.metadata = metadata
        self.leader_epoch = leader_epoch
        self.error: KafkaError | None = None

    def __hash__(self) -> int:
        return hash((self.topic, self.partition))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicPartition):
            return NotImplemented
        return (self.topic, self.partition) == (other.topic, other.partition)

    def __lt__(self, other: "TopicPartition") -> bool:
        return (self.topic, self.partition) < (other.topic, other.partition)

    def __le__(self, other: "TopicPartition") -> bool:
        return (self.topic, self.partition) <= (other.topic, other.partition)

    def __gt__(self, other: "TopicPartition") -> bool:
        return (self.topic, self.partition) > (other.topic, other.partition)

    def __ge__(self, other: "TopicPartition") -> bool:
        return (self.topic, self.partition) >= (other.topic, other.partition)

    def __repr__(self) -> str:
        return (f"TopicPartition{{topic={self.topic},partition={self.partition},offset={self.offset},"
                f"leader_epoch={self.leader_epoch},error={self.error!r}}}")

    __str__ = __repr__


def partition_list(partitions: Any, method: str) -> list[TopicPartition]:
    """``partitions`` if it is a list of :class:`TopicPartition` (confluent-kafka's check of such
    an argument).

    Raises:
        TypeError: anything else ("requires list of TopicPartition", as confluent-kafka).
    """
    if not isinstance(partitions, list):
        raise TypeError(f"{method}() requires list of TopicPartition, not {type(partitions).__name__}")
    for tp in partitions:
        if not isinstance(tp, TopicPartition):
            raise TypeError(f"{method}() requires list of TopicPartition: got a {type(tp).__name__} ({tp!r})")
    return partitions


def _int_arg(name: str, value: Any) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"TopicPartition {name} must be an int, not {type(value).__name__}") from None


def _non_negative(value: Any) -> int | None:
    """An int argument of :class:`Message`; a negative one (librdkafka's "none") as None."""
    if value is None:
        return None
    value = operator.index(value)
    return value if value >= 0 else None


class Message:
    """A consumed record or a delivery report (confluent-kafka's ``Message``).

    The constructor takes confluent-kafka's arguments in its order (``topic, partition,
    offset, key, value, headers, error, timestamp, latency, leader_epoch, delivery_count``);
    ``timestamp`` is ``(type, ms)`` with type TIMESTAMP_NOT_AVAILABLE (0), TIMESTAMP_CREATE_TIME
    (1) or TIMESTAMP_LOG_APPEND_TIME (2); ``headers`` is a list of ``(str, bytes)`` or None.

    Raises:
        TypeError: ``timestamp`` is not a tuple of two ints, or ``partition``/``offset`` not
            an int (what confluent-kafka raises).

    A negative ``partition``, ``offset``, ``leader_epoch`` or ``latency`` and a
    ``delivery_count`` of 0 or less read back as None (confluent-kafka's ``Message``); a
    ``delivery_count`` beyond int16 raises OverflowError. Messages compare equal when all
    their fields are equal, are not ordered or hashable, and pickle (``__reduce__``) as
    confluent-kafka's: ``(Message, (topic, partition|-1, offset|-1001, key, value, headers,
    error, timestamp, latency|-1.0, leader_epoch|-1, delivery_count|-1))``.
    """

    __slots__ = ("_topic", "_partition", "_offset", "_key", "_value", "_timestamp", "_ts_type", "_headers",
                 "_error", "_latency", "_leader_epoch", "_delivery_count")

    def __init__(self, topic: str | None = None, partition: int | None = None, offset: int | None = None,
                 key: Any = None, value: Any = None, headers: list[tuple[str, Any]] | None = None,
                 error: KafkaError | None = None, timestamp: tuple[int, int] | None = None,
                 latency: float | None = None, leader_epoch: int | None = None, delivery_count: int | None = None):
        if timestamp is None:
            ts_type, ts = TIMESTAMP_NOT_AVAILABLE, 0
        elif (isinstance(timestamp, tuple) and len(timestamp) == 2
              and all(isinstance(x, int) and not isinstance(x, bool) for x in timestamp)):
            ts_type, ts = timestamp
        else:
            raise TypeError("timestamp must be a tuple of (int, int)")
        self._topic = topic
        self._partition = _non_negative(partition)
        self._offset = _non_negative(offset)
        self._key = key
        self._value = value
        self._timestamp = ts
        self._ts_type = ts_type
        self._headers = headers
        self._error = error
        self._latency = None if latency is None or latency < 0 else float(latency)
        self._leader_epoch = _non_negative(leader_epoch)
        if delivery_count is not None:
            delivery_count = operator.index(delivery_count)
            if not -32768 <= delivery_count <= 32767:  # librdkafka keeps it in an int16
                raise OverflowError(f"signed short integer is {'greater than maximum' if delivery_count > 0 else 'less than minimum'}")
        self._delivery_count = delivery_count if delivery_count is not None and delivery_count > 0 else None

    @classmethod
    def _record(cls, topic: str, partition: int, offset: int, key: Any, value: Any, timestamp_ms: int,
                timestamp_type: int, headers: list[tuple[str, Any]] | None, error: KafkaError | None = None,
                leader_epoch: int | None = None) -> "Message":
        """A record or delivery report made by the clients (no argument checks: the hot path
        of consume and delivery). ``timestamp_type`` 0 reports the timestamp as -1."""
        m = cls.__new__(cls)
        m._topic, m._partition, m._offset, m._key, m._value = topic, partition, offset, key, value
        m._timestamp = timestamp_ms if timestamp_type else -1
        m._ts_type, m._headers, m._error = timestamp_type, headers, error
        m._latency, m._leader_epoch, m._delivery_count = None, leader_epoch, None
        return m

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (self._ts_type, self._timestamp)

    def headers(self) -> list[tuple[str, Any]] | None:
        return self._headers

    def latency(self) -> float | None:
        return self._latency

    def leader_epoch(self) -> int | None:
        return self._leader_epoch

    def delivery_count(self) -> int | None:
        """Share groups' delivery count (KIP-932); None: txlake has no share groups."""
        return self._delivery_count

    def set_topic(self, topic: str | None) -> None:
        self._topic = topic

    def set_error(self, error: KafkaError | None) -> None:
        self._error = error

    def set_headers(self, headers: list[tuple[str, Any]] | None) -> None:
        self._headers = headers

    def set_key(self, key: bytes | None) -> None:
        self._key = key

    def set_value(self, value: bytes | None) -> None:
        self._value = value

    def deserialized_key(self) -> Any:
        """The key, as :meth:`key` (confluent-kafka's name for it on a ``DeserializingConsumer``'s
        messages, whose key is the deserialized object)."""
        return self._key

    def deserialized_value(self) -> Any:
        """The value, as :meth:`value` (the deserialized object on a ``DeserializingConsumer``'s
        messages)."""
        return self._value

    def __len__(self) -> int:
        return len(self._value) if self._value is not None else 0

    def __reduce__(self) -> tuple[type, tuple]:
        """confluent-kafka's pickled form (absent numbers as librdkafka's -1 / OFFSET_INVALID)."""
        def absent(v: Any, none: Any) -> Any:
            return none if v is None else v
        return (Message, (self._topic, absent(self._partition, -1), absent(self._offset, OFFSET_INVALID), self._key,
                          self._value, self._headers, self._error, (self._ts_type, self._timestamp),
                          absent(self._latency, -1.0), absent(self._leader_epoch, -1), absent(self._delivery_count, -1)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self.__reduce__()[1] == other.__reduce__()[1]

    __hash__ = None  # type: ignore[assignment]  # mutable (set_*), as confluent-kafka's

    def __repr__(self) -> str:
        return f"Message(topic={self._topic!r}, partition={self._partition}, offset={self._offset}, error={self._error!r})"


class ThrottleEvent:
    """A request the broker throttled (confluent-kafka's ``ThrottleEvent``, handed to a
    ``throttle_cb``). txlake has no quotas, so its clients never make one; programs that
    build or print them work unchanged.

    Attributes:
        broker_name: the broker's host name; broker_id: its node id;
        throttle_time: how long (seconds) the request was held back.
    """

    def __init__(self, broker_name: str, broker_id: int, throttle_time: float) -> None:
        self.broker_name = broker_name
        self.broker_id = broker_id
        self.throttle_time = throttle_time

    def __str__(self) -> str:
        return f"{self.broker_name}/{self.broker_id} throttled for {int(self.throttle_time * 1000)} ms"
