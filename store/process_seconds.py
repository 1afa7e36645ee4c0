"""Process seconds: write the per-second rows the decide stage folds, read timelines back.

A process second (``process_seconds``) holds the process's ioctl count and rate by operation,
on-CPU / run-queue / sleep / blocked time of its own threads and of its workers, its
per-process GPU utilisation where NVML has it, and its CUDA launches, syncs, copies and
allocations where the CUDA uprobes are on. The decide stage
(:class:`gpuwhy.correlator.timeline.TimelineBuilder`) computes the values; this module holds
every statement that reads or writes them, and the scheduler totals the stall check
classifies.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.identity import ProcessKey

# Columns a batch's sched_stats and driver_call_stats events fold into (write_held).
SCHED_COLUMNS = ("on_cpu_ms", "runqueue_ms", "sleep_ms", "blocked_ms", "workers_on_cpu_ms",
                 "workers_runqueue_ms", "workers_blocked_ms")
HELD_COLUMNS = (*SCHED_COLUMNS, "ioctls", "ioctl_ops")
# A held second sets only the columns it has: None leaves the stored value (a computed one
# is never None), so seconds with and without ioctls share one statement.
_WRITE_HELD = (f"insert into process_seconds (pid, start_time, second, "
               f"{', '.join(HELD_COLUMNS)}) values ({', '.join('?' * (3 + len(HELD_COLUMNS)))})"
               f" on conflict(pid, start_time, second) do update set "
               + ", ".join(f"{c} = coalesce(excluded.{c}, {c})" for c in HELD_COLUMNS))
_READ_HELD = (f"select pid, start_time, second, {', '.join(SCHED_COLUMNS)}, ioctl_ops "
              f"from process_seconds where (pid, start_time, second) in (values {{}})")
_READ_HELD_CHUNK = 300      # seconds a read asks for (3 bound values each; SQLite allows 32766)

SecondKey = tuple[int, int, int]       # (pid, start_time, second)


def upsert_second(db: Database, key: ProcessKey, second: int, values: dict,
                  add: bool = False) -> None:
    """Set (or with ``add``, add to) the columns of one process second."""
    names = ", ".join(values)
    updates = ", ".join(f"{n} = coalesce({n}, 0) + excluded.{n}" if add else
                        f"{n} = excluded.{n}" for n in values)
    db.execute(f"insert into process_seconds (pid, start_time, second, {names}) values "
               f"(?, ?, ?, {', '.join('?' * len(values))}) on conflict(pid, start_time, "
               f"second) do update set {updates}",
               [key.pid, key.start_time, second, *values.values()])


def read_held(db: Database, keys: Sequence[SecondKey]) -> dict[SecondKey, tuple]:
    """The stored SCHED_COLUMNS and ioctl_ops of each second in ``keys`` that has a row."""
    stored: dict[SecondKey, tuple] = {}
    for first in range(0, len(keys), _READ_HELD_CHUNK):   # a read per chunk, not a second
        chunk = keys[first:first + _READ_HELD_CHUNK]
        sql = _READ_HELD.format(", ".join(["(?, ?, ?)"] * len(chunk)))
        for row in db.conn.execute(sql, [value for key in chunk for value in key]):
            stored[row[:3]] = row[3:]
    return stored


def write_held(db: Database, rows: Iterable[Sequence]) -> None:
    """Write held seconds: each row is (pid, start_time, second, *HELD_COLUMNS' values), a
    None value leaving the stored one."""
    db.conn.executemany(_WRITE_HELD, rows)


def sched_totals(db: Database, key: ProcessKey, since: int,
                 until: int) -> tuple[float | None, ...] | None:
    """The process's own on-CPU, blocked, sleep and run-queue ns, and its workers' on-CPU ns,
    summed over [since, until + 1 s] of its sched_stats (all None: no scheduler data)."""
    return db.execute(
        "select sum(own_on_cpu_ns), sum(own_blocked_ns), sum(own_sleep_ns), "
        "sum(own_runqueue_ns), sum(workers_on_cpu_ns) from sched_stats where pid = ? and "
        "start_time = ? and ts between ? and ?",
        [key.pid, key.start_time, since, until + NS_PER_SECOND]).fetchone()


def process_timeline(db: Database, key: ProcessKey, since: int, until: int) -> list[dict]:
    """The process's seconds in [since, until] (realtime ns), with its GPU's counters."""
    return db.execute_returning_dicts(
        "select s.*, g.gpu_util as gpu_util, g.sm_active as gpu_sm_active from "
        "process_seconds s left join gpu_bindings b on b.pid = s.pid and "
        "b.start_time = s.start_time and b.since <= s.second * 1000000000 and "
        "(b.until is null or b.until >= s.second * 1000000000) left join gpu_samples g on "
        "g.gpu_id = b.gpu_id and g.instance = '' and g.ts / 1000000000 = s.second "
        "where s.pid = ? and s.start_time = ? and s.second between ? and ? order by s.second",
        [key.pid, key.start_time, since // NS_PER_SECOND, until // NS_PER_SECOND])


def gpu_timeline(db: Database, gpu_id: str, since: int, until: int) -> list[dict]:
    """The GPU's samples in [since, until], one per second, plus its events."""
    return db.execute_returning_dicts(
        "select ts / 1000000000 as second, * from gpu_samples where gpu_id = ? and "
        "instance = '' and ts between ? and ? order by ts", [gpu_id, since, until])
