// Shared chart helpers for the GPU and process pages (ECharts, served from /vendor).
// Every text that comes from the store is drawn on the canvas or set with textContent;
// tooltips use ECharts' richText mode, so no store value is ever parsed as HTML.
(function () {
  "use strict";
  const G = {};
  const charts = [];

  G.ms = (ns) => ns / 1e6;

  // The one place the browser writes a time (the server's pages use gpuwhy.text.format_ts):
  // in the browser's own zone, as ECharts' time axes and tooltips do (useUTC false), and
  // that zone is named once on each chart page (#chart-zone).
  G.zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "the browser's local time";
  const two = (n) => String(n).padStart(2, "0");
  // A time (ns) as a datetime-local input takes it, in the browser's zone, to the second;
  // the charts' labels are its month-to-second part, and the URL's times are UTC ISO 8601
  // (what a person writes and reads, the same in every zone).
  G.inputTime = function (ns) {
    const d = new Date(Number(ns) / 1e6);
    return `${d.getFullYear()}-${two(d.getMonth() + 1)}-${two(d.getDate())}T` +
      `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
  };
  G.clock = (ms) => G.inputTime(ms * 1e6).slice(5).replace("T", " ");
  G.isoTime = (ns) => new Date(Number(ns) / 1e6).toISOString();
  // The note's lead-in is the page's (data-lead): "· times in …" beside a chart's range,
  // "; local times in …" after a page's "Times are UTC" (static/times.js).
  G.showZone = function () {
    const note = document.getElementById("chart-zone");
    if (note) note.textContent = `${note.dataset.lead || "·"} times in ${G.zone}`;
  };

  G.available = () => typeof window.echarts !== "undefined";

  G.fetchJson = async function (url) {
    const response = await fetch(url, { headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    return response.json();
  };

  // What the series APIs are asked: a zoom's from/to with a held moment's ``at`` would let
  // ``at`` re-centre the window (webui/window.py), so the zoom wins and ``at`` stays a mark.
  G.apiParams = function (params) {
    const out = Object.assign({}, params);
    if (out.from && out.to) delete out.at;
    return out;
  };

  G.withParams = function (url, params) {
    const u = new URL(url, window.location.href);
    for (const [name, value] of Object.entries(params)) {
      if (value !== null && value !== undefined) u.searchParams.set(name, String(value));
    }
    return u.pathname + u.search;
  };

  // A page as the server renders it now (its escaping, units and times; this page by
  // default), inert: DOMParser runs no script. Live pages take their lists from it.
  G.pageNow = async function (url) {
    const where = url || window.location.pathname + window.location.search;
    const response = await fetch(where, { headers: { Accept: "text/html" } });
    if (!response.ok) throw new Error(`${where}: HTTP ${response.status}`);
    return new DOMParser().parseFromString(await response.text(), "text/html");
  };

  // The parts of ``root`` (this page by default) named by ``selectors``, replaced by the
  // same parts of ``fresh`` (from G.pageNow), with the local time beside their times.
  G.takeParts = function (fresh, selectors, root) {
    for (const selector of selectors) {
      const mine = (root || document).querySelector(selector);
      const theirs = fresh.querySelector(selector);
      if (!mine || !theirs) continue;
      mine.replaceWith(document.adoptNode(theirs));
      if (G.localTimes) G.localTimes(theirs);
    }
  };

  G.showError = function (text) {
    const p = document.getElementById("chart-error");
    if (!p) return;
    p.hidden = false;
    p.textContent = text;
  };

  G.init = function (id) {
    const chart = window.echarts.init(document.getElementById(id), null, { renderer: "canvas" });
    chart.group = "gpuwhy";
    charts.push(chart);
    // A chart with the zoom box (G.base's toolbox): dragging across it zooms, at once after
    // each drawing (a new option turns the box off), without first clicking its button.
    const setOption = chart.setOption.bind(chart);
    chart.setOption = function (option, ...rest) {
      setOption(option, ...rest);
      if (option.toolbox) {
        chart.dispatchAction({ type: "takeGlobalCursor", key: "dataZoomSelect",
          dataZoomSelectActive: true });
      }
    };
    return chart;
  };

  // The time range a chart shows now (ms): its axis as zoomed, by the box or the wheel.
  G.shown = function (chart) {
    const axis = chart.getModel().getComponent("xAxis", 0).axis;
    return axis.scale.getExtent();
  };

  // Each chart follows its own box, not only the window: a scrollbar that appears as the
  // page grows, or a narrower layout, changes a chart's width without a window resize.
  G.connect = function () {
    window.echarts.connect("gpuwhy");
    const boxes = new ResizeObserver((entries) => {
      for (const entry of entries) window.echarts.getInstanceByDom(entry.target)?.resize();
    });
    charts.forEach((c) => boxes.observe(c.getDom()));
  };

  // Calls ``redraw`` (in the next frame) whenever ``element``'s box changes size.
  G.onResize = function (element, redraw) {
    new ResizeObserver(() => requestAnimationFrame(redraw)).observe(element);
  };

  // How far apart (ms) two drawn points may be before the line breaks: no sample for more
  // than ~3 sample periods (the GPU's, from the API's sample_period_s), or a bucket when the
  // buckets are coarser. A fixed two buckets drew nothing at all when samples came 10 s
  // apart into 5 s buckets (every other bucket empty). Consecutive buckets' first samples
  // lie up to a bucket and a period apart when none is missing, hence the period's margin.
  G.gapMs = function (data) {
    const bucket = (data.bucket_s || 1) * 1e3;
    const period = Number(data.sample_period_s) * 1e3;
    if (!(period > 0)) return 2 * bucket;       // period unknown (or a process's seconds)
    return Math.max(3.5 * period, bucket + 1.5 * period);
  };

  // A field's points (ms, value); where a gap is (G.gapMs: the source stopped, gpuwhy was
  // down) a null breaks the line instead of bridging it.
  G.column = function (data, field, scale) {
    const i = data.fields.indexOf(field) + 1;
    const gap = G.gapMs(data);
    const out = [];
    let last = null;
    for (const r of data.rows) {
      const t = G.ms(r[0]);
      if (last !== null && t - last > gap) out.push([(last + t) / 2, null]);
      out.push([t, r[i] === null ? null : r[i] * (scale || 1)]);
      last = t;
    }
    return out;
  };

  // A value with its unit, as every tooltip writes it ("no sample" where there is none).
  const figures = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
  G.withUnit = function (value, unit) {
    if (value === null || value === undefined || Number.isNaN(Number(value))) return "no sample";
    const n = Number(value);
    const shown = Math.abs(n) > 0 && Math.abs(n) < 0.1 ? n.toPrecision(2) : figures.format(n);
    return unit ? `${shown}${unit === "%" ? " %" : ` ${unit}`}` : shown;
  };
  // A series' tooltip in its unit (ECharts >= 5.3 takes it per series).
  G.unit = (unit) => ({ tooltip: { valueFormatter: (v) => G.withUnit(v, unit) } });

  // A moment the view is held at (a heatmap cell's, a chain step's: the URL's ``at``), as a
  // vertical mark with its time; null without one.
  G.heldMark = function (atNs) {
    if (!atNs) return null;
    const ms = G.ms(Number(atNs));
    return { symbol: "none", silent: true, data: [{ xAxis: ms, lineStyle: { color: "#6a3d9a",
      width: 2 }, label: { show: true, position: "insideEndTop", color: "#6a3d9a",
      formatter: `held at ${G.clock(ms)}` } }] };
  };

  // Every time chart of a page has the same plot edges, so one moment is one x on all of
  // them (the crosshair crosses them all at it): the left margin holds the row names of
  // the lanes and heatmaps, the right one a second axis's numbers.
  const LEFT_PX = 160, RIGHT_PX = 70;
  G.grid = (extra) => Object.assign({ left: LEFT_PX, right: RIGHT_PX, top: 30, bottom: 30 },
    extra || {});
  G.timeAxis = (range) => ({ type: "time", min: G.ms(range.from), max: G.ms(range.to),
    axisPointer: { show: true, snap: false, triggerTooltip: false, label: { show: false } } });
  // Row names on a category axis, cut to the margin (the tooltip has them whole).
  G.rowAxis = (names) => ({ type: "category", data: names, inverse: true,
    axisLabel: { width: LEFT_PX - 12, overflow: "truncate" } });

  G.base = function (range) {
    return {
      animation: false,
      useUTC: false,
      grid: G.grid(),
      legend: { top: 0, left: LEFT_PX + 20, right: RIGHT_PX, type: "scroll" },
      tooltip: { trigger: "axis", renderMode: "richText" },
      // zoom: drag across a time span (the box), or the wheel; the box's "back" undoes it
      toolbox: { right: 6, top: 0, itemSize: 13, feature: { dataZoom: { yAxisIndex: "none",
        title: { zoom: "drag across a span to zoom", back: "back to the range" } } } },
      dataZoom: [{ type: "inside", xAxisIndex: 0, filterMode: "none",
        moveOnMouseMove: false }],
      xAxis: G.timeAxis(range),
    };
  };

  // What an empty chart says: nothing in this range, and since when the store holds what
  // it shows (or that it holds none yet; undefined: not said). One element with an id, shown or hidden, so that
  // a merged live redraw takes it away once data comes.
  G.emptyNote = function (empty, what, heldSince) {
    const since = heldSince === undefined ? "" : heldSince
      ? `; the store holds them since ${G.clock(G.ms(heldSince))}` : "; none stored yet";
    return [{ id: "empty-note", type: "text", left: "center", top: "middle", invisible: !empty,
      silent: true, style: { text: `no ${what} in this range${since}`, fill: "#666",
        fontSize: 13 } }];
  };
  G.hasPoints = (data, fields) => data.rows.some((r) =>
    fields.some((f) => r[data.fields.indexOf(f) + 1] !== null));

  G.line = (name, data, extra) =>
    Object.assign({ name, type: "line", showSymbol: false, connectNulls: false, data }, extra || {});

  // Bars and cells on a time axis (lanes, heatmaps: their columns line up with the line
  // charts'): items [fromMs, toMs, row, value, ...]; the colour from the chart's visualMap
  // (on value) or ``style`` when given; ``fill`` is the share of a row's height drawn.
  G.spans = function (data, options) {
    const o = Object.assign({ fill: 1, minWidth: 1 }, options || {});
    return {
      type: "custom", data, encode: { x: [0, 1], y: 2 },
      renderItem: (params, api) => {
        const start = api.coord([api.value(0), api.value(2)]);
        const end = api.coord([api.value(1), api.value(2)]);
        const height = api.size([0, 1])[1] * o.fill;
        const shape = window.echarts.graphic.clipRectByRect({ x: start[0],
          y: start[1] - height / 2, width: Math.max(end[0] - start[0], o.minWidth), height },
        params.coordSys);
        return shape && { type: "rect", shape,
          style: o.style ? api.style() : { fill: api.visual("color") } };
      },
    };
  };

  // Marks on the time axis: incidents (red) and resets (orange); their labels are links
  // laid over the chart by G.markLabels, so that none covers another.
  G.marks = function (events) {
    const lines = [];
    for (const i of events.incidents || []) {
      lines.push({ xAxis: G.ms(i.opened_at), lineStyle: { color: "#d62728" } });
    }
    for (const r of events.resets || []) {
      lines.push({ xAxis: G.ms(r.ts), lineStyle: { color: "#ff7f0e", type: "dashed" } });
    }
    return { symbol: "none", silent: true, label: { show: false }, data: lines };
  };

  // The marks' labels, as links to the incident or the resets, in rows at the top of the
  // plot: each takes the first row where it starts after the last label ends; past
  // MARK_ROWS rows a crowded stretch becomes one "+N" label listing the rest (its title).
  const MARK_ROWS = 3, ROW_PX = 18, GAP_PX = 4, TOP_PX = 32;
  // a label's width, rounded up (offsetWidth rounds, and a label may then overrun)
  const wide = (el) => Math.ceil(el.getBoundingClientRect().width);
  G.markLabels = function (chart, holder, events) {
    const marks = [];
    for (const i of events.incidents || []) {
      marks.push({ ms: G.ms(i.opened_at), text: `#${i.id} ${i.kind}`, kind: "incident",
        href: `/incidents/${encodeURIComponent(i.id)}`, title: `#${i.id} ${i.title || i.kind}` });
    }
    for (const r of events.resets || []) {
      marks.push({ ms: G.ms(r.ts), text: "reset", kind: "reset", href: "/resets",
        title: `reset: ${r.what}${r.comm ? ` (${r.comm})` : ""}` });
    }
    marks.sort((a, b) => a.ms - b.ms);
    holder.replaceChildren();
    const width = holder.clientWidth, ends = [];
    let more = null;
    for (const m of marks) {       // only those in the plot as zoomed now
      const x = chart.convertToPixel({ xAxisIndex: 0 }, m.ms);
      if (!Number.isFinite(x) || x < LEFT_PX || x > chart.getWidth() - RIGHT_PX) continue;
      const label = document.createElement("a");
      label.className = `mark ${m.kind}`;
      label.href = m.href;
      label.textContent = m.text;
      label.title = m.title;
      holder.appendChild(label);
      const left = Math.max(0, Math.min(x, width - wide(label)));
      const row = ends.findIndex((end) => end + GAP_PX <= left);
      const at = row !== -1 ? row : ends.length < MARK_ROWS ? ends.length : -1;
      if (at === -1) {                 // no room: into the "+N" label of this stretch
        label.remove();
        if (more && more.end + GAP_PX > left) {
          more.count += 1;
          more.el.textContent = `+${more.count}`;
          more.el.title += `\n${m.title}`;
          more.end = Math.max(more.end, more.left + wide(more.el));
          continue;
        }
        const el = document.createElement("span");
        el.className = "mark more";
        el.textContent = "+1";
        el.title = m.title;
        holder.appendChild(el);
        const start = Math.max(more ? more.end + GAP_PX : 0, Math.min(x, width - wide(el)));
        el.style.left = `${start}px`;
        el.style.top = `${TOP_PX + MARK_ROWS * ROW_PX}px`;
        more = { el, count: 1, left: start, end: start + wide(el) };
        continue;
      }
      label.style.left = `${left}px`;
      label.style.top = `${TOP_PX + at * ROW_PX}px`;
      ends[at] = left + wide(label);
    }
  };

  // A time in the page's URL: ISO 8601 (what a person writes and reads) or ns since the
  // epoch (what the API takes); ns, or null when it is neither.
  G.urlTime = function (text) {
    if (!text) return null;
    if (/^\d+$/.test(text)) return text;
    const ms = Date.parse(text);
    return Number.isNaN(ms) ? null : String(Math.round(ms * 1e6));
  };

  // The view in the URL (range, and from/to of an absolute range or a zoom, in UTC ISO),
  // replaced at each load so that a copied link reproduces what is on the screen.
  G.keepInUrl = function (params) {
    const u = new URL(window.location.href);
    u.searchParams.set("range", params.range);
    for (const name of ["from", "to"]) {
      if (params[name]) {
        u.searchParams.set(name, G.isoTime(params[name]));
      } else {
        u.searchParams.delete(name);
      }
    }
    if (params.at) {        // held at a moment: as the link gave it, else in UTC ISO
      if (G.urlTime(u.searchParams.get("at")) !== String(params.at)) {
        u.searchParams.set("at", G.isoTime(params.at));
      }
    } else {
      u.searchParams.delete("at");
    }
    window.history.replaceState(null, "", u.pathname + u.search + u.hash);
  };

  // Range buttons and zoom: calls load(params) with {range} or {from, to} (ns); the first
  // load takes them from the URL.
  G.rangeControl = function (load) {
    G.showZone();
    const picker = document.getElementById("range-picker");
    const url = new URL(window.location.href).searchParams;
    let current = { range: url.get("range") || picker.dataset.default || "1h" };
    const from = G.urlTime(url.get("from")), to = G.urlTime(url.get("to"));
    if (from && to) Object.assign(current, { from, to });
    // a moment to hold at (a heatmap cell, a chain step): ns or ISO, as from/to
    const at = G.urlTime(url.get("at"));
    if (at) current.at = at;
    // An absolute range, in the browser's time zone (as the axes), to the second.
    const fromInput = document.getElementById("range-from");
    const toInput = document.getElementById("range-to");
    const show = (params) => {
      G.keepInUrl(params);
      if (fromInput && params.from && params.to) {
        fromInput.value = G.inputTime(params.from);
        toInput.value = G.inputTime(params.to);
      }
      return load(params);
    };
    for (const button of picker.querySelectorAll("button[data-range]")) {
      button.classList.toggle("active", button.dataset.range === current.range);
      button.addEventListener("click", () => {
        picker.querySelectorAll("button").forEach((b) => b.classList.remove("active"));
        button.classList.add("active");
        current = { range: button.dataset.range, picked: 1 };
        show(current);
      });
    }
    const apply = document.getElementById("range-apply");
    if (apply) {
      apply.addEventListener("click", () => {
        const f = Date.parse(fromInput.value), t = Date.parse(toInput.value);
        if (Number.isNaN(f) || Number.isNaN(t) || t <= f) {
          G.showError("Give a start and an end after it.");
          return;
        }
        current = { range: current.range, from: String(f * 1e6), to: String(t * 1e6),
          at: current.at };
        show(current);
      });
    }
    let timer = null;
    G.onZoom = function (chart) {
      chart.on("datazoom", () => {
        // read now: a live redraw of a chart before the timer fires resets its zoom
        const [low, high] = G.shown(chart);
        clearTimeout(timer);
        timer = setTimeout(() => {
          if (!Number.isFinite(low) || !Number.isFinite(high)) return;
          const from = Math.floor(low * 1e6);
          const to = Math.ceil(high * 1e6);
          if (to - from < 2e9) return;
          // a held moment stays marked (and in the URL) through a zoom
          current = { range: current.range, from, to, at: current.at };
          show(current);
        }, 500);
      });
    };
    show(current);
  };

  // --- live charts: what a chart drawn on a grid of buckets asks for, and how it merges ---
  // The request for what is new: the buckets from the last one drawn (perhaps not complete
  // then) on, on the grid the chart was drawn on.
  G.tailParams = function (data) {
    const last = data.rows.length ? data.rows[data.rows.length - 1][0] : data.from;
    return { after: String(last), grid: String(data.from), bucket: String(data.bucket_ns) };
  };

  // The fresh buckets replace the drawn ones they overlap and come after them; the view
  // ends at the newest data and keeps ``seconds`` before it (null: keeps its start).
  G.mergeTail = function (data, fresh, seconds) {
    const grid = data.from, bucket = data.bucket_ns;
    // ns arrive as doubles (±256 ns): the epsilon keeps a bucket's first sample in it
    const index = (row) => Math.floor((row[0] - grid) / bucket + 1e-6);
    const first = fresh.rows.length ? index(fresh.rows[0]) : Infinity;
    const to = Math.max(data.to, fresh.to);
    const from = seconds ? to - seconds * 1e9 : data.from;
    const rows = data.rows.filter((r) => index(r) < first && r[0] >= from).concat(fresh.rows);
    return Object.assign({}, data, { rows, from, to });
  };

  // Back to following a named range, as a click on its button would (a held view's way).
  G.pickRange = function (range) {
    const button = document.querySelector(
      `#range-picker button[data-range="${CSS.escape(range)}"]`);
    if (button) button.click();
  };

  // A chart page's live indicator (#live): "Live", "Paused" or "Holding this time range",
  // and its button (pause, resume, follow live). ``tick`` runs at each refresh while the
  // view follows and is not paused; ``followAgain`` takes a held view back to following.
  // None on a page without #live (an exited process's).
  G.liveControl = function (tick, followAgain) {
    const live = document.getElementById("live");
    if (!live) return null;
    const state = document.getElementById("live-state");
    const seen = document.getElementById("live-seen");
    const toggle = document.getElementById("live-toggle");
    let paused = false, following = true;
    const show = () => {
      state.textContent = !following ? "Holding this time range" : paused ? "Paused" : "Live";
      toggle.textContent = !following ? "follow live" : paused ? "resume" : "pause";
      live.classList.remove("stale");
    };
    toggle.addEventListener("click", () => {
      if (!following) {
        followAgain();
        return;
      }
      paused = !paused;
      show();
      if (!paused) tick();
    });
    setInterval(() => { if (following && !paused) tick(); },
      Number(live.dataset.refreshMs) || 2000);
    return {
      ranges: JSON.parse(live.dataset.ranges || "{}"),   // range name -> seconds
      paused: () => paused,
      follows(yes) { following = yes; show(); },
      updated() { seen.textContent = `; updated ${G.clock(Date.now())}`; show(); },
      failed(err) {
        state.textContent = "Not updating (retrying)";
        live.classList.add("stale");
        console.warn("gpuwhy: live update failed", err);
      },
    };
  };

  G.updateCsvLinks = function (params) {
    for (const a of document.querySelectorAll("a[id^='csv-']")) {
      a.href = G.withParams(a.href.split("?")[0], params);
    }
  };

  window.GpuwhyCharts = G;
})();
