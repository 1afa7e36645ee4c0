"""Chart series downsampled on the server: at most ``points`` buckets, each the mean of the
samples in it, so a 7-day chart costs the same as a 5-minute one.

GPU series read the store's views: raw samples (``gpu_samples``) for buckets shorter than a
minute, one-minute rollups (``gpu_rollups``, weighted by their sample counts) for longer
ones where rolled up, raw samples after the last rolled-up minute. Clock-event reasons are
bitmasks: a bucket gets the OR of its values, never a mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.identity import ProcessKey
from gpuwhy.store.rollups import DONE_MARK, MINUTE_NS, get_mark

RANGES = {"5m": 300, "15m": 900, "1h": 3600, "6h": 21600, "24h": 86400, "7d": 604800}

# (field, multiplier): *_active ratios are shown as % like gpu_util.
GPU_FIELDS: tuple[tuple[str, float], ...] = (
    ("gpu_util", 1), ("sm_active", 100), ("tensor_active", 100), ("dram_active", 100),
    ("gr_engine_active", 100), ("mem_util", 1), ("enc_util", 1), ("dec_util", 1),
    ("pcie_tx_bytes_per_s", 1), ("pcie_rx_bytes_per_s", 1), ("nvlink_tx_bytes_per_s", 1),
    ("nvlink_rx_bytes_per_s", 1), ("power_w", 1), ("power_limit_w", 1), ("sm_clock_mhz", 1),
    ("mem_clock_mhz", 1), ("temp_c", 1), ("fb_used_mib", 1),
)
# Fields the rollups keep as one column (largest value), not min/mean/max/p95.
_ROLLUP_SINGLE = {"power_limit_w"}
PROCESS_FIELDS = ("ioctls", "on_cpu_ms", "runqueue_ms", "sleep_ms", "blocked_ms",
                  "workers_on_cpu_ms", "workers_runqueue_ms", "workers_blocked_ms", "sm_util",
                  "used_memory_mib", "cuda_launches", "cuda_sync_ms")


@dataclass(frozen=True)
class Window:
    since: int
    until: int
    bucket_ns: int


def window(until: int, seconds: int, points: int, since: int | None = None) -> Window:
    """[since, until) in ns and a bucket width giving at most ``points`` buckets (≥ 1 s)."""
    since = until - seconds * NS_PER_SECOND if since is None else since
    span = max(until - since, NS_PER_SECOND)
    bucket = max(NS_PER_SECOND, -(-span // max(points, 1)))
    return Window(since, until, bucket)


def _or(values: str | None) -> int | None:
    if values is None:
        return None
    combined = 0
    for value in str(values).split(","):
        combined |= int(float(value))
    return combined


def _raw_gpu(db: Database, gpu_id: str, w: Window, since: int) -> list[list]:
    averages = ", ".join(f"avg({name}) * {scale}" for name, scale in GPU_FIELDS)
    cursor = db.execute(
        f"select (ts - ?) / ? as b, min(ts), {averages}, "
        f"group_concat(distinct clocks_event_reasons) from gpu_samples where gpu_id = ? and "
        f"instance = '' and ts >= ? and ts < ? group by b order by b",
        [w.since, w.bucket_ns, gpu_id, since, w.until])
    return [list(row) for row in cursor.fetchall()]


def _rolled_gpu(db: Database, gpu_id: str, w: Window, until: int, since: int) -> list[list]:
    def mean(name: str, scale: float) -> str:
        if name in _ROLLUP_SINGLE:
            return f"max({name}) * {scale}"
        return f"sum({name}_mean * samples) / sum(samples) * {scale}"

    columns = ", ".join(mean(name, scale) for name, scale in GPU_FIELDS)
    cursor = db.execute(
        f"select (minute - ?) / ? as b, min(minute), {columns}, "
        f"group_concat(distinct clocks_event_reasons) from gpu_rollups where gpu_id = ? and "
        f"instance = '' and minute >= ? and minute < ? group by b order by b",
        [w.since, w.bucket_ns, gpu_id, since, until])
    return [list(row) for row in cursor.fetchall()]


def tail_start(w: Window, after: int) -> int:
    """The start of the bucket of ``w`` that holds ``after``: a live chart's last bucket
    (perhaps not complete when it was drawn) and those after it are what it asks again."""
    return w.since + max(0, after - w.since) // w.bucket_ns * w.bucket_ns


def gpu_series(db: Database, gpu_id: str, w: Window, after: int | None = None) -> dict:
    """``{"fields": [...], "rows": [[ts, value, ...], ...], "bucket_s", "from_rollups"}``;
    ``ts`` is the first sample's time in the bucket (ns). ``after``: only the buckets from
    the one holding that time on (a live chart's new data, on the grid it was drawn on)."""
    rolled: list[list] = []
    start = w.since if after is None else tail_start(w, after)
    raw_since = start
    if w.bucket_ns >= MINUTE_NS:
        done = get_mark(db, DONE_MARK) or 0
        if done > start:
            rolled = _rolled_gpu(db, gpu_id, w, min(done, w.until), start)
            raw_since = min(done, w.until)
    raw = _raw_gpu(db, gpu_id, w, raw_since)
    buckets: dict[int, list] = {row[0]: row for row in rolled}
    for row in raw:   # a bucket split across the mark: the raw part wins (it is newer)
        buckets.setdefault(row[0], row)
    out = []
    for b in sorted(buckets):
        row = buckets[b]
        values = [None if v is None else round(v, 3) for v in row[2:-1]]
        out.append([row[1], *values, _or(row[-1])])
    return {"fields": [name for name, _ in GPU_FIELDS] + ["clocks_event_reasons"],
            "rows": out, "bucket_s": w.bucket_ns / NS_PER_SECOND, "bucket_ns": w.bucket_ns,
            "from_rollups": len(rolled)}


def process_series(db: Database, key: ProcessKey, w: Window, after: int | None = None) -> dict:
    """The process's seconds (correlator's ``process_seconds``), averaged per bucket;
    ``after`` as for :func:`gpu_series` (a live chart's new buckets)."""
    bucket_s = max(1, w.bucket_ns // NS_PER_SECOND)
    start = w.since if after is None else tail_start(w, after)
    averages = ", ".join(f"avg({name})" for name in PROCESS_FIELDS)
    cursor = db.execute(
        f"select (second - ?) / ? as b, min(second), {averages} from process_seconds "
        f"where pid = ? and start_time = ? and second >= ? and second < ? group by b "
        f"order by b", [w.since // NS_PER_SECOND, bucket_s, key.pid, key.start_time,
                        start // NS_PER_SECOND, w.until // NS_PER_SECOND])
    out = [[row[1] * NS_PER_SECOND, *(None if v is None else round(v, 3) for v in row[2:])]
           for row in cursor.fetchall()]
    return {"fields": list(PROCESS_FIELDS), "rows": out, "bucket_s": bucket_s,
            "bucket_ns": bucket_s * NS_PER_SECOND}


def last_sample_ts(db: Database, gpu_id: str) -> int | None:
    # newest first along the (ts, gpu) key: stops at the GPU's latest row
    row = db.execute("select ts from gpu_samples where gpu_id = ? order by ts desc limit 1",
                     [gpu_id]).fetchone()
    return row[0] if row else None
