"""Check baselines kept in the store by name (table ``baselines``, migration m901): save one,
read one back, list them, delete one. What a baseline's figures are, and how a new run
compares, is ``gpuwhy.app.checks.baseline``'s."""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database

# Columns kept as JSON text, decoded as a baseline is read back.
JSON_COLUMNS = ("environment", "figures", "watched")


def save(db: Database, name: str, record: dict[str, Any]) -> None:
    """Keep ``record`` as the baseline ``name``, replacing one of that name; dicts and lists
    are stored as JSON text."""
    with db.conn:
        db.table("baselines").upsert({"name": name, **{
            k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in record.items()}},
            pk="name")


def load(db: Database, name: str) -> dict[str, Any] | None:
    """The baseline ``name``, its JSON columns decoded; None when there is none (or no
    baseline was ever saved in this store)."""
    if not db["baselines"].exists():
        return None
    rows = list(db["baselines"].rows_where("name = ?", [name]))
    if not rows:
        return None
    row = rows[0]
    for key in JSON_COLUMNS:
        row[key] = json.loads(row[key] or "{}")
    return row


def listing(db: Database) -> list[dict[str, Any]]:
    """Every baseline by name: name, created_at, seconds, target, gpu_id."""
    if not db["baselines"].exists():
        return []
    return list(db["baselines"].rows_where(select="name, created_at, seconds, target, gpu_id",
                                           order_by="name"))


def delete(db: Database, name: str) -> bool:
    """Delete the baseline ``name``; whether there was one."""
    with db.conn:
        return db.execute("delete from baselines where name = ?", [name]).rowcount > 0
