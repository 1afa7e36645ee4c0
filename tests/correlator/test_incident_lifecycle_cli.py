"""`gpuwhy incident ID ack|resolve|note` and `gpuwhy incidents --state`, on a store the real
correlator filled (a GPU that fell off the bus): each change is stored in the incident's
state and log, printed as one line, and sent to the journal (the sender stubbed at
gpuwhy.journal.journal_sender); a store the user may not write gives one clear error."""

import getpass
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuwhy import lifecycle as lc
from gpuwhy.app.cli import cli
from gpuwhy.clock import now_ns
from gpuwhy.identity import ProcessKey
from gpuwhy.journal import CHANGE_MESSAGE_IDS
from gpuwhy.store.queries import incident_detail, list_incidents

from .conftest import UUID0, Harness, S

TRAINER = ProcessKey(4242, 1000)
BASE_URL = "http://gpu-host.example:8000"


def lost_gpu(h) -> int:
    """A busy GPU falls off the bus: one open gpu_lost incident; its id."""
    h.feed(h.gpu(0), h.process(0.1, TRAINER, "python3"), h.opened(0.2, TRAINER),
           h.sample(0.5, 95.0))
    record = h.xid(1.0, 79, pid=TRAINER.pid, name="python3")
    line = "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python3, GPU has fallen off the bus."
    h.feed(type(record)(**{**record.__dict__, "line": line, "message": line[6:]}))
    [lost] = list_incidents(h.db)
    assert (lost["kind"], lost["state"]) == ("gpu_lost", lc.OPEN)
    return lost["id"]


@pytest.fixture
def harness(tmp_config):
    """Events of ten minutes ago, as on a host: operators act after the incident opened."""
    made = Harness(tmp_config, (now_ns() - 600 * S) // S * S)
    yield made
    made.close()


@pytest.fixture
def journal(monkeypatch):
    """The journal at its boundary: every entry sent, as (MESSAGE, fields)."""
    sent: list[tuple[str, dict]] = []

    def send(message, **fields):
        sent.append((message, fields))

    monkeypatch.setattr("gpuwhy.journal.journal_sender", lambda: send)
    return sent


def gpuwhy(h, *args, env=None):
    return CliRunner().invoke(cli, list(args), env={"GPUWHY_DB": h.config["store.path"],
                                                    "GPUWHY_URL": BASE_URL, **(env or {})})


def ok(result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def current(h, incident_id):
    return incident_detail(h.db, incident_id)


def test_ack_note_resolve_change_the_incident_and_write_each_to_the_journal(harness, journal):
    h = harness
    lost = lost_gpu(h)
    out = ok(gpuwhy(h, "incident", str(lost), "ack", "draining", "the", "node", "--by", "alice"))
    assert out == f"incident {lost} acknowledged by alice; it is acknowledged\n"
    detail = current(h, lost)
    assert (detail["state"], detail["acknowledged_by"]) == (lc.ACKNOWLEDGED, "alice")
    # the default name: the user behind sudo
    out = ok(gpuwhy(h, "incident", str(lost), "note", "RMA ticket 77",
                    env={"SUDO_USER": "carol"}))
    assert out == f"incident {lost} noted by carol; it is acknowledged\n"
    out = ok(gpuwhy(h, "incident", str(lost), "resolve", "GPU replaced", "--by", "alice"))
    assert out == f"incident {lost} resolved (operator) by alice; it is resolved\n"
    detail = current(h, lost)
    assert (detail["state"], detail["resolution"]) == (lc.RESOLVED, lc.OPERATOR)
    assert [(r["action"], r["actor"], r["text"]) for r in detail["log"]] == [
        ("opened", "gpuwhy", None), ("acknowledged", "alice", "draining the node"),
        ("note", "carol", "RMA ticket 77"), ("resolved", "alice", "GPU replaced")]
    # one journal entry per change, with the incident's fields and the change's
    assert [m for m, _ in journal] == [
        f"gpuwhy incident {lost} acknowledged by alice: draining the node",
        f"gpuwhy incident {lost} noted by carol: RMA ticket 77",
        f"gpuwhy incident {lost} resolved (operator) by alice: GPU replaced"]
    ids = [f["MESSAGE_ID"] for _, f in journal]
    assert ids == [CHANGE_MESSAGE_IDS[a] for a in (lc.ACKNOWLEDGE, lc.NOTE, lc.RESOLVE)]
    for (_, fields), state in zip(journal, ("acknowledged", "acknowledged", "resolved"),
                                  strict=True):
        assert fields["GPUWHY_INCIDENT_ID"] == str(lost) and fields["GPU_ID"] == UUID0
        assert fields["GPUWHY_KIND"] == "gpu_lost" and fields["GPUWHY_STATE"] == state
        assert fields["GPUWHY_URL"] == f"{BASE_URL}/incidents/{lost}"
        assert fields["SYSLOG_IDENTIFIER"] == "gpuwhy" and fields["PRIORITY"] == "5"
    assert [(f["GPUWHY_CHANGE"], f["GPUWHY_ACTOR"], f["GPUWHY_NOTE"]) for _, f in journal] == [
        ("acknowledged", "alice", "draining the node"), ("note", "carol", "RMA ticket 77"),
        ("resolved", "alice", "GPU replaced")]
    assert journal[-1][1]["GPUWHY_RESOLUTION"] == "operator"


def test_the_incident_shows_its_state_and_log_escaped(harness, journal):
    h = harness
    lost = lost_gpu(h)
    ok(gpuwhy(h, "incident", str(lost), "ack", "--by", "ali\x1b[31mce"))
    ok(gpuwhy(h, "incident", str(lost), "note", "see \x1b]0;owned\x07 here", "--by", "bob"))
    text = ok(gpuwhy(h, "incident", str(lost)))
    assert "\x1b" not in text and "\x07" not in text
    assert "  state    acknowledged, acknowledged by ali\\x1b[31mce at " in text
    log = text[text.index("  log:\n"):].splitlines()
    assert log[1].endswith("opened by gpuwhy")
    assert log[2].endswith("acknowledged by ali\\x1b[31mce")
    assert log[3].endswith("note by bob: see \\x1b]0;owned\\x07 here")
    ok(gpuwhy(h, "incident", str(lost), "resolve", "--by", "bob"))
    text = ok(gpuwhy(h, "incident", str(lost)))
    assert "  state    resolved (operator), acknowledged by " in text
    assert text.splitlines()[-1].endswith("resolved (operator) by bob")
    body = json.loads(ok(gpuwhy(h, "incident", str(lost), "--json")))
    assert [r["action"] for r in body["log"]] == ["opened", "acknowledged", "note", "resolved"]


def test_changes_the_state_does_not_allow_are_clean_errors(harness, journal):
    h = harness
    lost = lost_gpu(h)
    for args, message in [
            (["999", "note", "x"], "no incident 999"),
            ([str(lost), "note"], "a note needs some text"),
            ([str(lost), "note", "x" * (lc.NOTE_MAX + 1)], f"at most {lc.NOTE_MAX}"),
            ([str(lost), "ack", "--by", "n" * (lc.ACTOR_MAX + 1)], f"at most {lc.ACTOR_MAX}")]:
        result = gpuwhy(h, "incident", *args)
        assert result.exit_code == 1 and message in result.stderr, (args, result.output)
        assert "Traceback" not in result.output
    ok(gpuwhy(h, "incident", str(lost), "resolve", "--by", "alice"))
    again = gpuwhy(h, "incident", str(lost), "ack", "--by", "bob")
    assert again.exit_code == 1 and "is resolved: nothing to acknowledge" in again.stderr
    twice = gpuwhy(h, "incident", str(lost), "resolve")
    assert twice.exit_code == 1 and "resolved already" in twice.stderr
    unknown = gpuwhy(h, "incident", str(lost), "close")
    assert unknown.exit_code == 2 and "ack" in unknown.stderr
    assert [r["action"] for r in current(h, lost)["log"]] == ["opened", "resolved"]
    assert len(journal) == 1


def test_the_default_name_is_the_login_name_without_sudo(harness, journal):
    h = harness
    lost = lost_gpu(h)
    out = ok(gpuwhy(h, "incident", str(lost), "note", "hello", env={"SUDO_USER": None}))
    assert out.startswith(f"incident {lost} noted by {getpass.getuser()};")
    assert journal[0][1]["GPUWHY_ACTOR"] == getpass.getuser()


@pytest.mark.parametrize("journal_down", ["not installed", "no socket"])
def test_without_the_journal_the_change_stands_with_a_warning(harness, monkeypatch,
                                                              journal_down):
    h = harness
    lost = lost_gpu(h)

    def refuse(message, **fields):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr("gpuwhy.journal.journal_sender",
                        lambda: None if journal_down == "not installed" else refuse)
    result = gpuwhy(h, "incident", str(lost), "ack", "--by", "alice")
    assert result.exit_code == 0, result.output
    assert result.stdout == f"incident {lost} acknowledged by alice; it is acknowledged\n"
    assert "the change is stored, but its journal entry was not written" in result.stderr
    assert current(h, lost)["state"] == lc.ACKNOWLEDGED
    body = json.loads(ok(gpuwhy(h, "incident", str(lost), "note", "x", "--json")))
    assert body["journal"] and body["action"] == "note" and body["state"] == "acknowledged"


def test_incidents_filter_by_state_and_show_it_whole(harness, journal):
    h = harness
    lost = lost_gpu(h)
    h.feed(h.xid(2.0, 48, pci="0000:19:00"))        # a second incident, on no known GPU
    ids = {i["kind"]: i["id"] for i in list_incidents(h.db)}
    ok(gpuwhy(h, "incident", str(lost), "ack", "--by", "alice"))

    def listed(*args):
        header, *lines = ok(gpuwhy(h, "incidents", *args)).splitlines()
        assert header.split()[:5] == ["id", "opened", "severity", "state", "kind"]
        return {int(line.split()[0]): line for line in lines}

    every = listed()
    assert set(every) == {lost, ids["xid"]}
    assert re.search(r" acknowledged +gpu_lost ", every[lost])          # the column holds the word
    assert re.search(r" open +xid ", every[ids["xid"]])
    assert set(listed("--state", "acknowledged")) == {lost}
    assert set(listed("--state", "open")) == {ids["xid"]}
    assert set(listed("--state", "active")) == {lost, ids["xid"]}
    assert ok(gpuwhy(h, "incidents", "--state", "resolved")) == "no incidents\n"
    ok(gpuwhy(h, "incident", str(ids["xid"]), "resolve", "--by", "alice"))
    resolved = listed("--state", "resolved")
    assert set(resolved) == {ids["xid"]} and re.search(r" resolved +xid ", resolved[ids["xid"]])
    as_json = json.loads(ok(gpuwhy(h, "incidents", "--state", "active", "--json")))
    assert [(i["id"], i["state"], i["acknowledged_by"]) for i in as_json] == [
        (lost, "acknowledged", "alice")]
    bad = gpuwhy(h, "incidents", "--state", "closed")
    assert bad.exit_code == 2


def test_a_missing_store_is_not_created(harness, tmp_path, journal):
    missing = tmp_path / "nowhere" / "gpuwhy.db"
    result = CliRunner().invoke(cli, ["incident", "1", "ack"], env={"GPUWHY_DB": str(missing)})
    assert result.exit_code == 1 and f"no store at {missing}" in result.stderr
    assert not missing.parent.exists()


def _as_nobody(args, store: Path):
    """The CLI in a process of its own as the unprivileged user nobody (uid 65534)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8", "GPUWHY_DB": str(store)}
    return subprocess.run([sys.executable, "-m", "gpuwhy", *args], env=env, user=65534,
                          group=65534, extra_groups=[], capture_output=True, text=True,
                          timeout=60, cwd="/")


def test_a_store_the_user_may_not_write_is_one_clear_error(harness, tmp_path, journal):
    """The real case: the service (root) owns the store; an operator without write access
    runs the command. As root this runs the CLI as nobody (chmod does not stop root); as
    another user the store's folder and file are made read-only for that user."""
    h = harness
    lost = lost_gpu(h)
    if os.geteuid() == 0:
        shared = Path(tempfile.mkdtemp(prefix="gpuwhy-ro-", dir="/tmp"))
        try:
            shared.chmod(0o755)
            store = shared / "gpuwhy.db"
            with sqlite3.connect(store) as copy:
                h.db.conn.backup(copy)
            copy.close()
            store.chmod(0o644)                      # root's, readable by all
            result = _as_nobody(["incident", str(lost), "ack", "mine"], store)
            assert result.returncode == 1, (result.stdout, result.stderr)
            assert "Traceback" not in result.stderr
            assert f"the store {store} is not writable by nobody (no write permission)" \
                in result.stderr
            assert "sudo" in result.stderr and result.stdout == ""
            with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as check:
                assert check.execute("select state from incidents where id = ?",
                                     [lost]).fetchone() == ("open",)
            check.close()
        finally:
            shutil.rmtree(shared)
    else:
        store = Path(h.config["store.path"])
        folder = store.parent
        h.db.execute("pragma wal_checkpoint(truncate)")
        store.chmod(0o444)
        folder.chmod(0o555)
        try:
            result = gpuwhy(h, "incident", str(lost), "ack", "mine")
        finally:
            folder.chmod(0o755)
            store.chmod(0o644)
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert f"the store {store} is not writable by" in result.stderr
        assert current(h, lost)["state"] == lc.OPEN
    assert journal == []
