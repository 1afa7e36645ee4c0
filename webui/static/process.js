// The process page: its per-second timeline (GPU use, driver calls, CUDA launches and sync
// time where the CUDA uprobes are on, on/off CPU of the process and its workers) from
// /api/processes/<key>/series, re-fetched on range or zoom; live while the process runs
// (new buckets appended, as on the GPU page), held still by pause or a zoom. For an
// inference engine (or a GPU process of one), its serving figures from
// /api/processes/<key>/engine, asked with the same query: the same window, on the same axis.
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
  const engineUrl = page.dataset.engine;
  const servingLoad = engineUrl ? G.init("chart-serving-load") : null;
  const servingSpeed = engineUrl ? G.init("chart-serving-speed") : null;
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

  // The engine's figures on the process timeline's range (one x for one moment on all).
  function drawServing(data, range, fresh) {
    const l = G.base(range);
    l.yAxis = [{ type: "value", name: "requests" }, { type: "value", name: "%", max: 100 }];
    l.series = [G.line("requests running", G.column(data, "requests_running"),
      G.unit("requests")),
    G.line("requests waiting", G.column(data, "requests_waiting"), G.unit("requests")),
    G.line("KV cache used", G.column(data, "kv_cache_usage", 100),
      Object.assign({ yAxisIndex: 1 }, G.unit("%"))),
    Object.assign({ name: "preemptions", type: "bar", data: G.column(data,
      "preemptions_per_s"), barMaxWidth: 6 }, G.unit("preemptions/s")),
    G.line("SM active (its GPUs, mean)", G.column(data.gpus, "sm_active"),
      Object.assign({ yAxisIndex: 1, lineStyle: { type: "dotted" } }, G.unit("%")))];
    l.graphic = G.emptyNote(!G.hasPoints(data, ["requests_running", "requests_waiting",
      "kv_cache_usage"]), "scrapes of the engine");
    servingLoad.setOption(l, fresh);
    const s = G.base(range);
    s.yAxis = [{ type: "value", name: "s" }, { type: "value", name: "tokens/s" }];
    s.series = [G.line("TTFT p95", G.column(data, "ttft_p95_s"), G.unit("s")),
      G.line("time per output token p95", G.column(data, "tpot_p95_s"), G.unit("s")),
      G.line("prompt tokens", G.column(data, "prompt_tokens_per_s"),
        Object.assign({ yAxisIndex: 1, lineStyle: { type: "dashed" } }, G.unit("tokens/s"))),
      G.line("generated tokens", G.column(data, "generation_tokens_per_s"),
        Object.assign({ yAxisIndex: 1, lineStyle: { type: "dashed" } }, G.unit("tokens/s")))];
    s.graphic = G.emptyNote(!G.hasPoints(data, ["ttft_p95_s", "tpot_p95_s",
      "prompt_tokens_per_s", "generation_tokens_per_s"]), "latencies or token rates");
    servingSpeed.setOption(s, fresh);
  }

  async function load(params) {
    // The whole life unless a range button or a zoom asked for less.
    const query = params.from || params.at || params.picked ? G.apiParams(params) : {};
    const mine = ++generation;
    try {
      const [data, engine] = await Promise.all([
        G.fetchJson(G.withParams(page.dataset.series, query)),
        engineUrl ? G.fetchJson(G.withParams(engineUrl, query)) : null]);
      if (mine !== generation) return;
      view = { params: query, data, engine,
        following: Boolean(live) && !(params.from && params.to) };
      draw(data, true);
      if (engine) drawServing(engine, { from: data.from, to: data.to }, true);
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
      const [fresh, freshEngine] = await Promise.all([
        G.fetchJson(G.withParams(page.dataset.series, G.tailParams(before.data))),
        before.engine ? G.fetchJson(G.withParams(engineUrl, G.tailParams(before.engine)))
          : null]);
      if (mine !== generation || view !== before || live.paused()) return;
      // a picked range slides; the whole life keeps its start
      const seconds = before.params.range ? live.ranges[before.params.range] : null;
      const data = G.mergeTail(before.data, fresh, seconds);
      const engine = freshEngine ? Object.assign(G.mergeTail(before.engine, freshEngine,
        seconds), { gpus: G.mergeTail(before.engine.gpus, freshEngine.gpus, seconds) }) : null;
      view = Object.assign({}, before, { data, engine });
      draw(data, false);
      if (engine) drawServing(engine, { from: data.from, to: data.to }, false);
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
  if (servingLoad) {
    G.onZoom(servingLoad);
    G.onZoom(servingSpeed);
  }
})();
