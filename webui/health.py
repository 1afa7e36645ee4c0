"""``/healthz``: is the store readable, and what every source last said, judged for stalls
(gpuwhy.stalls: ``state`` as `gpuwhy status` shows it, ``reported_state`` as said)."""

from __future__ import annotations

import sqlite3

from flask import Blueprint, current_app, jsonify
from flask.typing import ResponseReturnValue

from gpuwhy.clock import now_ns
from gpuwhy.errors import StoreError
from gpuwhy.stalls import STALLED, judge
from gpuwhy.store.queries import source_health
from gpuwhy.webui.db import get_db

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    try:
        sources = judge(source_health(get_db()), now_ns(), current_app.config.get("GPUWHY"))
    except (StoreError, sqlite3.Error) as exc:
        return jsonify(status="error", error=str(exc)), 503
    # status "ok" is the web view's own answer (it serves): a stalled source is listed
    return jsonify(status="ok", sources=sources,
                   stalled=[s["source"] for s in sources if s["state"] == STALLED])
