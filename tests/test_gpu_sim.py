"""The simulator: deterministic per seed, every scenario shaped as named, always SIMULATED."""

import pytest

from gpuwhy.events import GpuSample, GpuSeen, GpuState, GpuXid
from gpuwhy.probes.gpu.sim import SCENARIOS, SimulatedGpus
from gpuwhy.probes.gpu.source import SourceUnavailable


def run(scenario, seed=0, ticks=40, **kwargs):
    sim = SimulatedGpus(scenario=scenario, seed=seed, event_after=10.0, **kwargs)
    sim.open()
    return sim, [sim.read() for _ in range(ticks)]


def fields_of(ticks):
    out = []
    for events in ticks:
        out.append([(type(e).__name__, getattr(e, "gpu_id", None), getattr(e, "fields", None),
                     getattr(e, "xid", None), getattr(e, "state", None)) for e in events])
    return out


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_scenario_is_deterministic_for_a_seed(scenario):
    sim_a, a = run(scenario, seed=7)
    sim_b, b = run(scenario, seed=7)
    sim_c, c = run(scenario, seed=8)
    assert [g.id for g in sim_a.gpus] == [g.id for g in sim_b.gpus]
    assert fields_of(a) == fields_of(b)
    assert [g.id for g in sim_a.gpus] != [g.id for g in sim_c.gpus]
    assert [e.fields for t in a for e in t if isinstance(e, GpuSample)] != \
        [e.fields for t in c for e in t if isinstance(e, GpuSample)]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_everything_is_marked_simulated(scenario):
    sim, ticks = run(scenario)
    assert all("SIMULATED" in g.model for g in sim.gpus)
    events = [e for t in ticks for e in t]
    assert events and all(e.simulated for e in events)
    assert all(e.source == "sim" for e in events)


def _gpu_samples(sim, ticks, index):
    gpu_id = sim.gpus[index].id
    return [e for t in ticks for e in t if isinstance(e, GpuSample) and e.gpu_id == gpu_id]


def test_scenarios_differ_where_they_should():
    healthy = _gpu_samples(*run("healthy-training"), 0)
    starved = _gpu_samples(*run("input-starved"), 0)
    pageable = _gpu_samples(*run("pageable-h2d"), 0)
    allreduce = _gpu_samples(*run("pcie-allreduce"), 0)
    mean = lambda samples, f: sum(s.fields[f] for s in samples) / len(samples)  # noqa: E731
    assert mean(healthy, "sm_active") > 0.8 > 0.5 > mean(starved, "sm_active")
    assert any(s.fields["clocks_event_reasons"] == 0x1 for s in starved)   # idle gaps
    assert 2e9 < mean(pageable, "pcie_rx_bytes_per_s") < 0.2 * 52e9
    assert mean(allreduce, "pcie_rx_bytes_per_s") > 0.85 * 52e9
    assert mean(allreduce, "nvlink_tx_bytes_per_s") == 0


def test_power_cap_and_thermal_throttle_set_their_reason_bits_and_counters():
    capped = _gpu_samples(*run("power-cap"), 1)
    assert all(int(s.fields["clocks_event_reasons"]) & 0x4 for s in capped)
    assert all(s.fields["power_w"] <= s.fields["power_limit_w"] for s in capped)
    assert capped[-1].fields["power_violation_ns"] == len(capped) * 1e9
    hot = _gpu_samples(*run("thermal-throttle"), 0)
    assert hot[0].fields["clocks_event_reasons"] == 0
    assert int(hot[-1].fields["clocks_event_reasons"]) & 0x60 and hot[-1].fields["temp_c"] > 85
    assert hot[-1].fields["thermal_violation_ns"] > 0


def test_xid_79_at_time_t_then_the_gpu_is_gone():
    sim, ticks = run("xid-79")
    lost_gpu = sim.gpus[0].id
    [xid] = [e for t in ticks for e in t if isinstance(e, GpuXid)]
    assert (xid.gpu_id, xid.xid) == (lost_gpu, 79)
    at = next(i for i, t in enumerate(ticks) if xid in t)
    assert at == 10   # event_after 10 s at 1 s per tick
    assert any(isinstance(e, GpuState) and e.state == "lost" for e in ticks[at])
    assert not [e for t in ticks[at:] for e in t if e.gpu_id == lost_gpu and e is not xid
                and not isinstance(e, GpuState)]
    peers = _gpu_samples(sim, ticks[at:], 1)
    assert peers and all(s.fields["sm_active"] < 0.1 for s in peers)


def test_gpu_reset_at_time_t_comes_back_with_counters_cleared():
    sim, ticks = run("gpu-reset")
    gpu = sim.gpus[0].id
    states = [(i, e.state) for i, t in enumerate(ticks) for e in t if isinstance(e, GpuState)]
    assert states == [(10, "resetting"), (15, "back")]
    assert any(isinstance(e, GpuSeen) and e.gpu_id == gpu for e in ticks[15])
    before = [e for e in ticks[9] if isinstance(e, GpuSample) and e.gpu_id == gpu][0]
    after = [e for e in ticks[15] if isinstance(e, GpuSample) and e.gpu_id == gpu][0]
    assert not [e for t in ticks[10:15] for e in t if isinstance(e, GpuSample) and e.gpu_id == gpu]
    assert after.fields["energy_mj"] < before.fields["energy_mj"]
    assert after.fields["gpu_util"] < 5


def test_count_model_and_bad_scenario():
    sim = SimulatedGpus(count=8, model="NVIDIA A100-SXM4-80GB")
    gpus = sim.open()
    assert len(gpus) == 8 and len({g.id for g in gpus}) == 8
    assert gpus[0].model == "NVIDIA A100-SXM4-80GB (SIMULATED)"
    assert sim.read()[0].fields["power_limit_w"] == 400
    with pytest.raises(SourceUnavailable, match="unknown scenario"):
        SimulatedGpus(scenario="nope")


def test_the_event_comes_when_its_strike_file_appears(tmp_path):
    strike = tmp_path / "reset-now"
    sim = SimulatedGpus(scenario="gpu-reset", event_after=3600.0, event_file=str(strike))
    sim.open()
    before = [sim.read() for _ in range(4)]
    strike.touch()
    after = [sim.read() for _ in range(8)]
    assert not [e for t in before for e in t if isinstance(e, GpuState)]
    states = [(i, e.state) for i, t in enumerate(after) for e in t if isinstance(e, GpuState)]
    assert states == [(0, "resetting"), (5, "back")]


NVLINK_ERRORS = {"nvlink_crc_flit_errors", "nvlink_crc_data_errors", "nvlink_replay_errors",
                 "nvlink_recovery_errors"}


def test_pcie_link_runs_at_its_max_under_load_and_gen1_when_idle():
    healthy = _gpu_samples(*run("healthy-training"), 0)
    assert {(s.fields["pcie_link_gen"], s.fields["pcie_link_width"],
             s.fields["pcie_link_gen_max"], s.fields["pcie_link_width_max"])
            for s in healthy} == {(5, 16, 5, 16)}   # an H100 SXM: Gen5 x16
    starved = _gpu_samples(*run("input-starved"), 0)
    idle = [s for s in starved if s.fields["clocks_event_reasons"] == 0x1]
    busy = [s for s in starved if s.fields["clocks_event_reasons"] == 0]
    assert idle and busy
    assert {s.fields["pcie_link_gen"] for s in idle} == {1}      # trained down to save power
    assert {s.fields["pcie_link_gen"] for s in busy} == {5}
    assert {s.fields["pcie_link_gen_max"] for s in idle} == {5}
    a100 = _gpu_samples(*run("healthy-training", model="NVIDIA A100-SXM4-80GB"), 1)
    assert {s.fields["pcie_link_gen"] for s in a100} == {4}


def test_nvlink_errors_are_zero_and_still_and_absent_without_nvlink():
    healthy = _gpu_samples(*run("healthy-training"), 1)
    assert {s.fields[name] for s in healthy for name in NVLINK_ERRORS} == {0}
    assert {s.fields["row_remap_pending"] for s in healthy} == {0}
    for samples in (_gpu_samples(*run("healthy-training", model="NVIDIA L4"), 0),
                    _gpu_samples(*run("pcie-allreduce"), 0)):
        assert samples and not any(NVLINK_ERRORS & set(s.fields) for s in samples)


def test_fabric_success_on_hgx_h100_not_supported_elsewhere():
    healthy = _gpu_samples(*run("healthy-training"), 0)
    assert {(s.fields["fabric_state"], s.fields["fabric_health"]) for s in healthy} == {(3, 1)}
    # an A100 (NVML's fabric probe is Hopper's and later), an L4 and PCIe H100s: no fabric
    for samples in (_gpu_samples(*run("healthy-training", model="NVIDIA A100-SXM4-80GB"), 0),
                    _gpu_samples(*run("healthy-training", model="NVIDIA L4"), 0),
                    _gpu_samples(*run("pcie-allreduce"), 0)):
        assert {(s.fields["fabric_state"], s.fields["fabric_health"])
                for s in samples} == {(0, 0)}


def test_fabric_manager_down_leaves_every_gpu_idle_with_its_fabric_not_started():
    sim, ticks = run("fabric-manager-down", count=4)
    for index in range(4):
        samples = _gpu_samples(sim, ticks, index)
        assert samples and {s.fields["fabric_state"] for s in samples} == {1}
        assert not any("fabric_health" in s.fields for s in samples)
        assert not any(NVLINK_ERRORS & set(s.fields) for s in samples)   # links untrained
        assert max(s.fields["gpu_util"] for s in samples) < 2
        assert {s.fields["clocks_event_reasons"] for s in samples} == {0x1}
