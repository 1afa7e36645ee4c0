"""OTLP export's switch: start the exporter when the OTEL_EXPORTER_OTLP_* variables ask for it.

Kept apart from the exporter itself (gpuwhy/app/otlp_export.py, which imports the OpenTelemetry
SDK, a second's import on a busy host): a service with no endpoint set imports none of it and
starts nothing. What the variables ask for is :mod:`gpuwhy.app.otlp_plan`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuwhy.app.otlp_plan import SOURCE, Plan, plan
from gpuwhy.config import Config

if TYPE_CHECKING:
    from gpuwhy.app.otlp_export import OtlpExporter

__all__ = ["SOURCE", "Plan", "plan", "start_otlp"]

log = logging.getLogger(__name__)


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
