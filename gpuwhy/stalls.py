"""When a source has stalled: it missed its heartbeat STALL_FACTOR times running.

Every source publishes :class:`gpuwhy.events.SourceHealth` at its own period (below) and
the store keeps each source's last one. A source whose last heartbeat is older than
STALL_FACTOR of its periods is ``stalled``, whatever it said then; so is a source that
says so itself (the GPU runner's heartbeat runs beside its reads, and it reports a read
that has run STALL_FACTOR sample intervals). This module is the one definition; `gpuwhy
status`, the correlator (which logs and counts each stall), ``/healthz`` and ``/metrics``
all judge the rows through :func:`judge`.

Only a source heard from since the running correlator started can stall. A row from an
earlier run (a probe turned off since, the probes process not started yet or still
compiling its programs) is ``stale``: it says nothing about this run, and an unused row
must not keep a host degraded forever.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuwhy.clock import NS_PER_SECOND

STALL_FACTOR = 3

# Seconds between heartbeats, as each source's loop publishes them (tests/test_stalls.py
# holds them against the sources' own constants, which the core cannot import).
# Five seconds for most: a beat costs a write of the store (and the correlator's beat a read
# of every source's), and faster beats cost an idle host ~0.02 % of a core for a silent
# thread seen 9 s sooner. What must be said at once is published at once (a stuck GPU read,
# a failed source), whatever the period.
HEALTH_PERIOD_S: dict[str, float] = {
    "correlator": 5.0, "store": 5.0,      # the correlator writes both itself
    "gpu": 5.0, "klog": 5.0, "cron": 5.0, "rules": 10.0, "alertmanager": 5.0,
    "probes": 5.0,      # each of PROBE_SOURCES, or every flush when flushes are rarer
    "stacks": 5.0,      # the Python stack sampler, a process of its own under systemd
}
# The probes process publishes the health of all of these together.
PROBE_SOURCES = frozenset({"fdtrack", "lifecycle", "sched", "cuda", "printk"})
DEFAULT_PERIOD_S = 5.0     # a source this table does not know yet
DEFAULT_POLL_INTERVAL_S = 1.0
# A failed source stopped on purpose and said why: its last word stands, however old.
TERMINAL_STATES = frozenset({"failed"})
STALLED = "stalled"
STALE = "stale"
# Written by the correlator into its own health counters: how long this run has lasted
# (so that any reader knows which rows are from this run) and each source's stall count.
UPTIME_COUNTER = "uptime_s"
STALLS_PREFIX = "stalls:"


def period_s(source: str, config: Mapping[str, Any] | None = None) -> float:
    """Seconds between ``source``'s heartbeats."""
    if source in PROBE_SOURCES:
        flushes = float(config["probes.poll_interval"]) if config else DEFAULT_POLL_INTERVAL_S
        return max(flushes, HEALTH_PERIOD_S["probes"])
    return HEALTH_PERIOD_S.get(source, DEFAULT_PERIOD_S)


def stall_after_s(source: str, config: Mapping[str, Any] | None = None) -> float:
    """Seconds of silence after which ``source`` counts as stalled."""
    return STALL_FACTOR * period_s(source, config)


def run_started_ns(rows: Iterable[Mapping[str, Any]], now: int | None = None) -> int | None:
    """When the correlator writing these rows started, from its own row; None when there is
    none, or (given ``now``) when it is itself silent past its stall limit: then no run is
    live (the service stopped, or its correlator hung, which `gpuwhy status` calls not
    healthy anyway) and its sources are stale, not stalled."""
    for row in rows:
        if row["source"] == "correlator" and UPTIME_COUNTER in (row["counters"] or {}):
            if now is not None and \
                    now - row["last_seen"] > stall_after_s("correlator") * NS_PER_SECOND:
                return None
            # uptime is whole seconds: one more keeps a row from the run's first second in it
            return row["last_seen"] - (int(row["counters"][UPTIME_COUNTER]) + 1) * NS_PER_SECOND
    return None


def stall_counts(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Stall episodes per source in this correlator run, from its own row."""
    for row in rows:
        if row["source"] == "correlator":
            return {key[len(STALLS_PREFIX):]: int(value)
                    for key, value in (row["counters"] or {}).items()
                    if key.startswith(STALLS_PREFIX)}
    return {}


def judge(rows: list[dict], now: int, config: Mapping[str, Any] | None = None,
          run_started: int | None = None) -> list[dict]:
    """Copies of ``rows`` (:func:`gpuwhy.store.queries.source_health`) as they should be
    shown at ``now`` (ns): ``state`` judged, ``reported_state`` as the source said it,
    ``age_s`` and ``stall_after_s``; a stalled row's ``detail`` says since when.

    ``run_started`` is the running correlator's start (ns); by default it is read from the
    correlator's row. Without a live run nothing is running: old rows are only stale.
    """
    if run_started is None:
        run_started = run_started_ns(rows, now)
    judged = []
    for row in rows:
        source, reported = row["source"], row["state"]
        age = (now - (row["last_seen"] or 0)) / NS_PER_SECOND
        limit = stall_after_s(source, config)
        state, detail = reported, row["detail"]
        if reported in TERMINAL_STATES:
            pass
        elif run_started is None or (row["last_seen"] or 0) < run_started:
            if age > limit:
                state = STALE    # from an earlier run: says nothing about this one
        elif age > limit:
            state = STALLED
            detail = (f"STALLED: no heartbeat for {age:.0f} s (one every "
                      f"{period_s(source, config):g} s expected); it last said "
                      f"{reported}: {detail}")
        judged.append({**row, "state": state, "reported_state": reported, "detail": detail,
                       "age_s": round(age, 1), "stall_after_s": limit})
    return judged
