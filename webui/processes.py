"""Process pages: the processes holding GPU devices (``/processes``) and one process's
timeline (``/processes/<pid>-<start_time>``), with their JSON and CSV; for an inference
engine (or a GPU process of one), its serving figures on the same time axis."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, current_app, jsonify, render_template, request, url_for
from flask.typing import ResponseReturnValue

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.config import MAX_INT
from gpuwhy.events import ENGINE_NAMES
from gpuwhy.identity import ProcessKey
from gpuwhy.store import engines, queries, series
from gpuwhy.store.stacks import python_stacks
from gpuwhy.webui.db import get_db
from gpuwhy.webui.export import csv_response
from gpuwhy.webui.window import requested_tail, requested_window, whole

bp = Blueprint("processes", __name__)


def process_key_or_404(text: str) -> ProcessKey:
    """The process key a URL names (``pid-start_time``); 404 for anything else."""
    try:
        key = ProcessKey.parse(text)
    except ValueError:
        key = None
    # a pid or start time past SQLite's integers names no process the store can hold
    if key is None or not text.isascii() or max(key.pid, key.start_time) > MAX_INT:
        abort(404, description=f"{text[:80]!r} is not a process key (pid-start_time)")
    return key


def _process_or_404(text: str) -> tuple[ProcessKey, dict]:
    key = process_key_or_404(text)
    found = queries.process(get_db(), key)
    if found is None:
        abort(404, description=f"no process {key} in the store")
    return key, found


def _end(key: ProcessKey) -> int | None:
    """The last time anything was heard of the process; while it runs, an engine's latest
    scrape too: its API server holds no GPU and is heard from by its scrapes alone (the
    timeline and the Serving charts end there, on one axis)."""
    db = get_db()
    end = queries.process_end(db, key)
    if (queries.process(db, key) or {}).get("exited_at"):
        return end
    serving = engines.engine_of(db, key)
    return max(end or 0, serving["ts"] if serving else 0) or None


def _window(process: dict) -> series.Window:
    end = _end(ProcessKey(process["pid"], process["start_time"]))
    try:
        # read (and refused when bad) even where the whole life is shown instead
        asked = requested_window(request.args, end, current_app.config["MAX_POINTS"])
    except ValueError as exc:
        abort(400, description=str(exc))
    if not request.args.get("range") and not request.args.get("from") and end:
        # whole life by default, at most 7 days back from its end
        start = max(process["first_seen"] or end, end - series.RANGES["7d"] * NS_PER_SECOND)
        return series.window(end + NS_PER_SECOND, 0, current_app.config["MAX_POINTS"],
                             since=start)
    return asked


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


def _detail(key: ProcessKey, process: dict, events: bool = True) -> dict:
    """The process's facts, driver calls, findings and GPUs; its first events too unless
    ``events`` is false (the page reads them a page at a time: :func:`_events_page`)."""
    db = get_db()
    return {"process": process, "key": str(key), "calls": queries.process_calls(db, key),
            "last_heard": _end(key),
            **({"events": queries.process_events(db, key)} if events else {}),
            "findings": queries.findings(db, key=key),
            "gpus": queries.process_gpus(db, key)}


EVENTS_PER_PAGE = 50


def _events_page(key: ProcessKey) -> dict:
    """The page of the process's events the URL asks for, newest first: ``?page=N`` (from
    1), else the page holding the moment ``?at=`` (a chain's link opens at its step), else
    the newest. ``rows``, ``first``/``last`` (1-based, of ``total``), and the URLs of the
    ``newer`` and ``older`` pages (None at either end)."""
    db = get_db()
    total = queries.process_event_count(db, key)
    pages = max(1, -(-total // EVENTS_PER_PAGE))
    try:
        page = whole(request.args, "page", 1)
        at = whole(request.args, "at", what="a time in ns since the epoch")
    except ValueError as exc:
        abort(400, description=str(exc))
    if page is not None:
        number = min(page, pages)
    elif at is not None:
        later = queries.process_event_count(db, key, after=at)
        number = min(later // EVENTS_PER_PAGE + 1, pages)
    else:
        number = 1
    offset = (number - 1) * EVENTS_PER_PAGE
    rows = queries.process_events(db, key, EVENTS_PER_PAGE, offset, newest_first=True)

    def url(n: int) -> str:
        # the rest of the URL (range, zoom) kept: paging leaves the charts' view alone
        args: dict[str, Any] = {**request.args.to_dict(), "page": n}
        return url_for("processes.show", **{**args, "key": str(key)}) + "#events"

    return {"rows": rows, "total": total, "first": offset + 1 if rows else 0,
            "last": offset + len(rows), "page": number, "pages": pages,
            "newer": url(number - 1) if number > 1 else None,
            "older": url(number + 1) if number < pages else None}


def _serving(key: ProcessKey) -> dict | None:
    """The engine the process is or serves, as the page names it; None for neither."""
    found = engines.engine_of(get_db(), key)
    if found is None:
        return None
    return {**found, "key": str(ProcessKey(found["pid"], found["start_time"])),
            "name": ENGINE_NAMES.get(found["engine"], found["engine"]),
            "own": (found["pid"], found["start_time"]) == (key.pid, key.start_time)}


@bp.get("/processes/<key>")
def show(key: str) -> ResponseReturnValue:
    process_key, process = _process_or_404(key)
    return render_template("process.html", **_detail(process_key, process, events=False),
                           events_page=_events_page(process_key),
                           serving=_serving(process_key),
                           sampled=bool(python_stacks(get_db(), process=process_key, limit=1)),
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
        tail = requested_tail(request.args, _end(process_key))
    except ValueError as exc:
        abort(400, description=str(exc))
    w, after = tail if tail else (_window(process), None)
    return jsonify({"key": str(process_key), "from": w.since, "to": w.until,
                    **series.process_series(get_db(), process_key, w, after)})


@bp.get("/api/processes/<key>/engine")
def api_engine(key: str) -> ResponseReturnValue:
    """The serving figures of the engine the process is or serves, bucketed on the same
    window (and tail) as :func:`api_series` answers for the same query, so that both charts
    share one time axis, and (``gpus``) its GPUs' SM activity on the same buckets; ``engine``
    null (and no rows) for a process that serves none."""
    process_key, process = _process_or_404(key)
    try:
        tail = requested_tail(request.args, _end(process_key))
    except ValueError as exc:
        abort(400, description=str(exc))
    w, after = tail if tail else (_window(process), None)
    db = get_db()
    found = engines.engine_of(db, process_key)
    data = engines.engine_series(db, ProcessKey(found["pid"], found["start_time"]), w,
                                 after) if found else \
        {"fields": list(engines.SERIES_FIELDS), "rows": [], "bucket_s": w.bucket_ns /
         NS_PER_SECOND, "bucket_ns": w.bucket_ns, "sample_period_s": None}
    return jsonify({"key": str(process_key), "from": w.since, "to": w.until,
                    "engine": found, **data,
                    "gpus": engines.gpus_activity(db, found["gpu_ids"] if found else [], w,
                                                  after)})


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
