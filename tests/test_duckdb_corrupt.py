"""An unreadable topic never takes DuckDB access to the others down (issue 14, defect 7).

One object of ``__consumer_offsets``, one of ``__transaction_state`` and one of the user
topic ``payments`` are corrupted (truncated: no Parquet footer) on a real root:
``txlake.duckdb.connect(url)`` succeeds, ``orders`` answers with its exact records, each
broken view raises an error naming its topic and the object, ``txlake sql`` warns about
the three and answers; once the object is whole again, ``refresh`` brings its view back.
"""

from __future__ import annotations

import json
import warnings

import pytest
from click.testing import CliRunner

import txlake.duckdb as txduck
from txlake import AdminClient, Consumer, NewTopic, Producer, TopicPartition
from txlake.cli import main
from txlake.engine import registry

from helpers import open_catalog
from test_cli import _close_engines  # noqa: E402,F401 - autouse: unsets TXLAKE_STORAGE*, closes the engines

ORDERS = 30
PAYMENTS = 7
BROKEN = ("__consumer_offsets", "__transaction_state", "payments")




def _objects_by_topic(storage) -> dict[str, set[str]]:
    """Data object key -> the topics whose live segments it holds."""
    out: dict[str, set[str]] = {}
    for name, t in open_catalog(storage).state.topics.items():
        for p in t.partitions:
            for s in p.segments:
                out.setdefault(s.path, set()).add(name)
    return out


@pytest.fixture
def damaged(storage):
    """A root with ``orders`` (30 records, 2 partitions), ``payments`` (7 records), a consumer
    group's committed offsets and a transactional producer's state; then one object each of
    ``__consumer_offsets``, ``__transaction_state`` and ``payments`` is truncated to half (an
    object holding that topic only). Returns ``(storage, {topic: key}, {key: original bytes})``."""
    conf = {**storage.conf(), "storage.flush.linger.ms": 1, "transaction.state.log.num.partitions": 1,
            "offsets.topic.num.partitions": 1}
    with AdminClient(conf) as admin:
        for name, n in (("orders", 2), ("payments", 1)):
            admin.create_topics([NewTopic(name, n)])[name].result()
    with Producer({**conf, "linger.ms": 1}) as p:  # one flush per topic: objects of one topic each
        for i in range(ORDERS):
            p.produce("orders", f"order-{i}".encode(), key=f"k{i}".encode(), partition=i % 2)
        assert p.flush(30) == 0
        for i in range(PAYMENTS):
            p.produce("payments", f"payment-{i}".encode(), partition=0)
        assert p.flush(30) == 0
    c = Consumer({**conf, "group.id": "billing", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("orders", 0, 5), TopicPartition("orders", 1, 6)], asynchronous=False)
    c.close()
    txn = Producer({**conf, "transactional.id": "app-1"})
    txn.init_transactions(30)  # a __transaction_state record, nothing else in that flush
    txn.close()
    registry.close_all()

    store = storage.object_store()
    chosen: dict[str, str] = {}
    for key, topics in sorted(_objects_by_topic(storage).items()):
        if len(topics) == 1 and (t := next(iter(topics))) in BROKEN:
            chosen.setdefault(t, key)
    assert sorted(chosen) == sorted(BROKEN), _objects_by_topic(storage)
    originals = {}
    for key in chosen.values():
        data = store.get(key)
        originals[key] = data
        store.put(key, data[: len(data) // 2])
    return storage, chosen, originals


def test_connect_survives_corrupt_internal_and_user_topics(damaged):
    storage, chosen, originals = damaged
    store = storage.object_store()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        con = txduck.connect(storage.url, storage.options)  # all topics, internal ones included
    assert [type(w.message).__name__ for w in caught] == ["UnreadableTopicWarning"]
    for topic, key in chosen.items():
        assert f"{topic!r}: CorruptObjectError: {store.uri(key)}: not a readable Parquet object" \
            in str(caught[0].message)

    # the intact topic answers exactly
    rows = con.sql('SELECT partition, "offset", decode(value) FROM orders ORDER BY 1, 2').fetchall()
    expected = sorted((i % 2, i // 2, f"order-{i}") for i in range(ORDERS))
    assert rows == expected

    # every broken view raises naming its topic and the object; the others keep working
    assert set(txduck.unreadable_topics(con)) == set(BROKEN)
    for topic, key in chosen.items():
        message = txduck.unreadable_topics(con)[topic]
        assert message.startswith(f"txlake: topic {topic!r} cannot be read: CorruptObjectError: {store.uri(key)}: "
                                  "not a readable Parquet object")
        for sql in (f'SELECT count(*) FROM "{topic}"', f'SELECT * FROM "{topic}" WHERE partition = 0'):
            with pytest.raises(Exception) as err:
                con.sql(sql).fetchall()
            assert message in str(err.value)
        assert con.sql(f'DESCRIBE "{topic}"').fetchall()[2][:2] == ("topic", "VARCHAR")
    assert con.sql("SELECT count(*) FROM orders").fetchall() == [(ORDERS,)]

    # once the object is whole again (e.g. restored from a backup), refresh brings the view back
    payments_key = chosen["payments"]
    store.put(payments_key, originals[payments_key])
    with pytest.warns(txduck.UnreadableTopicWarning):
        assert txduck.refresh(con) == ["payments"]
    assert con.sql("SELECT count(*), min(decode(value)) FROM payments").fetchall() == [(PAYMENTS, "payment-0")]
    assert set(txduck.unreadable_topics(con)) == {"__consumer_offsets", "__transaction_state"}
    con.close()

    # topics= keeps working as before, and a root with no damage gives no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        con = txduck.connect(storage.url, storage.options, topics=["orders", "payments"])
    assert txduck.unreadable_topics(con) == {}
    assert con.sql("SELECT count(*) FROM payments").fetchall() == [(PAYMENTS,)]
    con.close()


def test_txlake_sql_warns_and_answers_on_the_other_topics(damaged):
    storage, chosen, _ = damaged
    store = storage.object_store()
    args = ["--storage", storage.url]
    for k, v in storage.options.items():
        args += ["-O", f"{k}={v if isinstance(v, str) else json.dumps(v)}"]
    runner = CliRunner()
    res = runner.invoke(main, ["sql", "SELECT count(*) AS n FROM orders", "--format", "csv", *args],
                        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert res.stdout == f"n\n{ORDERS}\n"
    warned = res.stderr.splitlines()
    assert len(warned) == 3
    for topic, key in sorted(chosen.items()):
        line = next(w for w in warned if f"topic {topic!r}" in w)
        assert line.startswith(f"Warning: txlake: topic {topic!r} cannot be read: CorruptObjectError: "
                               f"{store.uri(key)}: not a readable Parquet object")
        assert line.endswith("(its view raises this error when queried; the other topics answer)")

    res = runner.invoke(main, ["sql", "SELECT count(*) FROM payments", *args], catch_exceptions=False)
    assert res.exit_code == 1
    assert res.stderr.splitlines()[-1].startswith(
        f"Error: Invalid Input Error: txlake: topic 'payments' cannot be read: CorruptObjectError: "
        f"{store.uri(chosen['payments'])}: not a readable Parquet object")
