"""The Alertmanager pusher (correlator/alertmanager.py) over incidents written by the real
correlator and lifecycle code, against a local HTTP server that records what the pusher
POSTs to ``/api/v2/alerts`` (and can fail): labels kept, re-sends, resolves owed across a
restart, backoff, effects not pushed. The real Alertmanager and a real `gpuwhy serve` across
a restart: tests/test_alertmanager_e2e.py."""

from __future__ import annotations

import logging
import shutil
import socket
import time

from gpuwhy.clock import now_ns
from gpuwhy.correlator.alertmanager import (
    RESOLVED_SENDS,
    SOURCE,
    AlertmanagerPusher,
    alert_name,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.store import alertpush, open_store
from gpuwhy.store import incident_changes as store_lifecycle
from gpuwhy.store.queries import list_incidents, source_health
from gpuwhy.text import rfc3339

from .conftest import UUID0

TRAINER = ProcessKey(4242, 1000)
ALERTMANAGER = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"


def lost_gpu(h) -> int:
    h.feed(h.gpu(0), h.process(0.1, TRAINER, "python3"), h.opened(0.2, TRAINER),
           h.sample(0.5, 95.0))
    h.feed(h.xid(1.0, 79, pid=TRAINER.pid, name="python3"))
    [incident] = list_incidents(h.db)
    return incident["id"]


def pusher_on(h, url: str, clock: list[float] | None = None, **settings) -> AlertmanagerPusher:
    """A pusher on its own connection to the harness's store, as the service makes one."""
    config = h.config.replace({"alertmanager.url": url, "alertmanager.resend_seconds": 1.0,
                               "web.hostname": "node-7", **settings})
    clock = clock if clock is not None else [0.0]
    return AlertmanagerPusher(config, open_store(config["store.path"]),
                              monotonic=lambda: clock[0])


def test_an_open_incident_is_sent_resent_and_resolved_with_labels_kept(harness, recorder):
    incident_id = lost_gpu(harness)
    clock = [0.0]
    pusher = pusher_on(harness, recorder.url, clock)
    pusher.step()            # the first run starts from the active incidents
    [(path, [alert])] = recorder.taken()
    assert path == "/api/v2/alerts"
    assert alert["labels"] == {"alertname": "GpuwhyIncidentGpuLost", "incident": str(incident_id),
                               "kind": "gpu_lost", "severity": "critical", "host": "node-7",
                               "gpu": UUID0}
    assert alert["annotations"]["incident_url"] == \
        f"{harness.config['correlator.url']}/incidents/{incident_id}"
    assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    assert alert["startsAt"] < alert["endsAt"]
    pusher.step()            # within the resend interval: nothing
    assert len(recorder.taken()) == 1
    # the severity on the row changes: the labels that were sent do not
    harness.db.execute("update incidents set severity = 'warning' where id = ?", [incident_id])
    harness.db.conn.commit()
    time.sleep(1.05)
    clock[0] += 1.0
    pusher.step()
    [_, (_, [again])] = recorder.taken()
    assert again["labels"] == alert["labels"] and "warning" in again["annotations"]["description"]
    store_lifecycle.resolve(harness.db, incident_id, "alice")
    pusher.step()            # the resolve goes at once, endsAt = when it was resolved
    resolved = recorder.taken()[-1][1][0]
    assert resolved["labels"] == alert["labels"]
    assert again["startsAt"] <= resolved["endsAt"] <= rfc3339(now_ns()) < again["endsAt"]
    for _ in range(RESOLVED_SENDS + 2):
        time.sleep(1.05)
        clock[0] += 1.0
        pusher.step()
    sends = [body[0] for _, body in recorder.taken()]
    assert len([a for a in sends if a["endsAt"] == resolved["endsAt"]]) == RESOLVED_SENDS
    assert alertpush.tracked(pusher.db) == {}
    pusher.db.close()


def test_a_restart_resumes_from_the_stored_cursor_and_still_owes_the_resolve(harness,
                                                                            recorder):
    pusher = pusher_on(harness, recorder.url)
    pusher.step()            # nothing open yet: the cursor is stored at the newest change
    assert recorder.taken() == [] and alertpush.cursor(pusher.db) is not None
    incident_id = lost_gpu(harness)
    pusher.step()
    assert [b[0]["labels"]["incident"] for _, b in recorder.taken()] == [str(incident_id)]
    firing_ends = recorder.taken()[0][1][0]["endsAt"]
    recorder.status = 503    # Alertmanager goes down; the incident is resolved meanwhile
    store_lifecycle.resolve(harness.db, incident_id, "alice", ts=harness.at(9))
    pusher.step()
    assert pusher.failing and "503" in pusher.failing
    pusher.db.close()        # gpuwhy stops before the resolve got through
    recorder.status = 200
    again = pusher_on(harness, recorder.url)
    assert again.take_in() == 0          # the resolve was taken in before the stop
    again.step()
    [*_, (_, [resolved])] = recorder.taken()
    assert resolved["labels"]["incident"] == str(incident_id)
    assert resolved["startsAt"] <= resolved["endsAt"] < firing_ends
    assert len(recorder.taken()) == 2    # firing once, then its resolve: nothing repeated
    again.db.close()


def test_alertmanager_down_is_logged_once_retried_with_backoff_and_reported(harness, caplog):
    lost_gpu(harness)
    with socket.socket() as unused:      # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    clock = [0.0]
    pusher = pusher_on(harness, f"http://127.0.0.1:{port}", clock,
                       **{"alertmanager.resend_seconds": 10.0})
    with caplog.at_level(logging.WARNING, logger="gpuwhy.correlator.alertmanager"):
        for _ in range(8):
            pusher.step()
            clock[0] += 0.5
    warnings = [r for r in caplog.records if "cannot push" in r.getMessage()]
    assert len(warnings) == 1
    # backoff 1 s, then 2 s: 8 steps 0.5 s apart try at 0, 1 and 3 s only
    assert pusher.posts_failed == 3
    [row] = [r for r in source_health(harness.db) if r["source"] == SOURCE]
    assert row["state"] == "down" and str(port) in row["detail"]
    assert row["counters"]["posts_failed"] >= 1 and row["counters"]["firing"] == 1
    # on /metrics: the pusher down, one alert it owes, the feed taken in
    from gpuwhy.webui import create_app

    text = create_app(harness.config).test_client().get("/metrics").get_data(as_text=True)
    assert 'gpuwhy_source_up{source="alertmanager"} 0.0' in text
    assert 'gpuwhy_alertmanager_alerts{state="firing"} 1.0' in text
    assert "gpuwhy_alertmanager_feed_behind 0.0" in text
    pusher.db.close()


def test_effects_are_not_pushed_and_kinds_name_the_alert(harness, recorder):
    pusher = pusher_on(harness, recorder.url)
    pusher.step()
    lost_gpu(harness)
    harness.feed(harness.sample(3.0, 0.0))
    for t in range(4, 14):               # the trainer stalls on the lost GPU: an effect
        harness.feed(harness.sample(t, 0.0))
    effects = [i for i in list_incidents(harness.db, effects=True) if i["cause_id"]]
    pusher.step()
    pushed = {a["labels"]["incident"] for _, body in recorder.taken() for a in body}
    assert pushed == {str(i["id"]) for i in list_incidents(harness.db)}
    assert not pushed & {str(e["id"]) for e in effects}
    assert alert_name("rule_finding") == "GpuwhyIncidentRuleFinding"
    pusher.db.close()
