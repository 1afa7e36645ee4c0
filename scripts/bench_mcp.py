"""MCP benchmark: how long each `gpuwhy mcp` tool call takes on a 7-day store of 8 GPUs.

    .venv/bin/python scripts/bench_mcp.py [--gpus 8] [--days 7] [--runs 20] [--keep DIR]

Fills a store with ``--days`` of ``--gpus`` simulated GPUs (store.synthetic, through the
real StoreWriter: samples, jobs, Xids, resets, their incidents), rolled up as the service
does, plus what the rules and the stack sampler would have left (a firing finding per GPU
per hour of its last day, with their Python stacks). Then calls every tool through the MCP
SDK's own client, in process (the in-memory transport: the SDK's dispatch, argument
validation, the tool, the bounding of its answer), ``--runs`` times each after one call not
counted (the rules load at their first use), and reports the median and p95 per tool.
``fleet`` asks a stand-in Prometheus on loopback (its own time is nil: the figure is
gpuwhy's side). Three of the calls again over HTTP: the SDK's HTTP client, ``/mcp`` of a
real web view (cheroot, the token, the a2wsgi bridge to the SDK's transport). Goal: p95 ≤
300 ms for every tool.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio

from gpuwhy.app.demo.synthetic_store import BUDGET_FIELDS, Plan, fill
from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.config import load_config
from gpuwhy.events import Envelope, PythonStacks, RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.store import open_store
from gpuwhy.store.rollups import roll_up
from gpuwhy.store.writer import StoreWriter

DAY_NS = 86_400 * NS_PER_SECOND
HOUR_NS = 3600 * NS_PER_SECOND
GOAL_MS = 300.0
STARVED = "R01_input_cpu_bound"


def _findings(db: Any, plan: Plan, rules: dict) -> None:
    """A firing finding of the starved-loader rule per GPU per hour of the last day, each
    with the stacks the sampler would have stored for its job."""
    rule = rules[STARVED]
    gpus = [row[0] for row in db.execute("select id from gpus order by gpu_index")]
    end = plan.start_ns + int(plan.days * DAY_NS)
    events, seq = [], 0
    for hour in range(min(24, max(1, int(plan.days * 24)))):
        t = end - (hour + 1) * HOUR_NS
        for n, gpu in enumerate(gpus):
            key = ProcessKey(20_000 + n, 900_000 + hour)
            finding = f"{STARVED}:{gpu}:-:{t}"
            events.append(RuleFinding(
                ts=t, finding_id=finding, rule_id=STARVED, title=rule.title,
                severity="warning", state="firing", gpu_id=gpu, process=key,
                window_start=t - rule.window_ns, window_end=t,
                evidence={"workers_cpu": 0.97, "gpu_util": 31.0},
                fixes=["Raise num_workers"], verify="gpu.util rises", group=rule.group,
                since=t, processes=[key], rule_kind=rule.kind, explains=list(rule.explains)))
            events.append(PythonStacks(
                ts=t + 30 * NS_PER_SECOND, process=key, gpu_id=gpu, finding_id=finding,
                rule_id=STARVED, started=t, interval_ms=100, samples=300, stacks=[
                    {"pid": key.pid, "start_time": key.start_time, "role": "main",
                     "stack": f"train.py:{88 + i} <module>;loader.py:12 __next__;"
                              "waiting on multiprocessing queue", "count": 200 - i}
                    for i in range(40)] + [
                    {"pid": 30_000 + w, "start_time": 1, "role": "workers",
                     "stack": f"dataset.py:{41 + w} load;PIL/Image.py:300 decode",
                     "count": 50 - w} for w in range(20)]))
    writer = StoreWriter(db)
    writer.write_batch([Envelope("bench", (seq := seq + 1), e) for e in events])


class _Prometheus:
    """A stand-in Prometheus answering every query with 8 hosts' idle ratios."""

    def __init__(self) -> None:
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"__name__": "gpuwhy_gpu_utilization_ratio", "host": f"node-{i}",
                        "gpu": str(g)}, "value": [1767225600, "0.25"]}
            for i in range(8) for g in range(8)]}}).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _timed(client: Any, calls: dict[str, dict[str, Any]], runs: int
                 ) -> dict[str, dict[str, Any]]:
    """{label: {median_ms, p95_ms, times_ms, bytes}} of ``runs`` calls each through
    ``client`` (the SDK's Client or ClientSession)."""
    out: dict[str, dict[str, Any]] = {}
    for label, call in calls.items():
        # one call first, not counted: the server's rules load at their first use and
        # SQLite's cache fills, as in a server that has answered before
        await client.call_tool(call["name"], call["arguments"])
        times, size = [], 0
        for _ in range(runs):
            started = time.perf_counter()
            result = await client.call_tool(call["name"], call["arguments"])
            times.append((time.perf_counter() - started) * 1000)
            if result.is_error:
                raise RuntimeError(f"{label}: {result.content[0].text}")
            size = len(json.dumps(result.structured_content))
        ordered = sorted(times)
        out[label] = {"median_ms": statistics.median(times),
                      "p95_ms": ordered[int(0.95 * (len(times) - 1))],
                      "times_ms": times, "bytes": size}
    return out


@contextlib.asynccontextmanager
async def _http_session(path: Path, prometheus_url: str) -> AsyncIterator[Any]:
    """The SDK's client session over HTTP with ``/mcp`` of a real web view (cheroot, the
    token, the a2wsgi bridge) on a free loopback port."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from gpuwhy.app.mcp_http import mount
    from gpuwhy.webui import create_app
    from gpuwhy.webui.server import WebServer

    token = "bench-token-0123456789abcdef"
    config = load_config(environ={"GPUWHY_DB": str(path), "GPUWHY_RULES_PATHS": "",
                                  "GPUWHY_AUTH_TOKEN": token,
                                  "GPUWHY_FLEET_PROMETHEUS_URL": prometheus_url})
    app = create_app(config)
    endpoint = mount(app, config)
    web = WebServer(app, "127.0.0.1", 0, 4)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
            async with streamable_http_client(f"http://127.0.0.1:{web.server_port}/mcp",
                                              http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session
    finally:
        web.shutdown()
        web.server_close()
        endpoint.close()


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / NS_PER_SECOND, tz=UTC).isoformat()


def run(gpus: int = 8, days: float = 7.0, runs: int = 20, keep: str | None = None) -> dict:
    """{gpus, days, fill_s, calls: {tool: {median_ms, p95_ms, times_ms, bytes}}}."""
    from mcp import Client

    from gpuwhy.app.mcp_server import build_server, settle
    from gpuwhy.app.verdicts import service_rules

    folder = Path(keep or tempfile.mkdtemp(prefix="gpuwhy-bench-mcp-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "gpuwhy.db"
    plan = Plan(gpus=gpus, days=days, fields=BUDGET_FIELDS)
    config = load_config(environ={"GPUWHY_DB": str(path), "GPUWHY_RULES_PATHS": ""})
    rules, _ = service_rules(config)
    fill_s = 0.0
    if not path.exists():
        started = time.monotonic()
        db = open_store(path)
        fill(db, plan)
        _findings(db, plan, rules)
        while roll_up(db, plan.start_ns + int((days + 1) * DAY_NS), max_minutes=600):
            pass
        db.close()
        fill_s = time.monotonic() - started
    end = plan.start_ns + int(days * DAY_NS)
    prometheus = _Prometheus()
    server = build_server(str(path), lambda: (rules, []), prometheus_url=prometheus.url,
                          prometheus_timeout=5.0)
    settle()                      # as `gpuwhy mcp` does once its server is built
    reader = open_store(path, readonly=True)
    incident = reader.execute("select max(id) from incidents").fetchone()[0]
    # by its UUID: the synthetic store has no index aliases (the correlator writes those)
    gpu = reader.execute("select id from gpus order by gpu_index").fetchone()[0]
    reader.close()
    at = _iso(end)
    calls: dict[str, dict[str, Any]] = {
        "why (every GPU)": {"name": "why", "arguments": {"at": at}},
        "why (one GPU)": {"name": "why", "arguments": {"target": gpu, "at": at}},
        "gpus": {"name": "gpus", "arguments": {}},
        "gpu_series (all days, 60 buckets)": {"name": "gpu_series", "arguments": {
            "gpu": gpu, "since": _iso(plan.start_ns), "until": at}},
        "gpu_series (1 hour, 500 buckets)": {"name": "gpu_series", "arguments": {
            "gpu": gpu, "since": _iso(end - HOUR_NS), "until": at, "buckets": 500}},
        "processes (with exited)": {"name": "processes", "arguments": {
            "include_exited": True, "limit": 200}},
        "incidents": {"name": "incidents", "arguments": {"limit": 200}},
        "incidents (one GPU, resets)": {"name": "incidents", "arguments": {
            "gpu": gpu, "kind": "gpu_reset"}},
        "incident": {"name": "incident", "arguments": {"id": incident}},
        "resets": {"name": "resets", "arguments": {"limit": 200}},
        "rules": {"name": "rules", "arguments": {}},
        "stacks (one GPU)": {"name": "stacks", "arguments": {"gpu": gpu, "limit": 20}},
        "query (GPU time by process)": {"name": "query", "arguments": {
            "sql": "select * from gpu_time_by_process"}},
        "query (1 day of one GPU's rollups)": {"name": "query", "arguments": {
            "sql": f"select * from gpu_rollups where gpu_index = 0 and minute between "
                   f"{end - DAY_NS} and {end}", "max_rows": 1000}},
        "fleet (64 series, local stand-in)": {"name": "fleet", "arguments": {
            "promql": "gpuwhy_gpu_utilization_ratio", "limit": 100}},
    }
    if incident is None:          # a short fill (--quick) may hold no Xid story yet
        del calls["incident"]

    over_http = {f"{label} over HTTP /mcp": calls[label] for label in (
        "why (every GPU)", "gpus", "stacks (one GPU)")}

    async def main() -> dict[str, dict[str, Any]]:
        async with Client(server) as client:
            out = await _timed(client, calls, runs)
        async with _http_session(path, prometheus.url) as session:
            out.update(await _timed(session, over_http, runs))
        return out

    try:
        measured = anyio.run(main)
        why_cli = _why_command(path, at, max(5, runs // 2))
    finally:
        prometheus.close()
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    return {"gpus": gpus, "days": days, "runs": runs, "fill_s": fill_s, "calls": measured,
            "why_cli": why_cli}


def _why_command(path: Path, at: str, runs: int) -> dict[str, Any]:
    """`gpuwhy why --json --at AT` as a person runs it: a process of its own each time
    (the interpreter, the imports, the rules loaded, the store read), wall time."""
    env = dict(os.environ, GPUWHY_DB=str(path), GPUWHY_RULES_PATHS="")
    times, size = [], 0
    for _ in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gpuwhy", "why", "--json", "--at", at],
                              env=env, capture_output=True, timeout=120)
        times.append((time.perf_counter() - started) * 1000)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"gpuwhy why failed: {done.stderr.decode()[-500:]}")
        size = len(done.stdout)
    times = times[1:]             # the first: the page cache warmed
    return {"median_ms": statistics.median(times),
            "p95_ms": sorted(times)[min(len(times) - 1, int(0.95 * len(times)))],
            "times_ms": times, "bytes": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--keep", help="folder to keep (and reuse) the store in")
    args = parser.parse_args()
    result = run(args.gpus, args.days, args.runs, args.keep)
    print(f"{args.gpus} GPUs × {args.days:g} days (filled in {result['fill_s']:.0f} s), "
          f"{args.runs} calls each; goal p95 ≤ {GOAL_MS:g} ms\n")
    print(f"{'tool call':<40} {'median ms':>10} {'p95 ms':>8} {'bytes':>9}")
    for label, call in {**result["calls"], "gpuwhy why --json (a process)":
                        result["why_cli"]}.items():
        print(f"{label:<40} {call['median_ms']:>10.1f} {call['p95_ms']:>8.1f} "
              f"{call['bytes']:>9}")


if __name__ == "__main__":
    main()
