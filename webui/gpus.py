"""GPU pages: the overview (``/``, one card per GPU) and a GPU's detail with its charts,
their JSON (``/api/gpus…``) and CSV, and a link to each bound process's sampled stacks."""

from __future__ import annotations

from flask import Blueprint, abort, current_app, jsonify, render_template, request
from flask.typing import ResponseReturnValue

from gpuwhy.gpufields import THROTTLE_BITS
from gpuwhy.store import queries, series
from gpuwhy.webui import answers
from gpuwhy.webui.db import get_db
from gpuwhy.webui.export import csv_response
from gpuwhy.webui.stacks import gpu_links
from gpuwhy.webui.window import requested_tail, requested_window

bp = Blueprint("gpus", __name__)
HEATMAP_COLUMNS = 730        # the host heatmap's cells a GPU: a minute up to 6 h, 2 for 24 h


def _gpu_or_404(gpu_id: str) -> dict:
    found = queries.gpu(get_db(), gpu_id)
    if found is None:
        abort(404, description=f"no GPU {gpu_id!r} in the store")
    return found


def latest_ts(gpu: dict) -> int | None:
    """The GPU's latest moment the store knows: its last sample, or when it was last heard
    of or changed health. A GPU known only from the kernel log has no sample: its charts
    end at its Xid, not at the epoch (a 1970 axis that showed none of its marks)."""
    known = (series.last_sample_ts(get_db(), gpu["id"]), gpu.get("last_seen"),
             gpu.get("health_since"))
    return max((ts for ts in known if isinstance(ts, int)), default=None)


def _window(gpu: dict) -> series.Window:
    try:
        return requested_window(request.args, latest_ts(gpu), current_app.config["MAX_POINTS"])
    except ValueError as exc:
        abort(400, description=str(exc))


def _cards() -> list[dict]:
    """The overview's GPUs in the answer's order (worst first), each with its answer
    (``verdict``, None for a GPU the answer does not name) and its sample's ``freshness``."""
    cards = queries.overview(get_db())
    found = answers.verdicts()
    place = {v.gpu.gpu_id: n for n, v in enumerate(found)}
    by_id = {v.gpu.gpu_id: v for v in found}
    cards.sort(key=lambda g: place.get(g["id"], len(found)))
    for g in cards:
        g["verdict"] = by_id.get(g["id"])
        g["freshness"] = answers.sample_age(g["sample"])
    return cards


@bp.get("/")
def overview() -> ResponseReturnValue:
    return render_template("overview.html", gpus=_cards(), level=answers.level,
                           said=answers.said,
                           ranges=[r for r in series.RANGES if series.RANGES[r] >= 3600],
                           ranges_seconds=series.RANGES,
                           refresh_seconds=current_app.config["REFRESH_SECONDS"])


@bp.get("/api/gpus")
def api_overview() -> ResponseReturnValue:
    """The cards' data in the store's order; each with its sample's ``freshness`` and its
    ``answer`` (severity word, sentence, ``rank``: its place on the overview, worst first)."""
    found = answers.verdicts()
    told = {v.gpu.gpu_id: {"severity": answers.level(v), "sentence": answers.said(v),
                           "rank": n} for n, v in enumerate(found)}
    unknown = {"severity": answers.HEALTHY, "sentence": "healthy", "rank": len(found)}
    return jsonify([{**g, "freshness": answers.sample_age(g["sample"]),
                     "answer": told.get(g["id"], unknown)}
                    for g in queries.overview(get_db())])


@bp.get("/api/heatmap")
def api_heatmap() -> ResponseReturnValue:
    """Every GPU × time on one grid of whole minutes (the overview's heatmap), and each
    GPU's incidents and resets in it: ``range``/``from``/``to``/``at`` as a GPU's series;
    with ``after``/``grid``/``bucket``, what a live heatmap drawn on that grid lacks."""
    db = get_db()
    gpus = queries.gpus(db)
    latest = max((ts for ts in map(latest_ts, gpus) if ts is not None), default=None)
    try:
        tail = requested_tail(request.args, latest)
        w, after = tail if tail else (series.minute_grid(
            requested_window(request.args, latest, HEATMAP_COLUMNS), HEATMAP_COLUMNS), None)
    except ValueError as exc:
        abort(400, description=str(exc))
    if w.bucket_ns % series.MINUTE_NS:
        abort(400, description="bucket is a whole number of minutes (in ns)")
    heat = series.host_heatmap(db, [g["id"] for g in gpus], w, after)
    heat["gpus"] = [{"id": g["id"], "index": g["gpu_index"], "health": g["health"],
                     "model": g["model"], "simulated": bool(g["simulated"]),
                     **queries.gpu_marks(db, g["id"], w.since, w.until)} for g in gpus]
    return jsonify({"from": w.since, "to": w.until, "held_since": series.held_since(db), **heat})


@bp.get("/gpus/<gpu_id>")
def show(gpu_id: str) -> ResponseReturnValue:
    """A GPU's page: its answer, health, charts, the processes bound to it now (each with a
    link to its sampled Python stacks, when there are some) and its open incidents."""
    gpu = _gpu_or_404(gpu_id)
    sample = queries.latest_sample(get_db(), gpu["id"])
    verdict = next((v for v in answers.verdicts() if v.gpu.gpu_id == gpu["id"]), None)
    processes = queries.bound_processes(get_db(), gpu["id"])
    return render_template("gpu.html", gpu=gpu, ranges=list(series.RANGES),
                           verdict=verdict, level=answers.level(verdict),
                           said=answers.said(verdict) if verdict is not None else "healthy",
                           others=answers.others(verdict) if verdict is not None else [],
                           freshness=answers.sample_age(sample),
                           ranges_seconds=series.RANGES,
                           refresh_seconds=current_app.config["REFRESH_SECONDS"],
                           processes=processes,
                           stacks=gpu_links(get_db(), gpu["id"], processes),
                           incidents=queries.open_incidents(get_db(), gpu["id"]),
                           sample=sample,
                           health_history=queries.gpu_health_history(get_db(), gpu["id"]))


@bp.get("/api/gpus/<gpu_id>/series")
def api_series(gpu_id: str) -> ResponseReturnValue:
    """The GPU's chart series for a window; with ``after``/``grid``/``bucket`` only what a
    live chart drawn on that grid lacks (its last bucket again, and the newer ones).
    ``sample_period_s``: the GPU's sample period (median spacing; None when unknown), what
    the charts judge a gap against (no sample for ~3 periods, or a bucket when coarser)."""
    gpu = _gpu_or_404(gpu_id)
    try:
        tail = requested_tail(request.args, latest_ts(gpu))
    except ValueError as exc:
        abort(400, description=str(exc))
    w, after = tail if tail else (_window(gpu), None)
    held = {} if tail else {"held_since": series.held_since(get_db(), gpu["id"])}
    return jsonify({"gpu": gpu["id"], "from": w.since, "to": w.until,
                    "throttle_bits": THROTTLE_BITS, **held,
                    "sample_period_s": series.sample_period_s(get_db(), gpu["id"], w.until),
                    **series.gpu_series(get_db(), gpu["id"], w, after)})


@bp.get("/api/gpus/<gpu_id>/events")
def api_events(gpu_id: str) -> ResponseReturnValue:
    gpu = _gpu_or_404(gpu_id)
    w = _window(gpu)
    return jsonify({"gpu": gpu["id"], "from": w.since, "to": w.until,
                    **queries.gpu_events(get_db(), gpu["id"], w.since, w.until)})


@bp.get("/api/gpus/<gpu_id>")
def api_show(gpu_id: str) -> ResponseReturnValue:
    gpu = _gpu_or_404(gpu_id)
    return jsonify({**gpu, "sample": queries.latest_sample(get_db(), gpu["id"]),
                    "processes": queries.bound_processes(get_db(), gpu["id"]),
                    "incidents": queries.open_incidents(get_db(), gpu["id"]),
                    "health_history": queries.gpu_health_history(get_db(), gpu["id"])})


@bp.get("/gpus/<gpu_id>/series.csv")
def series_csv(gpu_id: str) -> ResponseReturnValue:
    gpu = _gpu_or_404(gpu_id)
    data = series.gpu_series(get_db(), gpu["id"], _window(gpu))
    return csv_response(["ts_ns", *data["fields"]], data["rows"], f"{gpu['id']}-series.csv")


@bp.get("/gpus/<gpu_id>/lanes.csv")
def lanes_csv(gpu_id: str) -> ResponseReturnValue:
    gpu = _gpu_or_404(gpu_id)
    w = _window(gpu)
    lanes = queries.bound_processes(get_db(), gpu["id"], w.since, w.until)
    columns = ["pid", "start_time", "comm", "tag", "container", "since", "until"]
    return csv_response(columns, ([lane[c] for c in columns] for lane in lanes),
                        f"{gpu['id']}-processes.csv")


@bp.get("/gpus/<gpu_id>/events.csv")
def events_csv(gpu_id: str) -> ResponseReturnValue:
    gpu = _gpu_or_404(gpu_id)
    w = _window(gpu)
    found = queries.gpu_events(get_db(), gpu["id"], w.since, w.until)
    rows = [["incident", i["opened_at"], i["kind"], i["title"]] for i in found["incidents"]]
    rows += [["reset", r["ts"], r["what"], r["detail"]] for r in found["resets"]]
    return csv_response(["type", "ts_ns", "what", "detail"], sorted(rows, key=lambda r: r[1]),
                        f"{gpu['id']}-events.csv")
