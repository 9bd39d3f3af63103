"""Test helpers: real writer processes (``writer_proc.py``) and pure-reader views of a root.

:class:`WriterProcess` runs ``writer_proc.py`` with the venv's Python, sends it JSON
commands and collects its JSON event lines (read by a thread, so a test waits for a
line instead of sleeping). The :func:`writer_procs` fixture starts them and kills every
one still alive at teardown, then closes the engines the test opened in-process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import pytest

HELPER = str(Path(__file__).resolve().parent / "writer_proc.py")


class WriterProcess:
    """A ``writer_proc.py`` subprocess on one storage root.

    Args:
        storage: the ``storage`` fixture's target (``.url``, ``.options``).
        conf: extra client config (``storage.lease.ms``, ...).
        producer_conf: extra config of its Producer only.
    """

    #: the script the process runs (subclasses drive other helper scripts the same way)
    script = HELPER

    def __init__(self, storage, conf: dict | None = None, producer_conf: dict | None = None):
        from txlake.child_conf import start_with_conf

        spec = self.spec(storage, conf, producer_conf)
        self.events: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        self._cond = threading.Condition()
        args, first_line = self.command(spec)
        # the spec holds the storage options (credentials): the first stdin line, never the command line
        self.proc = start_with_conf(args, first_line, keep_stdin=True, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.proc.pid
        self._out = threading.Thread(target=self._read_stdout, daemon=True)
        self._err = threading.Thread(target=self._read_stderr, daemon=True)
        self._out.start()
        self._err.start()
        self._started: dict | None = None

    def command(self, spec: dict) -> tuple[list[str], dict]:
        """The command line (``-`` where the spec goes) and the JSON object sent as the first line
        of the process's stdin (:func:`txlake.child_conf.start_with_conf`); commands follow it."""
        from txlake.child_conf import FROM_STDIN

        return [sys.executable, self.script, FROM_STDIN], spec

    def spec(self, storage, conf: dict | None, producer_conf: dict | None) -> dict:
        """The script's spec (its first stdin line): client config and the Producer's own config."""
        return {"conf": {"storage.url": storage.url, "storage.options": dict(storage.options), **(conf or {})},
                "producer_conf": producer_conf or {}}

    #: the script registers faulthandler on SIGUSR1 (then a timed-out wait asks it for its stacks)
    dumps_stacks_on_sigusr1 = False

    def on_timeout(self) -> None:
        """Called before a wait times out: a process that can print every thread's stack to its
        stderr (faulthandler on SIGUSR1) is asked to, so the failure shows where it hung."""
        if self.dumps_stacks_on_sigusr1 and self.proc.poll() is None:
            os.kill(self.pid, signal.SIGUSR1)
            time.sleep(1.0)

    @property
    def host(self) -> str:
        """Host name the process reports (waits until it is ready)."""
        return self.wait_started()["host"]

    def wait_started(self, timeout: float = 30.0) -> dict:
        """Wait until the process has imported txlake and reads commands."""
        if self._started is None:
            self._started = self.wait_event("started", timeout=timeout)
        return self._started

    # -- I/O -------------------------------------------------------------------------
    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "garbage", "line": line}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip())

    def describe(self) -> str:
        """The process's state and the tail of its stderr and events (for assertion messages)."""
        tail = "\n".join(self.stderr[-30:])
        return (f"writer process {self.pid} (exit code {self.proc.poll()}); last events: {self.events[-5:]}; "
                f"stderr tail:\n{tail}")

    def send(self, cmd: str, **fields: Any) -> int:
        """Send one command; returns the index the next event will have (for :meth:`wait_event`)."""
        self.wait_started()
        with self._cond:
            index = len(self.events)
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        return index

    def wait_event(self, name: str, start: int = 0, timeout: float = 30.0,
                   pred: Callable[[dict], bool] | None = None) -> dict:
        """The first event named ``name`` at index >= ``start`` (matching ``pred``); fails on
        timeout, on an ``error`` event, or when the process exits without printing it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for event in self.events[start:]:
                    if event["event"] == "error":
                        raise AssertionError(f"writer process command failed: {event}\n{self.describe()}")
                    if event["event"] == name and (pred is None or pred(event)):
                        return event
                if not self._out.is_alive():
                    raise AssertionError(f"writer process ended before printing {name!r}\n{self.describe()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(min(remaining, 0.2))
        self.on_timeout()
        raise AssertionError(f"no {name!r} event within {timeout} s\n{self.describe()}")

    def request(self, cmd: str, reply: str, timeout: float = 30.0, **fields: Any) -> dict:
        """Send a command and wait for its reply event."""
        return self.wait_event(reply, self.send(cmd, **fields), timeout)

    def wait_acks(self, count: int, timeout: float = 30.0) -> None:
        """Wait until at least ``count`` records were acknowledged."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.acks()) < count:
                if not self._out.is_alive():
                    raise AssertionError(f"writer process ended before {count} acks\n{self.describe()}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"fewer than {count} acks within {timeout} s\n{self.describe()}")
                self._cond.wait(min(remaining, 0.2))

    def acks(self) -> list[dict]:
        """Delivery reports of committed records printed so far."""
        return [e for e in list(self.events) if e["event"] == "ack"]

    def of(self, name: str) -> list[dict]:
        """Every event named ``name`` so far."""
        return [e for e in list(self.events) if e["event"] == name]

    # -- ending ------------------------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL the process, wait for it, and read everything it printed."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.wait_exit(expect=-signal.SIGKILL)

    def wait_exit(self, timeout: float = 30.0, expect: int | None = 0) -> int:
        """Wait for the process to end (and its output to be read); check its exit code."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"writer process did not exit within {timeout} s\n{self.describe()}") from None
        self._out.join(10)
        self._err.join(10)
        if expect is not None:
            assert code == expect, f"writer process exit code {code}, expected {expect}\n{self.describe()}"
        return code

    def cleanup(self) -> None:
        """Kill the process if it still runs; close its pipes."""
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - teardown is best effort
                pass


@pytest.fixture
def writer_procs():
    """Factory ``writer_procs(storage, conf=None, producer_conf=None) -> WriterProcess``.

    The process starts at once; its first command waits until it is ready, so a test may
    start the next writer while the current one runs.

    Teardown kills every process still alive and closes every engine this test opened
    in the test process (releasing its writer lease and stopping its threads).
    """
    started: list[WriterProcess] = []

    def start(storage, conf: dict | None = None, producer_conf: dict | None = None) -> WriterProcess:
        proc = WriterProcess(storage, conf, producer_conf)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()
    from txlake.engine.registry import close_all

    close_all()


@pytest.fixture
def close_engines():
    """Close every engine this test opened in-process at teardown (in-process-only tests)."""
    yield
    from txlake.engine.registry import close_all

    close_all()


def client_conf(storage, extra: dict | None = None) -> dict:
    """Client config for ``storage`` (its fsspec options as one nested dict) plus ``extra`` keys."""
    return {"storage.url": storage.url, "storage.options": dict(storage.options), **(extra or {})}


def open_catalog(storage):
    """A fresh pure-reader view of the root's catalog (no engine, no lease)."""
    from txlake.catalog.catalog import Catalog

    return Catalog.open(storage.object_store())


def read_partition(storage, topic: str, partition: int, catalog=None) -> list[tuple[int, str]]:
    """``(offset, value)`` of every committed record of a partition, read like an outside reader
    (a fresh catalog view -- or ``catalog`` -- and the objects it names, nothing else)."""
    from txlake.engine.log_reader import LogReader

    catalog = catalog or open_catalog(storage)
    p = catalog.state.partition(topic, partition)
    table = LogReader(catalog).read(topic, partition, p.log_start_offset, p.high_watermark)
    return list(zip(table.column("offset").to_pylist(),
                    [v.decode() if v is not None else None for v in table.column("value").to_pylist()]))


def read_topic(storage, topic: str) -> dict[int, list[tuple[int, str]]]:
    """:func:`read_partition` of every partition of ``topic`` (one catalog view)."""
    catalog = open_catalog(storage)
    n = len(catalog.state.topics[topic].partitions)
    return {p: read_partition(storage, topic, p, catalog) for p in range(n)}


def consume_all(consumer, expected: int, timeout: float = 20.0) -> list:
    """Consume until ``expected`` messages arrived (or the timeout); returns the messages."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < expected and time.monotonic() < deadline:
        for msg in consumer.consume(1000, timeout=0.2):
            assert msg.error() is None, msg.error()
            out.append(msg)
    return out


def simulate_crash(broker) -> None:
    """Stop ``broker`` as a SIGKILL would: no final flush, no producer-state snapshot, the writer
    lease left behind. Its hand-over poller stops too, so that it does not outlive the test's
    storage (on S3 it polled the stopped server until the worker exited)."""
    broker._closed = True
    broker.lease.stop_heartbeats()
    if broker._handoff is not None:
        broker._handoff.stop()


def payload(n: int, start: int = 0, size: int = 10, ts: int = 1_000):
    """``n`` records of :data:`PAYLOAD_SCHEMA`: keys ``k<i>``, values ``v<i>-`` padded to ``size``
    bytes, timestamps ``ts + i`` (ms), for ``i`` from ``start``."""
    import pyarrow as pa

    from txlake.formats.records import PAYLOAD_SCHEMA

    return pa.Table.from_pydict({
        "timestamp": [ts + i for i in range(n)], "key": [b"k%d" % (start + i) for i in range(n)],
        "value": [(b"v%d-" % (start + i)).ljust(size, b"x") for i in range(n)], "headers": [None] * n,
    }, schema=PAYLOAD_SCHEMA)


def read_values(conf: dict, topic: str = "out", partitions=(0, 1),
                isolation: str = "read_committed") -> list[tuple[int, int, str]]:
    """``(partition, offset, value)`` of every record a consumer with ``isolation`` gets from the
    start of ``partitions`` of ``topic``, sorted (values decoded as UTF-8)."""
    from txlake import Consumer, TopicPartition

    c = Consumer({**conf, "isolation.level": isolation, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p) for p in partitions])
    out = []
    while True:
        msgs = c.consume(500, 0.3)
        if not msgs:
            break
        out.extend((m.partition(), m.offset(), m.value().decode()) for m in msgs if m.error() is None)
    c.close()
    return sorted(out)


#: the transaction coordinator's settings of the transaction tests (3 ``__transaction_state`` partitions)
TXN_CONF = {"transaction.state.log.num.partitions": 3}


@pytest.fixture(name="conf")
def transactional_conf(storage):
    """Fixture ``conf``: a client config for ``storage`` with :data:`TXN_CONF`, 1 ms linger and a
    topic ``out`` of 2 partitions; every engine is closed afterwards."""
    from txlake import AdminClient, NewTopic
    from txlake.engine.registry import close_all

    c = {**storage.conf(), **TXN_CONF, "storage.flush.linger.ms": 1}
    with AdminClient(c) as admin:
        admin.create_topics([NewTopic("out", 2)])["out"].result()
    yield c
    close_all()


def hang_data_puts(monkeypatch, store, limit_s: float = 30, armed: threading.Event | None = None) -> threading.Event:
    """Make every PUT of a data object to ``store`` wait (up to ``limit_s``) for the returned
    event, as a stuck object store would: batches are accepted but not committed until it is set.
    With ``armed``, only the PUTs that start once ``armed`` is set wait."""
    from txlake.engine.group_commit import DATA_PREFIX

    real_put = store.put
    gate = threading.Event()

    def hanging_put(key, data):
        if key.startswith(DATA_PREFIX) and (armed is None or armed.is_set()):
            gate.wait(limit_s)
        return real_put(key, data)

    monkeypatch.setattr(store, "put", hanging_put)
    return gate


@contextmanager
def broker_past_its_burst(storage, interval_ms: int = 60_000):
    """An embedded broker (flush linger 1 ms, ``storage.flush.interval.ms`` = ``interval_ms``)
    with topic ``t`` (one partition) whose interval bucket is spent: FLUSH_BURST one-record
    produce calls committed offsets 0..FLUSH_BURST-1 after their linger, and a one-record
    produce at offset FLUSH_BURST now waits for the interval (checked: its 300 ms wait times
    out). Yields ``(broker, catalog version before that record, its future)``; closes the broker."""
    from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
    from txlake.engine.flush_schedule import FLUSH_BURST

    broker = Broker(storage.object_store(), BrokerConfig(flush_linger_ms=1, flush_interval_ms=interval_ms,
                                                         lease_ms=60_000))
    try:
        broker.create_topics([("t", 1, {})])
        for i in range(FLUSH_BURST):
            assert broker.produce([ProduceBatch("t", 0, payload(1, i))], timeout_ms=20_000)[0].base_offset == i
        version = broker.catalog.version
        (small,) = broker.produce_async([ProduceBatch("t", 0, payload(1, FLUSH_BURST))])
        with pytest.raises(TimeoutError):
            small.result(timeout=0.3)
        assert broker.catalog.version == version
        yield broker, version, small
    finally:
        broker.close()
