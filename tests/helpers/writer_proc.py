"""A txlake writer process for the tests, driven by JSON lines on stdin.

Run as ``python writer_proc.py -`` with the spec as the first line of stdin (it holds the storage
options: never on the command line; ``'<spec json>'`` in place of ``-`` works too), where the spec is::

    {"conf": {"storage.url": ..., "storage.options": {...}, "storage.lease.ms": ...},
     "producer_conf": {...}}      # extra keys for the Producer only (optional)

Every answer is one JSON object per line on stdout, flushed at once, so a test that
SIGKILLs this process still reads everything it printed. ``{"event": "ack", ...}``
lines are delivery reports of records that are committed (the Producer serves a
report only after the catalog commit, acks=all). Commands (``{"cmd": ...}``):

``create_topic`` (topic, partitions)          -> ``created``
``produce`` (topic, n, prefix[, partition])   -> ``ack``/``ack_error`` per record, then ``produced``
``stream`` (topic, prefix[, pause_ms, batch]) -> ``streaming``; then acks until ``stop_stream``
``stop_stream``                               -> ``stream_stopped``
``init_pid``                                  -> ``pid`` (broker InitProducerId)
``broker_produce`` (topic, partition, values, producer_id, producer_epoch, base_sequence)
                                              -> ``produce_result``
``crash_before_commit``                       -> ``armed``: the next catalog commit that adds a
                                                 segment SIGKILLs this process first (its data
                                                 object is already written: a crash between
                                                 data object and commit)
``compact`` ([topics, dry_run])                -> ``compacted`` (the CompactionSummary's fields)
``crash_in_compaction`` (point)               -> ``armed``: the next compaction swap commit (one that
                                                 removes and adds segments) SIGKILLs this process
                                                 ``before_commit`` (its new objects are written) or
                                                 ``after_commit`` (committed, nothing deleted yet)
``close``                                     -> ``closed`` (every client and broker closed)
``exit`` (code)                               -> ``exiting``, then ``sys.exit`` without closing
                                                 anything (interpreter exit runs atexit)

End of stdin ends the process like ``exit``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
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


class Writer:
    """The clients of this process, created on first use."""

    def __init__(self, spec: dict):
        self.conf = dict(spec["conf"])
        self.producer_conf = dict(spec.get("producer_conf") or {})
        self.admin = None
        self.producer = None
        self.broker = None
        self.stream_thread: threading.Thread | None = None
        self.stream_stop = threading.Event()
        self.stream_count = 0

    # -- clients -----------------------------------------------------------------
    def get_admin(self):
        from txlake import AdminClient

        if self.admin is None:
            self.admin = AdminClient(self.conf)
        return self.admin

    def get_producer(self):
        from txlake import Producer

        if self.producer is None:
            self.producer = Producer({**self.conf, **self.producer_conf})
        return self.producer

    def get_broker(self):
        from txlake.engine.registry import acquire_broker
        from txlake.config import parse_config

        if self.broker is None:
            cfg = parse_config(self.conf, "admin")
            self.broker = acquire_broker(cfg.storage_url, cfg.storage_options, cfg.broker_config())
        return self.broker

    @staticmethod
    def on_delivery(err, msg) -> None:
        value = msg.value().decode() if msg.value() is not None else None
        if err is None:
            emit("ack", topic=msg.topic(), partition=msg.partition(), offset=msg.offset(), value=value)
        else:
            emit("ack_error", topic=msg.topic(), partition=msg.partition(), value=value,
                 code=err.code(), name=err.name(), fatal=err.fatal(), message=err.str())

    # -- commands ----------------------------------------------------------------
    def create_topic(self, topic: str, partitions: int = 1) -> None:
        from txlake import NewTopic

        fut = self.get_admin().create_topics([NewTopic(topic, num_partitions=partitions)])[topic]
        try:
            fut.result()
            emit("created", topic=topic, error=None)
        except Exception as exc:  # reported to the test
            emit("created", topic=topic, error=str(exc), code=exc.args[0].code() if exc.args else None)

    def produce(self, topic: str, n: int, prefix: str, partition: int = -1) -> None:
        p = self.get_producer()
        errors = 0
        for i in range(n):
            try:
                p.produce(topic, value=f"{prefix}-{i}".encode(), key=f"k{i}".encode(), partition=partition,
                          on_delivery=self.on_delivery)
            except Exception as exc:
                errors += 1
                emit("produce_error", value=f"{prefix}-{i}", message=str(exc),
                     code=exc.args[0].code() if exc.args and hasattr(exc.args[0], "code") else None)
            p.poll(0)
        left = p.flush(30)
        emit("produced", prefix=prefix, n=n, errors=errors, left=left)

    def stream(self, topic: str, prefix: str, pause_ms: float = 0.0, batch: int = 20) -> None:
        p = self.get_producer()
        self.stream_stop.clear()

        def run() -> None:
            i = 0
            try:
                while not self.stream_stop.is_set():
                    for _ in range(batch):
                        p.produce(topic, value=f"{prefix}-{i}".encode(), key=f"k{i}".encode(),
                                  on_delivery=self.on_delivery)
                        i += 1
                    p.poll(0)
                    while len(p) > 2000 and not self.stream_stop.is_set():
                        p.poll(0.01)
                    if pause_ms:
                        time.sleep(pause_ms / 1000)
                p.flush(30)
            except Exception as exc:  # reported to the test
                emit("stream_error", message=str(exc), trace=traceback.format_exc())
            self.stream_count = i

        self.stream_thread = threading.Thread(target=run, name="stream", daemon=True)
        self.stream_thread.start()
        emit("streaming", prefix=prefix)

    def stop_stream(self) -> None:
        if self.stream_thread is not None:
            self.stream_stop.set()
            self.stream_thread.join()
            self.stream_thread = None
        emit("stream_stopped", count=self.stream_count)

    def init_pid(self) -> None:
        err, pid, epoch = self.get_broker().init_producer_id()
        emit("pid", error=int(err), producer_id=pid, producer_epoch=epoch)

    def broker_produce(self, topic: str, partition: int, values: list[str], producer_id: int,
                       producer_epoch: int, base_sequence: int) -> None:
        import pyarrow as pa

        from txlake.engine.broker import ProduceBatch
        from txlake.formats.records import PAYLOAD_SCHEMA

        records = pa.Table.from_pylist(
            [{"timestamp": 1_700_000_000_000 + i, "key": None, "value": v.encode(), "headers": None}
             for i, v in enumerate(values)], schema=PAYLOAD_SCHEMA)
        (res,) = self.get_broker().produce([ProduceBatch(topic, partition, records, producer_id, producer_epoch,
                                                         base_sequence)])
        emit("produce_result", error=int(res.error), base_offset=res.base_offset, duplicate=res.duplicate,
             message=res.message)

    def crash_before_commit(self) -> None:
        from txlake.catalog.catalog import Catalog

        original = Catalog.commit

        def commit(catalog, actions, lease_epoch):
            if any(a.get("action") == "add_segment" for a in actions):
                paths = sorted({a["path"] for a in actions if a.get("action") == "add_segment"})
                emit("crashing", paths=paths)
                os.kill(os.getpid(), signal.SIGKILL)
            return original(catalog, actions, lease_epoch)

        Catalog.commit = commit
        emit("armed")

    def compact(self, topics: list[str] | None = None, dry_run: bool = False) -> None:
        import dataclasses

        from txlake.engine.compaction import compact

        summary = compact(self.get_broker(), topics, dry_run=dry_run)
        emit("compacted", **dataclasses.asdict(summary))

    def crash_in_compaction(self, point: str) -> None:
        from txlake.catalog.catalog import Catalog

        assert point in ("before_commit", "after_commit"), point
        original = Catalog.commit

        def commit(catalog, actions, lease_epoch):
            kinds = {a.get("action") for a in actions}
            if not {"remove_segment", "add_segment"} <= kinds:
                return original(catalog, actions, lease_epoch)
            new = sorted({a["path"] for a in actions if a.get("action") == "add_segment"})
            if point == "after_commit":
                original(catalog, actions, lease_epoch)
            emit("crashing", point=point, paths=new)
            os.kill(os.getpid(), signal.SIGKILL)

        Catalog.commit = commit
        emit("armed")

    def close(self) -> None:
        if self.stream_thread is not None:
            self.stream_stop.set()
            self.stream_thread.join()
            self.stream_thread = None
        if self.producer is not None:
            self.producer.close()
            self.producer = None
        if self.admin is not None:
            self.admin.close()
            self.admin = None
        if self.broker is not None:
            from txlake.engine.registry import release_broker

            release_broker(self.broker)
            self.broker = None
        emit("closed")


def main() -> None:
    from txlake.child_conf import load_conf

    spec = load_conf(sys.argv[1])  # '-': the first line of stdin (it holds the storage options)
    import txlake  # noqa: F401 - import before saying "started", so a pre-started process is ready
    from txlake.engine import broker  # noqa: F401

    if str(spec["conf"].get("storage.url", "")).startswith("s3"):
        import s3fs  # noqa: F401
    writer = Writer(spec)
    emit("started", pid=os.getpid(), host=socket.gethostname())
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        cmd = msg.pop("cmd")
        if cmd == "exit":
            emit("exiting")
            sys.exit(msg.get("code", 0))
        try:
            getattr(writer, cmd)(**msg)
        except Exception as exc:  # reported to the test, which decides
            emit("error", cmd=cmd, message=str(exc), type=type(exc).__name__, trace=traceback.format_exc())
    emit("exiting")


if __name__ == "__main__":
    main()
