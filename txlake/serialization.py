"""The serialization layer of confluent-kafka (``confluent_kafka.serialization``), for
:class:`txlake.SerializingProducer` and :class:`txlake.DeserializingConsumer`.

A serializer is any callable ``(obj, ctx: SerializationContext) -> bytes | None``; a
deserializer any callable ``(data: bytes | None, ctx) -> obj``. The built-in ones encode as
confluent-kafka's and Kafka's Java serializers do, byte for byte, and fail with the same
:class:`SerializationError` text:

================================  ==========  =====================================================
class                             Python      bytes
================================  ==========  =====================================================
StringSerializer(codec="utf_8")   str         ``str.encode(codec)`` (Kafka's ``StringSerializer``)
IntegerSerializer                 int         4 bytes, big-endian two's complement (``IntegerSerializer``)
DoubleSerializer                  float       8 bytes, IEEE 754 binary64, big-endian (``DoubleSerializer``)
================================  ==========  =====================================================

None is Kafka's null both ways. confluent-kafka's own serializers (and its Schema Registry
Avro/JSON/Protobuf serializers, given ready-made) work on txlake's clients too: they read only
``ctx.topic``, ``ctx.field`` and ``ctx.headers``.
"""

from __future__ import annotations

import struct
from enum import Enum
from typing import Any, Callable, Mapping

from .error import KafkaError, SerializationError, kafka_exception

__all__ = [
    "Deserializer", "DeserializerBuilder", "DoubleDeserializer", "DoubleSerializer", "IntegerDeserializer",
    "IntegerSerializer", "MessageField", "SerializationContext", "SerializationError", "Serializer",
    "SerializerBuilder", "StringDeserializer", "StringSerializer",
]


class MessageField(str, Enum):
    """Which part of a message is being (de)serialized: ``KEY`` (``"key"``), ``VALUE``
    (``"value"``) or ``NONE`` (``"none"``); ``str()`` gives the value (confluent-kafka's
    ``MessageField``)."""

    NONE = "none"
    KEY = "key"
    VALUE = "value"

    def __str__(self) -> str:
        return self.value


class SerializationContext:
    """What a serializer is told about the data (confluent-kafka's ``SerializationContext``).

    Args:
        topic: the topic produced to or consumed from.
        field: the :class:`MessageField` being converted.
        headers: the message's headers as given to ``produce()`` (a list of ``(str, bytes)``
            or a dict) or as consumed (a list), or None.
    """

    def __init__(self, topic: str, field: MessageField, headers: Any = None) -> None:
        self.topic = topic
        self.field = field
        self.headers = headers


class Serializer:
    """Base of serializers: a callable ``(obj, ctx) -> bytes | None`` (confluent-kafka's
    ``Serializer``); subclasses implement ``__call__`` and raise :class:`SerializationError`."""

    __slots__: list[str] = []

    def __call__(self, obj: Any, ctx: SerializationContext | None = None) -> bytes | None:
        """``obj`` as bytes, None for None.

        Raises:
            SerializationError: ``obj`` cannot be converted.
        """
        raise NotImplementedError

    def set_cluster_id_resolver(self, resolver: Callable[[], Any]) -> None:
        """Accept a callable returning the cluster id (confluent-kafka's hook for Schema
        Registry subject strategies). Does nothing here; txlake's clients do not call it."""

    def close(self) -> None:
        """Release what the serializer created for itself. Does nothing here."""


class Deserializer:
    """Base of deserializers: a callable ``(data, ctx) -> obj`` (confluent-kafka's
    ``Deserializer``); subclasses implement ``__call__`` and raise :class:`SerializationError`."""

    __slots__: list[str] = []

    def __call__(self, value: bytes | None, ctx: SerializationContext | None = None) -> Any:
        """The object ``value`` holds, None for None.

        Raises:
            SerializationError: ``value`` cannot be decoded.
        """
        raise NotImplementedError

    def set_cluster_id_resolver(self, resolver: Callable[[], Any]) -> None:
        """As :meth:`Serializer.set_cluster_id_resolver`: does nothing here."""

    def close(self) -> None:
        """Release what the deserializer created for itself. Does nothing here."""


class SerializerBuilder:
    """Base of confluent-kafka's serializer builders (``build(conf, is_key) -> (serializer,
    leftover conf)``), so programs that subclass it import. txlake's clients do not run builders
    (``key.serializer.builder`` is refused); call ``build()`` yourself and pass the serializer."""

    __slots__: list[str] = []

    def build(self, conf: dict[str, Any], is_key: bool) -> tuple[Serializer, dict[str, Any]]:
        """The serializer and the configuration it did not consume."""
        raise NotImplementedError


class DeserializerBuilder:
    """The deserializing counterpart of :class:`SerializerBuilder` (likewise not run by
    :class:`txlake.DeserializingConsumer`)."""

    __slots__: list[str] = []

    def build(self, conf: dict[str, Any], is_key: bool) -> tuple[Deserializer, dict[str, Any]]:
        """The deserializer and the configuration it did not consume."""
        raise NotImplementedError


class _StructSerializer(Serializer):
    """A number as a fixed-size big-endian ``struct`` format."""

    _format = ""

    def __call__(self, obj: Any, ctx: SerializationContext | None = None) -> bytes | None:
        if obj is None:
            return None
        try:
            return struct.pack(self._format, obj)
        except struct.error as exc:
            raise SerializationError(str(exc)) from exc


class _StructDeserializer(Deserializer):
    """A number from exactly the bytes of a big-endian ``struct`` format."""

    _format = ""

    def __call__(self, value: bytes | None, ctx: SerializationContext | None = None) -> Any:
        if value is None:
            return None
        try:
            return struct.unpack(self._format, value)[0]
        except struct.error as exc:
            raise SerializationError(str(exc)) from exc


class IntegerSerializer(_StructSerializer):
    """An int as 4 bytes, big-endian two's complement (Kafka's ``IntegerSerializer``).

    Raises:
        SerializationError: not an int, or outside -2**31..2**31-1 (``struct``'s text, as
            confluent-kafka's).
    """

    _format = ">i"


class IntegerDeserializer(_StructDeserializer):
    """An int from exactly 4 big-endian bytes (Kafka's ``IntegerDeserializer``).

    Raises:
        SerializationError: not 4 bytes (``"unpack requires a buffer of 4 bytes"``).
    """

    _format = ">i"


class DoubleSerializer(_StructSerializer):
    """A float as 8 bytes, IEEE 754 binary64, big-endian (Kafka's ``DoubleSerializer``).

    Raises:
        SerializationError: not a number (``"required argument is not a float"``).
    """

    _format = ">d"


class DoubleDeserializer(_StructDeserializer):
    """A float from exactly 8 big-endian IEEE 754 bytes (Kafka's ``DoubleDeserializer``).

    Raises:
        SerializationError: not 8 bytes.
    """

    _format = ">d"


class StringSerializer(Serializer):
    """A str as ``obj.encode(codec)`` (Kafka's ``StringSerializer``).

    Args:
        codec: a Python codec name; ``"utf_8"`` by default.

    Raises:
        SerializationError: the codec cannot encode ``obj`` (the ``UnicodeError``'s text).
        AttributeError: ``obj`` is not a str (as confluent-kafka's, which calls ``obj.encode``).
    """

    def __init__(self, codec: str = "utf_8") -> None:
        self.codec = codec

    def __call__(self, obj: str | None, ctx: SerializationContext | None = None) -> bytes | None:
        if obj is None:
            return None
        try:
            return obj.encode(self.codec)
        except UnicodeError as exc:
            raise SerializationError(str(exc)) from exc


class StringDeserializer(Deserializer):
    """A str from ``value.decode(codec)`` (Kafka's ``StringDeserializer``).

    Args:
        codec: a Python codec name; ``"utf_8"`` by default.

    Raises:
        SerializationError: the bytes are not valid in the codec (the ``UnicodeError``'s text).
    """

    def __init__(self, codec: str = "utf_8") -> None:
        self.codec = codec

    def __call__(self, value: bytes | None, ctx: SerializationContext | None = None) -> str | None:
        if value is None:
            return None
        try:
            return value.decode(self.codec)
        except UnicodeError as exc:
            raise SerializationError(str(exc)) from exc


def pop_serdes(conf: Any, key_prop: str, value_prop: str) -> tuple[Callable | None, Callable | None, Any]:
    """Take a serializing client's own properties out of its configuration, before the base
    client validates the rest (as confluent-kafka's clients do).

    Args:
        conf: the client configuration (not modified); anything but a mapping is returned as
            it is, for the base client to refuse.
        key_prop / value_prop: ``"key.serializer"``/``"value.serializer"`` or
            ``"key.deserializer"``/``"value.deserializer"``.

    Returns:
        ``(key serde or None, value serde or None, the remaining configuration)``.

    Raises:
        ValueError: a property and its ``.builder`` are both set (confluent-kafka's text).
        KafkaException: ``_INVALID_ARG`` for a ``*.builder`` property (Schema Registry builders
            are not supported) or a serde that is not callable, naming the property.
    """
    if not isinstance(conf, Mapping):
        return None, None, conf
    rest = dict(conf)
    serdes = []
    for prop in (key_prop, value_prop):
        builder_prop = prop + ".builder"
        serde = rest.pop(prop, None)
        builder = rest.pop(builder_prop, None)
        if serde is not None and builder is not None:
            raise ValueError(f"Cannot configure both {prop} and {builder_prop}; use one or the other")
        if builder is not None:
            kind = prop.split(".")[1]   # serializer / deserializer
            raise kafka_exception(
                KafkaError._INVALID_ARG,
                f"Configuration property \"{builder_prop}\" is not supported: Schema Registry builders are not "
                f"supported by txlake; pass a ready-made {kind} in \"{prop}\" "
                f"(e.g. Avro{kind.capitalize()}(schema_registry_client, schema_str))")
        if serde is not None and not callable(serde):
            raise kafka_exception(
                KafkaError._INVALID_ARG,
                f"Invalid value for configuration property \"{prop}\": expected a callable "
                f"(obj, SerializationContext), not {type(serde).__name__}")
        serdes.append(serde)
    return serdes[0], serdes[1], rest
