"""Parse rule files (a lark LALR grammar) into checked :class:`Rule` objects.

Nothing in a rule is ever executed as code: the grammar yields a tree of the nodes in
:mod:`gpuwhy.rules.model`, every name is resolved against the vocabulary here,
and regexes are RE2 (linear time). Every error names the file, line and column, and what
was expected there. Input is bounded (size, tokens, nesting, numbers, durations: the MAX_*
below) before it can cost time, memory or recursion, and a broken rule costs only itself:
:func:`parse_rules_report` parses each ``rule NAME {`` block on its own.
"""

from __future__ import annotations

import bisect
import contextlib
import difflib
import math
import re
from collections.abc import Iterable, Iterator
from fractions import Fraction
from functools import cache
from typing import Any, cast

import lark
import re2
from lark import Token, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, VisitError
from lark.parsers.lalr_analysis import Shift

from gpuwhy import severity as sev
from gpuwhy.errors import GpuwhyError
from gpuwhy.gpufields import THROTTLE_BITS
from gpuwhy.rules import model as m
from gpuwhy.rules.vocabulary import (
    FACTS,
    INSTANCE_FACTS,
    PROCESS_TEXT,
    SIGNALS,
    STREAMS,
)

# Bounds on what a rule file may ask of the parser and the engine (docs/rules.md, "Limits").
# Parsing costs 35-70 us a token: a file at the bound loads in under 2 s (2-CPU VM, ~40 MB)
# and one rule at its bound in a fifth of that; the shipped files are 3 to 17 KiB, their
# largest rule ~300 tokens and 15 levels deep.
MAX_SOURCE_BYTES = 128 * 1024
MAX_RULE_TOKENS = 4000
MAX_DEPTH = 64
MAX_REGEX_CHARS = 512
MAX_NUMBER_CHARS = 64
MAX_NUMBER = 1e18
# Raw samples are kept a week (store.raw_days): a longer window could never be answered.
MAX_DURATION_NS = 7 * 86400 * 10**9

GRAMMAR = r"""
start: rule*
rule: "rule" NAME "{" clause* "}"

?clause: "title" ":" text                      -> title
       | "group" ":" NAME                      -> group
       | "kind" ":" NAME                       -> kind
       | "explains" ":" NAME ("," NAME)*       -> explains
       | "scope" ":" NAME                      -> scope
       | "requires" ":" dotted ("," dotted)*   -> requires
       | "window" ":" DURATION ("every" DURATION)? -> window
       | "warmup" ":" DURATION                 -> warmup
       | "shared" ":" NAME                     -> shared
       | "param" ":" param ("," param)*        -> params
       | "when" ":" expr                       -> when
       | "for" ":" DURATION                    -> for_
       | "clear" ":" "after" DURATION          -> clear_after
       | "clear" ":" expr                      -> clear
       | "guard" ":" expr                      -> guard
       | "severity" ":" NAME escalation*       -> severity
       | "evidence" ":" evidence_item ("," evidence_item)* -> evidence
       | "cause" ":" text                      -> cause
       | "fix" ":" text ("if" expr)?           -> fix
       | "verify" ":" text                     -> verify
       | "source" ":" text                     -> source

param: NAME "=" signed
signed: NUMBER | "-" NUMBER -> neg_number
escalation: "escalate" expr "->" NAME
evidence_item: expr ("as" NAME)?
text: STRING+

?expr: or_expr
?or_expr: and_expr ("or" and_expr)*
?and_expr: not_expr ("and" not_expr)*
?not_expr: "not" not_expr -> not_
         | comparison
?comparison: sum
           | sum CMP sum          -> cmp
           | sum "in" "[" sum "," sum "]" -> between
           | sum "~" STRING       -> match
?sum: product
    | sum ADD product -> binop
?product: unary
        | product MUL unary -> binop
?unary: atom
      | "-" unary -> neg
?atom: NUMBER -> number
     | DURATION -> duration
     | "±" DURATION -> duration
     | STRING -> string
     | dotted -> ref
     | NAME "(" [arg ("," arg)*] ")" -> call
     | "(" expr ")"
arg: expr
   | dotted "where" expr -> stream_arg
   | NAME "=" expr -> kwarg
dotted: NAME ("." NAME)*

CMP: "<=" | ">=" | "==" | "!=" | "<" | ">"
ADD: "+" | "-"
MUL: "*" | "/"
DURATION.2: /\d+(\.\d+)?(ms|s|m|h|d)(?![A-Za-z0-9_])/
NUMBER: /\d+(\.\d+)?([eE][+-]?\d+)?/
NAME: /[A-Za-z_][A-Za-z0-9_]*/
STRING: /"([^"\\\n]|\\.)*"/
COMMENT: /#[^\n]*/
%ignore COMMENT
%ignore /[ \t\r\n]+/
"""

_FRIENDLY = {"NAME": "a name", "NUMBER": "a number", "DURATION": "a duration (e.g. 60s)",
             "STRING": 'a "string"', "CMP": "a comparison (<, <=, ==, ...)",
             "ADD": "+ or -", "MUL": "* or /", "$END": "end of file"}
UNIT_NS = {"ms": 10**6, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9, "d": 86400 * 10**9}
AGGREGATES = ("mean", "min", "max", "stddev", "last", "rate", "delta")
SCALAR_FUNCS = {"coalesce": (1, 16), "abs": (1, 1), "min": (2, 16), "max": (2, 16)}


class RuleSyntaxError(GpuwhyError):
    """A rule file does not parse or names something that does not exist."""

    def __init__(self, path: str, line: int, column: int, message: str):
        self.path, self.line, self.column, self.message = path, line, column, message
        super().__init__(f"{path}:{line}:{column}: {message}")


@cache
def _parser() -> lark.Lark:
    return lark.Lark(GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=False)


def _friendly(name: str) -> str:
    if name in _FRIENDLY:
        return _FRIENDLY[name]
    terminal = _parser().get_terminal(name)
    return f'"{terminal.pattern.value}"'


CLAUSES = ("title", "group", "kind", "explains", "scope", "requires", "window", "warmup",
           "shared", "param", "when", "for", "clear", "guard", "severity", "evidence", "cause",
           "fix", "verify", "source")


def _expected(names: set[str]) -> str:
    shown = {_friendly(n) for n in names}
    clauses = {f'"{c}"' for c in CLAUSES} & shown
    if len(clauses) > 3:   # after a clause any clause may follow: say so once
        shown = (shown - clauses) | {"a clause (title:, when:, ...)"}
    ordered = sorted(shown)
    return ", ".join(ordered) if len(ordered) < 16 else ", ".join(ordered[:15]) + ", ..."


def _takes(states: dict, end_state: object, stack: list, terminal: str) -> bool:
    """Whether the LALR automaton in ``stack`` can shift ``terminal`` (or end, for $END):
    its reductions replayed on a copy of the state stack only."""
    stack = list(stack)
    while True:
        action = states[stack[-1]].get(terminal)
        if action is None:
            return False
        kind, arg = action
        if kind is Shift:
            return True
        size = len(arg.expansion)
        if size:
            del stack[-size:]
        goto = states[stack[-1]].get(arg.origin.name)
        if goto is None:
            return False
        stack.append(goto[1])
        if terminal == "$END" and stack[-1] == end_state:
            return True


def _accepted(exc: UnexpectedInput, fallback: Iterable[str]) -> set[str]:
    """The tokens the parser would take here: exact (it tries each), not LALR's superset.

    lark's own ``accepts()`` copies the parser and its lexer once per terminal, a fifth of
    the time of parsing a broken rule; replaying the reductions on the state stack gives the
    same answer. Any surprise in lark's internals falls back to ``accepts()``.
    """
    parser = getattr(exc, "interactive_parser", None)
    if parser is None:
        return set(fallback)
    try:
        state = parser.parser_state
        conf = state.parse_conf
        accepted = {t for t in conf.states[state.state_stack[-1]] if t.isupper()
                    and _takes(conf.states, conf.end_state, state.state_stack, t)}
    except Exception:  # noqa: BLE001 - lark's internals moved: its own slower way
        try:
            accepted = set(parser.accepts())
        except Exception:  # noqa: BLE001 - then lark's own list
            accepted = set()
    return accepted or set(fallback)


def _unescape(token: str) -> str:
    body, out, i = token[1:-1], [], 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body) and body[i + 1] in '"\\':
            out.append(body[i + 1])
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def duration_ns(token: str) -> int:
    """Nanoseconds of a duration token (``90s``, ``1.5m``); ValueError past MAX_DURATION_NS.

    The digits are bounded before any conversion and converted exactly (Fraction): a float
    overflows on a long literal, and Python refuses an int of more than 4300 digits.
    """
    for unit in ("ms", "s", "m", "h", "d"):
        digits = token[:-len(unit)]
        if not token.endswith(unit) or not digits.replace(".", "", 1).isdigit():
            continue
        too_large = ValueError(f"duration too large (max {MAX_DURATION_NS // UNIT_NS['d']}d)")
        if len(digits.partition(".")[0].lstrip("0")) > 20:
            raise too_large
        if len(digits) > MAX_NUMBER_CHARS:
            raise ValueError(f"duration longer than {MAX_NUMBER_CHARS} characters")
        ns = int(Fraction(digits) * UNIT_NS[unit])
        if ns > MAX_DURATION_NS:
            raise too_large
        return ns
    raise ValueError(f"not a duration: {token!r}")


def number_value(token: str) -> float:
    """The value of a number token; ValueError when it is too long, too large or not finite."""
    if len(token) > MAX_NUMBER_CHARS:
        raise ValueError(f"number longer than {MAX_NUMBER_CHARS} characters")
    value = float(token)
    if not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise ValueError("number too large (max 1e18)")
    return value


def _duration(token: Token) -> int:
    try:
        return duration_ns(str(token))
    except ValueError as exc:
        raise _Problem(token, str(exc)) from None


def _number(token: Token) -> float:
    try:
        return number_value(str(token))
    except ValueError as exc:
        raise _Problem(token, str(exc)) from None


def _pos(item: object) -> tuple[int, int]:
    if isinstance(item, Token):
        return item.line or 0, item.column or 0
    meta = getattr(item, "meta", None)
    if meta is not None and not getattr(meta, "empty", True):
        return meta.line, meta.column
    return getattr(item, "line", 0), getattr(item, "column", 0)


class _Problem(Exception):
    def __init__(self, where: object, message: str):
        self.line, self.column = _pos(where)
        self.message = message


@v_args(meta=True)
class _ToModel(lark.Transformer):
    """Tree -> nodes and clause tuples, with positions."""

    def number(self, meta, c):  # noqa: ANN001, ANN201
        return m.Num(_number(c[0]), meta.line, meta.column)

    def duration(self, meta, c):  # noqa: ANN001, ANN201
        return m.Dur(_duration(c[0]), meta.line, meta.column)

    def string(self, meta, c):  # noqa: ANN001, ANN201
        return m.Str(_unescape(str(c[0])), meta.line, meta.column)

    def dotted(self, meta, c):  # noqa: ANN001, ANN201
        return m.Ref(".".join(str(t) for t in c), "", meta.line, meta.column)

    def ref(self, meta, c):  # noqa: ANN001, ANN201
        return c[0]

    def neg(self, meta, c):  # noqa: ANN001, ANN201
        return m.Unary("-", c[0], meta.line, meta.column)

    def binop(self, meta, c):  # noqa: ANN001, ANN201
        return m.Bin(str(c[1]), c[0], c[2], meta.line, meta.column)

    def cmp(self, meta, c):  # noqa: ANN001, ANN201
        return m.Cmp(str(c[1]), c[0], c[2], meta.line, meta.column)

    def between(self, meta, c):  # noqa: ANN001, ANN201
        return m.Between(c[0], c[1], c[2], meta.line, meta.column)

    def match(self, meta, c):  # noqa: ANN001, ANN201
        pattern = _unescape(str(c[1]))
        if len(pattern) > MAX_REGEX_CHARS:
            raise _Problem(c[1], f"regex longer than {MAX_REGEX_CHARS} characters")
        options = re2.Options()
        options.max_mem = 1 << 20
        options.log_errors = False
        try:
            regex = re2.compile(pattern, options)
        except re2.error as exc:
            reason = exc.args[0] if exc.args else exc
            if isinstance(reason, bytes):
                reason = reason.decode("utf-8", errors="replace")
            raise _Problem(c[1], f"invalid regex {pattern!r}: {reason}") from None
        return m.Match(c[0], pattern, regex, meta.line, meta.column)

    def or_expr(self, meta, c):  # noqa: ANN001, ANN201
        return m.BoolOp("or", tuple(c), meta.line, meta.column)

    def and_expr(self, meta, c):  # noqa: ANN001, ANN201
        return m.BoolOp("and", tuple(c), meta.line, meta.column)

    def not_(self, meta, c):  # noqa: ANN001, ANN201
        return m.Not(c[0], meta.line, meta.column)

    def arg(self, meta, c):  # noqa: ANN001, ANN201
        return c[0]

    def stream_arg(self, meta, c):  # noqa: ANN001, ANN201
        return m.StreamRef(c[0].name, c[1], meta.line, meta.column)

    def kwarg(self, meta, c):  # noqa: ANN001, ANN201
        return ("kw", str(c[0]), c[1])

    def call(self, meta, c):  # noqa: ANN001, ANN201
        name, rest = str(c[0]), [x for x in c[1:] if x is not None]
        kwargs = tuple((x[1], x[2]) for x in rest if isinstance(x, tuple))
        args = tuple(x for x in rest if not isinstance(x, tuple))
        return m.Call(name, args, kwargs, meta.line, meta.column)

    def text(self, meta, c):  # noqa: ANN001, ANN201
        return "".join(_unescape(str(t)) for t in c)

    def param(self, meta, c):  # noqa: ANN001, ANN201
        return (c[0], c[1])

    def signed(self, meta, c):  # noqa: ANN001, ANN201
        return _number(c[0])

    def neg_number(self, meta, c):  # noqa: ANN001, ANN201
        return -_number(c[0])

    def escalation(self, meta, c):  # noqa: ANN001, ANN201
        return (c[0], c[1])

    def evidence_item(self, meta, c):  # noqa: ANN001, ANN201
        return ("evidence_item", c[0], str(c[1]) if len(c) > 1 else None, meta)

    def __default__(self, data, children, meta):  # noqa: ANN001, ANN204
        return (str(data), children, meta)


class _Checker:
    """Resolves names and checks calls of one rule; raises _Problem at the first error."""

    def __init__(self, rule: m.Rule):
        self.rule = rule

    def resolve(self, node: m.Node, fields: dict[str, str] | None = None,
                depth: int = 0) -> m.Node:
        if depth > MAX_DEPTH:
            raise _Problem(node, "expression nested too deeply")
        r = lambda n, f=fields: self.resolve(n, f, depth + 1)   # noqa: E731
        if isinstance(node, m.Ref):
            return self._ref(node, fields)
        if isinstance(node, m.Dur):
            raise _Problem(node, "a duration is only allowed as a window argument")
        if isinstance(node, m.Unary):
            return m.Unary(node.op, r(node.operand), node.line, node.column)
        if isinstance(node, m.Bin):
            return m.Bin(node.op, r(node.left), r(node.right), node.line, node.column)
        if isinstance(node, m.Cmp):
            return m.Cmp(node.op, r(node.left), r(node.right), node.line, node.column)
        if isinstance(node, m.Between):
            return m.Between(r(node.term), r(node.low), r(node.high), node.line, node.column)
        if isinstance(node, m.Match):
            return m.Match(r(node.term), node.pattern, node.regex, node.line, node.column)
        if isinstance(node, m.BoolOp):
            # 'and' and 'or' are commutative in the evaluator's logic: the cheap items first,
            # so that a deciding one spares the costly ones (a regex on every event row)
            items = sorted((r(i) for i in node.items), key=m.cost)
            return m.BoolOp(node.op, tuple(items), node.line, node.column)
        if isinstance(node, m.Not):
            return m.Not(r(node.item), node.line, node.column)
        if isinstance(node, m.StreamRef):
            raise _Problem(node, "an event stream is only allowed in count() and within()")
        if isinstance(node, m.Call):
            return self._call(node, fields, depth)
        return node

    def _ref(self, node: m.Ref, fields: dict[str, str] | None) -> m.Ref:
        name = node.name
        if fields is not None and name in fields:
            kind = "field"
        elif name in SIGNALS:
            kind = "signal"
        elif name in FACTS:
            kind = "fact"
        elif name in INSTANCE_FACTS:
            kind = "instance"
        elif name in PROCESS_TEXT:
            kind = "text"
        elif name in self.rule.params:
            kind = "param"
        else:
            known = [*SIGNALS, *FACTS, *INSTANCE_FACTS, *PROCESS_TEXT, *self.rule.params,
                     *(fields or ())]
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            what = "event field or name" if fields is not None else "name"
            raise _Problem(node, f"unknown {what} {name!r}{hint}")
        if self.rule.scope == m.INSTANCE and (
                kind in ("instance", "text") or
                (kind == "signal" and SIGNALS[name].source not in ("gpu", "fact"))):
            raise _Problem(node, f"{name!r} is not known per MIG instance (a 'scope: "
                                 f"instance' rule reads its instance's gpu.* signals)")
        return m.Ref(name, kind, node.line, node.column)

    def _window(self, call: m.Call, index: int) -> None:
        if len(call.args) <= index or not isinstance(call.args[index], m.Dur):
            raise _Problem(call, f"{call.func}() expects a duration as argument {index + 1}")
        if cast(m.Dur, call.args[index]).ns <= 0:
            raise _Problem(call.args[index], "a window must be longer than 0")

    def _stream(self, node: m.Node, depth: int) -> m.StreamRef:
        if isinstance(node, m.Ref):
            node = m.StreamRef(node.name, None, node.line, node.column)
        if not isinstance(node, m.StreamRef):
            raise _Problem(node, "expected an event stream (" + ", ".join(STREAMS) + ")")
        stream = STREAMS.get(node.name)
        if stream is None:
            close = difflib.get_close_matches(node.name, list(STREAMS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _Problem(node, f"unknown event stream {node.name!r}{hint}")
        where = None if node.where is None else self.resolve(node.where, dict(stream.fields),
                                                              depth + 1)
        return m.StreamRef(node.name, where, node.line, node.column)

    def _call(self, call: m.Call, fields: dict[str, str] | None, depth: int) -> m.Call:
        f, args = call.func, call.args
        r = lambda n: self.resolve(n, fields, depth + 1)   # noqa: E731
        percentile = f.startswith("p") and f[1:].isdigit() and len(f) == 3
        if call.kwargs and f != "zscore":
            raise _Problem(call, f"{f}() takes no keyword arguments")
        if f in AGGREGATES and len(args) == 2 and isinstance(args[1], m.Dur) or percentile:
            if len(args) != 2:
                raise _Problem(call, f"{f}() expects (series, duration)")
            self._window(call, 1)
            inner = r(args[0])
            if f in ("rate", "delta") and not (isinstance(inner, m.Ref)
                                               and inner.kind == "signal"):
                raise _Problem(args[0], f"{f}() expects a counter signal")
            return m.Call(f, (inner, args[1]), (), call.line, call.column)
        if f in SCALAR_FUNCS:
            low, high = SCALAR_FUNCS[f]
            if not low <= len(args) <= high:
                raise _Problem(call, f"{f}() expects {low} to {high} arguments, got {len(args)}")
            return m.Call(f, tuple(r(a) for a in args), (), call.line, call.column)
        if f == "frac":
            if len(args) != 2:
                raise _Problem(call, "frac() expects (predicate, duration)")
            self._window(call, 1)
            return m.Call(f, (r(args[0]), args[1]), (), call.line, call.column)
        if f == "corr":
            if len(args) != 3:
                raise _Problem(call, "corr() expects (series, series, duration)")
            self._window(call, 2)
            return m.Call(f, (r(args[0]), r(args[1]), args[2]), (), call.line, call.column)
        if f == "zscore":
            baseline = call.kwarg("baseline")
            if len(args) != 2 or not isinstance(baseline, m.Dur) or len(call.kwargs) != 1:
                raise _Problem(call, "zscore() expects (series, duration, baseline=duration)")
            self._window(call, 1)
            return m.Call(f, (r(args[0]), args[1]), (("baseline", baseline),),
                          call.line, call.column)
        if f == "count":
            if len(args) != 2:
                raise _Problem(call, "count() expects (stream [where predicate], duration)")
            self._window(call, 1)
            return m.Call(f, (self._stream(args[0], depth), args[1]), (), call.line,
                          call.column)
        if f == "within":
            if len(args) != 3:
                raise _Problem(call, "within() expects (stream, stream, ±duration)")
            self._window(call, 2)
            return m.Call(f, (self._stream(args[0], depth), self._stream(args[1], depth),
                              args[2]), (), call.line, call.column)
        if f == "bit":
            if len(args) != 2 or not isinstance(args[1], m.Ref) or "." in args[1].name:
                raise _Problem(call, "bit() expects (series, BIT_NAME)")
            if args[1].name not in THROTTLE_BITS:
                raise _Problem(args[1], f"unknown bit {args[1].name!r}; expected one of "
                                        + ", ".join(THROTTLE_BITS))
            bit = m.Ref(args[1].name, "bit", args[1].line, args[1].column)
            return m.Call(f, (r(args[0]), bit), (), call.line, call.column)
        if f == "env":
            if len(args) != 1 or not isinstance(args[0], m.Str):
                raise _Problem(call, 'env() expects one "NAME" string')
            if self.rule.scope != "process" and not self.rule.scope == "gpu":
                raise _Problem(call, "env() needs a process")
            return call
        if f in AGGREGATES:
            raise _Problem(call, f"{f}() expects (series, duration)")
        known = [*AGGREGATES, *SCALAR_FUNCS, "frac", "corr", "zscore", "count", "within", "bit",
                 "env",
                 "p05", "p50", "p95", "p99"]
        close = difflib.get_close_matches(f, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise _Problem(call, f"unknown function {f!r}{hint}")


def _build_rule(tree: tuple, path: str, source: str) -> m.Rule:
    _, children, meta = tree
    name, clauses = children[0], children[1:]
    rule = m.Rule(id=str(name), path=path, line=meta.line,
                  text=source[meta.start_pos:meta.end_pos])
    seen: dict[str, object] = {}
    explains_at: object = meta
    # Params (and the scope) first: expressions anywhere in the rule may use them.
    for clause, items, _meta in clauses:
        if clause == "scope" and str(items[0]) in m.SCOPES:
            rule.scope = str(items[0])
        if clause == "params":
            for pname, value in items:
                if str(pname) in rule.params:
                    raise _Problem(pname, f"parameter {str(pname)!r} declared twice")
                if "." in str(pname):
                    raise _Problem(pname, "a parameter name has no dots")
                rule.params[str(pname)] = value
    checker = _Checker(rule)
    single = {"title", "group", "kind", "explains", "scope", "window", "warmup", "shared",
              "when", "for_", "clear", "clear_after", "severity", "evidence", "cause", "verify",
              "requires"}
    for clause, items, cmeta in clauses:
        key = "clear" if clause == "clear_after" else clause
        if key in single and key in seen:
            raise _Problem(cmeta, f"clause {key.rstrip('_')!r} given twice")
        seen[key] = True
        if clause == "title":
            rule.title = items[0]
        elif clause == "group":
            if str(items[0]) not in m.GROUPS:
                raise _Problem(items[0], "expected a group: " + ", ".join(m.GROUPS))
            rule.group = str(items[0])
        elif clause == "kind":
            if str(items[0]) not in m.KINDS:
                raise _Problem(items[0], "expected a kind: " + ", ".join(m.KINDS))
            rule.kind, rule.kind_declared = str(items[0]), True
        elif clause == "explains":
            for token in items:
                if str(token) == rule.id:
                    raise _Problem(token, f"rule {rule.id} cannot explain itself")
                if str(token) in rule.explains:
                    raise _Problem(token, f"{str(token)} listed twice in 'explains'")
                rule.explains += (str(token),)
            explains_at = cmeta
        elif clause == "scope":
            if str(items[0]) not in m.SCOPES:
                raise _Problem(items[0], "expected a scope: " + ", ".join(m.SCOPES))
            rule.scope = str(items[0])
        elif clause == "requires":
            for ref in items:
                checker._ref(ref, None)
            rule.requires = tuple(ref.name for ref in items)
        elif clause == "window":
            rule.window_ns = _duration(items[0])
            rule.every_ns = _duration(items[1]) if len(items) > 1 else None
            if rule.window_ns <= 0:
                raise _Problem(items[0], "a window must be longer than 0")
        elif clause == "warmup":
            rule.warmup_ns = _duration(items[0])
        elif clause == "shared":
            if str(items[0]) not in m.SHARED_POLICIES:
                raise _Problem(items[0], "expected one of " + ", ".join(m.SHARED_POLICIES))
            rule.shared = str(items[0])
        elif clause == "when":
            rule.when = checker.resolve(items[0])
        elif clause == "for_":
            rule.for_ns = _duration(items[0])
        elif clause == "clear_after":
            rule.clear_after_ns = _duration(items[0])
        elif clause == "clear":
            rule.clear = checker.resolve(items[0])
        elif clause == "guard":
            rule.guards += (checker.resolve(items[0]),)
        elif clause == "severity":
            rule.severity = _severity(items[0])
            rule.escalations = tuple((checker.resolve(e), _severity(s)) for e, s in items[1:])
        elif clause == "evidence":
            rule.evidence = tuple((label or source[em.start_pos:em.end_pos].split(" as ")[0],
                                   checker.resolve(expr))
                                  for _, expr, label, em in items)
        elif clause == "cause":
            rule.cause = items[0]
        elif clause == "fix":
            condition = checker.resolve(items[1]) if len(items) > 1 else None
            rule.fixes += (m.Fix(items[0], condition),)
        elif clause == "verify":
            rule.verify = items[0]
        elif clause == "source":
            rule.sources += (items[0],)
    if rule.kind == m.SYMPTOM and rule.explains:
        raise _Problem(explains_at, "a symptom explains nothing: write kind: cause, or drop "
                                    "'explains:'")
    if rule.when is None:
        raise _Problem(meta, f"rule {rule.id} has no 'when:' clause")
    if not rule.title:
        raise _Problem(meta, f"rule {rule.id} has no 'title:' clause")
    return rule


def _severity(token: Token) -> str:
    """The scale's name of a severity token: a legacy name (``warn``, ``high``) is mapped
    here, so a rule, its findings and their incidents carry only the one scale."""
    if not sev.is_severity(str(token)):
        raise _Problem(token, "expected a severity: " + sev.accepted())
    return sev.normalise(str(token))


# Where a rule starts: "rule NAME {" outside strings and comments. A "{" appears nowhere
# else in the grammar, so in a valid file these are exactly the rules' starts, and in a
# broken one the next rule still starts there when the one before is not closed: each
# block is parsed on its own, and a problem costs only its block. The other alternatives
# only step over strings and comments and count tokens (cheaply, before lark sees them).
_SCAN = re.compile(r'#[^\n]*|"(?:[^"\\\n]|\\.)*"?'
                   r"|(?<![A-Za-z0-9_])rule\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{"
                   r"|[A-Za-z0-9_.]+|\S")
# Lone surrogates: what surrogateescape makes of bytes that are not UTF-8 (loader.py).
_NOT_TEXT = re.compile("[\ud800-\udfff]")


class _Block:
    __slots__ = ("start", "end", "name", "tokens")

    def __init__(self, start: int, name: str | None):
        self.start, self.end, self.name, self.tokens = start, start, name, 0


def _blocks(source: str) -> list[_Block]:
    """The rule blocks of ``source``; text before the first rule is a block of its own
    when it holds anything but comments."""
    blocks = [_Block(0, None)]
    for match in _SCAN.finditer(source):
        token = match.group()
        if token[0] == "#":
            continue
        if match.group(1) is not None:
            blocks.append(_Block(match.start(), match.group(1)))
        blocks[-1].tokens += 1
    for block, after in zip(blocks, blocks[1:], strict=False):
        block.end = after.start
    blocks[-1].end = len(source)
    return [b for b in blocks if b.tokens]


class _Lines:
    """Line and column of an offset in a file, by bisecting its newline offsets."""

    def __init__(self, source: str):
        self.newlines = [found.start() for found in re.finditer("\n", source)]

    def at(self, pos: int) -> tuple[int, int]:
        index = bisect.bisect_left(self.newlines, pos)
        return index + 1, pos - (self.newlines[index - 1] if index else -1)

    @property
    def count(self) -> int:
        return len(self.newlines) + 1


def _move(item: Any, lines: int, columns: int, chars: int) -> None:
    """Positions in a block -> positions in its file: ``columns`` only on the block's first
    line (the block may start inside a line)."""
    if item.line is not None and item.line == 1:
        item.column += columns
    if item.end_line is not None and item.end_line == 1 and item.end_column is not None:
        item.end_column += columns
    if item.line is not None:
        item.line += lines
    if item.end_line is not None:
        item.end_line += lines
    if item.start_pos is not None:
        item.start_pos += chars
    if item.end_pos is not None:
        item.end_pos += chars


def check_tree(tree: lark.Tree, line_offset: int = 0, pos_offset: int = 0,
               column_offset: int = 0) -> None:
    """Move a block's tree to its place in the file and bound its depth, without recursion
    (lark's transformer and the evaluator recurse: a deep tree must never reach them)."""
    stack: list[tuple[object, int]] = [(tree, 1)]
    seen: set[int] = set()
    moving = bool(line_offset or pos_offset or column_offset)
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:   # lark's trees may share nodes
            continue
        seen.add(id(node))
        if isinstance(node, Token):
            if moving:
                _move(node, line_offset, column_offset, pos_offset)
            continue
        if not isinstance(node, lark.Tree):
            continue
        if moving and not node.meta.empty:
            _move(node.meta, line_offset, column_offset, pos_offset)
        if depth > MAX_DEPTH:
            raise _Problem(node, f"expression nested too deeply (max {MAX_DEPTH} levels)")
        stack.extend((child, depth + 1) for child in node.children)


def _syntax_error(exc: UnexpectedInput, text: str, path: str, lines: _Lines, line_offset: int,
                  column_offset: int,
                  next_rule: tuple[int, int, str, str | None] | None) -> RuleSyntaxError:
    """A lark error in a block (``text``, starting ``line_offset`` lines and, on its first
    line, ``column_offset`` columns into the file) as a RuleSyntaxError at its place in the
    file; ``next_rule``: where the next block starts."""
    err: Any = exc      # an UnexpectedToken (.token, .expected) where not EOF nor characters
    at_end = isinstance(exc, UnexpectedEOF) or (
        not isinstance(exc, UnexpectedCharacters) and err.token.type == "$END")
    if exc.line == 1 and exc.column > 0:
        exc.column += column_offset
    if at_end:
        expected = _expected(_accepted(exc, err.expected))
        if next_rule is not None:   # the input ends only because the next rule starts
            line, column, name, own = next_rule
            above = f"rule {own}" if own else "the text above"
            return RuleSyntaxError(path, line, column, f"unexpected start of rule {name} "
                                   f"({above} is not closed); expected {expected}")
        line = exc.line + line_offset if exc.line > 0 else lines.count
        return RuleSyntaxError(path, line, max(exc.column, 1),
                               f"unexpected end of file; expected {expected}")
    if isinstance(exc, UnexpectedCharacters):
        pos = cast(int, exc.pos_in_stream)       # set on every lexer error
        char = text[pos] if pos < len(text) else ""
        expected = f"; expected {_expected(set(exc.allowed))}" if exc.allowed else ""
        return RuleSyntaxError(path, exc.line + line_offset, exc.column,
                               f"unexpected character {char!r}{expected}")
    return RuleSyntaxError(path, max(exc.line, 1) + line_offset, max(exc.column, 1),
                           f"unexpected {str(err.token)!r}; expected "
                           + _expected(_accepted(exc, err.expected)))


def parse_rules_report(source: str, path: str = "<rules>"
                       ) -> tuple[list[m.Rule], list[RuleSyntaxError]]:
    """The rules of ``source`` that are sound, and a problem for each block that is not.

    A problem costs only its own rule (its block, from ``rule NAME {`` to the next one);
    a file over MAX_SOURCE_BYTES costs all of them. Raises nothing but a bug's exception
    (the fuzz test, tests/test_rules_fuzz.py, looks for those).
    """
    if len(source) > MAX_SOURCE_BYTES or \
            len(source.encode("utf-8", errors="surrogatepass")) > MAX_SOURCE_BYTES:
        return [], [RuleSyntaxError(path, 1, 1, f"rule file larger than {MAX_SOURCE_BYTES} "
                                                f"bytes (max {MAX_SOURCE_BYTES // 1024} KiB)")]
    lines = _Lines(source)
    blocks = _blocks(source)
    rules: list[m.Rule] = []
    problems: list[RuleSyntaxError] = []
    ids: set[str] = set()
    for index, block in enumerate(blocks):
        line, column = lines.at(block.start)
        text = source[block.start:block.end]
        bad = _NOT_TEXT.search(text)
        if bad is not None:
            char = bad.group()
            what = f"not UTF-8 text (byte 0x{ord(char) - 0xDC00:02x})" \
                if "\udc80" <= char <= "\udcff" else f"not text (U+{ord(char):04X})"
            problems.append(RuleSyntaxError(path, *lines.at(block.start + bad.start()), what))
            continue
        if block.tokens > MAX_RULE_TOKENS:
            problems.append(RuleSyntaxError(path, line, column, "rule larger than "
                                            f"{MAX_RULE_TOKENS} tokens"))
            continue
        after = blocks[index + 1] if index + 1 < len(blocks) else None
        next_rule = None if after is None else (*lines.at(after.start), after.name or "",
                                                 block.name)
        try:
            tree = _parser().parse(text)
        except UnexpectedInput as exc:
            problems.append(_syntax_error(exc, text, path, lines, line - 1, column - 1,
                                          next_rule))
            continue
        except RecursionError:
            problems.append(RuleSyntaxError(path, line, column, "rule nested too deeply"))
            continue
        for rule_tree in cast("list[lark.Tree]", tree.children):     # a block: rules only
            try:
                with problems_reported(path, "rule"):
                    check_tree(rule_tree, line - 1, block.start, column - 1)
                    rule = _build_rule(_ToModel().transform(rule_tree), path, source)
                    if rule.id in ids:
                        raise _Problem(rule_tree.meta, f"rule {rule.id} defined twice")
            except RuleSyntaxError as problem:
                problems.append(problem)
                continue
            ids.add(rule.id)
            rules.append(rule)
    return rules, problems


def parse_rules(source: str, path: str = "<rules>") -> list[m.Rule]:
    """Every rule in ``source``; raises :class:`RuleSyntaxError` (never anything else) for
    the first problem. :func:`parse_rules_report` keeps the sound rules instead."""
    rules, problems = parse_rules_report(source, path)
    if problems:
        raise problems[0]
    return rules


@contextlib.contextmanager
def problems_reported(path: str, what: str) -> Iterator[None]:
    """Building the model: a problem found there becomes a RuleSyntaxError at its place."""
    try:
        yield
    except VisitError as exc:
        problem = exc.orig_exc
        if isinstance(problem, _Problem):
            raise RuleSyntaxError(path, problem.line, problem.column, problem.message) from None
        raise
    except _Problem as problem:
        raise RuleSyntaxError(path, problem.line, problem.column, problem.message) from None
    except RecursionError:
        raise RuleSyntaxError(path, 1, 1, f"{what} nested too deeply") from None
