"""SQLite store: open (WAL, migrations applied), write from the correlator, read for the views.

One writer: the correlator's thread owns the only writing connection; it applies event
batches (``writer``) and, between them, the periodic ``maintenance`` step (``rollups``,
``retention``, ``budget``). Readers (web view, CLI, people with sqlite3) open their own
connections; WAL keeps them from blocking the writer. The schema is ``migrations``; the
views people query are ``views`` (documented in docs/schema.md by ``schema_doc``); GPU
samples are stored compactly as ``samples`` describes.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sqlite_utils import Database

from gpuwhy.errors import StoreError
from gpuwhy.store.migrations import migrations
from gpuwhy.store.xid_codes import sync_xid_codes


def open_store(path: str | os.PathLike[str], *, readonly: bool = False,
               cache_kib: int | None = None) -> Database:
    """Open the database at ``path``: WAL mode, busy timeout, every migration applied.

    ``readonly`` opens an existing database for the views without migrating it.
    ``cache_kib`` sizes the connection's page cache (SQLite's default: 2,000 KiB): each of
    the service's long-lived connections fills it as the store grows (setting
    ``store.cache_kib``).
    Raises :class:`StoreError` with the path when it cannot be opened or migrated.
    """
    path = Path(path)
    try:
        if readonly:
            conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 5000")
        if cache_kib is not None:
            conn.execute(f"PRAGMA cache_size = {-int(cache_kib)}")
        db = Database(conn)
        if readonly:
            return db
        db.enable_wal()
        db.execute("PRAGMA synchronous = NORMAL")
        migrations.apply(db)
        sync_xid_codes(db)          # the views' catalogue follows this build's
        return db
    except (sqlite3.Error, OSError) as exc:
        raise StoreError(f"cannot open store {path}: {exc}") from None
