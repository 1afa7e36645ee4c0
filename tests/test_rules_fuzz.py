"""Fuzzing the rule loader: >= 10,000 rule files made from the shipped rules by truncation,
byte flips, huge numbers, deep nesting, long chains, random tokens and bytes that are not
UTF-8. Each must load, or give RuleSyntaxError problems that name fuzz.rules:line:col;
nothing else may escape, nothing may hang, and a broken rule must not cost the sound rules
around it.

Whole shipped rules parse in ~5 ms each, too slow for 10,000 cases: most cases are made from
small rules cut out of the shipped ones (title, params, when and one more clause), and only
a few hundred mutate whole shipped rules and files.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

from gpuwhy.rules.loader import RuleFile, builtin_files, read_file, rules_from_bytes
from gpuwhy.rules.parser import MAX_RULE_TOKENS, RuleSyntaxError, _parser, parse_rules

SEED = 20261202
CASES = 10_000
PATH = "fuzz.rules"
SLOWEST_CASE_S = 2.0   # "no hang": the slowest case the bounds allow is well under this

SHIPPED_FILES = [(name, text, parse_rules(text, name)) for name, text in builtin_files()]
SHIPPED = [rule for _, _, rules in SHIPPED_FILES for rule in rules]

ALPHABET = ["rule", "R1", "{", "}", "title", ":", '"x"', "when", "gpu.util", "mean", "(", ")",
            ",", "60s", ">", ">=", "0.5", "and", "or", "not", "frac", "bit", "gpu.reason",
            "SW_POWER_CAP", "count", "journal.xid", "where", "code", "==", "79", "within", "±",
            "in", "[", "]", "~", '"a|b"', "param", "=", "escalate", "->", "high", "-", "*", "/",
            "#", "\n", "zscore", "baseline", "env", '"K"', "for", "clear", "after", "guard",
            ".", '"', "\\", "1e999", "99999999999999999999d", "(((((", ")))))", "\x00", "é",
            "window", "every", "warmup", "evidence", "as", "fix", "if", "severity", "shared",
            "requires", "scope", "process", "\udcff", "rule X {", "} rule Y {", '"(?P<"',
            "9" * 400, "9" * 400 + "s", "7d", "8d", "1e18", "1.0000000000000000001e18",
            "0." + "0" * 80 + "1ms"]
HUGE = ["9" * 309, "9" * 5000, "1e999", "1e308", "2e18", "1e18", "-1e18", "0." + "9" * 80,
        "1" + "0" * 40, "4294967296", "18446744073709551616"]
UNITS = ["ms", "s", "m", "h", "d"]
BAD_BYTES = [b"\xff", b"\xfe\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xc0\xaf",
             b"\xf4\x90\x80\x80", b"\x80", b"\x00", b"\r", b"\x1b[2J"]
NEST = {"not ": "", "- ": "", "abs(": ")", "coalesce(": ")", "(": ")", "mean(": ", 1m)",
        "frac(not ": ", 1m)"}   # opener: closer


def _clauses(rule) -> list[tuple[str, str]]:
    """(kind, text) of every clause of a shipped rule, cut from its text by the tree."""
    [tree] = _parser().parse(rule.text).children
    return [(c.data, rule.text[c.meta.start_pos:c.meta.end_pos]) for c in tree.children[1:]]


CLAUSES = {rule.id: _clauses(rule) for rule in SHIPPED}


def small_rule(rng: random.Random, rule) -> str:
    """A sound rule of a few clauses: title, params, when, and sometimes one more."""
    clauses = CLAUSES[rule.id]
    must = [text for kind, text in clauses if kind in ("title", "params", "when")]
    others = [text for kind, text in clauses if kind not in ("title", "params", "when")]
    chosen = must + rng.sample(others, min(len(others), int(rng.random() < 0.3)))
    return f"rule {rule.id} {{\n  " + "\n  ".join(chosen) + "\n}\n"


def one_clause_rule(rng: random.Random, rule) -> str:
    """The rule's title and one of its other clauses (often no 'when': an error to find)."""
    clauses = CLAUSES[rule.id]
    title = next(text for kind, text in clauses if kind == "title")
    return f"rule {rule.id} {{ {title}\n  {rng.choice(clauses)[1]} }}\n"


def mutate(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        position = rng.randrange(len(chars) + 1)
        choice = rng.random()
        if choice < 0.15:
            del chars[position:]                                          # truncation
        elif choice < 0.35 and chars:
            del chars[min(position, len(chars) - 1)]
        elif choice < 0.55 and chars:
            chars[min(position, len(chars) - 1)] = chr(rng.randrange(1, 0x300))   # flip
        elif choice < 0.65 and chars:
            start = rng.randrange(len(chars))
            chars[position:position] = chars[start:start + rng.randint(1, 40)]   # copy
        else:
            chars.insert(position, rng.choice(ALPHABET))
    return "".join(chars)


def huge_numbers(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        numbers = list(re.finditer(r"(?<![\w.])\d+(?:\.\d+)?(ms|s|m|h|d)?(?![\w.])", text))
        if not numbers:
            break
        found = rng.choice(numbers)
        unit = found.group(1) or (rng.choice(UNITS) if rng.random() < 0.2 else "")
        text = text[:found.start()] + rng.choice(HUGE) + unit + text[found.end():]
    return text


def byte_flips(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        position = rng.randrange(len(out) + 1)
        if rng.random() < 0.5:
            out[position:position] = rng.choice(BAD_BYTES)
        elif out:
            out[min(position, len(out) - 1)] = rng.randrange(256)
    return bytes(out)


def nested(rng: random.Random, rule) -> str:
    opener = rng.choice(list(NEST))
    depth = rng.choice([rng.randint(1, 30), rng.randint(55, 75), rng.randint(55, 75),
                        rng.randint(100, 200)])
    expression = opener * depth + "gpu.util" + NEST[opener] * depth
    return f'rule {rule.id} {{ title: "t" when: {expression} > 0.5 }}\n'


def chain(rng: random.Random, rule, under: bool = False) -> str:
    term = rng.choice(["gpu.util > 0.5", "mean(gpu.util, 1m) >= 0.1", "gpu.procs", "1"])
    op = rng.choice([" and ", " or ", " + ", " * "])
    tokens = len(re.findall(r"[\w.]+|\S", term + op))
    # Short, just over the token bound or far over it (refused unparsed); just under it
    # (the costliest rule there is: ~0.2 s) only ``under`` times.
    bound = MAX_RULE_TOKENS // tokens
    length = bound - 5 if under else rng.choice([rng.randint(2, 60), rng.randint(2, 60),
                                                 bound + rng.randint(1, 3),
                                                 rng.randint(5000, 40_000)])
    return f'rule {rule.id} {{ title: "t" when: ' + op.join([term] * length) + " }\n"


def soup(rng: random.Random) -> str:
    return " ".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 40)))


def check(file: RuleFile, data: bytes) -> None:
    """The contract of every case: sound rules, or problems located in fuzz.rules."""
    lines = data.count(b"\n") + 1
    for problem in file.problems:
        assert type(problem) is RuleSyntaxError, repr(problem)
        assert problem.path == PATH
        assert 1 <= problem.line <= lines and problem.column >= 1, (str(problem), lines)
        assert str(problem) == f"{PATH}:{problem.line}:{problem.column}: {problem.message}"
        assert problem.message
    for rule in file.rules:
        assert rule.path == PATH and 1 <= rule.line <= lines and rule.when is not None


def load(data: bytes) -> tuple[RuleFile, float]:
    started = time.perf_counter()
    try:
        file = rules_from_bytes(data, PATH)
    except Exception as exc:  # noqa: BLE001 - the point: say which input escaped, and how
        raise AssertionError(f"{type(exc).__name__}: {exc} from {data[:300]!r}") from exc
    return file, time.perf_counter() - started


def test_ten_thousand_mutated_rule_files_load_or_name_their_line():
    rng = random.Random(SEED)
    outcomes = {"loaded": 0, "problems": 0, "kept_beside_a_broken_rule": 0}
    slowest = (0.0, b"")
    for i in range(CASES):
        rule = SHIPPED[i % len(SHIPPED)]
        kind = rng.random()
        neighbours = None
        # Shares by cost: a case parses in ~0.3 ms (random tokens, bytes) to ~10 ms (nesting,
        # chains, whole rules near the bounds).
        if i < 3:
            data = chain(rng, rule, under=True).encode()
        elif kind < 0.30:
            data = mutate(rng, small_rule(rng, rule)).encode("utf-8", "surrogateescape")
        elif kind < 0.45:
            data = mutate(rng, one_clause_rule(rng, rule)).encode("utf-8", "surrogateescape")
        elif kind < 0.63:
            data = soup(rng).encode("utf-8", "surrogateescape")
        elif kind < 0.69:
            data = huge_numbers(rng, small_rule(rng, rule)).encode()
        elif kind < 0.83:
            data = byte_flips(rng, rng.choice([small_rule, one_clause_rule])(rng, rule).encode())
        elif kind < 0.845:
            data = nested(rng, rule).encode()
        elif kind < 0.85:
            data = chain(rng, rule).encode()
        elif kind < 0.86:   # a whole shipped rule
            data = mutate(rng, rule.text).encode("utf-8", "surrogateescape")
        else:   # a broken rule between two sound ones: it costs at most the one before
            before, after = rng.sample([r.id for r in SHIPPED if r.id != rule.id], 2)
            make = rng.choice([small_rule, one_clause_rule])
            broken = rng.choice([mutate(rng, make(rng, rule)), mutate(rng, make(rng, rule)),
                                 huge_numbers(rng, make(rng, rule))]).encode(
                                     "utf-8", "surrogateescape")
            if rng.random() < 0.3:
                broken = byte_flips(rng, broken)
            neighbours = (before, after)
            data = f'rule {before} {{ title: "t" when: gpu.util > 0.5 }}\n'.encode() + broken \
                + f'\nrule {after} {{ title: "t" when: gpu.util < 0.5 }}\n'.encode()
        file, seconds = load(data)
        check(file, data)
        slowest = max(slowest, (seconds, data))
        outcomes["problems" if file.problems else "loaded"] += 1
        if neighbours is not None:
            # Text before the broken rule's "rule NAME {" belongs to the block before: it may
            # cost that rule, never the one after (each starts a block at its own line).
            ids = [r.id for r in file.rules]
            assert neighbours[1] in ids, (data, file.problems)
            if file.problems and neighbours[0] in ids:
                outcomes["kept_beside_a_broken_rule"] += 1
    assert slowest[0] < SLOWEST_CASE_S, slowest[1][:200]
    assert outcomes["problems"] > 6000 and outcomes["loaded"] > 300, outcomes
    assert outcomes["kept_beside_a_broken_rule"] > 500, outcomes


def test_mutated_shipped_files_keep_every_rule_the_mutation_did_not_touch(tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)   # so that read_file names the file fuzz.rules
    rng = random.Random(SEED + 1)
    for i in range(24):
        name, text, rules = SHIPPED_FILES[i % len(SHIPPED_FILES)]
        whole = text.encode()
        starts = [whole.index(f"rule {r.id} {{".encode()) for r in rules]
        position = rng.randrange(len(whole))
        hit = max((k for k, start in enumerate(starts) if start <= position), default=-1)
        if i % 2:   # truncated (maybe inside a UTF-8 sequence): every rule before is whole
            data = whole[:position]
            # Cut inside the next rule's "rule NAME {": no block starts there, and that stray
            # text belongs to the rule before (docs/rules.md), which it may cost.
            header = len(f"rule {rules[hit].id} {{") if hit >= 0 else 0
            whole_rules = hit - 1 if hit >= 0 and position < starts[hit] + header else hit
            untouched = [r.id for k, r in enumerate(rules) if k < whole_rules]
        else:   # one byte flipped: it may also uncomment or comment out a neighbour's start
            data = whole[:position] + bytes([rng.randrange(256)]) + whole[position + 1:]
            untouched = [r.id for k, r in enumerate(rules) if k < hit - 1 or k > hit + 1]
        Path(PATH).write_bytes(data)
        file = read_file(PATH)
        check(file, data)
        assert set(untouched) <= {r.id for r in file.rules}, (name, position, file.problems)
