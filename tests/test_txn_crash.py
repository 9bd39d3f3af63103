"""Transactions survive SIGKILL: real writer processes killed at every step (issue 3).

What is proved here, on file:// and s3:// (memory:// cannot cross processes), with
transactional writer processes (tests/helpers/txn_proc.py) killed by SIGKILL:

1. **Kill mid-transaction.** A copier commits transaction 1, writes transaction 2
   durably and is killed. A successor with the same transactional.id -- taking the
   writer lease only once the dead one's lease lapsed, no force -- runs
   init_transactions, which aborts transaction 2 under a bumped epoch, and commits
   transaction 3. read_committed sees transactions 1 and 3 only, read_uncommitted also
   the aborted records; LSO == high watermark; the aborted-transaction index names the
   killed producer's exact range; exact offsets, markers and the coordinator's log.
2. **Kill at each step of EndTxn**: right after PrepareCommit (no marker written),
   after the marker of the first partition only, after every marker but before
   CompleteCommit -- and after PrepareAbort, and after some ABORT markers. The crash
   point is a monkeypatch inside the dying process that SIGKILLs it at that exact point
   (the library has no test hooks). A new writer process (lease forced) starts the
   coordinator, which replays ``__transaction_state`` and finishes the job: the
   transaction is all-or-nothing across its 3 partitions, its coordinator state is
   CompleteCommit/CompleteAbort, LSO == high watermark. The state *before* recovery is
   asserted too (what a reader sees in between).

   Markers written twice: the recovering coordinator re-sends the markers to every
   partition of the transaction, including those that already have theirs, and the
   broker appends them again. Kafka does exactly the same (its new coordinator
   re-sends WriteTxnMarkers for a PrepareCommit/PrepareAbort it loads, and
   ``ProducerStateManager``/``appendEndTxnMarker`` accepts a second marker of the same
   epoch from a coordinator epoch not older than the last), so a partition holds 2
   markers for the transaction where the first had been written before the crash. The
   duplicate closes nothing (no transaction is open), adds no aborted-index entry and
   carries the newer coordinator epoch. The tests assert those exact counts. A writer
   that dies while completing (after re-writing one marker) is itself recovered by the
   next one.
3. **Repeated chaos.** A loop of transactions (k % 3 == 0 aborted, the others
   committed, values ``txn-<k>-<i>`` on 2 partitions) is SIGKILLed at random moments 4
   times -- mid-transaction, mid-commit, or while the restarted process is still
   recovering -- and restarted with the same transactional.id. Finally: every
   transaction is entirely visible or entirely invisible; every reported commit is
   visible; no aborted one is; no duplicates; per-partition order kept; the only
   visible transactions not reported committed were in flight at a kill with their
   commit requested; and the number of visible transactions equals the number of
   PrepareCommit decisions in ``__transaction_state`` -- so a transaction is visible
   exactly when its commit was decided.
4. **Regression**: adding a partition to a transaction while an earlier batch of it is
   being committed does not deadlock the producer (a bug these tests found).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from txlake import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from txlake.catalog.catalog import Catalog
from txlake.catalog.topic_names import TRANSACTION_STATE_TOPIC
from txlake.catalog.writer_lease import heartbeat_key
from txlake.engine.log_reader import LogReader
from txlake.engine.transaction_state_manager import partition_for
from txlake.formats import transaction_log
from txlake.formats.records import CONTROL_ABORT, CONTROL_COMMIT
from helpers import WriterProcess  # noqa: E402

HELPER = str(Path(__file__).resolve().parent / "helpers" / "txn_proc.py")
TXN_PARTITIONS = 3
#: extra config of the writer processes' transactional producers (Kafka's defaults otherwise)
PRODUCER_CONF: dict = {}

#: Cross-process tests: a storage root two processes can share.
cross_process = pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])


# ----------------------------------------------------------------------------------------
# The writer processes
# ----------------------------------------------------------------------------------------
class TxnProcess(WriterProcess):
    """A ``txn_proc.py`` subprocess: JSON commands on stdin, JSON events read by a thread."""

    script = HELPER
    dumps_stacks_on_sigusr1 = True

    def spec(self, storage, conf: dict | None, producer_conf: dict | None) -> dict:
        return super().spec(storage, {"transaction.state.log.num.partitions": TXN_PARTITIONS,
                                      "storage.flush.linger.ms": 1, **(conf or {})},
                            PRODUCER_CONF if producer_conf is None else producer_conf)

    def wait_event(self, name: str, start: int = 0, timeout: float = 60.0,
                   pred: Callable[[dict], bool] | None = None) -> dict:
        return super().wait_event(name, start, timeout, pred)

    def request(self, cmd: str, reply: str, timeout: float = 60.0, **fields: Any) -> dict:
        return self.wait_event(reply, self.send(cmd, **fields), timeout)

    def wait_exit(self, timeout: float = 60.0, expect: int | None = 0) -> int:
        return super().wait_exit(timeout, expect)


@pytest.fixture
def txn_procs():
    """Factory ``txn_procs(storage, conf) -> TxnProcess`` (starts at once: a test may start the
    successor while the current one runs). Teardown SIGKILLs every one still alive and closes
    the engines the test opened in-process (readers)."""
    started: list[TxnProcess] = []

    def start(storage, conf: dict | None = None, producer_conf: dict | None = None) -> TxnProcess:
        proc = TxnProcess(storage, conf or {}, producer_conf)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()
    from txlake.engine.registry import close_all

    close_all()


# ----------------------------------------------------------------------------------------
# Pure-reader views of the storage root (fresh catalog every time: nothing cached)
# ----------------------------------------------------------------------------------------
class View:
    """One fresh pure-reader view of the storage root's catalog (nothing cached from before)."""

    def __init__(self, storage):
        self.catalog = Catalog.open(storage.object_store())
        self.reader = LogReader(self.catalog)

    def partitions(self, topic: str) -> range:
        return range(len(self.catalog.state.topics[topic].partitions))

    def rows(self, topic: str, partition: int) -> list[dict]:
        """Every committed row of a partition (control records included), read_uncommitted."""
        ps = self.catalog.state.partition(topic, partition)
        table = self.reader.read(topic, partition, ps.log_start_offset, ps.high_watermark)
        return table.select(["offset", "key", "value", "producer_id", "producer_epoch", "is_control",
                             "control_type", "coordinator_epoch"]).to_pylist()

    def markers(self, topic: str, producer_id: int) -> dict[int, list[tuple[int, str, int, int]]]:
        """Per partition: ``(offset, "COMMIT"/"ABORT", producer epoch, coordinator epoch)`` of the
        control records of ``producer_id``."""
        names = {CONTROL_COMMIT: "COMMIT", CONTROL_ABORT: "ABORT"}
        return {p: [(r["offset"], names[r["control_type"]], r["producer_epoch"], r["coordinator_epoch"])
                    for r in self.rows(topic, p) if r["is_control"] and r["producer_id"] == producer_id]
                for p in self.partitions(topic)}

    def offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """Per partition ``(LSO, high watermark)`` as the catalog publishes them."""
        state = self.catalog.state
        return {p: (state.partition(topic, p).last_stable_offset, state.partition(topic, p).high_watermark)
                for p in self.partitions(topic)}

    def aborted_index(self, topic: str) -> dict[int, list[tuple[int, int, int]]]:
        """Per partition the aborted-transaction index: ``(producer_id, first_offset, last_offset)``."""
        return {p: [(a.producer_id, a.first_offset, a.last_offset)
                    for a in self.catalog.state.partition(topic, p).aborted_transactions]
                for p in self.partitions(topic)}

    def txn_log_states(self, transactional_id: str) -> list[str]:
        """The states ``transactional_id`` went through, as written to its ``__transaction_state``
        partition (Kafka's ``abs(hashCode) % transaction.state.log.num.partitions``)."""
        key = transaction_log.encode_key(transactional_id)
        states = []
        for row in self.rows(TRANSACTION_STATE_TOPIC, partition_for(transactional_id, TXN_PARTITIONS)):
            if not row["is_control"] and row["key"] == key:
                decoded = transaction_log.decode_value(row["value"], "test")
                states.append("tombstone" if decoded is None else decoded.state)
        return states


def consume(storage, topic: str, partitions: int, isolation: str) -> list[tuple[int, int, str]]:
    """``(partition, offset, value)`` of everything a Consumer with ``isolation`` returns, read
    until every partition reports EOF (at the LSO for read_committed, the HW otherwise)."""
    consumer = Consumer({"storage.url": storage.url, "storage.options": dict(storage.options),
                         "group.id": "checker", "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.partition.eof": True})
    try:
        consumer.list_topics()  # the process's reader engine catches up with the writers' commits
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        out: list[tuple[int, int, str]] = []
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while len(eof) < partitions:
            assert time.monotonic() < deadline, f"no EOF on every partition of {topic} within 30 s ({eof})"
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error() is not None:
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    eof.add(msg.partition())
                    continue
                out.append((msg.partition(), msg.offset(), msg.value().decode()))
        return sorted(out)
    finally:
        consumer.close()


def watermarks(storage, topic: str, partitions: int, isolation: str) -> dict[int, tuple[int, int]]:
    consumer = Consumer({"storage.url": storage.url, "storage.options": dict(storage.options),
                         "group.id": "checker", "isolation.level": isolation})
    try:
        consumer.list_topics()
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        consumer.close()


def wait_for_lease_expiry(storage, timeout: float = 30.0) -> None:
    """Wait until the current writer lease has lapsed by its last heartbeat (+ a margin)."""
    cat = Catalog.open(storage.object_store())
    lease = cat.state.lease
    beat = cat.store.get_or_none(heartbeat_key(lease.epoch))
    renewed = max(lease.acquired_ms, json.loads(beat)["renewed_at_ms"] if beat else 0)
    wait = (renewed + lease.lease_ms) / 1000 + 0.2 - time.time()
    assert wait < timeout, f"the lease would only lapse in {wait:.1f} s"
    if wait > 0:
        time.sleep(wait)


# ----------------------------------------------------------------------------------------
# 1. Kill mid-transaction; the successor's init_transactions aborts the leftover.
# ----------------------------------------------------------------------------------------
@cross_process
def test_kill_mid_transaction_successor_aborts_it(storage, txn_procs):
    lease = {"storage.lease.ms": 1500}  # the successor waits for the lease to lapse: no force
    copier = txn_procs(storage, lease)
    successor = txn_procs(storage, lease)  # imports while the copier works
    copier.request("create_topic", "created", topic="copy", partitions=1)
    first = copier.request("init", "initialized", transactional_id="copier")
    pid = first["producer_id"]
    copier.request("begin", "begun")
    copier.request("produce", "produced", topic="copy", values=[f"c{i}" for i in range(10)])
    copier.request("commit", "committed")
    copier.request("begin", "begun")
    ready = copier.request("produce", "produced", topic="copy", values=[f"o{i}" for i in range(10)])
    # the records of transaction 2 are durable (acks=all delivery reports) before the kill
    assert ready["left"] == 0 and ready["reports"] == [[0, 11 + i, f"o{i}", None] for i in range(10)]
    copier.kill()

    # In between: transaction 2 is open in the log, pinning the LSO at its first offset.
    view = View(storage)
    assert view.offsets("copy") == {0: (11, 21)}
    assert view.txn_log_states("copier")[-1] == "Ongoing"
    assert consume(storage, "copy", 1, "read_committed") == [(0, i, f"c{i}") for i in range(10)]

    wait_for_lease_expiry(storage)
    second = successor.request("init", "initialized", transactional_id="copier")
    # InitProducerId while Ongoing: fence (epoch + 1) and abort, then bump again on the retry
    assert (second["producer_id"], second["epoch"]) == (pid, first["epoch"] + 2)
    successor.request("begin", "begun")
    successor.request("produce", "produced", topic="copy", values=[f"n{i}" for i in range(5)])
    successor.request("commit", "committed")
    successor.request("close", "closed")

    committed = [(0, i, f"c{i}") for i in range(10)] + [(0, 22 + i, f"n{i}") for i in range(5)]
    assert consume(storage, "copy", 1, "read_committed") == committed
    assert consume(storage, "copy", 1, "read_uncommitted") == sorted(
        committed + [(0, 11 + i, f"o{i}") for i in range(10)])
    view = View(storage)
    assert view.offsets("copy") == {0: (28, 28)}  # LSO == high watermark
    assert watermarks(storage, "copy", 1, "read_committed") == {0: (0, 28)}
    # the aborted-transaction index names the killed producer's range: o0 .. its ABORT marker
    assert view.aborted_index("copy") == {0: [(pid, 11, 21)]}
    (marks,) = view.markers("copy", pid).values()
    assert [(o, kind, epoch) for o, kind, epoch, _ in marks] == [
        (10, "COMMIT", first["epoch"]), (21, "ABORT", first["epoch"] + 1), (27, "COMMIT", first["epoch"] + 2)]
    assert marks[0][3] < marks[1][3] == marks[2][3]  # the successor's coordinator epoch is newer
    assert view.txn_log_states("copier") == [
        "Empty", "Ongoing", "PrepareCommit", "CompleteCommit", "Ongoing",      # the copier
        "PrepareAbort", "CompleteAbort", "Empty", "Ongoing", "PrepareCommit", "CompleteCommit"]  # successor


# ----------------------------------------------------------------------------------------
# 2. Kill at each step of EndTxn; a new writer's coordinator completes it.
# ----------------------------------------------------------------------------------------
PARTS = 3
PER_PARTITION = 3


@cross_process
@pytest.mark.parametrize("point,commit", [
    ("after_prepare", True),
    ("after_first_marker", True),
    ("before_complete", True),
    ("after_prepare", False),
    ("after_first_marker", False),
], ids=["after-PrepareCommit", "after-some-markers", "before-CompleteCommit", "after-PrepareAbort",
        "after-some-abort-markers"])
def test_kill_at_each_step_of_end_txn(storage, txn_procs, point, commit):
    crasher = txn_procs(storage, {"storage.lease.ms": 60_000})
    recoverer = txn_procs(storage, {"storage.lease.force": True})  # the crasher's lease never lapses here
    crasher.request("create_topic", "created", topic="out", partitions=PARTS)
    init = crasher.request("init", "initialized", transactional_id="crasher")
    pid, epoch = init["producer_id"], init["epoch"]
    crasher.request("begin", "begun")
    values = [f"v-{p}-{i}" for p in range(PARTS) for i in range(PER_PARTITION)]
    crasher.request("produce", "produced", topic="out", values=values,
                    partitions=[p for p in range(PARTS) for _ in range(PER_PARTITION)])
    crasher.request("arm", "armed", point=point)
    at = crasher.send("commit" if commit else "abort")
    crash = crasher.wait_event("crashing", at)
    crasher.wait_exit(expect=-signal.SIGKILL)
    assert not crasher.of("committed") and not crasher.of("aborted")

    kind = "COMMIT" if commit else "ABORT"
    decided = "PrepareCommit" if commit else "PrepareAbort"
    records = [(p, i, f"v-{p}-{i}") for p in range(PARTS) for i in range(PER_PARTITION)]
    marker_at = PER_PARTITION  # each partition: 3 records of the transaction, then its marker(s)

    # ---- the state the crash left: decided in __transaction_state, markers as far as they got
    # (one Ongoing record per AddPartitionsToTxn; the client adds, in one request, every
    # partition that got its first record while the previous request was out: 1 to PARTS requests)
    view = View(storage)
    states = view.txn_log_states("crasher")
    begun = states[:-1]
    assert begun == ["Empty"] + ["Ongoing"] * (len(begun) - 1) and 1 <= len(begun) - 1 <= PARTS, states
    assert states[-1] == decided
    written = {"after_prepare": set(), "after_first_marker": {0}, "before_complete": set(range(PARTS))}[point]
    if point == "after_first_marker":
        assert crash["written"] == [["out", 0, "NO_ERROR"]]
    before = view.markers("out", pid)
    assert {p for p, m in before.items() if m} == written
    assert view.offsets("out") == {p: ((marker_at + 1, marker_at + 1) if p in written else (0, marker_at))
                                   for p in range(PARTS)}
    # a reader in between sees the partitions whose marker is written: transiently partial,
    # exactly as a Kafka consumer may before the coordinator has written every marker
    assert consume(storage, "out", PARTS, "read_committed") == (
        [r for r in records if r[0] in written] if commit else [])

    # ---- a new writer starts the coordinator: it replays the log and completes the transaction
    recovered = recoverer.request("recover", "recovered", transactional_ids=["crasher"])
    state = recovered["states"]["crasher"]
    assert state["state"] == ("CompleteCommit" if commit else "CompleteAbort") and not state["pending"]
    assert (state["producer_id"], state["epoch"]) == (pid, epoch)
    assert state["partitions"] == []  # as in Kafka, a completed transaction keeps no partitions
    recoverer.request("close", "closed")

    view = View(storage)
    assert view.txn_log_states("crasher") == begun + [decided, "CompleteCommit" if commit else "CompleteAbort"]
    # all or nothing, on every partition
    assert consume(storage, "out", PARTS, "read_committed") == (records if commit else [])
    assert consume(storage, "out", PARTS, "read_uncommitted") == records
    after = view.markers("out", pid)
    for p in range(PARTS):
        # one marker per partition from the crashed coordinator where it got that far, and one
        # from the recovering coordinator on every partition (Kafka re-sends them all as well)
        expected = ([marker_at] if p in written else []) + [marker_at + (1 if p in written else 0)]
        assert [(o, k, e) for o, k, e, _ in after[p]] == [(o, kind, epoch) for o in expected], after
        coordinator_epochs = [c for *_, c in after[p]]
        assert coordinator_epochs == sorted(set(coordinator_epochs)), "the re-sent marker has a newer coordinator epoch"
        assert after[p][:len(before[p])] == before[p]  # nothing written before the crash changed
        assert after[p][-1][3] == state["coordinator_epoch"]  # the recovering coordinator wrote the last
    end = {p: marker_at + (2 if p in written else 1) for p in range(PARTS)}
    assert view.offsets("out") == {p: (hw, hw) for p, hw in end.items()}  # LSO == high watermark
    assert watermarks(storage, "out", PARTS, "read_committed") == {p: (0, hw) for p, hw in end.items()}
    # aborted: exactly one index entry per partition (a duplicate ABORT marker closes nothing)
    assert view.aborted_index("out") == {p: ([] if commit else [(pid, 0, marker_at)]) for p in range(PARTS)}


@cross_process
def test_kill_during_recovery_then_recover_again(storage, txn_procs):
    """The writer that completes a PrepareCommit dies too, after re-writing one marker; the
    next one completes the transaction. Each coordinator's markers carry its own epoch."""
    crasher = txn_procs(storage, {"storage.lease.ms": 60_000})
    first_recoverer = txn_procs(storage, {"storage.lease.force": True})
    crasher.request("create_topic", "created", topic="out", partitions=PARTS)
    pid = crasher.request("init", "initialized", transactional_id="crasher")["producer_id"]
    crasher.request("begin", "begun")
    values = [f"v-{p}" for p in range(PARTS)]
    crasher.request("produce", "produced", topic="out", values=values, partitions=list(range(PARTS)))
    crasher.request("arm", "armed", point="after_prepare")
    crasher.wait_event("crashing", crasher.send("commit"))
    crasher.wait_exit(expect=-signal.SIGKILL)
    second_recoverer = txn_procs(storage, {"storage.lease.force": True})

    first_recoverer.request("arm", "armed", point="after_first_marker")
    first_recoverer.wait_event("crashing", first_recoverer.send("recover", transactional_ids=["crasher"]))
    first_recoverer.wait_exit(expect=-signal.SIGKILL)
    view = View(storage)
    assert [len(m) for m in view.markers("out", pid).values()] == [1] + [0] * (PARTS - 1)
    assert view.txn_log_states("crasher")[-1] == "PrepareCommit"

    state = second_recoverer.request("recover", "recovered", transactional_ids=["crasher"])["states"]["crasher"]
    assert state["state"] == "CompleteCommit"
    second_recoverer.request("close", "closed")
    assert consume(storage, "out", PARTS, "read_committed") == [(p, 0, f"v-{p}") for p in range(PARTS)]
    view = View(storage)
    marks = view.markers("out", pid)
    assert [[(o, k) for o, k, _, _ in marks[p]] for p in range(PARTS)] == \
        [[(1, "COMMIT"), (2, "COMMIT")]] + [[(1, "COMMIT")]] * (PARTS - 1)
    first_epoch = marks[0][0][3]
    assert first_epoch < state["coordinator_epoch"]
    assert [m[-1][3] for m in marks.values()] == [state["coordinator_epoch"]] * PARTS
    assert view.offsets("out") == {0: (3, 3), **{p: (2, 2) for p in range(1, PARTS)}}
    assert view.txn_log_states("crasher")[-2:] == ["PrepareCommit", "CompleteCommit"]


# ----------------------------------------------------------------------------------------
# 3. Repeated chaos: a transaction loop SIGKILLed at random moments, restarted each time.
# ----------------------------------------------------------------------------------------
CHAOS_KILLS = 4
CHAOS_RECORDS = 4
CHAOS_PARTITIONS = 2
CHAOS_FINAL_TXNS = 3


@cross_process
def test_repeated_sigkill_of_a_transaction_loop(storage, txn_procs):
    seed = int(os.environ.get("TXLAKE_CHAOS_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    runs: list[TxnProcess] = []
    killed_in_flight: list[int] = []
    kill_points: list[str] = []  # the last line each killed process printed
    start = 0
    nxt = txn_procs(storage, {"storage.lease.force": True})
    nxt.request("create_topic", "created", topic="chaos", partitions=CHAOS_PARTITIONS)
    for run in range(CHAOS_KILLS + 1):
        proc, final = nxt, run == CHAOS_KILLS
        runs.append(proc)
        at = proc.send("chaos", transactional_id="chaos", topic="chaos", start=start, records=CHAOS_RECORDS,
                       partitions=CHAOS_PARTITIONS, count=CHAOS_FINAL_TXNS if final else None)
        if not final:
            nxt = txn_procs(storage, {"storage.lease.force": True})  # imports meanwhile
        if final:
            proc.wait_event("chaos_done", at)
            proc.request("close", "closed")
            break
        if run == 2:
            # kill while the restarted process may still be recovering (InitProducerId
            # completing or aborting what the previous one left)
            time.sleep(rng.uniform(0.0, 0.4))
        else:
            proc.wait_event("begin", at, pred=lambda e: e["k"] == start)
            time.sleep(rng.uniform(0.0, 0.6))
        proc.kill()
        last = proc.events[at:]
        kill_points.append(f"{last[-1]['event']} {last[-1].get('k', '')}".strip() if last else "before start")
        begun = [e["k"] for e in proc.events[at:] if e["event"] == "begin"]
        ended = {e["k"] for e in proc.events[at:] if e["event"] in ("committed", "aborted")}
        if begun and begun[-1] not in ended:
            killed_in_flight.append(begun[-1])
        start = begun[-1] + 1 if begun else start

    def ks(name: str) -> set[int]:
        return {e["k"] for p in runs for e in p.of(name)}

    began, committed, aborted, committing = ks("begin"), ks("committed"), ks("aborted"), ks("committing")
    why = (f"seed {seed}: began {sorted(began)}, committed {sorted(committed)}, aborted {sorted(aborted)}, "
           f"in flight at kills {killed_in_flight}, killed after {kill_points}")
    assert committed, why
    inits = [(e["producer_id"], e["epoch"]) for p in runs for e in p.of("initialized")]
    assert len({pid for pid, _ in inits}) == 1, f"{inits}: {why}"  # one producer id, its epoch bumped each time
    assert [e for _, e in inits] == sorted({e for _, e in inits}), f"{inits}: {why}"
    assert not committed & aborted and all(k % 3 != 0 for k in committed) and all(k % 3 == 0 for k in aborted)

    visible_rows = consume(storage, "chaos", CHAOS_PARTITIONS, "read_committed")
    values = [v for _, _, v in visible_rows]
    assert len(values) == len(set(values)), f"duplicates: {why}"
    visible: dict[int, set[int]] = {}
    for p, _, v in visible_rows:
        _, k, i = v.split("-")
        assert int(i) % CHAOS_PARTITIONS == p
        visible.setdefault(int(k), set()).add(int(i))
    for k, got in visible.items():
        assert got == set(range(CHAOS_RECORDS)), f"transaction {k} is partly visible ({sorted(got)}): {why}"
    assert committed <= visible.keys(), f"reported commits missing: {sorted(committed - visible.keys())}: {why}"
    assert not {k for k in visible if k % 3 == 0}, f"an aborted transaction is visible: {why}"
    surprise = visible.keys() - committed
    assert surprise <= set(killed_in_flight) & committing, \
        f"visible but neither reported committed nor in flight with its commit requested: {sorted(surprise)}: {why}"
    # per partition, committed records keep the order they were produced in
    for p in range(CHAOS_PARTITIONS):
        seq = [tuple(int(x) for x in v.split("-")[1:]) for q, _, v in visible_rows if q == p]
        assert seq == sorted(seq), why
    # exactly the decided commits are visible: one PrepareCommit per visible transaction
    view = View(storage)
    states = view.txn_log_states("chaos")
    assert states.count("PrepareCommit") == len(visible), f"{states}: {why}"
    assert states[-1] == ("CompleteAbort" if (start + CHAOS_FINAL_TXNS - 1) % 3 == 0 else "CompleteCommit"), why
    # every other record in the log belongs to a transaction that was not committed
    everything = consume(storage, "chaos", CHAOS_PARTITIONS, "read_uncommitted")
    hidden = {int(v.split("-")[1]) for _, _, v in everything} - visible.keys()
    assert not hidden & committed and hidden <= began, why
    # ... and the aborted-transaction index covers exactly those records
    index = view.aborted_index("chaos")
    assert {pid for entries in index.values() for pid, _, _ in entries} <= {inits[0][0]}, why
    for p in range(CHAOS_PARTITIONS):
        covered = {o for q, o, _ in everything if q == p and any(a <= o <= b for _, a, b in index[p])}
        assert covered == {o for q, o, v in everything if q == p and int(v.split("-")[1]) in hidden}, why
    assert all(lso == hw for lso, hw in view.offsets("chaos").values()), why
    print(f"chaos: {why}; visible {sorted(visible)}")


# ----------------------------------------------------------------------------------------
# Regression: a bug these tests found (deadlock adding a partition while a batch commits)
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["file"])
def test_adding_a_partition_while_a_batch_commits_does_not_deadlock(storage, txn_procs):
    """Producer.produce() once called the blocking AddPartitionsToTxn (it waits for a
    ``__transaction_state`` commit) while holding the producer's lock, which the committing
    thread needs to deliver the reports of the flush before it: a multi-partition
    transaction whose first batch was in flight when it added a partition hung for ever
    (on s3:// nearly always). Here the first batch's commit is held 0.5 s while the
    producer adds partition 1 -- deterministic -- in a process the test can kill."""
    proc = txn_procs(storage, {"storage.lease.ms": 60_000}, producer_conf={"linger.ms": 0})
    proc.request("create_topic", "created", topic="out", partitions=2)
    proc.request("init", "initialized", transactional_id="adder")
    proc.request("begin", "begun")
    at = proc.send("produce_during_commit", topic="out")
    proc.wait_event("committing_first", at, timeout=10)
    # both produce() calls return within milliseconds of the 0.5 s commit; deadlocked, never
    proc.wait_event("produced_both", at, timeout=5)
    proc.request("commit", "committed", timeout=10)
    assert consume(storage, "out", 2, "read_committed") == [(0, 0, "first"), (1, 0, "second")]
