"""Errors of the catalog layer (topics, commits, writer leases)."""

from __future__ import annotations

from txlake.formats.errors import TxlakeError


class CatalogError(TxlakeError):
    """Base class of catalog errors."""


class InvalidTopicError(CatalogError):
    """A topic name Kafka would refuse (Kafka's ``InvalidTopicException``)."""


class TopicExistsError(CatalogError):
    """``create_topics`` of a name that already exists (Kafka's TOPIC_ALREADY_EXISTS)."""


class UnknownTopicError(CatalogError):
    """A topic or partition the catalog does not have (Kafka's UNKNOWN_TOPIC_OR_PARTITION)."""


class InvalidConfigError(CatalogError):
    """An unknown topic config name or an invalid value (Kafka's INVALID_CONFIG)."""


class InvalidPartitionsError(CatalogError):
    """A partition count below 1 (Kafka's INVALID_PARTITIONS)."""


class WriterLeaseHeldError(CatalogError):
    """Another live process holds the writer lease of this storage root.

    Attributes:
        holder: description of the holder (owner id, host, pid).
        expires_in_ms: how long until the holder's lease lapses if it stops renewing.
    """

    def __init__(self, message: str, holder: str, expires_in_ms: int):
        super().__init__(message)
        self.holder = holder
        self.expires_in_ms = expires_in_ms


class WriterFencedError(CatalogError):
    """This process lost the writer lease: another writer took over, so it can commit nothing."""


class CommitConflictError(CatalogError):
    """A commit number was already taken by another process (create-if-absent lost)."""
