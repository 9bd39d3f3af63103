"""The group-mode copy test of the consumer-groups issue (KIP-447).

A consumer group of 3 transactional workers (threads of one ``python -m txlake.group_copier``
process, the storage root's writer) copies 9 partitions. First run: two workers start, a
third joins after some commits (a rebalance), then the whole process -- engine, group
coordinator, workers -- is SIGKILLed. Second run: three workers restart (same
transactional ids: their predecessors' open transactions are aborted), and one of them
crashes, abandoning an open transaction without any cleanup (its partitions move to the
others after ``max.poll.interval.ms``; its transaction is aborted at its timeout). At the
end every target partition holds exactly its source partition's records, in order, once.
"""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest

from txlake import AdminClient, NewTopic, Producer
from txlake.copier import derive
from txlake.engine import registry
from txlake.group_copier import committed_offsets, wait_until_decided
from helpers import client_conf
from helpers.copier_proc import GroupCopierProcess
from test_txn_crash import consume

PARTITIONS = 9
RECORDS = 27_000
SOURCE, TARGET, GROUP = "gsrc", "gdst", "gcopy"
WAIT = 120.0
#: broker settings: no initial rebalance delay, short session timeouts allowed, fast timeout aborts
BROKER = {"group.initial.rebalance.delay.ms": 0, "group.min.session.timeout.ms": 100,
          "transaction.abort.timed.out.transaction.cleanup.interval.ms": 500,
          "transaction.state.log.num.partitions": 5, "offsets.topic.num.partitions": 5}


@pytest.fixture
def group_copiers():
    started: list[GroupCopierProcess] = []

    def start(storage, *options: str) -> GroupCopierProcess:
        proc = GroupCopierProcess(storage, SOURCE, TARGET, GROUP, list(options),
                                  {**BROKER, "storage.lease.force": True})
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()
    registry.close_all()


@pytest.mark.parametrize("backend", ["file", pytest.param("s3", marks=pytest.mark.s3)])
def test_group_copy_with_rebalances_a_worker_crash_and_an_engine_kill(storage, group_copiers):
    conf = client_conf(storage, BROKER)
    with AdminClient(conf) as admin:
        for topic in (SOURCE, TARGET):
            admin.create_topics([NewTopic(topic, PARTITIONS)])[topic].result()
    values = [json.dumps({"origin": f"o{i % 13}", "dest": f"d{i}", "arr_delay": i}).encode() for i in range(RECORDS)]
    with Producer(conf) as producer:
        producer.produce_arrow(SOURCE, pa.table({"value": pa.array(values, pa.binary()),
                                                 "partition": pa.array([i % PARTITIONS for i in range(RECORDS)], pa.int32())}),
                               key=None, partition="partition")
    source = {(p, o): v for p, o, v in consume(storage, SOURCE, PARTITIONS, "read_committed")}
    assert len(source) == RECORDS
    registry.close_all()   # the group process becomes the writer

    # ---- run 1: two workers, a third joins after 4 commits; the process is killed after 10 commits
    first = group_copiers(storage, "--workers", "3", "--join-later", "1", "--join-after-commits", "4",
                          "--batch-records", "500")
    first.wait_event("started", timeout=WAIT, pred=lambda e: e["worker"] == 2)
    first.wait_event("committed", timeout=WAIT, pred=lambda e: len(first.of("committed")) >= 10)
    assert {e["worker"] for e in first.of("assigned")} >= {0, 1}
    first.kill()

    # ---- run 2: three workers; worker 0 crashes after 3 commits with its transaction open
    second = group_copiers(storage, "--workers", "3", "--crash-worker", "0", "--crash-after-commits", "3",
                           "--batch-records", "500")
    done = second.wait_event("done", timeout=3 * WAIT)
    second.wait_exit(timeout=WAIT)
    assert second.of("crashed") and second.of("crashed")[0]["worker"] == 0
    assert any(e["worker"] != 0 and e["partitions"] for e in second.of("assigned")
               if second.events.index(e) > second.events.index(second.of("crashed")[0])), \
        "the crashed worker's partitions were never handed to another worker"
    assert sum(done["copied"].values()) > 0

    # ---- exactly once: every source record once, in its partition, in order
    conf = client_conf(storage, BROKER)
    wait_until_decided(conf, TARGET, timeout_s=WAIT)    # the crashed worker's transaction is aborted at its timeout
    out = consume(storage, TARGET, PARTITIONS, "read_committed")
    assert len(out) == RECORDS
    seen = {}
    for p, offset, value in out:
        src = tuple(json.loads(value)["src"])
        assert src not in seen, f"source record {src} copied twice"
        seen[src] = (p, offset)
        assert src[0] == p
        assert value.encode() == derive(source[src].encode(), *src)[1]
    assert set(seen) == set(source)
    for p in range(PARTITIONS):
        order = [json.loads(v)["src"][1] for q, _, v in out if q == p]
        assert order == sorted(order), f"target partition {p} is out of source order"
    assert committed_offsets(conf, SOURCE, GROUP) == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
