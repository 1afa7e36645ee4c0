"""The event schema: one frozen dataclass per event kind, the contract of the bus.

``ts`` is CLOCK_REALTIME in ns, converted at the source; ``raw_ts`` keeps the source's own
clock value where it has one. Topics name the source kind and none is a prefix of another,
because ZeroMQ subscriptions match by prefix. How events travel (JSON payloads, batches)
is :mod:`gpuwhy.wire`.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from gpuwhy.identity import ProcessKey

SCHEMA_VERSION = 1

TOPICS = ("proc", "fd", "ioctl", "health", "gpu", "klog", "cron", "sched", "rule", "cuda",
          "stacks", "engine")


@dataclass(frozen=True)
class Event:
    """Base of all events. ``topic`` and ``kind`` are class attributes; ``ts`` is realtime ns."""

    topic: ClassVar[str]
    kind: ClassVar[str]

    ts: int
    raw_ts: int | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class ProcessSeen(Event):
    """Event name: ``process_seen`` (topic ``proc``). Facts about a process, first time it
    matters. ``comm``, ``cmdline``, ``exe`` and ``tag`` are controlled by the process:
    untrusted, already bounded in length, to be escaped wherever shown. ``started_at``: when
    the process started (realtime ns, from its start time), None when not known: a process
    that ran an hour before gpuwhy first saw it is no young process. ``env``: only the
    environment variables the ``probes.environment`` setting names that the process has set,
    each value bounded (1,024 bytes); empty when none is set or the environment could
    not be read. Controlled by the process too: untrusted, escaped wherever shown."""

    topic = "proc"
    kind = "process_seen"

    process: ProcessKey
    comm: str = ""
    cmdline: str = ""
    exe: str = ""
    ppid: int = 0
    uid: int = -1
    cgroup: str = ""
    tag: str | None = None
    # from the cgroup path: None when the path does not say
    container_id: str | None = None
    pod_uid: str | None = None
    unit: str | None = None
    started_at: int | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProcessExited(Event):
    """Event name: ``process_exited`` (topic ``proc``). A process ended: ``exit_code`` when it
    called exit, ``signal`` when a signal killed it, both None when not known."""

    topic = "proc"
    kind = "process_exited"

    process: ProcessKey
    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class DeviceOpened(Event):
    """Event name: ``device_opened`` (topic ``fd``). A process holds an fd on a device file.
    ``how``: ``open`` (seen opening), ``scan`` (found by the start-up /proc scan), ``dup``
    (a copy of another tracked fd), ``fork`` (inherited from the parent) or ``inherited``
    (found by the scan under the fd number its parent holds the same file by: inherited at a
    fork before gpuwhy started)."""

    topic = "fd"
    kind = "device_opened"

    process: ProcessKey
    fd: int
    path: str
    device: str
    minor: int | None = None
    how: str = "open"
    cloexec: bool = False


@dataclass(frozen=True)
class DeviceClosed(Event):
    """Event name: ``device_closed`` (topic ``fd``). The fd was closed, closed at exec
    (O_CLOEXEC), replaced by dup2, or its process exited."""

    topic = "fd"
    kind = "device_closed"

    process: ProcessKey
    fd: int
    path: str


@dataclass(frozen=True)
class DriverCallStats(Event):
    """Event name: ``driver_call_stats`` (topic ``ioctl``). Cumulative driver-call figures of
    one process on one device path, one entry per (command, sub-operation): ``cmd`` (the raw
    ioctl request), ``op`` (the driver's name), ``sub``/``sub_name`` (RM class of an alloc,
    control command of an RM_CONTROL, heap function), ``count``, ``errors`` (syscall error or
    RM status not NV_OK), ``latency_sum_ns``, ``latency_max_ns``, ``latency_log2`` (calls per
    power-of-two nanosecond bucket) and ``bytes``. An event holds the entries that moved
    since the path's last event; every entry at the first, at least every 30 s while the
    process calls the driver, and after a subscriber (re)connects. Each entry is
    cumulative, so a lost message is repaired by that entry's next one, and by the next
    whole event at the latest; a consumer keeps every entry's latest figures."""

    topic = "ioctl"
    kind = "driver_call_stats"

    process: ProcessKey
    path: str
    device: str
    ops: list[dict]


@dataclass(frozen=True)
class DriverCall(Event):
    """Event name: ``driver_call`` (topic ``ioctl``). One decoded driver call, sent when it
    matters on its own: ``reasons`` holds ``notable`` (resets, drains, ECC, GPU attach,
    version check), ``slow``, ``error``, ``big`` (a large allocation) or ``traced``."""

    topic = "ioctl"
    kind = "driver_call"

    process: ProcessKey
    tid: int
    fd: int
    path: str
    device: str
    cmd: int
    nr: int
    size: int
    op: str
    latency_ns: int
    ret: int
    status: int = 0
    status_name: str = "NV_OK"
    sub: int = 0
    sub_name: str | None = None
    arg0: int = 0
    arg1: int = 0
    bytes: int = 0
    version: str | None = None
    gpu_ids: list[int] | None = None
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SourceHealth(Event):
    """Event name: ``source_health`` (topic ``health``). A source's heartbeat: ``state`` is
    ``ok``, ``degraded`` or ``failed``; ``counters`` holds its totals (events, drops by reason)."""

    topic = "health"
    kind = "source_health"

    source: str
    state: str
    detail: str = ""
    counters: dict[str, int] = field(default_factory=dict)


# --- probes: lifecycle, scheduler, driver calls ---
@dataclass(frozen=True)
class ProcessExec(Event):
    """Event name: ``process_exec`` (topic ``proc``). A process replaced its image; ``filename``
    is what the kernel executed (the pid and start time stay the same across exec)."""

    topic = "proc"
    kind = "process_exec"

    process: ProcessKey
    filename: str
    ppid: int = 0


@dataclass(frozen=True)
class ProcessForked(Event):
    """Event name: ``process_forked`` (topic ``proc``). ``parent`` created the process ``child``
    (not a thread)."""

    topic = "proc"
    kind = "process_forked"

    parent: ProcessKey
    child: ProcessKey


@dataclass(frozen=True)
class SchedStats(Event):
    """Event name: ``sched_stats`` (topic ``sched``). What the scheduler did with a process that
    uses the GPU during ``interval_ns`` before ``ts``: ``own`` for its threads, ``workers`` for
    its child processes (DataLoader workers) and their threads. Each holds nanoseconds
    ``on_cpu_ns``, ``runqueue_ns`` (runnable, waiting for a CPU), ``sleep_ns`` (interruptible),
    ``blocked_ns`` (uninterruptible, usually I/O) and counts ``voluntary_switches``,
    ``involuntary_switches``, ``migrations``, ``threads``, ``busiest_on_cpu_ns`` (the on-CPU
    ns of the side's busiest thread, for ``own`` the busiest but its main thread, whose
    own is ``own.main_on_cpu_ns``); ``net_rx_bytes`` (received from
    TCP/IP sockets) and ``net_wait_ns`` (the sleep that ended in such a receive: waiting for
    the network), both absent where the kernel offers no hook to count them.
    ``node_on_cpu_ns``: on a host with several NUMA nodes, the on-CPU ns of its threads and
    its workers' per node (index = node); empty on a single-node host. ``frontend``: where
    the process runs under a serving engine whose other processes are no children of it
    (vLLM's API server, SGLang's tokenizer manager, TGI's router), those processes:
    ``on_cpu_ns``, ``busiest_on_cpu_ns`` (its busiest thread's), ``threads``, ``processes``;
    None where none is watched for it (no such engine, another GPU process of the engine
    has it, or a recording made before). ``engine_loop``: the same figures for the processes
    between that engine and the process (vLLM V1's EngineCore above its tensor-parallel
    workers: the engine's scheduling loop, holding no GPU), None where none is watched for
    it."""

    topic = "sched"
    kind = "sched_stats"

    process: ProcessKey
    interval_ns: int
    own: dict[str, int]
    workers: dict[str, int]
    worker_processes: int = 0
    node_on_cpu_ns: list[int] = field(default_factory=list)
    frontend: dict[str, int] | None = None
    engine_loop: dict[str, int] | None = None

# --- cuda uprobes events ---
CUDA_COPY_DIRECTIONS = ("htod", "dtoh", "dtod", "htoh", "unknown")
CUDA_MEMORY_FIGURES = ("allocs", "alloc_bytes", "frees", "free_bytes", "host_allocs",
                       "host_alloc_bytes")


@dataclass(frozen=True)
class CudaStats(Event):
    """Event name: ``cuda_stats`` (topic ``cuda``). What a GPU process asked of the CUDA
    libraries during ``interval_ns`` before ``ts`` (sent only for intervals with calls):
    ``calls`` (outermost traced calls: cudaMemcpy calling cuMemcpy is one), ``errors`` (calls
    that returned an error), ``launches`` per API (cuLaunchKernel, cuLaunchKernelEx,
    cudaLaunchKernel, cudaLaunchKernelExC), ``grid_log2``/``block_log2`` (launches per
    power-of-two bucket of blocks per grid / threads per block), ``graph_launches``,
    ``copies`` per direction (htod, dtoh, dtod, htoh, unknown): count, bytes, ns (time in the
    call), async_count, pinned_bytes, pageable_bytes (host memory not allocated or
    registered as pinned while traced); ``syncs`` per API: count, blocked_ns; ``sync_log2``
    (syncs per power-of-two ns bucket); ``memory``: allocs, alloc_bytes, frees, free_bytes,
    host_allocs, host_alloc_bytes, host_frees, registers, register_bytes;
    ``traced_since_start`` (false when attached to a process found already running: its
    earlier allocations are unknown); ``overhead_ns``, the probes' estimated cost."""

    topic = "cuda"
    kind = "cuda_stats"

    process: ProcessKey
    interval_ns: int
    calls: int
    errors: int
    launches: dict[str, int]
    grid_log2: list[int]
    block_log2: list[int]
    graph_launches: int
    copies: dict[str, dict[str, int]]
    syncs: dict[str, dict[str, int]]
    sync_log2: list[int]
    memory: dict[str, int]
    traced_since_start: bool = True
    overhead_ns: int = 0

    def totals(self) -> dict[str, int]:
        """The interval's figures as flat numbers: kernel launches, graph launches, syncs,
        sync_blocked_ns, ``{direction}_count``/``_bytes``, ``htod``/``dtoh`` ``_pinned_bytes``
        and ``_pageable_bytes``, and the ``memory`` counts (the store's and the rules' one
        reading of this event)."""
        flat = {"launches": sum(self.launches.values()),
                "graph_launches": self.graph_launches,
                "syncs": sum(s.get("count", 0) for s in self.syncs.values()),
                "sync_blocked_ns": sum(s.get("blocked_ns", 0) for s in self.syncs.values())}
        for direction in CUDA_COPY_DIRECTIONS:
            figures = self.copies.get(direction, {})
            flat[f"{direction}_count"] = figures.get("count", 0)
            flat[f"{direction}_bytes"] = figures.get("bytes", 0)
        for direction in ("htod", "dtoh"):
            figures = self.copies.get(direction, {})
            flat[f"{direction}_pinned_bytes"] = figures.get("pinned_bytes", 0)
            flat[f"{direction}_pageable_bytes"] = figures.get("pageable_bytes", 0)
        for name in CUDA_MEMORY_FIGURES:
            flat[name] = self.memory.get(name, 0)
        return flat


@dataclass(frozen=True)
class CudaCall(Event):
    """Event name: ``cuda_call`` (topic ``cuda``). One CUDA call worth seeing on its own:
    ``reasons`` holds ``slow`` (latency at least ``probes.cuda_slow_call_ms``), ``big`` (a
    copy or allocation of at least ``probes.cuda_big_copy_bytes``) or ``error`` (``ret`` not
    0). ``direction`` and ``host`` (``pinned``/``pageable``) are set for copies."""

    topic = "cuda"
    kind = "cuda_call"

    process: ProcessKey
    tid: int
    api: str
    latency_ns: int
    ret: int = 0
    bytes: int = 0
    direction: str | None = None
    host: str | None = None
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CudaLibrary(Event):
    """Event name: ``cuda_library`` (topic ``cuda``). What the CUDA uprobes did with a library
    a GPU process mapped: ``state`` is ``attached`` (``probes`` uprobes and uretprobes),
    ``refused`` (build id not allowed, or not readable), ``detached`` (kill switch, overhead,
    errors) or ``failed``; ``reason`` says why. ``path`` is as the process sees it."""

    topic = "cuda"
    kind = "cuda_library"

    process: ProcessKey
    path: str
    build_id: str | None
    state: str
    reason: str = ""
    probes: int = 0

# --- Python stack sampler events ---
@dataclass(frozen=True)
class PythonStacks(Event):
    """Event name: ``python_stacks`` (topic ``stacks``). The Python stacks of ``process`` (bound
    to ``gpu_id``) and of its child processes, sampled every ``interval_ms`` while the
    host-side answer ``finding_id`` (rule ``rule_id``) held, from ``started`` (realtime ns)
    to ``ts``: ``stacks`` holds one dict per (pid, start_time, role, stack) with its
    ``count`` of samples (and ``seconds``: [second of the window, samples] pairs, which
    line them up with the GPU's 1 s samples), ``role`` being ``main`` (the main thread of
    ``process``),
    ``threads`` (its other threads) or ``workers`` (its children: DataLoader workers);
    ``stack`` is folded, outermost frame first, frames ``file:line function`` joined by
    ``;`` (gpuwhy.pystacks: escaped, bounded, waits folded into ``waiting on ...``), never
    raw samples. ``samples``: sampling rounds; ``final``: the window ended or the answer
    cleared; ``dropped``: what the bounds left out, by reason; ``error``: why sampling
    failed, if it did. Every name in a stack is the process's: untrusted."""

    topic = "stacks"
    kind = "python_stacks"

    process: ProcessKey
    gpu_id: str
    finding_id: str
    rule_id: str
    started: int
    interval_ms: int
    samples: int
    stacks: list[dict]
    final: bool = True
    dropped: dict[str, int] = field(default_factory=dict)
    error: str = ""


# --- GPU counter sources ---
@dataclass(frozen=True)
class GpuSeen(Event):
    """Event name: ``gpu_seen`` (topic ``gpu``). Everything a GPU source knows a GPU by.
    ``gpu_id`` is :attr:`GpuIdentity.id`; ``source`` is ``dcgm``, ``nvml``,
    ``dcgm-exporter`` or ``sim``; ``simulated`` is true for the simulator, always.
    ``numa_node``: the NUMA node the GPU's PCIe link is attached to (sysfs), None when the
    firmware does not say."""

    topic = "gpu"
    kind = "gpu_seen"

    gpu_id: str
    source: str
    simulated: bool
    uuid: str | None = None
    pci_bus_id: str | None = None
    index: int | None = None
    minor: int | None = None
    model: str = ""
    driver_version: str = ""
    numa_node: int | None = None


@dataclass(frozen=True)
class DriverGpu(Event):
    """Event name: ``driver_gpu`` (topic ``gpu``). A GPU the NVIDIA driver lists in its own
    table (``/proc/driver/nvidia/gpus/<bus id>/information``): its bus location, its
    ``/dev/nvidiaN`` minor and its UUID (None when the driver does not give one). Whatever
    counters source runs, or none: a GPU that NVML cannot open is still listed, so a device
    file, a kernel-log line and a counter sample all name the same GPU."""

    topic = "gpu"
    kind = "driver_gpu"

    pci_bus_id: str
    minor: int | None = None
    uuid: str | None = None


@dataclass(frozen=True)
class GpuSample(Event):
    """Event name: ``gpu_sample`` (topic ``gpu``). One sample of one GPU: ``fields`` by our
    normalised names and units (docs/gpu-fields.md); a field the GPU did not report, or
    reported as DCGM's blank/not-supported sentinel, is absent, never 0. ``instance`` names a
    MIG GPU instance ("" for the whole GPU); ``labels`` carries pod/namespace/container from a
    dcgm-exporter scrape. ``raw_ts`` is the source's own timestamp (DCGM: realtime µs)."""

    topic = "gpu"
    kind = "gpu_sample"

    gpu_id: str
    source: str
    simulated: bool
    fields: dict[str, float]
    instance: str = ""
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuXid(Event):
    """Event name: ``gpu_xid`` (topic ``gpu``). The driver reported Xid ``xid`` for a GPU
    (NVML event, DCGM field 230, a change of dcgm-exporter's last-Xid gauge, or the simulator).

    ``before_start``: the Xid happened before gpuwhy started, at a time nobody can tell — the
    source's first read showed it as the GPU's last Xid (dcgm-exporter's gauge). ``ts`` is
    then that first read's time, not the Xid's; it is a fact about the GPU's past (the GPU
    page shows it, the store keeps it), not something that just happened: no incident, no
    alert, no rule counts it."""

    topic = "gpu"
    kind = "gpu_xid"

    gpu_id: str
    xid: int
    source: str
    simulated: bool
    detail: str = ""
    before_start: bool = False


@dataclass(frozen=True)
class GpuState(Event):
    """Event name: ``gpu_state`` (topic ``gpu``). A GPU stopped or resumed answering:
    ``state`` is ``lost`` (fell off the bus, NVML GPU_IS_LOST), ``reset_required``,
    ``resetting`` or ``back``; ``detail`` says what the source saw."""

    topic = "gpu"
    kind = "gpu_state"

    gpu_id: str
    state: str
    source: str
    simulated: bool
    detail: str = ""


@dataclass(frozen=True)
class GpuProcesses(Event):
    """Event name: ``gpu_processes`` (topic ``gpu``). Compute processes on a GPU (NVML), each
    a dict with ``pid``, ``start_time`` (clock ticks since boot, None when /proc could not
    tell), ``used_memory_mib``, the per-process utilisation ``sm_util``, ``mem_util``,
    ``enc_util``, ``dec_util`` in % (None when the driver had no sample for it), and
    ``gpu_instance``: the MIG GPU instance id the process runs in (the ``instance`` of that
    instance's ``gpu_sample`` events, as an int), None on a GPU not in MIG mode or when the
    driver does not say."""

    topic = "gpu"
    kind = "gpu_processes"

    gpu_id: str
    source: str
    processes: list[dict]

# --- kernel log and cron sources ---


@dataclass(frozen=True, kw_only=True)
class KernelLogFacts:
    """What one recognised NVIDIA kernel-log line says: the parser's reading
    (``gpuwhy.probes.klog.parse.KernelRecord``) and the bus's record of it
    (:class:`KernelLogRecord`) share these fields. ``pci`` is ``dddd:bb:dd`` lowercase;
    ``message`` and ``name`` come from the line: bounded, untrusted."""

    message: str = ""
    xid: int | None = None
    sxid: int | None = None
    pci: str | None = None
    pid: int | None = None
    name: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    uuid: str | None = None
    driver_version: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelLogRecord(Event, KernelLogFacts):
    """Event name: ``kernel_log_record`` (topic ``klog``). One recognised NVIDIA kernel-log
    line: its facts (:class:`KernelLogFacts`) and where it was read. ``record_kind`` is ``xid``,
    ``sxid``, ``fallen_off_bus``, ``rm_init_failed``, ``probe_failed``, ``api_mismatch``,
    ``gpu_uuid``, ``gpu_serial``, ``driver_loaded``, ``gsp_timeout``, ``gsp_rate_limited`` or
    ``gsp_rpc_failed``, or
    ``unparsed``: an NVIDIA line that could not be read, ``details["reason"]`` saying why,
    no other fact set, stored so that its cursor moves past it; or ``forged``: a line that
    calls itself the driver's but was sent from user space (not ``_TRANSPORT=kernel``),
    never parsed, ``details`` naming the sender (``uid``, ``sender_pid``, ``comm``,
    ``transport``) and the ``attempts`` it stands for; ``pci``
    is ``dddd:bb:dd``. ``cursor`` is the line's position in ``origin`` (``journald``,
    ``kmsg``, ``file``); the store keeps it with the record, in the same transaction, so
    the source resumes exactly after it. ``raw_ts`` is the printk time (ns since boot
    ``boot_id``). ``name``, ``message`` and ``line`` name a process: bounded, untrusted."""

    topic = "klog"
    kind = "kernel_log_record"

    cursor: str
    origin: str
    boot_id: str
    record_kind: str
    line: str = ""


@dataclass(frozen=True)
class KernelLogCheckpoint(Event):
    """Event name: ``kernel_log_checkpoint`` (topic ``klog``). Every line up to ``cursor``
    was read and none of the ``skipped`` lines since the last record or checkpoint was an
    NVIDIA line: the store moves the source's cursor there."""

    topic = "klog"
    kind = "kernel_log_checkpoint"

    cursor: str
    origin: str
    boot_id: str
    skipped: int = 0


@dataclass(frozen=True)
class CronSchedule(Event):
    """Event name: ``cron_schedule`` (topic ``cron``). The whole schedule, replacing the last
    one: each job is a dict with ``origin`` (crontab, cron.d, user, timer), ``file``,
    ``ident``, ``user``, ``schedule``, ``command`` (bounded, untrusted), ``next_run`` and
    ``last_run`` (realtime ns or None), ``gpu_action`` (what it does to GPUs, or None),
    ``note``."""

    topic = "cron"
    kind = "cron_schedule"

    jobs: list[dict[str, Any]]
    truncated: bool = False


@dataclass(frozen=True)
class CronExecution(Event):
    """Event name: ``cron_execution`` (topic ``cron``). cron started (``phase`` ``started``,
    from its ``CMD`` log line) or finished (``ended``, ``END``) a job. ``job_pid`` is the
    job's shell (``[pid]`` that ``cron -L 15`` logs); ``job_start_time`` its /proc start
    time when it was still alive, so (job_pid, job_start_time) joins the exec events of the
    job's processes. ``cron_pid`` is the cron child that ran it (``CRON[pid]``)."""

    topic = "cron"
    kind = "cron_execution"

    cursor: str
    phase: str
    user: str
    command: str
    job_pid: int | None = None
    job_start_time: int | None = None
    cron_pid: int | None = None
    gpu_action: str | None = None
    boot_id: str = ""


# --- rules events ---
@dataclass(frozen=True)
class RuleFinding(Event):
    """Event name: ``rule_finding`` (topic ``rule``). A rule's condition held (``state``
    ``firing``; sent again only when its severity changes) or stopped holding (``cleared``).
    ``finding_id`` is stable from onset to clearing. ``window_start``/``window_end`` bound the
    samples that triggered it (the evaluation window: it starts a rule's window before the
    onset, so it is no time of the finding's); ``since`` is when the condition first held
    (the evaluation that first found it true, realtime ns), never before a process it names
    was first seen; 0 from a sender that predates it. ``evidence`` maps each evidence term
    to its value (None: unknown). ``shadow`` findings are recorded, never alerted.
    ``process`` is the process the finding is about (for GPU rules: the GPU's main compute
    process, if any); ``processes`` every process it names: for GPU rules each compute
    process on the GPU when the condition began to hold (monitors left out) and the main
    one at onset, for process rules that process. ``since`` and ``processes`` are the
    onset's, kept to the clearing. ``rule_kind`` says whether the rule names a cause or a
    symptom (gpuwhy/rules/model.py); a cause ``explains`` the symptom rules it lists; a
    symptom's ``unexplained`` says, per cause rule that could explain it, why it is not
    established (what it lacks). ``instance`` names the MIG GPU instance of a ``scope:
    instance`` rule's finding, as :class:`GpuSample` does ("" for the whole GPU), and
    ``mig_profile`` its profile where the source tells it (dcgm-exporter's GPU_I_PROFILE,
    e.g. ``1g.10gb``; "" when not known)."""

    topic = "rule"
    kind = "rule_finding"

    finding_id: str
    rule_id: str
    title: str
    severity: str
    state: str
    gpu_id: str
    process: ProcessKey | None = None
    window_start: int = 0
    window_end: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)
    root_cause: str = ""
    fixes: list[str] = field(default_factory=list)
    verify: str = ""
    shadow: bool = False
    group: str = ""
    since: int = 0
    processes: list[ProcessKey] = field(default_factory=list)
    rule_kind: str = ""                 # the rule's kind (cause, symptom); "" from older senders
    explains: list[str] = field(default_factory=list)   # symptom rule ids a cause explains
    unexplained: list[str] = field(default_factory=list)  # a symptom's causes, not established
    instance: str = ""                  # MIG GPU instance ("" = the whole GPU)
    mig_profile: str = ""               # that instance's profile, "" when not known
    scope: str = ""                     # the rule's scope (gpu, process, instance); "" older

    def __post_init__(self) -> None:
        if isinstance(self.process, dict):   # decoded from the wire
            object.__setattr__(self, "process", self._key(self.process))
        if not isinstance(self.processes, list | tuple):
            raise TypeError("processes is not a list of process keys")
        if isinstance(self.processes, tuple) or \
                not all(isinstance(p, ProcessKey) for p in self.processes):   # from the wire
            object.__setattr__(self, "processes", [
                p if isinstance(p, ProcessKey) else self._key(p) for p in self.processes])
        for name in ("explains", "unexplained"):
            value = getattr(self, name)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise TypeError(f"{name} is not a list of strings")

    @staticmethod
    def _key(value: dict) -> ProcessKey:
        try:
            return ProcessKey(int(value["pid"]), int(value["start_time"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise TypeError(f"process is not a process key: {exc}") from None



# --- inference engines ---
# The engines' names as their projects write them (``EngineSample.engine`` holds the key)
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "tgi": "TGI", "triton": "Triton"}
@dataclass(frozen=True)
class EngineSample(Event):
    """Event name: ``engine_sample`` (topic ``engine``). One scrape of an inference engine's
    Prometheus endpoint (probes/engines). ``engine``: ``vllm``, ``sglang``, ``tgi`` or
    ``triton``; ``endpoint``: the URL scraped; ``process``: the engine process serving it
    (None for an endpoint named in the settings); ``version``: what the metric names tell
    of the version (vLLM ``v0``/``v1``), "" when nothing does; ``processes``: the engine's
    processes (itself, its children) holding GPU device files; ``gpu_ids``: the GPUs they
    hold, or the endpoint names (Triton's ``gpu_uuid``). ``values``: by the names of
    ``gpuwhy.rules.vocabulary.ENGINE_VALUES`` only (requests running and waiting, KV-cache
    usage 0..1, rates per second, latency quantiles and means in seconds over the interval
    since the previous scrape); a value the engine does not report is absent, never 0."""

    topic = "engine"
    kind = "engine_sample"

    engine: str
    endpoint: str
    process: ProcessKey | None = None
    version: str = ""
    processes: list[ProcessKey] = field(default_factory=list)
    gpu_ids: list[str] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.process, dict):   # decoded from the wire
            object.__setattr__(self, "process", RuleFinding._key(self.process))
        if not isinstance(self.processes, list):
            raise TypeError("processes is not a list of process keys")
        object.__setattr__(self, "processes", [
            p if isinstance(p, ProcessKey) else RuleFinding._key(p) for p in self.processes])
        if not isinstance(self.values, dict) or not all(
                isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
                for k, v in self.values.items()):
            raise TypeError("values is not a dict of numbers by name")


def _concrete_event_types(base: type[Event]) -> list[type[Event]]:
    found = []
    for cls in base.__subclasses__():
        if "kind" in cls.__dict__:
            found.append(cls)
        found += _concrete_event_types(cls)
    return found


EVENT_TYPES: dict[str, type[Event]] = {cls.kind: cls for cls in _concrete_event_types(Event)}


def methods_by_kind(obj: object, prefix: str) -> dict[str, Any]:
    """``obj``'s methods named ``prefix`` + an event kind, by kind: a handler table built
    once, instead of a formatted getattr per event."""
    return {kind: getattr(obj, prefix + kind) for kind in EVENT_TYPES
            if hasattr(obj, prefix + kind)}


@functools.cache
def _field_names(cls: type[Event], exclude: tuple[str, ...] = ()) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in exclude)


def event_fields(event: Event, exclude: tuple[str, ...] = ()) -> dict[str, Any]:
    """The event's fields but those named in ``exclude``, as JSON-ready values (process keys
    as ``{pid, start_time}``): ``dataclasses.asdict`` without its deep copy, which cost
    ~70 µs an event."""
    body = {}
    # a class is hashable; mypy checks type[Event] against Hashable by Event's own __hash__
    for name in _field_names(type(event), exclude):  # type: ignore[arg-type]
        value = getattr(event, name)
        if isinstance(value, ProcessKey):
            value = {"pid": value.pid, "start_time": value.start_time}
        elif type(value) is list and value and isinstance(value[0], ProcessKey):
            value = [{"pid": p.pid, "start_time": p.start_time} for p in value]
        body[name] = value
    return body


class Envelope(NamedTuple):
    """A decoded event plus who sent it and its sequence number (a tuple: one is made per
    event received, and a frozen dataclass's __init__ cost a tenth of decoding)."""

    src: str
    seq: int
    event: Event
