"""Read kernel lines from journald with systemd-python: kernel transport, plus the ``NVRM``
identifier (lines forwarded from elsewhere); resume from a stored cursor.

journald splits a kernel line's ``NVRM: `` / ``nvidia-nvswitch3: `` prefix into
``SYSLOG_IDENTIFIER``: it is put back so the parser sees the line as the kernel wrote it.
"""

from __future__ import annotations

import logging
import math
import select
import socket
from collections.abc import Iterator

from gpuwhy.probes.klog.kmsg import KernelLineBell
from gpuwhy.probes.klog.lines import RawLine

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


def line_of(entry: dict) -> RawLine:
    """A journal entry (systemd-python dict, with this module's converters) as a RawLine."""
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
    return RawLine(message, entry["__CURSOR"], boot_id,
                   source_us * 1000 if isinstance(source_us, int) else None,
                   realtime_us * 1000 if isinstance(realtime_us, int) else None,
                   sender if isinstance(sender, int) else None)


class JournalKernelLog:
    """Kernel lines from the system journal, or from ``path`` (a journal directory or file).

    ``matches`` are OR-ed; the cron source reuses this class with ``SYSLOG_IDENTIFIER=CRON``.
    """

    origin = "journald"

    def __init__(self, path: str | None = None,
                 matches: tuple[dict[str, str], ...] = ({"_TRANSPORT": "kernel"},
                                                        {"SYSLOG_IDENTIFIER": "NVRM"}),
                 bell: KernelLineBell | None = None):
        from pathlib import Path

        from systemd import journal

        self._journal_module = journal
        # Woken by the kernel's log (the system journal's kernel lines), else looked at
        # every IDLE_WAIT_S: journald's own wake-ups come too late for an Xid.
        self.bell = bell
        self.rung_by = ""           # what wakes it, in words (the source's status says)
        self._owed = 0              # kernel records the bell rang for, not yet read here
        self._chase = 0             # which of CHASE_WAITS_S is next
        self._poller: select.poll | None = None
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
            except OSError:
                pass
        if start == "boot":
            self._reader.seek_monotonic(0)    # this boot's first entry (monotonic is per boot)
        elif start == "all":
            self._reader.seek_head()
        else:
            self._reader.seek_tail()
            self._reader.get_previous()
        return False

    def lines(self, limit: int = 1000) -> Iterator[RawLine]:
        """The lines available now, at most ``limit``."""
        for _ in range(limit):
            entry = self._reader.get_next()
            if not entry:
                return
            if self._owed and entry.get("_TRANSPORT") == "kernel":
                self._owed -= 1
            yield line_of(entry)

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
