"""Records of ``__transaction_state``: the key and value layout (Kafka's TransactionLog).

The transaction coordinator persists every state change of a transactional id as one
record of the compacted topic ``__transaction_state``; replaying the topic (the last
record per key wins, a null value deletes the key) rebuilds the coordinator's cache.
This module only knows the byte layout -- the state machine lives in
:mod:`txlake.engine.transaction_metadata`.

Both key and value are compact UTF-8 JSON objects carrying a format version ``"v"``, so
DuckDB and Spark can read them: in DuckDB ``json_extract_string(decode(value), '$.state')``
(``decode`` reads the BLOB as UTF-8; a plain ``CAST(value AS VARCHAR)`` escapes bytes), in
Spark ``get_json_object(CAST(value AS STRING), '$.state')``.

Key (version 1)::

    {"v":1,"transactional_id":"copier-1"}

The key's bytes are the compaction identity of a transactional id, so the key layout
must never change: a new key version would stop compaction from replacing the records
written under the old one.

Value (version 1) -- the fields of Kafka's ``TransactionLogValue`` version 1, including
its tagged ``PreviousProducerId``, ``NextProducerId`` and ``LastProducerEpoch``::

    {"v":1,"producer_id":4000,"previous_producer_id":-1,"next_producer_id":-1,
     "producer_epoch":3,"last_producer_epoch":-1,"txn_timeout_ms":60000,
     "state":"Ongoing","topic_partitions":[["orders",0],["orders",2]],
     "txn_start_timestamp":1700000000000,"txn_last_update_timestamp":1700000000042}

=========================  =======  =====================================================
field                      type     meaning
=========================  =======  =====================================================
producer_id                int64    producer id in use by the transactional id
previous_producer_id       int64    the producer id before the last transition, -1 if none
next_producer_id           int64    producer id handed out for the next epoch (KIP-890), -1
producer_epoch             int16    current epoch of the producer id
last_producer_epoch        int16    epoch before the last bump, kept so an InitProducerId
                                    retry is recognised after a restart (KIP-360), -1
txn_timeout_ms             int32    transaction timeout
state                      string   Kafka's state name (``Empty``, ``Ongoing``, ...)
topic_partitions           list     ``[topic, partition]`` pairs in the transaction, sorted
txn_start_timestamp        int64    ms when the first partition was added, -1 if none
txn_last_update_timestamp  int64    ms of the last state change
client_transaction_version int16    the transaction version the client used (Kafka's
                                    ``ClientTransactionVersion``, KIP-890): 2 bumps the
                                    epoch at every EndTxn; written only when not 0
=========================  =======  =====================================================

Kafka before 2026 did not write the previous/next producer id (KAFKA-20310) nor the last
epoch (KAFKA-20357), so a KIP-360 retry spanning a coordinator failover was fenced;
txlake writes all three, and a replay reproduces the coordinator's memory exactly.
``client_transaction_version`` (Kafka's tagged ``ClientTransactionVersion``) is optional:
a value without it -- every value written before transaction version 2 was served, and
every value of a version 0/1 client still -- reads as 0, and is written byte for byte as
before (so it stays in the canonical form below).

Fields a reader does not know are ignored (like Kafka's tagged fields); a change that an
older reader must not ignore bumps ``"v"``, and such records are refused with
:class:`UnsupportedFormatVersionError`.

Replaying a long log decodes hundreds of thousands of records, so the exact bytes this
module writes for ASCII ids and topic names, in the states that are ever written -- the
*canonical* form -- can also be checked and read without a JSON decode: a key or value
with one regular-expression match (:data:`CANONICAL_KEY`, :data:`CANONICAL_VALUE`,
:func:`check_canonical_values` for many values at once) and, when its fields are needed,
:func:`canonical_value_fields`. A key or value that matches is one that
:func:`decode_key`/:func:`decode_value` accept, with the same result; one that does not
may still be valid (non-ASCII text, escapes, other field order or spacing, a 10-digit
partition, a Dead state...) and must go through those functions.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from .errors import CorruptObjectError, UnsupportedFormatVersionError

KIND = "transaction-log"
KEY_VERSION = 1
VALUE_VERSION = 1

#: Kafka's transaction state names, in the order of their ids (``TransactionState.fromId``).
STATE_NAMES: tuple[str, ...] = ("Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit",
                                "CompleteAbort", "Dead", "PrepareEpochFence")

INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_VALUE_FIELDS = ("producer_id", "previous_producer_id", "next_producer_id", "producer_epoch",
                 "last_producer_epoch", "txn_timeout_ms", "state", "topic_partitions",
                 "txn_start_timestamp", "txn_last_update_timestamp")
#: a value field that may be absent (0 then): KIP-890's client transaction version
_OPTIONAL_VALUE_FIELD = "client_transaction_version"


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} {value} is outside {low}..{high}")
    return value


def _normalise_partitions(partitions: Iterable[Any]) -> tuple[tuple[str, int], ...]:
    out: set[tuple[str, int]] = set()
    for item in partitions:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ValueError(f"a topic partition must be a [topic, partition] pair, got {item!r}")
        topic, partition = item[0], item[1]
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"a topic name must be a non-empty string, got {topic!r}")
        _check_int(f"partition of topic {topic!r}", partition, 0, INT32_MAX)
        out.add((topic, partition))
    return tuple(sorted(out))


@dataclass(frozen=True)
class TxnLogValue:
    """The value of a ``__transaction_state`` record (Kafka's ``TransactionLogValue``).

    Plain data, validated on construction (ranges of Kafka's int16/int32/int64 fields,
    a known state name). ``topic_partitions`` is normalised to a sorted tuple of
    ``(topic, partition)`` pairs without duplicates.

    Raises:
        ValueError: a field is missing its type or range, or the state is unknown.
    """

    producer_id: int
    previous_producer_id: int
    next_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    state: str
    topic_partitions: tuple[tuple[str, int], ...] = field(default=())
    txn_start_timestamp: int = -1
    txn_last_update_timestamp: int = -1
    client_transaction_version: int = 0

    def __post_init__(self) -> None:
        _check_int("client_transaction_version", self.client_transaction_version, 0, INT16_MAX)
        for name in ("producer_id", "previous_producer_id", "next_producer_id"):
            _check_int(name, getattr(self, name), -1, INT64_MAX)
        for name in ("producer_epoch", "last_producer_epoch"):
            _check_int(name, getattr(self, name), -1, INT16_MAX)
        _check_int("txn_timeout_ms", self.txn_timeout_ms, INT32_MIN, INT32_MAX)
        for name in ("txn_start_timestamp", "txn_last_update_timestamp"):
            _check_int(name, getattr(self, name), INT64_MIN, INT64_MAX)
        if self.state not in STATE_NAMES:
            raise ValueError(f"unknown transaction state {self.state!r} (known: {', '.join(STATE_NAMES)})")
        object.__setattr__(self, "topic_partitions", _normalise_partitions(self.topic_partitions))

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this value, ``"v"`` first."""
        out: dict[str, Any] = {"v": VALUE_VERSION}
        for name in _VALUE_FIELDS:
            value = getattr(self, name)
            out[name] = [list(tp) for tp in value] if name == "topic_partitions" else value
        if self.client_transaction_version:  # optional (Kafka's tagged field): absent means 0
            out[_OPTIONAL_VALUE_FIELD] = self.client_transaction_version
        return out


def _dumps(obj: dict[str, Any]) -> bytes:
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"cannot encode {obj!r} as UTF-8 ({exc}); a lone surrogate is not a valid string") from exc


def _loads(data: bytes, what: str, location: str) -> dict[str, Any]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CorruptObjectError(location, f"the {what} of a {KIND} record is {type(data).__name__}, not bytes")
    try:
        obj = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CorruptObjectError(location, f"the {what} of a {KIND} record is not UTF-8 JSON ({exc}); "
                                           "the record is corrupt or was not written by txlake") from None
    if not isinstance(obj, dict):
        raise CorruptObjectError(location, f"the {what} of a {KIND} record is not a JSON object: {obj!r}")
    return obj


def _check_version(obj: dict[str, Any], what: str, supported: int, location: str) -> int:
    if "v" not in obj:
        raise CorruptObjectError(location, f"the {what} of a {KIND} record has no format version \"v\"")
    version = obj["v"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise CorruptObjectError(location, f"the {what} of a {KIND} record has an unreadable format version {version!r}")
    if not 1 <= version <= supported:
        raise UnsupportedFormatVersionError(
            location,
            f"{KIND} {what} format version {version} is not supported by this txlake "
            f"(it reads versions 1..{supported}); upgrade txlake to read it")
    return version


def encode_key(transactional_id: str) -> bytes:
    """The key of ``transactional_id``'s records (Kafka's ``TransactionLog.keyToBytes``).

    Raises:
        ValueError: ``transactional_id`` is not a string encodable as UTF-8.
    """
    if not isinstance(transactional_id, str):
        raise ValueError(f"a transactional id must be a string, got {transactional_id!r}")
    return _dumps({"v": KEY_VERSION, "transactional_id": transactional_id})


def decode_key(data: bytes, location: str) -> str:
    """The transactional id of a key (Kafka's ``TransactionLog.readTxnRecordKey``).

    Args:
        location: names the record in error messages (e.g. ``__transaction_state-7@42``).

    Raises:
        CorruptObjectError: not a key of this format.
        UnsupportedFormatVersionError: a key version this txlake does not know.
    """
    obj = _loads(data, "key", location)
    _check_version(obj, "key", KEY_VERSION, location)
    tid = obj.get("transactional_id")
    if not isinstance(tid, str):
        raise CorruptObjectError(location, f"the key of a {KIND} record has no string \"transactional_id\": {obj!r}")
    return tid


def encode_value(value: TxnLogValue) -> bytes:
    """The bytes of a value (Kafka's ``TransactionLog.valueToBytes``)."""
    if not isinstance(value, TxnLogValue):
        raise ValueError(f"expected a TxnLogValue, got {type(value).__name__}")
    return _dumps(value.to_json())


def decode_value(data: bytes | None, location: str) -> TxnLogValue | None:
    """Decode a value; ``None`` (a tombstone) stays ``None`` (Kafka's ``readTxnRecordValue``).

    Raises:
        CorruptObjectError: not UTF-8 JSON, a field missing or out of range, an unknown state.
        UnsupportedFormatVersionError: a value version this txlake does not know.
    """
    if data is None:
        return None
    obj = _loads(data, "value", location)
    _check_version(obj, "value", VALUE_VERSION, location)
    missing = [name for name in _VALUE_FIELDS if name not in obj]
    if missing:
        raise CorruptObjectError(location, f"the value of a {KIND} record lacks {', '.join(missing)}")
    partitions = obj["topic_partitions"]
    if not isinstance(partitions, list):
        raise CorruptObjectError(location, f"topic_partitions of a {KIND} record is not a list: {partitions!r}")
    try:
        return TxnLogValue(**{name: obj[name] for name in _VALUE_FIELDS},
                           client_transaction_version=obj.get(_OPTIONAL_VALUE_FIELD, 0))
    except (ValueError, TypeError) as exc:
        raise CorruptObjectError(location, f"invalid {KIND} value: {exc}") from None


# ---------------------------------------------------------------------------- canonical form
#: a JSON string character needing no escape, ASCII only (so a match also proves valid UTF-8)
_TEXT = rb'[\x20\x21\x23-\x5b\x5d-\x7f]'
_PRODUCER_ID = rb'(-1|0|[1-9][0-9]{0,17})'                  # -1..INT64_MAX (18 digits at most)
_EPOCH = rb'(-1|[0-9]|[1-9][0-9]{1,3}|[12][0-9]{4}|3[01][0-9]{3}|32[0-6][0-9]{2}|327[0-5][0-9]|3276[0-7])'  # -1..INT16_MAX
_INT32 = rb'(-?(?:0|[1-9][0-9]{0,8}))'                      # within int32 (9 digits at most)
_INT64 = rb'(-?(?:0|[1-9][0-9]{0,17}))'                     # within int64 (18 digits at most)
_PAIR = rb'\["' + _TEXT + rb'+",(?:0|[1-9][0-9]{0,8})\]'    # [topic, partition within 0..INT32_MAX]
_CANONICAL_FIELD = {
    "producer_id": _PRODUCER_ID, "previous_producer_id": _PRODUCER_ID, "next_producer_id": _PRODUCER_ID,
    "producer_epoch": _EPOCH, "last_producer_epoch": _EPOCH, "txn_timeout_ms": _INT32,
    # Dead and PrepareEpochFence are never written (a replay treats them specially): not canonical
    "state": rb'"(' + b"|".join(n.encode() for n in STATE_NAMES if n not in ("Dead", "PrepareEpochFence")) + rb')"',
    "topic_partitions": rb'(\[(?:' + _PAIR + rb'(?:,' + _PAIR + rb')*)?\])',
    "txn_start_timestamp": _INT64, "txn_last_update_timestamp": _INT64,
}
_VALUE_PATTERN = (rb'\{"v":' + str(VALUE_VERSION).encode() +
                  b"".join(b',"' + name.encode() + b'":' + _CANONICAL_FIELD[name] for name in _VALUE_FIELDS) + rb'\}')

#: ``fullmatch`` of a key as :func:`encode_key` writes an ASCII id; group 1 is the id.
CANONICAL_KEY = re.compile(rb'\{"v":' + str(KEY_VERSION).encode() + rb',"transactional_id":"(' + _TEXT + rb'*)"\}')
#: ``fullmatch`` of a value as :func:`encode_value` writes it with ASCII topic names, in a
#: state other than Dead and PrepareEpochFence (without groups: a check about twice as fast
#: as one that captures the fields)
CANONICAL_VALUE = re.compile(re.sub(rb'\((?!\?)', b'(?:', _VALUE_PATTERN))
_CANONICAL_VALUE_FIELDS = re.compile(_VALUE_PATTERN)  # groups 1..10: the fields in _VALUE_FIELDS order
_CANONICAL_PAIRS = re.compile(rb'\["(' + _TEXT + rb'+)",([0-9]+)\]')


def check_canonical_values(values: Sequence[bytes]) -> list[bool] | None:
    """Which of ``values`` are canonical (:data:`CANONICAL_VALUE`): :func:`decode_value`
    accepts each of them, and :func:`canonical_value_fields` reads it.

    Returns:
        None when every value is canonical, else one flag per value.
    """
    matches = list(map(CANONICAL_VALUE.fullmatch, values))
    if None not in matches:
        return None
    return [m is not None for m in matches]


def canonical_value_fields(data: bytes) -> tuple:
    """The fields of a canonical value, in :data:`_VALUE_FIELDS` order.

    Equal to the fields of the :class:`TxnLogValue` that :func:`decode_value` returns for the
    same bytes (``topic_partitions`` sorted, without duplicates), without building it.

    Raises:
        ValueError: ``data`` is not of the canonical form.
    """
    match = _CANONICAL_VALUE_FIELDS.fullmatch(data)
    if match is None:
        raise ValueError(f"not a {KIND} value of the canonical form: {bytes(data)[:200]!r}")
    (producer_id, previous_producer_id, next_producer_id, producer_epoch, last_producer_epoch, txn_timeout_ms,
     state, partitions, txn_start_timestamp, txn_last_update_timestamp) = match.groups()
    if partitions == b"[]":
        topic_partitions: tuple[tuple[str, int], ...] = ()
    else:
        topic_partitions = tuple(sorted({(topic.decode("ascii"), int(p))
                                         for topic, p in _CANONICAL_PAIRS.findall(partitions)}))
    return (int(producer_id), int(previous_producer_id), int(next_producer_id), int(producer_epoch),
            int(last_producer_epoch), int(txn_timeout_ms), state.decode("ascii"), topic_partitions,
            int(txn_start_timestamp), int(txn_last_update_timestamp))
