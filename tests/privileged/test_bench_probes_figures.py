"""bench_sidecar against the kernel: the memory a process's BPF maps pin (from
/proc/PID/fdinfo, a per-CPU map scaled to a 224-CPU host), and the scheduler flush timed."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_sidecar  # noqa: E402

pytestmark = pytest.mark.root


def test_a_per_cpu_maps_values_count_for_every_possible_cpu_and_a_plain_maps_do_not():
    from bcc import BPF

    cpus = bench_sidecar.possible_cpus()
    before = bench_sidecar.kernel_memory(os.getpid())
    bpf = BPF(text=b"BPF_PERCPU_HASH(per_cpu, u32, u64, 65536);\n"
                   b"BPF_HASH(shared, u32, u64, 65536);\n")
    try:
        after = bench_sidecar.kernel_memory(os.getpid())
    finally:
        bpf.cleanup()
    held = (after["bpf_kernel_mb"] - before["bpf_kernel_mb"]) * bench_sidecar.MB
    assert held >= 65536 * 8 * (cpus + 1)                 # both maps' values, at least
    grown = (after["bpf_kernel_mb_big_host"] - after["bpf_kernel_mb"]) - \
        (before["bpf_kernel_mb_big_host"] - before["bpf_kernel_mb"])
    assert grown * bench_sidecar.MB == pytest.approx(65536 * 8 * (224 - cpus))  # per-CPU only



def test_the_scheduler_flush_is_timed_over_every_thread_of_its_processes():
    """bench_sidecar.thread_flush: real processes of several threads, each watched, one
    event a process a flush."""
    result = bench_sidecar.thread_flush(processes=2, threads=5, flushes=4, every=0.05, busy=1)
    assert result["watched_threads"] == 10 and result["busy"] == 1
    assert result["events"] == 2 * 4
    assert result["ms_a_flush"] > 0 and result["us_a_thread"] == \
        pytest.approx(result["ms_a_flush"] * 1000 / 10)
