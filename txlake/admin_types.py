"""The argument and result types of the AdminClient's partition, config and cluster calls,
as confluent-kafka names and shapes them (``confluent_kafka.admin``: ``NewPartitions``,
``ConfigResource``, ``ConfigEntry``, ``ResourceType``, ``ConfigSource``, ``AlterConfigOpType``,
``DescribeClusterResult``, ``Node``), so code written against confluent-kafka runs with only the
import changed. Enum values are librdkafka's (``ResourceType.GROUP`` is 3, as in confluent-kafka);
:func:`kafka_resource_type` gives the id Kafka's DescribeConfigs/IncrementalAlterConfigs carry.
"""

from __future__ import annotations

import functools
from enum import Enum
from typing import Any


class NewPartitions:
    """Grow a topic to ``new_total_count`` partitions (confluent-kafka's ``NewPartitions``; Kafka's
    CreatePartitions ``CreatePartitionsTopic``).

    Args:
        topic: the topic's name.
        new_total_count: the partition count after the call (not the number added).
        replica_assignment: optional, one list of broker ids per NEW partition (the one broker
            here is node 1: ``[[1], [1]]`` for two new partitions).
    """

    def __init__(self, topic: str, new_total_count: int, replica_assignment: list[list[int]] | None = None):
        self.topic = topic
        self.new_total_count = new_total_count
        self.replica_assignment = replica_assignment

    def _key(self) -> tuple:
        return self.topic, self.new_total_count

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NewPartitions):
            return NotImplemented
        return self._key() == other._key() and self.replica_assignment == other.replica_assignment

    def __lt__(self, other: "NewPartitions") -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"NewPartitions(topic={self.topic},new_total_count={self.new_total_count})"


class ResourceType(Enum):
    """A Kafka resource type, numbered as librdkafka (confluent-kafka's ``ResourceType``)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    BROKER = 4
    TRANSACTIONAL_ID = 5

    def __lt__(self, other: "ResourceType") -> bool:
        if not isinstance(other, ResourceType):
            return NotImplemented
        return self.value < other.value


#: librdkafka's resource type -> Kafka's ``ConfigResource.Type`` id on the wire (UNKNOWN 0 for
#: the types that have no configs: Kafka answers INVALID_REQUEST for them)
_KAFKA_CONFIG_RESOURCE_TYPES = {ResourceType.TOPIC: 2, ResourceType.BROKER: 4, ResourceType.GROUP: 32}


def kafka_resource_type(restype: ResourceType) -> int:
    """The ``resource_type`` a DescribeConfigs/IncrementalAlterConfigs request carries for
    ``restype`` (Kafka's ``ConfigResource.Type``: TOPIC 2, BROKER 4, GROUP 32; others 0)."""
    return _KAFKA_CONFIG_RESOURCE_TYPES.get(restype, 0)


class ConfigSource(Enum):
    """Where a config value comes from (confluent-kafka's ``ConfigSource``; the ids are Kafka's
    DescribeConfigs ``ConfigSource``)."""

    UNKNOWN_CONFIG = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5
    GROUP_CONFIG = 8


class AlterConfigOpType(Enum):
    """An incremental config operation (confluent-kafka's ``AlterConfigOpType``; the ids are
    Kafka's IncrementalAlterConfigs ``config_operation``, KIP-339)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


class ConfigEntry:
    """One config of a resource (confluent-kafka's ``ConfigEntry``): what :meth:`AdminClient.describe_configs`
    answers, and, with ``incremental_operation``, one change for ``incremental_alter_configs``.

    Attributes:
        name / value: the config and its value (None for a sensitive one; ignored by DELETE).
        source: where the value comes from: a :class:`ConfigSource` member's number in
            describe_configs' results (as confluent-kafka gives it: compare with
            ``ConfigSource.DEFAULT_CONFIG.value``).
        is_read_only / is_default / is_sensitive / is_synonym: as DescribeConfigs says
            (``is_default``: the source is DEFAULT_CONFIG).
        synonyms: name -> ConfigEntry (``is_synonym`` True), most specific first: a topic
            override, then the broker-level default it overrides.
        incremental_operation: an :class:`AlterConfigOpType` (incremental_alter_configs only).
    """

    def __init__(self, name: str, value: str | None, source: ConfigSource | int = ConfigSource.UNKNOWN_CONFIG,
                 is_read_only: bool = False, is_default: bool = False, is_sensitive: bool = False,
                 is_synonym: bool = False, synonyms: dict[str, "ConfigEntry"] | None = None,
                 incremental_operation: AlterConfigOpType | None = None):
        self.name = name
        self.value = value
        self.source = source
        self.is_read_only = bool(is_read_only)
        self.is_default = bool(is_default)
        self.is_sensitive = bool(is_sensitive)
        self.is_synonym = bool(is_synonym)
        self.synonyms = dict(synonyms or {})
        self.incremental_operation = incremental_operation

    def __repr__(self) -> str:
        return f'ConfigEntry({self.name}="{self.value}")'

    def __str__(self) -> str:
        return f'{self.name}="{self.value}"'


@functools.total_ordering
class ConfigResource:
    """A resource with configs (confluent-kafka's ``ConfigResource``): a topic by name, the
    broker by its id ("1" here), with the changes to make.

    Args:
        restype: a :class:`ResourceType`, its name (case-insensitive, e.g. ``"topic"``) or its number.
        name: the topic name, or the broker id as a string.
        set_config: name -> value (``alter_configs``; kept for confluent-kafka's API).
        incremental_configs: :class:`ConfigEntry` changes, each with an ``incremental_operation``.
        described_configs / error: filled in results (confluent-kafka's internal use).

    Raises:
        ValueError: ``name`` is None or ``restype`` names no resource type.
    """

    Type = ResourceType

    def __init__(self, restype: ResourceType | str | int, name: str, set_config: dict[str, str] | None = None,
                 described_configs: dict[str, ConfigEntry] | None = None, error: Any = None,
                 incremental_configs: list[ConfigEntry] | None = None):
        if name is None:
            raise ValueError("Expected resource name to be a string")
        if isinstance(restype, str):
            try:
                restype = ResourceType[restype.upper()]
            except KeyError:
                raise ValueError(f'Unknown resource type "{restype}": should be a ConfigResource.Type') from None
        elif isinstance(restype, int):
            restype = ResourceType(restype)
        self.restype = restype
        self.restype_int = int(restype.value)
        self.name = name
        self.set_config_dict = dict(set_config or {})
        self.incremental_configs = list(incremental_configs or [])
        self.configs = described_configs
        self.error = error

    def __repr__(self) -> str:
        if self.error is not None:
            return f"ConfigResource({self.restype},{self.name},{self.error!r})"
        return f"ConfigResource({self.restype},{self.name})"

    def __hash__(self) -> int:
        return hash((self.restype, self.name))

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ConfigResource):
            return NotImplemented
        return (self.restype.value, self.name) < (other.restype.value, other.name)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConfigResource):
            return NotImplemented
        return self.restype == other.restype and self.name == other.name

    def __len__(self) -> int:
        return len(self.set_config_dict)

    def set_config(self, name: str, value: str, overwrite: bool = True) -> None:
        """Set ``name`` to ``value`` for ``alter_configs`` (kept if present and not ``overwrite``)."""
        if overwrite or name not in self.set_config_dict:
            self.set_config_dict[name] = value

    def add_incremental_config(self, config_entry: ConfigEntry) -> None:
        """Add one change (a :class:`ConfigEntry` with ``incremental_operation``) for incremental_alter_configs."""
        self.incremental_configs.append(config_entry)


class Node:
    """A broker as DescribeCluster, DescribeGroups' coordinator and describe_topics' partitions
    name it (confluent-kafka's ``Node``)."""

    def __init__(self, id: int, host: str, port: int, rack: str | None = None):
        self.id = id
        self.id_string = str(id)
        self.host = host
        self.port = port
        self.rack = rack

    def __repr__(self) -> str:
        return f"Node(id={self.id}, host={self.host!r}, port={self.port}, rack={self.rack!r})"

    def __str__(self) -> str:
        """confluent-kafka's form: ``"(1) localhost:0 "`` (the rack in parentheses when set)."""
        return f"({self.id}) {self.host}:{self.port} {f'(Rack - {self.rack})' if self.rack else ''}"


class DescribeClusterResult:
    """DescribeCluster's answer (confluent-kafka's ``DescribeClusterResult``, KIP-700): the
    controller, every node and the cluster id. ``authorized_operations`` is None: no authorizer
    runs here and the operations were not asked for."""

    def __init__(self, controller: Node, nodes: list[Node], cluster_id: str | None = None,
                 authorized_operations: list | None = None):
        self.controller = controller
        self.nodes = nodes
        self.cluster_id = cluster_id
        self.authorized_operations = authorized_operations or None
