"""The history a verification workload records: what each client did and saw.

Follows the shape of Jepsen's Kafka workload histories (jepsen.tests.kafka): every
send attempt with its acknowledgement (offset) or error, every transaction's outcome
as the client saw it, every poll with the records and offsets it returned, every
offset commit, and at the end one final read per reader (in-process Consumer,
DuckDB view, ...). Values are unique per history, so a value names its write.

A history is a list of events, kept in memory and optionally appended as JSON lines
(one object per line, ``"type"`` naming the event) so a failed trial can be checked
again offline: :meth:`History.load`.

Times (``t_start``/``t_end``) are ``time.monotonic()`` seconds of one process; the
checker compares them only within one history.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import IO, Iterable, Union

#: a read record: (topic, partition, offset, value)
Record = tuple[str, int, int, str]

SEND_OK = "ok"          # acknowledged with an offset (definite)
SEND_FAIL = "fail"      # a definite error: the record was not appended
SEND_INFO = "info"      # unknown outcome (timeout, fatal producer, process killed)

TXN_COMMIT = "commit"   # commit_transaction() returned
TXN_ABORT = "abort"     # abort_transaction() returned
TXN_INFO = "info"       # unknown: commit or abort raised, or the process died


@dataclass
class Send:
    """One send attempt (``Producer.produce``) and its delivery report.

    Attributes:
        process: the writer's name (one producer instance).
        topic, partition: where the record went (partition -1 if not known).
        value: the record's value (unique in the history).
        outcome: :data:`SEND_OK`, :data:`SEND_FAIL` or :data:`SEND_INFO`.
        offset: the acknowledged offset (``SEND_OK`` only), else None.
        txn: the transaction's id in the history (``Txn.txn``) or None outside one.
        error: the error's name for ``SEND_FAIL``/``SEND_INFO``.
        source: for the output of a consume-transform-produce loop, the value of the input
            record it copies (outputs are named ``<source>><transaction>``, so each stays
            unique); None for other sends.
    """

    process: str
    topic: str
    partition: int
    value: str
    outcome: str
    offset: int | None = None
    txn: str | None = None
    error: str | None = None
    t_start: float = 0.0
    t_end: float = 0.0
    type: str = "send"
    source: str | None = None


@dataclass
class Txn:
    """A transaction's outcome as its producer saw it.

    Attributes:
        txn: unique id of this transaction in the history.
        outcome: :data:`TXN_COMMIT`, :data:`TXN_ABORT` or :data:`TXN_INFO`.
        t_start: when ``commit_transaction``/``abort_transaction`` was invoked (s).
        t_end: when it returned (s).
    """

    process: str
    txn: str
    outcome: str
    t_start: float = 0.0
    t_end: float = 0.0
    error: str | None = None
    type: str = "txn"


@dataclass
class Poll:
    """One poll/consume call and the records it returned, in the order returned.

    Attributes:
        isolation: ``read_committed`` or ``read_uncommitted``.
        records: ``[(topic, partition, offset, value), ...]``.
        t_start, t_end: invocation and return times (s).
        txn: the transaction (``Txn.txn``) this poll's records were consumed in, when a
            consume-transform-produce loop sends their offsets in it; else None.
    """

    process: str
    isolation: str
    records: list = field(default_factory=list)
    t_start: float = 0.0
    t_end: float = 0.0
    txn: str | None = None
    type: str = "poll"


@dataclass
class Assign:
    """The consumer's position was reset (assign, seek, rebalance): a poll after it need
    not continue from the offsets read before it."""

    process: str
    partitions: list = field(default_factory=list)   # [(topic, partition, start offset or -2)]
    t_start: float = 0.0
    type: str = "assign"


@dataclass
class OffsetCommit:
    """Offsets a consumer group committed (``Consumer.commit`` or
    ``send_offsets_to_transaction``, then ``txn`` names its transaction)."""

    process: str
    group: str
    offsets: list = field(default_factory=list)       # [(topic, partition, next offset)]
    txn: str | None = None
    t_start: float = 0.0
    type: str = "offset_commit"


@dataclass
class FinalRead:
    """Everything one reader returned from the final committed state.

    Attributes:
        reader: its name (``consumer``, ``duckdb``, ``wire``, ...).
        records: ``[(topic, partition, offset, value), ...]``.
    """

    reader: str
    records: list = field(default_factory=list)
    type: str = "final"


@dataclass
class FinalOffsets:
    """A consumer group's committed offsets read after the run (``Consumer.committed``): the
    consume-transform-produce group claims every input record below them as copied.

    Attributes:
        group: the group id.
        offsets: ``[(topic, partition, next offset), ...]`` (partitions without a committed
            offset left out).
    """

    group: str
    offsets: list = field(default_factory=list)
    type: str = "final_offsets"


Event = Union[Send, Txn, Poll, Assign, OffsetCommit, FinalRead, FinalOffsets]
_TYPES = {cls.__dataclass_fields__["type"].default: cls
          for cls in (Send, Txn, Poll, Assign, OffsetCommit, FinalRead, FinalOffsets)}


def event_from_json(obj: dict) -> Event:
    """The event a JSON object (one line of a history file) describes.

    Raises:
        ValueError: ``obj`` has no known ``type`` or fields that type does not have.
    """
    cls = _TYPES.get(obj.get("type"))
    if cls is None:
        raise ValueError(f"history event has unknown type {obj.get('type')!r}: {obj!r}")
    try:
        event = cls(**obj)
    except TypeError as exc:
        raise ValueError(f"history event of type {obj['type']!r} is malformed ({exc}): {obj!r}") from None
    for name in ("records", "partitions", "offsets"):
        if hasattr(event, name):
            setattr(event, name, [tuple(r) for r in getattr(event, name)])
    return event


class History:
    """A thread-safe, append-only list of events, optionally mirrored to a JSON-lines file.

    Args:
        sink: a text file to append each event to as one JSON line (flushed per event,
            so a killed process loses at most the line being written), or None.
    """

    def __init__(self, events: Iterable[Event] = (), sink: IO[str] | None = None):
        self._lock = threading.Lock()
        self.events: list[Event] = list(events)
        self._sink = sink

    @staticmethod
    def now() -> float:
        """The clock of history times: ``time.monotonic()`` seconds."""
        return time.monotonic()

    def add(self, event: Event) -> Event:
        """Append ``event`` (and write its JSON line); returns it."""
        with self._lock:
            self.events.append(event)
            if self._sink is not None:
                self._sink.write(json.dumps(asdict(event)) + "\n")
                self._sink.flush()
        return event

    def of(self, cls: type) -> list:
        """The events of one class, in history order."""
        with self._lock:
            return [e for e in self.events if isinstance(e, cls)]

    def dump(self, fp: IO[str]) -> None:
        """Write every event as a JSON line to ``fp``."""
        with self._lock:
            for e in self.events:
                fp.write(json.dumps(asdict(e)) + "\n")

    @classmethod
    def load(cls, fp: IO[str]) -> "History":
        """Read a history written by :meth:`dump` or a sink.

        Raises:
            ValueError: a line is not JSON or not an event (naming the line number).
        """
        events = []
        for n, line in enumerate(fp, 1):
            if not line.strip():
                continue
            try:
                events.append(event_from_json(json.loads(line)))
            except ValueError as exc:
                raise ValueError(f"history line {n}: {exc}") from None
        return cls(events)
