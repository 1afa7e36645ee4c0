"""The GPU events survive the bus encoding unchanged."""

import pytest

from gpuwhy.events import (
    EVENT_TYPES,
    DriverGpu,
    GpuProcesses,
    GpuSample,
    GpuSeen,
    GpuState,
    GpuXid,
)
from gpuwhy.wire import from_frames, to_payload

MARK = dict(gpu_id="GPU-1", source="sim", simulated=True)
SAMPLES = [
    GpuSeen(ts=1, uuid="GPU-1", pci_bus_id="0000:18:00.0", index=0, minor=0, model="H100",
            driver_version="550.54.15", **MARK),
    GpuSample(ts=2, raw_ts=2_000, fields={"gpu_util": 97.5, "sm_active": 0.81}, instance="1",
              labels={"pod": "train-0"}, **MARK),
    GpuXid(ts=3, xid=79, detail="fell off the bus", **MARK),
    DriverGpu(ts=3, pci_bus_id="0000:3b:00.0", minor=3,
              uuid="GPU-5f3c6a1e-0d2b-4f7e-9a51-3c2d1e0f9b87"),
    GpuState(ts=4, state="lost", detail="NVML: GPU is lost", **MARK),
    GpuProcesses(ts=5, gpu_id="GPU-1", source="nvml",
                 processes=[{"pid": 42, "start_time": 7, "used_memory_mib": 1024.0,
                             "sm_util": 80, "mem_util": None, "enc_util": 0, "dec_util": 0}]),
]


def test_every_gpu_kind_has_a_sample():
    gpu_kinds = {k for k, cls in EVENT_TYPES.items() if cls.topic == "gpu"}
    assert {e.kind for e in SAMPLES} == gpu_kinds


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.kind)
def test_round_trip(event):
    envelope = from_frames([b"gpu", to_payload(event, src="gpu", seq=3)])
    assert envelope.event == event
