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
      // A GPU whose health is not live (lost, resetting, ...) keeps its last numbers greyed:
      // the page is reloaded for a change of health, numbers are never refreshed for it.
      if (typeof gpu.health === "string" && gpu.health !== card.dataset.health) {
        window.location.reload();
        return;
      }
      if (!gpu.live || !gpu.sample) continue;
      // its first sample: the numbers are no longer "no sample"
      for (const note of card.querySelectorAll(".no-sample")) note.remove();
      card.querySelector("dl.metrics").classList.remove("stale");
      for (const dd of card.querySelectorAll("dd[data-field]")) {
        const raw = gpu.sample[dd.dataset.field];
        const scale = Number(dd.dataset.scale || 1);
        dd.textContent = format(raw === null || raw === undefined ? raw : raw * scale,
          dd.dataset.field);
      }
    }
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
