"""Reads of a GPU's activity that the stall check decides on: its busy samples, where its
samples resumed, and when it went silent (resetting, lost).

The stall check (:class:`gpuwhy.correlator.busy.LastBusy` and ``IncidentBuilder._stalls``)
decides from these plain values whether a bound process's GPU went idle after being busy.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlite_utils import Database


def latest_busy(db: Database, gpu_id: str, threshold: float, since: int | None,
                until: int) -> int | None:
    """The time of the GPU's latest sample (any instance) with ``gpu_util`` above
    ``threshold`` at or before ``until`` (and at or after ``since``, unless None)."""
    if since is not None:
        return db.execute("select max(ts) from gpu_samples where gpu_id = ? and "
                          "gpu_util > ? and ts between ? and ?",
                          [gpu_id, threshold, since, until]).fetchone()[0]
    row = db.execute("select ts from gpu_samples where gpu_id = ? and gpu_util > ? "
                     "and ts <= ? order by ts desc limit 1",
                     [gpu_id, threshold, until]).fetchone()
    return row[0] if row else None


def first_sample_after(db: Database, gpu_id: str, ts: int) -> int | None:
    """The time of the GPU's first sample after ``ts``."""
    return db.execute("select min(ts) from gpu_samples where gpu_id = ? and ts > ?",
                      [gpu_id, ts]).fetchone()[0]


def gpu_state(db: Database, gpu_id: str) -> tuple | None:
    """(state, state_since, health, health_since) of the GPU's row; None when it has none."""
    return db.execute("select state, state_since, health, health_since from gpus "
                      "where id = ?", [gpu_id]).fetchone()


def went_silent(db: Database, gpu_id: str, after: int, until: int,
                states: Sequence[str]) -> int | None:
    """The first time in (after, until] a GPU source said the GPU went into one of
    ``states`` (a ``gpu_state`` event), or None."""
    return db.execute(
        f"select min(ts) from events where ts > ? and ts <= ? and kind = 'gpu_state' "
        f"and gpu_id = ? and json_extract(body, '$.state') in "
        f"({', '.join('?' * len(states))})",
        [after, until, gpu_id, *states]).fetchone()[0]
