"""Python stacks in the web view: ``/api/incidents/<id>/stacks``, ``/api/gpus/<id>/stacks``
and ``/api/processes/<key>/stacks`` (folded ``a;b;c count`` text, or JSON); the stacks
section of the incident page, of a sampled process's page (``/processes/<key>/stacks``) and
of both reports (a table of top frames, the GPU's idle and busy seconds, advice naming the
line, a flame graph); and the GPU page's link to each bound process's stacks.

The rows come from gpuwhy.store.stacks (the sampler's aggregates, bounded and escaped when
stored); the advice from gpuwhy.stack_advice. Every frame is the sampled process's text:
templates escape it, the flame graph draws it on a canvas or as SVG text, never as markup.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flask import Blueprint, abort, current_app, jsonify, render_template, request, url_for
from flask.typing import ResponseReturnValue
from sqlite_utils import Database

from gpuwhy import stack_advice
from gpuwhy.clock import now_ns
from gpuwhy.config import MAX_INT
from gpuwhy.identity import ProcessKey
from gpuwhy.pystacks import ROLE_WORDS, ROLES, SEPARATOR, split_by_gpu, top_frames
from gpuwhy.store import queries
from gpuwhy.store.stacks import (
    folded_text,
    gpu_idle_by_second,
    newest_by_process,
    python_stacks,
)
from gpuwhy.webui.db import get_db
from gpuwhy.webui.processes import process_key_or_404
from gpuwhy.webui.window import whole

bp = Blueprint("stacks", __name__)
ID = f"<int(max={MAX_INT}):incident_id>"
ROWS = 8                  # sampled processes shown per incident (one per process and window)
MAX_ROWS = 50             # ... at most, through ?limit=
MAX_LINES = 20_000        # folded lines one answer holds, most samples first
MAX_NODES = 1_500         # flame graph boxes: the smallest go first
MIN_NODE_SHARE = 0.002    # a box under 0.2 % of the samples is not drawn
MAX_SUMMARY_CHARS = 240   # the GPU page's line per sampled process


def incident_rows(db: Database, incident: Mapping[str, Any], limit: int = ROWS) -> list[dict]:
    """The stored stacks of an incident: its finding's (a rule's answer), else its GPU's
    sampled while it was open."""
    details = incident.get("details") or {}
    finding_id = details.get("finding_id") if isinstance(details, dict) else None
    if finding_id:
        return python_stacks(db, finding_id=str(finding_id), limit=limit)
    if not incident.get("gpu"):
        return []
    until = incident.get("ended") or incident.get("last_seen") or now_ns()
    return python_stacks(db, gpu_id=str(incident["gpu"]), since=incident.get("started"),
                         until=until, limit=limit)


def flame_tree(stacks: Iterable[Mapping]) -> dict[str, Any]:
    """The stacks as one tree for a flame graph: the root (all samples), then each role
    (main thread, other threads, workers), then the frames, outermost first; boxes under
    MIN_NODE_SHARE of the samples and past MAX_NODES left out (their samples stay in their
    parent's value). Each node: ``{name, value, children}``."""
    root: dict[str, Any] = {"name": "all", "value": 0, "children": {}}
    for row in stacks:
        role = str(row.get("role", ""))
        count = int(row.get("count") or 0)
        if role not in ROLES or count <= 0:
            continue
        root["value"] += count
        node = root
        for name in [ROLE_WORDS[role], *str(row.get("stack", "")).split(SEPARATOR)]:
            child = node["children"].setdefault(name, {"name": name, "value": 0,
                                                       "children": {}})
            child["value"] += count
            node = child
    floor = max(1, root["value"] * MIN_NODE_SHARE)
    budget = [MAX_NODES]

    def kept(node: dict[str, Any]) -> dict[str, Any]:
        children = sorted((c for c in node["children"].values() if c["value"] >= floor),
                          key=lambda c: -c["value"])
        out = []
        for child in children:
            if budget[0] <= 0:
                break
            budget[0] -= 1
            out.append(kept(child))
        return {"name": node["name"], "value": node["value"], "children": out}

    return kept(root)


def section(db: Database, rows: list[dict], rule_id: str | None) -> dict[str, Any] | None:
    """What the stacks section shows, as plain values: per sampled process its window, the
    GPU's idle and busy seconds in it, each role's samples and top frames over the window
    and in the seconds the GPU was idle and busy (``idle``, ``busy``); the advice that
    names the line (gpuwhy.stack_advice); the flame graph's tree. None without stacks."""
    if not rows:
        return None
    shown = []
    for row in rows:
        idle = gpu_idle_by_second(db, row["gpu_id"], row["started"], row["ts"])
        split = split_by_gpu(row["stacks"], idle)
        by_gpu = {name: (top_frames(part), _samples(part)) for name, part in split.items()}
        roles = {}
        for role in ROLES:
            counts = [s["count"] for s in row["stacks"] if s["role"] == role]
            if counts:
                roles[role] = {"words": ROLE_WORDS[role], "samples": sum(counts),
                               "top": _shares(row["top"].get(role, []))}
                for name, (top, samples) in by_gpu.items():
                    roles[role][name] = {"samples": samples.get(role, 0),
                                         "top": _shares(top.get(role, []))}
        shown.append({
            "pid": row["pid"], "start_time": row["start_time"], "gpu_id": row["gpu_id"],
            "rule_id": row["rule_id"], "finding_id": row["finding_id"],
            "started": row["started"], "ts": row["ts"], "samples": row["samples"],
            "interval_ms": row["interval_ms"], "final": row["final"], "error": row["error"],
            "dropped": row["dropped"], "summary": row["summary"], "roles": roles,
            "lined_up": any(s.get("seconds") for s in row["stacks"]),
            "gpu_seconds": {"idle": sum(idle.values()),
                            "busy": sum(not v for v in idle.values())},
        })
    stacks = [s for row in rows for s in row["stacks"]]
    advice = stack_advice.find(stacks, rule_id or rows[0]["rule_id"] or None)
    return {"rows": shown, "advice": [a.as_dict() for a in advice],
            "flame": flame_tree(stacks)}


def _shares(found: list[tuple[str, float]]) -> list[dict[str, Any]]:
    return [{"frame": frame, "share": share} for frame, share in found]


def _samples(stacks: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in stacks:
        out[row["role"]] = out.get(row["role"], 0) + int(row["count"])
    return out


def incident_section(db: Database, incident: Mapping[str, Any]) -> dict[str, Any] | None:
    """The stacks section of an incident page or report (None when nothing was sampled)."""
    details = incident.get("details") or {}
    rule_id = details.get("rule_id") if isinstance(details, dict) else None
    return section(db, incident_rows(db, incident), str(rule_id) if rule_id else None)


def _folded(rows: list[dict]) -> str:
    lines = [line for row in rows for line in folded_text(row).splitlines()]
    return "".join(line + "\n" for line in lines[:MAX_LINES])


def _answer(rows: list[dict], rule_id: str | None) -> ResponseReturnValue:
    """Folded text (flame-graph tools, speedscope) or, with ``format=json``, the section."""
    wanted = request.args.get("format", "folded")
    if wanted == "json":
        return jsonify(section(get_db(), rows, rule_id) or {"rows": [], "advice": [],
                                                            "flame": flame_tree([])})
    if wanted != "folded":
        return jsonify(error="format is folded or json"), 400
    # text/plain, never HTML: a frame's markup stays text (security.py adds nosniff)
    return current_app.response_class(_folded(rows), mimetype="text/plain")


def _limit() -> int:
    try:
        found = whole(request.args, "limit", 1, MAX_ROWS)
    except ValueError as exc:
        abort(400, description=str(exc))
    return ROWS if found is None else found


@bp.get(f"/api/incidents/{ID}/stacks")
def incident_stacks(incident_id: int) -> ResponseReturnValue:
    """The Python stacks sampled for an incident: ``role;pid;frame;… count`` per line."""
    db = get_db()
    incident = queries.incident_detail(db, incident_id)
    if incident is None:
        abort(404, description=f"no incident {incident_id}")
    details = incident.get("details") or {}
    return _answer(incident_rows(db, incident, _limit()),
                   details.get("rule_id") if isinstance(details, dict) else None)


@bp.get("/api/gpus/<gpu_id>/stacks")
def gpu_stacks(gpu_id: str) -> ResponseReturnValue:
    """The Python stacks sampled lately on a GPU (its newest windows)."""
    db = get_db()
    gpu = queries.gpu(db, queries.gpu_named(db, gpu_id))
    if gpu is None:
        abort(404, description=f"no GPU {gpu_id!r} in the store")
    return _answer(python_stacks(db, gpu_id=gpu["id"], limit=_limit()), None)


@bp.get("/api/processes/<key>/stacks")
def process_stacks(key: str) -> ResponseReturnValue:
    """The Python stacks sampled of a process (its newest windows, on any GPU)."""
    return _answer(python_stacks(get_db(), process=process_key_or_404(key), limit=_limit()), None)


@bp.get("/processes/<key>/stacks")
def process_page(key: str) -> ResponseReturnValue:
    """A sampled process's stacks: the table, the advice and the flame graph of its newest
    windows (the GPU page links here); 404 for a process the store knows nothing of."""
    db = get_db()
    found = process_key_or_404(key)
    process = queries.process(db, found)
    rows = python_stacks(db, process=found, limit=_limit())
    if process is None and not rows:
        abort(404, description=f"no process {found} in the store")
    return render_template(
        "stacks.html", key=str(found), process=process or {},
        gpus=sorted({row["gpu_id"] for row in rows}), stacks=section(db, rows, None),
        stacks_url=url_for("stacks.process_stacks", key=str(found), format="json"))


def gpu_links(db: Database, gpu_id: str, processes: Iterable[Mapping[str, Any]]
              ) -> dict[str, dict[str, Any]]:
    """For the GPU page, by ``pid-start_time``: each of ``processes`` (rows with ``pid``
    and ``start_time``) whose stacks were sampled on ``gpu_id``, its newest window's link,
    when it ended, whether it is final, and one line: the advice that names the line, else
    the top frames, else the sampler's error (the process's text: the page escapes it; here
    it is bounded)."""
    keys = [ProcessKey(int(p["pid"]), int(p["start_time"])) for p in processes]
    out = {}
    for key, row in newest_by_process(db, gpu_id, keys).items():
        advice = stack_advice.find(row["stacks"], row["rule_id"] or None)
        line = (advice[0].sentence if advice else row["summary"]) or (
            f"not sampled: {row['error']}" if row["error"] else "no samples")
        if len(line) > MAX_SUMMARY_CHARS:
            line = line[:MAX_SUMMARY_CHARS - 1] + "…"
        out[str(key)] = {"url": url_for("stacks.process_page", key=str(key)),
                         "summary": line, "ts": row["ts"], "final": row["final"],
                         "samples": row["samples"]}
    return out
