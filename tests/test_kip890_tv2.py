"""KIP-890 part 2 (transaction version 2) in the engine, through Kafka's request messages.

Each test drives one engine in-process with :class:`~txlake.engine.apis.KafkaApis` (the code
``txlake serve`` answers the wire with), sending what a Kafka 4.x producer sends once
ApiVersions finalizes ``transaction.version`` at 2: Produce v12 without AddPartitionsToTxn,
TxnOffsetCommit v5 without AddOffsetsToTxn, EndTxn v5. The expectations are Kafka's
(``TransactionCoordinator.endTransaction`` for ``supportsEpochBump``, its state table for
retries, ``TransactionMetadata.prepareAbortOrCommit``/``prepareComplete``,
``AddPartitionsToTxnManager``'s PRODUCER_FENCED -> INVALID_PRODUCER_EPOCH): every EndTxn bumps
the epoch and answers it, the markers carry it, and neither a late Produce nor a delayed
EndTxn of the ended transaction lands in the next one (the torn transaction).
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from kafka.protocol.admin import (DescribeProducersRequest, DescribeTransactionsRequest)
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.consumer.group import OffsetFetchRequest
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.producer import (AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest, ProduceRequest,
                                     TxnOffsetCommitRequest)
from kafka.record.memory_records import MemoryRecordsBuilder

from txlake import AdminClient, NewTopic
from txlake.config import parse_config
from txlake.engine.apis import KafkaApis, RequestContext
from txlake.engine.registry import acquire_broker, close_all, release_broker
from txlake.engine.transaction_metadata import (SHORT_MAX_VALUE, IllegalStateError, TransactionMetadata,
                                                TransactionState)
from txlake.formats import transaction_log

TS = 1_700_000_000_000
NONE, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, PRODUCER_FENCED = 0, 47, 48, 90
TRANSACTION_ABORTABLE = 120


class Engine:
    """One storage root's engine answering Kafka requests in-process (as ``txlake serve`` does)."""

    def __init__(self, url: str, create: bool = True, **conf):
        self.conf = {"storage.url": url, "transaction.state.log.num.partitions": 1, **conf}
        self.broker = acquire_broker(url, config=parse_config(self.conf, "admin").broker_config())
        if create:
            with AdminClient(self.conf) as admin:
                for future in admin.create_topics([NewTopic("t", 2)]).values():
                    future.result()
        self.apis = KafkaApis(self.broker, "127.0.0.1", 9092)
        self.versions: list[tuple[int, int]] = []

    def ask(self, request, version: int):
        answer = self.apis.handle(RequestContext(request.API_KEY, version), request)
        return answer.result(30) if isinstance(answer, Future) else answer

    def init(self, tid: str) -> tuple[int, int]:
        answer = self.ask(InitProducerIdRequest[4](transactional_id=tid, transaction_timeout_ms=60_000,
                                                   producer_id=-1, producer_epoch=-1), 4)
        assert answer.error_code == NONE
        return answer.producer_id, answer.producer_epoch

    def produce(self, tid: str, pid: int, epoch: int, sequence: int, value: bytes, partition: int = 0,
                version: int = 12) -> int:
        """A transactional Produce of one record to ``t``: its partition's error code."""
        builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20, transactional=True,
                                       producer_id=pid, producer_epoch=epoch, base_sequence=sequence)
        builder.append(timestamp=TS, key=None, value=value, headers=[])
        builder.close()
        P = ProduceRequest.TopicProduceData
        answer = self.ask(ProduceRequest[version](transactional_id=tid, acks=-1, timeout_ms=30_000, topic_data=[
            P(name="t", partition_data=[P.PartitionProduceData(index=partition, records=bytes(builder.buffer()))])]),
            version)
        return answer.responses[0].partition_responses[0].error_code

    def end_txn(self, tid: str, pid: int, epoch: int, commit: bool, version: int = 5) -> tuple[int, int, int]:
        answer = self.ask(EndTxnRequest[version](transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                                 committed=commit), version)
        return answer.error_code, getattr(answer, "producer_id", -1), getattr(answer, "producer_epoch", -1)

    def txn_offset_commit(self, tid: str, pid: int, epoch: int, group: str, offset: int, version: int = 5) -> int:
        T = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
        answer = self.ask(TxnOffsetCommitRequest[version](
            transactional_id=tid, group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
            member_id="", group_instance_id=None, topics=[T(name="t", partitions=[T.TxnOffsetCommitRequestPartition(
                partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")])]),
            version)
        return answer.topics[0].partitions[0].error_code

    def end_offset(self, partition: int = 0) -> int:
        L = ListOffsetsRequest.ListOffsetsTopic
        answer = self.ask(ListOffsetsRequest[7](replica_id=-1, isolation_level=0, topics=[
            L(name="t", partitions=[L.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1,
                                                           timestamp=-1)])]), 7)
        return answer.topics[0].partitions[0].offset

    def producer_epochs(self, partition: int = 0) -> dict[int, int]:
        """DescribeProducers of ``t``'s partition: producer id -> the epoch its producer state holds."""
        answer = self.ask(DescribeProducersRequest[0](topics=[
            DescribeProducersRequest.TopicRequest(name="t", partition_indexes=[partition])]), 0)
        return {p.producer_id: p.producer_epoch for p in answer.topics[0].partitions[0].active_producers}

    def describe(self, tid: str):
        return self.ask(DescribeTransactionsRequest[0](transactional_ids=[tid]), 0).transaction_states[0]

    def committed_offset(self, group: str) -> int:
        G = OffsetFetchRequest.OffsetFetchRequestGroup
        answer = self.ask(OffsetFetchRequest[8](groups=[G(group_id=group, topics=[
            G.OffsetFetchRequestTopics(name="t", partition_indexes=[0])])], require_stable=True), 8)
        return answer.groups[0].topics[0].partitions[0].committed_offset

    def close(self) -> None:
        release_broker(self.broker)


@pytest.fixture
def engine(tmp_path):
    e = Engine(f"file://{tmp_path}/root")
    try:
        yield e
    finally:
        e.close()
        close_all()


def test_api_versions_finalize_transaction_version_2_by_default_and_as_configured(tmp_path):
    def features(engine):
        answer = engine.ask(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"), 3)
        versions = {k.api_key: (k.min_version, k.max_version) for k in answer.api_keys}
        return ([(f.name, f.min_version, f.max_version) for f in answer.supported_features],
                [(f.name, f.min_version_level, f.max_version_level) for f in answer.finalized_features],
                answer.finalized_features_epoch, versions)

    e = Engine(f"file://{tmp_path}/a")
    try:
        supported, finalized, epoch, versions = features(e)
        assert supported == [("transaction.version", 0, 2)]
        assert finalized == [("transaction.version", 2, 2)] and epoch >= 0
        assert versions[0][1] >= 12 and versions[26][1] == 5 and versions[28][1] == 5  # Produce, EndTxn, TxnOffsetCommit
    finally:
        e.close()
        close_all()
    for level in (0, 1):
        e = Engine(f"file://{tmp_path}/tv{level}", **{"transaction.version": level})
        try:
            supported, finalized, _, _ = features(e)
            assert supported == [("transaction.version", 0, 2)]
            # Kafka lists no finalized feature at level 0
            assert finalized == ([("transaction.version", 1, 1)] if level else [])
        finally:
            e.close()
            close_all()


def test_end_txn_v5_bumps_the_epoch_and_a_late_produce_of_the_ended_transaction_is_fenced(engine):
    pid, epoch = engine.init("tx")
    # Produce v12: the partition joins the transaction without AddPartitionsToTxn
    assert engine.produce("tx", pid, epoch, 0, b"first") == NONE
    assert engine.describe("tx").transaction_state == "Ongoing"
    assert engine.end_txn("tx", pid, epoch, commit=True) == (NONE, pid, epoch + 1)
    # the COMMIT marker carries the bumped epoch: the partition's producer state holds it
    assert engine.producer_epochs() == {pid: epoch + 1}
    # the next transaction, with the epoch EndTxn answered
    assert engine.produce("tx", pid, epoch + 1, 0, b"second") == NONE
    # a late retry of the first transaction's batch (old epoch), to the same partition and to a new one:
    # fenced, never part of the second transaction (Kafka's INVALID_PRODUCER_EPOCH to a Produce)
    assert engine.produce("tx", pid, epoch, 1, b"late") == INVALID_PRODUCER_EPOCH
    assert engine.produce("tx", pid, epoch, 0, b"late", partition=1) == INVALID_PRODUCER_EPOCH
    assert engine.end_txn("tx", pid, epoch + 1, commit=False) == (NONE, pid, epoch + 2)
    assert engine.end_offset(0) == 4          # first, COMMIT marker, second, ABORT marker
    assert engine.end_offset(1) == 0          # the late batch to partition 1 was never appended
    assert engine.producer_epochs() == {pid: epoch + 2}
    described = engine.describe("tx")
    assert (described.transaction_state, described.producer_epoch) == ("CompleteAbort", epoch + 2)


def test_a_delayed_end_txn_of_the_previous_transaction_cannot_end_the_next_one(engine):
    pid, epoch = engine.init("tx")
    assert engine.produce("tx", pid, epoch, 0, b"first") == NONE
    assert engine.end_txn("tx", pid, epoch, commit=True) == (NONE, pid, epoch + 1)
    # the client's retry of that EndTxn (its answer was lost): Kafka recognises it by epoch + 1
    assert engine.end_txn("tx", pid, epoch, commit=True) == (NONE, pid, epoch + 1)
    # the opposite outcome at the old epoch is no retry
    assert engine.end_txn("tx", pid, epoch, commit=False)[0] == INVALID_TXN_STATE
    # the next transaction is open: the same delayed EndTxn is now fenced instead of committing it
    assert engine.produce("tx", pid, epoch + 1, 0, b"second") == NONE
    assert engine.end_txn("tx", pid, epoch, commit=True) == (PRODUCER_FENCED, -1, -1)
    assert engine.end_txn("tx", pid, epoch, commit=True, version=1)[0] == INVALID_PRODUCER_EPOCH
    assert engine.describe("tx").transaction_state == "Ongoing"
    assert engine.end_txn("tx", pid, epoch + 1, commit=False) == (NONE, pid, epoch + 2)
    # an abort with nothing to abort bumps the epoch too; a commit of nothing is refused
    assert engine.end_txn("tx", pid, epoch + 2, commit=True) == (INVALID_TXN_STATE, -1, -1)
    assert engine.end_txn("tx", pid, epoch + 2, commit=False) == (NONE, pid, epoch + 3)
    assert engine.end_offset(0) == 4


def test_part_1_clients_keep_the_epoch_and_the_verify_only_add(engine):
    pid, epoch = engine.init("tx")
    # Produce v11: no implicit add, the partition must come from AddPartitionsToTxn (KIP-890 part 1)
    assert engine.produce("tx", pid, epoch, 0, b"x", version=11) == TRANSACTION_ABORTABLE
    A = AddPartitionsToTxnRequest
    answer = engine.ask(A[3](v3_and_below_transactional_id="tx", v3_and_below_producer_id=pid,
                             v3_and_below_producer_epoch=epoch, v3_and_below_topics=[
                                 A.AddPartitionsToTxnTopic(name="t", partitions=[0])]), 3)
    assert answer.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == NONE
    assert engine.produce("tx", pid, epoch, 0, b"x", version=11) == NONE
    assert engine.end_txn("tx", pid, epoch, commit=True, version=4) == (NONE, -1, -1)
    assert engine.end_txn("tx", pid, epoch, commit=True, version=4) == (NONE, -1, -1)   # a retry
    assert engine.producer_epochs() == {pid: epoch}
    assert engine.describe("tx").producer_epoch == epoch


def test_part_1_cannot_tell_a_delayed_end_txn_from_the_next_ones(engine):
    """Why version 2 exists: under part 1 the epoch does not move at EndTxn, so a delayed duplicate
    of the first transaction's EndTxn commits the second transaction early (the torn transaction);
    the same sequence under version 2 is fenced (the test above)."""
    pid, epoch = engine.init("tx")
    A = AddPartitionsToTxnRequest
    add = A[3](v3_and_below_transactional_id="tx", v3_and_below_producer_id=pid, v3_and_below_producer_epoch=epoch,
               v3_and_below_topics=[A.AddPartitionsToTxnTopic(name="t", partitions=[0])])
    assert engine.ask(add, 3).results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == NONE
    assert engine.produce("tx", pid, epoch, 0, b"first", version=11) == NONE
    assert engine.end_txn("tx", pid, epoch, commit=True, version=4) == (NONE, -1, -1)
    assert engine.ask(add, 3).results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == NONE
    assert engine.produce("tx", pid, epoch, 1, b"second", version=11) == NONE
    # the delayed duplicate of the first EndTxn: accepted, it ends the second transaction
    assert engine.end_txn("tx", pid, epoch, commit=True, version=4) == (NONE, -1, -1)
    assert engine.describe("tx").transaction_state == "CompleteCommit"


def test_txn_offset_commit_v5_adds_the_group_partition_itself(engine):
    pid, epoch = engine.init("tx")
    assert engine.produce("tx", pid, epoch, 0, b"x") == NONE
    # v4 without AddOffsetsToTxn: the group's partition is not in the transaction (part 1)
    assert engine.txn_offset_commit("tx", pid, epoch, "g", 7, version=4) == TRANSACTION_ABORTABLE
    assert engine.txn_offset_commit("tx", pid, epoch, "g", 7) == NONE
    assert engine.end_txn("tx", pid, epoch, commit=True) == (NONE, pid, epoch + 1)
    assert engine.committed_offset("g") == 7
    # the old epoch is fenced (INVALID_PRODUCER_EPOCH, as Kafka's verification answers it)
    assert engine.txn_offset_commit("tx", pid, epoch, "g", 9) == INVALID_PRODUCER_EPOCH
    assert engine.committed_offset("g") == 7


def test_epoch_overflow_moves_to_a_new_producer_id(engine):
    pid, epoch = engine.init("tx")
    assert engine.produce("tx", pid, epoch, 0, b"x") == NONE
    # reaching Short.MAX_VALUE - 1 takes 32 766 transactions: set the coordinator's epoch there
    coordinator = engine.broker.transaction_coordinator()
    metadata = coordinator.state.get_transaction_state("tx").transaction_metadata
    last = SHORT_MAX_VALUE - 1
    with metadata.lock:
        metadata.producer_epoch = last
    error, new_pid, new_epoch = engine.end_txn("tx", pid, last, commit=True)
    assert (error, new_epoch) == (NONE, 0) and new_pid != pid
    # the marker was written with Short.MAX_VALUE: the old producer id can never write again
    assert engine.producer_epochs() == {pid: SHORT_MAX_VALUE}
    # a retry of that EndTxn (old producer id, epoch Short.MAX_VALUE - 1) is recognised
    assert engine.end_txn("tx", pid, last, commit=True) == (NONE, new_pid, 0)
    assert engine.produce("tx", new_pid, 0, 0, b"y") == NONE
    assert engine.end_txn("tx", new_pid, 0, commit=True) == (NONE, new_pid, 1)
    assert engine.end_offset(0) == 4
    described = engine.describe("tx")
    assert (described.producer_id, described.producer_epoch, described.transaction_state) == \
        (new_pid, 1, "CompleteCommit")


def test_a_restarted_coordinator_keeps_transaction_version_2_state(tmp_path):
    url = f"file://{tmp_path}/root"
    e = Engine(url)
    pid, epoch = e.init("tx")
    assert e.produce("tx", pid, epoch, 0, b"x") == NONE
    assert e.end_txn("tx", pid, epoch, commit=True) == (NONE, pid, epoch + 1)
    e.close()
    close_all()
    e = Engine(url, create=False)
    try:
        # the replayed CompleteCommit has the bumped epoch, and the version that makes the retry a retry
        assert e.end_txn("tx", pid, epoch, commit=True) == (NONE, pid, epoch + 1)
        assert e.produce("tx", pid, epoch, 1, b"late") == INVALID_PRODUCER_EPOCH
        assert e.produce("tx", pid, epoch + 1, 0, b"y") == NONE
        assert e.end_txn("tx", pid, epoch + 1, commit=True) == (NONE, pid, epoch + 2)
    finally:
        e.close()
        close_all()


def test_transaction_log_values_of_version_2_and_older_values():
    old = transaction_log.TxnLogValue(producer_id=4, previous_producer_id=4, next_producer_id=-1, producer_epoch=3,
                                      last_producer_epoch=-1, txn_timeout_ms=60_000, state="CompleteCommit",
                                      txn_start_timestamp=1, txn_last_update_timestamp=2)
    encoded = transaction_log.encode_value(old)
    # a version 0/1 value is written exactly as before transaction version 2 (no new field), canonical
    assert b"client_transaction_version" not in encoded
    assert transaction_log.CANONICAL_VALUE.fullmatch(encoded)
    assert transaction_log.decode_value(encoded, "x").client_transaction_version == 0
    bumped = transaction_log.TxnLogValue(producer_id=4, previous_producer_id=4, next_producer_id=9, producer_epoch=4,
                                         last_producer_epoch=3, txn_timeout_ms=60_000, state="PrepareCommit",
                                         topic_partitions=(("t", 0),), txn_start_timestamp=1,
                                         txn_last_update_timestamp=2, client_transaction_version=2)
    encoded = transaction_log.encode_value(bumped)
    assert encoded.endswith(b',"client_transaction_version":2}')
    assert transaction_log.CANONICAL_VALUE.fullmatch(encoded) is None   # read by the full decoder
    assert transaction_log.decode_value(encoded, "x") == bumped


def test_metadata_aborts_a_transaction_of_no_partition_only_for_version_2():
    md = TransactionMetadata("x", 5, producer_epoch=3, state=TransactionState.COMPLETE_COMMIT,
                             txn_start_timestamp=1, txn_last_update_timestamp=1)
    with pytest.raises(IllegalStateError, match="only a transaction version 2 abort"):
        md.prepare_abort_or_commit(TransactionState.PREPARE_ABORT, 10)
    assert md.pending_state is None
    transit = md.prepare_abort_or_commit(TransactionState.PREPARE_ABORT, 10, client_transaction_version=2,
                                         no_partition_added=True)
    assert (transit.producer_epoch, transit.last_producer_epoch, transit.txn_start_timestamp) == (4, 3, 10)
    md.complete_transition_to(transit)
    md.complete_transition_to(md.prepare_complete(11))
    assert (md.state, md.producer_id, md.producer_epoch, md.client_transaction_version) == \
        (TransactionState.COMPLETE_ABORT, 5, 4, 2)
    assert TransactionMetadata.from_log_value("x", md.to_log_value()) == md


@pytest.mark.parametrize("overflow", [False, True], ids=["bump", "overflow"])
def test_a_restarted_coordinator_finishes_a_version_2_prepare_commit_with_the_bumped_epoch(tmp_path, overflow):
    """The coordinator stops after PrepareCommit is logged, before any marker: the restarted one
    writes the markers with the bumped epoch (Short.MAX_VALUE on overflow) and completes to the
    bumped epoch -- or to the next producer id at epoch 0, which the PrepareCommit record named."""
    url = f"file://{tmp_path}/root"
    e = Engine(url)
    pid, epoch = e.init("tx")
    assert e.produce("tx", pid, epoch, 0, b"x") == NONE
    coordinator = e.broker.transaction_coordinator()
    found = coordinator.state.get_transaction_state("tx")
    metadata = found.transaction_metadata
    with metadata.lock:
        if overflow:
            metadata.producer_epoch = epoch = SHORT_MAX_VALUE - 1
        next_pid = e.broker.init_producer_id()[1] if overflow else -1
        transit = metadata.prepare_abort_or_commit(TransactionState.PREPARE_COMMIT, TS, client_transaction_version=2,
                                                   next_producer_id=next_pid)
    assert coordinator.state.append_transaction_to_log("tx", found.coordinator_epoch, transit) == NONE
    e.close()
    close_all()
    e = Engine(url, create=False)
    try:
        e.broker.transaction_coordinator()   # its start finishes the transaction
        described = e.describe("tx")
        expected = (next_pid, 0) if overflow else (pid, epoch + 1)
        assert (described.transaction_state, described.producer_id, described.producer_epoch) == \
            ("CompleteCommit", *expected)
        assert e.producer_epochs() == {pid: epoch + 1}
        assert e.end_offset(0) == 2
        # the client's retry of the EndTxn whose answer it never got
        assert e.end_txn("tx", pid, epoch, commit=True) == (NONE, *expected)
    finally:
        e.close()
        close_all()
