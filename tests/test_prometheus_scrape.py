"""The real Prometheus (Debian's `prometheus` binary) scrapes a real `gpuwhy serve` on the
simulator with the shipped rules loaded: the GPU series arrive with gpuwhy's and
dcgm-exporter's labels, every rule evaluates cleanly, and an Xid 79 line written into the
kernel log gpuwhy reads makes `gpuwhy_gpu_health{state="lost"}` 1 and GpuwhyGpuLost fire,
for that GPU only.

gpuwhy reads its kernel log from a file here (klog.backend=file, a kern.log tail): the
same source and parser as on a host, without writing a fake Xid into this host's log. A GPU
that has fallen off the bus also stops answering its GPU source; a simulated GPU that went
on answering would be read "again with clean counters" and be ok at once. So the simulator
runs its xid-79 scenario, struck through its event file when the line is written: from then
GPU 0 answers nothing, as a real lost GPU.
Both processes listen on loopback ephemeral ports, keep their data in tmp_path and are
stopped by the test.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "gpuwhy-rules.yml"
# about 10 s: under the 20 s past which a test is marked slow


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, timeout=3):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read().decode())


def _wait_for(predicate, timeout, what, logs=()):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}:\n{Path(p).read_text()[-3000:]}" for p in logs)
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.25)


class Query:
    """Prometheus' HTTP API."""

    def __init__(self, base):
        self.base = base

    def __call__(self, promql):
        body = _get(f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert body["status"] == "success", body
        return body["data"]["result"]

    def alerts(self):
        return _get(f"{self.base}/api/v1/alerts")["data"]["alerts"]

    def rules(self):
        return [r for g in _get(f"{self.base}/api/v1/rules")["data"]["groups"]
                for r in g["rules"]]


def _stop(process, timeout=15):
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_prometheus_scrapes_gpuwhy_and_an_xid_79_fires_gpu_lost(tmp_path, installed):
    prometheus_bin = installed("prometheus")
    kern_log = tmp_path / "kern.log"
    kern_log.write_text("")
    (tmp_path / "dev").mkdir()
    (tmp_path / "etc").mkdir()
    web_port, prom_port = _free_port(), _free_port()
    env = {**os.environ, "GPUWHY_DB": str(tmp_path / "gpuwhy.db"),
           "GPUWHY_BUS": f"ipc://{tmp_path}/bus.sock",
           "GPUWHY_DEVICE_GLOB": f"{tmp_path}/dev/nvidia*",
           "GPUWHY_GPU_SOURCE": "sim", "GPUWHY_SIM_GPUS": "2", "GPUWHY_GPU_INTERVAL": "0.5",
           "GPUWHY_SIM_SCENARIO": "xid-79", "GPUWHY_SIM_EVENT_AFTER": "86400",
           "GPUWHY_SIM_EVENT_FILE": str(tmp_path / "strike"),
           "GPUWHY_KLOG_BACKEND": "file", "GPUWHY_KLOG_FILE": str(kern_log),
           "GPUWHY_KLOG_START": "all", "GPUWHY_CRON_ETC": str(tmp_path / "etc"),
           "GPUWHY_CRON_SPOOL": str(tmp_path / "etc"), "GPUWHY_ALERTS": "false",
           "GPUWHY_HOSTNAME": "node-a"}
    env.pop("GPUWHY_CONFIG", None)
    web_log, prom_log = tmp_path / "serve.log", tmp_path / "prometheus.log"
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                   "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "gpuwhy",
                            "static_configs": [{"targets": [f"127.0.0.1:{web_port}"]}]}]}))
    base = f"http://127.0.0.1:{web_port}"
    serve = subprocess.Popen([sys.executable, "-m", "gpuwhy", "serve", "--port", str(web_port)],
                             env=env, cwd=tmp_path, stdout=web_log.open("w"),
                             stderr=subprocess.STDOUT)
    prometheus = None
    try:
        gpus = _wait_for(lambda: len(g := _get(f"{base}/api/gpus")) == 2 and g, 30,
                         "two simulated GPUs", [web_log])
        prometheus = subprocess.Popen(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path}/tsdb",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=1h",
             "--log.level=warn"],
            cwd=tmp_path, stdout=prom_log.open("w"), stderr=subprocess.STDOUT)
        query = Query(f"http://127.0.0.1:{prom_port}")
        logs = [web_log, prom_log]
        # two scrapes at least, both successful
        _wait_for(lambda: query('count_over_time(up{job="gpuwhy"}[1m]) >= 2')
                  and query('min_over_time(up{job="gpuwhy"}[1m]) == 1'), 60,
                  "two successful scrapes", logs)
        series = _wait_for(lambda: (r := query("gpuwhy_gpu_utilization_ratio")) and
                           len(r) == 2 and r, 30, "both GPUs' utilisation", logs)
        uuids = {g["uuid"] for g in gpus}
        assert {s["metric"]["gpu"] for s in series} == uuids
        for s in series:
            labels = s["metric"]
            assert labels["UUID"] == labels["gpu"] and labels["Hostname"] == "node-a"
            assert labels["simulated"] == "true" and labels["pci_bus_id"].startswith("0000")
            assert 0.0 <= float(s["value"][1]) <= 1.0
        assert len(query('gpuwhy_gpu_health{state="ok"} == 1')) == 2
        assert query("process_resident_memory_bytes") and query("gpuwhy_gpu_info")
        # every shipped rule evaluates without error against gpuwhy's real series
        _wait_for(lambda: all(r.get("lastEvaluation", "").startswith("2")
                              for r in query.rules()), 20, "every rule evaluated", logs)
        assert [(r["name"], r["lastError"]) for r in query.rules() if r["health"] != "ok"] == []
        assert not [a for a in query.alerts() if a["labels"]["alertname"] == "GpuwhyGpuLost"]

        # an Xid 79 line for the first GPU, as the NVIDIA driver logs it
        lost = gpus[0]
        pci = lost["pci_bus_id"].rsplit(".", 1)[0]
        with kern_log.open("a") as log:
            log.write(f"Dec  2 12:00:00 node-a kernel: [ 1234.567890] NVRM: Xid (PCI:{pci}): "
                      f"79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
        (tmp_path / "strike").touch()       # and the GPU stops answering
        result = _wait_for(lambda: query('gpuwhy_gpu_health{state="lost"} == 1'), 30,
                           "gpuwhy_gpu_health{state=lost} in Prometheus", logs)
        assert [r["metric"]["gpu"] for r in result] == [lost["uuid"]]
        firing = _wait_for(lambda: [a for a in query.alerts()
                                    if a["labels"]["alertname"] == "GpuwhyGpuLost"
                                    and a["state"] == "firing"], 20,
                           "GpuwhyGpuLost firing", logs)
        [alert] = firing
        assert alert["labels"]["gpu"] == lost["uuid"] == alert["labels"]["UUID"]
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["runbook_url"] == "docs/alerts.md#gpuwhygpulost"
        assert alert["annotations"]["incident_url"].startswith(
            f"http://127.0.0.1:{web_port}/incidents?gpu={lost['uuid']}")
        # the Xid is counted by code and catalogue severity, and the other GPU stays ok
        _wait_for(lambda: query('gpuwhy_gpu_xid_errors_total{xid="79",severity="critical"}'),
                  10, "the Xid 79 counter", logs)
        ok = query('gpuwhy_gpu_health{state="ok"} == 1')
        assert [r["metric"]["gpu"] for r in ok] == [gpus[1]["uuid"]]
    finally:
        if prometheus is not None:
            _stop(prometheus)
        _stop(serve)
    assert serve.returncode == 0, web_log.read_text()[-3000:]
    assert prometheus.returncode == 0, prom_log.read_text()[-3000:]
