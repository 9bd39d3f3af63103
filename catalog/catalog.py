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

A checkpoint is written after a commit when both hold (:meth:`Catalog.checkpoint_due`):

* at least ``checkpoint_interval`` commits were made since the last checkpoint, and
* those commits together are at least as big (bytes) as the last checkpoint.

So checkpoints add at most the log's own bytes to storage (a big state -- many segments, many
objects awaiting deletion -- is checkpointed less often, where a fixed count rewrote it every
few commits), at most one PUT per ``checkpoint_interval`` commits, and a reader opening the
catalog reads at most about twice a checkpoint's bytes (the checkpoint and the commits after
it; Delta Lake's ``checkpointInterval`` with a size condition).

Old commits are deleted once a checkpoint covers them and they are older than the catalog
log retention (:mod:`.log_cleanup`; Delta Lake's expired-log cleanup). Probing by number
stays safe because every view keeps the time it last *confirmed* it was current (the next
number was absent, or its own commit created it): a commit created after that moment is
younger than :data:`TAIL_STALE_MS`, and the cleanup deletes no commit younger than
:data:`MIN_LOG_RETENTION_MS`, twice as long. A view that has not confirmed for
:data:`TAIL_STALE_MS` first looks for a checkpoint newer than its version and, when there is
one, restarts from it before probing. So a lagging reader never stalls at a deleted number,
and a zombie writer (paused past the retention) learns it was superseded before it could
recreate a deleted number.

A missing number with a commit or checkpoint past it is a *gap*: the object was lost (a
partial restore, a lifecycle rule, a deleted file). Replaying past it would silently drop
what it held, and committing at its number would splice another history into the log, so
:class:`~.errors.CatalogGapError` stops both. Telling a gap from "nothing new yet" takes
one look past the missing number (:meth:`ObjectStore.first_key_after`: one LIST request
on S3, whatever the log's length), never a LIST per refresh. A view looks:

* when it opens (the checkpoints are listed then anyway: one more request);
* before committing, unless its own commit made the number the next one less than the
  writer lease (``lease_ms``) ago: the writer's lease commit, its first commit after
  tailing others' commits, and its first commit after an idle spell look (one LIST); a busy
  writer never does. Right after its own commit N-1 nothing lies past N, and nothing can
  appear there without another writer first taking N -- which its create-if-absent would
  collide with -- unless, within that window, another writer took the lease over (only
  possible once this one's heartbeats had stopped for ``lease_ms``) *and* its commit N was
  then lost: a double fault;
* when a refresh finds the next number missing and it has not looked for
  :data:`GAP_CHECK_MS` (a quiet reader: one or two LIST requests per 15 minutes), or a
  number it read ahead in the same round exists (a reader catching up finds the gap at once).

Commits the cleanup deleted below a checkpoint are no gap: when a readable checkpoint lies
past the missing number, the view restarts from it, as a stale view does. Inspecting and
repairing a gap: :mod:`.check`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from txlake.formats.catalog_actions import CHECKPOINT_KIND, COMMIT_KIND, decode_actions, encode_actions
from txlake.formats.errors import CorruptObjectError, FormatError

from .errors import CatalogGapError, CommitConflictError, WriterFencedError
from .state import CatalogState
from .storage import ObjectStore, StorageError, put_if_absent_confirmed, retry_storage

log = logging.getLogger(__name__)

COMMITS_PREFIX = "_catalog/commits/"
CHECKPOINTS_PREFIX = "_catalog/checkpoints/"
DEFAULT_CHECKPOINT_INTERVAL = 100
#: commit numbers a catching-up reader fetches at once, at most
MAX_READ_AHEAD = 16

#: Attempts of one catalog commit's create-if-absent when its outcome is unknown (a StorageError):
#: :meth:`Catalog._put_commit`.
COMMIT_PUT_ATTEMPTS = 6
#: Attempts of a read of a catalog commit that fails with a StorageError: :meth:`Catalog._get_commit`.
COMMIT_GET_ATTEMPTS = 6
#: a view that has not confirmed it is current for this long (ms) looks for a newer
#: checkpoint before probing the next commit number (the module docstring says why)
TAIL_STALE_MS = 15 * 60_000
#: the cleanup never deletes a commit younger than this (ms): twice :data:`TAIL_STALE_MS`,
#: so clocks may disagree by up to :data:`TAIL_STALE_MS` without a reader missing a commit
MIN_LOG_RETENTION_MS = 2 * TAIL_STALE_MS
#: a view whose next commit number is missing looks past it for a gap at most this often (ms)
#: while refreshing (always when it opens, and before it commits at a number it did not make next)
GAP_CHECK_MS = TAIL_STALE_MS

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def elapsed_clock() -> float:
    """Seconds on a clock that keeps counting while the host is suspended (Linux CLOCK_BOOTTIME;
    ``time.monotonic`` elsewhere): a process frozen with its host must count that time as
    elapsed when it asks how long ago it last confirmed its view."""
    return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()

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


def version_of(key: str) -> int | None:
    """The version a commit or checkpoint key names (``..../00000000000000000100.parquet`` -> 100);
    None for any other key."""
    name = key.rsplit("/", 1)[-1]
    stem, dot, ext = name.partition(".")
    return int(stem) if dot and ext == "parquet" and stem.isdigit() else None


def checkpoint_versions(store: ObjectStore) -> list[int]:
    """The versions of the checkpoints under ``store``, ascending (one LIST)."""
    return sorted(v for v in (version_of(o.key) for o in store.list(CHECKPOINTS_PREFIX)) if v is not None)


class Catalog:
    """One process's view of a storage root's catalog log.

    Thread-safe. A reader calls :meth:`refresh` to tail new commits; the writer (the
    holder of the writer lease) calls :meth:`commit`.

    Args:
        store: the storage root.
        checkpoint_interval: write a checkpoint after at least this many commits (and only when
            they hold at least the last checkpoint's bytes; see the module docstring).
    """

    def __init__(self, store: ObjectStore, checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL):
        assert checkpoint_interval >= 1
        self.store = store
        self.checkpoint_interval = checkpoint_interval
        self.state = CatalogState()
        self.lock = threading.RLock()
        self._listeners: list[Callable[[int, list[dict[str, Any]]], None]] = []
        #: :func:`elapsed_clock` time this view last knew it was current (None: never)
        self._confirmed_at: float | None = None
        #: ms after which an unconfirmed view looks for a newer checkpoint (tests shorten it)
        self.tail_stale_ms = TAIL_STALE_MS
        #: the commit number this view's own last commit made the next one, and when (elapsed_clock)
        self._next_known: int | None = None
        self._next_known_at = 0.0
        #: :func:`elapsed_clock` time of this view's last look past a missing number (None: never)
        self._gap_checked_at: float | None = None
        #: ms between two looks for a gap while refreshing (tests shorten it)
        self.gap_check_ms = GAP_CHECK_MS
        #: the gap this view found at its next number: raised again, with no further look, for as
        #: long as the probe finds that number missing (a repair or a restore ends it)
        self._gap: CatalogGapError | None = None
        #: the newest checkpoint this view loaded or wrote: its version and size (bytes), and the
        #: bytes of the commits applied since (:meth:`checkpoint_due`)
        self.checkpoint_version = 0
        self.checkpoint_bytes = 0
        self.log_bytes_since_checkpoint = 0

    # -- loading and tailing ---------------------------------------------------------
    @classmethod
    def open(cls, store: ObjectStore, checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL) -> "Catalog":
        """Load the catalog: latest readable checkpoint, then every commit after it.

        A corrupt checkpoint is skipped when the commits it summarises are still there;
        a corrupt commit raises :class:`~txlake.formats.errors.CorruptObjectError`
        naming it, because skipping it would lose committed data. Where the commits stop,
        one look past the missing number tells the end of the log from a gap.

        Raises:
            CatalogGapError: a commit is missing and a later commit exists (names the missing object).
            CorruptObjectError: a commit is unreadable, or the newest checkpoint is and the
                commits it summarises were already cleaned up (:mod:`.log_cleanup`).
        """
        catalog = cls(store, checkpoint_interval)
        with catalog.lock:
            listed = checkpoint_versions(store)
            catalog._load_checkpoint(listed)
            catalog._tail(check_gap=True, checkpoints=listed)
            newest = listed[-1] if listed else 0
            if catalog.state.version < newest:  # (the look past the end raises this first)
                raise catalog._unreadable_checkpoint_error(newest)
        return catalog

    def _unreadable_checkpoint_error(self, version: int) -> CorruptObjectError:
        return CorruptObjectError(
            self.store.uri(checkpoint_key(version)),
            f"catalog checkpoint is unreadable and the commits it summarises from version "
            f"{self.state.version + 1} on were already cleaned up: the catalog cannot be loaded past version "
            f"{self.state.version}. Restore that checkpoint object from a backup.")

    def _load_checkpoint(self, versions: list[int]) -> bool:
        """Replace the state by the newest readable checkpoint among ``versions`` that is newer
        than this view; returns True if one was loaded."""
        for version in sorted((v for v in versions if v > self.state.version), reverse=True):
            key = checkpoint_key(version)
            try:
                data = retry_storage(lambda: self.store.get(key), self.store.uri(key), "reading catalog checkpoint",
                                     COMMIT_GET_ATTEMPTS)
                actions = decode_actions(data, CHECKPOINT_KIND, self.store.uri(key))
            except FormatError as exc:
                log.warning("skipping unreadable catalog checkpoint %s: %s", self.store.uri(key), exc)
                continue
            state = CatalogState(version=version)
            for action in actions:
                state.apply(action)
            self.state = state
            self.checkpoint_version, self.checkpoint_bytes, self.log_bytes_since_checkpoint = version, len(data), 0
            return True
        return False

    def _is_stale(self) -> bool:
        return self._confirmed_at is None or (elapsed_clock() - self._confirmed_at) * 1000 > self.tail_stale_ms

    def _catch_up_if_stale(self) -> bool:
        """A view unconfirmed for :attr:`tail_stale_ms` restarts from a newer checkpoint, if
        there is one (the commits between may be cleaned up). Returns True if it did."""
        if not self._is_stale():
            return False
        if not self._load_checkpoint(checkpoint_versions(self.store)):
            return False
        log.info("catalog view of %s restarted from the checkpoint at version %d", self.store.url, self.state.version)
        return True

    def refresh(self) -> bool:
        """Apply every commit written since the last look. Returns True if any was new.

        A view that has not confirmed it is current for :attr:`tail_stale_ms` first restarts
        from a newer checkpoint when there is one (then listeners are not called for the
        commits it skipped).

        When the next number is missing and this view has not looked past it for
        :attr:`gap_check_ms`, or a later number it read ahead exists, it looks (one or two
        LIST requests): a gap raises.

        Raises:
            CorruptObjectError / UnsupportedFormatVersionError: a commit cannot be decoded
                (naming it); the commits before it are applied.
            CatalogGapError: the next commit is missing and a later one exists (naming the
                missing object); the commits before it are applied.
        """
        with self.lock:
            jumped = self._catch_up_if_stale()
            return self._tail() or jumped

    def _tail(self, check_gap: bool = False, checkpoints: list[int] | None = None) -> bool:
        """Apply the commits after this view's version, up to the first missing number; then,
        with ``check_gap`` or when the last look is :attr:`gap_check_ms` old, look past it
        (``checkpoints``: the checkpoint versions if just listed)."""
        changed = False
        ahead = 1
        while True:
            first = self.state.version + 1
            probed_at = elapsed_clock()
            missing = None
            window = self._read_commits(range(first, first + ahead))
            for version, read in window:
                if read is None:  # numbers are taken in order: nothing after a missing one ...
                    missing = version
                    break
                self._apply(version, *read)
                changed = True
            if missing is None:
                ahead = min(2 * ahead, MAX_READ_AHEAD)
                continue
            self._confirmed_at = probed_at  # absent since then, and all before it applied
            if self._gap is not None and self._gap.version == missing:
                raise CatalogGapError(*self._gap.__reduce__()[1])  # still missing: the same gap
            # a later number read ahead in the same window is evidence for free
            try:
                later = any(read is not None for _, read in window)
            except FormatError:  # it exists, unreadable (raised when it is applied, after the gap)
                later = True
            if not (check_gap or later or self._gap_check_due()):
                return changed
            if not self._look_past(missing, checkpoints):  # ... unless something lies past it: a gap
                return changed
            changed, ahead, checkpoints = True, 1, None  # it appeared meanwhile, or a checkpoint past it was loaded

    def _gap_check_due(self) -> bool:
        return self._gap_checked_at is None or (elapsed_clock() - self._gap_checked_at) * 1000 >= self.gap_check_ms

    def _look_past(self, missing: int, checkpoints: list[int] | None = None) -> bool:
        """Commit ``missing`` (this view's version + 1) was just found absent: look for a commit
        past it, or a checkpoint at or past it. Nothing there: ``missing`` is the next number
        (False). Otherwise True when the caller can tail on -- the commit was written meanwhile,
        or the view restarted from a readable checkpoint past it (commits the cleanup deleted) --
        and raises when it cannot.

        Raises:
            CatalogGapError: the commit is missing and a later commit exists.
            CorruptObjectError: a checkpoint at or past it exists but is unreadable (the commits it
                summarises may have been cleaned up: the checkpoint is what must be restored).
        """
        assert missing == self.state.version + 1
        self._gap_checked_at = elapsed_clock()
        key = commit_key(missing)
        past = retry_storage(lambda: self.store.first_key_after(COMMITS_PREFIX, key), self.store.uri(key),
                             "looking past catalog commit")
        if checkpoints is not None:
            beyond = [v for v in checkpoints if v >= missing]
            checkpoint = checkpoint_key(beyond[0]) if beyond else None
        else:
            checkpoint = self.store.first_key_after(CHECKPOINTS_PREFIX, checkpoint_key(missing - 1))
        if past is None and checkpoint is None:
            return False
        if self.store.get_or_none(key) is not None:
            return True  # written since the probe (numbers are taken in order): not a gap
        if checkpoint is not None:
            listed = checkpoint_versions(self.store) if checkpoints is None else checkpoints
            if self._load_checkpoint(listed):
                log.warning("catalog commit %s is missing; the view restarted from the checkpoint at version %d past it",
                            self.store.uri(key), self.state.version)
                return True
            # every checkpoint past it is unreadable. The cleanup deletes a prefix of the log and keeps the
            # checkpoint just below the first commit it keeps: then that checkpoint is what must be restored
            after = [v for v in listed if v >= missing]
            if after and (past is None or version_of(past) - 1 in listed):
                raise self._unreadable_checkpoint_error(after[-1])
        evidence = past or checkpoint
        self._gap = CatalogGapError(
            self.store.uri(key), key, missing, evidence,
            f"catalog commit {missing} is missing, but {self.store.uri(evidence)} exists past it: the catalog log has a gap "
            f"(the object was lost: a partial restore, a lifecycle rule, a deletion). Loading stops at version "
            f"{missing - 1}, and no writer commits until it is closed, because skipping it would silently drop what "
            f"it held. Restore the object from a backup, or inspect and repair the log with `txlake catalog check` "
            f"and `txlake catalog repair` (docs/operations.md, \"Checking and repairing the catalog\").")
        raise self._gap

    def has_foreign_commit(self) -> bool:
        """True if a commit exists after this view's version (one GET; a stale view also
        lists the checkpoints). The writer's check that nobody else committed: it applies nothing."""
        with self.lock:
            if self._is_stale() and any(v > self.state.version for v in checkpoint_versions(self.store)):
                return True
            probed_at = elapsed_clock()
            if self._get_commit(commit_key(self.state.version + 1)) is not None:
                return True
            self._confirmed_at = probed_at
            return False

    def _read_commit(self, version: int) -> tuple[list[dict[str, Any]], int] | None:
        """The actions of commit ``version`` and its size (bytes), or None when it does not exist (yet)."""
        data = self._get_commit(commit_key(version))
        if data is None:
            return None
        return decode_actions(data, COMMIT_KIND, self.store.uri(commit_key(version))), len(data)

    def _get_commit(self, key: str) -> bytes | None:
        """``store.get_or_none(key)`` of a commit, retried up to :data:`COMMIT_GET_ATTEMPTS` times in
        all on a StorageError (a 503, a reset: a read has no effect, so repeating it is always
        safe). Raises the last StorageError when every attempt failed."""
        return retry_storage(lambda: self.store.get_or_none(key), self.store.uri(key), "reading catalog commit",
                             COMMIT_GET_ATTEMPTS)

    def _read_commits(self, versions: range):
        """``(version, (actions, size) or None)`` for ``versions``, in order (fetched side by side)."""
        if len(versions) == 1:
            yield versions[0], self._read_commit(versions[0])
            return
        yield from zip(versions, _reader_pool().map(self._read_commit, versions))

    def _apply(self, version: int, actions: list[dict[str, Any]], size: int) -> None:
        assert version == self.state.version + 1, "commits apply in order"
        for action in actions:
            self.state.apply(action)
        self.state.version = version
        self.log_bytes_since_checkpoint += size
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

        Unless this view's own commit made the number the next one less than ``lease_ms``
        ago, it first looks past that number for a gap (module docstring): a writer never
        writes into a gap.

        Raises:
            WriterFencedError: another writer holds the lease (this process is a zombie).
            CommitConflictError: another process took this commit number first.
            CatalogGapError: the number is a gap (a later commit exists); nothing was written.
        """
        assert actions, "a commit holds at least one action"
        with self.lock:
            if self._catch_up_if_stale():
                self._tail()  # so the lease check below sees the current holder
            if lease_epoch is not None:
                self._check_lease(lease_epoch)
            version = self.state.version + 1
            lease = self.state.lease
            made_next = (self._next_known == version and lease is not None
                         and (elapsed_clock() - self._next_known_at) * 1000 < lease.lease_ms)
            if not made_next and self._look_past(version):
                self._tail(check_gap=True)  # another process committed since this view last looked
                if lease_epoch is not None:
                    self._check_lease(lease_epoch)
                raise CommitConflictError(
                    f"catalog commit {version} at {self.store.uri(commit_key(version))} was written by another process"
                )
            data = encode_actions(list(actions), COMMIT_KIND, version)
            written_at = elapsed_clock()
            if not self._put_commit(commit_key(version), data):
                self.refresh()
                if lease_epoch is not None:
                    self._check_lease(lease_epoch)
                raise CommitConflictError(
                    f"catalog commit {version} at {self.store.uri(commit_key(version))} was written by another process"
                )
            self._confirmed_at = self._next_known_at = written_at
            self._next_known = version + 1
            self._apply(version, list(actions), len(data))
            if self.checkpoint_due():
                try:
                    self.write_checkpoint()
                except StorageError as exc:  # the commit landed: not its failure; the next commit tries again
                    log.warning("checkpoint of catalog version %d not written (%s); the next commit writes one",
                                version, exc)
            return version

    def _put_commit(self, key: str, data: bytes) -> bool:
        """``put_if_absent(key, data)`` that survives an unknown outcome: True if this call's
        bytes are at ``key``, False if another writer's are (:func:`~.storage.put_if_absent_confirmed`,
        up to :data:`COMMIT_PUT_ATTEMPTS` PUTs).

        Raises:
            StorageError: every attempt failed (the outcome stays unknown: the next commit of
                this writer at this number finds out).
        """
        return put_if_absent_confirmed(self.store, key, data, "catalog commit", COMMIT_PUT_ATTEMPTS)

    def checkpoint_due(self) -> bool:
        """Whether the current version gets a checkpoint (the rule of the module docstring): at
        least :attr:`checkpoint_interval` commits since the last checkpoint, holding at least
        its bytes."""
        with self.lock:
            return (self.state.version - self.checkpoint_version >= self.checkpoint_interval
                    and self.log_bytes_since_checkpoint >= self.checkpoint_bytes)

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
        """Write the checkpoint of the current version (idempotent). Returns its key, or None if the state is empty.

        The PUT is :func:`~.storage.put_if_absent_confirmed` (a PUT of unknown outcome is read
        back, a failed one retried, up to :data:`COMMIT_PUT_ATTEMPTS`); a checkpoint of this
        version already there (another process's) stands.

        Raises:
            StorageError: every attempt failed (:meth:`commit` logs it and goes on: the commit
                landed, and the checkpoint stays due for the next commit).
        """
        with self.lock:
            actions = self.state.checkpoint_actions()
            if not actions:
                return None
            key = checkpoint_key(self.state.version)
            data = encode_actions(actions, CHECKPOINT_KIND, self.state.version)
            put_if_absent_confirmed(self.store, key, data, "catalog checkpoint", COMMIT_PUT_ATTEMPTS)
            self.checkpoint_version, self.checkpoint_bytes, self.log_bytes_since_checkpoint = \
                self.state.version, len(data), 0
            return key
