"""``DeserializingConsumer``: a :class:`txlake.Consumer` whose ``poll()`` returns deserialized
keys and values (confluent-kafka's ``confluent_kafka.DeserializingConsumer``)."""

from __future__ import annotations

from typing import Any

from .consumer import Consumer
from .error import ConsumeError, KeyDeserializationError, ValueDeserializationError
from .serialization import MessageField, SerializationContext, pop_serdes
from .types import Message


class DeserializingConsumer(Consumer):
    """A :class:`txlake.Consumer` whose :meth:`poll` deserializes each record's key and value
    with the configured deserializers (confluent-kafka's ``DeserializingConsumer``).

    Besides every :class:`txlake.Consumer` property, ``conf`` takes:

    ========================  ==================================================================
    ``key.deserializer``      callable ``(bytes | None, SerializationContext) -> obj`` for keys
    ``value.deserializer``    likewise for values
    ========================  ==================================================================

    Either may be missing: the key or value is then returned as bytes.

    Args:
        conf: the configuration (not modified).

    Raises:
        ValueError: a deserializer and its ``.builder`` are both set.
        KafkaException: ``_INVALID_ARG`` for ``key.deserializer.builder`` /
            ``value.deserializer.builder`` (Schema Registry builders are not supported), a
            deserializer that is not callable, or any error of :class:`txlake.Consumer`'s config.
    """

    def __init__(self, conf: dict) -> None:
        self._key_deserializer, self._value_deserializer, rest = pop_serdes(conf, "key.deserializer",
                                                                            "value.deserializer")
        super().__init__(rest)

    def poll(self, timeout: float | None = -1) -> Message | None:
        """The next record, deserialized, waiting up to ``timeout`` s (-1 or None: without limit);
        None if none came.

        The deserialized key and value replace the raw ones in the message (``key()``/``value()``,
        also ``deserialized_key()``/``deserialized_value()``). The key deserializer runs first,
        with a :class:`SerializationContext` of the topic, :attr:`MessageField.KEY` and the
        record's headers; then the value deserializer with :attr:`MessageField.VALUE`.

        Raises:
            ConsumeError: the poll returned an error event (``msg.error()``, including
                ``_PARTITION_EOF`` with ``enable.partition.eof``); the event is ``kafka_message``.
            KeyDeserializationError: the key deserializer raised; ``kafka_message`` is the record
                as read (raw key and value, its offset), ``exception`` what was raised. The
                consumer's position is already past the record, as in confluent-kafka.
            ValueDeserializationError: the same for the value.
            KafkaException: as :meth:`txlake.Consumer.consume`.
        """
        # Consumer.consume of the base class (this class refuses consume(), as confluent-kafka's).
        msgs = super().consume(1, -1 if timeout is None else timeout)
        if not msgs:
            return None
        msg = msgs[0]
        error = msg.error()
        if error is not None:
            raise ConsumeError(error, kafka_message=msg)
        ctx = SerializationContext(msg.topic(), MessageField.KEY, msg.headers())
        key: Any = msg.key()
        if self._key_deserializer is not None:
            try:
                key = self._key_deserializer(key, ctx)
            except Exception as exc:  # noqa: BLE001 - any deserializer failure is reported as confluent-kafka's
                raise KeyDeserializationError(exception=exc, kafka_message=msg) from exc
        value: Any = msg.value()
        if self._value_deserializer is not None:
            ctx.field = MessageField.VALUE
            try:
                value = self._value_deserializer(value, ctx)
            except Exception as exc:  # noqa: BLE001
                raise ValueDeserializationError(exception=exc, kafka_message=msg) from exc
        msg.set_key(key)
        msg.set_value(value)
        return msg

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Not implemented, as in confluent-kafka's ``DeserializingConsumer``: use :meth:`poll`.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError
