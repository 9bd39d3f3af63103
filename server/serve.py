"""Running ``txlake serve``: open the storage root as its writer, listen, stop cleanly.

Start-up takes the writer lease of the root (so a second server, or an embedded writer, on
the same root is refused with the holder's name), then listens and prints
``txlake serve: listening on HOST:PORT``. SIGTERM or SIGINT stops accepting, answers what is
in flight, commits what is queued and releases the lease (Kafka's controlled shutdown);
after a SIGKILL a restart on the same root recovers everything acknowledged (the lease is
taken over once its holder's heartbeats stop).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from typing import Any, Callable

from txlake.catalog.errors import WriterLeaseHeldError
from txlake.catalog.storage import ObjectStore
from txlake.engine.apis import KafkaApis
from txlake.engine.broker import Broker, BrokerConfig
from txlake.engine.errors import ApiError, Errors

from .network import DEFAULT_MAX_REQUEST_BYTES, KafkaServer

log = logging.getLogger(__name__)


def parse_listener(text: str, what: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` -> ``(host, port)``.

    Raises:
        ValueError: naming ``what`` and the text when it is not HOST:PORT with a port in 0..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{what} must be HOST:PORT with a port 0..65535, got {text!r}")
    return host.strip("[]"), int(port)


def serve(url: str, storage_options: dict[str, Any] | None = None, listen: str = "127.0.0.1:9092",
          advertised_listener: str | None = None, config: BrokerConfig | None = None,
          max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
          announce: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
    """Serve the Kafka protocol over the storage root ``url`` until SIGTERM/SIGINT.

    Args:
        listen: ``HOST:PORT`` to bind (port 0 picks a free one; the announced line names it).
        advertised_listener: ``HOST:PORT`` Metadata names as the broker (default: the bound address).
        config: the engine's settings (``storage.*``).
        max_request_bytes: Kafka's ``socket.request.max.bytes``.

    Raises:
        ApiError: NOT_LEADER_OR_FOLLOWER when another live writer holds the root's lease.
        OSError: the address cannot be bound.
    """
    host, port = parse_listener(listen)
    advertised = parse_listener(advertised_listener, "--advertised-listener") if advertised_listener else None
    broker = Broker(ObjectStore(url, storage_options), config)
    try:
        _take_lease(broker)
        asyncio.run(_run(broker, host, port, advertised, max_request_bytes, announce))
    finally:
        broker.close()


def _take_lease(broker: Broker) -> None:
    """Become the root's writer. A lease whose holder stopped renewing (a server killed with
    SIGKILL, restarted at once) is waited out once, then taken over; a holder that is still
    renewing after that wait is alive, and start-up fails naming it (NOT_LEADER_OR_FOLLOWER)."""
    waited_for: str | None = None
    while True:
        try:
            broker.ensure_writer()
            return
        except ApiError as exc:
            held = exc.__cause__
            if exc.error != Errors.NOT_LEADER_OR_FOLLOWER or not isinstance(held, WriterLeaseHeldError) \
                    or held.holder == waited_for:
                raise
            wait_s = held.expires_in_ms / 1000 + 0.5
            log.warning("the writer lease of %s is held by %s: waiting %.1f s for it to lapse (a server restarted "
                        "after a crash takes the lease over then; a live holder keeps it and this start fails)",
                        broker.store.url, held.holder, wait_s)
            waited_for = held.holder
            time.sleep(wait_s)


async def _run(broker: Broker, host: str, port: int, advertised: tuple[str, int] | None,
               max_request_bytes: int, announce: Callable[[str], None]) -> None:
    apis = KafkaApis(broker, host, port)
    server = KafkaServer(apis, host, port, max_request_bytes)
    await server.start()
    apis.host, apis.port = advertised if advertised is not None else (host, server.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    announce(f"txlake serve: listening on {host}:{server.port}")
    await stop.wait()
    log.info("txlake serve: stopping (a signal was received)")
    await server.stop()
    print("txlake serve: stopped", file=sys.stderr, flush=True)
