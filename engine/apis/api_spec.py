"""The shapes shared by the request surface and its handler modules (after Kafka's
``RequestContext`` and ``ApiKeys``): who asked, one API's registration, and the node a
handler is given.

Handler modules (:mod:`.cluster`, :mod:`.log_apis`, :mod:`.topic_apis`, :mod:`.group_apis`,
:mod:`.txn_apis`, :mod:`.acl_apis`)
import this module, never :mod:`.kafka_apis`, which imports them to list their APIs: the
engine has no import circle (``tests/test_engine_layering.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from kafka.protocol.api_key import ApiKey

from ..broker import Broker
from ..errors import Errors

#: what a handler returns: the response, a Future of it, or None (no response is sent)
HandlerResult = Any
Handler = Callable[["ApiNode", "RequestContext", Any], HandlerResult]
#: builds the response that answers a request with one error everywhere (Kafka's ``getErrorResponse``)
ErrorResponse = Callable[[Any, int, Errors], Any]


@dataclass(frozen=True)
class RequestContext:
    """Who asked and how (Kafka's ``RequestContext``).

    Attributes:
        api_key / api_version: the request's ApiKey and version (what the response is encoded at).
        correlation_id: the request header's correlation id.
        client_id: the request header's client id ("" when null).
        client_host: the peer's address ("" in-process).
        in_process: the caller shares this process (:meth:`~.kafka_apis.KafkaApis.call`):
            responses may carry records as objects rather than wire bytes (a Fetch's
            :class:`~txlake.engine.requests.FetchedRecords`; see :mod:`.log_apis`).
    """

    api_key: int
    api_version: int
    correlation_id: int = 0
    client_id: str = ""
    client_host: str = ""
    in_process: bool = False


@dataclass(frozen=True)
class ApiSpec:
    """One API the engine implements.

    Attributes:
        key: the ApiKey.
        min_version / max_version: the versions answered (advertised by ApiVersions).
        handler: ``handler(apis, context, request) -> response | Future | None``.
        error_response: ``error_response(request, version, error) -> response`` answering
            every part of the request with ``error`` (used for UNSUPPORTED_VERSION and for a
            handler that fails unexpectedly: UNKNOWN_SERVER_ERROR).
        any_version: the handler answers every version itself (ApiVersions: KIP-511), with
            ``request`` None when the version is beyond Kafka's schema.
    """

    key: ApiKey
    min_version: int
    max_version: int
    handler: Handler
    error_response: ErrorResponse | None = None
    any_version: bool = False


class UnsupportedRequest(Exception):
    """A request the engine cannot answer at all (unknown API or version without an error
    response): the server closes the connection, as Kafka's ``SocketServer`` does."""


class ApiNode(Protocol):
    """What a handler is handed: the facts of the one broker node it answers for
    (:class:`~.kafka_apis.KafkaApis` is one).

    Attributes:
        broker: the partition logs and coordinators of the storage root.
        host / port: the advertised listener, the one broker Metadata names.
        node_id: this broker's node id (Kafka's ``node.id``).
        cluster_id: the storage root's cluster id (22 url-safe base64 characters).
        specs: ApiKey -> the :class:`ApiSpec` implemented.
        metadata_refresh_ms: ms; Metadata and DescribeConfigs look for other processes' catalog
            commits at most once per this interval.
    """

    broker: Broker
    host: str
    port: int
    node_id: int
    cluster_id: str
    specs: dict[int, ApiSpec]
    metadata_refresh_ms: int

    @property
    def leader_epoch(self) -> int:
        """The leader epoch of every partition (the writer lease's epoch; 0 before any)."""

    def supported_versions(self) -> dict[int, tuple[int, int]]:
        """ApiKey -> ``(min, max)`` version implemented (what ApiVersions advertises)."""
