"""Drop what only loading needed once a bcc program is attached: its LLVM module and the
compiler's code pages.

bcc keeps each program's compiled LLVM module (and the JIT that formats keys as text) for
as long as the program lives, though the probes never compile again: about 6.6 MB of
anonymous memory for fdtrack, lifecycle, sched and printk together (scripts/bench_sidecar.py).
Freeing the module closes the maps' fds it holds, so every table is first taken (and its
fd duplicated) while the module still describes it; the attached programs keep their maps
alive in the kernel either way. LLVM's and clang's code, read once to compile, then stays
mapped for nothing: its clean pages are dropped from this process (about 85 MB of RSS);
they come back from the file if anything runs them again.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
from typing import Any

log = logging.getLogger(__name__)

MADV_DONTNEED = 4
# Libraries whose code only compiling runs (bcc's own libbcc stays: it polls and reads maps).
COMPILER_LIBRARIES = re.compile(r"/lib(LLVM|clang)[^/]*\.so[^/]*$")


class ReleasedModuleError(RuntimeError):
    """A table was asked for after its program's module was released."""


def _libbcc() -> ctypes.CDLL:
    # Our own handle: argtypes set here must not change bcc's.
    lib = ctypes.CDLL("libbcc.so.0")
    lib.bpf_num_tables.restype = ctypes.c_size_t
    lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
    lib.bpf_table_name.restype = ctypes.c_char_p
    lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.bpf_module_destroy.restype = None
    lib.bpf_module_destroy.argtypes = [ctypes.c_void_p]
    return lib


def release_module(bpf: Any) -> list[int]:
    """Free ``bpf``'s LLVM module, keeping every table usable; returns the fds now owned
    by its tables (closed by ``close_released``). Later ``bpf[name]`` for a table not
    taken here raises ReleasedModuleError instead of reaching a freed module."""
    from bcc.table import _get_event_class  # what RingBuf.event() would ask the module

    if not bpf.module:
        return []
    lib = _libbcc()
    names = [lib.bpf_table_name(bpf.module, i) for i in range(lib.bpf_num_tables(bpf.module))]
    tables = []
    for name in names:
        try:
            tables.append(bpf[name])
        except Exception:   # noqa: BLE001 - bcc's bare Exception: a type Python cannot read
            continue        # (task storage): only the programs use it, and they hold it
    for table in tables:
        if getattr(table, "_event_class", False) is None:
            table._event_class = _get_event_class(table)
    kept: list[int] = []
    for table in tables:
        table.map_fd = os.dup(table.map_fd)
        kept.append(table.map_fd)
    lib.bpf_module_destroy(bpf.module)
    bpf.module = None

    def released(name: bytes, *args: Any, **kwargs: Any) -> Any:
        raise ReleasedModuleError(f"table {name!r} was not taken before the module was "
                                  "released")
    bpf.get_table = released
    return kept


def close_released(fds: list[int]) -> None:
    """Close the table fds ``release_module`` handed over."""
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def drop_compiler_pages(smaps: str = "/proc/self/smaps") -> int:
    """Drop this process's clean pages of LLVM's and clang's read-only mappings; returns
    the kB dropped. A mapping with any anonymous (written) page is left alone: dropping it
    would undo what the loader relocated; a read-only clean page is the file's own and
    comes back from it when touched."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped = 0
    for start, end, perms, rss, anonymous in _mappings(smaps):
        if "w" in perms or anonymous or not rss:
            continue
        if libc.madvise(start, end - start, MADV_DONTNEED) == 0:
            dropped += rss
        else:
            log.debug("madvise %x-%x: %s", start, end, os.strerror(ctypes.get_errno()))
    return dropped


def _mappings(smaps: str) -> list[tuple[int, int, str, int, int]]:
    """(start, end, perms, Rss kB, Anonymous kB) of each compiler-library mapping."""
    found: list[list] = []
    current: list | None = None
    with open(smaps) as text:
        for line in text:
            head = line.split(maxsplit=6)
            if not head[0].endswith(":"):               # a mapping's header line
                current = None
                if len(head) >= 6 and COMPILER_LIBRARIES.search(head[-1].strip()):
                    start, end = (int(x, 16) for x in head[0].split("-"))
                    current = [start, end, head[1], 0, 0]
                    found.append(current)
            elif current is not None and head[0] in ("Rss:", "Anonymous:"):
                current[3 if head[0] == "Rss:" else 4] = int(head[1])
    return [tuple(mapping) for mapping in found]
