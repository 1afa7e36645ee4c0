"""Ad hoc read-only SQL on the documented views, for callers that do not trust the SQL.

`gpuwhy mcp`'s ``query`` tool hands an assistant's SQL here. Four fences, each on its own
enough to keep the store unchanged, and SQLite's own checks rather than string matching:
the connection is opened read-only (``mode=ro``) with ``PRAGMA query_only``; SQLite's
authorizer allows only reading the views in :data:`gpuwhy.store.views.VIEWS` (the ones
docs/schema.md documents) and refuses everything else it is asked about (a write, ATTACH,
PRAGMA, a table outside the views, a transaction); exactly one statement is run; and a
progress handler stops it after a time limit, a row cap ends the reading. Cells are bounded
(long text cut, blobs described), so one answer stays small.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from typing import Any

from gpuwhy.errors import GpuwhyError
from gpuwhy.store.views import VIEWS

QUERYABLE = tuple(sorted(VIEWS))
MAX_SQL_CHARS = 20_000
MAX_ROWS = 1000
MAX_CELL_CHARS = 2000
# What the progress handler costs: a look at the clock every this many VM steps (~1 ms).
_PROGRESS_STEPS = 20_000
# The largest string or blob one expression may build (SQLite's default is 1 GB: a
# ``zeroblob(1e9)`` would take that much memory before the time limit could say no).
_MAX_VALUE_BYTES = 1_000_000
# Functions a read needs none of and a hostile query could use (the extension loader is
# off in Python's sqlite3 anyway; refused here too so it never depends on that).
_REFUSED_FUNCTIONS = {"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"}
# The authorizer's action codes in words (sqlite3 exports them among its other constants).
_ACTION_NAMES = {getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ") for name in (
    "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE",
    "CREATE_TEMP_TRIGGER", "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE",
    "DROP_INDEX", "DROP_TABLE", "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER",
    "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_VIEW", "INSERT", "PRAGMA", "TRANSACTION",
    "UPDATE", "ATTACH", "DETACH", "ALTER_TABLE", "REINDEX", "ANALYZE", "CREATE_VTABLE",
    "DROP_VTABLE", "SAVEPOINT")}


class QueryRefused(GpuwhyError):
    """The SQL is not a single read of the documented views, or ran out of time; the
    message says which, in words a person (or an assistant) can act on."""


def _connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    uri = "file:" + urllib.parse.quote(os.fspath(path)) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 2000")
        conn.execute("PRAGMA query_only = ON")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS * 4)
        return conn
    except sqlite3.Error as exc:
        raise QueryRefused(f"cannot open the store {path} read-only: {exc}") from None


def _authorizer(schema_names: set[str], refused: list[str]):  # noqa: ANN202
    """SQLite's authorizer callback: reads of the views (and of what they read) and nothing
    else. A refusal is noted in ``refused`` so the error can say what was refused."""
    allowed = set(QUERYABLE)

    def decide(action: int, arg1: str | None, arg2: str | None, db_name: str | None,
               inner: str | None) -> int:
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() in _REFUSED_FUNCTIONS:
                refused.append(f"the function {arg2}()")
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ:
            table = (arg1 or "").lower()
            if table in allowed or (inner or "").lower() in allowed:
                return sqlite3.SQLITE_OK
            if table in schema_names or db_name not in (None, "main"):
                refused.append(f"reading {arg1} (not one of the documented views)")
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK     # a WITH clause's name: rows the query made itself
        if action == sqlite3.SQLITE_UPDATE and (arg1 or "").lower() == "sqlite_master":
            # what SQLite asks before it sets up json_each(), pragma_table_info() and kin
            refused.append("a table-valued function (json_each, pragma_...)")
        else:
            what = _ACTION_NAMES.get(action, f"SQLite action {action}")
            refused.append(what + (f" {arg1}" if arg1 and action != sqlite3.SQLITE_ATTACH
                                   else ""))
        return sqlite3.SQLITE_DENY

    return decide


def _cell(value: Any) -> Any:
    if isinstance(value, bytes):
        return f"<blob of {len(value)} bytes>"
    if isinstance(value, str) and len(value) > MAX_CELL_CHARS:
        return value[:MAX_CELL_CHARS] + f"… [{len(value) - MAX_CELL_CHARS} more characters]"
    return value


def query_views(path: str | os.PathLike[str], sql: str, *, max_rows: int = 200,
                timeout_s: float = 2.0) -> dict[str, Any]:
    """Run one read-only SELECT on the documented views of the store at ``path``.

    Returns ``{"columns", "rows", "truncated", "elapsed_ms"}``: at most ``max_rows`` rows
    (``truncated`` says more were there), each cell bounded. Raises :class:`QueryRefused`
    for anything but one statement reading those views, for SQL SQLite cannot parse, and
    when the statement runs longer than ``timeout_s``.
    """
    if not isinstance(sql, str) or not sql.strip():
        raise QueryRefused("no SQL given: write one SELECT on the views "
                           f"({', '.join(QUERYABLE)})")
    if len(sql) > MAX_SQL_CHARS:
        raise QueryRefused(f"the SQL is {len(sql)} characters long; at most {MAX_SQL_CHARS}")
    if "\x00" in sql:
        raise QueryRefused("the SQL holds a NUL character")
    max_rows = max(1, min(int(max_rows), MAX_ROWS))
    conn = _connect(path)
    try:
        schema_names = {name.lower() for (name,) in conn.execute(
            "select name from sqlite_schema union all select 'sqlite_schema' "
            "union all select 'sqlite_master' union all select 'sqlite_temp_master' "
            "union all select 'sqlite_temp_schema'")}
        refused: list[str] = []
        conn.set_authorizer(_authorizer(schema_names, refused))
        started = time.monotonic()
        deadline = started + timeout_s
        timed_out = []

        def progress() -> int:
            if time.monotonic() > deadline:
                timed_out.append(True)
                return 1      # non-zero: SQLite interrupts the statement
            return 0

        conn.set_progress_handler(progress, _PROGRESS_STEPS)
        try:
            cursor = conn.execute(sql)
            if cursor.description is None:
                raise QueryRefused("the SQL is not a query that returns rows (write one SELECT "
                                   "on the views)")
            rows = cursor.fetchmany(max_rows + 1)
        except sqlite3.ProgrammingError as exc:
            if "one statement" in str(exc):
                raise QueryRefused("exactly one statement, please: the SQL holds more than "
                                   "one (split it, or join the reads in one SELECT)") from None
            raise QueryRefused(f"the SQL was refused: {exc}") from None
        except sqlite3.Warning as exc:     # Python 3.11's name for "more than one statement"
            raise QueryRefused("exactly one statement, please: the SQL holds more than one "
                               f"({exc})") from None
        except sqlite3.DatabaseError as exc:
            if refused:
                raise QueryRefused(
                    f"not allowed: {refused[0]}. Only reads of the documented views are: "
                    f"{', '.join(QUERYABLE)} (read-only; no ATTACH, PRAGMA or writes)"
                ) from None
            if timed_out:
                raise QueryRefused(f"the query ran longer than {timeout_s:g} s and was stopped: "
                                   "narrow it (a time range, a LIMIT)") from None
            raise QueryRefused(f"SQLite could not run the SQL: {exc}") from None
        columns = [d[0] for d in cursor.description]
        truncated = len(rows) > max_rows
        return {"columns": columns, "rows": [[_cell(v) for v in row] for row in rows[:max_rows]],
                "truncated": truncated,
                "elapsed_ms": round((time.monotonic() - started) * 1000, 1)}
    finally:
        conn.close()
