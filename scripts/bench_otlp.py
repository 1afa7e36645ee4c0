"""OTLP export benchmark: the CPU one metrics export and one incident log record cost.

    .venv/bin/python scripts/bench_otlp.py [--gpus 8] [--processes 64] [--runs 30]

The store is the /metrics benchmark's busy host (scripts/bench_webui.py: 8 GPUs, 64 living
GPU processes, Xids, findings). The receiver is an OTLP/HTTP endpoint in a child process on
127.0.0.1 that reads and acknowledges each request, so this process's CPU time
(``time.process_time``: every thread, the SDK's included) is the exporter's alone. Reports,
per metrics export (read the families, collect, encode, POST), the median and p95 CPU ms and
the share of one core at ``otlp.interval`` = 10 s; per log record (feed read, emit, batch
encode and POST), the CPU µs; and a /metrics render of the same store beside it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_webui import DAY_NS, _busy_host  # noqa: E402 - the same busy host as /metrics'

from gpuwhy.app.demo.synthetic_store import BUDGET_FIELDS, Plan, fill  # noqa: E402
from gpuwhy.config import load_config  # noqa: E402
from gpuwhy.store import incident_changes as store_lifecycle  # noqa: E402
from gpuwhy.store import open_store  # noqa: E402

RECEIVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_port, flush=True)
server.serve_forever()
"""


def run(gpus: int = 8, processes: int = 64, runs: int = 30, records: int = 2000) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="gpuwhy-bench-otlp-"))
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE,
                                text=True)
    try:
        port = int(receiver.stdout.readline())
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
        path = folder / "gpuwhy.db"
        db = open_store(path)
        plan = Plan(gpus=gpus, days=0.01, fields=BUDGET_FIELDS)
        fill(db, plan)
        _busy_host(db, gpus, processes, plan.start_ns + int(0.01 * DAY_NS))
        incident_id = db["incidents"].insert({
            "kind": "xid", "severity": "critical", "state": "open", "gpu_id": None,
            "title": "bench incident", "summary": "a summary of one line",
            "opened_at": plan.start_ns, "last_seen": plan.start_ns, "count": 1,
            "details": "{}"}).last_pk
        config = load_config(environ={"GPUWHY_DB": str(path)})
        from gpuwhy.app.otlp_export import OtlpExporter
        from gpuwhy.webui import create_app

        exporter = OtlpExporter(config, open_store(path))
        exporter.export_metrics()          # the first: imports, label sets encoded
        exporter.figures.collect_seconds = 0.0
        cpu = []
        for _ in range(runs):
            started = time.process_time()
            assert exporter.export_metrics()
            cpu.append((time.process_time() - started) * 1000)
        cpu.sort()
        points = exporter.figures.metric_points // (runs + 1)
        reading = exporter.figures.collect_seconds / runs * 1000
        client = create_app(config).test_client()
        client.get("/metrics")
        scrape = []
        for _ in range(runs):
            time.sleep(1.01)               # past the snapshot's second: a fresh render
            started = time.process_time()
            client.get("/metrics")
            scrape.append((time.process_time() - started) * 1000)
        exporter.take_in()                 # the first run stores the cursor
        started = time.process_time()
        for _ in range(200):
            exporter.take_in()             # nothing new: what an idle second costs
        idle_step_us = (time.process_time() - started) / 200 * 1e6
        for n in range(records):
            store_lifecycle.note(db, incident_id, "bench", f"note {n}")
        started = time.process_time()
        while exporter.figures.log_records_taken < records:
            exporter.take_in()
        exporter.logger_provider.force_flush()
        per_record_us = (time.process_time() - started) / records * 1e6
        assert exporter.figures.log_records_exported == records, exporter.figures.counters()
        exporter.stop()
        median = statistics.median(cpu)
        return {"gpus": gpus, "processes": processes, "points": points,
                "export_cpu_ms": cpu, "scrape_cpu_ms": scrape,
                "export_cpu_ms_median": median, "export_cpu_ms_p95": cpu[int(0.95 * (runs - 1))],
                "core_share_at_10s_pct": median / 10_000 * 100, "read_cpu_ms": reading,
                "scrape_cpu_ms_median": statistics.median(scrape),
                "log_record_cpu_us": per_record_us, "records": records,
                "idle_step_us": idle_step_us}
    finally:
        receiver.terminate()
        receiver.wait()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    f = run(args.gpus, args.processes, args.runs)
    print(f"OTLP metrics export, {f['gpus']} GPUs x {f['processes']} processes, {f['points']} "
          f"points: CPU median {f['export_cpu_ms_median']:.1f} ms, p95 "
          f"{f['export_cpu_ms_p95']:.1f} ms an export ({f['read_cpu_ms']:.1f} ms of it reading "
          f"the families) = {f['core_share_at_10s_pct']:.2f} % of a core every 10 s (a "
          f"/metrics render of the same store: "
          f"{f['scrape_cpu_ms_median']:.1f} ms CPU)")
    print(f"OTLP log records: {f['log_record_cpu_us']:.0f} µs CPU a record "
          f"({f['records']} records, feed read to POST); a look at the feed with nothing new "
          f"{f['idle_step_us']:.0f} µs, once a second")


if __name__ == "__main__":
    main()
