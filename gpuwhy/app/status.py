"""The health of a running gpuwhy: its web view, its store and every source (`gpuwhy status`)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.stalls import STALE, STALLED, judge

REQUIRED = frozenset({"web", "correlator"})   # without these gpuwhy is not running
# `gpuwhy status` exit codes: healthy; not running (a required part down or stalled);
# running, but something is wrong: a part degraded, failed or stalled (gpuwhy.stalls: its
# data has stopped coming), a source whose every read fails, or a part that dropped records.
EXIT_CODES = {"healthy": 0, "unhealthy": 1, "degraded": 2}
# Drop counters are named dropped_*; these count what a part leaves out on purpose, by a
# setting (probes.error_events_per_second), not what it lost.
DROP_PREFIX = "dropped"
DELIBERATE_DROPS = frozenset({"dropped_rate_limited_call_events"})
# Counters of a source's failed reads, and of what its reads delivered.
READ_ERRORS, READ_RESULTS = "read_errors", ("samples", "records", "lines", "published")


def web_url(config: Config) -> str:
    """Where this host reaches its own web view: the bound address, or loopback when it binds
    every address (the view answers only to the names it knows: gpuwhy.webui.security)."""
    host = config["web.host"].strip("[]")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"   # an IPv6 address in a URL
    return f"http://{host}:{config['web.port']}"


def web_health(config: Config) -> tuple[str, str]:
    """Whether the web view answers its /healthz, and where it was asked."""
    url = f"{web_url(config)}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            json.load(response)
            return "ok", url
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return "down", f"{url}: {getattr(exc, 'reason', exc)}"


def collect_status(config: Config) -> dict:
    """Health of the web view, the store and every source, as one dict.

    Its ``state`` is ``unhealthy`` when the web view or the correlator is down or stalled;
    else ``degraded`` when any part is degraded, failed or stalled, a source's reads all
    fail, or a part has dropped records in its current run (each listed in ``stalled``,
    ``failed``, ``degraded``, ``dropping``); else ``healthy``. A part whose degradation is
    a fact of this host that status checks itself (``limited``: simulated GPU counters on a
    host without the NVIDIA driver, cron executions unseen without journald) is listed, and
    said, but is no fault.
    """
    from gpuwhy.store import open_store
    from gpuwhy.store.migrations import newer_schema
    from gpuwhy.store.queries import gpus, source_health

    web_state, web_detail = web_health(config)
    parts: list[dict[str, Any]] = [{"part": "web", "state": web_state, "detail": web_detail,
                                    "age_s": None, "counters": {}}]
    try:
        db = open_store(config["store.path"], readonly=True)
        try:
            newer = newer_schema(db)
            rows = source_health(db)
            gpu_rows = gpus(db)
        finally:
            db.close()
    except Exception as exc:  # noqa: BLE001 - any store failure is a status to report
        newer, rows, gpu_rows = None, [], []
        parts.append({"part": "store", "state": "down", "detail": str(exc), "age_s": None,
                      "counters": {}})
    for row in judge(rows, now_ns(), config):
        parts.append({"part": row["source"], "state": row["state"], "detail": row["detail"],
                      "age_s": row["age_s"], "counters": row["counters"]})
    if newer:
        _store_refused(parts, newer)
    _store_disk(parts, config["store.path"])
    running = all(p["state"] == "ok" for p in parts if p["part"] in REQUIRED) and \
        REQUIRED <= {p["part"] for p in parts}
    stalled = [p["part"] for p in parts if p["state"] == STALLED]
    failed = [p["part"] for p in parts if p["state"] in ("failed", "down")
              and p["part"] not in REQUIRED]
    limited, degraded, dropping = {}, [], []
    for part in parts:
        if part["state"] == STALE:
            continue            # a row from an earlier run: says nothing about this one
        if part["state"] == "degraded":
            why = host_limit(part, config)
            if why:
                limited[part["part"]] = why
            else:
                degraded.append(part["part"])
        if part["state"] in ("ok", "degraded") and _all_reads_fail(part["counters"]) and \
                part["part"] not in degraded:
            limited.pop(part["part"], None)
            degraded.append(part["part"])
        if dropped(part["counters"]):
            dropping.append(part["part"])
    for part in parts:
        if part["part"] in limited:
            part["limited"] = limited[part["part"]]
    faults = stalled or failed or degraded or dropping
    state = "unhealthy" if not running else "degraded" if faults else "healthy"
    return {"healthy": state == "healthy", "state": state, "stalled": stalled,
            "failed": failed, "degraded": degraded, "dropping": dropping,
            "limited": limited, "store": config["store.path"], "parts": parts,
            "gpus": [gpu_health_line(g) for g in gpu_rows]}


def dropped(counters: dict) -> int:
    """Records a part lost, by its dropped_* counters (those it leaves out on purpose not
    counted): they are totals of the part's current run."""
    return sum(int(value) for key, value in counters.items()
               if key.startswith(DROP_PREFIX) and key not in DELIBERATE_DROPS
               and isinstance(value, (int, float)) and value > 0)


def _all_reads_fail(counters: dict) -> bool:
    """The source has tried to read and every read failed (nothing ever came of one)."""
    return int(counters.get(READ_ERRORS, 0) or 0) > 0 and \
        not any(counters.get(name) for name in READ_RESULTS)


def host_limit(part: dict, config: Config) -> str | None:
    """Why ``part``'s ``degraded`` is what this host offers, not a fault; None when it is a
    fault. Checked here, now, on this host, not taken from what the part says:

    - ``gpu``: its counters are simulated, and the simulator is what the settings ask for
      (``gpu.source = "sim"``) or all this host can give (``auto``, no dcgm-exporter URL set,
      and no NVIDIA kernel module loaded). A configured source that failed into the
      simulator, or a host whose driver is loaded, is a fault.
    - ``cron``: it reads the schedule only, and no journald runs on this host (nor is a
      journal path set) to read cron's executions from.
    """
    name, detail = part["part"], part["detail"] or ""
    if name == "gpu" and detail.startswith(SIMULATED_PREFIX) and "ERROR:" not in detail:
        if config["gpu.source"] == "sim":
            return "simulated GPU counters, as gpu.source = \"sim\" asks"
        if config["gpu.source"] == "auto" and not config["gpu.exporter_url"] and \
                not nvidia_driver_loaded(config["probes.sys_root"]):
            return "simulated GPU counters: no NVIDIA driver on this host"
        return None
    if name == "cron" and not config["cron.journal_path"]:
        from gpuwhy.probes.klog.journald import journald_refuses

        refused = journald_refuses()
        if refused:
            return f"the schedule only, no executions: no journald on this host ({refused})"
    return None


# How the GPU source's detail starts when it runs the simulator (gpuwhy.probes.gpu.runner).
SIMULATED_PREFIX = "SIMULATED data"


def nvidia_driver_loaded(sys_root: str = "/sys") -> bool:
    """The NVIDIA kernel module is loaded (its sysfs folder exists)."""
    return os.path.isdir(os.path.join(sys_root, "module", "nvidia"))


def _store_refused(parts: list[dict], newer: list[str]) -> None:
    """The store part failed: its file was written by a newer gpuwhy than this one."""
    part = next((p for p in parts if p["part"] == "store"), None)
    if part is None:
        part = {"part": "store", "age_s": None, "counters": {}}
        parts.append(part)
    part["state"] = "failed"
    part["detail"] = f"written by a newer gpuwhy (schema steps this build does not know: " \
                     f"{', '.join(newer[:5])}); {part.get('detail') or ''}".rstrip("; ")


def gpu_health_line(gpu: dict) -> dict:
    """A GPU's health as `gpuwhy status` reports it (gpuwhy/gpu_health.py's states)."""
    evidence = gpu["health_evidence"]
    return {"gpu": gpu["id"], "index": gpu["gpu_index"], "health": gpu["health"],
            "since": gpu["health_since"], "cause": evidence.get("cause"),
            "evidence": evidence.get("event"), "clears": gpu["health_clears"] or "",
            "live": gpu["live"]}


def _store_disk(parts: list[dict], store_path: str) -> None:
    """The store's free disk space, read now: its stored row cannot be rewritten while the
    disk is full, so a figure kept in it would still show what was free before."""
    from gpuwhy.store.budget import DISK_FULL_BYTES, MB, disk_free_bytes

    free = disk_free_bytes(store_path)
    part = next((p for p in parts if p["part"] == "store"), None)
    if free is None or part is None:
        return
    if free < DISK_FULL_BYTES:
        part["state"] = "failed"
        part["detail"] = f"disk full: {free / MB:.1f} MB free beside {store_path} (events " \
                         f"are held in memory until space returns); {part['detail']}"
    else:
        part["detail"] += f", {free / MB:.0f} MB free on disk"
