// The process page: its per-second timeline (GPU use, driver calls, CUDA launches and sync
// time where the CUDA uprobes are on, on/off CPU of the process and its workers) from
// /api/processes/<key>/series, re-fetched on range or zoom; live while the process runs
// (new buckets appended, as on the GPU page), held still by pause or a zoom.
(function () {
  "use strict";
  const G = window.GpuwhyCharts;
  const page = document.getElementById("process-page");
  if (!G.available()) {
    G.showError("The chart library is not installed (run scripts/setup.sh); the CSV links " +
      "still give the data.");
    return;
  }
  const activity = G.init("chart-activity");
  const cpu = G.init("chart-cpu");
  G.connect();

  // What is drawn: its request and data; following: a running process, not zoomed.
  let view = null;
  let generation = 0;

  function draw(data, fresh) {
    const range = { from: data.from, to: data.to };
    const a = G.base(range);
    a.yAxis = [{ type: "value", name: "%" }, { type: "value", name: "calls/s" }];
    a.series = [G.line("SM util (NVML, this process)", G.column(data, "sm_util"),
      Object.assign({ connectNulls: true }, G.unit("%"))),
      Object.assign({ name: "driver calls", type: "bar", yAxisIndex: 1,
        data: G.column(data, "ioctls"), barMaxWidth: 6 }, G.unit("calls/s")),
      Object.assign({ name: "CUDA launches", type: "bar", yAxisIndex: 1,
        data: G.column(data, "cuda_launches"), barMaxWidth: 6 }, G.unit("launches/s"))];
    const held = G.heldMark(view && view.params.at);
    if (held) a.series[0].markLine = held;
    a.graphic = G.emptyNote(!G.hasPoints(data, ["sm_util", "ioctls", "cuda_launches"]),
      "GPU activity or driver calls of this process");
    activity.setOption(a, fresh);
    const c = G.base(range);
    c.yAxis = { type: "value", name: "ms/s" };
    c.series = ["on_cpu_ms", "runqueue_ms", "sleep_ms", "blocked_ms", "workers_on_cpu_ms",
      "workers_runqueue_ms", "workers_blocked_ms", "cuda_sync_ms"].map((f) =>
      G.line(f.replace(/_ms$/, "").replace(/_/g, " "), G.column(data, f), G.unit("ms/s")));
    c.graphic = G.emptyNote(!G.hasPoints(data, ["on_cpu_ms", "sleep_ms", "blocked_ms"]),
      "scheduler figures of this process");
    cpu.setOption(c, fresh);
    document.getElementById("range-info").textContent =
      `${data.rows.length} points, ${data.bucket_s} s each`;
  }

  async function load(params) {
    // The whole life unless a range button or a zoom asked for less.
    const query = params.from || params.at || params.picked ? G.apiParams(params) : {};
    const mine = ++generation;
    try {
      const data = await G.fetchJson(G.withParams(page.dataset.series, query));
      if (mine !== generation) return;
      view = { params: query, data, following: Boolean(live) && !(params.from && params.to) };
      draw(data, true);
      G.updateCsvLinks(query);
      if (live) live.follows(view.following);
      page.dataset.loaded = "true";
    } catch (err) {
      G.showError(`Could not load the timeline: ${err.message}`);
    }
  }

  // --- live, while the process runs: the buckets after the last one drawn -------------
  async function follow() {
    if (!view || !view.following || live.paused()) return;
    const mine = generation, before = view;
    try {
      const fresh = await G.fetchJson(G.withParams(page.dataset.series,
        G.tailParams(before.data)));
      if (mine !== generation || view !== before || live.paused()) return;
      // a picked range slides; the whole life keeps its start
      const seconds = before.params.range ? live.ranges[before.params.range] : null;
      const data = G.mergeTail(before.data, fresh, seconds);
      view = Object.assign({}, before, { data });
      draw(data, false);
      if (Date.now() - tablesAt >= TABLES_EVERY_MS) await takeTables();
      live.updated();
    } catch (err) {
      live.failed(err);
    }
  }

  // The findings, driver calls and events under the charts, from this page as the server
  // renders it now, at most every TABLES_EVERY_MS: a whole page render costs more than the
  // timeline's tail.
  const TABLES_EVERY_MS = 5000;
  let tablesAt = Date.now();
  async function takeTables() {
    tablesAt = Date.now();
    G.takeParts(await G.pageNow(), ["#process-tables"]);
  }

  // Back from a zoom or a picked range: the whole life, following it.
  const live = G.liveControl(follow, () => window.location.assign(window.location.pathname));

  G.rangeControl(load);
  G.onZoom(activity);
  G.onZoom(cpu);
})();
