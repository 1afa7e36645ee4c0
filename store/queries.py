"""The store's one read API: what the web view, the CLI, reports and checks show.

GPUs (identity, latest sample, bound processes), processes (device fds, driver calls,
events), incidents with their chains, the reset history, rules' findings and sources'
health. Chart series are in :mod:`gpuwhy.store.series`, the rules' time-window reads in
:mod:`gpuwhy.store.streams`. Rows come as plain dicts (sqlite-utils'
``execute_returning_dicts``), or as tuples where the ``/metrics`` collector unpacks them on
every scrape; either way callers never see a cursor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, cast

from sqlite_utils import Database

from gpuwhy.clock import now_ns as _now_ns
from gpuwhy.events import ENGINE_NAMES, RuleFinding
from gpuwhy.gpu_health import is_live
from gpuwhy.identity import ProcessKey
from gpuwhy.lifecycle import sql_active
from gpuwhy.rules.answer import GpuFacts, Verdict, verdicts
from gpuwhy.rules.model import Rule

# GPU names are resolved in one place; the read API offers them under its own name too
from gpuwhy.store.gpu_identity import gpu_named, pci_and_uuid, resolve_gpu  # noqa: F401
from gpuwhy.store.rollups import DONE_MARK, get_mark

Row = dict[str, Any]
_CONTAINER = "coalesce(p.container_id, p.pod_uid, p.unit)"


# --- GPUs --------------------------------------------------------------------------------

def gpus(db: Database) -> list[Row]:
    """Every GPU: identity, source, the source's last state, and its health
    (gpuwhy/gpu_health.py: ``health``, since when, ``health_evidence`` as a dict, what
    clears it, and ``live``: whether its latest numbers are current)."""
    return [_with_health(row) for row in db.execute_returning_dicts(
        "select id, uuid, pci_bus_id, gpu_index, minor, model, driver_version, "
        "simulated, source, state, state_since, first_seen, last_seen, xid_before_start, "
        "xid_before_start_seen, coalesce(health, 'ok') as health, health_since, "
        "health_evidence, health_clears from gpus "
        "order by gpu_index is null, gpu_index, id")]


def gpu(db: Database, gpu_id: str) -> Row | None:
    found = [g for g in gpus(db) if gpu_id in (g["id"], g["uuid"])]
    return found[0] if found else None


def latest_sample(db: Database, gpu_id: str) -> Row | None:
    found = db.execute_returning_dicts(
        "select * from gpu_samples where gpu_id = ? and instance = '' "
        "order by ts desc limit 1", [gpu_id])
    return found[0] if found else None


def bound_processes(db: Database, gpu_id: str, since: int | None = None,
                    until: int | None = None) -> list[Row]:
    """Bindings of processes to the GPU: all current ones, or those overlapping a window."""
    where = ("b.until is null and p.exited_at is null" if since is None else
             "b.since < ? and coalesce(b.until, p.exited_at, b.since) >= ?")
    params = [] if since is None else [until, since]
    return db.execute_returning_dicts(
        f"select b.pid, b.start_time, b.since, coalesce(b.until, p.exited_at) "
        f"as until, b.evidence, p.comm, p.cmdline, p.tag, {_CONTAINER} as container "
        f"from gpu_bindings b left join processes p on p.pid = b.pid and "
        f"p.start_time = b.start_time where b.gpu_id = ? and {where} "
        f"order by b.since", [gpu_id, *params])


def open_incidents(db: Database, gpu_id: str | None = None) -> list[Row]:
    """Active incidents (open or acknowledged; effects are their causes' links)."""
    where = f"{sql_active()} and cause_id is null" + (" and gpu_id = ?" if gpu_id else "")
    return db.execute_returning_dicts(
        f"select id, kind, severity, state, title, opened_at, last_seen from incidents "
        f"where {where} order by opened_at desc limit 20", [gpu_id] if gpu_id else [])


def overview(db: Database) -> list[Row]:
    """One card per GPU: identity, latest sample, bound processes, open incidents."""
    return [{**g, "sample": latest_sample(db, g["id"]),
             "processes": bound_processes(db, g["id"]),
             "incidents": open_incidents(db, g["id"])} for g in gpus(db)]


def gpu_marks(db: Database, gpu_id: str, since: int, until: int) -> Row:
    """What to mark on a GPU's time axis: its incidents (not the effects of another) and
    resets. Resets are the view's ``reset`` rows only (gpuwhy/reset.py): the ones
    ``/resets`` lists, not the requests, the signs that one is needed or the GPU coming
    back."""
    incidents = db.execute_returning_dicts(
        "select id, kind, severity, title, opened_at, closed_at from "
        "incidents where gpu_id = ? and cause_id is null and opened_at < ? and "
        "coalesce(closed_at, last_seen, opened_at) >= ? order by opened_at",
        [gpu_id, until, since])
    resets = db.execute_returning_dicts(
        "select ts, what, source, pid, start_time, comm, detail from "
        "gpu_reset_history where gpu_id = ? and reset = 'reset' and ts between ? and ? "
        "order by ts",
        [gpu_id, since, until])
    return {"incidents": incidents, "resets": resets}


def gpu_events(db: Database, gpu_id: str, since: int, until: int) -> Row:
    """:func:`gpu_marks` and the processes bound to the GPU in the window (``lanes``)."""
    return {**gpu_marks(db, gpu_id, since, until),
            "lanes": bound_processes(db, gpu_id, since, until)}


def _with_health(row: Row) -> Row:
    row["health_evidence"] = json.loads(row["health_evidence"] or "{}")
    row["live"] = is_live(row["health"])
    return row


def gpu_health(db: Database, gpu_id: str) -> Row | None:
    """A GPU's current health as the correlator left it: ``health`` (None before any
    transition: ok), ``since``, ``evidence`` (dict), ``boot_id``; None for an unknown GPU."""
    found = db.execute_returning_dicts(
        "select id, health, health_since as since, health_evidence, health_boot_id as "
        "boot_id, source from gpus where id = ?", [gpu_id])
    if not found:
        return None
    row = found[0]
    row["evidence"] = json.loads(row.pop("health_evidence") or "{}")
    return row


def gpu_health_state(db: Database, gpu_id: str) -> str | None:
    """Just the GPU's health (None: never judged, or no such GPU): the cheap read."""
    row = db.execute("select health from gpus where id = ?", [gpu_id]).fetchone()
    return row[0] if row else None


def gpus_not_ok(db: Database) -> list[tuple[str, str, int, str | None]]:
    """(gpu id, health, since, boot id) of every GPU whose health is not ok."""
    return [tuple(r) for r in db.execute(
        "select id, health, health_since, health_boot_id from gpus where health is not null "
        "and health != 'ok' order by id").fetchall()]


def gpu_health_history(db: Database, gpu_id: str | None = None, limit: int = 50) -> list[Row]:
    """Health transitions, newest first (of one GPU, or all): state, previous, cause,
    evidence (dict: what event, when, from which source), what clears it, boot id."""
    where, params = ("where gpu_id = ?", [gpu_id]) if gpu_id else ("", [])
    rows = db.execute_returning_dicts(
        f"select gpu_id, ts, state, previous, cause, evidence, clears, boot_id from "
        f"gpu_health_history {where} order by ts desc, id desc limit ?", [*params, limit])
    for row in rows:
        row["evidence"] = json.loads(row["evidence"] or "{}")
    return rows


def gpu_health_states(db: Database) -> list[tuple[str, str]]:
    """(gpu id, health) of every GPU, for ``/metrics`` (never-judged GPUs are ok)."""
    return [tuple(r) for r in db.execute(
        "select id, coalesce(health, 'ok') from gpus order by id").fetchall()]


def last_boot_id(db: Database) -> str | None:
    """The boot id the kernel-log source last read in (None before it read anything)."""
    row = db.execute("select boot_id from source_cursors where boot_id is not null and "
                     "boot_id != '' order by updated_at desc limit 1").fetchone()
    return row[0] if row else None


def simulated(db: Database) -> bool:
    return bool(db.execute("select count(*) from gpus where simulated").fetchone()[0])


# --- processes ---------------------------------------------------------------------------

def processes_holding_devices(db: Database, include_exited: bool = False) -> list[dict]:
    """Processes with their device fds and ioctl counts, busiest first.

    Each row: pid, start_time, key, comm, cmdline, tag, exited_at, devices (open fds:
    path, device, fd, scanned), ioctl_total, ioctls (path, cmd, name, count).
    """
    where = "" if include_exited else "where p.exited_at is null"
    rows = db.execute_returning_dicts(f"""
        select p.pid, p.start_time, p.comm, p.cmdline, p.tag, p.cgroup, p.exited_at,
               p.first_seen, p.last_seen
        from processes p {where}
        order by p.first_seen
    """)
    result = []
    for row in rows:
        key = [row["pid"], row["start_time"]]
        devices = db.execute_returning_dicts(
            "select path, device, minor, fd, how, scanned, opened_at from device_fds "
            "where pid = ? and start_time = ? and closed_at is null order by fd", key)
        ioctls = db.execute_returning_dicts(
            "select path, device, cmd, op as name, sum(count) as count, sum(errors) as errors, "
            "sum(latency_sum_ns) as latency_sum_ns, max(latency_max_ns) as latency_max_ns, "
            "sum(bytes) as bytes from driver_call_stats where pid = ? and start_time = ? "
            "group by path, cmd order by count desc", key)
        if not devices and not ioctls and not include_exited:
            continue
        bound = db.execute_returning_dicts(
            "select b.gpu_id, g.gpu_index, g.uuid from gpu_bindings b "
            "left join gpus g on g.id = b.gpu_id where b.pid = ? and b.start_time = ? "
            "and b.until is null order by g.gpu_index is null, g.gpu_index, b.gpu_id", key)
        result.append({**row, "key": str(ProcessKey(*key)), "devices": devices,
                       "gpus": bound, "ioctls": ioctls,
                       "ioctl_total": sum(i["count"] for i in ioctls)})
    result.sort(key=lambda r: -r["ioctl_total"])
    return result


PROCESS_SORTS = ("ioctls", "gpu", "name", "started")


def sorted_processes(processes: list[dict], sort: str = "ioctls", search: str = "") -> list[dict]:
    """The process list narrowed by ``search`` (words all found in the key, name, command
    line, tag or GPU, case-insensitive) and ordered by one of ``PROCESS_SORTS``."""
    if sort not in PROCESS_SORTS:
        raise ValueError(f"sort must be one of {', '.join(PROCESS_SORTS)}, not {sort!r}")
    words = search.lower().split()

    def text(p: dict) -> str:
        gpus = " ".join(f"{g['gpu_index']} {g['gpu_id']} {g['uuid'] or ''}" for g in p["gpus"])
        return " ".join(str(v or "") for v in (p["key"], p["comm"], p["cmdline"], p["tag"],
                                               gpus)).lower()

    kept = [p for p in processes if all(w in text(p) for w in words)]
    order = {
        "ioctls": lambda p: -p["ioctl_total"],
        "gpu": lambda p: (not p["gpus"], [(g["gpu_index"] is None, g["gpu_index"] or 0,
                                           g["gpu_id"]) for g in p["gpus"]]),
        "name": lambda p: ((p["comm"] or "").lower(), p["pid"]),
        "started": lambda p: (p["start_time"] or 0),
    }[sort]
    return sorted(kept, key=order)


def process(db: Database, key: ProcessKey) -> Row | None:
    found = db.execute_returning_dicts(f"select p.*, {_CONTAINER} as container from processes p "
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
    calls = db.execute_returning_dicts(
        "select coalesce(sub_name, op) as operation, op, device, sum(count) as "
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


def _process_event_union(db: Database, key: ProcessKey) -> tuple[str, list]:
    """The select of every event :func:`process_events` lists, with ``src`` and ``id`` to
    order ties, and its parameters."""
    life = process(db, key) or {}
    end = life.get("exited_at") or 2**62
    # Device opens and closes live in device_fds (their one home): listed as the events they
    # were, with the fields the probes sent, in the events' order.
    sql = ("select ts, kind as what, body as detail, 0 as src, id from events where pid = ? "
           "and start_time = ? and topic = 'proc' union all "
           "select opened_at, 'device_opened', json_object('fd', fd, 'path', path, 'device', "
           "device, 'minor', minor, 'how', how, 'cloexec', json(iif(cloexec, 'true', "
           "'false'))), 3, rowid from device_fds where pid = ? and start_time = ? union all "
           "select closed_at, 'device_closed', json_object('fd', fd, 'path', path), 4, rowid "
           "from device_fds where pid = ? and start_time = ? and closed_at is not null "
           "union all "
           "select ts, 'driver call ' || coalesce(sub_name, op), coalesce(status_name, '') "
           "|| ' ' || coalesce(reasons, ''), 1, id from driver_calls where pid = ? and "
           "start_time = ? union all "
           "select ts, 'kernel log ' || kind || coalesce(' ' || xid, ''), message, 2, rowid "
           "from kernel_log where pid = ? and ts between ? and ?")
    process_key = [key.pid, key.start_time]
    return sql, [*process_key * 4, key.pid, key.start_time, end]


def process_events(db: Database, key: ProcessKey, limit: int = 500, offset: int = 0,
                   newest_first: bool = False) -> list[Row]:
    """Lifecycle events, notable or failed driver calls and kernel-log lines naming the pid
    during the process's life (``ts``, ``what``, ``detail``), oldest first (newest first
    with ``newest_first``): ``limit`` of them from the ``offset``-th on, for a page."""
    sql, params = _process_event_union(db, key)
    order = " desc" if newest_first else ""
    return db.execute_returning_dicts(
        f"select ts, what, detail from ({sql}) order by ts{order}, src{order}, id{order} "
        f"limit ? offset ?", [*params, limit, offset])


def process_event_count(db: Database, key: ProcessKey, after: int | None = None) -> int:
    """How many events :func:`process_events` has for the process; with ``after`` (ns),
    only those later than it (how many come before it, newest first: a page's start)."""
    sql, params = _process_event_union(db, key)
    where, more = ("", []) if after is None else (" where ts > ?", [after])
    return db.execute(f"select count(*) from ({sql}){where}", [*params, *more]).fetchone()[0]


def process_gpus(db: Database, key: ProcessKey) -> list[Row]:
    """The GPUs the process held at any time (``gpu_id`` rows)."""
    return db.execute_returning_dicts("select distinct gpu_id from gpu_bindings where pid = ? "
                                      "and start_time = ? order by gpu_id",
                                      [key.pid, key.start_time])


def process_incident_ids(db: Database, key: ProcessKey) -> list[int]:
    """Incidents the process took part in (any role; an effect counts as its cause)."""
    return [r[0] for r in db.execute(
        "select distinct coalesce(i.cause_id, i.id) from incident_processes p join incidents i "
        "on i.id = p.incident_id where p.pid = ? and p.start_time = ? order by 1",
        [key.pid, key.start_time])]


# --- incidents and resets ----------------------------------------------------------------

def list_incidents(db: Database, *, gpu: str | None = None, since: int | None = None,
                   until: int | None = None, kind: str | None = None,
                   state: str | None = None, effects: bool = False,
                   limit: int = 200) -> list[dict[str, Any]]:
    """Incidents, newest first; ``gpu`` is any name of the GPU (:func:`gpu_named`); those
    seen in [``since``, ``until``) (last seen at or after the one, opened before the other).
    Effects (a stall, a death, a finding, the reset a lost GPU needed, that a cause incident
    explains) are that incident's links, listed only with ``effects`` (``cause_id`` names
    it)."""
    where: list[str] = ["1" if effects else "cause_id is null"]
    params: list[Any] = []
    if gpu:
        where.append("(gpu_id = ? or gpu_id = ?)")
        params += [gpu, gpu_named(db, gpu)]
    if since is not None:
        where.append("last_seen >= ?")
        params.append(since)
    if until is not None:
        where.append("opened_at < ?")
        params.append(until)
    if kind:
        where.append("kind = ?")
        params.append(kind)
    if state:
        where.append(sql_active() if state == "active" else "state = ?")
        params += [] if state == "active" else [state]
    sql = ("select id, kind, severity, state, resolution, gpu_id, pid, start_time, title, "
           "summary, opened_at, closed_at, last_seen, count, acknowledged_by, cause_id "
           "from incidents "
           "where " + " and ".join(where) + " order by opened_at desc, id desc limit ?")
    return db.execute_returning_dicts(sql, [*params, limit])


def incident_detail(db: Database, incident_id: int) -> dict[str, Any] | None:
    """One incident with its chain (``{kind, ts, summary, evidence, confidence, pid}``)."""
    found = db.execute_returning_dicts("select * from incidents where id = ?", [incident_id])
    if not found:
        return None
    row = found[0]
    links = db.execute_returning_dicts(
        "select kind, ts, summary, evidence, confidence, pid, start_time, gpu_id "
        "from incident_links where incident_id = ? order by seq", [incident_id])
    for link in links:
        link["evidence"] = json.loads(link["evidence"] or "{}")
    processes = db.execute_returning_dicts(
        "select i.pid, i.start_time, i.role, p.comm from incident_processes i "
        "left join processes p on p.pid = i.pid and "
        "p.start_time = i.start_time where incident_id = ? "
        "order by i.pid", [incident_id])
    pci, uuid = pci_and_uuid(db, row["gpu_id"])
    return {"id": row["id"], "kind": row["kind"], "severity": row["severity"],
            "state": row["state"], "title": row["title"], "summary": row["summary"],
            "gpu": row["gpu_id"], "gpu_uuid": uuid, "gpu_pci": pci,
            "started": row["opened_at"], "ended": row["closed_at"],
            "last_seen": row["last_seen"], "count": row["count"],
            "confidence": row["confidence"],
            "resolution": row.get("resolution"),
            "acknowledged_at": row.get("acknowledged_at"),
            "acknowledged_by": row.get("acknowledged_by"),
            "cause_id": row.get("cause_id"),
            "gpu_health": gpu_health_state(db, row["gpu_id"]) if row["gpu_id"] else None,
            "details": json.loads(row["details"] or "{}"),
            "processes": processes, "chain": links, "log": incident_log(db, incident_id)}


def incident_log(db: Database, incident_id: int) -> list[Row]:
    """An incident's lifecycle changes and notes, oldest first (gpuwhy/lifecycle.py)."""
    if not db["incident_log"].exists():
        return []
    return db.execute_returning_dicts(
        "select id, ts, action, actor, state, resolution, text from incident_log "
        "where incident_id = ? order by ts, id", [incident_id])


def incident_kinds(db: Database) -> list[str]:
    """Every kind of incident recorded, sorted (the list page's filter)."""
    return [r[0] for r in db.execute("select distinct kind from incidents order by 1")]


def reset_history(db: Database, gpu: str | None = None) -> list[dict[str, Any]]:
    """Every GPU reset, newest first: when, by what/whom, which processes were hit."""
    history = []
    for incident in list_incidents(db, gpu=gpu, kind="gpu_reset", effects=True, limit=1000):
        # the incident just listed (one read-only snapshot): there
        detail = cast(dict[str, Any], incident_detail(db, incident["id"]))
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


# --- rules' findings and sources' health -------------------------------------------------

def _decode_finding(row: Row) -> Row:
    for name in ("evidence", "fixes"):
        try:
            row[name] = json.loads(row[name] or ("{}" if name == "evidence" else "[]"))
        except ValueError:
            pass   # shown as the text it is
    return row


def findings(db: Database, *, key: ProcessKey | None = None, rule_id: str | None = None,
             limit: int = 100) -> list[Row]:
    where: list[str] = []
    params: list[Any] = []
    if key is not None:
        where.append("pid = ? and start_time = ?")
        params += [key.pid, key.start_time]
    if rule_id is not None:
        where.append("rule_id = ?")
        params.append(rule_id)
    sql = ("select * from rule_findings" + (" where " + " and ".join(where) if where else "")
           + " order by last_ts desc limit ?")
    return [_decode_finding(r) for r in db.execute_returning_dicts(sql, [*params, limit])]


def findings_by_rule(db: Database) -> dict[str, Row]:
    """Per rule: how many findings, how many firing, and the last one; empty in a store with
    no ``rule_findings`` table (one from before the rules engine, opened read-only)."""
    if not db["rule_findings"].exists():
        return {}
    summary = {r["rule_id"]: r for r in db.execute_returning_dicts(
        "select rule_id, count(*) as findings, sum(state = 'firing') as firing, "
            "max(last_ts) as last_ts from rule_findings group by rule_id")}
    for rule_id, row in summary.items():
        row["last"] = findings(db, rule_id=rule_id, limit=1)[0]
    return summary


def source_health(db: Database) -> list[dict]:
    """Every source's last heartbeat, counters decoded."""
    rows = db.execute_returning_dicts(
        "select source, state, detail, counters, last_seen from source_health order by source")
    for row in rows:
        row["counters"] = json.loads(row["counters"] or "{}")
    return rows


def findings_in_window(db: Database, gpu_ids: list[str], process: ProcessKey | None,
                       since: int, until: int) -> list[Row]:
    """Findings on any of ``gpu_ids`` or on ``process`` that were open during [since, until];
    evidence and fixes as stored (JSON text)."""
    if not db["rule_findings"].exists():
        return []
    where: list[str] = []
    params: list[Any] = []
    if gpu_ids:
        where.append(f"gpu_id in ({', '.join('?' * len(gpu_ids))})")
        params += gpu_ids
    if process is not None:
        where.append("(pid = ? and start_time = ?)")
        params += [process.pid, process.start_time]
    if not where:
        return []
    return db.execute_returning_dicts(
        f"select * from rule_findings where ({' or '.join(where)}) and "
        f"first_ts <= ? and coalesce(cleared_at, last_ts) >= ?", [*params, until, since])


# --- metrics and checks ------------------------------------------------------------------
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# The newest samples are read from this span before the newest sample of any GPU: the
# samples' primary key leads with time, so a span is a range of it, not a scan of the table.
# Two minutes hold several samples of every GPU a source reads (every 1 s by default, a
# dcgm-exporter scrape every 15-30 s); one read less often is found through its rollups.
LATEST_SPAN_NS = 120 * 1_000_000_000


def latest_gpu_samples(db: Database, columns: list[str]) -> list[tuple]:
    """Per GPU its latest whole-GPU sample: ``(gpu_id, ts, *columns, simulated)``.

    Read from the newest ``LATEST_SPAN_NS`` of samples (a range of the primary key; every
    sampled GPU is there while its source runs). A GPU with none there (lost, or its source
    stopped) is looked for in the samples not yet rolled up, then through its newest
    one-minute rollup in that minute's samples: ranges of the key again, never a scan of a
    week of samples (the /metrics scrape and the OTLP export read this every time)."""
    bad = [c for c in columns if not _IDENTIFIER.fullmatch(c)]
    if bad:   # the names are spliced into the SQL
        raise ValueError(f"not gpu_samples column names: {bad!r}")
    newest = db.execute("select max(ts) from gpu_sample_data").fetchone()[0]
    if newest is None:
        return []
    select = ", ".join(["s.gpu_id", "s.ts", *("s." + c for c in columns), "g.simulated"])
    rows = db.execute(
        f"select {select} from (select d.gpu, max(d.ts) as ts from gpu_sample_data d "
        "where d.ts >= ? and d.instance = '' group by d.gpu) last "
        "join gpus g on g.gpu_key = last.gpu "
        "join gpu_samples s on s.ts = last.ts and s.gpu_id = g.id and s.instance = ''",
        [newest - LATEST_SPAN_NS]).fetchall()
    found = {row[0] for row in rows}
    missing = [(gpu_id, key) for gpu_id, key in db.execute("select id, gpu_key from gpus")
               if gpu_id not in found and key is not None]
    if not missing:
        return rows
    # Samples before the rollups' mark are in the rollups; those after it, not yet (the
    # rollups trail the samples by a minute or so; with no rollups made, an hour is looked at)
    done = get_mark(db, DONE_MARK)
    unrolled = max(done if done is not None else 0, newest - 3600 * 1_000_000_000)
    latest = (f"select {select} from gpu_samples s join gpus g on g.id = s.gpu_id "
              "where s.gpu_id = ? and s.instance = '' and s.ts >= ? and s.ts < ? "
              "order by s.ts desc limit 1")
    for gpu_id, key in missing:
        row = db.execute(latest, [gpu_id, unrolled, newest - LATEST_SPAN_NS]).fetchone()
        if row is None:
            minute = db.execute("select max(minute) from gpu_rollup_data where gpu = ? and "
                                "instance = ''", [key]).fetchone()[0]
            row = None if minute is None else db.execute(
                latest, [gpu_id, minute, minute + 60 * 1_000_000_000]).fetchone()
        if row is not None:
            rows.append(row)
    return rows


def bound_process_counts(db: Database) -> list[tuple[str, int]]:
    """``(gpu_id, processes holding it now)`` for every GPU held by any."""
    return db.execute("select gpu_id, count(distinct pid || '-' || start_time) "
                      "from gpu_bindings where until is null group by gpu_id").fetchall()


def driver_call_totals_of_living_processes(db: Database) -> list[tuple]:
    """``(pid, start_time, comm, driver calls, pod_uid, container)`` of processes not known
    to have exited, busiest first (container: the container id, else the systemd unit)."""
    return db.execute(
        "select s.pid, s.start_time, coalesce(p.comm, ''), sum(s.count) as n, p.pod_uid, "
        "coalesce(p.container_id, p.unit) from "
        "driver_call_stats s left join processes p on p.pid = s.pid and "
        "p.start_time = s.start_time where p.exited_at is null "
        "group by s.pid, s.start_time order by n desc").fetchall()


def latest_gpu_process_lists(db: Database) -> list[tuple]:
    """NVML's latest process list of every GPU, most memory first:
    ``(gpu_id, pid, start_time, comm, used_memory_mib, sm_util, pod_uid, container)``."""
    return db.execute(
        "select g.gpu_id, g.pid, g.start_time, coalesce(p.comm, ''), g.used_memory_mib, "
        "g.sm_util, p.pod_uid, coalesce(p.container_id, p.unit) from gpu_processes g "
        "join (select gpu_id, max(ts) as ts from "
        "gpu_processes group by gpu_id) last on last.gpu_id = g.gpu_id and last.ts = g.ts "
        "left join processes p on p.pid = g.pid and p.start_time = g.start_time "
        "order by g.used_memory_mib desc").fetchall()


def incident_counts(db: Database) -> list[tuple[str, str, int]]:
    """``(kind, severity, incidents)``; a repeat merged into an incident is not counted.
    Rows stored before kinds and severities were required (schema m001) have none: they
    count as ``unknown``, as a /metrics label must be text."""
    return db.execute("select coalesce(kind, 'unknown'), coalesce(severity, 'unknown'), "
                      "count(*) from incidents where cause_id is null "
                      "group by 1, 2").fetchall()


def open_incident_counts(db: Database) -> list[tuple[str, int]]:
    """``(kind, incidents not resolved yet)``: open or acknowledged."""
    return db.execute(f"select coalesce(kind, 'unknown'), count(*) from incidents where "
                      f"{sql_active()} and cause_id is null group by 1").fetchall()


def process_driver_version(db: Database, key: ProcessKey) -> str | None:
    """The driver version the process's own version check saw, when it made one."""
    row = db.execute("select version from driver_calls where pid = ? and start_time = ? "
                     "and version is not null limit 1", [key.pid, key.start_time]).fetchone()
    return row[0] if row and row[0] else None


def has_gpu_samples(db: Database, since: int | None = None) -> bool:
    """Whether any GPU sample is stored (taken at ``since`` or later, when given)."""
    if since is None:
        return db.execute("select 1 from gpu_samples limit 1").fetchone() is not None
    return db.execute("select 1 from gpu_samples where ts >= ? limit 1",
                      [since]).fetchone() is not None


def gpu_of_process(db: Database, key: ProcessKey) -> str | None:
    """The GPU the process last opened, else the one whose NVML process list last named it."""
    for sql in ("select gpu_id from gpu_bindings where pid = ? and start_time = ? "
                "order by since desc limit 1",
                "select gpu_id from gpu_processes where pid = ? and start_time = ? "
                "order by ts desc limit 1"):
        row = db.execute(sql, [key.pid, key.start_time]).fetchone()
        if row:
            return row[0]
    return None


def gpu_columns(db: Database) -> set[str]:
    """The columns of the ``gpus`` table (an older store lacks the newer identity columns)."""
    return set(db["gpus"].columns_dict)


def gpu_sample_columns(db: Database) -> set[str]:
    """The columns of ``gpu_samples``: the fields a whole-GPU sample can hold in this store."""
    return set(db["gpu_samples"].columns_dict)


def gpu_identities(db: Database, columns: tuple[str, ...] = ()) -> list[Row]:
    """Every GPU's id, UUID, PCI address, model, index, minor, source, simulated flag and
    health, plus those of ``columns`` (e.g. ``vbios_version``) the ``gpus`` table has."""
    have = db["gpus"].columns_dict
    extra = [c for c in columns if c in have and _IDENTIFIER.fullmatch(c)]
    select = ", ".join(["id", "uuid", "pci_bus_id", "model", "gpu_index", "minor", "source",
                        "simulated", "coalesce(health, 'ok') as health", *extra])
    return db.execute_returning_dicts(f"select {select} from gpus order by id")


def xid_counts(db: Database) -> list[tuple[str | None, int, int]]:
    """``(gpu_id, xid, kernel-log lines)`` of every Xid the store keeps."""
    return db.execute("select gpu_id, xid, count(*) from kernel_log where kind = 'xid' and "
                      "xid is not null group by gpu_id, xid").fetchall()


def open_finding_counts(db: Database) -> list[tuple[str, str, int]]:
    """``(rule_id, severity, findings firing now)``, shadow rules' findings left out."""
    if not db["rule_findings"].exists():
        return []
    return db.execute("select rule_id, severity, count(*) from rule_findings where "
                      "state = 'firing' and coalesce(shadow, 0) = 0 "
                      "group by rule_id, severity").fetchall()


def whole_gpu_utilisation(db: Database, after: int) -> list[tuple[str, int, Any]]:
    """``(gpu_id, ts, gpu_util)`` of the whole-GPU samples taken after ``after``, oldest
    first."""
    return db.execute("select gpu_id, ts, gpu_util from gpu_samples where ts > ? "
                      "and instance = '' order by ts", [after]).fetchall()


def holders_between(db: Database, since: int, until: int) -> list[tuple]:
    """Bindings open at some time in [since, until]:
    ``(gpu_id, bound_since, bound_until or None, uid, pod_uid, container)``, where container
    is the container id, else the systemd unit."""
    return db.execute(
        "select b.gpu_id, b.since, coalesce(b.until, p.exited_at), p.uid, p.pod_uid, "
        "coalesce(p.container_id, p.unit) from gpu_bindings b left join processes p on "
        "p.pid = b.pid and p.start_time = b.start_time where b.since <= ? and "
        "(coalesce(b.until, p.exited_at) is null or coalesce(b.until, p.exited_at) > ?)",
        [until, since]).fetchall()


# --- what the answer on each GPU is computed from (gpuwhy.rules.answer.verdicts) -----------
# Causes that cleared this long before the moment asked about are still read: one that held
# inside a firing symptom's window answers for it (the longest shipped window is minutes).
ANSWER_LOOKBACK_NS = 3600 * 1_000_000_000


def _finding_event(row: Row, at: int | None) -> RuleFinding:
    """A stored finding as the rules sent it, in the state it was in at ``at`` (now: None)."""
    cleared = row["cleared_at"] is not None and (at is None or row["cleared_at"] <= at)
    try:
        processes = [ProcessKey(int(p[0]), int(p[1])) if isinstance(p, list)
                     else ProcessKey(int(p["pid"]), int(p["start_time"]))
                     for p in json.loads(row["processes"] or "[]")]
    except (ValueError, TypeError, KeyError, IndexError):
        processes = []     # an older row's shape: the answer does not need them
    evidence = row["evidence"] if isinstance(row["evidence"], dict) else {}
    fixes = [str(f) for f in row["fixes"]] if isinstance(row["fixes"], list) else []
    return RuleFinding(
        ts=row["cleared_at"] if cleared else (row["last_ts"] or 0),
        finding_id=row["finding_id"], rule_id=row["rule_id"] or "", title=row["title"] or "",
        severity=row["severity"] or "warning", state="cleared" if cleared else "firing",
        gpu_id=row["gpu_id"] or "",
        process=ProcessKey(row["pid"], row["start_time"]) if row["pid"] is not None
        and row["start_time"] is not None else None,
        window_start=row["window_start"] or 0, window_end=row["window_end"] or 0,
        evidence=evidence, root_cause=row["root_cause"] or "", fixes=fixes,
        verify=row["verify"] or "", shadow=bool(row["shadow"]), group=row["rule_group"] or "",
        since=row.get("since") or row["first_ts"] or 0, processes=processes,
        instance=row.get("instance") or "", mig_profile=row.get("mig_profile") or "",
        rule_kind=row.get("rule_kind") or "", explains=_strings(row.get("explains")),
        unexplained=_strings(row.get("unexplained")), scope=row.get("scope") or "")


def _strings(text: str | None) -> list[str]:
    """A stored JSON list of strings; [] for NULL or anything else."""
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def answer_findings(db: Database, at: int | None = None,
                    lookback_ns: int = ANSWER_LOOKBACK_NS) -> list[RuleFinding]:
    """The findings the answer weighs: those firing at ``at`` (now when None) and those
    cleared within ``lookback_ns`` before it, each as it stood then."""
    if not db["rule_findings"].exists():
        return []
    if at is None:
        rows = db.execute_returning_dicts(
            "select * from rule_findings where state = 'firing' or cleared_at >= ?",
            [_now_ns() - lookback_ns])
    else:
        rows = db.execute_returning_dicts(
            "select * from rule_findings where first_ts <= ? and "
            "(cleared_at is null or cleared_at >= ?)", [at, at - lookback_ns])
    return [_finding_event(_decode_finding(r), at) for r in rows]


def answer_gpus(db: Database, at: int | None = None) -> list[GpuFacts]:
    """Every GPU as the answer names it, with its health now, or at ``at`` (the last
    transition at or before it in ``gpu_health_history``; ok before any)."""
    if not db["gpus"].exists():
        return []
    then: dict[str, Row] = {}
    if at is not None and db["gpu_health_history"].exists():
        for row in db.execute_returning_dicts(
                "select gpu_id, state, ts, cause, clears from gpu_health_history h where "
                "ts <= ? and id = (select id from gpu_health_history where gpu_id = h.gpu_id "
                "and ts <= ? order by ts desc, id desc limit 1)", [at, at]):
            then[row["gpu_id"]] = row
    facts = []
    engines = _serving_engines(db, at)
    for g in gpus(db):
        if at is not None and g["first_seen"] is not None and g["first_seen"] > at:
            continue      # not known yet then
        if at is None:
            health, since = g["health"], g["health_since"]
            cause = (g["health_evidence"] or {}).get("cause", "") if isinstance(
                g["health_evidence"], dict) else ""
            clears = g["health_clears"] or ""
        else:
            row = then.get(g["id"], {})
            health, since = row.get("state") or "ok", row.get("ts")
            cause, clears = row.get("cause") or "", row.get("clears") or ""
        if not cause and health != "ok" and db["gpu_health_history"].exists():
            last = gpu_health_history(db, g["id"], limit=1)
            cause = last[0]["cause"] or "" if last else ""
        engine, spans = engines.get(g["id"], ("", ()))
        facts.append(GpuFacts(
            gpu_id=g["id"], index=g["gpu_index"], model=g["model"] or "",
            pci=g["pci_bus_id"] or pci_and_uuid(db, g["id"])[0] or "", health=health or "ok",
            health_since=since, health_cause=str(cause), health_clears=clears,
            engine=engine, engine_gpus=spans))
    return facts


# An engine scraped within this long before the moment asked about still serves there
# (scrapes come every 5 s; a few missed ones are not an engine gone)
ENGINE_LOOKBACK_NS = 120 * 1_000_000_000


def _serving_engines(db: Database, at: int | None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Per GPU id: the inference engine scraped from it lately, by its project's name, and
    the GPUs it spans as people name them (their index, else their id)."""
    if not db["engine_samples"].exists():
        return {}
    until = at if at is not None else _now_ns()
    rows = db.execute(
        "select engine, gpu_ids from engine_samples where id in (select max(id) from "
        "engine_samples where ts between ? and ? group by pid, start_time)",
        [until - ENGINE_LOOKBACK_NS, until]).fetchall()
    if not rows:
        return {}
    index = {gpu_id: i for gpu_id, i in db.execute("select id, gpu_index from gpus")}
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for engine, gpu_ids in rows:
        spans = [g for g in _strings(gpu_ids) if g in index]
        named = tuple(str(index[g]) if index[g] is not None else g
                      for g in sorted(spans, key=lambda g: (index[g] is None, index[g] or 0)))
        for gpu_id in spans:
            found[gpu_id] = (ENGINE_NAMES.get(engine, str(engine)), named)
    return found


def gpu_verdicts(db: Database, rules: Mapping[str, Rule], at: int | None = None
                 ) -> list[Verdict]:
    """The answer on every GPU, worst first, now or at ``at``: the one read that `gpuwhy
    why`, the API and `gpuwhy rules eval` share (:func:`gpuwhy.rules.answer.verdicts`)."""
    return verdicts(answer_gpus(db, at), answer_findings(db, at), rules)


def gpu_verdict(db: Database, rules: Mapping[str, Rule], gpu_id: str | None
                ) -> Verdict | None:
    """The answer on one GPU now (None for no GPU, or one the store does not know)."""
    if not gpu_id:
        return None
    return next((v for v in gpu_verdicts(db, rules) if v.gpu.gpu_id == gpu_id), None)
