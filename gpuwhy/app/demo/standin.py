"""Stand-in GPU programs for `gpuwhy demo` and the tests: a training process, `nvidia-smi -r`
and a replay of a CUDA process's driver traffic.

All are real processes that open look-alike device files and send the NVIDIA driver's real
ioctl command numbers and parameter structs (on ordinary files each call fails with ENOTTY;
the probes' tracepoints see them all the same, and the structs are in memory to be read).
Every kernel-log line they write says that it is demo traffic.

    python -m gpuwhy.app.demo.standin train DEV_DIR --minor 0 [--workers N] [--starved]
        [--decode]
    python -m gpuwhy.app.demo.standin nvidia-smi -r -i 0 --dev DEV_DIR --pci P --uuid U \
        [--strike FILE]
    python -m gpuwhy.app.demo.standin replay DIR [--rounds N] [--threads T] [--hold]
    python -m gpuwhy.app.demo.standin replay-recording FILE DIR [--driver-version V] [--hold]

`replay` creates (if missing) DIR/nvidiactl, DIR/nvidia0 and DIR/nvidia-uvm and sends, from
T threads, N rounds of the calls in gpuwhy.app.demo.replay. It prints one JSON line: the pid,
the thread ids, and per "path|cmd|sub" the count, errors and bytes the probe should report;
with --hold, it waits for a line on stdin before closing the files and exiting.
`replay-recording` sends a real CUDA process's calls, as the real-GPU kit recorded them
(gpuwhy.app.demo.recorded), the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import struct
import sys
import threading
import time
from pathlib import Path

from gpuwhy.app.demo.recorded import expected_stats, read_calls
from gpuwhy.app.demo.recorded import replay as replay_calls
from gpuwhy.app.demo.replay import (
    GPU_IDS,
    RM_ALLOC,
    RM_CONTROL,
    VERSION,
    create_devices,
    expected,
    rm_alloc_params,
    rm_control_params,
    script,
    send_ioctl,
)
from gpuwhy.lifeline import ParentGone, die_with_parent, die_with_parent_named_in
from gpuwhy.nvioctl import iowr, parse_driver_version
from gpuwhy.reset import BIF_RESET

DEMO_MARK = "[gpuwhy demo traffic, not a GPU error]"


def _control(fd: int, control: int) -> None:
    send_ioctl(fd, RM_CONTROL, rm_control_params(control))


def _alloc(fd: int, h_class: int) -> None:
    send_ioctl(fd, RM_ALLOC, rm_alloc_params(h_class))


def open_devices(directory: str, minor: int) -> dict[str, int]:
    names = ("nvidiactl", f"nvidia{minor}", "nvidia-uvm")
    return {name: os.open(os.path.join(directory, name), os.O_RDWR | os.O_CLOEXEC)
            for name in names}


def cuda_init(fds: dict[str, int], minor: int) -> None:
    """A CUDA context's start-up: version check, GPU attach, client/device/channel allocs."""
    ctl = fds["nvidiactl"]
    send_ioctl(ctl, iowr(0xD2, 72), struct.pack("<II64s", 0, 0, VERSION))
    send_ioctl(ctl, iowr(0xD4, 32), struct.pack("<8I", 0x100 * (minor + 1), 0, 0, 0, 0, 0, 0, 0))
    for h_class in (0x41, 0x80, 0x2080, 0xA06C, 0xC86F):
        _alloc(ctl, h_class)
    send_ioctl(fds[f"nvidia{minor}"], iowr(0xC9, 4), struct.pack("<i", ctl))


def write_kmsg(lines: list[str]) -> None:
    """Kernel-log lines, each marked as demo traffic."""
    with open("/dev/kmsg", "w") as kmsg:
        for line in lines:
            kmsg.write(f"{line} {DEMO_MARK}\n")
            kmsg.flush()


def train(args: argparse.Namespace) -> None:
    """Hold the device files and keep submitting work until SIGTERM; on SIGUSR1 fail like a
    CUDA program whose GPU vanished (exit status 1)."""
    die_with_parent_named_in()            # started by `gpuwhy demo`: end with it
    fds = open_devices(args.dev, args.minor)
    cuda_init(fds, args.minor)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(0))
    signal.signal(signal.SIGUSR1, lambda *a: stop.append(1))
    workers = []
    trainer = os.getpid()
    for _ in range(args.workers):          # a child must not fork on: it is a worker
        pid = os.fork()
        if pid == 0:                       # a DataLoader-like worker
            try:
                die_with_parent(trainer)   # a killed trainer leaves no worker spinning
            except ParentGone:
                os._exit(0)
            _decoder() if args.decode else _worker(args.dev)
        workers.append(pid)
    print(os.getpid(), flush=True)
    while not stop:
        if args.starved:
            time.sleep(0.05)               # waiting for the input pipeline
        else:
            deadline = time.monotonic() + 0.02
            while time.monotonic() < deadline:
                pass                       # host-side work between launches
        _control(fds["nvidiactl"], 0x20801201)    # a control per step, like a launch sync
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    if stop[0] == 1:
        print("CUDA error: unspecified launch failure (stand-in)", file=sys.stderr)
        os._exit(1)


def _decoder() -> None:
    """A worker that decodes and augments on the CPU, never fast enough: always running."""
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    while True:
        sum(i * i for i in range(10_000))


def _worker(directory: str) -> None:
    """A worker that reads its batches: blocking reads and syncs."""
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    path = Path(directory) / f"batch-{os.getpid()}.bin"
    path.write_bytes(os.urandom(1 << 20))
    while True:
        with open(path, "rb+") as batch:
            os.posix_fadvise(batch.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            batch.read()
            os.fsync(batch.fileno())
        time.sleep(0.01)


def nvidia_smi(args: argparse.Namespace) -> None:
    """`nvidia-smi -r -i N`: attach to the GPU, send NV0080_CTRL_CMD_BIF_RESET, and write the
    NVRM lines a reset leaves (the GPU's UUID as the driver re-initialises it)."""
    if not args.reset:
        print("stand-in nvidia-smi: only -r is implemented", file=sys.stderr)
        sys.exit(2)
    fds = open_devices(args.dev, args.i)
    cuda_init(fds, args.i)
    _control(fds["nvidiactl"], BIF_RESET)
    if args.strike:                        # the simulated GPU resets now, as a real one would
        Path(args.strike).touch()
    time.sleep(0.2)
    write_kmsg([f"NVRM: GPU at PCI:{args.pci}: {args.uuid}"])
    print(f"GPU {args.pci} was successfully reset. (stand-in)")


def replay(args: argparse.Namespace) -> None:
    """Send the replayed CUDA start-up traffic from --threads threads, --rounds times each,
    all starting together; print what the probe should see; with --hold, wait for stdin."""
    fds = create_devices(args.directory)
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


def replay_recording(args: argparse.Namespace) -> None:
    """Send a real process's recorded driver calls (scripts/nvtrace.c) again on look-alike
    files; print the pid and what the probe should report; with --hold, wait for stdin."""
    calls = read_calls(args.recording)
    driver = parse_driver_version(args.driver_version)
    replay_calls(args.directory, calls, driver)
    print(json.dumps({"pid": os.getpid(), "calls": len(calls),
                      "expected": expected_stats(args.directory, calls, driver)}), flush=True)
    if args.hold:
        sys.stdin.readline()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="gpuwhy-standin")
    sub = parser.add_subparsers(dest="program", required=True)
    t = sub.add_parser("train")
    t.add_argument("dev")
    t.add_argument("--minor", type=int, default=0)
    t.add_argument("--workers", type=int, default=0)
    t.add_argument("--starved", action="store_true")
    t.add_argument("--decode", action="store_true", help="CPU-bound workers instead of I/O")
    s = sub.add_parser("nvidia-smi")
    s.add_argument("-r", "--gpu-reset", dest="reset", action="store_true")
    s.add_argument("-i", type=int, default=0)
    s.add_argument("--dev", required=True)
    s.add_argument("--pci", required=True)
    s.add_argument("--uuid", required=True)
    s.add_argument("--mark", default="")
    s.add_argument("--strike", default="", help="file that makes the simulator's GPU reset")
    r = sub.add_parser("replay", help="replay a CUDA process's driver traffic")
    r.add_argument("directory")
    r.add_argument("--rounds", type=int, default=1)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--hold", action="store_true", help="wait for stdin before closing")
    rr = sub.add_parser("replay-recording", help="replay a real process's recorded calls")
    rr.add_argument("recording")
    rr.add_argument("directory")
    rr.add_argument("--driver-version", default="", help="the recording host's driver")
    rr.add_argument("--hold", action="store_true", help="wait for stdin before exiting")
    args = parser.parse_args(argv)
    {"train": train, "nvidia-smi": nvidia_smi, "replay": replay,
     "replay-recording": replay_recording}[args.program](args)


if __name__ == "__main__":
    main()
