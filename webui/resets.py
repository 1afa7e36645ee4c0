"""``/resets``: every GPU reset, per GPU, with what asked for it and which processes were hit
(``gpuwhy.store.queries.reset_history``, the same as ``gpuwhy resets``)."""

from __future__ import annotations

from itertools import groupby

from flask import Blueprint, jsonify, render_template
from flask.typing import ResponseReturnValue

from gpuwhy.store.queries import reset_history
from gpuwhy.webui.db import get_db

bp = Blueprint("resets", __name__)

CAUSES = (("cron", "cron job"), ("timer", "timer"), ("operator", "operator command"),
          ("command", "command"), ("driver", "driver"))


def cause_of(reset: dict) -> str:
    """The reset's cause in words, from the first chain step that says who asked."""
    for step in reset["by"]:
        for prefix, words in CAUSES:
            if step.startswith(prefix):
                return words
    return "driver recovery" if not reset["by"] else "unknown"


def _history() -> list[dict]:
    return [{**r, "cause": cause_of(r)} for r in reset_history(get_db())]


@bp.get("/resets")
def index() -> ResponseReturnValue:
    history = sorted(_history(), key=lambda r: (r["gpu"] or "", -(r["at"] or 0)))
    per_gpu = [(gpu, list(resets)) for gpu, resets in groupby(history, key=lambda r: r["gpu"])]
    return render_template("resets.html", per_gpu=per_gpu)


@bp.get("/api/resets")
def api_index() -> ResponseReturnValue:
    return jsonify(_history())
