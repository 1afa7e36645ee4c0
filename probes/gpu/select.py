"""Pick the GPU source: DCGM, then NVML, then dcgm-exporter (if a URL is set), then SIMULATOR.

Each step that is skipped leaves its reason; the reasons end up in ``gpuwhy status``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpuwhy.errors import ConfigError
from gpuwhy.probes.gpu.source import SOURCE_NAMES, GpuSource, SourceUnavailable

MIN_INTERVAL = 0.1


def make_source(name: str, config: Mapping[str, Any], url: str | None = None) -> GpuSource:
    """An unopened source by name, configured from ``config``."""
    interval = config["gpu.interval"]
    if name == "dcgm":
        from gpuwhy.probes.gpu.dcgm import DcgmSource

        if config["gpu.dcgm_embedded"] not in ("auto", "never"):
            raise ConfigError(f"expected auto or never, got {config['gpu.dcgm_embedded']!r}",
                              key="gpu.dcgm_embedded")
        return DcgmSource(config["gpu.dcgm_host"], interval, config["gpu.dcgm_bindings"],
                          config["gpu.dcgm_embedded"] == "auto", config["probes.proc_root"])
    if name == "nvml":
        from gpuwhy.probes.gpu.nvml import NvmlSource

        return NvmlSource(config["probes.proc_root"])
    if name == "dcgm-exporter":
        from gpuwhy.probes.gpu.exporter import ExporterSource

        if not config["gpu.exporter_timeout"] > 0:
            raise ConfigError(f"expected seconds above 0, got {config['gpu.exporter_timeout']}",
                              key="gpu.exporter_timeout")
        return ExporterSource(url if url is not None else config["gpu.exporter_url"],
                              timeout=config["gpu.exporter_timeout"])
    if name == "sim":
        from gpuwhy.probes.gpu.sim import SimulatedGpus

        return SimulatedGpus(config["gpu.sim_gpus"], config["gpu.sim_model"],
                             config["gpu.sim_scenario"], config["gpu.sim_seed"], interval,
                             config["gpu.sim_event_after"], config["gpu.sim_event_file"])
    raise ConfigError(f"unknown GPU source {name!r}; one of auto, {', '.join(SOURCE_NAMES)}",
                      key="gpu.source")


def check_interval(interval: float) -> None:
    if interval < MIN_INTERVAL:
        raise ConfigError(f"GPU sampling interval {interval} s is below {MIN_INTERVAL} s",
                          key="gpu.interval")


def open_source(config: Mapping[str, Any], forced: str | None = None, url: str | None = None,
                factory: Callable[..., GpuSource] = make_source
                ) -> tuple[GpuSource, list[str]]:
    """The first source that opens, and why each one before it did not.

    ``forced`` (or ``gpu.source`` when not ``auto``) opens that one source only and lets
    its :class:`SourceUnavailable` through.
    """
    check_interval(config["gpu.interval"])
    choice = forced or config["gpu.source"]
    if choice != "auto":
        source = factory(choice, config, url)
        source.open()
        return source, [f"{choice}: forced"]
    steps: list[str] = []
    exporter_url = url if url is not None else config["gpu.exporter_url"]
    for name in SOURCE_NAMES:
        if name == "dcgm-exporter" and not exporter_url:
            steps.append("exporter: not configured")
            continue
        try:
            source = factory(name, config, url)
            source.open()
        except SourceUnavailable as exc:
            steps.append(f"{'exporter' if name == 'dcgm-exporter' else name}: {exc.reason}")
            continue
        steps.append("using SIMULATOR" if name == "sim" else f"using {name}")
        return source, steps
    raise SourceUnavailable("gpu", "; ".join(steps))   # only if the simulator itself failed
