"""User-space mirror of fdtrack's fd table: turns kernel records into bus events.

Pure (no bcc, no kernel), so its logic is tested without root. The kernel side reports
opens, dups, closes, forks, execs and exits, each naming an ``open_seq``; its statistics
map holds, per ``open_seq`` and (command, sub-operation), what the calls cost. Here those
become :class:`~gpuwhy.events.DeviceOpened`, :class:`~gpuwhy.events.DriverCallStats`
(cumulative per process and device path) and friends. Methods return the events to
publish; those that need kernel maps changed also return what to change.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpuwhy.clock import realtime_from_ticks
from gpuwhy.events import (
    DeviceClosed,
    DeviceOpened,
    DriverCallStats,
    Event,
    ProcessExited,
    ProcessSeen,
)
from gpuwhy.identity import ProcessKey, classify_device
from gpuwhy.nvioctl import ioctl_name, sub_name

LAT_BUCKETS = 32
# A group's event holds every operation at least this often while it moves, not only those
# that moved: the bound on how long an operation's figures stay wrong after a lost event.
WHOLE_EVERY_NS = 30 * 10**9
CLOSE_RANGE_CLOEXEC = 1 << 2


@dataclass
class OpStats:
    """What the calls of one (command, sub-operation) cost; adds up across opens."""

    count: int = 0
    errors: int = 0
    latency_sum_ns: int = 0
    latency_max_ns: int = 0
    bytes: int = 0
    latency_log2: list[int] = field(default_factory=lambda: [0] * LAT_BUCKETS)

    def add(self, other: OpStats) -> None:
        self.count += other.count
        self.errors += other.errors
        self.latency_sum_ns += other.latency_sum_ns
        self.latency_max_ns = max(self.latency_max_ns, other.latency_max_ns)
        self.bytes += other.bytes
        self.latency_log2 = list(map(operator.add, self.latency_log2, other.latency_log2))

    def moved(self, other: OpStats) -> bool:
        """Whether ``other`` (a later read of the same cumulative figures) says more."""
        return (self.count, self.errors, self.latency_sum_ns, self.bytes) != \
            (other.count, other.errors, other.latency_sum_ns, other.bytes)

    def copy(self) -> OpStats:
        return OpStats(self.count, self.errors, self.latency_sum_ns, self.latency_max_ns,
                       self.bytes, list(self.latency_log2))


@dataclass
class TrackedFd:
    """An open device fd as the kernel side tracks it."""

    process: ProcessKey
    fd: int
    path: str
    device: str
    minor: int | None
    open_seq: int
    opened_at: int
    how: str
    cloexec: bool


Group = tuple[ProcessKey, str]       # (process, device path): the unit stats are reported in
OpKey = tuple[int, int]              # (command, sub-operation)


class FdTable:
    """State of every tracked fd, process and counter.

    ``resolve(pid, ts)`` reads a process from procfs: a ProcessSeen, or None when it is
    already gone. When the kernel knows the start time (``start_ticks`` > 0) the key is
    exact even for a process that vanished; otherwise an unresolvable one gets start time
    0 and is counted in ``unresolved``.
    """

    def __init__(self, resolve: Callable[[int, int], ProcessSeen | None]):
        self._resolve = resolve
        self.fds: dict[tuple[int, int], TrackedFd] = {}             # (tgid, fd) -> open fd
        self.processes: dict[int, ProcessSeen] = {}                 # tgid -> facts
        self._group_of_seq: dict[int, Group] = {}
        self._device_of_group: dict[Group, str] = {}
        self._live: dict[int, dict[OpKey, OpStats]] = {}            # open_seq -> stats
        self._closed: dict[Group, dict[OpKey, OpStats]] = {}
        # each operation's figures as last published, and when a group's last went out whole
        self._published: dict[Group, dict[OpKey, tuple]] = {}
        self._whole_at: dict[Group, int] = {}
        # operations whose figures may have moved since they were last published (None: all
        # of the group's): a flush recomputes only these, so a process that made no call,
        # or an operation it did not call, costs nothing
        self._moved: dict[Group, set[OpKey] | None] = {}
        self._op_dicts: dict[Group, dict[OpKey, tuple[tuple, dict]]] = {}   # built, by figures
        self._retiring: set[int] = set()
        self._exiting: dict[int, ProcessExited] = {}
        self.unresolved = 0

    # --- processes ---------------------------------------------------------------------

    def process(self, tgid: int, ts: int, start_ticks: int = 0,
                refresh: bool = False) -> tuple[ProcessSeen, list[Event]]:
        """The facts of ``tgid`` (read once, or again after exec with ``refresh``)."""
        known = self.processes.get(tgid)
        if known is not None and not refresh and (
                not start_ticks or known.process.start_time == start_ticks):
            return known, []
        seen = self._resolve(tgid, ts)
        if seen is not None and start_ticks and seen.process.start_time != start_ticks:
            seen = None                   # /proc already shows a newer process with this pid
        if seen is None:
            if start_ticks:
                seen = ProcessSeen(ts=ts, process=ProcessKey(tgid, start_ticks),
                                   started_at=realtime_from_ticks(start_ticks))
            else:
                self.unresolved += 1
                seen = ProcessSeen(ts=ts, process=ProcessKey(tgid, 0))
        self.processes[tgid] = seen
        return seen, [seen]

    # --- fds -------------------------------------------------------------------------------

    def opened(self, tgid: int, fd: int, open_seq: int, path: str, ts: int, *,
               how: str = "open", cloexec: bool = False, start_ticks: int = 0) -> list[Event]:
        """A tracked open: seen by the kernel, found by the scan, a dup or inherited."""
        events: list[Event] = []
        previous = self.fds.get((tgid, fd))
        if previous is not None:     # the kernel missed a close: treat the old one as closed
            events += self.closed(tgid, fd, previous.open_seq, ts)
        seen, new = self.process(tgid, ts, start_ticks)
        events += new
        device, minor = classify_device(path)
        tracked = TrackedFd(seen.process, fd, path, device, minor, open_seq, ts, how, cloexec)
        self.fds[(tgid, fd)] = tracked
        group = (seen.process, path)
        self._group_of_seq[open_seq] = group
        self._device_of_group[group] = device
        events.append(self._opened_event(tracked))
        return events

    @staticmethod
    def _opened_event(tracked: TrackedFd) -> DeviceOpened:
        return DeviceOpened(ts=tracked.opened_at, process=tracked.process, fd=tracked.fd,
                            path=tracked.path, device=tracked.device, minor=tracked.minor,
                            how=tracked.how, cloexec=tracked.cloexec)

    def duped(self, tgid: int, newfd: int, open_seq: int, oldfd: int, ts: int,
              cloexec: bool = False, start_ticks: int = 0) -> list[Event]:
        """``dup*``/``fcntl(F_DUPFD*)`` made ``newfd`` a copy of the tracked ``oldfd``."""
        source = self.fds.get((tgid, oldfd))
        if source is None:
            return []
        return self.opened(tgid, newfd, open_seq, source.path, ts, how="dup",
                           cloexec=cloexec, start_ticks=start_ticks)

    def adopt_seq(self, tgid: int, fd: int, open_seq: int) -> None:
        """The kernel copied an inherited fd under its own ``open_seq`` (the child's first call
        came while user space was copying the table under another): the kernel's is the one
        its calls are counted and closed under, so it replaces ours."""
        tracked = self.fds.get((tgid, fd))
        if tracked is None or tracked.open_seq == open_seq:
            return
        group = self._group_of_seq.pop(tracked.open_seq, None)
        self._live.pop(tracked.open_seq, None)
        tracked.open_seq = open_seq
        if group is not None:
            self._group_of_seq[open_seq] = group
            self._moved[group] = None

    def closed(self, tgid: int, fd: int, open_seq: int | None, ts: int) -> list[Event]:
        """``fd`` closed; ``open_seq`` None closes whatever is tracked under that number."""
        tracked = self.fds.get((tgid, fd))
        if tracked is None or (open_seq is not None and tracked.open_seq != open_seq):
            return []
        del self.fds[(tgid, fd)]
        self._retiring.add(tracked.open_seq)
        return [DeviceClosed(ts=ts, process=tracked.process, fd=fd, path=tracked.path)]

    def fds_of(self, tgid: int) -> list[TrackedFd]:
        return [t for (owner, _), t in self.fds.items() if owner == tgid]

    def close_range(self, tgid: int, first: int, last: int, flags: int,
                    ts: int) -> tuple[list[Event], list[int], list[int]]:
        """``close_range``: returns events, fds now closed, fds now marked close-on-exec."""
        in_range = [t for t in self.fds_of(tgid) if first <= t.fd <= last]
        if flags & CLOSE_RANGE_CLOEXEC:
            for tracked in in_range:
                tracked.cloexec = True
            return [], [], [t.fd for t in in_range]
        events: list[Event] = []
        for tracked in in_range:
            events += self.closed(tgid, tracked.fd, tracked.open_seq, ts)
        return events, [t.fd for t in in_range], []

    def forked(self, parent: int, child: int, ts: int,
               seq_for: Callable[[int], int]) -> tuple[list[Event], list[TrackedFd]]:
        """A process (not a thread) was forked: it inherits every tracked fd. ``seq_for(fd)``
        gives the open_seq to use (the kernel's, where it already copied that fd)."""
        events: list[Event] = []
        inherited = []
        for tracked in self.fds_of(parent):
            existing = self.fds.get((child, tracked.fd))
            if existing is not None and existing.how == "fork":
                continue               # the kernel's copy got here first
            events += self.opened(child, tracked.fd, seq_for(tracked.fd), tracked.path, ts,
                                  how="fork", cloexec=tracked.cloexec)
            inherited.append(self.fds[(child, tracked.fd)])
        return events, inherited

    def executed(self, tgid: int, ts: int, cloexec_now: dict[int, bool]
                 ) -> tuple[list[Event], list[int]]:
        """The process exec'd: close-on-exec fds close (``cloexec_now`` is the kernel's view,
        which follows fcntl(F_SETFD)); the process is read again. Returns the closed fds."""
        events: list[Event] = []
        closed = []
        for tracked in self.fds_of(tgid):
            if cloexec_now.get(tracked.fd, tracked.cloexec):
                events += self.closed(tgid, tracked.fd, tracked.open_seq, ts)
                closed.append(tracked.fd)
        known = self.processes.get(tgid)
        _, refreshed = self.process(tgid, ts, known.process.start_time if known else 0,
                                    refresh=True)
        return refreshed + events, closed

    def exited(self, tgid: int, ts: int, exit_code: int | None = None,
               signal: int | None = None) -> tuple[list[Event], list[int]]:
        """The process ended: its fds close now; ProcessExited follows the final stats."""
        events: list[Event] = []
        fds = [t.fd for t in self.fds_of(tgid)]
        for fd in fds:
            events += self.closed(tgid, fd, None, ts)
        seen = self.processes.get(tgid)
        if seen is not None:
            self._exiting[tgid] = ProcessExited(ts=ts, process=seen.process,
                                                exit_code=exit_code, signal=signal)
        return events, fds

    # --- statistics ------------------------------------------------------------------------

    def idle(self) -> bool:
        """No device fd open, no figure or exit left to report."""
        return not (self.fds or self._live or self._retiring or self._exiting)

    def update_stats(self, entries: Iterable[tuple[int, int, int, OpStats]], ts: int
                     ) -> tuple[list[Event], list[int]]:
        """Apply a read of the kernel's stats map: ``(open_seq, cmd, sub, stats)``, summed
        over CPUs. Returns the events to publish and the open_seqs whose map entries can be
        deleted now (closed, and their final figures folded in).

        A group's event holds the operations whose figures moved since it last went out;
        every operation of the group at its first event, at least every WHOLE_EVERY_NS
        while it moves, and after :meth:`snapshot`. The figures are cumulative, so an
        event the bus lost is repaired by the operation's next one, and at the latest by
        the next whole one."""
        moved = self._moved
        for open_seq, cmd, sub, stats in entries:
            group = self._group_of_seq.get(open_seq)
            if group is not None:
                live = self._live.setdefault(open_seq, {})
                before = live.get((cmd, sub))
                if before is None or (before is not stats and before.moved(stats)):
                    live[(cmd, sub)] = stats
                    ops = moved.setdefault(group, set())
                    if ops is not None:
                        ops.add((cmd, sub))
        retired = sorted(self._retiring)
        for open_seq in retired:
            group = self._group_of_seq.pop(open_seq)
            folded = self._closed.setdefault(group, {})
            closing = self._live.pop(open_seq, {})
            for op, stats in closing.items():
                folded.setdefault(op, OpStats()).add(stats)
            ops = moved.setdefault(group, set())
            if ops is not None:
                ops.update(closing)
        self._retiring.clear()
        seqs: dict[Group, list[int]] = {group: [] for group in moved}
        for seq, group in self._group_of_seq.items():
            if group in seqs:
                seqs[group].append(seq)
        events: list[Event] = [event for group, ops in moved.items()
                  if (event := self._group_event(group, ops, seqs[group], ts)) is not None]
        moved.clear()
        events += self._finish_exits()
        return events, retired

    def _group_event(self, group: Group, ops: set[OpKey] | None, seqs: list[int],
                     ts: int) -> DriverCallStats | None:
        """The group's event for this flush (see :meth:`update_stats`): ``ops`` may have
        moved (None: any), ``seqs`` are its open fds. None if nothing it publishes moved."""
        # (a clock set back makes it whole too, rather than never)
        whole = not 0 <= ts - self._whole_at.get(group, ts - WHOLE_EVERY_NS) < WHOLE_EVERY_NS
        closed = self._closed.get(group, {})
        if whole or ops is None:
            keys = set(closed)
            for seq in seqs:
                keys.update(self._live.get(seq, ()))
        else:
            keys = ops
        device = self._device_of_group[group]
        made = self._op_dicts.setdefault(group, {})
        published = self._published.setdefault(group, {})
        every, changed = [], False
        for key in sorted(keys):
            parts = [live[key] for seq in seqs
                     if (live := self._live.get(seq)) is not None and key in live]
            if key in closed:
                parts.append(closed[key])
            stats = parts[0] if len(parts) == 1 else OpStats()   # read only, not kept
            if len(parts) > 1:
                for part in parts:
                    stats.add(part)
            mark = (stats.count, stats.errors, stats.latency_sum_ns, stats.bytes)
            known = made.get(key)
            if known is None or known[0] != mark:   # else the same dict as published
                known = made[key] = (mark, self._op_dict(key[0], key[1], device, stats))
            if published.get(key) != mark:
                published[key] = mark
                changed = True
                every.append(known[1])
            elif whole:
                every.append(known[1])
        if not changed:
            return None
        if whole:
            self._whole_at[group] = ts
        return DriverCallStats(ts=ts, process=group[0], path=group[1], device=device,
                               ops=every)

    @staticmethod
    def _op_dict(cmd: int, sub: int, device: str, stats: OpStats) -> dict:
        return {"cmd": cmd, "op": ioctl_name(cmd, device), "sub": sub,
                "sub_name": sub_name(cmd, device, sub), "count": stats.count,
                "errors": stats.errors, "latency_sum_ns": stats.latency_sum_ns,
                "latency_max_ns": stats.latency_max_ns, "bytes": stats.bytes,
                "latency_log2": list(stats.latency_log2)}

    def _finish_exits(self) -> list[Event]:
        events: list[Event] = []
        for tgid, exited in self._exiting.items():
            self.processes.pop(tgid, None)
            events.append(exited)
            for group in [g for g in self._closed if g[0] == exited.process]:
                del self._closed[group]
                self._published.pop(group, None)
                self._whole_at.pop(group, None)
                self._op_dicts.pop(group, None)
                self._device_of_group.pop(group, None)
        self._exiting.clear()
        return events

    def snapshot(self) -> list[Event]:
        """Everything a subscriber that just (re)connected needs to know."""
        events: list[Event] = list(self.processes.values())
        events += [self._opened_event(t) for t in self.fds.values()]
        self._published.clear()   # the next update_stats re-sends every figure
        self._whole_at.clear()
        self._moved.update(dict.fromkeys([*self._group_of_seq.values(), *self._closed]))
        return events
