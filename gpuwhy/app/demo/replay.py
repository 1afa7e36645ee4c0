"""Replayed CUDA driver traffic: a CUDA context's start-up ioctls, and how to send them.

The calls of `python -m gpuwhy.app.demo.standin replay`, in CUDA start-up order, with their real
command numbers and parameter structs (version check, card info, GPU attach, RM_ALLOC of
client, device, subdevice, memory, channel group and channel, controls, heap alloc, map
memory, an XFER-wrapped control, frees, UVM initialize / register GPU / external range), and
per "path|cmd|sub" the count, errors and bytes the probe should report for them. Also the
helpers every stand-in program sends its ioctls with: a parameter buffer by pointer, and the
NVOS64 (RM_ALLOC) / NVOS54 (RM_CONTROL) parameter structs.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections import Counter

from gpuwhy.nvioctl import iowr

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
RM_CONTROL = iowr(0x2A, 32)       # NV_ESC_RM_CONTROL with NVOS54_PARAMETERS
RM_ALLOC = iowr(0x2B, 48)         # NV_ESC_RM_ALLOC with NVOS64_PARAMETERS
VERSION = b"595.45.04"
GPU_IDS = (0x100, 0x200)
MiB, GiB = 1 << 20, 1 << 30
NV_ERR_NO_MEMORY = 0x51
DEVICES = ("nvidiactl", "nvidia0", "nvidia-uvm")


def send_ioctl(fd: int, cmd: int, params: bytes | ctypes.Array) -> None:
    """ioctl(fd, cmd, &params), as the driver's clients call it; the result is not looked at
    (on a look-alike file every call fails with ENOTTY)."""
    if not isinstance(params, ctypes.Array):
        params = ctypes.create_string_buffer(params, len(params))
    _LIBC.ioctl(fd, cmd, ctypes.addressof(params))


def rm_control_params(control: int, status: int = 0) -> bytes:
    """NVOS54_PARAMETERS: hClient, hObject, cmd, flags, params, paramsSize, status."""
    return struct.pack("<IIIIQII", 1, 2, control, 0, 0, 0, status)


def rm_alloc_params(h_class: int, pointer: int = 0, status: int = 0) -> bytes:
    """NVOS64_PARAMETERS (>= 535): hRoot, hObjectParent, hObjectNew, hClass, pAllocParms,
    pRightsRequested, paramsSize, flags, status."""
    return struct.pack("<IIIIQQIII4x", 1, 1, 0, h_class, pointer, 0, 0, 0, status)


class Call:
    """One ioctl: the device it goes to, its request, its parameter buffer, and what the
    probe should read back from it (the sub-operation, the bytes)."""

    def __init__(self, device: str, cmd: int, params: bytes, sub: int = 0, nbytes: int = 0,
                 status: int = 0, keep: list | None = None):
        self.device, self.cmd, self.sub, self.bytes, self.status = device, cmd, sub, nbytes, status
        self.buffer = ctypes.create_string_buffer(params, len(params))
        self.keep = keep or []        # buffers this one points to

    def send(self, fds: dict[str, int]) -> None:
        send_ioctl(fds[self.device], self.cmd, self.buffer)


def _alloc(h_class: int, params: ctypes.Array | None = None, status: int = 0,
           nbytes: int = 0) -> Call:
    pointer = ctypes.addressof(params) if params is not None else 0
    return Call("nvidiactl", RM_ALLOC, rm_alloc_params(h_class, pointer, status), sub=h_class,
                nbytes=nbytes, status=status, keep=[params] if params is not None else [])


def script() -> list[Call]:
    """The calls of one round, in CUDA start-up order."""
    memory_params = ctypes.create_string_buffer(128)        # NV_MEMORY_ALLOCATION_PARAMS
    struct.pack_into("<Q", memory_params, 64, 64 * MiB)     # .size
    xfer_inner = ctypes.create_string_buffer(rm_control_params(0x215), 32)   # GPU_ATTACH_IDS
    version = struct.pack("<II64s", 0, 0, VERSION)
    ids = struct.pack("<8I", *GPU_IDS, 0, 0, 0, 0, 0, 0)
    heap = bytearray(184)
    struct.pack_into("<IIIIhxxI", heap, 0, 1, 1, 2, 0, 0, 0)   # function 2 = ALLOC_SIZE
    struct.pack_into("<Q", heap, 88, GiB)
    map_memory = struct.pack("<IIIIQQQII", 1, 2, 7, 0, 0, 2 * MiB, 0, 0, 0) + bytes(8)
    return [
        Call("nvidiactl", iowr(0xD2, 72), version),                       # CHECK_VERSION_STR
        Call("nvidiactl", iowr(0xC8, 72 * 8), bytes(72 * 8)),             # CARD_INFO
        Call("nvidiactl", iowr(0xD4, 32), ids),                           # ATTACH_GPUS_TO_FD
        _alloc(0x41), _alloc(0x80), _alloc(0x2080),                        # client, device, subdev
        _alloc(0x40, memory_params, nbytes=64 * MiB),                      # device memory
        _alloc(0x40, memory_params, status=NV_ERR_NO_MEMORY, nbytes=64 * MiB),
        _alloc(0xA06C), _alloc(0xC86F),                                    # TSG, channel
        Call("nvidiactl", RM_CONTROL, rm_control_params(0x20800102), sub=0x20800102),
        Call("nvidiactl", RM_CONTROL, rm_control_params(0x20801201), sub=0x20801201),
        Call("nvidiactl", RM_CONTROL, rm_control_params(0x20801201), sub=0x20801201),
        Call("nvidiactl", iowr(0x4A, 184), bytes(heap), sub=2, nbytes=GiB),  # VID_HEAP alloc
        Call("nvidiactl", iowr(0x4E, 56), map_memory, nbytes=2 * MiB),     # MAP_MEMORY
        Call("nvidiactl", iowr(0xD3, 16),                                  # XFER(RM_CONTROL)
             struct.pack("<IIQ", 0x2A, 32, ctypes.addressof(xfer_inner)),
             sub=0x215, keep=[xfer_inner]),
        Call("nvidiactl", iowr(0x29, 16), struct.pack("<IIII", 1, 1, 9, 0)),  # RM_FREE
        Call("nvidia0", iowr(0xC9, 4), struct.pack("<i", 3)),              # REGISTER_FD
        Call("nvidia-uvm", 0x30000001, struct.pack("<QI4x", 0, 0)),        # UVM_INITIALIZE
        Call("nvidia-uvm", 37, bytes(40)),                                 # UVM_REGISTER_GPU
        Call("nvidia-uvm", 73, struct.pack("<QQI4x", 1 << 40, 4 * MiB, 0), nbytes=4 * MiB),
    ]


def effective_cmd(call: Call) -> int:
    """What the probe reports as the command: the inner one of an XFER."""
    if call.cmd == iowr(0xD3, 16):   # nv_ioctl_xfer_t: the bare escape number, and its size
        return iowr(*struct.unpack_from("<II", call.buffer.raw, 0))
    return call.cmd


def expected(directory: str, calls: list[Call], times: int) -> dict[str, dict[str, int]]:
    totals: dict[str, Counter] = {}
    for call in calls:
        key = f"{os.path.join(directory, call.device)}|{effective_cmd(call)}|{call.sub}"
        figures = totals.setdefault(key, Counter())
        figures["count"] += times
        figures["errors"] += times        # ENOTTY: every call on a plain file fails
        figures["bytes"] += call.bytes * times
    return {key: dict(c) for key, c in totals.items()}


def create_devices(directory: str) -> dict[str, int]:
    """DIR/nvidiactl, DIR/nvidia0 and DIR/nvidia-uvm, created if missing, opened."""
    return {name: os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                          0o600)
            for name in DEVICES}
