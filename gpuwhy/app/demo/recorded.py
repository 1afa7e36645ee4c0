"""A real process's NVIDIA driver calls as the kit's recorder kept them: read, decode, replay.

``scripts/nvtrace.c`` (preloaded into the real-GPU kit's PyTorch load only; gpuwhy never
preloads anything into the processes it watches) writes each ioctl sent to an NVIDIA device
with its parameter bytes before and after the driver saw them, and the buffers they point
to. Here:

- :func:`read_calls` reads such a file (a :class:`RecordingError` says what is wrong with
  a damaged one);
- :func:`pointer_rules` is the recorder's ``NVTRACE_PTRS``: which pointers to follow, from
  gpuwhy.nvioctl's tables;
- :func:`decode` reads a call the way ``probes/fdtrack.bpf.c`` does, in Python, with the
  same tables: what the probe should report for it;
- :func:`replay` sends the recorded calls again on look-alike device files, each buffer as
  the probe saw it on the GPU host, so that the real probe can be checked against
  :func:`decode`.
"""

from __future__ import annotations

import ctypes
import gzip
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpuwhy.app.demo.replay import send_ioctl
from gpuwhy.identity import classify_device
from gpuwhy.nvioctl import (
    ALLOC_PARAMS_SIZE_OFFSET,
    F_ALLOC_PARAMS,
    F_BYTES_ARG1,
    F_HEAP_ALLOC,
    F_LIMIT_ARG1,
    F_SUB_ARG0,
    F_XFER,
    FRONTEND_DECODE,
    HEAP_ALLOC_FUNCTIONS,
    MEMORY_CLASSES,
    NV_IOCTL_MAGIC,
    Decode,
    ioctl_name,
    iowr,
    uvm_decode,
)

MAGIC = b"NVTRACE1"
_HEAD = struct.Struct("<IIQQQIiIIii64s")
_BUF = struct.Struct("<IIQII")
TOP = 0xFFFFFFFF
NESTED = 0x80000000

# nv_ioctl_xfer_t (nv-ioctl.h): {NvU32 cmd (the escape number); NvU32 size; NvP64 ptr}.
XFER_SIZE_OFFSET, XFER_PTR_OFFSET = 4, 8
# How much of an allocation's parameters to keep: past NV_MEMORY_ALLOCATION_PARAMS.size.
ALLOC_PARAMS_KEPT = 256


class RecordingError(ValueError):
    """The file is not a complete nvtrace recording."""


@dataclass
class Buffer:
    """One parameter buffer of a call: the call's own (``parent`` None), or one it points to
    at ``offset`` in its parent; ``nested`` for a wrapped call's parameters (XFER)."""

    parent: int | None
    offset: int
    nested: bool
    address: int
    wanted: int
    before: bytes
    after: bytes


@dataclass
class RecordedCall:
    realtime_ns: int
    duration_ns: int
    request: int
    tid: int
    fd: int
    major: int
    minor: int
    ret: int
    errno: int
    path: str
    buffers: list[Buffer] = field(default_factory=list)

    @property
    def device(self) -> str:
        """The device kind (``nvidiactl``, ``nvidiaN``, ``nvidia-uvm``...)."""
        return classify_device(self.path)[0]


def read_calls(path: str | Path) -> list[RecordedCall]:
    """Every call in a recording (plain or gzipped), in the order written."""
    data = Path(path).read_bytes()
    if data.startswith(b"\x1f\x8b"):   # gzipped, as fixtures keep them
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise RecordingError(f"{path}: a damaged gzip file: {exc}") from None
    if not data.startswith(MAGIC):
        raise RecordingError(f"{path}: not an nvtrace recording (no {MAGIC!r} header)")
    calls, at = [], len(MAGIC)
    while at < len(data):
        if at + _HEAD.size > len(data):
            raise RecordingError(f"{path}: a record cut short at byte {at}")
        (length, nbufs, realtime, duration, request, tid, fd, major, minor, ret, err,
         raw_path) = _HEAD.unpack_from(data, at)
        end = at + length
        if length < _HEAD.size or end > len(data):
            raise RecordingError(f"{path}: record at byte {at} claims {length} bytes")
        call = RecordedCall(realtime, duration, request, tid, fd, major, minor, ret, err,
                            raw_path.split(b"\0", 1)[0].decode(errors="replace"))
        p = at + _HEAD.size
        for _ in range(nbufs):
            if p + _BUF.size > end:
                raise RecordingError(f"{path}: record at byte {at}: buffers run past it")
            parent, offset, address, wanted, got = _BUF.unpack_from(data, p)
            p += _BUF.size
            if p + 2 * got > end:
                raise RecordingError(f"{path}: record at byte {at}: buffer bytes run past it")
            call.buffers.append(Buffer(None if parent == TOP else parent, offset & ~NESTED,
                                       bool(offset & NESTED), address, wanted,
                                       data[p:p + got], data[p + got:p + 2 * got]))
            p += (2 * got + 7) & ~7
        calls.append(call)
        at = end
    return calls


def pointer_rules() -> str:
    """The recorder's NVTRACE_PTRS: the allocation parameters an RM_ALLOC points to, and the
    wrapped call of an XFER, as the probe's decode tables name them."""
    rules = []
    for (nr, size), spec in sorted(FRONTEND_DECODE.items()):
        if spec.flags & F_ALLOC_PARAMS:
            rules.append(f"{nr},{size},{spec.arg1[0]},-1,{ALLOC_PARAMS_KEPT},0")
        if spec.flags & F_XFER:
            rules.append(f"{nr},{size},{XFER_PTR_OFFSET},{XFER_SIZE_OFFSET},0,1")
    return ";".join(rules)


def find_decode(frontend: bool, code: int, size: int,
                driver: tuple[int, ...] | None = None) -> Decode | None:
    """The decode entry the probe picks: the exact size's, else the any-size one; a UVM
    command's as driver ``driver`` lays it out."""
    if not frontend:
        return uvm_decode(driver).get(code)
    return FRONTEND_DECODE.get((code, size)) or FRONTEND_DECODE.get((code, 0))


def _field(blob: bytes, where: tuple[int, int]) -> int:
    offset, length = where
    if offset < 0 or offset + length > len(blob):
        return 0
    return int.from_bytes(blob[offset:offset + length], "little")


@dataclass(frozen=True)
class Decoded:
    """What the probe reports for a call: the effective command (the wrapped one of an
    XFER), its name on the device, the sub-operation, the RM status, the bytes."""

    cmd: int
    name: str
    known: bool
    sub: int
    status: int | None
    nbytes: int
    xferred: bool


def _effective(call: RecordedCall, driver: tuple[int, ...] | None
               ) -> tuple[int, Decode | None, int | None, bool]:
    """The command the probe reports (the wrapped one of an XFER), its decode entry, the
    index of the buffer that holds its parameters, and whether it was unwrapped."""
    cmd = call.request & 0xFFFFFFFF
    frontend = (cmd >> 8) & 0xFF == NV_IOCTL_MAGIC
    nr, size = (cmd & 0xFF, (cmd >> 16) & 0x3FFF) if frontend else (cmd, 0)
    index = 0 if call.buffers else None
    spec = find_decode(frontend, nr, size, driver)
    xferred = bool(spec and spec.flags & F_XFER)
    if xferred:
        wrapper = call.buffers[0].before if call.buffers else b""
        nr = _field(wrapper, (0, 4)) & 0xFF
        size = _field(wrapper, (XFER_SIZE_OFFSET, 4))
        cmd = iowr(nr, size)
        index = next((i for i, b in enumerate(call.buffers) if b.nested), None)
        spec = find_decode(True, nr, size)
    return cmd, spec, index, xferred


def _alloc_params(call: RecordedCall, spec: Decode, index: int | None) -> int | None:
    """The index of the allocation parameters an RM_ALLOC's ``pAllocParms`` points to."""
    return next((i for i, b in enumerate(call.buffers) if index is not None
                 and b.parent == index and not b.nested and b.offset == spec.arg1[0]), None)


def decode(call: RecordedCall, driver: tuple[int, ...] | None = None) -> Decoded:
    """``probes/fdtrack.bpf.c``'s reading of a call, with the same tables (for a driver of
    version ``driver``): arguments from the bytes before the call (the probe reads them
    on entry), the status and the allocation size from those after (read on exit)."""
    cmd, spec, index, xferred = _effective(call, driver)
    params = call.buffers[index] if index is not None else Buffer(None, 0, False, 0, 0, b"",
                                                                  b"")
    sub = nbytes = 0
    status = None
    if spec:
        arg0, arg1 = _field(params.before, spec.arg0), _field(params.before, spec.arg1)
        if spec.status >= 0 and spec.status + 4 <= len(params.after):
            status = _field(params.after, (spec.status, 4))
        if spec.flags & F_SUB_ARG0:
            sub = arg0 & 0xFFFFFFFF
        if spec.flags & F_BYTES_ARG1:
            nbytes = arg1
        if spec.flags & F_LIMIT_ARG1:
            nbytes = arg1 + 1
        if spec.flags & F_HEAP_ALLOC and arg0 in HEAP_ALLOC_FUNCTIONS:
            nbytes = arg1
        if spec.flags & F_ALLOC_PARAMS and arg0 in MEMORY_CLASSES:
            pointed = _alloc_params(call, spec, index)
            nbytes = (_field(call.buffers[pointed].after, (ALLOC_PARAMS_SIZE_OFFSET, 8))
                      if pointed is not None else 0)
    return Decoded(cmd, ioctl_name(cmd, call.device), spec is not None, sub, status, nbytes,
                   xferred)


def replay_bytes(call: RecordedCall, driver: tuple[int, ...] | None = None) -> list[bytes]:
    """What each buffer holds when the call is sent again: the bytes the driver was given,
    with what the probe reads on exit (the status, an allocation's size) as the driver left
    it. The driver writes outputs over inputs (a root client's class comes back as
    NV01_ROOT_CLIENT), so neither the bytes before nor those after alone would show the
    probe what it saw on the GPU host."""
    data = [bytearray(b.before) for b in call.buffers]
    _, spec, index, _ = _effective(call, driver)
    if spec and index is not None:
        after = call.buffers[index].after
        if spec.status >= 0 and spec.status + 4 <= len(after):
            data[index][spec.status:spec.status + 4] = after[spec.status:spec.status + 4]
        if spec.flags & F_ALLOC_PARAMS:
            pointed = _alloc_params(call, spec, index)
            if pointed is not None:
                data[pointed] = bytearray(call.buffers[pointed].after)
    return [bytes(d) for d in data]


def _look_alike(call: RecordedCall) -> str:
    """The look-alike file a call goes to: its device file's name."""
    return os.path.basename(call.path) or "nvidiactl"


def expected_stats(directory: str, calls: list[RecordedCall],
                   driver: tuple[int, ...] | None = None) -> dict[str, dict[str, int]]:
    """Per "path|cmd|sub", the count, errors and bytes the probe should report for the calls
    replayed on look-alike files in ``directory`` (each fails there with ENOTTY)."""
    totals: dict[str, Counter] = {}
    for call in calls:
        d = decode(call, driver)
        key = f"{os.path.join(directory, _look_alike(call))}|{d.cmd}|{d.sub}"
        figures = totals.setdefault(key, Counter())
        figures["count"] += 1
        figures["errors"] += 1
        figures["bytes"] += d.nbytes
    return {key: dict(c) for key, c in totals.items()}


def _buffers(call: RecordedCall, driver: tuple[int, ...] | None) -> list[ctypes.Array]:
    """The call's buffers in memory (:func:`replay_bytes`), each pointer field set to where
    its buffer now is."""
    made = [ctypes.create_string_buffer(data, max(len(data), b.wanted, 1))
            for b, data in zip(call.buffers, replay_bytes(call, driver), strict=True)]
    for b, buffer in zip(call.buffers, made, strict=True):
        if b.parent is not None and b.offset + 8 <= len(made[b.parent]):
            struct.pack_into("<Q", made[b.parent], b.offset, ctypes.addressof(buffer))
    return made


def replay(directory: str, calls: list[RecordedCall],
           driver: tuple[int, ...] | None = None) -> None:
    """Send each recorded call again on look-alike files in ``directory``, created if
    missing, its buffers as :func:`replay_bytes` fills them."""
    fds: dict[str, int] = {}
    try:
        for call in calls:
            name = _look_alike(call)
            if name not in fds:
                fds[name] = os.open(os.path.join(directory, name),
                                    os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            made = _buffers(call, driver)
            if made:
                send_ioctl(fds[name], call.request & 0xFFFFFFFF, made[0])
    finally:
        for fd in fds.values():
            os.close(fd)
