"""The transaction coordinator's state store: Kafka's ``TransactionStateManager``.

Follows ``kafka.coordinator.transaction.TransactionStateManager`` (Scala, Kafka 3.x/4.x):

* a cache of :class:`~.transaction_metadata.TransactionMetadata` per partition of
  ``__transaction_state`` that this coordinator owns, each loaded under a *coordinator
  epoch*;
* :meth:`TransactionStateManager.append_transaction_to_log` -- write a prepared transition
  (acks=all), then complete it in the cache;
* :meth:`TransactionStateManager.load_transactions_for_partition` -- rebuild a partition's
  cache by replaying its log (the last record of a key wins, a tombstone deletes it) and
  hand back the transactions left in PrepareCommit/PrepareAbort, whose markers the
  coordinator must (re)write;
* :meth:`TransactionStateManager.timed_out_transactions` and
  :meth:`TransactionStateManager.remove_expired_transactional_ids` for the two background
  jobs (aborting timed-out transactions, expiring idle transactional ids).

Storage is reached only through the small :class:`TransactionLog` protocol, which the
broker implements over the ``__transaction_state`` topic; :class:`InMemoryTransactionLog`
serves tests.

Locking, as in Kafka: a read/write *state lock* guards the cache (loading and unloading a
partition take it exclusively; lookups and log appends share it), each metadata has its
own lock; the state lock is always taken before a metadata lock, never the other way.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np

from txlake.catalog.errors import InvalidConfigError
from txlake.catalog.topic_names import TRANSACTION_STATE_TOPIC
from txlake.formats import transaction_log
from txlake.formats.errors import CorruptObjectError

from .errors import ApiError, Errors
from .transaction_metadata import (IllegalStateError, TransactionMetadata, TransactionResult, TransactionState,
                                   TxnTransitMetadata)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- configuration
TRANSACTION_STATE_LOG_NUM_PARTITIONS_CONFIG = "transaction.state.log.num.partitions"
TRANSACTION_STATE_LOG_NUM_PARTITIONS_DEFAULT = 50
TRANSACTION_MAX_TIMEOUT_MS_CONFIG = "transaction.max.timeout.ms"
TRANSACTION_MAX_TIMEOUT_MS_DEFAULT = 900_000  # 15 minutes
TRANSACTIONAL_ID_EXPIRATION_MS_CONFIG = "transactional.id.expiration.ms"
TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT = 604_800_000  # 7 days
TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS_CONFIG = \
    "transaction.abort.timed.out.transaction.cleanup.interval.ms"
TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS_DEFAULT = 10_000
TRANSACTION_REMOVE_EXPIRED_TRANSACTION_CLEANUP_INTERVAL_MS_CONFIG = \
    "transaction.remove.expired.transaction.cleanup.interval.ms"
TRANSACTION_REMOVE_EXPIRED_TRANSACTION_CLEANUP_INTERVAL_MS_DEFAULT = 3_600_000  # 1 hour

_INT32_MAX = 2**31 - 1
#: tombstones written per append when expiring transactional ids (Kafka bounds them by max.message.bytes)
EXPIRATION_BATCH_SIZE = 1000
#: records the fast replay handles at a time when the log only offers ``read``
REPLAY_CHUNK_RECORDS = 65_536
_DEAD_NAME = TransactionState.DEAD.state_name
_FENCE_NAME = TransactionState.PREPARE_EPOCH_FENCE.state_name
_STATE_BY_NAME = {state.state_name: state for state in TransactionState}
_BYTES_OR_NONE = {bytes, type(None)}


class _NotFast(Exception):
    """The fast replay met a record it cannot vouch for; the record-by-record replay takes over."""


@dataclass(frozen=True)
class TransactionConfig:
    """The coordinator's settings with Kafka's defaults (Kafka's ``TransactionConfig``)."""

    transactional_id_expiration_ms: int = TRANSACTIONAL_ID_EXPIRATION_MS_DEFAULT
    transaction_max_timeout_ms: int = TRANSACTION_MAX_TIMEOUT_MS_DEFAULT
    transaction_log_num_partitions: int = TRANSACTION_STATE_LOG_NUM_PARTITIONS_DEFAULT
    abort_timed_out_transactions_interval_ms: int = TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS_DEFAULT
    remove_expired_transactional_ids_interval_ms: int = TRANSACTION_REMOVE_EXPIRED_TRANSACTION_CLEANUP_INTERVAL_MS_DEFAULT

    _KEYS = {
        TRANSACTIONAL_ID_EXPIRATION_MS_CONFIG: "transactional_id_expiration_ms",
        TRANSACTION_MAX_TIMEOUT_MS_CONFIG: "transaction_max_timeout_ms",
        TRANSACTION_STATE_LOG_NUM_PARTITIONS_CONFIG: "transaction_log_num_partitions",
        TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS_CONFIG: "abort_timed_out_transactions_interval_ms",
        TRANSACTION_REMOVE_EXPIRED_TRANSACTION_CLEANUP_INTERVAL_MS_CONFIG: "remove_expired_transactional_ids_interval_ms",
    }

    def __post_init__(self) -> None:
        for key, attr in self._KEYS.items():
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _INT32_MAX:
                raise InvalidConfigError(f"Invalid value {value!r} for configuration {key}: "
                                         f"Value must be an integer in 1..{_INT32_MAX}")

    @classmethod
    def from_properties(cls, props: dict) -> TransactionConfig:
        """Build from Kafka's dotted keys; other keys are ignored, values may be strings.

        Raises:
            InvalidConfigError: a value is not an integer >= 1 (Kafka's ``atLeast(1)``).
        """
        kwargs = {}
        for key, attr in cls._KEYS.items():
            if key in props:
                raw = props[key]
                try:
                    kwargs[attr] = int(raw) if isinstance(raw, str) else raw
                except ValueError:
                    raise InvalidConfigError(f"Invalid value {raw!r} for configuration {key}: "
                                             "Not a number of type INT") from None
        return cls(**kwargs)


# ---------------------------------------------------------------------------- partitioning
def java_string_hash_code(value: str) -> int:
    """Java's ``String.hashCode()``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, as an int32."""
    h = 0
    data = value.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 2**32 if h >= 2**31 else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: ``abs(n)``, except that ``Integer.MIN_VALUE`` maps to 0."""
    return 0 if n == -(2**31) else abs(n)


def partition_for(transactional_id: str, num_partitions: int = TRANSACTION_STATE_LOG_NUM_PARTITIONS_DEFAULT) -> int:
    """The ``__transaction_state`` partition of a transactional id (Kafka's ``partitionFor``).

    ``Utils.abs(transactionalId.hashCode) % transaction.state.log.num.partitions``.
    """
    if num_partitions < 1:
        raise ValueError(f"{TRANSACTION_STATE_LOG_NUM_PARTITIONS_CONFIG} must be >= 1, got {num_partitions}")
    return kafka_abs(java_string_hash_code(transactional_id)) % num_partitions


def _partitions_for(transactional_ids: Sequence[str], num_partitions: int) -> np.ndarray:
    """:func:`partition_for` of many ids at once (vectorised over the ASCII ones)."""
    out = np.empty(len(transactional_ids), np.int64)
    ascii_idx = [i for i, t in enumerate(transactional_ids) if t.isascii()]
    if len(ascii_idx) < len(transactional_ids):
        for i, t in enumerate(transactional_ids):
            if not t.isascii():
                out[i] = partition_for(t, num_partitions)
    if not ascii_idx:
        return out
    ids = [transactional_ids[i] for i in ascii_idx]
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    longest = int(lengths.max())
    if longest > 1 << 20:  # the sums below stay exact in uint64 up to here
        out[ascii_idx] = [partition_for(t, num_partitions) for t in ids]
        return out
    # hashCode = sum(c[k] * 31^(n-1-k)) mod 2^32; an ASCII character is one UTF-16 code unit
    codes = np.frombuffer("".join(ids).encode("ascii"), np.uint8).astype(np.uint64)
    powers = np.empty(max(longest, 1), np.uint64)
    powers[0] = 1
    for e in range(1, longest):
        powers[e] = (powers[e - 1] * np.uint64(31)) & np.uint64(0xFFFFFFFF)
    ends = np.cumsum(lengths)
    exponents = np.repeat(ends - 1, lengths) - np.arange(codes.size)
    terms = codes * powers[exponents]
    hashes = np.zeros(len(ids), np.uint64)
    nonempty = lengths > 0
    if codes.size:
        hashes[nonempty] = np.add.reduceat(terms, (ends - lengths)[nonempty])
    signed = (hashes & np.uint64(0xFFFFFFFF)).astype(np.int64)
    signed[signed >= 2**31] -= 2**32
    absolute = np.where(signed == -(2**31), 0, np.abs(signed))  # Kafka's Utils.abs
    out[ascii_idx] = absolute % num_partitions
    return out


# ---------------------------------------------------------------------------- storage protocol
@runtime_checkable
class TransactionLog(Protocol):
    """The partitions of ``__transaction_state`` as the state manager needs them.

    ``append`` is durable when it returns (acks=all); a failure raises -- preferably an
    :class:`ApiError` with the broker's error code (NOT_LEADER_OR_FOLLOWER,
    KAFKA_STORAGE_ERROR, REQUEST_TIMED_OUT, MESSAGE_TOO_LARGE, ...). ``read`` yields the
    whole partition, ``(offset, key, value)`` in offset order, ``value`` None for a
    tombstone. An implementation may offer ``append_async(partition, key, value, urgent)``: the
    record is queued and a future resolves to its offset once durable; records queued after
    it are never durable without it. It may also offer ``append_many(partition, records)``
    (one durable batch of ``(key, value)`` pairs, returns the first offset); the
    expiration job then needs one write per partition instead of one per id. It may also
    offer ``read_chunks(partition)``, the same records as ``(offsets, keys, values)`` lists
    a chunk at a time, which saves the replay a tuple per record.
    """

    def append(self, partition: int, key: bytes, value: bytes | None) -> int: ...

    def read(self, partition: int) -> Iterable[tuple[int, bytes, bytes | None]]: ...


class InMemoryTransactionLog:
    """A :class:`TransactionLog` kept in memory (tests, and a model of the real one).

    Failures can be injected: :meth:`fail_next` makes the next appends raise.
    """

    def __init__(self, num_partitions: int = TRANSACTION_STATE_LOG_NUM_PARTITIONS_DEFAULT):
        self.num_partitions = num_partitions
        self._records: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
        self._next_offset: dict[int, int] = {}
        self._failures: list[BaseException] = []
        self._lock = threading.Lock()
        self.appends = 0

    def fail_next(self, *errors: BaseException) -> None:
        """Make the next ``len(errors)`` appends raise these errors, in order (nothing is written)."""
        with self._lock:
            self._failures.extend(errors)

    def _check(self, partition: int) -> None:
        if not 0 <= partition < self.num_partitions:
            raise ApiError(Errors.UNKNOWN_TOPIC_OR_PART,
                           f"{TRANSACTION_STATE_TOPIC} has {self.num_partitions} partitions, not {partition}")

    def append(self, partition: int, key: bytes, value: bytes | None) -> int:
        """Append one record; returns its offset."""
        return self.append_many(partition, [(key, value)])

    def append_many(self, partition: int, records: Sequence[tuple[bytes, bytes | None]]) -> int:
        """Append records as one batch (all or nothing); returns the first offset."""
        with self._lock:
            self._check(partition)
            if self._failures:
                raise self._failures.pop(0)
            self.appends += 1
            part = self._records.setdefault(partition, [])
            first = self._next_offset.get(partition, 0)
            for i, (key, value) in enumerate(records):
                part.append((first + i, bytes(key), None if value is None else bytes(value)))
            self._next_offset[partition] = first + len(records)
            return first

    def read(self, partition: int) -> list[tuple[int, bytes, bytes | None]]:
        """The records of a partition in offset order."""
        with self._lock:
            self._check(partition)
            return list(self._records.get(partition, []))

    def compact(self, partition: int, drop_tombstones: bool = False) -> None:
        """Keep only the last record of each key (offsets unchanged), like log compaction."""
        with self._lock:
            part = self._records.get(partition, [])
            last = {key: offset for offset, key, _ in part}
            self._records[partition] = [r for r in part if last[r[1]] == r[0]
                                        and not (drop_tombstones and r[2] is None)]


# ---------------------------------------------------------------------------- result shapes
class CoordinatorEpochAndTxnMetadata(NamedTuple):
    """A cached metadata and the coordinator epoch its partition was loaded under."""

    coordinator_epoch: int
    transaction_metadata: TransactionMetadata


class TransactionalIdAndProducerIdEpoch(NamedTuple):
    """A timed-out transaction (Kafka's ``TransactionalIdAndProducerIdEpoch``)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


class TransactionalIdCoordinatorEpochAndTransitMetadata(NamedTuple):
    """A loaded transaction that must be completed (Kafka's class of the same name).

    The coordinator writes ``result`` markers to ``txn_metadata.topic_partitions`` with
    ``coordinator_epoch``, then appends ``transit_metadata`` (CompleteCommit/CompleteAbort,
    already prepared: the metadata's pending state is set).
    """

    transactional_id: str
    coordinator_epoch: int
    result: TransactionResult
    txn_metadata: TransactionMetadata
    transit_metadata: TxnTransitMetadata

    @property
    def transaction_metadata(self) -> TransactionMetadata:
        """``txn_metadata`` under the name :class:`CoordinatorEpochAndTxnMetadata` uses."""
        return self.txn_metadata


@dataclass(frozen=True)
class TxnLogAppend:
    """A transition record queued for ``__transaction_state`` by
    :meth:`TransactionStateManager.queue_transaction_to_log`.

    ``written`` resolves to the record's offset once it is durable (or raises); ``refused``
    is the answer when nothing was queued (the id is not cached under the coordinator epoch).
    """

    transactional_id: str
    coordinator_epoch: int
    transit: TxnTransitMetadata
    written: Future | None = None
    refused: Errors | None = None


class ListedTransaction(NamedTuple):
    """One row of ListTransactions (KIP-664)."""

    transactional_id: str
    producer_id: int
    state: str


class ListTransactionsResult(NamedTuple):
    """ListTransactions' answer: error, transactions, and state filters that named no state."""

    error: Errors
    transaction_states: list[ListedTransaction]
    unknown_state_filters: list[str]


@dataclass
class _CacheEntry:
    coordinator_epoch: int
    metadata: dict[str, TransactionMetadata] = field(default_factory=dict)


class _StateLock:
    """Kafka's ``ReentrantReadWriteLock`` as used here: shared for lookups and appends, exclusive for (un)loading.

    Readers never wait for a queued writer, so a thread may take the shared lock again
    while holding it; the writing thread may take the shared lock too.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer: int | None = None
        self._writer_depth = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer != me:
                while self._writer is not None:
                    self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._writer_depth += 1
            else:
                while self._writer is not None or self._readers:
                    self._cond.wait()
                self._writer, self._writer_depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._writer_depth -= 1
                if self._writer_depth == 0:
                    self._writer = None
                    self._cond.notify_all()


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------- the manager
class TransactionStateManager:
    """Kafka's ``TransactionStateManager`` over a :class:`TransactionLog` (thread-safe).

    Args:
        txn_log: the ``__transaction_state`` partitions.
        config: settings (Kafka's defaults when None).
        time_ms: clock in ms (tests inject one); methods taking ``now`` default to it.
    """

    def __init__(self, txn_log: TransactionLog, config: TransactionConfig | None = None,
                 time_ms: Callable[[], int] = _now_ms):
        self.txn_log = txn_log
        self.config = config or TransactionConfig()
        self.time_ms = time_ms
        self._state_lock = _StateLock()
        self._cache: dict[int, _CacheEntry] = {}
        self._loading: set[tuple[int, int]] = set()
        self._shutting_down = False
        self._expiration_stop: threading.Event | None = None
        self._expiration_thread: threading.Thread | None = None

    # ------------------------------------------------------------------ basics
    @property
    def transaction_topic_partition_count(self) -> int:
        """``transaction.state.log.num.partitions``."""
        return self.config.transaction_log_num_partitions

    def partition_for(self, transactional_id: str) -> int:
        """The ``__transaction_state`` partition of ``transactional_id`` (Kafka's ``partitionFor``)."""
        return partition_for(transactional_id, self.config.transaction_log_num_partitions)

    def validate_transaction_timeout_ms(self, txn_timeout_ms: int) -> bool:
        """``0 < timeout <= transaction.max.timeout.ms`` (Kafka's ``validateTransactionTimeoutMs``)."""
        return 0 < txn_timeout_ms <= self.config.transaction_max_timeout_ms

    def owned_partitions(self) -> dict[int, int]:
        """``{partition: coordinator epoch}`` of the loaded partitions."""
        with self._state_lock.read():
            return {p: e.coordinator_epoch for p, e in self._cache.items()}

    def is_loading(self, partition: int) -> bool:
        """True while ``partition`` is being loaded."""
        with self._state_lock.read():
            return any(p == partition for p, _ in self._loading)

    def coordinator_epoch_for(self, partition: int) -> int | None:
        """The coordinator epoch ``partition`` was loaded under, or None if it is not owned."""
        with self._state_lock.read():
            entry = self._cache.get(partition)
            return None if entry is None else entry.coordinator_epoch

    # ------------------------------------------------------------------ lookups
    def _get_and_maybe_add(self, transactional_id: str,
                           created: TransactionMetadata | None) -> CoordinatorEpochAndTxnMetadata | None:
        with self._state_lock.read():
            partition = self.partition_for(transactional_id)
            if any(p == partition for p, _ in self._loading):
                raise ApiError(Errors.COORDINATOR_LOAD_IN_PROGRESS,
                               f"{TRANSACTION_STATE_TOPIC}-{partition} of transactional id {transactional_id} is loading")
            entry = self._cache.get(partition)
            if entry is None:
                raise ApiError(Errors.NOT_COORDINATOR,
                               f"this coordinator does not own {TRANSACTION_STATE_TOPIC}-{partition} "
                               f"(transactional id {transactional_id})")
            metadata = entry.metadata.get(transactional_id)
            if metadata is None and created is not None:
                metadata = entry.metadata.setdefault(transactional_id, created)
            return None if metadata is None else CoordinatorEpochAndTxnMetadata(entry.coordinator_epoch, metadata)

    def get_transaction_state(self, transactional_id: str) -> CoordinatorEpochAndTxnMetadata | None:
        """The cached metadata of ``transactional_id`` and its coordinator epoch, None if unknown.

        Follows Kafka's ``getTransactionState``.

        Raises:
            ApiError: COORDINATOR_LOAD_IN_PROGRESS while its partition loads; NOT_COORDINATOR
                when this coordinator does not own the partition.
        """
        return self._get_and_maybe_add(transactional_id, None)

    def put_transaction_state_if_not_exists(self, metadata: TransactionMetadata) -> CoordinatorEpochAndTxnMetadata:
        """Cache ``metadata`` unless its id is cached already; return the cached one.

        Follows Kafka's ``putTransactionStateIfNotExists``.

        Raises:
            ApiError: as :meth:`get_transaction_state`.
        """
        result = self._get_and_maybe_add(metadata.transactional_id, metadata)
        assert result is not None
        return result

    def list_transaction_states(self, filter_producer_ids: Iterable[int] = (), filter_state_names: Iterable[str] = (),
                                filter_duration_ms: int = -1, now: int | None = None,
                                filter_transactional_id_pattern: str | None = None) -> ListTransactionsResult:
        """ListTransactions (KIP-664, Kafka's ``listTransactionStates``).

        Dead transactions are never listed; a duration filter keeps transactions running
        longer than ``filter_duration_ms`` (by start time); a transactional id pattern
        (KIP-1152) keeps ids the regular expression matches whole (Java's
        ``Matcher.matches``), None or empty = no filter; unknown state names are reported.
        Every filter given must hold. An invalid pattern answers INVALID_REGULAR_EXPRESSION.
        """
        pattern = None
        if filter_transactional_id_pattern:
            try:
                pattern = re.compile(filter_transactional_id_pattern)
            except re.error:
                return ListTransactionsResult(Errors.INVALID_REGULAR_EXPRESSION, [], [])
        now = self.time_ms() if now is None else now
        producer_ids = set(filter_producer_ids)
        state_names = list(filter_state_names)
        states = {TransactionState.from_name(n) for n in state_names} - {None}
        unknown = [n for n in state_names if TransactionState.from_name(n) is None]
        with self._state_lock.read():
            if self._loading:
                return ListTransactionsResult(Errors.COORDINATOR_LOAD_IN_PROGRESS, [], [])
            out: list[ListedTransaction] = []
            for entry in self._cache.values():
                for md in list(entry.metadata.values()):
                    with md.lock:
                        if md.state is TransactionState.DEAD:
                            continue
                        if producer_ids and md.producer_id not in producer_ids:
                            continue
                        if state_names and md.state not in states:
                            continue
                        if filter_duration_ms >= 0 and now - md.txn_start_timestamp <= filter_duration_ms:
                            continue
                        if pattern is not None and pattern.fullmatch(md.transactional_id) is None:
                            continue
                        out.append(ListedTransaction(md.transactional_id, md.producer_id, md.state.state_name))
            return ListTransactionsResult(Errors.NO_ERROR, out, unknown)

    # ------------------------------------------------------------------ appending
    @staticmethod
    def _coordinator_error(exc: BaseException) -> Errors:
        """Map a failed log append to the coordinator's answer (Kafka's ``updateCacheCallback``)."""
        code = exc.error if isinstance(exc, ApiError) else Errors.KAFKA_STORAGE_ERROR
        if code in (Errors.UNKNOWN_TOPIC_OR_PART, Errors.REQUEST_TIMED_OUT, Errors._TIMED_OUT, Errors._MSG_TIMED_OUT):
            return Errors.COORDINATOR_NOT_AVAILABLE
        if code in (Errors.NOT_LEADER_OR_FOLLOWER, Errors.KAFKA_STORAGE_ERROR, Errors._FENCED):
            return Errors.NOT_COORDINATOR
        if code in (Errors.MESSAGE_TOO_LARGE, Errors.RECORD_LIST_TOO_LARGE):
            return Errors.UNKNOWN_SERVER_ERROR
        return code

    def append_transaction_to_log(self, transactional_id: str, coordinator_epoch: int, transit: TxnTransitMetadata,
                                  retry_on_error: Callable[[Errors], bool] | None = None) -> Errors:
        """Write a prepared transition durably, then complete it in the cache.

        Follows Kafka's ``appendTransactionToLog``: the record is written only if the
        transactional id is still cached under ``coordinator_epoch``; once it is durable
        the transition completes if the epoch still matches. A failed write is mapped to
        the coordinator's error code (UNKNOWN_TOPIC_OR_PARTITION and timeouts ->
        COORDINATOR_NOT_AVAILABLE; NOT_LEADER_OR_FOLLOWER, storage errors and a lost writer
        lease -> NOT_COORDINATOR; MESSAGE_TOO_LARGE/RECORD_LIST_TOO_LARGE ->
        UNKNOWN_SERVER_ERROR) and the pending state is cleared -- unless
        ``retry_on_error(error)`` says the caller will retry with the same transit.
        :meth:`queue_transaction_to_log` and :meth:`complete_transaction_append` are its
        two halves, for a caller that answers before the record is durable.

        Returns:
            NO_ERROR, or the error for the client (COORDINATOR_LOAD_IN_PROGRESS,
            NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, ...).

        Raises:
            IllegalStateError: the transit cannot be completed (a coordinator bug, as
                Kafka's ``completeTransitionTo`` throws); PrepareEpochFence and Dead transits
                are refused before anything is written (they are never persisted).
        """
        return self.complete_transaction_append(self.queue_transaction_to_log(transactional_id, coordinator_epoch, transit),
                                                retry_on_error)

    def queue_transaction_to_log(self, transactional_id: str, coordinator_epoch: int,
                                 transit: TxnTransitMetadata, urgent: bool = True) -> TxnLogAppend:
        """First half of :meth:`append_transaction_to_log`: check that ``transactional_id`` is
        cached under ``coordinator_epoch`` and queue its record (the shared state lock is held
        only while queueing, as Kafka holds it around ``appendRecords``).

        With a log that offers ``append_async`` the record is only queued: the writer commits
        in queue order and stops at its first failed commit, so a record queued after it is
        never durable without it; ``urgent`` False lets it wait for the writer's linger (nobody
        waits for it: it commits with the records queued behind it). Otherwise the record is
        written here.

        Raises:
            IllegalStateError: a PrepareEpochFence or Dead transit (never persisted).
        """
        if transit.txn_state in (TransactionState.PREPARE_EPOCH_FENCE, TransactionState.DEAD):
            raise IllegalStateError(f"{transit.txn_state} is never written to {TRANSACTION_STATE_TOPIC} "
                                    f"(transactional id {transactional_id}): {transit}")
        key = transaction_log.encode_key(transactional_id)
        value = transaction_log.encode_value(transit.to_log_value())
        partition = self.partition_for(transactional_id)
        with self._state_lock.read():
            # the shared lock is held across the queueing so that an unload + reload under a new
            # coordinator epoch cannot slip in between the epoch check and the append
            try:
                current = self.get_transaction_state(transactional_id)
            except ApiError as exc:
                return TxnLogAppend(transactional_id, coordinator_epoch, transit, refused=exc.error)
            if current is None:
                return TxnLogAppend(transactional_id, coordinator_epoch, transit, refused=Errors.NOT_COORDINATOR)
            with current.transaction_metadata.lock:
                if current.coordinator_epoch != coordinator_epoch:
                    return TxnLogAppend(transactional_id, coordinator_epoch, transit, refused=Errors.NOT_COORDINATOR)
            append_async = getattr(self.txn_log, "append_async", None)
            if append_async is not None:
                try:
                    written = append_async(partition, key, value, urgent=urgent)
                except Exception as exc:  # noqa: BLE001 - answered as a failed write
                    written = Future()
                    written.set_exception(exc)
            else:
                written = Future()
                try:
                    written.set_result(self.txn_log.append(partition, key, value))
                except Exception as exc:  # noqa: BLE001 - answered as a failed write
                    written.set_exception(exc)
        return TxnLogAppend(transactional_id, coordinator_epoch, transit, written=written)

    def complete_transaction_append(self, append: TxnLogAppend,
                                    retry_on_error: Callable[[Errors], bool] | None = None) -> Errors:
        """Second half of :meth:`append_transaction_to_log`: wait until the queued record is
        durable, then complete the transition (or, when the write failed, map the error and
        clear the pending state). Returns the answer for the client.

        Raises:
            IllegalStateError: the transit cannot be completed (a coordinator bug).
        """
        if append.refused is not None:
            return append.refused
        transactional_id, coordinator_epoch, transit = append.transactional_id, append.coordinator_epoch, append.transit
        append_error: Errors | None = None
        try:
            append.written.result()
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error code
            append_error = self._coordinator_error(exc)
            log.info("appending %s's new metadata %s failed: %s (answering %s)", transactional_id, transit,
                     exc, append_error.name)

        if append_error is None:
            try:
                current = self.get_transaction_state(transactional_id)
            except ApiError as exc:
                return exc.error
            if current is None:
                return Errors.NOT_COORDINATOR
            metadata = current.transaction_metadata
            with metadata.lock:
                if current.coordinator_epoch != coordinator_epoch:
                    return Errors.NOT_COORDINATOR
                metadata.complete_transition_to(transit)
            return Errors.NO_ERROR

        try:
            current = self.get_transaction_state(transactional_id)
        except ApiError:
            current = None
        if current is not None:
            metadata = current.transaction_metadata
            with metadata.lock:
                if current.coordinator_epoch == coordinator_epoch and not (retry_on_error and retry_on_error(append_error)):
                    metadata.pending_state = None
        return append_error

    # ------------------------------------------------------------------ loading
    def _read_partition(self, partition: int, coordinator_epoch: int) -> dict[str, TransactionMetadata]:
        """Replay ``partition``: the fast replay, or record by record when it cannot vouch for a record."""
        try:
            return self._replay_fast(partition)
        except _NotFast as exc:
            log.info("%s-%d: replaying record by record (%s)", TRANSACTION_STATE_TOPIC, partition, exc)
        return self._replay_records(partition, self.txn_log.read(partition))

    def _replay_records(self, partition: int,
                        records: Iterable[tuple[int, bytes | None, bytes | None]]) -> dict[str, TransactionMetadata]:
        """Kafka's replay, one record at a time: decode each key and value, the last record of a
        transactional id wins, a tombstone (or Dead) removes it.

        Raises:
            CorruptObjectError, UnsupportedFormatVersionError: at the first bad record.
        """
        loaded: dict[str, TransactionMetadata] = {}
        checked: set[str] = set()  # ids whose partition was checked
        for offset, key, value in records:
            if self._shutting_down:
                break
            location = f"{TRANSACTION_STATE_TOPIC}-{partition}@{offset}"
            if key is None:
                raise CorruptObjectError(location, "a record of the transaction state log has no key; the log is corrupt")
            tid = transaction_log.decode_key(key, location)
            decoded = transaction_log.decode_value(value, location)
            if decoded is None or decoded.state == TransactionState.DEAD.state_name:
                loaded.pop(tid, None)  # a tombstone (Dead is never written; read it as one)
                continue
            if tid not in checked:
                self._check_partition(tid, partition, location)
                checked.add(tid)
            md = TransactionMetadata.from_log_value(tid, decoded)
            if md.state is TransactionState.PREPARE_EPOCH_FENCE:
                # Kafka never writes PrepareEpochFence; if one is found, resume the fenced
                # transaction as Ongoing under its bumped epoch: the old producer stays
                # fenced and the next InitProducerId or the timeout aborts it
                log.warning("%s: %s was in PrepareEpochFence; loading it as Ongoing", location, tid)
                md.state = TransactionState.ONGOING
            loaded[tid] = md
        return loaded

    def _check_partition(self, tid: str, partition: int, location: str) -> None:
        actual = self.partition_for(tid)
        if actual != partition:
            raise CorruptObjectError(location, f"transactional id {tid!r} belongs to partition {actual}, "
                                               f"not {partition}: the record is misplaced")

    def _log_chunks(self, partition: int) -> Iterator[tuple[list, list, list]]:
        """The partition's records as ``(offsets, keys, values)`` lists, a chunk at a time."""
        read_chunks = getattr(self.txn_log, "read_chunks", None)
        if read_chunks is not None:
            yield from read_chunks(partition)
            return
        records = self.txn_log.read(partition)
        records = records if isinstance(records, list) else list(records)
        for i in range(0, len(records), REPLAY_CHUNK_RECORDS):
            offsets, keys, values = zip(*records[i:i + REPLAY_CHUNK_RECORDS])
            if not set(map(type, keys)) <= _BYTES_OR_NONE or not set(map(type, values)) <= _BYTES_OR_NONE:
                raise _NotFast("a key or value that is not bytes")
            yield list(offsets), list(keys), list(values)

    def _replay_fast(self, partition: int) -> dict[str, TransactionMetadata]:
        """The replay of :meth:`_replay_records` -- same result, same order of the ids -- with
        little work per record.

        Each distinct key is decoded once; every value is checked, as Kafka decodes every
        record, but in bulk (:func:`transaction_log.check_canonical_values`), and only the
        last record of each id is read into metadata; the partition of each id is checked
        once, vectorised. A value outside the canonical form is decoded with
        :func:`transaction_log.decode_value`.

        Raises:
            _NotFast: a record that is missing its key, cannot be decoded, or names an id of
                another partition: :meth:`_replay_records` then replays the partition and
                raises the exact error at the exact record.
        """
        canonical_key = transaction_log.CANONICAL_KEY.fullmatch
        location = f"{TRANSACTION_STATE_TOPIC}-{partition}"
        tid_number: dict[bytes, int] = {}    # key bytes -> id number (two spellings of a key may name one id)
        number_of: dict[str, int] = {}       # id -> id number
        tids: list[str] = []                 # id number -> id
        # the record-by-record replay's dict: id number -> its last value (canonical bytes or a
        # TxnLogValue), in the same order
        last: dict[int, object] = {}
        removed_live: set[int] = set()  # ids a tombstone removed after a live record (their partition is checked too)
        for offsets, keys, values in self._log_chunks(partition):
            if self._shutting_down:
                return {}
            if None in keys:
                raise _NotFast("a record without a key")
            for key in dict.fromkeys(keys):
                if key in tid_number:
                    continue
                m = canonical_key(key)
                if m is not None:
                    tid = m.group(1).decode("ascii")
                else:
                    try:
                        tid = transaction_log.decode_key(key, location)
                    except Exception as exc:  # noqa: BLE001 - the record-by-record replay reports it
                        raise _NotFast(f"an undecodable key ({exc})") from None
                number = number_of.get(tid)
                if number is None:
                    number = number_of[tid] = len(tids)
                    tids.append(tid)
                tid_number[key] = number
            numbers = list(map(tid_number.__getitem__, keys))
            tombstones = values.count(None)
            canonical = transaction_log.check_canonical_values(
                [v for v in values if v is not None] if tombstones else values)
            special = bool(tombstones)  # a tombstone, Dead or PrepareEpochFence: replay this chunk record by record
            if canonical is not None:  # values outside the canonical form: decode them
                values = list(values)
                flags = iter(canonical)
                for i, value in enumerate(values):
                    if value is not None and not next(flags):
                        try:
                            values[i] = decoded = transaction_log.decode_value(value, location)
                        except Exception as exc:  # noqa: BLE001 - the record-by-record replay reports it
                            raise _NotFast(f"an undecodable value ({exc})") from None
                        special = special or decoded.state in (_DEAD_NAME, _FENCE_NAME)
            if special:
                for i, (number, value) in enumerate(zip(numbers, values)):
                    # a canonical value (bytes) is never Dead nor PrepareEpochFence
                    if value is None or (type(value) is not bytes and value.state == _DEAD_NAME):
                        if last.pop(number, None) is not None:  # a tombstone (Dead is never written; read it as one)
                            removed_live.add(number)
                        continue
                    if type(value) is not bytes and value.state == _FENCE_NAME:
                        log.warning("%s@%d: %s was in PrepareEpochFence; loading it as Ongoing", location,
                                    offsets[i], tids[number])
                    last[number] = value
            else:
                last.update(zip(numbers, values))
        live = removed_live.union(last)  # the ids with a live record: the record-by-record replay checks their partition
        if live:
            checked = [tids[n] for n in live]
            wrong = _partitions_for(checked, self.config.transaction_log_num_partitions) != partition
            if wrong.any():
                raise _NotFast(f"transactional id {checked[int(wrong.argmax())]!r} of another partition")
        loaded: dict[str, TransactionMetadata] = {}
        empty = TransactionState.EMPTY
        for number, value in last.items():
            tid = tids[number]
            if type(value) is bytes:
                (producer_id, previous_producer_id, next_producer_id, producer_epoch, last_producer_epoch,
                 txn_timeout_ms, state_name, topic_partitions, txn_start_timestamp,
                 txn_last_update_timestamp) = transaction_log.canonical_value_fields(value)
                state = _STATE_BY_NAME[state_name]
                md = TransactionMetadata(
                    tid, producer_id, previous_producer_id=previous_producer_id, next_producer_id=next_producer_id,
                    producer_epoch=producer_epoch, last_producer_epoch=last_producer_epoch, txn_timeout_ms=txn_timeout_ms,
                    state=state, topic_partitions=() if state is empty else topic_partitions,
                    txn_start_timestamp=txn_start_timestamp, txn_last_update_timestamp=txn_last_update_timestamp)
            else:
                md = TransactionMetadata.from_log_value(tid, value)
            if md.state is TransactionState.PREPARE_EPOCH_FENCE:
                md.state = TransactionState.ONGOING  # as in _replay_records (the warning was logged above)
            loaded[tid] = md
        return loaded

    def load_transactions_for_partition(self, partition: int, coordinator_epoch: int,
                                        now: int | None = None) -> list[TransactionalIdCoordinatorEpochAndTransitMetadata]:
        """Become the coordinator of ``partition``: replay its log into the cache.

        Follows Kafka's ``loadTransactionsForTxnTopicPartition``: while loading, lookups
        answer COORDINATOR_LOAD_IN_PROGRESS; afterwards the cache entry (replacing any
        earlier one) carries ``coordinator_epoch``. Every transaction left in PrepareCommit
        or PrepareAbort gets its completion prepared (``prepare_complete``); they are
        returned so the coordinator writes their markers and then appends the transits.

        Raises:
            CorruptObjectError, UnsupportedFormatVersionError: a record cannot be decoded
                (the partition is then not loaded; nothing is changed).
        """
        if not 0 <= partition < self.config.transaction_log_num_partitions:
            raise ValueError(f"{TRANSACTION_STATE_TOPIC} has {self.config.transaction_log_num_partitions} partitions, "
                             f"not {partition}")
        key = (partition, coordinator_epoch)
        with self._state_lock.write():
            self._loading.add(key)
        try:
            loaded = self._read_partition(partition, coordinator_epoch)
        except BaseException:
            with self._state_lock.write():
                self._loading.discard(key)
            raise
        now = self.time_ms() if now is None else now
        pending: list[TransactionalIdCoordinatorEpochAndTransitMetadata] = []
        with self._state_lock.write():
            if key not in self._loading or self._shutting_down:  # unloaded (or shut down) meanwhile
                self._loading.discard(key)
                return []
            previous = self._cache.get(partition)
            if previous is not None:
                log.info("unloading %s-%d (epoch %d) to load it at epoch %d", TRANSACTION_STATE_TOPIC, partition,
                         previous.coordinator_epoch, coordinator_epoch)
            self._cache[partition] = _CacheEntry(coordinator_epoch, loaded)
            for tid, md in loaded.items():
                with md.lock:
                    if md.state is TransactionState.PREPARE_COMMIT:
                        result = TransactionResult.COMMIT
                    elif md.state is TransactionState.PREPARE_ABORT:
                        result = TransactionResult.ABORT
                    else:
                        continue
                    pending.append(TransactionalIdCoordinatorEpochAndTransitMetadata(
                        tid, coordinator_epoch, result, md, md.prepare_complete(now)))
            self._loading.discard(key)
        # every writer loads every partition when it takes the lease: say so only when there was something
        log.log(logging.INFO if loaded else logging.DEBUG,
                "loaded %d transactional ids from %s-%d at coordinator epoch %d (%d to complete)", len(loaded),
                TRANSACTION_STATE_TOPIC, partition, coordinator_epoch, len(pending))
        return pending

    def remove_transactions_for_partition(self, partition: int, coordinator_epoch: int | None = None) -> None:
        """Stop coordinating ``partition``: drop its cache (Kafka's ``removeTransactionsForTxnTopicPartition``).

        With ``coordinator_epoch`` only a load under that epoch is cancelled; without it,
        every load of the partition is.
        """
        with self._state_lock.write():
            self._loading = {(p, e) for p, e in self._loading
                             if not (p == partition and (coordinator_epoch is None or e == coordinator_epoch))}
            self._cache.pop(partition, None)

    # ------------------------------------------------------------------ background jobs
    def timed_out_transactions(self, now: int | None = None) -> list[TransactionalIdAndProducerIdEpoch]:
        """Ongoing transactions past their timeout (Kafka's ``timedOutTransactions``).

        ``txn_start_timestamp + txn_timeout_ms < now``, no transition pending. The
        coordinator aborts each with an epoch fence (its ``abortTimedOutTransactions``).
        """
        now = self.time_ms() if now is None else now
        out: list[TransactionalIdAndProducerIdEpoch] = []
        with self._state_lock.read():
            for entry in self._cache.values():
                for tid, md in list(entry.metadata.items()):
                    if (md.pending_state is None and md.state is TransactionState.ONGOING
                            and md.txn_start_timestamp + md.txn_timeout_ms < now):
                        out.append(TransactionalIdAndProducerIdEpoch(tid, md.producer_id, md.producer_epoch))
        return out

    def _should_expire(self, md: TransactionMetadata, now: int, expiration_ms: int) -> bool:
        return md.state.is_expiration_allowed and md.txn_last_update_timestamp <= now - expiration_ms

    def remove_expired_transactional_ids(self, now: int | None = None, expiration_ms: int | None = None) -> list[str]:
        """Expire idle transactional ids (Kafka's ``removeExpiredTransactionalIds``).

        An id expires when it is Empty, CompleteCommit or CompleteAbort, has no pending
        transition, and was last updated at least ``expiration_ms``
        (``transactional.id.expiration.ms``) ago. Each is moved to Dead (pending), a
        tombstone is written for it (batched per partition), and once the tombstone is
        durable it is removed from the cache -- if the coordinator epoch, the Dead pending
        state and the producer epoch are still those of the attempt; otherwise, or if the
        write fails, its pending state is cleared and it stays.

        Returns:
            The transactional ids removed.
        """
        now = self.time_ms() if now is None else now
        expiration_ms = self.config.transactional_id_expiration_ms if expiration_ms is None else expiration_ms
        removed: list[str] = []
        with self._state_lock.read():
            for partition, entry in list(self._cache.items()):
                expired: list[tuple[str, TxnTransitMetadata]] = []
                for tid, md in list(entry.metadata.items()):
                    with md.lock:
                        if md.pending_state is None and self._should_expire(md, now, expiration_ms):
                            expired.append((tid, md.prepare_dead()))
                for i in range(0, len(expired), EXPIRATION_BATCH_SIZE):
                    chunk = expired[i:i + EXPIRATION_BATCH_SIZE]
                    removed.extend(self._write_tombstones(partition, entry.coordinator_epoch, chunk))
        return removed

    def _write_tombstones(self, partition: int, coordinator_epoch: int,
                          expired: list[tuple[str, TxnTransitMetadata]]) -> list[str]:
        records = [(transaction_log.encode_key(tid), None) for tid, _ in expired]
        error: Errors = Errors.NO_ERROR
        try:
            append_many = getattr(self.txn_log, "append_many", None)
            if append_many is not None:
                append_many(partition, records)
            else:
                for key, value in records:
                    self.txn_log.append(partition, key, value)
        except Exception as exc:  # noqa: BLE001
            error = self._coordinator_error(exc)
            log.warning("writing %d tombstones of expired transactional ids to %s-%d failed: %s", len(records),
                        TRANSACTION_STATE_TOPIC, partition, exc)
        removed: list[str] = []
        entry = self._cache.get(partition)
        for tid, transit in expired:
            md = entry.metadata.get(tid) if entry is not None else None
            if md is None:
                continue
            with md.lock:
                if (entry.coordinator_epoch == coordinator_epoch and md.pending_state is TransactionState.DEAD
                        and md.producer_epoch == transit.producer_epoch and error is Errors.NO_ERROR):
                    # as in Kafka the pending Dead state stays: a request still holding this
                    # object answers CONCURRENT_TRANSACTIONS and its retry finds no metadata
                    del entry.metadata[tid]
                    removed.append(tid)
                else:
                    log.warning("failed to remove expired transactional id %s (tombstone append %s, pending state %s)",
                                tid, error.name, md.pending_state)
                    md.pending_state = None
        return removed

    def enable_transactional_id_expiration(self) -> None:
        """Run :meth:`remove_expired_transactional_ids` every
        ``transaction.remove.expired.transaction.cleanup.interval.ms`` on a daemon thread
        (Kafka's ``enableTransactionalIdExpiration``)."""
        if self._expiration_thread is not None:
            return
        stop = threading.Event()
        interval = self.config.remove_expired_transactional_ids_interval_ms / 1000

        def run() -> None:
            while not stop.wait(interval):
                try:
                    self.remove_expired_transactional_ids()
                except Exception:  # noqa: BLE001 - the job must keep running
                    log.exception("transactional id expiration failed")

        self._expiration_stop = stop
        self._expiration_thread = threading.Thread(target=run, name="transactionalId-expiration", daemon=True)
        self._expiration_thread.start()

    def shutdown(self) -> None:
        """Stop the expiration job and drop every cache entry (Kafka's ``shutdown``)."""
        self._shutting_down = True
        if self._expiration_stop is not None:
            self._expiration_stop.set()
        if self._expiration_thread is not None and self._expiration_thread is not threading.current_thread():
            self._expiration_thread.join()
        self._expiration_thread = None
        with self._state_lock.write():
            self._loading.clear()
            self._cache.clear()
