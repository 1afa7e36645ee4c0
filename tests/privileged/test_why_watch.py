"""`gpuwhy why --duration 30` with no service running: a 30 s watch of a starved training job,
all real but the GPU (the real probes time the stand-in trainer and its decoding worker; the
simulator's GPU idles as an input-starved one does), answered with the rules fitted to what
was watched and saying how sure it is."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gpuwhy.lifeline import child_environment

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_a_short_watch_names_the_starved_input(tmp_path):
    devices = tmp_path / "dev"
    devices.mkdir()
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"):
        (devices / name).touch()
    env = child_environment({
        "PATH": "/usr/bin:/bin", "GPUWHY_DB": str(tmp_path / "none" / "gpuwhy.db"),
        "GPUWHY_BUS": f"ipc://{tmp_path}/bus.sock", "GPUWHY_DEVICE_GLOB": f"{devices}/nvidia*",
        "GPUWHY_POLL_INTERVAL": "0.5", "GPUWHY_GPU_SOURCE": "sim",
        "GPUWHY_SIM_SCENARIO": "input-starved", "GPUWHY_SIM_EVENT_AFTER": "0",
        "GPUWHY_CHECK_PROGRESS": "60"})
    trainer = subprocess.Popen(
        [sys.executable, "-m", "gpuwhy.app.demo.standin", "train", str(devices), "--minor", "0",
         "--workers", "1", "--starved", "--decode"],
        stdout=subprocess.PIPE, text=True, env=env)
    try:
        trainer.stdout.readline()          # its pid: it holds nvidia0 and feeds its worker
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "gpuwhy", "why", "--duration", "30",
                                 "--json"], capture_output=True, text=True, env=env,
                                timeout=180)
        took = time.monotonic() - started
    finally:
        trainer.terminate()
        trainer.wait(10)
    assert result.returncode == 1, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert 30 <= report["watched_s"] < 40
    [first, *_] = report["verdicts"]
    assert first["lead"]["rule_id"] == "R01_input_cpu_bound", first
    assert first["gpu"]["index"] == 0
    # a 30 s look at a rule that reads its 60 s window for 2 minutes: possibly, not certainly
    assert 0 < first["sureness"] < 0.5
    assert "no service running" in result.stderr
    print(f"answered in {took:.0f} s of wall time")   # the probes load before the watch
