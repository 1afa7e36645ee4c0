"""One timestamp formatter, its zone always shown: gpuwhy.text.format_ts for every time the
CLI, the reports, the web pages and the log lines print, GpuwhyCharts.clock (charts.js) for
the few the browser writes, with the browser's zone named on the page.

The walks below keep it so: a module that formats a time on its own (strftime, isoformat,
fromtimestamp, a strftime pattern, a str-returning "when"/"clock" helper that does not go
through format_ts) fails here unless it is allow-listed with its reason.
"""

from __future__ import annotations

import ast
import logging
import re
import time
from pathlib import Path

import pytest

from gpuwhy.text import format_ts

REPO = Path(__file__).resolve().parent.parent
TS = 1_700_000_000_123_456_789          # 2023-11-14 22:13:20.123 UTC, winter in Europe
SUMMER = 1_690_000_000_000_000_000      # 2023-07-22 04:26:40 UTC


@pytest.fixture
def local_zone(monkeypatch):
    """Set the process's local zone (TZ, POSIX rules: no tzdata needed); restored after."""

    def use(tz: str) -> None:
        monkeypatch.setenv("TZ", tz)
        time.tzset()

    yield use
    monkeypatch.undo()
    time.tzset()


# --- (a) what the formatter prints --------------------------------------------------------

def test_utc_says_utc():
    assert format_ts(TS, utc=True) == "2023-11-14 22:13:20.123 UTC"
    assert format_ts(TS, "s", utc=True) == "2023-11-14 22:13:20 UTC"
    assert format_ts(TS, "min", utc=True) == "2023-11-14 22:13 UTC"
    assert format_ts(TS, "s", date=False, utc=True) == "22:13:20 UTC"
    assert format_ts(None) == "-"


@pytest.mark.parametrize(("tz", "moment", "shown"), [
    ("UTC0", TS, "2023-11-14 22:13:20.123 UTC"),
    ("CET-1CEST,M3.5.0,M10.5.0/3", TS, "2023-11-14 23:13:20.123 CET"),
    ("CET-1CEST,M3.5.0,M10.5.0/3", SUMMER, "2023-07-22 06:26:40.000 CEST"),
    ("EST5EDT,M3.2.0,M11.1.0", SUMMER, "2023-07-22 00:26:40.000 EDT"),
    ("<+0530>-5:30", TS, "2023-11-15 03:43:20.123 +05:30"),     # numeric abbreviation
    ("<-03>3", TS, "2023-11-14 19:13:20.123 -03:00"),
])
def test_local_time_carries_its_zone(local_zone, tz, moment, shown):
    local_zone(tz)
    assert format_ts(moment) == shown
    assert format_ts(moment, utc=True).endswith(" UTC")        # utc=True ignores TZ


def test_the_web_pages_reports_and_logs_use_it(local_zone):
    from gpuwhy.app.cli import _LogFormatter
    from gpuwhy.webui import filters
    from gpuwhy.webui.reports import report

    local_zone("CET-1CEST,M3.5.0,M10.5.0/3")
    assert filters.when is format_ts                              # the Jinja `when` filter
    assert report._when(TS) == format_ts(TS, "s") == "2023-11-14 23:13:20 CET"
    record = logging.LogRecord("gpuwhy", logging.INFO, __file__, 1, "hello", None, None)
    record.created = TS / 1e9
    line = _LogFormatter("%(asctime)s %(message)s").format(record)
    assert line == "2023-11-14 23:13:20.123 CET hello"


# --- (b) no other Python module formats a time for people ----------------------------------

SKIP_DIRS = {"tests", ".venv", "node_modules", "build", "dist", "__pycache__"}
TIME_CALLS = {"strftime", "isoformat", "fromtimestamp", "utcfromtimestamp", "ctime",
              "asctime", "localtime", "gmtime"}
# Two strftime directives joined as a date or a clock writes them ("%H:%M", "%Y-%m-%d").
PATTERN = re.compile(r"%[YmdHIMS][-:/ .T]%[YmdHIMSfz]|%\(asctime\)")
HELPER_NAME = re.compile(r"(^|_)(when|clock|utc|ts|time|timestamp|stamp|date)$")

# (module, what) -> why it may: each a machine format or the one home.
ALLOWED = {
    ("gpuwhy/text.py", "*"): "the one home: format_ts, and sql_utc for the store's views",
    ("scripts/bench.py", "isoformat"): "benchmark metadata in JSON: ISO 8601 with its offset",
    ("scripts/bench_mcp.py", "isoformat"):
        "the MCP tools' time arguments as an assistant sends them: ISO 8601 with its offset",
    ("scripts/bench_mcp.py", "fromtimestamp"): "the same instant, made an aware datetime",
    ("probes/cron/timers.py", "%Y-%m-%d %H:%M:%S"):
        "parses systemctl's timer output (strptime), prints nothing",
    ("gpuwhy/app/cli.py", "%(asctime)"):
        "log format whose asctime _LogFormatter.formatTime writes with format_ts",
}


def _modules():
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if SKIP_DIRS.isdisjoint(parts) and not any(p.startswith(".") for p in parts):
            yield "/".join(parts), ast.parse(path.read_text("utf-8"), filename=str(path))


def _calls_format_ts(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and
               (getattr(n.func, "id", None) == "format_ts" or
                getattr(n.func, "attr", None) == "format_ts") for n in ast.walk(node))


def _own_formatting(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in TIME_CALLS:
                yield node.lineno, name
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found = PATTERN.search(node.value)
            if found:
                shown = "%(asctime)" if found.group().startswith("%(") else node.value
                yield node.lineno, shown
        elif isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            spec = ast.unparse(node.format_spec)
            if re.search(r"%[a-zA-Z]", spec):
                yield node.lineno, f"f-string spec {spec}"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            returns = ast.unparse(node.returns) if node.returns else ""
            if HELPER_NAME.search(node.name) and returns == "str" \
                    and not _calls_format_ts(node):
                yield node.lineno, f"def {node.name}"


def test_no_module_formats_a_time_on_its_own():
    offences = []
    seen_allowed = set()
    for module, tree in _modules():
        for line, what in _own_formatting(tree):
            for key in ((module, "*"), (module, what)):
                if key in ALLOWED:
                    seen_allowed.add(key)
                    break
            else:
                offences.append(f"{module}:{line}: {what}")
    assert not offences, ("format times with gpuwhy.text.format_ts (or allow-list a machine "
                          "format here with its reason):\n" + "\n".join(offences))
    assert seen_allowed == set(ALLOWED), f"stale allow-list entries: {set(ALLOWED) - seen_allowed}"


def test_the_walk_finds_what_it_forbids():
    tree = ast.parse("import datetime\n"
                     "def fmt_time(ts: int) -> str:\n"
                     "    return datetime.datetime.now().strftime('%H:%M:%S')\n"
                     "def _when(ts: int) -> str:\n"
                     "    return f'{datetime.datetime.now():%H:%M}'\n"
                     "x = datetime.date.today().isoformat()\n")
    found = {what for _, what in _own_formatting(tree)}
    assert {"strftime", "%H:%M:%S", "def _when", "isoformat"} <= found
    assert any(w.startswith("f-string spec") for w in found)


def test_templates_leave_times_to_the_when_filter():
    for path in sorted((REPO / "webui" / "templates").glob("*.html")):
        text = path.read_text("utf-8")
        assert not re.search(r"strftime|isoformat|\|\s*date\b|format_ts", text), path.name


# --- (c) the browser: one helper, the zone on the page ---------------------------------------

STATIC = REPO / "webui" / "static"
JS_TIME = re.compile(r"\.(toLocaleString|toLocaleDateString|toLocaleTimeString|toISOString|"
                     r"toUTCString|toGMTString|toDateString|toTimeString)\(|Intl\.DateTimeFormat|"
                     r"\bnew Date\(|\.get(UTC)?(FullYear|Month|Date|Day|Hours|Minutes|Seconds)\(|"
                     r"useUTC:\s*true")
HELPER_START = "// The one place the browser writes a time"
HELPER_END = "G.showZone = function"


def _scripts():
    return [p for p in sorted(STATIC.rglob("*.js")) if "vendor" not in p.parts]


def test_only_the_chart_helper_writes_times_in_the_browser():
    assert _scripts(), "no scripts found under webui/static"
    offences = []
    for path in _scripts():
        text = path.read_text("utf-8")
        if path.name == "charts.js":
            start, end = text.index(HELPER_START), text.index(HELPER_END)
            assert JS_TIME.search(text[start:end]), "the helper is where times are written"
            text = text[:start] + text[end:]
        offences += [f"{path.name}: {m.group()}" for m in JS_TIME.finditer(text)]
    assert not offences, "write times in the browser with GpuwhyCharts.clock:\n" + \
        "\n".join(offences)


def test_every_chart_page_names_the_browser_zone():
    charts = (STATIC / "charts.js").read_text("utf-8")
    assert "resolvedOptions().timeZone" in charts and "times in ${G.zone}" in charts
    # every page loads charts.js and times.js (base.html); the browser writes times on a
    # page with charts (echarts) or with instants (<time> tags, beside which it writes the
    # local time): such a page names the zone
    base = (REPO / "webui" / "templates" / "base.html").read_text("utf-8")
    assert "charts.js" in base and "times.js" in base
    pages = [p for p in sorted((REPO / "webui" / "templates").glob("*.html"))
             if "echarts" in p.read_text("utf-8") or "| instant" in p.read_text("utf-8")]
    assert len(pages) >= 6, [p.name for p in pages]
    for page in pages:
        if 'extends "base.html"' in page.read_text("utf-8"):
            assert 'id="chart-zone"' in page.read_text("utf-8"), page.name
