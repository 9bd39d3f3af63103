"""``txlake transactions list|describe|describe-producers|find-hanging|abort`` (as
kafka-transactions.sh) on the demo's data: the flights topic and the exactly-once copier's
transactional id, whose first worker's open transaction was aborted by its successor."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from test_txn_admin import lose_transactional_id

from txlake import AdminClient, NewTopic, Producer, TopicPartition
from txlake.catalog.catalog import Catalog
from txlake.catalog.storage import ObjectStore
from txlake.cli import main
from txlake.copier import copy_exactly_once
from txlake.demo import COPIER_GROUP, COPIER_TARGET, COPIER_TXN_ID, TOPIC, run_demo
from txlake.engine.broker import Broker, BrokerConfig
from txlake.engine.registry import close_all

ROWS = 600


def table(output: str) -> list[list[str]]:
    """The cells of kafka-transactions.sh's layout: padded columns, each followed by a tab."""
    rows = []
    for line in output.splitlines():
        cells = line.split("\t")
        assert cells[-1] == "", f"every column ends with a tab: {line!r}"
        rows.append([c.rstrip() for c in cells[:-1]])
    return rows


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A demo root: flights loaded by ``run_demo``, then the copier's transactions in process --
    a worker's transaction left open (durable, undecided), aborted by the next worker's
    init_transactions, which copies every flight exactly once."""
    folder = tmp_path_factory.mktemp('demo')
    url = f"file://{folder}/root"
    conf = {"storage.url": url}
    assert run_demo(url, rows=ROWS, partitions=2, copier=False, spark=False, serve=False,
                    log_path=str(folder / "demo.log")).no_loss_no_duplicates
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(COPIER_TARGET, 4)])[COPIER_TARGET].result()
    killed = Producer({**conf, "transactional.id": COPIER_TXN_ID})
    killed.init_transactions(30)
    killed.begin_transaction()
    for i in range(5):
        killed.produce(COPIER_TARGET, value=b"killed %d" % i, partition=0)
    killed.flush(30)
    flights = sum(p.high_watermark for p in Catalog.open(ObjectStore(url)).state.topics[TOPIC].partitions)
    assert copy_exactly_once(conf, TOPIC, COPIER_TARGET, COPIER_GROUP, COPIER_TXN_ID, batch_records=250,
                             emit=lambda line: None) == flights
    killed.close()
    close_all()
    yield url
    close_all()


def run(url: str, *args: str, ok: bool = True):
    res = CliRunner().invoke(main, ["transactions", *args, "--storage", url])
    if ok:
        assert res.exit_code == 0, res.output + res.stderr
    return res


def test_reading_commands_on_the_demo(demo):
    with AdminClient({"storage.url": demo}) as admin:
        d = admin.describe_transactions([COPIER_TXN_ID])[COPIER_TXN_ID].result()
        by_partition = {p: admin.describe_producers([TopicPartition(COPIER_TARGET, p)])[TopicPartition(COPIER_TARGET, p)]
                        .result().active_producers for p in range(4)}
    lease_epoch = Catalog.open(ObjectStore(demo)).state.lease.epoch
    pid = d.producer_id
    # the successor's init_transactions fenced the first worker (epoch 1 aborted its transaction), then took epoch 2
    assert (d.state, d.producer_epoch, d.topic_partitions) == ("CompleteCommit", 2, [])

    assert table(run(demo, "list").output) == [["TransactionalId", "Coordinator", "ProducerId", "TransactionState"],
                                               [COPIER_TXN_ID, "0", str(pid), "CompleteCommit"]]
    assert table(run(demo, "list", "--duration-filter", "3600000").output) == \
        [["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]]
    assert table(run(demo, "list", "--transactional-id-pattern", COPIER_TXN_ID[:3] + ".*").output) == \
        [["TransactionalId", "Coordinator", "ProducerId", "TransactionState"], [COPIER_TXN_ID, "0", str(pid), "CompleteCommit"]]
    assert table(run(demo, "list", "--transactional-id-pattern", COPIER_TXN_ID[:3]).output) == \
        [["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]]
    bad = run(demo, "list", "--transactional-id-pattern", "(ab(cd", ok=False)
    assert bad.exit_code == 1 and "INVALID_REGULAR_EXPRESSION" in bad.stderr and "Traceback" not in bad.stderr

    described = table(run(demo, "describe", "--transactional-id", COPIER_TXN_ID).output)
    assert described[0] == ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                            "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                            "TopicPartitions"]
    row = described[1]
    assert row[:7] + row[8:] == ["0", COPIER_TXN_ID, str(pid), "2", "CompleteCommit", "60000",
                                 str(d.transaction_start_time_ms), ""]
    assert 0 <= int(row[7]) <= int(time.time() * 1000) - d.transaction_start_time_ms

    for partition, states in by_partition.items():
        out = table(run(demo, "describe-producers", "--topic", COPIER_TARGET, "--partition", str(partition)).output)
        assert out[0] == ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                          "CurrentTransactionStartOffset"]
        assert out[1:] == [[str(s.producer_id), str(s.producer_epoch), str(s.coordinator_epoch), str(s.last_sequence),
                            str(s.last_timestamp), "None"] for s in states]
        assert [(s.producer_id, s.producer_epoch, s.coordinator_epoch) for s in states] == [(pid, 2, lease_epoch)]

    header = ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
              "LastTimestamp", "Duration(min)"]
    assert table(run(demo, "find-hanging", "--topic", COPIER_TARGET).output) == [header]
    assert table(run(demo, "find-hanging", "--broker-id", "0", "--max-transaction-timeout", "0").output) == [header]
    assert table(run(demo, "find-hanging", "--broker-id", "1").output) == [header]


def test_errors_and_help(demo):
    missing = run(demo, "describe", "--transactional-id", "nope", ok=False)
    assert missing.exit_code == 1
    assert missing.stderr.startswith("Error: TRANSACTIONAL_ID_NOT_FOUND: Failed to describe transaction state of "
                                     "transactional-id `nope`: ")
    unknown = run(demo, "describe-producers", "--topic", COPIER_TARGET, "--partition", "9", ok=False)
    assert unknown.exit_code == 1 and unknown.stderr.startswith(
        f"Error: UNKNOWN_TOPIC_OR_PART: Failed to describe producers for partition {COPIER_TARGET}-9 on leader: ")
    scope = run(demo, "find-hanging", ok=False)
    assert scope.exit_code == 2 and "needs --topic or --broker-id" in scope.stderr
    assert run(demo, "find-hanging", "--partition", "0", "--broker-id", "0", ok=False).exit_code == 2
    unnamed = run(demo, "abort", "--topic", COPIER_TARGET, "--partition", "0", ok=False)
    assert unnamed.exit_code == 2 and "--start-offset" in unnamed.stderr
    no_epoch = run(demo, "abort", "--topic", COPIER_TARGET, "--partition", "0", "--producer-id", "1", ok=False)
    assert no_epoch.exit_code == 2 and "--producer-epoch" in no_epoch.stderr
    nothing = run(demo, "abort", "--topic", COPIER_TARGET, "--partition", "0", "--start-offset", "999", ok=False)
    assert nothing.exit_code == 1
    assert nothing.stderr == (f"Error: Could not find any open transactions starting at offset 999 on partition "
                              f"{COPIER_TARGET}-0\n")
    for command in ("list", "describe", "describe-producers", "find-hanging", "abort"):
        res = CliRunner().invoke(main, ["transactions", command, "--help"])
        assert res.exit_code == 0 and "--storage" in res.output


def test_find_and_abort_a_hanging_transaction_with_the_cli(demo):
    conf = {"storage.url": demo}
    stray = Producer({**conf, "transactional.id": "stray"})
    stray.init_transactions(30)
    stray.begin_transaction()
    stray.produce(COPIER_TARGET, value=b"s0", partition=3)
    stray.produce(COPIER_TARGET, value=b"s1", partition=3)
    stray.flush(30)
    with AdminClient(conf) as admin:
        pid = admin.describe_transactions(["stray"])["stray"].result().producer_id
    lose_transactional_id(stray, "stray")
    stray.close()
    close_all()
    store = ObjectStore(demo)
    p3 = Catalog.open(store).state.partition(COPIER_TARGET, 3)
    start = p3.high_watermark - 2
    assert p3.last_stable_offset == start

    # another process holds the writer lease: the reading commands still work, abort does not
    other = Broker(store, BrokerConfig(lease_ms=60_000))
    other.ensure_writer()
    try:
        assert [r[0] for r in table(run(demo, "list").output)[1:]] == [COPIER_TXN_ID]
        hanging = table(run(demo, "find-hanging", "--topic", COPIER_TARGET, "--max-transaction-timeout", "0").output)
        assert [r[:6] for r in hanging[1:]] == [[COPIER_TARGET, "3", str(pid), "0", "-1", str(start)]]
        assert hanging[1][7] == "0"  # minutes since the producer's last write
        assert table(run(demo, "find-hanging", "--topic", COPIER_TARGET, "--partition", "3").output)[1:] == []
        held = run(demo, "abort", "--topic", COPIER_TARGET, "--partition", "3", "--start-offset", str(start), ok=False)
        assert held.exit_code == 1 and held.stderr.startswith("Error: NOT_LEADER_OR_FOLLOWER: Failed to abort the "
                                                              f"transaction of producer {pid} (epoch 0) on "
                                                              f"{COPIER_TARGET}-3: ")
        assert "reading commands still work" in held.stderr
    finally:
        other.close()
        close_all()

    aborted = run(demo, "abort", "--topic", COPIER_TARGET, "--partition", "3", "--start-offset", str(start))
    end = start + 3  # two records and the marker
    assert aborted.output == (f"Aborted the transaction of producer {pid} (epoch 0, coordinator epoch 0) on "
                            f"{COPIER_TARGET}-3: LSO {end}, high watermark {end}.\n")
    p3 = Catalog.open(store).state.partition(COPIER_TARGET, 3)
    assert (p3.last_stable_offset, p3.high_watermark) == (end, end)
    assert [(a.producer_id, a.first_offset, a.last_offset) for a in p3.aborted_transactions][-1] == (pid, start, end - 1)
    assert table(run(demo, "find-hanging", "--broker-id", "0", "--max-transaction-timeout", "0").output)[1:] == []
    again = run(demo, "abort", "--topic", COPIER_TARGET, "--partition", "3", "--producer-id", str(pid),
                "--producer-epoch", "0", "--coordinator-epoch", "0")
    assert again.exit_code == 0  # a marker for a closed transaction closes nothing (as Kafka's)
    assert again.output.endswith(f"LSO {end + 1}, high watermark {end + 1}.\n")
    producers = table(run(demo, "describe-producers", "--topic", COPIER_TARGET, "--partition", "3").output)
    (stray_row,) = [r for r in producers[1:] if r[0] == str(pid)]
    assert (stray_row[1], stray_row[2], stray_row[5]) == ("0", "0", "None")  # epoch, marker's coordinator epoch, no txn
