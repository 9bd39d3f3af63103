"""Pure functions from a recorded history to the anomalies it shows.

The kinds follow Jepsen's Kafka workload checker (jepsen.tests.kafka, used in its
Redpanda and Bufstream analyses); the code is our own. Every value is written once, so
a value names its send. The *final reads* (one :class:`~.history.FinalRead` per reader
of the committed state: in-process Consumer, DuckDB view, the wire, ...) stand for the
log: each must equal the committed history.

Kinds (``Anomaly.kind``):

``lost-write``
    A write that must be in the log -- acknowledged outside a transaction, or sent in a
    transaction whose commit returned -- is missing from a final read.
``reused-sequence``
    A lost write the client caused, told apart from ``lost-write``: the missing write's
    acknowledged position holds a record of an earlier send of the same producer whose
    outcome was unknown (its delivery report an error such as ``_PURGE_QUEUE``) and whose
    transaction was aborted. The producer sent the new record with that send's producer id,
    epoch and sequence number, and the broker answered it as a duplicate of the appended
    one (NO_ERROR with its offset, as Kafka's ``ProducerStateEntry.findDuplicateBatch``
    does), so it was never written: librdkafka's ``abort_transaction`` purging a record
    whose ProduceRequest timed out or lost its connection (``server-stop``, ``server-kill``;
    docs/reliability.md, "Anomalies that are the client's").
    Reported once per record, by the producer, with the position's other record.
``duplicate``
    One value was read at more than one (topic, partition, offset).
``inconsistent-offsets``
    One (topic, partition, offset) was read with different values, or a value was read
    at another position than its acknowledgement named.
``aborted-read``
    A read_committed poll or a final read returned a value of an aborted transaction.
``precommitted-read``
    A read_committed poll returned a value before its transaction's commit was even
    invoked (the poll returned before ``commit_transaction`` was called).
``garbage-read``
    A read returned a value no send wrote, or one whose send failed definitely.
``divergent-read``
    A value of unknown outcome is in one final read but not another (readers disagree).
``nonmonotonic-poll``
    A consumer read an offset at or below one it read before on that partition with no
    assign/seek between.
``poll-skip``
    Between two consecutive offsets a consumer read on a partition, the log (as its
    isolation level sees it) holds records the consumer did not read.
``G1c``
    Transactions that read each other's writes in a cycle (T1 read a record T2 wrote and
    T2, directly or through others, one T1 wrote): write-read edges only, from polls made
    inside a transaction (``Poll.txn``). Write-write order (offsets) is not an edge: Kafka
    appends a transaction's records as they are sent, so offset order between open
    transactions implies no isolation order.

``missing-output``
    Consume-transform-produce (KIP-447): a transaction that committed read an input record
    below the offsets it committed for the group, yet no output of that record is in a
    final read: the group will never copy it again, its output is gone.
``lost-input``
    Consume-transform-produce: a committed input record below the group's final committed
    offset (:class:`~.history.FinalOffsets`) that no committed transaction read and that has
    no output in a final read (the group skipped it; not already a ``missing-output``).
``duplicate-output``
    Consume-transform-produce: one input record has more than one output in a final read
    (copied by two transactions that both committed, e.g. a fenced zombie's and its
    successor's: what KIP-447's generation check forbids).

The three consume-transform-produce kinds follow Jepsen's Kafka workload, which checks a
``txn`` workload's polls and sends made in one transaction; an output names its input
(``Send.source``).

Reads past the LSO by read_committed consumers show as ``precommitted-read`` (or
``aborted-read``) once the transaction's outcome is known.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from .history import (SEND_FAIL, SEND_INFO, SEND_OK, TXN_ABORT, TXN_COMMIT, Assign, FinalOffsets, FinalRead, History,
                      OffsetCommit, Poll, Record, Send, Txn)

READ_COMMITTED = "read_committed"

KINDS = ("lost-write", "reused-sequence", "duplicate", "inconsistent-offsets", "aborted-read", "precommitted-read",
         "garbage-read", "divergent-read", "nonmonotonic-poll", "poll-skip", "G1c", "missing-output", "lost-input",
         "duplicate-output")


@dataclass(frozen=True, order=True)
class Anomaly:
    """One anomaly and the records involved.

    Attributes:
        kind: one of :data:`KINDS`.
        where: the process or reader that observed it (``""`` when it is the log's).
        records: ``((topic, partition, offset, value), ...)``; offset -1 where none is known.
        note: a short human-readable explanation.
    """

    kind: str
    where: str
    records: tuple = field(default_factory=tuple)
    note: str = field(default="", compare=False)


def _pos(r: Record) -> tuple[str, int, int]:
    return (r[0], r[1], r[2])


def _must_exist(send: Send, txns: dict[str, Txn]) -> bool:
    if send.outcome == SEND_FAIL:
        return False
    if send.txn is None:
        return send.outcome == SEND_OK
    txn = txns.get(send.txn)
    return txn is not None and txn.outcome == TXN_COMMIT


def _aborted(send: Send, txns: dict[str, Txn]) -> bool:
    txn = txns.get(send.txn) if send.txn is not None else None
    return txn is not None and txn.outcome == TXN_ABORT


def _reused_by(send: Send, at: dict[tuple, set], sends: dict[str, Send], txns: dict[str, Txn]) -> Send | None:
    """The earlier send whose sequence number acknowledged ``send`` (``reused-sequence``): the
    record read at ``send``'s acknowledged position, when it is another send of the same
    process, started before it, of unknown outcome, in an aborted transaction; else None."""
    if send.outcome != SEND_OK or send.offset is None:
        return None
    for value in sorted(at.get((send.topic, send.partition, send.offset), ())):
        other = sends.get(value)
        if (other is not None and other is not send and other.process == send.process
                and other.outcome == SEND_INFO and _aborted(other, txns) and other.t_start <= send.t_start):
            return other
    return None


def check(history: History) -> list[Anomaly]:
    """Every anomaly in ``history``, sorted by kind, observer and records.

    Args:
        history: the recorded events (sends, transactions, polls, assigns, final reads).

    Returns:
        ``[Anomaly, ...]`` -- empty for a clean history.
    """
    sends: dict[str, Send] = {s.value: s for s in history.of(Send)}
    txns: dict[str, Txn] = {t.txn: t for t in history.of(Txn)}
    finals: list[FinalRead] = history.of(FinalRead)
    polls: list[Poll] = history.of(Poll)
    out: set[Anomaly] = set()

    # every observation of a value at a position: polls and final reads
    observed: dict[str, set] = defaultdict(set)
    at: dict[tuple, set] = defaultdict(set)
    for ev in [*polls, *finals]:
        for r in ev.records:
            observed[r[3]].add(_pos(r))
            at[_pos(r)].add(r[3])
    for value, positions in observed.items():
        if len(positions) > 1:
            out.add(Anomaly("duplicate", "", tuple(sorted(p + (value,) for p in positions)),
                            f"{value!r} read at {len(positions)} positions"))
    for pos, values in at.items():
        if len(values) > 1:
            out.add(Anomaly("inconsistent-offsets", "", tuple(sorted(pos + (v,) for v in values)),
                            f"{pos} read with {len(values)} values"))
    for value, positions in observed.items():
        s = sends.get(value)
        if s is not None and s.outcome == SEND_OK and s.offset is not None:
            acked = (s.topic, s.partition, s.offset)
            if positions - {acked}:
                out.add(Anomaly("inconsistent-offsets", s.process,
                                tuple(sorted(p + (value,) for p in positions | {acked})),
                                f"{value!r} acknowledged at {acked}, read at {sorted(positions - {acked})}"))

    def bad_value(r: Record, where: str, committed_only: bool, t_end: float | None) -> None:
        s = sends.get(r[3])
        if s is None or s.outcome == SEND_FAIL:
            out.add(Anomaly("garbage-read", where, (tuple(r),), f"{r[3]!r} was never written"))
            return
        if not committed_only:
            return
        if _aborted(s, txns):
            out.add(Anomaly("aborted-read", where, (tuple(r),), f"{r[3]!r} is of aborted transaction {s.txn}"))
        elif t_end is not None and s.txn is not None:
            txn = txns.get(s.txn)
            if txn is not None and txn.t_start and t_end < txn.t_start:
                out.add(Anomaly("precommitted-read", where, (tuple(r),),
                                f"{r[3]!r} read before transaction {s.txn}'s commit was invoked"))

    # final reads: each must equal the committed history
    final_values = []
    for f in finals:
        values = {r[3] for r in f.records}
        final_values.append((f.reader, values))
        for r in f.records:
            bad_value(r, f.reader, True, None)
        for value, s in sends.items():
            if _must_exist(s, txns) and value not in values:
                reused = _reused_by(s, at, sends, txns)
                if reused is not None:
                    pos = (s.topic, s.partition, s.offset)
                    out.add(Anomaly("reused-sequence", s.process, (pos + (value,), pos + (reused.value,)),
                                    f"{value!r} was {'committed' if s.txn else 'acknowledged'} at offset {s.offset}, "
                                    f"which holds {reused.value!r} (unknown outcome {reused.error}, aborted "
                                    f"transaction {reused.txn}) of the same producer: its sequence number was sent "
                                    "again and answered as a duplicate"))
                    continue
                off = s.offset if s.offset is not None else -1
                out.add(Anomaly("lost-write", f.reader, ((s.topic, s.partition, off, value),),
                                f"{value!r} was {'committed' if s.txn else 'acknowledged'} but {f.reader} lacks it"))
    if len(finals) > 1:
        union = set().union(*(v for _, v in final_values))
        for reader, values in final_values:
            for value in sorted(union - values):
                s = sends.get(value)
                if s is not None and not _must_exist(s, txns) and not _aborted(s, txns) and s.outcome != SEND_FAIL:
                    pos = sorted(observed[value])[0]
                    out.add(Anomaly("divergent-read", reader, (pos + (value,),),
                                    f"{value!r} (unknown outcome) is in another final read but not {reader}'s"))

    # the log as each isolation level sees it, for poll-skip
    committed_log: dict[tuple, set[int]] = defaultdict(set)
    for f in finals:
        for r in f.records:
            s = sends.get(r[3])
            if s is not None and s.outcome != SEND_FAIL and not _aborted(s, txns):  # not what the log should hold
                committed_log[(r[0], r[1])].add(r[2])
    uncommitted_log = defaultdict(set, {k: set(v) for k, v in committed_log.items()})
    for s in sends.values():
        if s.outcome == SEND_OK and s.offset is not None:
            uncommitted_log[(s.topic, s.partition)].add(s.offset)
    log_records = {p: v for p, vs in at.items() for v in vs}
    for s in sends.values():
        if s.outcome == SEND_OK and s.offset is not None:
            log_records.setdefault((s.topic, s.partition, s.offset), s.value)

    last: dict[str, dict[tuple, Record]] = defaultdict(dict)
    for ev in history.events:
        if isinstance(ev, Assign):
            last.pop(ev.process, None)
            continue
        if not isinstance(ev, Poll):
            continue
        rc = ev.isolation == READ_COMMITTED
        log = committed_log if rc else uncommitted_log
        seen = last[ev.process]
        for r in ev.records:
            r = tuple(r)
            bad_value(r, ev.process, rc, ev.t_end)
            tp = (r[0], r[1])
            prev = seen.get(tp)
            if prev is not None:
                if r[2] <= prev[2]:
                    out.add(Anomaly("nonmonotonic-poll", ev.process, (prev, r),
                                    f"offset {r[2]} read after {prev[2]} on {tp}"))
                else:
                    skipped = sorted(o for o in log.get(tp, ()) if prev[2] < o < r[2])
                    if skipped:
                        out.add(Anomaly("poll-skip", ev.process,
                                        (prev, *((tp[0], tp[1], o, log_records.get((tp[0], tp[1], o), "?"))
                                                 for o in skipped), r),
                                        f"{len(skipped)} record(s) between offsets {prev[2]} and {r[2]} unread"))
            seen[tp] = r
    out.update(_g1c(polls, sends))
    out.update(_consume_transform_produce(history, sends, txns, finals))
    return sorted(out)


def _consume_transform_produce(history: History, sends: dict[str, Send], txns: dict[str, Txn],
                               finals: list[FinalRead]) -> set[Anomaly]:
    """``missing-output``, ``lost-input`` and ``duplicate-output`` of each final read."""
    committed_offsets: dict[str, dict[tuple, int]] = defaultdict(dict)  # txn -> (topic, partition) -> next offset
    for c in history.of(OffsetCommit):
        if c.txn is not None:
            for t, p, o in c.offsets:
                committed_offsets[c.txn][(t, p)] = max(o, committed_offsets[c.txn].get((t, p), o))
    polled: dict[str, list] = defaultdict(list)  # committed txn -> input records its polls returned
    for p in history.of(Poll):
        if p.txn is not None and p.txn in txns and txns[p.txn].outcome == TXN_COMMIT:
            polled[p.txn].extend(tuple(r) for r in p.records)
    group_end: dict[tuple, int] = {}
    for f in history.of(FinalOffsets):
        for t, p, o in f.offsets:
            group_end[(t, p)] = max(o, group_end.get((t, p), o))
    if not polled and not group_end and not any(s.source is not None for s in sends.values()):
        return set()
    out: set[Anomaly] = set()
    for f in finals:
        outputs: dict[str, list] = defaultdict(list)  # source value -> its outputs in this read
        for r in f.records:
            s = sends.get(r[3])
            if s is not None and s.source is not None:
                outputs[s.source].append(tuple(r))
        for source, recs in outputs.items():
            if len(recs) > 1:
                out.add(Anomaly("duplicate-output", f.reader, tuple(sorted(recs)),
                                f"input {source!r} has {len(recs)} outputs in {f.reader}'s read"))
        explained = set()
        for txn, records in polled.items():
            ends = committed_offsets.get(txn, {})
            for r in records:
                if r[2] < ends.get((r[0], r[1]), -1) and r[3] not in outputs:
                    explained.add(r[3])
                    out.add(Anomaly("missing-output", f.reader, (r,),
                                    f"transaction {txn} committed offset {ends[(r[0], r[1])]} past {r[3]!r} "
                                    f"but {f.reader} has no output of it"))
        for r in f.records:
            s = sends.get(r[3])
            if (s is None or s.source is not None or _aborted(s, txns) or r[3] in outputs or r[3] in explained
                    or r[2] >= group_end.get((r[0], r[1]), -1)):
                continue
            out.add(Anomaly("lost-input", f.reader, (tuple(r),),
                            f"{r[3]!r} is below the group's committed offset {group_end[(r[0], r[1])]} "
                            f"but {f.reader} has no output of it"))
    return out


def _g1c(polls: list[Poll], sends: dict[str, Send]) -> set[Anomaly]:
    """Write-read cycles: one ``G1c`` per strongly connected set of 2+ transactions, with
    the records that make its edges."""
    edges: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))  # writer -> reader -> records
    for p in polls:
        if p.txn is None:
            continue
        for r in p.records:
            s = sends.get(r[3])
            if s is not None and s.txn is not None and s.txn != p.txn:
                edges[s.txn][p.txn].add(tuple(r))
    out = set()
    for component in _strongly_connected(edges):
        if len(component) > 1:
            recs = sorted(r for a in component for b, rs in edges[a].items() if b in component for r in rs)
            out.add(Anomaly("G1c", "", tuple(recs), f"transactions {sorted(component)} read each other's writes"))
    return out


def _strongly_connected(graph: dict[str, dict[str, set]]) -> list[set[str]]:
    """Tarjan's strongly connected components of ``graph`` (node -> successors), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[set[str]] = []
    nodes = sorted(set(graph) | {b for succ in graph.values() for b in succ})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, {})))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        n = stack.pop()
                        on_stack.discard(n)
                        component.add(n)
                        if n == node:
                            break
                    result.append(component)
    return result


def summarize(anomalies: list[Anomaly]) -> dict[str, int]:
    """Count of anomalies by kind: ``{kind: n}`` for every kind in :data:`KINDS` (zeros included)."""
    counts = Counter(a.kind for a in anomalies)
    return {k: counts.get(k, 0) for k in KINDS}
