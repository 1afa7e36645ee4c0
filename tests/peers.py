"""The real programs the fleet tests run beside gpuwhy, and how they wait on them: a recording
HTTP receiver (Alertmanager's webhook, or Alertmanager itself for the pusher), Debian's
`prometheus-alertmanager`, a `gpuwhy serve` on the simulator whose kernel log is a file.

Everything listens on loopback ephemeral ports and keeps its data under the test's tmp_path;
every wait is bounded and, when it times out, shows the tails of the programs' logs.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get_json(url: str, timeout: float = 3) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read().decode())


def wait_for(predicate: Callable[[], Any], timeout: float, what: str,
             logs: Iterable[Path] = (), every: float = 0.2) -> Any:
    """``predicate()``'s first true value; a peer not answering yet (OSError) or a store
    being written (sqlite3.Error) counts as not yet. Times out with the logs' tails."""
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
        time.sleep(every)


def stop(process: subprocess.Popen | None, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL past ``timeout``: the exit code says which."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Recorder:
    """A local HTTP server that keeps every JSON body POSTed to it with its path; it answers
    ``status`` (200, or a failure to test a sender's retries)."""

    def __init__(self) -> None:
        self.bodies: list[tuple[str, Any]] = []
        self.status = 200
        self.lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with recorder.lock:
                    status = recorder.status
                    if status == 200:
                        recorder.bodies.append((self.path, json.loads(body)))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def taken(self) -> list[tuple[str, Any]]:
        with self.lock:
            return list(self.bodies)

    def notified(self, incident_id: int | None = None,
                 status: str | None = None) -> list[dict]:
        """The alerts of the webhook notifications (path ``/hook``) for the incident, with
        ``status``: grouped by incident, a notification carries one incident's alert."""
        return [alert for path, body in self.taken() if path == "/hook"
                for alert in body["alerts"]
                if incident_id in (None, int(alert["labels"].get("incident", -1)))
                and status in (None, alert["status"])]

    def dump(self) -> str:
        return json.dumps(self.taken(), indent=1)[-3000:]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def alertmanager(tmp_path: Path, webhook: str) -> Iterator[tuple[str, Path]]:
    """Debian's Alertmanager notifying ``webhook``/hook, grouped by incident: yields its URL
    and log. group_wait 0s notifies at once; group_interval 1s sends a resolve within a
    second; repeat_interval 1h: within a test, a second firing notification can only come
    from an alert it takes for a new one."""
    program = shutil.which("prometheus-alertmanager")
    if program is None:
        pytest.fail("prometheus-alertmanager is not installed: scripts/setup.sh installs it "
                    "(Debian's package)", pytrace=False)
    config = tmp_path / "alertmanager.yml"
    config.write_text(f"""
route:
  receiver: hook
  group_by: ['incident']
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: '{webhook}/hook'
        send_resolved: true
""")
    port = free_port()
    storage = tmp_path / "am-data"
    storage.mkdir()
    log_path = tmp_path / "alertmanager.log"
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            [program, f"--config.file={config}", f"--storage.path={storage}",
             "--cluster.listen-address=", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"], stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, f"alertmanager exited: {log_path.read_text()[-2000:]}"
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as answer:
            return answer.status == 200

    try:
        wait_for(ready, 20, "alertmanager to be ready", [log_path])
        yield url, log_path
    finally:
        stop(process, 10)
    assert process.returncode == 0, log_path.read_text()[-3000:]


class SimulatedHost:
    """`gpuwhy serve` on two simulated GPUs running the xid-79 scenario, its kernel log a
    kern.log file: ``lose_gpu(gpu)`` writes the driver's Xid 79 line for it and strikes it
    through the simulator's event file, so from then it answers nothing, as a GPU that fell
    off the bus (a simulated GPU that kept answering would read "back, clean" at once)."""

    def __init__(self, tmp_path: Path, **settings: str) -> None:
        self.tmp_path = tmp_path
        self.kern_log = tmp_path / "kern.log"
        self.kern_log.write_text("")
        (tmp_path / "dev").mkdir()
        (tmp_path / "etc").mkdir()
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.db_path = tmp_path / "gpuwhy.db"
        self.env = {**os.environ, "GPUWHY_DB": str(self.db_path),
                    "GPUWHY_BUS": f"ipc://{tmp_path}/bus.sock",
                    "GPUWHY_DEVICE_GLOB": f"{tmp_path}/dev/nvidia*",
                    "GPUWHY_GPU_SOURCE": "sim", "GPUWHY_SIM_GPUS": "2",
                    "GPUWHY_GPU_INTERVAL": "0.5", "GPUWHY_SIM_SCENARIO": "xid-79",
                    "GPUWHY_SIM_EVENT_AFTER": "86400",
                    "GPUWHY_SIM_EVENT_FILE": str(tmp_path / "strike"),
                    "GPUWHY_KLOG_BACKEND": "file", "GPUWHY_KLOG_FILE": str(self.kern_log),
                    "GPUWHY_KLOG_START": "all", "GPUWHY_CRON_ETC": str(tmp_path / "etc"),
                    "GPUWHY_CRON_SPOOL": str(tmp_path / "etc"), "GPUWHY_ALERTS": "false",
                    "GPUWHY_HOSTNAME": "node-a", **settings}
        self.env.pop("GPUWHY_CONFIG", None)
        self.logs: list[Path] = []

    def serve(self) -> subprocess.Popen:
        """Start (or start again) `gpuwhy serve`, with a log of its own each time."""
        log_path = self.tmp_path / f"serve-{len(self.logs) + 1}.log"
        self.logs.append(log_path)
        return subprocess.Popen(
            [sys.executable, "-m", "gpuwhy", "serve", "--port", str(self.port)], env=self.env,
            cwd=self.tmp_path, stdout=log_path.open("w"), stderr=subprocess.STDOUT)

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "gpuwhy", *args], env=self.env,
                              cwd=self.tmp_path, capture_output=True, text=True, timeout=30)

    def gpus(self) -> list[dict]:
        """Both simulated GPUs, once the service serves them."""
        return wait_for(lambda: len(g := get_json(f"{self.base}/api/gpus")) == 2 and g, 30,
                        "two simulated GPUs", self.logs[-1:])

    def lose_gpu(self, gpu: dict) -> None:
        pci = gpu["pci_bus_id"].rsplit(".", 1)[0]
        with self.kern_log.open("a") as log:
            log.write(f"Dec  2 12:00:00 node-a kernel: [ 1234.567890] NVRM: Xid (PCI:{pci}): "
                      f"79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
        (self.tmp_path / "strike").touch()
