"""A real browser (Debian's Chromium, driven by Playwright) loads every page over a live
server with the scenario's data: no console errors, no failed requests, charts drawn,
screenshots saved (under pytest's tmp dir; also to $GPUWHY_SCREENSHOTS when set), and
process- or log-controlled HTML shown as text, never run."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from werkzeug.serving import make_server

from gpuwhy.webui import create_app

from .conftest import EVIL_NAME, TOKEN, build

pytestmark = pytest.mark.browser
BROWSER_ZONE = "Asia/Tokyo"       # not the host's: the charts must name the browser's


class LiveServer:
    def __init__(self, config):
        self.server = make_server("127.0.0.1", 0, create_app(config), threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture(scope="module")
def server(scenario):
    live = LiveServer(scenario.config)
    yield live
    live.close()


class Watched:
    """A page whose console errors, page errors, dialogs and failed requests are kept."""

    def __init__(self, browser, headers=None):
        self.context = browser.new_context(viewport={"width": 1400, "height": 900},
                                           extra_http_headers=headers or {},
                                           timezone_id=BROWSER_ZONE)
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(
            f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))
        # request -> (the page's URL, the page's navigations begun) when it was made
        self._asked_from: dict = {}
        self._navigations = 0             # main-frame navigations begun (a reload is one)
        self.page.on("request", self._asked)
        self.page.on("requestfinished", lambda r: self._asked_from.pop(r, None))
        self.page.on("requestfailed", self._failed)
        self.page.on("response", lambda r: r.status >= 400 and self.problems.append(
            f"HTTP {r.status}: {r.url}"))
        self.page.on("dialog", self._dialog)

    def _asked(self, request) -> None:
        if request.is_navigation_request() and request.frame == self.page.main_frame:
            self._navigations += 1
        self._asked_from[request] = (request.frame.url, self._navigations)

    def _failed(self, request) -> None:
        # A live page's poll cut short because the page was left, or reloaded itself (the
        # overview reloads for a GPU it has no card for: its URL stays), is no failure (a
        # server's failure is an HTTP status, kept above); any other failed request is.
        url, navigations = self._asked_from.pop(request, (None, self._navigations))
        left = url not in (None, request.frame.url) or navigations != self._navigations
        if request.failure == "net::ERR_ABORTED" and left:
            return
        self.problems.append(f"failed: {request.url} ({request.failure})")

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def close(self) -> None:
        self.context.close()


def shoot(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000, f"{name}: a blank screenshot?"
    if os.environ.get("GPUWHY_SCREENSHOTS"):
        keep = Path(os.environ["GPUWHY_SCREENSHOTS"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, keep / path.name)
    return path


def charts_drawn(page, selector: str) -> int:
    return page.eval_on_selector_all(f"{selector} .chart canvas", "els => els.length")


def test_every_page_loads_clean_and_draws(browser, server, scenario, tmp_path):
    watched = Watched(browser, {"Authorization": f"Bearer {TOKEN}"})
    page = watched.page
    reset = next(i["id"] for i in page.request.get(f"{server.url}/api/incidents").json()
                 if i["kind"] == "gpu_reset")
    pages = {
        "overview": "/", "gpu": f"/gpus/{scenario.gpu_ids[0]}", "processes": "/processes",
        "process": "/processes/4242-1000", "incidents": "/incidents",
        "incident": f"/incidents/{reset}", "report": f"/incidents/{reset}/report",
        "resets": "/resets", "rules": "/rules",
    }
    try:
        for name, path in pages.items():
            page.goto(server.url + path, wait_until="networkidle")
            if name == "gpu":
                page.wait_for_selector("#gpu-page[data-loaded='true']", timeout=15_000)
                assert charts_drawn(page, "#gpu-page") == 8     # with the throttle lane
                assert "1 s each" not in page.inner_text("#range-info")
                assert page.inner_text("#chart-zone") == f"· times in {BROWSER_ZONE}"
            if name == "incident":        # the chart of what raised it, drawn
                page.wait_for_selector("#trigger[data-loaded='true']", timeout=15_000)
                assert charts_drawn(page, "#trigger") == 1
            if name == "process":
                page.wait_for_selector("#process-page[data-loaded='true']", timeout=15_000)
                assert charts_drawn(page, "#process-page") == 2
                assert page.inner_text("#chart-zone") == f"· times in {BROWSER_ZONE}"
            if name != "report":
                assert "SIMULATED" in page.inner_text("#simulated-banner")
            shoot(page, tmp_path, name)
            assert watched.problems == [], (name, watched.problems)
        assert watched.dialogs == []
    finally:
        watched.close()


def test_range_picker_and_zoom_refetch_finer_data(browser, server, scenario, tmp_path):
    watched = Watched(browser, {"Authorization": f"Bearer {TOKEN}"})
    page = watched.page
    try:
        page.goto(f"{server.url}/gpus/{scenario.gpu_ids[1]}", wait_until="networkidle")
        page.wait_for_selector("#gpu-page[data-loaded='true']")
        assert "5 s each" in page.inner_text("#range-info")          # 1 h in ≤ 720 points
        with page.expect_response(lambda r: "range=5m" in r.url):
            page.click("#range-picker button[data-range='5m']")
        # a locator wait, not wait_for_function: a string evaluated in the page would
        # (rightly) be refused by the strict CSP, which has no 'unsafe-eval'
        page.locator("#range-info", has_text="1 s each").wait_for()
        assert "range=5m" in page.get_attribute("#csv-series", "href")
        box = page.locator("#chart-util").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        with page.expect_response(lambda r: "/series" in r.url and "from=" in r.url):
            for _ in range(4):
                page.mouse.wheel(0, -300)                             # zoom in
        shoot(page, tmp_path, "gpu-zoomed")
        assert watched.problems == []
    finally:
        watched.close()


def x_range(page, chart: str = "chart-util") -> list[float]:
    """The time axis of a chart as drawn (ms)."""
    return page.evaluate("id => { const x = echarts.getInstanceByDom("
                         "document.getElementById(id)).getOption().xAxis[0];"
                         " return [x.min, x.max]; }", chart)


def redrawn(page, before: list[float], timeout: float = 10.0) -> list[float]:
    """The util chart's time axis once it differs from ``before`` (polled from here: the
    page's CSP refuses the string wait_for_function would evaluate)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = x_range(page)
        if any(abs(a - b) > 1 for a, b in zip(now, before, strict=True)):   # ms, not rounding
            return now
        time.sleep(0.05)
    raise AssertionError(f"the chart kept its time axis {before}")


def test_the_url_keeps_range_and_zoom_and_reproduces_the_view(browser, server, scenario):
    watched = Watched(browser, {"Authorization": f"Bearer {TOKEN}"})
    page = watched.page
    try:
        page.goto(f"{server.url}/gpus/{scenario.gpu_ids[0]}", wait_until="networkidle")
        page.wait_for_selector("#gpu-page[data-loaded='true']")
        with page.expect_response(lambda r: "range=5m" in r.url):
            page.click("#range-picker button[data-range='5m']")
        page.locator("#range-info", has_text="1 s each").wait_for()
        assert "range=5m" in page.url and "from=" not in page.url
        five_minutes = x_range(page)        # drawn: #range-info is written after the charts
        page.locator("#chart-util").scroll_into_view_if_needed()   # below the GPU's answer
        box = page.locator("#chart-util").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        with page.expect_response(lambda r: "/series" in r.url and "from=" in r.url):
            for _ in range(4):
                page.mouse.wheel(0, -300)                             # zoom in
        zoomed = redrawn(page, five_minutes)
        shared = page.url
        assert "from=" in shared and "to=" in shared and "range=5m" in shared
        assert zoomed[1] - zoomed[0] < 5 * 60 * 1000                  # narrower than 5 min
        # the copied link, opened elsewhere, draws the same window
        other = Watched(browser, {"Authorization": f"Bearer {TOKEN}"})
        try:
            other.page.goto(shared, wait_until="networkidle")
            other.page.wait_for_selector("#gpu-page[data-loaded='true']")
            again = x_range(other.page)
            assert abs(again[0] - zoomed[0]) <= 1 and abs(again[1] - zoomed[1]) <= 1
            assert x_range(other.page, "chart-bw") == again          # one axis on the page
            assert other.problems == []
        finally:
            other.close()
        time.sleep(1.0)                  # a late zoom event's fetch ends before the check
        assert watched.problems == []
    finally:
        watched.close()
    # an absolute range written by hand, in ISO 8601, on a page of its own (leaving a page
    # while a fetch runs counts as a failed request)
    third = Watched(browser, {"Authorization": f"Bearer {TOKEN}"})
    page = third.page
    try:
        start, end = (int(v) for v in zoomed)
        iso = lambda ms: page.evaluate("ms => new Date(ms).toISOString()", ms)  # noqa: E731
        with page.expect_response(lambda r: "/series" in r.url and "from=" in r.url):
            page.goto(f"{server.url}/gpus/{scenario.gpu_ids[0]}?range=1h&from={iso(start)}"
                      f"&to={iso(end)}")
        page.wait_for_selector("#gpu-page[data-loaded='true']")
        assert [round(v) for v in x_range(page)] == [start, end]
        # the same window in the range inputs, in the browser's zone; one a minute shorter
        local = ("ms => { const d = new Date(ms), p = (n) => String(n).padStart(2, '0');"
                 " return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T`"
                 " + `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`; }")
        # the input's value is the normalized form, which leaves out zero seconds: a zoom
        # that starts on a whole minute reads "08:41", not "08:41:00" (1 run in 60 failed)
        written = page.evaluate(local, start)
        assert page.input_value("#range-from") in (written, written.removesuffix(":00"))
        page.fill("#range-from", page.evaluate(local, start + 60_000))
        with page.expect_response(lambda r: "/series" in r.url and "from=" in r.url):
            page.click("#range-apply")
        assert abs(redrawn(page, [start, end])[0] - (start // 1000 * 1000 + 60_000)) <= 1
        time.sleep(1.0)
        assert third.problems == []
    finally:
        third.close()


def test_html_from_processes_and_the_kernel_log_is_only_text(browser, server, scenario):
    watched = Watched(browser, {"Authorization": f"Bearer {TOKEN}"})
    page = watched.page
    try:
        for path in ("/", "/processes", "/processes/4242-1000", "/resets",
                     f"/gpus/{scenario.gpu_ids[0]}"):
            page.goto(server.url + path, wait_until="networkidle")
            assert page.locator("img[src='x']").count() == 0, path
            assert page.locator("main script").count() == 0, path
        page.goto(f"{server.url}/processes/4242-1000", wait_until="networkidle")
        assert EVIL_NAME in page.inner_text("h1")
        page.goto(f"{server.url}/processes/5151-1100", wait_until="networkidle")
        assert "<script>alert('xid')</script>" in page.inner_text("#events")
        assert page.locator("#events b").count() == 0                # <b> stayed text
        page.goto(f"{server.url}/processes", wait_until="networkidle")
        page.wait_for_timeout(2500)                                   # one live refresh
        assert EVIL_NAME in page.inner_text("#processes")
        # sampled Python stacks: a function named in markup, in the table and flame graph
        finding = next(i["id"] for i in page.request.get(f"{server.url}/api/incidents").json()
                       if i["kind"] == "rule_finding")
        page.goto(f"{server.url}/incidents/{finding}", wait_until="networkidle")
        page.wait_for_selector("#flame[data-drawn='true'] canvas", timeout=10_000)
        assert EVIL_NAME in page.inner_text("#stacks table")
        page.hover("#flame canvas", position={"x": 200, "y": 12})    # its tooltip: text
        assert page.locator("img[src='x']").count() == 0
        assert watched.dialogs == [] and watched.problems == []
    finally:
        watched.close()


def test_login_and_a_rule_change_through_the_form(browser, tmp_path):
    scenario = build(tmp_path)
    live = LiveServer(scenario.config)
    watched = Watched(browser)
    page = watched.page
    try:
        page.goto(f"{live.url}/rules", wait_until="networkidle")
        assert "/login" in page.url
        page.fill("input[name=token]", TOKEN)
        page.click("button[type=submit]")
        page.wait_for_url("**/rules")
        row = page.locator("#rules tbody tr").first
        rule_id = row.get_attribute("data-rule")
        row.locator("select[name=enabled]").select_option("false")
        row.locator("input[name=token]").fill(TOKEN)
        row.locator("button[type=submit]").click()
        page.wait_for_url(f"**/rules?changed={rule_id}")
        assert f"Changed {rule_id}" in page.inner_text(".notice")
        assert "disabled" in page.locator(f"#rules tr[data-rule='{rule_id}']").inner_text()
        shoot(page, tmp_path, "rules-changed")
        assert watched.problems == []
    finally:
        watched.close()
        live.close()
