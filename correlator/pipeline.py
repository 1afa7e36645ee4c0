"""The correlator's pipeline: bus -> batches -> store -> decide -> alerts, with health.

Threads: one, the caller's. It owns the store's only writing connection. Each batch is one
transaction: the writer applies the events, then the decide stage (incidents, chains,
timelines) runs on the same connection, so incidents commit with the events they rest on;
alerts go to the journal after the commit. A batch is written when it is full, when it is
``correlator.flush_interval`` old, or URGENT_FLUSH_GAP after an event that may open an
incident arrived (an Xid, a GPU lost or reset, a rule finding: ``may_open_incident``): an
alert does not wait for the batch timer, and a storm of such events still makes at most
1/URGENT_FLUSH_GAP transactions a second. Shutdown: ``stop`` is set, the loop ends, the
bus is drained for at most DRAIN_SECONDS, the last batch is written, the socket closes.
"""

from __future__ import annotations

import gc
import logging
import sqlite3
import threading
import time
from collections.abc import Callable

from sqlite_utils import Database

from gpuwhy.bus import Subscriber
from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.correlator.alerts import Alerter
from gpuwhy.correlator.incidents import MAY_OPEN_KINDS, IncidentBuilder, may_open_incident
from gpuwhy.correlator.klog_liveness import KernelLogLiveness
from gpuwhy.correlator.source_stalls import StallWatch
from gpuwhy.events import Envelope, SourceHealth
from gpuwhy.store import incident_rows
from gpuwhy.store.maintenance import Maintenance
from gpuwhy.store.writer import StoreWriter

log = logging.getLogger(__name__)

MAX_PENDING = 100_000   # events held while the store cannot be written
GC_GEN0_THRESHOLD = 50_000
HEALTH_EVERY = 5.0     # see gpuwhy.stalls.HEALTH_PERIOD_S
DRAIN_SECONDS = 1.0
DECIDE_EVERY = 1.0      # the decide stage runs this often even without events (stalls, settling)
URGENT_FLUSH_GAP = 0.05
MAX_SLEEP = 1.0         # longest wait on the bus: how late a stop may be seen


def tune_gc() -> None:
    """Garbage collection for a process that runs the correlator, called once at start.

    A batch allocates ~20 objects an event that live until it is written; with the default
    gen-0 threshold (700) the collector walked them again and again, a fifth of the batch
    time. The correlator makes few reference cycles, so collecting less often costs little
    memory; what exists at start (modules, config) is frozen out of every collection.
    """
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])


class Correlator:
    """Receives events and writes them in batches; ``run(stop)`` until stopped."""

    def __init__(self, config: Config, db: Database, subscriber: Subscriber,
                 alerter: Alerter | None = None, host_boot: str | None = None):
        self.batch_size: int = config["correlator.batch_size"]
        self.flush_interval: float = config["correlator.flush_interval"]
        self.subscriber = subscriber
        self.writer = StoreWriter(db)
        self.maintenance = Maintenance(config, db)   # rollups, retention, size
        self.builder = IncidentBuilder(config, host_boot)   # the host's boot id: gpuwhy.boot
        self.klog_liveness = KernelLogLiveness()
        self.stall_watch = StallWatch(config)   # sources silent too long: logged, counted
        self.alerter = alerter or Alerter(config["correlator.url"],
                                          enabled=config["correlator.alerts"], settings=config)
        self.pending: list[Envelope] = []
        self.written = 0
        self.decide_errors = 0
        self.dropped_store_unavailable = 0
        self.store_error: str | None = None
        self._last_decide = 0.0
        self._urgent_pending = False     # the pending batch holds a may_open_incident event
        # the decide stage's wall clock; a replay of recorded events sets it to return None
        self.wall_clock: Callable[[], int | None] = now_ns

    def _write_and_decide(self) -> list[int]:
        db = self.writer.db
        with db.atomic():
            written = self.writer.write_batch(self.pending)
            self._check_klog_liveness()
            try:
                with db.atomic():
                    new = self.builder.decide(db, self.pending, self.wall_clock())
            except sqlite3.Error:
                raise
            except Exception:  # noqa: BLE001 - a decide bug must not lose the batch's events
                self.decide_errors += 1
                log.exception("the decide stage failed on a batch; its events are stored")
                new = []
                self.builder.changes = []    # rolled back with the decide
        self.written += written
        return new

    def _check_klog_liveness(self) -> None:
        """Store the kernel-log source as failed while the kernel logs lines it never reads."""
        for envelope in self.pending:
            event = envelope.event
            if event.__class__ is SourceHealth:
                stored = self.klog_liveness.observe(event)
                if stored is not event:
                    self.writer.record_health(stored.source, stored.state, stored.detail,
                                              stored.counters, stored.ts)

    def flush(self) -> None:
        if not self.pending and time.monotonic() - self._last_decide < DECIDE_EVERY:
            return
        self._last_decide = time.monotonic()
        try:
            new = self._write_and_decide()
        except sqlite3.Error as exc:
            self.writer.forget_uncommitted()
            if self.store_error is None:
                log.error("cannot write the store, holding events: %s", exc)
            self.store_error = str(exc)
            overflow = len(self.pending) - MAX_PENDING
            if overflow > 0:
                self.dropped_store_unavailable += overflow
                del self.pending[:overflow]
            return
        self.writer.committed()
        if self.store_error is not None:   # say that it is over
            log.warning("the store is writable again; wrote the %d events held", len(self.pending))
        self.store_error = None
        self.pending.clear()
        self._urgent_pending = False
        if new:
            self._alert(new)
        if self.builder.changes:     # resolved, reopened: committed with the batch above
            self.alerter.changes(self.writer.db, self.builder.changes)
            self.builder.changes = []

    def _alert(self, incident_ids: list[int]) -> None:
        sent = self.alerter.alert(self.writer.db, incident_ids)
        if not sent:
            return
        try:
            incident_rows.mark_alerted(self.writer.db, sent, now_ns())
        except sqlite3.Error as exc:
            log.warning("cannot record that alerts were sent: %s", exc)

    def counters(self) -> dict[str, int]:
        return {**self.subscriber.counters, "written": self.written,
                "rejected": self.writer.rejected,
                "pending": len(self.pending),
                "dropped_store_unavailable": self.dropped_store_unavailable,
                "decide_errors": self.decide_errors, **self.builder.counters(),
                "klog_liveness_failures": self.klog_liveness.failures,
                "alerts_sent": self.alerter.sent, "alerts_failed": self.alerter.failed,
                "alert_changes_sent": self.alerter.changes_sent,
                **self.stall_watch.counters()}

    def _write_health(self) -> None:
        state = "failed" if self.store_error else "ok"
        try:
            with self.writer.db.atomic():
                self.writer.record_health("correlator", state, self.store_error or "",
                                          self.counters(), now_ns())
                self.writer.record_health("store", *self.maintenance.health(), now_ns())
            self.stall_watch.check(self.writer.db)
        except sqlite3.Error:
            pass   # already reported through store_error

    @staticmethod
    def _holds_urgent(envelopes: list[Envelope]) -> bool:
        """Whether one of the events may open an incident (most batches hold none of the
        kinds that may: their kinds are looked at first, in one pass)."""
        if MAY_OPEN_KINDS.isdisjoint([e.event.kind for e in envelopes]):
            return False
        return any(may_open_incident(e.event) for e in envelopes
                   if e.event.kind in MAY_OPEN_KINDS)

    def _urgent_flush_at(self) -> float | None:
        """When the pending batch must be written for an urgent event in it, or None."""
        if not self._urgent_pending:
            return None
        return self._last_decide + URGENT_FLUSH_GAP

    def _sleep_for(self, now: float, batch_started: float | None, next_chore: float) -> float:
        """How long the bus may be waited on: until the first thing due (the pending batch's
        write, an urgent write, the decide stage's beat, health or maintenance), at most
        MAX_SLEEP for a stop. An idle correlator wakes for its beats and its events only."""
        due = [next_chore]
        if self.pending:      # the batch's write runs the decide stage too
            due.append((batch_started or now) + self.flush_interval)
        else:
            due.append(self._last_decide + DECIDE_EVERY)
        urgent_at = self._urgent_flush_at()
        if urgent_at is not None:
            due.append(urgent_at)
        return max(0.0, min(min(due) - now, MAX_SLEEP))

    def run(self, stop: threading.Event) -> None:
        batch_started = None
        next_health = next_maintenance = 0.0
        while not stop.is_set():
            timeout = self._sleep_for(time.monotonic(), batch_started,
                                      min(next_health, next_maintenance))
            envelopes = self.subscriber.receive_many(timeout,
                                                     self.batch_size - len(self.pending))
            now = time.monotonic()
            if envelopes:
                self.pending += envelopes
                batch_started = batch_started or now
                if not self._urgent_pending:
                    self._urgent_pending = self._holds_urgent(envelopes)
            urgent_at = self._urgent_flush_at()
            if self.pending and (len(self.pending) >= self.batch_size
                                 or now - (batch_started or now) >= self.flush_interval
                                 or (urgent_at is not None and now >= urgent_at)):
                self.flush()
                batch_started = None if not self.pending else now
            elif not self.pending and now - self._last_decide >= DECIDE_EVERY:
                self.flush()       # no events: stalls and settling chains still move on
            if now >= next_health:
                self._write_health()
                next_health = now + HEALTH_EVERY
            if now >= next_maintenance and not self.store_error:
                more = self.maintenance.step()   # a few ms of rollups/retention
                next_maintenance = now if more else now + self.maintenance.interval
        # Drain what the sources sent before they stopped, within a bounded time: a stop must
        # not wait on a backlog. Sources re-send their state or resume from a stored cursor.
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline:
            envelopes = self.subscriber.receive_many(0, self.batch_size - len(self.pending))
            if not envelopes:
                break
            self.pending += envelopes
            if len(self.pending) >= self.batch_size:
                self.flush()
        else:
            log.warning("stopping with events still queued on the bus (not written)")
        self.flush()
        self._write_health()
