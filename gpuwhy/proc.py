"""Read a process's identity and facts from procfs; bounded, because the process controls them."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Collection
from dataclasses import dataclass

from gpuwhy.clock import realtime_from_ticks
from gpuwhy.errors import NoSuchProcess
from gpuwhy.events import ProcessSeen
from gpuwhy.identity import ProcessKey

MAX_CMDLINE = 4096
MAX_FIELD = 512
MAX_TAG = 128
MAX_CGROUP_FILE = 16384   # cgroup v1 lists one line per hierarchy: read them all to parse
TAG_VARIABLES = (b"GPUWHY_TAG", b"AI_PROFILER_TAG")
MAX_ENVIRON = 1 << 20       # the environment read: the variables past it are not seen
MAX_ENV_VALUE = 1024       # bytes of one variable's value recorded


def _read(path: str, limit: int) -> bytes:
    # str paths: pathlib's parsing was a third of reading a process (every exec on the host)
    with open(path, "rb") as f:
        return f.read(limit)


def _text(raw: bytes, limit: int = MAX_FIELD) -> str:
    return raw[:limit].decode("utf-8", errors="replace")


def read_stat(pid: int, proc_root: str = "/proc") -> tuple[str, int, int]:
    """``(comm, ppid, start_time)`` from /proc/PID/stat; start_time in clock ticks since boot."""
    try:
        raw = _read(f"{proc_root}/{pid}/stat", 4096)
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


def _read_environ(pid: int, proc_root: str) -> bytes | None:
    """The first MAX_ENVIRON bytes of the process's environment, NUL-led so that every
    entry is found as ``\\0NAME=``; None when unreadable (gone, or another user's)."""
    try:
        return b"\0" + _read(f"{proc_root}/{pid}/environ", MAX_ENVIRON)
    except OSError:
        return None


def _variable(environ: bytes, name: bytes, limit: int) -> str | None:
    # searched, not split: an environment can be a megabyte
    at = environ.rfind(b"\0" + name + b"=")     # the last one set is the one in force
    if at < 0:
        return None
    value = environ[at + len(name) + 2:]
    end = value.find(b"\0", 0, limit + 1)
    return _text(value[:end] if end >= 0 else value, limit)


def _tag(environ: bytes | None) -> str | None:
    if environ is None:
        return None
    for name in TAG_VARIABLES:
        value = _variable(environ, name, MAX_TAG)
        if value is not None:
            return value
    return None


def _environment(environ: bytes | None, names: Collection[str]) -> dict[str, str]:
    if environ is None:
        return {}
    found = {}
    for name in sorted(names):
        value = _variable(environ, name.encode(), MAX_ENV_VALUE)
        if value is not None:
            found[name] = value
    return found


def read_tag(pid: int, proc_root: str = "/proc") -> str | None:
    """The value of GPUWHY_TAG (or AI_PROFILER_TAG) in the process's environment, if any."""
    return _tag(_read_environ(pid, proc_root))


def read_tgid(pid: int, proc_root: str = "/proc") -> int | None:
    """The thread group (process) a task id belongs to; None when the task is gone."""
    try:
        for line in _read(f"{proc_root}/{pid}/status", 8192).splitlines():
            if line.startswith(b"Tgid:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _status_uids(pid: int, proc_root: str) -> list[int]:
    """The ids of ``Uid:`` in /proc/PID/status (real, effective, saved, filesystem; empty
    without the line); raises OSError."""
    for line in _read(f"{proc_root}/{pid}/status", 8192).splitlines():
        if line.startswith(b"Uid:"):
            return [int(i) for i in line.split()[1:]]
    return []


def read_uids(pid: int, proc_root: str = "/proc") -> tuple[int, int] | None:
    """The process's real and filesystem uids (/proc/PID/status, readable by anyone): a
    socket's owner in /proc/net/tcp is the fsuid that created it, which is the real uid but
    for a process that changed one of them. None for a process gone or unreadable."""
    try:
        ids = _status_uids(pid, proc_root)
        return ids[0], ids[3]
    except (OSError, ValueError, IndexError):
        return None


def _uid(pid: int, proc_root: str) -> int:
    ids = _status_uids(pid, proc_root)
    return ids[0] if ids else -1


# A container's cgroup leaf, by runtime: docker-<id>.scope (docker, systemd driver),
# cri-containerd-<id>.scope (containerd), crio-<id>.scope (cri-o), libpod-<id>.scope
# (podman), or a bare <id> (cgroupfs driver: /docker/<id>, /kubepods/.../pod<uid>/<id>).
# crio-conmon-<id>.scope is cri-o's monitor process, not the container: not matched.
_CONTAINER = re.compile(r"^(?:(?:docker|cri-containerd|crio|libpod)-)?([0-9a-f]{64})(?:\.scope)?$")
# pod<uid>, alone (cgroupfs driver) or inside a slice name, where systemd writes '_' for '-':
# kubepods-burstable-pod3f1c..._9a2b_....slice
_POD = re.compile(r"(?:^|-)pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_]"
                  r"[0-9a-f]{12})(?:\.slice)?$")
_UNIT = re.compile(r"^[^/]+\.(?:service|scope)$")


@dataclass(frozen=True)
class CgroupIdentity:
    """Who a process belongs to, read from its cgroup path: container, Kubernetes pod,
    systemd unit (each None when the path does not say)."""

    container_id: str | None = None
    pod_uid: str | None = None
    unit: str | None = None


@functools.lru_cache(maxsize=256)   # a host has few distinct cgroup paths
def _parse_cgroup_path(path: str) -> CgroupIdentity:
    container = pod = unit = None
    for part in path.split("/"):          # outermost first: the innermost match wins
        if len(part) >= 64 and (match := _CONTAINER.match(part)):
            container = match.group(1)
        if "pod" in part and (match := _POD.search(part)):
            pod = match.group(1).replace("_", "-")
        if part.endswith((".service", ".scope")) and _UNIT.match(part):
            unit = part
    return CgroupIdentity(container, pod, unit)


def parse_cgroup(text: str) -> CgroupIdentity:
    """Container id, pod uid and systemd unit from the text of /proc/PID/cgroup.

    Reads cgroup v2 (``0::/path``), v1 (``N:controllers:/path``, one line per hierarchy)
    and hybrid layouts. Each of the three is taken from the unified (v2) line when it
    says, else from the v1 ``name=systemd`` line, else from the first v1 line that does.
    Paths seen from another cgroup namespace (``/../../kubepods...``) parse the same.
    """
    paths: dict[str, int] = {}            # each distinct path once, at its best rank
    for line in text.splitlines():
        _hierarchy, sep1, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep1 and sep2):
            continue
        rank = 0 if controllers == "" else 1 if controllers == "name=systemd" else 2
        paths[path] = min(rank, paths.get(path, rank))
    found = [_parse_cgroup_path(path) for path in sorted(paths, key=paths.__getitem__)]

    def first(field: str) -> str | None:
        return next((getattr(f, field) for f in found if getattr(f, field)), None)

    return CgroupIdentity(first("container_id"), first("pod_uid"), first("unit"))


def read_process(pid: int, ts: int, proc_root: str = "/proc",
                 environment: Collection[str] = ()) -> ProcessSeen:
    """Everything gpuwhy records about a live process; raises :class:`NoSuchProcess`.
    ``environment``: the variables recorded in its ``env`` (the ``probes.environment``
    setting), read with its tag from one bounded read of its environment."""
    comm, ppid, start_time = read_stat(pid, proc_root)
    base = f"{proc_root}/{pid}"
    try:
        cmdline = _text(_read(f"{base}/cmdline", MAX_CMDLINE).rstrip(b"\0").replace(b"\0", b" "),
                        MAX_CMDLINE)
        cgroup_text = _text(_read(f"{base}/cgroup", MAX_CGROUP_FILE).strip(), MAX_CGROUP_FILE)
        uid = _uid(pid, proc_root)
    except (FileNotFoundError, ProcessLookupError):
        raise NoSuchProcess(pid, start_time) from None
    try:
        exe = _text(os.fsencode(os.readlink(f"{base}/exe")))
    except OSError:
        exe = ""
    owner = parse_cgroup(cgroup_text)
    environ = _read_environ(pid, proc_root)
    return ProcessSeen(ts=ts, process=ProcessKey(pid, start_time), comm=comm, cmdline=cmdline,
                       exe=exe, ppid=ppid, uid=uid, cgroup=cgroup_text[:MAX_FIELD],
                       tag=_tag(environ), env=_environment(environ, environment),
                       container_id=owner.container_id,
                       pod_uid=owner.pod_uid, unit=owner.unit,
                       started_at=realtime_from_ticks(start_time))
