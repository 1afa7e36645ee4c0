"""Incident alerts reach a real systemd-journald with their fields, and journalctl finds them
by MESSAGE_ID and by GPUWHY_INCIDENT_ID."""

import json
import os
import subprocess
import time

import pytest

from gpuwhy.correlator.alerts import MESSAGE_IDS, Alerter
from gpuwhy.store import open_store

pytestmark = pytest.mark.root


def test_an_incident_alert_is_in_the_journal_with_its_fields(tmp_path, system_journald):
    db = open_store(tmp_path / "store.db")
    marker = os.urandom(6).hex()
    db["gpu_aliases"].insert({"alias": "pci:0000:3b:00", "gpu_id": f"GPU-{marker}"})
    incident_id = db["incidents"].insert({
        "opened_at": time.time_ns(), "kind": "xid", "severity": "critical",
        "gpu_id": f"GPU-{marker}", "pid": 4242, "start_time": 99, "title": "Xid 79: fallen off",
        "summary": "line one\nline two"}).last_pk
    alerter = Alerter("http://gpuwhy.example:8000/")
    alerter.alert(db, [incident_id])
    assert (alerter.sent, alerter.failed) == (1, 0)
    entries = []
    deadline = time.monotonic() + 10
    while not entries and time.monotonic() < deadline:
        out = subprocess.run(["journalctl", "--no-pager", "-o", "json",
                              f"MESSAGE_ID={MESSAGE_IDS['xid']}", f"GPU_UUID=GPU-{marker}"],
                             capture_output=True, text=True).stdout
        entries = [json.loads(line) for line in out.splitlines() if line.strip()]
        time.sleep(0.2)
    [entry] = entries
    assert entry["GPUWHY_INCIDENT_ID"] == str(incident_id) and entry["PRIORITY"] == "2"
    assert entry["GPU_PCI"] == "0000:3b:00" and entry["PID"] == "4242"
    assert entry["GPUWHY_URL"] == f"http://gpuwhy.example:8000/incidents/{incident_id}"
    assert "\n" not in entry["MESSAGE"] and entry["SYSLOG_IDENTIFIER"] == "gpuwhy"
    by_id = subprocess.run(["journalctl", "--no-pager", "-o", "json",
                            f"GPUWHY_INCIDENT_ID={incident_id}", f"GPU_UUID=GPU-{marker}"],
                           capture_output=True, text=True).stdout
    assert len(by_id.splitlines()) == 1
    db.close()
