"""Object-store fault injection for tests and ``txlake verify`` (never enabled by default).

An :class:`~.storage.ObjectStore` whose storage options hold ``storage.faults.*`` entries
(client config ``storage.options`` or, flat, ``storage.options.storage.faults.seed``; the
CLI's ``-O storage.faults.seed=7``) injects faults into its GETs and PUTs on a seeded
schedule: one ``random.Random(seed)`` per store draws, for every operation, whether each
enabled kind fires. Without any ``storage.faults.*`` option nothing here runs.

Fault kinds (each with a rate in [0, 1], the probability per operation) and what real
S3 behaviour each models:

``get.error``  (``storage.faults.get.error.rate``)
    A GET (``get``, ``get_or_none``, ``open_input``) fails before reading: alternately a
    connection reset (``ConnectionResetError``, as aiohttp raises under s3fs) and an HTTP
    503 SlowDown. Surfaces as :class:`~.storage.StorageError`, like a real backend failure.
``get.delay``  (``storage.faults.get.delay.rate``, ``storage.faults.get.delay.ms``)
    A GET stalls ``delay.ms`` (default 200) before it runs (a slow GET).
``put.error``  (``storage.faults.put.error.rate``)
    A PUT (``put``, ``put_if_absent``) fails before anything is written (503 SlowDown or a
    connection reset while sending): the object is NOT created.
``put.delay``  (``storage.faults.put.delay.rate``, ``storage.faults.put.delay.ms``)
    A PUT stalls ``delay.ms`` (default 200) before it runs.
``put.timeout``  (``storage.faults.put.timeout.rate``)
    The PUT is performed -- the object IS stored -- then the caller gets a
    ``TimeoutError`` (as a read timeout on the response does): the outcome is unknown to the
    writer. For ``put_if_absent`` this is what a client sees when the server applied the
    conditional write but the response was lost and no retry was made.

``list.lag``  (``storage.faults.list.lag.rate``, ``storage.faults.list.lag.ms``)
    A LIST (``list``, ``first_key_after``) lags behind: it omits every object whose
    modification time is within the last ``list.lag.ms`` (default 1000) -- written by any
    process -- as a listing served from a stale index does. Counted only when it omitted
    something.
``cas.race``  (``storage.faults.cas.race.rate``)
    A create-if-absent of a catalog commit (``put_if_absent`` of ``_catalog/commits/N``) loses
    a race: just before it runs, another writer takes the writer lease over at that number
    (commit N: a ``lease`` action of the next lease epoch, owner ``injected-race``) and releases
    it (commit N+1), as a second process that took over and exited cleanly would. The
    conditional PUT then finds N taken, which is the only way a real race shows under
    single-writer fencing: the writer re-reads the catalog and fences itself (a lease
    acquisition looks again and takes the next number). Other conditional PUTs (checkpoints,
    Delta commits, hand-off claims) are not raced.

Not modelled here: reads through :meth:`~.storage.ObjectStore.arrow_filesystem` (Parquet
data reads by pyarrow bypass the wrapper).

Every injected fault is counted per kind on the schedule (:attr:`FaultSchedule.injected`)
and process-wide (:func:`injected_totals`).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any, Callable

__all__ = ["FAULT_KINDS", "OPTION_PREFIX", "RACE_OWNER", "FaultSchedule", "InvalidFaultConfigError", "injected_totals",
           "split_fault_options"]

#: Storage-option prefix of the fault settings.
OPTION_PREFIX = "storage.faults."

#: The fault kinds, in the order they are drawn for an operation.
FAULT_KINDS = ("get.delay", "get.error", "put.delay", "put.error", "put.timeout", "list.lag", "cas.race")

_RATE_KEYS = {f"{OPTION_PREFIX}{kind}.rate": kind for kind in FAULT_KINDS}
_MS_KEYS = {f"{OPTION_PREFIX}get.delay.ms": "get", f"{OPTION_PREFIX}put.delay.ms": "put",
            f"{OPTION_PREFIX}list.lag.ms": "list"}
_SEED_KEY = f"{OPTION_PREFIX}seed"

# ObjectStore method -> the operation class it belongs to.
_OPERATIONS = {"get": "get", "open_input": "get", "put": "put", "put_if_absent": "put", "list": "list",
               "first_key_after": "list"}
#: the kinds drawn per operation class (a cas.race is drawn for put_if_absent only)
_DRAWN = {"get": ("get.delay", "get.error"), "put": ("put.delay", "put.error", "put.timeout"),
          "put_if_absent": ("put.delay", "put.error", "put.timeout", "cas.race"), "list": ("list.lag",)}
#: owner of the writer lease a cas.race takes over (it shows in the catalog and in the fenced
#: writer's error)
RACE_OWNER = "injected-race"

_totals: Counter = Counter()
_totals_lock = threading.Lock()


class InvalidFaultConfigError(ValueError):
    """A ``storage.faults.*`` option that is unknown or out of range (the message names it)."""


def injected_totals() -> dict[str, int]:
    """Faults injected in this process so far, by kind (every kind of :data:`FAULT_KINDS`)."""
    with _totals_lock:
        return {kind: _totals[kind] for kind in FAULT_KINDS}


def split_fault_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(fsspec options, fault options)``: the ``storage.faults.*`` entries split off."""
    faults = {k: v for k, v in options.items() if isinstance(k, str) and k.startswith(OPTION_PREFIX)}
    return {k: v for k, v in options.items() if k not in faults}, faults


def _number(key: str, value: Any, kind: type) -> Any:
    if isinstance(value, bool):
        raise InvalidFaultConfigError(f"storage option {key!r}: expected a number, got {value!r}")
    try:
        return kind(value)  # the CLI's -O gives strings
    except (TypeError, ValueError):
        raise InvalidFaultConfigError(f"storage option {key!r}: expected a number, got {value!r}") from None


class FaultSchedule:
    """The seeded fault schedule of one store.

    Args:
        options: the ``storage.faults.*`` entries: ``seed`` (int, default 0), ``<kind>.rate``
            for each kind of :data:`FAULT_KINDS` (float in [0, 1], default 0), ``get.delay.ms``
            and ``put.delay.ms`` (int >= 0, default 200), ``list.lag.ms`` (int >= 0, default
            1000). Values may be strings.

    Attributes:
        rates: ``{kind: rate}``; delays_ms: ``{"get"|"put": ms}``; injected: a Counter of the
            faults this schedule injected, by kind.

    Raises:
        InvalidFaultConfigError: an unknown ``storage.faults.*`` key, a rate outside [0, 1],
            a negative delay or a non-number.
    """

    def __init__(self, options: dict[str, Any]):
        self.rates = {kind: 0.0 for kind in FAULT_KINDS}
        self.delays_ms = {"get": 200, "put": 200, "list": 1000}
        seed = 0
        for key, value in options.items():
            if key == _SEED_KEY:
                seed = _number(key, value, int)
            elif key in _RATE_KEYS:
                rate = _number(key, value, float)
                if not 0.0 <= rate <= 1.0:
                    raise InvalidFaultConfigError(f"storage option {key!r}: a rate is in [0, 1], got {value!r}")
                self.rates[_RATE_KEYS[key]] = rate
            elif key in _MS_KEYS:
                ms = _number(key, value, int)
                if ms < 0:
                    raise InvalidFaultConfigError(f"storage option {key!r}: expected ms >= 0, got {value!r}")
                self.delays_ms[_MS_KEYS[key]] = ms
            else:
                known = ", ".join(sorted([_SEED_KEY, *_RATE_KEYS, *_MS_KEYS]))
                raise InvalidFaultConfigError(f"unknown storage option {key!r}: the fault options are {known}")
        self.seed = seed
        self.injected: Counter = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def _draw(self, operation: str) -> set[str]:
        """The kinds that fire for one ``operation`` ("get", "put", "put_if_absent", "list"),
        counted (``list.lag`` is counted by :meth:`count` once it omitted something)."""
        with self._lock:
            fired = {kind for kind in _DRAWN[operation] if self.rates[kind] and self._rng.random() < self.rates[kind]}
            if "put.error" in fired:  # a PUT that failed before writing cannot also time out after it
                fired.discard("put.timeout")
            counted = fired - {"list.lag", "cas.race"}  # counted once they took effect
            self.injected.update(counted)
            flip = self._rng.random() < 0.5
        with _totals_lock:
            _totals.update(counted)
        if flip:
            fired.add("reset")
        return fired

    def count(self, kind: str) -> None:
        """Count one injected fault of ``kind`` (on this schedule and process-wide)."""
        with self._lock:
            self.injected[kind] += 1
        with _totals_lock:
            _totals[kind] += 1

    def _lagging(self, store, key: str, now_ms: int) -> bool:
        """Whether a lagging LIST omits ``key``: modified within the last ``list.lag.ms``."""
        from .storage import _mtime_ms

        try:
            return _mtime_ms(store.fs.info(store.fs_path(key))) > now_ms - self.delays_ms["list"]
        except FileNotFoundError:
            return True  # deleted since it was listed: a stale listing may omit it too

    def _wrap_list(self, store, name: str, method: Callable) -> Callable:
        """``list``/``first_key_after`` of ``store``, omitting recent objects when ``list.lag`` fires."""

        def lagging(prefix="", *args, **kwargs):
            fired = self._draw("list")
            result = method(prefix, *args, **kwargs)
            if "list.lag" not in fired:
                return result
            now_ms = int(time.time() * 1000)
            if name == "list":
                kept = [o for o in result if o.mtime_ms <= now_ms - self.delays_ms["list"]]
                omitted = len(kept) < len(result)
                result = kept
            else:  # first_key_after(prefix, after): the first key past the recent ones
                omitted = False
                while result is not None and self._lagging(store, result, now_ms):
                    omitted = True
                    result = method(prefix, result)
            if omitted:
                self.count("list.lag")
            return result

        lagging.__doc__ = method.__doc__
        return lagging

    def _race(self, store, key: str) -> None:
        """Before ``put_if_absent(key)`` of catalog commit N: another writer takes the lease over
        at N (next lease epoch, owner :data:`RACE_OWNER`) and releases it at N+1."""
        from txlake.formats.catalog_actions import COMMIT_KIND, encode_actions

        from .catalog import COMMITS_PREFIX, Catalog, commit_key
        from .state import LEASE, LEASE_RELEASE
        from .storage import ObjectStore

        version = int(key[len(COMMITS_PREFIX):].split(".", 1)[0])
        clean = ObjectStore(store.url, split_fault_options(store.storage_options)[0])
        catalog = Catalog.open(clean)
        if catalog.version != version - 1:  # not the next number: no race to lose
            return
        lease = catalog.state.lease
        epoch = (lease.epoch if lease is not None else 0) + 1
        now_ms = int(time.time() * 1000)
        actions = [[{"action": LEASE, "owner": RACE_OWNER, "lease_epoch": epoch, "lease_ms": 15_000,
                     "timestamp_ms": now_ms, "info": "{}"}],
                   [{"action": LEASE_RELEASE, "owner": RACE_OWNER, "lease_epoch": epoch}]]
        for n, acts in enumerate(actions):
            if not clean.put_if_absent(commit_key(version + n), encode_actions(acts, COMMIT_KIND, version + n)):
                return  # a real writer was faster
        self.count("cas.race")

    def wrap(self, name: str, method: Callable, url_of: Callable[[str], str], store=None) -> Callable:
        """``method`` (the ObjectStore method ``name``) with this schedule's faults around it
        (``store``: the store it belongs to, for LIST lags and races)."""
        from .storage import StorageError

        operation = _OPERATIONS[name]
        if operation == "list":
            return self._wrap_list(store, name, method)

        def faulty(key, *args, **kwargs):
            fired = self._draw(name if name == "put_if_absent" else operation)
            if "cas.race" in fired and key.startswith("_catalog/commits/"):
                self._race(store, key)
            if f"{operation}.delay" in fired:
                time.sleep(self.delays_ms[operation] / 1000)
            if f"{operation}.error" in fired:
                cause: Exception = (ConnectionResetError(104, "Connection reset by peer (injected fault)")
                                    if "reset" in fired else
                                    OSError("503 SlowDown: Please reduce your request rate (injected fault)"))
                raise StorageError(url_of(key), name, f"{type(cause).__name__}: {cause}") from cause
            result = method(key, *args, **kwargs)
            if "put.timeout" in fired:
                cause = TimeoutError("Read timeout on endpoint URL (injected fault: the PUT was applied)")
                raise StorageError(url_of(key), name, f"{type(cause).__name__}: {cause}") from cause
            return result

        faulty.__doc__ = method.__doc__
        return faulty

    def install(self, store) -> None:
        """Wrap ``store``'s GET and PUT methods (instance attributes shadow the class's)."""
        for name in _OPERATIONS:
            setattr(store, name, self.wrap(name, getattr(store, name), store.uri, store))
