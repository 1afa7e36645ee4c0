"""Find and load rule files: the shipped ones (package data) and the operator's own.

A broken file costs only its own broken rules (parser.py recovers at every ``rule NAME {``):
:func:`load_rule_set` returns the sound rules and a located problem for the rest, and the
shipped rules always load. :func:`load_rules` is the strict form, for callers that must
not run with a partial set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from importlib import resources
from pathlib import Path
from typing import Any

from gpuwhy.rules.model import Rule
from gpuwhy.rules.parser import MAX_SOURCE_BYTES, RuleSyntaxError, parse_rules_report

SUFFIX = ".rules"


@dataclass
class RuleFile:
    """One file as loaded: the rules it gives and what was wrong with the others."""

    path: str
    rules: list[Rule] = field(default_factory=list)
    problems: list[RuleSyntaxError] = field(default_factory=list)


@dataclass
class RuleSet:
    """Every file loaded, in order; ``rules`` are the ones to run (each id once)."""

    files: list[RuleFile] = field(default_factory=list)

    @property
    def rules(self) -> list[Rule]:
        return [rule for file in self.files for rule in file.rules]

    @property
    def problems(self) -> list[RuleSyntaxError]:
        return [problem for file in self.files for problem in file.problems]


def builtin_files() -> list[tuple[str, str]]:
    """(name, text) of every shipped rule file, in name order."""
    folder = resources.files("gpuwhy.rules") / "builtin"
    return sorted((f"builtin/{entry.name}", entry.read_text(encoding="utf-8"))
                  for entry in folder.iterdir() if entry.name.endswith(SUFFIX))


def _files(path: str | os.PathLike[str]) -> list[Path]:
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.name.endswith(SUFFIX))
    return [path]


def rules_from_bytes(data: bytes, path: str) -> RuleFile:
    """The rules of a file's bytes. Bytes that are not UTF-8 cost the rule they are in (the
    parser names them with their line), not the file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="surrogateescape")
    rules, problems = parse_rules_report(text, path)
    return RuleFile(path, rules, problems)


def read_file(path: str | os.PathLike[str]) -> RuleFile:
    """One file's rules and problems (also for a file that cannot be read); never raises."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SOURCE_BYTES + 1)   # a huge file is refused without reading it
    except OSError as exc:
        return RuleFile(str(path), [], [RuleSyntaxError(str(path), 1, 1,
                                                        f"cannot read: {exc.strerror}")])
    return rules_from_bytes(data, str(path))


def load_file(path: str | os.PathLike[str]) -> list[Rule]:
    """Rules of one file; raises RuleSyntaxError (also for an unreadable file)."""
    file = read_file(path)
    if file.problems:
        raise file.problems[0]
    return file.rules


def _parse_text(name: str, text: str) -> RuleFile:
    return RuleFile(name, *parse_rules_report(text, name))


def _guarded(path: str, load: Callable[[], RuleFile]) -> RuleFile:
    try:
        return load()
    except Exception as exc:  # noqa: BLE001 - a bug in the parser costs this file, not the rest
        return RuleFile(path, [], [RuleSyntaxError(
            path, 1, 1, f"internal error while parsing: {type(exc).__name__}: {exc}")])


def load_rule_set(paths: list[str] | tuple[str, ...] = (), builtin: bool = True) -> RuleSet:
    """The shipped rules (``builtin``) plus every rule file or folder in ``paths``, keeping
    every sound rule. A rule id defined again is a problem at the later place (naming the
    first), so an extra file can never replace or drop a shipped rule. Never raises."""
    loaded = RuleSet()
    if builtin:
        for name, text in builtin_files():
            loaded.files.append(_guarded(name, partial(_parse_text, name, text)))
    for path in paths:
        try:
            files = _files(path)
        except OSError as exc:
            loaded.files.append(RuleFile(str(path), [], [RuleSyntaxError(
                str(path), 1, 1, f"cannot read the folder: {exc.strerror}")]))
            continue
        loaded.files += [_guarded(str(file), partial(read_file, file)) for file in files]
    seen: dict[str, Rule] = {}
    for file in loaded.files:
        kept = []
        for rule in file.rules:
            if rule.id in seen:
                file.problems.append(RuleSyntaxError(
                    rule.path, rule.line, 1,
                    f"rule {rule.id} is already defined at {seen[rule.id].location}"))
                continue
            seen[rule.id] = rule
            kept.append(rule)
        file.rules = kept
        file.problems.sort(key=lambda p: (p.line, p.column))
    return loaded


def configured_rule_set(settings: Mapping[str, Any]) -> RuleSet:
    """The rules the service runs: the shipped ones unless ``rules.builtin`` is off, plus the
    files and folders of ``rules.paths`` (colon-separated). Every reader of the answer loads
    the same set (the rules runner, `gpuwhy why`, `gpuwhy mcp`, /metrics)."""
    paths = [p for p in str(settings.get("rules.paths") or "").split(":") if p]
    return load_rule_set(paths, builtin=bool(settings.get("rules.builtin", True)))


def load_rules(paths: list[str] | tuple[str, ...] = (), builtin: bool = True) -> list[Rule]:
    """The shipped rules (``builtin``) plus every rule file or folder in ``paths``.

    Strict: the first problem anywhere is raised (a RuleSyntaxError naming its place; a
    rule id defined twice names both places).
    """
    loaded = load_rule_set(paths, builtin)
    problems = loaded.problems
    if problems:
        raise problems[0]
    return loaded.rules
