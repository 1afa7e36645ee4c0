"""Line charts as inline SVG, drawn on the server: a report needs no script and no network.

Every text that goes into a chart (titles, series names, marker labels) is escaped here;
a gap in the data (None) breaks the line rather than drawing across it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from markupsafe import Markup, escape

from gpuwhy.text import format_ts

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
Point = tuple[int, float | None]


def nice_ceiling(value: float) -> float:
    """The next 1, 2, 2.5 or 5 × 10^n at or above ``value`` (the top of the y axis)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10 * power


def short(value: float) -> str:
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def line_chart(title: str, unit: str, series: Sequence[tuple[str, Sequence[Point]]],
               since: int, until: int, markers: Sequence[tuple[int, str]] = (),
               width: int = 860, height: int = 190) -> Markup:
    """One chart: ``series`` as (name, [(ts ns, value or None)]), ``markers`` as vertical
    lines (incidents) at (ts ns, label)."""
    left, right, top, bottom = 56, 12, 26, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for _, points in series for _, v in points if v is not None]
    y_max = nice_ceiling(max(values, default=0.0))
    span = max(until - since, 1)

    def x(ts: int) -> float:
        return left + (min(max(ts, since), until) - since) / span * plot_w

    def y(value: float) -> float:
        return top + plot_h - min(max(value, 0.0), y_max) / y_max * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{escape(title)}">',
             f'<text x="{left}" y="16" class="chart-title">{escape(title)}'
             f'{escape(f" ({unit})") if unit else ""}</text>']
    for i in range(5):
        level = y_max * i / 4
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(level):.1f}" '
                     f'y2="{y(level):.1f}" class="grid"/>'
                     f'<text x="{left - 4}" y="{y(level) + 4:.1f}" class="axis" '
                     f'text-anchor="end">{escape(short(level))}</text>')
    parts.append(f'<text x="{left}" y="{height - 6}" class="axis">{escape(format_ts(since, "s"))}'
                 f'</text><text x="{width - right}" y="{height - 6}" class="axis" '
                 f'text-anchor="end">{escape(format_ts(until, "s"))}</text>')
    for ts, label in markers:
        if since <= ts <= until:
            parts.append(f'<line x1="{x(ts):.1f}" x2="{x(ts):.1f}" y1="{top}" '
                         f'y2="{top + plot_h}" class="marker"><title>{escape(label)}</title>'
                         f'</line><text x="{x(ts) + 3:.1f}" y="{top + 10}" class="marker-label">'
                         f'{escape(label[:40])}</text>')
    for index, (name, points) in enumerate(series):
        color = COLORS[index % len(COLORS)]
        for run in _runs(points):
            coords = " ".join(f"{x(ts):.1f},{y(v):.1f}" for ts, v in run)
            if len(run) == 1:
                parts.append(f'<circle cx="{x(run[0][0]):.1f}" cy="{y(run[0][1]):.1f}" r="1.5" '
                             f'fill="{color}"/>')
            else:
                parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" '
                             f'stroke-width="1.4"/>')
        parts.append(f'<text x="{left + 8 + 150 * index}" y="{top + plot_h - 6}" '
                     f'class="legend" fill="{color}">{escape(name)}</text>')
    if not values:
        parts.append(f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h / 2:.0f}" '
                     f'class="axis" text-anchor="middle">no data in this period</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _runs(points: Sequence[Point]) -> list[list[tuple[int, float]]]:
    runs: list[list[tuple[int, float]]] = [[]]
    for ts, value in points:
        if value is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((ts, float(value)))
    return [run for run in runs if run]
