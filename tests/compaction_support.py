"""Shared helpers of the compaction tests (test_segment_merge, test_compaction_runner,
test_compaction_crash, test_compact_cli): a varied log made of many flushes, and exact
snapshots of every committed record (all columns) and of the catalog's segment layout,
read like an outside reader (a fresh catalog view and the objects it names)."""

from __future__ import annotations

import time

import pyarrow as pa

from helpers import client_conf

#: engine settings of the tests: no background compaction unless a test asks for it
QUIET = {"storage.lease.ms": 60_000, "storage.compaction.interval.ms": 0, "transaction.state.log.num.partitions": 1}


def fresh_catalog(storage):
    """A pure-reader view of the root's catalog."""
    from txlake.catalog.catalog import Catalog

    return Catalog.open(storage.object_store())


def committed_tables(storage, topic: str, catalog=None) -> dict[int, pa.Table]:
    """Every record of every partition of ``topic`` from its log start to its high watermark,
    all RECORD_SCHEMA columns (control and aborted records included), from a fresh reader."""
    from txlake.engine.log_reader import LogReader, SegmentCache

    catalog = catalog or fresh_catalog(storage)
    reader = LogReader(catalog, SegmentCache(0))
    out = {}
    for p in catalog.state.topics[topic].partitions:
        table = reader.read(topic, p.partition, p.log_start_offset, p.high_watermark)
        out[p.partition] = table.combine_chunks()
    return out


def partition_offsets(catalog, topic: str) -> dict[int, tuple[int, int, int, list]]:
    """``(log start, high watermark, LSO, aborted index)`` per partition."""
    return {p.partition: (p.log_start_offset, p.high_watermark, p.last_stable_offset, list(p.aborted_transactions))
            for p in catalog.state.topics[topic].partitions}


def data_objects(storage) -> set[str]:
    """Keys of every object under ``data/``."""
    return {o.key for o in storage.object_store().list("data/")}


def referenced(catalog, topic: str | None = None) -> set[str]:
    """Objects the catalog's segments name (those of ``topic`` only, when given)."""
    return {s.path for t in catalog.state.topics.values() if topic in (None, t.name)
            for p in t.partitions for s in p.segments}


def produce_varied_log(storage, topic: str, partitions: int = 3, flushes: int = 4, per_flush: int = 12,
                       extra_conf: dict | None = None, topic_config: dict | None = None,
                       transactions: bool = True) -> dict:
    """Create ``topic`` and fill it with ``flushes`` flushes (one data object each) of records with
    keys and null keys, values and tombstones, headers, explicit timestamps, from an idempotent
    producer; plus (``transactions``) one committed and one aborted transaction (control records,
    an aborted-transaction index entry). Returns the client config used."""
    from txlake import AdminClient, NewTopic, Producer

    conf = client_conf(storage, {**QUIET, **(extra_conf or {})})
    admin = AdminClient(conf)  # open throughout: the clients below share its engine
    admin.create_topics([NewTopic(topic, num_partitions=partitions, config=topic_config or {})])[topic].result()
    producer = Producer({**conf, "enable.idempotence": True})
    base_ts = int(time.time() * 1000) - 60_000  # recent: retention.ms (7 days) keeps them
    compacted = "compact" in (topic_config or {}).get("cleanup.policy", "")
    n = 0
    for f in range(flushes):
        for i in range(per_flush):
            # a compacted topic refuses records without a key (INVALID_RECORD, as Kafka)
            key = (f"u{n}".encode() if compacted else None) if i % 5 == 0 else f"k{i % 7}".encode()
            value = None if i % 11 == 3 else f"value-{f}-{i}".encode() * (1 + i % 3)
            headers = [("h", f"{f}.{i}".encode()), ("empty", None)] if i % 4 == 0 else None
            producer.produce(topic, value=value, key=key, partition=n % partitions, headers=headers,
                             timestamp=base_ts + n * 7)
            n += 1
        assert producer.flush(30) == 0
    producer.close()
    if transactions:
        txn = Producer({**conf, "transactional.id": f"{topic}-txn"})
        txn.init_transactions(30)
        for commit in (True, False):
            txn.begin_transaction()
            for p in range(partitions):
                txn.produce(topic, value=f"txn-{commit}-{p}".encode(), key=b"t", partition=p)
            if commit:
                txn.commit_transaction(30)
            else:
                txn.abort_transaction(30)
        txn.close()
    admin.close()
    return conf


def writer_broker(storage, extra: dict | None = None):
    """The in-process engine of ``storage`` (shared by the clients of this process)."""
    from txlake.config import parse_config
    from txlake.engine.registry import acquire_broker

    cfg = parse_config(client_conf(storage, {**QUIET, **(extra or {})}), "admin")
    return acquire_broker(cfg.storage_url, cfg.storage_options, cfg.broker_config())
