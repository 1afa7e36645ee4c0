"""Charts that draw what is there, and incident pages a person reads (issue 53, items 4 and
6), at the API and HTML level: a GPU sampled every 10 s gives its sample period and its 1 h
chart draws lines broken only at a real outage (charts.js's own gap rule, run in node);
an incident's page puts what to do above the evidence, dates its chain in time order,
labels its evidence in words and carries the chart of the signal that raised it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuwhy.clock import now_ns
from gpuwhy.events import GpuSample, GpuSeen
from gpuwhy.rules.loader import load_rule_set
from gpuwhy.webui import create_app
from gpuwhy.webui import incidents as incident_pages
from gpuwhy.webui.trigger import FIELDS, rule_fields

from .conftest import TOKEN, S, arrive
from .test_any_store import config_for, uuid_of

CHARTS_JS = Path(__file__).resolve().parents[2] / "webui" / "static" / "charts.js"
OUTAGE = range(200, 212)          # two minutes without a sample: a real gap


@pytest.fixture(scope="module")
def every_ten_seconds(tmp_path_factory):
    """One GPU sampled every 10 s (``gpu.interval = 10``) for the last hour, with jitter
    and one two-minute outage."""
    directory = tmp_path_factory.mktemp("ten-seconds")
    config = config_for(directory)
    gpu, t0 = uuid_of(0), now_ns() - 3600 * S
    events: list = [GpuSeen(ts=t0, gpu_id=gpu, source="nvml", simulated=False, uuid=gpu,
                            index=0, model="NVIDIA H100 80GB HBM3")]
    events += [GpuSample(ts=t0 + i * 10 * S + (i % 3) * S // 20, gpu_id=gpu, source="nvml",
                         simulated=False, fields={"gpu_util": 97.0 + i % 3, "power_w": 500.0})
               for i in range(360) if i not in OUTAGE]
    arrive(config, events, config["bus.endpoint"], event_time=True)
    return create_app(config).test_client(), gpu


def _drawn(data: dict, field: str) -> list:
    """The points charts.js's G.column draws of ``field`` (null: a break in the line)."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = ("const vm = require('vm'), fs = require('fs'); const window = {};"
              f"vm.runInNewContext(fs.readFileSync({json.dumps(str(CHARTS_JS))}, 'utf8'),"
              " { window });"
              "const data = JSON.parse(fs.readFileSync(0, 'utf8'));"
              f"process.stdout.write(JSON.stringify(window.GpuwhyCharts.column(data, "
              f"{json.dumps(field)})));")
    done = subprocess.run([node, "-e", script], input=json.dumps(data), capture_output=True,
                          text=True, timeout=30, check=True)
    return json.loads(done.stdout)


def test_a_gpu_sampled_every_10_s_says_so_and_its_hour_draws_lines(every_ten_seconds):
    client, gpu = every_ten_seconds
    data = client.get(f"/api/gpus/{gpu}/series?range=1h").get_json()
    # 5 s buckets, every other one empty: the period, not the bucket, judges a gap
    assert data["bucket_s"] == 5 and data["sample_period_s"] == pytest.approx(10, abs=0.2)
    points = _drawn(data, "gpu_util")
    breaks = [t for t, v in points if v is None]
    assert len(points) - len(breaks) == len(data["rows"]) > 300
    # one break, in the outage
    [gap] = breaks
    assert data["rows"][0][0] / 1e6 + OUTAGE.start * 10_000 < gap \
        < data["rows"][0][0] / 1e6 + OUTAGE.stop * 10_000
    # a tail (a live chart's next request) says it too
    last = data["rows"][-1][0]
    tail = client.get(f"/api/gpus/{gpu}/series?after={last}&grid={data['from']}"
                      f"&bucket={data['bucket_ns']}").get_json()
    assert tail["sample_period_s"] == data["sample_period_s"]


def test_a_gpu_with_no_samples_has_no_period(every_ten_seconds):
    client, gpu = every_ten_seconds
    data = client.get(f"/api/gpus/{gpu}/series?range=5m&from=1000&to={10**12}").get_json()
    assert data["sample_period_s"] is None and data["rows"] == []


@pytest.fixture
def client(scenario):
    client = create_app(scenario.config, {"TESTING": True}).test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return client


def _incident(client, kind: str) -> dict:
    return next(i for i in client.get("/api/incidents?effects=1").get_json()
                if i["kind"] == kind)


def test_an_xids_evidence_reads_in_words_with_its_chart_around_it(client):
    xid = _incident(client, "xid")
    html = client.get(f"/incidents/{xid['id']}").get_data(as_text=True)
    names = re.findall(r"<th>([^<]*)</th>", html[html.index('id="chain"'):])
    # no internal keys: NVIDIA's catalogue fields and the line's processes in words
    for internal in ("mnemonic", "immediate", "investigatory", "applies_to", "named",
                     "finding", "rule kind", "xid154_since"):
        assert internal not in names, internal
    assert "NVIDIA&#39;s immediate action" in names and "restart the application" in html
    # a pid is written as the kernel wrote it, never "5,151"
    assert "5,151" not in html and re.search(r"process 5151-\d+ \(python\)", html)
    # what to do above the evidence; the chart of the GPU around the Xid between them
    assert html.index('id="actions"') < html.index('id="trigger"') < html.index('id="chain"')
    trigger = json.loads(re.search(r'data-fields="([^"]*)"', html)[1].replace("&#34;", '"'))
    assert [f["field"] for f in trigger] == ["gpu_util", "power_w"]
    series = re.search(r'<section id="trigger" data-series="([^"]*)"', html)[1]
    data = client.get(series.replace("&amp;", "&")).get_json()
    assert data["from"] < xid["opened_at"] < data["to"] and data["rows"]


def test_a_rule_findings_chart_draws_what_its_rule_reads(client, scenario):
    finding = _incident(client, "rule_finding")
    detail = client.get(f"/api/incidents/{finding['id']}").get_json()
    html = client.get(f"/incidents/{finding['id']}").get_data(as_text=True)
    trigger = json.loads(re.search(r'data-fields="([^"]*)"', html)[1].replace("&#34;", '"'))
    rules = load_rule_set([], builtin=True).rules
    rule = next(r for r in rules if r.id == detail["details"]["rule_id"])
    assert [f["field"] for f in trigger] == rule_fields(rule)[:len(trigger)]
    assert trigger and all(f["unit"] for f in trigger)
    assert f"what rule {rule.id} reads" in html
    # the finding's window is on the chart's marks
    marks = json.loads(re.search(r'data-marks="([^"]*)"', html)[1].replace("&#34;", '"'))
    assert marks["window_start"] == detail["details"]["window_start"]


def test_every_shipped_rule_charts_only_signals_the_gpu_page_has():
    rules = load_rule_set([], builtin=True).rules
    charted = {r.id: rule_fields(r) for r in rules}
    assert all(set(fields) <= set(FIELDS) for fields in charted.values())
    # most rules read a GPU signal the chart can draw
    assert sum(bool(f) for f in charted.values()) > len(rules) // 2


def test_the_chain_is_shown_in_time_order(client, monkeypatch):
    reset = _incident(client, "gpu_reset")
    stored = incident_pages.incident_detail

    def shuffled(db, incident_id):
        found = stored(db, incident_id)
        if found:          # as stored by a correlator that found the cause after its effect
            found["chain"] = list(reversed(found["chain"]))
        return found
    monkeypatch.setattr(incident_pages, "incident_detail", shuffled)
    html = client.get(f"/incidents/{reset['id']}").get_data(as_text=True)
    steps = [int(ns) for ns in re.findall(
        r'<li data-kind="[a-z_]+">\s*<div class="step-head"><span class="mono">'
        r'<time datetime="[^"]+" data-ns="(\d+)"', html)]
    assert len(steps) >= 4 and steps == sorted(steps)
    api = client.get(f"/api/incidents/{reset['id']}").get_json()
    assert [s["ts"] for s in api["chain"]] == sorted(s["ts"] for s in api["chain"])
