"""The embedded Producer and Consumer behave as confluent-kafka's (issue 17: a drop-in).

Where confluent-kafka can run without a broker (``confluent_kafka.Producer({})``: purge,
close, bool, len, a raising delivery callback) the same scenario runs on both clients and
the outcomes are compared; the rest asserts librdkafka's documented behaviour exactly.
"""

from __future__ import annotations

import time

import pytest

from txlake import (OFFSET_INVALID, AdminClient, Consumer, KafkaError, KafkaException, NewTopic, Producer,
                    TopicPartition)
from txlake.engine import registry

confluent_kafka = pytest.importorskip("confluent_kafka")


@pytest.fixture
def conf(tmp_path):
    yield {"storage.url": f"file://{tmp_path}/root", "storage.flush.linger.ms": 1}
    registry.close_all()


def create(conf, name, partitions=1):
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic(name, partitions)])[name].result()


def _boom(err, msg):
    raise ValueError(f"callback failed for {msg.value()!r}")


# ---------------------------------------------------------------- 1a: a raising delivery callback
def _raising_callback_outcome(producer, topic, flush_timeout):
    """Two records, the first's callback raises: what flush() raises, whether the second's
    report is still served by the next poll, and len() then (librdkafka's len() in between
    counts its queue's events, not records: not compared)."""
    seen = []
    producer.produce(topic, b"first", on_delivery=_boom)
    producer.produce(topic, b"second", on_delivery=lambda err, msg: seen.append(msg.value()))
    if isinstance(producer, confluent_kafka.Producer):
        producer.purge()  # no broker: purging makes the reports ready
    with pytest.raises(ValueError) as info:
        producer.flush(flush_timeout)
    producer.poll(0)
    return str(info.value), seen, len(producer)


def test_a_raising_delivery_callback_propagates_from_flush_and_keeps_len_right(conf):
    create(conf, "t")
    with Producer(conf) as p:
        ours = _raising_callback_outcome(p, "t", 10)
        assert len(p) == 0
    theirs = _raising_callback_outcome(confluent_kafka.Producer({}), "t", 10)
    assert ours == ("callback failed for b'first'", [b"second"], 0)
    assert theirs == ours


def test_close_without_timeout_returns_after_a_raising_callback(conf):
    create(conf, "t")
    p = Producer(conf)
    p.produce("t", b"first", on_delivery=_boom)
    with pytest.raises(ValueError, match="callback failed for b'first'"):
        p.flush()
    assert len(p) == 0
    assert p.close() is True  # before the fix len() stayed 1 and this flush() waited forever


# ---------------------------------------------------------------- 1b: send_offsets_to_transaction
def test_send_offsets_to_transaction_drops_partitions_without_a_valid_offset(conf):
    create(conf, "in", 2)
    create(conf, "out")
    with Producer({**conf, "transactional.id": "tx1"}) as p, Consumer({**conf, "group.id": "g"}) as c:
        p.init_transactions(10)
        p.begin_transaction()
        p.produce("out", b"v")
        # OFFSET_INVALID (e.g. position() of a partition that consumed nothing) is left out
        p.send_offsets_to_transaction([TopicPartition("in", 0, OFFSET_INVALID), TopicPartition("in", 1, 5)], "g", 10)
        p.commit_transaction(10)
        assert [(tp.partition, tp.offset) for tp in c.committed([TopicPartition("in", 0), TopicPartition("in", 1)], 10)] \
            == [(0, OFFSET_INVALID), (1, 5)]
        # nothing valid: nothing is sent, no error (librdkafka: "this is not an error, do nothing")
        p.begin_transaction()
        p.send_offsets_to_transaction([TopicPartition("in", 0, OFFSET_INVALID)], "g", 10)
        p.commit_transaction(10)
        assert [tp.offset for tp in c.committed([TopicPartition("in", 0), TopicPartition("in", 1)], 10)] \
            == [OFFSET_INVALID, 5]


# ---------------------------------------------------------------- 1c: Consumer.commit parity
def test_commit_of_a_message_and_of_offsets(conf):
    create(conf, "t", 2)
    with Producer(conf) as p:
        for i in range(3):
            p.produce("t", f"v{i}".encode(), partition=0)
    with Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": False}) as c:
        c.assign([TopicPartition("t", 0)])
        msgs = c.consume(3, 10)
        assert [m.offset() for m in msgs] == [0, 1, 2]
        done = c.commit(message=msgs[1], asynchronous=False)
        assert [(tp.topic, tp.partition, tp.offset) for tp in done] == [("t", 0, 2)]
        assert c.commit(msgs[2]) is None  # asynchronous by default, positional message as confluent-kafka's
        done = c.commit(offsets=[TopicPartition("t", 1, 7, "m")], asynchronous=False)
        assert [(tp.partition, tp.offset, tp.metadata) for tp in done] == [(1, 7, "m")]
        got = c.committed([TopicPartition("t", 0), TopicPartition("t", 1)], 10)
        assert [(tp.partition, tp.offset) for tp in got] == [(0, 3), (1, 7)]


# ---------------------------------------------------------------- 2: close, bool, purge, produce_batch
def _closed_outcome(producer):
    """What close() returns (twice), bool() and len() after it, and what each call raises then."""
    out = {"close": producer.close(), "again": producer.close(), "bool": bool(producer), "len": len(producer)}
    for name, call in (("produce", lambda: producer.produce("t", b"v")), ("poll", lambda: producer.poll(0)),
                       ("flush", lambda: producer.flush(0)), ("purge", lambda: producer.purge()),
                       ("produce_batch", lambda: producer.produce_batch("t", [{"value": b"v"}]))):
        with pytest.raises(Exception) as info:
            call()
        out[name] = repr(info.value)
    return out


def test_close_returns_true_and_every_later_call_raises_runtime_error(conf):
    create(conf, "t")
    p = Producer(conf)
    assert bool(p) is True and len(p) == 0  # __len__ exists, yet an idle producer is not falsy
    p.produce("t", b"v")
    ours = _closed_outcome(p)
    theirs = _closed_outcome(confluent_kafka.Producer({}))
    closed = "RuntimeError('Producer has been closed')"
    assert ours == {"close": True, "again": True, "bool": True, "len": 0, "produce": closed, "poll": closed,
                    "flush": closed, "purge": closed, "produce_batch": closed}
    assert theirs == ours


def _purge_outcome(producer, topic):
    reports = []
    producer.produce(topic, b"a", key=b"k", on_delivery=lambda err, msg: reports.append((err.code(), err.str(), msg.value())))
    producer.produce(topic, b"b", on_delivery=lambda err, msg: reports.append((err.code(), err.str(), msg.value())))
    producer.purge()
    served = producer.poll(0)
    return served, sorted(reports), len(producer)


def test_purge_reports_purge_queue_for_records_not_sent(conf):
    create(conf, "t")
    with Producer({**conf, "linger.ms": 60_000}) as p:  # the records stay in the producer's queue
        ours = _purge_outcome(p, "t")
        assert ours == (2, [(KafkaError._PURGE_QUEUE, "Local: Purged in queue", b"a"),
                            (KafkaError._PURGE_QUEUE, "Local: Purged in queue", b"b")], 0)
        assert p.flush(10) == 0
        # the producer goes on: nothing purged was written, the next record is offset 0
        offsets = []
        p.produce("t", b"c", on_delivery=lambda err, msg: offsets.append((err, msg.offset())))
        assert p.flush(10) == 0 and offsets == [(None, 0)]
    theirs = _purge_outcome(confluent_kafka.Producer({}), "t")
    assert theirs[1] == ours[1]


def test_purge_in_flight_only_leaves_the_queue(conf):
    create(conf, "t")
    with Producer({**conf, "linger.ms": 60_000}) as p:
        reports = []
        p.produce("t", b"a", on_delivery=lambda err, msg: reports.append(err))
        p.purge(in_queue=False)
        assert p.poll(0) == 0 and len(p) == 1
        assert p.flush(10) == 0 and reports == [None]


def test_produce_batch_returns_the_records_queued_and_marks_the_refused(conf):
    create(conf, "t", 2)
    with Producer({**conf, "message.max.bytes": 1000}) as p:
        got = []
        messages = [{"value": b"a", "partition": 1}, {"value": "b", "key": "k", "partition": 7},
                    {"value": b"x" * 2000}, {"value": b"c", "callback": lambda err, msg: got.append(("own", msg.value()))}]
        assert p.produce_batch("t", messages, partition=0,
                               on_delivery=lambda err, msg: got.append((msg.partition(), msg.offset(), msg.value()))) == 2
        assert "_error" not in messages[0] and "_error" not in messages[3]
        assert messages[1]["_error"].code() == KafkaError._UNKNOWN_PARTITION
        assert messages[2]["_error"].code() == KafkaError.MSG_SIZE_TOO_LARGE
        assert p.flush(10) == 0
        assert sorted(got, key=str) == [("own", b"c"), (1, 0, b"a")]
        assert p.produce_batch("t", []) == 0
        for bad, text in (("x", "messages must be a list"), ([1], "Message at index 0 must be a dict"),
                          ([{"value": 1}], "Message value at index 0 must be bytes or str"),
                          ([{"key": 1}], "Message key at index 0 must be bytes or str"),
                          ([{"partition": "x"}], "Message partition at index 0 must be int")):
            with pytest.raises(TypeError) as info:
                p.produce_batch("t", bad)
            assert str(info.value) == text
            with pytest.raises(TypeError) as theirs:
                confluent_kafka.Producer({}).produce_batch("t", bad)
            assert str(theirs.value) == text
        with pytest.raises(NotImplementedError, match="^Message timestamps are not currently supported in batch mode$"):
            p.produce_batch("t", [{"value": b"v", "timestamp": 5}])
        assert len(p) == 0


def test_produce_batch_queue_full_is_a_per_message_error(conf):
    create(conf, "t")
    with Producer({**conf, "queue.buffering.max.messages": 1, "linger.ms": 60_000}) as p:
        messages = [{"value": b"1"}, {"value": b"2"}]
        assert p.produce_batch("t", messages) == 1
        assert "_error" not in messages[0]
        assert (messages[1]["_error"].code(), messages[1]["_error"].str()) == (KafkaError._QUEUE_FULL,
                                                                                "Message failed: Local: Queue full")
        assert p.flush(10) == 0


def test_purge_reports_purge_inflight_for_a_batch_the_engine_has_not_answered(tmp_path):
    conf = {"storage.url": f"file://{tmp_path}/root", "storage.flush.linger.ms": 2000}
    create(conf, "t")
    try:
        with Producer({**conf, "linger.ms": 0}) as p:
            reports = []
            p.produce("t", b"a", on_delivery=lambda err, msg: reports.append(err.code() if err else None))
            deadline = time.monotonic() + 10
            while not p._inflight and time.monotonic() < deadline:  # sent, waiting for the engine's commit
                time.sleep(0.001)
            p.purge(in_queue=False)
            assert p.poll(0) == 1 and reports == [KafkaError._PURGE_INFLIGHT] and len(p) == 0
            # the engine may still write it (librdkafka: "the message may still be delivered")
            p.produce("t", b"b", on_delivery=lambda err, msg: reports.append(err))
            assert p.flush(10) == 0 and reports[1:] == [None]
    finally:
        registry.close_all()


# ---------------------------------------------------------------- 3: librdkafka's defaults
def test_producer_defaults_are_librdkafkas():
    from txlake.config import parse_config
    from txlake.librdkafka_config import LIBRDKAFKA_PROPERTIES as PROPERTIES

    values = parse_config({"storage.url": "memory://defaults"}, "producer").values
    for name in ("message.timeout.ms", "delivery.timeout.ms", "partitioner"):
        assert str(values[name]) == PROPERTIES[name][2] == {"partitioner": "consistent_random"}.get(name, "300000")


def _placed(conf, partitioner, keys, n=6):
    """The partition each keyed record went to (one record per produce, flushed each time)."""
    topic = f"t-{partitioner or 'default'}"
    create(conf, topic, n)
    extra = {"partitioner": partitioner} if partitioner else {}
    with Producer({**conf, **extra}) as p:
        out = []
        for k in keys:
            p.produce(topic, b"v", key=k, on_delivery=lambda err, msg: out.append(msg.partition()))
            assert p.flush(10) == 0
    return out


KEYS = [b"21", b"foobar", b"abc", b"a somewhat longer key", b"\x00\xff"]


def test_keyed_records_go_where_the_configured_partitioner_puts_them(conf):
    from txlake.engine.partitioner import consistent_partition, fnv1a_partition, partition_for_key

    crc32 = [consistent_partition(k, 6) for k in KEYS]
    murmur2 = [partition_for_key(k, 6) for k in KEYS]
    fnv1a = [fnv1a_partition(k, 6) for k in KEYS]
    assert _placed(conf, None, KEYS) == crc32  # librdkafka's default: consistent_random
    for name, want in (("consistent", crc32), ("consistent_random", crc32), ("murmur2", murmur2),
                       ("murmur2_random", murmur2), ("fnv1a", fnv1a), ("fnv1a_random", fnv1a)):
        assert _placed(conf, name, KEYS) == want, name
    assert murmur2 != crc32  # the default changed what a keyed record's partition is


def test_null_and_empty_keys_under_each_partitioner(conf):
    from txlake.engine.partitioner import fnv1a_partition, partition_for_key

    # NULL keys are hashed as the empty key by murmur2, consistent and fnv1a (one partition for all)
    assert _placed(conf, "murmur2", [None, None, b""]) == [partition_for_key(b"", 6)] * 3
    assert _placed(conf, "consistent", [None, None, b""]) == [0] * 3  # crc32(b"") == 0
    assert _placed(conf, "fnv1a", [None, b""]) == [fnv1a_partition(b"", 6)] * 2
    # *_random: NULL keys (and for consistent_random empty keys too) go to a sticky random partition
    assert _placed(conf, "murmur2_random", [b""]) == [partition_for_key(b"", 6)]
    assert _placed(conf, "fnv1a_random", [b""]) == [fnv1a_partition(b"", 6)]


def test_the_partitioner_places_the_records_of_produce_arrow_too(conf):
    import pyarrow as pa
    from txlake.engine.partitioner import consistent_partition, partition_for_key

    for name, hash_key in ((None, consistent_partition), ("murmur2_random", partition_for_key)):
        topic = f"arrow-{name}"
        create(conf, topic, 6)
        with Producer({**conf, **({"partitioner": name} if name else {})}) as p:
            p.produce_arrow(topic, pa.table({"key": pa.array(KEYS, pa.binary()), "value": pa.array([b"v"] * len(KEYS))}))
        with Consumer({**conf, "auto.offset.reset": "earliest"}) as c:
            c.assign([TopicPartition(topic, i) for i in range(6)])
            got = sorted((m.key(), m.partition()) for m in c.consume(100, 2))
        assert got == sorted((k, hash_key(k, 6)) for k in KEYS), name


def test_an_unknown_partitioner_is_refused():
    with pytest.raises(KafkaException) as info:
        Producer({"storage.url": "memory://p", "partitioner": "murmur3"})
    assert info.value.args[0].code() == KafkaError._INVALID_ARG
    assert "partitioner" in info.value.args[0].str()


# ---------------------------------------------------------------- 4: Consumer
def _fill(conf, topic, partitions, per_partition):
    create(conf, topic, partitions)
    with Producer(conf) as p:
        for part in range(partitions):
            for i in range(per_partition):
                p.produce(topic, f"{part}-{i}".encode(), partition=part)


def _committed(conf, topic, partitions, group="g"):
    with Consumer({**conf, "group.id": group}) as c:
        return [tp.offset for tp in c.committed([TopicPartition(topic, i) for i in range(partitions)], 10)]


def test_without_auto_offset_store_only_stored_offsets_are_committed(conf):
    _fill(conf, "t", 2, 5)
    with Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": False,
                   "enable.auto.offset.store": False}) as c:
        c.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
        msgs = c.consume(10, 10)
        assert len(msgs) == 10
        with pytest.raises(KafkaException) as info:
            c.commit(asynchronous=False)  # nothing stored yet: every record returned is not "processed"
        assert info.value.args[0].code() == KafkaError._NO_OFFSET
        c.store_offsets(message=next(m for m in msgs if m.partition() == 0 and m.offset() == 2))
        c.store_offsets(offsets=[TopicPartition("t", 1, 4, "meta")])
        done = c.commit(asynchronous=False)
        assert [(tp.partition, tp.offset, tp.metadata) for tp in done] == [(0, 3, None), (1, 4, "meta")]
        with pytest.raises(KafkaException) as info:
            c.store_offsets(offsets=[TopicPartition("t", 7, 1)])
        assert info.value.args[0].code() == KafkaError._UNKNOWN_PARTITION
        for bad, exc, text in (((None, None), ValueError, "expected either message or offsets"),
                               ((msgs[0], []), ValueError, "message and offsets are mutually exclusive")):
            with pytest.raises(exc, match=f"^{text}$"):
                c.store_offsets(*bad)
    assert _committed(conf, "t", 2) == [3, 4]


def test_auto_commit_commits_the_stored_offsets(conf):
    _fill(conf, "t", 1, 5)
    with Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest", "enable.auto.commit": True,
                   "auto.commit.interval.ms": 100, "enable.auto.offset.store": False}) as c:
        c.subscribe(["t"])
        got = []
        while len(got) < 5:
            got += c.consume(5, 10)
        c.store_offsets(message=got[1])
    assert _committed(conf, "t", 1) == [2]  # auto-commit on close: the stored offset, not the position (5)
    with Consumer({**conf, "group.id": "g2", "auto.offset.reset": "earliest", "enable.auto.commit": True}) as c:
        c.subscribe(["t"])
        got = []
        while len(got) < 5:
            got += c.consume(5, 10)
        with pytest.raises(KafkaException) as info:
            c.store_offsets(message=got[1])  # enable.auto.offset.store=true (the default)
        assert info.value.args[0].code() == KafkaError._INVALID_ARG
    theirs = confluent_kafka.Consumer({"group.id": "g"})
    with pytest.raises(confluent_kafka.KafkaException) as info:
        theirs.store_offsets(offsets=[confluent_kafka.TopicPartition("t", 0, 5)])
    theirs.close()
    assert info.value.args[0].code() == KafkaError._INVALID_ARG
    assert _committed(conf, "t", 1, "g2") == [5]


def test_a_paused_partition_returns_no_records_until_resumed(conf):
    _fill(conf, "t", 2, 3)
    with Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
        c.pause([TopicPartition("t", 0)])
        assert sorted(m.value() for m in c.consume(10, 1)) == [b"1-0", b"1-1", b"1-2"]
        assert c.consume(10, 0.3) == []
        assert [tp.offset for tp in c.position([TopicPartition("t", 0)])] == [0]  # not moved
        c.resume([TopicPartition("t", 0)])
        assert [m.value() for m in c.consume(10, 5)] == [b"0-0", b"0-1", b"0-2"]
        # a partition paused with records already fetched keeps them for after resume()
        c.seek(TopicPartition("t", 0, 1))
        first = c.consume(1, 5)
        assert [m.value() for m in first] == [b"0-1"]
        c.pause([TopicPartition("t", 0)])
        assert c.consume(10, 0.3) == []
        c.resume([TopicPartition("t", 0)])
        assert [m.value() for m in c.consume(10, 5)] == [b"0-2"]


def test_memberid_is_the_group_member_id_or_none(conf):
    _fill(conf, "t", 1, 1)
    with Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest"}) as c:
        assert c.memberid() is None
        c.subscribe(["t"])
        while not c.consume(1, 10):
            pass
        member = c.memberid()
        assert member and member == c.consumer_group_metadata().member_id
    theirs = confluent_kafka.Consumer({"group.id": "g"})
    assert theirs.memberid() is None
    theirs.close()


CONSUMER_CALLS = {
    "poll": (0,), "consume": (1, 0), "assign": ([confluent_kafka.TopicPartition("t", 0)],), "unassign": (),
    "assignment": (), "subscribe": (["t"],), "unsubscribe": (), "position": ([confluent_kafka.TopicPartition("t", 0)],),
    "seek": (confluent_kafka.TopicPartition("t", 0, 1),), "committed": ([confluent_kafka.TopicPartition("t", 0)],),
    "get_watermark_offsets": (confluent_kafka.TopicPartition("t", 0),),
    "offsets_for_times": ([confluent_kafka.TopicPartition("t", 0, 1)],), "list_topics": (),
    "store_offsets": (None, [confluent_kafka.TopicPartition("t", 0, 1)]),
    "pause": ([confluent_kafka.TopicPartition("t", 0)],), "resume": ([confluent_kafka.TopicPartition("t", 0)],),
    "memberid": (), "consumer_group_metadata": (), "commit": (None, [confluent_kafka.TopicPartition("t", 0, 1)]),
    "incremental_assign": ([confluent_kafka.TopicPartition("t", 0)],),
    "incremental_unassign": ([confluent_kafka.TopicPartition("t", 0)],),
}


def _after_close(consumer, to_ours):
    consumer.close()
    out = {"close": consumer.close()}
    for name, args in CONSUMER_CALLS.items():
        with pytest.raises(RuntimeError) as info:
            getattr(consumer, name)(*to_ours(args))
        out[name] = str(info.value)
    return out


def test_every_call_after_close_raises_runtime_error_as_confluent_kafka(conf):
    def ours(args):
        return tuple([TopicPartition(t.topic, t.partition, t.offset) for t in a] if isinstance(a, list) and a and
                     isinstance(a[0], confluent_kafka.TopicPartition) else
                     TopicPartition(a.topic, a.partition, a.offset) if isinstance(a, confluent_kafka.TopicPartition)
                     else a for a in args)

    create(conf, "t")
    got = _after_close(Consumer({**conf, "group.id": "g"}), ours)
    assert got == _after_close(confluent_kafka.Consumer({"group.id": "g"}), lambda args: args)
    assert got["poll"] == "Consumer closed" and got["list_topics"] == "Handle has been closed"


# ---------------------------------------------------------------- 3: a topic that does not exist
def test_a_record_to_a_missing_topic_fails_in_its_delivery_report_then_produce_raises(conf):
    create(conf, "t")
    with Producer({**conf, "topic.metadata.propagation.max.ms": 300}) as p:
        reports = []
        p.produce("nope", b"x", key=b"k", on_delivery=lambda err, msg: reports.append((err.code(), msg.topic(), msg.value())))
        assert len(p) == 1  # queued, as confluent-kafka queues it (no exception from produce())
        assert p.flush(10) == 0
        assert reports == [(KafkaError._UNKNOWN_TOPIC, "nope", b"x")]
        with pytest.raises(KafkaException) as info:  # now known missing: librdkafka fails fast
            p.produce("nope", b"y")
        assert info.value.args[0].code() == KafkaError._UNKNOWN_TOPIC
        create(conf, "nope")
        p.produce("nope", b"z", on_delivery=lambda err, msg: reports.append((err, msg.offset())))
        assert p.flush(10) == 0 and reports[1:] == [(None, 0)]


def test_a_record_waiting_for_its_topic_is_written_once_the_topic_appears(conf):
    create(conf, "t")
    with Producer(conf) as p:  # topic.metadata.propagation.max.ms: 30000, librdkafka's
        reports = []
        p.produce("later", b"x", on_delivery=lambda err, msg: reports.append((err, msg.partition(), msg.offset())))
        create(conf, "later", 1)
        assert p.flush(20) == 0
        assert reports == [(None, 0, 0)]
