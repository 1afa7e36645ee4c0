"""The chart window a request asks for: a named range, a zoom, or a moment to centre on; and
the one reader of every whole-number query parameter (times in ns, cursors, page numbers)."""

from __future__ import annotations

from collections.abc import Mapping

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.config import MAX_INT
from gpuwhy.store.series import RANGES, Window, window

# The most digits a parameter may have: MAX_INT has 19, and int() on a long digit string
# is slow (CPython refuses past 4300 digits), so longer ones are refused before parsing.
_MAX_DIGITS = len(str(MAX_INT))


def whole(args: Mapping[str, str], name: str, low: int = 0, high: int = MAX_INT,
          what: str = "a whole number") -> int | None:
    """The query parameter ``name`` as an int in [low, high], None when absent or empty.

    ASCII digits only (``int()`` would also take ``٣``, ``1_000`` and spaces), never more
    than SQLite's INTEGER holds: a time or cursor past 2^63 - 1 would fail in the store, so
    it is refused here with a ValueError that names the parameter and its range.
    """
    raw = args.get(name)
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS
            and low <= int(raw) <= high):
        raise ValueError(f"{name} is {what} from {low} to {high}, got {raw[:40]!r}")
    return int(raw)


def _ns(args: Mapping[str, str], name: str) -> int | None:
    return whole(args, name, what="a time in ns since the epoch")


def requested_window(args: Mapping[str, str], until_default: int | None, points: int) -> Window:
    """The window a request asks for: ``range`` (5m … 7d, default 1h) ending at ``to`` (ns)
    or at the latest data, or an explicit ``from``/``to`` (ns, a zoom); ``at`` (ns) centres
    the range on a moment (links from an incident's chain). Raises ValueError when bad."""
    name = args.get("range") or "1h"
    if name not in RANGES:
        raise ValueError(f"range must be one of {', '.join(RANGES)}, got {name[:40]!r}")
    seconds = RANGES[name]
    at, start, end = (_ns(args, n) for n in ("at", "from", "to"))
    if at is not None:
        # a moment near the end of time: the window stops there rather than past SQLite's ints
        end = min(at + seconds * NS_PER_SECOND // 2, MAX_INT)
    if end is None:
        end = min((until_default or 0) + NS_PER_SECOND, MAX_INT)
    if start is not None and start >= end:
        raise ValueError("from must be before to")
    return window(end, seconds, points, since=start)


def requested_tail(args: Mapping[str, str],
                   until_default: int | None) -> tuple[Window, int] | None:
    """A live chart's request for what is new: ``after`` (ns, its last bucket's time) on
    the grid it was drawn on (``grid``: its window's start, ``bucket``: its bucket width,
    both ns), up to the latest data; None when the request has no ``after``. Raises
    ValueError when bad."""
    after = _ns(args, "after")
    if after is None:
        return None
    grid, bucket = _ns(args, "grid"), whole(args, "bucket", NS_PER_SECOND,
                                            what="a bucket width in ns")
    if grid is None or bucket is None:
        raise ValueError("after comes with grid and bucket (integers, ns)")
    if grid > after:
        raise ValueError("grid is not after after")
    until = min(max((until_default or 0) + NS_PER_SECOND, after + 1), MAX_INT)
    return Window(grid, until, bucket), after
