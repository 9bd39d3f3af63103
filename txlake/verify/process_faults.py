"""Process faults of a ``txlake verify`` campaign (``--process-faults``, docs/reliability.md).

Each trial of a campaign with process faults gets one, in turn (trial ``i`` the ``i``-th of the
enabled kinds, cycling), injected by a thread of its own a seeded 0.3-1.5 s after the trial
starts, while the producers and consumers run:

``server-kill``
    SIGKILL ``txlake serve`` and start it again on the same address, taking the writer lease
    over at once (``--force-lease``: the killed process cannot release it). Kafka's broker crash.
``server-stop``
    SIGSTOP ``txlake serve`` for :data:`PAUSE_S` seconds, longer than the clients' request
    timeout (the campaign sets ``socket.timeout.ms`` to :data:`CLIENT_TIMEOUT_MS`), then SIGCONT:
    a GC pause or a frozen VM; the clients time their requests out and retry.
``compaction-kill``
    Stop ``txlake serve`` (SIGTERM), run ``txlake compact`` on the root (a process of its own:
    it takes the writer lease, which a running server holds) and SIGKILL it a seeded 0-300 ms
    after its first catalog commit (its lease) appears -- inside its round --, then start the
    server again (``--force-lease``). Counted only when the kill landed before it exited.
``store-restart``
    Restart the object store under load: a callable the caller passes (the tests' SeaweedFS
    server, :meth:`tests.s3_server.SeaweedS3Server.restart`) or, from the CLI,
    ``--store-restart-cmd`` run through the shell. Also without ``--serve``.

The first three need ``--serve`` (they act on the server process).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from typing import IO, Callable

__all__ = ["CLIENT_TIMEOUT_MS", "PAUSE_S", "PROCESS_FAULTS", "ProcessFaults", "RestartableServe", "parse_process_faults"]

#: the process fault kinds, in the order trials take them
PROCESS_FAULTS = ("server-kill", "server-stop", "compaction-kill", "store-restart")
#: ``socket.timeout.ms`` of the clients of a campaign with process faults (librdkafka's request timeout)
CLIENT_TIMEOUT_MS = 2000
#: how long ``server-stop`` keeps the server stopped (s): longer than :data:`CLIENT_TIMEOUT_MS`
PAUSE_S = 3.0
_SERVER_KINDS = ("server-kill", "server-stop", "compaction-kill")


def parse_process_faults(text: str | None) -> tuple[str, ...]:
    """``"server-kill,server-stop"`` -> ``("server-kill", "server-stop")`` (order kept, no repeats).

    Raises:
        ValueError: an unknown kind (the message names it and the known ones).
    """
    kinds: list[str] = []
    for kind in (k.strip() for k in (text or "").split(",")):
        if not kind:
            continue
        if kind not in PROCESS_FAULTS:
            raise ValueError(f"unknown process fault {kind!r}: the kinds are {', '.join(PROCESS_FAULTS)}")
        if kind not in kinds:
            kinds.append(kind)
    return tuple(kinds)


class ProcessFaults:
    """Injects one process fault per trial and counts them.

    Args:
        kinds: the enabled kinds (:data:`PROCESS_FAULTS`).
        conf: the root's client config (``storage.url``, ``storage.options``).
        server: a holder of the running :class:`~txlake.serve_process.ServeProcess` with
            ``restart(force_lease)`` and ``stop_server()``, or None without ``--serve``.
        store_restart: restarts the object store (``store-restart``), or None.

    Attributes:
        injected: a Counter of the faults injected, by kind.

    Raises:
        ValueError: a server kind without a server, ``store-restart`` without ``store_restart``.
    """

    def __init__(self, kinds: tuple[str, ...], conf: dict, server=None,
                 store_restart: Callable[[], None] | None = None, run_dir: str | None = None, log: IO[str] | None = None):
        if server is None and any(k in _SERVER_KINDS for k in kinds):
            raise ValueError(f"process faults {', '.join(k for k in kinds if k in _SERVER_KINDS)} need --serve "
                             "(they act on the txlake serve process)")
        if "store-restart" in kinds and store_restart is None:
            raise ValueError("process fault store-restart needs a way to restart the object store "
                             "(--store-restart-cmd, or run_campaign(store_restart=...))")
        self.kinds, self.conf, self.server, self.store_restart = kinds, conf, server, store_restart
        self.run_dir, self.log = run_dir, log
        self.injected: Counter = Counter()
        self.errors: list[BaseException] = []

    def during(self, index: int, seed: int):
        """A context manager for trial ``index`` (seed ``seed``): injects its fault while the
        trial runs and, on exit, waits until the fault is over (the server back, the store up).

        Raises (on exit):
            RuntimeError: the fault could not be injected or undone (e.g. the server did not restart).
        """
        kind = self.kinds[index % len(self.kinds)]
        delay = random.Random(f"{seed}-process").uniform(0.3, 1.5)
        faults = self

        class _During:
            def __enter__(self):
                self.thread = threading.Thread(target=faults._run, args=(kind, delay, seed),
                                               name=f"txlake-verify-{kind}", daemon=True)
                self.thread.start()
                return self

            def __exit__(self, *exc):
                self.thread.join()
                if faults.errors:
                    error = faults.errors.pop()
                    raise RuntimeError(f"process fault {kind} failed: {error}") from error
                return False

        return _During()

    def _run(self, kind: str, delay: float, seed: int) -> None:
        try:
            time.sleep(delay)
            if kind == "server-kill":
                self.server.restart(kill=True)
                self.injected[kind] += 1
            elif kind == "server-stop":
                pid = self.server.proc.pid
                os.kill(pid, signal.SIGSTOP)
                try:
                    time.sleep(PAUSE_S)
                finally:
                    os.kill(pid, signal.SIGCONT)
                self.injected[kind] += 1
            elif kind == "compaction-kill":
                if self._kill_compaction(random.Random(f"{seed}-compaction").uniform(0.0, 0.3)):
                    self.injected[kind] += 1
            elif kind == "store-restart":
                self.store_restart()
                self.injected[kind] += 1
        except BaseException as exc:  # noqa: BLE001 - re-raised by during()'s exit
            self.errors.append(exc)

    def _kill_compaction(self, after_s: float) -> bool:
        """Stop the server, run ``txlake compact``, SIGKILL it ``after_s`` after its first catalog
        commit, start the server again. True if the kill landed before it exited."""
        from txlake.catalog.catalog import COMMITS_PREFIX
        from txlake.catalog.faults import split_fault_options
        from txlake.catalog.storage import ObjectStore
        from txlake.child_conf import module_command

        url, options = self.conf["storage.url"], self.conf.get("storage.options") or {}
        self.server.stop_server()
        store = ObjectStore(url, split_fault_options(options)[0])
        last = store.list(COMMITS_PREFIX)[-1].key
        env = {**os.environ, "TXLAKE_STORAGE": url, "TXLAKE_STORAGE_OPTIONS": json.dumps(options)}
        proc = subprocess.Popen(module_command("txlake.cli", "compact"), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.run_dir, env=env)
        killed = False
        try:
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                if store.first_key_after(COMMITS_PREFIX, last) is not None:  # it took the lease: its round runs
                    time.sleep(after_s)
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGKILL)
                        killed = True
                    break
                time.sleep(0.01)
            _, err = proc.communicate(timeout=120)
            if not killed and proc.returncode != 0:
                raise RuntimeError(f"txlake compact exited {proc.returncode}: {err.decode()[-2000:]}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            self.server.restart(kill=False)
        return killed


class RestartableServe:
    """``txlake serve`` on a root (a :class:`~txlake.serve_process.ServeProcess`) that a process
    fault can stop, kill and start again on the same address, so the clients reconnect to it.

    Args:
        settings: engine settings of every start (``--config KEY=VALUE``), or None.

    Attributes:
        proc: the current ServeProcess; address: ``HOST:PORT`` it listens on (kept across restarts).

    Raises:
        as :class:`~txlake.serve_process.ServeProcess` (start-up failures).
    """

    def __init__(self, url: str, options: dict, run_dir: str, log: IO[str], settings: dict | None = None):
        from txlake.serve_process import ServeProcess

        self._start = lambda **kw: ServeProcess(url, options, run_dir, log, settings=settings, **kw)
        self.proc = self._start()
        self.address = self.proc.address

    def restart(self, kill: bool) -> None:
        """SIGKILL it first when ``kill`` (else it is already stopped), then start it again on
        its address, taking the writer lease over at once (``--force-lease``)."""
        if kill:
            self.proc.kill()
        self.proc.close()
        self.proc = self._start(listen=self.address, force_lease=True)

    def stop_server(self) -> None:
        """SIGTERM it (a clean stop that releases the lease).

        Raises:
            RuntimeError: it exited with another status than 0.
        """
        code = self.proc.stop()
        if code != 0:
            raise RuntimeError(f"txlake serve exited {code} on SIGTERM")

    def stop(self) -> int:
        """SIGTERM the current server; its exit status (the campaign requires 0)."""
        return self.proc.stop()

    def close(self) -> None:
        """As :meth:`~txlake.serve_process.ServeProcess.close` of the current server."""
        self.proc.close()
