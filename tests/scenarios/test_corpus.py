"""The scenario corpus: deterministic per seed, long enough, multi-GPU, every rule group, and
captures in the recorded format that `gpuwhy rules test --replay` reads."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from gpuwhy.app.demo.corpus import MANIFEST_FORMAT, capture_bytes, corpus, select, write_scenario
from gpuwhy.app.demo.corpus.host import NS, TICKS
from gpuwhy.app.rules_cli import read_capture
from gpuwhy.events import GpuSample, GpuSeen, ProcessSeen, SchedStats
from gpuwhy.rules import model as m
from gpuwhy.rules.loader import load_rules

SHIPPED = {rule.id for rule in load_rules()}


@pytest.fixture(scope="module")
def hosts():
    return {s.name: (s, s.host()) for s in corpus()}


@pytest.mark.parametrize("name", ["stuck-on-lock", "xid48-dbe"])
def test_the_same_seed_gives_the_same_capture_byte_for_byte(name):
    [scenario] = select([name])
    first = capture_bytes(scenario.host())
    assert first == capture_bytes(scenario.host())
    other = dataclasses.replace(scenario, seed=scenario.seed + 1000)
    assert capture_bytes(other.host()) != first


def test_every_scenario_is_ten_minutes_or_more_on_two_gpus_or_more(hosts):
    for name, (scenario, host) in hosts.items():
        assert host.n >= 600, name
        assert host.count >= 2, name
        assert 0 <= scenario.onset_s < host.n, name


def test_names_seeds_and_expected_answers_are_sound():
    scenarios = corpus()
    assert len({s.name for s in scenarios}) == len(scenarios)
    assert len({s.seed for s in scenarios}) == len(scenarios)
    for s in scenarios:
        # every fault names a shipped rule; ids of rules being written may stand beside it
        assert not s.expected or set(s.expected) & SHIPPED, s.name
        assert all(re.fullmatch(r"R\d+[a-z]?_\w+", r) for r in s.expected), s.name
        assert s.cause
        assert s.healthy == (not s.expected)
        assert s.healthy or s.group in m.GROUPS, s.name


def test_the_corpus_has_faults_in_every_rule_group_and_healthy_hosts():
    scenarios = corpus()
    faults = [s for s in scenarios if not s.healthy]
    assert len(faults) >= 30
    assert {s.group for s in faults} == set(m.GROUPS)
    assert sum(s.healthy for s in scenarios) >= 10


def test_a_capture_is_what_record_writes_and_rules_test_reads(tmp_path):
    [scenario] = select(["pcie-replays-riser"])
    capture, meta = write_scenario(scenario, tmp_path)
    manifest = json.loads(meta.read_text())
    assert manifest["format"] == MANIFEST_FORMAT
    assert manifest["capture"] == capture.name and manifest["expected"] == ["R31_pcie_replays"]
    assert manifest["healthy"] is False and manifest["gpus"] == 8
    lines = [json.loads(line) for line in capture.read_bytes().splitlines()]
    assert all(line["v"] == 1 and line["src"] and line["seq"] >= 1 for line in lines)
    events = read_capture(str(capture))
    assert len(events) == len(lines)
    assert {e.gpu_id for e in events if isinstance(e, GpuSeen)} == \
        {e.gpu_id for e in events if isinstance(e, GpuSample)}
    span = (events[-1].ts - events[0].ts) / 1e9
    assert span >= 600


def test_samples_follow_dcgm_semantics(hosts):
    """Ratios in [0, 1], utilisation in %, power within the limit, clocks within the
    board's, and only the faulty GPU affected where the fault is local."""
    scenario, host = hosts["thermal-tim-degraded"]
    samples = [e for _, e in host.events() if isinstance(e, GpuSample)]
    for sample in samples:
        f = sample.fields
        for name in ("sm_active", "tensor_active", "dram_active", "gr_engine_active",
                     "sm_occupancy", "fp32_active", "fp16_active", "fp64_active"):
            assert 0.0 <= f[name] <= 1.0
        assert 0.0 <= f["gpu_util"] <= 100.0
        assert f["power_w"] <= f["power_limit_w"] * 1.02
        assert f["sm_clock_mhz"] <= host.board.clk_max
    hot = {s.gpu_id for s in samples if s.fields["temp_c"] >= host.board.t_slow}
    assert hot == {host.uuids[5]}


def test_sched_stats_cover_the_main_process_and_its_workers(hosts):
    scenario, host = hosts["resnet18-cpu-starved"]
    stats = [e for _, e in host.events() if isinstance(e, SchedStats) and e.worker_processes]
    assert stats and {s.worker_processes for s in stats} == {6}
    for s in stats[:50]:
        for side, threads in ((s.own, s.own["threads"]), (s.workers, s.workers["threads"])):
            total = sum(side[k] for k in ("on_cpu_ns", "runqueue_ns", "sleep_ns", "blocked_ns"))
            assert total == pytest.approx(threads * s.interval_ns, rel=0.01)


def test_every_process_says_when_it_started_as_its_key_does(hosts):
    for name, (_, host) in hosts.items():
        seen = [(src, e) for src, e in host.events() if isinstance(e, ProcessSeen)]
        assert seen, name
        for _, event in seen:
            assert event.started_at is not None and event.started_at <= event.ts, name
            # its key's start time (ticks since the host's boot) and started_at agree
            boot = event.started_at - event.process.start_time * NS // TICKS
            assert abs(boot - (host.t0 - int(host.uptime_s * NS))) <= NS // TICKS, name
    _, host = hosts["resnet18-cpu-starved"]
    trainer = next(e for _, e in host.events() if isinstance(e, ProcessSeen)
                   and e.comm.startswith("python"))
    assert host.t0 - trainer.started_at >= 600 * NS     # a job that ran before the capture


def test_a_mig_gpu_reports_per_instance_as_dcgm_exporter_does(hosts):
    """GPU 0 in MIG mode (7 x 1g.10gb): no whole-GPU row, one row per instance and second
    labelled with its profile, no GPU_UTIL; the device's clock on every instance's row; each
    instance's activity and memory its own; the other GPUs as before."""
    scenario, host = hosts["mig-idle-notebook"]
    samples = [e for _, e in host.events() if isinstance(e, GpuSample)]
    mig = [s for s in samples if s.gpu_id == host.uuids[0]]
    assert mig and all(s.instance for s in mig)
    assert {s.instance for s in mig} == {str(gi) for gi in range(7, 14)}
    assert {s.labels["mig_profile"] for s in mig} == {"1g.10gb"}
    assert not any("gpu_util" in s.fields or "nvlink_tx_bytes_per_s" in s.fields for s in mig)
    by_instance: dict[str, list] = {}
    for s in mig:
        by_instance.setdefault(s.instance, []).append(s.fields)
        assert 0.0 <= s.fields["gr_engine_active"] <= 1.0
        assert s.fields["fb_used_mib"] <= s.fields["fb_total_mib"] == 9728.0
    clocks = {}
    for s in mig:
        clocks.setdefault(s.ts // NS, set()).add(s.fields["sm_clock_mhz"])
    assert all(len(c) == 1 for c in clocks.values())        # one device, one clock

    def mean(gi: str, name: str) -> float:
        values = [f[name] for f in by_instance[gi]]
        return sum(values) / len(values)

    assert mean("12", "gr_engine_active") == 0.0 and mean("12", "fb_used_mib") > 8000
    assert mean("13", "gr_engine_active") == 0.0 and mean("13", "fb_used_mib") < 16
    assert all(mean(gi, "gr_engine_active") > 0.3 for gi in ("7", "8", "9", "10", "11"))
    others = [s for s in samples if s.gpu_id != host.uuids[0]]
    assert others and all(s.instance == "" and "gpu_util" in s.fields for s in others)
