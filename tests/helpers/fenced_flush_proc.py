"""Replays, deterministically, what a zombie writer does when it learns it was fenced.

Run as a throw-away process (threads that deadlock here cannot be cleaned up): prints
one JSON line, ``{"event": "completed"}`` when a produce issued while the fenced flush
is in progress returns, or ``{"event": "deadlock", ...}`` when it is still blocked after
a second and a half, then ends with ``os._exit`` (an orderly exit would wait on the stuck
threads).

The interleaving: writer A (the registry engine of a Producer) has committed; writer B
force-takes the lease; A flushes X2 (refused: A becomes fatal) while X3 is queued; A's
flush of X3 is held at its data-object PUT (so the flusher holds the commit lock) while
the application produces X4 (holding the Producer's lock); then the PUT goes on.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid


def emit(event: str, **fields) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def main() -> None:
    from txlake import AdminClient, NewTopic, Producer
    from txlake.catalog.storage import ObjectStore
    from txlake.engine.broker import Broker, BrokerConfig
    from txlake.engine.registry import acquire_broker, release_broker

    url = f"memory://fenced-flush-{uuid.uuid4().hex}"
    conf = {"storage.url": url, "storage.lease.ms": 60_000}
    AdminClient(conf).create_topics([NewTopic("t", num_partitions=1)])["t"].result()
    producer = Producer({**conf, "batch.num.messages": 1, "linger.ms": 0})
    reports: list = []
    producer.produce("t", value=b"x1", on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(10) == 0 and reports == [None], reports

    a = acquire_broker(url)
    release_broker(a)  # the Producer still holds it
    gates: list[threading.Event] = []
    arrived: list[threading.Event] = []
    original_put = a.store.put

    def gated_put(key, data):
        if key.startswith("data/") and gates:
            gate, here = gates.pop(0), arrived.pop(0)
            here.set()
            gate.wait(30)
        return original_put(key, data)

    a.store.put = gated_put

    b = Broker(ObjectStore(url), BrokerConfig(lease_force=True))
    b.ensure_writer()  # A is now a zombie that does not know it yet

    gate1, at1, gate2, at2 = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    gates += [gate1, gate2]
    arrived += [at1, at2]
    producer.produce("t", value=b"x2", on_delivery=lambda err, msg: reports.append(err))
    assert at1.wait(10), "the flush of x2 never started"
    producer.produce("t", value=b"x3", on_delivery=lambda err, msg: reports.append(err))  # queued behind it
    time.sleep(0.1)
    gate1.set()  # x2's commit is refused: A turns fatal; then the flush of x3 starts
    # A writer that already knows it is fenced may skip x3's PUT altogether (nothing to
    # hold then); when it does PUT, the PUT is held here, outside any broker lock.
    at2.wait(2)

    done = threading.Event()

    def produce_x4() -> None:
        try:
            producer.produce("t", value=b"x4", on_delivery=lambda err, msg: reports.append(err))
        except Exception:  # noqa: BLE001 - raising is fine, hanging is not
            pass
        done.set()

    t = threading.Thread(target=produce_x4, daemon=True)
    t.start()
    time.sleep(0.3)  # x4's produce is now waiting for the engine
    gate2.set()
    if done.wait(1.5):
        emit("completed", reports=[None if e is None else e.code() for e in reports])
    else:
        emit("deadlock", reports=[None if e is None else e.code() for e in reports])
    os._exit(0)


if __name__ == "__main__":
    main()
