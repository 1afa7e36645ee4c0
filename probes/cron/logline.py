"""Parse cron's own log lines: ``(user) CMD (command)`` when a job starts and ``(user) END
(command)`` when it ends; ``cron -L 15`` adds the job's pid: ``CMD ([15615] command)``.

Accepts the journald ``MESSAGE`` (identifier split off) and whole syslog lines
(``... CRON[1234]: (root) CMD (...)``). The command is the job's text: untrusted, bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_COMMAND = 1024
_CRON_LINE = re.compile(
    r"(?:CRON\[(?P<cron_pid>\d+)\]: )?\((?P<user>[^()\s]{1,64})\) (?P<action>CMD|END) "
    r"\((?:\[(?P<pid>\d+)\] ?)?(?P<command>.*)\)\s*$")


@dataclass(frozen=True)
class CronLogLine:
    """``phase`` is ``started`` (CMD) or ``ended`` (END)."""

    phase: str
    user: str
    command: str
    job_pid: int | None = None
    cron_pid: int | None = None


def parse_cron_line(text: str) -> CronLogLine | None:
    """The job start/end in one cron log line, or None.

    >>> parse_cron_line("(root) CMD ([15615] /bin/echo hi)")
    CronLogLine(phase='started', user='root', command='/bin/echo hi', job_pid=15615, cron_pid=None)
    """
    match = _CRON_LINE.search(text[:MAX_COMMAND * 2])
    if match is None:
        return None
    return CronLogLine("started" if match["action"] == "CMD" else "ended", match["user"],
                       match["command"][:MAX_COMMAND],
                       int(match["pid"]) if match["pid"] else None,
                       int(match["cron_pid"]) if match["cron_pid"] else None)
