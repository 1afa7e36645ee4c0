"""Read systemd timers from their unit files (no systemd as PID 1 needed).

Each ``*.timer`` gives its ``OnCalendar=`` expressions and monotonic triggers
(``OnBootSec=``...), the unit it starts (``Unit=``, by default the same name with
``.service``) and that unit's ``ExecStart=`` (checked for GPU actions). ``OnCalendar``
is evaluated with ``systemd-analyze calendar`` when that tool exists; otherwise the
expression is shown raw and ``next_run`` is None (the note says so). ``last_run`` is the
mtime of ``/var/lib/systemd/timers/stamp-NAME`` (kept only for ``Persistent=true``).
Template units (``name@.timer``) are skipped: only their instances run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from gpuwhy.gpu_actions import gpu_action
from gpuwhy.probes.cron.schedule import MAX_COMMAND, ScheduledJob

UNIT_DIRS = ("/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
             "/lib/systemd/system", "/usr/lib/systemd/system")
STAMP_DIR = "/var/lib/systemd/timers"
_MONOTONIC_KEYS = ("OnActiveSec", "OnBootSec", "OnStartupSec", "OnUnitActiveSec",
                   "OnUnitInactiveSec")
MAX_UNIT_BYTES = 256 * 1024


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """``{section: {key: [values...]}}`` of a unit file; continuation lines joined."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
        elif current is not None and "=" in line:
            key, value = line.split("=", 1)
            values = current.setdefault(key.strip(), [])
            if value.strip():
                values.append(value.strip())
            else:
                values.clear()      # an empty assignment resets the list (systemd rule)
    return sections


def next_calendar_run(expression: str) -> int | None:
    """Next elapse of an OnCalendar expression (realtime ns) via systemd-analyze; None when
    the tool is missing or rejects the expression."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        return None
    try:
        result = subprocess.run([tool, "calendar", "--iterations=1", expression],
                                capture_output=True, text=True, timeout=5,
                                env={**os.environ, "TZ": "UTC", "LC_ALL": "C"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in result.stdout.splitlines():
        label, _, value = line.strip().partition(": ")
        if label == "Next elapse" and value.count(" ") >= 2:
            stamp = " ".join(value.split()[1:3])
            try:
                moment = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            except ValueError:
                return None
            return int(moment.timestamp()) * 1_000_000_000
    return None


def _read_unit(name: str, unit_dirs: tuple[str, ...]) -> tuple[Path, str] | None:
    for directory in unit_dirs:
        path = Path(directory, name)
        try:
            with open(path, "rb") as f:
                return path, f.read(MAX_UNIT_BYTES).decode("utf-8", errors="replace")
        except OSError:
            continue
    return None


def _exec_start(service: str, unit_dirs: tuple[str, ...]) -> str:
    found = _read_unit(service, unit_dirs)
    if found is None:
        return ""
    commands = parse_unit(found[1]).get("Service", {}).get("ExecStart", [])
    return " ; ".join(c.lstrip("@-:+!") for c in commands)[:MAX_COMMAND]


def _last_run(name: str, stamp_dir: str) -> int | None:
    try:
        return Path(stamp_dir, f"stamp-{name}").stat().st_mtime_ns
    except OSError:
        return None


def read_timers(unit_dirs: tuple[str, ...] = UNIT_DIRS,
                stamp_dir: str = STAMP_DIR) -> list[ScheduledJob]:
    """Every (non-template) systemd timer found in ``unit_dirs``; the first directory wins."""
    names: list[str] = []
    for directory in unit_dirs:
        try:
            names += [p.name for p in Path(directory).glob("*.timer") if "@." not in p.name]
        except OSError:
            continue
    evaluable = shutil.which("systemd-analyze") is not None
    jobs = []
    for name in sorted(set(names)):
        found = _read_unit(name, unit_dirs)
        if found is None:
            continue
        path, text = found
        timer = parse_unit(text).get("Timer", {})
        calendars = timer.get("OnCalendar", [])
        monotonic = [f"{k}={v}" for k in _MONOTONIC_KEYS for v in timer.get(k, [])]
        service = (timer.get("Unit") or [name.removesuffix(".timer") + ".service"])[-1]
        command = _exec_start(service, unit_dirs)
        runs = [t for t in (next_calendar_run(c) for c in calendars) if t is not None]
        note = "" if evaluable or not calendars else \
            "OnCalendar shown raw: systemd-analyze is not installed to evaluate it"
        if monotonic and not calendars:
            note = "monotonic timer: next run depends on boot/activation times"
        jobs.append(ScheduledJob("timer", str(path), name, "root",
                                 "; ".join(calendars + monotonic), command,
                                 min(runs) if runs else None, _last_run(name, stamp_dir),
                                 gpu_action(command), note))
    return jobs
