"""Each engine's Prometheus metric names, mapped to one small vocabulary of values.

The names come from the engines' own documentation and source (each entry cites it); where
a version renamed a metric, every name is listed, the newer first, and the first one a body
holds is the one read (vLLM's V1 engine: ``kv_cache_usage_perc`` for V0's
``gpu_cache_usage_perc``, ``inter_token_latency_seconds`` for ``time_per_output_token_seconds``).

One scrape gives gauges as they are; counters and histograms are cumulative, so a value
from them (a rate, a latency quantile) is over the interval since the previous scrape of the
same endpoint: the latency of the requests that finished in those seconds, not since the
engine started. A counter that went down (the engine restarted) gives nothing that round.
Label sets are added up (several models on Triton, several data-parallel engines on vLLM);
KV-cache usage takes the fullest one. The body is parsed by the dcgm-exporter scrape's
bounded parser (:func:`gpuwhy.probes.gpu.exporter.parse_sample`): a bad line is skipped and
counted, never fatal. Only the lines of the families read are parsed: a server's body is
mostly others (its HTTP frontend's per-handler histograms, the Python client's process
figures, the engine's other histograms), and parsing them was most of a scrape's CPU
(scripts/bench_engines.py); another line is only checked to begin as a sample does (a metric
name, then labels or a value), so that a line of no sample is still counted and a body of no
Prometheus text at all still told apart.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

from gpuwhy.probes.gpu.exporter import MAX_LINES, SampleSkipped, parse_sample
from gpuwhy.rules.vocabulary import ENGINE_VALUES

# The values an engine_sample may carry (the bus and store take no other key): defined once,
# with the engine.* signals that read them.
VALUES = tuple(ENGINE_VALUES)
MAX_HISTOGRAM_BUCKETS = 256     # per histogram (vLLM's longest: ~20)
MAX_GPU_LABELS = 64
# how a sample line of a family not read begins: a metric name, then labels or a value
# (a number, NaN, +Inf or -Inf)
_SAMPLE_START = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\{|[ \t]+[-+0-9.NI])")


@dataclass(frozen=True)
class Spec:
    """One engine's names. ``gauges``/``counters``/``histograms``: our name -> its metric
    names, newest first. ``means``: our name -> (cumulative sum metric, cumulative count
    metric, scale to seconds) for engines that publish totals instead of histograms.
    ``prefixes``: what every one of its metric names starts with (others are not parsed).
    ``max_gauges``: gauges whose label sets are not added up but the largest taken."""

    prefixes: tuple[str, ...]
    gauges: dict[str, tuple[str, ...]]
    counters: dict[str, tuple[str, ...]]
    histograms: dict[str, tuple[str, ...]] = field(default_factory=dict)
    means: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    ratio: dict[str, tuple[str, str]] = field(default_factory=dict)   # Δa/Δb
    max_gauges: frozenset[str] = frozenset({"kv_cache_usage"})
    gpu_label: str = ""


SPECS: dict[str, Spec] = {
    # vLLM: vllm/engine/metrics.py (V0), vllm/v1/metrics/loggers.py (V1);
    # docs/design/metrics.md lists both sets.
    "vllm": Spec(
        prefixes=("vllm:",),
        gauges={"requests_running": ("vllm:num_requests_running",),
                "requests_waiting": ("vllm:num_requests_waiting",),
                "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")},
        counters={"preemptions": ("vllm:num_preemptions_total",),
                  "prompt_tokens": ("vllm:prompt_tokens_total",),
                  "generation_tokens": ("vllm:generation_tokens_total",),
                  "requests": ("vllm:request_success_total",)},
        histograms={"ttft": ("vllm:time_to_first_token_seconds",),
                    "tpot": ("vllm:inter_token_latency_seconds",
                             "vllm:time_per_output_token_seconds"),
                    "e2e": ("vllm:e2e_request_latency_seconds",),
                    "queue": ("vllm:request_queue_time_seconds",)}),
    # SGLang: python/sglang/srt/metrics/collector.py; docs/references/production_metrics.md
    "sglang": Spec(
        prefixes=("sglang:",),
        gauges={"requests_running": ("sglang:num_running_reqs",),
                "requests_waiting": ("sglang:num_queue_reqs",),
                "kv_cache_usage": ("sglang:token_usage",)},
        counters={"preemptions": ("sglang:num_retracted_requests_total",),
                  "prompt_tokens": ("sglang:prompt_tokens_total",),
                  "generation_tokens": ("sglang:generation_tokens_total",),
                  "requests": ("sglang:num_requests_total",)},
        histograms={"ttft": ("sglang:time_to_first_token_seconds",),
                    "tpot": ("sglang:inter_token_latency_seconds",
                             "sglang:time_per_output_token_seconds"),
                    "e2e": ("sglang:e2e_request_latency_seconds",),
                    "queue": ("sglang:queue_time_seconds",)}),
    # TGI: the router's metrics, docs/source/reference/metrics.md. Token totals are the
    # _sum of its per-request histograms.
    "tgi": Spec(
        prefixes=("tgi_",),
        gauges={"requests_running": ("tgi_batch_current_size",),
                "batch_size": ("tgi_batch_current_size",),
                "requests_waiting": ("tgi_queue_size",)},
        counters={"prompt_tokens": ("tgi_request_input_length_sum",),
                  "generation_tokens": ("tgi_request_generated_tokens_sum",),
                  "requests": ("tgi_request_success",)},
        histograms={"tpot": ("tgi_request_mean_time_per_token_duration",),
                    "e2e": ("tgi_request_duration",),
                    "queue": ("tgi_request_queue_duration",)}),
    # Triton: docs/user_guide/metrics.md. Durations are cumulative microseconds; the
    # average dynamic batch is inference count / execution count.
    "triton": Spec(
        prefixes=("nv_",),
        gauges={"requests_waiting": ("nv_inference_pending_request_count",)},
        counters={"requests": ("nv_inference_request_success",)},
        means={"queue": ("nv_inference_queue_duration_us", "nv_inference_request_success",
                         1e-6),
               "e2e": ("nv_inference_request_duration_us", "nv_inference_request_success",
                       1e-6)},
        ratio={"batch_size": ("nv_inference_count", "nv_inference_exec_count")},
        gpu_label="gpu_uuid"),
}


@dataclass
class Parsed:
    """What one body holds of an engine's names: label sets added up."""

    gauges: dict[str, float] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)   # counters and sums, by metric
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)   # histogram: le -> n
    gpu_ids: list[str] = field(default_factory=list)
    names: set[str] = field(default_factory=set)              # every name of ours seen
    skipped: int = 0
    first_skip: str = ""
    good: int = 0


def _wanted(spec: Spec) -> tuple[set[str], set[str], set[str]]:
    gauges = {n for names in spec.gauges.values() for n in names}
    totals = {n for names in spec.counters.values() for n in names}
    totals |= {n for pair in spec.means.values() for n in pair[:2]}
    totals |= {n for pair in spec.ratio.values() for n in pair}
    histograms = {n for names in spec.histograms.values() for n in names}
    return gauges, totals, histograms


@functools.cache
def _reading(engine: str) -> tuple[set[str], set[str], set[str], tuple[str, ...]]:
    """The engine's names read (:func:`_wanted`, once), and what every sample line of their
    families begins with (its name; a histogram's _bucket, _sum and _count lines too)."""
    gauges, totals, histograms = _wanted(SPECS[engine])
    return gauges, totals, histograms, tuple(sorted(gauges | totals | histograms))


def parse(engine: str, text: str, narrow: bool = True) -> Parsed:
    """The engine's metrics in a /metrics body. Raises ValueError when no line at all is
    Prometheus text (an HTML page, garbage). ``narrow=False`` parses every sample line, the
    families not read too (the benchmark's "before")."""
    spec = SPECS[engine]
    gauges, totals, histograms, prefixes = _reading(engine)
    read = prefixes if narrow else ("",)
    # the GPU label may be on families not read (Triton's gpu_uuid: on its nv_gpu_* ones)
    marker = f'{spec.gpu_label}="' if spec.gpu_label else None
    out = Parsed()
    lines = text.split("\n", MAX_LINES)
    if len(lines) > MAX_LINES:
        lines.pop()
        out.skipped += 1
        out.first_skip = f"more than {MAX_LINES} lines"
    gpus: set[str] = set()
    largest = {n for g in spec.max_gauges for n in spec.gauges.get(g, ())}
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            out.good += 1
            continue
        if not line.startswith(read) and not (marker and marker in line):
            # a family not read: only checked to begin as a sample does (counted if not)
            if _SAMPLE_START.match(line):
                out.good += 1
            else:
                out.skipped += 1
                out.first_skip = out.first_skip or f"line {lineno}: not a sample: {line[:40]!r}"
            continue
        try:
            name, labels, raw = parse_sample(line)
        except SampleSkipped as exc:
            out.skipped += 1
            out.first_skip = out.first_skip or f"line {lineno}: {exc}"
            continue
        out.good += 1
        if not name.startswith(spec.prefixes):
            continue
        value = float(raw)
        if not math.isfinite(value):
            continue
        if spec.gpu_label and len(gpus) < MAX_GPU_LABELS:
            gpu = labels.get(spec.gpu_label, "")
            if gpu.startswith("GPU-") and len(gpu) <= 64 and gpu[4:].replace("-", "").isalnum():
                gpus.add(gpu)
        if name in gauges:
            out.names.add(name)
            out.gauges[name] = max(out.gauges.get(name, value), value) if name in largest \
                else out.gauges.get(name, 0.0) + value
        elif name in totals:
            out.names.add(name)
            out.totals[name] = out.totals.get(name, 0.0) + value
        elif name.endswith("_bucket") and name[:-7] in histograms:
            le = labels.get("le", "")
            try:
                bound = float(le)
            except ValueError:
                continue
            held = out.buckets.setdefault(name[:-7], {})
            if bound in held or len(held) < MAX_HISTOGRAM_BUCKETS:
                held[bound] = held.get(bound, 0.0) + value
                out.names.add(name[:-7])
        elif name.endswith(("_sum", "_count")):
            base = name.rsplit("_", 1)[0]
            if base in histograms:
                out.totals[name] = out.totals.get(name, 0.0) + value
    if not out.good and out.skipped:
        raise ValueError(out.first_skip)
    out.gpu_ids = sorted(gpus)
    return out


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus's histogram_quantile over cumulative bucket counts (le -> count): linear
    inside the bucket; the +Inf bucket answers its lower bound. None without observations."""
    bounds = sorted(buckets)
    if not bounds or not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return None


def _first(names: tuple[str, ...], held: dict) -> str | None:
    return next((n for n in names if n in held), None)


def dialect(engine: str, parsed: Parsed) -> str:
    """What the metric names tell of the version ("" when nothing does)."""
    if engine == "vllm":
        if "vllm:kv_cache_usage_perc" in parsed.names or \
                "vllm:inter_token_latency_seconds" in parsed.names:
            return "v1"
        if "vllm:gpu_cache_usage_perc" in parsed.names:
            return "v0"      # also the V1 engine before vLLM 0.10 (it kept V0's names)
    return ""


def values(engine: str, now: Parsed, before: Parsed | None, seconds: float) -> dict[str, float]:
    """The engine_sample values of one scrape: gauges from ``now``; rates, quantiles and
    means from ``now`` against ``before`` (the previous scrape, ``seconds`` earlier)."""
    spec = SPECS[engine]
    out: dict[str, float] = {}
    for ours, names in spec.gauges.items():
        name = _first(names, now.gauges)
        if name is not None:
            out[ours] = now.gauges[name]
    if before is None or seconds <= 0:
        return out

    def delta(name: str | None) -> float | None:
        if name is None or name not in now.totals or name not in before.totals:
            return None
        change = now.totals[name] - before.totals[name]
        return change if change >= 0 else None      # a reset: the engine restarted

    for ours, names in spec.counters.items():
        change = delta(_first(names, now.totals))
        if change is not None:
            out[f"{ours}_per_s"] = change / seconds
    for ours, names in spec.histograms.items():
        name = _first(names, now.buckets)
        if name is None or name not in before.buckets:
            continue
        old = before.buckets[name]
        interval = {le: n - old.get(le, 0.0) for le, n in now.buckets[name].items()}
        if any(n < 0 for n in interval.values()):
            continue
        for q, label in ((0.5, "p50"), (0.95, "p95")):
            value = quantile(q, interval)
            if value is not None:
                out[f"{ours}_{label}_s"] = value
        total, count = delta(f"{name}_sum"), delta(f"{name}_count")
        if total is not None and count:
            out[f"{ours}_mean_s"] = total / count
    for ours, (total_name, count_name, scale) in spec.means.items():
        total, count = delta(total_name), delta(count_name)
        if total is not None and count:
            out[f"{ours}_mean_s"] = total * scale / count
    for ours, (a, b) in spec.ratio.items():
        top, bottom = delta(a), delta(b)
        if top is not None and bottom:
            out[ours] = top / bottom
    return {k: v for k, v in out.items() if k in VALUES and math.isfinite(v)}
