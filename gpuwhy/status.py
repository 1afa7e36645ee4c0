"""The health of a running gpuwhy: its web view, its store and every source (`gpuwhy status`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.stalls import STALLED, judge

REQUIRED = frozenset({"web", "correlator"})   # without these gpuwhy is not running
# `gpuwhy status` exit codes: healthy; not running (a required part down or stalled);
# running, but a source stalled (gpuwhy.stalls: its data has stopped coming) or failed
# (it said so: a kernel-log source that receives nothing, a probe that cannot load, ...)
EXIT_CODES = {"healthy": 0, "unhealthy": 1, "degraded": 2}


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
    """Health of the web view, the store and every source, as one dict; its ``state`` is
    healthy, degraded (running, but a source stalled or failed: listed in ``stalled`` and
    ``failed``; a store whose disk is full is failed) or unhealthy."""
    from gpuwhy.store import open_store
    from gpuwhy.store.queries import gpus, source_health

    web_state, web_detail = web_health(config)
    parts = [{"part": "web", "state": web_state, "detail": web_detail, "age_s": None,
              "counters": {}}]
    try:
        db = open_store(config["store.path"], readonly=True)
        try:
            rows = source_health(db)
            gpu_rows = gpus(db)
        finally:
            db.close()
    except Exception as exc:  # noqa: BLE001 - any store failure is a status to report
        rows, gpu_rows = [], []
        parts.append({"part": "store", "state": "down", "detail": str(exc), "age_s": None,
                      "counters": {}})
    for row in judge(rows, now_ns(), config):
        parts.append({"part": row["source"], "state": row["state"], "detail": row["detail"],
                      "age_s": row["age_s"], "counters": row["counters"]})
    _store_disk(parts, config["store.path"])
    running = all(p["state"] == "ok" for p in parts if p["part"] in REQUIRED) and \
        REQUIRED <= {p["part"] for p in parts}
    stalled = [p["part"] for p in parts if p["state"] == STALLED]
    failed = [p["part"] for p in parts if p["state"] in ("failed", "down")
              and p["part"] not in REQUIRED]
    state = "unhealthy" if not running else "degraded" if stalled or failed else "healthy"
    return {"healthy": state == "healthy", "state": state, "stalled": stalled,
            "failed": failed, "store": config["store.path"], "parts": parts,
            "gpus": [gpu_health_line(g) for g in gpu_rows]}


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
    store = next((p for p in parts if p["part"] == "store"), None)
    if free is None or store is None:
        return
    if free < DISK_FULL_BYTES:
        store["state"] = "failed"
        store["detail"] = f"disk full: {free / MB:.1f} MB free beside {store_path} (events " \
                          f"are held in memory until space returns); {store['detail']}"
    else:
        store["detail"] += f", {free / MB:.0f} MB free on disk"
