"""Process<->GPU binding intervals and process lineage, read for the decide stage.

A binding is a process holding a GPU's device file (written by the store's writer from
device opens) or listed by NVML as running on it; a process is found by its pid at a time
(never one that reused the pid) and its parents by their ppid. Plain values come back:
:class:`Binding`, :class:`gpuwhy.identity.ProcessKey`, GPU ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlite_utils import Database

from gpuwhy.identity import ProcessKey


@dataclass(frozen=True)
class Binding:
    """A process held a GPU (``gpu_id`` None: only nvidiactl, GPU not yet known) from
    ``since`` to ``until`` (None: still holds it)."""

    process: ProcessKey
    gpu_id: str | None
    since: int
    until: int | None
    evidence: str


def bound_at(db: Database, gpu_id: str, ts: int, slack_ns: int = 0) -> list[Binding]:
    """Processes that held ``gpu_id`` at ``ts`` (device fds or NVML's process list)."""
    rows = db.execute(
        "select pid, start_time, since, until, evidence from gpu_bindings where gpu_id = ? "
        "and since <= ? and (until is null or until >= ?) order by since",
        [gpu_id, ts + slack_ns, ts - slack_ns]).fetchall()
    found = {ProcessKey(r[0], r[1]): Binding(ProcessKey(r[0], r[1]), gpu_id, r[2], r[3], r[4])
             for r in rows}
    nvml = db.execute(
        "select pid, start_time, min(ts) from gpu_processes where gpu_id = ? and "
        "ts between ? and ? and start_time is not null group by pid, start_time",
        [gpu_id, ts - 5_000_000_000 - slack_ns, ts + slack_ns]).fetchall()
    for pid, start_time, first in nvml:
        key = ProcessKey(pid, start_time)
        found.setdefault(key, Binding(key, gpu_id, first, None, "in NVML's process list"))
    return list(found.values())


def gpu_unknown_at(db: Database, ts: int) -> list[ProcessKey]:
    """Processes holding only nvidiactl at ``ts``: their GPU is not known yet."""
    rows = db.execute(
        "select distinct f.pid, f.start_time from device_fds f where f.device = 'nvidiactl' "
        "and f.opened_at <= ? and (f.closed_at is null or f.closed_at >= ?) and not exists "
        "(select 1 from gpu_bindings b where b.pid = f.pid and b.start_time = f.start_time "
        "and b.since <= ? and (b.until is null or b.until >= ?))", [ts, ts, ts, ts]).fetchall()
    return [ProcessKey(*r) for r in rows]


def gpus_of(db: Database, process: ProcessKey, ts: int) -> list[str]:
    """GPUs ``process`` held at ``ts``."""
    rows = db.execute("select distinct gpu_id from gpu_bindings where pid = ? and start_time = ?"
                      " and since <= ? and (until is null or until >= ?)",
                      [process.pid, process.start_time, ts, ts]).fetchall()
    return [r[0] for r in rows]


def process_with_pid_at(db: Database, pid: int, ts: int) -> ProcessKey | None:
    """The process that had ``pid`` at ``ts`` — never one that reused the pid before or after."""
    for slack in (0, 1_000_000_000):
        row = db.execute(
            "select pid, start_time from processes where pid = ? and first_seen <= ? and "
            "(exited_at is null or exited_at >= ?) order by first_seen desc limit 1",
            [pid, ts + slack, ts - slack]).fetchone()
        if row:
            return ProcessKey(*row)
    return None


def parent_of(db: Database, process: ProcessKey) -> ProcessKey | None:
    """The parent process (exact key) of ``process``, from its ppid and start."""
    row = db.execute("select ppid, first_seen from processes where pid = ? and start_time = ?",
                     [process.pid, process.start_time]).fetchone()
    if not row or not row[0]:
        return None
    return process_with_pid_at(db, row[0], row[1])


def ancestry(db: Database, process: ProcessKey, depth: int = 8) -> list[ProcessKey]:
    """``process`` and its ancestors, nearest first (bounded: pid 1 or ``depth``)."""
    chain = [process]
    while len(chain) < depth:
        parent = parent_of(db, chain[-1])
        if parent is None or parent in chain or parent.pid <= 1:
            break
        chain.append(parent)
    return chain


def held_by_living(db: Database) -> list[tuple]:
    """(pid, start_time, gpu_id, bound since, comm, cmdline) of each living process that
    holds a GPU now, once a GPU."""
    return db.execute(
        "select b.pid, b.start_time, b.gpu_id, min(b.since), p.comm, p.cmdline "
        "from gpu_bindings b "
        "join processes p on p.pid = b.pid and p.start_time = b.start_time "
        "where b.until is null and p.exited_at is null "
        "group by b.pid, b.start_time, b.gpu_id").fetchall()
