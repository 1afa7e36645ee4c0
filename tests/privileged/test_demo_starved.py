"""`gpuwhy demo starved-input` end to end, all real but the GPU: a stand-in training process
whose one DataLoader-like worker decodes on the CPU and cannot keep up, while its main
thread sleeps on the batch queue; the eBPF scheduler probes time both, the simulator's GPU
idles 70 % of the time, and the rules engine's finding (R01) becomes the demo's incident,
with the evidence it rests on.

Waits for the rule's warm-up (2 min) and its evidence (2 min): about 5 minutes.
"""

import json

import pytest

from gpuwhy.demo.scenarios import play
from gpuwhy.store import open_store

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_starved_input_ends_in_the_rules_finding_with_its_evidence(tmp_config, tmp_path,
                                                                   system_journald):
    work = tmp_path / "demo"
    incident_id = play(tmp_config, "starved-input", keep=True, timeout=420, work=work)
    assert incident_id is not None

    with open_store(work / "demo.db", readonly=True) as db:
        kind, pid, start_time, gpu_id, details = db.execute(
            "select kind, pid, start_time, gpu_id, details from incidents where id = ?",
            [incident_id]).fetchone()
        [trainer] = db.execute(     # the stand-in trainer, not its forked worker
            "select pid, start_time from processes p where cmdline like '%standin train%' and "
            "not exists (select 1 from processes q where q.pid = p.ppid and q.cmdline like "
            "'%standin train%')").fetchall()
        minor0 = db.execute("select gpu_id from gpu_aliases where alias = 'minor:0'").fetchone()
        chain = [r[0] for r in db.execute("select kind from incident_links where "
                                          "incident_id = ? order by seq", [incident_id])]
    finding = json.loads(details)
    assert kind == "rule_finding" and finding["rule_id"] == "R01_input_cpu_bound"
    assert (pid, start_time) == trainer and gpu_id == minor0[0]
    evidence = finding["evidence"]
    assert evidence["idle_share"] >= 0.5           # the simulator idles 7 s in 10
    assert evidence["workers"] == 1
    # measured by the sched probe: the worker wants a whole core (on a CPU or waiting for
    # one: on a loaded 2-CPU host it gets less than that, and is no less the cause)
    assert evidence["worker_demand"] >= 0.9 and evidence["worker_cores"] > 0.3
    assert evidence["main_sleep_share"] >= 0.5
    assert finding["fixes"] and "num_workers" in finding["fixes"][0]
    # the finding, the trainer it names, and the symptoms it explains (if they fired first)
    assert chain[0] == "rule_finding" and "process" in chain
    assert set(chain[1:]) <= {"process", "symptom"}
