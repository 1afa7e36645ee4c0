#!/usr/bin/env python3
"""bench_storm: the probes' memory under a storm of 10 M notable driver calls (issue #54).

USAGE: sudo .venv/bin/python scripts/bench_storm.py [--calls 10000000] [--threads 2]

Anyone who may open /dev/nvidiactl can make hundreds of thousands of notable ioctls a
second (NV_ESC_CHECK_VERSION_STR, sent one by one whatever the error budget). Before the
bound, 2.5 M of them grew a `gpuwhy probes` process to 3 GB and 10 M to 4.3 GB. This runs
`gpuwhy probes` on a look-alike device file, lets it settle, takes its RSS as the baseline
(the same process, no storm: the reference beside the figure), then storms it with
tests/replay/storm.c in 5 s rounds until ``--calls`` calls were made, while nobody reads
the bus (the worst case: the send queue fills). Reports the calls, the peak RSS
(``VmHWM``, counted from the baseline), what the probes said they read and dropped, and
whether every call was read or counted. Goal: peak ≤ 256 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gpuwhy.bus import Subscriber

HERE = Path(__file__).resolve().parent
STORM_C = HERE.parent / "tests" / "replay" / "storm.c"
CHECK_VERSION_STR = "0xc04846d2"
GOAL_MB = 256
ROUND_S = 5.0


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


def run(calls: int = 10_000_000, threads: int = 2, round_s: float = ROUND_S) -> dict:
    """Storm `gpuwhy probes` with at least ``calls`` notable calls in rounds of ``round_s``;
    the figures, and the probes' health after it (``state``, ``counters``). The storm test
    (tests/privileged/test_probe_memory.py) runs it small."""
    work = Path(tempfile.mkdtemp(prefix="gpuwhy-bench-storm-"))
    storm = work / "storm"
    subprocess.run(["gcc", "-O2", "-pthread", "-o", str(storm), str(STORM_C)], check=True)
    devices = work / "dev"
    devices.mkdir()
    endpoint = f"ipc://{work}/bus.sock"
    env = dict(os.environ, GPUWHY_BUS=endpoint, GPUWHY_DEVICE_GLOB=f"{devices}/nvidia*",
               GPUWHY_DB=str(work / "gpuwhy.db"), GPUWHY_POLL_INTERVAL="1.0")
    subscriber = Subscriber(endpoint)
    reading, done = threading.Event(), threading.Event()
    reading.set()
    health: list = []

    def read() -> None:
        while not done.is_set():
            if not reading.is_set():      # take nothing: the probes' send queue fills
                subscriber.process_commands()
                time.sleep(0.05)
                continue
            for envelope in subscriber.receive_many(0.1, 10_000):
                event = envelope.event
                if getattr(event, "source", None) == "fdtrack" and hasattr(event, "counters"):
                    health.append(event)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    probes = subprocess.Popen([sys.executable, "-m", "gpuwhy", "probes"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not health:
            if probes.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the probes did not start")
            time.sleep(0.2)
        reading.clear()
        time.sleep(2.0)                   # settled: the compiler's peak behind it
        Path(f"/proc/{probes.pid}/clear_refs").write_text("5")   # VmHWM counts from here
        baseline_kb = _status_kb(probes.pid, "VmRSS")
        made, seconds = 0, 0.0
        while made < calls:
            ran = subprocess.run([str(storm), str(devices / "nvidiactl"), str(threads),
                                  str(round_s), CHECK_VERSION_STR], capture_output=True,
                                 text=True, check=True)
            report = json.loads(ran.stdout)
            made += report["calls"]
            seconds += report["seconds"]
            if probes.poll() is not None:
                raise RuntimeError("the probes died in the storm")
        time.sleep(1.0)
        peak_kb = _status_kb(probes.pid, "VmHWM")
        after_kb = _status_kb(probes.pid, "VmRSS")
        ended_ns = time.time_ns()
        health.clear()
        reading.set()
        # the health sent after the storm (those queued during it are older)
        deadline = time.monotonic() + 60
        while not (health and health[-1].ts > ended_ns) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        done.set()
        probes.terminate()
        probes.wait(30)
        reader.join(5)
        subscriber.close()
    counters = health[-1].counters if health else {}
    state = health[-1].state if health else None
    read_or_dropped = counters.get("records", 0) + counters.get("dropped_ringbuf_full", 0)
    return {"calls": made, "seconds": round(seconds, 1), "baseline_mb": baseline_kb / 1024,
            "peak_mb": peak_kb / 1024, "after_mb": after_kb / 1024,
            "growth_mb": (peak_kb - baseline_kb) / 1024, "records": counters.get("records"),
            "dropped": counters.get("dropped_ringbuf_full"),
            "all_accounted": read_or_dropped >= made, "goal_mb": GOAL_MB,
            "state": state, "counters": counters}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000_000)
    parser.add_argument("--threads", type=int, default=2)
    f = run(parser.parse_args().calls, parser.parse_args().threads)
    print(f"storm: {f['calls']:,} notable calls in {f['seconds']} s; probes RSS "
          f"{f['baseline_mb']:.0f} MB before (the baseline), peak {f['peak_mb']:.0f} MB "
          f"(+{f['growth_mb']:.0f}), {f['after_mb']:.0f} MB after; read {f['records']}, "
          f"dropped and counted {f['dropped']}; every call accounted: {f['all_accounted']} "
          f"(goal: peak ≤ {GOAL_MB} MB)")


if __name__ == "__main__":
    main()
