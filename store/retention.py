"""Retention: delete what is older than its window, in small batches of short transactions.

Windows (settings ``store.raw_days``, ``store.rollup_days``, ``store.event_days``):
raw samples and per-second tables; one-minute rollups; events, incidents, logs and exited
processes. Raw samples are only deleted once they are rolled up. Each batch deletes about
``batch`` rows through a time index in its own transaction, so the one writer (the
correlator, which calls this between its batches) is held up for a few ms at a time, and
readers are never blocked (WAL).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.store.rollups import DONE_MARK, get_mark

DAY_NS = 86_400 * NS_PER_SECOND

# (table, time column, window, ns per unit of the column); tables another part has not
# created are skipped.
TIMED: tuple[tuple[str, str, str, int], ...] = (
    ("gpu_sample_data", "ts", "raw", 1), ("gpu_processes", "ts", "raw", 1),
    ("sched_stats", "ts", "raw", 1), ("process_seconds", "second", "raw", NS_PER_SECOND),
    ("cuda_stats", "ts", "raw", 1), ("cuda_calls", "ts", "events", 1),
    ("engine_samples", "ts", "raw", 1),
    ("gpu_rollup_data", "minute", "rollup", 1),
    ("events", "ts", "events", 1), ("driver_calls", "ts", "events", 1),
    ("kernel_log", "ts", "events", 1), ("cron_runs", "ts", "events", 1),
    ("gpu_health_history", "ts", "events", 1),
    # the Python stacks behind a finding: kept as long as the incidents it belongs to
    ("python_stacks", "ts", "events", 1),
)
# Rows of a process go with it once it exited before the events window.
PROCESS_TABLES = ("device_fds", "gpu_bindings", "driver_call_stats", "engine_members", "processes")
INCIDENT_TABLES = (("incident_links", "incident_id"), ("incident_processes", "incident_id"),
                   ("incident_log", "incident_id"), ("incidents", "id"))


@dataclass(frozen=True)
class Windows:
    """How long each kind of row is kept, in days."""

    raw_days: float = 7.0
    rollup_days: float = 90.0
    event_days: float = 365.0

    def cutoff(self, window: str, now_ns: int) -> int:
        days = {"raw": self.raw_days, "rollup": self.rollup_days, "events": self.event_days}
        return now_ns - int(days[window] * DAY_NS)


@dataclass
class PruneResult:
    deleted: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    longest_batch_ms: float = 0.0
    done: bool = True   # False: the time budget ran out with rows still to delete

    def add(self, table: str, rows: int, seconds: float) -> None:
        if rows:
            self.deleted[table] = self.deleted.get(table, 0) + rows
        self.batches += 1
        self.longest_batch_ms = max(self.longest_batch_ms, seconds * 1000)


def delete_batch(db: Database, table: str, column: str, cutoff: int, batch: int) -> int:
    """Delete about ``batch`` of the oldest rows with ``column < cutoff`` (all rows sharing
    the last time go too); returns how many went."""
    with db.atomic():
        edge = db.execute(f"SELECT {column} FROM {table} WHERE {column} < ? "
                          f"ORDER BY {column} LIMIT 1 OFFSET ?", [cutoff, batch - 1]).fetchone()
        if edge is None:
            return db.execute(f"DELETE FROM {table} WHERE {column} < ?", [cutoff]).rowcount
        return db.execute(f"DELETE FROM {table} WHERE {column} <= ?", [edge[0]]).rowcount


def _delete_exited_processes(db: Database, cutoff: int, batch: int) -> int:
    with db.atomic():
        keys = db.execute("SELECT pid, start_time FROM processes WHERE exited_at < ? LIMIT ?",
                          [cutoff, batch]).fetchall()
        for table in PROCESS_TABLES:
            if db[table].exists():
                db.conn.executemany(f"DELETE FROM {table} WHERE pid = ? AND start_time = ?",
                                    keys)
    return len(keys)


def _delete_closed_incidents(db: Database, cutoff: int, batch: int) -> int:
    with db.atomic():
        ids = db.execute("SELECT id FROM incidents WHERE closed_at < ? LIMIT ?",
                         [cutoff, batch]).fetchall()
        for table, column in INCIDENT_TABLES:
            if db[table].exists():
                db.conn.executemany(f"DELETE FROM {table} WHERE {column} = ?", ids)
    return len(ids)


def raw_cutoff(db: Database, windows: Windows, now_ns: int) -> int:
    """Raw samples older than the window, but never ones not rolled up yet."""
    return min(windows.cutoff("raw", now_ns), get_mark(db, DONE_MARK) or 0)


def prune(db: Database, windows: Windows, now_ns: int, batch: int = 500,
          budget_s: float | None = None) -> PruneResult:
    """Delete expired rows, batch by batch, until none are left or ``budget_s`` seconds
    have gone by (then ``done`` is False and the next call goes on)."""
    result = PruneResult()
    started = time.monotonic()
    # (table, time column, cutoff, delete): delete_batch, or a (db, cutoff, batch) deleter
    jobs: list[tuple[str, str, int, Callable[..., int]]]
    jobs = [(table, column, (raw_cutoff(db, windows, now_ns) if table == "gpu_sample_data"
                             else windows.cutoff(window, now_ns)) // unit, delete_batch)
            for table, column, window, unit in TIMED if db[table].exists()]
    events_cutoff = windows.cutoff("events", now_ns)
    jobs += [("processes", "exited_at", events_cutoff, _delete_exited_processes),
             ("incidents", "closed_at", events_cutoff, _delete_closed_incidents)]
    for table, column, cutoff, run in jobs:
        while True:
            if budget_s is not None and time.monotonic() - started >= budget_s:
                result.done = False
                return result
            began = time.monotonic()
            if run is delete_batch:
                rows = run(db, table, column, cutoff, batch)
            else:
                rows = run(db, cutoff, batch)
            result.add(table, rows, time.monotonic() - began)
            if rows < batch:
                break
    return result


def shed_raw(db: Database, batch: int) -> int:
    """Delete the oldest batch of rolled-up raw samples, whatever their age (the store is
    over its size cap); returns rows deleted."""
    done = get_mark(db, DONE_MARK) or 0
    return delete_batch(db, "gpu_sample_data", "ts", done, batch)
