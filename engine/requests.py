"""Plain data of the broker's request handlers: settings, Produce and Fetch requests/answers.

Kept apart from the handlers so the flusher (:mod:`.group_commit`), the broker and the
clients share the shapes without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from txlake.catalog.log_cleanup import DEFAULT_LOG_RETENTION_MS

from .errors import Errors
from .producer_state import NO_PRODUCER_ID

#: default ``storage.flush.interval.ms``: a steady stream of produce requests makes at most two
#: flushes a second (each two PUTs: data object + catalog commit) -- 14 400 PUTs an hour where a
#: 200 records/s trickle made 684 000 with the 5 ms linger alone; acks of such a stream wait
#: about 0.75 s (median; docs/storage-layout.md "Group commit", docs/benchmarks.md "Trickle")
DEFAULT_FLUSH_INTERVAL_MS = 500
#: default ``storage.flush.min.interval.ms``: a queue whose producers wait for their acknowledgements
#: is flushed early, at most this often -- at most 20 flushes a second (WarpStream's lowest
#: ``batchTimeout``), 144 000 PUTs an hour at the very most, for a stream that queues at least
#: ``storage.flush.idle.min.bytes`` every 50 ms (docs/storage-layout.md "The flush interval")
DEFAULT_FLUSH_MIN_INTERVAL_MS = 50
#: default ``storage.flush.idle.ms``: a queue that received no batch for this long has stopped growing
#: (more than a client's 5 ms ``linger.ms``, so a producer still sending never looks stalled)
DEFAULT_FLUSH_IDLE_MS = 10
#: default ``storage.flush.idle.min.bytes``: a stalled queue smaller than this waits for the interval
#: (a trickle's PUTs stay the interval's); 64 KiB is less than one full window of the Java
#: client's defaults (5 requests of a 16 KB batch)
DEFAULT_FLUSH_IDLE_MIN_BYTES = 64 * 1024


@dataclass
class BrokerConfig:
    """Broker-side settings (the ``storage.*`` keys of a client config, with Kafka's defaults).

    Attributes:
        flush_linger_ms: how long (ms) the flusher waits after the first queued batch to group
            more batches into one object (the storage's linger; the client's ``linger.ms`` is
            the producer's own, before it sends).
        flush_interval_ms: the shortest time (ms) from one flush taking the queue to the next
            one that only its linger ends (urgent batches and a full ``flush_max_bytes`` do
            not wait): a steady stream makes at most ``3600 s / interval`` flushes an hour.
        flush_min_interval_ms / flush_idle_ms / flush_idle_min_bytes: a queue of at least
            ``flush_idle_min_bytes`` payload bytes that received no batch for ``flush_idle_ms``
            (its producers wait for their acknowledgements) is flushed without waiting for the
            interval, but no sooner than ``flush_min_interval_ms`` after the previous flush took
            the queue; off unless ``flush_min_interval_ms < flush_interval_ms``
            (:mod:`.flush_schedule`).
        flush_max_bytes: flush at once when this many payload bytes are queued.
        num_partitions: partitions of a topic created with ``num_partitions=-1`` (Kafka's ``num.partitions``).
        lease_ms / lease_force: writer lease duration, and whether to take it over at once.
        checkpoint_interval: catalog checkpoint every this many commits.
        producer_snapshot_interval: producer-state snapshot every this many flushes.
        orphan_grace_ms: unreferenced objects younger than this are never deleted.
        file_delete_delay_ms: an object a commit stopped referencing (compaction, DeleteRecords,
            DeleteTopics) is deleted this long (ms) after that commit, so scans that started
            before it finish (Kafka's ``file.delete.delay.ms``; 1 hour here: object-store scans are long).
        compaction_interval_ms: how often (ms) the writer runs compaction in the background
            (small-file merge, key compaction, retention, object cleaning); 0 disables it.
        publish_interval_ms: how often (ms) the writer publishes each topic's Delta table
            (engine/table_publisher.py, docs/tables.md; ``lake.publish.interval.ms``); 0 disables it.
        compaction_batch_bytes: catalog bytes of segments a compaction round reads together
            (each object once for all the partitions it holds). The merge streams a batch (a
            few row groups per run in memory); key compaction holds one: its peak memory is
            about 2.5 times this.
        catalog_retention_ms: catalog commits and checkpoints a newer checkpoint covers are
            deleted by the compaction round once older than this (ms; at least 30 minutes,
            :mod:`txlake.catalog.log_cleanup`).
        handoff_poll_ms: how often (ms) the lease holder looks for writes handed over to it
            by other processes (engine/handoff.py).
        row_group_rows: rows per Parquet row group; compression: Parquet codec.
        producer_id_expiration_ms: a producer's state on a partition is forgotten after this
            long (ms) without a write and with no transaction open (Kafka's
            ``producer.id.expiration.ms``, 1 day).
        producer_id_expiration_check_interval_ms: how often (ms) the writer looks for expired
            producers (Kafka's ``producer.id.expiration.check.interval.ms``, 10 minutes).
    """

    flush_linger_ms: int = 5
    flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS
    flush_min_interval_ms: int = DEFAULT_FLUSH_MIN_INTERVAL_MS
    flush_idle_ms: int = DEFAULT_FLUSH_IDLE_MS
    flush_idle_min_bytes: int = DEFAULT_FLUSH_IDLE_MIN_BYTES
    flush_max_bytes: int = 64 * 1024 * 1024
    num_partitions: int = 1
    lease_ms: int = 15_000
    lease_force: bool = False
    checkpoint_interval: int = 100
    producer_snapshot_interval: int = 50
    orphan_grace_ms: int = 3_600_000
    file_delete_delay_ms: int = 3_600_000
    compaction_interval_ms: int = 300_000
    publish_interval_ms: int = 5_000
    compaction_batch_bytes: int = 512 * 1024 * 1024
    catalog_retention_ms: int = DEFAULT_LOG_RETENTION_MS
    handoff_poll_ms: int = 500
    row_group_rows: int = 1024 * 1024
    compression: str = "snappy"
    producer_id_expiration_ms: int = 86_400_000
    producer_id_expiration_check_interval_ms: int = 600_000
    #: the transaction coordinator's Kafka configs (``transaction.max.timeout.ms``, ...), dotted keys
    transaction: dict = field(default_factory=dict)
    #: the group coordinator's Kafka configs (``group.initial.rebalance.delay.ms``, ...), dotted keys
    group: dict = field(default_factory=dict)


@dataclass
class ProduceBatch:
    """One partition's part of a Produce request (a Kafka RecordBatch before offsets).

    Attributes:
        records: rows of :data:`~txlake.formats.records.PAYLOAD_SCHEMA` (timestamp ms, key, value, headers).
        producer_id / producer_epoch / base_sequence: -1 for a non-idempotent producer.
    """

    topic: str
    partition: int
    records: pa.Table
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = -1
    is_transactional: bool = False
    #: control batches (transaction markers) are made by the broker itself, never sent by a producer
    is_control: bool = False
    control_type: int | None = None
    coordinator_epoch: int | None = None
    #: someone waits for this batch now (a flush(), a coordinator write, a marker): the
    #: group commit starts at once instead of waiting ``flush_linger_ms`` for more batches
    urgent: bool = False
    #: the batch's size as Kafka measures it against ``max.message.bytes``: the bytes of the
    #: record batch as the client sent it (compressed); None for in-process batches, which are
    #: measured by their Arrow bytes
    size_in_bytes: int | None = None


@dataclass
class ProduceResult:
    """A partition's Produce response: error code, base offset, log-append time (ms or -1).

    ``duplicate`` is True when the batch was an exact retry whose original offsets are returned.
    """

    error: Errors
    base_offset: int = -1
    log_append_time: int = -1
    message: str = ""
    duplicate: bool = False


@dataclass
class FetchResult:
    """A partition's Fetch response: records with ``offset >= fetch offset`` below the isolation bound."""

    error: Errors
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: pa.Table | None = None
    message: str = ""
    #: read_committed: the aborted transactions with records in the fetched range
    aborted_transactions: list = field(default_factory=list)


@dataclass
class FetchedRecords:
    """A Fetch response partition's records for an in-process caller (Kafka's ``Records``
    abstraction: the log's rows as they are, where the wire carries them encoded as record
    batches v2; :func:`~txlake.engine.apis.log_apis.handle_fetch`).

    Attributes:
        rows: :data:`~txlake.formats.records.RECORD_SCHEMA` rows from the fetch offset, in
            offset order, the same rows the wire encodes: control records and the records of
            aborted transactions included (the caller drops them, as Kafka's consumer does).
        partition_leader_epoch: the leader epoch the wire's batch headers carry (the records'
            ``leader_epoch`` for a consumer, KIP-320).
        size_in_bytes: the rows' size as the fetch's byte limits count it (about their v2 size).
        error_message: the engine's message for the partition's error ("" without one; the
            wire has no field for it).
    """

    rows: pa.Table
    partition_leader_epoch: int = -1
    size_in_bytes: int = 0
    error_message: str = ""


@dataclass(frozen=True)
class TxnMarker:
    """One WriteTxnMarkers entry: end ``producer_id``'s transaction on ``partitions``.

    Attributes:
        committed: COMMIT (True) or ABORT (False) marker.
        coordinator_epoch: epoch of the transaction coordinator writing it.
        partitions: ``(topic, partition)`` pairs.
    """

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    committed: bool
    partitions: tuple[tuple[str, int], ...]
