"""The health of a running gpuwhy: its web view, its store and every source (`gpuwhy status`)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.config import Config

STALE_AFTER_S = 10   # a source silent longer than this is stale (they beat every second or so)


def web_health(config: Config) -> tuple[str, str]:
    """Whether the web view answers its /healthz, and where it was asked."""
    url = f"http://{config['web.host']}:{config['web.port']}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            json.load(response)
            return "ok", url
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return "down", f"{url}: {getattr(exc, 'reason', exc)}"


def collect_status(config: Config) -> dict:
    """Health of the web view, the store and every source, as one dict."""
    from gpuwhy.store import open_store
    from gpuwhy.store.queries import source_health

    web_state, web_detail = web_health(config)
    parts = [{"part": "web", "state": web_state, "detail": web_detail, "age_s": None,
              "counters": {}}]
    try:
        db = open_store(config["store.path"], readonly=True)
        try:
            rows = source_health(db)
        finally:
            db.close()
    except Exception as exc:  # noqa: BLE001 - any store failure is a status to report
        rows = []
        parts.append({"part": "store", "state": "down", "detail": str(exc), "age_s": None,
                      "counters": {}})
    now = now_ns()
    for row in rows:
        age = (now - row["last_seen"]) / NS_PER_SECOND
        state = row["state"]
        if age > STALE_AFTER_S and row["source"] != "gpu":
            state = "stale"
        parts.append({"part": row["source"], "state": state, "detail": row["detail"],
                      "age_s": round(age, 1), "counters": row["counters"]})
    required = {"web", "correlator"}
    healthy = all(p["state"] == "ok" for p in parts if p["part"] in required) and \
        required <= {p["part"] for p in parts}
    return {"healthy": healthy, "store": config["store.path"], "parts": parts}
