"""Alerts in the systemd journal: one entry per new incident, found by MESSAGE_ID or its id.

Each incident kind has a stable MESSAGE_ID (explained in ``systemd/gpuwhy.catalog``, which
``journalctl -x`` shows once the catalog is installed); PRIORITY follows the severity.
Fields: GPUWHY_INCIDENT_ID, GPUWHY_KIND, GPU_ID, GPU_UUID, GPU_PCI, PID, GPUWHY_URL.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlite_utils import Database

from gpuwhy import severity as sev
from gpuwhy.store.queries import pci_and_uuid

log = logging.getLogger(__name__)

MESSAGE_IDS = {
    "xid": "a60674d8f4564a328eb45da8ed4e5115",
    "gpu_lost": "80e86e4aca9846a7b84cae771150ad74",
    "gpu_reset": "497ca03f02774035b99222255a843c7c",
    "process_stall": "e4599001cf174a6ba79386c50d56ee7a",
    "process_exit": "29cc6c008cf1404fb185c2f3f27ebf26",
    "rule_finding": "edb02d46c3fc48debfc0880a04139975",
}
SYSLOG_IDENTIFIER = "gpuwhy"

Sender = Callable[..., object]


def _journal_send() -> Sender | None:
    try:
        from systemd import journal
    except ImportError:
        return None
    return journal.send


def alert_fields(db: Database, incident_id: int, base_url: str) -> dict[str, str]:
    """The journal entry of one incident: MESSAGE plus its structured fields."""
    [incident] = db.execute_returning_dicts(
        "select id, kind, severity, gpu_id, pid, start_time, title, summary, opened_at "
        "from incidents where id = ?", [incident_id])
    pci, uuid = pci_and_uuid(db, incident["gpu_id"])
    # title/summary may carry process names from the kernel log: keep them one bounded line
    text = f"{incident['title']}: {incident['summary']}".replace("\n", " ")[:1000]
    fields = {
        "MESSAGE": f"gpuwhy incident {incident_id}: {text}",
        "MESSAGE_ID": MESSAGE_IDS.get(incident["kind"], MESSAGE_IDS["rule_finding"]),
        "PRIORITY": str(sev.journal_priority(incident["severity"])),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
        "GPUWHY_INCIDENT_ID": str(incident_id),
        "GPUWHY_KIND": incident["kind"],
        "GPUWHY_SEVERITY": incident["severity"],
        "GPUWHY_URL": f"{base_url.rstrip('/')}/incidents/{incident_id}",
    }
    optional = {"GPU_ID": incident["gpu_id"], "GPU_UUID": uuid, "GPU_PCI": pci,
                "PID": incident["pid"], "GPUWHY_PROCESS_START_TIME": incident["start_time"]}
    fields.update({k: str(v) for k, v in optional.items() if v is not None})
    return fields


class Alerter:
    """Sends the alert of each new incident; failures are counted, never raised."""

    def __init__(self, base_url: str, enabled: bool = True, send: Sender | None = None):
        self.base_url = base_url
        self.send = (send or _journal_send()) if enabled else None
        self.sent = 0
        self.failed = 0

    def alert(self, db: Database, incident_ids: list[int]) -> list[int]:
        """Send the alerts of these incidents; returns the ids whose alert went out."""
        if self.send is None:
            return []
        sent = []
        for incident_id in incident_ids:
            try:
                fields = alert_fields(db, incident_id, self.base_url)
                message = fields.pop("MESSAGE")
                self.send(message, **fields)
                self.sent += 1
                sent.append(incident_id)
            except OSError as exc:        # no journald socket: counted, the incident is stored
                self.failed += 1
                if self.failed == 1:
                    log.warning("cannot log incident alerts to the journal: %s", exc)
        return sent
