"""The consume-transform-produce group of a verification trial (KIP-98, KIP-447).

A consumer group of members copies a trial's input topic (written by the trial's
producers) to an output topic, each member with a transactional producer of its own: poll a
batch (read_committed), begin a transaction, send one output per input record to the
output partition of the same number (value ``<input value>><transaction>``, so every send
stays unique and names its input: ``Send.source``), ``send_offsets_to_transaction`` the
batch's next offsets with ``consumer_group_metadata()`` (KIP-447: the coordinator fences a
member of an older generation), then commit -- or abort a seeded share, after which the
member seeks back to the batch's first offsets (Kafka's rule: after an abort the consumer
re-reads from the last committed offsets).

Rebalances, on a seeded schedule:

* members ``m0..m<n-1>`` start together; one of them (seeded) is a static member
  (``group.instance.id``, KIP-345) that is *killed* inside its k-th transaction, after
  ``send_offsets_to_transaction`` and before the commit: in-process its consumer and
  producer are abandoned without closing (the heartbeat thread keeps running, the
  transaction stays open); through a server it is a child process (:mod:`.ctp_proc`) that
  SIGKILLs itself. It is started again at once under the same ``transactional.id`` and
  ``group.instance.id``: the new ``init_transactions`` aborts the open transaction (KIP-98;
  recorded as ``aborted by init_transactions``) and the new consumer replaces the static
  member (KIP-345);
* after the kill, once the group has finished a seeded number (1-3) of transactions, a
  dynamic member ``m<n>`` joins, and leaves cleanly (close: LeaveGroup) a seeded 0.3-1 s later.

The group runs until the trial's writers are done, every input record that must exist
(acknowledged, or of a committed transaction) has an output sent in a committed transaction
and the joiner has left, or ``ctp_timeout_s`` passed; then the members close and the group's committed offsets are
read (:class:`~.history.FinalOffsets`). The checker's ``missing-output``, ``lost-input`` and
``duplicate-output`` kinds read this history.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

from .history import (SEND_OK, TXN_ABORT, TXN_COMMIT, TXN_INFO, Assign, FinalOffsets, History, OffsetCommit, Poll,
                      Send, Txn)

#: client settings of the members: a SIGKILLed dynamic member would hold its partitions for
#: session.timeout.ms (6 s, the broker's group.min.session.timeout.ms default); an abandoned
#: one that stops polling is dropped from a rebalance after max.poll.interval.ms
MEMBER_CONSUMER_CONF = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "max.poll.interval.ms": 10000}

#: settings of the group coordinator the trials want (``txlake serve --config``, or an embedded
#: broker's client config): no 3 s wait for more members when a group forms
GROUP_BROKER_SETTINGS = {"group.initial.rebalance.delay.ms": 0}

KILLED, LEFT, STOPPED = "killed", "left", "stopped"


@dataclass
class MemberPlan:
    """What one member does: its name, static or dynamic, the index of the transaction (its
    own, from 0) inside which it is killed (None: never), when it leaves cleanly (monotonic s;
    None: at the stop), the share of its transactions aborted, its batch size and its seed."""

    name: str
    static: bool = False
    kill_at: int | None = None
    leave_at: float | None = None
    abort_fraction: float = 0.2
    max_batch: int = 10
    seed: str = ""


def member_loop(conf: dict, history: History, topic_in: str, topic_out: str, group: str, process: str,
                plan: MemberPlan, stop: Callable[[], bool], unfinished: tuple[str, ...] = (),
                abandoned: list | None = None, self_kill: bool = False) -> str:
    """Run one member instance (``process``: its name in the history) until ``stop()`` is true
    (returns ``"stopped"``), its ``leave_at`` time (``"left"``: closed, so it leaves the group)
    or its ``kill_at`` transaction (``"killed"``: with ``self_kill`` the process SIGKILLs
    itself, else its clients are appended to ``abandoned`` unclosed).

    ``unfinished``: transactions a killed instance left open; recorded as aborted once this
    instance's ``init_transactions`` returned (KIP-98 aborts them).

    Raises:
        KafkaException: a client error outside a transaction's outcome (init, a fatal error).
    """
    from .workload import clients, init_transactions, polled_records

    k = clients(conf)
    rng = random.Random(f"{plan.seed}-{process}")
    producer = k.Producer({**conf, "transactional.id": f"{group}-{plan.name}", "linger.ms": 2,
                           "client.id": process})
    t0 = History.now()
    init_transactions(producer)
    for txn in unfinished:
        history.add(Txn(process, txn, TXN_ABORT, t0, History.now(), "aborted by init_transactions"))
    cconf = {**conf, **MEMBER_CONSUMER_CONF, "group.id": group, "enable.auto.commit": False,
             "isolation.level": "read_committed", "auto.offset.reset": "earliest", "client.id": process}
    if plan.static:
        cconf["group.instance.id"] = f"{group}-{plan.name}"
    consumer = k.Consumer(cconf)

    def on_assign(c, partitions) -> None:
        history.add(Assign(process, [(tp.topic, tp.partition, tp.offset) for tp in partitions], History.now()))

    def on_revoke(c, partitions) -> None:
        history.add(Assign(process, [], History.now()))

    consumer.subscribe([topic_in], on_assign=on_assign, on_revoke=on_revoke)
    n = 0
    try:
        while not stop():
            if plan.leave_at is not None and History.now() >= plan.leave_at:
                return LEFT
            t0 = History.now()
            msgs = polled_records(k, consumer.consume(plan.max_batch, 0.1))
            if not msgs:
                continue
            txn = f"{process}-T{n}"
            recs = [(m.topic(), m.partition(), m.offset(), m.value().decode()) for m in msgs]
            history.add(Poll(process, "read_committed", recs, t0, History.now(), txn=txn))
            commit = rng.random() >= plan.abort_fraction
            if not _transaction(k, producer, consumer, history, process, group, topic_out, txn, recs, commit,
                                plan.kill_at == n, self_kill):
                if abandoned is not None:
                    abandoned.append((consumer, producer))
                consumer = producer = None
                return KILLED
            n += 1
        return STOPPED
    finally:
        if consumer is not None:
            consumer.close()
            producer.flush(30)
            producer.close()


def _transaction(k, producer, consumer, history: History, process: str, group: str, topic_out: str, txn: str,
                 recs: list, commit: bool, kill: bool, self_kill: bool) -> bool:
    """One transaction copying ``recs``; False when the member is killed inside it."""
    from .workload import end_transaction, send_value

    ends: dict[tuple, int] = {}
    for t, p, o, _ in recs:
        ends[(t, p)] = max(ends.get((t, p), 0), o + 1)
    t1 = History.now()
    try:
        producer.begin_transaction()
        for _, p, _, value in recs:
            send_value(k, producer, history, process, topic_out, p, f"{value}>{txn}", txn, attempts=True,
                  source=value)
        producer.send_offsets_to_transaction([k.TopicPartition(t, p, o) for (t, p), o in sorted(ends.items())],
                                             consumer.consumer_group_metadata(), 30)
        history.add(OffsetCommit(process, group, [(t, p, o) for (t, p), o in sorted(ends.items())], txn,
                                 History.now()))
        if kill:
            if self_kill:
                os.kill(os.getpid(), signal.SIGKILL)
            return False
        t1 = History.now()
        end_transaction(producer, history, process, txn, commit, True, t1)
    except k.KafkaException as exc:
        err = exc.args[0]
        if err.fatal() or not err.txn_requires_abort():
            history.add(Txn(process, txn, TXN_INFO, t1, History.now(), err.name()))
            raise
        producer.abort_transaction(30)  # e.g. a rebalance fenced the offsets (KIP-447)
        history.add(Txn(process, txn, TXN_ABORT, t1, History.now(), f"{err.name()}, aborted"))
        commit = False
    if not commit:  # re-read the batch: the group's offsets did not move
        starts: dict[tuple, int] = {}
        for t, p, o, _ in recs:
            starts[(t, p)] = min(starts.get((t, p), o), o)
        history.add(Assign(process, [(t, p, o) for (t, p), o in sorted(starts.items())], History.now()))
        for (t, p), o in sorted(starts.items()):
            try:
                consumer.seek(k.TopicPartition(t, p, o))
            except k.KafkaException:  # no longer assigned: its new owner starts from the committed offset
                pass
    return True


def copied_everything(events: list, topic_in: str) -> bool:
    """True when every input record of ``topic_in`` that must exist (acknowledged outside a
    transaction, or of a committed one) has an output sent in a committed transaction."""
    txns = {e.txn: e.outcome for e in events if isinstance(e, Txn)}
    sends = [e for e in events if isinstance(e, Send)]
    copied = {s.source for s in sends if s.source is not None and txns.get(s.txn) == TXN_COMMIT}
    for s in sends:
        if s.source is None and s.topic == topic_in and s.value not in copied:
            if (s.outcome == SEND_OK and s.txn is None) or (s.txn is not None and txns.get(s.txn) == TXN_COMMIT):
                return False
    return True


def plans(seed: int, members: int, abort_fraction: float, max_batch: int) -> tuple[list[MemberPlan], MemberPlan, int]:
    """``(initial members, the joiner, group transactions before it joins)`` of a seeded schedule:
    one initial member (seeded) static and killed inside its transaction 0 or 1."""
    rng = random.Random(f"{seed}-ctp")
    victim = rng.randrange(members)
    initial = [MemberPlan(f"m{i}", static=i == victim, kill_at=rng.randrange(2) if i == victim else None,
                          abort_fraction=abort_fraction, max_batch=max_batch, seed=str(seed)) for i in range(members)]
    joiner = MemberPlan(f"m{members}", abort_fraction=abort_fraction, max_batch=max_batch, seed=str(seed))
    joiner.leave_at = rng.uniform(0.3, 1.0)  # relative to its start; made absolute when it starts
    return initial, joiner, rng.randrange(1, 4)


def run_group(conf: dict, history: History, topic_in: str, topic_out: str, partitions: int, seed: int,
              members: int, abort_fraction: float, max_batch: int, writers_done: threading.Event,
              timeout_s: float, process_dir: str | None, faults: dict) -> None:
    """Run the group (module docstring) to its end and record its final committed offsets.

    Args:
        conf: client config (``storage.url``: members are threads; ``bootstrap.servers``:
            with ``process_dir``, members are child processes keeping their histories there).
        members: initial members (>= 2 for rebalances among them).
        writers_done: set when the trial's writers finished.
        timeout_s: after the writers finished, stop the group anyway after this long (s).
        faults: counts by kind of the faults this group injected (``ctp.member.kill``), updated.

    Raises:
        RuntimeError / KafkaException: a member failed outside what the history records.
    """
    from .workload import clients

    group = f"{topic_in}-ctp"
    initial, joiner, join_after = plans(seed, members, abort_fraction, max_batch)
    stop = threading.Event()
    abandoned: list = []
    errors: list[BaseException] = []
    sinks: list[str] = []

    def events() -> list:
        evs = list(history.events)
        for path in list(sinks):
            evs += _load_sink(path)
        return evs

    def member(plan: MemberPlan) -> None:
        incarnation, unfinished = 0, ()
        try:
            while True:
                process = plan.name if incarnation == 0 else f"{plan.name}.{incarnation}"
                if process_dir is None:
                    result = member_loop(conf, history, topic_in, topic_out, group, process, plan, stop.is_set,
                                         unfinished, abandoned)
                    killed_txn = _open_txn(history.events, process)
                else:
                    result, killed_txn = _member_process(conf, topic_in, topic_out, group, process, plan, stop,
                                                         unfinished, process_dir, sinks)
                if result != KILLED:
                    return
                faults["ctp.member.kill"] = faults.get("ctp.member.kill", 0) + 1
                plan = MemberPlan(**{**plan.__dict__, "kill_at": None})
                incarnation, unfinished = incarnation + 1, ((killed_txn,) if killed_txn else ())
        except BaseException as exc:  # noqa: BLE001 - re-raised by run_group below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=member, args=(p,), name=p.name) for p in initial]
    for t in threads:
        t.start()
    started_joiner = False
    deadline = None
    while True:
        time.sleep(0.05)
        evs = events()
        if not started_joiner and ((faults.get("ctp.member.kill") and sum(
                1 for e in evs if isinstance(e, Txn) and e.txn.startswith("m") and e.outcome != TXN_INFO) >= join_after)
                or writers_done.is_set()):  # after the kill (or once nothing more comes)
            joiner.leave_at += History.now()
            threads.append(threading.Thread(target=member, args=(joiner,), name=joiner.name))
            threads[-1].start()
            started_joiner = True
        if errors:
            break
        if writers_done.is_set():
            deadline = deadline or History.now() + timeout_s
            if (copied_everything(evs, topic_in) and not threads[-1].is_alive()) or History.now() > deadline:
                break
    stop.set()
    for t in threads:
        t.join()
    for consumer, producer in abandoned:  # the killed instances' clients: released now, after the trial
        for close in (consumer.close, producer.close):
            try:
                close()
            except Exception:  # noqa: BLE001 - fenced or replaced: nothing to release cleanly
                pass
    for path in sinks:
        for e in _load_sink(path):
            history.add(e)
    if errors:
        raise errors[0]
    k = clients(conf)
    c = k.Consumer({**conf, "group.id": group, "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        committed = c.committed([k.TopicPartition(topic_in, p) for p in range(partitions)], timeout=30)
    finally:
        c.close()
    history.add(FinalOffsets(group, [(tp.topic, tp.partition, tp.offset) for tp in committed if tp.offset >= 0]))


def _open_txn(events: list, process: str) -> str | None:
    """The transaction ``process`` began (sent in, or sent offsets in) but never ended nor
    invoked the end of, if any."""
    begun = [e.txn for e in events if isinstance(e, (Send, OffsetCommit)) and e.process == process and e.txn]
    ended = {e.txn for e in events if isinstance(e, Txn) and e.process == process}
    open_ = [t for t in begun if t not in ended]
    return open_[-1] if open_ else None


def _load_sink(path: str) -> list:
    if not os.path.exists(path):
        return []
    with open(path) as fp:
        lines = fp.readlines()
    import io

    return History.load(io.StringIO("".join(line for line in lines if line.endswith("\n")))).events


def _member_process(conf: dict, topic_in: str, topic_out: str, group: str, process: str, plan: MemberPlan,
                    stop: threading.Event, unfinished: tuple, process_dir: str, sinks: list) -> tuple[str, str | None]:
    """Run one member instance as a child process (:mod:`.ctp_proc`) until it exits; ``stop``
    is passed on as a file. Returns ``(result, its open transaction when killed)``.

    Raises:
        RuntimeError: the child exited otherwise than 0 or by its own SIGKILL."""
    import subprocess
    import sys

    sink = os.path.join(process_dir, f"{topic_in}-{process}.jsonl")
    stop_file = os.path.join(process_dir, f"{topic_in}-ctp.stop")
    sinks.append(sink)
    args = [sys.executable, "-m", "txlake.verify.ctp_proc", json.dumps(conf),
            json.dumps(dict(topic_in=topic_in, topic_out=topic_out, group=group, process=process,
                            plan=plan.__dict__, unfinished=list(unfinished))), sink, stop_file]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def forward_stop() -> None:
        stop.wait()
        with open(stop_file, "w"):
            pass
    threading.Thread(target=forward_stop, daemon=True).start()
    out, err = proc.communicate(timeout=300)
    if proc.returncode == -signal.SIGKILL and plan.kill_at is not None:
        return KILLED, _open_txn(_load_sink(sink), process)
    if proc.returncode != 0:
        raise RuntimeError(f"member {process} exited {proc.returncode}: {err[-3000:]}")
    return out.strip() or STOPPED, None
