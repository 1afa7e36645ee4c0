"""One raw kernel-log line as a reader delivers it, with its position and clocks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RawLine:
    """``cursor`` names the line's position in its source (journald cursor, ``kmsg:BOOT:SEQ``,
    ``file:INODE:OFFSET``); ``monotonic_ns`` is the printk time (boot-relative, per boot);
    ``realtime_ns`` is the source's own realtime stamp when it has one (when the sender
    logged the line, as journald keeps it; else journald's receive time), used when the
    line is from another boot and its monotonic time cannot be converted;
    ``sender_pid`` is the logging process (journald's ``SYSLOG_PID``/``_PID``; None for
    the kernel).
    """

    text: str
    cursor: str
    boot_id: str
    monotonic_ns: int | None = None
    realtime_ns: int | None = None
    sender_pid: int | None = None
