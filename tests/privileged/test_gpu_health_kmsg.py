"""GPU health from the real kernel log: an Xid 79 line written into /dev/kmsg, read by the
kernel-log source in its own process and decided by the real correlator, leaves the GPU
``lost`` in the store with the line as its evidence; an Xid whose action is none on
another GPU leaves that one ``ok``.

These tests write into the host's real kernel log (as root), and every line says it is a
test."""

import os

import pytest

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
    finally:
        source.stop()
    assert lost["evidence"]["xid"] == 79 and f"run={run}" in lost["evidence"]["line"]
    assert lost["boot_id"]            # entered in this boot: a reboot clears it
    [row] = queries.gpu_health_history(db, "0000:7d:00")
    assert (row["previous"], row["state"], row["cause"]) == ("ok", "lost", "xid 79")
    assert queries.gpu_health(db, "0000:7e:00") is None      # Xid 13: health untouched
