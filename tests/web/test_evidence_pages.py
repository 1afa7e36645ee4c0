"""Evidence and events on the pages, over the simulator scenario plus, in a copy of its store,
a MIG instance's rule finding about the eval process and 120 more of its driver calls: the
incident chain's evidence links every incident, process and GPU to its page at that moment
and shows no raw JSON; the process page's findings name their MIG instance; its event list
comes a page at a time (newest first, "1–50 of N", newer/older links, the page of ``at``);
every time a <time> with its instant in UTC."""

from __future__ import annotations

import re
import shutil

import pytest

from gpuwhy.config import load_config
from gpuwhy.events import DriverCall, RuleFinding
from gpuwhy.text import format_ts
from gpuwhy.webui import create_app

from .conftest import EVIL_NAME, OTHER, TOKEN, arrive

CALLS = 120                     # the eval process's driver calls added to the scenario's 2 events
GET_INFO = 0x20800110


@pytest.fixture(scope="module")
def store(scenario, tmp_path_factory):
    """The scenario's store copied, with the MIG finding and the driver calls played in
    through the real correlator."""
    directory = tmp_path_factory.mktemp("evidence-pages")
    path = directory / "gpuwhy.db"
    shutil.copy(scenario.path, path)
    config = load_config(environ={"GPUWHY_DB": str(path), "GPUWHY_AUTH_TOKEN": TOKEN,
                                  "GPUWHY_BUS": f"ipc://{directory}/bus.sock"})

    events = [DriverCall(ts=scenario.at(540 + i / 4), process=OTHER, tid=OTHER.pid, fd=5,
                         path="/dev/nvidia1", device="nvidiaN", cmd=0xC020462A, nr=0x2A,
                         size=32, op="NV_ESC_RM_CONTROL", latency_ns=5000, ret=0x1F,
                         sub=GET_INFO, sub_name="NV2080_CTRL_CMD_GPU_GET_INFO",
                         reasons=["failed"]) for i in range(CALLS)]
    events.append(RuleFinding(
        ts=scenario.at(590), finding_id="R47:mig9", rule_id="R47_mig_instance_allocated_but_idle",
        title="MIG instance allocated but idle", severity="warning", state="firing",
        gpu_id=scenario.gpu_ids[1], process=OTHER, window_start=scenario.at(530),
        window_end=scenario.at(590), since=scenario.at(560),
        evidence={"idle_share_hour": 0.93, "fb_used_mib": 4096, "note": EVIL_NAME},
        root_cause="The instance holds memory and does no work.",
        fixes=["Release the instance", "Give it work"], verify="busy share above 0.2",
        instance="9", mig_profile="1g.10gb"))
    arrive(config, events, config["bus.endpoint"], event_time=True)
    return config


@pytest.fixture
def client(store):
    client = create_app(store, {"TESTING": True}).test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {TOKEN}"
    return client


def page(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.data[:300])
    return response.get_data(as_text=True)


def incident_with(client, kind: str) -> dict:
    for listed in client.get("/api/incidents?effects=1").get_json():
        detail = client.get(f"/api/incidents/{listed['id']}").get_json()
        if any(link["kind"] == kind for link in detail["chain"]):
            return detail
    raise AssertionError(f"no incident with a {kind} link")


def evidence_tables(html: str) -> str:
    """The chain's evidence tables (nested ones inside), one string."""
    chain = html[html.index('<ol id="chain"'):]
    return "".join(re.findall(r'<table class="evidence">.*?</table>\s*</li>',
                              chain[:chain.index("</ol>")], re.S))


def test_the_reset_chain_links_every_incident_process_and_gpu_at_that_moment(client, scenario):
    reset = incident_with(client, "driver_call")
    html = page(client, f"/incidents/{reset['id']}")
    tables = evidence_tables(html)
    step = {link["kind"]: link for link in reset["chain"]}
    at = step["gpu_reset"]["ts"]
    # the reset's own evidence: its incident, and the pid + start time as one process
    assert f'<a href="/incidents/{reset["id"]}">incident {reset["id"]}</a>' in tables
    assert f'<a href="/processes/301-2001?at={at}">process 301-2001</a>' in tables
    # the stored driver call opens the caller's event list at that moment
    assert f'href="/processes/301-2001?at={step["driver_call"]["ts"]}#events">#' in tables
    # the stall, an effect: its incident linked
    stall = step["process_stall"]["evidence"]["incident"]
    assert f'<a href="/incidents/{stall}">incident {stall}</a>' in tables
    assert f'/gpus/{scenario.gpu_ids[0]}?at={at}&amp;range=15m' in html
    assert "cron-1" in tables and "[" not in tables and "&#34;" not in tables


def test_a_findings_chain_shows_measures_with_units_fixes_as_text_and_its_mig_instance(client):
    finding = next(i for i in client.get("/api/incidents?effects=1").get_json()
                   if "MIG instance 9" in i["title"])
    html = page(client, f"/incidents/{finding['id']}")
    tables = evidence_tables(html)
    assert '<tr data-key="instance"><th>MIG instance</th><td>MIG instance 9 (1g.10gb)</td>' \
        in tables
    assert "<td>93%</td>" in tables and "<td>4,096 MiB</td>" in tables
    assert '<ul class="lines"><li>Release the instance</li><li>Give it work</li></ul>' in tables
    assert "&lt;img src=x onerror=alert(1)&gt;" in tables and "<img" not in html
    assert f'href="/processes/{OTHER}?at=' in tables
    assert "[" not in tables and "&#34;" not in tables and "\\u" not in tables
    # the held-since sentence and every other time: an instant, in UTC
    since = re.search(r"condition held since <time datetime=\"[^\"]+Z\" data-ns=\"(\d+)\">"
                      r"([^<]+)</time>", html)
    assert since and since[2] == format_ts(int(since[1]), utc=True)
    assert not re.search(r"\d{2}:\d{2}:\d{2}\.\d{3} (?!UTC)[A-Z+-]", html)


def test_the_process_page_finding_names_its_mig_instance_and_links_its_gpu(client, scenario):
    html = page(client, f"/processes/{OTHER}")
    finding = html[html.index("<h2>Rule findings</h2>"):html.index("<h2>Driver calls")]
    assert '<span class="mig-instance">MIG instance 9 (1g.10gb)</span>' in finding
    assert f'<a href="/gpus/{scenario.gpu_ids[1]}?at=' in finding
    assert "<td>93%</td>" in finding and "idle_share_hour" in finding
    assert "&lt;img src=x onerror=alert(1)&gt;" in finding


def pager(html: str) -> tuple[str, dict[str, str]]:
    first = re.search(r'<p class="small pager">(.*?)</p>', html, re.S)[1]
    links = dict((cls, href.replace("&amp;", "&")) for cls, href in
                 re.findall(r'<a class="(newer|older)" rel="(?:prev|next)" href="([^"]+)"', first))
    return re.sub(r"<[^>]+>|\s+", " ", first).strip(), links


def event_rows(html: str) -> list[tuple[int, str]]:
    body = html[html.index('<table id="events">'):]
    body = body[:body.index("</table>")]
    return [(int(ns), what) for ns, what in re.findall(
        r'<tr><td class="mono"><time datetime="[^"]+" data-ns="(\d+)">[^<]+</time></td>'
        r"<td>([^<]+)</td>", body)]


def test_the_process_events_come_a_page_at_a_time_newest_first(client):
    total = CALLS + 2                          # its device opened, its Xid line, the calls
    html = page(client, f"/processes/{OTHER}")
    text, links = pager(html)
    assert text.startswith(f"1–50 of {total}, newest first") and set(links) == {"older"}
    rows = event_rows(html)
    assert len(rows) == 50 and [ns for ns, _ in rows] == sorted((ns for ns, _ in rows),
                                                                reverse=True)
    assert links["older"] == f"/processes/{OTHER}?page=2#events"
    second = page(client, links["older"])
    text, links = pager(second)
    assert text.startswith(f"51–100 of {total}") and set(links) == {"newer", "older"}
    assert links["newer"] == f"/processes/{OTHER}?page=1#events"
    assert event_rows(second)[0][0] < rows[-1][0]          # older than the first page's last
    last = page(client, links["older"])
    text, links = pager(last)
    assert text.startswith(f"101–{total} of {total}") and set(links) == {"newer"}
    oldest = event_rows(last)
    assert len(oldest) == total - 100 and oldest[-1][1] == "device_opened"
    assert "kernel log xid 13" in [what for _, what in oldest]
    # the detail column: the driver call's status, the JSON body as fields, never JSON
    assert '<span class="ev-name">path</span> /dev/nvidia1' in last and '{"fd"' not in last
    # a range kept across pages; a page past the end is the last one; a bad one a 400
    kept = page(client, f"/processes/{OTHER}?range=15m&page=2")
    assert pager(kept)[1]["older"] == f"/processes/{OTHER}?range=15m&page=3#events"
    assert pager(page(client, f"/processes/{OTHER}?page=99"))[0].startswith("101–")
    assert client.get(f"/processes/{OTHER}?page=0").status_code == 400
    assert client.get(f"/processes/{OTHER}?page=x").status_code == 400


def test_a_link_at_a_moment_opens_the_page_of_events_holding_it(client):
    xid = next(i for i in client.get("/api/incidents?kind=xid").get_json())
    html = page(client, f"/processes/{OTHER}?at={xid['opened_at']}")
    assert pager(html)[0].startswith("101–")
    assert (xid["opened_at"], "kernel log xid 13") in event_rows(html)


def test_the_json_api_keeps_its_events_oldest_first(client):
    events = client.get(f"/api/processes/{OTHER}").get_json()["events"]
    assert len(events) == CALLS + 2 and events[0]["what"] == "device_opened"
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)
