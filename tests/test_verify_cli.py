"""``txlake verify``: a short campaign on file:// and S3 (the test suite's campaign), and
exit status 1 naming the seed when a trial has an anomaly."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from helpers import close_engines  # noqa: F401 (fixture)
from txlake.cli import main
from txlake.verify import KINDS, History
from txlake.verify.ctp import plans

ZEROS = ", ".join(f"{k} 0" for k in KINDS)


def storage_args(storage) -> list[str]:
    import json

    args = ["--storage", storage.url]
    for k, v in storage.options.items():
        args += ["-O", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    return args


@pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_short_campaign_finds_no_anomaly(storage, close_engines, tmp_path):  # noqa: F811
    result = CliRunner().invoke(main, ["verify", "--trials", "3", "--seed", "11", "--history-dir",
                                       str(tmp_path / "h"), *storage_args(storage)], catch_exceptions=False)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    assert len(lines) == 4, result.stdout
    ops = []
    for i, line in enumerate(lines[:3]):
        m = re.fullmatch(rf"trial {i + 1}/3 seed {11 + i} topic (verify-{11 + i}-[0-9a-f]{{8}}): (\d+) operations, "
                         r"0 anomalies", line)
        assert m, line
        ops.append(int(m.group(2)))
        with open(tmp_path / "h" / f"{m.group(1)}.jsonl") as fp:
            events = History.load(fp).events
        assert (len({e.value for e in events if e.type == "send"}) + len({e.txn for e in events if e.type == "txn"})
                + sum(1 for e in events if e.type in ("poll", "offset_commit"))) == ops[-1]
        # the consume-transform-produce group ran (issue 20): its members' outputs to <topic>-out,
        # its killed member restarted, its final committed offsets, every final reader read both topics
        outputs = [e for e in events if e.type == "send" and e.source is not None]
        assert outputs and {e.topic for e in outputs} == {f"{m.group(1)}-out"}
        assert {e.process.split(".")[0] for e in outputs} <= {"m0", "m1", "m2"}
        assert [e.group for e in events if e.type == "final_offsets"] == [f"{m.group(1)}-ctp"]
        assert sorted({e.reader for e in events if e.type == "final"}) == ["consumer", "delta", "duckdb"]
        for e in (e for e in events if e.type == "final"):
            assert {r[0] for r in e.records} == {m.group(1), f"{m.group(1)}-out"}
    assert lines[3] == f"3 trials, {sum(ops)} operations; anomalies: {ZEROS}"


def test_anomaly_exits_1_and_names_the_seed(tmp_path, monkeypatch, close_engines):  # noqa: F811
    """A reader that drops the last committed record (a stand-in for a reader defect) is caught."""
    import txlake.verify.workload as workload

    real = workload.final_duckdb_read
    monkeypatch.setattr(workload, "final_duckdb_read",  # of the trial's topic, not of the group's output topic
                        lambda conf, topic: real(conf, topic)[:-1] if topic.count("-") == 2 else real(conf, topic))
    result = CliRunner().invoke(main, ["verify", "--trials", "1", "--seed", "4", "--storage",
                                       f"file://{tmp_path}/root"], catch_exceptions=False)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"trial 1/1 seed 4 topic verify-4-[0-9a-f]{8}: \d+ operations, 1 anomalies \(lost-write 1\)",
                        lines[0]), lines[0]
    assert re.fullmatch(r"  lost-write at duckdb: '[^']+' was (committed|acknowledged) but duckdb lacks it; "
                        r"records \[\('verify-4-[0-9a-f]{8}', [01], \d+, '[^']+'\)\]", lines[1]), lines[1]
    assert lines[2] == "1 trials, " + lines[0].split(": ")[1].split(",")[0] + "; anomalies: " + \
        ZEROS.replace("lost-write 0", "lost-write 1")
    assert result.stderr == "anomalies in the trials of seeds [4]\n"


def test_trials_must_be_positive():
    result = CliRunner().invoke(main, ["verify", "--trials", "0"])
    assert result.exit_code == 2
    assert "Invalid value for '--trials': 0 is not in the range x>=1." in result.stderr


def test_campaign_through_txlake_serve_with_a_killed_writer(tmp_path, close_engines):  # noqa: F811
    """--serve: the trial runs through `txlake serve` (started and stopped cleanly by the command)
    with confluent-kafka clients, its writer t0 SIGKILLed mid-transaction and restarted; with
    --process-faults server-kill the server itself is SIGKILLed under load and started again on
    its address (docs/reliability.md)."""
    result = CliRunner().invoke(main, ["verify", "--serve", "--trials", "1", "--seed", "2", "--history-dir",
                                       str(tmp_path / "h"), "--storage", f"file://{tmp_path}/root",
                                       "--process-faults", "server-kill"],
                                catch_exceptions=False)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    m = re.fullmatch(r"trial 1/1 seed 2 topic (verify-2-[0-9a-f]{8}): (\d+) operations, 0 anomalies", lines[0])
    assert m, lines
    assert lines[1:] == [f"1 trials, {m.group(2)} operations; anomalies: {ZEROS}",
                         "process faults injected: server-kill 1"]
    with open(tmp_path / "h" / f"{m.group(1)}.jsonl") as fp:
        events = History.load(fp).events
    assert sorted({e.reader for e in events if e.type == "final"}) == ["consumer", "delta", "duckdb", "wire"]
    # the killed writer's open transaction, and the killed group member's (seed 2: m1 inside its transaction 0)
    [victim] = [m for m in plans(2, 2, 0.2, 10)[0] if m.kill_at is not None]
    assert (victim.name, victim.kill_at) == ("m1", 0)
    assert sorted(e.txn for e in events if e.type == "txn" and e.error == "aborted by init_transactions") \
        == ["m1-T0", "t0-T1"]


@pytest.mark.parametrize("args,message", [
    (["--process-faults", "server-nap"], "unknown process fault 'server-nap': the kinds are server-kill, server-stop, "
                                         "compaction-kill, store-restart"),
    (["--process-faults", "server-kill"], "process faults server-kill need --serve"),
    (["--process-faults", "store-restart"], "process fault store-restart needs a way to restart the object store"),
])
def test_process_fault_options_are_checked(tmp_path, args, message):
    result = CliRunner().invoke(main, ["verify", "--storage", f"file://{tmp_path}/root", *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split()), result.stderr


def test_fault_counts_printed_are_the_commands_own(tmp_path, close_engines):  # noqa: F811
    """A fault injected earlier in the process (here by another store) is not this command's:
    a run without fault options prints no fault counts."""
    from txlake.catalog.faults import injected_totals
    from txlake.catalog.storage import ObjectStore

    ObjectStore(f"file://{tmp_path}/other", {"storage.faults.put.delay.rate": 1,
                                            "storage.faults.put.delay.ms": 0}).put("k", b"x")
    assert injected_totals()["put.delay"] >= 1
    result = CliRunner().invoke(main, ["verify", "--trials", "1", "--seed", "1", "--storage",
                                       f"file://{tmp_path}/root"], catch_exceptions=False)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert len(result.stdout.splitlines()) == 2, result.stdout
    assert "object-store faults injected" not in result.stdout
