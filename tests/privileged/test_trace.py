"""`gpuwhy trace` as a user runs it, against the replay program."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

COMM = Path(sys.executable).name[:15]      # what the kernel calls the replay process
REQUIRED = {"ts", "pid", "start_time", "comm", "device", "fd", "cmd", "nr", "op", "latency_ns",
            "ret"}


def _trace(tmp_config, replay, *options):
    command = [sys.executable, "-m", "gpuwhy", "trace", "--device-glob",
               tmp_config["probes.device_glob"], "--duration", "12", *options]
    tracer = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    for line in tracer.stderr:                          # compile + attach, then it says so
        if line.startswith("Tracing driver calls"):
            break
    proc = replay.start(rounds=2, threads=2)
    report = json.loads(proc.stdout.readline())
    proc.communicate("\n", timeout=10)
    tracer.send_signal(2)                              # Ctrl-C ends it early, cleanly
    out, err = tracer.communicate(timeout=15)
    assert tracer.returncode == 0, err
    return report, out


def test_trace_json_has_every_call_decoded(tmp_config, replay):
    report, out = _trace(tmp_config, replay, "--json", "--pid", "0")
    calls = [json.loads(line) for line in out.splitlines()]
    mine = [c for c in calls if c["pid"] == report["pid"]]
    assert len(mine) == sum(f["count"] for f in report["expected"].values())
    assert all(REQUIRED <= set(call) for call in mine)
    assert {c["comm"] for c in mine} == {COMM}
    version = [c for c in mine if c["op"] == "NV_ESC_CHECK_VERSION_STR"]
    assert {c["version"] for c in version} == {report["version"]}
    controls = {c["rm_control_name"] for c in mine if c["op"] == "NV_ESC_RM_CONTROL"}
    assert "NV0000_CTRL_CMD_GPU_ATTACH_IDS" in controls
    classes = {c["rm_class_name"] for c in mine if c["op"] == "NV_ESC_RM_ALLOC"}
    assert {"NV01_DEVICE_0", "HOPPER_CHANNEL_GPFIFO_A"} <= classes
    failed = [c for c in mine if c.get("status") == 0x51]
    assert failed and {c["status_name"] for c in failed} == {"NV_ERR_NO_MEMORY"}


def test_trace_summary_counts_per_operation(tmp_config, replay):
    report, out = _trace(tmp_config, replay, "--summary", "--comm", COMM)
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines[0][:3] == ["PID", "COMM", "OP"]
    uvm = [row for row in lines[1:] if row[0] == str(report["pid"]) and
           row[2] == "UVM_INITIALIZE"]
    assert uvm and uvm[0][3] == "4"            # 2 rounds x 2 threads
