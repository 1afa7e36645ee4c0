"""The scheduler probe's per-thread figures: the on-CPU time of a GPU process's main thread
and of its busiest other thread, which the sums over its threads cannot tell (a serving
engine's loop on the main thread, a frontend's on another)."""

import subprocess
import sys
import time

import pytest

from gpuwhy.proc import process_key

pytestmark = pytest.mark.root

# A process with a spinning thread (the main one, or another) and four threads asleep.
SPIN = """
import sys, threading, time
def spin():
    while True:
        pass
for _ in range(4):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
if sys.argv[1] == "other":
    threading.Thread(target=spin, daemon=True).start()
    print(flush=True)
    time.sleep(3600)
print(flush=True)
spin()
"""


@pytest.mark.parametrize("where", ["main", "other"])
def test_the_spinning_thread_is_the_main_one_or_the_busiest_other(tmp_config, where):
    from gpuwhy.probes.sched import SchedProbe

    published = []
    probe = SchedProbe(tmp_config, published.append)
    probe.load()
    spinner = subprocess.Popen([sys.executable, "-c", SPIN, where], stdout=subprocess.PIPE)
    try:
        spinner.stdout.readline()
        probe.watch(process_key(spinner.pid))
        time.sleep(0.3)
        probe.flush()
        published.clear()
        for _ in range(3):
            time.sleep(0.3)
            probe.flush()
        figures = [(e.own["main_on_cpu_ns"] / e.interval_ns,
                    e.own["busiest_on_cpu_ns"] / e.interval_ns,
                    e.own["on_cpu_ns"] / e.interval_ns) for e in published]
    finally:
        probe.close()
        spinner.kill()
        spinner.wait()
    assert len(figures) == 3
    # Over the three intervals together: a thread that runs without being switched out is
    # credited when it is (a busy host's CPU may keep it on through a whole flush, then
    # the next interval gets both), and a busy host may give it less than a core.
    main, other, total = (sum(f[i] for f in figures) for i in range(3))
    spinning, asleep = (main, other) if where == "main" else (other, main)
    assert spinning > 0.3 and spinning >= 0.9 * total, figures
    assert asleep < 0.06, figures
