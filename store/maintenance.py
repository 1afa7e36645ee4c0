"""The store's periodic job, run by its one writer between batches: roll up finished
minutes, delete what is past retention, check the size against the cap, report health.

Each ``step`` does a bounded slice of work (``STEP_BUDGET_S``) in short transactions and
says whether more is waiting, so the correlator calls it again at once instead of waiting
for the next interval. Crossing the warning level or the cap is logged once per crossing.

The first step, and one a day after it, runs SQLite's ``PRAGMA quick_check`` over the whole
file (about a second per GB here): a store with corrupt pages otherwise runs on and reads
"ok" until a query happens on a bad page. A failed check makes the store's health
``failed`` until a later check passes.
"""

from __future__ import annotations

import logging
import sqlite3
import time

from sqlite_utils import Database

from gpuwhy.clock import now_ns as wall_now_ns
from gpuwhy.config import Config
from gpuwhy.store.budget import SizeReport, measure
from gpuwhy.store.retention import Windows, prune, shed_raw
from gpuwhy.store.rollups import roll_up

log = logging.getLogger(__name__)

STEP_BUDGET_S = 0.02      # work per step; each transaction inside is a few ms
INTEGRITY_EVERY_S = 86400.0   # the quick check's period, after the one at start
INTEGRITY_LINES = 20      # problems a failed check reports at most
ROLLUP_MINUTES_PER_STEP = 1   # one transaction: 5–15 ms a minute for 8 GPUs


class Maintenance:
    """Rollups, retention and the size check for one store; ``step()`` from the writer."""

    def __init__(self, config: Config, db: Database):
        self.db = db
        self.interval: float = config["store.maintenance_interval"]
        self.windows = Windows(config["store.raw_days"], config["store.rollup_days"],
                               config["store.event_days"])
        self.cap_mb: float = config["store.max_mb"]
        self.warn_fraction: float = config["store.warn_fraction"]
        self.batch: int = config["store.prune_batch"]
        self.size: SizeReport | None = None
        self.error: str | None = None
        self.totals = {"pruned_rows": 0, "rolled_up_minutes": 0, "shed_raw_rows": 0,
                       "maintenance_errors": 0}
        self.longest_batch_ms = 0.0
        self.integrity: list[str] = []        # what the last quick check found wrong
        self.next_integrity = 0.0             # monotonic s: at the first step
        self.totals.update(integrity_checks=0, integrity_check_ms=0)

    def check_integrity(self) -> list[str]:
        """Run the quick check now; its problems (empty: the pages are sound)."""
        started = time.monotonic()
        self.integrity = quick_check(self.db)
        self.totals["integrity_checks"] += 1
        self.totals["integrity_check_ms"] = round((time.monotonic() - started) * 1000)
        self.next_integrity = time.monotonic() + INTEGRITY_EVERY_S
        if self.integrity:
            log.error("store integrity check failed: %s", "; ".join(self.integrity[:3]))
        return self.integrity

    def step(self, now_ns: int | None = None) -> bool:
        """One slice of work; True when more is waiting (call again soon)."""
        now_ns = wall_now_ns() if now_ns is None else now_ns
        if time.monotonic() >= self.next_integrity:
            self.check_integrity()
        try:
            more = self._step(now_ns)
        except Exception as exc:  # noqa: BLE001 - maintenance must never stop the writer
            self.totals["maintenance_errors"] += 1
            if self.error is None:
                log.exception("store maintenance failed")
            self.error = str(exc)
            return False
        self.error = None
        return more

    def _step(self, now_ns: int) -> bool:
        started = time.monotonic()
        minutes = roll_up(self.db, now_ns, max_minutes=ROLLUP_MINUTES_PER_STEP)
        self.totals["rolled_up_minutes"] += minutes
        left = max(STEP_BUDGET_S - (time.monotonic() - started), 0.001)
        result = prune(self.db, self.windows, now_ns, self.batch, budget_s=left)
        self.totals["pruned_rows"] += sum(result.deleted.values())
        self.longest_batch_ms = max(self.longest_batch_ms, result.longest_batch_ms)
        self._check_size()
        shed = 0
        if self.size is not None and self.size.state == "over":
            shed = shed_raw(self.db, self.batch)
            self.totals["shed_raw_rows"] += shed
        return minutes == ROLLUP_MINUTES_PER_STEP or not result.done or shed > 0

    def _check_size(self) -> None:
        before = self.size.state if self.size else "ok"
        self.size = measure(self.db, self.cap_mb, self.warn_fraction)
        after = self.size.state
        if after != before:
            if after == "over":
                log.error("store over its size cap: %s; deleting the oldest raw samples",
                          self.size.describe())
            elif after == "warning":
                log.warning("store nearing its size cap: %s", self.size.describe())
            else:
                log.info("store back under its size warning level: %s", self.size.describe())

    def health(self) -> tuple[str, str, dict[str, int]]:
        """(state, detail, counters) for the ``store`` row of source_health."""
        counters = dict(self.totals)
        if self.integrity:
            more = f" (and {len(self.integrity) - 1} more)" if len(self.integrity) > 1 else ""
            return ("failed", f"integrity check failed: {self.integrity[0]}{more}; stop "
                    "gpuwhy and run `gpuwhy db check`, then restore or move the store aside",
                    counters)
        if self.size is None:
            return ("ok" if self.error is None else "degraded",
                    self.error or "size not checked yet", counters)
        counters.update(used_bytes=self.size.used_bytes, wal_bytes=self.size.wal_bytes,
                        cap_bytes=self.size.cap_bytes,
                        longest_prune_batch_us=round(self.longest_batch_ms * 1000))
        if self.error:
            return "degraded", f"maintenance failed: {self.error}", counters
        state = "ok" if self.size.state == "ok" else "degraded"
        # the disk's free space is read live by whoever shows this row (gpuwhy.app.status)
        return state, f"{self.size.state}: {self.size.describe(disk=False)}", counters


def quick_check(db: Database) -> list[str]:
    """``PRAGMA quick_check``'s findings on ``db``: empty when its pages are sound (a file
    SQLite cannot read at all is one finding, not an exception)."""
    try:
        rows = [str(row[0]) for row in
                db.execute(f"PRAGMA quick_check({INTEGRITY_LINES})").fetchall()]
    except sqlite3.DatabaseError as exc:
        return [str(exc)]
    if rows == ["ok"]:
        return []
    # SQLite may put several findings in one row, under a "*** in database main ***" line
    lines = [line for row in rows for line in row.splitlines()
             if line.strip() and not line.startswith("***")]
    return lines[:INTEGRITY_LINES] or rows
