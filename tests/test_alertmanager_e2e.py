"""A real `gpuwhy serve` pushes an Xid 79 incident to the real Alertmanager (Debian's
`prometheus-alertmanager`), which notifies a webhook ONCE firing across a restart of gpuwhy
and ONCE resolved after `gpuwhy incident ID resolve`.

Nothing is stood in for: the simulator's GPUs, the kernel-log tail (a kern.log file, as in
tests/test_prometheus_scrape.py, where the GPU stops answering once the Xid 79 line is
written), the service's own pusher thread (correlator/alertmanager.py) re-sending every
second, Alertmanager's grouping and dedup, and the CLI resolving the incident in the store.
The restart is the point: Alertmanager tells alerts apart by their labels alone, so a
restarted pusher that sent a label set other than the stored one (rebuilt from a severity or
host name that changed meanwhile) would be notified as a second alert. The processes listen
on loopback ephemeral ports, keep their data in tmp_path and are stopped by the test.
"""

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ALERTMANAGER = shutil.which("prometheus-alertmanager")
INCIDENT_ALERT = "GpuwhyIncidentGpuLost"      # alert_name("gpu_lost")
# about 14 s (Alertmanager's start, two gpuwhy starts, the resend intervals watched): under
# the 20 s past which a test is marked slow


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
        except (OSError, sqlite3.Error):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}:\n{Path(p).read_text()[-3000:]}" for p in logs)
            raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tails}")
        time.sleep(0.2)


def _stop(process, timeout=15):
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Webhook:
    """Alertmanager's webhook receiver: keeps every JSON body POSTed to it."""

    def __init__(self):
        self.bodies = []
        self.lock = threading.Lock()
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with webhook.lock:
                    webhook.bodies.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self, incident_id=None, status=None):
        """The notifications' alerts (for the incident, with ``status``): group_by incident
        makes one alert per notification."""
        with self.lock:
            bodies = list(self.bodies)
        return [a for body in bodies for a in body["alerts"]
                if incident_id in (None, int(a["labels"].get("incident", -1)))
                and status in (None, a["status"])]

    def dump(self):
        with self.lock:
            return json.dumps(self.bodies, indent=1)[-3000:]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _alertmanager_config(path, webhook_url):
    # group_wait 0s: notify at once; group_interval 1s: a resolve goes out within a second;
    # repeat_interval 1h: within the test, a second firing notification can only come from
    # an alert Alertmanager takes for a new one
    path.write_text(f"""
route:
  receiver: hook
  group_by: ['incident']
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: '{webhook_url}'
        send_resolved: true
""")


def _sends(db_path, incident_id):
    """The pusher's stored firing-send count for the incident; None once it is forgotten."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5) as conn:
        row = conn.execute("select fired from alertmanager_alerts where incident_id = ?",
                           [incident_id]).fetchone()
    return None if row is None else row[0]


def test_alertmanager_notifies_once_across_a_gpuwhy_restart_then_once_resolved(tmp_path):
    assert ALERTMANAGER is not None, ("prometheus-alertmanager (Debian's package) is not "
                                      "installed: scripts/setup.sh installs it")
    kern_log = tmp_path / "kern.log"
    kern_log.write_text("")
    (tmp_path / "dev").mkdir()
    (tmp_path / "etc").mkdir()
    (tmp_path / "am-data").mkdir()
    web_port, am_port = _free_port(), _free_port()
    base, am_url = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{am_port}"
    db_path = tmp_path / "gpuwhy.db"
    env = {**os.environ, "GPUWHY_DB": str(db_path),
           "GPUWHY_BUS": f"ipc://{tmp_path}/bus.sock",
           "GPUWHY_DEVICE_GLOB": f"{tmp_path}/dev/nvidia*",
           "GPUWHY_GPU_SOURCE": "sim", "GPUWHY_SIM_GPUS": "2", "GPUWHY_GPU_INTERVAL": "0.5",
           "GPUWHY_SIM_SCENARIO": "xid-79", "GPUWHY_SIM_EVENT_AFTER": "86400",
           "GPUWHY_SIM_EVENT_FILE": str(tmp_path / "strike"),
           "GPUWHY_KLOG_BACKEND": "file", "GPUWHY_KLOG_FILE": str(kern_log),
           "GPUWHY_KLOG_START": "all", "GPUWHY_CRON_ETC": str(tmp_path / "etc"),
           "GPUWHY_CRON_SPOOL": str(tmp_path / "etc"), "GPUWHY_ALERTS": "false",
           "GPUWHY_HOSTNAME": "node-a", "GPUWHY_URL": base,
           "GPUWHY_ALERTMANAGER_URL": am_url, "GPUWHY_ALERTMANAGER_RESEND": "1"}
    env.pop("GPUWHY_CONFIG", None)
    am_log = tmp_path / "alertmanager.log"
    web_logs = [tmp_path / "serve-1.log", tmp_path / "serve-2.log"]
    config = tmp_path / "alertmanager.yml"
    webhook = Webhook()
    _alertmanager_config(config, webhook.url)

    def serve(log_path):
        return subprocess.Popen(
            [sys.executable, "-m", "gpuwhy", "serve", "--port", str(web_port)], env=env,
            cwd=tmp_path, stdout=log_path.open("w"), stderr=subprocess.STDOUT)

    alertmanager = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path}/am-data",
         "--cluster.listen-address=", f"--web.listen-address=127.0.0.1:{am_port}",
         "--log.level=warn"], cwd=tmp_path, stdout=am_log.open("w"), stderr=subprocess.STDOUT)
    first = serve(web_logs[0])
    second = None
    try:
        logs = [web_logs[0], am_log]

        def am_ready():
            assert alertmanager.poll() is None, f"alertmanager exited: {am_log.read_text()}"
            with urllib.request.urlopen(f"{am_url}/-/ready", timeout=1) as answer:
                return answer.status == 200

        _wait_for(am_ready, 20, "alertmanager to be ready", logs)
        gpus = _wait_for(lambda: len(g := _get(f"{base}/api/gpus")) == 2 and g, 30,
                         "two simulated GPUs", logs)
        lost = gpus[0]
        pci = lost["pci_bus_id"].rsplit(".", 1)[0]
        with kern_log.open("a") as log:
            log.write(f"Dec  2 12:00:00 node-a kernel: [ 1234.567890] NVRM: Xid (PCI:{pci}): "
                      f"79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
        (tmp_path / "strike").touch()       # and the GPU stops answering, as a lost one does
        [incident] = _wait_for(lambda: _get(f"{base}/api/incidents"), 30,
                               "the Xid 79 incident", logs)
        incident_id = incident["id"]
        assert incident["kind"] == "gpu_lost", incident
        [alert] = _wait_for(lambda: webhook.alerts(incident_id, "firing"), 20,
                            f"the firing notification; webhook got {webhook.dump()}", logs)
        assert alert["labels"]["alertname"] == INCIDENT_ALERT
        assert alert["labels"]["gpu"] == lost["uuid"] and alert["labels"]["host"] == "node-a"
        assert alert["annotations"]["incident_url"] == f"{base}/incidents/{incident_id}"
        # re-sent every second before the restart too: the same alert, no new notification
        fired = _sends(db_path, incident_id)
        _wait_for(lambda: _sends(db_path, incident_id) >= fired + 2, 10,
                  "two re-sends before the restart", logs)

        _stop(first)
        assert first.returncode == 0, web_logs[0].read_text()[-3000:]
        fired = _sends(db_path, incident_id)
        second = serve(web_logs[1])
        logs = [web_logs[1], am_log]
        # several re-sends by the restarted service's pusher, from its stored record
        _wait_for(lambda: _sends(db_path, incident_id) >= fired + 4, 20,
                  "four re-sends after the restart", logs)
        assert len(webhook.alerts(incident_id, "firing")) == 1, webhook.dump()

        resolve = subprocess.run(
            [sys.executable, "-m", "gpuwhy", "incident", str(incident_id), "resolve",
             "GPU replaced", "--by", "alice"], env=env, cwd=tmp_path, capture_output=True,
            text=True, timeout=30)
        assert resolve.returncode == 0, resolve.stdout + resolve.stderr
        [resolved] = _wait_for(lambda: webhook.alerts(incident_id, "resolved"), 20,
                               f"the resolved notification; webhook got {webhook.dump()}", logs)
        assert resolved["labels"] == alert["labels"]
        # every owed resolved send made (the pusher forgets the incident then), and one
        # group_interval more for Alertmanager to notify anything they might have changed
        _wait_for(lambda: _sends(db_path, incident_id) is None, 15,
                  "the pusher to finish the resolved sends", logs)
        time.sleep(2.0)
        assert len(webhook.alerts(incident_id, "resolved")) == 1, webhook.dump()
        assert len(webhook.alerts(incident_id, "firing")) == 1, webhook.dump()
        # nothing about the GPU that stayed ok
        assert {a["labels"]["gpu"] for a in webhook.alerts()} == {lost["uuid"]}
    finally:
        for process in (second, first, alertmanager):
            if process is not None:
                _stop(process)
        webhook.close()
    assert second.returncode == 0, web_logs[1].read_text()[-3000:]
    assert alertmanager.returncode == 0, am_log.read_text()[-3000:]
