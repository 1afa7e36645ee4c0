"""Process events: exec, fork and exit of every process, keyed exactly by (pid, start_time).

Loads ``lifecycle.bpf.c``. Execs are enriched from /proc (command line, uid, cgroup,
container / pod / unit, tag) while the process is there to be read; fork and exit need
nothing from /proc: the kernel record names both ends exactly.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import mmap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwhy.clock import (
    CLOCK_TICKS_PER_SECOND,
    NS_PER_SECOND,
    ClockConverter,
    realtime_from_ticks,
)
from gpuwhy.config import Config, environment_names
from gpuwhy.errors import NoSuchProcess, ProbeLoadError
from gpuwhy.events import Event, ProcessExec, ProcessExited, ProcessForked, ProcessSeen
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.bpfdefs import CLONE_THREAD, Define, cflags, enum_defines
from gpuwhy.probes.btf import BTFError, task_offsets
from gpuwhy.probes.fdtrack import load_bpf
from gpuwhy.proc import read_process

log = logging.getLogger(__name__)

NAME = "lifecycle"
BPF_SOURCE = Path(__file__).with_name("lifecycle.bpf.c")
RINGBUF_PAGES = 128
RINGBUF_HEADER_BYTES = 8           # BPF_RINGBUF_HDR_SZ: the kernel's header on each record
# Records one poll reads at most (see RECORDS_PER_POLL in fdtrack.py: a poll's events are
# held in one batch, ~8 KB each, and libbpf reads a ring a fork storm keeps filling until it
# is empty). Past it the rest waits in the ring; what it cannot hold is dropped and counted.
RECORDS_PER_POLL = 512


class EventType(enum.IntEnum):
    """What a ring-buffer record reports (``event_t.type``; EV_<NAME> in lifecycle.bpf.c)."""

    EXEC = 1
    FORK = 2
    EXIT = 3


def bpf_defines() -> dict[str, Define]:
    """Every constant lifecycle.bpf.c shares with Python, by its C name."""
    return {"RINGBUF_PAGES": RINGBUF_PAGES, "CLONE_THREAD_FLAG": CLONE_THREAD,
            **enum_defines("EV_", EventType)}


CFLAGS = cflags(bpf_defines())
_EXEC, _FORK, _EXIT = int(EventType.EXEC), int(EventType.FORK), int(EventType.EXIT)  # the loop


def decode_exit_code(raw: int) -> tuple[int | None, int | None]:
    """The kernel's exit_code as (exit status, killing signal): one of them is None.

    >>> decode_exit_code(3 << 8)
    (3, None)
    >>> decode_exit_code(9)
    (None, 9)
    """
    signal = raw & 0x7F
    return (None, signal) if signal else ((raw >> 8) & 0xFF, None)


class LifecycleProbe:
    """Publishes ProcessSeen + ProcessExec, ProcessForked and ProcessExited events."""

    def __init__(self, config: Config, publish: Callable[[Event], object],
                 clock: ClockConverter | None = None,
                 on_event: Callable[[Event], None] | None = None):
        self.proc_root: str = config["probes.proc_root"]
        # root reads any process's environment: the variables rules read travel in ProcessSeen
        self.environment = environment_names(config["probes.environment"])
        self._publish = publish
        self._on_event = on_event
        self._clock = clock or ClockConverter()
        self._bpf: Any = None      # the loaded bcc.BPF (bcc has no types); None before load()
        self.records = 0
        self.enrich_failures = 0
        self._budget = RECORDS_PER_POLL
        self.ring_records = 0       # how many records the ring holds, once loaded

    def load(self) -> None:
        try:
            offsets = task_offsets()
        except BTFError as exc:
            raise ProbeLoadError(NAME, f"needs kernel BTF for exact process identity: {exc}"
                                 ) from None
        self._bpf = bpf = load_bpf(NAME, BPF_SOURCE, CFLAGS)
        table = bpf[b"config"]
        cfg = table.Leaf()
        cfg.ns_per_tick = NS_PER_SECOND // CLOCK_TICKS_PER_SECOND
        cfg.valid = 1
        cfg.off_group_leader = offsets.group_leader
        cfg.off_start_boottime = offsets.start_boottime
        cfg.off_real_parent = offsets.real_parent
        cfg.off_tgid = offsets.tgid
        cfg.off_exit_code = offsets.exit_code
        table[ctypes.c_int(0)] = cfg
        self._events = bpf[b"events"]
        self._drops = bpf[b"drops"]
        self._events.open_ring_buffer(self._on_record)
        from bcc.table import _get_event_class  # the record's class, as RingBuf.event() gets it
        record = ctypes.sizeof(_get_event_class(self._events))
        self.ring_records = RINGBUF_PAGES * mmap.PAGESIZE // (record + RINGBUF_HEADER_BYTES)

    def _emit(self, event: Event) -> None:
        self._publish(event)
        if self._on_event is not None:
            self._on_event(event)

    def _on_record(self, ctx: object, data: object, size: int) -> int:
        self._budget -= 1
        self._handle(self._events.event(data))
        return -1 if self._budget <= 0 else 0     # < 0: libbpf stops reading the ring

    def _handle(self, record: Any) -> None:
        self.records += 1
        ts = self._clock.realtime_from_monotonic(record.ktime_ns)
        key = ProcessKey(record.tgid, record.start_ticks)
        if record.type == _EXEC:
            filename = bytes(record.filename).split(b"\0", 1)[0].decode("utf-8", "replace")
            try:
                seen = read_process(record.tgid, ts, self.proc_root, self.environment)
            except NoSuchProcess:
                seen = None
            if seen is None or seen.process != key:
                self.enrich_failures += 1      # gone already: what the kernel said is all
                seen = ProcessSeen(ts=ts, process=key, comm=Path(filename).name[:15],
                                   exe=filename, ppid=record.other_tgid,
                                   started_at=realtime_from_ticks(record.start_ticks))
            self._emit(seen)
            self._emit(ProcessExec(ts=ts, process=key, filename=filename,
                                   ppid=record.other_tgid, raw_ts=record.ktime_ns))
        elif record.type == _FORK:
            child = ProcessKey(record.other_tgid, record.other_start_ticks)
            self._emit(ProcessForked(ts=ts, parent=key, child=child, raw_ts=record.ktime_ns))
        elif record.type == _EXIT:
            exit_code, signal = decode_exit_code(record.exit_code)
            self._emit(ProcessExited(ts=ts, process=key, exit_code=exit_code, signal=signal,
                                     raw_ts=record.ktime_ns))

    def counters(self) -> dict[str, int]:
        return {"records": self.records, "enrich_failures": self.enrich_failures,
                "dropped_ringbuf_full": int(self._drops.sum(ctypes.c_int(0)).value)}

    @property
    def bpf(self) -> Any:
        """The loaded bcc program (None before ``load()``): its ring buffers are waited on."""
        return self._bpf

    def poll(self, timeout_ms: int = 0) -> None:
        """Read the ring's records, RECORDS_PER_POLL at most."""
        self._budget = RECORDS_PER_POLL
        self._bpf.ring_buffer_poll(timeout_ms)

    def close(self) -> None:
        if self._bpf is not None:
            self._budget = RECORDS_PER_POLL
            self._bpf.ring_buffer_consume()
            self._bpf.cleanup()
            self._bpf = None
