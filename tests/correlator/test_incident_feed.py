"""The incident feed (`/api/incidents?since=CURSOR`, store/feed.py) over incidents written by
the real correlator and lifecycle code: every change once, in order, paged, across restarts
of the web view and after retention deleted the newest rows; JSON and JSON lines; the API's
auth. And the migration that made its cursor AUTOINCREMENT keeps the log's rows and ids."""

import json
import sqlite3

import pytest
from sqlite_utils import Database

from gpuwhy.config import load_config
from gpuwhy.identity import ProcessKey
from gpuwhy.store import feed, open_store
from gpuwhy.store import incident_changes as store_lifecycle
from gpuwhy.store.migrations import migrations
from gpuwhy.store.queries import list_incidents
from gpuwhy.store.retention import Windows, prune
from gpuwhy.webui import create_app

from .conftest import UUID0

UUID1 = "GPU-00000000-1111-2222-3333-555555555555"
TRAINER = ProcessKey(4242, 1000)
TOKEN = "s3cret-token-for-the-feed"


def incidents_with_history(h):
    """Two GPUs; an Xid 79 on one (opened, acknowledged, noted, resolved), an Xid 31 on
    the other (opened): the log as the correlator and an operator write it."""
    h.feed(h.gpu(0), h.gpu(0, uuid=UUID1, minor=1, pci="0000:19:00.0"),
           h.process(0.1, TRAINER, "python3"), h.opened(0.2, TRAINER),
           h.sample(0.5, 95.0), h.sample(0.5, 90.0, uuid=UUID1))
    h.feed(h.xid(1.0, 79, pid=TRAINER.pid, name="python3"))
    h.feed(h.xid(2.0, 31, pci="0000:19:00"))
    lost = next(i for i in list_incidents(h.db) if i["kind"] == "gpu_lost")
    store_lifecycle.acknowledge(h.db, lost["id"], "alice", "draining", ts=h.at(5))
    store_lifecycle.note(h.db, lost["id"], "bob", "RMA <b>77</b>", ts=h.at(6))
    store_lifecycle.resolve(h.db, lost["id"], "alice", text="replaced", ts=h.at(7))
    return lost["id"]


def all_log_rows(db):
    return db.execute("select id, incident_id, action from incident_log order by id").fetchall()


def test_the_feed_has_every_change_once_in_order_and_pages(harness):
    lost = incidents_with_history(harness)
    changes = feed.incident_changes(harness.db, 0)
    assert [(c["cursor"], c["incident"]["id"], c["action"]) for c in changes] == \
        all_log_rows(harness.db)
    cursors = [c["cursor"] for c in changes]
    assert cursors == sorted(set(cursors))
    lost_changes = [(c["action"], c["state"]) for c in changes if c["incident"]["id"] == lost]
    assert lost_changes == [("opened", "open"), ("acknowledged", "acknowledged"),
                            ("note", "acknowledged"), ("resolved", "resolved")]
    assert any(c["incident"]["kind"] == "xid" and c["action"] == "opened" for c in changes)
    first = next(c for c in changes if c["incident"]["id"] == lost)
    assert (first["incident"]["gpu_uuid"], first["incident"]["state"]) == (UUID0, "resolved")
    # pages of two give the same changes, each once
    paged, at = [], 0
    while page := feed.incident_changes(harness.db, at, limit=2):
        assert len(page) <= 2
        paged += page
        at = page[-1]["cursor"]
    assert paged == changes
    assert feed.incident_changes(harness.db, cursors[-1]) == []
    assert feed.latest_cursor(harness.db) == cursors[-1]


def test_the_cursor_never_goes_back_after_retention_deleted_the_newest_rows(harness):
    lost = incidents_with_history(harness)
    xid = next(i["id"] for i in list_incidents(harness.db) if i["id"] != lost)
    store_lifecycle.resolve(harness.db, xid, "alice", ts=harness.at(8))
    newest = feed.latest_cursor(harness.db)
    # every incident is resolved and long past the event window: retention deletes them all
    deleted = prune(harness.db, Windows(raw_days=7, rollup_days=90, event_days=0.0),
                    harness.at(10 * 86400))
    assert deleted.deleted.get("incidents", 0) >= 2, deleted
    assert all_log_rows(harness.db) == [] and list_incidents(harness.db, effects=True) == []
    harness.feed(harness.xid(20.0, 31, pci="0000:19:00"))
    changes = feed.incident_changes(harness.db, newest)
    assert changes and changes[0]["action"] == "opened"
    assert all(c["cursor"] > newest for c in changes)


def test_the_migration_keeps_the_log_and_its_ids_and_makes_them_autoincrement(tmp_path):
    path = tmp_path / "old.db"
    old = Database(sqlite3.connect(path))
    migrations.apply(old, stop_before="m110_incident_feed")
    old["incidents"].insert({"id": 1, "opened_at": 10, "kind": "xid", "state": "open"})
    old["incident_log"].insert_all([{"id": 3, "incident_id": 1, "ts": 10, "action": "opened"},
                                    {"id": 9, "incident_id": 1, "ts": 11, "action": "note",
                                     "text": "kept"}])
    old.close()
    db = open_store(path)
    assert not migrations.pending(db)
    assert "AUTOINCREMENT" in db["incident_log"].schema
    assert [(c["cursor"], c["action"], c["text"]) for c in feed.incident_changes(db, 0)] == \
        [(3, "opened", None), (9, "note", "kept")]
    db.execute("delete from incident_log where id = 9")
    new_id = store_lifecycle.log_change(db, 1, "note", 12, "x", text="after")
    assert new_id == 10 and feed.latest_cursor(db) == 10
    assert db["incident_log"].indexes[0].columns == ["incident_id", "ts"]
    db.close()


def _app(config, **environ):
    store = {"GPUWHY_DB": config["store.path"], **environ}
    return create_app(load_config(environ=store), {"TESTING": True})


def test_the_api_feed_in_json_and_json_lines_across_web_view_restarts(harness):
    incidents_with_history(harness)
    expected = feed.incident_changes(harness.db, 0)
    client = _app(harness.config).test_client()
    answer = client.get("/api/incidents?since=0&limit=3")
    assert answer.status_code == 200 and answer.mimetype == "application/json"
    page = answer.get_json()
    assert page["changes"] == expected[:3]
    assert (page["next"], page["more"], page["latest"]) == \
        (expected[2]["cursor"], True, expected[-1]["cursor"])
    assert answer.headers["Gpuwhy-Next-Cursor"] == str(expected[2]["cursor"])
    # a restarted web view (a new app, new connections) goes on from the cursor
    client = _app(harness.config).test_client()
    rest = client.get(f"/api/incidents?since={page['next']}&format=jsonl")
    assert rest.mimetype == "application/x-ndjson"
    lines = [json.loads(line) for line in rest.get_data(as_text=True).splitlines()]
    assert page["changes"] + lines == expected
    assert rest.headers["Gpuwhy-More"] == "false"
    assert rest.headers["Gpuwhy-Next-Cursor"] == str(expected[-1]["cursor"])
    # the note (operator text) comes as JSON text, escaped by the encoder, never as markup
    assert any(line["text"] == "RMA <b>77</b>" for line in lines + page["changes"])
    by_accept = client.get(f"/api/incidents?since={expected[-2]['cursor']}",
                           headers={"Accept": "application/x-ndjson"})
    assert by_accept.mimetype == "application/x-ndjson"
    assert [json.loads(x) for x in by_accept.get_data(as_text=True).splitlines()] == \
        expected[-1:]
    # nothing new: an empty page that keeps the cursor
    empty = client.get(f"/api/incidents?since={expected[-1]['cursor']}").get_json()
    assert (empty["changes"], empty["next"], empty["more"]) == \
        ([], expected[-1]["cursor"], False)
    # a new change shows up after the cursor the poller holds (a new Xid code: its own
    # incident; a repeat of the open Xid 31 would only merge, with no change to show)
    harness.feed(harness.xid(30.0, 13, pci="0000:19:00"))
    newer = client.get(f"/api/incidents?since={expected[-1]['cursor']}").get_json()
    assert [c["cursor"] > expected[-1]["cursor"] for c in newer["changes"]] == \
        [True] * len(newer["changes"]) and newer["changes"]
    # without since, the list of incidents as before
    assert isinstance(client.get("/api/incidents").get_json(), list)


def test_a_full_page_at_the_largest_limit_says_more_follow(harness, monkeypatch):
    """The page reads one change past its limit to say whether more follow: at the largest
    limit too (it was capped there, so a full page of FEED_MAX always said "no more")."""
    incidents_with_history(harness)
    expected = feed.incident_changes(harness.db, 0)
    monkeypatch.setattr(feed, "FEED_MAX", 3)
    page = _app(harness.config).test_client().get("/api/incidents?since=0").get_json()
    assert len(expected) > 3 and page["changes"] == expected[:3] and page["more"] is True


@pytest.mark.parametrize("query", ["since=-1", "since=x", "since=1&limit=0",
                                   "since=1&limit=1001", "since=1&format=xml",
                                   "since=99999999999999999999", "since=%D9%A3"])
def test_bad_feed_arguments_are_refused_with_a_reason(harness, query):
    client = _app(harness.config).test_client()
    answer = client.get(f"/api/incidents?{query}")
    assert answer.status_code == 400
    assert answer.get_json()["error"]


def test_the_feed_asks_for_the_token_as_the_rest_of_the_api(harness):
    incidents_with_history(harness)
    client = _app(harness.config, GPUWHY_AUTH_TOKEN=TOKEN).test_client()
    refused = client.get("/api/incidents?since=0")
    assert refused.status_code == 401 and "changes" not in (refused.get_json() or {})
    assert client.get("/api/incidents?since=0",
                      headers={"Authorization": "Bearer wrong"}).status_code == 401
    allowed = client.get("/api/incidents?since=0", headers={"Authorization": f"Bearer {TOKEN}"})
    assert allowed.status_code == 200
    assert allowed.get_json()["changes"] == feed.incident_changes(harness.db, 0)


def test_the_cli_reads_the_same_feed_as_json_lines_and_as_a_table(harness):
    from click.testing import CliRunner

    from gpuwhy.app.cli import cli

    incidents_with_history(harness)
    env = {"GPUWHY_DB": harness.config["store.path"]}
    everything = feed.incident_changes(harness.db, 0)
    result = CliRunner().invoke(cli, ["incidents", "--after", "0", "--json"], env=env)
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert lines == json.loads(json.dumps(everything))
    # paging with the last cursor printed gives the rest, then nothing
    first = CliRunner().invoke(cli, ["incidents", "--after", "0", "--limit", "2"], env=env)
    assert first.exit_code == 0 and first.output.splitlines()[0].split()[:3] == \
        ["cursor", "time", "action"]
    assert f"next: --after {everything[1]['cursor']}" in first.output
    rest = CliRunner().invoke(cli, ["incidents", "--after", str(everything[1]["cursor"]),
                                    "--json"], env=env)
    assert [json.loads(line)["cursor"] for line in rest.output.splitlines()] == \
        [c["cursor"] for c in everything[2:]]
    last = CliRunner().invoke(cli, ["incidents", "--after", str(everything[-1]["cursor"])],
                              env=env)
    assert last.output.strip() == f"no changes after cursor {everything[-1]['cursor']}"
    # the feed is the whole log: a filter beside it is refused, not silently ignored
    refused = CliRunner().invoke(cli, ["incidents", "--after", "0", "--kind", "xid"], env=env)
    assert refused.exit_code == 2 and "--after reads the whole feed" in refused.output
    assert CliRunner().invoke(cli, ["incidents", "--after", "-1"], env=env).exit_code == 2
