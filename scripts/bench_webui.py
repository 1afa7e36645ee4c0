"""Web view benchmark: how long the GPU chart API takes over 7 days of 1 Hz samples.

    .venv/bin/python scripts/bench_webui.py [--gpus 2] [--days 7] [--keep DIR]
    .venv/bin/python scripts/bench_webui.py --metrics-only   # the /metrics scrape alone

``/metrics``: one scrape of a host with 8 GPUs and 64 living GPU processes (each bound to
a GPU, with driver-call counters, in NVML's process lists, in its own pod), Xids and open
rule findings; median and p95 of 50 scrapes, series and bytes. Goal: 20 ms a scrape.

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
from sqlite_utils import Database

from gpuwhy.app.demo.synthetic_store import BUDGET_FIELDS, Plan, fill
from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.config import load_config
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
    for name in ("7d", "1h"):
        # a live GPU page's update: its series after the last bucket drawn, and its events
        drawn = client.get(f"/api/gpus/{gpu}/series?range={name}").get_json()
        tail = (f"/api/gpus/{gpu}/series?after={drawn['rows'][-1][0]}&grid={drawn['from']}"
                f"&bucket={drawn['bucket_ns']}")
        calls[f"live {name}"] = _together(client, [tail, f"/api/gpus/{gpu}/events?range={name}"],
                                          runs)
        # the GPU page's load: its HTML, then the two calls its script makes
        calls[f"page {name}"] = _together(client, [
            f"/gpus/{gpu}?range={name}", f"/api/gpus/{gpu}/series?range={name}",
            f"/api/gpus/{gpu}/events?range={name}"], runs)
    for name in ("7d", "6h"):
        # the overview: its HTML (cards) and its heatmap of every GPU; live, the heatmap's
        # new minutes and the cards' numbers
        drawn = client.get(f"/api/heatmap?range={name}").get_json()
        last = max(row[0] for row in drawn["rows"])
        calls[f"overview {name}"] = _together(client, ["/", f"/api/heatmap?range={name}"], runs)
        calls[f"overview live {name}"] = _together(client, [
            f"/api/heatmap?after={last}&grid={drawn['from']}&bucket={drawn['bucket_ns']}",
            "/api/gpus"], runs)
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
    return {"raw_rows": raw_rows, "gpus": gpus, "calls": calls}


def _together(client: FlaskClient, urls: list[str], runs: int) -> dict:
    """The server time of a group of calls made one after the other (a page's load, a live
    update): median and p95 of their sum."""
    totals = []
    for _ in range(runs):
        started = time.perf_counter()
        for url in urls:
            response = client.get(url)
            assert response.status_code == 200, (url, response.data[:200])
        totals.append((time.perf_counter() - started) * 1000)
    totals.sort()
    return {"median_ms": statistics.median(totals),
            "p95_ms": totals[int(0.95 * (len(totals) - 1))], "points": 0, "bytes": 0}


def _busy_host(db: Database, gpus: int, processes: int, ts: int) -> None:
    """Living processes spread over the GPUs, as the correlator and sources leave them."""
    ids = [row[0] for row in db.execute("select id from gpus order by gpu_index")][:gpus]
    rows = []
    for n in range(processes):
        pid, start = 10_000 + n, 500_000 + n
        gpu = ids[n % len(ids)]
        rows.append(gpu)
        db["processes"].insert({"pid": pid, "start_time": start, "comm": f"python{n}",
                                "cmdline": f"python train.py --rank {n}", "uid": 1000 + n % 8,
                                "first_seen": ts, "last_seen": ts, "exited_at": None,
                                "pod_uid": f"{n % 16:08x}-0000-4000-8000-000000000000",
                                "container_id": f"{n:064x}"}, replace=True)
        db["gpu_bindings"].insert({"pid": pid, "start_time": start, "gpu_id": gpu,
                                   "since": ts, "until": None, "evidence": "fd"}, replace=True)
        for cmd in range(4):
            db["driver_call_stats"].insert({
                "pid": pid, "start_time": start, "path": "/dev/nvidiactl", "cmd": cmd, "sub": 0,
                "device": "nvidiactl", "op": "NV_ESC_RM_CONTROL", "count": 1000 * (n + 1),
                "errors": 0, "latency_sum_ns": 0, "latency_max_ns": 0, "bytes": 0,
                "latency_log2": "[]", "updated_at": ts}, replace=True)
        db["gpu_processes"].insert({"gpu_id": gpu, "ts": ts, "pid": pid, "start_time": start,
                                    "used_memory_mib": 1024.0 + n, "sm_util": 40.0},
                                   replace=True)
    for n, gpu in enumerate(ids):
        for code in (13, 31, 79)[: 1 + n % 3]:
            db["kernel_log"].insert({"cursor": f"bench:{gpu}:{code}", "ts": ts, "boot_id": "b",
                                     "origin": "file", "kind": "xid", "xid": code,
                                     "pci": None, "gpu_id": gpu, "line": f"Xid {code}"})
    for n in range(6):
        db["rule_findings"].insert({"finding_id": f"bench-{n}", "rule_id": f"R{n:02d}_bench",
                                    "title": "bench", "severity": "warning", "state": "firing",
                                    "gpu_id": ids[n % len(ids)], "first_ts": ts, "last_ts": ts})


def metrics_scrape(gpus: int = 8, processes: int = 64, runs: int = 50) -> dict:
    """{median_ms, p95_ms, series, bytes} of GET /metrics on a busy host's store."""
    folder = Path(tempfile.mkdtemp(prefix="gpuwhy-bench-metrics-"))
    try:
        path = folder / "gpuwhy.db"
        db = open_store(path)
        plan = Plan(gpus=gpus, days=0.01, fields=BUDGET_FIELDS)
        fill(db, plan)
        _busy_host(db, gpus, processes, plan.start_ns + int(0.01 * DAY_NS))
        db.close()
        client = create_app(load_config(environ={"GPUWHY_DB": str(path)})).test_client()
        client.get("/metrics")     # the first scrape opens the store and imports
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            response = client.get("/metrics")
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.data[:200]
        text = response.data.decode()
        times.sort()
        return {"median_ms": statistics.median(times), "p95_ms": times[int(0.95 * (runs - 1))],
                "series": sum(1 for line in text.splitlines() if line and line[0] != "#"),
                "bytes": len(response.data), "gpus": gpus, "processes": processes}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def print_metrics(figures: dict) -> None:
    print(f"\n/metrics, {figures['gpus']} GPUs x {figures['processes']} processes: median "
          f"{figures['median_ms']:.1f} ms, p95 {figures['p95_ms']:.1f} ms a scrape (goal 20 ms), "
          f"{figures['series']} series, {figures['bytes']} bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--keep", help="folder to keep the store in")
    parser.add_argument("--metrics-only", action="store_true",
                        help="only the /metrics scrape of 8 GPUs x 64 processes")
    args = parser.parse_args()
    if args.metrics_only:
        print_metrics(metrics_scrape())
        return
    result = run(args.gpus, args.days, args.keep)
    print(f"\nraw samples of one GPU (what an undownsampled 7-day chart would draw): "
          f"{result['raw_rows']}\n")
    print(f"{'call':<44} {'median ms':>10} {'p95 ms':>8} {'points':>7} {'bytes':>9}")
    for label, call in result["calls"].items():
        print(f"{label:<44} {call['median_ms']:>10.1f} {call['p95_ms']:>8.1f} "
              f"{call['points']:>7} {call['bytes']:>9}")
    print_metrics(metrics_scrape())


if __name__ == "__main__":
    main()
