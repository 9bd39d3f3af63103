"""The event-sourced catalog: numbered commit objects plus periodic checkpoints.

Layout under the storage root::

    _catalog/commits/00000000000000000001.parquet      commit 1 (actions), create-if-absent
    _catalog/checkpoints/00000000000000000100.parquet  full state at version 100
    _catalog/leases/00000000000000000003.json          heartbeat of writer-lease epoch 3

Commit N is created with create-if-absent, so when two processes race for the same
number exactly one wins; the loser learns it was fenced (DESIGN.md "Storage model").
State = latest readable checkpoint + replay of the commits after it. Readers tail the
log by probing for the next commit number (one GET), never by listing. A reader that
finds commits reads further ahead in parallel -- 2, 4, ... up to :data:`MAX_READ_AHEAD`
numbers at a time -- so catching up on a tail of commits (up to a checkpoint interval when
a process starts) takes a few round trips instead of one per commit, while a reader with
nothing new still costs one GET per look.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from txlake.formats.catalog_actions import CHECKPOINT_KIND, COMMIT_KIND, decode_actions, encode_actions
from txlake.formats.errors import FormatError

from .errors import CommitConflictError, WriterFencedError
from .state import CatalogState
from .storage import ObjectStore

log = logging.getLogger(__name__)

COMMITS_PREFIX = "_catalog/commits/"
CHECKPOINTS_PREFIX = "_catalog/checkpoints/"
DEFAULT_CHECKPOINT_INTERVAL = 100
#: commit numbers a catching-up reader fetches at once, at most
MAX_READ_AHEAD = 16

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _reader_pool() -> ThreadPoolExecutor:
    """The threads that fetch and decode commits ahead (shared by the catalogs of a process)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(MAX_READ_AHEAD, thread_name_prefix="txlake-catalog-read")
        return _pool


def _forget_pool_after_fork() -> None:
    # a forked child (e.g. a Spark Python worker) has none of the parent's threads
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def commit_key(version: int) -> str:
    """Object key of commit ``version``."""
    return f"{COMMITS_PREFIX}{version:020d}.parquet"


def checkpoint_key(version: int) -> str:
    """Object key of the checkpoint at ``version``."""
    return f"{CHECKPOINTS_PREFIX}{version:020d}.parquet"


class Catalog:
    """One process's view of a storage root's catalog log.

    Thread-safe. A reader calls :meth:`refresh` to tail new commits; the writer (the
    holder of the writer lease) calls :meth:`commit`.

    Args:
        store: the storage root.
        checkpoint_interval: write a checkpoint every this many commits.
    """

    def __init__(self, store: ObjectStore, checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL):
        assert checkpoint_interval >= 1
        self.store = store
        self.checkpoint_interval = checkpoint_interval
        self.state = CatalogState()
        self.lock = threading.RLock()
        self._listeners: list[Callable[[int, list[dict[str, Any]]], None]] = []

    # -- loading and tailing ---------------------------------------------------------
    @classmethod
    def open(cls, store: ObjectStore, checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL) -> "Catalog":
        """Load the catalog: latest readable checkpoint, then every commit after it.

        A corrupt checkpoint is skipped (the commits it summarises are still there);
        a corrupt commit raises :class:`~txlake.formats.errors.CorruptObjectError`
        naming it, because skipping it would lose committed data.
        """
        catalog = cls(store, checkpoint_interval)
        catalog._load_checkpoint()
        catalog.refresh()
        return catalog

    def _load_checkpoint(self) -> None:
        keys = sorted((o.key for o in self.store.list(CHECKPOINTS_PREFIX) if o.key.endswith(".parquet")), reverse=True)
        for key in keys:
            try:
                actions = decode_actions(self.store.get(key), CHECKPOINT_KIND, self.store.uri(key))
                version = int(key.rsplit("/", 1)[-1].split(".")[0])
            except (FormatError, ValueError) as exc:
                log.warning("skipping unreadable catalog checkpoint %s: %s", self.store.uri(key), exc)
                continue
            state = CatalogState(version=version)
            for action in actions:
                state.apply(action)
            self.state = state
            return

    def refresh(self) -> bool:
        """Apply every commit written since the last look. Returns True if any was new.

        Raises:
            CorruptObjectError / UnsupportedFormatVersionError: a commit cannot be decoded
                (naming it); the commits before it are applied.
        """
        with self.lock:
            changed = False
            ahead = 1
            while True:
                first = self.state.version + 1
                for version, actions in self._read_commits(range(first, first + ahead)):
                    if actions is None:  # numbers are taken in order: nothing after a missing one
                        return changed
                    self._apply(version, actions)
                    changed = True
                ahead = min(2 * ahead, MAX_READ_AHEAD)

    def _read_commit(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of commit ``version``, or None when it does not exist (yet)."""
        data = self.store.get_or_none(commit_key(version))
        if data is None:
            return None
        return decode_actions(data, COMMIT_KIND, self.store.uri(commit_key(version)))

    def _read_commits(self, versions: range):
        """``(version, actions or None)`` for ``versions``, in order (fetched side by side)."""
        if len(versions) == 1:
            yield versions[0], self._read_commit(versions[0])
            return
        yield from zip(versions, _reader_pool().map(self._read_commit, versions))

    def _apply(self, version: int, actions: list[dict[str, Any]]) -> None:
        assert version == self.state.version + 1, "commits apply in order"
        for action in actions:
            self.state.apply(action)
        self.state.version = version
        for listener in self._listeners:
            listener(version, actions)

    def add_listener(self, fn: Callable[[int, list[dict[str, Any]]], None]) -> None:
        """Call ``fn(version, actions)`` after each commit is applied (own or tailed)."""
        self._listeners.append(fn)

    @property
    def version(self) -> int:
        """The catalog version this view has applied (0 = empty)."""
        return self.state.version

    # -- writing ---------------------------------------------------------------------
    def commit(self, actions: Sequence[dict[str, Any]], lease_epoch: int | None) -> int:
        """Append one commit holding ``actions``; return its version.

        Args:
            lease_epoch: the writer-lease epoch the caller holds; the commit is refused
                unless the catalog's current lease is that epoch and not released.
                ``None`` only for the lease acquisition itself.

        Raises:
            WriterFencedError: another writer holds the lease (this process is a zombie).
            CommitConflictError: another process took this commit number first.
        """
        assert actions, "a commit holds at least one action"
        with self.lock:
            if lease_epoch is not None:
                self._check_lease(lease_epoch)
            version = self.state.version + 1
            data = encode_actions(list(actions), COMMIT_KIND, version)
            if not self.store.put_if_absent(commit_key(version), data):
                self.refresh()
                if lease_epoch is not None:
                    self._check_lease(lease_epoch)
                raise CommitConflictError(
                    f"catalog commit {version} at {self.store.uri(commit_key(version))} was written by another process"
                )
            self._apply(version, list(actions))
            if version % self.checkpoint_interval == 0:
                self.write_checkpoint()
            return version

    def _check_lease(self, lease_epoch: int) -> None:
        lease = self.state.lease
        if lease is None or lease.epoch != lease_epoch or lease.released:
            holder = "nobody (released)" if lease is None or lease.released else f"{lease.owner} (lease epoch {lease.epoch})"
            raise WriterFencedError(
                f"this process lost the writer lease (epoch {lease_epoch}) of {self.store.url}: it is now held by "
                f"{holder} as of catalog version {self.state.version}; nothing more can be committed from here. "
                "Reopen the storage root to continue."
            )

    def write_checkpoint(self) -> str | None:
        """Write the checkpoint of the current version (idempotent). Returns its key, or None if the state is empty."""
        with self.lock:
            actions = self.state.checkpoint_actions()
            if not actions:
                return None
            key = checkpoint_key(self.state.version)
            self.store.put_if_absent(key, encode_actions(actions, CHECKPOINT_KIND, self.state.version))
            return key
