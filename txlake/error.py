"""``KafkaError`` and ``KafkaException`` as confluent-kafka exposes them.

Every one of librdkafka's error codes is a class attribute under librdkafka's name, with its
number, and ``KafkaError(code).name()``/``str()`` give librdkafka's name and text
(:mod:`txlake.librdkafka_errors`), so confluent-kafka programs compare and print errors
unchanged. Where Kafka names a broker code differently, Kafka's name is an attribute too
(``MESSAGE_TOO_LARGE`` and librdkafka's ``MSG_SIZE_TOO_LARGE`` are both 10).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from txlake.engine.errors import ApiError, Errors
from txlake.librdkafka_errors import LIBRDKAFKA_ERRORS

#: code -> (librdkafka's name, librdkafka's description)
_LIBRDKAFKA: dict[int, tuple[str, str]] = {code: (name, text) for code, name, text in LIBRDKAFKA_ERRORS}


class KafkaError:
    """An error with Kafka's code and name (confluent-kafka's ``KafkaError``).

    Args:
        error: the numeric code (an :class:`~txlake.engine.errors.Errors` or int).
        reason: human-readable text; defaults to the name.
        fatal / retriable / txn_requires_abort: the flags confluent-kafka reports.
    """

    __slots__ = ("_code", "_reason", "_fatal", "_retriable", "_txn_requires_abort")

    def __init__(self, error: int, reason: str | None = None, fatal: bool = False,
                 retriable: bool | None = None, txn_requires_abort: bool = False):
        self._code = int(error)
        self._reason = reason
        self._fatal = fatal
        try:
            known = Errors(self._code)
        except ValueError:
            known = None
        self._retriable = retriable if retriable is not None else bool(known is not None and known.retriable)
        self._txn_requires_abort = txn_requires_abort

    def code(self) -> int:
        """The numeric error code."""
        return self._code

    def name(self) -> str:
        """librdkafka's name of the code (``UNKNOWN_TOPIC_OR_PART``, ``_MSG_TIMED_OUT``), else
        Kafka's, else librdkafka's ``ERR_<code>?`` for a code it does not know."""
        return self._described()[0]

    def str(self) -> str:
        """The human-readable reason: the one given, else librdkafka's text for the code
        (``"Broker: Unknown topic or partition"``; ``"Err-<code>?"`` for a code librdkafka
        does not know, as its ``rd_kafka_err2str``)."""
        return self._reason or self._described()[1]

    def _described(self) -> tuple[str, str]:
        """(name, text) of the code: librdkafka's, else Kafka's name as both, else librdkafka's
        forms for an unknown code."""
        known = _LIBRDKAFKA.get(self._code)
        if known is not None:
            return known
        try:
            return Errors(self._code).name, Errors(self._code).name
        except ValueError:
            return f"ERR_{self._code}?", f"Err-{self._code}?"

    def fatal(self) -> bool:
        """True when the client instance can no longer be used (e.g. a fenced producer)."""
        return self._fatal

    def retriable(self) -> bool:
        """True when retrying the same operation may succeed."""
        return self._retriable

    def txn_requires_abort(self) -> bool:
        """True when the current transaction must be aborted before going on."""
        return self._txn_requires_abort

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, int):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)

    def __repr__(self) -> str:
        return f"KafkaError{{code={self.name()},val={self._code},str=\"{self.str()}\"}}"

    __str__ = __repr__  # as confluent-kafka's: str() of the error and of its exception show code and text


for _e in Errors:
    setattr(KafkaError, _e.name, int(_e))
for _code, _name, _text in LIBRDKAFKA_ERRORS:
    setattr(KafkaError, _name, _code)


def kafka_name(code: int) -> str:
    """Kafka's name of an error code (``INVALID_TOPIC_EXCEPTION``, as Kafka's tools print it),
    else librdkafka's (``KafkaError(code).name()``, which confluent-kafka programs compare)."""
    try:
        return Errors(code).name
    except ValueError:
        return KafkaError(code).name()


class KafkaException(Exception):
    """The exception failing calls raise; ``args[0]`` is the :class:`KafkaError`.

    ``KafkaException()`` with no argument (a subclass's bare construction) has empty ``args``
    and prints as the empty string, as confluent-kafka's; a ``str`` argument is kept as is.
    """

    def __init__(self, error: KafkaError | int | str | None = None, *args: object):
        if error is None and not args:
            super().__init__()
            return
        if isinstance(error, int) and not isinstance(error, bool):
            error = KafkaError(error, *(str(a) for a in args[:1]))
        super().__init__(error)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def kafka_exception(code: int, message: str, **flags: bool) -> KafkaException:
    """Shorthand: a KafkaException carrying ``KafkaError(code, message, **flags)``."""
    return KafkaException(KafkaError(code, message, **flags))


def from_api_error(exc: ApiError, **flags: bool) -> KafkaException:
    """Convert an engine :class:`ApiError` into the client's KafkaException."""
    return KafkaException(KafkaError(exc.error, exc.message, **flags))


def as_kafka_exception(exc: BaseException, context: str) -> KafkaException:
    """The KafkaException a public call raises for an error of the engine, the catalog, the
    storage or the formats (API.md "Errors": failing calls raise KafkaException). ``exc`` is
    chained as ``__cause__``; the message is ``"{context}: {exc}"``, and ``exc``'s text names the
    object (URL, topic, partition) it is about.

    The codes are Kafka's (librdkafka's for client-local conditions):

    ==========================================  ======================================  =========
    error                                       code                                    retriable
    ==========================================  ======================================  =========
    :class:`ApiError`                           its own code                            Kafka's
    ``UnsupportedFormatVersionError``           UNSUPPORTED_VERSION (35)                no
    ``CorruptObjectError`` (any FormatError)    CORRUPT_MESSAGE (2), as Fetch answers   no
    ``WriterLeaseHeldError``                    NOT_LEADER_OR_FOLLOWER (6)              yes
    ``WriterFencedError``                       _FENCED (fatal)                         no
    ``UnknownTopicError``                       UNKNOWN_TOPIC_OR_PART (3)               yes
    ``InvalidTopicError``                       INVALID_TOPIC_EXCEPTION (17)            no
    ``BucketNotFoundError``                     KAFKA_STORAGE_ERROR (56)                no
    ``StorageError`` / other ``OSError``        KAFKA_STORAGE_ERROR (56)                yes
    ``ValueError`` (e.g. a bad storage url)     _INVALID_ARG                            no
    anything else                               _FAIL                                   no
    ==========================================  ======================================  =========

    A KafkaException is returned unchanged.
    """
    from txlake.catalog.errors import InvalidTopicError, UnknownTopicError, WriterFencedError, WriterLeaseHeldError
    from txlake.catalog.storage import BucketNotFoundError
    from txlake.formats.errors import FormatError, UnsupportedFormatVersionError

    if isinstance(exc, KafkaException):
        return exc
    retriable: bool | None = None
    fatal = False
    if isinstance(exc, ApiError):
        code = exc.error
        text = exc.message
    else:
        text = str(exc) or type(exc).__name__
        if isinstance(exc, UnsupportedFormatVersionError):
            code, retriable = Errors.UNSUPPORTED_VERSION, False
        elif isinstance(exc, FormatError):
            code, retriable = Errors.CORRUPT_MESSAGE, False
        elif isinstance(exc, WriterLeaseHeldError):
            code = Errors.NOT_LEADER_OR_FOLLOWER
        elif isinstance(exc, WriterFencedError):
            code, fatal = Errors._FENCED, True
        elif isinstance(exc, UnknownTopicError):
            code = Errors.UNKNOWN_TOPIC_OR_PART
        elif isinstance(exc, InvalidTopicError):
            code = Errors.INVALID_TOPIC_EXCEPTION
        elif isinstance(exc, BucketNotFoundError):
            code, retriable = Errors.KAFKA_STORAGE_ERROR, False
        elif isinstance(exc, OSError):
            code = Errors.KAFKA_STORAGE_ERROR
        elif isinstance(exc, ValueError):
            code = Errors._INVALID_ARG
        else:
            code = Errors._FAIL
    out = KafkaException(KafkaError(code, f"{context}: {text}", fatal=fatal, retriable=retriable))
    out.__cause__ = exc
    return out


@contextmanager
def kafka_errors(context: str) -> Iterator[None]:
    """Run engine calls of a public method: any error other than a KafkaException is raised as
    :func:`as_kafka_exception` maps it (``context`` says what the call was doing)."""
    try:
        yield
    except KafkaException:
        raise
    except Exception as exc:  # noqa: BLE001 - every engine error becomes a KafkaException
        raise as_kafka_exception(exc, context) from exc


# ---------------------------------------------------------------------------------------------
# The errors of the serialization layer (confluent_kafka.serialization / confluent_kafka.error):
# what txlake.SerializingProducer.produce() and txlake.DeserializingConsumer.poll() raise.


class SerializationError(KafkaException):
    """A serializer or deserializer could not convert its input (confluent-kafka's
    ``confluent_kafka.serialization.SerializationError``; also :mod:`txlake.serialization`'s).

    The built-in serializers raise it with the text of the underlying error as the only
    argument (``args == ("unpack requires a buffer of 4 bytes",)``), so unlike a plain
    :class:`KafkaException` its ``args[0]`` is a ``str`` unless a :class:`KafkaError` is given
    (as the client errors below give one).
    """

    def __init__(self, *args: object):
        if args and isinstance(args[0], KafkaError):
            super().__init__(*args)
        else:
            Exception.__init__(self, *args)   # confluent-kafka keeps the text as it is given

    __str__ = Exception.__str__   # the text, or the KafkaError's str(); "" without arguments


class _KafkaClientError(KafkaException):
    """Base of the errors a serializing client raises (confluent-kafka's ``_KafkaClientError``).

    Args:
        kafka_error: the :class:`KafkaError`, also ``args[0]``.
        exception: the original exception (e.g. what a serializer raised), or None.
        kafka_message: the :class:`~txlake.Message` concerned, or None.

    Attributes:
        exception, kafka_message: as given; ``code`` and ``name`` are the error's
        ``code()`` and ``name()``.
    """

    def __init__(self, kafka_error: KafkaError, exception: BaseException | None = None,
                 kafka_message: object | None = None):
        super().__init__(kafka_error)
        self.exception = exception
        self.kafka_message = kafka_message

    @property
    def code(self) -> int:
        """The numeric code of ``args[0]`` (e.g. -159 for ``_VALUE_DESERIALIZATION``)."""
        return self.args[0].code()

    @property
    def name(self) -> str:
        """librdkafka's name of ``args[0]``'s code (e.g. ``"_VALUE_DESERIALIZATION"``)."""
        return self.args[0].name()


class ConsumeError(_KafkaClientError):
    """An error met while consuming (confluent-kafka's ``ConsumeError``):
    ``DeserializingConsumer.poll()`` raises it for an error event (``msg.error()``, e.g.
    ``_PARTITION_EOF``), with that message as ``kafka_message``.

    Args:
        kafka_error: the :class:`KafkaError`.
        exception: the original exception, or None.
        kafka_message: the :class:`~txlake.Message` that carried the error, or None.
    """

    def __init__(self, kafka_error: KafkaError, exception: BaseException | None = None,
                 kafka_message: object | None = None):
        super().__init__(kafka_error, exception, kafka_message)


class KeyDeserializationError(ConsumeError, SerializationError):
    """The key deserializer failed on a consumed message (confluent-kafka's
    ``KeyDeserializationError``): code ``_KEY_DESERIALIZATION`` (-160) with ``str(exception)``
    as its text; ``kafka_message`` is the message as read (raw key and value, its topic,
    partition and offset).

    Args:
        exception: what the deserializer raised.
        kafka_message: the consumed :class:`~txlake.Message`.
    """

    def __init__(self, exception: BaseException | None = None, kafka_message: object | None = None):
        super().__init__(KafkaError(KafkaError._KEY_DESERIALIZATION, str(exception)),
                         exception=exception, kafka_message=kafka_message)


class ValueDeserializationError(ConsumeError, SerializationError):
    """The value deserializer failed on a consumed message (confluent-kafka's
    ``ValueDeserializationError``): code ``_VALUE_DESERIALIZATION`` (-159), otherwise as
    :class:`KeyDeserializationError`.

    Args:
        exception: what the deserializer raised.
        kafka_message: the consumed :class:`~txlake.Message`.
    """

    def __init__(self, exception: BaseException | None = None, kafka_message: object | None = None):
        super().__init__(KafkaError(KafkaError._VALUE_DESERIALIZATION, str(exception)),
                         exception=exception, kafka_message=kafka_message)


class ProduceError(_KafkaClientError):
    """An error met while producing (confluent-kafka's ``ProduceError``); ``kafka_message`` is
    always None.

    Args:
        kafka_error: the :class:`KafkaError`.
        exception: the original exception, or None.
    """

    def __init__(self, kafka_error: KafkaError, exception: BaseException | None = None):
        super().__init__(kafka_error, exception, None)


class KeySerializationError(ProduceError, SerializationError):
    """The key serializer failed in ``SerializingProducer.produce()`` (confluent-kafka's
    ``KeySerializationError``): code ``_KEY_SERIALIZATION`` (-162) with ``str(exception)`` as
    its text; nothing was queued.

    Args:
        exception: what the serializer raised.
    """

    def __init__(self, exception: BaseException | None = None):
        super().__init__(KafkaError(KafkaError._KEY_SERIALIZATION, str(exception)), exception=exception)


class ValueSerializationError(ProduceError, SerializationError):
    """The value serializer failed in ``SerializingProducer.produce()`` (confluent-kafka's
    ``ValueSerializationError``): code ``_VALUE_SERIALIZATION`` (-161), otherwise as
    :class:`KeySerializationError`.

    Args:
        exception: what the serializer raised.
    """

    def __init__(self, exception: BaseException | None = None):
        super().__init__(KafkaError(KafkaError._VALUE_SERIALIZATION, str(exception)), exception=exception)
