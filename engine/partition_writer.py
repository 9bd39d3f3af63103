"""The partition writer: what the coordinators and compaction use of the partition logs.

After Kafka's ``PartitionWriter`` (``org.apache.kafka.coordinator.common.runtime``), the
interface through which Kafka's group and transaction coordinators append their records,
verify a transaction (KIP-890), delete records and read a topic's config, instead of
calling the ``ReplicaManager`` itself. Here :class:`~.broker.Broker` implements it and hands
itself, typed as this protocol, to the objects it starts: the transaction coordinator
(:mod:`.transaction_coordinator`, :mod:`.transaction_topic`), the consumer-group offsets
(:mod:`.group_offsets`), compaction (:mod:`.compaction`) and the KIP-664 admin handlers
(:mod:`.transaction_admin`). None of them imports :mod:`.broker`, so the broker can import
them without an import circle (``tests/test_engine_layering.py``).

What is beyond Kafka's interface is what these users need of one storage root and that
Kafka's coordinators get elsewhere: the catalog (topics, partitions, their configs and the
committed segments), the object store, the broker's settings, reads (Fetch of
``__consumer_offsets``, the replay of ``__transaction_state``), producer ids, transaction
markers (Kafka's ``WriteTxnMarkers``, which its coordinator sends to the partition leaders)
and compaction's catalog commits.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Callable, Protocol, runtime_checkable

from txlake.catalog.catalog import Catalog
from txlake.catalog.state import CatalogState, TopicState
from txlake.catalog.storage import ObjectStore

from .errors import Errors
from .log_reader import LogReader
from .partition_log import TxnVerifier
from .requests import BrokerConfig, FetchResult, ProduceBatch, ProduceResult, TxnMarker

__all__ = ["PartitionWriter", "TxnVerifier"]

@runtime_checkable
class PartitionWriter(Protocol):
    """The partition logs of one storage root, as the coordinators and compaction use them.

    Every method answers with Kafka error codes (:class:`~.errors.Errors`) as the broker's
    request handler of the same name does; see :class:`~.broker.Broker` for each one's
    errors. A write takes the writer lease first (``ensure_writer``); reads never need it.

    Attributes:
        store: the storage root.
        catalog: the catalog of the root (topics, partitions, configs, segments, the
            aborted-transaction index); read its ``state`` under its ``lock``.
        reader: reads committed segments (with the broker's decoded-segment cache).
        config: the broker's settings (compaction, retention, transaction and group configs).
        txn_verifier: the KIP-890 verification hook (Kafka's ``verifyTransaction``): the
            transaction coordinator's check a transactional batch that opens a transaction on
            a partition must pass; None verifies nothing.
    """

    store: ObjectStore
    catalog: Catalog
    reader: LogReader
    config: BrokerConfig
    txn_verifier: TxnVerifier | None

    @property
    def is_writer(self) -> bool:
        """True while this process holds the writer lease (it may append)."""

    def ensure_writer(self) -> None:
        """Take the writer lease if this process does not hold it (raises ApiError when it cannot)."""

    def refresh(self, min_interval_ms: int = 0) -> bool:
        """Apply catalog commits other processes made; True when there were any."""

    def topics(self) -> dict[str, TopicState]:
        """The topics (with their partitions and config overrides) as this process has seen them."""

    def create_topics(self, specs: list[tuple[str, int, dict]], validate_only: bool = False,
                      internal_topics_allowed: bool = False) -> list[tuple[Errors, str]]:
        """CreateTopics: one ``(error, message)`` per ``(name, partitions, config)``."""

    def produce(self, batches: list[ProduceBatch], timeout_ms: int = 30_000,
                internal_topics_allowed: bool = False) -> list[ProduceResult]:
        """Append (Kafka's ``PartitionWriter.append``) and wait for the commit (acks=all)."""

    def produce_async(self, batches: list[ProduceBatch], internal_topics_allowed: bool = False) -> list[Future]:
        """Append; each Future resolves to a :class:`~.requests.ProduceResult` after the commit."""

    def fetch(self, topic: str, partition: int, offset: int, max_records: int = 10_000,
              isolation_level: str = "read_uncommitted") -> FetchResult:
        """Read committed records of one partition from ``offset``."""

    def delete_records(self, requests: list[tuple[str, int, int]], timeout_ms: int = 30_000,
                       internal_topics_allowed: bool = False) -> list[tuple[Errors, int, str | None]]:
        """DeleteRecords (Kafka's ``PartitionWriter.deleteRecords``): move log start offsets."""

    def commit_under_lock(self, build: Callable[[CatalogState], list[dict] | None]) -> int | None:
        """Commit the catalog actions ``build(state)`` computes, under the commit lock and the lease."""

    def init_producer_id(self) -> tuple[Errors, int, int]:
        """A new producer id: ``(error, producer_id, epoch 0)``."""

    def append_txn_markers(self, markers: list[TxnMarker],
                           urgent: bool = True) -> list[dict[tuple[str, int], "Errors | Future"]]:
        """Queue COMMIT/ABORT markers: per marker, per partition, an error or a Future of the commit."""

    def write_txn_markers(self, markers: list[TxnMarker],
                          timeout_ms: int = 30_000) -> list[dict[tuple[str, int], Errors]]:
        """WriteTxnMarkers: queue the markers and wait for their commit."""

    def request_flush(self) -> None:
        """Commit what is queued now instead of after the writer's linger (does not wait)."""

    def producer_state_rows(self, topic: str, partition: int) -> list[dict] | None:
        """The partition's producer state as the writer holds it (None in a reader)."""
