"""Kafka's own exactly-once proof against ``txlake serve`` (issue 18, "Kafka's own tools").

What Kafka's system test ``tests/kafkatest/tests/core/transactions_test.py`` does with a
hard broker bounce, on one txlake server: Kafka's ``VerifiableProducer`` (kafka-tools 4.3.1,
idempotent, acks=all) seeds an input topic of :data:`INPUT_PARTITIONS` partitions with the
integers ``0 .. SEED-1`` as values (no keys, as the system test); one
``TransactionalMessageCopier`` per input partition (``--use-group-metadata``,
``--enable-random-aborts``, transaction size :data:`TRANSACTION_SIZE`, transaction timeout
40 s as the system test) copies it to an output topic of :data:`OUTPUT_PARTITIONS`
partitions (the copier keeps the partition number), while the test SIGKILLs the server and
starts it again on the same root :data:`KILLS` times, each time once the copiers have copied
a further share of the input (:data:`KILL_AT`). A read_committed consumer (confluent-kafka)
reads the output during the copy, as the system test's concurrent consumer, and another
reads it after: each holds every input value exactly once, and output partition ``p`` is
input partition ``p`` in order (the system test's ``check_order``). The copiers (Kafka 4.3's Java
client) run transaction version 2 (KIP-890 part 2), which the server finalizes by default: the
epoch DescribeTransactions reports afterwards proves the per-transaction epoch bump.

Needs ``java`` and the jars of dev/kafka_reference.sh (fetched on first use, as the
``apache_kafka`` fixture does).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeTransactionsRequest, DescribeTransactionsResponse

from conftest import StorageTarget
from kafka_reference import ensure_kafka_jars, tool_command
from server_support import ServedRoot, decode_response, roundtrip

#: records VerifiableProducer writes (the system test's 100 000, scaled to the suite's budget)
SEED = 20_000
INPUT_PARTITIONS = 2
OUTPUT_PARTITIONS = 3
TRANSACTION_SIZE = 500
#: the share of the input copied (all copiers together) at which each SIGKILL comes
KILL_AT = (0.15, 0.35, 0.55)
KILLS = len(KILL_AT)
#: the copiers' transaction timeout (ms), as the system test's
TRANSACTION_TIMEOUT_MS = 40_000
#: how long the copy may take, with the restarts (the system test gives each copier 120 s)
COPY_TIMEOUT_S = 150.0
#: the server: commits every 50 ms; a SIGKILLed server's lease lapses after 4 s, so a restart
#: takes it over in about that (docs/server.md, "Start-up")
SETTINGS = {"group.initial.rebalance.delay.ms": 0, "storage.flush.interval.ms": 50, "storage.lease.ms": 4000,
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200}


@pytest.fixture
def served(tmp_path):
    """``txlake serve`` on a fresh file:// root with the topics ``input`` and ``output``."""
    ensure_kafka_jars()
    root = ServedRoot(StorageTarget(url=f"file://{tmp_path}/root", options={}, backend="file"), tmp_path,
                      SETTINGS).start()
    try:
        admin = AdminClient({"bootstrap.servers": root.bootstrap})
        topics = [NewTopic("input", INPUT_PARTITIONS, 1), NewTopic("output", OUTPUT_PARTITIONS, 1)]
        for future in admin.create_topics(topics).values():
            future.result(30)
        yield root
    finally:
        code = root.stop()
    assert code == 0, f"txlake serve exited {code}; log {root.log_path}:\n{root.log_text()[-3000:]}"


class Copier:
    """One TransactionalMessageCopier process; its JSON progress lines go to a file."""

    def __init__(self, bootstrap: str, partition: int, tmp: Path):
        self.out = tmp / f"copier-{partition}.out"
        self.err = tmp / f"copier-{partition}.err"
        args = ["--broker-list", bootstrap, "--input-topic", "input", "--input-partition", str(partition),
                "--output-topic", "output", "--transactional-id", f"copier-{partition}",
                "--consumer-group", "transactions-test-consumer-group", "--max-messages", "-1",
                "--transaction-size", str(TRANSACTION_SIZE), "--transaction-timeout", str(TRANSACTION_TIMEOUT_MS),
                "--use-group-metadata", "--enable-random-aborts"]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(tool_command("TransactionalMessageCopier", *args), stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL)

    def last(self) -> dict:
        """The copier's last complete progress line (``{}`` before the first)."""
        lines = [line for line in self.out.read_text(errors="replace").splitlines() if line.startswith("{")]
        for line in reversed(lines):
            try:
                return json.loads(line)
            except json.JSONDecodeError:  # the line being written
                continue
        return {}

    def copied(self) -> int:
        return int(self.last().get("totalProcessed", 0))

    def done(self) -> bool:
        return self.last().get("stage") == "ShutdownComplete"

    def describe(self) -> str:
        return f"copier exit {self.proc.poll()}, last {self.last()}; stderr {self.err}"


class CommittedReader(threading.Thread):
    """A read_committed consumer of every output partition from offset 0, on a thread: the
    values per partition in the order read, until :attr:`stop` is set and each partition holds
    ``want[p]`` values or the deadline passed, then one more read (the system test's concurrent
    consumer)."""

    def __init__(self, bootstrap: str):
        super().__init__(daemon=True)
        self.bootstrap = bootstrap
        self.want: dict[int, int] | None = None
        self.values: dict[int, list[bytes]] = {p: [] for p in range(OUTPUT_PARTITIONS)}
        self.stop = threading.Event()
        self.deadline = 0.0
        self.failure: BaseException | None = None

    def run(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "verifying-consumer",
                             "isolation.level": "read_committed", "enable.auto.commit": False,
                             "fetch.wait.max.ms": 100, "log_level": 0})
        try:
            consumer.assign([TopicPartition("output", p, 0) for p in range(OUTPUT_PARTITIONS)])
            while True:
                for msg in consumer.consume(1000, 0.2):
                    if msg.error() is None:
                        self.values[msg.partition()].append(msg.value())
                if self.stop.is_set() and (self.complete() or time.monotonic() > self.deadline):
                    # one more read, which must bring nothing (a duplicate would show here)
                    for msg in consumer.consume(1000, 0.5):
                        if msg.error() is None:
                            self.values[msg.partition()].append(msg.value())
                    return
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            self.failure = exc
        finally:
            consumer.close()

    def complete(self) -> bool:
        return self.want is not None and all(len(self.values[p]) >= n for p, n in self.want.items())

    def finish(self, want: dict[int, int], timeout_s: float = 60.0) -> dict[int, list[bytes]]:
        """Read until each partition ``p`` holds ``want[p]`` values (at most ``timeout_s``); the values."""
        self.want = want
        self.deadline = time.monotonic() + timeout_s
        self.stop.set()
        self.join(timeout_s + 30)
        assert not self.is_alive(), "the read_committed consumer did not stop"
        if self.failure is not None:
            raise self.failure
        return self.values


def read_input(bootstrap: str) -> dict[int, list[bytes]]:
    """Every value of each input partition, in offset order (the seed is not transactional)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "input-reader", "enable.auto.commit": False,
                         "log_level": 0})
    values: dict[int, list[bytes]] = {}
    try:
        for p in range(INPUT_PARTITIONS):
            _, high = consumer.get_watermark_offsets(TopicPartition("input", p), timeout=30)
            consumer.assign([TopicPartition("input", p, 0)])
            values[p] = []
            deadline = time.monotonic() + 60
            while len(values[p]) < high and time.monotonic() < deadline:
                values[p] += [m.value() for m in consumer.consume(1000, 0.5) if m.error() is None]
    finally:
        consumer.close()
    return values


def test_transactional_message_copier_with_the_server_sigkilled_copies_each_record_exactly_once(served, tmp_path):
    """VerifiableProducer seeds :data:`SEED` records; the copiers copy them while the server is
    SIGKILLed and restarted :data:`KILLS` times mid-copy; read_committed, during the copy and
    after it, the output holds each input value exactly once, in input order per partition."""
    seed = subprocess.run(tool_command("VerifiableProducer", "--topic", "input", "--max-messages", str(SEED),
                                       "--acks", "-1", "--bootstrap-server", served.bootstrap),
                          capture_output=True, text=True, timeout=120)
    assert seed.returncode == 0, seed.stderr[-3000:]
    tool_data = [json.loads(line) for line in seed.stdout.splitlines() if '"tool_data"' in line]
    assert [(d["sent"], d["acked"]) for d in tool_data] == [(SEED, SEED)]
    inputs = read_input(served.bootstrap)
    assert sorted(v for vs in inputs.values() for v in vs) == sorted(str(i).encode() for i in range(SEED))

    concurrent = CommittedReader(served.bootstrap)
    concurrent.start()
    copiers = [Copier(served.bootstrap, p, tmp_path) for p in range(INPUT_PARTITIONS)]
    deadline = time.monotonic() + COPY_TIMEOUT_S
    kills: list[int] = []
    try:
        for share in KILL_AT:
            while sum(c.copied() for c in copiers) < share * SEED:
                assert time.monotonic() < deadline, [c.describe() for c in copiers]
                assert all(c.proc.poll() is None for c in copiers), [c.describe() for c in copiers]
                time.sleep(0.05)
            copied = sum(c.copied() for c in copiers)
            # mid-copy: the kill lands while a copier is still copying
            assert copied < SEED and not all(c.done() for c in copiers), (share, [c.describe() for c in copiers])
            kills.append(copied)
            served.kill()
            served.start()
        for copier in copiers:
            copier.proc.wait(max(1.0, deadline - time.monotonic()))
    finally:
        for copier in copiers:
            if copier.proc.poll() is None:
                copier.proc.kill()
                copier.proc.wait()
    assert [c.proc.returncode for c in copiers] == [0] * INPUT_PARTITIONS, [c.describe() for c in copiers]
    assert [c.last().get("stage") for c in copiers] == ["ShutdownComplete"] * INPUT_PARTITIONS
    assert [c.copied() for c in copiers] == [len(inputs[p]) for p in range(INPUT_PARTITIONS)]
    assert len(kills) == KILLS and all(n < SEED for n in kills), kills

    expected = {p: inputs.get(p, []) for p in range(OUTPUT_PARTITIONS)}
    want = {p: len(values) for p, values in expected.items()}
    assert concurrent.finish(want) == expected
    final = CommittedReader(served.bootstrap)
    final.start()
    assert final.finish(want) == expected
    # the copiers ran transaction version 2 (KIP-890 part 2; the server finalizes it by default): every
    # EndTxn bumped the epoch, so it is at least the number of transactions; version 1 bumps it only
    # at InitProducerId
    described = decode_response(DescribeTransactionsResponse, roundtrip(served.port, DescribeTransactionsRequest[0](
        transactional_ids=[f"copier-{p}" for p in range(INPUT_PARTITIONS)]), 0), 0).transaction_states
    assert [(d.error_code, d.transaction_state) for d in described] == [(0, "CompleteCommit")] * INPUT_PARTITIONS
    assert all(d.producer_epoch >= len(inputs[p]) // TRANSACTION_SIZE for p, d in enumerate(described)), described
