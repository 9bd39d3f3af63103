"""Bad input gets a clear error naming what and where; nothing committed is lost."""

import pytest

from txlake import AdminClient, Consumer, KafkaError, NewTopic, Producer, TopicPartition
from txlake.catalog.catalog import Catalog
from txlake.engine.registry import close_all


@pytest.fixture
def conf(storage):
    c = {**storage.conf(), "storage.flush.linger.ms": 1}
    yield c
    close_all()


def _load(conf, topic, batches):
    AdminClient(conf).create_topics([NewTopic(topic, 1)])[topic].result()
    p = Producer(conf)
    for values in batches:
        for v in values:
            p.produce(topic, value=v, partition=0)
        assert p.flush(10) == 0
    p.close()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "delete"])
def test_corrupt_segment_is_reported_naming_the_object_and_other_segments_still_read(conf, storage, damage):
    _load(conf, "t", [[b"a", b"b"], [b"c", b"d"]])
    close_all()
    store = storage.object_store()
    segments = Catalog.open(store).state.partition("t", 0).segments
    assert [(s.base_offset, s.last_offset) for s in segments] == [(0, 1), (2, 3)]
    bad = segments[1].path
    if damage == "truncate":
        data = store.get(bad)
        store.delete(bad)
        store.put(bad, data[: len(data) // 2])
    elif damage == "garbage":
        store.delete(bad)
        store.put(bad, b"not parquet at all")
    else:
        store.delete(bad)
    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("t", 0)])
    good = c.consume(2, 5)
    assert [m.value() for m in good] == [b"a", b"b"]
    err = c.poll(5)
    assert err.error().code() == KafkaError.CORRUPT_MESSAGE
    assert bad in err.error().str() and "t [0]" in err.error().str()
    c.close()


def test_oversize_invalid_name_invalid_config_are_refused_and_data_kept(conf):
    _load(conf, "keep", [[b"1", b"2"]])
    admin = AdminClient(conf)
    with pytest.raises(Exception) as bad_name:
        admin.create_topics([NewTopic("../../etc/passwd", 1)])["../../etc/passwd"].result()
    assert bad_name.value.args[0].code() == KafkaError.INVALID_TOPIC_EXCEPTION
    with pytest.raises(Exception) as bad_cfg:
        admin.create_topics([NewTopic("x", 1, config={"retention.ms": "soon"})])["x"].result()
    assert bad_cfg.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "retention.ms" in bad_cfg.value.args[0].str()
    p = Producer(conf)
    with pytest.raises(Exception) as big:
        p.produce("keep", value=b"x" * 2_000_000)
    assert big.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    p.close()
    admin.close()
    close_all()
    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("keep", 0)])
    assert [m.value() for m in c.consume(10, 2)] == [b"1", b"2"]
    assert sorted(AdminClient(conf).list_topics().topics) == ["keep"]
    c.close()
