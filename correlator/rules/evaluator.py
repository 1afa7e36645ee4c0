"""Evaluate rule expressions over a Signals source, in three-valued logic.

Values are floats, bools, strings or None (unknown). An aggregate over a series with no
samples, or with samples covering less than half of its window, is unknown and names the
signal in ``missing``; comparisons with unknown are unknown; ``and`` is False as soon as one
side is False, ``or`` True as soon as one side is True. A rule whose condition is unknown
is "not evaluable", never "ok".
"""

from __future__ import annotations

import math
import operator
import statistics
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import is_dataclass
from typing import Any, cast

from gpuwhy.correlator.rules.signal_series import Series
from gpuwhy.correlator.rules.signals import MAX_TEXT, ProcessFacts, Scope, Signals
from gpuwhy.gpufields import THROTTLE_BITS
from gpuwhy.rules import model as m
from gpuwhy.rules.model import children
from gpuwhy.rules.vocabulary import STREAMS
from gpuwhy.stats import increase, percentile

Value = float | bool | str | None
MIN_COVERAGE = 0.5
ASOF_TOLERANCE_NS = 5 * 10**9
SCALAR_ONLY = ("mean", "min", "max", "stddev", "last", "rate", "delta", "frac", "corr",
               "zscore", "count", "within")
CORR_MIN_PAIRS = 10    # fewer samples in the window: no correlation to speak of


def truth(value: Value) -> bool | None:
    if value is None:
        return None
    if isinstance(value, str):
        return bool(value)
    return bool(value)


def _num(value: Value) -> float | None:
    if value is None or isinstance(value, str):
        return None
    return float(value)


def _is_aggregate(node: m.Call) -> bool:
    return node.func in SCALAR_ONLY and len(node.args) >= 2 and isinstance(
        node.args[-1], m.Dur) or (node.func[:1] == "p" and node.func[1:].isdigit())


class Evaluation:
    """One rule instance at one instant: ``value(node)``; ``missing`` says what was unknown."""

    def __init__(self, signals: Signals, scope: Scope, now: int, params: Mapping[str, float],
                 window_ns: int, facts: ProcessFacts | None = None,
                 instance: Mapping[str, float] | None = None, shared: dict | None = None):
        self.signals, self.scope, self.now = signals, scope, now
        # Aggregates are shared by every rule evaluated on the same GPU/process this round,
        # keyed by their structure (parameters by value): ``shared`` is the round's cache.
        self.shared = {} if shared is None else shared
        self._keys = self.shared.setdefault("structure keys", {})
        self.params, self.window_ns = params, window_ns
        self.process_facts = facts
        self.instance = instance or {}
        self.missing: set[str] = set()
        self.min_coverage = MIN_COVERAGE   # evidence lowers it to 0: report what there is
        self._series: dict[tuple[str, int], Series] = {}

    # Series access, cached per evaluation.
    def series(self, name: str, window_ns: int) -> Series:
        key = (name, window_ns)
        if key not in self._series:
            self._series[key] = self.signals.series(self.scope, name, self.now - window_ns,
                                                    self.now)
        return self._series[key]

    def _covered(self, name: str, series: Series, window_ns: int) -> bool:
        if not series:
            self.missing.add(name)
            return False
        if series[0][0] - (self.now - window_ns) > (1 - self.min_coverage) * window_ns and \
                window_ns > ASOF_TOLERANCE_NS:
            self.missing.add(f"{name} (warming up)")
            return False
        return True

    # Per-sample evaluation of an expression over a window.
    def _refs(self, node: m.Node, out: list[str]) -> list[str]:
        if isinstance(node, m.Ref) and node.kind == "signal":
            if node.name not in out:
                out.append(node.name)
        elif isinstance(node, m.Call) and _is_aggregate(node):
            pass   # a nested aggregate is one value, not a per-sample series
        else:
            for child in children(node):
                self._refs(child, out)
        return out

    def samples(self, node: m.Node, window_ns: int) -> Sequence[tuple[int, Value]] | None:
        if isinstance(node, m.Ref) and node.kind == "signal":   # the common case: one series
            series = self.series(node.name, window_ns)
            return series if self._covered(node.name, series, window_ns) else None
        names = self._refs(node, [])
        if not names:
            return [(self.now, self.value(node))]
        aligned = self._aligned(names, window_ns)
        if aligned is None:
            return None
        times, columns = aligned
        values = self._vector(node, columns)
        if not isinstance(values, list):
            values = [values] * len(times)
        return list(zip(times, values, strict=True))

    def _aligned(self, names: list[str], window_ns: int
                 ) -> tuple[array, dict[str, list]] | None:
        """The signals' samples on one timeline (the longest series'), or None when one of
        them does not cover the window (it is noted as missing)."""
        data = {name: self.series(name, window_ns) for name in names}
        for name in names:
            if not self._covered(name, data[name], window_ns):
                return None
        times = max(data.values(), key=len).times
        return times, {name: _align(series, times) for name, series in data.items()}

    def _vector(self, node: m.Node, columns: Mapping[str, list]) -> object:
        """``node`` over aligned columns, one operation per node (not per sample and node):
        a list, or a single value when the node does not depend on the samples."""
        v = lambda n: self._vector(n, columns)   # noqa: E731
        if isinstance(node, m.Ref) and node.kind == "signal":
            return columns[node.name]
        if isinstance(node, m.Unary):
            return _lift(_negate, v(node.operand))
        if isinstance(node, m.Bin):
            return _lift(lambda a, b: _arith(node.op, a, b), v(node.left), v(node.right))
        if isinstance(node, m.Cmp):
            left, right = v(node.left), v(node.right)
            if isinstance(left, list) and isinstance(right, float):   # the usual shape
                compare = _OPERATORS[node.op]
                return [None if x is None else compare(x, right) for x in left]
            return _lift(lambda a, b: _compare(node.op, a, b), left, right)
        if isinstance(node, m.Between):
            return _lift(_between, v(node.term), v(node.low), v(node.high))
        if isinstance(node, m.BoolOp):
            return _lift(lambda *items: _logic(node.op, items), *(v(i) for i in node.items))
        if isinstance(node, m.Not):
            return _lift(_negation, v(node.item))
        if isinstance(node, m.Call) and node.func == "bit":
            mask = THROTTLE_BITS[cast(m.Ref, node.args[1]).name]
            return _lift(lambda x: _bit(x, mask), v(node.args[0]))
        if isinstance(node, m.Call) and node.func in ("coalesce", "abs") or \
                isinstance(node, m.Call) and node.func in ("min", "max") and \
                not isinstance(node.args[-1], m.Dur):
            return _lift(lambda *xs: _scalar(node.func, xs), *(v(a) for a in node.args))
        return self.value(node)   # a constant for this window: nested aggregate, fact, ...

    # The value of a node.
    def value(self, node: m.Node, env: Mapping[str, Any] | None = None) -> Value:
        """``env``: an event's row, inside a stream's ``where`` (its fields, which are values,
        and its bookkeeping, ``_process``...)."""
        if isinstance(node, m.Num):
            return node.value
        if isinstance(node, m.Str):
            return node.value
        if isinstance(node, m.Ref):
            return self._ref(node, env)
        if isinstance(node, m.Unary):
            return _negate(self.value(node.operand, env))
        if isinstance(node, m.Bin):
            return _arith(node.op, self.value(node.left, env), self.value(node.right, env))
        if isinstance(node, m.Cmp):
            return _compare(node.op, self.value(node.left, env), self.value(node.right, env))
        if isinstance(node, m.Between):
            return _between(*(self.value(n, env) for n in (node.term, node.low, node.high)))
        if isinstance(node, m.Match):
            text = self.value(node.term, env)
            if text is None:
                return None
            return node.regex.search(str(text)[:MAX_TEXT]) is not None
        if isinstance(node, m.BoolOp):
            # Kleene logic decides at the first false item of an 'and' (true of an 'or'),
            # whatever the others are: they are not computed
            decisive, unknown = node.op == "or", False
            for item in node.items:
                verdict = truth(self.value(item, env))
                if verdict is decisive:
                    return decisive
                unknown = unknown or verdict is None
            return None if unknown else not decisive
        if isinstance(node, m.Not):
            return _negation(self.value(node.item, env))
        if isinstance(node, m.Call):
            if env is not None or not (_is_aggregate(node) or node.func in ("count", "within")):
                return self._call(node, env)
            memo = (id(node), id(self.params))   # both live through the round
            structure = self._keys.get(memo)
            if structure is None:
                structure = self._keys[memo] = self._key(node)
            # a count over host-wide events that does not ask which process is the scope's
            # is the same for every GPU of the round: computed once
            key = (None if _host_wide(node) else self.scope, self.min_coverage, structure)
            if key not in self.shared:
                missing_before = set(self.missing)
                value = self._call(node, env)
                self.shared[key] = (value, self.missing - missing_before)
            value, missing = self.shared[key]
            self.missing |= missing
            return value
        raise TypeError(f"cannot evaluate {node!r}")

    def _key(self, node: object) -> object:
        """A node's structure without positions; parameters by value."""
        if isinstance(node, m.Ref):
            return ("p", self.params[node.name]) if node.kind == "param" else node.name
        if isinstance(node, (m.Num, m.Str)):
            return node.value
        if isinstance(node, m.Dur):
            return ("d", node.ns)
        if isinstance(node, m.Match):
            return ("~", self._key(node.term), node.pattern)
        if isinstance(node, m.Node) and is_dataclass(node):   # every kind of node is one
            return (type(node).__name__, *(self._key(getattr(node, f)) for f in
                                          node.__dataclass_fields__ if f not in
                                          ("line", "column")))
        if isinstance(node, tuple):
            return tuple(self._key(item) for item in node)
        return node

    def _ref(self, node: m.Ref, env: Mapping[str, Any] | None) -> Value:
        if env is not None and node.name in env:
            return env[node.name]   # a per-sample value or an event field
        kind = node.kind
        if kind == "signal":
            series = self.series(node.name, self.window_ns)
            if not series:
                self.missing.add(node.name)
                return None
            return series[-1][1]
        if kind == "param":
            return self.params[node.name]
        if kind == "fact":
            value = self.signals.fact(self.scope, node.name)
            if value is None:
                self.missing.add(node.name)
            return value
        if kind == "instance":
            value = self.instance.get(node.name)
            if value is None:
                self.missing.add(node.name)
            return value
        if kind == "text":
            if self.process_facts is None:
                self.missing.add(node.name)
                return None
            return self.process_facts.text(node.name)
        if kind == "field":
            return None
        raise TypeError(f"unresolved name {node.name!r}")

    def _call(self, node: m.Call, env: Mapping[str, Any] | None) -> Value:
        # The parser's checker (gpuwhy/rules/parser.py) fixed what each function's arguments
        # are: a window is a Dur, a stream a StreamRef, bit()'s name and the series of rate()
        # and delta() a Ref, env()'s name a Str.
        f, args = node.func, node.args
        if f in ("coalesce", "abs") or f in ("min", "max") and not isinstance(args[-1], m.Dur):
            return _scalar(f, [self.value(a, env) for a in args])
        if f == "bit":
            v = _num(self.value(args[0], env))
            return _bit(v, THROTTLE_BITS[cast(m.Ref, args[1]).name])
        if f == "env":
            variable = cast(m.Str, args[0]).value
            if self.process_facts is None or self.process_facts.env is None:
                self.missing.add(f'env("{variable}")')
                return None
            return self.process_facts.env.get(variable, "")
        if f == "count":
            return float(len(self._events(cast(m.StreamRef, args[0]), cast(m.Dur, args[1]).ns)))
        if f == "within":
            return self._within(cast(m.StreamRef, args[0]), cast(m.StreamRef, args[1]),
                                cast(m.Dur, args[2]).ns)
        if f == "corr":
            return self._corr(args[0], args[1], cast(m.Dur, args[2]).ns)
        window = cast(m.Dur, args[1]).ns
        if f == "last" and isinstance(args[0], m.Ref) and args[0].kind == "signal":
            # The latest value needs no history (no coverage): a state (a flag, a link's
            # width, the fabric's state) is known from its first sample.
            series = self.series(args[0].name, window)
            if not series:
                self.missing.add(args[0].name)
                return None
            return series[-1][1]
        if f == "frac":
            samples = self.samples(args[0], window)
            if samples is None:
                return None
            known = [t for _, v in samples if (t := truth(v)) is not None]
            return None if not known else sum(known) / len(known)
        if f == "zscore":
            return self._zscore(args[0], window, cast(m.Dur, node.kwarg("baseline")).ns)
        if f in ("rate", "delta"):
            name = cast(m.Ref, args[0]).name
            series = self.series(name, window)
            if not self._covered(name, series, window) or len(series) < 2:
                self.missing.add(name)
                return None
            grown = increase(series)
            if f == "delta":
                return grown
            span = (series[-1][0] - series[0][0]) / 1e9
            return None if span <= 0 else grown / span
        samples = self.samples(args[0], window)
        if samples is None:
            return None
        if isinstance(samples, Series):   # a signal's own samples: floats, never None
            values = samples.values.tolist()
        elif isinstance(args[0], m.Ref):
            values = [v for _, v in samples]
        else:
            values = [float(v) for _, v in samples if v is not None and not isinstance(v, str)]
        if not values:
            return None
        if f == "mean":
            return sum(values) / len(values)
        if f == "min":
            return min(values)
        if f == "max":
            return max(values)
        if f == "last":
            return values[-1]
        if f == "stddev":
            mean = sum(values) / len(values)
            return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        return percentile(values, float(f[1:]))

    def _corr(self, a: m.Node, b: m.Node, window: int) -> Value:
        """Pearson's correlation of two per-sample expressions over the window, on the samples
        where both are known; unknown with fewer than CORR_MIN_PAIRS or a flat one."""
        names = self._refs(b, self._refs(a, []))     # one timeline for both sides
        aligned = self._aligned(names, window) if names else None
        if aligned is None:
            return None
        _, columns = aligned
        xs, ys = self._vector(a, columns), self._vector(b, columns)
        if not isinstance(xs, list) or not isinstance(ys, list):
            return None
        pairs = [(float(x), float(y)) for x, y in zip(xs, ys, strict=True)
                 if _num(x) is not None and _num(y) is not None]
        if len(pairs) < CORR_MIN_PAIRS:
            return None
        try:
            return statistics.correlation(*zip(*pairs, strict=True))
        except statistics.StatisticsError:   # a flat series: no correlation to speak of
            return None

    def _zscore(self, node: m.Node, window: int, baseline: int) -> Value:
        samples = self.samples(node, baseline)
        if samples is None:
            return None
        cut = self.now - window
        base = [x for ts, v in samples if ts < cut and (x := _num(v)) is not None]
        recent = [x for ts, v in samples if ts >= cut and (x := _num(v)) is not None]
        if len(base) < 3 or not recent:
            self.missing.add("zscore baseline")
            return None
        mean = sum(base) / len(base)
        sd = math.sqrt(sum((v - mean) ** 2 for v in base) / len(base))
        return (sum(recent) / len(recent) - mean) / max(sd, 1e-6)

    def _events(self, stream: m.StreamRef, window: int, start: int | None = None
                ) -> list[tuple[int, dict]]:
        start = self.now - window if start is None else start
        rows = self.signals.events(self.scope, stream.name, start, self.now)
        if stream.where is None:
            return rows
        return [(ts, row) for ts, row in rows if truth(self.value(stream.where, row))]

    def _within(self, a: m.StreamRef, b: m.StreamRef, tolerance: int) -> bool:
        firsts = self._events(a, self.window_ns)
        if not firsts:
            return False
        seconds = [ts for ts, _ in self._events(b, 0, self.now - self.window_ns - tolerance)]
        return any(abs(ta - tb) <= tolerance for ta, _ in firsts for tb in seconds)


def _align(series: Series, times: array) -> list:
    """Values of ``series`` at ``times``: the latest sample at or before each, within
    ASOF_TOLERANCE_NS, else None (one merge pass; none when they share the timeline, as a
    GPU's fields do)."""
    if series.times == times:
        return series.values.tolist()
    own, values = series.times.tolist(), series.values
    out, i, n = [], -1, len(own)
    for ts in times:
        while i + 1 < n and own[i + 1] <= ts:
            i += 1
        out.append(values[i] if i >= 0 and ts - own[i] <= ASOF_TOLERANCE_NS else None)
    return out


def _lift(fn, *args: object) -> object:  # noqa: ANN001
    """Apply ``fn`` element-wise where some arguments are lists (columns)."""
    lists = [a for a in args if isinstance(a, list)]
    if not lists:
        return fn(*args)
    rows = zip(*(a if isinstance(a, list) else [a] * len(lists[0]) for a in args),
               strict=True)
    return [fn(*row) for row in rows]


def _negate(value: Value) -> Value:
    v = _num(value)
    return None if v is None else -v


def _arith(op: str, a: Value, b: Value) -> Value:
    a, b = _num(a), _num(b)
    if a is None or b is None:
        return None
    result: float | None
    if op == "+":
        result = a + b
    elif op == "-":
        result = a - b
    elif op == "*":
        result = a * b
    else:
        result = None if b == 0 else a / b
    # An overflow (inf, or nan from inf - inf) is unknown like a division by 0: an infinity
    # would only turn into an exception further on (int() in bit(), rounding evidence).
    return result if result is None or math.isfinite(result) else None


def _bit(value: Value, mask: int) -> bool | None:
    v = _num(value)
    return None if v is None or not math.isfinite(v) else bool(int(v) & mask)


def _between(value: Value, low: Value, high: Value) -> bool | None:
    v, lo, hi = _num(value), _num(low), _num(high)
    return None if v is None or lo is None or hi is None else lo <= v <= hi


def _logic(op: str, items: list | tuple) -> bool | None:
    values = [truth(item) for item in items]
    decisive = op == "or"
    if decisive in values:
        return decisive
    return None if None in values else not decisive


def _negation(value: Value) -> bool | None:
    v = truth(value)
    return None if v is None else not v


def _scalar(func: str, values: list | tuple) -> Value:
    if func == "coalesce":
        return next((v for v in values if v is not None), None)
    numbers = [n for v in values if (n := _num(v)) is not None]
    if len(numbers) < len(values):
        return None
    if func == "abs":
        return abs(numbers[0])
    return min(numbers) if func == "min" else max(numbers)


_OPERATORS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
              "==": operator.eq, "!=": operator.ne}


def _compare(op: str, a: Value, b: Value) -> bool | None:
    if a is None or b is None:
        return None
    if isinstance(a, str) or isinstance(b, str):
        if op == "==":
            return str(a) == str(b)
        if op == "!=":
            return str(a) != str(b)
        return None
    a, b = float(a), float(b)
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b,
            "!=": a != b}[op]


def _host_wide(node: m.Call) -> bool:
    """``count(stream where ...)`` over a stream of the whole host (``scope: host``) whose
    filter reads no ``own``: its value does not depend on the GPU or process evaluated."""
    if node.func != "count":
        return False
    stream = next((a for a in node.args if isinstance(a, m.StreamRef)), None)
    if stream is None or STREAMS[stream.name].scope != "host":
        return False
    pending = [stream.where] if stream.where is not None else []
    while pending:
        item = pending.pop()
        if isinstance(item, m.Ref) and item.name == "own":
            return False
        pending.extend(children(item))
    return True
