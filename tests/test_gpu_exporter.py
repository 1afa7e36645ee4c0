"""The dcgm-exporter source against a real HTTP server on loopback."""

import http.server
import itertools
import threading
import time
from pathlib import Path

import pytest

from gpuwhy.bus import Subscriber
from gpuwhy.correlator.alerts import Alerter
from gpuwhy.correlator.pipeline import Correlator
from gpuwhy.correlator.rules.signals import MemorySignals, Scope
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.events import Envelope, GpuSample, GpuSeen, GpuXid
from gpuwhy.probes.gpu.exporter import ExporterSource
from gpuwhy.probes.gpu.source import SourceUnavailable
from gpuwhy.store import open_store
from gpuwhy.store.writer import StoreWriter
from gpuwhy.webui import create_app

DATA = Path(__file__).parent / "data" / "gpu"
T4 = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"
A, B = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"


class Exporter:
    """Serves whatever ``body`` is now; ``truncate`` promises more bytes than it sends."""

    def __init__(self):
        self.body = b""
        self.truncate = False
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                length = len(owner.body) + (1000 if owner.truncate else 0)
                self.send_header("Content-Length", str(length))
                self.end_headers()
                self.wfile.write(owner.body)
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/metrics"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporter():
    server = Exporter()
    yield server
    server.close()


def _samples(events):
    return {(e.gpu_id, e.instance): e for e in events if isinstance(e, GpuSample)}


def test_legacy_layout_hostname_no_pci_bus_id(exporter):
    exporter.body = (DATA / "legacy-t4.prom").read_bytes()
    source = ExporterSource(exporter.url)
    gpus = source.open()
    assert {g.id for g in gpus} == {T4, "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5"}
    t4 = next(g for g in gpus if g.id == T4)
    assert (t4.model, t4.driver_version, t4.identity.minor, t4.identity.index) == \
        ("Tesla T4", "460.106.00", 0, 0)
    assert t4.identity.pci_bus_id is None
    sample = _samples(source.read())[(T4, "")]
    assert sample.fields["sm_clock_mhz"] == 300
    assert sample.fields["power_w"] == pytest.approx(8.969)
    assert sample.fields["energy_mj"] == 128996013   # a counter: the parser calls it *_total
    assert sample.fields["fb_used_mib"] == 0 and "xid" not in sample.fields
    assert sample.source == "dcgm-exporter" and sample.simulated is False


def test_current_layout_sentinels_units_mig_and_pods(exporter):
    exporter.body = (DATA / "current-mig-pod.prom").read_bytes()
    source = ExporterSource(exporter.url)
    source.open()
    by_id = {g.id: g for g in source.gpus}
    assert by_id[A].identity.pci_bus_id == "0000:1b:00.0"
    assert by_id[B].identity.minor == 1
    samples = _samples(source.read())
    whole = samples[(A, "")]
    assert whole.fields["temp_c"] == 61
    assert "mem_temp_c" not in whole.fields            # 9223372036854775794 = NOT_SUPPORTED
    assert whole.fields["sm_clock_mhz"] == pytest.approx(1410)   # HELP says Hz
    assert whole.fields["gpu_util"] == pytest.approx(87)         # a 0-1 ratio, renamed metric
    assert whole.labels == {"pod": "train-0", "namespace": "ml", "container": "trainer"}
    assert "temp_c" not in samples.get((B, ""), GpuSample(0, gpu_id=B, source="x",
                                                          simulated=False, fields={})).fields
    assert "power_w" not in samples.get((B, ""), GpuSample(0, gpu_id=B, source="x",
                                                           simulated=False, fields={})).fields
    assert samples[(B, "1")].fields == {"gr_engine_active": 0.25}
    assert samples[(B, "1")].labels["pod"] == "infer-7"
    assert samples[(B, "1")].labels["mig_profile"] == "3g.40gb"
    assert samples[(B, "2")].fields == {"gr_engine_active": 0.75}
    assert source.dropped >= 3   # two sentinels and one absurd temperature per scrape


def test_garbage_is_one_clear_error_and_the_source_keeps_trying(exporter):
    exporter.body = (DATA / "current-mig-pod.prom").read_bytes()
    source = ExporterSource(exporter.url)
    source.open()
    exporter.body = b"<html><body>502 Bad Gateway</body></html>\n"
    with pytest.raises(SourceUnavailable, match="is not Prometheus text"):
        source.read()
    exporter.body = b"# HELP x\nnothing_here 1\n"
    with pytest.raises(SourceUnavailable, match="no DCGM GPU metrics"):
        source.read()
    exporter.body = (DATA / "current-mig-pod.prom").read_bytes()
    assert (A, "") in _samples(source.read())


def test_truncated_response_is_an_error_not_half_a_sample(exporter):
    exporter.body = (DATA / "current-mig-pod.prom").read_bytes()
    source = ExporterSource(exporter.url)
    source.open()
    exporter.truncate = True
    with pytest.raises(SourceUnavailable, match="truncated response"):
        source.read()


def test_xid_gauge_change_becomes_an_event(exporter):
    text = (DATA / "current-mig-pod.prom").read_text()
    exporter.body = text.encode()
    source = ExporterSource(exporter.url)
    first = source.open()
    assert first and not [e for e in source.read() if isinstance(e, GpuXid)]
    exporter.body = text.replace('DCGM_FI_DRIVER_VERSION="550.54.15"} 0',
                                 'DCGM_FI_DRIVER_VERSION="550.54.15"} 79').encode()
    [xid] = [e for e in source.read() if isinstance(e, GpuXid)]
    assert (xid.gpu_id, xid.xid) == (A, 79)


def test_unreachable_and_unconfigured():
    with pytest.raises(SourceUnavailable, match="not configured"):
        ExporterSource("")
    with pytest.raises(SourceUnavailable, match="cannot scrape"):
        ExporterSource("http://127.0.0.1:1/metrics", timeout=1).open()


def test_new_gpu_is_announced_once(exporter):
    exporter.body = (DATA / "current-mig-pod.prom").read_bytes()
    source = ExporterSource(exporter.url)
    seen = [e for e in source.read() if isinstance(e, GpuSeen)]
    assert {e.gpu_id for e in seen} == {A, B}
    assert not [e for e in source.read() if isinstance(e, GpuSeen)]


def _xids(events):
    return [e for e in events if isinstance(e, GpuXid)]


def test_xid_gauge_set_at_the_first_scrape_is_kept_marked_before_start(exporter):
    # open()'s own read is thrown away by select.py: the Xid must reach the next read once
    exporter.body = (DATA / "xid-before-start.prom").read_bytes()
    source = ExporterSource(exporter.url)
    before = time.time_ns()
    source.open()
    [xid] = _xids(source.read())
    assert (xid.gpu_id, xid.xid, xid.before_start, xid.source) == (A, 48, True,
                                                                    "dcgm-exporter")
    assert before <= xid.ts <= time.time_ns()           # the first read's time: no other
    assert xid.detail.startswith("last Xid 48, before gpuwhy started")
    assert "unknown time" in xid.detail
    assert not _xids(source.read())                     # published once, GPU 1 (0): never
    text = (DATA / "xid-before-start.prom").read_text()
    exporter.body = text.replace('"550.54.15"} 48', '"550.54.15"} 79').replace(
        '"550.54.15"} 0', '"550.54.15"} 13').encode()
    later = _xids(source.read())
    assert sorted((x.gpu_id, x.xid, x.before_start) for x in later) == [
        (A, 79, False), (B, 13, False)]
    assert all(x.detail == "dcgm-exporter last-Xid gauge changed" for x in later)


def test_xid_gauge_at_the_first_scrape_without_open_is_kept_too(exporter):
    exporter.body = (DATA / "xid-before-start.prom").read_bytes()
    source = ExporterSource(exporter.url)
    assert [(x.gpu_id, x.xid, x.before_start) for x in _xids(source.read())] == [
        (A, 48, True)]
    assert not _xids(source.read())


def test_xid_gauge_zero_at_the_first_scrape_is_nothing(exporter):
    exporter.body = (DATA / "xid-before-start.prom").read_bytes().replace(
        b'"550.54.15"} 48', b'"550.54.15"} 0')
    source = ExporterSource(exporter.url)
    source.open()
    assert not _xids(source.read()) and not _xids(source.read())


def _flush(correlator, events, seq):
    correlator.pending = [Envelope("test", next(seq), e) for e in events]
    correlator._last_decide = 0.0
    correlator.flush()
    assert not correlator.store_error, correlator.store_error


def test_xid_before_start_is_stored_shown_and_opens_no_incident(exporter, tmp_config):
    """Exporter -> the real correlator (writer, incidents, rules) -> store -> GPU page."""
    exporter.body = (DATA / "xid-before-start.prom").read_bytes()
    source = ExporterSource(exporter.url)
    source.open()
    db = open_store(tmp_config["store.path"])
    subscriber = Subscriber(tmp_config["bus.endpoint"])
    alerts: list = []
    correlator = Correlator(tmp_config, db, subscriber,
                            Alerter(tmp_config["correlator.url"],
                                    send=lambda *a, **k: alerts.append(a)))
    seq = itertools.count()
    try:
        gpus = [g.seen(time.time_ns(), source.name, False) for g in source.gpus]
        first = source.read()
        assert [x.before_start for x in _xids(first)] == [True]
        _flush(correlator, gpus + first + source.read(), seq)
        rows = db.execute("select gpu_id, json_extract(body, '$.xid'), "
                          "json_extract(body, '$.before_start'), ts from events "
                          "where kind = 'gpu_xid'").fetchall()
        assert [r[:3] for r in rows] == [(A, 48, 1)]
        gpu = db.execute("select xid_before_start, xid_before_start_seen from gpus "
                         "where id = ?", [A]).fetchone()
        assert gpu == (48, rows[0][3])
        assert db.execute("select xid_before_start from gpus where id = ?",
                          [B]).fetchone() == (None,)
        assert db.execute("select count(*) from incidents").fetchone() == (0,)
        assert not alerts
        # a later Xid is a normal one: an incident dated when it was seen
        text = (DATA / "xid-before-start.prom").read_text()
        exporter.body = text.replace('"550.54.15"} 48', '"550.54.15"} 79').encode()
        _flush(correlator, source.read(), seq)
        incidents = db.execute("select kind, gpu_id, title from incidents").fetchall()
        assert incidents == [("gpu_lost", A, incidents[0][2])]
        assert incidents[0][2].startswith("Xid 79")
    finally:
        subscriber.close()
        db.close()
    client = create_app(tmp_config).test_client()
    page = client.get(f"/gpus/{A}").get_data(as_text=True)
    assert "last Xid 48 (before gpuwhy started)" in page
    other = client.get(f"/gpus/{B}").get_data(as_text=True)
    assert "before gpuwhy started" not in other
    assert client.get(f"/api/gpus/{A}").get_json()["xid_before_start"] == 48


def test_rules_do_not_count_an_xid_from_before_start(tmp_config):
    """Live (bus) and store-fed rule signals alike: an Xid with no time of its own is not one
    in a rule's window (R33 would call Xid 48 a fresh double-bit ECC error)."""
    now = time.time_ns()
    old = GpuXid(ts=now, gpu_id=A, xid=48, source="dcgm-exporter", simulated=False,
                 before_start=True, detail="last Xid 48, before gpuwhy started")
    new = GpuXid(ts=now + 1, gpu_id=A, xid=13, source="dcgm-exporter", simulated=False)
    db = open_store(tmp_config["store.path"])
    try:
        StoreWriter(db).write_batch([Envelope("t", 0, old), Envelope("t", 1, new)])
    finally:
        db.close()
    memory = MemorySignals()
    memory.feed([old, new])
    store = StoreSignals(open_store(tmp_config["store.path"], readonly=True))
    for signals in (memory, store):
        signals.begin(now + 10)
        rows = signals.events(Scope(A), "gpu.xid", now - 10**9, now + 10)
        assert [row["code"] for _, row in rows] == [13], signals


# An H100 SXM node in dcgm-exporter's layout, the NVLink and remap rows switched on in its
# counters CSV: GPU A under legacy (≤4.8) metric names at Gen5 x16, GPU B (an NVLink-less
# PCIe card, idle at Gen1) under DCGM 4.6 names; blank NVLink rows as old exporters print them.
_LABELS = ('gpu="{i}",UUID="{uuid}",pci_bus_id="00000000:{bus}:00.0",device="nvidia{i}",'
           'modelName="{model}",hostname="node1",DCGM_FI_DRIVER_VERSION="570.124.06"')
_A = _LABELS.format(i=0, uuid=A, bus="1B", model="NVIDIA H100 80GB HBM3")
_B = _LABELS.format(i=1, uuid=B, bus="2B", model="NVIDIA H100 PCIe")
LINK_SCRAPE = f"""\
# HELP DCGM_FI_DEV_PCIE_LINK_GEN PCIe current link generation.
# TYPE DCGM_FI_DEV_PCIE_LINK_GEN gauge
DCGM_FI_DEV_PCIE_LINK_GEN{{{_A}}} 5
DCGM_FI_DEV_PCIE_LINK_GEN{{{_B}}} 1
# HELP DCGM_FI_DEV_PCIE_LINK_WIDTH PCIe current link width.
# TYPE DCGM_FI_DEV_PCIE_LINK_WIDTH gauge
DCGM_FI_DEV_PCIE_LINK_WIDTH{{{_A}}} 16
DCGM_FI_DEV_PCIE_LINK_WIDTH{{{_B}}} 16
# HELP DCGM_FI_DEV_PCIE_MAX_LINK_GEN PCIe max link generation.
# TYPE DCGM_FI_DEV_PCIE_MAX_LINK_GEN gauge
DCGM_FI_DEV_PCIE_MAX_LINK_GEN{{{_A}}} 5
DCGM_FI_DEV_PCIE_MAX_LINK_GEN{{{_B}}} 5
# HELP DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH PCIe max link width.
# TYPE DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH gauge
DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH{{{_A}}} 16
DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH{{{_B}}} 16
# HELP DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL Total number of NVLink flow-control CRC errors.
# TYPE DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{_A}}} 7
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{_B}}} 9223372036854775794
# HELP DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL Total number of NVLink data CRC errors.
# TYPE DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{{{_A}}} 2
# HELP DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL Total number of NVLink retries.
# TYPE DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{{{_A}}} 41
# HELP DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL Total number of NVLink recovery errors.
# TYPE DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{{_A}}} 1
# HELP DCGM_FI_DEV_ROW_REMAP_PENDING Whether remapping of rows is pending.
# TYPE DCGM_FI_DEV_ROW_REMAP_PENDING gauge
DCGM_FI_DEV_ROW_REMAP_PENDING{{{_A}}} 0
DCGM_FI_DEV_ROW_REMAP_PENDING{{{_B}}} 1
"""
RENAMED = {"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL":
           "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
           "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL":
           "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL",
           "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
           "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL":
           "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL"}


@pytest.mark.parametrize("names", ["legacy", "dcgm-4.6"])
def test_pcie_link_nvlink_errors_and_remap_pending(exporter, names):
    body = LINK_SCRAPE
    if names == "dcgm-4.6":
        for old, new in RENAMED.items():
            body = body.replace(old, new)
    exporter.body = body.encode()
    source = ExporterSource(exporter.url)
    source.open()
    samples = _samples(source.read())
    a, b = samples[(A, "")].fields, samples[(B, "")].fields
    assert a == {"pcie_link_gen": 5, "pcie_link_width": 16, "pcie_link_gen_max": 5,
                 "pcie_link_width_max": 16, "nvlink_crc_flit_errors": 7,
                 "nvlink_crc_data_errors": 2, "nvlink_replay_errors": 41,
                 "nvlink_recovery_errors": 1, "row_remap_pending": 0}
    # no NVLink on B: its one NVLink row is the NOT_SUPPORTED sentinel, dropped, not a 0
    assert b == {"pcie_link_gen": 1, "pcie_link_width": 16, "pcie_link_gen_max": 5,
                 "pcie_link_width_max": 16, "row_remap_pending": 1}
    assert source.dropped >= 1


# The fabric rows as a counters CSV that lists fields 170 and 175 prints them: GPU A an HGX
# H100 whose Fabric Manager never started, with no health summary yet (DCGM's blank); GPU B a
# PCIe card, no fabric (NotSupported, 0). An out-of-range code is garbage, dropped.
FABRIC_SCRAPE = f"""\
# HELP DCGM_FI_DEV_FABRIC_MANAGER_STATUS The status of the fabric manager.
# TYPE DCGM_FI_DEV_FABRIC_MANAGER_STATUS gauge
DCGM_FI_DEV_FABRIC_MANAGER_STATUS{{{_A}}} 1
DCGM_FI_DEV_FABRIC_MANAGER_STATUS{{{_B}}} 0
# HELP DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY The health summary of the GPU fabric.
# TYPE DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY gauge
DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY{{{_A}}} 2147483632
DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY{{{_B}}} 0
"""


def test_fabric_state_and_health_summary(exporter):
    exporter.body = FABRIC_SCRAPE.encode()
    source = ExporterSource(exporter.url)
    source.open()
    samples = _samples(source.read())
    assert samples[(A, "")].fields == {"fabric_state": 1}      # the blank summary dropped
    assert samples[(B, "")].fields == {"fabric_state": 0, "fabric_health": 0}
    exporter.body = FABRIC_SCRAPE.replace('"} 1\n', '"} 9\n').encode()
    again = _samples(source.read())
    assert (A, "") not in again and again[(B, "")].fields["fabric_state"] == 0
