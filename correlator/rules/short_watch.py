"""The rules fitted to a short watch, evaluated over what it stored, and how sure each answer is.

A rule reads minutes: its window, the windows of its functions (``count(x, 5m)``), a warm-up
for a young process, a hold (``for``) before it fires. A watch of 30 s (`gpuwhy why
--duration 30`, a container without the service) has none of that; unfitted, every rule
would wait and say nothing. Fitted, each window is cut to what was watched, a warm-up to half
of it, and the hold is dropped: the rules evaluate once, at the watch's end, over the whole
watch, and each finding carries how much of what its rule reads in time (its longest window,
or its window and its hold together) the watch covered. An answer from a 30 s look at a rule
that reads three minutes is "possibly" (17 %), not a verdict. Thresholds are never changed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import overload

from sqlite_utils import Database

from gpuwhy.correlator.rules.engine import Engine
from gpuwhy.correlator.rules.storesignals import StoreSignals
from gpuwhy.events import RuleFinding
from gpuwhy.rules import model as m


@overload
def _fit_node(node: m.Node, cap: int) -> m.Node: ...
@overload
def _fit_node(node: None, cap: int) -> None: ...
def _fit_node(node: m.Node | None, cap: int) -> m.Node | None:
    """``node`` with every window a function reads (a duration argument) cut to ``cap``."""
    if node is None or not dataclasses.is_dataclass(node):
        return node
    changes: dict[str, object] = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if isinstance(node, m.Call) and f.name == "args":
            changes["args"] = tuple(
                dataclasses.replace(a, ns=min(a.ns, cap)) if isinstance(a, m.Dur)
                else _fit_node(a, cap) for a in value)
        elif isinstance(value, m.Node):
            changes[f.name] = _fit_node(value, cap)
        elif isinstance(value, tuple) and value and all(isinstance(v, m.Node) for v in value):
            changes[f.name] = tuple(_fit_node(v, cap) for v in value)
        elif isinstance(node, m.Call) and f.name == "kwargs":
            changes["kwargs"] = tuple((k, _fit_node(v, cap)) for k, v in value)
    return dataclasses.replace(node, **changes) if changes else node


def longest_window(rule: m.Rule) -> int:
    """The longest span the rule reads (ns): any function's window, or its own window and its
    hold together (what must have held before it fires)."""
    longest = rule.window_ns + rule.for_ns

    def walk(node: m.Node | None) -> None:
        nonlocal longest
        if node is None:
            return
        if isinstance(node, m.Call):
            for a in node.args:
                if isinstance(a, m.Dur):
                    longest = max(longest, a.ns)
                else:
                    walk(a)
            for _, v in node.kwargs:
                walk(v)
            return
        for child in m.children(node):
            walk(child)

    for node in (rule.when, rule.clear, *rule.guards, *(e for e, _ in rule.escalations),
                 *(n for _, n in rule.evidence)):
        walk(node)
    return longest


def fit_rules(rules: list[m.Rule], watched_ns: int) -> list[m.Rule]:
    """The rules as a watch of ``watched_ns`` can evaluate them (see the module's text)."""
    fitted = []
    for rule in rules:
        fit = (lambda n: _fit_node(n, watched_ns))  # noqa: E731 - one cap for every clause
        fitted.append(dataclasses.replace(
            rule, window_ns=min(rule.window_ns, watched_ns),
            warmup_ns=min(rule.warmup_ns, watched_ns // 2),
            for_ns=0,
            every_ns=None if rule.every_ns is None else min(rule.every_ns, watched_ns),
            clear_after_ns=None if rule.clear_after_ns is None else
            min(rule.clear_after_ns, watched_ns),
            when=fit(rule.when), clear=fit(rule.clear),
            guards=tuple(fit(g) for g in rule.guards),
            escalations=tuple((fit(e), s) for e, s in rule.escalations),
            evidence=tuple((name, fit(n)) for name, n in rule.evidence),
            fixes=tuple(dataclasses.replace(f, condition=fit(f.condition)) for f in rule.fixes)))
    return fitted


def sureness(rule: m.Rule | None, watched_ns: int) -> float:
    """How much of what the rule reads the watch covered, 0-1 (1 for an unknown rule:
    nothing to scale)."""
    if rule is None:
        return 1.0
    return max(0.0, min(1.0, watched_ns / max(1, longest_window(rule))))


def evaluate_watch(db: Database, rules: list[m.Rule], start_ns: int,
                   end_ns: int) -> list[RuleFinding]:
    """The findings of ``rules``, fitted to ``[start_ns, end_ns]``, over the watch's store
    ``db``: one evaluation at ``end_ns`` that reads the whole watch."""
    watched = max(1, end_ns - start_ns)
    fitted = fit_rules(rules, watched)
    signals = StoreSignals(db)
    return list(Engine(fitted, signals, interval_ns=watched).evaluate(end_ns))


def sureness_by_rule(rules: Mapping[str, m.Rule], watched_ns: int) -> dict[str, float]:
    """:func:`sureness` of every rule, by id."""
    return {rule_id: sureness(rule, watched_ns) for rule_id, rule in rules.items()}
