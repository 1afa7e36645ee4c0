"""OTLP export: the /metrics families and each incident change, to an OpenTelemetry collector.

An output beside ``/metrics`` and the Alertmanager pusher, built on the OpenTelemetry Python
SDK and its OTLP/HTTP (protobuf) exporters. Off unless an endpoint is set; configured by the
standard variables only (the SDK reads them itself):

- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (both signals, ``/v1/metrics`` and ``/v1/logs`` appended),
  or ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`` (one
  signal, used as written); ``OTEL_METRICS_EXPORTER=none`` / ``OTEL_LOGS_EXPORTER=none``
  turn one signal off;
- ``OTEL_EXPORTER_OTLP[_METRICS|_LOGS]_PROTOCOL``: ``http/protobuf`` (the default; a signal
  asked for another protocol is not exported, and `gpuwhy status` says why),
  ``..._HEADERS``, ``..._TIMEOUT``, ``..._COMPRESSION``, ``..._CERTIFICATE``;
- ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` over gpuwhy's own resource
  (``service.name=gpuwhy``, ``service.version``, ``service.instance.id`` and ``host.name``
  = the ``web.hostname`` setting or the host's name): put the cluster there
  (``k8s.cluster.name=...``);
- ``OTEL_BLRP_MAX_QUEUE_SIZE`` / ``OTEL_BLRP_SCHEDULE_DELAY`` / ``OTEL_BLRP_MAX_EXPORT_BATCH_SIZE``
  for the log records' batch processor; the metrics' period is the ``otlp.interval`` setting.

**Metrics.** One definition of each family: the web view's collector
(:class:`gpuwhy.webui.metrics.StoreCollector`, with the process and platform collectors beside
it, as ``/metrics`` registers them) is read once per export, and every family it yields is
exported under the same name, the same labels (as attributes) and the unit its name ends in
(``_bytes`` -> ``By``, ``_seconds`` -> ``s``, ``_ratio`` -> ``1``, ...): a counter family as a
monotonic cumulative sum (started when the export first saw it), the rest as gauges. A
Collector's Prometheus exporter turns them back into the names ``/metrics`` serves (``_total``
added to the sums). The families are already the values to send, so they are put straight
into the SDK's metrics data and handed to its OTLP exporter: the SDK's instruments and
aggregation would only copy them again, at twice the CPU (docs/decisions/0022-otlp-direct.md).

**Logs.** Each change of the store's incident feed (store/feed.py: opened, acknowledged,
resolved, reopened, note, answered) becomes one log record: severity from the incident's
(:func:`gpuwhy.severity.otlp_severity_number`), the one-line summary as body, the incident's
and the change's fields as attributes, ``event_name`` ``gpuwhy.incident.<action>``, no trace.
The feed is followed by its cursor, kept in the store (``feed_cursors``, name ``otlp``) and
moved before the records are handed to the SDK: nothing is sent twice, and a restart resumes
after the last change handed over. A first run starts at the newest change (the store's
history is not replayed).

**Never blocking.** Exports run on threads of their own (the metric one here, the log one the
SDK's batch processor), each bounded by the exporter's timeout. The log queue is bounded
(``OTEL_BLRP_MAX_QUEUE_SIZE``) and the feed is taken in only as far as the queue has room, so
a stalled collector leaves the rest in the store rather than in memory. A batch the collector
refused or did not answer in time is lost and counted: ``dropped_log_records`` and
``dropped_metric_exports`` in the ``otlp`` health row, which `gpuwhy status` shows (a part
that dropped records is ``dropping``) and ``/metrics`` exports as
``gpuwhy_events_lost{source="otlp"}``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from opentelemetry._logs import SeverityNumber
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import (
    BatchLogRecordProcessor,
    LogRecordExporter,
    LogRecordExportResult,
)
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.export import Metric as OtelMetric
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from sqlite_utils import Database

from gpuwhy import severity as sev
from gpuwhy.app.otlp_encode import MetricsEncoder
from gpuwhy.app.otlp_plan import SOURCE, Plan, plan
from gpuwhy.clock import now_ns
from gpuwhy.config import Config
from gpuwhy.journal import one_line
from gpuwhy.store import alertpush, feed
from gpuwhy.store.writer import StoreWriter
from gpuwhy.webui.metrics import StoreCollector, host_name

log = logging.getLogger(__name__)

STEP_EVERY = 1.0                # seconds between looks at the incident feed
HEALTH_EVERY = 5.0              # seconds between health rows (gpuwhy.stalls' default period)
TAKE_MAX = 500                  # feed changes taken in per step at most
DEFAULT_QUEUE = 2048            # the SDK's default OTEL_BLRP_MAX_QUEUE_SIZE
DEFAULT_BATCH = 512             # and OTEL_BLRP_MAX_EXPORT_BATCH_SIZE
BODY_MAX = 1000                 # characters of a record's body (titles carry process names)
SCOPE = "gpuwhy"
# name suffix -> UCUM unit (what OpenTelemetry writes units in); a Collector's Prometheus
# exporter turns each back into the suffix the name already has, so it adds none
_UNIT_SUFFIXES = (("_bytes_per_second", "By/s"), ("_bytes", "By"), ("_seconds", "s"),
                  ("_ratio", "1"), ("_watts", "W"), ("_hertz", "Hz"), ("_celsius", "Cel"),
                  ("_joules", "J"), ("_per_second", "1/s"))


def _own_version() -> str:
    try:
        return version("gpuwhy")
    except PackageNotFoundError:
        return "unknown"


def resource(config: Mapping[str, Any]) -> Resource:
    """gpuwhy's resource: service name and version and the host's name, under what
    ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` say (theirs win)."""
    own_version = _own_version()
    host = host_name(config)
    # service.instance.id: what a Collector's Prometheus exporters make the instance label
    # of; without it every host's series would be one series (job="gpuwhy", instance="")
    attributes: dict[str, Any] = {"service.name": "gpuwhy", "service.version": own_version,
                                  "service.instance.id": host, "host.name": host}
    attributes.update(OTELResourceDetector().detect().attributes)
    if os.environ.get("OTEL_SERVICE_NAME", "").strip():
        attributes["service.name"] = os.environ["OTEL_SERVICE_NAME"].strip()
    return Resource.create(attributes)


# --- counting what the exporters did ----------------------------------------------------------
@dataclass
class Figures:
    """What the export did since it started (the ``otlp`` health row's counters)."""

    metric_exports: int = 0
    dropped_metric_exports: int = 0     # refused, failed or timed out: that snapshot is lost
    metric_points: int = 0
    log_records_taken: int = 0          # handed to the SDK's queue
    log_records_handed: int = 0         # taken out of the queue by its exporting thread
    log_records_exported: int = 0
    dropped_log_records: int = 0        # in batches refused, failed or timed out
    store_errors: int = 0
    collect_seconds: float = 0.0        # CPU of reading the families (this process's threads)
    failing: str | None = None          # the last failure, while exports fail
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def counters(self) -> dict[str, int]:
        return {"metric_exports": self.metric_exports,
                "dropped_metric_exports": self.dropped_metric_exports,
                "metric_points": self.metric_points,
                "log_records_taken": self.log_records_taken,
                "log_records_exported": self.log_records_exported,
                "dropped_log_records": self.dropped_log_records,
                "log_records_queued": self.log_records_taken - self.log_records_handed,
                "store_errors": self.store_errors}


def _points(data: MetricsData) -> int:
    return sum(len(metric.data.data_points) for rm in data.resource_metrics
               for sm in rm.scope_metrics for metric in sm.metrics)


class CountingMetricExporter(MetricExporter):
    """The OTLP metric exporter, each export's outcome counted."""

    def __init__(self, inner: MetricExporter, figures: Figures) -> None:
        super().__init__(preferred_temporality=getattr(inner, "_preferred_temporality", None),
                         preferred_aggregation=getattr(inner, "_preferred_aggregation", None))
        self.inner, self.figures = inner, figures
        self.encoder = MetricsEncoder()
        # The OTLP/HTTP exporter sends a request already encoded through its one-batch path
        # (its size limit, retries, compression and timeout all kept): ours is encoded at
        # half the CPU (gpuwhy/app/otlp_encode.py). An exporter without that path, or asked to
        # split batches, is given the data as the SDK's public API takes it.
        send = getattr(inner, "_export_batch", None)
        self._send_encoded = send if callable(send) and \
            getattr(inner, "_max_export_batch_size", None) is None else None

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: Any) -> MetricExportResult:
        try:
            if self._send_encoded is not None and not getattr(self.inner, "_shutdown", False):
                result = self._send_encoded(self.encoder.encode(metrics_data))
            else:
                result = self.inner.export(metrics_data, timeout_millis=timeout_millis,
                                           **kwargs)
        except Exception as exc:  # noqa: BLE001 - an exporter's failure is counted, never raised
            result, why = MetricExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        else:
            why = "the collector refused or did not answer the metrics in time"
        with self.figures.lock:
            if result is MetricExportResult.SUCCESS:
                self.figures.metric_exports += 1
                self.figures.metric_points += _points(metrics_data)
                self.figures.failing = None
            else:
                self.figures.dropped_metric_exports += 1
                self.figures.failing = why
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class CountingLogExporter(LogRecordExporter):
    """The OTLP log exporter, each batch's outcome counted."""

    def __init__(self, inner: LogRecordExporter, figures: Figures) -> None:
        self.inner, self.figures = inner, figures

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        with self.figures.lock:
            self.figures.log_records_handed += len(batch)
        try:
            result = self.inner.export(batch)
        except Exception as exc:  # noqa: BLE001 - counted, never raised
            result, why = LogRecordExportResult.FAILURE, f"{type(exc).__name__}: {exc}"
        else:
            why = "the collector refused or did not answer the log records in time"
        with self.figures.lock:
            if result is LogRecordExportResult.SUCCESS:
                self.figures.log_records_exported += len(batch)
                self.figures.failing = None
            else:
                self.figures.dropped_log_records += len(batch)
                self.figures.failing = why
        return result

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.inner.shutdown()


# --- metrics: the /metrics families through observable instruments -----------------------------
def unit_of(name: str) -> str:
    """The UCUM unit a family's name ends in ("" when it names none)."""
    return next((unit for suffix, unit in _UNIT_SUFFIXES if name.endswith(suffix)), "")


def metrics_registry(open_db: Callable[[], Database],
                     config: Mapping[str, Any] | None) -> CollectorRegistry:
    """The collectors ``/metrics`` registers (gpuwhy.webui.metrics.register_metrics): the
    store's families, and this process's own figures."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(open_db, config=config))
    if os.path.exists("/proc/self/stat"):
        ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class FamilySnapshot:
    """The families a Prometheus collector yields, as the SDK's metrics data: :meth:`read`
    reads them once (one read of the store) and returns what to export."""

    def __init__(self, the_resource: Resource, collector: Collector) -> None:
        self.resource = the_resource
        self.scope = InstrumentationScope(SCOPE, _own_version())
        self.collector = collector
        self.kinds: dict[str, str] = {}        # family name -> counter or gauge, as first seen
        self.started: dict[str, int] = {}      # a counter's start: when it was first read

    def read(self) -> tuple[MetricsData, int]:
        """(the families as metrics data, how many points they hold)."""
        now = now_ns()
        metrics = [metric for family in self.collector.collect()
                   if (metric := self._metric(family, now)) is not None]
        data = MetricsData([ResourceMetrics(self.resource, [ScopeMetrics(
            self.scope, metrics, "")], "")])
        return data, sum(len(m.data.data_points) for m in metrics)

    def _metric(self, family: Metric, now: int) -> OtelMetric | None:
        if family.type == "counter":
            name, sample_name, kind = family.name, f"{family.name}_total", "counter"
        elif family.type in ("gauge", "info", "unknown", "stateset"):
            name, sample_name, kind = family.name, None, "gauge"
        else:           # histograms and summaries: /metrics has none; never guessed at
            return None
        if self.kinds.setdefault(name, kind) != kind:
            return None     # a family that changed its type keeps the one it had
        start = self.started.setdefault(name, now) if kind == "counter" else 0
        points = [NumberDataPoint(dict(sample.labels), start, now, sample.value)
                  for sample in family.samples
                  if (sample.name == sample_name if sample_name is not None
                      else not sample.name.endswith("_created"))   # not a series of its own
                  and math.isfinite(sample.value)]
        if not points:
            return None
        data: Sum | Gauge = Sum(points, AggregationTemporality.CUMULATIVE, True) \
            if kind == "counter" else Gauge(points)
        return OtelMetric(name, family.documentation, unit_of(name), data)


def _what(change: Mapping[str, Any]) -> str:
    action = change["action"]
    if action == "resolved" and change.get("resolution"):
        return f"resolved ({change['resolution']})"
    if action in ("acknowledged", "resolved", "note") and change.get("actor"):
        return f"{'noted' if action == 'note' else action} by {change['actor']}"
    return action


def log_record_fields(change: Mapping[str, Any]) -> dict[str, Any]:
    """The log record of one feed change (store/feed.py ``incident_changes``): severity,
    body, attributes, event name, timestamp. Attributes with no value are left out."""
    incident = change["incident"]
    severity = incident["severity"] or sev.DEFAULT
    title = incident["title"] or incident["kind"]
    body = f"gpuwhy incident {incident['id']} {_what(change)}: {title}"
    if incident.get("summary"):
        body += f" - {incident['summary']}"
    attributes: dict[str, Any] = {
        "gpuwhy.change.cursor": change["cursor"], "gpuwhy.change.action": change["action"],
        "gpuwhy.change.actor": change.get("actor"), "gpuwhy.change.state": change.get("state"),
        "gpuwhy.change.resolution": change.get("resolution"),
        "gpuwhy.change.text": one_line(change["text"], BODY_MAX) if change.get("text") else None,
    }
    for key, value in incident.items():
        if key in ("title", "summary") and value:
            value = one_line(str(value), BODY_MAX)
        attributes[f"gpuwhy.incident.{key}"] = value
    return {"timestamp": int(change["ts"]), "severity_text": severity,
            "severity_number": SeverityNumber(sev.otlp_severity_number(severity)),
            "body": one_line(body, BODY_MAX), "event_name": f"gpuwhy.incident.{change['action']}",
            "attributes": {k: v for k, v in attributes.items() if v is not None}}


# --- the exporter -------------------------------------------------------------------------------
def _env_int(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, default)))
    except ValueError:
        return default


class OtlpExporter:
    """Metrics every ``otlp.interval`` and the incident feed every second, over OTLP/HTTP.

    ``start()`` starts its threads and returns; ``stop()`` flushes within the exporters'
    timeout. ``step()`` and ``export_metrics()`` are one round of each, for tests."""

    def __init__(self, config: Config, db: Database, the_plan: Plan | None = None,
                 open_reader: Callable[[], Database] | None = None) -> None:
        from gpuwhy.store import open_store

        self.config = config
        self.plan = the_plan or plan()
        self.db = db                    # its own connection: the cursor and the health row
        self.health = StoreWriter(db)
        self.interval = float(config["otlp.interval"])
        self.figures = Figures()
        self.queue_size = _env_int("OTEL_BLRP_MAX_QUEUE_SIZE", DEFAULT_QUEUE)
        # the SDK refuses a batch larger than the queue: a small queue makes small batches
        self.batch_size = min(self.queue_size, _env_int("OTEL_BLRP_MAX_EXPORT_BATCH_SIZE",
                                                        DEFAULT_BATCH))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._next_health = 0.0
        the_resource = resource(config)
        self.metric_exporter: CountingMetricExporter | None = None
        self.snapshot: FamilySnapshot | None = None
        if self.plan.metrics.endpoint:
            self.metric_exporter = CountingMetricExporter(
                OTLPMetricExporter(endpoint=self.plan.metrics.endpoint), self.figures)
            store_path = config["store.path"]
            opener = open_reader or (lambda: open_store(store_path, readonly=True))
            self.snapshot = FamilySnapshot(the_resource, metrics_registry(opener, config))
        self.logger_provider: LoggerProvider | None = None
        if self.plan.logs.endpoint:
            self.logger_provider = LoggerProvider(resource=the_resource)
            self.logger_provider.add_log_record_processor(BatchLogRecordProcessor(
                CountingLogExporter(OTLPLogExporter(endpoint=self.plan.logs.endpoint),
                                    self.figures), max_queue_size=self.queue_size,
                max_export_batch_size=self.batch_size))
            self.logger = self.logger_provider.get_logger(SCOPE)

    # --- metrics ------------------------------------------------------------------------------
    def export_metrics(self) -> bool:
        """Read the families and export them once; whether the collector took them."""
        if self.snapshot is None or self.metric_exporter is None:
            return False
        started = time.thread_time()
        try:
            data, _ = self.snapshot.read()
        except sqlite3.Error as exc:
            self._store_error(exc)
            return False
        finally:
            self.figures.collect_seconds += time.thread_time() - started
        # bounded by the exporter's timeout (OTEL_EXPORTER_OTLP[_METRICS]_TIMEOUT)
        return self.metric_exporter.export(data) is MetricExportResult.SUCCESS

    def _run_metrics(self) -> None:
        while not self._stop.wait(self.interval):
            self.export_metrics()

    # --- logs ---------------------------------------------------------------------------------
    def room(self) -> int:
        """Records the log queue can take now without dropping one."""
        with self.figures.lock:
            queued = self.figures.log_records_taken - self.figures.log_records_handed
        return max(0, self.queue_size - queued)

    def take_in(self) -> int:
        """Hand the feed's new changes to the log queue, as far as it has room, after moving
        the stored cursor past them; returns how many. The first run stores the newest cursor
        and hands over nothing."""
        if self.logger_provider is None:
            return 0
        room = min(TAKE_MAX, self.room())
        if room == 0:
            return 0            # a stalled collector: the rest waits in the store
        db, now = self.db, now_ns()
        # read first, outside a transaction: a step with nothing new (most) takes no write
        # lock from the correlator; only this exporter writes its cursor, so it cannot move
        # between the read and the write
        at = alertpush.cursor(db, SOURCE)
        if at is None:
            with alertpush.write_transaction(db):
                alertpush.set_cursor(db, feed.latest_cursor(db), now, SOURCE)
            return 0
        changes = feed.incident_changes(db, at, room)
        if not changes:
            return 0
        # the cursor moves before they are handed over: a crash between loses them, and a
        # restart never sends one twice
        with alertpush.write_transaction(db):
            alertpush.set_cursor(db, changes[-1]["cursor"], now, SOURCE)
        empty = Context()       # no trace: an incident is no span's event
        for change in changes:
            self.logger.emit(context=empty, observed_timestamp=now,
                             **log_record_fields(change))
        with self.figures.lock:
            self.figures.log_records_taken += len(changes)
        return len(changes)

    def step(self) -> None:
        """One round of the feed, and the health row when it is due."""
        try:
            self.take_in()
        except sqlite3.Error as exc:
            self._store_error(exc)
        if time.monotonic() >= self._next_health:
            self.write_health()
            self._next_health = time.monotonic() + HEALTH_EVERY

    def _run_feed(self) -> None:
        while not self._stop.is_set():
            self.step()
            self._stop.wait(STEP_EVERY)

    # --- health -------------------------------------------------------------------------------
    def _store_error(self, exc: sqlite3.Error) -> None:
        self.figures.store_errors += 1
        if self.figures.store_errors == 1 or self.figures.store_errors % 100 == 0:
            log.warning("the OTLP exporter cannot read the store: %s", exc)

    def state(self) -> tuple[str, str]:
        """``ok`` or ``down`` (exports fail now), and the line `gpuwhy status` shows."""
        detail = self.plan.describe()
        if self.plan.metrics.endpoint:
            detail += f", every {self.interval:g} s"
        failing = self.figures.failing
        return ("down", f"{detail}: {failing}") if failing else ("ok", detail)

    def write_health(self) -> None:
        state, detail = self.state()
        with self.figures.lock:
            counters = self.figures.counters()
        try:
            self.health.record_health(SOURCE, state, detail, counters, now_ns())
        except sqlite3.Error as exc:
            self._store_error(exc)

    # --- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the export threads; returns at once."""
        from gpuwhy.threads import Thread

        log.info("OTLP export: %s", self.plan.describe())
        targets = [("feed", self._run_feed)]
        if self.snapshot is not None:
            targets.append(("metrics", self._run_metrics))
        for name, target in targets:
            thread = Thread(target=target, name=f"gpuwhy-otlp-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads, then flush what is queued (each export bounded by its timeout);
        the last health row says what was dropped."""
        from gpuwhy.threads import Thread

        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        # The SDK's shutdown flushes the log queue batch by batch, each bounded by the
        # exporter's timeout but the whole by none we can pass: on a thread of its own,
        # waited for until the deadline, so a stalled collector cannot hold up a stop.
        closer = Thread(target=self._shutdown_sdk, args=(timeout,), name="gpuwhy-otlp-close",
                        daemon=True)
        closer.start()
        closer.join(max(0.0, deadline - time.monotonic()))
        self.write_health()

    def _shutdown_sdk(self, timeout: float) -> None:
        if self.logger_provider is not None:
            with contextlib.suppress(Exception):    # what it could not send is counted
                self.logger_provider.shutdown()
        if self.metric_exporter is not None:
            with contextlib.suppress(Exception):
                self.metric_exporter.shutdown(timeout_millis=timeout * 1000)


