"""An idle `gpuwhy up` sleeps: its threads and the probes wake for work and beats, not to
look (issue #23). Counted from the kernel's context switches of each thread, with bounds
generous enough for a loaded machine (GIL hand-offs count as switches too). "Idle" is a
host with no GPU work, not one where nothing happens: a shell loop starts some twenty
processes a second meanwhile, which the probes read in batches (CI's host once made them
wake seven times a second while each exec, fork and exit woke them)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

WINDOW_S = 8.0         # more than a 5 s health beat: one beat more or less does not decide
# per-second bounds; the figures measured on an idle 2-core machine are in the comments
BOUNDS = {
    # all threads of the probes process: ~3.5, up to ~5 in the VM's slow hours (preempted
    # more); ~97 with each record read, the regression this bound is for
    "probes": 10.0,
    "web-deadlines": 1.0,   # ~0 with no request being read (was 4: a 0.25 s tick)
    "correlator": 9.0,      # ~4.5: the simulated GPUs' samples, the decide beat, health
    "main": 2.0,            # the main thread: ~0.5 (thread and watchdog checks every 5 s)
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _switches(pid: int) -> dict[tuple[int, str], int]:
    """Voluntary + involuntary context switches of each thread of ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        total = sum(int(line.split()[1]) for line in status.splitlines()
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
        out[(int(task.name), name)] = total
    return out


def _children(pid: int) -> list[int]:
    children = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        children += [int(p) for p in path.read_text().split()]
    return children


def _healthz(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
        return json.loads(response.read())


def test_an_idle_service_and_its_probes_sleep_between_beats(tmp_config, tmp_path):
    port = _free_port()
    env = {**os.environ, "GPUWHY_DB": tmp_config["store.path"],
           "GPUWHY_BUS": tmp_config["bus.endpoint"],
           "GPUWHY_DEVICE_GLOB": tmp_config["probes.device_glob"],
           "GPUWHY_GPU_SOURCE": "sim", "GPUWHY_CUDA_CONTROL_DIR": str(tmp_path),
           # idle from now: a first run reads the boot's journal from its start, and a host
           # whose journal holds hours of lines (a CI box after many suites) is busy reading
           # them, not idle, for as long as that takes
           "GPUWHY_KLOG_START": "now"}
    for name in ("GPUWHY_POLL_INTERVAL", "GPUWHY_FLUSH_INTERVAL"):   # the shipped defaults
        env.pop(name, None)
    log = open(tmp_path / "up.log", "w+")
    up = subprocess.Popen([sys.executable, "-m", "gpuwhy", "up", "--port", str(port)],
                          env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                sources = {s["source"] for s in _healthz(port)["sources"]}
                if {"fdtrack", "gpu", "klog"} <= sources:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail("the service never became ready: " + (tmp_path / "up.log").read_text())
        time.sleep(3)                        # past start-up's one-off work
        [probes] = _children(up.pid)
        churn = subprocess.Popen(["sh", "-c", "while :; do /bin/true; sleep 0.1; done"])
        try:
            time.sleep(1)
            before = {**_switches(up.pid), **_switches(probes)}
            time.sleep(WINDOW_S)
            after = {**_switches(up.pid), **_switches(probes)}
        finally:
            churn.kill()
            churn.wait()
        rate: dict[str, float] = {}
        each: dict[str, float] = {}          # the probes' threads one by one, for the message
        for (tid, name), count in after.items():
            woke = (count - before.get((tid, name), count)) / WINDOW_S
            in_probes = Path(f"/proc/{probes}/task/{tid}").exists()
            # the main thread's name is the interpreter's (python, python3.11, ...)
            group = "probes" if in_probes else "main" if tid == up.pid else name
            rate[group] = rate.get(group, 0.0) + woke
            key = f"probes:{name}" if in_probes else name
            each[key] = each.get(key, 0.0) + woke
        shown = ", ".join(f"{k} {v:.1f}/s" for k, v in sorted(each.items()))
        assert "correlator" in rate and "web-deadlines" in rate, shown    # threads are named
        for group, bound in BOUNDS.items():
            assert rate.get(group, 0.0) <= bound, f"{group} woke too often: {shown}"
        detail = next(s["detail"] for s in _healthz(port)["sources"] if s["source"] == "klog")
        if "/dev/kmsg" in detail:            # a reader the kernel wakes: no looking every 0.1 s
            assert rate["source-klog"] <= 2.0, shown
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(20)
        except subprocess.TimeoutExpired:
            up.kill()
            up.wait()
        log.close()
