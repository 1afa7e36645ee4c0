"""The CUDA libraries a process has mapped, their build ids, and the functions gpuwhy traces.

:data:`FUNCTIONS` is the one table of traced functions: ``probes/cuda/probe.py`` attaches them and
passes their ids and argument shapes to ``cuda.bpf.c`` (``CUDA_FUNCTIONS``). Libraries are
found in ``/proc/PID/maps`` under any directory (system, conda, or a Python wheel such as
``site-packages/nvidia/cuda_runtime/lib/libcudart.so.12``) and read through
``/proc/PID/root`` so that a containerised process's own copy is the one examined.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

LIBRARY_NAME = re.compile(r"^lib(cuda|cudart)\.so(\.\d+)*$")
NT_GNU_BUILD_ID = 3
SHT_NOTE = 7
PT_NOTE = 4
PT_LOAD = 1
MAX_NOTES_BYTES = 1 << 16


@dataclass(frozen=True)
class CudaFunction:
    """A traced function: ``arg`` is the sync kind, the graph API, or 1 for an async copy."""

    id: int
    name: str
    shape: str
    arg: int = 0
    aliases: tuple[str, ...] = ()

    @property
    def symbols(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


def _table() -> tuple[CudaFunction, ...]:
    rows = [
        ("cuLaunchKernel", "SH_LAUNCH_DRV", 0, ("cuLaunchKernel_ptsz",)),
        ("cuLaunchKernelEx", "SH_LAUNCH_DRV_EX", 0, ("cuLaunchKernelEx_ptsz",)),
        ("cudaLaunchKernel", "SH_LAUNCH_RT", 0, ("cudaLaunchKernel_ptsz",)),
        ("cudaLaunchKernelExC", "SH_LAUNCH_RT_EX", 0, ("cudaLaunchKernelExC_ptsz",)),
        ("cuMemcpyHtoD_v2", "SH_COPY_HTOD", 0, ("cuMemcpyHtoD_v2_ptds",)),
        ("cuMemcpyHtoDAsync_v2", "SH_COPY_HTOD", 1, ("cuMemcpyHtoDAsync_v2_ptsz",)),
        ("cuMemcpyDtoH_v2", "SH_COPY_DTOH", 0, ("cuMemcpyDtoH_v2_ptds",)),
        ("cuMemcpyDtoHAsync_v2", "SH_COPY_DTOH", 1, ("cuMemcpyDtoHAsync_v2_ptsz",)),
        ("cuMemcpyDtoD_v2", "SH_COPY_DTOD", 0, ("cuMemcpyDtoD_v2_ptds",)),
        ("cuMemcpyDtoDAsync_v2", "SH_COPY_DTOD", 1, ("cuMemcpyDtoDAsync_v2_ptsz",)),
        ("cuMemcpy", "SH_COPY_PTR", 0, ("cuMemcpy_ptds",)),
        ("cuMemcpyAsync", "SH_COPY_PTR", 1, ("cuMemcpyAsync_ptsz",)),
        ("cudaMemcpy", "SH_COPY_KIND", 0, ("cudaMemcpy_ptds",)),
        ("cudaMemcpyAsync", "SH_COPY_KIND", 1, ("cudaMemcpyAsync_ptsz",)),
        ("cuStreamSynchronize", "SH_SYNC", 0, ("cuStreamSynchronize_ptsz",)),
        ("cuCtxSynchronize", "SH_SYNC", 1, ()),
        ("cuEventSynchronize", "SH_SYNC", 2, ()),
        ("cudaDeviceSynchronize", "SH_SYNC", 3, ()),
        ("cudaStreamSynchronize", "SH_SYNC", 4, ("cudaStreamSynchronize_ptsz",)),
        ("cudaEventSynchronize", "SH_SYNC", 5, ()),
        ("cuMemAlloc_v2", "SH_ALLOC", 0, ()),
        ("cuMemAllocAsync", "SH_ALLOC", 0, ("cuMemAllocAsync_ptsz",)),
        ("cudaMalloc", "SH_ALLOC", 0, ()),
        ("cudaMallocAsync", "SH_ALLOC", 0, ("cudaMallocAsync_ptsz",)),
        ("cuMemFree_v2", "SH_FREE", 0, ()),
        ("cuMemFreeAsync", "SH_FREE", 0, ("cuMemFreeAsync_ptsz",)),
        ("cudaFree", "SH_FREE", 0, ()),
        ("cudaFreeAsync", "SH_FREE", 0, ("cudaFreeAsync_ptsz",)),
        ("cuMemHostAlloc", "SH_HOST_ALLOC", 0, ()),
        ("cuMemAllocHost_v2", "SH_HOST_ALLOC", 0, ()),
        ("cudaHostAlloc", "SH_HOST_ALLOC", 0, ()),
        ("cudaMallocHost", "SH_HOST_ALLOC", 0, ()),
        ("cuMemHostRegister_v2", "SH_HOST_REGISTER", 0, ("cuMemHostRegister",)),
        ("cudaHostRegister", "SH_HOST_REGISTER", 0, ()),
        ("cuMemFreeHost", "SH_HOST_FREE", 0, ()),
        ("cudaFreeHost", "SH_HOST_FREE", 0, ()),
        ("cuMemHostUnregister", "SH_HOST_FREE", 0, ()),
        ("cudaHostUnregister", "SH_HOST_FREE", 0, ()),
        ("cuGraphLaunch", "SH_GRAPH", 0, ("cuGraphLaunch_ptsz",)),
        ("cudaGraphLaunch", "SH_GRAPH", 1, ("cudaGraphLaunch_ptsz",)),
    ]
    return tuple(CudaFunction(i, name, shape, arg, aliases)
                 for i, (name, shape, arg, aliases) in enumerate(rows))


# Argument lists, one per C signature family (cuda.bpf.c gets them as SH_* cflags).
SHAPES = ("SH_LAUNCH_DRV", "SH_LAUNCH_DRV_EX", "SH_LAUNCH_RT", "SH_LAUNCH_RT_EX", "SH_COPY_HTOD",
          "SH_COPY_DTOH", "SH_COPY_DTOD", "SH_COPY_PTR", "SH_COPY_KIND", "SH_SYNC", "SH_ALLOC",
          "SH_FREE", "SH_HOST_ALLOC", "SH_HOST_REGISTER", "SH_HOST_FREE", "SH_GRAPH")
FUNCTIONS: tuple[CudaFunction, ...] = _table()
BY_SYMBOL: dict[str, CudaFunction] = {s: f for f in FUNCTIONS for s in f.symbols}
SYMBOL_PATTERN = "^(" + "|".join(re.escape(s) for s in BY_SYMBOL) + ")$"


def shape_flags() -> tuple[str, ...]:
    """``-DSH_...=N`` cflags: the argument shapes ``cuda.bpf.c`` switches on."""
    return tuple(f"-D{shape}={i}" for i, shape in enumerate(SHAPES))


def cookie(function: CudaFunction) -> int:
    """What the uprobe of ``function`` tells the BPF programs: id | shape << 8 | arg << 16."""
    return function.id | SHAPES.index(function.shape) << 8 | function.arg << 16


@dataclass(frozen=True)
class MappedLibrary:
    """A CUDA library mapped by a process: ``path`` as the process sees it, ``host_path``
    where this process can read it (through /proc/PID/root)."""

    path: str
    host_path: str
    kind: str            # "cuda" (driver API) or "cudart" (runtime API)


def mapped_files(pid: int, proc_root: str = "/proc") -> list[str]:
    """The files a process has mapped, in order, each once (deleted ones left out)."""
    try:
        text = Path(proc_root, str(pid), "maps").read_text(errors="replace")
    except OSError:
        return []
    files: dict[str, None] = {}
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/") and \
                not fields[5].endswith(" (deleted)"):
            files.setdefault(fields[5])
    return list(files)


def mapped_libraries(pid: int, proc_root: str = "/proc") -> list[MappedLibrary]:
    """The libcuda/libcudart files in the process's memory map; [] when it is gone."""
    found: dict[str, MappedLibrary] = {}
    for path in mapped_files(pid, proc_root):
        match = LIBRARY_NAME.match(path.rsplit("/", 1)[-1])
        if match:
            found[path] = MappedLibrary(path, f"{proc_root}/{pid}/root{path}", match.group(1))
    return list(found.values())


class ElfError(Exception):
    """Not an ELF file we can read."""


def _notes(blob: bytes, little: bool) -> bytes | None:
    """The GNU build id in a run of ELF notes, as hex, or None."""
    order = "<" if little else ">"
    pos = 0
    while pos + 12 <= len(blob):
        namesz, descsz, kind = struct.unpack_from(order + "III", blob, pos)
        name_at = pos + 12
        desc_at = name_at + ((namesz + 3) & ~3)
        name = blob[name_at:name_at + namesz]
        if kind == NT_GNU_BUILD_ID and name == b"GNU\0":
            return blob[desc_at:desc_at + descsz]
        pos = desc_at + ((descsz + 3) & ~3)
    return None


def _entries(f: BinaryIO, header: bytes, sections: bool, wanted: int,
             fields: tuple[tuple[str, int], tuple[str, int]]) -> list[tuple[int, ...]]:
    """Program headers (or section headers) of type ``wanted``: the values ``fields``
    (64-bit and 32-bit layout and position) pick from each."""
    is64, order = header[4] == 2, "<" if header[5] == 1 else ">"
    if is64:
        offsets = struct.unpack_from(order + "QQ", header, 32)
        sizes = struct.unpack_from(order + "HHHH", header, 54)
    else:
        offsets = struct.unpack_from(order + "II", header, 28)
        sizes = struct.unpack_from(order + "HHHH", header, 42)
    start, (entsize, count) = offsets[sections], sizes[2 * sections:2 * sections + 2]
    layout, at = fields[0] if is64 else fields[1]
    found = []
    for i in range(count):
        f.seek(start + i * entsize)
        entry = f.read(entsize)
        if len(entry) == entsize and \
                struct.unpack_from(order + "I", entry, 4 if sections else 0)[0] == wanted:
            found.append(struct.unpack_from(order + layout, entry, at))
    return found


def _open_elf(path: str | Path) -> tuple[BinaryIO, bytes]:
    f = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    header = f.read(64)
    if len(header) < 52 or header[:4] != b"\x7fELF" or header[4] not in (1, 2) \
            or header[5] not in (1, 2):
        f.close()
        raise ElfError(f"{path}: not an ELF file")
    return f, header


def build_id(path: str | Path) -> str | None:
    """The GNU build id (``.note.gnu.build-id``) of an ELF file, in hex; None when it has
    none. Raises :class:`ElfError` for a file that is not a readable ELF object."""
    try:
        f, header = _open_elf(path)
        with f:
            regions = _entries(f, header, False, PT_NOTE,
                               (("QxxxxxxxxxxxxxxxxQ", 8), ("IxxxxxxxxI", 4))) or \
                _entries(f, header, True, SHT_NOTE, (("QQ", 24), ("II", 16)))
            for offset, size in regions:
                f.seek(offset)
                found = _notes(f.read(min(size, MAX_NOTES_BYTES)), header[5] == 1)
                if found:
                    return found.hex()
    except OSError as exc:
        raise ElfError(f"{path}: {exc.strerror}") from None
    except struct.error:
        raise ElfError(f"{path}: truncated ELF headers") from None
    return None


def file_offsets(path: str | Path, addresses: dict[str, int]) -> dict[str, int]:
    """Symbol addresses (st_value) turned into file offsets, what uprobes are placed by,
    through the PT_LOAD segments; symbols outside every segment are left out."""
    try:
        f, header = _open_elf(path)
        with f:
            loads = _entries(f, header, False, PT_LOAD,
                             (("QQxxxxxxxxQ", 8), ("IIxxxxI", 4)))
    except OSError as exc:
        raise ElfError(f"{path}: {exc.strerror}") from None
    except struct.error:
        raise ElfError(f"{path}: truncated ELF headers") from None
    offsets = {}
    for name, address in addresses.items():
        for offset, vaddr, filesz in loads:
            if vaddr <= address < vaddr + filesz:
                offsets[name] = address - vaddr + offset
                break
    return offsets


def parse_allowed(setting: str) -> frozenset[str] | None:
    """``probes.cuda_allowed_build_ids`` as a set of lowercase hex ids; None means any
    (the value ``*``); an empty setting allows none."""
    items = {item.strip().lower() for item in setting.split(",") if item.strip()}
    if "*" in items:
        return None
    return frozenset(items)
