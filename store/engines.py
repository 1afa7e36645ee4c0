"""Inference engines' scrapes read back: the engine a process is or serves, its values
bucketed over a window (the process page's Serving charts) and each engine's latest scrape
(``/metrics``).

Every read is bounded: a series has at most the window's buckets (its bucket width comes
from the window, as every chart's does), the latest scrapes at most ``MAX_ENGINES`` rows.
"""

from __future__ import annotations

import json

from sqlite_utils import Database

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.identity import ProcessKey
from gpuwhy.store.series import HOST_FIELDS, Window, _buckets, sample_period_s, tail_start

# What the Serving charts draw, in engine_samples' units (counts, ratio 0-1, 1/s, s)
SERIES_FIELDS = ("requests_running", "requests_waiting", "kv_cache_usage", "preemptions_per_s",
                 "prompt_tokens_per_s", "generation_tokens_per_s", "ttft_p95_s", "tpot_p95_s")
MAX_ENGINES = 64           # the engines source scrapes at most this many endpoints a round
PERIOD_SCRAPES = 17        # the spacings the scrape period is the median of (16)
_INFO = "pid, start_time, engine, endpoint, version, gpu_ids, ts"


def _has_table(db: Database) -> bool:
    # a store from before m125 has no engine_samples (read-only: not migrated here)
    return db["engine_samples"].exists()


def engine_of(db: Database, key: ProcessKey) -> dict | None:
    """The engine ``key`` is (its own scrapes) or serves (a GPU process of its tree, in
    engine_members; the newest such engine): its latest scrape's ``pid``, ``start_time``,
    ``engine``, ``endpoint``, ``version``, ``gpu_ids`` (a list of GPU ids), ``gpus`` (the
    same as people name them: the index where the store knows it) and ``ts``; None when the
    process is neither."""
    if not _has_table(db):
        return None
    own = db.execute(f"select {_INFO} from engine_samples where pid = ? and start_time = ? "
                     "order by ts desc limit 1", [key.pid, key.start_time]).fetchone()
    if own is None:
        served = db.execute(
            "select engine_pid, engine_start_time from engine_members where pid = ? and "
            "start_time = ? order by since desc limit 1", [key.pid, key.start_time]).fetchone()
        if served is None:
            return None
        own = db.execute(f"select {_INFO} from engine_samples where pid = ? and start_time = ? "
                         "order by ts desc limit 1", list(served)).fetchone()
        if own is None:
            return None
    found = dict(zip(_INFO.split(", "), own, strict=True))
    found["gpu_ids"] = _strings(found["gpu_ids"])
    index = dict(db.execute("select id, gpu_index from gpus").fetchall()) \
        if found["gpu_ids"] and db["gpus"].exists() else {}
    found["gpus"] = [str(index[g]) if index.get(g) is not None else g
                     for g in found["gpu_ids"]]
    return found


def _strings(text: str | None) -> list[str]:
    """A stored JSON list of strings; [] for NULL or anything else."""
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def scrape_period_s(db: Database, engine: ProcessKey, until: int) -> float | None:
    """The engine's scrape period (s) before ``until``: the median spacing of its latest
    scrapes (a chart breaks its line only past a few of them), None with fewer than two."""
    times = [row[0] for row in db.execute(
        "select ts from engine_samples where pid = ? and start_time = ? and ts < ? "
        "order by ts desc limit ?", [engine.pid, engine.start_time, until, PERIOD_SCRAPES])]
    spacings = sorted(a - b for a, b in zip(times, times[1:], strict=False) if a > b)
    return round(spacings[len(spacings) // 2] / NS_PER_SECOND, 3) if spacings else None


def engine_series(db: Database, engine: ProcessKey, w: Window,
                  after: int | None = None) -> dict:
    """The engine's scrapes in ``w``, averaged per bucket of ``w``: ``{"fields", "rows":
    [[first ts, value per field...], ...], "bucket_s", "bucket_ns", "sample_period_s"}``;
    ``after`` as for :func:`gpuwhy.store.series.gpu_series` (a live chart's new buckets)."""
    start = w.since if after is None else tail_start(w, after)
    rows: list[list] = []
    if _has_table(db):
        averages = ", ".join(f"avg({name})" for name in SERIES_FIELDS)
        cursor = db.execute(
            f"select (ts - ?) / ? as b, min(ts), {averages} from engine_samples "
            "where pid = ? and start_time = ? and ts >= ? and ts < ? group by b order by b",
            [w.since, w.bucket_ns, engine.pid, engine.start_time, start, w.until])
        rows = [[row[1], *(None if v is None else round(v, 4) for v in row[2:])]
                for row in cursor.fetchall()]
    return {"fields": list(SERIES_FIELDS), "rows": rows,
            "bucket_s": w.bucket_ns / NS_PER_SECOND, "bucket_ns": w.bucket_ns,
            "sample_period_s": scrape_period_s(db, engine, w.until) if rows else None}


def gpus_activity(db: Database, gpu_ids: list[str], w: Window,
                  after: int | None = None) -> dict:
    """The engine's GPUs' activity on the same buckets as :func:`engine_series`, beside its
    serving figures: per bucket the mean over those GPUs of SM active and utilisation (%),
    from the GPU charts' read (rollups for long buckets, raw samples after them). ``{"fields",
    "rows", "from", "to", "bucket_s", "bucket_ns", "sample_period_s"}``."""
    wanted = set(gpu_ids)
    by_bucket: dict[int, list[list]] = {}
    if wanted:
        for row in _buckets(db, w, after, HOST_FIELDS)[0]:
            if row[0] in wanted:
                by_bucket.setdefault(row[1], []).append(row)
    rows = []
    for b in sorted(by_bucket):
        found = by_bucket[b]
        means = []
        for k in range(len(HOST_FIELDS)):
            values = [r[3 + k] for r in found if r[3 + k] is not None]
            means.append(round(sum(values) / len(values), 3) if values else None)
        rows.append([min(r[2] for r in found), *means])
    period = next((p for g in gpu_ids[:1] if (p := sample_period_s(db, g, w.until))), None)
    return {"fields": [name for name, _ in HOST_FIELDS], "rows": rows, "from": w.since,
            "to": w.until, "bucket_s": w.bucket_ns / NS_PER_SECOND, "bucket_ns": w.bucket_ns,
            "sample_period_s": period}


def latest_engine_samples(db: Database, since: int, until: int) -> list[dict]:
    """Each engine's (or named endpoint's) latest scrape in [since, until], whole rows,
    at most ``MAX_ENGINES``; an engine is its process and endpoint."""
    if not _has_table(db):
        return []
    cursor = db.execute(
        "select * from engine_samples where id in (select max(id) from engine_samples "
        "where ts between ? and ? group by pid, start_time, endpoint) order by engine, "
        "endpoint, pid limit ?", [since, until, MAX_ENGINES])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
