"""Template filters and the values every page needs (the SIMULATED banner)."""

from __future__ import annotations

import sqlite3

from flask import Flask
from markupsafe import Markup

from gpuwhy.errors import StoreError
from gpuwhy.identity import mig_instance_name
from gpuwhy.store.queries import simulated
from gpuwhy.text import format_ts as when
from gpuwhy.text import rfc3339
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


def instant(ts: int | None, precision: str = "ms") -> Markup:
    """A time as the pages show it: its UTC text (format_ts) in a ``<time>`` that carries
    the instant (ISO 8601 in ``datetime``, ns in ``data-ns``), beside which the browser
    writes the local time (static/times.js); the UTC text stands alone without JavaScript
    and in the printable report. "-" for None."""
    if ts is None:
        return Markup("-")
    ts = int(ts)
    return Markup('<time datetime="{}" data-ns="{}">{}</time>').format(
        rfc3339(ts), ts, when(ts, precision, utc=True))


def _page_context() -> dict:
    try:
        return {"simulated": simulated(get_db())}
    except (StoreError, sqlite3.Error):
        return {"simulated": False}


def init_app(app: Flask) -> None:
    app.add_template_filter(when, "when")
    app.add_template_filter(number, "number")
    app.add_template_filter(rate, "rate")
    app.add_template_filter(instant, "instant")
    from gpuwhy.webui import evidence  # here, not above: it imports this module (rate)

    app.add_template_global(evidence.evidence_rows, "evidence_rows")
    app.add_template_global(evidence.detail_rows, "detail_rows")
    app.add_template_global(mig_instance_name, "mig_instance_name")
    app.context_processor(_page_context)
