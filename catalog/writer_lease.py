"""The writer lease: one writer process per storage root.

Built only on create-if-absent (DESIGN.md): taking the lease is a catalog commit of a
``lease`` action with the next lease epoch. Every later commit of the holder is checked
against that epoch, and because commit numbers are created with create-if-absent, a
zombie holder (one whose lease was taken over) always collides with the commit that took
it over and is refused (:class:`WriterFencedError`) -- it can commit nothing more.

Liveness: the holder overwrites a small heartbeat object ``_catalog/leases/<epoch>.json``
every ``lease_ms / 3``. A challenger may take over once ``lease_ms`` has passed since
the last heartbeat (by its own wall clock, so hosts are assumed to keep clocks within a
fraction of ``lease_ms``), at once when the lease was released by a clean exit, or at
once when the user forces it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
import uuid

from .catalog import Catalog
from .errors import CommitConflictError, WriterLeaseHeldError
from .state import LEASE, LEASE_RELEASE
from .storage import StorageError, retry_storage

log = logging.getLogger(__name__)

LEASES_PREFIX = "_catalog/leases/"
DEFAULT_LEASE_MS = 15_000


def heartbeat_key(epoch: int) -> str:
    """Object key of the heartbeat of lease ``epoch``."""
    return f"{LEASES_PREFIX}{epoch:020d}.json"


def _now_ms() -> int:
    return int(time.time() * 1000)


class WriterLease:
    """This process's claim on the writer lease of one storage root.

    Args:
        catalog: the catalog of the storage root.
        lease_ms: how long (ms) the lease outlives the holder's last heartbeat.
    """

    def __init__(self, catalog: Catalog, lease_ms: int = DEFAULT_LEASE_MS):
        assert lease_ms > 0
        self.catalog = catalog
        self.lease_ms = lease_ms
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.epoch: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        """True once acquired and until released (a fenced holder still says True until it commits)."""
        return self.epoch is not None

    def describe_holder(self) -> tuple[str, int]:
        """``(description, expires_in_ms)`` of the current holder by the catalog and its heartbeat."""
        lease = self.catalog.state.lease
        if lease is None or lease.released:
            return "nobody", 0
        renewed = lease.acquired_ms
        beat = self.catalog.store.get_or_none(heartbeat_key(lease.epoch))
        if beat:
            try:
                renewed = max(renewed, int(json.loads(beat)["renewed_at_ms"]))
            except (ValueError, KeyError):
                log.warning("unreadable lease heartbeat %s", self.catalog.store.uri(heartbeat_key(lease.epoch)))
        info = lease.info
        who = f"writer {lease.owner} (host {info.get('host', '?')}, pid {info.get('pid', '?')}, lease epoch {lease.epoch})"
        return who, renewed + lease.lease_ms - _now_ms()

    def acquire(self, force: bool = False) -> int:
        """Take the lease; return its epoch.

        Args:
            force: take over even if the holder looks alive (the user knows it is dead).

        Raises:
            WriterLeaseHeldError: a live writer holds the lease (names it and when it expires).
        """
        deadline = time.monotonic() + max(30.0, 2 * self.lease_ms / 1000)
        attempt = 0
        while time.monotonic() < deadline:
            if attempt:
                # lost the race for the next commit number to a busy writer: back off with jitter
                time.sleep(random.uniform(0, min(0.5, 0.01 * 2 ** attempt)))
            attempt += 1
            self.catalog.refresh()
            current = self.catalog.state.lease
            if current is not None and not current.released and not force:
                who, expires_in = self.describe_holder()
                if expires_in > 0:
                    raise WriterLeaseHeldError(
                        f"storage root {self.catalog.store.url} is held by {who}; a second writer cannot start. "
                        f"If that process is gone, its lease expires in {expires_in / 1000:.1f} s; stop it, wait, "
                        "or force the takeover (config storage.lease.force=true, CLI --force-lease).",
                        who, expires_in,
                    )
            epoch = (current.epoch if current is not None else 0) + 1
            action = {"action": LEASE, "owner": self.owner, "lease_epoch": epoch, "lease_ms": self.lease_ms,
                      "timestamp_ms": _now_ms(), "info": json.dumps({"host": socket.gethostname(), "pid": os.getpid()})}
            try:
                self.catalog.commit([action], lease_epoch=None)
            except CommitConflictError:
                continue  # someone committed meanwhile: look again
            self.epoch = epoch
            try:
                self.heartbeat()
            except StorageError as exc:
                # the lease is committed: until a beat lands it counts from the commit's timestamp
                # (describe_holder), and the heartbeat thread renews it. Failing here left the
                # lease held by this process's own dead attempt: NOT_LEADER_OR_FOLLOWER until it expired
                log.warning("first writer lease heartbeat of %s failed (%s); the lease stands from its commit",
                            self.catalog.store.url, exc)
            if current is not None and not current.released:
                log.warning("took over the writer lease of %s from %s (epoch %d)", self.catalog.store.url, current.owner, current.epoch)
            return epoch
        raise WriterLeaseHeldError(f"could not take the writer lease of {self.catalog.store.url}: another process kept winning "
                                   f"every commit number for {attempt} attempts",
                                   "unknown", self.lease_ms)

    def heartbeat(self) -> None:
        """Renew the lease by overwriting this epoch's heartbeat object (retried on a StorageError,
        and while the store is unreachable: :func:`~.storage.retry_storage`).

        Raises:
            StorageError: the store failed every attempt."""
        assert self.epoch is not None
        body = json.dumps({"owner": self.owner, "epoch": self.epoch, "renewed_at_ms": _now_ms()}).encode()
        key, store = heartbeat_key(self.epoch), self.catalog.store
        retry_storage(lambda: store.put(key, body), store.uri(key), "renewing the writer lease at")

    def start_heartbeats(self) -> None:
        """Renew every ``lease_ms / 3`` from a daemon thread until :meth:`release`."""
        def run() -> None:
            while not self._stop.wait(self.lease_ms / 3000):
                try:
                    self.heartbeat()
                except Exception as exc:  # keep trying: a missed beat only shortens the lease
                    log.warning("writer lease heartbeat failed: %s", exc)
        self._thread = threading.Thread(target=run, name="txlake-lease-heartbeat", daemon=True)
        self._thread.start()

    def stop_heartbeats(self) -> None:
        """Stop renewing (the lease then lapses after ``lease_ms``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def release(self) -> None:
        """Release the lease at once (clean exit): the next writer need not wait.

        A fenced holder has nothing to release; that is not an error here.
        """
        self.stop_heartbeats()
        if self.epoch is None:
            return
        epoch, self.epoch = self.epoch, None
        try:
            self.catalog.commit([{"action": LEASE_RELEASE, "owner": self.owner, "lease_epoch": epoch}], lease_epoch=epoch)
        except Exception as exc:
            log.info("writer lease epoch %d not released (%s)", epoch, exc)
