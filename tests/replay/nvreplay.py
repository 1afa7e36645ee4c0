"""nvreplay: replay a CUDA process's driver traffic on look-alike device files.

USAGE: python nvreplay.py DIR [--rounds N] [--threads T] [--hold] [--fork]

Creates (if missing) DIR/nvidiactl, DIR/nvidia0 and DIR/nvidia-uvm, opens them and sends,
from T threads, the ioctls of a CUDA context's start-up with their real command numbers
and parameter structs (version check, card info, GPU attach, RM_ALLOC of client, device,
subdevice, memory, channel group and channel, controls, heap alloc, map memory, an
XFER-wrapped control, frees, UVM initialize / register GPU / external range). On ordinary
files each call fails with ENOTTY, but the syscall tracepoints fire all the same and the
structs are in memory to be read. Prints one JSON line: the pid, the thread ids, and per
"path|cmd|sub" the count, errors and bytes the probe should report; with --hold, waits for
a line on stdin before closing the files and exiting.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import sys
import threading
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))   # the repo, for `python tests/replay/nvreplay.py` from anywhere
from gpuwhy.nvioctl import iowr  # noqa: E402

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.ioctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)
VERSION = b"595.45.04"
GPU_IDS = (0x100, 0x200)
MiB, GiB = 1 << 20, 1 << 30
NV_ERR_NO_MEMORY = 0x51


class Call:
    """One ioctl: the device it goes to, its request, its parameter buffer, and what the
    probe should read back from it (the sub-operation, the bytes)."""

    def __init__(self, device: str, cmd: int, params: bytes, sub: int = 0, nbytes: int = 0,
                 status: int = 0, keep: list | None = None):
        self.device, self.cmd, self.sub, self.bytes, self.status = device, cmd, sub, nbytes, status
        self.buffer = ctypes.create_string_buffer(params, len(params))
        self.keep = keep or []        # buffers this one points to

    def send(self, fds: dict[str, int]) -> None:
        LIBC.ioctl(fds[self.device], self.cmd, ctypes.addressof(self.buffer))


def _alloc(h_class: int, params: ctypes.Array | None = None, status: int = 0,
           nbytes: int = 0) -> Call:
    pointer = ctypes.addressof(params) if params is not None else 0
    # NVOS64 (>= 535): hRoot, hObjectParent, hObjectNew, hClass, pAllocParms,
    # pRightsRequested, paramsSize, flags, status
    body = struct.pack("<IIIIQQIII4x", 1, 1, 0, h_class, pointer, 0, 0, 0, status)
    return Call("nvidiactl", iowr(0x2B, 48), body, sub=h_class, nbytes=nbytes, status=status,
                keep=[params] if params is not None else [])


def _control(cmd: int, status: int = 0) -> bytes:
    # NVOS54: hClient, hObject, cmd, flags, params, paramsSize, status
    return struct.pack("<IIIIQII", 1, 2, cmd, 0, 0, 0, status)


def script() -> list[Call]:
    """The calls of one round, in CUDA start-up order."""
    memory_params = ctypes.create_string_buffer(128)        # NV_MEMORY_ALLOCATION_PARAMS
    struct.pack_into("<Q", memory_params, 64, 64 * MiB)     # .size
    xfer_inner = ctypes.create_string_buffer(_control(0x215), 32)   # GPU_ATTACH_IDS
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
        Call("nvidiactl", iowr(0x2A, 32), _control(0x20800102), sub=0x20800102),
        Call("nvidiactl", iowr(0x2A, 32), _control(0x20801201), sub=0x20801201),
        Call("nvidiactl", iowr(0x2A, 32), _control(0x20801201), sub=0x20801201),
        Call("nvidiactl", iowr(0x4A, 184), bytes(heap), sub=2, nbytes=GiB),  # VID_HEAP alloc
        Call("nvidiactl", iowr(0x4E, 56), map_memory, nbytes=2 * MiB),     # MAP_MEMORY
        Call("nvidiactl", iowr(0xD3, 16),                                  # XFER(RM_CONTROL)
             struct.pack("<IIQ", iowr(0x2A, 32), 32, ctypes.addressof(xfer_inner)),
             sub=0x215, keep=[xfer_inner]),
        Call("nvidiactl", iowr(0x29, 16), struct.pack("<IIII", 1, 1, 9, 0)),  # RM_FREE
        Call("nvidia0", iowr(0xC9, 4), struct.pack("<i", 3)),              # REGISTER_FD
        Call("nvidia-uvm", 0x30000001, struct.pack("<QI4x", 0, 0)),        # UVM_INITIALIZE
        Call("nvidia-uvm", 37, bytes(40)),                                 # UVM_REGISTER_GPU
        Call("nvidia-uvm", 73, struct.pack("<QQI4x", 1 << 40, 4 * MiB, 0), nbytes=4 * MiB),
    ]


def effective_cmd(call: Call) -> int:
    """What the probe reports as the command: the inner one of an XFER."""
    if call.cmd == iowr(0xD3, 16):
        return struct.unpack_from("<I", call.buffer.raw, 0)[0]
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


def open_devices(directory: str) -> dict[str, int]:
    return {name: os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                          0o600)
            for name in ("nvidiactl", "nvidia0", "nvidia-uvm")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hold", action="store_true", help="wait for stdin before closing")
    args = parser.parse_args()
    fds = open_devices(args.directory)
    calls = script()
    tids: list[int] = []
    barrier = threading.Barrier(args.threads)

    def worker() -> None:
        tids.append(threading.get_native_id())
        barrier.wait()
        for _ in range(args.rounds):
            for call in calls:
                call.send(fds)

    threads = [threading.Thread(target=worker) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"pid": os.getpid(), "tids": sorted(tids), "version": VERSION.decode(),
                      "gpu_ids": list(GPU_IDS),
                      "expected": expected(args.directory, calls, args.rounds * args.threads)}),
          flush=True)
    if args.hold:
        sys.stdin.readline()
    for fd in fds.values():
        os.close(fd)


if __name__ == "__main__":
    main()
