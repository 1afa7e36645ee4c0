"""In Chromium: the worst GPU's card comes first and opens with its answer, in words and in
colour; a stale card's numbers are greyed and dated (the page as a person sees it)."""

from __future__ import annotations

import pytest

from .test_answers import UUIDS, host  # noqa: F401  (the store: GPU 1 lost, GPU 0 starved)
from .test_browser import LiveServer, Watched

pytestmark = pytest.mark.browser


def test_the_worst_gpu_comes_first_with_its_answer(browser, host, tmp_path):  # noqa: F811
    live = LiveServer(host.config)
    watched = Watched(browser)
    try:
        page = watched.page
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.goto(live.url + "/")
        cards = page.locator("#gpu-cards section.card")
        assert cards.count() == 3
        first = cards.nth(0)
        assert first.get_attribute("data-gpu") == UUIDS[1]
        assert first.locator(".answer").is_visible()
        answer = first.locator(".answer").inner_text()
        assert "critical" in answer and "lost: it no longer answers" in answer
        # the answer sits above the numbers, as a person reads down the card
        top = first.locator(".answer").bounding_box()["y"]
        assert top < first.locator("dl.metrics").bounding_box()["y"]
        # severity told apart without colour: the border's style and the badge's word
        styles = [cards.nth(i).evaluate("e => getComputedStyle(e).borderTopStyle + ' ' + "
                                        "getComputedStyle(e).borderTopWidth") for i in range(3)]
        assert styles == ["solid 3px", "dashed 3px", "solid 1px"], styles
        assert [cards.nth(i).locator(".answer .badge.sev").inner_text().split()[-1]
                for i in range(3)] == ["critical", "warning", "ok"]
        # the live numbers carry their age
        assert "ago" in cards.nth(2).locator(".sample-age").inner_text()
        page.screenshot(path=str(tmp_path / "answers.png"), full_page=True)
        # the GPU page opens with the answer, its fixes in view before the charts
        page.goto(f"{live.url}/gpus/{UUIDS[0]}", wait_until="load")
        assert "DataLoader workers cannot keep up" in page.locator("#answer-sentence").inner_text()
        assert page.locator("#answer-fixes").is_visible()
        fixes = page.locator("#answer-fixes").bounding_box()
        assert fixes["y"] + fixes["height"] < 900                     # the first screen
        assert fixes["y"] < page.locator("#chart-util").bounding_box()["y"]
        page.screenshot(path=str(tmp_path / "gpu.png"))
        assert watched.problems == []
    finally:
        watched.close()
        live.close()


def _luminance(rgb) -> float:
    c = [x / 255 for x in rgb]
    c = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in c]
    return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]


def _contrast(a, b) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_the_heatmap_tells_no_sample_from_zero(browser, tmp_path):
    """GPU 0 idle (0 %) for four minutes, then no sample for eight: the painted 0 %
    cells and the no-sample cells between differ at 3:1 or more; the legend names it."""
    from gpuwhy.events import GpuSample

    from .test_answers import S, _gpus, _store

    def events(t0):
        start = t0 - 15 * 60 * S          # idle four minutes, nothing for eight, busy three
        return [*_gpus(start), *[GpuSample(ts=start + s * S, gpu_id=UUIDS[0], source="sim",
                                           simulated=True,
                                           fields={"gpu_util": 0.0 if s < 240 else 90.0,
                                                   "sm_active": 0.0 if s < 240 else 0.9})
                                 for s in [*range(240), *range(720, 900)]]]

    store = _store(tmp_path, "idle", events)
    live = LiveServer(store.config)
    watched = Watched(browser)
    try:
        page = watched.page
        page.goto(live.url + "/?range=1h", wait_until="load")
        for _ in range(50):
            if page.get_attribute("#host-page", "data-loaded") == "true":
                break
            page.wait_for_timeout(100)
        assert page.get_attribute("#host-page", "data-loaded") == "true"
        idle_ms, empty_ms = (store.t0 - 13 * 60 * S) / 1e6, (store.t0 - 7 * 60 * S) / 1e6
        painted = page.evaluate(
            r"""([idle, empty]) => {
              const chart = echarts.getInstanceByDom(document.getElementById('chart-host'));
              const rows = chart.getOption().yAxis[0].data;
              const row = rows.findIndex((r) => r.startsWith('GPU 0'));
              const canvas = document.querySelector('#chart-host canvas');
              const ratio = canvas.width / canvas.clientWidth;
              const at = (ms) => {
                const [x, y] = chart.convertToPixel({ xAxisIndex: 0, yAxisIndex: 0 }, [ms, row]);
                return Array.from(canvas.getContext('2d')
                  .getImageData(Math.round(x * ratio), Math.round(y * ratio), 1, 1).data)
                  .slice(0, 3);
              };
              const swatch = getComputedStyle(document.querySelector(
                '#heat-key .no-sample-cell')).backgroundColor.match(/\d+/g).map(Number);
              return { zero: at(idle), none: at(empty), row, key: swatch };
            }""", [idle_ms, empty_ms])
        assert painted["row"] >= 0, painted
        assert painted["key"] == painted["none"]           # the key shows what is painted
        assert "no sample" in page.locator("#heat-key").inner_text()
        assert painted["zero"] != painted["none"], painted
        assert _contrast(painted["zero"], painted["none"]) >= 3, painted
        page.locator("#chart-host").screenshot(path=str(tmp_path / "heatmap.png"))
        assert watched.problems == []
    finally:
        watched.close()
        live.close()


FIRST_VISIT_BYTES = 400 * 1024


def test_the_first_overview_visit_moves_at_most_400_kb(browser, host):  # noqa: F811
    """A browser with an empty cache: the page, its scripts and styles, the chart library,
    the favicon and the first API reads, as Chromium counts them (transferSize: headers and
    the bytes as sent)."""
    live = LiveServer(host.config)
    watched = Watched(browser)
    try:
        page = watched.page
        page.goto(live.url + "/", wait_until="networkidle")
        sizes = page.evaluate(
            "() => performance.getEntriesByType('navigation').concat("
            "performance.getEntriesByType('resource'))"
            ".map(e => [e.name, e.transferSize, e.decodedBodySize])")
        names = [n for n, _, _ in sizes]
        assert any(n.endswith("/vendor/echarts.min.js") for n in names), names
        moved = sum(t for _, t, _ in sizes)
        unpacked = sum(d for _, _, d in sizes)
        assert unpacked > 1_000_000                   # the chart library, unpacked
        assert moved <= FIRST_VISIT_BYTES, (moved, sizes)
        print(f"first overview visit: {moved} bytes moved, {unpacked} unpacked")
        assert watched.problems == []
    finally:
        watched.close()
        live.close()


def test_a_phone_in_the_dark_stacks_the_cards_and_scrolls_tables_in_their_box(
        browser, host, tmp_path):  # noqa: F811
    live = LiveServer(host.config)
    context = browser.new_context(viewport={"width": 390, "height": 844},
                                  color_scheme="dark")
    page = context.new_page()
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    try:
        page.goto(live.url + "/", wait_until="load")
        lefts = page.evaluate("() => [...document.querySelectorAll('#gpu-cards .card')]"
                              ".map(c => Math.round(c.getBoundingClientRect().left))")
        assert len(lefts) == 3 and len(set(lefts)) == 1              # one column
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        assert page.evaluate("() => getComputedStyle(document.body).backgroundColor") \
            == "rgb(18, 22, 27)"
        page.screenshot(path=str(tmp_path / "phone-overview.png"))
        page.goto(live.url + "/incidents", wait_until="load")
        table = page.locator("#incidents")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
        assert table.evaluate("t => t.scrollWidth > t.clientWidth")   # scrolls in its box
        assert page.locator("h1").is_visible()
        page.screenshot(path=str(tmp_path / "phone-incidents.png"))
        assert problems == []
    finally:
        context.close()
        live.close()


def test_a_new_answer_moves_its_card_up_without_a_reload(browser, tmp_path):
    """GPU 2 turns from healthy to an error (its power brake engaged): its card takes the
    answer's words and colour and moves above GPU 0's warning, on the live page."""
    from gpuwhy.clock import now_ns
    from gpuwhy.events import RuleFinding
    from gpuwhy.rules.loader import load_rules

    from .conftest import arrive
    from .test_answers import S, _gpus, _samples, _starved, _store

    store = _store(tmp_path, "moving", lambda t0: [*_gpus(t0), *_samples(t0, 40),
                                                  _starved(t0 + 35 * S)])
    live = LiveServer(store.config)
    watched = Watched(browser)
    try:
        page = watched.page
        page.goto(live.url + "/", wait_until="load")
        order = ("() => [...document.querySelectorAll('#gpu-cards > section')]"
                 ".map(c => c.dataset.gpu)")
        assert page.evaluate(order) == [UUIDS[0], UUIDS[1], UUIDS[2]]
        page.evaluate("() => { window.stayed = true; }")
        brake = {r.id: r for r in load_rules()}["R21_hw_slowdown_power_brake"]
        t = now_ns()
        arrive(store.config, [RuleFinding(
            ts=t, finding_id=f"{brake.id}:{UUIDS[2]}", rule_id=brake.id, title=brake.title,
            severity="error", state="firing", gpu_id=UUIDS[2], rule_kind=brake.kind,
            group=brake.group, window_start=t - 60 * S, window_end=t, since=t)],
            f"ipc://{tmp_path}/late.sock")
        for _ in range(60):
            if page.evaluate(order)[0] == UUIDS[2]:
                break
            page.wait_for_timeout(100)
        assert page.evaluate(order) == [UUIDS[2], UUIDS[0], UUIDS[1]]
        card = page.locator(f"section[data-gpu='{UUIDS[2]}']")
        assert card.locator(".answer .badge.sev").inner_text() == "■ error"
        assert brake.title in card.locator(".answer .sentence").inner_text()
        assert card.evaluate("c => getComputedStyle(c).borderTopStyle") == "solid"
        assert page.evaluate("() => window.stayed === true")       # moved, not reloaded
        assert watched.problems == []
    finally:
        watched.close()
        live.close()
