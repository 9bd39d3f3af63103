"""Hand-over of writes to the writer-lease holder (engine/handoff.py).

In-process: a HandoffServer (the holder's side) and submit() (another process's side)
over one storage root, with handlers registered for the test. The cross-process use --
a Spark worker's commit handed to the process holding the lease -- is tested with the
Spark writer (tests/test_spark_write.py).
"""

from __future__ import annotations

import threading
import time

import pytest

from txlake.catalog.storage import ObjectStore
from txlake.engine.handoff import (CLAIMS_PREFIX, HANDOFF_PREFIX, REQUESTS_PREFIX, HandoffCancelled, HandoffError,
                                   HandoffServer, register_handler, submit)

calls: list[dict] = []


def _echo(store: ObjectStore, payload: dict) -> dict:
    assert isinstance(store, ObjectStore)
    calls.append(payload)
    return {"doubled": payload["n"] * 2}


def _fail(store: ObjectStore, payload: dict) -> dict:
    raise ValueError(f"bad input {payload['n']}")


register_handler("test-echo", _echo)
register_handler("test-fail", _fail)


@pytest.fixture
def store(tmp_path):
    calls.clear()
    return ObjectStore(f"file://{tmp_path}")


@pytest.fixture
def server(store):
    srv = HandoffServer(store, poll_ms=20, may_run=lambda: True)
    srv.start()
    yield srv
    srv.stop()


def test_the_holder_runs_a_request_once_and_every_object_is_removed(store, server):
    assert submit(store, "test-echo", {"n": 21}, timeout_s=10) == {"doubled": 42}
    assert calls == [{"n": 21}]
    # only the claim is left: it keeps the request from ever running again
    assert [o.key.rpartition("/")[0] + "/" for o in store.list(HANDOFF_PREFIX)] == [CLAIMS_PREFIX]
    assert server.run_pending() == 0 and calls == [{"n": 21}]


def test_a_failing_handler_reaches_the_requester(store, server):
    with pytest.raises(HandoffError, match="ValueError: bad input 7"):
        submit(store, "test-fail", {"n": 7}, timeout_s=10)
    assert store.list(REQUESTS_PREFIX) == []


def test_a_kind_without_handler_is_an_error_naming_it(store, server):
    with pytest.raises(HandoffError, match="cannot run 'no-such-kind' requests"):
        submit(store, "no-such-kind", {}, timeout_s=10)


def test_without_a_holder_the_request_is_withdrawn_and_never_runs(store):
    started = time.monotonic()
    with pytest.raises(HandoffCancelled, match="within 0 s"):
        submit(store, "test-echo", {"n": 1}, timeout_s=0.3)
    assert time.monotonic() - started < 5
    assert store.list(REQUESTS_PREFIX) == []
    # a holder that starts later finds nothing to run
    assert HandoffServer(store, 20, lambda: True).run_pending() == 0
    assert calls == []


def test_give_up_withdraws_early(store):
    started = time.monotonic()
    with pytest.raises(HandoffCancelled):
        submit(store, "test-echo", {"n": 1}, timeout_s=60, give_up=lambda: True)
    assert time.monotonic() - started < 5


def test_a_withdrawn_request_left_behind_is_not_run(store):
    """A requester that died after cancelling (claim 'cancelled', request still there)."""
    store.put(f"{REQUESTS_PREFIX}0000000000001-x.json",
              b'{"id": "0000000000001-x", "kind": "test-echo", "payload": {"n": 5}}')
    store.put_if_absent(f"{CLAIMS_PREFIX}0000000000001-x", b"cancelled")
    assert HandoffServer(store, 20, lambda: True).run_pending() == 0
    assert calls == []


def test_a_holder_that_may_not_write_leaves_requests_alone(store):
    blocked = HandoffServer(store, 20, may_run=lambda: False)
    blocked.start()
    try:
        with pytest.raises(HandoffCancelled):
            submit(store, "test-echo", {"n": 3}, timeout_s=0.3)
    finally:
        blocked.stop()
    assert calls == []


def test_requests_from_several_threads_each_run_once(store, server):
    results: dict[int, dict] = {}

    def ask(n: int) -> None:
        results[n] = submit(store, "test-echo", {"n": n}, timeout_s=20)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {n: {"doubled": 2 * n} for n in range(6)}
    assert sorted(c["n"] for c in calls) == list(range(6))


def test_old_requests_are_dropped_unrun_and_old_claims_removed(store):
    from txlake.engine.handoff import CLAIM_RETENTION_MS

    store.put(f"{REQUESTS_PREFIX}0000000000001-old.json",
              b'{"id": "0000000000001-old", "kind": "test-echo", "payload": {"n": 9}, "created_ms": 1}')
    holder = HandoffServer(store, 20, lambda: True)
    assert holder.run_pending(now_ms=CLAIM_RETENTION_MS) == 0
    assert calls == [] and store.list(REQUESTS_PREFIX) == []
    assert len(store.list(CLAIMS_PREFIX)) == 1
    assert holder.run_pending(now_ms=int(time.time() * 1000) + CLAIM_RETENTION_MS + 60_000) == 0
    assert store.list(HANDOFF_PREFIX) == []


# ---------------------------------------------------------------- Kafka requests (engine/apis/handoff.py)
_KAFKA_HOLDER = """
import sys
from txlake import AdminClient, NewTopic
admin = AdminClient({"storage.url": sys.argv[1], "storage.handoff.poll.ms": 50})
admin.create_topics([NewTopic("t", 1)])["t"].result()   # takes the writer lease
print("ready", flush=True)
sys.stdin.read()   # hold the lease (and answer hand-overs) until the test closes stdin
"""


def test_a_kafka_request_handed_over_is_answered_by_the_holders_request_surface(tmp_path):
    """Any Kafka request, not only a kind written for it: the holder's KafkaApis answers a
    CreatePartitions and a request with a bad body exactly as it would answer the wire."""
    import base64
    import subprocess
    import sys

    from kafka.protocol.admin import CreatePartitionsRequest

    from txlake.catalog.catalog import Catalog
    from txlake.engine.apis.handoff import KAFKA_REQUEST, hand_over

    url = f"file://{tmp_path}/root"
    holder = subprocess.Popen([sys.executable, "-c", _KAFKA_HOLDER, url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        store = ObjectStore(url)
        topic = CreatePartitionsRequest.CreatePartitionsTopic
        request = CreatePartitionsRequest[3](topics=[topic(name="t", count=3, assignments=None),
                                                     topic(name="nope", count=2, assignments=None)],
                                             timeout_ms=10_000, validate_only=False)
        answer = hand_over(store, request, timeout_s=30)
        assert [(r.name, r.error_code) for r in answer.results] == [("t", 0), ("nope", 3)]  # UNKNOWN_TOPIC_OR_PARTITION
        assert len(Catalog.open(store).state.topics["t"].partitions) == 3
        with pytest.raises(HandoffError, match="unknown API key 999"):
            submit(store, KAFKA_REQUEST, {"api_key": 999, "api_version": 0,
                                          "request": base64.b64encode(b"").decode()}, timeout_s=30)
    finally:
        holder.stdin.close()
        holder.wait(30)
