"""Where a log source resumes: the cursor the store committed with the source's last data.

The store reads it (:func:`gpuwhy.store.source_cursors.stored_cursor`); a source is handed a
:data:`CursorReader` by whoever runs it, since sources do not read the store themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredCursor:
    """A source's position: the backend it was read from (``journald``, ``kmsg``, ``file``),
    that backend's cursor, and the boot the last line came from."""

    origin: str
    cursor: str
    boot_id: str


# source name ("klog", "cron") -> its stored cursor; None on a first run
CursorReader = Callable[[str], StoredCursor | None]
