"""The one storage abstraction every txlake layer uses.

All persistence goes through :class:`ObjectStore`, a thin wrapper over an fsspec
filesystem rooted at a URL (``file://``, a plain local path, ``memory://``,
``s3://``, ...). Keys are ``/``-separated paths relative to that root.

The ordering primitive of the whole system is :meth:`ObjectStore.put_if_absent`
(create-if-absent). It is the only operation allowed to special-case a backend:

* local files: the bytes go to a temporary file in the target folder, are
  fsync'ed, then ``os.link(tmp, final)`` publishes them atomically (the link fails
  with ``FileExistsError`` if the key exists); readers never see partial content;
* ``memory://``: fsspec's MemoryFileSystem is a process-global dict, so the
  check-and-write runs under a module-level lock;
* ``s3://``: ``PutObject`` with ``If-None-Match: *``; a 412 PreconditionFailed
  (s3fs raises ``FileExistsError`` on AWS, ``OSError(EINVAL)`` on other servers)
  means "already exists", a 409 ConditionalRequestConflict is retried. Each
  PUT carries a random token in its user metadata, so a PUT that the client
  retried after the server had applied it still answers True.

Every other operation is a plain fsspec call, with a few small exceptions that
stay inside this module: local ``put`` writes a temp file and renames it (no
half-written object is ever visible), on ``memory://`` ``exists`` is a dict
lookup and readers get private copies (fsspec shares one BytesIO per object), and
on S3 ``first_key_after`` is one ListObjectsV2 request with ``StartAfter`` (the same
answer as a filtered listing, for one request instead of one per 1000 keys).
fsspec's listing caches are invalidated before every read, so objects written by
other processes or other instances are seen at once.

Keys are relative, ``/``-separated, without empty, ``.`` or ``..`` components;
a key must never also be the folder of other keys.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import threading
import time
import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

import fsspec

from .faults import FaultSchedule, split_fault_options
from .redaction import redact_url, url_has_credentials

__all__ = [
    "BucketNotFoundError",
    "InvalidObjectKeyError",
    "InvalidStorageUrlError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectStore",
    "STORAGE_ATTEMPTS",
    "STORE_UNREACHABLE_S",
    "StorageError",
    "TEMP_PREFIX",
    "retry_storage",
    "store_unreachable",
]

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: Attempts in all of an object-store call that :func:`retry_storage` repeats on a StorageError.
STORAGE_ATTEMPTS = 6
#: Seconds :func:`retry_storage` keeps repeating a call while the store refuses connections (it
#: is down or restarting), whatever its attempts: a store restart is ridden out, not fatal.
STORE_UNREACHABLE_S = 30.0
#: the errors (by class name, anywhere in the cause chain) of a store that refuses connections
_UNREACHABLE = ("ConnectionRefusedError", "EndpointConnectionError", "ClientConnectorError", "ConnectTimeoutError")


def store_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says the store refused or did not
    accept the connection -- it is down or restarting -- rather than failing a request it got."""
    seen = 0
    while exc is not None and seen < 16:
        if any(cls.__name__ in _UNREACHABLE for cls in type(exc).__mro__):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False

#: Basename prefix of the temporary files the local backend writes before
#: publishing an object. Such names are never returned by :meth:`ObjectStore.list`.
TEMP_PREFIX = ".txlake-tmp-"

#: User-metadata entry (``x-amz-meta-txlake-put-token``) written with every S3
#: conditional PUT, so a PUT that the client retried after the server had
#: already applied it can recognise its own object.
_S3_TOKEN_META = "txlake-put-token"

# MemoryFileSystem keeps every object in one class-level dict shared by all
# instances of the process: one lock serialises all memory mutations.
_MEMORY_LOCK = threading.RLock()

_S3_PROTOCOLS = ("s3", "s3a")
_LOCAL_PROTOCOLS = ("file", "local")
#: URL schemes of a storage root: the backends with a verified create-if-absent (DESIGN.md
#: "Storage model"); a plain path is a local one.
SUPPORTED_SCHEMES = (*_LOCAL_PROTOCOLS, "memory", *_S3_PROTOCOLS)


class ObjectNotFoundError(FileNotFoundError):
    """No object exists at a key.

    Attributes:
        url: full URL (``protocol://root/key``) of the missing object.
    """

    def __init__(self, url: str, detail: str | None = None):
        super().__init__(errno.ENOENT, "object not found", url)
        self.url = url
        self.detail = detail

    def __str__(self) -> str:
        msg = f"object not found: {self.url}"
        return f"{msg} ({self.detail})" if self.detail else msg

    def __reduce__(self):
        return (type(self), (self.url, self.detail))


class StorageError(OSError):
    """A storage operation failed for a reason other than a missing object.

    Attributes:
        url: full URL of the object or prefix the operation addressed.
        operation: name of the operation (``"get"``, ``"put"``, ``"list"``, ...).
        detail: the underlying error, as text (the exception is chained as
            ``__cause__``).
    """

    def __init__(self, url: str, operation: str, detail: str):
        super().__init__(f"storage {operation} failed for {url}: {detail}")
        self.url = url
        self.operation = operation
        self.detail = detail

    def __str__(self) -> str:
        return f"storage {self.operation} failed for {self.url}: {self.detail}"

    def __reduce__(self):
        return (type(self), (self.url, self.operation, self.detail))


class BucketNotFoundError(StorageError):
    """The S3 bucket of the storage root does not exist (S3's ``NoSuchBucket``).

    A missing bucket is never read as an empty root: it is a wrong URL or a bucket not
    created yet, and the message says so.

    Attributes:
        bucket: the bucket's name.
    """

    def __init__(self, url: str, operation: str, bucket: str):
        super().__init__(url, operation, f"the S3 bucket {bucket!r} does not exist (create it, or fix the storage url)")
        self.bucket = bucket

    def __reduce__(self):
        return (_bucket_not_found, (self.url, self.operation, self.bucket))


def _bucket_not_found(url: str, operation: str, bucket: str) -> BucketNotFoundError:
    return BucketNotFoundError(url, operation, bucket)


class InvalidStorageUrlError(ValueError):
    """A storage root URL txlake cannot use: empty, of an unsupported scheme, or an ``s3://``
    URL without a bucket (the message names the URL and what is expected)."""


class InvalidObjectKeyError(ValueError):
    """An object key that is not relative and ``/``-separated without empty, ``.`` or ``..``
    components (e.g. a corrupt catalog entry naming ``../x``)."""


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object, as returned by :meth:`ObjectStore.list`.

    Attributes:
        key: key relative to the store root, ``/``-separated, no leading ``/``.
        size: size in bytes.
        mtime_ms: last-modified time, integer milliseconds since the Unix epoch
            (0 if the backend does not report one).
    """

    key: str
    size: int
    mtime_ms: int


def _check_key(key: str) -> str:
    """Validate an object key; returns it unchanged or raises ValueError."""
    if not isinstance(key, str) or not key:
        raise InvalidObjectKeyError(f"object key must be a non-empty str, got {key!r}")
    if key.startswith("/") or key.endswith("/") or "\\" in key:
        raise InvalidObjectKeyError(
            f"invalid object key {key!r}: keys are relative, '/'-separated, "
            "without a leading or trailing '/' or backslashes"
        )
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidObjectKeyError(f"invalid object key {key!r}: empty, '.' or '..' path component")
    return key


def _check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise ValueError(f"list prefix must be a str, got {prefix!r}")
    if prefix.startswith("/") or "\\" in prefix:
        raise ValueError(f"invalid list prefix {prefix!r}: must be relative and '/'-separated")
    if any(p in (".", "..") for p in prefix.split("/")[:-1]) or "//" in prefix:
        raise ValueError(f"invalid list prefix {prefix!r}")
    return prefix


def _as_bytes(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    return bytes(_as_view(data))


def _as_view(data: Any) -> memoryview:
    """A view of bytes-like ``data`` (bytes, bytearray, memoryview, a pyarrow Buffer, ...), no copy."""
    try:
        return memoryview(data)
    except TypeError:
        raise TypeError(f"object data must be bytes-like, got {type(data).__name__}") from None


def _mtime_ms(info: dict) -> int:
    """Best-effort last-modified time of an fsspec info dict, in epoch ms."""
    for field in ("mtime", "LastModified", "last_modified", "modified", "updated", "created"):
        value = info.get(field)
        if value is None:
            continue
        if isinstance(value, datetime):
            return int(value.timestamp() * 1000)
        if isinstance(value, (int, float)):
            return int(value * 1000)
        if isinstance(value, str):
            try:
                return int(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
            except ValueError:
                continue
    return 0


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: bytes per ``write()`` of a local object. Linux's page cache took one ``write()`` of a
#: 110 MB flush object at 0.02 CPU-s on some runs and 0.2 on others (with the file system's
#: dirty pages building up); in writes of 1 MiB -- as pyarrow's own file writer does in 64 KiB
#: ones -- every run cost 0.02-0.03 (tried: 256 KiB, 1, 2, 4, 16 MiB and whole; from 2 MiB up
#: the slow runs came back).
WRITE_CHUNK_BYTES = 1 << 20


def _write_temp(folder: str, basename: str, data: bytes, durable: bool = True) -> str:
    """Write data to a fresh temp file in folder (fsync'ed if ``durable``), in writes of
    :data:`WRITE_CHUNK_BYTES`; returns its path."""
    tmp = os.path.join(folder, f"{TEMP_PREFIX}{uuid.uuid4().hex}-{basename}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view[:WRITE_CHUNK_BYTES])
            view = view[written:]
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _s3_error_code(exc: BaseException) -> tuple[str | None, int | None]:
    """(S3 error code, HTTP status) of an s3fs/botocore error, if known."""
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            err = response.get("Error") or {}
            meta = response.get("ResponseMetadata") or {}
            status = meta.get("HTTPStatusCode")
            return err.get("Code"), int(status) if status is not None else None
        e = e.__cause__ or e.__context__
    return None, None


def put_if_absent_confirmed(store: "ObjectStore", key: str, data: bytes, what: str, attempts: int) -> bool:
    """``store.put_if_absent(key, data)`` that survives an unknown outcome: True if this call's
    bytes are at ``key``, False if another writer's are (a lost create-if-absent race).

    A PUT that fails with a :class:`StorageError` -- a timeout or a reset after the store may
    have applied it (fault kind ``put.timeout``, catalog/faults.py) -- is followed by a read of
    ``key``: our own bytes there mean the PUT was applied (committed); other bytes mean another
    writer created it (False); no object means it was not applied, and the create-if-absent of
    the same bytes is repeated (safe: it can only create them), up to ``attempts`` PUTs in all,
    ``50 ms * n`` apart. A read that fails too counts as a failed attempt. A store that refuses
    connections (restarting) is waited for as by :func:`retry_storage`. Used for the commits of
    the catalog (:meth:`~.catalog.Catalog.commit`) and of the Delta tables (the table publisher).

    Args:
        key / data: as :meth:`ObjectStore.put_if_absent` (``data``: the commit's exact bytes).
        what: what is committed (``"catalog commit"``, ``"Delta commit"``), for the warnings logged.
        attempts: PUTs in all (>= 1).

    Raises:
        StorageError: every attempt failed and the read-back found nothing (the outcome stays
            unknown only if the last read failed too; the error names the key).
        ObjectNotFoundError: as :meth:`ObjectStore.put_if_absent`, at once.
    """
    url = store.uri(key)
    failure: StorageError | None = None
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.05 * attempt)
        try:
            created = retry_storage(lambda: store.put_if_absent(key, data), url, what, 1)
        except ObjectNotFoundError:
            raise
        except StorageError as exc:
            failure = exc
            log.warning("%s %s failed (%s); reading it back (it may have been applied)", what, url, exc)
        else:
            if created or failure is None:  # a first attempt that finds the key taken: a plain race lost
                return created
        try:  # the outcome of an earlier attempt is unknown: whose bytes are there?
            found = retry_storage(lambda: store.get_or_none(key), url, f"reading back {what}", 1)
        except StorageError as exc:
            failure = exc
            continue
        if found is not None:
            return found == data
    assert failure is not None
    raise failure


def retry_storage(call: Callable[[], _T], url: str, what: str, attempts: int = STORAGE_ATTEMPTS) -> _T:
    """``call()``, repeated on a :class:`StorageError` (a 503 SlowDown, a connection reset, a
    timeout) up to ``attempts`` times in all, ``50 ms * n`` after the n-th failure (so about
    0.75 s in all for 6); while the store refuses connections (:func:`store_unreachable`: down
    or restarting) the call is repeated every 0.05-1 s for up to :data:`STORE_UNREACHABLE_S`
    whatever ``attempts`` says. Only for calls that are safe to repeat: a read, or a write of the
    same bytes to a key of its own. :class:`ObjectNotFoundError` is an answer, not a failure: it
    is raised at once, as is every other exception.

    Args:
        url: the object (or prefix) the call is about, for the warning logged per retry.
        what: what the call does (``"reading catalog commit"``, ``"PUT of"``), for that warning.
        attempts: tries in all for failures other than an unreachable store (1: only those are retried).

    Raises:
        StorageError: the last attempt's error, when every attempt failed.
    """
    failures, unreachable_since = 0, None
    while True:
        try:
            return call()
        except StorageError as exc:
            if isinstance(exc, ObjectNotFoundError):
                raise
            if store_unreachable(exc):
                now = time.monotonic()
                unreachable_since = unreachable_since or now
                if now - unreachable_since >= STORE_UNREACHABLE_S:
                    raise
                log.warning("%s %s failed: the store is unreachable (%s); retrying", what, url, exc)
                time.sleep(min(1.0, 0.05 * 2 ** min(5, int(now - unreachable_since))))
                continue
            failures += 1
            if failures >= attempts:
                raise
            log.warning("%s %s failed (%s); retrying", what, url, exc)
            time.sleep(0.05 * failures)


class ObjectStore:
    """Objects under one root URL, on any fsspec filesystem.

    Args:
        url: root of the store: ``"file:///abs/path"``, a plain absolute or
            relative local path (treated as ``file://``), ``"memory://name"`` or
            ``"s3://bucket/prefix"`` (also ``s3a://``): the backends with a verified
            create-if-absent (:data:`SUPPORTED_SCHEMES`). A local root folder is
            created if missing.
        storage_options: keyword arguments of the fsspec filesystem; for
            ``s3://`` these are s3fs arguments (``endpoint_url``, ``key``,
            ``secret``, ``client_kwargs``, ...). Entries named ``storage.faults.*`` are not
            passed to fsspec: they enable fault injection (tests and ``txlake verify`` only,
            :mod:`.faults`, docs/reliability.md).

    Attributes:
        url: normalised URL of the root, with protocol, no trailing slash.
        protocol: canonical protocol name (``"file"``, ``"memory"``, ``"s3"``, ...).
        root: the root as the fsspec filesystem spells paths (no trailing slash).
        fs: the fsspec filesystem.
        faults: the :class:`~.faults.FaultSchedule` of ``storage.faults.*`` options, or None.
        storage_options: the options the filesystem was built with (a copy).

    Raises:
        InvalidStorageUrlError (a ValueError): the URL is empty, an ``s3://`` URL names no bucket, its
            scheme is not one of :data:`SUPPORTED_SCHEMES` (the message names the scheme and the
            supported ones; no filesystem of that scheme is created), or it carries credentials
            (``s3://KEY:SECRET@bucket``: pass them as storage options).
        InvalidFaultConfigError (a ValueError): a bad ``storage.faults.*`` option.
        StorageError: the filesystem could not be created (e.g. missing
            package, or a local root that cannot be created).

    Instances are thread-safe and picklable (they rebuild their filesystem). The repr
    shows the url only, never the storage options.
    """

    def __init__(self, url: str, storage_options: dict | None = None):
        if not isinstance(url, str) or not url.strip():
            raise InvalidStorageUrlError(f"storage url must be a non-empty str, got {url!r}")
        raw = url.strip()
        if url_has_credentials(raw):
            exc = InvalidStorageUrlError(f"storage url {redact_url(raw)!r} carries credentials in its user part; txlake does not "
                             "use them (a URL is printed in logs, errors and process lists): pass them as storage "
                             "options instead (-O key=... -O secret=..., $TXLAKE_STORAGE_OPTIONS, or "
                             "storage.options in the client config)")
            exc.__txlake_user__ = True  # type: ignore[attr-defined]
            raise exc
        self.storage_options: dict = dict(storage_options or {})
        protocol, _ = fsspec.core.split_protocol(raw)
        if protocol is None:
            protocol = "file"
            raw = "file://" + os.path.abspath(os.path.expanduser(raw))
        if protocol.lower() not in SUPPORTED_SCHEMES:
            raise InvalidStorageUrlError(
                f"unsupported storage url {redact_url(url)!r}: scheme {protocol!r} is not supported; txlake stores "
                "objects under file:// (or a plain path), memory:// or s3:// (s3a://), the backends "
                "with a verified atomic create-if-absent")
        protocol = protocol.lower()
        try:
            cls = fsspec.get_filesystem_class(protocol)
        except (ValueError, ImportError) as e:
            raise InvalidStorageUrlError(f"unsupported storage url {redact_url(url)!r}: {e}") from e
        protos = cls.protocol if isinstance(cls.protocol, (tuple, list)) else (cls.protocol,)
        self.protocol: str = protos[0]
        root = cls._strip_protocol(raw)
        if self.protocol in _LOCAL_PROTOCOLS:
            self.protocol = "file"
            root = os.path.abspath(root)
        self.root: str = root.rstrip("/")
        if self.protocol in _S3_PROTOCOLS and not self.root.strip("/"):
            raise InvalidStorageUrlError(f"storage url {redact_url(url)!r} names no S3 bucket: use s3://bucket or s3://bucket/prefix")
        if self.protocol == "file":
            self.url = "file://" + (self.root or "/")
        else:
            self.url = f"{self.protocol}://{self.root.lstrip('/')}"
        fs_options, fault_options = split_fault_options(self.storage_options)
        try:
            self.fs = fsspec.filesystem(self.protocol, **fs_options)
        except Exception as e:  # noqa: BLE001 - surface any construction failure
            raise StorageError(self.url, "open", f"{type(e).__name__}: {e}") from e
        if self.protocol == "file":
            try:
                os.makedirs(self.root or "/", exist_ok=True)
            except OSError as e:
                raise StorageError(self.url, "create root", str(e)) from e
        self._arrow_fs = None
        self._arrow_lock = threading.Lock()
        #: the fault schedule (tests and ``txlake verify`` only: ``storage.faults.*`` options), or None
        self.faults: FaultSchedule | None = FaultSchedule(fault_options) if fault_options else None
        if self.faults is not None:
            self.faults.install(self)

    # ------------------------------------------------------------------ naming

    def __repr__(self) -> str:
        # never the storage options (credentials); the url cannot carry any (refused above)
        return f"ObjectStore({redact_url(self.url)!r})"

    def __reduce__(self):
        return (type(self), (self.url, self.storage_options))

    def uri(self, key: str) -> str:
        """Full URL of key: ``protocol://root/key``. Raises ValueError on a bad key."""
        return f"{self.url}/{_check_key(key)}"

    def fs_path(self, key: str) -> str:
        """Path of key as ``self.fs`` (and :meth:`arrow_filesystem`) expects it.

        Raises ValueError on a bad key (empty, absolute, ``..``, trailing ``/``).
        """
        return f"{self.root}/{_check_key(key)}"

    def _prefix_path(self, prefix: str) -> str:
        return f"{self.root}/{prefix}" if prefix else (self.root or "/")

    def _key_of(self, path: str) -> str | None:
        base = self.root + "/"
        if not path.startswith(base):
            return None
        return path[len(base):]

    @contextmanager
    def _errors(self, operation: str, url: str, reading: bool = True) -> Iterator[None]:
        """Map backend exceptions to ObjectNotFoundError / StorageError.

        When reading, "not found" (or a folder where an object was expected)
        becomes ObjectNotFoundError; when writing it is a StorageError.
        """
        try:
            yield
        except (ObjectNotFoundError, StorageError):
            raise
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            if self.protocol in _S3_PROTOCOLS and _s3_error_code(e)[0] == "NoSuchBucket":
                # s3fs reads a missing bucket as "not found": never an empty root
                raise BucketNotFoundError(url, operation, self.root.lstrip("/").split("/", 1)[0]) from e
            if reading:
                raise ObjectNotFoundError(url) from e
            raise StorageError(url, operation, f"{type(e).__name__}: {e}") from e
        except Exception as e:  # noqa: BLE001 - every other failure names the url
            raise StorageError(url, operation, f"{type(e).__name__}: {e}") from e

    def _mutation_lock(self):
        """The lock memory:// mutations run under (a no-op elsewhere)."""
        return _MEMORY_LOCK if self.protocol == "memory" else nullcontext()

    def _invalidate(self, path: str | None = None) -> None:
        """Drop fsspec's cached listings so other writers' objects are seen."""
        try:
            self.fs.invalidate_cache(path)
        except Exception:  # noqa: BLE001 - cache invalidation is best effort
            self.fs.invalidate_cache()

    # ------------------------------------------------------------------ writes

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create the object at key with data, only if no object exists there.

        This is the ordering primitive of txlake (catalog commits, writer
        leases): when several threads or processes race on one key, exactly one
        call returns True, and a reader of the key sees either nothing or the
        complete bytes of the winner.

        Args:
            key: object key relative to the root.
            data: the object content, non-empty bytes-like.

        Returns:
            True if this call created the object, False if an object already
            existed at key (its content is left unchanged).

        A key must never also be the folder of other keys (``"a"`` and
        ``"a/b"``): backends disagree on that case (local raises StorageError,
        SeaweedFS answers False, AWS S3 and memory:// create both).

        Raises:
            ValueError: data is empty (an empty conditional write can truncate
                on some backends) or the key is invalid.
            TypeError: data is not bytes-like.
            StorageError: any other failure (naming the url), or a protocol
                without a verified create-if-absent.
        """
        path = self.fs_path(key)
        data = _as_bytes(data)
        if not data:
            raise ValueError(f"put_if_absent of empty data refused for {self.uri(key)}")
        url = self.uri(key)
        if self.protocol == "file":
            return self._put_if_absent_local(path, data, url)
        if self.protocol == "memory":
            with _MEMORY_LOCK, self._errors("put_if_absent", url, reading=False):
                if self.fs.isfile(path):
                    return False
                self.fs.pipe_file(path, data)
                return True
        if self.protocol in _S3_PROTOCOLS:
            return self._put_if_absent_s3(path, data, url)
        raise StorageError(
            url,
            "put_if_absent",
            f"no verified atomic create-if-absent for protocol {self.protocol!r}; "
            "use file://, memory:// or s3://",
        )

    def _put_if_absent_local(self, path: str, data: bytes, url: str) -> bool:
        folder, basename = os.path.split(path)
        with self._errors("put_if_absent", url, reading=False):
            os.makedirs(folder, exist_ok=True)
            tmp = _write_temp(folder, basename, data)
            try:
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    if os.path.isdir(path):
                        raise StorageError(
                            url,
                            "put_if_absent",
                            "the key is a folder of other objects; a key cannot be both",
                        ) from None
                    return False
                except OSError as e:
                    if e.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                        raise StorageError(
                            url,
                            "put_if_absent",
                            f"the local filesystem does not support hard links ({e}); "
                            "txlake needs them for atomic create-if-absent",
                        ) from e
                    raise
            finally:
                _unlink_quietly(tmp)
            _fsync_dir(folder)
            return True

    def _put_if_absent_s3(self, path: str, data: bytes, url: str) -> bool:
        bucket, key, _ = self.fs.split_path(path)
        token = uuid.uuid4().hex
        delay = 0.05
        deadline = time.monotonic() + 60.0
        while True:
            try:
                self.fs.call_s3(
                    "put_object",
                    Bucket=bucket,
                    Key=key,
                    Body=data,
                    IfNoneMatch="*",
                    Metadata={_S3_TOKEN_META: token},
                )
                self._invalidate(path)
                return True
            except Exception as e:  # noqa: BLE001 - classified below
                code, status = _s3_error_code(e)
                exists = (
                    isinstance(e, FileExistsError)
                    or code == "PreconditionFailed"
                    or status == 412
                    or (
                        isinstance(e, OSError)
                        and e.errno == errno.EINVAL
                        and "pre-condition" in str(e).lower()
                    )
                )
                if exists:
                    self._invalidate(path)
                    # The client may have retried a PUT the server had already
                    # applied: then the object carries our token and is ours.
                    return self._s3_token_of(bucket, key) == token
                conflict = code == "ConditionalRequestConflict" or status == 409
                if conflict and time.monotonic() < deadline:
                    # Another conditional write to this key is in flight: retry,
                    # the answer will be 412 (it won) or 200 (it failed).
                    time.sleep(delay)
                    delay = min(delay * 2, 1.0)
                    continue
                if code == "NoSuchBucket":
                    raise BucketNotFoundError(url, "put_if_absent", bucket) from e
                detail = f"{type(e).__name__}: {e}"
                if code:
                    detail += f" [S3 {code}, HTTP {status}]"
                raise StorageError(url, "put_if_absent", detail) from e

    def _s3_token_of(self, bucket: str, key: str) -> str | None:
        try:
            head = self.fs.call_s3("head_object", Bucket=bucket, Key=key)
        except Exception:  # noqa: BLE001 - gone or unreadable: not provably ours
            return None
        meta = head.get("Metadata") or {}
        return meta.get(_S3_TOKEN_META)

    def put(self, key: str, data: bytes | memoryview, durable: bool = True) -> None:
        """Create or overwrite the object at key; parent folders are created.

        On the local backend the bytes are written to a temp file and renamed
        over the key, so readers never see a half-written object; with ``durable``
        (the default) the file and its folder are fsync'ed before returning, so the
        object survives a machine crash. ``durable=False`` is for scratch objects whose
        loss only fails the job that wrote them (Spark staging); object stores are
        durable on every PUT either way.

        Raises:
            ValueError: invalid key.
            TypeError: data is not bytes-like (any object with the buffer protocol is: on
                the local backend it is written without a copy).
            StorageError: any backend failure, naming the url.
        """
        path = self.fs_path(key)
        data = _as_view(data) if self.protocol == "file" else _as_bytes(data)
        url = self.uri(key)
        if self.protocol == "file":
            folder, basename = os.path.split(path)
            with self._errors("put", url, reading=False):
                os.makedirs(folder, exist_ok=True)
                tmp = _write_temp(folder, basename, data, durable)
                try:
                    os.replace(tmp, path)
                except BaseException:
                    _unlink_quietly(tmp)
                    raise
                if durable:
                    _fsync_dir(folder)
            return
        with self._mutation_lock(), self._errors("put", url, reading=False):
            self.fs.pipe_file(path, data)
        self._invalidate(path)

    def delete(self, key: str) -> None:
        """Delete the object at key; a missing object is not an error.

        Raises:
            ValueError: invalid key.
            StorageError: any backend failure, naming the url.
        """
        path = self.fs_path(key)
        url = self.uri(key)
        try:
            with self._mutation_lock(), self._errors("delete", url):
                self.fs.rm_file(path)
        except ObjectNotFoundError:
            pass
        finally:
            self._invalidate(path)

    def delete_many(self, keys: list[str]) -> None:
        """Delete every object in ``keys``; missing ones are not an error.

        On S3 this is one DeleteObjects request per 1000 keys (s3fs batches them);
        elsewhere one delete per key.

        Raises:
            ValueError: an invalid key.
            StorageError: any backend failure, naming the first key's url.
        """
        if not keys:
            return
        if self.protocol not in _S3_PROTOCOLS:
            for key in keys:
                self.delete(key)
            return
        paths = [self.fs_path(key) for key in keys]
        try:
            with self._errors("delete", self.uri(keys[0])):
                self.fs.rm(paths)
        except ObjectNotFoundError:
            pass
        finally:
            self._invalidate()

    # ------------------------------------------------------------------- reads

    def get(self, key: str) -> bytes:
        """Full content of the object at key.

        Raises:
            ObjectNotFoundError: no object at key (names its url).
            ValueError: invalid key.
            StorageError: any other backend failure, naming the url.
        """
        path = self.fs_path(key)
        url = self.uri(key)
        self._invalidate(path)
        with self._errors("get", url):
            return bytes(self.fs.cat_file(path))

    def get_or_none(self, key: str) -> bytes | None:
        """Like :meth:`get`, but None when no object exists at key."""
        try:
            return self.get(key)
        except ObjectNotFoundError:
            return None

    def exists(self, key: str) -> bool:
        """True if an object (not a folder) exists at key.

        Raises:
            ValueError: invalid key.
            StorageError: backend failure other than "not found".
        """
        path = self.fs_path(key)
        if self.protocol == "memory":
            return bool(self.fs.isfile(path))  # O(1); info() scans the store
        self._invalidate(path)
        try:
            with self._errors("exists", self.uri(key)):
                info = self.fs.info(path)
        except ObjectNotFoundError:
            return False
        return info.get("type") == "file"

    def list(self, prefix: str = "", include_temporary: bool = False) -> list[ObjectInfo]:
        """Objects whose key starts with prefix, sorted by key.

        ``"dir/"`` lists everything below that folder (recursively); ``"dir/ab"``
        lists ``dir/ab*`` (including below ``dir/abc/``); ``""`` lists the store.
        Folders are never returned; temporary files (local backend, basename
        starting with :data:`TEMP_PREFIX`) only with ``include_temporary`` -- the
        orphan cleaner uses it to delete those a crash left behind.

        Returns:
            A list of :class:`ObjectInfo` (``[]`` if nothing matches).

        Raises:
            ValueError: invalid prefix (absolute, backslashes, ``..``).
            StorageError: any backend failure, naming the prefix url.
        """
        prefix = _check_prefix(prefix)
        folder, _, base = prefix.rpartition("/")
        folder_path = self._prefix_path(folder)
        url = f"{self.url}/{prefix}"
        self._invalidate(folder_path)
        try:
            with self._errors("list", url):
                if self.protocol in _S3_PROTOCOLS and base:
                    # server-side prefix filter: one LIST of just the matches
                    found = self.fs.find(folder_path, prefix=base, detail=True)
                else:
                    found = self.fs.find(folder_path, detail=True)
                out = []
                for name, info in found.items():
                    name = info.get("name", name)
                    key = self._key_of(name)
                    if key is None or not key.startswith(prefix) or key.endswith("/"):
                        continue
                    if info.get("type", "file") != "file":
                        continue
                    if not include_temporary and key.rpartition("/")[2].startswith(TEMP_PREFIX):
                        continue
                    size = info.get("size")
                    if size is None:
                        size = self.fs.info(name).get("size", 0)
                    out.append(ObjectInfo(key=key, size=int(size), mtime_ms=_mtime_ms(info)))
        except ObjectNotFoundError:
            return []
        out.sort(key=lambda o: o.key)
        return out

    def first_key_after(self, prefix: str, after: str) -> str | None:
        """The smallest key that starts with ``prefix`` and sorts after ``after`` (None when none does).

        The catalog's question "does anything exist past this number?" (keys are zero-padded
        numbers, so key order is number order). On S3 it is ONE ListObjectsV2 request
        (``StartAfter``, a few keys at most) however many keys the prefix holds; on a local
        root a walk of the folder's names (no stat per object); elsewhere a listing of the
        prefix. Temporary files and folders are never returned.

        Raises:
            ValueError: invalid prefix or key.
            StorageError: any backend failure, naming the prefix url.
        """
        prefix = _check_prefix(prefix)
        _check_key(after)
        if self.protocol == "file":  # names only: no stat per object, as a listing would do
            folder = prefix.rpartition("/")[0]
            top = self._prefix_path(folder)
            found = None
            with self._errors("list", f"{self.url}/{prefix}"):
                for dirpath, _, names in os.walk(top):
                    rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
                    for name in names:
                        key = name if rel == "." else f"{rel}/{name}"
                        if key.startswith(prefix) and key > after and not name.startswith(TEMP_PREFIX) \
                                and (found is None or key < found):
                            found = key
            return found
        if self.protocol not in _S3_PROTOCOLS:
            return next((o.key for o in self.list(prefix) if o.key > after), None)
        bucket, root_key, _ = self.fs.split_path(self.root)
        base = f"{root_key}/" if root_key else ""
        url = f"{self.url}/{prefix}"
        token = None
        with self._errors("list", url):
            while True:  # a page of folder markers only (rare) is followed by the next one
                kwargs = {"Bucket": bucket, "Prefix": base + prefix, "StartAfter": base + after, "MaxKeys": 8}
                if token:
                    kwargs["ContinuationToken"] = token
                page = self.fs.call_s3("list_objects_v2", **kwargs)
                for item in page.get("Contents") or ():
                    key = item["Key"][len(base):]
                    if key > after and not key.endswith("/"):
                        return key
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    return None

    def open_input(self, key: str) -> BinaryIO:
        """A seekable binary file object for key, e.g. for ``pyarrow.parquet.ParquetFile``.

        The caller closes it. Each call returns an independent file object.

        Raises:
            ObjectNotFoundError: no object at key (names its url).
            ValueError: invalid key.
            StorageError: any other backend failure, naming the url.
        """
        path = self.fs_path(key)
        url = self.uri(key)
        self._invalidate(path)
        with self._errors("open", url):
            if self.protocol == "memory":
                # MemoryFileSystem.open hands out the one shared BytesIO of the
                # object: give each reader its own cursor instead.
                return io.BytesIO(self.fs.cat_file(path))
            return self.fs.open(path, "rb")

    def read_object(self, key: str, read: Callable[[BinaryIO], _T]) -> _T:
        """``read(file)`` of the object at key (opened with :meth:`open_input`, closed after),
        retried as a whole on a :class:`StorageError` (:func:`retry_storage`): how the engine
        reads its data objects (segments, flush objects), so a transient failure (503, reset)
        of one GET does not fail a fetch, a consume or a compaction round.

        Raises:
            ObjectNotFoundError: no object at key (never retried).
            StorageError: every attempt failed (the last one's error).
            whatever ``read`` raises otherwise (e.g. CorruptObjectError), at once.
        """
        def once() -> _T:
            with self.open_input(key) as f:
                return read(f)
        return retry_storage(once, self.uri(key), "reading")

    def arrow_filesystem(self):
        """A ``pyarrow.fs.FileSystem`` over this store's fsspec filesystem (cached).

        Paths given to it are :meth:`fs_path` values. Local stores get pyarrow's
        native ``LocalFileSystem``; others ``PyFileSystem(FSSpecHandler(fs))``.
        """
        if self._arrow_fs is None:
            with self._arrow_lock:
                if self._arrow_fs is None:
                    import pyarrow.fs as pafs

                    if self.protocol == "file":
                        self._arrow_fs = pafs.LocalFileSystem()
                    elif self.protocol == "memory":
                        self._arrow_fs = pafs.PyFileSystem(_memory_handler_class()(self.fs))
                    else:
                        self._arrow_fs = pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))
        return self._arrow_fs


_MEMORY_HANDLER = None


def _memory_handler_class():
    """FSSpecHandler whose input files are private copies (see open_input)."""
    global _MEMORY_HANDLER
    if _MEMORY_HANDLER is None:
        import pyarrow as pa
        import pyarrow.fs as pafs

        class _MemoryHandler(pafs.FSSpecHandler):
            def open_input_file(self, path):
                return pa.PythonFile(io.BytesIO(self.fs.cat_file(path)), mode="r")

            def open_input_stream(self, path):
                return self.open_input_file(path)

        _MEMORY_HANDLER = _MemoryHandler
    return _MEMORY_HANDLER
