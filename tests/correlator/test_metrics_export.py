"""`/metrics` as Prometheus reads it: every field of the catalogue, health, Xids by code,
rule findings, idle-while-held owners, the GPU info metric and the process's own figures,
through the real correlator and store, and clean for the real `promtool check metrics`."""

import math
import socket
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwhy.events import GpuSample, ProcessSeen, RuleFinding
from gpuwhy.gpufields import SAMPLE_FIELDS, THROTTLE_BITS, Field
from gpuwhy.identity import ProcessKey
from gpuwhy.store import open_store, queries
from gpuwhy.webui import create_app
from gpuwhy.webui.metrics import FIELD_METRICS, StoreCollector, dcgm_pci, field_metric
from gpuwhy.xid import xid_info

from .conftest import UUID0

TRAINER = ProcessKey(4242, 1000)
POD = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
CONTAINER = "ab" * 32


def _value(field: Field) -> float:
    """A plausible reading of ``field`` (inside its range, not 0, so that scaling shows)."""
    if field.name == "clocks_event_reasons":
        return float(THROTTLE_BITS["HW_SLOWDOWN"] | THROTTLE_BITS["IDLE"])
    if field.unit == "flag":
        return 1.0
    if not math.isfinite(field.high):     # counters: large enough for any storage scale
        return 12_345_678_000.0
    return min(field.high, 7 * 1024.0)    # whole KiB: B/s are stored in KiB/s


def _full_sample(h, t):
    fields = {f.name: _value(f) for f in SAMPLE_FIELDS}
    fields["row_remap_failed"] = 0.0   # a failure would make the GPU reset_required
    fields["ecc_dbe_volatile"] = 0.0
    fields["clocks_event_reasons"] = float(THROTTLE_BITS["IDLE"])   # not throttled
    return GpuSample(ts=h.at(t), gpu_id=UUID0, source="sim", simulated=True, fields=fields)


def _pod_process(h, t, key=TRAINER, uid=0, pod=POD, container=CONTAINER):
    return ProcessSeen(ts=h.at(t), process=key, comm="python3", cmdline="python3 train.py",
                       exe="/usr/bin/python3", ppid=1, uid=uid, cgroup="/kubepods/x",
                       container_id=container, pod_uid=pod)


def _scrape(client):
    text = client.get("/metrics").data.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return text, families


def _samples(family, **labels):
    return [s for s in family.samples
            if all(s.labels.get(k) == v for k, v in labels.items())]


def test_every_catalogue_field_the_store_keeps_is_exported_in_base_units(harness):
    h = harness
    client = create_app(h.config).test_client()
    sample = _full_sample(h, 2.0)
    fields = sample.fields
    h.feed(h.gpu(0), sample)
    _, families = _scrape(client)
    store = open_store(h.config["store.path"], readonly=True)
    kept = store["gpu_samples"].columns_dict
    stored = queries.latest_sample(store, UUID0)     # in the field table's units
    checked = 0
    for name, metric in FIELD_METRICS.items():
        if name not in kept:
            continue
        family = families[metric.name]
        assert family.type == ("counter" if metric.counter else "gauge"), name
        [sample] = _samples(family, gpu=UUID0)
        assert stored[name] is not None, name
        assert sample.value == pytest.approx(stored[name] * metric.scale, rel=1e-9), name
        # and what was read arrived (storage rounds to its own resolution)
        assert stored[name] == pytest.approx(fields[name], rel=2e-3, abs=1e-3), name
        checked += 1
    assert checked >= 25            # the whole table, not a few names
    reasons = {s.labels["reason"]: s.value for s in _samples(
        families["gpuwhy_gpu_clocks_event_reason"], gpu=UUID0)}
    assert reasons == {r.lower(): float(r == "IDLE") for r in THROTTLE_BITS}
    # names kept from before, and the generic ones of clocks and energy
    assert "gpuwhy_gpu_utilization_ratio" in families
    assert FIELD_METRICS["sm_clock_mhz"].name == "gpuwhy_gpu_sm_clock_hertz"
    assert FIELD_METRICS["energy_mj"].name == "gpuwhy_gpu_energy_joules"
    assert families["gpuwhy_gpu_energy_joules"].type == "counter"
    [energy] = _samples(families["gpuwhy_gpu_energy_joules"], gpu=UUID0)
    assert energy.name == "gpuwhy_gpu_energy_joules_total"


def test_a_new_catalogue_field_needs_no_code_of_its_own():
    counter = field_metric(Field("nvlink_crc_errors", 9001, "count", "-", ("X",)))
    assert (counter.name, counter.counter, counter.scale) == ("gpuwhy_gpu_nvlink_crc_errors",
                                                             True, 1.0)
    gauge = field_metric(Field("pcie_link_gen", 9002, "gen", "-", ("Y",)))
    assert (gauge.name, gauge.counter) == ("gpuwhy_gpu_pcie_link_gen", False)
    ratio = field_metric(Field("gpm_sm_util", 9003, "%", "-", ("Z",)))
    assert (ratio.name, ratio.scale) == ("gpuwhy_gpu_gpm_sm_util_ratio", 0.01)


def test_dcgm_exporter_pci_form():
    assert dcgm_pci("0000:3b:00.0") == "00000000:3B:00.0"
    assert dcgm_pci("3b:00.0") == "00000000:3B:00.0"
    assert dcgm_pci(None) == ""


def test_health_xids_findings_info_and_process_labels(harness):
    h = harness
    client = create_app(h.config).test_client()
    h.feed(h.gpu(0), _pod_process(h, 0.1), h.opened(0.2, TRAINER), _full_sample(h, 2.0),
           h.xid(3.0, 13, pid=TRAINER.pid), h.xid(3.5, 13, pid=TRAINER.pid),
           h.xid(4.0, 9999), h.xid(4.5, 109), h.xid(5.0, 79),
           RuleFinding(ts=h.at(5.5), finding_id="f1", rule_id="R01_input_cpu_bound",
                       title="t", severity="warning", state="firing", gpu_id=UUID0,
                       process=TRAINER))
    _, families = _scrape(client)
    ids = {"gpu": UUID0, "UUID": UUID0, "pci_bus_id": "00000000:18:00.0",
           "Hostname": socket.gethostname(), "simulated": "true"}
    health = {s.labels["state"]: s.value for s in _samples(families["gpuwhy_gpu_health"], **ids)}
    assert health["lost"] == 1 and sum(health.values()) == 1
    xids = {(s.labels["xid"], s.labels["severity"]): s.value
            for s in _samples(families["gpuwhy_gpu_xid_errors"], **ids)}
    assert xids[("13", "error")] == 2 and xids[("79", "critical")] == 1
    assert xids[("other", "warning")] == 1       # 9999 is not in the catalogue
    # 109 is, though the catalogue names no origin for it: its own series
    assert xids[("109", xid_info(109).severity)] == 1
    # the one answer per GPU: lost (critical) outranks the starved loader (warning)
    [answer] = _samples(families["gpuwhy_gpu_answer"], **ids)
    assert (answer.labels["rule"], answer.labels["kind"], answer.labels["severity"],
            answer.value) == ("health:lost", "health", "critical", 1)
    [finding] = families["gpuwhy_rule_findings_open"].samples
    assert finding.labels == {"rule": "R01_input_cpu_bound", "severity": "warning"}
    assert finding.value == 1
    [info] = _samples(families["gpuwhy_gpu_info"], **ids)
    assert info.labels["source"] == "sim" and info.value == 1 and "driver_version" in info.labels
    # a lost GPU's last numbers are not exported, its identity and health are
    assert not _samples(families["gpuwhy_gpu_utilization_ratio"], gpu=UUID0)
    # the sidecar's own figures
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    assert "python_info" in families


def test_promtool_check_metrics_is_clean(harness, installed):
    promtool = installed("promtool")
    h = harness
    client = create_app(h.config).test_client()
    h.feed(h.gpu(0), _pod_process(h, 0.1), h.opened(0.2, TRAINER), _full_sample(h, 2.0),
           h.xid(3.0, 13, pid=TRAINER.pid), h.xid(4.0, 48),
           RuleFinding(ts=h.at(5.5), finding_id="f1", rule_id="R01_input_cpu_bound",
                       title="t", severity="error", state="firing", gpu_id=UUID0,
                       process=TRAINER))
    text, families = _scrape(client)
    assert len(families) >= 60
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                            text=True, timeout=30)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    # promtool does find what it lints: a camelCase label name (dcgm-exporter's modelName)
    bad = text + '# HELP x_info a\n# TYPE x_info gauge\nx_info{modelName="H100"} 1\n'
    result = subprocess.run([promtool, "check", "metrics"], input=bad, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode != 0 and "camelCase" in result.stdout + result.stderr


def _idle(h, seconds_idle, t0, uuid=UUID0):
    """Samples one second apart: idle (0 %) for ``seconds_idle`` samples, then one busy."""
    samples = [GpuSample(ts=h.at(t0 + n), gpu_id=uuid, source="sim", simulated=True,
                         fields={"gpu_util": 0.0}) for n in range(seconds_idle)]
    return [*samples, GpuSample(ts=h.at(t0 + seconds_idle), gpu_id=uuid, source="sim",
                                simulated=True, fields={"gpu_util": 90.0})]


def test_idle_while_held_counts_each_idle_second_once_per_owner(harness):
    h = harness
    client = create_app(h.config).test_client()
    _scrape(client)                      # the collector starts counting from here
    h.feed(h.gpu(0), _pod_process(h, 1.0), h.opened(1.1, TRAINER), *_idle(h, 5, 2.0))
    _, families = _scrape(client)
    [owner] = families["gpuwhy_owner_idle_while_held_gpu_seconds"].samples
    assert owner.labels == {"user": "root", "pod_uid": POD, "container": CONTAINER}
    assert owner.value == pytest.approx(5.0)
    _, families = _scrape(client)        # scraped again: nothing counted twice
    assert families["gpuwhy_owner_idle_while_held_gpu_seconds"].samples[0].value == \
        pytest.approx(5.0)
    h.feed(*_idle(h, 3, 8.0))            # three more idle seconds
    _, families = _scrape(client)
    assert families["gpuwhy_owner_idle_while_held_gpu_seconds"].samples[0].value == \
        pytest.approx(8.0)


def test_idle_owners_are_bounded_and_the_rest_summed_as_other(harness):
    h = harness
    collector = StoreCollector(lambda: open_store(h.config["store.path"], readonly=True),
                               max_owners=1)
    keys = [ProcessKey(5000 + n, n) for n in range(3)]
    h.feed(h.gpu(0), *(_pod_process(h, 1.0, key=k, pod=f"{n:08x}-0000-0000-0000-000000000000",
                                    container=None) for n, k in enumerate(keys)),
           *(h.opened(1.1, k) for k in keys), *_idle(h, 4, 2.0))
    [family] = [m for m in collector.collect()
                if m.name == "gpuwhy_owner_idle_while_held_gpu_seconds"]
    owners = {s.labels["pod_uid"]: s.value for s in family.samples}
    assert len(owners) == 2 and owners["other"] == pytest.approx(8.0)
    assert sum(owners.values()) == pytest.approx(12.0)   # 4 idle seconds × 3 holders


def test_pcie_link_nvlink_errors_and_remap_pending_metrics(harness):
    h = harness
    client = create_app(h.config).test_client()
    h.feed(h.gpu(0), GpuSample(ts=h.at(1.0), gpu_id=UUID0, source="sim", simulated=True,
                               fields={"pcie_link_gen": 1.0, "pcie_link_gen_max": 5.0,
                                       "pcie_link_width": 16.0, "pcie_link_width_max": 16.0,
                                       "nvlink_replay_errors": 41.0, "row_remap_pending": 0.0}))
    text, families = _scrape(client)
    value = {name: (family.type, [s.value for s in _samples(family, gpu=UUID0)])
             for name, family in families.items()}
    assert value["gpuwhy_gpu_pcie_link_gen"] == ("gauge", [1.0])
    assert value["gpuwhy_gpu_pcie_link_gen_max"] == ("gauge", [5.0])
    assert value["gpuwhy_gpu_pcie_link_width_max"] == ("gauge", [16.0])
    assert value["gpuwhy_gpu_nvlink_replay_errors"] == ("counter", [41.0])
    assert "gpuwhy_gpu_nvlink_replay_errors_total{" in text
    assert value["gpuwhy_gpu_row_remap_pending"] == ("gauge", [0.0])
    # a GPU that reported no NVLink counter has no series for it (not a 0)
    assert value["gpuwhy_gpu_nvlink_crc_flit_errors"][1] == []


def test_fabric_state_and_health_metrics_are_the_codes_as_read(harness):
    h = harness
    client = create_app(h.config).test_client()
    h.feed(h.gpu(0), GpuSample(ts=h.at(1.0), gpu_id=UUID0, source="dcgm", simulated=False,
                               fields={"fabric_state": 1.0, "fabric_health": 0.0}))
    text, families = _scrape(client)
    value = {name: (family.type, [s.value for s in _samples(family, gpu=UUID0)])
             for name, family in families.items()}
    assert value["gpuwhy_gpu_fabric_state"] == ("gauge", [1.0])     # NotStarted
    assert value["gpuwhy_gpu_fabric_health"] == ("gauge", [0.0])
    assert "DCGM field id 170" in text


def test_the_answer_series_names_the_cause_that_leads(harness):
    h = harness
    client = create_app(h.config).test_client()
    h.feed(h.gpu(0), h.sample(1.0, 90))
    _, families = _scrape(client)
    assert not families["gpuwhy_gpu_answer"].samples        # a healthy GPU: no series
    h.feed(*(RuleFinding(ts=h.at(30), finding_id=f"{rule}:1", rule_id=rule, title=rule,
                         severity="warning", state="firing", gpu_id=UUID0, process=TRAINER)
             for rule in ("R14_bursty_utilisation", "R01_input_cpu_bound")))
    time.sleep(1.1)                  # the snapshot renders at most once a second
    _, families = _scrape(client)
    [answer] = families["gpuwhy_gpu_answer"].samples
    assert (answer.labels["rule"], answer.labels["kind"], answer.labels["severity"]) == (
        "R01_input_cpu_bound", "cause", "warning")
