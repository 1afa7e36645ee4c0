"""The dcgm-exporter scrape source: GET /metrics, parse it as Prometheus text, map to fields.

Parsed with prometheus_client's parser. Both label layouts are accepted (``Hostname`` or
``hostname``, ``UUID`` or ``uuid``, with or without ``pci_bus_id``, pod labels old and
new), metric names map to field ids through :data:`fields.BY_EXPORTER_NAME` (legacy and
DCGM 4.6 names), sentinels are dropped, and units are taken from the HELP text where it
names one, because dcgm-exporter 4.9 changed 11 units (MHz→Hz, mJ→J, %→ratio, MiB→bytes)
without our being able to verify every new name. A body that is not Prometheus text is
one clear error; the source keeps scraping.
"""

from __future__ import annotations

import http.client
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gpuwhy.clock import now_ns
from gpuwhy.events import Event, GpuSample, GpuXid
from gpuwhy.gpufields import BY_EXPORTER_NAME, Field, is_blank, plausible
from gpuwhy.identity import GpuIdentity, classify_device
from gpuwhy.probes.gpu.source import GpuInfo, SourceUnavailable, normalise_bus_id

MAX_BODY = 16 << 20
_HELP_UNIT = re.compile(r"\(in ([^)]+)\)|\b(hertz|joules|millijoules|bytes|ratio)\b", re.I)
_UNIT_WORDS = {"mhz": "MHz", "hz": "Hz", "hertz": "Hz", "mj": "mJ", "millijoules": "mJ",
               "j": "J", "joules": "J", "%": "%", "ratio": "ratio", "mib": "MiB", "mb": "MiB",
               "bytes": "bytes", "b": "bytes"}
_FACTORS = {("Hz", "MHz"): 1e-6, ("J", "mJ"): 1e3, ("ratio", "%"): 100.0,
            ("bytes", "MiB"): 1 / (1 << 20), ("MiB", "bytes"): float(1 << 20)}
_POD_LABELS = {"pod": "pod", "namespace": "namespace", "container": "container",
               "pod_name": "pod", "pod_namespace": "namespace", "container_name": "container",
               "hpc_job": "hpc_job", "GPU_I_PROFILE": "mig_profile"}


def help_unit(documentation: str) -> str | None:
    """The unit a HELP line names: "SM clock frequency (in MHz)." -> "MHz"."""
    match = _HELP_UNIT.search(documentation or "")
    if not match:
        return None
    return _UNIT_WORDS.get((match.group(1) or match.group(2)).strip().lower())


def to_our_unit(field: Field, metric: str, value: float, unit: str | None) -> float:
    """Scale a scraped value to the field's unit; magnitude decides where nothing says."""
    if unit and unit != field.unit:
        return value * _FACTORS.get((unit, field.unit), 1.0)
    if unit is None:
        if field.unit == "%" and metric.endswith("_RATIO") and value <= 1.0:
            return value * 100.0
        if field.unit == "MHz" and value > 1e5:
            return value / 1e6
        if field.unit == "MiB" and value > 2**24:
            return value / (1 << 20)
    return value


@dataclass(frozen=True)
class Series:
    """One scraped value, with the GPU it belongs to."""

    info: GpuInfo
    instance: str
    labels: tuple[tuple[str, str], ...]
    field: Field
    value: float


def gpu_from_labels(labels: dict[str, str]) -> GpuInfo | None:
    uuid = labels.get("UUID") or labels.get("uuid") or None
    index = labels.get("gpu")
    minor = classify_device(labels.get("device", ""))[1] if labels.get("device") else None
    identity = GpuIdentity(uuid=uuid, pci_bus_id=normalise_bus_id(labels.get("pci_bus_id")),
                           index=int(index) if index and index.isdigit() else None, minor=minor)
    if not (identity.uuid or identity.pci_bus_id or identity.index is not None):
        return None
    driver = (labels.get("DCGM_FI_DRIVER_VERSION") or labels.get("DCGM_FI_SYSTEM_DRIVER_VERSION")
              or "")
    return GpuInfo(identity, model=labels.get("modelName") or labels.get("model_name") or "",
                   driver_version=driver)


def parse_scrape(text: str) -> tuple[list[Series], int]:
    """Series of known GPU fields in a /metrics body, and how many values were dropped
    (sentinels, implausible). Raises ValueError when the body is not Prometheus text."""
    series: list[Series] = []
    dropped = 0
    for family in text_string_to_metric_families(text):
        unit = help_unit(family.documentation)
        for sample in family.samples:
            # the parser names counter samples NAME_total; the exporter's name is the family's
            name = sample.name if sample.name in BY_EXPORTER_NAME else family.name
            field = BY_EXPORTER_NAME.get(name)
            info = gpu_from_labels(sample.labels) if field else None
            if field is None or info is None:
                continue
            if is_blank(sample.value):
                dropped += 1
                continue
            value = to_our_unit(field, name, float(sample.value), unit)
            if not plausible(field, value):
                dropped += 1
                continue
            extra = tuple(sorted((_POD_LABELS[k], v) for k, v in sample.labels.items()
                                 if k in _POD_LABELS and v))
            series.append(Series(info, sample.labels.get("GPU_I_ID", ""), extra, field, value))
    return series, dropped


class ExporterSource:
    """Scrapes ``url`` once per read."""

    name = "dcgm-exporter"
    simulated = False

    def __init__(self, url: str, timeout: float = 2.0):
        if not url:
            raise SourceUnavailable("dcgm-exporter", "not configured (gpu.exporter_url)")
        self.url, self.timeout = url, timeout
        self.gpus: list[GpuInfo] = []
        self.dropped = 0
        self._known: set[str] = set()
        self._last_xid: dict[tuple[str, str], int] = {}

    def fetch(self) -> str:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout) as response:
                body = response.read(MAX_BODY + 1)
                expected = response.headers.get("Content-Length", "")
            if expected.isdigit() and len(body) < int(expected) <= MAX_BODY:
                # read(amt) returns short at EOF instead of raising IncompleteRead
                raise http.client.IncompleteRead(body, int(expected) - len(body))
        except http.client.IncompleteRead as exc:
            raise SourceUnavailable("dcgm-exporter", f"truncated response from {self.url} "
                                    f"({len(exc.partial)} bytes, more expected)") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise SourceUnavailable("dcgm-exporter", f"cannot scrape {self.url}: "
                                    f"{getattr(exc, 'reason', exc)}") from None
        if len(body) > MAX_BODY:
            raise SourceUnavailable("dcgm-exporter", f"response from {self.url} is over "
                                    f"{MAX_BODY >> 20} MiB")
        return body.decode("utf-8", errors="replace")

    def scrape(self) -> list[Series]:
        text = self.fetch()
        try:
            series, dropped = parse_scrape(text)
        except ValueError as exc:
            raise SourceUnavailable("dcgm-exporter", f"response from {self.url} is not "
                                    f"Prometheus text: {str(exc)[:120]}") from None
        self.dropped += dropped
        if not series:
            raise SourceUnavailable("dcgm-exporter", f"no DCGM GPU metrics at {self.url}")
        return series

    def open(self) -> list[GpuInfo]:
        self.read()
        return self.gpus

    def notes(self) -> list[str]:
        return [f"scraping {self.url}"] + (
            [f"{self.dropped} values dropped (blank sentinels or implausible)"]
            if self.dropped else [])

    def read(self) -> list[Event]:
        series = self.scrape()
        ts = now_ns()
        events: list[Event] = []
        grouped: dict[tuple[str, str], tuple[dict[str, float], dict[str, str]]] = {}
        for s in series:
            gpu_id = s.info.id
            if gpu_id not in self._known:
                self._known.add(gpu_id)
                self.gpus.append(s.info)
                events.append(s.info.seen(ts, self.name, False))
            if s.field.event:
                events += self._xid(gpu_id, s.instance, int(s.value), ts)
                continue
            fields, labels = grouped.setdefault((gpu_id, s.instance), ({}, {}))
            fields[s.field.name] = s.value
            labels.update(s.labels)
        for (gpu_id, instance), (fields, labels) in grouped.items():
            events.append(GpuSample(ts=ts, gpu_id=gpu_id, source=self.name, simulated=False,
                                    fields=fields, instance=instance, labels=labels))
        return events

    def _xid(self, gpu_id: str, instance: str, xid: int, ts: int) -> list[Event]:
        """The exporter shows only the last Xid: a change to a non-zero value is a new one."""
        previous = self._last_xid.get((gpu_id, instance))
        self._last_xid[(gpu_id, instance)] = xid
        if previous is None or xid == previous or xid == 0:
            return []
        return [GpuXid(ts=ts, gpu_id=gpu_id, xid=xid, source=self.name, simulated=False,
                       detail="dcgm-exporter last-Xid gauge changed")]

    def close(self) -> None:
        pass
