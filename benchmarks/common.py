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


def fresh_root(keep: bool = False) -> str:
    """A new empty local storage root (file:// URL), removed when the process exits unless ``keep``."""
    path = tempfile.mkdtemp(prefix="txlake-bench-")
    if not keep:
        atexit.register(shutil.rmtree, path, True)
    return "file://" + path


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


def best(fn, repeat: int = 5, warmup: bool = False) -> float:
    """Best wall time (s) of ``repeat`` runs of ``fn()`` (after one untimed run if ``warmup``)."""
    if warmup:
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
