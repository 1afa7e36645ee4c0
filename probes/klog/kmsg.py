"""Read /dev/kmsg directly (the fallback when journald is absent); sequence numbers are the cursor.

A read returns one record ``prio,seq,usec,flags;text`` followed by `` KEY=value``
continuation lines (Documentation/ABI/testing/dev-kmsg). The kernel numbers its records
one by one, so every line lost before it was read shows as a jump between two
consecutive records: when the ring buffer overwrote records not read yet the read fails
with EPIPE and goes on from the oldest record kept, and a restarted reader finds its
stored sequence number older than the ring's first record. Each such range
``[first_missing, last_missing]`` is kept (:attr:`KmsgKernelLog.gaps`) for the source to
report. The cursor is ``kmsg:BOOT_ID:SEQ:USEC`` (old cursors have no ``:USEC``): the
record's own printk time lets a journald reader take over where this one stopped. A cursor
from another boot is ignored (sequence numbers restart at boot).

What is trusted: every record. Only root can write /dev/kmsg (the device is 0644 root;
reading it is what ``kernel.dmesg_restrict`` guards), and the kernel puts what user space
writes there under a facility of its own (LOG_USER unless the writer names another, never
0), so a record's facility (the ``prio`` field's upper bits) tells the driver's lines
(facility 0, kern) from root's. Both are taken: root can load a driver anyway, journald marks
both ``_TRANSPORT=kernel``, and a test or a replay plays driver lines exactly so (``<3>NVRM:
Xid (...)``). What any user can forge is a journal entry, which this reader never sees.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import time
from collections.abc import Iterator

from gpuwhy.boot import host_boot_id
from gpuwhy.probes.klog.lines import RawLine

RECORD_MAX = 8192


def current_boot_id(proc_root: str = "/proc") -> str:
    """This boot's id (:func:`gpuwhy.boot.host_boot_id`); OSError when the kernel does not
    say: a /dev/kmsg cursor without its boot cannot be resumed."""
    boot = host_boot_id(proc_root)
    if boot is None:
        raise OSError(f"cannot read the boot id under {proc_root}")
    return boot


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


def parse_cursor(cursor: str) -> tuple[str, int, int | None] | None:
    """``(boot_id, seq, usec)`` of a ``kmsg:`` cursor (usec None in an old one); None when
    it is not one."""
    parts = cursor.split(":")
    if len(parts) not in (3, 4) or parts[0] != "kmsg" or not parts[2].isdigit():
        return None
    usec = parts[3] if len(parts) == 4 else None
    if usec is not None and not usec.isdigit():
        return None
    return parts[1], int(parts[2]), int(usec) if usec is not None else None


class KmsgKernelLog:
    """Records from ``/dev/kmsg`` (or a file of records, for tests), after a stored cursor.

    ``overwritten``: EPIPE reads; ``lost``: lines the sequence numbers show were never read;
    ``gaps``: their ranges not yet taken by the source (:meth:`take_gaps`)."""

    origin = "kmsg"

    def __init__(self, path: str = "/dev/kmsg", boot_id: str | None = None):
        self.path = path
        self.boot_id = boot_id or current_boot_id()
        self.overwritten = 0
        self.lost = 0
        self.gaps: list[tuple[int, int]] = []
        self.first_seq: int | None = None   # the first record read (the ring's oldest, or so)
        self.unknown_loss_before: int | None = None   # see _already_read
        self._after_seq = -1
        self._expected: int | None = None   # the sequence number the next record must have
        self._after_stamp: tuple[int, int] | None = None    # (usec, ties) still to skip
        self._last_usec, self._ties = -1, 0
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._buffer = b""

    def seek(self, cursor: str | None, start: str) -> bool:
        """After ``cursor`` when it is from this boot (True): the next record must be the
        one after it, or the ones between were lost. Else by ``start``: ``now`` skips to
        the end, ``boot``/``all`` read the whole ring buffer."""
        parsed = parse_cursor(cursor) if cursor else None
        if parsed and parsed[0] == self.boot_id:
            self._after_seq = parsed[1]
            self._expected = parsed[1] + 1
            return True
        if start == "now":
            os.lseek(self._fd, 0, os.SEEK_END)
        return False

    def seek_stamp(self, boot_id: str, usec: int, ties: int = 0) -> bool:
        """After the line printk'd at ``usec`` of boot ``boot_id`` (the ``ties``-th, from 0,
        of the lines printk'd in that microsecond): where another reader (journald) stopped.
        False when the stamp is of another boot (this ring holds only this one)."""
        if boot_id != self.boot_id:
            return False
        self._after_stamp = (usec, ties)
        return True

    def take_gaps(self) -> list[tuple[int, int]]:
        """The lost ranges found since the last call."""
        gaps, self.gaps = self.gaps, []
        return gaps

    def _already_read(self, seq: int, usec: int) -> bool:
        tie = self._ties + 1 if usec == self._last_usec else 0
        self._last_usec, self._ties = usec, tie
        if seq <= self._after_seq:
            return True
        if self._after_stamp is not None:
            after_usec, after_ties = self._after_stamp
            if usec < after_usec or usec == after_usec and tie <= after_ties:
                return True
            self._after_stamp = None
            if self.first_seq is None:
                # the ring no longer holds the last line the other reader read: lines
                # between it and this one may be gone, and no number says how many
                self.unknown_loss_before = seq
        return False

    def _note(self, seq: int) -> None:
        if self.first_seq is None:
            self.first_seq = seq
        if self._expected is not None and seq > self._expected:
            self.gaps.append((self._expected, seq - 1))
            self.lost += seq - self._expected
        self._expected = seq + 1

    def records(self) -> Iterator[bytes]:
        """The raw records readable now (EPIPE, records overwritten unread, counted)."""
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
        for record in self.records():
            parsed = parse_record(record)
            if parsed is None:
                continue
            _, seq, usec, text = parsed
            if self._already_read(seq, usec):
                if self.first_seq is None:
                    self.first_seq = seq
                self._expected = seq + 1
                continue
            self._note(seq)
            self._after_seq = seq
            yield RawLine(text, f"kmsg:{self.boot_id}:{seq}:{usec}", self.boot_id,
                          usec * 1000, None, facility=int(record.split(b",", 1)[0]) >> 3)
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
