"""The scheduler probe's flush of threads that stayed asleep: said without being read again,
and every thread's time still adding up to the interval, no more, no less."""

import subprocess
import sys
import time

import pytest

from gpuwhy.proc import process_key

pytestmark = pytest.mark.root

THREADS = 12
# A process whose THREADS pool threads sleep on a condition until a line on stdin wakes them
# all for a little work, as a runtime's pool between parallel sections; its main thread
# sleeps reading stdin.
POOL = f"""
import sys, threading
cond = threading.Condition()
rounds = 0
def pool():
    seen = 0
    while True:
        with cond:
            while rounds == seen:
                cond.wait()
            seen = rounds
        sum(range(20000))
for _ in range({THREADS}):
    threading.Thread(target=pool, daemon=True).start()
print(flush=True)
for line in sys.stdin:
    with cond:
        rounds += 1
        cond.notify_all()
"""
STATES = ("on_cpu_ns", "runqueue_ns", "sleep_ns", "blocked_ns")


def _wake(pool: subprocess.Popen) -> None:
    pool.stdin.write(b"\n")
    pool.stdin.flush()
    time.sleep(0.2)          # every thread ran and sleeps again


def test_threads_that_stayed_asleep_are_said_asleep_for_the_whole_interval(tmp_config):
    from gpuwhy.probes.sched import SchedProbe

    published = []
    probe = SchedProbe(tmp_config, published.append)
    probe.load()
    pool = subprocess.Popen([sys.executable, "-c", POOL], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        pool.stdout.readline()
        probe.watch(process_key(pool.pid))
        _wake(pool)          # each thread's first event proves its state (no longer seeded)
        probe.flush()
        read_at = {key: seen[6] for key, seen in probe._seen.items()}
        published.clear()
        for _ in range(3):
            time.sleep(0.15)
            probe.flush()
        quiet = list(published)
        # none of them was read in full again
        assert {key: seen[6] for key, seen in probe._seen.items()} == read_at
        published.clear()
        _wake(pool)
        probe.flush()
        woken = published[-1]
        time.sleep(0.15)
        probe.flush()
        after = published[-1]
        time.sleep(0.15)
        probe.unwatch(pool.pid)       # its last figures, then its threads are forgotten
        last = published[-1]
        left = probe.counters()["watched_threads"], probe.idle()
    finally:
        probe.close()
        pool.kill()
        pool.wait()
    threads = THREADS + 1
    assert len(read_at) == threads
    for event in quiet:
        assert event.own["threads"] == threads
        assert event.own["sleep_ns"] == threads * event.interval_ns, event
        assert event.own["on_cpu_ns"] == event.own["runqueue_ns"] == 0, event
        assert event.own["voluntary_switches"] == 0, event
    # read in full after three quiet flushes: what those said is not said again
    assert sum(woken.own[state] for state in STATES) == threads * woken.interval_ns, woken
    assert woken.own["on_cpu_ns"] > 0 and woken.own["voluntary_switches"] >= threads, woken
    assert after.own["sleep_ns"] == threads * after.interval_ns, after
    # unwatched: said up to then, though no flush of all processes moved the interval's start
    assert last is not after and last.own["threads"] == threads
    assert last.own["sleep_ns"] == threads * last.interval_ns >= threads * 100_000_000, last
    assert left == (0, True)
