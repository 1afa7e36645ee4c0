"""The GPU health state machine through the real correlator (writer, decide stage, store):
Xid 79 is lost until a reboot (NVIDIA's catalogue: RESTART_BM), a reset-class Xid needs a
reset, a reset brings the GPU back once the source reads it clean, an Xid whose action is
none leaves it alone, one GPU's trouble leaves the others ok, and every transition carries
its evidence."""

import json

from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from gpuwhy.app.cli import cli
from gpuwhy.events import DriverCall, GpuSample, GpuState, KernelLogCheckpoint, KernelLogRecord
from gpuwhy.identity import ProcessKey
from gpuwhy.store import queries
from gpuwhy.webui import create_app

UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
UUID1 = "GPU-00000000-1111-2222-3333-555555555555"
PCI1 = "0000:19:00.0"
TRAINER = ProcessKey(4242, 1000)
SMI = ProcessKey(300, 2000)


def health(h, gpu=UUID0):
    return queries.gpu_health(h.db, gpu)["health"] or "ok"


def history(h, gpu=UUID0):
    return list(reversed(queries.gpu_health_history(h.db, gpu)))


def two_gpus(h):
    h.feed(h.gpu(0), h.gpu(0, uuid=UUID1, minor=1, pci=PCI1),
           h.process(0.1, TRAINER, "python3"), h.opened(0.2, TRAINER),
           h.sample(0.5, 95.0), h.sample(0.5, 90.0, uuid=UUID1))


def fallen_off(h, t):
    n = next(h.cursor)
    line = ("NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python3, "
            "GPU has fallen off the bus.")
    return KernelLogRecord(ts=h.at(t), cursor=f"c{n}", origin="journald", boot_id="b",
                           record_kind="xid", message=line[6:], xid=79, pci="0000:18:00",
                           pid=4242, name="python3", line=line)


def test_xid_79_is_lost_until_a_reboot_and_the_other_gpu_stays_ok(harness):
    h = harness
    two_gpus(h)
    h.feed(fallen_off(h, 1.0))
    assert health(h) == "lost" and health(h, UUID1) == "ok"
    [row] = [r for r in history(h) if r["state"] == "lost"]
    assert row["previous"] == "ok" and row["cause"] == "xid 79" and row["ts"] == h.at(1.0)
    assert row["evidence"]["event"] == "kernel log xid" and row["evidence"]["xid"] == 79
    assert "fallen off the bus" in row["evidence"]["line"] and row["evidence"]["cursor"]
    assert "reboot" in row["clears"] and row["boot_id"] == "b"
    # later news does not hide it: an Xid 13 here, a sample of the other GPU there
    h.feed(h.xid(2.0, 13, pid=TRAINER.pid), h.sample(2.5, 50.0, uuid=UUID1))
    assert health(h) == "lost" and health(h, UUID1) == "ok"
    # the catalogue's action for Xid 79 is a reboot: a GPU reset and a sample after it
    # (a source answering for it) do not bring it back
    h.feed(h.reset_call(10.0, SMI, path="/dev/nvidia0"))
    h.feed(h.sample(11.0, 0.0))
    assert health(h) == "lost"
    h.feed(KernelLogCheckpoint(ts=h.at(60.0), cursor="k9", origin="journald", boot_id="b2"))
    assert health(h) == "ok"
    assert [(r["previous"], r["state"]) for r in history(h)] == [("ok", "lost"), ("lost", "ok")]
    assert history(h)[1]["cause"] == "reboot" and history(h)[1]["evidence"]["how"] == "reboot"
    assert queries.gpu_health_history(h.db, UUID1) == []


def test_xid_48_needs_a_reset_and_a_reset_clears_it(harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, 48))
    assert health(h) == "reset_required" and health(h, UUID1) == "ok"
    # the source still reads it (NVML does after a DBE): that is no reset
    h.feed(h.sample(2.0, 0.0))
    assert health(h) == "reset_required"
    h.feed(GpuState(ts=h.at(5.0), gpu_id=UUID0, state="resetting", source="nvml",
                    simulated=False, detail="reset"))
    assert health(h) == "resetting"
    # a sample still showing an uncorrectable error after the reset: it did not help
    h.feed(GpuSample(ts=h.at(6.0), gpu_id=UUID0, source="sim", simulated=True,
                     fields={"gpu_util": 0.0, "ecc_dbe_volatile": 2.0}))
    assert health(h) == "reset_required"
    assert history(h)[-1]["cause"] == "uncorrectable_ecc"
    h.feed(h.reset_call(8.0, SMI, path="/dev/nvidia0"), h.sample(9.0, 0.0))
    assert health(h) == "ok"


def test_an_xid_whose_action_is_none_leaves_the_gpu_ok(harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, 13, pid=TRAINER.pid), h.xid(1.5, 43, pid=TRAINER.pid))
    assert health(h) == "ok" and history(h) == []
    assert h.incidents("xid")           # the incident is still opened: health is apart


def test_a_reboot_clears_what_only_a_reboot_clears(harness):
    h = harness
    two_gpus(h)
    h.feed(KernelLogRecord(ts=h.at(1.0), cursor="k1", origin="journald", boot_id="b",
                           record_kind="xid", message="Xid (PCI:0000:19:00): 151, key",
                           xid=151, pci="0000:19:00", line="NVRM: Xid 151"))
    assert health(h, UUID1) == "reboot_required" and health(h) == "ok"
    h.feed(h.reset_call(2.0, SMI, path="/dev/nvidia1"))
    assert health(h, UUID1) == "reboot_required"       # a reset does not help
    h.feed(KernelLogCheckpoint(ts=h.at(100.0), cursor="k2", origin="journald",
                               boot_id="b2"))
    assert health(h, UUID1) == "ok"
    last = history(h, UUID1)[-1]
    assert last["cause"] == "reboot" and last["evidence"]["boot_id_before"] == "b"
    assert last["evidence"]["boot_id_now"] == "b2"


def test_the_source_losing_the_gpu_and_reading_it_again(harness):
    h = harness
    two_gpus(h)
    h.feed(GpuState(ts=h.at(1.0), gpu_id=UUID1, state="lost", source="nvml",
                    simulated=False, detail="NVML: GPU is lost"))
    assert health(h, UUID1) == "lost" and health(h) == "ok"
    h.feed(h.sample(0.9, 50.0, uuid=UUID1))       # late: read before it was lost
    assert health(h, UUID1) == "lost"
    h.feed(GpuState(ts=h.at(20.0), gpu_id=UUID1, state="back", source="sim",
                    simulated=True, detail="reset done"))
    assert health(h, UUID1) == "ok"


def test_throttling_degrades_and_clears_with_a_clean_sample(harness):
    h = harness
    two_gpus(h)
    hot = GpuSample(ts=h.at(1.0), gpu_id=UUID0, source="sim", simulated=True,
                    fields={"gpu_util": 99.0, "clocks_event_reasons": 0x40})
    h.feed(hot)
    assert health(h) == "degraded"
    assert history(h)[-1]["evidence"]["clocks_event_reasons"] == "0x40"
    h.feed(h.sample(2.0, 99.0))
    assert health(h) == "ok" and history(h)[-1]["cause"] == "throttling ended"


def test_throttling_and_its_end_in_one_batch(harness):
    # the decide stage keeps each GPU's health as it moves it within the batch: the clean
    # sample after the hot one, in the same batch, sees the GPU degraded and clears it
    h = harness
    two_gpus(h)
    hot = GpuSample(ts=h.at(1.0), gpu_id=UUID0, source="sim", simulated=True,
                    fields={"gpu_util": 99.0, "clocks_event_reasons": 0x40})
    h.feed(h.sample(0.9, 99.0), hot, h.sample(1.5, 90.0, uuid=UUID1), h.sample(2.0, 99.0))
    assert [r["state"] for r in history(h)][-2:] == ["degraded", "ok"]
    assert health(h) == "ok" and history(h)[-1]["cause"] == "throttling ended"
    assert health(h, UUID1) == "ok"


def test_a_row_remap_event_is_degraded_until_a_reset(harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, 63))
    assert health(h) == "degraded"
    h.feed(h.sample(2.0, 90.0))
    assert health(h) == "degraded"          # waits for the reset that remaps the row
    h.feed(h.xid(3.0, 64))
    assert health(h) == "reset_required"


def remap(h, t, pending, uuid=UUID0):
    return GpuSample(ts=h.at(t), gpu_id=uuid, source="nvml", simulated=False,
                     fields={"gpu_util": 90.0, "row_remap_failed": 0.0,
                             "row_remap_uncorrectable": 1.0, "row_remap_pending": pending})


def test_a_pending_row_remap_is_degraded_until_a_reset_applies_it(harness):
    h = harness
    two_gpus(h)
    h.feed(remap(h, 1.0, 1.0))
    assert health(h) == "degraded" and health(h, UUID1) == "ok"
    [row] = history(h)
    assert (row["previous"], row["state"], row["cause"]) == ("ok", "degraded",
                                                               "row_remap_pending")
    assert row["evidence"]["row_remap_pending"] == 1 and row["evidence"]["source"] == "nvml"
    assert "reset" in row["clears"]
    # the flag stays up sample after sample: still degraded, no new transition
    h.feed(remap(h, 2.0, 1.0), h.sample(3.0, 95.0))
    assert health(h) == "degraded" and len(history(h)) == 1
    h.feed(h.reset_call(10.0, SMI, path="/dev/nvidia0"))
    assert health(h) == "resetting"
    h.feed(remap(h, 11.0, 0.0))             # the reset applied the remap: flag down
    assert health(h) == "ok"
    assert [(r["previous"], r["state"]) for r in history(h)] == [
        ("ok", "degraded"), ("degraded", "resetting"), ("resetting", "ok")]


def test_a_remap_still_pending_after_the_reset_is_degraded_again(harness):
    h = harness
    two_gpus(h)
    h.feed(remap(h, 1.0, 1.0))
    h.feed(GpuState(ts=h.at(5.0), gpu_id=UUID0, state="resetting", source="nvml",
                    simulated=False, detail="reset"))
    h.feed(remap(h, 6.0, 1.0))
    assert health(h) == "degraded"
    assert history(h)[-1]["cause"] == "row_remap_pending"


def test_a_pending_remap_does_not_hide_a_remap_failure(harness):
    h = harness
    two_gpus(h)
    h.feed(remap(h, 1.0, 1.0))
    failed = GpuSample(ts=h.at(2.0), gpu_id=UUID0, source="nvml", simulated=False,
                       fields={"row_remap_failed": 1.0, "row_remap_pending": 1.0})
    h.feed(failed)
    assert health(h) == "reset_required"
    assert history(h)[-1]["cause"] == "row_remap_failure"


def test_an_unknown_gpu_named_only_by_the_kernel_log_gets_a_row(harness):
    h = harness
    h.feed(KernelLogRecord(ts=h.at(1.0), cursor="k1", origin="journald", boot_id="b",
                           record_kind="fallen_off_bus", message="GPU at PCI:0000:3b:00: "
                           "GPU has fallen off the bus.", pci="0000:3b:00", line="NVRM: x"))
    [gpu] = queries.gpus(h.db)
    assert gpu["id"] == "0000:3b:00" and gpu["health"] == "lost" and not gpu["live"]


def test_a_failed_reset_call_is_no_reset(harness):
    h = harness
    two_gpus(h)
    h.feed(h.xid(1.0, 48))
    failed = DriverCall(ts=h.at(2.0), process=SMI, tid=SMI.pid, fd=3, path="/dev/nvidia0",
                        device="nvidiaN", cmd=0xC020462A, nr=0x2A, size=32,
                        op="NV_ESC_RM_CONTROL", latency_ns=5000, ret=0, status=0x1F,
                        status_name="NV_ERR_IN_USE", sub=0x00800102,
                        sub_name="NV0080_CTRL_CMD_BIF_RESET", reasons=["notable"])
    h.feed(failed)
    assert health(h) == "reset_required"


def shown_everywhere(h):
    """GPU id -> health as the GPU page, /api/gpus, /metrics and `gpuwhy status` show it."""
    client = create_app(h.config).test_client()
    api = {g["id"]: (g["health"], g["live"]) for g in client.get("/api/gpus").get_json()}
    metrics = {}
    for family in text_string_to_metric_families(client.get("/metrics").data.decode()):
        for sample in family.samples:
            if sample.name == "gpuwhy_gpu_health" and sample.value == 1:
                metrics[sample.labels["gpu"]] = sample.labels["state"]
    numbers = {s.labels["gpu"] for family in text_string_to_metric_families(
        client.get("/metrics").data.decode()) for s in family.samples
        if s.name == "gpuwhy_gpu_utilization_ratio"}
    result = CliRunner().invoke(cli, ["status", "--json"],
                                env={"GPUWHY_DB": h.config["store.path"], "GPUWHY_PORT": "1"})
    cli_json = {g["gpu"]: g["health"] for g in json.loads(result.output)["gpus"]}
    text = CliRunner().invoke(cli, ["status"], env={"GPUWHY_DB": h.config["store.path"],
                                                    "GPUWHY_PORT": "1"}).output
    pages = {gpu: client.get(f"/gpus/{gpu}").data.decode() for gpu in api}
    return api, metrics, numbers, cli_json, text, pages, client


def test_xid_79_is_lost_on_the_page_the_api_metrics_and_cli_until_a_reboot(harness):
    h = harness
    two_gpus(h)
    h.feed(fallen_off(h, 1.0))
    api, metrics, numbers, cli_json, text, pages, client = shown_everywhere(h)
    assert api == {UUID0: ("lost", False), UUID1: ("ok", True)}
    assert metrics == {UUID0: "lost", UUID1: "ok"}
    assert numbers == {UUID1}                 # the lost GPU's last numbers are not exported
    assert cli_json == {UUID0: "lost", UUID1: "ok"}
    [line] = [x for x in text.splitlines() if UUID0 in x]
    assert "lost" in line and "xid 79" in line and "kernel log xid" in line
    page = pages[UUID0]
    assert 'id="gpu-health">lost<' in page and 'id="stale-note"' in page
    assert 'id="last-values"' in page and "fallen off the bus" in page   # the evidence
    assert 'id="stale-note"' not in pages[UUID1] and 'id="gpu-health">ok<' in pages[UUID1]
    overview = client.get("/").data.decode()
    assert overview.count("stale-note") == 1 and "health-lost" in overview
    detail = client.get(f"/api/gpus/{UUID0}").get_json()
    assert detail["health_history"][0]["cause"] == "xid 79"
    # a reboot (a new boot id), then the source reading it: ok everywhere
    h.feed(KernelLogCheckpoint(ts=h.at(10.0), cursor="k9", origin="journald", boot_id="b2"),
           h.sample(11.0, 0.0))
    api, metrics, numbers, cli_json, *_ = shown_everywhere(h)
    assert api == {UUID0: ("ok", True), UUID1: ("ok", True)}
    assert metrics == {UUID0: "ok", UUID1: "ok"} and numbers == {UUID0, UUID1}
    assert cli_json == {UUID0: "ok", UUID1: "ok"}


def test_an_sbe_storm_is_degraded_and_stays_when_throttling_ends(harness):
    h = harness
    two_gpus(h)

    def sample(t, sbe, reasons=0.0):
        return GpuSample(ts=h.at(t), gpu_id=UUID0, source="sim", simulated=True,
                         fields={"gpu_util": 90.0, "ecc_sbe_volatile": sbe,
                                 "clocks_event_reasons": reasons})
    h.feed(sample(1.0, 0.0, 0x8), sample(2.0, 10.0, 0x8))
    assert health(h) == "degraded"
    h.feed(sample(3.0, 80.0, 0x8))                   # 80 corrected errors within 60 s
    assert queries.gpu_health(h.db, UUID0)["evidence"]["causes"] == ["throttling", "sbe_storm"]
    h.feed(sample(4.0, 80.0))                        # throttling ends, the storm does not
    assert health(h) == "degraded"
    assert queries.gpu_health(h.db, UUID0)["evidence"]["causes"] == ["sbe_storm"]
    assert health(h, UUID1) == "ok"


def fabric(h, t, state, health=None, reasons=0.0, uuid=UUID0):
    fields = {"gpu_util": 0.0, "fabric_state": state, "clocks_event_reasons": reasons}
    if health is not None:
        fields["fabric_health"] = health
    return GpuSample(ts=h.at(t), gpu_id=uuid, source="dcgm", simulated=False, fields=fields)


def test_a_failed_fabric_is_degraded_while_it_lasts_and_ok_once_set_up(harness):
    h = harness
    two_gpus(h)
    # NotStarted and InProgress (Fabric Manager starting, training at boot) are no fault
    h.feed(fabric(h, 1.0, 1.0), fabric(h, 2.0, 2.0), fabric(h, 2.5, 0.0, 0.0, uuid=UUID1))
    assert health(h) == "ok" and health(h, UUID1) == "ok" and not history(h)
    h.feed(fabric(h, 3.0, 4.0, 0.0))                    # Failure
    assert health(h) == "degraded" and health(h, UUID1) == "ok"
    [row] = history(h)
    assert (row["previous"], row["state"], row["cause"]) == ("ok", "degraded", "fabric_failure")
    assert row["evidence"]["fabric_state"] == "Failure" and row["evidence"]["source"] == "dcgm"
    assert "fabric" in row["clears"]
    h.feed(fabric(h, 4.0, 4.0), h.sample(4.5, 0.0))     # still failed; a sample without it
    assert health(h) == "degraded" and len(history(h)) == 1
    h.feed(fabric(h, 60.0, 3.0, 1.0))                   # Fabric Manager set it up: Success
    assert health(h) == "ok"
    assert [(r["previous"], r["state"], r["cause"]) for r in history(h)] == [
        ("ok", "degraded", "fabric_failure"), ("degraded", "ok", "fabric set up again")]


def test_an_unhealthy_fabric_is_degraded_and_clears_on_its_own_beside_throttling(harness):
    h = harness
    two_gpus(h)
    h.feed(fabric(h, 1.0, 3.0, 2.0, reasons=0x40))      # Success, but Unhealthy; HW thermal
    assert queries.gpu_health(h.db, UUID0)["evidence"]["causes"] == ["throttling",
                                                                      "fabric_unhealthy"]
    h.feed(fabric(h, 2.0, 3.0, 2.0))                    # throttling ends, the fabric does not
    assert health(h) == "degraded"
    assert queries.gpu_health(h.db, UUID0)["evidence"]["causes"] == ["fabric_unhealthy"]
    h.feed(fabric(h, 3.0, 3.0, 3.0))                    # limited capacity: no longer unhealthy
    assert health(h) == "ok" and history(h)[-1]["cause"] == "fabric healthy again"


def test_a_fabric_failure_does_not_hide_a_gpu_that_needs_a_reset(harness):
    h = harness
    two_gpus(h)
    h.feed(fabric(h, 1.0, 4.0))
    failed = GpuSample(ts=h.at(2.0), gpu_id=UUID0, source="dcgm", simulated=False,
                       fields={"row_remap_failed": 1.0, "fabric_state": 4.0})
    h.feed(failed, fabric(h, 3.0, 3.0))                 # the fabric comes up: still a reset
    assert health(h) == "reset_required"
    assert history(h)[-1]["cause"] == "row_remap_failure"
