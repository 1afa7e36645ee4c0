"""The simulator source: N made-up GPUs driven by a named, seeded scenario. SIMULATED.

It models only what a GPU source reports (counters, Xids, a GPU falling off the bus);
the host side of a scenario (processes, driver calls, kernel-log lines) is not played
here. Time inside a scenario is ``tick × interval``, not the wall clock, so a scenario
with a given seed yields the same fields on every run; only ``ts`` is real time. The
scenario's event comes ``event_after`` scenario seconds in, or at the first read after
``event_file`` appears (so that a played incident, e.g. `gpuwhy demo`'s stand-in reset,
strikes the simulated GPU when it happens on the host). ``fabric-manager-down`` is an HGX
board whose Fabric Manager never started: the NVLink fabric stays NotStarted, the links
untrained, and no CUDA work can run. ``mig-idle-instance`` puts every GPU (80 GB models only)
in MIG mode as 7 × 1g.10gb GPU instances, each with its own samples (``instance`` its GPU
instance id, ``labels["mig_profile"]``) as the real sources give them; the whole GPU reports
no utilisation or profiling activity, as in MIG mode. All instances train, except GPU 0's
last one, which holds about 8 GiB and does nothing (a forgotten notebook).
Every event it makes carries ``simulated=True`` and every GPU's model says SIMULATED.
"""

from __future__ import annotations

import os
import random
import uuid
from dataclasses import dataclass
from typing import Any, cast

from gpuwhy.clock import now_ns
from gpuwhy.events import Event, GpuSample, GpuState, GpuXid
from gpuwhy.gpufields import (
    FABRIC_HEALTH_NOT_SUPPORTED,
    FABRIC_HEALTHY,
    FABRIC_NOT_STARTED,
    FABRIC_NOT_SUPPORTED,
    FABRIC_SUCCESS,
    THROTTLE_BITS,
)
from gpuwhy.identity import GpuIdentity
from gpuwhy.probes.gpu.source import GpuInfo, SourceUnavailable
from gpuwhy.reset import BACK_STATES, RESET_STATES

SCENARIOS = ("healthy-training", "input-starved", "pageable-h2d", "pcie-allreduce",
             "power-cap", "thermal-throttle", "xid-79", "gpu-reset", "fabric-manager-down",
             "mig-idle-instance")
RESET_SECONDS = 5.0
SW_POWER_CAP, SW_THERMAL, HW_THERMAL, GPU_IDLE = (THROTTLE_BITS[name] for name in (
    "SW_POWER_CAP", "SW_THERMAL", "HW_THERMAL", "IDLE"))


@dataclass(frozen=True)
class Spec:
    sm_clock: float
    mem_clock: float
    power_limit: float
    fb_total: float
    pcie_bytes_per_s: float   # one direction, what a x16 link sustains
    pcie_gen: int             # the link's generation under load (x16 on every model here)
    nvlink: bool              # SXM boards have NVLink; the L4 (PCIe card) has none
    # An NVSwitch fabric that the GPU reports (HGX H100: Success once Fabric Manager has set
    # it up). HGX A100 boards have NVSwitches too, but NVML's fabric probe is for Hopper and
    # later: an A100, like a PCIe card, reports NotSupported.
    fabric: bool = False


SPECS = {"H100": Spec(1980, 2619, 700, 81559, 52e9, 5, True, True),
         "A100": Spec(1410, 1593, 400, 81920, 25e9, 4, True),
         "L4": Spec(2040, 6251, 72, 23034, 25e9, 4, False)}
PCIE_IDLE_GEN = 1   # an idle GPU trains its link down to Gen1 to save power
NVLINK_ERRORS = ("nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors",
                 "nvlink_recovery_errors")
# MIG (mig-idle-instance): seven 1g.10gb GPU instances per GPU, with the GPU instance ids a
# driver gives seven 1g instances made one after another on an A100/H100 (7 to 13)
MIG_PROFILE = "1g.10gb"
MIG_INSTANCES = tuple(range(7, 14))
MIG_INSTANCE_MIB = 9984.0       # about what a 1g.10gb instance's memory totals
MIG_IDLE_INSTANCE = (0, 13)     # (GPU index, GPU instance id) of the idle one
MIG_IDLE_USED_MIB = 8210.0
MIG_MIN_FB_MIB = 80000.0        # 1g.10gb × 7 exists on the 80 GB A100 and H100
# what a GPU in MIG mode does not report for the whole GPU: utilisation and the activity
# ratios, which exist per GPU instance only
MIG_WHOLE_GPU_ABSENT = ("gpu_util", "mem_util", "sm_active", "sm_occupancy", "tensor_active",
                        "dram_active", "gr_engine_active", "fp16_active", "fp32_active",
                        "fp64_active")


def spec_for(model: str) -> Spec:
    return next((s for key, s in SPECS.items() if key in model), SPECS["H100"])


class SimulatedGpus:
    """``read()`` advances every GPU by one tick of ``interval`` seconds of scenario time."""

    name = "sim"
    simulated = True

    def __init__(self, count: int = 2, model: str = "NVIDIA H100 80GB HBM3",
                 scenario: str = "healthy-training", seed: int = 0, interval: float = 1.0,
                 event_after: float = 30.0, event_file: str = ""):
        if scenario not in SCENARIOS:
            raise SourceUnavailable("sim", f"unknown scenario {scenario!r}; one of "
                                    + ", ".join(SCENARIOS))
        if count < 1:
            raise SourceUnavailable("sim", f"needs at least one GPU, got {count}")
        if scenario == "mig-idle-instance" and spec_for(model).fb_total < MIG_MIN_FB_MIB:
            raise SourceUnavailable("sim", f"scenario {scenario} needs an 80 GB A100 or H100 "
                                           f"(7 × {MIG_PROFILE}), not {model}")
        self.count, self.model, self.scenario, self.seed = count, model, scenario, seed
        self.interval, self.event_after = interval, event_after
        self.event_file = event_file
        self.spec = spec_for(model)
        self.tick = 0
        self.gpus: list[GpuInfo] = []
        self._counters: list[dict[str, float]] = []
        self._down_until: dict[int, float] = {}

    def describe(self) -> str:
        return (f"SIMULATED: {self.count} × {self.model}, scenario {self.scenario}, "
                f"seed {self.seed}")

    def open(self) -> list[GpuInfo]:
        ids = random.Random(f"gpuwhy-sim:{self.seed}")
        uuids = [uuid.UUID(int=ids.getrandbits(128), version=4) for _ in range(self.count)]
        self.gpus = [GpuInfo(GpuIdentity(uuid=f"GPU-{u}", index=i, minor=i,
                                         pci_bus_id=f"0000:{0x18 + 0x10 * i:02x}:00.0"),
                             model=f"{self.model} (SIMULATED)", driver_version="sim-0")
                     for i, u in enumerate(uuids)]
        self._counters = [dict.fromkeys(("energy_mj", "power_violation_ns",
                                         "thermal_violation_ns", "pcie_replays"), 0.0)
                          for _ in self.gpus]
        return self.gpus

    def notes(self) -> list[str]:
        return [self.describe()]

    def close(self) -> None:
        pass

    def read(self) -> list[Event]:
        t = self.tick * self.interval
        self.tick += 1
        if self.event_file and t < self.event_after and os.path.exists(self.event_file):
            self.event_after = t
        ts = now_ns()
        events: list[Event] = []
        for gpu in self.gpus:
            events += self._gpu_events(gpu, t, ts)
        return events

    def _gpu_events(self, gpu: GpuInfo, t: float, ts: int) -> list[Event]:
        index = gpu.identity.index or 0
        struck = index == 0 and self.scenario in ("xid-79", "gpu-reset")
        mark: dict[str, Any] = dict(gpu_id=gpu.id, source="sim", simulated=True)
        if struck and t >= self.event_after:
            return self._struck_events(gpu, t, ts, mark)
        rng = random.Random(f"{self.seed}:{self.scenario}:{index}:{self.tick}")
        fields = self._fields(index, t, rng)
        if self.scenario == "mig-idle-instance":
            return self._mig_events(index, fields, ts, mark)
        return [GpuSample(ts=ts, fields=fields, **mark)]

    def _mig_events(self, index: int, whole: dict, ts: int, mark: dict) -> list[Event]:
        """A GPU in MIG mode: its own sample without utilisation, and one per GPU instance."""
        samples = []
        for gi in MIG_INSTANCES:
            rng = random.Random(f"{self.seed}:{self.scenario}:{index}:{gi}:{self.tick}")
            fields = _mig_instance(rng, idle=(index, gi) == MIG_IDLE_INSTANCE)
            samples.append(GpuSample(ts=ts, fields=fields, instance=str(gi),
                                     labels={"mig_profile": MIG_PROFILE}, **mark))
        for name in MIG_WHOLE_GPU_ABSENT:
            whole.pop(name, None)
        whole["fb_used_mib"] = round(sum(s.fields["fb_used_mib"] for s in samples), 4)
        return [GpuSample(ts=ts, fields=whole, **mark), *samples]

    def _struck_events(self, gpu: GpuInfo, t: float, ts: int, mark: dict) -> list[Event]:
        first = t - self.interval < self.event_after
        if self.scenario == "xid-79":
            if first:
                return [GpuXid(ts=ts, xid=79, detail="GPU has fallen off the bus (simulated)",
                               **mark),
                        GpuState(ts=ts, state="lost", detail="Xid 79 (simulated)", **mark)]
            return []   # a lost GPU answers nothing
        back_at = self.event_after + RESET_SECONDS
        if first:
            return [GpuState(ts=ts, state=RESET_STATES[0], detail="GPU reset (simulated)",
                             **mark)]
        if t < back_at:
            return []
        events: list[Event] = []
        if t - self.interval < back_at:
            self._counters[0] = dict.fromkeys(self._counters[0], 0.0)   # reset clears them
            events += [GpuState(ts=ts, state=BACK_STATES[0], detail="reset done (simulated)",
                                **mark),
                       gpu.seen(ts, "sim", True)]
        rng = random.Random(f"{self.seed}:{self.scenario}:0:{self.tick}")
        fields = self._fields(0, t, rng, idle=True)
        return events + [GpuSample(ts=ts, fields=fields, **mark)]

    def _fields(self, index: int, t: float, rng: random.Random, idle: bool = False) -> dict:
        s = self.spec
        jitter = rng.uniform
        f = {"gpu_util": 98.0, "mem_util": 45.0, "sm_active": 0.86, "sm_occupancy": 0.52,
             "tensor_active": 0.55, "dram_active": 0.42, "gr_engine_active": 0.97,
             "fp16_active": 0.08, "fp32_active": 0.12, "fp64_active": 0.0,
             "pcie_tx_bytes_per_s": 0.6e9, "pcie_rx_bytes_per_s": 1.5e9,
             "nvlink_tx_bytes_per_s": 40e9, "nvlink_rx_bytes_per_s": 40e9,
             "sm_clock_mhz": s.sm_clock, "mem_clock_mhz": s.mem_clock,
             "power_w": 0.82 * s.power_limit, "power_limit_w": s.power_limit,
             "temp_c": 67.0, "mem_temp_c": 72.0, "fb_used_mib": 0.88 * s.fb_total,
             "clocks_event_reasons": 0, "pstate": 0, "pcie_link_gen": s.pcie_gen,
             "pcie_link_width": 16}
        scenario = "idle" if idle else self.scenario
        _SHAPES.get(scenario, _healthy)(f, s, t, rng, self.event_after)
        for name in ("gpu_util", "mem_util", "power_w", "temp_c", "mem_temp_c"):
            f[name] = max(0.0, f[name] + jitter(-1.5, 1.5))
        for name in ("sm_active", "tensor_active", "dram_active", "sm_occupancy"):
            f[name] = min(1.0, max(0.0, f[name] + jitter(-0.02, 0.02)))
        f["gpu_util"] = min(100.0, f["gpu_util"])
        f["power_w"] = min(f["power_w"], f["power_limit_w"])   # the limit is enforced
        counters = self._counters[index]
        counters["energy_mj"] += f["power_w"] * self.interval * 1000
        reasons = cast(int, f["clocks_event_reasons"])     # a bit mask among the floats
        if reasons & SW_POWER_CAP:
            counters["power_violation_ns"] += self.interval * 1e9
        if reasons & (SW_THERMAL | HW_THERMAL):
            counters["thermal_violation_ns"] += self.interval * 1e9
        f.update(counters, fb_total_mib=s.fb_total, enc_util=0.0, dec_util=0.0,
                 ecc_sbe_volatile=0, ecc_dbe_volatile=0, retired_pages_sbe=0,
                 retired_pages_dbe=0, row_remap_uncorrectable=0, row_remap_correctable=0,
                 row_remap_failed=0, row_remap_pending=0, pcie_link_gen_max=s.pcie_gen,
                 pcie_link_width_max=16)
        # pcie-allreduce's GPUs have no NVLink; without Fabric Manager no link is trained
        if s.nvlink and self.scenario not in ("pcie-allreduce", "fabric-manager-down"):
            f.update(dict.fromkeys(NVLINK_ERRORS, 0))   # healthy links: no errors, ever
        if self.scenario == "fabric-manager-down":
            # no health summary: what NVML says of it before the GPU has registered with
            # its fabric is not modelled here
            f["fabric_state"] = FABRIC_NOT_STARTED
        elif s.fabric and self.scenario != "pcie-allreduce":
            f.update(fabric_state=FABRIC_SUCCESS, fabric_health=FABRIC_HEALTHY)
        else:
            f.update(fabric_state=FABRIC_NOT_SUPPORTED, fabric_health=FABRIC_HEALTH_NOT_SUPPORTED)
        return {name: round(float(value), 4) for name, value in f.items()}


def _healthy(f: dict, s: Spec, t: float, rng: random.Random, at: float) -> None:
    pass


def _mig_instance(rng: random.Random, idle: bool) -> dict[str, float]:
    """One 1g.10gb GPU instance's fields: a training job's, or an idle tenant's that holds
    its memory; activity as DCGM's profiling ratios give it per instance."""
    if idle:
        f = dict.fromkeys(("gr_engine_active", "sm_active", "sm_occupancy", "tensor_active",
                           "dram_active", "fp16_active", "fp32_active", "fp64_active"), 0.0)
        f["fb_used_mib"] = MIG_IDLE_USED_MIB
    else:
        def ratio(mean: float, spread: float) -> float:
            return min(1.0, max(0.0, mean + rng.uniform(-spread, spread)))
        f = {"gr_engine_active": ratio(0.9, 0.06), "sm_active": ratio(0.78, 0.06),
             "sm_occupancy": ratio(0.45, 0.05), "tensor_active": ratio(0.5, 0.08),
             "dram_active": ratio(0.35, 0.06), "fp16_active": ratio(0.07, 0.02),
             "fp32_active": ratio(0.1, 0.03), "fp64_active": 0.0,
             "fb_used_mib": 7100.0 + rng.uniform(-150.0, 150.0)}
    f["fb_total_mib"] = MIG_INSTANCE_MIB
    return {name: round(float(value), 4) for name, value in f.items()}


def _idle(f: dict, s: Spec, t: float, rng: random.Random, at: float) -> None:
    f.update(gpu_util=0.0, mem_util=0.0, sm_active=0.0, sm_occupancy=0.0, tensor_active=0.0,
             dram_active=0.0, gr_engine_active=0.0, fp16_active=0.0, fp32_active=0.0,
             pcie_tx_bytes_per_s=1e5, pcie_rx_bytes_per_s=1e5, nvlink_tx_bytes_per_s=0.0,
             nvlink_rx_bytes_per_s=0.0, sm_clock_mhz=345.0, power_w=0.1 * s.power_limit,
             temp_c=38.0, mem_temp_c=40.0, fb_used_mib=0.0, clocks_event_reasons=GPU_IDLE,
             pstate=0, pcie_link_gen=PCIE_IDLE_GEN)


def _input_starved(f: dict, s: Spec, t: float, rng: random.Random, at: float) -> None:
    # Bursts of compute while a batch lasts, then waiting on the data loader.
    busy = (t % 10.0) < 3.0
    if not busy:
        _idle(f, s, t, rng, at)
        f.update(fb_used_mib=0.88 * s.fb_total, gpu_util=rng.uniform(0, 6))
    f["pcie_rx_bytes_per_s"] = rng.uniform(0.2e9, 0.6e9)


def _pageable_h2d(f: dict, s: Spec, t: float, rng: random.Random, at: float) -> None:
    # cudaMemcpy from pageable memory: staged through a bounce buffer, far below the link.
    f.update(gpu_util=55.0, sm_active=0.22, tensor_active=0.12, dram_active=0.15,
             pcie_rx_bytes_per_s=rng.uniform(3e9, 6e9), pcie_tx_bytes_per_s=0.3e9,
             power_w=0.45 * s.power_limit, nvlink_tx_bytes_per_s=0.0,
             nvlink_rx_bytes_per_s=0.0)


def _pcie_allreduce(f: dict, s: Spec, t: float, rng: random.Random, at: float) -> None:
    # All-reduce over PCIe (no NVLink): the link runs flat out, the SMs wait on NCCL.
    f.update(gpu_util=93.0, sm_active=0.31, tensor_active=0.18, dram_active=0.2,
             pcie_tx_bytes_per_s=s.pcie_bytes_per_s * rng.uniform(0.9, 0.97),
             pcie_rx_bytes_per_s=s.pcie_bytes_per_s * rng.uniform(0.9, 0.97),
             nvlink_tx_bytes_per_s=0.0, nvlink_rx_bytes_per_s=0.0,
             power_w=0.55 * s.power_limit)


def _power_cap(f: dict, s: Spec, t: float, rng: random.Random, at: float) -> None:
    limit = 0.5 * s.power_limit
    f.update(power_limit_w=limit, power_w=limit - 1.0, sm_clock_mhz=0.62 * s.sm_clock,
             clocks_event_reasons=SW_POWER_CAP, sm_active=0.8, tensor_active=0.45)


def _thermal_throttle(f: dict, s: Spec, t: float, rng: random.Random, at: float) -> None:
    heat = min(1.0, t / max(at, 1.0))   # warms up to the slowdown point by event_after
    f["temp_c"] = 67.0 + 21.0 * heat
    f["mem_temp_c"] = 72.0 + 20.0 * heat
    if heat >= 1.0:
        f.update(clocks_event_reasons=SW_THERMAL | HW_THERMAL, sm_clock_mhz=0.55 * s.sm_clock,
                 power_w=0.6 * s.power_limit, sm_active=0.78)


def _after_xid(f: dict, s: Spec, t: float, rng: random.Random, at: float) -> None:
    if t >= at:   # peers of a lost GPU spin in NCCL: busy but doing nothing
        f.update(gpu_util=100.0, sm_active=0.02, tensor_active=0.0, dram_active=0.01,
                 nvlink_tx_bytes_per_s=0.0, nvlink_rx_bytes_per_s=0.0,
                 power_w=0.3 * s.power_limit)


_SHAPES = {"healthy-training": _healthy, "idle": _idle, "input-starved": _input_starved,
           "pageable-h2d": _pageable_h2d, "pcie-allreduce": _pcie_allreduce,
           "power-cap": _power_cap, "thermal-throttle": _thermal_throttle,
           "xid-79": _after_xid, "gpu-reset": _healthy,
           # every CUDA start fails (cudaErrorSystemNotReady): the GPUs stay idle
           "fabric-manager-down": _idle,
           # the instances' own activity: _mig_instance
           "mig-idle-instance": _healthy}

