"""nvreplay: replay NVIDIA driver traffic on look-alike device files, for the probe tests.

USAGE: python nvreplay.py DIR [--rounds N] [--hold]

Creates (if missing) DIR/nvidiactl, DIR/nvidia0, DIR/nvidia-uvm, opens them and sends
the ioctl command numbers a CUDA process sends to the real driver (the calls fail with
ENOTTY on ordinary files; the syscall tracepoint fires all the same). Prints one JSON
line with its pid and what it issued per path and command, then, with --hold, waits
for a line on stdin before closing the files and exiting.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
from collections import Counter

from gpuwhy.nvioctl import iowr

# (device file, command, parameter size, times per round): a CUDA context's start-up mix.
SCRIPT = (
    ("nvidiactl", iowr(0xD2, 72), 72, 1),   # NV_ESC_CHECK_VERSION_STR
    ("nvidiactl", iowr(0xC8, 72 * 64), 72 * 64, 1),   # NV_ESC_CARD_INFO, 64 entries
    ("nvidiactl", iowr(0x2B, 48), 48, 7),   # NV_ESC_RM_ALLOC (NVOS64, >= 535)
    ("nvidiactl", iowr(0x2A, 32), 32, 11),  # NV_ESC_RM_CONTROL
    ("nvidiactl", iowr(0x29, 16), 16, 3),   # NV_ESC_RM_FREE
    ("nvidia0", iowr(0xC9, 4), 4, 1),       # NV_ESC_REGISTER_FD
    ("nvidia-uvm", 0x30000001, 16, 1),      # UVM_INITIALIZE
    ("nvidia-uvm", 37, 40, 1),              # UVM_REGISTER_GPU
)


def replay(directory: str, rounds: int) -> dict[str, dict[str, int]]:
    issued: dict[str, Counter[int]] = {}
    fds = {}
    for name in dict.fromkeys(name for name, *_ in SCRIPT):
        path = os.path.join(directory, name)
        fds[name] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    for _ in range(rounds):
        for name, cmd, size, times in SCRIPT:
            for _ in range(times):
                try:
                    fcntl.ioctl(fds[name], cmd, bytes(min(size, 1024)))
                except OSError:
                    pass
                issued.setdefault(os.path.join(directory, name), Counter())[cmd] += 1
    return fds, {path: {str(cmd): n for cmd, n in c.items()} for path, c in issued.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--hold", action="store_true", help="wait for stdin before closing")
    args = parser.parse_args()
    fds, issued = replay(args.directory, args.rounds)
    print(json.dumps({"pid": os.getpid(), "issued": issued}), flush=True)
    if args.hold:
        sys.stdin.readline()
    for fd in fds.values():
        os.close(fd)


if __name__ == "__main__":
    main()
