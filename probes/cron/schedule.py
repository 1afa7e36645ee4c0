"""Read cron schedules: /etc/crontab, /etc/cron.d/*, user crontabs; next/last run via croniter.

System crontabs (``/etc/crontab``, ``/etc/cron.d/*``) have a user field; user crontabs
(``/var/spool/cron/crontabs/USER``) do not. Like Debian's cron, files in cron.d whose
names are not ``[A-Za-z0-9_-]+`` are ignored. ``VAR=value`` lines set the environment;
``CRON_TZ`` is not honoured (times are the host's local time, as cron uses).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from gpuwhy.gpu_actions import gpu_action

MAX_COMMAND = 1024
MAX_FILE_BYTES = 1 << 20
_CRON_D_NAME = re.compile(r"[A-Za-z0-9_-]+\Z")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*=")
_SPECIALS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
             "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
             "@hourly": "0 * * * *"}


@dataclass(frozen=True)
class ScheduledJob:
    """One scheduled job. ``origin``: ``crontab``, ``cron.d``, ``user`` or ``timer``.
    ``schedule`` is the expression as written; ``next_run``/``last_run`` are realtime ns
    (None when they cannot be evaluated: ``@reboot``, or a timer without a stamp)."""

    origin: str
    file: str
    ident: str
    user: str
    schedule: str
    command: str
    next_run: int | None = None
    last_run: int | None = None
    gpu_action: str | None = None
    note: str = ""


def _cron_times(expression: str, now: datetime) -> tuple[int | None, int | None, str]:
    from croniter import croniter

    expression = _SPECIALS.get(expression, expression)
    if expression == "@reboot":
        return None, None, "runs at boot only"
    try:
        it = croniter(expression, now)
        next_run = it.get_next(datetime)
        last_run = croniter(expression, now).get_prev(datetime)
    except (ValueError, KeyError) as exc:
        return None, None, f"invalid schedule: {exc}"
    return int(next_run.timestamp() * 1e9), int(last_run.timestamp() * 1e9), ""


def parse_crontab(text: str, *, origin: str, file: str, user: str | None,
                  now: datetime | None = None) -> list[ScheduledJob]:
    """Jobs of one crontab's text. ``user`` None means a system crontab (user field)."""
    now = now or datetime.now().astimezone()
    jobs = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#") or _ENV.match(line):
            continue
        fields = line.split(None, 1 if line.startswith("@") else 5)
        expected_min = 2 if line.startswith("@") else 6
        if user is None:
            fields = line.split(None, 2 if line.startswith("@") else 6)
            expected_min += 1
        if len(fields) < expected_min:
            continue
        if line.startswith("@"):
            schedule, rest = fields[0], fields[1:]
        else:
            schedule, rest = " ".join(fields[:5]), fields[5:]
        job_user = rest[0] if user is None else user
        command = (rest[1] if user is None else rest[0])[:MAX_COMMAND]
        next_run, last_run, note = _cron_times(schedule, now)
        jobs.append(ScheduledJob(origin, file, f"{file}:{lineno}", job_user, schedule, command,
                                 next_run, last_run, gpu_action(command), note))
    return jobs


def _read(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None


def read_cron_jobs(etc: str = "/etc", spool: str = "/var/spool/cron/crontabs",
                   now: datetime | None = None) -> list[ScheduledJob]:
    """Every job of the system crontab, /etc/cron.d and the users' crontabs."""
    jobs: list[ScheduledJob] = []
    crontab = Path(etc, "crontab")
    if (text := _read(crontab)) is not None:
        jobs += parse_crontab(text, origin="crontab", file=str(crontab), user=None, now=now)
    cron_d = Path(etc, "cron.d")
    if cron_d.is_dir():
        for path in sorted(cron_d.iterdir()):
            if _CRON_D_NAME.match(path.name) and (text := _read(path)) is not None:
                jobs += parse_crontab(text, origin="cron.d", file=str(path), user=None, now=now)
    spool_dir = Path(spool)
    if spool_dir.is_dir():
        for path in sorted(spool_dir.iterdir()):
            if (text := _read(path)) is not None:
                jobs += parse_crontab(text, origin="user", file=str(path), user=path.name,
                                      now=now)
    return jobs
