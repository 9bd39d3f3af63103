"""The one place where staged records become visible: :func:`commit_staged`.

The Spark sink's tasks stage their records under ``_staging/spark/`` (:mod:`.staging`);
the driver's ``commit()`` hands the staged objects of the successful task attempts to
:func:`commit_staged`, which appends all of them as ONE Kafka transaction:

1. a transactional :class:`txlake.Producer` with the write's ``transactional.id`` runs
   ``init_transactions()`` -- this takes the storage root's writer lease and fences (and
   completes) any earlier instance with the same id, e.g. a commit that crashed half-way;
2. for a streaming micro-batch (``progress`` given): the batch-id fence. The sink's
   progress is a committed offset of a consumer group owned by the query, on partition
   ``__txlake_spark_sink-0`` (a one-partition topic that holds no records, created by the
   first streaming commit: offsets are committed only for existing partitions, as Kafka
   requires): offset = last committed batch id + 1.
   If it already covers ``progress.batch_id``, the batch was committed before (Spark
   re-runs the last batch after a restart when its own commit log missed it) and
   nothing is written;
3. ``begin_transaction()``; per topic ``produce_arrow()`` of the staged batches, in
   task order (so the rows of one Spark partition keep their order within a Kafka
   partition); for a micro-batch ``send_offsets_to_transaction({__txlake_spark_sink-0:
   batch_id + 1}, group)`` -- the records and the batch id commit together or not at
   all (KIP-447's atomic offset commit);
4. ``commit_transaction()``; on any error ``abort_transaction()``: nothing is visible.

The producer (and the engine it opened) is closed before returning, so this process
releases the writer lease at once: the next writer -- another Spark commit, a notebook
-- need not wait for it to lapse.

The function takes and returns plain data (a config dict, an id, staged-object
descriptions that :meth:`StagedFile.to_dict` turns into JSON), so it can also run in
another process, e.g. the holder of the writer lease.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from txlake.catalog.storage import ObjectStore

from .staging import StagedFile, read_staged, store_of

__all__ = ["PROGRESS_TOPIC", "DEFAULT_TRANSACTION_TIMEOUT_MS", "SinkProgress", "CommitResult",
           "WriterLeaseUnavailable", "BatchFenceError", "HandedOverCommitError", "commit_staged",
           "last_committed_batch", "run_handed_over"]

#: the pseudo topic whose partition 0 holds a streaming sink's progress in its consumer group
PROGRESS_TOPIC = "__txlake_spark_sink"
#: transaction.timeout.ms of a sink's transaction unless ``kafka.transaction.timeout.ms`` says
#: otherwise: Kafka's largest default (transaction.max.timeout.ms), so a big commit is not
#: aborted by the coordinator half-way (a crashed commit holds back the LSO that long at most)
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000


@dataclass(frozen=True)
class SinkProgress:
    """The batch-id fence of a streaming micro-batch.

    Attributes:
        group_id: the consumer group holding the sink's progress (one per query).
        batch_id: Spark's micro-batch id (0, 1, 2, ...).
        query_id: Spark's streaming query id (stable across restarts from one checkpoint),
            stored with the progress to catch a fresh query reusing another's id.
    """

    group_id: str
    batch_id: int
    query_id: str | None = None


@dataclass
class CommitResult:
    """What :func:`commit_staged` did.

    Attributes:
        records: records appended (0 when skipped).
        offsets: ``{topic: {partition: (first offset, last offset)}}`` of the appended records.
        skipped: True when ``progress.batch_id`` had already been committed (nothing written).
        last_batch_id: the sink's last committed batch id after the call (streaming), else None.
    """

    records: int = 0
    offsets: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    skipped: bool = False
    last_batch_id: int | None = None


class WriterLeaseUnavailable(RuntimeError):
    """Another live process holds the storage root's writer lease, so this one cannot commit.

    Attributes:
        storage_url: the storage root.
        holder: who holds the lease (writer id, host, pid, lease epoch).
        expires_in_ms: when the lease lapses if the holder stops renewing it (ms, from now).
    """

    def __init__(self, message: str, storage_url: str, holder: str, expires_in_ms: int):
        super().__init__(message)
        self.storage_url = storage_url
        self.holder = holder
        self.expires_in_ms = expires_in_ms

    def __reduce__(self):
        return (type(self), (self.args[0], self.storage_url, self.holder, self.expires_in_ms))


class BatchFenceError(RuntimeError):
    """A streaming sink's progress belongs to another query (a fresh checkpoint with a reused
    ``transactional.id``): writing would silently skip or mix batches."""


def _storage_conf(conf: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in conf.items() if k.startswith("storage.")}


def _lease_error(conf: Mapping[str, Any], transactional_id: str, cause: Exception) -> WriterLeaseUnavailable:
    """The clear error for a commit refused because another process is the writer."""
    from txlake.catalog.catalog import Catalog
    from txlake.catalog.writer_lease import WriterLease

    store = store_of(conf)
    try:
        holder, expires_in = WriterLease(Catalog.open(store)).describe_holder()
    except Exception as exc:  # noqa: BLE001 - the description is a courtesy
        holder, expires_in = f"another process (its description could not be read: {exc})", 0
    lapse = (f"its lease lapses {expires_in / 1000:.1f} s after that process stops renewing it "
             "(it renews while its engine is open)" if expires_in > 0 else "its lease is lapsing")
    return WriterLeaseUnavailable(
        f"txlake: cannot commit the Spark write (transactional.id {transactional_id!r}) to {store.url}: the "
        f"storage root's writer lease is held by {holder}, and one process at a time may write. Nothing of "
        f"this write became visible. What to do: in that process, close its txlake Producer/Consumer/"
        f"AdminClient (or call txlake.engine.registry.close_all()) so it releases the lease at once, or stop "
        f"it and wait for the lease to lapse ({lapse}); then run the write again. ({cause})",
        store.url, holder, expires_in)


def _files(files: Iterable[StagedFile | Mapping[str, Any]]) -> list[StagedFile]:
    return [f if isinstance(f, StagedFile) else StagedFile.from_dict(f) for f in files]


def last_committed_batch(conf: Mapping[str, Any], group_id: str,
                         timeout: float = 60.0) -> tuple[int | None, str | None]:
    """A streaming sink's progress: ``(last committed batch id or None, query id or None)``.

    Reads the group's committed offset of ``__txlake_spark_sink-0`` through a
    read_committed :class:`txlake.Consumer` (stable offsets only: it waits while a
    transaction holds a pending one). Needs no writer lease.
    """
    from txlake import Consumer, TopicPartition

    consumer = Consumer({**_storage_conf(conf), "group.id": group_id, "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    try:
        (tp,) = consumer.committed([TopicPartition(PROGRESS_TOPIC, 0)], timeout=timeout)
    finally:
        consumer.close()
    if tp.offset is None or tp.offset < 0:
        return None, None
    query_id = None
    if tp.metadata:
        try:
            query_id = json.loads(tp.metadata).get("queryId")
        except (ValueError, AttributeError):
            query_id = None
    return tp.offset - 1, query_id


def commit_staged(conf: Mapping[str, Any], transactional_id: str, files: Iterable[StagedFile | Mapping[str, Any]],
                  *, progress: SinkProgress | None = None, timeout: float = 120.0,
                  hand_over: bool = True) -> CommitResult:
    """Append the records of ``files`` to their topics as one transaction (see the module docstring).

    When another live process holds the storage root's writer lease, the commit is handed
    to that process (engine/handoff.py): it runs this same function and answers with the
    result. A holder that does not take the request within ``storage.handoff.timeout.ms``
    (default 30 s) -- an engine too busy, or a txlake without hand-over -- leaves the
    commit undone and :class:`WriterLeaseUnavailable` is raised.

    Args:
        conf: txlake client config: ``storage.url``, ``storage.*`` and producer keys
            (``kafka.*`` options without the prefix); ``transaction.timeout.ms`` defaults to
            :data:`DEFAULT_TRANSACTION_TIMEOUT_MS`.
        transactional_id: the write's transactional id (one per batch job; one per
            streaming query, so a restarted query fences its earlier instance).
        files: the staged objects to append (:class:`StagedFile` or its ``to_dict()``), in order.
        progress: for a streaming micro-batch, its batch-id fence; None for a batch job.
        timeout: seconds each transactional step (init, each append, commit) may take.
        hand_over: hand the commit to the lease holder when the lease is held elsewhere
            (False: raise :class:`WriterLeaseUnavailable` at once; the holder itself runs it so).

    Returns:
        :class:`CommitResult`. The staged objects are not deleted here (the caller does,
        once this returned: they are committed, or were of an already committed batch).

    Raises:
        WriterLeaseUnavailable: another process holds the writer lease and did not take the
            handed-over commit (the message names it and says what to do); nothing was written.
        HandedOverCommitError: the holder ran the commit and it failed (the message carries
            its error); as for a local failure, its transaction was aborted.
        BatchFenceError: the sink's progress belongs to another streaming query.
        KafkaException: the transaction failed (it was aborted: nothing is visible), e.g.
            ``_UNKNOWN_TOPIC`` for a topic deleted since the tasks ran.
        ObjectNotFoundError: a staged object is gone (the transaction was aborted).
    """
    staged = _files(files)
    try:
        return _commit_here(conf, transactional_id, staged, progress, timeout)
    except WriterLeaseUnavailable as held:
        if not hand_over:
            raise
        return _hand_over(conf, transactional_id, staged, progress, timeout, held)


def _ensure_progress_topic(conf: Mapping[str, Any]) -> None:
    """Create the streaming sinks' progress topic (``__txlake_spark_sink``, one partition, no
    records) when it does not exist yet: the sink's progress is its group's committed offset of
    partition 0, and a TxnOffsetCommit names an existing partition (Kafka answers
    UNKNOWN_TOPIC_OR_PARTITION otherwise)."""
    from txlake import AdminClient, NewTopic
    from txlake.error import KafkaError, KafkaException

    with AdminClient({k: v for k, v in conf.items() if k.startswith("storage.")}) as admin:
        try:
            admin.create_topics([NewTopic(PROGRESS_TOPIC, 1)])[PROGRESS_TOPIC].result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise


def _commit_here(conf: Mapping[str, Any], transactional_id: str, staged: list[StagedFile],
                 progress: SinkProgress | None, timeout: float) -> CommitResult:
    """:func:`commit_staged` in this process (it takes the writer lease)."""
    from txlake import Producer, TopicPartition
    from txlake.error import KafkaError, KafkaException

    if not staged or sum(f.rows for f in staged) == 0:
        return CommitResult(last_batch_id=None)
    pconf = {**conf, "transactional.id": transactional_id}
    pconf.pop(HANDOFF_TIMEOUT_KEY, None)
    pconf.setdefault("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS)
    producer = Producer(pconf)
    try:
        try:
            producer.init_transactions(timeout)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.NOT_LEADER_OR_FOLLOWER:
                raise _lease_error(conf, transactional_id, exc) from exc
            raise
        if progress is not None:
            last, last_query = last_committed_batch(conf, progress.group_id, timeout)
            if last is not None and last >= progress.batch_id:
                if progress.query_id and last_query and last_query != progress.query_id:
                    raise BatchFenceError(
                        f"txlake sink {progress.group_id!r} has committed batches up to {last} of streaming query "
                        f"{last_query}, but this is query {progress.query_id} (batch {progress.batch_id}): a query "
                        "keeps its id only with its checkpoint. Use a new 'transactional.id' option for a new "
                        "checkpoint, or restart from the original checkpoint.")
                return CommitResult(skipped=True, last_batch_id=last)
        store = store_of(conf)
        topics = sorted({t for f in staged for t, n in f.topics if n})
        result = CommitResult()
        producer.begin_transaction()
        try:
            for topic in topics:
                bulk = producer.produce_arrow(topic, read_staged(store, staged, topic), key="key", value="value",
                                              partition="partition", headers="headers", timeout=timeout)
                result.records += bulk.records
                result.offsets[topic] = dict(bulk.offsets)
            if progress is not None:
                _ensure_progress_topic(pconf)
                meta = json.dumps({"batchId": progress.batch_id, "queryId": progress.query_id})
                producer.send_offsets_to_transaction(
                    [TopicPartition(PROGRESS_TOPIC, 0, progress.batch_id + 1, meta)], progress.group_id, timeout)
                result.last_batch_id = progress.batch_id
            producer.commit_transaction(timeout)
        except BaseException:
            try:
                producer.abort_transaction(timeout)
            except Exception:  # noqa: BLE001 - the original error matters; an open txn times out
                pass
            raise
        return result
    finally:
        producer.close(timeout)


# ---------------------------------------------------------------------------- hand-over
#: the hand-over kind the lease holder runs (registered in txlake/handoff_handlers.py)
HANDOFF_KIND = "spark.commit_staged"
#: config key: ms a commit waits for the lease holder to take it (default :data:`HANDOFF_TIMEOUT_MS`)
HANDOFF_TIMEOUT_KEY = "storage.handoff.timeout.ms"
HANDOFF_TIMEOUT_MS = 30_000
#: s between looks at the lease while a handed-over commit waits to be taken
_LEASE_LOOK_S = 2.0


class HandedOverCommitError(RuntimeError):
    """The writer-lease holder ran a handed-over commit and it failed; nothing of it is visible."""


def _result_to_dict(result: CommitResult) -> dict[str, Any]:
    return {"records": result.records, "skipped": result.skipped, "last_batch_id": result.last_batch_id,
            "offsets": {t: {str(p): list(r) for p, r in parts.items()} for t, parts in result.offsets.items()}}


def _result_from_dict(data: Mapping[str, Any]) -> CommitResult:
    return CommitResult(records=int(data["records"]), skipped=bool(data["skipped"]), last_batch_id=data["last_batch_id"],
                        offsets={t: {int(p): (r[0], r[1]) for p, r in parts.items()}
                                 for t, parts in data["offsets"].items()})


def _hand_over(conf: Mapping[str, Any], transactional_id: str, staged: list[StagedFile],
               progress: SinkProgress | None, timeout: float, held: WriterLeaseUnavailable) -> CommitResult:
    """Hand the commit to the lease holder and wait for its answer; if nobody takes it (the
    lease lapsed meanwhile, or the holder serves no hand-overs), try here once more."""
    import time

    from txlake.catalog.catalog import Catalog
    from txlake.catalog.writer_lease import WriterLease
    from txlake.engine.handoff import HandoffCancelled, HandoffError, submit

    store = store_of(conf)
    wait_ms = int(conf.get(HANDOFF_TIMEOUT_KEY, HANDOFF_TIMEOUT_MS))
    payload = {"conf": {k: v for k, v in conf.items() if not k.startswith("storage.")},
               "transactional_id": transactional_id, "files": [f.to_dict() for f in staged], "timeout": timeout,
               "progress": None if progress is None else {"group_id": progress.group_id, "batch_id": progress.batch_id,
                                                           "query_id": progress.query_id}}
    looked = [time.monotonic()]

    def lease_lapsed() -> bool:
        """Polled while the request waits: True once nobody holds a live lease."""
        if time.monotonic() - looked[0] < _LEASE_LOOK_S:
            return False
        looked[0] = time.monotonic()
        _, expires_in = WriterLease(Catalog.open(store)).describe_holder()
        return expires_in <= 0

    try:
        return _result_from_dict(submit(store, HANDOFF_KIND, payload, wait_ms / 1000, give_up=lease_lapsed))
    except HandoffError as exc:
        raise HandedOverCommitError(f"txlake: the writer-lease holder of {store.url} ran the commit of "
                                    f"transactional.id {transactional_id!r} for this process and it failed: {exc}") from None
    except HandoffCancelled:
        pass
    try:
        return _commit_here(conf, transactional_id, staged, progress, timeout)
    except WriterLeaseUnavailable as again:
        raise WriterLeaseUnavailable(
            f"{again} The commit was also handed to that process, which did not take it within {wait_ms / 1000:.0f} s "
            f"({HANDOFF_TIMEOUT_KEY}): its engine may be busy or a txlake without hand-over.",
            again.storage_url, again.holder, again.expires_in_ms) from None


def run_handed_over(store: ObjectStore, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The lease holder's side of a handed-over commit (engine/handoff.py handler): run
    :func:`commit_staged` here, on the holder's own storage root and options, and return
    the :class:`CommitResult` as JSON."""
    conf = {**payload["conf"], "storage.url": store.url, "storage.options": dict(store.storage_options)}
    progress = payload.get("progress")
    result = commit_staged(conf, payload["transactional_id"], payload["files"],
                           progress=None if progress is None else SinkProgress(**progress),
                           timeout=float(payload.get("timeout", 120.0)), hand_over=False)
    return _result_to_dict(result)
