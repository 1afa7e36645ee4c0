"""Live lists in a real browser: the incident list, left open, shows a new incident and a
change to one (acknowledged, resolved out of its filter) without a reload, through the
incident feed's cursor, and paused it holds still; the GPU cards take a newly bound process
and a new incident without a reload."""

from __future__ import annotations

import shutil

import pytest

from gpuwhy.clock import now_ns
from gpuwhy.config import load_config
from gpuwhy.events import DeviceOpened, KernelLogRecord, ProcessSeen
from gpuwhy.identity import ProcessKey
from gpuwhy.store import incident_changes as store_lifecycle
from gpuwhy.store import open_store
from gpuwhy.store.queries import list_incidents

from .conftest import arrive
from .test_browser import LiveServer, Watched, shoot

pytestmark = pytest.mark.browser
NEW_XID = "Xid (PCI:0000:28:00): 31, pid=5151, name=python, MMU Fault: <i>ENGINE GRAPHICS</i>"


def _arrive(config, tmp_path, *events) -> None:
    """Events through the real correlator, into the store the page reads."""
    arrive(config, events, f"ipc://{tmp_path}/late-bus.sock")


def _xid_arrives(config, tmp_path) -> None:
    """An Xid 31 line for GPU 1 (PCI 0000:28:00), as journald hands it on."""
    _arrive(config, tmp_path, KernelLogRecord(
        ts=now_ns(), cursor="late-1", origin="journald", boot_id="b", record_kind="xid",
        message=NEW_XID, xid=31, pci="0000:28:00", pid=5151, name="python",
        line="NVRM: " + NEW_XID))


def _rows(page) -> list[str]:
    return page.eval_on_selector_all("#incidents tbody tr:not(.empty) td:first-child",
                                     "cells => cells.map(c => c.textContent.trim())")


def _until(page, check, what: str, timeout_ms: int = 3000) -> None:
    """Poll the page from here (the CSP forbids wait_for_function's string eval)."""
    waited = 0
    while not check():
        assert waited < timeout_ms, f"not within {timeout_ms} ms: {what}; rows {_rows(page)}"
        page.wait_for_timeout(100)
        waited += 100


def _own_copy(scenario, tmp_path):
    """The scenario's store copied for one test (it changes it), served refreshed each second."""
    path = tmp_path / "live.db"
    shutil.copy(scenario.path, path)
    return path, load_config(environ={"GPUWHY_DB": str(path), "GPUWHY_REFRESH": "1",
                                      "GPUWHY_BUS": f"ipc://{tmp_path}/bus.sock"})


def test_an_open_incident_list_follows_new_incidents_and_changes(browser, scenario, tmp_path):
    path, config = _own_copy(scenario, tmp_path)
    db = open_store(path)
    active = [i["id"] for i in list_incidents(db, state="active")]
    assert len(active) >= 2, active
    live = LiveServer(config)
    watched = Watched(browser)
    page = watched.page
    try:
        page.goto(f"{live.url}/incidents?state=active", wait_until="load")
        assert sorted(_rows(page), key=int) == sorted(map(str, active), key=int)
        assert page.inner_text("#live-state") == "Live"
        # a new incident: it appears, newest first, without a reload
        _xid_arrives(config, tmp_path)
        [new] = [i["id"] for i in list_incidents(db, state="active") if i["id"] not in active]
        _until(page, lambda: _rows(page)[:1] == [str(new)], "the new incident on top")
        assert "Xid 31" in page.inner_text("#incidents tbody tr:first-child")
        # one acknowledged (still active), one resolved (out of the filter)
        store_lifecycle.acknowledge(db, active[0], "alice", "looking")
        store_lifecycle.resolve(db, active[1], "bob", text="replaced")
        _until(page, lambda: str(active[1]) not in _rows(page), "the resolved one gone")
        row = page.locator("#incidents tbody tr", has=page.locator(
            f"td:first-child a:text-is('{active[0]}')"))
        assert "acknowledged by alice" in row.inner_text()
        assert "last change shown at" in page.inner_text("#live")
        shoot(page, tmp_path, "incidents-live")
        # paused: a change stays off the page until it resumes
        page.click("#live-toggle")
        assert page.inner_text("#live-state") == "Paused"
        store_lifecycle.resolve(db, active[0], "alice", text="done")
        page.wait_for_timeout(2500)
        assert str(active[0]) in _rows(page)
        page.click("#live-toggle")
        _until(page, lambda: str(active[0]) not in _rows(page), "resumed: it goes")
        assert page.input_value("select[name=state]") == "active"
        assert watched.problems == []
    finally:
        watched.close()
        live.close()
        db.close()


def test_the_gpu_cards_take_a_new_process_and_a_new_incident(browser, scenario, tmp_path):
    _, config = _own_copy(scenario, tmp_path)
    live = LiveServer(config)
    watched = Watched(browser)
    page = watched.page
    card = f"section[data-gpu='{scenario.gpu_ids[1]}']"
    try:
        page.goto(f"{live.url}/", wait_until="load")
        assert "none" in page.inner_text(f"{card} ul.incidents")
        newcomer = ProcessKey(7777, 4321)
        now = now_ns()
        _arrive(config, tmp_path,
                ProcessSeen(ts=now, process=newcomer, comm="<b>vllm</b>", cmdline="vllm serve"),
                DeviceOpened(ts=now, process=newcomer, fd=9, path="/dev/nvidia1",
                             device="nvidiaN", minor=1))
        _until(page, lambda: "7777" in page.inner_text(f"{card} ul.procs"), "the new process")
        assert "<b>vllm</b>" in page.inner_text(f"{card} ul.procs")      # as text
        _xid_arrives(config, tmp_path)
        _until(page, lambda: "Xid 31" in page.inner_text(f"{card} ul.incidents"),
               "the new incident on its GPU's card")
        assert "has-incidents" in page.get_attribute(card, "class")
        shoot(page, tmp_path, "overview-live")
        assert watched.problems == []
    finally:
        watched.close()
        live.close()
