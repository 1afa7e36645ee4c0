"""One raw kernel-log line as a reader delivers it, with its position and clocks."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwhy.text import printable

# What every line gpuwhy's test suite writes into the kernel log carries (as root, through
# /dev/kmsg): the driver never prints it, and a process name (15 bytes) cannot hold it.
TEST_LINE_MARK = "[gpuwhy test line, not a GPU error]"


@dataclass(frozen=True)
class RawLine:
    """``cursor`` names the line's position in its source (journald cursor, ``kmsg:BOOT:SEQ``,
    ``file:INODE:OFFSET``); ``monotonic_ns`` is the printk time (boot-relative, per boot);
    ``realtime_ns`` is the source's own realtime stamp when it has one (when the sender
    logged the line, as journald keeps it; else journald's receive time), used when the
    line is from another boot and its monotonic time cannot be converted;
    ``sender_pid`` is the logging process (journald's ``SYSLOG_PID``/``_PID``; None for
    the kernel). ``forged_by`` is set when the line calls itself a kernel (NVRM) line but a
    user-space process sent it (journald's ``_TRANSPORT`` is not ``kernel``): such a line
    is counted and shown as a forgery attempt, never parsed. ``missed`` is not a line but
    the log daemon's own report that it missed that many kernel lines (journald's "Missed N
    kernel messages"): a loss to report, nothing to parse. ``facility`` is the syslog
    facility the kernel filed the line under: 0 for the kernel's own lines, never 0 for a
    line user space wrote to /dev/kmsg (None: the reader cannot tell).
    """

    def is_test_line(self) -> bool:
        """Written to /dev/kmsg from user space (a facility other than the kernel's) and
        marked as gpuwhy's test suite marks its lines: never a driver line."""
        return bool(self.facility) and TEST_LINE_MARK in self.text

    text: str
    cursor: str
    boot_id: str
    monotonic_ns: int | None = None
    realtime_ns: int | None = None
    sender_pid: int | None = None
    forged_by: UserSender | None = None
    missed: int = 0
    facility: int | None = None


@dataclass(frozen=True)
class UserSender:
    """Who sent a line that claims to be the kernel's, as the log daemon itself recorded it
    (journald's trusted ``_UID``, ``_PID``, ``_COMM`` and ``_TRANSPORT`` fields, which the
    sender cannot set): ``comm`` is bounded by the kernel (15 bytes) but still untrusted text."""

    uid: int | None
    pid: int | None
    comm: str
    transport: str

    def describe(self) -> str:
        """In words, for a log line and the source's health detail (escaped)."""
        uid = "?" if self.uid is None else self.uid
        pid = "?" if self.pid is None else self.pid
        return f"uid {uid}, pid {pid}, command '{printable(self.comm[:32])}' " \
               f"(transport {printable(self.transport[:16])})"
