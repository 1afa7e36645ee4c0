"""Kernel-log liveness: kernel log records the probes counted that the kernel-log source never read.

The kernel-log source can only show that its reader is open (a journald socket that answers,
a journal with this boot's kernel lines). A journald that stops reading /dev/kmsg, or a
mounted journal that no longer grows, loses every line and looks the same as a quiet
kernel. The printk probe counts the records the kernel stores (``printk:console``); the two
beats are compared here: records the kernel logged between two printk beats, more than the
lines the source read in that time, and none read within ``grace_s`` after, fail the source
until it reads again.

Only the two beats' times and counts are compared, never printk timestamps (the kernel's
log clock drifts from CLOCK_MONOTONIC and stops differently in suspend).
"""

from __future__ import annotations

import dataclasses
import logging

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.events import SourceHealth
from gpuwhy.text import format_ts

log = logging.getLogger(__name__)

GRACE_S = 30.0   # the source beats every 5 s and journald hands a line on within ~0.5 s


class KernelLogLiveness:
    """Feed it every ``klog`` and ``printk`` health beat; it returns the klog beat to store."""

    def __init__(self, grace_s: float = GRACE_S):
        self.grace_ns = int(grace_s * NS_PER_SECOND)
        self._records: int | None = None      # the printk probe's count at its last beat
        self._records_at: int | None = None   # ... and that beat's time
        self._lines_then: int | None = None   # the source's lines read, as of that beat
        self._lines: int | None = None        # the source's lines read, at its last beat
        self._unseen_since: int | None = None  # kernel records logged after this, none read
        self._unseen_records = 0
        self.failing = False
        self.failures = 0

    def observe(self, health: SourceHealth) -> SourceHealth:
        """``health`` as it should be stored: a ``klog`` beat failed while records go unread."""
        if health.source == "printk":
            self._printk_beat(health)
            return health
        if health.source != "klog":
            return health
        return self._klog_beat(health)

    def _printk_beat(self, health: SourceHealth) -> None:
        records = health.counters.get("records", 0)
        if self._records is not None and records < self._records:   # the probes restarted
            self._records = None
        if self._records is not None and records > self._records:
            new = records - self._records
            # Lines the source read since the last beat may be these records; as many as it
            # read are given the benefit of the doubt, never more. (A time test alone, "read
            # after the last beat", let a read of the journal's backlog excuse any number.)
            unseen = new - self._read_between(self._lines_then, self._lines)
            if unseen > 0:
                if self._unseen_since is None:
                    self._unseen_since = self._records_at
                self._unseen_records += unseen
        self._records, self._records_at = records, health.ts
        self._lines_then = self._lines

    @staticmethod
    def _read_between(before: int | None, now: int | None) -> int:
        """Lines read between two counts of the source's (a restart counts from 0 again)."""
        if now is None:
            return 0
        if before is None or now < before:
            return now
        return now - before

    def _klog_beat(self, health: SourceHealth) -> SourceHealth:
        lines = health.counters.get("lines", 0)
        if lines and lines != self._lines:       # read since its last beat (or restarted)
            if self._unseen_since is not None and health.ts > self._unseen_since:
                self._unseen_since, self._unseen_records = None, 0
        self._lines = lines
        failing = self._unseen_since is not None and \
            health.ts - self._unseen_since > self.grace_ns
        if failing != self.failing:
            self.failing = failing
            if failing:
                self.failures += 1
                log.error("kernel-log source: %s", self._why())
            else:
                log.warning("kernel-log source: reading kernel lines again")
        if not failing or health.state == "failed":
            return health
        return dataclasses.replace(health, state="failed",
                                   detail=f"{self._why()}; {health.detail}")

    def _why(self) -> str:
        return (f"the kernel logged {self._unseen_records} record(s) since "
                f"{format_ts(self._unseen_since)} (printk probe) and this source read none: "
                "is journald reading /dev/kmsg (`journalctl -k -f`)?")
