"""A campaign: N trials of the workload (:mod:`.workload`) with consecutive seeds, the
counts of operations and anomalies by kind per trial and in total (``txlake verify``, and
each trial of the soak, benchmarks/soak_verify.py)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Callable

from .checker import KINDS, summarize
from .ctp import GROUP_BROKER_SETTINGS
from .workload import TrialResult, WorkloadSpec, default_readers, final_consumer_read, run_trial

#: the workload of a campaign run without a spec (``txlake verify``): :class:`WorkloadSpec`'s
#: sizes with the consume-transform-produce group (:mod:`.ctp`) of 2 initial members
DEFAULT_SPEC = WorkloadSpec(ctp_members=2)


@dataclass
class CampaignReport:
    """Totals of a campaign: trials run, operations recorded, anomalies by kind (every kind
    in :data:`~.checker.KINDS`, zeros included) and the seeds of the trials that had any."""

    trials: int = 0
    operations: int = 0
    anomalies: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    failed_seeds: list[int] = field(default_factory=list)
    #: in-process engines reopened after a trial because their writer had stopped (fenced)
    reopened: int = 0
    #: process faults injected, by kind (:mod:`.process_faults`)
    process_faults: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not any(self.anomalies.values())


def trial_line(index: int, trials: int, seed: int, result: TrialResult) -> str:
    """One line per trial: ``trial 1/3 seed 42 topic T: 164 operations, 0 anomalies`` plus
    ``(kind n, ...)`` when there are any."""
    counts = summarize(result.anomalies)
    text = (f"trial {index}/{trials} seed {seed} topic {result.topic}: {result.operations} operations, "
            f"{len(result.anomalies)} anomalies")
    found = ", ".join(f"{k} {n}" for k, n in counts.items() if n)
    return text + (f" ({found})" if found else "")


def run_campaign(conf: dict, trials: int, seed: int, spec: WorkloadSpec | None = None,
                 echo: Callable[[str], None] = print, history_dir: str | None = None,
                 serve: bool = False, process_faults: tuple[str, ...] = (),
                 store_restart: Callable[[], None] | None = None,
                 readers: dict[str, Callable] | None = None,
                 on_trial: Callable[[int, TrialResult], None] | None = None) -> CampaignReport:
    """Run ``trials`` trials on the root of ``conf``, trial ``i`` (from 0) with seed ``seed + i``
    on a new topic ``verify-<seed>-<random>``, echoing one :func:`trial_line` per trial and
    each anomaly under it.

    The trials' group coordinator starts a group without waiting for more members
    (:data:`~.ctp.GROUP_BROKER_SETTINGS`, unless ``conf`` sets it): in-process through
    ``conf``, through ``txlake serve`` as its ``--config``.

    Args:
        conf: client config of the root (``storage.url``, ``storage.options``).
        trials: how many trials (>= 1).
        spec: the workload of each trial (default :data:`DEFAULT_SPEC`: with the
            consume-transform-produce group).
        seed: the first trial's seed; re-run one trial with its own seed and ``trials=1``.
        history_dir: a local directory to write each trial's history to
            (``<topic>.jsonl``), or None.
        serve: run the trials through ``txlake serve`` started on the root (one server for
            the campaign) with confluent-kafka clients, transactional writer ``t0`` a child
            process SIGKILLed mid-transaction and restarted, the final state read over the
            wire, by an in-process Consumer and through DuckDB.
        process_faults: kinds of :data:`~.process_faults.PROCESS_FAULTS`, one per trial in
            turn (:mod:`.process_faults`); counted in the report's ``process_faults``.
        store_restart: restarts the object store, for ``store-restart``.
        readers: the final readers of the root (default :func:`~.workload.default_readers` of
            ``conf``); through ``txlake serve`` the wire reader is added to them.
        on_trial: called with each trial's seed and :class:`~.workload.TrialResult` once it is checked.

    Raises:
        ValueError: ``trials`` < 1; a process fault that needs ``serve`` or ``store_restart``.
        KafkaException: a trial could not run (see :func:`~.workload.run_trial`).
        RuntimeError: ``txlake serve`` or a killed writer's restart failed.
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    from .process_faults import CLIENT_TIMEOUT_MS, ProcessFaults, RestartableServe

    spec = spec or DEFAULT_SPEC
    if not serve:
        conf = {**GROUP_BROKER_SETTINGS, **conf}
        faults = ProcessFaults(process_faults, conf, None, store_restart) if process_faults else None
        return _trials(conf, trials, seed, spec, echo, history_dir, {} if readers is None else {"readers": readers},
                       faults, on_trial)
    import dataclasses
    import tempfile

    with tempfile.TemporaryDirectory(prefix="txlake-verify-serve-") as run_dir, \
            open(os.path.join(run_dir, "serve.log"), "w") as log:
        server = RestartableServe(conf["storage.url"], conf.get("storage.options") or {}, run_dir, log,
                                  settings=GROUP_BROKER_SETTINGS)
        try:
            wire = {"bootstrap.servers": server.address}
            faults = None
            if process_faults:  # a request outlives a stopped server: the clients time out and retry
                wire["socket.timeout.ms"] = CLIENT_TIMEOUT_MS
                wire["log_level"] = 2  # not librdkafka's "connection refused" lines while the server is down
                wire["reconnect.backoff.max.ms"] = 500  # back within a second of the server (default: up to 10 s)
                faults = ProcessFaults(process_faults, conf, server, store_restart, run_dir, log)
            readers = {"wire": lambda topic, n: final_consumer_read(wire, topic, n, drain_s=2.0),
                       **(default_readers(conf) if readers is None else readers)}
            spec = dataclasses.replace(spec, send_interval_ms=200)  # kills land between sends
            report = _trials(wire, trials, seed, spec, echo, history_dir,
                             dict(readers=readers, drain_s=2.0, kill_writer=run_dir), faults, on_trial)
        finally:
            code = server.stop()
            server.close()
        if code != 0:
            raise RuntimeError(f"txlake serve exited {code} on SIGTERM")
    return report


def _trials(conf: dict, trials: int, seed: int, spec: WorkloadSpec, echo: Callable[[str], None],
            history_dir: str | None, options: dict, faults=None,
            on_trial: Callable[[int, TrialResult], None] | None = None) -> CampaignReport:
    from contextlib import nullcontext

    report = CampaignReport()
    run = uuid.uuid4().hex[:8]
    for i in range(trials):
        trial_seed = seed + i
        topic = f"verify-{trial_seed}-{run}"
        with faults.during(i, trial_seed) if faults is not None else nullcontext():
            for attempt in range(_SETUP_ATTEMPTS):
                try:
                    result = _one_trial(conf, trial_seed, topic, spec, history_dir, options)
                    break
                except Exception:
                    if "storage.url" not in conf or attempt == _SETUP_ATTEMPTS - 1 or not _reopen_stopped():
                        raise
                    # the writer fenced itself (a cas.race) before the trial could start: reopen, run it again
                    report.reopened += 1
                    topic = f"verify-{trial_seed}-{run}-{attempt + 1}"
        if faults is not None:
            report.process_faults = dict(faults.injected)
        if "storage.url" in conf:  # in-process: a writer that fenced itself (a cas.race fault) is reopened
            report.reopened += _reopen_stopped()
        report.trials += 1
        report.operations += result.operations
        for kind, n in summarize(result.anomalies).items():
            report.anomalies[kind] += n
        if result.anomalies:
            report.failed_seeds.append(trial_seed)
        if on_trial is not None:
            on_trial(trial_seed, result)
        echo(trial_line(i + 1, trials, trial_seed, result))
        for a in result.anomalies:
            echo(f"  {a.kind} at {a.where or 'log'}: {a.note}; records {list(a.records)}")
    return report


#: runs of a trial whose in-process writer fenced itself (a cas.race) before the trial could start
_SETUP_ATTEMPTS = 8


def _one_trial(conf: dict, seed: int, topic: str, spec: WorkloadSpec, history_dir: str | None,
               options: dict) -> TrialResult:
    """:func:`run_trial`, its history written to ``history_dir/<topic>.jsonl`` when given."""
    if history_dir is None:
        return run_trial(conf, seed, topic, spec, **options)
    os.makedirs(history_dir, exist_ok=True)
    with open(os.path.join(history_dir, f"{topic}.jsonl"), "w") as sink:
        return run_trial(conf, seed, topic, spec, sink, **options)


def _reopen_stopped() -> int:
    """Close the in-process engines whose writer stopped (fenced by a cas.race fault), so the next
    client reopens the root and takes the lease, as a restarted process would; how many."""
    from txlake.engine.registry import close_stopped

    return close_stopped()
