"""Stacks benchmark: what sampling a process's Python stacks costs it and the host, and how
soon the stacks come (issue #57's goals, decision 0018).

    sudo .venv/bin/python scripts/bench_stacks.py [--pairs 5] [--window 10] [--json]

Runs the real sampler as gpuwhy-stacks.service does (`gpuwhy probes --only stacks`, its
py-spy children, the bus) beside two stand-in programs of this file, each counting the work
it finishes into a file: a CPU-bound Python loop, and a DataLoader-like loop (a parent
taking items from a queue fed by two worker processes, which spend half their time in a
sleep standing for I/O: the tree keeps about one CPU busy, leaving one of a 2-CPU machine
to the sampler). For each, windows without and with sampling alternate (off, on, off, ...,
off): an "on" window begins when the targets file names the program (the service's
answer formed) and is measured from when py-spy runs, at the default rate
(``stacks.interval_ms``), for ``--window`` seconds; then the file is emptied (the answer
cleared). Figures, per program:

- slowdown: 1 - (work a second while sampled) / (the mean of the windows either side
  unsampled), per "on" window, from the program's own count; goal median ≤ 1 %;
- sampler CPU: py-spy's user + system time (the sampler process's reaped children), over
  the "on" window's wall time, per sampled process; goal ≤ 2 % of one CPU; and the sampler
  process's own CPU while no answer holds (no py-spy runs then);
- first stacks: seconds from the targets file's replacement to the first ``python_stacks``
  event on the bus (the window's first FIRST_RUN_SECONDS are published at once); goal
  ≤ 10 s.
Needs root (or CAP_SYS_PTRACE): py-spy reads the programs' memory.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SLOWDOWN_GOAL_PCT = 1.0
CPU_GOAL_PCT = 2.0
FIRST_STACKS_GOAL_S = 10.0
LOADER_WORKERS = 2
TICK = os.sysconf("SC_CLK_TCK")


# --- the stand-in programs (run as `bench_stacks.py --program KIND COUNTER`) ------------
def _step(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total


def _counted(path: str, done: int) -> None:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as out:
        out.write(f"{done} {time.monotonic()}\n")
    os.replace(tmp, path)


def _worker(queue: Any) -> None:
    # reading a sample takes as long as decoding it, unloaded: a fixed sleep, measured once
    # (a sleep as long as each decode took would double any slowdown)
    costs = []
    for _ in range(5):
        began = time.monotonic()
        _step(20_000)
        costs.append(time.monotonic() - began)
    reading = min(costs)
    while True:
        item = _step(20_000)                   # decoding a sample
        time.sleep(reading)                    # reading the next one
        queue.put(item)


def program(kind: str, path: str) -> None:
    """``cpu``: a pure-Python loop; ``loader``: a parent consuming what LOADER_WORKERS
    forked workers put on a queue. Writes its count of finished steps every 50 ms."""
    done, last = 0, 0.0
    if kind == "loader":
        context = multiprocessing.get_context("fork")
        queue = context.Queue(maxsize=16)
        for _ in range(LOADER_WORKERS):
            context.Process(target=_worker, args=(queue,), daemon=True).start()
    while True:
        if kind == "loader":
            queue.get()
            _step(200)                         # the training step's Python side
        else:
            _step(2000)
        done += 1
        if time.monotonic() - last >= 0.05:
            _counted(path, done)
            last = time.monotonic()


# --- the measurement --------------------------------------------------------------------
def _count(path: Path) -> tuple[int, float]:
    done, at = path.read_text().split()
    return int(done), float(at)


def _cpu_s(pid: int) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of ``pid``, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime) / TICK, (cutime + cstime) / TICK


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its live children (the loader's workers)."""
    import psutil

    total = 0.0
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _spies(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children() if c.name() == "py-spy"]
    except psutil.Error:
        return []


def _wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def measure(kind: str, pairs: int, window: float, folder: Path) -> dict:
    """Alternate unsampled and sampled windows over one program; every figure per window."""
    from gpuwhy.bus import Subscriber
    from gpuwhy.clock import now_ns
    from gpuwhy.config import load_config
    from gpuwhy.proc import process_key
    from gpuwhy.pystacks import Target, write_targets

    config = load_config(environ={})
    counter = folder / f"{kind}.count"
    targets = folder / f"{kind}-targets.json"
    endpoint = f"ipc://{folder}/{kind}-bus.sock"
    subscriber = Subscriber(endpoint, topics=("stacks",))
    target = subprocess.Popen([sys.executable, __file__, "--program", kind, str(counter)],
                              start_new_session=True)
    env = {**os.environ, "GPUWHY_BUS": endpoint, "GPUWHY_STACKS_TARGETS": str(targets),
           "GPUWHY_LOG_LEVEL": "warning"}
    sampler = subprocess.Popen([sys.executable, "-m", "gpuwhy", "probes", "--only", "stacks"],
                               env=env)
    out: dict[str, Any] = {"kind": kind, "interval_ms": config["stacks.interval_ms"],
                           "window_s": window, "off": [], "on": [], "slowdown_pct": [],
                           "spy_cpu_pct": [], "idle_sampler_cpu_pct": [], "first_stacks_s": [],
                           "samples": [], "off_per_cpu": [], "on_per_cpu": [],
                           "slowdown_per_cpu_pct": []}
    try:
        if not _wait(counter.exists, 20):
            raise RuntimeError(f"the {kind} program did not start")
        key = process_key(target.pid)
        time.sleep(3.0)                              # the program and the sampler settle

        def unsampled() -> None:
            own0, _ = _cpu_s(sampler.pid)
            c0, t0 = _count(counter)
            cpu0 = _tree_cpu_s(target.pid)
            time.sleep(window)
            c1, t1 = _count(counter)
            cpu1 = _tree_cpu_s(target.pid)
            own1, _ = _cpu_s(sampler.pid)
            out["off"].append((c1 - c0) / (t1 - t0))
            out["off_per_cpu"].append((c1 - c0) / (cpu1 - cpu0))
            out["idle_sampler_cpu_pct"].append((own1 - own0) / (t1 - t0) * 100)

        unsampled()
        for n in range(pairs):
            _, spent0 = _cpu_s(sampler.pid)
            written = time.monotonic()
            write_targets(str(targets), [Target(
                target.pid, key.start_time, "GPU-bench", f"bench:{kind}:{n}",
                "R01_input_cpu_bound", now_ns() + int(config["stacks.window_seconds"] * 1e9))],
                now_ns())
            if not _wait(lambda: _spies(sampler.pid), 10):
                raise RuntimeError("the sampler started no py-spy")
            began = time.monotonic()
            c0, t0 = _count(counter)
            cpu0 = _tree_cpu_s(target.pid)
            first = None
            while time.monotonic() - began < window:
                envelope = subscriber.receive(0.1)
                if envelope is not None and first is None:
                    first = time.monotonic() - written
            c1, t1 = _count(counter)
            cpu1 = _tree_cpu_s(target.pid)
            write_targets(str(targets), [], now_ns())          # the answer cleared
            while first is None and time.monotonic() - written < 30:
                if subscriber.receive(0.1) is not None:
                    first = time.monotonic() - written
            if not _wait(lambda: not _spies(sampler.pid), 10):
                raise RuntimeError("py-spy did not stop when the answer cleared")
            ended = time.monotonic()
            _, spent1 = _cpu_s(sampler.pid)
            while (envelope := subscriber.receive(0.3)) is not None:     # the final event
                out["samples"].append(envelope.event.samples)
            out["on"].append((c1 - c0) / (t1 - t0))
            out["on_per_cpu"].append((c1 - c0) / (cpu1 - cpu0))
            out["spy_cpu_pct"].append((spent1 - spent0) / (ended - began) * 100)
            out["first_stacks_s"].append(first if first is not None else float("inf"))
            unsampled()
            before, after = out["off"][-2], out["off"][-1]
            out["slowdown_pct"].append((1 - out["on"][-1] / ((before + after) / 2)) * 100)
            # per CPU second of the program: what sampling costs its work, whatever share
            # of the CPUs the machine's other load left it in each window
            before, after = out["off_per_cpu"][-2], out["off_per_cpu"][-1]
            out["slowdown_per_cpu_pct"].append(
                (1 - out["on_per_cpu"][-1] / ((before + after) / 2)) * 100)
    finally:
        sampler.send_signal(signal.SIGTERM)
        try:
            sampler.wait(20)
        except subprocess.TimeoutExpired:
            sampler.kill()
            sampler.wait()
        os.killpg(target.pid, signal.SIGKILL)
        target.wait()
        subscriber.close()
    return out


def run(pairs: int = 5, window: float = 10.0) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="bench-stacks-"))
    results: dict[str, Any] = {"pairs": pairs, "window_s": window,
                               "load_before": os.getloadavg()}
    for kind in ("cpu", "loader"):
        results[kind] = measure(kind, pairs, window, folder)
    results["load_after"] = os.getloadavg()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", nargs=2, metavar=("KIND", "COUNTER"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=5, help="sampled windows per program")
    parser.add_argument("--window", type=float, default=10.0, help="seconds of each window")
    parser.add_argument("--json", action="store_true", help="print every window as JSON")
    args = parser.parse_args()
    if args.program:
        program(*args.program)
        return
    results = run(args.pairs, args.window)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for kind in ("cpu", "loader"):
        r = results[kind]
        print(f"{kind}: off {statistics.median(r['off']):,.0f}/s, on "
              f"{statistics.median(r['on']):,.0f}/s, slowdown median "
              f"{statistics.median(r['slowdown_pct']):+.2f} % "
              f"{[round(x, 2) for x in r['slowdown_pct']]}, per CPU second "
              f"{statistics.median(r['slowdown_per_cpu_pct']):+.2f} % "
              f"{[round(x, 2) for x in r['slowdown_per_cpu_pct']]}; py-spy "
              f"{statistics.median(r['spy_cpu_pct']):.2f} % of a CPU; sampler idle "
              f"{statistics.median(r['idle_sampler_cpu_pct']):.3f} %; first stacks "
              f"{max(r['first_stacks_s']):.1f} s at most")


if __name__ == "__main__":
    main()
