"""`gpuwhy incident ID note` reaches a real systemd-journald with the incident's fields
(journalctl finds it by MESSAGE_ID and GPUWHY_INCIDENT_ID); and even root gets one clear
error, not a traceback, for a store on a read-only mount."""

import json
import os
import subprocess
import time

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.journal import CHANGE_MESSAGE_IDS
from gpuwhy.store import open_store

pytestmark = pytest.mark.root


def an_incident(path, marker):
    db = open_store(path)
    db["gpu_aliases"].insert({"alias": "pci:0000:3b:00", "gpu_id": f"GPU-{marker}"})
    incident_id = db["incidents"].insert({
        "opened_at": time.time_ns() - 60 * 10**9, "kind": "xid", "severity": "critical",
        "state": "open", "gpu_id": f"GPU-{marker}", "title": "Xid 79: fallen off",
        "summary": "the GPU fell off the bus"}).last_pk
    db.close()
    return incident_id


def test_a_note_from_the_cli_is_in_the_journal_with_its_fields(tmp_path, system_journald):
    marker = os.urandom(6).hex()
    store = tmp_path / "store.db"
    incident_id = an_incident(store, marker)
    result = CliRunner().invoke(cli, ["incident", str(incident_id), "note", "RMA", marker,
                                      "--by", "alice"],
                                env={"GPUWHY_DB": str(store),
                                     "GPUWHY_URL": "http://gpuwhy.example:8000/"})
    assert result.exit_code == 0, result.output
    assert result.stderr == ""                     # no "journal entry was not written"
    entries = []
    deadline = time.monotonic() + 10
    while not entries and time.monotonic() < deadline:
        out = subprocess.run(["journalctl", "--no-pager", "-o", "json",
                              f"MESSAGE_ID={CHANGE_MESSAGE_IDS['note']}",
                              f"GPUWHY_INCIDENT_ID={incident_id}", f"GPU_UUID=GPU-{marker}"],
                             capture_output=True, text=True).stdout
        entries = [json.loads(line) for line in out.splitlines() if line.strip()]
        time.sleep(0.2)
    [entry] = entries
    assert entry["MESSAGE"] == f"gpuwhy incident {incident_id} noted by alice: RMA {marker}"
    assert (entry["GPUWHY_CHANGE"], entry["GPUWHY_ACTOR"], entry["GPUWHY_NOTE"]) == (
        "note", "alice", f"RMA {marker}")
    assert entry["GPUWHY_STATE"] == "open" and entry["GPU_PCI"] == "0000:3b:00"
    assert entry["GPUWHY_URL"] == f"http://gpuwhy.example:8000/incidents/{incident_id}"
    assert entry["SYSLOG_IDENTIFIER"] == "gpuwhy" and entry["PRIORITY"] == "5"


def test_a_store_on_a_read_only_mount_is_one_clear_error_even_for_root(tmp_path):
    writable, read_only = tmp_path / "store", tmp_path / "ro"
    writable.mkdir()
    read_only.mkdir()
    incident_id = an_incident(writable / "gpuwhy.db", os.urandom(6).hex())
    subprocess.run(["mount", "--bind", str(writable), str(read_only)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(read_only)], check=True)
        store = read_only / "gpuwhy.db"
        result = CliRunner().invoke(cli, ["incident", str(incident_id), "ack", "--by", "root"],
                                    env={"GPUWHY_DB": str(store)})
    finally:
        subprocess.run(["umount", str(read_only)], check=True)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"the store {store} is not writable by" in result.stderr
    assert "read-only file system" in result.stderr
    db = open_store(writable / "gpuwhy.db", readonly=True)
    assert db.execute("select state from incidents where id = ?",
                      [incident_id]).fetchone() == ("open",)
    db.close()
