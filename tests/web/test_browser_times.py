"""Local time beside UTC in a real browser (Chromium in Asia/Tokyo, not the host's UTC): each
time the server wrote on the incident and process pages gets the browser's local time after
it, through GpuwhyCharts.clock, and the page names the zone; without JavaScript the UTC
times stand alone and nothing else changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuwhy.text import format_ts

from .conftest import TOKEN
from .test_browser import BROWSER_ZONE, LiveServer, Watched, shoot

pytestmark = pytest.mark.browser
TOKYO = timedelta(hours=9)          # no daylight saving time there
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(scenario):
    live = LiveServer(scenario.config)
    yield live
    live.close()


def _reset(page, server) -> int:
    return next(i["id"] for i in page.request.get(f"{server.url}/api/incidents").json()
                if i["kind"] == "gpu_reset")


def _unmatched(page, scope: str) -> int:
    """Times in ``scope`` with no local time right after them."""
    return page.eval_on_selector_all(
        f"{scope} time[data-ns]",
        "ts => ts.filter(t => !(t.nextElementSibling && "
        "t.nextElementSibling.classList.contains('local-time'))).length")


def test_the_local_time_is_written_beside_each_utc_time(browser, server, tmp_path):
    watched = Watched(browser, AUTH)
    page = watched.page
    try:
        page.goto(f"{server.url}/incidents/{_reset(page, server)}", wait_until="networkidle")
        first = page.locator("#chain time[data-ns]").first
        ns = int(first.get_attribute("data-ns"))
        local = page.locator("#chain time[data-ns] + span.local-time").first
        in_tokyo = datetime.fromtimestamp(ns // 10**9, UTC) + TOKYO
        assert first.inner_text() == format_ts(ns, utc=True)
        assert local.text_content() == f" ({in_tokyo:%m-%d %H:%M:%S} local)"
        assert local.get_attribute("title") == f"local time, {BROWSER_ZONE}"
        assert page.locator("time[data-ns]").count() >= 5       # the incident, the chain, its log
        assert _unmatched(page, "main") == 0
        assert page.inner_text("#time-note") == f"Times are UTC; local times in {BROWSER_ZONE}."
        shoot(page, tmp_path, "incident-local-times")

        page.goto(f"{server.url}/processes/4242-1000", wait_until="networkidle")
        page.wait_for_selector("#process-page[data-loaded='true']", timeout=15_000)
        assert page.locator("#events time[data-ns]").count() >= 1
        assert _unmatched(page, "main") == 0
        assert page.inner_text("#chart-zone") == f"· times in {BROWSER_ZONE}"
        shoot(page, tmp_path, "process-local-times")
        assert watched.problems == [] and watched.dialogs == []
    finally:
        watched.close()


def test_without_javascript_the_utc_times_stand_alone(browser, server):
    context = browser.new_context(java_script_enabled=False, timezone_id=BROWSER_ZONE,
                                  extra_http_headers=AUTH)
    try:
        page = context.new_page()
        page.goto(f"{server.url}/incidents/{_reset(page, server)}")
        first = page.locator("#chain time[data-ns]").first
        assert first.inner_text() == format_ts(int(first.get_attribute("data-ns")), utc=True)
        assert page.locator(".local-time").count() == 0
        assert page.inner_text("#time-note") == "Times are UTC."
    finally:
        context.close()


@pytest.mark.parametrize("path, least", [("/", 2), ("/incidents", 3), ("/resets", 1),
                                         ("/rules", 1), ("/gpus/{gpu}", 2)])
def test_every_page_with_times_gives_the_local_one_beside_them(browser, server, scenario,
                                                                path, least):
    watched = Watched(browser, AUTH)
    page = watched.page
    try:
        page.goto(server.url + path.format(gpu=scenario.gpu_ids[0]), wait_until="networkidle")
        assert page.locator("main time[data-ns]").count() >= least
        assert _unmatched(page, "main") == 0
        assert BROWSER_ZONE in page.inner_text("#chart-zone")
        assert watched.problems == []
    finally:
        watched.close()
