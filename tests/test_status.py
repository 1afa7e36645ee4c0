"""`gpuwhy status` cannot read healthy while something is wrong: a part degraded or failed, a
source whose reads all fail, a part that dropped records. What the host cannot offer (no
NVIDIA driver: simulated counters; no journald: cron's schedule only) is said, not a fault."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.app.status import EXIT_CODES, SIMULATED_PREFIX, collect_status
from gpuwhy.clock import now_ns
from gpuwhy.config import load_config
from gpuwhy.probes.klog.journald import journald_refuses
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter

SIMULATED = f"{SIMULATED_PREFIX}, no real GPU is read: dcgm: not installed; nvml: library " \
            "not found; exporter: not configured; using SIMULATOR"
CRON_NO_JOURNALD = "journald is not running (x): schedule only, no executions"


class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def web():
    """A real HTTP server answering /healthz, where the web view would be."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def host(tmp_path, web):
    """A store with a live correlator, and a function that writes a part's heartbeat and
    returns the status seen with the given settings (a GPU-less sysfs by default)."""
    path = tmp_path / "gpuwhy.db"
    db = open_store(path)
    writer = StoreWriter(db)
    writer.record_health("correlator", "ok", "", {"uptime_s": 60}, now_ns())
    writer.record_health("store", "ok", "ok: 0.1 MB used", {}, now_ns())
    (tmp_path / "sys" / "module").mkdir(parents=True)
    env = {"GPUWHY_DB": str(path), "GPUWHY_PORT": str(web),
           "GPUWHY_SYS_ROOT": str(tmp_path / "sys")}

    def status(*rows, **settings):
        for source, state, detail, counters in rows:
            writer.record_health(source, state, detail, counters, now_ns())
        return collect_status(load_config(environ={**env, **settings}))

    status.env = env
    yield status
    db.close()


def test_a_running_service_with_every_part_ok_is_healthy(host):
    report = host(("fdtrack", "ok", "", {"records": 5, "dropped_ringbuf_full": 0}))
    assert (report["state"], report["limited"]) == ("healthy", {})


def test_a_degraded_part_is_degraded(host):
    report = host(("fdtrack", "degraded", "no BTF: start times from /proc", {}))
    assert (report["state"], report["degraded"]) == ("degraded", ["fdtrack"])
    assert EXIT_CODES[report["state"]] == 2


def test_a_source_whose_every_read_fails_is_degraded(host):
    failing = ("gpu", "degraded", "dcgm-exporter: forced; ERROR: http://127.0.0.1:9400/metrics:"
               " is not Prometheus text", {"read_errors": 40, "published": 0})
    report = host(failing, GPUWHY_GPU_SOURCE="dcgm-exporter",
                  GPUWHY_EXPORTER_URL="http://127.0.0.1:9400/metrics")
    assert (report["state"], report["degraded"]) == ("degraded", ["gpu"])
    # said ok by the source, yet nothing ever came of a read: still not healthy
    report = host(("gpu", "ok", "", {"read_errors": 3, "samples": 0}))
    assert (report["state"], report["degraded"]) == ("degraded", ["gpu"])


def test_a_part_that_dropped_records_is_degraded_whatever_it_says(host):
    report = host(("lifecycle", "ok", "", {"records": 9000, "dropped_ringbuf_full": 1128}))
    assert (report["state"], report["dropping"], report["degraded"]) == \
        ("degraded", ["lifecycle"], [])
    # records left out on purpose, by a setting, are no loss
    report = host(("lifecycle", "ok", "", {"dropped_ringbuf_full": 0}),
                  ("fdtrack", "ok", "", {"dropped_rate_limited_call_events": 50}))
    assert report["state"] == "healthy"


def test_the_simulator_on_a_host_without_the_nvidia_driver_is_limited_not_a_fault(host):
    gpu = ("gpu", "degraded", SIMULATED, {"samples": 10, "published": 12})
    report = host(gpu)
    assert report["state"] == "healthy" and report["degraded"] == []
    assert report["limited"] == {"gpu": "simulated GPU counters: no NVIDIA driver on this host"}
    assert host(gpu, GPUWHY_GPU_SOURCE="sim")["state"] == "healthy"


def test_the_simulator_standing_in_for_a_real_source_is_a_fault(host, tmp_path):
    gpu = ("gpu", "degraded", SIMULATED, {"samples": 10})
    # a dcgm-exporter was configured, and the source fell back to the simulator
    report = host(gpu, GPUWHY_EXPORTER_URL="http://127.0.0.1:9400/metrics")
    assert (report["state"], report["degraded"], report["limited"]) == ("degraded", ["gpu"], {})
    # the NVIDIA driver is loaded, and still the counters are simulated
    (tmp_path / "sys" / "module" / "nvidia").mkdir()
    assert host(gpu)["degraded"] == ["gpu"]
    # the simulator with an error is a fault, asked for or not
    failing = ("gpu", "degraded", f"{SIMULATED}; ERROR: read failed", {"samples": 10})
    assert host(failing, GPUWHY_GPU_SOURCE="sim")["degraded"] == ["gpu"]


def test_cron_without_journald_is_limited_only_where_no_journald_runs(host, tmp_path):
    report = host(("cron", "degraded", CRON_NO_JOURNALD, {"jobs": 3}))
    if journald_refuses():
        assert report["state"] == "healthy" and "no journald on this host" in \
            report["limited"]["cron"]
    else:
        assert report["degraded"] == ["cron"]
    # a journal named in the settings that cannot be read is a fault on any host
    report = host(("cron", "degraded", "cannot read the journal", {}),
                  GPUWHY_CRON_JOURNAL=str(tmp_path / "journal"))
    assert report["degraded"] == ["cron"]


def test_a_store_from_a_newer_gpuwhy_fails_the_store_part(host):
    db = open_store(host.env["GPUWHY_DB"])
    db["_sqlite_migrations"].insert({"migration_set": "gpuwhy", "name": "m999_next",
                                     "applied_at": "2027-01-01 00:00:00+00:00"})
    db.close()
    report = host()
    store = next(p for p in report["parts"] if p["part"] == "store")
    assert report["failed"] == ["store"] and report["state"] == "degraded"
    assert store["state"] == "failed" and "newer gpuwhy" in store["detail"]


def test_the_command_says_why_and_exits_with_it(host):
    host(("gpu", "degraded", SIMULATED, {"samples": 10}),
         ("lifecycle", "ok", "", {"dropped_ringbuf_full": 1128}),
         ("fdtrack", "degraded", "2 records or map entries lost", {}))
    result = CliRunner().invoke(cli, ["status"], env=host.env)
    assert result.exit_code == 2
    assert result.output.startswith(
        "gpuwhy DEGRADED (fdtrack degraded, lifecycle dropped records) (store ")
    assert "  limited on this host: gpu: simulated GPU counters: no NVIDIA driver on this " \
           "host\n" in result.output
    report = json.loads(CliRunner().invoke(cli, ["status", "--json"], env=host.env).output)
    assert (report["degraded"], report["dropping"]) == (["fdtrack"], ["lifecycle"])


def test_ci_s_host_reads_healthy_with_its_limits_said(host):
    """What `.venv/bin/gpuwhy status` meets in CI right after set-up: no GPU, no journald."""
    host(("gpu", "degraded", SIMULATED, {"samples": 10}),
         ("klog", "ok", "/dev/kmsg read directly", {"lines": 3}),
         ("lifecycle", "ok", "", {"records": 10, "enrich_failures": 2}))
    result = CliRunner().invoke(cli, ["status"], env=host.env)
    assert result.exit_code == 0 and result.output.startswith("gpuwhy healthy (store ")
    assert "limited on this host: gpu" in result.output


def test_the_simulated_prefix_is_what_the_gpu_source_says():
    from gpuwhy.probes.gpu.runner import health_of
    from gpuwhy.probes.gpu.sim import SimulatedGpus

    state, detail = health_of(SimulatedGpus(), ["sim: forced"], None)
    assert state == "degraded" and detail.startswith(SIMULATED_PREFIX)
