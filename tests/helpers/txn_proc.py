"""A transactional txlake writer process for the crash tests, driven by JSON lines on stdin.

Run as ``python txn_proc.py -`` with the spec as the first line of stdin (it holds the storage
options: never on the command line; ``'<spec json>'`` in place of ``-`` works too), where the spec is::

    {"conf": {"storage.url": ..., "storage.options": {...}, "storage.lease.ms": ...,
              "transaction.state.log.num.partitions": 3, ...},
     "producer_conf": {...}}      # extra keys for the transactional Producer only (optional)

Every answer is one JSON object per line on stdout, flushed at once, so a test that
SIGKILLs this process still reads everything it printed before the kill. Commands
(``{"cmd": ...}``):

``create_topic`` (topic, partitions)         -> ``created``
``init`` (transactional_id[, timeout])       -> ``initialized`` (producer_id, epoch): a transactional
                                                Producer and its init_transactions
``begin``                                    -> ``begun``
``produce`` (topic, values[, partitions])    -> ``produced`` (records flushed, i.e. durable, and
                                                their delivery reports); ``partitions`` gives the
                                                partition of each value (default: all on 0)
``commit`` / ``abort``                       -> ``committed`` / ``aborted``
``arm`` (point)                              -> ``armed``: install a crash point in THIS process
                                                (see :func:`arm`); at the point it prints
                                                ``crashing`` and SIGKILLs itself
``recover`` (transactional_ids)              -> ``recovered``: start the storage root's
                                                transaction coordinator (it replays
                                                ``__transaction_state`` and completes what
                                                was left in PrepareCommit/PrepareAbort) and
                                                report its state for each id
``chaos`` (transactional_id, topic, start, records, partitions[, count])
                                             -> a loop of transactions k = start, start+1, ...:
                                                ``begin`` k, ``committing``/``aborting`` k,
                                                ``committed``/``aborted`` k (see :func:`chaos`);
                                                ``chaos_done`` after ``count`` of them
``produce_during_commit`` (topic)            -> ``produced_both``: the deadlock probe (see
                                                :meth:`Txn.produce_during_commit`)
``close``                                    -> ``closed`` (every client and engine closed)
``os_exit``                                  -> ``exiting_now``, then ``os._exit(0)``: exit code 0
                                                but nothing is closed, flushed or released (an
                                                open transaction stays open, the lease stays held)

End of stdin ends the process (interpreter exit closes the engines).

The crash points are test code living only in this process (monkeypatches); the
library has no test hooks.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback

_out_lock = threading.Lock()


def emit(event: str, **fields) -> None:
    """Print one event line and flush it."""
    line = json.dumps({"event": event, **fields})
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def die(point: str, **fields) -> None:
    """Say where we crash, then SIGKILL this very process (no cleanup of any kind runs)."""
    emit("crashing", point=point, **fields)
    os.kill(os.getpid(), signal.SIGKILL)


#: where ``arm`` can make this process die
CRASH_POINTS = ("after_prepare", "after_first_marker", "before_complete")


def arm(point: str) -> None:
    """Install a crash point into this process's engine classes.

    EndTxn queues PrepareCommit/PrepareAbort, the markers and CompleteCommit/CompleteAbort back
    to back, and they usually commit together; but the flusher may take the queue between any
    two of them, so each intermediate state below can be left by a real crash. The crash
    points commit what is queued (``broker.flush()``) to leave exactly that state:

    * ``after_prepare``: PrepareCommit/PrepareAbort is durable; die when the coordinator asks
      the broker to queue the markers, before any marker is written.
    * ``after_first_marker``: write the markers to the first partition of the transaction
      only (durably: it waits for their catalog commit), then die.
    * ``before_complete``: every marker is written; die when the coordinator queues
      CompleteCommit/CompleteAbort to ``__transaction_state``, before it is written.
    """
    from txlake.engine.broker import Broker
    from txlake.engine.transaction_metadata import TransactionState
    from txlake.engine.transaction_state_manager import TransactionStateManager

    if point == "after_prepare":
        def append_txn_markers(broker, markers, *args, **kwargs):
            broker.flush()  # the queued Prepare record commits
            die(point, markers=[[m.producer_id, m.producer_epoch, m.committed, [list(tp) for tp in m.partitions]]
                                for m in markers])

        Broker.append_txn_markers = append_txn_markers
    elif point == "after_first_marker":
        original = Broker.append_txn_markers

        def append_txn_markers(broker, markers, *args, **kwargs):
            (m,) = markers
            first = m.partitions[:1]
            queued = original(broker, [type(m)(m.producer_id, m.producer_epoch, m.coordinator_epoch, m.committed,
                                               first)], *args, **kwargs)
            answer = Broker.await_txn_markers(queued)
            die(point, written=[[tp[0], tp[1], e.name] for tp, e in answer[0].items()],
                pending=[list(tp) for tp in m.partitions[1:]])

        Broker.append_txn_markers = append_txn_markers
    elif point == "before_complete":
        original = TransactionStateManager.queue_transaction_to_log
        complete = (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)

        def queue_transaction_to_log(manager, transactional_id, coordinator_epoch, transit, *args, **kwargs):
            if transit.txn_state in complete:
                manager.txn_log.writer.flush()  # the queued markers commit; the Complete record never does
                die(point, state=transit.txn_state.state_name)
            return original(manager, transactional_id, coordinator_epoch, transit, *args, **kwargs)

        TransactionStateManager.queue_transaction_to_log = queue_transaction_to_log
    else:
        raise ValueError(f"unknown crash point {point!r} (one of {CRASH_POINTS})")


class Txn:
    """The clients of this process, created on first use."""

    def __init__(self, spec: dict):
        self.conf = dict(spec["conf"])
        self.producer_conf = dict(spec.get("producer_conf") or {})
        self.admin = None
        self.producer = None
        self.broker = None

    def get_broker(self):
        from txlake.config import parse_config
        from txlake.engine.registry import acquire_broker

        if self.broker is None:
            cfg = parse_config(self.conf, "admin")
            self.broker = acquire_broker(cfg.storage_url, cfg.storage_options, cfg.broker_config())
        return self.broker

    # -- commands ----------------------------------------------------------------
    def create_topic(self, topic: str, partitions: int = 1) -> None:
        from txlake import AdminClient, NewTopic

        if self.admin is None:
            self.admin = AdminClient(self.conf)
        self.admin.create_topics([NewTopic(topic, num_partitions=partitions)])[topic].result()
        emit("created", topic=topic)

    def init(self, transactional_id: str, timeout: float = 30) -> None:
        from txlake import Producer

        self.producer = Producer({**self.conf, **self.producer_conf, "transactional.id": transactional_id})
        self.producer.init_transactions(timeout)
        txn = self.producer._txn  # (the client's producer id and epoch, for the test's assertions)
        emit("initialized", producer_id=txn.producer_id, epoch=txn.epoch)

    def begin(self) -> None:
        self.producer.begin_transaction()
        emit("begun")

    def produce(self, topic: str, values: list[str], partitions: list[int] | None = None) -> None:
        reports: list = []

        def on_delivery(err, msg) -> None:
            reports.append([msg.partition(), msg.offset(), msg.value().decode(), None if err is None else err.name()])

        for i, value in enumerate(values):
            self.producer.produce(topic, value=value.encode(), partition=partitions[i] if partitions else 0,
                                  on_delivery=on_delivery)
        left = self.producer.flush(30)
        emit("produced", left=left, reports=reports)

    def commit(self, timeout: float = 30) -> None:
        self.producer.commit_transaction(timeout)
        emit("committed")

    def abort(self, timeout: float = 30) -> None:
        self.producer.abort_transaction(timeout)
        emit("aborted")

    def arm(self, point: str) -> None:
        arm(point)
        emit("armed", point=point)

    def recover(self, transactional_ids: list[str]) -> None:
        coordinator = self.get_broker().transaction_coordinator()
        states = {}
        for tid in transactional_ids:
            found = coordinator.state.get_transaction_state(tid)
            if found is None:
                states[tid] = None
                continue
            md = found.transaction_metadata
            with md.lock:
                states[tid] = {"state": md.state.state_name, "producer_id": md.producer_id,
                               "epoch": md.producer_epoch, "pending": md.pending_state is not None,
                               "partitions": sorted([list(tp) for tp in md.topic_partitions]),
                               "coordinator_epoch": found.coordinator_epoch}
        emit("recovered", states=states)

    def chaos(self, transactional_id: str, topic: str, start: int, records: int, partitions: int,
              count: int | None = None) -> None:
        """Transactions k = start, start+1, ...: ``records`` values ``txn-<k>-<i>`` spread over
        ``partitions`` partitions; k % 3 == 0 is aborted, every other one committed."""
        from txlake import Producer

        self.producer = Producer({**self.conf, **self.producer_conf, "transactional.id": transactional_id})
        self.producer.init_transactions(30)
        emit("initialized", producer_id=self.producer._txn.producer_id, epoch=self.producer._txn.epoch)
        k = start
        while count is None or k < start + count:
            emit("begin", k=k)
            self.producer.begin_transaction()
            for i in range(records):
                self.producer.produce(topic, value=f"txn-{k}-{i}".encode(), partition=i % partitions)
            if k % 3 == 0:
                emit("aborting", k=k)
                self.producer.abort_transaction(30)
                emit("aborted", k=k)
            else:
                emit("committing", k=k)
                self.producer.commit_transaction(30)
                emit("committed", k=k)
            k += 1
        emit("chaos_done", next=k)

    def produce_during_commit(self, topic: str) -> None:
        """Write a record to partition 0 of ``topic``, then -- while the catalog commit of that
        record's batch is in progress (held 0.5 s here) -- the first record to partition 1,
        which makes the producer add partition 1 to the transaction (AddPartitionsToTxn).

        Needs an initialized producer inside a transaction, with ``linger.ms`` 0 so the first
        batch is sent at once. Prints ``produced_both`` when both produce() calls returned.
        """
        from txlake.catalog.catalog import Catalog

        original = Catalog.commit
        committing = threading.Event()

        def commit(catalog, actions, lease_epoch):
            if not committing.is_set() and any(a.get("action") == "add_segment" and a.get("topic") == topic
                                               for a in actions):
                committing.set()
                time.sleep(0.5)
            return original(catalog, actions, lease_epoch)

        Catalog.commit = commit
        self.producer.produce(topic, value=b"first", partition=0)
        if not committing.wait(10):
            raise RuntimeError("the batch of partition 0 was never committed")
        emit("committing_first")
        self.producer.produce(topic, value=b"second", partition=1)
        emit("produced_both")

    def close(self) -> None:
        for client in (self.producer, self.admin):
            if client is not None:
                client.close()
        self.producer = self.admin = None
        if self.broker is not None:
            from txlake.engine.registry import release_broker

            release_broker(self.broker)
            self.broker = None
        emit("closed")

    def os_exit(self) -> None:
        emit("exiting_now")
        os._exit(0)


def main() -> None:
    from txlake.child_conf import load_conf

    spec = load_conf(sys.argv[1])  # '-': the first line of stdin (it holds the storage options)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack to stderr
    import txlake  # noqa: F401 - import before saying "started", so a pre-started process is ready
    from txlake.engine import broker  # noqa: F401

    if str(spec["conf"].get("storage.url", "")).startswith("s3"):
        import s3fs  # noqa: F401
    txn = Txn(spec)
    emit("started", pid=os.getpid())
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        cmd = msg.pop("cmd")
        try:
            getattr(txn, cmd)(**msg)
        except Exception as exc:  # reported to the test, which decides
            kafka_error = exc.args[0] if exc.args and hasattr(exc.args[0], "code") else None
            emit("error", cmd=cmd, message=str(exc), type=type(exc).__name__, trace=traceback.format_exc(),
                 code=kafka_error.code() if kafka_error is not None else None)
    emit("exiting")


if __name__ == "__main__":
    main()
