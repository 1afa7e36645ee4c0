"""The kernel-log source against a real systemd-journald fed through /dev/kmsg: each line
delivered exactly once with the right GPU, pid and time; and a kill -9 of the source in the
middle of a 10 000-line burst loses and duplicates nothing.

These tests write into the host's real kernel log (as root, unless GPUWHY_TEST_KMSG=0), and
every line they write says it is a test.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from .kernel_lines import MARK, wait_for, write_kmsg

pytestmark = [pytest.mark.root, pytest.mark.kmsg]


class JournalCount:
    """How many of a run's lines journald holds, read through its own journal reader."""

    def __init__(self, run):
        from systemd import journal

        self.run, self.seen = f"run={run} ", set()
        self.reader = journal.Reader()
        self.reader.add_match(_TRANSPORT="kernel")
        self.reader.seek_tail()
        self.reader.get_previous()

    def count(self):
        self.reader.wait(0)         # take in journal files journald opened since (rotation)
        while entry := self.reader.get_next():
            message = entry.get("MESSAGE", "")
            if self.run in message:
                self.seen.add(int(re.search(r" n=(\d+) ", message)[1]))
        return len(self.seen)


def write_kmsg_paced(lines, journal_count, chunk=200):
    """A burst as fast as journald takes it in: a journald that falls behind the kernel's
    ring buffer misses lines ("Missed N kernel messages") before any source can see them."""
    for start in range(0, len(lines), chunk):
        write_kmsg(lines[start:start + chunk])
        wait_for(lambda written=start: journal_count.count() >= written, 60,
                 "journald to catch up")


def source_process(config):
    env = {**os.environ, "GPUWHY_DB": config["store.path"], "GPUWHY_BUS": config["bus.endpoint"],
           "GPUWHY_KLOG_BACKEND": "journald", "GPUWHY_KLOG_START": "now"}
    code = ("import signal, threading; from gpuwhy.config import load_config; "
            "from gpuwhy.probes.klog.source import run_klog_source; "
            "from gpuwhy.store.source_cursors import cursor_reader; "
            "stop = threading.Event(); "
            "signal.signal(signal.SIGTERM, lambda *args: stop.set()); "
            "config = load_config(); "
            "run_klog_source(config, stop, cursors=cursor_reader(config['store.path']))")
    return subprocess.Popen([sys.executable, "-c", code], env=env)


def source_ready(db):
    return db.execute("select 1 from source_health where source = 'klog'").fetchone() is not None


def rows_of(db, run):
    return db.execute("select line, xid, pci, pid, name, gpu_instance, ts, raw_ts from "
                      "kernel_log where line like ?", [f"%run={run} %"]).fetchall()


def test_each_line_is_delivered_once_with_gpu_pid_and_time(system_journald, tmp_config,
                                                           kernel_log_store):
    store = kernel_log_store
    run = os.urandom(4).hex()
    source = source_process(tmp_config)
    try:
        wait_for(lambda: source_ready(store), 15, "the source to start")
        written_at = time.time_ns()
        write_kmsg([
            f"NVRM: Xid (PCI:0000:0A:00): 79, pid=4242, name=gpuwhy-test, {MARK} run={run} n=0",
            f"NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 13, pid=77, name=trainer, "
            f"{MARK} run={run} n=1",
            f"NVRM: some other NVRM line {MARK} run={run} n=2",
        ])
        wait_for(lambda: len(rows_of(store, run)) >= 2, 15, "both Xid lines")
        time.sleep(1.0)               # a duplicate would have arrived by now
        rows = sorted(rows_of(store, run), key=lambda r: r[0])
    finally:
        source.terminate()
        source.wait(10)
    assert source.returncode == 0
    assert len(rows) == 2
    first, second = rows
    assert first[1:6] == (79, "0000:0a:00", 4242, "gpuwhy-test", None)
    assert second[1:6] == (13, "0000:3b:00", 77, "trainer", 1)
    for row in rows:
        assert abs(row[6] - written_at) < 2_000_000_000          # realtime ns, near the write
        boot_s = time.clock_gettime(time.CLOCK_BOOTTIME)
        assert 0 < row[7] / 1e9 <= boot_s                          # raw printk time
    health = store.execute("select state, detail from source_health "
                                "where source = 'klog'").fetchone()
    assert health[0] == "ok" and "journald" in health[1]


@pytest.mark.slow
def test_kill_9_in_a_burst_of_10000_lines_loses_and_duplicates_nothing(system_journald,
                                                                      tmp_config,
                                                                      kernel_log_store):
    store = kernel_log_store
    run = os.urandom(4).hex()
    total = 10_000
    lines = [f"NVRM: Xid (PCI:0000:0a:00): 43, pid={n + 1}, name=gpuwhy-test, {MARK} "
             f"run={run} n={n} " for n in range(total)]
    source = source_process(tmp_config)
    in_journal = JournalCount(run)
    writer = threading.Thread(target=write_kmsg_paced, args=(lines, in_journal))
    try:
        wait_for(lambda: source_ready(store), 15, "the source to start")
        writer.start()
        wait_for(lambda: len(rows_of(store, run)) >= 2000, 180, "2000 stored lines")
        os.kill(source.pid, signal.SIGKILL)
        source.wait(10)
        stored_at_kill = len(rows_of(store, run))
        source = source_process(tmp_config)
        writer.join(180)
        assert not writer.is_alive()
        wait_for(lambda: in_journal.count() >= total, 60,
                 "journald to hold every line (it missed some: see its 'Missed' messages)")
        wait_for(lambda: len(rows_of(store, run)) >= total, 300, "all lines")
        time.sleep(1.5)               # duplicates, if any, would be in by now
        rows = rows_of(store, run)
    finally:
        if source.poll() is None:
            source.terminate()
            source.wait(10)
    assert source.returncode == 0                     # the restarted one stopped cleanly
    assert stored_at_kill < total, "the kill did not happen during the burst"
    numbers = [int(re.search(r" n=(\d+) ", row[0])[1]) for row in rows]
    assert len(numbers) == total
    assert sorted(numbers) == list(range(total))
    assert all(row[3] == int(re.search(r" n=(\d+) ", row[0])[1]) + 1 for row in rows)


def test_lines_after_a_journal_rotation_are_delivered(system_journald, tmp_config,
                                                      kernel_log_store):
    store = kernel_log_store
    run = os.urandom(4).hex()
    source = source_process(tmp_config)
    try:
        wait_for(lambda: source_ready(store), 15, "the source to start")
        write_kmsg([f"NVRM: Xid (PCI:0000:0a:00): 43, pid=7, name=gpuwhy-test, {MARK} "
                    f"run={run} n={n} " for n in range(50)])
        wait_for(lambda: len(rows_of(store, run)) >= 50, 30, "the first 50 lines")
        subprocess.run(["journalctl", "--rotate"], check=True, capture_output=True)
        write_kmsg([f"NVRM: Xid (PCI:0000:0a:00): 43, pid=7, name=gpuwhy-test, {MARK} "
                    f"run={run} n={n} " for n in range(50, 100)])
        wait_for(lambda: len(rows_of(store, run)) >= 100, 30, "the lines after rotating")
    finally:
        source.terminate()
        source.wait(10)
    numbers = sorted(int(re.search(r" n=(\d+) ", row[0])[1]) for row in rows_of(store, run))
    assert numbers == list(range(100))
