"""``txlake groups list|describe`` (kafka-consumer-groups.sh): groups as persisted in __consumer_offsets."""

from __future__ import annotations

from click.testing import CliRunner

from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from txlake.cli import main
from txlake.engine import registry

BROKER = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 100}


def test_groups_list_and_describe(tmp_path):
    url = f"file://{tmp_path}/root"
    conf = {"storage.url": url, **BROKER}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("in", 3)])["in"].result()
    with Producer(conf) as p:
        for i in range(30):
            p.produce("in", value=b"x", partition=i % 3)
    member = Consumer({**conf, "group.id": "live", "auto.offset.reset": "earliest", "client.id": "c1",
                       "enable.auto.commit": False})
    member.subscribe(["in"])
    got = 0
    while got < 25:
        got += len(member.consume(100, 0.5))
    member.commit(offsets=[TopicPartition("in", 0, 10), TopicPartition("in", 1, 7)], asynchronous=False)
    with Consumer({**conf, "group.id": "simple"}) as simple:
        simple.commit(offsets=[TopicPartition("in", 2, 3)], asynchronous=False)
    member_id = member.consumer_group_metadata().member_id
    try:
        runner = CliRunner()
        listed = runner.invoke(main, ["--storage", url, "groups", "list"])
        assert listed.exit_code == 0, listed.output
        assert listed.output.splitlines() == ["live\tStable\tconsumer", "simple\tEmpty\t-"]
        described = runner.invoke(main, ["--storage", url, "groups", "describe", "live"])
        assert described.exit_code == 0, described.output
        lines = described.output.splitlines()
        assert lines[0].startswith("GROUP live  STATE Stable  GENERATION 1  PROTOCOL range  LEADER " + member_id)
        assert lines[1] == "" and lines[2].split() == ["TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                                                       "CONSUMER-ID", "CLIENT-ID"]
        rows = [line.split() for line in lines[3:]]
        assert rows == [["in", "0", "10", "10", "0", member_id, "c1"],
                        ["in", "1", "7", "10", "3", member_id, "c1"],
                        ["in", "2", "-", "10", "-", member_id, "c1"]]
        simple = runner.invoke(main, ["--storage", url, "groups", "describe", "simple"])
        srows = [line.split() for line in simple.output.splitlines()[3:]]
        assert "STATE Empty" in simple.output and srows == [["in", "2", "3", "10", "7", "-", "-"]]
        missing = runner.invoke(main, ["--storage", url, "groups", "describe", "nope"])
        assert "Consumer group 'nope' does not exist." in missing.output
    finally:
        member.close()
        registry.close_all()
