"""The txlake command line, through click's CliRunner (in process)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from txlake import OFFSET_BEGINNING, Consumer, TopicPartition
from txlake.catalog.storage import ObjectStore
from txlake.cli import main
from txlake.engine import registry
from txlake.engine.broker import Broker
from txlake.engine.partitioner import partition_for_key

PEOPLE = [
    {"id": 1, "name": "alice", "city": "Oslo", "score": 10.5},
    {"id": 2, "name": "bob", "city": "Lima", "score": 3.0},
    {"id": 3, "name": "carol", "city": "Oslo", "score": None},
    {"id": 4, "name": "dave", "city": "Kyiv", "score": 7.25},
    {"id": 5, "name": "erin", "city": "Lima", "score": 1.0},
]


@pytest.fixture(autouse=True)
def _close_engines(monkeypatch):
    monkeypatch.delenv("TXLAKE_STORAGE", raising=False)
    monkeypatch.delenv("TXLAKE_STORAGE_OPTIONS", raising=False)
    yield
    registry.close_all()


@pytest.fixture
def root(tmp_path):
    return f"file://{tmp_path}/root"


def storage_args(url, options=None):
    args = ["--storage", url]
    for k, v in (options or {}).items():
        args += ["-O", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    return args


def run(args, ok=True, **kwargs):
    result = CliRunner().invoke(main, args, catch_exceptions=False, env={"COLUMNS": "200"}, **kwargs)
    if ok:
        assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def consume_all(url, options, topic, partitions):
    c = Consumer({"storage.url": url, "storage.options": options or {}})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out = []
    try:
        while True:
            msgs = c.consume(1000, 0.5)
            if not msgs:
                break
            out += msgs
    finally:
        c.close()
    return sorted(out, key=lambda m: (m.partition(), m.offset()))


def write_inputs(tmp_path):
    csv_path = tmp_path / "people.csv"
    csv_path.write_text("id,name,city,score\n" + "".join(
        f"{r['id']},{r['name']},{r['city']},{'' if r['score'] is None else r['score']}\n" for r in PEOPLE))
    jsonl_path = tmp_path / "people.jsonl"
    jsonl_path.write_text("".join(json.dumps(r) + "\n" for r in PEOPLE))
    parquet_path = tmp_path / "people.parquet"
    pq.write_table(pa.Table.from_pylist(PEOPLE), parquet_path)
    return {"csv": csv_path, "jsonl": jsonl_path, "parquet": parquet_path}


# ------------------------------------------------------------------ topics
def test_topics_create_list_describe_delete(root):
    s = storage_args(root)
    assert run(["topics", "create", "orders.eu-1", "--partitions", "3", "--config", "cleanup.policy=delete", *s]
               ).stdout == "Created topic orders.eu-1.\n"
    # --storage also works before the command
    assert run([*s, "topics", "create", "audit"]).stdout == "Created topic audit.\n"
    assert run(["topics", "create", "audit", "--if-not-exists", *s]).stdout == "Topic audit already exists.\n"
    assert run(["topics", "list", *s]).stdout == "audit\norders.eu-1\n"
    out = run(["topics", "describe", "orders.eu-1", *s]).stdout
    assert "Topic: orders.eu-1" in out and "PartitionCount: 3" in out and "Configs: cleanup.policy=delete" in out
    for col in ("Partition", "Log start offset", "High watermark", "LSO", "Segments", "Bytes"):
        assert col in out
    rows = [line.replace("│", " ").split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    # partition, log start, high watermark, LSO, records, segments, bytes
    assert rows == [[str(p), "0", "0", "0", "0", "0", "0", "B"] for p in range(3)]
    both = run(["topics", "describe", *s]).stdout
    assert "Topic: audit" in both and "Topic: orders.eu-1" in both
    assert run(["topics", "delete", "audit", *s]).stdout == "Deleted topic audit.\n"
    assert run(["topics", "list", *s]).stdout == "orders.eu-1\n"


def test_storage_defaults_to_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TXLAKE_STORAGE", f"file://{tmp_path}/envroot")
    run(["topics", "create", "t"])
    assert run(["topics", "list"]).stdout == "t\n"
    assert run(["topics", "list", "--storage", f"file://{tmp_path}/other"]).stdout == ""
    assert (tmp_path / "envroot" / "_catalog").is_dir()


def test_every_command_has_help():
    commands = [[], ["topics"], ["topics", "create"], ["topics", "list"], ["topics", "describe"], ["topics", "delete"],
                ["produce"], ["consume"], ["sql"], ["demo"]]
    for cmd in commands:
        out = run([*cmd, "--help"]).stdout
        assert out.startswith("Usage: ") and ("--storage" in out or cmd == []), cmd
    assert "--storage URL" in run(["--help"]).stdout


# ------------------------------------------------------------------ produce / consume / sql
@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_produce_file_with_key_column(root, tmp_path, fmt):
    path = write_inputs(tmp_path)[fmt]
    s = storage_args(root)
    run(["topics", "create", "people", "--partitions", "4", *s])
    out = run(["produce", "people", "--file", str(path), "--key-column", "name", *s]).stdout
    assert "Produced 5 records to people" in out
    msgs = consume_all(root, {}, "people", 4)
    assert len(msgs) == 5
    by_name = {m.key().decode(): m for m in msgs}
    assert set(by_name) == {r["name"] for r in PEOPLE}
    for r in PEOPLE:
        m = by_name[r["name"]]
        assert m.partition() == partition_for_key(r["name"].encode(), 4)
        assert json.loads(m.value()) == r  # the whole row as a JSON object, types kept
    for p in {m.partition() for m in msgs}:
        offsets = [m.offset() for m in msgs if m.partition() == p]
        assert offsets == list(range(len(offsets)))
        assert f"\n         {p} │" in out  # the per-partition summary row


def test_produce_value_and_timestamp_columns_and_fixed_partition(root, tmp_path):
    path = tmp_path / "ev.csv"
    path.write_text("user,payload,at\nu1,hello,2024-01-01T00:00:00\nu2,world,2024-01-02T12:30:00\n")
    s = storage_args(root)
    run(["topics", "create", "events", "-p", "3", *s])
    run(["produce", "events", "-f", str(path), "--key-column", "user", "--value-column", "payload",
         "--timestamp-column", "at", "--partition", "2", *s])
    msgs = consume_all(root, {}, "events", 3)
    assert [(m.partition(), m.offset(), m.key(), m.value(), m.timestamp()[1]) for m in msgs] == [
        (2, 0, b"u1", b"hello", 1704067200000), (2, 1, b"u2", b"world", 1704198600000)]


def test_round_trip_on_every_backend(storage, tmp_path):
    """create, produce (CSV), consume and sql through the CLI on file, memory and s3 roots."""
    s = storage_args(storage.url, storage.options)
    path = write_inputs(tmp_path)["csv"]
    run(["topics", "create", "people", "--partitions", "2", *s])
    run(["produce", "people", "--file", str(path), "-k", "city", *s])
    res = run(["consume", "people", "--from-beginning", "--max-messages", "5", *s])
    lines = res.stdout.splitlines()
    assert len(lines) == 5 and res.stderr.endswith("Processed a total of 5 messages\n")
    parsed = sorted((int(p.split(":")[1]), int(o.split(":")[1]), k, json.loads(v)["id"])
                    for p, o, k, v in (line.split("\t") for line in lines))
    want = sorted((partition_for_key(r["city"].encode(), 2), r["city"], r["id"]) for r in PEOPLE)
    assert sorted((p, k, i) for p, _, k, i in parsed) == want
    out = run(["sql", "SELECT decode(key) AS city, count(*) AS n FROM people GROUP BY 1 ORDER BY 1",
               "--format", "csv", *s]).stdout
    assert out == "city,n\nKyiv,1\nLima,2\nOslo,2\n"


def test_consume_output_like_kafka_console_consumer(root, tmp_path):
    s = storage_args(root)
    run(["topics", "create", "t", *s])
    (tmp_path / "v.jsonl").write_text("".join(json.dumps({"k": f"k{i}", "v": f"v{i}"}) + "\n" for i in range(6)))
    run(["produce", "t", "-f", str(tmp_path / "v.jsonl"), "--key-column", "k", "--value-column", "v", *s])
    res = run(["consume", "t", "--from-beginning", "--timeout", "0.5", *s])
    assert res.stdout == "".join(f"Partition:0\tOffset:{i}\tk{i}\tv{i}\n" for i in range(6))
    assert res.stderr == "Processed a total of 6 messages\n"
    res = run(["consume", "t", "--partition", "0", "--offset", "4", "--timeout", "0.5", "--value-only", *s])
    assert res.stdout == "v4\nv5\n"
    res = run(["consume", "t", "--from-beginning", "--max-messages", "2", *s])
    assert res.stdout.splitlines() == ["Partition:0\tOffset:0\tk0\tv0", "Partition:0\tOffset:1\tk1\tv1"]
    # default: only records written from now on (as kafka-console-consumer)
    res = run(["consume", "t", "--timeout", "0.3", *s])
    assert res.stdout == "" and res.stderr == "Processed a total of 0 messages\n"
    res = run(["consume", "t", "--offset", "1", *s], ok=False)
    assert res.exit_code == 2 and "--offset needs --partition" in res.stderr


def test_sql_formats(root, tmp_path):
    s = storage_args(root)
    run(["topics", "create", "my.topic-1", "-p", "2", *s])
    run(["produce", "my.topic-1", "-f", str(write_inputs(tmp_path)["parquet"]), "-k", "name", *s])
    q = ('SELECT decode(key) AS name, CAST(json_extract(decode(value), \'$.score\') AS DOUBLE) AS score '
         'FROM "my.topic-1" ORDER BY name')
    table = run(["sql", q, *s]).stdout
    lines = table.splitlines()
    assert lines[1] == "┃ name  ┃ score ┃"
    assert lines[3:8] == ["│ alice │  10.5 │", "│ bob   │     3 │", "│ carol │  NULL │", "│ dave  │  7.25 │",
                          "│ erin  │     1 │"]
    assert lines[-1] == "5 rows"
    assert json.loads(run(["sql", q, "--format", "json", *s]).stdout) == [
        {"name": r["name"], "score": r["score"]} for r in sorted(PEOPLE, key=lambda r: r["name"])]
    lines = run(["sql", q, "--format", "jsonl", *s]).stdout.splitlines()
    assert [json.loads(x)["name"] for x in lines] == sorted(r["name"] for r in PEOPLE)
    csv_out = run(["sql", 'SELECT partition, "offset", timestamp, timestampType FROM "my.topic-1" '
                          'ORDER BY 1, 2 LIMIT 1', "--format", "csv", *s]).stdout
    assert csv_out.splitlines()[0] == "partition,offset,timestamp,timestampType"


# ------------------------------------------------------------------ errors
def test_errors_print_kafka_names_not_tracebacks(root, tmp_path):
    s = storage_args(root)
    res = run(["topics", "create", "bad/name", *s], ok=False)
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.stderr.startswith("Error: INVALID_TOPIC_EXCEPTION: Topic name is invalid: 'bad/name' contains one or more")
    res = run(["topics", "create", "t", "--config", "no.such.config=1", *s], ok=False)
    assert res.exit_code == 1 and res.stderr == "Error: INVALID_CONFIG: Unknown topic config name: no.such.config\n"
    res = run(["topics", "create", "t", "--config", "retention.ms=abc", *s], ok=False)
    assert res.exit_code == 1 and res.stderr.startswith("Error: INVALID_CONFIG: Invalid value abc for configuration")
    run(["topics", "create", "t", *s])
    res = run(["topics", "create", "t", *s], ok=False)
    assert res.exit_code == 1 and res.stderr == "Error: TOPIC_ALREADY_EXISTS: Topic 't' already exists.\n"
    res = run(["topics", "describe", "nope", *s], ok=False)
    assert res.exit_code == 1 and "UNKNOWN_TOPIC_OR_PART" in res.stderr
    res = run(["topics", "delete", "nope", *s], ok=False)
    assert res.exit_code == 1 and "UNKNOWN_TOPIC_OR_PART" in res.stderr
    path = write_inputs(tmp_path)["csv"]
    res = run(["produce", "nope", "-f", str(path), *s], ok=False)
    assert res.exit_code == 1 and res.stderr.startswith("Error: _UNKNOWN_TOPIC: Topic 'nope' does not exist")
    res = run(["produce", "t", "-f", str(path), "-k", "missing", *s], ok=False)
    assert res.exit_code == 2 and "--key-column 'missing' is not a column" in res.stderr
    res = run(["consume", "nope", "--from-beginning", "--timeout", "0.1", *s], ok=False)
    assert res.exit_code == 1 and "UNKNOWN_TOPIC_OR_PART" in res.stderr
    res = run(["sql", "SELECT * FROM nope", *s], ok=False)
    assert res.exit_code == 1 and res.stderr.startswith("Error: Catalog Error: Table with name nope does not exist")
    assert "Traceback" not in res.output


def test_second_writer_gets_a_clear_error(root, tmp_path):
    s = storage_args(root)
    run(["topics", "create", "t", *s])
    path = write_inputs(tmp_path)["csv"]
    holder = Broker(ObjectStore(root))  # another writer (its own engine, as another process would have)
    holder.ensure_writer()
    try:
        for args in (["topics", "create", "u"], ["topics", "delete", "t"], ["produce", "t", "-f", str(path)]):
            res = run([*args, *s], ok=False)
            assert res.exit_code == 1, args
            assert res.stderr.startswith("Error: NOT_LEADER_OR_FOLLOWER: storage root ")
            assert "is held by writer" in res.stderr and "a second writer cannot start" in res.stderr
            assert "Traceback" not in res.output
        # readers keep working while another process writes
        assert run(["topics", "list", *s]).stdout == "t\n"
        assert run(["sql", "SELECT count(*) AS n FROM t", "--format", "csv", *s]).stdout == "n\n0\n"
        run(["consume", "t", "--from-beginning", "--timeout", "0.2", *s])
        # the user may force the takeover of a writer known to be gone
        run(["topics", "create", "u", "--force-lease", *s])
        assert run(["topics", "list", *s]).stdout == "t\nu\n"
    finally:
        holder.close()
