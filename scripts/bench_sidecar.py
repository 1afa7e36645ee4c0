#!/usr/bin/env python3
"""bench_sidecar: the whole sidecar's steady-state CPU and memory, `gpuwhy up` as it runs.

USAGE: sudo .venv/bin/python scripts/bench_sidecar.py [--gpus 8] [--processes 16]
           [--warmup 30] [--windows 6] [--window 10] [--json FILE]
       sudo .venv/bin/python scripts/bench_sidecar.py --against REV [--rounds 3] [--settle 600]
       sudo .venv/bin/python scripts/bench_sidecar.py --probes-memory

Starts the real `gpuwhy up` (the service: correlator, store, web view, GPU simulator,
kernel-log, cron and rules threads; and its `gpuwhy probes` child: fdtrack, lifecycle,
sched) on a private store and bus, with --gpus simulated GPUs sampled at 1 Hz and
--processes stand-in GPU processes (`gpuwhy.app.demo.standin train --starved`: each holds
look-alike nvidiactl/nvidiaN/nvidia-uvm files and sends about 20 driver calls a second).
After --warmup seconds it measures, over --windows windows of --window seconds, the CPU
seconds per wall second of every gpuwhy process (its threads' schedstat) and their memory from
/proc/PID/smaps_rollup: RSS, anonymous and private dirty pages, and the clean file pages
of bcc's LLVM/clang libraries (shared, evictable, the bulk of the probes' RSS). Then the
memory each process touches a second, and what this machine charges for reading a page left
alone for a second (in the warm-up and after the windows): on a VM whose host reclaims idle
guest memory that charge swings tenfold within an hour, and an idle sidecar's CPU with it.

The CPU that the eBPF programs spend inside traced processes' system calls is charged to
those processes, not to gpuwhy: bench_probes.py measures it (ns per call).

--against REV runs this checkout's sidecar and the sidecar of commit REV at the same time,
each on its own store, bus and stand-ins, for --rounds rounds (the start order alternates),
and compares their CPU window by window, and their anonymous memory after the windows
and, with --settle SECONDS, that long after the start. A VM's pace drifts by a fifth
between runs minutes apart, more than most changes are worth; two sidecars measured over
the same seconds see the same pace. Each also pays for the other's eBPF programs on its
own context switches, so both read a little higher than alone: the difference is the
figure. REV is installed without its dependencies (this environment's) into a temporary
folder.

--probes-memory loads the probes alone in this process and prints their memory after
loading and after glibc's malloc_trim(0) (what probes/privileged.py now does).

--thread-flush loads the sched probe alone and times its flush (thread CPU) with
--processes processes of --threads threads each, --busy of them (default all) waking every
50 ms and the others asleep: a real GPU process has tens to hundreds of threads (runtime,
NCCL, OpenMP pools, data loaders), most of them waiting at any moment; the stand-ins above
have one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from gpuwhy.lifeline import child_environment

MB = 1024 * 1024
GOALS = {"cpu_pct": 1.0, "anon_mb": 80.0, "rss_mb": 200.0, "idle_cpu_pct": 0.3}
# BPF map types whose values are kept once for every possible CPU (uapi/linux/bpf.h)
PER_CPU_MAP_TYPES = frozenset({5, 6, 10, 21})  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH,
                                               # PERCPU_CGROUP_STORAGE
BIG_HOST_CPUS = 224                            # a DGX H100's logical CPUs
# Mapped files whose clean pages are bcc's compiler (LLVM, clang) and bcc itself.
COMPILER_LIBS = re.compile(r"lib(LLVM|clang|bcc)[^/]*\.so")


def rollup(pid: int) -> dict[str, float]:
    """/proc/PID/smaps_rollup's figures in MB, by name (Rss, Anonymous, Referenced, ...)."""
    fields: dict[str, float] = {}
    with open(f"/proc/{pid}/smaps_rollup") as lines:
        for line in lines:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024 / MB
    return fields


def memory(pid: int) -> dict[str, float]:
    """MB of RSS, anonymous, private dirty and compiler-library (clean file) pages."""
    fields = rollup(pid)
    compiler = 0.0
    current = ""
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0]
            if not head.endswith(":"):              # a mapping's header line
                parts = line.split()
                current = parts[5] if len(parts) > 5 else ""
            elif head == "Rss:" and COMPILER_LIBS.search(current):
                compiler += int(line.split()[1]) * 1024 / MB
    return {"rss_mb": fields.get("Rss", 0.0), "anon_mb": fields.get("Anonymous", 0.0),
            "private_dirty_mb": fields.get("Private_Dirty", 0.0),
            "compiler_libs_mb": compiler}


PAGE = 4096


def touched(pids: dict[str, int], window: float = 1.0) -> dict[str, float]:
    """MB of its memory each process read or wrote over ``window`` s: the accessed bits of
    its pages cleared (/proc/PID/clear_refs), then its pages with the bit set again counted
    (smaps_rollup's Referenced). A page shared by two processes counts in each."""
    for pid in pids.values():
        Path(f"/proc/{pid}/clear_refs").write_text("1")
    time.sleep(window)
    return {role: rollup(pid)["Referenced"] / window for role, pid in pids.items()}


def host_pace(gap: float = 1.0, runs: int = 5, pages: int = 256) -> dict[str, float]:
    """What memory left alone costs here: CPU µs to read again a page of this process's
    memory that sat unused for ``gap`` s ("cold"), and one read a moment ago ("hot"). On a
    VM whose host reclaims or ages its guests' idle memory, a cold page costs tens of µs
    against a fraction of one: a once-a-second chore then costs what it touches, whatever
    its work, and the sidecar's idle CPU follows the host's memory pressure."""
    buf = bytearray(b"\1" * (pages * PAGE))     # written: every page is there

    def read_all() -> float:
        started, total = time.thread_time(), 0
        for offset in range(0, len(buf), PAGE):
            total += buf[offset]
        return (time.thread_time() - started) * 1e6 / pages
    read_all()
    hot = [read_all() for _ in range(runs)]
    cold = []
    for _ in range(runs):
        time.sleep(gap)
        cold.append(read_all())
    return {"gap_s": gap, "cold_us_per_page": statistics.median(cold),
            "hot_us_per_page": statistics.median(hot)}


def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> int:
    """How many CPUs the kernel keeps per-CPU values for (``0-1,4-7``: 6)."""
    with open(path) as ranges:
        text = ranges.read().strip()
    total = 0
    for part in text.split(","):
        low, _, high = part.partition("-")
        total += int(high or low) - int(low) + 1
    return total


def kernel_memory(pid: int, cpus: int = BIG_HOST_CPUS) -> dict[str, float]:
    """MB of kernel memory that the process's BPF maps and programs pin (``memlock`` in
    /proc/PID/fdinfo, each map or program once however many fds it has), and what its maps
    would pin on a host of ``cpus`` possible CPUs: a per-CPU map holds max_entries values
    (their size rounded up to 8 bytes) for every possible CPU, preallocated. Neither is in
    the process's RSS."""
    here = possible_cpus()
    held: dict[str, int] = {}
    bigger = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as fdinfo:
                info = dict(line.split(":", 1) for line in fdinfo.read().splitlines()
                            if ":" in line)
        except OSError:                 # closed meanwhile
            continue
        ident = f"map {info['map_id'].strip()}" if "map_id" in info else \
            f"prog {info['prog_id'].strip()}" if "prog_id" in info else None
        if ident is None or ident in held:
            continue
        held[ident] = int(info.get("memlock", "0"))
        if int(info.get("map_type", "-1")) in PER_CPU_MAP_TYPES:
            value = -(-int(info["value_size"]) // 8) * 8
            bigger += int(info["max_entries"]) * value * (cpus - here)
    total = sum(held.values())
    return {"bpf_kernel_mb": total / MB, "bpf_kernel_mb_big_host": (total + bigger) / MB}


def probes_memory() -> dict[str, dict[str, float]]:
    """Load the probes here (the way `gpuwhy probes` does), memory before/after the trim."""
    from gpuwhy.bus import Publisher
    from gpuwhy.config import load_config
    from gpuwhy.memory import release_freed_memory
    from gpuwhy.probes.privileged import Probes

    result = {"start": memory(os.getpid())}
    import bcc  # noqa: F401 - its import alone maps the LLVM libraries

    result["import bcc"] = memory(os.getpid())
    with tempfile.TemporaryDirectory() as work:
        devices = Path(work, "dev")
        devices.mkdir()
        config = load_config(environ={"GPUWHY_DEVICE_GLOB": f"{devices}/nvidia*",
                                      "GPUWHY_BUS": f"ipc://{work}/bus.sock"})
        publisher = Publisher(config["bus.endpoint"], src="bench")
        probes = Probes(config, publisher)
        probes.load()
        result["loaded"] = memory(os.getpid())
        release_freed_memory()
        result["after malloc_trim"] = memory(os.getpid())
        probes.close()
        publisher.close()
    return result


# A process of THREADS threads, BUSY of them (the main thread counted) waking every 50 ms
# for a little work and the others asleep on a futex until it ends, as the pool threads of a
# runtime between its parallel sections; it prints a line once they all run.
_THREADED = """
import sys, threading, time
def work():
    while True:
        time.sleep(0.05)
        sum(range(2000))
threads, busy = int(sys.argv[1]), int(sys.argv[2])
for i in range(threads - 1):
    target = work if i < busy - 1 else threading.Event().wait
    threading.Thread(target=target, daemon=True).start()
print(flush=True)
work() if busy else time.sleep(3600)
"""


def thread_flush(processes: int = 8, threads: int = 100, flushes: int = 30,
                 every: float = 0.2, busy: int | None = None) -> dict:
    """The sched probe's flush, timed in this thread's CPU: ms a flush and µs a watched
    thread, with ``processes`` processes of ``threads`` threads, ``busy`` of each (all by
    default) waking every 50 ms and the others asleep."""
    busy = threads if busy is None else busy
    from gpuwhy.config import load_config
    from gpuwhy.probes.sched import SchedProbe
    from gpuwhy.proc import process_key

    children = [subprocess.Popen([sys.executable, "-c", _THREADED, str(threads), str(busy)],
                                 stdout=subprocess.PIPE) for _ in range(processes)]
    try:
        for child in children:
            child.stdout.readline()
        with tempfile.TemporaryDirectory(prefix="gpuwhy-bench-threads-") as work:
            events: list = []
            probe = SchedProbe(load_config(environ={"GPUWHY_BUS": f"ipc://{work}/bus.sock"}),
                               events.append)
            probe.load()
            try:
                for child in children:
                    probe.watch(process_key(child.pid))
                for _ in range(3):                 # every thread's first interval
                    probe.flush()
                    time.sleep(every)
                watched = probe.counters()["watched_threads"]
                events.clear()
                spent = []
                for _ in range(flushes):
                    time.sleep(every)
                    started = time.thread_time()
                    probe.flush()
                    spent.append(time.thread_time() - started)
            finally:
                probe.close()
    finally:
        for child in children:
            child.kill()
            child.wait()
    per_flush = statistics.median(spent)
    return {"processes": processes, "threads": threads, "busy": busy, "watched_threads": watched,
            "flushes": flushes, "events": len(events), "ms_a_flush": per_flush * 1e3,
            "us_a_thread": per_flush / max(watched, 1) * 1e6}


class Sidecar:
    """`gpuwhy up` on a private store, bus and port, plus its stand-in GPU processes."""

    def __init__(self, work: Path, gpus: int, processes: int):
        self.work = work
        devices = work / "dev"
        devices.mkdir(parents=True, exist_ok=True)
        for name in ("nvidiactl", "nvidia-uvm", *(f"nvidia{i}" for i in range(gpus))):
            (devices / name).touch()
        self.devices, self.gpus, self.processes = devices, gpus, processes
        self.env = {**os.environ, "GPUWHY_DB": str(work / "bench.db"),
                    "GPUWHY_BUS": f"ipc://{work}/bus.sock",
                    "GPUWHY_DEVICE_GLOB": f"{devices}/nvidia*", "GPUWHY_GPU_SOURCE": "sim",
                    "GPUWHY_SIM_GPUS": str(gpus), "GPUWHY_GPU_INTERVAL": "1",
                    "GPUWHY_KLOG_START": "now", "GPUWHY_LOG_LEVEL": "info"}
        self.up: subprocess.Popen | None = None
        self.standins: list[subprocess.Popen] = []
        self.log: list[str] = []

    def start(self, timeout: float = 120.0) -> None:
        # child_environment: `gpuwhy up` stops (SIGTERM) when the thread that started it
        # ends, so a killed benchmark leaves no probes attached (gpuwhy.lifeline). Not run
        # from the checkout: `python -m` puts its folder first on sys.path, before the
        # PYTHONPATH of another build (--against would have run this checkout twice).
        self.up = subprocess.Popen([sys.executable, "-m", "gpuwhy", "up", "--port", "0"],
                                   env=child_environment(self.env), stderr=subprocess.PIPE,
                                   text=True, start_new_session=True, cwd=self.work)
        loaded = threading.Event()

        def read_log() -> None:
            for line in self.up.stderr:
                self.log.append(line.rstrip())
                if "start-up scan" in line:
                    loaded.set()
        threading.Thread(target=read_log, daemon=True).start()
        if not loaded.wait(timeout):
            self.stop()
            raise RuntimeError("gpuwhy up did not load its probes:\n" + "\n".join(self.log[-20:]))
        for n in range(self.processes):
            standin = subprocess.Popen(
                [sys.executable, "-m", "gpuwhy.app.demo.standin", "train",
                 str(self.devices), "--minor", str(n % self.gpus), "--starved"],
                stdout=subprocess.PIPE, text=True, cwd=self.work)
            standin.stdout.readline()             # its pid: the device files are open
            self.standins.append(standin)

    def pids(self) -> dict[str, int]:
        """The gpuwhy processes, by role: the service and its descendants (the probes)."""
        service = psutil.Process(self.up.pid)
        found = {"service (gpuwhy up)": service.pid}
        for child in service.children(recursive=True):
            role = "probes" if "probes" in " ".join(child.cmdline()) else child.name()
            found[role] = child.pid
        return found

    def traced(self) -> int:
        """Stand-in processes the store knows to hold device files (a sanity check)."""
        with sqlite3.connect(f"file:{self.work / 'bench.db'}?mode=ro", uri=True) as db:
            pids = {row[0] for row in db.execute("select distinct pid from device_fds")}
        return len(pids & {standin.pid for standin in self.standins})

    def stop(self) -> None:
        for standin in self.standins:
            standin.terminate()
        for standin in self.standins:
            standin.wait(10)
        if self.up is not None and self.up.poll() is None:
            self.up.send_signal(signal.SIGTERM)
            try:
                self.up.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.up.pid, signal.SIGKILL)
                self.up.wait()


def cpu_seconds(pid: int) -> float:
    """CPU time of the process's live threads, from the scheduler's nanosecond counts
    (``/proc/PID/task/*/schedstat``): the 10 ms ticks of ``cpu_times`` are too coarse for a
    process that runs 10 ms a second (a window of a few seconds read 0.33 % steps). Plus
    its children that have exited (short-lived helpers such as `systemd-analyze` are the
    sidecar's cost too, and no sample of live processes sees them), in ticks."""
    return _threads_seconds(pid) + _reaped_children_seconds(pid)


def cpu_shares(pids: dict, window: float) -> dict:
    """% of one core that each of ``pids`` (values; keys are the caller's) spent over the
    next ``window`` seconds (:func:`cpu_seconds`)."""
    before = {key: cpu_seconds(pid) for key, pid in pids.items()}
    started = time.monotonic()
    time.sleep(window)
    wall = time.monotonic() - started
    return {key: (cpu_seconds(pid) - before[key]) / wall * 100 for key, pid in pids.items()}


def _reaped_children_seconds(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.children_user + times.children_system


def _threads_seconds(pid: int) -> float:
    total = sum(ns for _, ns, _ in thread_counts(pid).values())
    if not total:                                    # no schedstat (CONFIG_SCHEDSTATS off)
        times = psutil.Process(pid).cpu_times()
        return times.user + times.system
    return total / 1e9


def thread_counts(pid: int) -> dict[int, tuple[str, int, int]]:
    """Each live thread of ``pid``: its kernel name (gpuwhy names its threads, see
    gpuwhy/threads.py), its CPU in ns (``schedstat``) and its context switches, voluntary
    and not (``status``): a wake-up each, a GIL hand-off included, so an upper bound."""
    found = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm, \
                    open(f"/proc/{pid}/task/{tid}/schedstat") as schedstat, \
                    open(f"/proc/{pid}/task/{tid}/status") as status:
                name, ns = comm.read().strip(), int(schedstat.read().split()[0])
                switches = sum(int(line.split()[1]) for line in status
                               if line.partition(":")[0].endswith("ctxt_switches"))
        except (OSError, ValueError, IndexError):    # the thread ended meanwhile
            continue
        found[int(tid)] = (name, ns, switches)
    return found


def thread_profile(before: dict[str, dict], after: dict[str, dict],
                   seconds: float) -> dict[str, dict[str, dict[str, float]]]:
    """Per process role and thread name (threads of one name summed): % of one core and
    wake-ups a second between two :func:`thread_counts` of each role's process. A thread
    that started or ended in between counts for the part both saw."""
    profile: dict[str, dict[str, dict[str, float]]] = {}
    for role, threads in after.items():
        named: dict[str, dict[str, float]] = {}
        for tid, (name, ns, switches) in threads.items():
            if tid not in before.get(role, {}):
                continue
            _, ns_before, switches_before = before[role][tid]
            figures = named.setdefault(name, {"cpu_pct": 0.0, "wakeups_per_s": 0.0})
            figures["cpu_pct"] += (ns - ns_before) / 1e9 / seconds * 100
            figures["wakeups_per_s"] += (switches - switches_before) / seconds
        profile[role] = dict(sorted(named.items(), key=lambda item: -item[1]["cpu_pct"]))
    return profile


class Spawner:
    """Short-lived host processes (`sh -c true`, one exec each) at ``rate`` a second, as a
    host's health checks, shell scripts and agents start them: the lifecycle probe sees
    every exec, fork and exit, and the service stores them."""

    def __init__(self, rate: float):
        self.rate, self.started = rate, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            pid = os.posix_spawn("/bin/sh", ["sh", "-c", "true"], os.environ)
            os.waitpid(pid, 0)
            self.started += 1
            due += 1 / self.rate
            self._stop.wait(max(0.0, due - time.monotonic()))

    def __enter__(self) -> Spawner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def churn(pids: dict, rate: float, pairs: int, window: float) -> dict:
    """The sidecar's CPU % without and with ``rate`` short-lived host processes a second,
    windows alternated, and the processes a second each churn window got."""
    quiet, busy, rates = [], [], []
    for _ in range(pairs):
        quiet.append(sum(cpu_shares(pids, window).values()))
        with Spawner(rate) as spawner:
            time.sleep(min(3.0, window))        # their records reach the service meanwhile
            before, started = spawner.started, time.monotonic()
            busy.append(sum(cpu_shares(pids, window).values()))
            rates.append((spawner.started - before) / (time.monotonic() - started))
    return {"rate": rate, "quiet_pct": quiet, "churn_pct": busy, "processes_per_s": rates}


TOUCH_WINDOWS = 3   # of 1 s, after the CPU windows (clearing the accessed bits costs a little)


def run(gpus: int = 8, processes: int = 16, warmup: float = 30.0, windows: int = 6,
        window: float = 10.0, churn_rate: float = 0.0, settle: float = 0.0) -> dict:
    """Steady-state CPU % of one core and memory (MB) of each gpuwhy process and in total,
    one value per window; with ``churn_rate``, then :func:`churn` over ``windows // 2``
    pairs of windows; with ``settle``, the memory again ``settle`` seconds after the start
    (the rules' windows and the store's caches fill for minutes)."""
    with tempfile.TemporaryDirectory(prefix="gpuwhy-bench-sidecar-") as tmp:
        sidecar = Sidecar(Path(tmp), gpus, processes)
        sidecar.start()
        started = time.monotonic()
        try:
            pace = [host_pace()]                     # in the warm-up, and after the windows
            time.sleep(max(0.0, started + warmup - time.monotonic()))
            pids = sidecar.pids()
            per: dict[str, dict[str, list[float]]] = {
                role: {"cpu_pct": [], "rss_mb": [], "anon_mb": [], "private_dirty_mb": [],
                       "compiler_libs_mb": [], "bpf_kernel_mb": [],
                       "bpf_kernel_mb_big_host": []} for role in [*pids, "total"]}
            threads_before = {role: thread_counts(pid) for role, pid in pids.items()}
            profiled_from = time.monotonic()
            for _ in range(windows):
                shares = cpu_shares(pids, window)
                total: dict[str, float] = {key: 0.0 for key in per["total"]}
                for role, pid in pids.items():
                    figures = {"cpu_pct": shares[role], **memory(pid),
                               **kernel_memory(pid)}
                    for key, value in figures.items():
                        per[role][key].append(value)
                        total[key] += value
                for key, value in total.items():
                    per["total"][key].append(value)
            threads = thread_profile(threads_before,
                                     {role: thread_counts(pid) for role, pid in pids.items()},
                                     time.monotonic() - profiled_from)
            traced = sidecar.traced()
            touches = [touched(pids) for _ in range(TOUCH_WINDOWS)]
            pace.append(host_pace())
            churned = churn(pids, churn_rate, max(1, windows // 2), window) \
                if churn_rate else None
            settled = None
            if settle:
                time.sleep(max(0.0, started + settle - time.monotonic()))
                settled = {"after_s": time.monotonic() - started,
                           **{role: memory(pid) for role, pid in pids.items()}}
        finally:
            sidecar.stop()
    fields = _simulated_fields()
    return {"gpus": gpus, "fields": fields, "processes": processes, "traced_in_store": traced,
            "warmup_s": warmup, "windows": windows, "window_s": window, "per_process": per,
            "threads": threads,
            "touched_mb_per_s": {role: [t[role] for t in touches] for role in pids},
            "pace": pace, "churn": churned, "settled": settled}


REPO = Path(__file__).resolve().parent.parent


def resolve_commit(rev: str) -> str:
    """The full hash of ``rev`` in this checkout; ValueError when it names no commit."""
    done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet",
                           f"{rev}^{{commit}}"], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise ValueError(f"not a commit of {REPO}: {rev!r}")
    return done.stdout.strip()


def build_commit(commit: str, work: Path) -> Path:
    """Install ``commit``'s package (no dependencies) under ``work``; its folder, to put
    first on a sidecar's PYTHONPATH."""
    tree, site = work / "tree", work / "site"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet",
                    str(tree), commit], check=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--target", str(site), str(tree)], check=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                       check=False)
    return site


def run_against(site: Path, label: str, gpus: int = 8, processes: int = 16,
                warmup: float = 30.0, rounds: int = 3, windows: int = 6,
                window: float = 10.0, settle: float = 0.0, churn_rate: float = 0.0) -> dict:
    """CPU % of one core of this checkout's sidecar and of the one installed in ``site``,
    run at the same time: one value each per window, the windows of both the same; their
    anonymous MB after the windows of each round and, with ``settle``, ``settle`` seconds
    after the start. With ``churn_rate``, the windows run while the host starts that many
    short-lived processes a second, which both sidecars see."""
    builds = {"this checkout": None, label: str(site)}
    per: dict[str, dict[str, list[float]]] = {name: {} for name in builds}
    anon: dict[str, dict[str, dict[str, list[float]]]] = {
        when: {name: {} for name in builds} for when in ("windows", "settled")}
    for number in range(rounds):
        order = list(builds) if number % 2 == 0 else list(builds)[::-1]
        with tempfile.TemporaryDirectory(prefix="gpuwhy-bench-sidecar-") as tmp:
            sidecars: dict[str, Sidecar] = {}
            try:
                for name in order:
                    sidecar = Sidecar(Path(tmp) / str(order.index(name)), gpus, processes)
                    if builds[name] is not None:
                        sidecar.env["PYTHONPATH"] = os.pathsep.join(
                            [builds[name], *filter(None, [os.environ.get("PYTHONPATH")])])
                    sidecars[name] = sidecar
                    sidecar.start()
                started = time.monotonic()
                time.sleep(warmup)
                pids = {(name, role): pid for name, sidecar in sidecars.items()
                        for role, pid in sidecar.pids().items()}
                with Spawner(churn_rate) if churn_rate else contextlib.nullcontext():
                    if churn_rate:
                        time.sleep(min(3.0, window))    # their records reach both services
                    for _ in range(windows):
                        shares = cpu_shares(pids, window)   # both builds, the same seconds
                        for name in sidecars:
                            mine = {role: share for (of, role), share in shares.items()
                                    if of == name}
                            mine["total"] = sum(mine.values())
                            for role, share in mine.items():
                                per[name].setdefault(role, []).append(share)
                _read_anon(pids, anon["windows"])
                if settle:
                    time.sleep(max(0.0, started + settle - time.monotonic()))
                    _read_anon(pids, anon["settled"])
            finally:
                for sidecar in sidecars.values():
                    sidecar.stop()
    return {"gpus": gpus, "processes": processes, "rounds": rounds, "windows": windows,
            "window_s": window, "warmup_s": warmup, "builds": list(builds),
            "per_build": per, "difference": compare(per["this checkout"]["total"],
                                                    per[label]["total"]),
            "anon_mb": anon, "settle_s": settle, "churn_rate": churn_rate}


def _read_anon(pids: dict[tuple[str, str], int],
               into: dict[str, dict[str, list[float]]]) -> None:
    """Each (build, role)'s anonymous MB now, and each build's total, into ``into``."""
    for name, of in into.items():
        mine = {role: memory(pid)["anon_mb"] for (build, role), pid in pids.items()
                if build == name}
        for role, value in [*mine.items(), ("total", sum(mine.values()))]:
            of.setdefault(role, []).append(value)


def compare(this: list[float], other: list[float]) -> dict:
    """Window by window, ``this`` − ``other``: the median and mean difference, and in how
    many windows ``this`` was lower."""
    differences = [a - b for a, b in zip(this, other, strict=True)]
    return {"median": statistics.median(differences), "mean": statistics.mean(differences),
            "lower": sum(d < 0 for d in differences), "windows": len(differences),
            "relative": statistics.median(differences) / statistics.median(other)
            if statistics.median(other) else None}


def against_table(result: dict) -> str:
    this, other = result["builds"]
    per, difference = result["per_build"], result["difference"]
    lines = [f"{result['gpus']} simulated GPUs, {result['processes']} stand-in processes "
             f"each; both sidecars at once, {result['rounds']} rounds × {result['windows']} "
             f"windows of {result['window_s']:g} s after {result['warmup_s']:g} s"
             + (f", {result['churn_rate']:g} short-lived host processes a second"
                if result.get("churn_rate") else "")
             + "; CPU % of one core, median [min–max]", "",
             f"| process | {this} | {other} |", "|---|---|---|"]
    for role in per[this]:
        cells = [f"{statistics.median(v):.2f} [{min(v):.2f}–{max(v):.2f}]"
                 for v in (per[this][role], per[other].get(role, [math.nan]))]
        lines.append(f"| {role} | {cells[0]} | {cells[1]} |")
    relative = difference["relative"]
    lines += ["", f"{this} − {other}, window by window: median {difference['median']:+.3f} "
              f"(mean {difference['mean']:+.3f}"
              + (f", {relative:+.0%} of {other}'s" if relative is not None else "")
              + f"); lower in {difference['lower']} of {difference['windows']} windows"]
    anon = result.get("anon_mb", {})
    for when, title in (("windows", "after the windows"),
                        ("settled", f"{result.get('settle_s', 0) / 60:g} min after the start")):
        if not anon.get(when, {}).get(this):
            continue
        lines += ["", f"anonymous MB {title}, median [min–max] of the rounds", "",
                  f"| process | {this} | {other} |", "|---|---|---|"]
        for role in anon[when][this]:
            cells = [f"{statistics.median(v):.1f} [{min(v):.1f}–{max(v):.1f}]"
                     for v in (anon[when][this][role], anon[when][other].get(role, [math.nan]))]
            lines.append(f"| {role} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def _simulated_fields() -> int:
    from gpuwhy.probes.gpu.sim import SimulatedGpus

    source = SimulatedGpus(count=1)
    source.open()
    return len(source.read()[0].fields)


def table(result: dict) -> str:
    lines = [f"{result['gpus']} simulated GPUs × {result['fields']} fields at 1 Hz, "
             f"{result['processes']} stand-in GPU processes ({result['traced_in_store']} seen "
             f"in the store); median [min–max] of {result['windows']} windows of "
             f"{result['window_s']:g} s after {result['warmup_s']:g} s", "",
             "| process | CPU % of one core | RSS MB | anonymous MB | private dirty MB "
             "| LLVM/clang/bcc clean pages MB | BPF kernel MB (with "
             f"{BIG_HOST_CPUS} CPUs) |", "|---|---|---|---|---|---|---|"]

    def cell(values: list[float], digits: int = 1) -> str:
        return (f"{statistics.median(values):.{digits}f} "
                f"[{min(values):.{digits}f}–{max(values):.{digits}f}]")
    for role, figures in result["per_process"].items():
        lines.append(f"| {role} | {cell(figures['cpu_pct'], 2)} | {cell(figures['rss_mb'])} | "
                     f"{cell(figures['anon_mb'])} | {cell(figures['private_dirty_mb'])} | "
                     f"{cell(figures['compiler_libs_mb'])} | {cell(figures['bpf_kernel_mb'])} "
                     f"({statistics.median(figures['bpf_kernel_mb_big_host']):.0f}) |")
    lines.append(f"| goal (total) | ≤ {GOALS['cpu_pct']:g} | ≤ {GOALS['rss_mb']:g} | "
                 f"≤ {GOALS['anon_mb']:g} | | | |")
    if result.get("pace"):
        lines += ["", pace_line(result)]
    if result.get("threads"):
        lines += ["", threads_table({"": result["threads"]})]
    return "\n".join(lines)


def threads_table(cases: dict[str, dict], least_pct: float = 0.001) -> str:
    """Thread by thread, for each case (its title: the process role -> thread name ->
    figures of :func:`thread_profile`): % of one core and wake-ups a second, the threads
    under ``least_pct`` in every case left out."""
    rows: dict[tuple[str, str], list[str]] = {}
    totals = []
    for column, case in enumerate(cases.values()):
        pct = wakeups = 0.0
        for role, threads in case.items():
            for name, figures in threads.items():
                row = rows.setdefault((role.split(" ")[0], name), ["", ""] * len(cases))
                row[2 * column] = f"{figures['cpu_pct']:.3f}"
                row[2 * column + 1] = f"{figures['wakeups_per_s']:.1f}"
                pct += figures["cpu_pct"]
                wakeups += figures["wakeups_per_s"]
        totals += [f"**{pct:.3f}**", f"**{wakeups:.1f}**"]

    def largest(row: list[str]) -> float:
        return max((float(cell) for cell in row[::2] if cell), default=0.0)
    heads = [f"{title} {what}".strip() for title in cases for what in ("% core", "wake-ups/s")]
    lines = ["| process | thread | " + " | ".join(heads) + " |",
             "|---|---|" + "---:|" * len(heads)]
    for (role, name), row in sorted(rows.items(), key=lambda item: -largest(item[1])):
        if largest(row) >= least_pct:
            lines.append(f"| {role} | {name} | " + " | ".join(row) + " |")
    lines.append("| **all** | | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def pace_line(result: dict) -> str:
    """The memory each process touched a second and what this machine charged for it."""
    touched_mb = {role: statistics.median(values)
                  for role, values in result["touched_mb_per_s"].items()}
    cold = [p["cold_us_per_page"] for p in result["pace"]]
    hot = statistics.median(p["hot_us_per_page"] for p in result["pace"])
    gap = result["pace"][0]["gap_s"]
    pages = sum(touched_mb.values()) * MB / PAGE
    return ("Memory touched a second: " + ", ".join(
        f"{role.split(' ')[0]} {mb:.1f} MB" for role, mb in touched_mb.items()) +
        f". This machine read a page left {gap:g} s in "
        f"{' then '.join(f'{c:.2f}' for c in cold)} µs of CPU (before, after the windows; "
        f"{hot:.2f} µs hot): at that pace reading those pages again once a second costs up "
        f"to {pages * max(cold) / 1e4:.2f} % of a core by itself.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=30.0)
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--probes-memory", action="store_true",
                        help="print the probes' memory after loading and after malloc_trim")
    parser.add_argument("--against", metavar="REV",
                        help="run commit REV's sidecar beside this one and compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--thread-flush", action="store_true",
                        help="time the sched probe's flush with --processes x --threads")
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--churn", type=float, default=0.0, metavar="RATE",
                        help="then alternate windows without and with RATE short-lived "
                             "host processes a second (with --against: every window has "
                             "them)")
    parser.add_argument("--settle", type=float, default=0.0, metavar="SECONDS",
                        help="then read the memory again SECONDS after the start")
    parser.add_argument("--busy", type=int, default=None,
                        help="--thread-flush: threads of each process that wake (default all)")
    args = parser.parse_args()
    if args.against is not None:
        try:
            commit = resolve_commit(args.against)
        except ValueError as exc:
            sys.exit(f"bench_sidecar: {exc}")
    if os.geteuid() != 0:
        sys.exit("bench_sidecar: needs root (it loads the eBPF probes)")
    if args.probes_memory:
        print(json.dumps(probes_memory()))
        return
    if args.thread_flush:
        print(json.dumps(thread_flush(args.processes, args.threads, busy=args.busy)))
        return
    if args.against is not None:
        with tempfile.TemporaryDirectory(prefix="gpuwhy-bench-against-") as tmp:
            site = build_commit(commit, Path(tmp))
            result = run_against(site, commit[:12], args.gpus, args.processes, args.warmup,
                                 args.rounds, args.windows, args.window, args.settle,
                                 args.churn)
        print(against_table(result))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return
    result = run(args.gpus, args.processes, args.warmup, args.windows, args.window, args.churn,
                 args.settle)
    print(table(result))
    if result["settled"]:
        settled = dict(result["settled"])
        after = settled.pop("after_s")
        print(f"after {after / 60:.1f} min: " + ", ".join(
            f"{role} {m['anon_mb']:.1f} MB anonymous, {m['rss_mb']:.1f} MB RSS"
            for role, m in settled.items()))
    if result["churn"]:
        c = result["churn"]
        print(f"with {statistics.median(c['processes_per_s']):.1f} short-lived processes a "
              f"second: {statistics.median(c['churn_pct']):.2f} % of a core, against "
              f"{statistics.median(c['quiet_pct']):.2f} % in the windows between")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
