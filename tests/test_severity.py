"""One severity scale, defined once in gpuwhy/severity.py: its order and older names, the
rule parser's located errors, store migration m103, and (grep-style, like test_layers.py)
that no other module keeps a severity list, rank or mapping of its own."""

from __future__ import annotations

import ast
import re
import sqlite3
from pathlib import Path

import pytest
from sqlite_utils import Database

from gpuwhy import severity as sev
from gpuwhy.rules.loader import builtin_files
from gpuwhy.rules.parser import RuleSyntaxError, parse_rules
from gpuwhy.store import open_store
from gpuwhy.store.migrations import migrations
from gpuwhy.xid import sxid_info, xid_info

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("gpuwhy", "correlator", "store", "webui", "probes")
CORE = REPO / "gpuwhy" / "severity.py"
NAMES = set(sev.SEVERITIES) | set(sev.LEGACY_NAMES)
# A constant that says it holds severities or their order (a field named ``severity``
# holds one value, not a scale).
OWN_SCALE_NAME = re.compile(r"^[A-Z_]*SEVERIT[A-Z_]*$")
# Other vocabularies that share a word with the scale: Python's logging levels; GPU health
# states placed on the scale (its names as values, not a scale of their own).
OTHER_VOCABULARIES = {("gpuwhy/config.py", "LOG_LEVELS"),
                      ("gpuwhy/rules/answer.py", "HEALTH_SEVERITY")}


def test_the_scale_is_ordered_and_maps_the_legacy_names():
    assert sev.SEVERITIES == ("info", "warning", "error", "critical")
    assert [sev.rank(s) for s in sev.SEVERITIES] == [0, 1, 2, 3]
    assert sev.DESCENDING == ("critical", "error", "warning", "info")
    assert (sev.normalise("warn"), sev.normalise("high")) == ("warning", "error")
    assert sev.rank("high") == sev.rank("error") > sev.rank("warning") == sev.rank("warn")
    assert sev.worst(["warning", "high"]) == "error"
    assert sev.worst(["bogus", "info"]) == "info"     # an unknown name loses to any known
    with pytest.raises(sev.UnknownSeverity, match="urgent"):
        sev.normalise("urgent")
    assert [sev.journal_priority(s) for s in sev.DESCENDING] == [2, 3, 4, 6]
    assert sev.journal_priority("high") == 3 and sev.journal_priority("bogus") == 4
    assert sorted(["info", "critical", "warn", "error"], key=sev.sort_key) == \
        ["critical", "error", "warn", "info"]


def test_the_xid_catalogue_is_on_the_scale():
    found = {xid_info(code).severity for code in range(1, 256)}
    found |= {sxid_info(22013, fatal=f).severity for f in (True, False)}
    assert found <= set(sev.SEVERITIES)


def test_the_shipped_rules_use_the_scale_s_own_names():
    for path, text in builtin_files():
        assert not re.search(r"(severity:|->)\s*(warn|high)\b", text), path
        for rule in parse_rules(text, path):
            assert rule.severity in sev.SEVERITIES
            assert all(level in sev.SEVERITIES for _, level in rule.escalations)


@pytest.mark.parametrize("source, bad", [
    ('rule X { title: "t" when: gpu.util > 1 severity: urgent }', "urgent"),
    ('rule X { title: "t" when: gpu.util > 1\n  severity: warn escalate gpu.util > 2 -> severe }',
     "severe"),
])
def test_an_unknown_severity_is_a_located_syntax_error(source, bad):
    with pytest.raises(RuleSyntaxError) as error:
        parse_rules(source, "t.rules")
    line = source[:source.index(bad)].count("\n") + 1
    column = source.index(bad) - (source.rfind("\n", 0, source.index(bad)) + 1) + 1
    assert str(error.value) == f"t.rules:{line}:{column}: expected a severity: {sev.accepted()}"
    assert (error.value.path, error.value.line, error.value.column) == ("t.rules", line, column)


def test_migration_m103_rewrites_stored_legacy_severities(tmp_path):
    path = tmp_path / "old.db"
    old = Database(sqlite3.connect(path))
    migrations.apply(old, stop_before="m103_one_severity_scale")
    old["incidents"].insert_all([
        {"id": i, "opened_at": i, "kind": "rule_finding", "severity": s}
        for i, s in enumerate(["warn", "high", "critical", "info", "error", "warning"], 1)])
    old["rule_findings"].insert_all([
        {"finding_id": f"f{i}", "rule_id": "R", "severity": s, "state": "firing"}
        for i, s in enumerate(["warn", "high", "info"])], pk="finding_id")
    old.close()

    db = open_store(path)
    assert "m103_one_severity_scale" in [m.name for m in migrations.applied(db)]
    assert [r[0] for r in db.execute("select severity from incidents order by id")] == \
        ["warning", "error", "critical", "info", "error", "warning"]
    assert [r[0] for r in db.execute("select severity from rule_findings order by finding_id")
            ] == ["warning", "error", "info"]
    for table in ("incidents", "rule_findings", "xid_codes"):
        stored = {r[0] for r in db.execute(f"select distinct severity from {table}")}
        assert stored <= set(sev.SEVERITIES), table
    db.close()


def _python_files() -> list[Path]:
    return sorted(p for part in SOURCES for p in (REPO / part).rglob("*.py")
                  if p != CORE and "__pycache__" not in p.parts)


def _own_scales(path: Path, root: Path = REPO) -> list[str]:
    """Where ``path`` spells a severity list, rank or mapping itself: a literal holding two
    or more severity names, or a constant named for severities (``SEVERITY_RANK``)."""
    where = str(path.relative_to(root))
    tree = ast.parse(path.read_text(), str(path))
    other = {id(n) for node in ast.walk(tree) if isinstance(node, ast.Assign)
             for target in node.targets
             if isinstance(target, ast.Name) and (where, target.id) in OTHER_VOCABULARIES
             for n in ast.walk(node.value)}
    found = []
    for node in ast.walk(tree):
        if id(node) in other:
            continue
        items: list[ast.expr | None] = []
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = list(node.elts)
        elif isinstance(node, ast.Dict):
            items = list(node.keys)
        names = {i.value for i in items if isinstance(i, ast.Constant) and i.value in NAMES}
        if len(names) >= 2:
            found.append(f"{where}:{node.lineno}: {sorted(names)}")
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [f"{where}:{node.lineno}: {t.id}" for t in targets
                      if isinstance(t, ast.Name) and OWN_SCALE_NAME.search(t.id)
                      and (where, t.id) not in OTHER_VOCABULARIES]
    return found


def test_no_module_but_the_core_one_defines_a_severity_scale():
    found = [hit for path in _python_files() for hit in _own_scales(path)]
    assert found == [], "import them from gpuwhy.severity instead"


def test_the_check_sees_a_scale_of_its_own(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('RANK = {"critical": 0, "high": 1}\nLEVELS = ("warn", "info")\n'
                   'SEVERITY_ORDER = sorted(x)\n')
    assert len(_own_scales(bad, tmp_path)) == 3


def test_web_styles_name_only_the_scale():
    for path in (REPO / "webui").rglob("*"):
        if path.suffix in (".html", ".css", ".js"):
            assert not re.search(r"sev-(warn|high)\b", path.read_text()), path
