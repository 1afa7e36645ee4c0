"""Serving throughput per GPU down (R55) and closed-loop clients (R52b), issue #59: what
their causes explain in the one ranking, and the corpus hosts they are written for, replayed
through the real engine with the rules they need."""

from __future__ import annotations

import pytest

from gpuwhy.app.demo.corpus import select, write_scenario
from gpuwhy.app.rules_cli import read_capture, replay
from gpuwhy.events import RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.answer import answers
from gpuwhy.rules.loader import load_rules

SHIPPED = {rule.id: rule for rule in load_rules()}
GPU0 = "GPU-0000"
ENGINE = ProcessKey(4242, 1000)
THROUGHPUT, CLOSED_LOOP = "R55_serving_throughput_down", "R52b_engine_closed_loop"
# what slows an engine's steps or shrinks its batch (the brief of issue #59, item 3)
CAUSES = ("R19_power_cap", "R20_thermal_throttle", "R21_hw_slowdown_power_brake",
          "R22_sync_boost_or_clock_lock", "R26_multi_process_contention",
          "R48_kv_cache_pressure", "R49_engine_cpu_bound", "R50_engine_frontend_bound",
          "R51_long_prefills_block_decodes", "R53_engine_gpu_shared")


def finding(rule_id, severity="warning"):
    rule = SHIPPED[rule_id]
    return RuleFinding(ts=1, finding_id=f"{rule_id}:{ENGINE.pid}", rule_id=rule_id,
                       title=rule.title, severity=severity, state="firing", gpu_id=GPU0,
                       process=None if rule.scope == "gpu" else ENGINE, rule_kind=rule.kind)


@pytest.mark.parametrize("cause", CAUSES)
def test_a_slower_step_or_a_smaller_batch_explains_throughput_down(cause):
    [answer] = answers([finding(cause), finding(THROUGHPUT, severity="info")], SHIPPED)
    assert answer.finding.rule_id == cause
    assert answer.explained == (f"{THROUGHPUT}:{ENGINE.pid}",)


def test_throughput_down_alone_is_a_symptom_and_the_closed_loop_is_info():
    assert SHIPPED[THROUGHPUT].kind == "symptom" and SHIPPED[THROUGHPUT].severity == "info"
    assert SHIPPED[CLOSED_LOOP].kind == "cause" and SHIPPED[CLOSED_LOOP].severity == "info"
    # a closed-loop benchmark on a power-capped GPU: the cap, not the client, is the answer
    found = answers([finding(CLOSED_LOOP, severity="info"), finding("R19_power_cap"),
                     finding(THROUGHPUT, severity="info")], SHIPPED)
    assert found[0].finding.rule_id == "R19_power_cap"


def _firing(name: str, rule_ids: tuple[str, ...], tmp_path) -> list[RuleFinding]:
    """The corpus host ``name`` replayed with only ``rule_ids``: their firing findings."""
    [scenario] = select([name])
    capture, _ = write_scenario(scenario, tmp_path)
    findings, _ = replay(read_capture(str(capture)), [SHIPPED[r] for r in rule_ids],
                         30 * 10**9)
    return [f for f in findings if f.state == "firing"]


def test_a_power_cap_at_capacity_drops_throughput_and_answers_for_it(tmp_path):
    rules = ("R19_power_cap", THROUGHPUT)
    fired = _firing("vllm-peak-hour-power-capped", rules, tmp_path)
    down = [f for f in fired if f.rule_id == THROUGHPUT]
    assert down and {f.gpu_id for f in down} == {f.gpu_id for f in fired
                                                  if f.rule_id == "R19_power_cap"}
    assert down[0].evidence["generation_tokens_per_s"] < 0.8 * down[0].evidence[
        "generation_tokens_per_s_level"]
    top = answers(fired, SHIPPED)[0]
    assert top.finding.rule_id == "R19_power_cap"
    assert {f.finding_id for f in down} & set(top.explained)


def test_a_load_drop_is_not_throughput_down(tmp_path):
    assert not _firing("healthy-vllm-evening-load-drop", (THROUGHPUT,), tmp_path)


def test_a_client_capped_at_100_is_a_closed_loop_and_a_queue_is_not(tmp_path):
    fired = _firing("vllm-client-pool-caps-concurrency", (CLOSED_LOOP,), tmp_path / "a")
    assert [f.rule_id for f in fired] == [CLOSED_LOOP]
    assert fired[0].severity == "info" and round(fired[0].evidence["running"]) in (99, 100)
    assert not _firing("healthy-vllm-benchmark-past-capacity", (CLOSED_LOOP,), tmp_path / "b")
