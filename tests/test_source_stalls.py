"""Every source has a deadline: a trickling scrape target ends at gpu.exporter_timeout, a
stuck GPU read is reported while the heartbeat goes on, and a source that misses its
interval STALL_FACTOR times is `stalled` in `gpuwhy status` (exit 2), `/healthz` and
`/metrics`, logged once by the correlator and once when it recovers. Real sockets, a real
bus, store, correlator and service throughout."""

from __future__ import annotations

import http.server
import json
import logging
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from gpuwhy.bus import Publisher, Subscriber
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.events import SourceHealth
from gpuwhy.probes.gpu.exporter import ExporterSource
from gpuwhy.probes.gpu.runner import CLOSE_WAIT, GpuRunner
from gpuwhy.probes.gpu.source import SourceUnavailable
from gpuwhy.stalls import HEALTH_PERIOD_S, STALL_FACTOR, judge, period_s
from gpuwhy.store.writer import StoreWriter

BODY = (Path(__file__).parent / "data" / "gpu" / "current-mig-pod.prom").read_bytes()


class Target:
    """A dcgm-exporter stand-in on loopback. ``mode``: ``fast`` answers at once; ``slow-body``
    sends its headers, then the body one byte a second; ``slow-headers`` sends even the
    status line one byte a second; ``huge`` sends ``huge`` bytes without a Content-Length."""

    def __init__(self):
        self.mode = "fast"
        self.huge = 0
        self.closed = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                try:
                    self._answer(owner.mode)
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the client gave up (its deadline): what this stand-in is for

            def _answer(self, mode):
                if mode == "huge":
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"#" * owner.huge)
                    return
                head = (b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(BODY))
                if mode == "fast":
                    self.wfile.write(head + BODY)
                    return
                fast, trickled = (head, BODY) if mode == "slow-body" else (b"", head + BODY)
                self.wfile.write(fast)
                for i in range(len(trickled)):
                    if owner.closed.wait(1.0):
                        return
                    self.wfile.write(trickled[i:i + 1])   # a broken pipe ends it
                    self.wfile.flush()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.closed.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def target():
    server = Target()
    yield server
    server.close()


# --- the scrape's deadline and size cap -----------------------------------------------------

@pytest.mark.parametrize("mode", ["slow-body", "slow-headers"])
def test_a_trickling_target_ends_at_the_deadline(target, mode):
    source = ExporterSource(target.url, timeout=1.0)
    source.open()
    target.mode = mode
    started = time.monotonic()
    with pytest.raises(SourceUnavailable, match=f"scrape of {target.url} took longer than 1 s"):
        source.read()
    assert time.monotonic() - started < 1.0 + 0.75
    target.mode = "fast"
    assert source.read()   # the source keeps scraping


def test_a_body_over_the_cap_is_refused(target):
    target.mode, target.huge = "huge", 300_000
    with pytest.raises(SourceUnavailable, match="is larger than 100000 bytes"):
        ExporterSource(target.url, max_body=100_000).open()
    declared = ExporterSource(target.url, max_body=len(BODY) - 1)
    target.mode = "fast"
    with pytest.raises(SourceUnavailable, match=f"is larger than {len(BODY) - 1} bytes"):
        declared.open()   # refused on its Content-Length, before the body


def test_gpu_sample_against_a_trickling_target_ends_with_a_clear_error(target):
    """The finding: `gpuwhy gpu sample --source dcgm-exporter` hung past 30 s."""
    target.mode = "slow-body"
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "gpuwhy", "gpu", "sample", "--source", "dcgm-exporter",
         "--url", target.url, "--once"],
        capture_output=True, text=True, timeout=30,
        env={"GPUWHY_EXPORTER_TIMEOUT": "1.5", "PATH": "/usr/bin:/bin"})
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert f"dcgm-exporter: scrape of {target.url} took longer than 1.5 s" in result.stderr
    assert "Traceback" not in result.stderr
    assert elapsed < 1.5 + 3.0   # the deadline, and the interpreter's start-up


# --- a GPU read that blocks (DCGM / NVML stuck in the driver) -------------------------------

class StuckSource:
    """A GPU source whose ``read`` blocks while ``stuck`` is set, like a hung NVML call."""

    name, simulated = "nvml", False

    def __init__(self):
        self.gpus = []
        self.stuck = threading.Event()
        self.release = threading.Event()
        self.closed = False

    def open(self):
        return []

    def read(self):
        if self.stuck.is_set():
            self.release.wait()
        return []

    def notes(self):
        return []

    def close(self):
        self.closed = True


def _next_health(subscriber, predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        envelope = subscriber.receive(0.1)
        if envelope and isinstance(envelope.event, SourceHealth) and predicate(envelope.event):
            return envelope.event
    return None


def test_a_blocked_read_is_reported_stalled_and_cannot_hold_the_runner(tmp_config):
    endpoint = tmp_config["bus.endpoint"]
    subscriber = Subscriber(endpoint)
    publisher = Publisher(endpoint, src="gpu")
    publisher.wait_for_subscriber(2)
    source, stop = StuckSource(), threading.Event()
    runner = GpuRunner(source, ["nvml: forced"], publisher, interval=0.1)
    thread = threading.Thread(target=runner.run, args=(stop,))
    thread.start()
    try:
        assert _next_health(subscriber, lambda h: h.state == "ok")
        source.stuck.set()
        stalled = _next_health(subscriber, lambda h: h.state == "stalled", timeout=2)
        assert stalled and "a read of nvml has been running for" in stalled.detail
        source.stuck.clear()
        source.release.set()          # the read ends; the next one is quick again
        assert _next_health(subscriber, lambda h: h.state == "ok", timeout=2)
        source.release.clear()
        source.stuck.set()            # stuck again, for good
        assert _next_health(subscriber, lambda h: h.state == "stalled", timeout=2)
        started = time.monotonic()
        stop.set()
        thread.join(CLOSE_WAIT + 1)
        assert not thread.is_alive() and time.monotonic() - started < CLOSE_WAIT + 0.5
        assert runner.busy     # run_gpu_source leaves such a source unclosed
    finally:
        stop.set()
        source.release.set()
        thread.join(5)
        publisher.close()
        subscriber.close()


def test_a_read_that_raises_a_bug_still_ends_the_runner_loudly(tmp_config):
    """As before reads had their own thread: the service then reports the source failed."""
    class Broken(StuckSource):
        def read(self):
            raise RuntimeError("bug in a source")

    publisher = Publisher(tmp_config["bus.endpoint"], src="gpu")
    runner = GpuRunner(Broken(), [], publisher, interval=0.1)
    try:
        with pytest.raises(RuntimeError, match="bug in a source"):
            runner.run(threading.Event())
        runner._reader.join(2)
        assert not runner._reader.is_alive() and not runner.busy
    finally:
        publisher.close()


# --- the one definition, and the correlator's log and count ------------------------------

def test_the_periods_are_the_sources_own():
    from gpuwhy.correlator import alertmanager
    from gpuwhy.correlator import pipeline as correlator
    from gpuwhy.correlator.rules import runner as rules
    from gpuwhy.probes import privileged as probes
    from gpuwhy.probes import stack_sampler as pystacks
    from gpuwhy.probes.cron import source as cron
    from gpuwhy.probes.gpu import runner as gpu
    from gpuwhy.probes.klog import source as klog

    assert HEALTH_PERIOD_S == {"correlator": correlator.HEALTH_EVERY,
                               "store": correlator.HEALTH_EVERY, "gpu": gpu.HEALTH_EVERY,
                               "klog": klog.HEALTH_EVERY_S, "cron": cron.HEALTH_EVERY_S,
                               "rules": rules.HEALTH_EVERY, "probes": probes.HEALTH_EVERY_S,
                               "alertmanager": alertmanager.HEALTH_EVERY,
                               pystacks.SOURCE: pystacks.HEALTH_EVERY_S}
    assert period_s("fdtrack", {"probes.poll_interval": 0.5}) == probes.HEALTH_EVERY_S
    assert period_s("sched", {"probes.poll_interval": 30.0}) == 30.0   # rarer flushes


def _row(source, state, age_s, now, counters=None):
    return {"source": source, "state": state, "detail": "d", "counters": counters or {},
            "last_seen": now - int(age_s * NS_PER_SECOND)}


def test_judge_stalled_stale_and_failed():
    now = now_ns()
    rows = [_row("correlator", "ok", 0.5, now, {"uptime_s": 60}),
            _row("klog", "ok", 5 * STALL_FACTOR + 1, now),       # silent in this run
            _row("cron", "ok", 5 * STALL_FACTOR - 1, now),       # late, not yet stalled
            _row("cuda", "ok", 3600, now),                       # from an earlier run
            _row("rules", "failed", 100, now),                   # said why it stopped
            _row("gpu", "stalled", 0.5, now)]                    # says so itself
    states = {r["source"]: r["state"] for r in judge(rows, now)}
    assert states == {"correlator": "ok", "klog": "stalled", "cron": "ok", "cuda": "stale",
                      "rules": "failed", "gpu": "stalled"}
    [klog] = [r for r in judge(rows, now) if r["source"] == "klog"]
    assert klog["reported_state"] == "ok" and klog["detail"].startswith("STALLED: no heartbeat")
    # the service stopped (its correlator silent too): no run is live, old rows are stale
    stopped = [_row("correlator", "ok", 600, now, {"uptime_s": 60}), _row("klog", "ok", 620, now)]
    assert {r["state"] for r in judge(stopped, now)} == {"stale"}


def test_the_correlator_logs_a_stall_once_and_its_end_once(db, tmp_config, caplog):
    from gpuwhy.correlator.source_stalls import StallWatch

    caplog.set_level(logging.INFO, logger="gpuwhy.correlator.source_stalls")
    writer, started = StoreWriter(db), now_ns() - 60 * NS_PER_SECOND
    watch = StallWatch(tmp_config, started=started)
    writer.record_health("klog", "ok", "", {}, now_ns() - 30 * NS_PER_SECOND)
    for _ in range(3):
        watch.check(db)
    writer.record_health("klog", "ok", "", {}, now_ns())
    watch.check(db)
    watch.check(db)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("source klog stalled: STALLED: no heartbeat for 30 s")
    assert lines[1].startswith("source klog recovered after about 0 s stalled: now ok")
    assert watch.counters()["stalls:klog"] == 1 and watch.counters()["uptime_s"] >= 60


# --- the whole service: the exporter target stalls, then recovers ---------------------------

def _status(port, db_path):
    from gpuwhy.app.cli import cli

    result = CliRunner().invoke(cli, ["status", "--json"],
                                env={"GPUWHY_DB": db_path, "GPUWHY_PORT": str(port)})
    report = json.loads(result.output)
    return result.exit_code, report, {p["part"]: p["state"] for p in report["parts"]}


def _metrics(url):
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, s.labels.get("source")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _until(what, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.2)
    return what()


def test_service_with_a_stalling_exporter_is_degraded_then_recovers(tmp_config, target,
                                                                    caplog):
    from gpuwhy.app.cli import cli
    from gpuwhy.app.service import Service
    from gpuwhy.probes.gpu.runner import run_gpu_source

    caplog.set_level(logging.INFO, logger="gpuwhy.correlator.source_stalls")
    config = tmp_config.replace({"gpu.source": "dcgm-exporter", "gpu.exporter_url": target.url,
                                 "gpu.interval": 0.2, "gpu.exporter_timeout": 1.0,
                                 "web.port": 0, "correlator.alerts": False})
    service = Service(config, with_probes=False, sources={"gpu": run_gpu_source})
    service.start()
    port, db_path = service.web.server_port, config["store.path"]
    stalled_gauge, stalls_total = ("gpuwhy_source_stalled", "gpu"), \
        ("gpuwhy_source_stalls_total", "gpu")
    try:
        # running, the GPU source heard from and not stalled (the fixture's scrape has blank
        # values, which the exporter source itself calls degraded: status says so, exit 2)
        code, report, states = _until(
            lambda: (s := _status(port, db_path))[0] in (0, 2) and "gpu" in s[2] and s, 20)
        assert states["gpu"] in ("ok", "degraded") and states["correlator"] == "ok"
        assert not report["stalled"] and code == (0 if states["gpu"] == "ok" else 2)

        target.mode = "slow-body"      # one byte a second: every scrape runs to its deadline
        assert _until(lambda: _status(port, db_path)[1]["stalled"])
        code, report, states = _status(port, db_path)
        assert (code, report["state"], report["stalled"]) == (2, "degraded", ["gpu"])
        assert states["gpu"] == "stalled" and states["correlator"] == "ok"
        gpu = next(p for p in report["parts"] if p["part"] == "gpu")
        assert gpu["detail"].startswith("STALLED: ")
        assert "has been running for" in gpu["detail"] or \
            f"scrape of {target.url} took longer than 1 s" in gpu["detail"]
        assert _until(lambda: _metrics(service.url).get(stalls_total) == 1)
        assert _metrics(service.url)[stalled_gauge] == 1
        with urllib.request.urlopen(f"{service.url}/healthz", timeout=5) as response:
            assert json.load(response)["stalled"] == ["gpu"]
        text = CliRunner().invoke(cli, ["status"], env={"GPUWHY_DB": db_path,
                                                        "GPUWHY_PORT": str(port)})
        assert text.exit_code == 2 and text.output.startswith("gpuwhy DEGRADED (gpu stalled)")

        target.mode = "fast"
        assert _until(lambda: not _status(port, db_path)[1]["stalled"])
        code, report, states = _status(port, db_path)
        assert states["gpu"] in ("ok", "degraded")
        assert (code, report["degraded"]) == ((0, []) if states["gpu"] == "ok" else (2, ["gpu"]))
        assert _until(lambda: _metrics(service.url).get(stalled_gauge) == 0)
        assert _until(lambda: any("recovered" in r.getMessage() for r in caplog.records))
        assert _metrics(service.url)[stalls_total] == 1
    finally:
        service.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuwhy.correlator.source_stalls"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("source gpu stalled: STALLED: ")
    assert lines[1].startswith("source gpu recovered after about")
