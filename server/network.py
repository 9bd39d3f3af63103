"""The TCP side of ``txlake serve``: connections, framing, ordering (Kafka's ``SocketServer``).

One asyncio event loop accepts connections and reads size-prefixed frames. Each request
is decoded (:mod:`.codec`) and handed to the engine's request surface
(:class:`txlake.engine.apis.KafkaApis`) on a worker thread, because engine calls block
(object storage, commits). Several requests of one connection may be in flight at once
(librdkafka pipelines them): they reach the engine one after the other in the order they
arrived (a Produce is handed to the engine before the next request of its connection is
looked at, so an idempotent producer's pipelined batches are appended in sequence order, as
Kafka's per-connection muting guarantees), and their responses are written in request order.

Defences (no request can take the server down):

* a frame larger than ``socket.request.max.bytes`` (Kafka's default 100 MiB) is refused
  before its body is read: the connection is closed with a log line naming the peer;
* a frame that does not parse, an unknown API key, or a version the engine does not
  implement and cannot answer: the connection is closed with a log line naming the peer,
  the API and the version (an ApiVersions request of an unknown version is answered with
  UNSUPPORTED_VERSION at v0, KIP-511);
* a handler that fails answers UNKNOWN_SERVER_ERROR where the API has an error response,
  else the connection is closed; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from txlake.engine.apis import KafkaApis, RequestContext, UnsupportedRequest

from .codec import API_VERSIONS_KEY, MalformedRequestError, RequestFrame, encode_response, parse_request

log = logging.getLogger(__name__)

#: Kafka's ``socket.request.max.bytes`` default
DEFAULT_MAX_REQUEST_BYTES = 104_857_600
#: requests of one connection read ahead of the response being written (Kafka lets a client
#: have ``max.in.flight.requests.per.connection`` outstanding; librdkafka's default is 1 000 000)
MAX_IN_FLIGHT_PER_CONNECTION = 64
_SIZE = struct.Struct(">i")
#: responses are written in slices of this many bytes (see _send_one)
WRITE_SLICE_BYTES = 1024 * 1024
#: at shutdown, how long (s) requests already read may take to be answered
STOP_GRACE_S = 5.0


class KafkaServer:
    """Serves the Kafka protocol for one :class:`KafkaApis` on ``host:port``.

    Args:
        apis: the request surface.
        host / port: where to listen (port 0: any free port; :attr:`port` has the one taken).
        max_request_bytes: ``socket.request.max.bytes``.
        workers: threads that run handlers (engine calls block).
    """

    def __init__(self, apis: KafkaApis, host: str, port: int, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 workers: int = 32):
        self.apis = apis
        self.host = host
        self.port = port
        self.max_request_bytes = max_request_bytes
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="txlake-request")
        self._server: asyncio.AbstractServer | None = None
        #: live connections: their task -> their stream writer (closed at stop)
        self._connections: dict[asyncio.Task, asyncio.StreamWriter] = {}
        #: requests read and not yet answered (or dropped), over all connections
        self._in_flight = 0

    async def start(self) -> None:
        """Bind and start accepting connections."""
        self._server = await asyncio.start_server(self._connection, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting, answer what is in flight, close every connection."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        # closing a connection's transport ends its read loop (EOF) after the requests it
        # already read are answered; a connection still busy after a grace period is cancelled
        for writer in list(self._connections.values()):
            writer.transport.pause_reading()
        deadline = asyncio.get_running_loop().time() + STOP_GRACE_S
        while self._in_flight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        for writer in list(self._connections.values()):
            writer.close()
        tasks = list(self._connections)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=1.0)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        self._pool.shutdown(wait=True, cancel_futures=False)

    # ------------------------------------------------------------------ one connection
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        peer = writer.get_extra_info("peername")
        peer_name = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        responses: asyncio.Queue = asyncio.Queue(maxsize=MAX_IN_FLIGHT_PER_CONNECTION)
        sender = asyncio.create_task(self._send(responses, writer, peer_name))
        #: done when the previous request of this connection has been handed to the engine
        previous: asyncio.Future | None = None
        try:
            while True:
                try:
                    head = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                (size,) = _SIZE.unpack(head)
                if size < 0 or size > self.max_request_bytes:
                    log.warning("closing the connection from %s: a request of %d bytes is larger than "
                                "socket.request.max.bytes=%d", peer_name, size, self.max_request_bytes)
                    break
                try:
                    frame = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                try:
                    request = parse_request(frame)
                except MalformedRequestError as exc:
                    log.warning("closing the connection from %s: malformed request (api key %s, version %s, "
                                "correlation id %s): %s", peer_name, exc.api_key, exc.api_version,
                                exc.correlation_id, exc)
                    break
                except Exception as exc:  # a codec bug, not the client's fault: say so, keep serving others
                    log.error("closing the connection from %s: cannot parse a request of %d bytes: %s",
                              peer_name, size, exc, exc_info=exc)
                    break
                context = RequestContext(request.api_key, request.api_version, request.correlation_id,
                                         request.client_id or "", peer[0] if isinstance(peer, tuple) else "")
                self._in_flight += 1
                handed = asyncio.get_running_loop().create_future()
                await responses.put(asyncio.ensure_future(self._answer(context, request, peer_name, previous, handed)))
                previous = handed
        finally:
            await responses.put(None)
            try:
                await sender
            except Exception:
                pass
            writer.close()
            try:
                await writer.wait_closed()
            except Exception:
                pass
            self._connections.pop(task, None)

    async def _answer(self, context: RequestContext, request: RequestFrame, peer_name: str,
                      previous: asyncio.Future | None, handed: asyncio.Future) -> bytes | None:
        """The framed response to one request, None when none is sent (acks=0), or raises
        :class:`UnsupportedRequest` (the connection is closed).

        The engine gets the request only once ``previous`` (the connection's request before it)
        is done being handed over; ``handed`` is set when this one is (a Produce is then queued
        for its commit, whose answer comes later as a Future). Without this two pipelined
        Produce requests of one idempotent producer could reach the partition in either order,
        and the later one would be refused with OUT_OF_ORDER_SEQUENCE_NUMBER (the Java client
        then aborts its transaction: the failure TransactionalMessageCopier showed)."""
        loop = asyncio.get_running_loop()
        body = request.body
        try:
            if previous is not None:
                await asyncio.shield(previous)
            if body is None:  # only ApiVersions of a version beyond Kafka's schema gets here
                assert request.api_key == API_VERSIONS_KEY
                result = await loop.run_in_executor(self._pool, self.apis.handle, context, None)
                return encode_response(request.api_key, 0, request.correlation_id, result)
            result = await loop.run_in_executor(self._pool, self.apis.handle, context, body)
        finally:
            if not handed.done():
                handed.set_result(None)
        if isinstance(result, Future):
            result = await asyncio.wrap_future(result)
        if result is None:
            return None
        return await loop.run_in_executor(self._pool, _encode, request, result)

    async def _send(self, responses: asyncio.Queue, writer: asyncio.StreamWriter, peer_name: str) -> None:
        """Write the responses in request order; after a failure, drop the rest (the connection closes)."""
        broken = False
        while True:
            pending = await responses.get()
            if pending is None:
                return
            try:
                await self._send_one(pending, writer, peer_name, broken)
            except _Broken:
                broken = True
                writer.close()
            finally:
                self._in_flight -= 1

    async def _send_one(self, pending: asyncio.Future, writer: asyncio.StreamWriter, peer_name: str,
                        broken: bool) -> None:
        """Write one response (raises :class:`_Broken` when the connection must close)."""
        if broken:
            pending.cancel()
            return
        try:
            data = await pending
        except UnsupportedRequest as exc:
            log.warning("closing the connection from %s: %s", peer_name, exc)
            raise _Broken from exc
        except Exception as exc:  # a bug: say so, close this connection, keep serving others
            log.error("closing the connection from %s: unexpected error answering a request: %s",
                      peer_name, exc, exc_info=exc)
            raise _Broken from exc
        if data is None:
            return
        try:
            # a large response goes out in slices, each drained before the next: asyncio's transport
            # copies whatever the socket does not take at once into its own buffer, which for a
            # 40 MB Fetch response would be a second copy of it
            view = memoryview(data)
            for start in range(0, len(view), WRITE_SLICE_BYTES):
                writer.write(view[start:start + WRITE_SLICE_BYTES])
                await writer.drain()
        except ConnectionError as exc:
            raise _Broken from exc


class _Broken(Exception):
    """The connection cannot go on (its remaining responses are dropped)."""


def _encode(request: RequestFrame, response: Any) -> bytes:
    return encode_response(request.api_key, request.api_version, request.correlation_id, response)
