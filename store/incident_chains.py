"""Incident chains in the store: the rows a chain is built from, and the chain written back.

:mod:`gpuwhy.correlator.chains` decides each chain's links from the plain rows read here
(the incident, its effects, the driver call, exec, cron run and cgroup behind it, earlier
and later Xids); :func:`store_chain` writes the links, the processes they name and the
chain's summary on the incident, in the batch's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlite_utils import Database

from gpuwhy.identity import ProcessKey
from gpuwhy.reset import RESET_CONTROLS, sql_names


def incident(db: Database, incident_id: int) -> dict:
    """The incident's row, every column."""
    return db.execute_returning_dicts("select * from incidents where id = ?", [incident_id])[0]


def store_chain(db: Database, incident_id: int, links: Sequence[Mapping[str, Any]]) -> None:
    """Replace the incident's links (each: kind, ts, summary, evidence, confidence, pid,
    start_time, gpu_id) and the processes they name; note the chain and its confidence."""
    db.execute("delete from incident_links where incident_id = ?", [incident_id])
    db.execute("delete from incident_processes where incident_id = ?", [incident_id])
    for seq, link in enumerate(links):
        row = dict(link)
        row["evidence"] = json.dumps(link["evidence"], sort_keys=True, default=str)
        db.table("incident_links").insert({"incident_id": incident_id, "seq": seq, **row})
        if link["pid"] is not None and link["start_time"] is not None:
            db.execute("insert or ignore into incident_processes values (?, ?, ?, ?)",
                       [incident_id, link["pid"], link["start_time"], link["kind"]])
    confidence = min((link["confidence"] for link in links), default=None)
    db.execute("update incidents set chain = ?, confidence = ? where id = ?",
               [json.dumps([{"kind": link["kind"], "ts": link["ts"], "summary": link["summary"]}
                            for link in links]), confidence, incident_id])


def process_name(db: Database, key: ProcessKey) -> str:
    """The process's comm (else its executable's name), or ``?``."""
    row = db.execute("select coalesce(nullif(comm, ''), exe_filename, '?') from processes "
                     "where pid = ? and start_time = ?", [key.pid, key.start_time]).fetchone()
    return row[0] if row and row[0] else "?"


def reset_calls(db: Database, since: int, until: int) -> list[tuple]:
    """(id, ts, pid, start_time, path, sub_name, op, status_name, latency_ns) of each reset
    control call in [since, until], oldest first."""
    return db.execute(
        "select id, ts, pid, start_time, path, sub_name, op, status_name, latency_ns "
        "from driver_calls "
        f"where sub_name in {sql_names(RESET_CONTROLS)} and ts between ? and ? order by ts",
        [since, until]).fetchall()


def last_exec(db: Database, key: ProcessKey, at: int) -> tuple | None:
    """(event id, ts, body) of the process's latest exec at or before ``at``."""
    return db.execute("select id, ts, body from events where kind = 'process_exec' and pid = ? "
                      "and start_time = ? and ts <= ? order by ts desc limit 1",
                      [key.pid, key.start_time, at]).fetchone()


def cron_run_of(db: Database, process: ProcessKey, since: int, at: int) -> tuple | None:
    """(cursor, ts, user, command, gpu_action, job_pid, job_start_time) of the latest cron
    run whose job is ``process`` (by its key, or by its pid in [since, at] when the run's
    start is unknown)."""
    return db.execute(
        "select cursor, ts, user, command, gpu_action, job_pid, job_start_time from "
        "cron_runs where phase = 'started' and job_pid = ? and (job_start_time = ? or "
        "(job_start_time is null and ts between ? and ?)) order by ts desc limit 1",
        [process.pid, process.start_time, since, at]).fetchone()


def cgroup_and_uid(db: Database, key: ProcessKey) -> tuple | None:
    """(cgroup, uid) of the process; None when it is not known."""
    return db.execute("select cgroup, uid from processes where pid = ? and start_time = ?",
                      [key.pid, key.start_time]).fetchone()


def earlier_xid(db: Database, gpu_id: str | None, incident_id: int, since: int,
                at: int) -> tuple | None:
    """(id, opened_at, title) of the GPU's latest Xid or loss incident other than Xid 45
    and ``incident_id`` that opened in [since, at]."""
    return db.execute(
        "select id, opened_at, title from incidents where gpu_id = ? and kind in ('xid', "
        "'gpu_lost') and id != ? and opened_at between ? and ? and "
        "json_extract(details, '$.xid') != 45 order by opened_at desc limit 1",
        [gpu_id, incident_id, since, at]).fetchone()


def last_reset_before(db: Database, gpu_id: str | None, at: int) -> int | None:
    """When the GPU's latest reset incident before ``at`` opened."""
    return db.execute("select max(opened_at) from incidents where kind = 'gpu_reset' and "
                      "gpu_id = ? and opened_at < ?", [gpu_id, at]).fetchone()[0]


def xids_between(db: Database, gpu_id: str | None, after: int, at: int) -> tuple[int, str]:
    """How many Xid or loss incidents of the GPU opened in (after, at], and their ids
    (comma-separated)."""
    return db.execute("select count(*), group_concat(id) from incidents where gpu_id = ? "
                      "and kind in ('xid', 'gpu_lost') and opened_at > ? and "
                      "opened_at <= ?", [gpu_id, after, at]).fetchone()


def effects_of(db: Database, incident_id: int) -> list[tuple]:
    """(id, kind, opened_at, title, summary, pid, start_time, details) of the rows that
    name ``incident_id`` as their cause, in order."""
    return db.execute("select id, kind, opened_at, title, summary, pid, start_time, details "
                      "from incidents where cause_id = ? order by opened_at, id",
                      [incident_id]).fetchall()


def cause_row(db: Database, cause_id: int) -> tuple | None:
    """(id, kind, opened_at, title) of a cause incident."""
    return db.execute("select id, kind, opened_at, title from incidents where id = ?",
                      [cause_id]).fetchone()
