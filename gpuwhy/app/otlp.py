"""OTLP export's switch: which signals the OTEL_EXPORTER_OTLP_* variables ask for, and its start.

Kept apart from the exporter itself (gpuwhy/app/otlp_export.py, which imports the OpenTelemetry
SDK, a second's import on a busy host): a service with no endpoint set imports none of it and
starts nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuwhy.config import Config

if TYPE_CHECKING:
    from gpuwhy.app.otlp_export import OtlpExporter

log = logging.getLogger(__name__)

PROTOCOL = "http/protobuf"      # the one this build's exporters speak
SOURCE = "otlp"                 # its source_health row and its feed_cursors name


# --- configuration ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Signal:
    """Where one signal goes, or why it does not."""

    endpoint: str | None        # the full URL (with /v1/metrics or /v1/logs); None: off
    why_not: str | None = None  # set when a configured signal cannot be exported


@dataclass(frozen=True)
class Plan:
    """What the OTLP export does under these variables."""

    metrics: Signal
    logs: Signal

    @property
    def enabled(self) -> bool:
        return bool(self.metrics.endpoint or self.logs.endpoint)

    def describe(self) -> str:
        """One line for `gpuwhy status`."""
        parts = []
        for name, signal in (("metrics", self.metrics), ("logs", self.logs)):
            if signal.endpoint:
                parts.append(f"{name} -> {signal.endpoint}")
            elif signal.why_not:
                parts.append(f"{name} off: {signal.why_not}")
        return "; ".join(parts) or "off: no OTEL_EXPORTER_OTLP_ENDPOINT"


def _signal(environ: Mapping[str, str], name: str, path: str) -> Signal:
    upper = name.upper()
    if environ.get(f"OTEL_{upper}_EXPORTER", "").strip().lower() == "none":
        return Signal(None)
    own = environ.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT", "").strip()
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if not own and not base:
        return Signal(None)
    protocol = (environ.get(f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or PROTOCOL).strip().lower()
    if protocol != PROTOCOL:
        return Signal(None, f"protocol {protocol!r} is not supported (use {PROTOCOL})")
    # the specification's rule: a signal's own endpoint is used as written, the common one
    # gets the signal's path
    return Signal(own or f"{base.rstrip('/')}/{path}")


def plan(environ: Mapping[str, str] | None = None) -> Plan:
    """The export these ``OTEL_*`` variables ask for (``os.environ`` by default)."""
    environ = os.environ if environ is None else environ
    return Plan(_signal(environ, "metrics", "v1/metrics"), _signal(environ, "logs", "v1/logs"))


def start_otlp(config: Config, environ: Mapping[str, str] | None = None) -> OtlpExporter | None:
    """The OTLP exporter these variables ask for, started; None (nothing started) when no
    endpoint is set. A signal that cannot be exported (another protocol) is said once."""
    wanted = plan(environ)
    for name, signal in (("metrics", wanted.metrics), ("logs", wanted.logs)):
        if signal.why_not:
            log.warning("OTLP %s are not exported: %s", name, signal.why_not)
    if not wanted.enabled:
        return None
    # imported only now: the SDK and its protobuf modules are ~9 MB of a sidecar's memory
    from gpuwhy.app.otlp_export import OtlpExporter
    from gpuwhy.store import open_store

    db = open_store(config["store.path"])
    try:
        exporter = OtlpExporter(config, db, wanted)
    except Exception as exc:  # noqa: BLE001 - a bad OTEL_* value: said, gpuwhy runs on
        from gpuwhy.clock import now_ns
        from gpuwhy.store.writer import StoreWriter

        why = f"{type(exc).__name__}: {exc}"
        log.error("OTLP export does not start: %s", why)
        # down, not failed: a failed row stands for good, and this one must go stale once a
        # later run has no endpoint set (its stall meanwhile keeps it in `gpuwhy status`)
        StoreWriter(db).record_health(SOURCE, "down", f"{wanted.describe()}: {why}", {},
                                      now_ns())
        db.close()
        return None
    exporter.start()
    return exporter
