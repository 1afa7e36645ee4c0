"""Run the selected GPU source and publish what it reads on the bus, with its health.

Two threads. The caller's keeps the schedule and owns the publisher (a ZeroMQ socket is
not thread-safe): it asks for a read every ``interval`` s, publishes what comes back, and
beats the source's health every HEALTH_EVERY s whatever the reads do. A reader thread only
calls ``source.read()``. So a read that blocks (a hung DCGM hostengine, an NVML call stuck
in the driver, a scrape target trickling bytes) cannot stop the heartbeat: once a read has
run STALL_FACTOR intervals, or the last one took that long, the health says ``stalled``
(see :mod:`gpuwhy.stalls`) until a read is quick again. The exporter's scrape also ends at
its own deadline (gpu.exporter_timeout); DCGM and NVML calls cannot be interrupted, so a
stuck one is reported, not cut.

Shutdown: ``stop`` is set; the loop returns within POLL_WHILE_READING s, waits up to
CLOSE_WAIT s for a read in flight, and closes the source unless a read is still in it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from typing import cast

from gpuwhy.bus import Publisher
from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.events import Event, GpuSample, SourceHealth
from gpuwhy.probes.gpu.select import open_source
from gpuwhy.probes.gpu.source import GpuSource, SourceUnavailable, driver_gpu_events
from gpuwhy.stalls import HEALTH_PERIOD_S, STALL_FACTOR, STALLED
from gpuwhy.threads import Thread
from gpuwhy.topology import pci_numa_node

log = logging.getLogger(__name__)

HEALTH_EVERY = HEALTH_PERIOD_S["gpu"]
RESEND_GPUS_EVERY = 60.0
POLL_WHILE_READING = 0.2   # how soon a stop is seen while waiting on a read
CLOSE_WAIT = 1.0

# what a read hands back: events, or the reason the source gave; its seconds; and what it
# raised besides (a bug: re-raised in the runner's thread, as before there was a reader)
ReadResult = tuple[list[Event] | None, str | None, float, Exception | None]


def health_of(source: GpuSource, steps: list[str], error: str | None) -> tuple[str, str]:
    """State and detail for ``gpuwhy status``: the simulator is never ``ok``."""
    detail = "; ".join(steps + source.notes() + ([f"ERROR: {error}"] if error else []))
    if source.simulated:
        return "degraded", f"SIMULATED data, no real GPU is read: {detail}"
    return ("degraded" if error or len(source.notes()) > 1 else "ok"), detail


class GpuRunner:
    """Reads ``source`` every ``interval`` s and publishes through ``publisher``."""

    def __init__(self, source: GpuSource, steps: list[str], publisher: Publisher,
                 interval: float, sys_root: str = "/sys", proc_root: str | None = None):
        self.source, self.steps, self.publisher = source, steps, publisher
        self.sys_root = sys_root
        self.proc_root = proc_root        # None: the driver's GPU table is not read
        self.interval = interval
        self.stall_after = STALL_FACTOR * interval
        self.counters: Counter[str] = Counter()
        self.error: str | None = None
        self.reading_since: float | None = None   # monotonic start of the read in flight
        self.last_read_s = 0.0                     # how long the last finished read took
        self._requests: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[ReadResult] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None

    def publish(self, events: list[Event]) -> None:
        """A read's events as one batch message (eight GPUs' samples sent one by one woke
        the correlator eight times a second)."""
        dropped = self.publisher.dropped
        with self.publisher.batched():
            for event in events:
                self.publisher.publish(event)
        lost = self.publisher.dropped - dropped
        self.counters["published"] += len(events) - lost
        if lost:
            self.counters["dropped"] += lost
        self.counters["samples"] += sum(isinstance(event, GpuSample) for event in events)

    def publish_gpus(self) -> None:
        """Every GPU known: the driver's own table, then what the source reads."""
        ts = now_ns()
        if self.proc_root is not None:
            self.publish(list(driver_gpu_events(ts, self.proc_root)))
        gpus = list(self.source.gpus)   # a copy: the reader may add one
        for gpu in gpus:
            # this host's sysfs knows where a real GPU sits; a simulated one says itself
            if gpu.numa_node is None and not self.source.simulated:
                gpu.numa_node = pci_numa_node(gpu.identity.pci_bus_id, self.sys_root)
        self.publish([gpu.seen(ts, self.source.name, self.source.simulated) for gpu in gpus])

    def stalled(self, now: float) -> str | None:
        """Why the source counts as stalled at ``now`` (monotonic), or None."""
        expected = f"one every {self.interval:g} s expected, stalled after {self.stall_after:g} s"
        if self.reading_since is not None and now - self.reading_since > self.stall_after:
            return (f"a read of {self.source.name} has been running for "
                    f"{now - self.reading_since:.1f} s ({expected})")
        if self.last_read_s > self.stall_after:
            return f"the last read of {self.source.name} took {self.last_read_s:.1f} s ({expected})"
        return None

    def publish_health(self) -> None:
        state, detail = health_of(self.source, self.steps, self.error)
        stalled = self.stalled(time.monotonic())
        if stalled is not None:
            state, detail = STALLED, f"STALLED: {stalled}; {detail}"
        self.publisher.publish(SourceHealth(ts=now_ns(), source="gpu", state=state,
                                            detail=detail, counters=dict(self.counters)))

    def read(self) -> ReadResult:
        """One timed ``source.read()``; any thread."""
        started = time.monotonic()
        events, error, crash = None, None, None
        try:
            events = self.source.read()
        except SourceUnavailable as exc:
            error = exc.reason
        except Exception as exc:  # noqa: BLE001 - handed to the runner's thread, raised there
            crash = exc
        return events, error, time.monotonic() - started, crash

    def finish(self, result: ReadResult) -> None:
        """Take a read's result in (the publishing thread)."""
        events, error, seconds, crash = result
        if crash is not None:
            raise crash
        self.last_read_s = seconds
        if seconds > self.stall_after:
            self.counters["slow_reads"] += 1
        if error is not None:
            if self.error != error:
                log.warning("GPU source %s: %s (retrying)", self.source.name, error)
            self.error = error
            self.counters["read_errors"] += 1
            return
        self.error = None
        self.publish(events or [])

    def step(self) -> None:
        """One read and its publishing, in the caller's thread (benchmarks, tests)."""
        self.finish(self.read())

    def _serve_reads(self) -> None:
        while self._requests.get():
            self._results.put(self.read())

    @property
    def busy(self) -> bool:
        """A read is still running in the reader thread."""
        return self.reading_since is not None

    def run(self, stop: threading.Event) -> None:
        self._reader = Thread(target=self._serve_reads, name="gpuwhy-gpu-read",
                              daemon=True)   # a read stuck for good must not hold exit
        self._reader.start()
        try:
            self._loop(stop)
            if self.busy:
                self._take_result(CLOSE_WAIT)
        finally:
            self._requests.put(False)   # the reader ends after its read, if one is running
        self.publish_health()

    def _loop(self, stop: threading.Event) -> None:
        self.publish_gpus()
        self.publish_health()
        next_read = next_health = time.monotonic()
        next_resend = next_read + RESEND_GPUS_EVERY
        was_stalled = False
        while not stop.is_set():
            now = time.monotonic()
            if self.publisher.poll_subscriptions() or now >= next_resend:
                self.publish_gpus()   # a (re)started correlator learns the GPUs again
                next_resend = now + RESEND_GPUS_EVERY
            if now >= next_read and not self.busy:
                self.reading_since = now
                self._requests.put(True)
                next_read += self.interval
                if next_read < now:   # fell behind (suspend, slow source): do not burst
                    next_read = now + self.interval
            stalled = self.stalled(now) is not None
            if now >= next_health or stalled != was_stalled:   # a stall is said at once
                self.publish_health()
                next_health = now + HEALTH_EVERY
                was_stalled = stalled
            self._wait(stop, next_read, next_health)

    def _wait(self, stop: threading.Event, next_read: float, next_health: float) -> None:
        """Until the next thing to do: a read's result, a read or a beat due, a stall."""
        if not self.busy:
            stop.wait(max(0.0, min(next_read, next_health) - time.monotonic()))
            return
        now = time.monotonic()
        wake = next_health
        # busy: a read is in flight, reading_since is set
        stalls_at = cast(float, self.reading_since) + self.stall_after + 0.01
        if stalls_at > now:   # wake when the read becomes a stall, to say so then
            wake = min(wake, stalls_at)
        self._take_result(min(POLL_WHILE_READING, max(0.0, wake - now)))

    def _take_result(self, timeout: float) -> None:
        try:
            result = self._results.get(timeout=timeout)
        except queue.Empty:
            return
        self.reading_since = None
        self.finish(result)


def run_gpu_source(config: Config, stop: threading.Event) -> None:
    """The ``gpu`` runner of :func:`gpuwhy.app.service.unprivileged_sources`."""
    publisher = Publisher(config["bus.endpoint"], src="gpu", hwm=config["bus.hwm"])
    try:
        # The driver's table first: a GPU is known by its minor, UUID and bus id even when
        # no counters source opens (a forced one that fails ends this runner).
        publisher.wait_for_subscriber(1.0)
        with publisher.batched():
            for event in driver_gpu_events(now_ns(), config["probes.proc_root"]):
                publisher.publish(event)
        source, steps = open_source(config)
        if source.simulated:
            log.warning("!!! GPU counters are SIMULATED (%s): %s", "; ".join(steps),
                        "; ".join(source.notes()))
        else:
            log.info("GPU source: %s", "; ".join(steps))
        runner = GpuRunner(source, steps, publisher, config["gpu.interval"],
                           config["probes.sys_root"], config["probes.proc_root"])
        try:
            runner.run(stop)
        finally:
            if runner.busy:
                # closing a DCGM or NVML handle under a running call can crash the process
                log.warning("GPU source %s: a read still running at stop; left unclosed",
                            source.name)
            else:
                source.close()
    finally:
        publisher.close()
