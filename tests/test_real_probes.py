"""gpuwhy's eBPF driver-call probe on a real NVIDIA driver, against the calls the process sent.

Where the real-GPU kit carried bcc (scripts/gpu-kit-wheels.sh --bcc), it ran `gpuwhy trace
--json` (the fdtrack probe, as the service loads it) from before its PyTorch load started to
after it quit, while scripts/nvtrace.c, preloaded into that load alone, recorded each ioctl
it sent with the parameter bytes before and after the driver had them. Both are in
tests/data/real/<gpu>/: probes/trace.jsonl.gz and nvtrace/calls.nvt.gz. The probe saw the
calls in the kernel; the recorder saw them in the process: for that process, the two must be
the same calls, in the same order, read the same way. Also here: what the probe read of the
other processes on the GPU (NVML's clients, nvidia-smi), and P1 on the real driver.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpuwhy.app.demo.recorded import decode, read_calls
from gpuwhy.nvioctl import RM_STATUS, parse_driver_version

REAL = Path(__file__).parent / "data" / "real"
RECORDINGS = sorted(p.parent.parent for p in REAL.glob("*/probes/trace.jsonl.gz"))


@pytest.fixture(params=RECORDINGS, ids=lambda p: p.name)
def folder(request) -> Path:
    return request.param


def traced(folder: Path) -> list[dict]:
    with gzip.open(folder / "probes/trace.jsonl.gz", "rt") as lines:
        return [json.loads(line) for line in lines]


def load_pid(folder: Path) -> int:
    return json.loads((folder / "work/work.json").read_text())["pid"]


def driver(folder: Path) -> tuple[int, ...]:
    return parse_driver_version((folder / "host/driver-version.txt").read_text())


def test_there_is_a_recording():
    assert RECORDINGS


def test_the_probe_saw_each_call_the_load_sent_read_as_the_driver_answered(folder):
    """Call for call: request, thread, fd, return, RM status, class or control, bytes."""
    sent = read_calls(folder / "nvtrace/calls.nvt.gz")
    seen = [call for call in traced(folder) if call["pid"] == load_pid(folder)]
    assert len(sent) > 100
    assert len(seen) == len(sent)
    version = driver(folder)
    for n, (call, probe) in enumerate(zip(sent, seen, strict=True)):
        read = decode(call, version)
        where = f"call {n}: {read.name}"
        assert (probe["cmd"], probe["tid"], probe["fd"], probe["ret"]) == \
            (call.request, call.tid, call.fd, call.ret), where
        assert probe["op"] == read.name, where
        if read.status is not None:
            assert probe["status"] == read.status, where
        if read.known and read.sub:
            assert read.sub in (probe.get("rm_class"), probe.get("rm_control")), where
        assert probe.get("bytes", 0) == read.nbytes, where
        assert probe["latency_ns"] > 0, where


def test_every_call_on_the_host_is_named_and_went_through(folder):
    """Every process's calls (the load, NVML's clients, nvidia-smi): a known operation, and
    for an RM call a named class or control; on a healthy GPU each answered NV_OK."""
    calls = traced(folder)
    assert len({call["pid"] for call in calls}) > 1
    for call in calls:
        assert not call["op"].startswith("0x"), call
        if "rm_class" in call:
            assert call["rm_class_name"] and not call["rm_class_name"].startswith("0x"), call
        if "rm_control" in call:
            assert call["rm_control_name"] and not call["rm_control_name"].startswith("0x"), \
                call
        assert (call["ret"], call["status"]) == (0, 0), call
    assert RM_STATUS[0] == "NV_OK"


def test_the_version_check_read_is_the_drivers(folder):
    """NV_ESC_CHECK_VERSION_STR: the string each process checked is the driver's version."""
    checks = [call for call in traced(folder) if call["op"] == "NV_ESC_CHECK_VERSION_STR"]
    assert checks
    assert {parse_driver_version(call["version"]) for call in checks} == {driver(folder)}


def test_the_probe_lost_no_call(folder):
    assert "lost" not in (folder / "probes/trace.err").read_text()


def test_p1_was_measured_on_the_real_driver(folder):
    """The traced call is a real RM control that succeeded (bench_probes.c exits non-zero
    otherwise): slower than any look-alike file, since the driver's own time is in it."""
    p1 = json.loads((folder / "probes/p1.json").read_text())
    tracked, other = p1["tracked ioctl"], p1["untracked ioctl"]
    assert len(tracked["none_runs"]) == len(tracked["probes_runs"]) >= 3
    assert min(tracked["none_runs"]) > 2 * max(other["none_runs"])
