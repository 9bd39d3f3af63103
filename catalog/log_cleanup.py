"""Deleting the catalog commits a checkpoint covers, once they are older than the retention.

The catalog is a log of numbered commits (one per flush under load), so without cleanup it
grows without bound. Like Delta Lake's expired-log cleanup, the writer deletes, at each
compaction round, the commits and checkpoints no reader can need any more:

* A checkpoint is *expired* when its object is older than the retention
  (``storage.catalog.retention.ms``, by its last-modified time). Every commit at or below
  its version is older still: a checkpoint is written after the commit of its version.
* The *floor* is the newest readable expired checkpoint except the newest expired one. The
  cleanup deletes every commit at or below the floor and every checkpoint below it; it keeps
  the floor, the newer checkpoints and every commit after the floor. So a reader can start
  from the newest checkpoint or, if that one is unreadable, from an older one, and replay
  the commits after it -- one corrupt checkpoint never makes the catalog unloadable.
* Heartbeats of writer-lease epochs older than the current one are deleted with the same
  age rule (only the current epoch's heartbeat is ever read).

Why readers tailing by commit number never stall at a deleted number, and why a zombie
writer cannot recreate one: :mod:`.catalog` (``TAIL_STALE_MS``). That argument needs the
retention to be at least :data:`~.catalog.MIN_LOG_RETENTION_MS`.

Objects whose backend reports no last-modified time are never taken for expired.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from txlake.formats.catalog_actions import CHECKPOINT_KIND, decode_actions
from txlake.formats.errors import FormatError

from .catalog import (CHECKPOINTS_PREFIX, COMMITS_PREFIX, MIN_LOG_RETENTION_MS, Catalog, checkpoint_key,
                      commit_key, version_of)
from .writer_lease import LEASES_PREFIX

log = logging.getLogger(__name__)

#: default ``storage.catalog.retention.ms``: commits and checkpoints are kept at least this long (ms)
DEFAULT_LOG_RETENTION_MS = 3_600_000
#: deletes between two looks at ``cancel`` (one S3 DeleteObjects request)
DELETE_BATCH = 1000


@dataclass
class CatalogLogCleanup:
    """What one :func:`clean_catalog_log` did (or would do, with ``dry_run``).

    Attributes:
        floor: the version of the oldest checkpoint kept, below which nothing of the log
            remains; None when nothing was old enough to clean.
        commits: versions of the commits deleted, ascending.
        checkpoints: versions of the checkpoints deleted, ascending.
        heartbeats: keys of the lease heartbeats deleted.
    """

    floor: int | None = None
    commits: list[int] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    heartbeats: list[str] = field(default_factory=list)


def _readable(catalog: Catalog, version: int) -> bool:
    key = checkpoint_key(version)
    try:
        decode_actions(catalog.store.get(key), CHECKPOINT_KIND, catalog.store.uri(key))
    except FormatError as exc:
        log.warning("catalog checkpoint %s is unreadable: not used as the cleanup floor (%s)", catalog.store.uri(key), exc)
        return False
    return True


def clean_catalog_log(catalog: Catalog, retention_ms: int, now_ms: int, dry_run: bool = False,
                      cancel: threading.Event | None = None) -> CatalogLogCleanup:
    """Delete the commits and checkpoints older than ``retention_ms`` that a kept checkpoint covers.

    Runs in the writer (the holder of the lease); readers may run concurrently.

    Args:
        catalog: the writer's catalog.
        retention_ms: minimum age (ms, by last-modified time) of anything deleted; at least
            :data:`~.catalog.MIN_LOG_RETENTION_MS`.
        now_ms: the current time, ms since the epoch.
        dry_run: report what would be deleted, delete nothing.
        cancel: when set, stop after the batch of :data:`DELETE_BATCH` deletes in progress (the
            writer is closing); the result then lists only what was deleted.

    Returns:
        A :class:`CatalogLogCleanup`.

    Raises:
        ValueError: ``retention_ms`` below the minimum.
        StorageError: listing or deleting failed (a later round finishes the work: every
            step is safe to repeat).
    """
    if retention_ms < MIN_LOG_RETENTION_MS:
        raise ValueError(f"catalog log retention must be at least {MIN_LOG_RETENTION_MS} ms, got {retention_ms}")
    store = catalog.store
    cutoff = now_ms - retention_ms
    out = CatalogLogCleanup()
    checkpoints = {v: o for o in store.list(CHECKPOINTS_PREFIX) if (v := version_of(o.key)) is not None}
    expired = sorted(v for v, o in checkpoints.items() if 0 < o.mtime_ms <= cutoff and v <= catalog.version)
    out.floor = next((v for v in reversed(expired[:-1]) if _readable(catalog, v)), None)
    if out.floor is not None:
        out.commits = sorted(v for o in store.list(COMMITS_PREFIX) if (v := version_of(o.key)) is not None and v <= out.floor)
        out.checkpoints = sorted(v for v in checkpoints if v < out.floor)
    lease = catalog.state.lease
    if lease is not None:
        for o in store.list(LEASES_PREFIX):
            stem = o.key.rsplit("/", 1)[-1].partition(".")[0]
            if stem.isdigit() and int(stem) < lease.epoch and 0 < o.mtime_ms <= cutoff:
                out.heartbeats.append(o.key)
    if dry_run:
        return out
    # the floor checkpoint and everything after it stay whatever step a crash or `cancel` interrupts
    for deleted, keys in ((out.commits, [commit_key(v) for v in out.commits]),
                          (out.checkpoints, [checkpoint_key(v) for v in out.checkpoints]),
                          (out.heartbeats, list(out.heartbeats))):
        for start in range(0, len(keys), DELETE_BATCH):
            if cancel is not None and cancel.is_set():
                del deleted[start:]
                break
            store.delete_many(keys[start:start + DELETE_BATCH])
    if out.commits or out.checkpoints:
        log.info("catalog log of %s cleaned below checkpoint %s: %d commits, %d checkpoints deleted",
                 store.url, out.floor, len(out.commits), len(out.checkpoints))
    return out
