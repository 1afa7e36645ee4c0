"""Reads of a GPU's activity that the stall check decides on: its busy samples, where its
samples resumed, and when it went silent (resetting, lost).

The stall check (:class:`gpuwhy.correlator.busy.LastBusy` and
:func:`gpuwhy.correlator.incidents.decide_stalls`) decides from these plain values
(:class:`StallFacts`, read by :func:`stall_facts`) whether a bound process's GPU went idle
after being busy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlite_utils import Database

from gpuwhy.identity import ProcessKey
from gpuwhy.store import gpu_bindings, incident_rows


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


# --- the stall check's facts, read once a check ---------------------------------------------
@dataclass(frozen=True)
class GpuIdle:
    """What says where a GPU's idle stretch began after its busy sample at ``busy``: its
    first sample after it, its row's (state, state_since, health, health_since), and the
    first time a GPU source said it went silent after it (read only when its state changed
    since ``busy``)."""

    busy: int
    first_sample: int | None
    state: tuple | None
    went_silent: int | None = None


@dataclass(frozen=True)
class Bound:
    """A living process bound to a GPU (not a monitor), with its GPU's latest busy sample
    since it bound it (None: never busy since)."""

    process: ProcessKey
    gpu_id: str
    since: int
    busy: int | None


@dataclass(frozen=True)
class StallFacts:
    """What the stall check at ``now`` decides on: the bound processes in the store's order,
    each (GPU, busy sample)'s idle facts, and the active stall incidents (id, dedup_key,
    opened_at)."""

    now: int
    bound: tuple[Bound, ...] = ()
    idle: dict[tuple[str, int], GpuIdle] = field(default_factory=dict)
    stalls: tuple[tuple[int, str, int], ...] = ()


def stall_facts(db: Database, now: int, latest_busy: Callable[[str, int, int], int | None],
                skip: Callable[[str | None, str | None], bool],
                silent_states: Sequence[str]) -> StallFacts:
    """The stall check's facts at ``now``: the living processes holding a GPU but those
    ``skip`` (comm, cmdline) names (monitors), their GPU's latest busy sample since they bound
    it (``latest_busy(gpu_id, since, now)``: the decide stage's memory of the samples it
    saw, which reads the store for what came before it), and the idle facts of each GPU and
    busy sample. An idle host reads nothing more than its bindings."""
    rows = gpu_bindings.held_by_living(db)
    if not rows:
        return StallFacts(now)
    stalls = tuple((r[0], r[1], r[2]) for r in incident_rows.active_stalls(db))
    bound: list[Bound] = []
    idle: dict[tuple[str, int], GpuIdle] = {}
    for pid, start_time, gpu_id, since, comm, cmdline in rows:
        if skip(comm, cmdline):
            continue
        busy = latest_busy(gpu_id, since, now)
        bound.append(Bound(ProcessKey(pid, start_time), gpu_id, since, busy))
        if busy is None or (gpu_id, busy) in idle:
            continue
        after = first_sample_after(db, gpu_id, busy)
        state = gpu_state(db, gpu_id)
        silent = went_silent(db, gpu_id, busy, now, silent_states) \
            if state and state[1] and state[1] > busy else None
        idle[(gpu_id, busy)] = GpuIdle(busy, after, tuple(state) if state else None, silent)
    return StallFacts(now, tuple(bound), idle, stalls)
