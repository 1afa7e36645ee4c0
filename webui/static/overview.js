// Refreshes the GPU cards' numbers from /api/gpus. Values are set with textContent only:
// nothing from the store is ever parsed as HTML.
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

  function render(gpus) {
    for (const gpu of gpus) {
      const card = cards.querySelector(`section[data-gpu="${CSS.escape(gpu.id)}"]`);
      if (!card) continue;
      // A GPU whose health is not live (lost, resetting, ...) keeps its last numbers greyed:
      // the page is reloaded for a change of health, numbers are never refreshed for it.
      if (typeof gpu.health === "string" && gpu.health !== card.dataset.health) {
        window.location.reload();
        return;
      }
      if (!gpu.live || !gpu.sample) continue;
      for (const dd of card.querySelectorAll("dd[data-field]")) {
        const raw = gpu.sample[dd.dataset.field];
        const scale = Number(dd.dataset.scale || 1);
        dd.textContent = format(raw === null || raw === undefined ? raw : raw * scale,
          dd.dataset.field);
      }
    }
  }

  async function refresh() {
    try {
      const response = await fetch("/api/gpus");
      if (response.ok) render(await response.json());
    } catch (err) {
      console.warn("gpuwhy: refresh failed", err);
    }
  }

  setInterval(refresh, Number(cards.dataset.refreshMs) || 2000);
})();
