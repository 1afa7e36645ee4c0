"""Every route of the web view with Flask's test client, over the simulator scenario."""

import csv
import io
import json
import re
from pathlib import Path

import pytest

from gpuwhy.webui import create_app

from .conftest import EVIL_NAME, OTHER, TRAIN, XID_MESSAGE

STATIC = Path(__file__).resolve().parents[2] / "webui" / "static"


@pytest.fixture
def client(scenario):
    # The scenario's config has a token; reads here log in with it as a Bearer header.
    app = create_app(scenario.config, {"TESTING": True})
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = "Bearer s3cret-token"
    return client


def incident_id(client, kind):
    return next(i["id"] for i in client.get("/api/incidents").get_json() if i["kind"] == kind)


def page(client, url):
    response = client.get(url)
    assert response.status_code == 200, (url, response.data[:300])
    return response.get_data(as_text=True)


def test_overview_has_a_card_per_gpu_with_processes_and_the_simulated_banner(client, scenario):
    html = page(client, "/")
    assert 'id="simulated-banner"' in html and "SIMULATED" in html
    assert html.count('<section class="card') == 2
    for gpu_id in scenario.gpu_ids:
        assert f'data-gpu="{gpu_id}"' in html
    assert "/processes/4242-1000" in html and "abc123" in html       # container
    assert "&lt;b&gt;team-a&lt;/b&gt;" in html                          # tag, escaped
    # the open incident: the reset, whose chain holds the trainer's stall (not its own card)
    assert "GPU reset" in html and "Process 4242 stalled" not in html


def test_api_gpus_gives_the_latest_sample_and_bindings(client, scenario):
    gpus = client.get("/api/gpus").get_json()
    assert [g["id"] for g in gpus] == scenario.gpu_ids
    first = gpus[0]
    assert first["simulated"] == 1 and first["sample"]["power_w"] > 0
    assert [(p["pid"], p["comm"], p["container"]) for p in first["processes"]] == [
        (TRAIN.pid, EVIL_NAME, "abc123")]
    assert [p["pid"] for p in gpus[1]["processes"]] == [OTHER.pid]


def test_gpu_detail_page_and_api(client, scenario):
    gpu = scenario.gpu_ids[0]
    html = page(client, f"/gpus/{gpu}")
    for chart in ("util", "lanes", "bw", "power", "thermal", "heatmap", "scatter"):
        assert f'id="chart-{chart}"' in html
    assert "/vendor/echarts.min.js" in html
    assert client.get(f"/api/gpus/{gpu}").get_json()["uuid"] == gpu
    assert client.get("/gpus/GPU-none").status_code == 404
    assert client.get("/api/gpus/GPU-none/series").status_code == 404


def test_gpu_series_are_downsampled_and_match_the_samples(client, scenario):
    gpu = scenario.gpu_ids[1]
    one_hour = client.get(f"/api/gpus/{gpu}/series?range=1h").get_json()
    assert one_hour["bucket_s"] == 5.0 and len(one_hour["rows"]) <= 720
    assert one_hour["throttle_bits"]["SW_POWER_CAP"] == 4
    assert set(one_hour["fields"]) >= {"gpu_util", "sm_active", "tensor_active", "dram_active",
                                       "pcie_tx_bytes_per_s", "nvlink_rx_bytes_per_s",
                                       "power_w", "sm_clock_mhz", "clocks_event_reasons"}
    util = one_hour["fields"].index("gpu_util") + 1
    raw = client.get(f"/api/gpus/{gpu}/series?from={one_hour['from']}&to={one_hour['to']}"
                     f"&range=5m").get_json()
    # A 1 h window cut from..to gives the same buckets; a 5 min range gives finer ones.
    short = client.get(f"/api/gpus/{gpu}/series?range=5m").get_json()
    assert short["bucket_s"] == 1.0 and len(short["rows"]) == 300
    assert raw["rows"][0][0] == one_hour["rows"][0][0]
    # the first 1 h bucket is the mean of the 1 s rows inside it
    fine = client.get(f"/api/gpus/{gpu}/series?from={one_hour['rows'][0][0]}"
                      f"&to={one_hour['rows'][0][0] + 5 * 10**9}").get_json()
    values = [r[util] for r in fine["rows"]]
    assert one_hour["rows"][0][util] == pytest.approx(sum(values) / len(values), abs=0.01)
    week = client.get(f"/api/gpus/{gpu}/series?range=7d").get_json()
    assert week["bucket_s"] == 840.0 and 1 <= len(week["rows"]) <= 2


def test_bad_ranges_are_clear_errors(client, scenario):
    gpu = scenario.gpu_ids[0]
    response = client.get(f"/api/gpus/{gpu}/series?range=3y")
    assert response.status_code == 400 and b"range must be one of" in response.data
    assert client.get(f"/api/gpus/{gpu}/series?from=abc").status_code == 400
    assert client.get(f"/api/gpus/{gpu}/series?from=10&to=5").status_code == 400


def test_gpu_events_mark_incidents_resets_and_lanes(client, scenario):
    gpu = scenario.gpu_ids[0]
    events = client.get(f"/api/gpus/{gpu}/events?range=1h").get_json()
    # the trainer's stall is the reset's link: marked as the reset, not as its own
    assert {i["kind"] for i in events["incidents"]} == {"gpu_reset", "rule_finding"}
    assert any("BIF_RESET" in r["what"] for r in events["resets"])
    assert [lane["pid"] for lane in events["lanes"]] == [TRAIN.pid]


def read_csv(response):
    assert response.status_code == 200 and response.mimetype == "text/csv"
    assert "attachment" in response.headers["Content-Disposition"]
    return list(csv.reader(io.StringIO(response.get_data(as_text=True))))


def test_every_chart_has_csv(client, scenario):
    gpu = scenario.gpu_ids[0]
    series = client.get(f"/api/gpus/{gpu}/series?range=15m").get_json()
    rows = read_csv(client.get(f"/gpus/{gpu}/series.csv?range=15m"))
    assert rows[0] == ["ts_ns", *series["fields"]] and len(rows) == len(series["rows"]) + 1
    lanes = read_csv(client.get(f"/gpus/{gpu}/lanes.csv?range=1h"))
    assert lanes[1][:3] == [str(TRAIN.pid), str(TRAIN.start_time), EVIL_NAME]
    events = read_csv(client.get(f"/gpus/{gpu}/events.csv?range=1h"))
    assert {row[0] for row in events[1:]} == {"incident", "reset"}
    timeline = read_csv(client.get("/processes/4242-1000/series.csv"))
    assert timeline[0][:3] == ["ts_ns", "ioctls", "on_cpu_ms"] and len(timeline) > 500
    calls = read_csv(client.get("/processes/4242-1000/calls.csv"))
    assert calls[1][0] == "NV2080_CTRL_CMD_GPU_GET_INFO" and int(calls[1][3]) > 0


def test_csv_cells_never_start_a_formula(client, scenario):
    from gpuwhy.webui.export import csv_response

    text = csv_response(["a"], [["=cmd|' /C calc'!A0"], ["-2"], ["ok"]], "x.csv").get_data(
        as_text=True)
    assert text.splitlines()[1:] == ["'=cmd|' /C calc'!A0", "'-2", "ok"]


def test_processes_list_moved_and_links_to_the_detail(client):
    html = page(client, "/processes")
    assert 'href="/processes/4242-1000"' in html
    assert [p["key"] for p in client.get("/api/processes").get_json()] == ["4242-1000",
                                                                          "5151-1100"]


def test_process_page_shows_timeline_calls_events_and_findings(client):
    html = page(client, "/processes/4242-1000")
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html
    assert "NV2080_CTRL_CMD_GPU_GET_INFO" in html
    assert "Raise num_workers" in html and "workers_blocked_share" in html
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in html
    assert "device_opened" in html                      # lifecycle event
    detail = client.get("/api/processes/4242-1000").get_json()
    assert detail["findings"][0]["rule_id"] == "R02_input_io_bound"
    assert detail["calls"][0]["per_second"] > 0 and detail["calls"][0]["errors"] > 0
    timeline = client.get("/api/processes/4242-1000/series").get_json()
    blocked = timeline["fields"].index("workers_blocked_ms") + 1
    by_second = {(r[0] - timeline["rows"][0][0]) // 10**9: r[blocked] for r in timeline["rows"]}
    assert max(by_second.values()) == 700.0 and min(by_second.values()) == 10.0
    assert client.get("/processes/9-9").status_code == 404
    assert client.get("/processes/nope").status_code == 404


def test_kernel_log_html_is_text_on_the_process_page(client):
    html = page(client, "/processes/5151-1100")
    assert "&lt;b&gt;bold&lt;/b&gt;&lt;script&gt;alert(&#39;xid&#39;)&lt;/script&gt;" in html
    assert XID_MESSAGE not in html
    assert "<script>alert('xid')" not in html


def test_incident_list_filters(client):
    every = client.get("/api/incidents").get_json()
    assert {i["kind"] for i in every} == {"gpu_reset", "xid", "rule_finding"}
    assert {i["kind"] for i in client.get("/api/incidents?kind=xid").get_json()} == {"xid"}
    assert {i["kind"] for i in client.get("/api/incidents?severity=critical").get_json()} == {
        "gpu_reset"}
    # open: the reset (the trainer it stalled never got busy again) and the finding (never
    # cleared); the Xid 13 left its GPU usable and timed out
    assert {i["kind"] for i in client.get("/api/incidents?state=open").get_json()} == {
        "gpu_reset", "rule_finding"}
    assert [(i["kind"], i["resolution"]) for i in
            client.get("/api/incidents?state=resolved").get_json()] == [("xid", "timeout")]
    assert [i["kind"] for i in client.get("/api/incidents?q=graphics").get_json()] == ["xid"]
    html = page(client, "/incidents?kind=gpu_reset")
    assert "GPU reset" in html and "Xid 13" not in html
    assert "Input pipeline starves the GPU &lt;i&gt;(test)&lt;/i&gt;" in page(client, "/incidents")


def test_incident_list_filters_by_time(client):
    from gpuwhy.text import rfc3339

    every = client.get("/api/incidents").get_json()
    ids = lambda query: {i["id"] for i in client.get(f"/api/incidents?{query}").get_json()}  # noqa: E731
    assert ids("within=1h") == {i["id"] for i in every}               # the last ten minutes
    # a period around the Xid alone: opened before its end, seen after its start
    xid = next(i for i in every if i["kind"] == "xid")
    around = (xid["opened_at"] - 10**6, xid["opened_at"] + 10**6)
    others = {i["id"] for i in every if i["opened_at"] < around[0] and i["last_seen"] >= around[1]}
    assert ids(f"from={around[0]}&to={around[1]}") == {xid["id"]} | others
    # the same period in ISO 8601: with its zone, or naive (UTC on a page)
    zoned = [rfc3339(t) for t in around]
    assert ids(f"from={zoned[0]}&to={zoned[1]}") == ids(f"from={around[0]}&to={around[1]}")
    assert ids(f"from={zoned[0].removesuffix('Z')}&to={zoned[1].removesuffix('Z')}") == \
        ids(f"from={zoned[0]}&to={zoned[1]}")
    assert ids("to=1d") == set()                           # opened more than a day ago: none
    assert ids(f"from={max(i['last_seen'] for i in every) + 1}") == set()
    html = page(client, "/incidents?within=6h")
    assert '<option value="6h" selected>' in html


@pytest.mark.parametrize("query, says", [
    ("within=2h", "within is one of 1h, 6h, 24h, 7d"),
    ("from=yesterday", "'yesterday': use 30s, 10m"),
    ("from=2h&to=3h", "from must be before to"),
])
def test_a_bad_time_filter_is_a_400_that_says_why(client, query, says):
    for url in (f"/incidents?{query}", f"/api/incidents?{query}"):
        response = client.get(url)
        text = response.get_data(as_text=True).replace("&#39;", "'")
        assert response.status_code == 400 and says in text, url


def test_incident_chain_steps_link_to_the_moment_and_say_what_to_do(client, scenario):
    reset = incident_id(client, "gpu_reset")
    html = page(client, f"/incidents/{reset}")
    steps = re.findall(r'<li data-kind="([a-z_]+)"', html)
    assert steps[:4] == ["cron_job", "command", "driver_call", "gpu_reset"]
    assert "confidence 95%" in html and "Recommended actions" in html
    assert "reschedule the cron job" in html
    assert f"/gpus/{scenario.gpu_ids[0]}?at=" in html and "/processes/301-2001?at=" in html
    # what to do above the evidence; then the chart of what raised it (a reset: the
    # GPU's utilisation and power around it), in time order before the chain
    assert html.index('id="actions"') < html.index('id="trigger"') < html.index('id="chain"')
    # its code: the local times beside the UTC ones (charts.js's clock, times.js) and the
    # chart of what raised it
    assert re.findall(r"<script[^>]*>", html) == [
        '<script src="/static/charts.js">', '<script src="/vendor/echarts.min.js">',
        '<script src="/static/incident.js">', '<script src="/static/times.js">']
    api = client.get(f"/api/incidents/{reset}").get_json()
    assert api["chain"][0]["kind"] == "cron_job" and api["actions"]
    assert client.get("/incidents/999").status_code == 404
    assert client.get("/api/incidents/999").status_code == 404


def test_xid_incident_recommends_the_catalogue_action(client):
    xid = incident_id(client, "xid")
    detail = client.get(f"/api/incidents/{xid}").get_json()
    assert detail["actions"] and detail["actions"][-1] == detail["details"]["action"]


def test_printable_report(client):
    reset = incident_id(client, "gpu_reset")
    html = page(client, f"/incidents/{reset}/report")
    assert "report.css" in html and "<nav>" not in html and "<script" not in html
    assert "Root-cause chain" in html and "SIMULATED" in html and "cron_job" in html


def test_resets_say_the_cause_and_who_was_hit(client, scenario):
    [reset] = client.get("/api/resets").get_json()
    assert reset["cause"] == "cron job" and reset["gpu"] == scenario.gpu_ids[0]
    assert reset["hit"][0]["pid"] == TRAIN.pid
    html = page(client, "/resets")
    assert "<b>cron job</b>" in html and "nvidia-smi -r -i 0" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_rules_list_state_and_last_findings(client):
    rules = client.get("/api/rules").get_json()
    assert len(rules) >= 30 and all(r["enabled"] for r in rules)
    with_params = next(r for r in rules if r["params"])
    assert with_params["params"] == with_params["defaults"]
    io_bound = next(r for r in rules if r["id"] == "R02_input_io_bound")
    assert io_bound["findings"] == 1 and io_bound["firing"] == 1
    assert io_bound["last_finding"]["pid"] == TRAIN.pid
    html = page(client, "/rules")
    assert 'name="token"' in html and html.count('class="rule-form"') == len(rules)


def test_vendor_serves_only_the_chart_library(client):
    response = client.get("/vendor/echarts.min.js")
    assert response.status_code == 200 and b"echarts" in response.data[:2000]
    assert client.get("/vendor/package.json").status_code == 404
    assert client.get("/vendor/..%2Fpackage.json").status_code == 404


def test_missing_chart_library_is_a_clear_404(scenario, tmp_path):
    app = create_app(scenario.config.replace({"web.vendor_path": str(tmp_path)}))
    response = app.test_client().get("/vendor/echarts.min.js",
                                     headers={"Authorization": "Bearer s3cret-token"})
    assert response.status_code == 404 and b"scripts/setup.sh" in response.data


def test_every_page_sends_a_strict_csp_and_has_no_inline_script(client, scenario):
    reset = incident_id(client, "gpu_reset")
    urls = ["/", f"/gpus/{scenario.gpu_ids[0]}", "/processes", "/processes/4242-1000",
            "/incidents", f"/incidents/{reset}", f"/incidents/{reset}/report", "/resets",
            "/rules"]
    for url in urls:
        response = client.get(url)
        csp = response.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp, url
        assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        html = response.get_data(as_text=True)
        for tag in re.findall(r"<script[^>]*>", html):
            assert re.fullmatch(r'<script src="/[^"]+">', tag), (url, tag)
        assert "</script>" not in html.replace("></script>", ""), url
        assert " style=" not in html and "<style" not in html, url
        assert not re.search(r"<[a-zA-Z][^>]*\son[a-z]+=", html), url   # no handler attribute


def test_scripts_never_use_inner_html():
    for script in STATIC.glob("*.js"):
        text = script.read_text()
        assert "innerHTML" not in text.replace("never innerHTML", ""), script.name
        assert "eval(" not in text and "document.write" not in text, script.name


def test_healthz_and_metrics_still_answer(client):
    assert client.get("/healthz").get_json()["status"] == "ok"
    assert b"gpuwhy_incidents" in client.get("/metrics").data


def test_json_api_mirrors_each_page(client):
    for url in ("/api/gpus", "/api/processes", "/api/incidents", "/api/resets", "/api/rules"):
        response = client.get(url)
        assert response.status_code == 200 and response.is_json, url
        json.dumps(response.get_json())


def test_a_broken_rule_file_is_named_and_costs_only_its_rule(scenario, tmp_path):
    broken = tmp_path / "broken.rules"
    broken.write_text("rule X01 {\n  when: ((\n}\n")
    app = create_app(scenario.config.replace({"rules.paths": str(broken)}))
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = "Bearer s3cret-token"
    page = client.get("/rules")
    assert page.status_code == 200
    assert f"{broken}:3:1".encode() in page.data and b"1 rule(s) could not be loaded" in page.data
    listed = client.get("/api/rules").get_json()
    from gpuwhy.rules.loader import load_rules

    # every shipped rule still loads beside the broken file
    assert len(listed) == len(load_rules()) and "X01" not in {rule["id"] for rule in listed}
    [problem] = client.get("/api/rules/problems").get_json()
    assert problem["path"] == str(broken) and problem["line"] == 3
