"""An exactly-once consume-transform-produce worker (KIP-98 + KIP-447), used by the demo.

It reads a topic read_committed, writes one derived record per input record to a target
topic, and commits its input positions with ``send_offsets_to_transaction`` in the same
transaction -- so after any crash, a restarted worker (same ``transactional.id``) resumes
from the last committed transaction: ``init_transactions`` aborts whatever the dead
worker left open, and the consumer starts from the group's committed offsets.

Run as a process (the demo kills it with SIGKILL mid-transaction)::

    python -m txlake.copier - SOURCE TARGET GROUP TRANSACTIONAL_ID
        [--batch-records N] [--pause-in-txn N] [--pause-before-commit N] [--abort-every N]
        [--same-partition] [--json-events]

with the client config as one JSON line on stdin (``-``; :mod:`txlake.child_conf`: a
command line is readable by every local user, a config may hold credentials). JSON text
in place of ``-`` is accepted too, with a warning if it holds credentials. A config with
``bootstrap.servers`` runs the worker as a real Kafka client (confluent-kafka's Producer and
Consumer, e.g. through ``txlake serve``); one with ``storage.url`` runs txlake's in-process
clients (:func:`kafka_clients`).

It prints one line per event on stdout: ``started``, ``committed <txn> <records>``,
``aborted <txn> <records>`` (with --abort-every N: every N-th transaction of this run
produces and flushes its records -- durable but undecided -- then aborts; the consumer
is rewound to where that transaction started, so a later transaction copies those
records again), ``in-transaction <txn> <records>`` (with --pause-in-txn: the records of
transaction N are produced and flushed -- durable but undecided -- and the worker waits
to be killed), ``offsets-sent <txn>`` (with --pause-before-commit N: transaction N has sent its
input offsets with send_offsets_to_transaction and flushed its records, its commit is not
requested, and the worker waits to be killed), ``done <records>``. ``<txn>`` counts the transactions of this
run from 1.
With --json-events each event is a JSON object instead, e.g.
``{"event": "committed", "txn": 3, "records": 20000}``.

--same-partition writes each derived record to the target partition with its source
record's partition number (the target needs at least as many partitions), so the
source order of every partition is kept in the target: under read_committed a target
partition holds its source partition's offsets in increasing order.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from types import ModuleType
from typing import Any, Callable, Mapping

from .child_conf import load_conf


def kafka_clients(conf: Mapping[str, Any]) -> ModuleType:
    """The client module a worker with ``conf`` uses: ``confluent_kafka`` (librdkafka, over the
    wire) when ``conf`` names ``bootstrap.servers``, else ``txlake`` (the engine in this process,
    ``storage.url``). Both offer the names the workers use -- ``Producer``, ``Consumer``,
    ``TopicPartition``, ``KafkaException``, ``OFFSET_STORED`` -- with confluent-kafka's API.

    Raises:
        ImportError: ``bootstrap.servers`` is given but confluent-kafka (the ``test`` extra, not a
            dependency of txlake) cannot be imported; the message says how to install it.
    """
    if "bootstrap.servers" not in conf:
        return importlib.import_module("txlake")
    try:
        return importlib.import_module("confluent_kafka")
    except ImportError as exc:
        raise ImportError(f"a config with bootstrap.servers needs confluent-kafka, which cannot be imported ({exc}); "
                          "pip install confluent-kafka (in a checkout: pip install -e '.[test]')") from exc


def derive(value: bytes, partition: int, offset: int) -> tuple[bytes, bytes]:
    """The derived record of a flight: key = route, value = its arrival delay and its source position."""
    flight = json.loads(value)
    route = f"{flight.get('origin')}-{flight.get('dest')}"
    out = {"route": route, "arr_delay": flight.get("arr_delay"), "src": [partition, offset]}
    return route.encode(), json.dumps(out, separators=(",", ":")).encode()


def copy_exactly_once(conf: dict[str, Any], source: str, target: str, group: str, transactional_id: str,
                      batch_records: int = 20_000, pause_in_txn: int | None = None,
                      emit: Callable[[str], None] = print, abort_every: int | None = None,
                      same_partition: bool = False, pause_before_commit: int | None = None) -> int:
    """Copy ``source`` to ``target`` until the end of ``source``; return the records copied by this run
    (by its committed transactions).

    Args:
        abort_every: every ``abort_every``-th transaction of this run is aborted after its
            records are flushed; the consumer is rewound to its positions at the start of
            that transaction, so those records are copied again by the next transaction.
        same_partition: write each derived record to the target partition numbered like its
            source partition (else: Kafka's default partitioner on the derived key).
        pause_in_txn / pause_before_commit: stop (sleep, to be killed) in that transaction once
            its records are flushed / once its offsets are sent and before its commit.
    """
    if abort_every is not None and abort_every < 1:
        raise ValueError("abort_every must be >= 1")
    # init_transactions first: it fences a dead predecessor and aborts its open transaction.
    # Only then are the group's committed offsets stable -- had the predecessor died after
    # send_offsets_to_transaction, its pending offsets would hold the read_committed
    # OffsetFetch (UNSTABLE_OFFSET_COMMIT) until that transaction ends.
    kafka = kafka_clients(conf)
    producer = kafka.Producer({"partitioner": "murmur2_random", **conf, "transactional.id": transactional_id,
                               "linger.ms": 5})
    producer.init_transactions(60)
    consumer = kafka.Consumer({**conf, "group.id": group, "isolation.level": "read_committed",
                               "auto.offset.reset": "earliest", "enable.auto.commit": False})
    partitions = sorted(consumer.list_topics(source).topics[source].partitions)
    assigned = [kafka.TopicPartition(source, p) for p in partitions]
    consumer.assign(assigned)      # positions start from the group's committed offsets
    emit("started")
    copied, txn = 0, 0
    try:
        while True:
            start = consumer.position(assigned)  # where an aborted transaction rewinds to
            msgs = _next_batch(kafka, consumer, assigned, batch_records)
            if not msgs:
                break
            txn += 1
            producer.begin_transaction()
            for m in msgs:
                if m.error() is not None:
                    continue
                key, value = derive(m.value(), m.partition(), m.offset())
                producer.produce(target, value=value, key=key, partition=m.partition() if same_partition else -1)
            if pause_in_txn == txn:
                producer.flush(60)
                emit(f"in-transaction {txn} {len(msgs)}")
                time.sleep(600)          # the demo kills the process here
            if abort_every is not None and txn % abort_every == 0:
                producer.flush(60)       # durable but undecided, then aborted
                producer.abort_transaction(60)
                for tp in start:         # copy these inputs again in a later transaction
                    # no position yet (nothing fetched before this transaction): the committed offset
                    consumer.seek(tp if tp.offset >= 0 else kafka.TopicPartition(tp.topic, tp.partition,
                                                                                 kafka.OFFSET_STORED))
                emit(f"aborted {txn} {len(msgs)}")
                continue
            positions = [tp for tp in consumer.position(assigned) if tp.offset >= 0]
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 60)
            if pause_before_commit == txn:
                producer.flush(60)       # its records too are durable (sending offsets does not flush)
                emit(f"offsets-sent {txn}")
                time.sleep(600)          # a test kills the process here
            producer.commit_transaction(60)
            copied += len(msgs)
            emit(f"committed {txn} {len(msgs)}")
    finally:
        consumer.close()
        producer.close()
    emit(f"done {copied}")
    return copied


def _next_batch(kafka, consumer, assigned: list, batch_records: int) -> list:
    """The next ``batch_records`` messages (fewer only at the end of the input), [] at the end:
    a transaction's size does not depend on how the fetches happened to split the input."""
    msgs: list = []
    while len(msgs) < batch_records:
        more = [m for m in consumer.consume(batch_records - len(msgs), 1.0) if m.error() is None]
        if more:
            msgs += more
            continue
        positions = _positions(consumer, assigned)
        ends = [_end_offset(kafka, consumer, tp) for tp in assigned]
        if all(p.offset >= end for p, end in zip(positions, ends)):
            break
    return msgs


def _positions(consumer, assigned: list) -> list:
    """The consumer's position of every assigned partition; where it has none (librdkafka answers
    OFFSET_INVALID for a partition it returned no message of -- one a predecessor copied to its
    end, or an empty one), the group's committed offset, where this consumer started, else the
    log start offset."""
    positions = consumer.position(assigned)
    unknown = [tp for tp in positions if tp.offset < 0]
    if unknown:
        committed = {tp.partition: tp for tp in consumer.committed(unknown, timeout=60)}
        positions = [committed.get(tp.partition, tp) if tp.offset < 0 else tp for tp in positions]
        for tp in positions:
            if tp.offset < 0:    # nothing committed either: auto.offset.reset earliest, the log start offset
                tp.offset = consumer.get_watermark_offsets(tp, timeout=END_OFFSET_TIMEOUT_S)[0]
    return positions


#: seconds one end-offset query may take before it is sent again, and how many times
END_OFFSET_TIMEOUT_S, END_OFFSET_ATTEMPTS = 10.0, 6


def _end_offset(kafka, consumer, tp) -> int:
    """The end a read_committed consumer can reach on ``tp`` (ListOffsets: the LSO), asked again
    when an answer does not come within :data:`END_OFFSET_TIMEOUT_S` (librdkafka's query has no
    bound of its own).

    Raises:
        KafkaException: no answer after :data:`END_OFFSET_ATTEMPTS` queries.
    """
    for attempt in range(END_OFFSET_ATTEMPTS):
        try:
            return consumer.get_watermark_offsets(tp, timeout=END_OFFSET_TIMEOUT_S)[1]
        except kafka.KafkaException:
            if attempt == END_OFFSET_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


#: the numbers each event line carries, named (for --json-events)
_EVENT_FIELDS = {"committed": ("txn", "records"), "aborted": ("txn", "records"), "in-transaction": ("txn", "records"),
                 "offsets-sent": ("txn",), "done": ("records",)}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry of the worker process."""
    ap = argparse.ArgumentParser(prog="python -m txlake.copier")
    ap.add_argument("conf", help="- : the client config is one JSON line on stdin (or: the config as JSON)")
    ap.add_argument("source")
    ap.add_argument("target")
    ap.add_argument("group")
    ap.add_argument("transactional_id")
    ap.add_argument("--pause-in-txn", type=int, default=None)
    ap.add_argument("--batch-records", type=int, default=20_000)
    ap.add_argument("--pause-before-commit", type=int, default=None,
                    help="in transaction N, wait (to be killed) after sending the offsets, before committing")
    ap.add_argument("--abort-every", type=int, default=None,
                    help="abort every N-th transaction (after flushing its records) and copy its inputs again")
    ap.add_argument("--same-partition", action="store_true",
                    help="write each derived record to the target partition numbered like its source partition")
    ap.add_argument("--json-events", action="store_true", help="print each event as one JSON object")
    args = ap.parse_args(argv)
    if args.abort_every is not None and args.abort_every < 1:
        ap.error("--abort-every must be >= 1")

    def emit(line: str) -> None:
        if args.json_events:
            name, *numbers = line.split()
            fields = dict(zip(_EVENT_FIELDS.get(name, ()), map(int, numbers)))
            line = json.dumps({"event": name, **fields})
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    copy_exactly_once(load_conf(args.conf), args.source, args.target, args.group, args.transactional_id,
                      args.batch_records, args.pause_in_txn, emit, args.abort_every, args.same_partition,
                      args.pause_before_commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
