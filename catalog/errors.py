"""Errors of the catalog layer (topics, commits, writer leases)."""

from __future__ import annotations

from txlake.formats.errors import CorruptObjectError, TxlakeError


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


class CatalogGapError(CorruptObjectError, CatalogError):
    """A catalog commit is missing although a later commit or checkpoint exists: the log has a gap.

    Commits are numbered and created in order, so a missing number with something after it
    means the object was lost (a partial restore, a lifecycle rule, a deleted file), never
    that it is still to come. Replaying past it would silently drop what it held, and writing
    a new commit at its number would mix another history into the log, so readers stop with
    this error and writers refuse to commit. ``txlake catalog check`` shows the gaps and
    ``txlake catalog repair`` closes them (docs/operations.md, "Checking and repairing the
    catalog"). Commits deleted by the catalog log cleanup below the checkpoint a reader
    starts from are not a gap.

    Attributes:
        location: URL of the missing commit object.
        key: its key under the storage root (``_catalog/commits/<20 digits>.parquet``).
        version: the missing commit number.
        evidence: key of an object past it (a later commit or a checkpoint at or past it).
    """

    def __init__(self, location: str, key: str, version: int, evidence: str, message: str):
        super().__init__(location, message)
        self.key = key
        self.version = version
        self.evidence = evidence

    def __reduce__(self):
        return (type(self), (self.location, self.key, self.version, self.evidence,
                             str(self).removeprefix(f"{self.location}: ")))
