// Local time beside the server's UTC: every <time data-ns> the server wrote (the `instant`
// filter, in UTC) gets the browser's local time after it, written by GpuwhyCharts.clock
// (charts.js, the browser's one time writer), and the page's #chart-zone names the zone.
// Only text is added (textContent); without this script the UTC times stand as they are.
(function () {
  "use strict";
  const G = window.GpuwhyCharts;
  if (!G) return;
  const UTC_ZONES = ["UTC", "Etc/UTC", "Etc/GMT", "GMT", "Etc/Universal", "Etc/Zulu"];

  function addLocalTimes(root) {
    if (UTC_ZONES.includes(G.zone)) return;    // local is UTC: nothing to add
    for (const t of root.querySelectorAll("time[data-ns]:not([data-local])")) {
      const ns = Number(t.dataset.ns);
      if (!Number.isFinite(ns)) continue;
      const local = document.createElement("span");
      local.className = "local-time";
      local.textContent = ` (${G.clock(ns / 1e6)} local)`;
      local.title = `local time, ${G.zone}`;
      t.after(local);
      t.dataset.local = "shown";
    }
  }

  // for the parts a live page takes again from the server (lists, tables)
  G.localTimes = addLocalTimes;
  G.showZone();
  addLocalTimes(document);
})();
