"""Topic configuration: Kafka's topic-level configs, their defaults and validation.

Names, types, defaults and valid ranges follow Kafka's ``TopicConfig``/``LogConfig``.
The catalog stores only the overrides a topic was created with (as Kafka stores them);
:func:`effective_config` adds the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from .errors import InvalidConfigError

LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


@dataclass(frozen=True)
class ConfigDef:
    """One topic config: its Kafka type name, default and validator."""

    type: str
    default: str
    check: Callable[[str], str | None] | None = None  # returns an error message or None


def _long(lo: int | None = None, hi: int = LONG_MAX) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        try:
            n = int(v)
        except ValueError:
            return "Not a number of type LONG"
        if (lo is not None and n < lo) or n > hi:
            return f"Value must be at least {lo}" if lo is not None and n < lo else f"Value must be no more than {hi}"
        return None

    return check


def _int(lo: int | None = None) -> Callable[[str], str | None]:
    base = _long(lo, INT_MAX)

    def check(v: str) -> str | None:
        msg = base(v)
        return msg.replace("LONG", "INT") if msg else None

    return check


def _ratio(v: str) -> str | None:
    try:
        x = float(v)
    except ValueError:
        return "Not a number of type DOUBLE"
    return None if 0.0 <= x <= 1.0 else "Value must be between 0 and 1"


def _one_of(*choices: str) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        return None if v in choices else f"String must be one of: {', '.join(choices)}"

    return check


def cleanup_policies(config: Mapping[str, str]) -> frozenset[str]:
    """The policies of a topic's ``cleanup.policy`` (overrides or an effective config; Kafka's
    default ``delete`` when unset): a subset of ``{"delete", "compact"}``."""
    return frozenset(p.strip() for p in effective_config(config)["cleanup.policy"].split(","))


def _cleanup_policy(v: str) -> str | None:
    parts = [p.strip() for p in v.split(",")]
    if not parts or any(p not in ("delete", "compact") for p in parts):
        return "cleanup.policy must be a list of: [delete, compact]"
    return None


def _bool(v: str) -> str | None:
    return None if v.lower() in ("true", "false") else "Expected value to be either true or false"


TOPIC_CONFIGS: dict[str, ConfigDef] = {
    "cleanup.policy": ConfigDef("LIST", "delete", _cleanup_policy),
    "compression.type": ConfigDef("STRING", "producer", _one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
    "delete.retention.ms": ConfigDef("LONG", "86400000", _long(0)),
    "file.delete.delay.ms": ConfigDef("LONG", "60000", _long(0)),
    "flush.messages": ConfigDef("LONG", str(LONG_MAX), _long(1)),
    "flush.ms": ConfigDef("LONG", str(LONG_MAX), _long(0)),
    "max.compaction.lag.ms": ConfigDef("LONG", str(LONG_MAX), _long(1)),
    "max.message.bytes": ConfigDef("INT", "1048588", _int(0)),
    "message.timestamp.type": ConfigDef("STRING", "CreateTime", _one_of("CreateTime", "LogAppendTime")),
    "message.timestamp.before.max.ms": ConfigDef("LONG", str(LONG_MAX), _long(0)),
    "message.timestamp.after.max.ms": ConfigDef("LONG", "3600000", _long(0)),  # 1 h: Kafka 4.x's default
    "min.cleanable.dirty.ratio": ConfigDef("DOUBLE", "0.5", _ratio),
    "min.compaction.lag.ms": ConfigDef("LONG", "0", _long(0)),
    "min.insync.replicas": ConfigDef("INT", "1", _int(1)),
    "preallocate": ConfigDef("BOOLEAN", "false", _bool),
    "retention.bytes": ConfigDef("LONG", "-1"),
    "retention.ms": ConfigDef("LONG", "604800000", _long(-1)),
    "segment.bytes": ConfigDef("INT", "1073741824", _int(14)),
    "segment.index.bytes": ConfigDef("INT", "10485760", _int(4)),
    "segment.jitter.ms": ConfigDef("LONG", "0", _long(0)),
    "segment.ms": ConfigDef("LONG", "604800000", _long(1)),
    "unclean.leader.election.enable": ConfigDef("BOOLEAN", "false", _bool),
}
TOPIC_CONFIGS["retention.bytes"] = ConfigDef("LONG", "-1", _long(None))

#: Overrides the internal topics are created with (Kafka's coordinators do the same).
INTERNAL_TOPIC_CONFIG = {"cleanup.policy": "compact", "compression.type": "producer"}


def validate_topic_config(config: Mapping[str, object] | None) -> dict[str, str]:
    """Validate topic config overrides; return them as strings.

    Raises:
        InvalidConfigError: naming the unknown key or the invalid value, in Kafka's words.
    """
    out: dict[str, str] = {}
    for key, raw in (config or {}).items():
        definition = TOPIC_CONFIGS.get(key)
        if definition is None:
            raise InvalidConfigError(f"Unknown topic config name: {key}")
        value = str(raw).lower() if isinstance(raw, bool) else str(raw)
        problem = definition.check(value) if definition.check else None
        if problem:
            raise InvalidConfigError(f"Invalid value {value} for configuration {key}: {problem}")
        out[key] = value
    return out


#: IncrementalAlterConfigs operations (Kafka's ``AlterConfigOp.OpType`` ids)
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}


def alter_topic_config(overrides: Mapping[str, str], ops: list[tuple[str, int, str | None]]) -> dict[str, str]:
    """A topic's overrides after IncrementalAlterConfigs ``ops``, validated (Kafka's
    ``ConfigurationControlManager.incrementalAlterConfigResource``).

    Args:
        overrides: the topic's current overrides.
        ops: ``(config name, operation, value)`` with the operations of :data:`OP_NAMES`: SET
            the value, DELETE the override (back to the default), APPEND / SUBTRACT the
            comma-separated items of ``value`` to / from a LIST config (starting from its
            default when it has no override; APPEND skips items already there, SUBTRACT
            removes the first occurrence of each). One op per name.

    Returns:
        The new overrides (every value a string).

    Raises:
        InvalidConfigError: APPEND/SUBTRACT on a config that is not a LIST ("Can't APPEND to
            key K because its type is not LIST."), or the result fails :func:`validate_topic_config`.
    """
    new = dict(overrides)
    for name, op, value in ops:
        if op == OP_SET:
            new[name] = value  # type: ignore[assignment]
        elif op == OP_DELETE:
            new.pop(name, None)
        else:
            definition = TOPIC_CONFIGS.get(name)
            if definition is None or definition.type != "LIST":
                raise InvalidConfigError(f"Can't {OP_NAMES[op]} to key {name} because its type is not LIST.")
            items = [v for v in new.get(name, definition.default).split(",") if v]
            for item in (value or "").split(","):
                if op == OP_APPEND and item not in items:
                    items.append(item)
                elif op == OP_SUBTRACT and item in items:
                    items.remove(item)
            new[name] = ",".join(items)
    return validate_topic_config(new)


def effective_config(overrides: Mapping[str, str]) -> dict[str, str]:
    """All topic configs: Kafka's defaults with ``overrides`` applied."""
    return {**{k: d.default for k, d in TOPIC_CONFIGS.items()}, **overrides}
