"""How gpuwhy writes things for people: timestamps, tables, untrusted text made terminal-safe.

One layout for every CLI list (a header row, aligned columns); one formatter for every
realtime-nanosecond timestamp a CLI, a report, a web page or a log line prints (local time
unless asked for UTC, always with its time zone); and one escaper for what processes and
logs control (names, command lines, kernel messages): it is shown, never interpreted. The
browser's one counterpart is ``GpuwhyCharts.clock`` in webui/static/charts.js, which names
the browser's zone on the page.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

from gpuwhy.clock import NS_PER_SECOND

_FORMATS = {"ms": "%H:%M:%S", "s": "%H:%M:%S", "min": "%H:%M"}
# SQLite's %f is seconds with milliseconds (SS.SSS): the same text as "ms" above.
_SQL_FORMATS = {"ms": "%Y-%m-%d %H:%M:%f", "s": "%Y-%m-%d %H:%M:%S", "min": "%Y-%m-%d %H:%M"}


def format_ts(ts: int | None, precision: str = "ms", *, date: bool = True,
              utc: bool = False) -> str:
    """A realtime timestamp in ns as ``YYYY-MM-DD HH:MM:SS.mmm ZONE`` (``precision`` ``ms``),
    ``…HH:MM:SS ZONE`` (``s``) or ``…HH:MM ZONE`` (``min``); ``-`` for None.

    In UTC (``utc=True``) or in the local time zone (``TZ``, else the host's), the zone
    always written: its abbreviation (``UTC``, ``CET``, ``EDT``), or the offset from UTC
    (``+05:30``) where the zone has no alphabetic abbreviation.

    >>> format_ts(1_700_000_000_123_456_789, utc=True)
    '2023-11-14 22:13:20.123 UTC'
    >>> format_ts(1_700_000_000_123_456_789, "s", date=False, utc=True)
    '22:13:20 UTC'
    >>> format_ts(1_700_000_000_123_456_789, "min", utc=True)
    '2023-11-14 22:13 UTC'
    """
    if ts is None:
        return "-"
    moment = datetime.fromtimestamp(ts // NS_PER_SECOND, tz=UTC)
    if not utc:
        moment = moment.astimezone()
    shown = moment.strftime(("%Y-%m-%d " if date else "") + _FORMATS[precision])
    if precision == "ms":
        shown += f".{ts % NS_PER_SECOND // 1_000_000:03d}"
    return f"{shown} {_zone(moment)}"


def _zone(moment: datetime) -> str:
    """``moment``'s zone abbreviation, or its UTC offset as ``+HH:MM`` where the zone has
    none or only a numeric one (``-03``)."""
    name = moment.tzname() or ""
    if name.isalpha():
        return name
    offset = moment.utcoffset() or timedelta(0)
    minutes = round(offset.total_seconds() / 60)
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def sql_utc(ns_expr: str, precision: str = "ms") -> str:
    """The SQLite expression that writes ``ns_expr`` (realtime ns) as
    ``format_ts(…, precision, utc=True)`` does, less its ``" UTC"``: the ``time`` columns of
    the store's views, whose zone is UTC by definition (docs/schema.md). Kept without the
    suffix because migration m603's views are frozen (store/views.py ``VIEWS_V1``).

    >>> sql_utc("s.ts", "s")
    "strftime('%Y-%m-%d %H:%M:%S', s.ts / 1e9, 'unixepoch')"
    """
    return f"strftime('{_SQL_FORMATS[precision]}', {ns_expr} / 1e9, 'unixepoch')"


def rfc3339(ts: int) -> str:
    """A realtime timestamp in ns as RFC 3339 in UTC with milliseconds, the form machine
    APIs take (Alertmanager's ``startsAt``/``endsAt``); people read :func:`format_ts`.

    >>> rfc3339(1_800_000_000_123_456_789)
    '2027-01-15T08:00:00.123Z'
    """
    moment = datetime.fromtimestamp(ts // NS_PER_SECOND, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ts % NS_PER_SECOND // 1_000_000:03d}Z"


_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])\Z")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ts(text: str, now: int, *, naive_utc: bool = False) -> int:
    """A moment a person writes, as realtime ns: ``30s``/``10m``/``2h``/``1d`` before
    ``now``, ns since the epoch, or an ISO 8601 date-time (one naming no zone is local
    time, or UTC with ``naive_utc``: a web page's server is not in its reader's zone).
    ValueError, saying what is accepted, for anything else."""
    text = text.strip()
    ago = _AGO.match(text)
    if ago:
        return now - int(float(ago[1]) * _UNIT_S[ago[2]] * NS_PER_SECOND)
    if text.isascii() and text.isdigit() and len(text) <= 19:
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text[:60]!r}: use 30s, 10m, 2h, 1d, ns since the epoch or an "
                         "ISO date-time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC) if naive_utc else moment.astimezone()
    return int(moment.timestamp() * NS_PER_SECOND)


def printable(text: str, limit: int | None = None) -> str:
    """Untrusted text (a process name, a command line, a log message) safe for a terminal:
    control and other non-printable characters shown as escapes, at most ``limit``
    characters (the last one an ellipsis) when a limit is given.

    >>> printable("py\\x1b[31mthon")
    'py\\\\x1b[31mthon'
    >>> printable("abcdef", limit=4)
    'abc…'
    """
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                       for c in text)
    if limit is not None and len(text) > limit:
        return text[:limit - 1] + "…"
    return text


def table(headers: Sequence[str], rows: Iterable[Sequence[object]],
          right: Sequence[int] = ()) -> str:
    """Rows as aligned columns under a header row, for every CLI list: each cell made
    terminal-safe (:func:`printable`), None shown as ``-``, the columns numbered in
    ``right`` aligned right (numbers), the last column never padded.

    >>> print(table(["id", "name"], [[7, "nvtop"], [12, None]], right=[0]))
    id  name
     7  nvtop
    12  -
    """
    cells = [[printable("-" if value is None else str(value)) for value in row] for row in rows]
    lines = [list(headers), *cells]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]

    def fit(line: list[str]) -> str:
        out = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
               for i, cell in enumerate(line)]
        if len(line) - 1 not in right:
            out[-1] = line[-1]
        return "  ".join(out).rstrip()

    return "\n".join(fit(line) for line in lines)
