// The incident page's flame graph of sampled Python stacks (ECharts, a custom series).
// Frame names are the sampled process's text: drawn on the canvas, and the tooltip uses
// ECharts' richText mode, so no name is ever parsed as HTML.
(function () {
  "use strict";
  const box = document.getElementById("flame");
  if (!box) return;

  // The tree ({name, value, children}) as boxes [start, end, depth, name, value]: each child
  // starts where its elder sibling ended, inside its parent.
  function boxes(tree) {
    const out = [];
    const walk = (node, start, depth) => {
      out.push([start, start + node.value, depth, String(node.name), node.value]);
      let at = start;
      for (const child of node.children || []) {
        walk(child, at, depth + 1);
        at += child.value;
      }
    };
    walk(tree, 0, 0);
    return out;
  }

  const palette = ["#f2a65a", "#e9724c", "#f4c95d", "#dd7f4a", "#f0b67f", "#e8a33d"];

  function draw(tree) {
    if (!tree || !tree.value) {
      box.hidden = true;
      return;
    }
    const data = boxes(tree);
    const depth = Math.max(...data.map((d) => d[2])) + 1;
    box.style.height = `${Math.max(160, Math.min(900, depth * 22 + 40))}px`;
    const chart = window.echarts.init(box, null, { renderer: "canvas" });
    const total = tree.value;
    chart.setOption({
      animation: false,
      grid: { left: 8, right: 8, top: 8, bottom: 8 },
      xAxis: { type: "value", min: 0, max: total, show: false },
      yAxis: { type: "value", min: 0, max: depth, show: false },
      tooltip: {
        renderMode: "richText",
        formatter: (p) => `${p.value[3]}\n${p.value[4]} samples, ` +
          `${(100 * p.value[4] / total).toFixed(1)} %`,
      },
      series: [{
        type: "custom",
        encode: { x: [0, 1], y: 2 },
        data,
        renderItem: (params, api) => {
          const left = api.coord([api.value(0), api.value(2)]);
          const right = api.coord([api.value(1), api.value(2) + 1]);
          const width = right[0] - left[0];
          const height = left[1] - right[1];
          if (width < 0.5) return null;
          const name = String(data[params.dataIndex][3]);
          return {
            type: "rect",
            shape: { x: left[0], y: right[1], width: Math.max(0, width - 1), height: height - 1 },
            style: { fill: palette[params.dataIndex % palette.length] },
            textContent: {
              type: "text",
              style: { text: width > 30 ? name : "", fill: "#222", fontSize: 11,
                overflow: "truncate", width: width - 4 },
            },
            textConfig: { position: "insideLeft" },
          };
        },
      }],
    });
    new ResizeObserver(() => chart.resize()).observe(box);
    box.dataset.drawn = "true";
  }

  const show = (text) => {
    const p = document.getElementById("flame-error");
    if (p) { p.hidden = false; p.textContent = text; }
  };

  if (typeof window.echarts === "undefined") {
    show("The chart library is not installed (scripts/setup.sh): the table above holds the same.");
    return;
  }
  fetch(box.dataset.url, { headers: { Accept: "application/json" } })
    .then((r) => { if (!r.ok) throw new Error(`HTTP ${r.status}`); return r.json(); })
    .then((body) => draw(body.flame))
    .catch((e) => show(`Flame graph not drawn: ${e.message}`));
})();
