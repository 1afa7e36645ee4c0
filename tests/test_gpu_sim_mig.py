"""The simulator's MIG scenario: per-instance samples as the real sources give them, and
R47 answering the idle instance when they are replayed through the rules engine."""

import pytest

from gpuwhy.app.rules_cli import replay
from gpuwhy.events import GpuSample
from gpuwhy.probes.gpu import sim as sim_module
from gpuwhy.probes.gpu.sim import MIG_INSTANCES, SimulatedGpus
from gpuwhy.probes.gpu.source import SourceUnavailable
from gpuwhy.rules.loader import load_rules

NS = 10**9
BASE_TS = 1_764_000_000 * NS
STEP_S = 5
R47 = "R47_mig_instance_allocated_but_idle"
ACTIVITY = {"gpu_util", "mem_util", "gr_engine_active", "sm_active", "tensor_active",
            "dram_active"}


def simulate(monkeypatch, seconds, model="NVIDIA A100-SXM4-80GB", count=2):
    """The scenario read every STEP_S seconds of a clock that the test drives."""
    clock = iter(range(BASE_TS, BASE_TS + (seconds + 1) * NS, STEP_S * NS))
    monkeypatch.setattr(sim_module, "now_ns", lambda: next(clock))
    sim = SimulatedGpus(count=count, model=model, scenario="mig-idle-instance",
                        interval=STEP_S)
    sim.open()
    events = [sim.gpus[0].seen(BASE_TS, "sim", True), sim.gpus[1].seen(BASE_TS, "sim", True)]
    for _ in range(seconds // STEP_S):
        events += sim.read()
    return sim, events


def test_every_gpu_has_seven_1g_10gb_instances_marked_simulated(monkeypatch):
    sim, events = simulate(monkeypatch, 60)
    samples = [e for e in events if isinstance(e, GpuSample)]
    assert all(e.simulated and e.source == "sim" for e in samples)
    first = samples[:16]
    for gpu in sim.gpus:
        mine = [e for e in first if e.gpu_id == gpu.id]
        assert [e.instance for e in mine] == ["", *map(str, MIG_INSTANCES)]
        assert all(e.labels == {"mig_profile": "1g.10gb"} for e in mine[1:])
        whole = mine[0].fields
        assert not ACTIVITY & set(whole)        # MIG mode: no utilisation for the whole GPU
        assert whole["power_w"] > 0
        assert whole["fb_used_mib"] == pytest.approx(sum(e.fields["fb_used_mib"]
                                                         for e in mine[1:]), abs=0.01)
    idle = [e for e in samples if e.gpu_id == sim.gpus[0].id and e.instance == "13"]
    busy = [e for e in samples if e.gpu_id == sim.gpus[0].id and e.instance == "12"]
    assert {e.fields["gr_engine_active"] for e in idle} == {0.0}
    assert {e.fields["fb_used_mib"] for e in idle} == {8210.0}
    assert all(0.8 < e.fields["gr_engine_active"] <= 1.0 for e in busy)
    assert len({e.fields["gr_engine_active"] for e in busy}) > 1   # noisy, not flat
    other_gpu_13 = [e for e in samples if e.gpu_id == sim.gpus[1].id and e.instance == "13"]
    assert all(e.fields["gr_engine_active"] > 0.8 for e in other_gpu_13)


def test_r47_answers_the_idle_instance_when_replayed(monkeypatch):
    sim, events = simulate(monkeypatch, 900)
    rules = [r for r in load_rules() if r.id in (R47, "R27_allocated_but_idle")]
    findings, engine = replay(events, rules, 60 * NS)
    firing = [f for f in findings if f.state == "firing"]
    assert {(f.rule_id, f.gpu_id, f.instance, f.mig_profile) for f in firing} == {
        (R47, sim.gpus[0].id, "13", "1g.10gb")}
    assert firing[-1].evidence["fb_used_mib"] == pytest.approx(8210.0)
    statuses = {(s["gpu_id"], s["instance"]): s["status"] for s in engine.status()
                if s.get("instance")}
    assert statuses[(sim.gpus[0].id, "13")] == "firing"
    assert {v for k, v in statuses.items() if k != (sim.gpus[0].id, "13")} == {"ok"}


def test_a_gpu_without_mig_cannot_play_it():
    with pytest.raises(SourceUnavailable, match="80 GB"):
        SimulatedGpus(model="NVIDIA L4", scenario="mig-idle-instance")
