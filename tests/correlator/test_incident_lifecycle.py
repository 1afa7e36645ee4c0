"""Incident lifecycle and one incident per cause, through the real correlator (writer, decide
stage, store, alerter): an incident is never resolved as it opens; a lost GPU's incident stays
open until a reboot brings the GPU back (a reset and a source reading it again do not); its
effects (a stall, a death, a rule finding, a later Xid 45) are links of it, not incidents or
alerts of their own; an Xid about one process ends with that process; one that leaves the GPU
usable times out, and reopens on a repeat; every change is in the incident's log and in the
journal."""

import re

import pytest

from gpuwhy import lifecycle as lc
from gpuwhy.events import GpuSample, KernelLogCheckpoint, RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.journal import CHANGE_MESSAGE_IDS, MESSAGE_IDS
from gpuwhy.store import incident_changes as store_lifecycle
from gpuwhy.store.queries import incident_detail, list_incidents, reset_history

from .conftest import UUID0

UUID1 = "GPU-00000000-1111-2222-3333-555555555555"
PCI1 = "0000:19:00.0"
TRAINER = ProcessKey(4242, 1000)
OTHER = ProcessKey(5151, 1100)          # on the second GPU, never affected
SMI = ProcessKey(300, 2000)


def two_busy_gpus(h):
    h.feed(h.gpu(0), h.gpu(0, uuid=UUID1, minor=1, pci=PCI1),
           h.process(0.1, TRAINER, "python3"), h.opened(0.2, TRAINER),
           h.process(0.1, OTHER, "python3"), h.opened(0.2, OTHER, minor=1),
           h.sample(0.5, 95.0), h.sample(0.5, 90.0, uuid=UUID1))


def other_gpu_busy(h, start, end):
    """Time passes: the second GPU keeps sampling (the watermark moves, as it does live)."""
    for t in range(start, end):
        h.feed(h.sample(t, 88.0 + t % 5, uuid=UUID1))


def fallen_off(h, t):
    record = h.xid(t, 79, pid=TRAINER.pid, name="python3")
    line = ("NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python3, "
            "GPU has fallen off the bus.")
    return type(record)(**{**record.__dict__, "line": line, "message": line[6:]})


def finding(h, t, since, gpu=UUID0, state="firing"):
    return RuleFinding(ts=h.at(t), finding_id=f"R19:{gpu}:{since}", rule_id="R19_low_sm",
                       title="GPU busy but SMs idle", severity="warning", state=state,
                       gpu_id=gpu, process=TRAINER, window_start=h.at(since - 60),
                       window_end=h.at(t), since=h.at(since), processes=[TRAINER],
                       evidence={"sm_active": 0.02}, root_cause="kernels stall")


def never_resolved_at_birth(h):
    for incident in h.incidents():
        assert incident["closed_at"] is None or incident["closed_at"] > incident["opened_at"], \
            incident


def test_a_lost_gpu_is_one_incident_with_its_effects_open_until_a_reboot(harness):
    h = harness
    two_busy_gpus(h)
    h.feed(fallen_off(h, 1.0))
    [lost] = list_incidents(h.db)
    assert (lost["kind"], lost["state"], lost["closed_at"]) == ("gpu_lost", "open", None)
    # its effects: the Xid 45 that follows, a rule finding on the GPU, the trainer's stall
    # and then its death; none is an incident or an alert of its own
    h.feed(h.xid(2.0, 45, pid=TRAINER.pid), finding(h, 3.0, since=2.5))
    other_gpu_busy(h, 2, 20)
    h.feed(h.exited(21.0, TRAINER, signal=9))
    other_gpu_busy(h, 21, 200)               # past settling, past dedup: still open
    never_resolved_at_birth(h)
    [still] = list_incidents(h.db)
    assert (still["id"], still["state"]) == (lost["id"], "open")
    assert [a["GPUWHY_KIND"] for a in h.alerts] == ["gpu_lost"]
    assert h.alerts[0]["GPU_HEALTH"] == "lost"
    detail = incident_detail(h.db, lost["id"])
    kinds = [link["kind"] for link in detail["chain"]]
    assert kinds[0] == "gpu_lost"
    assert {"later_xid", "rule_finding", "process_stall", "process_exit"} <= set(kinds)
    cause_ts = detail["chain"][0]["ts"]
    assert all(link["ts"] >= cause_ts for link in detail["chain"])   # no effect before it
    effects = [i for i in h.incidents() if i["cause_id"] == lost["id"]]
    assert sorted(i["kind"] for i in effects) == ["process_exit", "process_stall",
                                                   "rule_finding", "xid"]
    assert all(i["gpu_id"] == UUID0 for i in effects)      # the other GPU has nothing
    # a reset, then the source reading it clean: the catalogue's action for Xid 79 is a
    # reboot, so it stays open, and the reading is evidence against it in its chain
    h.feed(h.reset_call(200.0, SMI, path="/dev/nvidia0"), h.sample(201.0, 0.0))
    other_gpu_busy(h, 202, 230)
    [still] = [i for i in h.incidents() if i["id"] == lost["id"]]
    assert still["state"] == "open"
    kinds = [link["kind"] for link in incident_detail(h.db, lost["id"])["chain"]]
    assert "contradicting" in kinds
    # a reboot (a new boot id): resolved at it, as "reboot", with its effects
    h.feed(KernelLogCheckpoint(ts=h.at(231.0), cursor="k9", origin="journald", boot_id="b2"))
    [done] = [i for i in h.incidents() if i["id"] == lost["id"]]
    assert (done["state"], done["resolution"], done["closed_at"]) == \
        ("resolved", "reboot", h.at(231.0))
    assert all(i["state"] == "resolved" for i in h.incidents() if i["cause_id"] == lost["id"])
    log = [(row["action"], row["actor"], row["resolution"])
           for row in incident_detail(h.db, lost["id"])["log"]]
    assert log == [("opened", "gpuwhy", None), ("resolved", "gpuwhy", "reboot")]
    # the reset it needed is its remedy, a link of it: no second critical alert
    assert [(a["GPUWHY_KIND"], a.get("GPUWHY_CHANGE")) for a in h.alerts] == [
        ("gpu_lost", None), ("gpu_lost", "resolved")]
    assert "gpu_reset" in [link["kind"] for link in incident_detail(h.db, lost["id"])["chain"]]
    assert [r["at"] for r in reset_history(h.db)] == [h.at(200.0)]     # still a reset
    change = h.alerts[-1]
    assert (change["MESSAGE_ID"], change["GPUWHY_INCIDENT_ID"], change["GPUWHY_RESOLUTION"],
            change["GPUWHY_STATE"]) == (CHANGE_MESSAGE_IDS["resolved"], str(lost["id"]),
                                        "reboot", "resolved")
    never_resolved_at_birth(h)


def test_xid_48_stays_open_while_the_gpu_needs_a_reset(harness):
    h = harness
    two_busy_gpus(h)
    h.feed(h.xid(1.0, 48))
    other_gpu_busy(h, 2, 150)
    [xid] = list_incidents(h.db)
    assert (xid["kind"], xid["state"]) == ("xid", "open")
    h.feed(h.reset_call(150.0, SMI, path="/dev/nvidia0"), h.sample(151.0, 0.0))
    other_gpu_busy(h, 152, 175)
    [xid] = [i for i in list_incidents(h.db) if i["kind"] == "xid"]
    assert (xid["state"], xid["resolution"]) == ("resolved", "reset")


def test_an_xid_about_one_process_ends_with_it(harness):
    h = harness
    two_busy_gpus(h)
    h.feed(h.xid(1.0, 13, pid=TRAINER.pid, name="python3"))
    [xid] = list_incidents(h.db)
    assert xid["state"] == "open"
    h.feed(h.exited(3.0, TRAINER, signal=6))
    other_gpu_busy(h, 4, 30)
    [xid] = list_incidents(h.db)            # its death is a link, not a second incident
    assert (xid["state"], xid["resolution"], xid["closed_at"]) == \
        ("resolved", "process_exited", h.at(3.0))
    assert "process_exit" in [link["kind"] for link in incident_detail(h.db, xid["id"])["chain"]]


def test_an_xid_about_one_process_is_no_cause_of_another_ones_stall(harness):
    h = harness
    two_busy_gpus(h)
    neighbour = ProcessKey(6060, 1200)
    h.feed(h.process(0.3, neighbour, "serve"), h.opened(0.4, neighbour))
    h.feed(h.xid(1.0, 31, pid=TRAINER.pid, name="python3"), h.sample(1.0, 0.0))
    for t in range(2, 12):
        h.feed(h.sample(t, 0.0), h.sample(t, 90.0, uuid=UUID1))
    stalls = [i for i in h.incidents("process_stall") if i["pid"] == neighbour.pid]
    assert stalls and stalls[0]["cause_id"] is None


def test_an_xid_that_leaves_the_gpu_usable_times_out_and_reopens_on_a_repeat(harness):
    h = harness
    two_busy_gpus(h)
    dedup_s = int(h.config["correlator.dedup_seconds"])
    h.feed(h.xid(1.0, 31))
    other_gpu_busy(h, 2, 1 + dedup_s + 20)
    [xid] = list_incidents(h.db)
    assert (xid["state"], xid["resolution"], xid["closed_at"]) == \
        ("resolved", "timeout", h.at(1.0 + dedup_s))
    h.feed(h.xid(dedup_s + 100.0, 31))
    [again] = list_incidents(h.db)
    assert (again["id"], again["state"], again["count"], again["closed_at"]) == \
        (xid["id"], "open", 2, None)
    assert [row["action"] for row in incident_detail(h.db, xid["id"])["log"]] == [
        "opened", "resolved", "reopened"]
    assert [a["MESSAGE_ID"] for a in h.alerts] == [
        MESSAGE_IDS["xid"], CHANGE_MESSAGE_IDS["resolved"], CHANGE_MESSAGE_IDS["reopened"]]
    # past the reopen window a repeat is a new incident
    reopen_s = int(h.config["correlator.reopen_seconds"])
    other_gpu_busy(h, dedup_s + 101, dedup_s + 180)
    h.feed(GpuSample(ts=h.at(dedup_s + 200 + reopen_s), gpu_id=UUID1, source="sim",
                     simulated=True, fields={"gpu_util": 90.0}))
    h.feed(h.xid(dedup_s + 300.0 + reopen_s, 31))
    assert len(list_incidents(h.db)) == 2
    never_resolved_at_birth(h)


def test_a_finding_alone_is_its_own_incident_dated_when_its_condition_held(harness):
    h = harness
    two_busy_gpus(h)
    h.feed(finding(h, 70.0, since=62.0, gpu=UUID1))
    [incident] = list_incidents(h.db)
    assert (incident["kind"], incident["opened_at"], incident["cause_id"] if "cause_id" in
            incident else None) == ("rule_finding", h.at(62.0), None)
    h.feed(finding(h, 90.0, since=62.0, gpu=UUID1, state="cleared"))
    [incident] = list_incidents(h.db)
    assert (incident["state"], incident["resolution"]) == ("resolved", "recovered")


def test_operators_acknowledge_note_and_resolve(harness):
    h = harness
    two_busy_gpus(h)
    h.feed(fallen_off(h, 1.0))
    [lost] = list_incidents(h.db)
    store_lifecycle.acknowledge(h.db, lost["id"], "alice", "draining the node", ts=h.at(5))
    with pytest.raises(store_lifecycle.LifecycleError):
        store_lifecycle.acknowledge(h.db, lost["id"], "bob")
    store_lifecycle.note(h.db, lost["id"], "bob", "RMA ticket 77", ts=h.at(6))
    other_gpu_busy(h, 2, 40)          # the correlator keeps it acknowledged
    [row] = list_incidents(h.db)
    assert (row["state"], row["acknowledged_by"]) == (lc.ACKNOWLEDGED, "alice")
    store_lifecycle.resolve(h.db, lost["id"], "alice", text="GPU replaced", ts=h.at(41))
    [row] = list_incidents(h.db)
    assert (row["state"], row["resolution"], row["closed_at"]) == \
        ("resolved", "operator", h.at(41))
    with pytest.raises(store_lifecycle.LifecycleError):
        store_lifecycle.resolve(h.db, lost["id"], "alice")
    with pytest.raises(store_lifecycle.IncidentNotFound):
        store_lifecycle.note(h.db, 999, "alice", "x")
    with pytest.raises(store_lifecycle.LifecycleError):
        store_lifecycle.note(h.db, lost["id"], "alice", "x" * (lc.NOTE_MAX + 1))
    log = incident_detail(h.db, lost["id"])["log"]
    assert [(r["action"], r["actor"], r["text"]) for r in log] == [
        ("opened", "gpuwhy", None), ("acknowledged", "alice", "draining the node"),
        ("note", "bob", "RMA ticket 77"), ("resolved", "alice", "GPU replaced")]
    entry = store_lifecycle.change_entry(h.db, log[-1]["id"], "http://x")
    assert entry["MESSAGE"] == f"gpuwhy incident {lost['id']} resolved (operator) by alice: " \
                               "GPU replaced"
    assert (entry["MESSAGE_ID"], entry["GPUWHY_ACTOR"], entry["GPU_ID"]) == \
        (CHANGE_MESSAGE_IDS["resolved"], "alice", UUID0)


def test_a_contention_finding_names_every_process_it_is_about(harness):
    h = harness
    two_busy_gpus(h)
    second = ProcessKey(4343, 1050)
    h.feed(h.process(30.0, second, "python3"), h.opened(30.1, second))
    h.feed(RuleFinding(ts=h.at(60), finding_id="R26:x", rule_id="R26_multi_process_contention",
                       title="Several processes share the GPU", severity="warning",
                       state="firing", gpu_id=UUID0, process=TRAINER,
                       window_start=h.at(0), window_end=h.at(60), since=h.at(40),
                       processes=[TRAINER, second]))
    [incident] = list_incidents(h.db)
    assert incident["opened_at"] == h.at(40)        # not the window's start, h.at(0)
    detail = incident_detail(h.db, incident["id"])
    assert [(link["kind"], link["pid"]) for link in detail["chain"]] == [
        ("rule_finding", TRAINER.pid), ("process", TRAINER.pid), ("process", second.pid)]
    assert {p["pid"] for p in detail["processes"]} == {TRAINER.pid, second.pid}
    assert all(link["ts"] >= incident["opened_at"] for link in detail["chain"])


def test_a_finding_shows_when_it_held_and_its_window_as_a_window(harness, tmp_config):
    from click.testing import CliRunner

    from gpuwhy.app.cli import cli
    from gpuwhy.text import format_ts
    from gpuwhy.webui import create_app

    h = harness
    two_busy_gpus(h)
    h.feed(finding(h, 70.0, since=62.0, gpu=UUID1))
    [incident] = list_incidents(h.db)
    text = CliRunner().invoke(cli, ["incident", str(incident["id"])],
                              env={"GPUWHY_DB": tmp_config["store.path"]}).output
    assert f"held      since {format_ts(h.at(62.0))}; evaluated over " \
           f"{format_ts(h.at(2.0))} – {format_ts(h.at(70.0))}" in text
    html = create_app(tmp_config).test_client().get(f"/incidents/{incident['id']}").text
    text = re.sub(r"<[^>]+>", "", html)     # the page's times are <time> tags, in UTC
    assert f"condition held since {format_ts(h.at(62.0), utc=True)}; evaluated over the " \
           f"window {format_ts(h.at(2.0), utc=True)} – {format_ts(h.at(70.0), utc=True)}" in text
