#!/usr/bin/env python
"""A group's lag per partition: its committed offset against each partition's watermarks --
confluent-kafka's examples/get_watermark_offsets.py done the txlake way: only the import and
``storage.url`` differ.

Usage: get_watermark_offsets.py <storage.url> <group> <topic> [<topic> ...]
"""

import sys

from txlake import OFFSET_INVALID, Consumer, KafkaException, TopicPartition  # confluent-kafka: ...


def main() -> int:
    if len(sys.argv) < 4:
        sys.stderr.write(f"Usage: {sys.argv[0]} <storage.url> <group> <topic> ...\n")
        return 2
    storage_url, group, topics = sys.argv[1], sys.argv[2], sys.argv[3:]
    consumer = Consumer({"storage.url": storage_url,  # confluent-kafka: "bootstrap.servers": "host:9092"
                         "group.id": group, "enable.auto.commit": False})
    print("%-20s %9s %9s %9s %9s %9s" % ("Topic [Partition]", "Low", "High", "Committed", "Lag", "Lag%"))
    for topic in topics:
        metadata = consumer.list_topics(topic, timeout=10)
        if metadata.topics[topic].error is not None:
            raise KafkaException(metadata.topics[topic].error)
        partitions = [TopicPartition(topic, p) for p in sorted(metadata.topics[topic].partitions)]
        for tp in consumer.committed(partitions, timeout=10):
            low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            committed = tp.offset if tp.offset != OFFSET_INVALID else low   # nothing committed: from the start
            lag = high - committed
            share = f"{100 * lag / (high - low):.1f}" if high > low else "-"
            shown = "-" if tp.offset == OFFSET_INVALID else tp.offset
            print("%-20s %9d %9d %9s %9d %9s" % (f"{tp.topic} [{tp.partition}]", low, high, shown, lag, share))
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
