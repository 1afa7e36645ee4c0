// The incident page's chart of what raised it (webui/trigger.py says which fields, over
// which window): the GPU's series from its API, each line in its unit (a second unit on the
// right axis), the incident's opening (and closing) marked, the rule's window shaded.
// Gaps are judged against the GPU's sample period, as on the GPU page (G.gapMs).
(function () {
  "use strict";
  const G = window.GpuwhyCharts;
  const holder = document.getElementById("trigger");
  if (!holder) return;
  if (!G.available()) {
    G.showError("The chart library is not installed (run scripts/setup.sh).");
    return;
  }
  const fields = JSON.parse(holder.dataset.fields || "[]");
  const marks = JSON.parse(holder.dataset.marks || "{}");
  const units = [...new Set(fields.map((f) => f.unit))];

  function option(data) {
    const o = G.base({ from: data.from, to: data.to });
    delete o.toolbox;                 // one chart, no page range to zoom with it
    o.dataZoom = [];
    o.yAxis = units.map((unit) => Object.assign({ type: "value", name: unit },
      unit === "%" ? { min: 0, max: 100 } : {}));
    const lines = [{ xAxis: G.ms(marks.opened), lineStyle: { color: "#d62728", width: 2 },
      label: { show: true, formatter: "opened", color: "#d62728" } }];
    if (marks.closed) {
      lines.push({ xAxis: G.ms(marks.closed), lineStyle: { color: "#2c7a2c", width: 2 },
        label: { show: true, formatter: "closed", color: "#2c7a2c" } });
    }
    o.series = fields.map((f, n) => G.line(f.name, G.column(data, f.field, f.scale),
      Object.assign({ yAxisIndex: units.indexOf(f.unit) }, G.unit(f.unit))));
    if (o.series.length) {
      o.series[0].markLine = { symbol: "none", silent: true, data: lines };
      if (marks.window_start && marks.window_end && marks.window_end > marks.window_start) {
        o.series[0].markArea = { silent: true, itemStyle: { color: "rgba(214, 39, 40, 0.08)" },
          data: [[{ xAxis: G.ms(marks.window_start) }, { xAxis: G.ms(marks.window_end) }]] };
      }
    }
    o.graphic = G.emptyNote(!G.hasPoints(data, fields.map((f) => f.field)), "samples",
      data.held_since);
    return o;
  }

  async function draw() {
    try {
      const data = await G.fetchJson(holder.dataset.series);
      const chart = G.init("chart-trigger");
      chart.setOption(option(data), true);
      G.onResize(chart.getDom(), () => chart.resize());
      holder.dataset.loaded = "true";
    } catch (err) {
      G.showError(`Could not load the chart: ${err.message}`);
    }
  }
  G.showZone();
  draw();
})();
