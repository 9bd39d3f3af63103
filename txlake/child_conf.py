"""Handing a client config to a child process without putting it on its command line.

A process's command line is readable by every local user (``ps``, ``/proc/<pid>/cmdline``),
so a config holding credentials (``storage.options`` key/secret, passwords) must not
travel there. The parent writes the config as one JSON line to the child's stdin, an
inherited pipe only the two processes hold; the child's command line carries
:data:`FROM_STDIN` (``-``) where the config goes, and the child reads that one line with
:func:`load_conf` before anything else. Used by ``txlake demo`` for
``python -m txlake.copier`` / ``python -m txlake.group_copier`` and by the test helpers.

A child that is also driven through its stdin (the test helpers' command loop) keeps
reading it after the config line (``keep_stdin=True``); any other child gets EOF after it.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
import warnings
from typing import IO, Any, Mapping

from txlake.catalog.redaction import redact_config
from txlake.formats.errors import TxlakeError

__all__ = ["FROM_STDIN", "append_stderr", "WorkerProcessError", "ConfChild", "load_conf", "module_command", "start_with_conf"]

#: The command-line argument that means "the config is the first line of stdin".
FROM_STDIN = "-"


def module_command(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args...`` with this interpreter, such that
    the child's working directory cannot shadow an installed package.

    ``python -m`` puts the working directory first on ``sys.path``: run from a directory that
    holds a folder named ``txlake`` (the folder a checkout was cloned into, say), the child
    would import that folder instead of the installed txlake. ``-P`` (Python 3.11+,
    ``PYTHONSAFEPATH``) leaves it off; give the child a neutral ``cwd`` as well, so a relative
    ``PYTHONPATH`` entry cannot point into the user's directory either.
    """
    return [sys.executable, "-P", "-m", module, *args]


def start_with_conf(args: list[str], conf: Mapping[str, Any], *, keep_stdin: bool = False,
                    **popen_kwargs: Any) -> subprocess.Popen:
    """Start ``args`` and send ``conf`` as one JSON line on its stdin.

    Args:
        args: the command line, telling the child to read its config from stdin, e.g.
            ``[sys.executable, "-m", "txlake.copier", "-", ...]`` (:data:`FROM_STDIN`).
        conf: the client config (JSON-serialisable).
        keep_stdin: leave the pipe open after the config (``proc.stdin`` stays usable);
            by default it is closed (``proc.stdin`` is None), so the child reads EOF after
            the config line.
        popen_kwargs: passed to :class:`subprocess.Popen` (``stdin`` is always a pipe).

    Raises:
        OSError: the child could not be started. (A child that dies before reading its
            config is no error here: its exit code tells.)
    """
    line = json.dumps(dict(conf)) + "\n"
    popen_kwargs["stdin"] = subprocess.PIPE
    proc = subprocess.Popen(args, **popen_kwargs)
    stdin = proc.stdin
    try:
        stdin.write(line if isinstance(stdin, io.TextIOBase) else line.encode())
        stdin.flush()
    except BrokenPipeError:
        pass  # the child ended before reading its config: its exit code says why
    finally:
        if not keep_stdin:
            try:
                stdin.close()
            except BrokenPipeError:
                pass
            proc.stdin = None  # as if started without a stdin pipe: communicate() and wait() work
    return proc


def load_conf(arg: str, stream: IO[str] | None = None) -> dict[str, Any]:
    """The client config a child process was given: ``arg`` is :data:`FROM_STDIN` (read one
    JSON line from ``stream``, default ``sys.stdin``) or the config itself as JSON text.

    JSON text on the command line is accepted for hand-run workers without credentials;
    when it holds secrets a :class:`UserWarning` says so (every local user can read it).

    Raises:
        ValueError: the config is not a JSON object (the message never shows its text),
            or stdin ended before a config line.
    """
    if arg == FROM_STDIN:
        text = (stream or sys.stdin).readline()
        if not text:
            raise ValueError("expected the client config as one JSON line on stdin, got end of input")
        where = "the config line on stdin"
    else:
        text = arg
        where = "the config argument"
    try:
        conf = json.loads(text)
    except ValueError as exc:
        # not echoed: it may hold credentials
        raise ValueError(f"{where} is not JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(conf, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(conf).__name__}")
    if arg != FROM_STDIN and _holds_secrets(conf):
        warnings.warn("the client config on the command line holds credentials, readable by every local user "
                      f"(ps); pass {FROM_STDIN!r} and the config as one JSON line on stdin instead", stacklevel=2)
    return conf


def _holds_secrets(conf: Mapping[str, Any]) -> bool:
    return redact_config(conf) != conf


class WorkerProcessError(TxlakeError, RuntimeError):
    """A worker process the parent started ended on its own with a non-zero exit code.

    Attributes:
        name: what the process was (e.g. "the exactly-once copier").
        pid / returncode: the process and its exit code (negative: killed by that signal).
        stderr_tail: the last lines it wrote to stderr.
    """

    def __init__(self, name: str, pid: int, returncode: int, stderr_tail: str, when: str = ""):
        self.name, self.pid, self.returncode, self.stderr_tail = name, pid, returncode, stderr_tail
        self.when = when
        how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
        #: what happened, in one line without the stderr tail
        self.headline = f"{name} process (pid {pid}) {how}{' ' + when if when else ''}"
        text = self.headline
        text += f"; its last output on stderr:\n{stderr_tail}" if stderr_tail.strip() else " without output on stderr"
        super().__init__(text)

    @property
    def last_stderr_line(self) -> str:
        """The last non-blank line the process wrote to stderr (for a traceback: the exception), or ""."""
        lines = [line.strip() for line in self.stderr_tail.splitlines() if line.strip()]
        return lines[-1] if lines else ""


def append_stderr(log: IO[str], name: str, pid: int, returncode: int | None, stderr: IO[bytes]) -> None:
    """Append a child process's whole stderr (a temporary file it wrote) to ``log`` under a
    ``---- NAME (pid P, exit status S): stderr ----`` line; ``stderr`` is left open."""
    stderr.flush()
    stderr.seek(0)
    text = stderr.read().decode("utf-8", errors="replace")
    log.write(f"---- {name} (pid {pid}, exit status {returncode}): stderr{'' if text else ' (empty)'} ----\n{text}")
    if text and not text.endswith("\n"):
        log.write("\n")
    log.flush()


class ConfChild:
    """A worker process started with :func:`start_with_conf`, its stdout a text pipe and its
    stderr kept in a private temporary file (no pipe to fill up; read back when it fails).

    Args:
        name: what the process is, for messages ("the exactly-once copier").
        args / conf: as :func:`start_with_conf` (:func:`module_command` builds ``args``).
        cwd: the child's working directory (None: this process's).
        stderr_log: a text file to which :meth:`close` appends everything the child wrote to
            stderr, under a header naming it (``txlake demo``'s log file); None: dropped.

    :meth:`check` raises :class:`WorkerProcessError` when it failed or ended too early.
    """

    def __init__(self, name: str, args: list[str], conf: Mapping[str, Any], *, cwd: str | None = None,
                 stderr_log: IO[str] | None = None):
        self.name = name
        self._stderr_log = stderr_log
        self._stderr = tempfile.TemporaryFile(mode="w+b")  # created 0600, unlinked at once
        try:
            self.proc = start_with_conf(args, conf, stdout=subprocess.PIPE, stderr=self._stderr, text=True, cwd=cwd)
        except BaseException:
            self._stderr.close()
            raise
        self.pid = self.proc.pid

    @property
    def stdout(self) -> IO[str]:
        """The child's stdout (text, line by line)."""
        return self.proc.stdout

    def stderr_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines the child wrote to stderr."""
        self._stderr.flush()
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(0, size - 64 * 1024))
        text = self._stderr.read().decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL the child if it still runs, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def check(self, when: str = "", *, ended_early: bool = False) -> None:
        """Wait for the child to end; raise :class:`WorkerProcessError` if its exit code is not
        zero, or whatever it is with ``ended_early`` (it was expected to keep running).

        Args:
            when: at what point it ended, for the message (e.g. "before it held transaction 4 open").
        """
        code = self.proc.wait()
        if code != 0 or ended_early:
            raise WorkerProcessError(self.name, self.pid, code, self.stderr_tail(), when)

    def close(self) -> None:
        """Kill the child if it still runs, append its stderr to ``stderr_log`` (if given) and
        free its pipes and stderr file."""
        self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self._stderr_log is not None and not self._stderr.closed:
            append_stderr(self._stderr_log, self.name, self.pid, self.proc.returncode, self._stderr)
        self._stderr.close()

    def __enter__(self) -> "ConfChild":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
