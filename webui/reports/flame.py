"""A flame graph as inline SVG, for the reports (no script): the tree of webui/stacks.py
flame_tree(), the root at the bottom, each box as wide as its samples.

Every frame name is the sampled process's text: escaped here as it is drawn (and cut to
what fits its box), never markup.
"""

from __future__ import annotations

from html import escape
from typing import Any

from markupsafe import Markup

ROW = 18
CHAR = 6.2          # px per character at font-size 11 (cut text to what fits a box)
COLORS = ("#f2a65a", "#e9724c", "#f4c95d", "#dd7f4a", "#f0b67f", "#e8a33d")


def flame_svg(tree: dict[str, Any], width: int = 960) -> Markup:
    """The tree as an SVG flame graph (empty Markup for an empty tree)."""
    total = int(tree.get("value") or 0)
    if total <= 0:
        return Markup("")
    boxes: list[tuple[float, float, int, str, int]] = []

    def walk(node: dict[str, Any], start: float, depth: int) -> None:
        boxes.append((start, node["value"], depth, str(node["name"]), node["value"]))
        at = start
        for child in node.get("children") or []:
            walk(child, at, depth + 1)
            at += child["value"]

    walk(tree, 0, 0)
    depth = max(b[2] for b in boxes) + 1
    height = depth * ROW
    scale = width / total
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="flame" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'font-family="monospace" font-size="11">']
    for i, (start, value, level, name, samples) in enumerate(boxes):
        w = value * scale
        if w < 0.5:
            continue
        x, y = start * scale, height - (level + 1) * ROW
        share = 100 * samples / total
        fits = int((w - 4) / CHAR)
        label = name if len(name) <= fits else (name[:fits - 1] + "…" if fits > 1 else "")
        parts.append(f'<g><title>{escape(name)} ({samples} samples, {share:.1f} %)</title>'
                     f'<rect x="{x:.1f}" y="{y}" width="{max(0.0, w - 1):.1f}" '
                     f'height="{ROW - 1}" fill="{COLORS[i % len(COLORS)]}"/>'
                     + (f'<text x="{x + 2:.1f}" y="{y + ROW - 5}">{escape(label)}</text>'
                        if label else "") + "</g>")
    parts.append("</svg>")
    return Markup("".join(parts))
