"""User-space mirror of the probe's fd table: turns kernel records into bus events.

Pure (no bcc, no kernel), so its logic is tested without root. The kernel side tells us
opens, closes and exits, each naming an ``open_seq``; the counts map tells us, per
``open_seq`` and ioctl command, how many calls were made. Here those become
:class:`~gpuwhy.events.DeviceOpened`, :class:`~gpuwhy.events.IoctlCounts` (cumulative per
process and device path) and friends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuwhy.events import (
    DeviceClosed,
    DeviceOpened,
    Event,
    IoctlCounts,
    ProcessExited,
    ProcessSeen,
)
from gpuwhy.identity import ProcessKey, classify_device


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
    scanned: bool


Group = tuple[ProcessKey, str]  # (process, device path): the unit counts are reported in


class FdTable:
    """State of every tracked fd, process and counter; every method returns events to publish.

    ``resolve(pid, ts)`` reads the process from procfs and returns a ProcessSeen, or None
    when it is already gone (its start time is then unknown and recorded as 0).
    """

    def __init__(self, resolve: Callable[[int, int], ProcessSeen | None]):
        self._resolve = resolve
        self.fds: dict[tuple[int, int], TrackedFd] = {}          # (tgid, fd) -> open fd
        self.processes: dict[int, ProcessSeen] = {}              # tgid -> facts
        self._group_of_seq: dict[int, Group] = {}
        self._device_of_group: dict[Group, str] = {}
        self._live_counts: dict[int, Counter[int]] = {}          # open_seq -> cmd -> count
        self._closed_totals: dict[Group, Counter[int]] = {}
        self._published: dict[Group, dict[str, int]] = {}
        self._retiring: set[int] = set()                          # closed open_seqs
        self._exiting: dict[int, int] = {}                        # tgid -> exit ts
        self.unresolved = 0

    def _process(self, tgid: int, ts: int) -> tuple[ProcessSeen, list[Event]]:
        known = self.processes.get(tgid)
        if known is not None:
            return known, []
        seen = self._resolve(tgid, ts)
        if seen is None:
            self.unresolved += 1
            seen = ProcessSeen(ts=ts, process=ProcessKey(tgid, 0))
        self.processes[tgid] = seen
        return seen, [seen]

    def opened(self, tgid: int, fd: int, open_seq: int, path: str, ts: int,
               scanned: bool = False) -> list[Event]:
        """A tracked open (from the kernel, or from the start-up scan when ``scanned``)."""
        previous = self.fds.get((tgid, fd))
        events: list[Event] = []
        if previous is not None:   # the kernel missed a close (fd handed over by dup2, say)
            events += self.closed(tgid, fd, previous.open_seq, ts)
        seen, new = self._process(tgid, ts)
        events += new
        device, minor = classify_device(path)
        tracked = TrackedFd(seen.process, fd, path, device, minor, open_seq, ts, scanned)
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
                            scanned=tracked.scanned)

    def closed(self, tgid: int, fd: int, open_seq: int, ts: int) -> list[Event]:
        tracked = self.fds.get((tgid, fd))
        if tracked is None or tracked.open_seq != open_seq:
            return []
        del self.fds[(tgid, fd)]
        self._retiring.add(open_seq)
        return [DeviceClosed(ts=ts, process=tracked.process, fd=fd, path=tracked.path)]

    def exited(self, tgid: int, ts: int) -> list[Event]:
        """The process ended: its fds close now; ProcessExited follows the final counts."""
        events: list[Event] = []
        for (owner, fd), tracked in list(self.fds.items()):
            if owner == tgid:
                events += self.closed(tgid, fd, tracked.open_seq, ts)
        if tgid in self.processes:
            self._exiting[tgid] = ts
        return events

    def update_counts(self, counts: Iterable[tuple[int, int, int]], ts: int
                      ) -> tuple[list[Event], list[int]]:
        """Apply a read of the kernel's counts map, ``(open_seq, cmd, count)`` triples.

        Returns the events to publish and the open_seqs whose map entries can now be
        deleted (their fd is closed and their final count is folded in).
        """
        for open_seq, cmd, count in counts:
            if open_seq in self._group_of_seq:
                self._live_counts.setdefault(open_seq, Counter())[cmd] = count
        retired = sorted(self._retiring)
        for open_seq in retired:
            group = self._group_of_seq.pop(open_seq)
            self._closed_totals.setdefault(group, Counter()).update(
                self._live_counts.pop(open_seq, Counter()))
        self._retiring.clear()

        totals: dict[Group, Counter[int]] = {g: Counter(c) for g, c in self._closed_totals.items()}
        for open_seq, counter in self._live_counts.items():
            totals.setdefault(self._group_of_seq[open_seq], Counter()).update(counter)
        events: list[Event] = []
        for group, counter in totals.items():
            snapshot = {str(cmd): n for cmd, n in sorted(counter.items())}
            if snapshot and snapshot != self._published.get(group):
                self._published[group] = snapshot
                events.append(IoctlCounts(ts=ts, process=group[0], path=group[1],
                                          device=self._device_of_group[group], counts=snapshot))
        events += self._finish_exits()
        return events, retired

    def _finish_exits(self) -> list[Event]:
        events: list[Event] = []
        for tgid, ts in self._exiting.items():
            seen = self.processes.pop(tgid)
            events.append(ProcessExited(ts=ts, process=seen.process))
            for group in [g for g in self._closed_totals if g[0] == seen.process]:
                del self._closed_totals[group]
                self._published.pop(group, None)
                self._device_of_group.pop(group, None)
        self._exiting.clear()
        return events

    def snapshot(self) -> list[Event]:
        """Everything a subscriber that just (re)connected needs to know."""
        events: list[Event] = list(self.processes.values())
        events += [self._opened_event(t) for t in self.fds.values()]
        self._published.clear()   # the next update_counts re-sends every counter
        return events
