"""AdminClient: topic administration as confluent-kafka's ``AdminClient``.

Calls return ``dict[name, concurrent.futures.Future]``; a future's ``result()`` is None
on success or raises ``KafkaException`` with Kafka's error (TOPIC_ALREADY_EXISTS,
INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_CONFIG, UNKNOWN_TOPIC_OR_PART, ...).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from txlake.engine.broker import Broker
from txlake.engine.errors import ApiError, Errors
from txlake.engine.registry import acquire_broker, release_broker

from .config import parse_config
from .error import KafkaError, KafkaException, from_api_error


class NewTopic:
    """A topic to create (confluent-kafka's ``NewTopic``); ``num_partitions=-1`` takes ``num.partitions``."""

    def __init__(self, topic: str, num_partitions: int = -1, replication_factor: int = -1,
                 replica_assignment: list | None = None, config: dict[str, str] | None = None):
        self.topic = topic
        self.num_partitions = num_partitions
        self.replication_factor = replication_factor
        self.replica_assignment = replica_assignment
        self.config = dict(config or {})

    def __repr__(self) -> str:
        return f"NewTopic(topic={self.topic}, num_partitions={self.num_partitions})"


@dataclass
class PartitionMetadata:
    """A partition as Metadata describes it; there is one embedded broker (id 0) holding every partition."""

    id: int
    leader: int = 0
    replicas: list[int] = field(default_factory=lambda: [0])
    isrs: list[int] = field(default_factory=lambda: [0])
    error: KafkaError | None = None


@dataclass
class TopicMetadata:
    """A topic as Metadata describes it."""

    topic: str
    partitions: dict[int, PartitionMetadata]
    error: KafkaError | None = None


@dataclass
class BrokerMetadata:
    """The embedded broker (id 0) serving the storage root."""

    id: int
    host: str
    port: int


@dataclass
class ClusterMetadata:
    """confluent-kafka's ``ClusterMetadata``: ``topics`` by name, ``brokers`` by id."""

    cluster_id: str
    controller_id: int
    brokers: dict[int, BrokerMetadata]
    topics: dict[str, TopicMetadata]
    orig_broker_id: int = 0
    orig_broker_name: str = ""


def cluster_metadata(broker: Broker, topic: str | None = None) -> ClusterMetadata:
    """Metadata of one topic or all topics as the broker sees them now."""
    topics = broker.topics()
    out: dict[str, TopicMetadata] = {}
    for name, t in topics.items():
        if topic is None or name == topic:
            out[name] = TopicMetadata(name, {p.partition: PartitionMetadata(p.partition) for p in t.partitions})
    if topic is not None and topic not in out:
        out[topic] = TopicMetadata(topic, {}, KafkaError(Errors.UNKNOWN_TOPIC_OR_PART, f"Unknown topic: {topic}"))
    return ClusterMetadata(broker.store.url, 0, {0: BrokerMetadata(0, broker.store.url, 0)}, out,
                           orig_broker_name=broker.store.url)


def _future(error: Errors, message: str) -> Future:
    fut: Future = Future()
    if error == Errors.NO_ERROR:
        fut.set_result(None)
    else:
        fut.set_exception(KafkaException(KafkaError(error, message)))
    return fut


class AdminClient:
    """Topic administration of a storage root (confluent-kafka's ``AdminClient``).

    Write operations take the storage root's writer lease (first write); listing does not.
    """

    def __init__(self, conf: dict | None = None, **kwargs: Any):
        self._cfg = parse_config({**(conf or {}), **kwargs}, "admin")
        self._broker = acquire_broker(self._cfg.storage_url, self._cfg.storage_options, self._cfg.broker_config())
        self._closed = False

    def create_topics(self, new_topics: list[NewTopic], operation_timeout: float = 0, request_timeout: float = -1,
                      validate_only: bool = False) -> dict[str, Future]:
        """CreateTopics: one future per topic (None, or KafkaException with Kafka's error)."""
        if not isinstance(new_topics, list) or not all(isinstance(t, NewTopic) for t in new_topics):
            raise TypeError("Expected list of NewTopic")
        if len({t.topic for t in new_topics}) != len(new_topics):
            raise ValueError("Duplicate topic names in request")
        try:
            results = self._broker.create_topics([(t.topic, t.num_partitions, t.config) for t in new_topics], validate_only)
        except ApiError as exc:
            return {t.topic: _failed(from_api_error(exc)) for t in new_topics}
        return {t.topic: _future(err, msg) for t, (err, msg) in zip(new_topics, results)}

    def delete_topics(self, topics: list[str], operation_timeout: float = 0, request_timeout: float = -1) -> dict[str, Future]:
        """DeleteTopics: one future per topic."""
        if not isinstance(topics, list):
            raise TypeError("Expected list of topic names")
        try:
            results = self._broker.delete_topics(topics)
        except ApiError as exc:
            return {t: _failed(from_api_error(exc)) for t in topics}
        return {t: _future(err, msg) for t, (err, msg) in zip(topics, results)}

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """Metadata of all topics (or one), as of the newest catalog commit."""
        self._broker.refresh()
        return cluster_metadata(self._broker, topic)

    def close(self) -> None:
        """Release the storage root. Idempotent."""
        if not self._closed:
            self._closed = True
            release_broker(self._broker)

    def __enter__(self) -> "AdminClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _failed(exc: KafkaException) -> Future:
    fut: Future = Future()
    fut.set_exception(exc)
    return fut
