"""The store's size against its cap (``store.max_mb``): ok, warning (past
``store.warn_fraction`` of the cap) or over; plus what the file system has left."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlite_utils import Database

MB = 1_000_000
DISK_FULL_BYTES = MB    # less than this left: a transaction may not fit (pages, WAL frames)


@dataclass(frozen=True)
class SizeReport:
    """``used_bytes``: pages holding data (free pages are reused before the file grows);
    ``file_bytes``/``wal_bytes``: on disk; ``disk_free_bytes``: left on the file system."""

    used_bytes: int
    file_bytes: int
    wal_bytes: int
    disk_free_bytes: int | None
    cap_bytes: int
    warn_fraction: float

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.cap_bytes if self.cap_bytes else 0.0

    @property
    def state(self) -> str:
        if self.fraction >= 1.0:
            return "over"
        return "warning" if self.fraction >= self.warn_fraction else "ok"

    def describe(self, disk: bool = True) -> str:
        """One line; ``disk=False`` leaves out the disk's free space (for a line that is
        stored and read later, when that figure would be stale)."""
        text = (f"{self.used_bytes / MB:.1f} MB used of a {self.cap_bytes / MB:.0f} MB cap "
                f"({self.fraction:.0%})")
        if disk and self.disk_free_bytes is not None:
            text += f", {self.disk_free_bytes / MB:.0f} MB free on disk"
        return text

    def as_dict(self) -> dict:
        return {**asdict(self), "state": self.state, "fraction": round(self.fraction, 4)}


def disk_free_bytes(path: str | os.PathLike[str]) -> int | None:
    """What the file system holding the database file ``path`` has left for it, now (None:
    unknown). Read at each call: a figure from the last maintenance step was still
    showing 16 MB free while the disk was full."""
    try:
        stats = os.statvfs(Path(path).parent)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def database_path(db: Database) -> Path | None:
    row = db.execute("PRAGMA database_list").fetchone()
    return Path(row[2]) if row and row[2] else None


def measure(db: Database, cap_mb: float, warn_fraction: float = 0.8) -> SizeReport:
    page_size = db.execute("PRAGMA page_size").fetchone()[0]
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    free = db.execute("PRAGMA freelist_count").fetchone()[0]
    path = database_path(db)
    wal_bytes, disk_free = 0, None
    if path is not None:
        wal = path.with_name(path.name + "-wal")
        wal_bytes = wal.stat().st_size if wal.exists() else 0
        disk_free = disk_free_bytes(path)
    return SizeReport(used_bytes=(pages - free) * page_size, file_bytes=pages * page_size,
                      wal_bytes=wal_bytes, disk_free_bytes=disk_free,
                      cap_bytes=int(cap_mb * MB), warn_fraction=warn_fraction)
