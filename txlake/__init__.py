"""txlake: Kafka's exactly-once semantics on object storage, every log kept as Parquet.

The public API follows confluent-kafka (see API.md), so code moves over with an import
change::

    from txlake import Producer, Consumer, AdminClient, NewTopic, TopicPartition
"""

from .admin import (AdminClient, ClusterMetadata, DeletedRecords, HangingTransaction, NewTopic, PartitionMetadata, PartitionProducerState,
                    ProducerState, TopicMetadata, TransactionDescription, TransactionListing)
from .admin_group_types import (ConsumerGroupState, ConsumerGroupTopicPartitions, ConsumerGroupType, ElectionType,
                                IsolationLevel, TopicCollection, TopicPartitionInfo, Uuid)
from .admin_types import (AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, DescribeClusterResult,
                          NewPartitions, Node, ResourceType)
from .consumer import Consumer
from .deserializing_consumer import DeserializingConsumer
from .error import KafkaError, KafkaException
from .group_metadata import ConsumerGroupMetadata
from . import handoff_handlers  # noqa: F401 - registers the writes this process runs for others
from .producer import BulkResult, Producer
from .serializing_producer import SerializingProducer
from .types import (OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, OFFSET_STORED, TIMESTAMP_CREATE_TIME,
                    TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE, Message, ThrottleEvent, TopicPartition)
from .cimpl import consistent, fnv1a, murmur2
from .version import __version__, libversion, version


def __getattr__(name: str):
    # ``txlake.duckdb`` is imported on first use (API.md: ``txlake.duckdb.connect(url)``).
    if name == "duckdb":
        import importlib

        return importlib.import_module(".duckdb", __name__)
    raise AttributeError(f"module 'txlake' has no attribute {name!r}")


__all__ = [
    "AdminClient", "AlterConfigOpType", "BulkResult", "ClusterMetadata", "ConfigEntry", "ConfigResource",
    "ConfigSource", "Consumer", "ConsumerGroupMetadata", "ConsumerGroupState", "ConsumerGroupTopicPartitions",
    "ConsumerGroupType", "DeletedRecords", "DescribeClusterResult", "ElectionType", "IsolationLevel", "TopicCollection",
    "TopicPartitionInfo", "Uuid",
    "DeserializingConsumer", "HangingTransaction", "NewPartitions", "Node", "ResourceType", "SerializingProducer",
    "KafkaError", "KafkaException", "Message", "NewTopic", "PartitionMetadata", "PartitionProducerState", "Producer",
    "ProducerState", "ThrottleEvent", "TopicMetadata", "TopicPartition", "TransactionDescription", "TransactionListing",
    "consistent", "fnv1a", "libversion", "murmur2", "version",
    "OFFSET_BEGINNING", "OFFSET_END", "OFFSET_INVALID", "OFFSET_STORED", "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME", "TIMESTAMP_NOT_AVAILABLE",
]
