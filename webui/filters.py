"""Template filters and the values every page needs (the SIMULATED banner)."""

from __future__ import annotations

import sqlite3

from flask import Flask

from gpuwhy.errors import StoreError
from gpuwhy.store.queries import simulated
from gpuwhy.text import format_ts as when
from gpuwhy.webui.db import get_db


def number(value: float | None, digits: int = 0, unit: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}{unit}"


def rate(value: float | None) -> str:
    """Bytes per second in the largest unit under 1000."""
    if value is None:
        return "–"
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(value) < 1000 or unit == "GB/s":
            return f"{value:,.1f} {unit}"
        value /= 1000
    return "–"


def _page_context() -> dict:
    try:
        return {"simulated": simulated(get_db())}
    except (StoreError, sqlite3.Error):
        return {"simulated": False}


def init_app(app: Flask) -> None:
    app.add_template_filter(when, "when")
    app.add_template_filter(number, "number")
    app.add_template_filter(rate, "rate")
    app.context_processor(_page_context)
