"""Every reader of GPU resets lists the same ones over the web scenario: ``/resets``,
``/api/resets``, the GPU page's marks (its events JSON and CSV), the ``gpu_reset_history``
view, the correlator's chain and the rules' streams (gpuwhy/reset.py is their one
definition; a request or a sign that one is needed is never counted as a reset)."""

from __future__ import annotations

import csv
import io
import sqlite3

import pytest

from gpuwhy.correlator.rules.signals import Scope
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.reset import RESET_CONTROLS, RESET_REQUEST_CONTROLS
from gpuwhy.store import open_store
from gpuwhy.webui import create_app

from .conftest import RESET_AT, TOKEN


@pytest.fixture
def client(scenario):
    app = create_app(scenario.config, {"TESTING": True})
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return client


def view_rows(scenario, reset: str) -> list[tuple]:
    with sqlite3.connect(scenario.path) as db:
        return db.execute("select ts, gpu_id, what, source from gpu_reset_history "
                          "where reset = ? order by ts", [reset]).fetchall()


def incident_windows(scenario) -> dict[int, tuple]:
    with sqlite3.connect(scenario.path) as db:
        return {r[0]: r[1:] for r in db.execute(
            "select id, gpu_id, opened_at, last_seen from incidents where kind = 'gpu_reset'")}


def test_resets_and_the_view_agree(client, scenario):
    api = client.get("/api/resets").get_json()
    windows = incident_windows(scenario)
    assert sorted(r["id"] for r in api) == sorted(windows)
    resets = view_rows(scenario, "reset")
    # The driver call and the GPU source's "resetting": one reset, one incident.
    assert {(r[2], r[3]) for r in resets} == {(f"driver call {RESET_CONTROLS[0]}", "driver call"),
                                              ("gpu resetting", "gpu source")}
    for ts, gpu, _what, _source in resets:       # every reset row is a listed reset ...
        assert any(g == gpu and opened <= ts <= last for g, opened, last in windows.values())
    for gpu, opened, last in windows.values():   # ... and every listed reset has its rows
        assert opened == min(ts for ts, g, *_ in resets if g == gpu and ts <= last)
    html = client.get("/resets").get_data(as_text=True)
    assert "No GPU reset seen" not in html and all(r["gpu"] in html for r in api)


def test_requests_are_listed_by_the_view_but_are_not_resets(client, scenario):
    requests = view_rows(scenario, "request")
    assert {(r[2], r[3]) for r in requests} == {
        (f"driver call {RESET_REQUEST_CONTROLS[0]}", "driver call"),
        ("cron: nvidia-smi -r: GPU reset", "cron")}
    assert {r[2] for r in view_rows(scenario, "back")} == {"gpu back"}
    assert len(client.get("/api/resets").get_json()) == 1


def test_the_gpu_page_marks_the_same_resets(client, scenario):
    resets = view_rows(scenario, "reset")
    for gpu in scenario.gpu_ids:
        expected = [r[0] for r in resets if r[1] == gpu]
        events = client.get(f"/api/gpus/{gpu}/events?range=1h").get_json()
        assert [r["ts"] for r in events["resets"]] == expected
        rows = list(csv.reader(io.StringIO(
            client.get(f"/gpus/{gpu}/events.csv?range=1h").get_data(as_text=True))))
        assert [int(r[1]) for r in rows[1:] if r[0] == "reset"] == expected
    assert any(r[1] == scenario.gpu_ids[0] for r in resets)


def test_the_chain_names_the_reset_call_and_the_cron_job(client, scenario):
    [reset] = client.get("/api/resets").get_json()
    chain = client.get(f"/api/incidents/{reset['id']}").get_json()["chain"]
    kinds = [link["kind"] for link in chain]
    assert kinds[:4] == ["cron_job", "command", "driver_call", "gpu_reset"]
    [call_ts] = [r[0] for r in view_rows(scenario, "reset") if r[3] == "driver call"]
    # the view lists the call as stored, at its return; the chain dates it when it was made
    # (its return less its latency), so that it comes before the reset it caused
    with sqlite3.connect(scenario.path) as db:
        [(latency,)] = db.execute("select latency_ns from driver_calls where ts = ?",
                                  [call_ts]).fetchall()
    assert chain[2]["ts"] == call_ts - latency and RESET_CONTROLS[0] in chain[2]["summary"]
    assert chain[2]["ts"] <= chain[3]["ts"]
    assert any(RESET_CONTROLS[0] in step for step in reset["by"])


def test_the_rules_streams_see_the_same_resets(scenario):
    db = open_store(scenario.path)
    try:
        signals = StoreSignals(db)
        start, end = scenario.at(0), scenario.at(RESET_AT + 100)
        signals.begin(end)
        scope = Scope(scenario.gpu_ids[0])
        states = [ts for ts, row in signals.events(scope, "gpu.state", start, end)
                  if row["reset"] == "reset"]
        calls = [ts for ts, row in signals.events(scope, "driver.call", start, end)
                 if row["reset"] == "reset"]
        crons = [ts for ts, row in signals.events(scope, "cron.run", start, end)
                 if row["reset"] == "request"]
    finally:
        db.close()
    resets = view_rows(scenario, "reset")
    assert sorted(states + calls) == [r[0] for r in resets]
    assert crons == [r[0] for r in view_rows(scenario, "request") if r[3] == "cron"]
