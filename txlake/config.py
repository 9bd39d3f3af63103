"""Client configuration: Kafka's dotted keys, their defaults, and validation.

A confluent-kafka config dict works unchanged (issue 17). The keys txlake implements are
validated and applied; every other property librdkafka knows
(:mod:`txlake.librdkafka_config`: ``security.protocol``, ``sasl.*``, ``ssl.*``,
``socket.*``, ``statistics.interval.ms``, a consumer key given to a producer, ...) is checked
against librdkafka's type and range, accepted, and logged once per process as having no
effect here. Unknown keys and invalid values raise ``KafkaException`` with ``_INVALID_ARG``
and a message naming the key (librdkafka's wording, plus a did-you-mean hint). Defaults are
Kafka's (the Java clients') where the semantics are Kafka's; keys only librdkafka has keep
librdkafka's default. Keys prefixed ``storage.`` configure the embedded engine of the
storage root.
"""

from __future__ import annotations

import difflib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from txlake.catalog.catalog import MIN_LOG_RETENTION_MS
from txlake.catalog.log_cleanup import DEFAULT_LOG_RETENTION_MS
from txlake.catalog.redaction import redact_config, redact_url, redact_value
from txlake.engine.requests import (DEFAULT_FLUSH_IDLE_MIN_BYTES, DEFAULT_FLUSH_IDLE_MS, DEFAULT_FLUSH_INTERVAL_MS,
                                    DEFAULT_FLUSH_MIN_INTERVAL_MS, BrokerConfig)

from .error import KafkaError, kafka_exception
from .librdkafka_config import LIBRDKAFKA_PROPERTIES

log = logging.getLogger(__name__)

DEFAULT_STORAGE_DIR = os.path.join(os.path.expanduser("~"), ".txlake", "data")


def default_storage_url() -> str:
    """``$TXLAKE_STORAGE`` if set, else ``file://~/.txlake/data``."""
    return os.environ.get("TXLAKE_STORAGE") or f"file://{DEFAULT_STORAGE_DIR}"


def _bad(key: str, value: object, why: str = "") -> Exception:
    extra = f": {why}" if why else ""
    shown = redact_value(key, value)   # a secret's value is never echoed back
    return kafka_exception(KafkaError._INVALID_ARG, f"Invalid value \"{shown}\" for configuration property \"{key}\"{extra}")


def _int(lo: int | None = None, hi: int | None = None) -> Callable[[str, Any], int]:
    def parse(key: str, value: Any) -> int:
        try:
            n = int(value)
        except (TypeError, ValueError):
            raise _bad(key, value, "expected an integer") from None
        if isinstance(value, float) and not value.is_integer():
            raise _bad(key, value, "expected an integer")
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            bounds = f"{lo}..{hi}" if lo is not None and hi is not None else f">= {lo}" if lo is not None else f"<= {hi}"
            raise _bad(key, value, f"value must be {bounds}")
        return n
    return parse


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise _bad(key, value, "expected true or false")


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def parse(key: str, value: Any) -> str:
        text = str(value)
        if text not in choices:
            raise _bad(key, value, f"expected one of {', '.join(choices)}")
        return text
    return parse


def _str(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _bad(key, value, "expected a string")
    return value


def _any(key: str, value: Any) -> Any:
    return value


def _acks(key: str, value: Any) -> int:
    text = str(value).strip().lower()
    if text == "all":
        return -1
    n = _int(-1, 1000)(key, value)
    return n


def _callable(key: str, value: Any) -> Any:
    if not callable(value):
        raise _bad(key, value, "expected a callable")
    return value


COMMON: dict[str, tuple[Callable, Any]] = {
    "storage.url": (_str, None),
    "storage.options": (_any, None),
    "storage.flush.linger.ms": (_int(0, 60_000), 5),
    "storage.flush.interval.ms": (_int(0, 60_000), DEFAULT_FLUSH_INTERVAL_MS),
    # the early flush of a queue whose producers wait for their acks (engine/flush_schedule.py)
    "storage.flush.min.interval.ms": (_int(0, 60_000), DEFAULT_FLUSH_MIN_INTERVAL_MS),
    "storage.flush.idle.ms": (_int(0, 60_000), DEFAULT_FLUSH_IDLE_MS),
    "storage.flush.idle.min.bytes": (_int(0), DEFAULT_FLUSH_IDLE_MIN_BYTES),
    "storage.flush.max.bytes": (_int(1024), 64 * 1024 * 1024),
    "storage.lease.ms": (_int(100), 15_000),
    "storage.lease.force": (_bool, False),
    "storage.checkpoint.interval": (_int(1), 100),
    "storage.producer.snapshot.interval": (_int(1), 50),
    "storage.orphan.grace.ms": (_int(0), 3_600_000),
    "storage.file.delete.delay.ms": (_int(0), 3_600_000),
    "storage.compaction.interval.ms": (_int(0), 300_000),
    # the writer publishes each topic's Delta table this often (docs/tables.md); 0 disables it
    "lake.publish.interval.ms": (_int(0), 5_000),
    "storage.compaction.batch.bytes": (_int(1024 * 1024), 512 * 1024 * 1024),
    "storage.catalog.retention.ms": (_int(MIN_LOG_RETENTION_MS), DEFAULT_LOG_RETENTION_MS),
    "storage.handoff.poll.ms": (_int(10, 60_000), 500),
    "storage.handoff.timeout.ms": (_int(100, 3_600_000), 30_000),
    "num.partitions": (_int(1), 1),
    # producer state retention (KIP-360; Kafka's broker configs and defaults)
    "producer.id.expiration.ms": (_int(1, 2**31 - 1), 86_400_000),
    "producer.id.expiration.check.interval.ms": (_int(1, 2**31 - 1), 600_000),
    # the embedded transaction coordinator's broker configs (Kafka's names and defaults)
    "transaction.max.timeout.ms": (_int(1), 900_000),
    "transaction.state.log.num.partitions": (_int(1), 50),
    "transactional.id.expiration.ms": (_int(1), 604_800_000),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": (_int(1), 10_000),
    "transaction.remove.expired.transaction.cleanup.interval.ms": (_int(1), 3_600_000),
    # the finalized level of Kafka's transaction.version feature (KIP-890): 2 serves transaction
    # version 2 to the clients that implement it, 0 or 1 keeps every client on part 1 (docs/server.md)
    "transaction.version": (_int(0, 2), 2),
    # the embedded group coordinator's broker configs (Kafka's names and defaults)
    "group.initial.rebalance.delay.ms": (_int(0), 3_000),
    "group.min.session.timeout.ms": (_int(0), 6_000),
    "group.max.session.timeout.ms": (_int(0), 1_800_000),
    "group.max.size": (_int(1), 2**31 - 1),
    "offsets.topic.num.partitions": (_int(1), 50),
    "offsets.retention.minutes": (_int(1, 2**31 - 1), 10_080),
    "offsets.retention.check.interval.ms": (_int(1, 2**63 - 1), 600_000),
    "bootstrap.servers": (_str, None),
    "client.id": (_str, "rdkafka"),
    "error_cb": (_callable, None),
    "logger": (_any, None),
    "request.timeout.ms": (_int(1), 30_000),
    "socket.timeout.ms": (_int(10), 60_000),
    "debug": (_str, None),
}

PRODUCER: dict[str, tuple[Callable, Any]] = {
    "acks": (_acks, -1),
    "request.required.acks": (_acks, -1),
    "enable.idempotence": (_bool, True),
    "retries": (_int(0, 2**31 - 1), 2**31 - 1),
    "message.send.max.retries": (_int(0, 2**31 - 1), 2**31 - 1),
    "max.in.flight.requests.per.connection": (_int(1, 1_000_000), 5),
    "max.in.flight": (_int(1, 1_000_000), 5),
    "linger.ms": (_int(0, 900_000), 5),
    "queue.buffering.max.ms": (_int(0, 900_000), 5),
    "batch.size": (_int(1, 2**31 - 1), 1_000_000),
    "batch.num.messages": (_int(1, 1_000_000), 10_000),
    "message.max.bytes": (_int(1000, 1_000_000_000), 1_000_000),
    "delivery.timeout.ms": (_int(0, 2**31 - 1), 300_000),
    "message.timeout.ms": (_int(0, 2**31 - 1), 300_000),
    "retry.backoff.ms": (_int(1, 300_000), 100),
    "queue.buffering.max.messages": (_int(0, 2**31 - 1), 100_000),
    "queue.buffering.max.kbytes": (_int(1, 2**31 - 1), 1_048_576),
    "compression.type": (_choice("none", "gzip", "snappy", "lz4", "zstd"), "none"),
    "compression.codec": (_choice("none", "gzip", "snappy", "lz4", "zstd"), "none"),
    "topic.metadata.propagation.max.ms": (_int(0, 3_600_000), 30_000),
    "partitioner": (_choice("random", "consistent", "consistent_random", "murmur2", "murmur2_random", "fnv1a",
                            "fnv1a_random"), "consistent_random"),
    "transactional.id": (_str, None),
    "transaction.timeout.ms": (_int(1000, 2**31 - 1), 60_000),
    "on_delivery": (_callable, None),
    "delivery.report.only.error": (_bool, False),
}

CONSUMER: dict[str, tuple[Callable, Any]] = {
    "group.id": (_str, None),
    "group.instance.id": (_str, None),
    "isolation.level": (_choice("read_committed", "read_uncommitted"), "read_committed"),
    "enable.auto.commit": (_bool, True),
    "auto.commit.interval.ms": (_int(0, 86_400_000), 5_000),
    "enable.auto.offset.store": (_bool, True),
    "auto.offset.reset": (_choice("smallest", "earliest", "beginning", "largest", "latest", "end", "error"), "latest"),
    "enable.partition.eof": (_bool, False),
    "fetch.wait.max.ms": (_int(0, 300_000), 500),
    "fetch.min.bytes": (_int(1), 1),
    "fetch.max.bytes": (_int(0), 52_428_800),
    "max.partition.fetch.bytes": (_int(1), 1_048_576),
    "session.timeout.ms": (_int(1, 3_600_000), 45_000),
    "heartbeat.interval.ms": (_int(1, 3_600_000), 3_000),
    "max.poll.interval.ms": (_int(1, 86_400_000), 300_000),
    "partition.assignment.strategy": (_str, "range,roundrobin"),
    "on_commit": (_callable, None),
    "check.crcs": (_bool, False),
}

ADMIN: dict[str, tuple[Callable, Any]] = {}

#: confluent-kafka's Python-level keys that txlake accepts but has nothing to call them for
#: (no broker throttles, no statistics, no OAuth: the storage root is reached through fsspec)
IGNORED_CALLBACKS = ("throttle_cb", "stats_cb", "oauth_cb")

_ignored_logged: set[tuple[str, str]] = set()
_ignored_lock = threading.Lock()


def _librdkafka_parser(key: str) -> Callable[[str, Any], Any]:
    """A check of ``key``'s value by librdkafka's own type and range (integers in range,
    booleans, one of an enumeration); any value for other types."""
    _scope, allowed, _default, kind = LIBRDKAFKA_PROPERTIES[key]
    if kind == "integer" and ".." in allowed:
        low, high = (int(x) for x in allowed.split(".."))
        return _int(low, high)
    if kind == "boolean":
        return _bool
    if kind == "enum value" and allowed:
        choices = [x.strip() for x in allowed.split(",")]

        def enum(key: str, value: Any) -> str:  # librdkafka compares enum values case-insensitively
            text = str(value)
            if text.lower() not in choices:
                raise _bad(key, value, f"expected one of {', '.join(choices)}")
            return text
        return enum
    return _any


def _log_ignored(key: str, kind: str) -> None:
    with _ignored_lock:
        if (key, kind) in _ignored_logged:
            return
        _ignored_logged.add((key, kind))
    log.warning("configuration property \"%s\" has no effect on a txlake %s (accepted and ignored: "
                "docs/confluent-kafka.md)", key, kind)


def _unknown(key: str, table: Mapping[str, Any]) -> Exception:
    known = [k for k in (*table, *LIBRDKAFKA_PROPERTIES, *IGNORED_CALLBACKS) if not k.startswith("storage.options")]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    hint = f" (did you mean \"{close[0]}\"?)" if close else ""
    return kafka_exception(KafkaError._INVALID_ARG, f"No such configuration property: \"{key}\"{hint}")

TRANSACTION_BROKER_KEYS = ("transaction.max.timeout.ms", "transaction.state.log.num.partitions",
                           "transactional.id.expiration.ms",
                           "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                           "transaction.remove.expired.transaction.cleanup.interval.ms", "transaction.version")

GROUP_BROKER_KEYS = ("group.initial.rebalance.delay.ms", "group.min.session.timeout.ms",
                     "group.max.session.timeout.ms", "group.max.size", "offsets.topic.num.partitions",
                     "offsets.retention.minutes", "offsets.retention.check.interval.ms")


@dataclass
class ClientConfig:
    """A validated client config: ``values`` has every known key with its default applied."""

    values: dict[str, Any]
    explicit: frozenset[str]
    storage_url: str
    storage_options: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def __repr__(self) -> str:
        # secrets (storage.options key/secret/token, passwords, URL userinfo) shown as [redacted]
        return (f"ClientConfig(values={redact_config(self.values)!r}, explicit={self.explicit!r}, "
                f"storage_url={redact_url(self.storage_url)!r}, "
                f"storage_options={redact_config(self.storage_options)!r})")

    def broker_config(self) -> BrokerConfig:
        """The embedded engine's settings taken from the ``storage.*`` keys."""
        v = self.values
        return BrokerConfig(
            flush_linger_ms=v["storage.flush.linger.ms"], flush_max_bytes=v["storage.flush.max.bytes"],
            flush_interval_ms=v["storage.flush.interval.ms"],
            flush_min_interval_ms=v["storage.flush.min.interval.ms"], flush_idle_ms=v["storage.flush.idle.ms"],
            flush_idle_min_bytes=v["storage.flush.idle.min.bytes"],
            num_partitions=v["num.partitions"], lease_ms=v["storage.lease.ms"], lease_force=v["storage.lease.force"],
            checkpoint_interval=v["storage.checkpoint.interval"],
            producer_snapshot_interval=v["storage.producer.snapshot.interval"],
            orphan_grace_ms=v["storage.orphan.grace.ms"], handoff_poll_ms=v["storage.handoff.poll.ms"],
            file_delete_delay_ms=v["storage.file.delete.delay.ms"],
            compaction_interval_ms=v["storage.compaction.interval.ms"],
            publish_interval_ms=v["lake.publish.interval.ms"],
            compaction_batch_bytes=v["storage.compaction.batch.bytes"],
            catalog_retention_ms=v["storage.catalog.retention.ms"],
            producer_id_expiration_ms=v["producer.id.expiration.ms"],
            producer_id_expiration_check_interval_ms=v["producer.id.expiration.check.interval.ms"],
            transaction={k: v[k] for k in TRANSACTION_BROKER_KEYS},
            group={k: v[k] for k in GROUP_BROKER_KEYS},
        )


def constructor_conf(conf: Any, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A client constructor's configuration: the ``conf`` dict merged with keyword arguments
    (confluent-kafka's ``Producer(conf, **kwargs)``).

    Raises:
        TypeError: ``"expected configuration dict"`` when there is neither, or ``conf`` is
            not a dict (confluent-kafka's error).
    """
    if (conf is None and not kwargs) or (conf is not None and not isinstance(conf, Mapping)):
        raise TypeError("expected configuration dict")
    return {**(conf or {}), **kwargs}


def parse_config(conf: Mapping[str, Any] | None, kind: str) -> ClientConfig:
    """Validate ``conf`` for a client of ``kind`` ("producer", "consumer", "admin").

    Raises:
        KafkaException: ``_INVALID_ARG`` naming an unknown key or an invalid value.
    """
    if conf is not None and not isinstance(conf, Mapping):
        raise kafka_exception(KafkaError._INVALID_ARG, "expected a configuration dict")
    conf = dict(conf or {})
    topic_conf = conf.pop("default.topic.config", None)
    if topic_conf is not None:  # librdkafka's legacy default topic configuration: its entries apply as top-level ones
        if not isinstance(topic_conf, Mapping):
            raise _bad("default.topic.config", topic_conf, "expected a dict of topic configuration properties")
        conf = {**conf, **topic_conf}  # its entries win, as with confluent-kafka
    table = {**COMMON, **{"producer": PRODUCER, "consumer": CONSUMER, "admin": ADMIN}[kind]}
    values = {k: default for k, (_, default) in table.items()}
    options: dict[str, Any] = {}
    explicit = set()
    for key, value in conf.items():
        if not isinstance(key, str):
            raise kafka_exception(KafkaError._INVALID_ARG, f"configuration keys must be strings, got {key!r}")
        if value is None and key in LIBRDKAFKA_PROPERTIES and (key not in table or table[key][1] is None
                                                              or isinstance(table[key][1], str)):
            continue  # None sets a string property to librdkafka's NULL: its default (confluent-kafka)
        if key.startswith("storage.options."):
            options[key[len("storage.options."):]] = value
            continue
        entry = table.get(key)
        if entry is None:
            if key in IGNORED_CALLBACKS:
                _callable(key, value)
            elif key in LIBRDKAFKA_PROPERTIES:
                _librdkafka_parser(key)(key, value)
            else:
                raise _unknown(key, table)
            _log_ignored(key, kind)
            continue
        values[key] = entry[0](key, value)
        explicit.add(key)
    if isinstance(values["storage.options"], Mapping):
        options = {**values["storage.options"], **options}
    elif values["storage.options"] is not None:
        raise _bad("storage.options", values["storage.options"], "expected a dict of fsspec options")
    if "storage.url" in explicit and not values["storage.url"].strip():
        raise _bad("storage.url", values["storage.url"], "expected a storage root URL (file:///path, "
                   "s3://bucket/prefix or memory://name), not an empty string")
    url = values["storage.url"] or default_storage_url()
    return ClientConfig(values, frozenset(explicit), url, options)
