"""Every shipped rule fires on a synthetic series and stays quiet on a near miss."""

from __future__ import annotations

import dataclasses

import pytest

from gpuwhy.app.demo.synthetic_signals import FB_TOTAL, Synthetic, run
from gpuwhy.correlator.rules.signals import ProcessFacts, is_monitor
from gpuwhy.events import (
    DeviceOpened,
    DriverCall,
    EngineSample,
    GpuState,
    GpuXid,
    KernelLogRecord,
    ProcessExec,
    ProcessExited,
    ProcessSeen,
)
from gpuwhy.identity import ProcessKey
from gpuwhy.rules.loader import load_rules

RULES = {rule.id: rule for rule in load_rules()}
GPU0 = Synthetic().gpu_id(0)


def xid(code: int, t: float = 200, kernel: bool = False) -> list:
    if kernel:
        return [(t, KernelLogRecord(ts=0, cursor=f"c{code}", origin="journald", boot_id="b",
                                    record_kind="xid", xid=code, pci="0000:18:00",
                                    message=f"NVRM: Xid (PCI:0000:18:00): {code}"))]
    return [(t, GpuXid(ts=0, gpu_id=GPU0, xid=code, source="sim", simulated=True))]


def nvrm(kind: str, message: str, pci: str | None = None, **facts) -> list:
    return [(200, KernelLogRecord(ts=0, cursor="n1", origin="journald", boot_id="b",
                                  record_kind=kind, message=message, pci=pci, **facts))]


def command(cmdline: str) -> list:
    key = ProcessKey(4242, 777)
    return [(199, ProcessSeen(ts=0, process=key, comm=cmdline.split()[0], cmdline=cmdline)),
            (200, ProcessExec(ts=0, process=key, filename="/usr/bin/" + cmdline.split()[0]))]


def engine_scrapes(kv_cache_usage: float, preemptions_per_s: float, until: int = 400,
                   **values) -> list:
    """An inference engine's /metrics every 5 s (the engines source) for the process;
    ``values`` change the others (a number, or a function of the second)."""
    server = Synthetic().process(0, 0)
    given = {"kv_cache_usage": kv_cache_usage, "preemptions_per_s": preemptions_per_s,
             "requests_running": 30.0, "requests_waiting": 40.0, **values}
    return [(t, EngineSample(ts=0, engine="vllm", endpoint="http://127.0.0.1:8000/metrics",
                             process=server, processes=[server],
                             values={k: v(t) if callable(v) else v for k, v in given.items()}))
            for t in range(5, until, 5)]


def serving(gpu_busy: float, main: float = 0.6, worker: float = 0.5, **values) -> Synthetic:
    """A serving engine (its scrapes) on a GPU busy ``gpu_busy`` of the time, its main
    thread and its workers' busiest thread on a CPU ``main``, ``worker`` of it."""
    return Synthetic(gpu={"gpu_util": 100 * gpu_busy, "gr_engine_active": gpu_busy},
                     own={"main": main}, workers={"busiest": worker},
                     extra=engine_scrapes(0.3, 0.0, **values))


# the inter-token latency's tail of a step that computes a long prompt whole (R51)
PREFILL_HEAVY = {"prompt_tokens_per_s": 14000.0, "generation_tokens_per_s": 700.0,
                 "tpot_p50_s": 0.02}


def bursty(trough: float):
    return lambda t: {"gpu_util": 98.0 if t % 10 < 3 else trough}


def slow(gpu: dict) -> Synthetic:
    """Rules with ``for: 5m`` after a 2-minute warm-up need 10 minutes of data."""
    return Synthetic(duration_s=600, gpu=gpu)


IDLE = {"gpu_util": 5.0, "gr_engine_active": 0.05}
# The NVLink fabric not set up (NotStarted): no CUDA context forms, the GPU does nothing
FABRIC_DOWN = {"fabric_state": 1.0, "gpu_util": 0.0, "gr_engine_active": 0.0,
               "sm_active": 0.0, "tensor_active": 0.0, "fb_used_mib": 0.0}
CASES = {
    # rule: (firing scenario, near-miss scenario)
    "R01_input_cpu_bound": (
        Synthetic(gpu=IDLE, workers={"on_cpu": 3.8}, own={"on_cpu": 0.3, "sleep": 2.6}),
        Synthetic(gpu=IDLE, workers={"on_cpu": 3.4}, own={"on_cpu": 0.3, "sleep": 2.6})),
    "R02_input_io_bound": (
        Synthetic(gpu=IDLE, own={"on_cpu": 0.2, "sleep": 0.5, "blocked": 2.0}),
        Synthetic(gpu=IDLE, own={"on_cpu": 0.2, "sleep": 0.5, "blocked": 0.6})),

    "R03_dataloader_synchronous": (
        Synthetic(gpu={"gr_engine_active": 0.2}, workers={"processes": 0}),
        Synthetic(gpu={"gr_engine_active": 0.2}, workers={"processes": 1})),
    "R03b_workers_oversubscribed": (
        Synthetic(workers={"runqueue": 1.5}), Synthetic(workers={"runqueue": 0.5})),
    "R04_launch_bound": (
        Synthetic(gpu={"sm_active": 0.2, "gr_engine_active": 0.5}, workers={"on_cpu": 0.5}),
        Synthetic(gpu={"sm_active": 0.2, "gr_engine_active": 0.5}, workers={"on_cpu": 0.5},
                  calls={"rm_alloc": 30, "rm_free": 30})),
    "R04b_cuda_launch_bound": (
        Synthetic(gpu={"sm_active": 0.2, "gr_engine_active": 0.5}, cuda={"launches": 6000}),
        Synthetic(gpu={"sm_active": 0.2, "gr_engine_active": 0.5}, cuda={"launches": 1500})),
    "R05b_cuda_sync_bound": (
        Synthetic(gpu={"gr_engine_active": 0.5}, cuda={"syncs": 50, "sync_frac": 0.45}),
        Synthetic(gpu={"gr_engine_active": 0.5}, cuda={"syncs": 50, "sync_frac": 0.2})),
    "R06b_cuda_pageable_copies": (
        Synthetic(cuda={"pageable_frac": 0.9}), Synthetic(cuda={"pageable_frac": 0.3})),
    "R05_gpu_idle_process_blocked": (
        Synthetic(gpu={"gpu_util": 2, "gr_engine_active": 0.02},
                  own={"on_cpu": 0.1, "sleep": 3.0}, workers={"on_cpu": 0.1}),
        Synthetic(gpu={"gpu_util": 2, "gr_engine_active": 0.02},
                  own={"on_cpu": 0.3, "sleep": 1.0}, workers={"on_cpu": 0.1})),
    "R06_pageable_h2d_copy": (
        Synthetic(gpu={"pcie_rx_bytes_per_s": 5e9, "sm_active": 0.2}, own={"on_cpu": 0.8}),
        Synthetic(gpu={"pcie_rx_bytes_per_s": 2.5e9, "sm_active": 0.2}, own={"on_cpu": 0.8})),
    "R07_pcie_saturated_low_sm": (
        Synthetic(gpu={"pcie_tx_bytes_per_s": 48e9, "pcie_rx_bytes_per_s": 48e9,
                       "sm_active": 0.3}),
        Synthetic(gpu={"pcie_tx_bytes_per_s": 48e9, "pcie_rx_bytes_per_s": 48e9,
                       "sm_active": 0.6})),
    "R08_debug_or_limiting_env": (
        Synthetic(env={"CUDA_LAUNCH_BLOCKING": "1"}),
        Synthetic(env={"CUDA_LAUNCH_BLOCKING": "0", "NCCL_DEBUG": "INFO"})),
    "R09_small_grid_low_sm": (
        Synthetic(gpu={"sm_active": 0.3}), Synthetic(gpu={"sm_active": 0.55})),
    "R10_low_occupancy": (
        slow({"sm_occupancy": 0.1, "dram_active": 0.2, "tensor_active": 0.1}),
        slow({"sm_occupancy": 0.25, "dram_active": 0.2, "tensor_active": 0.1})),
    "R11_memory_bandwidth_bound": (
        slow({"dram_active": 0.7, "tensor_active": 0.1, "sm_active": 0.6}),
        slow({"dram_active": 0.55, "tensor_active": 0.1, "sm_active": 0.6})),
    "R12_tensor_cores_unused": (
        slow({"sm_active": 0.7, "tensor_active": 0.01, "fp32_active": 0.4}),
        slow({"sm_active": 0.7, "tensor_active": 0.1, "fp32_active": 0.4})),
    "R13_unexpected_fp64": (
        Synthetic(gpu={"fp64_active": 0.1, "tensor_active": 0.02}),
        Synthetic(gpu={"fp64_active": 0.03, "tensor_active": 0.02})),
    "R14_bursty_utilisation": (Synthetic(gpu=bursty(2.0)), Synthetic(gpu=bursty(20.0))),
    "R14b_low_gpu_utilisation": (
        Synthetic(duration_s=700, gpu={"gpu_util": 50.0}),
        Synthetic(duration_s=700, gpu={"gpu_util": 75.0})),
    # two ranks of one job (one command line on two GPUs): peers to reach
    "R15_collectives_off_nvlink": (
        Synthetic(gpus=2, gpu={"pcie_tx_bytes_per_s": 25e9, "pcie_rx_bytes_per_s": 25e9,
                               "nvlink_tx_bytes_per_s": 0, "nvlink_rx_bytes_per_s": 0}),
        Synthetic(gpu={"pcie_tx_bytes_per_s": 25e9, "pcie_rx_bytes_per_s": 25e9})),
    "R16_comm_bound_exposed": (
        slow({"pcie_tx_bytes_per_s": 40e9, "pcie_rx_bytes_per_s": 40e9,
                                       "sm_active": 0.3, "tensor_active": 0.05}),
        slow({"pcie_tx_bytes_per_s": 40e9, "pcie_rx_bytes_per_s": 40e9,
                                       "sm_active": 0.3, "tensor_active": 0.2})),
    "R17_collective_hang": (
        Synthetic(gpus=2, gpu={"gpu_util": 100, "sm_active": 0.02, "tensor_active": 0.0,
                               "nvlink_tx_bytes_per_s": 0, "nvlink_rx_bytes_per_s": 0,
                               "power_w": 200}),
        Synthetic(gpu={"gpu_util": 100, "sm_active": 0.02, "tensor_active": 0.05,
                       "nvlink_tx_bytes_per_s": 0, "nvlink_rx_bytes_per_s": 0, "power_w": 200})),
    "R19_power_cap": (
        Synthetic(gpu={"clocks_event_reasons": 0x4, "sm_clock_mhz": 1228, "power_limit_w": 350}),
        Synthetic(gpu={"clocks_event_reasons": 0x4, "sm_clock_mhz": 1900,
                       "power_limit_w": 350})),
    "R20_thermal_throttle": (
        Synthetic(gpu={"clocks_event_reasons": 0x60, "sm_clock_mhz": 1089, "temp_c": 88}),
        Synthetic(gpu={"clocks_event_reasons": 0x0, "sm_clock_mhz": 1089, "temp_c": 88})),
    "R21_hw_slowdown_power_brake": (
        Synthetic(gpu={"clocks_event_reasons": 0x8, "sm_clock_mhz": 990}),
        Synthetic(gpu={"clocks_event_reasons": 0x8, "sm_clock_mhz": 1188})),
    "R22_sync_boost_or_clock_lock": (
        Synthetic(gpu={"clocks_event_reasons": 0x10, "sm_clock_mhz": 1500}),
        Synthetic(gpu={"clocks_event_reasons": 0x10, "sm_clock_mhz": 1900})),
    "R23_alloc_churn": (
        Synthetic(gpu={"gr_engine_active": 0.5}, calls={"rm_alloc": 150, "rm_free": 150}),
        Synthetic(gpu={"gr_engine_active": 0.8}, calls={"rm_alloc": 150, "rm_free": 150})),
    "R23b_cuda_alloc_churn": (
        Synthetic(gpu={"gr_engine_active": 0.5}, cuda={"allocs": 40, "frees": 40}),
        Synthetic(gpu={"gr_engine_active": 0.5}, cuda={"allocs": 20, "frees": 20})),
    "R24_uvm_thrash": (
        Synthetic(gpu={"sm_active": 0.3}, calls={"uvm_migrate": 200}),
        Synthetic(gpu={"sm_active": 0.3}, calls={"uvm_migrate": 50})),
    "R25_fb_near_full": (
        Synthetic(gpu={"fb_used_mib": 0.98 * FB_TOTAL}, calls={"rm_alloc": 15, "rm_free": 15}),
        Synthetic(gpu={"fb_used_mib": 0.95 * FB_TOTAL}, calls={"rm_alloc": 15, "rm_free": 15})),
    "R26_multi_process_contention": (Synthetic(processes=2), Synthetic(processes=1)),
    "R27_allocated_but_idle": (
        Synthetic(duration_s=1300, step_s=5, gpu={"gpu_util": 0, "gr_engine_active": 0.005}),
        Synthetic(duration_s=1300, step_s=5, gpu={"gpu_util": 0, "gr_engine_active": 0.05})),
    # MIG instance 9 holds 8 GiB and does nothing, instance 10 is busy; the near miss, the
    # same instance at 5 % (a notebook between cells that still runs something)
    "R47_mig_instance_allocated_but_idle": (
        Synthetic(duration_s=1300, step_s=5, instances={
            "9": ("1g.10gb", {"gr_engine_active": 0.0, "sm_active": 0.0, "dram_active": 0.0,
                              "fb_used_mib": 8210.0}),
            "10": ("1g.10gb", {})}),
        Synthetic(duration_s=1300, step_s=5, instances={
            "9": ("1g.10gb", {"gr_engine_active": 0.05, "fb_used_mib": 8210.0}),
            "10": ("1g.10gb", {})})),
    "R31_pcie_replays": (Synthetic(gpu={"pcie_replays": 0.5}),
                         Synthetic(gpu={"pcie_replays": 0.1})),
    "R32_xid79_fallen_off_bus": (Synthetic(extra=xid(79)), Synthetic(extra=xid(45))),
    "R33_xid48_double_bit_ecc": (Synthetic(extra=xid(48, kernel=True)),
                                 Synthetic(extra=xid(31, kernel=True))),
    "R34_xid94_95_ecc_containment": (Synthetic(extra=xid(95)), Synthetic(extra=xid(92))),
    "R35_row_remap_failure": (Synthetic(extra=xid(64, kernel=True)),
                              Synthetic(extra=xid(62, kernel=True))),
    "R36_app_fault_xid13_31_43": (Synthetic(extra=xid(13)), Synthetic(extra=xid(14))),
    "R37_nvlink_error_xid74": (Synthetic(extra=xid(74)), Synthetic(extra=xid(75))),
    "R38_sbe_storm_xid92": (Synthetic(gpu={"ecc_sbe_volatile": 0.05}),
                            Synthetic(gpu={"ecc_sbe_volatile": 0.02})),
    "R39_gsp_timeout_xid119_120": (Synthetic(extra=xid(119, kernel=True)),
                                   Synthetic(extra=xid(118, kernel=True))),
    "R40_operator_or_cron_intervention": (
        Synthetic(extra=command("nvidia-smi -i 0 -r")),
        Synthetic(extra=command("nvidia-smi --query-gpu=name --format=csv"))),
    "R41_driver_api_mismatch": (
        Synthetic(extra=nvrm("api_mismatch", "API mismatch: client version 550.54.14, kernel "
                                              "module version 535.104.05",
                             details={"client_version": "550.54.14",
                                      "kernel_version": "535.104.05"})),
        Synthetic(extra=nvrm("driver_loaded", "NVIDIA UNIX Open Kernel Module for x86_64",
                             driver_version="535.104.05"))),
    # GPU 0 is 0000:18:00: the near miss is another GPU's failure, not this one's
    "R42_gpu_failed_to_initialise": (
        Synthetic(extra=nvrm("probe_failed", "the GPU is not supported by this driver release",
                             pci="0000:18:00")),
        Synthetic(extra=nvrm("probe_failed", "the GPU is not supported by this driver release",
                             pci="0000:3b:00"))),
    # trained at Gen4 under load; the near miss is an idle link at Gen1 (power saving)
    "R43_pcie_link_degraded": (
        Synthetic(gpu={"pcie_link_gen": 4, "pcie_link_gen_max": 5, "pcie_link_width": 16,
                       "pcie_link_width_max": 16}),
        Synthetic(gpu={"gpu_util": 0, "gr_engine_active": 0.0, "pcie_link_gen": 1,
                       "pcie_link_gen_max": 5, "pcie_link_width": 16,
                       "pcie_link_width_max": 16})),
    # 150 CRC errors a second against DCGM's 100; the near miss, 50 a second
    "R44_nvlink_link_errors": (
        Synthetic(gpu=lambda t: {"nvlink_crc_flit_errors": 150.0 * t,
                                 "nvlink_crc_data_errors": 0.0, "nvlink_replay_errors": 0.0,
                                 "nvlink_recovery_errors": 0.0}),
        Synthetic(gpu=lambda t: {"nvlink_crc_flit_errors": 50.0 * t,
                                 "nvlink_crc_data_errors": 0.0, "nvlink_replay_errors": 0.0,
                                 "nvlink_recovery_errors": 0.0})),
    # a process on the GPU gets nothing done while the fabric stays NotStarted; the near
    # miss, a fabric still training at boot (InProgress for 90 s, then Success)
    "R45_fabric_not_up": (
        Synthetic(gpu=FABRIC_DOWN),
        Synthetic(gpu=lambda t: {**FABRIC_DOWN, "fabric_state": 2.0 if t < 90 else 3.0})),
    # bound to the other socket while its GPU waits a fifth of the time; the near miss, the
    # same process not bound at all: the kernel runs it on both sockets about evenly
    "R46_cpu_on_far_numa_node": (
        Synthetic(gpu={"gr_engine_active": 0.8}, numa_node=1, cpu_nodes=(1.0, 0.0)),
        Synthetic(gpu={"gr_engine_active": 0.8}, numa_node=1, cpu_nodes=(0.55, 0.45))),
    # a full KV cache that holds its requests is no fault; one that preempts them is
    "R48_kv_cache_pressure": (Synthetic(extra=engine_scrapes(0.97, 0.4)),
                              Synthetic(extra=engine_scrapes(0.97, 0.0))),
    # requests wait while the GPU idles between steps and the engine's loop holds a core;
    # near miss: the same queue at full GPU (a capacity limit, the loop spins on the GPU)
    "R49_engine_cpu_bound": (serving(0.55, main=1.0), serving(0.93, main=1.0)),
    # a worker (a tokenising pre/post-processing instance) on a core, the engine starved;
    # near miss: the worker at half a core
    "R50_engine_frontend_bound": (serving(0.3, main=0.1, worker=1.0, requests_per_s=0.4),
                                  serving(0.3, main=0.1, worker=0.5, requests_per_s=0.4)),
    "R51_long_prefills_block_decodes": (serving(0.95, **PREFILL_HEAVY, tpot_p95_s=0.25),
                                        serving(0.95, **PREFILL_HEAVY, tpot_p95_s=0.08)),
    "R52_engine_low_load": (serving(0.1, main=0.1, requests_waiting=0.0, requests_running=0.2),
                            serving(0.1, main=0.1, requests_waiting=2.0)),
    # a closed loop: 32 in flight at every scrape, none waiting, the loop spinning on a busy
    # GPU; near miss: open-loop arrivals, 12 to 52 running
    "R52b_engine_closed_loop": (
        serving(0.9, main=1.0, requests_waiting=0.0, requests_running=32.0),
        serving(0.9, main=1.0, requests_waiting=0.0,
                requests_running=lambda t: 32.0 + 10 * ((t // 5) % 5 - 2))),
    "R53_engine_gpu_shared": (dataclasses.replace(serving(0.9), processes=2),
                              serving(0.9)),
    # p95 time to first token four times its level of the 10 minutes before
    "R54_serving_latency_up": (
        Synthetic(duration_s=960, extra=engine_scrapes(
            0.3, 0.0, until=960, ttft_p95_s=lambda t: 1.6 if t >= 720 else 0.4 + 0.02 * (t % 3))),
        Synthetic(duration_s=960, extra=engine_scrapes(
            0.3, 0.0, until=960, ttft_p95_s=lambda t: 0.4 + 0.02 * (t % 3)))),
    # generation tokens/s down by a third at 720 s, as many requests in the engine; near
    # miss: the same drop with a third of the requests (less load came)
    "R55_serving_throughput_down": (
        Synthetic(duration_s=960, extra=engine_scrapes(
            0.3, 0.0, until=960, generation_tokens_per_s=lambda t: (
                1300.0 if t >= 720 else 2000.0) + 40 * (t % 3))),
        Synthetic(duration_s=960, extra=engine_scrapes(
            0.3, 0.0, until=960, generation_tokens_per_s=lambda t: (
                1300.0 if t >= 720 else 2000.0) + 40 * (t % 3),
            requests_running=lambda t: 10.0 if t >= 720 else 30.0,
            requests_waiting=lambda t: 0.0 if t >= 720 else 40.0))),
    "R40b_gpu_reset_under_load": (
        Synthetic(extra=[(200, GpuState(ts=0, gpu_id=GPU0, state="resetting", source="sim",
                                        simulated=True))]),
        Synthetic(extra=[(200, GpuState(ts=0, gpu_id=GPU0, state="back", source="sim",
                                        simulated=True))])),
}


def test_every_shipped_rule_has_a_case_and_there_are_at_least_30():
    assert len(RULES) >= 30
    assert set(CASES) == set(RULES)


def fired(rule_id: str, spec: Synthetic) -> list:
    findings, engine = run(spec, [RULES[rule_id]])
    return [f for f in findings if f.rule_id == rule_id and f.state == "firing"], engine


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires_on_its_scenario(rule_id):
    firing, engine = fired(rule_id, CASES[rule_id][0])
    assert firing, engine.status()
    finding = firing[0]
    rule = RULES[rule_id]
    assert finding.title == rule.title and finding.root_cause == rule.cause
    assert 2 <= len(finding.fixes) <= 4
    assert finding.verify
    assert finding.evidence and any(v is not None for v in finding.evidence.values())
    assert finding.window_start < finding.window_end
    assert finding.gpu_id == GPU0


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_stays_quiet_on_a_near_miss(rule_id):
    firing, engine = fired(rule_id, CASES[rule_id][1])
    assert not firing
    assert {s["status"] for s in engine.status()} & {"ok", "pending"}, engine.status()


def _host_churn(until: float = 400.0) -> list:
    """The host's own short-lived processes (health checks, scripts), one in ten failing:
    none of them opens a GPU."""
    out = []
    for n in range(int(until // 2)):
        key = ProcessKey(40_000 + n, 700_000 + n)
        out += [(2.0 * n, ProcessSeen(ts=0, process=key, comm="sh", cmdline="sh -c check")),
                (2.0 * n + 0.1, ProcessExited(ts=0, process=key, exit_code=int(n % 10 == 0)))]
    return out


def test_a_reset_is_under_load_only_when_the_gpus_own_processes_held_it():
    # between two rounds: by the next one the reset's victim is gone, only its exit says so
    reset = [(200.5, GpuState(ts=0, gpu_id=GPU0, state="resetting", source="sim",
                              simulated=True))]
    idle = Synthetic(processes=0, extra=sorted(reset + _host_churn(), key=lambda p: p[0]))
    firing, engine = fired("R40b_gpu_reset_under_load", idle)
    assert not firing, engine.status()
    trainer = ProcessKey(30_000, 600_000)      # it held the GPU and the reset killed it
    killed = [(150, ProcessSeen(ts=0, process=trainer, comm="python3", cmdline="train.py")),
              (150.5, DeviceOpened(ts=0, process=trainer, fd=5, path="/dev/nvidia0",
                                   device="nvidiaN", minor=0)),
              (201, ProcessExited(ts=0, process=trainer, signal=9))]
    loaded = Synthetic(processes=0, extra=sorted(reset + killed + _host_churn(),
                                                 key=lambda p: p[0]))
    firing, _ = fired("R40b_gpu_reset_under_load", loaded)
    assert firing and firing[0].evidence["failed_exits"] == 1


def test_a_healthy_host_fires_nothing():
    findings, engine = run(Synthetic(duration_s=600), RULES.values())
    assert findings == []
    assert "firing" not in {s["status"] for s in engine.status()}


def test_a_healthy_host_with_the_cuda_uprobes_on_fires_nothing():
    findings, engine = run(Synthetic(duration_s=600, cuda={}), RULES.values())
    assert findings == []
    statuses = {s["rule_id"]: s["status"] for s in engine.status()}
    assert statuses["R04b_cuda_launch_bound"] == "ok"


@pytest.mark.parametrize("inferred, precise", [("R04_launch_bound", "R04b_cuda_launch_bound"),
                                               ("R06_pageable_h2d_copy",
                                                "R06b_cuda_pageable_copies"),
                                               ("R23_alloc_churn", "R23b_cuda_alloc_churn")])
def test_the_inferred_rule_stands_down_where_the_cuda_uprobes_count(inferred, precise):
    """Where the process's CUDA calls are counted the precise rule decides: the same host,
    seen with the uprobes on and healthy CUDA figures, leaves the inferred rule suppressed."""
    spec = CASES[inferred][0]
    assert fired(inferred, spec)[0]
    counted = dataclasses.replace(spec, cuda={})
    firing, engine = fired(inferred, counted)
    assert not firing
    assert [s["status"] for s in engine.status()] == ["suppressed"]
    assert not fired(precise, counted)[0]


def test_tf32_advice_only_where_the_gpu_has_tf32():
    spec = CASES["R12_tensor_cores_unused"][0]
    [hopper] = fired("R12_tensor_cores_unused", spec)[0][:1]
    spec.model = "Tesla V100-SXM2-32GB"
    [volta] = fired("R12_tensor_cores_unused", spec)[0][:1]
    assert any("set_float32_matmul_precision" in fix for fix in hopper.fixes)
    assert not any("set_float32_matmul_precision" in fix for fix in volta.fixes)
    assert len(volta.fixes) == len(hopper.fixes) - 1


@pytest.mark.parametrize("net_wait, fires", [(2.8, True), (0.4, False), (0.0, False)])
def test_workers_waiting_on_sockets_starve_the_loader_as_reads_do(net_wait, fires):
    """Workers streaming from an object store sleep (S), not block (D): R02 reads the sleep
    that ended in a socket receive. Waits shorter than the workers' computing are theirs to
    have; sleep alone (idle workers) is no evidence."""
    spec = Synthetic(gpu=IDLE, workers={"on_cpu": 0.6, "sleep": 3.4, "blocked": 0.0,
                                        "net_rx": 30e6, "net_wait": net_wait})
    firing, _ = fired("R02_input_io_bound", spec)
    assert bool(firing) == fires
    if fires:
        assert firing[0].evidence["workers_network_wait"] == pytest.approx(0.7, abs=0.01)
        assert firing[0].evidence["workers_received_Bps"] == pytest.approx(30e6, rel=0.01)


@pytest.mark.parametrize("own, fires", [
    ({"on_cpu": 0.3, "sleep": 20.0, "blocked": 0.6}, True),     # D state over on-CPU
    ({"on_cpu": 0.3, "sleep": 20.0, "net_wait": 0.6, "net_rx": 8e6}, True),   # a stream
    ({"on_cpu": 0.3, "sleep": 20.0, "net_wait": 0.6, "net_rx": 20e3}, False),  # requests
    ({"on_cpu": 0.8, "sleep": 20.0, "blocked": 0.3}, False),
])
def test_a_process_without_workers_waits_on_its_own_reads(own, fires):
    """num_workers=0: the main thread, one of many, reads the batches; its shares are
    diluted alike, so D state (or socket waits while samples stream in) above its on-CPU
    time is the loader waiting. With workers, its own sockets are NCCL's or requests'."""
    spec = Synthetic(gpu=IDLE, own={**own, "threads": 24}, workers={"processes": 0})
    assert bool(fired("R02_input_io_bound", spec)[0]) is fires
    with_workers = Synthetic(gpu=IDLE, own={**own, "threads": 24})
    assert not fired("R02_input_io_bound", with_workers)[0]


# A kernel that spins on a few SMs looks like a collective that never completes.
SPIN = {"gpu_util": 100, "sm_active": 0.02, "tensor_active": 0.0, "power_w": 200,
        "nvlink_tx_bytes_per_s": 0, "nvlink_rx_bytes_per_s": 0}


@pytest.mark.parametrize("spec, fires", [
    (Synthetic(gpu=SPIN), False),                               # one process, one GPU
    (Synthetic(gpus=2, gpu=SPIN), True),                        # one job on two GPUs
    # this GPU carried peer traffic before the hang (the look-back needs 5 minutes)
    (Synthetic(duration_s=600, gpu=lambda t: SPIN if t >= 150 else {
        **SPIN, "nvlink_tx_bytes_per_s": 40e9, "nvlink_rx_bytes_per_s": 40e9}), True),
])
def test_a_collective_hang_needs_a_sign_of_peers(spec, fires):
    assert bool(fired("R17_collective_hang", spec)[0]) is fires


def test_peers_on_pcie_need_a_job_on_two_gpus():
    """One process moving as much both ways (offloaded optimizer state) has no peer."""
    both = {"pcie_tx_bytes_per_s": 25e9, "pcie_rx_bytes_per_s": 25e9,
            "nvlink_tx_bytes_per_s": 0, "nvlink_rx_bytes_per_s": 0}
    assert not fired("R15_collectives_off_nvlink", Synthetic(gpu=both))[0]
    assert fired("R15_collectives_off_nvlink", Synthetic(gpus=2, gpu=both))[0]


def _version_check(ret: int) -> list:
    """A client's NV_ESC_CHECK_VERSION_STR as fdtrack reports it: refused (-EINVAL) when
    its version is not the loaded module's."""
    return [(200, DriverCall(ts=0, process=Synthetic().process(0, 0), tid=1, fd=3,
                             path="/dev/nvidiactl", device="nvidiactl", cmd=0xC04846D2,
                             nr=0xD2, size=72, op="NV_ESC_CHECK_VERSION_STR", latency_ns=40_000,
                             ret=ret, version="550.127.05",
                             reasons=["notable", "error"] if ret else ["notable"]))]


def test_a_refused_version_check_alone_is_a_driver_mismatch():
    [finding] = fired("R41_driver_api_mismatch", Synthetic(extra=_version_check(-22)))[0]
    assert finding.evidence["failed_version_checks"] == 1
    assert finding.evidence["mismatch_lines"] == 0
    assert not fired("R41_driver_api_mismatch", Synthetic(extra=_version_check(0)))[0]
    # a call that fails otherwise is no refusal: -ENOTTY is what a look-alike device file
    # (the test stand-ins' replay) answers, -EFAULT a bad pointer
    for errno_ret in (-25, -14):
        assert not fired("R41_driver_api_mismatch",
                         Synthetic(extra=_version_check(errno_ret)))[0]


def test_socket_figures_a_kernel_could_not_count_are_unknown_not_zero():
    from gpuwhy.rules.vocabulary import SIGNALS
    row = {"interval_ns": 10**9, "workers_on_cpu_ns": 1, "workers_runqueue_ns": 0,
           "workers_sleep_ns": 5, "workers_blocked_ns": 0}
    assert SIGNALS["workers.netwait_frac"].derive(row) is None
    assert SIGNALS["workers.net_rx_Bps"].derive(row) is None
    row.update(workers_net_wait_ns=3, workers_net_rx_bytes=500)
    assert SIGNALS["workers.netwait_frac"].derive(row) == pytest.approx(0.5)
    assert SIGNALS["workers.net_rx_Bps"].derive(row) == pytest.approx(500)


def test_escalation_raises_the_severity():
    [lowered] = fired("R19_power_cap", CASES["R19_power_cap"][0])[0]
    assert lowered.severity == "error"   # 350 W < 0.95 x 700 W default
    default_limit = Synthetic(gpu={"clocks_event_reasons": 0x4, "sm_clock_mhz": 1228})
    [at_default] = fired("R19_power_cap", default_limit)[0]
    assert at_default.severity == "info"


def test_monitor_processes_do_not_count_as_sharing():
    hostengine = ProcessKey(777, 1)
    extra = [(1, ProcessSeen(ts=0, process=hostengine, comm="nv-hostengine",
                             cmdline="/usr/bin/nv-hostengine -n")),
             (1, DeviceOpened(ts=0, process=hostengine, fd=3, path="/dev/nvidia0",
                              device="nvidiaN", minor=0))]
    assert not fired("R26_multi_process_contention", Synthetic(extra=extra))[0]
    trainer = ProcessKey(778, 1)
    extra = [(1, ProcessSeen(ts=0, process=trainer, comm="python3", cmdline="python3 b.py")),
             (1, DeviceOpened(ts=0, process=trainer, fd=3, path="/dev/nvidia0",
                              device="nvidiaN", minor=0))]
    assert fired("R26_multi_process_contention", Synthetic(extra=extra))[0]


@pytest.mark.parametrize("cmdline, monitor", [
    ("/usr/bin/nv-hostengine -n", True),
    ("/opt/gpuwhy/venv/bin/gpuwhy serve", True),
    # as the GPU kit ran its sampler on the H200: an NVML client holding /dev/nvidia0, which
    # R36 named as the faulting application and the stall detector as a stalled job
    ("/tmp/gpuwhy-kit-venv/bin/python -m gpuwhy gpu sample --source nvml --json", True),
    ("python3 -u -m nvitop", True),
    ("/usr/bin/python3 /usr/local/bin/gpustat -i 1", True),   # a console script
    ("python3 train.py --log-dir /tmp/gpuwhy", False),
    ("python3 -m torch.distributed.run --nproc-per-node 8 train.py", False),
    ("python3 my_gpuwhy_tests.py", False),
])
def test_a_monitor_is_known_by_its_program_however_it_is_run(cmdline, monitor):
    assert is_monitor(ProcessFacts(comm="python3", cmdline=cmdline)) is monitor


def test_a_forked_dataloader_worker_is_not_a_second_compute_process():
    """It holds the GPU's device files inherited at fork but never calls the driver."""
    worker = ProcessKey(10_500, 600_000)
    extra = [(1, ProcessSeen(ts=0, process=worker, comm="pt_data_worker",
                             cmdline="python3 train.py --epochs 90", ppid=10_000)),
             (1, DeviceOpened(ts=0, process=worker, fd=5, path="/dev/nvidia0",
                              device="nvidiaN", minor=0, how="fork"))]
    assert not fired("R26_multi_process_contention", Synthetic(extra=extra))[0]


def _rm_control(name: str) -> list:
    """A notable RM_CONTROL of one of the compute processes, as fdtrack reports it."""
    return [(200, DriverCall(ts=0, process=Synthetic().process(0, 0), tid=1, fd=3,
                             path="/dev/nvidiactl", device="nvidiactl", cmd=0xC020462A,
                             nr=0x2A, size=32, op="NV_ESC_RM_CONTROL", latency_ns=50_000,
                             ret=0, sub_name=name, reasons=["notable"]))]


@pytest.mark.parametrize("control, fires", [
    ("NV0080_CTRL_CMD_BIF_RESET", True),
    ("NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_RESET", True),
    ("NV2080_CTRL_CMD_GPU_GET_RESET_STATUS", False),      # reading a status resets nothing
    ("NV906F_CTRL_CMD_RESET_CHANNEL", False),             # a channel, not the GPU
    ("NV2080_CTRL_CMD_GPU_RESET_ECC_ERROR_STATUS", False),
])
def test_a_driver_call_counts_as_an_intervention_only_when_it_resets_the_gpu(control, fires):
    firing, _ = fired("R40_operator_or_cron_intervention", Synthetic(extra=_rm_control(control)))
    assert bool(firing) is fires


# --- R45: the NVLink fabric ---------------------------------------------------------------
def failed_starts(every_s: float = 40.0, until: float = 400.0, opens_gpu: bool = True) -> list:
    """A job's rank dying at CUDA init (exit 1) and started again every ``every_s``: CUDA's
    init opens the GPU's device file before it fails. ``opens_gpu=False``: a host process
    that fails as often without touching a GPU (a health check, a script)."""
    out, t, n = [], 20.0, 0
    while t < until:
        key = ProcessKey(20_000 + n, 900_000 + n)
        out += [(t, ProcessSeen(ts=0, process=key, comm="python3", cmdline="python3 train.py")),
                (t + 6, ProcessExited(ts=0, process=key, exit_code=1))]
        if opens_gpu:
            out.append((t + 5, DeviceOpened(ts=0, process=key, fd=5, path="/dev/nvidia0",
                                            device="nvidiaN", minor=0)))
        t, n = t + every_s, n + 1
    return sorted(out, key=lambda pair: pair[0])


@pytest.mark.parametrize("gpu, severity, after_s", [
    ({"fabric_state": 4.0}, "critical", (0, 60)),                      # Failure: at once
    ({"fabric_state": 3.0, "fabric_health": 2.0}, "warning", (0, 60)),    # unhealthy
    ({"fabric_state": 3.0, "fabric_health": 3.0}, "warning", (0, 60)),    # limited capacity
    (FABRIC_DOWN, "critical", (180, 200)),   # not up through 3 minutes, a process held up
])
def test_r45_fires_at_its_severity(gpu, severity, after_s):
    firing, _ = fired("R45_fabric_not_up", Synthetic(gpu=gpu))
    assert {f.severity for f in firing} == {severity}
    at = (firing[0].ts - Synthetic().events()[0].ts) / 10**9
    assert after_s[0] <= at <= after_s[1]


def test_r45_fires_on_ranks_failing_at_cuda_init_with_none_on_the_gpu_now():
    firing, _ = fired("R45_fabric_not_up",
                      Synthetic(gpu=FABRIC_DOWN, processes=0, extra=failed_starts()))
    assert firing and firing[0].severity == "critical"
    assert firing[0].evidence["failed_exits_6m"] >= 4


@pytest.mark.parametrize("spec", [
    # a board without an NVSwitch fabric (PCIe cards, pre-Hopper GPUs): NotSupported
    Synthetic(gpu={**FABRIC_DOWN, "fabric_state": 0.0, "fabric_health": 0.0},
              extra=failed_starts()),
    # set up and healthy, the GPU idle with a process on it: R27's question, not this one's
    Synthetic(gpu={**FABRIC_DOWN, "fabric_state": 3.0, "fabric_health": 1.0}),
    # NotStarted while CUDA works (a rack whose fabric no host Fabric Manager sets up)
    Synthetic(gpu={"fabric_state": 1.0}),
    Synthetic(gpu={**FABRIC_DOWN, "fb_used_mib": 30000.0}),   # a context: CUDA started
    Synthetic(gpu=FABRIC_DOWN, processes=0),                 # nothing tries to use it
    # the host's own processes fail as often, none of them on the GPU (a health check)
    Synthetic(gpu=FABRIC_DOWN, processes=0, extra=failed_starts(opens_gpu=False)),
    # a slow training at boot (2 minutes InProgress) while a job's ranks fail and restart
    Synthetic(gpu=lambda t: {**FABRIC_DOWN, "fabric_state": 2.0 if t < 120 else 3.0},
              extra=failed_starts(until=120.0)),
    # Unrecognized: driver and DCGM versions disagree; unknown, not failed
    Synthetic(gpu={**FABRIC_DOWN, "fabric_state": 5.0}, extra=failed_starts()),
])
def test_r45_stays_quiet(spec):
    firing, engine = fired("R45_fabric_not_up", spec)
    assert not firing, engine.status()


def test_r27_is_quiet_on_a_gpu_that_only_copies_as_a_real_h200_did():
    """Pinned host-to-device copies, as the H200 recording read them (tests/data/real/h200,
    the h2d-pinned phase): no SM and no graphics engine active, yet the copy engine busy and
    NVML's utilisation near 100 %. The GPU is working, not held idle; with no copy running
    (utilisation 0) the same GPU is R27's."""
    import json
    from pathlib import Path

    folder = Path(__file__).parent / "data" / "real" / "h200"
    phase = next(p for p in map(json.loads, (folder / "work/phases.jsonl").open())
                 if p["phase"] == "h2d-pinned")
    samples = [s["fields"] for s in map(json.loads,
                                        (folder / "gpuwhy/sample-h2d-pinned.jsonl").open())
               if "fields" in s and phase["start_ns"] <= s["ts"] <= phase["end_ns"]
               and "gr_engine_active" in s["fields"]]
    copying = {name: sum(s[name] for s in samples) / len(samples)
               for name in ("gpu_util", "gr_engine_active", "sm_active", "pcie_rx_bytes_per_s",
                            "pcie_tx_bytes_per_s")}
    assert copying["gpu_util"] > 90 and copying["gr_engine_active"] < 0.01
    assert not fired("R27_allocated_but_idle", Synthetic(duration_s=1300, step_s=5,
                                                         gpu=copying))[0]
    assert fired("R27_allocated_but_idle", Synthetic(duration_s=1300, step_s=5,
                                                     gpu={**copying, "gpu_util": 0.0}))[0]


@pytest.mark.parametrize("frontend, gpu_busy, fires", [
    ({"busiest": 1.0, "on_cpu": 1.1}, 0.3, True),    # vLLM V1's API server on a core
    ({"busiest": 1.0, "on_cpu": 1.1}, 0.9, False),   # busy, but the GPU sets the pace
    ({"busiest": 0.6, "on_cpu": 0.7}, 0.3, False),   # idle GPU, frontend not saturated
    (None, 0.3, False),                              # none watched: unknown, not busy
])
def test_a_saturated_frontend_process_is_r50s(frontend, gpu_busy, fires):
    """R50 reads the frontend processes of the engine above the GPU process (issue #59) as
    it reads its workers: here the workers idle, the engine's main thread not saturated."""
    spec = dataclasses.replace(serving(gpu_busy, main=0.3, worker=0.1, requests_per_s=6.0),
                               frontend=frontend)
    firing, engine = fired("R50_engine_frontend_bound", spec)
    assert bool(firing) == fires, engine.status()
    if fires:
        assert firing[0].evidence["busiest_frontend_thread_on_cpu"] > 0.9


@pytest.mark.parametrize("engine_loop, gpu_busy, rule, fires", [
    ({"busiest": 1.0, "on_cpu": 1.05}, 0.3, "R49_engine_cpu_bound", True),   # EngineCore
    ({"busiest": 1.0, "on_cpu": 1.05}, 0.9, "R49_engine_cpu_bound", False),  # GPU-paced
    ({"busiest": 0.6, "on_cpu": 0.65}, 0.3, "R49_engine_cpu_bound", False),  # not a core
    (None, 0.3, "R49_engine_cpu_bound", False),          # none watched: unknown, not busy
    # the engine loop saturated is R49's, not the frontend's
    ({"busiest": 1.0, "on_cpu": 1.05}, 0.3, "R50_engine_frontend_bound", False),
])
def test_a_saturated_engine_loop_process_is_r49s(engine_loop, gpu_busy, rule, fires):
    """Under tensor parallelism vLLM V1's loop runs in EngineCore, above the GPU workers
    (issue #59): R49 reads the busier of the GPU process's main thread (a worker's, here
    not busy) and its engine loop's busiest thread."""
    spec = dataclasses.replace(serving(gpu_busy, main=0.3, worker=0.1, requests_per_s=6.0),
                               engine_loop=engine_loop,
                               frontend={"busiest": 1.0, "on_cpu": 1.1})
    firing, engine = fired(rule, spec)
    assert bool(firing) == fires, engine.status()
    if fires:
        assert firing[0].evidence["busiest_engine_loop_thread_on_cpu"] > 0.9
        assert firing[0].evidence["main_thread_on_cpu"] < 0.5
