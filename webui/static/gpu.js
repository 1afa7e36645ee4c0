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
  const ids = ["util", "lanes", "bw", "power", "throttle", "thermal", "heatmap", "scatter"];
  const chart = {};
  for (const id of ids) chart[id] = G.init(`chart-${id}`);
  G.connect();
  const GB = 1e-9;

  // A held moment (the URL's ``at``: a heatmap cell, a chain step) marked on every chart.
  const heldAt = () => (view ? view.params.at : null);
  const withHeld = (series) => {
    const mark = G.heldMark(heldAt());
    if (mark && series.length && !series[0].markLine) {
      series[0] = Object.assign({}, series[0], { markLine: mark });
    }
    return series;
  };

  function utilisation(data, events, range) {
    const option = G.base(range);
    option.yAxis = { type: "value", name: "%", min: 0, max: 100 };
    const pct = G.unit("%");
    const marks = G.marks(events);
    const held = G.heldMark(heldAt());
    if (held) marks.data = marks.data.concat(held.data);
    option.series = [
      G.line("GPU util", G.column(data, "gpu_util"), Object.assign({ markLine: marks }, pct)),
      G.line("SM active", G.column(data, "sm_active"), pct),
      G.line("tensor active", G.column(data, "tensor_active"), pct),
      G.line("DRAM active", G.column(data, "dram_active"), pct),
      G.line("graphics engine", G.column(data, "gr_engine_active"), pct),
      G.line("memory controller", G.column(data, "mem_util"), pct),
      G.line("encoder", G.column(data, "enc_util"), pct),
      G.line("decoder", G.column(data, "dec_util"), pct),
    ];
    return option;
  }

  function bandwidth(data, range) {
    const option = G.base(range);
    option.yAxis = { type: "value", name: "GB/s" };
    option.series = withHeld(["pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"].map((f) =>
      G.line(f.replace("_", " "), G.column(data, `${f}_bytes_per_s`, GB), G.unit("GB/s"))));
    return option;
  }

  function power(data, range) {
    const option = G.base(range);
    option.yAxis = [{ type: "value", name: "W" }, { type: "value", name: "MHz" }];
    option.series = withHeld([
      G.line("power", G.column(data, "power_w"), G.unit("W")),
      G.line("power limit", G.column(data, "power_limit_w"),
        Object.assign({ lineStyle: { type: "dashed" } }, G.unit("W"))),
      G.line("SM clock", G.column(data, "sm_clock_mhz"),
        Object.assign({ yAxisIndex: 1 }, G.unit("MHz"))),
      G.line("memory clock", G.column(data, "mem_clock_mhz"),
        Object.assign({ yAxisIndex: 1 }, G.unit("MHz"))),
    ]);
    return option;
  }

  // Clock-event (throttle) reasons on their own lane under the clocks: a row a reason that
  // held in the range (IDLE aside: an idle GPU's clocks drop by design), a bar where it
  // held, on the same time axis as the clocks above. Not a count on the MHz axis: which
  // reason held is what tells power from thermal from an application clock.
  const REASON_WORDS = { APP_CLOCKS: "application clocks", SW_POWER_CAP: "power cap (software)",
    HW_SLOWDOWN: "hardware slowdown", SYNC_BOOST: "sync boost", SW_THERMAL: "thermal (software)",
    HW_THERMAL: "thermal (hardware)", HW_POWER_BRAKE: "power brake (hardware)" };
  function reasonSpans(data) {
    const bits = data.throttle_bits || {}, at = data.fields.indexOf("clocks_event_reasons") + 1;
    const bucket = G.ms(data.bucket_ns), from = G.ms(data.from), gap = G.gapMs(data);
    const names = [], spans = [];
    let read = false;
    for (const [name, bit] of Object.entries(bits)) {
      if (name === "IDLE") continue;
      let open = null;
      const row = names.length, found = [];
      for (const r of data.rows) {
        const mask = r[at];
        if (mask === null || mask === undefined) continue;
        read = true;
        const t = G.ms(r[0]);
        const start = from + Math.floor((t - from) / bucket) * bucket;
        if (mask & bit) {
          if (open && start - open[1] <= gap) {
            open[1] = start + bucket;
          } else {
            if (open) found.push(open);
            open = [start, start + bucket, row, name];
          }
        } else if (open) {
          found.push(open);
          open = null;
        }
      }
      if (open) found.push(open);
      if (!found.length) continue;
      names.push(REASON_WORDS[name] || name);
      spans.push(...found);
    }
    return { names, spans, read };
  }

  function throttle(data, range) {
    const { names, spans, read } = reasonSpans(data);
    const option = G.base(range);
    delete option.legend;
    option.grid = G.grid({ top: 6, bottom: 24 });
    option.yAxis = G.rowAxis(names.length ? names : [""]);
    option.tooltip = { trigger: "item", renderMode: "richText",
      formatter: (p) => `clocks reduced: ${names[p.value[2]]} (${p.value[3]}), ` +
        `${G.clock(p.value[0])} – ${G.clock(p.value[1])}` };
    option.series = withHeld([Object.assign(G.spans(spans, { fill: 0.7, minWidth: 2,
      style: true }), { itemStyle: { color: "#d62728" } })]);
    option.graphic = G.emptyNote(!names.length, read ? "clock-event reason (other than idle)"
      : "clock-event reasons");
    return option;
  }

  function thermal(data, range) {
    const option = G.base(range);
    option.yAxis = [{ type: "value", name: "°C" }, { type: "value", name: "MiB" }];
    option.series = withHeld([G.line("temperature", G.column(data, "temp_c"), G.unit("°C")),
      G.line("memory used", G.column(data, "fb_used_mib"),
        Object.assign({ yAxisIndex: 1 }, G.unit("MiB")))]);
    return option;
  }

  // Every counter as a row of cells on the page's time axis, each measure on one shared,
  // stated scale from zero (written in its row's name and in the legend): every % row 0–100
  // %, the four links 0 to the fastest of them, power 0 to its limit, temperature 0–100
  // °C, each clock and the memory 0 to its highest in the range. Scaling a row to its own
  // lowest and highest drew 97 ↔ 99 % as full-contrast stripes. A counter this GPU never
  // gave has no row; throttle reasons have their lane under the clocks.
  const UNITS = { pcie_tx_bytes_per_s: "GB/s", pcie_rx_bytes_per_s: "GB/s",
    nvlink_tx_bytes_per_s: "GB/s", nvlink_rx_bytes_per_s: "GB/s", power_w: "W",
    power_limit_w: "W", sm_clock_mhz: "MHz", mem_clock_mhz: "MHz", temp_c: "°C",
    fb_used_mib: "MiB" };
  const SCALE = { pcie_tx_bytes_per_s: GB, pcie_rx_bytes_per_s: GB, nvlink_tx_bytes_per_s: GB,
    nvlink_rx_bytes_per_s: GB };
  const LINKS = ["pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "nvlink_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s"];
  const shown = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
  const highest = (data, fields) => Math.max(0, ...data.rows.flatMap((r) =>
    fields.map((f) => r[data.fields.indexOf(f) + 1]).filter((v) => v !== null)));

  // The top of a field's scale (in its shown unit): what a full-colour cell means.
  function scaleTop(data, field) {
    const unit = UNITS[field] || "%";
    if (unit === "%") return 100;
    if (LINKS.includes(field)) return highest(data, LINKS) * GB;
    if (field === "power_w" || field === "power_limit_w") {
      return highest(data, ["power_limit_w"]) || highest(data, ["power_w"]);
    }
    if (field === "temp_c") return Math.max(100, highest(data, ["temp_c"]));
    return highest(data, [field]);
  }

  function heatmap(data, range) {
    const bucket = G.ms(data.bucket_ns);
    const start = (r) => G.ms(data.from) + Math.floor((G.ms(r[0]) - G.ms(data.from)) / bucket) * bucket;
    const names = [], full = [], cells = [];
    for (const field of data.fields.filter((f) => f !== "clocks_event_reasons")) {
      const i = data.fields.indexOf(field) + 1, scale = SCALE[field] || 1;
      if (!data.rows.some((r) => r[i] !== null)) continue;
      const unit = UNITS[field] || "%", top = scaleTop(data, field), y = names.length;
      const scaleText = `0–${shown.format(top)} ${unit}`;
      // a % row's scale is the legend's; another's is in its name (the margin is narrow)
      const name = field.replace(/_(bytes_per_s|w|mhz|c|mib)$/, "").replaceAll("_", " ");
      names.push(unit === "%" ? name : `${name} ${scaleText}`);
      full.push(`${name} (scale ${scaleText})`);
      for (const r of data.rows) {
        if (r[i] === null) continue;
        const value = r[i] * scale;
        cells.push([start(r), start(r) + bucket, y, top > 0 ? Math.min(value / top, 1) : 0,
          G.withUnit(value, unit)]);
      }
    }
    const option = G.base(range);
    delete option.legend;
    option.grid = G.grid({ top: 10, bottom: 60 });
    option.yAxis = G.rowAxis(names);
    option.tooltip = { trigger: "item", renderMode: "richText",
      formatter: (p) => `${full[p.value[2]]} at ${G.clock(p.value[0])}: ${p.value[4]}` };
    option.visualMap = { type: "continuous", dimension: 3, min: 0, max: 1, seriesIndex: 0,
      orient: "horizontal", left: "center", bottom: 0, itemHeight: 160,
      text: ["100 % (every % row); other rows: the top in their name", "0"], calculable: false,
      inRange: { color: ["#f7fbff", "#6baed6", "#08306b"] } };
    option.series = withHeld([G.spans(cells)]);
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
      tooltip: { renderMode: "richText", formatter: (p) =>
        `PCIe tx+rx ${G.withUnit(p.value[0], "GB/s")}, GPU util ${G.withUnit(p.value[1], "%")}` },
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
    option.series = withHeld([G.spans(bars, { fill: 0.6, minWidth: 2, style: true })]);
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
    chart.throttle.setOption(throttle(data, range), true);
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
        G.fetchJson(G.withParams(page.dataset.series, G.apiParams(params))),
        G.fetchJson(G.withParams(page.dataset.events, G.apiParams(params)))]);
      if (mine !== generation) return;
      // a moment asked for (``at``: a heatmap cell, a chain step) holds the view there,
      // marked, as a zoom does; a range button follows live again
      view = { params, data, events, following: !(params.from && params.to) && !params.at };
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
  for (const id of ["util", "bw", "power", "throttle", "thermal", "lanes", "heatmap"]) {
    G.onZoom(chart[id]);
  }
})();
