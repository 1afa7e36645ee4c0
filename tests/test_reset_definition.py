"""gpuwhy/reset.py is the one definition of a GPU reset: no other product module spells the
reset controls, states or the reset command's action itself (docstrings aside)."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuwhy.reset import (
    RESET_ACTION,
    RESET_CONTROLS,
    RESET_REQUEST_CONTROLS,
    RESET_STATES,
    action_kind,
    reset_kind,
    state_kind,
)

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("gpuwhy", "correlator", "store", "webui", "probes")
# nvioctl.py is the driver's table of control names that reset.py takes its names from.
# gpu_health.py takes its "resetting" health state's name from reset.py too.
ALLOWED = {REPO / "gpuwhy" / "reset.py", REPO / "gpuwhy" / "nvioctl.py"}
CONTROLS = (*RESET_CONTROLS, *RESET_REQUEST_CONTROLS)
SPELLINGS = (*CONTROLS, *RESET_STATES)


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spelled(path: Path, root: Path = REPO) -> list[str]:
    """The reset spellings among ``path``'s string literals (SQL included)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                id(node) not in skip:
            text = node.value
            # A control anywhere (SQL too); a state as the whole value or quoted in SQL, not
            # in prose (help texts list the states).
            hits += [f"{path.relative_to(root)}:{node.lineno}: {word}" for word in CONTROLS
                     if word in text]
            hits += [f"{path.relative_to(root)}:{node.lineno}: {word}" for word in RESET_STATES
                     if text == word or f"'{word}'" in text]
            if text.endswith(": " + RESET_ACTION):
                hits.append(f"{path.relative_to(root)}:{node.lineno}: {RESET_ACTION!r}")
    return hits


def test_no_module_outside_reset_py_spells_a_reset():
    files = [p for top in PRODUCT for p in (REPO / top).rglob("*.py")
             if p not in ALLOWED and "__pycache__" not in p.parts]
    assert len(files) > 50
    assert [hit for path in files for hit in spelled(path)] == []


def test_no_rule_spells_a_reset_state():
    rules = list((REPO / "gpuwhy" / "rules" / "builtin").glob("*.rules"))
    assert rules
    for path in rules:
        text = path.read_text()
        assert not [w for w in SPELLINGS if f'"{w}"' in text], path


def test_the_check_sees_a_spelled_control_but_not_a_docstring(tmp_path):
    (tmp_path / "x.py").write_text(f'"""Doc {RESET_CONTROLS[0]}."""\nA = "{RESET_STATES[0]}"\n'
                                   f'B = "x: {RESET_ACTION}"\n'
                                   f'C = "where d = \'{RESET_CONTROLS[0]}\'"\n'
                                   f'D = "states: lost, {RESET_STATES[0]}"\n')
    assert spelled(tmp_path / "x.py", tmp_path) == [
        f"x.py:2: {RESET_STATES[0]}", f"x.py:3: {RESET_ACTION!r}", f"x.py:4: {RESET_CONTROLS[0]}"]


def test_the_classes():
    assert [reset_kind(c) for c in (*RESET_CONTROLS, *RESET_REQUEST_CONTROLS, None,
                                    "NV2080_CTRL_CMD_GPU_GET_RESET_STATUS")] == \
        ["reset"] * len(RESET_CONTROLS) + ["request"] * len(RESET_REQUEST_CONTROLS) + ["", ""]
    assert [state_kind(s) for s in ("resetting", "reset_required", "lost", "back", None)] == \
        ["reset", "needed", "needed", "back", ""]
    assert action_kind("nvidia-smi -r: GPU reset") == "request"
    assert action_kind("nvidia-smi -rgc: GPU clocks reset") == action_kind(None) == ""
