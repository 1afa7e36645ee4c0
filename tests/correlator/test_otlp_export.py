"""OTLP export (gpuwhy/app/otlp.py, gpuwhy/app/otlp_export.py) with the real OpenTelemetry SDK and
OTLP/HTTP exporters, into a receiver on 127.0.0.1 that decodes what arrives with the
opentelemetry-proto messages: the families /metrics serves for the same store (names, labels,
kinds, units), an incident change as one log record (sent once, resumed after a restart), a
collector that stalls (nothing waits on it, the drops are counted and shown), and no endpoint
(nothing starts)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families

from gpuwhy.app import otlp
from gpuwhy.app.status import dropped
from gpuwhy.identity import ProcessKey
from gpuwhy.store import alertpush, open_store
from gpuwhy.store import incident_changes as store_lifecycle
from gpuwhy.store.queries import list_incidents, source_health
from gpuwhy.webui import create_app

from .conftest import UUID0

TRAINER = ProcessKey(4242, 1000)
UUID1 = "GPU-11111111-2222-3333-4444-555555555555"
OTEL_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
             "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
             "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER", "OTEL_RESOURCE_ATTRIBUTES",
             "OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_BLRP_MAX_QUEUE_SIZE",
             "OTEL_BLRP_SCHEDULE_DELAY", "OTEL_EXPORTER_OTLP_HEADERS")


class Receiver:
    """An OTLP/HTTP endpoint: keeps each decoded request (and its headers)."""

    def __init__(self) -> None:
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.logs: list[ExportLogsServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.path == "/v1/metrics":
                    receiver.metrics.append(ExportMetricsServiceRequest.FromString(body))
                    answer = ExportMetricsServiceResponse()
                elif self.path == "/v1/logs":
                    receiver.logs.append(ExportLogsServiceRequest.FromString(body))
                    answer = ExportLogsServiceResponse()
                else:
                    self.send_error(404)
                    return
                data = answer.SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def log_records(self) -> list:
        return [record for request in self.logs for rl in request.resource_logs
                for sl in rl.scope_logs for record in sl.log_records]


class Stalled:
    """A collector that accepts connections and never reads or answers."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(connection)

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        for connection in self.held:
            connection.close()


@pytest.fixture
def otel_env(monkeypatch):
    """No OTEL_* variable from the environment the tests run in."""
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def receiver():
    made = Receiver()
    yield made
    made.close()


def lost_gpu(h) -> int:
    """GPU 0 lost to an Xid 79 under a trainer (one incident); GPU 1 healthy and sampled."""
    h.feed(h.gpu(0), h.gpu(0, uuid=UUID1, minor=1, pci="0000:3b:00.0"),
           h.process(0.1, TRAINER, "python3"), h.opened(0.2, TRAINER),
           h.sample(0.5, 95.0), h.sample(0.5, 40.0, uuid=UUID1))
    h.feed(h.xid(1.0, 79, pid=TRAINER.pid, name="python3"))
    [incident] = list_incidents(h.db)
    return incident["id"]


def exporter_on(h, **settings):
    from gpuwhy.app.otlp_export import OtlpExporter

    config = h.config.replace({"web.hostname": "node-7", **settings})
    return OtlpExporter(config, open_store(config["store.path"]))


def attributes(pairs) -> dict:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in pairs}


def received_metrics(request: ExportMetricsServiceRequest) -> dict[str, tuple[str, object]]:
    """name -> (kind, metric) of one export."""
    found = {}
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                found[metric.name] = (metric.WhichOneof("data"), metric)
    return found


def label_sets(points) -> set[frozenset]:
    return {frozenset(attributes(p.attributes).items()) for p in points}


def test_the_metrics_families_and_an_incident_change_reach_an_otlp_receiver(
        harness, receiver, otel_env):
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    otel_env.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0ken")
    otel_env.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=train-a,host.name=node-7b")
    incident_id = lost_gpu(harness)
    exporter = exporter_on(harness)
    try:
        assert exporter.export_metrics()
        [request] = receiver.metrics
        assert receiver.headers[0]["authorization"] == "Bearer t0ken"
        assert receiver.headers[0]["content-type"] == "application/x-protobuf"
        [resource_metrics] = request.resource_metrics
        resource = attributes(resource_metrics.resource.attributes)
        assert resource["k8s.cluster.name"] == "train-a"
        assert resource["host.name"] == "node-7b"        # the variable wins over the setting
        assert resource["service.name"] == "gpuwhy"
        assert resource["service.instance.id"] == "node-7"     # the web.hostname setting
        got = received_metrics(request)
        # what /metrics serves for the same store: every family with a series is there, its
        # counters as monotonic cumulative sums, with the same label sets
        text = create_app(exporter.config).test_client().get("/metrics").data.decode()
        scraped = {f.name: f for f in text_string_to_metric_families(text) if f.samples}
        assert {"gpuwhy_gpu_health", "gpuwhy_gpu_xid_errors", "gpuwhy_incidents",
                "gpuwhy_gpu_utilization_ratio", "process_cpu_seconds"} <= set(scraped)
        assert set(scraped) <= set(got), set(scraped) - set(got)
        for name, family in scraped.items():
            kind, metric = got[name]
            if family.type == "counter":
                assert kind == "sum", name
                assert metric.sum.is_monotonic and metric.sum.aggregation_temporality == 2
                points = metric.sum.data_points
                samples = [s for s in family.samples if s.name.endswith("_total")]
            else:
                assert kind == "gauge", name
                points = metric.gauge.data_points
                samples = family.samples
            assert label_sets(points) == {frozenset(s.labels.items()) for s in samples}, name
        assert got["gpuwhy_gpu_utilization_ratio"][1].unit == "1"
        assert got["gpuwhy_gpu_last_sample_timestamp_seconds"][1].unit == "s"
        assert got["process_resident_memory_bytes"][1].unit == "By"
        [util] = got["gpuwhy_gpu_utilization_ratio"][1].gauge.data_points
        assert attributes(util.attributes)["UUID"] == UUID1 and util.as_double == 0.4
        _, xids = got["gpuwhy_gpu_xid_errors"]
        [xid] = xids.sum.data_points
        assert attributes(xid.attributes)["xid"] == "79"
        assert getattr(xid, xid.WhichOneof("value")) == 1
        assert attributes(xid.attributes)["UUID"] == UUID0

        exporter.step()                      # the first run stores the newest cursor only
        assert alertpush.cursor(exporter.db, "otlp") is not None
        store_lifecycle.acknowledge(harness.db, incident_id, "alice")
        exporter.step()
        exporter.logger_provider.force_flush()
        [record] = receiver.log_records()
        assert record.severity_number == 21 and record.severity_text == "critical"
        assert record.body.string_value.startswith(
            f"gpuwhy incident {incident_id} acknowledged by alice: ")
        assert record.event_name == "gpuwhy.incident.acknowledged"
        assert not record.trace_id and not record.span_id
        fields = attributes(record.attributes)
        assert fields["gpuwhy.incident.id"] == incident_id
        assert fields["gpuwhy.incident.kind"] == "gpu_lost"
        assert fields["gpuwhy.incident.gpu_uuid"] == UUID0
        assert fields["gpuwhy.change.actor"] == "alice"
        assert fields["gpuwhy.incident.state"] == "acknowledged"
    finally:
        exporter.stop()
        exporter.db.close()
    # a restart resumes after the last change handed over: nothing is sent twice
    again = exporter_on(harness)
    try:
        again.step()
        store_lifecycle.resolve(harness.db, incident_id, "bob")
        again.step()
        again.logger_provider.force_flush()
        actions = [attributes(r.attributes)["gpuwhy.change.action"]
                   for r in receiver.log_records()]
        assert actions == ["acknowledged", "resolved"]
        assert receiver.log_records()[-1].severity_number == 21
    finally:
        again.stop()
        again.db.close()
    [row] = [r for r in source_health(harness.db) if r["source"] == "otlp"]
    assert row["state"] == "ok" and row["counters"]["log_records_exported"] == 1
    assert dropped(row["counters"]) == 0


def test_a_stalled_collector_blocks_nothing_and_its_drops_are_counted(harness, otel_env):
    stalled = Stalled()
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", stalled.url)
    otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")     # seconds (the Python SDK's reading)
    otel_env.setenv("OTEL_BLRP_MAX_QUEUE_SIZE", "4")
    otel_env.setenv("OTEL_BLRP_SCHEDULE_DELAY", "50")
    incident_id = lost_gpu(harness)
    exporter = exporter_on(harness)
    try:
        exporter.take_in()                   # the first run stores the cursor
        for n in range(12):
            store_lifecycle.note(harness.db, incident_id, "alice", f"note {n}")
        began = time.monotonic()
        taken = exporter.take_in()
        assert time.monotonic() - began < 0.5
        assert 0 < taken <= 4                # only as far as the queue has room: the rest
        newest = max(c for (c,) in harness.db.execute("select id from incident_log"))
        assert alertpush.cursor(exporter.db, "otlp") == newest - 12 + taken   # waits in
        deadline = time.monotonic() + 10     # the store behind the cursor, not in memory
        while exporter.figures.dropped_log_records == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert exporter.figures.dropped_log_records > 0
        # the metric export waits on the stalled collector within the exporter's timeout
        done = threading.Event()
        threading.Thread(target=lambda: (exporter.export_metrics(), done.set()),
                         daemon=True).start()
        assert done.wait(5)
        assert exporter.figures.dropped_metric_exports >= 1
        state, detail = exporter.state()
        assert state == "down" and stalled.url in detail
        began = time.monotonic()
        exporter.start()                     # threads of its own: returns at once
        assert time.monotonic() - began < 0.5
        time.sleep(1.5)                      # its threads meet the stalled collector too
        began = time.monotonic()
    finally:
        exporter.stop(timeout=3)
        stopped_in = time.monotonic() - began
        exporter.db.close()
        stalled.close()
    assert stopped_in < 8
    [row] = [r for r in source_health(harness.db) if r["source"] == "otlp"]
    assert row["state"] == "down" and dropped(row["counters"]) > 0
    assert row["counters"]["dropped_metric_exports"] >= 1
    # and /metrics shows the drops
    text = create_app(harness.config).test_client().get("/metrics").data.decode()
    assert 'gpuwhy_events_lost_total{reason="dropped_log_records",source="otlp"}' in text


def test_no_endpoint_starts_nothing(harness, otel_env):
    otel_env.setenv("OTEL_EXPORTER_OTLP_HEADERS", "a=b")      # set, but no endpoint
    assert not otlp.plan().enabled
    assert otlp.start_otlp(harness.config) is None
    assert not [t for t in threading.enumerate() if t.name.startswith("gpuwhy-otlp")]
    assert not [r for r in source_health(harness.db) if r["source"] == "otlp"]
    # nor is the SDK imported (~9 MB of the sidecar): this process has it, so ask a fresh one
    probe = ("import sys; from gpuwhy.app import otlp; from gpuwhy.config import load_config; "
             "assert otlp.start_otlp(load_config(environ={}), environ={}) is None; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'opentelemetry', 'google'}))")
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.strip() == "[]", ran.stdout + ran.stderr
    # one signal's own endpoint turns that signal on alone; another protocol turns it off
    otel_env.setenv("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://127.0.0.1:9/logs")
    wanted = otlp.plan()
    assert wanted.logs.endpoint == "http://127.0.0.1:9/logs" and wanted.metrics.endpoint is None
    otel_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert not otlp.plan().enabled and "grpc" in otlp.plan().describe()
    with contextlib.suppress(KeyError):
        otel_env.delenv("OTEL_EXPORTER_OTLP_PROTOCOL")
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9/")
    otel_env.setenv("OTEL_LOGS_EXPORTER", "none")
    wanted = otlp.plan()
    assert wanted.metrics.endpoint == "http://127.0.0.1:9/v1/metrics" and not wanted.logs.endpoint


def test_a_value_the_sdk_refuses_is_said_and_starts_nothing(harness, otel_env):
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    otel_env.setenv("OTEL_BLRP_SCHEDULE_DELAY", "0")          # the SDK raises on it
    assert otlp.start_otlp(harness.config) is None
    assert not [t for t in threading.enumerate() if t.name.startswith("gpuwhy-otlp")]
    [row] = [r for r in source_health(harness.db) if r["source"] == "otlp"]
    assert row["state"] == "down" and "schedule_delay" in row["detail"]


def test_the_service_starts_the_export_only_with_an_endpoint(tmp_config, otel_env, receiver):
    from gpuwhy.app.service import Service

    def otlp_threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("gpuwhy-otlp")]

    service = Service(tmp_config.replace({"web.port": 0}), with_probes=False, sources={})
    try:
        service.start()
        assert service.otlp is None and otlp_threads() == []
    finally:
        service.stop()
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    service = Service(tmp_config.replace({"web.port": 0, "otlp.interval": 1.0}),
                      with_probes=False, sources={})
    try:
        service.start()
        assert service.otlp is not None
        assert sorted(otlp_threads()) == ["gpuwhy-otlp-feed", "gpuwhy-otlp-metrics"]
        deadline = time.monotonic() + 10
        while not receiver.metrics and time.monotonic() < deadline:
            time.sleep(0.1)
        assert receiver.metrics                  # every otlp.interval, on its own thread
    finally:
        service.stop()
    assert otlp_threads() == []
    with contextlib.closing(open_store(tmp_config["store.path"], readonly=True)) as db:
        [row] = [r for r in source_health(db) if r["source"] == "otlp"]
    assert row["state"] == "ok" and receiver.url in row["detail"]


def test_the_cached_encoder_makes_what_the_sdks_encoder_makes():
    """gpuwhy/app/otlp_encode.py against the SDK's own encoder, on gauges and sums whose label
    sets repeat (the second encode reuses the first one's attributes), ints and floats, and
    a resource with non-string attributes."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from gpuwhy.app.otlp_encode import MetricsEncoder

    gpu = {"gpu": "0", "UUID": UUID0, "Hostname": "node-7"}
    gauge = Metric("gpuwhy_gpu_utilization_ratio", "GPU busy share", "1", Gauge([
        NumberDataPoint(gpu, 0, 2_000, 0.4), NumberDataPoint({**gpu, "gpu": "1"}, 0, 2_000, 1)]))
    total = Metric("gpuwhy_gpu_xid_errors", "Xid lines", "", Sum([
        NumberDataPoint({**gpu, "xid": "79"}, 1_000, 2_000, 3)],
        AggregationTemporality.CUMULATIVE, True))
    data = MetricsData([ResourceMetrics(
        Resource.create({"host.name": "node-7", "k8s.node.uid": 7, "gpuwhy.test": True}),
        [ScopeMetrics(InstrumentationScope("gpuwhy", "1.0"), [gauge, total], "")], "")])
    encoder = MetricsEncoder()
    for _ in range(2):
        assert encoder.encode(data) == encode_metrics(data)
