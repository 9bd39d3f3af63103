#!/usr/bin/env python
"""Consume a group's topics and store each offset only once the record is handled --
confluent-kafka's examples/consumer.py done the txlake way: only the import and
``storage.url`` differ.

Usage: consumer.py [--max-messages N] <storage.url> <group> <topic> [<topic> ...]

Each record's value goes to stdout, its coordinates to stderr. With
``enable.auto.offset.store`` false the offsets auto-committed (and committed by close()) are
the ones stored with ``store_offsets()`` after a record is handled: a record the program
stops in the middle of is read again by the group's next consumer.
"""

import argparse
import sys

from txlake import Consumer, KafkaException  # confluent-kafka: from confluent_kafka import ...


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-messages", type=int, default=0, help="stop after this many records (0: until Ctrl-C)")
    parser.add_argument("storage_url")
    parser.add_argument("group")
    parser.add_argument("topics", nargs="+")
    args = parser.parse_args()

    conf = {
        "storage.url": args.storage_url,  # confluent-kafka: "bootstrap.servers": "host:9092"
        "group.id": args.group,
        "session.timeout.ms": 6000,
        "auto.offset.reset": "earliest",
        "enable.auto.offset.store": False,
    }
    consumer = Consumer(conf)

    def print_assignment(consumer, partitions):
        sys.stderr.write(f"Assignment: {partitions}\n")

    consumer.subscribe(args.topics, on_assign=print_assignment)
    handled = 0
    try:
        while not args.max_messages or handled < args.max_messages:
            msg = consumer.poll(timeout=1.0)
            if msg is None:
                continue
            if msg.error():
                raise KafkaException(msg.error())
            sys.stderr.write(f"% {msg.topic()} [{msg.partition()}] at offset {msg.offset()} with key "
                             f"{msg.key()!r}:\n")
            print(msg.value().decode())
            consumer.store_offsets(msg)  # handled: its offset may be committed now
            handled += 1
    except KeyboardInterrupt:
        sys.stderr.write("% Aborted by user\n")
    finally:
        consumer.close()  # commits the stored offsets and leaves the group
    return 0


if __name__ == "__main__":
    sys.exit(main())
