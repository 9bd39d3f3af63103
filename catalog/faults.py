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

Not modelled here (yet): LIST results that lag behind, a create-if-absent losing a race
(real races come from a second writer: the catalog tests run those), reads through
:meth:`~.storage.ObjectStore.arrow_filesystem` (Parquet data reads bypass the wrapper).

Every injected fault is counted per kind on the schedule (:attr:`FaultSchedule.injected`)
and process-wide (:func:`injected_totals`).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any, Callable

__all__ = ["FAULT_KINDS", "OPTION_PREFIX", "FaultSchedule", "InvalidFaultConfigError", "injected_totals",
           "split_fault_options"]

#: Storage-option prefix of the fault settings.
OPTION_PREFIX = "storage.faults."

#: The fault kinds, in the order they are drawn for an operation.
FAULT_KINDS = ("get.delay", "get.error", "put.delay", "put.error", "put.timeout")

_RATE_KEYS = {f"{OPTION_PREFIX}{kind}.rate": kind for kind in FAULT_KINDS}
_MS_KEYS = {f"{OPTION_PREFIX}get.delay.ms": "get", f"{OPTION_PREFIX}put.delay.ms": "put"}
_SEED_KEY = f"{OPTION_PREFIX}seed"

# ObjectStore method -> the operation class it belongs to.
_OPERATIONS = {"get": "get", "open_input": "get", "put": "put", "put_if_absent": "put"}

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
            and ``put.delay.ms`` (int >= 0, default 200). Values may be strings.

    Attributes:
        rates: ``{kind: rate}``; delays_ms: ``{"get"|"put": ms}``; injected: a Counter of the
            faults this schedule injected, by kind.

    Raises:
        InvalidFaultConfigError: an unknown ``storage.faults.*`` key, a rate outside [0, 1],
            a negative delay or a non-number.
    """

    def __init__(self, options: dict[str, Any]):
        self.rates = {kind: 0.0 for kind in FAULT_KINDS}
        self.delays_ms = {"get": 200, "put": 200}
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
        """The kinds that fire for one ``operation`` ("get"/"put"), counted."""
        with self._lock:
            fired = {kind for kind in FAULT_KINDS
                     if kind.startswith(operation + ".") and self.rates[kind] and self._rng.random() < self.rates[kind]}
            if "put.error" in fired:  # a PUT that failed before writing cannot also time out after it
                fired.discard("put.timeout")
            self.injected.update(fired)
            flip = self._rng.random() < 0.5
        with _totals_lock:
            _totals.update(fired)
        if flip:
            fired.add("reset")
        return fired

    def wrap(self, name: str, method: Callable, url_of: Callable[[str], str]) -> Callable:
        """``method`` (the ObjectStore method ``name``) with this schedule's faults around it."""
        from .storage import StorageError

        operation = _OPERATIONS[name]

        def faulty(key, *args, **kwargs):
            fired = self._draw(operation)
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
            setattr(store, name, self.wrap(name, getattr(store, name), store.uri))
