"""KafkaApis: the engine's one request surface (after Kafka's ``kafka.server.KafkaApis``).

Every Kafka API the engine answers has one handler here, registered under its ApiKey
with the versions it implements. A handler takes a :class:`RequestContext` and the
request value -- Kafka's own message, as generated from Kafka's JSON schemas (kafka-python
3's ``kafka.protocol`` classes: the same field names and types as Kafka's
``ProduceRequestData``, ``FetchResponseData``, ...) -- and returns the response value,
a :class:`concurrent.futures.Future` of it (the answer comes later: a Produce waits for the
catalog commit, a JoinGroup for the rebalance), or None (Produce with acks=0: Kafka sends
no response). Responses carry Kafka error codes only.

Handlers route to the owner of the state: the partition logs (:class:`~txlake.engine.broker.Broker`),
the group coordinator or the transaction coordinator. The network server
(``txlake.server``) decodes frames into request values and encodes the answers; nothing
in it knows what a request means, and nothing here knows sockets.

The shapes a handler module needs (:class:`RequestContext`, :class:`ApiSpec`, the
:class:`~.api_spec.ApiNode` it is handed) are in :mod:`.api_spec`, so the handler modules
never import this one (which lists them). The handlers live by area: :mod:`.cluster`
(ApiVersions, Metadata, DescribeCluster, ElectLeaders), :mod:`.log_apis` (Produce, Fetch, ListOffsets,
OffsetForLeaderEpoch, InitProducerId), :mod:`.topic_apis` (CreateTopics, DeleteTopics,
CreatePartitions, DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, DeleteRecords,
DescribeProducers), :mod:`.group_apis` (FindCoordinator and the consumer-group APIs),
:mod:`.txn_apis` (AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit,
DescribeTransactions, ListTransactions, WriteTxnMarkers), :mod:`.acl_apis` (CreateAcls,
DescribeAcls, DeleteAcls, DescribeUserScramCredentials, AlterUserScramCredentials: no
authorizer, no SASL).
"""

from __future__ import annotations

import base64
import logging
import threading
import uuid
import weakref
from concurrent.futures import Future
from typing import Any, Iterable

from ..broker import Broker
from ..errors import Errors
from .api_spec import ApiSpec, HandlerResult, RequestContext, UnsupportedRequest
from .handoff import KAFKA_REQUEST, answer_handed_over

log = logging.getLogger(__name__)

__all__ = ["ApiSpec", "KafkaApis", "RequestContext", "UnsupportedRequest", "cluster_id_for", "default_specs",
           "local_apis"]


def cluster_id_for(url: str) -> str:
    """A stable cluster id for a storage root: 22 url-safe base64 characters of a UUID, as
    Kafka's ``Uuid.toString`` prints its cluster ids (the same root always has the same id)."""
    raw = uuid.uuid5(uuid.NAMESPACE_URL, url).bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class KafkaApis:
    """The request surface of one engine (one storage root, one broker node).

    Args:
        broker: the partition logs and coordinators of the storage root (it must be, or
            become on first write, the writer: it holds the lease).
        host / port: the advertised listener, the one broker Metadata names.
        node_id: this broker's node id (Kafka's ``node.id``).
        specs: the APIs; default every module's (``cluster``, ``log_apis``, ``topic_apis``, ``group_apis``,
            ``txn_apis``, ``acl_apis``).
        metadata_refresh_ms: ms; Metadata and DescribeConfigs look for commits of other processes
            (:meth:`Broker.refresh`) at most once per this interval (the network server: 1000, so
            clients polling metadata cost no storage request each; the in-process surface: 0, every
            request, so an embedded client sees a topic another process created as soon as it asks).
    """

    def __init__(self, broker: Broker, host: str, port: int, node_id: int = 1,
                 specs: Iterable[ApiSpec] | None = None, metadata_refresh_ms: int = 1000):
        self.broker = broker
        self.host = host
        self.port = port
        self.node_id = node_id
        self.metadata_refresh_ms = metadata_refresh_ms
        self.cluster_id = cluster_id_for(broker.store.url)
        self.specs: dict[int, ApiSpec] = {}
        for spec in (default_specs() if specs is None else specs):
            assert spec.key not in self.specs, f"two handlers for {spec.key.name}"
            assert 0 <= spec.min_version <= spec.max_version
            self.specs[int(spec.key)] = spec
        # Kafka requests other processes hand to this root's writer (engine/apis/handoff.py)
        broker.serve_handoff(KAFKA_REQUEST, lambda _store, payload: answer_handed_over(self.call, payload))

    # ------------------------------------------------------------------ shared facts
    @property
    def leader_epoch(self) -> int:
        """The leader epoch of every partition: the writer lease's epoch (it moves when a
        new server takes the lease, as Kafka's leader epoch moves with a new leader)."""
        lease = self.broker.lease
        return lease.epoch if lease is not None and lease.epoch is not None else 0

    def supported_versions(self) -> dict[int, tuple[int, int]]:
        """ApiKey -> ``(min, max)`` version implemented (what ApiVersions advertises)."""
        return {key: (s.min_version, s.max_version) for key, s in sorted(self.specs.items())}

    # ------------------------------------------------------------------ dispatch
    def handle(self, context: RequestContext, request: Any) -> HandlerResult:
        """Answer one request (see the module docstring for what comes back).

        Raises:
            UnsupportedRequest: the API is not implemented, or the version is not and the API
                has no error response to say UNSUPPORTED_VERSION with.
        """
        spec = self.specs.get(context.api_key)
        if spec is None:
            raise UnsupportedRequest(f"API key {context.api_key} is not implemented")
        if not spec.any_version and not spec.min_version <= context.api_version <= spec.max_version:
            if spec.error_response is None:
                raise UnsupportedRequest(f"{spec.key.name} v{context.api_version} is not implemented "
                                         f"(versions {spec.min_version}-{spec.max_version})")
            return spec.error_response(request, context.api_version, Errors.UNSUPPORTED_VERSION)
        try:
            result = spec.handler(self, context, request)
        except Exception as exc:
            return self._failed(spec, context, request, exc)
        if isinstance(result, Future):
            answer: Future = Future()

            def relay(done: Future) -> None:
                exc = done.exception()
                if exc is None:
                    answer.set_result(done.result())
                    return
                try:
                    answer.set_result(self._failed(spec, context, request, exc))
                except Exception as again:
                    answer.set_exception(again)
            result.add_done_callback(relay)
            return answer
        return result

    def submit(self, request: Any, client_id: str = "") -> Future:
        """Answer one request in-process without waiting: a Future of the response value
        (already done for an API that answers at once; a JoinGroup's completes when the
        rebalance decides). For a caller that must not block on the answer, e.g. the consumer's
        group thread, which goes on heartbeating while its JoinGroup is parked.

        Raises:
            UnsupportedRequest: the API or version is not implemented.
        """
        result = self.send(request, client_id)
        if isinstance(result, Future):
            return result
        done: Future = Future()
        done.set_result(result)
        return done

    def call(self, request: Any, timeout_s: float | None = None, client_id: str = "") -> Any:
        """Answer one request in-process: the entry point of the embedded clients
        (``storage.url``), which call the engine exactly as the network server does.

        Args:
            request: a versioned Kafka message (``ListOffsetsRequest[9](...)``); its
                ``API_KEY`` and ``version`` say what it is.
            timeout_s: how long to wait for an answer that comes later (a Produce waiting
                for its catalog commit, a JoinGroup for the rebalance); None waits as long as
                the handler takes (each bounds its own wait by the request's timeout).
            client_id: the caller's ``client.id`` (logged with failures).

        Returns:
            The response value (None for a Produce with acks=0).

        Raises:
            UnsupportedRequest: the API or version is not implemented.
            concurrent.futures.TimeoutError: the answer did not come within ``timeout_s``.
        """
        result = self.send(request, client_id)
        return result.result(timeout_s) if isinstance(result, Future) else result

    def send(self, request: Any, client_id: str = "") -> HandlerResult:
        """Answer one request in-process without waiting: the response, a Future of it (an
        answer that comes later, e.g. a Produce's after its catalog commit), or None (a
        Produce with acks=0). The context says ``in_process``: records may cross as objects
        (:mod:`.log_apis`). Raises as :meth:`call`."""
        context = RequestContext(api_key=int(request.API_KEY), api_version=request.version, client_id=client_id,
                                 in_process=True)
        return self.handle(context, request)

    def _failed(self, spec: ApiSpec, context: RequestContext, request: Any, exc: BaseException) -> Any:
        log.error("%s v%d from %s (client id %r) failed: %s", spec.key.name, context.api_version,
                  context.client_host or "in-process", context.client_id, exc, exc_info=exc)
        if spec.error_response is None:
            raise UnsupportedRequest(f"{spec.key.name} failed: {exc}") from exc
        return spec.error_response(request, context.api_version, Errors.UNKNOWN_SERVER_ERROR)


#: the in-process request surface of each broker (the embedded clients share one per root)
_LOCAL: "weakref.WeakKeyDictionary[Broker, KafkaApis]" = weakref.WeakKeyDictionary()
_LOCAL_LOCK = threading.Lock()

#: the listener an in-process surface names in Metadata (no socket is opened)
LOCAL_HOST, LOCAL_PORT = "localhost", 0


def local_apis(broker: Broker) -> KafkaApis:
    """The request surface the embedded clients of ``broker`` call (one per broker, made on
    first use; its Metadata names ``localhost:0`` as the one broker, node id 1, and reads the
    newest catalog commit on every request: ``metadata_refresh_ms`` 0)."""
    with _LOCAL_LOCK:
        apis = _LOCAL.get(broker)
        if apis is None:
            apis = _LOCAL[broker] = KafkaApis(broker, LOCAL_HOST, LOCAL_PORT, metadata_refresh_ms=0)
        return apis


def default_specs() -> list[ApiSpec]:
    """Every API of every handler module."""
    from . import acl_apis, cluster, group_apis, log_apis, topic_apis, txn_apis
    specs: list[ApiSpec] = []
    for module in (cluster, log_apis, topic_apis, group_apis, txn_apis, acl_apis):
        specs.extend(module.APIS)
    return specs
