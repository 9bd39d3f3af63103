"""txlake.verify.workload: a whole trial in-process (idempotent and transactional producers,
consumers under both isolation levels, concurrently), on file://, memory:// and S3."""

from __future__ import annotations

import dataclasses
import io
import threading

import pytest

from helpers import client_conf, close_engines  # noqa: F401 (fixture)
from txlake.verify import Anomaly, Assign, FinalRead, History, Poll, Send, Txn, check
from txlake.verify.history import SEND_OK
from txlake.verify.workload import WorkloadSpec, run_trial

SPEC = WorkloadSpec(partitions=2, idempotent_producers=2, sends_per_producer=15, transactional_producers=2,
                    txns_per_producer=3, sends_per_txn=3, abort_fraction=0.34)


def test_trial_is_clean_and_every_reader_equals_the_committed_history(storage, close_engines):  # noqa: F811
    sink = io.StringIO()
    result = run_trial(client_conf(storage), seed=7, topic="v7", spec=SPEC, sink=sink)
    assert result.anomalies == []
    h = result.history
    sends = h.of(Send)
    txns = {t.txn: t.outcome for t in h.of(Txn)}
    assert sorted(txns.values()) == ["abort", "abort", "commit", "commit", "commit", "commit"]
    assert len(sends) == 2 * 15 + 2 * 3 * 3 and {s.outcome for s in sends} == {SEND_OK}
    committed = sorted(("v7", s.partition, s.offset, s.value) for s in sends
                       if s.txn is None or txns[s.txn] == "commit")
    aborted = sorted(("v7", s.partition, s.offset, s.value) for s in sends if s.txn and txns[s.txn] == "abort")
    finals = {f.reader: f.records for f in h.of(FinalRead)}
    delta = {} if storage.backend == "memory" else {"delta": committed}  # delta-rs cannot reach memory://
    assert finals == {"consumer": committed, "duckdb": committed, **delta}
    read = {name: sorted(r for p in h.of(Poll) if p.process == name for r in p.records) for name in ("rc", "ru")}
    assert read["rc"] == committed
    assert read["ru"] == sorted(committed + aborted)
    assert History.load(io.StringIO(sink.getvalue())).events == h.events


@pytest.mark.parametrize("backend", ["file"])
def test_checker_finds_what_a_reader_got_wrong_in_a_real_trial(storage, close_engines):  # noqa: F811
    """The recorded history is complete enough to convict: one committed record dropped from
    the DuckDB read is a lost write, one aborted record slipped to the read_committed consumer
    an aborted read, each naming exactly that record."""
    h = run_trial(client_conf(storage), seed=3, topic="v3", spec=SPEC).history
    txns = {t.txn: t.outcome for t in h.of(Txn)}
    victim = next(s for s in h.of(Send) if s.txn and txns[s.txn] == "commit")
    leak = next(s for s in h.of(Send) if s.txn and txns[s.txn] == "abort")
    rec = ("v3", victim.partition, victim.offset, victim.value)
    bad = ("v3", leak.partition, leak.offset, leak.value)
    events = [dataclasses.replace(e, records=[r for r in e.records if r != rec])
              if isinstance(e, FinalRead) and e.reader == "duckdb" else e for e in h.events]
    events.append(Poll("rc2", "read_committed", [bad], 1e9, 1e9))
    assert check(History(events)) == [Anomaly("aborted-read", "rc2", (bad,)), Anomaly("lost-write", "duckdb", (rec,))]


def test_trial_through_txlake_serve_with_confluent_kafka(served, close_engines):  # noqa: F811
    """The same workload with confluent-kafka clients against ``txlake serve``; the final state is
    read over the wire, by an in-process Consumer and through DuckDB on the served root, and each
    must equal the committed history."""
    from txlake.verify.workload import default_readers, final_consumer_read

    wire = {"bootstrap.servers": served.bootstrap}
    readers = {"wire": lambda topic, n: final_consumer_read(wire, topic, n, drain_s=2.0),
               **default_readers(client_conf(served.storage))}
    result = run_trial(wire, seed=5, topic="w5", spec=SPEC, readers=readers, drain_s=2.0)
    assert result.anomalies == []
    h = result.history
    txns = {t.txn: t.outcome for t in h.of(Txn)}
    assert sorted(txns.values()) == ["abort", "abort", "commit", "commit", "commit", "commit"]
    sends = h.of(Send)
    assert len(sends) == 48
    # librdkafka's abort_transaction purges what it has not sent yet: those reports are errors
    assert {(s.outcome, s.error) for s in sends if s.txn is None or txns[s.txn] == "commit"} == {(SEND_OK, None)}
    assert {(s.outcome, s.error) for s in sends if s.txn and txns[s.txn] == "abort"} <= {
        (SEND_OK, None), ("info", "_PURGE_QUEUE"), ("info", "_PURGE_INFLIGHT")}
    committed = sorted(("w5", s.partition, s.offset, s.value) for s in sends
                       if s.txn is None or txns[s.txn] == "commit")
    assert {f.reader: f.records for f in h.of(FinalRead)} == {"wire": committed, "consumer": committed,
                                                               "delta": committed, "duckdb": committed}
    rc = sorted(r for p in h.of(Poll) if p.process == "rc" for r in p.records)
    assert rc == committed


@pytest.mark.parametrize("serve_root", ["file"], indirect=True)  # S3 under the server: the test above
def test_trial_with_a_transactional_writer_sigkilled_mid_transaction(served, close_engines, tmp_path):  # noqa: F811
    """Writer t0 (a confluent-kafka child process) is SIGKILLed after its first transaction,
    inside its second, and started again: the new instance's init_transactions aborts the open
    transaction, and the history stays clean, its records read by nobody under read_committed."""
    from txlake.verify.workload import default_readers, final_consumer_read

    wire = {"bootstrap.servers": served.bootstrap}
    readers = {"wire": lambda topic, n: final_consumer_read(wire, topic, n, drain_s=2.0),
               **default_readers(client_conf(served.storage))}
    spec = dataclasses.replace(SPEC, send_interval_ms=200)  # the kill lands between sends, not in a commit
    result = run_trial(wire, seed=9, topic="k9", spec=spec, readers=readers, drain_s=2.0, kill_writer=str(tmp_path))
    assert result.anomalies == []
    t0 = {t.txn: (t.outcome, t.error) for t in result.history.of(Txn) if t.process == "t0"}
    assert t0["t0-T1"] == ("abort", "aborted by init_transactions")
    assert sorted(t0) == ["t0-T0", "t0-T1", "t0-T2"]
    killed = {s.value for s in result.history.of(Send) if s.txn == "t0-T1"}
    assert killed
    finals = {f.reader: {r[3] for r in f.records} for f in result.history.of(FinalRead)}
    assert set(finals) == {"wire", "consumer", "duckdb", "delta"}
    assert all(not (values & killed) for values in finals.values())
    assert {v for v in finals["wire"] if v.startswith("t0-")} == {
        s.value for s in result.history.of(Send) if s.txn in t0 and t0[s.txn][0] == "commit"}


def producer_threads() -> set[tuple[str, int]]:
    """The running send and transaction threads of txlake Producers, as ``(name, ident)``."""
    return {(t.name, t.ident) for t in threading.enumerate() if t.name in ("txlake-producer", "txlake-producer-txn")}


def test_consume_transform_produce_group_with_rebalances_and_a_killed_member(tmp_path, close_engines):  # noqa: F811
    """The consume-transform-produce group (txlake/verify/ctp.py) on file://: members m0 and m1
    copy the topic to c4-out in transactions carrying their offsets (KIP-447); the seeded victim,
    a static member, is abandoned unclosed inside a transaction after sending its offsets, and
    restarted under the same transactional.id, whose init_transactions aborts that transaction;
    m2 joins and leaves. Every committed input has exactly one output, in its partition, in every
    final reader (Consumer, DuckDB, Delta), and the group's offsets end past every input."""
    from txlake.verify import FinalOffsets, OffsetCommit
    from txlake.verify.ctp import GROUP_BROKER_SETTINGS, plans

    conf = {"storage.url": f"file://{tmp_path}/root", "storage.flush.linger.ms": 1, **GROUP_BROKER_SETTINGS}
    before = producer_threads()     # an earlier test of this worker process may have left one running
    result = run_trial(conf, seed=4, topic="c4", spec=dataclasses.replace(SPEC, ctp_members=2))
    assert result.anomalies == []
    assert result.faults == {"ctp.member.kill": 1}
    h = result.history
    victim = next(p for p in plans(4, 2, 0.2, 10)[0] if p.kill_at is not None)
    killed = [t for t in h.of(Txn) if t.error == "aborted by init_transactions"]
    assert [t.process for t in killed] == [f"{victim.name}.1"]
    assert killed[0].txn in {c.txn for c in h.of(OffsetCommit) if c.process == victim.name}  # offsets were pending
    assert {e.process for e in h.of(Poll)} >= {"m0", "m1", f"{victim.name}.1"}
    assert "m2" in {e.process for e in h.of(Assign)}
    txns = {t.txn: t.outcome for t in h.of(Txn)}
    inputs = sorted((s.partition, s.value) for s in h.of(Send)
                    if s.topic == "c4" and s.outcome == SEND_OK and (s.txn is None or txns[s.txn] == "commit"))
    finals = {f.reader: f.records for f in h.of(FinalRead)}
    assert set(finals) == {"consumer", "duckdb", "delta"}
    for reader, records in finals.items():
        assert sorted((p, v.split(">")[0]) for t, p, _, v in records if t == "c4-out") == inputs, reader
    ends = {(t, p): o for t, p, o in h.of(FinalOffsets)[0].offsets}
    assert all(o < ends[("c4", p)] for t, p, o, _ in finals["consumer"] if t == "c4")
    # the history convicts: one output dropped from DuckDB's read is a lost write and a missing output
    out = next(r for r in finals["duckdb"] if r[0] == "c4-out")
    src = next(r for r in finals["duckdb"] if r[0] == "c4" and r[3] == out[3].split(">")[0])
    events = [dataclasses.replace(e, records=[r for r in e.records if r != out])
              if isinstance(e, FinalRead) and e.reader == "duckdb" else e for e in h.events]
    assert [(a.kind, a.where, a.records) for a in check(History(events))] == [
        ("lost-write", "duckdb", (out,)), ("missing-output", "duckdb", (src,))]
    # every producer of the trial (writers, members, the abandoned one) is closed: its threads are gone
    # (a soak runs a thousand trials in one process)
    assert producer_threads() - before == set()


def test_delta_reader_repeats_a_publication_whose_commit_put_timed_out(tmp_path, close_engines):  # noqa: F811
    """Every PUT of the publication times out after being applied (storage.faults.put.timeout):
    the first publication raises StorageError although its version landed; the Delta reader
    publishes again, finds the version there (nothing more to commit: no PUT) and reads the
    committed records."""
    from test_client_parity import create

    from txlake import Producer
    from txlake.catalog.faults import injected_totals
    from txlake.verify.workload import final_delta_read

    url = f"file://{tmp_path}/root"
    create({"storage.url": url}, "d")
    with Producer({"storage.url": url}) as p:
        for i in range(3):
            p.produce("d", value=f"v{i}".encode(), partition=0)
    before = injected_totals()["put.timeout"]
    faulty = {"storage.url": url, "storage.options": {"storage.faults.put.timeout.rate": 1}}
    assert final_delta_read(faulty, "d") == [("d", 0, 0, "v0"), ("d", 0, 1, "v1"), ("d", 0, 2, "v2")]
    assert injected_totals()["put.timeout"] == before + 1


def test_init_transactions_is_called_again_after_a_retriable_timeout(tmp_path, close_engines):  # noqa: F811
    """A workload's transactional producer resumes an ``init_transactions`` that timed out (the
    server stopped or slow under faults: seed 2071 of the soak failed its trial on the first
    ``_TIMED_OUT``): a retriable error leaves the initialisation running and the next call
    resumes it; a call budget spent raises the last error."""
    import txlake
    from txlake.verify.workload import init_transactions

    conf = {"storage.url": f"file://{tmp_path}"}
    txlake.AdminClient(conf).create_topics([txlake.NewTopic("t", 1)])["t"].result()
    p = txlake.Producer({**conf, "transactional.id": "w"})
    try:
        with pytest.raises(txlake.KafkaException) as info:
            init_transactions(p, timeout_s=0.0, calls=1)
        assert (info.value.args[0].code(), info.value.args[0].retriable()) == (txlake.KafkaError._TIMED_OUT, True)
        init_transactions(p, timeout_s=0.001, calls=100_000)
        p.begin_transaction()
        p.produce("t", b"after the retries")
        p.commit_transaction(30)
    finally:
        p.close()


def test_a_member_that_missed_max_poll_interval_rejoins_instead_of_failing_its_trial(tmp_path, close_engines):  # noqa: F811
    """``polled_records`` passes over ``_MAX_POLL_EXCEEDED`` (seeds 2119, 2221, 2223 and 2280 of the
    soak failed their trials on it when the machine starved them): the member has left the
    group, and its next polls serve the loss and rejoin, then deliver the records again."""
    import time

    import txlake
    from txlake.verify.workload import polled_records

    conf = {"storage.url": f"file://{tmp_path}"}
    txlake.AdminClient(conf).create_topics([txlake.NewTopic("t", 1)])["t"].result()
    p = txlake.Producer(conf)
    p.produce("t", b"r0", partition=0)
    p.flush(30)
    p.close()
    c = txlake.Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "max.poll.interval.ms": 1000, "session.timeout.ms": 6000})
    try:
        c.subscribe(["t"])
        got = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = polled_records(txlake, c.consume(10, 0.2))
        assert [m.value() for m in got] == [b"r0"]
        time.sleep(1.5)  # past max.poll.interval.ms
        errors, again = [], []
        while not again and time.monotonic() < deadline:
            msgs = c.consume(10, 0.2)
            errors += [m.error().code() for m in msgs if m.error() is not None]
            again = polled_records(txlake, msgs)
        assert errors[:1] == [txlake.KafkaError._MAX_POLL_EXCEEDED]
        assert [(m.partition(), m.offset(), m.value()) for m in again] == [(0, 0, b"r0")]  # nothing committed: re-read
    finally:
        c.close()
