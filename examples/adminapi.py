#!/usr/bin/env python
"""A tour of the AdminClient -- confluent-kafka's examples/adminapi.py done the txlake way:
only the imports and ``storage.url`` differ.

Usage: adminapi.py <storage.url> <command> [<args> ...]

Commands:
  create_topics <topic>[:<partitions>] ...        delete_topics <topic> ...
  create_partitions <topic> <new total> ...       list_topics
  describe_topics <topic> ...                     describe_cluster
  describe_configs <resource type> <name>         incremental_alter_configs <type> <name> <OP:name=value>...
  list_consumer_groups                            describe_consumer_groups <group> ...
  list_consumer_group_offsets <group>             delete_consumer_groups <group> ...
  list_offsets <topic> <partition> earliest|latest|max_timestamp|<timestamp ms>

Each result is printed; a failed one as "Failed to ...: <error>" with exit status 1.
"""

import sys

# confluent-kafka: from confluent_kafka import ... / from confluent_kafka.admin import ...
from txlake import ConsumerGroupTopicPartitions, KafkaException, TopicCollection, TopicPartition
from txlake.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewPartitions, NewTopic,
                          OffsetSpec)

failures = 0


def report(what, futures, show=lambda key, result: f"{key}: {result}"):
    """Wait for each future of ``futures`` (a dict) and print its result or its error."""
    global failures
    for key, future in futures.items():
        try:
            print(show(key, future.result()))
        except KafkaException as e:
            failures += 1
            print(f"Failed to {what} {key}: {e.args[0].str()}")


def create_topics(a, args):
    new = [NewTopic(t.split(":")[0], int(t.split(":")[1]) if ":" in t else 1) for t in args]
    report("create topic", a.create_topics(new, operation_timeout=30), lambda t, _: f"Topic {t} created")


def delete_topics(a, args):
    report("delete topic", a.delete_topics(args, operation_timeout=30), lambda t, _: f"Topic {t} deleted")


def create_partitions(a, args):
    new = [NewPartitions(t, int(n)) for t, n in zip(args[0::2], args[1::2])]
    report("add partitions to", a.create_partitions(new, validate_only=False),
           lambda t, _: f"Additional partitions created for topic {t}")


def list_topics(a, args):
    md = a.list_topics(timeout=10)
    print(f"Cluster {md.cluster_id} metadata: {len(md.topics)} topics")
    for t in sorted(md.topics.values(), key=lambda t: t.topic):
        if not t.topic.startswith("__"):
            print(f'  "{t.topic}" with {len(t.partitions)} partition(s)')


def describe_topics(a, args):
    report("describe topic", a.describe_topics(TopicCollection(args)), lambda t, d: (
        f"Topic {d.name} (id {d.topic_id}): " + ", ".join(f"partition {p.id} leader {p.leader.id}"
                                                           for p in d.partitions)))


def describe_cluster(a, args):
    c = a.describe_cluster().result()
    print(f"Cluster {c.cluster_id}: controller {c.controller.id}, {len(c.nodes)} node(s)")


def describe_configs(a, args):
    resource = ConfigResource(args[0], args[1])
    report("describe", a.describe_configs([resource]), lambda r, configs: "\n".join(
        f"{r}: {c.name} = {c.value}" for c in sorted(configs.values(), key=lambda c: c.name)))


def incremental_alter_configs(a, args):
    resource = ConfigResource(args[0], args[1])
    for change in args[2:]:
        op, assignment = change.split(":", 1)
        name, value = assignment.split("=", 1)
        resource.add_incremental_config(ConfigEntry(name, value, incremental_operation=AlterConfigOpType[op]))
    report("alter", a.incremental_alter_configs([resource]), lambda r, _: f"{r} configuration altered")


def list_consumer_groups(a, args):
    result = a.list_consumer_groups(request_timeout=10).result()
    for g in result.valid:
        print(f"Group {g.group_id}: state {g.state.name}, simple {g.is_simple_consumer_group}")
    for e in result.errors:
        print(f"Error: {e}")


def describe_consumer_groups(a, args):
    report("describe group", a.describe_consumer_groups(args), lambda g, d: (
        f"Group {d.group_id}: state {d.state.name}, assignor {d.partition_assignor!r}, {len(d.members)} member(s)"))


def list_consumer_group_offsets(a, args):
    report("list offsets of group", a.list_consumer_group_offsets([ConsumerGroupTopicPartitions(args[0])]),
           lambda g, r: "\n".join(f"{g}: {tp.topic} [{tp.partition}] offset {tp.offset}"
                                  for tp in sorted(r.topic_partitions)))


def delete_consumer_groups(a, args):
    report("delete group", a.delete_consumer_groups(args, request_timeout=10), lambda g, _: f"Group {g} deleted")


def list_offsets(a, args):
    topic, partition, spec = args
    specs = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(),
             "max_timestamp": OffsetSpec.max_timestamp()}
    offset_spec = specs[spec] if spec in specs else OffsetSpec.for_timestamp(int(spec))
    report("list offsets of", a.list_offsets({TopicPartition(topic, int(partition)): offset_spec}),
           lambda tp, info: f"{tp.topic} [{tp.partition}] {spec}: offset {info.offset} timestamp {info.timestamp}")


COMMANDS = {f.__name__: f for f in (create_topics, delete_topics, create_partitions, list_topics, describe_topics,
                                    describe_cluster, describe_configs, incremental_alter_configs,
                                    list_consumer_groups, describe_consumer_groups, list_consumer_group_offsets,
                                    delete_consumer_groups, list_offsets)}


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[2] not in COMMANDS:
        sys.stderr.write(__doc__)
        return 2
    admin = AdminClient({"storage.url": sys.argv[1]})  # confluent-kafka: {"bootstrap.servers": "host:9092"}
    COMMANDS[sys.argv[2]](admin, sys.argv[3:])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
