"""GPU health from the real kernel log: an Xid 79 line written into /dev/kmsg, read by the
kernel-log source in its own process and decided by the real correlator, leaves the GPU
``lost`` in the store with the line as its evidence, and its incident open past its
settling time (an incident was once closed as it opened); an Xid whose action is none on
another GPU leaves that one ``ok``.

These tests write into the host's real kernel log (as root), and every line says it is a
test."""

import os
import time

import pytest

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.store import queries

from .kernel_lines import MARK, wait_for, write_kmsg
from .test_klog_poison_live import Source

pytestmark = [pytest.mark.root, pytest.mark.kmsg]


def test_kmsg_xid_79_makes_the_gpu_lost(tmp_config, kernel_log_store):
    db = kernel_log_store
    run = os.urandom(4).hex()
    source = Source(tmp_config, "kmsg")
    source.start()
    try:
        wait_for(lambda: db.execute("select 1 from source_health where source = 'klog'")
                 .fetchone(), 20, "the source's first health report")
        write_kmsg([f"NVRM: {MARK} run={run} Xid (PCI:0000:7e:00): 13, pid=4242, "
                    f"name=gpuwhy-test, Graphics Exception",
                    f"NVRM: {MARK} run={run} Xid (PCI:0000:7d:00): 79, pid=4242, "
                    f"name=python3, GPU has fallen off the bus."])
        lost = wait_for(lambda: (g := queries.gpu_health(db, "0000:7d:00")) and
                        g["health"] == "lost" and g, 20, "the GPU lost")
        [incident] = queries.list_incidents(db, gpu="0000:7d:00")
        # the live correlator decides every second on its wall clock: past the settling
        # time the lost GPU's incident is still open, as its health still says lost
        settle_s = (tmp_config["correlator.lag_seconds"] + tmp_config["correlator.stall_seconds"]
                    + 3)
        time.sleep(max(0.0, incident["opened_at"] / NS_PER_SECOND + settle_s + 2 - time.time()))
        [later] = queries.list_incidents(db, gpu="0000:7d:00")
    finally:
        source.stop()
    assert (incident["kind"], incident["state"], incident["closed_at"]) == \
        ("gpu_lost", "open", None)
    assert (later["id"], later["state"], later["closed_at"]) == (incident["id"], "open", None)
    assert lost["evidence"]["xid"] == 79 and f"run={run}" in lost["evidence"]["line"]
    assert lost["boot_id"]            # entered in this boot: a reboot clears it
    [row] = queries.gpu_health_history(db, "0000:7d:00")
    assert (row["previous"], row["state"], row["cause"]) == ("ok", "lost", "xid 79")
    assert queries.gpu_health(db, "0000:7e:00") is None      # Xid 13: health untouched
