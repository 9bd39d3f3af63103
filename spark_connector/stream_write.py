"""``writeStream.format("txlake")``: every micro-batch appended exactly once, even across restarts.

Columns and options are those of the batch write (:mod:`.batch_write`), plus
``transactional.id`` (optional, see below). Output modes: all (records are appended;
Complete mode appends the whole result table each batch, as Spark's Kafka sink does).

How a micro-batch is exactly once:

* the sink's identity -- its transactional id, and the consumer group holding its
  progress -- is the ``transactional.id`` option when set, else
  ``txlake-spark-sink-<queryId>`` where queryId is Spark's streaming query id, which is
  kept in the checkpoint and so survives restarts (the tasks read it from Spark's local
  property ``sql.streaming.queryId`` and send it to the driver in their messages);
* tasks stage their rows as ``_staging/spark/stream-<identity>/<batchId>-<task>...`` exactly
  as a batch write's tasks do (:mod:`.staging`; one folder per query, not per batch);
* ``commit(messages, batchId)`` calls :func:`~.staged_commit.commit_staged` with a
  :class:`~.staged_commit.SinkProgress`: after ``init_transactions()`` (which fences and
  completes any earlier commit of this query, e.g. one cut short by a crash), it reads
  the group's committed offset of the pseudo partition ``__txlake_spark_sink-0``; when
  that offset is above ``batchId`` the batch was committed before and nothing is
  written. Otherwise the records and ``send_offsets_to_transaction({__txlake_spark_sink-0:
  batchId + 1})`` go into ONE transaction: the batch's records and its "batch done" mark
  become visible together or not at all. Spark re-runs the last batch after a restart
  when the commit reached the sink but not Spark's checkpoint (``commits/<batchId>``):
  that re-run finds its mark and writes nothing;
* the staged objects of the batch (and of any failed attempt, and of earlier batches)
  are then deleted; ``abort(messages, batchId)`` deletes the batch's staging folder.

A query restarted from a NEW checkpoint gets a new queryId, hence a new identity. With
an explicit ``transactional.id``, a new checkpoint needs a new id: the sink refuses to
skip batches recorded by a different query (:class:`~.staged_commit.BatchFenceError`).
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter
from pyspark.sql.types import StructType

from .staged_commit import CommitResult, SinkProgress, commit_staged
from .staging import (STAGING_PREFIX, StagingMessage, TxlakeWriteError, _option, check_write_options, client_conf,
                      committed_files, delete_staged, delete_stale_staged, stage_task, store_of, task_property,
                      write_columns)

__all__ = ["TxlakeStreamWriter", "QUERY_ID_PROPERTY", "BATCH_ID_PROPERTY"]

#: Spark's local property holding the streaming query id (``StreamExecution.QUERY_ID_KEY``)
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: Spark's local property holding the micro-batch id (``MicroBatchExecution.BATCH_ID_KEY``)
BATCH_ID_PROPERTY = "streaming.sql.batchId"
_UNKNOWN_BATCH = "unknown"


def _folder_name(identity: str) -> str:
    """A staging folder name for ``identity`` (any string): safe characters, unique by a hash."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", identity)[:80]
    if safe != identity:
        safe += "-" + hashlib.sha1(identity.encode()).hexdigest()[:12]
    return f"stream-{safe}"


class TxlakeStreamWriter(DataSourceStreamArrowWriter):
    """The sink of one ``writeStream.format("txlake")`` query (see the module docstring).

    Args:
        options: the query's sink options (case-insensitive names).
        schema: the streaming DataFrame's schema.
        overwrite: Spark's flag for Complete output mode; records are appended regardless.

    Raises:
        TxlakeWriteError: at query start, for the errors Spark's Kafka sink reports and
            for missing or invalid options.

    Attributes:
        result: what the last :meth:`commit` in this process did (a
            :class:`~.staged_commit.CommitResult`), or None.
    """

    def __init__(self, options: dict, schema: StructType, overwrite: bool):
        check_write_options(options, streaming=True)
        self.conf = client_conf(options)
        self.columns = write_columns(schema, options)
        explicit = _option(options, "transactional.id")
        if explicit is not None and not explicit.strip():
            raise TxlakeWriteError("option 'transactional.id' is empty")
        self.explicit_id = explicit.strip() if explicit is not None else None
        self.result: CommitResult | None = None

    # ------------------------------------------------------------------ identity
    def identity(self, query_id: str | None) -> str:
        """The sink's transactional id and progress group id for streaming query ``query_id``.

        Raises:
            TxlakeWriteError: neither a ``transactional.id`` option nor a query id.
        """
        if self.explicit_id is not None:
            return self.explicit_id
        if not query_id:
            raise TxlakeWriteError(
                "the txlake streaming sink cannot tell which query it serves (no Spark streaming query id): "
                "set the 'transactional.id' option to an id that stays the same across restarts of this query")
        return f"txlake-spark-sink-{query_id}"

    def _folder(self, identity: str) -> str:
        return f"{STAGING_PREFIX}{_folder_name(identity)}/"

    # ------------------------------------------------------------------ tasks
    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagingMessage:
        """Stage this task attempt's rows of the current micro-batch (runs on an executor)."""
        query_id = task_property(QUERY_ID_PROPERTY)
        batch = task_property(BATCH_ID_PROPERTY)
        batch_id = int(batch) if batch is not None and batch.lstrip("-").isdigit() else None
        prefix = f"{batch_id:012d}-" if batch_id is not None else f"{_UNKNOWN_BATCH}-"
        if self.explicit_id is None and not query_id:
            # not in a streaming task (a tool or a test calling write()): commit() will need the
            # query id in the messages, or fail; these objects are deleted by name either way
            folder = f"{STAGING_PREFIX}stream-unidentified/"
        else:
            folder = self._folder(self.identity(query_id))
        return stage_task(store_of(self.conf), folder, self.columns, iterator, query_id, batch_id,
                          name_prefix=prefix)

    # ------------------------------------------------------------------ driver
    def commit(self, messages: list[StagingMessage | None], batchId: int) -> None:
        """Append micro-batch ``batchId`` in one transaction with its batch-id mark, unless it
        was committed before; then delete its staged objects.

        Raises:
            WriterLeaseUnavailable: another process is the writer of the storage root.
            BatchFenceError: the ``transactional.id`` option names another query's sink.
            KafkaException: the transaction failed and was aborted (Spark fails the query;
                a restart re-runs the batch).
        """
        files = committed_files(messages)
        query_id = next((m.query_id for m in messages if m is not None and m.query_id), None)
        if not files and self.explicit_id is None and query_id is None:
            return  # no task ran: nothing staged, nothing to write
        identity = self.identity(query_id)
        self.result = commit_staged(self.conf, identity, files,
                                    progress=SinkProgress(identity, batchId, query_id))
        self._cleanup(identity, batchId, [f.key for f in files], upto=True)
        delete_stale_staged(store_of(self.conf))

    def abort(self, messages: list[StagingMessage | None], batchId: int) -> None:
        """Delete what was staged for micro-batch ``batchId``: nothing of it becomes visible."""
        query_id = next((m.query_id for m in messages if m is not None and m.query_id), None)
        keys = [f.key for f in committed_files(messages)]
        try:
            identity = self.identity(query_id)
        except TxlakeWriteError:  # no identity, so no folder: delete what the messages name
            store = store_of(self.conf)
            for key in keys:
                store.delete(key)
            return
        self._cleanup(identity, batchId, keys, upto=False)

    def _cleanup(self, identity: str, batch_id: int, keys: list[str], upto: bool) -> None:
        """Delete ``keys`` and the staged objects of batch ``batch_id`` (``upto``: and of every
        earlier batch, and of attempts that could not tell their batch)."""
        folder = self._folder(identity)

        def wanted(key: str) -> bool:
            part = key[len(folder):].split("-", 1)[0]
            if part == _UNKNOWN_BATCH:
                return upto
            try:
                n = int(part)
            except ValueError:
                return False
            return n <= batch_id if upto else n == batch_id

        delete_staged(store_of(self.conf), folder, keys, only=wanted)
