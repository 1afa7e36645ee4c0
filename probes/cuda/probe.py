"""cuda: uprobes on the CUDA libraries of GPU processes (launches, copies, syncs, allocations).

Opt-in (``probes.cuda_uprobes``). Loads ``cuda.bpf.c`` (two programs, told apart per
function by the uprobe's cookie) and measures what one uprobe hit costs on this host. For
each process that fdtrack finds holding NVIDIA fds, the control thread
(:mod:`~gpuwhy.probes.cuda.attach`) puts an uprobe and an uretprobe on every traced function
(:data:`~gpuwhy.probes.cuda.libraries.FUNCTIONS`) of each libcuda/libcudart it has mapped whose
build id is allowed, and watches the kill switch. Each flush turns the in-kernel figures
into one CudaStats per active process, detaches a process whose estimated probe cost passes
``probes.cuda_max_overhead_pct``, and sets the kill switch when probe errors pass
``probes.cuda_max_errors_per_second``. What it sees, what it costs and its caveats:
``probes/README.md``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwhy.clock import ClockConverter, now_ns
from gpuwhy.config import Config
from gpuwhy.errors import ProbeLoadError
from gpuwhy.events import CudaCall, CudaStats, Event, SourceHealth
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.cuda import control as cudactl
from gpuwhy.probes.cuda.attach import Attacher
from gpuwhy.probes.cuda.libraries import (
    FUNCTIONS,
    file_offsets,
    mapped_files,
    shape_flags,
)
from gpuwhy.probes.cuda.uprobe_multi import BPF_TRACE_UPROBE_MULTI, close_all
from gpuwhy.probes.cuda.uprobe_multi import attach as attach_multi
from gpuwhy.probes.fdtrack import RECORDS_PER_POLL, load_bpf

log = logging.getLogger(__name__)

NAME = "cuda"
BPF_SOURCE = Path(__file__).with_name("cuda.bpf.c")
CFLAGS = ("-DMAX_PROCS=4096", "-DMAX_ALLOCS=65536", "-DRINGBUF_PAGES=64", *shape_flags())
# Same order as the enums and arrays in cuda.bpf.c.
DIRECTIONS = ("htod", "dtoh", "dtod", "htoh", "unknown")
LAUNCH_KINDS = ("cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernel", "cudaLaunchKernelExC")
GRAPH_KINDS = ("cuGraphLaunch", "cudaGraphLaunch")
SYNC_KINDS = ("cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
              "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
COPY_FIELDS = ("count", "bytes", "ns", "async_count", "pinned_bytes", "pageable_bytes")
SYNC_FIELDS = ("count", "blocked_ns")
MEMORY_FIELDS = ("allocs", "alloc_bytes", "frees", "free_bytes", "host_allocs",
                 "host_alloc_bytes", "host_frees", "registers", "register_bytes")
DROP_REASONS = ("ringbuf_full", "rate_limited_call_events", "stats_map_full",
                "allocs_map_full", "pinned_slots_full", "inflight_storage_full",
                "stale_calls", "unreadable_arguments")
NOT_ERRORS = {"rate_limited_call_events"}
REASONS = ((1, "slow"), (2, "big"), (4, "error"))
HOST_STATES = {1: "pinned", 2: "pageable"}
# The trap into the kernel and back for one uprobe or uretprobe hit, which the programs
# cannot time themselves, is measured at load (_calibrate) on a libc function called from
# here; this is the fallback when that fails.
DEFAULT_TRAP_NS = 2000
CALIBRATION_CALLS = 2000
CALIBRATION_FUNCTION = "getppid"
CALIBRATION_COOKIE = 0xFFFF       # shape SH_CALIBRATE in cuda.bpf.c: counted nowhere
NAMES = {f.id: f.name for f in FUNCTIONS}


class CudaProbe:
    """``load()``, ``watch(process)`` for each GPU process, ``poll()`` and ``flush()`` from
    the probes' loop, ``close()``. Publishing happens on the caller's thread only."""

    def __init__(self, config: Config, publish: Callable[[Event], object],
                 clock: ClockConverter | None = None):
        self.config = config
        self.max_overhead = config["probes.cuda_max_overhead_pct"] / 100
        self.max_errors_per_second: int = config["probes.cuda_max_errors_per_second"]
        self._publish = publish
        self._clock = clock or ClockConverter()
        self._bpf: Any = None      # the loaded bcc.BPF (bcc has no types); None before load()
        self._keys: dict[int, ProcessKey] = {}
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()   # the attacher's events
        self._attacher = Attacher(self)
        self._ready = threading.Event()
        self._last: dict[int, array] = {}
        self._last_errors = 0
        self._last_flush = time.monotonic_ns()
        self.enabled = False
        self._epoch = 0
        self.disabled_reason: str | None = None
        self.trap_ns = DEFAULT_TRAP_NS
        self.counts = {"attached_probes": 0, "attach_failures": 0, "refused_libraries": 0,
                       "detached_overhead": 0, "records": 0}
        self._budget = RECORDS_PER_POLL

    # --- loading ---------------------------------------------------------------------------

    def load(self) -> None:
        """Compile and load the two programs (in this thread: bcc cannot compile on two
        threads at once), then start the control thread, which attaches."""
        self._compile()
        self._attacher.start()

    def _compile(self) -> None:
        started = time.monotonic()
        self._bpf = bpf = load_bpf(NAME, BPF_SOURCE, CFLAGS)
        try:
            self.programs = {
                retprobe: bpf.load_func(name, bpf.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI).fd
                for retprobe, name in ((False, b"cuda_enter"), (True, b"cuda_leave"))}
        except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception
            raise ProbeLoadError(NAME, f"{exc} (uprobe_multi programs need Linux 6.6 or "
                                       f"later; this is {os.uname().release})") from None
        self._stats = bpf[b"stats"]
        self._drops = bpf[b"drops"]
        leaf = self._stats.Leaf             # only u64 fields
        self._layout = {name: slice(getattr(leaf, name).offset // 8,
                                    (getattr(leaf, name).offset + getattr(leaf, name).size) // 8)
                        for name, _ in leaf._fields_}
        bpf[b"records"].open_ring_buffer(self._on_record)
        reason = cudactl.disabled_reason(self.config)
        self.set_enabled(reason is None, reason)
        log.info("cuda uprobes: programs loaded in %.1f s", time.monotonic() - started)
        self._ready.set()
        try:
            self.trap_ns = self._calibrate()
            log.info("cuda uprobes: one uprobe hit costs ~%d ns here", self.trap_ns)
        except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception; a guess will do
            log.warning("cuda uprobes: could not measure the uprobe cost (%s); assuming %d ns",
                        exc, DEFAULT_TRAP_NS)
        self._last_errors = self._errors()

    def _calibrate(self) -> int:
        """ns one uprobe hit costs besides the program: a libc function called from this
        process, timed without and with an entry and a return probe on it."""
        from bcc import BPF

        libc = next((m for m in mapped_files(os.getpid()) if "/libc.so" in m), None)
        if libc is None:
            raise ValueError("libc not found in /proc/self/maps")
        addresses = dict((n.decode(), a) for n, a in BPF.get_user_functions_and_addresses(
            libc.encode(), f"^{CALIBRATION_FUNCTION}$".encode()))
        offsets = list(file_offsets(libc, addresses).values())[:1]
        if not offsets:
            raise ValueError(f"{CALIBRATION_FUNCTION} not found in {libc}")
        function = getattr(ctypes.CDLL(None), CALIBRATION_FUNCTION)

        def per_call() -> float:
            started = time.perf_counter_ns()
            for _ in range(CALIBRATION_CALLS):
                function()
            return (time.perf_counter_ns() - started) / CALIBRATION_CALLS

        bare = min(per_call() for _ in range(3))
        links = [attach_multi(self.programs[r], libc, offsets, [CALIBRATION_COOKIE],
                              pid=os.getpid(), retprobe=r) for r in (False, True)]
        try:
            probed = min(per_call() for _ in range(3))
        finally:
            close_all(links)
        totals = self._totals().get(os.getpid())
        self.forget(os.getpid())
        program_ns = totals[self._layout["prog_ns"]][0] / max(totals[self._layout["hits"]][0], 1) \
            if totals else 0
        return max(int((probed - bare) / 2 - program_ns), 0)

    def set_enabled(self, enabled: bool, reason: str | None = None) -> None:
        """Turn every program on or off in the kernel, at once."""
        table = self._bpf[b"config"]
        cfg = table.Leaf()
        if enabled and not self.enabled:
            self._epoch += 1
        cfg.enabled = int(enabled)
        cfg.epoch = self._epoch
        cfg.events_per_sec = self.config["probes.error_events_per_second"]
        cfg.slow_ns = int(self.config["probes.cuda_slow_call_ms"] * 1_000_000)
        cfg.big_bytes = self.config["probes.cuda_big_copy_bytes"]
        table[ctypes.c_int(0)] = cfg
        self.enabled, self.disabled_reason = enabled, reason

    # --- the caller's side -----------------------------------------------------------------

    def watch(self, process: ProcessKey, since_start: bool = True) -> None:
        """Trace ``process`` (it holds NVIDIA fds); ``since_start`` is False when it was
        found already running."""
        if self._keys.get(process.pid) == process:
            return
        self._keys[process.pid] = process
        self._attacher.requests.put(("watch", process, since_start))

    def unwatch(self, pid: int) -> None:
        """The process exited: publish its last figures, then detach and forget it."""
        if pid in self._keys:
            self.flush(only_pid=pid)
            del self._keys[pid]
            self._last.pop(pid, None)
            self._attacher.requests.put(("unwatch", pid))

    def _drain(self) -> None:
        while True:
            try:
                self._publish(self.outbox.get_nowait())
            except queue.Empty:
                return

    def poll(self, timeout_ms: int = 0) -> None:
        """Read the ring's records, RECORDS_PER_POLL at most (fdtrack.py says why: memory)."""
        if self._ready.is_set():
            self._budget = RECORDS_PER_POLL
            self._bpf.ring_buffer_poll(timeout_ms)
        self._drain()

    def _on_record(self, ctx: object, data: object, size: int) -> int:
        self._budget -= 1
        self._handle(self._bpf[b"records"].event(data))
        return -1 if self._budget <= 0 else 0     # < 0: libbpf stops reading the ring

    def _handle(self, record: Any) -> None:
        self.counts["records"] += 1
        process = self._keys.get(record.tgid)
        if process is None:
            return
        is_copy = record.host != 0 or "Memcpy" in NAMES.get(record.fn, "")
        self._publish(CudaCall(
            ts=self._clock.realtime_from_monotonic(record.ktime_ns), raw_ts=record.ktime_ns,
            process=process, tid=record.tid, api=NAMES.get(record.fn, f"#{record.fn}"),
            latency_ns=record.latency_ns, ret=record.ret, bytes=record.bytes,
            direction=DIRECTIONS[record.direction] if is_copy else None,
            host=HOST_STATES.get(record.host),
            reasons=[name for bit, name in REASONS if record.reasons & bit]))

    def _totals(self) -> dict[int, array]:
        """Each process's words (one value for all CPUs: the programs add atomically)."""
        return {key.value: array("Q", bytes(value)) for key, value in self._stats.items()}

    def flush(self, only_pid: int | None = None) -> None:
        """Publish one CudaStats per process that called CUDA since the last flush; detach
        processes whose estimated probe cost is too high; turn everything off on too many
        errors."""
        if not self._ready.is_set():
            self._drain()
            return
        now = time.monotonic_ns()
        interval = max(now - self._last_flush, 1)
        ts = now_ns()
        for pid, totals in self._totals().items():
            process = self._keys.get(pid)
            if process is None or (only_pid is not None and pid != only_pid):
                continue
            previous = self._last.get(pid) or array("Q", bytes(len(totals) * 8))
            self._last[pid] = totals
            delta = [a - b for a, b in zip(totals, previous, strict=True)]
            if not delta[self._layout["hits"]][0]:
                continue
            event = self._stats_event(ts, process, interval, delta)
            self._publish(event)
            if only_pid is None and event.overhead_ns > self.max_overhead * interval:
                share = 100 * event.overhead_ns / interval
                self._attacher.requests.put(("detach", pid, f"estimated probe cost {share:.1f}% "
                                             f"of a CPU passed probes.cuda_max_overhead_pct"))
        if only_pid is None:
            self._last_flush = now
            self._check_errors(interval)
        self._drain()

    def _stats_event(self, ts: int, process: ProcessKey, interval: int,
                     delta: list[int]) -> CudaStats:
        def part(name: str) -> list[int]:
            return delta[self._layout[name]]

        def one(name: str) -> int:
            return part(name)[0]

        copies, syncs = part("copies"), part("syncs")
        width, sync_width = len(COPY_FIELDS), len(SYNC_FIELDS)
        return CudaStats(
            ts=ts, process=process, interval_ns=interval, calls=one("calls"),
            errors=one("errors"), launches=dict(zip(LAUNCH_KINDS, part("launches"), strict=True)),
            grid_log2=part("grid_log2"), block_log2=part("block_log2"),
            graph_launches=sum(part("graph_launches")),
            copies={d: dict(zip(COPY_FIELDS, copies[i * width:(i + 1) * width], strict=True))
                    for i, d in enumerate(DIRECTIONS)},
            syncs={k: dict(zip(SYNC_FIELDS, syncs[i * sync_width:(i + 1) * sync_width],
                               strict=True))
                   for i, k in enumerate(SYNC_KINDS)},
            sync_log2=part("sync_log2"),
            memory={name: one(name) for name in MEMORY_FIELDS},
            traced_since_start=self._since_start(process.pid),
            overhead_ns=one("hits") * self.trap_ns + one("prog_ns"))

    def _since_start(self, pid: int) -> bool:
        watched = self._attacher.watched.get(pid)
        return watched.since_start if watched else True

    def drops(self) -> dict[str, int]:
        if not self._ready.is_set():
            return {}
        return {f"dropped_{reason}": int(self._drops.sum(ctypes.c_int(i)).value)
                for i, reason in enumerate(DROP_REASONS)}

    def _errors(self) -> int:
        return sum(v for k, v in self.drops().items()
                   if k.removeprefix("dropped_") not in NOT_ERRORS)

    def _check_errors(self, interval_ns: int) -> None:
        errors = self._errors()
        rate = (errors - self._last_errors) * 1e9 / interval_ns
        self._last_errors = errors
        if self.enabled and rate > self.max_errors_per_second:
            cudactl.disable(self.config, f"probe errors {rate:.0f}/s passed "
                                         f"probes.cuda_max_errors_per_second")

    def health(self) -> SourceHealth:
        counters = {**self.drops(), **self.counts,
                    "traced_processes": sum(1 for w in list(self._attacher.watched.values())
                                            if w.libraries)}
        detail = "" if self.enabled else f"off: {self.disabled_reason}"
        return SourceHealth(ts=now_ns(), source=NAME,
                            state="ok" if self.enabled else "degraded", detail=detail,
                            counters=counters)

    def forget(self, pid: int) -> None:
        """Drop what the kernel kept about an exited process."""
        for table, key in ((self._stats, self._stats.Key(pid)),
                           (self._bpf[b"pinned"], ctypes.c_uint32(pid))):
            try:
                del table[key]
            except KeyError:
                pass
        allocs = self._bpf[b"dev_allocs"]
        for key in [k for k in allocs.keys() if k.tgid == pid]:
            try:
                del allocs[key]
            except KeyError:
                pass

    def close(self) -> None:
        self._attacher.stop()
        if self._bpf is not None and self._ready.is_set():
            self.set_enabled(False, "probes stopped")
            self._attacher.write_state()
            self._bpf.cleanup()
            self._bpf = None
