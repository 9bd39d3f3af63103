"""Kafka's message classes by API key: the request and response value types of every API,
as kafka-python 3's protocol layer generates them from Kafka's JSON message schemas.

The network server (``txlake.server.codec``) decodes frames with them, and the hand-over
of requests between processes (:mod:`.handoff`) encodes and decodes request/response
bodies with them.
"""

from __future__ import annotations

import kafka.protocol.admin  # noqa: F401  (importing the modules registers the message classes)
import kafka.protocol.consumer  # noqa: F401
import kafka.protocol.metadata  # noqa: F401
import kafka.protocol.producer  # noqa: F401
from kafka.protocol.api_message import ApiMessage


def _message_classes(kind: str) -> dict[int, type]:
    """Every kafka-python message class of ``kind`` ("request" or "response") by API key."""
    found: dict[int, type] = {}
    stack = list(ApiMessage.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if getattr(cls, "_class_version", None) is None and getattr(cls, "_json", None) and cls._json["type"] == kind:
            found[cls.API_KEY] = cls
    return found


#: API key -> kafka-python request class; API key -> response class
REQUEST_CLASSES: dict[int, type] = _message_classes("request")
RESPONSE_CLASSES: dict[int, type] = _message_classes("response")


def schema_versions(api_key: int) -> tuple[int, int] | None:
    """The ``(min, max)`` versions of Kafka's schema for ``api_key`` as kafka-python ships it, or None."""
    cls = REQUEST_CLASSES.get(api_key)
    if cls is None:
        return None
    low, _, high = cls._json["validVersions"].partition("-")  # "0-9", or one version: "0"
    return int(low), int(high or low)
