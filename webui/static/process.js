// The process page: its per-second timeline (GPU use, driver calls, CUDA launches and sync
// time where the CUDA uprobes are on, on/off CPU of the process and its workers) from
// /api/processes/<key>/series, re-fetched on range or zoom.
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

  async function load(params) {
    // The whole life unless a range button or a zoom asked for less.
    const query = params.from || params.at || params.picked ? params : {};
    try {
      const data = await G.fetchJson(G.withParams(page.dataset.series, query));
      const range = { from: data.from, to: data.to };
      const a = G.base(range);
      a.yAxis = [{ type: "value", name: "%" }, { type: "value", name: "calls/s" }];
      a.series = [G.line("SM util (NVML, this process)", G.column(data, "sm_util"),
        { connectNulls: true }),
        { name: "driver calls", type: "bar", yAxisIndex: 1, data: G.column(data, "ioctls"),
          barMaxWidth: 6 },
        { name: "CUDA launches", type: "bar", yAxisIndex: 1,
          data: G.column(data, "cuda_launches"), barMaxWidth: 6 }];
      activity.setOption(a, true);
      const c = G.base(range);
      c.yAxis = { type: "value", name: "ms/s" };
      c.series = ["on_cpu_ms", "runqueue_ms", "sleep_ms", "blocked_ms", "workers_on_cpu_ms",
        "workers_runqueue_ms", "workers_blocked_ms", "cuda_sync_ms"].map((f) =>
        G.line(f.replace(/_ms$/, "").replace(/_/g, " "), G.column(data, f)));
      cpu.setOption(c, true);
      document.getElementById("range-info").textContent =
        `${data.rows.length} points, ${data.bucket_s} s each`;
      G.updateCsvLinks(query);
      page.dataset.loaded = "true";
    } catch (err) {
      G.showError(`Could not load the timeline: ${err.message}`);
    }
  }

  G.rangeControl(load);
  G.onZoom(activity);
  G.onZoom(cpu);
})();
