"""What the write tasks of the Spark sink do: check the input, resolve partitions, stage rows.

A Spark write task never writes to a topic. It turns its rows into *staged records* --
``topic``, ``partition`` (already resolved, as Kafka's producer would), ``key``,
``value``, ``headers`` -- and stores them as Arrow IPC stream objects under the storage
root::

    _staging/spark/<write id>/<spark partition>-<attempt>-<task attempt id>-<part>.arrows

through :class:`~txlake.catalog.storage.ObjectStore` (no writer lease, no engine: any
process may stage). The task then returns a :class:`StagingMessage` naming its objects.
Only the driver's commit appends staged records to topics, all of them in one
transaction (:mod:`.staged_commit`), so what a task staged is invisible until then and
a task attempt whose message Spark does not pass to ``commit()`` (failed, killed,
speculative loser) never shows up: its objects are deleted by listing the write's
staging folder (:func:`delete_staged`).

The columns follow Spark's Kafka sink (``KafkaWriter.validateQuery``): ``value``
(binary or string, required), ``key`` (binary or string), ``topic`` (string; the
``topic`` option overrides it), ``partition`` (int; null or absent: Kafka's default
partitioner -- murmur2 of the key, a sticky random partition per Arrow batch for a null
key), ``headers`` (array<struct<key: string, value: binary>>). Other columns are
ignored, as Spark's Kafka sink does.
"""

from __future__ import annotations

import logging
import random
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from txlake.catalog.storage import ObjectStore
from txlake.formats.records import HEADER_TYPE

log = logging.getLogger(__name__)

__all__ = [
    "STAGING_PREFIX", "STAGED_SCHEMA", "DEFAULT_MAX_FILE_BYTES", "TxlakeWriteError", "StagedFile",
    "StagingMessage", "WriteColumns", "TaskStager", "check_write_options", "client_conf", "write_columns",
    "stage_task", "delete_staged", "delete_stale_staged", "read_staged", "murmur2_partitions", "STALE_STAGING_MS",
    "store_of", "committed_files", "task_property",
]

#: every staging folder lives under this prefix of the storage root
STAGING_PREFIX = "_staging/spark/"
#: a task starts a new staged object once the current one holds this many bytes (Arrow, uncompressed)
DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
#: a task writes its rows in Arrow batches of this many (each grouped by Kafka partition)
STAGE_BATCH_ROWS = 65_536
#: columns of a staged object (one row per record to append)
STAGED_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("headers", HEADER_TYPE),
])
_SUFFIX = ".arrows"
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


class TxlakeWriteError(ValueError):
    """The input of a Spark write is not what Spark's Kafka sink accepts (schema, options or a
    row's topic/partition); the message says which and what to do."""


# ---------------------------------------------------------------------------------- options
def _option(options: Mapping[str, str], name: str) -> str | None:
    """An option by case-insensitive name (Spark's options are case-insensitive)."""
    wanted = name.lower()
    for key, value in options.items():
        if key.lower() == wanted:
            return value
    return None


#: the read options (spark.read/readStream), ignored by writes so one options dict can serve
#: both, as Spark's Kafka sink ignores its source's options
_READ_OPTIONS = frozenset({
    "subscribe", "subscribepattern", "assign", "startingoffsets", "endingoffsets", "startingtimestamp",
    "endingtimestamp", "startingoffsetsbytimestamp", "endingoffsetsbytimestamp",
    "startingoffsetsbytimestampstrategy", "isolation.level", "includeheaders", "failondataloss", "minpartitions",
    "maxrecordsperpartition", "maxoffsetspertrigger", "groupidprefix", "fetchoffset.numretries",
    "fetchoffset.retryintervalms", "kafkaconsumer.polltimeoutms",
})
#: the write options besides ``storage.*`` and ``kafka.*`` (lower case, as Spark hands them over)
_WRITE_OPTIONS = frozenset({"topic", "staging.maxfilebytes"})
#: streaming writes also take these; Spark adds the last two from writeStream's settings
_STREAM_OPTIONS = frozenset({"transactional.id", "checkpointlocation", "queryname"})
_SPELLING = {"staging.maxfilebytes": "staging.maxFileBytes", "checkpointlocation": "checkpointLocation",
             "queryname": "queryName"}


def check_write_options(options: Mapping[str, str], streaming: bool) -> None:
    """Refuse an option no write knows, naming it (and the closest known name), as the reads do:
    a misspelt option must not be silently ignored. ``storage.*`` and ``kafka.*`` keys are
    checked by :func:`client_conf`; the read options are ignored.

    Raises:
        TxlakeWriteError: an unknown option, or ``transactional.id`` on a batch write.
    """
    import difflib

    known = _WRITE_OPTIONS | (_STREAM_OPTIONS if streaming else frozenset())
    for key in options:
        low = key.lower()
        if low.startswith(("storage.", "kafka.")) or low == "storage.options" or low in known or low in _READ_OPTIONS:
            continue
        if low == "transactional.id":
            raise TxlakeWriteError("option 'transactional.id' applies to streaming writes only: a batch write "
                                   "commits as one transaction with an id of its own")
        if low == "path":
            raise TxlakeWriteError("the txlake sink writes to topics, not to a path: use .option(\"topic\", ...) "
                                   "or a 'topic' column, and save()/start() without a path")
        names = sorted(_SPELLING.get(k, k) for k in known) + ["storage.url", "storage.options.<name>",
                                                              "kafka.<producer setting>"]
        close = difflib.get_close_matches(low, [n.lower() for n in names], n=1, cutoff=0.75)
        hint = f" (did you mean '{_SPELLING.get(close[0], close[0])}'?)" if close else ""
        raise TxlakeWriteError(f"unknown option '{key}' for a txlake {'streaming ' if streaming else ''}write{hint}; "
                               f"the write options are {', '.join(names)}")


def client_conf(options: Mapping[str, str]) -> dict[str, Any]:
    """The txlake client config of a write.

    * ``storage.url`` (default: ``$TXLAKE_STORAGE``, else ~/.txlake/data, resolved here on
      the driver so every worker writes to the same root);
    * ``storage.options`` -- the fsspec options of ``storage.options`` / ``storage.options.<k>``,
      parsed exactly as the reads parse them (:func:`.options.parse_storage_options`);
    * every other ``storage.*`` key (engine settings such as ``storage.lease.ms``) as is;
    * ``kafka.<key>`` options with the prefix removed -- producer settings, as Spark's Kafka
      sink hands ``kafka.*`` to its producer (e.g. ``kafka.transaction.timeout.ms``).

    Raises:
        TxlakeWriteError: ``kafka.transactional.id`` / ``kafka.enable.idempotence`` (the
            connector owns them); an unknown or invalid key (checked by txlake's client
            config, the message names it).
        OptionError: malformed ``storage.options``.
    """
    from txlake.config import default_storage_url, parse_config
    from txlake.error import KafkaException

    from .options import parse_storage_options

    conf: dict[str, Any] = {}
    for key, value in options.items():
        low = key.lower()
        if low == "storage.options" or low.startswith("storage.options."):
            continue
        if low.startswith("storage."):
            conf[low] = value
        elif low.startswith("kafka."):
            name = low[len("kafka."):]
            if name in ("transactional.id", "enable.idempotence"):
                raise TxlakeWriteError(
                    f"option {key!r} is not allowed: the txlake sink writes every job as one transaction "
                    "with a transactional.id of its own (for a streaming query, set the 'transactional.id' option)")
            conf[name] = value
    conf["storage.url"] = str(conf.get("storage.url") or "").strip() or default_storage_url()
    conf["storage.options"] = parse_storage_options(options)
    try:
        parse_config(conf, "producer")
    except KafkaException as exc:
        raise TxlakeWriteError(f"invalid txlake sink option: {exc.args[0].str()}") from None
    return conf


def store_of(conf: Mapping[str, Any]) -> ObjectStore:
    """The :class:`ObjectStore` of a client config (``storage.url`` and the ``storage.options``
    dict, or ``storage.options.<k>`` keys as txlake clients take them)."""
    prefix = "storage.options."
    options = dict(conf.get("storage.options") or {})
    options.update({k[len(prefix):]: v for k, v in conf.items() if k.startswith(prefix)})
    return ObjectStore(conf["storage.url"], options)


# ---------------------------------------------------------------------------------- schema
def _is_text_or_binary(dt) -> bool:
    return isinstance(dt, (StringType, BinaryType))


def _is_headers_type(dt) -> bool:
    if not isinstance(dt, ArrayType) or not isinstance(dt.elementType, StructType):
        return False
    fields = dt.elementType.fields
    return (len(fields) == 2 and fields[0].name == "key" and isinstance(fields[0].dataType, StringType)
            and fields[1].name == "value" and isinstance(fields[1].dataType, BinaryType))


@dataclass(frozen=True)
class WriteColumns:
    """The columns a write uses, checked against Spark's Kafka sink rules.

    Attributes:
        topic_option: the ``topic`` option (overrides any ``topic`` column), or None.
        topic / key / partition / headers: whether the input has that column (``value`` it must).
        max_file_bytes: size (bytes of Arrow data) at which a task starts a new staged object.
        max_record_bytes: the producer's ``message.max.bytes`` (``kafka.message.max.bytes``):
            a larger record (key + value + headers) fails its task, as Kafka's producer refuses it.
    """

    topic_option: str | None
    topic: bool
    key: bool
    partition: bool
    headers: bool
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_record_bytes: int = 1_000_000


def write_columns(schema: StructType, options: Mapping[str, str]) -> WriteColumns:
    """Check a write's input schema and options as Spark's Kafka sink does (``KafkaWriter.validateQuery``).

    Raises:
        TxlakeWriteError: no ``value`` column; ``key``/``value`` neither string nor binary;
            ``topic`` not a string; ``partition`` not an int; ``headers`` not
            array<struct<key: string, value: binary>>; neither a ``topic`` option nor a
            ``topic`` column; an empty ``topic`` option; a bad ``staging.maxFileBytes``.
    """
    types = {f.name: f.dataType for f in schema.fields}
    topic_option = _option(options, "topic")
    if topic_option is not None and not topic_option.strip():
        raise TxlakeWriteError("option 'topic' is empty: name the topic to write to")
    if "topic" in types:
        if not isinstance(types["topic"], StringType):
            raise TxlakeWriteError(
                f"Topic type must be a StringType (column 'topic' is {types['topic'].simpleString()})")
    elif topic_option is None:
        raise TxlakeWriteError("topic option required when no 'topic' attribute is present. "
                               "Use the topic option for setting a topic.")
    if "value" not in types:
        raise TxlakeWriteError("Required attribute 'value' not found (the txlake sink, as Spark's Kafka sink, "
                               f"needs a 'value' column of string or binary; the input has {sorted(types)})")
    if not _is_text_or_binary(types["value"]):
        raise TxlakeWriteError(f"value attribute type must be a StringType or BinaryType "
                               f"(column 'value' is {types['value'].simpleString()}; cast it, e.g. to_json(...))")
    if "key" in types and not _is_text_or_binary(types["key"]):
        raise TxlakeWriteError(f"key attribute type must be a StringType or BinaryType "
                               f"(column 'key' is {types['key'].simpleString()})")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise TxlakeWriteError(f"partition attribute type must be an IntegerType "
                               f"(column 'partition' is {types['partition'].simpleString()})")
    if "headers" in types and not _is_headers_type(types["headers"]):
        raise TxlakeWriteError("headers attribute type must be array<struct<key: string, value: binary>> "
                               f"(column 'headers' is {types['headers'].simpleString()})")
    max_bytes = _option(options, "staging.maxFileBytes")
    try:
        max_file_bytes = int(max_bytes) if max_bytes is not None else DEFAULT_MAX_FILE_BYTES
    except ValueError:
        max_file_bytes = 0
    if max_file_bytes < 1:
        raise TxlakeWriteError(f"option 'staging.maxFileBytes' must be a positive integer (bytes), not {max_bytes!r}")
    max_record = _option(options, "kafka.message.max.bytes")
    return WriteColumns(topic_option.strip() if topic_option is not None else None, "topic" in types,
                        "key" in types, "partition" in types, "headers" in types, max_file_bytes,
                        int(max_record) if max_record is not None else 1_000_000)


# ---------------------------------------------------------------------------------- messages
@dataclass(frozen=True)
class StagedFile:
    """One staged object: ``key`` under the storage root, ``rows`` records in it, ``topics``
    as ``((topic, rows), ...)``, ``nbytes`` its size. Plain data (JSON via :meth:`to_dict`)."""

    key: str
    rows: int
    topics: tuple[tuple[str, int], ...]
    nbytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """``{"key", "rows", "topics": {topic: rows}, "nbytes"}``."""
        return {"key": self.key, "rows": self.rows, "topics": dict(self.topics), "nbytes": self.nbytes}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "StagedFile":
        """The inverse of :meth:`to_dict`."""
        return cls(data["key"], int(data["rows"]), tuple((t, int(n)) for t, n in dict(data["topics"]).items()),
                   int(data.get("nbytes", 0)))


@dataclass
class StagingMessage(WriterCommitMessage):
    """What a write task returns to the driver: the objects it staged.

    Attributes:
        files: the staged objects, in the order the task wrote them.
        partition_id / attempt_number / task_attempt_id: the Spark task attempt
            (-1 outside a Spark task).
        query_id: the streaming query's id (Spark's ``sql.streaming.queryId``), else None.
        batch_id: the micro-batch id (Spark's ``streaming.sql.batchId``), else None.
    """

    files: list[StagedFile] = field(default_factory=list)
    partition_id: int = -1
    attempt_number: int = -1
    task_attempt_id: int = -1
    query_id: str | None = None
    batch_id: int | None = None

    @property
    def rows(self) -> int:
        """Records staged by the task."""
        return sum(f.rows for f in self.files)


# ---------------------------------------------------------------------------------- staging
def _binary(col: pa.ChunkedArray | pa.Array, name: str) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_binary(col.type):
        return col
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_large_binary(col.type):
        return col.cast(pa.binary())
    if pa.types.is_null(col.type):
        return pa.nulls(len(col), pa.binary())
    raise TxlakeWriteError(f"column {name!r} must be binary or string, not {col.type}")


_M = np.uint32(0x5BD1E995)
_SEED = np.uint32(0x9747B28C)


def murmur2_partitions(keys: pa.Array, num_partitions: int) -> np.ndarray:
    """Kafka's default partitioner over a column of non-null keys, vectorised: for every key the
    partition :func:`txlake.engine.partitioner.partition_for_key` gives it
    (``toPositive(murmur2(key)) % num_partitions``), as int32.

    The same arithmetic as :func:`txlake.engine.partitioner.murmur2` on uint32 arrays: one pass
    per 4-byte block index over the keys that long, then the tail and the final mix. About
    50x faster than calling it once per key, which dominated a write of unique keys.

    Raises:
        ValueError: a null key (the caller partitions null keys itself).
    """
    if keys.null_count:
        raise ValueError("murmur2_partitions needs non-null keys")
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not pa.types.is_binary(keys.type):
        keys = keys.cast(pa.binary())
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    _, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[keys.offset:keys.offset + n + 1].astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, dtype=np.uint8)
    start = offsets[:-1]
    length = offsets[1:] - start
    h = _SEED ^ length.astype(np.uint32)
    blocks = length // 4
    with np.errstate(over="ignore"):
        for j in range(int(blocks.max())):
            idx = np.nonzero(blocks > j)[0]
            p = start[idx] + 4 * j
            k = (data[p].astype(np.uint32) | (data[p + 1].astype(np.uint32) << np.uint32(8))
                 | (data[p + 2].astype(np.uint32) << np.uint32(16)) | (data[p + 3].astype(np.uint32) << np.uint32(24)))
            k = k * _M
            k ^= k >> np.uint32(24)
            k = k * _M
            h[idx] = (h[idx] * _M) ^ k
        rest = length & 3
        tail = start + blocks * 4
        m = rest == 3
        h[m] ^= data[tail[m] + 2].astype(np.uint32) << np.uint32(16)
        m = rest >= 2
        h[m] ^= data[tail[m] + 1].astype(np.uint32) << np.uint32(8)
        m = rest >= 1
        h[m] ^= data[tail[m]].astype(np.uint32)
        h[m] = h[m] * _M
        h ^= h >> np.uint32(13)
        h = h * _M
        h ^= h >> np.uint32(15)
    return ((h & np.uint32(0x7FFFFFFF)) % np.uint32(num_partitions)).astype(np.int32)


class _Topics:
    """Partition counts of the topics a task writes, read once from the catalog (no engine)."""

    def __init__(self, store: ObjectStore):
        self.store = store
        self._counts: dict[str, int] = {}
        self._state = None

    def partitions(self, topic: str) -> int:
        n = self._counts.get(topic)
        if n is not None:
            return n
        from txlake.catalog.catalog import Catalog

        if self._state is None or topic not in self._state.topics:
            self._state = Catalog.open(self.store).state
        t = self._state.topics.get(topic)
        if t is None:
            raise TxlakeWriteError(
                f"Unknown topic {topic!r} in {self.store.url}: the txlake sink does not create topics; create it "
                "first (txlake.AdminClient.create_topics or "
                f"`txlake topics create {topic} --storage {self.store.url}`)")
        n = self._counts[topic] = len(t.partitions)
        return n


def _grouped_by_partition(rb: pa.RecordBatch) -> pa.RecordBatch:
    """The rows of a resolved batch (``STAGED_SCHEMA``) ordered by partition, each partition's
    rows kept in input order (a stable sort). Done here, in the parallel tasks, so that the
    driver's single commit cuts every staged batch into per-partition slices without copying
    a row (``txlake.producer._split_by_partition``)."""
    parts = rb.column(1).to_numpy()
    if len(parts) < 2 or bool((parts[1:] >= parts[:-1]).all()):
        return rb
    return rb.take(pa.array(np.argsort(parts, kind="stable")))


class TaskStager:
    """Stages the rows of one task attempt (see the module docstring).

    Args:
        store: the storage root.
        folder: the write's staging folder (ends with ``/``).
        name: this attempt's name (unique per task attempt); objects are ``<folder><name>-<part>.arrows``.
        columns: the checked columns.
    """

    def __init__(self, store: ObjectStore, folder: str, name: str, columns: WriteColumns):
        self.store = store
        self.folder = folder
        self.name = name
        self.columns = columns
        self.files: list[StagedFile] = []
        self._topics = _Topics(store)
        self._sticky: dict[str, int] = {}
        self._sink: pa.BufferOutputStream | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        # resolved rows not written yet: Spark hands a task 10 000-row batches, and every staged
        # batch costs the commit a produce batch per partition, so they are written in bigger ones
        self._gathered: list[pa.RecordBatch] = []
        self._gathered_rows = self._gathered_bytes = 0
        self._rows = 0
        self._topic_rows: dict[str, int] = {}

    def add(self, rb: pa.RecordBatch) -> None:
        """Resolve and buffer one Arrow batch of the task's input (any columns; the used ones
        are picked by name); starts a new staged object when the current one is full.

        Raises:
            TxlakeWriteError: a null topic, an unknown topic, a partition out of range, a null header key.
        """
        if rb.num_rows == 0:
            return
        staged = self._resolve(rb)
        self._gathered.append(staged)
        self._gathered_rows += staged.num_rows
        self._gathered_bytes += staged.nbytes
        self._rows += staged.num_rows
        if self.columns.topic_option is not None:
            topic = self.columns.topic_option
            self._topic_rows[topic] = self._topic_rows.get(topic, 0) + staged.num_rows
        else:
            counts = pc.value_counts(staged.column(0))
            for item in counts.to_pylist():
                self._topic_rows[item["values"]] = self._topic_rows.get(item["values"], 0) + item["counts"]
        if self._gathered_rows >= STAGE_BATCH_ROWS or self._gathered_bytes >= self.columns.max_file_bytes:
            self._write_gathered()
            if self._sink.tell() >= self.columns.max_file_bytes:
                self._close_part()

    def _write_gathered(self) -> None:
        """Write the gathered rows as one Arrow batch, grouped by partition."""
        if not self._gathered:
            return
        batch = self._gathered[0] if len(self._gathered) == 1 else pa.concat_batches(self._gathered)
        self._gathered, self._gathered_rows, self._gathered_bytes = [], 0, 0
        if self._writer is None:
            self._sink = pa.BufferOutputStream()
            self._writer = pa.ipc.new_stream(self._sink, STAGED_SCHEMA, options=_IPC_OPTIONS)
        self._writer.write_batch(_grouped_by_partition(batch))

    def _resolve(self, rb: pa.RecordBatch) -> pa.RecordBatch:
        cols = self.columns
        n = rb.num_rows
        names = rb.schema.names
        if cols.topic_option is not None:
            topics = pa.array([cols.topic_option] * n, pa.string())
        else:
            topics = rb.column(names.index("topic"))
            if topics.null_count:
                raise TxlakeWriteError("null topic present in the data. Use the topic option for setting a topic.")
            if not pa.types.is_string(topics.type):
                topics = topics.cast(pa.string())
        keys = _binary(rb.column(names.index("key")), "key") if cols.key else pa.nulls(n, pa.binary())
        values = _binary(rb.column(names.index("value")), "value")
        if cols.headers:
            headers = rb.column(names.index("headers"))
            if headers.null_count < n:
                flat = pc.list_flatten(headers)
                if len(flat) and flat.field(0).null_count:
                    raise TxlakeWriteError("a header with a null key: Kafka header keys must be non-null strings")
            headers = headers.cast(HEADER_TYPE)
        else:
            headers = pa.nulls(n, HEADER_TYPE)
        self._check_sizes(keys, values, headers)
        if cols.partition:
            given = rb.column(names.index("partition"))
            parts = given.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32)
        else:
            parts = np.full(n, -1, dtype=np.int32)
        if cols.topic_option is not None:
            groups = [(cols.topic_option, None)]
        else:
            encoded = pc.dictionary_encode(topics)
            idx = encoded.indices.to_numpy(zero_copy_only=False)
            groups = [(t, idx == i) for i, t in enumerate(encoded.dictionary.to_pylist())]
            if len(groups) == 1:
                groups = [(groups[0][0], None)]
        for topic, mask in groups:
            count = self._topics.partitions(topic)
            sel = np.ones(n, dtype=bool) if mask is None else mask
            explicit = sel & (parts >= 0)
            bad = explicit & (parts >= count) | sel & (parts < -1)
            if bad.any():
                p = int(parts[np.argmax(bad)])
                raise TxlakeWriteError(
                    f"partition {p} out of range for topic {topic!r} ({count} partitions: 0..{count - 1})")
            todo = sel & (parts == -1)
            if todo.any():
                parts[todo] = self._default_partitions(keys, todo, topic, count)
        return pa.RecordBatch.from_arrays([topics, pa.array(parts, pa.int32()), keys, values, headers],
                                          schema=STAGED_SCHEMA)

    def _check_sizes(self, keys: pa.Array, values: pa.Array, headers: pa.Array) -> None:
        """Kafka's producer refuses a record above ``message.max.bytes`` (MSG_SIZE_TOO_LARGE): so does the task."""
        limit = self.columns.max_record_bytes
        if values.nbytes + keys.nbytes + headers.nbytes <= limit:
            return                               # no single record can be larger than the whole batch
        size = pc.add(pc.binary_length(keys).fill_null(0), pc.binary_length(values).fill_null(0)).to_numpy(
            zero_copy_only=False).astype(np.int64)
        if headers.null_count < len(headers):
            flat = pc.list_flatten(headers)
            per_header = pc.add(pc.binary_length(flat.field(0)).fill_null(0),
                                pc.binary_length(flat.field(1)).fill_null(0)).to_numpy(zero_copy_only=False)
            rows = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
            np.add.at(size, rows, per_header)
        if (size > limit).any():
            i = int(np.argmax(size > limit))
            raise TxlakeWriteError(
                f"a record of {int(size[i])} bytes (key + value + headers) is larger than message.max.bytes={limit}, "
                "the largest record Kafka's producer sends; raise the option kafka.message.max.bytes (and the "
                "topic's max.message.bytes) or write smaller values")

    def _default_partitions(self, keys: pa.Array, todo: np.ndarray, topic: str, count: int) -> np.ndarray:
        """Kafka's default partitioner for the rows of ``todo``: murmur2 of the key; rows with a
        null key share one partition per Arrow batch (sticky), changing from batch to batch."""
        sub = keys.filter(pa.array(todo))
        sticky = self._sticky.get(topic)
        sticky = random.randrange(count) if sticky is None else (sticky + 1) % count
        self._sticky[topic] = sticky
        out = np.full(len(sub), sticky, dtype=np.int32)
        if sub.null_count < len(sub):
            present = sub.is_valid().to_numpy(zero_copy_only=False)
            out[present] = murmur2_partitions(sub.filter(pa.array(present)), count)
        return out

    def _close_part(self) -> None:
        self._write_gathered()
        if self._writer is None:
            return
        self._writer.close()
        data = self._sink.getvalue().to_pybytes()
        key = f"{self.folder}{self.name}-{len(self.files):05d}{_SUFFIX}"
        self.store.put(key, data, durable=False)  # a staged object lost in a crash only fails its job
        self.files.append(StagedFile(key, self._rows, tuple(sorted(self._topic_rows.items())), len(data)))
        self._writer = self._sink = None
        self._rows = 0
        self._topic_rows = {}

    def finish(self) -> list[StagedFile]:
        """Store the last object; the staged objects of this attempt."""
        self._close_part()
        return list(self.files)

    def discard(self) -> None:
        """Delete what this attempt staged (a failed attempt cleans up after itself; best effort)."""
        self._writer = self._sink = None
        self._gathered, self._gathered_rows, self._gathered_bytes = [], 0, 0
        for f in self.files:
            try:
                self.store.delete(f.key)
            except Exception:  # noqa: BLE001 - the job's commit/abort lists the folder anyway
                pass
        self.files = []


def _task_context() -> tuple[int, int, int, Any]:
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
    except Exception:  # noqa: BLE001 - outside a Spark task
        tc = None
    if tc is None:
        return -1, -1, -1, None
    return tc.partitionId(), tc.attemptNumber(), tc.taskAttemptId(), tc


def stage_task(store: ObjectStore, folder: str, columns: WriteColumns,
               batches: Iterable[pa.RecordBatch], query_id: str | None = None,
               batch_id: int | None = None, name_prefix: str = "") -> StagingMessage:
    """Stage every batch of one task attempt under ``folder``; return its message.

    Objects are named ``<folder><name_prefix><spark partition>-<attempt>-<task attempt id>-<random>-<part>.arrows``;
    outside a Spark task (tests, tools) ``<folder><name_prefix>local-<random>-<part>.arrows``.

    Raises:
        TxlakeWriteError: bad rows (see :meth:`TaskStager.add`); what was staged is deleted first.
    """
    partition_id, attempt, task_attempt_id, _ = _task_context()
    if partition_id >= 0:
        name = f"{name_prefix}{partition_id:05d}-{attempt}-{task_attempt_id}-{uuid.uuid4().hex[:8]}"
    else:
        name = f"{name_prefix}local-{uuid.uuid4().hex}"
    stager = TaskStager(store, folder, name, columns)
    try:
        for rb in batches:
            stager.add(rb)
        files = stager.finish()
    except BaseException:
        stager.discard()
        raise
    return StagingMessage(files, partition_id, attempt, task_attempt_id, query_id, batch_id)


def task_property(name: str) -> str | None:
    """A Spark local property as the running task sees it (None outside a task)."""
    _, _, _, tc = _task_context()
    if tc is None:
        return None
    try:
        return tc.getLocalProperty(name)
    except Exception:  # noqa: BLE001
        return None


def committed_files(messages: Iterable[StagingMessage | None]) -> list[StagedFile]:
    """The staged objects of the messages Spark passes to ``commit()``, in message order
    (one message per Spark partition, from its successful attempt)."""
    out: list[StagedFile] = []
    for m in messages:
        if m is None:
            continue
        if not isinstance(m, StagingMessage):
            raise TypeError(f"unexpected commit message {type(m).__name__} (expected StagingMessage)")
        out.extend(m.files)
    return out


def delete_staged(store: ObjectStore, folder: str, keys: Iterable[str] = (),
                  only: Callable[[str], bool] | None = None) -> int:
    """Delete the staged objects ``keys`` and every other object under ``folder`` (those of
    failed, killed or speculative task attempts); ``only(key)`` limits the listing part.
    Returns how many objects were deleted. Deletion failures are left for a later cleanup
    (logged), never raised: the data they hold is either committed or invisible.
    """
    todo = list(dict.fromkeys(keys))
    try:
        listed = [o.key for o in store.list(folder)]
    except Exception as exc:  # noqa: BLE001
        log.warning("could not list staging folder %s: %s", store.uri(folder.rstrip("/")), exc)
        listed = []
    known = set(todo)
    todo += [k for k in listed if k not in known and (only is None or only(k))]
    return _delete_each(store, todo)


def _delete_each(store: ObjectStore, keys: Iterable[str]) -> int:
    """Delete ``keys``, best effort (a failure is logged, never raised); returns how many went."""
    deleted = 0
    for key in keys:
        try:
            store.delete(key)
            deleted += 1
        except Exception as exc:  # noqa: BLE001
            log.warning("could not delete staged object %s: %s", store.uri(key), exc)
    return deleted


#: staged objects older than this (ms) are leftovers of writes that never finished (a driver
#: that died between its tasks and its commit, a speculative attempt still writing after the
#: commit); every commit sweeps them away
STALE_STAGING_MS = 7 * 24 * 3600 * 1000


def delete_stale_staged(store: ObjectStore, older_than_ms: int = STALE_STAGING_MS) -> int:
    """Delete every staged object (of any write) last modified more than ``older_than_ms`` ago.

    Best effort (never raises); objects whose store reports no modification time are kept.
    A write whose objects are swept before its commit fails that commit (the staged object
    is gone, the transaction is aborted): nothing half-written ever becomes visible.
    """
    import time

    cutoff = int(time.time() * 1000) - older_than_ms
    try:
        stale = [o.key for o in store.list(STAGING_PREFIX) if 0 < o.mtime_ms < cutoff]
    except Exception as exc:  # noqa: BLE001
        log.warning("could not list %s: %s", store.uri(STAGING_PREFIX.rstrip("/")), exc)
        return 0
    deleted = _delete_each(store, stale)
    if deleted:
        log.info("deleted %d stale staged objects under %s", deleted, store.uri(STAGING_PREFIX.rstrip("/")))
    return deleted


def read_staged(store: ObjectStore, files: Iterable[StagedFile], topic: str) -> Iterator[pa.RecordBatch]:
    """The staged records of ``topic`` in ``files``, as Arrow batches (``STAGED_SCHEMA``), in order.

    Raises:
        ObjectNotFoundError: a staged object is gone (e.g. the write was aborted meanwhile).
        CorruptObjectError: a staged object cannot be decoded, or holds another number of
            records of ``topic`` than its task staged (names it; the caller aborts its
            transaction, so nothing of the write becomes visible).
    """
    from txlake.formats.errors import CorruptObjectError

    for f in files:
        topics = dict(f.topics)
        if topics.get(topic, 0) == 0:
            continue
        # one GET of the whole object (at most staging.maxFileBytes): decoding from memory takes
        # the GIL once per batch, where a Python file object would take it for every read
        data = store.get(f.key)
        seen = 0
        try:
            for rb in pa.ipc.open_stream(pa.py_buffer(data)):
                if len(topics) > 1:
                    rb = rb.filter(pc.equal(rb.column(0), topic))
                seen += rb.num_rows
                if rb.num_rows:
                    yield rb
        except pa.ArrowInvalid as exc:
            raise CorruptObjectError(store.uri(f.key), f"is not a readable staged Arrow stream ({exc})") from exc
        if seen != topics[topic]:
            raise CorruptObjectError(store.uri(f.key), f"holds {seen} staged records of {topic!r}, its task staged "
                                                       f"{topics[topic]}")
