"""Finding and deleting orphaned objects: written but never committed.

A crash between writing a data object and committing it (a flush, or a compaction's
rewrite) leaves an object no commit names. Readers never see it (they read only what the
catalog names); the writer deletes it once it is older than a grace period, so an object
being written right now by the live writer (not yet committed) is never touched.

Objects that *were* referenced and no longer are (the catalog's ``retired`` objects:
compaction swaps, DeleteRecords, DeleteTopics) are not orphans: scans that started
before their last segment left may still read them, so they count as referenced here and
the object cleaner (:mod:`.object_cleaner`) deletes them ``file.delete.delay.ms`` after
the commit that retired them -- never by their age, since an old object may have been
retired a second ago.
"""

from __future__ import annotations

import time

from txlake.catalog.catalog import Catalog
from txlake.catalog.storage import TEMP_PREFIX, ObjectStore

#: Where a crash can leave a local backend's temporary file behind (catalog commits, heartbeats).
TEMP_ONLY_PREFIXES = ("_catalog/",)


def find_orphans(store: ObjectStore, catalog: Catalog, prefixes: list[str], grace_ms: int) -> list[str]:
    """Keys under ``prefixes`` that the catalog neither references nor tracks as retired and that
    are older than ``grace_ms`` (by their last-modified time), plus temporary files a crashed
    local write left anywhere (same grace).

    The listing comes first and the catalog's references after it: an object committed
    while the listing ran is then seen as referenced (an object listed but not yet committed
    is protected by its age).
    """
    cutoff = int(time.time() * 1000) - grace_ms
    listed = [info for prefix in prefixes for info in store.list(prefix, include_temporary=True)]
    with catalog.lock:
        referenced = catalog.state.referenced_paths() | set(catalog.state.retired)
    found = []
    for info in listed:
        if info.key not in referenced and info.mtime_ms < cutoff:
            found.append(info.key)
    for prefix in TEMP_ONLY_PREFIXES:
        for info in store.list(prefix, include_temporary=True):
            if info.key.rpartition("/")[2].startswith(TEMP_PREFIX) and info.mtime_ms < cutoff:
                found.append(info.key)
    return found


def delete_orphans(store: ObjectStore, catalog: Catalog, prefixes: list[str], grace_ms: int) -> list[str]:
    """Delete what :func:`find_orphans` finds; return the deleted keys."""
    orphans = find_orphans(store, catalog, prefixes, grace_ms)
    for key in orphans:
        store.delete(key)
    return orphans
