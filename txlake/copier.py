"""An exactly-once consume-transform-produce worker (KIP-98 + KIP-447), used by the demo.

It reads a topic read_committed, writes one derived record per input record to a target
topic, and commits its input positions with ``send_offsets_to_transaction`` in the same
transaction -- so after any crash, a restarted worker (same ``transactional.id``) resumes
from the last committed transaction: ``init_transactions`` aborts whatever the dead
worker left open, and the consumer starts from the group's committed offsets.

Run as a process (the demo kills it with SIGKILL mid-transaction)::

    python -m txlake.copier '<json config>' SOURCE TARGET GROUP TRANSACTIONAL_ID [--pause-in-txn N]

It prints one line per event on stdout: ``started``, ``committed <txn> <records>``,
``in-transaction <txn>`` (with --pause-in-txn: records of transaction N are produced and
flushed -- durable but undecided -- and the worker waits to be killed), ``done <records>``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

from . import Consumer, Producer, TopicPartition


def derive(value: bytes, partition: int, offset: int) -> tuple[bytes, bytes]:
    """The derived record of a flight: key = route, value = its arrival delay and its source position."""
    flight = json.loads(value)
    route = f"{flight.get('origin')}-{flight.get('dest')}"
    out = {"route": route, "arr_delay": flight.get("arr_delay"), "src": [partition, offset]}
    return route.encode(), json.dumps(out, separators=(",", ":")).encode()


def copy_exactly_once(conf: dict[str, Any], source: str, target: str, group: str, transactional_id: str,
                      batch_records: int = 20_000, pause_in_txn: int | None = None,
                      emit: Callable[[str], None] = print) -> int:
    """Copy ``source`` to ``target`` until the end of ``source``; return the records copied by this run."""
    consumer = Consumer({**conf, "group.id": group, "isolation.level": "read_committed",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    partitions = sorted(consumer.list_topics(source).topics[source].partitions)
    assigned = [TopicPartition(source, p) for p in partitions]
    consumer.assign(assigned)      # positions start from the group's committed offsets
    producer = Producer({**conf, "transactional.id": transactional_id, "linger.ms": 5})
    producer.init_transactions(60)  # fences a dead predecessor and aborts its open transaction
    emit("started")
    copied, txn = 0, 0
    try:
        while True:
            msgs = consumer.consume(batch_records, 1.0)
            if not msgs:
                positions = consumer.position(assigned)
                ends = [consumer.get_watermark_offsets(tp)[1] for tp in assigned]
                if all(p.offset >= end for p, end in zip(positions, ends)):
                    break
                continue
            txn += 1
            producer.begin_transaction()
            for m in msgs:
                if m.error() is not None:
                    continue
                key, value = derive(m.value(), m.partition(), m.offset())
                producer.produce(target, value=value, key=key)
            if pause_in_txn == txn:
                producer.flush(60)
                emit(f"in-transaction {txn}")
                time.sleep(600)          # the demo kills the process here
            producer.send_offsets_to_transaction(consumer.position(assigned), group, 60)
            producer.commit_transaction(60)
            copied += len(msgs)
            emit(f"committed {txn} {len(msgs)}")
    finally:
        consumer.close()
        producer.close()
    emit(f"done {copied}")
    return copied


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the worker process."""
    ap = argparse.ArgumentParser(prog="python -m txlake.copier")
    ap.add_argument("conf")
    ap.add_argument("source")
    ap.add_argument("target")
    ap.add_argument("group")
    ap.add_argument("transactional_id")
    ap.add_argument("--pause-in-txn", type=int, default=None)
    ap.add_argument("--batch-records", type=int, default=20_000)
    args = ap.parse_args(argv)

    def emit(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    copy_exactly_once(json.loads(args.conf), args.source, args.target, args.group, args.transactional_id,
                      args.batch_records, args.pause_in_txn, emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
