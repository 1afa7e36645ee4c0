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

Fields = tuple[tuple[str, float], ...]     # (field, multiplier) pairs a series reads
# (field, multiplier): *_active ratios are shown as % like gpu_util.
GPU_FIELDS: Fields = (
    ("gpu_util", 1), ("sm_active", 100), ("tensor_active", 100), ("dram_active", 100),
    ("gr_engine_active", 100), ("mem_util", 1), ("enc_util", 1), ("dec_util", 1),
    ("pcie_tx_bytes_per_s", 1), ("pcie_rx_bytes_per_s", 1), ("nvlink_tx_bytes_per_s", 1),
    ("nvlink_rx_bytes_per_s", 1), ("power_w", 1), ("power_limit_w", 1), ("sm_clock_mhz", 1),
    ("mem_clock_mhz", 1), ("temp_c", 1), ("fb_used_mib", 1),
)
# The host heatmap's measures, SM active first (see host_heatmap).
HOST_FIELDS: Fields = (("sm_active", 100), ("gpu_util", 1))
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


def _raw(db: Database, w: Window, since: int, fields: Fields,
         gpu_id: str | None) -> list[list]:
    """``[gpu_id, bucket, first ts, mean per field..., reasons]`` of raw samples from
    ``since``: one GPU's, or (None) every GPU's in one pass."""
    averages = ", ".join(f"avg({name}) * {scale}" for name, scale in fields)
    one = "gpu_id = ? and " if gpu_id else ""
    cursor = db.execute(
        f"select gpu_id, (ts - ?) / ? as b, min(ts), {averages}, "
        f"group_concat(distinct clocks_event_reasons) from gpu_samples where {one}"
        f"instance = '' and ts >= ? and ts < ? group by gpu_id, b",
        [w.since, w.bucket_ns, *([gpu_id] if gpu_id else []), since, w.until])
    return [list(row) for row in cursor.fetchall()]


def _rolled(db: Database, w: Window, until: int, since: int, fields: Fields,
            gpu_id: str | None) -> list[list]:
    """As :func:`_raw`, from the one-minute rollups in [since, until): their means
    weighted by their sample counts."""
    def mean(name: str, scale: float) -> str:
        if name in _ROLLUP_SINGLE:
            return f"max({name}) * {scale}"
        # real division (an integer column's means, utilisation's whole %, were floored:
        # a cell up to 1.5 % low), over the minutes that had the field at all
        return (f"sum({name}_mean * samples) * 1.0 / "
                f"sum(case when {name}_mean is not null then samples end) * {scale}")

    columns = ", ".join(mean(name, scale) for name, scale in fields)
    one = "gpu_id = ? and " if gpu_id else ""
    cursor = db.execute(
        f"select gpu_id, (minute - ?) / ? as b, min(minute), {columns}, "
        f"group_concat(distinct clocks_event_reasons) from gpu_rollups where {one}"
        f"instance = '' and minute >= ? and minute < ? group by gpu_id, b",
        [w.since, w.bucket_ns, *([gpu_id] if gpu_id else []), since, until])
    return [list(row) for row in cursor.fetchall()]


def tail_start(w: Window, after: int) -> int:
    """The start of the bucket of ``w`` that holds ``after``: a live chart's last bucket
    (perhaps not complete when it was drawn) and those after it are what it asks again."""
    return w.since + max(0, after - w.since) // w.bucket_ns * w.bucket_ns


def _buckets(db: Database, w: Window, after: int | None, fields: Fields,
             gpu_id: str | None = None) -> tuple[list[list], int]:
    """The buckets of ``w`` (from the one holding ``after`` on) in (GPU, time) order:
    ``[gpu_id, bucket, first ts, value per field..., clocks_event_reasons]``, from the
    rollups up to their mark and raw samples after it; and how many came from the
    rollups. One GPU's, or (None) every GPU's in one pass."""
    rolled: list[list] = []
    start = w.since if after is None else tail_start(w, after)
    raw_since = start
    if w.bucket_ns >= MINUTE_NS:
        done = get_mark(db, DONE_MARK) or 0
        if done > start:
            rolled = _rolled(db, w, min(done, w.until), start, fields, gpu_id)
            raw_since = min(done, w.until)
    buckets = {(row[0], row[1]): row for row in rolled}
    for row in _raw(db, w, raw_since, fields, gpu_id):
        buckets.setdefault((row[0], row[1]), row)  # split across the mark: raw is newer
    out = []
    for key in sorted(buckets):
        row = buckets[key]
        out.append([*row[:3], *(None if v is None else round(v, 3) for v in row[3:-1]),
                    _or(row[-1])])
    return out, len(rolled)


def gpu_series(db: Database, gpu_id: str, w: Window, after: int | None = None) -> dict:
    """``{"fields": [...], "rows": [[ts, value, ...], ...], "bucket_s", "from_rollups"}``;
    ``ts`` is the first sample's time in the bucket (ns). ``after``: only the buckets from
    the one holding that time on (a live chart's new data, on the grid it was drawn on)."""
    found, rolled = _buckets(db, w, after, GPU_FIELDS, gpu_id)
    return {"fields": [name for name, _ in GPU_FIELDS] + ["clocks_event_reasons"],
            "rows": [row[2:] for row in found], "bucket_s": w.bucket_ns / NS_PER_SECOND,
            "bucket_ns": w.bucket_ns, "from_rollups": rolled}


def minute_grid(w: Window, points: int) -> Window:
    """``w`` on whole minutes (the host heatmap's cells, the rollups' grain): its start on
    a minute, its buckets one minute or a whole number of them, at most ``points``."""
    start = w.since // MINUTE_NS * MINUTE_NS
    minutes = max(1, -(-(w.until - start) // MINUTE_NS))
    return Window(start, w.until, -(-minutes // max(points, 1)) * MINUTE_NS)


def host_heatmap(db: Database, gpu_ids: list[str], w: Window,
                 after: int | None = None) -> dict:
    """Every GPU's activity on one grid (the host overview's heatmap): ``rows`` of
    ``[ts, gpu position in gpu_ids, sm_active %, gpu_util %]``, ``ts`` the bucket's start
    (ns). SM active is the better measure where the GPU gives it (DCGM, NVML's GPM);
    utilisation only says a kernel ran. ``after`` as for :func:`gpu_series`."""
    position = {gpu_id: k for k, gpu_id in enumerate(gpu_ids)}
    found, _ = _buckets(db, w, after, HOST_FIELDS)
    rows = [[w.since + row[1] * w.bucket_ns, position[row[0]], *row[3:-1]]
            for row in found if row[0] in position]
    return {"gpus": gpu_ids, "fields": [name for name, _ in HOST_FIELDS], "rows": rows,
            "bucket_s": w.bucket_ns / NS_PER_SECOND, "bucket_ns": w.bucket_ns}


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


def held_since(db: Database, gpu_id: str | None = None) -> int | None:
    """The oldest figure the store holds (ns) of a GPU, or of any: a raw sample or, once
    those are pruned, a one-minute rollup; None without any (an empty chart says since
    when). Both tables lead with the time: the first rows read are the oldest."""
    one, params = ("where gpu_id = ? ", [gpu_id]) if gpu_id else ("", [])
    found = [row[0] for row in (
        db.execute(f"select ts from gpu_samples {one}order by ts limit 1", params).fetchone(),
        db.execute(f"select minute from gpu_rollups {one}order by minute limit 1",
                   params).fetchone()) if row]
    return min(found) if found else None


PERIOD_SAMPLES = 33          # the spacings the sample period is the median of (32)


def sample_period_s(db: Database, gpu_id: str, until: int) -> float | None:
    """The GPU's sample period (s) before ``until``: the median spacing of its last raw
    samples, None with fewer than two. A chart judges a gap against it: with samples 10 s
    apart, a 5 s bucket is empty every other time, and that is no gap (the median, so one
    outage among them does not stretch the period)."""
    times = [row[0] for row in db.execute(
        "select ts from gpu_samples where gpu_id = ? and instance = '' and ts < ? "
        "order by ts desc limit ?", [gpu_id, until, PERIOD_SAMPLES]).fetchall()]
    spacings = sorted(a - b for a, b in zip(times, times[1:], strict=False) if a > b)
    if not spacings:
        return None
    return round(spacings[len(spacings) // 2] / NS_PER_SECOND, 3)
