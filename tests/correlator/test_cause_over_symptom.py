"""Cause over symptom, through the real correlator: a symptom alone is an incident that says
its cause is not established and what is missing; a cause that explains it, arriving later,
becomes that same incident's answer (the alert goes out again with it) and the symptom a
link; a symptom after its cause joins the cause; another GPU's symptom stays its own."""

import dataclasses

from gpuwhy.events import RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.journal import MESSAGE_IDS
from gpuwhy.rules.model import CAUSE, SYMPTOM
from gpuwhy.store.queries import incident_detail, list_incidents

from .conftest import UUID0

UUID1 = "GPU-00000000-1111-2222-3333-555555555555"
TRAINER = ProcessKey(4242, 1000)
BURSTY, STARVED = "R05_bursty_util", "R01_input_cpu_bound"


def bound(h):
    h.feed(h.gpu(0), h.gpu(0, uuid=UUID1, minor=1, pci="0000:19:00.0"),
           h.process(0.1, TRAINER, "python3"), h.opened(0.2, TRAINER))


def symptom(h, t, since, gpu=UUID0, state="firing"):
    return RuleFinding(ts=h.at(t), finding_id=f"{BURSTY}:{gpu}:{since}", rule_id=BURSTY,
                       title="Bursty GPU use", severity="warning", state=state, gpu_id=gpu,
                       process=TRAINER, since=h.at(since), window_start=h.at(since - 60),
                       window_end=h.at(t), rule_kind=SYMPTOM,
                       unexplained=[f"{STARVED}: needs workers.cpu_cores (no samples)"],
                       evidence={"trough_share": 0.4}, root_cause="The GPU idles between steps.")


def cause(h, t, since, state="firing"):
    return RuleFinding(ts=h.at(t), finding_id=f"{STARVED}:{UUID0}:{since}", rule_id=STARVED,
                       title="DataLoader workers cannot keep up", severity="error",
                       state=state, gpu_id=UUID0, process=TRAINER, since=h.at(since),
                       window_start=h.at(since - 60), window_end=h.at(t), rule_kind=CAUSE,
                       explains=[BURSTY], evidence={"worker_cores": 0.98},
                       root_cause="Decoding in the workers takes longer than a step.",
                       fixes=["Raise num_workers"])


def test_a_symptom_alone_says_its_cause_is_not_established(harness):
    h = harness
    bound(h)
    h.feed(symptom(h, 70, since=62))
    [incident] = list_incidents(h.db)
    assert incident["title"] == "Bursty GPU use"
    assert incident["summary"].startswith("Symptom, cause not established: "
                                          f"{STARVED}: needs workers.cpu_cores")


def test_a_later_cause_becomes_the_answer_of_the_same_incident(harness):
    h = harness
    bound(h)
    h.feed(symptom(h, 70, since=62))
    [first] = list_incidents(h.db)
    h.feed(cause(h, 250, since=190))
    [incident] = list_incidents(h.db)
    assert incident["id"] == first["id"]              # the first alert's link still leads here
    assert (incident["title"], incident["severity"], incident["opened_at"]) == \
        ("DataLoader workers cannot keep up", "error", h.at(62))
    detail = incident_detail(h.db, incident["id"])
    assert detail["details"]["rule_id"] == STARVED
    assert [link["kind"] for link in detail["chain"]] == ["rule_finding", "process", "symptom"]
    assert detail["chain"][-1]["evidence"]["rule_id"] == BURSTY
    assert [row["action"] for row in detail["log"]] == ["opened", "answered"]
    # the alert again, with the cause
    assert [(a["MESSAGE_ID"], a["GPUWHY_INCIDENT_ID"]) for a in h.alerts] == \
        [(MESSAGE_IDS["rule_finding"], str(first["id"]))] * 2
    assert "DataLoader workers cannot keep up" in h.alerts[-1]["MESSAGE"]
    # the symptom's own updates still find it; the cause clearing resolves both
    h.feed(symptom(h, 300, since=62, state="cleared"))
    [incident] = list_incidents(h.db)
    assert incident["state"] == "open"
    h.feed(cause(h, 400, since=190, state="cleared"))
    assert [(i["state"], i["resolution"]) for i in h.incidents()] == [("resolved", "recovered")] * 2


def test_a_symptom_after_its_cause_joins_it(harness):
    h = harness
    bound(h)
    h.feed(cause(h, 250, since=190))
    h.feed(symptom(h, 260, since=200))
    [incident] = list_incidents(h.db)
    assert incident["title"] == "DataLoader workers cannot keep up"
    assert "symptom" in [link["kind"] for link in incident_detail(h.db, incident["id"])["chain"]]
    assert len(h.alerts) == 1


def test_a_symptom_on_another_gpu_is_not_explained(harness):
    h = harness
    bound(h)
    h.feed(cause(h, 250, since=190), symptom(h, 260, since=200, gpu=UUID1))
    assert sorted(i["gpu_id"] for i in list_incidents(h.db)) == sorted([UUID0, UUID1])


def test_a_symptom_joins_the_cause_the_answer_ranks_first(harness):
    """Two causes explain the symptom: its incident joins the one `gpuwhy why` leads with
    (the worse), not the one that opened first; the store's findings, read without any rule
    files, rank the same (they keep kind, explains and scope)."""
    from gpuwhy.store.queries import gpu_verdicts
    h = harness
    bound(h)
    h.feed(cause(h, 250, since=190))                   # error, opened first
    sync = RuleFinding(ts=h.at(270), finding_id=f"R03_sync_bound:{UUID0}:200",
                       rule_id="R03_sync_bound", title="Host and GPU take turns",
                       severity="critical", state="firing", gpu_id=UUID0, process=TRAINER,
                       since=h.at(200), window_start=h.at(140), window_end=h.at(270),
                       rule_kind=CAUSE, explains=[BURSTY], scope="process")
    h.feed(sync, symptom(h, 280, since=210))
    causes = {i["title"]: i for i in list_incidents(h.db)}
    assert set(causes) == {"DataLoader workers cannot keep up", "Host and GPU take turns"}
    chain = incident_detail(h.db, causes["Host and GPU take turns"]["id"])["chain"]
    assert "symptom" in [link["kind"] for link in chain]
    [verdict] = [v for v in gpu_verdicts(h.db, {}) if v.gpu.gpu_id == UUID0]
    assert verdict.lead is not None and verdict.lead.rule_id == "R03_sync_bound"
    assert [a.rule_id for a in verdict.candidates] == ["R03_sync_bound", STARVED]


def test_a_change_of_answer_is_a_line_in_both_incidents_logs(harness):
    """The answer on a GPU moves from one cause to a worse one and back when that clears:
    each move is a line in the incident that became the answer and in the one it left."""
    h = harness
    bound(h)
    h.feed(cause(h, 250, since=190))                   # the answer: the starved loader
    worse = RuleFinding(ts=h.at(300), finding_id=f"R03_sync_bound:{UUID0}:290",
                        rule_id="R03_sync_bound", title="Host and GPU take turns",
                        severity="critical", state="firing", gpu_id=UUID0, process=TRAINER,
                        since=h.at(290), window_start=h.at(230), window_end=h.at(300),
                        rule_kind=CAUSE, explains=[BURSTY], scope="process")
    h.feed(worse)
    h.feed(dataclasses.replace(worse, ts=h.at(400), state="cleared"))
    by_title = {i["title"]: incident_detail(h.db, i["id"]) for i in h.incidents()}
    starved = [(r["action"], r["text"]) for r in
               by_title["DataLoader workers cannot keep up"]["log"]][1:]
    synced = [(r["action"], r["text"]) for r in by_title["Host and GPU take turns"]["log"]][1:]
    gpu = "GPU 0 · 0000:18:00.0"
    assert synced[0] == ("answered", f"now the answer on {gpu} (was: DataLoader workers "
                                     "cannot keep up)")
    assert starved[0] == ("note", f"no longer the answer on {gpu}: Host and GPU take turns "
                                  "ranks above it")
    assert starved[1] == ("answered", f"now the answer on {gpu} (was: Host and GPU take turns)")
