"""txlake.verify.checker on hand-made histories: each exhibits exactly one anomaly kind
(the clean one none), and the checker must name exactly the records involved."""

from __future__ import annotations

import io

import pytest

from txlake.verify import (Anomaly, Assign, FinalOffsets, FinalRead, History, OffsetCommit, Poll, Send, Txn, check,
                           summarize)
from txlake.verify.history import SEND_FAIL, SEND_INFO, SEND_OK

T = "t"
A0, A1, B0, B1, C0, A2 = ((T, 0, 0, "a0"), (T, 0, 1, "a1"), (T, 0, 2, "b0"), (T, 0, 3, "b1"), (T, 0, 5, "c0"),
                          (T, 0, 7, "a2"))
COMMITTED = [A0, A1, B0, B1, A2]


def base(rc_polls=([A0, A1, B0, B1, A2],), ru_polls=([A0, A1, B0, B1, C0, A2],), consumer=COMMITTED,
         duckdb=COMMITTED, extra_sends=(), a1_ack=1):
    """Idempotent p0 writes a0, a1, a2; transactional t0 commits T1 (b0, b1; marker at 4)
    and aborts T2 (c0; marker at 6); consumers c0 (read_committed) and u0
    (read_uncommitted) poll; two final readers."""
    h = History()
    h.add(Send("p0", T, 0, "a0", SEND_OK, 0))
    h.add(Send("p0", T, 0, "a1", SEND_OK, a1_ack))
    h.add(Send("t0", T, 0, "b0", SEND_OK, 2, txn="T1"))
    h.add(Send("t0", T, 0, "b1", SEND_OK, 3, txn="T1"))
    h.add(Txn("t0", "T1", "commit", t_start=5.0, t_end=6.0))
    h.add(Send("t0", T, 0, "c0", SEND_OK, 5, txn="T2"))
    h.add(Txn("t0", "T2", "abort", t_start=7.0, t_end=8.0))
    h.add(Send("p0", T, 0, "a2", SEND_OK, 7))
    for s in extra_sends:
        h.add(s)
    for recs in rc_polls:
        h.add(Poll("c0", "read_committed", list(recs), t_start=8.5, t_end=9.0))
    for recs in ru_polls:
        h.add(Poll("u0", "read_uncommitted", list(recs), t_start=8.5, t_end=9.0))
    h.add(FinalRead("consumer", list(consumer)))
    h.add(FinalRead("duckdb", list(duckdb)))
    return h


def test_clean_history_has_no_anomaly():
    assert check(base()) == []
    assert set(summarize([]).values()) == {0}


def test_lost_write():
    h = base(duckdb=[A0, A1, B0, A2])
    assert check(h) == [Anomaly("lost-write", "duckdb", ((T, 0, 3, "b1"),))]


def test_duplicate():
    d = (T, 0, 8, "d0"), (T, 0, 9, "d0")
    h = base(consumer=COMMITTED + list(d), duckdb=COMMITTED + list(d),
             extra_sends=[Send("p1", T, 0, "d0", SEND_INFO, error="_MSG_TIMED_OUT")])
    assert check(h) == [Anomaly("duplicate", "", d)]


def test_inconsistent_offsets_against_the_acknowledgement():
    h = base(a1_ack=8)
    assert check(h) == [Anomaly("inconsistent-offsets", "p0", (A1, (T, 0, 8, "a1")))]


def test_aborted_read_by_read_committed_poll():
    h = base(rc_polls=([A0, A1, B0, B1, C0],))
    assert check(h) == [Anomaly("aborted-read", "c0", (C0,))]


def test_aborted_read_in_final_read():
    h = base(consumer=[A0, A1, B0, B1, C0, A2])
    assert check(h) == [Anomaly("aborted-read", "consumer", (C0,))]


def test_precommitted_read():
    h = base()
    h.events.insert(4, Poll("c1", "read_committed", [B0], t_start=3.0, t_end=4.0))  # before T1's commit (5.0)
    assert check(h) == [Anomaly("precommitted-read", "c1", (B0,))]


def test_garbage_read():
    z = (T, 0, 9, "zz")
    h = base(duckdb=COMMITTED + [z])
    assert check(h) == [Anomaly("garbage-read", "duckdb", (z,))]


def test_divergent_read_of_unknown_outcome():
    d = (T, 0, 8, "d0")
    h = base(consumer=COMMITTED + [d], extra_sends=[Send("p1", T, 0, "d0", SEND_INFO, error="_MSG_TIMED_OUT")])
    assert check(h) == [Anomaly("divergent-read", "duckdb", (d,))]


def test_nonmonotonic_poll_and_assign_resets():
    h = base(rc_polls=([A1], [A0]))
    assert check(h) == [Anomaly("nonmonotonic-poll", "c0", (A1, A0))]
    h = base(rc_polls=([A1],))
    h.add(Assign("c0", [(T, 0, -2)]))
    h.add(Poll("c0", "read_committed", [A0, A1], t_start=9.0, t_end=9.5))
    assert check(h) == []


def test_poll_skip():
    h = base(rc_polls=([A0], [B0, B1, A2]))
    assert check(h) == [Anomaly("poll-skip", "c0", (A0, A1, B0))]


def test_poll_skip_depends_on_isolation_level():
    """c0 (read_committed) may go from b1 to a2 past the aborted c0; u0 (read_uncommitted) may not."""
    h = base(ru_polls=([A0, A1, B0, B1], [A2]))
    assert check(h) == [Anomaly("poll-skip", "u0", (B1, C0, A2))]


def test_history_round_trips_through_json_lines():
    h = base(rc_polls=([A0], [B0, B1, A2]))
    buf = io.StringIO()
    h.dump(buf)
    buf.seek(0)
    again = History.load(buf)
    assert check(again) == check(h) == [Anomaly("poll-skip", "c0", (A0, A1, B0))]


def test_malformed_history_line_is_named():
    with pytest.raises(ValueError, match=r"history line 2: history event has unknown type 'bogus'"):
        History.load(io.StringIO('{"type": "final", "reader": "x", "records": []}\n{"type": "bogus"}\n'))


def test_g1c_write_read_cycle():
    """T3 read T4's x and T4 read T5's y and T5 read T3's w: one cycle of three; T6 read T3's w
    too but nobody read T6's writes, so it is outside the cycle."""
    w, x, y, v = (T, 1, 0, "w"), (T, 1, 1, "x"), (T, 1, 2, "y"), (T, 1, 3, "v")
    h = History()
    for value, txn, off in (("w", "T3", 0), ("x", "T4", 1), ("y", "T5", 2), ("v", "T6", 3)):
        h.add(Send("t1", T, 1, value, SEND_OK, off, txn=txn))
        h.add(Txn("t1", txn, "commit"))
    h.add(Poll("x3", "read_committed", [x], txn="T3"))
    h.add(Poll("x4", "read_committed", [y], txn="T4"))
    h.add(Poll("x5", "read_committed", [w], txn="T5"))
    h.add(Poll("x6", "read_committed", [w], txn="T6"))
    h.add(FinalRead("consumer", [w, x, y, v]))
    assert check(h) == [Anomaly("G1c", "", (w, x, y))]
    h.events.remove(next(e for e in h.events if isinstance(e, Poll) and e.process == "x5"))
    assert check(h) == []


I0, I1, I2 = ("in", 0, 0, "i0"), ("in", 0, 1, "i1"), ("in", 0, 2, "i2")
O0, O1, O2 = ("out", 0, 0, "i0>m0-T0"), ("out", 0, 1, "i1>m0-T0"), ("out", 0, 3, "i2>m1-T0")


def ctp(o1=SEND_OK, m1_polls=(I2,), m1_outputs=(O2,), zombie=(), final=(I0, I1, I2, O0, O1, O2)):
    """Consume-transform-produce: p0 writes i0..i2 to "in"; member m0's transaction m0-T0 copies
    i0, i1 to "out" (markers: 2) and commits group g's offset 2; after a rebalance m1's m1-T0
    copies i2 (marker 4) and commits offset 3; the group ends at 3. ``zombie``: more
    (poll, sends) of a committed transaction m0-T1."""
    h = History()
    for r in (I0, I1, I2):
        h.add(Send("p0", *r[:2], r[3], SEND_OK, r[2]))
    for txn, polls, outs, end in (("m0-T0", (I0, I1), ((O0, SEND_OK), (O1, o1)), 2),
                                  ("m1-T0", m1_polls, ((o, SEND_OK) for o in m1_outputs), 3), *zombie):
        h.add(Poll(txn[:2], "read_committed", list(polls), txn=txn))
        for (t, p, off, value), outcome in outs:
            h.add(Send(txn[:2], t, p, value, outcome, off if outcome == SEND_OK else None, txn=txn,
                       source=value.split(">")[0]))
        h.add(OffsetCommit(txn[:2], "g", [("in", 0, end)], txn=txn))
        h.add(Txn(txn[:2], txn, "commit"))
    h.add(FinalOffsets("g", [("in", 0, 3)]))
    h.add(FinalRead("consumer", list(final)))
    return h


def test_consume_transform_produce_clean():
    assert check(ctp()) == []


def test_missing_output_offsets_committed_without_the_output():
    """m0-T0 committed offset 2 past i1, but i1's output was refused (so no lost-write) and the
    transaction committed anyway: i1 is never copied."""
    h = ctp(o1=SEND_FAIL, final=(I0, I1, I2, O0, O2))
    assert check(h) == [Anomaly("missing-output", "consumer", (I1,))]


def test_lost_input_skipped_by_the_group():
    """m1-T0 committed offset 3 without having read i2: the group's offsets pass a record nobody copied."""
    h = ctp(m1_polls=(), m1_outputs=(), final=(I0, I1, I2, O0, O1))
    assert check(h) == [Anomaly("lost-input", "consumer", (I2,))]


def test_duplicate_output_of_a_zombie():
    """A zombie m0 (an older generation) copies i2 too, and its transaction commits: two outputs of i2."""
    z = ("out", 0, 5, "i2>m0-T1")
    h = ctp(zombie=[("m0-T1", (I2,), ((z, SEND_OK),), 3)], final=(I0, I1, I2, O0, O1, O2, z))
    assert check(h) == [Anomaly("duplicate-output", "consumer", (O2, z))]


def _purged_then_reused(purged_by: str = "t1") -> History:
    """Transactional t1: T0 sends x0 (offset 0) and x1, whose delivery report is _PURGE_QUEUE
    (unknown outcome: the broker appended it at 1), and aborts; T1's y0 is acknowledged at
    x1's offset 1, y1 at 3, T1 commits. ``purged_by``: the process x1's send is recorded for."""
    h = History()
    h.add(Send("t1", T, 0, "x0", SEND_OK, 0, txn="T0", t_start=1.0))
    h.add(Send(purged_by, T, 0, "x1", SEND_INFO, txn="T0" if purged_by == "t1" else None, error="_PURGE_QUEUE",
               t_start=2.0))
    h.add(Txn("t1", "T0", "abort", t_start=3.0, t_end=4.0))
    if purged_by != "t1":
        h.add(Txn(purged_by, "U0", "abort", t_start=3.0, t_end=4.0))
    h.add(Send("t1", T, 0, "y0", SEND_OK, 1, txn="T1", t_start=5.0))
    h.add(Send("t1", T, 0, "y1", SEND_OK, 3, txn="T1", t_start=6.0))
    h.add(Txn("t1", "T1", "commit", t_start=7.0, t_end=8.0))
    h.add(Poll("u0", "read_uncommitted", [(T, 0, 0, "x0"), (T, 0, 1, "x1"), (T, 0, 3, "y1")], t_start=8.5, t_end=9.0))
    h.add(FinalRead("consumer", [(T, 0, 3, "y1")]))
    h.add(FinalRead("duckdb", [(T, 0, 3, "y1")]))
    return h


def test_reused_sequence_of_a_purged_send():
    """A committed record missing from every final read whose acknowledged offset holds a purged
    (unknown outcome) record of the same producer's aborted transaction: one reused-sequence
    anomaly by the producer, naming both records, and no lost-write."""
    assert check(_purged_then_reused()) == [Anomaly("reused-sequence", "t1", ((T, 0, 1, "y0"), (T, 0, 1, "x1")))]


def test_a_lost_write_at_another_producer_s_record_stays_a_lost_write():
    """The same history with the purged record another producer's: not the client's sequence
    reuse, so each final reader's lost-write."""
    assert check(_purged_then_reused(purged_by="t2")) == [Anomaly("lost-write", "consumer", ((T, 0, 1, "y0"),)),
                                                          Anomaly("lost-write", "duckdb", ((T, 0, 1, "y0"),))]


def _recorded(name: str) -> History:
    """A trial's history recorded by ``txlake verify --history-dir`` (tests/data/NAME.jsonl.gz)."""
    import gzip
    from pathlib import Path

    with gzip.open(Path(__file__).parent / "data" / f"{name}.jsonl.gz", "rt") as fp:
        return History.load(fp)


def test_seed_4_server_stop_history_is_classified_reused_sequence():
    """Regression (issue 20): the history of ``txlake verify --serve --seed 4 --process-faults
    server-stop`` that reported 8 lost writes (t1-T1-0 and t1-T1-1 lacking in the 4 final reads):
    t1's T0 had t1-T0-2 and t1-T0-3 purged by abort_transaction after their ProduceRequest timed
    out on the stopped server, and T1's first two records were acknowledged at their offsets 1
    and 2 (librdkafka reused their sequence numbers; Apache Kafka answers the same:
    tests/test_differential_faults.py). The checker names them reused-sequence, each with the
    purged record at its offset; nothing else in the trial is an anomaly."""
    topic = "verify-4-16f0e6a4"
    assert check(_recorded("verify-seed4-server-stop")) == [
        Anomaly("reused-sequence", "t1", ((topic, 1, 1, "t1-T1-0"), (topic, 1, 1, "t1-T0-2"))),
        Anomaly("reused-sequence", "t1", ((topic, 1, 2, "t1-T1-1"), (topic, 1, 2, "t1-T0-3")))]


def test_seed_3_server_kill_history_is_classified_reused_sequence():
    """Regression (issue 20): ``txlake verify --serve --trials 5 --seed 0 --process-faults
    server-kill``, trial seed 3. The server was SIGKILLed after writing t1-T1-0 (partition 1,
    offset 40) and before answering; the client retried it, abort_transaction purged it, and
    T2's first record on partition 1, t1-T2-2, got its sequence: the restarted server (producer
    state rebuilt from the log) answered it as the duplicate, at 40. One reused-sequence (four
    lost-writes, one per final reader, before the kind existed); nothing else."""
    topic = "verify-3-9e80f62c"
    assert check(_recorded("verify-seed3-server-kill")) == [
        Anomaly("reused-sequence", "t1", ((topic, 1, 40, "t1-T2-2"), (topic, 1, 40, "t1-T1-0")))]
