// Keeps the incident list live: it asks the incident feed for its newest cursor (one
// cheap call, `limit=1`), and only when that moved fetches this same page again (same URL:
// the same filters) and takes its table body. The rows stay rendered by the server, with
// its one time formatter and its escaping; nothing here builds HTML from data.
(function () {
  "use strict";
  const live = document.getElementById("live");
  const table = document.getElementById("incidents");
  if (!live || !table) return;
  const state = document.getElementById("live-state");
  const seen = document.getElementById("live-seen");
  const toggle = document.getElementById("live-toggle");
  const every = Number(live.dataset.refreshMs) || 2000;
  // the feed's newest cursor when the rows were taken (the server's, read before them)
  let cursor = live.dataset.cursor || null;
  let paused = false;

  async function latest() {
    const response = await fetch("/api/incidents?since=0&limit=1",
                                 { headers: { Accept: "application/json" } });
    await response.text();     // read to its end: an unread body keeps the request open
    if (!response.ok) throw new Error(`incident feed: HTTP ${response.status}`);
    return response.headers.get("Gpuwhy-Latest-Cursor");
  }

  async function takeRows() {
    const G = window.GpuwhyCharts;
    G.takeParts(await G.pageNow(), ["#incidents tbody"]);
  }

  async function refresh() {
    if (paused) return;
    try {
      const now = await latest();
      if (cursor !== null && now !== cursor) {
        await takeRows();
        const clock = window.GpuwhyCharts ? window.GpuwhyCharts.clock(Date.now()) : "";
        seen.textContent = clock ? `; last change shown at ${clock}` : "";
      }
      cursor = now;
      state.textContent = "Live";
      live.classList.remove("stale");
    } catch (err) {
      state.textContent = "Not updating (retrying)";
      live.classList.add("stale");
      console.warn("gpuwhy: refresh failed", err);
    }
  }

  toggle.addEventListener("click", () => {
    paused = !paused;
    toggle.textContent = paused ? "resume" : "pause";
    state.textContent = paused ? "Paused" : "Live";
    if (!paused) refresh();
  });

  if (window.GpuwhyCharts) window.GpuwhyCharts.showZone();   // the zone "last change" is in
  refresh();
  setInterval(refresh, every);
})();
