"""The Producer: confluent-kafka's API over the embedded broker.

Records are accumulated per partition into batches (``linger.ms``, ``batch.size``,
``batch.num.messages``, as Kafka's RecordAccumulator) and sent to the broker with the
producer id, epoch and base sequence of an idempotent producer (KIP-98). Delivery
reports are served by :meth:`Producer.poll` and :meth:`Producer.flush`, as in
confluent-kafka. :meth:`Producer.produce_arrow` is the bulk path for loads.

Sequences and failures (KIP-98, KIP-360; Kafka's ``Sender`` / ``RecordAccumulator``):

* the closed batches of a partition are sent in order (a FIFO queue per partition); a
  batch gets its producer id, epoch and base sequence when it is first sent, and keeps
  them for every retry -- a sequence is never rewritten;
* a batch answered with a retriable error is retried with the same sequence before any
  later batch of its partition is sent (``retry.backoff.ms`` apart) until
  ``delivery.timeout.ms`` after its first record; a batch the engine accepted but has not
  committed after that long is reported ``_MSG_TIMED_OUT`` too (its outcome is unknown);
* when a sequenced batch fails for good (e.g. OUT_OF_ORDER_SEQUENCE_NUMBER), the batches
  queued behind it on that partition fail with the same error, so the partition's records
  are never written out of order;
* the idempotent (non-transactional) producer then bumps its epoch locally once no batch
  is in flight (Kafka's ``bumpIdempotentProducerEpoch``; a new producer id from
  InitProducerId once the epoch reaches 32767) and every partition's sequence restarts at 0;
* in a transaction any failed batch makes the transaction abortable with an epoch bump
  (see :mod:`txlake.transaction_manager`), and every batch not yet sent fails with the
  transaction's error (Kafka's ``abortUndrainedBatches``).
"""

from __future__ import annotations

import operator
import random
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from functools import partial
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlake.engine.requests import ProduceBatch, ProduceResult
from txlake.engine.errors import ApiError, Errors
from txlake.engine.memory import bulk_memory_pool
from txlake.engine.partitioner import consistent_partition, fnv1a_partition, partition_for_key
from txlake.engine.producer_state import increment_sequence
from txlake.engine.transaction_metadata import SHORT_MAX_VALUE
from txlake.engine.registry import acquire_broker, release_broker
from txlake.catalog.topic_config import effective_config
from txlake.formats.records import HEADER_TYPE, PAYLOAD_SCHEMA

from . import local_requests
from .config import constructor_conf, parse_config
from .handle import HandleCalls
from .error import KafkaError, KafkaException, from_api_error, kafka_errors, kafka_exception
from .transaction_manager import TransactionManager
from txlake.engine.group_offsets import OffsetAndMetadata
from .types import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Message, partition_list

log = logging.getLogger(__name__)

# librdkafka: per-record overhead counted against batch.size (v2 record framing, approx.).
RECORD_OVERHEAD = 20
#: Kafka's ``RecordBatch.NO_TIMESTAMP``: a record without a timestamp is stamped with the current time
NO_TIMESTAMP = -1
#: the largest timestamp a record can carry (Kafka's int64 ms)
MAX_TIMESTAMP = 2**63 - 1


#: librdkafka's ``partitioner`` values: the key hash, and which keys are placed at random
#: (sticky, as librdkafka's ``sticky.partitioning.linger.ms``) instead of hashed:
#: "null" (NULL keys), "empty" (NULL and empty keys), "all" (every record)
PARTITIONERS: dict[str, tuple[Callable[[bytes, int], int], str | None]] = {
    "random": (partition_for_key, "all"),
    "consistent": (consistent_partition, None),
    "consistent_random": (consistent_partition, "empty"),
    "murmur2": (partition_for_key, None),
    "murmur2_random": (partition_for_key, "null"),
    "fnv1a": (fnv1a_partition, None),
    "fnv1a_random": (fnv1a_partition, "null"),
}


def _random_key(key: bytes | None, randomly: str | None) -> bool:
    """Whether a record with ``key`` is placed at random under a partitioner whose random keys are ``randomly``."""
    return randomly == "all" or (randomly is not None and key is None) or (randomly == "empty" and key == b"")


def _to_bytes(what: str, data: Any) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes, str or None, not {type(data).__name__}")


def _headers(headers: Any) -> list[dict[str, Any]] | None:
    """``produce(headers=)`` (a dict, or a list of ``(str, value)`` tuples) as a record's headers.

    Raises:
        TypeError: confluent-kafka's messages for another container, an item that is not a
            2-tuple, a key that is not a str, or a value that is not bytes, str or None.
    """
    if headers is None:
        return None
    if isinstance(headers, dict):
        items = headers.items()
    elif isinstance(headers, list):
        items = headers
    else:
        raise TypeError(f"expected headers to be dict or list of (key, value) tuples, not {type(headers).__name__}")
    out = []
    for item in items:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError("Headers are expected to be a list of (key, value) tuples")
        k, v = item
        if not isinstance(k, str):
            raise TypeError("header keys must be str")
        k.encode()  # UnicodeEncodeError (a ValueError) here, not when the batch is built
        if v is not None and not isinstance(v, (bytes, str, bytearray, memoryview)):
            raise TypeError(f"expected header value to be None, binary, or unicode string, not {type(v).__name__}")
        out.append({"key": k, "value": _to_bytes("header value", v)})
    return out


def _timestamp(timestamp: Any, topic: str) -> int:
    """A record's CreateTime (ms) from ``produce(timestamp=)``: 0 (confluent-kafka's default) and
    -1 (Kafka's NO_TIMESTAMP) mean now.

    Raises:
        TypeError: not an int (what confluent-kafka raises).
        KafkaException: ``_INVALID_ARG`` below -1 or beyond int64 (Kafka's ``ProducerRecord``
            refuses negative timestamps; a record batch holds int64 ms).
    """
    try:
        ts = operator.index(timestamp)
    except TypeError:
        raise TypeError(f"timestamp must be an int (ms since the epoch), not {type(timestamp).__name__}") from None
    if ts < NO_TIMESTAMP or ts > MAX_TIMESTAMP:
        raise kafka_exception(KafkaError._INVALID_ARG,
                              f"Invalid timestamp {ts} for a record to {topic}: a timestamp is -1 (none: the "
                              f"producer uses the current time) or 0..{MAX_TIMESTAMP} ms since the epoch")
    return ts if ts > 0 else int(time.time() * 1000)


@dataclass
class _Buffer:
    """Records accumulated for one partition (an open batch)."""

    created: float
    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)
    timestamps: list = field(default_factory=list)
    headers: list = field(default_factory=list)
    callbacks: list = field(default_factory=list)
    nbytes: int = 0
    any_headers: bool = False
    any_callbacks: bool = False


@dataclass
class _InFlight:
    """A closed batch -- queued for its partition, sent to the broker, or answered -- with what
    its reports need.

    Attributes:
        deadline: ``time.monotonic()`` s when it expires (``delivery.timeout.ms`` after its first record).
        retry_at: monotonic s before which a retry is not sent.
        order: send order of its first send (-1 before): a retried batch goes back in front of
            the batches of its partition sent after it.
        done: answered (delivered, failed or expired); a late answer of the broker is ignored.
    """

    batch: ProduceBatch
    buffer: _Buffer
    deadline: float
    retry_at: float = 0.0
    order: int = -1
    done: bool = False
    #: why the records could not be made into a batch ("" when they could)
    build_error: str = ""
    #: records whose delivery report was served (a raising callback stops the serving midway)
    served: int = 0

    @property
    def tp(self) -> tuple[str, int]:
        """``(topic, partition)`` of the batch."""
        return (self.batch.topic, self.batch.partition)

    @property
    def sent(self) -> bool:
        """True once it was sent (at least once)."""
        return self.order >= 0

    @property
    def sequenced(self) -> bool:
        """True once an idempotent producer sent it: its producer id, epoch and base sequence are
        set for good."""
        return self.order >= 0 and self.batch.base_sequence >= 0


@dataclass
class BulkResult:
    """What :meth:`Producer.produce_arrow` wrote: records, and per partition ``(first offset, last offset)``."""

    records: int
    offsets: dict[int, tuple[int, int]]


class Producer(HandleCalls):
    """An idempotent Kafka producer writing to a txlake storage root (confluent-kafka's ``Producer``).

    Args:
        conf: Kafka-style config (see API.md); ``storage.url`` selects the storage root.

    Raises:
        KafkaException: ``_INVALID_ARG`` for unknown keys, invalid values, or an
            idempotence conflict (Kafka's ``ProducerConfig`` rules and messages).
    """

    #: a subclass whose ``__init__`` never called this one's is closed: every call raises
    #: RuntimeError, as confluent-kafka's (its handle is NULL)
    _closed = True

    def __init__(self, conf: dict | None = None, **kwargs: Any):
        self._cfg = parse_config(constructor_conf(conf, kwargs), "producer")
        v, explicit = self._cfg.values, self._cfg.explicit
        self._acks = v["request.required.acks"] if "request.required.acks" in explicit else v["acks"]
        self._retries = v["message.send.max.retries"] if "message.send.max.retries" in explicit else v["retries"]
        self._max_in_flight = v["max.in.flight"] if "max.in.flight" in explicit else v["max.in.flight.requests.per.connection"]
        self._linger = (v["queue.buffering.max.ms"] if "queue.buffering.max.ms" in explicit else v["linger.ms"]) / 1000
        self._delivery_timeout = (v["message.timeout.ms"] if "message.timeout.ms" in explicit else v["delivery.timeout.ms"]) / 1000
        self._idempotent = self._check_idempotence()
        self._batch_bytes = v["batch.size"]
        self._batch_records = v["batch.num.messages"]
        self._max_message = v["message.max.bytes"]
        self._max_queued = v["queue.buffering.max.messages"]
        self._default_cb = v["on_delivery"]
        self._only_errors = v["delivery.report.only.error"]
        self._hash, self._randomly = PARTITIONERS[v["partitioner"]]
        with kafka_errors(f"{type(self).__name__}: cannot open storage.url {self._cfg.storage_url}"):
            self._broker = acquire_broker(self._cfg.storage_url, self._cfg.storage_options, self._cfg.broker_config())
        local_requests.load(self._broker)
        self._lock = threading.RLock()
        self._cond = _CountingCondition(self._lock)
        self._buffers: dict[tuple[str, int], _Buffer] = {}
        #: closed batches not sent yet, per partition, in order (waiting for AddPartitionsToTxn,
        #: for a retry of the batch in front, or for an epoch bump)
        self._queues: dict[tuple[str, int], deque[_InFlight]] = {}
        #: sent batches the broker has not answered yet
        self._inflight: dict[int, _InFlight] = {}
        #: no batch in flight expires before this (monotonic s; a lower bound, so the send loop
        #: does not scan every batch in flight each time it wakes)
        self._expiry_due = float("inf")
        self._sends = 0
        self._queued = 0
        self._reports: deque = deque()
        self._partitions: dict[str, int] = {}
        #: records to topics not in the catalog yet: (deadline, topic, value, key, partition, cb, ts, headers, size)
        self._unknown: list[tuple] = []
        #: topics a record waited for in vain: produce() to them raises _UNKNOWN_TOPIC at once
        self._missing: set[str] = set()
        self._sticky: dict[str, int] = {}
        self._producer_id = -1
        self._epoch = -1
        self._writer_checked = False
        #: idempotent producer: bump the epoch once nothing is in flight (KIP-360)
        self._bump_required = False
        self._txn: TransactionManager | None = None
        if v["transactional.id"] is not None:
            self._txn = TransactionManager(v["transactional.id"], v["transaction.timeout.ms"], self._broker,
                                           partial(_call_if_alive, weakref.ref(self), Producer._set_identity))
        self._next_seq: dict[tuple[str, int], int] = {}
        self._fatal: KafkaError | None = None
        self._closed = False
        # transactions: partitions waiting for AddPartitionsToTxn (their batches wait in their queues)
        self._txn_pending: set[tuple[str, int]] = set()
        #: an AddPartitionsToTxn of the transaction thread is under way
        self._adding = False
        self._txn_thread: threading.Thread | None = None
        #: set by __del__ to the records still queued when the producer was dropped without close()
        self._dropped: list[int] = []
        # the threads hold the producer only during a step, never while they wait, so that one
        # dropped without close() is collected and stops (__del__), as confluent-kafka's
        self._sender = threading.Thread(target=_while_referenced,
                                        args=(weakref.ref(self), Producer._send_step, self._cond,
                                              partial(_release_dropped, self._dropped, self._broker)),
                                        name="txlake-producer", daemon=True)
        self._sender.start()
        if self._txn is not None:
            self._txn_thread = threading.Thread(target=_while_referenced,
                                                args=(weakref.ref(self), Producer._txn_step, self._cond),
                                                name="txlake-producer-txn", daemon=True)
            self._txn_thread.start()

    def _check_idempotence(self) -> bool:
        """Kafka's ProducerConfig rules: explicit idempotence with conflicting settings is an error;
        implicit idempotence is silently turned off by them."""
        v, explicit = self._cfg.values, self._cfg.explicit
        wants = v["enable.idempotence"]
        transactional = v["transactional.id"] is not None
        if transactional and "enable.idempotence" in explicit and not wants:
            raise kafka_exception(KafkaError._INVALID_ARG, "Cannot set a transactional.id without also enabling idempotence.")
        conflicts = []
        if self._acks != -1:
            conflicts.append("Must set acks to all in order to use the idempotent producer. Otherwise we cannot guarantee idempotence.")
        if self._retries == 0:
            conflicts.append("Must set retries to non-zero when using the idempotent producer.")
        if self._max_in_flight > 5:
            conflicts.append("Must set max.in.flight.requests.per.connection to at most 5 to use the idempotent producer.")
        if conflicts and ("enable.idempotence" in explicit and wants or transactional):
            raise kafka_exception(KafkaError._INVALID_ARG, conflicts[0])
        return wants and not conflicts

    # ------------------------------------------------------------------ produce
    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int = -1,
                on_delivery: Callable | None = None, timestamp: int = 0, headers: Any = None,
                callback: Callable | None = None) -> None:
        """Queue one record; its delivery report is served by :meth:`poll`/:meth:`flush`.

        Args:
            partition: -1 for the ``partitioner`` (librdkafka's; default ``consistent_random``:
                CRC32 of the key, a sticky random partition for a null or empty key;
                ``murmur2_random`` places keys as Kafka's Java producer).
            timestamp: CreateTime in ms since the epoch; 0 (the default) or -1 (Kafka's
                NO_TIMESTAMP) = now.
            on_delivery / callback: ``cb(err: KafkaError | None, msg: Message)``.

        Raises:
            KafkaException: MSG_SIZE_TOO_LARGE (> message.max.bytes), _UNKNOWN_TOPIC once the
                topic is known missing (a record to a topic not in the catalog waits up to
                ``topic.metadata.propagation.max.ms``, at most ``message.timeout.ms``, for it to
                appear, then its delivery report carries _UNKNOWN_TOPIC: librdkafka's rule),
                _UNKNOWN_PARTITION, _INVALID_ARG for a timestamp below -1 or beyond int64,
                _FATAL after a fatal error, NOT_LEADER_OR_FOLLOWER when another process holds
                the storage root's writer lease.
            BufferError: queue.buffering.max.messages records are already queued.
            TypeError: key/value/headers/timestamp of the wrong type.
            RuntimeError: "Producer has been closed" after :meth:`close` (confluent-kafka's).
        """
        self._check_open()
        value = _to_bytes("value", value)
        key = _to_bytes("key", key)
        partition = operator.index(partition)  # TypeError for a non-int, as confluent-kafka's
        hdrs = _headers(headers)
        ts = _timestamp(timestamp, topic)
        size = (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        if hdrs:
            size += sum(len(h["key"]) + len(h["value"] or b"") for h in hdrs)
        if size > self._max_message:
            raise kafka_exception(KafkaError.MSG_SIZE_TOO_LARGE,
                                  f"Message size {size} bytes exceeds message.max.bytes={self._max_message}")
        cb = on_delivery or callback or self._default_cb
        n = self._partitions.get(topic)
        if n is None:
            n = self._lookup_topic(topic)
        if n is None:  # not in the catalog (yet): wait for it, as librdkafka's unknown-topic queue
            with self._lock:
                self._check_queue()
                if self._txn is not None:
                    self._txn.check_produce()
                deadline = time.monotonic() + min(self._cfg["topic.metadata.propagation.max.ms"] / 1000,
                                                  self._delivery_timeout)
                self._unknown.append((deadline, topic, value, key, partition, cb, ts, hdrs, size))
                self._queued += 1
                self._cond.notify_all()
            return
        self._append(topic, value, key, partition, cb, ts, hdrs, size, n, counted=False)

    def _check_queue(self) -> None:
        """produce()'s refusals before a record is queued (caller holds the lock)."""
        if self._fatal is not None:
            raise KafkaException(self._fatal)
        if self._queued >= self._max_queued:
            raise BufferError("Local: Queue full")

    def _append(self, topic: str, value: bytes | None, key: bytes | None, partition: int | None, cb: Callable | None,
                ts: int, hdrs: list | None, size: int, n: int, counted: bool) -> None:
        """Place a record of a known topic (``n`` partitions) in its partition's open batch.
        ``counted``: it waited for its topic and is already counted in ``len()``."""
        if partition is None or partition < 0:
            partition = (self._sticky_partition(topic, n) if _random_key(key, self._randomly)
                         else self._hash(key or b"", n))  # a NULL key hashes as an empty one (librdkafka)
        elif partition >= n:
            raise kafka_exception(KafkaError._UNKNOWN_PARTITION, f"Unknown partition {topic} [{partition}] (topic has {n})")
        with self._lock:
            if not counted:
                self._check_queue()
            tp = (topic, partition)
            if self._txn is not None:
                self._txn.check_produce()
                if tp not in self._txn.partitions and tp not in self._txn_pending:
                    self._txn_pending.add(tp)  # the transaction thread adds it (AddPartitionsToTxn)
                    self._cond.notify_all()
            elif self._producer_id < 0 and not self._writer_checked:
                self._start_writing()
            buf = self._buffers.get(tp)
            if buf is None:
                buf = self._buffers[tp] = _Buffer(time.monotonic())
            buf.keys.append(key)
            buf.values.append(value)
            buf.timestamps.append(ts)
            buf.headers.append(hdrs)
            buf.callbacks.append(cb)
            buf.any_headers = buf.any_headers or hdrs is not None
            buf.any_callbacks = buf.any_callbacks or cb is not None
            buf.nbytes += size + RECORD_OVERHEAD
            if not counted:
                self._queued += 1
            if buf.nbytes >= self._batch_bytes or len(buf.values) >= self._batch_records:
                self._close_batch(tp)

    def _check_open(self, message: str = "Producer has been closed") -> None:
        """confluent-kafka's answer to a call on a closed producer (``list_topics``,
        ``cluster_id``, ``set_sasl_credentials``: ``"Handle has been closed"``)."""
        if self._closed:
            raise RuntimeError(message)

    def produce_batch(self, topic: str, messages: list, partition: int = -1, callback: Callable | None = None,
                      on_delivery: Callable | None = None) -> int:
        """Queue several records at once (confluent-kafka 2.x's ``produce_batch``).

        Args:
            messages: a list of dicts with optional ``value``, ``key`` (bytes or str),
                ``partition`` (int, overrides ``partition``), ``headers`` (as :meth:`produce`;
                confluent-kafka ignores them) and ``callback`` (the record's delivery callback).
            partition: the partition of the records that name none; -1 = the partitioner.
            callback / on_delivery: the delivery callback of the records without their own.

        Returns:
            the number of records queued. A record refused (e.g. MSG_SIZE_TOO_LARGE,
            ``_UNKNOWN_PARTITION``, ``_QUEUE_FULL``) gets its ``KafkaError`` as the dict's
            ``"_error"`` and the others go on.

        Raises:
            TypeError: ``messages`` not a list, an entry not a dict, or a field of the wrong
                type (confluent-kafka's texts: "Message key at index 0 must be bytes or str"),
                before any record is queued.
            NotImplementedError: an entry with a ``timestamp`` (confluent-kafka's batch mode has none).
            RuntimeError: the producer is closed.
        """
        self._check_open()
        if not isinstance(topic, str):
            raise TypeError(f"argument 1 must be str, not {type(topic).__name__}")  # confluent-kafka's
        if not isinstance(messages, list):
            raise TypeError("messages must be a list")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise TypeError(f"Message at index {i} must be a dict")
            for name in ("value", "key"):
                if m.get(name) is not None and not isinstance(m[name], (bytes, str)):
                    raise TypeError(f"Message {name} at index {i} must be bytes or str")
            if "partition" in m and (not isinstance(m["partition"], int) or isinstance(m["partition"], bool)):
                raise TypeError(f"Message partition at index {i} must be int")
            if m.get("callback") is not None and not callable(m["callback"]):
                raise TypeError(f"Message callback at index {i} must be callable")
            if "timestamp" in m:
                raise NotImplementedError("Message timestamps are not currently supported in batch mode")
        default_cb = on_delivery or callback
        queued = 0
        for m in messages:
            try:
                self.produce(topic, m.get("value"), m.get("key"), m.get("partition", partition),
                             on_delivery=m.get("callback") or default_cb, headers=m.get("headers"))
            except KafkaException as exc:
                m["_error"] = exc.args[0]
            except BufferError:
                m["_error"] = KafkaError(KafkaError._QUEUE_FULL, "Message failed: Local: Queue full")
            else:
                queued += 1
        return queued

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        """Drop the records not delivered yet (confluent-kafka's / librdkafka's ``purge``); their
        delivery reports, served by the next :meth:`poll`/:meth:`flush`, carry ``_PURGE_QUEUE``
        (not sent yet) or ``_PURGE_INFLIGHT`` (sent, not answered: the engine may still write
        it -- its late answer is ignored).

        A purged record of a transaction makes the transaction abortable; an idempotent
        producer that purged a batch holding sequence numbers bumps its epoch (KIP-360), as
        after any failed batch.

        Args:
            in_queue: purge the records not sent yet.
            in_flight: purge the batches sent and waiting for their answer.
            blocking: accepted for confluent-kafka's signature; the purge is always done on return.

        Raises:
            RuntimeError: the producer is closed.
        """
        self._check_open()
        purged: list[tuple[_InFlight, KafkaError]] = []
        with self._lock:
            if in_queue:
                err = KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue")
                purged += [(self._make_batch(tp), err) for tp in list(self._buffers)]
                purged += [(flight, err) for tp in list(self._queues) for flight in self._take_queue(tp)]
                purged += [(self._single(e[1], e[4], e[3], e[2], e[6], e[7], e[5]), err) for e in self._unknown]
                self._unknown = []
            if in_flight:
                err = KafkaError(KafkaError._PURGE_INFLIGHT, "Local: Purged in flight")
                purged += [(flight, err) for flight in self._inflight.values()]
                self._inflight.clear()
                self._expiry_due = float("inf")
            for flight, err in purged:
                self._fail_flight(flight, err)
            if purged and self._txn is not None:
                self._txn.send_failed(purged[0][1])
                if self._txn.has_error:
                    self._abort_undrained()
            elif any(flight.sequenced for flight, _ in purged) and self._idempotent:
                self._bump_required = True
            self._cond.notify_all()

    def _lookup_topic(self, topic: str, refresh: bool = True) -> int | None:
        """The partition count of ``topic`` (looking at the catalog's newest commits), or None when
        it does not exist and no record to it timed out yet.

        Raises:
            KafkaException: ``_UNKNOWN_TOPIC`` when the topic is known missing: a record to it
                already failed so (librdkafka's produce() on a topic in state NOTEXISTS); the
                catalog's error when it cannot be read.
        """
        t = self._broker.topics().get(topic)
        if t is None and refresh:
            with kafka_errors(f"looking up topic {topic} in {self._broker.store.url}"):
                self._broker.refresh()
            t = self._broker.topics().get(topic)
        if t is None:
            if topic in self._missing:
                raise kafka_exception(KafkaError._UNKNOWN_TOPIC, f"Unknown topic: {topic} (not in {self._broker.store.url})")
            return None
        self._missing.discard(topic)
        self._partitions[topic] = len(t.partitions)
        return len(t.partitions)

    def _place_unknown(self) -> None:
        """The send thread: records waiting for their topic go to it once it exists; past
        ``topic.metadata.propagation.max.ms`` they fail with ``_UNKNOWN_TOPIC`` and later
        produce() calls to the topic raise it at once -- unless ``message.timeout.ms`` is
        shorter: then they fail with ``_MSG_TIMED_OUT`` when it passes and the topic stays
        unknown (librdkafka's rules)."""
        try:
            self._broker.refresh(100)
        except Exception:  # the catalog cannot be read now: look again later (produce() reports it)
            log.debug("looking for new topics failed", exc_info=True)
        with self._lock:
            waiting, self._unknown = self._unknown, []
            now = time.monotonic()
            for entry in waiting:
                deadline, topic, value, key, partition, cb, ts, hdrs, size = entry
                t = self._broker.topics().get(topic)
                err = None
                if t is not None:
                    self._partitions[topic] = len(t.partitions)
                    self._missing.discard(topic)
                    try:
                        self._append(topic, value, key, partition, cb, ts, hdrs, size, len(t.partitions), counted=True)
                        continue
                    except KafkaException as exc:
                        err = exc.args[0]
                elif deadline > now:
                    self._unknown.append(entry)
                    continue
                elif self._delivery_timeout < self._cfg["topic.metadata.propagation.max.ms"] / 1000:
                    # message.timeout.ms ran out first: the record times out while the topic is
                    # still unknown, which it stays (librdkafka's UA-queue timeout scan)
                    err = KafkaError(KafkaError._MSG_TIMED_OUT, f"Local: Message timed out ({topic} did not appear "
                                     f"in {self._broker.store.url} within message.timeout.ms)")
                else:
                    self._missing.add(topic)
                    err = KafkaError(KafkaError._UNKNOWN_TOPIC, f"Unknown topic: {topic} did not appear in "
                                     f"{self._broker.store.url} within topic.metadata.propagation.max.ms")
                self._fail_flight(self._single(topic, partition, key, value, ts, hdrs, cb), err)
                if self._txn is not None:  # a record of the transaction is lost: it can only abort
                    self._txn.send_failed(err, epoch_bump=False)

    def _single(self, topic: str, partition: int | None, key: bytes | None, value: bytes | None, ts: int,
                hdrs: list | None, cb: Callable | None) -> _InFlight:
        """A one-record batch that is never sent, to report a record that waited for its topic."""
        buf = _Buffer(time.monotonic(), [key], [value], [ts], [hdrs], [cb], 0, hdrs is not None, cb is not None)
        batch = ProduceBatch(topic, partition if partition is not None and partition >= 0 else -1,
                             PAYLOAD_SCHEMA.empty_table())
        return _InFlight(batch, buf, buf.created)

    def _sticky_partition(self, topic: str, n: int) -> int:
        p = self._sticky.get(topic)
        if p is None or p >= n:
            p = self._sticky[topic] = random.randrange(n)
        return p

    def _start_writing(self) -> None:
        """First write: start the embedded engine as the storage root's writer (it takes the
        writer lease, as ``txlake serve`` does when it starts), then, when idempotent, send
        InitProducerId for a producer id.

        Fails at once (not after delivery.timeout.ms) when another process holds the lease.
        """
        with kafka_errors(f"taking the writer lease of {self._broker.store.url}"):
            try:
                self._broker.ensure_writer()
            except ApiError as exc:
                raise from_api_error(exc) from None
            if self._idempotent:
                err, pid, epoch = local_requests.init_producer_id(self._broker)
                if err != Errors.NO_ERROR:
                    raise kafka_exception(err, f"InitProducerId of an idempotent producer failed: {err.name}")
                self._producer_id, self._epoch = pid, epoch
        self._writer_checked = True

    def _close_batch(self, tp: tuple[str, int], urgent: bool = False) -> None:
        """Close the open batch of ``tp``, queue it behind the partition's earlier batches and
        send what may be sent (caller holds the lock); ``urgent`` when a flush waits for it
        (the engine then commits without lingering)."""
        if tp not in self._buffers:  # already closed (and failed) by a transaction that failed meanwhile
            return
        flight = self._make_batch(tp, urgent)
        if flight.build_error:
            # the records could not be made into a batch: they fail alone (never sent, no
            # sequence used; a transaction becomes abortable), nothing waits behind them
            self._batch_failed(tp, Errors._BAD_MSG, flight.build_error, False, flight)
            return
        self._queues.setdefault(tp, deque()).append(flight)
        self._drain(tp)

    def _make_batch(self, tp: tuple[str, int], urgent: bool = False) -> _InFlight:
        """Turn the open batch of ``tp`` into a RecordBatch (caller holds the lock). Records that
        cannot be encoded (produce() refuses what it can tell) give a batch without rows and
        the reason in ``build_error``."""
        buf = self._buffers.pop(tp)
        if self._sticky.get(tp[0]) == tp[1]:
            del self._sticky[tp[0]]
        n = len(buf.values)
        build_error = ""
        try:
            headers = (pa.array(buf.headers, HEADER_TYPE) if buf.any_headers else pa.nulls(n, HEADER_TYPE))
            records = pa.Table.from_arrays(
                [pa.array(buf.timestamps, pa.int64()), pa.array(buf.keys, pa.binary()),
                 pa.array(buf.values, pa.binary()), headers],
                schema=PAYLOAD_SCHEMA)
        except (pa.ArrowException, OverflowError, TypeError, ValueError) as exc:
            records = PAYLOAD_SCHEMA.empty_table()
            build_error = f"{n} record(s) for {tp[0]} [{tp[1]}] cannot be encoded: {type(exc).__name__}: {exc}"
        batch = ProduceBatch(tp[0], tp[1], records, is_transactional=self._txn is not None, urgent=urgent)
        flight = _InFlight(batch, buf, buf.created + self._delivery_timeout)
        flight.build_error = build_error
        return flight

    def _assign_sequence(self, tp: tuple[str, int], records: int) -> int:
        """The base sequence of the next ``records`` records to ``tp`` (caller holds the lock)."""
        seq = self._next_seq.get(tp, 0)
        self._next_seq[tp] = increment_sequence(seq, records)
        return seq

    def _set_identity(self, producer_id: int, epoch: int) -> None:
        """A new producer id/epoch from InitProducerId (``init_transactions``, or the KIP-360 bump
        of ``abort_transaction``): every partition's sequence restarts at 0."""
        with self._lock:
            self._producer_id, self._epoch = producer_id, epoch
            self._next_seq.clear()
            self._writer_checked = True
            self._cond.notify_all()

    def _sendable(self, flight: _InFlight, now: float) -> bool:
        """Whether the batch at the head of its partition's queue may be sent now."""
        if flight.retry_at > now:
            return False
        if self._txn is not None and flight.batch.is_transactional and (
                flight.tp in self._txn_pending or flight.tp not in self._txn.partitions):
            return False  # Kafka's Sender sends no batch of a partition before AddPartitionsToTxn
        # after a failure the idempotent producer bumps its epoch before any new sequence
        return flight.sequenced or not (self._idempotent and self._bump_required)

    def _drain(self, tp: tuple[str, int], now: float | None = None) -> None:
        """Send the batches of ``tp``'s queue, in order, while the one in front may be sent
        (caller holds the lock). A transaction in an error state sends nothing more: every
        batch not sent fails with its error (Kafka's ``abortUndrainedBatches``)."""
        queue = self._queues.get(tp)
        if not queue:
            return
        if self._txn is not None and self._txn.has_error:
            self._abort_undrained()
            return
        now = time.monotonic() if now is None else now
        while queue and self._sendable(queue[0], now):
            self._send(queue.popleft())
        if not queue and self._queues.get(tp) is queue:
            del self._queues[tp]

    def _send(self, flight: _InFlight) -> None:
        """Send a batch (caller holds the lock). Its first send gives it the producer id, epoch
        and base sequence it keeps for every retry. The broker validates at once, so a refusal
        is handled (by :meth:`_on_result`) before this returns."""
        if flight.order < 0:
            flight.order = self._sends
            self._sends += 1
            if self._idempotent:
                batch = flight.batch
                batch.producer_id, batch.producer_epoch = self._producer_id, self._epoch
                batch.base_sequence = self._assign_sequence(flight.tp, batch.records.num_rows)
        self._inflight[id(flight)] = flight
        self._expiry_due = min(self._expiry_due, flight.deadline)
        # the engine answers a batch it has not committed by delivery.timeout.ms after _expire
        # has reported it (a late answer is ignored), so the request waits a second longer
        timeout_ms = int((flight.deadline - time.monotonic()) * 1000) + 1000
        future = local_requests.produce(self._broker, flight.batch, timeout_ms, self._cfg["transactional.id"])
        # held weakly: the engine may keep an answered request a while (a flusher keeps its last
        # work item until the next), which would keep a producer dropped without close() alive
        future.add_done_callback(partial(_call_if_alive, weakref.ref(self), Producer._on_answer, flight))

    def _requeue(self, flight: _InFlight) -> None:
        """Put a batch to retry back in its partition's queue, in front of every batch sent after
        it and of every batch not sent yet (caller holds the lock)."""
        queue = self._queues.setdefault(flight.tp, deque())
        i = 0
        while i < len(queue) and queue[i].sent and queue[i].order < flight.order:
            i += 1
        queue.insert(i, flight)

    def _on_answer(self, flight: _InFlight, future: Future) -> None:
        """The done callback of a batch's Produce request: :meth:`_on_result` of its answer."""
        self._on_result(flight, future.result())

    def _on_result(self, flight: _InFlight, result: ProduceResult) -> None:
        """The broker answered a batch (on the engine's thread, or at once for a refusal): report
        it, put it back for a retry (retriable, before its deadline), or fail it for good."""
        with self._lock:
            if flight.done:  # expired before the engine answered
                if result.error != Errors.NO_ERROR and self._idempotent and self._txn is None:
                    self._bump_required = True  # its sequence may be missing: restart under a new epoch
                    self._cond.notify_all()
                return
            self._inflight.pop(id(flight), None)
            if result.error != Errors.NO_ERROR and result.error.retriable and time.monotonic() < flight.deadline \
                    and self._retries > 0 and not self._closed:
                flight.retry_at = time.monotonic() + self._cfg["retry.backoff.ms"] / 1000
                self._requeue(flight)
                self._cond.notify_all()
                return
            if result.error == Errors.NO_ERROR:
                self._report(flight, result, None)
            else:
                code = Errors._MSG_TIMED_OUT if result.error.retriable else result.error
                self._batch_failed(flight.tp, code, result.message or result.error.name, flight.sequenced,
                                   flight, result)

    def _report(self, flight: _InFlight, result: ProduceResult, err: KafkaError | None) -> None:
        """Queue the delivery reports of a batch's records (caller holds the lock)."""
        flight.done = True
        self._reports.append((flight, result, err))
        self._cond.notify_all()

    def _fail_flight(self, flight: _InFlight, err: KafkaError) -> None:
        """Report a batch that was not (or is no longer) in flight as failed with ``err``."""
        self._report(flight, ProduceResult(Errors(err.code()), message=err.str()), err)

    def _batch_failed(self, tp: tuple[str, int], code: Errors, message: str, sequenced: bool,
                      flight: _InFlight | None = None, result: ProduceResult | None = None) -> KafkaError:
        """A batch to ``tp`` failed for good with ``code``: returns the error for its records and,
        for a batch of :meth:`produce` (``flight``, with the broker's ``result`` if any), queues
        its reports first (caller holds the lock; shared by produce, produce_arrow and
        TxnOffsetCommit batches).

        ``_FENCED`` (this process lost the writer lease) is fatal. In a transaction the
        transaction becomes abortable with an epoch bump, or fatal when fenced. When the batch
        had a sequence (``sequenced``), the partition's sequence now has a gap: the batches
        queued behind it fail too, and the idempotent producer bumps its epoch once nothing is
        in flight (KIP-360).
        """
        fatal = code == Errors._FENCED
        err = KafkaError(code, message, fatal=fatal)
        if flight is not None:
            self._report(flight, result if result is not None else ProduceResult(code, message=message), err)
        if fatal and self._fatal is None:
            # a fenced producer's every later call fails (librdkafka's fatal error state)
            self._fatal = KafkaError(Errors._FATAL, f"fatal error: {err.str()}", fatal=True)
        if self._txn is not None:
            self._txn.send_failed(err)
        elif sequenced and self._idempotent:
            self._bump_required = True
        if sequenced:
            for later in self._take_queue(tp):
                self._fail_flight(later, KafkaError(code, f"an earlier batch to {tp[0]} [{tp[1]}] failed: {message}",
                                                    fatal=fatal))
        if self._txn is not None and self._txn.has_error:
            self._abort_undrained()
        return err

    def _take_queue(self, tp: tuple[str, int]) -> list[_InFlight]:
        """Remove and return the queued batches of ``tp`` (emptying the queue object too: a
        :meth:`_drain` further up the stack may still hold it). Caller holds the lock."""
        queue = self._queues.pop(tp, None)
        if not queue:
            return []
        taken = list(queue)
        queue.clear()
        return taken

    def _abort_undrained(self) -> None:
        """The transaction is in ABORTABLE_ERROR or FATAL_ERROR: fail every record not sent yet --
        open batches and queued ones -- with its error (Kafka's ``abortUndrainedBatches``;
        librdkafka purges them). Caller holds the lock."""
        err = self._txn.error or KafkaError(Errors._STATE, "the transaction failed")
        for tp in list(self._queues):
            for flight in self._take_queue(tp):
                self._fail_flight(flight, err)
        for tp in list(self._buffers):
            self._fail_flight(self._make_batch(tp), err)
        self._txn_pending.clear()

    def _expire(self, now: float) -> None:
        """Fail the batches past ``delivery.timeout.ms`` with ``_MSG_TIMED_OUT`` (Kafka's
        ``Sender`` expiring batches in the accumulator and in flight). Caller holds the lock.

        A batch the engine accepted but has not committed yet has an unknown outcome: it is
        reported as timed out and its late answer ignored (in a transaction, the abort that
        must follow writes an ABORT marker after it). A sequenced batch waiting for a retry
        leaves a gap in its partition's sequence (see :meth:`_batch_failed`).
        """
        if now >= self._expiry_due:
            for flight in [f for f in self._inflight.values() if f.deadline <= now]:
                del self._inflight[id(flight)]
                self._batch_failed(flight.tp, Errors._MSG_TIMED_OUT, self._timed_out_message(flight), False, flight)
            self._expiry_due = min((f.deadline for f in self._inflight.values()), default=float("inf"))
        for tp in list(self._queues):
            queue = self._queues.get(tp)
            while queue and queue[0].deadline <= now:
                flight = queue.popleft()
                self._batch_failed(tp, Errors._MSG_TIMED_OUT, self._timed_out_message(flight), flight.sequenced, flight)
                queue = self._queues.get(tp)
            if queue is not None and not queue and self._queues.get(tp) is queue:
                del self._queues[tp]

    def _timed_out_message(self, flight: _InFlight) -> str:
        """The reason a batch expired with (Kafka's "Expiring N record(s) for ..." message)."""
        return (f"{len(flight.buffer.values)} record(s) for {flight.batch.topic} [{flight.batch.partition}] expired: "
                f"delivery.timeout.ms ({int(self._delivery_timeout * 1000)} ms) passed since the batch was created")

    def _maybe_bump(self) -> None:
        """KIP-360 for the idempotent (non-transactional) producer (Kafka's
        ``bumpIdempotentEpochAndResetIdIfNeeded``): once a failure left a gap in a sequence and
        no batch is in flight, bump the epoch locally -- the broker accepts a newer epoch
        starting at sequence 0 -- or, at epoch 32767, take a new producer id from
        InitProducerId; every partition's sequence restarts at 0. Caller holds the lock."""
        if not self._bump_required or self._inflight or self._txn is not None or not self._idempotent:
            return
        if self._epoch >= SHORT_MAX_VALUE:
            err, pid, epoch = local_requests.init_producer_id(self._broker)
            if err != Errors.NO_ERROR:
                if self._fatal is None:
                    self._fatal = KafkaError(Errors._FATAL, f"fatal error: a new producer id was refused: {err.name}",
                                             fatal=True)
                return
            self._producer_id, self._epoch = pid, epoch
        else:
            self._epoch += 1
        self._next_seq.clear()
        self._bump_required = False
        self._cond.notify_all()

    def _send_step(self) -> tuple[float, int] | None:
        """One turn of the send thread: close the batches whose linger passed, expire, bump the
        epoch if due, send what is ready. Returns how long to wait for the next thing due (s;
        50 ms when nothing is) and the condition's notification count when it decided so; None
        once the producer is closed."""
        if self._unknown:
            self._place_unknown()
        with self._lock:
            if self._closed:
                return None
            now = time.monotonic()
            for tp in [tp for tp, b in self._buffers.items() if now - b.created >= self._linger]:
                self._close_batch(tp)
            self._expire(now)
            self._maybe_bump()
            for tp in list(self._queues):
                self._drain(tp, now)
            waits = [b.created + self._linger - now for b in self._buffers.values()]
            waits += [q[0].retry_at - now for q in self._queues.values() if q and q[0].retry_at > now]
            waits += [q[0].deadline - now for q in self._queues.values() if q]
            if self._inflight:
                waits.append(self._expiry_due - now)
            if self._unknown:
                waits.append(0.05)
            return (max(0.001, min(waits)) if waits else 0.05), self._cond.notified

    def _txn_step(self) -> tuple[float, int] | None:
        """One turn of the transaction thread: add the partitions new to the transaction, all that
        are waiting in one AddPartitionsToTxn, then send their queued batches (or fail them with
        its error). A coordinator request waits for a commit, so it is sent without holding the
        lock. Returns how long to wait (s) -- 0 after a request, 1 with none waiting (a notify
        ends the wait) -- and the condition's notification count when it decided so; None once
        the producer is closed with none waiting."""
        assert self._txn is not None
        with self._lock:
            if not self._txn_pending:
                return None if self._closed else (1.0, self._cond.notified)
            todo = frozenset(self._txn_pending)
            self._adding = True
        try:
            error = self._txn.add_partitions(todo, self._delivery_timeout)
        finally:
            with self._lock:
                self._adding = False
        with self._lock:
            self._txn_pending -= todo
            if error == Errors.NO_ERROR:
                for tp in todo:
                    self._drain(tp)
            else:  # never sent: no sequence was used
                err = self._txn.error or KafkaError(error, error.name)
                for tp in todo:
                    for flight in self._take_queue(tp):
                        self._fail_flight(flight, err)
                if self._txn.has_error:
                    self._abort_undrained()
            self._cond.notify_all()
        return 0.0, 0

    # ------------------------------------------------------------------ transactions
    def _transactions(self) -> TransactionManager:
        self._check_open()
        if self._txn is None:
            raise kafka_exception(KafkaError._NOT_CONFIGURED,
                                  "The Transactional API requires transactional.id to be configured")
        return self._txn

    def init_transactions(self, timeout: float | None = None) -> None:
        """Register ``transactional.id`` with the transaction coordinator (InitProducerId): fences
        older producers with the same id and completes their open transaction.

        Raises:
            KafkaException: ``_STATE`` when called twice; fatal (e.g. PRODUCER_FENCED) or
                ``_TIMED_OUT`` (retriable) errors.
        """
        # a blocking coordinator request: not under the lock; the new identity comes back
        # through _set_identity (sequences start at 0)
        self._transactions().init_transactions(timeout)

    def begin_transaction(self) -> None:
        """Start a transaction (``_STATE`` unless initialized and no transaction is open)."""
        self._check_open()
        with self._lock:
            self._transactions().begin_transaction()

    def send_offsets_to_transaction(self, positions: list, group_metadata: Any, timeout: float | None = None) -> None:
        """Commit consumer offsets as part of the transaction (AddOffsetsToTxn + TxnOffsetCommit).

        Args:
            positions: ``TopicPartition``s whose ``offset`` is the next offset to consume; those
                with a negative offset (OFFSET_INVALID, ...) are left out, and with none left
                nothing is sent (librdkafka's ``rd_kafka_send_offsets_to_transaction``).
            group_metadata: ``consumer.consumer_group_metadata()`` or a group id string.

        The offsets become visible to the group only when the transaction commits.

        Raises:
            KafkaException: ``_STATE`` outside a transaction; abortable or fatal errors.
            TypeError: ``positions`` is not a list of TopicPartition.
        """
        txn = self._transactions()
        partition_list(positions, "send_offsets_to_transaction")
        group_id = group_metadata if isinstance(group_metadata, str) else getattr(group_metadata, "group_id", None)
        if not group_id:
            raise kafka_exception(KafkaError._INVALID_ARG, "send_offsets_to_transaction needs a group id")
        # librdkafka sends only the partitions with a valid (>= 0) offset -- e.g. not OFFSET_INVALID
        # from position() of a partition that consumed nothing -- and does nothing when none is left
        offsets = {(tp.topic, tp.partition): OffsetAndMetadata(tp.offset, tp.metadata or "")
                   for tp in positions if tp.offset >= 0}
        if not offsets:
            return
        txn.add_offsets(group_id, self._broker.group_offsets().partition_for(group_id))  # blocking
        # TxnOffsetCommit: the group coordinator checks the member as for a plain commit (KIP-447) and
        # writes the offsets into the transaction; a stale generation, an unknown member or a fenced
        # static member make the transaction abortable (no sequence of this producer was used)
        error = txn.commit_offsets(group_id, {tp: (om.offset, om.metadata) for tp, om in offsets.items()},
                                   getattr(group_metadata, "generation_id", -1), getattr(group_metadata, "member_id", ""),
                                   getattr(group_metadata, "group_instance_id", None), timeout)
        if error != Errors.NO_ERROR:
            err = KafkaError(error, f"TxnOffsetCommit for group {group_id} failed: {error.name}")
            with self._lock:
                txn.send_failed(err, epoch_bump=False)
            raise KafkaException(txn.error or err)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Hand every record to the engine, then commit (EndTxn COMMIT), then serve the reports.
        A failed record raises an error with ``txn_requires_abort()``."""
        self._transactions().end_transaction(True, timeout, self.flush, self._hand_over)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Flush, then abort (EndTxn ABORT): nothing of the transaction becomes visible to read_committed.

        After an error that requires it (a failed record, UNKNOWN_PRODUCER_ID or
        INVALID_PRODUCER_ID_MAPPING) the abort also bumps the producer epoch (KIP-360:
        InitProducerId with the current producer id and epoch; a new producer id once the
        epoch is exhausted or the transactional id expired) and every partition's sequence
        restarts at 0, so the next transaction can go on.

        Raises:
            KafkaException: ``_STATE`` outside a transaction; ``_TIMED_OUT`` (retriable: call
                again, it resumes); PRODUCER_FENCED (``fatal()``) when a newer instance took
                the transactional id over.
        """
        self._transactions().end_transaction(False, timeout, self._flush_before_abort)

    def _flush_before_abort(self, timeout: float | None) -> int:
        """:meth:`flush`, then wait for an AddPartitionsToTxn under way: the EndTxn ABORT must come
        after it, or the partitions would open a new transaction behind the abort. Returns the
        records not delivered when ``timeout`` (s) passed.

        Raises:
            KafkaException: ``_TIMED_OUT`` (retriable) when the request is still under way then.
        """
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        left = self.flush(timeout)
        with self._lock:
            while self._adding and not left:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise kafka_exception(KafkaError._TIMED_OUT, "AddPartitionsToTxn still under way", retriable=True)
                self._cond.wait(min(remaining, 0.05) if remaining is not None else 0.05)
        return left

    def _hand_over(self, timeout: float | None) -> int:
        """Send every buffered record to the engine now and wait until each batch is queued
        there (validated, offsets given) -- not yet committed. Returns the records still held
        here when ``timeout`` (s) passed.

        EndTxn may follow at once: the engine commits in queue order and stops at its first
        failed commit, so the PrepareCommit record queued after these batches is never
        durable without them (the transaction commits exactly the records handed over).
        """
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        with self._lock:
            self._close_all(urgent=False)  # EndTxn's urgent Complete record follows: one flush for both
            # records still waiting for their topic count too: they either reach it or fail,
            # and a failed one makes the transaction abortable (librdkafka flushes them all)
            while self._buffers or self._txn_pending or any(self._queues.values()) or self._unknown:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return sum(len(f.buffer.values) for q in self._queues.values() for f in q) + len(self._unknown)
                self._cond.wait(min(remaining, 0.05) if remaining is not None else 0.05)
            return 0

    def _close_all(self, urgent: bool) -> None:
        """Close every open batch (caller holds the lock). ``urgent`` when a flush waits: every
        queued batch is marked urgent too, so the engine commits them without lingering."""
        if urgent:
            for queue in self._queues.values():
                for flight in queue:
                    flight.batch.urgent = True
        for tp in list(self._buffers):
            self._close_batch(tp, urgent=urgent)

    # ------------------------------------------------------------------ reports
    def poll(self, timeout: float | None = None) -> int:
        """Serve queued delivery reports (calling their callbacks); wait up to ``timeout`` s for one.

        Returns the number of events served.

        Raises:
            RuntimeError: the producer is closed; whatever a delivery callback raised.
        """
        self._check_open()
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        with self._lock:
            while not self._reports:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return 0
                if not self._queued:
                    return 0
                self._cond.wait(remaining if remaining is not None else 0.1)
            pending = len(self._reports)  # the reports queued now: a busy producer cannot keep poll() serving
        served = 0
        for _ in range(pending):
            with self._lock:
                if not self._reports:
                    break
                flight, result, err = self._reports.popleft()
            served += self._deliver(flight, result, err)
        return served

    def _deliver(self, flight: _InFlight, result: ProduceResult, err: KafkaError | None) -> int:
        """Call the delivery callbacks of a batch's records not served yet; returns how many were served.

        A callback that raises stops the serving and its exception propagates out of
        :meth:`poll`/:meth:`flush` (as confluent-kafka's): its record counts as served, and the
        batch's later reports go back in front of the queue for the next call, so ``len()``
        stays right.
        """
        buf, batch = flight.buffer, flight.batch
        n = len(buf.values)
        start = done = flight.served
        ts_type = TIMESTAMP_LOG_APPEND_TIME if result.log_append_time >= 0 else TIMESTAMP_CREATE_TIME
        try:
            for i in range(start, n if buf.any_callbacks else start):  # nothing to call: no loop over the records
                done = i + 1  # served even when its callback raises
                cb = buf.callbacks[i]
                if cb is not None and (err is not None or not self._only_errors):
                    offset = result.base_offset + i if err is None else -1001
                    ts = result.log_append_time if result.log_append_time >= 0 else buf.timestamps[i]
                    hdrs = [(h["key"], h["value"]) for h in buf.headers[i]] if buf.headers[i] else None
                    cb(err, Message._record(batch.topic, batch.partition, offset, buf.keys[i], buf.values[i], ts, ts_type,
                                            hdrs, err))
            done = n
        finally:
            flight.served = done
            with self._lock:
                self._queued -= done - start
                if done < n:
                    self._reports.appendleft((flight, result, err))
                self._cond.notify_all()
        return done - start

    def flush(self, timeout: float | None = None) -> int:
        """Send everything queued, wait for delivery and serve the reports.

        Returns the number of records still queued or in flight (0 when all were delivered).

        Raises:
            RuntimeError: the producer is closed; whatever a delivery callback raised.
        """
        self._check_open()
        if timeout is not None and not isinstance(timeout, (int, float)):
            raise TypeError(f"must be real number, not {type(timeout).__name__}")  # confluent-kafka's
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        with self._lock:
            self._close_all(urgent=True)
        while True:
            self.poll(0)
            with self._lock:
                if self._queued == 0:
                    return 0
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return self._queued
                if not self._reports:
                    self._cond.wait(min(remaining, 0.1) if remaining is not None else 0.1)

    def __len__(self) -> int:
        """Records queued, in flight, or with a delivery report not yet served (0 once closed)."""
        return 0 if self._closed else self._queued

    def __bool__(self) -> bool:
        """Always True, as confluent-kafka's: a producer with nothing queued (``len() == 0``) is
        not falsy."""
        return True

    def list_topics(self, topic: str | None = None, timeout: float = -1):
        """Cluster metadata (see :meth:`txlake.AdminClient.list_topics`)."""
        from .admin import cluster_metadata

        self._check_open("Handle has been closed")
        return cluster_metadata(self._broker, topic)

    # ------------------------------------------------------------------ bulk
    def produce_arrow(self, topic: str, data: pa.Table | pa.RecordBatchReader | Iterable[pa.RecordBatch],
                      key: str | None = "key", value: str = "value", partition: str | int | None = None,
                      timestamp: str | None = None, headers: str | None = None, batch_rows: int = 50_000,
                      max_pending_bytes: int = 64 * 1024 * 1024, timeout: float = 120.0) -> BulkResult:
        """Append a whole Arrow table (or a stream of record batches) as idempotent batches
        (transactional ones inside a transaction of a transactional producer: they become
        visible to read_committed readers when it commits).

        Args:
            key / value / timestamp / headers: column names (key and others may be None/absent);
                key and value columns must be binary or string; timestamps are ms since the
                epoch (or a timestamp type), null or -1 = now.
            partition: a column name of int partitions, a fixed partition, or None for the
                ``partitioner`` (as :meth:`produce`; the records it places at random go in
                round-robin chunks).
            batch_rows: records per batch (one sequence range each).
            max_pending_bytes: back-pressure bound; the load streams, it never holds the data set.

        Returns:
            :class:`BulkResult` with per-partition offset ranges.

        Raises:
            KafkaException: the first failed batch's error (batches before it are committed).
        """
        n_parts = self._partitions.get(topic) or self._lookup_topic(topic)
        if n_parts is None:
            raise kafka_exception(KafkaError._UNKNOWN_TOPIC, f"Unknown topic: {topic} (not in {self._broker.store.url})")
        topic_state = self._broker.topics()[topic]
        # A batch may not exceed the topic's max.message.bytes (Kafka checks whole batches).
        max_batch_bytes = int(effective_config(topic_state.config)["max.message.bytes"]) * 9 // 10
        with self._lock:
            if self._fatal is not None:
                raise KafkaException(self._fatal)
            if self._producer_id < 0 and not self._writer_checked:
                self._start_writing()
        batches = data.to_batches() if isinstance(data, pa.Table) else data
        pending: deque = deque()
        pending_bytes = 0
        total = 0
        offsets: dict[int, tuple[int, int]] = {}
        rr = random.randrange(n_parts)
        deadline = time.monotonic() + timeout

        def settle(entry) -> None:
            fut, p, count, nbytes = entry
            res = fut.result(timeout=timeout)
            if res.error != Errors.NO_ERROR:
                with self._lock:  # a transaction becomes abortable; an idempotent producer bumps its epoch
                    err = self._batch_failed((topic, p), res.error, res.message or res.error.name, self._idempotent)
                raise KafkaException(self._txn.error if self._txn is not None and self._txn.error else err)
            lo, hi = offsets.get(p, (res.base_offset, res.base_offset + count - 1))
            offsets[p] = (min(lo, res.base_offset), max(hi, res.base_offset + count - 1))

        # slices let splitting overlap with the flushers' encoding; 256 Ki rows rather than 64 Ki:
        # each partition's share then fills whole max.message.bytes batches (1 M records of 100
        # bytes, 8 partitions: 152 batches instead of 248, each a trip through the broker's Python)
        for rb in _slices(batches, 262_144):
            cols = rb.schema.names
            n = rb.num_rows
            keys = _binary_column(rb, key) if key and key in cols else pa.nulls(n, pa.binary())
            vals = _binary_column(rb, value)
            ts = (_timestamp_column(rb, timestamp, topic) if timestamp and timestamp in cols
                  else pa.array(np.full(n, int(time.time() * 1000), dtype=np.int64)))
            hdrs = rb.column(headers) if headers and headers in cols else pa.nulls(n, HEADER_TYPE)
            payload = pa.Table.from_arrays([ts, keys, vals, hdrs], schema=PAYLOAD_SCHEMA)
            if isinstance(partition, int):
                parts = np.full(n, partition, dtype=np.int32)
            elif isinstance(partition, str):
                parts = rb.column(partition).to_numpy(zero_copy_only=False).astype(np.int32)
            else:
                parts = _partition_keys(keys, n_parts, rr, self._hash, self._randomly)
                rr = (rr + 1) % n_parts
            if parts.size and (parts.min() < 0 or parts.max() >= n_parts):
                raise kafka_exception(KafkaError._UNKNOWN_PARTITION, f"partition out of range for {topic} ({n_parts} partitions)")
            # bytes per row, for the batch size and the back-pressure count (Table.nbytes of each
            # batch's slice cost 8% of this thread)
            row_bytes = payload.nbytes / max(1, n)
            rows_per_batch = max(1, min(batch_rows, int(max_batch_bytes // max(1.0, row_bytes))))
            if self._txn is not None:
                self._join_transaction({(topic, int(p)) for p in np.unique(parts)}, timeout)
            uniform = () if timestamp and timestamp in cols else ("timestamp",)
            for p, part_rows in _split_by_partition(payload, parts, uniform):
                for off in range(0, part_rows.num_rows, rows_per_batch):
                    chunk = part_rows.slice(off, rows_per_batch)
                    batch = ProduceBatch(topic, p, chunk, is_transactional=self._txn is not None)
                    with self._lock:  # sequence and send in one step: the engine sees the sequences in order
                        if self._idempotent:
                            self._await_epoch_bump(deadline)
                            batch.producer_id, batch.producer_epoch = self._producer_id, self._epoch
                            batch.base_sequence = self._assign_sequence((topic, p), chunk.num_rows)
                        fut = local_requests.produce(self._broker, batch, int(timeout * 1000), self._cfg["transactional.id"])
                    chunk_bytes = int(chunk.num_rows * row_bytes)
                    pending.append((fut, p, chunk.num_rows, chunk_bytes))
                    pending_bytes += chunk_bytes
                    total += chunk.num_rows
                    while pending and (pending_bytes > max_pending_bytes or pending[0][0].done()):
                        entry = pending.popleft()
                        pending_bytes -= entry[3]
                        settle(entry)
        self._broker.flush()
        while pending:
            settle(pending.popleft())
        return BulkResult(total, offsets)

    def _await_epoch_bump(self, deadline: float) -> None:
        """produce_arrow of an idempotent producer: a pending KIP-360 epoch bump happens before any
        new sequence is used; it waits for the batches of :meth:`produce` in flight (caller
        holds the lock)."""
        while self._bump_required and self._txn is None:
            self._maybe_bump()
            if not self._bump_required:
                return
            if self._fatal is not None:
                raise KafkaException(self._fatal)
            if time.monotonic() >= deadline:
                raise kafka_exception(KafkaError._TIMED_OUT, "the producer epoch bump waits for batches in flight")
            self._cond.wait(0.05)

    def _join_transaction(self, partitions: set[tuple[str, int]], timeout: float) -> None:
        """produce_arrow in a transaction: wait until ``partitions`` are in it (the transaction
        thread's AddPartitionsToTxn); raise the transaction's error if they could not be added."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._txn.check_produce()
            new = {tp for tp in partitions if tp not in self._txn.partitions}
            if not new:
                return
            self._txn_pending |= new
            self._cond.notify_all()
            while new & self._txn_pending:
                if time.monotonic() >= deadline:
                    raise kafka_exception(KafkaError._TIMED_OUT, "AddPartitionsToTxn did not complete in time")
                self._cond.wait(0.05)
            if not new <= self._txn.partitions:
                raise KafkaException(self._txn.error or KafkaError(Errors._STATE, "partitions not added to the transaction"))

    # ------------------------------------------------------------------ lifecycle
    def close(self, timeout: float | None = None) -> bool:
        """Flush (up to ``timeout`` s, None = until delivered), stop, and release the storage root
        (confluent-kafka 2.x's ``close``). Records still undelivered when ``timeout`` passes are
        dropped, as librdkafka drops them when a producer is destroyed. Idempotent.

        Returns:
            True, as confluent-kafka's (also when already closed).

        Raises:
            whatever a delivery callback raised (the producer stays open: call ``close()`` again).
        """
        if self._closed:
            return True
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._cond.notify_all()
        self._sender.join(timeout=5)
        if self._txn_thread is not None:
            self._txn_thread.join(timeout=5)
        release_broker(self._broker)
        return True

    def __del__(self) -> None:
        """A producer dropped without :meth:`close` (confluent-kafka's dealloc, librdkafka's
        ``rd_kafka_destroy``): its threads stop, records still queued or in flight are dropped
        without delivery reports (a warning names how many), and the storage root is released
        -- by its send thread (:func:`_release_dropped`): a finalizer runs in whatever thread
        dropped the last reference, which may hold a lock the release needs (the registry's,
        while it opens a broker), so it only notes the count, taking no lock."""
        if not getattr(self, "_closed", True) and hasattr(self, "_dropped"):   # not closed, fully made
            self._dropped.append(self._queued)

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _CountingCondition(threading.Condition):
    """A Condition that counts its notifications: a background thread that decides to wait
    while holding the lock but waits after releasing it (:func:`_while_referenced`) sees
    whether a notification came in between, instead of sleeping through it."""

    def __init__(self, lock) -> None:
        super().__init__(lock)
        self.notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)

    def notify_all(self) -> None:
        self.notified += 1
        super().notify_all()


def _while_referenced(ref: weakref.ref, step: Callable[[Any], tuple[float, int] | None],
                      cond: _CountingCondition, gone: Callable[[], None] | None = None) -> None:
    """A client's background thread: ``step(client)`` while the client (``ref()``) exists and
    the step returns ``(wait, seen)``, not None; then wait up to ``wait`` s (at most 1 s) for a
    notification of ``cond``, unless one came after the step decided to wait (``cond.notified``
    no longer ``seen``, the count it read under the lock). The client is held only during a
    step, so one dropped without ``close()`` is collected; the thread then calls ``gone()``
    (if given) and ends."""
    while True:
        client = ref()
        if client is None:
            if gone is not None:
                gone()
            return
        turn = step(client)
        del client
        if turn is None:
            return
        wait, seen = turn
        if wait > 0:
            with cond:
                if cond.notified == seen:
                    cond.wait(min(wait, 1.0))


def _release_dropped(dropped: list[int], broker) -> None:
    """The send thread of a producer collected without ``close()`` (``dropped``: what its
    ``__del__`` noted): warn of the records it held, release the storage root."""
    if not dropped:  # pragma: no cover - collected without __del__ running (interpreter exit)
        return
    if dropped[0]:
        log.warning("a producer was dropped without close() with %d records still queued or in flight: they are "
                    "not delivered (call flush() or close() first)", dropped[0])
    release_broker(broker)


def _call_if_alive(ref: weakref.ref, method: Callable, *args: Any) -> None:
    """``method(ref(), *args)`` if the object still exists: a callback held by a part of it
    (its transaction manager) or by the engine (a request's done callback) without the
    reference that would keep it alive."""
    obj = ref()
    if obj is not None:
        method(obj, *args)


def _split_by_partition(payload: pa.Table, parts: np.ndarray,
                        uniform: Collection[str] = ()) -> Iterable[tuple[int, pa.Table]]:
    """``(partition, rows)`` for each partition present, rows in input order.

    Rows already grouped by partition (``parts`` non-decreasing, as the Spark sink stages
    them) are cut into zero-copy slices. Otherwise the rows are grouped by ONE stable sort of
    the partition ids (numpy's radix sort of 16-bit keys) and ONE ``take``, then cut into
    zero-copy slices: it copies each row once, as a boolean filter per partition did, but one
    pass instead of one per partition present (1 M records of 100 bytes over 8 partitions, on
    warm memory: 0.07 CPU-s instead of 0.12-0.19; inside a bulk load, where the copy's pages
    are fresh, both cost about the same). A column whose rows are all equal -- all null, as the
    headers of a load without them, or named in ``uniform``, as the one load time standing in for
    absent timestamps -- reads the same in any order: it is kept, not copied (the list take of
    null headers alone was a tenth of the split).
    """
    n = len(parts)
    if n > 1 and bool((parts[1:] >= parts[:-1]).all()):
        cuts = (np.flatnonzero(parts[1:] != parts[:-1]) + 1).tolist()
        for start, end in zip([0, *cuts], [*cuts, n]):
            yield int(parts[start]), payload.slice(start, end - start)
        return
    counts = np.bincount(parts)
    present = np.flatnonzero(counts)
    if len(present) == 1:
        yield int(present[0]), payload
        return
    keys = parts.astype(np.int16) if len(counts) <= np.iinfo(np.int16).max else parts
    order = pa.array(np.argsort(keys, kind="stable").astype(np.int32, copy=False))
    varying = [name for name, column in zip(payload.column_names, payload.columns)
               if name not in uniform and column.null_count < n]
    # one call (each releases and retakes the GIL), into the engine's bulk pool: the flushers
    # free these rows once committed, and mimalloc, the default pool, would not reuse them here
    taken = pc.take(payload.select(varying), order, memory_pool=bulk_memory_pool()) if varying else payload
    grouped = pa.Table.from_arrays(
        [taken.column(name) if name in varying else payload.column(name) for name in payload.column_names],
        schema=payload.schema)
    start = 0
    for p in present.tolist():
        yield p, grouped.slice(start, int(counts[p]))
        start += int(counts[p])


def _slices(batches: Iterable[pa.RecordBatch], rows: int) -> Iterable[pa.RecordBatch]:
    for rb in batches:
        for start in range(0, rb.num_rows, rows):
            yield rb.slice(start, rows)


def _timestamp_column(rb: pa.RecordBatch, name: str, topic: str) -> pa.Array:
    """The CreateTime (ms) of each row from column ``name``: null and -1 (Kafka's NO_TIMESTAMP)
    are now, as in :meth:`Producer.produce`.

    Raises:
        KafkaException: ``_INVALID_ARG`` for a value below -1 or a column that is not an
            integer or timestamp column.
    """
    try:
        ts = rb.column(name).cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise kafka_exception(KafkaError._INVALID_ARG,
                              f"timestamp column {name!r} for {topic}: {exc}") from exc
    if len(ts) == 0:
        return ts
    lowest = pc.min(ts).as_py()
    if lowest is not None and lowest < NO_TIMESTAMP:
        raise kafka_exception(KafkaError._INVALID_ARG,
                              f"timestamp column {name!r} for {topic} holds {lowest}: a timestamp is -1 (none: "
                              f"the producer uses the current time) or 0..{MAX_TIMESTAMP} ms since the epoch")
    if ts.null_count or lowest == NO_TIMESTAMP:
        now = pa.scalar(int(time.time() * 1000), pa.int64())
        ts = pc.if_else(pc.fill_null(pc.equal(ts, NO_TIMESTAMP), True), now, ts)
    return ts


def _binary_column(rb: pa.RecordBatch, name: str) -> pa.Array:
    col = rb.column(name)
    if pa.types.is_binary(col.type):
        return col
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_large_binary(col.type):
        return col.cast(pa.binary())
    raise TypeError(f"column {name!r} must be binary or string, not {col.type}")


def _partition_keys(keys: pa.Array, n_parts: int, round_robin: int,
                    hash_key: Callable[[bytes, int], int] = partition_for_key, randomly: str | None = "null") -> np.ndarray:
    """The partitioner over an Arrow column: ``hash_key`` of each distinct key once; the keys
    placed at random (see :data:`PARTITIONERS`) go to ``round_robin``."""
    n = len(keys)
    if keys.null_count == n or randomly == "all":
        return np.full(n, round_robin, dtype=np.int32)
    encoded = pc.dictionary_encode(keys)
    distinct = encoded.dictionary.to_pylist()
    parts_of_key = np.array([round_robin if _random_key(k, randomly) else hash_key(k, n_parts) for k in distinct],
                            dtype=np.int32)
    idx = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False)
    parts = parts_of_key[idx] if len(parts_of_key) else np.zeros(n, dtype=np.int32)
    if keys.null_count:
        null_part = round_robin if randomly is not None else hash_key(b"", n_parts)
        parts = np.where(keys.is_null().to_numpy(zero_copy_only=False), null_part, parts)
    return parts.astype(np.int32)
