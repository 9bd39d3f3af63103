"""``SerializingProducer``: a :class:`txlake.Producer` that serializes keys and values
(confluent-kafka's ``confluent_kafka.SerializingProducer``)."""

from __future__ import annotations

from typing import Any, Callable

from .error import KeySerializationError, ValueSerializationError
from .producer import Producer
from .serialization import MessageField, SerializationContext, pop_serdes


class SerializingProducer(Producer):
    """A :class:`txlake.Producer` whose :meth:`produce` takes objects and turns them into bytes
    with the configured serializers (confluent-kafka's ``SerializingProducer``).

    Besides every :class:`txlake.Producer` property, ``conf`` takes:

    ======================  ====================================================================
    ``key.serializer``      callable ``(obj, SerializationContext) -> bytes | None`` for keys
    ``value.serializer``    likewise for values
    ======================  ====================================================================

    Either may be missing: the key or value is then produced as given (bytes, str or None).
    Any callable works, including :mod:`txlake.serialization`'s, ``confluent_kafka.serialization``'s
    and confluent-kafka's Schema Registry serializers built ready-made. Ready-made serializers
    stay the application's to close.

    Args:
        conf: the configuration (not modified).

    Raises:
        ValueError: a serializer and its ``.builder`` are both set.
        KafkaException: ``_INVALID_ARG`` for ``key.serializer.builder`` /
            ``value.serializer.builder`` (Schema Registry builders are not supported), a
            serializer that is not callable, or any error of :class:`txlake.Producer`'s config.
    """

    def __init__(self, conf: dict) -> None:
        self._key_serializer, self._value_serializer, rest = pop_serdes(conf, "key.serializer", "value.serializer")
        super().__init__(rest)

    def produce(self, topic: str, key: Any = None, value: Any = None, partition: int = -1,  # type: ignore[override]
                on_delivery: Callable | None = None, timestamp: int = 0, headers: Any = None) -> None:
        """Serialize ``key`` then ``value`` and queue the record as :meth:`txlake.Producer.produce`.

        Note the argument order: ``key`` comes before ``value`` (confluent-kafka's
        ``SerializingProducer.produce``), unlike :meth:`txlake.Producer.produce`. Each serializer
        is called with a :class:`SerializationContext` of ``topic``, :attr:`MessageField.KEY` or
        :attr:`MessageField.VALUE`, and ``headers`` as given.

        Args:
            partition: -1 for the partitioner; timestamp: CreateTime in ms since the epoch, 0 =
                now; on_delivery: ``cb(err, msg)`` as :meth:`txlake.Producer.produce`.

        Raises:
            RuntimeError: the producer is closed (checked before the serializers run).
            TypeError: ``topic`` is not a str (likewise checked first).
            KeySerializationError: the key serializer raised; its exception is ``.exception``
                (and ``__cause__``), the code ``_KEY_SERIALIZATION``; nothing is queued.
            ValueSerializationError: the same for the value (``_VALUE_SERIALIZATION``).
            KafkaException / BufferError: as :meth:`txlake.Producer.produce`.
        """
        # As confluent-kafka: fail before a serializer runs (it may register a schema) for a
        # record that cannot be produced.
        if getattr(self, "_closed", False):
            raise RuntimeError("Producer has been closed")
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        ctx = SerializationContext(topic, MessageField.KEY, headers)
        if self._key_serializer is not None:
            try:
                key = self._key_serializer(key, ctx)
            except Exception as exc:  # noqa: BLE001 - any serializer failure is reported as confluent-kafka's
                raise KeySerializationError(exc) from exc
        ctx.field = MessageField.VALUE
        if self._value_serializer is not None:
            try:
                value = self._value_serializer(value, ctx)
            except Exception as exc:  # noqa: BLE001
                raise ValueSerializationError(exc) from exc
        super().produce(topic, value, key, partition=partition, on_delivery=on_delivery, timestamp=timestamp,
                        headers=headers)
