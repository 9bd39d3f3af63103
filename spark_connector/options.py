"""The read options of the ``txlake`` Spark source, parsed and checked as Spark's Kafka source does.

One parser serves ``spark.read`` and ``spark.readStream``: :func:`parse_read_options`
turns the options Spark hands the data source (strings, keys case-insensitive -- Spark
lower-cases them) into a frozen :class:`ReadOptions`, or raises :class:`OptionError`
naming the option. Option names and meanings are those of Spark's Kafka source
(``KafkaSourceProvider``) wherever the Kafka source has the option; docs/spark.md lists
every option with its default.

===================================  =========================================================
option                               meaning (default)
===================================  =========================================================
storage.url                          the storage root (``$TXLAKE_STORAGE``, else ~/.txlake/data)
storage.options.<k>                  fsspec option ``k``; ``a.b`` nests (``{"a": {"b": v}}``);
                                     ``true``/``false`` become booleans, ``{...}``/``[...]`` JSON
storage.options                      all fsspec options as one JSON object (merged first)
subscribe / subscribePattern /       which topics: comma list / regex (found anywhere) / JSON
assign                               ``{"t": [0, 1]}`` -- exactly one of them
startingOffsets                      earliest / latest / JSON ``{"t": {"0": 5, "1": -2}}``
                                     (batch: earliest; stream: latest)
endingOffsets                        latest / JSON (batch only; latest)
startingTimestamp /                  ms: first offset with timestamp >= it (all partitions /
startingOffsetsByTimestamp           JSON per partition); take precedence over startingOffsets
endingTimestamp /                    the same for the end (batch only)
endingOffsetsByTimestamp
startingOffsetsByTimestampStrategy   error / latest: when no offset matches a starting timestamp
isolation.level                      read_committed / read_uncommitted (read_committed)
includeHeaders                       add the ``headers`` column (false)
failOnDataLoss                       fail when requested offsets are gone (true)
minPartitions                        at least this many Spark partitions (one per topic partition)
maxRecordsPerPartition               split a range above this many offsets (none)
maxOffsetsPerTrigger                 stream admission control, offsets per micro-batch (none)
===================================  =========================================================
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from txlake.catalog.redaction import REDACTED, redact_value

log = logging.getLogger(__name__)

__all__ = [
    "EARLIEST", "LATEST", "OptionError", "OffsetSpec", "ReadOptions", "Subscription", "parse_read_options",
    "parse_storage_options",
]

#: Kafka's special offsets in the per-partition JSON (``KafkaOffsetRangeLimit``)
EARLIEST = -2
LATEST = -1

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"

# every key lower-cased, as Spark hands them over
_STRATEGIES = {"subscribe": "subscribe", "subscribepattern": "subscribePattern", "assign": "assign"}
_KNOWN = {
    "storage.url", "storage.options", "subscribe", "subscribepattern", "assign",
    "startingoffsets", "endingoffsets", "startingtimestamp", "endingtimestamp",
    "startingoffsetsbytimestamp", "endingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy",
    "isolation.level", "kafka.isolation.level", "includeheaders", "failondataloss", "minpartitions",
    "maxrecordsperpartition", "maxoffsetspertrigger",
    # Kafka-client tuning of Spark's Kafka source: accepted so code moves over, no effect here
    "groupidprefix", "fetchoffset.numretries", "fetchoffset.retryintervalms", "kafkaconsumer.polltimeoutms",
    # the sink's option: ignored by reads, as by Spark's Kafka source
    "topic",
    # internal testing hook (like the Kafka source's ``_mockSystemTime``): see OPEN_LOG_OPTION
    "_openlog",
}
#: the spelling of each option in messages
_SPELLING = {k.lower(): k for k in (
    "storage.url", "storage.options", "subscribe", "subscribePattern", "assign", "startingOffsets",
    "endingOffsets", "startingTimestamp", "endingTimestamp", "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "isolation.level", "kafka.isolation.level",
    "includeHeaders", "failOnDataLoss", "minPartitions", "maxRecordsPerPartition", "maxOffsetsPerTrigger",
    "minOffsetsPerTrigger", "maxTriggerDelay", "groupIdPrefix", "fetchOffset.numRetries",
    "fetchOffset.retryIntervalMs", "kafkaConsumer.pollTimeoutMs", "topic")}
#: Kafka-source options whose meaning txlake does not implement: an error says so
_UNSUPPORTED = {
    "minoffsetspertrigger": "minOffsetsPerTrigger is not supported by the txlake source (PySpark's ReadLimit "
                            "cannot combine it with maxOffsetsPerTrigger); use a processing-time trigger instead",
    "maxtriggerdelay": "maxTriggerDelay is not supported by the txlake source (it goes with minOffsetsPerTrigger)",
}
#: internal testing hook: a local file to which read() appends one JSON line per object it opens
OPEN_LOG_OPTION = "_openLog"


class OptionError(ValueError):
    """An invalid or missing option of the txlake Spark source; the message names the option.

    Spark's Kafka source raises ``IllegalArgumentException`` for the same cases; from
    PySpark it reaches the user inside the query's error, with this message.
    """

    def __init__(self, option: str | None, message: str):
        self.option = option
        super().__init__(f"option '{option}': {message}" if option else message)


# ------------------------------------------------------------------ values
@dataclass(frozen=True)
class Subscription:
    """Which topics are read (Kafka's ``ConsumerStrategy``).

    Attributes:
        kind: ``"subscribe"`` (``topics``), ``"subscribePattern"`` (``pattern``, a Python
            regex found anywhere in the topic name, as Spark's Kafka source's ``findFirstIn``) or
            ``"assign"`` (``partitions``: ``(topic, partition)`` pairs).
    """

    kind: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    partitions: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe={','.join(self.topics)}"
        if self.kind == "subscribePattern":
            return f"subscribePattern={self.pattern}"
        return "assign=" + json.dumps(_group(self.partitions))


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends (Spark's ``KafkaOffsetRangeLimit``).

    Attributes:
        kind: ``"earliest"``, ``"latest"``, ``"offsets"`` (``offsets``: ``{(topic, partition):
            offset}`` with -2 earliest / -1 latest), ``"timestamp"`` (``timestamp`` ms for every
            partition) or ``"timestamps"`` (``timestamps``: ``{(topic, partition): ms}``).
        option: the option it came from (for messages).
        no_match_latest: for starting timestamps, what happens when no offset has a timestamp
            >= the one asked: False fails (Kafka's strategy ``error``), True reads from latest.
    """

    kind: str
    option: str
    offsets: Mapping[tuple[str, int], int] = field(default_factory=dict)
    timestamp: int | None = None
    timestamps: Mapping[tuple[str, int], int] = field(default_factory=dict)
    no_match_latest: bool = False

    def partitions(self) -> set[tuple[str, int]]:
        """The partitions a per-partition spec names (empty for the global kinds)."""
        return set(self.offsets) | set(self.timestamps)


@dataclass(frozen=True)
class ReadOptions:
    """Every read option, parsed (see the module docstring and docs/spark.md).

    Attributes:
        storage_url / storage_options: the storage root and its fsspec options.
        subscription: which topics/partitions.
        starting / ending: where to start and stop (``ending`` is None for streams).
        isolation_level: ``read_committed`` (records below the LSO, aborted records
            dropped) or ``read_uncommitted`` (below the high watermark).
        include_headers / fail_on_data_loss / min_partitions / max_records_per_partition /
        max_offsets_per_trigger: as the options of the same names.
        open_log: internal testing hook (a local file path) or None.
    """

    storage_url: str
    storage_options: dict
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec | None
    isolation_level: str = READ_COMMITTED
    include_headers: bool = False
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    open_log: str | None = None

    def __repr__(self) -> str:
        # the storage options hold credentials (s3fs key/secret): shown redacted
        fields = ", ".join(f"{f}={redact_value(f, getattr(self, f))!r}" for f in self.__dataclass_fields__)
        return f"ReadOptions({fields})"


# ------------------------------------------------------------------ parsing helpers
def _name(key: str) -> str:
    return _SPELLING.get(key, key)


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    if key not in opts:
        return default
    text = str(opts[key]).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise OptionError(_name(key), f"expected true or false, got {opts[key]!r}")


def _positive(opts: Mapping[str, str], key: str) -> int | None:
    if key not in opts:
        return None
    try:
        n = int(str(opts[key]).strip())
    except ValueError:
        raise OptionError(_name(key), f"expected a positive integer, got {opts[key]!r}") from None
    if n <= 0:
        raise OptionError(_name(key), f"must be positive, got {n}")
    return n


def _json(key: str, text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        shown = REDACTED if key == "storage.options" else repr(text)  # storage options may hold credentials
        raise OptionError(_name(key), f"expected {what}, got {shown} ({e.msg} at char {e.pos})") from None


def _partition_number(key: str, topic: str, p: Any) -> int:
    try:
        n = int(p)
    except (TypeError, ValueError):
        n = -1
    if isinstance(p, bool) or n < 0 or (isinstance(p, str) and not p.strip().isdigit()):
        raise OptionError(_name(key), f"partition {p!r} of topic {topic!r} is not a partition number")
    return n


def _per_partition(key: str, text: str, what: str) -> dict[tuple[str, int], int]:
    """``{"t": {"0": n, ...}, ...}`` -> ``{("t", 0): n}`` (Spark's ``JsonUtils.partitionOffsets``)."""
    data = _json(key, text, f'JSON like {{"topic": {{"0": {what}}}}}')
    if not isinstance(data, dict):
        raise OptionError(_name(key), f'expected JSON like {{"topic": {{"0": {what}}}}}, got {text!r}')
    out: dict[tuple[str, int], int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise OptionError(_name(key), f"topic {topic!r} must map partition numbers to {what}s, got {parts!r}")
        for p, value in parts.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise OptionError(_name(key), f"{what} of {topic}-{p} must be an integer, got {value!r}")
            out[(topic, _partition_number(key, topic, p))] = value
    return out


def _group(pairs) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for t, p in sorted(pairs):
        out.setdefault(t, []).append(p)
    return out


def _storage_value(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    s = text.strip()
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    if s[:1] in ("{", "["):
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return text
    return text


def parse_storage_options(options: Mapping[str, Any]) -> dict:
    """The fsspec options held in ``storage.options`` (a JSON object) and ``storage.options.<k>`` keys.

    ``storage.options.a.b=v`` sets ``{"a": {"b": v}}`` (s3fs's ``client_kwargs.region_name``);
    values ``true``/``false`` become booleans and values starting with ``{`` or ``[`` are
    parsed as JSON; other values stay strings (use the JSON form for numbers). Keys are
    lower-case because Spark lower-cases option names.

    Raises:
        OptionError: ``storage.options`` is not a JSON object, or a key is empty or
            both a value and a prefix of other keys.
    """
    out: dict = {}
    opts = {str(k).lower(): v for k, v in options.items()}
    if "storage.options" in opts:
        whole = opts["storage.options"]
        data = whole if isinstance(whole, Mapping) else _json("storage.options", str(whole), "a JSON object")
        if not isinstance(data, dict):
            raise OptionError("storage.options", "expected a JSON object of fsspec options, got "
                                                 f"{type(data).__name__} {redact_value('storage.options', data)!r}")
        out.update(data)
    prefix = "storage.options."
    for key in sorted(k for k in opts if k.startswith(prefix)):
        path = key[len(prefix):].split(".")
        if not all(path):
            raise OptionError(key, "expected storage.options.<name> (or <name>.<sub-name>)")
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise OptionError(key, f"storage option {part!r} is a value and cannot hold {path[-1]!r}")
            node = child
        node[path[-1]] = _storage_value(opts[key])
    return out


def _subscription(opts: Mapping[str, str]) -> Subscription:
    given = [k for k in _STRATEGIES if k in opts]
    names = ", ".join(_STRATEGIES.values())
    if not given:
        hint = " ('topic' names the topic a write goes to)" if "topic" in opts else ""
        raise OptionError(None, f"one of the options {names} must be specified for the txlake source "
                                f"(as for Spark's Kafka source){hint}")
    if len(given) > 1:
        raise OptionError(None, f"only one of the options {names} can be specified for the txlake source, "
                                f"got {', '.join(_STRATEGIES[k] for k in given)}")
    key = given[0]
    value = str(opts[key])
    if key == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError("subscribe", f"no topics to subscribe to in {value!r}")
        return Subscription("subscribe", topics=tuple(dict.fromkeys(topics)))
    if key == "subscribepattern":
        pattern = value.strip()
        if not pattern:
            raise OptionError("subscribePattern", f"the pattern to subscribe to is empty ({value!r})")
        try:
            re.compile(pattern)
        except re.error as e:
            raise OptionError("subscribePattern", f"invalid regular expression {pattern!r}: {e}") from None
        return Subscription("subscribePattern", pattern=pattern)
    if not value.strip().startswith("{"):
        raise OptionError("assign", f'expected JSON like {{"topic": [0, 1]}}, got {value!r}')
    data = _json("assign", value, 'JSON like {"topic": [0, 1]}')
    pairs: list[tuple[str, int]] = []
    for topic, parts in data.items():
        if not isinstance(parts, list):
            raise OptionError("assign", f"topic {topic!r} must map to a list of partition numbers, got {parts!r}")
        pairs += [(topic, _partition_number("assign", topic, p)) for p in parts]
    if not pairs:
        raise OptionError("assign", f"no partitions to assign in {value!r}")
    return Subscription("assign", partitions=tuple(sorted(set(pairs))))


def _offset_spec(opts: Mapping[str, str], ts_key: str, by_ts_key: str, offsets_key: str, default: str,
                 no_match_latest: bool) -> OffsetSpec:
    """Spark's ``getKafkaOffsetRangeLimit``: global timestamp, then per-partition timestamps, then offsets."""
    if ts_key in opts:
        text = str(opts[ts_key]).strip()
        try:
            ts = int(text)
        except ValueError:
            raise OptionError(_name(ts_key), f"expected a single long value (ms since the epoch), got {text!r}") from None
        return OffsetSpec("timestamp", _name(ts_key), timestamp=ts, no_match_latest=no_match_latest)
    if by_ts_key in opts:
        stamps = _per_partition(by_ts_key, str(opts[by_ts_key]).strip(), "timestamp")
        return OffsetSpec("timestamps", _name(by_ts_key), timestamps=stamps, no_match_latest=no_match_latest)
    if offsets_key in opts:
        text = str(opts[offsets_key]).strip()
        low = text.lower()
        if low in ("earliest", "latest"):
            return OffsetSpec(low, _name(offsets_key))
        offsets = _per_partition(offsets_key, text, "offset")
        for (t, p), off in offsets.items():
            if off < EARLIEST:
                raise OptionError(_name(offsets_key), f"offset {off} of {t}-{p} is invalid: use an offset >= 0, "
                                                      "-2 for earliest or -1 for latest")
        return OffsetSpec("offsets", _name(offsets_key), offsets=offsets)
    return OffsetSpec(default, _name(offsets_key))


def parse_read_options(options: Mapping[str, Any], streaming: bool) -> ReadOptions:
    """Parse and check the options of ``spark.read`` (``streaming=False``) or ``spark.readStream``.

    Follows ``KafkaSourceProvider``: exactly one of subscribe/subscribePattern/assign;
    batch reads cannot start at latest nor end at earliest; streams take no ending
    option; timestamps take precedence over offsets. Unknown options are an error
    (txlake's clients refuse unknown keys too), naming the closest known option.

    Args:
        options: the options as Spark passes them (strings; keys in any case).
        streaming: True for ``readStream`` (startingOffsets defaults to latest).

    Raises:
        OptionError: naming the offending option.
    """
    opts = {str(k).lower(): v for k, v in options.items()}
    for key in opts:
        if key in _UNSUPPORTED:
            raise OptionError(_name(key), _UNSUPPORTED[key])
        if key.startswith("storage.options.") or key in _KNOWN:
            continue
        if key.startswith("kafka."):
            raise OptionError(key, "txlake reads object storage, not Kafka brokers: set storage.url "
                                   "(and storage.options.*) instead of kafka.* options")
        close = difflib.get_close_matches(key, list(_KNOWN - {"_openlog"}), n=1, cutoff=0.75)
        hint = f"; did you mean '{_name(close[0])}'?" if close else ""
        raise OptionError(key, f"unknown option of the txlake source{hint} (docs/spark.md lists them)")

    from txlake.config import default_storage_url

    url = str(opts.get("storage.url") or "").strip() or default_storage_url()
    storage_options = parse_storage_options(opts)
    subscription = _subscription(opts)

    level = None
    for key in ("isolation.level", "kafka.isolation.level"):
        if key in opts:
            value = str(opts[key]).strip().lower()
            if value not in (READ_COMMITTED, READ_UNCOMMITTED):
                raise OptionError(_name(key), f"expected read_committed or read_uncommitted, got {opts[key]!r}")
            if level is not None and value != level:
                raise OptionError(_name(key), f"is {value} but isolation.level is {level}")
            level = value
    isolation = level or READ_COMMITTED

    strategy = str(opts.get("startingoffsetsbytimestampstrategy", "error")).strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError("startingOffsetsByTimestampStrategy", f"expected error or latest, got {strategy!r}")
    starting = _offset_spec(opts, "startingtimestamp", "startingoffsetsbytimestamp", "startingoffsets",
                            "latest" if streaming else "earliest", strategy == "latest")
    ending: OffsetSpec | None = None
    if streaming:
        for key in ("endingoffsets", "endingoffsetsbytimestamp", "endingtimestamp"):
            if key in opts:
                raise OptionError(_name(key), "ending offsets are not valid in streaming queries")
    else:
        ending = _offset_spec(opts, "endingtimestamp", "endingoffsetsbytimestamp", "endingoffsets", "latest", True)
        if starting.kind == "latest":
            raise OptionError(starting.option, "starting offset can't be latest for batch queries")
        for (t, p), off in starting.offsets.items():
            if off == LATEST:
                raise OptionError(starting.option, f"starting offset for {t}-{p} can't be latest (-1) for batch queries")
        if ending.kind == "earliest":
            raise OptionError(ending.option, "ending offset can't be earliest for batch queries")
        for (t, p), off in ending.offsets.items():
            if off == EARLIEST:
                raise OptionError(ending.option, f"ending offset for {t}-{p} can't be earliest (-2) for batch queries")
        _check_limits(starting, ending)

    max_per_trigger = _positive(opts, "maxoffsetspertrigger")
    if max_per_trigger is not None and not streaming:
        log.warning("maxOffsetsPerTrigger option ignored in batch queries")
    open_log = opts.get("_openlog")
    return ReadOptions(
        storage_url=url, storage_options=storage_options, subscription=subscription, starting=starting,
        ending=ending, isolation_level=isolation,
        include_headers=_bool(opts, "includeheaders", False),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        min_partitions=_positive(opts, "minpartitions"),
        max_records_per_partition=_positive(opts, "maxrecordsperpartition"),
        max_offsets_per_trigger=max_per_trigger,
        open_log=os.path.abspath(str(open_log)) if open_log else None,
    )


def _check_limits(starting: OffsetSpec, ending: OffsetSpec) -> None:
    """Spark's ``checkOffsetLimitValidity``: per-partition start and end name the same partitions, start <= end."""
    pairs = [("offsets", starting.offsets, ending.offsets), ("timestamps", starting.timestamps, ending.timestamps)]
    for kind, start, end in pairs:
        if starting.kind != kind or ending.kind != kind:
            continue
        if set(start) != set(end):
            raise OptionError(ending.option, f"names partitions {_fmt(end)} but {starting.option} names {_fmt(start)}; "
                                             "both must name the same partitions")
        for tp, s in start.items():
            e = end[tp]
            if 0 <= e < s and s >= 0:
                raise OptionError(ending.option, f"{kind[:-1]} {e} of {tp[0]}-{tp[1]} is before the starting "
                                                 f"{kind[:-1]} {s}")


def _fmt(pairs) -> str:
    return "[" + ", ".join(f"{t}-{p}" for t, p in sorted(pairs)) + "]"
