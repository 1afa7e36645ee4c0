"""fdtrack: NVIDIA device fds per process and every driver call on them, decoded.

Loads ``fdtrack.bpf.c``, fills its decode tables from :mod:`gpuwhy.nvioctl`, seeds it
with the device fds processes already held (``/proc/*/fd`` scan), and turns its records
and per-CPU statistics into bus events through :class:`~gpuwhy.probes.fdtable.FdTable`.
What it sees, what it costs and its caveats: ``probes/README.md``.
"""

from __future__ import annotations

import ctypes
import enum
import fnmatch
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwhy.caps import can_load_bpf
from gpuwhy.clock import CLOCK_TICKS_PER_SECOND, NS_PER_SECOND, ClockConverter, now_ns
from gpuwhy.config import SETTINGS_BY_NAME, Config, environment_names
from gpuwhy.errors import NoSuchProcess, ProbeLoadError
from gpuwhy.events import DriverCall, Event, ProcessSeen, SourceHealth
from gpuwhy.identity import classify_device
from gpuwhy.nvioctl import (
    ALLOC_PARAMS_SIZE_OFFSET,
    FRONTEND_DECODE,
    HEAP_ALLOC_FUNCTIONS,
    MEMORY_CLASSES,
    NOTABLE_CONTROLS,
    NV_IOCTL_MAGIC,
    VERSION_STRING_LEN,
    VERSION_STRING_OFFSET,
    DecodeFlag,
    ioctl_name,
    parse_driver_version,
    status_name,
    sub_name,
    uvm_decode,
)
from gpuwhy.probes.bpfdefs import (
    CLONE_THREAD,
    SYSCALL_DEFINES,
    Define,
    Hex,
    c_lookup,
    c_member_of,
    cflags,
    enum_defines,
    header,
)
from gpuwhy.probes.bpfmaps import MapReader
from gpuwhy.probes.btf import BTFError, task_offsets
from gpuwhy.probes.fdtable import LAT_BUCKETS, FdTable, OpStats
from gpuwhy.probes.procscan import inherited, literal_prefix, scan_open_devices
from gpuwhy.proc import read_process

log = logging.getLogger(__name__)

NAME = "fdtrack"
BPF_STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
BPF_SOURCE = Path(__file__).with_name("fdtrack.bpf.c")
TRACEFS = ("/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events")
_NOT_READ = (None,)         # the last read of a stats entry new to this one

# --- what fdtrack.bpf.c shares with this file: defined here (and in gpuwhy/nvioctl.py),
# compiled in through bpf_defines() ----------------------------------------------------


class EventType(enum.IntEnum):
    """What a ring-buffer record reports (``event_t.type``; EV_<NAME> in the C)."""

    OPEN = 1
    CLOSE = 2
    EXIT = 3
    DUP = 4
    CALL = 5
    FORK = 6
    EXEC = 7
    CLOSE_RANGE = 8
    INHERIT = 9


class Drop(enum.IntEnum):
    """Why a record or a map entry was lost: its slot in the per-CPU ``drops`` array."""

    RINGBUF = 0
    TRACKED_FULL = 1
    STATS_FULL = 2
    INFLIGHT_FULL = 3
    PENDING_FULL = 4
    RATE_LIMITED = 5


DROP_REASONS: dict[Drop, str] = {       # counted as dropped_<reason>
    Drop.RINGBUF: "ringbuf_full", Drop.TRACKED_FULL: "tracked_map_full",
    Drop.STATS_FULL: "stats_map_full", Drop.INFLIGHT_FULL: "inflight_storage_full",
    Drop.PENDING_FULL: "pending_map_full", Drop.RATE_LIMITED: "rate_limited_call_events",
}


class CallFlag(enum.IntFlag):
    """What the probe adds to a call's flags, above the DecodeFlag bits (CALL_<NAME>)."""

    XFERRED = 1 << 16      # unwrapped from NV_ESC_IOCTL_XFER_CMD
    ERROR = 1 << 17
    SLOW = 1 << 18
    BIG = 1 << 19


# Plain ints for the read loop: ``flags & IntFlag`` builds an enum member each time (~15×
# the cost of an int's ``&``), and every call record tests six bits.
CALL_REASONS = tuple((int(bit), name) for bit, name in (
    (DecodeFlag.NOTABLE, "notable"), (CallFlag.SLOW, "slow"), (CallFlag.ERROR, "error"),
    (CallFlag.BIG, "big")))
REPEATABLE_REASONS = frozenset({"error", "big"})   # sent under the budget, not for themselves
_HAS_VERSION, _HAS_GPU_IDS = int(DecodeFlag.VERSION), int(DecodeFlag.GPU_IDS)
PREFIX_LEN = 64            # of the device path, compared in the kernel
PATH_LEN = 128             # a record's data: the path, version string or GPU ids
HINT_SLOTS = 1 << 16       # per-pid hint arrays (a power of two: the C masks)
MAX_TRACKED = 65536
MAX_RECENT_CALLS = 4096    # kinds of failed or big calls remembered for repeated() in the C
RINGBUF_PAGES = 256
# Records one poll reads at most. A poll's events are held in one batch until it ends, each
# held payload ~8 KB (orjson leaves its output buffer's spare room allocated), and libbpf
# reads a ring until it is empty: a process issuing a million notable calls a second kept
# one poll reading for the whole storm, 60,000 events in one batch, and the probes grew
# from 48 MB to 3 GB. Past this the read stops (the callback returns -1); the rest waits in
# the ring, and what the ring cannot hold is dropped there and counted (dropped_ringbuf_full).
RECORDS_PER_POLL = 512
DECODE_VARIANTS = 3        # layouts per decode slot
DECODE_SLOTS = 512         # escapes at their number, UVM commands < 256 at 256 + it, and:
UVM_SLOT_BASE = 256
UVM_HIGH_SLOTS = {0x30000001: 510, 0x30000002: 511, 2047: 509}   # INITIALIZE, DEINIT, IS_8
MAX_NOTABLE_CONTROLS = 256
MAX_MEMORY_CLASSES = 64
# The notable_hint array rules most controls out before the hash-map lookup: slot =
# Knuth's multiplicative hash, the top NOTABLE_HINT_BITS bits of control * 2^32/phi.
NOTABLE_HINT_BITS = 8
NOTABLE_HINT_SLOTS = 1 << NOTABLE_HINT_BITS
NOTABLE_HASH_MULTIPLIER = 2654435761
USER_SEQ_BASE = 1 << 62   # open_seqs user space makes up never meet the kernel's
# sys_enter_ioctl's tail calls (the enter_tails prog array): each slot's C name, in slot
# order, and the program it holds.
ENTER_TAILS = {"ENTER_INHERIT": b"enter_inherit",
               "ENTER_AGAIN": b"tracepoint__syscalls__sys_enter_ioctl"}


def notable_hint_slot(control: int) -> int:
    """The notable_hint slot of an RM control (NOTABLE_HINT_SLOT() in the C)."""
    return ((control * NOTABLE_HASH_MULTIPLIER) & 0xFFFFFFFF) >> (32 - NOTABLE_HINT_BITS)


def bpf_defines(max_stats: int = SETTINGS_BY_NAME["probes.max_call_stats"].default
                ) -> dict[str, Define]:
    """Every constant fdtrack.bpf.c shares with Python, by its C name; ``max_stats``: the
    driver-call statistics it keeps at most (probes.max_call_stats)."""
    return {
        "HINT_SLOTS": HINT_SLOTS, "MAX_TRACKED": MAX_TRACKED, "MAX_STATS": max_stats,
        "MAX_RECENT_CALLS": MAX_RECENT_CALLS,
        "RINGBUF_PAGES": RINGBUF_PAGES, "DECODE_VARIANTS": DECODE_VARIANTS,
        "DECODE_SLOTS": DECODE_SLOTS, "UVM_SLOT_BASE": UVM_SLOT_BASE,
        "PREFIX_LEN": PREFIX_LEN, "PATH_LEN": PATH_LEN, "LAT_BUCKETS": LAT_BUCKETS,
        "MAX_NOTABLE_CONTROLS": MAX_NOTABLE_CONTROLS, "MAX_MEMORY_CLASSES": MAX_MEMORY_CLASSES,
        "NOTABLE_HINT_SLOTS": NOTABLE_HINT_SLOTS,
        "ENTER_TAILS": len(ENTER_TAILS), **{name: slot for slot, name in enumerate(ENTER_TAILS)},
        "NV_IOCTL_MAGIC": Hex(NV_IOCTL_MAGIC),
        "ALLOC_PARAMS_SIZE_OFFSET": ALLOC_PARAMS_SIZE_OFFSET,
        "VERSION_STRING_OFFSET": VERSION_STRING_OFFSET,
        "VERSION_STRING_LEN": VERSION_STRING_LEN,
        "CLONE_THREAD_FLAG": CLONE_THREAD,
        **SYSCALL_DEFINES,
        **enum_defines("F_", DecodeFlag),
        **enum_defines("CALL_", CallFlag),
        **enum_defines("EV_", EventType),
        **enum_defines("DROP_", Drop),
        "N_DROP_REASONS": len(Drop),
        "NOTABLE_HINT_SLOT(c)": (f"((u32)((u32)(c) * {NOTABLE_HASH_MULTIPLIER:#x}U) >> "
                                 f"{32 - NOTABLE_HINT_BITS})"),
        "UVM_HIGH_SLOT(code)": c_lookup("code", UVM_HIGH_SLOTS, -1),
        "IS_HEAP_ALLOC(function)": c_member_of("function", HEAP_ALLOC_FUNCTIONS),
    }


CFLAGS = cflags(bpf_defines())


def bpf_stats_enabled(sysctl: Path = BPF_STATS_SYSCTL) -> bool:
    """Whether the kernel times every BPF program run: two clock reads more per probe run
    (~250 ns per traced ioctl measured in a VM), a cost the host chose for profiling that
    looks like the probes' own."""
    try:
        return sysctl.read_text().strip() == "1"
    except OSError:
        return False


def decode_slot(space: int, code: int) -> int:
    """Index of a command in the kernel's decode array (same as decode_slot() in the C)."""
    if space == 0:
        return code & 0xFF
    slot = UVM_HIGH_SLOTS.get(code)
    if slot is None and code < UVM_SLOT_BASE:
        slot = UVM_SLOT_BASE + code
    if slot is None:
        raise ValueError(f"UVM command {code:#x} has no decode slot")
    return slot


def ebpf_text() -> str:
    """The BPF C program and the definitions it is compiled with (what ``--ebpf`` prints)."""
    return header(bpf_defines(), "gpuwhy/nvioctl.py and probes/fdtrack.py") + \
        BPF_SOURCE.read_text()


def load_bpf(name: str, source: Path, cflags: tuple[str, ...]) -> Any:
    """Compile and attach a bcc program; every way it fails becomes a ProbeLoadError."""
    if not can_load_bpf():
        raise ProbeLoadError(name, "needs CAP_BPF and CAP_PERFMON; run as root or as "
                                   "systemd/gpuwhy-probes.service does")
    if not any(os.path.isdir(p) for p in TRACEFS):
        raise ProbeLoadError(name, "tracefs is not mounted; fix: "
                                   "mount -t tracefs tracefs /sys/kernel/tracing")
    try:
        from bcc import BPF
    except ImportError:
        raise ProbeLoadError(name, "bcc is not importable; fix: apt-get install python3-bpfcc "
                                   "and use a venv made with --system-site-packages") from None
    try:
        return BPF(src_file=str(source).encode(), cflags=list(cflags))
    except Exception as exc:  # bcc raises bare Exception for compile and attach failures
        raise ProbeLoadError(name, f"{exc} (are kernel headers at "
                                   f"/lib/modules/{os.uname().release}/build?)") from None


def loaded_driver_version(setting: str, sys_root: str) -> tuple[int, ...] | None:
    """The NVIDIA driver's version: the setting's, else the loaded module's; None when
    neither says (no driver here, or sysfs not mounted where told)."""
    if setting:
        return parse_driver_version(setting)
    try:
        return parse_driver_version(Path(sys_root, "module/nvidia/version").read_text())
    except OSError:
        return None


class FdTrackProbe:
    """The fdtrack probe: ``load()``, then ``run(stop)``; every event goes to ``publish``.

    ``trace=True`` loads it for ``gpuwhy trace``: every call becomes a DriverCall event
    (``pid`` limits that to one process).
    """

    def __init__(self, config: Config, publish: Callable[[Event], object],
                 clock: ClockConverter | None = None,
                 bus_counters: Callable[[], dict[str, int]] = dict,
                 trace: bool = False, pid: int = 0):
        self.device_glob: str = config["probes.device_glob"]
        self.poll_interval: float = config["probes.poll_interval"]
        self.proc_root: str = config["probes.proc_root"]
        # root reads any process's environment: the variables rules read travel in ProcessSeen
        self.environment = environment_names(config["probes.environment"])
        self.max_call_stats: int = config["probes.max_call_stats"]
        self.slow_ns = int(config["probes.slow_call_ms"] * 1_000_000)
        self.big_bytes: int = config["probes.big_alloc_bytes"]
        self.error_events_per_sec: int = config["probes.error_events_per_second"]
        self.repeat_ns = int(config["probes.repeat_seconds"] * NS_PER_SECOND)
        self.driver_version = loaded_driver_version(config["probes.driver_version"],
                                                    config["probes.sys_root"])
        self.trace = trace
        self.pid = pid
        self._publish = publish
        self._bus_counters = bus_counters
        self._clock = clock or ClockConverter()
        self.table = FdTable(self._resolve)
        self.records = 0
        self.filtered = 0
        self.capped_polls = 0      # polls that stopped at RECORDS_PER_POLL, the ring not empty
        self._budget = RECORDS_PER_POLL
        self.repeats = 0           # failed or big calls user space found repeated
        # each stats entry's last read, by its key's bytes: (its count, what read_stats said)
        self._last_read: dict[bytes, tuple[int, tuple]] = {}
        self._reported: dict[tuple, int] = {}      # a repeatable call's kind -> when sent
        self.task_offsets_error: str | None = None
        self._bpf: Any = None      # the loaded bcc.BPF (bcc has no types); None before load()
        self._user_seq = USER_SEQ_BASE

    # --- loading ---------------------------------------------------------------------------

    def _resolve(self, pid: int, ts: int) -> ProcessSeen | None:
        try:
            return read_process(pid, ts, self.proc_root, self.environment)
        except NoSuchProcess:
            return None

    def _emit(self, events: list[Event]) -> None:
        for event in events:
            self._publish(event)

    def load(self) -> None:
        """Compile, attach, configure, then scan /proc (attach first: no gap)."""
        self._bpf = bpf = load_bpf(NAME, BPF_SOURCE, cflags(bpf_defines(self.max_call_stats)))
        self._events = bpf[b"events"]
        self._tracked = bpf[b"tracked"]
        self._hint_user = bpf[b"proc_hint_user"]
        self._stats = bpf[b"op_stats"]
        self._stats_reader = MapReader(self._stats)
        self._drops = bpf[b"drops"]
        self._kernel_repeats = bpf[b"repeats"]
        self._configure(bpf)
        self._fill_tails(bpf)
        self._events.open_ring_buffer(self._on_record)
        if not self.trace or not self.pid:
            self.scan()
        else:
            self.scan(only_pid=self.pid)

    def _fill_tails(self, bpf: Any) -> None:
        from bcc import BPF

        tails = bpf[b"enter_tails"]
        for slot, (name, function) in enumerate(ENTER_TAILS.items()):
            try:
                program = bpf.load_func(function, BPF.TRACEPOINT)
            except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception
                raise ProbeLoadError(NAME, f"tail call {name}: {exc}") from None
            tails[ctypes.c_int(slot)] = ctypes.c_int(program.fd)

    def _configure(self, bpf: Any) -> None:
        table = bpf[b"config"]
        cfg = table.Leaf()
        prefix = literal_prefix(self.device_glob).encode()[:PREFIX_LEN]
        cfg.prefix_len = len(prefix)
        cfg.prefix = prefix
        cfg.emit_all = int(self.trace)
        cfg.filter_tgid = self.pid
        cfg.error_events_per_sec = self.error_events_per_sec
        cfg.slow_ns = self.slow_ns
        cfg.big_bytes = self.big_bytes
        cfg.repeat_ns = self.repeat_ns
        cfg.ns_per_tick = NS_PER_SECOND // CLOCK_TICKS_PER_SECOND
        try:
            offsets = task_offsets()
            cfg.task_offsets_valid = 1
            cfg.off_group_leader = offsets.group_leader
            cfg.off_start_boottime = offsets.start_boottime
            cfg.off_tgid = offsets.tgid
        except BTFError as exc:
            self.task_offsets_error = str(exc)
            log.warning("no kernel BTF (%s): process start times come from /proc", exc)
        table[ctypes.c_int(0)] = cfg

        decode = bpf[b"decode"]
        slots: dict[int, list] = {}
        uvm = uvm_decode(self.driver_version)
        for space, entries in ((0, FRONTEND_DECODE), (1, {(c, 0): d for c, d in uvm.items()})):
            for (code, size), spec in entries.items():
                slots.setdefault(decode_slot(space, code), []).append((size, spec))
        for index, variants in slots.items():
            leaf = decode.Leaf()
            for i, (size, spec) in enumerate(variants):
                leaf.v[i].size = size
                leaf.v[i].valid = 1
                leaf.v[i].d = type(leaf.v[i].d)(spec.status, spec.arg0[0], spec.arg0[1],
                                                  spec.arg1[0], spec.arg1[1], spec.flags)
            decode[ctypes.c_int(index)] = leaf
        for name, values in ((b"notable_controls", NOTABLE_CONTROLS),
                             (b"memory_classes", MEMORY_CLASSES)):
            table = bpf[name]
            for value in values:
                table[ctypes.c_uint32(value)] = ctypes.c_uint32(1)
        hint = bpf[b"notable_hint"]
        for control in NOTABLE_CONTROLS:
            hint[ctypes.c_int(notable_hint_slot(control))] = ctypes.c_uint32(1)

    # --- user-side changes to the kernel's fd table -------------------------------------

    def _next_user_seq(self) -> int:
        self._user_seq += 1
        return self._user_seq

    def _hint(self, tgid: int, delta: int) -> None:
        slot = ctypes.c_int(tgid % HINT_SLOTS)
        self._hint_user[slot] = ctypes.c_int(self._hint_user[slot].value + delta)

    def _kernel_track(self, tgid: int, fd: int, open_seq: int, cloexec: bool) -> bool:
        key = self._tracked.Key(tgid, fd)
        if key in self._tracked:
            return False
        self._tracked[key] = self._tracked.Leaf(open_seq, int(cloexec), 0)
        self._bpf[b"tracked_procs"][ctypes.c_uint32(tgid)] = ctypes.c_uint32(1)
        self._hint(tgid, 1)
        return True

    def _kernel_untrack(self, tgid: int, fds: list[int]) -> None:
        for fd in fds:
            try:
                del self._tracked[self._tracked.Key(tgid, fd)]
            except KeyError:
                continue      # the kernel closed it itself (and counted that)
            self._hint(tgid, -1)

    def scan(self, only_pid: int = 0) -> int:
        """Track device fds that were open before we attached; returns how many."""
        found = 0
        devices = list(scan_open_devices(self.device_glob, self.proc_root))
        forked = inherited(devices, self.proc_root)
        for open_device in devices:
            if only_pid and open_device.pid != only_pid:
                continue
            seq = self._next_user_seq()
            if not self._kernel_track(open_device.pid, open_device.fd, seq, False):
                continue          # opened while we were scanning: the kernel saw it
            how = "inherited" if (open_device.pid, open_device.fd) in forked else "scan"
            self._emit(self.table.opened(open_device.pid, open_device.fd, seq,
                                         open_device.path, now_ns(), how=how))
            found += 1
        log.info("start-up scan: %d open device fds matching %s", found, self.device_glob)
        return found

    # --- records ---------------------------------------------------------------------------

    def _on_record(self, ctx: object, data: object, size: int) -> int:
        record = self._events.event(data)
        self.records += 1
        self._budget -= 1
        ts = self._clock.realtime_from_monotonic(record.ktime_ns)
        handler = self._handlers.get(record.type)
        if handler is None:
            log.warning("unknown fdtrack record type %d", record.type)
        else:
            self._emit(handler(self, record, ts))
        return -1 if self._budget <= 0 else 0     # < 0: libbpf stops reading the ring

    def _on_open(self, record: Any, ts: int) -> list[Event]:
        path = bytes(record.data).split(b"\0", 1)[0].decode("utf-8", errors="replace")
        if not fnmatch.fnmatchcase(path, self.device_glob):
            self.filtered += 1       # the prefix matched, the whole glob does not
            self._kernel_untrack(record.tgid, [record.fd])
            return []
        return self.table.opened(record.tgid, record.fd, record.open_seq, path, ts,
                                 cloexec=bool(record.cloexec), start_ticks=record.start_ticks)

    def _on_dup(self, record: Any, ts: int) -> list[Event]:
        return self.table.duped(record.tgid, record.fd, record.open_seq, record.aux, ts,
                                cloexec=bool(record.cloexec), start_ticks=record.start_ticks)

    def _on_close(self, record: Any, ts: int) -> list[Event]:
        return self.table.closed(record.tgid, record.fd, record.open_seq, ts)

    def _on_close_range(self, record: Any, ts: int) -> list[Event]:
        events, closed, cloexec = self.table.close_range(record.tgid, record.fd, record.aux,
                                                          record.cloexec, ts)
        self._kernel_untrack(record.tgid, closed)
        for fd in cloexec:
            key = self._tracked.Key(record.tgid, fd)
            if key in self._tracked:
                info = self._tracked[key]
                self._tracked[key] = self._tracked.Leaf(info.open_seq, 1, 0)
        return events

    def _on_fork(self, record: Any, ts: int) -> list[Event]:
        """A tracked process forked (the kernel told threads apart): copy its fd table.
        Where the kernel already copied an fd (the child used it first), take its seq."""
        child = record.aux

        def seq_for(fd: int) -> int:
            key = self._tracked.Key(child, fd)
            if key in self._tracked:
                return self._tracked[key].open_seq
            return self._next_user_seq()

        events, inherited = self.table.forked(record.tgid, child, ts, seq_for)
        for tracked in inherited:
            # The parent's close-on-exec flag as the kernel map has it: FD(N)CLEX changes
            # it there only, and the user-space copy may be stale (a child that exec'd
            # then lost an fd it had been made to inherit).
            parent = self._tracked.Key(record.tgid, tracked.fd)
            cloexec = bool(self._tracked[parent].cloexec) if parent in self._tracked \
                else tracked.cloexec
            if not self._kernel_track(child, tracked.fd, tracked.open_seq, cloexec):
                # the child's first call on it came between seq_for and here (reading the
                # child's /proc takes a while): the kernel's copy and seq stand
                key = self._tracked.Key(child, tracked.fd)
                if key in self._tracked:
                    self.table.adopt_seq(child, tracked.fd, self._tracked[key].open_seq)
        return events

    def _on_inherit(self, record: Any, ts: int) -> list[Event]:
        """The child used an inherited fd before we copied its table; the kernel copied it."""
        known = self.table.fds.get((record.tgid, record.fd))
        if known is not None:
            if known.how == "fork":      # our copy, made under our seq: the kernel's stands
                self.table.adopt_seq(record.tgid, record.fd, record.open_seq)
            return []
        parent = self.table.fds.get((record.aux, record.fd))
        if parent is None:
            return []
        return self.table.opened(record.tgid, record.fd, record.open_seq, parent.path, ts,
                                 how="fork", cloexec=bool(record.cloexec),
                                 start_ticks=record.start_ticks)

    def _on_exec(self, record: Any, ts: int) -> list[Event]:
        cloexec_now = {}
        for tracked in self.table.fds_of(record.tgid):
            key = self._tracked.Key(record.tgid, tracked.fd)
            if key in self._tracked:
                cloexec_now[tracked.fd] = bool(self._tracked[key].cloexec)
        events, closed = self.table.executed(record.tgid, ts, cloexec_now)
        self._kernel_untrack(record.tgid, closed)
        return events

    def _on_exit(self, record: Any, ts: int) -> list[Event]:
        events, fds = self.table.exited(record.tgid, ts)
        self._kernel_untrack(record.tgid, fds)   # an exit closes no fd one by one
        return events

    def _on_call(self, record: Any, ts: int) -> list[Event]:
        tracked = self.table.fds.get((record.tgid, record.fd))
        path = tracked.path if tracked else "?"
        device = tracked.device if tracked else classify_device(path)[0]
        seen, events = self.table.process(record.tgid, ts, record.start_ticks)
        reasons = [name for bit, name in CALL_REASONS if record.flags & bit]
        if self.trace:
            reasons.append("traced")
        elif self._repeated(record, reasons, ts):
            return events
        data = ctypes.string_at(ctypes.addressof(record) + type(record).data.offset,
                                PATH_LEN)  # raw: ctypes stops a char array at NUL
        version = gpu_ids = None
        if record.flags & _HAS_VERSION:
            version = data.split(b"\0", 1)[0].decode("ascii", errors="replace")
        elif record.flags & _HAS_GPU_IDS:
            count = min(record.size, len(data)) // 4
            gpu_ids = [i for i in (int.from_bytes(data[4 * n:4 * n + 4], "little")
                                   for n in range(count)) if i]
        cmd = record.cmd
        events.append(DriverCall(
            ts=ts, process=seen.process, tid=record.tid, fd=record.fd, path=path,
            device=device, cmd=cmd, nr=record.nr, size=record.size,
            op=ioctl_name(cmd, device), latency_ns=record.latency_ns, ret=record.ret,
            status=record.status, status_name=status_name(record.status), sub=record.sub,
            sub_name=sub_name(cmd, device, record.sub), arg0=record.arg0, arg1=record.arg1,
            bytes=record.bytes, version=version, gpu_ids=gpu_ids, reasons=reasons,
            raw_ts=record.ktime_ns))
        return events

    def _repeated(self, record: Any, reasons: list[str], ts: int) -> bool:
        """Whether this call, sent only for failing or being big, is like one sent less
        than ``repeat_ns`` ago: a process retrying an unsupported call 50 times a second
        says nothing new after the first, and each one stored cost the sidecar more than
        the rest of that process's figures. Its statistics count every call."""
        if not self.repeat_ns or not reasons or not set(reasons) <= REPEATABLE_REASONS:
            return False
        kind = (record.tgid, record.start_ticks, record.open_seq, record.cmd, record.sub,
                record.ret, record.status, tuple(reasons))
        sent = self._reported.get(kind)
        if sent is not None and ts - sent < self.repeat_ns:
            self.repeats += 1
            return True
        self._reported[kind] = ts
        return False

    def _forget_reported(self, now: int) -> None:
        self._reported = {kind: sent for kind, sent in self._reported.items()
                          if now - sent < self.repeat_ns}

    _handlers = {EventType.OPEN: _on_open, EventType.DUP: _on_dup,
                 EventType.CLOSE: _on_close, EventType.CLOSE_RANGE: _on_close_range,
                 EventType.FORK: _on_fork, EventType.EXEC: _on_exec,
                 EventType.EXIT: _on_exit, EventType.CALL: _on_call,
                 EventType.INHERIT: _on_inherit}

    # --- statistics ------------------------------------------------------------------------

    def read_stats(self) -> list[tuple[object, int, int, int, OpStats]]:
        """The stats map's entries: (key, open_seq, cmd, sub, stats)."""
        entries = []
        last, read = self._last_read, {}
        # An entry whose count did not move since the last read says the same: most of a
        # busy process's operations are not called every second. Such an entry is not
        # copied out of the read's buffer again (MapReader.marked).
        for key_bytes, count, key, value in self._stats_reader.marked(
                "count", lambda key_bytes, count: last.get(key_bytes, _NOT_READ)[0] != count):
            if key is None:
                held = read[key_bytes] = last[key_bytes]
                entries.append(held[1])
                continue
            entry = (key, key.open_seq, key.cmd, key.sub,
                     OpStats(value.count, value.errors, value.latency_sum_ns,
                             value.latency_max_ns, value.bytes,
                             list(value.latency_log2[:LAT_BUCKETS])))
            read[key_bytes] = (count, entry)
            entries.append(entry)
        self._last_read = read
        return entries

    def flush(self) -> None:
        """Publish what changed in the statistics; delete the entries of closed fds."""
        entries = self.read_stats()
        now = now_ns()
        events, retired = self.table.update_stats(
            [(seq, cmd, sub, stats) for _, seq, cmd, sub, stats in entries], now)
        if self._reported:
            self._forget_reported(now)
        self._emit(events)
        gone = set(retired)
        for key, open_seq, *_ in entries:
            if open_seq in gone:
                try:
                    del self._stats[key]
                except KeyError:
                    pass

    def idle(self) -> bool:
        """No GPU process to follow: a flush would have nothing to say."""
        return self.table.idle()

    def _repeats_in_kernel(self) -> int:
        """Failed or big calls the kernel only counted, as like one sent just before."""
        return int(self._kernel_repeats.sum(ctypes.c_int(0)).value)

    def counters(self) -> dict[str, int]:
        counters = {f"dropped_{reason}": int(self._drops.sum(ctypes.c_int(drop)).value)
                    for drop, reason in DROP_REASONS.items()}
        counters.update(records=self.records, filtered=self.filtered,
                        capped_polls=self.capped_polls,
                        repeated_calls_counted=self.repeats + self._repeats_in_kernel(),
                        tracked_fds=len(self.table.fds),
                        unresolved_processes=self.table.unresolved)
        counters.update(self._bus_counters())
        return counters

    def health(self) -> SourceHealth:
        counters = self.counters()
        lost = sum(v for k, v in counters.items()
                   if k.startswith("dropped_") and k != "dropped_rate_limited_call_events")
        details = []
        if lost:
            details.append(f"{lost} records or map entries lost")
        if self.task_offsets_error:
            details.append(f"no BTF: start times from /proc ({self.task_offsets_error})")
        if bpf_stats_enabled():
            details.append("kernel.bpf_stats_enabled=1: the kernel times every probe run, "
                           "which slows each traced ioctl")
        return SourceHealth(ts=now_ns(), source=NAME, state="degraded" if lost else "ok",
                            detail="; ".join(details), counters=counters)

    def resync(self) -> None:
        """Re-send the whole state (a subscriber has just connected or reconnected)."""
        self._emit(self.table.snapshot())
        self.flush()

    @property
    def bpf(self) -> Any:
        """The loaded bcc program (None before ``load()``): its ring buffers are waited on."""
        return self._bpf

    def poll(self, timeout_ms: int = 100) -> bool:
        """Take the ring buffer's records, waiting up to ``timeout_ms`` for one that wakes
        us; those sent without a wake-up (BPF_RB_NO_WAKEUP: slow and failed calls) are
        taken too, whatever woke us (epoll never reports them). At most RECORDS_PER_POLL:
        True when it stopped there (the ring may hold more: a storm)."""
        self._budget = RECORDS_PER_POLL
        if timeout_ms:
            self._bpf.ring_buffer_poll(timeout_ms)
        if self._budget > 0:
            self._bpf.ring_buffer_consume()
        capped = self._budget <= 0
        self.capped_polls += capped
        return capped

    def run(self, stop: threading.Event, on_tick: Callable[[], None] | None = None) -> None:
        """Poll records until ``stop`` is set; flush statistics every ``poll_interval`` s."""
        next_flush = 0.0
        while not stop.is_set():
            self.poll(100)
            now = time.monotonic()
            if now >= next_flush:
                self.flush()
                self._publish(self.health())
                next_flush = now + self.poll_interval
            if on_tick is not None:
                on_tick()
        self.poll(0)
        self.flush()
        self._publish(self.health())

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
