"""``kafka-transactions.sh`` (Kafka 4.3.1's ``org.apache.kafka.tools.TransactionsCommand``)
against ``txlake serve`` (issue 18, "Kafka's own tools"): list, describe,
describe-producers, find-hanging and abort, with one live open transaction (a confluent-kafka
transactional producer) and one hanging transaction (its coordinator state lost, as
tests/test_txn_admin.py makes it: :func:`test_txn_admin.lose_transactional_id`), each
command's exit status and the fields of its table.

The tool prints tab-separated tables with a header row (Kafka's ``TransactionsCommand``
``prettyPrintTable``); :func:`table` reads them back as dicts.
"""

from __future__ import annotations

import subprocess
import time

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from conftest import StorageTarget
from kafka_reference import ensure_kafka_jars, tool_command
from server_support import ServedRoot
from test_txn_admin import MINUTE, TXN_CONF, describe, lose_transactional_id, now_ms
from txlake import AdminClient, NewTopic, Producer
from txlake.engine.registry import close_all

TOOL_TIMEOUT_S = 120


@pytest.fixture
def served(tmp_path):
    """``out`` (2 partitions) with a hanging transaction on ``out-0`` (producer of the lost id
    ``lost``, epoch 1, records ``h0 h1`` at offsets 0-1 written 20 minutes ago, then the
    committed ``after0`` at 2), then ``txlake serve`` on the root: ``(server, lost producer id)``."""
    ensure_kafka_jars()
    storage = StorageTarget(url=f"file://{tmp_path}/root", options={}, backend="file")
    conf = {**storage.conf(), **TXN_CONF}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("out", 2)])["out"].result()
    old = now_ms() - 20 * MINUTE
    Producer({**conf, "transactional.id": "lost"}).init_transactions(10)  # epoch 0, fenced by the next one
    lost = Producer({**conf, "transactional.id": "lost"})
    lost.init_transactions(10)                                           # epoch 1
    lost.begin_transaction()
    for value in (b"h0", b"h1"):
        lost.produce("out", value=value, partition=0, timestamp=old)
    lost.flush(10)
    with Producer(conf) as plain:
        plain.produce("out", value=b"after0", partition=0)
        plain.flush(10)
    with AdminClient(conf) as admin:
        lost_pid = describe(admin, "lost").producer_id
        lose_transactional_id(lost, "lost")
    lost.close()
    close_all()
    root = ServedRoot(storage, tmp_path, {"storage.flush.interval.ms": 50}).start()
    try:
        yield root, lost_pid
    finally:
        code = root.stop()
    assert code == 0, f"txlake serve exited {code}; log {root.log_path}:\n{root.log_text()[-3000:]}"


def transactions_command(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    """``kafka-transactions.sh --bootstrap-server BOOTSTRAP ARGS``: the finished process (text)."""
    return subprocess.run(tool_command("TransactionsCommand", "--bootstrap-server", bootstrap, *args),
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)


def table(proc: subprocess.CompletedProcess) -> list[dict[str, str]]:
    """The rows of the tool's table (exit status 0 asserted): header -> cell, both stripped."""
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    lines = [line.split("\t") for line in proc.stdout.splitlines() if line.strip()]
    header = [h.strip() for h in lines[0]]
    return [{h: cell.strip() for h, cell in zip(header, row)} for row in lines[1:]]


def read_committed(bootstrap: str, partition: int, last: bytes) -> list[bytes]:
    """The values a read_committed consumer gets from ``out-<partition>`` up to and including
    ``last`` (the partition's last record: a partition is delivered in offset order, so nothing
    before it can come after it), or all it got in 10 s."""
    consumer = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "reader", "isolation.level": "read_committed",
                              "enable.auto.commit": False, "log_level": 0})
    values: list[bytes] = []
    try:
        consumer.assign([KafkaTopicPartition("out", partition, 0)])
        deadline = time.monotonic() + 10
        while last not in values and time.monotonic() < deadline:
            values += [m.value() for m in consumer.consume(100, 0.2) if m.error() is None]
    finally:
        consumer.close()
    return values


def test_kafka_transactions_command_lists_describes_finds_and_aborts(served):
    server, lost_pid = served
    bootstrap = server.bootstrap
    live = KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": "live", "log_level": 0})
    live.init_transactions(30)
    live.begin_transaction()
    live.produce("out", value=b"l0", partition=1)
    assert live.flush(30) == 0
    try:
        listed = table(transactions_command(bootstrap, "list"))
        assert [(r["TransactionalId"], r["Coordinator"], r["TransactionState"]) for r in listed] == [
            ("live", "1", "Ongoing")]
        live_pid = listed[0]["ProducerId"]

        (described,) = table(transactions_command(bootstrap, "describe", "--transactional-id", "live"))
        assert {k: described[k] for k in ("CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
                                           "TransactionState", "TransactionTimeoutMs", "TopicPartitions")} == {
            "CoordinatorId": "1", "TransactionalId": "live", "ProducerId": live_pid, "ProducerEpoch": "0",
            "TransactionState": "Ongoing", "TransactionTimeoutMs": "60000", "TopicPartitions": "out-1"}
        assert int(described["CurrentTransactionStartTimeMs"]) > 0 and int(described["TransactionDurationMs"]) >= 0
        unknown = transactions_command(bootstrap, "describe", "--transactional-id", "lost")
        assert (unknown.returncode, unknown.stderr.strip()) == (1, (
            "Failed to describe transaction state of transactional-id `lost`: DescribeTransactions request for "
            "transactionalId `lost` failed because the ID could not be found. Enable debug logging for additional "
            "detail."))

        producers_0 = table(transactions_command(bootstrap, "describe-producers", "--topic", "out", "--partition", "0"))
        # the lost transaction's producer and the idempotent producer of "after0" (no transaction)
        assert sorted(r["CurrentTransactionStartOffset"] for r in producers_0) == ["0", "None"]
        (open_0,) = [r for r in producers_0 if r["ProducerId"] == str(lost_pid)]
        assert {k: open_0[k] for k in ("ProducerId", "ProducerEpoch", "LastSequence", "CurrentTransactionStartOffset")} == {
            "ProducerId": str(lost_pid), "ProducerEpoch": "1", "LastSequence": "1", "CurrentTransactionStartOffset": "0"}
        (open_1,) = table(transactions_command(bootstrap, "describe-producers", "--topic", "out", "--partition", "1"))
        assert (open_1["ProducerId"], open_1["CurrentTransactionStartOffset"]) == (live_pid, "0")

        # the live transaction is its coordinator's: only the lost one hangs (both started > 0 min ago)
        hanging = table(transactions_command(bootstrap, "find-hanging", "--broker-id", "1"))
        assert [(r["Topic"], r["Partition"], r["ProducerId"], r["ProducerEpoch"], r["StartOffset"]) for r in hanging] == [
            ("out", "0", str(lost_pid), "1", "0")]

        aborted = transactions_command(bootstrap, "abort", "--topic", "out", "--partition", "0", "--start-offset", "0")
        assert aborted.returncode == 0, aborted.stderr[-3000:]
        assert table(transactions_command(bootstrap, "find-hanging", "--broker-id", "1")) == []
        producers_0 = table(transactions_command(bootstrap, "describe-producers", "--topic", "out", "--partition", "0"))
        assert sorted((r["ProducerId"] == str(lost_pid), r["CurrentTransactionStartOffset"]) for r in producers_0) == [
            (False, "None"), (True, "None")]
        assert read_committed(bootstrap, 0, last=b"after0") == [b"after0"]   # the hanging records aborted, the LSO released
    finally:
        live.abort_transaction(30)
