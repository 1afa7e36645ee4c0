"""The probes' kernel maps that settings size (probes.max_threads, probes.max_call_stats):
created at the size asked; the scheduler's full there, its births counted as dropped."""

import subprocess
import sys
import time

import pytest

from gpuwhy.proc import process_key

pytestmark = pytest.mark.root

# A process that starts a thread when a line comes on stdin.
SPAWNER = """
import sys, threading, time
print(flush=True)
sys.stdin.readline()
threading.Thread(target=time.sleep, args=(5,)).start()
print(flush=True)
time.sleep(5)
"""


def test_the_scheduler_map_holds_the_threads_asked_and_counts_the_births_past_it(tmp_config):
    from gpuwhy.probes.sched import SchedProbe, ThreadState

    probe = SchedProbe(tmp_config.replace({"probes.max_threads": 512}), lambda event: None)
    probe.load()
    spawner = subprocess.Popen([sys.executable, "-c", SPAWNER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE)
    try:
        spawner.stdout.readline()
        assert probe._watched.max_entries == 512
        probe.watch(process_key(spawner.pid))             # its one thread
        for tid in range(1, 512):      # the rest filled by hand (no such threads)
            probe._add(10_000_000 + tid, 1, ThreadState.SLEEPING)
        assert probe.counters()["dropped_watched_map_full"] == 0
        spawner.stdin.write(b"\n")
        spawner.stdin.flush()
        spawner.stdout.readline()                         # its new thread runs
        time.sleep(0.1)
        assert probe.counters()["dropped_watched_map_full"] == 1
    finally:
        spawner.kill()
        spawner.wait()
        probe.close()


def test_the_call_statistics_map_has_the_size_asked(tmp_config):
    from gpuwhy.probes.fdtrack import FdTrackProbe

    probe = FdTrackProbe(tmp_config.replace({"probes.max_call_stats": 1024}), lambda e: None)
    probe.load()
    try:
        assert probe._stats.max_entries == 1024
    finally:
        probe.close()
