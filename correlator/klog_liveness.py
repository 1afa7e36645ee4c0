"""Kernel-log liveness: kernel log records the probes counted that the kernel-log source never read.

The kernel-log source can only show that its reader is open (a journald socket that answers,
a journal with this boot's kernel lines). A journald that stops reading /dev/kmsg, or a
mounted journal that no longer grows, loses every line and looks the same as a quiet
kernel. The printk probe counts the records the kernel stores (``printk:console``); the two
beats are compared here: records logged after the source last read a line, and not read
within ``grace_s``, fail the source until it reads again.

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
        self._lines: int | None = None        # the source's lines read, at its last beat
        self._read_at: int | None = None      # the last source beat after which it had read
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
            since = self._records_at
            # Lines the source read after `since` may be these records: no verdict then.
            if self._unseen_since is None and not (self._read_at and self._read_at > since):
                self._unseen_since = since
            if self._unseen_since is not None:
                self._unseen_records += records - self._records
        self._records, self._records_at = records, health.ts

    def _klog_beat(self, health: SourceHealth) -> SourceHealth:
        lines = health.counters.get("lines", 0)
        if lines and lines != self._lines:       # read since its last beat (or restarted)
            self._read_at = health.ts
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
