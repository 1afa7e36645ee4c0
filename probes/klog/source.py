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
import threading
import time
from pathlib import Path
from typing import Protocol

from gpuwhy.bus import Publisher
from gpuwhy.clock import ClockConverter, now_ns
from gpuwhy.config import Config
from gpuwhy.errors import ConfigError, GpuwhyError
from gpuwhy.events import KernelLogCheckpoint, KernelLogFacts, KernelLogRecord, SourceHealth
from gpuwhy.probes.klog import journald
from gpuwhy.probes.klog.journald import IDLE_WAIT_S
from gpuwhy.probes.klog.kmsg import KernelLineBell, current_boot_id
from gpuwhy.probes.klog.lines import RawLine
from gpuwhy.probes.klog.parse import UNPARSED, KernelLogParser, KernelRecord, unparsed_record
from gpuwhy.probes.klog.resume import connect_publisher, publish_reliably, stored_cursor

log = logging.getLogger(__name__)

BACKENDS = ("auto", "journald", "kmsg", "file")
STARTS = ("boot", "all", "now")
CHECKPOINT_EVERY_S = 1.0
KMSG_FD_NAME = "kmsg"       # the FileDescriptorName= of systemd/gpuwhy-kmsg.socket
CHECKPOINT_EVERY_LINES = 2000
HEALTH_EVERY_S = 5.0
MAX_LINE_STORED = 2048


class KernelLogReader(Protocol):
    origin: str
    wakes_on_new_lines: bool     # wait() returns when a line comes: it may be given long

    def seek(self, cursor: str | None, start: str) -> bool: ...
    def lines(self, limit: int = 1000) -> object: ...
    def wait(self, timeout: float) -> None: ...
    def close(self) -> None: ...


def journald_unproven(config: Config) -> str | None:
    """None when journald is shown to receive kernel lines here, else why it is not.

    Presence is not enough (a stale socket file, a journald that does not read /dev/kmsg
    both lose every line): the socket must answer, and the journal must hold a kernel line
    of this boot. Both need no privilege, so the unprivileged unit keeps ProtectKernelLogs.
    """
    try:
        import systemd.journal  # noqa: F401
    except ImportError:
        return "systemd-python is not installed"
    path = config["klog.journal_path"] or None
    if path is None:
        refused = journald.journald_refuses()
        if refused:
            return f"journald is not running ({refused})"
    where = path or "the system journal"
    try:
        if not journald.has_kernel_line_this_boot(path):
            return f"{where} holds no kernel line of this boot (journald does not read " \
                   "/dev/kmsg here)"
    except OSError as exc:
        return f"cannot read {where}: {exc}"
    return None


def open_reader(config: Config) -> tuple[KernelLogReader, str, str | None]:
    """The reader ``klog.backend`` asks for (``auto``: the best one shown to work here), a
    sentence for `gpuwhy status` saying which one and why, and, for a journal used without
    being shown live (named by ``klog.backend`` or ``klog.journal_path``), why not."""
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
    if backend in ("auto", "journald"):
        unproven = journald_unproven(config)
        # A journal named (by backend or path) is read even unproven; it fails until it delivers.
        if unproven is None or backend == "journald" or config["klog.journal_path"]:
            path = config["klog.journal_path"] or None
            bell, rung_by = kernel_line_bell(config["klog.kmsg_path"],
                                             config["klog.kmsg_socket"]) \
                if bell_wanted(config, unproven) else \
                (None, f"looked at every {IDLE_WAIT_S:g} s (not shown to be this boot's: "
                       "no bell)")
            reader = JournalKernelLog(path, bell=bell)
            reader.rung_by = rung_by
            return reader, f"journald: kernel lines and NVRM identifier from " \
                           f"{path or 'the system journal'}; {rung_by}", unproven
        reasons.append(unproven)
    if backend in ("auto", "kmsg"):
        try:
            reader = KmsgKernelLog(config["klog.kmsg_path"])
            why = f" ({reasons[0]})" if reasons else ""
            return reader, f"{config['klog.kmsg_path']} read directly{why}, sequence numbers " \
                           "as cursor", None
        except OSError as exc:
            if backend == "kmsg":
                raise GpuwhyError(f"cannot read {config['klog.kmsg_path']}: {exc.strerror}") \
                    from None
            reasons.append(f"{config['klog.kmsg_path']}: {exc.strerror}")
    path = config["klog.file"]
    if not Path(path).exists():
        raise GpuwhyError(f"no kernel log to read: {'; '.join(reasons + [f'{path} missing'])}")
    return FileKernelLog(path, _boot_id_or_empty()), \
        f"tailing {path} ({'; '.join(reasons) or 'klog.backend = file'}); times are read times", \
        None


def bell_wanted(config: Config, unproven: str | None) -> bool:
    """Whether the journal reader is to be woken by this kernel's /dev/kmsg: the system
    journal always; a journal directory mounted from the host (a Kubernetes pod) once it is
    shown to hold this boot's lines (a copy, another host's, has no kernel of ours)."""
    return not config["klog.journal_path"] or unproven is None


def kernel_line_bell(path: str, lent_at: str = "") -> tuple[KernelLineBell | None, str]:
    """The bell that wakes the journald reader when the kernel logs a line, and a sentence
    saying what wakes the reader: the /dev/kmsg systemd passed (gpuwhy-kmsg.socket), else
    ``path`` opened here, else one lent by the probes at ``lent_at``
    (:mod:`gpuwhy.probes.klog.lend`), else nothing (the journal is looked at every
    IDLE_WAIT_S)."""
    from gpuwhy.passed_fds import take_passed_fd

    fd = take_passed_fd(KMSG_FD_NAME)
    try:
        if fd is not None:
            return KernelLineBell(fd=fd), "woken by /dev/kmsg, passed by systemd"
        return KernelLineBell(path), f"woken by {path}"
    except OSError as exc:
        why = f"{path}: {exc.strerror or exc}"
    if lent_at:
        bell, lent_why = lent_bell(lent_at)
        if bell is not None:
            return bell, lent_why
        why += f"; {lent_why}"
    return None, f"looked at every {IDLE_WAIT_S:g} s ({why})"


def lent_bell(lent_at: str) -> tuple[KernelLineBell | None, str]:
    """A bell made of the /dev/kmsg the probes lend at ``lent_at``, and a sentence."""
    from gpuwhy.probes.klog.lend import borrow_kmsg

    try:
        return KernelLineBell(fd=borrow_kmsg(lent_at)), \
            f"woken by /dev/kmsg, lent by the probes at {lent_at}"
    except OSError as exc:
        return None, f"not lent at {lent_at}: {exc.strerror or exc}"


def _boot_id_or_empty() -> str:
    try:
        return current_boot_id()
    except OSError:
        return ""


def record_event(raw: RawLine, record: KernelRecord, origin: str, ts: int) -> KernelLogRecord:
    """The bus event of one record of ``raw``; the line kept is bounded (MAX_LINE_STORED)."""
    facts = {f.name: getattr(record, f.name) for f in dataclasses.fields(KernelLogFacts)}
    line = raw.text[:MAX_LINE_STORED]
    if not line.isascii():
        # a lone surrogate (no real reader makes one) would make SQLite refuse the record
        line = line.encode("utf-8", "replace").decode("utf-8")
    return KernelLogRecord(
        ts=ts, raw_ts=raw.monotonic_ns, cursor=raw.cursor, origin=origin, boot_id=raw.boot_id,
        record_kind=record.kind, **{**facts, "details": dict(record.details)}, line=line)


class KernelLogPump:
    """Reads lines from a reader, publishes records and checkpoints; counts everything.

    A line that cannot be parsed is published as an ``unparsed`` record with its reason
    (counted in ``unparsed``), like any other record: the store keeps it and moves the
    cursor past it, so one bad line never stops the source, nor stops it again after a
    restart.
    """

    def __init__(self, reader: KernelLogReader, publisher: Publisher, stop: threading.Event,
                 clock: ClockConverter | None = None, boot_id: str | None = None):
        self.reader = reader
        self.publisher = publisher
        self.stop = stop
        self.clock = clock or ClockConverter()
        self.boot_id = boot_id if boot_id is not None else _boot_id_or_empty()
        self.parser = KernelLogParser()
        self.counters = {"lines": 0, "records": 0, "unparsed": 0, "checkpoints": 0}
        self._safe: RawLine | None = None        # last line not inside a multi-line report
        self._previous: RawLine | None = None    # the line fed before this one
        self._skipped = 0
        self._checkpoint_at = time.monotonic()
        self._failed_once = False

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
            records = self.events(raw)
            for event in records:
                if not publish_reliably(self.publisher, event, self.stop):
                    return count
                self.counters["unparsed" if event.record_kind == UNPARSED else "records"] += 1
            if not self.parser.pending:
                self._safe = raw
                self._skipped = 0 if records else self._skipped + 1
            if self._skipped >= CHECKPOINT_EVERY_LINES:
                self.checkpoint()
        return count

    def events(self, raw: RawLine) -> list[KernelLogRecord]:
        """The bus events of one line. The parser never raises; should anything here fail
        all the same, the line becomes one ``unparsed`` record carrying the error, so that
        its cursor is stored and it is not read (and failed on) again.

        A line gives at most one record of its own, the last; one before it, or one given
        as the line opens another multi-line report, is of a report that this line ended
        unfinished: it gets the cursor of the line before (the report's last), as the store
        keeps one record per cursor and a restart must read the opened report again."""
        previous, self._previous = self._previous, raw
        try:
            records = self.parser.feed(raw.text)
            if not records:
                return []
            own = 0 if self.parser.pending else 1     # how many of them are this line's
            out = []
            for n, (_, record) in enumerate(records):
                source = raw if n >= len(records) - own or previous is None else previous
                out.append(record_event(source, record, self.reader.origin,
                                        self.realtime(source)))
            return out
        except Exception as exc:  # noqa: BLE001 - one line must not stop the source
            # logged once: anyone who can log as NVRM could otherwise flood the journal
            (log.debug if self._failed_once else log.warning)(
                "kernel-log source: line at %s not parsed: %s", raw.cursor, exc)
            self._failed_once = True
            record = unparsed_record(f"{type(exc).__name__}: {exc}")
            return [record_event(raw, record, self.reader.origin, raw.realtime_ns or now_ns())]

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

    def checkpoint_in(self) -> float:
        """Seconds until a checkpoint is due; infinite when there is nothing to move over."""
        if self._safe is None or not self._skipped:
            return float("inf")
        return max(0.0, self._checkpoint_at + CHECKPOINT_EVERY_S - time.monotonic())


def run_klog_source(config: Config, stop: threading.Event) -> None:
    """Source runner (see ``gpuwhy.service.unprivileged_sources``): until ``stop`` is set."""
    publisher = connect_publisher(config, "klog", stop)
    if publisher is None:
        return
    try:
        try:
            reader, detail, unproven = open_reader(config)
        except GpuwhyError as exc:
            log.error("kernel-log source: %s", exc)
            publisher.publish(SourceHealth(ts=now_ns(), source="klog", state="failed",
                                           detail=str(exc)))
            stop.wait()
            return
        try:
            _run(config, reader, detail, publisher, stop, unproven)
        finally:
            reader.close()
    finally:
        publisher.close()


def _run(config: Config, reader: KernelLogReader, detail: str, publisher: Publisher,
         stop: threading.Event, unproven: str | None = None) -> None:
    stored = stored_cursor(config["store.path"], "klog")
    cursor = stored.cursor if stored and stored.origin == reader.origin else None
    resumed = reader.seek(cursor, config["klog.start"])
    detail += "; resumed after the stored cursor" if resumed else \
        f"; first run, starting at {config['klog.start']}"
    log.info("kernel-log source: %s", detail)
    pump = KernelLogPump(reader, publisher, stop)
    watch = ReaderLiveness(config, reader, detail, unproven)
    # The probes lend /dev/kmsg only once they run (a pod's containers start together):
    # a reader still without its bell asks again at each health beat.
    borrow = bool(config["klog.kmsg_socket"]) and reader.origin == "journald" and \
        bell_wanted(config, unproven)
    next_health = 0.0
    while not stop.is_set():
        if not pump.pump():
            if pump.checkpoint_due():
                pump.checkpoint()
            reader.wait(_idle_wait(reader, pump, next_health))
        elif pump.checkpoint_due():
            pump.checkpoint()
        if time.monotonic() >= next_health:
            if borrow and getattr(reader, "bell", True) is None:
                _borrow_bell(config, reader, watch)
            state, health_detail = watch.check(pump.counters["lines"])
            counters = {**pump.counters, "bus_full_retries": publisher.dropped,
                        "kmsg_overwritten": getattr(reader, "overwritten", 0)}
            publisher.publish(SourceHealth(ts=now_ns(), source="klog", state=state,
                                           detail=health_detail, counters=counters))
            next_health = time.monotonic() + HEALTH_EVERY_S
    pump.checkpoint()


def _borrow_bell(config: Config, reader: KernelLogReader, watch: ReaderLiveness) -> None:
    bell, rung_by = lent_bell(config["klog.kmsg_socket"])
    if bell is None:
        return
    watch.detail = watch.detail.replace(reader.rung_by, rung_by)  # type: ignore[attr-defined]
    reader.ring_with(bell, rung_by)                       # type: ignore[attr-defined]
    log.info("kernel-log source: %s", rung_by)


def _idle_wait(reader: KernelLogReader, pump: KernelLogPump, next_health: float) -> float:
    """How long to wait for a line: a reader woken by new lines sleeps until the next
    health beat or checkpoint; the others are looked at every IDLE_WAIT_S."""
    if not getattr(reader, "wakes_on_new_lines", False):     # a stand-in need not say
        return IDLE_WAIT_S
    return max(0.0, min(next_health - time.monotonic(), pump.checkpoint_in()))


class ReaderLiveness:
    """Whether the open reader can still receive kernel lines, re-checked every health beat.

    A journald that stops (its socket then refuses) or was never shown to read /dev/kmsg
    fails the source, logged once per episode; the correlator adds the other half (lines
    the kernel logged that this source never read, from the printk probe's count).
    """

    def __init__(self, config: Config, reader: KernelLogReader, detail: str,
                 unproven: str | None = None):
        self.system_journal = reader.origin == "journald" and not config["klog.journal_path"]
        self.degraded = reader.origin == "file"      # read times, rotations: best effort
        self.detail = detail
        self.unproven = unproven
        self.failing: str | None = None

    def check(self, lines_read: int) -> tuple[str, str]:
        problem = None
        if self.system_journal:
            refused = journald.journald_refuses()
            if refused:
                problem = f"journald is not running ({refused}): no kernel line can arrive"
        if problem is None and self.unproven and not lines_read:
            problem = f"no kernel line read yet: {self.unproven}"
        if problem != self.failing:
            if problem:
                log.error("kernel-log source: %s", problem)
            else:
                log.warning("kernel-log source: receiving again (%s)", self.detail)
            self.failing = problem
        if problem:
            return "failed", f"{problem}; {self.detail}"
        return ("degraded" if self.degraded else "ok"), self.detail
