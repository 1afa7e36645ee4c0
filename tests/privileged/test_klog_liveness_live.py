"""Kernel-log liveness on the real kernel log: a stale journald socket is not taken for a
running journald (every line arrives through /dev/kmsg instead), and a journal that stops
receiving kernel lines fails the source through the real printk probe's count.

These tests write into the host's real kernel log (as root, unless GPUWHY_TEST_KMSG=0), and
every line they write says it is a test.
"""

import json
import os
import socket
import subprocess
import threading
import time

import pytest

from gpuwhy.app.status import EXIT_CODES, collect_status
from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.probes.klog import source as klog_source
from gpuwhy.probes.klog.kmsg import current_boot_id
from gpuwhy.probes.klog.source import run_klog_source
from gpuwhy.store.source_cursors import cursor_reader
from gpuwhy.webui import create_app

from .kernel_lines import MARK, wait_for, write_kmsg

pytestmark = [pytest.mark.root, pytest.mark.kmsg]
REMOTE = "/lib/systemd/systemd-journal-remote"


def stale_socket(path):
    """A socket file nobody listens on: what a journald that is gone leaves behind."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.close()
    assert path.exists()
    return path


@pytest.fixture
def klog_thread():
    """klog_thread(config) starts the real kernel-log source in a thread, stopped after."""
    stops = []

    def start(config):
        stop = threading.Event()
        thread = threading.Thread(target=run_klog_source, args=(config, stop), daemon=True,
                                  kwargs={"cursors": cursor_reader(config["store.path"])})
        thread.start()
        stops.append((stop, thread))
    yield start
    for stop, thread in stops:
        stop.set()
        thread.join(10)


def one_kernel_line_journal(directory, message, boot, mono_us, real_us):
    """A real journal file holding one kernel line, made by systemd-journal-remote."""
    export = directory / "host.export"
    export.write_text(f"__REALTIME_TIMESTAMP={real_us}\n__MONOTONIC_TIMESTAMP={mono_us}\n"
                      f"_BOOT_ID={boot}\n_TRANSPORT=kernel\nPRIORITY=6\n"
                      f"_SOURCE_MONOTONIC_TIMESTAMP={mono_us}\nMESSAGE={message}\n\n")
    journal = directory / "host.journal"
    result = subprocess.run([REMOTE, f"--output={journal}", str(export)], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    return journal


def klog_health(db):
    return db.execute("select state, detail, counters from source_health "
                      "where source = 'klog'").fetchone()


def test_a_stale_journald_socket_is_not_journald_every_line_arrives(
        tmp_config, tmp_path, monkeypatch, kernel_log_store, klog_thread):
    monkeypatch.setattr("gpuwhy.probes.klog.journald.JOURNALD_SOCKET",
                        str(stale_socket(tmp_path / "socket")))
    db = kernel_log_store
    klog_thread(tmp_config.replace({"klog.backend": "auto", "klog.start": "now"}))
    health = wait_for(lambda: klog_health(db), 15, "the source to start")
    run, total = os.urandom(4).hex(), 200
    write_kmsg([f"NVRM: Xid (PCI:0000:0a:00): 43, pid={n + 1}, name=gpuwhy-test, {MARK} "
                f"run={run} n={n} " for n in range(total)])
    count = "select count(*), count(distinct line), min(origin), max(origin) from kernel_log " \
            "where line like ?"
    wait_for(lambda: db.execute(count, [f"%run={run} %"]).fetchone()[0] >= total, 30,
             "every line")
    time.sleep(0.5)
    assert db.execute(count, [f"%run={run} %"]).fetchone() == (total, total, "kmsg", "kmsg")
    assert health[0] == "ok"
    assert "/dev/kmsg read directly (journald is not running" in health[1]
    assert "Connection refused" in health[1]


def test_a_journal_that_stops_receiving_kernel_lines_fails_the_source(
        tmp_config, tmp_path, monkeypatch, pipeline_for, klog_thread):
    # A journal that holds this boot's kernel lines (so it is taken as live) and never grows:
    # a host journal mounted into a container whose host journald stopped reading /dev/kmsg.
    boot = current_boot_id()
    now_us = time.time_ns() // 1000
    mono_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    journal = one_kernel_line_journal(tmp_path, f"gpuwhy-test: last line before the stop {MARK}",
                                      boot, mono_us, now_us)
    monkeypatch.setattr(klog_source, "HEALTH_EVERY_S", 0.5)
    config = tmp_config.replace({"klog.journal_path": str(journal), "klog.start": "boot"})
    pipe = pipeline_for(config)                     # the real probes (printk among them)
    pipe.correlator.klog_liveness.grace_ns = 3 * NS_PER_SECOND
    klog_thread(config)
    pipe.wait_for("select state from source_health where source = 'klog'", (), bool, 15)
    assert pipe.query("select state from source_health where source = 'klog'") == [("ok",)]
    printk = pipe.query("select state from source_health where source = 'printk'")
    assert printk == [("ok",)]
    write_kmsg([f"gpuwhy-test: a kernel line this journal never gets {MARK} n={n}"
                for n in range(3)])
    rows = pipe.wait_for("select state, detail from source_health where source = 'klog'", (),
                         lambda rows: rows and rows[0][0] == "failed", 20)
    assert rows[0][0] == "failed", rows
    assert "record(s) since" in rows[0][1] and "printk probe" in rows[0][1]
    # shown where on-call looks: `gpuwhy status` (degraded: exit 2) and /metrics
    report = collect_status(config)
    assert "klog" in report["failed"] and EXIT_CODES[report["state"]] != 0
    metrics = create_app(config).test_client().get("/metrics").get_data(as_text=True)
    assert 'gpuwhy_source_up{source="klog"} 0.0' in metrics
    counters = pipe.wait_for(
        "select counters from source_health where source = 'correlator'", (),
        lambda rows: json.loads(rows[0][0])["klog_liveness_failures"], 10)
    assert json.loads(counters[0][0])["klog_liveness_failures"] == 1


def test_a_pod_source_reads_kernel_lines_with_the_dev_kmsg_the_probes_lend(
        system_journald, tmp_config, tmp_path, monkeypatch, pipeline_for, klog_thread):
    """The two containers of deploy/kubernetes: the probes (privileged, /dev/kmsg opens) lend
    it at klog.kmsg_socket; the source, refused the device, borrows it as its bell."""
    monkeypatch.setattr(klog_source, "HEALTH_EVERY_S", 0.5)
    lent_at = str(tmp_path / "kmsg.sock")
    probes_side = tmp_config.replace({"klog.kmsg_socket": lent_at})
    pipe = pipeline_for(probes_side)
    source_side = probes_side.replace({"klog.backend": "journald", "klog.start": "now",
                                       "klog.kmsg_path": str(tmp_path / "refused")})
    klog_thread(source_side)
    rows = pipe.wait_for("select state, detail from source_health where source = 'klog'", (),
                         bool, 15)
    assert rows[0][0] == "ok" and f"lent by the probes at {lent_at}" in rows[0][1], rows
    run = os.urandom(4).hex()
    write_kmsg([f"NVRM: Xid (PCI:0000:0a:00): 79, pid=1, name=lent, {MARK} run={run}"])
    stored = pipe.wait_for("select count(*) from kernel_log where message like ?",
                           (f"%run={run}%",), lambda rows: rows[0][0] == 1, 15)
    assert stored[0][0] == 1
