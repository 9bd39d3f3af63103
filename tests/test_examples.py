"""The confluent-kafka-style programs under examples/ (issue 17), each run as a real subprocess
on a fresh storage root: their exit status, their output, and what they wrote there.

They do what confluent-kafka-python's examples do (producer.py, consumer.py with
store_offsets, eos_transactions.py, adminapi.py, get_watermark_offsets.py,
context_manager_example.py), in its style; only the import and ``storage.url`` differ.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from test_client_parity import conf, create  # noqa: F401 - fixture
from test_confluent_scenarios import read_all

from txlake import AdminClient, Consumer, TopicPartition

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(name: str, *args: str, stdin: str = "", cwd: Path) -> subprocess.CompletedProcess:
    """``examples/<name>`` with the test's Python, from a neutral directory; 60 s at most."""
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], input=stdin, capture_output=True,
                          text=True, timeout=60, cwd=cwd)


def committed(conf, group: str, topic: str, partitions: int) -> list[int]:
    with Consumer({**conf, "group.id": group}) as c:
        return [tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)]


def test_producer_consumer_and_watermark_examples(conf, tmp_path):
    url = conf["storage.url"]
    create(conf, "lines", 2)
    lines = [f"line {i}" for i in range(6)]
    produced = run("producer.py", url, "lines", stdin="".join(f"{x}\n" for x in lines), cwd=tmp_path)
    assert produced.returncode == 0, produced.stderr
    delivered = [x for x in produced.stderr.splitlines() if x.startswith("% Message delivered to lines [")]
    assert len(delivered) == 6 and "% Waiting for" in produced.stderr
    records = read_all(conf, "lines", 2)
    assert sorted(r[3] for r in records) == sorted(x.encode() for x in lines)
    by_partition = {p: [r[3].decode() for r in records if r[0] == p] for p in (0, 1)}

    consumed = run("consumer.py", "--max-messages", "4", url, "readers", "lines", cwd=tmp_path)
    assert consumed.returncode == 0, consumed.stderr
    values = consumed.stdout.splitlines()
    assert len(values) == 4 and "Assignment: [" in consumed.stderr
    # each partition is read in order; what was stored (and committed on close) is what was handled
    offsets = committed(conf, "readers", "lines", 2)
    read = {p: [v for v in values if v in by_partition[p]] for p in (0, 1)}
    assert read == {p: by_partition[p][:len(read[p])] for p in (0, 1)}
    assert offsets == [len(read[p]) if read[p] else -1001 for p in (0, 1)]

    watermarks = run("get_watermark_offsets.py", url, "readers", "lines", cwd=tmp_path)
    assert watermarks.returncode == 0, watermarks.stderr
    rows = [line.split() for line in watermarks.stdout.splitlines()[1:]]
    assert [(r[0], r[1], int(r[2]), int(r[3]), r[4], int(r[5])) for r in rows] == [
        ("lines", f"[{p}]", 0, len(by_partition[p]), str(offsets[p]) if offsets[p] >= 0 else "-",
         len(by_partition[p]) - max(offsets[p], 0)) for p in (0, 1)]


def test_the_exactly_once_copier_example(conf, tmp_path):
    url = conf["storage.url"]
    create(conf, "in", 2)
    create(conf, "out", 2)
    from txlake import Producer
    with Producer(conf) as p:
        for i in range(25):
            p.produce("in", value=f"record {i}".encode(), key=f"k{i % 5}".encode(), partition=i % 2)
    copied = run("eos_transactions.py", url, "in", "out", "copier", "--batch", "10", cwd=tmp_path)
    assert copied.returncode == 0, copied.stderr
    assert copied.stdout.splitlines()[-1] == "=== copied 25 records ==="
    assert copied.stdout.count("=== committed 10 records (batch) ===") == 2
    source, target = read_all(conf, "in", 2), read_all(conf, "out", 2)
    for p in (0, 1):  # every record once, in its partition's order, transformed
        assert [(r[2], r[3].upper()) for r in source if r[0] == p] == [(r[2], r[3]) for r in target if r[0] == p]
    # the input offsets were committed with the output: a second run copies nothing more
    assert committed(conf, "copier", "in", 2) == [13, 12]


def test_the_admin_tour_example(conf, tmp_path):
    url = conf["storage.url"]

    def admin(*args):
        return run("adminapi.py", url, *args, cwd=tmp_path)

    made = admin("create_topics", "a:2", "b")
    assert (made.returncode, made.stdout.splitlines()) == (0, ["Topic a created", "Topic b created"])
    again = admin("create_topics", "a")
    assert (again.returncode, again.stdout.strip()) == (1, "Failed to create topic a: Topic 'a' already exists.")
    grown = admin("create_partitions", "a", "3")
    assert (grown.returncode, grown.stdout.strip()) == (0, "Additional partitions created for topic a")
    altered = admin("incremental_alter_configs", "topic", "a", "SET:retention.ms=1234", "APPEND:cleanup.policy=compact")
    assert (altered.returncode, altered.stdout.strip()) == (0, "ConfigResource(ResourceType.TOPIC,a) configuration "
                                                               "altered")
    configs = admin("describe_configs", "topic", "a").stdout.splitlines()
    assert "ConfigResource(ResourceType.TOPIC,a): retention.ms = 1234" in configs
    assert "ConfigResource(ResourceType.TOPIC,a): cleanup.policy = delete,compact" in configs
    described = admin("describe_topics", "a")
    assert described.stdout.strip().endswith("partition 0 leader 1, partition 1 leader 1, partition 2 leader 1")
    deleted = admin("delete_topics", "b")
    assert (deleted.returncode, deleted.stdout.strip()) == (0, "Topic b deleted")
    listed = admin("list_topics").stdout.splitlines()
    with AdminClient(conf) as in_process:
        cluster_id = in_process.cluster_id()
    assert listed == [f"Cluster {cluster_id} metadata: 1 topics", '  "a" with 3 partition(s)']
    # a group with committed offsets only: listed, described, its offsets, deleted
    with Consumer({**conf, "group.id": "g"}) as c:
        c.commit(offsets=[TopicPartition("a", 1, 0)], asynchronous=False)
    groups = admin("list_consumer_groups")
    assert groups.stdout.strip() == "Group g: state EMPTY, simple True"
    assert admin("list_consumer_group_offsets", "g").stdout.strip() == "g: a [1] offset 0"
    gone = admin("delete_consumer_groups", "g")
    assert (gone.returncode, gone.stdout.strip()) == (0, "Group g deleted")
    latest = admin("list_offsets", "a", "0", "latest")
    assert latest.stdout.strip() == "a [0] latest: offset 0 timestamp -1"
    usage = admin("no_such_command")
    assert usage.returncode == 2 and "Commands:" in usage.stderr


def test_the_context_manager_example(conf, tmp_path):
    done = run("context_manager_example.py", conf["storage.url"], "demo", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "Created topic demo", "Produced 3 records at offsets [0, 1, 2]",
        "The producer is closed: Producer has been closed",
        "Consumed key-0=value-0 at offset 0", "Consumed key-1=value-1 at offset 1",
        "Consumed key-2=value-2 at offset 2", "The consumer is closed: Consumer closed"]
    assert [(r[1], r[2], r[3]) for r in read_all(conf, "demo")] == [
        (i, f"key-{i}".encode(), f"value-{i}".encode()) for i in range(3)]


@pytest.mark.parametrize("name", ["producer.py", "consumer.py", "eos_transactions.py", "adminapi.py",
                                  "get_watermark_offsets.py", "context_manager_example.py"])
def test_each_example_differs_from_confluent_kafka_code_only_in_import_and_storage_url(name):
    """The programs name confluent-kafka's spelling beside each line that differs, and use no
    txlake-only API (the rest is confluent-kafka code)."""
    text = (EXAMPLES / name).read_text()
    tree = ast.parse(text)
    tree.body = tree.body[1:] if isinstance(tree.body[0], ast.Expr) else tree.body   # the module docstring
    code = [line for line in ast.unparse(tree).splitlines() if "txlake" in line]      # comments are gone too
    assert code and all(line.startswith("from txlake") for line in code), code
    assert "confluent-kafka:" in text and '"storage.url"' in text
    for txlake_only in ("produce_arrow", "storage.options", "txlake.engine", "duckdb"):
        assert txlake_only not in text
