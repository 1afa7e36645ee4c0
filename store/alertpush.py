"""The Alertmanager pusher's record: its feed cursor and each incident it keeps sending.

``feed_cursors`` holds the last incident-feed cursor (store/feed.py) the pusher has taken in;
``alertmanager_alerts`` a row per incident it sends: the label set it was first sent with
(JSON; never changed afterwards, since Alertmanager tells alerts apart by their labels alone),
when it started (its opening or reopening) and ended (NULL while firing), how many firing
sends went out, how many resolved sends are still owed, and when it was last sent (wall
clock, ns). The pusher takes in changes and moves the cursor in one transaction, so a
restart resumes exactly where it stopped: nothing taken in twice, nothing skipped, and a
resolve that was taken in is still owed until it has been sent.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from sqlite_utils import Database

from gpuwhy.store.feed import latest_cursor

Row = dict[str, Any]
PUSHER = "alertmanager"      # its name in feed_cursors


def cursor(db: Database, name: str = PUSHER) -> int | None:
    """The reader's last cursor, None when it never read."""
    row = db.execute("select cursor from feed_cursors where name = ?", [name]).fetchone()
    return None if row is None else int(row[0])


def set_cursor(db: Database, value: int, ts: int, name: str = PUSHER) -> None:
    db.table("feed_cursors").upsert({"name": name, "cursor": value, "updated_at": ts}, pk="name")


def tracked(db: Database) -> dict[int, Row]:
    """Every incident being sent, by id, its labels decoded."""
    rows = db.execute_returning_dicts("select * from alertmanager_alerts order by incident_id")
    return {r["incident_id"]: {**r, "labels": json.loads(r["labels"])} for r in rows}


def track(db: Database, incident_id: int, labels: dict[str, str], starts_at: int,
          ts: int) -> None:
    """Start sending an incident with this label set (kept if it is already sent)."""
    db.execute("insert or ignore into alertmanager_alerts (incident_id, labels, starts_at, "
               "fired, resolved_left, updated_at) values (?, ?, ?, 0, 0, ?)",
               [incident_id, json.dumps(labels, sort_keys=True), starts_at, ts])


def mark_ended(db: Database, incident_id: int, ends_at: int, resolved_sends: int,
               ts: int) -> None:
    """The incident was resolved: owe ``resolved_sends`` resolved sends, the first now."""
    db.execute("update alertmanager_alerts set ends_at = max(?, starts_at), resolved_left = ?, "
               "last_sent = null, updated_at = ? where incident_id = ?",
               [ends_at, resolved_sends, ts, incident_id])


def mark_restarted(db: Database, incident_id: int, starts_at: int, ts: int) -> None:
    """The incident was reopened: firing again from ``starts_at``, sent now."""
    db.execute("update alertmanager_alerts set ends_at = null, resolved_left = 0, "
               "starts_at = ?, last_sent = null, updated_at = ? where incident_id = ?",
               [starts_at, ts, incident_id])


def due(db: Database, now: int, resend_ns: int, limit: int = 1000) -> list[Row]:
    """The alerts to send now: never sent, last sent ``resend_ns`` ago or more, or resolved
    and owed a resolved send that was not sent yet since the resolve."""
    rows = db.execute_returning_dicts(
        "select * from alertmanager_alerts where last_sent is null or last_sent <= ? "
        "order by incident_id limit ?", [now - resend_ns, limit])
    return [{**r, "labels": json.loads(r["labels"])} for r in rows]


def record_sent(db: Database, firing: list[int], resolved: list[int], now: int) -> int:
    """Alertmanager took these sends; rows owed nothing more are dropped. Returns how many."""
    for incident_id in firing:
        # one resolved before its first send was sent firing once: its resolve goes next
        db.execute("update alertmanager_alerts set fired = fired + 1, last_sent = case when "
                   "ends_at is null then ? end, updated_at = ? where incident_id = ?",
                   [now, now, incident_id])
    for incident_id in resolved:
        db.execute("update alertmanager_alerts set resolved_left = resolved_left - 1, "
                   "last_sent = ?, updated_at = ? where incident_id = ?",
                   [now, now, incident_id])
    return db.execute("delete from alertmanager_alerts where ends_at is not null and "
                      "fired > 0 and resolved_left <= 0").rowcount


def figures(db: Database) -> dict[str, int]:
    """For /metrics and status: alerts firing and resolving, and how many feed changes the
    pusher has still to take in (0 when it keeps up; -1 when it never ran)."""
    firing, resolving = db.execute(
        "select count(*) filter (where ends_at is null), count(*) filter (where ends_at is "
        "not null) from alertmanager_alerts").fetchone() \
        if db["alertmanager_alerts"].exists() else (0, 0)
    at = cursor(db) if db["feed_cursors"].exists() else None
    return {"firing": firing, "resolving": resolving,
            "behind": -1 if at is None else max(0, latest_cursor(db) - at)}


@contextlib.contextmanager
def write_transaction(db: Database) -> Iterator[Database]:
    """One transaction that takes the write lock first (BEGIN IMMEDIATE): its reads cannot
    go stale before its writes, which a deferred one's can under WAL beside another writer
    (the correlator), failing with SQLITE_BUSY at once instead of waiting."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.conn.rollback()
        raise
    db.execute("COMMIT")
