"""A consume-transform-produce member of a verification trial in a process of its own, so
the trial's schedule can SIGKILL it inside a transaction (:mod:`.ctp`, through a server).

``python -m txlake.verify.ctp_proc CONF_JSON ARGS_JSON SINK STOP_FILE``

``ARGS_JSON``: ``{"topic_in", "topic_out", "group", "process", "plan": MemberPlan fields,
"unfinished": [transaction, ...]}``. Appends its history to the JSON-lines file ``SINK`` as
it goes (each send attempt before the send, each commit/abort invocation before the call),
runs until ``STOP_FILE`` exists or its plan says it leaves, and prints ``stopped`` or
``left``; at its plan's ``kill_at`` transaction it SIGKILLs itself after
``send_offsets_to_transaction`` (the transaction open, its offsets pending).
"""

from __future__ import annotations

import json
import os
import sys

from .ctp import MemberPlan, member_loop
from .history import History


def main(argv: list[str]) -> int:
    conf_json, args_json, sink_path, stop_file = argv
    args = json.loads(args_json)
    with open(sink_path, "a") as sink:
        result = member_loop(json.loads(conf_json), History(sink=sink), args["topic_in"], args["topic_out"],
                             args["group"], args["process"], MemberPlan(**args["plan"]),
                             lambda: os.path.exists(stop_file), tuple(args["unfinished"]), self_kill=True)
    print(result, flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child process
    sys.exit(main(sys.argv[1:]))
