"""Hand-over of a write to the writer-lease holder, through the storage root.

One process per storage root holds the writer lease (catalog/writer_lease.py). Another
process that needs a write while that holder lives -- a PySpark worker committing a job
while a notebook's producer is still open on the same root -- cannot take the lease. It
hands the work to the holder instead, with three kinds of objects under ``_handoff/``:

* ``requests/<id>.json`` -- written by the requester: ``{"id", "kind", "payload",
  "requester", "created_ms"}``;
* ``claims/<id>`` -- created with create-if-absent, so exactly one side owns the request:
  ``run`` by the holder before it runs it, ``cancelled`` by a requester that gives up (it
  may then do the work itself, e.g. after the holder released the lease). A claim outlives
  its request (holders remove claims after :data:`CLAIM_RETENTION_MS`, and never run a
  request older than half of that), so no request runs twice;
* ``responses/<id>.json`` -- written by the holder once the work is done:
  ``{"ok": true, "result": {...}}`` or ``{"ok": false, "error": "..."}``.

The holder's broker runs a :class:`HandoffServer` while it holds the lease: every
``storage.handoff.poll.ms`` (default 500) it lists the requests, claims each, runs the
handler registered for its kind and writes the response. Handlers are registered by the
layers above the engine (:func:`register_handler`); the engine runs them without knowing
them. A request is run at most once: its claim is created once.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Callable, Mapping

from txlake.catalog.storage import ObjectStore

log = logging.getLogger(__name__)

HANDOFF_PREFIX = "_handoff/"
REQUESTS_PREFIX = HANDOFF_PREFIX + "requests/"
CLAIMS_PREFIX = HANDOFF_PREFIX + "claims/"
RESPONSES_PREFIX = HANDOFF_PREFIX + "responses/"
CLAIM_RUN = b"run"
CLAIM_CANCELLED = b"cancelled"
#: ms between a requester's looks for its response
RESPONSE_POLL_MS = 100
#: a claim is kept this long (ms): while it exists its request can never run again, so no
#: request older than half of it is ever run (the requester has long given up on it)
CLAIM_RETENTION_MS = 3_600_000

Handler = Callable[[ObjectStore, dict], dict]
_handlers: dict[str, Handler] = {}
_handlers_lock = threading.Lock()


class HandoffError(Exception):
    """The holder ran the request and it failed (the message is the holder's error)."""


class HandoffCancelled(Exception):
    """The requester withdrew its request before the holder claimed it: nobody ran it."""


def register_handler(kind: str, handler: Handler) -> None:
    """Let a lease holder run requests of ``kind``: ``handler(store, payload) -> result``, where
    ``store`` is the holder's own :class:`ObjectStore` of the root (its storage options, not the
    requester's) and payload and result are JSON dicts; an exception becomes an error
    response. Registering a kind again replaces it."""
    with _handlers_lock:
        _handlers[kind] = handler


def _handler(kind: str) -> Handler | None:
    with _handlers_lock:
        return _handlers.get(kind)


def _request_key(request_id: str) -> str:
    return f"{REQUESTS_PREFIX}{request_id}.json"


def _response_key(request_id: str) -> str:
    return f"{RESPONSES_PREFIX}{request_id}.json"


def _claim_key(request_id: str) -> str:
    return f"{CLAIMS_PREFIX}{request_id}"


def submit(store: ObjectStore, kind: str, payload: dict, timeout_s: float,
           give_up: Callable[[], bool] = lambda: False) -> dict:
    """Hand a request to the lease holder of ``store`` and wait for its result.

    Args:
        kind: the handler to run (see :func:`register_handler`).
        payload: the handler's JSON argument.
        timeout_s: how long to wait for the holder to claim the request; once claimed,
            the requester waits for the response as long again.
        give_up: polled while the request is unclaimed; True withdraws it early (e.g. the
            lease was released, so the requester can take it and do the work itself).

    Returns:
        The handler's result.

    Raises:
        HandoffCancelled: nobody claimed the request in time (or ``give_up`` said so); it
            was withdrawn and will never run.
        HandoffError: the holder ran it and it failed, or the claimed request got no
            response in time (the message says which).
    """
    request_id = f"{int(time.time() * 1000):013d}-{uuid.uuid4().hex}"
    body = {"id": request_id, "kind": kind, "payload": payload, "created_ms": int(time.time() * 1000),
            "requester": f"{socket.gethostname()}:{os.getpid()}"}
    store.put(_request_key(request_id), json.dumps(body).encode())
    try:
        deadline = time.monotonic() + timeout_s
        claimed = False
        while True:
            response = store.get_or_none(_response_key(request_id))
            if response is not None:
                answer = json.loads(response)
                if not answer.get("ok"):
                    raise HandoffError(answer.get("error") or "the lease holder reported a failure")
                return answer.get("result") or {}
            if not claimed:
                claimed = store.get_or_none(_claim_key(request_id)) == CLAIM_RUN
                if claimed:
                    deadline = time.monotonic() + timeout_s  # the holder is running it
                elif time.monotonic() >= deadline or give_up():
                    if store.put_if_absent(_claim_key(request_id), CLAIM_CANCELLED):
                        raise HandoffCancelled(f"no writer-lease holder of {store.url} took request {request_id} "
                                               f"({kind}) within {timeout_s:.0f} s")
                    claimed = True  # the holder claimed it just now: wait for its response
                    deadline = time.monotonic() + timeout_s
            elif time.monotonic() >= deadline:
                raise HandoffError(f"the writer-lease holder of {store.url} claimed request {request_id} ({kind}) "
                                   f"but gave no response within {timeout_s:.0f} s; it may have died while running "
                                   "it -- check the data before retrying")
            time.sleep(RESPONSE_POLL_MS / 1000)
    finally:
        # the claim stays: it is what keeps the holder from running the request twice (the
        # holder may have listed the request before it was deleted); holders remove old claims
        for key in (_request_key(request_id), _response_key(request_id)):
            try:
                store.delete(key)
            except Exception:  # noqa: BLE001 - leftovers are harmless (the holder skips claimed ids)
                pass


class HandoffServer:
    """The lease holder's side: runs handed-over requests (one at a time, in id order).

    Args:
        store: the storage root.
        poll_ms: ms between looks for new requests.
        may_run: True while this process may write (holds the lease, not fenced); requests
            are left alone otherwise.
    """

    def __init__(self, store: ObjectStore, poll_ms: int, may_run: Callable[[], bool],
                 handlers: Mapping[str, Handler] | None = None):
        assert poll_ms > 0
        self.store = store
        #: kinds this holder serves itself (its request surface's), before the registered ones
        self.handlers: Mapping[str, Handler] = handlers if handlers is not None else {}
        self.poll_ms = poll_ms
        self._may_run = may_run
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start polling from a daemon thread."""
        self._thread = threading.Thread(target=self._loop, name="txlake-handoff", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop polling (a request being run finishes first)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            # (a handler's client may close the broker from this very thread: no self-join)
            self._thread.join(timeout=60)
        self._thread = None

    def _loop(self) -> None:
        failing = False
        while not self._stop.wait(self.poll_ms / 1000):
            try:
                self.run_pending()
                failing = False
            except Exception as exc:  # noqa: BLE001 - keep serving; the next round retries
                # once per outage, not every poll (the writer's own commits report storage errors)
                (log.debug if failing else log.warning)("hand-over poll of %s failed: %s", self.store.url, exc)
                failing = True

    def run_pending(self, now_ms: int | None = None) -> int:
        """Claim and run every request waiting now; returns how many were run. Requests older
        than half of :data:`CLAIM_RETENTION_MS` are dropped unrun, and older claims removed."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        ran = 0
        for info in self.store.list(REQUESTS_PREFIX):
            if self._stop.is_set() or not self._may_run():
                break
            raw = self.store.get_or_none(info.key)
            if raw is None:
                continue  # withdrawn meanwhile
            request = json.loads(raw)
            request_id = request["id"]
            if now_ms - int(request.get("created_ms", 0)) > CLAIM_RETENTION_MS // 2:
                log.warning("dropping hand-over request %s: older than %d s", request_id, CLAIM_RETENTION_MS // 2000)
                self.store.put_if_absent(_claim_key(request_id), CLAIM_CANCELLED)
                self.store.delete(info.key)
                continue
            if not self.store.put_if_absent(_claim_key(request_id), CLAIM_RUN):
                continue  # cancelled by its requester, or already run
            self.store.put(_response_key(request_id), json.dumps(self._run(request)).encode())
            ran += 1
        for info in self.store.list(CLAIMS_PREFIX):
            if now_ms - info.mtime_ms > CLAIM_RETENTION_MS:
                self.store.delete(info.key)
        return ran

    def _run(self, request: dict) -> dict:
        kind = request.get("kind")
        handler = self.handlers.get(kind) or _handler(kind)
        if handler is None:
            return {"ok": False, "error": f"the writer-lease holder cannot run {kind!r} requests (no handler)"}
        try:
            log.info("running handed-over %s request %s from %s", kind, request["id"], request.get("requester"))
            return {"ok": True, "result": handler(self.store, request.get("payload") or {})}
        except Exception as exc:  # noqa: BLE001 - the requester gets the error
            log.warning("handed-over %s request %s failed: %s", kind, request["id"], exc)
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
