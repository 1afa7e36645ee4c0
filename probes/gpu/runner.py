"""Run the selected GPU source and publish what it reads on the bus, with its health.

One thread (the caller's). Shutdown: ``stop`` is set; the loop returns within one
interval (at most 1 s) and closes the source and its publisher.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from gpuwhy.bus import Publisher
from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.events import Event, GpuSample, SourceHealth
from gpuwhy.probes.gpu.select import open_source
from gpuwhy.probes.gpu.source import GpuSource, SourceUnavailable

log = logging.getLogger(__name__)

HEALTH_EVERY = 2.0
RESEND_GPUS_EVERY = 60.0


def health_of(source: GpuSource, steps: list[str], error: str | None) -> tuple[str, str]:
    """State and detail for ``gpuwhy status``: the simulator is never ``ok``."""
    detail = "; ".join(steps + source.notes() + ([f"ERROR: {error}"] if error else []))
    if source.simulated:
        return "degraded", f"SIMULATED data, no real GPU is read: {detail}"
    return ("degraded" if error or len(source.notes()) > 1 else "ok"), detail


class GpuRunner:
    """Reads ``source`` every ``interval`` s and publishes through ``publisher``."""

    def __init__(self, source: GpuSource, steps: list[str], publisher: Publisher,
                 interval: float):
        self.source, self.steps, self.publisher = source, steps, publisher
        self.interval = interval
        self.counters: Counter[str] = Counter()
        self.error: str | None = None

    def publish(self, events: list[Event]) -> None:
        for event in events:
            self.counters["published" if self.publisher.publish(event) else "dropped"] += 1
            if isinstance(event, GpuSample):
                self.counters["samples"] += 1

    def publish_gpus(self) -> None:
        ts = now_ns()
        self.publish([gpu.seen(ts, self.source.name, self.source.simulated)
                      for gpu in self.source.gpus])

    def publish_health(self) -> None:
        state, detail = health_of(self.source, self.steps, self.error)
        self.publisher.publish(SourceHealth(ts=now_ns(), source="gpu", state=state,
                                            detail=detail, counters=dict(self.counters)))

    def step(self) -> None:
        try:
            events = self.source.read()
        except SourceUnavailable as exc:
            if self.error != exc.reason:
                log.warning("GPU source %s: %s (retrying)", self.source.name, exc.reason)
            self.error = exc.reason
            self.counters["read_errors"] += 1
            return
        self.error = None
        self.publish(events)

    def run(self, stop: threading.Event) -> None:
        self.publish_gpus()
        self.publish_health()
        next_read = next_health = time.monotonic()
        next_resend = next_read + RESEND_GPUS_EVERY
        while not stop.is_set():
            now = time.monotonic()
            if self.publisher.poll_subscriptions() or now >= next_resend:
                self.publish_gpus()   # a (re)started correlator learns the GPUs again
                next_resend = now + RESEND_GPUS_EVERY
            if now >= next_read:
                self.step()
                next_read += self.interval
                if next_read < now:   # fell behind (suspend, slow source): do not burst
                    next_read = now + self.interval
            if now >= next_health:
                self.publish_health()
                next_health = now + HEALTH_EVERY
            stop.wait(max(0.0, min(next_read, next_health) - time.monotonic()))
        self.publish_health()


def run_gpu_source(config: Config, stop: threading.Event) -> None:
    """The ``gpu`` runner of :func:`gpuwhy.service.unprivileged_sources`."""
    publisher = Publisher(config["bus.endpoint"], src="gpu", hwm=config["bus.hwm"])
    try:
        source, steps = open_source(config)
        if source.simulated:
            log.warning("!!! GPU counters are SIMULATED (%s): %s", "; ".join(steps),
                        "; ".join(source.notes()))
        else:
            log.info("GPU source: %s", "; ".join(steps))
        publisher.wait_for_subscriber(1.0)
        try:
            GpuRunner(source, steps, publisher, config["gpu.interval"]).run(stop)
        finally:
            source.close()
    finally:
        publisher.close()
