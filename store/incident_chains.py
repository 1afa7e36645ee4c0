"""Incident chains in the store: every fact a chain is decided from, read in one call, and
the chain written back.

:func:`chain_facts` reads an incident's :class:`ChainFacts` (the incident, its effects, the
reset calls and what ran their callers, earlier and later Xids, the processes on the GPU,
process names); :mod:`gpuwhy.correlator.chains` decides the links from those values alone,
and :func:`store_chain` writes the links, the processes they name and the chain's summary on
the incident, in the batch's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.identity import ProcessKey
from gpuwhy.reset import RESET_CONTROLS, sql_names
from gpuwhy.store import gpu_bindings, gpu_identity

CAUSE_LOOKBACK_NS = 30 * NS_PER_SECOND  # how far before a reset or Xid its cause is looked for
CRON_LOOKBACK_NS = 3600 * NS_PER_SECOND  # a cron run without its job's start, matched by pid


@dataclass(frozen=True)
class ResetCall:
    """A reset control call to the driver: the row of ``driver_calls``, and the GPUs its
    process held when the call returned."""

    id: int
    ts: int                   # when the call returned
    process: ProcessKey
    path: str
    sub_name: str
    op: str
    status_name: str
    latency_ns: int | None
    gpus: tuple[str, ...] = ()

    @property
    def made(self) -> int:
        """When the call was made: its return less its latency."""
        return self.ts - max(0, self.latency_ns or 0)


@dataclass(frozen=True)
class Origin:
    """What ran a process, as known when a call was made: its latest exec, its ancestry
    (itself first), the cron run of the nearest ancestor a cron job ran (``cron_depth``: that
    ancestor's place in the ancestry), its cgroup and uid."""

    exec_event: tuple[int, int, str] | None = None   # (event id, ts, body)
    ancestry: tuple[ProcessKey, ...] = ()
    # (cursor, ts, user, command, gpu_action, job_pid, job_start_time)
    cron_run: tuple | None = None
    cron_depth: int = 0
    cgroup: tuple[str | None, int | None] | None = None


@dataclass(frozen=True)
class Effect:
    """An incident that names another as its cause."""

    id: int
    kind: str
    ts: int                   # when it opened
    title: str
    summary: str
    pid: int | None
    start_time: int | None
    details: str | None

    @property
    def process(self) -> ProcessKey | None:
        """The process it names, None when it names none. Its start may be unknown (an Xid
        line names only a pid): that key matches no process of the store, as it should."""
        if self.pid is None:
            return None
        return ProcessKey(self.pid, self.start_time)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ChainFacts:
    """Everything an incident's chain is decided from. Only what the incident's kind can use
    is read; the rest stays empty."""

    incident: Mapping[str, Any]     # the incident's row, every column
    names: Mapping[ProcessKey, str] = field(default_factory=dict)
    # a reset: the reset calls around it, the GPU's device minors, what ran each caller
    reset_calls: tuple[ResetCall, ...] = ()
    minors: tuple[int, ...] = ()
    origins: Mapping[int, Origin] = field(default_factory=dict)    # by reset call id
    # an Xid: the earlier Xid an Xid 45 follows (id, opened_at, title); the GPU's last reset
    # before it, and the Xid incidents since then (count, comma-separated ids)
    earlier_xid: tuple[int, int, str] | None = None
    last_reset: int | None = None
    xids_since_reset: tuple[int, str] | None = None
    # a stall or death: its cause (id, kind, opened_at, title)
    cause: tuple[int, str, int, str] | None = None
    effects: tuple[Effect, ...] = ()
    bound: tuple[ProcessKey, ...] = ()     # processes on the GPU when the incident opened

    @property
    def details(self) -> dict[str, Any]:
        """The incident's details, decoded."""
        return json.loads(self.incident["details"] or "{}")

    def name(self, key: ProcessKey) -> str:
        """The process's comm (else its executable's name), or ``?``."""
        return self.names.get(key, "?")


def finding_processes(details: Mapping[str, Any]) -> list[ProcessKey]:
    """The processes a rule finding names (``details["processes"]``), those with a whole key."""
    found = []
    for named in details.get("processes") or []:
        try:
            found.append(ProcessKey(int(named["pid"]), int(named["start_time"])))
        except (KeyError, TypeError, ValueError):
            continue
    return found


def chain_facts(db: Database, incident_id: int) -> ChainFacts:
    """The facts the incident's chain is decided from, read by its kind.

    Every rebuild of a settling incident reads them, so only what its kind can use is read.
    Which reset call caused a reset is the decision's, so what ran each caller is read:
    they are few (the reset calls of a 30-second window)."""
    row = incident(db, incident_id)
    kind, gpu_id, at = row["kind"], row["gpu_id"], row["opened_at"]
    details = json.loads(row["details"] or "{}")
    facts: dict[str, Any] = {}
    named: list[ProcessKey] = []
    if kind == "gpu_reset":
        calls = tuple(_reset_call(db, r, gpu_id) for r in
                      _reset_calls(db, at - CAUSE_LOOKBACK_NS, row["last_seen"]))
        facts["reset_calls"] = calls
        facts["minors"] = tuple(gpu_identity.minors_of(db, gpu_id)) \
            if gpu_id is not None and calls else ()
        origins = {call.id: _origin(db, call.process, call.made) for call in calls}
        facts["origins"] = origins
        named += [call.process for call in calls]
    elif kind in ("xid", "gpu_lost"):
        if details.get("xid") == 45:
            facts["earlier_xid"] = _earlier_xid(db, gpu_id, incident_id, at - CAUSE_LOOKBACK_NS,
                                               at)
        last = _last_reset_before(db, gpu_id, at)
        facts["last_reset"] = last
        if last is not None:
            facts["xids_since_reset"] = _xids_between(db, gpu_id, last, at)
        if row["pid"] is not None:
            named.append(ProcessKey(row["pid"], row["start_time"]))
    elif kind in ("process_stall", "process_exit"):
        if row.get("cause_id") is not None:
            facts["cause"] = _cause_row(db, row["cause_id"])
    elif kind == "rule_finding":
        named += finding_processes(details)
    if kind in ("gpu_reset", "xid", "gpu_lost", "rule_finding"):
        effects = tuple(Effect(*r) for r in _effects_of(db, incident_id))
        facts["effects"] = effects
        named += [e.process for e in effects if e.process is not None]
        if gpu_id is not None and kind != "rule_finding":
            bound = tuple(b.process for b in gpu_bindings.bound_at(db, gpu_id, at))
            facts["bound"] = bound
            named += bound
    return ChainFacts(row, process_names(db, named), **facts)


def _reset_call(db: Database, row: tuple, gpu_id: str | None) -> ResetCall:
    key = ProcessKey(row[2], row[3])
    held = tuple(gpu_bindings.gpus_of(db, key, row[1])) if gpu_id is not None else ()
    return ResetCall(row[0], row[1], key, row[4], row[5], row[6], row[7], row[8], held)


def _origin(db: Database, key: ProcessKey, at: int) -> Origin:
    ancestry = tuple(gpu_bindings.ancestry(db, key))
    for depth, process in enumerate(ancestry):
        run = _cron_run_of(db, process, at - CRON_LOOKBACK_NS, at)
        if run:
            return Origin(_last_exec(db, key, at), ancestry, run, depth, None)
    return Origin(_last_exec(db, key, at), ancestry, None, 0, _cgroup_and_uid(db, key))


def process_names(db: Database, keys: Iterable[ProcessKey]) -> dict[ProcessKey, str]:
    """Each process's comm (else its executable's name); those not found are left out."""
    wanted = set(keys)
    if not wanted:
        return {}
    pids = sorted({key.pid for key in wanted})
    names = {}
    # by pid, a few hundred to a statement (SQLite bounds its parameters), then the exact keys
    for at in range(0, len(pids), 500):
        some = pids[at:at + 500]
        rows = db.execute("select pid, start_time, coalesce(nullif(comm, ''), exe_filename, "
                          f"'?') from processes where pid in ({', '.join('?' * len(some))})",
                          some).fetchall()
        names.update({ProcessKey(pid, start): name for pid, start, name in rows
                      if ProcessKey(pid, start) in wanted and name})
    return names


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


def _reset_calls(db: Database, since: int, until: int) -> list[tuple]:
    """(id, ts, pid, start_time, path, sub_name, op, status_name, latency_ns) of each reset
    control call in [since, until], oldest first."""
    return db.execute(
        "select id, ts, pid, start_time, path, sub_name, op, status_name, latency_ns "
        "from driver_calls "
        f"where sub_name in {sql_names(RESET_CONTROLS)} and ts between ? and ? order by ts",
        [since, until]).fetchall()


def _last_exec(db: Database, key: ProcessKey, at: int) -> tuple | None:
    """(event id, ts, body) of the process's latest exec at or before ``at``."""
    return db.execute("select id, ts, body from events where kind = 'process_exec' and pid = ? "
                      "and start_time = ? and ts <= ? order by ts desc limit 1",
                      [key.pid, key.start_time, at]).fetchone()


def _cron_run_of(db: Database, process: ProcessKey, since: int, at: int) -> tuple | None:
    """(cursor, ts, user, command, gpu_action, job_pid, job_start_time) of the latest cron
    run whose job is ``process`` (by its key, or by its pid in [since, at] when the run's
    start is unknown)."""
    return db.execute(
        "select cursor, ts, user, command, gpu_action, job_pid, job_start_time from "
        "cron_runs where phase = 'started' and job_pid = ? and (job_start_time = ? or "
        "(job_start_time is null and ts between ? and ?)) order by ts desc limit 1",
        [process.pid, process.start_time, since, at]).fetchone()


def _cgroup_and_uid(db: Database, key: ProcessKey) -> tuple | None:
    """(cgroup, uid) of the process; None when it is not known."""
    return db.execute("select cgroup, uid from processes where pid = ? and start_time = ?",
                      [key.pid, key.start_time]).fetchone()


def _earlier_xid(db: Database, gpu_id: str | None, incident_id: int, since: int,
                at: int) -> tuple | None:
    """(id, opened_at, title) of the GPU's latest Xid or loss incident other than Xid 45
    and ``incident_id`` that opened in [since, at]."""
    return db.execute(
        "select id, opened_at, title from incidents where gpu_id = ? and kind in ('xid', "
        "'gpu_lost') and id != ? and opened_at between ? and ? and "
        "json_extract(details, '$.xid') != 45 order by opened_at desc limit 1",
        [gpu_id, incident_id, since, at]).fetchone()


def _last_reset_before(db: Database, gpu_id: str | None, at: int) -> int | None:
    """When the GPU's latest reset incident before ``at`` opened."""
    return db.execute("select max(opened_at) from incidents where kind = 'gpu_reset' and "
                      "gpu_id = ? and opened_at < ?", [gpu_id, at]).fetchone()[0]


def _xids_between(db: Database, gpu_id: str | None, after: int, at: int) -> tuple[int, str]:
    """How many Xid or loss incidents of the GPU opened in (after, at], and their ids
    (comma-separated)."""
    return db.execute("select count(*), group_concat(id) from incidents where gpu_id = ? "
                      "and kind in ('xid', 'gpu_lost') and opened_at > ? and "
                      "opened_at <= ?", [gpu_id, after, at]).fetchone()


def _effects_of(db: Database, incident_id: int) -> list[tuple]:
    """(id, kind, opened_at, title, summary, pid, start_time, details) of the rows that
    name ``incident_id`` as their cause, in order."""
    return db.execute("select id, kind, opened_at, title, summary, pid, start_time, details "
                      "from incidents where cause_id = ? order by opened_at, id",
                      [incident_id]).fetchall()


def _cause_row(db: Database, cause_id: int) -> tuple | None:
    """(id, kind, opened_at, title) of a cause incident."""
    return db.execute("select id, kind, opened_at, title from incidents where id = ?",
                      [cause_id]).fetchone()
