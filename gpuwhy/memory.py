"""How gpuwhy's long-running processes keep their heap small: few glibc arenas, and freed
heap given back to the kernel after start-up."""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_ARENA_MAX = -8        # glibc's mallopt() parameter number
MALLOC_ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:                      # not glibc: nothing to tune
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas; call before starting threads. glibc gives every thread
    that allocates its own arena, up to 8 a core, each keeping what it once held: the
    service's 40-odd threads (mostly the web server's idle workers) kept 5 MB that way,
    for allocations the GIL serialises anyway."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1)


def release_freed_memory() -> None:
    """Give the heap that start-up freed back to the kernel: glibc keeps it otherwise
    (measured by scripts/bench_sidecar.py: about 76 -> 33 MB anonymous for the probes)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
