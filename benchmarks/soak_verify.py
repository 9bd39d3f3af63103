#!/usr/bin/env python
"""The 1 000-trial soak of the anomaly checker (issue 20, docs/reliability.md).

Runs N trials of the verification workload (txlake/verify: idempotent and transactional
producers, consumers under both isolation levels, a consume-transform-produce group with
rebalances and a killed member), each on a storage root of its own, mixing:

* in-process trials (``storage.url`` clients; the group's killed member is abandoned
  without closing) and trials through ``txlake serve`` with confluent-kafka (one server per
  trial; transactional writer t0 and the killed group member are SIGKILLed child processes);
* trials without faults and trials under a seeded subset of the object-store fault kinds of
  :data:`FAULT_KINDS` (adding a kind is one line there);

then checks each history, requiring every final reader (in-process Consumer, DuckDB view,
the Delta table, the wire for served trials; with ``--readers spark`` every
``--spark-every``-th trial also Spark through txlake's source and through delta-spark, one
SparkSession for the run) to equal the committed history. Every choice of trial ``i`` follows
its seed ``seed + i``: ``--seed S --trials 1`` re-runs one trial the way the soak ran it
(thread interleavings excepted).

Writes a markdown report (trials, trials by mode, faults injected by kind, operations,
anomalies by kind, the seeds of failing or erroring trials, the exact command) to
``--report`` every ``--report-every`` trials and at the end, so an interrupted run still
leaves a true, partial report (it says so).

    nice -n 10 .venv/bin/python benchmarks/soak_verify.py --trials 1000 --report docs/reliability-soak.md
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from datetime import datetime, timezone

#: object-store fault kinds (txlake.catalog.faults) a faulty trial draws from: kind -> the
#: storage options enabling it at the soak's rate. Adding a kind is one line here.
FAULT_KINDS: dict[str, dict] = {
    "put.error": {"storage.faults.put.error.rate": 0.03},
    "put.timeout": {"storage.faults.put.timeout.rate": 0.03},
    "put.delay": {"storage.faults.put.delay.rate": 0.05, "storage.faults.put.delay.ms": 20},
    "get.error": {"storage.faults.get.error.rate": 0.02},
    "get.delay": {"storage.faults.get.delay.rate": 0.05, "storage.faults.get.delay.ms": 20},
}

#: the workload of one trial: small, so a trial takes a few seconds
SPEC = dict(partitions=2, idempotent_producers=2, sends_per_producer=15, transactional_producers=2,
            txns_per_producer=3, sends_per_txn=3, abort_fraction=0.34, ctp_members=2, ctp_timeout_s=20.0)


@dataclasses.dataclass
class Plan:
    """How trial ``seed`` runs: through ``txlake serve`` or in-process, under which fault kinds,
    with Spark readers or not."""

    seed: int
    serve: bool
    faults: tuple[str, ...]
    spark: bool

    @property
    def mode(self) -> str:
        return f"{'serve' if self.serve else 'in-process'}, {'faults' if self.faults else 'no faults'}"


def plan(seed: int, serve_fraction: float, fault_fraction: float, spark_every: int, spark: bool) -> Plan:
    """The seeded plan of trial ``seed``."""
    rng = random.Random(f"soak-{seed}")
    serve = rng.random() < serve_fraction
    faults = ()
    if rng.random() < fault_fraction:
        kinds = sorted(FAULT_KINDS)
        faults = tuple(sorted(rng.sample(kinds, rng.randrange(1, len(kinds) + 1))))
    return Plan(seed, serve, faults, spark and not serve and spark_every > 0 and seed % spark_every == 0)


def fault_options(p: Plan) -> dict:
    opts = {"storage.faults.seed": p.seed} if p.faults else {}
    for kind in p.faults:
        opts.update(FAULT_KINDS[kind])
    return opts


@dataclasses.dataclass
class Totals:
    trials: int = 0
    seconds: float = 0.0
    operations: int = 0
    modes: Counter = dataclasses.field(default_factory=Counter)
    injected: Counter = dataclasses.field(default_factory=Counter)      # object-store faults counted in-process
    served_fault_trials: Counter = dataclasses.field(default_factory=Counter)  # kinds enabled on a server
    process_faults: Counter = dataclasses.field(default_factory=Counter)
    anomalies: Counter = dataclasses.field(default_factory=Counter)
    readers: Counter = dataclasses.field(default_factory=Counter)
    failed: list = dataclasses.field(default_factory=list)    # (seed, mode, {kind: n}, first anomaly)
    errors: list = dataclasses.field(default_factory=list)    # (seed, mode, message)


def run_one(p: Plan, root_dir: str, spark_readers, totals: Totals) -> None:
    from txlake.catalog.faults import injected_totals
    from txlake.engine import registry
    from txlake.verify import FinalRead, summarize
    from txlake.verify.ctp import GROUP_BROKER_SETTINGS
    from txlake.verify.workload import WorkloadSpec, default_readers, final_consumer_read, run_trial

    root = os.path.join(root_dir, f"trial-{p.seed}")
    os.makedirs(root)
    url = f"file://{root}"
    options = fault_options(p)
    clean = {"storage.url": url, "storage.options": {}}
    spec = WorkloadSpec(**SPEC)
    before = injected_totals()
    t = time.perf_counter()
    server = log = None
    try:
        if p.serve:
            from txlake.serve_process import ServeProcess

            log = open(os.path.join(root_dir, f"serve-{p.seed}.log"), "w")
            server = ServeProcess(url, options, root_dir, log, settings=GROUP_BROKER_SETTINGS)
            wire = {"bootstrap.servers": server.address}
            readers = {"wire": lambda topic, n: final_consumer_read(wire, topic, n, drain_s=2.0),
                       **default_readers(clean)}
            spec = dataclasses.replace(spec, send_interval_ms=200)  # the writer's kill lands between sends
            kill_dir = os.path.join(root_dir, f"procs-{p.seed}")
            os.makedirs(kill_dir)
            result = run_trial(wire, p.seed, f"soak-{p.seed}", spec, readers=readers, drain_s=2.0,
                               kill_writer=kill_dir)
            totals.process_faults["writer.kill"] += 1
            for kind in p.faults:
                totals.served_fault_trials[kind] += 1
        else:
            conf = {"storage.url": url, "storage.options": options, "storage.flush.linger.ms": 1,
                    **GROUP_BROKER_SETTINGS}
            readers = default_readers(clean)
            if p.spark:
                readers.update(spark_readers.readers(clean))
            result = run_trial(conf, p.seed, f"soak-{p.seed}", spec, readers=readers)
    except Exception as exc:  # noqa: BLE001 - a trial that could not run is reported, the soak goes on
        totals.errors.append((p.seed, p.mode, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]))
        traceback.print_exc()
        return
    finally:
        if server is not None:
            code = server.stop()
            server.close()
            if code != 0:
                totals.errors.append((p.seed, p.mode, f"txlake serve exited {code} on SIGTERM"))
        if log is not None:
            log.close()
        registry.close_all()
        after = injected_totals()
        for kind, n in after.items():
            totals.injected[kind] += n - before.get(kind, 0)
        totals.seconds += time.perf_counter() - t
        shutil.rmtree(root, ignore_errors=True)
    totals.trials += 1
    totals.modes[p.mode] += 1
    totals.operations += result.operations
    for kind, n in result.faults.items():
        totals.process_faults[kind] += n
    for f in result.history.of(FinalRead):
        totals.readers[f.reader] += 1
    counts = summarize(result.anomalies)
    for kind, n in counts.items():
        totals.anomalies[kind] += n
    if result.anomalies:
        a = result.anomalies[0]
        totals.failed.append((p.seed, p.mode, {k: n for k, n in counts.items() if n},
                              f"{a.kind} at {a.where or 'log'}: {a.note}"))
        history_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "soak-histories")
        os.makedirs(history_path, exist_ok=True)
        with open(os.path.join(history_path, f"soak-{p.seed}.jsonl"), "w") as fp:
            result.history.dump(fp)


def report(totals: Totals, planned: int, command: str, started: str, done: bool) -> str:
    from txlake.verify import KINDS

    state = "complete" if done else f"**partial: {totals.trials + len(totals.errors)} of {planned} trials so far**"
    lines = [
        "# Reliability soak: `benchmarks/soak_verify.py`", "",
        "The soak of the anomaly checker (docs/reliability.md): each trial runs the verification workload "
        "(idempotent and transactional producers, read_committed and read_uncommitted consumers, a "
        "consume-transform-produce group whose static member is killed inside a transaction and restarted "
        "while a dynamic member joins and leaves) on a storage root of its own, in-process or through "
        "`txlake serve`, with or without object-store faults, then checks the history and requires every "
        "final reader to equal the committed history.", "",
        "```bash", command, "```", "",
        f"Started {started}; this report written {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC ({state}); "
        "2 cores shared with other jobs, at nice 10.", "",
        "| | |", "|---|---|",
        f"| trials checked | {totals.trials} |",
        f"| trials that could not run (errors) | {len(totals.errors)} |",
        f"| time in trials | {totals.seconds:.0f} s ({totals.seconds / max(totals.trials, 1):.1f} s per trial) |",
        f"| operations (sends, transactions, polls, offset commits) | {totals.operations} |",
        f"| trials by mode | {', '.join(f'{m} {n}' for m, n in sorted(totals.modes.items())) or '-'} |",
        f"| final reads by reader | {', '.join(f'{r} {n}' for r, n in sorted(totals.readers.items())) or '-'} |",
        f"| object-store faults injected (in-process trials, counted) | "
        f"{', '.join(f'{k} {n}' for k, n in sorted(totals.injected.items())) or '-'} |",
        f"| served trials with each fault kind enabled (server-side, not counted) | "
        f"{', '.join(f'{k} {n}' for k, n in sorted(totals.served_fault_trials.items())) or '-'} |",
        f"| process faults | {', '.join(f'{k} {n}' for k, n in sorted(totals.process_faults.items())) or '-'} |",
        f"| anomalies by kind | {', '.join(f'{k} {totals.anomalies.get(k, 0)}' for k in KINDS)} |",
        "",
    ]
    lines.append("## Failing trials" if totals.failed else "No trial had an anomaly.")
    for seed, mode, counts, first in totals.failed:
        lines.append(f"- seed {seed} ({mode}): {counts}; first: {first} "
                     f"(re-run: `benchmarks/soak_verify.py --seed {seed} --trials 1`)")
    if totals.errors:
        lines += ["", "## Trials that could not run"]
        lines += [f"- seed {seed} ({mode}): {msg}" for seed, mode, msg in totals.errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0, help="seed of the first trial; trial i uses seed + i")
    ap.add_argument("--report", default="docs/reliability-soak.md", help="markdown report path")
    ap.add_argument("--report-every", type=int, default=50, help="rewrite the report every this many trials")
    ap.add_argument("--serve-fraction", type=float, default=0.05, help="share of trials through txlake serve")
    ap.add_argument("--fault-fraction", type=float, default=0.5, help="share of trials under object-store faults")
    ap.add_argument("--readers", default="", help="optional final readers: 'spark' (Spark source and delta-spark)")
    ap.add_argument("--spark-every", type=int, default=50, help="with --readers spark: every this many seeds")
    ap.add_argument("--root", default=None, help="directory for the trials' roots (default: a temporary one)")
    args = ap.parse_args(argv)
    command = "nice -n 10 .venv/bin/python benchmarks/soak_verify.py " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    spark = "spark" in args.readers.split(",")
    started = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
    root_dir = args.root or tempfile.mkdtemp(prefix="txlake-soak-")
    os.makedirs(root_dir, exist_ok=True)
    totals = Totals()
    spark_readers = None
    if spark:
        from txlake.verify.workload import SparkReaders

        spark_readers = SparkReaders()

    def write(done: bool) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        tmp = args.report + ".tmp"
        with open(tmp, "w") as fp:
            fp.write(report(totals, args.trials, command, started, done))
        os.replace(tmp, args.report)

    try:
        for i in range(args.trials):
            p = plan(args.seed + i, args.serve_fraction, args.fault_fraction, args.spark_every, spark)
            t = time.perf_counter()
            run_one(p, root_dir, spark_readers, totals)
            bad = totals.failed and totals.failed[-1][0] == p.seed
            err = totals.errors and totals.errors[-1][0] == p.seed
            print(f"trial {i + 1}/{args.trials} seed {p.seed} ({p.mode}{', spark' if p.spark else ''}"
                  f"{', ' + '+'.join(p.faults) if p.faults else ''}): {time.perf_counter() - t:.1f} s"
                  f"{', ANOMALIES ' + str(totals.failed[-1][2]) if bad else ''}{', ERROR' if err else ''}",
                  flush=True)
            if (i + 1) % args.report_every == 0:
                write(False)
        write(True)
    finally:
        if spark_readers is not None:
            spark_readers.stop()
        if args.root is None:
            shutil.rmtree(root_dir, ignore_errors=True)
    return 1 if totals.failed or totals.errors else 0


if __name__ == "__main__":
    sys.exit(main())
