"""Incident pages: the list with filters, one incident's root-cause chain as steps with their
evidence and recommended actions, its state and log, a printable report, and their JSON.
Incidents are read by ``gpuwhy.store.queries``, the same code as ``gpuwhy incidents``/
``gpuwhy incident``; acknowledging, resolving and noting one needs the token and goes through
``gpuwhy.store.incident_changes``, as ``gpuwhy incident ID ack|resolve|note`` does, and each change
is written to the journal."""

from __future__ import annotations

import json
import logging
import sqlite3
from typing import cast

from flask import (
    Blueprint,
    abort,
    current_app,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)
from flask.typing import ResponseReturnValue

from gpuwhy import lifecycle as lc
from gpuwhy import severity as sev
from gpuwhy.clock import now_ns
from gpuwhy.config import MAX_INT
from gpuwhy.errors import GpuwhyError
from gpuwhy.store import feed, open_store
from gpuwhy.store import incident_changes as store_lifecycle
from gpuwhy.store.queries import incident_detail, incident_kinds, list_incidents
from gpuwhy.text import parse_ts
from gpuwhy.webui.auth import require_token
from gpuwhy.webui.db import get_db
from gpuwhy.webui.window import whole

bp = Blueprint("incidents", __name__)
# incident ids are SQLite integers: a longer number in a URL is no incident (404), not a 500
ID = f"<int(max={MAX_INT}):incident_id>"
log = logging.getLogger(__name__)
STATES = (lc.OPEN, lc.ACKNOWLEDGED, lc.RESOLVED, "active")   # the list's state filter
CHANGES = lc.OPERATOR_CHANGES

# What to do next, by incident kind, where the incident itself names no action.
ADVICE = {
    "gpu_reset": ["Find what asked for the reset (the first steps of the chain) and stop it "
                  "from running while jobs use the GPU: reschedule the cron job or timer, or "
                  "drain the GPU first.",
                  "Restart the jobs that were hit from their last checkpoint."],
    "gpu_lost": ["Drain the node; the GPU needs a reset or a reboot, and a repeat needs a "
                 "hardware check (PCIe seating, power, thermals)."],
    "process_stall": ["Look at the process timeline: blocked or waiting workers point at the "
                      "input pipeline, a busy CPU at host-side work."],
    "process_exit": ["Restart the job from its last checkpoint once the GPU is healthy."],
}


WITHIN = ("1h", "6h", "24h", "7d")       # the list's "seen within" choices


def _filters() -> dict:
    return {name: request.args.get(name) or None
            for name in ("kind", "gpu", "severity", "state", "q", "within", "from", "to")}


def _period(filters: dict) -> tuple[int | None, int | None]:
    """[since, until) ns of the list's time filter: ``within`` (a recent period) or
    ``from``/``to`` (30m, 2h, 1d ago, ns, or ISO 8601, UTC when it names no zone); a 400
    that says why for anything else."""
    now = now_ns()
    try:
        if filters["within"]:
            if filters["within"] not in WITHIN:
                raise ValueError(f"within is one of {', '.join(WITHIN)}")
            return parse_ts(filters["within"], now), None
        since, until = (_moment(name, filters[name], now) for name in ("from", "to"))
    except ValueError as exc:
        abort(400, description=str(exc))
    if since is not None and until is not None and since >= until:
        abort(400, description="from must be before to")
    return since, until


def _moment(name: str, text: str | None, now: int) -> int | None:
    """``text`` (parse_ts) as ns that the store can compare: "99999999999d" or a 19-digit
    number past 2^63 - 1 would fail in SQLite, so they are refused as bad input."""
    if not text:
        return None
    try:
        ts = parse_ts(text, now, naive_utc=True)
    except OverflowError:           # "1e400"-sized durations: float('inf') as a number
        ts = None
    if ts is None or not -MAX_INT <= ts <= MAX_INT:
        raise ValueError(f"{name} is out of range: {text[:40]!r}")
    return ts


def filtered_incidents(filters: dict) -> list[dict]:
    state = filters["state"]
    if state == "closed":            # an old link: incidents were "closed", now resolved
        state = lc.RESOLVED
    since, until = _period(filters)
    found = list_incidents(get_db(), gpu=filters["gpu"], kind=filters["kind"],
                           state=state, since=since, until=until, limit=1000)
    if filters["severity"]:
        # An old link may name a legacy severity (warn, high): it means the scale's name.
        wanted = filters["severity"]
        wanted = sev.normalise(wanted) if sev.is_severity(wanted) else wanted
        found = [i for i in found if i["severity"] == wanted]
    if filters["q"]:
        needle = filters["q"].lower()
        found = [i for i in found
                 if needle in f"{i['title']} {i['summary']}".lower()]
    return found


GROUP_WITHIN_NS = 3600 * 1_000_000_000    # like incidents opened within an hour: one row


def grouped(incidents: list[dict]) -> list[dict]:
    """The list with like incidents on several GPUs of this host as one row: the same kind,
    title, severity and state, opened within an hour of the group's first, on more than one
    GPU. Each row: ``lead`` (the newest), ``members`` (all, in list order), ``gpus`` (their
    distinct GPU ids); a lone incident is a row of one. The list's order is kept: a group
    stands where its newest member stood."""
    rows: list[dict] = []
    open_groups: dict[tuple, dict] = {}
    for incident in incidents:
        key = (incident.get("kind"), incident.get("title"), incident.get("severity"),
               incident.get("state"))
        row = open_groups.get(key)
        opened = incident.get("opened_at") or 0
        if row is not None and abs((row["lead"].get("opened_at") or 0) - opened) \
                <= GROUP_WITHIN_NS:
            row["members"].append(incident)
            continue
        row = {"lead": incident, "members": [incident]}
        open_groups[key] = row
        rows.append(row)
    out: list[dict] = []
    for row in rows:
        gpus = list(dict.fromkeys(m.get("gpu_id") for m in row["members"] if m.get("gpu_id")))
        if len(row["members"]) > 1 and len(gpus) < 2:
            # the same GPU's repeats are separate incidents (their own counts say so)
            out.extend({"lead": m, "members": [m], "gpus": gpus[:1]} for m in row["members"])
        else:
            out.append({**row, "gpus": gpus})
    return out


def recommended_actions(incident: dict) -> list[str]:
    details = incident.get("details") or {}
    actions = [str(f) for f in details.get("fixes") or []]
    if details.get("action"):
        actions.append(str(details["action"]))
    return actions or ADVICE.get(incident["kind"], [])


def _step_time(link: dict) -> tuple[bool, int]:
    """A chain step's place in time order: dated steps by their time, undated ones last."""
    ts = link.get("ts")
    if isinstance(ts, int) and not isinstance(ts, bool):
        return (False, ts)
    return (True, 0)


def _incident_or_404(incident_id: int) -> dict:
    detail = incident_detail(get_db(), incident_id)
    if detail is None:
        abort(404, description=f"no incident {incident_id}")
    # the chain in time order (stored in the order the correlator found its steps: a cause
    # found after its effect came out dated before it); steps of one moment keep theirs
    chain = sorted(detail.get("chain") or [], key=_step_time)
    return {**detail, "chain": chain, "actions": recommended_actions(detail)}


def _trigger(incident: dict) -> dict | None:
    """The chart of what raised the incident (webui/trigger.py); the rules as the service
    loads them, none when they cannot be read (the chart then shows the GPU's usual)."""
    from gpuwhy.store.queries import gpu as stored_gpu
    from gpuwhy.webui.rules import all_rules
    from gpuwhy.webui.trigger import trigger_chart

    if not incident.get("gpu") or stored_gpu(get_db(), incident["gpu"]) is None:
        return None               # no GPU page to read its series from
    try:
        rules = all_rules()
    except (GpuwhyError, OSError) as exc:
        log.warning("incident chart without the rules: %s", exc)
        rules = []
    return trigger_chart(incident, rules)


def _with_stacks(incident: dict) -> tuple[dict, dict | None]:
    """The incident with the advice its sampled stacks give appended to its actions, and
    the stacks section (webui/stacks.py; None when nothing was sampled)."""
    from gpuwhy.webui.stacks import incident_section

    stacks = incident_section(get_db(), incident)
    if stacks:
        incident = {**incident, "actions": [*incident["actions"],
                                             *(a["sentence"] for a in stacks["advice"])]}
    return incident, stacks


@bp.get("/incidents")
def index() -> ResponseReturnValue:
    filters = _filters()
    kinds = incident_kinds(get_db())
    # read before the rows: a change in between shows as a newer cursor, never as none
    cursor = feed.latest_cursor(get_db())
    return render_template("incidents.html", rows=grouped(filtered_incidents(filters)),
                           cursor=cursor,
                           filters=filters, kinds=kinds, severities=sev.DESCENDING,
                           states=STATES, within=WITHIN,
                           refresh_seconds=current_app.config["REFRESH_SECONDS"])


@bp.get(f"/incidents/{ID}")
def show(incident_id: int) -> ResponseReturnValue:
    changed = request.args.get("changed")
    incident, stacks = _with_stacks(_incident_or_404(incident_id))
    return render_template("incident.html", incident=incident, stacks=stacks,
                           trigger=_trigger(incident),
                           stacks_url=url_for("stacks.incident_stacks", incident_id=incident_id,
                                              format="json"),
                           auth=bool(current_app.config["AUTH_TOKEN"]),
                           changed=changed if changed in CHANGES else None,
                           unwritten=request.args.get("journal") == "unwritten",
                           actor_max=lc.ACTOR_MAX, note_max=lc.NOTE_MAX)


@bp.get(f"/incidents/{ID}/report")
def report(incident_id: int) -> ResponseReturnValue:
    from gpuwhy.webui.reports.flame import flame_svg

    incident, stacks = _with_stacks(_incident_or_404(incident_id))
    return render_template("incident_report.html", incident=incident, stacks=stacks,
                           stacks_svg=flame_svg(stacks["flame"]) if stacks else None)


@bp.get("/api/incidents")
def api_index() -> ResponseReturnValue:
    if "since" in request.args:
        return _feed()
    return jsonify(filtered_incidents(_filters()))


def _count(name: str, default: int, low: int, high: int) -> int:
    """A whole-number query argument in [low, high]; ValueError for anything else."""
    found = whole(request.args, name, low, high)
    return default if found is None else found


def _feed() -> ResponseReturnValue:
    """The incident feed after a cursor (gpuwhy.store.feed): JSON ``{changes, next, more,
    latest}``, or JSON lines (``format=jsonl`` or ``Accept: application/x-ndjson``), one
    change a line with the next cursor in the ``Gpuwhy-Next-Cursor`` header."""
    try:
        since = _count("since", 0, 0, MAX_INT)
        limit = _count("limit", feed.FEED_MAX, 1, feed.FEED_MAX)
    except ValueError as exc:
        return jsonify(error=str(exc)), 400
    wanted = request.args.get("format", "")
    if wanted not in ("", "json", "jsonl"):
        return jsonify(error="format is json or jsonl"), 400
    latest, changes, more = feed.feed_page(get_db(), since, limit)
    following = changes[-1]["cursor"] if changes else since
    headers = {"Gpuwhy-Next-Cursor": str(following), "Gpuwhy-Latest-Cursor": str(latest),
               "Gpuwhy-More": "true" if more else "false", "Cache-Control": "no-store"}
    accept = request.accept_mimetypes
    lines = wanted == "jsonl" or (not wanted and accept.best_match(
        ["application/json", "application/x-ndjson"]) == "application/x-ndjson")
    if lines:
        body = "".join(json.dumps(change, separators=(",", ":")) + "\n" for change in changes)
        return current_app.response_class(body, mimetype="application/x-ndjson",
                                          headers=headers)
    response = jsonify(changes=changes, next=following, more=more, latest=latest)
    response.headers.update(headers)
    return response


@bp.get(f"/api/incidents/{ID}")
def api_show(incident_id: int) -> ResponseReturnValue:
    return jsonify(_incident_or_404(incident_id))


# --- changes: acknowledge, resolve, note ----------------------------------------------------

def _actor(given: object) -> str:
    """The name a change is made by: the one given, else the client's address."""
    name = str(given).strip() if given is not None else ""
    return name or f"web {request.remote_addr or '?'}"


def _change(incident_id: int, change: str, actor: str, text: str | None) -> dict:
    """One change through gpuwhy.store.incident_changes on a writable connection of its own, then
    its journal entry. Raises IncidentNotFound / LifecycleError / StoreError."""
    db = open_store(current_app.config["DATABASE"])
    try:
        done = store_lifecycle.apply_change(db, incident_id, change, actor, text)
        try:
            unsent = store_lifecycle.send_change(
                db, cast(int, done["log_id"]), current_app.config["GPUWHY"]["correlator.url"])
        except Exception as exc:      # the change stands, whatever the journal does
            unsent = f"{type(exc).__name__}: {exc}"
        if unsent is not None:
            log.warning("incident %d %s: journal entry not written: %s", incident_id,
                        done["action"], unsent)
    finally:
        db.close()
    return {**done, "journal": unsent}


def _store_failed(exc: Exception) -> str:
    return (f"cannot change the incident in the store {current_app.config['DATABASE']}: "
            f"{exc}" if isinstance(exc, sqlite3.Error) else str(exc))


@bp.post(f"/incidents/{ID}/<any(ack, resolve, note):change>")
@require_token
def change_form(incident_id: int, change: str) -> ResponseReturnValue:
    form = request.form
    try:
        done = _change(incident_id, change, _actor(form.get("by")), form.get("text") or None)
    except store_lifecycle.IncidentNotFound as exc:
        abort(404, description=str(exc))
    except store_lifecycle.LifecycleError as exc:
        return render_template("refused.html", message=str(exc)), 400
    except (GpuwhyError, sqlite3.Error) as exc:     # the store cannot be opened or written
        return render_template("refused.html", message=_store_failed(exc)), 500
    anchor = url_for("incidents.show", incident_id=incident_id, changed=change,
                     journal="unwritten") if done["journal"] is not None else \
        url_for("incidents.show", incident_id=incident_id, changed=change)
    return redirect(anchor + "#log", 303)


@bp.post(f"/api/incidents/{ID}/<any(ack, resolve, note):change>")
@require_token
def api_change(incident_id: int, change: str) -> ResponseReturnValue:
    body = request.get_json(silent=True)
    if body is None:
        body = {}
    if not isinstance(body, dict):
        return jsonify(error='send a JSON object: {"by": NAME, "text": TEXT}'), 400
    text = body.get("text")
    if text is not None and not isinstance(text, str):
        return jsonify(error="text is a string"), 400
    try:
        done = _change(incident_id, change, _actor(body.get("by")), text)
    except store_lifecycle.IncidentNotFound as exc:
        return jsonify(error=str(exc)), 404
    except store_lifecycle.LifecycleError as exc:
        return jsonify(error=str(exc)), 400
    except (GpuwhyError, sqlite3.Error) as exc:
        return jsonify(error=_store_failed(exc)), 500
    return jsonify(done)
