"""The store owns its SQL: no module outside ``store/`` holds SQL text or runs a statement.

The decide stage computes plain values and the store applies them (DESIGN.md,
docs/decisions/0020-store-owns-sql.md). Modules not yet moved are listed with how many SQL
strings, ``execute`` calls and ``db["table"]`` (or ``db.table(...)``) accesses they hold;
the list can only shrink: a module over its count fails, and so does one under it (lower
its line, or drop it at zero)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("gpuwhy", "probes", "correlator", "webui")

# SQL as code writes it, not as prose: a docstring's "select the GPU" is not counted
SQL_TEXT = re.compile(
    r"\b(select\b[\s\S]*\bfrom\b|insert\s+(or\s+\w+\s+)?into\b|update\s+\w+\s+set\b|"
    r"delete\s+from\b|(create|drop|alter)\s+(temp\s+)?(table|index|view|trigger)\b|"
    r"pragma\s+\w+)", re.I)
EXECUTE = {"execute", "executemany", "executescript", "execute_returning_dicts"}

# Module (relative path) -> SQL strings + execute calls + db["table"] accesses, today.
ALLOWED: dict[str, int] = {}     # none left (2026-12-07)


def sql_count(path: Path) -> int:
    """SQL strings (docstrings aside), ``.execute(...)``-like calls and ``db[...]`` or
    ``db.table(...)`` table accesses in one module."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) and \
                isinstance(node.body[0].value, ast.Constant):
            skip.add(id(node.body[0].value))
        if isinstance(node, ast.JoinedStr):         # its parts are counted as one string
            skip.update(id(part) for part in node.values)
    found = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(part.value if isinstance(part, ast.Constant) else " x "
                           for part in node.values)
            found += bool(SQL_TEXT.search(text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in skip:
            found += bool(SQL_TEXT.search(node.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in EXECUTE:
            found += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "table" and _names_a_db(node.func.value):
            found += 1                              # db.table("name"), as db["name"]
        elif isinstance(node, ast.Subscript) and _names_a_db(node.value) and \
                isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            found += 1
    return found


def _names_a_db(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id in ("db", "store", "database")) or \
        (isinstance(node, ast.Attribute) and node.attr in ("db", "store", "database"))


def counts() -> dict[str, int]:
    found = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            n = sql_count(path)
            if n:
                found[str(path.relative_to(ROOT))] = n
    return found


def test_sql_only_in_the_store() -> None:
    found = counts()
    grown = {m: (n, ALLOWED.get(m, 0)) for m, n in found.items() if n > ALLOWED.get(m, 0)}
    assert not grown, f"SQL outside store/ (module: (found, allowed)); move it to a store " \
                      f"module: {grown}"
    shrunk = {m: (found.get(m, 0), n) for m, n in ALLOWED.items() if found.get(m, 0) < n}
    assert not shrunk, f"less SQL than allowed (module: (found, allowed)): lower ALLOWED " \
                       f"in {__file__}: {shrunk}"


def test_the_scan_sees_sql_and_not_prose(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""Select the GPU from the list; update its state."""\n'
                      'def f(db, t):\n'
                      '    """Insert into nothing: prose."""\n'
                      '    db.execute(f"select id from {t} where x = ?", [1])\n'
                      '    db["incidents"].insert({})\n'
                      '    db.table("gpus").upsert({}, pk="id")\n'
                      '    return "update gpus set health = ?"\n')
    assert sql_count(module) == 5    # execute, its f-string, db[...], db.table(), the update
