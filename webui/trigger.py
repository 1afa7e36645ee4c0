"""The chart an incident's page draws of what raised it: for a rule finding, the GPU signals
its rule's condition reads (``when:``, else ``requires:``) over the finding's window; for an
Xid or any other GPU incident, the GPU's utilisation and power around it. The page's script
(static/incident.js) reads the GPU's series API over that window (gpus.api_series)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from flask import url_for

from gpuwhy.clock import NS_PER_SECOND
from gpuwhy.config import MAX_INT
from gpuwhy.rules import model as m

# A rule's gpu.<signal> (gpuwhy/rules/vocabulary.py) -> the series field that draws it
SIGNAL_FIELDS = {
    "busy": "gpu_util", "util": "gpu_util", "sm_active": "sm_active",
    "tensor": "tensor_active", "dram": "dram_active", "sm_occ": "sm_active",
    "pcie_rx_Bps": "pcie_rx_bytes_per_s", "pcie_tx_Bps": "pcie_tx_bytes_per_s",
    "nvl_rx_Bps": "nvlink_rx_bytes_per_s", "nvl_tx_Bps": "nvlink_tx_bytes_per_s",
    "fb_used": "fb_used_mib", "fb_frac": "fb_used_mib", "clk_sm": "sm_clock_mhz",
    "clk_sm_max": "sm_clock_mhz", "reason": "sm_clock_mhz", "power_w": "power_w",
    "plim_w": "power_limit_w", "plim_default_w": "power_limit_w", "temp_c": "temp_c",
    "mem_temp_c": "temp_c", "viol_power_ns": "power_w", "viol_thermal_ns": "temp_c",
}
# field -> (what a person calls it, unit, multiplier from the API's value)
FIELDS = {
    "gpu_util": ("GPU utilisation", "%", 1), "sm_active": ("SM active", "%", 1),
    "tensor_active": ("tensor active", "%", 1), "dram_active": ("DRAM active", "%", 1),
    "pcie_rx_bytes_per_s": ("PCIe received", "GB/s", 1e-9),
    "pcie_tx_bytes_per_s": ("PCIe sent", "GB/s", 1e-9),
    "nvlink_rx_bytes_per_s": ("NVLink received", "GB/s", 1e-9),
    "nvlink_tx_bytes_per_s": ("NVLink sent", "GB/s", 1e-9),
    "fb_used_mib": ("memory used", "MiB", 1), "sm_clock_mhz": ("SM clock", "MHz", 1),
    "power_w": ("power", "W", 1), "power_limit_w": ("power limit", "W", 1),
    "temp_c": ("temperature", "°C", 1),
}
AROUND = ("gpu_util", "power_w")          # an Xid's or another GPU incident's chart
MAX_UNITS = 2                             # one axis each side
PAD_NS = 5 * 60 * NS_PER_SECOND           # before and after the incident's window
MAX_SPAN_NS = 7 * 86_400 * NS_PER_SECOND  # the longest range the charts draw (7d)


def _refs(node: m.Node | None) -> Iterator[str]:
    """The names a rule's expression reads, in the order it reads them."""
    if node is None:
        return
    if isinstance(node, m.Ref):
        yield node.name
    for child in m.children(node):
        yield from _refs(child)


def rule_fields(rule: m.Rule | None) -> list[str]:
    """The series fields of the GPU signals ``rule`` reads: its condition's, else the ones
    it requires; none when it reads no GPU signal the charts have."""
    if rule is None:
        return []
    found: list[str] = []
    for names in (_refs(rule.when), iter(rule.requires)):
        for name in names:
            signal = name.removeprefix("gpu.") if name.startswith("gpu.") else None
            field = SIGNAL_FIELDS.get(signal or "")
            if field and field not in found:
                found.append(field)
        if found:
            break
    return found


def _units(fields: list[str]) -> list[str]:
    """``fields`` kept to the first MAX_UNITS units (a chart has an axis each side)."""
    units: list[str] = []
    kept = []
    for field in fields:
        unit = FIELDS[field][1]
        if unit not in units:
            if len(units) == MAX_UNITS:
                continue
            units.append(unit)
        kept.append(field)
    return kept


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and \
        0 < value <= MAX_INT else None


def trigger_chart(incident: dict, rules: list[m.Rule]) -> dict | None:
    """What the incident page's chart draws: ``series`` (the API's URL over the window),
    ``fields`` (field, name, unit, multiplier), ``marks`` (opened, closed, the finding's
    window, ns); None for an incident without a GPU or a time."""
    gpu, opened = incident.get("gpu"), _int(incident.get("started"))
    if not gpu or opened is None:
        return None
    found = incident.get("details")
    details: dict[str, Any] = found if isinstance(found, dict) else {}
    fields: list[str] = []
    why = "the GPU's utilisation and power around it"
    if incident.get("kind") == "rule_finding":
        rule_id = details.get("rule_id")
        fields = rule_fields(next((r for r in rules if r.id == rule_id), None))
        if fields:
            why = f"what rule {rule_id} reads, over the incident's window"
    fields = _units(fields or list(AROUND))
    start = _int(details.get("window_start")) or opened
    start = min(start, opened)
    end = max(t for t in (_int(incident.get("ended")), _int(incident.get("last_seen")),
                          _int(details.get("window_end")), opened) if t is not None)
    until = min(end + PAD_NS, MAX_INT)
    since = max(min(start - PAD_NS, until - NS_PER_SECOND), until - MAX_SPAN_NS, 1)
    # "from" is a keyword in Python: the query's times as a mapping
    times: dict[str, Any] = {"from": since, "to": until}
    return {"series": url_for("gpus.api_series", gpu_id=gpu, **times),
            "gpu": gpu, "why": why,
            "fields": [{"field": f, "name": FIELDS[f][0], "unit": FIELDS[f][1],
                        "scale": FIELDS[f][2]} for f in fields],
            "marks": {"opened": opened, "closed": _int(incident.get("ended")),
                      "window_start": _int(details.get("window_start")),
                      "window_end": _int(details.get("window_end"))}}
