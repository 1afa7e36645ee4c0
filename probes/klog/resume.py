"""What a restarted log source needs: its cursor as committed in the store, and a bus
publisher whose subscriber is there before the first line is read (else lines are lost)."""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

from gpuwhy.bus import Publisher
from gpuwhy.config import Config


@dataclass(frozen=True)
class StoredCursor:
    origin: str
    cursor: str
    boot_id: str


def stored_cursor(store_path: str, source: str) -> StoredCursor | None:
    """The cursor the store committed with the last data of ``source``; None on a first run.

    Read-only and tolerant: a store that does not exist yet, or is not migrated yet, has
    no cursor.
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


def connect_publisher(config: Config, src: str, stop: threading.Event) -> Publisher | None:
    """A publisher with a subscriber attached; None when ``stop`` was set first."""
    publisher = Publisher(config["bus.endpoint"], src=src, hwm=config["bus.hwm"])
    while not stop.is_set():
        if publisher.wait_for_subscriber(0.5):
            return publisher
    publisher.close()
    return None


def publish_reliably(publisher: Publisher, event: object, stop: threading.Event) -> bool:
    """Publish, retrying while the bus is full: a log line must not be skipped, because the
    cursor committed after it would then pass over it. False only when stopped first."""
    while not publisher.publish(event):  # type: ignore[arg-type]
        if stop.wait(0.05):
            return False
    return True
