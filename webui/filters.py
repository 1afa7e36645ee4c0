"""Template filters and the values every page needs (the SIMULATED banner)."""

from __future__ import annotations

import math
import sqlite3

from flask import Flask
from jinja2 import Undefined
from markupsafe import Markup

from gpuwhy.errors import StoreError
from gpuwhy.identity import mig_instance_name
from gpuwhy.quantities import byte_rate
from gpuwhy.store.queries import simulated
from gpuwhy.text import format_ts as when
from gpuwhy.text import rfc3339
from gpuwhy.webui.db import get_db

NO_VALUE = "–"      # no figure: never read, or not given by the GPU's source (never a 0)


def _figure(value: object) -> float | None:
    """A number to show, or None for none: a missing sample (None, Jinja's Undefined),
    and whatever else a messy store holds in a numeric column (text, NaN, inf)."""
    if isinstance(value, Undefined) or value is None or isinstance(value, bool):
        return None
    try:
        figure = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return figure if math.isfinite(figure) else None


def number(value: object, digits: int = 0, unit: str = "", scale: float = 1) -> str:
    """``value`` × ``scale`` with thousands separators, ``digits`` decimals and ``unit``;
    NO_VALUE when there is no number (a GPU never sampled is not a GPU at 0 %)."""
    figure = _figure(value)
    if figure is None:
        return NO_VALUE
    if isinstance(value, int) and not digits and scale == 1:
        return f"{value:,}{unit}"        # exact, however large
    return f"{figure * scale:,.{digits}f}{unit}"


def rate(value: object) -> str:
    """Bytes per second in the largest unit under 1000."""
    value = _figure(value)
    return NO_VALUE if value is None else byte_rate(value)


def age(seconds: object) -> str:
    """A sample's age in words: "4 s", "3 min", "2 h 5 min", "3 d 4 h"; NO_VALUE for none
    (static/overview.js writes the same as it refreshes)."""
    figure = _figure(seconds)
    if figure is None:
        return NO_VALUE
    s = max(0, int(figure))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def instant(ts: int | None, precision: str = "ms") -> Markup:
    """A time as the pages show it: its UTC text (format_ts) in a ``<time>`` that carries
    the instant (ISO 8601 in ``datetime``, ns in ``data-ns``), beside which the browser
    writes the local time (static/times.js); the UTC text stands alone without JavaScript
    and in the printable report. "-" for None."""
    if ts is None or isinstance(ts, Undefined):
        return Markup("-")
    try:
        ts = int(ts)
        return Markup('<time datetime="{}" data-ns="{}">{}</time>').format(
            rfc3339(ts), ts, when(ts, precision, utc=True))
    except (TypeError, ValueError, OverflowError, OSError):
        # not a time (text, or past what a datetime holds): shown as stored, escaped
        return Markup("{}").format(str(ts)[:40])


def moment(ts: int | float | str | None, precision: str = "ms", *, date: bool = True,
           utc: bool = False) -> str:
    """``format_ts`` for a template (the ``when`` filter): "-" for no time, the stored value
    as text for one that is not a time, never an exception."""
    if ts is None or isinstance(ts, Undefined):
        return "-"
    try:
        return when(int(ts), precision, date=date, utc=utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return str(ts)[:40]


def _page_context() -> dict:
    try:
        return {"simulated": simulated(get_db())}
    except (StoreError, sqlite3.Error):
        return {"simulated": False}


def init_app(app: Flask) -> None:
    app.add_template_filter(moment, "when")
    app.add_template_filter(number, "number")
    app.add_template_filter(rate, "rate")
    app.add_template_filter(age, "age")
    app.add_template_filter(instant, "instant")
    from gpuwhy.webui import evidence  # here, not above: it imports this module (rate)

    app.add_template_global(evidence.evidence_rows, "evidence_rows")
    app.add_template_global(evidence.detail_rows, "detail_rows")
    app.add_template_global(mig_instance_name, "mig_instance_name")
    app.context_processor(_page_context)
