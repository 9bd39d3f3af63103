"""One embedded broker per storage root per process, shared by every client (API.md).

Clients acquire the broker of their ``storage.url`` and release it when closed; the
last release closes it (flush, producer-state snapshot, writer lease released). At
interpreter exit every broker still open is closed the same way, so a process that
exits cleanly never leaves a lease for the next writer to wait out.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

from txlake.catalog.storage import ObjectStore

from .broker import Broker, BrokerConfig

_lock = threading.Lock()
_brokers: dict[str, list] = {}  # normalised url -> [broker, refcount]


def acquire_broker(url: str, storage_options: dict[str, Any] | None = None,
                   config: BrokerConfig | None = None) -> Broker:
    """The shared broker of ``url`` (opened on first use; later configs are ignored)."""
    store = ObjectStore(url, storage_options)
    with _lock:
        entry = _brokers.get(store.url)
        if entry is None or entry[0]._closed:
            entry = _brokers[store.url] = [Broker(store, config), 0]
        entry[1] += 1
        return entry[0]


def release_broker(broker: Broker) -> None:
    """Drop one reference; the last one closes the broker."""
    with _lock:
        entry = _brokers.get(broker.store.url)
        if entry is None or entry[0] is not broker:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _brokers[broker.store.url]
    broker.close()


def close_stopped() -> int:
    """Close every open broker whose writer stopped (fenced: another process took the lease
    over; or failed), so the next client of its root opens it again and takes the lease, as a
    restarted process would (``txlake verify`` between trials). Returns how many it closed."""
    with _lock:
        stopped = [url for url, (broker, _) in _brokers.items() if broker._fatal is not None]
        brokers = [_brokers.pop(url)[0] for url in stopped]
    for broker in brokers:
        broker.close()
    return len(brokers)


def close_all() -> None:
    """Close every open broker (what a clean interpreter exit does)."""
    with _lock:
        brokers = [e[0] for e in _brokers.values()]
        _brokers.clear()
    for broker in brokers:
        broker.close()


# Run before the interpreter shuts down its thread pools (which s3fs/aiohttp need to
# write the final snapshot and the lease release); plain atexit runs too late for that.
try:
    threading._register_atexit(close_all)  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):
    atexit.register(close_all)
