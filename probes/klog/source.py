"""The kernel-log source: read (journald, else /dev/kmsg, else a kern.log tail), parse, publish.

Nothing lost, nothing duplicated, even after ``kill -9``: every published record carries
its cursor, and the store writes the cursor in the same transaction as the record
(``StoreWriter._on_kernel_log_record``). Lines that are not NVIDIA lines only move the
cursor, through a :class:`KernelLogCheckpoint` now and then. On start the source reads
the cursor *from the store* and resumes after it; records that were on the bus when
the old source died and arrive again are recognised by their cursor and ignored.

Times: ``ts`` is the printk time converted with the measured monotonic offset when the
line is from this boot (printk's clock, like CLOCK_MONOTONIC, stops in suspend); lines
from an earlier boot have only journald's receive time; ``raw_ts`` keeps the printk time.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from gpuwhy.bus import Publisher
from gpuwhy.clock import ClockConverter, now_ns
from gpuwhy.config import Config
from gpuwhy.errors import ConfigError, GpuwhyError
from gpuwhy.events import KernelLogCheckpoint, KernelLogFacts, KernelLogRecord, SourceHealth
from gpuwhy.probes.klog.journald import IDLE_WAIT_S
from gpuwhy.probes.klog.kmsg import current_boot_id
from gpuwhy.probes.klog.lines import RawLine
from gpuwhy.probes.klog.parse import KernelLogParser, KernelRecord
from gpuwhy.probes.klog.resume import connect_publisher, publish_reliably, stored_cursor

log = logging.getLogger(__name__)

BACKENDS = ("auto", "journald", "kmsg", "file")
STARTS = ("boot", "all", "now")
JOURNALD_SOCKET = "/run/systemd/journal/socket"
CHECKPOINT_EVERY_S = 1.0
CHECKPOINT_EVERY_LINES = 2000
HEALTH_EVERY_S = 5.0
MAX_LINE_STORED = 2048


class KernelLogReader(Protocol):
    origin: str

    def seek(self, cursor: str | None, start: str) -> bool: ...
    def lines(self, limit: int = 1000) -> object: ...
    def wait(self, timeout: float) -> None: ...
    def close(self) -> None: ...


def _journald_usable(config: Config) -> bool:
    try:
        import systemd.journal  # noqa: F401
    except ImportError:
        return False
    return bool(config["klog.journal_path"]) or os.path.exists(JOURNALD_SOCKET)


def open_reader(config: Config) -> tuple[KernelLogReader, str]:
    """The reader ``klog.backend`` asks for (``auto``: the best one available here) and a
    sentence for `gpuwhy status` saying which one and why."""
    from gpuwhy.probes.klog.journald import JournalKernelLog
    from gpuwhy.probes.klog.kmsg import KmsgKernelLog
    from gpuwhy.probes.klog.tail import FileKernelLog

    backend = config["klog.backend"]
    if backend not in BACKENDS:
        raise ConfigError(f"expected one of {', '.join(BACKENDS)}, got {backend!r}",
                          key="klog.backend")
    if config["klog.start"] not in STARTS:
        raise ConfigError(f"expected one of {', '.join(STARTS)}, got {config['klog.start']!r}",
                          key="klog.start")
    reasons = []
    if backend == "journald" or backend == "auto" and _journald_usable(config):
        where = config["klog.journal_path"] or "the system journal"
        return JournalKernelLog(config["klog.journal_path"] or None), \
            f"journald: kernel lines and NVRM identifier from {where}"
    if backend == "auto":
        reasons.append("journald is not running")
    if backend in ("auto", "kmsg"):
        try:
            reader = KmsgKernelLog(config["klog.kmsg_path"])
            why = f" ({reasons[0]})" if reasons else ""
            return reader, f"{config['klog.kmsg_path']} read directly{why}, sequence numbers " \
                           "as cursor"
        except OSError as exc:
            if backend == "kmsg":
                raise GpuwhyError(f"cannot read {config['klog.kmsg_path']}: {exc.strerror}") \
                    from None
            reasons.append(f"{config['klog.kmsg_path']}: {exc.strerror}")
    path = config["klog.file"]
    if not Path(path).exists():
        raise GpuwhyError(f"no kernel log to read: {'; '.join(reasons + [f'{path} missing'])}")
    return FileKernelLog(path, _boot_id_or_empty()), \
        f"tailing {path} ({'; '.join(reasons) or 'klog.backend = file'}); times are read times"


def _boot_id_or_empty() -> str:
    try:
        return current_boot_id()
    except OSError:
        return ""


def record_event(raw: RawLine, record: KernelRecord, origin: str, ts: int) -> KernelLogRecord:
    facts = {f.name: getattr(record, f.name) for f in dataclasses.fields(KernelLogFacts)}
    return KernelLogRecord(
        ts=ts, raw_ts=raw.monotonic_ns, cursor=raw.cursor, origin=origin, boot_id=raw.boot_id,
        record_kind=record.kind, **{**facts, "details": dict(record.details)},
        line=raw.text[:MAX_LINE_STORED])


class KernelLogPump:
    """Reads lines from a reader, publishes records and checkpoints; counts everything."""

    def __init__(self, reader: KernelLogReader, publisher: Publisher, stop: threading.Event,
                 clock: ClockConverter | None = None, boot_id: str | None = None):
        self.reader = reader
        self.publisher = publisher
        self.stop = stop
        self.clock = clock or ClockConverter()
        self.boot_id = boot_id if boot_id is not None else _boot_id_or_empty()
        self.parser = KernelLogParser()
        self.counters = {"lines": 0, "records": 0, "checkpoints": 0}
        self._safe: RawLine | None = None        # last line not inside a multi-line report
        self._skipped = 0
        self._checkpoint_at = time.monotonic()

    def realtime(self, raw: RawLine) -> int:
        if raw.monotonic_ns is not None and raw.boot_id == self.boot_id:
            return self.clock.realtime_from_monotonic(raw.monotonic_ns)
        return raw.realtime_ns or now_ns()

    def pump(self, limit: int = 500) -> int:
        """Handle the lines available now; returns how many there were."""
        count = 0
        for raw in self.reader.lines(limit):   # type: ignore[attr-defined]
            count += 1
            self.counters["lines"] += 1
            records = self.parser.feed(raw.text)
            for _, record in records:
                if not publish_reliably(self.publisher, record_event(
                        raw, record, self.reader.origin, self.realtime(raw)), self.stop):
                    return count
                self.counters["records"] += 1
            if not self.parser.pending:
                self._safe = raw
                self._skipped = 0 if records else self._skipped + 1
            if self._skipped >= CHECKPOINT_EVERY_LINES:
                self.checkpoint()
        return count

    def checkpoint(self) -> None:
        """Move the stored cursor over the skipped lines (not into a pending report)."""
        self._checkpoint_at = time.monotonic()
        if self._safe is None or not self._skipped:
            return
        if publish_reliably(self.publisher, KernelLogCheckpoint(
                ts=now_ns(), cursor=self._safe.cursor, origin=self.reader.origin,
                boot_id=self._safe.boot_id, skipped=self._skipped), self.stop):
            self.counters["checkpoints"] += 1
            self._skipped = 0

    def checkpoint_due(self) -> bool:
        return time.monotonic() - self._checkpoint_at >= CHECKPOINT_EVERY_S


def run_klog_source(config: Config, stop: threading.Event) -> None:
    """Source runner (see ``gpuwhy.service.unprivileged_sources``): until ``stop`` is set."""
    publisher = connect_publisher(config, "klog", stop)
    if publisher is None:
        return
    try:
        try:
            reader, detail = open_reader(config)
        except GpuwhyError as exc:
            log.error("kernel-log source: %s", exc)
            publisher.publish(SourceHealth(ts=now_ns(), source="klog", state="failed",
                                           detail=str(exc)))
            stop.wait()
            return
        try:
            _run(config, reader, detail, publisher, stop)
        finally:
            reader.close()
    finally:
        publisher.close()


def _run(config: Config, reader: KernelLogReader, detail: str, publisher: Publisher,
         stop: threading.Event) -> None:
    stored = stored_cursor(config["store.path"], "klog")
    cursor = stored.cursor if stored and stored.origin == reader.origin else None
    resumed = reader.seek(cursor, config["klog.start"])
    detail += "; resumed after the stored cursor" if resumed else \
        f"; first run, starting at {config['klog.start']}"
    log.info("kernel-log source: %s", detail)
    pump = KernelLogPump(reader, publisher, stop)
    state = "degraded" if reader.origin == "file" else "ok"
    next_health = 0.0
    while not stop.is_set():
        if not pump.pump():
            if pump.checkpoint_due():
                pump.checkpoint()
            reader.wait(IDLE_WAIT_S)
        elif pump.checkpoint_due():
            pump.checkpoint()
        if time.monotonic() >= next_health:
            counters = {**pump.counters, "bus_full_retries": publisher.dropped,
                        "kmsg_overwritten": getattr(reader, "overwritten", 0)}
            publisher.publish(SourceHealth(ts=now_ns(), source="klog", state=state,
                                           detail=detail, counters=counters))
            next_health = time.monotonic() + HEALTH_EVERY_S
    pump.checkpoint()
