"""`/metrics` for Prometheus: GPU fields and health, Xids, processes, owners, incidents, rules,
inference engines.

A custom collector reads the store at scrape time; it is registered in a registry passed
in, never the global one. Names are ``gpuwhy_*`` in base units (ratios 0-1, bytes, watts,
hertz, joules, seconds). Every field of the GPU field table (gpuwhy/gpufields.py) the store
keeps is exported without code of its own: its name and unit give the metric's name, scale
and type (counts and accumulated energy or time are counters). Per-GPU series carry
gpuwhy's ``gpu`` (the GPU id: its UUID where known) and, beside it, dcgm-exporter's label
names ``UUID``, ``pci_bus_id`` (NVML's form) and ``Hostname``, so that both join on
``UUID`` (dcgm-exporter's ``modelName`` is camelCase, which ``promtool check metrics``
rejects: the model is a label of ``gpuwhy_gpu_info``).

Cardinality is bounded: the ``max_processes`` processes with the most GPU memory or driver
calls get their own series (pid, start_time, comm, pod_uid, container), the rest are summed
under ``pid="other"``; an inference engine (``gpuwhy_engine_*``) is one series per engine
instance (engine, pid, endpoint port, GPUs), from its latest scrape of the last
``ENGINE_FRESH_NS``, never per request or model; Xid codes outside the catalogue count under
``xid="other"``; the first ``max_owners`` owners (user, pod, container) seen idle get their
own idle-while-held series and keep it, later ones are summed under ``"other"``, so that
every counter only grows. The idle-while-held counter is the one figure this process keeps:
GPU-seconds of whole-GPU samples at or under ``correlator.stall_util_pct`` while an owner's
process held the GPU, counted from the samples stored since this process started.

Scrapes are answered from a snapshot (:class:`Snapshot`): rendered at most once a second, one
render shared by every scrape that waits for it, so a crowd of scrapers costs one store read a
second rather than one each. An answer comes from a read of the store begun less than a
second before the scrape arrived (or after), and a lone scrape after the store changed waits
for the next render rather than take the older one.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlite_utils import Database

from gpuwhy import severity as sev
from gpuwhy.clock import NS_PER_SECOND, now_ns
from gpuwhy.gpu_health import STATES as HEALTH_STATES
from gpuwhy.gpu_health import is_live
from gpuwhy.gpufields import SAMPLE_FIELDS, THROTTLE_BITS, Field
from gpuwhy.rules.loader import configured_rule_set
from gpuwhy.rules.model import Rule
from gpuwhy.rules.vocabulary import ENGINE_VALUES
from gpuwhy.stalls import STALL_FACTOR, STALLED, judge, stall_counts
from gpuwhy.store import alertpush
from gpuwhy.store.engines import latest_engine_samples
from gpuwhy.store.queries import (
    bound_process_counts,
    driver_call_totals_of_living_processes,
    gpu_columns,
    gpu_identities,
    gpu_sample_columns,
    gpu_verdicts,
    holders_between,
    incident_counts,
    latest_gpu_process_lists,
    latest_gpu_samples,
    open_finding_counts,
    open_incident_counts,
    source_health,
    whole_gpu_utilisation,
    xid_counts,
)
from gpuwhy.xid import xid_info

MAX_PROCESSES = 50
MAX_OWNERS = 20
MIB = 1 << 20
OTHER = "other"
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "Hostname", "simulated"]
PROCESS_LABELS = ["pid", "start_time", "comm", "pod_uid", "container"]
OWNER_LABELS = ["user", "pod_uid", "container"]
ENGINE_LABELS = ["engine", "pid", "port", "gpus", "Hostname"]
# An engine scraped within this long is still serving (scrapes come every 5 s; a few missed
# ones are not an engine gone, an engine stopped for longer leaves /metrics)
ENGINE_FRESH_NS = 120 * NS_PER_SECOND
# Columns of the gpus table shown on gpuwhy_gpu_info where the store has them (a source
# that learns the VBIOS or the ECC, MIG or persistence mode adds the column).
INFO_COLUMNS = ("driver_version", "vbios_version", "ecc_mode", "mig_mode", "persistence_mode",
                "compute_mode", "cuda_version")
# unit of the field table -> (metric suffix, scale to base units, counter)
_UNITS: dict[str, tuple[str, float, bool]] = {
    "%": ("ratio", 0.01, False), "ratio": ("ratio", 1.0, False),
    "MHz": ("hertz", 1e6, False), "°C": ("celsius", 1.0, False), "W": ("watts", 1.0, False),
    "mJ": ("joules", 1e-3, True), "ns": ("seconds", 1e-9, True),
    "MiB": ("bytes", float(MIB), False), "B/s": ("bytes_per_second", 1.0, False),
    "count": ("", 1.0, True),
}
# the unit words field names end in, dropped before the base unit's suffix goes on
_UNIT_WORDS = re.compile(r"_(mhz|c|w|mj|ns|mib|bytes_per_s|pct|percent)$")
# Names published before the generic ones: kept, dashboards and rules are built on them.
_NAMED = {"gpu_util": "gpuwhy_gpu_utilization_ratio",
          "fb_used_mib": "gpuwhy_gpu_memory_used_bytes",
          "fb_total_mib": "gpuwhy_gpu_memory_total_bytes",
          "temp_c": "gpuwhy_gpu_temperature_celsius",
          "mem_temp_c": "gpuwhy_gpu_memory_temperature_celsius"}
REASONS_FIELD = "clocks_event_reasons"
# how late a GPU's samples may be stored after another's and still count as idle time
LATE_NS = 60 * NS_PER_SECOND
_LOSS_WORDS = ("drop", "lost", "gap", "late_beyond_lag", "rejected", "decode_error",
               "overflow", "clock_ahead")


@dataclass(frozen=True)
class FieldMetric:
    """How one field of the field table is exported."""

    field: Field
    name: str          # without the _total a counter gets
    scale: float
    counter: bool

    def family(self) -> GaugeMetricFamily | CounterMetricFamily:
        help_text = (f"GPU field {self.field.name} (DCGM field id {self.field.field_id}, read "
                     f"in {self.field.unit}) in base units")
        kind = CounterMetricFamily if self.counter else GaugeMetricFamily
        return kind(self.name, help_text, labels=GPU_LABELS)


def field_metric(field: Field) -> FieldMetric | None:
    """The metric of a sample field; None for the clock-event bitmask (one 0/1 series per
    reason instead). A unit not in the table exports the value as read, as a gauge."""
    if field.name == REASONS_FIELD:
        return None
    suffix, scale, counter = _UNITS.get(field.unit, ("", 1.0, False))
    name = _NAMED.get(field.name)
    if name is None:
        stem = _UNIT_WORDS.sub("", field.name) if suffix else field.name
        name = f"gpuwhy_gpu_{stem}" + (f"_{suffix}" if suffix and not
                                         stem.endswith(suffix) else "")
    return FieldMetric(field, name.removesuffix("_total"), scale, counter)


FIELD_METRICS: dict[str, FieldMetric] = {
    f.name: m for f in SAMPLE_FIELDS if (m := field_metric(f)) is not None}


def dcgm_pci(pci: str | None) -> str:
    """A PCI address as NVML and dcgm-exporter write it (``00000000:3B:00.0``)."""
    parts = (pci or "").split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or not re.fullmatch(r"[0-9A-Fa-f]{1,8}", parts[0]):
        return (pci or "").upper()
    return f"{int(parts[0], 16):08X}:{parts[1].upper()}:{parts[2].upper()}"


def host_name(config: Mapping[str, Any] | None) -> str:
    """The Hostname label: the web.hostname setting, else the host's name."""
    return str((config or {}).get("web.hostname") or socket.gethostname())


class IdleWhileHeld:
    """Idle GPU-seconds while held, per owner, from the samples stored since it was made."""

    def __init__(self, threshold_pct: float, interval_s: float, max_owners: int):
        self.threshold = threshold_pct
        self.interval_ns = int(interval_s * NS_PER_SECOND)
        self.max_owners = max_owners
        self.started = now_ns()
        self.seen: dict[str, int] = {}              # GPU id -> latest sample counted
        self.totals: dict[tuple[str, str, str], float] = {}
        self.lock = threading.Lock()

    def owner(self, uid: int | None, pod: str | None, container: str | None) -> tuple:
        return (_user(uid), pod or "", container or "")

    def update(self, db: Database) -> dict[tuple[str, str, str], float]:
        with self.lock:
            # from the GPU read longest ago, but never more than LATE_NS before the newest: a
            # lost GPU's old mark must not make every scrape read all samples since
            newest = max(self.seen.values(), default=self.started)
            after = max(min(self.seen.values(), default=self.started), newest - LATE_NS)
            samples = whole_gpu_utilisation(db, after)
            if not samples:
                return dict(self.totals)
            holders: dict[str, list[tuple]] = {}
            for gpu, since, bound_until, uid, pod, container in holders_between(
                    db, after, samples[-1][1]):
                holders.setdefault(gpu, []).append(
                    (since, bound_until, self.owner(uid, pod, container)))
            for gpu, ts, util in samples:
                previous = self.seen.get(gpu)
                if previous is not None and ts <= previous:
                    continue          # counted already (the window starts at the oldest GPU)
                self.seen[gpu] = ts
                if util is None or util > self.threshold:
                    continue
                # a gap in the samples is not idle time: at most two intervals count
                gap = self.interval_ns if previous is None else min(ts - previous,
                                                                     2 * self.interval_ns)
                owners = {o for since, end, o in holders.get(gpu, ())
                          if since <= ts and (end is None or end > ts)}
                for owner in owners:
                    self._add(owner, gap / NS_PER_SECOND)
            return dict(self.totals)

    def _add(self, owner: tuple[str, str, str], seconds: float) -> None:
        named = [o for o in self.totals if o != (OTHER, OTHER, OTHER)]
        if owner not in self.totals and len(named) >= self.max_owners:
            owner = (OTHER, OTHER, OTHER)
        self.totals[owner] = self.totals.get(owner, 0.0) + seconds


_USERS: dict[int, str] = {}


def _user(uid: int | None) -> str:
    """The user name of a uid (the uid where this host does not know it: a container's)."""
    if uid is None:
        return ""
    if uid not in _USERS:
        try:
            _USERS[uid] = pwd.getpwuid(uid).pw_name
        except (KeyError, OverflowError):
            _USERS[uid] = str(uid)
    return _USERS[uid]


class StoreCollector(Collector):
    """Reads the store on each ``collect``; ``open_db`` gives a read-only connection."""

    def __init__(self, open_db: Callable[[], Database], max_processes: int = MAX_PROCESSES,
                 config: Mapping[str, Any] | None = None, max_owners: int | None = None):
        self.open_db = open_db
        self.max_processes = max_processes
        self.config = config   # the sources' heartbeat periods (gpuwhy.stalls)
        settings = config or {}
        self.hostname = host_name(config)
        self._rule_set: dict[str, Rule] | None = None
        self.idle = IdleWhileHeld(
            float(settings.get("correlator.stall_util_pct", 5.0)),
            float(settings.get("gpu.interval", 1.0)),
            max_owners if max_owners is not None else
            int(settings.get("web.metrics_owners", MAX_OWNERS)))

    def collect(self) -> Iterator[Metric]:
        with contextlib.closing(self.open_db()) as db:
            gpus = {g["id"]: g for g in gpu_identities(db, INFO_COLUMNS)}
            yield from self._gpus(db, gpus)
            yield from self._xids(db, gpus)
            yield from self._processes(db)
            yield from self._owners(db)
            yield from self._incidents(db)
            yield from self._findings(db)
            yield from self._answers(db, gpus)
            yield from self._sources(db)
            yield from self._alertmanager(db)
            yield from self._engines(db, gpus)

    def _gpu_labels(self, gpus: dict[str, dict], gpu: str | None) -> list[str]:
        row = gpus.get(gpu or "") or {}
        return [gpu or "", row.get("uuid") or "", dcgm_pci(row.get("pci_bus_id")),
                self.hostname, str(bool(row.get("simulated"))).lower()]

    def _gpus(self, db: Database, gpus: dict[str, dict]) -> Iterator[Metric]:
        have = gpu_sample_columns(db)
        exported = [m for m in FIELD_METRICS.values() if m.field.name in have]
        reasons_kept = REASONS_FIELD in have
        columns = [m.field.name for m in exported] + ([REASONS_FIELD] if reasons_kept else [])
        rows = latest_gpu_samples(db, columns)
        families = {m.field.name: m.family() for m in exported}
        reasons = GaugeMetricFamily(
            "gpuwhy_gpu_clocks_event_reason", "1 while the clock-event (throttle) reason "
            "holds the GPU's clocks back (DCGM field 112, NVML clocks event reasons), else 0",
            labels=[*GPU_LABELS, "reason"])
        sample_time = GaugeMetricFamily("gpuwhy_gpu_last_sample_timestamp_seconds",
                                        "when the GPU's latest sample was taken",
                                        labels=GPU_LABELS)
        for row in rows:
            gpu, ts, values = row[0], row[1], row[2:-1]
            labels = self._gpu_labels(gpus, gpu)
            sample_time.add_metric(labels, ts / NS_PER_SECOND)
            if not is_live((gpus.get(gpu) or {}).get("health")):
                continue    # a lost or resetting GPU's last numbers are not its numbers now
            by_name = dict(zip(columns, values, strict=True))
            for metric in exported:
                value = by_name[metric.field.name]
                if value is not None:
                    families[metric.field.name].add_metric(labels, value * metric.scale)
            bits = by_name.get(REASONS_FIELD)
            if bits is not None:
                for reason, bit in THROTTLE_BITS.items():
                    reasons.add_metric([*labels, reason.lower()], 1.0 if int(bits) & bit else 0.0)
        yield sample_time
        yield from families.values()
        yield reasons
        states = GaugeMetricFamily("gpuwhy_gpu_health", "1 for the GPU's health state (ok, "
                                   "degraded, reset_required, reboot_required, lost, "
                                   "resetting), 0 for the others", labels=[*GPU_LABELS, "state"])
        identity = gpu_columns(db)
        info = GaugeMetricFamily(
            "gpuwhy_gpu_info", "1 per GPU, its identity as labels (model, index, minor, GPU "
            "source, driver, and VBIOS, ECC/MIG/persistence mode where the source read them)",
            labels=[*GPU_LABELS, "model", "index", "minor", "source",
                    *(c for c in INFO_COLUMNS if c in identity)])
        for gpu, identity_row in gpus.items():
            labels = self._gpu_labels(gpus, gpu)
            for name in HEALTH_STATES:
                states.add_metric([*labels, name],
                                  1.0 if name == identity_row["health"] else 0.0)
            extra = [str(identity_row[c]) if identity_row[c] is not None else ""
                     for c in INFO_COLUMNS if c in identity_row]
            info.add_metric([*labels, (identity_row["model"] or "")[:128],
                             _text(identity_row["gpu_index"]), _text(identity_row["minor"]),
                             identity_row["source"] or "", *extra], 1.0)
        yield states
        yield info
        bound = GaugeMetricFamily("gpuwhy_gpu_bound_processes",
                                  "processes holding the GPU's device file now",
                                  labels=GPU_LABELS)
        for gpu, count in bound_process_counts(db):
            bound.add_metric(self._gpu_labels(gpus, gpu), count)
        yield bound

    def _xids(self, db: Database, gpus: dict[str, dict]) -> Iterator[Metric]:
        xids = CounterMetricFamily("gpuwhy_gpu_xid_errors", "Xid lines of the kernel log the "
                                   "store keeps, by code and the catalogue's severity (codes "
                                   "outside the catalogue under xid=\"other\")",
                                   labels=[*GPU_LABELS, "xid", "severity"])
        counts: dict[tuple[str, str, str], int] = {}
        for gpu, code, count in xid_counts(db):
            info = xid_info(code)
            # "unknown" is also an origin of documented codes (109, 158, ...): only a code
            # outside the catalogue goes under "other"
            key = (gpu or "", str(code) if info.mnemonic != "UNKNOWN" else OTHER, info.severity)
            counts[key] = counts.get(key, 0) + count
        for (gpu_id, code_label, severity), count in sorted(counts.items()):
            xids.add_metric([*self._gpu_labels(gpus, gpu_id or None), code_label, severity],
                            count)
        yield xids

    def _processes(self, db: Database) -> Iterator[Metric]:
        calls = CounterMetricFamily("gpuwhy_process_driver_calls",
                                    "NVIDIA driver calls (ioctls) of a living process",
                                    labels=PROCESS_LABELS)
        rows = driver_call_totals_of_living_processes(db)
        for pid, start_time, comm, n, pod, container in rows[:self.max_processes]:
            calls.add_metric([str(pid), str(start_time), comm[:32], pod or "",
                              container or ""], n)
        if rows[self.max_processes:]:
            calls.add_metric([OTHER, "", "", "", ""],
                             sum(r[3] for r in rows[self.max_processes:]))
        yield calls
        memory = GaugeMetricFamily("gpuwhy_process_gpu_memory_used_bytes",
                                   "GPU memory of a process (NVML's latest process list)",
                                   labels=["gpu", *PROCESS_LABELS])
        sm = GaugeMetricFamily("gpuwhy_process_sm_utilization_ratio",
                               "the process's share of SM time (NVML)",
                               labels=["gpu", *PROCESS_LABELS])
        rows = latest_gpu_process_lists(db)
        for gpu, pid, start_time, comm, mib, sm_util, pod, container in \
                rows[:self.max_processes]:
            key = [gpu, str(pid), str(start_time), comm[:32], pod or "", container or ""]
            if mib is not None:
                memory.add_metric(key, mib * MIB)
            if sm_util is not None:
                sm.add_metric(key, sm_util / 100)
        yield memory
        yield sm

    def _owners(self, db: Database) -> Iterator[Metric]:
        idle = CounterMetricFamily(
            "gpuwhy_owner_idle_while_held_gpu_seconds", "GPU-seconds an owner's processes "
            "held a GPU while it was near idle (utilisation at or under "
            "correlator.stall_util_pct), since this process started", labels=OWNER_LABELS)
        for (user, pod, container), seconds in sorted(self.idle.update(db).items()):
            idle.add_metric([user, pod, container[:64]], seconds)
        yield idle

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

    def _findings(self, db: Database) -> Iterator[Metric]:
        findings = GaugeMetricFamily("gpuwhy_rule_findings_open", "rule findings firing now, "
                                     "by rule and severity (shadow rules left out)",
                                     labels=["rule", "severity"])
        counts: dict[tuple[str, str], int] = {}
        for rule, severity, count in open_finding_counts(db):
            name = sev.normalise(severity) if sev.is_severity(severity) else sev.DEFAULT
            counts[rule[:64], name] = counts.get((rule[:64], name), 0) + count
        for (rule, severity), count in sorted(counts.items()):
            findings.add_metric([rule, severity], count)
        yield findings

    def _rules(self) -> Mapping[str, Rule]:
        """The service's rules, loaded once (the answer ranks by their kinds and links)."""
        if self._rule_set is None:
            self._rule_set = {r.id: r for r in configured_rule_set(self.config or {}).rules}
        return self._rule_set

    def _answers(self, db: Database, gpus: dict[str, dict]) -> Iterator[Metric]:
        """The one answer per GPU (gpuwhy why's): 1 for what leads on each GPU that is not
        healthy; ``rule`` is ``health:<state>`` when the GPU's health state itself leads."""
        answer = GaugeMetricFamily("gpuwhy_gpu_answer", "1 for what leads each GPU's answer "
                                   "(gpuwhy why): the rule, or health:<state> when the GPU's "
                                   "health leads; no series for a healthy GPU",
                                   labels=[*GPU_LABELS, "rule", "kind", "severity"])
        for verdict in gpu_verdicts(db, self._rules()):
            if verdict.healthy:
                continue
            lead = verdict.lead
            rule, kind = (lead.rule_id[:64], lead.kind) if lead is not None else \
                (f"health:{verdict.gpu.health}", "health")
            answer.add_metric([*self._gpu_labels(gpus, verdict.gpu.gpu_id), rule, kind,
                               verdict.severity], 1)
        yield answer

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


    def _engines(self, db: Database, gpus: dict[str, dict]) -> Iterator[Metric]:
        """One series per engine instance and value of its latest scrape (ENGINE_VALUES: the
        engine.* rule signals' units, in base units)."""
        families = {value: GaugeMetricFamily(name, f"inference engine: {help_text} "
                                             "(latest scrape)", labels=ENGINE_LABELS)
                    for value, (name, help_text) in ENGINE_METRICS.items()}
        info = GaugeMetricFamily("gpuwhy_engine_info", "1 per inference engine scraped in the "
                                 "last two minutes; its version as its metric names tell",
                                 labels=[*ENGINE_LABELS, "version"])
        scraped = GaugeMetricFamily("gpuwhy_engine_last_scrape_timestamp_seconds",
                                    "when the engine's latest scrape was taken",
                                    labels=ENGINE_LABELS)
        now = now_ns()
        for row in latest_engine_samples(db, now - ENGINE_FRESH_NS, now):
            labels = [_text(row["engine"])[:32], "" if row["pid"] is None else str(row["pid"]),
                      _port(row["endpoint"]), _engine_gpus(gpus, row["gpu_ids"]),
                      self.hostname]
            info.add_metric([*labels, _text(row["version"])[:32]], 1)
            scraped.add_metric(labels, row["ts"] / NS_PER_SECOND)
            for value, family in families.items():
                if row.get(value) is not None:
                    family.add_metric(labels, row[value])
        yield info
        yield scraped
        yield from families.values()

    def _alertmanager(self, db: Database) -> Iterator[Metric]:
        """The Alertmanager pusher's record (store/alertpush.py), once it has run: its own
        up/down is the ``alertmanager`` source above."""
        figures = alertpush.figures(db)
        if figures["behind"] < 0:
            return
        alerts = GaugeMetricFamily("gpuwhy_alertmanager_alerts", "incidents the pusher sends "
                                   "to Alertmanager: firing, or resolved with resolved sends "
                                   "still owed", labels=["state"])
        alerts.add_metric(["firing"], figures["firing"])
        alerts.add_metric(["resolving"], figures["resolving"])
        yield alerts
        yield GaugeMetricFamily("gpuwhy_alertmanager_feed_behind", "incident-feed changes "
                                "the pusher has not taken in yet (0 when it keeps up)",
                                value=figures["behind"])


def _engine_metric(value: str) -> str:
    """A value of ENGINE_VALUES as a metric name in base units: ``ttft_p95_s`` ->
    ``gpuwhy_engine_ttft_p95_seconds``, ``prompt_tokens_per_s`` -> ``..._per_second``,
    ``kv_cache_usage`` (0-1) -> ``..._ratio``."""
    if value.endswith("_per_s"):
        stem = value[:-1] + "second"
    elif value.endswith("_s"):
        stem = value[:-2] + "_seconds"
    elif ENGINE_VALUES[value][0] == "ratio":
        stem = value + "_ratio"
    else:
        stem = value
    return f"gpuwhy_engine_{stem}"


ENGINE_METRICS = {value: (_engine_metric(value), help_text)
                  for value, (_, help_text) in ENGINE_VALUES.items()}


def _port(endpoint: str | None) -> str:
    """The endpoint's port (the host is loopback, the path /metrics: neither tells engines
    apart); "" when it names none."""
    try:
        port = urlsplit(endpoint or "").port
    except ValueError:
        return ""
    return "" if port is None else str(port)


def _engine_gpus(gpus: dict[str, dict], stored: str | None) -> str:
    """The engine's GPUs as people name them, comma-separated: indexes where known."""
    try:
        ids = json.loads(stored or "[]")
    except ValueError:
        return ""
    if not isinstance(ids, list):
        return ""
    names = []
    for gpu in ids[:16]:
        if isinstance(gpu, str):
            index = (gpus.get(gpu) or {}).get("gpu_index")
            names.append(gpu if index is None else str(index))
    return ",".join(names)[:200]


def _text(value: object) -> str:
    return "" if value is None else str(value)


def store_stamp(path: str | os.PathLike[str]) -> tuple:
    """What changes whenever the store commits: the modification time and size of its file
    and of its write-ahead log (a commit appends to the log; a checkpoint writes the file).
    Read from the file system, not the database: two stat calls, no connection. An empty log
    counts as none: a reader opening the store creates one, and that changes nothing."""
    stamp: list[tuple[int, int] | None] = []
    for name in (os.fspath(path), f"{os.fspath(path)}-wal"):
        try:
            info = os.stat(name)
        except OSError:
            stamp.append(None)
            continue
        stamp.append((info.st_mtime_ns, info.st_size) if info.st_size else None)
    return tuple(stamp)


class Snapshot:
    """The ``/metrics`` text, rendered at most once per ``max_age`` seconds and shared.

    A scrape gets the current snapshot while it is younger than ``max_age`` and either the
    store has not changed since it was read or other scrapes are in flight (a crowd shares
    what is at most ``max_age`` old). A lone scrape after a change waits for the next render
    (at most ``max_age`` after the last), so that a reader who changed the store and then
    scrapes sees the change. Only one render runs at a time; whoever arrives meanwhile waits
    for it.
    """

    def __init__(self, render: Callable[[], bytes], stamp: Callable[[], Any],
                 max_age: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.render, self.stamp, self.max_age, self.clock = render, stamp, max_age, clock
        self.renders = 0                     # how many times the text was rendered
        self._changed = threading.Condition()
        self._body: bytes | None = None
        self._at = 0.0                       # clock() when the snapshot's read began
        self._version: Any = None            # stamp() then
        self._rendering = False
        self._in_flight = 0

    def get(self) -> bytes:
        """The current text, rendered first when it is too old (or, for a lone scrape,
        behind the store)."""
        with self._changed:
            self._in_flight += 1
        try:
            return self._get()
        finally:
            with self._changed:
                self._in_flight -= 1

    def _get(self) -> bytes:
        with self._changed:
            while True:
                now = self.clock()
                kept = self._body
                fresh = kept is not None and now - self._at < self.max_age
                if kept is not None and fresh and (self._in_flight > 1 or
                                                   self.stamp() == self._version):
                    return kept
                if self._rendering:
                    self._changed.wait()                   # one render at a time: share it
                elif fresh:
                    self._changed.wait(self._at + self.max_age - now)    # the next slot
                else:
                    break
            self._rendering = True
        body = None
        try:
            version, at = self.stamp(), self.clock()
            body = self.render()
            return body
        finally:
            with self._changed:
                self._rendering = False
                if body is not None:
                    self._body, self._at, self._version = body, at, version
                    self.renders += 1
                self._changed.notify_all()


def register_metrics(app: Flask, registry: CollectorRegistry | None = None,
                     max_age: float = 1.0) -> Snapshot:
    """Serve ``/metrics`` from ``registry`` (a new one by default) with the store collector
    and this process's own figures (CPU, memory, open files, Python), through a snapshot at
    most ``max_age`` seconds old (kept as ``app.extensions["gpuwhy.metrics"]``)."""
    from gpuwhy.store import open_store

    registry = registry or CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(lambda: open_store(app.config["DATABASE"], readonly=True),
                                     config=app.config.get("GPUWHY")))
    if os.path.exists("/proc/self/stat"):
        ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    snapshot = Snapshot(lambda: generate_latest(registry),
                        lambda: store_stamp(app.config["DATABASE"]), max_age)
    app.extensions["gpuwhy.metrics"] = snapshot

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(snapshot.get(), mimetype=CONTENT_TYPE_LATEST)

    return snapshot
