"""Apache Kafka itself, on this machine, as the reference the differential tests and the
server benchmarks compare ``txlake serve`` with (issue 18).

:class:`ApacheKafka` runs ONE KRaft node (``process.roles=broker,controller``) from the jars
``dev/kafka_reference.sh`` fetched into the git-ignored ``dev/kafka-lib/`` (Apache Kafka
4.3.1, :data:`KAFKA_VERSION`): it writes a ``server.properties`` with explicit free ports on
127.0.0.1 and a temporary log dir, formats the dir with Kafka's storage tool as a
single-node dynamic quorum (KIP-853: ``kafka-storage format --standalone`` with
``controller.quorum.bootstrap.servers``), starts ``java -cp 'dev/kafka-lib/*' kafka.Kafka
server.properties``, waits until a confluent-kafka AdminClient gets Metadata naming the
broker, and has it create and load ``__consumer_offsets`` and ``__transaction_state``. The settings are the ones that make it answer like txlake's single node
(:data:`SINGLE_NODE_SETTINGS`: replication factor 1 for the internal topics, no initial
rebalance delay, one partition by default, no auto topic creation).

``python tests/kafka_reference.py`` starts one by hand and prints its bootstrap address.
"""

from __future__ import annotations

import atexit
import base64
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

_TESTS_DIR = Path(__file__).resolve().parent
if str(_TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(_TESTS_DIR))

from s3_server import _die_with_parent, _free_ports  # noqa: E402

__all__ = ["ApacheKafka", "KafkaReferenceError", "KAFKA_LIB", "FETCH_SCRIPT", "KAFKA_VERSION", "kafka_jars_present",
           "java_command", "tool_command"]

REPO = _TESTS_DIR.parent
#: the script that fetches the jars (Maven Central, ``mvn dependency:copy-dependencies``)
FETCH_SCRIPT = REPO / "dev" / "kafka_reference.sh"
#: where it puts them (git-ignored)
KAFKA_LIB = REPO / "dev" / "kafka-lib"
#: the Apache Kafka release the jars are (4.4.0's kafka-tools does not resolve here)
KAFKA_VERSION = "4.3.1"

#: broker settings that make one Kafka node answer like ``txlake serve`` (one node, the only
#: replica; txlake has no auto topic creation, docs/server.md)
SINGLE_NODE_SETTINGS: dict[str, str] = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "auto.create.topics.enable": "false",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # txlake's internal topics have 50 partitions, as Kafka's by default; which one holds a
    # group or transactional id is not visible to a client, and one partition each loads in
    # a fraction of the time at start-up
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.num.partitions": "1",
    # the coordinator looks for timed-out transactions every 0.2 s instead of 10 s, so a test
    # of transaction.timeout.ms waits for its timeout, not for the next round (txlake's
    # differential server gets the same setting)
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
}


#: JVM options that start the node in about half the time (C1 only, serial GC), for tests;
#: benchmarks keep the JVM's defaults (full JIT)
FAST_START_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class KafkaReferenceError(RuntimeError):
    """Apache Kafka could not be fetched, formatted or started; the message says why and,
    for missing jars, names :data:`FETCH_SCRIPT`."""


def kafka_jars_present() -> bool:
    """True when ``dev/kafka-lib/`` holds the broker jar of :data:`KAFKA_VERSION`."""
    return (KAFKA_LIB / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file()


def ensure_kafka_jars() -> None:
    """Run :data:`FETCH_SCRIPT` unless the jars are present (it is a no-op then, and takes a
    lock, so concurrent pytest workers fetch once).

    Raises:
        KafkaReferenceError: the jars are still missing (no Maven, Maven Central unreachable);
            the message holds the script's output and says to run it.
    """
    if kafka_jars_present():
        return
    proc = subprocess.run(["bash", str(FETCH_SCRIPT)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not kafka_jars_present():
        raise KafkaReferenceError(
            f"Apache Kafka {KAFKA_VERSION}'s jars are not in {KAFKA_LIB}: run {FETCH_SCRIPT.relative_to(REPO)} "
            f"(Maven fetches them from Maven Central; dev/setup.sh runs it). It exited {proc.returncode}:\n"
            f"{(proc.stdout + proc.stderr)[-3000:]}")


def java_command(main: str, *args: str, heap: str = "512m", log_level: str = "warn",
                 jvm_options: tuple[str, ...] = ()) -> list[str]:
    """The command line that runs class ``main`` of the jars in :data:`KAFKA_LIB` with ``args``
    (``java -Xmx<heap> ... -cp 'dev/kafka-lib/*' main args``); ``log_level`` is SLF4J's simple
    logger's default level (the tools and the broker log through it)."""
    return ["java", f"-Xmx{heap}", f"-Dorg.slf4j.simpleLogger.defaultLogLevel={log_level}",
            "-Djava.awt.headless=true", *jvm_options, "-cp", str(KAFKA_LIB / "*"), main, *args]


def tool_command(tool: str, *args: str, heap: str = "256m", jvm_options: tuple[str, ...] = FAST_START_JVM_OPTIONS) -> list[str]:
    """The command line of one of Kafka's tools (``org.apache.kafka.tools.<tool>`` of the
    kafka-tools jar: ``VerifiableProducer``, ``TransactionalMessageCopier``, ``TransactionsCommand``,
    ``ProducerPerformance``, ``EndToEndLatency``, ...), as Kafka's ``bin/kafka-run-class.sh``
    would start it, with the fast-starting JVM options by default (tests; a benchmark passes
    ``jvm_options=()``). Call :func:`ensure_kafka_jars` first."""
    return java_command(f"org.apache.kafka.tools.{tool}", *args, heap=heap, jvm_options=jvm_options)


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's
    ``Uuid.toString``), not starting with ``-`` (``Uuid.randomUuid`` avoids those too)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


class ApacheKafka:
    """One Apache Kafka KRaft node (broker and controller in one JVM) on 127.0.0.1.

    Args:
        settings: broker settings on top of :data:`SINGLE_NODE_SETTINGS`.
        heap: the JVM's ``-Xmx`` (default 512m).
        start_timeout_s: how long :meth:`start` waits for Metadata to name the broker.
        log_level: the broker's SLF4J level (``warn``; its log goes to :attr:`log_path`).
        jvm_options: more JVM options, for the storage tool and the broker (the tests' fixture
            starts faster with C1 only and the serial collector; a benchmark keeps the defaults).

    Attributes (after :meth:`start`):
        bootstrap: ``"127.0.0.1:PORT"`` for ``bootstrap.servers``.
        port, controller_port: the listeners' ports (chosen free, set explicitly).
        start_seconds: wall-clock seconds of :meth:`start` (format, JVM start, first Metadata,
            internal topics loaded).
        format_seconds: of those, the storage tool's format.
        ready_seconds: of those, until Metadata first named the broker.
        log_path: the broker's stdout and stderr.
    """

    def __init__(self, settings: dict[str, str] | None = None, heap: str = "512m",
                 start_timeout_s: float = 90.0, log_level: str = "warn", jvm_options: tuple[str, ...] = ()):
        self.settings = {**SINGLE_NODE_SETTINGS, **(settings or {})}
        self.heap = heap
        self.start_timeout_s = start_timeout_s
        self.log_level = log_level
        self.jvm_options = tuple(jvm_options)
        self.port = 0
        self.controller_port = 0
        self.start_seconds: float | None = None
        self.format_seconds: float | None = None
        self.ready_seconds: float | None = None
        self.dir: Path | None = None
        self._proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The broker JVM's process id (for its CPU time in /proc)."""
        assert self._proc is not None, "not started"
        return self._proc.pid

    @property
    def log_path(self) -> Path:
        assert self.dir is not None
        return self.dir / "broker.log"

    def _java(self, main: str, *args: str) -> list[str]:
        return java_command(main, *args, heap=self.heap, log_level=self.log_level, jvm_options=self.jvm_options)

    def _write_properties(self) -> Path:
        assert self.dir is not None
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "log.dirs": str(self.dir / "data"),
            **self.settings,
        }
        path = self.dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def start(self) -> "ApacheKafka":
        """Fetch the jars if needed, format a fresh log dir, start the node and wait for it.

        Raises:
            KafkaReferenceError: no jars (names :data:`FETCH_SCRIPT`), no ``java``, the format
                failed, or the broker exited or did not answer within ``start_timeout_s``
                (the message holds the tail of its log).
        """
        assert self._proc is None, "already started"
        ensure_kafka_jars()
        if shutil.which("java") is None:
            raise KafkaReferenceError("java is not on PATH: Apache Kafka needs a Java 17+ runtime")
        began = time.monotonic()
        self.dir = Path(tempfile.mkdtemp(prefix="txlake-apache-kafka-"))
        self.port, self.controller_port = _free_ports(2)
        properties = self._write_properties()
        fmt = subprocess.run(self._java("kafka.tools.StorageTool", "format", "--config", str(properties),
                                        "--cluster-id", _cluster_id(), "--standalone"),
                             capture_output=True, text=True, timeout=120)
        self.format_seconds = time.monotonic() - began
        if fmt.returncode != 0:
            raise KafkaReferenceError(f"kafka-storage format exited {fmt.returncode}:\n{(fmt.stdout + fmt.stderr)[-3000:]}")
        log = open(self.log_path, "wb")
        self._proc = subprocess.Popen(self._java("kafka.Kafka", str(properties)), stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        log.close()
        atexit.register(self.stop)
        try:
            self._wait_ready(began + self.start_timeout_s)
        except BaseException:
            self.stop(keep_dir=True)
            raise
        self.ready_seconds = time.monotonic() - began
        try:
            self._warm_up(began + self.start_timeout_s)
        except BaseException:
            self.stop(keep_dir=True)
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _warm_up(self, deadline: float) -> None:
        """Create and load the internal topics before a test needs them: a fresh Kafka creates
        ``__consumer_offsets`` at the first FindCoordinator and answers NOT_COORDINATOR /
        COORDINATOR_LOAD_IN_PROGRESS until it is loaded (librdkafka does not retry every call
        on those), and ``__transaction_state`` at the first InitProducerId."""
        from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "txlake-warm-up", "log_level": 0})
        try:
            while True:
                try:
                    consumer.committed([TopicPartition("__consumer_offsets", 0)], timeout=5)
                    break
                except KafkaException as e:
                    if time.monotonic() > deadline:
                        raise KafkaReferenceError(f"Apache Kafka's group coordinator did not load within "
                                                  f"{self.start_timeout_s} s: {e}; its log {self.log_path}") from e
                    time.sleep(0.1)
        finally:
            consumer.close()
        producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": "txlake-warm-up",
                             "log_level": 0})
        try:
            producer.init_transactions(max(1.0, deadline - time.monotonic()))
        except KafkaException as e:
            raise KafkaReferenceError(f"Apache Kafka's transaction coordinator did not load: {e}; "
                                      f"its log {self.log_path}") from e

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.connection.setup.timeout.ms": 1000,
                             "reconnect.backoff.max.ms": 200, "log_level": 0})
        while True:
            if self._proc.poll() is not None:
                raise KafkaReferenceError(f"Apache Kafka exited {self._proc.returncode} during start-up; "
                                          f"its log {self.log_path}:\n{self.log_text()[-4000:]}")
            try:
                if admin.list_topics(timeout=1.0).brokers:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise KafkaReferenceError(f"Apache Kafka did not answer Metadata on {self.bootstrap} within "
                                          f"{self.start_timeout_s} s; its log {self.log_path}:\n{self.log_text()[-4000:]}")
            time.sleep(0.1)

    def log_text(self) -> str:
        """The broker's log so far ('' before start)."""
        try:
            return self.log_path.read_text(errors="replace")
        except (OSError, AssertionError):
            return ""

    def stop(self, keep_dir: bool = False) -> None:
        """SIGKILL the node (its data is thrown away) and remove its dir; safe to call twice."""
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        if self.dir is not None and not keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "ApacheKafka":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":  # pragma: no cover - by hand
    with ApacheKafka() as kafka:
        print(f"Apache Kafka {KAFKA_VERSION} on {kafka.bootstrap} (started in {kafka.start_seconds:.1f} s, "
              f"format {kafka.format_seconds:.1f} s); log {kafka.log_path}; Ctrl-C stops it", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
