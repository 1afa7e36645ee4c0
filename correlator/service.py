"""Correlator service loop: bus -> batches -> store, with its own and the bus's health.

Threads: one, the caller's. It owns the store's only writing connection. Shutdown:
``stop`` is set, the loop ends, the last batch is written, the socket closes.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time

from sqlite_utils import Database

from gpuwhy.bus import Subscriber
from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.events import Envelope
from gpuwhy.store.writer import StoreWriter

log = logging.getLogger(__name__)

MAX_PENDING = 100_000   # events held while the store cannot be written
HEALTH_EVERY = 2.0
DRAIN_SECONDS = 1.0


class Correlator:
    """Receives events and writes them in batches; ``run(stop)`` until stopped."""

    def __init__(self, config: Config, db: Database, subscriber: Subscriber):
        self.batch_size: int = config["correlator.batch_size"]
        self.flush_interval: float = config["correlator.flush_interval"]
        self.subscriber = subscriber
        self.writer = StoreWriter(db)
        self.pending: list[Envelope] = []
        self.written = 0
        self.dropped_store_unavailable = 0
        self.store_error: str | None = None

    def flush(self) -> None:
        if not self.pending:
            return
        try:
            self.written += self.writer.write_batch(self.pending)
        except sqlite3.Error as exc:
            if self.store_error is None:
                log.error("cannot write the store, holding events: %s", exc)
            self.store_error = str(exc)
            overflow = len(self.pending) - MAX_PENDING
            if overflow > 0:
                self.dropped_store_unavailable += overflow
                del self.pending[:overflow]
            return
        self.store_error = None
        self.pending.clear()

    def counters(self) -> dict[str, int]:
        return {**self.subscriber.counters, "written": self.written,
                "rejected": self.writer.rejected,
                "pending": len(self.pending),
                "dropped_store_unavailable": self.dropped_store_unavailable}

    def _write_health(self) -> None:
        state = "failed" if self.store_error else "ok"
        try:
            with self.writer.db.atomic():
                self.writer.record_health("correlator", state, self.store_error or "",
                                          self.counters(), now_ns())
        except sqlite3.Error:
            pass   # already reported through store_error

    def run(self, stop: threading.Event) -> None:
        batch_started = None
        next_health = 0.0
        while not stop.is_set():
            envelope = self.subscriber.receive(timeout=min(self.flush_interval, 0.2))
            now = time.monotonic()
            if envelope is not None:
                self.pending.append(envelope)
                batch_started = batch_started or now
            if self.pending and (len(self.pending) >= self.batch_size
                                 or now - (batch_started or now) >= self.flush_interval):
                self.flush()
                batch_started = None if not self.pending else now
            if now >= next_health:
                self._write_health()
                next_health = now + HEALTH_EVERY
        # Drain what the sources sent before they stopped, within a bounded time: a stop must
        # not wait on a backlog. Sources re-send their state or resume from a stored cursor.
        deadline = time.monotonic() + DRAIN_SECONDS
        while time.monotonic() < deadline:
            envelope = self.subscriber.receive(timeout=0)
            if envelope is None:
                break
            self.pending.append(envelope)
            if len(self.pending) >= self.batch_size:
                self.flush()
        else:
            log.warning("stopping with events still queued on the bus (not written)")
        self.flush()
        self._write_health()
