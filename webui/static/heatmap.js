// The host overview's heatmap, from /api/heatmap: a row a GPU, a cell a minute or more,
// coloured by SM active (utilisation where the GPU gives nothing better), each GPU's
// incidents (▲) and resets (◆) on its row. Live on a relative range: each refresh asks only
// for the cells from the last minute drawn on; a zoom or an absolute range holds still.
// A cell opens that GPU's page at that moment, a mark its incident (or the resets).
(function () {
  "use strict";
  const G = window.GpuwhyCharts;
  const page = document.getElementById("host-page");
  if (!page) return;
  if (!G.available()) {
    G.showError("The chart library is not installed (run scripts/setup.sh).");
    return;
  }
  const holder = document.getElementById("chart-host");
  const chart = G.init("chart-host");
  G.connect();
  const ROW_PX = 30, EDGES_PX = 80;
  const whole = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const url = new URL(window.location.href);
  // 4.4:1 against ZERO, 4.5:1 against white; the page's key below the chart says so
  // (style.css .swatch.no-sample: the same grey)
  const NO_SAMPLE = "#767676";
  const ZERO = "#f7fbff";              // 0 %: the palest end of the scale
  let measure = url.searchParams.get("measure") === "gpu_util" ? "gpu_util" : "sm_active";
  let view = null;                     // {params, data, grid}: what is drawn, on which grid
  let generation = 0;                  // a newer load makes an older answer stale

  // The cells: a GPU that gave no SM active in the range is coloured by its utilisation
  // (its row says so) rather than left blank.
  function cells(data) {
    const sm = data.fields.indexOf("sm_active") + 2, util = data.fields.indexOf("gpu_util") + 2;
    const fallback = data.gpus.map(() => measure === "sm_active");
    for (const r of data.rows) if (r[sm] !== null) fallback[r[1]] = false;
    const bucket = G.ms(data.bucket_ns), out = [];
    for (const r of data.rows) {
      const bySm = measure === "sm_active" && !fallback[r[1]];
      const value = bySm ? r[sm] : r[util];
      if (value === null || G.ms(r[0]) + bucket <= G.ms(data.from)) continue;
      out.push([G.ms(r[0]), G.ms(r[0]) + bucket, r[1], value, bySm ? "SM active" : "utilisation"]);
    }
    return { out, fallback };
  }

  function marks(data) {
    const out = [];
    data.gpus.forEach((gpu, row) => {
      for (const i of gpu.incidents) {
        out.push({ value: [G.ms(i.opened_at), row], href: `/incidents/${encodeURIComponent(i.id)}`,
          title: `#${i.id} ${i.severity} ${i.title || i.kind}`, symbol: "triangle",
          itemStyle: { color: i.severity === "critical" || i.severity === "error" ? "#d62728" : "#e6a100" } });
      }
      for (const r of gpu.resets) {
        out.push({ value: [G.ms(r.ts), row], href: "/resets",
          title: `reset: ${r.what}${r.comm ? ` (${r.comm})` : ""}`, symbol: "diamond",
          itemStyle: { color: "#ff7f0e" } });
      }
    });
    return out;
  }

  function option(data) {
    const { out, fallback } = cells(data);
    const names = data.gpus.map((g, row) =>
      `GPU ${g.index === null ? "?" : g.index}${g.health !== "ok" ? ` (${g.health})` : ""}` +
      (fallback[row] ? " · util" : ""));
    const range = { from: data.from, to: data.to };
    const o = G.base(range);
    delete o.legend;
    // a cell with no sample shows the grid behind it: a grey 4.4:1 against 0 %'s colour
    // (and 4.5:1 against the page), never read as an idle GPU; the legend says so
    o.grid = G.grid({ top: 10, bottom: 60, show: true, backgroundColor: NO_SAMPLE,
      borderWidth: 0 });
    o.yAxis = G.rowAxis(names);
    o.tooltip = { trigger: "item", renderMode: "richText",
      formatter: (p) => p.seriesIndex === 0
        ? `${names[p.value[2]]}, ${G.clock(p.value[0])} – ${G.clock(p.value[1])}: ` +
          `${p.value[4]} ${whole.format(p.value[3])} %`
        : `${names[p.value[1]]}: ${p.data.title} (${G.clock(p.value[0])})` };
    o.visualMap = { type: "continuous", dimension: 3, seriesIndex: 0, min: 0, max: 100,
      orient: "horizontal", left: "center", bottom: 0, itemHeight: 200, calculable: false,
      text: ["100 %", `0 %   ${measure === "sm_active" ? "SM active" : "utilisation"}`],
      inRange: { color: [ZERO, "#6baed6", "#08306b"] } };
    // before the store's first figure the blank is no news: say so on the chart
    const held = data.held_since && data.held_since > data.from ? G.ms(data.held_since) : null;
    const spans = Object.assign(G.spans(out), held === null ? {} : { markArea: { silent: true,
      itemStyle: { color: "rgba(120, 120, 120, 0.08)" },
      label: { color: "#fff", position: "inside" },
      data: [[{ xAxis: G.ms(data.from), name: "nothing stored yet" }, { xAxis: held }]] } });
    o.series = [spans,
      { type: "scatter", data: marks(data), symbolSize: 13, z: 5, cursor: "pointer" }];
    o.graphic = G.emptyNote(!out.length, "samples", data.held_since);
    Object.assign(o.graphic[0].style, { backgroundColor: "#fff", padding: [3, 6] });
    return o;
  }

  function draw(data) {
    holder.style.height = `${EDGES_PX + ROW_PX * Math.max(data.gpus.length, 2)}px`;
    chart.resize();
    chart.setOption(option(data), true);
    const minutes = data.bucket_ns / 6e10;
    document.getElementById("range-info").textContent =
      `a cell ${minutes === 1 ? "a minute" : `${minutes} minutes`}`;
  }

  async function load(params) {
    const mine = ++generation;
    try {
      const data = await G.fetchJson(G.withParams(page.dataset.heatmap, params));
      if (mine !== generation) return;
      view = { params, data, grid: data.from, following: !(params.from && params.to) };
      draw(data);
      if (live) live.follows(view.following);
      page.dataset.loaded = "true";
    } catch (err) {
      G.showError(`Could not load the heatmap: ${err.message}`);
    }
  }

  // --- live: the cells from the last minute drawn on, on the grid first drawn -----------
  const gpuIds = (data) => JSON.stringify(data.gpus.map((g) => g.id));
  async function follow() {
    if (!view || !view.following || live.paused()) return;
    const mine = generation, before = view;
    const last = before.data.rows.reduce((m, r) => Math.max(m, r[0]), before.grid);
    try {
      const fresh = await G.fetchJson(G.withParams(page.dataset.heatmap, { after: String(last),
        grid: String(before.grid), bucket: String(before.data.bucket_ns) }));
      if (mine !== generation || view !== before || live.paused()) return;
      if (gpuIds(fresh) !== gpuIds(before.data)) {      // a GPU came or went: draw anew
        await load(before.params);
        return;
      }
      const seconds = live.ranges[before.params.range] || 21600;
      const to = Math.max(before.data.to, fresh.to), from = to - seconds * 1e9;
      const cut = before.grid + Math.floor((last - before.grid) / fresh.bucket_ns + 1e-6) * fresh.bucket_ns;
      const rows = before.data.rows.filter((r) => r[0] < cut - 1e3 && r[0] + fresh.bucket_ns > from)
        .concat(fresh.rows);
      const data = Object.assign({}, fresh, { rows, from, to });
      view = Object.assign({}, before, { data });
      draw(data);
      live.updated();
    } catch (err) {
      live.failed(err);
    }
  }

  const live = G.liveControl(follow, () => G.pickRange(view.params.range));

  chart.on("click", (p) => {
    if (!view) return;
    if (p.seriesIndex === 1) {
      window.location.href = p.data.href;
      return;
    }
    const gpu = view.data.gpus[p.value[2]];
    const middle = Math.round((p.value[0] + p.value[1]) / 2);      // ms; the URL takes ns
    window.location.href = `/gpus/${encodeURIComponent(gpu.id)}?range=15m&at=${middle}000000`;
  });

  const picker = document.getElementById("measure-picker");
  const showMeasure = () => {
    for (const b of picker.querySelectorAll("button")) {
      b.classList.toggle("active", b.dataset.measure === measure);
    }
  };
  showMeasure();
  for (const button of picker.querySelectorAll("button[data-measure]")) {
    button.addEventListener("click", () => {
      measure = button.dataset.measure;
      showMeasure();
      const u = new URL(window.location.href);
      u.searchParams.set("measure", measure);
      window.history.replaceState(null, "", u.pathname + u.search + u.hash);
      if (view) draw(view.data);
    });
  }

  G.rangeControl(load);
  G.onZoom(chart);
})();
