"""The exactly-once copier (``python -m txlake.copier``) as a test subprocess.

Run as a script, ``python copier_proc.py '{"argv": ["-", ...]}'`` runs ``txlake.copier`` exactly as
``python -m txlake.copier - <argv...>`` does (runpy), after registering faulthandler on
SIGUSR1 so a hung copier can be asked for its stacks; the client config is the first line of
its stdin, read by the copier (:mod:`txlake.child_conf`), never on the command line.

Imported, :class:`CopierProcess` drives such a process with :class:`helpers.WriterProcess`'s
machinery (event lines read by a thread, ``wait_event``, ``kill``, ``describe``): the
copier runs with ``--json-events``, so its lines ``committed <txn> <records>`` ... arrive as
events ``{"event": "committed", "txn": ..., "records": ...}``. The :func:`copier_procs`
fixture starts them and SIGKILLs any still alive at teardown.
"""

from __future__ import annotations

import json
import sys

if __name__ == "__main__":
    import faulthandler
    import runpy
    import signal

    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints every thread's stack to stderr
    spec = json.loads(sys.argv[1])
    module = spec.get("module", "txlake.copier")
    sys.argv = [module, *spec["argv"]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)  # exits with the copier's code
    sys.exit(0)


import pytest  # noqa: E402

from helpers import WriterProcess  # noqa: E402


class CopierProcess(WriterProcess):
    """One ``txlake.copier`` process on a storage root.

    Args:
        storage: the ``storage`` fixture's target.
        source / target / group / transactional_id: the copier's positional arguments.
        options: its other command-line options, e.g. ``["--batch-records", "5000", "--abort-every", "3"]``.
        conf: extra client config (e.g. ``{"storage.lease.force": True}``).
    """

    script = __file__
    dumps_stacks_on_sigusr1 = True

    def __init__(self, storage, source: str, target: str, group: str, transactional_id: str,
                 options: list[str] | None = None, conf: dict | None = None):
        self.copier_args = [source, target, group, transactional_id, *(options or []), "--json-events"]
        super().__init__(storage, conf)

    module = "txlake.copier"

    def spec(self, storage, conf: dict | None, producer_conf: dict | None) -> dict:
        """The copier's client config (sent on its stdin)."""
        return WriterProcess.spec(self, storage, conf, producer_conf)["conf"]

    def command(self, spec: dict) -> tuple[list[str], dict]:
        from txlake.child_conf import FROM_STDIN

        argv = {"module": self.module, "argv": [FROM_STDIN, *self.copier_args]}  # no config in it
        return [sys.executable, self.script, json.dumps(argv)], spec


class GroupCopierProcess(CopierProcess):
    """One ``txlake.group_copier`` process (a consumer group of worker threads; JSON events).

    Args:
        options: e.g. ``["--workers", "3", "--join-later", "1", ...]``.
    """

    def __init__(self, storage, source: str, target: str, group: str, options: list[str] | None = None,
                 conf: dict | None = None):
        self.copier_args = [source, target, group, *(options or [])]
        WriterProcess.__init__(self, storage, conf)

    module = "txlake.group_copier"


@pytest.fixture
def copier_procs():
    """Factory ``copier_procs(storage, source, target, group, transactional_id, options=None, conf=None)
    -> CopierProcess`` (started at once). Teardown SIGKILLs every one still alive and closes the
    engines the test opened in-process."""
    started: list[CopierProcess] = []

    def start(storage, *args, **kwargs) -> CopierProcess:
        proc = CopierProcess(storage, *args, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.cleanup()
    from txlake.engine.registry import close_all

    close_all()
