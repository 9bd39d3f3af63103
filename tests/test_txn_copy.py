"""The copy test of the transactions issue: 100 000 records copied by a transactional copier
that aborts every third transaction and is SIGKILLed several times -- output equals input,
no duplicates, order kept per partition. On file:// and s3:// (memory:// cannot cross
processes).

The copier is the real worker process, ``python -m txlake.copier`` (tests/helpers/copier_proc.py
drives it), run with ``--abort-every 3`` (every third transaction of a run flushes its
records -- durable but undecided -- then aborts, and the consumer rewinds to where that
transaction started) and ``--same-partition`` (source partition p goes to target partition
p, so per-partition order is checkable). It is SIGKILLed five times at different points and
restarted each time with the same transactional.id and group (the new process forces the
writer lease of the dead one; its ``init_transactions`` aborts the transaction the dead one
left open; its consumer resumes from the group's committed offsets):

1. right after its 2nd commit (it is consuming / producing transaction 3, the one it aborts);
2. mid-transaction: ``--pause-in-txn 2`` -- transaction 2's records are flushed, undecided;
3. between send_offsets_to_transaction and the commit: ``--pause-before-commit 2`` -- the
   transaction holds pending offsets of the group, so the successor may read the group's
   offsets only after its ``init_transactions`` aborted it (a copier that read them first
   waited for UNSTABLE_OFFSET_COMMIT to clear and failed after 30 s);
4. at a random moment (seeded) after its first abort;
5. at a random moment (seeded) within 0.4 s of taking the dead one's writer lease over:
   while its coordinator loads, in ``init_transactions`` (aborting what run 4 left open) or
   in its first transaction.

The sixth run copies to the end. Then, read like an outside reader:

* read_committed: every source position appears exactly once in the target, its record is
  exactly ``derive(source record)``, in the target partition of its source partition, and the
  source offsets increase strictly within each target partition;
* read_uncommitted sees more: the records of the aborted (and killed) transactions; each of
  them lies in a range of the target's aborted-transaction index, and no read_committed record
  does;
* the group's committed offsets are the source's end offsets;
* every commit a run reported stays: the reported commits add up to at most 100 000 records.

``TXLAKE_COPY_SEED=<n>`` replays the random kill moments of a failed run (printed in every
assertion message).
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter

import pyarrow as pa
import pytest

from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from txlake.copier import derive
from txlake.engine import registry
from helpers import client_conf
from helpers.copier_proc import CopierProcess, copier_procs  # noqa: F401
from test_txn_crash import View, consume, watermarks

RECORDS = 100_000
PARTITIONS = 4
BATCH = 5_000          # 20 committed transactions (+ the aborted ones) for the whole copy
ABORT_EVERY = 3
SOURCE, TARGET = "copy-src", "copy-dst"
GROUP, TXN_ID = "copy-group", "copy-txn"
WAIT = 120.0           # seconds any one step of a copier may take (s3 on a busy CI machine)
#: what a copier logs (stderr) when it forces the dead predecessor's writer lease, before init_transactions
TAKEOVER = "took over the writer lease"


def source_value(i: int) -> bytes:
    """Source record i: a JSON object :func:`txlake.copier.derive` accepts."""
    return json.dumps({"origin": f"o{i % 97}", "dest": f"d{i}", "arr_delay": i - RECORDS // 2}).encode()


@pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_copy_100k_records_aborting_every_third_transaction_killed_five_times(storage, copier_procs):  # noqa: F811
    seed = int(os.environ.get("TXLAKE_COPY_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    conf = client_conf(storage)
    t0 = time.monotonic()

    # ---- the input: 100 000 records over 4 partitions (record i on partition i % 4)
    with AdminClient(conf) as admin:
        for topic in (SOURCE, TARGET):
            admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result()
    with Producer(conf) as producer:
        table = pa.table({"value": pa.array([source_value(i) for i in range(RECORDS)], pa.binary()),
                          "partition": pa.array([i % PARTITIONS for i in range(RECORDS)], pa.int32())})
        assert producer.produce_arrow(SOURCE, table, key=None, partition="partition").records == RECORDS
    source = {(p, o): v for p, o, v in consume(storage, SOURCE, PARTITIONS, "read_committed")}
    assert len(source) == RECORDS
    ends = {p: hw for p, (_, hw) in watermarks(storage, SOURCE, PARTITIONS, "read_committed").items()}
    assert ends == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
    registry.close_all()  # release this process's writer lease: the copier processes write

    # ---- the copier, killed five times, then run to the end
    t_copy = time.monotonic()
    runs: list[CopierProcess] = []
    kills: list[str] = []

    def start(*options: str) -> CopierProcess:
        proc = copier_procs(storage, SOURCE, TARGET, GROUP, TXN_ID,
                            ["--batch-records", str(BATCH), "--abort-every", str(ABORT_EVERY), "--same-partition",
                             *options],
                            {"storage.lease.force": True})  # the dead predecessor's lease never lapses here
        runs.append(proc)
        return proc

    def events() -> str:
        return "; ".join(f"run {i + 1}: " + " ".join(f"{e['event']}{e.get('txn', '')}" for e in r.events)
                         for i, r in enumerate(runs))

    def why() -> str:
        return f"seed {seed}; killed {kills}; events {events()}"

    def kill(proc: CopierProcess, where: str) -> None:
        last = proc.events[-1]["event"] if proc.events else "nothing"
        proc.kill()  # asserts the process was still running: it died by SIGKILL
        kills.append(f"{where} (last event: {last})")

    proc = start()
    proc.wait_event("committed", timeout=WAIT, pred=lambda e: e["txn"] == 2)
    kill(proc, "after its 2nd commit")

    proc = start("--pause-in-txn", "2")
    paused = proc.wait_event("in-transaction", timeout=WAIT)
    assert paused["txn"] == 2 and proc.of("committed") and not proc.of("aborted"), why()
    kill(proc, "mid-transaction 2 (flushed, undecided)")

    proc = start("--pause-before-commit", "2")
    paused = proc.wait_event("offsets-sent", timeout=WAIT)
    assert paused["txn"] == 2 and len(proc.of("committed")) == 1, why()
    kill(proc, "in transaction 2 with its offsets sent, before its commit")

    proc = start()
    proc.wait_event("aborted", timeout=WAIT)
    delay = rng.uniform(0.0, 0.3)
    time.sleep(delay)
    kill(proc, f"{delay:.2f} s after its first abort")

    proc = start()
    deadline = time.monotonic() + WAIT
    while not (any(TAKEOVER in line for line in proc.stderr) or proc.of("started")):
        assert proc.proc.poll() is None and time.monotonic() < deadline, f"no lease takeover; {why()}\n{proc.describe()}"
        time.sleep(0.005)
    delay = rng.uniform(0.0, 0.4)
    time.sleep(delay)
    kill(proc, f"{delay:.2f} s after it took the writer lease over")

    final = start()
    done = final.wait_event("done", timeout=4 * WAIT)
    final.wait_exit(timeout=WAIT)
    load_seconds, copy_seconds = t_copy - t0, time.monotonic() - t_copy
    assert len(kills) == 5

    committed_events = [e for r in runs for e in r.of("committed")]
    aborted_events = [e for r in runs for e in r.of("aborted")]
    assert done["records"] == sum(e["records"] for e in final.of("committed")), why()
    # every run that got that far aborted its 3rd transaction, and only that kind
    assert all(e["txn"] % ABORT_EVERY == 0 for e in aborted_events), why()
    assert all(e["txn"] % ABORT_EVERY != 0 for e in committed_events), why()
    assert len(aborted_events) >= 3 and len(committed_events) + len(aborted_events) >= 9, why()
    # a reported commit is never undone (its inputs are never copied again)
    assert sum(e["records"] for e in committed_events) <= RECORDS, why()

    # ---- read_committed: output equals input, exactly once, in order per partition
    out = consume(storage, TARGET, PARTITIONS, "read_committed")
    seen = Counter()
    wrong = []
    last_offset = {p: -1 for p in range(PARTITIONS)}
    out_of_order = []
    for p, offset, value in out:
        src = tuple(json.loads(value)["src"])
        seen[src] += 1
        if src not in source or src[0] != p or derive(source[src], *src)[1].decode() != value:
            wrong.append((p, offset, value))
        if src[1] <= last_offset[p]:
            out_of_order.append((p, offset, src))
        last_offset[p] = src[1]
    duplicates = sorted(s for s, n in seen.items() if n > 1)
    missing = sorted(set(source) - set(seen))
    assert not wrong, f"records that are not the derived record of their source: {wrong[:5]}; {why()}"
    assert not duplicates, f"{len(duplicates)} source positions copied twice, e.g. {duplicates[:10]}; {why()}"
    assert not missing, f"{len(missing)} source positions not copied, e.g. {missing[:10]}; {why()}"
    assert not out_of_order, f"source order broken in the target: {out_of_order[:5]}; {why()}"
    assert len(out) == RECORDS and set(seen) == set(source)

    # ---- read_uncommitted also sees the aborted records; read_committed sees none of them
    everything = consume(storage, TARGET, PARTITIONS, "read_uncommitted")
    committed_positions = {(p, o) for p, o, _ in out}
    invisible = {(p, o) for p, o, _ in everything} - committed_positions
    assert committed_positions <= {(p, o) for p, o, _ in everything}
    flushed_then_aborted = sum(e["records"] for e in aborted_events) + 2 * BATCH  # + the 2 paused transactions
    assert len(invisible) >= flushed_then_aborted, f"{len(invisible)} aborted records in the log; {why()}"
    aborted_ranges = View(storage).aborted_index(TARGET)

    def in_aborted_range(p: int, o: int) -> bool:
        return any(first <= o <= last for _, first, last in aborted_ranges[p])

    assert all(in_aborted_range(p, o) for p, o in invisible), why()
    assert not any(in_aborted_range(p, o) for p, o in committed_positions), why()
    assert len({pid for ranges in aborted_ranges.values() for pid, _, _ in ranges}) == 1  # one transactional.id

    # ---- the group's committed offsets are the source's end offsets
    checker = Consumer({**conf, "group.id": GROUP, "isolation.level": "read_committed"})
    try:
        offsets = checker.committed([TopicPartition(SOURCE, p) for p in range(PARTITIONS)], timeout=30)
    finally:
        checker.close()
    assert {tp.partition: tp.offset for tp in offsets} == ends, why()
    print(f"\n{storage.backend}: {RECORDS} records loaded in {load_seconds:.1f} s, copied in {copy_seconds:.1f} s "
          f"(6 copier processes), checked in {time.monotonic() - t_copy - copy_seconds:.1f} s: "
          f"{len(committed_events)} commits and {len(aborted_events)} aborts reported by {len(runs)} runs, "
          f"{len(invisible)} aborted records in the log; {why()}")
