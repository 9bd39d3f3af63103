"""An abandoned transaction is finished by whichever process holds the writer lease (issue 14, defect 3).

Before the fix the transaction coordinator started only when a transactional client asked for it
(``init_transactions``): a writer process that exited with a transaction open -- cleanly or not --
left it Ongoing for good unless a transactional client came back, pinning the LSO, so everything
written after it stayed invisible to read_committed readers even while a plain producer kept
writing. Kafka's coordinator loads ``__transaction_state`` on election (``onElection``), finishes
what it finds in PrepareCommit/PrepareAbort and aborts Ongoing transactions past their timeout
every ``transaction.abort.timed.out.transaction.cleanup.interval.ms``; here the election is taking
the writer lease, whatever client took it.

Real processes (tests/helpers/txn_proc.py, the crash helpers of tests/test_txn_crash.py):

1. **Timed out.** A process opens a transaction (``transaction.timeout.ms`` 2000), writes records
   durably to both partitions of a topic and exits: cleanly (end of stdin: its engine is closed
   and the lease released), by ``os._exit(0)`` (nothing closed, the lease left to lapse), or by
   SIGKILL. A pure reader that reads after the timeout aborts nothing (it cannot: it does not
   hold the lease). Then a plain idempotent Producer in this process (no transactional id, and
   the default ``transaction.state.log.num.partitions``) becomes the writer and writes N records
   behind the open transaction; within the timeout + the abort interval its coordinator aborts
   the transaction under a bumped epoch: the ABORT marker lands at an exact offset, LSO == high
   watermark, the aborted-transaction index holds exactly (producer id, first offset, marker
   offset), and read_committed returns exactly the N records.
2. **Decided, not finished.** A process is SIGKILLed right after PrepareCommit/PrepareAbort is
   durable, before any marker. A plain idempotent Producer that becomes the writer completes it:
   markers with its coordinator epoch, CompleteCommit/CompleteAbort, LSO == high watermark.
"""

from __future__ import annotations

import signal
import time

import pytest

from helpers import client_conf, close_engines  # noqa: F401 (fixture)
from test_txn_crash import (TXN_PARTITIONS, View, consume, cross_process, txn_procs,  # noqa: F401 (fixture)
                            wait_for_lease_expiry)
from txlake import AdminClient, NewTopic, Producer
from txlake.catalog.catalog import Catalog
from txlake.catalog.topic_names import TRANSACTION_STATE_TOPIC
from txlake.engine.transaction_state_manager import partition_for
from txlake.formats import transaction_log

TIMEOUT_MS = 2000            # transaction.timeout.ms of the abandoned transaction
ABORT_INTERVAL_MS = 1000     # transaction.abort.timed.out.transaction.cleanup.interval.ms of the new writer
SLACK_S = 15.0               # generous slack past the deadline the abort is due by (shared 2-core machine)
PARTS = 2
TXN_PER_PARTITION = 3        # records of the abandoned transaction per partition: offsets 0..2
N = 200                      # idempotent records the new writer writes behind it (N / PARTS per partition)
PER_PARTITION = N // PARTS


def txn_start_ms(view: View, transactional_id: str) -> int:
    """``txn_start_timestamp`` (ms) of the last Ongoing record of ``transactional_id``."""
    key = transaction_log.encode_key(transactional_id)
    starts = [decoded.txn_start_timestamp
              for row in view.rows(TRANSACTION_STATE_TOPIC, partition_for(transactional_id, TXN_PARTITIONS))
              if not row["is_control"] and row["key"] == key
              for decoded in [transaction_log.decode_value(row["value"], "test")]
              if decoded is not None and decoded.state == "Ongoing"]
    return starts[-1]


def wait_until_stable(storage, topic: str, deadline: float, what: str, transactional_id: str) -> View:
    """Poll fresh views of the root until every partition of ``topic`` has LSO == high watermark
    and ``transactional_id``'s last state in the transaction log is Complete* (the coordinator
    appends CompleteCommit/CompleteAbort only after the markers are written, so it can lag the
    LSO); fail once ``deadline`` (``time.time()``) has passed."""
    while True:
        view = View(storage)
        offsets = view.offsets(topic)
        states = view.txn_log_states(transactional_id)
        if all(lso == hw for lso, hw in offsets.values()) and states and states[-1].startswith("Complete"):
            return view
        assert time.time() < deadline, f"{what}: (LSO, high watermark) still {offsets}, states {states[-2:]}"
        time.sleep(0.1)


def cached_metadata_matching_log(coordinator, transactional_id: str, log_state: str, deadline: float, what: str):
    """The coordinator's cached metadata of ``transactional_id`` once it has caught up with its
    log: no transition in progress and its state is ``log_state``, the last state durable in
    ``__transaction_state``; fail once ``deadline`` (``time.time()``) has passed.

    The cache lags the log by design (Kafka's ``TransactionStateManager`` completes a transition
    in the append callback, after the record is durable): ending a transaction commits
    PrepareCommit/PrepareAbort, the markers and CompleteCommit/CompleteAbort in one group commit,
    and only then does the ending thread apply PrepareAbort, then CompleteAbort, to the cache. A
    view of storage can thus show CompleteAbort while the cache still says Ongoing, the pending
    transition in progress."""
    while True:
        metadata = coordinator.state.get_transaction_state(transactional_id).transaction_metadata
        with metadata.lock:
            state, pending = metadata.state.state_name, metadata.pending_state
        if pending is None and state == log_state:
            return metadata
        assert time.time() < deadline, f"{what}: cached state {state} (pending {pending}), log state {log_state}"
        time.sleep(0.05)


def produce_idempotent(producer: Producer, topic: str) -> list[tuple[int, int, str]]:
    """Write N records ``i-<k>`` round robin over the partitions, flush, and return the delivery
    reports ``(partition, offset, value)`` (acks=all: durable)."""
    reports: list[tuple[int, int, str]] = []

    def on_delivery(err, msg) -> None:
        assert err is None, err
        reports.append((msg.partition(), msg.offset(), msg.value().decode()))

    for k in range(N):
        producer.produce(topic, value=f"i-{k}".encode(), partition=k % PARTS, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return sorted(reports)


# ----------------------------------------------------------------------------------------
# 1. An abandoned Ongoing transaction times out under a non-transactional writer.
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend,exit_how", [
    ("file", "close"), ("file", "os_exit"), ("file", "sigkill"),
    pytest.param("s3", "sigkill", marks=pytest.mark.s3),
], ids=["file-clean-exit", "file-os_exit", "file-SIGKILL", "s3-SIGKILL"])
def test_abandoned_transaction_times_out_under_a_plain_writer(storage, txn_procs, exit_how):
    dead = txn_procs(storage, {"storage.lease.ms": 1500}, {"transaction.timeout.ms": TIMEOUT_MS})
    dead.request("create_topic", "created", topic="out", partitions=PARTS)
    init = dead.request("init", "initialized", transactional_id="abandoned")
    pid, epoch = init["producer_id"], init["epoch"]
    dead.request("begin", "begun")
    ready = dead.request("produce", "produced", topic="out",
                         values=[f"t-{p}-{i}" for p in range(PARTS) for i in range(TXN_PER_PARTITION)],
                         partitions=[p for p in range(PARTS) for _ in range(TXN_PER_PARTITION)])
    assert ready["left"] == 0 and sorted(ready["reports"]) == [
        [p, i, f"t-{p}-{i}", None] for p in range(PARTS) for i in range(TXN_PER_PARTITION)]
    if exit_how == "close":
        dead.proc.stdin.close()  # end of stdin: interpreter exit closes the engine, the lease is released
        dead.wait_exit(expect=0)
    elif exit_how == "os_exit":
        dead.wait_event("exiting_now", dead.send("os_exit"))
        dead.wait_exit(expect=0)
    else:
        dead.kill()
    assert not dead.of("committed") and not dead.of("aborted")

    # The transaction is left open: it pins the LSO at its first offset on both partitions.
    view = View(storage)
    assert view.offsets("out") == {p: (0, TXN_PER_PARTITION) for p in range(PARTS)}
    assert view.txn_log_states("abandoned")[-1] == "Ongoing"
    timed_out_at = txn_start_ms(view, "abandoned") + TIMEOUT_MS
    lease_epoch = view.catalog.state.lease.epoch

    # A pure reader cannot abort it, not even past its timeout: it does not hold the writer lease.
    time.sleep(max(0.0, timed_out_at / 1000 + 0.1 - time.time()))
    assert consume(storage, "out", PARTS, "read_committed") == []
    view = View(storage)
    assert view.txn_log_states("abandoned")[-1] == "Ongoing"
    assert view.catalog.state.lease.epoch == lease_epoch
    if exit_how != "close":
        wait_for_lease_expiry(storage)  # no force: the next writer waits for the dead one's lease to lapse

    # A plain idempotent producer (no transactional id, default transaction.state.log.num.partitions)
    # becomes the writer and writes N records behind the open transaction.
    producer = Producer(client_conf(storage, {
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": ABORT_INTERVAL_MS}))
    try:
        became_writer = time.time()
        reports = produce_idempotent(producer, "out")
        assert reports == sorted((k % PARTS, TXN_PER_PARTITION + k // PARTS, f"i-{k}") for k in range(N))
        coordinator_epoch = producer._broker.lease.epoch
        assert coordinator_epoch > lease_epoch

        # Aborted by the writer's coordinator within the timeout + the abort interval (+ slack).
        due = max(timed_out_at / 1000, became_writer) + ABORT_INTERVAL_MS / 1000
        view = wait_until_stable(storage, "out", due + SLACK_S, "the abandoned transaction was not aborted",
                                 "abandoned")
        marker_at = TXN_PER_PARTITION + PER_PARTITION  # behind the N / PARTS idempotent records
        # the ABORT marker carries the bumped epoch (the abandoned producer is fenced) and this
        # writer's coordinator epoch
        assert view.markers("out", pid) == {p: [(marker_at, "ABORT", epoch + 1, coordinator_epoch)]
                                            for p in range(PARTS)}
        assert view.offsets("out") == {p: (marker_at + 1, marker_at + 1) for p in range(PARTS)}  # LSO == HW
        assert view.aborted_index("out") == {p: [(pid, 0, marker_at)] for p in range(PARTS)}
        states = view.txn_log_states("abandoned")
        assert states[-3:] == ["Ongoing", "PrepareAbort", "CompleteAbort"], states
        # the aborting thread applies the durable records to the coordinator's cache right after
        md = cached_metadata_matching_log(producer._broker.transaction_coordinator(), "abandoned", states[-1],
                                          time.time() + SLACK_S, "the coordinator's cache did not catch up")
        assert (md.state.state_name, md.producer_id, md.producer_epoch) == ("CompleteAbort", pid, epoch + 1)

        idempotent = [(k % PARTS, TXN_PER_PARTITION + k // PARTS, f"i-{k}") for k in range(N)]
        assert consume(storage, "out", PARTS, "read_committed") == sorted(idempotent)
        abandoned = [(p, i, f"t-{p}-{i}") for p in range(PARTS) for i in range(TXN_PER_PARTITION)]
        assert consume(storage, "out", PARTS, "read_uncommitted") == sorted(idempotent + abandoned)
    finally:
        producer.close()
    # a fresh reader process's view (the writer closed): the same records, nothing open
    assert consume(storage, "out", PARTS, "read_committed") == sorted(idempotent)
    assert all(lso == hw for lso, hw in View(storage).offsets("out").values())


# ----------------------------------------------------------------------------------------
# 2. PrepareCommit/PrepareAbort left by a crash is completed by a non-transactional writer.
# ----------------------------------------------------------------------------------------
@cross_process
@pytest.mark.parametrize("commit", [True, False], ids=["PrepareCommit", "PrepareAbort"])
def test_prepare_state_left_by_a_crash_is_completed_by_a_plain_writer(storage, txn_procs, commit):
    crasher = txn_procs(storage, {"storage.lease.ms": 60_000})
    crasher.request("create_topic", "created", topic="out", partitions=PARTS)
    crasher.request("create_topic", "created", topic="side", partitions=1)
    init = crasher.request("init", "initialized", transactional_id="crasher")
    pid, epoch = init["producer_id"], init["epoch"]
    crasher.request("begin", "begun")
    crasher.request("produce", "produced", topic="out",
                    values=[f"t-{p}-{i}" for p in range(PARTS) for i in range(TXN_PER_PARTITION)],
                    partitions=[p for p in range(PARTS) for _ in range(TXN_PER_PARTITION)])
    crasher.request("arm", "armed", point="after_prepare")
    crasher.wait_event("crashing", crasher.send("commit" if commit else "abort"))
    crasher.wait_exit(expect=-signal.SIGKILL)
    decided = "PrepareCommit" if commit else "PrepareAbort"
    view = View(storage)
    assert view.txn_log_states("crasher")[-1] == decided
    assert view.offsets("out") == {p: (0, TXN_PER_PARTITION) for p in range(PARTS)}
    assert view.markers("out", pid) == {p: [] for p in range(PARTS)}

    # A plain idempotent producer takes the lease (forced: the dead one's lease would last 60 s)
    # with a write to another topic; its coordinator completes the decided transaction.
    producer = Producer(client_conf(storage, {"storage.lease.force": True}))
    try:
        producer.produce("side", value=b"first", partition=0)
        assert producer.flush(30) == 0
        coordinator_epoch = producer._broker.lease.epoch
        view = wait_until_stable(storage, "out", time.time() + SLACK_S, f"{decided} was not completed",
                                 "crasher")
        kind = "COMMIT" if commit else "ABORT"
        marker_at = TXN_PER_PARTITION
        assert view.markers("out", pid) == {p: [(marker_at, kind, epoch, coordinator_epoch)] for p in range(PARTS)}
        assert view.txn_log_states("crasher")[-2:] == [decided, "CompleteCommit" if commit else "CompleteAbort"]
        assert view.aborted_index("out") == {p: ([] if commit else [(pid, 0, marker_at)]) for p in range(PARTS)}

        # records written behind it are visible at once
        reports = produce_idempotent(producer, "out")
        assert reports == sorted((k % PARTS, marker_at + 1 + k // PARTS, f"i-{k}") for k in range(N))
        view = View(storage)
        assert view.offsets("out") == {p: (marker_at + 1 + PER_PARTITION,) * 2 for p in range(PARTS)}
        transactional = [(p, i, f"t-{p}-{i}") for p in range(PARTS) for i in range(TXN_PER_PARTITION)]
        idempotent = [(k % PARTS, marker_at + 1 + k // PARTS, f"i-{k}") for k in range(N)]
        assert consume(storage, "out", PARTS, "read_committed") == sorted(
            (transactional if commit else []) + idempotent)
    finally:
        producer.close()


def test_the_coordinator_runs_in_any_writer_without_creating_its_topic(storage, close_engines):
    """Any writer runs the transaction coordinator, its timeout scheduler included, from the moment
    it takes the lease; where no transactional producer ever ran that costs no write:
    ``__transaction_state`` is not created (the first InitProducerId with a transactional id
    creates it). Closing the writer stops the scheduler."""
    conf = client_conf(storage, {"transaction.state.log.num.partitions": TXN_PARTITIONS})
    admin = AdminClient(conf)
    admin.create_topics([NewTopic("t", num_partitions=1)])["t"].result()
    producer = Producer(conf)
    producer.produce("t", value=b"x")
    assert producer.flush(30) == 0
    broker = producer._broker
    version = broker.catalog.version
    coordinator = broker.transaction_coordinator()  # the one the writer elected (it waits for its load)
    assert coordinator.coordinator_epoch == broker.lease.epoch
    assert coordinator.state.owned_partitions() == {p: broker.lease.epoch for p in range(TXN_PARTITIONS)}
    scheduler = coordinator._scheduler
    assert scheduler is not None and scheduler.is_alive()
    assert TRANSACTION_STATE_TOPIC not in Catalog.open(storage.object_store()).state.topics
    assert broker.catalog.version == version  # loading the coordinator committed nothing

    # the first transactional producer creates the topic
    txn = Producer({**conf, "transactional.id": "first"})
    txn.init_transactions(30)
    assert len(Catalog.open(storage.object_store()).state.topics[TRANSACTION_STATE_TOPIC].partitions) == TXN_PARTITIONS
    assert broker.transaction_coordinator() is coordinator
    txn.close()
    producer.close()
    admin.close()
    assert not scheduler.is_alive()
