"""One-minute rollups of the raw GPU samples: min/mean/max/p95 of gauges, the largest value
of counters and limits, the bitwise OR of the clock-event reasons.

Progress is the ``rollups_done_until`` mark in ``store_state``: every minute before it is
rolled up. A minute is rolled up once it ended ``settle`` seconds ago (late samples still
count); a sample later than that stays in the raw table but not in its minute. p95 is
the nearest-rank percentile: the ceil(0.95·n)-th smallest of the minute's n values. Means
are rounded to the column's unit (store/samples.py).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import cast

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.store.samples import STORAGE, Stored, rollup_columns

MINUTE_NS = 60 * NS_PER_SECOND
DONE_MARK = "rollups_done_until"


def p95(values: list[int]) -> int:
    """Nearest-rank 95th percentile of non-empty ``values``."""
    ordered = sorted(values)
    return ordered[math.ceil(0.95 * len(ordered)) - 1]


def _stats(stored: Stored, values: list[int]) -> list[int | None]:
    if not values:
        return [None] * len(rollup_columns(stored))
    if stored.rollup == "gauge":
        return [min(values), round(sum(values) / len(values)), max(values), p95(values)]
    if stored.rollup == "or":
        combined = 0
        for value in values:
            combined |= int(value)
        return [combined]
    return [max(values)]


def get_mark(db: Database, name: str) -> int | None:
    row = db.execute("SELECT value FROM store_state WHERE name = ?", [name]).fetchone()
    return row[0] if row else None


def set_mark(db: Database, name: str, value: int) -> None:
    db.execute("INSERT INTO store_state (name, value, updated_at) VALUES (?, ?, ?) "
               "ON CONFLICT(name) DO UPDATE SET value = excluded.value, "
               "updated_at = excluded.updated_at", [name, value, time.time_ns()])


def roll_up_minute(db: Database, minute: int) -> int:
    """Write the rollup rows of one minute (ns, a multiple of 60 s); returns rows written."""
    columns = [s.column for s in STORAGE]
    rows = db.execute(f"SELECT gpu, instance, {', '.join(columns)} FROM gpu_sample_data "
                      f"WHERE ts >= ? AND ts < ?", [minute, minute + MINUTE_NS]).fetchall()
    groups: dict[tuple[int, str], list[tuple]] = defaultdict(list)
    for row in rows:
        groups[(row[0], row[1])].append(row[2:])
    out_columns = [c for s in STORAGE for c in rollup_columns(s)]
    names = ["minute", "gpu", "instance", "samples", *out_columns]
    sql = (f"INSERT OR REPLACE INTO gpu_rollup_data ({', '.join(names)}) "
           f"VALUES ({', '.join('?' * len(names))})")
    for (gpu, instance), samples in groups.items():
        values: list[int | None] = []
        for i, stored in enumerate(STORAGE):
            values += _stats(stored, [s[i] for s in samples if s[i] is not None])
        db.execute(sql, [minute, gpu, instance, len(samples), *values])
    return len(groups)


def roll_up(db: Database, now_ns: int, settle: float = 30.0, max_minutes: int = 10) -> int:
    """Roll up at most ``max_minutes`` finished minutes after the mark, in one transaction;
    returns how many minutes were done (0 when there is nothing to do). Empty stretches
    (the service was down) are skipped, not walked minute by minute."""
    done = get_mark(db, DONE_MARK)
    limit = (now_ns - int(settle * NS_PER_SECOND)) // MINUTE_NS * MINUTE_NS
    count = 0
    with db.atomic():
        while count < max_minutes:
            first = db.execute("SELECT min(ts) FROM gpu_sample_data WHERE ts >= ?",
                               [done or 0]).fetchone()[0]
            if first is None:
                break
            minute = first // MINUTE_NS * MINUTE_NS
            if minute + MINUTE_NS > limit:
                break
            roll_up_minute(db, minute)
            done = minute + MINUTE_NS
            count += 1
        if count:
            set_mark(db, DONE_MARK, cast(int, done))     # set by the minutes just done
    return count

