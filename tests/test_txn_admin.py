"""Transaction administration (KIP-664) through the AdminClient: ListTransactions with its
filters, DescribeTransactions (TRANSACTIONAL_ID_NOT_FOUND for unknown and expired ids),
DescribeProducers, and a hanging transaction made by lost coordinator state, found by the
find-hanging check and cleared with abort_transaction -- in the writer process and in a
process that only reads the committed state."""

from __future__ import annotations

import time

import pytest

from txlake import (AdminClient, Consumer, HangingTransaction, KafkaError, KafkaException, NewTopic,
                    PartitionProducerState, Producer, ProducerState, TopicPartition, TransactionDescription,
                    TransactionListing)
from txlake.catalog.catalog import Catalog
from txlake.catalog.storage import ObjectStore
from txlake.engine.errors import Errors
from txlake.engine.registry import close_all
from txlake.engine.transaction_admin import ActiveProducer, DescribedTransaction, OpenTransaction, hanging_transactions
from txlake.formats import transaction_log

TXN_CONF = {"transaction.state.log.num.partitions": 3, "storage.flush.linger.ms": 1}
OUT0, OUT1 = TopicPartition("out", 0), TopicPartition("out", 1)
MINUTE = 60_000


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def conf(storage):
    c = {**storage.conf(), **TXN_CONF}
    with AdminClient(c) as admin:
        admin.create_topics([NewTopic("out", 2)])["out"].result()
    yield c
    close_all()


def code(excinfo) -> int:
    return excinfo.value.args[0].code()


def lose_transactional_id(producer: Producer, transactional_id: str) -> None:
    """Lose the coordinator's state of ``transactional_id``: a tombstone for it in
    ``__transaction_state`` (as if its entry had been removed), written by the live
    coordinator. After a restart the coordinator does not know the id at all."""
    coordinator = producer._broker.transaction_coordinator()
    coordinator.txn_log.append(coordinator.state.partition_for(transactional_id),
                               transaction_log.encode_key(transactional_id), None)


def partition_state(storage, topic: str, partition: int):
    return Catalog.open(storage.object_store()).state.partition(topic, partition)


def read(conf, partition: int, isolation: str) -> list[bytes]:
    c = Consumer({**conf, "isolation.level": isolation, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition("out", partition)])
    out = []
    while True:
        msgs = c.consume(500, 0.3)
        if not msgs:
            break
        out += [m.value() for m in msgs if m.error() is None]
    c.close()
    return out


def describe(admin: AdminClient, tid: str) -> TransactionDescription:
    return admin.describe_transactions([tid])[tid].result()


def producers(admin: AdminClient, tp: TopicPartition) -> list[ProducerState]:
    return admin.describe_producers([tp])[tp].result().active_producers


# ---- ListTransactions / DescribeTransactions -------------------------------------------------

def test_describe_follows_a_transactional_id_through_its_states(conf):
    p = Producer({**conf, "transactional.id": "t1", "transaction.timeout.ms": 45_000})
    p.init_transactions(10)
    with AdminClient(conf) as admin:
        empty = describe(admin, "t1")
        pid = empty.producer_id
        assert empty == TransactionDescription("t1", 0, "Empty", pid, 0, 45_000, None, [])
        assert admin.list_transactions().result() == [TransactionListing("t1", pid, "Empty")]
        before = now_ms()
        p.begin_transaction()
        p.produce("out", value=b"a", partition=0)
        p.produce("out", value=b"b", partition=1)
        p.flush(10)
        ongoing = describe(admin, "t1")
        assert (ongoing.state, ongoing.producer_id, ongoing.producer_epoch, ongoing.topic_partitions) == \
            ("Ongoing", pid, 0, [OUT0, OUT1])
        assert before <= ongoing.transaction_start_time_ms <= now_ms()
        assert admin.list_transactions().result() == [TransactionListing("t1", pid, "Ongoing")]
        p.commit_transaction(10)
        assert describe(admin, "t1") == TransactionDescription("t1", 0, "CompleteCommit", pid, 0, 45_000,
                                                               ongoing.transaction_start_time_ms, [])
        p.begin_transaction()
        p.produce("out", value=b"c", partition=1)
        p.flush(10)
        assert describe(admin, "t1").topic_partitions == [OUT1]
        p.abort_transaction(10)
        aborted = describe(admin, "t1")
        assert (aborted.state, aborted.topic_partitions) == ("CompleteAbort", [])
        assert aborted.transaction_start_time_ms >= ongoing.transaction_start_time_ms
    p.close()
    close_all()
    with AdminClient(conf) as reader:  # a restarted process reads the same from __transaction_state
        assert not reader._broker.is_writer
        assert describe(reader, "t1") == aborted
        assert reader.list_transactions().result() == [TransactionListing("t1", pid, "CompleteAbort")]


def test_list_transactions_filters_by_state_producer_id_and_duration(conf):
    pids = {}
    open_producer = None
    for tid in ("committed", "aborted", "ongoing", "idle"):
        p = Producer({**conf, "transactional.id": tid})
        p.init_transactions(10)
        if tid != "idle":
            p.begin_transaction()
            p.produce("out", value=tid.encode(), partition=0)
            p.flush(10)
            if tid == "committed":
                p.commit_transaction(10)
            elif tid == "aborted":
                p.abort_transaction(10)
        with AdminClient(conf) as admin:
            pids[tid] = describe(admin, tid).producer_id
        if tid == "ongoing":
            open_producer = p
        else:
            p.close()
    time.sleep(0.05)  # every transaction has now run for more than 0 ms

    def listed(**filters):
        with AdminClient(conf) as admin:
            return [(t.transactional_id, t.state) for t in admin.list_transactions(**filters).result()]

    assert listed() == [("aborted", "CompleteAbort"), ("committed", "CompleteCommit"), ("idle", "Empty"),
                        ("ongoing", "Ongoing")]
    assert listed(states=["Ongoing"]) == [("ongoing", "Ongoing")]
    assert listed(states=["CompleteCommit", "CompleteAbort"]) == [("aborted", "CompleteAbort"),
                                                                   ("committed", "CompleteCommit")]
    assert listed(states=["PrepareCommit", "Dead"]) == []
    assert listed(producer_ids=[pids["committed"], pids["idle"]]) == [("committed", "CompleteCommit"), ("idle", "Empty")]
    assert listed(producer_ids=[pids["committed"]], states=["Ongoing"]) == []
    assert listed(producer_ids=[10**9]) == []
    # KIP-994: transactions running longer than the filter (now - their start time)
    assert listed(states=["Ongoing"], duration_filter=0) == [("ongoing", "Ongoing")]
    assert listed(states=["Ongoing"], duration_filter=-1) == [("ongoing", "Ongoing")]
    assert listed(states=["Ongoing"], duration_filter=3_600_000) == []
    assert listed(states=["Ongoing", "CompleteCommit", "CompleteAbort"], duration_filter=0) == \
        [("aborted", "CompleteAbort"), ("committed", "CompleteCommit"), ("ongoing", "Ongoing")]
    with AdminClient(conf) as admin:
        with pytest.raises(KafkaException) as bad:
            admin.list_transactions(states=["Running"])
        assert code(bad) == KafkaError._INVALID_ARG and "Running" in bad.value.args[0].str()
        with pytest.raises(TypeError):
            admin.list_transactions(states="Ongoing")
    # KIP-1152: a regular expression the whole transactional id matches, with the other filters
    assert listed(transactional_id_pattern=".*ed") == [("aborted", "CompleteAbort"), ("committed", "CompleteCommit")]
    assert listed(transactional_id_pattern="co.*", states=["CompleteCommit", "Ongoing"]) == [
        ("committed", "CompleteCommit")]
    assert listed(transactional_id_pattern="ongo") == []
    assert listed(transactional_id_pattern="") == listed()
    with AdminClient(conf) as admin:
        with pytest.raises(KafkaException) as bad:
            admin.list_transactions(transactional_id_pattern="(ab(cd").result()
        assert code(bad) == KafkaError.INVALID_REGULAR_EXPRESSION == 128
        assert "'(ab(cd' is not a valid regular expression" in bad.value.args[0].str()
    open_producer.close()


def test_describe_unknown_and_expired_transactional_ids(conf):
    p = Producer({**conf, "transactional.id": "gone"})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("out", value=b"x", partition=0)
    p.commit_transaction(10)
    with AdminClient(conf) as admin:
        futures = admin.describe_transactions(["gone", "never", ""])
        assert futures["gone"].result().state == "CompleteCommit"
        with pytest.raises(KafkaException) as never:
            futures["never"].result()
        assert code(never) == KafkaError.TRANSACTIONAL_ID_NOT_FOUND == 105
        with pytest.raises(KafkaException) as empty:
            futures[""].result()
        assert code(empty) == KafkaError.INVALID_REQUEST
        # transactional.id.expiration.ms: the idle id is removed (a tombstone in __transaction_state)
        coordinator = p._broker.transaction_coordinator()
        assert coordinator.state.remove_expired_transactional_ids(now=now_ms() + 10, expiration_ms=1) == ["gone"]
        with pytest.raises(KafkaException) as expired:
            admin.describe_transactions(["gone"])["gone"].result()
        assert code(expired) == KafkaError.TRANSACTIONAL_ID_NOT_FOUND
        assert "could not be found" in expired.value.args[0].str()
        assert admin.list_transactions().result() == []
    p.close()
    close_all()
    with AdminClient(conf) as reader:  # replayed from the log: still gone
        assert not reader._broker.is_writer
        with pytest.raises(KafkaException) as after_restart:
            reader.describe_transactions(["gone"])["gone"].result()
        assert code(after_restart) == KafkaError.TRANSACTIONAL_ID_NOT_FOUND
        assert reader.list_transactions().result() == []
        with pytest.raises(TypeError):
            reader.describe_transactions("gone")


# ---- DescribeProducers -------------------------------------------------------------------------

def test_describe_producers(conf):
    ts = now_ms() - 5 * MINUTE
    with Producer(conf) as idem:
        for i in range(3):
            idem.produce("out", value=b"i%d" % i, partition=0, timestamp=ts + i)
        idem.flush(10)
    t = Producer({**conf, "transactional.id": "tx"})
    t.init_transactions(10)
    t.begin_transaction()
    t.produce("out", value=b"t0", partition=0, timestamp=ts + 10)
    t.produce("out", value=b"t1", partition=0, timestamp=ts + 11)
    t.flush(10)
    with AdminClient(conf) as admin:
        tx_pid = describe(admin, "tx").producer_id
        (idem_state, open_state) = producers(admin, OUT0)
        idem_pid = idem_state.producer_id
        assert idem_state == ProducerState(idem_pid, 0, 2, ts + 2, -1, -1)
        assert open_state == ProducerState(tx_pid, 0, 1, ts + 11, -1, 3)      # its transaction starts at offset 3
        assert producers(admin, OUT1) == []
        futures = admin.describe_producers([OUT0, TopicPartition("out", 7), TopicPartition("nope", 0)])
        for missing in (TopicPartition("out", 7), TopicPartition("nope", 0)):
            with pytest.raises(KafkaException) as unknown:
                futures[missing].result()
            assert code(unknown) == KafkaError.UNKNOWN_TOPIC_OR_PART
        t.commit_transaction(10)
        epoch = t._broker.transaction_coordinator().coordinator_epoch  # the writer-lease epoch
        committed = producers(admin, OUT0)
        assert committed[1] == ProducerState(tx_pid, 0, 1, committed[1].last_timestamp, epoch, -1)
        assert committed[1].last_timestamp >= ts + 11  # the marker's timestamp
        with pytest.raises(TypeError):
            admin.describe_producers([("out", 0)])
    t.close()
    close_all()
    with AdminClient(conf) as reader:  # snapshot + log replay give the same answer
        assert not reader._broker.is_writer
        assert reader.describe_producers([OUT0])[OUT0].result() == PartitionProducerState(committed)


# ---- hanging transactions --------------------------------------------------------------------

def test_hanging_transaction_from_lost_coordinator_state_is_found_and_aborted(storage):
    conf = {**storage.conf(), **TXN_CONF}
    with AdminClient(conf) as admin:
        admin.create_topics([NewTopic("out", 2)])["out"].result()
    old = now_ms() - 20 * MINUTE  # records written 20 minutes ago (CreateTime)
    Producer({**conf, "transactional.id": "lost"}).init_transactions(10)  # epoch 0, fenced by the next one
    lost = Producer({**conf, "transactional.id": "lost"})
    lost.init_transactions(10)                                           # epoch 1
    lost.begin_transaction()
    lost.produce("out", value=b"h0", partition=0, timestamp=old)
    lost.produce("out", value=b"h1", partition=0, timestamp=old)
    lost.flush(10)
    live = Producer({**conf, "transactional.id": "live"})
    live.init_transactions(10)
    live.begin_transaction()
    live.produce("out", value=b"l0", partition=1, timestamp=old)          # old too, but its coordinator knows it
    live.flush(10)
    with Producer(conf) as plain:                                        # committed data behind the open transaction
        plain.produce("out", value=b"after0", partition=0)
        plain.produce("out", value=b"after1", partition=0)
        plain.flush(10)
    with AdminClient(conf) as admin:
        lost_pid = describe(admin, "lost").producer_id
        live_pid = describe(admin, "live").producer_id
        assert admin.find_hanging_transactions() == []   # both are live transactions of their coordinator
        lose_transactional_id(lost, "lost")
    lost.close()
    close_all()                                          # restart: the coordinator reloads __transaction_state

    p0 = partition_state(storage, "out", 0)
    assert (p0.high_watermark, p0.last_stable_offset) == (4, 0)   # held at the hanging transaction's first offset
    assert read(conf, 0, "read_committed") == []
    hanging = HangingTransaction(OUT0, ProducerState(lost_pid, 1, 1, old, -1, 0))
    with AdminClient(conf) as reader:                    # a process that only reads the committed state
        assert not reader._broker.is_writer
        with pytest.raises(KafkaException) as unknown:
            describe(reader, "lost")
        assert code(unknown) == KafkaError.TRANSACTIONAL_ID_NOT_FOUND
        assert reader.list_transactions().result() == [TransactionListing("live", live_pid, "Ongoing")]
        assert reader.list_transactions(producer_ids=[lost_pid]).result() == []
        assert reader.find_hanging_transactions() == [hanging]
        assert reader.find_hanging_transactions([TopicPartition("out")]) == [hanging]
        assert reader.find_hanging_transactions([OUT1]) == []
        assert reader.find_hanging_transactions(max_transaction_timeout_ms=30 * MINUTE) == []
        assert not reader._broker.is_writer              # nothing above took the writer lease

    with Producer({**conf, "transactional.id": "other"}) as other:   # this process becomes the writer again
        other.init_transactions(10)
        with AdminClient(conf) as admin:
            assert admin._broker.is_writer
            assert admin.find_hanging_transactions() == [hanging]
            with pytest.raises(KafkaException) as stale:             # not the hanging transaction's epoch
                admin.abort_transaction(OUT0, lost_pid, 0, 0).result()
            assert code(stale) == KafkaError.INVALID_PRODUCER_EPOCH == 47
            with pytest.raises(KafkaException) as missing:
                admin.abort_transaction(TopicPartition("out", 9), lost_pid, 1, 0).result()
            assert code(missing) == KafkaError.UNKNOWN_TOPIC_OR_PART
            assert admin.abort_transaction(OUT0, lost_pid, 1, 0).result() is None
            p0 = partition_state(storage, "out", 0)
            assert (p0.high_watermark, p0.last_stable_offset) == (5, 5)   # the marker is offset 4; the LSO moved on
            assert [(a.producer_id, a.first_offset, a.last_offset) for a in p0.aborted_transactions] == \
                [(lost_pid, 0, 4)]
            assert admin.find_hanging_transactions() == []
            (after,) = [s for s in producers(admin, OUT0) if s.producer_id == lost_pid]
            assert (after.producer_epoch, after.coordinator_epoch, after.current_transaction_start_offset) == (1, 0, -1)
            with pytest.raises(KafkaException) as fenced:                 # an older coordinator epoch than the marker's
                admin.abort_transaction(OUT0, lost_pid, 1, -1).result()
            assert code(fenced) == KafkaError.TRANSACTION_COORDINATOR_FENCED == 52
    assert read(conf, 0, "read_committed") == [b"after0", b"after1"]       # consumers go past it
    assert read(conf, 0, "read_uncommitted") == [b"h0", b"h1", b"after0", b"after1"]
    close_all()


def test_abort_is_refused_when_the_lease_holder_does_not_take_the_hand_over(tmp_path):
    from txlake.engine.broker import Broker, BrokerConfig
    from txlake.engine.handoff import REQUESTS_PREFIX

    url = f"file://{tmp_path}/root"
    with AdminClient({"storage.url": url}) as admin:
        admin.create_topics([NewTopic("out", 1)])["out"].result()
    close_all()
    # another process, as far as the registry knows, that looks for hand-overs once a minute
    other = Broker(ObjectStore(url), BrokerConfig(lease_ms=60_000, handoff_poll_ms=60_000))
    other.ensure_writer()
    try:
        with AdminClient({"storage.url": url}) as admin:
            assert admin.find_hanging_transactions() == [] and admin.list_transactions().result() == []
            with pytest.raises(KafkaException) as held:
                admin.abort_transaction(OUT0, 5, 0, 0, request_timeout=1).result()
            assert code(held) == KafkaError.NOT_LEADER_OR_FOLLOWER
            assert "did not take it within 1 s" in held.value.args[0].str()
            assert other.store.list(REQUESTS_PREFIX) == []          # withdrawn: it will never run
            assert other.catalog.state.partition("out", 0).high_watermark == 0
    finally:
        other.close()
        close_all()


_HOLDER = """
import sys
from txlake import Producer
p = Producer({"storage.url": sys.argv[1], "transactional.id": "app", "storage.handoff.poll.ms": 50})
p.init_transactions(30)
p.begin_transaction()
p.produce("out", value=b"h0", partition=0)
p.produce("out", value=b"h1", partition=0)
p.flush(30)
print("ready", flush=True)
sys.stdin.read()   # hold the writer lease (and serve hand-overs) until the test closes stdin
"""


def test_abort_from_another_process_is_written_by_the_lease_holder(tmp_path):
    """kafka-transactions.sh abort against a running application: the process that holds the
    writer lease (here a subprocess with an open transaction) writes the ABORT marker handed
    over to it; the answers are those of a local abort."""
    import subprocess
    import sys

    url = f"file://{tmp_path}/root"
    with AdminClient({"storage.url": url}) as admin:
        admin.create_topics([NewTopic("out", 1)])["out"].result()
    close_all()
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        with AdminClient({"storage.url": url}) as admin:
            assert not admin._broker.is_writer
            (app,) = producers(admin, OUT0)
            assert (app.producer_epoch, app.current_transaction_start_offset) == (0, 0)
            with pytest.raises(KafkaException) as stale:      # answered by the holder's engine
                admin.abort_transaction(OUT0, app.producer_id, app.producer_epoch - 1, 0).result()
            assert code(stale) == KafkaError.INVALID_PRODUCER_EPOCH
            assert admin.abort_transaction(OUT0, app.producer_id, app.producer_epoch, 0).result() is None
            assert not admin._broker.is_writer
        state = Catalog.open(ObjectStore(url)).state.partition("out", 0)
        assert (state.high_watermark, state.last_stable_offset) == (3, 3)   # h0, h1, the ABORT marker
        assert [(a.producer_id, a.first_offset, a.last_offset) for a in state.aborted_transactions] == \
            [(app.producer_id, 0, 2)]
        assert read({"storage.url": url}, 0, "read_committed") == []
        assert read({"storage.url": url}, 0, "read_uncommitted") == [b"h0", b"h1"]
    finally:
        holder.stdin.close()
        holder.wait(30)
        close_all()


def test_hanging_filter_follows_kafka():
    producer = ActiveProducer(7, 0, 3, 0, -1, 10)

    def open_txn(topic, partition, pid=7):
        return OpenTransaction(topic, partition, ActiveProducer(pid, 0, 3, 0, -1, 10))

    a, b, c, d = open_txn("t", 0), open_txn("t", 1), open_txn("t", 2, pid=8), open_txn("t", 3, pid=9)
    ongoing = DescribedTransaction("app", state="Ongoing", producer_id=7, topic_partitions=(("t", 0),))
    assert hanging_transactions([a, b, c, d], {7: "app", 9: "gone"}, {"app": ongoing, "gone": None}) == [b, c, d]
    assert hanging_transactions([OpenTransaction("t", 0, producer)], {7: "app"}, {"app": ongoing}) == []
    assert Errors.TRANSACTIONAL_ID_NOT_FOUND == 105
