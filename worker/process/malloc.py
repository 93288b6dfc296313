"""A worker process keeps the memory its builds free, instead of handing it back to the kernel after every build.

glibc's malloc serves a large allocation with its own mmap and unmaps it when freed, and gives the top of the heap
back past a trim threshold (both adjusted as the process goes). A build allocates and frees tens of megabytes of
weights and plans every time, so each build in a worker's pool process would touch every page afresh, tens of
thousands of page faults, and the builder would run slower in the worker than in a plain process. With both
thresholds at ``keep_mib``, allocations under it come from the heap and freed memory stays in the process up to that
much: the builds fault almost never. The cost is that much resident memory kept between builds. Set before the pool
processes fork, which inherit it.

An API process, whose threads (the server's pool, the resolve threads) allocate and free small objects all day,
is limited to a few malloc arenas instead (``limit_arenas``): glibc gives each thread that contends for one an arena
of its own, up to eight per core, and memory freed into one arena serves only that arena, so a long-lived threaded
process's resident memory creeps up while what it holds stays flat.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def mallopt(*settings: tuple[int, int]) -> bool:
    """glibc's ``mallopt`` for each (option, value); False where one cannot be set (another C library)."""
    try:
        call = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        log.info("malloc settings left as they are: no glibc mallopt here")
        return False
    return all(bool(call(option, value)) for option, value in settings)


def keep_freed_memory(keep_mib: int) -> bool:
    """Set glibc's mmap and trim thresholds to ``keep_mib`` MiB; False where that cannot be done (0: glibc's own
    dynamic thresholds; another C library)."""
    if keep_mib <= 0:
        return False
    size = min(keep_mib, 2047) << 20  # mallopt's value is a C int
    return mallopt((M_MMAP_THRESHOLD, size), (M_TRIM_THRESHOLD, size))


def limit_arenas(arenas: int) -> bool:
    """At most ``arenas`` malloc arenas in this process (0: glibc's own limit, eight per core); set before its
    threads start."""
    return arenas > 0 and mallopt((M_ARENA_MAX, arenas))
