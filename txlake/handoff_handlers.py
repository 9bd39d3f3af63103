"""The writes this process runs for others while it holds a storage root's writer lease.

engine/handoff.py carries requests from a process that cannot take the lease to the one
that holds it; the engine runs whatever handler is registered for a request's kind. The
handlers are registered here, when txlake is imported, so that any process using txlake
-- a notebook with an open producer, a CLI, a copier -- serves them:

* ``spark.commit_staged`` -- the commit of a Spark write whose tasks staged their rows
  (txlake/spark_connector/staged_commit.py); imported only when such a request arrives.
* ``spark.compaction_swap`` -- the retention step and the segment swaps of a compaction run
  as a Spark job (txlake/spark_connector/compaction_job.py), committed on this process's
  engine; needs no pyspark here.
* ``txn.abort`` -- the ABORT marker of ``AdminClient.abort_transaction`` (``txlake
  transactions abort``, KIP-664) run from another process, written by this process's engine.
"""

from __future__ import annotations

from txlake.catalog.storage import ObjectStore
from txlake.engine.handoff import register_handler

SPARK_COMMIT_STAGED = "spark.commit_staged"


def _spark_commit_staged(store: ObjectStore, payload: dict) -> dict:
    from txlake.spark_connector.staged_commit import HANDOFF_KIND, run_handed_over

    assert HANDOFF_KIND == SPARK_COMMIT_STAGED, "the hand-over kind is named in two places"
    return run_handed_over(store, payload)


register_handler(SPARK_COMMIT_STAGED, _spark_commit_staged)


SPARK_COMPACTION_SWAP = "spark.compaction_swap"


def _spark_compaction_swap(store: ObjectStore, payload: dict) -> dict:
    from txlake.spark_connector.compaction_job import HANDOFF_KIND, run_handed_over

    assert HANDOFF_KIND == SPARK_COMPACTION_SWAP, "the hand-over kind is named in two places"
    return run_handed_over(store, payload)


register_handler(SPARK_COMPACTION_SWAP, _spark_compaction_swap)


TXN_ABORT = "txn.abort"


def _txn_abort(store: ObjectStore, payload: dict) -> dict:
    from txlake.admin import abort_handed_over

    return abort_handed_over({"storage.url": store.url, "storage.options": dict(store.storage_options)}, payload)


register_handler(TXN_ABORT, _txn_abort)
