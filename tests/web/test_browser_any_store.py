"""Chromium keeps a live overview open while the store changes under it (issue #53, item 1):
a GPU known only from the kernel log arrives as another GPU is lost, the page reloads for
that health change and is the overview again, not an error page; and an error page (the
store not there yet) loads the page again by itself once the store can be read."""

from __future__ import annotations

import threading
import time

import pytest
from werkzeug.serving import make_server

from gpuwhy.clock import now_ns
from gpuwhy.webui import create_app

from .conftest import arrive
from .test_any_store import (
    THE_XID_LINE,
    XID_LINE,
    XID_TEXT,
    S,
    build_store,
    config_for,
    kernel_line,
    pci_of,
    uuid_of,
)
from .test_browser import Watched

pytestmark = pytest.mark.browser


class Served:
    """The web view of ``config`` on a free port, with ``test_config`` (RETRY_SECONDS)."""

    def __init__(self, config, test_config: dict | None = None) -> None:
        self.server = make_server("127.0.0.1", 0, create_app(config, test_config),
                                  threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(5)


def _until(page, check, what: str, timeout_s: float = 8.0) -> None:
    """Poll from here (the CSP forbids wait_for_function's string eval) until ``timeout_s``
    of wall-clock time; a reload between two polls is no failure of the check."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - the page is being replaced by its reload
            pass
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        page.wait_for_timeout(100)


def _attribute(page, selector: str, name: str) -> str | None:
    """The attribute of the element, None when there is none (no auto-wait for it)."""
    found = page.locator(selector)
    return found.get_attribute(name, timeout=1000) if found.count() == 1 else None


@pytest.mark.slow
def test_the_open_overview_survives_a_kernel_log_only_gpu_and_a_lost_one(browser, tmp_path):
    t0 = now_ns() - 30 * S
    host = {"gpus": [{"uuid": True, "pci": True, "index": True, "counters": "nvml",
                      "samples": 3, "fields": "all", "xid": None, "state": None}],
            "processes": [], "orphan_incidents": 0, "query": {}}
    config = build_store(tmp_path, host, t0).replace({"web.refresh_seconds": 1})
    live = Served(config)
    watched = Watched(browser)
    page = watched.page
    try:
        page.goto(f"{live.url}/", wait_until="load")
        card = f"section[data-gpu='{uuid_of(0)}']"
        assert page.get_attribute(card, "data-health") == "ok"
        # GPU 0 falls off the bus, and a GPU no counter source reads logs its own Xid 79
        lost = XID_LINE.format(pci=pci_of(0), xid=79, text=XID_TEXT[79])
        arrive(config, [kernel_line(lost, now_ns(), 7), kernel_line(THE_XID_LINE.replace(
            "0a:00", "0b:00"), now_ns(), 8)], config["bus.endpoint"])
        _until(page, lambda: _attribute(page, card, "data-health") == "lost",
               "the page reloaded for GPU 0's health")
        newcomer = "section[data-gpu='0000:0b:00']"
        _until(page, lambda: page.locator(newcomer).count() == 1, "the kernel-log GPU's card")
        assert page.title() == "GPUs · gpuwhy"
        assert "no sample: never read" in page.inner_text(newcomer)
        page.wait_for_timeout(2500)                       # two more refreshes: still here
        assert page.title() == "GPUs · gpuwhy" and page.locator(newcomer).count() == 1
        assert watched.problems == []
    finally:
        watched.close()
        live.close()


def test_an_open_overview_takes_a_gpu_first_heard_of_in_the_kernel_log(browser, tmp_path):
    """No GPU yet, then one Xid line for a GPU no counter source reads: the page reloads
    for the GPU it has no card for, and shows it as never sampled."""
    config = build_store(tmp_path, {"gpus": [], "processes": [], "orphan_incidents": 0},
                         now_ns()).replace({"web.refresh_seconds": 1})
    live = Served(config)
    watched = Watched(browser)
    page = watched.page
    try:
        page.goto(f"{live.url}/", wait_until="load")
        assert "No GPU seen yet" in page.inner_text("#gpu-cards")
        arrive(config, [kernel_line(THE_XID_LINE, now_ns(), 1)], config["bus.endpoint"])
        card = "section[data-gpu='0000:0a:00']"
        _until(page, lambda: page.locator(card).count() == 1, "the new GPU's card")
        assert page.title() == "GPUs · gpuwhy"
        assert _attribute(page, card, "data-health") == "lost"
        assert "no sample: never read" in page.inner_text(card)
        assert watched.problems == []
    finally:
        watched.close()
        live.close()


def test_an_error_page_loads_the_page_again_once_the_store_can_be_read(browser, tmp_path):
    config = config_for(tmp_path)                 # nothing written there yet: 503
    live = Served(config, {"RETRY_SECONDS": 1})
    context = browser.new_context()
    page = context.new_page()
    try:
        response = page.goto(f"{live.url}/", wait_until="load")
        assert response.status == 503 and response.headers["retry-after"] == "1"
        assert "tries again by itself every 1 s" in page.inner_text("#error-retry")
        arrive(config, [kernel_line(THE_XID_LINE, now_ns(), 1)], config["bus.endpoint"])
        _until(page, lambda: page.locator("section[data-gpu='0000:0a:00']").count() == 1,
               "the overview, by the error page's own retry")
        assert page.title() == "GPUs · gpuwhy"
    finally:
        context.close()
        live.close()
