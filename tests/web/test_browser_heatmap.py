"""The host overview's heatmap in a real browser: one row a GPU, new minutes drawn without a
reload, a cell opening that GPU's page centred on its moment, the colour measure kept in
the URL; and the GPU page's charts on one time axis (same range, same pixels for a time)."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlparse

import pytest

from gpuwhy.clock import now_ns
from gpuwhy.events import GpuSample
from gpuwhy.store.rollups import MINUTE_NS

from .test_browser import shoot
from .test_browser_incidents import _arrive, _until

pytestmark = pytest.mark.browser
S = 10**9


def _open(page, url: str) -> None:
    page.goto(f"{url}/?range=1h", wait_until="load")
    _until(page, lambda: page.get_attribute("#host-page", "data-loaded") == "true",
           "the heatmap drawn")


def _drawn(page) -> dict:
    """The heatmap as drawn: its row names and its cells [from ms, to ms, row, value]."""
    return page.evaluate(
        "() => { const o = echarts.getInstanceByDom(document.getElementById('chart-host'))"
        ".getOption(); return {rows: o.yAxis[0].data, cells: o.series[0].data"
        ".map(c => c.slice(0, 4)), marks: o.series[1].data.length}; }")


def test_the_overview_heatmap_has_a_row_a_gpu_and_takes_new_minutes(served, scenario,
                                                                     tmp_path):
    page, url = served.page, served.url
    _open(page, url)
    drawn = _drawn(page)
    assert [name.split(" (")[0] for name in drawn["rows"]] == ["GPU 0", "GPU 1"]
    assert {c[2] for c in drawn["cells"]} == {0, 1}
    assert all(c[1] - c[0] == 60_000 and c[0] % 60_000 == 0 for c in drawn["cells"])
    assert all(0 <= c[3] <= 100 for c in drawn["cells"])
    assert drawn["marks"] >= 2                         # GPU 0's reset and its incidents
    assert page.inner_text("#range-info") == "a cell a minute"
    shoot(page, tmp_path, "overview-heatmap")
    # GPU 1 works at 60 % SM active in a new minute: its cell comes without a reload
    start = max(now_ns(), max(c[0] for c in drawn["cells"]) * 10**6 + 2 * MINUTE_NS)
    _arrive(served.config, tmp_path, *[
        GpuSample(ts=start + k * S, gpu_id=scenario.gpu_ids[1], source="sim", simulated=True,
                  fields={"gpu_util": 90.0, "sm_active": 0.6}) for k in range(3)])
    minute = start // MINUTE_NS * MINUTE_NS // 10**6
    _until(page, lambda: [c for c in _drawn(page)["cells"] if c[0] == minute and c[2] == 1],
           "the new minute's cell", timeout_ms=5000)
    [cell] = [c for c in _drawn(page)["cells"] if c[0] == minute and c[2] == 1]
    assert cell[3] == pytest.approx(60.0)
    assert "updated" in page.inner_text("#live")
    # coloured by utilisation instead: kept in the URL, the same cell now 90 %
    page.click("#measure-picker button[data-measure='gpu_util']")
    assert parse_qs(urlparse(page.url).query)["measure"] == ["gpu_util"]
    [cell] = [c for c in _drawn(page)["cells"] if c[0] == minute and c[2] == 1]
    assert cell[3] == pytest.approx(90.0)
    assert served.problems == []


def test_a_heatmap_cell_opens_that_gpus_page_at_that_moment(served, scenario):
    page, url = served.page, served.url
    _open(page, url)
    cell = next(c for c in _drawn(page)["cells"] if c[2] == 1)
    middle = (cell[0] + cell[1]) / 2
    x, y = page.evaluate(
        "([t, row]) => echarts.getInstanceByDom(document.getElementById('chart-host'))"
        ".convertToPixel({xAxisIndex: 0, yAxisIndex: 0}, [t, row])", [middle, 1])
    box = page.locator("#chart-host").bounding_box()
    with page.expect_navigation():
        page.mouse.click(box["x"] + x, box["y"] + y)
    assert urlparse(page.url).path == f"/gpus/{scenario.gpu_ids[1]}"
    asked = parse_qs(urlparse(page.url).query)
    assert asked["range"] == ["15m"] and abs(int(asked["at"][0]) - middle * 1e6) < 1e6
    _until(page, lambda: page.get_attribute("#gpu-page", "data-loaded") == "true",
           "the GPU page drawn")
    low, high = page.evaluate("() => { const x = echarts.getInstanceByDom(document"
                              ".getElementById('chart-util')).getOption().xAxis[0];"
                              " return [x.min, x.max]; }")
    assert low < middle < high and high - low == pytest.approx(15 * 60_000, abs=2_000)
    # held at that moment, not following live, with the moment marked on the charts
    assert page.inner_text("#live-state") == "Holding this time range"
    held = page.evaluate("() => echarts.getInstanceByDom(document.getElementById('chart-util'))"
                         ".getOption().series[0].markLine.data.map(d => d.xAxis)")
    assert any(abs(x - middle) < 1_000 for x in held)
    # the heatmap's rows on their measure's stated scale; the throttle reasons on a lane
    rows = page.evaluate("() => echarts.getInstanceByDom(document.getElementById("
                         "'chart-heatmap')).getOption().yAxis[0].data")
    assert "gpu util" in rows and any(re.fullmatch(r"power 0–[\d,]+ W", r) for r in rows)
    assert not any("throttle" in r for r in rows)
    assert served.problems == []


def test_the_gpu_page_charts_share_one_time_axis(served, scenario):
    page, url = served.page, served.url
    page.goto(f"{url}/gpus/{scenario.gpu_ids[0]}?range=15m", wait_until="load")
    _until(page, lambda: page.get_attribute("#gpu-page", "data-loaded") == "true",
           "the charts drawn")
    charts = ["chart-util", "chart-lanes", "chart-bw", "chart-power", "chart-throttle",
              "chart-thermal", "chart-heatmap"]
    axes = page.evaluate(
        "ids => ids.map(id => { const c = echarts.getInstanceByDom(document.getElementById(id));"
        " const x = c.getOption().xAxis[0]; const t = (x.min + x.max) / 2;"
        " const r = document.getElementById(id).getBoundingClientRect();"
        " return [x.min, x.max, r.left + c.convertToPixel({xAxisIndex: 0}, t)]; })", charts)
    for name, axis in zip(charts, axes, strict=True):
        assert axis[:2] == axes[0][:2], name                    # the same time range
        assert abs(axis[2] - axes[0][2]) < 1, name              # a time is one x on the page
    # the heatmap's rows: a counter this GPU gave, none empty
    rows, cells = page.evaluate(
        "() => { const o = echarts.getInstanceByDom(document.getElementById('chart-heatmap'))"
        ".getOption(); return [o.yAxis[0].data, o.series[0].data.map(c => c[2])]; }")
    assert "gpu util" in rows and set(cells) == set(range(len(rows)))
    assert served.problems == []


def _axis(page, chart: str = "chart-util") -> list[float]:
    return page.evaluate("id => { const x = echarts.getInstanceByDom(document.getElementById"
                         "(id)).getOption().xAxis[0]; return [x.min, x.max]; }", chart)


def _empty_note(page, chart: str) -> dict | None:
    """The chart's empty-state note as drawn: its text and whether it shows."""
    return page.evaluate(
        "id => { const g = echarts.getInstanceByDom(document.getElementById(id)).getOption()"
        ".graphic; const e = g && g[0] && g[0].elements.find(x => x.id === 'empty-note');"
        " return e ? {text: e.style.text, shown: !e.invisible} : null; }", chart)


def test_dragging_across_a_chart_zooms_every_chart_to_that_span(served, scenario):
    page, url = served.page, served.url
    page.goto(f"{url}/gpus/{scenario.gpu_ids[1]}?range=15m", wait_until="load")
    _until(page, lambda: page.get_attribute("#gpu-page", "data-loaded") == "true",
           "the charts drawn")
    low, high = _axis(page)
    left, right = (page.evaluate(
        "t => echarts.getInstanceByDom(document.getElementById('chart-util'))"
        ".convertToPixel({xAxisIndex: 0}, t)", low + (high - low) * share)
        for share in (0.4, 0.7))
    box = page.locator("#chart-util").bounding_box()
    y = box["y"] + box["height"] / 2
    with page.expect_response(lambda r: "/series" in r.url and "from=" in r.url):
        page.mouse.move(box["x"] + left, y)
        page.mouse.down()
        page.mouse.move(box["x"] + (left + right) / 2, y, steps=4)
        page.mouse.move(box["x"] + right, y, steps=4)
        page.mouse.up()
    _until(page, lambda: _axis(page)[1] - _axis(page)[0] < (high - low) / 2, "the zoom drawn")
    zoomed = _axis(page)
    assert zoomed[0] == pytest.approx(low + (high - low) * 0.4, abs=(high - low) * 0.02)
    assert zoomed[1] == pytest.approx(low + (high - low) * 0.7, abs=(high - low) * 0.02)
    assert _axis(page, "chart-heatmap") == zoomed and _axis(page, "chart-lanes") == zoomed
    assert "from=" in page.url and page.inner_text("#live-state") == "Holding this time range"
    assert served.problems == []


def test_a_range_without_samples_says_so_and_since_when_the_store_holds_them(served,
                                                                             scenario):
    page, url = served.page, served.url
    gpu = scenario.gpu_ids[1]
    held = page.request.get(f"{url}/api/gpus/{gpu}/series?range=15m").json()["held_since"]
    day_before = held - 86_400 * S
    page.goto(f"{url}/gpus/{gpu}?range=1h&from={day_before}&to={day_before + 3600 * S}",
              wait_until="load")
    _until(page, lambda: page.get_attribute("#gpu-page", "data-loaded") == "true",
           "the charts drawn")
    since = page.evaluate("ns => GpuwhyCharts.clock(ns / 1e6)", held)
    for chart in ("chart-util", "chart-bw", "chart-power", "chart-thermal", "chart-heatmap"):
        assert _empty_note(page, chart) == {
            "text": f"no samples in this range; the store holds them since {since}",
            "shown": True}, chart
    assert _empty_note(page, "chart-lanes")["shown"]
    # back to a range with samples: the notes go
    page.goto(f"{url}/gpus/{gpu}?range=15m", wait_until="load")
    _until(page, lambda: page.get_attribute("#gpu-page", "data-loaded") == "true",
           "the charts drawn")
    assert not _empty_note(page, "chart-util")["shown"]
    assert served.problems == []
