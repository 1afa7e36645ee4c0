"""A real `gpuwhy serve` pushes an Xid 79 incident to the real Alertmanager (Debian's
`prometheus-alertmanager`), which notifies a webhook ONCE firing across a restart of gpuwhy
and ONCE resolved after `gpuwhy incident ID resolve`.

Nothing is stood in for: the simulator's GPUs, the kernel-log tail (a kern.log file, as in
tests/test_prometheus_scrape.py, where the GPU stops answering once the Xid 79 line is
written), the service's own pusher thread (correlator/alertmanager.py) re-sending every
second, Alertmanager's grouping and dedup, and the CLI resolving the incident in the store.
The restart is the point: Alertmanager tells alerts apart by their labels alone, so a
restarted pusher that sent a label set other than the stored one (rebuilt from a severity or
host name that changed meanwhile) would be notified as a second alert. The processes listen
on loopback ephemeral ports, keep their data in tmp_path and are stopped by the test.
"""

import sqlite3
import time

from .peers import Recorder, SimulatedHost, alertmanager, get_json, stop, wait_for

INCIDENT_ALERT = "GpuwhyIncidentGpuLost"      # alert_name("gpu_lost")
# about 14 s (Alertmanager's start, two gpuwhy starts, the resend intervals watched): under
# the 20 s past which a test is marked slow


def _sends(db_path, incident_id):
    """The pusher's stored firing-send count for the incident; None once it is forgotten."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5) as conn:
        row = conn.execute("select fired from alertmanager_alerts where incident_id = ?",
                           [incident_id]).fetchone()
    return None if row is None else row[0]


def test_alertmanager_notifies_once_across_a_gpuwhy_restart_then_once_resolved(tmp_path):
    webhook = Recorder()
    first = second = None
    try:
        with alertmanager(tmp_path, webhook.url) as (am_url, am_log):
            host = SimulatedHost(tmp_path, GPUWHY_ALERTMANAGER_URL=am_url,
                                 GPUWHY_ALERTMANAGER_RESEND="1")
            host.env["GPUWHY_URL"] = host.base
            first = host.serve()
            logs = [host.logs[-1], am_log]
            lost = host.gpus()[0]
            host.lose_gpu(lost)
            [incident] = wait_for(lambda: get_json(f"{host.base}/api/incidents"), 30,
                                  "the Xid 79 incident", logs)
            incident_id = incident["id"]
            assert incident["kind"] == "gpu_lost", incident
            [alert] = wait_for(lambda: webhook.notified(incident_id, "firing"), 20,
                               f"the firing notification; webhook got {webhook.dump()}", logs)
            assert alert["labels"]["alertname"] == INCIDENT_ALERT
            assert alert["labels"]["gpu"] == lost["uuid"] and alert["labels"]["host"] == "node-a"
            assert alert["annotations"]["incident_url"] == f"{host.base}/incidents/{incident_id}"
            # re-sent every second before the restart too: the same alert, no new notification
            fired = _sends(host.db_path, incident_id)
            wait_for(lambda: _sends(host.db_path, incident_id) >= fired + 2, 10,
                     "two re-sends before the restart", logs)

            stop(first)
            assert first.returncode == 0, host.logs[-1].read_text()[-3000:]
            fired = _sends(host.db_path, incident_id)
            second = host.serve()
            logs = [host.logs[-1], am_log]
            # several re-sends by the restarted service's pusher, from its stored record
            wait_for(lambda: _sends(host.db_path, incident_id) >= fired + 4, 20,
                     "four re-sends after the restart", logs)
            assert len(webhook.notified(incident_id, "firing")) == 1, webhook.dump()

            resolve = host.cli("incident", str(incident_id), "resolve", "GPU replaced",
                               "--by", "alice")
            assert resolve.returncode == 0, resolve.stdout + resolve.stderr
            [resolved] = wait_for(lambda: webhook.notified(incident_id, "resolved"), 20,
                                  f"the resolved notification; webhook got {webhook.dump()}",
                                  logs)
            assert resolved["labels"] == alert["labels"]
            # every owed resolved send made (the pusher forgets the incident then), and one
            # group_interval more for Alertmanager to notify anything they might have changed
            wait_for(lambda: _sends(host.db_path, incident_id) is None, 15,
                     "the pusher to finish the resolved sends", logs)
            time.sleep(2.0)
            assert len(webhook.notified(incident_id, "resolved")) == 1, webhook.dump()
            assert len(webhook.notified(incident_id, "firing")) == 1, webhook.dump()
            # nothing about the GPU that stayed ok
            assert {a["labels"]["gpu"] for a in webhook.notified()} == {lost["uuid"]}
            stop(second)
            assert second.returncode == 0, host.logs[-1].read_text()[-3000:]
    finally:
        stop(first)
        stop(second)
        webhook.close()
