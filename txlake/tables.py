"""Delta Lake tables of the topics' committed views (API.md "Tables (Delta Lake)", docs/tables.md).

::

    import txlake.tables
    uri = txlake.tables.table_uri("s3://bucket/lake", "orders")   # s3://bucket/lake/tables/orders
    txlake.tables.publish("s3://bucket/lake", "orders")           # publish now (the writer also does, on a schedule)
    for t in txlake.tables.list_tables("s3://bucket/lake"):
        print(t.uri, t.version, t.last_stable_offsets)

Any Delta reader with deletion-vector support opens ``uri``: delta-spark
(``spark.read.format("delta").load(uri)``), delta-rs (``deltalake.DeltaTable(uri).scan()``;
its pyarrow-dataset reader refuses deletion vectors), Polars through the polars-deltalake plugin
(``polars_deltalake.read_delta(uri)``; ``polars.read_delta`` cannot yet, docs/tables.md), and gets
exactly the records a read_committed Consumer returns as of the published LSO. A deleted topic's
table is emptied, then removed by the compaction round after ``storage.file.delete.delay.ms``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from txlake.catalog.catalog import Catalog
from txlake.catalog.errors import UnknownTopicError
from txlake.catalog.storage import ObjectStore
from txlake.engine.table_publisher import (PublishResult, TablePublisher, publishable_topics, table_configuration,
                                           table_key, table_topics)

__all__ = ["PublishResult", "TableInfo", "delta_storage_options", "list_tables", "publish", "table_uri"]

#: Delta retention of tables published outside a writer: the defaults of ``storage.catalog.retention.ms``
#: and ``storage.file.delete.delay.ms`` (1 hour each)
DEFAULT_RETENTION_MS = 3_600_000


def table_uri(storage_url: str, topic: str, storage_options: dict | None = None) -> str:
    """URI of ``topic``'s Delta table under the root ``storage_url``: ``<root>/tables/<topic>``.

    Raises:
        InvalidStorageUrlError: an unsupported or malformed URL (as :class:`ObjectStore`).
        ValueError: a topic name that is no valid object key.
    """
    store = ObjectStore(storage_url, storage_options)
    return store.uri(table_key(topic))


def delta_storage_options(storage_options: dict | None) -> dict[str, str] | None:
    """The storage options of a Delta reader based on delta-rs (Rust ``object_store`` keys) for
    txlake's fsspec/s3fs ``storage_options``: ``endpoint_url`` -> ``AWS_ENDPOINT_URL``, ``key`` /
    ``secret`` / ``token`` -> ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
    ``AWS_SESSION_TOKEN``, ``client_kwargs.region_name`` -> ``AWS_REGION`` (``http://`` endpoints
    also get ``AWS_ALLOW_HTTP``). None when there are none."""
    if not storage_options:
        return None
    out: dict[str, str] = {}
    names = {"endpoint_url": "AWS_ENDPOINT_URL", "key": "AWS_ACCESS_KEY_ID", "secret": "AWS_SECRET_ACCESS_KEY",
             "token": "AWS_SESSION_TOKEN"}
    for k, v in storage_options.items():
        if k in names and v is not None:
            out[names[k]] = str(v)
    region = (storage_options.get("client_kwargs") or {}).get("region_name")
    if region:
        out["AWS_REGION"] = str(region)
    if out.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        out["AWS_ALLOW_HTTP"] = "true"
    return out or None


def publish(storage_url: str, topic: str | None = None, storage_options: dict | None = None,
            include_internal: bool = False, now_ms: int | None = None) -> list[PublishResult]:
    """Publish the tables of the root now (as the writer does every ``lake.publish.interval.ms``).

    Reads the catalog like any reader (no writer lease); a publication racing the writer's (or
    another process's) loses the race for a version with create-if-absent and retries on the
    newer version, so it may run beside a live writer.

    Args:
        topic: that topic only (a deleted topic's table loses its files); every topic when None
            (and the tables of deleted topics).
        include_internal: with ``topic=None``, also ``__consumer_offsets`` and ``__transaction_state``.
        now_ms: the commits' time (ms since the epoch; wall clock when None).

    Returns:
        one :class:`PublishResult` per table (``committed`` False when it was already current).

    Raises:
        UnknownTopicError: ``topic`` is neither a topic nor a table of the root.
        StorageError / ObjectNotFoundError / CorruptObjectError / DeltaLogError: as
            :meth:`TablePublisher.publish` (the previous version stays readable).
    """
    store = ObjectStore(storage_url, storage_options)
    state = Catalog.open(store).state
    publisher = TablePublisher(store, table_configuration(DEFAULT_RETENTION_MS, DEFAULT_RETENTION_MS))
    if topic is not None:
        if topic not in state.topics and publisher.snapshot(topic).version < 0:
            raise UnknownTopicError(f"Unknown topic: {topic} (no such topic, and no table at "
                                    f"{publisher.table_uri(topic)})")
        topics = [topic]
    else:
        topics = publishable_topics(state, include_internal)
        topics += [t for t in table_topics(store) if t not in state.topics]
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return [publisher.publish(state, t, now_ms) for t in topics]


@dataclass(frozen=True)
class TableInfo:
    """A published table and how fresh it is.

    Attributes:
        topic / uri: the topic and its table root.
        version: the table's newest version.
        catalog_version: the catalog version that version was published from.
        last_stable_offsets: partition -> the LSO the version reflects (its ``txn`` actions): the
            table holds exactly the partition's committed records below it.
        commit_time_ms: when the version was committed (ms since the epoch).
        files: objects (logical files) in the version.
    """

    topic: str
    uri: str
    version: int
    catalog_version: int
    last_stable_offsets: dict[int, int]
    commit_time_ms: int
    files: int


def list_tables(storage_url: str, storage_options: dict | None = None) -> list[TableInfo]:
    """Every table under the root with its freshness (one listing of ``tables/`` and a read of each log).

    Raises:
        StorageError / DeltaLogError: the backend failed or a table's log is unreadable.
    """
    store = ObjectStore(storage_url, storage_options)
    publisher = TablePublisher(store)
    out = []
    for topic in table_topics(store):
        snap = publisher.snapshot(topic)
        info = snap.commit_info or {}
        params = info.get("operationParameters") or {}
        lso = {int(k): v for k, v in json.loads(params.get("lastStableOffsets") or "{}").items()}
        out.append(TableInfo(topic, publisher.table_uri(topic), snap.version, int(params.get("catalogVersion", -1)),
                             lso, int(info.get("timestamp", 0)), len(snap.files)))
    return out
