"""fdtrack: which processes hold NVIDIA device fds, and how many ioctls they send on each.

Loads ``fdtrack.bpf.c`` (syscall and sched tracepoints), seeds it with the device fds that
processes already held (``/proc/*/fd`` scan), and turns its ring-buffer records and
counts map into bus events through :class:`~gpuwhy.probes.fdtable.FdTable`.

Caveats: a relative open (``openat(dirfd, "nvidia0")``) is not recognised; fds that
arrive by ``dup``/``fork``/``SCM_RIGHTS`` are the scheduler/fd issue's work.
"""

from __future__ import annotations

import ctypes
import fnmatch
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gpuwhy.clock import ClockConverter, now_ns
from gpuwhy.config import Config
from gpuwhy.errors import NoSuchProcess, ProbeLoadError
from gpuwhy.events import Event, ProcessSeen, SourceHealth
from gpuwhy.probes.fdtable import FdTable
from gpuwhy.probes.procscan import literal_prefix, scan_open_devices
from gpuwhy.proc import read_process

log = logging.getLogger(__name__)

NAME = "fdtrack"
BPF_SOURCE = Path(__file__).with_name("fdtrack.bpf.c")
EV_OPEN, EV_CLOSE, EV_EXIT = 1, 2, 3
DROP_REASONS = ("ringbuf_full", "tracked_map_full", "counts_map_full", "pending_map_full")
PREFIX_LEN = 64
SCANNED_SEQ_BASE = 1 << 62   # open_seqs made up for scanned fds never meet the kernel's
CFLAGS = ("-DPATH_LEN=128", "-DMAX_TRACKED=65536", "-DMAX_COUNTS=131072", "-DRINGBUF_PAGES=64")
TRACEFS = ("/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events")


def ebpf_text() -> str:
    """The BPF C program and the flags it is compiled with (what ``--ebpf`` prints)."""
    return f"// cflags: {' '.join(CFLAGS)}\n{BPF_SOURCE.read_text()}"


def _load_bpf() -> object:
    if os.geteuid() != 0:
        raise ProbeLoadError(NAME, "needs root (CAP_BPF, CAP_PERFMON); run as root")
    if not any(os.path.isdir(p) for p in TRACEFS):
        raise ProbeLoadError(NAME, "tracefs is not mounted; fix: "
                                   "mount -t tracefs tracefs /sys/kernel/tracing")
    try:
        from bcc import BPF
    except ImportError:
        raise ProbeLoadError(NAME, "bcc is not importable; fix: apt-get install python3-bpfcc "
                                   "and use a venv made with --system-site-packages") from None
    try:
        return BPF(src_file=str(BPF_SOURCE).encode(), cflags=list(CFLAGS))
    except Exception as exc:  # bcc raises bare Exception for compile and attach failures
        raise ProbeLoadError(NAME, f"{exc} (are kernel headers at "
                                   f"/lib/modules/{os.uname().release}/build?)") from None


class FdTrackProbe:
    """The fdtrack probe: ``load()``, then ``run(stop)``; every event goes to ``publish``."""

    def __init__(self, config: Config, publish: Callable[[Event], object],
                 clock: ClockConverter | None = None,
                 bus_counters: Callable[[], dict[str, int]] = dict):
        self.device_glob: str = config["probes.device_glob"]
        self.poll_interval: float = config["probes.poll_interval"]
        self.proc_root: str = config["probes.proc_root"]
        self._publish = publish
        self._bus_counters = bus_counters
        self._clock = clock or ClockConverter()
        self.table = FdTable(self._resolve)
        self.events_seen = 0
        self.filtered = 0
        self._bpf = None
        self._scanned_seq = SCANNED_SEQ_BASE

    def _resolve(self, pid: int, ts: int) -> ProcessSeen | None:
        try:
            return read_process(pid, ts, self.proc_root)
        except NoSuchProcess:
            return None

    def _emit(self, events: list[Event]) -> None:
        for event in events:
            self._publish(event)

    def load(self) -> None:
        """Compile, attach, set the device prefix, then scan /proc (attach first: no gap)."""
        self._bpf = bpf = _load_bpf()
        self._events = bpf[b"events"]
        self._tracked = bpf[b"tracked"]
        self._fds_per_process = bpf[b"fds_per_process"]
        self._counts = bpf[b"ioctl_counts"]
        self._drops = bpf[b"drops"]
        prefix = literal_prefix(self.device_glob).encode()[:PREFIX_LEN]
        table = bpf[b"prefix"]
        leaf = table.Leaf()
        leaf.len = len(prefix)
        leaf.text = prefix
        table[ctypes.c_int(0)] = leaf
        self._events.open_ring_buffer(self._on_record)
        self.scan()

    def scan(self) -> int:
        """Track device fds that were open before we attached; returns how many were found."""
        tracked, per_process = self._tracked, self._fds_per_process
        found = 0
        for open_device in scan_open_devices(self.device_glob, self.proc_root):
            key = tracked.Key(open_device.pid, open_device.fd)
            if key in tracked:          # opened while we were scanning: the kernel saw it
                continue
            self._scanned_seq += 1
            tracked[key] = ctypes.c_uint64(self._scanned_seq)
            count = per_process.get(ctypes.c_uint32(open_device.pid))
            per_process[ctypes.c_uint32(open_device.pid)] = ctypes.c_uint32(
                (count.value if count else 0) + 1)
            self._emit(self.table.opened(open_device.pid, open_device.fd, self._scanned_seq,
                                         open_device.path, now_ns(), scanned=True))
            found += 1
        log.info("start-up scan: %d open device fds matching %s", found, self.device_glob)
        return found

    def _on_record(self, ctx: object, data: object, size: int) -> None:
        record = self._events.event(data)
        self.events_seen += 1
        ts = self._clock.realtime_from_monotonic(record.ktime_ns)
        if record.type == EV_OPEN:
            path = bytes(record.path).split(b"\0", 1)[0].decode("utf-8", errors="replace")
            if not fnmatch.fnmatchcase(path, self.device_glob):
                self.filtered += 1   # the prefix matched, the whole glob does not
                self._untrack(record.tgid, record.fd)
                return
            events = self.table.opened(record.tgid, record.fd, record.open_seq, path, ts)
        elif record.type == EV_CLOSE:
            events = self.table.closed(record.tgid, record.fd, record.open_seq, ts)
        elif record.type == EV_EXIT:
            fds = [fd for owner, fd in self.table.fds if owner == record.tgid]
            events = self.table.exited(record.tgid, ts)
            for fd in fds:      # an exit closes no fd one by one: the kernel map keeps them
                self._untrack(record.tgid, fd)
        else:
            log.warning("unknown fdtrack record type %d", record.type)
            return
        self._emit(events)

    def _untrack(self, tgid: int, fd: int) -> None:
        tracked = self._tracked
        try:
            del tracked[tracked.Key(tgid, fd)]
        except KeyError:
            pass

    def flush(self) -> None:
        """Read the counts map, publish what changed, delete entries of closed fds."""
        entries = list(self._counts.items())
        triples = [(key.open_seq, key.cmd, value.value) for key, value in entries]
        events, retired = self.table.update_counts(triples, now_ns())
        self._emit(events)
        gone = set(retired)
        for key, _ in entries:
            if key.open_seq in gone:
                try:
                    del self._counts[key]
                except KeyError:
                    pass

    def counters(self) -> dict[str, int]:
        counters = {f"dropped_{reason}": int(self._drops.sum(ctypes.c_int(i)).value)
                    for i, reason in enumerate(DROP_REASONS)}
        counters.update(records=self.events_seen, filtered=self.filtered,
                        tracked_fds=len(self.table.fds),
                        unresolved_processes=self.table.unresolved)
        counters.update(self._bus_counters())
        return counters

    def health(self) -> SourceHealth:
        counters = self.counters()
        dropped = sum(v for k, v in counters.items() if k.startswith("dropped_"))
        return SourceHealth(ts=now_ns(), source=NAME, state="degraded" if dropped else "ok",
                            detail=f"{dropped} records dropped in the kernel" if dropped else "",
                            counters=counters)

    def resync(self) -> None:
        """Re-send the whole state (a subscriber has just connected or reconnected)."""
        self._emit(self.table.snapshot())
        self.flush()

    def run(self, stop: threading.Event, on_tick: Callable[[], None] | None = None) -> None:
        """Poll records until ``stop`` is set; flush counts every ``poll_interval`` s."""
        next_flush = 0.0
        while not stop.is_set():
            self._bpf.ring_buffer_poll(100)
            now = time.monotonic()
            if now >= next_flush:
                self.flush()
                self._publish(self.health())
                next_flush = now + self.poll_interval
            if on_tick is not None:
                on_tick()
        self._bpf.ring_buffer_consume()
        self.flush()
        self._publish(self.health())

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

