// Refreshes the GPU cards from /api/gpus: numbers set with textContent only (nothing from
// the store is parsed as HTML); processes and open incidents, when they change, taken from
// the page as the server renders it (inert: DOMParser runs no script).
(function () {
  "use strict";
  const cards = document.getElementById("gpu-cards");
  const whole = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

  function format(value, field) {
    if (value === null || value === undefined) return "–";
    const units = { gpu_util: " %", sm_active: " %", tensor_active: " %", dram_active: " %",
      fb_used_mib: " MiB", fb_total_mib: " MiB", temp_c: " °C", power_w: " W" };
    return whole.format(Math.round(value)) + (units[field] || "");
  }

  // The severity marks of templates/_severity.html: the level told apart without colour.
  const MARKS = { critical: "✖", error: "■", warning: "▲", info: "i", ok: "✓" };

  // The card's answer as the server words it now: its severity (card border, badge mark and
  // word) and its sentence, set as text.
  function answer(card, told) {
    if (!told) return;
    const said = card.querySelector(".answer .sentence");
    if (said && said.textContent !== told.sentence) said.textContent = told.sentence;
    if (card.dataset.severity === told.severity) return;
    card.classList.remove(`sev-${card.dataset.severity}`);
    card.classList.add(`sev-${told.severity}`);
    card.dataset.severity = told.severity;
    const badge = card.querySelector(".answer .badge.sev");
    if (badge) {
      badge.className = `badge sev sev-${told.severity}`;
      const mark = document.createElement("span");
      mark.className = "sev-mark";
      mark.setAttribute("aria-hidden", "true");
      mark.textContent = MARKS[told.severity] || "?";
      badge.replaceChildren(mark, ` ${told.severity}`);
    }
  }

  // The cards in the answer's order, worst first (moved, not redrawn).
  function order(gpus) {
    const ranked = gpus.filter((g) => g.answer).sort((a, b) => a.answer.rank - b.answer.rank);
    const now = [...cards.querySelectorAll(":scope > section[data-gpu]")].map((c) => c.dataset.gpu);
    if (ranked.map((g) => g.id).join("\n") === now.join("\n")) return;
    for (const gpu of ranked) {
      const card = cards.querySelector(`section[data-gpu="${CSS.escape(gpu.id)}"]`);
      if (card) cards.append(card);
    }
  }

  // A sample's age in words, as the server's `age` filter writes it (webui/filters.py).
  function ageWords(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const s = Math.max(0, Math.floor(seconds));
    if (s < 120) return `${s} s`;
    if (s < 7200) return `${Math.floor(s / 60)} min`;
    if (s < 172800) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  // ", at <time>" of the sample, in UTC as the server writes it (the `instant` filter), the
  // local time beside it as times.js adds it; built with the DOM, never from markup.
  function dated(holder, ns) {
    const time = document.createElement("time");
    const iso = window.GpuwhyCharts.isoTime(ns);
    time.dateTime = iso;
    time.dataset.ns = String(ns);
    time.textContent = `${iso.slice(0, 10)} ${iso.slice(11, 19)} UTC`;
    holder.replaceChildren(", at ", time);
    if (window.GpuwhyCharts.localTimes) window.GpuwhyCharts.localTimes(holder);
  }

  // The card's processes and open incidents, as the server writes them in data-lists.
  function lists(gpu) {
    const procs = (gpu.processes || []).map((p) => `${p.pid}-${p.start_time} `).join("");
    const incidents = (gpu.incidents || []).map((i) => `${i.id}:${i.severity}:${i.state} `)
      .join("");
    return `${procs}|${incidents}`;
  }

  // A process bound or gone, an incident opened, changed or closed: the cards take their
  // lists from the page as the server renders it now (its escaping, its time formatter).
  async function takeLists() {
    const page = await window.GpuwhyCharts.pageNow("/");
    for (const fresh of page.querySelectorAll("#gpu-cards section[data-gpu]")) {
      const card = cards.querySelector(`section[data-gpu="${CSS.escape(fresh.dataset.gpu)}"]`);
      if (!card) continue;
      window.GpuwhyCharts.takeParts(fresh, ["ul.procs", "ul.incidents"], card);
      card.classList.toggle("has-incidents", fresh.classList.contains("has-incidents"));
      card.dataset.lists = fresh.dataset.lists;
    }
  }

  function render(gpus) {
    let changed = false;
    for (const gpu of gpus) {
      const card = cards.querySelector(`section[data-gpu="${CSS.escape(gpu.id)}"]`);
      if (!card) {
        // a GPU the page has no card for (the first one, or one known only from the kernel
        // log): the page as the server renders it now has one
        window.location.reload();
        return;
      }
      if (lists(gpu) !== card.dataset.lists) changed = true;
      answer(card, gpu.answer);
      // A GPU whose health is not live (lost, resetting, ...) keeps its last numbers greyed:
      // the page is reloaded for a change of health, numbers are never refreshed for it.
      if (typeof gpu.health === "string" && gpu.health !== card.dataset.health) {
        window.location.reload();
        return;
      }
      if (!gpu.live || !gpu.sample) continue;
      const fresh = gpu.freshness || {};
      // its first sample: the numbers are no longer "no sample"
      for (const none of card.querySelectorAll(".no-sample")) none.remove();
      // every number with its sample's age; greyed and dated once older than three periods
      const old = fresh.stale !== false;
      const note = card.querySelector(".sample-age");
      if (note) {
        note.hidden = false;
        note.classList.toggle("old", old);
        note.querySelector(".said").textContent = old ? "no live numbers: last read" : "read";
        note.querySelector(".age").textContent = ageWords(fresh.age_s);
        const when = note.querySelector(".when");
        when.hidden = !old;
        const shown = when.querySelector("time");
        if (old && (!shown || Number(shown.dataset.ns) !== gpu.sample.ts)) dated(when, gpu.sample.ts);
      }
      card.querySelector("dl.metrics").classList.toggle("stale", old);
      for (const dd of card.querySelectorAll("dd[data-field]")) {
        const raw = gpu.sample[dd.dataset.field];
        const scale = Number(dd.dataset.scale || 1);
        dd.textContent = format(raw === null || raw === undefined ? raw : raw * scale,
          dd.dataset.field);
      }
    }
    order(gpus);
    return changed;
  }

  async function refresh() {
    try {
      const response = await fetch("/api/gpus");
      if (response.ok && render(await response.json())) await takeLists();
    } catch (err) {
      console.warn("gpuwhy: refresh failed", err);
    }
  }

  setInterval(refresh, Number(cards.dataset.refreshMs) || 2000);
})();
