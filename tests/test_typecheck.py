"""mypy over the installed package (scripts/typecheck.py): the clean part stays clean, the rest
may only get better.

One whole-tree run serves both tests. The core, gpuwhy/'s applications, the store and the
sources (typecheck.CLEAN, less typecheck.EXCEPT) must have no error at all. Every other
module may have at most the errors tests/data/mypy-baseline.json grants it (a module it does
not name: none); one that has fewer must lower its entry, so that the gain is kept:
`scripts/typecheck.py --write-baseline`.
"""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REWRITE = "scripts/typecheck.py --write-baseline"


def _load_script():
    spec = importlib.util.spec_from_file_location("typecheck", REPO / "scripts/typecheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


typecheck = _load_script()


@pytest.fixture(scope="module")     # a cold mypy run over the tree: ~30 s (warm: ~5 s)
def mypy_run():
    return typecheck.run_mypy()


@pytest.fixture(scope="module")
def mypy_lines(mypy_run) -> list[str]:
    return mypy_run.lines


@pytest.mark.slow
def test_mypy_checked_every_module_of_the_view(mypy_run):
    assert mypy_run.checked >= mypy_run.files > 100


@pytest.mark.slow
def test_clean_modules_have_no_error(mypy_lines):
    errors = [line for line in mypy_lines
              if (m := typecheck.ERROR.match(line)) and typecheck.clean(m["path"])]
    assert not errors, "mypy errors where there must be none:\n" + "\n".join(errors)


@pytest.mark.slow
def test_no_module_worse_than_the_baseline(mypy_lines):
    baseline = json.loads(typecheck.BASELINE.read_text())
    found = {path: n for path, n in typecheck.counts(mypy_lines).items()
             if not typecheck.clean(path)}         # those: test_clean_modules_have_no_error
    worse = [f"{path}: {n} errors, the baseline allows {baseline.get(path, 0)}"
             for path, n in found.items() if n > baseline.get(path, 0)]
    shown = [line for line in mypy_lines
             if (m := typecheck.ERROR.match(line)) and m["path"] in
             {w.partition(":")[0] for w in worse}]
    assert not worse, ("\n".join(worse) + "\n\nfix them (scripts/typecheck.py FILE shows "
                       "them):\n" + "\n".join(shown))
    better = [f"{path}: {found.get(path, 0)} errors, the baseline says {n}"
              for path, n in baseline.items() if found.get(path, 0) < n]
    assert not better, ("fewer errors than the baseline records: lower it (" + REWRITE
                        + "):\n" + "\n".join(better))


def test_baseline_never_grants_errors_to_a_clean_module():
    baseline = json.loads(typecheck.BASELINE.read_text())
    assert not [path for path in baseline if typecheck.clean(path)]
    assert all(isinstance(n, int) and n > 0 for n in baseline.values())


@pytest.mark.parametrize("path, expected", [
    ("gpuwhy/config.py", True), ("gpuwhy/rules/parser.py", True),
    ("gpuwhy/app/checks_cli.py", True), ("gpuwhy/app/checks/baseline.py", True),
    ("gpuwhy/app/demo/corpus/host.py", False),
    ("store/queries.py", True), ("store/writer.py", True), ("probes/gpu/nvml.py", True),
    ("probes/engines/source.py", True), ("correlator/busy.py", True),
    ("webui/gpus.py", True)])
def test_clean_covers_the_core_the_applications_and_every_part(path, expected):
    assert typecheck.clean(path) is expected


def test_targets_select_files_folders_and_one_folder_level():
    assert typecheck.selected("gpuwhy/config.py", ["gpuwhy/*.py"])
    assert not typecheck.selected("gpuwhy/rules/parser.py", ["gpuwhy/*.py"])
    assert typecheck.selected("gpuwhy/rules/parser.py", ["gpuwhy/rules"])
    assert not typecheck.selected("gpuwhy/rulesx.py", ["gpuwhy/rules"])
    assert typecheck.selected("store/queries.py", ["store/queries.py"])


def test_view_maps_paths_back_to_the_checkout(tmp_path):
    prefixes = typecheck.build_view(tmp_path)
    assert (tmp_path / "gpuwhy/store/queries.py").resolve() == REPO / "store/queries.py"
    assert (tmp_path / "gpuwhy/config.py").resolve() == REPO / "gpuwhy/config.py"
    assert (tmp_path / "gpuwhy/correlator/rules").resolve() == REPO / "correlator/rules"
    for shown, real in [("gpuwhy/store/queries.py", "store/queries.py"),
                        ("gpuwhy/webui/reports/svg.py", "webui/reports/svg.py"),
                        ("gpuwhy/rules/parser.py", "gpuwhy/rules/parser.py"),
                        (str(tmp_path / "gpuwhy/probes/fdtrack.py"), "probes/fdtrack.py")]:
        assert typecheck.to_checkout(shown, prefixes, tmp_path) == real
