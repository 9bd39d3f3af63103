"""``__transaction_state`` as the transaction coordinator's log.

The coordinator's log is a topic stored like any other (DESIGN.md "Internal logs are
topics"): 50 partitions by default (``transaction.state.log.num.partitions``),
``cleanup.policy=compact``. This adapter gives the TransactionStateManager the two
operations it needs -- a durable append (acks=all) through the partition writer (:mod:`.partition_writer`),
and a full read of one partition for replay (record by record, or in column chunks for
the fast replay) from its committed segments.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import TYPE_CHECKING, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlake.catalog.topic_config import INTERNAL_TOPIC_CONFIG
from txlake.catalog.topic_names import TRANSACTION_STATE_TOPIC
from txlake.formats.errors import CorruptObjectError, FormatError
from txlake.formats.records import HEADER_TYPE, PAYLOAD_SCHEMA, read_segment

from .errors import ApiError, Errors
from .group_commit import now_ms
from .partition_writer import PartitionWriter
from .requests import ProduceBatch

if TYPE_CHECKING:
    from txlake.catalog.state import SegmentInfo

#: seconds an append waits for its commit (the broker's produce timeout)
APPEND_TIMEOUT_S = 30.0
#: records per chunk when the coordinator replays a partition
READ_CHUNK_RECORDS = 100_000
_REPLAY_COLUMNS = ["offset", "key", "value", "is_control"]
#: bytes of decoded segments a replay keeps for the partitions it reads next
READ_AHEAD_BYTES = 256 * 1024 * 1024


class TransactionTopicLog:
    """The TransactionStateManager's ``TransactionLog`` over the ``__transaction_state`` topic.

    Args:
        writer: the partition writer of the storage root (the broker holding the lease).
        num_partitions: partitions of the topic (created on first use with this count).
    """

    def __init__(self, writer: PartitionWriter, num_partitions: int):
        self.writer = writer
        self.num_partitions = num_partitions
        # read-ahead of a replay sweep (see read_chunks): (object, first row group) -> (partition, records)
        self._ahead: dict[tuple[str, int], tuple[int, pa.Table]] = {}
        self._ahead_bytes = 0
        self._ahead_partition = -1
        self._ahead_index: dict[str, list] | None = None
        self._ahead_lock = threading.Lock()

    def exists(self) -> bool:
        """True when ``__transaction_state`` exists (a transactional producer ran on this root);
        a look at the catalog the process holds, no I/O.

        Raises:
            ApiError: INVALID_PARTITIONS when it exists with another partition count.
        """
        existing = self.writer.topics().get(TRANSACTION_STATE_TOPIC)
        if existing is not None and len(existing.partitions) != self.num_partitions:
            raise ApiError(Errors.INVALID_PARTITIONS,
                           f"{TRANSACTION_STATE_TOPIC} has {len(existing.partitions)} partitions but "
                           f"transaction.state.log.num.partitions is {self.num_partitions}; it cannot change")
        return existing is not None

    def ensure_topic(self) -> None:
        """Create ``__transaction_state`` (compacted) if it does not exist yet (Kafka creates it
        when the first transactional producer looks for its coordinator).

        Raises:
            ApiError: the topic exists with another partition count, or cannot be created.
        """
        if self.exists():
            return
        ((error, message),) = self.writer.create_topics(
            [(TRANSACTION_STATE_TOPIC, self.num_partitions, dict(INTERNAL_TOPIC_CONFIG))], internal_topics_allowed=True)
        if error not in (Errors.NO_ERROR, Errors.TOPIC_ALREADY_EXISTS):
            raise ApiError(error, f"cannot create {TRANSACTION_STATE_TOPIC}: {message}")

    def append(self, partition: int, key: bytes, value: bytes | None) -> int:
        """Append one record and wait for its commit; return its offset.

        Raises:
            ApiError: the broker refused or could not commit the record (REQUEST_TIMED_OUT
                after :data:`APPEND_TIMEOUT_S`).
        """
        try:
            return self.append_async(partition, key, value).result(timeout=APPEND_TIMEOUT_S)
        except FutureTimeoutError:
            raise ApiError(Errors.REQUEST_TIMED_OUT,
                           f"append to {TRANSACTION_STATE_TOPIC}-{partition} was not committed in time") from None

    def append_async(self, partition: int, key: bytes, value: bytes | None, urgent: bool = True) -> Future:
        """Queue one record; the future resolves to its offset once it is committed, or raises
        :class:`ApiError` when the broker refused or could not commit it. ``urgent`` ends the
        writer's linger at once (someone waits for the record); otherwise it commits with
        whatever is queued within ``storage.flush.linger.ms``.

        The writer commits in queue order and stops at its first failed commit, so anything
        queued after this record is never durable without it.
        """
        records = pa.Table.from_arrays(
            [pa.array([now_ms()], pa.int64()), pa.array([key], pa.binary()), pa.array([value], pa.binary()),
             pa.nulls(1, HEADER_TYPE)], schema=PAYLOAD_SCHEMA)
        (queued,) = self.writer.produce_async([ProduceBatch(TRANSACTION_STATE_TOPIC, partition, records, urgent=urgent)],
                                              internal_topics_allowed=True)  # the coordinator's own append
        offset: Future = Future()

        def resolve(done: Future) -> None:
            result = done.result()
            if result.error != Errors.NO_ERROR:
                offset.set_exception(ApiError(
                    result.error, f"append to {TRANSACTION_STATE_TOPIC}-{partition} failed: {result.message}"))
            else:
                offset.set_result(result.base_offset)

        queued.add_done_callback(resolve)
        return offset

    def read(self, partition: int) -> Iterator[tuple[int, bytes, bytes | None]]:
        """Every record of one partition, in offset order: ``(offset, key, value)``."""
        for offsets, keys, values in self.read_chunks(partition):
            yield from zip(offsets, keys, values)

    def read_chunks(self, partition: int, max_records: int = READ_CHUNK_RECORDS) -> Iterator[tuple[list, list, list]]:
        """Every record of one partition, in offset order, as ``(offsets, keys, values)`` lists of
        at most ``max_records`` records (control records are skipped).

        The replay reads the committed segments (log start to high watermark) itself: only
        the columns it needs, past the broker's decoded-segment cache (the log is read once,
        at start-up), and each object once for a sweep over the partitions. An object holds
        row groups of many partitions (one group commit each), so reading a partition's
        segments one by one would open and decode every object once per partition: the
        segments of later partitions in the same object are read with it and kept
        (:data:`READ_AHEAD_BYTES` at most) until their partition is read, which the
        coordinator does next, in partition order.

        A topic not created yet reads as empty partitions.

        Raises:
            ApiError: CORRUPT_MESSAGE when an object cannot be read (the message names it).
        """
        catalog = self.writer.catalog
        with catalog.lock:
            topic = catalog.state.topics.get(TRANSACTION_STATE_TOPIC)
            if topic is None:  # no transactional producer ever ran here: nothing to replay
                return
            state = catalog.state.partition(TRANSACTION_STATE_TOPIC, partition)
            start, end = state.log_start_offset, state.high_watermark
            segments = [seg for seg in state.segments_from(start) if seg.base_offset < end]
            if partition <= self._ahead_partition or self._ahead_index is None:  # a new sweep
                self._ahead_index = _index_by_object(topic.partitions if topic is not None else [])
        with self._ahead_lock:
            self._ahead_partition = partition
            for key in [k for k, (p, _) in self._ahead.items() if p < partition]:  # never read: stale
                self._drop_ahead(key)
        pieces: list[pa.Table] = []  # small segments (one per group commit) are handed over together
        rows = 0
        for seg in segments:
            with self._ahead_lock:
                kept = self._ahead.get((seg.path, seg.row_group_start))
                if kept is not None:
                    self._drop_ahead((seg.path, seg.row_group_start))
            table = kept[1] if kept is not None and kept[1].num_rows == seg.record_count else self._read_object(seg)
            if seg.base_offset < start or seg.last_offset >= end:
                lo, hi = np.searchsorted(table.column("offset").to_numpy(), [start, end])
                table = table.slice(int(lo), int(hi - lo))
            control = table.column("is_control")
            if pc.any(control).as_py():
                table = table.filter(pc.invert(control))
            pieces.append(table)
            rows += table.num_rows
            if rows >= max_records:
                yield from _column_chunks(pieces, max_records, final=False)
                rows = sum(t.num_rows for t in pieces)
        yield from _column_chunks(pieces, max_records, final=True)

    def _read_object(self, seg: "SegmentInfo") -> pa.Table:
        """``seg``'s records, reading with them the segments of later partitions in its object
        (kept for their partition's read while the read-ahead budget lasts)."""
        store = self.writer.store
        location = store.uri(seg.path)
        with self._ahead_lock:
            budget = READ_AHEAD_BYTES - self._ahead_bytes
        together = [s for s in (self._ahead_index or {}).get(seg.path, ())
                    if s.partition > seg.partition and (s.path, s.row_group_start) not in self._ahead]
        if budget <= 0:
            together = []
        wanted = sorted([seg] + together, key=lambda s: s.row_group_start)
        try:
            table = store.read_object(seg.path, lambda f: read_segment(
                f, location, [rg for s in wanted for rg in s.row_groups], columns=_REPLAY_COLUMNS))
            expected = sum(s.record_count for s in wanted)
            if table.num_rows != expected:
                raise CorruptObjectError(location, f"holds {table.num_rows} records of {TRANSACTION_STATE_TOPIC} "
                                                   f"in its row groups of segments {[s.partition for s in wanted]}, "
                                                   f"the catalog expects {expected}")
        except (FormatError, FileNotFoundError) as exc:
            raise ApiError(Errors.CORRUPT_MESSAGE, f"cannot read {TRANSACTION_STATE_TOPIC}-{seg.partition} at offset "
                                                   f"{seg.base_offset}: {exc}") from exc
        mine, row = table, 0
        for s in wanted:
            piece = table.slice(row, s.record_count)
            row += s.record_count
            if s is seg:
                mine = piece
                continue
            with self._ahead_lock:
                if self._ahead_bytes < READ_AHEAD_BYTES and s.partition > self._ahead_partition:
                    # a zero-copy slice: the object's buffers go once its last kept segment is read
                    self._ahead[(s.path, s.row_group_start)] = (s.partition, piece)
                    self._ahead_bytes += piece.nbytes
        return mine

    def _drop_ahead(self, key: tuple[str, int]) -> None:
        """Forget a kept segment (the caller holds the read-ahead lock)."""
        _, table = self._ahead.pop(key)
        self._ahead_bytes -= table.nbytes


def _column_chunks(pieces: list[pa.Table], max_records: int, final: bool) -> Iterator[tuple[list, list, list]]:
    """``(offsets, keys, values)`` lists of ``max_records`` rows taken from the front of
    ``pieces`` (which keeps the rest); with ``final``, the rest too."""
    table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0] if pieces else None
    pieces.clear()
    if table is None:
        return
    done = 0
    while table.num_rows - done >= max_records or (final and done < table.num_rows):
        piece = table.slice(done, max_records)
        done += piece.num_rows
        yield piece.column("offset").to_pylist(), piece.column("key").to_pylist(), piece.column("value").to_pylist()
    if done < table.num_rows:
        pieces.append(table.slice(done))


def _index_by_object(partitions) -> dict[str, list["SegmentInfo"]]:
    """The segments of ``partitions``, by object."""
    index: dict[str, list] = defaultdict(list)
    for p in partitions:
        for seg in p.segments:
            index[seg.path].append(seg)
    return index
