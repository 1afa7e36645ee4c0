"""Incident pages: the list with filters, one incident's root-cause chain as steps with their
evidence and recommended actions, a printable report, and their JSON. Incidents are read by
``gpuwhy.store.queries``, the same code as ``gpuwhy incidents``/``gpuwhy incident``."""

from __future__ import annotations

from flask import Blueprint, abort, jsonify, render_template, request
from flask.typing import ResponseReturnValue

from gpuwhy import severity as sev
from gpuwhy.store.queries import incident_detail, incident_kinds, list_incidents
from gpuwhy.webui.db import get_db

bp = Blueprint("incidents", __name__)

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


def _filters() -> dict:
    return {name: request.args.get(name) or None
            for name in ("kind", "gpu", "severity", "state", "q")}


def filtered_incidents(filters: dict) -> list[dict]:
    found = list_incidents(get_db(), gpu=filters["gpu"], kind=filters["kind"], limit=1000)
    if filters["severity"]:
        # An old link may name a legacy severity (warn, high): it means the scale's name.
        wanted = filters["severity"]
        wanted = sev.normalise(wanted) if sev.is_severity(wanted) else wanted
        found = [i for i in found if i["severity"] == wanted]
    if filters["state"]:
        found = [i for i in found if i["state"] == filters["state"]]
    if filters["q"]:
        needle = filters["q"].lower()
        found = [i for i in found
                 if needle in f"{i['title']} {i['summary']}".lower()]
    return found


def recommended_actions(incident: dict) -> list[str]:
    details = incident.get("details") or {}
    actions = [str(f) for f in details.get("fixes") or []]
    if details.get("action"):
        actions.append(str(details["action"]))
    return actions or ADVICE.get(incident["kind"], [])


def _incident_or_404(incident_id: int) -> dict:
    detail = incident_detail(get_db(), incident_id)
    if detail is None:
        abort(404, description=f"no incident {incident_id}")
    return {**detail, "actions": recommended_actions(detail)}


@bp.get("/incidents")
def index() -> ResponseReturnValue:
    filters = _filters()
    kinds = incident_kinds(get_db())
    return render_template("incidents.html", incidents=filtered_incidents(filters),
                           filters=filters, kinds=kinds, severities=sev.DESCENDING)


@bp.get("/incidents/<int:incident_id>")
def show(incident_id: int) -> ResponseReturnValue:
    return render_template("incident.html", incident=_incident_or_404(incident_id))


@bp.get("/incidents/<int:incident_id>/report")
def report(incident_id: int) -> ResponseReturnValue:
    return render_template("incident_report.html", incident=_incident_or_404(incident_id))


@bp.get("/api/incidents")
def api_index() -> ResponseReturnValue:
    return jsonify(filtered_incidents(_filters()))


@bp.get("/api/incidents/<int:incident_id>")
def api_show(incident_id: int) -> ResponseReturnValue:
    return jsonify(_incident_or_404(incident_id))
