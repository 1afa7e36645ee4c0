"""`gpuwhy gpu sample|fields|mark-healthy` and `gpuwhy dcgm pause|resume`."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Any

import click

from gpuwhy.app.clitypes import HttpUrl
from gpuwhy.errors import GpuwhyError
from gpuwhy.events import Event, GpuProcesses, GpuSample
from gpuwhy.gpufields import fields_markdown
from gpuwhy.probes.gpu.select import check_interval, open_source
from gpuwhy.probes.gpu.source import SOURCE_NAMES, GpuInfo, GpuSource
from gpuwhy.text import table

TABLE_FIELDS = (("gpu_util", "util%", "{:.0f}"), ("sm_active", "sm", "{:.2f}"),
                ("tensor_active", "tensor", "{:.2f}"), ("dram_active", "dram", "{:.2f}"),
                ("power_w", "W", "{:.0f}"), ("temp_c", "°C", "{:.0f}"),
                ("sm_clock_mhz", "MHz", "{:.0f}"), ("fb_used_mib", "fb MiB", "{:.0f}"),
                ("pcie_rx_bytes_per_s", "pcie rx GB/s", "{:.2f}"),
                ("clocks_event_reasons", "reasons", "{:#x}"))
ONCE_TRIES = 5
RATES_GAP_S = 0.2      # NVML's GPM counters refresh every ~100 ms: two samples further apart


def sample_json(sample: GpuSample, gpu: GpuInfo | None) -> dict:
    i = gpu.identity if gpu else None
    return {"index": i and i.index, "uuid": i and i.uuid, "model": gpu and gpu.model,
            "pci_bus_id": i and i.pci_bus_id, "source": sample.source, "ts": sample.ts,
            "simulated": sample.simulated, "gpu_id": sample.gpu_id, "instance": sample.instance,
            "fields": sample.fields}


def _cell(fields: dict, name: str, form: str) -> str:
    if name not in fields:
        return "-"
    value = fields[name] / 1e9 if name.endswith("bytes_per_s") else fields[name]
    return form.format(int(value) if "x" in form else value)


def table_lines(samples: list[GpuSample], gpus: dict[str, GpuInfo]) -> list[str]:
    head = f"{'gpu':>3} {'model':<34} " + " ".join(f"{label:>12}" for _, label, _ in TABLE_FIELDS)
    lines = [head]
    for s in samples:
        gpu = gpus.get(s.gpu_id)
        index = "?" if gpu is None or gpu.identity.index is None else gpu.identity.index
        name = (gpu.model if gpu else s.gpu_id)[:34]
        cells = " ".join(f"{_cell(s.fields, n, f):>12}" for n, _, f in TABLE_FIELDS)
        lines.append(f"{index!s:>3} {name:<34} {cells}")
    return lines


def _print_other(events: list[Event]) -> None:
    for event in events:
        if not isinstance(event, GpuSample) and event.kind in ("gpu_xid", "gpu_state"):
            click.echo(f"{event.kind}: {json.dumps(vars(event), default=str)}", err=True)


def _read_until_samples(source: GpuSource, interval: float) -> list[Event]:
    """--once: DCGM has no value before its first update cycle, so try a few intervals; a
    source whose rates need two reads (NVML's GPM activity) is read once more."""
    for _ in range(ONCE_TRIES):
        events = source.read()
        if any(isinstance(e, GpuSample) for e in events):
            if getattr(source, "rates_pending", False):
                time.sleep(max(interval, RATES_GAP_S))
                again = source.read()
                if any(isinstance(e, GpuSample) for e in again):
                    return again
            return events
        time.sleep(interval)
    return []


def _print_processes(events: list[Event], as_json: bool) -> None:
    for event in events:
        if not isinstance(event, GpuProcesses):
            continue
        if as_json:
            click.echo(json.dumps({"kind": event.kind, "ts": event.ts, "gpu_id": event.gpu_id,
                                   "source": event.source, "processes": event.processes}))
            continue
        for p in event.processes:
            click.echo(f"process {p.get('pid')} on {event.gpu_id}: "
                       f"{p.get('used_memory_mib')} MiB, sm {p.get('sm_util')}%")


@click.group()
def gpu() -> None:
    """GPU counters: sample them now, list the fields.

    \b
    Examples:
      gpuwhy gpu sample --once
      gpuwhy gpu sample --source dcgm-exporter --url http://localhost:9400/metrics --json
      gpuwhy gpu fields --markdown
    """


@gpu.command()
@click.option("--source", "source_name", type=click.Choice(("auto", *SOURCE_NAMES)),
              help="Force a source [gpu.source; default auto].")
@click.option("--url", type=HttpUrl(), help="dcgm-exporter metrics URL [gpu.exporter_url].")
@click.option("--once", is_flag=True, help="Print one sample per GPU and exit.")
@click.option("--interval", type=float, help="Seconds between samples [gpu.interval].")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per GPU per sample (keys index, uuid, model, pci_bus_id, "
                   "source, ts, fields, ...).")
@click.option("--processes", is_flag=True,
              help="Also print each GPU's compute processes (NVML: pid, memory, per-process "
                   "utilisation); with --json as objects whose kind is gpu_processes.")
@click.pass_obj
def sample(ctx: Any, source_name: str | None, url: str | None, once: bool,
           interval: float | None, as_json: bool, processes: bool) -> None:
    """Sample the GPUs and print the counters; needs no running `gpuwhy up`.

    \b
    Examples:
      gpuwhy gpu sample --once
      gpuwhy gpu sample --source sim --interval 0.5 --json | jq .fields.sm_active
      gpuwhy gpu sample --source dcgm-exporter --url http://10.0.0.5:9400/metrics --once
    """
    config = ctx.config(**{"gpu.interval": interval})
    try:
        check_interval(config["gpu.interval"])
        source, steps = open_source(config, forced=source_name, url=url)
    except GpuwhyError as exc:
        raise click.ClickException(str(exc)) from None
    gpus = {g.id: g for g in source.gpus}
    banner = "; ".join(steps + source.notes())
    if source.simulated:
        banner = f"SIMULATED DATA, not a real GPU: {banner}"
    click.echo(f"# {banner}", err=as_json)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        while not stop.is_set():
            try:
                events = (_read_until_samples(source, config["gpu.interval"]) if once
                          else source.read())
            except GpuwhyError as exc:
                click.echo(f"error: {exc}", err=True)
                events = []
            gpus.update({g.id: g for g in source.gpus})
            samples = [e for e in events if isinstance(e, GpuSample)]
            _print_other(events)
            if processes:
                _print_processes(events, as_json)
            if as_json:
                for s in samples:
                    click.echo(json.dumps(sample_json(s, gpus.get(s.gpu_id))))
            elif samples:
                click.echo("\n".join(table_lines(samples, gpus)))
            sys.stdout.flush()
            if once:
                if not samples:
                    raise click.ClickException("no sample arrived")
                return
            stop.wait(config["gpu.interval"])
    finally:
        source.close()


@gpu.command()
@click.option("--markdown", is_flag=True, help="Print the table of docs/gpu-fields.md.")
def fields(markdown: bool) -> None:
    """The normalised GPU fields: name, DCGM field id, unit, NVML call, exporter metrics.

    \b
    Examples:
      gpuwhy gpu fields
      gpuwhy gpu fields --markdown > docs/gpu-fields-table.md
    """
    from gpuwhy.gpufields import FIELDS

    if markdown:
        click.echo(fields_markdown())
        return
    click.echo(table(["field", "DCGM id", "unit", "dcgm-exporter metric"],
                     [[f.name, f.field_id, f.unit, f.exporter[0]] for f in FIELDS], right=[1]))


@gpu.command("mark-healthy")
@click.argument("gpu_name", metavar="GPU")
@click.option("--why", required=True, help="Why it is healthy (replaced, reseated, checked).")
@click.option("--by", "actor", help="Who says so (default: $SUDO_USER, else your login name).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def mark_healthy(ctx: Any, gpu_name: str, why: str, actor: str | None,
                 as_json: bool) -> None:
    """Mark a GPU healthy by hand: its health goes to ok whatever it waited for (a reset,
    a reboot), with who and why kept in its health history, and the incidents that rest on
    its health are resolved as "operator" with the same who and why (in their logs and the
    journal).

    \b
    Examples:
      gpuwhy gpu mark-healthy 0 --why "GPU replaced, RMA 77" --by alice
      gpuwhy gpu mark-healthy GPU-5f3c... --why "reseated the riser" --json
    """
    from gpuwhy.app.incidents_cli import default_actor
    from gpuwhy.store import incident_changes as store_lifecycle
    from gpuwhy.store import open_store
    from gpuwhy.store.health import mark_healthy as mark
    from gpuwhy.store.queries import gpu_named
    from gpuwhy.text import printable

    config = ctx.config()
    try:
        db = open_store(config["store.path"])
    except GpuwhyError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        gpu_id = gpu_named(db, gpu_name)
        try:
            done = mark(db, gpu_id, actor if actor is not None else default_actor(), why)
        except GpuwhyError as exc:
            raise click.ClickException(str(exc)) from None
        unsent = []
        for log_id in done["log_ids"]:
            try:       # the change stands, whatever the journal does
                failed = store_lifecycle.send_change(db, log_id, config["correlator.url"])
            except Exception as exc:
                failed = f"{type(exc).__name__}: {exc}"
            if failed:
                unsent.append(failed)
    finally:
        db.close()
    if as_json:
        click.echo(json.dumps({**done, "journal": unsent or None}))
    else:
        resolved = ", ".join(str(i) for i in done["incidents"]) or "none"
        click.echo(f"GPU {printable(gpu_id)} marked healthy ({done['previous']} -> ok); "
                   f"incidents resolved: {resolved}")
    for failed in unsent:
        click.echo(f"warning: stored, but a journal entry was not written: {failed}", err=True)


@click.group()
def dcgm() -> None:
    """Control DCGM's profiling counters (so that Nsight can use them).

    \b
    Examples:
      gpuwhy dcgm pause      # before nsys / ncu
      gpuwhy dcgm resume     # afterwards
    """


def _set_profiling(ctx: Any, pause: bool) -> None:
    from gpuwhy.probes.gpu.dcgm import Bindings, connect

    config = ctx.config()
    try:
        bindings = Bindings(config["gpu.dcgm_bindings"])
        handle, mode = connect(bindings, config["gpu.dcgm_host"], embedded_allowed=False)
        try:
            system = handle.GetSystem()
            (system.profiling.Pause if pause else system.profiling.Resume)()
        except bindings.structs.DCGMError as exc:
            raise click.ClickException(f"dcgm: {bindings.status_name(exc)}") from None
        finally:
            handle.Shutdown()
    except GpuwhyError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"DCGM profiling {'paused' if pause else 'resumed'} on {mode}")


@dcgm.command()
@click.pass_obj
def pause(ctx: Any) -> None:
    """Pause DCGM profiling; its profiling fields read as missing until `resume`.

    \b
    Example:
      gpuwhy dcgm pause && nsys profile python train.py; gpuwhy dcgm resume
    """
    _set_profiling(ctx, True)


@dcgm.command()
@click.pass_obj
def resume(ctx: Any) -> None:
    """Resume DCGM profiling after `pause`.

    \b
    Example:
      gpuwhy dcgm resume
    """
    _set_profiling(ctx, False)
