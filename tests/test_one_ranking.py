"""One ranking: which cause explains which symptom, and which answer leads, is decided in
``gpuwhy/rules/answer.py`` alone; the live correlator, the evaluation, the CLI, the API and
the alerts call it (issue #56, docs/decisions/0021-one-answer-per-gpu.md).

A module relates findings when it reads what a finding ``explains`` or its ``rule_kind``
(the two facts a ranking is made of). The modules that may read them are listed with why:
they declare, parse, produce, store or show them, and rank nothing. A new reader fails:
relate findings through ``gpuwhy.rules.answer`` (``explains``, ``answering_cause``,
``answers``, ``verdicts``) instead."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuwhy.app import rules_eval_cli as eval_cli
from gpuwhy.rules import answer

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("gpuwhy", "probes", "correlator", "store", "webui")
RELATIONS = {"explains", "rule_kind"}

READERS = {
    "gpuwhy/rules/answer.py": "decides: the one ranking",
    "gpuwhy/rules/parser.py": "parses 'kind:' and 'explains:'",
    "gpuwhy/rules/docs.py": "writes the rule catalogue's explains column",
    "gpuwhy/app/mcp_server.py": "lists the rules as they are declared",
    "correlator/rules/engine.py": "produces findings from their rules",
    "gpuwhy/app/rules_cli.py": "lints and lists rule files",
    "correlator/incidents.py": "stores a finding's fields in its incident; relates through "
                               "answer.explains / answer.answering_cause",
    "correlator/chains.py": "labels a linked finding a symptom in the incident's chain",
    "store/writer.py": "stores a finding's fields",
    "store/queries.py": "reads a finding's fields back",
}


def readers(path: Path) -> int:
    """How often a module reads ``.explains`` / ``.rule_kind`` or a key of those names."""
    count = 0
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr in RELATIONS:
            count += 1
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and node.slice.value in RELATIONS:
            count += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and node.args \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value in RELATIONS:
            count += 1
    return count


def test_only_the_listed_modules_read_what_findings_explain():
    found = {str(p.relative_to(ROOT)) for top in SCANNED for p in (ROOT / top).rglob("*.py")
             if "__pycache__" not in p.parts and readers(p)}
    strangers = sorted(found - set(READERS))
    assert not strangers, (
        f"{strangers} relate findings by 'explains'/'rule_kind' themselves: a second ranking. "
        "Use gpuwhy.rules.answer (explains, answering_cause, answers, verdicts).")
    assert not set(READERS) - found, "a listed module reads them no more: drop its line"


def test_the_evaluation_ranks_with_the_answer():
    how, rank = eval_cli.ranking()
    assert how == "gpuwhy.rules.answer.answers"
    assert eval_cli.answers is answer.answers
