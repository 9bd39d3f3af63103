"""Exactly-once copying by a consumer group of transactional workers (KIP-447), used by the
demo and the group copy test.

Every worker is a thread with one subscribed :class:`~txlake.Consumer` and one
transactional :class:`~txlake.Producer` (its own ``transactional.id``) that serves every
partition the worker owns, across rebalances -- no producer per partition, no re-init after
a rebalance. A transaction copies one ``consume()`` batch: the derived records, then the
input positions with ``send_offsets_to_transaction(positions, consumer_group_metadata())``,
then the commit. A worker that lost its partitions in a rebalance it has not seen yet is
refused by the group coordinator (ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID, abortable): it
aborts and rewinds to the committed offsets. A new owner of a partition starts only once
the previous owner's transaction is decided (its committed offsets are stable).

With a ``storage.url`` config the workers use txlake's in-process clients and run inside
the process that holds the storage root's writer lease (the group coordinator is there);
with ``bootstrap.servers`` they are real Kafka clients (confluent-kafka, e.g. through
``txlake serve``; :func:`txlake.copier.kafka_clients`). Run as a process::

    python -m txlake.group_copier - SOURCE TARGET GROUP --workers N
        [--join-later K] [--join-after-commits C] [--crash-worker W --crash-after-commits C]
        [--batch-records N]

or, one worker per process (``--worker I``: worker I alone; SIGUSR1 makes it crash at its
next transaction)::

    python -m txlake.group_copier - SOURCE TARGET GROUP --worker I [--batch-records N]

with the client config as one JSON line on stdin (``-``, as for :mod:`txlake.copier`).

Every event is one JSON line on stdout: ``started`` (worker), ``assigned``/``revoked``/``lost``
(worker, partitions), ``committed`` (worker, txn, records), ``aborted`` (worker, error),
``crashed`` (worker: its transaction is left open, its thread stops polling and it never
cleans up; the group notices after ``max.poll.interval.ms``), ``done`` (records per worker;
with ``--worker``: that worker's ``records``). A ``--worker`` process that crashed waits to
be killed: the group notices after ``session.timeout.ms``.
The derived record of source record (p, o) goes to target partition p, so each target
partition holds its source partition's records in order.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from typing import Any, Callable, Mapping

from .child_conf import load_conf
from .copier import derive, kafka_clients

#: the workers' consumer settings (small timeouts so that a crashed worker is noticed fast)
WORKER_CONSUMER_CONF = {"isolation.level": "read_committed", "auto.offset.reset": "earliest",
                        "enable.auto.commit": False, "partition.assignment.strategy": "cooperative-sticky",
                        "session.timeout.ms": 6000, "heartbeat.interval.ms": 200, "max.poll.interval.ms": 4000}
#: over the wire (confluent-kafka): librdkafka refuses a max.poll.interval.ms below session.timeout.ms
WIRE_CONSUMER_CONF = {**WORKER_CONSUMER_CONF, "max.poll.interval.ms": 6000}
#: fatal errors that mean another instance took this transactional.id over: the worker must stop, not replace its producer
FENCED = ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
#: how often a transaction's send_offsets / commit is retried on a retriable error (e.g. the broker restarting)
RETRIABLE_ATTEMPTS = 10


def worker_consumer_conf(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The workers' consumer settings for a client config (:data:`WIRE_CONSUMER_CONF` over the wire)."""
    return WIRE_CONSUMER_CONF if "bootstrap.servers" in conf else WORKER_CONSUMER_CONF


def _retrying(kafka, call: Callable[..., None], *args: Any) -> None:
    """``call(*args)``, again while it raises a retriable KafkaException (confluent-kafka's
    transactional API: "retriable: the call may be retried"), at most :data:`RETRIABLE_ATTEMPTS` times."""
    for attempt in range(RETRIABLE_ATTEMPTS):
        try:
            call(*args)
            return
        except kafka.KafkaException as exc:
            if not exc.args[0].retriable() or attempt == RETRIABLE_ATTEMPTS - 1:
                raise
            time.sleep(0.5)


class Worker:
    """One member of the copying group: a consumer and a transactional producer.

    Args:
        conf: client config (``storage.url`` ...).
        index: the worker number; its ``transactional.id`` is ``<group>-worker-<index>``, so a
            restarted worker fences its predecessor and aborts its open transaction.
        crash_after_commits: after this many commits, open one more transaction, write its
            records and stop without any cleanup (a crash) -- unless another worker sharing
            ``crash_token`` crashed already.
    """

    def __init__(self, conf: dict[str, Any], source: str, target: str, group: str, index: int,
                 emit: Callable[..., None], batch_records: int = 5_000, crash_after_commits: int | None = None,
                 crash_token: threading.Event | None = None):
        self.conf, self.source, self.target, self.group, self.index = conf, source, target, group, index
        self.emit, self.batch_records, self.crash_after_commits = emit, batch_records, crash_after_commits
        #: shared by the workers that may crash: only the first to get there does
        self.crash_token = crash_token or threading.Event()
        self.crashed = False
        #: set to make this worker crash at its next transaction (``--worker`` processes: SIGUSR1)
        self.crash_now = threading.Event()
        self.copied = 0
        self.commits = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"copier-worker-{index}", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self.thread.start()

    def _event(self, event: str, **fields: Any) -> None:
        self.emit(event, worker=self.index, **fields)

    def _run(self) -> None:
        try:
            self._copy()
        except BaseException as exc:  # reported to the driver, which fails the run
            self.error = exc
            self._event("failed", error=repr(exc))

    def _recover(self, kafka, producer, consumer, exc: BaseException, new_producer):
        """After a KafkaException in a transaction: abort it (abortable error) or replace the producer
        (a fatal error other than fencing: confluent-kafka's producer is then unusable; a new one with
        the same transactional.id fences it and aborts its open transaction), then rewind the consumer
        to the committed offsets; the producer to go on with. Anything else is raised again."""
        err = exc.args[0]
        if err.txn_requires_abort() and not err.fatal():
            try:
                producer.abort_transaction(60)
                self._event("aborted", error=err.name())
            except kafka.KafkaException as abort_exc:
                # the abort itself can fail fatally (the client and the restarted coordinator
                # disagree on the transaction: EndTxn INVALID_TXN_STATE); the producer is replaced
                err = abort_exc.args[0]
                if not err.fatal():
                    raise
        if err.fatal() and err.name() not in FENCED:
            self._event("producer-replaced", error=err.name())
            producer = new_producer()
        elif not err.txn_requires_abort():
            raise exc
        _rewind(kafka, consumer)   # copy those records again from the committed offsets
        return producer

    def _copy(self) -> None:
        kafka = kafka_clients(self.conf)

        def new_producer():
            p = kafka.Producer({**self.conf, "transactional.id": f"{self.group}-worker-{self.index}", "linger.ms": 5,
                                "transaction.timeout.ms": 10_000})
            _retrying(kafka, p.init_transactions, 60)
            return p

        producer = new_producer()
        consumer = kafka.Consumer({**self.conf, **worker_consumer_conf(self.conf), "group.id": self.group})

        def changed(kind: str):
            return lambda c, parts: self._event(kind, partitions=sorted(tp.partition for tp in parts))

        consumer.subscribe([self.source], on_assign=changed("assigned"), on_revoke=changed("revoked"),
                           on_lost=changed("lost"))
        self._event("started")
        crashed = False
        try:
            while not self.stop.is_set():
                msgs = [m for m in consumer.consume(self.batch_records, 0.2) if m.error() is None]
                if not msgs:
                    continue
                try:
                    producer.begin_transaction()
                    for m in msgs:
                        key, value = derive(m.value(), m.partition(), m.offset())
                        producer.produce(self.target, value=value, key=key, partition=m.partition())
                except kafka.KafkaException as exc:   # a fatal error the last transaction left, surfacing now
                    producer = self._recover(kafka, producer, consumer, exc, new_producer)
                    continue
                if self.crash_now.is_set() or (self.crash_after_commits is not None
                                               and self.commits >= self.crash_after_commits
                                               and not self.crash_token.is_set()):
                    self.crash_token.set()
                    self.crashed = True
                    producer.flush(60)
                    self._event("crashed", records=len(msgs))
                    crashed = True
                    return               # no abort, no close: the transaction stays open
                positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
                try:
                    producer.flush(60)   # a produce refused meanwhile fails the transaction before its offsets go
                    _retrying(kafka, producer.send_offsets_to_transaction, positions,
                              consumer.consumer_group_metadata(), 60)
                    _retrying(kafka, producer.commit_transaction, 60)
                except kafka.KafkaException as exc:
                    producer = self._recover(kafka, producer, consumer, exc, new_producer)
                    continue
                self.commits += 1
                self.copied += len(msgs)
                self._event("committed", txn=self.commits, records=len(msgs))
        finally:
            if not crashed:
                consumer.close()
                try:
                    producer.close()
                except kafka.KafkaException as exc:   # a fatal error it held: the worker's own error says more
                    self._event("close-failed", error=exc.args[0].name())


def _rewind(kafka, consumer) -> None:
    """Seek every assigned partition back to the group's committed offset (the beginning when it
    has none: ``auto.offset.reset`` is earliest). librdkafka cannot seek to OFFSET_STORED, so the
    committed offsets are fetched (OffsetFetch, require_stable under read_committed)."""
    for tp in consumer.committed(consumer.assignment(), timeout=60):
        offset = tp.offset if tp.offset >= 0 else kafka.OFFSET_BEGINNING
        consumer.seek(kafka.TopicPartition(tp.topic, tp.partition, offset))


def committed_offsets(conf: dict[str, Any], source: str, group: str) -> dict[int, int]:
    """The group's committed (stable) offset of every source partition (-1001 when none)."""
    kafka = kafka_clients(conf)
    with kafka.Consumer({**conf, "group.id": group}) as c:
        return _committed(kafka, c, source)


def _committed(kafka, c, source: str) -> dict[int, int]:
    parts = sorted(c.list_topics(source).topics[source].partitions)
    return {tp.partition: tp.offset for tp in c.committed([kafka.TopicPartition(source, p) for p in parts], timeout=120)}


def end_offsets(conf: dict[str, Any], source: str) -> dict[int, int]:
    """The read_committed end (LSO) of every source partition."""
    kafka = kafka_clients(conf)
    with kafka.Consumer({**conf, "group.id": "txlake-end-offsets", "isolation.level": "read_committed"}) as c:
        parts = sorted(c.list_topics(source).topics[source].partitions)
        return {p: c.get_watermark_offsets(kafka.TopicPartition(source, p), timeout=60)[1] for p in parts}


def wait_until_decided(conf: dict[str, Any], topic: str, timeout_s: float = 120) -> None:
    """Wait until no transaction is open on ``topic`` (LSO == high watermark on every partition):
    a crashed worker's transaction stays open until the coordinator aborts it at its timeout.

    Raises:
        RuntimeError: still undecided after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    kafka = kafka_clients(conf)
    conf = {**conf, "group.id": "txlake-wait-until-decided"}   # confluent-kafka's Consumer needs one
    with kafka.Consumer({**conf, "isolation.level": "read_committed"}) as committed, \
            kafka.Consumer({**conf, "isolation.level": "read_uncommitted"}) as uncommitted:
        parts = [kafka.TopicPartition(topic, p) for p in sorted(committed.list_topics(topic).topics[topic].partitions)]
        while any(committed.get_watermark_offsets(tp, timeout=60)[1] != uncommitted.get_watermark_offsets(tp, timeout=60)[1]
                  for tp in parts):
            if time.monotonic() > deadline:
                raise RuntimeError(f"transactions on {topic} still undecided after {timeout_s} s")
            time.sleep(0.2)


def run_group(conf: dict[str, Any], source: str, target: str, group: str, workers: int,
              emit: Callable[..., None], batch_records: int = 5_000, join_later: int = 0,
              join_after_commits: int = 0, crash_worker: int | None = None,
              crash_after_commits: int | None = None, timeout_s: float = 600) -> dict[int, int]:
    """Copy ``source`` to ``target`` with a group of ``workers`` threads until the group's
    committed offsets reach the end of ``source`` and every transaction on ``target`` is
    decided; return the records each worker copied.

    ``join_later`` of the workers start once ``join_after_commits`` transactions have been
    committed (a member joins: a rebalance); ``crash_worker`` crashes after
    ``crash_after_commits`` of its own commits (its partitions go to the others); with
    ``crash_worker=-1`` the first worker to reach that many commits crashes.

    Raises:
        RuntimeError: a worker failed, or the copy did not finish within ``timeout_s``.
    """
    ends = end_offsets(conf, source)
    token = threading.Event()
    crew = [Worker(conf, source, target, group, i, emit, batch_records,
                   crash_after_commits if crash_worker in (i, -1) else None, token) for i in range(workers)]
    for w in crew[:workers - join_later]:
        w.start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if any(w.error is not None for w in crew):
                raise RuntimeError(f"a worker failed: {[repr(w.error) for w in crew if w.error]}")
            if join_later and not crew[-1].thread.is_alive() and sum(w.commits for w in crew) >= join_after_commits:
                for w in crew[workers - join_later:]:
                    w.start()
            done = committed_offsets(conf, source, group)
            if all(done.get(p, -1) >= end for p, end in ends.items()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the group did not finish copying {source} in {timeout_s} s")
            time.sleep(0.5)
    finally:
        for w in crew:
            w.stop.set()
        for w in crew:
            if w.thread.ident and not w.crashed:
                w.thread.join(timeout=60)
    # a crashed worker's transaction stays open until this process's coordinator aborts it at its timeout
    wait_until_decided(conf, target, timeout_s)
    copied = {w.index: w.copied for w in crew}
    emit("done", copied=copied)
    return copied


def run_worker(conf: dict[str, Any], source: str, target: str, group: str, index: int,
               emit: Callable[..., None], batch_records: int = 5_000, timeout_s: float = 600) -> int:
    """Run worker ``index`` alone in this process until the group's committed offsets reach the
    end of ``source``; return the records it copied. SIGUSR1 makes it crash at its next
    transaction (records written and flushed, the transaction left open, no cleanup); it then
    waits to be killed.

    Raises:
        RuntimeError: the worker failed, or the group did not finish within ``timeout_s``.
    """
    kafka = kafka_clients(conf)
    worker = Worker(conf, source, target, group, index, emit, batch_records)
    signal.signal(signal.SIGUSR1, lambda *_: worker.crash_now.set())
    signal.signal(signal.SIGUSR2, lambda *_: worker.crash_now.clear())  # the crash is asked of another worker
    ends = end_offsets(conf, source)
    worker.start()
    deadline = time.monotonic() + timeout_s
    with kafka.Consumer({**conf, "group.id": group}) as checker:
        while True:
            if worker.error is not None:
                raise RuntimeError(f"worker {index} failed: {worker.error!r}")
            if worker.crashed:
                time.sleep(0.5)         # crashed: wait to be killed
                continue
            done = _committed(kafka, checker, source)
            if all(done.get(p, -1) >= end for p, end in ends.items()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the group did not finish copying {source} in {timeout_s} s")
            time.sleep(0.5)
    worker.stop.set()
    worker.thread.join(timeout=60)
    if worker.error is not None:
        raise RuntimeError(f"worker {index} failed: {worker.error!r}")
    emit("done", worker=index, records=worker.copied)
    return worker.copied


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the group process."""
    ap = argparse.ArgumentParser(prog="python -m txlake.group_copier")
    ap.add_argument("conf", help="- : the client config is one JSON line on stdin (or: the config as JSON)")
    ap.add_argument("source")
    ap.add_argument("target")
    ap.add_argument("group")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--worker", type=int, default=None,
                    help="run worker I alone in this process (SIGUSR1: crash at its next transaction; SIGUSR2: "
                         "not any more)")
    ap.add_argument("--join-later", type=int, default=0)
    ap.add_argument("--join-after-commits", type=int, default=0)
    ap.add_argument("--crash-worker", type=int, default=None, help="worker number, or -1: the first to get there")
    ap.add_argument("--crash-after-commits", type=int, default=None)
    ap.add_argument("--batch-records", type=int, default=5_000)
    args = ap.parse_args(argv)
    lock = threading.Lock()

    def emit(event: str, **fields: Any) -> None:
        with lock:
            sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
            sys.stdout.flush()

    if args.worker is not None:
        run_worker(load_conf(args.conf), args.source, args.target, args.group, args.worker, emit, args.batch_records)
        return 0
    run_group(load_conf(args.conf), args.source, args.target, args.group, args.workers, emit,
              args.batch_records, args.join_later, args.join_after_commits, args.crash_worker,
              args.crash_after_commits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
