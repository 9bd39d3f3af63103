"""Publishing each topic's committed view as a zero-copy Delta Lake table (issue 19, docs/tables.md).

The table of topic ``T`` lives at ``<storage root>/tables/T``; only its ``_delta_log/`` is
written there. Its data files are the log's own segment and flush objects, named by absolute
URI; a deletion vector on each hides every row of the object that a read_committed Consumer
would not return (the committed view of :mod:`txlake.committed_view`, exactly):

* rows of other topics, and of row groups no segment of ``T`` names any more (shared flush
  objects, a partition already compacted into another object);
* control records (transaction markers);
* records of aborted transactions (the aborted-transaction index: producer id, first offset,
  ABORT marker offset -- Kafka's ``AbortedTxn``);
* records at or beyond the partition's last stable offset (LSO) and below its log start offset.

A publication diffs the wanted ``{object -> deletion vector}`` against the table's current
version (read back from its own ``_delta_log``, so a restarted process continues), and commits
the next version with create-if-absent on ``_delta_log/<version:020d>.json`` -- Delta's own
commit protocol for object stores with conditional writes. An object whose visibility inputs
are unchanged (its ``add`` carries their fingerprint as the tag ``txlake.fingerprint``) is not
read again; a changed one is replaced (``remove`` + ``add``) in the same version. Nothing to
change: no commit. Deletion vectors of up to :data:`INLINE_DV_MAX_BYTES` are inline in the
commit (one PUT per publication); bigger ones go to one deletion-vector file per version.
Each version carries a ``txn`` per partition (``appId`` ``txlake:<topic id>:<partition>``,
``version`` = the published LSO) and a ``commitInfo`` naming the catalog version and the
per-partition LSOs it reflects.

A publication writes exactly one object per version (plus a deletion-vector file in the rare
case above): checkpoints are table maintenance, not part of publishing, as in delta-rs
(``create_checkpoint`` is its own operation). Each compaction round (:func:`checkpoint_tables`)
writes a classic Parquet checkpoint (``_delta_log/<version:020d>.checkpoint.parquet``: protocol,
metaData, txns, live adds, tombstones younger than the deleted-file retention) and
``_delta_log/_last_checkpoint`` for every table at least :data:`CHECKPOINT_INTERVAL` versions past
its newest checkpoint, so a reader (and this publisher after a restart) replays at most the
versions of one compaction interval plus 9. A checkpoint is an optimisation: one that fails to be
written or read leaves the commits to replay.

A deleted topic's table is first emptied (a version removing every file), then removed whole
(:func:`drop_deleted_tables`, by the compaction round) once that version is older than
``storage.file.delete.delay.ms``, the grace the object cleaner gives the objects it names. A topic
re-created under the name of a table that still exists gets a fresh table: its first publication
removes the old one and commits version 0.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64

from txlake.catalog.catalog import COMMIT_PUT_ATTEMPTS, Catalog
from txlake.catalog.state import CatalogState, PartitionState, SegmentInfo, TopicState
from txlake.catalog.storage import ObjectStore, put_if_absent_confirmed
from txlake.catalog.topic_names import is_internal
from txlake.formats import delta_log as dl
from txlake.formats.records import RECORD_SCHEMA
from txlake.formats.versioning import open_parquet

from .segment_merge import RoundWorkers

log = logging.getLogger(__name__)

TABLES_PREFIX = "tables/"
#: a deletion vector of at most this many serialized bytes is stored inline in the commit
INLINE_DV_MAX_BYTES = 4096
#: versions between two checkpoints (Delta's default ``delta.checkpointInterval``)
CHECKPOINT_INTERVAL = 10
ENGINE_INFO = "txlake"
#: attempts at a version when another publisher keeps winning the race for it
_COMMIT_ATTEMPTS = 5
_FINGERPRINT_TAG = "txlake.fingerprint"
_VIEW_COLUMNS = ["offset", "is_control", "producer_id"]
#: objects read at once by a publication (footer and view columns of new or changed objects)
_READ_THREADS = 16
#: objects whose size and row-group row counts a publisher keeps (LRU)
_FOOTER_CACHE_SIZE = 100_000
#: fingerprints of objects this process found to hold no visible row of the topic (bounded)
_EMPTY_CACHE_SIZE = 65_536


_TABLE_LOCKS: dict[str, threading.RLock] = {}
_TABLE_LOCKS_GUARD = threading.Lock()


def _table_lock(store: ObjectStore, topic: str) -> threading.RLock:
    """The process-wide lock of one table: a publication of it and its removal never overlap
    (the writer's publication thread and its compaction round work on the same tables)."""
    key = store.uri(table_key(topic))
    with _TABLE_LOCKS_GUARD:
        return _TABLE_LOCKS.setdefault(key, threading.RLock())


def table_key(topic: str) -> str:
    """Key of ``topic``'s table root under the storage root: ``tables/<topic>``."""
    return TABLES_PREFIX + topic


def txn_app_id(topic_id: str, partition: int) -> str:
    """The ``txn`` ``appId`` of one partition of a topic (``txlake:<topic id>:<partition>``)."""
    return f"txlake:{topic_id}:{partition}"


def ms_duration(ms: int) -> str:
    """A Delta interval table property (``delta.logRetentionDuration`` ...) of ``ms`` milliseconds,
    in whole seconds (rounded up), as ``interval <n> seconds``."""
    return f"interval {max(1, -(-ms // 1000))} seconds"


#: milliseconds per unit of a Delta interval property (``interval <n> <unit>``, CalendarInterval)
_INTERVAL_UNITS_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
                      "week": 604_800_000}


def duration_ms(value: str | None) -> int | None:
    """The milliseconds of a Delta interval table property (``interval 3600 seconds``, ``interval 7
    days``: one number and a unit, as :func:`ms_duration` writes and Delta's defaults read); None for
    None or any other form (the caller then keeps what the property would let go)."""
    match = re.fullmatch(r"\s*interval\s+(\d+)\s+([a-z]+?)s?\s*", (value or "").lower())
    if match is None or match.group(2) not in _INTERVAL_UNITS_MS:
        return None
    return int(match.group(1)) * _INTERVAL_UNITS_MS[match.group(2)]


@dataclass(frozen=True)
class PublishResult:
    """What one publication of one topic did.

    Attributes:
        topic / uri: the topic and its table's root URI.
        version: the table's version after the publication (-1: no table, nothing to publish).
        committed: True when this publication made ``version``.
        added / removed: logical files (objects) added and removed by it.
        objects_put: objects written: the commit, and a deletion-vector file when a vector is too
            big to be inline (checkpoints are the compaction round's, :func:`checkpoint_tables`).
        catalog_version: the catalog version published from.
        lso: the per-partition LSO the version reflects.
    """

    topic: str
    uri: str
    version: int
    committed: bool
    added: int = 0
    removed: int = 0
    objects_put: int = 0
    catalog_version: int = -1
    lso: dict[int, int] = field(default_factory=dict)


@dataclass
class _Wanted:
    """One object of the table as the catalog wants it."""

    key: str
    fingerprint: str
    # filled when the object is (re)computed
    size: int = 0
    mtime_ms: int = 0
    num_records: int = 0
    dv: bytes | None = None
    cardinality: int = 0


class TablePublisher:
    """Publishes topics of one storage root as Delta tables (see the module docstring).

    Args:
        store: the storage root.
        configuration: extra Delta table properties of every table (``delta.logRetentionDuration``,
            ``delta.deletedFileRetentionDuration``; see :func:`table_configuration`).
        inline_dv_max_bytes: deletion vectors bigger than this go to a deletion-vector file.

    Thread-safe: one publication runs at a time per publisher. Caches (per process): each
    object's size, modification time and row-group row counts (objects are immutable; an object
    a publication removes from the table is forgotten), each table's last snapshot, and the
    fingerprints of objects found to hold nothing visible. A cached snapshot keeps its tombstones
    (``remove`` s) only as long as ``delta.deletedFileRetentionDuration`` of ``configuration``
    (all of them without it): nothing this publisher does reads an older one (checkpoints and the
    object cleaner's guard read the log afresh), and a long-lived writer publishing every few
    seconds would otherwise hold every file its tables ever removed (issue 14: memory follows
    the live state, not the history).
    """

    def __init__(self, store: ObjectStore, configuration: dict[str, str] | None = None,
                 inline_dv_max_bytes: int = INLINE_DV_MAX_BYTES):
        self.store = store
        self.configuration = dict(configuration or {})
        self.inline_dv_max_bytes = inline_dv_max_bytes
        self._lock = threading.Lock()
        self._footer_lock = threading.Lock()  # the footer cache is filled by several reading threads
        self._footers: OrderedDict[str, tuple[int, int, list[int]]] = OrderedDict()  # LRU
        self._snapshots: dict[str, dl.TableSnapshot] = {}
        #: ms a cached snapshot keeps a tombstone after its deletionTimestamp (None: for ever)
        self.tombstone_retention_ms = duration_ms(self.configuration.get("delta.deletedFileRetentionDuration"))
        self._empty: OrderedDict[str, None] = OrderedDict()
        #: test hook: called with a step name before that write ("dv_file", "commit") and after the
        #: commit ("committed")
        self.before_write: Callable[[str], None] | None = None

    # ------------------------------------------------------------------ reading the table
    def table_uri(self, topic: str) -> str:
        """URI of ``topic``'s table root."""
        return self.store.uri(table_key(topic))

    def snapshot(self, topic: str) -> dl.TableSnapshot:
        """The table's newest version (a copy), read from its ``_delta_log`` (from the last
        checkpoint when there is one, then commit by commit until the next is missing).

        Raises:
            DeltaLogError: a commit or checkpoint that cannot be read (names it).
            StorageError: the backend failed.
        """
        with self._lock:
            return self._refresh(topic).copy()

    def _refresh(self, topic: str) -> dl.TableSnapshot:
        root = table_key(topic)
        snap = self._snapshots.get(topic)
        if snap is None:
            snap = self._open(root)
        while True:
            key = f"{root}/{dl.commit_key(snap.version + 1)}"
            data = self.store.get_or_none(key)
            if data is None:
                break
            snap.apply(snap.version + 1, dl.decode_commit(data, self.store.uri(key)))
        self._snapshots[topic] = snap
        return snap

    def _open(self, root: str) -> dl.TableSnapshot:
        """The snapshot to replay the newest commits onto: the checkpoint ``_last_checkpoint``
        names; without a readable one and without commit 0, the newest readable checkpoint a
        listing of the log finds (``_last_checkpoint`` is optional in Delta); an empty table
        when the log is empty.

        Raises:
            DeltaLogError: the log has entries but neither commit 0 nor a readable checkpoint
                (its history was cleaned up and its checkpoint lost): never start it over.
        """
        last = self.store.get_or_none(f"{root}/{dl.LAST_CHECKPOINT}")
        if last is not None:
            try:
                snap = self._load_checkpoint(root, int(json.loads(last)["version"]))
            except Exception as exc:  # an unreadable checkpoint: the commits may still be there
                log.warning("table %s: checkpoint unreadable (%s); replaying its commits", self.store.uri(root), exc)
            else:
                return snap
        if self.store.exists(f"{root}/{dl.commit_key(0)}"):
            return dl.TableSnapshot()
        versions = _log_versions([i.key for i in self.store.list(f"{root}/{dl.LOG_DIR}/")], root)
        if not versions["json"] and not versions["checkpoint.parquet"]:
            return dl.TableSnapshot()
        for version in sorted(versions["checkpoint.parquet"], reverse=True):
            try:
                return self._load_checkpoint(root, version)
            except Exception as exc:  # noqa: BLE001 - an older checkpoint may do
                log.warning("table %s: checkpoint %d unreadable: %s", self.store.uri(root), version, exc)
        raise dl.DeltaLogError(f"{self.store.uri(root)}: its newest checkpoint is unreadable and the commits it "
                               "covers were cleaned up; restore the checkpoint")

    def _load_checkpoint(self, root: str, version: int) -> dl.TableSnapshot:
        key = f"{root}/{dl.checkpoint_key(version)}"
        with self.store.open_input(key) as f:
            snap = dl.read_checkpoint(pq.read_table(f), version)
        commit = self.store.get_or_none(f"{root}/{dl.commit_key(version)}")  # its commitInfo: the freshness
        for action in dl.decode_commit(commit, key) if commit is not None else ():
            if "commitInfo" in action:
                snap.commit_info = action["commitInfo"]
        return snap

    # ------------------------------------------------------------------ what the catalog wants
    def _footer(self, key: str) -> tuple[int, int, list[int]]:
        """(size bytes, modification ms, rows per row group) of an object (cached: immutable)."""
        with self._footer_lock:
            got = self._footers.get(key)
            if got is not None:
                self._footers.move_to_end(key)
        if got is None:
            info = self.store.fs.info(self.store.fs_path(key))
            mtime = info.get("mtime") or info.get("LastModified") or info.get("created") or 0
            mtime_ms = int(mtime.timestamp() * 1000) if hasattr(mtime, "timestamp") else int(float(mtime) * 1000)
            with self.store.open_input(key) as f:
                md = open_parquet(f, self.store.uri(key)).metadata
                rows = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
            got = (int(info["size"]), mtime_ms, rows)
            with self._footer_lock:
                self._footers[key] = got
                if len(self._footers) > _FOOTER_CACHE_SIZE:
                    self._footers.popitem(last=False)
        return got

    @staticmethod
    def _visible_ranges(t: TopicState) -> dict[str, list[tuple[SegmentInfo, PartitionState, int, int]]]:
        """Per object: the topic's segments in it with the offsets ``lo..hi`` read_committed may
        see (log start offset up to the LSO); objects with none are left out."""
        out: dict[str, list[tuple[SegmentInfo, PartitionState, int, int]]] = {}
        for p in t.partitions:
            for s in p.segments:
                lo, hi = max(s.base_offset, p.log_start_offset), min(s.last_offset, p.last_stable_offset - 1)
                if lo <= hi:
                    out.setdefault(s.path, []).append((s, p, lo, hi))
        return out

    @staticmethod
    def _fingerprint(topic_id: str, parts: list[tuple[SegmentInfo, PartitionState, int, int]]) -> str:
        items = []
        for s, p, lo, hi in sorted(parts, key=lambda x: (x[0].partition, x[0].base_offset)):
            aborted = [(a.producer_id, a.first_offset, a.last_offset) for a in p.aborted_transactions
                       if a.last_offset >= lo and a.first_offset <= hi]
            items.append([s.partition, s.base_offset, s.last_offset, s.row_group_start, s.row_group_count,
                          lo, hi, aborted])
        return hashlib.sha1(json.dumps([1, topic_id, items]).encode()).hexdigest()

    def _compute(self, want: _Wanted, parts: list[tuple[SegmentInfo, PartitionState, int, int]]) -> None:
        """Fill ``want`` with the object's size and the deletion vector hiding every row but the
        committed records of the topic's segments in it (reads their view columns once)."""
        size, mtime_ms, rows = self._footer(want.key)
        starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        total = int(starts[-1])
        kept = BitMap64()
        with self.store.open_input(want.key) as f:
            pf = open_parquet(f, self.store.uri(want.key))
            for s, p, lo, hi in parts:
                if s.row_group_start + s.row_group_count > len(rows):
                    from txlake.formats.errors import CorruptObjectError

                    raise CorruptObjectError(self.store.uri(want.key), f"has {len(rows)} row groups, the catalog "
                                             f"names {s.row_groups}")
                cols = pf.read_row_groups(s.row_groups, columns=_VIEW_COLUMNS)
                off = cols.column("offset")
                mask = pc.and_(pc.and_(pc.greater_equal(off, lo), pc.less_equal(off, hi)),
                               pc.invert(cols.column("is_control")))
                pid = cols.column("producer_id")
                for a in p.aborted_transactions:
                    if a.last_offset >= lo and a.first_offset <= hi:
                        mask = pc.and_(mask, pc.invert(pc.and_(
                            pc.equal(pid, a.producer_id),
                            pc.and_(pc.greater_equal(off, a.first_offset), pc.less_equal(off, a.last_offset)))))
                flags = mask.to_numpy(zero_copy_only=False).astype(np.int8)
                if not flags.any():
                    continue
                base = int(starts[s.row_group_start])
                # runs of kept rows: +1 where a run starts, -1 where it ends
                edges = np.diff(np.concatenate([[0], flags, [0]]))
                for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
                    kept.add_range(base + int(a), base + int(b))
        want.size, want.mtime_ms, want.num_records = size, mtime_ms, total
        want.cardinality = total - len(kept)
        if kept:
            deleted = BitMap64()
            deleted.add_range(0, total)
            deleted -= kept
            want.dv = dl.serialize_dv(deleted) if want.cardinality else None

    # ------------------------------------------------------------------ publishing
    def publish(self, state: CatalogState, topic: str, now_ms: int | None = None) -> PublishResult:
        """Publish ``topic`` as of catalog ``state``: commit the next table version when the
        committed view (objects, deletion vectors, per-partition LSO) differs from the table's
        newest version; a topic that no longer exists gets a version removing every file.

        Args:
            state: a catalog state the caller does not change meanwhile (a snapshot).
            now_ms: the commit's time (ms since the epoch; wall clock when None).

        Returns:
            a :class:`PublishResult`.

        Raises:
            StorageError / ObjectNotFoundError: the backend failed, or an object the catalog names
                is gone (nothing is committed; the previous version stays readable).
            CorruptObjectError: an object the catalog names is not what it says.
            DeltaLogError: the table's log is unreadable (names the entry).
        """
        with self._lock, _table_lock(self.store, topic):
            for _ in range(_COMMIT_ATTEMPTS):
                result = self._publish_once(state, topic, int(time.time() * 1000) if now_ms is None else now_ms)
                if result is not None:
                    return result
                self._snapshots.pop(topic, None)  # another publisher won this version: read it
            raise RuntimeError(f"table {self.table_uri(topic)}: {_COMMIT_ATTEMPTS} attempts at a version "
                               "lost to other publishers")

    def _publish_once(self, state: CatalogState, topic: str, now_ms: int) -> PublishResult | None:
        snap = self._refresh(topic)
        uri = self.table_uri(topic)
        t = state.topics.get(topic)
        if t is not None and snap.metadata is not None and snap.metadata["configuration"].get("txlake.topicId") \
                != t.topic_id:
            self._snapshots.pop(topic, None)  # this process's view may be older than the table
            snap = self._refresh(topic)
            if snap.metadata is not None and snap.metadata["configuration"].get("txlake.topicId") != t.topic_id:
                # the table of a deleted topic of the same name: the new topic gets a fresh table
                log.info("table %s belongs to an earlier topic %s (id %s): removing it for topic id %s", uri, topic,
                         snap.metadata["configuration"].get("txlake.topicId"), t.topic_id)
                drop_table(self.store, topic)
                snap = self._snapshots[topic] = dl.TableSnapshot()
        actions: list[dict[str, Any]] = []
        lso: dict[int, int] = {}
        if t is None:
            if snap.version < 0 or not snap.files:
                return PublishResult(topic, uri, snap.version, False, catalog_version=state.version)
            removes = [dl.remove_action(add, now_ms) for add in snap.files.values()]
            actions += removes
            added = []
            dv_files: list[tuple[uuid.UUID, bytes]] = []
        else:
            lso = {p.partition: p.last_stable_offset for p in t.partitions}
            if snap.metadata is None or snap.metadata.get("configuration", {}).get("txlake.topicId") != t.topic_id \
                    or any(snap.metadata["configuration"].get(k) != v for k, v in self.configuration.items()):
                if snap.protocol is None:
                    actions.append(dl.protocol_action())
                config = {"delta.enableDeletionVectors": "true", "delta.checkpointInterval": str(CHECKPOINT_INTERVAL),
                          **self.configuration, "txlake.topic": topic, "txlake.topicId": t.topic_id}
                table_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{uri}#{t.topic_id}"))
                actions.append(dl.metadata_action(table_id, topic, RECORD_SCHEMA, config, now_ms,
                                                  f"txlake topic {topic}: its committed records (read_committed)"))
            added, removes, dv_files = self._file_actions(snap, t, now_ms)
            actions += removes + added
            for p, offset in sorted(lso.items()):
                app = txn_app_id(t.topic_id, p)
                if snap.txns.get(app) != offset:
                    actions.append(dl.txn_action(app, offset, now_ms))
        if not actions:
            return PublishResult(topic, uri, snap.version, False, catalog_version=state.version, lso=lso)
        params = {"catalogVersion": str(state.version), "topic": topic,
                  "lastStableOffsets": json.dumps({str(k): v for k, v in sorted(lso.items())})}
        actions.append(dl.commit_info_action(now_ms, "txlake.publish", params, ENGINE_INFO))
        version = snap.version + 1
        puts = 0
        for dv_uuid, body in dv_files:  # before the commit that names them
            self._hook("dv_file")
            self.store.put(f"{table_key(topic)}/{dl.dv_file_name(dv_uuid)}", body)
            puts += 1
        self._hook("commit")
        # a PUT of unknown outcome (a timeout after the store applied it) is read back: our bytes
        # there are our commit (issue 20); another publisher's bytes are a race lost
        if not put_if_absent_confirmed(self.store, f"{table_key(topic)}/{dl.commit_key(version)}",
                                       dl.encode_commit(actions), "Delta commit", COMMIT_PUT_ATTEMPTS):
            return None
        puts += 1
        self._hook("committed")
        snap.apply(version, actions)
        self._forget(snap, removes, now_ms)
        return PublishResult(topic, uri, version, True, len(added), len(removes), puts, state.version, lso)

    def _forget(self, snap: dl.TableSnapshot, removes: list[dict[str, Any]], now_ms: int) -> None:
        """Drop what the cached ``snap`` no longer needs after a version with ``removes``: the
        footers of the objects it removed for good, and tombstones older than
        :attr:`tombstone_retention_ms` (the same cut as a checkpoint's, :func:`write_checkpoint`)."""
        prefix = self.store.url + "/"
        gone = [r["remove"]["path"] for r in removes if r["remove"]["path"] not in snap.files]
        with self._footer_lock:
            for path in gone:
                if path.startswith(prefix):
                    self._footers.pop(path[len(prefix):], None)
        if self.tombstone_retention_ms is not None:
            cutoff = now_ms - self.tombstone_retention_ms
            for key in [k for k, r in snap.tombstones.items() if (r.get("deletionTimestamp") or 0) <= cutoff]:
                del snap.tombstones[key]

    def _hook(self, step: str) -> None:
        if self.before_write is not None:
            self.before_write(step)

    def _file_actions(self, snap: dl.TableSnapshot, t: TopicState, now_ms: int):
        """``(adds, removes, dv files)`` turning the table's files into the ones ``t`` wants."""
        wanted: dict[str, _Wanted] = {}
        recompute: list[tuple[_Wanted, list]] = []
        for key, parts in self._visible_ranges(t).items():
            want = _Wanted(key, self._fingerprint(t.topic_id, parts))
            path = self.store.uri(key)
            current = snap.files.get(path)
            if current is not None and (current.get("tags") or {}).get(_FINGERPRINT_TAG) == want.fingerprint:
                wanted[path] = want  # unchanged: kept as it is
                continue
            if want.fingerprint in self._empty:
                continue
            recompute.append((want, parts))
        if len(recompute) > 1:  # object-store latency bound: read the objects side by side
            # on workers that give back what they decoded before they end (segment_merge.RoundWorkers:
            # a thread that ends without it leaves its pages in an abandoned heap -- every 5 s here)
            with RoundWorkers(read_threads=min(_READ_THREADS, len(recompute))) as workers:
                list(workers.read.map(lambda item: self._compute(*item), recompute))
        else:
            for want, parts in recompute:
                self._compute(want, parts)
        for want, parts in recompute:
            if want.cardinality == want.num_records:  # nothing of the topic visible in it
                self._empty[want.fingerprint] = None
                if len(self._empty) > _EMPTY_CACHE_SIZE:
                    self._empty.popitem(last=False)
                continue
            wanted[self.store.uri(want.key)] = want
        adds, removes = [], []
        for path, add in snap.files.items():
            if path not in wanted:
                removes.append(dl.remove_action(add, now_ms))
        big: list[tuple[_Wanted, bytes]] = []
        for path, want in sorted(wanted.items()):
            if not want.num_records:
                continue  # unchanged
            if want.dv is not None and len(want.dv) > self.inline_dv_max_bytes:
                big.append((want, want.dv))
                continue
            dv = dl.inline_descriptor(want.dv, want.cardinality) if want.dv is not None else None
            current = snap.files.get(path)
            # the same (path, deletion vector) again only updates its tags; another one replaces it
            if current is not None and dl.dv_unique_id(current.get("deletionVector")) != dl.dv_unique_id(dv):
                removes.append(dl.remove_action(current, now_ms))
            adds.append(dl.add_action(path, want.size, want.mtime_ms, want.num_records, dv,
                                      {_FINGERPRINT_TAG: want.fingerprint}))
        dv_files = []
        if big:
            dv_uuid = uuid.uuid4()
            body, offsets = dl.dv_file([dv for _, dv in big])
            dv_files.append((dv_uuid, body))
            for (want, dv), offset in zip(big, offsets):
                path = self.store.uri(want.key)
                if path in snap.files:
                    removes.append(dl.remove_action(snap.files[path], now_ms))
                adds.append(dl.add_action(path, want.size, want.mtime_ms, want.num_records,
                                          dl.file_descriptor(dv_uuid, offset, len(dv), want.cardinality),
                                          {_FINGERPRINT_TAG: want.fingerprint}))
        return adds, removes, dv_files

    # ------------------------------------------------------------------ which objects tables name
    def named_objects(self, topics: list[str], now_ms: int, retention_ms: int) -> set[str]:
        """Object keys any of ``topics``' tables still names: in its newest version, or removed
        less than ``retention_ms`` before ``now_ms`` (a reader may still open a version naming
        them within the table's retention)."""
        prefix = self.store.url + "/"
        out: set[str] = set()
        with self._lock:
            for topic in topics:
                snap = self._refresh(topic)
                paths = list(snap.files) + [p for (p, _), r in snap.tombstones.items()
                                            if (r.get("deletionTimestamp") or 0) + retention_ms > now_ms]
                out.update(p[len(prefix):] for p in paths if p.startswith(prefix))
        return out


def clean_dv_files(store: ObjectStore, now_ms: int, retention_ms: int) -> list[str]:
    """Delete the deletion-vector files no table version within ``retention_ms`` names: those of
    a publication that died (or lost its race) before its commit, and those only versions removed
    longer than ``retention_ms`` ago named. A file younger than ``retention_ms`` (by its
    last-modified time) is never touched: its publication may still be committing. One listing
    of ``tables/``; returns the deleted keys.

    Raises:
        StorageError / DeltaLogError: the backend failed or a table's log is unreadable.
    """
    candidates: dict[str, list[str]] = {}
    for info in store.list(TABLES_PREFIX):
        topic, _, name = info.key[len(TABLES_PREFIX):].rpartition("/")
        if name.startswith("deletion_vector_") and name.endswith(".bin") and "/" not in topic \
                and info.mtime_ms + retention_ms <= now_ms:
            candidates.setdefault(topic, []).append(info.key)
    if not candidates:
        return []
    publisher = TablePublisher(store)
    deleted = []
    for topic, keys in sorted(candidates.items()):
        snap = publisher.snapshot(topic)
        bodies = list(snap.files.values()) + [r for r in snap.tombstones.values()
                                              if (r.get("deletionTimestamp") or 0) + retention_ms > now_ms]
        named = {f"{table_key(topic)}/{dl.dv_file_key(b['deletionVector'])}" for b in bodies
                 if (b.get("deletionVector") or {}).get("storageType") == "u"}
        for key in sorted(set(keys) - named):
            store.delete(key)
            deleted.append(key)
    return deleted


def _log_versions(keys: list[str], root: str) -> dict[str, dict[int, str]]:
    """The commits (``"json"``) and checkpoints (``"checkpoint.parquet"``) among ``keys`` of the
    table at ``root``: version -> key."""
    out: dict[str, dict[int, str]] = {"json": {}, "checkpoint.parquet": {}}
    prefix = f"{root}/{dl.LOG_DIR}/"
    for key in keys:
        name = key[len(prefix):] if key.startswith(prefix) else ""
        number, _, kind = name.partition(".")
        if number.isdigit() and kind in out:
            out[kind][int(number)] = key
    return out


def _tables(store: ObjectStore) -> dict[str, list]:
    """Every object under ``tables/`` by the topic of its table (one listing): ``ObjectInfo`` s."""
    out: dict[str, list] = {}
    for info in store.list(TABLES_PREFIX):
        rest = info.key[len(TABLES_PREFIX):]
        topic = rest.split(f"/{dl.LOG_DIR}/")[0] if f"/{dl.LOG_DIR}/" in rest else rest.rpartition("/")[0]
        if topic:
            out.setdefault(topic, []).append(info)
    return out


def clean_table_logs(store: ObjectStore, now_ms: int, retention_ms: int) -> list[str]:
    """Delta's log cleanup (``delta.logRetentionDuration``): per table, the commits and checkpoints
    below the newest readable checkpoint that every version younger than ``retention_ms`` (by
    its commit's last-modified time) can still be rebuilt from. The newest version, its
    checkpoint and every commit after that checkpoint always stay. One listing of ``tables/``;
    returns the deleted keys.

    Raises:
        StorageError: the backend failed.
    """
    deleted = []
    for topic, infos in sorted(_tables(store).items()):
        root = table_key(topic)
        mtimes = {i.key: i.mtime_ms for i in infos}
        versions = _log_versions(list(mtimes), root)
        commits, checkpoints = versions["json"], versions["checkpoint.parquet"]
        if not commits:
            continue
        young = [v for v, key in commits.items() if mtimes[key] + retention_ms > now_ms]
        boundary = min(young) if young else max(commits)
        for cp in sorted((c for c in checkpoints if c <= boundary), reverse=True):
            try:  # only a checkpoint that reads may replace the commits before it
                with store.open_input(checkpoints[cp]) as f:
                    pq.ParquetFile(f).metadata
            except Exception as exc:  # noqa: BLE001 - an older checkpoint may do
                log.warning("table %s: checkpoint %d unreadable: %s", store.uri(root), cp, exc)
                continue
            keys = [commits[v] for v in sorted(commits) if v < cp]
            keys += [checkpoints[c] for c in sorted(checkpoints) if c < cp]
            for key in keys:
                store.delete(key)
            deleted += keys
            break
    return deleted


def write_checkpoint(store: ObjectStore, topic: str, snap: dl.TableSnapshot, tombstones_after_ms: int) -> list[str]:
    """Write the classic Parquet checkpoint of ``snap`` (version ``snap.version``), then
    ``_delta_log/_last_checkpoint`` naming it (PROTOCOL.md "Checkpoints", "Last Checkpoint
    File"); the checkpoint keeps the ``remove`` s made after ``tombstones_after_ms`` (ms since the
    epoch). Returns the two keys written.

    Raises:
        StorageError: the backend failed (a checkpoint without ``_last_checkpoint`` is still
            found by a listing reader; the commits stay the truth).
    """
    root = table_key(topic)
    data, size = dl.encode_checkpoint(snap, tombstones_after_ms)
    keys = [f"{root}/{dl.checkpoint_key(snap.version)}", f"{root}/{dl.LAST_CHECKPOINT}"]
    store.put(keys[0], data)
    store.put(keys[1], json.dumps({"version": snap.version, "size": size}).encode())
    return keys


def checkpoint_tables(store: ObjectStore, now_ms: int, tombstone_retention_ms: int,
                      interval: int = CHECKPOINT_INTERVAL) -> list[str]:
    """Table maintenance of the compaction round: a checkpoint (:func:`write_checkpoint`) of the
    newest version of every table at least ``interval`` versions past its newest checkpoint (or,
    without one, at version ``interval - 1`` or later) -- the tables' ``delta.checkpointInterval``,
    kept off the publication path so a publication is one object (delta-rs' ``create_checkpoint``
    is likewise its own operation). Tombstones younger than ``tombstone_retention_ms`` (the
    tables' ``delta.deletedFileRetentionDuration``) stay in it. One listing of ``tables/``, then a
    read of each due table's log; returns the keys written. A table whose log cannot be read or
    whose checkpoint cannot be written is logged and skipped (its commits stay the truth).

    Raises:
        StorageError: the listing failed.
    """
    publisher = TablePublisher(store)
    written = []
    for topic, infos in sorted(_tables(store).items()):
        versions = _log_versions([i.key for i in infos], table_key(topic))
        if not versions["json"]:
            continue
        if max(versions["json"]) - max(versions["checkpoint.parquet"], default=-1) < interval:
            continue
        try:
            snap = publisher.snapshot(topic)
            written += write_checkpoint(store, topic, snap, now_ms - tombstone_retention_ms)
        except Exception as exc:  # noqa: BLE001 - an optimisation: the commits stay the truth
            log.warning("table %s: no checkpoint written: %s", store.uri(table_key(topic)), exc)
    return written


def drop_table(store: ObjectStore, topic: str) -> list[str]:
    """Delete ``topic``'s table whole: ``_last_checkpoint`` first, then its commits and
    checkpoints from the newest version down (a reader listing the log meanwhile, or a drop cut
    short, leaves an older version of it, never a mix), then everything else under its root
    (deletion-vector files). Returns the deleted keys.

    Raises:
        StorageError: the backend failed.
    """
    root = table_key(topic)
    keys = [i.key for i in store.list(f"{root}/")]
    versions = _log_versions(keys, root)
    ordered = [k for k in keys if k == f"{root}/{dl.LAST_CHECKPOINT}"]
    for v in sorted(set(versions["json"]) | set(versions["checkpoint.parquet"]), reverse=True):
        ordered += [kind[v] for kind in (versions["json"], versions["checkpoint.parquet"]) if v in kind]
    ordered += [k for k in keys if k not in set(ordered)]
    for key in ordered:
        store.delete(key)
    return ordered


def drop_deleted_tables(store: ObjectStore, catalog_state: Callable[[], CatalogState], now_ms: int,
                        delay_ms: int) -> list[str]:
    """Remove the tables of deleted topics (the compaction round's; docs/tables.md "Deleted topics").

    A table whose topic ``catalog_state()`` (the catalog's current state) no longer holds is
    first emptied -- a version removing every file, unless the writer's publication did it
    already -- and removed whole (:func:`drop_table`) once its newest version is empty and older
    than ``delay_ms`` (``storage.file.delete.delay.ms``: the grace the object cleaner gives the
    objects a version removed, so no reader that opened an older version is still reading). A
    table whose topic was re-created is left to the new topic's publication (it starts a fresh
    table). Each table is decided under its lock against ``catalog_state()`` read then, so a topic
    re-created meanwhile keeps its new table. A table whose log is unreadable (no reader can open
    it) is removed once its newest commit is ``delay_ms`` old. Returns the topics whose tables
    were removed.

    Raises:
        StorageError / ObjectNotFoundError / CorruptObjectError: the backend failed.
    """
    publisher = TablePublisher(store)
    dropped = []
    for topic, infos in sorted(_tables(store).items()):
        if topic in catalog_state().topics:
            continue
        with _table_lock(store, topic):
            state = catalog_state()
            if topic in state.topics:
                continue
            try:
                snap = publisher.snapshot(topic)
            except dl.DeltaLogError as exc:  # unreadable: nothing to empty, removed after the grace
                log.warning("table %s of deleted topic %s: %s", store.uri(table_key(topic)), topic, exc)
                snap = dl.TableSnapshot()
            if snap.files:  # not emptied yet: readers get the empty version first, the grace from it
                publisher.publish(state, topic, now_ms)
                continue
            versions = _log_versions([i.key for i in infos], table_key(topic))
            newest = versions["json"].get(max(versions["json"], default=-1))
            stamp = max((i.mtime_ms for i in infos if newest is None or i.key == newest), default=now_ms)
            if stamp + delay_ms > now_ms:
                continue
            drop_table(store, topic)
            publisher._snapshots.pop(topic, None)
            dropped.append(topic)
    return dropped


def tables_name(store: ObjectStore, now_ms: int, retention_ms: int) -> set[str]:
    """Object keys a table under ``store`` may still read: named by its newest version, or removed
    less than ``retention_ms`` (the tables' ``delta.deletedFileRetentionDuration``) before
    ``now_ms``. One listing of ``tables/`` and a read of each table's log."""
    return TablePublisher(store).named_objects(table_topics(store), now_ms, retention_ms)


def table_configuration(log_retention_ms: int, deleted_file_retention_ms: int) -> dict[str, str]:
    """The Delta retention properties of txlake's tables (docs/tables.md "Retention")."""
    return {"delta.logRetentionDuration": ms_duration(log_retention_ms),
            "delta.deletedFileRetentionDuration": ms_duration(deleted_file_retention_ms)}


def publishable_topics(state: CatalogState, include_internal: bool = False) -> list[str]:
    """Topics of ``state`` that get a table: every topic, internal ones only on request."""
    return sorted(t for t in state.topics if include_internal or not is_internal(t))


def table_topics(store: ObjectStore) -> list[str]:
    """Topics with a table under the root (one listing of ``tables/``)."""
    names = set()
    for info in store.list(TABLES_PREFIX):
        rest = info.key[len(TABLES_PREFIX):]
        if "/_delta_log/" in rest:
            names.add(rest.split("/_delta_log/")[0])
    return sorted(names)


class TablePublishThread:
    """The writer's scheduled publication: every ``interval_ms`` each topic's table follows the
    catalog (internal topics only when ``include_internal``). Started when the broker becomes the
    writer, stopped by its close; it ends by itself when the process stops being the writer.

    It never blocks produce: it works on its own catalog state, read from storage when it starts
    and then fed by the writer's commit listener (one append per commit), and reads and writes only
    the tables and the objects' footers and view columns. A round publishes only the topics some
    commit named since the previous round (all of them in the first), so a quiet topic costs
    nothing.

    Args:
        writer: the partition writer (broker) of the storage root.
        interval_ms: time between publications (ms), from the end of one to the start of the next.
        configuration: the tables' Delta properties (:func:`table_configuration`).
    """

    def __init__(self, writer, interval_ms: int, configuration: dict[str, str] | None = None,
                 include_internal: bool = False):
        assert interval_ms > 0
        self.writer = writer
        self.interval_ms = interval_ms
        self.include_internal = include_internal
        self.publisher = TablePublisher(writer.store, configuration)
        self.stopped = threading.Event()
        self.rounds = 0
        self._pending: list[tuple[int, list[dict[str, Any]]]] = []
        self._pending_lock = threading.Lock()
        self._state: CatalogState | None = None
        self._known: set[str] | None = None
        #: topics a commit named since the last round (None: all, the first round and after a rebuild)
        self._dirty: set[str] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (daemon, named ``txlake-table-publish``)."""
        # the listener first: every commit after this moment is in _pending, every one before it is
        # in storage (a commit is written before it is applied), so the state the thread opens from
        # storage (no lock of the writer's) joins the pending commits without a gap
        with self.writer.catalog.lock:
            self.writer.catalog.add_listener(self._committed)
        self._thread = threading.Thread(target=self._loop, name="txlake-table-publish", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the thread to stop (after the publication in progress) and wait for it."""
        self.stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _committed(self, version: int, actions: list[dict[str, Any]]) -> None:
        with self._pending_lock:
            self._pending.append((version, actions))

    def _current_state(self) -> CatalogState:
        """The private state brought up to the newest commit seen: the pending commits applied to
        it, or the catalog opened again from storage (never under the writer's lock) at the start
        and when a commit was skipped (the writer's view restarted from a checkpoint)."""
        with self._pending_lock:
            pending, self._pending = self._pending, []
        state = self._state
        if state is not None and pending and pending[-1][0] > state.version \
                and not any(v == state.version + 1 for v, _ in pending):
            state = None  # a gap
        if state is None:
            state = Catalog.open(self.writer.store).state
            self._dirty = None
        for version, actions in pending:
            if version != state.version + 1:
                continue  # already in the state read from storage
            for action in actions:
                state.apply(action)
                if self._dirty is not None and action.get("topic"):
                    self._dirty.add(action["topic"])
            state.version = version
        self._state = state
        return state

    def publish_round(self, now_ms: int | None = None) -> list[PublishResult]:
        """Publish the topics committed to since the last round (every topic in the first one),
        and empty the tables of topics deleted since. What a failed or stopped round did not
        publish is published by the next one."""
        state = self._current_state()
        if self._known is None:
            self._known = set(table_topics(self.writer.store))
        dirty, self._dirty = self._dirty, set()
        todo = [t for t in publishable_topics(state, self.include_internal) if dirty is None or t in dirty]
        todo += sorted(t for t in self._known if t not in state.topics)
        out = []
        for i, topic in enumerate(todo):
            if self.stopped.is_set():
                self._requeue(todo[i:])
                return out
            try:
                out.append(self.publisher.publish(state, topic, now_ms))
            except BaseException:
                self._requeue(todo[i:])
                raise
            if topic in state.topics:
                self._known.add(topic)
            else:
                self._known.discard(topic)
        self.rounds += 1
        return out

    def _requeue(self, topics: list[str]) -> None:
        if self._dirty is not None:
            self._dirty.update(topics)

    def _loop(self) -> None:
        while not self.stopped.wait(self.interval_ms / 1000):
            if not self.writer.is_writer:
                return
            try:
                self.publish_round()
            except Exception as exc:  # one bad round must not end the schedule
                log.warning("table publication of %s failed: %s", self.writer.store.url, exc)
