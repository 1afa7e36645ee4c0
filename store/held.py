"""Rows of the hottest tables, held back during a batch and written at its end.

A statement per row cost ~5 µs each on a small VM, more than building the row: most events
of a batch (events, sched_stats, driver_calls, gpu_sample_data, driver_call_stats rows) are
written with one ``executemany`` per run of the same statement instead. Rows of a table
are written in the order they came (events' ids follow arrival order); tables are written
one after the other, which is safe because none has a trigger and the writer reads none of
them back within a batch (the decide stage, which does, runs after; the writer writes what is
held before the one read it makes). Statements held with ``add_after`` run after every row:
an update that must find the rows this batch inserts (a device's close, its open). They run
statement by statement, in the order given to ``HeldRows`` and then as they first came,
each with every value held for it: a host's short-lived processes alternate their exec's
and their exit's statements, and in arrival order each ran alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from itertools import groupby
from operator import itemgetter


class HeldRows:
    """Statements and their values, per table, waiting for ``write``."""

    def __init__(self, after_order: Sequence[str] = ()) -> None:
        """``after_order``: statements held with ``add_after`` that must run before others
        (a close of one fd before its process's exit closes the rest), in that order."""
        self._rows: dict[str, list[tuple[str, Sequence]]] = {}
        self._latest: dict[tuple, tuple[str, Sequence]] = {}
        self._after_order = tuple(after_order)
        self._after: dict[str, list[Sequence]] = {}

    def add(self, table: str, sql: str, values: Sequence) -> None:
        rows = self._rows.get(table)
        if rows is None:
            rows = self._rows[table] = []
        rows.append((sql, values))

    def add_latest(self, key: tuple, sql: str, values: Sequence) -> None:
        """A row whose statement sets every column of the row at ``key`` (table and primary
        key): only the last one held for a key is written, at the place of the first (the
        order in which new rows were inserted stays the same)."""
        if None in key:     # NULL in a primary key conflicts with nothing: a row of its own
            key = (*key, len(self._latest))
        self._latest[key] = (sql, values)

    def add_after(self, sql: str, values: Sequence) -> None:
        """A statement run after every row held, with the others held for the same SQL."""
        runs = self._after.get(sql)
        if runs is None:
            runs = self._after[sql] = []
        runs.append(values)

    def write(self, conn: sqlite3.Connection) -> None:
        """Write everything held and forget it (also when a statement fails)."""
        try:
            for rows in (*self._rows.values(), self._latest.values()):
                for sql, run in groupby(rows, key=itemgetter(0)):
                    conn.executemany(sql, [values for _, values in run])
            if self._after:
                first = [sql for sql in self._after_order if sql in self._after]
                for sql in (*first, *(sql for sql in self._after if sql not in first)):
                    conn.executemany(sql, self._after[sql])
        finally:
            self.clear()

    def clear(self) -> None:
        self._rows.clear()
        self._latest.clear()
        self._after.clear()
