"""``txlake serve`` as a real subprocess for tests (issue 16).

:class:`ServedRoot` starts the server on a storage root, waits for its
``txlake serve: listening on HOST:PORT`` line, and can stop it with SIGTERM, kill it with
SIGKILL and start it again on the same root and port. Storage options (S3 credentials)
reach the child through ``TXLAKE_STORAGE_OPTIONS``, never its command line. The child's
stderr (the server's log) is kept in a file the failure message names.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from conftest import StorageTarget

SERVE_START_TIMEOUT_S = 60.0


class ServedRoot:
    """A storage root served by ``txlake serve`` in a child process.

    Attributes:
        storage: the root.
        port: the port it listens on (picked at the first start, kept by restarts).
        bootstrap: ``"127.0.0.1:PORT"`` for ``bootstrap.servers``.
        log_path: the child's stderr.
    """

    def __init__(self, storage: StorageTarget, log_dir: Path, settings: dict[str, object] | None = None):
        self.storage = storage
        self.port = 0
        self.log_dir = log_dir
        self.settings = dict(settings or {})
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"serve-{self.starts}.log"

    def start(self, extra_args: list[str] | None = None) -> "ServedRoot":
        """Start the server and wait until it listens (raises with its log when it does not)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.starts += 1
        args = [sys.executable, "-m", "txlake.cli", "serve", "--storage", self.storage.url,
                "--listen", f"127.0.0.1:{self.port}"]
        for key, value in self.settings.items():
            args += ["--config", f"{key}={value}"]
        args += extra_args or []
        env = dict(os.environ, TXLAKE_STORAGE_OPTIONS=json.dumps(self.storage.options), PYTHONUNBUFFERED="1")
        err = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, env=env, cwd=str(self.log_dir))
        err.close()
        line = self._read_line(SERVE_START_TIMEOUT_S)
        prefix = "txlake serve: listening on "
        if not line.startswith(prefix):
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"txlake serve did not start (stdout {line!r}); its log "
                                 f"{self.log_path}:\n{self.log_path.read_text()[-4000:]}")
        self.port = int(line[len(prefix):].rsplit(":", 1)[1])
        return self

    def _read_line(self, timeout_s: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        data = b""
        while not data.endswith(b"\n") and time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            chunk = os.read(self.proc.stdout.fileno(), 1)
            if not chunk:
                break
            data += chunk
        sel.close()
        return data.decode(errors="replace").strip()

    def kill(self) -> None:
        """SIGKILL the server (a crash: nothing is flushed, the lease is not released)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait: the exit code (0 after a clean shutdown)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"txlake serve did not stop within {timeout_s} s of SIGTERM; log {self.log_path}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


# ---------------------------------------------------------------------------- raw requests
def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock`` (raises ConnectionError naming how many came before it closed)."""
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def read_frame(sock: socket.socket) -> bytes:
    """One size-prefixed Kafka frame (without its length): the response header, then the body."""
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, size)


def roundtrip(port: int, request, version: int, correlation_id: int = 7, timeout_s: float = 20.0) -> bytes:
    """Send one kafka-python request message at ``version`` on a fresh connection to 127.0.0.1:``port``;
    the response frame (its correlation id first)."""
    request.with_header(correlation_id=correlation_id, client_id="raw-test")
    data = request.encode(version=version, header=True, framed=True)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        return read_frame(sock)


def decode_response(response_cls, frame: bytes, version: int):
    """The body of a response frame, after its header (v1, with tagged fields, for a flexible version)."""
    header = 5 if response_cls.flexible_version_q(version) else 4
    return response_cls.decode(frame[header:], version=version)
