"""Type-check gpuwhy as installed: mypy over a symlink view of the package, paths mapped back.

The parts (probes/, correlator/, store/, webui/) install as gpuwhy.probes, gpuwhy.correlator, ...
through setuptools' `package-dir` mapping, which mypy cannot follow: it resolves modules by
folder, and the editable install's import hook is code mypy never runs. So this script lays
out the installed tree in a temporary folder -- gpuwhy/ holding a symlink to every entry of
the checkout's gpuwhy/ plus one per mapped package (gpuwhy/store -> ../store, read from
pyproject.toml) -- runs mypy over the whole of it (`-p gpuwhy`, the settings in pyproject.toml's
[tool.mypy]) and prints its messages with the checkout's real paths. The cache stays in the
checkout (.mypy_cache; MYPY_CACHE_DIR moves it), so a second run only re-checks what changed.

    scripts/typecheck.py                        every error in the tree
    scripts/typecheck.py gpuwhy/rules store/queries.py
                                                only errors in those files and folders
    scripts/typecheck.py --clean                only the files that must stay clean (CLEAN)
    scripts/typecheck.py --counts               errors per file, as JSON
    scripts/typecheck.py --write-baseline       rewrite tests/data/mypy-baseline.json

The whole tree is checked every time (what a target imports must be analysed anyway, and one
set of options keeps the cache valid); targets only filter what is reported. The exit status
is 1 when a reported error remains, 0 otherwise (and after --write-baseline).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from collections import Counter
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "gpuwhy"
BASELINE = REPO / "tests" / "data" / "mypy-baseline.json"
# What must type-check without an error (tests/test_typecheck.py): the core, the
# applications, and every part, but for the modules the baseline still grants errors
# (EXCEPT; a folder covers every file under it): the demo harness's corpus.
CLEAN = ("gpuwhy/", "store/", "probes/", "correlator/", "webui/")
EXCEPT = ("gpuwhy/app/demo/corpus/",)
# mypy's last line: "Success: no issues found in 208 source files" or
# "Found 324 errors in 30 files (checked 208 source files)"
SUMMARY = re.compile(r"^(?:Success: no issues found in |Found \d+ errors? in \d+ files? "
                     r"\(checked )(?P<checked>\d+) source files?\)?$")
# "path:line: error: ..." (and "path:line:col: error:" should column numbers be switched on)
ERROR = re.compile(r"^(?P<path>[^:\s]+\.pyi?):\d+(?::\d+)?: error: ")


def package_dirs() -> dict[str, str]:
    """pyproject's package-dir entries for gpuwhy's subpackages: {"gpuwhy.store": "store"}."""
    with open(REPO / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"].get("package-dir", {})
    return {name: folder for name, folder in mapping.items() if name.startswith(PACKAGE + ".")}


def build_view(root: Path) -> dict[str, str]:
    """Lay the installed tree out under root; {view prefix: checkout prefix}, both relative."""
    mapped = package_dirs()
    pkg = root / PACKAGE
    pkg.mkdir()
    top_names = {name.split(".")[1] for name in mapped}
    for entry in sorted((REPO / PACKAGE).iterdir()):
        if entry.name == "__pycache__" or entry.name in top_names:
            continue
        (pkg / entry.name).symlink_to(entry)
    prefixes = {f"{PACKAGE}/": f"{PACKAGE}/"}
    # Shallow names first, so a nested mapping (gpuwhy.a.b) lands inside its parent's link.
    for name, folder in sorted(mapped.items(), key=lambda item: item[0].count(".")):
        rel = Path(*name.split("."))
        if not (root / rel).exists():
            (root / rel).symlink_to(REPO / folder, target_is_directory=True)
        prefixes[rel.as_posix() + "/"] = folder.rstrip("/") + "/"
    return prefixes


def to_checkout(path: str, prefixes: dict[str, str], view: Path) -> str:
    """A path as mypy printed it (relative to the view, or absolute in it) -> checkout-relative."""
    if os.path.isabs(path):
        try:
            path = Path(path).relative_to(view).as_posix()
        except ValueError:
            return path
    for prefix in sorted(prefixes, key=len, reverse=True):
        if path.startswith(prefix):
            return prefixes[prefix] + path[len(prefix):]
    return path


class Run(NamedTuple):
    lines: list[str]        # mypy's messages, with checkout paths
    checked: int            # source files mypy says it checked
    files: int              # .py files in the view: checked should be no fewer


def run_mypy() -> Run:
    """mypy over the whole installed tree. Exits when mypy did not run to the end (not
    installed, bad options, a crash): no output is never taken for no error."""
    with tempfile.TemporaryDirectory(prefix="gpuwhy-typecheck-") as tmp:
        view = Path(tmp).resolve()
        prefixes = build_view(view)
        files = sum(name.endswith(".py") for folder, _, names in
                    os.walk(view / PACKAGE, followlinks=True)
                    if "__pycache__" not in folder for name in names)
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
               "--cache-dir", os.environ.get("MYPY_CACHE_DIR", str(REPO / ".mypy_cache")),
               "--no-color-output", "-p", PACKAGE]
        proc = subprocess.run(cmd, cwd=view, capture_output=True, text=True,
                              env={**os.environ, "MYPY_FORCE_COLOR": "0"})
        out = proc.stdout.splitlines()
        summary = SUMMARY.match(out[-1]) if out else None
        if proc.returncode not in (0, 1) or summary is None:
            sys.stderr.write(proc.stdout + proc.stderr)
            raise SystemExit(f"mypy did not finish (status {proc.returncode}): see above")
        lines = []
        for line in out[:-1]:
            head, sep, rest = line.partition(":")
            if sep and head.endswith((".py", ".pyi")):
                line = to_checkout(head, prefixes, view) + sep + rest
            lines.append(line)
        return Run(lines, int(summary["checked"]), files)


def selected(path: str, targets: list[str] | tuple[str, ...]) -> bool:
    """Whether a checkout-relative file is one of the targets, lies under one, or matches one
    (``gpuwhy/*.py``: the files of that folder, not of its subfolders)."""
    if not targets:
        return True
    return any(fnmatch.fnmatch(path, t) and "/" not in path[t.rindex("/") + 1:] if "*" in t
               else path == t or path.startswith(t.rstrip("/") + "/") for t in targets)


def clean(path: str) -> bool:
    """Whether a checkout-relative file must have no error."""
    return selected(path, CLEAN) and not selected(path, EXCEPT)


def counts(lines: list[str]) -> dict[str, int]:
    """Errors per checkout-relative file."""
    found: Counter[str] = Counter()
    for line in lines:
        m = ERROR.match(line)
        if m:
            found[m["path"]] += 1
    return dict(sorted(found.items()))


def report(lines: list[str], targets: list[str]) -> list[str]:
    """mypy's lines (errors and their notes) that belong to the targets' files."""
    return [line for line in lines
            if (m := re.match(r"^([^:\s]+\.pyi?):", line)) and selected(m[1], targets)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*",
                    help="checkout files or folders to report on (default: all of them)")
    ap.add_argument("--clean", action="store_true",
                    help="report on the files that must stay clean (" + " ".join(CLEAN) + ")")
    ap.add_argument("--counts", action="store_true", help="print errors per file as JSON")
    ap.add_argument("--write-baseline", action="store_true",
                    help=f"write the per-file counts to {BASELINE.relative_to(REPO)}")
    args = ap.parse_args(argv)
    if args.write_baseline and (args.targets or args.clean):
        ap.error("--write-baseline counts the whole tree: no targets, no --clean")
    targets = [Path(t).resolve().relative_to(REPO).as_posix() if os.path.exists(t) else t
               for t in args.targets]
    lines = run_mypy().lines
    keep = (lambda path: clean(path) and selected(path, targets)) if args.clean else \
        (lambda path: selected(path, targets))
    shown = [line for line in report(lines, targets) if keep(line.partition(":")[0])]
    per_file = {p: n for p, n in counts(lines).items() if keep(p)}
    if args.write_baseline:
        for path in [p for p in per_file if clean(p)]:     # the baseline never excuses these
            print(f"{path}: {per_file.pop(path)} errors where there must be none: left out; "
                  f"fix them (scripts/typecheck.py {path})", file=sys.stderr)
        BASELINE.write_text(json.dumps(per_file, indent=1) + "\n")
        print(f"{BASELINE.relative_to(REPO)}: {sum(per_file.values())} errors "
              f"in {len(per_file)} files")
        return 0
    elif args.counts:
        print(json.dumps(per_file, indent=1))
    else:
        print("\n".join(shown) if shown else "no errors")
        if per_file:
            print(f"{sum(per_file.values())} errors in {len(per_file)} files", file=sys.stderr)
    return 1 if per_file else 0


if __name__ == "__main__":
    sys.exit(main())
