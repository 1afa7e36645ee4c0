"""The kernel-log source: read (journald, else /dev/kmsg, else a kern.log tail), parse, publish.

Nothing lost, nothing duplicated, even after ``kill -9``: every published record carries
its cursor, and the store writes the cursor in the same transaction as the record
(``StoreWriter._on_kernel_log_record``). Lines that are not NVIDIA lines only move the
cursor, through a :class:`KernelLogCheckpoint` now and then. On start the source reads
the cursor *from the store* and resumes after it; records that were on the bus when
the old source died and arrive again are recognised by their cursor and ignored.

Only the kernel's lines count (see ``journald.py``): an entry that claims to be the
driver's but was sent from user space is counted as a forgery attempt, with who sent it, in
the source's health and as a ``forged`` record the store keeps (a few a minute per sender),
and is never parsed. The records that name a GPU are bounded by the GPUs this host can have
(``gpus.py``). A line lost before it was read (the kernel's ring buffer overwrote it) is
reported with its sequence numbers when the reader can tell (``kmsg.py``): a counter, the
source degraded for a while, a warning in the log.

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
from gpuwhy.cursors import CursorReader, StoredCursor
from gpuwhy.errors import ConfigError, GpuwhyError
from gpuwhy.events import KernelLogCheckpoint, KernelLogFacts, KernelLogRecord, SourceHealth
from gpuwhy.probes.klog import journald
from gpuwhy.probes.klog.gpus import GpuBound
from gpuwhy.probes.klog.journald import IDLE_WAIT_S
from gpuwhy.probes.klog.kmsg import (
    KernelLineBell,
    KmsgKernelLog,
    current_boot_id,
    parse_cursor,
    parse_record,
)
from gpuwhy.probes.klog.lines import RawLine, UserSender
from gpuwhy.probes.klog.parse import UNPARSED, KernelLogParser, KernelRecord, unparsed_record
from gpuwhy.probes.klog.resume import connect_publisher, publish_reliably

log = logging.getLogger(__name__)

BACKENDS = ("auto", "journald", "kmsg", "file")
STARTS = ("boot", "all", "now")
CHECKPOINT_EVERY_S = 1.0
KMSG_FD_NAME = "kmsg"       # the FileDescriptorName= of systemd/gpuwhy-kmsg.socket
CHECKPOINT_EVERY_LINES = 2000
HEALTH_EVERY_S = 5.0
MAX_LINE_STORED = 2048
FORGED = "forged"               # the record kind of a forgery attempt
# One stored record per sender this often, the attempts between them counted in it: a loop
# of `systemd-cat -t NVRM` (1 000 entries in 0.2 s) must not fill the store or the log.
FORGED_RECORD_EVERY_S = 60.0
MAX_SENDERS = 32                # senders told apart; the rest are tallied together
MAX_FORGED_LINE = 512
GAP_DEGRADED_S = 600.0          # the source reads degraded this long after a lost line
MAX_GAPS_SHOWN = 3
LOST_LOG_EVERY_S = 10.0


class KernelLogReader(Protocol):
    origin: str

    # wait() returns when a line comes: it may be given long
    @property
    def wakes_on_new_lines(self) -> bool: ...

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
    from gpuwhy.probes.klog.tail import FileKernelLog

    backend = config["klog.backend"]
    if backend not in BACKENDS:
        raise ConfigError(f"expected one of {', '.join(BACKENDS)}, got {backend!r}",
                          key="klog.backend")
    if config["klog.start"] not in STARTS:
        raise ConfigError(f"expected one of {', '.join(STARTS)}, got {config['klog.start']!r}",
                          key="klog.start")
    reasons = []
    reader: KernelLogReader
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
            return reader, f"journald: kernel lines of {path or 'the system journal'} " \
                           f"(user-space NVRM entries counted as forgeries); {rung_by}", \
                unproven
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


class Forgeries:
    """Forgery attempts (user-space entries that call themselves kernel lines), by sender:
    how many, and when each sender is due its next stored record. Bounded: MAX_SENDERS."""

    OTHERS = (None, "")

    def __init__(self) -> None:
        self.total = 0
        # (uid, transport) -> [attempts, attempts since its last record, last record at, the
        # latest sender in words]. Told apart by user, not by command: the command name is
        # the sender's to choose (and is often gone by the time journald looks it up).
        self.senders: dict[tuple, list] = {}

    def note(self, sender: UserSender) -> tuple[tuple, list]:
        self.total += 1
        key = (sender.uid, sender.transport)
        if key not in self.senders and len(self.senders) >= MAX_SENDERS:
            key = self.OTHERS
        entry = self.senders.setdefault(key, [0, 0, None, sender.describe()])
        entry[0] += 1
        entry[1] += 1
        entry[3] = sender.describe() if key != self.OTHERS else "other senders"
        return key, entry

    @staticmethod
    def due(entry: list, now: float) -> bool:
        return entry[2] is None or now - entry[2] >= FORGED_RECORD_EVERY_S

    def summary(self) -> str:
        """For the health detail: the total and the busiest senders."""
        if not self.total:
            return ""
        busiest = sorted(self.senders.values(), key=lambda e: -e[0])[:3]
        who = "; ".join(f"{e[3]}: {e[0]}" for e in busiest)
        return f"{self.total} forged NVRM entries from user space ignored (not kernel " \
               f"lines; {who})"


def forged_record(sender: UserSender, attempts: int) -> KernelRecord:
    """The record a forgery attempt is kept as: who sent it and how often, no GPU fact."""
    return KernelRecord(FORGED, message=f"a user-space process sent a line claiming to be the "
                        f"NVIDIA driver's; not a kernel line, ignored: {sender.describe()}",
                        details={"uid": sender.uid, "sender_pid": sender.pid,
                                 "comm": sender.comm[:64], "transport": sender.transport[:32],
                                 "attempts": attempts})


def record_event(raw: RawLine, record: KernelRecord, origin: str, ts: int) -> KernelLogRecord:
    """The bus event of one record of ``raw``; the line kept is bounded (MAX_LINE_STORED)."""
    facts = {f.name: getattr(record, f.name) for f in dataclasses.fields(KernelLogFacts)}
    details = dict(record.details)
    if raw.facility:
        # written to /dev/kmsg from user space (root only): kept, and said so
        details["kmsg_facility"] = raw.facility
    line = raw.text[:MAX_LINE_STORED]
    if not line.isascii():
        # a lone surrogate (no real reader makes one) would make SQLite refuse the record
        line = line.encode("utf-8", "replace").decode("utf-8")
    return KernelLogRecord(
        ts=ts, raw_ts=raw.monotonic_ns, cursor=raw.cursor, origin=origin, boot_id=raw.boot_id,
        record_kind=record.kind, **{**facts, "details": details}, line=line)


class KernelLogPump:
    """Reads lines from a reader, publishes records and checkpoints; counts everything.

    A line that cannot be parsed is published as an ``unparsed`` record with its reason
    (counted in ``unparsed``), like any other record: the store keeps it and moves the
    cursor past it, so one bad line never stops the source, nor stops it again after a
    restart. A line of gpuwhy's own test suite (:meth:`RawLine.is_test_line`) is counted in
    ``test_lines`` and dropped unless ``take_test_lines`` (setting ``klog.test_lines``).
    """

    def __init__(self, reader: KernelLogReader, publisher: Publisher, stop: threading.Event,
                 clock: ClockConverter | None = None, boot_id: str | None = None,
                 bound: GpuBound | None = None, take_test_lines: bool = False):
        self.reader = reader
        self.publisher = publisher
        self.stop = stop
        self.clock = clock or ClockConverter()
        self.boot_id = boot_id if boot_id is not None else _boot_id_or_empty()
        self.parser = KernelLogParser()
        self.bound = bound if bound is not None else GpuBound()
        self.forgeries = Forgeries()
        self.counters = {"lines": 0, "records": 0, "unparsed": 0, "checkpoints": 0,
                         "forged": 0, "gpus_over_bound": 0, "daemon_missed": 0,
                         "test_lines": 0}
        self.take_test_lines = take_test_lines
        self.missed_at: float | None = None
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
            records: list[KernelLogRecord] = []
            if raw.missed:
                self.missed(raw.missed, self.realtime(raw))
            elif not self.take_test_lines and raw.is_test_line():
                self.counters["test_lines"] += 1      # gpuwhy's test suite's, not the driver's
            else:
                records = self.forgery(raw) if raw.forged_by is not None else \
                    self.events(raw)
            for event in records:
                if not publish_reliably(self.publisher, event, self.stop):
                    return count
                if event.record_kind != FORGED:
                    self.counters["unparsed" if event.record_kind == UNPARSED else
                                  "records"] += 1
            if not self.parser.pending:
                self._safe = raw
                self._skipped = 0 if records else self._skipped + 1
            if self._skipped >= CHECKPOINT_EVERY_LINES:
                self.checkpoint()
        return count

    def missed(self, count: int, when_ns: int | None = None) -> None:
        """The log daemon said it missed ``count`` kernel lines (which ones, it cannot say),
        at ``when_ns`` (realtime; None: now). Counted and said whenever it was; the source
        reads degraded for GAP_DEGRADED_S from when it happened, not from when this reader
        came to the report (a start that reads the boot's journal finds hours-old ones)."""
        self.counters["daemon_missed"] += count
        age_s = max(0.0, (now_ns() - when_ns) / 1e9) if when_ns is not None else 0.0
        self.missed_at = time.monotonic() - age_s
        log.warning("kernel-log source: journald reports it missed %d kernel lines (the "
                    "kernel's ring buffer overwrote them before journald read them)", count)

    def forgery(self, raw: RawLine) -> list[KernelLogRecord]:
        """A line a user-space process sent as the driver's: counted, never parsed; kept as
        a ``forged`` record at most every FORGED_RECORD_EVERY_S per sender (not while a
        multi-line report is open: its record would move the stored cursor past it)."""
        sender = raw.forged_by
        assert sender is not None
        self.counters["forged"] += 1
        _, entry = self.forgeries.note(sender)
        now = time.monotonic()
        if self.parser.pending or not self.forgeries.due(entry, now):
            return []
        attempts, entry[1], entry[2] = entry[1], 0, now
        log.warning("kernel-log source: a user-space process sent a line claiming to be the "
                    "NVIDIA driver's, ignored (%d such since its last warning): %s",
                    attempts, sender.describe())
        line = raw.text[:MAX_FORGED_LINE]
        return [record_event(dataclasses.replace(raw, text=line), forged_record(sender, attempts),
                             self.reader.origin, raw.realtime_ns or now_ns())]

    def bounded(self, event: KernelLogRecord) -> KernelLogRecord:
        """``event``, or an ``unparsed`` record in its place when it names a GPU beyond the
        ones this host can have (logged once)."""
        if event.pci is None or self.bound.admit(event.pci):
            return event
        self.counters["gpus_over_bound"] += 1
        if self.counters["gpus_over_bound"] == 1:
            log.warning("kernel-log source: a kernel line names GPU %s, beyond the %s: "
                        "such lines are kept unparsed and counted, no GPU is made of them",
                        event.pci, self.bound.describe())
        record = unparsed_record(f"names PCI address {event.pci}, beyond the GPUs this host "
                                 f"can have ({self.bound.describe()})", event.record_kind)
        facts = {f.name: getattr(record, f.name) for f in dataclasses.fields(KernelLogFacts)}
        return dataclasses.replace(event, record_kind=UNPARSED,
                                   **{**facts, "details": dict(record.details)})

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
                out.append(self.bounded(record_event(source, record, self.reader.origin,
                                                     self.realtime(source))))
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


def run_klog_source(config: Config, stop: threading.Event, *, cursors: CursorReader) -> None:
    """Source runner (see ``gpuwhy.app.service.unprivileged_sources``): until ``stop`` is set.
    ``cursors`` reads where the store says the source stopped (on a first run: None)."""
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
            _run(config, reader, detail, publisher, stop, cursors("klog"), unproven)
        finally:
            reader.close()
    finally:
        publisher.close()


def _run(config: Config, reader: KernelLogReader, detail: str, publisher: Publisher,
         stop: threading.Event, stored: StoredCursor | None, unproven: str | None = None
         ) -> None:
    detail += "; " + resume(config, reader, stored)
    log.info("kernel-log source: %s", detail)
    pump = KernelLogPump(reader, publisher, stop, take_test_lines=config["klog.test_lines"])
    lost = LostLines()
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
            lost.take(reader)
            reader.wait(_idle_wait(reader, pump, next_health))
        elif pump.checkpoint_due():
            pump.checkpoint()
        lost.take(reader)
        if time.monotonic() >= next_health:
            if borrow and getattr(reader, "bell", True) is None:
                _borrow_bell(config, reader, watch)
            publisher.publish(health_of(watch, pump, lost, publisher))
            next_health = time.monotonic() + HEALTH_EVERY_S
    pump.checkpoint()


def health_of(watch: ReaderLiveness, pump: KernelLogPump, lost: LostLines,
              publisher: Publisher) -> SourceHealth:
    """The source's heartbeat: the reader's liveness, degraded while a loss is recent, and in
    its detail every loss and forgery seen."""
    state, detail = watch.check(pump.counters["lines"])
    missed_lately = pump.missed_at is not None and \
        time.monotonic() - pump.missed_at < GAP_DEGRADED_S
    if state == "ok" and (lost.recent() or missed_lately):
        state = "degraded"
    missed = pump.counters["daemon_missed"]
    extras = [lost.describe(), pump.forgeries.summary(),
              f"journald missed {missed} kernel lines (its own count: which ones, it cannot "
              f"say)" if missed else ""]
    detail = "; ".join([detail] + [extra for extra in extras if extra])
    counters = {**pump.counters, "bus_full_retries": publisher.dropped,
                "kmsg_overwritten": getattr(pump.reader, "overwritten", 0),
                "lost_lines": lost.lines, "lost_ranges": lost.gaps}
    return SourceHealth(ts=now_ns(), source="klog", state=state, detail=detail,
                        counters=counters)


class LostLines:
    """Lines the kernel logged that the reader never got, as its sequence numbers show:
    totals, the last ranges, a warning in the log for each (at most one every
    LOST_LOG_EVERY_S, the ranges between summed into the next)."""

    def __init__(self) -> None:
        self.lines = self.gaps = 0
        self.last: list[tuple[int, int]] = []
        self.last_at: float | None = None
        self._unlogged: list[tuple[int, int]] = []
        self._logged_at = -LOST_LOG_EVERY_S
        self.unknown_before: int | None = None     # a loss whose size cannot be told

    def take(self, reader: KernelLogReader) -> None:
        unknown = getattr(reader, "unknown_loss_before", None)
        if unknown is not None and self.unknown_before is None:
            self.unknown_before, self.last_at = unknown, time.monotonic()
            log.warning("kernel-log source: the kernel's ring buffer no longer holds the "
                        "last line read before this start: lines before sequence number %d "
                        "may have been lost (how many cannot be told)", unknown)
        take = getattr(reader, "take_gaps", None)
        gaps = take() if take is not None else []
        for first, last in gaps:
            self.lines += last - first + 1
            self.gaps += 1
            self.last = (self.last + [(first, last)])[-MAX_GAPS_SHOWN:]
            self.last_at = time.monotonic()
        self._unlogged += gaps
        now = time.monotonic()
        if self._unlogged and now - self._logged_at >= LOST_LOG_EVERY_S:
            ranges, self._unlogged, self._logged_at = self._unlogged, [], now
            count = sum(last - first + 1 for first, last in ranges)
            shown = ", ".join(f"{first}-{last}" for first, last in ranges[:MAX_GAPS_SHOWN])
            more = f" and {len(ranges) - MAX_GAPS_SHOWN} more ranges" \
                if len(ranges) > MAX_GAPS_SHOWN else ""
            log.warning("kernel-log source: %d kernel lines were lost before they were read "
                        "(the kernel's ring buffer overwrote them): sequence numbers %s%s",
                        count, shown, more)

    def recent(self) -> bool:
        return self.last_at is not None and time.monotonic() - self.last_at < GAP_DEGRADED_S

    def describe(self) -> str:
        said = []
        if self.unknown_before is not None:
            said.append(f"kernel lines before sequence number {self.unknown_before} may have "
                        f"been lost at start (the ring no longer held the last line read)")
        if self.gaps:
            ranges = ", ".join(f"[{first}, {last}]" for first, last in self.last)
            said.append(f"{self.lines} kernel lines lost unread in {self.gaps} ranges "
                        f"(sequence numbers, the last: {ranges})")
        return "; ".join(said)


def resume(config: Config, reader: KernelLogReader, stored: StoredCursor | None) -> str:
    """Position ``reader`` after what the store holds (``stored``), and say how: after the
    stored cursor
    of the same backend; after the stored position of another backend, translated through
    the last line's own stamps (boot id, printk time), so that a switch between journald and
    /dev/kmsg reads nothing twice and skips nothing; else by ``klog.start``."""
    if stored and stored.origin == reader.origin:
        if reader.seek(stored.cursor, config["klog.start"]):
            return "resumed after the stored cursor"
        return f"stored cursor not usable here (another boot's, or not found), starting " \
               f"at {config['klog.start']}"
    if stored and hasattr(reader, "seek_stamp"):
        stamp = stamp_of(stored, config)
        if stamp is not None:
            boot_id, usec, ties, how = stamp
            reader.seek(None, "boot")
            if reader.seek_stamp(boot_id, usec, ties):
                return f"resumed after the stored {stored.origin} position, at printk time " \
                       f"{usec} us of boot {boot_id[:8]} ({how})"
    reader.seek(None, config["klog.start"])
    if stored:
        return f"the stored {stored.origin} position cannot be found in {reader.origin}: " \
               f"starting at {config['klog.start']}"
    return f"first run, starting at {config['klog.start']}"


def stamp_of(stored: StoredCursor, config: Config) -> tuple[str, int, int, str] | None:
    """``(boot_id, printk usec, ties, how)`` of the last line behind a stored cursor."""
    if stored.origin == "journald":
        return journald.stamp_of_cursor(stored.cursor, config["klog.journal_path"] or None)
    parsed = parse_cursor(stored.cursor) if stored.origin == "kmsg" else None
    if parsed is None:
        return None
    boot_id, seq, usec = parsed
    in_ring = ring_stamp(config["klog.kmsg_path"], boot_id, seq)
    if in_ring is not None:
        return boot_id, *in_ring, "the record's printk time"
    if usec is not None:
        # the record left the ring: were others printed in its microsecond, the ones
        # after it are read again
        return boot_id, usec, 0, "the cursor's printk time"
    return None


def ring_stamp(path: str, boot_id: str, seq: int) -> tuple[int, int] | None:
    """``(usec, ties)`` of record ``seq`` when the kernel's ring (of this boot) still holds it."""
    if boot_id != _boot_id_or_empty():
        return None
    try:
        ring = KmsgKernelLog(path, boot_id)
    except OSError:
        return None
    try:
        last_usec, ties = -1, 0
        for record in ring.records():
            parsed = parse_record(record)
            if parsed is None:
                continue
            _, record_seq, usec, _ = parsed
            ties = ties + 1 if usec == last_usec else 0
            last_usec = usec
            if record_seq == seq:
                return usec, ties
            if record_seq > seq:
                return None
        return None
    finally:
        ring.close()


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
