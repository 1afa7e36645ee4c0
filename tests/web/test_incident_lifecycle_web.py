"""Acknowledge, resolve and note an incident from the web view (forms and JSON), on a store the
real correlator filled: only with the configured token, each change in the incident's state
and log (shown escaped) and in the journal (the sender stubbed at
gpuwhy.journal.journal_sender); without a token the page says how to change it instead."""

import re

import pytest

from gpuwhy.journal import CHANGE_MESSAGE_IDS
from gpuwhy.store import open_store
from gpuwhy.store.queries import incident_detail
from gpuwhy.webui import create_app

from .conftest import TOKEN, build

BEARER = {"Authorization": f"Bearer {TOKEN}"}
HOSTILE = "<script>alert('note')</script><img src=x onerror=alert(1)>"
BASE_URL = "http://gpu-host.example:8000"


@pytest.fixture
def fresh(tmp_path):
    """Its own store: these tests change incidents."""
    return build(tmp_path)


@pytest.fixture
def journal(monkeypatch):
    sent: list[tuple[str, dict]] = []

    def send(message, **fields):
        sent.append((message, fields))

    monkeypatch.setattr("gpuwhy.journal.journal_sender", lambda: send)
    return sent


def app_for(scenario, **settings):
    return create_app(scenario.config.replace({"correlator.url": BASE_URL, **settings}),
                      {"TESTING": True})


def stored(scenario, incident_id):
    db = open_store(scenario.path, readonly=True)
    try:
        return incident_detail(db, incident_id)
    finally:
        db.close()


def the(client, kind, headers=BEARER):
    return next(i["id"] for i in client.get("/api/incidents", headers=headers).get_json()
                if i["kind"] == kind)


def html(client, url, headers=BEARER):
    response = client.get(url, headers=headers)
    assert response.status_code == 200, response.data[:300]
    return response.get_data(as_text=True)


def forms(page):
    return re.findall(r'<form method="post" action="([^"]+)"[^>]*id="([a-z]+)-form"', page)


def test_with_the_token_the_forms_change_the_incident_and_show_its_log(fresh, journal):
    client = app_for(fresh).test_client()
    reset = the(client, "gpu_reset")
    page = html(client, f"/incidents/{reset}")
    assert forms(page) == [(f"/incidents/{reset}/ack", "ack"),
                           (f"/incidents/{reset}/resolve", "resolve"),
                           (f"/incidents/{reset}/note", "note")]
    assert page.count('name="token"') == 3 and 'id="change-hint"' not in page
    assert 'data-state="open"' in page
    response = client.post(f"/incidents/{reset}/ack", headers=BEARER, data={
        "by": "alice", "text": HOSTILE, "token": TOKEN})
    assert response.status_code == 303
    assert response.location == f"/incidents/{reset}?changed=ack#log"
    page = html(client, response.location)
    assert 'data-state="acknowledged"' in page and "acknowledged by <b>alice</b>" in page
    assert "Acknowledged; the change is in the log below and in the journal." in page
    assert "&lt;script&gt;alert(&#39;note&#39;)&lt;/script&gt;&lt;img src=x" in page
    assert "<script>" not in page and "<img src=x" not in page    # its scripts: files only
    assert [name for _, name in forms(page)] == ["resolve", "note"]   # acknowledged now
    # no name given: the client's address
    assert client.post(f"/incidents/{reset}/note", headers=BEARER, data={
        "by": " ", "text": "RMA ticket 77", "token": TOKEN}).status_code == 303
    assert client.post(f"/incidents/{reset}/resolve", headers=BEARER, data={
        "by": "bob", "text": "", "token": TOKEN}).status_code == 303
    page = html(client, f"/incidents/{reset}")
    assert 'data-state="resolved"' in page and "<b>resolved</b> (operator)" in page
    assert [name for _, name in forms(page)] == ["note"]
    rows = re.findall(r'<tr data-action="([a-z]+)">', page)
    assert rows == ["opened", "acknowledged", "note", "resolved"]
    log = stored(fresh, reset)["log"]
    assert [(r["action"], r["actor"], r["text"]) for r in log] == [
        ("opened", "gpuwhy", None), ("acknowledged", "alice", HOSTILE),
        ("note", "web 127.0.0.1", "RMA ticket 77"), ("resolved", "bob", None)]
    assert [(f["MESSAGE_ID"], f["GPUWHY_INCIDENT_ID"], f["GPUWHY_ACTOR"], f["GPUWHY_STATE"])
            for _, f in journal] == [
        (CHANGE_MESSAGE_IDS["acknowledged"], str(reset), "alice", "acknowledged"),
        (CHANGE_MESSAGE_IDS["note"], str(reset), "web 127.0.0.1", "acknowledged"),
        (CHANGE_MESSAGE_IDS["resolved"], str(reset), "bob", "resolved")]
    assert all(f["GPUWHY_URL"] == f"{BASE_URL}/incidents/{reset}" for _, f in journal)
    assert journal[0][1]["GPUWHY_NOTE"] == HOSTILE          # the journal keeps it as text
    report = html(client, f"/incidents/{reset}/report")
    assert "resolved (operator), acknowledged by alice" in report
    assert "&lt;script&gt;alert(&#39;note&#39;)" in report and "<script" not in report


def test_the_api_changes_incidents_and_answers_json(fresh, journal):
    client = app_for(fresh).test_client()
    reset = the(client, "gpu_reset")
    ack = client.post(f"/api/incidents/{reset}/ack", headers=BEARER,
                      json={"by": "alice", "text": "mine"})
    assert ack.status_code == 200
    body = ack.get_json()
    assert (body["id"], body["action"], body["state"], body["journal"]) == (
        reset, "acknowledged", "acknowledged", None)
    assert body["log_id"] == stored(fresh, reset)["log"][-1]["id"]
    again = client.post(f"/api/incidents/{reset}/ack", headers=BEARER, json={"by": "bob"})
    assert again.status_code == 400 and "acknowledged already" in again.get_json()["error"]
    empty = client.post(f"/api/incidents/{reset}/note", headers=BEARER, json={"by": "bob"})
    assert empty.status_code == 400 and "needs some text" in empty.get_json()["error"]
    long = client.post(f"/api/incidents/{reset}/note", headers=BEARER,
                       json={"by": "x" * 129, "text": "hi"})
    assert long.status_code == 400 and "at most 128" in long.get_json()["error"]
    wrong = client.post(f"/api/incidents/{reset}/note", headers=BEARER, json=["text"])
    assert wrong.status_code == 400 and "error" in wrong.get_json()
    assert client.post(f"/api/incidents/{reset}/note", headers=BEARER,
                       json={"text": 5}).status_code == 400
    missing = client.post("/api/incidents/9999/note", headers=BEARER, json={"text": "x"})
    assert missing.status_code == 404 and "no incident 9999" in missing.get_json()["error"]
    assert client.post(f"/api/incidents/{reset}/close", headers=BEARER,
                       json={}).status_code in (404, 405)
    note = client.post(f"/api/incidents/{reset}/note", headers=BEARER, json={"text": "x"})
    assert note.get_json()["action"] == "note"
    done = client.post(f"/api/incidents/{reset}/resolve", headers=BEARER,
                       json={"by": "alice", "text": "GPU replaced"}).get_json()
    assert (done["state"], done["resolution"]) == ("resolved", "operator")
    shown = client.get(f"/api/incidents/{reset}", headers=BEARER).get_json()
    assert (shown["state"], shown["resolution"], shown["acknowledged_by"]) == (
        "resolved", "operator", "alice")
    assert [(r["action"], r["actor"]) for r in shown["log"]] == [
        ("opened", "gpuwhy"), ("acknowledged", "alice"), ("note", "web 127.0.0.1"),
        ("resolved", "alice")]
    xid = the(client, "xid")                   # timed out: resolved already
    late = client.post(f"/api/incidents/{xid}/ack", headers=BEARER, json={"by": "a"})
    assert late.status_code == 400 and "is resolved" in late.get_json()["error"]
    assert len(journal) == 3


def test_without_a_configured_token_the_page_says_how_and_changes_are_refused(fresh,
                                                                              journal):
    client = app_for(fresh, **{"web.auth_token": ""}).test_client()
    reset = the(client, "gpu_reset", headers={})
    page = html(client, f"/incidents/{reset}", headers={})
    assert forms(page) == [] and 'name="token"' not in page
    assert 'id="change-hint"' in page and "<code>GPUWHY_AUTH_TOKEN</code>" in page
    assert f"<code>gpuwhy incident {reset} ack [TEXT]</code>" in page
    form = client.post(f"/incidents/{reset}/ack", data={"by": "a", "token": ""})
    assert form.status_code == 403 and b"GPUWHY_AUTH_TOKEN" in form.data
    api = client.post(f"/api/incidents/{reset}/note", json={"text": "x"},
                      headers={"Authorization": "Bearer anything"})
    assert api.status_code == 403 and "GPUWHY_AUTH_TOKEN" in api.get_json()["error"]
    assert [r["action"] for r in stored(fresh, reset)["log"]] == ["opened"]
    assert journal == []


def test_a_wrong_or_missing_token_is_refused(fresh, journal):
    client = app_for(fresh).test_client()
    reset = the(client, "gpu_reset")
    assert client.post(f"/incidents/{reset}/ack", data={"by": "a"}).status_code in (302, 401)
    client.post("/login", data={"token": TOKEN})              # a session cookie ...
    assert client.post(f"/incidents/{reset}/ack",
                       data={"by": "a"}).status_code == 401  # ... is not enough to change
    assert client.post(f"/incidents/{reset}/ack",
                       data={"by": "a", "token": "nope"}).status_code == 401
    assert client.post(f"/api/incidents/{reset}/ack", json={},
                       headers={"Authorization": "Bearer nope"}).status_code == 401
    assert [r["action"] for r in stored(fresh, reset)["log"]] == ["opened"]
    assert journal == []


def test_without_the_journal_the_change_stands_and_the_page_says_so(fresh, monkeypatch):
    monkeypatch.setattr("gpuwhy.journal.journal_sender", lambda: None)
    client = app_for(fresh).test_client()
    reset = the(client, "gpu_reset")
    response = client.post(f"/incidents/{reset}/note", headers=BEARER,
                           data={"by": "a", "text": "hi", "token": TOKEN})
    assert response.status_code == 303 and "journal=unwritten" in response.location
    assert "its journal entry was not written" in html(client, response.location)
    api = client.post(f"/api/incidents/{reset}/note", headers=BEARER, json={"text": "again"})
    assert api.status_code == 200 and "systemd-python" in api.get_json()["journal"]
    assert [r["action"] for r in stored(fresh, reset)["log"]] == ["opened", "note", "note"]


def test_the_list_filters_by_lifecycle_state(fresh, journal):
    client = app_for(fresh).test_client()
    reset, finding = the(client, "gpu_reset"), the(client, "rule_finding")
    page = html(client, "/incidents")
    options = re.findall(r'<option value="(open|acknowledged|resolved|active|closed)"', page)
    assert options == ["open", "acknowledged", "resolved", "active"]
    client.post(f"/api/incidents/{reset}/ack", headers=BEARER, json={"by": "alice"})

    def kinds(state):
        return {i["kind"] for i in client.get(f"/api/incidents?state={state}",
                                              headers=BEARER).get_json()}

    assert kinds("acknowledged") == {"gpu_reset"}
    assert kinds("open") == {"rule_finding"}
    assert kinds("active") == {"gpu_reset", "rule_finding"}
    assert kinds("resolved") == kinds("closed") == {"xid"}     # an old link still works
    page = html(client, "/incidents?state=acknowledged")
    assert '<option value="acknowledged" selected>' in page
    assert "<td>acknowledged by alice</td>" in page and f'/incidents/{finding}"' not in page
    page = html(client, "/incidents?state=resolved")
    assert "<td>resolved (timeout)</td>" in page


@pytest.mark.browser
def test_a_browser_notes_an_incident_and_hostile_text_stays_text(fresh, journal):
    """Chromium fills the note form: the page comes back with the note shown as text, no
    dialog opened, no console error, no failed request."""
    import threading
    from pathlib import Path

    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from .conftest import ARGS, CHROMIUM

    assert Path(CHROMIUM).exists(), "install Debian's chromium (scripts/setup.sh does)"
    server = make_server("127.0.0.1", 0, app_for(fresh), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}"
    problems, dialogs = [], []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            context = browser.new_context(extra_http_headers=BEARER)
            page = context.new_page()
            page.on("console", lambda m: m.type == "error" and problems.append(m.text))
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            reset = next(i["id"] for i in page.request.get(f"{url}/api/incidents").json()
                         if i["kind"] == "gpu_reset")
            page.goto(f"{url}/incidents/{reset}", wait_until="networkidle")
            page.fill("#note-form input[name=by]", "alice")
            page.fill("#note-form input[name=text]", HOSTILE)
            page.fill("#note-form input[name=token]", TOKEN)
            with page.expect_navigation():
                page.click("#note-form button[type=submit]")
            page.wait_for_load_state("networkidle")
            assert page.url.endswith(f"/incidents/{reset}?changed=note#log")
            assert page.inner_text("#incident-log tr[data-action=note] td.detail") == HOSTILE
            assert page.locator("#incident-log img").count() == 0
            browser.close()
    finally:
        server.shutdown()
        thread.join(5)
    assert problems == [] and dialogs == []
    assert [f["GPUWHY_NOTE"] for _, f in journal] == [HOSTILE]
