"""Alerts in the systemd journal: one entry per new incident and per change to one.

Each incident kind, and each kind of change (acknowledged, resolved, reopened, a note), has a
stable MESSAGE_ID (:mod:`gpuwhy.journal`, explained in ``systemd/gpuwhy.catalog``, which
``journalctl -x`` shows once the catalog is installed); PRIORITY follows the severity.
Fields: GPUWHY_INCIDENT_ID, GPUWHY_KIND, GPUWHY_STATE, GPU_ID, GPU_UUID, GPU_PCI,
GPU_HEALTH, PID, GPUWHY_URL, and the answer on the GPU as it stands (GPUWHY_ANSWER,
GPUWHY_ANSWER_RULE: gpuwhy why's sentence and what leads it) (:mod:`gpuwhy.store.incident_changes`
builds them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from sqlite_utils import Database

from gpuwhy.journal import MESSAGE_IDS, SYSLOG_IDENTIFIER, Sender, write_entry
from gpuwhy.rules.loader import configured_rule_set
from gpuwhy.rules.model import Rule
from gpuwhy.store.incident_changes import alert_entry, change_entry

__all__ = ["MESSAGE_IDS", "SYSLOG_IDENTIFIER", "Alerter", "alert_fields"]

log = logging.getLogger(__name__)


def alert_fields(db: Database, incident_id: int, base_url: str) -> dict[str, str]:
    """The journal entry of one incident: MESSAGE plus its structured fields."""
    return alert_entry(db, incident_id, base_url)


class Alerter:
    """Sends the alert of each new incident and each change; failures are counted, never
    raised."""

    def __init__(self, base_url: str, enabled: bool = True, send: Sender | None = None,
                 settings: Mapping[str, Any] | None = None):
        self.base_url = base_url
        self.enabled = enabled
        self.send = send        # a stand-in for systemd's sender (tests); None: the journal
        # the service's rules, loaded at the first alert: an alert carries its GPU's answer
        self.settings = settings
        self._rules: dict[str, Rule] | None = None
        self.sent = 0
        self.changes_sent = 0
        self.failed = 0

    def rules(self) -> dict[str, Rule] | None:
        """The rules the answer ranks with (None without settings: alerts carry no answer)."""
        if self._rules is None and self.settings is not None:
            self._rules = {r.id: r for r in configured_rule_set(self.settings).rules}
        return self._rules

    def alert(self, db: Database, incident_ids: list[int]) -> list[int]:
        """Send the alerts of these incidents, each with the answer on its GPU; returns the
        ids whose alert went out."""
        if not self.enabled:
            return []
        rules = self.rules()

        def entry(db: Database, incident_id: int, base_url: str) -> dict[str, str]:
            return alert_entry(db, incident_id, base_url, rules)
        return [i for i in incident_ids if self._send(entry, db, i, change=False)]

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
