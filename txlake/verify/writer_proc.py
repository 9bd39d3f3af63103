"""A transactional writer of a verification trial in a process of its own, so the trial can
SIGKILL it mid-transaction and start it again (:func:`txlake.verify.workload.run_trial`
with ``kill_writer``).

``python -m txlake.verify.writer_proc CONF_JSON TOPIC NAME SEED SPEC_JSON SINK``

Appends its history to the JSON-lines file ``SINK`` as it goes (each send attempt before
the send, each commit/abort invocation before the call). Started again on the same
``SINK``, it continues the seeded sequence after the last transaction the killed instance
began, and records the transactions that instance left open without invoking their
commit or abort as aborted once its ``init_transactions`` returned (Kafka aborts them
when a new instance of the transactional id initialises: KIP-98).
"""

from __future__ import annotations

import json
import os
import random
import sys

from .history import History, Send, Txn
from .workload import WorkloadSpec, _transactional


def resume_point(events: list) -> tuple[int, tuple[str, ...]]:
    """``(next transaction index, transactions begun but never ended nor invoked)`` of the
    history a killed instance left (transaction ids are ``<name>-T<index>``)."""
    begun = {e.txn for e in events if isinstance(e, Send) and e.txn is not None}
    ended = {e.txn for e in events if isinstance(e, Txn)}
    indices = [int(t.rsplit("-T", 1)[1]) for t in begun | ended]
    return (max(indices) + 1 if indices else 0), tuple(sorted(begun - ended))


def main(argv: list[str]) -> int:
    conf_json, topic, name, seed, spec_json, sink_path = argv
    events: list = []
    if os.path.exists(sink_path):
        with open(sink_path) as fp:
            events = History.load(fp).events
    start, unfinished = resume_point(events)
    with open(sink_path, "a") as sink:
        _transactional(json.loads(conf_json), History(sink=sink), topic, name, WorkloadSpec(**json.loads(spec_json)),
                       random.Random(f"{seed}-{name}"), start=start, attempts=True, unfinished=unfinished)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child process
    sys.exit(main(sys.argv[1:]))
