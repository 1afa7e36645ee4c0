"""The GPU and process pages left open in a real browser: new samples are appended to the
charts and a newly bound process shows up without a reload; paused, or holding a zoomed
range, they stay still; the live request asks only for what is new; the incident and reset
labels never overlap."""

from __future__ import annotations

import pytest

from gpuwhy.clock import now_ns
from gpuwhy.events import DeviceOpened, GpuSample, ProcessExited, ProcessSeen, SchedStats
from gpuwhy.identity import ProcessKey
from gpuwhy.store import open_store
from gpuwhy.store.series import last_sample_ts

from .test_browser import shoot
from .test_browser_incidents import _arrive, _until

pytestmark = pytest.mark.browser
S = 10**9


def _tail(page) -> dict:
    """The utilisation chart as drawn: its points, its last point's time and its axis (ms)."""
    return page.evaluate(
        "() => { const o = echarts.getInstanceByDom(document.getElementById('chart-util'))"
        ".getOption(); const d = o.series[0].data;"
        " return {n: d.length, last: d[d.length - 1][0], value: d[d.length - 1][1],"
        " max: o.xAxis[0].max}; }")


def _samples(config, tmp_path, gpu_id: str, start: int, seconds: int, util: float) -> None:
    _arrive(config, tmp_path, *[
        GpuSample(ts=start + k * S, gpu_id=gpu_id, source="sim", simulated=True,
                  fields={"gpu_util": util, "power_w": 250.0}) for k in range(seconds)])


def test_an_open_gpu_page_appends_new_samples_and_takes_a_new_process(served, scenario,
                                                                       tmp_path):
    config, page, url = served.config, served.page, served.url
    gpu = scenario.gpu_ids[1]
    asked: list[str] = []
    page.on("request", lambda r: "/series" in r.url and asked.append(r.url))
    page.goto(f"{url}/gpus/{gpu}?range=15m", wait_until="load")
    _until(page, lambda: page.get_attribute("#gpu-page", "data-loaded") == "true",
           "the charts drawn")
    assert page.inner_text("#live-state") == "Live"
    before = _tail(page)
    # samples arrive: a minute and a half later than the page's last one, at 77 %
    start = now_ns()
    _samples(config, tmp_path, gpu, start, 5, 77.0)
    _until(page, lambda: _tail(page)["last"] >= (start + 4 * S) / 1e6 - 10_000,
           "the new samples on the chart")
    after = _tail(page)
    assert after["value"] == pytest.approx(77.0)
    assert after["max"] > before["max"]                       # the window slid
    assert after["n"] >= before["n"]                          # appended, not reset
    assert "updated" in page.inner_text("#live")
    # the live requests ask for what comes after the last bucket drawn, on its grid
    tails = [u for u in asked if "after=" in u]
    assert tails and all("grid=" in u and "bucket=" in u and "range=" not in u
                         for u in tails)
    # a process binds to the GPU: the list under the charts takes it
    newcomer = ProcessKey(7878, 4321)
    _arrive(config, tmp_path,
            ProcessSeen(ts=now_ns(), process=newcomer, comm="<b>vllm</b>",
                        cmdline="vllm serve"),
            DeviceOpened(ts=now_ns(), process=newcomer, fd=9, path="/dev/nvidia1",
                         device="nvidiaN", minor=1))
    _until(page, lambda: "7878" in page.inner_text("#bound"), "the new process listed")
    assert "<b>vllm</b>" in page.inner_text("#bound")           # as text
    shoot(page, tmp_path, "gpu-live")
    # paused: new samples stay off the chart until it resumes
    page.click("#live-toggle")
    assert page.inner_text("#live-state") == "Paused"
    held = _tail(page)
    # later than the 77 % ones by more than a bucket (1.25 s at 15m): none mixes them
    _samples(config, tmp_path, gpu, max(now_ns(), start + 10 * S), 3, 12.0)
    page.wait_for_timeout(2500)
    assert _tail(page) == held
    page.click("#live-toggle")
    _until(page, lambda: _tail(page)["value"] == pytest.approx(12.0), "resumed")
    assert served.problems == []


def test_a_zoomed_gpu_page_holds_its_range_until_asked_to_follow(served, scenario, tmp_path):
    config, page, url = served.config, served.page, served.url
    gpu = scenario.gpu_ids[1]
    db = open_store(served.path)
    latest = last_sample_ts(db, gpu)
    db.close()
    page.goto(f"{url}/gpus/{gpu}?range=15m&from={latest - 300 * S}&to={latest}",
              wait_until="load")
    _until(page, lambda: page.get_attribute("#gpu-page", "data-loaded") == "true",
           "the charts drawn")
    assert page.inner_text("#live-state") == "Holding this time range"
    held = _tail(page)
    _samples(config, tmp_path, gpu, now_ns(), 3, 55.0)
    page.wait_for_timeout(2500)
    assert _tail(page) == held
    page.click("#live-toggle")                  # "follow live": the range, following
    _until(page, lambda: _tail(page)["value"] == pytest.approx(55.0), "following again")
    assert page.inner_text("#live-state") == "Live"
    assert "from=" not in page.url
    assert served.problems == []


def _labels(page) -> tuple[list[dict], dict]:
    """The labels and the utilisation chart's box, read in one go (a live page may resize
    between two reads)."""
    return page.evaluate(
        "() => { const b = document.getElementById('chart-util').getBoundingClientRect();"
        " const els = [...document.querySelectorAll('#marks-util .mark')];"
        " return [els.map(e => { const r = e.getBoundingClientRect();"
        " return {text: e.textContent, href: e.getAttribute('href'), title: e.title,"
        " more: e.classList.contains('more'), left: r.left, right: r.right, top: r.top,"
        " bottom: r.bottom}; }), {left: b.left, right: b.right}]; }")


def _inside(labels: list[dict], box: dict) -> bool:
    """Every label within the box (half a pixel over: the box's edge may fall between
    pixels, a label's on one)."""
    return all(box["left"] <= label["left"] and label["right"] <= box["right"] + 0.5
               for label in labels)


def _overlap(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and \
        a["top"] < b["bottom"] and b["top"] < a["bottom"]


@pytest.mark.parametrize("span", ["7d", "15m"])
def test_incident_and_reset_labels_never_overlap_and_link_to_them(served, scenario, span,
                                                                  tmp_path):
    """On a week the marks fall within pixels of each other: their labels stack in rows,
    then collapse into "+N" (the rest in its title); none covers another."""
    page, url = served.page, served.url
    gpu = scenario.gpu_ids[0]
    page.goto(f"{url}/gpus/{gpu}?range={span}", wait_until="load")
    _until(page, lambda: page.get_attribute("#gpu-page", "data-loaded") == "true",
           "the charts drawn")
    events = page.evaluate(f"() => fetch('/api/gpus/{gpu}/events?range={span}')"
                           ".then(r => r.json())")
    marks = len(events["incidents"]) + len(events["resets"])
    assert marks >= 3, events                   # the scenario's incidents and its reset
    # a scrollbar that comes as the lists under the charts fill in narrows the chart; its
    # labels are laid out again in the next frame: wait that out, then check one layout
    _until(page, lambda: _inside(*_labels(page)), "the labels within the chart")
    labels, box = _labels(page)
    assert labels and _inside(labels, box)
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            assert not _overlap(a, b), (a, b)
    shown = [label for label in labels if not label["more"]]
    folded = sum(int(label["text"][1:]) for label in labels if label["more"])
    assert len(shown) + folded == marks
    ids = {str(i["id"]) for i in events["incidents"]}
    for label in shown:
        if label["href"].startswith("/incidents/"):
            assert label["href"].rsplit("/", 1)[1] in ids
            assert label["text"].startswith("#")
    if folded:
        assert any(label["more"] and "\n" in label["title"] or label["text"] == "+1"
                   for label in labels)
    shoot(page, tmp_path, f"gpu-marks-{span}")
    assert served.problems == []


def _cpu_tail(page) -> dict:
    """The process page's on-CPU line as drawn: its last point (ms, ms/s)."""
    return page.evaluate(
        "() => { const d = echarts.getInstanceByDom(document.getElementById('chart-cpu'))"
        ".getOption().series[0].data; return {last: d[d.length - 1][0],"
        " value: d[d.length - 1][1]}; }")


def test_a_running_process_page_follows_its_timeline(served, scenario, tmp_path):
    config, page, url = served.config, served.page, served.url
    train = ProcessKey(4242, 1000)           # the scenario's training process, running
    page.goto(f"{url}/processes/{train.pid}-{train.start_time}", wait_until="load")
    _until(page, lambda: page.get_attribute("#process-page", "data-loaded") == "true",
           "the timeline drawn")
    assert page.inner_text("#live-state") == "Live"
    start = now_ns()
    _arrive(config, tmp_path, *[
        SchedStats(ts=start + k * S, process=train, interval_ns=S, worker_processes=4,
                   own={"on_cpu_ns": 777_000_000, "runqueue_ns": 0, "sleep_ns": 0,
                        "blocked_ns": 0}, workers={"on_cpu_ns": 0})
        for k in range(4)])
    _until(page, lambda: _cpu_tail(page)["last"] >= (start + 3 * S) / 1e6 - 60_000,
           "the new seconds on the timeline", timeout_ms=4000)
    assert _cpu_tail(page)["value"] == pytest.approx(777, rel=0.01)
    # it opens a second GPU: the event list under the charts takes it without a reload
    assert "/dev/nvidia1" not in page.inner_text("#events")
    _arrive(config, tmp_path, DeviceOpened(ts=now_ns(), process=train, fd=11,
                                           path="/dev/nvidia1", device="nvidiaN", minor=1))
    _until(page, lambda: "/dev/nvidia1" in page.inner_text("#events"),
           "the new event in the list", timeout_ms=8000)
    assert page.locator("#events time + .local-time").count() > 0     # local times again
    page.click("#live-toggle")
    assert page.inner_text("#live-state") == "Paused"
    assert served.problems == []


def test_an_exited_process_page_says_its_timeline_is_complete(served, scenario, tmp_path):
    config, page, url = served.config, served.page, served.url
    gone = ProcessKey(301, 2001)             # the cron job's nvidia-smi, long exited
    _arrive(config, tmp_path, ProcessExited(ts=now_ns(), process=gone, exit_code=0))
    page.goto(f"{url}/processes/{gone.pid}-{gone.start_time}", wait_until="load")
    _until(page, lambda: page.get_attribute("#process-page", "data-loaded") == "true",
           "the timeline drawn")
    assert page.locator("#live").count() == 0
    assert "complete" in page.inner_text("#live-ended")
    assert served.problems == []


# A chart 600 px wide whose marks crowd its right edge: what charts.js is handed by a
# week's range where a job failed again and again in its last hour. The chart's stand-in
# puts a mark at its own time in pixels (ms = px), as convertToPixel does on a real axis.
_CROWDED_LABELS = """([width, xs]) => {
  const wrap = document.createElement('div');
  wrap.className = 'chart-wrap';
  wrap.style.width = `${width}px`;
  const holder = document.createElement('div');
  holder.className = 'marks';
  wrap.appendChild(holder);
  document.body.appendChild(wrap);
  const chart = {convertToPixel: (_, ms) => ms, getWidth: () => width};
  const incidents = xs.map((x, i) => ({id: 1000 + i, kind: 'process_stall',
                                        opened_at: x * 1e6, title: `stall ${i}`}));
  GpuwhyCharts.markLabels(chart, holder, {incidents, resets: []});
  const box = holder.getBoundingClientRect();
  const labels = [...holder.children].map(e => { const r = e.getBoundingClientRect();
    return {text: e.textContent, more: e.classList.contains('more'), title: e.title,
            left: r.left - box.left, right: r.right - box.left, top: r.top, bottom: r.bottom};
  });
  wrap.remove();
  return labels;
}"""


@pytest.mark.parametrize("xs", [
    [520 + k * 0.2 for k in range(40)],                              # one stretch: "+37"
    [170 + k * 9 for k in range(40)] + [525 + k * 0.1 for k in range(30)],  # two
], ids=["one-stretch", "two-stretches"])
def test_crowded_marks_at_the_right_edge_stay_inside_the_chart(served, scenario, xs):
    """Marks crowded at the plot's right edge: the "+N" that folds them grows to two digits
    and stays within the chart, clear of the other labels, counting every mark it folds."""
    page, url = served.page, served.url
    page.goto(f"{url}/gpus/{scenario.gpu_ids[0]}?range=15m", wait_until="load")
    width = 600
    labels = page.evaluate(_CROWDED_LABELS, [width, xs])
    assert all(0 <= label["left"] and label["right"] <= width for label in labels), labels
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            assert not _overlap(a, b), (a, b)
    folded = [label for label in labels if label["more"]]
    assert folded and max(int(label["text"][1:]) for label in folded) >= 10
    assert sum(1 for label in labels if not label["more"]) + \
        sum(int(label["text"][1:]) for label in folded) == len(xs)
    assert sum(label["title"].count("\n") + 1 for label in folded) == \
        sum(int(label["text"][1:]) for label in folded)


def test_a_chart_whose_box_narrows_redraws_itself_and_its_labels(served, scenario):
    """The page's width changes without the window's (a scrollbar appears as the page
    grows, a panel opens): the charts and the incident labels follow their box. They
    followed only the window's resize event, and a label near the right edge then stood
    past the narrowed chart (the [15m] label test above failed once in CI that way)."""
    page, url = served.page, served.url
    page.goto(f"{url}/gpus/{scenario.gpu_ids[0]}?range=15m", wait_until="load")
    _until(page, lambda: page.get_attribute("#gpu-page", "data-loaded") == "true",
           "the charts drawn")
    page.click("#live-toggle")      # paused: no live update lays the labels out again
    assert page.inner_text("#live-state") == "Paused"
    labels, box = _labels(page)
    inner = "() => document.getElementById('chart-util').clientWidth"
    drawn = "() => echarts.getInstanceByDom(document.getElementById('chart-util')).getWidth()"
    wide = page.evaluate(inner)
    assert labels and page.evaluate(drawn) == wide
    # narrower than where the rightmost label ends now: laid out for the old width, it
    # would stand past the new one
    right = max(label["right"] for label in labels) - box["left"]
    narrow = int(right) - 10
    assert 320 <= narrow < wide
    page.evaluate(f"() => {{ const wrap = document.getElementById('chart-util').parentElement;"
                  f" wrap.style.width = '{narrow}px'; }}")
    _until(page, lambda: page.evaluate(drawn) == page.evaluate(inner) < narrow,
           "the chart redrawn at its new width")
    _until(page, lambda: _inside(*_labels(page)),
           "the labels laid out again within the narrowed chart")
    labels, box = _labels(page)
    assert labels and box["right"] - box["left"] <= narrow
    assert served.problems == []
