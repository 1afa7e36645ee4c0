"""Synthetic hosts for rule tests and the benchmark: healthy series, a few values changed.

A :class:`Synthetic` describes GPUs, the processes on them and what they do, second by
second; :meth:`Synthetic.events` turns it into the bus events the sources would send
(GpuSeen, GpuSample, ProcessSeen, DeviceOpened, SchedStats, DriverCallStats, CudaStats
when the CUDA uprobes are on, and any extra events), and :func:`run` replays them into an
engine the way the service would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwhy.correlator.rules.engine import Engine
from gpuwhy.correlator.rules.signals import MemorySignals
from gpuwhy.events import (
    CudaStats,
    DeviceOpened,
    DriverCallStats,
    Event,
    GpuSample,
    GpuSeen,
    ProcessSeen,
    RuleFinding,
    SchedStats,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.model import Override, Rule
from gpuwhy.rules.vocabulary import CALL_CLASSES

BASE_TS = 1_764_000_000 * 10**9
NS = 10**9
FB_TOTAL = 81559.0
HEALTHY_GPU: dict[str, float] = {
    "gpu_util": 98.0, "mem_util": 45.0, "gr_engine_active": 0.97, "sm_active": 0.86,
    "sm_occupancy": 0.52, "tensor_active": 0.55, "dram_active": 0.42, "fp16_active": 0.08,
    "fp32_active": 0.12, "fp64_active": 0.0, "pcie_tx_bytes_per_s": 0.6e9,
    "pcie_rx_bytes_per_s": 1.5e9, "nvlink_tx_bytes_per_s": 40e9,
    "nvlink_rx_bytes_per_s": 40e9, "sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0,
    "power_w": 574.0, "power_limit_w": 700.0, "temp_c": 67.0, "mem_temp_c": 72.0,
    "fb_used_mib": 0.88 * FB_TOTAL, "fb_total_mib": FB_TOTAL, "clocks_event_reasons": 0.0,
    "pstate": 0.0, "pcie_replays": 0.0, "ecc_sbe_volatile": 0.0, "ecc_dbe_volatile": 0.0,
    "row_remap_uncorrectable": 0.0, "row_remap_correctable": 0.0, "row_remap_failed": 0.0,
    "retired_pages_sbe": 0.0, "retired_pages_dbe": 0.0, "power_violation_ns": 0.0,
    "thermal_violation_ns": 0.0,
}
# Per side, CPU time per second of wall time (cores) in each scheduler state, and threads;
# net_wait: the part of sleep that ended in a receive from a TCP/IP socket, net_rx: bytes/s.
# main, busiest: the share of wall time its main thread, its busiest other thread was on
# a CPU.
HEALTHY_OWN = {"on_cpu": 1.0, "runqueue": 0.02, "sleep": 2.0, "blocked": 0.0, "threads": 3,
               "net_wait": 0.0, "net_rx": 0.0, "main": 0.6, "busiest": 0.3}
HEALTHY_WORKERS = {"on_cpu": 2.0, "runqueue": 0.05, "sleep": 1.9, "blocked": 0.05,
                   "threads": 4, "processes": 4, "net_wait": 0.0, "net_rx": 0.0,
                   "busiest": 0.5}
HEALTHY_CALLS = {"rm_alloc": 2.0, "rm_free": 2.0, "rm_control": 20.0, "rm_map": 1.0,
                 "uvm_migrate": 0.0, "uvm_advise": 0.0}
# CUDA API per second (the uprobes): calls, bytes, and the shares pinned / blocked.
HEALTHY_CUDA = {"launches": 400.0, "graph_launches": 0.0, "syncs": 2.0, "sync_frac": 0.05,
                "htod_bytes": 1.5e9, "dtoh_bytes": 0.1e9, "pageable_frac": 0.0,
                "allocs": 0.5, "frees": 0.5}
# One busy MIG instance (a 1g.10gb slice of an 80 GB board) as DCGM reports it per instance.
HEALTHY_INSTANCE = {"gr_engine_active": 0.92, "sm_active": 0.81, "dram_active": 0.35,
                    "fb_used_mib": 7400.0, "fb_total_mib": 9984.0}
COUNTERS = ("pcie_replays", "ecc_sbe_volatile", "ecc_dbe_volatile", "power_violation_ns",
            "thermal_violation_ns")

Varying = Mapping[str, Any] | Callable[[float], Mapping[str, Any]]


def _at(value: Varying, t: float) -> Mapping[str, Any]:
    return value(t) if callable(value) else value


@dataclass
class Synthetic:
    """A host: ``gpus`` GPUs with ``processes`` compute processes each; ``gpu``, ``own``,
    ``workers``, ``calls`` and ``cuda`` change the healthy values (a dict, or a function of the
    second ``t``); GPU counters in COUNTERS are given as rates per second and accumulated.
    ``cuda`` None: the CUDA uprobes are off (no CudaStats).
    ``extra`` holds (second, event) pairs whose ts is set to that second. ``started_s``: when
    the processes started, in seconds from the start (negative: before it); None: not known.
    ``numa_node``: the GPUs' NUMA node (None: not known); ``cpu_nodes``: the share of the
    processes' on-CPU time on each node (None: a host of one node). ``instances``: MIG GPU
    instances of every GPU, ``{id: (profile, changes to HEALTHY_INSTANCE)}``, each sampled
    on its own as dcgm-exporter labels them (GPU_I_ID, GPU_I_PROFILE). ``identities``: the
    first GPUs' (UUID, PCI bus id), where a real recording names them."""

    duration_s: int = 400
    step_s: int = 1
    gpus: int = 1
    processes: int = 1
    model: str = "NVIDIA H100 80GB HBM3"
    gpu: Varying = field(default_factory=dict)
    own: Varying = field(default_factory=dict)
    workers: Varying = field(default_factory=dict)
    calls: Varying = field(default_factory=dict)
    cuda: Varying | None = None
    # the GPU process's serving frontend (its engine's processes that are no children of it,
    # SchedStats.frontend): "busiest" (share of a core), "on_cpu" (cores); None: none
    frontend: Varying | None = None
    # its engine loop (processes between its engine and it: vLLM V1's EngineCore above its
    # tensor-parallel workers, SchedStats.engine_loop): as ``frontend``; None: none
    engine_loop: Varying | None = None
    cmdline: str = "python3 train.py --epochs 90"
    comm: str = "python3"
    env: Mapping[str, str] | None = None
    sched: bool = True
    started_s: float | None = None
    numa_node: int | None = None
    cpu_nodes: Sequence[float] | None = None
    extra: list[tuple[float, Event]] = field(default_factory=list)
    instances: Mapping[str, tuple[str, Varying]] = field(default_factory=dict)
    identities: Sequence[tuple[str, str]] = ()

    def gpu_id(self, index: int) -> str:
        if index < len(self.identities):
            return self.identities[index][0]
        return f"GPU-{index:08x}-0000-4000-8000-000000000000"

    def pci_bus_id(self, index: int) -> str:
        if index < len(self.identities):
            return self.identities[index][1]
        return f"0000:{0x18 + index:02x}:00.0"

    def process(self, gpu: int, n: int) -> ProcessKey:
        return ProcessKey(10_000 + gpu * 100 + n, 500_000 + gpu * 100 + n)

    def environ(self) -> dict[ProcessKey, Mapping[str, str]]:
        if self.env is None:
            return {}
        return {self.process(g, n): self.env for g in range(self.gpus)
                for n in range(self.processes)}

    def events(self) -> list[Event]:
        """Every event of the run, in time order."""
        out: list[Event] = []
        for g in range(self.gpus):
            gpu_id = self.gpu_id(g)
            out.append(GpuSeen(ts=BASE_TS, gpu_id=gpu_id, source="sim", simulated=True,
                               uuid=gpu_id, index=g, minor=g, model=self.model,
                               pci_bus_id=self.pci_bus_id(g), driver_version="sim",
                               numa_node=self.numa_node))
            for n in range(self.processes):
                key = self.process(g, n)
                out.append(ProcessSeen(
                    ts=BASE_TS, process=key, comm=self.comm, cmdline=self.cmdline,
                    exe="/usr/bin/python3", started_at=None if self.started_s is None
                    else BASE_TS + int(self.started_s * NS), env=dict(self.env or {})))
                out.append(DeviceOpened(ts=BASE_TS, process=key, fd=5 + g,
                                        path=f"/dev/nvidia{g}", device="nvidiaN", minor=g))
        totals: dict[tuple, float] = {}
        for step in range(1, self.duration_s // self.step_s + 1):
            t = step * self.step_s
            ts = BASE_TS + int(t * NS)
            for g in range(self.gpus):
                out.append(self._sample(g, t, ts, totals))
                for instance, (profile, changes) in self.instances.items():
                    out.append(GpuSample(
                        ts=ts, gpu_id=self.gpu_id(g), source="sim", simulated=True,
                        fields={k: float(v) for k, v in {**HEALTHY_INSTANCE,
                                                         **_at(changes, t)}.items()},
                        instance=instance, labels={"mig_profile": profile}))
                for n in range(self.processes):
                    key = self.process(g, n)
                    if self.sched:
                        out.append(self._sched(key, t, ts))
                    out.append(self._calls(key, t, ts, totals))
                    if self.cuda is not None:
                        out.append(self._cuda(key, t, ts))
        out += [dataclasses.replace(e, ts=BASE_TS + int(t * NS)) for t, e in self.extra]
        out.sort(key=lambda e: e.ts)
        return out

    def _sample(self, g: int, t: float, ts: int, totals: dict) -> GpuSample:
        fields = {**HEALTHY_GPU, **_at(self.gpu, t)}
        for name in COUNTERS:
            key = (g, name)
            totals[key] = totals.get(key, 0.0) + fields[name] * self.step_s
            fields[name] = totals[key]
        return GpuSample(ts=ts, gpu_id=self.gpu_id(g), source="sim", simulated=True,
                         fields={k: float(v) for k, v in fields.items() if v is not None})

    def _sched(self, key: ProcessKey, t: float, ts: int) -> SchedStats:
        interval = self.step_s * NS
        sides = {}
        for side, healthy, given in (("own", HEALTHY_OWN, self.own),
                                     ("workers", HEALTHY_WORKERS, self.workers)):
            values = {**healthy, **_at(given, t)}
            sides[side] = {f"{state}_ns": int(values[state] * interval)
                           for state in ("on_cpu", "runqueue", "sleep", "blocked")}
            sides[side]["threads"] = int(values["threads"])
            sides[side]["net_wait_ns"] = int(values["net_wait"] * interval)
            sides[side]["net_rx_bytes"] = int(values["net_rx"] * self.step_s)
            sides[side]["busiest_on_cpu_ns"] = int(values["busiest"] * interval)
            if side == "own":
                sides[side]["main_on_cpu_ns"] = int(values["main"] * interval)
        workers = int({**HEALTHY_WORKERS, **_at(self.workers, t)}["processes"])
        if workers == 0:
            sides["workers"] = dict.fromkeys(sides["workers"], 0)
        on_cpu = sides["own"]["on_cpu_ns"] + sides["workers"]["on_cpu_ns"]
        nodes = [int(on_cpu * share) for share in self.cpu_nodes or ()]
        def other(given: Varying | None) -> dict[str, int] | None:
            """A process of its engine's (frontend or engine loop) as given; None: none."""
            if given is None:
                return None
            values = {"busiest": 0.3, "on_cpu": 0.4, **_at(given, t)}
            return {"on_cpu_ns": int(values["on_cpu"] * interval),
                    "busiest_on_cpu_ns": int(values["busiest"] * interval),
                    "threads": 24, "processes": 1}

        return SchedStats(ts=ts, process=key, interval_ns=interval, own=sides["own"],
                          workers=sides["workers"], worker_processes=workers,
                          node_on_cpu_ns=nodes, frontend=other(self.frontend),
                          engine_loop=other(self.engine_loop))

    def _calls(self, key: ProcessKey, t: float, ts: int, totals: dict) -> DriverCallStats:
        rates = {**HEALTHY_CALLS, **_at(self.calls, t)}
        ops = []
        for index, (cls, members) in enumerate(CALL_CLASSES.items()):
            total_key = (key, cls)
            totals[total_key] = totals.get(total_key, 0.0) + rates.get(cls, 0.0) * self.step_s
            # an operation is (path, cmd, sub) for the probes and the store: one each
            ops.append({"cmd": 0x2B, "sub": index, "op": members[0], "sub_name": None,
                        "count": int(totals[total_key]), "errors": 0, "latency_sum_ns": 0,
                        "latency_max_ns": 0, "bytes": 0, "latency_log2": []})
        return DriverCallStats(ts=ts, process=key, path="/dev/nvidiactl", device="nvidiactl",
                               ops=ops)


    def _cuda(self, key: ProcessKey, t: float, ts: int) -> CudaStats:
        v = {**HEALTHY_CUDA, **_at(self.cuda, t)}  # type: ignore[arg-type]  # called when set
        s = self.step_s
        copies = {d: {"count": 0, "bytes": 0, "ns": 0, "async_count": 0, "pinned_bytes": 0,
                      "pageable_bytes": 0} for d in ("htod", "dtoh", "dtod", "htoh", "unknown")}
        for direction in ("htod", "dtoh"):
            moved = int(v[f"{direction}_bytes"] * s)
            pageable = int(moved * v["pageable_frac"])
            copies[direction].update(count=int(10 * s), bytes=moved, pageable_bytes=pageable,
                                     pinned_bytes=moved - pageable)
        memory = {"allocs": int(v["allocs"] * s), "alloc_bytes": int(v["allocs"] * s) << 20,
                  "frees": int(v["frees"] * s), "free_bytes": int(v["frees"] * s) << 20,
                  "host_allocs": 0, "host_alloc_bytes": 0, "host_frees": 0, "registers": 0,
                  "register_bytes": 0}
        syncs = {"cudaStreamSynchronize": {"count": int(v["syncs"] * s),
                                           "blocked_ns": int(v["sync_frac"] * s * NS)}}
        launches = int(v["launches"] * s)
        return CudaStats(ts=ts, process=key, interval_ns=s * NS, calls=launches + 20,
                         errors=0, launches={"cudaLaunchKernel": launches}, grid_log2=[],
                         block_log2=[], graph_launches=int(v["graph_launches"] * s),
                         copies=copies, syncs=syncs, sync_log2=[], memory=memory)


def run(spec: Synthetic, rules: Iterable[Rule], every_s: int = 10,
        overrides: Mapping[str, Override] | None = None,
        signals: MemorySignals | None = None) -> tuple[list[RuleFinding], Engine]:
    """Feed the events second by second and evaluate every ``every_s`` seconds."""
    signals = signals or MemorySignals(environ=spec.environ())
    engine = Engine(rules, signals, overrides=overrides, interval_ns=every_s * NS)
    findings: list[RuleFinding] = []
    events = spec.events()
    i = 0
    for t in range(every_s, spec.duration_s + 1, every_s):
        now = BASE_TS + t * NS
        while i < len(events) and events[i].ts <= now:
            signals.add(events[i])
            i += 1
        findings += engine.evaluate(now)
    return findings, engine
