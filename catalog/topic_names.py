"""Topic name rules, exactly as Kafka's ``org.apache.kafka.common.internals.Topic``.

A legal name is 1..249 characters of ASCII letters, digits, ``.``, ``_`` and ``-``, and
is neither ``.`` nor ``..``; so a name can never be a path trick (no ``/``, no ``..``).
Two names that differ only by ``.`` versus ``_`` collide (Kafka refuses the second one
because both map to the same metric name).
"""

from __future__ import annotations

import re

from .errors import InvalidTopicError

MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")

TRANSACTION_STATE_TOPIC = "__transaction_state"
CONSUMER_OFFSETS_TOPIC = "__consumer_offsets"
INTERNAL_TOPICS = frozenset({TRANSACTION_STATE_TOPIC, CONSUMER_OFFSETS_TOPIC})


def validate_topic_name(name: object) -> str:
    """Return ``name`` if Kafka accepts it as a topic name.

    Raises:
        InvalidTopicError: with Kafka's message for the rule broken (Kafka 4.3's
            ``Topic.validate``: "Topic name is invalid: ...").
    """
    if not isinstance(name, str) or not name:
        raise InvalidTopicError("Topic name is invalid: the empty string is not allowed")
    if name in (".", ".."):
        raise InvalidTopicError(f"Topic name is invalid: '{name}' is not allowed")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTopicError(
            f"Topic name is invalid: the length of '{name}' is longer than the max allowed length {MAX_NAME_LENGTH}"
        )
    if not _LEGAL.fullmatch(name):
        raise InvalidTopicError(
            f"Topic name is invalid: '{name}' contains one or more characters other than ASCII alphanumerics, "
            "'.', '_' and '-'"
        )
    return name


def unify_collision_chars(name: str) -> str:
    """The form under which two names collide (``.`` replaced by ``_``)."""
    return name.replace(".", "_")


def is_internal(name: str) -> bool:
    """True for Kafka's internal topics (``__consumer_offsets``, ``__transaction_state``)."""
    return name in INTERNAL_TOPICS
