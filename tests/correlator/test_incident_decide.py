"""The stall check and the resolutions are decided from plain facts: no database."""

from __future__ import annotations

import json

from gpuwhy import gpu_health as gh
from gpuwhy import lifecycle as lc
from gpuwhy.correlator.incidents import (
    FindingAgain,
    NewStall,
    Opened,
    Promote,
    Resolve,
    SeenAt,
    StallSeen,
    decide_exited,
    decide_finding,
    decide_settled,
    decide_stalls,
    idle_start,
    stall_opened,
)
from gpuwhy.events import RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.model import CAUSE, SYMPTOM
from gpuwhy.store.gpu_activity import Bound, GpuIdle, StallFacts
from gpuwhy.store.incident_rows import FindingFacts, SettledCause

S = 1_000_000_000
NOW = 1000 * S
STALL = 30 * S
TRAINER, LOADER, IDLER = ProcessKey(700, 5), ProcessKey(710, 6), ProcessKey(720, 7)


def test_idle_starts_at_the_first_of_next_sample_silence_and_lost_health() -> None:
    assert idle_start(GpuIdle(900 * S, None, None), NOW) is None          # still busy
    assert idle_start(GpuIdle(900 * S, 901 * S, ("ok", 10 * S, gh.OK, None)), NOW) == 901 * S
    # a source said resetting after the busy sample, before the next sample
    assert idle_start(GpuIdle(900 * S, 950 * S, ("ok", 920 * S, gh.OK, None), 910 * S),
                      NOW) == 910 * S
    # no source event read back: its state now is silent, since then
    assert idle_start(GpuIdle(900 * S, None, ("resetting", 930 * S, gh.OK, None)),
                      NOW) == 930 * S
    # lost by its health (an Xid 79 in the kernel log), within (busy, now]
    assert idle_start(GpuIdle(900 * S, None, ("ok", 10 * S, gh.LOST, 905 * S)), NOW) == 905 * S
    assert idle_start(GpuIdle(900 * S, None, ("ok", 10 * S, gh.LOST, 1001 * S)), NOW) is None


def test_a_stall_opens_is_seen_again_and_ends_when_the_gpu_is_busy_again() -> None:
    facts = StallFacts(
        NOW,
        bound=(Bound(TRAINER, "GPU-a", 10 * S, 900 * S),      # idle 99 s: stalled already
               Bound(LOADER, "GPU-a", 10 * S, 900 * S),       # same GPU and sample: new
               Bound(IDLER, "GPU-b", 10 * S, None),           # busy again (or never)
               Bound(ProcessKey(730, 8), "GPU-c", 10 * S, 990 * S)),  # idle 5 s: not yet
        idle={("GPU-a", 900 * S): GpuIdle(900 * S, 901 * S, None),
              ("GPU-c", 990 * S): GpuIdle(990 * S, 995 * S, None)},
        stalls=((4, f"process_stall:{TRAINER}:GPU-a", 950 * S),
                (6, f"process_stall:{IDLER}:GPU-b", NOW),          # opened now: kept
                (5, f"process_stall:{IDLER}:GPU-b", 920 * S)))
    decided = decide_stalls(facts, STALL)
    assert decided == [
        StallSeen(f"process_stall:{TRAINER}:GPU-a", NOW),
        NewStall(LOADER, "GPU-a", 901 * S, f"process_stall:{LOADER}:GPU-a"),
        Resolve(5, lc.RECOVERED, NOW, "the GPU is busy again")]
    opened = stall_opened(decided[1], NOW, "blocked on I/O", 3)   # type: ignore[arg-type]
    assert (opened.kind, opened.ts, opened.cause_id, opened.process) == (
        "process_stall", 901 * S, 3, LOADER)
    assert opened.summary == "pid 710 alive but GPU GPU-a near idle for 99s; process " \
        "blocked on I/O"


def test_an_idle_host_decides_nothing() -> None:
    assert decide_stalls(StallFacts(NOW), STALL) == []


def test_stalls_and_process_xids_end_with_their_process() -> None:
    rows = [(1, 500 * S, "process_stall", gh.OK), (2, 600 * S, "xid", gh.OK),
            (3, 700 * S, "xid", gh.RESET_REQUIRED)]       # the GPU still needs its reset
    assert decide_exited(rows) == [
        Resolve(1, lc.PROCESS_EXITED, 500 * S, "the process it is about ended"),
        Resolve(2, lc.PROCESS_EXITED, 600 * S, "the process it is about ended")]


def test_settled_causes_resolve_by_health_by_recovery_or_by_timeout() -> None:
    dedup = 300 * S
    causes = [
        SettledCause(1, "gpu_lost", "GPU-a", 100 * S, 100 * S, gh.LOST, True),  # unusable
        SettledCause(2, "gpu_lost", "GPU-b", 100 * S, 100 * S, gh.OK, True,
                     clearing=(400 * S, gh.BY_RESET, "nvidia-smi -r")),
        SettledCause(3, "xid", "GPU-c", 100 * S, 200 * S, gh.OK, False,
                     stalls=(1, None)),                              # a stall holds it
        SettledCause(4, "xid", "GPU-d", 100 * S, 200 * S, gh.OK, False,
                     stalls=(0, 250 * S), back=(240 * S, gh.RESETTING, "reset done")),
        SettledCause(5, "xid", "GPU-e", 100 * S, 200 * S, gh.OK, False),
        SettledCause(6, "gpu_lost", None, 100 * S, 200 * S, None, True),     # never times out
        SettledCause(7, "gpu_reset", "GPU-f", 900 * S, 950 * S, gh.OK, False)]  # too soon
    assert decide_settled(causes, NOW, dedup) == [
        Resolve(2, gh.RESOLUTION[gh.BY_RESET], 400 * S,
                "GPU GPU-b usable again (nvidia-smi -r)"),
        Resolve(4, lc.RESET, 250 * S, "GPU GPU-d healthy again (reset done)"),
        Resolve(5, lc.TIMEOUT, 500 * S, "not seen again for 300 s; the GPU stayed usable")]


LAG = 2 * S
SETTLE = {"xid": 40 * S, "gpu_lost": 40 * S, "gpu_reset": 40 * S}


def finding(rule_id: str, kind: str, state: str = "firing", **more: object) -> RuleFinding:
    base: dict = {"ts": NOW, "finding_id": f"{rule_id}:GPU-a", "rule_id": rule_id,
                  "title": rule_id, "severity": "warning", "state": state, "gpu_id": "GPU-a",
                  "rule_kind": kind, "scope": "gpu", "since": NOW - 5 * S}
    return RuleFinding(**{**base, **more})


def held(incident_id: int, rule_id: str, kind: str, explains: list[str] = []) -> tuple:  # noqa: B006
    details = json.dumps({"rule_id": rule_id, "finding_id": f"{rule_id}:GPU-a",
                          "rule_kind": kind, "scope": "gpu", "explains": explains})
    return (incident_id, None, None, rule_id, json.dumps(explains),
            f"rule_finding:{rule_id}:GPU-a", details, rule_id, "warning", 900 * S)


def test_a_cleared_finding_resolves_its_incident_and_a_repeat_updates_it() -> None:
    cleared = finding("R1", CAUSE, "cleared")
    assert decide_finding(cleared, FindingFacts((8, "warning")), LAG, SETTLE) == [
        SeenAt(8, NOW), Resolve(8, lc.RECOVERED, NOW, "the rule's condition stopped holding")]
    assert decide_finding(cleared, FindingFacts(), LAG, SETTLE) == []
    again = finding("R1", CAUSE, severity="info")
    assert decide_finding(again, FindingFacts((8, "critical")), LAG, SETTLE) == [
        FindingAgain(8, "critical", NOW, NOW + LAG)]


def test_a_new_finding_joins_its_gpus_cause_or_the_cause_that_answers_it() -> None:
    xid = (3, "xid", NOW - 10 * S, gh.OK, None, None)           # seen 5 s before: settling
    [opened] = decide_finding(finding("R9", SYMPTOM), FindingFacts(causes=(xid,)), LAG, SETTLE)
    assert isinstance(opened, Opened)
    assert (opened.ts, opened.cause_id, opened.dedup_key) == (
        NOW - 5 * S, 3, "rule_finding:R9:GPU-a")
    facts = FindingFacts(held={CAUSE: (held(11, "R2", CAUSE, ["R8"]),
                                       held(12, "R3", CAUSE, ["R9"]))})
    [opened] = decide_finding(finding("R9", SYMPTOM), facts, LAG, SETTLE)
    assert isinstance(opened, Opened) and opened.cause_id == 12


def test_a_cause_takes_over_the_symptom_incident_it_explains() -> None:
    cause = finding("R3", CAUSE, explains=["R9"], severity="critical")
    facts = FindingFacts(held={SYMPTOM: (held(20, "R7", SYMPTOM), held(21, "R9", SYMPTOM),
                                         held(22, "R9", SYMPTOM))})
    [promote] = decide_finding(cause, facts, LAG, SETTLE)
    assert isinstance(promote, Promote)
    assert (promote.incident_id, promote.symptom_key, promote.others) == (
        21, "rule_finding:R9:GPU-a", (22,))
    assert (promote.answer["dedup_key"], promote.answer["severity"],
            promote.answer["settle_until"]) == ("rule_finding:R3:GPU-a", "critical", NOW + LAG)
    assert promote.text == "cause established: R3 (was the symptom: R9)"
    [opened] = decide_finding(cause, FindingFacts(held={SYMPTOM: ()}), LAG, SETTLE)
    assert isinstance(opened, Opened) and opened.cause_id is None
