"""GPU health is decided from plain facts: no database, no correlator."""

from __future__ import annotations

from gpuwhy import gpu_health as gh
from gpuwhy.correlator.health_decide import HealthDecider
from gpuwhy.events import DriverCall, GpuSample, GpuState, GpuXid, KernelLogRecord
from gpuwhy.identity import ProcessKey
from gpuwhy.reset import BIF_RESET, RESET_CONTROLS
from gpuwhy.store.health import GpuHealthNow, HealthFacts

S = 1_000_000_000
GPU = "GPU-00000000-1111-2222-3333-444444444444"
BOOT = "b1"


def after(move: gh.Transition, source: str | None = "nvml") -> GpuHealthNow:
    """The GPU's health as the store gives it back once ``move`` is applied."""
    return GpuHealthNow(move.gpu_id, move.state, move.ts, move.body(), move.boot_id, source)


def xid79(ts: int) -> KernelLogRecord:
    line = "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus."
    return KernelLogRecord(ts=ts, cursor="c1", origin="journald", boot_id=BOOT,
                           record_kind="xid", message=line[6:], xid=79, pci="0000:18:00",
                           line=line)


def sample(ts: int, **fields: float) -> GpuSample:
    return GpuSample(ts=ts, gpu_id=GPU, source="nvml", simulated=True,
                     fields={"gpu_util": 10.0, **fields})


def reset_call(ts: int) -> DriverCall:
    return DriverCall(ts=ts, process=ProcessKey(900, 9), tid=900, fd=3, path="/dev/nvidia0",
                      device="nvidiaN", cmd=0xC020462A, nr=0x2A, size=32,
                      op="NV_ESC_RM_CONTROL", latency_ns=5000, ret=0, sub=BIF_RESET,
                      sub_name=RESET_CONTROLS[0])


def test_an_xid_79_in_the_kernel_log_moves_the_gpu_to_lost_until_a_reboot() -> None:
    decider = HealthDecider(host_boot=BOOT)
    steps = decider.decide(xid79(10 * S), HealthFacts({GPU: after_ok()}, named=(GPU,),
                                                      not_ok=()))
    assert len(steps) == 1
    move = steps[0]
    assert isinstance(move, gh.Transition)
    assert (move.gpu_id, move.previous, move.state, move.cause) == (GPU, gh.OK, gh.LOST,
                                                                     "xid 79")
    assert move.remedies == {gh.BY_REBOOT} and move.boot_id == BOOT
    assert move.evidence["xid"] == 79 and move.pci == "0000:18:00"
    # a reset does not clear what only a reboot clears
    assert decider.decide(reset_call(11 * S), HealthFacts({GPU: after(move)},
                                                          named=(GPU,))) == []


def after_ok() -> GpuHealthNow:
    return GpuHealthNow(GPU, gh.OK, 0, {}, BOOT, "nvml")


def test_a_reset_after_reset_required_returns_the_gpu_to_ok() -> None:
    decider = HealthDecider(host_boot=BOOT)
    [needed] = decider.decide(GpuXid(ts=10 * S, gpu_id=GPU, xid=48, source="nvml",
                                     simulated=False), HealthFacts({GPU: after_ok()}, (GPU,)))
    assert isinstance(needed, gh.Transition) and needed.state == gh.RESET_REQUIRED
    assert needed.remedies == {gh.BY_RESET, gh.BY_REBOOT}
    # the GPU source says it is resetting, then reads it clean again
    [resetting] = decider.decide(GpuState(ts=11 * S, gpu_id=GPU, state="resetting",
                                          source="nvml", simulated=False),
                                 HealthFacts({GPU: after(needed)}, (GPU,)))
    assert isinstance(resetting, gh.Transition)
    assert (resetting.previous, resetting.state, resetting.how) == (
        gh.RESET_REQUIRED, gh.RESETTING, gh.BY_RESET)
    clean = sample(12 * S)
    signs = decider.sample_signs(clean)
    assert signs is not None and signs.quiet
    [back] = decider.sample(clean, signs, after(resetting))
    assert isinstance(back, gh.Transition)
    assert (back.previous, back.state, back.how) == (gh.RESETTING, gh.OK, gh.BY_RESET)
    assert back.leaves_unusable


def test_a_reset_call_on_a_gpu_no_source_reads_goes_on_to_ok_in_one_event() -> None:
    decider = HealthDecider(host_boot=BOOT)
    needed = GpuHealthNow(GPU, gh.RESET_REQUIRED, 5 * S,
                          {"cause": "xid 48", "clears_by": ["reboot", "reset"]}, BOOT, None)
    steps = decider.decide(reset_call(10 * S), HealthFacts({GPU: needed}, (GPU,)))
    assert [(s.previous, s.state, s.cause) for s in steps if isinstance(s, gh.Transition)] == [
        (gh.RESET_REQUIRED, gh.RESETTING, "reset"), (gh.RESETTING, gh.OK, "reset done")]


def test_a_sample_from_a_lost_gpu_is_a_contradiction_not_a_recovery() -> None:
    decider = HealthDecider(host_boot=BOOT)
    [lost] = decider.decide(xid79(10 * S), HealthFacts({GPU: after_ok()}, (GPU,), ()))
    assert isinstance(lost, gh.Transition)
    read = sample(11 * S)
    signs = decider.sample_signs(read)
    assert signs is not None
    [seen] = decider.sample(read, signs, after(lost))
    assert isinstance(seen, gh.Contradiction)
    gpu_id, said = seen
    assert gpu_id == GPU and said["state"] == gh.LOST and said["clears_by"] == ["reboot"]
    assert said["state_cause"] == "xid 79"
    # kept once: a state that holds its contradiction already is not contradicted again
    noted = after(lost)
    noted = GpuHealthNow(GPU, noted.health, noted.since,
                         {**noted.evidence, "contradicted": said}, BOOT, "nvml")
    assert decider.sample(sample(12 * S), signs, noted) == []


def test_a_new_boot_id_clears_states_entered_in_an_older_boot() -> None:
    decider = HealthDecider(host_boot=None)
    lost = GpuHealthNow(GPU, gh.LOST, 5 * S, {"cause": "xid 79", "clears_by": ["reboot"]},
                        "b0", "nvml")
    assert decider.new_boot(BOOT)
    [cleared] = decider.decide(xid_free_record(10 * S), HealthFacts(not_ok=(lost,)))
    assert isinstance(cleared, gh.Transition)
    assert (cleared.state, cleared.how, cleared.boot_id) == (gh.OK, gh.BY_REBOOT, BOOT)
    assert not decider.new_boot(BOOT)           # seen: the next record reads no GPUs


def xid_free_record(ts: int) -> KernelLogRecord:
    return KernelLogRecord(ts=ts, cursor="c2", origin="journald", boot_id=BOOT,
                           record_kind="driver_loaded", line="NVRM: loading")


def test_the_host_boot_at_start_clears_older_boots_states_never_before_them() -> None:
    decider = HealthDecider(host_boot=BOOT)
    lost = GpuHealthNow(GPU, gh.LOST, 20 * S, {"cause": "xid 79"}, "b0", "nvml")
    same = GpuHealthNow("GPU-2", gh.DEGRADED, 5 * S, {"causes": ["throttling"]}, BOOT, "nvml")
    [cleared] = decider.host_boot_seen(10 * S, (lost, same))
    assert isinstance(cleared, gh.Transition)
    assert (cleared.gpu_id, cleared.ts, cleared.state) == (GPU, 20 * S, gh.OK)


def test_an_sbe_storm_degrades_the_gpu_and_a_reset_forgets_its_window() -> None:
    decider = HealthDecider(host_boot=BOOT)
    first = sample(10 * S, ecc_sbe_volatile=0.0)
    signs = decider.sample_signs(first)
    assert signs is not None and signs.quiet
    storm = sample(20 * S, ecc_sbe_volatile=60.0)
    signs = decider.sample_signs(storm)
    assert signs is not None and signs.storm
    [degraded] = decider.sample(storm, signs, after_ok())
    assert isinstance(degraded, gh.Transition)
    assert (degraded.state, degraded.cause, degraded.evidence["causes"]) == (
        gh.DEGRADED, gh.SBE_STORM, [gh.SBE_STORM])
    decider.decide(GpuState(ts=21 * S, gpu_id=GPU, state="resetting", source="nvml",
                            simulated=False), HealthFacts({GPU: after(degraded)}, (GPU,)))
    assert GPU not in decider.sbe
