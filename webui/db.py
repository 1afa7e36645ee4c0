"""A read-only store connection per request, on ``g``, closed at teardown (flaskr's pattern)."""

from __future__ import annotations

from flask import Flask, current_app, g
from sqlite_utils import Database

from gpuwhy.store import open_store


def get_db() -> Database:
    if "db" not in g:
        g.db = open_store(current_app.config["DATABASE"], readonly=True)
    return g.db


def close_db(exc: BaseException | None = None) -> None:
    db = g.pop("db", None)
    if db is not None:
        db.close()


def init_app(app: Flask) -> None:
    app.teardown_appcontext(close_db)
