#!/usr/bin/env python
"""Copy a topic, transformed, exactly once: a consume-transform-produce loop whose consumed
offsets commit in the same transaction as its output (KIP-98, KIP-447) -- confluent-kafka's
examples/eos_transactions.py done the txlake way: only the import and ``storage.url`` differ.

Usage: eos_transactions.py <storage.url> <input topic> <output topic> <group> [--batch N]

Each value is upper-cased and written to the output partition of the same number; every
``--batch`` records (and at the end of the input) the transaction commits with the
consumer's positions. The program stops when every assigned partition is at its end.
"""

import argparse
import sys

from txlake import Consumer, KafkaError, Producer  # confluent-kafka: from confluent_kafka import ...


def transform(msg):
    return msg.key(), msg.value().upper() if msg.value() is not None else None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("storage_url")
    parser.add_argument("input_topic")
    parser.add_argument("output_topic")
    parser.add_argument("group")
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    common = {"storage.url": args.storage_url}  # confluent-kafka: {"bootstrap.servers": "host:9092"}

    consumer = Consumer({**common, "group.id": args.group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False,  # offsets commit with the transaction instead
                         "enable.partition.eof": True, "isolation.level": "read_committed"})
    producer = Producer({**common, "transactional.id": f"eos-{args.group}"})
    producer.init_transactions()
    consumer.subscribe([args.input_topic])
    producer.begin_transaction()

    def delivery_report(err, msg):
        if err:
            sys.stderr.write(f"Delivery to {msg.topic()} [{msg.partition()}] failed: {err}\n")

    def commit(reason):
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata())
        producer.commit_transaction()
        print(f"=== committed {in_txn} records ({reason}) ===")

    at_end, in_txn, copied = set(), 0, 0
    print("=== consume-transform-produce ===")
    while True:
        producer.poll(0)
        msg = consumer.poll(timeout=1.0)
        if msg is None:
            continue
        where = (msg.topic(), msg.partition())
        if msg.error():
            if msg.error().code() != KafkaError._PARTITION_EOF:
                raise SystemExit(f"consume failed: {msg.error()}")
            at_end.add(where)
            if consumer.assignment() and at_end >= {(tp.topic, tp.partition) for tp in consumer.assignment()}:
                break
            continue
        at_end.discard(where)
        key, value = transform(msg)
        producer.produce(args.output_topic, value, key, partition=msg.partition(), on_delivery=delivery_report)
        in_txn += 1
        copied += 1
        if in_txn == args.batch:
            commit("batch")
            producer.begin_transaction()
            in_txn = 0
    commit("end of input")
    print(f"=== copied {copied} records ===")
    consumer.close()
    producer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
