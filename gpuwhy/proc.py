"""Read a process's identity and facts from procfs; bounded, because the process controls them."""

from __future__ import annotations

import os
from pathlib import Path

from gpuwhy.errors import NoSuchProcess
from gpuwhy.events import ProcessSeen
from gpuwhy.identity import ProcessKey

MAX_CMDLINE = 4096
MAX_FIELD = 512
MAX_TAG = 128
TAG_VARIABLES = (b"GPUWHY_TAG", b"AI_PROFILER_TAG")


def _read(path: Path, limit: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(limit)


def _text(raw: bytes, limit: int = MAX_FIELD) -> str:
    return raw[:limit].decode("utf-8", errors="replace")


def read_stat(pid: int, proc_root: str = "/proc") -> tuple[str, int, int]:
    """``(comm, ppid, start_time)`` from /proc/PID/stat; start_time in clock ticks since boot."""
    try:
        raw = _read(Path(proc_root, str(pid), "stat"), 4096)
    except (FileNotFoundError, ProcessLookupError):
        raise NoSuchProcess(pid) from None
    # comm may itself hold ')' and spaces: it ends at the last ')'.
    open_paren, close_paren = raw.find(b"("), raw.rfind(b")")
    fields = raw[close_paren + 2:].split()
    # fields[0] is field 3 (state): ppid is field 4, starttime field 22.
    return _text(raw[open_paren + 1:close_paren]), int(fields[1]), int(fields[19])


def process_key(pid: int, proc_root: str = "/proc") -> ProcessKey:
    """The ``(pid, start_time)`` key of a live process; raises :class:`NoSuchProcess`."""
    return ProcessKey(pid, read_stat(pid, proc_root)[2])


def read_tag(pid: int, proc_root: str = "/proc") -> str | None:
    """The value of GPUWHY_TAG (or AI_PROFILER_TAG) in the process's environment, if any."""
    try:
        environ = _read(Path(proc_root, str(pid), "environ"), 1 << 20)
    except OSError:
        return None
    found = {}
    for entry in environ.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name in TAG_VARIABLES:
            found[name] = value
    for name in TAG_VARIABLES:
        if name in found:
            return _text(found[name], MAX_TAG)
    return None


def read_tgid(pid: int, proc_root: str = "/proc") -> int | None:
    """The thread group (process) a task id belongs to; None when the task is gone."""
    try:
        for line in _read(Path(proc_root, str(pid), "status"), 8192).splitlines():
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _uid(pid: int, proc_root: str) -> int:
    for line in _read(Path(proc_root, str(pid), "status"), 8192).splitlines():
        if line.startswith(b"Uid:"):
            return int(line.split()[1])
    return -1


def read_process(pid: int, ts: int, proc_root: str = "/proc") -> ProcessSeen:
    """Everything gpuwhy records about a live process; raises :class:`NoSuchProcess`."""
    comm, ppid, start_time = read_stat(pid, proc_root)
    base = Path(proc_root, str(pid))
    try:
        cmdline = _text(_read(base / "cmdline", MAX_CMDLINE).rstrip(b"\0").replace(b"\0", b" "),
                        MAX_CMDLINE)
        cgroup = _text(_read(base / "cgroup", MAX_FIELD).strip())
        uid = _uid(pid, proc_root)
    except (FileNotFoundError, ProcessLookupError):
        raise NoSuchProcess(pid, start_time) from None
    try:
        exe = _text(os.fsencode(os.readlink(base / "exe")))
    except OSError:
        exe = ""
    return ProcessSeen(ts=ts, process=ProcessKey(pid, start_time), comm=comm, cmdline=cmdline,
                       exe=exe, ppid=ppid, uid=uid, cgroup=cgroup,
                       tag=read_tag(pid, proc_root))
