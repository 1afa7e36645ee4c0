"""What OTLP export the OTEL_EXPORTER_OTLP_* variables ask for: which signals go where.

Read by the switch (:mod:`gpuwhy.app.otlp`) before anything of the OpenTelemetry SDK is
imported, and by the exporter (:mod:`gpuwhy.app.otlp_export`) for its endpoints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

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
