#!/usr/bin/env python
"""One member (or several) of a consumer group copying a topic exactly once: consume,
transform, produce in transactions that carry the consumed offsets (KIP-98, KIP-447: one
transactional producer per member, fenced through the group metadata). Written against
confluent-kafka's API only: the same program runs on confluent-kafka against ``txlake serve``
(``--client confluent_kafka --config bootstrap.servers=HOST:PORT``) and on txlake in-process
(``--client txlake --config storage.url=file:///...``).

Usage: eos_worker.py --client MODULE --config KEY=VALUE [...] --input T --output T --group G
                     [--workers N] [--batch N] [--idle-exit S] [--name NAME]

Each value is upper-cased and written to the output partition of the same number, so the
output keeps each input partition's order. ``--workers N`` runs N members in this process
(threads), as a storage root takes one writing process. A member stops once every partition
it holds is at its end and nothing arrived for ``--idle-exit`` seconds; it commits what it
has done first, and so does a member losing partitions in a rebalance (on_revoke).
"""

import argparse
import importlib
import sys
import threading
import time


def transform(value):
    return value.upper() if value is not None else None


def worker(ck, conf, args, name, results):
    consumer = ck.Consumer({**conf, "group.id": args.group, "client.id": name, "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, "enable.partition.eof": True,
                            "isolation.level": "read_committed"})
    producer = ck.Producer({**conf, "transactional.id": f"{args.group}-{name}", "client.id": name})
    producer.init_transactions(30)
    producer.begin_transaction()
    state = {"in_txn": 0, "copied": 0, "done": False}
    at_end = set()

    def commit(begin_next=True):
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        state["in_txn"] = 0
        if begin_next:
            producer.begin_transaction()

    def on_assign(c, partitions):
        print(f"{name}: assigned {sorted(tp.partition for tp in partitions)}", flush=True)

    def on_revoke(c, partitions):
        # the partitions go to another member: commit what was copied from them first
        if not state["done"]:
            commit()
        at_end.difference_update((tp.topic, tp.partition) for tp in partitions)
        print(f"{name}: revoked {sorted(tp.partition for tp in partitions)}", flush=True)

    consumer.subscribe([args.input], on_assign=on_assign, on_revoke=on_revoke)
    last_record = time.monotonic()
    while True:
        producer.poll(0)
        msg = consumer.poll(0.2)
        assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        if msg is None:
            if assigned and at_end >= assigned and time.monotonic() - last_record >= args.idle_exit:
                break
            continue
        if msg.error():
            if msg.error().code() != ck.KafkaError._PARTITION_EOF:
                raise ck.KafkaException(msg.error())
            at_end.add((msg.topic(), msg.partition()))
            continue
        last_record = time.monotonic()
        at_end.discard((msg.topic(), msg.partition()))
        producer.produce(args.output, transform(msg.value()), msg.key(), partition=msg.partition())
        state["in_txn"] += 1
        state["copied"] += 1
        if state["in_txn"] >= args.batch:
            commit()
    commit(begin_next=False)
    state["done"] = True
    consumer.close()
    producer.close()
    print(f"{name}: copied {state['copied']} records", flush=True)
    results[name] = state["copied"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", required=True, help="confluent_kafka or txlake")
    parser.add_argument("--config", action="append", default=[], help="KEY=VALUE for every client")
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--name", default="worker")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--idle-exit", type=float, default=2.0)
    args = parser.parse_args()
    ck = importlib.import_module(args.client)
    conf = dict(item.split("=", 1) for item in args.config)
    results, failures = {}, []

    def run(name):
        try:
            worker(ck, conf, args, name, results)
        except Exception as exc:  # reported, and the exit status says so
            failures.append(f"{name}: {exc!r}")

    names = [args.name] if args.workers == 1 else [f"{args.name}-{i}" for i in range(args.workers)]
    threads = [threading.Thread(target=run, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
