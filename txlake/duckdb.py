"""DuckDB over the committed view of a storage root: one view per topic.

::

    import txlake.duckdb
    con = txlake.duckdb.connect("file:///data/lake")     # or s3://bucket/prefix, memory://name
    con.sql('SELECT partition, count(*) FROM "orders" GROUP BY ALL').show()
    txlake.duckdb.refresh(con)                            # pick up commits made since

Every view has Spark's Kafka-source columns (API.md), in this order:

=============  ======================================  =========================================
column         DuckDB type                             meaning
=============  ======================================  =========================================
key            BLOB                                    null for a null key
value          BLOB                                    null for a tombstone
topic          VARCHAR                                 the topic name
partition      INTEGER                                 partition id
offset         BIGINT                                  the record's offset in its partition
timestamp      TIMESTAMP                               UTC, whole milliseconds
timestampType  INTEGER                                 0 CreateTime, 1 LogAppendTime
headers        STRUCT(key VARCHAR, value BLOB)[]       null when the record has none
=============  ======================================  =========================================

A view holds exactly the committed records (:mod:`txlake.committed_view`): per
partition the offsets from the log start offset up to the last stable offset, from the
objects and row groups the catalog names, without control records (and, once
transactions exist, without aborted ones). Views are built from the catalog only --
reading never talks to a writer and never takes the writer lease -- and are frozen at
the catalog version they were built from until :func:`refresh`.

A topic whose objects cannot be read (corrupt, missing, unknown format version) gets a
view that raises an error naming the topic and the object when queried; the other views
work, so a damaged internal topic never takes the user's topics down
(:func:`unreadable_topics`, :class:`UnreadableTopicWarning`).

How it reads: DuckDB's own Parquet reader scans the objects (``read_parquet`` with
the topic, partition and offset filters pushed down to row-group statistics, so row
groups of other topics and partitions are skipped unread). Local roots are read by
path; other roots (``memory://``, ``s3://``, ...) through the root's fsspec filesystem,
registered with the connection (DuckDB's httpfs extension is not needed).
"""

from __future__ import annotations

import atexit
import io
import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable

import duckdb

from txlake.catalog.catalog import Catalog
from txlake.catalog.storage import ObjectNotFoundError, ObjectStore, StorageError
from txlake.formats.errors import TxlakeError

from .committed_view import READ_COMMITTED, ObjectScan, TopicView, topic_view, topic_views, verify_objects

__all__ = ["COLUMNS", "UnreadableTopicWarning", "committed_files", "connect", "refresh", "topic_relation",
           "topic_sql", "unreadable_topics", "view_sql"]


class UnreadableTopicWarning(UserWarning):
    """:func:`connect` / :func:`refresh` found topics whose objects cannot be read; their views
    raise an error naming the topic and the object when queried, every other view works."""

#: The view columns and their DuckDB types (Spark's Kafka-source schema).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("key", "BLOB"),
    ("value", "BLOB"),
    ("topic", "VARCHAR"),
    ("partition", "INTEGER"),
    ("offset", "BIGINT"),
    ("timestamp", "TIMESTAMP"),
    ("timestampType", "INTEGER"),
    ("headers", 'STRUCT("key" VARCHAR, "value" BLOB)[]'),
)


def quote_ident(name: str) -> str:
    """A DuckDB identifier for ``name`` (double-quoted, so '.', '-' and keywords are safe)."""
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_SELECT = (
    'SELECT "key", "value", "topic", "partition", "offset", '
    'epoch_ms("timestamp") AS "timestamp", CAST("timestamp_type" AS INTEGER) AS "timestampType", "headers"'
)
_EMPTY = "SELECT " + ", ".join(f"CAST(NULL AS {t}) AS {quote_ident(c)}" for c, t in COLUMNS) + " WHERE false"


# ------------------------------------------------------------------ filesystems
def _duckdb_path(store: ObjectStore, key: str) -> str:
    """The path DuckDB opens for an object: a local path, or ``protocol://...`` for fsspec."""
    path = store.fs_path(key)
    if store.protocol == "file":
        return path
    return f"{store.protocol}://{path.lstrip('/')}"


def _memory_fs_class():
    from fsspec.implementations.memory import MemoryFileSystem

    class _PrivateReadMemoryFileSystem(MemoryFileSystem):
        """fsspec's memory filesystem, but each read handle gets its own copy (DuckDB reads
        from several threads; MemoryFileSystem hands every opener one shared cursor)."""

        def _open(self, path, mode="rb", **kwargs):
            if mode == "rb":
                stripped = self._strip_protocol(path)
                f = self.store.get(stripped)
                if f is not None:
                    return io.BytesIO(f.getvalue())
            return super()._open(path, mode, **kwargs)

    return _PrivateReadMemoryFileSystem


_MEMORY_FS = None


def _duckdb_filesystem(store: ObjectStore):
    global _MEMORY_FS
    if store.protocol == "memory":
        if _MEMORY_FS is None:
            _MEMORY_FS = _memory_fs_class()()
        return _MEMORY_FS
    return store.fs


# ------------------------------------------------------------------ per-connection state
@dataclass
class _Root:
    """One storage root attached to a connection, and the views made from it."""

    store: ObjectStore
    catalog: Catalog
    isolation_level: str
    topics: frozenset[str] | None
    prefix: str
    views: dict[str, tuple[str, str]] = field(default_factory=dict)  # topic -> (view name, sql)
    unreadable: dict[str, str] = field(default_factory=dict)  # topic -> why its view raises


@dataclass
class _ConnState:
    roots: list[_Root] = field(default_factory=list)
    filesystems: dict[str, Any] = field(default_factory=dict)  # protocol name -> fsspec fs we registered
    lock: threading.RLock = field(default_factory=threading.RLock)


_STATES: "weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, _ConnState]" = weakref.WeakKeyDictionary()
_STATES_LOCK = threading.Lock()


def _state(con: duckdb.DuckDBPyConnection, create: bool = False) -> _ConnState | None:
    with _STATES_LOCK:
        st = _STATES.get(con)
        if st is None and create:
            st = _STATES[con] = _ConnState()
        return st


def _register_filesystem(con: duckdb.DuckDBPyConnection, cs: _ConnState, store: ObjectStore) -> None:
    if store.protocol == "file":
        return
    fs = _duckdb_filesystem(store)
    protos = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    name = protos[0]
    mine = cs.filesystems.get(name)
    if mine is fs:
        return
    if mine is not None:
        raise ValueError(
            f"this DuckDB connection already reads {name}:// through a filesystem with other storage options; "
            f"open {store.url} on its own connection (txlake.duckdb.connect without connection=)")
    if name in con.list_filesystems():
        return  # registered by the caller: trust it
    con.register_filesystem(fs)
    cs.filesystems[name] = fs


@atexit.register
def _unregister_all() -> None:
    """Drop our fsspec filesystems from connections still open at exit (DuckDB's bindings
    otherwise report the Python objects as leaked)."""
    with _STATES_LOCK:
        items = list(_STATES.items())
    for con, cs in items:
        for name in list(cs.filesystems):
            try:
                con.unregister_filesystem(name)
            except Exception:  # noqa: BLE001 - closed connection, nothing to drop
                pass
        cs.filesystems.clear()


# ------------------------------------------------------------------ SQL of a view
def view_sql(store: ObjectStore, view: TopicView) -> str:
    """The SELECT statement of a topic's committed view (columns :data:`COLUMNS`).

    Objects whose every row group the catalog names are scanned together, filtered by
    topic and control flag, plus -- only for partitions that need it -- their offset
    bounds and aborted transactions; objects holding row groups the catalog no longer
    names are scanned one by one, matched against their own segments (see
    :class:`txlake.committed_view.ObjectScan`). Per-partition conditions are one
    ``CASE "partition" WHEN ...`` expression (cheaper for DuckDB than a chain of ORs).
    """
    base = [f'"topic" = {_lit(view.topic)}', 'NOT "is_control"']
    aborted: dict[int, list[str]] = {
        p: [f'NOT ("producer_id" = {t.producer_id} AND "offset" BETWEEN {t.first_offset} AND {t.last_offset})'
            for t in txns]
        for p, txns in view.aborted.items()
    }
    parts = []
    shared = [o for o in view.objects if not o.exact]
    if shared:
        conds = {p: list(cs) for p, cs in aborted.items()}
        for b in view.bounded_partitions():
            conds.setdefault(b.partition, []).insert(0, f'"offset" >= {b.start} AND "offset" < {b.end}')
        parts.append(_scan(store, shared, base + _partition_case(conds, "true")))
    visible = view.visible_segments()
    for obj in (o for o in view.objects if o.exact):
        ranges: dict[int, list[str]] = {}
        for o, s, first, last in visible:
            if o.key == obj.key:
                ranges.setdefault(s.partition, []).append(f'"offset" BETWEEN {first} AND {last}')
        conds = {p: ["(" + " OR ".join(rs) + ")"] + aborted.get(p, []) for p, rs in ranges.items()}
        parts.append(_scan(store, [obj], base + (_partition_case(conds, "false") or ["false"])))
    if not parts:
        return _EMPTY
    return "\nUNION ALL\n".join(parts)


def unreadable_view_sql(message: str) -> str:
    """The SELECT statement of a view that cannot be read: the columns :data:`COLUMNS`, and
    any query that reads a row of it fails with ``message`` (DuckDB's ``error()``; every
    column and the filter depend on it, so neither projection pruning nor a filter on a
    column skips it; only a query that reads no row at all -- ``LIMIT 0`` -- succeeds)."""
    cols = ", ".join(f"CAST(e AS {t}) AS {quote_ident(c)}" for c, t in COLUMNS)
    return f"SELECT {cols}\nFROM (SELECT error({_lit(message)}) AS e) AS unreadable\nWHERE e IS NULL"


def _partition_case(conds: dict[int, list[str]], otherwise: str) -> list[str]:
    """``[CASE "partition" WHEN p THEN <conds of p> ... ELSE otherwise END]`` (``[]`` without conditions)."""
    whens = [f'WHEN {p} THEN {" AND ".join(cs)}' for p, cs in sorted(conds.items()) if cs]
    if not whens:
        return [] if otherwise == "true" else [otherwise]
    return ['CASE "partition" ' + " ".join(whens) + f" ELSE {otherwise} END"]


def _scan(store: ObjectStore, objects: list[ObjectScan], conds: list[str]) -> str:
    files = ", ".join(_lit(_duckdb_path(store, o.key)) for o in objects)
    return f"{_SELECT}\nFROM read_parquet([{files}], hive_partitioning = false)\nWHERE " + "\n  AND ".join(conds)


def topic_sql(url: str, topic: str, storage_options: dict | None = None,
              isolation_level: str = READ_COMMITTED) -> str:
    """The SELECT statement of one topic's committed view, as of the newest catalog commit.

    Run it on a connection made by :func:`connect` for the same root (non-local roots
    need the root's filesystem registered).

    Raises:
        UnknownTopicError: no such topic.
    """
    store = ObjectStore(url, storage_options)
    catalog = Catalog.open(store)
    return view_sql(store, topic_view(store, catalog.state, topic, isolation_level))


def committed_files(url: str | None, topic: str, storage_options: dict | None = None) -> list[str]:
    """Full URLs of the objects holding committed records of ``topic`` (sorted).

    Raises:
        UnknownTopicError: no such topic.
    """
    from .config import default_storage_url

    store = ObjectStore(url or default_storage_url(), storage_options)
    catalog = Catalog.open(store)
    return [o.uri for o in topic_view(store, catalog.state, topic, check_objects=False).objects]


# ------------------------------------------------------------------ connect / refresh
def connect(url: str | None = None, storage_options: dict | None = None,
            connection: duckdb.DuckDBPyConnection | None = None, *, topics: Iterable[str] | None = None,
            isolation_level: str = READ_COMMITTED, prefix: str = "") -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with one temporary view per topic of a storage root.

    Args:
        url: the storage root (``file:///...``, ``s3://bucket/prefix``, ``memory://name``);
            default ``$TXLAKE_STORAGE`` or the local default directory.
        storage_options: fsspec options of the root (e.g. ``endpoint_url``, ``key``, ``secret``).
        connection: add the views to this connection instead of a new in-memory one.
        topics: only these topics (default: all, internal ones included).
        isolation_level: ``read_committed`` (default: up to the LSO, aborted records
            dropped) or ``read_uncommitted`` (up to the high watermark).
        prefix: prepended to every view name (to attach several roots to one connection).

    Returns:
        The connection; a view is named as its topic (quote names with '.' or '-':
        ``SELECT * FROM "my.topic-1"``).

    A topic whose objects cannot be read (a corrupt, missing or unknown-version segment
    object) does not fail the connection: its view raises, when queried, an error naming
    the topic and the object, every other view works, an :class:`UnreadableTopicWarning`
    names the unreadable topics and :func:`unreadable_topics` lists them. So a damaged
    internal topic (``__consumer_offsets``, ``__transaction_state``) never takes the
    user's topics down; :func:`refresh` tries the unreadable topics again.

    Raises:
        ValueError: a view name is taken by another root attached to the connection, an
            unknown isolation level, or an fsspec protocol already registered on the
            connection with other storage options.
        StorageError, CorruptObjectError, UnsupportedFormatVersionError: the catalog
            cannot be read (the message names the object).
    """
    from .config import default_storage_url

    if isolation_level not in ("read_committed", "read_uncommitted"):
        raise ValueError(f"isolation level must be read_committed or read_uncommitted, got {isolation_level!r}")
    store = ObjectStore(url or default_storage_url(), storage_options)
    con = connection if connection is not None else duckdb.connect()
    cs = _state(con, create=True)
    with cs.lock:
        _register_filesystem(con, cs, store)
        root = _Root(store, Catalog.open(store), isolation_level,
                     frozenset(topics) if topics is not None else None, prefix)
        taken = {name.lower(): r for r in cs.roots for name, _ in r.views.values()}
        for name in _wanted_topics(root):
            other = taken.get((prefix + name).lower())
            if other is not None:
                raise ValueError(f"view {prefix + name!r} already holds topic {name!r} of {other.store.url} on this "
                                 "connection; pass prefix= to name this root's views apart")
        cs.roots.append(root)
        _sync_views(con, cs, root)
    _warn_unreadable(root)
    return con


def refresh(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Bring the connection's views up to the newest catalog commit of each attached root.

    New topics get a view, deleted topics lose theirs, changed topics are redefined.

    Topics that could not be read are tried again (their objects may have been replaced);
    those still unreadable are named by an :class:`UnreadableTopicWarning`.

    Returns:
        The names of the views created, replaced or dropped (empty if nothing changed).

    Raises:
        ValueError: ``con`` was not made by :func:`connect`.
    """
    cs = _state(con)
    if cs is None:
        raise ValueError("this DuckDB connection has no txlake views; make it with txlake.duckdb.connect()")
    changed: list[str] = []
    with cs.lock:
        for root in cs.roots:
            if root.catalog.refresh() or root.unreadable:
                changed += _sync_views(con, cs, root)
    for root in cs.roots:
        _warn_unreadable(root)
    return changed


def unreadable_topics(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """The views of ``con`` whose topic cannot be read, as of the last :func:`connect` /
    :func:`refresh`: view name -> the error a query of it raises (it names the topic and the
    object). Empty when every topic is readable or ``con`` has no txlake views."""
    cs = _state(con)
    out: dict[str, str] = {}
    for root in (cs.roots if cs is not None else ()):
        for topic, reason in root.unreadable.items():
            if topic in root.views:
                out[root.views[topic][0]] = _unreadable_message(topic, reason)
    return out


def _unreadable_message(topic: str, reason: str) -> str:
    return f"txlake: topic {topic!r} cannot be read: {reason}"


def _warn_unreadable(root: _Root) -> None:
    if root.unreadable:
        details = "; ".join(f"{t!r}: {root.unreadable[t]}" for t in sorted(root.unreadable))
        warnings.warn(f"txlake: topics of {root.store.url} that cannot be read (querying their views raises this "
                      f"error, the other views work): {details}", UnreadableTopicWarning, stacklevel=3)


def topic_relation(con: duckdb.DuckDBPyConnection, topic: str) -> duckdb.DuckDBPyRelation:
    """The committed view of ``topic`` on a connection made by :func:`connect`, as a relation.

    Raises:
        KeyError: no attached root has the topic.
    """
    cs = _state(con)
    for root in (cs.roots if cs is not None else ()):
        entry = root.views.get(topic)
        if entry is not None:
            return con.sql(f"SELECT * FROM {quote_ident(entry[0])}")
    raise KeyError(f"no txlake view of topic {topic!r} on this connection")


def _wanted_topics(root: _Root) -> list[str]:
    names = sorted(root.catalog.state.topics)
    if root.topics is not None:
        names = [n for n in names if n in root.topics]
    return names


def _sync_views(con: duckdb.DuckDBPyConnection, cs: _ConnState, root: _Root) -> list[str]:
    errors: dict[str, Exception] = {}
    with root.catalog.lock:
        state = root.catalog.state
        names = _wanted_topics(root)
        # per topic: an unreadable object makes its topic's view an error, never the connection
        views = topic_views(root.store, state, names, root.isolation_level, errors=errors)
    changed = []
    for topic in [t for t in root.views if t not in views and t not in errors]:
        name, _ = root.views.pop(topic)
        con.execute(f"DROP VIEW IF EXISTS {quote_ident(name)}")
        changed.append(name)
    root.unreadable = {t: f"{type(exc).__name__}: {exc}" for t, exc in errors.items()}
    used = {name.lower() for r in cs.roots for name, _ in r.views.values()}
    for topic in names:
        if topic in errors:
            sql = unreadable_view_sql(_unreadable_message(topic, root.unreadable[topic]))
        else:
            sql = view_sql(root.store, views[topic])
        old = root.views.get(topic)
        if old is not None and old[1] == sql:
            continue
        name = root.prefix + topic
        if old is None and name.lower() in used:
            warnings.warn(f"topic {topic!r} has no view: DuckDB names are case-insensitive and {name!r} is taken; "
                          "use txlake.duckdb.topic_sql() to query it", stacklevel=3)
            continue
        try:
            con.execute(f"CREATE OR REPLACE TEMP VIEW {quote_ident(name)} AS\n{sql}")
        except duckdb.Error as exc:
            if topic in errors:
                raise   # the error view itself: nothing of the topic's objects is involved
            # DuckDB's text names no object (an object replaced since its footer was cached, say):
            # name the one at fault, or the topic, and isolate the topic like any unreadable one
            try:
                verify_objects(root.store, [o.key for o in views[topic].objects])
                cause: Exception = type(exc)(f"view of topic {topic!r} of {root.store.url}: {exc}")
            except (TxlakeError, ObjectNotFoundError, StorageError) as bad:
                bad.__context__ = exc
                cause = bad
            errors[topic] = cause
            root.unreadable[topic] = f"{type(cause).__name__}: {cause}"
            sql = unreadable_view_sql(_unreadable_message(topic, root.unreadable[topic]))
            con.execute(f"CREATE OR REPLACE TEMP VIEW {quote_ident(name)} AS\n{sql}")
        root.views[topic] = (name, sql)
        used.add(name.lower())
        changed.append(name)
    return changed


# ------------------------------------------------------------------ rows as JSON
_JSON_LOCK = threading.Lock()
_JSON_CON: duckdb.DuckDBPyConnection | None = None


def json_values(rows) -> "pa.StringArray":
    """Each row of an Arrow table or record batch as one JSON object (text), in row order.

    Serialised by DuckDB's ``to_json`` (vectorised): numbers stay numbers, nulls are
    ``null``, timestamps ISO-8601 text, nested types nested JSON. This is what the CLI's
    ``txlake produce`` and ``txlake demo`` use as record values.

    Args:
        rows: a ``pyarrow.Table`` or ``pyarrow.RecordBatch`` with at least one column.

    Returns:
        A ``pyarrow.StringArray`` of ``rows.num_rows`` JSON objects.
    """
    import pyarrow as pa

    global _JSON_CON
    if rows.num_columns == 0:
        raise ValueError("cannot serialise rows without columns")
    if rows.num_rows == 0:
        return pa.array([], pa.string())
    with _JSON_LOCK:
        if _JSON_CON is None:
            _JSON_CON = duckdb.connect()
        con = _JSON_CON
        __txlake_rows = rows  # noqa: F841 - read by DuckDB's replacement scan below
        table = con.sql('SELECT CAST(to_json(r) AS VARCHAR) AS v FROM __txlake_rows AS r').to_arrow_table()
    col = table.column(0)
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
