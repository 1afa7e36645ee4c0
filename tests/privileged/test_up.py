"""`gpuwhy up` as a user runs it: a real process tree, the page, and a clean SIGTERM."""

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpuwhy.proc import process_key

pytestmark = pytest.mark.root


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url):
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.read().decode()


def _wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except OSError:
            pass
        time.sleep(0.2)
    return None


def _children(pid):
    # every thread's: the service starts the probes from a thread of its own (gpuwhy.app.service)
    children = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        children += [int(p) for p in path.read_text().split()]
    return children


def test_up_serves_the_replay_process_and_stops_cleanly_on_sigterm(tmp_config, tmp_path, replay):
    port = _free_port()
    env = {**os.environ, "GPUWHY_DB": tmp_config["store.path"],
           "GPUWHY_BUS": tmp_config["bus.endpoint"],
           "GPUWHY_DEVICE_GLOB": tmp_config["probes.device_glob"],
           "GPUWHY_POLL_INTERVAL": "0.2", "GPUWHY_REFRESH": "0.5"}
    log = open(tmp_path / "up.log", "w+")
    up = subprocess.Popen([sys.executable, "-m", "gpuwhy", "up", "--port", str(port)],
                          env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    proc = None
    try:
        assert _wait_until(lambda: json.loads(_get(f"{base}/healthz"))["status"] == "ok", 20)
        def probes_reporting():
            sources = json.loads(_get(f"{base}/healthz"))["sources"]
            return any(s["source"] == "fdtrack" for s in sources)
        probes = _wait_until(probes_reporting, 30)
        assert probes, "the probes never reported: " + (tmp_path / "up.log").read_text()
        proc = replay.start(rounds=2)
        report = json.loads(proc.stdout.readline())
        key = str(process_key(report["pid"]))
        total = sum(figures["count"] for figures in report["expected"].values())
        controls = sum(figures["count"] for name, figures in report["expected"].items()
                       if int(name.split("|")[1]) == 0xC020462A)

        def replay_listed():
            rows = json.loads(_get(f"{base}/api/processes"))
            return next((r for r in rows if r["key"] == key and r["ioctl_total"] == total),
                        None)
        row = _wait_until(replay_listed, 15)
        assert row, _get(f"{base}/api/processes")
        assert {d["device"] for d in row["devices"]} == {"nvidiactl", "nvidiaN", "nvidia-uvm"}
        page = _get(f"{base}/processes")   # "/" is the GPU overview
        assert key in page and f"NV_ESC_RM_CONTROL × {controls}" in page
        children = _children(up.pid)
        assert children, "gpuwhy up should run the probes as a child process"
    finally:
        if proc is not None:
            proc.communicate("\n", timeout=10)
        started = time.monotonic()
        up.send_signal(signal.SIGTERM)
        code = up.wait(timeout=10)
        elapsed = time.monotonic() - started
    log.seek(0)
    output = log.read()
    assert code == 0, output
    assert elapsed < 5, f"stopping took {elapsed:.1f} s"
    assert "stopped cleanly" in output and "Traceback" not in output
    for child in children:
        assert not os.path.exists(f"/proc/{child}") or \
            open(f"/proc/{child}/stat").read().split()[2] == "Z"
    with sqlite3.connect(tmp_config["store.path"]) as db:
        assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
    bus_file = tmp_config["bus.endpoint"].removeprefix("ipc://")
    assert not os.path.exists(bus_file), "a clean stop left the bus socket file"
