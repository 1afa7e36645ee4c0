"""The NVML source against nvidia-ml-py's real module with its nvml* calls stood in for.

Only the functions that would reach libnvidia-ml.so are replaced (monkeypatch on the
real ``pynvml`` module); the exception classes and constants are nvidia-ml-py's own.
None of this has run against a real GPU.
"""

import ctypes
import logging
import os
import threading
import types

import pynvml
import pytest

from gpuwhy.events import GpuProcesses, GpuSample, GpuState, GpuXid
from gpuwhy.probes.gpu import nvml as nvml_module
from gpuwhy.probes.gpu.nvml import NvmlSource
from gpuwhy.probes.gpu.source import SourceUnavailable


def error(code):
    return pynvml.NVMLError(code)   # NVMLError(code) builds the matching subclass


class Handle:
    """Stands for a c_nvmlDevice_t pointer: hashable, compared by identity."""

    def __init__(self, index):
        self.index = index


SM, TENSOR, DRAM = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
GPM_FIELDS = {"sm_active", "tensor_active", "dram_active"}
H100 = "NVIDIA H100 80GB HBM3"


def address(sample):
    return ctypes.cast(sample, ctypes.c_void_p).value


class FakeNvml:
    """Two GPUs; ``broken`` maps (function name, gpu index) to an NVML error code.

    GPM: ``gpm`` maps a GPU index to its metric percentages {metric id: percent} (a GPU
    not in it says it has no GPM, like the L4 it is named), ``gpm_failing`` maps
    (gpu index, metric id) to that metric's own nvmlReturn. Sample buffers are real
    ``c_nvmlGpmSample_t`` pointers to fake addresses, so that they fit the real
    ``c_nvmlGpmMetricsGet_t``; ``gpm_buffers`` maps a live address to (gpu index, sample
    number) of the sample in it, or None before the first sample.
    """

    def __init__(self, monkeypatch):
        self.broken = {}
        self.names = ["NVIDIA L4", "NVIDIA L4"]
        self.gpm = {}
        self.gpm_failing = {}
        self.gpm_buffers = {}
        self.gpm_allocated = []
        self.gpm_freed = []
        self.gpm_pairs = []   # (gpu index, older sample number, newer sample number)
        self.gpm_samples = 0
        self.shut_down = False
        self.init_error = None
        self.xids = []
        self.xid_ready = threading.Event()
        self.util_calls = []
        self.handles = [Handle(i) for i in range(2)]
        # PCIe link per GPU index: (current gen, current width, max gen, max width)
        self.pcie = {0: (1, 16, 4, 16), 1: (4, 8, 4, 16)}
        self.remapped = (0, 0, 0, 0)
        # NVLink per GPU index: {link: (active, {NVML DL error counter: count})}; a GPU not
        # in it has no NVLink (NOT_SUPPORTED), links past its last are INVALID_ARGUMENT
        self.nvlinks = {}
        self.nvlink_state_calls = 0
        # Fabric per GPU index: (NVML state, status, health summary); a GPU not in it has no
        # fabric probe (NOT_SUPPORTED, as an L4). The driver knows the V call (or not) and
        # structs up to fabric_version; fabric_calls logs (call, struct version) asked.
        self.fabric = {}
        self.fabric_version = 3
        self.fabric_v_call = True
        self.fabric_calls = []
        calls = {
            "nvmlInit": self.init, "nvmlShutdown": self.shutdown,
            "nvmlSystemGetDriverVersion": lambda: "550.54.15",
            "nvmlDeviceGetCount": lambda: 2,
            "nvmlDeviceGetHandleByIndex": lambda i: self.handles[i],
            "nvmlDeviceGetUUID": lambda h: f"GPU-{h.index}{h.index}",
            "nvmlDeviceGetName": lambda h: self.names[h.index],
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
            "nvmlDeviceGetRemappedRows": lambda h: self.remapped,
            "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: self.pcie[h.index][0],
            "nvmlDeviceGetCurrPcieLinkWidth": lambda h: self.pcie[h.index][1],
            "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: self.pcie[h.index][2],
            "nvmlDeviceGetMaxPcieLinkWidth": lambda h: self.pcie[h.index][3],
            "nvmlDeviceGetNvLinkState": self.nvlink_state,
            "nvmlDeviceGetNvLinkErrorCounter": self.nvlink_errors,
            "nvmlDeviceGetGpuFabricInfoV": self.fabric_info_v,
            "nvmlDeviceGetGpuFabricInfo": self.fabric_info_v1,
            "nvmlDeviceGetComputeRunningProcesses": lambda h: [
                types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 << 30),
                types.SimpleNamespace(pid=2**22 + 7, usedGpuMemory=None)],
            "nvmlDeviceGetComputeRunningProcesses_v2": lambda h: [],
            "nvmlDeviceGetProcessUtilization": self.process_util,
            "nvmlEventSetCreate": lambda: "event-set",
            "nvmlDeviceRegisterEvents": lambda h, types_, es: None,
            "nvmlEventSetWait": self.wait,
            "nvmlEventSetFree": lambda es: None,
            "nvmlGpmQueryDeviceSupport": self.gpm_support,
            "nvmlGpmSampleAlloc": self.gpm_alloc,
            "nvmlGpmSampleGet": self.gpm_sample,
            "nvmlGpmMetricsGet": self.gpm_metrics,
            "nvmlGpmSampleFree": self.gpm_free,
            "nvmlDeviceGetMigMode": self.no_mig,       # an L4 has no MIG
        }
        for name, fn in calls.items():
            assert hasattr(pynvml, name), name   # same names as the real binding
            monkeypatch.setattr(pynvml, name, self.breakable(name, fn))

    @staticmethod
    def no_mig(handle):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def breakable(self, name, fn):
        def call(*args, **kwargs):
            handle = args[0] if args and hasattr(args[0], "index") else None
            code = self.broken.get((name, handle.index if handle else None))
            if code is not None:
                raise error(code)
            return fn(*args, **kwargs)
        return call

    def nvlink_link(self, handle, link):
        if handle.index not in self.nvlinks:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link not in self.nvlinks[handle.index]:
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.nvlinks[handle.index][link]

    def nvlink_state(self, handle, link):
        self.nvlink_state_calls += 1
        active, _ = self.nvlink_link(handle, link)
        return pynvml.NVML_FEATURE_ENABLED if active else pynvml.NVML_FEATURE_DISABLED

    def nvlink_errors(self, handle, link, counter):
        _, counts = self.nvlink_link(handle, link)
        if counter not in counts:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return counts[counter]

    def fabric_info_v(self, handle, ref):
        info = ref._obj   # called as NVML's users call it: with ctypes.byref(struct)
        versions = {pynvml.nvmlGpuFabricInfo_v3: 3, pynvml.nvmlGpuFabricInfo_v2: 2}
        self.fabric_calls.append(("V", versions.get(info.version)))
        if not self.fabric_v_call:
            raise error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if versions.get(info.version, 99) > self.fabric_version:
            raise error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        self.fabric_fill(handle, info)

    def fabric_info_v1(self, handle, ref):
        self.fabric_calls.append(("v1", 1))
        assert isinstance(ref._obj, pynvml.c_nvmlGpuFabricInfo_t)
        self.fabric_fill(handle, ref._obj)

    def fabric_fill(self, handle, info):
        if handle.index not in self.fabric:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        state, status, summary = self.fabric[handle.index]
        info.state, info.status = state, status
        if hasattr(info, "healthSummary"):
            info.healthSummary = summary

    def init(self):
        if self.init_error is not None:
            raise error(self.init_error)

    def shutdown(self):
        self.shut_down = True

    def gpm_support(self, handle):
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(handle.index in self.gpm)
        return support

    def gpm_alloc(self):
        addr = 0x1000 + 0x100 * len(self.gpm_allocated)
        self.gpm_allocated.append(addr)
        self.gpm_buffers[addr] = None
        return ctypes.cast(ctypes.c_void_p(addr), pynvml.c_nvmlGpmSample_t)

    def live(self, sample):
        addr = address(sample)
        if self.shut_down or addr not in self.gpm_buffers:   # freed, or never allocated
            raise error(pynvml.NVML_ERROR_UNINITIALIZED if self.shut_down
                        else pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return addr

    def gpm_sample(self, handle, sample):
        self.gpm_samples += 1
        self.gpm_buffers[self.live(sample)] = (handle.index, self.gpm_samples)
        return sample

    def gpm_metrics(self, get):
        assert isinstance(get, pynvml.c_nvmlGpmMetricsGet_t)
        if get.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        older = self.gpm_buffers[self.live(get.sample1)]
        newer = self.gpm_buffers[self.live(get.sample2)]
        if (older is None or newer is None or older[0] != newer[0] or older[1] >= newer[1]
                or not 0 < get.numMetrics <= pynvml.NVML_GPM_METRIC_MAX):
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = newer[0]
        self.gpm_pairs.append((gpu, older[1], newer[1]))
        for i in range(get.numMetrics):
            metric = get.metrics[i]
            code = self.gpm_failing.get((gpu, metric.metricId))
            if code is None and metric.metricId not in self.gpm[gpu]:
                code = pynvml.NVML_ERROR_NOT_SUPPORTED
            metric.nvmlReturn = pynvml.NVML_SUCCESS if code is None else code
            metric.value = 0.0 if code is not None else self.gpm[gpu][metric.metricId]
        return get

    def gpm_free(self, sample):
        addr = self.live(sample)
        del self.gpm_buffers[addr]
        self.gpm_freed.append(addr)

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


class Clock:
    """CLOCK_MONOTONIC for the GPM gap: ``step`` ns on at each call, or set ``now``."""

    def __init__(self, step=10**9):
        self.now, self.step = 0, step

    def __call__(self):
        self.now += self.step
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(nvml_module, "monotonic_ns", clock)
    return clock


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


# --- GPM (Hopper and later): sm_active, tensor_active, dram_active -------------------------

def gpm_fields(events):
    return {e.gpu_id: {k: v for k, v in e.fields.items() if k in GPM_FIELDS}
            for e in events if isinstance(e, GpuSample)}


def hopper(nvml, index, sm=62.5, tensor=40.0, dram=12.5):
    nvml.names[index] = H100
    nvml.gpm[index] = {SM: sm, TENSOR: tensor, DRAM: dram}


def test_gpm_ratios_from_the_second_read_on_each_since_the_read_before(nvml, clock):
    hopper(nvml, 0)
    hopper(nvml, 1, sm=100.0, tensor=0.0, dram=99.5)
    source = NvmlSource(xid_events=False)
    source.open()
    first = source.read()
    assert gpm_fields(first) == {"GPU-00": {}, "GPU-11": {}}   # one sample: nothing to compare
    assert next(e for e in first if isinstance(e, GpuSample)).fields["gpu_util"] == 90
    assert gpm_fields(source.read()) == {
        "GPU-00": {"sm_active": 0.625, "tensor_active": 0.4, "dram_active": 0.125},
        "GPU-11": {"sm_active": 1.0, "tensor_active": 0.0, "dram_active": 0.995}}
    nvml.gpm[0][SM] = 12.0
    assert gpm_fields(source.read())["GPU-00"]["sm_active"] == 0.12
    # Samples 1 and 2 are the first read's (GPU 0, GPU 1): each later read compares its own
    # sample with the GPU's previous one, never with a sample of the other GPU.
    assert nvml.gpm_pairs == [(0, 1, 3), (1, 2, 4), (0, 3, 5), (1, 4, 6)]
    assert nvml.gpm_samples == 6                # one sample per GPU per read
    assert len(nvml.gpm_allocated) == 4         # one pair of buffers per GPU, reused
    source.close()


def test_a_read_within_100_ms_takes_no_gpm_sample_and_the_next_spans_both(nvml, clock):
    hopper(nvml, 0)
    source = NvmlSource(xid_events=False)
    source.open()
    clock.step = 0
    clock.now = 10**9
    source.read()                                # sample 1, the base
    clock.now += 60_000_000
    assert gpm_fields(source.read())["GPU-00"] == {}
    assert nvml.gpm_samples == 1                 # too soon: no sample, the base is kept
    clock.now += 90_000_000
    assert gpm_fields(source.read())["GPU-00"]["sm_active"] == 0.625
    assert nvml.gpm_pairs == [(0, 1, 2)]         # 150 ms since sample 1
    source.close()


def test_gpus_without_gpm_have_no_gpm_fields_and_are_noted_once(nvml, clock, caplog,
                                                              monkeypatch):
    calls = []
    query = pynvml.nvmlGpmQueryDeviceSupport
    monkeypatch.setattr(pynvml, "nvmlGpmQueryDeviceSupport",
                        lambda h: calls.append(h.index) or query(h))
    source = NvmlSource(xid_events=False)
    source.open()
    with caplog.at_level(logging.INFO, logger=nvml_module.__name__):
        reads = [source.read() for _ in range(3)]
    assert all(gpm_fields(r) == {"GPU-00": {}, "GPU-11": {}} for r in reads)
    assert sorted(calls) == [0, 1]               # asked once per GPU, not at every read
    assert nvml.gpm_allocated == [] and nvml.gpm_samples == 0
    gpm_logs = [r.getMessage() for r in caplog.records if "GPM" in r.getMessage()]
    assert len(gpm_logs) == 2 and all("Hopper" in m for m in gpm_logs)
    assert (f"{nvml_module.GPM_NOTE} not available on 2 GPU(s)"
            in source.notes())
    source.close()


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED,
                                  pynvml.NVML_ERROR_NO_PERMISSION,
                                  pynvml.NVML_ERROR_FUNCTION_NOT_FOUND])
@pytest.mark.parametrize("where", ["nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet"])
def test_gpm_refused_by_driver_or_library_leaves_the_rest(nvml, clock, caplog, code, where):
    hopper(nvml, 0)
    hopper(nvml, 1)
    nvml.broken[(where, 0)] = code
    source = NvmlSource(xid_events=False)
    source.open()
    with caplog.at_level(logging.INFO, logger=nvml_module.__name__):
        reads = [source.read() for _ in range(3)]
    assert all(gpm_fields(r)["GPU-00"] == {} for r in reads)
    assert gpm_fields(reads[-1])["GPU-11"]["sm_active"] == 0.625
    assert {e.gpu_id for e in reads[-1] if isinstance(e, GpuSample)} == {"GPU-00", "GPU-11"}
    assert next(e for e in reads[-1] if e.gpu_id == "GPU-00").fields["power_w"] == 70.5
    assert len([r for r in caplog.records if r.getMessage().startswith("GPU-00: no GPM")]) == 1
    assert f"{nvml_module.GPM_NOTE} not available on 1 GPU(s)" in (
        source.notes())
    gpu0_buffers = [a for a in nvml.gpm_allocated if a not in nvml.gpm_buffers]
    assert len(gpu0_buffers) == (2 if where == "nvmlGpmSampleGet" else 0)   # freed at once
    source.close()


def test_one_failing_or_implausible_metric_drops_only_that_field(nvml, clock):
    hopper(nvml, 0, dram=250.0)                 # no DRAM is 250 % busy: garbage, dropped
    nvml.gpm_failing[(0, TENSOR)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = NvmlSource(xid_events=False)
    source.open()
    source.read()
    assert gpm_fields(source.read())["GPU-00"] == {"sm_active": 0.625}
    assert "tensor_active (GPM: NVMLError_NotSupported) not available on 1 GPU(s)" in (
        source.notes())
    del nvml.gpm_failing[(0, TENSOR)]
    assert gpm_fields(source.read())["GPU-00"] == {"sm_active": 0.625, "tensor_active": 0.4}
    source.close()


def test_a_failed_gpm_call_skips_one_read_and_warns_once(nvml, clock, caplog):
    hopper(nvml, 0)
    source = NvmlSource(xid_events=False)
    source.open()
    source.read()
    nvml.broken[("nvmlGpmMetricsGet", None)] = pynvml.NVML_ERROR_UNKNOWN
    with caplog.at_level(logging.WARNING, logger=nvml_module.__name__):
        failed = [source.read(), source.read()]
    assert all(gpm_fields(r)["GPU-00"] == {} for r in failed)
    assert next(e for e in failed[0] if e.gpu_id == "GPU-00").fields["gpu_util"] == 90
    assert len([r for r in caplog.records if "GPM read of GPU-00" in r.getMessage()]) == 1
    del nvml.broken[("nvmlGpmMetricsGet", None)]
    assert gpm_fields(source.read())["GPU-00"]["dram_active"] == 0.125   # GPM stayed on
    source.close()


def test_gpu_lost_during_a_gpm_sample_is_a_gpu_state_event(nvml, clock):
    hopper(nvml, 0)
    source = NvmlSource(xid_events=False)
    source.open()
    source.read()
    nvml.broken[("nvmlGpmSampleGet", 0)] = pynvml.NVML_ERROR_GPU_IS_LOST
    [state] = [e for e in source.read() if isinstance(e, GpuState)]
    assert (state.gpu_id, state.state) == ("GPU-00", "lost")
    source.close()


def test_gpm_buffers_are_freed_once_on_close_before_shutdown(nvml, clock):
    hopper(nvml, 0)
    hopper(nvml, 1)
    source = NvmlSource(xid_events=False)
    source.open()
    source.read()
    source.read()
    assert len(nvml.gpm_buffers) == 4
    source.close()                               # gpm_free raises after nvmlShutdown
    assert nvml.shut_down and nvml.gpm_buffers == {}
    assert sorted(nvml.gpm_freed) == sorted(nvml.gpm_allocated)   # each once: no double free


def test_two_gpus_only_one_with_gpm(nvml, clock):
    hopper(nvml, 1)                              # GPU 0 stays an L4
    source = NvmlSource(xid_events=False)
    gpus = source.open()
    assert [g.model for g in gpus] == ["NVIDIA L4", H100]
    source.read()
    second = source.read()
    assert gpm_fields(second) == {
        "GPU-00": {}, "GPU-11": {"sm_active": 0.625, "tensor_active": 0.4, "dram_active": 0.125}}
    assert {gpu for gpu, _, _ in nvml.gpm_pairs} == {1}
    assert {owner[0] for owner in nvml.gpm_buffers.values()} == {1}
    assert len(nvml.gpm_allocated) == 2
    assert (f"{nvml_module.GPM_NOTE} not available on 1 GPU(s)"
            in source.notes())
    source.close()
    assert sorted(nvml.gpm_freed) == sorted(nvml.gpm_allocated)


# --- PCIe link, NVLink error counters, pending row remap -------------------------------------
CRC_FLIT, CRC_DATA, REPLAY, RECOVERY = (
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY)
NVLINK_FIELDS = {"nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors",
                 "nvlink_recovery_errors"}


def read_samples(source):
    return {e.gpu_id: e.fields for e in source.read() if isinstance(e, GpuSample)}


def test_pcie_link_now_and_at_most(nvml):
    source = NvmlSource(xid_events=False)
    source.open()
    f = read_samples(source)
    # GPU 0 idles at Gen1 (normal); GPU 1 runs at Gen4 but on 8 of its 16 lanes
    assert [(g["pcie_link_gen"], g["pcie_link_width"], g["pcie_link_gen_max"],
             g["pcie_link_width_max"]) for g in (f["GPU-00"], f["GPU-11"])] == [
        (1, 16, 4, 16), (4, 8, 4, 16)]


def test_pcie_link_not_supported_is_missing_and_noted(nvml):
    nvml.broken[("nvmlDeviceGetCurrPcieLinkGeneration", 1)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = NvmlSource(xid_events=False)
    source.open()
    f = read_samples(source)
    assert "pcie_link_gen" not in f["GPU-11"] and f["GPU-11"]["pcie_link_width"] == 8
    assert f["GPU-00"]["pcie_link_gen"] == 1
    assert "pcie_link_gen not available on 1 GPU(s)" in source.notes()


@pytest.mark.parametrize("rows, pending", [((0, 0, 0, 0), 0), ((0, 1, 1, 0), 1),
                                           ((0, 1, 7, 0), 1)])
def test_row_remap_pending_is_is_pending_as_a_flag(nvml, rows, pending):
    nvml.remapped = rows
    source = NvmlSource(xid_events=False)
    source.open()
    f = read_samples(source)["GPU-00"]
    assert f["row_remap_pending"] == pending and f["row_remap_failed"] == 0


def test_nvlink_errors_are_summed_over_the_active_links_only(nvml):
    counts = {CRC_FLIT: 3, CRC_DATA: 1, REPLAY: 10, RECOVERY: 0}
    # links 0-3 and 6 (numbers need not be contiguous); link 2 is down: its counts stay out
    nvml.nvlinks[0] = {link: (link != 2, {c: v * (link + 1) for c, v in counts.items()})
                       for link in (0, 1, 2, 3, 6)}
    source = NvmlSource(xid_events=False)
    source.open()
    f = read_samples(source)
    active = 1 + 2 + 4 + 7   # link + 1, over links 0, 1, 3, 6
    assert {k: f["GPU-00"][k] for k in NVLINK_FIELDS} == {
        "nvlink_crc_flit_errors": 3 * active, "nvlink_crc_data_errors": active,
        "nvlink_replay_errors": 10 * active, "nvlink_recovery_errors": 0}
    # GPU 1 (an L4) has no NVLink: no such fields at all, not zeros, and one note
    assert not NVLINK_FIELDS & set(f["GPU-11"])
    assert "NVLink error counters not available on 1 GPU(s)" in source.notes()


def test_nvlink_links_are_found_once_then_only_their_state_is_read(nvml):
    nvml.nvlinks[0] = {link: (True, {CRC_FLIT: 0, CRC_DATA: 0, REPLAY: 0, RECOVERY: 0})
                       for link in range(4)}
    source = NvmlSource(xid_events=False)
    source.open()
    read_samples(source)
    first = nvml.nvlink_state_calls
    assert first == 2 * pynvml.NVML_NVLINK_MAX_LINKS + 4   # both GPUs asked, then GPU 0's 4
    nvml.nvlinks[0][1] = (False, nvml.nvlinks[0][1][1])    # a link goes down
    nvml.nvlinks[0][0][1][REPLAY] = 5
    f = read_samples(source)["GPU-00"]
    assert nvml.nvlink_state_calls == first + 4
    assert f["nvlink_replay_errors"] == 5


def test_nvlink_with_no_link_up_has_no_fields(nvml):
    nvml.nvlinks[0] = {link: (False, {CRC_FLIT: 0}) for link in range(2)}
    source = NvmlSource(xid_events=False)
    source.open()
    assert not NVLINK_FIELDS & set(read_samples(source)["GPU-00"])


def test_a_counter_the_gpu_cannot_give_is_left_out_whole(nvml):
    # CRC data not supported on link 1 only: a partial sum would look like errors vanishing
    nvml.nvlinks[0] = {0: (True, {CRC_FLIT: 2, CRC_DATA: 4, REPLAY: 1, RECOVERY: 1}),
                       1: (True, {CRC_FLIT: 2, REPLAY: 1, RECOVERY: 1})}
    source = NvmlSource(xid_events=False)
    source.open()
    f = read_samples(source)["GPU-00"]
    assert "nvlink_crc_data_errors" not in f
    assert (f["nvlink_crc_flit_errors"], f["nvlink_replay_errors"]) == (4, 2)
    assert "nvlink_crc_data_errors not available on 1 GPU(s)" in source.notes()
    assert f["gpu_util"] == 90   # the GPU's other fields are all there


def test_gpu_lost_during_an_nvlink_read_is_a_gpu_state_event(nvml):
    nvml.nvlinks[0] = {0: (True, {CRC_FLIT: 0, CRC_DATA: 0, REPLAY: 0, RECOVERY: 0})}
    source = NvmlSource(xid_events=False)
    source.open()
    read_samples(source)
    nvml.broken[("nvmlDeviceGetNvLinkErrorCounter", 0)] = pynvml.NVML_ERROR_GPU_IS_LOST
    events = source.read()
    [state] = [e for e in events if isinstance(e, GpuState)]
    assert (state.gpu_id, state.state) == ("GPU-00", "lost")
    assert {e.gpu_id for e in events if isinstance(e, GpuSample)} == {"GPU-11"}


def test_a_failed_nvlink_read_costs_only_the_nvlink_fields(nvml, caplog):
    nvml.nvlinks[0] = {0: (True, {CRC_FLIT: 0, CRC_DATA: 0, REPLAY: 0, RECOVERY: 0})}
    source = NvmlSource(xid_events=False)
    source.open()
    read_samples(source)
    nvml.broken[("nvmlDeviceGetNvLinkState", 0)] = pynvml.NVML_ERROR_UNKNOWN
    with caplog.at_level(logging.WARNING):
        f = read_samples(source)["GPU-00"]
        read_samples(source)
    assert not NVLINK_FIELDS & set(f) and f["gpu_util"] == 90
    assert len([r for r in caplog.records if "NVLink read" in r.message]) == 1


def test_sample_once_reads_a_gpm_gpu_twice_so_it_shows_sm_activity(nvml, clock):
    from gpuwhy.app.gpu_cli import _read_until_samples

    hopper(nvml, 0)
    source = NvmlSource(xid_events=False)
    source.open()
    assert not source.rates_pending
    events = _read_until_samples(source, 0.01)
    assert gpm_fields(events)["GPU-00"] == {"sm_active": 0.625, "tensor_active": 0.4,
                                            "dram_active": 0.125}
    assert not source.rates_pending and nvml.gpm_samples == 2
    source.close()
    # without GPM (before Hopper) one read is the answer: no second read, no wait
    plain = NvmlSource(xid_events=False)
    nvml.gpm.clear()
    plain.open()
    _read_until_samples(plain, 0.01)
    assert not plain.rates_pending
    plain.close()


# --- NVLink fabric (NVSwitch boards) ---------------------------------------------------------
COMPLETED, NOT_STARTED, IN_PROGRESS, NO_FABRIC = (
    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
    pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED)
HEALTHY, UNHEALTHY = (pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
                      pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY)
FABRIC_FIELDS = {"fabric_state", "fabric_health"}


@pytest.mark.parametrize("state, status, code", [
    (NO_FABRIC, pynvml.NVML_SUCCESS, 0),            # a board without NVSwitches
    (NOT_STARTED, pynvml.NVML_SUCCESS, 1),          # Fabric Manager not (yet) running
    (IN_PROGRESS, pynvml.NVML_SUCCESS, 2),          # training at boot
    (COMPLETED, pynvml.NVML_SUCCESS, 3),
    (COMPLETED, pynvml.NVML_ERROR_UNKNOWN, 4),      # completed, with an error: a Failure
    (COMPLETED, pynvml.NVML_ERROR_NOT_READY, 4),
    (7, pynvml.NVML_SUCCESS, 5),                    # a state this mapping does not know
])
def test_fabric_state_is_dcgms_coding_of_nvmls_state_and_status(nvml, state, status, code):
    nvml.fabric[0] = (state, status, HEALTHY)
    source = NvmlSource(xid_events=False)
    source.open()
    f = read_samples(source)["GPU-00"]
    assert (f["fabric_state"], f["fabric_health"]) == (code, 1)


def test_fabric_v3_then_v2_then_v1_as_far_as_the_driver_goes(nvml):
    nvml.fabric[0] = (COMPLETED, pynvml.NVML_SUCCESS, UNHEALTHY)
    nvml.fabric_version = 2                   # a driver from before the health summary
    source = NvmlSource(xid_events=False)
    source.open()
    f = read_samples(source)["GPU-00"]
    assert f["fabric_state"] == 3 and "fabric_health" not in f   # absent, not 0
    assert nvml.fabric_calls[:2] == [("V", 3), ("V", 2)]
    nvml.fabric_calls.clear()
    read_samples(source)                      # the struct that worked is kept: one call
    assert nvml.fabric_calls[0] == ("V", 2)

    nvml.fabric_calls.clear()
    nvml.fabric_v_call = False                # older still: only nvmlDeviceGetGpuFabricInfo
    old = NvmlSource(xid_events=False)
    old.open()
    f = read_samples(old)["GPU-00"]
    assert f["fabric_state"] == 3 and "fabric_health" not in f
    assert nvml.fabric_calls[:3] == [("V", 3), ("V", 2), ("v1", 1)]


def test_no_fabric_probe_is_missing_and_noted_once_never_asked_again(nvml):
    nvml.fabric[0] = (COMPLETED, pynvml.NVML_SUCCESS, HEALTHY)   # GPU 1 (an L4) has none
    source = NvmlSource(xid_events=False)
    source.open()
    f = read_samples(source)
    assert f["GPU-00"]["fabric_state"] == 3 and not FABRIC_FIELDS & set(f["GPU-11"])
    assert "NVLink fabric state not available on 1 GPU(s)" in source.notes()
    asked = len(nvml.fabric_calls)
    read_samples(source)
    assert len(nvml.fabric_calls) == asked + 1   # GPU 0 only


def test_a_binding_without_the_v3_struct_starts_at_v2(nvml, monkeypatch):
    monkeypatch.delattr(pynvml, "c_nvmlGpuFabricInfo_v3_t")
    nvml.fabric[0] = (IN_PROGRESS, pynvml.NVML_SUCCESS, HEALTHY)
    source = NvmlSource(xid_events=False)
    source.open()
    f = read_samples(source)["GPU-00"]
    assert f["fabric_state"] == 2 and "fabric_health" not in f
    assert nvml.fabric_calls[0] == ("V", 2)


def test_a_failed_fabric_read_costs_only_the_fabric_fields_and_warns_once(nvml, caplog):
    nvml.fabric[0] = (COMPLETED, pynvml.NVML_SUCCESS, HEALTHY)
    nvml.broken[("nvmlDeviceGetGpuFabricInfoV", 0)] = pynvml.NVML_ERROR_UNKNOWN
    source = NvmlSource(xid_events=False)
    source.open()
    with caplog.at_level(logging.WARNING):
        f = read_samples(source)["GPU-00"]
        read_samples(source)
    assert not FABRIC_FIELDS & set(f) and f["gpu_util"] == 90
    assert len([r for r in caplog.records if "Fabric read" in r.message]) == 1
    del nvml.broken[("nvmlDeviceGetGpuFabricInfoV", 0)]   # not given up: asked again
    assert read_samples(source)["GPU-00"]["fabric_state"] == 3


def test_gpu_lost_during_the_fabric_probe_is_a_gpu_state_event(nvml):
    nvml.fabric[0] = (COMPLETED, pynvml.NVML_SUCCESS, HEALTHY)
    nvml.broken[("nvmlDeviceGetGpuFabricInfoV", 0)] = pynvml.NVML_ERROR_GPU_IS_LOST
    source = NvmlSource(xid_events=False)
    source.open()
    [state] = [e for e in source.read() if isinstance(e, GpuState)]
    assert (state.gpu_id, state.state) == ("GPU-00", "lost")
