"""What `gpuwhy demo` waits for in its private store, read as the pipeline writes it: the
simulated GPU seen and its process bound, the cron job run, the reset's driver call, the
scenario's incident and its links, and the training process's recent timeline. Harness reads
(``gpuwhy.app.demo.scenarios``), each one statement, each polled until it answers."""

from __future__ import annotations

from typing import cast

from sqlite_utils import Database


def gpu_of_minor(db: Database, minor: int) -> tuple[str, str] | None:
    """The GPU known by device minor ``minor``: its id and its PCI address (from its
    ``pci:`` alias), or None before the GPU is seen with both."""
    row = db.execute("select a.gpu_id, substr(a.alias, 5) from gpu_aliases a join "
                     "gpu_aliases m on m.gpu_id = a.gpu_id and m.alias = ? "
                     "where a.alias like 'pci:%'", [f"minor:{minor}"]).fetchone()
    return cast("tuple[str, str] | None", row)


def alias_known(db: Database, alias: str) -> bool:
    """Some GPU is known by ``alias`` (``minor:0``)."""
    return db.execute("select 1 from gpu_aliases where alias = ?", [alias]).fetchone() is not None


def bound_gpu(db: Database, pid: int) -> str | None:
    """A GPU the process ``pid`` is bound to, or None."""
    row = db.execute("select gpu_id from gpu_bindings where pid = ?", [pid]).fetchone()
    return row[0] if row else None


def cron_run_started(db: Database, command_part: str) -> tuple[int, int] | None:
    """The job pid and time of a started cron run whose command holds ``command_part``, or
    None before one is stored."""
    row = db.execute("select job_pid, ts from cron_runs where command like ? "
                     "and phase = 'started'", [f"%{command_part}%"]).fetchone()
    return cast("tuple[int, int] | None", row)


def driver_call_pid(db: Database, sub_name: str) -> int | None:
    """The pid of a process whose driver call ``sub_name`` (an RM control's name) is
    stored, or None."""
    row = db.execute("select pid from driver_calls where sub_name = ?", [sub_name]).fetchone()
    return row[0] if row else None


def incident_of_kind(db: Database, kind: str) -> int | None:
    """The id of an incident of ``kind`` (``gpu_reset``, ``gpu_lost``), or None."""
    row = db.execute("select id from incidents where kind = ?", [kind]).fetchone()
    return row[0] if row else None


def has_link(db: Database, incident_id: int, kind: str) -> bool:
    """The incident's chain holds a link of ``kind`` (``process_stall``, ``process_exit``)."""
    return db.execute("select 1 from incident_links where incident_id = ? and kind = ?",
                      [incident_id, kind]).fetchone() is not None


def rule_finding_incident(db: Database, pid: int, rule_id: str) -> int | None:
    """The id of the first incident of rule ``rule_id``'s finding on process ``pid``, or
    None."""
    row = db.execute("select id from incidents where kind = 'rule_finding' and pid = ? and "
                     "json_extract(details, '$.rule_id') = ? order by id limit 1",
                     [pid, rule_id]).fetchone()
    return row[0] if row else None


def root_incidents_after(db: Database, after_id: int) -> list[tuple[int, str]]:
    """Incidents with no cause (``cause_id`` null) newer than ``after_id``: id and title, in
    order."""
    return db.execute("select id, title from incidents where id > ? and cause_id is null "
                      "order by id", [after_id]).fetchall()


def recent_figures(db: Database, pid: int, seconds: int = 30
                   ) -> tuple[float | None, float | None, float | None] | None:
    """The process's last ``seconds`` of timeline: its GPU's mean utilization (%), the cores
    its workers used, and the share of its time the main thread slept; each None when there
    is nothing to average."""
    row = db.execute(
        "select avg(g.gpu_util), avg(s.workers_on_cpu_ms) / 1000, avg(s.sleep_ms) / "
        "nullif(avg(s.sleep_ms + s.on_cpu_ms + s.runqueue_ms + s.blocked_ms), 0) "
        "from process_seconds s left join gpu_samples g on g.ts / 1000000000 = s.second and "
        "g.instance = '' and g.gpu_id = (select gpu_id from gpu_bindings where pid = ? limit 1) "
        "where s.pid = ? and s.second >= (select max(second) from process_seconds where "
        "pid = ?) - ?", [pid, pid, pid, seconds]).fetchone()
    return cast("tuple[float | None, float | None, float | None] | None", row)
