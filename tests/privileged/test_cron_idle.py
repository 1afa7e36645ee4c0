"""The cron source on a host with journald: it sleeps on journald's own wake-up (it looked
at the journal ten times a second), and a CRON line logged meanwhile is still read, timed
when it was sent."""

import json
import os
import subprocess
import threading
import time

import pytest

from gpuwhy.bus import Subscriber
from gpuwhy.probes.cron.source import STOP_SEEN_WITHIN_S, run_cron_source
from gpuwhy.probes.klog.journald import JournalKernelLog
from gpuwhy.store.source_cursors import cursor_reader

pytestmark = [pytest.mark.root]


def test_the_cron_source_waits_on_the_journal_and_still_reads_a_line(system_journald,
                                                                    tmp_config, monkeypatch):
    waits = []
    wait = JournalKernelLog.wait

    def counted(self, timeout):
        waits.append(timeout)
        wait(self, timeout)

    monkeypatch.setattr(JournalKernelLog, "wait", counted)
    config = tmp_config.replace({"klog.start": "now", "cron.etc": str(tmp_config["store.path"])
                                 + ".no-etc", "cron.unit_dirs": ""})
    subscriber = Subscriber(config["bus.endpoint"])
    stop = threading.Event()
    source = threading.Thread(target=run_cron_source, args=(config, stop), daemon=True,
                              kwargs={"cursors": cursor_reader(config["store.path"])})
    source.start()
    marker = f"gpuwhy-cron-idle-{os.urandom(4).hex()}"
    def receive_for(seconds):      # the subscriber takes its publishers in as it reads
        events, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            events += subscriber.receive_many(0.2, 1000)
        return events

    try:
        health = [e for e in receive_for(2.0) if e.event.kind == "source_health"]
        assert health and "journald CRON lines" in health[0].event.detail
        quiet_s, before = 4.0, len(waits)
        receive_for(quiet_s)
        # a look every 0.1 s made 40; journald's wake-ups come only when something logs
        # (at most four a second on a host that logs all the time), and the wait is capped
        # at STOP_SEEN_WITHIN_S so that a stop is seen
        assert len(waits) - before < quiet_s / 0.1 * 0.75
        assert waits and max(waits) <= STOP_SEEN_WITHIN_S
        subprocess.run(["logger", "-t", "CRON", "-i",
                        f"(root) CMD (: {marker})"], check=True)
        deadline = time.monotonic() + 10
        seen = []
        while not seen and time.monotonic() < deadline:
            seen = [e for e in subscriber.receive_many(0.5, 100)
                    if e.event.kind == "cron_execution" and marker in e.event.command]
        assert seen, "the CRON line was not read"
        # Its time is when logger sent it, as journald keeps it, not when journald stored it.
        [entry] = [json.loads(line) for line in subprocess.run(
            ["journalctl", "-o", "json", "--no-pager", "SYSLOG_IDENTIFIER=CRON",
             f"MESSAGE=(root) CMD (: {marker})"], capture_output=True, text=True,
            check=True).stdout.splitlines()]
        assert seen[0].event.ts == int(entry["_SOURCE_REALTIME_TIMESTAMP"]) * 1000
    finally:
        stop.set()
        source.join(5)
        subscriber.close()
    assert not source.is_alive()
