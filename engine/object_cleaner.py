"""Deleting objects the catalog no longer references, once no scan can still need them.

Kafka never deletes a segment file the moment it leaves the log: ``UnifiedLog`` removes it
from the segment map (new reads no longer find it), renames it ``.deleted`` and deletes it
``file.delete.delay.ms`` later, so reads already under way finish. txlake does the same on
object storage, with the catalog as the record:

1. A commit drops an object's last segment (a compaction swap, DeleteRecords, DeleteTopics):
   the catalog state *retires* the object (:attr:`CatalogState.retired`). A compaction swap
   stamps the time in the same commit (``retire_object {path, timestamp_ms}``); for the
   others the cleaner stamps it at its next round (a later time, so never a shorter grace).
2. ``file_delete_delay_ms`` after the stamp -- measured from the catalog's timestamp, never
   from the object's own last-modified time, which says when it was *written* -- the cleaner
   deletes the object and commits ``forget_object``. A crash between the two deletes it
   again next round (deleting a missing object is not an error).
3. Objects no commit ever named (a crashed flush or compaction) are orphans: deleted by
   their age after ``orphan_grace_ms`` (:mod:`.orphans`); retired objects never count as
   orphans.

4. An object a Delta table of a topic still names (docs/tables.md) waits longer: it is kept
   while the table's newest version names it, and for ``file_delete_delay_ms`` (the tables'
   ``delta.deletedFileRetentionDuration``) after the version that removed it
   (``table_guard``, engine/table_publisher.py ``TablePublisher.named_objects``), whichever
   ends later than the catalog's own grace.

A reader holding a catalog snapshot older than the swap keeps reading the old objects for
the whole delay; one that reads longer gets ObjectNotFoundError and must re-open the
catalog (as a Kafka fetch of a deleted segment fails).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from txlake.catalog.catalog import Catalog
from txlake.catalog.state import FORGET_OBJECT, RETIRE_OBJECT, CatalogState
from txlake.catalog.storage import ObjectStore

from .orphans import delete_orphans, find_orphans

log = logging.getLogger(__name__)

#: ``commit(build)``: run ``build(state) -> actions | None`` under the writer's commit lock and
#: commit what it returns (``Broker.commit_under_lock``); returns the catalog version or None.
Committer = Callable[[Callable[[CatalogState], "list[dict[str, Any]] | None"]], "int | None"]


@dataclass
class ObjectCleanup:
    """What one round of :func:`clean_objects` did (or would do, with ``dry_run``).

    Attributes:
        stamped: retired objects whose retirement time this round recorded.
        deleted: retired objects deleted (their grace had passed) and forgotten.
        orphans: never-committed objects deleted (older than the orphan grace).
        pending: retired objects still inside their grace period.
    """

    stamped: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)


def due_for_deletion(state: CatalogState, now_ms: int, delay_ms: int) -> list[str]:
    """Retired objects of ``state`` whose grace has passed: stamped at or before ``now_ms - delay_ms``
    and named by no segment (sorted)."""
    return sorted(path for path, stamp in state.retired.items()
                  if stamp is not None and stamp + delay_ms <= now_ms and state.reference_count(path) == 0)


def clean_objects(store: ObjectStore, catalog: Catalog, commit: Committer, *, delete_delay_ms: int,
                  orphan_grace_ms: int, orphan_prefixes: list[str], now_ms: int,
                  dry_run: bool = False, table_guard: Callable[[], set[str]] | None = None) -> ObjectCleanup:
    """One round of the object cleaner: stamp new retirements, delete retired objects past
    ``delete_delay_ms`` and forget them, delete orphans older than ``orphan_grace_ms``.

    Args:
        store / catalog: the storage root and the writer's catalog (read under its lock).
        commit: the writer's lease-checked commit under its commit lock (see :data:`Committer`).
        delete_delay_ms: grace of a retired object after its retirement stamp (ms).
        orphan_grace_ms: minimum age (ms, by last-modified time) of a never-committed object.
        orphan_prefixes: folders searched for orphans (``data/``, ``producer-state/``).
        now_ms: the current time (ms since the epoch); retirement stamps and deletion use it.
        dry_run: report only; nothing is deleted or committed.
        table_guard: returns the object keys Delta tables may still read (called only when some
            object is due); those stay pending.

    Raises:
        ApiError: _FENCED / NOT_LEADER_OR_FOLLOWER from ``commit`` when this process is not the writer.
        StorageError: a listing or deletion failed (what was deleted is forgotten next round).
    """
    out = ObjectCleanup()
    with catalog.lock:
        state = catalog.state
        out.stamped = sorted(p for p, stamp in state.retired.items() if stamp is None)
        out.deleted = due_for_deletion(state, now_ms, delete_delay_ms)
        out.pending = sorted(p for p in state.retired if p not in out.deleted)
    if out.deleted and table_guard is not None:
        named = table_guard()
        out.pending = sorted(set(out.pending) | (set(out.deleted) & named))
        out.deleted = [p for p in out.deleted if p not in named]
    if dry_run:
        out.orphans = find_orphans(store, catalog, orphan_prefixes, orphan_grace_ms)
        return out
    for path in out.deleted:
        store.delete(path)

    def build(state: CatalogState) -> list[dict[str, Any]] | None:
        actions: list[dict[str, Any]] = [
            {"action": RETIRE_OBJECT, "path": p, "timestamp_ms": now_ms}
            for p in out.stamped if p in state.retired and state.retired[p] is None]
        actions += [{"action": FORGET_OBJECT, "path": p} for p in out.deleted if p in state.retired]
        return actions or None

    if out.stamped or out.deleted:
        commit(build)
    if out.deleted:
        log.info("deleted %d retired objects under %s", len(out.deleted), store.url)
    out.orphans = delete_orphans(store, catalog, orphan_prefixes, orphan_grace_ms)
    if out.orphans:
        log.info("deleted %d orphaned objects under %s", len(out.orphans), store.url)
    return out
