"""What a store holds, read for `gpuwhy db`: its tables' rows, the span of raw samples and
rollups, whether the file reads at all, its integrity and when the service last wrote it."""

from __future__ import annotations

from sqlite_utils import Database


def first_read(db: Database) -> None:
    """Read the schema once: a read-only open reads nothing yet, so a file that is no
    database (a zeroed header) raises ``sqlite3.DatabaseError`` here, not mid-command."""
    db.execute("SELECT count(*) FROM sqlite_master").fetchone()


def table_rows(db: Database) -> dict[str, int]:
    """Rows per table, by name (SQLite's own ``_``-tables aside)."""
    return {name: db[name].count for name in sorted(db.table_names())
            if not name.startswith("_")}


def sample_span(db: Database) -> tuple[int | None, int | None]:
    """The first and last raw GPU sample's time (ns), or (None, None) in an empty store."""
    return tuple(db.execute("SELECT min(ts), max(ts) FROM gpu_sample_data").fetchone())


def rollup_span(db: Database) -> tuple[int | None, int | None]:
    """The first and last rolled-up minute, or (None, None) before the first rollup."""
    return tuple(db.execute("SELECT min(minute), max(minute) FROM gpu_rollup_data"
                            ).fetchone())


def correlator_last_seen(db: Database) -> int | None:
    """When the service's correlator last wrote its heartbeat (ns), or None: never."""
    row = db.execute("SELECT last_seen FROM source_health WHERE source = 'correlator'"
                     ).fetchone()
    return row[0] if row else None


def integrity_check(db: Database) -> list[str]:
    """``PRAGMA integrity_check``'s rows: ``["ok"]`` for a sound file. The whole check, not
    the periodic quick one (:func:`gpuwhy.store.maintenance.quick_check`): run by hand."""
    return [str(row[0]) for row in db.execute("PRAGMA integrity_check").fetchall()]
