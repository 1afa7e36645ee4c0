"""``/vendor/…``: the browser libraries installed by npm (scripts/setup.sh), served from
``node_modules`` on this host, so the pages work on a GPU host with no internet."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, abort, current_app, send_from_directory
from flask.typing import ResponseReturnValue

from gpuwhy.config import Config

bp = Blueprint("vendor", __name__)
# Only these files, by name: node_modules holds much more than the pages need.
FILES = {"echarts.min.js": "echarts/dist/echarts.min.js"}


def vendor_path(config: Config) -> Path:
    configured = config["web.vendor_path"]
    return Path(configured) if configured else Path(__file__).resolve().parent.parent / \
        "node_modules"


@bp.get("/vendor/<name>")
def asset(name: str) -> ResponseReturnValue:
    if name not in FILES:
        abort(404)
    path = Path(current_app.config["VENDOR_PATH"]) / FILES[name]
    if not path.is_file():
        abort(404, description=f"{FILES[name]} is not installed: run scripts/setup.sh "
                               "(npm ci) to fetch the chart library")
    return send_from_directory(path.parent, path.name, max_age=3600)
