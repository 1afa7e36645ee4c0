"""Expectations of `gpuwhy check`: rules-DSL expressions evaluated once over the watch window.

``mean(sm_active) >= 0.6``, ``p95(copy_util) <= 0.8``, ``count(xid) == 0``: an aggregate
without a window covers the whole watch; a short name stands for its vocabulary name
(``sm_active`` -> ``gpu.sm_active``); ``xid`` is the Xids of the kernel log and of the GPU
source (the larger count: both report the same Xid on a real host).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

from gpuwhy.correlator.rules.evaluator import Evaluation, truth
from gpuwhy.correlator.rules.signals import Scope, Signals
from gpuwhy.rules import model as m
from gpuwhy.rules.expression import parse_expression
from gpuwhy.rules.parser import AGGREGATES
from gpuwhy.rules.vocabulary import SIGNALS, STREAMS

# Short names that are not simply the signal's name without ``gpu.``.
ALIASES = {
    "copy_util": "gpu.mem_copy_util", "mem_util": "gpu.mem_copy_util",
    "gpu_util": "gpu.util", "gr_active": "gpu.gr_active", "tensor_active": "gpu.tensor",
    "dram_active": "gpu.dram", "power": "gpu.power_w", "temp": "gpu.temp_c",
    "sm_occupancy": "gpu.sm_occ", "fb_used": "gpu.fb_used", "cpu_cores": "proc.cpu_cores",
    "ioctls": "proc.ioctl.total",
}
XID_STREAMS = ("journal.xid", "gpu.xid")
WINDOWED = (*AGGREGATES, "frac", "count")
PLACEHOLDER_WINDOW_NS = 60 * 10**9


def canonical(name: str) -> str:
    """The vocabulary name a short name stands for (the name itself when it is one)."""
    if name in SIGNALS or name in STREAMS:
        return name
    if name in ALIASES:
        return ALIASES[name]
    for prefix in ("gpu.", "proc.", "cuda."):
        if prefix + name in SIGNALS:
            return prefix + name
    return name


def _is_windowless(call: m.Call) -> bool:
    percentile = call.func[:1] == "p" and call.func[1:].isdigit() and len(call.func) == 3
    return (call.func in WINDOWED or percentile) and len(call.args) == 1 and not call.kwargs


def _stream(node: m.Node) -> m.Node:
    if isinstance(node, m.Ref):
        return dataclasses.replace(node, name=canonical(node.name))
    if isinstance(node, m.StreamRef):
        return dataclasses.replace(node, name=canonical(node.name))
    return node


def _rewrite(node: object, window_ns: int) -> object:
    if isinstance(node, tuple):
        return tuple(_rewrite(item, window_ns) for item in node)
    if isinstance(node, m.Ref):
        return dataclasses.replace(node, name=canonical(node.name))
    if isinstance(node, m.Call) and node.func == "count" and node.args:
        stream: Any = node.args[0]      # a stream reference, or what the checks refuse
        name = getattr(stream, "name", "")
        window = node.args[1:] if len(node.args) > 1 else (m.Dur(window_ns),)
        if name == "xid":   # both Xid streams: the larger count
            counts = tuple(m.Call("count", (dataclasses.replace(stream, name=s), *window),
                                  (), node.line, node.column) for s in XID_STREAMS)
            return m.Call("max", counts, (), node.line, node.column)
        return m.Call("count", (_stream(stream), *window), (), node.line, node.column)
    if isinstance(node, m.StreamRef):   # keeps its event fields: only the stream is renamed
        return _stream(node)
    if isinstance(node, m.Node) and dataclasses.is_dataclass(node):
        changes = {f.name: _rewrite(getattr(node, f.name), window_ns)
                   for f in dataclasses.fields(node) if f.name not in ("line", "column")}
        node = dataclasses.replace(node, **changes)
        if isinstance(node, m.Call) and _is_windowless(node):
            node = dataclasses.replace(node, args=(*node.args, m.Dur(window_ns)))
        return node
    return node


def parse(text: str, window_ns: int = PLACEHOLDER_WINDOW_NS) -> m.Node:
    """The checked expression; raises RuleSyntaxError with the column of the problem."""
    return parse_expression(text, rewrite=lambda node: cast(m.Node, _rewrite(node, window_ns)),
                            path="--expect")


@dataclass(frozen=True)
class Result:
    expectation: str
    observed: float | bool | str | None
    passed: bool | None         # None: not evaluable (no data)
    missing: tuple[str, ...] = ()

    @property
    def outcome(self) -> str:
        return {True: "pass", False: "FAIL", None: "no data"}[self.passed]

    def as_dict(self) -> dict:
        return {"expectation": self.expectation, "observed": self.observed,
                "result": self.outcome.lower(), "missing": list(self.missing)}


def evaluate(texts: list[str], signals: Signals, scope: Scope, start: int,
             end: int) -> list[Result]:
    """Each expectation over ``[start, end]``; the observed value is the left side of a
    comparison (the term of ``x in [a, b]``), else the expression's own value."""
    window = max(end - start, 1)
    signals.begin(end)
    facts = signals.facts(scope.process) if scope.process is not None else None
    results = []
    for text in texts:
        node = parse(text, window)
        ev = Evaluation(signals, scope, end, {}, window, facts=facts)
        ev.min_coverage = 0.5
        verdict = truth(ev.value(node))
        shown = node.left if isinstance(node, m.Cmp) else \
            node.term if isinstance(node, m.Between) else node
        observed = ev.value(shown)
        if isinstance(observed, float):
            observed = round(observed, 6)
        results.append(Result(text, observed, verdict, tuple(sorted(ev.missing))))
    return results
