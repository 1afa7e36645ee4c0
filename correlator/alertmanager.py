"""Open incidents pushed to an Alertmanager (``POST /api/v2/alerts``), resolved when they are.

An output beside the journal alerts (:mod:`gpuwhy.correlator.alerts`), on a thread of its
own with a store connection of its own, so an Alertmanager that is slow or down never holds
up the correlator. Each step takes in the incident feed's new changes (store/feed.py) and
moves its cursor in one transaction (store/alertpush.py), then sends what is due:

- an incident that is not an effect of another starts firing when it opens (or reopens);
  it is sent at once, then every ``alertmanager.resend_seconds`` while it is active, with
  ``endsAt`` four resend intervals ahead (Prometheus' convention: if gpuwhy stops, the alert
  ends by itself rather than firing forever);
- when it is resolved it is sent with ``endsAt`` = when it was resolved, RESOLVED_SENDS times
  (at once, then each resend interval), then forgotten. One never sent firing is sent firing
  once first, so Alertmanager has seen it.

Its labels (``alertname``, ``incident``, ``kind``, ``severity``, ``host``, ``gpu``, ``rule``)
are stored when it is first taken in and sent unchanged ever after: Alertmanager identifies
an alert by its label set, so a re-send, or a send repeated after a restart, is the same
alert and notifies nobody again; a severity that worsens shows in the annotations only.
A failed send (refused connection, timeout, an HTTP error) is logged once per episode, kept
owed, and retried with exponential backoff up to the resend interval; the pusher's health
row (``alertmanager``) says ``down`` meanwhile, which `gpuwhy status` reports.
"""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from sqlite_utils import Database

from gpuwhy import lifecycle as lc
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.config import Config
from gpuwhy.journal import one_line
from gpuwhy.stalls import HEALTH_PERIOD_S
from gpuwhy.store import alertpush, feed
from gpuwhy.store.writer import StoreWriter
from gpuwhy.text import rfc3339

log = logging.getLogger(__name__)

SOURCE = "alertmanager"       # the pusher's source_health row
RESOLVED_SENDS = 3
TAKE_MAX = 500                # feed changes taken in per transaction
SEND_MAX = 500                # alerts per POST
STEP_EVERY = 1.0              # seconds between steps: how soon a new incident goes out
HEALTH_EVERY = HEALTH_PERIOD_S[SOURCE]
BACKOFF_FIRST = 1.0
ENDS_AFTER_RESENDS = 4
ANNOTATION_MAX = 1024         # characters of one annotation (titles carry process names)

# (url, JSON body bytes, timeout s) -> None, raising OSError/urllib.error.URLError on failure
Post = Callable[[str, bytes, float], None]


def alerts_url(base: str) -> str:
    """The v2 alerts endpoint under an Alertmanager's base URL (or the endpoint itself)."""
    base = base.rstrip("/")
    return base if base.endswith("/api/v2/alerts") else f"{base}/api/v2/alerts"


def alert_name(kind: str) -> str:
    """``GpuwhyIncident`` and the incident kind in CamelCase: ``xid`` -> GpuwhyIncidentXid.
    Apart from the Prometheus rules' names (GpuwhyXid, ...), which alert on /metrics."""
    return "GpuwhyIncident" + "".join(part.capitalize() for part in kind.split("_") if part)


def labels_for(incident: dict[str, Any], host: str) -> dict[str, str]:
    """The incident's label set, bounded: one alert per incident, named by kind (and rule)."""
    labels = {"alertname": alert_name(incident["kind"]), "incident": str(incident["id"]),
              "kind": incident["kind"], "severity": incident["severity"] or "", "host": host}
    gpu = incident["gpu_uuid"] or incident["gpu"]
    if gpu:
        labels["gpu"] = gpu
    if incident.get("rule_id"):
        labels["rule"] = str(incident["rule_id"])
    return labels


def annotations_for(incident: dict[str, Any], base_url: str) -> dict[str, str]:
    """What a person reads: title, summary with the state now, the incident's page."""
    state = incident["state"] or "?"
    if incident.get("resolution"):
        state += f" ({incident['resolution']})"
    return {
        "summary": one_line(incident["title"] or incident["kind"], ANNOTATION_MAX),
        "description": one_line(f"{incident['summary'] or ''} [{incident['severity']}, "
                                f"{state}]", ANNOTATION_MAX),
        "incident_url": f"{base_url.rstrip('/')}/incidents/{quote(str(incident['id']))}",
    }


def urllib_post(url: str, body: bytes, timeout: float) -> None:
    """POST ``body`` as JSON; any answer but 2xx raises (urllib.error.HTTPError)."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s) only: config checks the scheme
        response.read(65536)


def _why(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        try:
            body = exc.read(300).decode("utf-8", "replace")
        except OSError:
            body = ""
        return one_line(f"HTTP {exc.code} {exc.reason}: {body}", 400)
    reason = getattr(exc, "reason", None) or exc
    return one_line(f"{type(exc).__name__}: {reason}", 400)


class AlertmanagerPusher:
    """Takes in the incident feed and sends what is due; ``run(stop)`` until stopped."""

    def __init__(self, config: Config, db: Database, post: Post | None = None,
                 wall: Callable[[], int] = now_ns,
                 monotonic: Callable[[], float] = time.monotonic):
        self.url = alerts_url(config["alertmanager.url"])
        self.resend_ns = int(config["alertmanager.resend_seconds"] * NS_PER_SECOND)
        self.timeout = float(config["alertmanager.timeout"])
        self.base_url = config["correlator.url"]
        self.host = config["web.hostname"] or socket.gethostname()
        self.db = db
        self.health = StoreWriter(db)
        self.post = post or urllib_post
        self.wall = wall
        self.monotonic = monotonic
        self.taken_in = 0         # feed changes
        self.posts = 0
        self.posts_failed = 0
        self.alerts_sent = 0      # alerts in successful posts, firing and resolved
        self.resolved_sent = 0
        self.store_errors = 0
        self.failing: str | None = None     # why the last send failed, while it does
        self._backoff = 0.0
        self._next_send = 0.0
        self._next_health = 0.0

    # --- taking in the feed ----------------------------------------------------------------
    def take_in(self) -> int:
        """Apply the feed's changes after the stored cursor, then move it, in one
        transaction; returns how many changes. The first run starts from the active
        incidents and the newest cursor: it does not replay the store's history."""
        db, now = self.db, self.wall()
        with alertpush.write_transaction(db):
            at = alertpush.cursor(db)
            if at is None:
                start = feed.latest_cursor(db)
                for incident in feed.active_incidents(db):
                    alertpush.track(db, incident["id"], labels_for(incident, self.host),
                                    min(incident["opened_at"] or now, now), now)
                alertpush.set_cursor(db, start, now)
                return 0
            changes = feed.incident_changes(db, at, TAKE_MAX)
            if not changes:
                return 0
            known = alertpush.tracked(db)
            for change in changes:
                self._apply(change, known, now)
            alertpush.set_cursor(db, changes[-1]["cursor"], now)
        self.taken_in += len(changes)
        return len(changes)

    def _apply(self, change: dict[str, Any], known: dict[int, dict], now: int) -> None:
        incident, action = change["incident"], change["action"]
        incident_id = incident["id"]
        if incident_id not in known:
            # an effect is its cause's link, alerted with it (as in the journal)
            if incident["cause_id"] is not None or action not in (lc.OPENED, lc.REOPENED):
                return
            labels = labels_for(incident, self.host)
            alertpush.track(self.db, incident_id, labels, min(change["ts"], now), now)
            known[incident_id] = {"labels": labels, "ends_at": None}
        row = known[incident_id]
        if action == lc.RESOLVE:
            alertpush.mark_ended(self.db, incident_id, change["ts"], RESOLVED_SENDS, now)
            row["ends_at"] = change["ts"]
        elif action == lc.REOPENED and row["ends_at"] is not None:
            alertpush.mark_restarted(self.db, incident_id, min(change["ts"], now), now)
            row["ends_at"] = None

    # --- sending ---------------------------------------------------------------------------
    def _alert(self, row: dict[str, Any], now: int) -> tuple[dict[str, Any], bool]:
        """The v2 alert of a tracked row, and whether it is a resolved send."""
        incident = feed.incident(self.db, row["incident_id"])
        resolved = row["ends_at"] is not None and row["fired"] > 0
        # resolved means ended by now: a resolve dated by a clock ahead of this one would
        # otherwise keep the alert firing in Alertmanager until then
        ends = min(row["ends_at"], now) if resolved else \
            now + ENDS_AFTER_RESENDS * max(self.resend_ns, NS_PER_SECOND)
        alert = {"labels": row["labels"],
                 "annotations": annotations_for(incident, self.base_url) if incident else {},
                 "startsAt": rfc3339(row["starts_at"]), "endsAt": rfc3339(ends),
                 "generatorURL": f"{self.base_url.rstrip('/')}/incidents/"
                                 f"{row['incident_id']}"}
        return alert, resolved

    def send_due(self) -> int:
        """Send every due alert in one POST; returns how many went (0: none due or failed)."""
        now = self.wall()
        rows = alertpush.due(self.db, now, self.resend_ns, SEND_MAX)
        if not rows:
            return 0
        alerts: list[dict] = []
        firing: list[int] = []
        resolved: list[int] = []
        for row in rows:
            alert, is_resolved = self._alert(row, now)
            alerts.append(alert)
            (resolved if is_resolved else firing).append(row["incident_id"])
        body = json.dumps(alerts).encode()
        try:
            self.post(self.url, body, self.timeout)
        except (OSError, ValueError, urllib.error.URLError) as exc:
            self._failed(_why(exc))
            return 0
        self.posts += 1
        if self.failing is not None:
            log.warning("Alertmanager at %s takes alerts again (after %s)", self.url,
                        self.failing)
        self.failing, self._backoff = None, 0.0
        with alertpush.write_transaction(self.db):
            alertpush.record_sent(self.db, firing, resolved, self.wall())
        self.alerts_sent += len(alerts)
        self.resolved_sent += len(resolved)
        return len(alerts)

    def _failed(self, why: str) -> None:
        self.posts_failed += 1
        if self.failing is None:      # once per episode; the health row keeps the latest
            log.warning("cannot push incidents to Alertmanager at %s: %s; retrying with "
                        "backoff (they stay owed)", self.url, why)
        self.failing = why
        cap = max(BACKOFF_FIRST, self.resend_ns / NS_PER_SECOND)
        self._backoff = min(cap, self._backoff * 2 if self._backoff else BACKOFF_FIRST)
        self._next_send = self.monotonic() + self._backoff

    # --- the loop --------------------------------------------------------------------------
    def step(self) -> None:
        """One round: take in the feed, send what is due (unless backing off), report."""
        try:
            self.take_in()
            if self.monotonic() >= self._next_send:
                self.send_due()
        except sqlite3.Error as exc:
            self.store_errors += 1
            if self.store_errors == 1 or self.store_errors % 100 == 0:
                log.warning("the Alertmanager pusher cannot use the store: %s", exc)
        if self.monotonic() >= self._next_health:
            self._write_health()
            self._next_health = self.monotonic() + HEALTH_EVERY

    def counters(self) -> dict[str, int]:
        return {"changes_taken_in": self.taken_in, "posts": self.posts,
                "posts_failed": self.posts_failed, "alerts_sent": self.alerts_sent,
                "resolved_sent": self.resolved_sent, "store_errors": self.store_errors}

    def _write_health(self) -> None:
        state = "down" if self.failing else "ok"
        detail = f"{self.url}: {self.failing}" if self.failing else self.url
        try:
            with alertpush.write_transaction(self.db):
                counters = {**self.counters(), **alertpush.figures(self.db)}
                self.health.record_health(SOURCE, state, detail, counters, self.wall())
        except sqlite3.Error:
            pass       # counted in store_errors by the step that met it

    def run(self, stop: threading.Event) -> None:
        log.info("pushing incidents to Alertmanager at %s", self.url)
        while not stop.is_set():
            self.step()
            stop.wait(STEP_EVERY)
        self._write_health()
