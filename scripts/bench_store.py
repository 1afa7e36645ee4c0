"""Store benchmark: size per GPU-day, query latency and ingest rate (run on demand).

    .venv/bin/python scripts/bench_store.py [--gpus 8] [--days 7] [--keep DIR]

Fills a store with ``--days`` of ``--gpus`` simulated GPUs at 1 Hz (samples, jobs, Xids,
cron resets and their incidents) through the real StoreWriter, rolls it up, then reports:
bytes per GPU-day of raw samples and of rollups (and, for the same samples, of the
GPU-sources schema before m601 and with the 25 budget fields only); p95 latency of the
incident list, reset history and a 1-hour process timeline (goal ≤ 100 ms each); ingest
rate; the longest retention batch. Baseline: the GPU-sources schema measured 21 MB per
GPU-day; the goal is ≤ 10 MB with 25 fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from sqlite_utils import Database

from gpuwhy.app.demo.synthetic_store import BUDGET_FIELDS, Plan, fill
from gpuwhy.config import SETTINGS_BY_NAME
from gpuwhy.events import Envelope, GpuSample, GpuSeen
from gpuwhy.probes.gpu.sim import SimulatedGpus
from gpuwhy.store import open_store
from gpuwhy.store.migrations import migrations
from gpuwhy.store.retention import DAY_NS, Windows, delete_batch
from gpuwhy.store.rollups import roll_up
from gpuwhy.store.writer import StoreWriter

MB = 1e6
PRUNE_BATCH = SETTINGS_BY_NAME["store.prune_batch"].default


def table_bytes(db: Database, *names: str) -> int:
    """Bytes of the pages of these tables and their indexes (after a WAL checkpoint)."""
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    marks = ", ".join("?" * len(names))
    row = db.execute(f"SELECT sum(pgsize) FROM dbstat WHERE name IN ({marks}) OR name IN "
                     f"(SELECT name FROM sqlite_master WHERE type = 'index' "
                     f"AND tbl_name IN ({marks}))", [*names, *names])
    return row.fetchone()[0] or 0


def timings_ms(db: Database, sql: str, params_list: list[list]) -> list[float]:
    """Milliseconds of the query, once per parameter list."""
    times = []
    for params in params_list:
        started = time.perf_counter()
        db.execute(sql, params).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    return times


def p95(times: list[float]) -> float:
    return statistics.quantiles(times, n=20)[-1]


def samples_only(path: Path, gpus: int, days: float, fields: tuple[str, ...] | None,
                 stop_before: str | None = None) -> float:
    """Bytes per GPU-day of the samples table alone, for a schema and a field set."""
    if stop_before:
        db = Database(sqlite3.connect(path))
        db.enable_wal()
        migrations.apply(db, stop_before=stop_before)
    else:
        db = open_store(path)
    sim = SimulatedGpus(count=gpus)
    infos = sim.open()
    writer = StoreWriter(db)
    batch = [Envelope("b", 0, info.seen(0, "sim", True)) for info in infos]
    t0 = 1_767_225_600 * 10**9
    for tick in range(int(days * 86_400)):
        for event in sim.read():
            if isinstance(event, GpuSample):
                keep = event.fields if fields is None else {
                    k: v for k, v in event.fields.items() if k in fields}
                batch.append(Envelope("b", tick, dataclasses.replace(
                    event, ts=t0 + tick * 10**9, fields=keep)))
        if len(batch) >= 2000:
            if stop_before:
                _write_old(db, batch)
            else:
                writer.write_batch(batch)
            batch = []
    _write_old(db, batch) if stop_before else writer.write_batch(batch)
    size = table_bytes(db, "gpu_samples" if stop_before else "gpu_sample_data")
    db.close()
    return size / (gpus * days)


def simulated_fields() -> int:
    """How many fields a simulated GPU sample carries."""
    sim = SimulatedGpus(count=1)
    sim.open()
    return len(next(e for e in sim.read() if isinstance(e, GpuSample)).fields)


def _write_old(db: Database, batch: list[Envelope]) -> None:
    """The GPU-sources handler as it was before m601: uuid key, REAL columns."""
    columns = set(db["gpu_samples"].columns_dict)
    with db.atomic():
        for envelope in batch:
            event = envelope.event
            if isinstance(event, GpuSeen):
                continue
            row = {k: v for k, v in event.fields.items() if k in columns}
            names = ["gpu_id", "ts", "instance", *row]
            db.execute(f"INSERT OR REPLACE INTO gpu_samples ({', '.join(names)}) VALUES "
                       f"({', '.join('?' * len(names))})",
                       [event.gpu_id, event.ts, event.instance, *row.values()])


def run(gpus: int = 8, days: float = 7.0, keep: Path | None = None,
        progress: bool = False) -> dict:
    """Sizes (bytes per GPU-day), query timings (ms, each call) and the retention batches."""
    args = argparse.Namespace(gpus=gpus, days=days, keep=keep)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-store-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bench.db"
    path.unlink(missing_ok=True)
    db = open_store(path)
    plan = Plan(gpus=args.gpus, days=args.days)
    stats = fill(db, plan, progress=(lambda f: print(f"\rfilling {f:5.1%}", end="",
                                                    flush=True)) if progress else None)
    started = time.monotonic()
    minutes = 0
    while done := roll_up(db, plan.start_ns + int((args.days + 1) * DAY_NS), max_minutes=600):
        minutes += done
    rollup_s = time.monotonic() - started
    gpu_days = args.gpus * args.days
    raw = table_bytes(db, "gpu_sample_data")
    packed_path = folder / "packed.db"
    packed_path.unlink(missing_ok=True)
    db.execute("VACUUM INTO ?", [str(packed_path)])
    packed_db = Database(sqlite3.connect(packed_path))
    packed = table_bytes(packed_db, "gpu_sample_data")
    packed_db.close()
    rollups = table_bytes(db, "gpu_rollup_data")
    file_bytes = path.stat().st_size

    end = plan.start_ns + int(args.days * DAY_NS)
    rng = random.Random(1)
    jobs = db.execute("SELECT pid, start_time, min(since), max(coalesce(until, ?)) FROM "
                      "gpu_bindings GROUP BY pid, start_time", [end]).fetchall()
    windows = []
    for pid, start_time, since, until in rng.choices(jobs, k=50):
        at = rng.randrange(since, max(since + 1, until - 3600 * 10**9))
        windows.append([pid, start_time, at, at + 3600 * 10**9])
    reader = open_store(path, readonly=True)
    latencies = {
        "incident list (50 newest)": timings_ms(
            reader, "SELECT * FROM incident_list ORDER BY opened_at DESC LIMIT 50", [[]] * 50),
        "reset history (all)": timings_ms(
            reader, "SELECT * FROM gpu_reset_history ORDER BY ts DESC", [[]] * 50),
        "1-hour process timeline": timings_ms(
            reader, "SELECT * FROM process_gpu_timeline WHERE pid = ? AND start_time = ? "
                    "AND ts BETWEEN ? AND ?", windows),
        "incident chain (one)": timings_ms(
            reader, "SELECT * FROM incident_chains WHERE incident_id = ?",
            [[rng.randint(1, max(stats.incidents, 1))] for _ in range(50)]),
        "Xids per GPU per day": timings_ms(reader, "SELECT * FROM xids_per_gpu_day", [[]] * 20),
        "GPU time by container": timings_ms(reader, "SELECT * FROM gpu_time_by_container",
                                            [[]] * 20),
        "1-day rollups of one GPU": timings_ms(
            reader, "SELECT * FROM gpu_rollups WHERE gpu_index = 0 AND minute BETWEEN ? AND ?",
            [[end - DAY_NS, end]] * 20),
    }
    timeline_rows = len(reader.execute(
        "SELECT * FROM process_gpu_timeline WHERE pid = ? AND start_time = ? AND ts BETWEEN ? "
        "AND ?", windows[0]).fetchall())
    reader.close()

    # retention: drop the oldest day of raw samples, batch by batch, timing each transaction
    cutoff = Windows(raw_days=args.days - 1).cutoff("raw", end)
    batch_ms, deleted = [], 0
    while True:
        began = time.perf_counter()
        rows = delete_batch(db, "gpu_sample_data", "ts", cutoff, PRUNE_BATCH)
        batch_ms.append((time.perf_counter() - began) * 1000)
        deleted += rows
        if rows < PRUNE_BATCH:
            break
    db.close()

    sample_days = min(0.25, args.days)
    before = samples_only(folder / "before.db", 2, sample_days, None, "m601_compact_gpu_samples")
    after_all = samples_only(folder / "after-all.db", 2, sample_days, None)
    after_25 = samples_only(folder / "after-25.db", 2, sample_days, BUDGET_FIELDS)
    result = {
        "gpus": args.gpus, "days": args.days, "fields": simulated_fields(),
        "samples": stats.samples, "events": stats.events, "incidents": stats.incidents,
        "ingest_per_s": stats.samples / stats.seconds, "fill_s": stats.seconds,
        "rollup_minutes": minutes, "rollup_s": rollup_s,
        "raw_per_gpu_day": raw / gpu_days, "packed_per_gpu_day": packed / gpu_days,
        "rollups_per_gpu_day": rollups / gpu_days, "file_bytes": file_bytes,
        "samples_before_per_gpu_day": before, "samples_all_per_gpu_day": after_all,
        "samples_25_per_gpu_day": after_25, "latencies_ms": latencies,
        "timeline_rows": timeline_rows, "prune_batch": PRUNE_BATCH, "batch_ms": batch_ms,
        "deleted": deleted,
    }
    if not args.keep:
        for leftover in folder.iterdir():
            leftover.unlink()
        folder.rmdir()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--keep", type=Path, help="folder to keep the store in")
    args = parser.parse_args()
    r = run(args.gpus, args.days, args.keep, progress=True)
    print()
    gpu_days = r["gpus"] * r["days"]
    batch_ms = r["batch_ms"]
    rows = [
        ("store", f"{r['gpus']} GPUs × {r['days']:g} days at 1 Hz, {r['samples']:,} samples, "
                  f"{r['events']:,} host events, {r['incidents']} incidents"),
        ("ingest (simulator + StoreWriter)", f"{r['ingest_per_s']:,.0f} samples/s "
                                             f"({r['fill_s']:.0f} s)"),
        ("rollup", f"{r['rollup_minutes']:,} minutes in {r['rollup_s']:.1f} s"),
        (f"raw samples, all {r['fields']} fields", f"{r['raw_per_gpu_day'] / MB:.2f} MB per "
                                                   "GPU-day"),
        ("raw samples after VACUUM", f"{r['packed_per_gpu_day'] / MB:.2f} MB per GPU-day"),
        ("one-minute rollups", f"{r['rollups_per_gpu_day'] / MB:.3f} MB per GPU-day"),
        ("whole file", f"{r['file_bytes'] / MB:.0f} MB ({r['file_bytes'] / gpu_days / MB:.2f} "
                       f"MB per GPU-day)"),
        ("samples, GPU-sources schema (before)",
         f"{r['samples_before_per_gpu_day'] / MB:.2f} MB per GPU-day"),
        ("samples, compact, all fields (after)",
         f"{r['samples_all_per_gpu_day'] / MB:.2f} MB per GPU-day"),
        ("samples, compact, 25 budget fields", f"{r['samples_25_per_gpu_day'] / MB:.2f} MB per "
                                               f"GPU-day (goal ≤ 10)"),
        *[(f"p95 {name}", f"{p95(times):.1f} ms") for name, times in r["latencies_ms"].items()],
        ("timeline rows per hour", f"{r['timeline_rows']:,}"),
        (f"retention batch ({r['prune_batch']} rows)",
         f"p95 {p95(batch_ms):.1f} ms, longest {max(batch_ms):.1f} "
         f"ms, {r['deleted']:,} rows in {len(batch_ms)} batches"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")

if __name__ == "__main__":
    main()
