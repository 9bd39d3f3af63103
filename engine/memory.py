"""A writer process's memory: which allocators its Arrow buffers and glibc's malloc use.

Issue 14 (the hour-long trickle's RSS) and issue 20 (the bulk load's CPU) both came down to how
memory freed on one thread is reused on another. pyarrow's default pool, mimalloc, keeps a heap
per thread: a page freed by another thread returns to its heap only when the owning thread
collects, and an idle page is decommitted after a few milliseconds, so the next allocation
faults fresh (kernel-zeroed) pages in. jemalloc's arenas are reused and purged from any thread.

- :func:`configure_writer_memory` (``txlake serve`` at start-up) sets the process-wide
  defaults: Arrow's pool (:func:`use_memory_pool`) and glibc's arenas
  (:func:`limit_malloc_arenas`).
- :func:`bulk_memory_pool` is the pool the engine itself allocates the bulk copies of a load
  from, whatever the process's default: no process-wide setting is changed.
"""

from __future__ import annotations

import functools

import pyarrow as pa


def glibc_function(name: str):
    """glibc's function ``name`` through ctypes, or None when the C library is not glibc (or
    lacks it): ``malloc_trim`` for :func:`~.segment_merge.release_unused_memory`, ``mallopt`` for
    :func:`limit_malloc_arenas`."""
    try:
        import ctypes

        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):  # not glibc
        return None


#: ``use_memory_pool`` backends: Arrow's names (``pa.supported_memory_backends()``)
MEMORY_POOL_BACKENDS = ("mimalloc", "jemalloc", "system")


#: jemalloc's decay time a writer process sets (ms): Arrow's own default for its jemalloc pool
#: (``dirty_decay_ms:1000``); a compaction round's end purges every arena at once anyway
JEMALLOC_DECAY_MS = 1000


def use_memory_pool(backend: str, decay_ms: int = JEMALLOC_DECAY_MS) -> str:
    """Make ``backend`` the process's default Arrow memory pool (``pa.set_memory_pool``): a
    process-wide setting, for a process that runs a writer (``txlake serve --memory-pool``,
    ``bench_trickle.py --memory-pool``); a library never calls it on its own.

    Why it exists (issue 14): pyarrow's default pool, mimalloc, keeps a heap per thread and
    returns a freed page to the OS only when the thread that allocated it collects; a
    compaction round releases on each of its threads (:class:`~.segment_merge.RoundWorkers`),
    but buffers other threads allocate (flushes, fetches) and free elsewhere are not covered.
    jemalloc purges its arenas from any thread: with ``backend="jemalloc"`` freed pages are
    returned after ``decay_ms`` (``pa.jemalloc_set_decay_ms``; 0: at once) and
    :func:`~.segment_merge.release_unused_memory` purges every arena. docs/benchmarks.md ("Trickle") gives
    what each measured. It does not reach Arrow's C++ allocations from the pool Arrow chose at
    start-up, such as the Parquet writer's own page and compression buffers (``pq.write_table``
    with jemalloc set here still took 32 MB from mimalloc); ``ARROW_DEFAULT_MEMORY_POOL`` in the
    environment when the process starts does.

    Args:
        backend: one of :data:`MEMORY_POOL_BACKENDS`.
        decay_ms: jemalloc's decay time (ms; 0 purges at once, -1 never); ignored for other backends.

    Returns:
        The backend name now in use (``pa.default_memory_pool().backend_name``).

    Raises:
        ValueError: ``backend`` unknown or not built into this pyarrow (named in the message).
    """
    if backend not in MEMORY_POOL_BACKENDS or backend not in pa.supported_memory_backends():
        raise ValueError(f"Arrow memory pool {backend!r} is not available: this pyarrow supports "
                         f"{', '.join(pa.supported_memory_backends())}")
    pool = {"mimalloc": pa.mimalloc_memory_pool, "jemalloc": pa.jemalloc_memory_pool,
            "system": pa.system_memory_pool}[backend]()
    if backend == "jemalloc":
        pa.jemalloc_set_decay_ms(decay_ms)
    pa.set_memory_pool(pool)
    return pa.default_memory_pool().backend_name


#: glibc's ``mallopt`` parameter for the most malloc arenas (``M_ARENA_MAX`` in malloc.h)
_M_ARENA_MAX = -8
#: the most glibc malloc arenas a writer process keeps (``txlake serve --malloc-arenas``)
WRITER_MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int) -> bool:
    """Let glibc's malloc create at most ``arenas`` arenas in this process from now on
    (``mallopt(M_ARENA_MAX, arenas)``, the same as ``MALLOC_ARENA_MAX`` in the environment):
    a process-wide setting, for a process that runs a writer (``txlake serve
    --malloc-arenas``); a library never calls it on its own. Call it before the process
    starts threads: an arena made earlier stays.

    Why (issue 14): glibc gives each thread that allocates while the others hold theirs an
    arena of its own, up to 8 per core, and a freed chunk returns only to its arena; a
    writer's threads (flushes, the compaction round's workers, the publisher's readers)
    each left memory in their own arena, and the arenas' total grew 42 -> 62 MB over 8
    compressed trickle rounds with 40 MB in use throughout; with 2 arenas it stayed at
    39 -> 46 MB (docs/benchmarks.md, "Trickle"). The cost is contention between threads
    allocating at once, which a writer's few threads (most of their memory in Arrow's pool)
    barely see.

    Args:
        arenas: the most arenas (>= 1).

    Returns:
        True when glibc took the setting, False when the C library is not glibc.

    Raises:
        ValueError: ``arenas`` < 1.
    """
    if arenas < 1:
        raise ValueError(f"malloc arenas must be at least 1, got {arenas}")
    mallopt = glibc_function("mallopt")
    return mallopt is not None and mallopt(_M_ARENA_MAX, arenas) == 1


def configure_writer_memory(memory_pool: str = "auto", malloc_arenas: int = WRITER_MALLOC_ARENAS) -> str:
    """Set up the allocators of a process that runs a writer, as ``txlake serve`` does at its
    start (docs/server.md, "Memory"): Arrow's default pool (:func:`use_memory_pool`;
    ``"auto"``: jemalloc when this pyarrow has it, else pyarrow's own choice; ``"default"``:
    pyarrow's own choice, mimalloc) and glibc's arenas (:func:`limit_malloc_arenas`; 0 leaves
    glibc's default of 8 per core). Process-wide: an application embedding the engine sets
    the same through the environment before it starts (``ARROW_DEFAULT_MEMORY_POOL=jemalloc``,
    ``MALLOC_ARENA_MAX=2``).

    Why (issue 14): over an hour of a low-rate producer the writer's RSS grew between
    compaction rounds with nothing alive: mimalloc keeps a heap per thread and gives back
    a page only when the thread that allocated it collects, and glibc's per-thread arenas
    each keep their own free chunks. jemalloc purges its arenas from any thread, after
    :data:`JEMALLOC_DECAY_MS` or at once at each round's end (:func:`~.segment_merge.release_unused_memory`).

    Args:
        memory_pool: ``"auto"``, ``"default"`` or one of :data:`MEMORY_POOL_BACKENDS`.
        malloc_arenas: the most glibc arenas (0: glibc's default).

    Returns:
        What is in effect, for a log line: ``"Arrow memory pool jemalloc, malloc arenas at most 2"``
        (``"glibc's default"`` / ``"not glibc"`` in place of the limit when none was set).

    Raises:
        ValueError: ``memory_pool`` unknown or not built into this pyarrow, ``malloc_arenas`` < 0.
    """
    if malloc_arenas < 0:
        raise ValueError(f"malloc arenas must be at least 1 (0: glibc's default), got {malloc_arenas}")
    if memory_pool == "auto":
        memory_pool = "jemalloc" if "jemalloc" in pa.supported_memory_backends() else "default"
    backend = use_memory_pool(memory_pool) if memory_pool != "default" else pa.default_memory_pool().backend_name
    if malloc_arenas == 0:
        arenas = "glibc's default"
    else:
        arenas = f"at most {malloc_arenas}" if limit_malloc_arenas(malloc_arenas) else "not glibc"
    return f"Arrow memory pool {backend}, malloc arenas {arenas}"


@functools.cache
def bulk_memory_pool() -> pa.MemoryPool:
    """The Arrow pool the engine allocates a bulk load's copies from: the rows of
    ``Producer.produce_arrow`` regrouped by partition (:func:`txlake.producer._split_by_partition`),
    which the application's thread allocates and the flushers free once the batches are
    committed and leave the read cache, and the buffers flushes encode their objects into.
    jemalloc when this pyarrow has it, else the system allocator. It does not change the
    process's default pool or jemalloc's decay (:func:`use_memory_pool` does, for a writer
    process that asks).

    Why (issue 20): in mimalloc, the default, memory one thread allocates and another frees is
    not reused by the allocating thread until it collects, and its idle pages are decommitted
    within milliseconds: each 256 Ki-row slice of a load faulted fresh pages in, which the kernel
    zeroed (in huge pages, 2 MiB per first touch). A 1 M-record load of 100-byte values (8
    partitions, ``benchmarks/bench_produce.py --bulk-only``) took 0.64-0.70 CPU-s with the
    split in mimalloc and 0.45-0.51 with it in jemalloc or the system allocator (5 interleaved
    rounds each; docs/benchmarks.md).

    Returns:
        ``pa.jemalloc_memory_pool()`` or ``pa.system_memory_pool()`` (process-wide singletons).
    """
    if "jemalloc" in pa.supported_memory_backends():
        return pa.jemalloc_memory_pool()
    return pa.system_memory_pool()
