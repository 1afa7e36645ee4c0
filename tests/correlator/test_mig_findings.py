"""A MIG instance's finding, through the real correlator: its incident, the journal alert
and the stored details name the instance (GPU, instance id, profile)."""

import json

from gpuwhy.events import RuleFinding
from gpuwhy.rules.model import SYMPTOM
from gpuwhy.store.queries import incident_detail, list_incidents

from .conftest import UUID0

R47 = "R47_mig_instance_allocated_but_idle"


def idle_slice(h, t, since, instance="9", state="firing"):
    return RuleFinding(ts=h.at(t), finding_id=f"{R47}:{UUID0}:mig{instance}:{since}",
                       rule_id=R47, title="A MIG instance holds memory but does nothing",
                       severity="warning", state=state, gpu_id=UUID0, since=h.at(since),
                       window_start=h.at(since - 300), window_end=h.at(t), rule_kind=SYMPTOM,
                       evidence={"fb_used_mib": 8210.0, "busy": 0.0},
                       root_cause="An idle notebook keeps a MIG instance's memory.",
                       instance=instance, mig_profile="1g.10gb")


def test_the_incident_and_its_alert_name_the_instance(harness):
    h = harness
    h.feed(h.gpu(0))
    h.feed(idle_slice(h, 400, since=300), idle_slice(h, 400, since=310, instance="10"))
    incidents = sorted(list_incidents(h.db), key=lambda i: i["title"])
    assert [i["title"] for i in incidents] == [
        "A MIG instance holds memory but does nothing: MIG instance 10 (1g.10gb)",
        "A MIG instance holds memory but does nothing: MIG instance 9 (1g.10gb)"]
    nine = incidents[1]
    assert nine["summary"].startswith(f"On MIG instance 9 (1g.10gb) of GPU {UUID0}: Symptom")
    details = incident_detail(h.db, nine["id"])["details"]
    details = json.loads(details) if isinstance(details, str) else details
    assert (details["instance"], details["mig_profile"]) == ("9", "1g.10gb")
    assert any("MIG instance 9 (1g.10gb)" in a["MESSAGE"] for a in h.alerts)
    h.feed(idle_slice(h, 900, since=300, state="cleared"))
    states = {i["title"][-20:]: i["state"] for i in list_incidents(h.db)}
    assert sorted(states.values()) == ["open", "resolved"]
