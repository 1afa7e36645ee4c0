"""`gpuwhy rules eval`: the corpus replayed through the real engine and the shipped rules."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gpuwhy.app.cli import cli
from gpuwhy.app.demo.corpus import select, write_corpus, write_scenario
from gpuwhy.app.rules_eval_cli import evaluate_case, ranking, read_corpus
from gpuwhy.rules.loader import load_rules

RULES = load_rules()
# Scenarios where the shipped rules give the right first answer today (measured with
# `gpuwhy rules eval`); the misses are listed by the command, not asserted here.
HITS = {
    "single-gpu-cpu-starved": "R01_input_cpu_bound",
    "launch-bound-eager-rl": "R04_launch_bound",
    "item-sync-bound-uprobes": "R05b_cuda_sync_bound",
    "stuck-on-lock": "R05_gpu_idle_process_blocked",
    "empty-cache-churn": "R23_alloc_churn",
    "fp64-numpy-leak": "R13_unexpected_fp64",
    "xid48-dbe": "R33_xid48_double_bit_ecc",
    # the loader's workers saturated while the GPU waits, on 4 GPUs (NCCL spins on the fed
    # ranks: utilisation high, few SMs), and workers in D state reading many small files
    "resnet50-cpu-starved": "R01_input_cpu_bound",
    "nfs-small-files-starved": "R02_input_io_bound",
    # workers asleep on sockets (an object store), not idle: the sleep ended in a receive
    "s3-streaming-starved": "R02_input_io_bound",
    # two pods time-slice GPU 2: two contexts there, one on the others
    "two-pods-time-slicing": "R26_multi_process_contention",
    # the failed GPU, not its peers hung in the all-reduce
    "xid79-fallen-off-bus": "R32_xid79_fallen_off_bus",
    # look-alikes told apart: the cause that explains the other's look leads
    "pageable-h2d-dlrm": "R06_pageable_h2d_copy",              # not launch-bound
    "empty-cache-churn-uprobes": "R23b_cuda_alloc_churn",       # not sync-bound
    "uvm-prefetch-pingpong": "R24_uvm_thrash",                  # not peers on PCIe
    "cpu-offloaded-inference": "R07_pcie_saturated_low_sm",     # not a blocked process
    "bert-batch1-serving": "R09_small_grid_low_sm",             # busy GPU: not launch-bound
    "nccl-p2p-disabled": "R15_collectives_off_nvlink",
    "idle-notebook": "R27_allocated_but_idle",                  # waits for its user
    "sbe-storm": "R38_sbe_storm_xid92",
    "psu-power-brake": "R21_hw_slowdown_power_brake",           # bursts: one finding
    # every CUDA start fails while the NVLink fabric is not up: idle GPUs, failing ranks
    "fabric-manager-down-after-driver-update": "R45_fabric_not_up",
    # a pod bound to the other socket's CPUs: its pinned copies cross the socket link
    "numa-pod-wrong-socket": "R46_cpu_on_far_numa_node",
    # GPU 0 in MIG mode: a notebook holds a 1g.10gb instance idle among busy tenants
    "mig-idle-notebook": "R47_mig_instance_allocated_but_idle",
    # a cron job resets an idle GPU while the host's own processes come and go
    "cron-reset-idle-gpu": "R40_operator_or_cron_intervention",
    # an inference engine's KV cache full, its requests preempted (its /metrics scraped)
    "vllm-kv-cache-pressure": "R48_kv_cache_pressure",
    # the engine's loop on one core while requests wait; a tokenising worker on one core
    "vllm-cpu-bound-scheduler": "R49_engine_cpu_bound",
    "triton-trtllm-postprocessing-bound": "R50_engine_frontend_bound",
    # CUDA_LAUNCH_BLOCKING=1 in the process's ProcessSeen (the probes record it)
    "cuda-launch-blocking": "R08_debug_or_limiting_env",
}
# healthy hosts; the two multi-rank jobs hold every GPU's device files in each rank
QUIET = ("healthy-cuda-uprobes", "idle-host", "healthy-llm-fsdp-torchrun", "healthy-vllm-tp2",
         "checkpoint-dips", "node-boot-fabric-training", "healthy-two-socket-unpinned",
         "healthy-s3-streaming", "healthy-mig-tenants", "healthy-vllm-light-load",
         "healthy-vllm-overnight-trickle")       # too little load: no alert (R52, info)


def invoke(tmp_path, *args):
    return CliRunner().invoke(cli, ["rules", "eval", *args],
                              env={"GPUWHY_DB": str(tmp_path / "g.db")})


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder, [*HITS, *QUIET])
    return {case.name: case for case in read_corpus(folder)}


@pytest.mark.parametrize("name", sorted(HITS))
def test_the_top_answer_of_a_scenario_that_hits(written, name):
    how, rank = ranking()
    outcome = evaluate_case(written[name], RULES, rank)
    assert outcome.top == HITS[name] and outcome.hit
    assert outcome.time_to_answer_s is not None
    # the goal: the right answer within 5 minutes of the fault (capture time, not wall time)
    assert written[name].onset_s <= outcome.time_to_answer_s <= written[name].onset_s + 300
    assert outcome.timeline[-1][1] == HITS[name]


def test_an_idle_gpus_reset_is_not_a_reset_under_load(written):
    """GPU 3 is reset with no process on it, on a host whose health checks and metrics
    scripts end all the time (some failing): their exits are not the GPU's processes'."""
    outcome = evaluate_case(written["cron-reset-idle-gpu"], RULES, ranking()[1])
    assert "R40_operator_or_cron_intervention" in outcome.fired
    assert "R40b_gpu_reset_under_load" not in outcome.fired


@pytest.mark.parametrize("name", QUIET)
def test_a_healthy_host_raises_no_warning(written, name):
    outcome = evaluate_case(written[name], RULES, ranking()[1])
    assert outcome.case.healthy and not outcome.false_alarm and outcome.alarms == []


def test_eval_only_prints_each_scenario_and_the_summary(tmp_path):
    result = invoke(tmp_path, "--only", "stuck-on-lock,healthy-cuda-uprobes")
    assert result.exit_code == 0, result.output
    assert "stuck-on-lock" in result.output and "healthy-cuda-uprobes" in result.output
    assert "R05_gpu_idle_process_blocked" in result.output
    assert "accuracy: 1/1 faults = 1.00" in result.output
    assert "false alarms: 0/1 healthy hosts" in result.output


def test_eval_json_over_a_corpus_folder(tmp_path):
    folder = tmp_path / "corpus"
    for scenario in select(["fp64-numpy-leak", "healthy-cuda-uprobes"]):
        write_scenario(scenario, folder)
    (folder / "notes.json").write_text('{"not": "a manifest"}')
    result = invoke(tmp_path, "--corpus", str(folder), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    summary = report["summary"]
    assert (summary["faults"], summary["hits"], summary["healthy"]) == (1, 1, 1)
    assert summary["accuracy"] == 1.0 and summary["false_alarms"] == 0
    assert summary["median_time_to_answer_s"] == summary["max_time_to_answer_s"] > 0
    rows = {row["name"]: row for row in report["scenarios"]}
    assert rows["fp64-numpy-leak"]["result"] == "hit"
    assert rows["fp64-numpy-leak"]["top"] == "R13_unexpected_fp64"
    assert rows["healthy-cuda-uprobes"]["result"] == "ok"


def test_unreadable_input_exits_2(tmp_path):
    assert invoke(tmp_path, "--corpus", str(tmp_path / "nowhere")).exit_code == 2
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "x.json").write_text(json.dumps({"format": "gpuwhy-scenario/1", "name": "x",
                                               "healthy": True, "capture": "x.jsonl"}))
    missing = invoke(tmp_path, "--corpus", str(folder))
    assert missing.exit_code == 2 and "capture" in missing.output
    (folder / "x.jsonl").write_text('{"kind": "gpu_sample"}\n')
    broken = invoke(tmp_path, "--corpus", str(folder))
    assert broken.exit_code == 2 and "not a bus event" in broken.output
    assert invoke(tmp_path, "--only", "no-such-scenario").exit_code == 2


def test_a_fault_whose_rules_read_env_is_listed_not_scored_without_environments(tmp_path):
    # R08 reads the process environment: a capture whose processes carry none (recorded
    # before the probes recorded it) cannot show it, so it is listed, not scored
    folder = tmp_path / "corpus"
    for scenario in select(["cuda-launch-blocking", "stuck-on-lock"]):
        write_scenario(scenario, folder)
    capture = folder / "cuda-launch-blocking.jsonl"
    lines = [json.loads(line) for line in capture.read_text().splitlines()]
    assert any(line.get("env") for line in lines)
    capture.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "env"}) + "\n"
                               for line in lines))
    result = invoke(tmp_path, "--corpus", str(folder), "--json")
    report = json.loads(result.output)
    rows = {row["name"]: row for row in report["scenarios"]}
    assert rows["cuda-launch-blocking"]["result"] == "not evaluable"
    assert report["summary"]["faults"] == 1 and report["summary"]["hits"] == 1
    assert report["summary"]["not_evaluable"] == ["cuda-launch-blocking"]


def test_the_live_paths_answer_is_what_gpuwhy_why_prints(written, tmp_path):
    """The evaluation scores the store the replay wrote, read as `gpuwhy why` reads it."""
    from gpuwhy.app.rules_cli import read_capture
    from gpuwhy.correlator.rules.live_replay import replay_live, top_of

    events = read_capture(str(written["xid48-dbe"].capture))
    rounds = []
    answer = replay_live(events, RULES, 10 * 10**9, tmp_path,
                         lambda now, new, verdicts: rounds.append(now))
    top, kind, gpu = top_of(answer)
    assert top == "R33_xid48_double_bit_ecc" and kind == "cause"
    result = CliRunner().invoke(cli, ["why", "--json", "--at", str(rounds[-1])],
                                env={"GPUWHY_DB": str(tmp_path / "replay.db")})
    assert result.exit_code == 1, result.output
    first = json.loads(result.output)["verdicts"][0]
    assert (first["lead"]["rule_id"], first["gpu"]["id"]) == (top, gpu)
    assert first["severity"] == "critical" and first["gpu"]["health"] == "reset_required"


def test_the_engine_path_is_still_there(tmp_path):
    result = invoke(tmp_path, "--only", "stuck-on-lock", "--path", "engine")
    assert result.exit_code == 0, result.output
    assert "ranking: gpuwhy.rules.answer.answers" in result.output
    assert "accuracy: 1/1 faults = 1.00" in result.output


def test_an_input_starved_job_is_answered_without_gpu_counters(written, tmp_path):
    """A container without NVML or DCGM access, or a capture of driver calls and threads
    only: the starved loader's capture with every GPU sample taken out is still answered
    R01 on its GPU (the threads alone tell), and the answer says the counters are missing."""
    from gpuwhy.app.rules_cli import read_capture
    from gpuwhy.correlator.rules.live_replay import replay_live
    from gpuwhy.store import open_store
    from gpuwhy.store.queries import gpu_verdicts

    case = written["single-gpu-cpu-starved"]
    capture = tmp_path / "no-counters.jsonl"
    capture.write_text("".join(
        line + "\n" for line in case.capture.read_text().splitlines()
        if json.loads(line).get("kind") not in ("gpu_sample", "gpu_processes")))
    rounds = []
    replay_live(read_capture(str(capture)), RULES, 10 * 10**9, tmp_path,
                lambda now, new, verdicts: rounds.append(now))
    db = open_store(tmp_path / "replay.db", readonly=True)
    [verdict] = [v for v in gpu_verdicts(db, {}, at=rounds[-1]) if not v.healthy]
    finding = verdict.lead.finding
    assert finding.rule_id == "R01_input_cpu_bound"
    assert finding.evidence["gpu_busy"] is None
    assert any(fix.startswith("No GPU counters were read") for fix in finding.fixes)
