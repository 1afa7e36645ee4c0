"""The incident feed: every new incident and every change to one, after a cursor, in order.

The cursor is ``incident_log.id``. That column is ``INTEGER PRIMARY KEY AUTOINCREMENT``
(migration m110), so an id is never handed out twice, even after retention deleted the
newest rows, and SQLite's single writer commits rows in id order: a reader that asks for
the rows after the last id it saw never misses one committed later and never sees one twice.
Each row says what changed (``opened``, ``acknowledged``, ``resolved``, ``reopened``,
``note``, ``answered``: :mod:`gpuwhy.lifecycle`), the state it left the incident in, and
the incident as it is now. ``/api/incidents?since=``, ``gpuwhy incidents --after`` and the
Alertmanager pusher read it here.
"""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database

from gpuwhy.lifecycle import sql_active
from gpuwhy.store.queries import pci_and_uuid

Row = dict[str, Any]
FEED_MAX = 1000          # changes in one answer at most; the caller pages with the cursor

_INCIDENT_COLUMNS = ("i.kind, i.severity, i.state as incident_state, i.resolution as "
                     "incident_resolution, i.gpu_id, i.pid, i.start_time, i.title, i.summary, "
                     "i.opened_at, i.closed_at, i.last_seen, i.count, i.cause_id, i.details")


def latest_cursor(db: Database) -> int:
    """The newest cursor ever handed out (0 for an empty store): a poller holding a larger
    one has a cursor of another store (it was replaced) and should start again from 0."""
    row = db.execute("select seq from sqlite_sequence where name = 'incident_log'").fetchone() \
        if db["sqlite_sequence"].exists() else None
    if row is not None:
        return int(row[0])
    newest = db.execute("select max(id) from incident_log").fetchone() \
        if db["incident_log"].exists() else None
    return int(newest[0] or 0) if newest else 0


def feed_page(db: Database, since: int = 0, limit: int = FEED_MAX
              ) -> tuple[int, list[Row], bool]:
    """The newest cursor, the changes after ``since`` (as :func:`incident_changes`, at most
    ``limit``) and whether more follow them, read in one transaction, so that the newest
    cursor is never older than the page's last."""
    limit = max(1, min(int(limit), FEED_MAX))
    with db.conn:
        db.execute("begin")
        # one row past the page says whether more follow (past FEED_MAX too)
        changes = _changes(db, since, limit + 1)
        return latest_cursor(db), changes[:limit], len(changes) > limit


def _incident(db: Database, row: Row) -> Row:
    pci, uuid = pci_and_uuid(db, row["gpu_id"])
    details = json.loads(row["details"] or "{}")
    return {"id": row["incident_id"], "kind": row["kind"], "severity": row["severity"],
            "state": row["incident_state"], "resolution": row["incident_resolution"],
            "gpu": row["gpu_id"], "gpu_uuid": uuid, "gpu_pci": pci, "pid": row["pid"],
            "start_time": row["start_time"], "title": row["title"], "summary": row["summary"],
            "opened_at": row["opened_at"], "closed_at": row["closed_at"],
            "last_seen": row["last_seen"], "count": row["count"], "cause_id": row["cause_id"],
            "rule_id": details.get("rule_id") if isinstance(details, dict) else None}


def incident_changes(db: Database, since: int = 0, limit: int = FEED_MAX) -> list[Row]:
    """The changes after cursor ``since``, oldest first, at most ``limit`` (1 to FEED_MAX):
    ``{cursor, ts, action, actor, state, resolution, text, incident: {...}}``."""
    return _changes(db, since, max(1, min(int(limit), FEED_MAX)))


def _changes(db: Database, since: int, limit: int) -> list[Row]:
    if not db["incident_log"].exists():
        return []
    rows = db.execute_returning_dicts(
        f"select l.id as cursor, l.incident_id, l.ts, l.action, l.actor, l.state, "
        f"l.resolution, l.text, {_INCIDENT_COLUMNS} from incident_log l "
        f"join incidents i on i.id = l.incident_id where l.id > ? order by l.id limit ?",
        [int(since), limit])
    return [{"cursor": r["cursor"], "ts": r["ts"], "action": r["action"], "actor": r["actor"],
             "state": r["state"], "resolution": r["resolution"], "text": r["text"],
             "incident": _incident(db, r)} for r in rows]


def active_incidents(db: Database) -> list[Row]:
    """Every active incident that is not an effect of another, oldest first, shaped as a
    change's ``incident`` (where the Alertmanager pusher starts on a store it never read)."""
    rows = db.execute_returning_dicts(
        f"select i.id as incident_id, {_INCIDENT_COLUMNS} from incidents i "
        f"where {sql_active('i.state')} and i.cause_id is null order by i.id")
    return [_incident(db, r) for r in rows]


def incident(db: Database, incident_id: int) -> Row | None:
    """One incident, shaped as a change's ``incident``; None when there is none."""
    rows = db.execute_returning_dicts(
        f"select i.id as incident_id, {_INCIDENT_COLUMNS} from incidents i where i.id = ?",
        [incident_id])
    return _incident(db, rows[0]) if rows else None
