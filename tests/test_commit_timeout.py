"""Transactional calls keep their timeout through a storage outage, and a timed-out call can be
retried (issue 14, defect 9; Kafka's ``TransactionManager`` keeps the pending result of a
timed-out ``initTransactions`` / ``commitTransaction``, which the retried call awaits).

The outage is real: the S3 server process (its own SeaweedFS, not the session's) is stopped
with SIGSTOP, so every request to it hangs, and resumed with SIGCONT.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from contextlib import contextmanager

import pytest

from s3_server import SeaweedS3Server
from txlake import AdminClient, Consumer, KafkaError, KafkaException, NewTopic, Producer, TopicPartition
from txlake.engine import registry

pytestmark = pytest.mark.s3

#: how long past its timeout a call may return (thread scheduling on a loaded 2-core machine)
SLACK_S = 10


@pytest.fixture(scope="module")
def server():
    """A SeaweedFS server of this module only: the tests freeze it."""
    with SeaweedS3Server() as s3:
        yield s3


@pytest.fixture
def conf(server):
    c = {"storage.url": f"s3://{server.bucket}/{uuid.uuid4().hex}", "storage.options": server.storage_options(),
         "storage.flush.linger.ms": 1}
    yield c
    registry.close_all()


@contextmanager
def outage(server, longest_s: float = 30):
    """Every S3 request hangs until the block ends (the server process is stopped, not killed),
    or at most ``longest_s``: a call that ignores its timeout then returns late instead of
    hanging the test."""
    resume = threading.Timer(longest_s, os.kill, (server._proc.pid, signal.SIGCONT))
    os.kill(server._proc.pid, signal.SIGSTOP)
    resume.start()
    try:
        yield
    finally:
        resume.cancel()
        os.kill(server._proc.pid, signal.SIGCONT)


def committed_values(conf, topic):
    c = Consumer({**conf, "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, 0)])
    values = [m.value() for m in c.consume(100, 5)]
    c.close()
    return values


def assert_timed_out(info, started, timeout):
    elapsed = time.monotonic() - started
    err = info.value.args[0]
    assert type(info.value) is KafkaException
    assert (err.code(), err.retriable(), err.fatal(), err.txn_requires_abort()) == (
        KafkaError._TIMED_OUT, True, False, False)
    assert timeout - 0.1 <= elapsed < timeout + SLACK_S, elapsed
    return err


def test_commit_transaction_times_out_during_an_outage_and_a_retry_completes_the_commit(server, conf):
    AdminClient(conf).create_topics([NewTopic("t", 1)])["t"].result()
    p = Producer({**conf, "transactional.id": "tx"})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(10):
        p.produce("t", b"v%d" % i)
    assert p.flush(30) == 0
    with outage(server):
        started = time.monotonic()
        with pytest.raises(KafkaException) as info:
            p.commit_transaction(timeout=5)
        err = assert_timed_out(info, started, 5)
        assert err.str() == ("EndTxn COMMIT of transactional id 'tx' timed out: the coordinator has not answered "
                             "yet (storage slow or unavailable?); call again to wait for its answer")
    p.commit_transaction(timeout=30)          # waits for the EndTxn under way: not sent twice
    assert committed_values(conf, "t") == [b"v%d" % i for i in range(10)]
    p.begin_transaction()                     # the producer goes on
    p.produce("t", b"next")
    p.commit_transaction(timeout=30)
    assert committed_values(conf, "t") == [b"v%d" % i for i in range(10)] + [b"next"]
    p.close(10)


def test_init_transactions_times_out_during_an_outage_and_a_retry_completes_it(server, conf):
    p = Producer({**conf, "transactional.id": "tx-init"})
    with outage(server):
        started = time.monotonic()
        with pytest.raises(KafkaException) as info:
            p.init_transactions(timeout=3)
        assert_timed_out(info, started, 3)
    p.init_transactions(timeout=30)
    AdminClient(conf).create_topics([NewTopic("t", 1)])["t"].result()
    p.begin_transaction()
    p.produce("t", b"x")
    p.commit_transaction(timeout=30)
    assert committed_values(conf, "t") == [b"x"]
    p.close(10)
