"""The web view's reads: GPUs with their latest sample, bound processes, a process's calls,
events and findings, rules' last findings. Incidents, chains and resets are read by
``gpuwhy.correlator.report`` (one definition, shared with the CLI); samples through the
store's views (``gpu_samples``, ``gpu_reset_history``)."""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Database

from gpuwhy.identity import ProcessKey

Row = dict[str, Any]
_CONTAINER = "coalesce(p.container_id, p.pod_uid, p.unit)"


def rows(db: Database, sql: str, params: list | tuple = ()) -> list[Row]:
    cursor = db.execute(sql, list(params))
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def gpus(db: Database) -> list[Row]:
    return rows(db, "select id, uuid, pci_bus_id, gpu_index, minor, model, driver_version, "
                    "simulated, source, state, state_since, first_seen, last_seen from gpus "
                    "order by gpu_index is null, gpu_index, id")


def gpu(db: Database, gpu_id: str) -> Row | None:
    found = [g for g in gpus(db) if gpu_id in (g["id"], g["uuid"])]
    return found[0] if found else None


def latest_sample(db: Database, gpu_id: str) -> Row | None:
    found = rows(db, "select * from gpu_samples where gpu_id = ? and instance = '' "
                     "order by ts desc limit 1", [gpu_id])
    return found[0] if found else None


def bound_processes(db: Database, gpu_id: str, since: int | None = None,
                    until: int | None = None) -> list[Row]:
    """Bindings of processes to the GPU: all current ones, or those overlapping a window."""
    where = ("b.until is null and p.exited_at is null" if since is None else
             "b.since < ? and coalesce(b.until, p.exited_at, b.since) >= ?")
    params = [] if since is None else [until, since]
    return rows(db, f"select b.pid, b.start_time, b.since, coalesce(b.until, p.exited_at) "
                    f"as until, b.evidence, p.comm, p.cmdline, p.tag, {_CONTAINER} as container "
                    f"from gpu_bindings b left join processes p on p.pid = b.pid and "
                    f"p.start_time = b.start_time where b.gpu_id = ? and {where} "
                    f"order by b.since", [gpu_id, *params])


def open_incidents(db: Database, gpu_id: str | None = None) -> list[Row]:
    where = "state = 'open'" + (" and gpu_id = ?" if gpu_id else "")
    return rows(db, f"select id, kind, severity, title, opened_at, last_seen from incidents "
                    f"where {where} order by opened_at desc limit 20", [gpu_id] if gpu_id else [])


def overview(db: Database) -> list[Row]:
    """One card per GPU: identity, latest sample, bound processes, open incidents."""
    return [{**g, "sample": latest_sample(db, g["id"]),
             "processes": bound_processes(db, g["id"]),
             "incidents": open_incidents(db, g["id"])} for g in gpus(db)]


def gpu_events(db: Database, gpu_id: str, since: int, until: int) -> Row:
    """What to mark on a GPU's time axis: its incidents, resets and bound processes."""
    incidents = rows(db, "select id, kind, severity, title, opened_at, closed_at from "
                         "incidents where gpu_id = ? and opened_at < ? and "
                         "coalesce(closed_at, last_seen, opened_at) >= ? order by opened_at",
                     [gpu_id, until, since])
    resets = rows(db, "select ts, what, source, pid, start_time, comm, detail from "
                      "gpu_reset_history where gpu_id = ? and ts between ? and ? order by ts",
                  [gpu_id, since, until])
    return {"incidents": incidents, "resets": resets,
            "lanes": bound_processes(db, gpu_id, since, until)}


def process(db: Database, key: ProcessKey) -> Row | None:
    found = rows(db, f"select p.*, {_CONTAINER} as container from processes p "
                     f"where pid = ? and start_time = ?", [key.pid, key.start_time])
    return found[0] if found else None


def process_last_ts(db: Database, key: ProcessKey) -> int | None:
    """The last second the correlator has for the process (ns), live ones included."""
    row = db.execute("select max(second) from process_seconds where pid = ? and start_time = ?",
                     [key.pid, key.start_time]).fetchone()
    return row[0] * 1_000_000_000 if row and row[0] is not None else None


def process_start(db: Database, key: ProcessKey) -> int | None:
    row = db.execute("select first_seen from processes where pid = ? and start_time = ?",
                     [key.pid, key.start_time]).fetchone()
    return row[0] if row else None


def process_end(db: Database, key: ProcessKey) -> int | None:
    """When it exited, or the last time anything was heard of it while it lives."""
    row = db.execute("select exited_at, last_seen from processes where pid = ? and "
                     "start_time = ?", [key.pid, key.start_time]).fetchone()
    if not row:
        return None
    return row[0] or max(row[1] or 0, process_last_ts(db, key) or 0) or None


def process_calls(db: Database, key: ProcessKey) -> list[Row]:
    """Driver calls by operation: count, errors, mean and max latency, rate over the life."""
    seconds = max(((process_end(db, key) or 0) - (process_start(db, key) or 0)) / 1e9, 1.0)
    calls = rows(db, "select coalesce(sub_name, op) as operation, op, device, sum(count) as "
                     "count, sum(errors) as errors, sum(latency_sum_ns) as latency_sum_ns, "
                     "max(latency_max_ns) as latency_max_ns from driver_call_stats where "
                     "pid = ? and start_time = ? group by 1, 2, 3 order by count desc",
                 [key.pid, key.start_time])
    for call in calls:
        call["per_second"] = round(call["count"] / seconds, 3)
        call["mean_latency_us"] = round(call["latency_sum_ns"] / call["count"] / 1000, 1) \
            if call["count"] else None
        call["max_latency_us"] = round((call["latency_max_ns"] or 0) / 1000, 1)
    return calls


def process_events(db: Database, key: ProcessKey, limit: int = 500) -> list[Row]:
    """Lifecycle events, notable or failed driver calls and kernel-log lines naming the pid
    during the process's life, oldest first."""
    life = process(db, key) or {}
    end = life.get("exited_at") or 2**62
    events = rows(db, "select ts, kind as what, body as detail from events where pid = ? and "
                      "start_time = ? and topic in ('proc', 'fd') order by ts limit ?",
                  [key.pid, key.start_time, limit])
    events += rows(db, "select ts, 'driver call ' || coalesce(sub_name, op) as what, "
                       "coalesce(status_name, '') || ' ' || coalesce(reasons, '') as detail "
                       "from driver_calls where pid = ? and start_time = ? order by ts limit ?",
                   [key.pid, key.start_time, limit])
    events += rows(db, "select ts, 'kernel log ' || kind || coalesce(' ' || xid, '') as what, "
                       "message as detail from kernel_log where pid = ? and ts between ? and ? "
                       "order by ts limit ?", [key.pid, key.start_time, end, limit])
    return sorted(events, key=lambda e: e["ts"])[:limit]


def _decode_finding(row: Row) -> Row:
    for name in ("evidence", "fixes"):
        try:
            row[name] = json.loads(row[name] or ("{}" if name == "evidence" else "[]"))
        except ValueError:
            pass   # shown as the text it is
    return row


def findings(db: Database, *, key: ProcessKey | None = None, rule_id: str | None = None,
             limit: int = 100) -> list[Row]:
    where, params = [], []
    if key is not None:
        where.append("pid = ? and start_time = ?")
        params += [key.pid, key.start_time]
    if rule_id is not None:
        where.append("rule_id = ?")
        params.append(rule_id)
    sql = ("select * from rule_findings" + (" where " + " and ".join(where) if where else "")
           + " order by last_ts desc limit ?")
    return [_decode_finding(r) for r in rows(db, sql, [*params, limit])]


def findings_by_rule(db: Database) -> dict[str, Row]:
    """Per rule: how many findings, how many firing, and the last one."""
    summary = {r["rule_id"]: r for r in rows(
        db, "select rule_id, count(*) as findings, sum(state = 'firing') as firing, "
            "max(last_ts) as last_ts from rule_findings group by rule_id")}
    for rule_id, row in summary.items():
        row["last"] = findings(db, rule_id=rule_id, limit=1)[0]
    return summary


def simulated(db: Database) -> bool:
    return bool(db.execute("select count(*) from gpus where simulated").fetchone()[0])
