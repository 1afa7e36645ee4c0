"""``/healthz``: is the store readable, and what every source last said."""

from __future__ import annotations

import sqlite3

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

from gpuwhy.errors import StoreError
from gpuwhy.store.queries import source_health
from gpuwhy.webui.db import get_db

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> ResponseReturnValue:
    try:
        sources = source_health(get_db())
    except (StoreError, sqlite3.Error) as exc:
        return jsonify(status="error", error=str(exc)), 503
    return jsonify(status="ok", sources=sources)
