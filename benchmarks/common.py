"""Shared helpers of the benchmarks: data generation, timing, fresh storage roots."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import time
from contextlib import contextmanager

import numpy as np
import pyarrow as pa


def records_table(n: int, value_bytes: int = 100, seed: int = 7, keys: int = 1000) -> pa.Table:
    """``n`` records: string keys drawn from ``keys`` distinct values, random ``value_bytes``-byte values."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=n * value_bytes, dtype=np.uint8).tobytes()
    offsets = pa.array(np.arange(0, (n + 1) * value_bytes, value_bytes, dtype=np.int32))
    values = pa.BinaryArray.from_buffers(pa.binary(), n, [None, offsets.buffers()[1], pa.py_buffer(raw)])
    key_ids = rng.integers(0, keys, size=n)
    key_dict = pa.array([f"key-{i}".encode() for i in range(keys)], pa.binary())
    return pa.table({"key": key_dict.take(pa.array(key_ids)), "value": values})


@contextmanager
def timed(results: dict, name: str):
    """Store the wall time (s) of the block under ``results[name]``."""
    start = time.perf_counter()
    yield
    results[name] = time.perf_counter() - start


def scratch_dir(prefix: str = "txlake-bench-", keep: bool = False) -> str:
    """A new empty local folder, removed when the process exits unless ``keep``."""
    path = tempfile.mkdtemp(prefix=prefix)
    if not keep:
        atexit.register(shutil.rmtree, path, True)
    return path


def fresh_root(keep: bool = False) -> str:
    """A new empty local storage root (file:// URL), removed when the process exits unless ``keep``."""
    return "file://" + scratch_dir(keep=keep)


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MiB), from /proc/self/status VmHWM.

    (``getrusage``'s ru_maxrss is no good here: Linux carries it across exec, so a child
    started by a big parent reports the parent's peak.)
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def machine() -> str:
    """A one-line description of the machine."""
    return f"{os.cpu_count()} cores, Python {'.'.join(map(str, __import__('sys').version_info[:3]))}, pyarrow {pa.__version__}"


def best(fn, repeat: int = 5, warmup: bool = False, clock=time.perf_counter) -> float:
    """Best time (s) of ``repeat`` runs of ``fn()`` (after one untimed run if ``warmup``), by
    ``clock``: wall time, or ``time.thread_time`` for the calling thread's CPU time."""
    if warmup:
        fn()
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


def interleaved(fns: dict, repeat: int = 5) -> dict[str, list[float]]:
    """Wall times (s) of ``repeat`` rounds, each running every ``fns[name]()`` once in turn
    (after one untimed warm-up round): a load change on a shared machine then hits every
    side alike, where a block of runs per side would hit one side only."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


# ---------------------------------------------------------------- helpers of destructive benchmarks
# (bench_compaction*.py: a root is built once, then compacted copy by copy; each measurement
# runs in a child process so that its peak RSS is its own)


def root_path(url: str) -> str:
    """The local folder of a ``file://`` root."""
    assert url.startswith("file://"), url
    return url[len("file://"):]


def copy_root(url: str) -> str:
    """A fresh local root (removed when the process exits) holding a copy of the ``file://``
    root ``url``; the copy is synced to disk, so a measurement on it does not pay the copy's
    write-back."""
    dst = fresh_root()
    shutil.copytree(root_path(url), root_path(dst), dirs_exist_ok=True)
    os.sync()
    return dst


def remove_root(url: str) -> None:
    """Delete a local root now (big copies should not wait for the process to exit)."""
    shutil.rmtree(root_path(url), True)


def rss_mb() -> float:
    """Resident memory of this process now (MiB), from /proc/self/status VmRSS."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run_child(script: str, spec: dict, timeout: float = 3600) -> dict:
    """Run ``script --child <spec as JSON>`` in a fresh interpreter and return the JSON object
    its last stdout line prints (a measurement with its own process: its own peak RSS, no
    heap or cache left over from the previous one)."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, script, "--child", json.dumps(spec)], capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} child {spec.get('kind')} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
