"""The log sources' stored cursors, read for a source that starts again (klog, cron)."""

from __future__ import annotations

import sqlite3
from functools import partial
from pathlib import Path

from gpuwhy.cursors import CursorReader, StoredCursor


def stored_cursor(store_path: str, source: str) -> StoredCursor | None:
    """The cursor the store committed with the last data of ``source``; None on a first run.

    Read-only and tolerant: a store that does not exist yet, or is not migrated yet, has
    no cursor. (Its own connection: a source runs beside the writer, not through it.)
    """
    if not Path(store_path).exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{store_path}?mode=ro", uri=True, timeout=5)
        try:
            row = conn.execute("select origin, cursor, boot_id from source_cursors "
                               "where source = ?", [source]).fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return StoredCursor(*row) if row else None


def cursor_reader(store_path: str) -> CursorReader:
    """:func:`stored_cursor` of the store at ``store_path``, for a source to call."""
    return partial(stored_cursor, store_path)
