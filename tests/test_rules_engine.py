"""The engine's guards and life cycle: warm-up, missing inputs, sharing, de-duplication,
clearing, shadow mode and overrides; and the RuleFinding event on the wire."""

from __future__ import annotations

import pytest

from gpuwhy.app.demo.synthetic_signals import BASE_TS, NS, Synthetic, run
from gpuwhy.correlator.rules.engine import Engine
from gpuwhy.correlator.rules.signals import MemorySignals
from gpuwhy.events import GpuState, RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.loader import load_rules
from gpuwhy.rules.model import Override
from gpuwhy.rules.parser import parse_rules
from gpuwhy.wire import from_frames, to_payload

RULES = {rule.id: rule for rule in load_rules()}
STARVED = dict(gpu={"gpu_util": 5.0, "gr_engine_active": 0.05}, workers={"on_cpu": 3.8},
               own={"on_cpu": 0.3, "sleep": 2.6})


def statuses(engine: Engine, rule_id: str) -> set[str]:
    return {s["status"] for s in engine.status() if s["rule_id"] == rule_id}


def test_warm_up_keeps_a_new_process_out():
    findings, engine = run(Synthetic(duration_s=110, **STARVED), [RULES["R01_input_cpu_bound"]])
    assert findings == []
    assert statuses(engine, "R01_input_cpu_bound") == {"warming_up"}


def test_warm_up_after_a_gpu_reset():
    reset = [(300, GpuState(ts=0, gpu_id=Synthetic().gpu_id(0), state="back", source="sim",
                            simulated=True))]
    spec = Synthetic(duration_s=340, extra=reset, **STARVED)
    findings, engine = run(spec, [RULES["R01_input_cpu_bound"]])
    assert [f.state for f in findings] == ["firing"]          # fired before the reset
    assert statuses(engine, "R01_input_cpu_bound") == {"warming_up"}
    detail = engine.status()[0]["detail"]
    assert "GPU reset or driver load" in detail


def test_missing_profiling_fields_make_a_rule_not_evaluable_never_ok():
    spec = Synthetic(gpu={"sm_active": None, "sm_occupancy": None})
    findings, engine = run(spec, [RULES["R09_small_grid_low_sm"]])
    assert findings == []
    [status] = engine.status()
    assert status["status"] == "not_evaluable"
    assert "gpu.sm_active" in status["detail"]


def test_missing_environment_is_not_evaluable_and_a_clean_one_is_ok():
    _, unknown = run(Synthetic(duration_s=60), [RULES["R08_debug_or_limiting_env"]])
    assert statuses(unknown, "R08_debug_or_limiting_env") == {"not_evaluable"}
    _, clean = run(Synthetic(duration_s=60, env={"PATH": "/bin"}),
                   [RULES["R08_debug_or_limiting_env"]])
    assert statuses(clean, "R08_debug_or_limiting_env") == {"ok"}


def test_monitoring_processes_are_never_rule_instances():
    spec = Synthetic(cmdline="/usr/bin/dcgm-exporter -f /etc/dcgm.csv", comm="dcgm-exporter",
                     calls={"rm_alloc": 300, "rm_free": 300}, gpu={"gr_engine_active": 0.1})
    findings, engine = run(spec, [RULES["R23_alloc_churn"]])
    assert findings == [] and engine.status() == []
    spec.cmdline, spec.comm = "python3 serve.py", "python3"
    findings, _ = run(spec, [RULES["R23_alloc_churn"]])
    assert findings and findings[0].process == spec.process(0, 0)


def test_a_shared_gpu_downgrades_performance_findings_to_info():
    [alone] = [f for f in run(Synthetic(**STARVED), [RULES["R01_input_cpu_bound"]])[0]]
    [shared] = [f for f in run(Synthetic(processes=2, **STARVED),
                               [RULES["R01_input_cpu_bound"]])[0]]
    assert alone.severity == "error" and shared.severity == "info"


def test_one_finding_per_onset_then_a_clearing():
    def util(t: float) -> dict:
        return {"gpu_util": 5.0, "gr_engine_active": 0.05} if t < 500 else {}
    spec = Synthetic(duration_s=900, gpu=util, workers={"on_cpu": 3.8},
                     own={"on_cpu": 0.3, "sleep": 2.6})
    findings, _ = run(spec, [RULES["R01_input_cpu_bound"]])
    # the idle share falls from 1.0 as the window leaves the idle phase: the severity may
    # step down once (sent again), then the finding clears; never a repeat of the same state
    states = [(f.state, f.severity) for f in findings]
    assert states[0] == ("firing", "error") and states[-1][0] == "cleared"
    assert len(states) == len(set(states)) <= 3
    firing, cleared = findings[0], findings[-1]
    assert {f.finding_id for f in findings} == {firing.finding_id}
    assert firing.ts - BASE_TS >= (120 + 120) * NS     # warm-up, then 'for: 2m'
    # cleared after the condition was false for 'clear after' (default 2 x for = 4 min); it
    # holds while the 60 s window still has enough of the idle phase's samples to be read
    assert 500 * NS + 240 * NS <= cleared.ts - BASE_TS <= 500 * NS + (60 + 240) * NS


def test_a_severity_change_is_sent_again_with_the_same_id():
    def burst(t: float) -> dict:
        idle = 5.0 if t < 400 or t % 10 < 7 else 98.0   # idle share drops to 0.7 after t=400
        return {"gpu_util": idle, "gr_engine_active": idle / 100}
    spec = Synthetic(duration_s=500, gpu=burst, workers={"on_cpu": 3.8},
                     own={"on_cpu": 0.3, "sleep": 2.6})
    findings, _ = run(spec, [RULES["R01_input_cpu_bound"]])
    assert [(f.state, f.severity) for f in findings] == [("firing", "error"), ("firing", "warning")]
    assert findings[0].finding_id == findings[1].finding_id


def test_clear_expression():
    [rule] = parse_rules('rule T { title: "t" window: 10s when: mean(gpu.util, 10s) < 0.5\n'
                         ' clear: mean(gpu.util, 10s) > 0.9 }', "t.rules")
    spec = Synthetic(duration_s=200, gpu=lambda t: {"gpu_util": 10.0 if t < 60 else
                                                    60.0 if t < 120 else 95.0})
    findings, _ = run(spec, [rule])
    assert [f.state for f in findings] == ["firing", "cleared"]
    assert findings[1].ts - BASE_TS >= 130 * NS        # not at 60..120 (util 0.6 < 0.9)


def test_shadow_disable_and_threshold_overrides():
    rule = RULES["R01_input_cpu_bound"]
    shadow, _ = run(Synthetic(**STARVED), [rule], overrides={rule.id: Override(shadow=True)})
    assert shadow and all(f.shadow for f in shadow)
    disabled, engine = run(Synthetic(**STARVED), [rule],
                           overrides={rule.id: Override(enabled=False)})
    assert disabled == [] and statuses(engine, rule.id) == {"disabled"}
    stricter = Override(params={"worker_busy": 0.99})
    assert run(Synthetic(**STARVED), [rule], overrides={rule.id: stricter})[0] == []
    looser = Override(params={"worker_busy": 0.8})
    near_miss = Synthetic(gpu=STARVED["gpu"], workers={"on_cpu": 3.4}, own=STARVED["own"])
    assert run(near_miss, [rule])[0] == []
    assert run(near_miss, [rule], overrides={rule.id: looser})[0]


def test_a_process_that_goes_away_clears_its_findings():
    rule = RULES["R23_alloc_churn"]
    spec = Synthetic(duration_s=300, calls={"rm_alloc": 150, "rm_free": 150},
                     gpu={"gr_engine_active": 0.5})
    signals = MemorySignals()
    findings, engine = run(spec, [rule], signals=signals)
    assert [f.state for f in findings] == ["firing"]
    signals.exited.add(spec.process(0, 0))
    [cleared] = engine.evaluate(BASE_TS + 310 * NS)
    assert cleared.state == "cleared" and cleared.finding_id == findings[0].finding_id


def test_rule_finding_round_trips_the_wire():
    finding = RuleFinding(ts=5, finding_id="R:g:1-2:3", rule_id="R", title="t", severity="warn",
                          state="firing", gpu_id="g", process=ProcessKey(1, 2), window_start=1,
                          window_end=5, evidence={"x": 0.5, "y": None}, root_cause="c",
                          fixes=["a", "b"], verify="v", shadow=True, group="memory")
    envelope = from_frames([b"rule", to_payload(finding, src="rules", seq=1)])
    assert envelope.event == finding
    gpu_only = RuleFinding(ts=5, finding_id="f", rule_id="R", title="t", severity="info",
                           state="cleared", gpu_id="g")
    assert from_frames([b"rule", to_payload(gpu_only, src="rules", seq=2)]).event == gpu_only


def test_arithmetic_that_overflows_is_unknown_not_an_exception():
    # Numbers in a rule are bounded (|x| <= 1e18), but products of them are not: inf and nan
    # must not reach int() in bit() or round() in the evidence.
    huge = " * 1e18" * 20
    [rule] = parse_rules(
        'rule X_overflow { title: "t"\n'
        f'  when: not bit(gpu.util{huge}, SW_POWER_CAP) or gpu.util >= 0\n'
        f'  evidence: mean(gpu.util{huge}, 1m) as inf, mean(gpu.util{huge} - '
        f'gpu.util{huge}, 1m) as nan, last(bit(gpu.util{huge}, IDLE), 1m) as bit }}')
    findings, _ = run(Synthetic(duration_s=60), [rule])
    assert findings and findings[0].evidence == {"inf": None, "nan": None, "bit": None}


def _corr_rule(bound: str) -> list:
    return parse_rules(
        'rule X_corr { title: "t" requires: gpu.pcie_rx_Bps, gpu.sm_active\n'
        f'  when: corr(gpu.pcie_rx_Bps / 1e9, gpu.sm_active, 60s) {bound}\n'
        '  evidence: corr(gpu.pcie_rx_Bps / 1e9, gpu.sm_active, 60s) as r }')


def test_corr_is_pearsons_correlation_over_the_window_and_unknown_when_flat():
    # Traffic and SM activity in opposite phases (exposed communication): r = -1.
    opposite = Synthetic(duration_s=200, gpu=lambda t: {
        "pcie_rx_bytes_per_s": 2e9 + 1e10 * (t % 2), "sm_active": 0.9 - 0.5 * (t % 2)})
    findings, _ = run(opposite, _corr_rule("<= -0.9"))
    assert findings and findings[0].evidence["r"] == -1.0
    # In phase (overlapped: traffic beside compute): r = +1, and the bound does not hold.
    together = Synthetic(duration_s=200, gpu=lambda t: {
        "pcie_rx_bytes_per_s": 2e9 + 1e10 * (t % 2), "sm_active": 0.4 + 0.5 * (t % 2)})
    assert not run(together, _corr_rule("<= -0.9"))[0]
    assert run(together, _corr_rule(">= 0.9"))[0][0].evidence["r"] == 1.0
    # A flat series has no correlation: unknown, never a finding either way.
    flat = Synthetic(duration_s=200, gpu={"pcie_rx_bytes_per_s": 5e9, "sm_active": 0.7})
    _, engine = run(flat, _corr_rule("<= 1"))
    assert statuses(engine, "X_corr") == {"not_evaluable"}


@pytest.mark.parametrize("when, status", [
    # Kleene logic: a false item decides an 'and', a true one an 'or', unknowns or not;
    # gpu.fp64 is never reported here (unknown), gpu.util always
    ("gpu.util < 0 and mean(gpu.fp64, 30s) > 0", "ok"),
    ("mean(gpu.fp64, 30s) > 0 and gpu.util < 0", "ok"),
    ("mean(gpu.fp64, 30s) > 0 and gpu.util >= 0", "not_evaluable"),
    ("gpu.util >= 0 or mean(gpu.fp64, 30s) > 0", "pending"),
    ("mean(gpu.fp64, 30s) > 0 or gpu.util < 0", "not_evaluable"),
])
def test_and_or_decide_on_the_first_deciding_item_and_stay_unknown_otherwise(when, status):
    [rule] = parse_rules(f'rule X_logic {{ title: "t" window: 30s\n  when: {when} for: 1h }}',
                         "t.rules")
    _, engine = run(Synthetic(duration_s=60, gpu={"fp64_active": None}), [rule])
    assert statuses(engine, "X_logic") == {status}


@pytest.mark.parametrize("aggregate, known", [("last", True), ("max", False), ("mean", False)])
def test_the_latest_value_needs_no_history_an_aggregate_needs_half_its_window(aggregate,
                                                                             known):
    """A state (a remap-failure flag) is known from its first sample; a mean or a max over
    10 minutes is unknown until 5 minutes of samples cover it."""
    [rule] = parse_rules(f'rule X_state {{ title: "t" window: 10m every 10s\n'
                         f'  when: {aggregate}(gpu.rr_failure, 10m) >= 1 }}', "t.rules")
    findings, engine = run(Synthetic(duration_s=40, gpu={"row_remap_failed": 1.0}), [rule])
    assert bool(findings) == known
    if not known:
        assert statuses(engine, "X_state") == {"not_evaluable"}
        assert "warming up" in engine.status()[0]["detail"]
