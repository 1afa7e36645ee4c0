"""Ask the Prometheus that scrapes the fleet one PromQL instant query, bounded in time and size.

The read behind `gpuwhy mcp`'s ``fleet`` tool (docs/mcp.md): one ``POST /api/v1/query`` to
``fleet.prometheus_url``, answered within ``fleet.prometheus_timeout`` seconds IN ALL (a
server that stalls, or trickles a byte at a time, is cut off at the deadline, not per
read) and in at most :data:`MAX_BYTES` bytes (a bigger answer is refused, not cut: half a
JSON document says nothing). Redirects are not followed and no proxy is used: the URL in
the config is the one server asked.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any
from urllib.parse import urlencode, urlsplit

from gpuwhy import __version__
from gpuwhy.clock import NS_PER_SECOND

MAX_BYTES = 4 * 1024 * 1024        # a Prometheus answer read at most (then refused)
MAX_QUERY_CHARS = 4000             # a PromQL expression sent at most
CHUNK = 64 * 1024


class PromQLError(Exception):
    """The query could not be answered: one sentence, for the person or assistant asking."""


def instant_query(base_url: str, query: str, *, at_ns: int | None = None,
                  timeout_s: float = 10.0, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """Prometheus's ``data`` of ``query`` evaluated at ``at_ns`` (None: now):
    ``{"resultType": ..., "result": [...]}``, plus ``warnings`` when it sent some.
    Raises :class:`PromQLError` on a refusal, a timeout, an oversized or malformed answer."""
    if not query.strip() or len(query) > MAX_QUERY_CHARS:
        raise PromQLError(f"a PromQL query of 1 to {MAX_QUERY_CHARS} characters is needed")
    parts = urlsplit(base_url)
    form: dict[str, str] = {"query": query, "timeout": f"{timeout_s:g}s"}
    if at_ns is not None:
        form["time"] = f"{at_ns / NS_PER_SECOND:.3f}"
    connection_class = (http.client.HTTPSConnection if parts.scheme == "https"
                        else http.client.HTTPConnection)
    conn = connection_class(parts.hostname or "", parts.port, timeout=timeout_s)
    # One timer for the whole exchange: the socket's own timeout is per read, which a server
    # sending a byte every few seconds never trips; past the deadline the socket is shut.
    expired = threading.Event()

    def cut_off() -> None:
        expired.set()
        if conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass                          # closed meanwhile

    timer = threading.Timer(timeout_s, cut_off)
    timer.daemon = True
    started = time.monotonic()
    timer.start()
    try:
        conn.request("POST", parts.path.rstrip("/") + "/api/v1/query", body=urlencode(form),
                     headers={"Content-Type": "application/x-www-form-urlencoded",
                              "Accept": "application/json",
                              "User-Agent": f"gpuwhy/{__version__} (mcp fleet)"})
        response = conn.getresponse()
        body = bytearray()
        while chunk := response.read1(CHUNK):
            body += chunk
            if len(body) > max_bytes:
                raise PromQLError(f"Prometheus answered more than {max_bytes // 1024} KiB: "
                                  "narrow the query (aggregate with sum by (...), topk, or "
                                  "fewer label values)")
    except PromQLError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set() or time.monotonic() - started >= timeout_s:
            raise PromQLError(f"Prometheus at {base_url} gave no whole answer within "
                              f"{timeout_s:g} s (fleet.prometheus_timeout)") from None
        raise PromQLError(f"cannot reach Prometheus at {base_url}: "
                          f"{exc.__class__.__name__}: {exc}") from None
    finally:
        timer.cancel()
        conn.close()
    return _data(response.status, bytes(body), base_url)


def _data(status: int, body: bytes, base_url: str) -> dict[str, Any]:
    """The ``data`` of a Prometheus API answer, or its error said plainly."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise PromQLError(f"{base_url} answered HTTP {status} with no Prometheus API JSON: is "
                          "fleet.prometheus_url the Prometheus server (its base URL)?")
    if answer.get("status") != "success":
        kind = str(answer.get("errorType") or f"HTTP {status}")[:80]
        message = str(answer.get("error") or "no reason given")[:500]
        raise PromQLError(f"Prometheus refused the query ({kind}): {json.dumps(message)}")
    data = answer.get("data")
    if not isinstance(data, dict) or "resultType" not in data:
        raise PromQLError("Prometheus answered success without a result")
    found = {"resultType": data["resultType"], "result": data.get("result")}
    if answer.get("warnings"):
        found["warnings"] = answer["warnings"]
    return found
