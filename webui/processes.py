"""Process pages: the processes holding GPU devices (``/processes``) and one process's
timeline (``/processes/<pid>-<start_time>``), with their JSON and CSV."""

from __future__ import annotations

from flask import Blueprint, abort, current_app, jsonify, render_template, request
from flask.typing import ResponseReturnValue

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.identity import ProcessKey
from gpuwhy.store import queries, series
from gpuwhy.webui.db import get_db
from gpuwhy.webui.export import csv_response
from gpuwhy.webui.window import requested_tail, requested_window

bp = Blueprint("processes", __name__)


def _key(text: str) -> ProcessKey:
    try:
        return ProcessKey.parse(text)
    except ValueError:
        abort(404, description=f"{text!r} is not a process key (pid-start_time)")


def _process_or_404(text: str) -> tuple[ProcessKey, dict]:
    key = _key(text)
    found = queries.process(get_db(), key)
    if found is None:
        abort(404, description=f"no process {key} in the store")
    return key, found


def _window(process: dict) -> series.Window:
    end = queries.process_end(get_db(), ProcessKey(process["pid"], process["start_time"]))
    if not request.args.get("range") and not request.args.get("from") and end:
        # whole life by default, at most 7 days back from its end
        start = max(process["first_seen"] or end, end - series.RANGES["7d"] * NS_PER_SECOND)
        return series.window(end + NS_PER_SECOND, 0, current_app.config["MAX_POINTS"],
                             since=start)
    try:
        return requested_window(request.args, end, current_app.config["MAX_POINTS"])
    except ValueError as exc:
        abort(400, description=str(exc))


def _listed() -> tuple[list[dict], str, str]:
    """The living processes as the URL asks: ``?sort=`` one of PROCESS_SORTS, ``?q=`` words."""
    sort = request.args.get("sort", "ioctls")
    search = request.args.get("q", "")[:200]
    try:
        listed = queries.sorted_processes(queries.processes_holding_devices(get_db()),
                                          sort, search)
    except ValueError as exc:
        abort(400, description=str(exc))
    return listed, sort, search


@bp.get("/processes")
def index() -> ResponseReturnValue:
    listed, sort, search = _listed()
    return render_template("processes.html", processes=listed, sort=sort, search=search,
                           sorts=queries.PROCESS_SORTS,
                           refresh_seconds=current_app.config["REFRESH_SECONDS"])


@bp.get("/api/processes")
def api_processes() -> ResponseReturnValue:
    return jsonify(_listed()[0])


def _detail(key: ProcessKey, process: dict) -> dict:
    db = get_db()
    return {"process": process, "key": str(key), "calls": queries.process_calls(db, key),
            "last_heard": queries.process_end(db, key),
            "events": queries.process_events(db, key),
            "findings": queries.findings(db, key=key),
            "gpus": queries.process_gpus(db, key)}


@bp.get("/processes/<key>")
def show(key: str) -> ResponseReturnValue:
    process_key, process = _process_or_404(key)
    return render_template("process.html", **_detail(process_key, process),
                           ranges=list(series.RANGES), ranges_seconds=series.RANGES,
                           refresh_seconds=current_app.config["REFRESH_SECONDS"])


@bp.get("/api/processes/<key>")
def api_show(key: str) -> ResponseReturnValue:
    return jsonify(_detail(*_process_or_404(key)))


@bp.get("/api/processes/<key>/series")
def api_series(key: str) -> ResponseReturnValue:
    """The process's timeline for a window; with ``after``/``grid``/``bucket`` only what a
    live chart drawn on that grid lacks."""
    process_key, process = _process_or_404(key)
    try:
        tail = requested_tail(request.args, queries.process_end(get_db(), process_key))
    except ValueError as exc:
        abort(400, description=str(exc))
    w, after = tail if tail else (_window(process), None)
    return jsonify({"key": str(process_key), "from": w.since, "to": w.until,
                    **series.process_series(get_db(), process_key, w, after)})


@bp.get("/processes/<key>/series.csv")
def series_csv(key: str) -> ResponseReturnValue:
    process_key, process = _process_or_404(key)
    data = series.process_series(get_db(), process_key, _window(process))
    return csv_response(["ts_ns", *data["fields"]], data["rows"], f"{process_key}-timeline.csv")


@bp.get("/processes/<key>/calls.csv")
def calls_csv(key: str) -> ResponseReturnValue:
    process_key, _ = _process_or_404(key)
    columns = ["operation", "op", "device", "count", "errors", "per_second", "mean_latency_us",
               "max_latency_us"]
    calls = queries.process_calls(get_db(), process_key)
    return csv_response(columns, ([c[column] for column in columns] for c in calls),
                        f"{process_key}-driver-calls.csv")
