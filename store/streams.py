"""Time-window reads of the store that the rules' signals run on: GPUs, live processes,
samples, per-process stats, driver call totals and the event streams.

Each function returns plain rows (one dict per row, column names as keys) in time order
where rows have a time; shaping them into signal rows is the caller's business. Windows
are inclusive at both ends.
"""

from __future__ import annotations

import json
import sqlite3

from sqlite_utils import Database

from gpuwhy.identity import ProcessKey

# The table name goes into the SQL text, so only these may be asked for.
PROCESS_STATS_TABLES = frozenset({"sched_stats", "cuda_stats"})


def _rows(db: Database, sql: str, params: list) -> list[dict]:
    """The rows of a SELECT as dicts. sqlite-utils' ``query`` wraps each statement in a
    SAVEPOINT and parses its first keyword, three statements for one; the rules read
    hundreds of windows a round, and these statements are known SELECTs."""
    cursor = db.conn.execute(sql, params)
    keys = [column[0] for column in cursor.description]
    return [dict(zip(keys, row, strict=True)) for row in cursor]


def recent_gpus(db: Database, since: int) -> list[dict]:
    """Ids of the GPUs seen at or after ``since``, by id."""
    return _rows(db,
        "select id from gpus where last_seen >= ? order by id", [since])


def gpu_row(db: Database, gpu_id: str) -> list[dict]:
    """The GPU's id, model, pci_bus_id and NUMA node (no rows when it is unknown)."""
    return _rows(db,
        "select id, model, pci_bus_id, numa_node from gpus where id = ?", [gpu_id])


def live_processes_on(db: Database, gpu_id: str, nvml_since: int) -> list[dict]:
    """pid and start_time of the unexited processes on the GPU: those with an open binding,
    and those in NVML's latest process list for it if that list is from ``nvml_since`` on."""
    return _rows(db,
        "select b.pid, b.start_time from gpu_bindings b left join processes p "
        "on p.pid = b.pid and p.start_time = b.start_time "
        "where b.gpu_id = ? and b.until is null and p.exited_at is null "
        "union select g.pid, g.start_time from gpu_processes g left join processes p "
        "on p.pid = g.pid and p.start_time = g.start_time where g.gpu_id = ? "
        "and g.start_time is not null and p.exited_at is null and g.ts = "
        "(select max(ts) from gpu_processes where gpu_id = ? and ts >= ?)",
        [gpu_id, gpu_id, gpu_id, nvml_since])


def listed_processes_on(db: Database, gpu_id: str, since: int) -> list[dict] | None:
    """pid and start_time of the unexited processes of the GPU's latest compute-process list
    (NVML's) if that list is from ``since`` on; None when there is none that recent."""
    latest = db.execute("select max(ts) from gpu_processes where gpu_id = ? and ts >= ?",
                        [gpu_id, since]).fetchone()[0]
    if latest is None:
        return None
    return _rows(db,
        "select g.pid, g.start_time from gpu_processes g left join processes p "
        "on p.pid = g.pid and p.start_time = g.start_time where g.gpu_id = ? and g.ts = ? "
        "and g.start_time is not null and p.exited_at is null", [gpu_id, latest])


def process_row(db: Database, key: ProcessKey) -> list[dict]:
    """The process's comm, cmdline, exe, cgroup, first_seen, started_at and env (its JSON
    text; no rows when unknown)."""
    return _rows(db,
        "select comm, cmdline, exe, cgroup, first_seen, started_at, env from processes "
        "where pid = ? and start_time = ?", [key.pid, key.start_time])


def environment(text: str | None) -> dict[str, str] | None:
    """``processes.env`` as a dict: None when no sighting read it (NULL) or the text is no
    JSON object of strings (the store holds what the probes sent, not checked again)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return {str(k): v for k, v in value.items() if isinstance(v, str)}


def process_environment(db: Database, key: ProcessKey) -> dict[str, str] | None:
    """The environment variables the probes recorded of the process (those of the
    ``probes.environment`` setting it had set); None when unknown or never read."""
    rows = _rows(db, "select env from processes where pid = ? and start_time = ?",
                 [key.pid, key.start_time])
    return environment(rows[0]["env"]) if rows else None


def gpu_samples_between(db: Database, gpu_id: str, start: int, end: int,
                        instance: str = "") -> list[dict]:
    """The GPU's whole-device samples in the window, or with ``instance`` those of that MIG
    GPU instance (never the one for the other)."""
    return _rows(db,
        "select * from gpu_samples where gpu_id = ? and ts >= ? "
        "and ts <= ? and instance = ? order by ts", [gpu_id, start, end, instance])


def gpu_instances_on(db: Database, gpu_id: str, since: int) -> list[dict]:
    """The GPU's MIG instances sampled at or after ``since``: instance and profile ('' when
    the source did not tell it). No rows for a GPU not in MIG mode (or a store before
    migration m116)."""
    try:
        return _rows(db,
            "select instance, profile from gpu_instances where gpu_id = ? and last_seen >= ? "
            "order by instance", [gpu_id, since])
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):   # asked of the table: 3 statements, every round
            return []
        raise


def process_stats_between(db: Database, table: str, key: ProcessKey, start: int,
                          end: int) -> list[dict]:
    """The process's rows of ``table`` (sched_stats or cuda_stats) in the window."""
    if table not in PROCESS_STATS_TABLES:
        raise ValueError(f"not a per-process stats table: {table!r}")
    return _rows(db,
        f"select * from {table} where pid = ? and start_time = ? and ts >= ? "
        "and ts <= ? order by ts", [key.pid, key.start_time, start, end])


def engine_samples_between(db: Database, key: ProcessKey, start: int,
                           end: int) -> list[dict]:
    """Scrapes in the window of the inference engine that ``key`` is, or whose tree it is a
    GPU process of (engine_members), in time order."""
    return _rows(db,
        "select * from engine_samples where pid = ? and start_time = ? and ts >= ? "
        "and ts <= ? union all select s.* from engine_members m join engine_samples s "
        "on s.pid = m.engine_pid and s.start_time = m.engine_start_time where m.pid = ? "
        "and m.start_time = ? and not (m.engine_pid = m.pid and m.engine_start_time = "
        "m.start_time) and s.ts >= ? and s.ts <= ? order by ts",
        [key.pid, key.start_time, start, end, key.pid, key.start_time, start, end])


def call_totals_by_op(db: Database, key: ProcessKey) -> list[dict]:
    """The process's cumulative driver call count, errors and latest updated_at per op."""
    return _rows(db,
        "select op, sum(count) as count, sum(errors) as errors, "
        "max(updated_at) as updated_at from driver_call_stats "
        "where pid = ? and start_time = ? group by op", [key.pid, key.start_time])


def kernel_log_between(db: Database, xid: bool, start: int, end: int) -> list[dict]:
    """Kernel log lines in the window: the Xid ones when ``xid``, every other kind if not."""
    op = "=" if xid else "!="
    return _rows(db,
        f"select * from kernel_log where kind {op} 'xid' and "
        "ts >= ? and ts <= ? order by ts", [start, end])


def gpu_events_between(db: Database, kind: str, start: int, end: int) -> list[dict]:
    """ts, gpu_id and (json) body of the events of ``kind`` in the window."""
    return _rows(db,
        "select ts, gpu_id, body from events where kind = ? and "
        "ts >= ? and ts <= ? order by ts", [kind, start, end])


def cron_starts_between(db: Database, start: int, end: int) -> list[dict]:
    """Cron runs that started in the window."""
    return _rows(db,
        "select * from cron_runs where phase = 'started' and "
        "ts >= ? and ts <= ? order by ts", [start, end])


def process_events_between(db: Database, kind: str, start: int, end: int) -> list[dict]:
    """Events of ``kind`` in the window (ts, pid, start_time, json body) with the process's
    comm and cmdline, None where the process is not recorded."""
    return _rows(db,
        "select e.ts, e.pid, e.start_time, e.body, p.comm, p.cmdline "
        "from events e left join processes p on p.pid = e.pid and "
        "p.start_time = e.start_time where e.kind = ? and e.ts >= ? "
        "and e.ts <= ? order by e.ts", [kind, start, end])


def gpu_process_exits_between(db: Database, start: int, end: int) -> list[dict]:
    """Exits in the window of processes bound to a GPU (through its device files) before
    they ended: one row per exit and GPU (ts, pid, start_time, json body, comm, cmdline,
    gpu_id). The host's other exits, most of them, are not read."""
    return _rows(db,
        "select distinct e.id, e.ts, e.pid, e.start_time, e.body, p.comm, p.cmdline, "
        "b.gpu_id from events e join gpu_bindings b on b.pid = e.pid and "
        "b.start_time = e.start_time and b.since <= e.ts left join processes p on "
        "p.pid = e.pid and p.start_time = e.start_time where e.kind = 'process_exited' "
        "and e.ts >= ? and e.ts <= ? order by e.ts, e.id", [start, end])


def driver_calls_between(db: Database, start: int, end: int) -> list[dict]:
    """Single driver calls recorded in the window."""
    return _rows(db,
        "select * from driver_calls where ts >= ? and ts <= ? order by ts", [start, end])
