#!/usr/bin/env python
"""Produce each line of stdin as one record -- confluent-kafka's examples/producer.py done the
txlake way: only the import and ``storage.url`` (for ``bootstrap.servers``) differ.

Usage: producer.py <storage.url> <topic>   (e.g. file:///tmp/lake)

Each delivery is reported on stderr; the exit status is 0 once every record is delivered.
"""

import sys

from txlake import Producer  # confluent-kafka: from confluent_kafka import Producer


def main() -> int:
    if len(sys.argv) != 3:
        sys.stderr.write(f"Usage: {sys.argv[0]} <storage.url> <topic>\n")
        return 2
    storage_url, topic = sys.argv[1:]
    conf = {"storage.url": storage_url}  # confluent-kafka: {"bootstrap.servers": "host:9092"}
    producer = Producer(**conf)
    failed = 0

    def delivery_callback(err, msg):
        nonlocal failed
        if err:
            failed += 1
            sys.stderr.write(f"% Message failed delivery: {err}\n")
        else:
            sys.stderr.write(f"% Message delivered to {msg.topic()} [{msg.partition()}] @ {msg.offset()}\n")

    for line in sys.stdin:
        while True:
            try:
                producer.produce(topic, line.rstrip("\n"), callback=delivery_callback)
                break
            except BufferError:  # the local queue is full: serve deliveries, then try again
                sys.stderr.write(f"% Local producer queue is full ({len(producer)} messages awaiting delivery): "
                                 "try again\n")
                producer.poll(1)
        producer.poll(0)  # serve the delivery reports of earlier records

    sys.stderr.write(f"% Waiting for {len(producer)} deliveries\n")
    remaining = producer.flush(30)
    return 1 if remaining or failed else 0


if __name__ == "__main__":
    sys.exit(main())
