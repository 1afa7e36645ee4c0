"""Read incidents, their chains and the reset history from the store (for the CLI and web)."""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database

from gpuwhy.correlator import bindings


def _rows(db: Database, sql: str, params: list) -> list[dict[str, Any]]:
    cursor = db.execute(sql, params)
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def list_incidents(db: Database, *, gpu: str | None = None, since: int | None = None,
                   kind: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """Incidents, newest first; ``gpu`` matches the id, UUID or PCI address."""
    where, params = [], []
    if gpu:
        gpu_id = bindings.resolve(db, uuid=gpu if gpu.startswith("GPU-") else None,
                                  pci=gpu if ":" in gpu and not gpu.startswith("GPU-") else None)
        where.append("(gpu_id = ? or gpu_id = ?)")
        params += [gpu, gpu_id or gpu]
    if since is not None:
        where.append("last_seen >= ?")
        params.append(since)
    if kind:
        where.append("kind = ?")
        params.append(kind)
    sql = ("select id, kind, severity, state, gpu_id, pid, start_time, title, summary, "
           "opened_at, closed_at, last_seen, count from incidents"
           + (" where " + " and ".join(where) if where else "")
           + " order by opened_at desc, id desc limit ?")
    return _rows(db, sql, [*params, limit])


def incident_detail(db: Database, incident_id: int) -> dict[str, Any] | None:
    """One incident with its chain (``{kind, ts, summary, evidence, confidence, pid}``)."""
    found = _rows(db, "select * from incidents where id = ?", [incident_id])
    if not found:
        return None
    row = found[0]
    links = _rows(db, "select kind, ts, summary, evidence, confidence, pid, start_time, gpu_id "
                      "from incident_links where incident_id = ? order by seq", [incident_id])
    for link in links:
        link["evidence"] = json.loads(link["evidence"] or "{}")
    processes = _rows(db, "select i.pid, i.start_time, i.role, p.comm from incident_processes i "
                          "left join processes p on p.pid = i.pid and "
                          "p.start_time = i.start_time where incident_id = ? "
                          "order by i.pid", [incident_id])
    pci, uuid = bindings.pci_and_uuid(db, row["gpu_id"])
    return {"id": row["id"], "kind": row["kind"], "severity": row["severity"],
            "state": row["state"], "title": row["title"], "summary": row["summary"],
            "gpu": row["gpu_id"], "gpu_uuid": uuid, "gpu_pci": pci,
            "started": row["opened_at"], "ended": row["closed_at"],
            "last_seen": row["last_seen"], "count": row["count"],
            "confidence": row["confidence"],
            "details": json.loads(row["details"] or "{}"),
            "processes": processes, "chain": links}


def reset_history(db: Database, gpu: str | None = None) -> list[dict[str, Any]]:
    """Every GPU reset, newest first: when, by what/whom, which processes were hit."""
    history = []
    for incident in list_incidents(db, gpu=gpu, kind="gpu_reset", limit=1000):
        detail = incident_detail(db, incident["id"])
        chain = detail["chain"]
        by = [link for link in chain if link["kind"] in ("cron_job", "timer", "operator_command",
                                                          "command", "driver_call")]
        hit = [link for link in chain if link["kind"] in ("process_stall", "process_exit",
                                                           "process")]
        history.append({"id": incident["id"], "gpu": incident["gpu_id"],
                        "at": incident["opened_at"], "seen_by": detail["details"].get("seen_by"),
                        "by": [f"{link['kind']}: {link['summary']}" for link in by],
                        "hit": [{"pid": link["pid"], "start_time": link["start_time"],
                                 "what": link["kind"], "summary": link["summary"]}
                                for link in hit]})
    return history
