"""`gpuwhy report`: one self-contained HTML file about an incident, a GPU or a process.

What it holds: the environment (GPUs, driver, host, processes), metric trends as inline SVG
charts with the incidents marked, the incidents with their root-cause chains, rule findings
with their fixes in priority order, and optionally the same figures for the period before.
Data come from the store's read API, as for the CLI and the web view
(``gpuwhy.store.queries``, ``gpuwhy.store.series``); the page has no script and no external
reference, so it works offline and prints (``--pdf``) as it shows.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from importlib import resources

import jinja2
from markupsafe import Markup
from sqlite_utils import Database

from gpuwhy import __version__
from gpuwhy import severity as sev
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.errors import GpuwhyError
from gpuwhy.identity import ProcessKey
from gpuwhy.stats import percentile
from gpuwhy.store import queries
from gpuwhy.store.series import gpu_series, process_series, window
from gpuwhy.text import format_ts
from gpuwhy.webui.evidence import evidence_rows
from gpuwhy.webui.filters import instant
from gpuwhy.webui.reports.svg import line_chart

MINUTE = 60 * NS_PER_SECOND
POINTS = 300
MAX_TEXT = 2000
# (field of store.series.GPU_FIELDS, chart title, unit); several fields share a chart.
GPU_CHARTS = (
    ("Engine activity", "%", ("gpu_util", "sm_active", "tensor_active", "dram_active")),
    ("Power", "W", ("power_w", "power_limit_w")),
    ("Temperature", "°C", ("temp_c",)),
    ("PCIe", "B/s", ("pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s")),
    ("Framebuffer used", "MiB", ("fb_used_mib",)),
)
PROCESS_CHARTS = (
    ("Process threads, per second", "ms", ("on_cpu_ms", "sleep_ms", "blocked_ms",
                                           "runqueue_ms")),
    ("Worker processes, per second", "ms", ("workers_on_cpu_ms", "workers_blocked_ms")),
    ("Driver calls", "per s", ("ioctls",)),
)
SUMMARY_FIELDS = ("gpu_util", "sm_active", "tensor_active", "dram_active", "power_w", "temp_c")


class ReportError(GpuwhyError):
    """What the report was asked about does not exist in the store."""


@dataclass
class Subject:
    """What a report is about, and the period it covers."""

    title: str
    since: int
    until: int
    gpu_ids: list[str] = field(default_factory=list)
    process: ProcessKey | None = None
    incident_id: int | None = None


def incident_subject(db: Database, incident_id: int, margin_ns: int = 10 * MINUTE) -> Subject:
    detail = queries.incident_detail(db, incident_id)
    if detail is None:
        raise ReportError(f"no incident {incident_id} in the store")
    end = detail["ended"] or detail["last_seen"] or detail["started"]
    gpus = [detail["gpu"]] if detail["gpu"] else sorted(
        {link["gpu_id"] for link in detail["chain"] if link["gpu_id"]})
    return Subject(f"Incident {incident_id}: {detail['title']}", detail["started"] - margin_ns,
                   end + margin_ns // 2, gpus, incident_id=incident_id)


def gpu_subject(db: Database, gpu: str, since: int, until: int) -> Subject:
    gpu_id = queries.gpu_named(db, gpu)
    if queries.gpu(db, gpu_id) is None:
        raise ReportError(f"no GPU {gpu!r} in the store")
    return Subject(f"GPU {gpu_id}", since, until, [gpu_id])


def process_subject(db: Database, key: ProcessKey, margin_ns: int = MINUTE) -> Subject:
    row = queries.process(db, key)
    if row is None:
        raise ReportError(f"no process {key} in the store")
    gpus = [r["gpu_id"] for r in queries.process_gpus(db, key)]
    end = row["exited_at"] or row["last_seen"]
    return Subject(f"Process {key} ({row['comm'] or '?'})",
                   (row["first_seen"] or now_ns()) - margin_ns, (end or now_ns()) + margin_ns,
                   gpus, process=key)


def _series(db: Database, gpu_id: str, since: int, until: int) -> dict:
    return gpu_series(db, gpu_id, window(until, 0, POINTS, since=since))


def _column(data: dict, name: str) -> list[tuple[int, float | None]]:
    index = data["fields"].index(name) + 1
    return [(row[0], row[index]) for row in data["rows"]]


def _stats(points: list[tuple[int, float | None]]) -> dict | None:
    values = [v for _, v in points if v is not None]
    if not values:
        return None
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values),
            "p95": percentile(values, 95)}


def _gpu_section(db: Database, gpu_id: str, subject: Subject, markers: list,
                 compare: bool) -> dict:
    data = _series(db, gpu_id, subject.since, subject.until)
    charts = [line_chart(f"{title} — {gpu_id}", unit,
                         [(name, _column(data, name)) for name in names],
                         subject.since, subject.until, markers) for title, unit, names in
              GPU_CHARTS]
    summary = []
    before = None
    if compare:
        span = subject.until - subject.since
        before = _series(db, gpu_id, subject.since - span, subject.since)
    for name in SUMMARY_FIELDS:
        now = _stats(_column(data, name))
        then = _stats(_column(before, name)) if before else None
        change = None
        if now and then and then["mean"]:
            change = (now["mean"] - then["mean"]) / abs(then["mean"])
        summary.append({"field": name, "now": now, "before": then, "change": change})
    row = queries.gpu(db, gpu_id) or {}
    return {"id": gpu_id, "model": row.get("model"), "driver": row.get("driver_version"),
            "simulated": bool(row.get("simulated")), "pci": row.get("pci_bus_id"),
            "uuid": row.get("uuid"), "charts": charts, "summary": summary,
            "samples": len(data["rows"])}


def _process_section(db: Database, key: ProcessKey, subject: Subject, markers: list) -> dict:
    data = process_series(db, key, window(subject.until, 0, POINTS, since=subject.since))
    charts = [line_chart(title, unit, [(name, _column(data, name)) for name in names],
                         subject.since, subject.until, markers)
              for title, unit, names in PROCESS_CHARTS]
    row = queries.process(db, key) or {}
    return {"key": str(key), "comm": row.get("comm"),
            "cmdline": (row.get("cmdline") or "")[:MAX_TEXT], "exe": row.get("exe"),
            "cgroup": row.get("cgroup"), "uid": row.get("uid"),
            "first_seen": row.get("first_seen"), "exited_at": row.get("exited_at"),
            "charts": charts}


def _incidents(db: Database, subject: Subject) -> list[dict]:
    from gpuwhy.webui.incidents import recommended_actions

    found: dict[int, dict] = {}
    if subject.incident_id is not None:
        found[subject.incident_id] = {}
    for gpu_id in subject.gpu_ids:
        for row in queries.list_incidents(db, gpu=gpu_id, since=subject.since, limit=200):
            if row["opened_at"] <= subject.until:
                found.setdefault(row["id"], {})
    if subject.process is not None:
        for incident_id in queries.process_incident_ids(db, subject.process):
            found.setdefault(incident_id, {})
    from gpuwhy.webui.reports.flame import flame_svg
    from gpuwhy.webui.stacks import incident_section

    out = []
    for incident_id in found:
        detail = queries.incident_detail(db, incident_id)
        if detail is not None:
            # where its processes' Python time went, and the advice that names the line
            stacks = incident_section(db, detail)
            advice = [a["sentence"] for a in stacks["advice"]] if stacks else []
            out.append({**detail, "actions": recommended_actions(detail) + advice,
                        "stacks": stacks,
                        "stacks_svg": flame_svg(stacks["flame"]) if stacks else None})
    out.sort(key=lambda i: (i["id"] != subject.incident_id, sev.sort_key(i["severity"]),
                            i["started"]))
    return out


def _findings(db: Database, subject: Subject) -> list[dict]:
    """Rule findings in the period, the most severe (and still firing) first."""
    found = queries.findings_in_window(db, subject.gpu_ids, subject.process, subject.since,
                                       subject.until)
    for row in found:
        for key, empty in (("evidence", {}), ("fixes", [])):
            try:
                row[key] = json.loads(row[key]) if row[key] else empty
            except ValueError:
                row[key] = empty
    found.sort(key=lambda f: (sev.sort_key(f["severity"]), f["state"] != "firing",
                              f["first_ts"]))
    return found


def gather(db: Database, subject: Subject, compare: bool = False) -> dict:
    """Everything the report shows, as plain data (and SVG markup for the charts)."""
    incidents = _incidents(db, subject)
    markers = [(i["started"], f"#{i['id']} {i['kind']}") for i in incidents]
    simulated = queries.simulated(db)
    return {
        "subject": subject, "generated": now_ns(), "version": __version__,
        "host": {"name": platform.node(), "kernel": platform.release()},
        "simulated": simulated, "compare": compare,
        "gpus": [_gpu_section(db, g, subject, markers, compare) for g in subject.gpu_ids],
        "process": _process_section(db, subject.process, subject, markers)
        if subject.process else None,
        "incidents": incidents, "findings": _findings(db, subject),
    }


def _when(ts: int | None) -> str:
    return format_ts(ts, "s")


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.4g}"


def render(data: dict) -> str:
    """The HTML page; every value is escaped by the template (autoescape) except the charts,
    which svg.py escapes as it draws them."""
    env = jinja2.Environment(loader=jinja2.PackageLoader("gpuwhy.webui"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters.update(when=_when, number=_number, instant=instant,
                       tojson=lambda v: json.dumps(v, default=str, ensure_ascii=False))
    # evidence as on the incident page, without links: the report leaves the server
    env.globals.update(evidence_rows=evidence_rows)
    css = resources.files("gpuwhy.webui").joinpath("static/report.css").read_text("utf-8")
    return env.get_template("report.html").render(**data, shared_css=Markup(css))
