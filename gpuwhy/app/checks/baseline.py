"""Baselines: the figures of a known-good run, kept by name, and how a new run compares.

A run's figures are the p5/p50/p95 (and mean) of every GPU engine metric and every
process-side share (on-CPU, run queue, sleep, blocked, for the process and its workers),
and the rate of each class of driver calls, read through the rules' signals. Whether a move
is bad depends on the metric: :data:`GOOD_DIRECTION` says, in one table.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.correlator.rules.signals import Scope, Signals
from gpuwhy.rules.vocabulary import SIGNALS
from gpuwhy.stats import increase, percentile
from gpuwhy.store.baselines import delete as delete
from gpuwhy.store.baselines import listing as listing
from gpuwhy.store.baselines import load as load
from gpuwhy.store.baselines import save as save

# Keeping baselines in the store (save, load, listing, delete) is gpuwhy.store.baselines':
# imported above under the names `gpuwhy checks baseline` calls.

STATS = ("p5", "p50", "p95", "mean")
# GPU signals that are not engine metrics (a bitmask, a state, a constant).
NOT_FIGURES = {"gpu.reason", "gpu.pstate", "gpu.fb_total", "gpu.plim_w", "gpu.clk_mem",
               "gpu.pcie_gen_max", "gpu.pcie_width_max", "gpu.fabric_state",
               "gpu.fabric_health"}
# "up": higher is better; "down": lower is better; absent: shown, never flagged.
GOOD_DIRECTION = {
    "gpu.util": "up", "gpu.busy": "up", "gpu.gr_active": "up", "gpu.sm_active": "up",
    "gpu.sm_occ": "up", "gpu.tensor": "up", "gpu.dram": "up", "gpu.fp16": "up",
    "gpu.fp32": "up", "gpu.fp64": "up", "gpu.clk_sm": "up",
    "gpu.temp_c": "down", "gpu.mem_temp_c": "down",
    "proc.sleep_frac": "down", "proc.blocked_frac": "down", "proc.runq_frac": "down",
    "workers.blocked_frac": "down", "workers.runq_frac": "down",
    "proc.ioctl.total/s": "up", "proc.ioctl.rm_control/s": "up",
    "proc.ioctl.errors/s": "down", "proc.ioctl.rm_alloc/s": "down",
    "proc.ioctl.rm_free/s": "down", "proc.ioctl.rm_map/s": "down",
    "proc.ioctl.uvm_migrate/s": "down",
}
# Below this the relative change of a figure is measured against the floor, not the
# value: a share going from 0.001 to 0.004 is no 300 % regression.
FLOOR = {"ratio": 0.05, "cores": 0.05}


def figure_names() -> list[str]:
    gauges = [s.name for s in SIGNALS.values() if s.source in ("gpu", "sched")
              and not s.counter and s.name not in NOT_FIGURES]
    return gauges + [f"{s.name}/s" for s in SIGNALS.values() if s.source == "calls"]


def unit(figure: str) -> str:
    if figure.endswith("/s"):
        return "calls/s"
    return SIGNALS[figure].unit


def capture(signals: Signals, scope: Scope, start: int, end: int) -> dict[str, dict]:
    """``{figure: {p5, p50, p95, mean, n}}`` (rates: ``{"value": calls/s}``) of the window;
    figures with no samples are left out."""
    figures: dict[str, dict] = {}
    for name in figure_names():
        if name.endswith("/s"):
            series = signals.series(scope, name[:-2], start, end)
            span = (series[-1][0] - series[0][0]) / NS_PER_SECOND if len(series) > 1 else 0
            if span > 0:
                figures[name] = {"value": round(increase(series) / span, 4), "n": len(series)}
            continue
        values = [v for _, v in signals.series(scope, name, start, end)]
        if values:
            figures[name] = {"p5": percentile(values, 5), "p50": percentile(values, 50),
                             "p95": percentile(values, 95),
                             "mean": round(sum(values) / len(values), 6), "n": len(values)}
    return figures


@dataclass(frozen=True)
class Change:
    figure: str
    stat: str
    before: float
    after: float | None
    change: float | None        # relative, signed; None when the figure is gone
    direction: str | None
    flagged: bool

    def as_dict(self) -> dict:
        return {"figure": self.figure, "stat": self.stat, "before": self.before,
                "after": self.after, "change": self.change, "good": self.direction,
                "flagged": self.flagged}


def compare(before: dict[str, dict], after: dict[str, dict], threshold: float) -> list[Change]:
    """Every figure of ``before`` against ``after``; flagged when it moved more than
    ``threshold`` (relative) in its bad direction."""
    changes = []
    for figure, stats in before.items():
        direction = GOOD_DIRECTION.get(figure)
        floor = FLOOR.get(unit(figure), 1e-9)
        for stat, old in stats.items():
            if stat == "n":
                continue
            new = after.get(figure, {}).get(stat)
            if new is None:
                changes.append(Change(figure, stat, old, None, None, direction, False))
                continue
            change = (new - old) / max(abs(old), floor)
            bad = (direction == "up" and change < -threshold) or \
                (direction == "down" and change > threshold)
            changes.append(Change(figure, stat, old, new, round(change, 4), direction, bad))
    return changes

