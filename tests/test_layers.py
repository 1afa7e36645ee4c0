"""The layers drawn in docs/architecture.md hold: every module's imports are walked (top-level,
inside functions and under TYPE_CHECKING alike) and an arrow the picture forbids fails.

Sources publish (probes), the correlator decides and writes, the store keeps and offers the
one read API, the web view reads the store and core only; core imports no part. Command
lines, the service and the checks, deploy and demo applications sit on top and may import
any part; nothing below them imports them.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PARTS = ("probes", "correlator", "store", "webui")
# What each layer may import, besides itself.
ALLOWED = {
    "core": set(),
    "probes": {"core"},
    "store": {"core"},
    "correlator": {"core", "store"},
    "webui": {"core", "store"},
}
# The applications: gpuwhy/app/ (every command, the service wiring, checks, deploy, the demo
# harness) and `python -m gpuwhy`.
APP = ("gpuwhy.app", "gpuwhy.__main__")


def module_name(path: Path) -> str:
    """The dotted name a file of this repository is installed under."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if parts[0] == "gpuwhy" else ["gpuwhy", *parts])


def is_app(module: str) -> bool:
    return module in APP or module.startswith("gpuwhy.app.")


def layer(module: str) -> str:
    """``app``, ``core`` or the part a gpuwhy module belongs to."""
    if is_app(module):
        return "app"
    second = module.split(".")[1] if "." in module else ""
    return second if second in PARTS else "core"


def is_module(name: str) -> bool:
    """Whether a dotted gpuwhy name is a module or package of this repository."""
    parts = name.split(".")
    if parts[0] != "gpuwhy" or len(parts) < 2:
        return False
    base = REPO / parts[1] if parts[1] in PARTS else REPO / "gpuwhy" / parts[1]
    where = base.joinpath(*parts[2:])
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every gpuwhy import in ``path``."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from gpuwhy.store import feed` imports the module feed (its package's
            # __init__ only runs first); `from gpuwhy.store.feed import x` imports feed
            modules = [f"{target}.{alias.name}" for alias in node.names
                       if is_module(f"{target}.{alias.name}")]
            found += [(node.lineno, name) for name in modules or [target]]
    return [(line, name) for line, name in found if name == "gpuwhy"
            or name.startswith("gpuwhy.")]


def forbidden(module: str, imported: str) -> str | None:
    """Why ``module`` may not import ``imported``, or None when the arrow is allowed."""
    if imported in ("gpuwhy", "gpuwhy.__init__"):
        return None
    source, target = layer(module), layer(imported)
    if source == "app":
        return None
    if target == "app":
        return f"{source} imports the application {imported}"
    if target != source and target not in ALLOWED[source]:
        return f"{source} imports {target} ({imported})"
    return None


def product_files() -> list[Path]:
    files = list((REPO / "gpuwhy").rglob("*.py"))
    for part in PARTS:
        files += (REPO / part).rglob("*.py")
    return sorted(files)


def test_every_module_keeps_to_its_layer():
    wrong = []
    for path in product_files():
        module = module_name(path)
        for line, imported in imports_of(path, module):
            reason = forbidden(module, imported)
            if reason:
                wrong.append(f"{path.relative_to(REPO)}:{line}: {reason}")
    assert wrong == []


def test_the_walk_sees_every_part():
    layers = {layer(module_name(p)) for p in product_files()}
    assert layers == {"app", "core", *PARTS}
    assert len(product_files()) > 100


@pytest.mark.parametrize(("module", "imported", "allowed"), [
    ("gpuwhy.webui.gpus", "gpuwhy.correlator.report", False),
    ("gpuwhy.webui.gpus", "gpuwhy.store.queries", True),
    ("gpuwhy.store.writer", "gpuwhy.probes.gpu.sim", False),
    ("gpuwhy.correlator.incidents", "gpuwhy.store.queries", True),
    ("gpuwhy.correlator.incidents", "gpuwhy.webui", False),
    ("gpuwhy.probes.fdtrack", "gpuwhy.store", False),
    ("gpuwhy.identity", "gpuwhy.probes.fdtrack", False),
    ("gpuwhy.rules.model", "gpuwhy.correlator.rules.engine", False),
    ("gpuwhy.correlator.rules.engine", "gpuwhy.rules.model", True),
    ("gpuwhy.correlator.rules.engine", "gpuwhy.app.demo.synthetic_signals", False),
    ("gpuwhy.store.queries", "gpuwhy.app.cli", False),
    ("gpuwhy.probes.gpu.runner", "gpuwhy.app.gpu_cli", False),
    ("gpuwhy.app.cli", "gpuwhy.webui", True),
    ("gpuwhy.app.demo.scenarios", "gpuwhy.app.incidents_cli", True),
    ("gpuwhy.app.db_cli", "gpuwhy.probes.gpu.sim", True),
])
def test_the_rules_of_the_picture(module, imported, allowed):
    assert (forbidden(module, imported) is None) is allowed


def test_relative_and_lazy_imports_are_walked(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    source = tmp_path / "webui" / "page.py"
    for module_file in ("webui/db.py", "correlator/chains.py", "gpuwhy/app/cli.py"):
        (tmp_path / module_file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module_file).touch()
    source.write_text("from . import db\n"
                      "from ..correlator import chains\n"
                      "from ..store import not_a_module\n"
                      "def view():\n"
                      "    from gpuwhy.app import cli\n")
    module = module_name(source)
    assert module == "gpuwhy.webui.page"
    imported = [name for _, name in imports_of(source, module)]
    assert imported == ["gpuwhy.webui.db", "gpuwhy.correlator.chains", "gpuwhy.store",
                        "gpuwhy.app.cli"]
    assert [forbidden(module, name) for name in imported] == [
        None, "webui imports correlator (gpuwhy.correlator.chains)", None,
        "webui imports the application gpuwhy.app.cli"]


def test_a_production_run_loads_no_harness():
    """The demo harness (scenarios, corpora, stand-ins) is under gpuwhy/app/demo for tests,
    demos and the evaluation: the command line and the service load none of it."""
    probe = ("import sys, gpuwhy.app.cli, gpuwhy.app.service, gpuwhy.app.status, "
             "gpuwhy.app.why_cli; "
             "print([m for m in sys.modules if m.startswith('gpuwhy.app.demo')])")
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0 and ran.stdout.strip() == "[]", ran.stdout + ran.stderr


def test_no_command_is_left_inside_a_part():
    """Every command lives in gpuwhy/app/: no part keeps a cli module of its own."""
    left = [str(p.relative_to(REPO)) for part in PARTS for p in (REPO / part).rglob("*cli*.py")]
    left += [str(p.relative_to(REPO)) for p in (REPO / "gpuwhy").glob("*cli*.py")]
    assert left == []


# Module names that recur, each kept for one meaning at each layer: the web view's pages are
# named for what they show (its GPU pages, incident pages, stacks pages, /healthz) beside the
# part that keeps or decides that thing; every source package has its own `source` (or the
# GPU source's and the rules' `runner`) with the same role.
SHARED_NAMES = {
    "gpus": {"probes/klog/gpus.py", "webui/gpus.py"},
    "health": {"store/health.py", "webui/health.py"},
    "incidents": {"correlator/incidents.py", "webui/incidents.py"},
    "stacks": {"store/stacks.py", "webui/stacks.py"},
    "runner": {"correlator/rules/runner.py", "probes/gpu/runner.py"},
    "source": {"probes/cron/source.py", "probes/engines/source.py", "probes/gpu/source.py",
               "probes/klog/source.py"},
}


def test_one_meaning_per_module_name():
    """A module name names one thing across the tree (issue #55, item 5): no new name is
    shared but the few above, each with its reason."""
    by_name: dict[str, set[str]] = {}
    for path in product_files():
        if path.name != "__init__.py":
            by_name.setdefault(path.stem, set()).add(str(path.relative_to(REPO)))
    shared = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert shared == SHARED_NAMES


def import_cycles() -> list[list[str]]:
    """The groups of modules that import one another round in a circle (Tarjan's strongly
    connected components over every import, lazy and TYPE_CHECKING ones too)."""
    graph: dict[str, set[str]] = {}
    for path in product_files():
        module = module_name(path)
        graph.setdefault(module, set()).update(name for _, name in imports_of(path, module))
    for module, imported in graph.items():
        graph[module] = {name for name in imported if name in graph and name != module}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for name in graph[module]:
            if name not in index:
                visit(name)
                low[module] = min(low[module], low[name])
            elif name in on_stack:
                low[module] = min(low[module], index[name])
        if low[module] == index[module]:
            group = []
            while True:
                name = stack.pop()
                on_stack.discard(name)
                group.append(name)
                if name == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycles():
    """No module imports, even lazily or for types only, one that imports it back: a cycle
    hidden by an import inside a function is a floor drawn wrong (issue #55, item 3)."""
    assert import_cycles() == []


def test_the_cycle_finder_finds_one(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "a.py").write_text("def f():\n    from gpuwhy.store import b\n")
    (tmp_path / "store" / "b.py").write_text("from gpuwhy.store.a import f\n")
    assert import_cycles() == [["gpuwhy.store.a", "gpuwhy.store.b"]]


def procfs_uses(source: str) -> list[str]:
    """Where a module's code (not its comments or docstrings) names a /proc path, takes a
    ``proc_root`` or imports gpuwhy.proc (the readers of procfs)."""
    tree = ast.parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings and "/proc" in node.value:
            found.append(f"{line}: {node.value[:40]!r}")
        elif (isinstance(node, ast.Name) and node.id == "proc_root") or \
                (isinstance(node, ast.arg) and node.arg == "proc_root") or \
                (isinstance(node, ast.keyword) and node.arg == "proc_root") or \
                (isinstance(node, ast.Attribute) and node.attr == "proc_root"):
            found.append(f"{line}: proc_root")
        elif isinstance(node, ast.ImportFrom) and node.module == "gpuwhy.proc":
            found.append(f"{line}: from gpuwhy.proc")
    return found


def test_the_correlator_reads_no_procfs():
    """Issue #55: what the decide stage and the rules know of a process comes from the
    probes, through the bus and the store (its environment too: ProcessSeen.env)."""
    uses = {str(path.relative_to(REPO)): found for path in sorted((REPO / "correlator").rglob(
        "*.py")) if (found := procfs_uses(path.read_text()))}
    assert uses == {}
    assert procfs_uses('"""Reads /proc."""\n# /proc\nx = 1\n') == []
    assert len(procfs_uses('open("/proc/1/environ")\ndef f(proc_root): pass\n')) == 2
