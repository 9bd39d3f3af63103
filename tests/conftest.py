"""Shared pytest fixtures for txlake.

* ``s3_server`` (session): a real SeaweedFS S3 server on 127.0.0.1, one per
  pytest session / xdist worker, on free ports.
* ``backend`` / ``storage``: a fresh, unique storage root per test, parametrized
  over ``file``, ``memory`` and ``s3``.
* ``served``: ``txlake serve`` as a subprocess on a fresh root (``file`` and ``s3``),
  stopped after the test (tests/server_support.py). The s3 case, and every test using
  ``s3_server``, carries ``pytest.mark.s3``: deselect them with ``-m "not s3"``.
* ``apache_kafka`` (session): one Apache Kafka KRaft node on 127.0.0.1, the differential
  tests' reference (tests/kafka_reference.py; jars from dev/kafka_reference.sh).
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from s3_server import SeaweedS3Server  # noqa: E402

BACKENDS = ["file", "memory", "s3"]


@dataclass
class StorageTarget:
    """Where a test stores its data.

    Attributes:
        url: root URL (``file://...``, ``memory://...``, ``s3://bucket/prefix``).
        options: fsspec/s3fs storage options for that URL (may hold nested
            dicts such as ``client_kwargs``).
        backend: ``"file"``, ``"memory"`` or ``"s3"``.
    """

    url: str
    options: dict = field(default_factory=dict)
    backend: str = "file"

    def conf(self) -> dict:
        """Client config: ``{"storage.url": url, "storage.options.<k>": v, ...}``.

        Values are kept as they are (a nested dict stays a dict), so use
        :attr:`options` directly where a flat string config will not do.
        """
        out: dict = {"storage.url": self.url}
        for k, v in self.options.items():
            out[f"storage.options.{k}"] = v
        return out

    def object_store(self):
        """A :class:`txlake.catalog.storage.ObjectStore` on this root."""
        from txlake.catalog.storage import ObjectStore

        return ObjectStore(self.url, dict(self.options))


#: the test files that take longest, longest first: each one's tests' seconds (setup, call and
#: teardown) in a full run on 3 workers on the 2-core machine, 2026-11-25 (``-v
#: --durations=0``; the files of :data:`SAME_WORKER` counted with their first). ``dev/test.sh``
#: runs files whole on 4 workers (``--dist loadfile``) in collection order
#: (``--no-loadscope-reorder``): these go first, longest first, so the run does not end with
#: one worker alone on a long file. xdist's default order (most tests first) put most of them
#: last: they hold 1 or 2 tests each. With only the 18 longest named (a list from earlier
#: figures), the workers ran 883, 899 and 985 s: test_server_topics.py (122 s),
#: test_verify_cli.py (83 s) and test_writer_lease.py (71 s) ran last.
LONGEST_FILES = (
    "test_spark_write.py",          # 408 s with its SAME_WORKER files on 4 workers (157 s alone, 39 tests)
    "test_demo.py",                 # ~190 s: two whole demos (242 s with a third, merged since)
    "test_demo_runs.py",            # 193 s: the demo on all flights, in a child process
    "test_server_topics.py",        # 122 s
    "test_server_log.py",           # 94 s
    "test_txn_crash.py",            # 88 s
    "test_verify_cli.py",           # 83 s: the short campaigns on file:// and S3
    "test_differential_basic.py",   # 74 s with its SAME_WORKER files: Apache Kafka's start, 22 s
    "test_spark_contact.py",        # 73 s: a Spark driver JVM each
    "test_writer_lease.py",         # 71 s
    "test_txn_copy.py",             # 70 s: 100 000 records, 6 copier processes
    "test_crash_recovery.py",       # 67 s
    "test_group_copy.py",           # 66 s
    "test_server_cluster.py",       # 61 s
    "test_verify_faults.py",        # 59 s
    "test_verify_workload.py",      # 52 s
    "test_kip360.py",               # 50 s
    "test_catalog_gap.py",          # 47 s
    "test_tables.py",               # 44 s
    "test_server_groups.py",        # 40 s
    "test_groups.py",               # 40 s
    "test_kafka_tools_eos.py",      # 37 s: Kafka's TransactionalMessageCopier JVMs
    "test_txn_abandoned.py",        # 36 s
    "test_transactions.py",         # 34 s
    "test_examples.py",             # 33 s: the upstream-style programs as subprocesses
)


def pytest_collection_modifyitems(config, items):
    """Every test that uses the ``s3_server`` fixture is marked ``s3``; the files of
    :data:`LONGEST_FILES` come first, in that order (the others keep theirs)."""
    for item in items:
        if "s3_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.s3)
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))  # stable


#: test files that share a costly session fixture, each to the xdist scope of the first named:
#: ``--dist loadfile`` then runs them on one worker, so the fixture starts once per run, not
#: once on each worker that got one of them: Apache Kafka (its start: 12-27 s), and the
#: process's SparkSession (tests/spark_support.py; its JVM's start took 15-23 s of the first
#: test on each of the three workers that started one, 2026-11-25, and each holds a GiB).
SAME_WORKER = {"test_differential_txn.py": "test_differential_basic.py",
               "test_differential_faults.py": "test_differential_basic.py",
               **{name: "test_spark_write.py" for name in ("test_spark_read.py", "test_spark_stream_read.py",
                                                           "test_tables_spark.py", "test_spark_compaction.py")}}


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` scheduling with the files of :data:`SAME_WORKER` in one work unit
    (pytest-xdist's LoadFileScheduling, whose ``_split_scope`` maps a test id to its file)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            head, _, name = path.rpartition("/")
            return f"{head}/{SAME_WORKER[name]}" if name in SAME_WORKER else path

    return SharedFixtureFileScheduling(config, log)


@pytest.fixture(scope="session")
def s3_server():
    """A running SeaweedFS S3 server (started once per session / xdist worker).

    Has ``.endpoint_url``, ``.access_key``, ``.secret_key``, ``.bucket``,
    ``.start_seconds`` and ``.storage_options()`` (s3fs kwargs).
    """
    server = SeaweedS3Server()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(
    params=[
        "file",
        "memory",
        pytest.param("s3", marks=pytest.mark.s3),
    ],
    ids=BACKENDS,
)
def backend(request) -> str:
    """The storage backend under test: "file", "memory" or "s3"."""
    return request.param


@pytest.fixture
def storage(backend, request, tmp_path) -> StorageTarget:
    """A fresh, unique, empty storage root for this test on ``backend``."""
    if backend == "file":
        yield StorageTarget(url=f"file://{tmp_path}/root", options={}, backend="file")
    elif backend == "memory":
        name = f"txlake-test-{uuid.uuid4().hex}"
        yield StorageTarget(url=f"memory://{name}", options={}, backend="memory")
        import fsspec

        fs = fsspec.filesystem("memory")
        root = f"/{name}"
        for path in [p for p in list(fs.store) if p == root or p.startswith(root + "/")]:
            fs.store.pop(path, None)
        fs.pseudo_dirs[:] = [d for d in fs.pseudo_dirs if not (d == root or d.startswith(root + "/"))]
    elif backend == "s3":
        server = request.getfixturevalue("s3_server")
        yield StorageTarget(
            url=f"s3://{server.bucket}/{uuid.uuid4().hex}",
            options=server.storage_options(),
            backend="s3",
        )
    else:  # pragma: no cover
        raise ValueError(f"unknown backend {backend!r}")


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def serve_root(request, tmp_path):
    """A fresh root (file:// or the local S3 server) for ``txlake serve``, as a
    :class:`server_support.ServedRoot` NOT started yet (set the root up first, then
    ``.start()``); SIGTERMed after the test if running, which must exit 0."""
    from server_support import ServedRoot

    if request.param == "file":
        target = StorageTarget(url=f"file://{tmp_path}/root", options={}, backend="file")
    else:
        server = request.getfixturevalue("s3_server")
        target = StorageTarget(url=f"s3://{server.bucket}/{uuid.uuid4().hex}", options=server.storage_options(),
                               backend="s3")
    root = ServedRoot(target, tmp_path)
    try:
        yield root
    finally:
        code = root.stop() if root.proc is not None else 0
    assert code == 0, f"txlake serve exited {code} on SIGTERM; log {root.log_path}:\n{root.log_text()[-3000:]}"


@pytest.fixture
def served(serve_root):
    """``txlake serve`` running on a fresh root (file:// or the local S3 server): :func:`serve_root`, started."""
    return serve_root.start()


@pytest.fixture(scope="session")
def apache_kafka():
    """Apache Kafka 4.3.1, one KRaft node (broker+controller) on 127.0.0.1 with txlake's
    single-node settings, started once per session / xdist worker and killed at its end
    (tests/kafka_reference.py). Fails, naming dev/kafka_reference.sh, when its jars cannot
    be fetched. Has ``.bootstrap`` and ``.start_seconds``."""
    from kafka_reference import FAST_START_JVM_OPTIONS, ApacheKafka

    kafka = ApacheKafka(jvm_options=FAST_START_JVM_OPTIONS).start()
    try:
        yield kafka
    finally:
        kafka.stop()
