"""The dcgm-exporter scrape source: GET /metrics, parse it as Prometheus text, map to fields.

Parsed by a bounded parser of our own (see below). Both label layouts are accepted (``Hostname`` or
``hostname``, ``UUID`` or ``uuid``, with or without ``pci_bus_id``, pod labels old and
new), metric names map to field ids through :data:`fields.BY_EXPORTER_NAME` (legacy and
DCGM 4.6 names), sentinels are dropped, and units are taken from the HELP text where it
names one, because dcgm-exporter 4.9 changed 11 units (MHz→Hz, mJ→J, %→ratio, MiB→bytes)
without our being able to verify every new name. A body that is not Prometheus text is
one clear error; a line or sample that is not, or is over a bound, is skipped and counted;
the source keeps scraping.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpuwhy.clock import now_ns
from gpuwhy.events import Event, GpuSample, GpuXid
from gpuwhy.gpufields import BY_EXPORTER_NAME, Field, is_blank, plausible
from gpuwhy.identity import GpuIdentity, classify_device
from gpuwhy.probes.gpu.scrape import ScrapeFailed, fetch_within
from gpuwhy.probes.gpu.source import GpuInfo, SourceUnavailable, normalise_bus_id

MAX_BODY = 16 << 20   # bytes; a scrape of 8 GPUs with every field is a few hundred KB
TIMEOUT_S = 5.0       # a whole scrape, connect to last byte (gpu.exporter_timeout)
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


# --- parsing: every line, label and number bounded before it is looked at -----------------
# Our own parser, not prometheus_client's: that one is quadratic on hostile text (a comment of
# 64 KiB of spaces took 0.13 s, 1 MiB would take half a minute; label values full of \" the
# same), lets one bad line fail the whole body, and hands over ints too big for float().
MAX_LINE = 16 << 10        # characters of one line (dcgm-exporter's: under 1 KiB)
MAX_LINES = 500_000        # lines of one body looked at (an 8-GPU host: a few thousand)
MAX_SERIES = 100_000       # samples of known fields kept from one body
MAX_LABELS = 64            # labels of one sample
MAX_LABEL_VALUE = 1024     # characters of a label value (Kubernetes names: 253)
MAX_ID_LABEL = 64          # UUID, pci_bus_id, device, gpu, GPU_I_ID
MAX_TEXT_LABEL = 128       # model name, driver version: cut to this
MAX_VALUE = 64             # characters of a sample value (or timestamp) before int()/float()
MAX_HELP = 1024            # characters of a HELP text looked at for its unit

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# One label at ``pos``. The value is one character (or one escape) per step, never a run
# inside a repetition: that is read in one pass, and failing costs one pass back. (No
# possessive quantifiers: Python 3.11.2, Debian 12's, matches wrongly with them.)
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"'
                    r'[ \t]*(,?)[ \t]*')
_INTEGER = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                    r"|(?i:inf(?:inity)?|nan))")
_ESCAPE = re.compile(r'\\([\\n"])')        # the three escapes of the text format
_UUID_LABEL = re.compile(r"[A-Za-z0-9-]{1,64}")
_BUS_ID_LABEL = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?")


class SampleSkipped(ValueError):
    """One line or sample not taken (not Prometheus text, or over a bound); says why."""


@dataclass
class ScrapeCounts:
    """What one body's parse left out. ``dropped``: values (blank sentinels, NaN, ±Inf,
    implausible); ``skipped``: lines and samples (not Prometheus text, over a bound, beyond
    :data:`MAX_LINES` or :data:`MAX_SERIES`); ``first_skip``: why the first was skipped."""

    dropped: int = 0
    skipped: int = 0
    first_skip: str = ""

    def skip(self, lineno: int, reason: str) -> None:
        self.skipped += 1
        if not self.first_skip:
            self.first_skip = f"line {lineno}: {reason}"


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: "\n" if m[1] == "n" else m[1], value) if "\\" in value \
        else value


def _number(token: str, what: str) -> int | float:
    """A sample value as the exposition format writes it; ints stay exact (the sentinels)."""
    if len(token) > MAX_VALUE:
        raise SampleSkipped(f"{what} is {len(token)} characters long (at most {MAX_VALUE})")
    if _INTEGER.fullmatch(token):
        return int(token)                       # at most 64 digits: far below int()'s limit
    if not _FLOAT.fullmatch(token):
        raise SampleSkipped(f"{what} {token[:20]!r} is not a number")
    return float(token)


def parse_sample(line: str) -> tuple[str, dict[str, str], int | float]:
    """``(name, labels, value)`` of one sample line; raises :class:`SampleSkipped`."""
    if len(line) > MAX_LINE:
        raise SampleSkipped(f"line is {len(line)} characters long (at most {MAX_LINE})")
    match = _NAME.match(line)
    if not match:
        raise SampleSkipped(f"not a sample: {line[:40]!r}")
    name, pos = match[0], match.end()
    labels: dict[str, str] = {}
    braces = line.startswith("{", pos)
    if braces:
        pos += 1
        while not line.startswith("}", pos):
            label = _LABEL.match(line, pos)
            if not label:
                raise SampleSkipped(f"{name}: malformed labels at column {pos + 1}")
            key, raw = label[1], label[2]
            if len(raw) > MAX_LABEL_VALUE:
                raise SampleSkipped(f"{name}: label {key[:40]} is {len(raw)} characters long "
                                    f"(at most {MAX_LABEL_VALUE})")
            if key in labels:
                raise SampleSkipped(f"{name}: label {key[:40]} given twice")
            if len(labels) == MAX_LABELS:
                raise SampleSkipped(f"{name}: more than {MAX_LABELS} labels")
            labels[key] = _unescape(raw)
            pos = label.end()
            if not label[3] and not line.startswith("}", pos):
                raise SampleSkipped(f"{name}: malformed labels at column {pos + 1}")
        pos += 1
    rest = line[pos:]
    tokens = rest.split(None, 2)
    if not tokens or not braces and not rest[:1].isspace():
        raise SampleSkipped(f"{name}: no value")
    if len(tokens) > 2:
        raise SampleSkipped(f"{name}: text after the value and timestamp")
    if len(tokens) == 2:
        _number(tokens[1], f"{name}: timestamp")
    return name, labels, _number(tokens[0], f"{name}: value")


def _id_label(labels: dict[str, str], key: str) -> str | None:
    value = labels.get(key)
    if value is not None and len(value) > MAX_ID_LABEL:
        raise SampleSkipped(f"label {key} is {len(value)} characters long (at most "
                            f"{MAX_ID_LABEL})")
    return value or None


def gpu_from_labels(labels: dict[str, str]) -> GpuInfo | None:
    """The GPU a sample's labels name; None when they name none. Raises
    :class:`SampleSkipped` when an identity label is over its bound or not what it claims."""
    uuid = _id_label(labels, "UUID") or _id_label(labels, "uuid")
    if uuid is not None and not _UUID_LABEL.fullmatch(uuid):
        raise SampleSkipped(f"UUID label {uuid[:20]!r} is not a GPU UUID")
    bus_id = _id_label(labels, "pci_bus_id")
    if bus_id is not None and not _BUS_ID_LABEL.fullmatch(bus_id):
        raise SampleSkipped(f"pci_bus_id label {bus_id[:20]!r} is not a PCI address")
    index = _id_label(labels, "gpu")
    device = _id_label(labels, "device")
    minor = classify_device(device)[1] if device else None
    identity = GpuIdentity(uuid=uuid, pci_bus_id=normalise_bus_id(bus_id),
                           index=int(index) if index and index.isascii() and index.isdigit()
                           and len(index) <= 6 else None, minor=minor)
    if not (identity.uuid or identity.pci_bus_id or identity.index is not None):
        return None
    driver = (labels.get("DCGM_FI_DRIVER_VERSION") or labels.get("DCGM_FI_SYSTEM_DRIVER_VERSION")
              or "")[:MAX_TEXT_LABEL]
    model = (labels.get("modelName") or labels.get("model_name") or "")[:MAX_TEXT_LABEL]
    return GpuInfo(identity, model=model, driver_version=driver)


_GPU_LABELS = ("UUID", "uuid", "gpu", "device", "pci_bus_id", "DCGM_FI_DRIVER_VERSION",
               "DCGM_FI_SYSTEM_DRIVER_VERSION", "modelName", "model_name")


def _known_field(name: str) -> Field | None:
    # a counter may be written NAME_total (OpenMetrics style); the field is NAME's
    return BY_EXPORTER_NAME.get(name) or (BY_EXPORTER_NAME.get(name[:-6])
                                          if name.endswith("_total") else None)


def parse_scrape(text: str) -> tuple[list[Series], ScrapeCounts]:
    """Series of known GPU fields in a /metrics body, and what was left out (see
    :class:`ScrapeCounts`). Never raises on a line: a bad one is skipped and counted; raises
    ValueError only when no line at all is Prometheus text (an HTML error page)."""
    series: list[Series] = []
    counts = ScrapeCounts()
    helps: dict[str, str] = {}
    gpus: dict[tuple[str | None, ...], GpuInfo | None] = {}   # a GPU's labels recur per field
    good = 0
    lines = text.split("\n", MAX_LINES)
    if len(lines) > MAX_LINES:
        rest = lines.pop()
        counts.skip(MAX_LINES + 1, f"more than {MAX_LINES} lines")
        counts.skipped += rest.count("\n")
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            good += 1
            parts = line[:MAX_LINE].split(None, 3)
            if len(parts) == 4 and parts[1] == "HELP" and _known_field(parts[2]):
                helps[parts[2]] = parts[3][:MAX_HELP]
            continue
        try:
            name, labels, raw = parse_sample(line)
            good += 1
            field = _known_field(name)
            if field is None:
                continue
            key = tuple(labels.get(k) for k in _GPU_LABELS)
            if key in gpus:
                info = gpus[key]
            else:
                info = gpus[key] = gpu_from_labels(labels)
            if info is None:
                continue
            instance = _id_label(labels, "GPU_I_ID") or ""
        except SampleSkipped as exc:
            counts.skip(lineno, str(exc))
            continue
        if len(series) >= MAX_SERIES:
            counts.skip(lineno, f"more than {MAX_SERIES} GPU samples")
            continue
        if is_blank(raw):
            counts.dropped += 1
            continue
        unit = help_unit(helps.get(name) or helps.get(name.removesuffix("_total")) or "")
        value = to_our_unit(field, name, float(raw), unit)
        if not math.isfinite(value) or not plausible(field, value):
            counts.dropped += 1
            continue
        extra = tuple(sorted((_POD_LABELS[k], v) for k, v in labels.items()
                             if k in _POD_LABELS and v))
        series.append(Series(info, instance, extra, field, value))
    if not good and counts.skipped:
        raise ValueError(counts.first_skip)
    return series, counts


class ExporterSource:
    """Scrapes ``url`` once per read."""

    name = "dcgm-exporter"
    simulated = False

    def __init__(self, url: str, timeout: float = TIMEOUT_S, max_body: int = MAX_BODY):
        if not url:
            raise SourceUnavailable("dcgm-exporter", "not configured (gpu.exporter_url)")
        self.url, self.timeout, self.max_body = url, timeout, max_body
        self.gpus: list[GpuInfo] = []
        self.dropped = 0
        self.skipped = 0
        self.last_skip = ""
        self._known: set[str] = set()
        self._last_xid: dict[tuple[str, str], int] = {}
        # open()'s read is thrown away by its callers (they want the GPU list): the Xids it
        # found already set before we started are handed on with the next read instead.
        self._carried: list[Event] = []

    def fetch(self) -> str:
        """The /metrics body, within ``timeout`` s in all and ``max_body`` bytes at most: a
        target that trickles its answer must not hold the runner (or `gpuwhy gpu sample`)."""
        try:
            body = fetch_within(self.url, self.timeout, self.max_body)
        except ScrapeFailed as exc:
            raise SourceUnavailable("dcgm-exporter", exc.reason) from None
        return body.decode("utf-8", errors="replace")

    def scrape(self) -> list[Series]:
        text = self.fetch()
        try:
            series, counts = parse_scrape(text)
        except ValueError as exc:
            raise SourceUnavailable("dcgm-exporter", f"response from {self.url} is not "
                                    f"Prometheus text: {str(exc)[:120]}") from None
        self.dropped += counts.dropped
        self.skipped += counts.skipped
        self.last_skip = counts.first_skip or self.last_skip
        if not series:
            raise SourceUnavailable("dcgm-exporter", f"no DCGM GPU metrics at {self.url}")
        return series

    def open(self) -> list[GpuInfo]:
        self._carried = [e for e in self.read() if isinstance(e, GpuXid)]
        return self.gpus

    def notes(self) -> list[str]:
        return [f"scraping {self.url}"] + (
            [f"{self.dropped} values dropped (blank sentinels or implausible)"]
            if self.dropped else []) + (
            [f"{self.skipped} lines or samples skipped (not Prometheus text or over a bound; "
             f"last: {self.last_skip[:120]})"] if self.skipped else [])

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
        carried, self._carried = self._carried, []
        return carried + events

    def _xid(self, gpu_id: str, instance: str, xid: int, ts: int) -> list[Event]:
        """The exporter shows only the last Xid: a change to a non-zero value is a new one.
        A non-zero value at the first read is an Xid from before we started: kept (it may be
        why the GPU misbehaves now) but marked, with no time of its own — the gauge has none
        and DCGM may have held it for hours."""
        previous = self._last_xid.get((gpu_id, instance))
        self._last_xid[(gpu_id, instance)] = xid
        if xid == previous or xid == 0:
            return []
        if previous is None:
            return [GpuXid(ts=ts, gpu_id=gpu_id, xid=xid, source=self.name, simulated=False,
                           before_start=True,
                           detail=f"last Xid {xid}, before gpuwhy started: dcgm-exporter's "
                                  f"last-Xid gauge showed it at the first scrape; the Xid "
                                  f"itself happened earlier, at an unknown time")]
        return [GpuXid(ts=ts, gpu_id=gpu_id, xid=xid, source=self.name, simulated=False,
                       detail="dcgm-exporter last-Xid gauge changed")]

    def close(self) -> None:
        pass
