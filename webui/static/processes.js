// Refreshes the process table from /api/processes. Every value a process controls is
// set with textContent, never innerHTML: names and command lines are untrusted.
(function () {
  "use strict";
  const table = document.getElementById("processes");
  const body = table.querySelector("tbody");

  function cell(row, text, className) {
    const td = row.insertCell();
    if (className) td.className = className;
    td.textContent = text;
    return td;
  }

  function lines(row, items, className) {
    const td = row.insertCell();
    for (const text of items) {
      const div = document.createElement("div");
      div.className = className;
      div.textContent = text;
      td.appendChild(div);
    }
  }


  function render(processes) {
    body.replaceChildren();
    if (processes.length === 0) {
      const row = body.insertRow();
      row.className = "empty";
      const search = new URLSearchParams(window.location.search).get("q");
      const td = cell(row, search ? `No process matches “${search}”.`
                                  : "No process holds a GPU device right now.");
      td.colSpan = 8;
      return;
    }
    for (const p of processes) {
      const row = body.insertRow();
      row.dataset.key = p.key;
      const link = document.createElement("a");
      link.href = "/processes/" + encodeURIComponent(p.key);
      link.textContent = p.key;
      cell(row, "", "mono").appendChild(link);
      cell(row, p.comm);
      const gpus = cell(row, "", "gpus");
      for (const g of p.gpus) {
        const div = document.createElement("div");
        const a = document.createElement("a");
        a.href = "/gpus/" + encodeURIComponent(g.gpu_id);
        a.textContent = "GPU " + (g.gpu_index !== null ? g.gpu_index : g.gpu_id);
        div.appendChild(a);
        gpus.appendChild(div);
      }
      cell(row, p.cmdline, "cmdline");
      cell(row, p.tag || "");
      lines(row, p.devices.map((d) => `${d.path} (fd ${d.fd}${d.how !== "open" ? ", " + d.how : ""})`), "mono");
      cell(row, String(p.ioctl_total), "num");
      lines(row, p.ioctls.slice(0, 4).map((i) => `${i.name} × ${i.count}`), "mono");
    }
  }

  async function refresh() {
    try {
      // the same sort and search as the page's URL, so a refresh keeps the view
      const response = await fetch("/api/processes" + window.location.search);
      if (response.ok) render(await response.json());
    } catch (err) {
      console.warn("gpuwhy: refresh failed", err);
    }
  }

  setInterval(refresh, Number(table.dataset.refreshMs) || 2000);
})();
