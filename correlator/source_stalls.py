"""Stalled sources, as the correlator sees them: one log line when a stall starts, one when
it ends, and a count per source.

Judged by :func:`gpuwhy.stalls.judge` over the stored health rows, the one definition that
`gpuwhy status`, ``/healthz`` and ``/metrics`` use too; the counts travel in the
correlator's own health counters (``stalls:<source>``), where ``/metrics`` reads them.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.stalls import STALLED, STALLS_PREFIX, UPTIME_COUNTER, judge
from gpuwhy.store.queries import source_health

log = logging.getLogger(__name__)

OWN_ROWS = frozenset({"correlator", "store"})   # written by the correlator just before


class StallWatch:
    """``check(db)`` at each health beat; ``counters()`` for the correlator's health."""

    def __init__(self, config: Mapping[str, Any], started: int | None = None):
        self.config = config
        self.started = now_ns() if started is None else started
        self.stalls: Counter[str] = Counter()
        self.stalled_since: dict[str, int] = {}   # source -> when this correlator saw it stall

    def check(self, db: Database, now: int | None = None) -> None:
        now = now_ns() if now is None else now
        rows = judge(source_health(db), now, self.config, run_started=self.started)
        for row in rows:
            source = row["source"]
            if source in OWN_ROWS:
                continue
            if row["state"] == STALLED and source not in self.stalled_since:
                self.stalled_since[source] = now
                self.stalls[source] += 1
                log.warning("source %s stalled: %s", source, row["detail"])
            elif row["state"] != STALLED and source in self.stalled_since:
                lasted = (now - self.stalled_since.pop(source)) / NS_PER_SECOND
                log.info("source %s recovered after about %.0f s stalled: now %s", source,
                         lasted, row["state"])

    def counters(self) -> dict[str, int]:
        uptime = (now_ns() - self.started) // NS_PER_SECOND
        return {UPTIME_COUNTER: int(uptime),
                **{f"{STALLS_PREFIX}{source}": n for source, n in sorted(self.stalls.items())}}
