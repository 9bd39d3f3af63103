"""PySpark's discovery module for the ``txlake`` data source: Spark registers the
``DefaultSource`` of every installed ``pyspark_*`` package, so ``spark.read.format("txlake")``
works without ``spark.dataSource.register`` once txlake is installed."""

from txlake.spark_connector.source import TxlakeDataSource as DefaultSource

__all__ = ["DefaultSource"]
