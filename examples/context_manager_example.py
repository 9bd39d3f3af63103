#!/usr/bin/env python
"""The clients as context managers: each closes at the end of its ``with`` block, also when
an exception leaves it -- confluent-kafka's examples/context_manager_example.py done the
txlake way: only the imports and ``storage.url`` differ.

Usage: context_manager_example.py <storage.url> <topic>
"""

import sys

from txlake import Consumer, KafkaError, Producer, TopicPartition  # confluent-kafka: from confluent_kafka import ...
from txlake.admin import AdminClient, NewTopic  # confluent-kafka: from confluent_kafka.admin import ...


def main() -> int:
    if len(sys.argv) != 3:
        sys.stderr.write(f"Usage: {sys.argv[0]} <storage.url> <topic>\n")
        return 2
    conf = {"storage.url": sys.argv[1]}  # confluent-kafka: {"bootstrap.servers": "host:9092"}
    topic = sys.argv[2]

    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result()
        print(f"Created topic {topic}")

    delivered = []
    with Producer(conf) as producer:
        for i in range(3):
            producer.produce(topic, key=f"key-{i}", value=f"value-{i}",
                             on_delivery=lambda err, msg: delivered.append(msg.offset()) if err is None else None)
        producer.flush()
    print(f"Produced {len(delivered)} records at offsets {delivered}")
    try:
        producer.produce(topic, value="after")
    except RuntimeError as e:
        print(f"The producer is closed: {e}")

    with Consumer({**conf, "group.id": "context-manager-example", "enable.partition.eof": True}) as consumer:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while True:
            msg = consumer.poll(10)
            if msg is None or (msg.error() and msg.error().code() == KafkaError._PARTITION_EOF):
                break
            print(f"Consumed {msg.key().decode()}={msg.value().decode()} at offset {msg.offset()}")
    try:
        consumer.poll(0)
    except RuntimeError as e:
        print(f"The consumer is closed: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
