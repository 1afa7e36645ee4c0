"""Read kernel lines from journald with systemd-python; resume from a stored cursor.

Only entries with ``_TRANSPORT=kernel`` are kernel lines: journald sets that field itself
for what it read from /dev/kmsg, and no sender can (writing /dev/kmsg needs root). Any
local user can send an entry that calls itself ``NVRM`` (``systemd-cat -t NVRM``,
``logger -t NVRM``): such entries are still read, so that each attempt is counted and
shown with who sent it (journald's trusted ``_UID``, ``_PID``, ``_COMM``), but they come
out marked ``forged_by`` and are never parsed into an Xid. journald's own entry saying it
missed kernel lines (the ring overwrote them before it read them) comes out as ``missed``:
a loss the source reports.

journald splits a kernel line's ``NVRM: `` / ``nvidia-nvswitch3: `` prefix into
``SYSLOG_IDENTIFIER``: it is put back so the parser sees the line as the kernel wrote it.
"""

from __future__ import annotations

import logging
import math
import re
import select
import socket
from collections.abc import Iterator
from pathlib import Path

from gpuwhy.probes.klog.kmsg import KernelLineBell
from gpuwhy.probes.klog.lines import RawLine, UserSender

log = logging.getLogger(__name__)

JOURNALD_SOCKET = "/run/systemd/journal/socket"

MAX_TEXT = 8192
KEEP_IDENTIFIER = ("NVRM", "nvidia-nvswitch")
# journald tells its readers about new entries late: sd_journal_wait() woke 0.45-0.5 s after
# a kmsg line that get_next() could read after 6 ms. Without a bell (below) the sources wait
# at most this long between reads: an Xid reaches its alert in ~0.1 s, for ten wake-ups a
# second per source (an idle source took 0.19 % of a core instead of 0.07 % at 0.5 s).
IDLE_WAIT_S = 0.1
# With a KernelLineBell the reader sleeps until the kernel logs a record, then looks at
# the journal after each of these waits until journald has stored as many kernel lines as
# the bell rang for (6 ms is usual); a record journald never stores (rate-limited, or a
# journald that stopped reading /dev/kmsg) is given up after their sum, 0.32 s.
CHASE_WAITS_S = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16)
# journald's own entry "Missed N kernel messages" (sd-messages.h SD_MESSAGE_JOURNAL_MISSED):
# kernel lines the ring overwrote before journald read them.
JOURNAL_MISSED = "e9bf28e6e834481bb6f48f548ad13606"
_MISSED = re.compile(r"Missed (\d{1,18}) kernel messages", re.ASCII)
# The kernel's lines, journald's report of those it missed, and (to count them, never to
# trust them) user-space entries that claim the driver's identifier.
KERNEL_MATCHES: tuple[dict[str, str], ...] = ({"_TRANSPORT": "kernel"},
                                              {"MESSAGE_ID": JOURNAL_MISSED},
                                              {"SYSLOG_IDENTIFIER": "NVRM"})


def _text(value: object) -> str:
    if isinstance(value, list):
        value = value[0] if value else ""
    if isinstance(value, bytes):
        return value[:MAX_TEXT].decode("utf-8", errors="replace")
    return str(value)[:MAX_TEXT]


def _raw_monotonic(value: tuple) -> tuple[int, str]:
    return int(value[0]), bytes(value[1]).hex()


_CONVERTERS = {
    "__REALTIME_TIMESTAMP": int,
    "_SOURCE_REALTIME_TIMESTAMP": int,
    "__MONOTONIC_TIMESTAMP": _raw_monotonic,
    "_SOURCE_MONOTONIC_TIMESTAMP": int,
    "_BOOT_ID": bytes.decode,
}


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) else None


def sender_of(entry: dict) -> UserSender:
    """Who sent a journal entry, from the fields journald sets itself."""
    return UserSender(_int_or_none(entry.get("_UID")), _int_or_none(entry.get("_PID")),
                      _text(entry.get("_COMM", ""))[:64],
                      _text(entry.get("_TRANSPORT", "")) or "unknown")


def line_of(entry: dict, kernel_only: bool = False) -> RawLine:
    """A journal entry (systemd-python dict, with this module's converters) as a RawLine;
    with ``kernel_only``, one that journald did not read from the kernel is ``forged_by``
    its sender."""
    message = _text(entry.get("MESSAGE", ""))
    identifier = _text(entry.get("SYSLOG_IDENTIFIER", ""))
    if identifier.startswith(KEEP_IDENTIFIER) and not message.startswith(identifier):
        message = f"{identifier}: {message}"
    monotonic_us, monotonic_boot = entry.get("__MONOTONIC_TIMESTAMP", (None, ""))
    source_us = entry.get("_SOURCE_MONOTONIC_TIMESTAMP")
    if not isinstance(source_us, int):
        source_us = monotonic_us
    boot_id = _text(entry.get("_BOOT_ID", monotonic_boot)).replace("-", "")
    # The sender's stamp (the socket's receive time) first: journald's own is when it got
    # round to the line, which on a busy host falls after what the sender did next (cron's
    # job exec'ing its command).
    realtime_us = entry.get("_SOURCE_REALTIME_TIMESTAMP")
    if not isinstance(realtime_us, int):
        realtime_us = entry.get("__REALTIME_TIMESTAMP")
    sender = entry.get("SYSLOG_PID", entry.get("_PID"))
    forged, missed = None, 0
    transport = _text(entry.get("_TRANSPORT", ""))
    if kernel_only and transport == "driver" and \
            _text(entry.get("MESSAGE_ID", "")).replace("-", "") == JOURNAL_MISSED:
        # journald's own entry (only journald writes the "driver" transport)
        found = _MISSED.search(message)
        missed = int(found[1]) if found else 1
    elif kernel_only and transport != "kernel":
        forged = sender_of(entry)
    return RawLine(message, entry["__CURSOR"], boot_id,
                   source_us * 1000 if isinstance(source_us, int) else None,
                   realtime_us * 1000 if isinstance(realtime_us, int) else None,
                   sender if isinstance(sender, int) else None, forged, missed,
                   _facility(entry) if transport == "kernel" else None)


def _facility(entry: dict) -> int | None:
    """The facility journald read from the kernel's record (``SYSLOG_FACILITY``), for a
    kernel-transport entry only: there journald, not the sender, set it."""
    value = entry.get("SYSLOG_FACILITY")
    try:
        return int(_text(value)) if value is not None else None
    except ValueError:
        return None


class JournalKernelLog:
    """Kernel lines from the system journal, or from ``path`` (a journal directory or file).

    ``matches`` are OR-ed; the cron source reuses this class with ``SYSLOG_IDENTIFIER=CRON``.
    With the kernel's matches (the default) every entry journald did not read from the kernel
    comes out ``forged_by`` its sender.
    """

    origin = "journald"

    def __init__(self, path: str | None = None,
                 matches: tuple[dict[str, str], ...] = KERNEL_MATCHES,
                 bell: KernelLineBell | None = None):
        from systemd import journal

        self._journal_module = journal
        self.kernel_only = matches == KERNEL_MATCHES
        # Woken by the kernel's log (the system journal's kernel lines), else looked at
        # every IDLE_WAIT_S: journald's own wake-ups come too late for an Xid.
        self.bell = bell
        self.rung_by = ""           # what wakes it, in words (the source's status says)
        self._owed = 0              # kernel records the bell rang for, not yet read here
        self._chase = 0             # which of CHASE_WAITS_S is next
        self._poller: select.poll | None = None
        self._skip: list | None = None      # [boot, usec, ties, ties seen]: see seek_stamp
        if path and Path(path).is_file():
            self._reader = journal.Reader(files=[path], converters=_CONVERTERS)
        else:
            self._reader = journal.Reader(path=path or None, converters=_CONVERTERS)
        for i, match in enumerate(matches):
            if i:
                self._reader.add_disjunction()
            self._reader.add_match(**match)

    def seek(self, cursor: str | None, start: str) -> bool:
        """Position after ``cursor`` (returns True); without one, by ``start``: ``boot`` (the
        start of the current boot), ``all`` (the oldest line kept) or ``now`` (the end)."""
        if cursor:
            try:
                self._reader.seek_cursor(cursor)
                entry = self._reader.get_next()
                if entry and entry.get("__CURSOR") != cursor:
                    # The entry itself is gone (journal rotated): we are at the next one.
                    self._reader.get_previous()
                return True
            except (OSError, ValueError):      # ValueError: not a journald cursor
                pass
        if start == "boot":
            self._reader.seek_monotonic(0)    # this boot's first entry (monotonic is per boot)
        elif start == "all":
            self._reader.seek_head()
        else:
            self._reader.seek_tail()
            self._reader.get_previous()
        return False

    def seek_stamp(self, boot_id: str, usec: int, ties: int = 0) -> bool:
        """After the kernel line printk'd at ``usec`` of boot ``boot_id`` (the ``ties``-th,
        from 0, of the lines printk'd in that microsecond): where another reader (/dev/kmsg)
        stopped. journald stores a kernel line after the kernel printed it, in the kernel's
        order: every entry it received before ``usec`` was read, and of those after, the
        kernel lines printed up to the stamp are passed over (see :meth:`lines`)."""
        try:
            # a little early: the float conversion in systemd-python may round by 1 us
            self._reader.seek_monotonic(max(0, usec - 1000) / 1e6, boot_id)
        except (OSError, ValueError):
            return False
        self._skip = [boot_id, usec, ties, 0]
        return True

    def _passed_over(self, entry: dict) -> bool:
        """Whether ``entry`` is before the stamp sought (:meth:`seek_stamp`)."""
        boot, usec, ties, seen = self._skip  # type: ignore[misc]
        entry_boot = _text(entry.get("_BOOT_ID", "")).replace("-", "")
        if entry.get("_TRANSPORT") != "kernel":
            return entry_boot == boot     # not among what the other reader could see
        source = entry.get("_SOURCE_MONOTONIC_TIMESTAMP")
        if entry_boot == boot and isinstance(source, int) and (
                source < usec or source == usec and seen <= ties):
            if source == usec:
                self._skip[3] += 1  # type: ignore[index]
            return True
        self._skip = None
        return False

    def lines(self, limit: int = 1000) -> Iterator[RawLine]:
        """The lines available now, at most ``limit``."""
        for _ in range(limit):
            entry = self._reader.get_next()
            if not entry:
                return
            if self._owed and entry.get("_TRANSPORT") == "kernel":
                self._owed -= 1
            if self._skip is not None and self._passed_over(entry):
                continue
            yield line_of(entry, self.kernel_only)

    def ring_with(self, bell: KernelLineBell, rung_by: str) -> None:
        """Be woken by ``bell`` from now on (one that came after the reader opened)."""
        if self.bell is not None:
            self.bell.close()
        self.bell, self.rung_by, self._poller, self._owed = bell, rung_by, None, 0

    @property
    def wakes_on_new_lines(self) -> bool:
        """With a bell, wait() returns when a kernel line comes: it may be given long."""
        return self.bell is not None

    def wait(self, timeout: float) -> None:
        if self.bell is None:
            self._reader.wait(timeout)
            return
        if self._owed and self._chase < len(CHASE_WAITS_S):
            # the kernel logged lines journald has not handed over yet: look again soon
            self._reader.wait(min(timeout, CHASE_WAITS_S[self._chase]))
            self._chase += 1
            return
        self._owed = 0          # given up on (never stored), or none
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self._reader.fileno(), self._reader.get_events())
            self._poller.register(self.bell.fileno(), select.POLLIN)
        ready = dict(self._poller.poll(max(0, math.ceil(timeout * 1000))))
        if ready.get(self.bell.fileno()):
            try:
                self._owed, self._chase = self.bell.ring(), 0
            except OSError as exc:      # the source goes on, looking every IDLE_WAIT_S
                log.warning("the kernel-line bell failed (%s): the journal is looked at "
                            "every %g s", exc, IDLE_WAIT_S)
                self.bell.close()
                self.bell, self._poller = None, None
        self._reader.process()      # the journal's own wake-up (files added, rotated)

    def holds_this_boot(self) -> bool:
        """Whether an entry of the current boot matches (moves the read position)."""
        self._reader.this_boot()
        self._reader.seek_head()
        return bool(self._reader.get_next())

    def close(self) -> None:
        self._reader.close()
        if self.bell is not None:
            self.bell.close()


def stamp_of_cursor(cursor: str, path: str | None = None) -> tuple[str, int, int, str] | None:
    """Where a journald cursor stands in the kernel's own clock, for a /dev/kmsg reader to
    take over: ``(boot_id, printk usec, ties, how)`` of the last kernel line at or before
    the cursor's entry (``ties``: how many kernel lines before it share its microsecond),
    read from the journal files (still there when journald is not running). When the entry
    is gone: the cursor's own ``b=`` and ``m=`` (journald's receive time, a little after
    the printk time: lines printed in between are passed over), and ``how`` says so. None
    when neither can be read."""
    try:
        from systemd import journal

        if path and Path(path).is_file():
            reader = journal.Reader(files=[path], converters=_CONVERTERS)
        else:
            reader = journal.Reader(path=path or None, converters=_CONVERTERS)
    except (ImportError, OSError):
        reader = None
    if reader is not None:
        try:
            found = _stamp_in_journal(reader, cursor)
        finally:
            reader.close()
        if found is not None:
            return (*found, "the journal entry's printk time")
    fields = dict(part.split("=", 1) for part in cursor.split(";") if "=" in part)
    try:
        return fields["b"], int(fields["m"], 16), 0, "the cursor's receive time (its " \
            "entry is gone from the journal)"
    except (KeyError, ValueError):
        return None


MAX_WALK_BACK = 10_000


def _stamp_in_journal(reader: object, cursor: str) -> tuple[str, int, int] | None:
    try:
        reader.seek_cursor(cursor)                      # type: ignore[attr-defined]
        entry = reader.get_next()                       # type: ignore[attr-defined]
    except (OSError, ValueError):                       # ValueError: not a cursor
        return None
    if not entry or entry.get("__CURSOR") != cursor:
        return None
    boot = stamp = None
    ties = 0
    for _ in range(MAX_WALK_BACK):
        if entry.get("_TRANSPORT") == "kernel" and \
                isinstance(entry.get("_SOURCE_MONOTONIC_TIMESTAMP"), int):
            entry_boot = _text(entry.get("_BOOT_ID", "")).replace("-", "")
            usec = entry["_SOURCE_MONOTONIC_TIMESTAMP"]
            if stamp is None:
                boot, stamp = entry_boot, usec
            elif entry_boot == boot and usec == stamp:
                ties += 1
            else:
                break
        entry = reader.get_previous()                   # type: ignore[attr-defined]
        if not entry:
            break
    return (boot, stamp, ties) if boot is not None and stamp is not None else None


def journald_refuses(socket_path: str | None = None) -> str | None:
    """None when a journald answers on its native socket, else why not.

    The socket file alone proves nothing: a journald that died (or a container image built
    on a host that ran one) leaves it behind, and a reader of such a journal receives no
    kernel line ever. A datagram ``connect`` to a socket nobody listens on is refused at
    once (ECONNREFUSED), and needs no privilege (the socket is world-writable: every
    process logs through it).
    """
    socket_path = socket_path or JOURNALD_SOCKET
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.connect(socket_path)
    except OSError as exc:
        return f"{socket_path}: {exc.strerror or exc}"
    finally:
        sock.close()
    return None


def has_kernel_line_this_boot(path: str | None = None) -> bool:
    """Whether the journal (the system's, or ``path``) holds a kernel line of this boot.

    A journald that reads /dev/kmsg copies the whole ring buffer when it starts, so the
    journal of a host whose journald reads the kernel log always has this boot's first
    lines; one that does not (a container's journald, ``ReadKMsg=no``) has none.
    """
    reader = JournalKernelLog(path, matches=({"_TRANSPORT": "kernel"},))
    try:
        return reader.holds_this_boot()
    finally:
        reader.close()
