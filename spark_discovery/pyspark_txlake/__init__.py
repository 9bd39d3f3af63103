"""PySpark's discovery module for the ``txlake`` data source: Spark registers the
``DefaultSource`` of every installed ``pyspark_*`` package, so ``spark.read.format("txlake")``
works without ``spark.dataSource.register`` once txlake is installed.

It lives alone in ``spark_discovery/``: editable installs put that folder on ``sys.path``
(dev/txlake_build.py), where PySpark's ``pkgutil.iter_modules()`` lookup finds it from any
working directory."""

from txlake.spark_connector.source import TxlakeDataSource as DefaultSource

__all__ = ["DefaultSource"]
