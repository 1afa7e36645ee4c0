"""The cron source: the schedule (crontabs, cron.d, user crontabs, systemd timers) and the
executions cron logs to the journal, each tied to the job's process.

The schedule is published whole at start and again whenever it changed: its files are
looked at every ``cron.rescan_interval`` seconds and read again only when they changed or a
job's run came due (:mod:`gpuwhy.probes.cron.reread`).
Executions come from journald (``SYSLOG_IDENTIFIER=CRON``), resumed from the cursor the
store committed with the last one, like the kernel-log source. For a started job the
``[pid]`` of ``cron -L 15`` is looked up in /proc: when that process still runs and
started before the log line, its start time completes the ``(pid, start_time)`` key that
the exec events of the job's processes carry. Without ``-L 15`` cron logs no job pid:
the health detail says so once such a line is seen.
"""

from __future__ import annotations

import logging
import threading
import time

from gpuwhy.bus import Publisher
from gpuwhy.clock import ClockConverter, now_ns, ticks_to_ns
from gpuwhy.config import Config
from gpuwhy.cursors import CursorReader, StoredCursor
from gpuwhy.errors import NoSuchProcess
from gpuwhy.events import CronExecution, CronSchedule, SourceHealth
from gpuwhy.gpu_actions import gpu_action
from gpuwhy.probes.cron.logline import parse_cron_line
from gpuwhy.probes.cron.reread import ScheduleReader
from gpuwhy.probes.cron.schedule import ScheduledJob
from gpuwhy.probes.klog.lines import RawLine
from gpuwhy.probes.klog.resume import connect_publisher, publish_reliably
from gpuwhy.proc import read_stat

log = logging.getLogger(__name__)

MAX_JOBS = 2000
HEALTH_EVERY_S = 5.0
STOP_SEEN_WITHIN_S = 1.0    # the journal wait's longest: a stop must be seen within 2 s
START_SLACK_NS = 2_000_000_000


def schedule_event(jobs: list[ScheduledJob]) -> CronSchedule:
    return CronSchedule(ts=now_ns(), jobs=[vars(job).copy() for job in jobs[:MAX_JOBS]],
                        truncated=len(jobs) > MAX_JOBS)


def job_start_time(pid: int, logged_at_ns: int, clock: ClockConverter,
                   proc_root: str = "/proc") -> int | None:
    """The /proc start time of the job's process, when ``pid`` is still that process: a
    process that started after the log line is a later process that reused the pid."""
    try:
        start_ticks = read_stat(pid, proc_root)[2]
    except (NoSuchProcess, OSError, ValueError, IndexError):
        return None
    if clock.realtime_from_boottime(ticks_to_ns(start_ticks)) > logged_at_ns + START_SLACK_NS:
        return None
    return start_ticks


def execution_event(raw: RawLine, ts: int, clock: ClockConverter,
                    proc_root: str = "/proc") -> CronExecution | None:
    """The CronExecution of one journal line of cron's; None for its other lines."""
    line = parse_cron_line(raw.text)
    if line is None:
        return None
    start_time = None
    if line.phase == "started" and line.job_pid is not None:
        start_time = job_start_time(line.job_pid, ts, clock, proc_root)
    return CronExecution(ts=ts, raw_ts=raw.monotonic_ns, cursor=raw.cursor, phase=line.phase,
                         user=line.user, command=line.command, job_pid=line.job_pid,
                         job_start_time=start_time,
                         cron_pid=line.cron_pid if line.cron_pid else raw.sender_pid,
                         gpu_action=gpu_action(line.command), boot_id=raw.boot_id)


def run_cron_source(config: Config, stop: threading.Event, *, cursors: CursorReader) -> None:
    """Source runner (see ``gpuwhy.app.service.unprivileged_sources``): until ``stop`` is set.
    ``cursors`` reads where the store says the source stopped (on a first run: None)."""
    publisher = connect_publisher(config, "cron", stop)
    if publisher is None:
        return
    try:
        _run(config, publisher, stop, cursors("cron"))
    finally:
        publisher.close()


FIRST_RUN = {"boot": ", from the start of this boot", "all": ", from the oldest kept",
             "now": ", from now on"}


def _open_journal(config: Config, stored: StoredCursor | None) -> tuple[object | None, str]:
    try:
        from gpuwhy.probes.klog.journald import JournalKernelLog, journald_refuses

        refused = None if config["cron.journal_path"] else journald_refuses()
        if refused:
            return None, f"journald is not running ({refused}): schedule only, no executions"
        reader = JournalKernelLog(config["cron.journal_path"] or None,
                                  matches=({"SYSLOG_IDENTIFIER": "CRON"},))
    except (ImportError, OSError) as exc:
        return None, f"cannot read the journal ({exc}): schedule only, no executions"
    start = config["klog.start"]
    resumed = reader.seek(stored.cursor if stored else None, start)
    return reader, "journald CRON lines" + (", resumed after the stored cursor" if resumed
                                             else FIRST_RUN.get(start, f", from {start}"))


def _run(config: Config, publisher: Publisher, stop: threading.Event,
         stored: StoredCursor | None) -> None:
    clock = ClockConverter()
    reader, detail = _open_journal(config, stored)
    counters = {"jobs": 0, "gpu_acting_jobs": 0, "executions": 0, "without_job_pid": 0,
                "schedule_reads": 0}
    schedule = ScheduleReader(config)
    next_scan = next_health = 0.0
    try:
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_scan:
                jobs = schedule.read_if_changed()
                if jobs is not None:
                    counters["jobs"] = len(jobs)
                    counters["gpu_acting_jobs"] = sum(1 for j in jobs if j.gpu_action)
                    counters["schedule_reads"] = schedule.reads
                    publish_reliably(publisher, schedule_event(jobs), stop)
                next_scan = now + config["cron.rescan_interval"]
            if reader is not None:
                _pump(reader, publisher, stop, clock, counters)
            if now >= next_health:
                note = "; cron logs no job pids (run cron with -L 15)" \
                    if counters["without_job_pid"] else ""
                publisher.publish(SourceHealth(
                    ts=now_ns(), source="cron", state="ok" if reader else "degraded",
                    detail=detail + note, counters=dict(counters)))
                next_health = now + HEALTH_EVERY_S
            until_due = max(0.0, min(next_scan, next_health) - time.monotonic())
            if reader is not None:
                # journald wakes its readers itself: at once after a quiet spell, within its
                # 0.25-0.5 s post-change timer on a host that logs all the time. A cron line
                # only has to reach the chain within a second (P7), and the job's start time
                # is read while the job runs; looking every 0.1 s cost an idle host ten
                # wake-ups a second (the kernel-log source has a bell instead).
                reader.wait(min(until_due, STOP_SEEN_WITHIN_S))  # type: ignore[attr-defined]
            else:       # schedule only: nothing happens before the next rescan or beat
                stop.wait(until_due)
    finally:
        if reader is not None:
            reader.close()    # type: ignore[attr-defined]


def _pump(reader: object, publisher: Publisher, stop: threading.Event,
          clock: ClockConverter, counters: dict[str, int]) -> None:
    for raw in reader.lines(500):    # type: ignore[attr-defined]
        ts = raw.realtime_ns or now_ns()    # when cron logged it, as it started the job
        event = execution_event(raw, ts, clock)
        if event is None:
            continue
        if event.phase == "started" and event.job_pid is None:
            counters["without_job_pid"] += 1
        if not publish_reliably(publisher, event, stop):
            return
        counters["executions"] += 1
