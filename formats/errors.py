"""Errors raised when a persisted object cannot be decoded.

Every txlake error derives from :class:`TxlakeError`; the client layer maps them to
Kafka error codes. Messages always name the object (its URL) and what to do.
"""

from __future__ import annotations


class TxlakeError(Exception):
    """Base class of every error txlake raises on purpose."""


class FormatError(TxlakeError):
    """A persisted object cannot be decoded.

    Attributes:
        location: URL (or key) of the object that failed.
    """

    def __init__(self, location: str, message: str):
        super().__init__(f"{location}: {message}")
        self.location = location


class CorruptObjectError(FormatError):
    """The object is truncated, not Parquet, or its columns do not match its format."""


class UnsupportedFormatVersionError(FormatError):
    """The object was written by an unknown or newer format version.

    Refusing it (rather than guessing) is what keeps an older txlake from silently
    misreading data written by a newer one.
    """


class RecordBatchError(TxlakeError):
    """A Kafka record batch (message format v2) on the wire cannot be decoded or fails the
    checks a Kafka broker makes on a Produce request's records (:mod:`.record_batch`).

    Attributes:
        error_name: the Kafka error a broker answers the partition with, as Kafka's
            ``Errors`` names it: ``CORRUPT_MESSAGE`` (Kafka's ``CorruptRecordException``:
            bad CRC, impossible batch length or magic, undecodable compressed data) or
            ``INVALID_RECORD`` (Kafka's ``InvalidRecordException``: malformed records,
            counts and offsets that disagree, a format other than v2, truncated input).
        topic, partition: the topic-partition whose records failed.
        batch_index: 0-based index of the failing batch in the partition's records.
        position: byte position of the fault from the start of the partition's records
            (for a fault inside compressed records: the batch's position).
        reason: what is wrong, in words.
    """

    def __init__(self, error_name: str, topic: str, partition: int, batch_index: int, position: int, reason: str):
        super().__init__(f"{topic}-{partition}: record batch {batch_index} at byte {position}: {reason} ({error_name})")
        self.error_name = error_name
        self.topic = topic
        self.partition = partition
        self.batch_index = batch_index
        self.position = position
        self.reason = reason
