"""The attachment-floor benchmark loads each variant for real and says why a kernel refuses."""

from __future__ import annotations

import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import bench_attach  # noqa: E402
import bench_probes  # noqa: E402


def test_every_attachment_is_measured_or_refused_with_a_reason() -> None:
    stats_before = bench_probes.STATS_SYSCTL.read_text()
    results = bench_attach.run(repeat=1, n_calls=20_000)
    assert bench_probes.STATS_SYSCTL.read_text() == stats_before      # restored
    assert results["baseline"]["ioctl"] > 0 and results["baseline"]["getppid"] > 0
    assert set(bench_attach.VARIANTS) <= results.keys()
    # syscall and raw tracepoints exist on every kernel gpuwhy targets
    for variant in ("tp_pair", "tp_enter", "raw_pair", "raw_enter"):
        figures = results[variant]
        assert "refused" not in figures, figures
        assert math.isfinite(figures["ioctl"]) and math.isfinite(figures["getppid"])
        assert len(figures["runs"]["ioctl"]) == 1
    for variant in ("kprobe", "fentry"):
        figures = results[variant]
        assert ("refused" in figures and figures["refused"]) or "ioctl" in figures, figures
    table = bench_attach.table(results)
    assert "(fdtrack's)" in table and table.count("\n") == 2 + len(bench_attach.VARIANTS)


def test_the_p2_floor_attaches_where_the_probes_attach() -> None:
    """The floor's tracepoints are read from the probes' own sources: the scheduler's and
    the syscalls' are there, each exists on this kernel, and all of them load and attach."""
    found = bench_attach.probe_tracepoints()
    assert {("sched", "sched_switch"), ("sched", "sched_wakeup"),
            ("syscalls", "sys_enter_ioctl"), ("syscalls", "sys_exit_ioctl"),
            ("raw", "task_newtask")} <= set(found)
    assert len(found) == len(set(found))
    for category, event in found:
        pattern = f"*/{event}" if category == "raw" else f"{category}/{event}"
        assert any((bench_attach.TRACEFS / "events").glob(pattern)), (category, event)
    floor = bench_attach.attach_probes_floor()
    try:
        assert len(floor.tracepoint_fds) + len(floor.raw_tracepoint_fds) == len(found)
    finally:
        floor.cleanup()


def test_the_ping_pongs_are_measured_beside_their_floor() -> None:
    results = bench_probes.run(repeat=1, n_ioctl=5_000, n_pingpong=5_000)
    for name in bench_probes.PINGPONGS:
        figures = results[name]
        assert all(figures[setup] > 0 for setup in ("none", "probes", "floor")), figures
        assert len(figures["floor_runs"]) == 1
    assert "floor" not in results["tracked ioctl"]
    table = bench_probes.table(results)
    assert table.count("× it)") == len(bench_probes.PINGPONGS)
