"""examples/eos_worker.py, a consume-transform-produce group member written against
confluent-kafka's API only, copies a topic exactly once unchanged on both clients (issue 17):

* ``--client confluent_kafka`` against ``txlake serve`` (a real subprocess): two worker
  processes in one group;
* ``--client txlake`` on ``storage.url``: two workers in one process (a storage root takes
  one writing process; the workers are separate clients, as two processes would be).

Every input record must be in the output exactly once (read_committed), each partition's
order kept, and the group's committed offsets at the input's end.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_client_parity import create
from test_confluent_scenarios import read_all

from txlake import Consumer, Producer, TopicPartition
from txlake.engine import registry

WORKER = Path(__file__).resolve().parent.parent / "examples" / "eos_worker.py"
PARTITIONS, PER_PARTITION = 4, 60


def prepare(conf) -> list[tuple]:
    """Topics ``in`` and ``out`` (4 partitions each) and the input records; the clients are closed
    afterwards so another process may take the root's writer lease."""
    create(conf, "in", PARTITIONS)
    create(conf, "out", PARTITIONS)
    with Producer(conf) as p:
        for i in range(PARTITIONS * PER_PARTITION):
            p.produce("in", value=f"record {i}".encode(), key=f"k{i}".encode(), partition=i % PARTITIONS)
    source = read_all(conf, "in", PARTITIONS)
    registry.close_all()
    return source


def worker_args(client: str, config: dict, **extra) -> list[str]:
    args = [sys.executable, str(WORKER), "--client", client, "--input", "in", "--output", "out", "--group", "copy",
            "--batch", "25", "--idle-exit", "1.5"]
    for key, value in config.items():
        args += ["--config", f"{key}={value}"]
    for key, value in extra.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def check_exactly_once(conf, source: list[tuple], outputs: list[str]) -> None:
    target = read_all(conf, "out", PARTITIONS)
    for p in range(PARTITIONS):
        assert [(r[2], r[3].upper()) for r in source if r[0] == p] == [(r[2], r[3]) for r in target if r[0] == p], p
    with Consumer({**conf, "group.id": "copy"}) as c:
        offsets = c.committed([TopicPartition("in", p) for p in range(PARTITIONS)], timeout=10)
    assert [tp.offset for tp in offsets] == [PER_PARTITION] * PARTITIONS
    copied = [int(line.split()[-2]) for out in outputs for line in out.splitlines() if " copied " in line]
    # both members took part (they join the group's first generation together: the coordinator's
    # group.initial.rebalance.delay.ms waits for the second) and nothing was copied twice
    assert len(copied) == 2 and min(copied) > 0 and sum(copied) == PARTITIONS * PER_PARTITION, outputs


@pytest.mark.parametrize("serve_root", ["file"], indirect=True)
def test_two_confluent_kafka_worker_processes_against_txlake_serve(serve_root, tmp_path):
    pytest.importorskip("confluent_kafka")
    conf = serve_root.storage.conf()
    source = prepare(conf)
    served = serve_root.start()
    workers = [subprocess.Popen(worker_args("confluent_kafka", {"bootstrap.servers": served.bootstrap}, name=f"w{i}"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
               for i in range(2)]
    outputs = []
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err[-3000:]
        outputs.append(out)
    assert serve_root.stop() == 0
    check_exactly_once(conf, source, outputs)
    registry.close_all()


def test_two_txlake_workers_in_one_process_on_storage_url(tmp_path):
    conf = {"storage.url": f"file://{tmp_path}/root", "storage.flush.linger.ms": 1}
    source = prepare(conf)
    done = subprocess.run(worker_args("txlake", conf, name="w", workers=2), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    check_exactly_once(conf, source, [done.stdout])
    registry.close_all()
