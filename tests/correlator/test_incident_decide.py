"""The stall check, opening and merging, and the resolutions are decided from plain facts: no
database."""

from __future__ import annotations

import json

from gpuwhy import gpu_health as gh
from gpuwhy import lifecycle as lc
from gpuwhy.correlator.chains import MAX_NAMED
from gpuwhy.correlator.incidents import (
    AnswerMove,
    FindingAgain,
    Insert,
    LogLine,
    Merge,
    NewStall,
    Opened,
    Promote,
    Resolve,
    SeenAt,
    answer_moves,
    decide_answer_changes,
    decide_exit,
    decide_exited,
    decide_finding,
    decide_health_moved,
    decide_open,
    decide_settled,
    decide_stalls,
    idle_start,
    merge_window,
    merged_details,
    stall_opened,
)
from gpuwhy.events import ProcessExited, RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.answer import Answer, GpuFacts, Verdict
from gpuwhy.rules.model import CAUSE, SYMPTOM
from gpuwhy.store.gpu_activity import Bound, GpuIdle, StallFacts
from gpuwhy.store.incident_rows import FindingFacts, MergeFacts, SettledCause

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
        SeenAt(4, NOW),
        NewStall(LOADER, "GPU-a", 901 * S, f"process_stall:{LOADER}:GPU-a"),
        Resolve(5, lc.RECOVERED, NOW, "the GPU is busy again")]
    opened = stall_opened(decided[1], NOW, "blocked on I/O", 3)   # type: ignore[arg-type]
    assert (opened.kind, opened.ts, opened.cause_id, opened.process) == (
        "process_stall", 901 * S, 3, LOADER)
    assert opened.summary == "pid 710 alive but GPU GPU-a near idle for 99s; process " \
        "blocked on I/O"


def test_a_process_bound_twice_sees_no_stall_its_first_binding_ended() -> None:
    facts = StallFacts(
        NOW, bound=(Bound(TRAINER, "GPU-a", 10 * S, None),            # busy again: over
                    Bound(TRAINER, "GPU-a", 10 * S, 900 * S)),        # idle 99 s
        idle={("GPU-a", 900 * S): GpuIdle(900 * S, 901 * S, None)},
        stalls=((4, f"process_stall:{TRAINER}:GPU-a", 950 * S),
                (6, f"process_stall:{TRAINER}:GPU-a", NOW)))        # opened now: kept
    assert decide_stalls(facts, STALL) == [
        Resolve(4, lc.RECOVERED, NOW, "the GPU is busy again"), SeenAt(6, NOW)]


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


SETTLE_NS = 40 * S
XID = Opened("xid", "error", NOW, "Xid 31: MMU fault", "GPU GPU-a: none", "xid:GPU-a:31",
             "GPU-a", TRAINER, {"xid": 31, "named": [[700, "train", 5]]})


def test_each_reset_is_its_own_and_any_other_repeat_may_reopen() -> None:
    assert merge_window("gpu_reset", NOW, 300 * S, 600 * S) == (True, NOW - 300 * S)
    assert merge_window("xid", NOW, 300 * S, 600 * S) == (False, NOW - 600 * S)


def test_a_new_cause_opens_and_adopts_the_effects_found_before_it() -> None:
    insert = decide_open(XID, MergeFacts(), SETTLE_NS, LAG)
    assert isinstance(insert, Insert)
    assert (insert.adopt, insert.joins) == ((NOW, NOW + SETTLE_NS), None)
    row = insert.row
    assert (row["kind"], row["count"], row["state"], row["pid"], row["start_time"],
            row["settle_until"], row["last_seen"], row["cause_id"]) == (
        "xid", 1, lc.OPEN, 700, 5, NOW + SETTLE_NS, NOW, None)
    assert json.loads(row["details"]) == XID.details
    finding_alone = Opened("rule_finding", "warning", NOW, "R1", "", "rule_finding:R1")
    insert = decide_open(finding_alone, MergeFacts(), 0, LAG)     # not a cause: adopts none
    assert isinstance(insert, Insert) and (insert.adopt, insert.joins) == (None, None)


def test_an_effect_opens_as_a_link_that_joins_its_cause() -> None:
    stall = Opened("process_stall", "warning", NOW, "stalled", "", "process_stall:x",
                   "GPU-a", TRAINER, cause_id=3)
    insert = decide_open(stall, MergeFacts(), 0, LAG)
    assert isinstance(insert, Insert)
    assert (insert.adopt, insert.joins, insert.row["cause_id"]) == (None, (3, NOW, NOW + LAG), 3)


def test_a_repeat_merges_at_its_worst_and_reopens_a_resolved_incident() -> None:
    merge = decide_open(XID, MergeFacts((9, 4, "critical", lc.OPEN), {"named": [
        [700, "train", 5]]}), SETTLE_NS, LAG)
    assert merge == Merge(9, 5, "critical", NOW, NOW + SETTLE_NS)
    merge = decide_open(XID, MergeFacts((9, 1, "info", lc.RESOLVED), {}), SETTLE_NS, LAG)
    assert isinstance(merge, Merge)
    assert (merge.severity, merge.reopened) == ("error", "seen again: GPU GPU-a: none")
    assert (merge.details, merge.named_new) == ({"named": [[700, "train", 5]]}, True)


def test_a_repeat_adds_the_reset_it_asks_for_and_the_processes_it_names() -> None:
    assert merged_details({"gpu_reset": True}, {"reboot": True, "gpu_reset": True},
                          False) == ({"gpu_reset": True, "reboot": True}, False, False)
    assert merged_details({"reboot": True}, {"reboot": True}, False) == (None, False, False)
    held = {"named": [[p, "p", None] for p in range(MAX_NAMED - 1)]}
    details, new, full = merged_details(held, {"named": [[100, "x", 1], [0, "p", None]]},
                                        False)
    assert (details["named"][-1], new, full) == ([100, "x", 1], True, True)  # type: ignore[index]
    # once it names as many as it keeps, its repeats read nothing more
    assert merged_details(None, {"named": [[101, "y", 2]]}, True) == (None, False, True)


def test_a_gpu_usable_again_resolves_its_health_incidents_once_and_contradictions_note_the_rest(
        ) -> None:
    back = gh.Transition("GPU-a", NOW, gh.OK, gh.LOST, "nvidia-smi -r", how=gh.BY_RESET)
    again = gh.Transition("GPU-a", NOW + S, gh.OK, gh.LOST, "read", how=None)
    worse = gh.Transition("GPU-b", NOW, gh.LOST, gh.OK, "xid 79")    # leaves nothing unusable
    resolved, noted = decide_health_moved(
        [back, worse, again], [("GPU-a", {"source": "nvml"}), ("GPU-b", {"source": "dcgm"})],
        {"GPU-a": [3, 4], "GPU-b": [7]})
    assert resolved == [
        Resolve(3, gh.RESOLUTION[gh.BY_RESET], NOW, "GPU GPU-a ok again: nvidia-smi -r"),
        Resolve(4, gh.RESOLUTION[gh.BY_RESET], NOW, "GPU GPU-a ok again: nvidia-smi -r")]
    assert noted == [(7, {"source": "dcgm"})]


def test_a_death_soon_after_a_cause_is_its_effect_but_not_of_another_process_xid() -> None:
    died = ProcessExited(ts=NOW, process=TRAINER, signal=9)
    xid = (3, "xid", "Xid 13", "{}", 700, 5, gh.OK)                  # about this process
    others = (4, "xid", "Xid 13", "{}", 999, 1, gh.OK)               # about another one
    reset = (5, "gpu_reset", "GPU reset", json.dumps({"pid": 700, "start_time": 5}), None,
             None, gh.OK)                                            # it reset the GPU itself
    [opened] = decide_exit(died, [("GPU-a", xid), ("GPU-b", others), ("GPU-c", reset),
                                  ("GPU-d", None)])
    assert (opened.kind, opened.gpu_id, opened.cause_id, opened.dedup_key) == (
        "process_exit", "GPU-a", 3, f"process_exit:{TRAINER}")
    assert opened.summary == "pid 700 on GPU GPU-a killed by signal 9"
    lost = (4, "xid", "Xid 13", "{}", 999, 1, gh.LOST)        # but its GPU is unusable
    assert [o.cause_id for o in decide_exit(died, [("GPU-b", lost)])] == [4]


def test_a_moved_answer_is_logged_in_the_new_leads_incident_and_the_old_ones() -> None:
    def verdict(gpu_id: str, rule_id: str | None) -> Verdict:
        lead = Answer(finding(rule_id, CAUSE, gpu_id=gpu_id), CAUSE) if rule_id else None
        return Verdict(GpuFacts(gpu_id, index=int(gpu_id[-1])), "warning", lead, False)
    before = {"GPU-1": ("R1:GPU-a", "R1"), "GPU-2": ("R2:GPU-a", "R2"), "GPU-3": None}
    moves, leads = answer_moves([verdict("GPU-1", "R1"), verdict("GPU-2", "R3"),
                                 verdict("GPU-3", "R4"), verdict("GPU-4", "R5")], before)
    assert moves == [AnswerMove("GPU 2", ("R3:GPU-a", "R3"), ("R2:GPU-a", "R2")),
                     AnswerMove("GPU 3", ("R4:GPU-a", "R4"), None)]   # GPU 4: a first look
    assert leads["GPU-4"] == ("R5:GPU-a", "R5")
    assert decide_answer_changes([(moves[0], 11, 10, True), (moves[1], 12, None, False)],
                                 [12], NOW) == [
        LogLine(11, lc.ANSWERED, NOW, "now the answer on GPU 2 (was: R2)"),
        LogLine(10, lc.NOTE, NOW, "no longer the answer on GPU 2: R3 ranks above it")]
