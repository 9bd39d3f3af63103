"""``df.write.format("txlake")``: a batch write that becomes visible exactly once, all at once.

Input columns and options are those of Spark's Kafka sink (see :mod:`.staging`):
``value`` (required), ``key``, ``topic`` (or the ``topic`` option, which wins),
``partition``, ``headers``; options ``storage.url`` (+ ``storage.options.*`` and other
``storage.*`` engine settings), ``topic``, ``kafka.<producer key>`` (e.g.
``kafka.transaction.timeout.ms``), ``staging.maxFileBytes``. Save mode: this writer only
ever appends. Spark's Kafka sink also takes ErrorIfExists (its default) on Spark's V1 write
path, but for a DSv2 table with batch writes -- every Python data source -- Spark's
``DataFrameWriter.save()`` raises UNSUPPORTED_DATA_SOURCE_SAVE_MODE for ErrorIfExists and
Ignore before calling the source. txlake's JVM class ``txlake.DefaultSource`` (its jar on
``spark.jars``, :mod:`.jvm`) takes that V1 path and runs this writer for Append and
ErrorIfExists; without it the mode must be named, ``mode("append")``. Overwrite is refused
(here, or by the JVM class first) as by Spark's Kafka sink.

How a job is exactly once:

* planning (driver): the schema and options are checked, the job gets a random write
  id, its staging folder ``_staging/spark/<write id>/`` and its transactional id
  ``txlake-spark-write-<write id>``;
* each task attempt stages its rows (topic and partition resolved, as Kafka's producer
  would) as Arrow objects in that folder and returns a :class:`~.staging.StagingMessage`
  naming them -- nothing is visible yet and no writer lease is needed;
* ``commit(messages)`` (driver, once every partition succeeded) appends the objects
  named by the messages Spark passes -- exactly one successful attempt per partition --
  as ONE transaction (:func:`~.staged_commit.commit_staged`), then deletes the whole
  staging folder, including objects of failed, killed or speculative attempts, and any
  staged object older than 7 days (:func:`~.staging.delete_stale_staged`: leftovers of
  drivers that died before committing);
* ``abort(messages)`` (a task or the commit failed) deletes the staging folder: nothing
  of the job is visible.
"""

from __future__ import annotations

import uuid
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter
from pyspark.sql.types import StructType

from .staged_commit import CommitResult, commit_staged
from .staging import (STAGING_PREFIX, StagingMessage, TxlakeWriteError, check_write_options, client_conf,
                      committed_files, delete_staged, delete_stale_staged, stage_task, store_of, write_columns)

__all__ = ["TxlakeBatchWriter"]


class TxlakeBatchWriter(DataSourceArrowWriter):
    """The writer of one ``df.write.format("txlake")`` job (see the module docstring).

    Args:
        options: the write's options (case-insensitive names).
        schema: the input DataFrame's schema.
        overwrite: True for ``mode("overwrite")``, which is refused.

    Raises:
        TxlakeWriteError: at planning, for the errors Spark's Kafka sink reports (no ``value``
            column, wrong column types, no topic) and for missing or invalid options.

    Attributes:
        write_id: the job's random id; ``folder``: its staging folder;
        ``transactional_id``: the transactional id its commit uses.
    """

    def __init__(self, options: dict, schema: StructType, overwrite: bool):
        if overwrite:
            raise TxlakeWriteError("Save mode Overwrite not allowed for txlake: use mode(\"append\") (topics are "
                                   "logs, records are only ever appended; Spark's Kafka sink refuses Overwrite too)")
        check_write_options(options, streaming=False)
        self.conf = client_conf(options)
        self.columns = write_columns(schema, options)
        self.write_id = uuid.uuid4().hex
        self.folder = f"{STAGING_PREFIX}{self.write_id}/"
        self.transactional_id = f"txlake-spark-write-{self.write_id}"
        #: what the last commit() did (on the process that ran it)
        self.result: CommitResult | None = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagingMessage:
        """Stage this task attempt's rows (runs on an executor; see :func:`~.staging.stage_task`)."""
        return stage_task(store_of(self.conf), self.folder, self.columns, iterator)

    def commit(self, messages: list[StagingMessage | None]) -> None:
        """Append every staged row of ``messages`` as one transaction, then delete the staging folder.

        Raises:
            WriterLeaseUnavailable: another process is the writer of the storage root (the
                message names it and says what to do); Spark then calls :meth:`abort`.
            KafkaException: the transaction failed and was aborted.
        """
        files = committed_files(messages)
        self.result = commit_staged(self.conf, self.transactional_id, files)
        store = store_of(self.conf)
        delete_staged(store, self.folder, [f.key for f in files])
        delete_stale_staged(store)

    def abort(self, messages: list[StagingMessage | None]) -> None:
        """Delete everything staged for this job (of ``messages`` and any other attempt): nothing becomes visible."""
        delete_staged(store_of(self.conf), self.folder, [f.key for f in committed_files(messages)])
