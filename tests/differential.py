"""Helpers for differential tests: the same confluent-kafka scenario against Apache Kafka
(the ``apache_kafka`` fixture, tests/kafka_reference.py) and against ``txlake serve``, each
returning a plain record of outcomes (dicts, lists, tuples, ints, bytes, error names) that
compare with ``==`` (issue 18).

An outcome never holds what legitimately differs between two brokers: topic names carry a
per-run suffix that :class:`Run` strips, and producer ids, topic ids, cluster ids and leader
epochs are left out (docs/server.md, "Behaviour that differs").
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import StorageTarget
from server_support import ServedRoot, decode_response, roundtrip

#: how long one client call may take before the scenario gives up on it (s)
CALL_TIMEOUT_S = 30.0

#: ``txlake serve`` settings that match the reference broker's (tests/kafka_reference.py,
#: ``SINGLE_NODE_SETTINGS``): no initial rebalance delay, timed-out transactions looked for
#: every 200 ms
TXLAKE_SETTINGS: dict[str, object] = {"group.initial.rebalance.delay.ms": 0,
                                      "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200}


@contextmanager
def served_txlake(tmp: Path) -> Iterator[ServedRoot]:
    """``txlake serve`` on a fresh file:// root under ``tmp`` with :data:`TXLAKE_SETTINGS`, for
    one test module; stopped with SIGTERM at the end, which must exit 0 (AssertionError with
    its log otherwise)."""
    served = ServedRoot(StorageTarget(url=f"file://{tmp}/root", backend="file"), tmp, settings=TXLAKE_SETTINGS)
    served.start()
    try:
        yield served
    finally:
        code = served.stop()
    assert code == 0, f"txlake serve exited {code}; log {served.log_path}:\n{served.log_text()[-3000:]}"


class PairedOutcomes:
    """The outcomes of named scenarios against Apache Kafka and against txlake (a module
    fixture): ``outcomes["name"]`` -> ``(kafka's, txlake's)``, the two runs side by side on two
    threads at the first use, then kept (the scenarios spend their time waiting on the brokers,
    so the pair takes about as long as the slower run). A scenario that raised raises the same
    exception again instead of running twice.

    Args:
        kafka, txlake: the brokers' ``bootstrap.servers``.
        scenarios: name -> scenario function (bootstrap -> outcome dict).
    """

    def __init__(self, kafka: str, txlake: str, scenarios: dict[str, Callable[[str], dict[str, Any]]]):
        self.bootstraps = (kafka, txlake)
        self.scenarios = scenarios
        self._done: dict[str, Any] = {}

    def __getitem__(self, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
        if name not in self._done:
            with ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"scenario-{name}") as pool:
                runs = [pool.submit(self.scenarios[name], bootstrap) for bootstrap in self.bootstraps]
            try:
                self._done[name] = tuple(run.result() for run in runs)
            except Exception as exc:  # noqa: BLE001 - kept and raised again at every use
                self._done[name] = exc
        found = self._done[name]
        if isinstance(found, Exception):
            raise found
        return found


def error_name(err: KafkaError | None) -> str | None:
    """``KafkaError`` -> its name (``"TOPIC_ALREADY_EXISTS"``, librdkafka's local ones with a
    leading ``_``); None for no error."""
    return None if err is None else err.name()


def error_flags(err: KafkaError | None) -> tuple[str, bool, bool, bool] | None:
    """``KafkaError`` -> ``(name, fatal(), retriable(), txn_requires_abort())``: what a
    transactional application decides on (KIP-98's error classes as librdkafka raises them);
    None for no error."""
    if err is None:
        return None
    return err.name(), err.fatal(), err.retriable(), err.txn_requires_abort()


def outcome(fn: Callable[[], Any], flags: bool = False) -> tuple[str, Any]:
    """Run one client call: ``("ok", its result)`` or ``("error", KafkaError name)`` -- with
    ``flags``, ``("error", error_flags(...))``.

    ``KafkaException`` (a future's or a call's) gives the name of the ``KafkaError`` it
    carries; any other exception propagates (a scenario bug, not an outcome)."""
    try:
        return "ok", fn()
    except KafkaException as e:
        err = e.args[0]
        if not isinstance(err, KafkaError):
            return "error", str(err)
        return "error", error_flags(err) if flags else error_name(err)


def outcome_message(fn: Callable[[], Any]) -> str | None:
    """The error message a failing call raises (``KafkaError.str()``), None when it succeeds."""
    try:
        fn()
    except KafkaException as e:
        err = e.args[0]
        return err.str() if isinstance(err, KafkaError) else str(err)
    return None


class Run:
    """One scenario run against one broker: client factories with a common config and a
    unique suffix for every name the run creates, so runs never meet on a shared broker.

    Args:
        bootstrap: ``bootstrap.servers``.
    """

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap
        self.suffix = "-" + uuid.uuid4().hex[:8]
        self._admin: AdminClient | None = None

    def name(self, logical: str) -> str:
        """The broker-side name of a topic or group."""
        return logical + self.suffix

    def logical(self, name: str) -> str:
        """Back from a broker-side name (names without the suffix stay as they are)."""
        return name[: -len(self.suffix)] if name.endswith(self.suffix) else name

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap})
        return self._admin

    def producer(self, **conf: Any) -> Producer:
        return Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5, **conf})

    def txn_producer(self, transactional_id: str, **conf: Any) -> Producer:
        """A transactional producer of the logical ``transactional_id`` (not yet initialised)."""
        return self.producer(**{"transactional.id": self.name(transactional_id), **conf})

    def consumer(self, group: str | None = None, **conf: Any) -> Consumer:
        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.name(group or "reader"),
                         "enable.auto.commit": False, "auto.offset.reset": "error", **conf})

    def create_topics(self, topics: dict[str, int | tuple[int, dict[str, str]]]) -> None:
        """Create logical topics (name -> partitions, or (partitions, topic configs)) and wait
        until Metadata names each (raises what CreateTopics answered otherwise)."""
        specs = {name: spec if isinstance(spec, tuple) else (spec, {}) for name, spec in topics.items()}
        futures = self.admin.create_topics([NewTopic(self.name(name), n, config=config)
                                            for name, (n, config) in specs.items()], operation_timeout=CALL_TIMEOUT_S)
        for future in futures.values():
            future.result(CALL_TIMEOUT_S)
        for name, (n, _) in specs.items():
            self.wait_for_topic(name, n)

    def watermarks(self, logical: str, partitions: int, isolation: str) -> list[tuple[int, int]]:
        """``(low, high)`` per partition as a consumer with ``isolation.level=isolation`` queries
        them (ListOffsets: the high watermark for read_uncommitted, the LSO for read_committed)."""
        consumer = self.consumer(**{"isolation.level": isolation})
        try:
            return [consumer.get_watermark_offsets(TopicPartition(self.name(logical), p), timeout=CALL_TIMEOUT_S)
                    for p in range(partitions)]
        finally:
            consumer.close()

    def raw(self, request: Any, version: int, response_cls: Any) -> Any:
        """One kafka-python request message at ``version`` on a fresh connection, its decoded
        response (for the APIs confluent-kafka's AdminClient does not offer, and for error
        codes the client hides)."""
        port = int(self.bootstrap.rsplit(":", 1)[1])
        return decode_response(response_cls, roundtrip(port, request, version, timeout_s=CALL_TIMEOUT_S), version)

    def wait_for_topic(self, logical: str, partitions: int) -> None:
        """Until Metadata names the topic with all its partitions (Kafka's brokers learn a new
        topic from the metadata log a moment after CreateTopics answers)."""
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while time.monotonic() < deadline:
            md = self.admin.list_topics(self.name(logical), timeout=CALL_TIMEOUT_S).topics.get(self.name(logical))
            if md is not None and md.error is None and len(md.partitions) == partitions and all(
                    p.leader >= 0 for p in md.partitions.values()):
                return
            time.sleep(0.05)
        raise AssertionError(f"topic {self.name(logical)} did not appear with {partitions} partitions")

    def produce(self, records: list[dict], **conf: Any) -> list[tuple]:
        """Produce ``records`` (dicts of Producer.produce keyword arguments with a logical
        ``topic``) with one idempotent producer; the delivery reports in order of the records,
        as ``(error name, logical topic, partition, offset)`` (-1001 offset on error), or
        ``("raised", KafkaError name)`` for a record ``produce()`` itself refused."""
        producer = self.producer(**conf)
        reports: list[Any] = [None] * len(records)
        for i, rec in enumerate(records):
            def report(err, msg, i=i):
                reports[i] = (error_name(err), self.logical(msg.topic()), msg.partition(),
                              msg.offset() if err is None else -1001)
            try:
                producer.produce(**{**rec, "topic": self.name(rec["topic"])}, on_delivery=report)
            except KafkaException as e:
                reports[i] = ("raised", error_name(e.args[0]))
            producer.poll(0)
        remaining = producer.flush(CALL_TIMEOUT_S)
        assert remaining == 0, f"{remaining} records undelivered after {CALL_TIMEOUT_S} s"
        return reports

    def consume(self, logical: str, start: dict[int, int], expected: int, errors: int = 0, quiet_s: float = 0.3,
                **conf: Any) -> list[tuple]:
        """Assign the partitions of ``start`` (partition -> offset) and read until ``expected``
        records and ``errors`` error events came, then ``quiet_s`` more (so extra ones show),
        with ``auto.offset.reset=error`` unless ``conf`` says otherwise. Returns the records as
        ``(partition, offset, key, value, headers, (timestamp type, timestamp))`` sorted by
        partition and offset, then each error event as ``("error", partition, name)``."""
        consumer = self.consumer(**conf)
        consumer.assign([TopicPartition(self.name(logical), p, o) for p, o in start.items()])
        got: list[tuple] = []
        deadline = time.monotonic() + CALL_TIMEOUT_S
        quiet_until = None
        try:
            while time.monotonic() < deadline:
                n_errors = sum(1 for r in got if r[0] == "error")
                if len(got) - n_errors >= expected and n_errors >= errors:
                    quiet_until = quiet_until or time.monotonic() + quiet_s
                    if time.monotonic() >= quiet_until:
                        break
                msg = consumer.poll(0.1)
                if msg is None:
                    continue
                if msg.error() is not None:
                    got.append(("error", msg.partition(), error_name(msg.error())))
                    continue
                got.append((msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers(), msg.timestamp()))
        finally:
            consumer.close()
        return sorted(got, key=lambda r: (1, r[1], r[2]) if r[0] == "error" else (0, r[0], r[1]))
