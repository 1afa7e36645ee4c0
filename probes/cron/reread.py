"""When the cron schedule must be read again: its files changed, or one of its runs came due.

Reading the schedule costs tens of milliseconds and a `systemd-analyze calendar` process per
timer (~76 ms and six processes on a stock Debian host), and it used to run every minute
whatever happened. The same files give the same jobs, with the same next and last runs,
until the earliest next run passes; so the source looks at the files' metadata every
``cron.rescan_interval`` s (a few stat calls) and reads them only when that changed, when a
run came due, or once every FULL_READ_EVERY_S as a backstop for an edit that keeps a file's
size and second.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.probes.cron.schedule import ScheduledJob, read_cron_jobs
from gpuwhy.probes.cron.timers import STAMP_DIR, read_timers

FULL_READ_EVERY_S = 3600.0

FileState = tuple[str, int, int, int] | tuple[str, None, None, None]


def read_schedule(config: Config, stamp_dir: str = STAMP_DIR) -> list[ScheduledJob]:
    """Every cron job and systemd timer the config points at."""
    return read_cron_jobs(config["cron.etc"], config["cron.spool"]) + \
        read_timers(_unit_dirs(config), stamp_dir)


def _unit_dirs(config: Config) -> tuple[str, ...]:
    return tuple(d for d in config["cron.unit_dirs"].split(":") if d)


def _state(path: str) -> FileState:
    try:
        st = os.stat(path)
    except OSError:
        return (path, None, None, None)
    return (path, st.st_mtime_ns, st.st_size, st.st_ino)


def _entries(directory: str) -> list[str]:
    """The directory's entry names; none when it cannot be listed."""
    try:
        with os.scandir(directory) as scan:
            return [entry.name for entry in scan]
    except OSError:
        return []


def schedule_inputs(config: Config, stamp_dir: str = STAMP_DIR) -> frozenset[FileState]:
    """What the schedule is read from, each file and directory as (path, mtime, size, inode):
    the crontab, cron.d and the users' crontabs, every timer unit and the service it starts
    by name, and the timers' stamps (their last runs). A directory's own entry changes when
    a file is added, removed or replaced (how editors save)."""
    etc, spool = config["cron.etc"], config["cron.spool"]
    paths = [str(Path(etc, "crontab")), str(Path(etc, "cron.d")), spool, stamp_dir]
    paths += [str(Path(etc, "cron.d", n)) for n in _entries(str(Path(etc, "cron.d")))]
    paths += [str(Path(spool, n)) for n in _entries(spool)]
    paths += [str(Path(stamp_dir, n)) for n in _entries(stamp_dir)]
    unit_dirs = _unit_dirs(config)
    listed = {d: _entries(d) for d in unit_dirs}
    timers = {n for names in listed.values() for n in names if n.endswith(".timer")}
    services = {t.removesuffix(".timer") + ".service" for t in timers}
    for directory, names in listed.items():
        paths.append(directory)
        paths += [str(Path(directory, n)) for n in names if n in timers or n in services]
    return frozenset(_state(p) for p in paths)


class ScheduleReader:
    """``read_if_changed()``: the schedule when it must be read again, else None."""

    def __init__(self, config: Config, stamp_dir: str = STAMP_DIR):
        self.config, self.stamp_dir = config, stamp_dir
        self.inputs: frozenset[FileState] | None = None
        self.due_ns: float = 0          # the earliest next run of the last read
        self.read_at = -math.inf        # monotonic
        self.reads = 0

    def read_if_changed(self) -> list[ScheduledJob] | None:
        inputs = schedule_inputs(self.config, self.stamp_dir)
        if inputs == self.inputs and now_ns() < self.due_ns and \
                time.monotonic() - self.read_at < FULL_READ_EVERY_S:
            return None
        # The inputs are taken before the read: a change made during it is seen next time.
        jobs = read_schedule(self.config, self.stamp_dir)
        self.inputs, self.read_at = inputs, time.monotonic()
        self.due_ns = min((j.next_run for j in jobs if j.next_run is not None),
                          default=math.inf)
        self.reads += 1
        return jobs
