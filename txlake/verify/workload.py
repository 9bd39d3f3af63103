"""A verification workload: in-process against a storage root (``storage.url`` clients) or
with confluent-kafka against a server such as ``txlake serve`` (``bootstrap.servers``).

One trial, on a topic of its own (so trials can share a root):

* idempotent producers send unique values to random partitions;
* transactional producers run transactions of a few sends each, commit them and abort a
  seeded third of them (optionally one of them runs as a child process that is
  SIGKILLed mid-transaction and restarted: ``kill_writer``);
* a read_committed and a read_uncommitted consumer poll every partition from the
  beginning while the producers run, until they have read to the end; the
  read_committed one is in a consumer group and commits its position after each poll;

all concurrently (one thread each), recording a :class:`~.history.History`. Then the
final state is read by the final readers -- by default a fresh in-process Consumer
(read_committed) and the DuckDB view (:func:`txlake.duckdb.connect`) -- and
:func:`~.checker.check` runs. The
random choices follow ``seed``; thread interleavings do not.
"""

from __future__ import annotations

import io
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Callable

from .checker import Anomaly, check
from .history import (SEND_FAIL, SEND_INFO, SEND_OK, TXN_ABORT, TXN_COMMIT, TXN_INFO, Assign, FinalRead, History,
                      OffsetCommit, Poll, Send, Txn)


@dataclass
class WorkloadSpec:
    """How much a trial does.

    Attributes:
        partitions: partitions of the trial's topic.
        idempotent_producers / sends_per_producer: idempotent writers and their sends each.
        transactional_producers / txns_per_producer / sends_per_txn: transactional writers.
        abort_fraction: the share of each producer's transactions aborted (0..1, rounded).
        send_interval_ms: a transactional producer's pause after each send (ms), so that a
            kill lands inside a transaction, not in its commit.
        ctp_members: initial members of a consume-transform-produce group copying the topic
            to ``<topic>-out`` (:mod:`.ctp`: one killed and restarted, one joining and leaving);
            0: no group.
        ctp_abort_fraction / ctp_max_batch: the share of its transactions a member aborts, and
            the most records it copies in one.
        ctp_timeout_s: once the producers are done, how long the group may take to copy the
            rest (s) before it is stopped anyway (what it did not copy is then reported).
    """

    partitions: int = 2
    idempotent_producers: int = 2
    sends_per_producer: int = 40
    transactional_producers: int = 2
    txns_per_producer: int = 6
    sends_per_txn: int = 4
    abort_fraction: float = 0.33
    send_interval_ms: int = 0
    ctp_members: int = 0
    ctp_abort_fraction: float = 0.2
    ctp_max_batch: int = 10
    ctp_timeout_s: float = 30.0


@dataclass
class TrialResult:
    """A finished trial: its topic, history, anomalies and operation count (sends,
    transaction outcomes, polls and offset commits recorded)."""

    topic: str
    history: History
    anomalies: list[Anomaly]
    #: process faults the workload injected, by kind (``ctp.member.kill``)
    faults: dict = field(default_factory=dict)

    @property
    def operations(self) -> int:
        """Sends (one per value, its attempt and its report counted once), transactions,
        polls and offset commits."""
        h = self.history
        return (len({s.value for s in h.of(Send)}) + len({t.txn for t in h.of(Txn)}) + len(h.of(Poll))
                + len(h.of(OffsetCommit)))


def clients(conf: dict):
    """The client module a config talks through: :mod:`confluent_kafka` for
    ``bootstrap.servers`` (the wire, e.g. ``txlake serve``), else :mod:`txlake` (in-process,
    ``storage.url``). Both have the same API (API.md)."""
    if "bootstrap.servers" in conf:
        import confluent_kafka
        import confluent_kafka.admin  # noqa: F401 (k.admin below)

        return confluent_kafka
    import txlake
    import txlake.admin  # noqa: F401 (k.admin below)

    return txlake


def _record_delivery(history: History, process: str, value: str, txn: str | None, t_start: float,
                     source: str | None = None):
    def on_delivery(err, msg) -> None:
        if err is None:
            history.add(Send(process, msg.topic(), msg.partition(), value, SEND_OK, msg.offset(), txn,
                             t_start=t_start, t_end=History.now(), source=source))
        else:  # a delivery error may still have been appended (e.g. a timeout): unknown outcome
            history.add(Send(process, msg.topic(), msg.partition(), value, SEND_INFO, None, txn, err.name(),
                             t_start=t_start, t_end=History.now(), source=source))
    return on_delivery


def send_value(k, producer, history: History, process: str, topic: str, partition: int, value: str,
               txn: str | None, attempts: bool = False, source: str | None = None) -> None:
    """Produce the unique ``value`` (UTF-8) to ``topic``/``partition`` with ``producer`` and record
    its outcome in ``history`` as :class:`~.history.Send` events of ``process``.

    The outcome is recorded when it is known: ``ok`` with the acknowledged offset from the
    delivery report (``on_delivery``, served by this or a later ``producer.poll``/``flush``);
    ``info`` (unknown outcome: the record may still have been appended, e.g. a timeout) for a
    delivery error; ``fail`` (not written) when ``produce`` itself refused it (a
    ``KafkaException`` or ``BufferError``, e.g. a fatal or fenced producer, a full queue).
    Delivery semantics are the Kafka producer's (``KafkaProducer.send`` and its callback).

    Args:
        k: the client module of the producer (:func:`clients`).
        producer: a ``Producer`` of that module (idempotent or transactional).
        txn: the transaction the send belongs to (its name in the history), or None.
        attempts: record the attempt first as ``info`` ``attempted`` (for a process that may be
            SIGKILLed before its report: the attempt's record then stands as unknown outcome).
        source: the input value a consume-transform-produce output copies (:mod:`.ctp`), or None.

    Raises:
        nothing of its own: a refused send is recorded, not raised.
    """
    t0 = History.now()
    if attempts:  # a process that may be killed records the attempt first; its report replaces it
        history.add(Send(process, topic, partition, value, SEND_INFO, None, txn, "attempted", t0, t0, source=source))
    try:
        producer.produce(topic, value=value.encode(), partition=partition,
                         on_delivery=_record_delivery(history, process, value, txn, t0, source))
    except (k.KafkaException, BufferError) as exc:  # refused before it was queued: not written
        err = exc.args[0] if exc.args else exc
        name = err.name() if hasattr(err, "name") else type(exc).__name__
        history.add(Send(process, topic, partition, value, SEND_FAIL, None, txn, name, t0, History.now(),
                         source=source))
    producer.poll(0)


def _idempotent(conf: dict, history: History, topic: str, name: str, spec: WorkloadSpec, rng: random.Random):
    k = clients(conf)
    p = k.Producer({**conf, "enable.idempotence": True, "linger.ms": 2})
    try:
        for n in range(spec.sends_per_producer):
            send_value(k, p, history, name, topic, rng.randrange(spec.partitions), f"{name}-{n}", None)
        p.flush(30)
    finally:
        p.flush(30)
        p.close()  # its threads end (a soak runs thousands of producers in one process)


def _transactional(conf: dict, history: History, topic: str, name: str, spec: WorkloadSpec, rng: random.Random,
                   start: int = 0, attempts: bool = False, unfinished: tuple[str, ...] = ()):
    """A transactional producer running transactions ``start`` on (the earlier ones' random
    draws are replayed, so a restarted instance continues the seeded sequence).
    ``unfinished``: transactions a killed instance left open before invoking their commit or
    abort; this instance's ``init_transactions`` aborts them (KIP-98 fencing), recorded so."""
    k = clients(conf)
    p = k.Producer({**conf, "transactional.id": f"{topic}-{name}", "linger.ms": 2})
    try:
        t0 = History.now()
        try:
            init_transactions(p)
        except k.KafkaException as exc:  # e.g. the writer fenced itself (a cas.race fault): nothing was sent
            if not exc.args[0].fatal():
                raise
            return
        for txn in unfinished:
            history.add(Txn(name, txn, TXN_ABORT, t0, History.now(), "aborted by init_transactions"))
        aborts = round(spec.abort_fraction * spec.txns_per_producer)
        outcomes = [False] * aborts + [True] * (spec.txns_per_producer - aborts)
        rng.shuffle(outcomes)  # every producer aborts its share, in a seeded order
        for t, commit in enumerate(outcomes):
            partitions = [rng.randrange(spec.partitions) for _ in range(spec.sends_per_txn)]
            if t < start:
                continue
            txn = f"{name}-T{t}"
            p.begin_transaction()
            t0, ending = History.now(), False
            try:
                for n, partition in enumerate(partitions):
                    send_value(k, p, history, name, topic, partition, f"{txn}-{n}", txn, attempts)
                    if spec.send_interval_ms:
                        time.sleep(spec.send_interval_ms / 1000)
                t0, ending = History.now(), True
                end_transaction(p, history, name, txn, commit, attempts, t0)
            except k.KafkaException as exc:  # the commit/abort's error, or a fatal one a send's poll raised
                err = exc.args[0]
                if not ending and not err.fatal():
                    raise
                history.add(Txn(name, txn, TXN_INFO, t0, History.now(), err.name()))
                if err.fatal():  # e.g. the writer fenced itself (a cas.race fault): serve the delivery reports first
                    p.flush(5)
                    return
                if err.txn_requires_abort():
                    _end_transaction(p, False)
    finally:
        p.close()  # its threads end (a soak runs thousands of producers in one process)


#: calls of a transactional API a workload makes while it raises a retriable error
TRANSACTION_API_CALLS = 4


def _resumed(call: Callable[[], None], calls: int) -> None:
    """``call()``, called again while it raises a retriable error (a timeout while the server was
    stopped or restarting), up to ``calls`` times: librdkafka's contract for its transactional
    API (the call resumes the operation; txlake's Producer does the same).

    Raises:
        KafkaException: a non-retriable error at once, or the last retriable one.
    """
    for n in range(calls):
        try:
            call()
            return
        except Exception as exc:  # either client library's KafkaException: args[0] is its KafkaError
            error = exc.args[0] if exc.args else None
            if not (hasattr(error, "retriable") and error.retriable()) or n == calls - 1:
                raise


def init_transactions(producer, timeout_s: float = 30.0, calls: int = TRANSACTION_API_CALLS) -> None:
    """``producer.init_transactions(timeout_s)``, called again after a retriable error
    (:func:`_resumed`; soak seed 2071 failed its trial on the first ``_TIMED_OUT``).

    Raises:
        KafkaException: a non-retriable error at once (e.g. fatal: the writer fenced itself), or
            the last call's retriable one.
    """
    _resumed(lambda: producer.init_transactions(timeout_s), calls)


def _end_transaction(producer, commit: bool, calls: int = TRANSACTION_API_CALLS) -> None:
    """``commit_transaction(30)`` or ``abort_transaction(30)``, called again after a retriable
    error (:func:`_resumed`; another call in between is refused with _CONFLICT).

    Raises:
        KafkaException: a non-retriable error, or the last retriable one.
    """
    _resumed(lambda: (producer.commit_transaction if commit else producer.abort_transaction)(30), calls)


def end_transaction(producer, history: History, process: str, txn: str, commit: bool, invoked: bool,
                    t0: float) -> None:
    """``commit_transaction`` (``commit``) or ``abort_transaction`` of ``producer``'s open
    transaction ``txn`` (30 s timeout, called again on a retriable error), its outcome recorded;
    with ``invoked`` (a process that may be killed) the invocation is recorded first, as an
    unknown outcome. ``t0``: the invocation time. A ``KafkaException`` of the call propagates
    unrecorded."""
    if invoked:  # killed from here on, the outcome is unknown
        history.add(Txn(process, txn, TXN_INFO, t0, t0, "invoked"))
    _end_transaction(producer, commit)
    history.add(Txn(process, txn, TXN_COMMIT if commit else TXN_ABORT, t0, History.now()))


def polled_records(k, msgs: list) -> list:
    """The records among ``msgs``; an error other than end-of-partition or a transient one raises
    (a trial that cannot read is an error, not a history). Transient: the server unreachable for
    a while under process faults (the client retries), and ``_MAX_POLL_EXCEEDED``: a group member
    that did not poll within ``max.poll.interval.ms`` (a starved trial) has left its group, and
    its next poll serves the loss of its partitions and rejoins (KIP-62, librdkafka's
    ``rd_kafka_consumer_poll``), which the history records as assignments."""
    transient = (k.KafkaError._PARTITION_EOF, k.KafkaError._TRANSPORT, k.KafkaError._ALL_BROKERS_DOWN,
                 k.KafkaError._MAX_POLL_EXCEEDED)
    for m in msgs:
        err = m.error()
        if err is not None and err.code() not in transient and not err.retriable():
            raise k.KafkaException(err)
    return [m for m in msgs if m.error() is None]


def _poller(conf: dict, history: History, topic: str, name: str, isolation: str, spec: WorkloadSpec,
            done: threading.Event, group: str, commits: bool, drain_s: float):
    k = clients(conf)
    c = k.Consumer({**conf, "group.id": group, "enable.auto.commit": False, "isolation.level": isolation,
                    "auto.offset.reset": "earliest"})
    try:
        tps = [k.TopicPartition(topic, p, k.OFFSET_BEGINNING) for p in range(spec.partitions)]
        history.add(Assign(name, [(topic, p, k.OFFSET_BEGINNING) for p in range(spec.partitions)], History.now()))
        c.assign(tps)
        quiet_since = None  # when the writers were done and polls started coming back empty
        while quiet_since is None or History.now() - quiet_since < drain_s:
            finished = done.is_set()
            t0 = History.now()
            msgs = polled_records(k, c.consume(200, 0.1))
            if msgs:
                history.add(Poll(name, isolation, [(m.topic(), m.partition(), m.offset(), m.value().decode())
                                                   for m in msgs], t0, History.now()))
                if commits:
                    t1 = History.now()
                    try:
                        c.commit(asynchronous=False)
                    except k.KafkaException as exc:  # e.g. NOT_COORDINATOR under faults: not stored, not recorded
                        if not exc.args[0].retriable():
                            raise
                        continue
                    offsets = [(tp.topic, tp.partition, tp.offset)
                               for tp in c.position([k.TopicPartition(topic, p) for p in range(spec.partitions)])]
                    history.add(OffsetCommit(name, group, offsets, None, t1))
            if msgs or not finished:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = History.now()
    finally:
        c.close()


def final_consumer_read(conf: dict, topic: str, partitions: int, drain_s: float = 0.3) -> list[tuple]:
    """Every committed record of ``topic`` through a fresh read_committed Consumer (in-process
    for ``storage.url``, confluent-kafka for ``bootstrap.servers``), reading until no record
    came for ``drain_s`` seconds: ``[(topic, partition, offset, value), ...]`` sorted."""
    k = clients(conf)
    c = k.Consumer({**conf, "group.id": f"{topic}-final", "enable.auto.commit": False,
                    "isolation.level": "read_committed"})
    c.assign([k.TopicPartition(topic, p, k.OFFSET_BEGINNING) for p in range(partitions)])
    out = []
    try:
        last = History.now()
        while History.now() - last < drain_s:
            msgs = polled_records(k, c.consume(500, 0.1))
            if msgs:
                last = History.now()
            out.extend((m.topic(), m.partition(), m.offset(), m.value().decode()) for m in msgs)
    finally:
        c.close()
    return sorted(out)


def final_duckdb_read(conf: dict, topic: str) -> list[tuple]:
    """Every record of ``topic``'s DuckDB view (:mod:`txlake.duckdb`), same shape as
    :func:`final_consumer_read`."""
    import txlake.duckdb
    from txlake.duckdb import quote_ident

    con = txlake.duckdb.connect(conf["storage.url"], conf.get("storage.options") or {}, topics=[topic])
    try:
        rows = con.sql(f'SELECT partition, "offset", value FROM {quote_ident(topic)}').fetchall()
    finally:
        con.close()
    return sorted((topic, p, o, bytes(v).decode()) for p, o, v in rows)


def _killed_transactional(conf: dict, history: History, topic: str, name: str, spec: WorkloadSpec, seed: int,
                          sink_path: str, kill_after: int) -> None:
    """Run transactional writer ``name`` as a child process (:mod:`.writer_proc`), SIGKILL it
    once it has finished ``kill_after`` transactions and sent in the next one, start it again
    to the end, then add its recorded events to ``history``.

    Raises:
        RuntimeError: a child exited with an error (its stderr included).
    """
    import dataclasses
    import json
    import signal
    import subprocess
    import sys

    args = [sys.executable, "-m", "txlake.verify.writer_proc", json.dumps(conf), topic, name, str(seed),
            json.dumps(dataclasses.asdict(spec)), sink_path]

    def events() -> list:
        if not os.path.exists(sink_path):
            return []
        with open(sink_path) as fp:
            lines = fp.readlines()
        return History.load(io.StringIO("".join(line for line in lines if line.endswith("\n")))).events

    def started_next(evs: list) -> bool:
        done = sum(1 for e in evs if isinstance(e, Txn) and e.outcome != TXN_INFO)
        return done >= kill_after and any(isinstance(e, Send) and e.txn == f"{name}-T{done}" for e in evs)

    for attempt in ("killed", "restarted"):
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if attempt == "killed":
            while proc.poll() is None and not started_next(events()):
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
        if proc.returncode not in (0, -signal.SIGKILL) or (attempt == "restarted" and proc.returncode != 0):
            raise RuntimeError(f"{attempt} writer {name} exited {proc.returncode}: {err.decode()[-3000:]}")
    for e in events():
        history.add(e)


def publish_table(url: str, topic: str, options: dict) -> None:
    """:func:`txlake.tables.publish` of ``topic``, repeated (up to ``COMMIT_PUT_ATTEMPTS`` times in
    all) when it fails with a :class:`~txlake.catalog.storage.StorageError`: a publication is
    idempotent (it publishes the catalog's current state on the table's newest version), and
    one whose commit PUT timed out after being applied (``storage.faults.put.timeout``) raises
    although the version landed; the next finds it and goes on.

    Raises:
        StorageError: every attempt failed.
    """
    import txlake.tables
    from txlake.catalog.catalog import COMMIT_PUT_ATTEMPTS
    from txlake.catalog.faults import OPTION_PREFIX
    from txlake.catalog.storage import StorageError

    seed_key = f"{OPTION_PREFIX}seed"
    for attempt in range(COMMIT_PUT_ATTEMPTS):
        attempt_options = dict(options)
        if attempt and seed_key in attempt_options:
            # each attempt opens a new store, whose fault schedule restarts from its seed: the
            # same seed would fail the same PUT again at every attempt
            attempt_options[seed_key] = int(attempt_options[seed_key]) + attempt
        try:
            txlake.tables.publish(url, topic, attempt_options)
            return
        except StorageError:
            if attempt == COMMIT_PUT_ATTEMPTS - 1:
                raise


def final_delta_read(conf: dict, topic: str) -> list[tuple]:
    """Every record of ``topic``'s Delta table (docs/tables.md), published now with the
    project's publisher (:func:`publish_table`: ``txlake tables publish``, repeated on a storage
    error) and read with delta-rs (``deltalake.DeltaTable(uri).scan()``, which applies the
    deletion vectors); same shape as :func:`final_consumer_read`.

    Raises:
        StorageError / DeltaLogError: the publication failed (as :func:`publish_table`).
    """
    import deltalake
    import pyarrow

    import txlake.tables

    url, options = conf["storage.url"], conf.get("storage.options") or {}
    publish_table(url, topic, options)
    table = deltalake.DeltaTable(txlake.tables.table_uri(url, topic, options),
                                 storage_options=txlake.tables.delta_storage_options(options))
    rows = pyarrow.table(table.scan(columns=["partition", "offset", "value"])).to_pylist()
    return sorted((topic, r["partition"], r["offset"], bytes(r["value"]).decode()) for r in rows)


class SparkReaders:
    """Spark as a final reader (``--readers spark`` of benchmarks/soak_verify.py): one local
    SparkSession (:func:`txlake.demo_spark.spark_session`, delta-spark loaded) started on first
    use and reused by every trial, reading a topic through txlake's Python data source
    (``spark.read.format("txlake")``, read_committed) and its Delta table
    (``format("delta")``, published first as :func:`final_delta_read` does)."""

    def __init__(self) -> None:
        self._spark = None

    def session(self):
        """The shared session (started on first use: tens of seconds)."""
        if self._spark is None:
            from txlake.demo_spark import spark_session

            self._spark = spark_session("txlake-verify", delta=True)
        return self._spark

    def readers(self, conf: dict) -> dict[str, Callable[[str, int], list[tuple]]]:
        """``{"spark-source": ..., "spark-delta": ...}`` for the root of ``conf``."""
        return {"spark-source": lambda topic, n: self.read_source(conf, topic),
                "spark-delta": lambda topic, n: self.read_delta(conf, topic)}

    def read_source(self, conf: dict, topic: str) -> list[tuple]:
        from txlake.demo_spark import _flat_options

        reader = self.session().read.format("txlake").option("storage.url", conf["storage.url"])
        for key, value in _flat_options(conf.get("storage.options") or {}).items():
            reader = reader.option(key, value)
        rows = reader.option("subscribe", topic).load().select("partition", "offset", "value").collect()
        return sorted((topic, r["partition"], r["offset"], bytes(r["value"]).decode()) for r in rows)

    def read_delta(self, conf: dict, topic: str) -> list[tuple]:
        import txlake.tables

        url, options = conf["storage.url"], conf.get("storage.options") or {}
        publish_table(url, topic, options)
        rows = (self.session().read.format("delta").load(txlake.tables.table_uri(url, topic, options))
                .select("partition", "offset", "value").collect())
        return sorted((topic, r["partition"], r["offset"], bytes(r["value"]).decode()) for r in rows)

    def stop(self) -> None:
        if self._spark is not None:
            self._spark.stop()
            self._spark = None


def default_readers(conf: dict) -> dict[str, Callable[[str, int], list[tuple]]]:
    """The final readers of a ``storage.url`` root: ``consumer`` (in-process Consumer),
    ``duckdb`` (the DuckDB view) and ``delta`` (the topic's Delta table, published now:
    :func:`final_delta_read`; not on ``memory://``, which lives in this process's fsspec only,
    out of delta-rs's reach), as ``{name: reader(topic, partitions) -> records}``."""
    readers = {"consumer": lambda topic, n: final_consumer_read(conf, topic, n),
               "duckdb": lambda topic, n: final_duckdb_read(conf, topic)}
    if not conf["storage.url"].startswith("memory://"):
        readers["delta"] = lambda topic, n: final_delta_read(conf, topic)
    return readers


def run_trial(conf: dict, seed: int, topic: str, spec: WorkloadSpec | None = None,
              sink: IO[str] | None = None, *, readers: dict[str, Callable] | None = None,
              drain_s: float = 0.3, kill_writer: str | None = None) -> TrialResult:
    """Run one trial of the workload on ``topic`` (created here) and check its history.

    Args:
        conf: client config: of the root (``storage.url``, ``storage.options``: in-process
            clients) or of a server (``bootstrap.servers``: confluent-kafka clients).
        seed: seeds every random choice (partitions, which transactions abort).
        topic: a topic name not yet used on the root.
        spec: sizes (default :class:`WorkloadSpec`).
        sink: where to append the history as JSON lines, or None.
        readers: the final readers (default :func:`default_readers` of ``conf``), each
            ``reader(topic, partitions) -> [(topic, partition, offset, value), ...]``.
        drain_s: once the writers are done, consumers stop after this many seconds
            without a record (s; longer over the wire, where a fetch takes a while).
        kill_writer: a directory: transactional writer ``t0`` then runs as a child process
            that is SIGKILLed mid-transaction after its first transaction and restarted
            (its history file ``<topic>-t0.jsonl`` is kept there), and so do the members of the
            consume-transform-produce group (``spec.ctp_members``; :mod:`.ctp`). Wire configs
            only: an in-process root has one writer process.

    Returns:
        :class:`TrialResult` (anomalies empty when the trial is clean). With
        ``spec.ctp_members`` each final read holds ``topic`` and ``<topic>-out``.

    Raises:
        KafkaException: the topic cannot be created, or a client fails outside what the
            history records (e.g. ``init_transactions``); such a trial is an error, not an anomaly.
    """
    k = clients(conf)
    spec = spec or WorkloadSpec()
    admin = k.admin.AdminClient(conf)  # kept alive until the future is done (librdkafka destroys it otherwise)
    admin.create_topics([k.admin.NewTopic(topic, spec.partitions)])[topic].result()
    history = History(sink=sink)
    done = threading.Event()
    errors: list[BaseException] = []

    def thread(fn, *args) -> threading.Thread:
        def run():
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - re-raised by run_trial below
                errors.append(exc)
        return threading.Thread(target=run, name=args[3])

    writers = [thread(_idempotent, conf, history, topic, f"i{k}", spec, random.Random(f"{seed}-i{k}"))
               for k in range(spec.idempotent_producers)]
    writers += [thread(_transactional, conf, history, topic, f"t{k}", spec, random.Random(f"{seed}-t{k}"))
                for k in range(1 if kill_writer else 0, spec.transactional_producers)]
    if kill_writer:
        if "bootstrap.servers" not in conf:
            raise ValueError("kill_writer needs a bootstrap.servers config: a storage.url root has one writer process")
        writers.append(thread(_killed_transactional, conf, history, topic, "t0", spec, seed,
                              os.path.join(kill_writer, f"{topic}-t0.jsonl"), 1))
    pollers = [thread(_poller, conf, history, topic, "rc", "read_committed", spec, done, f"{topic}-g", True, drain_s),
               thread(_poller, conf, history, topic, "ru", "read_uncommitted", spec, done, f"{topic}-u", False,
                      drain_s)]
    topics, faults = [topic], {}
    if spec.ctp_members:  # a consume-transform-produce group copying topic to <topic>-out (.ctp)
        from .ctp import run_group

        topics.append(f"{topic}-out")
        admin.create_topics([k.admin.NewTopic(topics[1], spec.partitions)])[topics[1]].result()
        pollers.append(thread(run_group, conf, history, topic, topics[1], spec.partitions, seed, spec.ctp_members,
                              spec.ctp_abort_fraction, spec.ctp_max_batch, done, spec.ctp_timeout_s, kill_writer,
                              faults))
    for t in pollers + writers:
        t.start()
    for t in writers:
        t.join()
    done.set()
    for t in pollers:
        t.join()
    if errors:
        raise errors[0]
    for name, reader in (readers or default_readers(conf)).items():
        history.add(FinalRead(name, [r for t in topics for r in reader(t, spec.partitions)]))
    return TrialResult(topic, history, check(history), faults)
