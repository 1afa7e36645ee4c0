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

import subprocess
import urllib.parse
from pathlib import Path

import yaml

from .peers import SimulatedHost, free_port, get_json, stop, wait_for

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "gpuwhy-rules.yml"
# about 10 s: under the 20 s past which a test is marked slow


class Query:
    """Prometheus' HTTP API."""

    def __init__(self, base):
        self.base = base

    def __call__(self, promql):
        body = get_json(f"{self.base}/api/v1/query?"
                        + urllib.parse.urlencode({"query": promql}))
        assert body["status"] == "success", body
        return body["data"]["result"]

    def alerts(self):
        return get_json(f"{self.base}/api/v1/alerts")["data"]["alerts"]

    def rules(self):
        return [r for g in get_json(f"{self.base}/api/v1/rules")["data"]["groups"]
                for r in g["rules"]]


def test_prometheus_scrapes_gpuwhy_and_an_xid_79_fires_gpu_lost(tmp_path, installed):
    prometheus_bin = installed("prometheus")
    host = SimulatedHost(tmp_path)
    web_port, prom_port = host.port, free_port()
    prom_log = tmp_path / "prometheus.log"
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                   "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": "gpuwhy",
                            "static_configs": [{"targets": [f"127.0.0.1:{web_port}"]}]}]}))
    serve = host.serve()
    web_log = host.logs[-1]
    prometheus = None
    try:
        gpus = host.gpus()
        prometheus = subprocess.Popen(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path}/tsdb",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=1h",
             "--log.level=warn"],
            cwd=tmp_path, stdout=prom_log.open("w"), stderr=subprocess.STDOUT)
        query = Query(f"http://127.0.0.1:{prom_port}")
        logs = [web_log, prom_log]
        # two scrapes at least, both successful
        wait_for(lambda: query('count_over_time(up{job="gpuwhy"}[1m]) >= 2')
                  and query('min_over_time(up{job="gpuwhy"}[1m]) == 1'), 60,
                  "two successful scrapes", logs)
        series = wait_for(lambda: (r := query("gpuwhy_gpu_utilization_ratio")) and
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
        wait_for(lambda: all(r.get("lastEvaluation", "").startswith("2")
                              for r in query.rules()), 20, "every rule evaluated", logs)
        assert [(r["name"], r["lastError"]) for r in query.rules() if r["health"] != "ok"] == []
        assert not [a for a in query.alerts() if a["labels"]["alertname"] == "GpuwhyGpuLost"]

        # an Xid 79 line for the first GPU, as the NVIDIA driver logs it
        lost = gpus[0]
        host.lose_gpu(lost)                 # and the GPU stops answering
        result = wait_for(lambda: query('gpuwhy_gpu_health{state="lost"} == 1'), 30,
                           "gpuwhy_gpu_health{state=lost} in Prometheus", logs)
        assert [r["metric"]["gpu"] for r in result] == [lost["uuid"]]
        firing = wait_for(lambda: [a for a in query.alerts()
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
        wait_for(lambda: query('gpuwhy_gpu_xid_errors_total{xid="79",severity="critical"}'),
                  10, "the Xid 79 counter", logs)
        ok = query('gpuwhy_gpu_health{state="ok"} == 1')
        assert [r["metric"]["gpu"] for r in ok] == [gpus[1]["uuid"]]
    finally:
        if prometheus is not None:
            stop(prometheus)
        stop(serve)
    assert serve.returncode == 0, web_log.read_text()[-3000:]
    assert prometheus.returncode == 0, prom_log.read_text()[-3000:]
