"""Differential tests under a process fault: the broker SIGSTOPped while a confluent-kafka
transactional producer has a record in flight, against Apache Kafka 4.3.1 (the
``apache_kafka`` fixture) and against ``txlake serve``; the outcomes must be equal but for the
one documented difference (:data:`DOCUMENTED`).

:func:`purged_sequence_scenario` is the lost write ``txlake verify --serve --process-faults
server-stop`` found (seed 4, issue 20; docs/reliability.md, "Anomalies that are the
client's"): librdkafka's ``abort_transaction`` purges a record whose ProduceRequest timed out
(outcome unknown: the broker may have appended it) as if it had never been sent and gives its
sequence number to the next record of the same producer id and epoch (it advances the
partition's epoch base msgid: ``rd_kafka_toppar_purge_queues``, ``ADVBASE``; no epoch bump).
Apache Kafka answers that record as a duplicate of the purged one -- NO_ERROR with the purged
record's offset (``ProducerStateEntry.findDuplicateBatch``; the abort marker keeps the epoch's
batch metadata) -- so a committed transaction's record is acknowledged and never written.
txlake answers OUT_OF_ORDER_SEQUENCE_NUMBER instead (the retained batch belongs to a
transaction that has ended, so the record cannot be its retry), which librdkafka raises as
fatal: the application sees the error and nothing is lost silently.
:func:`recreated_producer_scenario` is the application's way out on both brokers: a new
producer instance after such an abort (``init_transactions`` bumps the epoch) loses nothing.
:func:`purged_pair_then_batch_scenario`: when the reused sequences do not line up with a
retained batch, both brokers answer OUT_OF_ORDER_SEQUENCE_NUMBER (fatal in librdkafka; no loss).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from differential import CALL_TIMEOUT_S, PairedOutcomes, Run, outcome
from test_differential_txn import _deliver, _describe_producers, _end, _snapshot, _wait_for_state, _without_documented
from test_differential_txn import txlake_server  # noqa: F401 (module fixture: txlake serve configured as the reference)

#: the clients' request timeout (ms): a ProduceRequest to a stopped broker times out after it
REQUEST_TIMEOUT_MS = 2000
#: after abort_transaction began (and purged the queue, which it does first), how long the broker
#: stays stopped before SIGCONT (s)
RESUME_AFTER_S = 1.0


def _stopped_send(run: Run, pid: int, producer, records: list, timed_out: list[str]) -> dict[str, Any]:
    """Produce ``records`` (``(logical topic, partition, value)``) while broker ``pid`` is
    SIGSTOPped, poll until librdkafka logs that their ProduceRequest timed out (retried later:
    ``MsgPossiblyPersisted``), then abort the transaction with the broker resumed
    :data:`RESUME_AFTER_S` into the call: the records' delivery reports and the abort's outcome."""
    reports: list[Any] = [None] * len(records)
    os.kill(pid, signal.SIGSTOP)
    try:
        for i, (topic, partition, value) in enumerate(records):
            producer.produce(run.name(topic), value=value, partition=partition,
                             on_delivery=lambda err, msg, i=i: reports.__setitem__(
                                 i, (None if err is None else err.name(), msg.offset() if err is None else -1001)))
            producer.poll(0.1)  # past linger.ms: each record is a batch (a ProduceRequest) of its own
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while not any("Timed out ProduceRequest in flight" in line for line in timed_out):
            assert time.monotonic() < deadline, "the ProduceRequest to the stopped broker did not time out"
            producer.poll(0.1)
        producer.poll(0.3)  # the broker thread logs the timeout, then hands B back to its partition queue
        resume = threading.Timer(RESUME_AFTER_S, os.kill, (pid, signal.SIGCONT))
        resume.start()
        producer.abort_transaction(CALL_TIMEOUT_S)
        resume.join()
    finally:
        os.kill(pid, signal.SIGCONT)
    return {"reports": reports}


class _Lines:
    """A ``logger`` for librdkafka's log (confluent-kafka calls ``log(level, fmt, *args)``) that
    keeps its lines, so a scenario can wait for one (``REQTMOUT``: a notice, logged without
    ``debug``)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def log(self, level, fmt, *args) -> None:
        self.lines.append(fmt % args if args else fmt)


def _purged_then_next(run: Run, pid: int, topic: str, producer, lines: _Lines,
                      successor=None) -> dict[str, Any]:
    """On partition 0 of ``topic``: transaction 1 delivers A, then B times out on the stopped
    broker and the transaction is aborted (B purged, its outcome unknown: the broker appended
    it once it resumed); transaction 2 -- of ``successor`` when given (a new producer instance
    of the same transactional id), else of ``producer`` -- sends C and commits."""
    out: dict[str, Any] = {}
    producer.begin_transaction()
    out["first"] = _deliver(run, producer, [(topic, 0, b"A")])
    out["stopped"] = _stopped_send(run, pid, producer, [(topic, 0, b"B")], lines.lines)
    _wait_for_state(run, "t", "CompleteAbort")  # Kafka writes the markers after it answered EndTxn
    out["producers_after_abort"] = _describe_producers(run, topic, 1)
    if successor is not None:
        producer.close()
        producer = successor()
    producer.begin_transaction()
    out["next"] = _deliver(run, producer, [(topic, 0, b"C")])
    out["commit"] = outcome(lambda: producer.commit_transaction(CALL_TIMEOUT_S), flags=True)
    if out["commit"][0] == "ok":  # Kafka writes the markers after it answered EndTxn
        _wait_for_state(run, "t", "CompleteCommit")
    out["producers_after_commit"] = _describe_producers(run, topic, 1)
    out["log"] = _snapshot(run, topic, 1, committed=1 if successor else 0, uncommitted=3 if successor else 2)
    return out


def purged_pair_then_batch_scenario(bootstrap: str, pid: int) -> dict[str, Any]:
    """Two purged single-record batches (B1, B2: sequences 1 and 2), then the next transaction's
    C1 and C2 in one batch with sequences 1-2: no exact duplicate of a retained batch, so the
    broker answers OUT_OF_ORDER_SEQUENCE_NUMBER, which librdkafka makes fatal ("sequence
    desynchronization"): nothing is lost, the client sees the error. A new producer instance
    (InitProducerId aborts the open transaction and bumps the epoch) then commits D."""
    run = Run(bootstrap)
    run.create_topics({"pair": 1})
    lines = _Lines()
    producer = _txn_producer(run, lines)
    out: dict[str, Any] = {}
    producer.begin_transaction()
    out["first"] = _deliver(run, producer, [("pair", 0, b"A")])
    out["stopped"] = _stopped_send(run, pid, producer, [("pair", 0, b"B1"), ("pair", 0, b"B2")], lines.lines)
    _wait_for_state(run, "t", "CompleteAbort")
    out["producers_after_abort"] = _describe_producers(run, "pair", 1)
    producer.begin_transaction()
    out["next"] = _deliver(run, producer, [("pair", 0, b"C1"), ("pair", 0, b"C2")])
    out["commit"] = outcome(lambda: producer.commit_transaction(CALL_TIMEOUT_S), flags=True)
    producer.close()
    successor = _txn_producer(run, _Lines())
    successor.begin_transaction()
    out["successor"] = _deliver(run, successor, [("pair", 0, b"D")])
    _end(run, successor, "t", commit=True)
    out["producers_after_commit"] = _describe_producers(run, "pair", 1)
    out["log"] = _snapshot(run, "pair", 1, committed=1, uncommitted=4)
    return out


def _txn_producer(run: Run, lines: _Lines):
    producer = run.txn_producer("t", **{"socket.timeout.ms": REQUEST_TIMEOUT_MS, "reconnect.backoff.max.ms": 500,
                                        "logger": lines})
    producer.init_transactions(CALL_TIMEOUT_S)
    return producer


def purged_sequence_scenario(bootstrap: str, pid: int) -> dict[str, Any]:
    """The lost write: the same producer instance sends C in the next transaction."""
    run = Run(bootstrap)
    run.create_topics({"loss": 1})
    lines = _Lines()
    return _purged_then_next(run, pid, "loss", _txn_producer(run, lines), lines)


def recreated_producer_scenario(bootstrap: str, pid: int) -> dict[str, Any]:
    """The way out: after the abort, a new producer instance of the transactional id sends C."""
    run = Run(bootstrap)
    run.create_topics({"kept": 1})
    lines = _Lines()
    return _purged_then_next(run, pid, "kept", _txn_producer(run, lines), lines,
                             successor=lambda: _txn_producer(run, _Lines()))


#: what differs and is documented in docs/server.md ("Behaviour that differs"):
#: scenario -> part -> key -> (Apache Kafka's value, txlake's value). Kafka answers C, which
#: reuses the purged B's epoch and sequence, as B's duplicate: acknowledged at B's offset 1,
#: committed (marker at 3), lost. txlake answers OUT_OF_ORDER_SEQUENCE_NUMBER (B belongs to a
#: transaction that has ended), which librdkafka raises as fatal: the loss becomes an error the
#: application sees, and no commit marker is written (high watermark 3)
REFUSED = ("OUT_OF_ORDER_SEQUENCE_NUMBER", False, False, False)
FATAL = ("OUT_OF_ORDER_SEQUENCE_NUMBER", True, False, False)
DOCUMENTED: dict[str, dict] = {"purged_sequence": {
    "next": {"reports": ([(None, 0, 1)], [(REFUSED, 0, -1001)]), "raised": (None, FATAL)},
    "commit": (("ok", None), ("error", FATAL)),
    "log": {"high_watermarks": ([(0, 4)], [(0, 3)]), "lso": ([(0, 4)], [(0, 3)])},
}}

SCENARIOS = {"purged_sequence": purged_sequence_scenario, "recreated_producer": recreated_producer_scenario,
             "purged_pair_then_batch": purged_pair_then_batch_scenario}


@pytest.fixture(scope="module")
def outcomes(apache_kafka, txlake_server) -> PairedOutcomes:
    """Each scenario's outcomes, ``(Apache Kafka's, txlake's)``, each broker stopped by its own run."""
    pids = {apache_kafka.bootstrap: apache_kafka.pid, txlake_server.bootstrap: txlake_server.proc.pid}
    return PairedOutcomes(apache_kafka.bootstrap, txlake_server.bootstrap,
                          {name: (lambda bootstrap, fn=fn: fn(bootstrap, pids[bootstrap]))
                           for name, fn in SCENARIOS.items()})


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_txlake_answers_as_apache_kafka(scenario, outcomes):
    """Every part of the scenario's outcome is Apache Kafka's, but the documented differences."""
    kafka, ours = _without_documented(scenario, *outcomes[scenario], DOCUMENTED)
    differing = {part: {"Apache Kafka": kafka[part], "txlake": ours.get(part)}
                 for part in kafka if ours.get(part) != kafka[part]}
    assert sorted(ours) == sorted(kafka) and not differing, f"{scenario}: parts that differ: {differing}"


def test_the_purged_record_s_sequence_is_answered_as_a_duplicate(outcomes):
    """Apache Kafka's outcome is the lost write (so two equally broken runs cannot pass the
    comparison): B's ProduceRequest timed out and was purged (``_PURGE_QUEUE``) but the broker
    appended it at offset 1 (read_uncommitted shows it, aborted); the producer still has epoch 0
    and last sequence 1 (B's); C, sent with B's sequence, is acknowledged at B's offset 1 and
    its transaction commits, yet no committed record exists: the abort marker took offset 2,
    the commit marker 3."""
    kafka, _ = outcomes["purged_sequence"]
    assert kafka["first"]["reports"] == [(None, 0, 0)]
    assert kafka["stopped"]["reports"] == [("_PURGE_QUEUE", -1001)]
    assert kafka["producers_after_abort"] == [(0, 0, [(0, 1, -1)])]
    assert kafka["next"]["reports"] == [(None, 0, 1)]
    assert kafka["producers_after_commit"] == [(0, 0, [(0, 1, -1)])]
    assert kafka["log"] == {"high_watermarks": [(0, 4)], "lso": [(0, 4)], "read_committed": [],
                            "read_uncommitted": [(0, 0, b"A"), (0, 1, b"B")]}


def test_txlake_refuses_the_purged_record_s_sequence(outcomes):
    """txlake's outcome of the same steps: C, with the purged B's epoch and sequence, is refused
    with OUT_OF_ORDER_SEQUENCE_NUMBER (B's transaction has ended, so C is no retry of B), which
    librdkafka makes fatal for the flush and the commit: the client is told, where Kafka
    acknowledges C at B's offset and loses it. No commit marker is written (high watermark 3:
    A, B, the abort marker); read_committed holds nothing, and nothing claims it should."""
    _, ours = outcomes["purged_sequence"]
    assert ours["stopped"]["reports"] == [("_PURGE_QUEUE", -1001)]
    assert ours["producers_after_abort"] == [(0, 0, [(0, 1, -1)])]
    assert ours["next"] == {"raised": FATAL, "reports": [(REFUSED, 0, -1001)]}
    assert ours["commit"] == ("error", FATAL)
    assert ours["log"] == {"high_watermarks": [(0, 3)], "lso": [(0, 3)], "read_committed": [],
                           "read_uncommitted": [(0, 0, b"A"), (0, 1, b"B")]}


def test_a_new_producer_instance_after_the_abort_loses_nothing(outcomes):
    """Apache Kafka's outcome with a new producer instance for the next transaction: its
    InitProducerId bumps the epoch (1), C's sequence 0 of the new epoch is no duplicate, C is
    appended after the abort marker (offset 3) and committed."""
    kafka, _ = outcomes["recreated_producer"]
    assert kafka["stopped"]["reports"] == [("_PURGE_QUEUE", -1001)]
    assert kafka["next"]["reports"] == [(None, 0, 3)]
    assert kafka["producers_after_commit"] == [(0, 0, [(1, 0, -1)])]
    assert kafka["log"] == {"high_watermarks": [(0, 5)], "lso": [(0, 5)], "read_committed": [(0, 3, b"C")],
                            "read_uncommitted": [(0, 0, b"A"), (0, 1, b"B"), (0, 3, b"C")]}


def test_a_batch_overlapping_purged_ones_is_out_of_order(outcomes):
    """Apache Kafka's outcome when the reused sequences do not line up with a retained batch:
    C1-C2 (epoch 0, sequences 1-2, one batch) against the purged B1 (1) and B2 (2) answers
    OUT_OF_ORDER_SEQUENCE_NUMBER for both records, which librdkafka raises as fatal from flush
    and commit -- no loss. The successor's InitProducerId aborts the open transaction (its
    marker at 4, the purged pair's at 3) and gets epoch 2; D is appended at 5 and committed."""
    kafka, _ = outcomes["purged_pair_then_batch"]
    assert kafka["stopped"]["reports"] == [("_PURGE_QUEUE", -1001), ("_PURGE_QUEUE", -1001)]
    assert kafka["producers_after_abort"] == [(0, 0, [(0, 2, -1)])]
    refused = ("OUT_OF_ORDER_SEQUENCE_NUMBER", False, False, False)
    assert kafka["next"] == {"raised": ("OUT_OF_ORDER_SEQUENCE_NUMBER", True, False, False),
                             "reports": [(refused, 0, -1001), (refused, 0, -1001)]}
    assert kafka["commit"] == ("error", ("OUT_OF_ORDER_SEQUENCE_NUMBER", True, False, False))
    assert kafka["successor"]["reports"] == [(None, 0, 5)]
    assert kafka["producers_after_commit"] == [(0, 0, [(2, 0, -1)])]
    assert kafka["log"] == {"high_watermarks": [(0, 7)], "lso": [(0, 7)], "read_committed": [(0, 5, b"D")],
                            "read_uncommitted": [(0, 0, b"A"), (0, 1, b"B1"), (0, 2, b"B2"), (0, 5, b"D")]}
