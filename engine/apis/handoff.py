"""Kafka requests handed to the writer-lease holder by another process (engine/handoff.py).

A process that cannot take a storage root's writer lease (a CLI run, a notebook, a Spark
job's driver beside a running service) cannot write; Kafka would send the request to the
partition leader. Here the request goes through the root's hand-over mailbox instead: the
requester encodes a Kafka request value (``WriteTxnMarkersRequest[1](...)``) with its
API version, the holder's request surface answers it exactly as it answers the same
request from the wire or from its own clients (:meth:`KafkaApis.call`), and the requester
decodes the response value. Hand-over kind ``kafka.request``; payload ``{"api_key",
"api_version", "request"}`` (the body, base64), result ``{"response"}`` (base64).

Every :class:`~.kafka_apis.KafkaApis` serves the kind for its broker while that broker
holds the lease (:meth:`~txlake.engine.broker.Broker.serve_handoff`), so any process
with an embedded client or a ``txlake serve`` answers.
"""

from __future__ import annotations

import base64
from typing import Any, Callable

from txlake.catalog.storage import ObjectStore

from ..handoff import submit
from .messages import REQUEST_CLASSES, RESPONSE_CLASSES

#: the hand-over kind of a Kafka request
KAFKA_REQUEST = "kafka.request"


def hand_over(store: ObjectStore, request: Any, timeout_s: float) -> Any:
    """Have the writer-lease holder of ``store`` answer ``request`` (a versioned Kafka request
    value) and return its response value.

    Raises:
        HandoffCancelled: no holder claimed the request within ``timeout_s``; it never ran.
        HandoffError: the holder could not answer it (the message says why).
    """
    version = request.version
    payload = {"api_key": int(request.API_KEY), "api_version": version,
               "request": base64.b64encode(bytes(request.encode(version=version))).decode()}
    result = submit(store, KAFKA_REQUEST, payload, timeout_s)
    response_class = RESPONSE_CLASSES[int(request.API_KEY)]
    return response_class.decode(base64.b64decode(result["response"]), version=version)


def answer_handed_over(call: Callable[[Any], Any], payload: dict) -> dict:
    """The holder's side: decode the request, answer it with ``call`` (a request surface's
    :meth:`~.kafka_apis.KafkaApis.call`), encode the response.

    Raises:
        ValueError: an API key this engine does not know, or a body that does not decode.
    """
    api_key, version = int(payload["api_key"]), int(payload["api_version"])
    request_class = REQUEST_CLASSES.get(api_key)
    if request_class is None:
        raise ValueError(f"unknown API key {api_key}")
    request = request_class.decode(base64.b64decode(payload["request"]), version=version)
    response = call(request)
    return {"response": base64.b64encode(bytes(response.encode(version=version))).decode()}
