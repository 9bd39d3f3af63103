"""The Spark data source ``txlake`` (PySpark's Python Data Source API, Spark 4.1+).

Layout -- one concept per module:

* :mod:`.source` -- :class:`~.source.TxlakeDataSource`, the ``DataSource`` Spark sees (name,
  schema) handing out the readers and writers below; ``pyspark_txlake.DefaultSource`` is
  this class, so ``spark.read.format("txlake")`` works once txlake is installed;
* :mod:`.options` -- the options, parsed and checked as Spark's Kafka source does;
* :mod:`.batch_read` / :mod:`.stream_read` -- committed reads bounded by the LSO from one
  catalog snapshot (:mod:`txlake.committed_view`);
* :mod:`.batch_write` / :mod:`.stream_write` -- exactly-once writes: tasks stage their rows
  (:mod:`.staging`), the driver's commit appends them as one transaction
  (:mod:`.staged_commit`), handed to the writer-lease holder when another process holds it;
* :mod:`.jvm` -- the jar of ``txlake.DefaultSource`` (Java, ``java/``), which gives batch
  writes Spark's default save mode, ErrorIfExists, as Spark's Kafka sink has it.

docs/spark.md describes every option and guarantee.
"""
