"""What a restarted log source needs: a bus publisher whose subscriber is there before the
first line is read (else lines are lost), and to publish every line it read.

Its cursor as committed in the store is read by the store
(:func:`gpuwhy.store.source_cursors.stored_cursor`) and handed to the source by whoever runs
it (a :data:`gpuwhy.cursors.CursorReader`): sources do not read the store.
"""

from __future__ import annotations

import threading

from gpuwhy.bus import Publisher
from gpuwhy.config import Config


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
