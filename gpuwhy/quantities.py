"""Measured values as people read them: a key's label and a number with its unit.

One definition for everything that shows a rule finding's evidence or an incident's details
(the web view's evidence rows, `gpuwhy why`, the reports): the keys are the producers'
conventions (a rule's ``as`` names, units by suffix: ``*_ns`` a duration, ``*_share`` /
``*_frac`` a fraction, ``*_Bps`` a rate, ``*_mib``, ``*_w``, ``*_c``, ``*_mhz``,
``*_per_s``), and a key known to none is written as compact text, never as JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Evidence names of the shipped rules whose value is a ratio without saying so in a suffix
# (mean(gpu.util) as util, mean(gpu.busy) as busy...): tests/web/test_evidence.py checks
# this list against every shipped rule's evidence expressions.
RATIO_NAMES = frozenset({"busy", "gpu_busy", "max_busy", "util", "p05_util", "p95_util",
                         "sm_active", "tensor", "dram", "fp16", "fp32", "fp64", "occupancy",
                         "main_blocked", "workers_blocked", "workers_network_wait",
                         "workers_oncpu", "cpu_on_other_nodes", "idle_share_hour",
                         "main_oncpu", "main_network_wait", "kv_cache_usage",
                         "main_thread_on_cpu", "busiest_worker_thread_on_cpu",
                         "busiest_frontend_thread_on_cpu",
                         "busiest_engine_loop_thread_on_cpu"})
RATIO_SUFFIXES = ("_share", "_frac", "_ratio")
# (suffix, unit) for plain quantities, the suffix case-sensitive (``_Bps`` is bytes/s)
UNIT_SUFFIXES = (("_per_s", "/s"), ("_per_minute", "/min"), ("_per_hour", "/h"),
                 ("_rate", "/s"), ("_mib", "MiB"), ("_w", "W"), ("_c", "°C"),
                 ("_mhz", "MHz"), ("_cores", "cores"), ("_s", "s"))
# the same for other units: (name, unit)
UNIT_NAMES = {"worker_demand": "cores"}
DURATION_SUFFIXES = (("_ns", 1), ("_us", 1_000), ("_ms", 1_000_000))
LABELS = {"incident": "incident", "cause_incident": "cause", "incidents": "incidents",
          "processes": "processes", "gpu_bindings": "bound to the GPU",
          "events": "stored events", "driver_calls": "driver calls (stored)",
          "cron_runs": "cron runs", "kernel_log_pid": "pid in the kernel log",
          "evidence": "measured", "root_cause": "root cause", "rule_id": "rule",
          "finding_id": "finding", "seen_by": "seen by",
          "gpu_action": "GPU action", "ancestry_depth": "ancestry depth",
          "gpu_reset": "needs a GPU reset", "reboot": "needs a reboot",
          "exit_code": "exit code", "xid": "Xid", "since": "condition held since",
          # an Xid's catalogue entry (gpuwhy/xid.py) and its kernel-log line
          "mnemonic": "NVIDIA's name", "immediate": "NVIDIA's immediate action",
          "investigatory": "NVIDIA's investigation", "applies_to": "applies to",
          "origin": "likely origin", "detail": "kernel log line", "name": "process name",
          "named": "processes the line names", "action": "what to do",
          "rule_kind": "the finding names",
          # a serving engine's figures (gpuwhy/rules/builtin/j_serving.rules, R48)
          "waiting": "requests waiting", "running": "requests running",
          "max_waiting": "most requests waiting", "ttft_p95_s": "p95 time to first token",
          "itl_p95_s": "p95 inter-token latency", "itl_p50_s": "median inter-token latency",
          "kv_cache_usage": "KV cache used",
          "batch_limit": "engine's batch limit (command line)"}
# Words in keys written as people write them (``gpu_idle_share``: "GPU idle share")
WORDS = {"gpu": "GPU", "gpus": "GPUs", "sm": "SM", "pcie": "PCIe", "nvl": "NVLink",
         "nvlink": "NVLink", "dram": "DRAM", "cpu": "CPU", "cpus": "CPUs", "mig": "MIG",
         "xid": "Xid", "ecc": "ECC", "fb": "memory", "kv": "KV", "oncpu": "on CPU",
         "numa": "NUMA", "io": "I/O", "id": "id", "pid": "pid", "tx": "sent", "rx": "received",
         "clk": "clock", "plim": "power limit", "occ": "occupancy", "util": "utilisation"}
# Unit suffixes a name drops once its value carries the unit (``fb_used_mib``: "4,096 MiB")
NAME_UNITS = ("_Bps", "_mib", "_w", "_c", "_mhz", "_ns", "_us", "_ms", "_per_s", "_s")


def byte_rate(value: float) -> str:
    """Bytes per second in the largest unit under 1000."""
    for unit in ("B/s", "kB/s", "MB/s", "GB/s"):
        if abs(value) < 1000 or unit == "GB/s":
            return f"{value:,.1f} {unit}"
        value /= 1000
    return "-"


def label(key: str, value: Any = None) -> str:
    """What a key is called on a page: its label, else its words as people write them
    (``gpu_idle_share``: "GPU idle share"), a unit suffix dropped where the value is a
    number that carries the unit (``fb_used_mib`` 4096: "memory used", "4,096 MiB")."""
    if key in LABELS:
        return LABELS[key]
    name = key
    if isinstance(value, int | float) and not isinstance(value, bool):
        name = next((name[:-len(u)] for u in NAME_UNITS if name.endswith(u) and
                     len(name) > len(u)), name)
    words = [w for w in name.split("_") if w]
    return " ".join(WORDS.get(w.lower(), w) for w in words) or key


def quantity(key: str, value: float) -> str:
    """A number with the unit its evidence name says (see the module's conventions)."""
    if key.endswith("_Bps"):
        return byte_rate(value)
    if key in RATIO_NAMES or key.endswith(RATIO_SUFFIXES):
        return percent(value)
    for suffix, scale in DURATION_SUFFIXES:
        if key.endswith(suffix):
            return duration(value * scale)
    unit = UNIT_NAMES.get(key) or next((u for s, u in UNIT_SUFFIXES if key.endswith(s)), None)
    if unit is None:
        return number(value)
    return f"{number(value)}{'' if unit.startswith('/') else ' '}{unit}"


def percent(fraction: float) -> str:
    """A fraction (0.55) as a percentage (55%): whole percent from 10 up, tenths below."""
    shown = fraction * 100
    return f"{shown:.0f}%" if abs(shown) >= 10 else f"{shown:.1f}%".replace(".0%", "%")


def number(value: float) -> str:
    """A count or measure: thousands separated, at most three significant decimals."""
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def duration(ns: float) -> str:
    """A span of ns in the largest unit that keeps it readable: 850 ns, 12.5 µs, 3.2 ms,
    4.25 s, 3 min 20 s, 2 h 5 min."""
    ns = float(ns)
    sign, ns = ("-" if ns < 0 else ""), abs(ns)
    if ns < 1_000:
        return f"{sign}{ns:.0f} ns"
    if ns < 1_000_000:
        return f"{sign}{ns / 1e3:.3g} µs"
    if ns < 1e9:
        return f"{sign}{ns / 1e6:.3g} ms"
    seconds = ns / 1e9
    if seconds < 60:
        return f"{sign}{seconds:.3g} s"
    if seconds < 3600:
        return f"{sign}{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{sign}{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def compact(value: Any) -> str:
    """Any JSON value as short text: a list joined with ", ", a mapping as ``k=v, …``, None
    as "-", true/false as yes/no."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return number(value)
    if isinstance(value, list | tuple):
        return ", ".join(compact(v) for v in value)
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={compact(v)}" for k, v in value.items())
    return str(value)
