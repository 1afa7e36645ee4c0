"""`/metrics` for Prometheus: GPU counters, per-process attribution, incidents, source health.

A custom collector reads the store at scrape time (nothing is kept in this process); it
is registered in a registry passed in, never the global one. Names are ``gpuwhy_*`` in
base units (ratios 0-1, bytes, watts, seconds). Per-process series are bounded: the
``max_processes`` processes with the most GPU memory or driver calls get their own
series (labelled pid, start_time, comm), the rest are summed under ``pid="other"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from flask import Flask, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlite_utils import Database

from gpuwhy import severity as sev
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.gpu_health import STATES as HEALTH_STATES
from gpuwhy.gpu_health import is_live
from gpuwhy.stalls import STALL_FACTOR, STALLED, judge, stall_counts
from gpuwhy.store.queries import (
    bound_process_counts,
    driver_call_totals_of_living_processes,
    gpu_health_states,
    incident_counts,
    latest_gpu_process_lists,
    latest_gpu_samples,
    open_incident_counts,
    source_health,
)

MAX_PROCESSES = 50
MIB = 1 << 20
# latest-sample column -> (metric suffix, help, scale to base units)
_GPU_FIELDS = {
    "gpu_util": ("utilization_ratio", "GPU utilisation (share of time a kernel ran)", 0.01),
    "sm_active": ("sm_active_ratio", "share of SM cycles with a warp resident", 1.0),
    "tensor_active": ("tensor_active_ratio", "share of cycles the tensor cores were busy", 1.0),
    "dram_active": ("dram_active_ratio", "share of cycles the memory interface was busy", 1.0),
    "fb_used_mib": ("memory_used_bytes", "framebuffer memory in use", MIB),
    "power_w": ("power_watts", "power draw", 1.0),
    "temp_c": ("temperature_celsius", "GPU temperature", 1.0),
    "pcie_rx_bytes_per_s": ("pcie_rx_bytes_per_second", "PCIe receive rate", 1.0),
    "pcie_tx_bytes_per_s": ("pcie_tx_bytes_per_second", "PCIe transmit rate", 1.0),
}
_LOSS_WORDS = ("drop", "lost", "gap", "late_beyond_lag", "rejected", "decode_error",
               "overflow", "clock_ahead")


class StoreCollector(Collector):
    """Reads the store on each ``collect``; ``open_db`` gives a read-only connection."""

    def __init__(self, open_db: Callable[[], Database], max_processes: int = MAX_PROCESSES,
                 config: Mapping[str, Any] | None = None):
        self.open_db = open_db
        self.max_processes = max_processes
        self.config = config   # the sources' heartbeat periods (gpuwhy.stalls)

    def collect(self) -> Iterator[Metric]:
        with contextlib.closing(self.open_db()) as db:
            yield from self._gpus(db)
            yield from self._processes(db)
            yield from self._incidents(db)
            yield from self._sources(db)

    def _gpus(self, db: Database) -> Iterator[Metric]:
        columns = [c for c in _GPU_FIELDS if c in db["gpu_samples"].columns_dict]
        rows = latest_gpu_samples(db, columns)
        health = dict(gpu_health_states(db))
        families = {c: GaugeMetricFamily(f"gpuwhy_gpu_{_GPU_FIELDS[c][0]}", _GPU_FIELDS[c][1],
                                         labels=["gpu", "simulated"]) for c in columns}
        sample_time = GaugeMetricFamily("gpuwhy_gpu_last_sample_timestamp_seconds",
                                        "when the GPU's latest sample was taken",
                                        labels=["gpu", "simulated"])
        for row in rows:
            gpu, ts, values, simulated = row[0], row[1], row[2:-1], str(bool(row[-1])).lower()
            sample_time.add_metric([gpu, simulated], ts / NS_PER_SECOND)
            if not is_live(health.get(gpu)):
                continue    # a lost or resetting GPU's last numbers are not its numbers now
            for column, value in zip(columns, values, strict=True):
                if value is not None:
                    families[column].add_metric([gpu, simulated], value * _GPU_FIELDS[column][2])
        yield sample_time
        yield from families.values()
        states = GaugeMetricFamily("gpuwhy_gpu_health", "1 for the GPU's health state (ok, "
                                   "degraded, reset_required, reboot_required, lost, "
                                   "resetting), 0 for the others", labels=["gpu", "state"])
        for gpu, state in health.items():
            for name in HEALTH_STATES:
                states.add_metric([gpu, name], 1.0 if name == state else 0.0)
        yield states
        bound = GaugeMetricFamily("gpuwhy_gpu_bound_processes",
                                  "processes holding the GPU's device file now", labels=["gpu"])
        for gpu, count in bound_process_counts(db):
            bound.add_metric([gpu], count)
        yield bound

    def _processes(self, db: Database) -> Iterator[Metric]:
        labels = ["pid", "start_time", "comm"]
        calls = CounterMetricFamily("gpuwhy_process_driver_calls",
                                    "NVIDIA driver calls (ioctls) of a living process",
                                    labels=labels)
        rows = driver_call_totals_of_living_processes(db)
        for pid, start_time, comm, n in rows[:self.max_processes]:
            calls.add_metric([str(pid), str(start_time), comm[:32]], n)
        if rows[self.max_processes:]:
            calls.add_metric(["other", "", ""], sum(r[3] for r in rows[self.max_processes:]))
        yield calls
        memory = GaugeMetricFamily("gpuwhy_process_gpu_memory_used_bytes",
                                   "GPU memory of a process (NVML's latest process list)",
                                   labels=["gpu", *labels])
        sm = GaugeMetricFamily("gpuwhy_process_sm_utilization_ratio",
                               "the process's share of SM time (NVML)", labels=["gpu", *labels])
        rows = latest_gpu_process_lists(db)
        for gpu, pid, start_time, comm, mib, sm_util in rows[:self.max_processes]:
            key = [gpu, str(pid), str(start_time), comm[:32]]
            if mib is not None:
                memory.add_metric(key, mib * MIB)
            if sm_util is not None:
                sm.add_metric(key, sm_util / 100)
        yield memory
        yield sm

    def _incidents(self, db: Database) -> Iterator[Metric]:
        total = CounterMetricFamily("gpuwhy_incidents", "incidents opened, by kind and "
                                    "severity (repeats merged into one)",
                                    labels=["kind", "severity"])
        open_now = GaugeMetricFamily("gpuwhy_incidents_open", "incidents still open",
                                     labels=["kind"])
        # Labelled on the one scale, worst first: a row stored under a legacy name (before
        # m103, or by an older process) counts under its new name, not as a series of its own.
        counts: dict[tuple[str, str], int] = {}
        for kind, severity, count in incident_counts(db):
            name = sev.normalise(severity) if sev.is_severity(severity) else severity
            counts[kind, name] = counts.get((kind, name), 0) + count
        for (kind, severity), count in sorted(counts.items(),
                                              key=lambda kv: (kv[0][0], sev.sort_key(kv[0][1]))):
            total.add_metric([kind, severity], count)
        for kind, opened in open_incident_counts(db):
            open_now.add_metric([kind], opened)
        yield total
        yield open_now

    def _sources(self, db: Database) -> Iterator[Metric]:
        up = GaugeMetricFamily("gpuwhy_source_up", "1 when the source says ok, 0.5 degraded, "
                               "0 failed", labels=["source"])
        seen = GaugeMetricFamily("gpuwhy_source_last_seen_timestamp_seconds",
                                 "the source's last heartbeat", labels=["source"])
        lost = CounterMetricFamily("gpuwhy_events_lost", "events lost, dropped or refused, "
                                   "by source and reason", labels=["source", "reason"])
        stalled = GaugeMetricFamily("gpuwhy_source_stalled", "1 while the source is stalled: "
                                    f"silent, or stuck in a read, for {STALL_FACTOR} of its "
                                    "periods (gpuwhy status)", labels=["source"])
        stalls = CounterMetricFamily("gpuwhy_source_stalls", "stall episodes of the source "
                                     "since the correlator started", labels=["source"])
        rows = source_health(db)
        episodes = stall_counts(rows)
        for health in judge(rows, now_ns(), self.config):
            source = health["source"]
            up.add_metric([source], {"ok": 1.0, "degraded": 0.5}.get(health["state"], 0.0))
            stalled.add_metric([source], 1.0 if health["state"] == STALLED else 0.0)
            stalls.add_metric([source], episodes.get(source, 0))
            seen.add_metric([source], (health["last_seen"] or 0) / NS_PER_SECOND)
            for reason, value in health["counters"].items():
                if isinstance(value, int | float) and any(w in reason for w in _LOSS_WORDS):
                    lost.add_metric([source, reason[:64]], value)
        yield up
        yield seen
        yield lost
        yield stalled
        yield stalls


def register_metrics(app: Flask, registry: CollectorRegistry | None = None) -> None:
    """Serve ``/metrics`` from ``registry`` (a new one by default) with the store collector."""
    from gpuwhy.store import open_store

    registry = registry or CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(lambda: open_store(app.config["DATABASE"], readonly=True),
                                     config=app.config.get("GPUWHY")))

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
