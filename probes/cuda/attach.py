"""The cuda probe's control thread: kill switch, allow-list, attach and detach.

Runs beside the probes' loop so that a slow attach never delays it, and so that the kill
switch (:mod:`~gpuwhy.probes.cuda.control`) is looked at every 50 ms whatever the loop does.
It attaches uprobe_multi links (one for entries, one for returns, per library per process)
to the libraries a watched process maps whose build id is allowed, closes them all at once
when told, and writes the state file. Events go to the probe's outbox: the probes' loop
publishes them.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuwhy.clock import now_ns
from gpuwhy.events import CudaLibrary
from gpuwhy.identity import ProcessKey
from gpuwhy.probes.cuda import control as cudactl
from gpuwhy.probes.cuda.libraries import (
    BY_SYMBOL,
    SYMBOL_PATTERN,
    MappedLibrary,
    build_id,
    cookie,
    file_offsets,
    mapped_libraries,
    parse_allowed,
)
from gpuwhy.probes.cuda.uprobe_multi import UprobeMultiError, close_all
from gpuwhy.probes.cuda.uprobe_multi import attach as attach_multi
from gpuwhy.threads import Thread


class AttachedProbe(Protocol):
    """What the attacher uses of the loaded CUDA probe (gpuwhy.probes.cuda.probe.CudaProbe):
    said here, so that the probe imports the attacher and not the other way round too."""

    config: Any
    enabled: bool
    disabled_reason: str | None
    counts: dict[str, int]
    programs: dict[bool, Any]      # the entry program (False) and the return one (True)
    outbox: queue.SimpleQueue

    def set_enabled(self, enabled: bool, reason: str | None = None) -> None: ...

    def forget(self, pid: int) -> None: ...

log = logging.getLogger(__name__)

RESCAN_SECONDS = 5.0


@dataclass
class Watched:
    """A GPU process and what is attached to it."""

    process: ProcessKey
    since_start: bool
    libraries: dict[str, list[int]] = field(default_factory=dict)  # path -> link fds
    probes: dict[str, int] = field(default_factory=dict)           # path -> uprobes
    refused: set[str] = field(default_factory=set)
    detached_reason: str | None = None
    next_rescan: float = 0.0


class Attacher:
    """``start()``, then ``requests.put(...)``: ("watch", process, since_start),
    ("unwatch", pid), ("detach", pid, reason); ``stop()``."""

    def __init__(self, probe: AttachedProbe):
        self.probe = probe
        self.config = probe.config
        self.proc_root: str = probe.config["probes.proc_root"]
        self.allowed = parse_allowed(probe.config["probes.cuda_allowed_build_ids"])
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.watched: dict[int, Watched] = {}
        self.last_detach_ms: float | None = None
        self._cache: dict[tuple, tuple[str | None, dict[str, int]]] = {}
        self._stop = threading.Event()
        self._thread = Thread(target=self.run, name="cuda-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def run(self) -> None:
        next_state = 0.0
        while not self._stop.is_set():
            try:
                request = self.requests.get(timeout=cudactl.CHECK_INTERVAL)
            except queue.Empty:
                request = None
            try:
                self._check_switch()
                if request is not None:
                    self._handle(request)
                self._rescan()
                if time.monotonic() >= next_state:
                    self.write_state()
                    next_state = time.monotonic() + 1.0
            except Exception:  # noqa: BLE001 - the control thread must outlive one bad request
                log.exception("cuda control thread")

    def _check_switch(self) -> None:
        reason = cudactl.disabled_reason(self.config)
        if reason is not None and self.probe.enabled:
            self._turn_off(reason)
        elif reason is None and not self.probe.enabled:
            log.info("cuda uprobes: kill switch cleared, attaching again")
            self.probe.set_enabled(True)
            for watched in self.watched.values():
                watched.next_rescan = 0.0
            self.write_state()

    def _turn_off(self, reason: str) -> None:
        started = time.monotonic()
        self.probe.set_enabled(False, reason)          # every program returns at once from now on
        self._detach(list(self.watched.values()), f"kill switch: {reason}")
        self.last_detach_ms = (time.monotonic() - started) * 1000
        log.warning("cuda uprobes off (%s): detached in %.0f ms", reason, self.last_detach_ms)
        self.write_state()

    def _handle(self, request: tuple) -> None:
        action = request[0]
        if action == "watch":
            _, process, since_start = request
            self.watched[process.pid] = Watched(process, since_start)
        elif action == "unwatch":
            watched = self.watched.pop(request[1], None)
            if watched is not None:
                self._detach([watched], "process exited", announce=False)
                self.probe.forget(request[1])
        elif action == "detach":
            watched = self.watched.get(request[1])
            if watched is not None and watched.detached_reason is None:
                self.probe.counts["detached_overhead"] += 1
                self._detach([watched], request[2])
                watched.detached_reason = request[2]

    def _rescan(self) -> None:
        if not self.probe.enabled:
            return
        now = time.monotonic()
        for watched in list(self.watched.values()):
            if watched.detached_reason is None and now >= watched.next_rescan:
                watched.next_rescan = now + RESCAN_SECONDS
                for library in mapped_libraries(watched.process.pid, self.proc_root):
                    if library.path in watched.libraries or library.path in watched.refused:
                        continue
                    if not self.probe.enabled or cudactl.disabled_reason(self.config) is not None:
                        return
                    self._attach(watched, library)

    def _identify(self, library: MappedLibrary) -> tuple[str | None, dict[str, int]]:
        """Build id and traced symbols (name -> file offset) of a library, cached by inode."""
        from bcc import BPF

        stat = os.stat(library.host_path)
        key = (stat.st_dev, stat.st_ino, stat.st_mtime_ns)
        if key not in self._cache:
            found = build_id(library.host_path)
            addresses: dict[str, int] = {}
            for name, address in BPF.get_user_functions_and_addresses(
                    library.host_path.encode(), SYMBOL_PATTERN.encode()):
                addresses.setdefault(name.decode(), address)
            self._cache[key] = (found, file_offsets(library.host_path, addresses))
        return self._cache[key]

    def _attach(self, watched: Watched, library: MappedLibrary) -> None:
        pid = watched.process.pid
        try:
            found, offsets = self._identify(library)
        except Exception as exc:  # noqa: BLE001 - bcc raises bare Exception
            self._refuse(watched, library, None, f"cannot read: {exc}")
            return
        if self.allowed is not None and found not in self.allowed:
            self._refuse(watched, library, found,
                         "build id not in probes.cuda_allowed_build_ids")
            return
        by_offset = {offset: BY_SYMBOL[symbol] for symbol, offset in sorted(offsets.items())}
        links: list[int] = []
        try:
            for retprobe in (False, True):
                links.append(attach_multi(self.probe.programs[retprobe], library.host_path,
                                          list(by_offset),
                                          [cookie(f) for f in by_offset.values()],
                                          pid=pid, retprobe=retprobe))
        except UprobeMultiError as exc:
            self.probe.counts["attach_failures"] += 1
            close_all(links)
            watched.refused.add(library.path)
            self.probe.outbox.put(CudaLibrary(ts=now_ns(), process=watched.process,
                                         path=library.path, build_id=found, state="failed",
                                         reason=str(exc)[:200]))
            return
        watched.libraries[library.path] = links
        probes = watched.probes[library.path] = 2 * len(by_offset)
        self.probe.counts["attached_probes"] += probes
        self.probe.outbox.put(CudaLibrary(ts=now_ns(), process=watched.process, path=library.path,
                                     build_id=found, state="attached", probes=probes))

    def _refuse(self, watched: Watched, library: MappedLibrary, found: str | None,
                reason: str) -> None:
        watched.refused.add(library.path)
        self.probe.counts["refused_libraries"] += 1
        log.warning("cuda uprobes: not attaching to %s of pid %d (build id %s): %s",
                    library.path, watched.process.pid, found, reason)
        self.probe.outbox.put(CudaLibrary(ts=now_ns(), process=watched.process, path=library.path,
                                     build_id=found, state="refused", reason=reason[:200]))

    def _detach(self, watched: list[Watched], reason: str, announce: bool = True) -> None:
        """Close every link of these processes at once; announce each library."""
        close_all([fd for one in watched for links in one.libraries.values() for fd in links])
        for one in watched:
            for path, links in one.libraries.items():
                if announce and links:
                    self.probe.outbox.put(CudaLibrary(ts=now_ns(), process=one.process, path=path,
                                                 build_id=None, state="detached",
                                                 reason=reason[:200]))
            self.probe.counts["attached_probes"] -= sum(one.probes.values())
            one.libraries.clear()
            one.probes.clear()

    def write_state(self) -> None:
        processes = [{"pid": w.process.pid, "start_time": w.process.start_time,
                      "libraries": dict(w.probes),
                      "refused": sorted(w.refused), "detached": w.detached_reason}
                     for w in list(self.watched.values())]
        try:
            cudactl.write_state(self.config, {
                "pid": os.getpid(), "enabled": self.probe.enabled,
                "reason": self.probe.disabled_reason,
                "attached_probes": self.probe.counts["attached_probes"],
                "last_detach_ms": self.last_detach_ms, "processes": processes})
        except OSError as exc:
            log.warning("cannot write the cuda state file: %s", exc)

