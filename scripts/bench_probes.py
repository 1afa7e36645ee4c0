#!/usr/bin/env python3
"""bench_probes: what the eBPF probes cost the host, side by side with no probes and strace.

USAGE: sudo .venv/bin/python scripts/bench_probes.py [--repeat 5] [--json FILE] [--device PATH]

Measures, with a small C program (scripts/bench_probes.c, compiled here):
  - ns per ioctl on a tracked device fd (a look-alike file matched by the device glob),
  - ns per ioctl on an untracked fd (a file the glob does not match),
  - ns per getppid() (any other syscall on the host),
  - ns per round trip of a pipe ping-pong between two GPU processes, with 10 tracked
    processes in all (context-switch cost with the scheduler probe watching them), and
    between two other processes (what every process on the host pays for the probes'
    scheduler and syscall tracepoints). Both sides run on one CPU: across CPUs a round
    trip is mostly the wake-up's inter-processor interrupt (43 µs on a VM, 12 µs on a GPU
    host), which hides a switch's cost; on one it is two switches and four syscalls (~5 µs);
in four setups: no probes; `gpuwhy probes` attached (fdtrack + lifecycle + sched, the
service's real configuration); for the ping-pongs, the floor: a bare program on each
tracepoint the probes attach (bench_attach.py), what any probe there costs;
`strace -f -e trace=ioctl` (the intrusive reference, only for the ioctl rows, where strace
is installed). With --device /dev/nvidiactl on a host with
the NVIDIA driver, the tracked call is a real one (an RM control that succeeds, on a client
of its own) and the driver's time is in every figure (the GPU kit runs it so). Each figure
is the median of --repeat runs, measured with kernel.bpf_stats_enabled off (restored
afterwards). Prints a markdown table and, with --json, writes the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from gpuwhy.probes.fdtrack import BPF_STATS_SYSCTL as STATS_SYSCTL

HERE = Path(__file__).resolve().parent
GOALS = {"tracked ioctl": 400, "untracked ioctl": 150, "getppid": 50}


@contextlib.contextmanager
def bpf_stats(enabled: bool) -> Iterator[None]:
    """Run with kernel.bpf_stats_enabled as asked, restoring it afterwards: when it is on,
    the kernel times every BPF program run (two clock reads each, 60-80 ns per program
    here), which is the host's choice, not the probes' cost."""
    before = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1" if enabled else "0")
    try:
        yield
    finally:
        STATS_SYSCTL.write_text(before)


def compile_bench(workdir: Path) -> Path:
    """scripts/bench_probes.c built here, or the build named by $GPUWHY_BENCH_BIN (the GPU
    kit carries one: the GPU host may have no gcc)."""
    prebuilt = os.environ.get("GPUWHY_BENCH_BIN")
    if prebuilt:
        return Path(prebuilt)
    binary = workdir / "bench_probes"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "bench_probes.c")], check=True)
    return binary


PINGPONGS = ("ping-pong round trip", "ping-pong round trip, other processes")


def one_cpu() -> str:
    """The CPU a ping-pong runs on: the first $GPUWHY_BENCH_CPUS names, else the last this
    process may use (CPU 0 takes more of a host's interrupts)."""
    cpus = os.environ.get("GPUWHY_BENCH_CPUS")
    if cpus:
        return cpus.split(",")[0].split("-")[0]
    return str(max(os.sched_getaffinity(0)))


def measure(command: list[str], repeat: int, cpus: str | None = None) -> list[float]:
    """The figure the program prints, once per run; on ``cpus``, else the CPUs
    $GPUWHY_BENCH_CPUS names (taskset's list), where set: a many-CPU host otherwise places
    each run where it likes, and the runs fall into groups by placement (seen on a 16-vCPU
    GPU host)."""
    cpus = cpus or os.environ.get("GPUWHY_BENCH_CPUS")
    if cpus:
        command = ["taskset", "-c", cpus, *command]
    values = []
    for _ in range(repeat):
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        values.append(float(out.split()[-1]))
    return values


class ProbesRunning:
    """`gpuwhy probes` in the background, publishing to a bus nobody reads."""

    def __init__(self, workdir: Path, device_glob: str):
        env = {**os.environ, "GPUWHY_DEVICE_GLOB": device_glob,
               "GPUWHY_BUS": f"ipc://{workdir}/bench-bus.sock", "GPUWHY_LOG_LEVEL": "info"}
        self.proc = subprocess.Popen([sys.executable, "-m", "gpuwhy", "probes"], env=env,
                                     stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:
            if "start-up scan" in line:
                break
        time.sleep(1.0)        # lifecycle and sched load right after the scan

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def run(repeat: int, n_ioctl: int = 1_000_000, n_pingpong: int = 100_000,
        device: str | None = None) -> dict:
    """{figure: {setup: median ns, setup_runs: [ns of each run]}}, setups none, probes,
    floor (the ping-pongs only), strace (the ioctl rows only, where installed).
    ``device``: a real NVIDIA control device, traced under the glob of its folder, instead
    of a look-alike file."""
    import bench_attach

    with tempfile.TemporaryDirectory() as tmp, bpf_stats(False):
        workdir = Path(tmp)
        bench = str(compile_bench(workdir))
        untracked = str(workdir / "plain-file")
        Path(untracked).touch()
        if device:
            tracked, glob, traced = device, f"{Path(device).parent}/nvidia*", "rmcontrol"
        else:
            devices = workdir / "dev"
            devices.mkdir()
            tracked, glob, traced = str(devices / "nvidiactl"), f"{devices}/nvidia*", "ioctl"
            Path(tracked).touch()
        cases = {
            "tracked ioctl": [bench, traced, tracked, str(n_ioctl)],
            "untracked ioctl": [bench, "ioctl", untracked, str(n_ioctl)],
            "getppid": [bench, "getppid", str(3 * n_ioctl)],
            "ping-pong round trip": [bench, "pingpong", str(n_pingpong), tracked],
            "ping-pong round trip, other processes": [bench, "pingpong", str(n_pingpong)],
        }
        results: dict[str, dict] = {name: {} for name in cases}
        pinned = {name: one_cpu() if name in PINGPONGS else None for name in cases}

        def record(name: str, setup: str, runs: list[float]) -> None:
            results[name][setup] = statistics.median(runs)
            results[name][f"{setup}_runs"] = runs

        for name, command in cases.items():
            record(name, "none", measure(command, repeat, pinned[name]))
        # 8 more GPU processes, idle, so that 10 are tracked during the ping-pong
        idle = [subprocess.Popen(["python3", "-c", f"import os,time; os.open('{tracked}', "
                                  "os.O_RDWR); time.sleep(3600)"]) for _ in range(8)]
        probes = ProbesRunning(workdir, glob)
        try:
            for name, command in cases.items():
                record(name, "probes", measure(command, repeat, pinned[name]))
        finally:
            probes.stop()
            for proc in idle:
                proc.kill()
        floor = bench_attach.attach_probes_floor()
        try:
            time.sleep(0.2)
            for name in PINGPONGS:
                record(name, "floor", measure(cases[name], repeat, pinned[name]))
        finally:
            floor.cleanup()
        for name in ("tracked ioctl", "untracked ioctl") if shutil.which("strace") else ():
            # strace stops the process twice per call (~0.5 ms): a fiftieth of the calls
            # gives the same per-call figure in seconds instead of minutes
            fewer = [*cases[name][:-1], str(max(1000, n_ioctl // 50))]
            record(name, "strace", measure(
                ["strace", "-f", "-qq", "-e", "trace=ioctl", "-o", "/dev/null", *fewer],
                max(1, repeat // 2)))
        return results


def table(results: dict) -> str:
    lines = ["| figure (ns) | no probes | gpuwhy probes | added | goal (added) | strace -f "
             "| strace added |", "|---|---|---|---|---|---|---|"]
    for name, figures in results.items():
        base, probes = figures["none"], figures["probes"]
        added = probes - base
        if name in PINGPONGS:
            floor = figures["floor"] - base
            goal = "≤ 2 %" if name == PINGPONGS[0] else ""
            added_text = f"{added:+.0f} ({added / base:+.1%}; floor {floor:+.0f}, " \
                f"{added / floor:.2f}× it)"
        else:
            goal, added_text = f"≤ {GOALS[name]}", f"{added:+.0f}"
        strace = figures.get("strace")
        strace_text = strace_added = ""
        if strace is not None:
            strace_text = f"{strace:.0f}"
            strace_added = f"{strace - base:+.0f} ({strace / base:.0f}x)"
        lines.append(f"| {name} | {base:.0f} | {probes:.0f} | {added_text} | {goal} | "
                     f"{strace_text} | {strace_added} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", help="a real NVIDIA control device (/dev/nvidiactl)")
    parser.add_argument("--calls", type=int, default=1_000_000, help="ioctls a run")
    parser.add_argument("--round-trips", type=int, default=100_000, help="ping-pongs a run")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_probes: needs root (it loads the eBPF probes)")
    results = run(args.repeat, args.calls, args.round_trips, args.device)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
