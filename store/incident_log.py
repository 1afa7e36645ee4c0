"""An incident's row and log, written: a log row appended, the row marked resolved. The one
place both the operator's changes (incident_changes) and GPU health (health) write them."""

from __future__ import annotations

from typing import cast

from sqlite_utils import Database

from gpuwhy import lifecycle as lc


def log_change(db: Database, incident_id: int, action: str, ts: int, actor: str,
               resolution: str | None = None, text: str | None = None) -> int:
    """Append one row to the incident's log; returns its id. The caller changed the row."""
    state = db.execute("select state from incidents where id = ?", [incident_id]).fetchone()
    return cast(int, db.table("incident_log").insert({
        "incident_id": incident_id, "ts": ts, "action": action, "actor": actor,
        "state": state[0] if state else None, "resolution": resolution, "text": text,
    }).last_pk)       # the rowid of the row just inserted


def mark_resolved(db: Database, incident_id: int, how: str, ts: int) -> None:
    """Set the row resolved at ``ts`` (never before it opened or was last seen)."""
    db.execute("update incidents set state = ?, resolution = ?, "
               "closed_at = max(?, opened_at, coalesce(last_seen, opened_at)), "
               "updated_at = ? where id = ?", [lc.RESOLVED, how, ts, ts, incident_id])
