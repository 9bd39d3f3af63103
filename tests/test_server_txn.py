"""``txlake serve``: transactions over the wire (issue 18's "Transaction APIs on the wire").

confluent-kafka (librdkafka) and kafka-python transactional producers against one server
subprocess for the module (file://); raw requests (kafka-python's protocol classes) where an
exact error code is the point: KIP-98 commit/abort with the offsets control records take,
zombie fencing, KIP-447 ``send_offsets_to_transaction`` and UNSTABLE_OFFSET_COMMIT, KIP-890
part 1 verification of a transactional Produce, KIP-664 ListTransactions/DescribeTransactions.
"""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient as KafkaAdmin
from confluent_kafka.admin import NewTopic as KafkaNewTopic
from kafka.protocol.admin import (DescribeTransactionsRequest, DescribeTransactionsResponse, ListTransactionsRequest,
                                  ListTransactionsResponse)
from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.producer import (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
                                     AddPartitionsToTxnResponse, EndTxnRequest, EndTxnResponse, InitProducerIdRequest,
                                     InitProducerIdResponse, ProduceRequest, ProduceResponse, TxnOffsetCommitRequest,
                                     TxnOffsetCommitResponse, WriteTxnMarkersRequest, WriteTxnMarkersResponse)
from kafka.record.memory_records import MemoryRecordsBuilder

from conftest import StorageTarget
from server_support import ServedRoot, decode_response, roundtrip
from test_server_groups import GROUP_SETTINGS
from txlake.engine.errors import Errors

TS = 1_700_000_000_000
SETTINGS = {**GROUP_SETTINGS, "transaction.state.log.num.partitions": 3, "storage.flush.interval.ms": 50}
TOPICS = {"a": 1, "fence": 1, "in": 1, "out": 1, "kp": 1, "raw": 2, "adm": 1}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One ``txlake serve`` for the module, with :data:`TOPICS` created over the wire."""
    tmp = tmp_path_factory.mktemp("serve-txn")
    root = ServedRoot(StorageTarget(url=f"file://{tmp}/root", options={}, backend="file"), tmp, SETTINGS).start()
    try:
        admin = KafkaAdmin({"bootstrap.servers": root.bootstrap})
        for name, future in admin.create_topics([KafkaNewTopic(t, n, 1) for t, n in TOPICS.items()]).items():
            future.result(30)
        yield root
    finally:
        code = root.stop()
    assert code == 0, f"txlake serve exited {code}; log {root.log_path}:\n{root.log_text()[-3000:]}"


def txn_producer(server, transactional_id: str, **conf) -> KafkaProducer:
    return KafkaProducer({"bootstrap.servers": server.bootstrap, "transactional.id": transactional_id,
                          "linger.ms": 5, **conf})


def read_all(server, topic: str, isolation: str, expected: int, timeout_s: float = 20.0) -> list[tuple[int, bytes]]:
    """``(offset, value)`` of partition 0 of ``topic`` read from offset 0 until ``expected`` records,
    then one more poll that must bring nothing (no duplicates, no aborted records)."""
    consumer = KafkaConsumer({"bootstrap.servers": server.bootstrap, "group.id": "reader", "isolation.level": isolation,
                              "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    consumer.assign([KafkaTopicPartition(topic, 0, 0)])
    out: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None:
                assert msg.error() is None, msg.error()
                out.append((msg.offset(), msg.value()))
        extra = consumer.poll(0.5)
        assert extra is None or extra.error() is not None, (extra.offset(), extra.value())
        low_high = consumer.get_watermark_offsets(KafkaTopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    return out, low_high


def raw(server, request, version: int, response_cls):
    return decode_response(response_cls, roundtrip(server.port, request, version), version)


def init_producer_id(server, transactional_id: str, version: int = 4, producer_id: int = -1, epoch: int = -1):
    answer = raw(server, InitProducerIdRequest[version](transactional_id=transactional_id, transaction_timeout_ms=60_000,
                                                        producer_id=producer_id, producer_epoch=epoch),
                 version, InitProducerIdResponse)
    return answer.error_code, answer.producer_id, answer.producer_epoch


def add_partitions(server, transactional_id: str, pid: int, epoch: int, partitions: dict[str, list[int]],
                   version: int = 3) -> dict:
    topics = [AddPartitionsToTxnRequest.AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in partitions.items()]
    answer = raw(server, AddPartitionsToTxnRequest[version](
        v3_and_below_transactional_id=transactional_id, v3_and_below_producer_id=pid,
        v3_and_below_producer_epoch=epoch, v3_and_below_topics=topics), version, AddPartitionsToTxnResponse)
    return {(t.name, p.partition_index): p.partition_error_code
            for t in answer.results_by_topic_v3_and_below for p in t.results_by_partition}


def produce_raw(server, transactional_id: str | None, topic: str, partition: int, pid: int, epoch: int,
                sequence: int, values: list[bytes], version: int = 9) -> tuple[int, int]:
    """A Produce (v9 unless ``version``) of one transactional batch: ``(error code, base offset)``."""
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20, transactional=True,
                                   producer_id=pid, producer_epoch=epoch, base_sequence=sequence)
    for v in values:
        builder.append(timestamp=TS, key=None, value=v, headers=[])
    builder.close()
    request = ProduceRequest[version](transactional_id=transactional_id, acks=-1, timeout_ms=30_000, topic_data=[
        ProduceRequest.TopicProduceData(name=topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=partition, records=bytes(builder.buffer()))])])
    part = raw(server, request, version, ProduceResponse).responses[0].partition_responses[0]
    return part.error_code, part.base_offset


def txn_offset_commit(server, transactional_id: str, group: str, pid: int, epoch: int, offsets: dict,
                      generation: int = -1, member_id: str = "", version: int = 3) -> dict:
    T = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    topics: dict[str, list] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(T.TxnOffsetCommitRequestPartition(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""))
    answer = raw(server, TxnOffsetCommitRequest[version](
        transactional_id=transactional_id, group_id=group, producer_id=pid, producer_epoch=epoch,
        generation_id=generation, member_id=member_id, group_instance_id=None,
        topics=[T(name=t, partitions=ps) for t, ps in topics.items()]), version, TxnOffsetCommitResponse)
    return {(t.name, p.partition_index): p.error_code for t in answer.topics for p in t.partitions}


def offset_fetch(server, group: str, topic: str, partition: int, require_stable: bool) -> tuple[int, int]:
    """OffsetFetch v8 of one partition: ``(committed offset, error code)``."""
    G = OffsetFetchRequest.OffsetFetchRequestGroup
    answer = raw(server, OffsetFetchRequest[8](groups=[G(group_id=group, topics=[
        G.OffsetFetchRequestTopics(name=topic, partition_indexes=[partition])])], require_stable=require_stable),
        8, OffsetFetchResponse)
    ((p,),) = [t.partitions for g in answer.groups for t in g.topics]
    return p.committed_offset, p.error_code


def end_txn(server, transactional_id: str, pid: int, epoch: int, committed: bool, version: int = 3) -> int:
    return raw(server, EndTxnRequest[version](transactional_id=transactional_id, producer_id=pid, producer_epoch=epoch,
                                              committed=committed), version, EndTxnResponse).error_code


# ---------------------------------------------------------------------------- confluent-kafka
def test_commit_and_abort_read_committed_sees_exactly_the_committed_records(server):
    p = txn_producer(server, "t-a")
    p.init_transactions(30)
    reports: list[tuple] = []

    def send(value: bytes) -> None:
        p.produce("a", value=value, partition=0, on_delivery=lambda err, msg: reports.append((err, msg.offset())))

    p.begin_transaction()
    for v in (b"c0", b"c1", b"c2"):
        send(v)
    p.commit_transaction(30)
    p.begin_transaction()
    send(b"x0")
    send(b"x1")
    assert p.flush(30) == 0  # written, so the abort has something to abort (else librdkafka purges them)
    p.abort_transaction(30)
    p.begin_transaction()
    send(b"c3")
    p.commit_transaction(30)
    # control records take offsets 3 (COMMIT), 6 (ABORT), 8 (COMMIT)
    assert reports == [(None, 0), (None, 1), (None, 2), (None, 4), (None, 5), (None, 7)]
    committed, (low, high) = read_all(server, "a", "read_committed", 4)
    assert committed == [(0, b"c0"), (1, b"c1"), (2, b"c2"), (7, b"c3")]
    assert (low, high) == (0, 9)
    uncommitted, _ = read_all(server, "a", "read_uncommitted", 6)
    assert uncommitted == [(0, b"c0"), (1, b"c1"), (2, b"c2"), (4, b"x0"), (5, b"x1"), (7, b"c3")]
    p.flush(10)


def test_open_transaction_holds_the_lso_and_aborted_records_stay_hidden(server):
    p = txn_producer(server, "t-fence")
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("fence", value=b"open", partition=0)
    assert p.flush(30) == 0
    consumer = KafkaConsumer({"bootstrap.servers": server.bootstrap, "group.id": "lso", "isolation.level":
                              "read_committed", "enable.auto.commit": False})
    try:  # read_committed's latest offset is the LSO: the open transaction's first offset
        assert consumer.get_watermark_offsets(KafkaTopicPartition("fence", 0), timeout=10) == (0, 0)
    finally:
        consumer.close()
    # zombie fencing: a second producer with the same transactional.id fences the first and
    # aborts its open transaction (KIP-98)
    successor = txn_producer(server, "t-fence")
    successor.init_transactions(30)
    with pytest.raises(KafkaException) as fenced:
        p.commit_transaction(30)
    err = fenced.value.args[0]
    assert err.fatal() and err.code() == KafkaError._FENCED, err
    successor.begin_transaction()
    successor.produce("fence", value=b"new", partition=0)
    successor.commit_transaction(30)
    # offsets: 0 "open" (aborted), 1 ABORT marker, 2 "new", 3 COMMIT
    committed, (low, high) = read_all(server, "fence", "read_committed", 1)
    assert committed == [(2, b"new")] and (low, high) == (0, 4)
    uncommitted, _ = read_all(server, "fence", "read_uncommitted", 2)
    assert uncommitted == [(0, b"open"), (2, b"new")]


def test_send_offsets_to_transaction_with_group_metadata_and_unstable_offset_commit(server):
    plain = KafkaProducer({"bootstrap.servers": server.bootstrap})
    for i in range(5):
        plain.produce("in", value=b"in%d" % i, partition=0)
    assert plain.flush(30) == 0
    consumer = KafkaConsumer({"bootstrap.servers": server.bootstrap, "group.id": "copier",
                              "isolation.level": "read_committed", "enable.auto.commit": False,
                              "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe(["in"])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append(msg.value())
    assert got == [b"in%d" % i for i in range(5)]
    p = txn_producer(server, "t-copier")
    p.init_transactions(30)
    p.begin_transaction()
    for v in got:
        p.produce("out", value=v.replace(b"in", b"out"), partition=0)
    p.send_offsets_to_transaction(consumer.position([KafkaTopicPartition("in", 0)]),
                                  consumer.consumer_group_metadata(), 30)
    # KIP-447: while the transaction holds the group's offsets, require_stable answers UNSTABLE_OFFSET_COMMIT (88)
    assert offset_fetch(server, "copier", "in", 0, require_stable=True) == (-1, 88)
    assert offset_fetch(server, "copier", "in", 0, require_stable=False) == (-1, 0)
    p.commit_transaction(30)
    assert consumer.committed([KafkaTopicPartition("in", 0)], 10)[0].offset == 5
    assert offset_fetch(server, "copier", "in", 0, require_stable=True) == (5, 0)
    consumer.close()
    out, _ = read_all(server, "out", "read_committed", 5)
    assert out == [(i, b"out%d" % i) for i in range(5)]


# ---------------------------------------------------------------------------- kafka-python
def test_kafka_python_transactional_producer_commits(server):
    from kafka import KafkaProducer as PyProducer

    p = PyProducer(bootstrap_servers=server.bootstrap, transactional_id="t-kp")
    p.init_transactions()
    p.begin_transaction()
    futures = [p.send("kp", value=b"kp%d" % i, partition=0) for i in range(3)]
    p.commit_transaction()
    assert [f.get(10).offset for f in futures] == [0, 1, 2]
    p.begin_transaction()
    assert p.send("kp", value=b"gone", partition=0).get(10).offset == 4
    p.abort_transaction()
    p.close()
    committed, (_, high) = read_all(server, "kp", "read_committed", 3)
    assert committed == [(0, b"kp0"), (1, b"kp1"), (2, b"kp2")] and high == 6  # 3 COMMIT, 4 "gone", 5 ABORT


# ---------------------------------------------------------------------------- raw requests: exact codes
def test_raw_transaction_requests_answer_kafkas_error_codes(server):
    error, pid, epoch = init_producer_id(server, "t-raw")
    assert (error, epoch) == (0, 0) and pid >= 0
    assert init_producer_id(server, "t-raw", producer_id=pid, epoch=-1)[0] == 42       # INVALID_REQUEST
    # Produce: transactional records without the request's transactional id; then to a partition not added
    assert produce_raw(server, None, "raw", 0, pid, epoch, 0, [b"v"]) == (53, -1)    # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert produce_raw(server, "t-raw", "raw", 0, pid, epoch, 0, [b"v"]) == (48, -1)  # INVALID_TXN_STATE (KIP-890)
    # ... which Kafka answers TRANSACTION_ABORTABLE from Produce v11 (KafkaApis: genericError above v10)
    assert produce_raw(server, "t-raw", "raw", 0, pid, epoch, 0, [b"v"], version=11) == (120, -1)
    # AddPartitionsToTxn: an unknown topic fails the transaction; an internal topic is not a client's to add
    assert add_partitions(server, "t-raw", pid, epoch, {"raw": [0], "nope": [0]}) == {("raw", 0): 55, ("nope", 0): 3}
    assert add_partitions(server, "t-raw", pid, epoch, {"raw": [0], "__consumer_offsets": [0]}) == {
        ("raw", 0): 55, ("__consumer_offsets", 0): 29}                                     # OPERATION_NOT_ATTEMPTED, TOPIC_AUTHORIZATION_FAILED
    assert add_partitions(server, "t-raw", pid, epoch + 1, {"raw": [0]}) == {("raw", 0): 90}       # PRODUCER_FENCED
    assert add_partitions(server, "t-raw", pid, epoch + 1, {"raw": [0]}, version=1) == {("raw", 0): 47}  # as v1 knows it
    assert add_partitions(server, "t-raw", pid + 1000, epoch, {"raw": [0]}) == {("raw", 0): 49}   # INVALID_PRODUCER_ID_MAPPING
    assert add_partitions(server, "t-raw", pid, epoch, {"raw": [0]}) == {("raw", 0): 0}
    assert produce_raw(server, "t-raw", "raw", 0, pid, epoch, 0, [b"r0", b"r1"]) == (0, 0)
    # KIP-890 part 1, the brokers' verify-only form (v4+): partition 1 was never added
    T = AddPartitionsToTxnRequest
    answer = raw(server, T[5](transactions=[T.AddPartitionsToTxnTransaction(
        transactional_id="t-raw", producer_id=pid, producer_epoch=epoch, verify_only=True,
        topics=[T.AddPartitionsToTxnTopic(name="raw", partitions=[0, 1])])]), 5, AddPartitionsToTxnResponse)
    assert answer.error_code == 0 and [(r.transactional_id, [(t.name, p.partition_index, p.partition_error_code)
                                                             for t in r.topic_results for p in t.results_by_partition])
                                       for r in answer.results_by_transaction] == [
        ("t-raw", [("raw", 0, 0), ("raw", 1, 120)])]                                   # TRANSACTION_ABORTABLE
    # TxnOffsetCommit: before AddOffsetsToTxn, a stale generation of a group that does not exist, then valid
    assert txn_offset_commit(server, "t-raw", "g-raw", pid, epoch, {("raw", 0): 7}) == {("raw", 0): 48}
    # ... TRANSACTION_ABORTABLE from v4 (Kafka's CoordinatorPartitionWriter: genericError), which the
    # Java client aborts on; INVALID_TXN_STATE is fatal to it
    assert txn_offset_commit(server, "t-raw", "g-raw", pid, epoch, {("raw", 0): 7}, version=4) == {("raw", 0): 120}
    assert raw(server, AddOffsetsToTxnRequest[3](transactional_id="t-raw", producer_id=pid, producer_epoch=epoch,
                                                 group_id="g-raw"), 3, AddOffsetsToTxnResponse).error_code == 0
    assert txn_offset_commit(server, "t-raw", "g-raw", pid, epoch, {("raw", 0): 7}, generation=3,
                             member_id="m") == {("raw", 0): 22}                        # ILLEGAL_GENERATION
    assert txn_offset_commit(server, "t-raw", "g-raw", pid, epoch, {("raw", 0): 7, ("nope", 0): 1}) == {
        ("raw", 0): 0, ("nope", 0): 3}
    assert offset_fetch(server, "g-raw", "raw", 0, require_stable=True) == (-1, 88)
    # EndTxn: fenced epoch (INVALID_PRODUCER_EPOCH before v2), commit, retry, opposite outcome
    assert end_txn(server, "t-raw", pid, epoch + 1, True) == 90
    assert end_txn(server, "t-raw", pid, epoch + 1, True, version=1) == 47
    assert end_txn(server, "t-raw", pid, epoch, True) == 0
    assert end_txn(server, "t-raw", pid, epoch, True) == 0                               # a retry after completion
    assert end_txn(server, "t-raw", pid, epoch, False) == 48                             # INVALID_TXN_STATE
    assert offset_fetch(server, "g-raw", "raw", 0, require_stable=True) == (7, 0)
    # KIP-360: InitProducerId naming the current identity bumps the epoch (a retry gets the same
    # answer); one naming an identity older than that is fenced
    assert init_producer_id(server, "t-raw", producer_id=pid, epoch=epoch) == (0, pid, epoch + 1)
    assert init_producer_id(server, "t-raw", producer_id=pid, epoch=epoch) == (0, pid, epoch + 1)
    assert init_producer_id(server, "t-raw", producer_id=pid, epoch=epoch + 1) == (0, pid, epoch + 2)
    assert init_producer_id(server, "t-raw", producer_id=pid, epoch=epoch)[0] == 90
    assert init_producer_id(server, "t-raw", version=3, producer_id=pid, epoch=epoch)[0] == 47


def test_list_and_describe_transactions_and_write_txn_markers(server):
    error, pid, epoch = init_producer_id(server, "t-adm")
    assert error == 0
    assert add_partitions(server, "t-adm", pid, epoch, {"adm": [0]}) == {("adm", 0): 0}
    assert produce_raw(server, "t-adm", "adm", 0, pid, epoch, 0, [b"hang"]) == (0, 0)

    def listed(version: int = 2, **filters):
        request = ListTransactionsRequest[version](state_filters=filters.get("states", []),
                                                   producer_id_filters=filters.get("pids", []),
                                                   duration_filter=filters.get("duration", -1),
                                                   transactional_id_pattern=filters.get("pattern"))
        answer = raw(server, request, version, ListTransactionsResponse)
        return answer.error_code, answer.unknown_state_filters, sorted(
            (t.transactional_id, t.producer_id, t.transaction_state) for t in answer.transaction_states)

    assert listed(pattern="t-adm") == (0, [], [("t-adm", pid, "Ongoing")])
    assert listed(pattern="t-ad.*", states=["Ongoing", "Bogus"], pids=[pid]) == (0, ["Bogus"], [("t-adm", pid, "Ongoing")])
    assert listed(pattern="t-adm", duration=3_600_000) == (0, [], [])
    assert listed(pattern="(") == (128, [], [])                                       # INVALID_REGULAR_EXPRESSION
    assert ("t-adm", pid, "Ongoing") in listed(version=0)[2]
    answer = raw(server, DescribeTransactionsRequest[0](transactional_ids=["t-adm", "never"]), 0,
                 DescribeTransactionsResponse)
    (found, missing) = answer.transaction_states
    assert (found.error_code, found.transaction_state, found.producer_id, found.producer_epoch,
            found.transaction_timeout_ms, [(t.topic, t.partitions) for t in found.topics]) == (
        0, "Ongoing", pid, epoch, 60_000, [("adm", [0])])
    assert found.transaction_start_time_ms > TS
    assert (missing.transactional_id, missing.error_code) == ("never", 105)              # TRANSACTIONAL_ID_NOT_FOUND
    # WriteTxnMarkers as kafka-transactions.sh abort sends it: the hanging record is aborted
    W = WriteTxnMarkersRequest.WritableTxnMarker
    answer = raw(server, WriteTxnMarkersRequest[1](markers=[W(
        producer_id=pid, producer_epoch=epoch, transaction_result=False, coordinator_epoch=0,
        topics=[W.WritableTxnMarkerTopic(name="adm", partition_indexes=[0, 5])])]), 1, WriteTxnMarkersResponse)
    assert [(m.producer_id, [(t.name, p.partition_index, p.error_code) for t in m.topics for p in t.partitions])
            for m in answer.markers] == [(pid, [("adm", 0, 0), ("adm", 5, 3)])]
    committed, (_, high) = read_all(server, "adm", "read_committed", 0)
    assert committed == [] and high == 2


# ---------------------------------------------------------------------------- a crash after AddPartitionsToTxn
#: librdkafka's debug line (``debug=eos``) once AddPartitionsToTxn answered NO_ERROR for a partition
REGISTERED = "registered with transaction"


def test_sigkill_right_after_add_partitions_is_answered_keeps_the_partitions(tmp_path):
    """AddPartitionsToTxn is answered only once its Ongoing record is durable (Kafka answers from
    ``appendTransactionToLog``'s callback): a server SIGKILLed right after librdkafka logged the
    answer, restarted on the same root and port, still has the partition in the transaction
    (DescribeTransactions), and the producer's commit_transaction succeeds -- or fails with an
    abortable error and its abort succeeds -- never fatally. With a 2 s storage linger the
    transaction's first record is still lingering at the kill, so nothing but the AddPartitionsToTxn
    answer itself made the record durable (before the fix the restarted coordinator had the id
    Empty, and EndTxn answered INVALID_TXN_STATE)."""
    root = ServedRoot(StorageTarget(url=f"file://{tmp_path}/root", options={}, backend="file"), tmp_path,
                      {**SETTINGS, "storage.flush.linger.ms": 2000,
                       "storage.lease.ms": 3000}).start()  # the restart waits out the dead server's lease
    try:
        admin = KafkaAdmin({"bootstrap.servers": root.bootstrap})
        admin.create_topics([KafkaNewTopic("crash", 1, 1)])["crash"].result(30)
        lines: list[str] = []

        class Lines(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                lines.append(record.getMessage())

        rdkafka_log = logging.getLogger("test_server_txn.rdkafka")
        rdkafka_log.addHandler(Lines())
        rdkafka_log.setLevel(logging.DEBUG)
        p = txn_producer(root, "t-crash", debug="eos", logger=rdkafka_log)
        p.init_transactions(30)
        p.begin_transaction()
        p.produce("crash", value=b"v0", partition=0)
        deadline = time.monotonic() + 20
        while not any(REGISTERED in line for line in lines):  # the log lines are served by poll()
            assert time.monotonic() < deadline, lines
            p.poll(0.01)
        root.kill()
        root.start()
        described = None
        deadline = time.monotonic() + 30
        while described is None or described.error_code == Errors.COORDINATOR_LOAD_IN_PROGRESS:
            assert time.monotonic() < deadline, described
            (described,) = raw(root, DescribeTransactionsRequest[0](transactional_ids=["t-crash"]), 0,
                               DescribeTransactionsResponse).transaction_states
        try:
            p.commit_transaction(30)
            outcome = "committed"
        except KafkaException as exc:
            err = exc.args[0]
            outcome = f"commit: {err.name()} fatal={err.fatal()} abortable={err.txn_requires_abort()}"
            if err.txn_requires_abort() and not err.fatal():
                p.abort_transaction(30)   # raises (the test fails) on a fatal error
                outcome = "aborted"
        state = (described.error_code, described.transaction_state, [(t.topic, t.partitions) for t in described.topics])
        assert state == (0, "Ongoing", [("crash", [0])]), (state, outcome)
        assert outcome in ("committed", "aborted"), outcome
        committed, (_, high) = read_all(root, "crash", "read_committed", 1 if outcome == "committed" else 0)
        assert (committed, high) == (([(0, b"v0")], 2) if outcome == "committed" else ([], 2))  # + COMMIT/ABORT marker
        p.flush(10)
    finally:
        code = root.stop()
    assert code == 0, f"txlake serve exited {code}; log {root.log_path}:\n{root.log_text()[-3000:]}"
