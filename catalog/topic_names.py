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
        InvalidTopicError: with Kafka's message for the rule broken.
    """
    if not isinstance(name, str) or not name:
        raise InvalidTopicError("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicError('Topic name cannot be "." or ".."')
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidTopicError(
            f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters, topic name: {name}"
        )
    if not _LEGAL.fullmatch(name):
        raise InvalidTopicError(
            f"Topic name \"{name}\" is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'"
        )
    return name


def unify_collision_chars(name: str) -> str:
    """The form under which two names collide (``.`` replaced by ``_``)."""
    return name.replace(".", "_")


def is_internal(name: str) -> bool:
    """True for Kafka's internal topics (``__consumer_offsets``, ``__transaction_state``)."""
    return name in INTERNAL_TOPICS
