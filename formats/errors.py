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
