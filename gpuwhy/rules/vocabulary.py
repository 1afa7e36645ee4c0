"""The names a rule can use: signals, event streams and their fields, bits, GPU model facts.

Every signal is defined once here, with how it is derived from what the sources report
(``gpu_samples`` columns / ``gpu_sample`` fields, ``sched_stats``, cumulative
``driver_call_stats``), so the store-backed and the in-memory signal sources agree.
A ``gpu`` signal is derived from one series of rows: the whole GPU's, or in a ``scope:
instance`` rule one MIG GPU instance's (``gpu_samples.instance``); the same names, never a
mix of the two.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwhy.gpufields import FABRIC_HEALTH, FABRIC_STATES

Row = Mapping[str, float | None]


@dataclass(frozen=True)
class Signal:
    """A per-sample series: ``source`` is ``gpu``, ``sched``, ``calls`` (a cumulative counter
    of driver calls), ``cuda`` (an interval of the CUDA uprobes, :meth:`CudaStats.totals`),
    ``engine`` (a scrape of an inference engine, :class:`EngineSample`) or ``fact`` (a
    constant from the GPU model); ``derive`` turns one row of that source into a value
    (None: not reported)."""

    name: str
    source: str
    unit: str
    help: str
    derive: Callable[[Row], float | None]
    counter: bool = False
    # derived for one GPU of the process: its rows carry that GPU's ``gpu_numa_node``
    per_gpu: bool = False


def _column(column: str, scale: float = 1.0) -> Callable[[Row], float | None]:
    def derive(row: Row) -> float | None:
        value = row.get(column)
        return None if value is None else value * scale
    return derive


def _sum(*columns: str) -> Callable[[Row], float | None]:
    def derive(row: Row) -> float | None:
        values: list[Any] = [row.get(c) for c in columns]     # summed once none is None
        return None if any(v is None for v in values) else sum(values)
    return derive


def _nvlink_crc(row: Row) -> float | None:
    """Flit plus data CRC errors; a GPU may give only the flit count (a missing data count
    is left out, not the whole sum), and one without NVLink neither."""
    flit, data = row.get("nvlink_crc_flit_errors"), row.get("nvlink_crc_data_errors")
    if flit is None and data is None:
        return None
    return (flit or 0.0) + (data or 0.0)


def _busy(row: Row) -> float | None:
    """``coalesce(gr_engine_active, gpu_util / 100)``: engine activity, util as fallback."""
    if row.get("gr_engine_active") is not None:
        return row["gr_engine_active"]
    util = row.get("gpu_util")
    return None if util is None else util / 100.0


def _ratio(numerator: str, denominator: str) -> Callable[[Row], float | None]:
    def derive(row: Row) -> float | None:
        n, d = row.get(numerator), row.get(denominator)
        return None if n is None or not d else n / d
    return derive


def _codes(table: Mapping[int, str]) -> str:
    """A code table as help text: "0 NotSupported, 1 NotStarted, ..."."""
    return ", ".join(f"{code} {name}" for code, name in table.items())


_GPU_COLUMNS = (
    # name, column, scale, unit, help
    ("gpu.util", "gpu_util", 0.01, "ratio",
     "share of time a kernel or a copy ran (DEV_GPU_UTIL / 100)"),
    ("gpu.mem_copy_util", "mem_util", 0.01, "ratio", "share of time device memory was read "
     "or written (DEV_MEM_COPY_UTIL / 100)"),
    ("gpu.gr_active", "gr_engine_active", 1.0, "ratio", "graphics/compute engine activity"),
    ("gpu.sm_active", "sm_active", 1.0, "ratio", "SM activity (PROF_SM_ACTIVE)"),
    ("gpu.sm_occ", "sm_occupancy", 1.0, "ratio", "SM occupancy (resident / max warps)"),
    ("gpu.tensor", "tensor_active", 1.0, "ratio", "tensor pipe activity"),
    ("gpu.dram", "dram_active", 1.0, "ratio", "DRAM activity (practical peak ~0.8)"),
    ("gpu.fp64", "fp64_active", 1.0, "ratio", "FP64 pipe activity"),
    ("gpu.fp32", "fp32_active", 1.0, "ratio", "FP32 (FMA) pipe activity, integer work too"),
    ("gpu.fp16", "fp16_active", 1.0, "ratio", "FP16 pipe activity"),
    ("gpu.pcie_tx_Bps", "pcie_tx_bytes_per_s", 1.0, "B/s", "PCIe bytes sent by the GPU"),
    ("gpu.pcie_rx_Bps", "pcie_rx_bytes_per_s", 1.0, "B/s", "PCIe bytes received (host→GPU)"),
    ("gpu.nvl_tx_Bps", "nvlink_tx_bytes_per_s", 1.0, "B/s", "NVLink bytes sent"),
    ("gpu.nvl_rx_Bps", "nvlink_rx_bytes_per_s", 1.0, "B/s", "NVLink bytes received"),
    ("gpu.power_w", "power_w", 1.0, "W", "board power draw"),
    ("gpu.plim_w", "power_limit_w", 1.0, "W", "enforced power limit"),
    ("gpu.clk_sm", "sm_clock_mhz", 1.0, "MHz", "SM clock"),
    ("gpu.clk_mem", "mem_clock_mhz", 1.0, "MHz", "memory clock"),
    ("gpu.reason", "clocks_event_reasons", 1.0, "bitmask", "clock throttle reasons"),
    ("gpu.pstate", "pstate", 1.0, "P-state", "performance state"),
    ("gpu.temp_c", "temp_c", 1.0, "°C", "GPU temperature"),
    ("gpu.mem_temp_c", "mem_temp_c", 1.0, "°C", "memory temperature"),
    ("gpu.fb_used", "fb_used_mib", 1.0, "MiB", "framebuffer used (cached-but-free counts)"),
    ("gpu.fb_total", "fb_total_mib", 1.0, "MiB", "framebuffer size"),
    ("gpu.ecc_sbe_vol", "ecc_sbe_volatile", 1.0, "count", "volatile corrected ECC errors"),
    ("gpu.ecc_dbe_vol", "ecc_dbe_volatile", 1.0, "count", "volatile uncorrected ECC errors"),
    ("gpu.rr_unc", "row_remap_uncorrectable", 1.0, "count", "rows remapped (uncorrectable)"),
    ("gpu.rr_corr", "row_remap_correctable", 1.0, "count", "rows remapped (correctable)"),
    ("gpu.rr_failure", "row_remap_failed", 1.0, "flag", "a row remap failed"),
    ("gpu.row_remap_pending", "row_remap_pending", 1.0, "flag",
     "a row remap waits for the next GPU reset to take effect"),
    ("gpu.pcie_gen", "pcie_link_gen", 1.0, "gen", "PCIe link generation now (an idle GPU "
     "drops to Gen1 to save power: below the max at idle is normal)"),
    ("gpu.pcie_gen_max", "pcie_link_gen_max", 1.0, "gen",
     "highest PCIe generation the GPU and its slot can reach"),
    ("gpu.pcie_width", "pcie_link_width", 1.0, "lanes", "PCIe link width now"),
    ("gpu.pcie_width_max", "pcie_link_width_max", 1.0, "lanes",
     "widest PCIe link the GPU and its slot can reach"),
    ("gpu.nvlink_replay_errors", "nvlink_replay_errors", 1.0, "count",
     "NVLink replays, all links"),
    ("gpu.nvlink_recovery_errors", "nvlink_recovery_errors", 1.0, "count",
     "NVLink link recoveries, all links"),
    ("gpu.fabric_state", "fabric_state", 1.0, "code", "NVLink fabric of an NVSwitch board "
     "(DCGM's Fabric Manager status): " + _codes(FABRIC_STATES)
     + "; CUDA starts on the GPU only at Success"),
    ("gpu.fabric_health", "fabric_health", 1.0, "code", "NVLink fabric health summary: "
     + _codes(FABRIC_HEALTH) + " (less bandwidth)"),
    ("gpu.pcie_replay", "pcie_replays", 1.0, "count", "PCIe replay counter"),
    ("gpu.viol_power_ns", "power_violation_ns", 1.0, "ns", "time held by the power limit"),
    ("gpu.viol_thermal_ns", "thermal_violation_ns", 1.0, "ns", "time held by temperature"),
)
_GPU_COUNTERS = {"gpu.ecc_sbe_vol", "gpu.ecc_dbe_vol", "gpu.pcie_replay", "gpu.viol_power_ns",
                 "gpu.viol_thermal_ns", "gpu.rr_unc", "gpu.rr_corr", "gpu.nvlink_replay_errors",
                 "gpu.nvlink_recovery_errors"}

SIGNALS: dict[str, Signal] = {
    name: Signal(name, "gpu", unit, text, _column(column, scale), name in _GPU_COUNTERS)
    for name, column, scale, unit, text in _GPU_COLUMNS}
SIGNALS["gpu.busy"] = Signal("gpu.busy", "gpu", "ratio",
                             "coalesce(gpu.gr_active, gpu.util): engine activity", _busy)
SIGNALS["gpu.fb_frac"] = Signal("gpu.fb_frac", "gpu", "ratio", "framebuffer used / size",
                                _ratio("fb_used_mib", "fb_total_mib"))
SIGNALS["gpu.nvlink_crc_errors"] = Signal("gpu.nvlink_crc_errors", "gpu", "count",
                                         "NVLink CRC errors (flit + data), all links",
                                         _nvlink_crc, True)
SIGNALS["gpu.retired_pages"] = Signal("gpu.retired_pages", "gpu", "count",
                                      "retired pages, SBE + DBE (pre-Ampere)",
                                      _sum("retired_pages_sbe", "retired_pages_dbe"), True)


def _share(side: str, state: str) -> Callable[[Row], float | None]:
    states = [f"{side}_{s}" for s in ("on_cpu_ns", "runqueue_ns", "sleep_ns", "blocked_ns")]

    def derive(row: Row) -> float | None:
        values: list[Any]           # summed once none is None
        values, part = [row.get(s) for s in states], row.get(f"{side}_{state}")
        if part is None or any(v is None for v in values) or not sum(values):
            return None
        return part / sum(values)
    return derive


def _cores(side: str, *states: str) -> Callable[[Row], float | None]:
    def derive(row: Row) -> float | None:
        values: list[Any]           # summed once none is None
        values, interval = [row.get(f"{side}_{s}") for s in states], row.get("interval_ns")
        return None if None in values or not interval else sum(values) / interval
    return derive


def _side_per_second(side: str, figure: str) -> Callable[[Row], float | None]:
    def derive(row: Row) -> float | None:
        value, interval = row.get(f"{side}_{figure}"), row.get("interval_ns")
        return None if value is None or not interval else value * 1e9 / interval
    return derive


for _side, _prefix, _who in (("own", "proc", "the GPU process's own threads"),
                             ("workers", "workers", "its worker processes (DataLoader)")):
    SIGNALS[f"{_prefix}.cpu_cores"] = Signal(f"{_prefix}.cpu_cores", "sched", "cores",
                                             f"CPU used by {_who}", _cores(_side, "on_cpu_ns"))
    # What the threads wanted: on a CPU or runnable, waiting for one. On a busy host a
    # CPU-bound worker gets less than a core but still wants one: it is no less the cause.
    SIGNALS[f"{_prefix}.cpu_demand"] = Signal(
        f"{_prefix}.cpu_demand", "sched", "cores",
        f"CPU wanted by {_who}: on a CPU or waiting in the run queue",
        _cores(_side, "on_cpu_ns", "runqueue_ns"))
    SIGNALS[f"{_prefix}.net_rx_Bps"] = Signal(
        f"{_prefix}.net_rx_Bps", "sched", "B/s",
        f"bytes/s {_who} received from TCP/IP sockets (object stores, HTTP, gRPC; not NFS, "
        "whose reads are the kernel's; unknown where the kernel offers no hook)",
        _side_per_second(_side, "net_rx_bytes"))
    for _state, _what in (("on_cpu_ns", "oncpu"), ("runqueue_ns", "runq"),
                          ("sleep_ns", "sleep"), ("blocked_ns", "blocked"),
                          ("net_wait_ns", "netwait")):
        SIGNALS[f"{_prefix}.{_what}_frac"] = Signal(
            f"{_prefix}.{_what}_frac", "sched", "ratio",
            f"share of the thread time of {_who} spent {_what.replace('_', ' ')}"
            + {"runq": " (runnable, waiting for a CPU)", "sleep": " (interruptible sleep, S)",
               "blocked": " (uninterruptible, D: usually I/O)", "oncpu": "",
               "netwait": " (asleep until data came on a TCP/IP socket: waiting for the "
                          "network; part of sleep; unknown where the kernel offers no "
                          "hook)"}[_what],
            _share(_side, _state))


def _remote_share(row: Row) -> float | None:
    """Share of the on-CPU time spent on nodes other than the GPU's; unknown on a host of
    one node, when the GPU's node is not known, or in a second without CPU time."""
    nodes: Any                      # the store's JSON list, or the list itself
    nodes, home = row.get("node_on_cpu_ns"), row.get("gpu_numa_node")
    if isinstance(nodes, str):          # as the store keeps it: a JSON list
        nodes = json.loads(nodes)
    if not nodes or len(nodes) < 2 or home is None or not 0 <= home < len(nodes):
        return None
    total = sum(nodes)
    return None if not total else 1.0 - nodes[int(home)] / total


SIGNALS["proc.cpu_remote_frac"] = Signal(
    "proc.cpu_remote_frac", "sched", "ratio",
    "share of the on-CPU time of the process and its workers spent on CPUs of another NUMA "
    "node than its GPU's (unknown on a one-node host)", _remote_share, per_gpu=True)
# One thread on a CPU all the time, which the sums cannot tell from many threads each a
# little busy: a Python serving engine's loop holding the GIL on the main thread (vLLM's
# EngineCore busy loop, SGLang's scheduler), a frontend's or tokeniser's on another.
for _name, _column_name, _help in (
        ("proc.main_thread_oncpu", "own_main_on_cpu_ns", "the GPU process's main thread"),
        ("proc.busiest_thread_oncpu", "own_busiest_on_cpu_ns",
         "the GPU process's busiest thread other than its main thread"),
        ("workers.busiest_thread_oncpu", "workers_busiest_on_cpu_ns",
         "the busiest thread of its worker processes")):
    SIGNALS[_name] = Signal(_name, "sched", "ratio", f"share of the interval {_help} spent "
                            "on a CPU (1: one core all the time)",
                            _ratio(_column_name, "interval_ns"))
# The processes of a GPU process's serving engine that are not its own (probes/engines/
# frontend.py; unknown where none is watched for it). Its frontend: processes of the engine
# that are no children of the GPU process (vLLM's API server, SGLang's tokenizer manager,
# TGI's router). Its engine loop: the processes between the engine and the GPU process
# (vLLM V1's EngineCore above its tensor-parallel workers runs the scheduler's busy loop and
# holds no GPU, so the GPU process's own main thread is a worker's, not the loop's).
for _role, _what in (
        ("frontend", "frontend processes (vLLM's API server, SGLang's tokenizer manager, "
                     "TGI's router: processes of the engine that are no children of the GPU "
                     "process)"),
        ("engine_loop", "loop processes (vLLM V1's EngineCore above its tensor-parallel "
                        "workers: the processes between the engine and the GPU process)")):
    _short = _what.split(" (")[0]
    SIGNALS[f"{_role}.busiest_thread_oncpu"] = Signal(
        f"{_role}.busiest_thread_oncpu", "sched", "ratio",
        f"share of the interval the busiest thread of its serving engine's {_what} spent on "
        "a CPU (1: one core all the time; unknown where none is watched for it)",
        _ratio(f"{_role}_busiest_on_cpu_ns", "interval_ns"))
    SIGNALS[f"{_role}.cpu_cores"] = Signal(f"{_role}.cpu_cores", "sched", "cores",
                                           f"CPU used by its serving engine's {_short}",
                                           _cores(_role, "on_cpu_ns"))
    SIGNALS[f"{_role}.count"] = Signal(f"{_role}.count", "sched", "count",
                                       f"its serving engine's {_short} watched",
                                       _column(f"{_role}_processes"))
SIGNALS["proc.threads"] = Signal("proc.threads", "sched", "count", "threads of the process",
                                 _column("own_threads"))
SIGNALS["workers.count"] = Signal("workers.count", "sched", "count",
                                  "worker (child) processes", _column("worker_processes"))
SIGNALS["workers.threads"] = Signal("workers.threads", "sched", "count",
                                    "threads of the worker processes", _column("workers_threads"))

# Driver-call classes: which decoded op names each cumulative counter adds up.
CALL_CLASSES: dict[str, tuple[str, ...]] = {
    "rm_alloc": ("NV_ESC_RM_ALLOC", "NV_ESC_RM_ALLOC_MEMORY", "NV_ESC_RM_VID_HEAP_CONTROL"),
    "rm_free": ("NV_ESC_RM_FREE",),
    "rm_control": ("NV_ESC_RM_CONTROL",),
    "rm_map": ("NV_ESC_RM_MAP_MEMORY", "NV_ESC_RM_MAP_MEMORY_DMA"),
    "uvm_migrate": ("UVM_MIGRATE",),
    "uvm_advise": ("UVM_SET_PREFERRED_LOCATION", "UVM_ENABLE_READ_DUPLICATION",
                   "UVM_SET_ACCESSED_BY"),
}
for _cls in (*CALL_CLASSES, "total", "errors"):
    SIGNALS[f"proc.ioctl.{_cls}"] = Signal(
        f"proc.ioctl.{_cls}", "calls", "count",
        "cumulative driver calls" + ("" if _cls == "total" else
                                     " that failed" if _cls == "errors" else f" of class {_cls}"),
        _column(_cls), counter=True)


def _per_second(*columns: str) -> Callable[[Row], float | None]:
    def derive(row: Row) -> float | None:
        interval = row.get("interval_ns")
        if not interval:
            return None
        return sum(row.get(c) or 0 for c in columns) * 1e9 / interval
    return derive


def _part(part: tuple[str, ...], whole: tuple[str, ...]) -> Callable[[Row], float | None]:
    def derive(row: Row) -> float | None:
        total = sum(row.get(c) or 0 for c in whole)
        return None if not total else sum(row.get(c) or 0 for c in part) / total
    return derive


# CUDA API figures (opt-in uprobes): rows only for the seconds in which the process called
# the CUDA libraries, so a mean is over those seconds.
_HOST_COPIES = ("htod_pinned_bytes", "htod_pageable_bytes", "dtoh_pinned_bytes",
                "dtoh_pageable_bytes")
for _name, _unit, _help, _derive in (
        ("cuda.launch_rate", "1/s", "kernel and graph launches per second",
         _per_second("launches", "graph_launches")),
        ("cuda.sync_rate", "1/s", "CUDA synchronisation calls per second",
         _per_second("syncs")),
        ("cuda.sync_frac", "ratio", "thread time blocked in CUDA synchronisation calls per "
         "second (cuStreamSynchronize, cudaDeviceSynchronize, ...)",
         _ratio("sync_blocked_ns", "interval_ns")),
        ("cuda.htod_Bps", "B/s", "bytes copied host to device per second",
         _per_second("htod_bytes")),
        ("cuda.dtoh_Bps", "B/s", "bytes copied device to host per second",
         _per_second("dtoh_bytes")),
        ("cuda.pageable_frac", "ratio", "share of host<->device bytes copied from or to "
         "pageable (not pinned) host memory", _part(("htod_pageable_bytes",
                                                     "dtoh_pageable_bytes"), _HOST_COPIES)),
        ("cuda.alloc_rate", "1/s", "device allocations and frees per second (cuMemAlloc, "
         "cudaMalloc, cuMemFree, cudaFree)", _per_second("allocs", "frees"))):
    SIGNALS[_name] = Signal(_name, "cuda", _unit, _help, _derive)


# Inference engines (probes/engines): one row per scrape of the engine's /metrics (every 5 s),
# read for the engine's process and for the processes of its tree that hold the GPU (a
# vLLM V1 server's EngineCore). Rates, quantiles and means are over the interval since the
# scrape before; a figure the engine does not publish is absent, never 0.
ENGINE_VALUES: dict[str, tuple[str, str]] = {
    "requests_running": ("count", "requests the engine is running (in its batch)"),
    "requests_waiting": ("count", "requests queued, waiting to be scheduled"),
    "kv_cache_usage": ("ratio", "share of the KV cache in use (vLLM kv_cache_usage_perc or "
                                "gpu_cache_usage_perc, SGLang token_usage), 0..1"),
    "batch_size": ("count", "batch size: TGI's current batch, Triton's average dynamic batch "
                            "(inferences / executions)"),
    "preemptions_per_s": ("1/s", "requests preempted (vLLM) or retracted (SGLang) per second: "
                                 "the KV cache could not hold them"),
    "prompt_tokens_per_s": ("1/s", "prompt (prefill) tokens processed per second"),
    "generation_tokens_per_s": ("1/s", "tokens generated per second"),
    "requests_per_s": ("1/s", "requests finished per second"),
    "batch_limit": ("count", "requests the engine runs at once at most, as its command line "
                             "sets it (vLLM --max-num-seqs, SGLang --max-running-requests, "
                             "TGI --max-batch-size); absent when the command line sets none "
                             "(the default depends on the engine's version and GPU)"),
}
for _what, _text in (("ttft", "time to first token"), ("tpot", "time per output token "
                                                               "(inter-token latency)"),
                     ("e2e", "end-to-end request latency"), ("queue", "time queued")):
    for _stat, _how in (("p50", "median"), ("p95", "95th percentile"), ("mean", "mean")):
        ENGINE_VALUES[f"{_what}_{_stat}_s"] = ("s", f"{_how} {_text} of the requests of the "
                                                    "interval")
for _value, (_unit, _help) in ENGINE_VALUES.items():
    SIGNALS[f"engine.{_value}"] = Signal(f"engine.{_value}", "engine", _unit, _help,
                                         _column(_value))


def call_class_totals(ops: list[Mapping]) -> dict[str, float]:
    """Cumulative counts per class (and ``total``, ``errors``) from driver_call_stats ops."""
    by_op: dict[str, float] = {}
    totals = {"total": 0.0, "errors": 0.0}
    for op in ops:
        by_op[op["op"]] = by_op.get(op["op"], 0.0) + (op.get("count") or 0)
        totals["total"] += op.get("count") or 0
        totals["errors"] += op.get("errors") or 0
    for name, members in CALL_CLASSES.items():
        totals[name] = sum(by_op.get(m, 0.0) for m in members)
    return totals


@dataclass(frozen=True)
class GpuModel:
    """What a model name tells about a GPU (nominal values; a site can differ)."""

    match: str
    arch: float          # compute capability: 7.0 Volta, 8.0 Ampere, 8.9 Ada, 9.0 Hopper
    clk_sm_max: float    # MHz
    plim_default_w: float
    pcie_gen: int
    nvlink: bool
    fp64_reduced: bool


# First match wins: the longer names come before their prefixes.
GPU_MODELS = (
    GpuModel("H200", 9.0, 1980, 700, 5, True, False),
    GpuModel("H100 PCIe", 9.0, 1755, 350, 5, False, False),
    GpuModel("H100", 9.0, 1980, 700, 5, True, False),
    GpuModel("A100-PCIE", 8.0, 1410, 250, 4, False, False),
    GpuModel("A100", 8.0, 1410, 400, 4, True, False),
    GpuModel("A30", 8.0, 1440, 165, 4, False, False),
    GpuModel("A10", 8.6, 1695, 150, 4, False, True),
    GpuModel("L40S", 8.9, 2520, 350, 4, False, True),
    GpuModel("L4", 8.9, 2040, 72, 4, False, True),
    GpuModel("V100", 7.0, 1530, 300, 3, True, False),
    GpuModel("T4", 7.5, 1590, 70, 3, False, True),
)
PCIE_LANE_BPS = {3: 985e6, 4: 2 * 985e6, 5: 4 * 985e6}   # per lane per direction [DCGM-PROF]


def gpu_model(model: str) -> GpuModel | None:
    return next((m for m in GPU_MODELS if m.match in model), None)


FACTS: dict[str, tuple[str, str, Callable[[GpuModel], float]]] = {
    "gpu.arch": ("compute capability from the model (8.0 Ampere, 9.0 Hopper)", "",
                 lambda m: m.arch),
    "gpu.clk_sm_max": ("nominal maximum SM clock of the model", "MHz", lambda m: m.clk_sm_max),
    "gpu.plim_default_w": ("default power limit of the model", "W", lambda m: m.plim_default_w),
    "gpu.pcie_peak_Bps": ("x16 PCIe peak per direction for the model's generation", "B/s",
                          lambda m: 16 * PCIE_LANE_BPS[m.pcie_gen]),
    "gpu.has_tf32": ("1 when the GPU has TF32 tensor cores (Ampere and later)", "flag",
                     lambda m: float(m.arch >= 8.0)),
    "gpu.has_tensor": ("1 when the GPU has tensor cores (Volta and later)", "flag",
                       lambda m: float(m.arch >= 7.0)),
    "gpu.has_nvlink": ("1 when the model has NVLink", "flag", lambda m: float(m.nvlink)),
    "gpu.fp64_reduced": ("1 when the model has reduced FP64 throughput", "flag",
                         lambda m: float(m.fp64_reduced)),
}
# Facts the engine knows about the instance itself (not from the model).
INSTANCE_FACTS = {
    "gpu.procs": "compute processes on the GPU (monitors excluded)",
    "gpu.contexts": "processes holding a context on the GPU: its NVML process list, else a "
                    "process holding k GPUs' device files counts 1/k (monitors excluded)",
    "proc.age_s": "seconds since the process was first seen",
    "proc.job_gpus": "GPUs on which a process with this process's command line computes, its "
                     "own included: a job's ranks on this host (1: a one-GPU process)",
}
PROCESS_TEXT = {"proc.cmdline": "command line (bounded, untrusted)", "proc.comm": "name",
                "proc.exe": "executable path", "proc.cgroup": "cgroup path"}



@dataclass(frozen=True)
class Stream:
    """An event stream: ``scope`` ``gpu`` (events of the GPU under evaluation) or ``host``
    (every event of the host; ``own`` is 1 for the process under evaluation)."""

    name: str
    scope: str
    fields: Mapping[str, str]   # field -> "num" or "text"
    help: str


STREAMS: dict[str, Stream] = {s.name: s for s in (
    Stream("journal.xid", "gpu", {"code": "num", "pid": "num", "name": "text", "text": "text"},
           "Xid lines of the kernel log (NVRM: Xid (PCI:…): code)"),
    Stream("journal.nvrm", "gpu", {"kind": "text", "text": "text"},
           "other recognised NVRM kernel-log lines: kind is fallen_off_bus, rm_init_failed, "
           "probe_failed, api_mismatch, gsp_timeout, gsp_rate_limited, gsp_rpc_failed, "
           "driver_loaded, sxid"),
    Stream("gpu.xid", "gpu", {"code": "num", "text": "text"},
           "Xids reported by the GPU source (NVML event, DCGM field)"),
    Stream("gpu.state", "gpu", {"state": "text", "text": "text", "reset": "text"},
           "the GPU stopped or resumed answering: lost, reset_required, resetting, back; "
           "reset is \"reset\" when the GPU is being reset, \"needed\" when it needs one, "
           "\"back\" when it answers again"),
    Stream("cron.run", "host", {"command": "text", "user": "text", "gpu_action": "text",
                                "reset": "text"},
           "cron started a job; gpu_action says what it does to GPUs (\"\" when nothing); "
           "reset is \"request\" when the job resets a GPU (nvidia-smi -r), \"\" otherwise"),
    Stream("proc.exec", "host", {"filename": "text", "cmdline": "text", "comm": "text",
                                 "gpu_action": "text", "reset": "text", "own": "num"},
           "a process replaced its image (exec); gpu_action and reset as for cron.run"),
    Stream("proc.exit", "gpu", {"exit_code": "num", "signal": "num", "comm": "text",
                                "own": "num"},
           "a process that had opened the GPU's device files ended (GPU monitors such as "
           "nvidia-smi not counted); the host's other processes are not this stream's"),
    Stream("driver.call", "host", {"op": "text", "sub_name": "text", "reasons": "text",
                                   "status": "text", "ret": "num", "latency_ms": "num",
                                   "reset": "text", "own": "num"},
           "a notable, slow or failed driver call; ret is the ioctl's return (0, or minus the "
           "errno: -22 EINVAL is the module's refusal); reset is \"reset\" when the call "
           "resets the GPU, \"request\" when it marks the GPU for a reset, \"\" otherwise"),
)}

# G-MONITOR: processes that open the GPU to watch it, never to compute.
# A monitor by its program (a command line's first word, or the script or module Python
# runs: `python3 -m gpuwhy`, as the GPU kit and containers run it), never by a later
# argument: it opens the GPU's device files through NVML, and is never the job a finding,
# a stall or an Xid is about.
MONITOR_PATTERN = (r"^(\S*/)?(?:python[0-9.]*\s+(?:-\S+\s+)*(?:-m\s*|\S*/)?)?"
                   r"(nv-hostengine|dcgm-exporter|dcgmi|nvidia-smi|nvidia-persistenced|nvtop|"
                   r"nvitop|gpustat|gpuwhy)(\s|$)")


def describe() -> list[tuple[str, str, str]]:
    """(name, unit, help) of every name a rule can read, for ``rules signals`` and the docs."""
    rows = [(s.name, s.unit, s.help + (" (counter)" if s.counter else ""))
            for s in SIGNALS.values()]
    rows += [(name, unit, text) for name, (text, unit, _) in FACTS.items()]
    rows += [(name, "", text) for name, text in {**INSTANCE_FACTS, **PROCESS_TEXT}.items()]
    rows += [(name, "events", f"{s.help}; fields: {', '.join(s.fields)}")
             for name, s in STREAMS.items()]
    return sorted(rows)
