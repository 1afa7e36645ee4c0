"""Run the privileged probes: load them, publish on the bus, re-send state on (re)subscribe.

fdtrack is required; lifecycle, sched and printk (the kernel's log record count, for the
kernel-log liveness check) add to it and, when they cannot load, are reported as failed
while the rest runs on. The GPU processes fdtrack finds are handed
to sched to be watched. One thread polls all ring buffers; figures are flushed every
``probes.poll_interval`` seconds.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import cast

from gpuwhy.bus import BATCH_BYTES, Publisher
from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.errors import ProbeLoadError
from gpuwhy.events import DeviceOpened, Event, ProcessExited, SourceHealth
from gpuwhy.memory import release_freed_memory
from gpuwhy.probes.cuda.probe import CudaProbe
from gpuwhy.probes.fdtrack import BPF_STATS_SYSCTL, FdTrackProbe, bpf_stats_enabled
from gpuwhy.probes.klog.lend import KmsgLender
from gpuwhy.probes.printk import PrintkProbe
from gpuwhy.probes.process_events import LifecycleProbe
from gpuwhy.probes.release import close_released, drop_compiler_pages, release_module
from gpuwhy.probes.ringwait import epoll_fd
from gpuwhy.probes.sched import SchedProbe
from gpuwhy.stalls import HEALTH_PERIOD_S

log = logging.getLogger(__name__)

# Every probe's health beat: not at each flush (four messages a second the correlator
# stored, on a host with nothing to watch); what the probes see goes out at each flush.
HEALTH_EVERY_S = HEALTH_PERIOD_S["probes"]

# Processes coming and going (a shell loop, a probe's exec, a build) are read in batches: the
# first record after a quiet spell is read at once (a cron job's process is read from /proc
# while it runs), then the lifecycle ring is left out of the wait for LIFECYCLE_HOLD_S while
# records keep coming, so a host starting ten processes a second wakes the probes (and the
# bus, and the correlator) about once a second, not thirty times; well inside the
# correlator's lag. A read that found the ring a quarter full holds only LIFECYCLE_FULL_HOLD_S
# so that a burst does not fill it.
LIFECYCLE_HOLD_S = 1.0
LIFECYCLE_FULL_HOLD_S = 0.1

# Memory, bounded whatever the host does (issue #54). A poll reads at most RECORDS_PER_POLL
# of a ring (fdtrack.py, lifecycle.py); after a poll that stopped there (a storm: a million
# notable ioctls or opens a second from any process that may open /dev/nvidiactl), fdtrack's
# ring is left alone FDTRACK_FULL_HOLD_S: the probes read at most ~10,000 of its records a
# second, what the correlator stores with room to spare, and the rest is dropped in the
# kernel and counted (dropped_ringbuf_full). The bus's send queue is bounded in messages
# (bus.hwm); a batch message holds up to BATCH_BYTES, so the probes' queue gets
# SEND_QUEUE_BYTES / BATCH_BYTES messages at most (128: 32 MB), past which batches are
# dropped and counted (dropped_bus_hwm). Before: 2.5 M ioctls in 5 s grew the probes from
# 48 MB to 3 GB; after, measured in tests/privileged/test_probe_memory.py.
FDTRACK_FULL_HOLD_S = 0.05
SEND_QUEUE_BYTES = 32 << 20


def send_hwm(configured: int) -> int:
    """The probes' bus high-water mark: ``bus.hwm``, at most SEND_QUEUE_BYTES of full batch
    messages (0, ZeroMQ's "no limit", gets that bound too)."""
    bound = SEND_QUEUE_BYTES // BATCH_BYTES
    return min(configured, bound) if configured > 0 else bound


def warn_if_bpf_stats_enabled(sysctl: Path = BPF_STATS_SYSCTL) -> bool:
    """Say so when the kernel times every BPF program run (see ``bpf_stats_enabled``)."""
    enabled = bpf_stats_enabled(sysctl)
    if enabled:
        log.warning("kernel.bpf_stats_enabled=1: every eBPF program run is timed, which "
                    "makes each traced ioctl slower; `sysctl kernel.bpf_stats_enabled=0` "
                    "unless you are profiling BPF programs")
    return enabled


class Probes:
    """fdtrack + lifecycle + sched + printk, wired together and to one publisher."""

    def __init__(self, config: Config, publisher: Publisher):
        self.config = config
        self.publisher = publisher
        self.fdtrack = FdTrackProbe(config, self._publish_fd,
                                    bus_counters=lambda: {"dropped_bus_hwm": publisher.dropped})
        self.lifecycle: LifecycleProbe | None = LifecycleProbe(config, publisher.publish)
        self.printk: PrintkProbe | None = PrintkProbe()
        self.sched: SchedProbe | None = SchedProbe(config, publisher.publish) \
            if config["probes.sched"] else None
        self.cuda: CudaProbe | None = CudaProbe(config, publisher.publish) \
            if config["probes.cuda_uprobes"] else None
        self.failed: dict[str, str] = {}
        self._released_fds: list[int] = []
        self._next_health = 0.0
        self.lifecycle_held_until = 0.0     # monotonic; 0: its ring is waited on
        self.fdtrack_held_until = 0.0       # monotonic; set after a poll stopped at its cap

    def _publish_fd(self, event: Event) -> None:
        self.publisher.publish(event)
        if isinstance(event, DeviceOpened) and event.how in ("open", "scan"):
            # A child holding inherited fds (a DataLoader worker) stays its parent's worker.
            if self.sched is not None:
                self.sched.watch(event.process)
            if self.cuda is not None:
                self.cuda.watch(event.process, since_start=event.how == "open")
        elif isinstance(event, ProcessExited):
            for probe in (self.sched, self.cuda):
                if probe is not None:
                    probe.unwatch(event.process.pid)

    def load(self) -> None:
        """Load fdtrack (raises ProbeLoadError), then the optional probes."""
        warn_if_bpf_stats_enabled()
        for name in ("sched", "cuda"):    # before fdtrack's scan hands them processes
            self._load_optional(name)
        self.fdtrack.load()
        for name in ("lifecycle", "printk"):
            self._load_optional(name)

    def _load_optional(self, name: str) -> None:
        probe = getattr(self, name)
        if probe is None:
            return
        try:
            probe.load()
        except ProbeLoadError as exc:
            log.error("%s; running without it", exc)
            self._without(name, str(exc))

    def release_loader(self) -> None:
        """Free what only loading needed (probes/release.py): the LLVM modules of every
        probe but the CUDA one (it loads programs again as libraries appear), the heap
        compiling freed, and the compiler's code pages."""
        for probe in (self.fdtrack, self.lifecycle, self.sched, self.printk):
            if probe is not None and probe.bpf is not None:
                self._released_fds += release_module(probe.bpf)
        release_freed_memory()
        log.info("probes: loader released (%d table fds kept, %.0f MB of compiler pages "
                 "dropped)", len(self._released_fds), drop_compiler_pages() / 1024)

    def _without(self, name: str, reason: str) -> None:
        """Run on without an optional probe; its health says failed at the next flush."""
        setattr(self, name, None)
        self.failed[name] = reason
        self._next_health = 0.0

    def flush(self) -> None:
        """Publish every probe's figures, as batch messages (a flush is a figure per watched
        process and probe: sent one by one they cost the bus more than the figures)."""
        with self.publisher.batched():
            self._flush()

    def _flush(self) -> None:
        self.fdtrack.flush()          # required: its failure stops the probes, said so
        for name in ("sched", "cuda"):
            probe = getattr(self, name)
            if probe is None:
                continue
            try:
                probe.flush()
            except Exception as exc:  # noqa: BLE001 - an optional probe fails on its own
                log.exception("the %s probe failed to flush; running without it", name)
                self._without(name, f"flush failed: {type(exc).__name__}: {exc}")
                try:
                    probe.close()
                except Exception:  # noqa: BLE001 - already failed: detach what can be
                    log.exception("closing the failed %s probe", name)
        now = time.monotonic()
        if now >= self._next_health:
            self._next_health = now + HEALTH_EVERY_S
            self._publish_health()

    def idle(self) -> bool:
        """No GPU process on the host: flushes can wait for the next health beat."""
        return self.fdtrack.idle() and (self.sched is None or self.sched.idle()) and \
            self.cuda is None

    def resync(self) -> None:
        """Re-send the state and, at the next flush, every health beat (a subscriber has
        just connected or reconnected)."""
        self.fdtrack.resync()
        self._next_health = 0.0

    def _publish_health(self) -> None:
        if self.cuda is not None:
            self.publisher.publish(self.cuda.health())
        self.publisher.publish(self.fdtrack.health())
        for name, probe in (("lifecycle", self.lifecycle), ("sched", self.sched),
                            ("printk", self.printk)):
            if probe is not None:
                self.publisher.publish(counted_health(name, probe.counters()))
        for name, reason in self.failed.items():
            self.publisher.publish(SourceHealth(ts=now_ns(), source=name, state="failed",
                                                detail=reason))

    def poll(self, timeout_ms: int = 100) -> None:
        """Handle every ring buffer's records, waiting up to ``timeout_ms`` on fdtrack's.
        What one poll finds goes out in batch messages as it ends (microseconds later): a
        busy process's driver calls sent one message each cost the bus more than they say."""
        with self.publisher.batched():
            self._poll_fdtrack(timeout_ms)
            if self.lifecycle is not None:
                before = self.lifecycle.records
                self.lifecycle.poll(0)
                self._pace_lifecycle(self.lifecycle.records - before)
            if self.cuda is not None:
                self.cuda.poll(0)

    def _poll_fdtrack(self, timeout_ms: int) -> None:
        """Read fdtrack's ring unless it is held after a poll that stopped at its cap (then
        wait out the hold, within ``timeout_ms``, instead of reading)."""
        now = time.monotonic()
        if now < self.fdtrack_held_until:
            if timeout_ms:
                time.sleep(min(timeout_ms / 1000, self.fdtrack_held_until - now))
            return
        capped = self.fdtrack.poll(timeout_ms)
        self.fdtrack_held_until = time.monotonic() + FDTRACK_FULL_HOLD_S if capped else 0.0

    def _pace_lifecycle(self, read: int) -> None:
        """Hold the lifecycle ring out of the wait after a read that found records; let it
        back in once a read at the end of a hold finds none (see LIFECYCLE_HOLD_S)."""
        now = time.monotonic()
        if read:
            # called only while the lifecycle probe runs
            full = read >= cast(LifecycleProbe, self.lifecycle).ring_records // 4
            self.lifecycle_held_until = now + (LIFECYCLE_FULL_HOLD_S if full
                                               else LIFECYCLE_HOLD_S)
        elif now >= self.lifecycle_held_until:
            self.lifecycle_held_until = 0.0

    def ring_fds(self) -> dict[str, int] | None:
        """The fds to sleep on until some probe has records (probes/ringwait.py), by probe,
        or None when one of them cannot be waited on that way (the loop then polls every
        100 ms). The CUDA uprobes attach in the background and queue what they find, so
        with them on the loop keeps looking every 100 ms too."""
        if self.cuda is not None:
            return None
        fds = {name: epoll_fd(probe.bpf) for name, probe in
               (("fdtrack", self.fdtrack), ("lifecycle", self.lifecycle)) if probe is not None}
        return None if None in fds.values() else cast(dict[str, int], fds)

    def waited_on(self, fds: dict[str, int]) -> list[int]:
        """Of ``ring_fds()``, those to wait on now: not a ring while it is held."""
        now = time.monotonic()
        held = {name for name, until in (("lifecycle", self.lifecycle_held_until),
                                         ("fdtrack", self.fdtrack_held_until)) if now < until}
        return [fd for name, fd in fds.items() if name not in held]

    def held_until(self, default: float) -> float:
        """When the first ring held out of the wait comes back (``default`` if none is)."""
        return min(self.lifecycle_held_until or default, self.fdtrack_held_until or default,
                   default)

    def close(self) -> None:
        """Detach everything; in parallel, because each tracepoint detach waits for an RCU
        grace period (fdtrack's 26 take over a second one after the other)."""
        closers = [threading.Thread(target=probe.close)
                   for probe in (self.lifecycle, self.sched, self.cuda, self.fdtrack,
                                 self.printk)
                   if probe is not None]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join()
        close_released(self._released_fds)
        self._released_fds = []


def counted_health(source: str, counters: dict[str, int]) -> SourceHealth:
    """A probe's health from its counters: degraded, and said, once it lost records (a
    lifecycle ring that overflowed said "ok" before)."""
    lost = sum(value for key, value in counters.items() if key.startswith("dropped_"))
    return SourceHealth(ts=now_ns(), source=source, state="degraded" if lost else "ok",
                        detail=f"{lost} records or map entries lost" if lost else "",
                        counters=counters)


def run_probes(config: Config, stop: threading.Event,
               loaded: threading.Event | None = None) -> None:
    """Load every probe, then publish until ``stop`` is set. Raises ProbeLoadError."""
    publisher = Publisher(config["bus.endpoint"], src="probes", hwm=send_hwm(config["bus.hwm"]))
    probes = Probes(config, publisher)
    lender = lend_kmsg(config)      # before the probes' slow load: the source asks early
    try:
        probes.load()
        probes.release_loader()
        if loaded is not None:
            loaded.set()
        _publish_until(stop, probes, publisher, config["probes.poll_interval"])
        probes.poll()
        probes.flush()
    finally:
        if lender is not None:
            lender.close()
        probes.close()
        publisher.close()


def lend_kmsg(config: Config) -> KmsgLender | None:
    """Lend /dev/kmsg at ``klog.kmsg_socket`` (see :mod:`gpuwhy.probes.klog.lend`), when set.
    A refusal is logged: the kernel-log source then looks at the journal every 0.1 s."""
    if not config["klog.kmsg_socket"]:
        return None
    try:
        lender = KmsgLender(config["klog.kmsg_socket"], config["klog.kmsg_path"])
    except OSError as exc:
        log.warning("cannot lend %s at %s: %s", config["klog.kmsg_path"],
                    config["klog.kmsg_socket"], exc.strerror or exc)
        return None
    lender.start()
    log.info("lending %s to the kernel-log source at %s", config["klog.kmsg_path"],
             config["klog.kmsg_socket"])
    return lender


def _publish_until(stop: threading.Event, probes: Probes, publisher: Publisher,
                   flush_every: float) -> None:
    fds = probes.ring_fds()
    log.info("probes: %s", "sleeping on the ring buffers and the bus between flushes"
             if fds is not None else "looking at the ring buffers every 100 ms")
    next_flush = last_flush = 0.0
    with _SignalWakeup() as wakeup:
        while not stop.is_set():
            if fds is None:
                probes.poll()
            else:
                # Until a record, a subscriber, a signal, the next flush or the end of the
                # lifecycle ring's hold: an idle host costs one wake-up a flush.
                until = probes.held_until(next_flush)
                publisher.wait([*probes.waited_on(fds), *wakeup.fds],
                               max(0.0, until - time.monotonic()))
                wakeup.drain()
                probes.poll(0)
            if publisher.poll_subscriptions():
                # The correlator (re)started: what it missed is re-sent, so nothing is lost
                # to the slow joiner or to a restart of the stable side.
                log.info("subscriber connected: re-sending state")
                probes.resync()
            now = time.monotonic()
            if now >= next_flush:
                probes.flush()
                last_flush = now
                # a host without GPU processes: a flush (and a wake-up) a health beat
                next_flush = now + (max(flush_every, HEALTH_EVERY_S) if probes.idle()
                                    else flush_every)
            elif next_flush > last_flush + flush_every and not probes.idle():
                next_flush = last_flush + flush_every      # one has just appeared


class _SignalWakeup:
    """A pipe the C signal handler writes to (``signal.set_wakeup_fd``), so that a SIGTERM
    ends a sleep at once instead of at the next flush; only in the main thread (elsewhere
    the stop event is checked after each sleep, at most a flush apart)."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self._pipe: tuple[int, int] | None = None
        self._previous = -1

    def __enter__(self) -> _SignalWakeup:
        if threading.current_thread() is threading.main_thread():
            self._pipe = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._previous = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)
            self.fds = [self._pipe[0]]
        return self

    def drain(self) -> None:
        if self._pipe is not None:
            try:
                os.read(self._pipe[0], 512)
            except BlockingIOError:
                pass

    def __exit__(self, *exc: object) -> None:
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous)
            for fd in self._pipe:
                os.close(fd)
