"""The rule language: what parses, the exact errors for what does not, its bounds, and how
a broken rule costs only itself (the fuzz test: test_rules_fuzz.py)."""

from __future__ import annotations

import time

import pytest

from gpuwhy.rules import model as m
from gpuwhy.rules.expression import parse_expression
from gpuwhy.rules.loader import builtin_files
from gpuwhy.rules.parser import (
    MAX_DEPTH,
    MAX_DURATION_NS,
    MAX_RULE_TOKENS,
    MAX_SOURCE_BYTES,
    RuleSyntaxError,
    _blocks,
    _parser,
    check_tree,
    parse_rules,
    parse_rules_report,
)

VALID = [
    # (source, what to check on the one rule)
    ('rule A { title: "t" when: gpu.util > 0.5 }',
     lambda r: r.scope == "gpu" and r.severity == "warning" and r.for_ns == 0),
    ('rule A { title: "a" "b" scope: process window: 30s every 5s for: 2m\n'
     '  when: mean(gpu.util, 30s) >= 0.1 }',
     lambda r: r.title == "ab" and r.window_ns == 30 * 10**9 and r.every_ns == 5 * 10**9
     and r.for_ns == 120 * 10**9 and r.scope == "process"),
    ('rule A { title: "t" param: lo = 0.1, hi = -2 when: gpu.util < lo and gpu.util > hi }',
     lambda r: r.params == {"lo": 0.1, "hi": -2.0}),
    ('rule A { title: "t" when: frac(bit(gpu.reason, SW_POWER_CAP), 60s) >= 0.5 }',
     lambda r: isinstance(r.when, m.Cmp) and r.when.left.func == "frac"),
    ('rule A { title: "t" when: p95(gpu.util, 5m) >= 0.7 and p05(gpu.util, 5m) <= 0.1 }',
     lambda r: r.when.op == "and"),
    ('rule A { title: "t" when: corr(gpu.pcie_rx_Bps / 1e9, gpu.sm_active, 60s) <= -0.5 }',
     lambda r: r.when.left.func == "corr" and r.when.left.args[2].ns == 60 * 10**9),
    ('rule A { title: "t" when: zscore(gpu.sm_active, 30s, baseline=15m) <= -3 }',
     lambda r: r.when.left.kwarg("baseline").ns == 900 * 10**9),
    ('rule A { title: "t" when: count(journal.xid where code in [13, 43], 1m) >= 1 }',
     lambda r: r.when.left.args[0].where is not None),
    ('rule A { title: "t" when: within(gpu.xid where code == 79, cron.run, ±60s) }',
     lambda r: r.when.args[2].ns == 60 * 10**9),
    ('rule A { title: "t" scope: process when: env("CUDA_LAUNCH_BLOCKING") == "1" }',
     lambda r: r.when.left.func == "env"),
    ('rule A { title: "t" when: not proc.cmdline ~ "nv-hostengine|dcgm" }',
     lambda r: isinstance(r.when, m.Not) and r.when.item.regex is not None),
    ('rule A { title: "t" when: rate(proc.ioctl.rm_alloc, 30s) + rate(proc.ioctl.rm_free, 30s)'
     ' >= 200 }', lambda r: r.when.left.op == "+"),
    ('rule A { title: "t" when: coalesce(mean(gpu.gr_active, 1m), mean(gpu.util, 1m)) > 0\n'
     # 'high' is a legacy name: read as 'error'
     '  clear: after 5m guard: gpu.procs > 1 severity: info escalate gpu.util > 0.9 -> high\n'
     '  evidence: mean(gpu.util, 1m) as u, last(gpu.temp_c, 1m)\n'
     '  cause: "c" fix: "f1" fix: "f2" if gpu.has_tf32 == 1 verify: "v" source: "s" }',
     lambda r: r.clear_after_ns == 300 * 10**9 and len(r.guards) == 1
     and r.escalations[0][1] == "error" and [e[0] for e in r.evidence] == ["u",
                                                                          "last(gpu.temp_c, 1m)"]
     and r.fixes[1].condition is not None),
    ('# comment\nrule A { # more\n title: "say \\"hi\\" \\d" when: gpu.util > 1e-3 }',
     lambda r: r.title == 'say "hi" \\d'),
]

INVALID = [
    ('rule X {\n  title: "t"\n',
     't.rules:2:10: unexpected end of file; expected "}", a "string", a clause (title:, '
     'when:, ...)'),
    ('rule X { title: "t" when: mean(gpu.utl, 60s) > 1 }',
     "t.rules:1:32: unknown name 'gpu.utl' (did you mean 'gpu.util'?)"),
    ('rule X { title: "t" when: mean(gpu.util) > 1 }',
     "t.rules:1:27: mean() expects (series, duration)"),
    ('rule X { title: "t" when: foo(gpu.util, 60s) > 1 }',
     "t.rules:1:27: unknown function 'foo'"),
    ('rule X { title: "t" when: gpu.util > }',
     't.rules:1:38: unexpected \'}\'; expected "(", "-", "±", a "string", a duration '
     '(e.g. 60s), a name, a number'),
    ('rule X { title "t" }', "t.rules:1:16: unexpected '\"t\"'; expected \":\""),
    ('rule X { title: "t" scope: node when: gpu.util > 1 }',
     "t.rules:1:28: expected a scope: gpu, process, instance"),
    ('rule X { title: "t" severity: urgent when: gpu.util > 1 }',
     "t.rules:1:31: expected a severity: info, warning, error, critical; "
     "older names: warn (= warning), high (= error)"),
    ('rule X { title: "t" when: bit(gpu.reason, SW_POWERCAP) }',
     "t.rules:1:43: unknown bit 'SW_POWERCAP'; expected one of IDLE, APP_CLOCKS, "
     "SW_POWER_CAP, HW_SLOWDOWN, SYNC_BOOST, SW_THERMAL, HW_THERMAL, HW_POWER_BRAKE"),
    ('rule X { title: "t" when: proc.cmdline ~ "(" }',
     "t.rules:1:42: invalid regex '(': missing ): ("),
    ('rule X { title: "t" when: count(journal.xyd, 1m) > 0 }',
     "t.rules:1:33: unknown event stream 'journal.xyd' (did you mean 'journal.xid'?)"),
    ('rule X { title: "t" when: count(journal.xid where cod == 79, 1m) > 0 }',
     "t.rules:1:51: unknown event field or name 'cod' (did you mean 'code'?)"),
    ('rule X { title: "t" when: rate(gpu.util / 2, 60s) > 1 }',
     "t.rules:1:32: rate() expects a counter signal"),
    ('rule X { title: "t" }', "t.rules:1:1: rule X has no 'when:' clause"),
    ('rule X { when: gpu.util > 1 }', "t.rules:1:1: rule X has no 'title:' clause"),
    ('rule X { title: "t" when: gpu.util > 1 when: gpu.util > 2 }',
     "t.rules:1:40: clause 'when' given twice"),
    ('rule X { title: "t" when: gpu.util > idle }', "t.rules:1:38: unknown name 'idle'"),
    ('rule X { title: "t" when: 60s > 1 }',
     "t.rules:1:27: a duration is only allowed as a window argument"),
    ('rule X { title: "t" when: corr(gpu.util, 60s) < 0 }',
     "t.rules:1:27: corr() expects (series, series, duration)"),
    ('rule X { title: "t" when: corr(gpu.util, gpu.sm_active, gpu.tensor) < 0 }',
     "t.rules:1:27: corr() expects a duration as argument 3"),
    ('rule X { title: "t" when: zscore(gpu.util, 30s) < -3 }',
     "t.rules:1:27: zscore() expects (series, duration, baseline=duration)"),
    ('rule X { title: "t" when: gpu.util > 1 } rule X { title: "t" when: gpu.util > 1 }',
     "t.rules:1:42: rule X defined twice"),
    ('rule X { title: "t" when: env(NAME) == "1" }',
     't.rules:1:27: env() expects one "NAME" string'),
    ('rule X { title: "t" window: 0s when: gpu.util > 1 }',
     "t.rules:1:29: a window must be longer than 0"),
    ('rule X { title: "t" when: gpu.util $ 1 }',
     't.rules:1:36: unexpected character \'$\'; expected ")", ",", "->", ".", "]", "and", '
     '"as", "in", "or", "where", "}", "~", * or /, + or -, a clause (title:, when:, ...), ...'),
    ('rule X { title: "t" when: open("/etc/passwd") }', "t.rules:1:27: unknown function 'open'"),
    ('rule X { title: "t" when: __import__("os") }',
     "t.rules:1:27: unknown function '__import__'"),
]


@pytest.mark.parametrize("source,check", VALID)
def test_valid_rules_parse(source, check):
    [rule] = parse_rules(source, "t.rules")
    assert check(rule), rule


@pytest.mark.parametrize("source,message", INVALID)
def test_invalid_rules_name_file_line_column_and_what_was_expected(source, message):
    with pytest.raises(RuleSyntaxError) as error:
        parse_rules(source, "t.rules")
    assert str(error.value) == message


def test_error_positions_point_into_multi_line_files():
    source = 'rule A {\n  title: "t"\n  when: gpu.util > 0.5\n}\nrule B {\n  title: "t"\n' \
             '  when: mean(gpu.sm_activ, 1m) > 0\n}\n'
    with pytest.raises(RuleSyntaxError) as error:
        parse_rules(source, "x/y.rules")
    assert (error.value.path, error.value.line, error.value.column) == ("x/y.rules", 7, 14)


def test_every_shipped_file_parses():
    names = [name for name, _ in builtin_files()]
    assert len(names) == 10
    for name, text in builtin_files():
        assert parse_rules(text, name)


# The fuzz test is tests/test_rules_fuzz.py.


# --- bounds (issue #20, item 5) ------------------------------------------------------------
HUGE = "9" * 309


@pytest.mark.parametrize("clause,column", [
    (f"window: {HUGE}s", 29),
    (f"window: 60s every {HUGE}s", 39),
    (f"warmup: {HUGE}s", 29),
    (f"for: {HUGE}m", 26),
    (f"clear: after {HUGE}h", 34),
    (f"when: mean(gpu.util, {HUGE}s) > 1", 42),
    (f"when: within(gpu.xid, cron.run, ±{HUGE}s)", 54),
    (f"when: zscore(gpu.util, 30s, baseline={HUGE}d) < -3", 58),
    ("window: 8d", 29),
    ("for: 10081m", 26),
])
def test_a_duration_past_the_bound_is_a_located_error(clause, column):
    when = "" if clause.startswith("when") else " when: gpu.util > 1"
    source = f'rule X {{ title: "t" {clause}{when} }}'
    with pytest.raises(RuleSyntaxError) as error:
        parse_rules(source, "t.rules")
    assert str(error.value) == f"t.rules:1:{column}: duration too large (max 7d)"


def test_durations_up_to_the_bound_are_exact():
    [rule] = parse_rules('rule X { title: "t" window: 7d every 1.5s warmup: 0.001ms '
                         'for: 10080m clear: after 168h when: gpu.util > 1 }')
    assert (rule.window_ns, rule.every_ns, rule.warmup_ns) == (MAX_DURATION_NS, 1_500_000_000,
                                                                1000)
    assert rule.for_ns == rule.clear_after_ns == MAX_DURATION_NS
    with pytest.raises(RuleSyntaxError) as error:
        parse_rules('rule X { title: "t" window: 0.' + "0" * 70 + '1s when: gpu.util > 1 }', "t")
    assert str(error.value) == "t:1:29: duration longer than 64 characters"


@pytest.mark.parametrize("literal,message", [
    ("1e999", "number too large (max 1e18)"),
    ("2e18", "number too large (max 1e18)"),
    (HUGE, "number longer than 64 characters"),
    ("0." + "0" * 70 + "1", "number longer than 64 characters"),
])
def test_a_number_past_the_bound_is_a_located_error(literal, message):
    for source, column in ((f'rule X {{ title: "t" when: gpu.util > {literal} }}', 38),
                           (f'rule X {{ title: "t" param: p = -{literal} when: gpu.util > p }}',
                            33)):
        with pytest.raises(RuleSyntaxError) as error:
            parse_rules(source, "t.rules")
        assert str(error.value) == f"t.rules:1:{column}: {message}"
    assert parse_rules('rule X { title: "t" param: p = -1e18 when: gpu.util > 1e18 + p }')


def test_a_megabyte_and_chain_is_refused_at_once():
    chain = 'rule A { title: "t" when: ' + " and ".join(["gpu.util > 0.5"] * 70_000) + " }"
    assert len(chain) > 1 << 20
    started = time.perf_counter()
    with pytest.raises(RuleSyntaxError) as error:
        parse_rules(chain, "big.rules")
    assert str(error.value) == "big.rules:1:1: rule file larger than 131072 bytes (max 128 KiB)"
    # Under the file bound, one rule is bounded by its tokens, before lark sees it.
    rule = 'rule A { title: "t" when: ' + " and ".join(["gpu.util > 0.5"] * 2000) + " }"
    with pytest.raises(RuleSyntaxError) as error:
        parse_rules('rule B { title: "t" when: gpu.util > 1 }\n' + rule, "big.rules")
    assert str(error.value) == f"big.rules:2:1: rule larger than {MAX_RULE_TOKENS} tokens"
    assert time.perf_counter() - started < 1.0


@pytest.mark.parametrize("expression", [
    "not " * 3000 + "gpu.util > 1",
    "- " * 3000 + "gpu.util > 1",
    " + ".join(["gpu.util"] * 1500) + " > 1",
    "coalesce(" * 300 + "gpu.util" + ")" * 300 + " > 1",
    "abs(" * 70 + "gpu.util" + ")" * 70 + " > 1",
])
def test_deep_nesting_is_a_located_error_never_a_recursion_error(expression):
    with pytest.raises(RuleSyntaxError) as error:
        parse_rules(f'rule A {{ title: "t"\n when: {expression} }}', "deep.rules")
    assert error.value.line == 2 and error.value.column > 1
    assert error.value.message == f"expression nested too deeply (max {MAX_DEPTH} levels)"



@pytest.mark.parametrize("expression", ["not " * 1000 + "gpu.util > 1",
                                        "gpu.util" + " * 2" * 1000 + " > 1"])
def test_deep_nesting_in_a_check_expression_is_a_located_error(expression):
    with pytest.raises(RuleSyntaxError) as error:
        parse_expression(expression)
    assert error.value.message == f"expression nested too deeply (max {MAX_DEPTH} levels)"


def test_parentheses_alone_do_not_nest_the_tree():
    [rule] = parse_rules('rule A { title: "t" when: ' + "(" * 500 + "gpu.util > 1" + ")" * 500
                         + " }")
    assert isinstance(rule.when, m.Cmp)


def test_the_shipped_rules_fit_the_bounds_comfortably():
    for name, text in builtin_files():
        assert len(text.encode()) * 4 < MAX_SOURCE_BYTES, name
        for block in _blocks(text):
            assert block.tokens * 4 < MAX_RULE_TOKENS, (name, block.name)
    for rule in (r for _, text in builtin_files() for r in parse_rules(text)):
        check_tree(_parser().parse(rule.text))   # nesting: raises past MAX_DEPTH
        assert _depth(_parser().parse(rule.text)) * 3 < MAX_DEPTH, rule.id


def _depth(tree) -> int:
    return 1 + max((_depth(c) for c in getattr(tree, "children", ())), default=0)


# --- a broken rule costs only itself ------------------------------------------------------
GOOD_A = 'rule A {\n  title: "a"\n  when: gpu.util > 0.5\n}\n'
GOOD_C = 'rule C { title: "c" when: gpu.util > 0.5 }  # "rule D {" in a comment\n'


@pytest.mark.parametrize("broken,where,kept", [
    ('rule B {\n  title: "b"\n  when: gpu.util >\n}\n', "t.rules:8:1: unexpected '}'", "AC"),
    ('rule B {\n  title: "b"\n  when: gpu.util > 1\n',
     "t.rules:8:1: unexpected start of rule C (rule B is not closed); expected", "AC"),
    ('rule B {\n  title: "rule X { }"\n  window: 99999999d\n  when: gpu.util > 1 }\n',
     "t.rules:7:11: duration too large (max 7d)", "AC"),
    ('rule B {\n  title: "b"\n  when: mean(gpu.utl, 1m) > 1 }\n',
     "t.rules:7:14: unknown name 'gpu.utl'", "AC"),
    ('rule A { title: "again" when: gpu.util > 1 }\n', "t.rules:5:1: rule A defined twice",
     "AC"),
    ('rule B { title: "b\udcff" when: gpu.util > 1 }\n',
     "t.rules:5:19: not UTF-8 text (byte 0xff)", "AC"),
    ('rule B { title: "b" when: ' + "not " * 100 + "gpu.util > 1 }\n",
     "t.rules:5:", "AC"),
    # Text after a rule's "}" belongs to its block: it costs that rule, not the next one.
    ('junk rule B { title: "b" when: gpu.util > 1 }\n', "t.rules:5:1: unexpected 'junk'", "BC"),
])
def test_a_broken_rule_costs_only_itself(broken, where, kept):
    source = GOOD_A + broken + GOOD_C
    rules, problems = parse_rules_report(source, "t.rules")
    assert "".join(r.id for r in rules) == kept
    assert len(problems) == 1 and str(problems[0]).startswith(where), problems
    assert rules[-1].line == source.count("\n") and rules[-1].text == GOOD_C.split("  #")[0]
    if kept[0] == "A":
        assert rules[0].text == GOOD_A.strip() and rules[0].line == 1
    with pytest.raises(RuleSyntaxError) as error:   # the strict form: the first problem
        parse_rules(source, "t.rules")
    assert str(error.value) == str(problems[0])


def test_positions_after_recovery_are_those_of_the_file():
    source = GOOD_A + '  rule B { title: "b" when: gpu.util > 0.5 and mean(gpu.utl, 1m) > 0 }\n'
    rules, [problem] = parse_rules_report(source, "t.rules")
    assert [r.id for r in rules] == ["A"]
    assert (problem.line, problem.column) == (5, 53)
    rules, _ = parse_rules_report("\n\n" + GOOD_C + GOOD_A, "t.rules")
    assert [(r.id, r.line) for r in rules] == [("C", 3), ("A", 4)]
    assert rules[1].text == GOOD_A.strip()


def test_a_builtin_file_with_one_rule_broken_keeps_the_others():
    name, text = builtin_files()[3]
    rules = parse_rules(text, name)
    second = rules[1]
    broken = text.replace(second.text, second.text.replace("when:", "when: (", 1))
    kept, problems = parse_rules_report(broken, name)
    assert [r.id for r in kept] == [r.id for r in rules if r.id != second.id]
    assert len(problems) == 1 and problems[0].path == name
    assert second.line <= problems[0].line <= second.line + second.text.count("\n")


def test_a_bug_in_the_parser_costs_only_the_file_it_met(tmp_path, monkeypatch):
    from gpuwhy.rules import loader

    real = loader.parse_rules_report

    def buggy(text: str, path: str):
        if path.endswith("bad.rules"):
            raise TypeError("a bug")
        return real(text, path)

    monkeypatch.setattr(loader, "parse_rules_report", buggy)
    (tmp_path / "bad.rules").write_text(GOOD_A)
    (tmp_path / "ok.rules").write_text(GOOD_C)
    loaded = loader.load_rule_set([str(tmp_path)])
    shipped = sum(len(parse_rules(text)) for _, text in builtin_files())
    assert len(loaded.rules) == shipped + 1 and loaded.rules[-1].id == "C"
    assert [str(p) for p in loaded.problems] == [
        f"{tmp_path / 'bad.rules'}:1:1: internal error while parsing: TypeError: a bug"]
