"""Incidents on the one severity scale through the real writer, store and decide stage: a
rule finding's ``high`` (the rules' legacy name) or ``error`` merged into a ``warning``
incident keeps the higher severity, and alerts take their PRIORITY from the scale."""

import pytest

from gpuwhy.events import RuleFinding
from gpuwhy.identity import ProcessKey

TRAINER = ProcessKey(4242, 1000)
UUID = "GPU-00000000-1111-2222-3333-444444444444"


def finding(h, t, severity, state="firing"):
    return RuleFinding(ts=h.at(t), finding_id="f-1", rule_id="R01_input_cpu_bound",
                       title="DataLoader workers cannot keep up", severity=severity,
                       state=state, gpu_id=UUID, process=TRAINER, window_start=h.at(t - 1),
                       window_end=h.at(t), evidence={"idle_share": 0.9},
                       root_cause="too few workers", fixes=["raise num_workers"],
                       verify="gpu_util > 80")


def bound(h):
    h.feed(h.gpu(0), h.process(0.1, TRAINER, "train"), h.opened(0.2, TRAINER),
           h.sample(0.5, 95.0))


@pytest.mark.parametrize("worse", ["high", "error"])
def test_a_repeat_merged_into_a_warning_incident_keeps_the_higher_severity(harness, worse):
    h = harness
    bound(h)
    h.feed(finding(h, 5, "warning"), finding(h, 10, "warning", state="cleared"))
    [incident] = h.incidents("rule_finding")
    assert (incident["severity"], incident["state"]) == ("warning", "resolved")
    h.feed(finding(h, 12, worse))                 # the same finding again: merged, reopened
    [incident] = h.incidents("rule_finding")
    assert (incident["severity"], incident["state"], incident["count"]) == \
        ("error", "open", 2)


def test_an_open_incident_keeps_the_worst_its_finding_reached(harness):
    h = harness
    bound(h)
    h.feed(finding(h, 5, "warn"))                 # legacy name: stored as warning
    assert h.incidents("rule_finding")[0]["severity"] == "warning"
    h.feed(finding(h, 20, "high"))
    assert h.incidents("rule_finding")[0]["severity"] == "error"
    h.feed(finding(h, 30, "warning"))             # the finding calms down, the incident not
    [incident] = h.incidents("rule_finding")
    assert (incident["severity"], incident["state"]) == ("error", "open")
    assert h.alerts[0]["PRIORITY"] == "4" and h.alerts[0]["GPUWHY_SEVERITY"] == "warning"


def test_an_incident_opened_under_a_legacy_name_alerts_at_its_level(harness):
    h = harness
    bound(h)
    h.feed(finding(h, 5, "high"))
    [incident] = h.incidents("rule_finding")
    assert incident["severity"] == "error"
    assert (h.alerts[0]["PRIORITY"], h.alerts[0]["GPUWHY_SEVERITY"]) == ("3", "error")
