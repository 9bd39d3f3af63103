"""``txlake serve`` as a child process of another txlake command (the demo's steps 6-8,
``txlake verify --serve``): started with its root in its environment, its address read from its
``listening on`` line, stopped with SIGTERM or killed with SIGKILL, its log kept.

Depends on txlake.child_conf only; the server itself is txlake/server/serve.py."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from typing import IO, Any

__all__ = ["SERVE_START_TIMEOUT_S", "SERVE_STOP_TIMEOUT_S", "ServeProcess", "ServeProcessError"]

#: seconds to wait for ``txlake serve`` to announce its address, and to end after SIGTERM
SERVE_START_TIMEOUT_S = 60.0
SERVE_STOP_TIMEOUT_S = 60.0


class ServeProcessError(RuntimeError):
    """``txlake serve`` did not say it was listening in time, or did not end after SIGTERM (it
    was then killed); the message names its pid and what happened."""


class ServeProcess:
    """``txlake serve`` on a storage root as a child process, for the demo and ``txlake verify``:
    ``python -P -m txlake.cli serve`` in a neutral working directory ``run_dir`` (a ``txlake``
    folder where the user runs the command cannot shadow the package), the root and its storage options in its environment
    (``TXLAKE_STORAGE``, ``TXLAKE_STORAGE_OPTIONS``: never on its command line, which every
    local user can read), its stderr (the server's log) kept in a private temporary file and
    appended to the log file ``log`` when it is closed."""

    name = "txlake serve"

    def __init__(self, url: str, options: dict, run_dir: str, log: IO[str], *, listen: str = "127.0.0.1:0",
                 settings: dict[str, Any] | None = None, force_lease: bool = False):
        """Start it and wait for its ``listening on`` line.

        Args:
            listen: ``HOST:PORT`` (port 0: any free one); a restart passes the address it had.
            settings: engine settings, as ``--config KEY=VALUE``.
            force_lease: ``--force-lease``: take the writer lease at once (a restart after the
                demo SIGKILLed the previous server, which can no longer release it).

        Raises:
            WorkerProcessError: it ended before it listened; ServeProcessError: it did not say it listened.
        """
        import subprocess

        from .child_conf import module_command

        self._log = log
        self._stdout_ended = False
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        env = {**os.environ, "TXLAKE_STORAGE": url, "TXLAKE_STORAGE_OPTIONS": json.dumps(options),
               "PYTHONUNBUFFERED": "1"}
        t = time.perf_counter()
        try:
            args = module_command("txlake.cli", "serve", "--listen", listen,
                                  *[arg for key, value in (settings or {}).items() for arg in ("--config", f"{key}={value}")],
                                  *(["--force-lease"] if force_lease else []))
            self.proc = subprocess.Popen(args,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr,
                                         cwd=run_dir, env=env)
        except BaseException:
            self._stderr.close()
            raise
        self.pid = self.proc.pid
        line = self._first_line(SERVE_START_TIMEOUT_S)
        prefix = "txlake serve: listening on "
        if not line.startswith(prefix):
            if self._stdout_ended and self.proc.poll() is None:
                try:                         # its stdout closed: it is exiting; let it end, for its exit code
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            if self.proc.poll() is None:    # still running: silent for too long, or saying something else
                self.kill()
                self.close()
                what = (f"its first line was {line!r}" if line else "its stdout ended" if self._stdout_ended
                        else f"it said nothing within {SERVE_START_TIMEOUT_S:.0f} s")
                raise ServeProcessError(f"txlake serve (pid {self.pid}) did not say it was listening ({what}); it was "
                                    "killed (its log is in the log file)")
            self._fail(f"before it listened (its first line: {line!r})" if line else "before it listened")
        self.start_seconds = time.perf_counter() - t
        self.address = line[len(prefix):]

    def _first_line(self, timeout_s: float) -> str:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        data = b""
        try:
            while not data.endswith(b"\n") and time.monotonic() < deadline:
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    break
                chunk = os.read(self.proc.stdout.fileno(), 1)
                if not chunk:
                    self._stdout_ended = True
                    break
                data += chunk
        finally:
            sel.close()
        return data.decode(errors="replace").strip()

    def _fail(self, when: str) -> None:
        from .child_conf import WorkerProcessError

        code = self.proc.wait()
        self._stderr.flush()
        self._stderr.seek(0)
        tail = "\n".join(self._stderr.read().decode("utf-8", errors="replace").splitlines()[-20:])
        self.close()   # its stderr goes to the log file too
        raise WorkerProcessError(self.name, self.pid, code, tail, when)

    def stop(self) -> int:
        """SIGTERM, and its exit status (Kafka's controlled shutdown: 0 when clean).

        Raises:
            ServeProcessError: it did not end within :data:`SERVE_STOP_TIMEOUT_S` (it is then killed).
        """
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=SERVE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ServeProcessError(f"txlake serve (pid {self.pid}) did not end within {SERVE_STOP_TIMEOUT_S:.0f} s "
                                "of SIGTERM; it was killed") from None

    def kill(self) -> None:
        """SIGKILL it (if it still runs) and reap it: a crash, as the demo's proofs need."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Stop it if it still runs (SIGTERM, else SIGKILL), append its stderr to the log file."""
        if self.proc.poll() is None:
            try:
                self.stop()
            except ServeProcessError:
                pass
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if not self._stderr.closed:
            from .child_conf import append_stderr

            append_stderr(self._log, self.name, self.pid, self.proc.returncode, self._stderr)
            self._stderr.close()
