"""Serving rules (issue #59): what their causes explain in the one ranking, and the corpus
engine's behaviours they are written from, on plain values."""

from __future__ import annotations

import random

from gpuwhy.app.demo.corpus.host import H100, Host, Inference, simulate_kv_engine
from gpuwhy.events import RuleFinding
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.answer import answers
from gpuwhy.rules.loader import load_rules

SHIPPED = {rule.id: rule for rule in load_rules()}
GPU0 = "GPU-0000"
ENGINE, OTHER = ProcessKey(4242, 1000), ProcessKey(5151, 2000)
LATENCY = "R54_serving_latency_up"


def finding(rule_id, process=ENGINE, severity="warning", gpu=GPU0):
    rule = SHIPPED[rule_id]
    return RuleFinding(ts=1, finding_id=f"{rule_id}:{process.pid}", rule_id=rule_id,
                       title=rule.title, severity=severity, state="firing", gpu_id=gpu,
                       process=None if rule.scope == "gpu" else process, rule_kind=rule.kind)


def test_a_throttled_gpu_explains_its_engines_latency():
    for cause in ("R19_power_cap", "R20_thermal_throttle", "R21_hw_slowdown_power_brake",
                  "R22_sync_boost_or_clock_lock", "R26_multi_process_contention"):
        [answer] = answers([finding(cause), finding(LATENCY, severity="info")], SHIPPED)
        assert answer.finding.rule_id == cause and answer.explained == (f"{LATENCY}:4242",)


def test_an_engines_cause_explains_its_own_latency_not_another_engines():
    found = answers([finding("R49_engine_cpu_bound"), finding(LATENCY, severity="info"),
                     finding(LATENCY, process=OTHER, severity="info")], SHIPPED)
    assert [(a.finding.rule_id, a.explained) for a in found] == [
        ("R49_engine_cpu_bound", (f"{LATENCY}:4242",)), (LATENCY, ())]


def test_too_little_load_answers_for_the_idle_look_at_info():
    found = answers([finding("R52_engine_low_load", severity="info"),
                     finding("R27_allocated_but_idle", severity="info"),
                     finding("R14_bursty_utilisation", severity="info")], SHIPPED)
    assert len(found) == 1 and found[0].finding.rule_id == "R52_engine_low_load"
    assert found[0].finding.severity == "info" and len(found[0].explained) == 2


def test_every_serving_cause_explains_the_latency_symptom():
    explaining = {r.id for r in SHIPPED.values() if LATENCY in r.explains}
    assert {"R48_kv_cache_pressure", "R49_engine_cpu_bound", "R50_engine_frontend_bound",
            "R51_long_prefills_block_decodes", "R53_engine_gpu_shared"} <= explaining


def _engine(**changes) -> list[tuple[float, dict[str, float]]]:
    job = dict(gpus=[0], rate=lambda t: 3.0, tokens=200, iter_s=0.012, per_seq_s=0.00012,
               kv_tokens=400_000, prompt_tokens=4000, prefill_s_per_token=0.00004)
    job.update(changes)
    host = Host(7, H100, 1, 120, "dcgm")
    traces = simulate_kv_engine(Inference(**job), host, random.Random(7))
    return traces[0].engine


def _tail(scrapes) -> float:
    rows = [v for _, v in scrapes if "tpot_p95_s" in v]
    return sum(v["tpot_p95_s"] / v["tpot_p50_s"] for v in rows) / len(rows)


def test_whole_prompts_stall_decodes_and_chunks_bound_the_stall():
    assert _tail(_engine()) > 8          # a 4,000-token prompt's step vs a decode step
    assert _tail(_engine(chunk_tokens=512)) < 2


def test_closed_loop_clients_keep_their_requests_in_flight_and_none_waiting():
    scrapes = _engine(concurrency=16, prompt_tokens=500, chunk_tokens=2048)[6:]
    assert all(v["requests_waiting"] == 0 for _, v in scrapes)
    assert all(12 <= v["requests_running"] <= 16 for _, v in scrapes)


def test_the_answer_on_an_engines_gpus_speaks_serving(tmp_path):
    """`gpuwhy why` on a tensor-parallel vLLM's GPU: the engine, the GPUs it spans and its
    figures in words, from the engine's latest scrape in the store (none for a GPU no engine
    serves from, or one scraped long ago)."""
    from gpuwhy.events import EngineSample, Envelope, GpuSeen
    from gpuwhy.rules.answer import sentence, verdicts
    from gpuwhy.store import open_store
    from gpuwhy.store.queries import answer_gpus
    from gpuwhy.store.writer import StoreWriter

    t = 1_800_000_000 * 10**9
    db = open_store(tmp_path / "gpuwhy.db")
    uuids = [f"GPU-0000000{i}-0000-0000-0000-000000000000" for i in range(3)]
    events = [GpuSeen(ts=t, gpu_id=u, source="nvml", simulated=True, uuid=u, index=i,
                      minor=i, pci_bus_id=f"0000:1{i}:00.0", model="NVIDIA H100 80GB HBM3")
              for i, u in enumerate(uuids)]
    events += [EngineSample(ts=t - 3600 * 10**9, engine="sglang", endpoint="x",
                            process=OTHER, gpu_ids=[uuids[2]]),       # long gone
               EngineSample(ts=t, engine="vllm", endpoint="http://127.0.0.1:8000/metrics",
                            process=ENGINE, gpu_ids=[uuids[1], uuids[0]])]
    StoreWriter(db).write_batch([Envelope("test", n, e) for n, e in enumerate(events)])
    gpus = {g.gpu_id: g for g in answer_gpus(db, at=t)}
    assert (gpus[uuids[0]].engine, gpus[uuids[0]].engine_gpus) == ("vLLM", ("0", "1"))
    assert gpus[uuids[2]].engine == ""
    rule = SHIPPED["R48_kv_cache_pressure"]
    kv = RuleFinding(ts=t, finding_id="kv", rule_id=rule.id, title=rule.title,
                     severity="warning", state="firing", gpu_id=uuids[0], process=ENGINE,
                     rule_kind=rule.kind, evidence={"kv_cache_usage": 0.973,
                                                    "preemptions_per_s": 0.2, "waiting": 12})
    [verdict] = [v for v in verdicts(gpus.values(), [kv], SHIPPED) if not v.healthy]
    line = sentence(verdict, utc=True)
    assert f"vLLM on GPUs 0, 1 (tensor parallel 2): {rule.title} (KV cache used 97%, " \
           "preemptions 12/min, requests waiting 12)" in line
