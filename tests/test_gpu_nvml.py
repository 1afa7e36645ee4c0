"""The NVML source against nvidia-ml-py's real module with its nvml* calls stood in for.

Only the functions that would reach libnvidia-ml.so are replaced (monkeypatch on the
real ``pynvml`` module); the exception classes and constants are nvidia-ml-py's own.
None of this has run against a real GPU.
"""

import os
import threading
import types

import pynvml
import pytest

from gpuwhy.events import GpuProcesses, GpuSample, GpuState, GpuXid
from gpuwhy.probes.gpu.nvml import NvmlSource
from gpuwhy.probes.gpu.source import SourceUnavailable


def error(code):
    return pynvml.NVMLError(code)   # NVMLError(code) builds the matching subclass


class Handle:
    """Stands for a c_nvmlDevice_t pointer: hashable, compared by identity."""

    def __init__(self, index):
        self.index = index


class FakeNvml:
    """Two GPUs; ``broken`` maps (function name, gpu index) to an NVML error code."""

    def __init__(self, monkeypatch):
        self.broken = {}
        self.init_error = None
        self.xids = []
        self.xid_ready = threading.Event()
        self.util_calls = []
        self.handles = [Handle(i) for i in range(2)]
        calls = {
            "nvmlInit": self.init, "nvmlShutdown": lambda: None,
            "nvmlSystemGetDriverVersion": lambda: "550.54.15",
            "nvmlDeviceGetCount": lambda: 2,
            "nvmlDeviceGetHandleByIndex": lambda i: self.handles[i],
            "nvmlDeviceGetUUID": lambda h: f"GPU-{h.index}{h.index}",
            "nvmlDeviceGetName": lambda h: "NVIDIA L4",
            "nvmlDeviceGetPciInfo": lambda h: types.SimpleNamespace(
                busId=f"00000000:{h.index + 1:02X}:00.0".encode()),
            "nvmlDeviceGetMinorNumber": lambda h: h.index,
            "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=90, memory=30),
            "nvmlDeviceGetEncoderUtilization": lambda h: [0, 167000],
            "nvmlDeviceGetDecoderUtilization": lambda h: [0, 167000],
            "nvmlDeviceGetClockInfo": lambda h, t: 2040 if t == pynvml.NVML_CLOCK_SM else 6251,
            "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x4,
            "nvmlDeviceGetPerformanceState": lambda h: 0,
            "nvmlDeviceGetTemperature": lambda h, s: 66,
            "nvmlDeviceGetPowerUsage": lambda h: 70500,
            "nvmlDeviceGetEnforcedPowerLimit": lambda h: 72000,
            "nvmlDeviceGetTotalEnergyConsumption": lambda h: 123456,
            "nvmlDeviceGetMemoryInfo": lambda h, version=None: types.SimpleNamespace(
                total=24 << 30, used=12 << 30, free=12 << 30),
            "nvmlDeviceGetPcieReplayCounter": lambda h: 0,
            "nvmlDeviceGetPcieThroughput": lambda h, c: 1000,
            "nvmlDeviceGetTotalEccErrors": lambda h, e, c: 0,
            "nvmlDeviceGetRemappedRows": lambda h: (0, 0, 0, 0),
            "nvmlDeviceGetComputeRunningProcesses": lambda h: [
                types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 << 30),
                types.SimpleNamespace(pid=2**22 + 7, usedGpuMemory=None)],
            "nvmlDeviceGetComputeRunningProcesses_v2": lambda h: [],
            "nvmlDeviceGetProcessUtilization": self.process_util,
            "nvmlEventSetCreate": lambda: "event-set",
            "nvmlDeviceRegisterEvents": lambda h, types_, es: None,
            "nvmlEventSetWait": self.wait,
            "nvmlEventSetFree": lambda es: None,
        }
        for name, fn in calls.items():
            assert hasattr(pynvml, name), name   # same names as the real binding
            monkeypatch.setattr(pynvml, name, self.breakable(name, fn))

    def breakable(self, name, fn):
        def call(*args, **kwargs):
            handle = args[0] if args and hasattr(args[0], "index") else None
            code = self.broken.get((name, handle.index if handle else None))
            if code is not None:
                raise error(code)
            return fn(*args, **kwargs)
        return call

    def init(self):
        if self.init_error is not None:
            raise error(self.init_error)

    def process_util(self, handle, last_seen):
        self.util_calls.append(last_seen)
        if last_seen:
            raise error(pynvml.NVML_ERROR_NOT_FOUND)   # nothing newer than last_seen
        return [types.SimpleNamespace(pid=os.getpid(), timeStamp=5000, smUtil=80, memUtil=20,
                                      encUtil=0, decUtil=0)]

    def wait(self, event_set, timeout_ms):
        if self.xids:
            index, xid = self.xids.pop(0)
            return types.SimpleNamespace(device=self.handles[index], eventData=xid,
                                         eventType=pynvml.nvmlEventTypeXidCriticalError)
        self.xid_ready.set()
        threading.Event().wait(timeout_ms / 1000 / 10)
        raise error(pynvml.NVML_ERROR_TIMEOUT)


@pytest.fixture
def nvml(monkeypatch):
    return FakeNvml(monkeypatch)


@pytest.mark.parametrize("code, reason", [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "library not found"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "version mismatch"),
])
def test_init_failures_are_clear_reasons(nvml, code, reason):
    nvml.init_error = code
    with pytest.raises(SourceUnavailable, match=reason):
        NvmlSource().open()


def test_identity_fields_and_units(nvml):
    source = NvmlSource(xid_events=False)
    gpus = source.open()
    assert [(g.id, g.identity.pci_bus_id, g.identity.minor, g.model) for g in gpus] == [
        ("GPU-00", "0000:01:00.0", 0, "NVIDIA L4"), ("GPU-11", "0000:02:00.0", 1, "NVIDIA L4")]
    sample = next(e for e in source.read() if isinstance(e, GpuSample))
    f = sample.fields
    assert (f["gpu_util"], f["mem_util"], f["sm_clock_mhz"], f["temp_c"]) == (90, 30, 2040, 66)
    assert f["power_w"] == 70.5 and f["power_limit_w"] == 72.0
    assert f["fb_used_mib"] == 12 * 1024 and f["pcie_rx_bytes_per_s"] == 1000 * 1024
    assert f["clocks_event_reasons"] == 0x4
    source.close()


def test_not_supported_is_missing_not_zero(nvml):
    nvml.broken[("nvmlDeviceGetPowerUsage", 0)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.broken[("nvmlDeviceGetRemappedRows", 0)] = pynvml.NVML_ERROR_NO_PERMISSION
    source = NvmlSource(xid_events=False)
    source.open()
    samples = {e.gpu_id: e for e in source.read() if isinstance(e, GpuSample)}
    assert "power_w" not in samples["GPU-00"].fields
    assert "row_remap_failed" not in samples["GPU-00"].fields
    assert samples["GPU-11"].fields["power_w"] == 70.5
    assert "power_w not available on 1 GPU(s)" in source.notes()


def test_gpu_lost_becomes_an_event_and_the_gpu_is_left_alone(nvml):
    source = NvmlSource(xid_events=False)
    source.open()
    nvml.broken[("nvmlDeviceGetUtilizationRates", 1)] = pynvml.NVML_ERROR_GPU_IS_LOST
    events = source.read()
    [state] = [e for e in events if isinstance(e, GpuState)]
    assert (state.gpu_id, state.state) == ("GPU-11", "lost")
    assert {e.gpu_id for e in events if isinstance(e, GpuSample)} == {"GPU-00"}
    later = source.read()
    assert {e.gpu_id for e in later} == {"GPU-00"}   # no more calls on the lost GPU
    assert any(n.startswith("GPU-11: lost") for n in source.notes())


def test_processes_with_memory_and_utilisation_samples(nvml):
    source = NvmlSource(xid_events=False)
    source.open()
    [procs, _] = [e for e in source.read() if isinstance(e, GpuProcesses)]
    mine, gone = procs.processes
    assert mine["pid"] == os.getpid() and mine["start_time"] > 0
    assert mine["used_memory_mib"] == 3 * 1024 and (mine["sm_util"], mine["mem_util"]) == (80, 20)
    assert gone["start_time"] is None and gone["used_memory_mib"] is None
    assert gone["sm_util"] is None
    [procs, _] = [e for e in source.read() if isinstance(e, GpuProcesses)]
    assert procs.processes[0]["sm_util"] is None   # NOT_FOUND: no newer sample, no crash
    assert nvml.util_calls[-1] == 5000              # asked only for what is newer


def test_old_driver_falls_back_to_v2_process_list(nvml, monkeypatch):
    def mismatch(handle):
        raise pynvml.NVMLLibraryMismatchError("driver older than binding")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", mismatch)
    source = NvmlSource(xid_events=False)
    source.open()
    procs = [e for e in source.read() if isinstance(e, GpuProcesses)]
    assert [p.processes for p in procs] == [[], []]


def test_xid_thread_turns_events_into_gpu_xid(nvml):
    nvml.xids = [(1, 79)]
    source = NvmlSource()
    source.open()
    assert nvml.xid_ready.wait(5)
    xids = [e for e in source.read() if isinstance(e, GpuXid)]
    source.close()
    assert [(x.gpu_id, x.xid, x.source) for x in xids] == [("GPU-11", 79, "nvml")]


def test_nvml_xids_are_only_those_seen_waiting_never_before_start(nvml):
    # NVML has no last-Xid value to read at start: nothing from before start to mark
    nvml.xids = [(0, 13)]
    source = NvmlSource()
    source.open()
    assert nvml.xid_ready.wait(5)
    xids = [e for e in source.read() if isinstance(e, GpuXid)]
    source.close()
    assert [(x.xid, x.before_start) for x in xids] == [(13, False)]
