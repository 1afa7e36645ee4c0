"""Tail a kern.log-style file (the last fallback: no journald, no readable /dev/kmsg).

The cursor is ``file:INODE:OFFSET`` of the byte after the last complete line read.
After rotation (a new inode) or truncation, reading restarts at offset 0 of the file.
Lines carry no clock we can trust across boots: their time is when we read them.

What is trusted: a kern.log holds what the syslog daemon files under facility kern, and
a user cannot log with that facility through syslog(3). Where the file is a wider syslog
file, a line with a syslog header whose program is not ``kernel`` (``logger -t NVRM``) was
sent from user space: it comes out ``forged_by`` its tag and pid, never parsed. A line
without a syslog header (a dmesg dump) is taken as the kernel's. This is best effort: a
daemon that writes no header, or a sender that names itself ``kernel`` over a raw socket,
is not told apart (journald's ``_TRANSPORT`` and /dev/kmsg are; prefer them).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from typing import BinaryIO

from gpuwhy.probes.klog.lines import RawLine, UserSender

MAX_LINE = 8192
# "Dec  7 16:00:00 host TAG[pid]: " (RFC 3164) or "2026-12-07T16:00:00.1+00:00 host TAG: "
# (RFC 3339, rsyslog's default on Debian); the tag as syslog daemons write it (no spaces).
_SYSLOG_HEADER = re.compile(
    r"(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT[\d:.]{8,20}(?:Z|[+-]\d\d:\d\d))"
    r" \S{1,255} (?P<tag>[^\s\[:]{1,64})(?:\[(?P<pid>\d{1,10})\])?: ", re.ASCII)


def sender_of_line(text: str) -> UserSender | None:
    """The user-space sender of a syslog-file line whose program is not the kernel; None for
    the kernel's lines and lines without a syslog header."""
    match = _SYSLOG_HEADER.match(text)
    if match is None or match["tag"] == "kernel":
        return None
    return UserSender(None, int(match["pid"]) if match["pid"] else None, match["tag"],
                      "syslog file")


class FileKernelLog:
    """Complete lines appended to ``path``, after a stored cursor."""

    origin = "file"
    wakes_on_new_lines = False    # a file is polled

    def __init__(self, path: str = "/var/log/kern.log", boot_id: str = ""):
        self.path = path
        self.boot_id = boot_id
        self._file: BinaryIO | None = None
        self._inode = -1
        self._offset = 0

    def _open(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        if self._file is not None and (st.st_ino != self._inode or st.st_size < self._offset):
            self._file.close()
            self._file, self._offset = None, 0
        if self._file is None:
            self._file = open(self.path, "rb")
            self._inode = st.st_ino
            self._file.seek(self._offset)
        return True

    def seek(self, cursor: str | None, start: str) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            st = None
        if cursor and cursor.startswith("file:") and st is not None:
            _, inode, offset = cursor.split(":", 2)
            if inode == str(st.st_ino) and offset.isdigit() and int(offset) <= st.st_size:
                self._inode, self._offset = st.st_ino, int(offset)
                return True
        if start == "now" and st is not None:
            self._inode, self._offset = st.st_ino, st.st_size
        return False

    def lines(self, limit: int = 1000) -> Iterator[RawLine]:
        if not self._open():
            return
        assert self._file is not None
        for _ in range(limit):
            self._file.seek(self._offset)
            raw = self._file.readline(MAX_LINE + 1)
            if not raw.endswith(b"\n") and len(raw) <= MAX_LINE:
                return                      # no complete line yet
            self._offset += len(raw)
            text = raw.rstrip(b"\r\n").decode("utf-8", errors="replace")
            yield RawLine(text, f"file:{self._inode}:{self._offset}", self.boot_id, None,
                          time.time_ns(), forged_by=sender_of_line(text))

    def wait(self, timeout: float) -> None:
        time.sleep(min(timeout, 0.5))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
