"""The Spark source, batch: ``spark.read.format("txlake")`` reads exactly the committed records.

Spark runs the source's planning and its tasks in Python worker processes, not in this
test process; ``memory://`` roots live in one process only, so these tests use the
``file`` and ``s3`` backends. The engine of this process keeps the writer lease while
Spark reads -- reading needs no lease. One SparkSession serves the whole test process
(tests/spark_support.py); data is small so each query takes about a second.
"""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.datasource import EqualTo, In

from spark_support import backend, close_engines, file_storage, source_options, spark  # noqa: F401
from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from txlake.catalog.catalog import Catalog
from txlake.engine import registry
from txlake.engine.broker import Broker, BrokerConfig, ProduceBatch
from txlake.formats.records import PAYLOAD_SCHEMA
from txlake.spark_connector.batch_read import (OffsetRange, TxlakeBatchReader, kafka_struct, split_ranges)
from txlake.spark_connector.options import OptionError, parse_read_options, parse_storage_options
from txlake.spark_connector.source import TxlakeDataSource

pytestmark = pytest.mark.usefixtures("close_engines")  # no writer lease left behind

T0 = 1_700_000_000_000  # ms
TXN_CONF = {"transaction.state.log.num.partitions": 3, "storage.flush.linger.ms": 1}


def load(target, session=None, schema=None, **options):
    reader = (session or spark()).read.format("txlake")
    if schema is not None:
        reader = reader.schema(schema)
    for k, v in source_options(target, **options).items():
        reader = reader.option(k, v)
    return reader.load()


def create(target, **topics: int) -> None:
    with AdminClient({**target.conf(), **TXN_CONF}) as admin:
        for f in admin.create_topics([NewTopic(name, n) for name, n in topics.items()]).values():
            f.result()


def rows(df, headers: bool = False) -> list[tuple]:
    """``(topic, partition, offset, key, value[, headers])`` of a DataFrame (or of collected rows), sorted."""
    cols = ["topic", "partition", "offset", "key", "value"] + (["headers"] if headers else [])
    out = []
    for r in (df if isinstance(df, list) else df.select(*cols).collect()):
        t = (r.topic, r.partition, r.offset, r.key and bytes(r.key), r.value and bytes(r.value))
        if headers:
            t += (None if r.headers is None else [(h.key, bytes(h.value)) for h in r.headers],)
        out.append(t)
    return sorted(out)


def consumer_rows(target, topic: str, partitions: int, isolation: str = "read_committed") -> list[tuple]:
    """What a txlake Consumer with ``isolation`` reads from every partition of ``topic``."""
    c = Consumer({**target.conf(), "isolation.level": isolation, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    while msgs := c.consume(500, 0.5):
        for m in msgs:
            if m.error() is None:
                hdrs = m.headers()
                out.append((m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                            None if not hdrs else [(k, v) for k, v in hdrs]))
    c.close()
    return sorted(out)


def direct(target, filters=(), **options) -> list[tuple]:
    """``(topic, partition, offset)`` read by the batch reader in this process, as Spark drives it
    (pushFilters, partitions, read) -- for option semantics that need no Spark round trip."""
    reader = TxlakeBatchReader(source_options(target, **options))
    assert reader.pushFilters(list(filters)) == []
    return sorted((b["topic"], b["partition"], b["offset"]) for part in reader.partitions()
                  for batch in reader.read(part) for b in batch.to_pylist())


def lease(target):
    state = Catalog.open(target.object_store()).state
    return (state.lease.owner, state.lease.epoch, state.lease.released) if state.lease else None


# ---------------------------------------------------------------- committed reads
def test_committed_read_equals_the_consumer(storage):
    """Open, committed and aborted transactions of three producers and plain records,
    interleaved on three partitions: Spark returns exactly what a read_committed Consumer
    returns (each partition up to its LSO, no aborted records, no markers), with the
    Kafka source's columns; read_uncommitted equals the read_uncommitted Consumer."""
    create(storage, orders=3)
    conf = {**storage.conf(), **TXN_CONF}
    # tc's transaction stays open through every read: a timeout far above the test's length (on a
    # loaded machine the default 60 s could pass, the coordinator would abort it, and the LSO move)
    ta, tb, tc = (Producer({**conf, "transactional.id": i, "transaction.timeout.ms": 900_000}) for i in ("ta", "tb", "tc"))
    plain = Producer(conf)
    for p in (ta, tb, tc):
        p.init_transactions(30)

    def put(producer, partition, value, headers=None):
        producer.produce("orders", value=value, key=b"k-" + value.encode(), partition=partition,
                         timestamp=T0 + len(value), headers=headers)

    ta.begin_transaction(); put(ta, 0, "a0", [("h", b"1")]); put(ta, 1, "a1"); ta.flush(30)
    put(plain, 0, "x0"); put(plain, 2, "x1", [("h", b"2"), ("g", b"")]); plain.flush(30)
    tb.begin_transaction(); put(tb, 0, "b0"); put(tb, 2, "b1"); tb.flush(30)
    ta.commit_transaction(30)                       # COMMIT: orders-0 @3, orders-1 @1
    tb.abort_transaction(30)                        # ABORT: orders-0 @4, orders-2 @2
    tc.begin_transaction(); put(tc, 1, "c0"); tc.flush(30)      # orders-1 @2, left open
    put(plain, 1, "x2"); put(plain, 2, "x3"); plain.flush(30)     # orders-1 @3 (above the LSO), orders-2 @3
    ta.begin_transaction(); put(ta, 2, "a2"); put(ta, 1, "a3"); ta.flush(30)
    ta.commit_transaction(30)                       # orders-2 @4 + COMMIT @5, orders-1 @4 + COMMIT @5

    def kv(*items):
        return [("orders", p, o, b"k-" + v.encode(), v.encode()) for p, o, v in items]

    committed = kv((0, 0, "a0"), (0, 1, "x0"), (1, 0, "a1"), (2, 0, "x1"), (2, 3, "x3"), (2, 4, "a2"))
    uncommitted = kv((0, 0, "a0"), (0, 1, "x0"), (0, 2, "b0"), (1, 0, "a1"), (1, 2, "c0"), (1, 3, "x2"),
                     (1, 4, "a3"), (2, 0, "x1"), (2, 1, "b1"), (2, 3, "x3"), (2, 4, "a2"))
    holder = lease(storage)
    assert holder is not None and not holder[2]

    df = load(storage, subscribe="orders", includeHeaders="true")
    assert df.schema == kafka_struct(True)
    collected = df.collect()
    got = rows(collected, headers=True)
    assert [r[:5] for r in got] == committed
    assert got == consumer_rows(storage, "orders", 3)
    assert {r[2]: r[5] for r in got if r[1] == 0} == {0: [("h", b"1")], 1: None}
    assert [r[5] for r in got if r[1] == 2][0] == [("h", b"2"), ("g", b"")]
    first = next(r for r in collected if r.value == b"a0")
    assert (first.timestamp, first.timestampType) == (dt.datetime(2023, 11, 14, 22, 13, 20, 2000), 0)

    dirty = load(storage, subscribe="orders", **{"isolation.level": "read_uncommitted"})
    assert "headers" not in dirty.columns
    dirty_rows = rows(dirty)
    assert dirty_rows == uncommitted
    assert dirty_rows == [r[:5] for r in consumer_rows(storage, "orders", 3, "read_uncommitted")]
    assert lease(storage) == holder               # Spark read without touching the writer lease

    # a declared schema, a subset of the columns in its own order: the same committed records
    declared = load(storage, schema="value binary, partition int, offset long", subscribe="orders")
    assert declared.columns == ["value", "partition", "offset"]
    assert sorted((r.partition, r.offset, bytes(r.value)) for r in declared.collect()) == \
        [(p, o, v) for _, p, o, _, v in committed]
    with pytest.raises(Exception, match="the declared schema gives column 'offset' type int; the txlake source "
                                        "has it as bigint"):
        load(storage, schema="value binary, offset int", subscribe="orders").collect()

    # one snapshot at planning: what commits after partitions() is not read by those partitions
    reader = TxlakeBatchReader(source_options(storage, subscribe="orders"))
    planned = reader.partitions()
    tc.commit_transaction(30)                     # orders-1: c0 @2, x2 @3, a3 @4 become committed
    snap = sorted((b["partition"], b["offset"]) for part in planned for batch in reader.read(part)
                  for b in batch.to_pylist())
    assert snap == [r[1:3] for r in committed]
    assert (1, 2) in [r[1:3] for r in rows(load(storage, subscribe="orders"))]
    for p in (ta, tb, tc, plain):
        p.close()


def test_offsets_timestamps_patterns_and_assign(file_storage):
    """startingOffsets/endingOffsets JSON (-2/-1 and explicit), startingTimestamp and
    endingTimestamp (first offset with timestamp >= it), subscribePattern (found anywhere
    in the name, as the Kafka source's ``findFirstIn``; internal topics excluded) and
    assign, as Spark's Kafka source."""
    create(file_storage, orders=2, **{"orders-eu": 1, "xorders": 1})
    p = Producer(file_storage.conf())
    for topic, parts in (("orders", 2), ("orders-eu", 1), ("xorders", 1)):
        for i in range(6):
            p.produce(topic, value=f"{topic}-{i}", partition=i % parts, timestamp=T0 + 1000 * i)
    p.flush(30)
    # orders-0: offsets 0,1,2 at T0, +2 s, +4 s; orders-1: 0,1,2 at +1 s, +3 s, +5 s
    t = Producer({**file_storage.conf(), **TXN_CONF, "transactional.id": "t"})
    t.init_transactions(30)                                          # creates __transaction_state
    c = Consumer({**file_storage.conf(), "group.id": "g", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("orders", 0, 1)], asynchronous=False)   # creates __consumer_offsets
    c.close()
    assert {"__transaction_state", "__consumer_offsets"} <= set(Catalog.open(file_storage.object_store()).state.topics)
    orders = [("orders", p_, o) for p_ in (0, 1) for o in range(3)]
    orders_eu = [("orders-eu", 0, o) for o in range(6)]
    xorders = [("xorders", 0, o) for o in range(6)]

    through_spark = [(r.topic, r.partition, r.offset)
                     for r in load(file_storage, subscribePattern="rders-").select("topic", "partition", "offset")
                     .collect()]
    assert sorted(through_spark) == orders_eu            # found anywhere in the name, not matched whole
    with pytest.raises(Exception, match="starting offset can't be latest for batch queries"):
        load(file_storage, subscribe="orders", startingOffsets="latest").collect()

    assert direct(file_storage, subscribePattern="orders") == orders + orders_eu + xorders
    assert direct(file_storage, subscribePattern="orders.*") == orders + orders_eu + xorders
    assert direct(file_storage, subscribePattern="^orders") == orders + orders_eu
    assert direct(file_storage, subscribePattern="^orders$") == orders
    assert direct(file_storage, subscribePattern="_|offsets|transaction") == []   # never an internal topic
    assert direct(file_storage, assign='{"orders": [1]}') == [("orders", 1, o) for o in range(3)]
    assert direct(file_storage, subscribe="orders", startingOffsets='{"orders": {"0": 2, "1": -2}}',
                  endingOffsets='{"orders": {"0": -1, "1": 1}}') == [("orders", 0, 2), ("orders", 1, 0)]
    assert direct(file_storage, subscribe="orders", endingOffsets='{"orders": {"0": 99, "1": 1}}') == \
        [("orders", 0, 0), ("orders", 0, 1), ("orders", 0, 2), ("orders", 1, 0)]   # past the end: up to the end
    assert direct(file_storage, subscribe="orders,xorders", startingTimestamp=T0 + 2500,
                  endingTimestamp=T0 + 4000) == [("orders", 1, 1), ("xorders", 0, 3)]
    assert direct(file_storage, assign='{"orders": [0]}', startingOffsetsByTimestamp=json.dumps(
        {"orders": {"0": T0 + 1}})) == [("orders", 0, 1), ("orders", 0, 2)]
    with pytest.raises(OptionError, match="no offset of orders-0 has a timestamp >= "):
        direct(file_storage, subscribe="orders", startingTimestamp=T0 + 10_000)
    assert direct(file_storage, subscribe="orders", startingTimestamp=T0 + 10_000,
                  startingOffsetsByTimestampStrategy="latest") == []
    with pytest.raises(OptionError, match="unknown topic 'nope'"):
        direct(file_storage, subscribe="nope")
    with pytest.raises(OptionError, match="topic 'orders' has no partition 2"):
        direct(file_storage, assign='{"orders": [2]}')
    with pytest.raises(OptionError, match="must name all partitions of the subscription"):
        direct(file_storage, subscribe="orders", startingOffsets='{"orders": {"0": 1}}')
    with pytest.raises(OptionError, match="ending offset 3 of orders-0 is before its starting offset 5"):
        direct(file_storage, subscribe="orders", startingOffsets='{"orders": {"0": 5, "1": 0}}')
    p.close()
    t.close()


def test_option_errors_name_the_option():
    base = {"storage.url": "file:///tmp/x"}
    cases = [
        ({}, "one of the options subscribe, subscribePattern, assign must be specified"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "only one of the options"),
        ({"subscribe": " , "}, "option 'subscribe': no topics"),
        ({"assign": "a"}, "option 'assign': expected JSON"),
        ({"subscribePattern": "("}, "option 'subscribePattern': invalid regular expression"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'}, "option 'startingOffsets': starting offset for a-0"),
        ({"subscribe": "a", "endingOffsets": "earliest"}, "option 'endingOffsets': ending offset can't be earliest"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"0": 1}}', "endingOffsets": '{"b": {"0": 1}}'},
         "option 'endingOffsets': names partitions"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"x": 1}}'}, "option 'startingOffsets': partition 'x'"),
        ({"subscribe": "a", "isolation.level": "snapshot"}, "option 'isolation.level': expected read_committed"),
        ({"subscribe": "a", "includeHeaders": "yes"}, "option 'includeHeaders': expected true or false"),
        ({"subscribe": "a", "minPartitions": "0"}, "option 'minPartitions': must be positive"),
        ({"subscribe": "a", "startingTimestamp": "soon"}, "option 'startingTimestamp': expected a single long"),
        ({"subscribe": "a", "kafka.bootstrap.servers": "h:9092"}, "option 'kafka.bootstrap.servers': txlake reads"),
        ({"subscribe": "a", "startingOfsets": "earliest"}, "did you mean 'startingOffsets'"),
        ({"topic": "a"}, "'topic' names the topic a write goes to"),
        ({"subscribe": "a", "minOffsetsPerTrigger": "5"}, "option 'minOffsetsPerTrigger': "),
    ]
    for extra, message in cases:
        with pytest.raises(OptionError, match=message.replace("(", r"\(")):
            parse_read_options({**base, **extra}, streaming=False)
    with pytest.raises(OptionError, match="option 'endingOffsets': ending offsets are not valid in streaming"):
        parse_read_options({**base, "subscribe": "a", "endingOffsets": "latest"}, streaming=True)
    opts = parse_read_options({**base, "SUBSCRIBE": "a, b,a", "kafka.isolation.level": "read_uncommitted"}, False)
    assert (opts.subscription.topics, opts.isolation_level, opts.starting.kind, opts.ending.kind) == \
        (("a", "b"), "read_uncommitted", "earliest", "latest")
    assert parse_read_options({**base, "subscribe": "a"}, streaming=True).starting.kind == "latest"
    assert parse_storage_options({
        "storage.options": '{"key": "K", "client_kwargs": {"region_name": "r0"}}',
        "storage.options.client_kwargs.verify": "false", "storage.options.secret": "S",
        "storage.options.config_kwargs": '{"retries": {"max_attempts": 2}}'}) == {
        "key": "K", "secret": "S", "client_kwargs": {"region_name": "r0", "verify": False},
        "config_kwargs": {"retries": {"max_attempts": 2}}}


def _struct(*fields):
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(name, t) for name, t in fields])


def test_a_declared_schema_reads_only_its_columns(file_storage, monkeypatch):
    """``.schema("value binary, offset long")``: batches of those columns in that order, and
    the tasks decode only the segment columns they need (value, offset, is_control: no key,
    timestamps or headers) -- the one saving a Python source can make (issue 19)."""
    from pyspark.sql.types import BinaryType, LongType

    from txlake.formats import versioning

    create(file_storage, t=2)
    p = Producer(file_storage.conf())
    for i in range(4):
        p.produce("t", value=b"v%d" % i, key=b"k%d" % i, partition=i % 2, headers=[("h", b"x")], timestamp=T0 + i)
    p.flush(30)
    p.close()
    decoded = []
    real = versioning.read_all
    monkeypatch.setattr(versioning, "read_all",
                        lambda pf, location, rgs=None, columns=None: decoded.append(list(columns)) or
                        real(pf, location, rgs, columns))
    reader = TxlakeBatchReader(source_options(file_storage, subscribe="t", includeHeaders="true"),
                               _struct(("value", BinaryType()), ("offset", LongType())))
    batches = [b for part in reader.partitions() for b in reader.read(part)]
    assert {tuple(b.schema.names) for b in batches} == {("value", "offset")}
    assert sorted((r["offset"], r["value"]) for b in batches for r in b.to_pylist()) == \
        [(0, b"v0"), (0, b"v1"), (1, b"v2"), (1, b"v3")]
    assert decoded and all(c == ["offset", "value", "is_control"] for c in decoded)


def test_a_declared_schema_with_an_unknown_column_or_a_wrong_type_is_refused_naming_it():
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType

    opts = {"storage.url": "file:///tmp/x", "subscribe": "a"}
    columns = ("key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
               "timestampType int")
    cases = [
        (_struct(("value", BinaryType()), ("payload", BinaryType())),
         f"the declared schema has column 'payload', which the txlake source does not have; a declared schema is a "
         f"subset of these columns; the source's columns are those of Spark's Kafka source: {columns}"),
        (_struct(("offset", IntegerType())), "the declared schema gives column 'offset' type int; the txlake source "
                                              "has it as bigint"),
        (_struct(("key", StringType())), "the declared schema gives column 'key' type string; the txlake source has "
                                          "it as binary"),
        (_struct(("headers", BinaryType())), "the declared schema has column 'headers', which the txlake source does "
                                              "not have (it needs option includeHeaders=true)"),
        (_struct(("offset", LongType()), ("offset", LongType())), "the declared schema names column 'offset' twice"),
        (_struct(), "the declared schema has no column"),
    ]
    for schema, message in cases:
        with pytest.raises(OptionError) as e:
            TxlakeBatchReader(opts, schema)
        assert str(e.value).startswith(message), str(e.value)
    with pytest.raises(OptionError, match="gives column 'headers' type binary; the txlake source has it as "
                                          "array<struct<key:string,value:binary>>"):
        TxlakeBatchReader({**opts, "includeHeaders": "true"}, _struct(("headers", BinaryType())))


def test_min_partitions_split_like_spark(file_storage):
    """Spark's KafkaOffsetRangeCalculator cases, and minPartitions through Spark."""
    r = OffsetRange
    assert split_ranges([r("t", 0, 1, 2), r("t", 1, 1, 2), r("t", 2, 1, 2)], 3, None) == \
        [r("t", 0, 1, 2), r("t", 1, 1, 2), r("t", 2, 1, 2)]
    assert split_ranges([r("t", 0, 1, 5)], 4, None) == [r("t", 0, 1, 2), r("t", 0, 2, 3), r("t", 0, 3, 4),
                                                        r("t", 0, 4, 5)]
    assert split_ranges([r("t", 0, 1, 5), r("t", 1, 1, 21)], 3, None) == \
        [r("t", 0, 1, 5), r("t", 1, 1, 11), r("t", 1, 11, 21)]
    assert split_ranges([r("t", 0, 1, 2), r("t", 1, 1, 1001)], 3, None) == \
        [r("t", 0, 1, 2), r("t", 1, 1, 501), r("t", 1, 501, 1001)]
    assert split_ranges([r("t", 0, 0, 10), r("t", 1, 5, 5)], None, 4) == \
        [r("t", 0, 0, 3), r("t", 0, 3, 6), r("t", 0, 6, 10)]

    create(file_storage, big=2)
    p = Producer(file_storage.conf())
    for i in range(40):
        p.produce("big", value=f"v{i}", partition=0 if i < 30 else 1)
    p.flush(30)
    assert load(file_storage, subscribe="big", minPartitions=5).rdd.getNumPartitions() == 5   # 30 -> 4, 10 -> 1
    reader = TxlakeBatchReader(source_options(file_storage, subscribe="big", minPartitions=5))
    parts = reader.partitions()
    assert [(x.partition, x.start, x.end) for x in parts] == [(0, 0, 7), (0, 7, 14), (0, 14, 22), (0, 22, 30),
                                                              (1, 0, 10)]
    assert sorted(b["offset"] for x in parts[:4] for batch in reader.read(x) for b in batch.to_pylist()) == \
        list(range(30))
    assert len(TxlakeBatchReader(source_options(file_storage, subscribe="big")).partitions()) == 2
    p.close()


def test_small_segments_are_joined_into_batches_of_batch_rows(file_storage, monkeypatch):
    """A task joins small row groups (one per flush) into RecordBatches of BATCH_ROWS records
    (the last one shorter), in offset order, without an aborted transaction's records."""
    from txlake.spark_connector import batch_read

    monkeypatch.setattr(batch_read, "BATCH_ROWS", 25)
    create(file_storage, small=1)
    p = Producer({**file_storage.conf(), **TXN_CONF})
    for flush in range(12):  # 12 flushes of 7 records: 12 segments of one row group each
        for i in range(7):
            p.produce("small", value=f"{flush * 7 + i}", partition=0)
        p.flush(30)
    t = Producer({**file_storage.conf(), **TXN_CONF, "transactional.id": "joined"})
    t.init_transactions(30)
    t.begin_transaction()
    for i in range(5):
        t.produce("small", value="aborted", partition=0)
    t.flush(30)
    t.abort_transaction(30)
    p.produce("small", value="84", partition=0)
    p.flush(30)
    reader = TxlakeBatchReader(source_options(file_storage, subscribe="small"))
    (part,) = reader.partitions()
    assert len(part.segments) >= 13
    batches = list(reader.read(part))
    assert [b.num_rows for b in batches] == [25, 25, 25, 10]
    got = [(r["offset"], r["value"]) for b in batches for r in b.to_pylist()]
    # offsets 84..88 are the aborted records, 89 the ABORT marker
    assert got == [(o, f"{o}".encode()) for o in range(84)] + [(90, b"84")]
    t.close()
    p.close()


# ---------------------------------------------------------------- pushdown
def test_filter_pushdown_skips_segments_and_row_groups(file_storage, tmp_path):
    """Filters on partition, offset and timestamp are pushed (the session enables
    spark.sql.python.filterPushdown.enabled): only the objects and row groups that can hold
    matching records are opened -- asserted on the reader's log of opened objects -- and
    results equal an unfiltered read filtered afterwards. Without pushdown the same
    query works and opens every segment."""
    broker = Broker(file_storage.object_store(), BrokerConfig(flush_linger_ms=1, row_group_rows=4))
    broker.create_topics([("ev", 2, {})])
    for j in range(3):      # 3 objects; each holds 10 records of both partitions, 3 row groups (4, 4, 2) each
        batches = []
        for part in (0, 1):
            ts = [T0 + 100_000 * j + 1000 * i for i in range(10)]
            payload = pa.Table.from_pydict({"timestamp": ts, "key": [None] * 10,
                                            "value": [f"{part}-{j}-{i}".encode() for i in range(10)],
                                            "headers": [None] * 10}, schema=PAYLOAD_SCHEMA)
            batches.append(ProduceBatch("ev", part, payload, -1, -1, -1))
        assert all(r.error == 0 for r in broker.produce(batches))
    segments = {(s.partition, s.base_offset): s for p in broker.catalog.state.topics["ev"].partitions
                for s in p.segments}
    assert len(segments) == 6 and all(s.row_group_count == 3 for s in segments.values())
    log_path = tmp_path / "opened.jsonl"

    def opened():
        out = sorted((e["object"], tuple(e["row_groups"])) for e in map(json.loads, log_path.read_text().splitlines()))
        log_path.unlink()
        return out

    df = load(file_storage, subscribe="ev", _openLog=str(log_path))
    everything = rows(df)
    assert len(everything) == 60 and len(opened()) == 6

    by_offset = rows(df.filter((F.col("partition") == 1) & (F.col("offset") >= 14) & (F.col("offset") < 18)))
    assert by_offset == [r for r in everything if r[1] == 1 and 14 <= r[2] < 18]
    seg = segments[(1, 10)]
    assert opened() == [(seg.path, (seg.row_group_start + 1,))]     # offsets 14..17: one row group of one object

    since = dt.datetime(2023, 11, 14, 22, 16, 45)                 # T0 + 205 s: the third object, records 5..9
    by_time = df.filter(F.col("timestamp") >= F.lit(since))
    assert rows(by_time) == [r for r in everything if r[2] >= 25]
    assert opened() == sorted((s.path, (s.row_group_start + 1, s.row_group_start + 2))
                              for s in (segments[(0, 20)], segments[(1, 20)]))
    # IN on offsets, driven in this process: the segment 10..19 holds neither offset and is not opened
    assert direct(file_storage, [In(("offset",), (3, 27)), EqualTo(("partition",), 0)], subscribe="ev",
                  _openLog=str(log_path)) == [("ev", 0, 3), ("ev", 0, 27)]
    assert opened() == sorted([(segments[(0, 0)].path, (segments[(0, 0)].row_group_start,)),
                               (segments[(0, 20)].path, (segments[(0, 20)].row_group_start + 1,))])

    plain = spark().newSession()
    plain.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    unpushed = load(file_storage, session=plain, subscribe="ev", _openLog=str(log_path))
    assert rows(unpushed.filter((F.col("partition") == 1) & (F.col("offset") >= 14) & (F.col("offset") < 18))) == \
        by_offset
    assert len(opened()) == 6
    broker.close()


# ---------------------------------------------------------------- registration
def test_found_without_registration_and_registered_explicitly(file_storage):
    """``format("txlake")`` works in a session where nothing was registered (PySpark finds
    ``pyspark_txlake.DefaultSource``), and after ``spark.dataSource.register``."""
    import pyspark_txlake

    assert pyspark_txlake.DefaultSource is TxlakeDataSource and TxlakeDataSource.name() == "txlake"
    create(file_storage, t=1)
    p = Producer(file_storage.conf())
    p.produce("t", value="v", partition=0)
    p.flush(30)
    fresh = spark().newSession()                  # a new session has no user-registered data sources
    assert rows(load(file_storage, session=fresh, subscribe="t")) == [("t", 0, 0, None, b"v")]
    registered = spark().newSession()
    registered.dataSource.register(TxlakeDataSource)
    assert rows(load(file_storage, session=registered, subscribe="t")) == [("t", 0, 0, None, b"v")]
    p.close()
