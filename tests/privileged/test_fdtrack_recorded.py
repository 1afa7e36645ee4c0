"""The real fdtrack probe against a real CUDA process's driver calls, recorded on a GPU host.

tests/data/real/<gpu>/nvtrace/calls.nvt.gz holds every ioctl the real-GPU kit's PyTorch load
sent to the NVIDIA driver, with the bytes the driver left in each parameter struct. They are
sent again here, on look-alike device files (each call fails with ENOTTY, the structs are in
memory all the same), to the probe loaded in this kernel: its counts, bytes and statuses
must be what gpuwhy.app.demo.recorded.decode reads from the same bytes (tests/
test_real_driver_calls.py checks that reading against the driver's own answers).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwhy.nvioctl import parse_driver_version
from gpuwhy.proc import process_key

pytestmark = pytest.mark.root

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
RECORDINGS = sorted(p.parent.parent for p in REAL.glob("*/nvtrace/calls.nvt.gz"))
STATS_SQL = ("select path, cmd, sub, count, errors, bytes from driver_call_stats "
             "where pid = ? and start_time = ?")


def _stats(rows):
    return {f"{path}|{cmd}|{sub}": {"count": count, "errors": errors, "bytes": nbytes}
            for path, cmd, sub, count, errors, nbytes in rows}


def test_there_is_a_recording():
    assert RECORDINGS


@pytest.mark.parametrize("folder", RECORDINGS, ids=lambda p: p.name)
def test_a_real_cuda_process_calls_are_counted_and_read_as_recorded(pipeline_for, probe_config,
                                                                   folder):
    version = ".".join(str(n) for n in
                       parse_driver_version((folder / "host/driver-version.txt").read_text()))
    pipe = pipeline_for(probe_config.replace({"probes.driver_version": version}))
    directory = Path(probe_config["probes.device_glob"]).parent
    proc = subprocess.Popen([sys.executable, "-m", "gpuwhy.app.demo.standin", "replay-recording",
                             str(folder / "nvtrace/calls.nvt.gz"), str(directory),
                             "--driver-version", version, "--hold"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        report = json.loads(proc.stdout.readline())
        key = process_key(report["pid"])
        expected = report["expected"]
        assert sum(v["count"] for v in expected.values()) == report["calls"] > 100
        rows = pipe.wait_for(STATS_SQL, [key.pid, key.start_time],
                             lambda r: _stats(r) == expected, timeout=60)
        assert _stats(rows) == expected
        # every call failed here (ENOTTY) and is reported one by one: the status the probe
        # read from each is the one the real driver wrote, NV_OK
        calls = pipe.wait_for("select op, status, version from driver_calls "
                              "where pid = ? and start_time = ?", [key.pid, key.start_time],
                              lambda r: {op for op, _, _ in r} >= {"UVM_FREE",
                                                                   "NV_ESC_CHECK_VERSION_STR"})
        ops = {op for op, _, _ in calls}
        assert {"NV_ESC_RM_ALLOC", "NV_ESC_RM_CONTROL", "UVM_MAP_EXTERNAL_ALLOCATION",
                "UVM_FREE", "NV_ESC_CHECK_VERSION_STR"} <= ops
        assert {(op, status) for op, status, _ in calls if status} == set()
        assert {parse_driver_version(v) for op, _, v in calls
                if op == "NV_ESC_CHECK_VERSION_STR"} == {parse_driver_version(version)}
    finally:
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=10)
