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

Kafka requests (an ``AdminClient.abort_transaction``'s WriteTxnMarkers, KIP-664) are handed
over as Kafka requests, kind ``kafka.request``, and answered by the holder's request surface
(engine/apis/handoff.py) -- by the holding broker's own, or, when that broker has none,
this process's shared broker's (registered here); only the two Spark operations above,
which have no Kafka API, remain kinds of their own.
"""

from __future__ import annotations

from txlake.catalog.storage import ObjectStore
from txlake.engine.apis.handoff import KAFKA_REQUEST
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


def _kafka_request(store: ObjectStore, payload: dict) -> dict:
    """A Kafka request handed over to a lease holder whose broker has no request surface yet
    (a process that took the lease through the engine alone, e.g. ``txlake compact``): it is
    answered by the request surface of this process's shared broker of the root. (A broker
    with a request surface answers the kind itself: :meth:`Broker.serve_handoff`.)"""
    from txlake.engine.apis import local_apis
    from txlake.engine.apis.handoff import answer_handed_over
    from txlake.engine.registry import acquire_broker, release_broker

    broker = acquire_broker(store.url, dict(store.storage_options))
    try:
        return answer_handed_over(local_apis(broker).call, payload)
    finally:
        release_broker(broker)


register_handler(KAFKA_REQUEST, _kafka_request)
