"""Clock conversion: CLOCK_MONOTONIC and boot-relative times to CLOCK_REALTIME nanoseconds.

bpf_ktime_get_ns() is CLOCK_MONOTONIC, printk times and /proc start times are
boot-relative, DCGM and journald give realtime. Every source converts once, here, and
keeps its raw value beside the converted one. The offsets are measured, not assumed,
and refreshed because the wall clock can be stepped (NTP, an operator's `date -s`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
NS_PER_SECOND = 1_000_000_000


def _measure_offset(clock_id: int, samples: int = 5) -> int:
    """realtime - clock_id, from the tightest of a few bracketed reads."""
    best_window, best_offset = None, 0
    for _ in range(samples):
        before = time.clock_gettime_ns(clock_id)
        real = time.clock_gettime_ns(time.CLOCK_REALTIME)
        after = time.clock_gettime_ns(clock_id)
        window = after - before
        if best_window is None or window < best_window:
            best_window, best_offset = window, real - (before + after) // 2
    return best_offset


class ClockConverter:
    """Converts kernel clocks to realtime ns; refreshes its offsets every ``refresh_ns``.

    >>> clock = ClockConverter()
    >>> abs(clock.realtime_from_monotonic(time.monotonic_ns()) - time.time_ns()) < 10**8
    True
    """

    def __init__(self, refresh_ns: int = 10 * NS_PER_SECOND,
                 measure: Callable[[int], int] = _measure_offset):
        self.refresh_ns = refresh_ns
        self._measure = measure
        self._measured_at = -refresh_ns
        self.monotonic_offset = 0
        self.boottime_offset = 0
        self.refresh()

    def refresh(self) -> None:
        self.monotonic_offset = self._measure(time.CLOCK_MONOTONIC)
        self.boottime_offset = self._measure(time.CLOCK_BOOTTIME)
        self._measured_at = time.monotonic_ns()

    def _maybe_refresh(self) -> None:
        if time.monotonic_ns() - self._measured_at >= self.refresh_ns:
            self.refresh()

    def realtime_from_monotonic(self, monotonic_ns: int) -> int:
        """CLOCK_MONOTONIC ns (bpf_ktime_get_ns, journald's monotonic) to realtime ns."""
        self._maybe_refresh()
        return monotonic_ns + self.monotonic_offset

    def realtime_from_boottime(self, boottime_ns: int) -> int:
        """Boot-relative ns (printk, /proc/PID/stat start time) to realtime ns."""
        self._maybe_refresh()
        return boottime_ns + self.boottime_offset


def ticks_to_ns(ticks: int) -> int:
    """Clock ticks (the unit of /proc/PID/stat times) to nanoseconds."""
    return ticks * NS_PER_SECOND // CLOCK_TICKS_PER_SECOND


def realtime_from_ticks(ticks: int) -> int:
    """A /proc start time (clock ticks since boot) as realtime ns: when the process
    started, measured now against CLOCK_BOOTTIME (suspend included, as the kernel counts
    start times)."""
    return ticks_to_ns(ticks) + _measure_offset(time.CLOCK_BOOTTIME, samples=1)


def now_ns() -> int:
    """Realtime now, in ns: the ``ts`` of events that have no clock of their own."""
    return time.time_ns()
