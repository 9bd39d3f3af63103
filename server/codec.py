"""Kafka's request framing and message codecs for ``txlake serve``.

A Kafka request on the wire is a size-prefixed frame (int32 big-endian length, then that
many bytes) holding a request header and the request body; the response frame holds a
response header (the request's correlation id) and the body. Which header version a
message uses depends on whether its API version is *flexible* (KIP-482: compact strings
and arrays, tagged fields): request header v1 (api key, api version, correlation id,
client id) or v2 (v1 plus tagged fields), response header v0 (correlation id) or v1
(plus tagged fields) -- except ApiVersions, whose response header is always v0 so that a
client can read it before it knows the broker's versions (KIP-511).

The bodies are encoded and decoded by kafka-python 3's protocol layer, which is generated
from Kafka's own JSON message schemas (``clients/src/main/resources/common/message``) and
decodes requests as well as responses (docs/server.md explains the choice). Nothing in
this module knows what a request means: it only turns frames into message objects and
back.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from kafka.protocol.schemas.fields.codecs import EncodeBuffer

from txlake.engine.apis.messages import REQUEST_CLASSES, RESPONSE_CLASSES, schema_versions

#: ApiKey.ApiVersions
API_VERSIONS_KEY = 18
#: ApiKey.Fetch
FETCH_KEY = 1
#: a response's buffer besides a Fetch response's record batches (it grows if a response needs more)
_BUFFER_BYTES = 64 * 1024

_HEAD = struct.Struct(">hhi")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")


class MalformedRequestError(Exception):
    """A frame that is not a Kafka request this server can parse (the connection is closed).

    Attributes:
        api_key / api_version / correlation_id: what the header said, when it could be read (else None).
    """

    def __init__(self, message: str, api_key: int | None = None, api_version: int | None = None,
                 correlation_id: int | None = None):
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass
class RequestFrame:
    """One parsed request frame.

    Attributes:
        api_key / api_version / correlation_id / client_id: the request header.
        body: the decoded request (a kafka-python message object), or None when the version
            is outside Kafka's schema for this API (only an ApiVersions request may be
            answered then, with UNSUPPORTED_VERSION: KIP-511).
        size: the frame's size in bytes (without its length prefix).
    """

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    size: int


def parse_request(frame: bytes | memoryview) -> RequestFrame:
    """Decode a request frame (the bytes after its int32 length).

    Raises:
        MalformedRequestError: the header cannot be read, the API key is unknown, or the body
            does not decode at the header's version (with what the header said, so the caller
            can name it in its log line).
    """
    view = memoryview(frame)
    if len(view) < _HEAD.size + 2:
        raise MalformedRequestError(f"a request frame of {len(view)} bytes is shorter than a request header")
    api_key, api_version, correlation_id = _HEAD.unpack_from(view, 0)
    (client_len,) = _INT16.unpack_from(view, _HEAD.size)
    pos = _HEAD.size + 2
    if client_len < -1 or pos + max(client_len, 0) > len(view):
        raise MalformedRequestError(f"bad client id length {client_len}", api_key, api_version, correlation_id)
    client_id = None if client_len == -1 else bytes(view[pos:pos + client_len]).decode("utf-8", "replace")
    pos += max(client_len, 0)
    cls = REQUEST_CLASSES.get(api_key)
    if cls is None:
        raise MalformedRequestError(f"unknown API key {api_key}", api_key, api_version, correlation_id)
    low, high = schema_versions(api_key)  # type: ignore[misc]
    if not low <= api_version <= high:
        if api_key == API_VERSIONS_KEY:
            return RequestFrame(api_key, api_version, correlation_id, client_id, None, len(view))
        raise MalformedRequestError(f"{cls.name} version {api_version} is outside Kafka's versions {low}-{high}",
                                    api_key, api_version, correlation_id)
    try:
        if cls.flexible_version_q(api_version):  # request header v2: tagged fields after the client id
            pos = _skip_tagged_fields(view, pos)
        body = cls.decode(view[pos:], version=api_version)
    except MalformedRequestError as exc:
        raise MalformedRequestError(f"{cls.name} v{api_version}: {exc}", api_key, api_version, correlation_id) from exc
    except Exception as exc:  # kafka-python raises ValueError, struct.error, IndexError, UnicodeDecodeError...
        raise MalformedRequestError(f"cannot decode {cls.name} v{api_version}: {type(exc).__name__}: {exc}",
                                    api_key, api_version, correlation_id) from exc
    return RequestFrame(api_key, api_version, correlation_id, client_id, body, len(view))


def _read_uvarint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(view):
            raise MalformedRequestError("truncated varint in the request header")
        b = view[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise MalformedRequestError("varint longer than 5 bytes in the request header")


def _skip_tagged_fields(view: memoryview, pos: int) -> int:
    count, pos = _read_uvarint(view, pos)
    for _ in range(count):
        _, pos = _read_uvarint(view, pos)
        size, pos = _read_uvarint(view, pos)
        pos += size
        if pos > len(view):
            raise MalformedRequestError("truncated tagged field in the request header")
    return pos


def encode_response(api_key: int, api_version: int, correlation_id: int, response: Any) -> memoryview:
    """A framed response: int32 length, response header (v1 for a flexible version, else v0;
    always v0 for ApiVersions), then ``response`` encoded at ``api_version``.

    The frame is written into one buffer sized for it and returned as a view of it: a Fetch
    response's record batches (tens of MB) are copied once, into it, instead of through
    kafka-python's pooled buffer, a slice of it and a concatenation (four copies); and a
    view's tail is sliced without a copy when a socket takes only part of it (asyncio's
    transport slices what ``send`` left over).
    """
    cls = RESPONSE_CLASSES[api_key]
    flexible = cls.flexible_version_q(api_version)
    header = _INT32.pack(correlation_id) + (b"\x00" if flexible and api_key != API_VERSIONS_KEY else b"")
    out = EncodeBuffer(_BUFFER_BYTES + (_records_bytes(response) if api_key == FETCH_KEY else 0))
    start = 4 + len(header)
    out.buf[4:start] = header
    out.pos = start
    # what ApiMessage.encode does, into our buffer rather than its thread's pooled one
    response.API_VERSION = api_version
    response._struct.compiled_encode_into(api_version, compact=flexible, tagged=flexible)(response, out)
    _INT32.pack_into(out.buf, 0, out.pos - 4)
    return memoryview(out.buf)[:out.pos]


def _records_bytes(response: Any) -> int:
    """Bytes of the record batches a Fetch response carries."""
    return sum(len(p.records) for t in response.responses or () for p in t.partitions or () if p.records is not None)
