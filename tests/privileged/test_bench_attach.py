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
