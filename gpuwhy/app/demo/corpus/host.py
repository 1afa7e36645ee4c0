"""A GPU host second by second, from the physics of its boards and the jobs on them.

Harness code. A :class:`Host` holds boards (:class:`Board`: clocks, power, thermal
resistance, link speeds of a real model), conditions on them (a lowered power limit, a
degraded thermal interface, a brake, application clocks, errors) and jobs: a
:class:`Training` job is simulated step by step (DataLoader workers producing batches in
order, the main thread fetching, copying and launching, the GPU computing, ranks meeting in
every all-reduce, checkpoints, crashes, hangs), an :class:`Inference` server request by
request, a :class:`Holder` holds memory and does nothing. What each process did is binned
into seconds; the GPU fields follow from the kernels that ran (DCGM's ratios are shares of
the second times the kernel mix), the power from the activity and the clock, the clock from
the governors (power limit, temperature, brakes, locks), the temperature from a first-order
heat model. :meth:`Host.events` gives the bus events the sources would have sent (GPU
source, probes, kernel log, cron), in time order, with their source names.

Nothing here is tuned to a rule: the numbers are the boards' and the workloads'.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from gpuwhy.events import (
    CronExecution,
    CudaStats,
    DeviceClosed,
    DeviceOpened,
    DriverCall,
    DriverCallStats,
    EngineSample,
    Event,
    GpuProcesses,
    GpuSample,
    GpuSeen,
    GpuState,
    GpuXid,
    KernelLogFacts,
    KernelLogRecord,
    ProcessExec,
    ProcessExited,
    ProcessSeen,
    SchedStats,
)
from gpuwhy.gpufields import FABRIC_NOT_SUPPORTED, FABRIC_SUCCESS, THROTTLE_BITS
from gpuwhy.identity import ProcessKey
from gpuwhy.nvioctl import iowr
from gpuwhy.reset import BIF_RESET, RESET_CONTROLS

NS = 10**9
# 2025-11-03 08:00:00 UTC; each seed moves the capture by whole hours.
EPOCH_NS = 1_762_156_800 * NS
TICKS = 100   # clock ticks per second (ProcessKey.start_time)
IDLE_BIT, APP_CLOCKS, SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE = (
    THROTTLE_BITS[n] for n in ("IDLE", "APP_CLOCKS", "SW_POWER_CAP", "HW_SLOWDOWN",
                               "SW_THERMAL", "HW_THERMAL", "HW_POWER_BRAKE"))
DCGM_PCIE_OVERHEAD = 1.09   # DCGM's PCIe bytes count TLP headers too (~24 B a 256 B payload)


# --- boards -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Board:
    """A GPU model's nominal figures. ``dyn_w``: dynamic power at full activity and maximum
    clock (it scales with the clock ** 2.2); ``r_th``: °C per W with good cooling; ``tau_s``:
    the die's thermal time constant; ``t_slow``/``t_hw``: SW thermal slowdown (max operating
    temperature) and HW slowdown points."""

    model: str
    sms: int
    clk_max: float
    clk_idle: float
    mem_clock: float
    tdp_w: float
    idle_w: float
    ctx_w: float
    dyn_w: float
    fb_mib: float
    pcie_gen: int
    nvlink_Bps: float          # per direction, all links, 0 without NVLink
    r_th: float
    tau_s: float = 45.0
    t_slow: float = 87.0
    t_hw: float = 92.0
    # An NVSwitch fabric the GPU reports (HGX H100: Success once Fabric Manager set it up);
    # False: NotSupported, as a PCIe card reports, and an HGX A100 (NVML's fabric probe and
    # DCGM's field 170 from it are Hopper's and later)
    fabric: bool = False

    @property
    def pcie_Bps(self) -> float:
        """What a x16 link carries per direction in pinned copies (~85 % of the raw rate:
        ~26 of 31.5 GB/s on gen4, ~54 of 63 GB/s on gen5)."""
        return pcie_link_Bps(self.pcie_gen, 16)


def pcie_link_Bps(gen: int, lanes: int) -> float:
    """Pinned-copy bytes a second, one direction, of a PCIe link (~85 % of the raw rate)."""
    return lanes * {1: 250e6, 2: 500e6, 3: 985e6, 4: 2 * 985e6, 5: 4 * 985e6}[gen] * 0.85


H100 = Board("NVIDIA H100 80GB HBM3", 132, 1980, 345, 2619, 700, 70, 115, 843, 81559, 5,
             450e9, 0.061, fabric=True)
A100 = Board("NVIDIA A100-SXM4-80GB", 108, 1410, 210, 1593, 400, 55, 85, 454, 81920, 4,
             300e9, 0.095, t_slow=85.0, t_hw=90.0)
L40S = Board("NVIDIA L40S", 142, 2520, 210, 9001, 350, 35, 80, 389, 46068, 4, 0.0, 0.137,
             t_slow=88.0, t_hw=93.0)
L4 = Board("NVIDIA L4", 58, 2040, 210, 6251, 72, 16, 28, 63, 23034, 4, 0.0, 0.6,
           t_slow=85.0, t_hw=90.0)


@dataclass(frozen=True)
class Mix:
    """What the kernels do while they run: SM coverage (share of SMs with a warp), occupancy
    of the active SMs, and each pipe's and DRAM's activity, as DCGM's ratios."""

    sm: float
    occ: float
    tensor: float
    dram: float
    fp32: float = 0.05
    fp16: float = 0.0
    fp64: float = 0.0

    def demand(self) -> float:
        """Share of the board's dynamic power this mix draws at the maximum clock."""
        return min(1.0, 0.35 * self.sm + 0.5 * self.tensor + 0.2 * self.dram
                   + 0.15 * self.fp32 + 0.1 * self.fp16 + 0.3 * self.fp64)


# NCCL kernels: a few blocks per channel spin on flags and copy through HBM.
NCCL_MIX = Mix(sm=0.16, occ=0.12, tensor=0.0, dram=0.08, fp32=0.01)
# Typical mixes (bf16/fp16 with tensor cores unless named otherwise).
LLM_TRAIN = Mix(0.93, 0.45, 0.62, 0.35, 0.08, 0.05)
CNN_TRAIN = Mix(0.90, 0.50, 0.45, 0.45, 0.10, 0.12)
LLM_DECODE = Mix(0.68, 0.30, 0.22, 0.62, 0.05, 0.10)


def power_speed(board: Board, mix: Mix, limit_w: float) -> float:
    """The clock share the power governor settles at under ``mix`` with ``limit_w``."""
    demand = board.ctx_w + board.dyn_w * mix.demand()
    if demand <= limit_w:
        return 1.0
    return max(0.3, ((limit_w - board.ctx_w) / (demand - board.ctx_w)) ** (1 / 2.2))


def thermal_speed(board: Board, mix: Mix, r_factor: float, inlet_c: float = 27.0) -> float:
    """The clock share that holds the die at its slowdown point with the thermal
    resistance ``r_factor`` times the board's (1.0: no slowdown needed)."""
    allowed_w = (board.t_slow - inlet_c) / (board.r_th * r_factor)
    return power_speed(board, mix, min(allowed_w, board.tdp_w))


# --- per-second bins ----------------------------------------------------------------------
class Bins:
    """Per-second sums over ``[0, n)``: ``span`` adds ``rate`` × the overlap of an interval
    with each second (or with its last ``tail`` seconds only), ``at`` a point amount."""

    __slots__ = ("v", "tail")

    def __init__(self, n: int, tail: float = 1.0):
        self.v = [0.0] * n
        self.tail = tail

    def span(self, t0: float, t1: float, rate: float = 1.0) -> None:
        n = len(self.v)
        if t1 <= t0 or t1 <= 0 or t0 >= n:
            return
        k = max(0, int(t0))
        last = min(n - 1, int(t1))
        while k <= last:
            a, b = max(t0, k + 1 - self.tail), min(t1, k + 1)
            if b > a:
                self.v[k] += rate * (b - a)
            k += 1

    def at(self, t: float, amount: float) -> None:
        if 0 <= t < len(self.v):
            self.v[int(t)] += amount


class Trace:
    """What one compute process did, per second."""

    def __init__(self, n: int):
        self.n = n
        self.compute = Bins(n)               # seconds of its kernels (its Mix)
        self.nccl = Bins(n)                  # seconds of NCCL kernels only
        self.util = Bins(n, tail=1 / 6)      # kernel time in NVML's last 1/6 s sample
        self.rx = Bins(n)                    # PCIe bytes host -> GPU
        self.tx = Bins(n)
        self.nvl = Bins(n)                   # NVLink bytes, each direction
        self.main_on = Bins(n)
        self.main_blocked = Bins(n)
        self.aux_on = Bins(n)
        self.front_on = Bins(n)              # a frontend thread (an inference server's)
        self.w_front = Bins(n)               # a worker's frontend thread (a tokeniser's)
        # a frontend process's busiest thread: one of the engine's, no child of this one
        # (vLLM V1's API server above EngineCore); None: it has none (SchedStats.frontend)
        self.p_front: Bins | None = None
        # an engine-loop process's busiest thread: one between the engine and this one
        # (vLLM V1's EngineCore above its tensor-parallel workers); None: it has none
        # (SchedStats.engine_loop)
        self.p_loop: Bins | None = None
        self.loop_on = Bins(n)               # an engine loop on a thread other than main
        self.w_on = Bins(n)
        self.w_blocked = Bins(n)
        self.w_runq = Bins(n)
        self.main_net = Bins(n)              # bytes received from sockets
        self.w_net = Bins(n)
        self.main_net_wait = Bins(n)         # thread-seconds asleep until those came
        self.w_net_wait = Bins(n)
        self.launches = Bins(n)
        self.syncs = Bins(n)
        self.sync_wait = Bins(n)
        self.allocs = Bins(n)                # cudaMalloc + cudaFree calls
        self.pageable = Bins(n)              # bytes copied from pageable memory
        self.rm_alloc = Bins(n)
        self.rm_free = Bins(n)
        self.rm_map = Bins(n)
        self.uvm = Bins(n)
        self.mix: Mix | None = None
        self.end: float = math.inf           # when the process ended
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.fb_mib: Callable[[float], float] = lambda t: 0.0


# --- NUMA placement -----------------------------------------------------------------------
# Where a job's threads run on a host of several NUMA nodes: "local", bound to its GPU's
# node (a topology-aware scheduler, numactl); "spread", not bound, the kernel runs it on
# every node about evenly and its pinned buffers land where first touched; "remote", bound
# to another node. Off its GPU's node, a pinned copy crosses the inter-socket link (UPI or
# Infinity Fabric: the GPU's DMA reads remote memory at roughly 60-70 % of the local rate
# on two-socket servers) and host work reads remote memory: (DMA rate, host time) factors.
PLACEMENTS = {"local": (1.0, 1.0), "spread": (0.82, 1.06), "remote": (0.62, 1.15)}


# --- processes ----------------------------------------------------------------------------
@dataclass
class Proc:
    """A process the probes see: ``gpus`` it computes on, ``opened`` the GPU device minors
    it holds (CUDA opens every /dev/nvidiaN it may: all of them on a bare-metal host)."""

    key: ProcessKey
    comm: str
    cmdline: str
    gpus: list[int]
    opened: list[int]
    threads: int
    trace: Trace | None = None
    workers: int = 0
    worker_threads: int = 0
    worker_keys: list[ProcessKey] = field(default_factory=list)
    monitor_cpu: float = 0.0          # a monitor's own CPU (cores)
    monitor_calls: float = 0.0        # its RM controls per second (polling)
    rm_control: float = 0.4           # a compute process's housekeeping controls per second
    uprobes: bool = False
    since: float = 0.0                # seen from this second of the capture
    exe: str = "/usr/bin/python3"
    ppid: int = 1
    uid: int = 1000
    cgroup: str = ""
    placement: str = "local"
    instance: str = ""                # the MIG GPU instance it runs in ("" the whole GPU)
    # the variables of probes.environment it has set, in its sightings (its workers inherit)
    env: dict[str, str] = field(default_factory=dict)


# --- jobs ---------------------------------------------------------------------------------
@dataclass
class Training:
    """A data-parallel training job: one rank per GPU in ``gpus``.

    Per step each rank gets its batch (from ``workers`` DataLoader workers, each needing
    ``worker_cpu_s`` of CPU and ``worker_io_s`` of reading per batch; in the main process
    when ``workers`` is 0), copies ``h2d_bytes`` (pinned: asynchronous; pageable: staged by
    the main thread at ``pageable_Bps``), launches for ``host_s`` while the GPU computes
    ``gpu_s`` (after the copy: stream order), then the ranks all-reduce ``comm_bytes`` over
    ``link`` (``overlap`` of it hidden under backward) and the main thread waits for the step
    (CUDA's default sync spins on the CPU); ``serial_s`` is host work between syncs during
    which the GPU has nothing queued. ``speed`` gives a rank's clock share at a time
    (throttling, time-slicing); ``hang`` stops a rank's steps at a time, the process alive,
    its main thread asleep (``sleep``: a lock), in the driver (``blocked``) or spinning in a
    synchronisation on a kernel that never ends (``spin``: a few blocks polling a flag, the
    look of NCCL's kernels). ``offload_bytes``: ZeRO-Offload, the optimizer on the CPU:
    the gradients go to the host as backward makes them, then the main process's threads
    run the optimizer for ``cpu_step_s`` (on ``cpu_step_cores``) and the parameters come
    back (``offload_bytes`` each way), the GPU idle meanwhile."""

    gpus: list[int]
    gpu_s: float
    host_s: float = 0.02
    serial_s: float = 0.0
    mix: Mix = LLM_TRAIN
    workers: int = 8
    worker_cpu_s: float = 0.5
    worker_io_s: float = 0.0
    io_wait: str = "disk"             # disk: D state; net: interruptible sleep on sockets
    batch_bytes: float = 0.0          # what a batch's reading fetches (received, when net)
    worker_threads: int = 1
    cores: float | Callable[[float], float] = 0.0   # CPUs a rank's workers get (0: enough)
    prefetch: int = 2
    h2d_bytes: float = 50e6
    pageable: bool = False
    pageable_Bps: float = 9e9
    comm_bytes: float = 0.0
    link: str = "nvlink"              # nvlink, pcie (P2P over the switch), shm (via host)
    overlap: float = 0.8
    kernels: int = 600                # kernel launches per step
    syncs: int = 2                    # host syncs per step (.item(), GradScaler)
    allocs: float = 0.0               # cudaMalloc+cudaFree per step (caching allocator hits: 0)
    uvm_migrate: float = 0.0          # UVM_MIGRATE ioctls per step (cudaMemPrefetchAsync)
    fb_mib: float = 60000.0
    ckpt_every_s: float = 0.0
    ckpt_first_s: float = 0.0
    ckpt_bytes: float = 0.0           # per rank that writes
    ckpt_write_Bps: float = 1.5e9
    ckpt_ranks: str = "first"         # first (rank 0 writes) or all (sharded)
    crash: dict[int, tuple[float, int | None, int | None]] = field(default_factory=dict)
    hang: dict[int, tuple[float, str]] = field(default_factory=dict)
    stop_s: float = math.inf          # the job finishes (exit 0) at this second
    nccl_timeout_s: float = 600.0
    offload_bytes: float = 0.0
    cpu_step_s: float = 0.0
    cpu_step_cores: float = 16.0
    speed: Callable[[int, float], float] = lambda rank, t: 1.0
    step_jitter: float = 0.03
    threads: int = 48
    cmdline: str = "/usr/bin/python3 -u train.py"
    visible: str = "own"              # own: only its GPU's node (container); all: every node
    uprobes: bool = False
    rm_control: float = 0.4
    comm: str = "python3"
    exe: str = "/usr/bin/python3"
    placement: str = "local"          # NUMA (several nodes): see PLACEMENTS


@dataclass
class Inference:
    """A serving process on ``gpus`` (tensor parallel when more than one): requests arrive
    at ``rate(t)`` per second; continuous batching keeps the GPU busy while any is in flight,
    each iteration costing ``iter_s`` plus ``per_seq_s`` per sequence."""

    gpus: list[int]
    rate: Callable[[float], float]
    tokens: float = 220.0             # decoded tokens per request (mean)
    iter_s: float = 0.018
    per_seq_s: float = 0.00012
    sched_gap_s: float = 0.003        # CPU scheduling between iterations: GPU idle
    mix: Mix = LLM_DECODE
    fb_mib: float = 72000.0
    threads: int = 90
    cmdline: str = "/usr/bin/python3 -m vllm.entrypoints.openai.api_server --model " \
                   "/models/llama-3-8b-instruct"
    comm: str = "python3"
    exe: str = "/usr/bin/python3"
    comm_bytes_per_iter: float = 8e6
    visible: str = "own"
    rm_control: float = 0.4
    # The engine's own bookkeeping, simulated when ``kv_tokens`` is set (0: not, and no
    # engine metrics): the KV cache holds ``kv_tokens`` tokens; a request holds its prompt
    # (``prompt_tokens``, mean) and what it generated so far; one that no longer fits is
    # preempted (vLLM's recompute mode: freed, put back at the head of the queue, its prompt
    # and tokens computed again when readmitted). Prefill costs ``prefill_s_per_token``.
    # The engines source's scrapes (every ENGINE_SCRAPE_S) are then in the capture.
    kv_tokens: float = 0.0
    prompt_tokens: float = 0.0
    prefill_s_per_token: float = 0.0
    max_seqs: int = 256
    # Chunked prefill: the tokens one step computes at most, decodes first, prompts in the
    # rest (vLLM's --max-num-batched-tokens with chunked prefill on); 0: off, a step takes
    # every admitted prompt whole and the running requests' next token waits for it.
    chunk_tokens: int = 0
    # The engine loop's CPU work per step for each running request (scheduling, sampling,
    # output processing in Python), on its main thread while the GPU waits.
    cpu_s_per_seq: float = 0.0
    # The frontend (HTTP, tokenisation, detokenisation) on one thread: CPU seconds per
    # request and per generated token; a request reaches the engine's queue only once the
    # frontend has handled it (0: not simulated). ``frontend_in``: "own", a thread of the
    # engine's process other than its main one; "workers", a child process of it (Triton's
    # Python pre/post-processing model instances, triton_python_backend_stub); "parent", a
    # process of the engine above it (vLLM V1's API server, EngineCore's parent: the sched
    # probe watches it as the GPU process's frontend).
    frontend_s: float = 0.0
    frontend_s_per_token: float = 0.0
    frontend_in: str = "own"
    # Where the engine's loop runs (simulated with ``kv_tokens``): "own", the main thread of
    # each GPU process; "between", a process between the engine and its GPU processes
    # (vLLM V1's EngineCore above its tensor-parallel workers, holding no GPU: the sched
    # probe watches it as the first GPU process's engine loop), each GPU process's main
    # thread then on a CPU only while its step runs (it prepares, launches and waits on
    # it). ``loop_wait``: the share of a core that loop takes while a step runs (1.0: it
    # spins waiting for the workers' outputs).
    loop_in: str = "own"
    loop_wait: float = 1.0
    workers: int = 0
    # Which engine's /metrics the scrapes are (engine_sample.engine), and so which values
    # it gives: Triton's only pending requests (of every model: its ensemble's pre- and
    # post-processing models' queues too), requests/s and the mean queue time; its
    # scheduling loop is TensorRT-LLM's C++ executor thread, not the main thread.
    engine: str = "vllm"
    # Closed-loop clients (a benchmark such as Apache bench or benchmark_serving with a
    # fixed concurrency): this many requests in flight, each followed at once by the next
    # when it ends; ``rate`` is then unused. 0: open-loop arrivals at ``rate``.
    concurrency: int = 0
    # The GPU's speed by second (1.0: full clocks, alone on the GPU): a step's GPU time
    # is divided by it (clocks throttled, or another process time-slicing the GPU).
    gpu_speed: Callable[[float], float] | None = None


@dataclass
class Holder:
    """A process that holds ``fb_mib`` on its GPU and launches nothing (a notebook between
    cells, a job stuck on a lock): its threads sleep; ``cpu`` cores of background work."""

    gpu: int
    fb_mib: float
    threads: int = 24
    cpu: float = 0.01
    cmdline: str = "/opt/conda/bin/python -m ipykernel_launcher -f " \
                   "/home/ana/.local/share/jupyter/runtime/kernel-5d1c.json"
    comm: str = "python"
    exe: str = "/opt/conda/bin/python"
    workers: int = 0
    stop_s: float = math.inf
    exit_code: int | None = 0


@dataclass
class Steady:
    """A process running one kernel mix without pause (a compiled solver, a benchmark):
    busy ``busy`` of the time, its main thread spinning in cudaDeviceSynchronize."""

    gpu: int
    mix: Mix
    busy: float | Callable[[float], float] = 0.99
    fb_mib: float = 30000.0
    threads: int = 6
    cmdline: str = "./lbm3d --grid 1024 --steps 2000000"
    comm: str = "lbm3d"
    exe: str = "/opt/lbm/bin/lbm3d"
    rx_Bps: float = 2e7
    tx_Bps: float = 2e7
    launches_per_s: float = 900.0
    uvm_migrate: float = 0.0
    rm_alloc: float = 0.0


# --- MIG ----------------------------------------------------------------------------------
MIG_SLICES = 7   # compute slices of an A100 or H100 in MIG mode


@dataclass(frozen=True)
class MigInstance:
    """A MIG GPU instance: its id as DCGM reports it (GPU_I_ID), its profile, its share of
    the GPU's compute slices and its memory. Its jobs run on ``slices`` of 7 of the SMs;
    DCGM's profiling ratios are the instance's own (of its SMs, its time)."""

    gi: str
    profile: str
    slices: int
    fb_mib: float


# --- conditions on GPUs -------------------------------------------------------------------
@dataclass
class GpuCondition:
    """What the board's environment does to it: ``power_limit`` (W, by second),
    ``r_factor`` (thermal resistance × the board's, by second), ``brake`` (seconds with a
    HW slowdown or power brake: the bit and a clock share), ``app_clock`` (MHz cap with the
    APP_CLOCKS reason), counters' rates, and when profiling fields are absent."""

    power_limit: Callable[[float], float] | None = None
    r_factor: Callable[[float], float] = lambda t: 1.0
    brake: Callable[[float], tuple[int, float] | None] = lambda t: None
    app_clock: float | Callable[[float], float | None] | None = None   # MHz, or by second
    replays_per_s: Callable[[float], float] = lambda t: 0.0
    sbe_per_s: Callable[[float], float] = lambda t: 0.0
    dbe_at: list[float] = field(default_factory=list)
    remapped: tuple[int, int] = (0, 0)          # correctable, uncorrectable rows
    remap_failed_at: float | None = None
    lost_at: float | None = None                # falls off the bus: no samples after
    profiling_off: Callable[[float], bool] = lambda t: False
    inlet_c: float | None = None
    # the PCIe link as it trained (generation, lanes): a marginal riser or a slot wired x8;
    # None: the board's generation, x16. Idle, any link drops to Gen1 (ASPM).
    pcie_link: tuple[int, int] | None = None
    nvlink_crc_per_s: Callable[[float], float] = lambda t: 0.0     # all links, flit + data
    nvlink_replay_per_s: Callable[[float], float] = lambda t: 0.0
    nvlink_recovery_at: list[float] = field(default_factory=list)  # a link retrained
    # the NVLink fabric's state (gpufields.FABRIC_STATES) by second; None: the board's.
    # Its health summary only where given: the corpus hosts' R550 driver reports none.
    fabric_state: Callable[[float], int] | None = None
    fabric_health: Callable[[float], int] | None = None


# --- the host -----------------------------------------------------------------------------
class Host:
    """``gpus`` boards of one model on a host, ``duration_s`` seconds of capture, a GPU
    source (``dcgm``: profiling fields; ``nvml``: basic fields and compute processes)."""

    def __init__(self, seed: int, board: Board, gpus: int, duration_s: int,
                 source: str = "dcgm", hostname: str = "gpu-node-07", numa_nodes: int = 1):
        self.seed = seed
        self.numa_nodes = numa_nodes     # GPUs split evenly over them, in bus order
        self.board = board
        self.count = gpus
        self.n = duration_s
        self.source = source
        self.hostname = hostname
        self.t0 = EPOCH_NS + (seed % 5000) * 3600 * NS
        self.rng = random.Random(f"host:{seed}")
        self.uptime_s = self.rng.uniform(3, 40) * 86400
        self.conditions = [GpuCondition() for _ in range(gpus)]
        self.procs: list[Proc] = []
        self.extra: list[tuple[float, str, Event]] = []
        self._pids: set[int] = set()
        self._cursor = self.rng.randrange(10**6, 10**7)
        self.boot_id = f"{self.rng.getrandbits(128):032x}"
        ids = random.Random(f"uuids:{seed}")
        self.uuids = [f"GPU-{ids.getrandbits(32):08x}-{ids.getrandbits(16):04x}-"
                      f"{0x4000 | ids.getrandbits(12):04x}-{0x8000 | ids.getrandbits(14):04x}-"
                      f"{ids.getrandbits(48):012x}" for _ in range(gpus)]
        buses = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb]
        self.pcis = [f"0000:{buses[i % 8] + 0x100 * (i // 8):02x}:00.0" for i in range(gpus)]
        self.inlet = [self.rng.uniform(24.0, 29.0) for _ in range(gpus)]
        self.driver = "550.90.07"
        # GPUs in MIG mode: their instances. Such a GPU reports no whole-GPU rows (DCGM has
        # no GPU_UTIL there): every field comes on each instance's row, the device's
        # (clocks, power, temperature) repeated, activity and memory the instance's own.
        self.mig: dict[int, list[MigInstance]] = {}

    # Identities.
    def pid(self) -> int:
        while True:
            pid = self.rng.randrange(2000, 4_000_000)
            if pid not in self._pids:
                self._pids.add(pid)
                return pid

    def key(self, age_s: float) -> ProcessKey:
        """A new process key for a process started ``age_s`` before the capture."""
        return ProcessKey(self.pid(), int((self.uptime_s - age_s) * TICKS))

    def klog(self, t: float, line: str) -> None:
        """A kernel-log line at second ``t``, read as the klog source reads it."""
        from gpuwhy.probes.klog.parse import parse_line

        record = parse_line(line)
        if record is None:   # not an NVIDIA line the parser knows: the source skips it
            return
        self._cursor += 1 + self.rng.randrange(40)
        facts = {f: getattr(record, f) for f in KernelLogFacts.__dataclass_fields__}
        facts["details"] = dict(record.details)
        event = KernelLogRecord(
            ts=0, raw_ts=int((self.uptime_s + t) * NS), cursor=f"s=0;i={self._cursor:x}",
            origin="journald", boot_id=self.boot_id, record_kind=record.kind, line=line,
            **facts)
        self.extra.append((t, "klog", event))

    def cron(self, t: float, command: str, user: str = "root",
             gpu_action: str | None = None) -> int:
        """cron starts ``command`` at ``t`` (CMD line); returns the job shell's pid."""
        shell = self.pid()
        self._cursor += 1
        self.extra.append((t, "cron", CronExecution(
            ts=0, cursor=f"s=1;i={self._cursor:x}", phase="started", user=user,
            command=command, job_pid=shell, cron_pid=shell - 1, gpu_action=gpu_action,
            boot_id=self.boot_id)))
        return shell

    def command(self, t: float, cmdline: str, ppid: int = 1, uid: int = 0,
                exit_code: int = 0, lasts_s: float = 0.9) -> ProcessKey:
        """A short command run at ``t`` (seen, exec'd; it exits ``lasts_s`` later)."""
        return self._short_lived(self.pid(), t, cmdline, ppid, uid, exit_code, lasts_s)

    def _short_lived(self, pid: int, t: float, cmdline: str, ppid: int, uid: int,
                     exit_code: int, lasts_s: float) -> ProcessKey:
        key = ProcessKey(pid, int((self.uptime_s + t) * TICKS))
        exe = "/usr/bin/" + cmdline.split()[0].rsplit("/", 1)[-1]
        comm = exe.rsplit("/", 1)[-1][:15]
        self.extra += [(t, "probes", ProcessSeen(ts=0, process=key, comm=comm, cmdline=cmdline,
                                                 exe=exe, ppid=ppid, uid=uid)),
                       (t + 0.001, "probes", ProcessExec(ts=0, process=key, filename=exe,
                                                         ppid=ppid)),
                       (t + lasts_s, "probes", ProcessExited(ts=0, process=key,
                                                             exit_code=exit_code))]
        return key

    # What a GPU node runs besides its jobs, all day: an orchestrator's exec probes, a
    # metrics script that asks nvidia-smi, a textfile collector, a service check that is
    # sometimes refused. (command, seconds apart, exit codes and how often each, opens GPUs)
    CHATTER = (
        ("/bin/sh -c /usr/local/bin/node-health.sh", 10.0, ((0, 1.0),), False),
        ("nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader",
         30.0, ((0, 1.0),), True),
        ("/usr/local/bin/smartmon.sh", 60.0, ((0, 1.0),), False),
        ("curl -sf http://127.0.0.1:9400/metrics -o /dev/null", 15.0, ((0, 0.9), (7, 0.1)),
         False),
        ("systemctl is-active --quiet nvidia-dcgm-exporter", 20.0, ((0, 0.8), (3, 0.2)),
         False),
    )

    def chatter(self) -> None:
        """The host's own short-lived processes over the whole capture (``CHATTER``), one in
        ten of some failing; nvidia-smi's queries open every GPU's device file, as the real
        one does. Drawn from their own random stream: the jobs' draws stay the same."""
        rng = random.Random(f"chatter:{self.seed}")
        for cmdline, every_s, exits, opens in self.CHATTER:
            t = rng.uniform(0, every_s)
            while t < self.n - 1:
                pid = rng.randrange(2000, 4_000_000)
                if pid in self._pids:
                    continue
                self._pids.add(pid)
                code = rng.choices([c for c, _ in exits], [w for _, w in exits])[0]
                key = self._short_lived(pid, t, cmdline, 1, 0, code, rng.uniform(0.02, 0.4))
                if opens:
                    self.extra += [(t + 0.01 + 0.001 * g, "probes", DeviceOpened(
                        ts=0, process=key, fd=3 + g, path=f"/dev/nvidia{g}", device="nvidiaN",
                        minor=g)) for g in range(self.count)]
                t += every_s * rng.uniform(0.97, 1.03)

    def monitors(self, hostengine: bool | None = None) -> None:
        """nvidia-persistenced, and nv-hostengine under a DCGM source: both hold every GPU."""
        every = list(range(self.count))
        self.procs.append(Proc(self.key(self.uptime_s - 30), "nvidia-persiste",
                               "/usr/bin/nvidia-persistenced --user nvidia-persistenced",
                               [], every, 1, exe="/usr/bin/nvidia-persistenced", uid=110,
                               monitor_cpu=0.0005, monitor_calls=0.0))
        if hostengine if hostengine is not None else self.source == "dcgm":
            self.procs.append(Proc(self.key(self.uptime_s - 60), "nv-hostengine",
                                   "/usr/bin/nv-hostengine -n --service-account nvidia-dcgm",
                                   [], every, 18, exe="/usr/bin/nv-hostengine", uid=0,
                                   monitor_cpu=0.03 * self.count, monitor_calls=12 * self.count))

    # Jobs.
    def pcie_Bps_of(self, gpu: int) -> float:
        """What GPU ``gpu``'s PCIe link carries per direction, as it trained."""
        link = self.conditions[gpu].pcie_link
        return self.board.pcie_Bps if link is None else pcie_link_Bps(*link)

    def gpu_node(self, gpu: int) -> int | None:
        """The NUMA node GPU ``gpu`` is attached to (None on a host of one node)."""
        return gpu * self.numa_nodes // self.count if self.numa_nodes > 1 else None

    def placed(self, placement: str) -> tuple[float, float]:
        """(DMA rate, host time) factors of a job's placement (PLACEMENTS) on this host."""
        return PLACEMENTS[placement] if self.numa_nodes > 1 else (1.0, 1.0)

    def add(self, job: Training | Inference | Holder | Steady, age_s: float = 3600.0,
            seed: str = "", instance: str = "") -> list[Proc]:
        """Start ``job`` ``age_s`` before the capture; ``instance``: the MIG instance of its
        GPU it runs in."""
        rng = random.Random(f"job:{self.seed}:{len(self.procs)}:{seed}")
        if isinstance(job, Training):
            traces = simulate_training(job, self, rng)
            gpus = job.gpus
        elif isinstance(job, Inference):
            traces = simulate_inference(job, self, rng)
            gpus = job.gpus
        elif isinstance(job, Holder):
            traces = [simulate_holder(job, self)]
            gpus = [job.gpu]
        else:
            traces = [simulate_steady(job, self, rng)]
            gpus = [job.gpu]
        launcher = self.pid()
        made = []
        for rank, (gpu, trace) in enumerate(zip(gpus, traces, strict=True)):
            visible = getattr(job, "visible", "own")
            opened = list(range(self.count)) if visible == "all" else \
                (list(job.gpus) if isinstance(job, Inference) else [gpu])
            workers = getattr(job, "workers", 0)
            proc = Proc(self.key(age_s), job.comm[:15], job.cmdline, [gpu], opened,
                        job.threads + 2 * workers, trace, workers=workers,
                        worker_threads=getattr(job, "worker_threads", 1), exe=job.exe,
                        ppid=launcher, uprobes=getattr(job, "uprobes", False),
                        rm_control=getattr(job, "rm_control", 0.4),
                        cgroup=f"/system.slice/job-{self.seed}-{rank}.scope",
                        placement=getattr(job, "placement", "local"), instance=instance)
            proc.worker_keys = [self.key(age_s - 5) for _ in range(workers)]
            self.procs.append(proc)
            made.append(proc)
        scrapes = getattr(traces[0], "engine", None) if traces else None
        if scrapes:
            # the server process (rank 0) serves /metrics; every rank holds a GPU
            for t, values in scrapes:
                self.extra.append((t, "engines", EngineSample(
                    ts=0, engine=getattr(job, "engine", "vllm"),
                    endpoint="http://127.0.0.1:8000/metrics",
                    process=made[0].key, version="v1",
                    processes=[p.key for p in made], gpu_ids=[self.uuids[g] for g in gpus],
                    values=values)))
        return made

    # Events.
    def events(self) -> list[tuple[str, Event]]:
        """(source name, event) of the whole capture, in time order."""
        out: list[tuple[float, int, str, Event]] = []
        order = 0

        def emit(t: float, src: str, event: Event) -> None:
            nonlocal order
            out.append((t, order, src, event))
            order += 1

        for g in range(self.count):
            emit(0.0, "gpu", GpuSeen(ts=0, gpu_id=self.uuids[g], source=self.source,
                                     simulated=False, uuid=self.uuids[g], index=g, minor=g,
                                     pci_bus_id=self.pcis[g], model=self.board.model,
                                     driver_version=self.driver, numa_node=self.gpu_node(g)))
        for proc in self.procs:
            self._process_start(proc, emit)
        self._samples(emit)
        self._process_seconds(emit)
        for t, src, event in self.extra:
            emit(t, src, event)
        out.sort(key=lambda item: (item[0], item[1]))
        return [(src, replace(event, ts=self.t0 + int(round(t * NS))) if not isinstance(
            event, ProcessSeen) else self._seen(event, t)) for t, _, src, event in out]

    def _seen(self, event: ProcessSeen, t: float) -> ProcessSeen:
        """A process's sighting at capture second ``t``, with when it started (its key's
        start time, ticks since this host's boot, as realtime)."""
        started = self.t0 + int(round((event.process.start_time / TICKS - self.uptime_s) * NS))
        return replace(event, ts=self.t0 + int(round(t * NS)), started_at=started)

    def _process_start(self, proc: Proc, emit: Callable) -> None:
        t = proc.since + 0.2
        emit(t, "probes", ProcessSeen(ts=0, process=proc.key, comm=proc.comm,
                                      cmdline=proc.cmdline, exe=proc.exe, ppid=proc.ppid,
                                      uid=proc.uid, cgroup=proc.cgroup, env=proc.env))
        fds = [("/dev/nvidiactl", "nvidiactl", None)]
        if proc.trace is not None:
            fds.append(("/dev/nvidia-uvm", "nvidia-uvm", None))
        fds += [(f"/dev/nvidia{m}", "nvidiaN", m) for m in proc.opened]
        for fd, (path, device, minor) in enumerate(fds, 3):
            emit(t, "probes", DeviceOpened(ts=0, process=proc.key, fd=fd, path=path,
                                           device=device, minor=minor, how="scan"))
        for worker in proc.worker_keys:
            emit(t, "probes", ProcessSeen(ts=0, process=worker, comm="pt_data_worker",
                                          cmdline=proc.cmdline, exe=proc.exe,
                                          ppid=proc.key.pid, uid=proc.uid, cgroup=proc.cgroup,
                                          env=proc.env))
            for fd, (path, device, minor) in enumerate(fds, 3):
                emit(t, "probes", DeviceOpened(ts=0, process=worker, fd=fd, path=path,
                                               device=device, minor=minor, how="fork"))

    def _gpu_load(self, g: int, k: int, instance: str | None = None) -> dict:
        """What ran on GPU ``g`` in second ``k``: busy shares, pipe activity, traffic, memory
        (with ``instance``: what ran in that MIG instance, as shares of its own SMs)."""
        load = {"busy": 0.0, "util": 0.0, "sm": 0.0, "occ": 0.0, "tensor": 0.0, "dram": 0.0,
                "fp32": 0.0, "fp16": 0.0, "fp64": 0.0, "rx": 0.0, "tx": 0.0, "nvl": 0.0,
                "fb": 0.0, "contexts": 0, "demand": 0.0}
        for proc in self.procs:
            tr = proc.trace
            if tr is None or g not in proc.gpus or k >= tr.n or \
                    (instance is not None and proc.instance != instance):
                continue
            if k < tr.end:
                load["contexts"] += 1
                load["fb"] += tr.fb_mib(k) + 480.0          # + the CUDA context
            mix = tr.mix or LLM_TRAIN
            compute, nccl = tr.compute.v[k], tr.nccl.v[k]
            load["busy"] += compute + nccl
            load["util"] += tr.util.v[k] * 6
            for name in ("sm", "tensor", "dram", "fp32", "fp16", "fp64"):
                load[name] += compute * getattr(mix, name) + nccl * getattr(NCCL_MIX, name)
            load["occ"] += compute * mix.sm * mix.occ + nccl * NCCL_MIX.sm * NCCL_MIX.occ
            load["demand"] += compute * mix.demand() + nccl * NCCL_MIX.demand()
            load["rx"] += tr.rx.v[k]
            load["tx"] += tr.tx.v[k]
            load["nvl"] += tr.nvl.v[k]
        if load["busy"] > 1.0:   # contexts time-slice the GPU: each ran part of the time
            share = 1.0 / load["busy"]
            for name in ("busy", "sm", "occ", "tensor", "dram", "fp32", "fp16", "fp64",
                         "demand"):
                load[name] *= share
        load["util"] = min(1.0, load["util"])
        return load

    def _samples(self, emit: Callable) -> None:
        b = self.board
        for g in range(self.count):
            rng = random.Random(f"gpu:{self.seed}:{g}")
            links = random.Random(f"links:{self.seed}:{g}")   # apart: the rest stays as seeded
            mig_rng = random.Random(f"mig:{self.seed}:{g}")
            cond = self.conditions[g]
            inlet = cond.inlet_c if cond.inlet_c is not None else self.inlet[g]
            first = self._gpu_load(g, 0)
            temp = inlet + b.r_th * cond.r_factor(0) * (b.ctx_w + b.dyn_w * first["demand"])
            energy = rng.uniform(2e11, 9e11)
            counters = {"power_violation_ns": rng.uniform(0, 4e12), "thermal_violation_ns": 0.0,
                        "pcie_replays": float(rng.randrange(0, 4)),
                        "ecc_sbe_volatile": float(rng.randrange(0, 3)), "ecc_dbe_volatile": 0.0,
                        # a few since the driver loaded, as healthy links show
                        "nvlink_crc_flit_errors": float(links.randrange(0, 12)),
                        "nvlink_crc_data_errors": float(links.randrange(0, 3)),
                        "nvlink_replay_errors": 0.0, "nvlink_recovery_errors": 0.0}
            gen, lanes = cond.pcie_link or (b.pcie_gen, 16)
            thermal_share = 1.0
            for k in range(self.n):
                t = k + 1.0
                if cond.lost_at is not None and t >= cond.lost_at:
                    if t - 1.0 < cond.lost_at:
                        emit(cond.lost_at + 0.3, "gpu", GpuState(
                            ts=0, gpu_id=self.uuids[g], state="lost", source=self.source,
                            simulated=False, detail="NVML: GPU is lost"))
                    continue
                parts = {i.gi: self._gpu_load(g, k, i.gi) for i in self.mig.get(g, ())}
                load = _mig_whole(parts, self.mig[g]) if parts else self._gpu_load(g, k)
                busy = load["busy"]
                active = busy > 0.004
                limit = cond.power_limit(t) if cond.power_limit else b.tdp_w
                r_th = b.r_th * cond.r_factor(t)
                reasons = 0
                # The clock: power governor (fast), thermal governor (slow), brakes, locks.
                activity = load["demand"] / busy if busy else 0.0
                demand_w = b.ctx_w + b.dyn_w * activity
                speed = 1.0
                if active and demand_w > limit:
                    speed = max(0.3, ((limit - b.ctx_w) / (demand_w - b.ctx_w)) ** (1 / 2.2))
                    reasons |= SW_POWER_CAP
                if temp > b.t_slow:
                    thermal_share = max(0.3, thermal_share - 0.025 * (temp - b.t_slow + 0.5))
                elif temp < b.t_slow - 1.5:
                    thermal_share = min(1.0, thermal_share + 0.01)
                if thermal_share < 0.999 and thermal_share < speed:
                    speed = thermal_share
                    reasons |= SW_THERMAL
                if temp > b.t_hw:
                    speed = min(speed, 0.5)
                    reasons |= HW_THERMAL
                braked = cond.brake(t)
                if braked is not None and active:
                    bit, share = braked
                    speed = min(speed, share)
                    reasons |= bit
                app_clock = cond.app_clock(t) if callable(cond.app_clock) else cond.app_clock
                if app_clock is not None and app_clock < b.clk_max * speed:
                    speed = app_clock / b.clk_max
                    reasons |= APP_CLOCKS
                if active:
                    clock = round(b.clk_max * speed / 15) * 15
                else:
                    clock = b.clk_idle if app_clock is None else app_clock
                    reasons |= IDLE_BIT
                    reasons &= ~SW_POWER_CAP
                base_w = b.ctx_w if load["contexts"] else b.idle_w
                power = base_w + b.dyn_w * load["demand"] * (clock / b.clk_max) ** 2.2
                if not active:
                    power = (b.idle_w + (b.ctx_w - b.idle_w) * 0.3 * bool(load["contexts"]))
                power = min(limit, power) * rng.uniform(0.985, 1.015)
                steady = inlet + r_th * power
                temp += (steady - temp) * (1 - math.exp(-1.0 / b.tau_s)) + rng.gauss(0, 0.15)
                energy += power * 1000.0
                if reasons & SW_POWER_CAP:
                    counters["power_violation_ns"] += 1e9
                if reasons & (SW_THERMAL | HW_THERMAL):
                    counters["thermal_violation_ns"] += 1e9
                counters["pcie_replays"] += _poisson(rng, cond.replays_per_s(t))
                crc = _poisson(links, cond.nvlink_crc_per_s(t))
                flit = sum(links.random() < 0.9 for _ in range(int(crc)))
                counters["nvlink_crc_flit_errors"] += flit
                counters["nvlink_crc_data_errors"] += crc - flit
                counters["nvlink_replay_errors"] += _poisson(links, cond.nvlink_replay_per_s(t))
                counters["nvlink_recovery_errors"] += sum(
                    1 for r in cond.nvlink_recovery_at if k < r <= t)
                counters["ecc_sbe_volatile"] += _poisson(rng, cond.sbe_per_s(t))
                counters["ecc_dbe_volatile"] += sum(1 for d in cond.dbe_at if k < d <= t)
                util = min(100.0, round(100 * min(1.0, load["util"]
                                                  + (0.01 if busy > 0.5 else 0.0))))
                fields = {
                    "gpu_util": float(util),
                    "mem_util": float(round(min(100.0, 100 * load["dram"] * 0.9
                                                * rng.uniform(0.95, 1.05)))),
                    "enc_util": 0.0, "dec_util": 0.0,
                    "sm_clock_mhz": float(clock), "mem_clock_mhz": float(b.mem_clock),
                    "clocks_event_reasons": float(reasons),
                    "pstate": 0.0 if (active or load["contexts"]) else 8.0,
                    "temp_c": float(round(temp)),
                    "power_w": round(power, 2), "power_limit_w": float(limit),
                    "energy_mj": round(energy), "fb_total_mib": b.fb_mib,
                    "fb_used_mib": float(round(min(b.fb_mib, load["fb"]))
                                         if load["contexts"] else rng.choice((0, 1))),
                    "pcie_replays": counters["pcie_replays"],
                    "ecc_sbe_volatile": counters["ecc_sbe_volatile"],
                    "ecc_dbe_volatile": counters["ecc_dbe_volatile"],
                    "row_remap_correctable": float(cond.remapped[0]),
                    "row_remap_uncorrectable": float(cond.remapped[1]),
                    "row_remap_failed": float(cond.remap_failed_at is not None
                                              and t >= cond.remap_failed_at),
                    # at work the link runs as it trained; idle it drops to Gen1 (ASPM)
                    "pcie_link_gen": float(gen if active or load["contexts"] else 1),
                    "pcie_link_width": float(lanes),
                    "pcie_link_gen_max": float(b.pcie_gen), "pcie_link_width_max": 16.0,
                    "fabric_state": float(cond.fabric_state(t) if cond.fabric_state else
                                          FABRIC_SUCCESS if b.fabric else FABRIC_NOT_SUPPORTED),
                }
                if cond.fabric_health is not None:
                    fields["fabric_health"] = float(cond.fabric_health(t))
                if b.nvlink_Bps:
                    for name in ("nvlink_crc_flit_errors", "nvlink_crc_data_errors",
                                 "nvlink_replay_errors", "nvlink_recovery_errors"):
                        fields[name] = counters[name]
                rx = (load["rx"] + rng.uniform(2e6, 6e6)) * DCGM_PCIE_OVERHEAD
                tx = (load["tx"] + rng.uniform(1e6, 4e6)) * DCGM_PCIE_OVERHEAD
                if self.source == "nvml":
                    # a 20 ms sample of the link, in KB/s
                    fields["pcie_rx_bytes_per_s"] = round(rx * rng.uniform(0.7, 1.3), -3)
                    fields["pcie_tx_bytes_per_s"] = round(tx * rng.uniform(0.7, 1.3), -3)
                elif not cond.profiling_off(t):
                    fields.update({
                        **_profiling(rng, busy, load),
                        "pcie_rx_bytes_per_s": round(rx),
                        "pcie_tx_bytes_per_s": round(tx),
                        "nvlink_rx_bytes_per_s": round(load["nvl"] * rng.uniform(0.98, 1.02)),
                        "nvlink_tx_bytes_per_s": round(load["nvl"] * rng.uniform(0.98, 1.02)),
                    })
                if self.source == "dcgm":
                    fields["mem_temp_c"] = float(round(temp + 3 + 8 * load["dram"]))
                    fields["power_violation_ns"] = counters["power_violation_ns"]
                    fields["thermal_violation_ns"] = counters["thermal_violation_ns"]
                ts = t + rng.uniform(0.001, 0.004)
                if parts:
                    for inst in self.mig[g]:
                        emit(ts, "gpu", GpuSample(
                            ts=0, gpu_id=self.uuids[g], source=self.source, simulated=False,
                            fields=_instance_fields(fields, parts[inst.gi], inst, mig_rng),
                            instance=inst.gi, labels={"mig_profile": inst.profile}))
                    continue
                emit(ts, "gpu", GpuSample(ts=0, gpu_id=self.uuids[g], source=self.source,
                                          simulated=False, fields=fields))
                if self.source == "nvml":
                    emit(ts + 0.0005, "gpu", GpuProcesses(
                        ts=0, gpu_id=self.uuids[g], source="nvml",
                        processes=self._nvml_processes(g, k, rng)))

    def _nvml_processes(self, g: int, k: int, rng: random.Random) -> list[dict]:
        rows = []
        for proc in self.procs:
            tr = proc.trace
            if tr is None or g not in proc.gpus or k >= tr.end or k < proc.since:
                continue
            busy = min(1.0, tr.compute.v[k] + tr.nccl.v[k])
            rows.append({"pid": proc.key.pid, "start_time": proc.key.start_time,
                         "used_memory_mib": round(tr.fb_mib(k) + 480.0),
                         "sm_util": round(100 * busy * rng.uniform(0.9, 1.0)),
                         "mem_util": round(100 * busy * 0.4), "enc_util": 0, "dec_util": 0})
        return rows

    def _process_seconds(self, emit: Callable) -> None:
        for proc in self.procs:
            rng = random.Random(f"proc:{self.seed}:{proc.key.pid}")
            tr = proc.trace
            totals = {"rm_alloc": rng.randrange(3000, 9000), "rm_free": rng.randrange(2000, 8000),
                      "rm_control": rng.randrange(40_000, 200_000),
                      "rm_map": rng.randrange(500, 3000), "uvm_migrate": 0}
            published: dict[str, tuple] = {}
            end = self.n if tr is None or tr.end >= self.n else math.ceil(tr.end)
            for k in range(int(proc.since), end):
                t = k + 1.0 + 0.5 + rng.uniform(0.0, 0.003)
                emit(t, "probes", self._sched(proc, k, rng))
                if tr is None:
                    totals["rm_control"] += _poisson(rng, proc.monitor_calls)
                else:
                    totals["rm_control"] += _poisson(rng, proc.rm_control)
                    for name in ("rm_alloc", "rm_free", "rm_map", "uvm"):
                        amount = getattr(tr, name).v[k]
                        totals["uvm_migrate" if name == "uvm" else name] += \
                            _poisson(rng, amount)
                for path, device, classes in (
                        ("/dev/nvidiactl", "nvidiactl", ("rm_alloc", "rm_free", "rm_control",
                                                        "rm_map")),
                        ("/dev/nvidia-uvm", "nvidia-uvm", ("uvm_migrate",))):
                    if device == "nvidia-uvm" and tr is None:
                        continue
                    snapshot = tuple(int(totals[c]) for c in classes)
                    if published.get(path) == snapshot:
                        continue   # fdtrack publishes a path's figures when they change
                    published[path] = snapshot
                    emit(t, "probes", DriverCallStats(
                        ts=0, process=proc.key, path=path, device=device,
                        ops=[_op(c, int(totals[c]), rng) for c in classes]))
                if tr is not None and proc.uprobes and k < tr.end:
                    stats = self._cuda(proc, k, rng)
                    if stats is not None:
                        emit(t, "probes", stats)
            if tr is not None and tr.end < self.n:
                t = tr.end + 0.05
                emit(t, "probes", ProcessExited(ts=0, process=proc.key, exit_code=tr.exit_code,
                                                signal=tr.signal))
                for worker in proc.worker_keys:
                    emit(t + 0.01, "probes", ProcessExited(ts=0, process=worker,
                                                           exit_code=None, signal=15))
                for fd, minor in enumerate(proc.opened, 5):
                    emit(t, "probes", DeviceClosed(ts=0, process=proc.key, fd=fd,
                                                   path=f"/dev/nvidia{minor}"))

    def _sched(self, proc: Proc, k: int, rng: random.Random) -> SchedStats:
        tr = proc.trace
        jitter = lambda x: max(0.0, x * rng.uniform(0.97, 1.03))   # noqa: E731
        if tr is None:
            on, blocked, runq = jitter(proc.monitor_cpu), 0.0, 0.00005
        else:
            on = jitter(tr.main_on.v[k] + tr.aux_on.v[k] + tr.front_on.v[k] + tr.loop_on.v[k]
                        + 0.03)
            blocked = tr.main_blocked.v[k]
            runq = jitter(0.004 + 0.01 * on)
        threads = proc.threads
        own = _state_ns(on, runq, blocked, threads, rng,
                        *((tr.main_net.v[k], tr.main_net_wait.v[k]) if tr is not None
                          else ()))
        workers = dict.fromkeys(own, 0)
        count = 0
        if tr is not None and proc.workers and k < tr.end:
            count = proc.workers
            w_threads = proc.workers * proc.worker_threads
            workers = _state_ns(tr.w_on.v[k], tr.w_runq.v[k] + 0.002 * count,
                                tr.w_blocked.v[k], w_threads, rng, tr.w_net.v[k],
                                tr.w_net_wait.v[k])
        # the main thread (one core at most); the busiest other one: a frontend's, or of
        # the helper threads (aux_on: runtime threads, a pin-memory thread)
        main, other = (min(1.0, proc.monitor_cpu), 0.0) if tr is None else \
            (min(1.0, tr.main_on.v[k]), min(1.0, max(tr.front_on.v[k], tr.aux_on.v[k],
                                                     tr.loop_on.v[k])))
        own["main_on_cpu_ns"], own["busiest_on_cpu_ns"] = int(main * NS), int(other * NS)
        workers["busiest_on_cpu_ns"] = int(NS * min(1.0, max(tr.w_on.v[k] / count,
                                                             tr.w_front.v[k]))) \
            if tr is not None and count else 0
        frontend = None
        if tr is not None and tr.p_front is not None and k < tr.end:
            # the API server's busiest thread (its asyncio loop) and its others (~3 %)
            busiest = min(1.0, jitter(tr.p_front.v[k] + 0.01))
            frontend = {"on_cpu_ns": int(NS * (busiest + jitter(0.03))),
                        "busiest_on_cpu_ns": int(NS * busiest), "threads": 24,
                        "processes": 1}
        engine_loop = None
        if tr is not None and tr.p_loop is not None and k < tr.end:
            # EngineCore's busiest thread (its busy loop) and its others (~5 %)
            busiest = min(1.0, jitter(tr.p_loop.v[k] + 0.01))
            engine_loop = {"on_cpu_ns": int(NS * (busiest + jitter(0.05))),
                           "busiest_on_cpu_ns": int(NS * busiest), "threads": 30,
                           "processes": 1}
        return SchedStats(ts=0, process=proc.key, interval_ns=NS, own=own, workers=workers,
                          worker_processes=count,
                          node_on_cpu_ns=self._nodes(proc, k, own["on_cpu_ns"]
                                                     + workers["on_cpu_ns"]),
                          frontend=frontend, engine_loop=engine_loop)

    def _nodes(self, proc: Proc, k: int, on_cpu_ns: int) -> list[int]:
        """The second's on-CPU ns per NUMA node as the placement puts them (a monitor is
        not bound: it runs where the kernel puts it)."""
        if self.numa_nodes < 2:
            return []
        home = self.gpu_node(proc.gpus[0]) if proc.gpus else None
        placement = proc.placement if home is not None else "spread"
        nodes = [0] * self.numa_nodes
        if placement == "spread":
            rng = random.Random(f"numa:{self.seed}:{proc.key.pid}:{k}")
            shares = [rng.uniform(0.6, 1.4) for _ in nodes]
            for node, share in enumerate(shares):
                nodes[node] = int(on_cpu_ns * share / sum(shares))
        else:
            node = home if placement == "local" else (home + 1) % self.numa_nodes
            nodes[node] = on_cpu_ns
        return nodes

    def _cuda(self, proc: Proc, k: int, rng: random.Random) -> CudaStats | None:
        tr = proc.trace
        launches = int(tr.launches.v[k])
        if not launches and not tr.syncs.v[k]:
            return None
        rx, tx, pageable = tr.rx.v[k], tr.tx.v[k], tr.pageable.v[k]
        copies = {d: {"count": 0, "bytes": 0, "ns": 0, "async_count": 0, "pinned_bytes": 0,
                      "pageable_bytes": 0} for d in ("htod", "dtoh", "dtod", "htoh", "unknown")}
        htod_pageable = min(rx, pageable)
        copies["htod"].update(count=max(1, int(rx / 8e6)), bytes=int(rx),
                              pageable_bytes=int(htod_pageable),
                              pinned_bytes=int(rx - htod_pageable),
                              async_count=0 if pageable else max(1, int(rx / 8e6)))
        copies["dtoh"].update(count=int(tr.syncs.v[k]), bytes=int(tx), pinned_bytes=int(tx))
        allocs = int(tr.allocs.v[k] / 2)
        memory = {"allocs": allocs, "alloc_bytes": allocs << 24, "frees": allocs,
                  "free_bytes": allocs << 24, "host_allocs": 0, "host_alloc_bytes": 0,
                  "host_frees": 0, "registers": 0, "register_bytes": 0}
        syncs = {"cudaStreamSynchronize": {"count": int(round(tr.syncs.v[k])),
                                           "blocked_ns": int(tr.sync_wait.v[k] * NS)}}
        return CudaStats(ts=0, process=proc.key, interval_ns=NS, calls=launches + 40,
                         errors=0, launches={"cudaLaunchKernel": launches}, grid_log2=[],
                         block_log2=[], graph_launches=0, copies=copies, syncs=syncs,
                         sync_log2=[], memory=memory, traced_since_start=False,
                         overhead_ns=int(launches * 180 * rng.uniform(0.9, 1.1)))


def _mig_whole(parts: dict[str, dict], instances: list[MigInstance]) -> dict:
    """The whole GPU's load from its MIG instances': activity weighted by each instance's
    share of the compute slices, traffic, memory and contexts added up."""
    whole = dict.fromkeys(next(iter(parts.values())), 0.0)
    for inst in instances:
        part, weight = parts[inst.gi], inst.slices / MIG_SLICES
        for name, value in part.items():
            whole[name] += value * weight if name in _ACTIVITY else value
    whole["contexts"] = int(whole["contexts"])
    return whole


_ACTIVITY = ("busy", "util", "sm", "occ", "tensor", "dram", "fp32", "fp16", "fp64", "demand")
# What DCGM does not report per MIG instance or in MIG mode at all: the whole-GPU
# utilisations, and NVLink (no P2P between instances).
_NOT_IN_MIG = ("gpu_util", "mem_util", "enc_util", "dec_util", "nvlink_rx_bytes_per_s",
               "nvlink_tx_bytes_per_s")


def _instance_fields(device: dict, part: dict, inst: MigInstance,
                     rng: random.Random) -> dict:
    """One MIG instance's row: the device's fields (clocks, power, temperature, link)
    repeated, its own activity ratios and memory."""
    fields = {k: v for k, v in device.items() if k not in _NOT_IN_MIG}
    if "gr_engine_active" in device:   # profiling on
        fields.update(_profiling(rng, min(1.0, part["busy"]), part))
    # an instance nobody uses holds a few MiB of the driver's
    fields["fb_used_mib"] = float(round(min(inst.fb_mib, part["fb"])) if part["contexts"]
                                  else rng.randrange(0, 14))
    fields["fb_total_mib"] = inst.fb_mib
    return fields


def _noisy(rng: random.Random, x: float, s: float = 0.012) -> float:
    """A DCGM ratio with its second-to-second noise, kept in [0, 1]."""
    return min(1.0, max(0.0, x * rng.uniform(1 - s, 1 + s) + rng.gauss(0, 0.003) * (x > 0)))


def _profiling(rng: random.Random, busy: float, load: dict) -> dict[str, float]:
    """DCGM's profiling ratios of a second (a whole GPU's, or a MIG instance's) with their
    noise: the graphics engine busy ``busy``, the rest as ``load`` has them."""
    return {"gr_engine_active": round(_noisy(rng, busy, 0.004), 4),
            **{field: round(_noisy(rng, load[key]), 4) for field, key in (
                ("sm_active", "sm"), ("sm_occupancy", "occ"), ("tensor_active", "tensor"),
                ("dram_active", "dram"), ("fp64_active", "fp64"), ("fp32_active", "fp32"),
                ("fp16_active", "fp16"))}}


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 50:
        return max(0, int(round(rng.gauss(lam, math.sqrt(lam)))))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


_CALL_OPS = {"rm_alloc": (0x2B, 48, "NV_ESC_RM_ALLOC"), "rm_free": (0x29, 16, "NV_ESC_RM_FREE"),
             "rm_control": (0x2A, 32, "NV_ESC_RM_CONTROL"),
             "rm_map": (0x4E, 56, "NV_ESC_RM_MAP_MEMORY"),
             "uvm_migrate": (51, 0, "UVM_MIGRATE")}


def _op(cls: str, count: int, rng: random.Random) -> dict:
    nr, size, name = _CALL_OPS[cls]
    cmd = nr if cls.startswith("uvm") else iowr(nr, size)
    latency = int(count * {"rm_control": 9_000, "rm_alloc": 40_000, "rm_free": 25_000,
                           "rm_map": 30_000, "uvm_migrate": 120_000}[cls])
    return {"cmd": cmd, "sub": 0, "op": name, "sub_name": None, "count": count, "errors": 0,
            "latency_sum_ns": latency, "latency_max_ns": int(latency / max(1, count) * 20),
            "bytes": 0, "latency_log2": []}


def _state_ns(on: float, runq: float, blocked: float, threads: int,
              rng: random.Random, net_rx: float = 0.0, net_wait: float = 0.0
              ) -> dict[str, int]:
    """A side's thread time in one second (every thread is in one state all the time), the
    bytes it received from sockets and the sleep it spent waiting for them."""
    total = max(float(threads), on + runq + blocked)
    sleep = total - on - runq - blocked
    return {"on_cpu_ns": int(on * NS), "runqueue_ns": int(runq * NS),
            "sleep_ns": int(sleep * NS), "blocked_ns": int(blocked * NS),
            "voluntary_switches": int(sleep * 180 + on * 40 + rng.randrange(20)),
            "involuntary_switches": int(runq * 900 + on * 8 + rng.randrange(4)),
            "migrations": int(on * 6 + rng.randrange(3)), "threads": threads,
            "net_rx_bytes": int(net_rx), "net_wait_ns": int(min(net_wait, sleep) * NS)}


# --- the simulators -----------------------------------------------------------------------
class _Loader:
    """DataLoader workers of one rank: batch k is made by worker k % W, no earlier than when
    batch k - prefetch·W was taken (the sampler's outstanding indices) and after the
    worker's previous batch."""

    def __init__(self, job: Training, trace: Trace, rng: random.Random, start: float):
        self.job, self.trace, self.rng = job, trace, rng
        self.free = [start - rng.uniform(0, job.worker_cpu_s) for _ in range(job.workers)]
        self.ready: dict[int, float] = {}
        self.taken: dict[int, float] = {}
        self.made = 0

    def share(self, t: float) -> float:
        """CPU contention: more runnable worker threads than cores slows each down."""
        cores = self.job.cores(t) if callable(self.job.cores) else self.job.cores
        demand = self.job.workers * self.job.worker_threads
        return 1.0 if not cores or demand <= cores else cores / demand

    def get(self, k: int) -> float:
        job, tr = self.job, self.trace
        while self.made <= k:
            j = self.made
            w = j % job.workers
            gate = self.taken.get(j - job.prefetch * job.workers, -math.inf)
            start = max(self.free[w], gate)
            io = job.worker_io_s * self.rng.lognormvariate(0, 0.35) if job.worker_io_s else 0.0
            cpu = job.worker_cpu_s * self.rng.lognormvariate(0, 0.12)
            if job.io_wait == "disk":
                tr.w_blocked.span(start, start + io)
            elif io and job.batch_bytes:       # the bytes arrive while the worker waits
                tr.w_net.span(start, start + io, job.batch_bytes / io)
                tr.w_net_wait.span(start, start + io)
            # the batch's CPU work runs on the worker's threads, each getting `share` of a core
            threads, share = job.worker_threads, self.share(start + io)
            wall = cpu / (threads * share)
            tr.w_on.span(start + io, start + io + wall, threads * share)
            if share < 1.0:
                tr.w_runq.span(start + io, start + io + wall, threads * (1 - share))
            self.ready[j] = self.free[w] = start + io + wall
            self.made += 1
        return self.ready[k]

    def take(self, k: int, t: float) -> None:
        self.taken[k] = t


def simulate_training(job: Training, host: Host, rng: random.Random) -> list[Trace]:
    n = host.n
    ranks = len(job.gpus)
    traces = [Trace(n) for _ in range(ranks)]
    for tr in traces:
        tr.mix = job.mix
        ramp = rng.uniform(0.985, 1.0)
        tr.fb_mib = lambda t, fb=job.fb_mib * ramp: fb
    loaders = [_Loader(job, traces[r], random.Random(f"{rng.random()}"), 0.0)
               if job.workers else None for r in range(ranks)]
    main = [rng.uniform(0, 0.05) for _ in range(ranks)]
    gpu_free = list(main)
    dead = [math.inf] * ranks
    for r, (at, code, sig) in job.crash.items():
        dead[r] = at
        traces[r].end, traces[r].exit_code, traces[r].signal = at, code, sig
    for r, (at, state) in job.hang.items():
        dead[r] = at
        if state == "blocked":
            traces[r].main_blocked.span(at, n)
        elif state == "spin":
            traces[r].nccl.span(at, n)
            traces[r].util.span(at, n)
            traces[r].main_on.span(at, n)
            traces[r].sync_wait.span(at, n)
    link_Bps = {"nvlink": host.board.nvlink_Bps * 0.8 or host.board.pcie_Bps,
                "pcie": host.board.pcie_Bps, "shm": min(host.board.pcie_Bps, 14e9)}[job.link]
    next_ckpt = job.ckpt_first_s or job.ckpt_every_s
    k = 0
    end_s = min(float(n), job.stop_s)
    while True:
        alive = [r for r in range(ranks) if main[r] < dead[r]]
        if not alive or min(main[r] for r in alive) >= end_s:
            break
        launched = {}
        ready_ar = {}
        for r in alive:
            tr = traces[r]
            t = main[r]
            if job.workers:
                ready = loaders[r].get(k)
                t = max(t, ready)
                loaders[r].take(k, t)
            else:   # the main process loads the batch itself
                io = job.worker_io_s * rng.lognormvariate(0, 0.35) if job.worker_io_s else 0.0
                cpu = job.worker_cpu_s * rng.lognormvariate(0, 0.12)
                if job.io_wait == "disk":
                    tr.main_blocked.span(t, t + io)
                elif io and job.batch_bytes:
                    tr.main_net.span(t, t + io, job.batch_bytes / io)
                    tr.main_net_wait.span(t, t + io)
                tr.main_on.span(t + io, t + io + cpu)
                t += io + cpu
            copied = t
            if job.h2d_bytes:
                if job.pageable:
                    dt = job.h2d_bytes / job.pageable_Bps
                    tr.main_on.span(t, t + dt)
                    tr.rx.span(t, t + dt, job.h2d_bytes / dt)
                    tr.pageable.at(t, job.h2d_bytes)
                    t += dt
                    copied = t
                else:
                    dt = job.h2d_bytes / (host.pcie_Bps_of(job.gpus[r])
                                          * host.placed(job.placement)[0])
                    tr.rx.span(t, t + dt, job.h2d_bytes / dt)
                    tr.aux_on.span(t - job.h2d_bytes / 8e9, t)   # the pin-memory thread
                    copied = t + dt   # the step's kernels follow the copy on its stream
            speed = job.speed(r, t)
            jitter = rng.lognormvariate(0, job.step_jitter)
            c = job.gpu_s * jitter / speed
            h = job.host_s * host.placed(job.placement)[1] * rng.lognormvariate(0, job.step_jitter)
            g0 = max(t + 0.0015, copied, gpu_free[r])
            serial = job.serial_s * rng.lognormvariate(0, job.step_jitter) if job.serial_s \
                else 0.0
            span = max(c, h) + serial
            duty = c / span
            tr.compute.span(g0, g0 + span, duty)
            tr.util.span(g0, g0 + span, duty)
            tr.main_on.span(t, t + h)
            if serial:   # host work between the step's syncs: the main thread works or spins
                tr.main_on.span(t + h, g0 + span)
                tr.sync_wait.span(g0, g0 + span, c / span)
            tr.launches.span(t, t + h, job.kernels / h)
            if job.allocs:
                tr.allocs.span(t, t + h, job.allocs / h)
                tr.rm_alloc.span(t, t + h, job.allocs / 2 / h)
                tr.rm_free.span(t, t + h, job.allocs / 2 / h)
                tr.rm_map.span(t, t + h, job.allocs / 2 / h)
            if job.uvm_migrate:
                tr.uvm.span(t, t + h, job.uvm_migrate / h)
            launched[r] = t + h
            ready_ar[r] = g0 + span
        if ranks > 1 and job.comm_bytes:
            comm_s = job.comm_bytes / link_Bps
            exposed = comm_s * (1 - job.overlap)
            everyone = len(alive) == ranks
            start = max(ready_ar.values())
            for r in alive:
                tr = traces[r]
                if not everyone:   # a rank is gone or stuck: the collective never completes
                    until = min(min(dead) + job.nccl_timeout_s, float(n))
                    tr.nccl.span(ready_ar[r], until)
                    tr.util.span(ready_ar[r], until)
                    tr.main_on.span(launched[r], until)
                    if until < n:
                        tr.end, tr.exit_code, tr.signal = until, None, 6
                    dead[r] = until
                    main[r] = until
                    continue
                tr.nccl.span(ready_ar[r], start + exposed)
                tr.util.span(ready_ar[r], start + exposed)
                g_start = ready_ar[r] - comm_s * job.overlap
                volume = job.comm_bytes / max(comm_s, 1e-6)
                target = tr.nvl if job.link == "nvlink" and host.board.nvlink_Bps else None
                if target is not None:
                    target.span(g_start, start + exposed, volume)
                else:
                    tr.rx.span(g_start, start + exposed, volume)
                    tr.tx.span(g_start, start + exposed, volume)
                ready_ar[r] = start + exposed
            if not everyone:
                break
        for r in alive:
            tr = traces[r]
            done = ready_ar[r]
            # the step's syncs: the main thread spins until the GPU is done
            if done > launched[r]:
                tr.main_on.span(launched[r], done)
                tr.sync_wait.span(launched[r], done)
            tr.syncs.at(launched[r], job.syncs)
            gpu_free[r] = done
            main[r] = max(launched[r], done)
            if job.offload_bytes:   # gradients out, the optimizer on CPUs, parameters back
                # the gradients stream out as backward (the step's last two thirds) makes
                # them, as ZeRO-Offload overlaps them; the parameters come back after
                t = main[r]
                dt = job.offload_bytes / host.pcie_Bps_of(job.gpus[r])
                out = max(dt, job.gpu_s * 2 / 3)
                tr.tx.span(done - out, done, job.offload_bytes / out)
                cpu = job.cpu_step_s * rng.lognormvariate(0, job.step_jitter)
                tr.main_on.span(t, t + cpu, job.cpu_step_cores)
                t += cpu
                tr.rx.span(t, t + dt, job.offload_bytes / dt)
                tr.main_on.span(t, t + dt)
                main[r] = gpu_free[r] = t + dt
        if job.ckpt_every_s and min(main[r] for r in alive) >= next_ckpt:
            writers = alive if job.ckpt_ranks == "all" else alive[:1]
            for r in writers:
                tr = traces[r]
                t = main[r]
                d2h = job.ckpt_bytes / (host.pcie_Bps_of(job.gpus[r]) * 0.7)
                tr.tx.span(t, t + d2h, job.ckpt_bytes / d2h)
                tr.main_on.span(t, t + d2h)
                write = job.ckpt_bytes / job.ckpt_write_Bps * rng.lognormvariate(0, 0.15)
                tr.main_on.span(t + d2h, t + d2h + write, 0.35)
                tr.main_blocked.span(t + d2h, t + d2h + write, 0.65)
                main[r] = gpu_free[r] = t + d2h + write
            next_ckpt += job.ckpt_every_s
        k += 1
    for r in range(ranks):
        tr = traces[r]
        if job.stop_s < n and tr.end == math.inf:
            tr.end, tr.exit_code = min(float(n), max(main[r], job.stop_s)), 0
    return traces


ENGINE_SCRAPE_S = 5.0    # the engines source's round


def _quantiles(name: str, values: list[float]) -> dict[str, float]:
    """p50, p95 and mean of the interval's ``values`` as the engine's histograms give them
    (none when the interval had none: the engine's quantile is then unknown, not 0)."""
    if not values:
        return {}
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]   # noqa: E731
    return {f"{name}_p50_s": round(at(0.5), 4), f"{name}_p95_s": round(at(0.95), 4),
            f"{name}_mean_s": round(sum(ordered) / len(ordered), 4)}


def simulate_kv_engine(job: Inference, host: Host, rng: random.Random) -> list[Trace]:
    """An engine with a KV cache of ``job.kv_tokens`` (see :class:`Inference`), iteration by
    iteration: admit from the queue while the cache holds the next request, compute the
    admitted prompts (whole, or ``chunk_tokens`` a step), decode one token for every
    running request past its prompt, preempt the latest admitted while the cache
    overflows. Its /metrics (what vLLM's would show: requests, KV cache, token rates, TTFT,
    inter-token latency and queue time quantiles) every ENGINE_SCRAPE_S go on
    ``traces[0].engine``."""
    n = host.n
    traces = [Trace(n) for _ in job.gpus]
    for tr in traces:
        tr.mix = job.mix
        tr.fb_mib = lambda t, fb=job.fb_mib: fb
    if job.loop_in == "between":
        traces[0].p_loop = Bins(n)
    # [prompt, output, generated, arrival, prefill left, first token at, admitted at]
    waiting: list[list[float]] = []
    running: list[list[float]] = []
    frontend: list[list[float]] = []          # handled by the frontend, not yet queued
    front_free = 0.0
    totals = {"preemptions": 0.0, "prompt": 0.0, "generation": 0.0, "finished": 0.0}
    before = dict(totals)
    latencies: dict[str, list[float]] = {"ttft": [], "tpot": [], "queue": []}
    scrapes: list[tuple[float, dict[str, float]]] = []
    next_scrape = ENGINE_SCRAPE_S
    used = 0.0
    t = 0.0
    next_arrival = rng.expovariate(max(job.rate(0.0), 1e-6))
    arrivals: list[float] = []                # closed loop: when the next clients send
    if job.concurrency:
        arrivals = [0.05 * i / job.concurrency for i in range(job.concurrency)]
        next_arrival = math.inf
    while t < n:
        while arrivals and arrivals[0] <= t:
            at = arrivals.pop(0)
            prompt = max(16.0, rng.lognormvariate(math.log(job.prompt_tokens), 0.5))
            output = max(8.0, rng.lognormvariate(math.log(job.tokens), 0.6))
            waiting.append([prompt, output, 0.0, at, prompt, -1.0, -1.0])
        while next_arrival <= t:
            prompt = max(16.0, rng.lognormvariate(math.log(job.prompt_tokens), 0.5))
            output = max(8.0, rng.lognormvariate(math.log(job.tokens), 0.6))
            request = [prompt, output, 0.0, next_arrival, prompt, -1.0, -1.0]
            if job.frontend_s:
                begin = max(next_arrival, front_free)
                front_free = begin + job.frontend_s + job.frontend_s_per_token * output
                request[3] = front_free               # the engine sees it from then on
                for tr in traces[:1]:
                    if job.frontend_in == "parent":
                        if tr.p_front is None:
                            tr.p_front = Bins(n)
                        tr.p_front.span(begin, front_free)
                    elif job.frontend_in == "workers":
                        tr.w_front.span(begin, front_free)
                        tr.w_on.span(begin, front_free)
                    else:
                        tr.front_on.span(begin, front_free)
                frontend.append(request)
            else:
                waiting.append(request)
            next_arrival += rng.expovariate(max(job.rate(next_arrival), 1e-6))
        while frontend and frontend[0][3] <= t:
            waiting.append(frontend.pop(0))
        while next_scrape <= t:
            values = {"requests_running": float(len(running)),
                      "requests_waiting": float(len(waiting)),
                      "kv_cache_usage": round(min(1.0, used / job.kv_tokens), 4)}
            if job.engine == "triton":    # pending in every model of the ensemble
                values = {"requests_waiting": float(len(waiting) + len(frontend))}
            if scrapes:
                for ours, name in (("preemptions_per_s", "preemptions"),
                                   ("prompt_tokens_per_s", "prompt"),
                                   ("generation_tokens_per_s", "generation"),
                                   ("requests_per_s", "finished")):
                    values[ours] = (totals[name] - before[name]) / ENGINE_SCRAPE_S
                for name, seen in latencies.items():
                    values.update(_quantiles(name, seen))
                if job.engine == "triton":
                    values = {name: values[name] for name in
                              ("requests_waiting", "requests_per_s", "queue_mean_s")
                              if name in values}
            scrapes.append((next_scrape, values))
            before = dict(totals)
            latencies = {name: [] for name in latencies}
            next_scrape += ENGINE_SCRAPE_S
        admitted = []
        while waiting and len(running) < job.max_seqs and \
                used + waiting[0][0] + waiting[0][2] + 1 <= job.kv_tokens:
            request = waiting.pop(0)
            request[4] = request[0] + request[2]  # its prompt and, if preempted, its tokens
            used += request[4]
            if request[6] < 0:
                request[6] = t
                latencies["queue"].append(t - request[3])
            running.append(request)
            admitted.append(request)
        if not running:
            t = min(float(n), next_arrival, next_scrape,
                    frontend[0][3] if frontend else math.inf,
                    arrivals[0] if arrivals else math.inf)
            continue
        fresh = {id(r) for r in admitted} if not job.chunk_tokens else set()
        decoding = {id(r) for r in running if r[4] <= 0 or id(r) in fresh}
        budget = max(0.0, job.chunk_tokens - len(decoding)) if job.chunk_tokens else math.inf
        prefill = 0.0
        for request in running:
            if request[4] > 0 and budget > 0:
                part = min(request[4], budget)
                request[4] -= part
                budget -= part
                prefill += part
        totals["prompt"] += prefill
        seqs = len(decoding)
        gap = job.sched_gap_s * rng.uniform(0.8, 1.2) + job.cpu_s_per_seq * len(running)
        it = job.iter_s + job.per_seq_s * seqs + job.prefill_s_per_token * prefill
        if job.gpu_speed is not None:
            it /= job.gpu_speed(t)
        if traces[0].p_loop is not None:     # the loop schedules, then waits for the step
            traces[0].p_loop.span(t, t + gap)
            traces[0].p_loop.span(t + gap, t + gap + it, job.loop_wait)
        for tr in traces:
            if job.loop_in == "between":
                tr.main_on.span(t + gap, t + gap + it)
            else:
                (tr.loop_on if job.engine == "triton" else tr.main_on).span(t, t + gap + it)
            tr.aux_on.span(t, t + gap + it, 0.2)
            tr.compute.span(t + gap, t + gap + it)
            tr.util.span(t + gap, t + gap + it)
            tr.launches.at(t, 180)
            if len(traces) > 1:
                tr.nvl.at(t, job.comm_bytes_per_iter * seqs / 32)
            tr.rx.at(t, 4096 * seqs)
            tr.tx.at(t, 2048 * seqs)
        step_end = t + gap + it
        made = 0
        for request in running:
            if id(request) in decoding or request[4] <= 0:
                if request[5] < 0:
                    request[5] = step_end
                    latencies["ttft"].append(step_end - request[3])
                else:
                    latencies["tpot"].append(gap + it)
                request[2] += 1.0
                made += 1
        used += made
        totals["generation"] += made
        while used > job.kv_tokens and len(running) > 1:
            request = running.pop()                  # the latest admitted gives way
            used -= request[0] + request[2]
            waiting.insert(0, request)
            totals["preemptions"] += 1
        done = [r for r in running if r[2] >= r[1]]
        for request in done:
            running.remove(request)
            used -= request[0] + request[2]
        totals["finished"] += len(done)
        if job.concurrency:
            arrivals += [step_end] * len(done)
        t = step_end
    traces[0].engine = scrapes
    return traces


def simulate_inference(job: Inference, host: Host, rng: random.Random) -> list[Trace]:
    if job.kv_tokens:
        return simulate_kv_engine(job, host, rng)
    n = host.n
    traces = [Trace(n) for _ in job.gpus]
    for tr in traces:
        tr.mix = job.mix
        tr.fb_mib = lambda t, fb=job.fb_mib: fb
    t = 0.0
    finish: list[int] = []            # the iteration each sequence in flight ends at (a heap)
    iteration = 0
    next_arrival = rng.expovariate(max(job.rate(0.0), 1e-6))
    while t < n:
        while next_arrival <= t:
            tokens = max(8.0, rng.lognormvariate(math.log(job.tokens), 0.6))
            heapq.heappush(finish, iteration + int(tokens))
            next_arrival += rng.expovariate(max(job.rate(next_arrival), 1e-6))
        while finish and finish[0] <= iteration:
            heapq.heappop(finish)
        if not finish:
            t = min(float(n), next_arrival)
            continue
        seqs = len(finish)
        gap = job.sched_gap_s * rng.uniform(0.8, 1.2)
        it = job.iter_s + job.per_seq_s * seqs
        for tr in traces:
            tr.main_on.span(t, t + gap + it)   # the engine loop schedules, then waits (spins)
            tr.aux_on.span(t, t + gap + it, 0.2)
            tr.compute.span(t + gap, t + gap + it)
            tr.util.span(t + gap, t + gap + it)
            tr.launches.at(t, 180)
            if len(traces) > 1:
                tr.nvl.at(t, job.comm_bytes_per_iter * seqs / 32)
            tr.rx.at(t, 4096 * seqs)
            tr.tx.at(t, 2048 * seqs)
        t += gap + it
        iteration += 1
    return traces


def simulate_holder(job: Holder, host: Host) -> Trace:
    tr = Trace(host.n)
    tr.mix = LLM_TRAIN
    tr.fb_mib = lambda t: job.fb_mib
    tr.aux_on.span(0, host.n, job.cpu)
    if job.stop_s < host.n:
        tr.end, tr.exit_code = job.stop_s, job.exit_code
    return tr


def simulate_steady(job: Steady, host: Host, rng: random.Random) -> Trace:
    tr = Trace(host.n)
    tr.mix = job.mix
    tr.fb_mib = lambda t: job.fb_mib
    for k in range(host.n):
        level = job.busy(k) if callable(job.busy) else job.busy
        busy = min(1.0, level * rng.uniform(0.99, 1.01))
        tr.compute.span(k, k + 1, busy)
        tr.util.span(k, k + 1, busy)
        tr.main_on.span(k, k + 1, 0.97)
        tr.rx.span(k, k + 1, job.rx_Bps * rng.uniform(0.8, 1.2))
        tr.tx.span(k, k + 1, job.tx_Bps * rng.uniform(0.8, 1.2))
        tr.launches.span(k, k + 1, job.launches_per_s)
        tr.syncs.at(k + 0.5, 20)
        tr.sync_wait.span(k, k + 1, 0.9)
        if job.uvm_migrate:
            tr.uvm.span(k, k + 1, job.uvm_migrate * rng.uniform(0.8, 1.2))
        if job.rm_alloc:
            tr.rm_alloc.span(k, k + 1, job.rm_alloc)
            tr.rm_free.span(k, k + 1, job.rm_alloc)
    return tr


def reset_call(host: Host, t: float, process: ProcessKey) -> None:
    """The RM control ``nvidia-smi -r`` sends (a notable driver call of that process)."""
    host.extra.append((t, "probes", DriverCall(
        ts=0, process=process, tid=process.pid, fd=3, path="/dev/nvidiactl",
        device="nvidiactl", cmd=iowr(0x2A, 32), nr=0x2A, size=32, op="NV_ESC_RM_CONTROL",
        latency_ns=2_400_000_000, ret=0, sub=BIF_RESET, sub_name=RESET_CONTROLS[0],
        reasons=["notable", "slow"])))


def gpu_xid(host: Host, t: float, gpu: int, code: int, detail: str = "") -> None:
    """The GPU source's own report of an Xid (NVML event / DCGM field 230)."""
    host.extra.append((t, "gpu", GpuXid(ts=0, gpu_id=host.uuids[gpu], xid=code,
                                        source=host.source, simulated=False, detail=detail)))


def gpu_state(host: Host, t: float, gpu: int, state: str, detail: str = "") -> None:
    host.extra.append((t, "gpu", GpuState(ts=0, gpu_id=host.uuids[gpu], state=state,
                                          source=host.source, simulated=False, detail=detail)))


def pci(host: Host, gpu: int) -> str:
    """The GPU's PCI address as the kernel log writes it (``0000:18:00``)."""
    return host.pcis[gpu][:-2]


def cuda_start_fails(host: Host, t: float, cmdline: str, opened: list[int], lasts_s: float,
                     ppid: int = 1, uid: int = 1000, exit_code: int = 1) -> ProcessKey:
    """A GPU process whose CUDA start fails (cuInit returns cudaErrorSystemNotReady while the
    NVLink fabric is not up): it starts at ``t``, imports its libraries on a CPU, and in its
    last half second cuInit opens the control node, UVM and the device nodes of ``opened``;
    it gets no context (no memory, no NVML process row, no GPU work) and exits ``exit_code``
    at ``t + lasts_s``, its fds closed. It holds them too briefly for the sched probe, which
    follows processes holding NVIDIA fds, to have a second of it to report."""
    key = ProcessKey(host.pid(), int((host.uptime_s + t) * TICKS))
    exe = "/usr/bin/python3"
    end = t + lasts_s
    opens = max(t + 0.05, end - 0.5)
    host.extra += [(t, "probes", ProcessSeen(ts=0, process=key, comm="python3",
                                             cmdline=cmdline, exe=exe, ppid=ppid, uid=uid)),
                   (t + 0.001, "probes", ProcessExec(ts=0, process=key, filename=exe,
                                                     ppid=ppid))]
    fds = [("/dev/nvidiactl", "nvidiactl", None), ("/dev/nvidia-uvm", "nvidia-uvm", None)]
    fds += [(f"/dev/nvidia{m}", "nvidiaN", m) for m in opened]
    for fd, (path, device, minor) in enumerate(fds, 3):
        host.extra += [(opens + 0.002 * fd, "probes", DeviceOpened(
                            ts=0, process=key, fd=fd, path=path, device=device, minor=minor)),
                       (end, "probes", DeviceClosed(ts=0, process=key, fd=fd, path=path))]
    host.extra.append((end + 0.001, "probes", ProcessExited(ts=0, process=key,
                                                            exit_code=exit_code)))
    return key
