"""Alignment: the event-time watermark, lateness per source, and incidents awaiting late events.

Every event carries realtime ``ts`` (converted at its source; ``raw_ts`` keeps the source's
clock). The correlator's notion of "now" is the watermark: the newest ``ts`` seen, so that
replayed or delayed streams are judged by their own time. An event older than the watermark
by more than the lag is still stored, but chains that have settled no longer take it in:
it is counted per source as ``late_beyond_lag``. Incidents stay "settling" (rebuilt from the
store each batch) until ``settle_until``; at most ``pending_max`` at once, the oldest settling
first when there are more (counted as ``settled_early``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.events import Envelope
from gpuwhy.store import incident_rows


class Alignment:
    """Watermark and lateness accounting; ``observe`` each batch before deciding."""

    def __init__(self, lag_seconds: float, pending_max: int):
        self.lag_ns = int(lag_seconds * NS_PER_SECOND)
        self.pending_max = pending_max
        self.watermark = 0
        self.late: Counter[str] = Counter()          # by source: later than the lag
        self.reordered: Counter[str] = Counter()     # by source: older than the watermark
        self.future: Counter[str] = Counter()        # by source: ahead of the wall clock
        self.settled_early = 0

    def observe(self, envelopes: Iterable[Envelope], wall_ns: int | None = None) -> int:
        """Account for a batch; returns the new watermark. With ``wall_ns`` (live running) the
        watermark never lags the wall clock by more than the lag, and a source whose clock
        runs ahead cannot push it past the wall clock plus the lag."""
        watermark = self.watermark
        ahead = wall_ns + self.lag_ns if wall_ns is not None else None
        for envelope in envelopes:
            ts = envelope.event.ts
            if ahead is not None and ts > ahead:
                self.future[envelope.src] += 1
            elif ts >= watermark:
                watermark = ts
            else:
                self.reordered[envelope.src] += 1
                if ts < watermark - self.lag_ns:
                    self.late[envelope.src] += 1
        if wall_ns is not None:
            watermark = max(watermark, wall_ns - self.lag_ns)
        self.watermark = watermark
        return watermark

    def settling(self, db: Database) -> list[int]:
        """Ids of the incidents still taking late events, oldest first, at most pending_max;
        the ones past the bound are settled now."""
        ids = incident_rows.settling_ids(db, self.watermark)
        excess = len(ids) - self.pending_max
        if excess > 0:
            incident_rows.settle_now(db, ids[:excess])
            self.settled_early += excess
            ids = ids[excess:]
        return ids

    def counters(self) -> dict[str, int]:
        figures = {f"late_beyond_lag:{src}": n for src, n in self.late.items()}
        figures.update({f"reordered:{src}": n for src, n in self.reordered.items()})
        figures.update({f"clock_ahead:{src}": n for src, n in self.future.items()})
        figures["settled_early"] = self.settled_early
        return figures
