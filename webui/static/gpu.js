// The GPU detail page: engine utilisation, bandwidth, power/clocks, heatmap, scatter and
// process lanes, all from /api/gpus/<id>/series and /events, re-fetched on range or zoom.
// Live on a relative range (5m … 7d): every refresh asks only for the buckets after the
// last one drawn (on the grid it was drawn on), appends them and slides the window; the
// marks, the lanes and the server-rendered lists follow new processes and incidents. A zoom
// or an absolute range holds the view still; a range button goes back to following.
(function () {
  "use strict";
  const G = window.GpuwhyCharts;
  const page = document.getElementById("gpu-page");
  if (!G.available()) {
    G.showError("The chart library is not installed (run scripts/setup.sh); the CSV links " +
      "still give the data.");
    return;
  }
  const ids = ["util", "lanes", "bw", "power", "thermal", "heatmap", "scatter"];
  const chart = {};
  for (const id of ids) chart[id] = G.init(`chart-${id}`);
  G.connect();
  const GB = 1e-9;

  function utilisation(data, events, range) {
    const option = G.base(range);
    option.yAxis = { type: "value", name: "%", min: 0, max: 100 };
    option.series = [
      G.line("GPU util", G.column(data, "gpu_util"), { markLine: G.marks(events) }),
      G.line("SM active", G.column(data, "sm_active")),
      G.line("tensor active", G.column(data, "tensor_active")),
      G.line("DRAM active", G.column(data, "dram_active")),
      G.line("graphics engine", G.column(data, "gr_engine_active")),
      G.line("memory controller", G.column(data, "mem_util")),
      G.line("encoder", G.column(data, "enc_util")),
      G.line("decoder", G.column(data, "dec_util")),
    ];
    return option;
  }

  function bandwidth(data, range) {
    const option = G.base(range);
    option.yAxis = { type: "value", name: "GB/s" };
    option.series = ["pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"].map((f) =>
      G.line(f.replace("_", " "), G.column(data, `${f}_bytes_per_s`, GB)));
    return option;
  }

  function power(data, range) {
    const option = G.base(range);
    option.yAxis = [{ type: "value", name: "W" }, { type: "value", name: "MHz" }];
    const reasons = data.fields.indexOf("clocks_event_reasons") + 1;
    const bits = data.throttle_bits || {};
    const throttled = data.rows.map((r) => {
      const mask = r[reasons];
      if (mask === null) return [G.ms(r[0]), null];
      const names = Object.keys(bits).filter((n) => n !== "IDLE" && (mask & bits[n]));
      return [G.ms(r[0]), names.length ? names.length : 0];
    });
    option.series = [
      G.line("power", G.column(data, "power_w")),
      G.line("power limit", G.column(data, "power_limit_w"), { lineStyle: { type: "dashed" } }),
      G.line("SM clock", G.column(data, "sm_clock_mhz"), { yAxisIndex: 1 }),
      G.line("memory clock", G.column(data, "mem_clock_mhz"), { yAxisIndex: 1 }),
      { name: "throttle reasons (count)", type: "bar", yAxisIndex: 1, data: throttled,
        itemStyle: { color: "#d62728", opacity: 0.4 }, barMaxWidth: 6 },
    ];
    return option;
  }

  function thermal(data, range) {
    const option = G.base(range);
    option.yAxis = [{ type: "value", name: "°C" }, { type: "value", name: "MiB" }];
    option.series = [G.line("temperature", G.column(data, "temp_c")),
      G.line("memory used", G.column(data, "fb_used_mib"), { yAxisIndex: 1 })];
    return option;
  }

  // Every counter as a row of cells on the page's time axis, each row coloured from its own
  // lowest to its highest value in the range (the tooltip gives the value and its unit);
  // a counter this GPU never gave, or a throttle reason never set, has no row.
  const UNITS = { pcie_tx_bytes_per_s: "GB/s", pcie_rx_bytes_per_s: "GB/s",
    nvlink_tx_bytes_per_s: "GB/s", nvlink_rx_bytes_per_s: "GB/s", power_w: "W",
    power_limit_w: "W", sm_clock_mhz: "MHz", mem_clock_mhz: "MHz", temp_c: "°C",
    fb_used_mib: "MiB" };
  const SCALE = { pcie_tx_bytes_per_s: GB, pcie_rx_bytes_per_s: GB, nvlink_tx_bytes_per_s: GB,
    nvlink_rx_bytes_per_s: GB };
  const shown = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

  function heatmap(data, range) {
    const bucket = G.ms(data.bucket_ns);
    const start = (r) => G.ms(data.from) + Math.floor((G.ms(r[0]) - G.ms(data.from)) / bucket) * bucket;
    const names = [], cells = [];
    for (const field of data.fields.filter((f) => f !== "clocks_event_reasons")) {
      const i = data.fields.indexOf(field) + 1, scale = SCALE[field] || 1;
      const values = data.rows.map((r) => r[i]).filter((v) => v !== null);
      if (!values.length) continue;
      const lo = Math.min(...values), hi = Math.max(...values), y = names.length;
      names.push(field.replace(/_bytes_per_s$/, "").replaceAll("_", " "));
      for (const r of data.rows) {
        if (r[i] === null) continue;
        cells.push([start(r), start(r) + bucket, y, hi > lo ? (r[i] - lo) / (hi - lo) : 0,
          `${shown.format(r[i] * scale)} ${UNITS[field] || "%"}`]);
      }
    }
    const reasons = data.fields.indexOf("clocks_event_reasons") + 1;
    for (const [name, bit] of Object.entries(data.throttle_bits || {})) {
      if (!data.rows.some((r) => r[reasons] !== null && (r[reasons] & bit))) continue;
      const y = names.length;
      names.push(`throttle ${name}`);
      for (const r of data.rows) {
        if (r[reasons] === null) continue;
        const on = r[reasons] & bit ? 1 : 0;
        cells.push([start(r), start(r) + bucket, y, on, on ? "set" : "not set"]);
      }
    }
    const option = G.base(range);
    delete option.legend;
    option.grid = G.grid({ top: 10, bottom: 60 });
    option.yAxis = G.rowAxis(names);
    option.tooltip = { trigger: "item", renderMode: "richText",
      formatter: (p) => `${names[p.value[2]]} at ${G.clock(p.value[0])}: ${p.value[4]}` };
    option.visualMap = { type: "continuous", dimension: 3, min: 0, max: 1, seriesIndex: 0,
      orient: "horizontal", left: "center", bottom: 0, itemHeight: 160,
      text: ["the row's highest (or set)", "its lowest"], calculable: false,
      inRange: { color: ["#f7fbff", "#6baed6", "#08306b"] } };
    option.series = [G.spans(cells)];
    option.graphic = G.emptyNote(!names.length, "samples", data.held_since);
    return option;
  }

  function scatter(data) {
    const tx = data.fields.indexOf("pcie_tx_bytes_per_s") + 1;
    const rx = data.fields.indexOf("pcie_rx_bytes_per_s") + 1;
    const util = data.fields.indexOf("gpu_util") + 1;
    const points = data.rows.filter((r) => r[util] !== null && (r[tx] !== null || r[rx] !== null))
      .map((r) => [((r[tx] || 0) + (r[rx] || 0)) * GB, r[util]]);
    return {
      animation: false,
      grid: { left: 70, right: 30, top: 30, bottom: 40 },
      tooltip: { renderMode: "richText" },
      xAxis: { type: "value", name: "PCIe tx+rx GB/s" },
      yAxis: { type: "value", name: "GPU util %", min: 0, max: 100 },
      series: [{ type: "scatter", symbolSize: 5, data: points }],
    };
  }

  function lanes(events, range) {
    const labels = events.lanes.map((l) => `${l.pid} ${l.comm || "?"}`);
    const bars = events.lanes.map((l, i) => [G.ms(Math.max(l.since, range.from)),
      G.ms(Math.min(l.until || range.to, range.to)), i]);
    const option = G.base(range);
    delete option.legend;
    option.grid = G.grid({ top: 10 });
    option.yAxis = G.rowAxis(labels);
    option.tooltip = { trigger: "item", renderMode: "richText",
      formatter: (p) => `${labels[p.value[2]]}: bound ${G.clock(p.value[0])} – ` +
        `${events.lanes[p.value[2]].until ? G.clock(p.value[1]) : "now"}` };
    option.series = [G.spans(bars, { fill: 0.6, minWidth: 2, style: true })];
    option.graphic = G.emptyNote(!labels.length, "process bound to this GPU");
    return option;
  }

  // What is drawn: its request, its data (rows on a grid of buckets), its events.
  let view = null;
  const markHolder = document.getElementById("marks-util");
  // The incident and reset labels, where the marks are now (after a zoom, a resize).
  const labelMarks = () => view && G.markLabels(chart.util, markHolder, view.events);
  chart.util.on("datazoom", () => requestAnimationFrame(labelMarks));
  G.onResize(markHolder.parentElement, labelMarks);   // after the chart's own resize
  let generation = 0;                  // a newer load makes an older live answer stale

  // A counter chart without a point in the range says so (G.emptyNote).
  const SHOWN = {
    util: ["gpu_util", "sm_active", "tensor_active", "dram_active", "gr_engine_active",
      "mem_util", "enc_util", "dec_util"],
    bw: ["pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s",
      "nvlink_rx_bytes_per_s"],
    power: ["power_w", "power_limit_w", "sm_clock_mhz", "mem_clock_mhz"],
    thermal: ["temp_c", "fb_used_mib"],
  };
  const noted = (option, data, id) => Object.assign(option, {
    graphic: G.emptyNote(!G.hasPoints(data, SHOWN[id]), "samples", data.held_since) });

  function draw(data, events, fresh) {
    const range = { from: data.from, to: data.to };
    chart.util.setOption(noted(utilisation(data, events, range), data, "util"), fresh);
    chart.lanes.setOption(lanes(events, range), fresh);
    chart.bw.setOption(noted(bandwidth(data, range), data, "bw"), fresh);
    chart.power.setOption(noted(power(data, range), data, "power"), fresh);
    chart.thermal.setOption(noted(thermal(data, range), data, "thermal"), fresh);
    chart.heatmap.setOption(heatmap(data, range), true);
    chart.scatter.setOption(scatter(data), true);
    labelMarks();
    document.getElementById("range-info").textContent =
      `${data.rows.length} points, ${data.bucket_s} s each` +
      (data.from_rollups ? ", from one-minute rollups" : "");
  }

  // Processes and incidents as the events give them: when these change, the lists under
  // the charts are taken again from the page as the server renders it.
  const people = (events) => JSON.stringify([(events.lanes || []).map((l) => [l.pid, l.until]),
    (events.incidents || []).map((i) => [i.id, i.closed_at])]);

  async function load(params) {
    const mine = ++generation;
    try {
      const [data, events] = await Promise.all([
        G.fetchJson(G.withParams(page.dataset.series, params)),
        G.fetchJson(G.withParams(page.dataset.events, params))]);
      if (mine !== generation) return;
      view = { params, data, events, following: !(params.from && params.to) };
      draw(data, events, true);
      G.updateCsvLinks(params);
      live.follows(view.following);
      page.dataset.loaded = "true";
    } catch (err) {
      G.showError(`Could not load the data: ${err.message}`);
    }
  }

  // --- live ----------------------------------------------------------------------------
  async function follow() {
    if (!view || !view.following || live.paused()) return;
    const mine = generation, before = view;
    try {
      const [fresh, events] = await Promise.all([
        G.fetchJson(G.withParams(page.dataset.series, G.tailParams(before.data))),
        G.fetchJson(G.withParams(page.dataset.events, { range: before.params.range }))]);
      if (mine !== generation || view !== before || live.paused()) return;
      const data = G.mergeTail(before.data, fresh, live.ranges[before.params.range] || 3600);
      const changed = people(events) !== people(before.events);
      view = Object.assign({}, before, { data, events });
      draw(data, events, false);
      live.updated();
      // the answer and the latest sample's age, as the server words them now: on a change
      // of processes or incidents, and every ANSWER_EVERY_MS
      if (changed || Date.now() - answerTaken >= ANSWER_EVERY_MS) await takeLists();
    } catch (err) {
      live.failed(err);
    }
  }

  // The bound processes and open incidents, from this page as the server renders it now.
  const ANSWER_EVERY_MS = 10000;
  let answerTaken = Date.now();
  async function takeLists() {
    answerTaken = Date.now();
    G.takeParts(await G.pageNow(window.location.pathname), ["#bound tbody", "#open-incidents",
      "#answer", "#sample-age"]);
  }

  // Back from a zoom or an absolute range: the range, following it.
  const live = G.liveControl(follow, () => G.pickRange(view.params.range));

  G.rangeControl(load);
  for (const id of ["util", "bw", "power", "thermal", "lanes", "heatmap"]) G.onZoom(chart[id]);
})();
