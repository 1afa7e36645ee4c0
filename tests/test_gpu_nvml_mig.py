"""The NVML source on a GPU in MIG mode: one sample per GPU instance.

As in test_gpu_nvml.py, only nvidia-ml-py's nvml* calls are stood in for (its exception
classes, constants and GPM structs are the real ones). The MIG calls are those of
nvidia-ml-py 13: nvmlDeviceGetMigMode -> [current, pending], nvmlDeviceGetMaxMigDeviceCount,
nvmlDeviceGetMigDeviceHandleByIndex (NOT_FOUND for an empty slot), nvmlDeviceGetGpuInstanceId,
nvmlDeviceGetName / nvmlDeviceGetMemoryInfo on the MIG handle, and
nvmlGpmMigSampleGet(parent device, GPU instance id, sample). None of this has run against a
real GPU.
"""

import os
import types

import pynvml
import pytest

from gpuwhy.events import GpuProcesses, GpuSample, GpuState
from gpuwhy.probes.gpu import nvml as nvml_module
from gpuwhy.probes.gpu.nvml import NvmlSource, mig_profile

from .test_gpu_nvml import DRAM, H100, SM, TENSOR, Clock, FakeNvml, error

GRAPHICS = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
GIB = 1 << 30
MIB = 1 << 20
ACTIVITY = {"gr_engine_active", "sm_active", "tensor_active", "dram_active"}


class MigHandle:
    """A MIG device handle (a compute instance): ``index`` names it for ``broken``."""

    def __init__(self, parent, gi, name, used_mib, total_mib=9984):
        self.parent, self.gi, self.name = parent, gi, name
        self.used, self.total = used_mib * MIB, total_mib * MIB
        self.index = f"mig{gi}"


class FakeMig(FakeNvml):
    """FakeNvml plus MIG: ``mig_mode`` maps a GPU index to (current, pending) (a GPU not in
    it is not MIG-capable: NOT_SUPPORTED), ``slots`` a GPU index to its MIG device slots
    (a MigHandle, or None for an empty slot); GPM per instance is ``gpm[(gpu, gi)]``."""

    def __init__(self, monkeypatch):
        super().__init__(monkeypatch)
        self.mig_mode = {}
        self.slots = {}
        self.mig_mode_calls = []
        self.mig_samples = []   # (device index, gpu instance id) per nvmlGpmMigSampleGet
        self.processes = [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 << 30)]
        name, memory = pynvml.nvmlDeviceGetName, pynvml.nvmlDeviceGetMemoryInfo
        calls = {
            "nvmlDeviceGetMigMode": self.get_mig_mode,
            "nvmlDeviceGetMaxMigDeviceCount": lambda h: len(self.slots.get(h.index, [])),
            "nvmlDeviceGetMigDeviceHandleByIndex": self.mig_handle,
            "nvmlDeviceGetGpuInstanceId": lambda h: h.gi,
            "nvmlDeviceGetName": lambda h: h.name if isinstance(h, MigHandle) else name(h),
            "nvmlDeviceGetMemoryInfo": lambda h, version=None: types.SimpleNamespace(
                total=h.total, used=h.used, free=h.total - h.used)
            if isinstance(h, MigHandle) else memory(h),
            "nvmlGpmMigSampleGet": self.gpm_mig_sample,
            "nvmlDeviceGetComputeRunningProcesses": lambda h: self.processes,
        }
        for fn_name, fn in calls.items():
            assert hasattr(pynvml, fn_name), fn_name   # same names as the real binding
            monkeypatch.setattr(pynvml, fn_name, self.breakable(fn_name, fn))

    def get_mig_mode(self, handle):
        self.mig_mode_calls.append(handle.index)
        if handle.index not in self.mig_mode:
            raise error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(self.mig_mode[handle.index])

    def mig_handle(self, handle, index):
        slots = self.slots.get(handle.index, [])
        if index >= len(slots):
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slots[index] is None:
            raise error(pynvml.NVML_ERROR_NOT_FOUND)
        return slots[index]

    def gpm_mig_sample(self, device, gpu_instance_id, sample):
        assert not isinstance(device, MigHandle)   # the parent GPU's handle, as nvml.h says
        key = (device.index, gpu_instance_id)
        if not any(s is not None and s.gi == gpu_instance_id
                   for s in self.slots.get(device.index, [])):
            raise error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self.mig_samples.append(key)
        self.gpm_samples += 1
        self.gpm_buffers[self.live(sample)] = (key, self.gpm_samples)
        return sample


@pytest.fixture
def nvml(monkeypatch):
    return FakeMig(monkeypatch)


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(nvml_module, "monotonic_ns", clock)
    return clock


def h100_in_mig_mode(nvml):
    """GPU 0: an H100 in MIG mode. GI 9 and 10 are 1g.10gb (9 holds 8 GiB and idles), GI 2
    is a 3g.40gb split into two compute instances (two MIG devices, one GPU instance); slots
    1 and 4 are empty. Its whole-GPU utilisation is NOT_SUPPORTED, as in MIG mode. GPU 1 is
    an L4: not MIG-capable."""
    nvml.names[0] = H100
    nvml.mig_mode[0] = (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)
    nvml.slots[0] = [MigHandle(0, 9, f"{H100} MIG 1g.10gb", 8200),
                     None,
                     MigHandle(0, 2, f"{H100} MIG 1c.3g.40gb", 30000, 40448),
                     MigHandle(0, 2, f"{H100} MIG 1c.3g.40gb", 30000, 40448),
                     None,
                     MigHandle(0, 10, f"{H100} MIG 1g.10gb", 5100)]
    nvml.broken[("nvmlDeviceGetUtilizationRates", 0)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    nvml.gpm[0] = {GRAPHICS: 50.0, SM: 45.0, TENSOR: 20.0, DRAM: 10.0}
    nvml.gpm[(0, 9)] = {GRAPHICS: 0.0, SM: 0.0, TENSOR: 0.0, DRAM: 0.0}
    nvml.gpm[(0, 2)] = {GRAPHICS: 92.0, SM: 81.0, TENSOR: 40.0, DRAM: 30.0}
    nvml.gpm[(0, 10)] = {GRAPHICS: 64.0, SM: 50.0, TENSOR: 25.0, DRAM: 12.5}


def instances(events, gpu_id="GPU-00"):
    return {e.instance: e for e in events
            if isinstance(e, GpuSample) and e.gpu_id == gpu_id and e.instance}


def whole(events, gpu_id):
    [sample] = [e for e in events if isinstance(e, GpuSample) and e.gpu_id == gpu_id
                and not e.instance]
    return sample


def test_one_sample_per_gpu_instance_with_its_profile_memory_and_gpm(nvml, clock):
    h100_in_mig_mode(nvml)
    source = NvmlSource(xid_events=False)
    source.open()
    first = source.read()
    found = instances(first)
    assert list(found) == ["2", "9", "10"]          # per GPU instance, not per MIG device
    assert {i: s.labels for i, s in found.items()} == {
        "2": {"mig_profile": "3g.40gb"}, "9": {"mig_profile": "1g.10gb"},
        "10": {"mig_profile": "1g.10gb"}}
    assert all(s.source == "nvml" and not s.simulated for s in found.values())
    assert found["9"].fields == {"fb_total_mib": 9984, "fb_used_mib": 8200}   # no GPM yet
    assert found["2"].fields["fb_total_mib"] == 40448
    second = instances(source.read())
    assert {i: {k: v for k, v in s.fields.items() if k in ACTIVITY}
            for i, s in second.items()} == {
        "2": {"gr_engine_active": 0.92, "sm_active": 0.81, "tensor_active": 0.4,
              "dram_active": 0.3},
        "9": {"gr_engine_active": 0.0, "sm_active": 0.0, "tensor_active": 0.0,
              "dram_active": 0.0},
        "10": {"gr_engine_active": 0.64, "sm_active": 0.5, "tensor_active": 0.25,
               "dram_active": 0.125}}
    # nvmlGpmMigSampleGet on the parent GPU with the GPU instance id, one per instance a read
    assert sorted(nvml.mig_samples) == sorted([(0, 2), (0, 9), (0, 10)] * 2)
    source.close()
    assert sorted(nvml.gpm_freed) == sorted(nvml.gpm_allocated)   # each buffer freed once


def test_the_whole_gpu_keeps_what_it_reports_and_a_plain_gpu_has_no_instances(nvml, clock):
    h100_in_mig_mode(nvml)
    source = NvmlSource(xid_events=False)
    source.open()
    source.read()
    events = source.read()
    gpu0 = whole(events, "GPU-00").fields
    assert "gpu_util" not in gpu0 and "mem_util" not in gpu0   # NOT_SUPPORTED: absent, not 0
    assert gpu0["power_w"] == 70.5 and gpu0["fb_used_mib"] == 12 * 1024
    assert gpu0["gr_engine_active"] == 0.5                     # the GPU's own GPM sample
    assert whole(events, "GPU-11").fields["gpu_util"] == 90
    assert instances(events, "GPU-11") == {}
    assert nvml.mig_mode_calls.count(1) == 1   # NOT_SUPPORTED: an L4 is not asked again


def test_mig_mode_pending_or_off_gives_no_instance_samples(nvml, clock):
    h100_in_mig_mode(nvml)
    nvml.mig_mode[0] = (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE)
    source = NvmlSource(xid_events=False)
    source.open()
    assert instances(source.read()) == {} and instances(source.read()) == {}
    assert nvml.mig_samples == []
    nvml.mig_mode[0] = (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE)
    assert list(instances(source.read())) == ["2", "9", "10"]   # asked at every read
    source.close()


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED,
                                  pynvml.NVML_ERROR_NO_PERMISSION])
def test_what_an_instance_cannot_give_is_absent_never_zero(nvml, clock, code):
    h100_in_mig_mode(nvml)
    nvml.broken[("nvmlDeviceGetMemoryInfo", "mig10")] = code
    nvml.gpm_failing[((0, 2), TENSOR)] = code
    source = NvmlSource(xid_events=False)
    source.open()
    source.read()
    found = instances(source.read())
    assert "fb_used_mib" not in found["10"].fields and "fb_total_mib" not in found["10"].fields
    assert found["10"].fields["gr_engine_active"] == 0.64       # its other fields are there
    assert "tensor_active" not in found["2"].fields and found["2"].fields["sm_active"] == 0.81
    assert found["9"].fields["fb_used_mib"] == 8200
    notes = source.notes()
    assert "memory per MIG instance not available on 1 GPU(s)" in notes
    assert any(n.startswith("tensor_active (GPM per MIG instance: ") for n in notes)
    source.close()


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED,
                                  pynvml.NVML_ERROR_NO_PERMISSION])
def test_gpm_refused_for_an_instance_leaves_its_activity_absent(nvml, clock, monkeypatch,
                                                                code):
    h100_in_mig_mode(nvml)
    take = pynvml.nvmlGpmMigSampleGet

    def refuse_gi_9(device, gi, sample):
        if gi == 9:
            raise error(code)
        return take(device, gi, sample)
    monkeypatch.setattr(pynvml, "nvmlGpmMigSampleGet", refuse_gi_9)
    source = NvmlSource(xid_events=False)
    source.open()
    reads = [instances(source.read()) for _ in range(3)]
    assert all(not ACTIVITY & set(r["9"].fields) for r in reads)
    assert reads[-1]["9"].fields["fb_used_mib"] == 8200
    assert reads[-1]["10"].fields["sm_active"] == 0.5
    assert f"{nvml_module.MIG_GPM_NOTE} not available on 1 GPU(s)" in source.notes()
    source.close()
    assert sorted(nvml.gpm_freed) == sorted(nvml.gpm_allocated)


def test_no_gpm_before_hopper_but_memory_per_instance(nvml, clock):
    h100_in_mig_mode(nvml)
    nvml.names[0] = "NVIDIA A100-SXM4-80GB"
    del nvml.gpm[0]                                  # an A100: no GPM at all
    source = NvmlSource(xid_events=False)
    source.open()
    source.read()
    found = instances(source.read())
    assert {i: set(s.fields) for i, s in found.items()} == dict.fromkeys(
        ("2", "9", "10"), {"fb_total_mib", "fb_used_mib"})
    assert nvml.mig_samples == [] and nvml.gpm_allocated == []
    assert not source.rates_pending


def test_whole_gpu_gpm_refused_in_mig_mode_keeps_gpm_per_instance(nvml, clock):
    h100_in_mig_mode(nvml)
    nvml.broken[("nvmlGpmSampleGet", 0)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = NvmlSource(xid_events=False)
    source.open()
    source.read()
    events = source.read()
    assert not ACTIVITY & set(whole(events, "GPU-00").fields)
    assert instances(events)["2"].fields["gr_engine_active"] == 0.92
    source.close()


def test_a_reconfiguration_between_reads_stops_the_instances_gone(nvml, clock):
    h100_in_mig_mode(nvml)
    source = NvmlSource(xid_events=False)
    source.open()
    source.read()
    source.read()
    live_before = len(nvml.gpm_buffers)
    # GI 10 destroyed; GI 9 destroyed and made again as a 2g.20gb (same id, new profile)
    nvml.slots[0][5] = None
    nvml.slots[0][0] = MigHandle(0, 9, f"{H100} MIG 2g.20gb", 100, 20096)
    nvml.gpm[(0, 9)] = {GRAPHICS: 70.0, SM: 60.0, TENSOR: 0.0, DRAM: 5.0}
    after = instances(source.read())
    assert list(after) == ["2", "9"]
    assert after["9"].labels == {"mig_profile": "2g.20gb"}
    assert not ACTIVITY & set(after["9"].fields)   # a new instance: a new GPM base first
    assert after["2"].fields["sm_active"] == 0.81    # the unchanged one goes on
    assert len(nvml.gpm_buffers) == live_before - 2  # GI 10's and old GI 9's pairs freed...
    assert instances(source.read())["9"].fields["gr_engine_active"] == 0.7
    nvml.mig_mode[0] = (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE)
    assert instances(source.read()) == {}
    assert {owner[0] for owner in nvml.gpm_buffers.values()} == {0}   # only the GPU's own
    source.close()
    assert sorted(nvml.gpm_freed) == sorted(nvml.gpm_allocated)


@pytest.mark.parametrize("where, code", [
    ("nvmlDeviceGetGpuInstanceId", pynvml.NVML_ERROR_NOT_FOUND),
    ("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_INVALID_ARGUMENT),
    ("nvmlDeviceGetName", pynvml.NVML_ERROR_NOT_FOUND),
])
def test_an_instance_destroyed_during_a_read_is_skipped(nvml, clock, where, code):
    h100_in_mig_mode(nvml)
    source = NvmlSource(xid_events=False)
    source.open()
    source.read()
    nvml.broken[(where, "mig10")] = code
    events = source.read()
    assert list(instances(events)) == ["2", "9"]
    assert whole(events, "GPU-00").fields["power_w"] == 70.5
    assert not [e for e in events if isinstance(e, GpuState)]
    del nvml.broken[(where, "mig10")]
    assert list(instances(source.read())) == ["2", "9", "10"]
    source.close()


def test_the_gpu_lost_during_the_instance_walk_is_a_gpu_state_event(nvml, clock):
    h100_in_mig_mode(nvml)
    source = NvmlSource(xid_events=False)
    source.open()
    nvml.broken[("nvmlDeviceGetMaxMigDeviceCount", 0)] = pynvml.NVML_ERROR_GPU_IS_LOST
    events = source.read()
    [state] = [e for e in events if isinstance(e, GpuState)]
    assert (state.gpu_id, state.state) == ("GPU-00", "lost")
    assert not instances(events)


def test_an_unexpected_mig_error_warns_once_and_costs_only_the_instances(nvml, clock, caplog):
    h100_in_mig_mode(nvml)
    nvml.broken[("nvmlDeviceGetMaxMigDeviceCount", 0)] = pynvml.NVML_ERROR_UNKNOWN
    source = NvmlSource(xid_events=False)
    source.open()
    with caplog.at_level("WARNING"):
        reads = [source.read() for _ in range(2)]
    assert all(instances(r) == {} for r in reads)
    assert whole(reads[-1], "GPU-00").fields["power_w"] == 70.5
    assert len([r for r in caplog.records if "MIG device count" in r.getMessage()]) == 1
    del nvml.broken[("nvmlDeviceGetMaxMigDeviceCount", 0)]
    assert list(instances(source.read())) == ["2", "9", "10"]


def test_processes_name_their_gpu_instance(nvml, clock):
    h100_in_mig_mode(nvml)
    nvml.processes = [
        types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=3 << 30, gpuInstanceId=9,
                              computeInstanceId=0),
        types.SimpleNamespace(pid=2**22 + 7, usedGpuMemory=None, gpuInstanceId=0xFFFFFFFF,
                              computeInstanceId=0xFFFFFFFF),
        types.SimpleNamespace(pid=2**22 + 9, usedGpuMemory=None)]   # an old struct
    source = NvmlSource(xid_events=False)
    source.open()
    procs = next(e for e in source.read() if isinstance(e, GpuProcesses))
    assert [p["gpu_instance"] for p in procs.processes] == [9, None, None]


def test_sample_once_waits_for_the_instances_gpm(nvml, clock):
    from gpuwhy.app.gpu_cli import _read_until_samples

    h100_in_mig_mode(nvml)
    nvml.broken[("nvmlGpmSampleGet", 0)] = pynvml.NVML_ERROR_NOT_SUPPORTED
    source = NvmlSource(xid_events=False)
    source.open()
    events = _read_until_samples(source, 0.01)
    assert instances(events)["10"].fields["sm_active"] == 0.5
    source.close()


@pytest.mark.parametrize("name, profile", [
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "1g.10gb"),
    (b"NVIDIA H100 80GB HBM3 MIG 3g.40gb", "3g.40gb"),
    ("NVIDIA A100-SXM4-40GB MIG 1c.3g.20gb", "3g.20gb"),     # a compute instance's
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
    ("MIG 7g.80gb", "7g.80gb"),
    ("1g.10gb", "1g.10gb"),                                   # DCGM's GPU_I name
    ("NVIDIA H100 80GB HBM3", None),
    ("", None),
    (None, None),
])
def test_mig_profile_from_a_name(name, profile):
    assert mig_profile(name) == profile
