"""Kafka 4.x's Java producer negotiates transaction version 2 (KIP-890 part 2) with ``txlake serve``.

Kafka's ``ProducerPerformance`` (kafka-tools 4.3.1) runs a transactional producer against the
server, once with the default ``transaction.version`` (2) and once with the server configured
at level 1. The Java client decides from ApiVersions' finalized ``transaction.version``
(``TransactionManager.isTransactionV2Enabled``): at 2 it sends EndTxn v5 and no
AddPartitionsToTxn (Produce v12 adds the partition), and every EndTxn bumps the epoch, so the
producer epoch DescribeTransactions reports after the run equals the number of EndTxn requests;
at 1 it keeps KIP-890 part 1 (AddPartitionsToTxn, EndTxn v4, the epoch stays 0). The request
versions are read from the client's own NetworkClient debug log ("Sending END_TXN request with
header RequestHeader(apiKey=END_TXN, apiVersion=5, ...)").

Needs ``java`` and the jars of dev/kafka_reference.sh (fetched on first use).
"""

from __future__ import annotations

import re
import subprocess

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.admin import DescribeTransactionsRequest, DescribeTransactionsResponse

from conftest import StorageTarget
from kafka_reference import ensure_kafka_jars, tool_command
from server_support import ServedRoot, decode_response, roundtrip

RECORDS = 400
#: the NetworkClient logs each request it sends, with its header, at debug level
DEBUG_REQUESTS = ("-Dorg.slf4j.simpleLogger.log.org.apache.kafka.clients.NetworkClient=debug",)
SENT = re.compile(r"Sending (\w+) request with header RequestHeader\(apiKey=\w+, apiVersion=(\d+)")


@pytest.fixture(params=[2, 1], ids=["tv2", "tv1"])
def served(request, tmp_path):
    """``txlake serve`` with ``transaction.version`` at the parameter, and a topic ``perf``."""
    ensure_kafka_jars()
    root = ServedRoot(StorageTarget(url=f"file://{tmp_path}/root", options={}, backend="file"), tmp_path,
                      {"storage.flush.interval.ms": 20, "transaction.version": request.param}).start()
    try:
        admin = AdminClient({"bootstrap.servers": root.bootstrap})
        for future in admin.create_topics([NewTopic("perf", 1, 1)]).values():
            future.result(30)
        yield root, request.param
    finally:
        code = root.stop()
    assert code == 0, f"txlake serve exited {code}; log {root.log_path}:\n{root.log_text()[-3000:]}"


def committed_values(bootstrap: str) -> int:
    """How many records a read_committed consumer reads from ``perf`` (until the end offset)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("perf", 0, 0)])
        count = 0
        for _ in range(100):
            batch = consumer.consume(1000, 0.3)
            count += sum(1 for m in batch if m.error() is None)
            if count >= RECORDS and not batch:
                break
        return count
    finally:
        consumer.close()


def test_java_producer_uses_transaction_version_2_when_the_server_finalizes_it(served, tmp_path):
    server, level = served
    err = tmp_path / "perf.err"
    command = tool_command("ProducerPerformance", "--topic", "perf", "--num-records", str(RECORDS),
                           "--record-size", "100", "--throughput", "2000", "--transactional-id", "perf-tx",
                           "--transaction-duration-ms", "40", "--producer-props",
                           f"bootstrap.servers={server.bootstrap}", "acks=all", "linger.ms=5",
                           jvm_options=DEBUG_REQUESTS)
    with open(err, "wb") as stderr:
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=stderr, timeout=120)
    log = err.read_text(errors="replace")
    assert proc.returncode == 0, log[-3000:]
    sent: dict[str, list[int]] = {}
    for api, version in SENT.findall(log):
        sent.setdefault(api, []).append(int(version))
    answer = decode_response(DescribeTransactionsResponse, roundtrip(
        server.port, DescribeTransactionsRequest[0](transactional_ids=["perf-tx"]), 0), 0).transaction_states[0]
    assert answer.error_code == 0 and answer.transaction_state == "CompleteCommit"
    end_txns = sent.get("END_TXN", [])
    assert len(end_txns) >= 2, sent.keys()
    if level == 2:
        assert set(end_txns) == {5} and set(sent["PRODUCE"]) == {12}
        assert "ADD_PARTITIONS_TO_TXN" not in sent     # the first Produce of each transaction adds the partition
        assert answer.producer_epoch == len(end_txns)  # InitProducerId gave 0; each EndTxn bumped it once
    else:
        assert set(end_txns) == {4} and set(sent["PRODUCE"]) == {11}
        assert sent["ADD_PARTITIONS_TO_TXN"]
        assert answer.producer_epoch == 0
    assert committed_values(server.bootstrap) == RECORDS


def test_librdkafka_keeps_part_1_against_a_server_finalizing_version_2(tmp_path):
    """librdkafka 2.16 does not implement KIP-890 part 2 (confluentinc/librdkafka#5423): against
    the default level it still adds partitions itself and sends EndTxn below v5, so its epoch
    stays 0 over three committed transactions, as against Apache Kafka 4.3.1."""
    from confluent_kafka import Producer

    root = ServedRoot(StorageTarget(url=f"file://{tmp_path}/root", options={}, backend="file"), tmp_path,
                      {"storage.flush.interval.ms": 20}).start()
    try:
        admin = AdminClient({"bootstrap.servers": root.bootstrap})
        for future in admin.create_topics([NewTopic("perf", 1, 1)]).values():
            future.result(30)
        producer = Producer({"bootstrap.servers": root.bootstrap, "transactional.id": "rd", "linger.ms": 5})
        producer.init_transactions(30)
        for i in range(3):
            producer.begin_transaction()
            producer.produce("perf", value=b"%d" % i, partition=0)
            producer.commit_transaction(30)
        answer = decode_response(DescribeTransactionsResponse, roundtrip(
            root.port, DescribeTransactionsRequest[0](transactional_ids=["rd"]), 0), 0).transaction_states[0]
        assert (answer.error_code, answer.transaction_state, answer.producer_epoch) == (0, "CompleteCommit", 0)
    finally:
        code = root.stop()
    assert code == 0, root.log_text()[-3000:]
