"""Pages about processes: the list of processes holding GPU devices, as HTML and JSON."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, render_template
from flask.typing import ResponseReturnValue

from gpuwhy.store.queries import processes_holding_devices
from gpuwhy.webui.db import get_db

bp = Blueprint("processes", __name__)


@bp.get("/")
def index() -> ResponseReturnValue:
    return render_template("processes.html", processes=processes_holding_devices(get_db()),
                           refresh_seconds=current_app.config["REFRESH_SECONDS"])


@bp.get("/api/processes")
def api_processes() -> ResponseReturnValue:
    return jsonify(processes_holding_devices(get_db()))
