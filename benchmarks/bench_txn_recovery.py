"""Transaction coordinator recovery time for N transactional ids (default 100 000).

Run:  .venv/bin/python benchmarks/bench_txn_recovery.py [--ids 100000] [--runs 3] [--check-ids 200]
          [--state-flush-records N] [--keep | --root file://...] [--profile FILE]

What it does:

1. **Builds a storage root** whose ``__transaction_state`` (50 partitions, Kafka's default)
   holds ``--ids`` transactional ids with a history each: InitProducerId (Empty), zero to
   two transactions on 1-3 partitions of a real topic ``orders`` (AddPartitionsToTxn one or
   two calls -> Ongoing, a transactional data batch per partition, EndTxn ->
   PrepareCommit/PrepareAbort, markers, CompleteCommit/CompleteAbort), some producer
   restarts (an epoch bump between transactions; an InitProducerId while Ongoing, which
   fences and aborts), and a few per cent left Ongoing or stopped by a "crash" right
   after PrepareCommit/PrepareAbort was written, so recovery has markers to write.

   The records are produced by the coordinator's own code: a real
   :class:`TransactionCoordinator` runs the script's requests against an in-memory
   ``__transaction_state`` and a broker stand-in that only records the markers; the
   records (key, value bytes exactly as the coordinator encoded them), the data batches
   and the markers are then written to the real broker in bulk -- many records per
   produce, instead of one durable commit per state change. By default
   ``__transaction_state`` ends up in few large objects (the layout a compacted log
   would have); ``--state-flush-records N`` writes it N records per group commit in the
   coordinator's order instead, so each partition is spread over many objects, as the
   log of a busy coordinator is (a coordinator serving one request at a time writes one
   object per record).

2. **Checks the shortcut** (``--check-ids``, default 200): the same script is run through
   the real coordinator's request handlers on a second root (one durable commit per
   request, a real marker write, the crash simulated by a failing marker write). The two
   roots must hold the same ``__transaction_state`` records byte for byte, the same
   ``orders`` rows (offsets, producer ids, epochs, sequences, markers; timestamps aside),
   and coordinators restarted on them must end in the same state
   (``list_transaction_states`` and every id's metadata).

3. **Measures recovery** in a fresh process per run, on a fresh copy of the root (a
   recovery finishes the pending transactions, so each run needs the original): the time
   from opening the broker to ``Broker.transaction_coordinator()`` returning (the
   coordinator's ``startup`` has loaded every partition and finished the transactions it
   found in PrepareCommit/PrepareAbort), split into catalog open, writer start (lease,
   producer-state load), ``__transaction_state`` log read, state rebuild, finishing the
   pending transactions; and the process's peak RSS. Best of ``--runs`` by total.

4. **Raw baseline**: pyarrow reading every ``__transaction_state`` row group of the same
   root (``pyarrow.parquet``, all columns), best of 5. The ratio is raw time / txlake
   time (1.0 = as fast as the raw read), as in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import Future

sys.path.insert(0, os.path.dirname(__file__))
from common import fresh_root, machine, peak_rss_mb  # noqa: E402

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from txlake.catalog.catalog import Catalog  # noqa: E402
from txlake.catalog.storage import ObjectStore  # noqa: E402
from txlake.catalog.topic_names import TRANSACTION_STATE_TOPIC  # noqa: E402
from txlake.engine import transaction_coordinator as tc_module  # noqa: E402
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch, ProduceResult  # noqa: E402
from txlake.engine.errors import Errors  # noqa: E402
from txlake.engine.registry import acquire_broker, close_all, release_broker  # noqa: E402
from txlake.engine.transaction_coordinator import TransactionCoordinator  # noqa: E402
from txlake.engine.transaction_state_manager import TransactionConfig, TransactionStateManager  # noqa: E402
from txlake.engine.transaction_topic import TransactionTopicLog  # noqa: E402
from txlake.formats.records import HEADER_TYPE, PAYLOAD_SCHEMA  # noqa: E402

TOPIC = "orders"
TOPIC_PARTITIONS = 8
TXN_TIMEOUT_MS = 60_000
HISTORY_MS = 3_600_000            # the script's requests are spread over the last hour
MAX_BATCH_BYTES = 900_000         # under max.message.bytes (1048588) of __transaction_state
STATE_CHUNK_RECORDS = 20_000      # __transaction_state records per produce() call in the bulk write
DATA_CHUNK_BATCHES = 20_000       # data batches per produce() call in the bulk write


# ------------------------------------------------------------------------------ the script
class Clock:
    """The coordinator's clock while a script runs: every request of one step sees the same ms."""

    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


@contextlib.contextmanager
def coordinator_clock(clock: Clock):
    """Make the coordinator (its module-level ``_now_ms``) and new state managers use ``clock``."""
    saved_now, saved_defaults = tc_module._now_ms, TransactionStateManager.__init__.__defaults__
    tc_module._now_ms = clock
    TransactionStateManager.__init__.__defaults__ = (None, clock)
    try:
        yield
    finally:
        tc_module._now_ms = saved_now
        TransactionStateManager.__init__.__defaults__ = saved_defaults


def make_script(n_ids: int, seed: int) -> tuple[list[tuple], dict[str, int]]:
    """The requests of ``n_ids`` transactional ids, interleaved round-robin in a fixed random order.

    Returns ``(events, fates)``: events are ``(kind, tid, arg)`` with kind one of ``init``
    (arg: timeout), ``add`` (arg: partitions), ``data`` (arg: partition), ``end`` (arg:
    commit?), ``crash_end`` (EndTxn whose marker write fails: the id stays in
    PrepareCommit/PrepareAbort); ``fates`` counts how each id's history ends.
    """
    rng = random.Random(seed)
    per_id: list[list[tuple]] = []
    fates: dict[str, int] = defaultdict(int)
    for i in range(n_ids):
        tid = f"app-{i % 97:02d}-worker-{i:06d}"
        steps: list[tuple] = [("init", tid, TXN_TIMEOUT_MS)]
        r = rng.random()
        ntx = 0 if r < 0.10 else 1 if r < 0.60 else 2
        fate = "empty" if ntx == 0 else "complete"
        for t in range(ntx):
            if t > 0 and rng.random() < 0.05:
                steps.append(("init", tid, TXN_TIMEOUT_MS))        # the producer restarted between transactions
            parts = rng.sample(range(TOPIC_PARTITIONS), rng.choice((1, 1, 2, 2, 3)))
            steps.append(("add", tid, ((TOPIC, parts[0]),)))     # the first record's partition
            steps.append(("data", tid, parts[0]))
            if len(parts) > 1:
                steps.append(("add", tid, tuple((TOPIC, p) for p in parts[1:])))
                steps.extend(("data", tid, p) for p in parts[1:])
            commit = rng.random() < 0.9
            if t == ntx - 1:
                f = rng.random()
                if f < 0.03:
                    fate = "ongoing"
                    break
                if f < 0.045:
                    fate = "prepare_commit" if commit else "prepare_abort"
                    steps.append(("crash_end", tid, commit))
                    break
                if f < 0.05:
                    fate = "prepare_abort"
                    steps.append(("crash_end", tid, False))
                    break
                if f < 0.07:
                    fate = "fenced_while_ongoing"               # InitProducerId while Ongoing: abort, epoch + 2
                    steps.append(("init", tid, TXN_TIMEOUT_MS))
                    break
            steps.append(("end", tid, commit))
        fates[fate] += 1
        per_id.append(steps)
    order = list(range(n_ids))
    rng.shuffle(order)
    events: list[tuple] = []
    for r in range(max(len(s) for s in per_id)):
        for i in order:
            if r < len(per_id[i]):
                events.append(per_id[i][r])
    return events, dict(fates)


class ScriptRunner:
    """Runs a script against a coordinator, like transactional producers would.

    Args:
        coordinator: the coordinator answering the requests.
        produce: ``produce(batch)`` writes one transactional data batch.
        crash: a context manager under which the coordinator's marker write fails.
        clock: the coordinator's clock (see :func:`coordinator_clock`).
    """

    VALUE = b"v" * 100

    def __init__(self, coordinator, produce, crash, clock: Clock, base_ms: int, step_ms: int):
        self.c = coordinator
        self.produce = produce
        self.crash = crash
        self.clock = clock
        self.base_ms, self.step_ms = base_ms, step_ms
        self.identity: dict[str, tuple[int, int]] = {}
        self.sequences: dict[tuple[int, int, int], int] = defaultdict(int)
        self.payload = pa.Table.from_arrays(
            [pa.array([0], pa.int64()), pa.array([None], pa.binary()), pa.array([self.VALUE], pa.binary()),
             pa.nulls(1, HEADER_TYPE)], schema=PAYLOAD_SCHEMA)

    def run(self, events: list[tuple]) -> None:
        c = self.c
        for step, (kind, tid, arg) in enumerate(events):
            self.clock.now = self.base_ms + step * self.step_ms
            if kind == "init":
                for _ in range(3):
                    err, pid, epoch = c.handle_init_producer_id(tid, arg)
                    if err != Errors.CONCURRENT_TRANSACTIONS:  # an Ongoing transaction was aborted: retry
                        break
                    self.clock.now += 1
                assert err == Errors.NO_ERROR, (tid, err)
                self.identity[tid] = (pid, epoch)
                continue
            pid, epoch = self.identity[tid]
            if kind == "add":
                answers = c.handle_add_partitions_to_txn(tid, pid, epoch, arg)
                assert set(answers.values()) == {Errors.NO_ERROR}, (tid, answers)
            elif kind == "data":
                seq_key = (pid, epoch, arg)
                seq = self.sequences[seq_key]
                self.sequences[seq_key] = seq + 1
                self.produce(ProduceBatch(TOPIC, arg, self.payload, pid, epoch, seq, is_transactional=True))
            elif kind == "end":
                err = c.handle_end_txn(tid, pid, epoch, arg)
                assert err == Errors.NO_ERROR, (tid, err)
            elif kind == "crash_end":
                with self.crash():
                    try:
                        c.handle_end_txn(tid, pid, epoch, arg)
                    except RuntimeError:
                        pass
                    else:
                        raise AssertionError(f"EndTxn of {tid} did not reach the marker write")
            else:
                raise ValueError(kind)


def _timeline(n_events: int, end_ms: int | None = None) -> tuple[int, int]:
    """``(first step's time, ms per step)``: the script ends at ``end_ms`` (now by default)."""
    step_ms = max(1, HISTORY_MS // max(1, n_events))
    end_ms = int(time.time() * 1000) if end_ms is None else end_ms
    return end_ms - n_events * step_ms, step_ms


def _txn_config(n_state_partitions: int, extra: dict | None = None) -> dict:
    return {"transaction.state.log.num.partitions": n_state_partitions, **(extra or {})}


# ------------------------------------------------------------------------------ the bulk build
class _CollectingLog:
    """A ``TransactionLog`` that keeps what the coordinator appends (partition, key, value, time)."""

    def __init__(self, num_partitions: int, clock: Clock):
        self.num_partitions = num_partitions
        self.clock = clock
        self.records: dict[int, list[tuple[bytes, bytes | None, int]]] = defaultdict(list)
        self.order: list[int] = []  # the partition of each append, in append order

    def ensure_topic(self) -> None:
        pass

    def exists(self) -> bool:
        return True

    def append(self, partition: int, key: bytes, value: bytes | None) -> int:
        part = self.records[partition]
        part.append((key, value, self.clock.now))
        self.order.append(partition)
        return len(part) - 1

    def read(self, partition: int):
        return [(i, k, v) for i, (k, v, _) in enumerate(self.records.get(partition, []))]


class _MarkerRecorder:
    """The broker as the coordinator sees it while the script is collected: markers are
    recorded in order with the data batches (``ops``) and answered NO_ERROR, or raise
    while :meth:`crash` is active; producer ids come from the real broker."""

    def __init__(self, real: Broker):
        self.real = real
        self.ops: list[tuple[str, object]] = []
        self._crashing = False

    def append_txn_markers(self, markers, urgent: bool = True):
        if self._crashing:
            raise RuntimeError("simulated crash after PrepareCommit/PrepareAbort")
        answers = []
        for m in markers:
            self.ops.append(("marker", m))
            answer = {}
            for tp in m.partitions:
                answer[tp] = done = Future()
                done.set_result(ProduceResult(Errors.NO_ERROR))
            answers.append(answer)
        return answers

    def write_txn_markers(self, markers, timeout_ms: int = 30_000):
        return Broker.await_txn_markers(self.append_txn_markers(markers), timeout_ms)

    def init_producer_id(self):
        return self.real.init_producer_id()

    def request_flush(self) -> None:
        """Nothing is queued here: markers are recorded and answered at once."""

    @contextlib.contextmanager
    def crash(self):
        self._crashing = True
        try:
            yield
        finally:
            self._crashing = False

    def produce(self, batch: ProduceBatch) -> None:
        self.ops.append(("data", batch))


def _check_all(results, what: str) -> None:
    bad = [r for r in results if r.error != Errors.NO_ERROR]
    if bad:
        raise RuntimeError(f"bulk write of {what} failed: {bad[0].error.name} {bad[0].message}")


def bulk_build(url: str, n_ids: int, n_state_partitions: int, seed: int, txn_extra: dict | None = None,
               verbose: bool = True, end_ms: int | None = None, state_flush_records: int = 0) -> dict:
    """Write the script's history to ``url`` in bulk (see the module docstring). Returns counts.

    ``state_flush_records``: 0 writes ``__transaction_state`` partition by partition in large
    batches (few objects, as a compacted log would be laid out); N > 0 writes it in the order
    the coordinator appended, N records per flush (one object each, every partition with
    records in that window having row groups in it), as group commit lays out a log written
    by a busy coordinator: more objects, and each partition spread over many of them.
    """
    events, fates = make_script(n_ids, seed)
    base_ms, step_ms = _timeline(len(events), end_ms)
    clock = Clock(base_ms)
    txn_props = _txn_config(n_state_partitions, txn_extra)
    broker = Broker(ObjectStore(url), BrokerConfig(lease_ms=60_000, transaction=dict(txn_props)))
    try:
        ((err, msg),) = broker.create_topics([(TOPIC, TOPIC_PARTITIONS, {})])
        assert err == Errors.NO_ERROR, msg
        TransactionTopicLog(broker, n_state_partitions).ensure_topic()    # as the coordinator creates it
        # the writer's own coordinator (started with the lease) would verify every transactional
        # batch (KIP-890); this build writes the batches a recorded coordinator decided, with no
        # AddPartitionsToTxn, as Kafka's log tests do
        broker.transaction_coordinator()
        broker.txn_verifier = None
        stand_in = _MarkerRecorder(broker)
        collected = _CollectingLog(n_state_partitions, clock)
        t0 = time.perf_counter()
        with coordinator_clock(clock):
            coord = TransactionCoordinator(stand_in, broker.lease.epoch, TransactionConfig.from_properties(txn_props),
                                           allocate_producer_id=lambda: broker.init_producer_id()[1])
            coord.txn_log = collected
            coord.state = TransactionStateManager(collected, coord.config, time_ms=clock)
            coord.startup(schedule=False)
            ScriptRunner(coord, stand_in.produce, stand_in.crash, clock, base_ms, step_ms).run(events)
        t_script = time.perf_counter() - t0

        # __transaction_state: the collected records, many per produce, each partition in order
        t0 = time.perf_counter()
        n_records = sum(len(v) for v in collected.records.values())
        batches: list[ProduceBatch] = []

        def flush_state_batches() -> None:
            if batches:
                # written as the coordinator appends them
                _check_all(broker.produce(batches, timeout_ms=600_000, internal_topics_allowed=True),
                           TRANSACTION_STATE_TOPIC)
                batches.clear()

        def state_batch(partition: int, chunk: list) -> ProduceBatch:
            table = pa.Table.from_arrays(
                [pa.array([r[2] for r in chunk], pa.int64()), pa.array([r[0] for r in chunk], pa.binary()),
                 pa.array([r[1] for r in chunk], pa.binary()), pa.nulls(len(chunk), HEADER_TYPE)],
                schema=PAYLOAD_SCHEMA)
            return ProduceBatch(TRANSACTION_STATE_TOPIC, partition, table)

        queued = 0
        if state_flush_records:  # the coordinator's append order, one flush (one object) per window
            cursor: dict[int, int] = defaultdict(int)
            for w in range(0, len(collected.order), state_flush_records):
                window: dict[int, list] = defaultdict(list)
                for partition in collected.order[w:w + state_flush_records]:
                    window[partition].append(collected.records[partition][cursor[partition]])
                    cursor[partition] += 1
                batches.extend(state_batch(partition, chunk) for partition, chunk in window.items())
                flush_state_batches()
        for partition in sorted(collected.records) if not state_flush_records else ():
            recs = collected.records[partition]
            start = 0
            while start < len(recs):
                end, size = start, 0
                while end < len(recs) and (end == start or size + len(recs[end][0]) + len(recs[end][1] or b"") + 64
                                           < MAX_BATCH_BYTES):
                    size += len(recs[end][0]) + len(recs[end][1] or b"") + 64
                    end += 1
                chunk = recs[start:end]
                batches.append(state_batch(partition, chunk))
                queued += len(chunk)
                if queued >= STATE_CHUNK_RECORDS:
                    flush_state_batches()
                    queued = 0
                start = end
        flush_state_batches()
        broker.flush()
        t_state = time.perf_counter() - t0

        # orders: data batches and markers. A producer's own order is kept (its data, then its
        # marker, then its next transaction's data); between producers it is not, so the ops go
        # in a few layers (data, markers, data, ...) of many batches each instead of one
        # durable commit per transaction
        t0 = time.perf_counter()
        n_data = n_markers = 0
        layers: list[list] = []
        last_layer: dict[int, int] = {}
        for kind, op in stand_in.ops:
            pid = op.producer_id
            layer = last_layer.get(pid, 0)
            if (layer % 2 == 0) != (kind == "data"):
                layer += 1
            last_layer[pid] = layer
            while len(layers) <= layer:
                layers.append([])
            layers[layer].append(op)
        for index, ops in enumerate(layers):
            for i in range(0, len(ops), DATA_CHUNK_BATCHES):
                chunk = ops[i:i + DATA_CHUNK_BATCHES]
                if index % 2 == 0:
                    _check_all(broker.produce(chunk, timeout_ms=600_000), TOPIC)
                    n_data += len(chunk)
                else:
                    for answer in broker.write_txn_markers(chunk, timeout_ms=600_000):
                        bad = {tp: e for tp, e in answer.items() if e != Errors.NO_ERROR}
                        if bad:
                            raise RuntimeError(f"bulk marker write failed: {bad}")
                    n_markers += sum(len(m.partitions) for m in chunk)
        broker.flush()
        t_data = time.perf_counter() - t0
    finally:
        broker.close()
    if verbose:
        print(f"# built {n_ids:,} ids: script {t_script:.1f} s, {TRANSACTION_STATE_TOPIC} {t_state:.1f} s, "
              f"{TOPIC} {t_data:.1f} s", file=sys.stderr)
    return {"ids": n_ids, "events": len(events), "state_records": n_records, "data_batches": n_data,
            "markers": n_markers, "fates": fates}


def real_build(url: str, n_ids: int, n_state_partitions: int, seed: int, txn_extra: dict | None = None,
               end_ms: int | None = None) -> None:
    """The same script through the real coordinator's request handlers (one durable commit per request)."""
    events, _ = make_script(n_ids, seed)
    base_ms, step_ms = _timeline(len(events), end_ms)
    clock = Clock(base_ms)
    broker = Broker(ObjectStore(url), BrokerConfig(lease_ms=60_000, transaction=_txn_config(n_state_partitions, txn_extra)))
    @contextlib.contextmanager
    def crash():
        def fail(*args, **kwargs):
            raise RuntimeError("simulated crash after PrepareCommit/PrepareAbort")
        broker.write_txn_markers = broker.append_txn_markers = fail  # instance attributes hide the methods
        try:
            yield
        finally:
            del broker.write_txn_markers, broker.append_txn_markers

    def produce(batch: ProduceBatch) -> None:
        (result,) = broker.produce([batch])
        assert result.error == Errors.NO_ERROR, (result.error, result.message)

    try:
        ((err, msg),) = broker.create_topics([(TOPIC, TOPIC_PARTITIONS, {})])
        assert err == Errors.NO_ERROR, msg
        with coordinator_clock(clock):
            coord = broker.transaction_coordinator()
            ScriptRunner(coord, produce, crash, clock, base_ms, step_ms).run(events)
    finally:
        broker.close()


# ------------------------------------------------------------------------------ the check
def _state_records(url: str) -> dict[int, list[tuple[bytes, bytes | None]]]:
    broker = Broker(ObjectStore(url))
    try:
        n = len(broker.topics()[TRANSACTION_STATE_TOPIC].partitions)
        out = {}
        for p in range(n):
            table = broker.fetch(TRANSACTION_STATE_TOPIC, p, 0, 10**9).records
            out[p] = list(zip(table.column("offset").to_pylist(), table.column("key").to_pylist(),
                              table.column("value").to_pylist()))
        return out
    finally:
        broker.close()


_DATA_COLUMNS = ["key", "value", "producer_id", "producer_epoch", "base_sequence", "last_offset_delta",
                 "is_transactional", "is_control", "control_type", "coordinator_epoch"]


def _data_rows(url: str) -> dict[int, tuple]:
    """Per partition of ``orders``: each producer's rows in offset order (offsets aside: the bulk
    write keeps each producer's order, not the interleaving of producers), the high watermark,
    and the aborted-transaction index entries per producer."""
    broker = Broker(ObjectStore(url))
    try:
        out = {}
        for p in range(TOPIC_PARTITIONS):
            table = broker.fetch(TOPIC, p, 0, 10**9).records
            st = broker.catalog.state.partition(TOPIC, p)
            by_producer: dict[int, list] = defaultdict(list)
            for row in table.select(_DATA_COLUMNS).to_pylist():
                by_producer[row["producer_id"]].append(tuple(row.values()))
            aborted: dict[int, int] = defaultdict(int)
            for a in st.aborted_transactions:
                aborted[a.producer_id] += 1
            out[p] = (dict(by_producer), st.high_watermark, dict(aborted))
        return out
    finally:
        broker.close()


def _recovered_state(url: str, n_state_partitions: int, clock: Clock, txn_extra: dict | None) -> tuple:
    broker = Broker(ObjectStore(url), BrokerConfig(lease_ms=60_000, transaction=_txn_config(n_state_partitions, txn_extra)))
    try:
        with coordinator_clock(clock):
            coord = broker.transaction_coordinator()
        listed = coord.state.list_transaction_states()
        assert listed.error == Errors.NO_ERROR
        rows = sorted(listed.transaction_states)
        metadata = {}
        for t in rows:
            md = coord.state.get_transaction_state(t.transactional_id).transaction_metadata
            metadata[t.transactional_id] = (md._key(), md.pending_state)
        return rows, metadata
    finally:
        broker.close()


def check(n_ids: int, n_state_partitions: int, seed: int) -> None:
    """Bulk-written root == root written through the real request handlers (see the module docstring)."""
    # no timeout scheduler interference while the slow real path runs
    extra = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": 3_600_000}
    bulk_url, real_url = fresh_root(), fresh_root()
    end_ms = int(time.time() * 1000)
    t0 = time.perf_counter()
    counts = bulk_build(bulk_url, n_ids, n_state_partitions, seed, extra, verbose=False, end_ms=end_ms)
    t_bulk = time.perf_counter() - t0
    t0 = time.perf_counter()
    real_build(real_url, n_ids, n_state_partitions, seed, extra, end_ms=end_ms)
    t_real = time.perf_counter() - t0
    a, b = _state_records(bulk_url), _state_records(real_url)
    if a != b:
        for p in sorted(set(a) | set(b)):
            if a.get(p) != b.get(p):
                diff = next((i for i, (x, y) in enumerate(zip(a[p], b[p])) if x != y), min(len(a[p]), len(b[p])))
                raise AssertionError(f"{TRANSACTION_STATE_TOPIC}-{p} differs at record {diff}: bulk "
                                     f"{a[p][diff:diff + 1]} real {b[p][diff:diff + 1]} "
                                     f"({len(a[p])} vs {len(b[p])} records)")
    da, db = _data_rows(bulk_url), _data_rows(real_url)
    if da != db:
        bad = [p for p in da if da[p] != db[p]]
        raise AssertionError(f"{TOPIC} partitions {bad} differ between the bulk and the real root")
    clock = Clock(int(time.time() * 1000))
    ra = _recovered_state(bulk_url, n_state_partitions, clock, extra)
    rb = _recovered_state(real_url, n_state_partitions, clock, extra)
    if ra != rb:
        bad = [tid for tid in set(ra[1]) | set(rb[1]) if ra[1].get(tid) != rb[1].get(tid)]
        raise AssertionError(f"recovered coordinators differ for {len(bad)} ids, e.g. {bad[:1]}: "
                             f"{[ra[1].get(t) for t in bad[:1]]} vs {[rb[1].get(t) for t in bad[:1]]}")
    dra, drb = _data_rows(bulk_url), _data_rows(real_url)
    if dra != drb:
        raise AssertionError(f"{TOPIC} differs between the two roots after recovery (markers written by recovery)")
    n_records = sum(len(v) for v in a.values())
    states = defaultdict(int)
    for row in ra[0]:
        states[row.state] += 1
    print(f"# check ({n_ids} ids, fates {dict(sorted(counts['fates'].items()))}): bulk-written root == "
          f"request-by-request root: {n_records} "
          f"{TRANSACTION_STATE_TOPIC} records identical byte for byte, {counts['data_batches']} data batches and "
          f"{counts['markers']} markers identical, identical coordinator state after recovery "
          f"({dict(sorted(states.items()))}); bulk {t_bulk:.1f} s vs real {t_real:.1f} s")
    for url in (bulk_url, real_url):
        shutil.rmtree(ObjectStore(url).root, ignore_errors=True)


# ------------------------------------------------------------------------------ measuring
def _instrument() -> dict[str, float]:
    """Wrap the recovery's steps with timers (this process only; no file is changed)."""
    acc: dict[str, float] = defaultdict(float)

    def timed(cls, name: str, bucket: str) -> None:
        original = getattr(cls, name)

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            finally:
                acc[bucket] += time.perf_counter() - t0
                acc[bucket + "_calls"] += 1
            if hasattr(result, "__next__"):  # a generator: time the work done in each next()
                return _timed_iter(result, bucket)
            return result

        setattr(cls, name, wrapper)

    def _timed_iter(it, bucket):
        while True:
            t0 = time.perf_counter()
            try:
                item = next(it)
            except StopIteration:
                acc[bucket] += time.perf_counter() - t0
                return
            acc[bucket] += time.perf_counter() - t0
            yield item

    timed(Broker, "ensure_writer", "writer_start")
    timed(TransactionCoordinator, "startup", "coordinator_startup")
    timed(TransactionStateManager, "load_transactions_for_partition", "load")
    timed(TransactionCoordinator, "_send_markers_and_complete", "finish_pending")
    timed(Broker, "_commit", "catalog_commit")                          # every commit, on any thread
    timed(Broker, "_snapshot_producer_state", "producer_snapshot")      # taken under the append lock
    # read() goes through read_chunks() when there is one: time the inner one only
    timed(TransactionTopicLog, "read_chunks" if hasattr(TransactionTopicLog, "read_chunks") else "read", "log_read")
    return acc


def measure(url: str, profile: str | None) -> dict:
    """Open ``url`` in this (fresh) process and time the coordinator's recovery."""
    close_all()
    acc = _instrument()
    rss_start = peak_rss_mb()
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    t0 = time.perf_counter()
    broker = acquire_broker(url)
    t_open = time.perf_counter() - t0
    coord = broker.transaction_coordinator()
    total = time.perf_counter() - t0
    acc = dict(acc)  # as of ready (closing commits and snapshots again)
    if prof:
        prof.disable()
        prof.dump_stats(profile)
    listed = coord.state.list_transaction_states()
    states = defaultdict(int)
    for row in listed.transaction_states:
        states[row.state] += 1
    rss_peak = peak_rss_mb()
    release_broker(broker)
    close_all()
    acc = defaultdict(float, acc)
    load = acc["load"]
    read = acc["log_read"]
    out = {
        "total_s": total,
        "catalog_open_s": t_open,
        "writer_start_s": acc["writer_start"],
        "log_read_s": read,
        "state_rebuild_s": load - read,
        "finish_pending_s": acc["finish_pending"],
        "pending_transactions": int(acc["finish_pending_calls"]),
        "catalog_commits": int(acc["catalog_commit_calls"]),
        "producer_snapshots": int(acc["producer_snapshot_calls"]),
        "producer_snapshot_capture_s": acc["producer_snapshot"],
        "other_startup_s": acc["coordinator_startup"] - load - acc["finish_pending"],
        "peak_rss_mb": rss_peak,
        "rss_at_start_mb": rss_start,
        "states_after": dict(sorted(states.items())),
    }
    return out


def state_objects(url: str) -> tuple[list[tuple[str, list[int]]], int, int, int, int]:
    """``[(object path, row groups)]`` of every ``__transaction_state`` segment, record count,
    bytes of those objects, how many of their row groups belong to other topics, and the
    number of segments (one per partition per object)."""
    store = ObjectStore(url)
    catalog = Catalog.open(store)
    by_path: dict[str, list[int]] = defaultdict(list)
    records = segments = 0
    for part in catalog.state.topics[TRANSACTION_STATE_TOPIC].partitions:
        for seg in part.segments:
            by_path[seg.path].extend(seg.row_groups)
            records += seg.record_count
            segments += 1
    nbytes = other = 0
    out = []
    for path, rgs in sorted(by_path.items()):
        local = f"{store.root}/{path}"
        nbytes += os.path.getsize(local)
        other += pq.ParquetFile(local).num_row_groups - len(rgs)
        out.append((local, sorted(rgs)))
    return out, records, nbytes, other, segments


def raw_read(objects: list[tuple[str, list[int]]]) -> tuple[float, int]:
    """pyarrow.parquet reading exactly those row groups (all columns)."""
    t0 = time.perf_counter()
    rows = 0
    for path, rgs in objects:
        rows += pq.ParquetFile(path).read_row_groups(rgs).num_rows
    return time.perf_counter() - t0, rows


def _run_measure(pristine: str, profile: str | None) -> dict:
    """Copy the pristine root, then measure a recovery on the copy in a fresh process."""
    src = ObjectStore(pristine).root
    dst = tempfile.mkdtemp(prefix="txlake-bench-recovery-")
    shutil.rmtree(dst)
    shutil.copytree(src, dst)
    try:
        cmd = [sys.executable, __file__, "--measure", "file://" + dst]
        if profile:
            cmd += ["--profile", profile]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(dst, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", type=int, default=100_000, help="transactional ids (default 100000)")
    ap.add_argument("--state-partitions", type=int, default=50, help="partitions of __transaction_state (default 50)")
    ap.add_argument("--runs", type=int, default=3, help="recoveries measured (fresh process each); best total kept")
    ap.add_argument("--check-ids", type=int, default=200, help="ids of the bulk-vs-real check (0: skip)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--state-flush-records", type=int, default=0,
                    help="write __transaction_state N records per flush in append order (0: few large objects)")
    ap.add_argument("--root", help="reuse a root built before by this script (file://...)")
    ap.add_argument("--keep", action="store_true", help="keep the built root (its URL is printed)")
    ap.add_argument("--profile", help="write a cProfile of one recovery here and print its top functions")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # internal: measure one recovery of this root
    args = ap.parse_args()

    if args.measure:
        print(json.dumps(measure(args.measure, args.profile)))
        return

    if args.check_ids:
        check(args.check_ids, args.state_partitions, args.seed)

    if args.root:
        url, built = args.root, None
    else:
        url = fresh_root(keep=args.keep)
        t0 = time.perf_counter()
        built = bulk_build(url, args.ids, args.state_partitions, args.seed,
                           state_flush_records=args.state_flush_records)
        built["build_s"] = time.perf_counter() - t0
    objects, n_records, nbytes, foreign, n_segments = state_objects(url)

    runs = [_run_measure(url, None) for _ in range(args.runs)]
    best = min(runs, key=lambda r: r["total_s"])
    raw = min(raw_read(objects) for _ in range(5))
    assert raw[1] == n_records, (raw[1], n_records)

    print(f"# coordinator recovery, {args.ids:,} transactional ids ({machine()})")
    if built:
        print(f"# history: {built['events']:,} requests; fates {dict(sorted(built['fates'].items()))}; "
              f"{built['data_batches']:,} data batches, {built['markers']:,} markers in {TOPIC}; "
              f"built in {built['build_s']:.1f} s")
    print(f"# {TRANSACTION_STATE_TOPIC}: {args.state_partitions} partitions, {n_records:,} records in "
          f"{len(objects)} objects ({n_segments:,} partition segments), {nbytes:,} bytes ({foreign} row groups of "
          "other topics in them)")
    print(f"# states after recovery: {best['states_after']}")
    totals = ", ".join(f"{r['total_s']:.2f}" for r in runs)
    print(f"# all runs' totals: {totals} s")
    rows = [
        ("catalog_open_s", best["catalog_open_s"]),
        ("writer_start_s (lease, producer state)", best["writer_start_s"]),
        ("log_read_s", best["log_read_s"]),
        ("state_rebuild_s", best["state_rebuild_s"]),
        ("finish_pending_s", best["finish_pending_s"]),
        ("other_startup_s", best["other_startup_s"]),
        ("recovery_total_s", best["total_s"]),
        ("load_s (log read + state rebuild)", best["log_read_s"] + best["state_rebuild_s"]),
        ("raw_pyarrow_read_s", raw[0]),
        ("raw_vs_recovery_ratio", raw[0] / best["total_s"]),
        ("raw_vs_load_ratio", raw[0] / (best["log_read_s"] + best["state_rebuild_s"])),
        ("pending_transactions_finished", best["pending_transactions"]),
        ("catalog_commits_during_recovery", best["catalog_commits"]),
        ("producer_snapshots_during_recovery", best["producer_snapshots"]),
        ("producer_snapshot_capture_s (append lock held)", best["producer_snapshot_capture_s"]),
        ("peak_rss_mb", best["peak_rss_mb"]),
        ("rss_after_imports_mb", best["rss_at_start_mb"]),
    ]
    for k, v in rows:
        print(f"{k:48s} {v:12,d}" if isinstance(v, int) else f"{k:48s} {v:12.3f}")
    if args.profile:
        _run_measure(url, args.profile)
        pstats.Stats(args.profile).sort_stats("cumulative").print_stats(40)
    if args.keep or args.root:
        print(f"# root: {url}")
    else:
        shutil.rmtree(ObjectStore(url).root, ignore_errors=True)


if __name__ == "__main__":
    main()
