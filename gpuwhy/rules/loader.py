"""Find and load rule files: the shipped ones (package data) and the operator's own."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from gpuwhy.rules.model import Rule
from gpuwhy.rules.parser import RuleSyntaxError, parse_rules

SUFFIX = ".rules"


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


def load_file(path: str | os.PathLike[str]) -> list[Rule]:
    """Rules of one file; raises RuleSyntaxError (also for an unreadable file)."""
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise RuleSyntaxError(str(path), 1, 1, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise RuleSyntaxError(str(path), 1, 1, f"not UTF-8 text: {exc.reason}") from None
    return parse_rules(text, str(path))


def load_rules(paths: list[str] | tuple[str, ...] = (), builtin: bool = True) -> list[Rule]:
    """The shipped rules (``builtin``) plus every rule file or folder in ``paths``.

    A rule id defined twice is an error, naming both places.
    """
    rules: list[Rule] = []
    if builtin:
        for name, text in builtin_files():
            rules += parse_rules(text, name)
    for path in paths:
        for file in _files(path):
            rules += load_file(file)
    seen: dict[str, Rule] = {}
    for rule in rules:
        if rule.id in seen:
            raise RuleSyntaxError(rule.path, rule.line, 1, f"rule {rule.id} is already defined "
                                  f"at {seen[rule.id].location}")
        seen[rule.id] = rule
    return rules
