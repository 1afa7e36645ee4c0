"""A reset sent on the control node (/dev/nvidiactl: no GPU minor) is about the GPUs its
process had bound at the call, for every reader: the correlator's incidents (what
``/resets`` lists), the ``gpu_reset_history`` view and the GPU page's marks name the same
GPU(s): a row per GPU for a process bound to two, the unknown GPU (NULL) for one bound to
none; a reset on /dev/nvidia0 names GPU 0."""

from __future__ import annotations

import dataclasses

import pytest

from gpuwhy.identity import ProcessKey
from gpuwhy.store.queries import gpu_events, reset_history
from gpuwhy.webui import create_app

from .conftest import UUID0

UUID1 = "GPU-00000000-1111-2222-3333-555555555555"
PCI1 = "0000:19:00.0"
ON_GPU0 = ProcessKey(500, 5000)     # resets on /dev/nvidia0
ON_GPU1 = ProcessKey(501, 5001)     # bound to GPU 1, resets on nvidiactl
ON_BOTH = ProcessKey(502, 5002)     # bound to GPU 0 and 1, resets on nvidiactl
UNBOUND = ProcessKey(503, 5003)     # bound to none, resets on nvidiactl
# Far enough apart that no two resets of a GPU are one reset (dedup_seconds).
AT = {ON_GPU0: 100, ON_GPU1: 200, ON_BOTH: 300, UNBOUND: 400}
EXPECTED = {(AT[ON_GPU0], UUID0), (AT[ON_GPU1], UUID1), (AT[ON_BOTH], UUID0),
            (AT[ON_BOTH], UUID1), (AT[UNBOUND], None)}


@pytest.fixture
def resets(harness):
    h = harness
    h.feed(h.gpu(0), h.gpu(0, uuid=UUID1, minor=1, pci=PCI1),
           *(h.process(1, key, f"tool{key.pid}") for key in AT),
           h.opened(2, ON_GPU1, minor=1), h.opened(2, ON_BOTH, minor=0),
           h.opened(2.5, ON_BOTH, minor=1))
    h.feed(dataclasses.replace(h.reset_call(AT[ON_GPU0], ON_GPU0, path="/dev/nvidia0"),
                               device="nvidiaN"),
           h.reset_call(AT[ON_GPU1], ON_GPU1), h.reset_call(AT[ON_BOTH], ON_BOTH),
           h.reset_call(AT[UNBOUND], UNBOUND))
    h.feed(h.sample(600, 50.0), h.sample(600, 50.0, uuid=UUID1))
    return h


def seconds(h, ts: int) -> int:
    return round((ts - h.t0) / 1e9)


def test_the_view_names_the_gpus_the_process_had_bound(resets):
    h = resets
    rows = h.db.execute("select ts, gpu_id, pid, detail from gpu_reset_history "
                        "where reset = 'reset' and source = 'driver call'").fetchall()
    assert sorted(((seconds(h, r[0]), r[1]) for r in rows), key=str) == \
        sorted(EXPECTED, key=str)
    assert len(rows) == len(EXPECTED)        # one row per GPU, never a repeated one
    unbound = [r for r in rows if r[2] == UNBOUND.pid]
    assert [(r[1], r[3]) for r in unbound] == [(None, "/dev/nvidiactl")]


def test_incidents_resets_marks_and_view_agree(resets):
    h = resets
    incidents = {(seconds(h, i["opened_at"]), i["gpu_id"]) for i in h.incidents("gpu_reset")}
    assert incidents == EXPECTED
    history = {(seconds(h, r["at"]), r["gpu"]) for r in reset_history(h.db)}
    assert history == EXPECTED
    view = {(seconds(h, r[0]), r[1]) for r in h.db.execute(
        "select ts, gpu_id from gpu_reset_history where reset = 'reset'")}
    assert view == EXPECTED
    for gpu in (UUID0, UUID1):
        marks = gpu_events(h.db, gpu, h.at(0), h.at(700))["resets"]
        assert sorted(seconds(h, m["ts"]) for m in marks) == \
            sorted(t for t, g in EXPECTED if g == gpu)


def test_the_web_pages_show_them_per_gpu_and_the_unbound_one_as_unknown(resets):
    h = resets
    client = create_app(h.config, {"TESTING": True}).test_client()
    api = client.get("/api/resets").get_json()
    assert {(seconds(h, r["at"]), r["gpu"]) for r in api} == EXPECTED
    html = client.get("/resets").get_data(as_text=True)
    assert "GPU (unknown)" in html and UUID0 in html and UUID1 in html
    for gpu in (UUID0, UUID1):
        events = client.get(f"/api/gpus/{gpu}/events?from={h.at(0)}&to={h.at(700)}")
        assert sorted(seconds(h, m["ts"]) for m in events.get_json()["resets"]) == \
            sorted(t for t, g in EXPECTED if g == gpu)
