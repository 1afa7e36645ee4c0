"""Python stacks in the web view (webui/stacks.py) through Flask's test client, on a store the
real correlator wrote: the folded and JSON answers of /api/incidents/<id>/stacks and
/api/gpus/<id>/stacks, the incident page's table, advice and flame graph hook, both reports,
and `gpuwhy why` naming the line; a function name carrying markup stays text everywhere."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.clock import now_ns
from gpuwhy.events import PythonStacks, RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.loader import load_rules
from gpuwhy.store import open_store
from gpuwhy.store.queries import list_incidents
from gpuwhy.webui import create_app
from gpuwhy.webui.reports import report as gpuwhy_report
from tests.correlator.conftest import UUID0, Harness, S

RULE = "R01_input_cpu_bound"
TRAINER = ProcessKey(4242, 1000)
WORKER = ProcessKey(4250, 1010)
EVIL = "<script>alert('stack')</script><img src=x>"
T0 = (now_ns() - 600 * S) // S * S
STACKS = [      # seconds: [second of the window, samples]; the GPU is idle in 0-19
    {"pid": TRAINER.pid, "start_time": TRAINER.start_time, "role": "main",
     "stack": "train.py:80 <module>;train.py:88 <module>;waiting on multiprocessing queue",
     "count": 70, "seconds": [[s, 3] for s in range(20)] + [[20, 10]]},
    {"pid": TRAINER.pid, "start_time": TRAINER.start_time, "role": "main",
     "stack": f"train.py:80 <module>;train.py:95 {EVIL}", "count": 30,
     "seconds": [[s, 3] for s in range(20, 30)]},
    {"pid": WORKER.pid, "start_time": WORKER.start_time, "role": "workers",
     "stack": "worker.py:9 loop;dataset.py:41 load;PIL/ImageFile.py:291 ImageFile.load",
     "count": 64, "seconds": [[s, 3] for s in range(20)] + [[25, 4]]},
    {"pid": WORKER.pid, "start_time": WORKER.start_time, "role": "workers",
     "stack": "worker.py:9 loop;dataset.py:50 decode", "count": 36},
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A GPU idle for 20 s and busy for 10 s, a trainer and its worker bound to it, R01
    firing on it (an incident), and the stacks sampled for that finding from 5 s to 35 s."""
    from gpuwhy.config import load_config

    path = tmp_path_factory.mktemp("stacks")
    config = load_config(environ={"GPUWHY_DB": str(path / "gpuwhy.db"),
                                  "GPUWHY_BUS": f"ipc://{path}/bus.sock"})
    rule = {r.id: r for r in load_rules()}[RULE]
    harness = Harness(config, T0)
    t = harness.at(40)
    finding_id = f"{RULE}:{UUID0}:-:{t}"
    try:
        harness.feed(harness.gpu(0))
        harness.feed(*(harness.sample(s, 2.0 if s < 25 else 80.0) for s in range(5, 36)))
        harness.feed(harness.process(1, TRAINER, "python"), harness.opened(1, TRAINER))
        harness.feed(dataclasses.replace(harness.process(2, WORKER, "pt_data_worker"),
                                         ppid=TRAINER.pid))
        harness.feed(RuleFinding(
            ts=t, finding_id=finding_id, rule_id=RULE, title=rule.title, severity="warning",
            state="firing", gpu_id=UUID0, process=TRAINER, window_start=t - rule.window_ns,
            window_end=t, evidence={"workers_cpu": 0.97}, fixes=["Raise num_workers"],
            verify="gpu.util rises", group=rule.group, since=t, processes=[TRAINER],
            rule_kind=rule.kind, explains=list(rule.explains)))
        harness.feed(PythonStacks(ts=harness.at(35), process=TRAINER, gpu_id=UUID0,
                                  finding_id=finding_id, rule_id=RULE, started=harness.at(5),
                                  interval_ms=100, samples=100, stacks=STACKS))
    finally:
        harness.close()
    db = open_store(config["store.path"], readonly=True)
    try:
        [incident] = [i for i in list_incidents(db) if i["kind"] == "rule_finding"]
    finally:
        db.close()
    return config, incident["id"]


@pytest.fixture(scope="module")
def client(store):
    config, _ = store
    return create_app(config, {"TESTING": True}).test_client()


def test_folded_stacks_for_flame_graph_tools_and_their_json(store, client):
    _, incident_id = store
    folded = client.get(f"/api/incidents/{incident_id}/stacks")
    assert folded.status_code == 200 and folded.mimetype == "text/plain"
    lines = folded.get_data(as_text=True).splitlines()
    assert "workers;4250;worker.py:9 loop;dataset.py:41 load;PIL/ImageFile.py:291 " \
           "ImageFile.load 64" in lines
    assert all(line.rsplit(" ", 1)[1].isdigit() for line in lines) and len(lines) == 4
    body = client.get(f"/api/incidents/{incident_id}/stacks?format=json").get_json()
    [row] = body["rows"]
    assert row["gpu_seconds"] == {"idle": 20, "busy": 11}
    assert row["roles"]["main"]["samples"] == 100 and row["roles"]["workers"]["samples"] == 100
    # the samples lined up with the GPU's seconds: idle, the main thread waits on its loader
    main, workers = row["roles"]["main"], row["roles"]["workers"]
    assert main["idle"] == {"samples": 60, "top": [
        {"frame": "train.py:88 <module>, waiting on multiprocessing queue", "share": 1.0}]}
    assert main["busy"]["samples"] == 40 and main["busy"]["top"][0] == {
        "frame": f"train.py:95 {EVIL}", "share": 0.75}
    assert (workers["idle"]["samples"], workers["busy"]["samples"]) == (60, 4)
    assert body["flame"]["value"] == 200
    assert [c["name"] for c in body["flame"]["children"]] == ["main thread", "workers"]
    [advice] = body["advice"]
    assert advice["pattern"] == "image_decode" and advice["at"] == "dataset.py:41"
    assert client.get(f"/api/gpus/{UUID0}/stacks").get_data(as_text=True) == \
        folded.get_data(as_text=True)
    assert client.get("/api/gpus/0/stacks?format=json").get_json()["rows"][0]["pid"] == 4242
    assert client.get("/api/gpus/nope/stacks").status_code == 404
    assert client.get("/api/incidents/999999/stacks").status_code == 404
    assert client.get(f"/api/incidents/{incident_id}/stacks?format=svg").status_code == 400
    assert client.get(f"/api/incidents/{incident_id}/stacks?limit=0").status_code == 400


def test_the_incident_page_and_reports_show_the_stacks_and_markup_stays_text(store, client):
    config, incident_id = store
    page = client.get(f"/incidents/{incident_id}").get_data(as_text=True)
    assert 'id="stacks"' in page and "20 s idle / 11 s busy" in page
    assert "dataset.py:41 load → PIL/ImageFile.py:291 ImageFile.load" in page
    assert "stacks.js" in page and 'id="flame"' in page
    # the advice names the line, under the stacks and among the actions
    assert page.count("the decoding comes from `Image.open`/decode at dataset.py:41") == 2
    assert EVIL not in page and "&lt;script&gt;alert(&#39;stack&#39;)&lt;/script&gt;" in page
    printable = client.get(f"/incidents/{incident_id}/report").get_data(as_text=True)
    assert "<svg" in printable and "dataset.py:41 load" in printable
    assert EVIL not in printable and "<script" not in printable
    db = open_store(config["store.path"], readonly=True)
    try:
        html = gpuwhy_report.render(gpuwhy_report.gather(
            db, gpuwhy_report.incident_subject(db, incident_id)))
    finally:
        db.close()
    assert "Where the Python time went" in html and "<svg" in html
    assert EVIL not in html and "<script" not in html


def test_why_names_the_line_under_the_fix(store):
    config, _ = store
    result = CliRunner().invoke(cli, ["why", "0"], env={"GPUWHY_DB": config["store.path"]})
    assert "  in code    the decoding comes from `Image.open`/decode at dataset.py:41 " \
           "(`load`, 64 % of the workers' samples)" in result.output, result.output
    assert "    while the GPU sat idle: main thread 100 % in train.py:88 <module>, waiting on " \
           "multiprocessing queue; workers 100 % in dataset.py:41 load → PIL/ImageFile.py:291 " \
           "ImageFile.load" in result.output
    assert "    while it was busy: main thread 75 % in train.py:95 <script>" in result.output


def _copy_with(config, tmp_path, events):
    """A copy of the module's store with ``events`` written into it, and a client on it."""
    import sqlite3

    from gpuwhy.events import Envelope
    from gpuwhy.store.writer import StoreWriter

    copied = config.replace({"store.path": str(tmp_path / "copy.db")})
    source, target = sqlite3.connect(config["store.path"]), sqlite3.connect(copied["store.path"])
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()
    db = open_store(copied["store.path"])
    try:
        StoreWriter(db).write_batch([Envelope("test", n, e) for n, e in enumerate(events)])
    finally:
        db.close()
    return create_app(copied, {"TESTING": True}).test_client()


def test_the_gpu_page_links_a_sampled_process_to_its_stacks_and_flame_graph(store, client,
                                                                            tmp_path):
    """The GPU page's bound processes: the sampled trainer links to its own stacks page (the
    table, the advice and the flame graph, fed by /api/processes/<key>/stacks) with the
    advice's line; a process sampled with no advice shows its top frame, markup as text."""
    from gpuwhy.events import DeviceOpened, ProcessSeen

    config, incident_id = store
    page = client.get(f"/gpus/{UUID0}").get_data(as_text=True)
    bound = page[page.index('id="bound"'):page.index('id="open-incidents"')]
    assert 'href="/processes/4242-1000/stacks"' in bound
    assert "the decoding comes from `Image.open`/decode at dataset.py:41 (`load`, 64 %" in bound
    assert "100 samples to" in bound
    own = client.get("/processes/4242-1000/stacks")
    html = own.get_data(as_text=True)
    assert own.status_code == 200 and 'id="stacks"' in html and "20 s idle / 11 s busy" in html
    assert 'data-url="/api/processes/4242-1000/stacks?format=json"' in html
    assert "stacks.js" in html and f'href="/gpus/{UUID0}"' in html
    assert EVIL not in html and "&lt;script&gt;alert(&#39;stack&#39;)&lt;/script&gt;" in html
    folded = client.get("/api/processes/4242-1000/stacks").get_data(as_text=True)
    assert folded == client.get(f"/api/incidents/{incident_id}/stacks").get_data(as_text=True)
    assert client.get("/api/processes/4242-1000/stacks?format=json").get_json()["flame"][
        "value"] == 200
    for missing in ("/processes/77-88/stacks", "/processes/nope/stacks",
                    "/api/processes/1-99999999999999999999999/stacks"):
        assert client.get(missing).status_code == 404, missing
    known = client.get("/processes/4250-1010/stacks")      # the worker: never a target
    assert known.status_code == 200 and 'id="no-stacks"' in known.get_data(as_text=True)
    # the process page links its stacks; a process never sampled has no link
    assert 'href="/processes/4242-1000/stacks"' in client.get("/processes/4242-1000").get_data(
        as_text=True)
    worker = client.get("/processes/4250-1010")
    assert worker.status_code == 200 and 'id="stacks-link"' not in worker.get_data(as_text=True)

    hostile = ProcessKey(5151, 2020)
    t = T0 + 50 * S
    other = _copy_with(config, tmp_path, [
        ProcessSeen(ts=t, process=hostile, comm="serve", cmdline="serve"),
        DeviceOpened(ts=t, process=hostile, fd=5, path="/dev/nvidia0", device="nvidiaN",
                     minor=0),
        PythonStacks(ts=t + 10 * S, process=hostile, gpu_id=UUID0, finding_id="R14:x",
                     rule_id="R14b_low_gpu_utilisation", started=t, interval_ms=100,
                     samples=40, final=False, stacks=[
                         {"pid": hostile.pid, "start_time": hostile.start_time, "role": "main",
                          "stack": f"serve.py:3 run;serve.py:9 {EVIL * 20}", "count": 40}])])
    page = other.get(f"/gpus/{UUID0}").get_data(as_text=True)
    row = page[page.index('data-process="5151-2020"'):page.index('id="open-incidents"')]
    assert "still sampling" in row and "main thread 100 % in serve.py:9 &lt;script&gt;" in row
    assert EVIL not in page and "<img" not in page
    summary = row[row.index('class="stack-summary">') + 22:row.index("</span></td>")]
    assert summary.endswith("…") and len(summary.replace("&lt;", "<").replace(
        "&gt;", ">").replace("&#39;", "'")) == 240, summary
