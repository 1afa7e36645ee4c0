"""GPU health follows NVIDIA's Xid catalogue, and the incidents resting on it never disagree
with it, through the real correlator (writer, decide stage, store):

- an Xid 79 (fallen off the bus; the catalogue's action is RESTART_BM, a reboot) stays
  ``lost`` while a source keeps reading the GPU, its incident open, the readings kept as
  contradicting evidence; a reboot (a new boot id) clears both, how: reboot;
- an Xid 48 (RESET_GPU) stays ``reset_required`` while samples arrive; a reset call that
  returned NV_OK clears it (with the source's clean read after it), how: reset;
- an operator's mark-healthy clears any state, who and why kept on both;
- a GPU source's own "lost", with no kernel Xid, is still cleared by its reading the GPU
  again (how: recovered): the old rule stays right for that one entry;
- every state x every event: after each, the open health-backed incidents match the health
  state, and no state is cleared by what it was not waiting for.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwhy import gpu_health as gh
from gpuwhy import lifecycle as lc
from gpuwhy.app.cli import cli
from gpuwhy.config import load_config
from gpuwhy.events import DriverCall, GpuSample, GpuState, KernelLogCheckpoint, KernelLogRecord
from gpuwhy.identity import ProcessKey
from gpuwhy.reset import BIF_RESET, RESET_CONTROLS
from gpuwhy.store import health as store_health
from gpuwhy.store import incident_changes as store_lifecycle
from gpuwhy.store import queries
from gpuwhy.xid import xid_info

from .conftest import UUID0, Harness

UUID1 = "GPU-00000000-1111-2222-3333-555555555555"
PCI1 = "0000:19:00.0"
TRAINER = ProcessKey(4242, 1000)
SMI = ProcessKey(300, 2000)
# A reboot-class Xid other than 79, read from the catalogue (its action: RESTART_BM/VM)
REBOOT_XID = next(c for c in range(1, 256) if c != 79 and xid_info(c).reboot)


def health(h, gpu=UUID0) -> str:
    return queries.gpu_health(h.db, gpu)["health"] or "ok"


def history(h, gpu=UUID0) -> list[dict]:
    return list(reversed(queries.gpu_health_history(h.db, gpu, limit=500)))


def two_gpus(h) -> None:
    h.feed(h.gpu(0), h.gpu(0, uuid=UUID1, minor=1, pci=PCI1),
           h.process(0.1, TRAINER, "python3"), h.opened(0.2, TRAINER),
           h.sample(0.5, 95.0), h.sample(0.5, 90.0, uuid=UUID1))


def reboot(h, t: float, boot: str = "b2") -> KernelLogCheckpoint:
    return KernelLogCheckpoint(ts=h.at(t), cursor=f"boot-{t}", origin="journald", boot_id=boot)


def incident(h, incident_id: int) -> dict:
    [row] = [i for i in h.incidents() if i["id"] == incident_id]
    return row


def chain_in_time_order(h) -> None:
    for row in h.incidents():
        times = [link["ts"] for link in h.links(row["id"])]
        assert times == sorted(times), (row["kind"], [(link["kind"], link["ts"])
                                                      for link in h.links(row["id"])])


def test_xid_79_then_samples_stays_lost_and_open_until_a_reboot(harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, 79, pid=TRAINER.pid, name="python3"))
    [lost] = h.incidents("gpu_lost")
    # a counter source answers for it again, second after second; it says it is back; a
    # reset call returns NV_OK: none of them is the reboot the catalogue asks for
    for t in range(2, 8):
        h.feed(h.sample(t, 0.0), h.sample(t, 80.0, uuid=UUID1))
    h.feed(GpuState(ts=h.at(8.0), gpu_id=UUID0, state="back", source="sim", simulated=True,
                    detail="answers"))
    h.feed(h.reset_call(9.0, SMI, path="/dev/nvidia0"), h.sample(10.0, 0.0))
    assert health(h) == "lost" and health(h, UUID1) == "ok"
    assert incident(h, lost["id"])["state"] == "open"
    assert [(r["previous"], r["state"], r["cause"]) for r in history(h)] == [
        ("ok", "lost", "xid 79")]
    now = queries.gpu_health(h.db, UUID0)
    assert now["evidence"]["clears_by"] == ["reboot"]
    assert "reboot" in queries.gpu(h.db, UUID0)["health_clears"]
    # the first reading is kept once as evidence against it, on the GPU and the incident
    assert now["evidence"]["contradicted"]["ts"] == h.at(2.0)
    steps = [link for link in h.links(lost["id"]) if link["kind"] == "contradicting"]
    assert len(steps) == 1 and steps[0]["ts"] == h.at(2.0)
    assert "not a recovery" in steps[0]["summary"] and "reboot" in steps[0]["summary"]
    # a reboot: both clear, at the reboot, how: reboot
    h.feed(reboot(h, 30.0))
    assert health(h) == "ok"
    last = history(h)[-1]
    assert (last["previous"], last["state"], last["cause"], last["ts"]) == \
        ("lost", "ok", "reboot", h.at(30.0))
    assert last["evidence"]["how"] == "reboot"
    done = incident(h, lost["id"])
    assert (done["state"], done["resolution"], done["closed_at"]) == \
        ("resolved", lc.REBOOT, h.at(30.0))
    assert [(r["action"], r["resolution"]) for r in
            queries.incident_log(h.db, lost["id"])][-1] == ("resolved", "reboot")
    chain_in_time_order(h)


def test_xid_48_then_samples_stays_reset_required_until_a_reset_call(harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, 48))
    [xid] = h.incidents("xid")
    for t in range(2, 6):
        h.feed(h.sample(t, 0.0))
    assert health(h) == "reset_required" and incident(h, xid["id"])["state"] == "open"
    h.feed(h.reset_call(6.0, SMI, path="/dev/nvidia0"))
    # the reset is seen: resetting until the source reads it clean, still unusable
    assert health(h) == "resetting" and incident(h, xid["id"])["state"] == "open"
    h.feed(h.sample(7.0, 0.0))
    assert health(h) == "ok"
    last = history(h)[-1]
    assert (last["previous"], last["state"], last["evidence"]["how"]) == \
        ("resetting", "ok", "reset")
    done = incident(h, xid["id"])
    assert (done["state"], done["resolution"], done["closed_at"]) == \
        ("resolved", lc.RESET, h.at(7.0))


def test_a_reset_class_xid_is_not_cleared_by_a_failed_reset_or_a_reboot_class_one_by_a_reset(
        harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, REBOOT_XID), h.sample(2.0, 0.0))
    assert health(h) == "reboot_required"
    h.feed(h.reset_call(3.0, SMI, path="/dev/nvidia0"), h.sample(4.0, 0.0))
    assert health(h) == "reboot_required"
    [xid] = h.incidents("xid")
    assert xid["state"] == "open"
    h.feed(reboot(h, 5.0))
    assert (health(h), incident(h, xid["id"])["resolution"]) == ("ok", lc.REBOOT)


def test_an_xid_154_follows_the_recovery_action_its_line_names(harness):
    # Xid 154 says its new recovery action in the line: "None" leaves the GPU alone; a later
    # "Node Reboot Required" (merged into the same incident) needs the reboot, health and
    # incident alike
    h = harness
    two_gpus(h)

    def xid154(t, action):
        record = h.xid(t, 154)
        return KernelLogRecord(**{**record.__dict__, "details": {"recovery_to": action}})
    h.feed(xid154(1.0, "None"))
    assert health(h) == "ok"
    h.feed(xid154(2.0, "Node Reboot Required"), h.sample(3.0, 0.0))
    h.feed(h.reset_call(4.0, SMI, path="/dev/nvidia0"), h.sample(5.0, 0.0))
    [xid] = h.incidents("xid")
    assert (health(h), xid["state"], xid["count"]) == ("reboot_required", "open", 2)
    assert queries.gpu_health(h.db, UUID0)["evidence"]["clears_by"] == ["reboot"]
    h.feed(reboot(h, 9.0))
    assert (health(h), incident(h, xid["id"])["resolution"]) == ("ok", lc.REBOOT)


def test_mark_healthy_clears_with_who_and_why(harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, 79, pid=TRAINER.pid, name="python3"), h.sample(2.0, 0.0))
    [lost] = h.incidents("gpu_lost")
    done = store_health.mark_healthy(h.db, UUID0, "alice", "GPU replaced, RMA 77",
                                     ts=h.at(40.0))
    assert (done["previous"], done["state"], done["incidents"]) == ("lost", "ok", [lost["id"]])
    assert health(h) == "ok"
    last = history(h)[-1]
    assert (last["cause"], last["ts"], last["evidence"]["how"]) == \
        ("marked healthy by alice", h.at(40.0), "operator")
    assert (last["evidence"]["by"], last["evidence"]["why"]) == ("alice", "GPU replaced, RMA 77")
    row = incident(h, lost["id"])
    assert (row["state"], row["resolution"], row["closed_at"]) == \
        ("resolved", lc.OPERATOR, h.at(40.0))
    log = queries.incident_log(h.db, lost["id"])[-1]
    assert (log["action"], log["actor"], log["resolution"], log["text"]) == \
        ("resolved", "alice", "operator", "GPU replaced, RMA 77")
    # the correlator goes on from ok: a sample is no news
    h.feed(h.sample(41.0, 50.0))
    assert health(h) == "ok" and incident(h, lost["id"])["state"] == "resolved"
    with pytest.raises(store_health.HealthError, match="ok already"):
        store_health.mark_healthy(h.db, UUID0, "alice", "again")
    with pytest.raises(store_health.HealthError, match="reason"):
        store_health.mark_healthy(h.db, UUID1, "alice", "  ")


def test_an_operator_resolving_a_lost_gpus_incident_marks_the_gpu_healthy(harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, 79), h.xid(1.5, REBOOT_XID, pci=PCI1[:-2]))
    [lost] = h.incidents("gpu_lost")
    store_lifecycle.resolve(h.db, lost["id"], "alice", text="GPU replaced", ts=h.at(20.0))
    assert health(h) == "ok" and health(h, UUID1) == "reboot_required"
    last = history(h)[-1]
    assert (last["cause"], last["evidence"]["how"], last["evidence"]["by"]) == \
        ("marked healthy by alice", "operator", "alice")
    assert "GPU replaced" in last["evidence"]["why"]


def test_gpu_mark_healthy_on_the_command_line(harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, 48, pci=PCI1[:-2]))
    assert health(h, UUID1) == "reset_required"
    env = {"GPUWHY_DB": h.config["store.path"], "GPUWHY_CORRELATOR_URL": "http://x"}
    result = CliRunner().invoke(cli, ["gpu", "mark-healthy", "1", "--by", "bob", "--why",
                                      "reseated the riser", "--json"], env=env)
    assert result.exit_code == 0, result.output
    done = json.loads(result.stdout.splitlines()[-1])
    assert (done["gpu"], done["previous"], done["state"]) == (UUID1, "reset_required", "ok")
    [xid] = h.incidents("xid")
    assert done["incidents"] == [xid["id"]]
    assert (xid["state"], xid["resolution"]) == ("resolved", "operator")
    assert history(h, UUID1)[-1]["evidence"]["by"] == "bob"
    again = CliRunner().invoke(cli, ["gpu", "mark-healthy", "1", "--by", "bob", "--why", "x"],
                               env=env)
    assert again.exit_code != 0 and "ok already" in again.output


def test_a_sources_own_lost_is_cleared_by_reading_the_gpu_again(harness):
    h = harness
    two_gpus(h)
    h.feed(GpuState(ts=h.at(1.0), gpu_id=UUID0, state="lost", source="nvml", simulated=False,
                    detail="NVML: GPU is lost"))
    [lost] = h.incidents("gpu_lost")
    h.feed(h.sample(2.0, 40.0))
    assert health(h) == "ok" and history(h)[-1]["evidence"]["how"] == "read"
    assert (incident(h, lost["id"])["resolution"], incident(h, lost["id"])["closed_at"]) == \
        (lc.RECOVERED, h.at(2.0))


def test_a_kernel_xid_79_on_a_gpu_the_source_lost_waits_for_the_reboot(harness):
    h = harness
    two_gpus(h)
    h.feed(GpuState(ts=h.at(1.0), gpu_id=UUID0, state="lost", source="nvml", simulated=False,
                    detail="NVML: GPU is lost"))
    h.feed(h.xid(1.5, 79))
    assert queries.gpu_health(h.db, UUID0)["evidence"]["clears_by"] == ["reboot"]
    h.feed(h.sample(2.0, 40.0), GpuState(ts=h.at(3.0), gpu_id=UUID0, state="back",
                                         source="nvml", simulated=False, detail="back"))
    assert health(h) == "lost"
    [lost] = h.incidents("gpu_lost")
    assert lost["state"] == "open"


def test_a_lost_source_on_a_reboot_class_gpu_still_waits_for_the_reboot(harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, REBOOT_XID))
    h.feed(GpuState(ts=h.at(2.0), gpu_id=UUID0, state="lost", source="nvml", simulated=False,
                    detail="NVML: GPU is lost"))
    h.feed(h.sample(3.0, 40.0))
    assert health(h) == "lost"
    assert queries.gpu_health(h.db, UUID0)["evidence"]["clears_by"] == ["reboot"]


# --- chain steps in time order ---------------------------------------------------------------
def test_a_reset_seen_by_the_source_before_the_call_returned_is_in_time_order(harness):
    h = harness
    two_gpus(h)
    # the GPU source sees the reset begin at 1.0; the reset call, made at 0.5, returns at 3.0
    # (it was stamped then): its step is dated when it was made, before the reset
    slow = DriverCall(ts=h.at(3.0), process=SMI, tid=SMI.pid, fd=3, path="/dev/nvidia0",
                      device="nvidiaN", cmd=0xC020462A, nr=0x2A, size=32,
                      op="NV_ESC_RM_CONTROL", latency_ns=int(2.5e9), ret=0, sub=BIF_RESET,
                      sub_name=RESET_CONTROLS[0], reasons=["notable"])
    h.feed(h.process(0.3, SMI, "nvidia-smi"), h.opened(0.4, SMI),
           GpuState(ts=h.at(1.0), gpu_id=UUID0, state="resetting", source="sim",
                    simulated=True, detail="reset"), slow)
    [reset] = h.incidents("gpu_reset")
    links = h.links(reset["id"])
    assert [(link["kind"], link["ts"]) for link in links] == [
        ("operator_command", h.at(0.5)), ("driver_call", h.at(0.5)),
        ("gpu_reset", h.at(1.0)), ("process", h.at(1.0))]      # the trainer, hit by it
    chain_in_time_order(h)


def test_an_effect_found_later_follows_the_process_the_xid_line_named(harness):
    from gpuwhy.events import RuleFinding

    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, 79, pid=TRAINER.pid, name="python3"))
    h.feed(RuleFinding(ts=h.at(3.0), finding_id="R19:x", rule_id="R19_low_sm",
                       title="GPU busy but SMs idle", severity="warning", state="firing",
                       gpu_id=UUID0, process=TRAINER, window_start=h.at(0),
                       window_end=h.at(3.0), since=h.at(2.5), processes=[TRAINER]))
    [lost] = h.incidents("gpu_lost")
    kinds = [link["kind"] for link in h.links(lost["id"])]
    assert kinds.index("process") < kinds.index("rule_finding")
    chain_in_time_order(h)


# --- every state x every event -----------------------------------------------------------------
SETUPS = ("ok", "degraded", "reset_required_xid", "reset_required_ecc", "reboot_required",
          "lost_xid", "lost_source", "resetting")
EVENTS = ("xid79", "xid48", "xid_reboot", "xid13", "state_lost", "state_reset_required",
          "state_resetting", "state_back", "sample", "sample_dbe", "sample_hot", "reset_ok",
          "reset_failed", "mark_healthy", "resolve_incident")


def gpu_n(n: int) -> tuple[str, str]:
    """The n-th GPU of a state table: its UUID and PCI address."""
    return f"GPU-00000000-1111-2222-3333-{n:012d}", f"0000:{0x20 + n:02x}:00.0"


def sample(h, t: float, uuid: str, **fields: float) -> GpuSample:
    return GpuSample(ts=h.at(t), gpu_id=uuid, source="sim", simulated=True,
                     fields={"gpu_util": 50.0, **fields})


def state(h, t: float, uuid: str, word: str) -> GpuState:
    return GpuState(ts=h.at(t), gpu_id=uuid, state=word, source="sim", simulated=True,
                    detail=word)


def kernel_xid(h, t: float, pci: str, code: int) -> KernelLogRecord:
    return h.xid(t, code, pci=pci[:-2])


def reset_call(h, t: float, minor: int, status: int = 0) -> DriverCall:
    call = h.reset_call(t, SMI, path=f"/dev/nvidia{minor}")
    if status:
        return DriverCall(**{**call.__dict__, "status": status, "status_name": "NV_ERR_IN_USE"})
    return call


def setup_events(h, t: float, n: int, setup: str) -> list:
    uuid, pci = gpu_n(n)
    return {
        "ok": [],
        "degraded": [sample(h, t, uuid, clocks_event_reasons=0x40)],
        "reset_required_xid": [kernel_xid(h, t, pci, 48)],
        "reset_required_ecc": [sample(h, t, uuid, ecc_dbe_volatile=1.0)],
        "reboot_required": [kernel_xid(h, t, pci, REBOOT_XID)],
        "lost_xid": [kernel_xid(h, t, pci, 79)],
        "lost_source": [state(h, t, uuid, "lost")],
        "resetting": [kernel_xid(h, t, pci, 48), state(h, t + 0.1, uuid, "resetting")],
    }[setup]


def apply_event(h, t: float, n: int, event: str) -> None:
    uuid, pci = gpu_n(n)
    if event == "mark_healthy":
        if health(h, uuid) != "ok":
            store_health.mark_healthy(h.db, uuid, "carol", "checked it", ts=h.at(t))
        return
    if event == "resolve_incident":            # `gpuwhy incident ID resolve`, the web view
        for incident_id in store_health.active_health_incidents(h.db, uuid)[:1]:
            store_lifecycle.resolve(h.db, incident_id, "dave", text="swapped", ts=h.at(t))
        return
    made = {
        "xid79": lambda: kernel_xid(h, t, pci, 79),
        "xid48": lambda: kernel_xid(h, t, pci, 48),
        "xid_reboot": lambda: kernel_xid(h, t, pci, REBOOT_XID),
        "xid13": lambda: kernel_xid(h, t, pci, 13),
        "state_lost": lambda: state(h, t, uuid, "lost"),
        "state_reset_required": lambda: state(h, t, uuid, "reset_required"),
        "state_resetting": lambda: state(h, t, uuid, "resetting"),
        "state_back": lambda: state(h, t, uuid, "back"),
        "sample": lambda: sample(h, t, uuid),
        "sample_dbe": lambda: sample(h, t, uuid, ecc_dbe_volatile=1.0),
        "sample_hot": lambda: sample(h, t, uuid, clocks_event_reasons=0x40),
        "reset_ok": lambda: reset_call(h, t, n),
        "reset_failed": lambda: reset_call(h, t, n, status=0x1F),
    }[event]()
    h.feed(made)


def agree(h) -> None:
    """Health and the incidents resting on it tell one story, for every GPU: a health-backed
    incident is open exactly while its GPU is unusable (where an Xid made it so, one is
    open); each one resolved says how its GPU was cleared; and no state was cleared by
    anything it was not waiting for."""
    for gpu in queries.gpus(h.db):
        gpu_id, now = gpu["id"], gpu["health"] or gh.OK
        active = store_health.active_health_incidents(h.db, gpu_id)
        if now not in gh.UNUSABLE:
            assert active == [], (gpu_id, now, active)
        current = queries.gpu_health(h.db, gpu_id)
        if now in (gh.LOST, gh.RESET_REQUIRED, gh.REBOOT_REQUIRED) and \
                gh.cause_xid(current["evidence"].get("cause")) is not None:
            assert active, (gpu_id, now, current["evidence"])
        rows = history(h, gpu_id)
        for before, row in zip(rows, rows[1:], strict=False):
            if row["previous"] in gh.UNUSABLE and row["state"] not in gh.UNUSABLE:
                how = row["evidence"].get("how")
                waited = gh.stored_remedies(before["state"], before["evidence"])
                assert how == gh.BY_OPERATOR or how in waited, (gpu_id, before, row)
        for done in h.db.execute_returning_dicts(
                f"select id, opened_at, closed_at, resolution from incidents where "
                f"gpu_id = ? and cause_id is null and state = 'resolved' and "
                f"{store_health.HEALTH_BACKED_SQL}", [gpu_id]):
            cleared = store_health.last_clearing(h.db, gpu_id, done["opened_at"])
            assert cleared is not None, (gpu_id, done)
            assert done["closed_at"] > done["opened_at"], done      # never at its birth
            clearing = [r for r in rows if r["ts"] >= done["opened_at"] and
                        r["previous"] in gh.UNUSABLE and r["state"] not in gh.UNUSABLE and
                        r["ts"] <= done["closed_at"]]
            assert clearing, (gpu_id, done, rows)
            assert done["resolution"] == gh.RESOLUTION[clearing[-1]["evidence"]["how"]], \
                (gpu_id, done, clearing[-1])


@pytest.mark.parametrize("setup", SETUPS)
def test_every_event_in_every_state_keeps_incidents_and_health_in_agreement(make_harness,
                                                                            tmp_config,
                                                                            setup):
    h = make_harness(tmp_config)
    count = len(EVENTS) + 1             # the last GPU keeps its state until the reboot
    seen = []
    for n in range(count):
        uuid, pci = gpu_n(n)
        seen += [h.gpu(0, uuid=uuid, minor=n, pci=pci), sample(h, 0.5, uuid)]
    h.feed(*seen)
    h.feed(*[e for n in range(count) for e in setup_events(h, 1.0, n, setup)])
    agree(h)
    for n, event in enumerate(EVENTS):
        apply_event(h, 10.0 + n, n, event)
        agree(h)
        h.feed(sample(h, 10.5 + n, gpu_n(n)[0]))         # a counter source answers again
        agree(h)
    h.feed(reboot(h, 100.0))
    agree(h)
    assert all((g["health"] or "ok") == "ok" for g in queries.gpus(h.db))
    assert store_health.active_health_incidents(h.db, gpu_n(count - 1)[0]) == []


@pytest.mark.slow
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from((*EVENTS, "reboot")), min_size=1, max_size=8))
def test_any_sequence_of_events_keeps_incidents_and_health_in_agreement(events):
    # Sequences, not only single steps: what a state waits for must survive the facts that
    # follow it (a source's "lost" on a GPU that needs a reboot, a second Xid, a reset that
    # did not help). Each example has a store of its own.
    with tempfile.TemporaryDirectory() as folder:
        config = load_config(environ={"GPUWHY_DB": f"{folder}/gpuwhy.db",
                                      "GPUWHY_BUS": f"ipc://{folder}/bus.sock",
                                      "GPUWHY_DEVICE_GLOB": f"{Path(folder)}/nvidia*"})
        h = Harness(config, 1_800_000_000 * 10**9)
        try:
            uuid, pci = gpu_n(0)
            h.feed(h.gpu(0, uuid=uuid, minor=0, pci=pci), sample(h, 0.5, uuid))
            for step, event in enumerate(events):
                t = 10.0 * (step + 1)
                if event == "reboot":
                    h.feed(reboot(h, t, boot=f"boot{step}"))
                else:
                    apply_event(h, t, 0, event)
                agree(h)
                h.feed(sample(h, t + 5, uuid))          # a counter source answers again
                agree(h)
        finally:
            h.close()
