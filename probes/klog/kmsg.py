"""Read /dev/kmsg directly (the fallback when journald is absent); sequence numbers are the cursor.

A read returns one record ``prio,seq,usec,flags;text`` followed by `` KEY=value``
continuation lines. When the ring buffer overwrote records we had not read yet the read
fails with EPIPE: the loss is counted and reading goes on from the oldest record kept.
The cursor is ``kmsg:BOOT_ID:SEQ``; a cursor from another boot is ignored (sequence
numbers restart at boot).
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from gpuwhy.probes.klog.lines import RawLine

RECORD_MAX = 8192


def current_boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> str:
    return Path(path).read_text().strip().replace("-", "")


def parse_record(record: bytes) -> tuple[int, int, int, str] | None:
    """``(priority, seq, usec, text)`` of one /dev/kmsg record; None when malformed.

    >>> parse_record(b"4,51234,93297027938,-;NVRM: Xid (PCI:0000:43:00): 13, x\\n")
    (4, 51234, 93297027938, 'NVRM: Xid (PCI:0000:43:00): 13, x')
    """
    header, sep, body = record.partition(b";")
    fields = header.split(b",")
    if not sep or len(fields) < 3 or not all(f.isdigit() for f in fields[:3]):
        return None
    text = body.split(b"\n", 1)[0]      # drop the " KEY=value" continuation lines
    prefix = int(fields[0])
    return prefix & 7, int(fields[1]), int(fields[2]), text.decode("utf-8", errors="replace")


class KmsgKernelLog:
    """Records from ``/dev/kmsg`` (or a file of records, for tests), after a stored cursor."""

    origin = "kmsg"

    def __init__(self, path: str = "/dev/kmsg", boot_id: str | None = None):
        self.path = path
        self.boot_id = boot_id or current_boot_id()
        self.overwritten = 0
        self._after_seq = -1
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._buffer = b""

    def seek(self, cursor: str | None, start: str) -> bool:
        """After ``cursor`` when it is from this boot (True); else by ``start``: ``now``
        skips to the end, ``boot``/``all`` read the whole ring buffer."""
        if cursor and cursor.startswith("kmsg:"):
            _, boot_id, seq = cursor.split(":", 2)
            if boot_id == self.boot_id and seq.isdigit():
                self._after_seq = int(seq)
                return True
        if start == "now":
            os.lseek(self._fd, 0, os.SEEK_END)
        return False

    def _records(self) -> Iterator[bytes]:
        while True:
            try:
                chunk = os.read(self._fd, RECORD_MAX)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:     # records overwritten before we read them
                    self.overwritten += 1
                    continue
                raise
            if not chunk:
                return
            # /dev/kmsg returns one record per read; a plain file returns many.
            self._buffer += chunk
            while b"\n" in self._buffer:
                record, _, self._buffer = self._buffer.partition(b"\n")
                while self._buffer.startswith(b" "):       # continuation lines
                    _, _, self._buffer = self._buffer.partition(b"\n")
                yield record

    def lines(self, limit: int = 1000) -> Iterator[RawLine]:
        count = 0
        for record in self._records():
            parsed = parse_record(record)
            if parsed is None:
                continue
            _, seq, usec, text = parsed
            if seq <= self._after_seq:
                continue
            self._after_seq = seq
            yield RawLine(text, f"kmsg:{self.boot_id}:{seq}", self.boot_id, usec * 1000, None)
            count += 1
            if count >= limit:
                return

    @property
    def wakes_on_new_lines(self) -> bool:
        """/dev/kmsg is readable exactly when the kernel logged a line: wait() may sleep
        long. A plain file (tests) is always readable, so it is looked at instead."""
        return stat.S_ISCHR(os.fstat(self._fd).st_mode)

    def wait(self, timeout: float) -> None:
        if self.wakes_on_new_lines:
            select.select([self._fd], [], [], timeout)
        else:
            time.sleep(min(timeout, 0.2))     # a plain file is always "readable"

    def close(self) -> None:
        os.close(self._fd)


class KernelLineBell:
    """/dev/kmsg held only to be woken: readable when the kernel logs a record, read here
    only to count the records and be quiet again (the lines themselves come from journald).

    journald tells its readers about new entries 0.25-0.5 s late (its post-change timer);
    the kernel's own ring buffer wakes its readers at once. ``fd``: one opened elsewhere (a
    systemd socket unit's ``ListenSpecial=/dev/kmsg``, for a service that may not open it:
    ``ProtectKernelLogs=``, ``kernel.dmesg_restrict``); else ``path`` is opened here.
    """

    def __init__(self, path: str = "/dev/kmsg", fd: int | None = None):
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK) if fd is None else fd
        try:
            if not stat.S_ISCHR(os.fstat(self._fd).st_mode):    # a file is always readable
                raise OSError(errno.ENOTTY, "not the kernel's log device")
            os.set_blocking(self._fd, False)
            os.lseek(self._fd, 0, os.SEEK_END)      # records from now on ring it
        except OSError:
            os.close(self._fd)
            raise

    def fileno(self) -> int:
        return self._fd

    def ring(self) -> int:
        """How many records the kernel logged since the last call (reads them all)."""
        records = 0
        while True:
            try:
                if not os.read(self._fd, RECORD_MAX):
                    return records
            except BlockingIOError:
                return records
            except OSError as exc:
                if exc.errno != errno.EPIPE:      # overwritten before read: still new ones
                    raise
            records += 1

    def close(self) -> None:
        os.close(self._fd)
