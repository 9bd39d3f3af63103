"""The ``txlake`` data source as Spark sees it (``pyspark.sql.datasource.DataSource``).

Spark instantiates it with the user's options (a case-insensitive dict of strings) on the
driver and pickles it, with the readers and writers it hands out, to the Python workers.
The columns are exactly those of Spark's Kafka source: ``key``, ``value`` (binary),
``topic`` (string), ``partition`` (int), ``offset`` (long), ``timestamp`` (timestamp),
``timestampType`` (int) and, with ``includeHeaders=true``, ``headers``
(array<struct<key: string, value: binary>>).
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

#: Spark's Kafka source schema (``KafkaRecordToRowConverter.kafkaSchema``)
KAFKA_SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
                "timestamp timestamp, timestampType int")
#: the same with ``includeHeaders=true``
KAFKA_SCHEMA_WITH_HEADERS = KAFKA_SCHEMA + ", headers array<struct<key: string, value: binary>>"


class TxlakeDataSource(DataSource):
    """``spark.read/readStream/write/writeStream.format("txlake")``; see docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "txlake"

    def schema(self) -> str:
        include = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return KAFKA_SCHEMA_WITH_HEADERS if include else KAFKA_SCHEMA

    def reader(self, schema):
        from .batch_read import TxlakeBatchReader
        return TxlakeBatchReader(dict(self.options), schema)

    def streamReader(self, schema):
        from .stream_read import TxlakeStreamReader
        return TxlakeStreamReader(dict(self.options), schema)

    def writer(self, schema, overwrite: bool):
        from .batch_write import TxlakeBatchWriter
        return TxlakeBatchWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from .stream_write import TxlakeStreamWriter
        return TxlakeStreamWriter(dict(self.options), schema, overwrite)
