"""A root-cause chain is decided from plain facts: no database, no correlator."""

from __future__ import annotations

import json

from gpuwhy.correlator.chains import decide
from gpuwhy.identity import ProcessKey
from gpuwhy.store.incident_chains import ChainFacts, Effect, Origin, ResetCall

S = 1_000_000_000
JOB, SHELL, TRAINER = ProcessKey(900, 11), ProcessKey(800, 10), ProcessKey(700, 5)


def incident(**row: object) -> dict:
    base = {"id": 1, "kind": "xid", "opened_at": 100 * S, "last_seen": 100 * S, "title": "",
            "details": "{}", "pid": None, "start_time": None, "gpu_id": "minor:0", "count": 1,
            "cause_id": None}
    return {**base, **row}


def test_a_cron_job_resets_the_gpu_and_a_trainer_stalls() -> None:
    call = ResetCall(7, 100 * S, JOB, "/dev/nvidia0", "NV2080_CTRL_CMD_GPU_RESET", "ioctl",
                     "OK", 2 * S)
    origin = Origin(exec_event=(3, 97 * S, json.dumps({"filename": "/usr/bin/nvidia-smi"})),
                    ancestry=(JOB, SHELL),
                    cron_run=("c1", 96 * S, "root", "nvidia-smi -r", "reset", 800, 10),
                    cron_depth=1)
    stall = Effect(2, "process_stall", 103 * S, "stall", "pid 700 stalled 3 s", 700, 5, None)
    facts = ChainFacts(incident(kind="gpu_reset", opened_at=99 * S, title="reset"),
                       names={JOB: "nvidia-smi", TRAINER: "python"},
                       reset_calls=(call,), minors=(0,), origins={7: origin},
                       effects=(stall,), bound=(JOB, TRAINER, ProcessKey(600, 4)))
    links = decide(facts)
    assert [(link.kind, link.ts // S) for link in links] == [
        ("cron_job", 96), ("command", 97), ("driver_call", 98), ("gpu_reset", 99),
        ("process", 99), ("process_stall", 103)]
    assert links[0].summary == "cron ran `nvidia-smi -r` as root (job pid 800): reset"
    assert links[0].evidence["ancestry_depth"] == 1
    assert links[2].summary == ("pid 900 (nvidia-smi) sent NV2080_CTRL_CMD_GPU_RESET on "
                                "/dev/nvidia0 (OK)")
    assert links[4].summary == "pid 600 (?) was bound to the GPU"   # not the caller, not stalled
    assert links[5].summary == "pid 700 (python) stalled 3 s"


def test_an_xid_45_follows_the_earlier_xid() -> None:
    facts = ChainFacts(incident(id=5, title="Xid 45", details=json.dumps({"xid": 45})),
                       earlier_xid=(4, 99 * S, "Xid 13 on minor:0"))
    links = decide(facts)
    assert [(link.kind, link.evidence.get("incident")) for link in links] == [
        ("earlier_xid", 4), ("xid", 5)]
    assert links[0].summary.startswith("follows Xid 13 on minor:0 (Xid 45 is the channel")
