"""gpuwhy.text: one timestamp format for Python and the store's SQL views, and terminal-safe
text; its docstring examples are run too."""

import doctest
import sqlite3

import pytest

from gpuwhy import text
from gpuwhy.text import format_ts, printable, sql_utc

MOMENTS = [0, 1_700_000_000_123_000_000, 1_798_761_599_999_000_000, 1_764_633_600_000_000_000]


def test_the_docstring_examples_hold():
    result = doctest.testmod(text)
    assert result.attempted >= 6 and result.failed == 0


@pytest.mark.parametrize("precision", ["ms", "s", "min"])
def test_the_views_write_time_as_the_cli_does(precision):
    db = sqlite3.connect(":memory:")
    for ts in MOMENTS:
        [(in_sql,)] = db.execute(f"select {sql_utc('?', precision)}", [ts]).fetchall()
        assert f"{in_sql} UTC" == format_ts(ts, precision, utc=True)


def test_untrusted_text_cannot_drive_the_terminal():
    shown = printable("evil\x1b]0;title\x07\r\nname\u202e")
    assert shown.isprintable() and "\x1b" not in shown
    assert printable("x" * 50, limit=10) == "x" * 9 + "…"
    assert format_ts(None) == "-"


def test_a_cli_table_has_a_header_aligned_columns_and_escapes_every_cell():
    from gpuwhy.text import table

    out = table(["id", "name", "command"], [[7, "py\x1b[31mthon", "run\nme"], [120, None, "x"]],
                right=[0])
    header, first, second = out.splitlines()
    assert header.split() == ["id", "name", "command"]
    assert "\x1b" not in out and "\\x1b[31m" in first and "run\\nme" in first
    assert first.index("py") == second.index("-") == header.index("name")   # aligned
    assert first.startswith("  7") and second.startswith("120")           # numbers right
