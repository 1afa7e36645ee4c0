"""`gpuwhy demo starved-input`, all real but the GPU: a stand-in training process whose one
DataLoader-like worker decodes on the CPU and cannot keep up, while its main thread sleeps
on the batch queue; the eBPF scheduler probes time both, the simulator's GPU idles 70 % of
the time. The demo's own service answers R01 after the rule's warm-up and hold (about 5
minutes); here 45 s of the demo are played and its store is read for what R01 reads: the
test checks what the demo builds and measures in a minute of CI. R01 on such a process,
with real probes, is tests/privileged/test_why_watch.py; a finding's way to its incident and
chain, tests/correlator/test_cause_over_symptom.py.
"""

import pytest

from gpuwhy.app.demo.scenarios import play
from gpuwhy.store import open_store

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_starved_input_builds_the_starved_loader_r01_reads(tmp_config, tmp_path,
                                                          system_journald):
    work = tmp_path / "demo"
    assert play(tmp_config, "starved-input", keep=True, timeout=45, work=work) is None

    with open_store(work / "demo.db", readonly=True) as db:
        [trainer] = db.execute(     # the stand-in trainer, not its forked worker
            "select pid, start_time from processes p where cmdline like '%standin train%' "
            "and not exists (select 1 from processes q where q.pid = p.ppid and "
            "q.cmdline like '%standin train%')").fetchall()
        [(workers,)] = db.execute("select count(*) from processes where ppid = ?",
                                  [trainer[0]]).fetchall()
        minor0 = db.execute("select gpu_id from gpu_aliases where alias = 'minor:0'").fetchone()
        bound = db.execute("select gpu_id from gpu_bindings where pid = ? and start_time = ?",
                           trainer).fetchone()
        # the correlator's per-second timeline of the trainer (the sched probe's figures)
        seconds, demand, sleep_share = db.execute(
            "select count(*), avg((workers_on_cpu_ms + workers_runqueue_ms) / 1000.0), "
            "sum(sleep_ms) / sum(on_cpu_ms + runqueue_ms + sleep_ms + blocked_ms) "
            "from process_seconds where pid = ? and start_time = ? and sleep_ms is not null",
            trainer).fetchone()
        samples, idle = db.execute(
            "select count(*), avg(gpu_util < 10) from gpu_samples where gpu_id = ? and "
            "instance = ''", minor0).fetchone()
    assert bound == minor0 and workers == 1
    assert seconds >= 20
    # the worker wants a whole core (on a CPU or waiting for one: on a loaded 2-CPU host it
    # gets less than that, and is no less the cause); the main thread sleeps on the queue
    assert demand >= 0.9, demand
    assert sleep_share >= 0.5, sleep_share
    assert samples >= 20 and idle >= 0.5, (samples, idle)    # the simulator idles 7 s in 10
