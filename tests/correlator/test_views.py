"""What reads incidents: `gpuwhy incidents/incident/resets` and `/metrics`."""

import json
import socket
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from gpuwhy.app.cli import cli
from gpuwhy.app.incidents_cli import parse_since
from gpuwhy.events import CronExecution, GpuProcesses, SourceHealth
from gpuwhy.identity import ProcessKey
from gpuwhy.webui import create_app

TRAINER = ProcessKey(4242, 1000)
UUID0 = "GPU-00000000-1111-2222-3333-444444444444"


def reset_story(h):
    """A cron job resets GPU 0 under a training process, then an Xid 13 names another one."""
    job, smi = ProcessKey(300, 2000), ProcessKey(301, 2001)
    h.feed(h.gpu(0), h.process(0.1, TRAINER, "train\x1b[31m"), h.opened(0.2, TRAINER),
           h.sample(0.5, 95.0),
           GpuProcesses(ts=h.at(0.5), gpu_id=UUID0, source="sim",
                        processes=[{"pid": 4242, "start_time": 1000, "used_memory_mib": 2048,
                                    "sm_util": 80}]))
    h.feed(CronExecution(ts=h.at(1.0), cursor="c1", phase="started", user="root",
                         command="nvidia-smi -r", job_pid=300, job_start_time=2000),
           h.process(1.0, job, "sh"), h.process(1.1, smi, "nvidia-smi", ppid=300),
           h.exec_(1.1, smi, "/usr/bin/nvidia-smi", 300), h.reset_call(1.3, smi, "/dev/nvidia0"))
    h.feed(h.xid(20.0, 13, pid=TRAINER.pid, name="train"),
           SourceHealth(ts=h.at(20), source="gpu", state="ok",
                        counters={"events": 10, "dropped_hwm": 3}))


def run_cli(h, *args):
    result = CliRunner().invoke(cli, list(args),
                                env={"GPUWHY_DB": h.config["store.path"]})
    assert result.exit_code == 0, result.output
    return result.output


def test_incidents_list_filters_and_json(harness):
    reset_story(harness)
    listing = run_cli(harness, "incidents")
    assert "gpu_reset" in listing and "Xid 13" in listing
    only = json.loads(run_cli(harness, "incidents", "--kind", "xid", "--json"))
    assert [i["kind"] for i in only] == ["xid"] and only[0]["pid"] == 4242
    by_pci = json.loads(run_cli(harness, "incidents", "--gpu", "0000:18:00", "--json"))
    assert {i["kind"] for i in by_pci} == {"xid", "gpu_reset"}
    assert json.loads(run_cli(harness, "incidents", "--gpu", "GPU-other", "--json")) == []
    after_reset = datetime.fromtimestamp(harness.t0 / 1e9 + 10, tz=UTC).isoformat()
    since = json.loads(run_cli(harness, "incidents", "--since", after_reset, "--json"))
    assert [i["kind"] for i in since] == ["xid"]


def test_incident_shows_the_chain_as_steps_and_json(harness):
    reset_story(harness)
    [reset_id] = [r[0] for r in harness.db.execute(
        "select id from incidents where kind = 'gpu_reset'")]
    text = run_cli(harness, "incident", str(reset_id))
    assert "1." in text and "cron_job" in text and "driver_call" in text
    body = json.loads(run_cli(harness, "incident", str(reset_id), "--json"))
    assert {"id", "kind", "gpu", "started", "ended", "processes", "chain"} <= set(body)
    assert [step["kind"] for step in body["chain"]][:4] == ["cron_job", "command",
                                                            "driver_call", "gpu_reset"]
    assert all({"kind", "ts", "summary", "evidence"} <= set(step) for step in body["chain"])
    result = CliRunner().invoke(cli, ["incident", "999"],
                                env={"GPUWHY_DB": harness.config["store.path"]})
    assert result.exit_code != 0 and "no incident 999" in result.output


def test_resets_say_when_by_whom_and_who_was_hit(harness):
    reset_story(harness)
    text = run_cli(harness, "resets")
    assert "cron_job: cron ran `nvidia-smi -r`" in text and "hit pid 4242" in text
    [reset] = json.loads(run_cli(harness, "resets", "--json"))
    assert reset["gpu"] == UUID0 and reset["hit"][0]["pid"] == 4242


def test_process_names_are_escaped_on_the_terminal(harness):
    reset_story(harness)
    [reset_id] = [r[0] for r in harness.db.execute(
        "select id from incidents where kind = 'gpu_reset'")]
    text = run_cli(harness, "incident", str(reset_id))
    assert "\x1b" not in text and "train\\x1b[31m" in text


def test_since_accepts_durations_and_dates():
    assert parse_since("10m") < parse_since("1m")
    assert parse_since("2026-01-01T00:00:00+00:00") == 1767225600 * 10**9


def test_a_written_moment_is_ago_ns_or_iso_and_says_what_it_takes(monkeypatch):
    import time

    from gpuwhy.text import parse_ts

    now = 1_800_000_000 * 10**9
    assert parse_ts("90s", now) == now - 90 * 10**9
    assert parse_ts("1.5h", now) == now - 5400 * 10**9
    assert parse_ts("1767225600000000000", now) == 1767225600 * 10**9
    assert parse_ts("2026-01-01T00:00:00Z", now) == 1767225600 * 10**9
    # no zone: the reader's local time on the command line, UTC on a web page
    monkeypatch.setenv("TZ", "JST-9")
    time.tzset()
    try:
        assert parse_ts("2026-01-01T09:00", now) == 1767225600 * 10**9
        assert parse_ts("2026-01-01T00:00", now, naive_utc=True) == 1767225600 * 10**9
    finally:
        monkeypatch.undo()
        time.tzset()
    for bad in ("yesterday", "10 minutes", "-5m", "9" * 25, ""):
        with pytest.raises(ValueError, match="use 30s, 10m, 2h, 1d"):
            parse_ts(bad, now)


def test_incidents_until_keeps_those_opened_before(harness):
    reset_story(harness)
    every = json.loads(run_cli(harness, "incidents", "--json"))
    first = min(i["opened_at"] for i in every)
    before = datetime.fromtimestamp(first / 1e9 + 0.0005, tz=UTC).isoformat()
    early = json.loads(run_cli(harness, "incidents", "--until", before, "--json"))
    assert [i["id"] for i in early] == [i["id"] for i in every if i["opened_at"] <= first]
    assert "no incidents" in run_cli(harness, "incidents", "--until", "3650d")


def test_metrics_read_the_store_at_scrape_time(harness):
    client = create_app(harness.config).test_client()
    before = {m.name for m in text_string_to_metric_families(
        client.get("/metrics").data.decode())}
    assert "gpuwhy_incidents" in before
    reset_story(harness)
    # read again after the reset: a resetting GPU's numbers are not exported (gpu_health)
    harness.feed(harness.sample(21.0, 95.0))
    response = client.get("/metrics")
    assert response.status_code == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(response.data.decode())
               for s in family.samples}
    # gpuwhy's gpu label, and dcgm-exporter's label names beside it (joined on UUID)
    gpu = (("Hostname", socket.gethostname()), ("UUID", UUID0), ("gpu", UUID0),
           ("pci_bus_id", "00000000:18:00.0"), ("simulated", "true"))
    assert samples[("gpuwhy_gpu_utilization_ratio", gpu)] == pytest.approx(0.95)
    assert samples[("gpuwhy_incidents_total", (("kind", "gpu_reset"),
                                               ("severity", "critical")))] == 1
    assert samples[("gpuwhy_events_lost_total", (("reason", "dropped_hwm"),
                                                 ("source", "gpu")))] == 3
    memory = [v for (name, labels), v in samples.items()
              if name == "gpuwhy_process_gpu_memory_used_bytes" and ("pid", "4242") in labels]
    assert memory == [2048 * 2**20]
    assert samples[("gpuwhy_gpu_bound_processes", gpu)] == 1


def test_process_series_are_bounded(harness):
    from gpuwhy.events import DriverCallStats
    from gpuwhy.store import open_store
    from gpuwhy.webui.metrics import StoreCollector

    h = harness
    h.feed(*(h.process(0, ProcessKey(1000 + n, n), f"p{n}") for n in range(60)),
           *(DriverCallStats(ts=h.at(0), process=ProcessKey(1000 + n, n), path="/dev/nvidiactl",
                             device="nvidiactl",
                             ops=[{"cmd": 1, "sub": 0, "op": "x", "sub_name": None, "count": n + 1,
                                   "errors": 0, "latency_sum_ns": 0, "latency_max_ns": 0,
                                   "bytes": 0, "latency_log2": []}]) for n in range(60)))
    collector = StoreCollector(lambda: open_store(h.config["store.path"], readonly=True),
                               max_processes=10)
    [calls] = [m for m in collector.collect() if m.name == "gpuwhy_process_driver_calls"]
    totals = [s for s in calls.samples if s.name.endswith("_total")]
    assert len(totals) == 11
    other = [s for s in totals if s.labels["pid"] == "other"]
    assert other[0].value == sum(range(1, 51))


def test_the_demo_refuses_a_host_with_nvidia_devices(monkeypatch, tmp_config):
    import gpuwhy.app.service

    monkeypatch.setattr(gpuwhy.app.service, "gpu_devices_present", lambda *a: True)
    result = CliRunner().invoke(cli, ["demo", "xid79"])
    assert result.exit_code != 0 and "--force" in result.output
    assert "NVIDIA devices" in result.output


def test_a_rule_finding_shows_its_rule_values_fixes_and_check(harness):
    from gpuwhy.events import RuleFinding

    h = harness
    h.feed(h.gpu(0), h.process(0.1, TRAINER, "train"), h.opened(0.2, TRAINER))
    h.feed(RuleFinding(ts=h.at(5), finding_id="f-1", rule_id="R01_input_cpu_bound",
                       title="DataLoader workers cannot keep up", severity="warn",
                       state="firing", gpu_id=UUID0, process=TRAINER, window_start=h.at(1),
                       window_end=h.at(5), evidence={"worker_cores": 0.99961, "workers": 1.0},
                       root_cause="slow workers", fixes=["raise num_workers\x1b[2J", "cache"],
                       verify="idle share below 0.1", group="host_starvation"))
    [incident_id] = [r[0] for r in h.db.execute("select id from incidents")]
    text = run_cli(h, "incident", str(incident_id))
    assert "      rule      R01_input_cpu_bound (host_starvation)\n" in text
    assert "      measured  worker_cores=0.9996, workers=1\n" in text
    assert "      fix 1     raise num_workers\\x1b[2J\n" in text       # escaped, not obeyed
    assert "      fix 2     cache\n" in text and "      verify    idle share below 0.1" in text


def test_gpu_is_accepted_by_index_uuid_pci_or_id(harness):
    """`--gpu 0` once printed nothing: only a UUID or PCI address matched."""
    reset_story(harness)
    from gpuwhy.store.queries import gpu_named, list_incidents

    everyone = {i["id"] for i in list_incidents(harness.db)}
    for name in ("0", UUID0, "0000:18:00.0", "00000000:18:00.0"):
        assert gpu_named(harness.db, name) == UUID0, name
        assert {i["id"] for i in list_incidents(harness.db, gpu=name)} == everyone, name
    assert list_incidents(harness.db, gpu="7") == []
    assert gpu_named(harness.db, "7") == "index:7"       # the id GPU 7 would have
    # the command line's --gpu, listing incidents and resets, by index
    assert {i["id"] for i in json.loads(run_cli(harness, "incidents", "--gpu", "0",
                                                "--json"))} == everyone
    assert len(json.loads(run_cli(harness, "resets", "--gpu", "0", "--json"))) == 1
    assert json.loads(run_cli(harness, "resets", "--gpu", "7", "--json")) == []
