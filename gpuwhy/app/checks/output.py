"""How check and compare results are shown: a text table, and JUnit XML for CI systems."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from gpuwhy.app.checks.expectations import Result


def shown(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[shown(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in cells]
    return "\n".join(lines)


def results_table(results: Sequence[Result]) -> str:
    return table(("expectation", "observed", "result"),
                 [(r.expectation, r.observed, r.outcome
                   + (f" (missing: {', '.join(r.missing)})" if r.passed is None else ""))
                  for r in results])


def write_junit(path: str | Path, suite: str, cases: Sequence[tuple[str, bool | None, str]],
                seconds: float) -> None:
    """One testcase per (name, passed, message); passed None is a failure too ("no data")."""
    failures = sum(1 for _, passed, _ in cases if not passed)
    root = ET.Element("testsuites")
    element = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)),
                            failures=str(failures), errors="0", time=f"{seconds:.1f}")
    for name, passed, message in cases:
        case = ET.SubElement(element, "testcase", classname=suite, name=name, time="0")
        if not passed:
            failure = ET.SubElement(case, "failure", message=message,
                                    type="no data" if passed is None else "failed")
            failure.text = message
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
