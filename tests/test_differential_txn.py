"""Differential tests, transactions: confluent-kafka transactional scenarios run against Apache
Kafka 4.3.1 (the ``apache_kafka`` fixture) and against ``txlake serve``; every observable
outcome must be equal (issue 18, "Differential tests").

Each scenario function takes a bootstrap address and returns a plain dict of outcomes
(tests/differential.py): delivery offsets, high watermarks and LSOs (a read_committed
consumer's ListOffsets), the exact records read_committed and read_uncommitted consumers
return, committed offsets, and the error each client call raises as ``(name, fatal,
retriable, txn_requires_abort)``. Producer ids and timestamps are left out (they legitimately
differ). The scenarios:

* :func:`transactions_scenario` -- commit; abort; interleaved open, committed and aborted
  transactions of several producers and an idempotent one; the LSO while one is open and
  after it commits; DescribeTransactions, ListTransactions and DescribeProducers (KIP-664,
  raw requests: confluent-kafka's AdminClient does not offer them) while it is open.
* :func:`fencing_scenario` -- zombie fencing (KIP-98): a second producer with the same
  transactional id fences the first during its transaction; the first then sends, commits
  or sends offsets.
* :func:`timeout_scenario` -- a transaction past ``transaction.timeout.ms`` is aborted by the
  coordinator with an epoch bump; what the old producer then sees.
* :func:`group_scenario` -- consume-transform-produce with a consumer group and
  ``send_offsets_to_transaction(..., consumer_group_metadata())`` (KIP-447); the committed
  offsets after commit and abort; UNSTABLE_OFFSET_COMMIT while offsets are pending
  (``committed()`` and a raw OffsetFetch with ``require_stable``); TxnOffsetCommit with the
  generation of before a rebalance (ILLEGAL_GENERATION).
* :func:`recovery_scenario` -- the epoch bump after an abortable error (KIP-360: a record
  the broker refuses, then ``abort_transaction``); DeleteRecords under an open transaction.

Transaction version: Kafka 4.3.1 formats with ``transaction.version=2`` (KIP-890 part 2),
but part 2 holds only for clients that send EndTxn v5+ / Produce v12+; librdkafka 2.16 sends
InitProducerId v4, AddPartitionsToTxn v0, EndTxn v1 and Produce v10, so the reference answers
it with part 1's semantics (no epoch bump at each EndTxn) -- the same as txlake, which
advertises part 1 only. The reference broker therefore keeps Kafka's default format, and
:func:`test_the_reference_outcomes_are_the_expected_ones` pins the epochs that show it.

Both brokers look for timed-out transactions every 200 ms
(``transaction.abort.timed.out.transaction.cleanup.interval.ms``; Kafka's default is 10 s).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaException, TopicPartition
from kafka.protocol.admin import (DescribeProducersRequest, DescribeProducersResponse, DescribeTransactionsRequest,
                                  DescribeTransactionsResponse, ListTransactionsRequest, ListTransactionsResponse)
from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse

from differential import CALL_TIMEOUT_S, PairedOutcomes, Run, error_flags, outcome, served_txlake

#: the short transaction timeout of :func:`timeout_scenario` (ms; librdkafka's minimum is 1000):
#: long enough that the first record is delivered and the open transaction described before
#: it runs out on a loaded machine
SHORT_TXN_TIMEOUT_MS = 3000
#: how long ``committed()`` may retry UNSTABLE_OFFSET_COMMIT before it gives up (s)
UNSTABLE_WAIT_S = 2.0


# ---------------------------------------------------------------------------- helpers
def _deliver(run: Run, producer, records: list[tuple[str, int, bytes]]) -> dict[str, Any]:
    """Produce ``(logical topic, partition, value)`` records and flush: ``{"reports": their
    delivery reports in order, (error flags, partition, offset) (offset -1001 on error)}``,
    plus ``"raised"``: the error flags of what ``flush()`` raised, when it did (confluent-kafka
    raises a fatal error there, after the delivery reports)."""
    reports: list[Any] = [None] * len(records)
    for i, (topic, partition, value) in enumerate(records):
        def report(err, msg, i=i):
            # no call in here: confluent-kafka runs the callback with the fatal error already
            # raised, and any call made then fails with SystemError
            reports[i] = (err, msg)
        producer.produce(run.name(topic), value=value, partition=partition, on_delivery=report)
    out: dict[str, Any] = {}
    try:
        remaining = producer.flush(CALL_TIMEOUT_S)
        assert remaining == 0, f"{remaining} records undelivered after {CALL_TIMEOUT_S} s"
    except KafkaException as e:
        out["raised"] = error_flags(e.args[0])
    out["reports"] = [None if r is None else (error_flags(r[0]), r[1].partition(),
                                              r[1].offset() if r[0] is None else -1001) for r in reports]
    return out


def _values(records: list[tuple]) -> list[tuple]:
    """``(partition, offset, value)`` of records as :meth:`Run.consume` returns them (error
    events as they are)."""
    return [r if r[0] == "error" else (r[0], r[1], r[3]) for r in records]


def _read(run: Run, topic: str, start: dict[int, int], expected: int, isolation: str) -> list[tuple]:
    return _values(run.consume(topic, start, expected, **{"isolation.level": isolation}))


def _snapshot(run: Run, topic: str, partitions: int, committed: int, uncommitted: int,
              start: dict[int, int] | None = None) -> dict[str, Any]:
    """The watermarks under both isolation levels and the records each returns from ``start``
    (default: every partition from 0), expecting ``committed`` / ``uncommitted`` records."""
    start = start or {p: 0 for p in range(partitions)}
    return {"high_watermarks": run.watermarks(topic, partitions, "read_uncommitted"),
            "lso": run.watermarks(topic, partitions, "read_committed"),
            "read_committed": _read(run, topic, start, committed, "read_committed"),
            "read_uncommitted": _read(run, topic, start, uncommitted, "read_uncommitted")}


def _modulo(value: int, lowest: int = 1) -> int | str:
    """A producer id or a timestamp as a comparable outcome: ``"set"`` from ``lowest`` on (its
    value legitimately differs between brokers), else the value itself (0, -1: exactly Kafka's)."""
    return "set" if value >= lowest else value


def _describe_transactions(run: Run, *logical_ids: str) -> list[tuple]:
    """DescribeTransactions v0 (KIP-664): per id ``(logical id, error code, state, producer id,
    epoch, timeout ms, start time ms, sorted (logical topic, partition))``, producer id and
    start time :func:`_modulo`, and the partition of ``__consumer_offsets`` as ``"group's"``
    (the reference has 1 such partition, txlake Kafka's default 50)."""
    answer = run.raw(DescribeTransactionsRequest[0](transactional_ids=[run.name(t) for t in logical_ids]), 0,
                     DescribeTransactionsResponse)
    return [(run.logical(s.transactional_id), s.error_code, s.transaction_state,
             _modulo(s.producer_id, lowest=1 if s.error_code else 0),  # txlake's first producer id is 0
             s.producer_epoch, s.transaction_timeout_ms, _modulo(s.transaction_start_time_ms),
             sorted((run.logical(t.topic), "group's" if t.topic == "__consumer_offsets" else p)
                    for t in s.topics for p in t.partitions))
            for s in answer.transaction_states]


def _list_transactions(run: Run, states: list[str]) -> tuple:
    """ListTransactions v1 filtered by ``states``: ``(error code, unknown state filters,
    sorted (logical id, state))`` of this run's ids (the reference broker is shared)."""
    answer = run.raw(ListTransactionsRequest[1](state_filters=states, producer_id_filters=[], duration_filter=-1), 1,
                     ListTransactionsResponse)
    return (answer.error_code, sorted(answer.unknown_state_filters),
            sorted((run.logical(t.transactional_id), t.transaction_state) for t in answer.transaction_states
                   if t.transactional_id.endswith(run.suffix)))


def _describe_producers(run: Run, topic: str, partitions: int) -> list[tuple]:
    """DescribeProducers v0 (KIP-664) of a topic's partitions: per partition ``(partition, error
    code, sorted (epoch, last sequence, current transaction start offset))``; no producer
    ids, timestamps or coordinator epochs (the coordinator's own numbering)."""
    R = DescribeProducersRequest[0]
    answer = run.raw(R(topics=[R.TopicRequest(name=run.name(topic), partition_indexes=list(range(partitions)))]), 0,
                     DescribeProducersResponse)
    return [(p.partition_index, p.error_code,
             sorted((s.producer_epoch, s.last_sequence, s.current_txn_start_offset) for s in p.active_producers))
            for t in answer.topics for p in sorted(t.partitions, key=lambda p: p.partition_index)]


def _offset_fetch(run: Run, group: str, topic: str, partitions: int, require_stable: bool) -> tuple:
    """OffsetFetch v8 (KIP-447's ``require_stable``): ``(group error code, [(partition,
    committed offset, error code)])``."""
    G = OffsetFetchRequest[8].OffsetFetchRequestGroup
    answer = run.raw(OffsetFetchRequest[8](groups=[G(group_id=run.name(group), topics=[
        G.OffsetFetchRequestTopics(name=run.name(topic), partition_indexes=list(range(partitions)))])],
        require_stable=require_stable), 8, OffsetFetchResponse)
    (g,) = answer.groups
    return g.error_code, sorted((p.partition_index, p.committed_offset, p.error_code)
                                for t in g.topics for p in t.partitions)


def _wait_for_state(run: Run, logical_id: str, state: str) -> tuple:
    """DescribeTransactions of ``logical_id`` until its state is ``state`` (the coordinator's
    own work: a timeout abort, markers): that answer. Raises AssertionError naming the last
    answer when it does not come within :data:`CALL_TIMEOUT_S`."""
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while True:
        (described,) = _describe_transactions(run, logical_id)
        if described[2] == state:
            return described
        assert time.monotonic() < deadline, f"{logical_id} is not {state} after {CALL_TIMEOUT_S} s: {described}"
        time.sleep(0.05)


def _init(run: Run, transactional_id: str, **conf: Any):
    producer = run.txn_producer(transactional_id, **conf)
    producer.init_transactions(CALL_TIMEOUT_S)
    return producer


def _end(run: Run, producer, transactional_id: str, commit: bool, settled: str | None = None) -> None:
    """Commit or abort, then wait until the coordinator completed it (Kafka answers EndTxn
    once PrepareCommit/PrepareAbort is logged and writes the markers after; txlake answers
    after the markers), so the watermarks read next do not race the markers. ``settled``:
    the state to wait for instead of CompleteCommit/CompleteAbort (Empty after an abort that
    bumps the epoch)."""
    if commit:
        producer.commit_transaction(CALL_TIMEOUT_S)
    else:
        producer.abort_transaction(CALL_TIMEOUT_S)
    _wait_for_state(run, transactional_id, settled or ("CompleteCommit" if commit else "CompleteAbort"))


# ---------------------------------------------------------------------------- scenarios
def transactions_scenario(bootstrap: str) -> dict[str, Any]:
    """Commit, abort, and interleaved transactions on topic ``txn`` (2 partitions).

    In order: t1 commits 3 records to partition 0 and 2 to partition 1; t2 aborts 2 records on
    partition 0; t3 sends 2 records to partition 0 and stays open; t4 commits 1 record on
    partition 0; an idempotent producer appends 1; t5 aborts 1 record on each partition.
    Snapshot "open" (t3 open: the LSO stops at its first record), then the KIP-664 views,
    then t3 commits and snapshot "closed"."""
    run = Run(bootstrap)
    run.create_topics({"txn": 2})
    out: dict[str, Any] = {}
    t1 = _init(run, "t1")
    t1.begin_transaction()
    out["t1_deliveries"] = _deliver(run, t1, [("txn", 0, b"c1-%d" % i) for i in range(3)]
                                    + [("txn", 1, b"c1-p1-%d" % i) for i in range(2)])
    _end(run, t1, "t1", commit=True)
    out["after_commit"] = _snapshot(run, "txn", 2, 5, 5)

    t2 = _init(run, "t2")
    t2.begin_transaction()
    out["t2_deliveries"] = _deliver(run, t2, [("txn", 0, b"a2-%d" % i) for i in range(2)])
    _end(run, t2, "t2", commit=False)
    out["after_abort"] = _snapshot(run, "txn", 2, 5, 7)

    t3, t4, t5 = (_init(run, t) for t in ("t3", "t4", "t5"))
    t3.begin_transaction()
    out["t3_deliveries"] = _deliver(run, t3, [("txn", 0, b"o3-%d" % i) for i in range(2)])
    t4.begin_transaction()
    out["t4_deliveries"] = _deliver(run, t4, [("txn", 0, b"c4")])
    _end(run, t4, "t4", commit=True)
    out["idempotent_deliveries"] = run.produce([dict(topic="txn", partition=0, value=b"plain")])
    t5.begin_transaction()
    out["t5_deliveries"] = _deliver(run, t5, [("txn", 0, b"a5"), ("txn", 1, b"a5-p1")])
    _end(run, t5, "t5", commit=False)
    out["open"] = _snapshot(run, "txn", 2, 5, 12)
    out["describe_transactions"] = _describe_transactions(run, "t1", "t2", "t3", "t4", "never")
    out["list_transactions"] = {
        "all": _list_transactions(run, []),
        "ongoing": _list_transactions(run, ["Ongoing"]),
        "complete": _list_transactions(run, ["CompleteCommit", "CompleteAbort", "Bogus"])}
    out["describe_producers"] = _describe_producers(run, "txn", 2)

    _end(run, t3, "t3", commit=True)
    out["closed"] = _snapshot(run, "txn", 2, 9, 12)
    out["closed_from_8"] = _read(run, "txn", {0: 8}, 3, "read_committed")
    out["describe_producers_closed"] = _describe_producers(run, "txn", 2)
    out["describe_t3_closed"] = _describe_transactions(run, "t3")
    for producer in (t1, t2, t3, t4, t5):
        producer.flush(CALL_TIMEOUT_S)
    return out


def _flags_of(call) -> tuple[str, Any]:
    return outcome(call, flags=True)


def fencing_scenario(bootstrap: str) -> dict[str, Any]:
    """Zombie fencing (KIP-98) on topic ``fence``: for each of send, commit and send_offsets,
    an old producer delivers a record in a transaction, a new producer with the same
    transactional id initialises (fencing it: its transaction is aborted), then the old one
    sends a record, commits, or sends offsets -- the error each call raises, and what its
    following calls raise. The new producer then commits a record; the records of the topic
    under both isolation levels and the epochs."""
    run = Run(bootstrap)
    run.create_topics({"fence": 1, "fence-in": 1})
    out: dict[str, Any] = {}
    group = run.consumer("fence-group")
    metadata = group.consumer_group_metadata()
    try:
        for case in ("send", "commit", "send_offsets"):
            tid = "fenced-" + case
            old = _init(run, tid)
            old.begin_transaction()
            first = _deliver(run, old, [("fence", 0, b"old-%s-1" % case.encode())])
            new = _init(run, tid)
            got: dict[str, Any] = {"first": first, "described": _describe_transactions(run, tid)}
            if case == "send":
                got["send"] = _deliver(run, old, [("fence", 0, b"old-send-2")])
            elif case == "send_offsets":
                got["send_offsets"] = _flags_of(lambda: old.send_offsets_to_transaction(
                    [TopicPartition(run.name("fence-in"), 0, 1)], metadata, CALL_TIMEOUT_S))
            got["commit"] = _flags_of(lambda: old.commit_transaction(CALL_TIMEOUT_S))
            got["abort"] = _flags_of(lambda: old.abort_transaction(CALL_TIMEOUT_S))
            got["begin"] = _flags_of(old.begin_transaction)
            new.begin_transaction()
            got["new"] = _deliver(run, new, [("fence", 0, b"new-%s" % case.encode())])
            _end(run, new, tid, commit=True)
            got["described_new"] = _describe_transactions(run, tid)
            out[case] = got
    finally:
        group.close()
    out["records"] = _snapshot(run, "fence", 1, 3, 6)
    return out


def timeout_scenario(bootstrap: str) -> dict[str, Any]:
    """Transaction timeout on topic ``slow``: a producer with ``transaction.timeout.ms`` =
    :data:`SHORT_TXN_TIMEOUT_MS` delivers a record and waits; the coordinator aborts the
    transaction with an epoch bump (Kafka's ``abortTimedOutTransactions``). Then the old
    producer sends a record, commits, aborts; a new producer of the id initialises and
    commits. The coordinator's view at each step and the records."""
    run = Run(bootstrap)
    run.create_topics({"slow": 1})
    out: dict[str, Any] = {}
    conf = {"transaction.timeout.ms": SHORT_TXN_TIMEOUT_MS, "message.timeout.ms": SHORT_TXN_TIMEOUT_MS}
    old = _init(run, "slow", **conf)
    old.begin_transaction()
    out["first"] = _deliver(run, old, [("slow", 0, b"late-1")])
    out["described_open"] = _describe_transactions(run, "slow")
    out["described_aborted"] = _wait_for_state(run, "slow", "CompleteAbort")
    out["aborted"] = _snapshot(run, "slow", 1, 0, 1)
    out["send"] = _deliver(run, old, [("slow", 0, b"late-2")])
    out["commit"] = _flags_of(lambda: old.commit_transaction(CALL_TIMEOUT_S))
    out["abort"] = _flags_of(lambda: old.abort_transaction(CALL_TIMEOUT_S))
    out["begin_again"] = _flags_of(old.begin_transaction)
    new = _init(run, "slow")
    out["described_new"] = _describe_transactions(run, "slow")
    new.begin_transaction()
    out["new"] = _deliver(run, new, [("slow", 0, b"on-time")])
    _end(run, new, "slow", commit=True)
    out["records"] = _snapshot(run, "slow", 1, 1, 2)
    return out


def _poll_until(consumers: list, done, what: str) -> list:
    """Poll every consumer in turn (their group membership moves only when they poll) until
    ``done(the records polled so far)``; those records, as (partition, offset, value)."""
    got: list[tuple] = []
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while not done(got):
        assert time.monotonic() < deadline, f"not within {CALL_TIMEOUT_S} s: {what}"
        for consumer in consumers:
            msg = consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                got.append((msg.partition(), msg.offset(), msg.value()))
    return got


def group_scenario(bootstrap: str) -> dict[str, Any]:
    """Consume-transform-produce (KIP-447) from ``in`` (2 partitions, 3 records each) to ``out``
    with group ``ctp``: the committed offsets while the transaction is pending (``committed()``
    of a read_committed consumer, which asks with ``require_stable``, and raw OffsetFetch v8
    with and without it), after commit, after an aborted transaction that sent other offsets,
    and TxnOffsetCommit with the consumer group metadata of before a rebalance (a second member
    joined: the generation moved)."""
    run = Run(bootstrap)
    run.create_topics({"in": 2, "out": 1})
    run.produce([dict(topic="in", partition=i % 2, value=b"in-%d" % i) for i in range(6)])
    out: dict[str, Any] = {}
    member_conf = {"isolation.level": "read_committed", "auto.offset.reset": "earliest"}
    worker = run.consumer("ctp", **member_conf)
    checker = run.consumer("ctp", **member_conf)   # same group, not a member: committed() only
    joiner = run.consumer("ctp", **member_conf)
    ins = [TopicPartition(run.name("in"), p) for p in range(2)]

    def committed(timeout_s: float = CALL_TIMEOUT_S) -> tuple[str, Any]:
        return _flags_of(lambda: [(tp.partition, tp.offset) for tp in checker.committed(ins, timeout=timeout_s)])

    try:
        worker.subscribe([run.name("in")])
        polled = _poll_until([worker], lambda got: len(got) >= 6, "the worker reads in")
        out["polled"] = sorted(polled)
        positions = worker.position(worker.assignment())
        out["positions"] = sorted((tp.partition, tp.offset) for tp in positions)
        producer = _init(run, "ctp")
        producer.begin_transaction()
        out["transformed"] = _deliver(run, producer, [("out", 0, value.upper()) for _, _, value in sorted(polled)])
        out["send_offsets"] = _flags_of(lambda: producer.send_offsets_to_transaction(
            positions, worker.consumer_group_metadata(), CALL_TIMEOUT_S))
        out["pending"] = {"committed": committed(UNSTABLE_WAIT_S),
                          "offset_fetch_stable": _offset_fetch(run, "ctp", "in", 2, True),
                          "offset_fetch": _offset_fetch(run, "ctp", "in", 2, False),
                          "described": _describe_transactions(run, "ctp")}
        _end(run, producer, "ctp", commit=True)
        out["after_commit"] = {"committed": committed(),
                               "offset_fetch_stable": _offset_fetch(run, "ctp", "in", 2, True)}

        producer.begin_transaction()
        out["aborted_send"] = _deliver(run, producer, [("out", 0, b"ABORTED")])
        out["aborted_send_offsets"] = _flags_of(lambda: producer.send_offsets_to_transaction(
            [TopicPartition(run.name("in"), 0, 1), TopicPartition(run.name("in"), 1, 2)],
            worker.consumer_group_metadata(), CALL_TIMEOUT_S))
        _end(run, producer, "ctp", commit=False)
        out["after_abort"] = {"committed": committed(),
                              "offset_fetch_stable": _offset_fetch(run, "ctp", "in", 2, True)}

        # a rebalance: a second member joins, the generation moves on
        stale = worker.consumer_group_metadata()
        joiner.subscribe([run.name("in")])
        _poll_until([worker, joiner], lambda _: len(joiner.assignment()) == 1 and len(worker.assignment()) == 1,
                    "the second member's rebalance")
        producer.begin_transaction()
        out["stale_send"] = _deliver(run, producer, [("out", 0, b"STALE")])
        out["stale_send_offsets"] = _flags_of(lambda: producer.send_offsets_to_transaction(
            [TopicPartition(run.name("in"), 0, 2)], stale, CALL_TIMEOUT_S))
        out["stale_commit"] = _flags_of(lambda: producer.commit_transaction(CALL_TIMEOUT_S))
        out["stale_abort"] = _flags_of(lambda: _end(run, producer, "ctp", commit=False))
        out["after_stale"] = {"committed": committed(), "described": _describe_transactions(run, "ctp")}
        # the current generation: the worker reads a new record of its partition and sends its position
        run.produce([dict(topic="in", partition=p, value=b"in-after-%d" % p) for p in range(2)])
        out["polled_after_rebalance"] = sorted(_poll_until([worker, joiner], lambda got: len(got) >= 2,
                                                           "the members read the new records"))
        # which member gets which partition is librdkafka's range assignor over random member ids
        (mine,) = [tp.partition for tp in worker.assignment()]
        producer.begin_transaction()
        out["fresh_send"] = _deliver(run, producer, [("out", 0, b"FRESH")])
        out["fresh_send_offsets"] = _flags_of(lambda: producer.send_offsets_to_transaction(
            worker.position(worker.assignment()), worker.consumer_group_metadata(), CALL_TIMEOUT_S))
        out["fresh_commit"] = _flags_of(lambda: _end(run, producer, "ctp", commit=True))
        status, offsets = committed()
        out["after_fresh"] = {"committed": (status, {"worker's" if p == mine else "joiner's": o for p, o in offsets}),
                              "described": _describe_transactions(run, "ctp")}
    finally:
        for consumer in (worker, checker, joiner):
            consumer.close()
    out["out"] = _snapshot(run, "out", 1, 7, 9)
    return out


def recovery_scenario(bootstrap: str) -> dict[str, Any]:
    """The epoch bump after an abortable error (KIP-360) on topic ``bump``
    (``max.message.bytes`` 1000): a transaction delivers a small record, then one the broker
    refuses as too large (MESSAGE_TOO_LARGE); commit fails and must abort. librdkafka aborts
    without a new epoch, so the next transaction's batch has a sequence gap
    (OUT_OF_ORDER_SEQUENCE_NUMBER); that abort bumps the epoch (InitProducerId with the current
    producer id and epoch) and the transaction after it commits under the new epoch. Then
    DeleteRecords under an open transaction on topic ``del``: the low watermark, the LSO and
    what each isolation level reads, before and after the transaction commits."""
    run = Run(bootstrap)
    run.create_topics({"bump": (1, {"max.message.bytes": "1000"}), "del": 1})
    out: dict[str, Any] = {}
    producer = _init(run, "bump")
    producer.begin_transaction()
    out["small"] = _deliver(run, producer, [("bump", 0, b"small-1")])
    out["too_large"] = _deliver(run, producer, [("bump", 0, b"x" * 2000)])
    out["commit"] = _flags_of(lambda: producer.commit_transaction(CALL_TIMEOUT_S))
    out["abort"] = _flags_of(lambda: _end(run, producer, "bump", commit=False))
    out["described_after_abort"] = _describe_transactions(run, "bump")
    out["producers_after_abort"] = _describe_producers(run, "bump", 1)
    out["begin"] = _flags_of(producer.begin_transaction)
    # the refused record took a sequence number: the broker refuses the next batch of the epoch
    out["next"] = _deliver(run, producer, [("bump", 0, b"small-2"), ("bump", 0, b"small-3")])
    out["next_commit"] = _flags_of(lambda: producer.commit_transaction(CALL_TIMEOUT_S))
    out["next_abort"] = _flags_of(lambda: _end(run, producer, "bump", commit=False, settled="Empty"))
    out["described_after_bump"] = _describe_transactions(run, "bump")
    producer.begin_transaction()
    out["bumped"] = _deliver(run, producer, [("bump", 0, b"small-4"), ("bump", 0, b"small-5")])
    out["bumped_commit"] = _flags_of(lambda: _end(run, producer, "bump", commit=True))
    out["described_after_commit"] = _describe_transactions(run, "bump")
    out["producers_after_commit"] = _describe_producers(run, "bump", 1)
    out["bump"] = _snapshot(run, "bump", 1, 2, 3)

    # DeleteRecords under an open transaction
    run.produce([dict(topic="del", partition=0, value=b"before-%d" % i) for i in range(2)])
    deleter = _init(run, "del")
    deleter.begin_transaction()
    out["del_open"] = _deliver(run, deleter, [("del", 0, b"open-%d" % i) for i in range(3)])

    def delete_records(offset: int) -> tuple[str, Any]:
        futures = run.admin.delete_records([TopicPartition(run.name("del"), 0, offset)],
                                           request_timeout=CALL_TIMEOUT_S)
        return outcome(lambda: list(futures.values())[0].result(CALL_TIMEOUT_S).low_watermark)

    out["delete_into_open"] = delete_records(3)     # past the LSO (2), below the high watermark (5)
    out["del_while_open"] = _snapshot(run, "del", 1, 0, 2, start={0: 3})
    out["producers_while_open"] = _describe_producers(run, "del", 1)
    out["delete_to_end"] = delete_records(-1)       # up to the high watermark
    out["del_after_delete"] = _snapshot(run, "del", 1, 0, 0, start={0: 5})
    out["del_commit"] = _flags_of(lambda: _end(run, deleter, "del", commit=True))
    deleter.begin_transaction()
    out["del_next"] = _deliver(run, deleter, [("del", 0, b"after")])
    _end(run, deleter, "del", commit=True)
    out["del_committed"] = _snapshot(run, "del", 1, 1, 1, start={0: 5})
    return out


# ---------------------------------------------------------------------------- the tests
SCENARIOS = {"transactions": transactions_scenario, "fencing": fencing_scenario, "timeout": timeout_scenario,
             "group": group_scenario, "recovery": recovery_scenario}

#: what differs and is documented in docs/server.md ("Behaviour that differs"):
#: scenario -> part -> key -> (Apache Kafka's value, txlake's value)
DOCUMENTED = {
    # DeleteRecords past the first offset (2) of an open transaction moves the log start
    # offset to 3: Kafka 4.3.1 keeps answering the transaction's first offset as the LSO
    # (ListOffsets latest, read_committed: 2, below the log start offset -- librdkafka's
    # get_watermark_offsets then swaps low and high); txlake answers the log start offset
    "recovery": {"del_while_open": {"lso": ([(2, 3)], [(3, 3)])}},
}


@pytest.fixture(scope="module")
def txlake_server(tmp_path_factory):
    """``txlake serve`` for this module, configured as the reference (differential.TXLAKE_SETTINGS)."""
    with served_txlake(tmp_path_factory.mktemp("differential-txn")) as served:
        yield served


@pytest.fixture(scope="module")
def outcomes(apache_kafka, txlake_server) -> PairedOutcomes:
    """Each scenario's outcomes, ``(Apache Kafka's, txlake's)``."""
    return PairedOutcomes(apache_kafka.bootstrap, txlake_server.bootstrap, SCENARIOS)


def _without_documented(scenario: str, kafka: dict[str, Any], ours: dict[str, Any],
                        documented: dict[str, dict] | None = None) -> tuple[dict, dict]:
    """Both outcomes with the documented differences (``documented``, by default this module's
    :data:`DOCUMENTED`) taken out -- after checking that each is still exactly the documented
    pair of values (so a fixed one is noticed). A documented part maps each differing key of
    the part's dict to the pair (a key one side lacks counts as None), or is itself the pair
    when the part is no dict."""
    kafka, ours = dict(kafka), dict(ours)
    for part, keys in (DOCUMENTED if documented is None else documented).get(scenario, {}).items():
        if isinstance(keys, tuple):
            assert (kafka.pop(part), ours.pop(part)) == keys, f"{scenario}/{part}: the documented difference changed"
            continue
        kafka[part], ours[part] = dict(kafka[part]), dict(ours[part])
        for key, (kafka_value, our_value) in keys.items():
            assert (kafka[part].pop(key, None), ours[part].pop(key, None)) == (kafka_value, our_value), \
                f"{scenario}/{part}/{key}: the documented difference changed"
    return kafka, ours


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_txlake_answers_as_apache_kafka(scenario, outcomes):
    """Every part of the scenario's outcome is Apache Kafka's, but the documented differences."""
    kafka, ours = _without_documented(scenario, *outcomes[scenario])
    assert sorted(ours) == sorted(kafka)
    differing = {part: {"Apache Kafka": kafka[part], "txlake": ours[part]}
                 for part in kafka if ours[part] != kafka[part]}
    assert not differing, f"{scenario}: parts that differ: {differing}"


FENCED = ("error", ("_FENCED", True, False, False))


def test_the_reference_outcomes_are_the_expected_ones(outcomes):
    """The scenarios themselves are sound: Apache Kafka's outcomes are the ones Kafka's
    design gives (so two equally broken runs cannot pass the comparison)."""
    out, _ = outcomes["transactions"]
    # control records take offsets: t1's COMMIT at 2+1, t2's ABORT at 6, t4's COMMIT at 10, ...
    assert out["t1_deliveries"]["reports"] == [(None, 0, 0), (None, 0, 1), (None, 0, 2), (None, 1, 0), (None, 1, 1)]
    assert out["t2_deliveries"]["reports"] == [(None, 0, 4), (None, 0, 5)]
    assert out["t3_deliveries"]["reports"] == [(None, 0, 7), (None, 0, 8)]
    assert out["after_abort"]["lso"] == out["after_abort"]["high_watermarks"] == [(0, 7), (0, 3)]
    # t3 open from offset 7: the LSO of partition 0 stops there, the high watermark does not
    assert out["open"]["high_watermarks"] == [(0, 14), (0, 5)]
    assert out["open"]["lso"] == [(0, 7), (0, 5)]
    assert [r[2] for r in out["open"]["read_committed"]] == [b"c1-0", b"c1-1", b"c1-2", b"c1-p1-0", b"c1-p1-1"]
    assert [(r[0], r[1]) for r in out["open"]["read_uncommitted"]] == [
        (0, 0), (0, 1), (0, 2), (0, 4), (0, 5), (0, 7), (0, 8), (0, 9), (0, 11), (0, 12), (1, 0), (1, 1), (1, 3)]
    assert out["closed"]["lso"] == out["closed"]["high_watermarks"] == [(0, 15), (0, 5)]
    assert [(r[0], r[1]) for r in out["closed"]["read_committed"]] == [
        (0, 0), (0, 1), (0, 2), (0, 7), (0, 8), (0, 9), (0, 11), (1, 0), (1, 1)]
    assert out["describe_transactions"] == [
        ("t1", 0, "CompleteCommit", "set", 0, 60000, "set", []),
        ("t2", 0, "CompleteAbort", "set", 0, 60000, "set", []),
        ("t3", 0, "Ongoing", "set", 0, 60000, "set", [("txn", 0)]),
        ("t4", 0, "CompleteCommit", "set", 0, 60000, "set", []),
        ("never", 105, "", 0, 0, 0, 0, [])]   # TRANSACTIONAL_ID_NOT_FOUND, the other fields zero
    assert out["list_transactions"]["ongoing"] == (0, [], [("t3", "Ongoing")])
    assert out["list_transactions"]["complete"][1] == ["Bogus"]
    # DescribeProducers: t3's open transaction starts at 7 on partition 0
    assert [s for s in out["describe_producers"][0][2] if s[2] >= 0] == [(0, 1, 7)]
    assert out["describe_t3_closed"] == [("t3", 0, "CompleteCommit", "set", 0, 60000, "set", [])]

    out, _ = outcomes["fencing"]
    for case in ("send", "commit", "send_offsets"):
        got = out[case]
        # the new producer's InitProducerId aborted the old transaction and bumped the epoch twice
        # (the fence, then its own), and commits don't bump it (transaction version 1 for librdkafka)
        assert got["described"][0][2:5] == ("Empty", "set", 2)
        assert got["described_new"][0][2:5] == ("CompleteCommit", "set", 2)
        assert got["commit"] == got["abort"] == got["begin"] == FENCED
    assert out["send"]["send"] == {"raised": FENCED[1],
                                   "reports": [(("INVALID_PRODUCER_EPOCH", False, False, False), 0, -1001)]}
    assert out["send_offsets"]["send_offsets"] == FENCED
    assert [r[2] for r in out["records"]["read_committed"]] == [b"new-send", b"new-commit", b"new-send_offsets"]
    assert out["records"]["lso"] == out["records"]["high_watermarks"] == [(0, 12)]

    out, _ = outcomes["timeout"]
    assert out["described_open"] == [("slow", 0, "Ongoing", "set", 0, SHORT_TXN_TIMEOUT_MS, "set", [("slow", 0)])]
    assert out["described_aborted"] == ("slow", 0, "CompleteAbort", "set", 1, SHORT_TXN_TIMEOUT_MS, "set", [])
    assert out["aborted"] == {"high_watermarks": [(0, 2)], "lso": [(0, 2)], "read_committed": [],
                              "read_uncommitted": [(0, 0, b"late-1")]}
    assert out["send"]["raised"] == FENCED[1]
    assert out["commit"] == out["abort"] == out["begin_again"] == FENCED
    assert out["described_new"] == [("slow", 0, "Empty", "set", 2, 60000, -1, [])]
    assert out["records"]["read_committed"] == [(0, 2, b"on-time")]

    out, _ = outcomes["group"]
    assert out["positions"] == [(0, 3), (1, 3)]
    # pending offsets: librdkafka's committed() retries UNSTABLE_OFFSET_COMMIT until its timeout
    assert out["pending"]["committed"] == ("error", ("_TIMED_OUT", False, False, False))
    assert out["pending"]["offset_fetch_stable"] == (0, [(0, -1, 88), (1, -1, 88)])
    assert out["pending"]["offset_fetch"] == (0, [(0, -1, 0), (1, -1, 0)])
    assert out["pending"]["described"][0][7] == [("__consumer_offsets", "group's"), ("out", 0)]
    assert out["after_commit"] == {"committed": ("ok", [(0, 3), (1, 3)]),
                                   "offset_fetch_stable": (0, [(0, 3, 0), (1, 3, 0)])}
    assert out["after_abort"] == out["after_commit"]
    illegal_generation = ("error", ("ILLEGAL_GENERATION", False, False, True))
    assert out["stale_send_offsets"] == out["stale_commit"] == illegal_generation
    assert out["stale_abort"] == out["fresh_commit"] == ("ok", None)
    assert out["after_stale"]["committed"] == ("ok", [(0, 3), (1, 3)])
    assert out["after_fresh"]["committed"] == ("ok", {"worker's": 4, "joiner's": 3})
    assert [r[2] for r in out["out"]["read_committed"]] == [b"IN-0", b"IN-2", b"IN-4", b"IN-1", b"IN-3", b"IN-5",
                                                            b"FRESH"]

    out, _ = outcomes["recovery"]
    assert out["too_large"]["reports"] == [(("MSG_SIZE_TOO_LARGE", False, False, False), 0, -1001)]
    assert out["commit"] == ("error", ("MSG_SIZE_TOO_LARGE", False, False, True))
    assert out["described_after_abort"][0][4] == 0                 # no new epoch after that abort
    assert out["next_commit"] == ("error", ("OUT_OF_ORDER_SEQUENCE_NUMBER", False, False, True))
    assert out["described_after_bump"] == [("bump", 0, "Empty", "set", 1, 60000, -1, [])]   # KIP-360's bump
    assert out["bumped"]["reports"] == [(None, 0, 3), (None, 0, 4)]
    assert out["producers_after_commit"] == [(0, 0, [(1, 1, -1)])]   # epoch 1, sequences 0-1
    assert out["bump"]["read_committed"] == [(0, 3, b"small-4"), (0, 4, b"small-5")]
    assert out["delete_into_open"] == ("ok", 3)
    assert out["del_while_open"]["high_watermarks"] == [(3, 5)]
    assert out["del_while_open"]["read_uncommitted"] == [(0, 3, b"open-1"), (0, 4, b"open-2")]
    assert out["del_while_open"]["read_committed"] == []
    assert out["producers_while_open"] == [(0, 0, [(0, 1, -1), (0, 2, 2)])]
    assert out["delete_to_end"] == ("ok", 5)
    assert out["del_committed"] == {"high_watermarks": [(5, 8)], "lso": [(5, 8)],
                                    "read_committed": [(0, 6, b"after")], "read_uncommitted": [(0, 6, b"after")]}
