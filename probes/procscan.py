"""Start-up scan of /proc/*/fd for device files opened before gpuwhy started."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class OpenDevice:
    """One fd on a device file, as found in /proc/PID/fd."""

    pid: int
    fd: int
    path: str


def scan_open_devices(device_glob: str, proc_root: str = "/proc",
                      only_pid: int | None = None) -> Iterator[OpenDevice]:
    """Every fd of every process (or of ``only_pid``) whose target matches ``device_glob``.

    Processes and fds can vanish while we look; those are skipped, not errors.
    """
    try:
        pids = ([only_pid] if only_pid is not None
                else [int(name) for name in os.listdir(proc_root) if name.isdigit()])
    except OSError:
        return
    for pid in sorted(pids):
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for name in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, name))
            except OSError:
                continue
            if fnmatch.fnmatchcase(target, device_glob):
                yield OpenDevice(pid, int(name), target)


def literal_prefix(glob: str) -> str:
    """The part of a glob before its first wildcard: what the kernel side can compare.

    >>> literal_prefix("/dev/nvidia*")
    '/dev/nvidia'
    """
    for i, char in enumerate(glob):
        if char in "*?[":
            return glob[:i]
    return glob


def _parent(pid: int, proc_root: str) -> int | None:
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the name (field 2) may hold spaces and parentheses: the fields after its last ")"
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def inherited(found: list[OpenDevice], proc_root: str = "/proc") -> set[tuple[int, int]]:
    """The (pid, fd) of ``found`` that a process holds because it was forked from a holder:
    its parent holds the same file under the same fd number (a fork copies the table as it
    is; a process that opens a device itself gets the lowest free number, not one its parent
    happens to use for the same file). A DataLoader worker forked before gpuwhy started is
    then its parent's worker, as one seen forking is, not a GPU process of its own."""
    held: dict[tuple[int | None, int], str] = {(d.pid, d.fd): d.path for d in found}
    pids = {d.pid for d in found}
    parents = {pid: _parent(pid, proc_root) for pid in pids}
    return {(d.pid, d.fd) for d in found
            if parents[d.pid] in pids and held.get((parents[d.pid], d.fd)) == d.path}
