"""The rule language: what parses, the exact errors for what does not, and a fuzz test."""

from __future__ import annotations

import random

import pytest

from gpuwhy.rules import model as m
from gpuwhy.rules.loader import builtin_files
from gpuwhy.rules.parser import RuleSyntaxError, parse_rules

VALID = [
    # (source, what to check on the one rule)
    ('rule A { title: "t" when: gpu.util > 0.5 }',
     lambda r: r.scope == "gpu" and r.severity == "warn" and r.for_ns == 0),
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
     '  clear: after 5m guard: gpu.procs > 1 severity: info escalate gpu.util > 0.9 -> high\n'
     '  evidence: mean(gpu.util, 1m) as u, last(gpu.temp_c, 1m)\n'
     '  cause: "c" fix: "f1" fix: "f2" if gpu.has_tf32 == 1 verify: "v" source: "s" }',
     lambda r: r.clear_after_ns == 300 * 10**9 and len(r.guards) == 1
     and r.escalations[0][1] == "high" and [e[0] for e in r.evidence] == ["u",
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
     "t.rules:1:28: expected a scope: gpu, process"),
    ('rule X { title: "t" severity: urgent when: gpu.util > 1 }',
     "t.rules:1:31: expected a severity: info, warn, high, critical"),
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
    assert len(names) == 8
    for name, text in builtin_files():
        assert parse_rules(text, name)


ALPHABET = ['rule', 'R1', '{', '}', 'title', ':', '"x"', 'when', 'gpu.util', 'mean', '(',
            ')', ',', '60s', '>', '>=', '0.5', 'and', 'or', 'not', 'frac', 'bit', 'gpu.reason',
            'SW_POWER_CAP', 'count', 'journal.xid', 'where', 'code', '==', '79', 'within', '±',
            'in', '[', ']', '~', '"a|b"', 'param', '=', 'escalate', '->', 'high', '-', '*', '/',
            '#', '\n', 'zscore', 'baseline', 'env', '"K"', 'for', 'clear', 'after', 'guard', '.',
            '"', '\\', '1e999', '99999999999999999999d', '(((((', ')))))', '\x00', 'é']


def _mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        position = rng.randrange(len(chars) + 1)
        choice = rng.random()
        if choice < 0.4 and chars:
            del chars[min(position, len(chars) - 1)]
        elif choice < 0.8:
            chars.insert(position, rng.choice(ALPHABET))
        else:
            chars.insert(position, chr(rng.randrange(1, 0x2FF)))
    return "".join(chars)


@pytest.mark.slow
def test_fuzzed_inputs_never_crash_the_parser():
    rng = random.Random(20261130)
    # Short valid rules to mutate (whole shipped rules parse at ~10 ms each: too slow here);
    # every shipped rule is mutated a few times too.
    seeds = [source for source, _ in VALID]
    shipped = [rule.text for _, text in builtin_files() for rule in parse_rules(text)]
    outcomes = {"parsed": 0, "error": 0}
    for i in range(10_500):
        kind = i % 3
        if kind == 0:
            shipped_turn = i % 9 == 0 and i // 9 < 3 * len(shipped)
            base = shipped[(i // 9) % len(shipped)] if shipped_turn else rng.choice(seeds)
            source = _mutate(rng, base)
        elif kind == 1:
            source = " ".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 60)))
        else:
            source = "rule F { title: \"t\" when: " + "(" * rng.randint(0, 300) + "gpu.util" + \
                     ")" * rng.randint(0, 300) + " > 1 }"
        try:
            parse_rules(source, "fuzz.rules")
            outcomes["parsed"] += 1
        except RuleSyntaxError as error:
            assert error.line >= 0 and error.column >= 0 and str(error).startswith("fuzz.rules:")
            outcomes["error"] += 1
    assert outcomes["error"] > 5000 and outcomes["parsed"] > 10   # both paths exercised
