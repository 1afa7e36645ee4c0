"""Alerts in the systemd journal: one entry per new incident and per change to one.

Each incident kind, and each kind of change (acknowledged, resolved, reopened, a note), has a
stable MESSAGE_ID (:mod:`gpuwhy.journal`, explained in ``systemd/gpuwhy.catalog``, which
``journalctl -x`` shows once the catalog is installed); PRIORITY follows the severity.
Fields: GPUWHY_INCIDENT_ID, GPUWHY_KIND, GPUWHY_STATE, GPU_ID, GPU_UUID, GPU_PCI,
GPU_HEALTH, PID, GPUWHY_URL (:mod:`gpuwhy.store.lifecycle` builds them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlite_utils import Database

from gpuwhy.journal import MESSAGE_IDS, SYSLOG_IDENTIFIER, Sender, write_entry
from gpuwhy.store.lifecycle import alert_entry, change_entry

__all__ = ["MESSAGE_IDS", "SYSLOG_IDENTIFIER", "Alerter", "alert_fields"]

log = logging.getLogger(__name__)


def alert_fields(db: Database, incident_id: int, base_url: str) -> dict[str, str]:
    """The journal entry of one incident: MESSAGE plus its structured fields."""
    return alert_entry(db, incident_id, base_url)


class Alerter:
    """Sends the alert of each new incident and each change; failures are counted, never
    raised."""

    def __init__(self, base_url: str, enabled: bool = True, send: Sender | None = None):
        self.base_url = base_url
        self.enabled = enabled
        self.send = send        # a stand-in for systemd's sender (tests); None: the journal
        self.sent = 0
        self.changes_sent = 0
        self.failed = 0

    def alert(self, db: Database, incident_ids: list[int]) -> list[int]:
        """Send the alerts of these incidents; returns the ids whose alert went out."""
        return [i for i in incident_ids if self._send(alert_entry, db, i, change=False)]

    def changes(self, db: Database, change_ids: list[int]) -> int:
        """Send one entry per lifecycle change (rows of ``incident_log``); returns how many
        went out."""
        return sum(self._send(change_entry, db, c, change=True) for c in change_ids)

    def _send(self, entry: Callable[[Database, int, str], dict[str, str]], db: Database,
              row_id: int, change: bool) -> bool:
        if not self.enabled:
            return False
        why = write_entry(entry(db, row_id, self.base_url), self.send)
        if why is not None:           # no journald: counted, the incident is stored
            self.failed += 1
            if self.failed == 1:
                log.warning("cannot log incident alerts to the journal: %s", why)
            return False
        if change:
            self.changes_sent += 1
        else:
            self.sent += 1
        return True
