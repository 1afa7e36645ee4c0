"""The chart window a request asks for: a named range, a zoom, or a moment to centre on."""

from __future__ import annotations

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.store.series import RANGES, Window, window


def requested_window(args: dict | object, until_default: int | None, points: int) -> Window:
    """The window a request asks for: ``range`` (5m … 7d, default 1h) ending at ``to`` (ns)
    or at the latest data, or an explicit ``from``/``to`` (ns, a zoom); ``at`` (ns) centres
    the range on a moment (links from an incident's chain). Raises ValueError when bad."""
    get = args.get   # type: ignore[attr-defined]
    name = get("range") or "1h"
    if name not in RANGES:
        raise ValueError(f"range must be one of {', '.join(RANGES)}, got {name!r}")
    seconds = RANGES[name]
    try:
        at = int(get("at")) if get("at") else None
        start = int(get("from")) if get("from") else None
        end = int(get("to")) if get("to") else None
    except ValueError:
        raise ValueError("from, to and at are integers (ns since the epoch)") from None
    if at is not None:
        end = at + seconds * NS_PER_SECOND // 2
    if end is None:
        end = (until_default or 0) + NS_PER_SECOND
    if start is not None and start >= end:
        raise ValueError("from must be before to")
    return window(end, seconds, points, since=start)


def requested_tail(args: dict | object, until_default: int | None) -> tuple[Window, int] | None:
    """A live chart's request for what is new: ``after`` (ns, its last bucket's time) on
    the grid it was drawn on (``grid``: its window's start, ``bucket``: its bucket width,
    both ns), up to the latest data; None when the request has no ``after``. Raises
    ValueError when bad."""
    get = args.get   # type: ignore[attr-defined]
    if not get("after"):
        return None
    try:
        after, grid, bucket = (int(get(name) or "x") for name in ("after", "grid", "bucket"))
    except ValueError:
        raise ValueError("after, grid and bucket are integers (ns)") from None
    if bucket < NS_PER_SECOND or grid > after:
        raise ValueError("bucket is at least 1 s (in ns), and grid is not after after")
    until = max((until_default or 0) + NS_PER_SECOND, after + 1)
    return Window(grid, until, bucket), after
