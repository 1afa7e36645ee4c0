"""Web view benchmark: how long the GPU chart API takes over 7 days of 1 Hz samples.

    .venv/bin/python scripts/bench_webui.py [--gpus 2] [--days 7] [--keep DIR]

Fills a store with ``--days`` of ``--gpus`` simulated GPUs (store.synthetic, through the
real StoreWriter), rolls it up to one-minute rows as the service does, then times the
pages' data calls through Flask's test client: series for each range (5 min … 7 days),
the overview, a GPU's events. Reports the median and p95 of 20 calls each, the points and
bytes returned. Baseline (no downsampling, raw rows for 7 days): the row count below is
what a chart would otherwise draw; the goal is every call under 250 ms.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from flask.testing import FlaskClient

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.config import load_config
from gpuwhy.demo.synthetic_store import BUDGET_FIELDS, Plan, fill
from gpuwhy.store import open_store
from gpuwhy.store.rollups import roll_up
from gpuwhy.webui import create_app

DAY_NS = 86_400 * NS_PER_SECOND


def timed(client: FlaskClient, url: str, runs: int = 20) -> tuple[float, float, int, int]:
    times, size, points = [], 0, 0
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.data[:200])
        size = len(response.data)
        body = response.get_json()
        points = len(body.get("rows", [])) if isinstance(body, dict) else len(body)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))], points, size


def run(gpus: int = 2, days: float = 7.0, keep: str | None = None, runs: int = 20) -> dict:
    """{raw_rows, calls: {url with <gpu>: {median_ms, p95_ms, points, bytes}}}."""
    folder = Path(keep or tempfile.mkdtemp(prefix="gpuwhy-bench-web-"))
    path = folder / "gpuwhy.db"
    plan = Plan(gpus=gpus, days=days, fields=BUDGET_FIELDS)
    if not path.exists():
        db = open_store(path)
        started = time.monotonic()
        stats = fill(db, plan)
        while roll_up(db, plan.start_ns + int((days + 1) * DAY_NS), max_minutes=600):
            pass
        print(f"filled {stats.samples} samples, {stats.incidents} incidents "
              f"in {time.monotonic() - started:.0f} s ({path})")
        db.close()
    client = create_app(load_config(environ={"GPUWHY_DB": str(path)})).test_client()
    gpu = client.get("/api/gpus").get_json()[0]["id"]
    raw_rows = open_store(path, readonly=True).execute(
        "select count(*) from gpu_sample_data s join gpus g on g.gpu_key = s.gpu "
        "where g.id = ?", [gpu]).fetchone()[0]
    urls = [f"/api/gpus/{gpu}/series?range={r}" for r in ("5m", "1h", "24h", "7d")]
    urls += [f"/api/gpus/{gpu}/events?range=7d", "/api/gpus", "/api/incidents"]
    calls = {}
    for url in urls:
        median, p95, points, size = timed(client, url, runs)
        calls[url.replace(gpu, "<gpu>")] = {"median_ms": median, "p95_ms": p95,
                                            "points": points, "bytes": size}
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
    return {"raw_rows": raw_rows, "calls": calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--keep", help="folder to keep the store in")
    args = parser.parse_args()
    result = run(args.gpus, args.days, args.keep)
    print(f"\nraw samples of one GPU (what an undownsampled 7-day chart would draw): "
          f"{result['raw_rows']}\n")
    print(f"{'call':<44} {'median ms':>10} {'p95 ms':>8} {'points':>7} {'bytes':>9}")
    for label, call in result["calls"].items():
        print(f"{label:<44} {call['median_ms']:>10.1f} {call['p95_ms']:>8.1f} "
              f"{call['points']:>7} {call['bytes']:>9}")


if __name__ == "__main__":
    main()
