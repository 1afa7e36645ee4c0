"""Each GPU's latest busy sample, for the stall check, without scanning the store for it.

A process stalls when its GPU goes idle after being busy since the process bound it. The
check asked the store for the GPU's latest sample above the threshold since the binding,
twice a second for each bound process: a scan of every GPU's samples since then (the
samples' key is time first), which for a week-long job on an 8-GPU host is millions of rows
a check, a cost that grew with the job's age. The decide stage sees every sample the store
takes, so the latest busy one is noted as it passes; what the store held before this
process started is read once per GPU, newest first.
"""

from __future__ import annotations

from sqlite_utils import Database

from gpuwhy.events import GpuSample
from gpuwhy.store import gpu_activity
from gpuwhy.store.samples import BY_FIELD

_UTIL = BY_FIELD["gpu_util"]


class LastBusy:
    """The latest sample of each GPU (any instance) whose stored ``gpu_util`` is above
    ``threshold``, as the store's ``gpu_samples`` view would find it."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self._seen: dict[str, int] = {}             # from the samples the decide stage saw
        self._stored: dict[str, int | None] = {}    # read once from the store, per GPU

    def observe(self, db: Database, event: GpuSample) -> None:
        """Note a GPU sample (already written by the store's writer)."""
        util = event.fields.get("gpu_util")
        # compared as stored (an integer percent), so that this and the store agree
        if util is not None and _UTIL.encode(util) / _UTIL.scale > self.threshold and \
                event.ts > self._seen.get(event.gpu_id, -1):
            self._seen[event.gpu_id] = event.ts

    def latest(self, db: Database, gpu_id: str, since: int, now: int) -> int | None:
        """The time of the GPU's latest busy sample in [since, now], or None."""
        seen = self._seen.get(gpu_id)
        if seen is not None and seen > now:     # ahead of the watermark: the store knows
            return gpu_activity.latest_busy(db, gpu_id, self.threshold, since, now)
        if gpu_id not in self._stored:          # what came before this process started
            self._stored[gpu_id] = gpu_activity.latest_busy(db, gpu_id, self.threshold,
                                                            None, now)
        found = [ts for ts in (seen, self._stored[gpu_id]) if ts is not None]
        busy = max(found) if found else None
        return busy if busy is not None and busy >= since else None
