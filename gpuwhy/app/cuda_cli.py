"""`gpuwhy cuda`: the CUDA uprobes' kill switch, their state, and the build-id allow-list."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from gpuwhy.app.clitypes import InputFile
from gpuwhy.probes.cuda import control as cudactl
from gpuwhy.probes.cuda.libraries import ElfError, build_id, mapped_libraries, parse_allowed

CONFIRM_SECONDS = 2.0


@click.group()
def cuda() -> None:
    """CUDA API uprobes (opt-in): kill switch, state, build-id allow-list.

    \b
    Examples:
      gpuwhy cuda disable                  # detach every CUDA uprobe now
      gpuwhy cuda enable
      gpuwhy cuda status
      gpuwhy cuda allow-build-id /usr/lib/x86_64-linux-gnu/libcuda.so.1
    """


def _state_line(state: dict | None) -> str:
    if state is None:
        return "no probes process has reported (state file absent)"
    age = time.time() - state.get("updated", 0)
    processes = state.get("processes", [])
    attached = sum(1 for p in processes if p.get("libraries"))
    return (f"probes process {state.get('pid')} ({age:.1f}s ago): "
            f"{'enabled' if state.get('enabled') else 'off'}, "
            f"{state.get('attached_probes', 0)} uprobes in {attached} processes")


@cuda.command()
@click.option("--reason", default="disabled by hand (gpuwhy cuda disable)",
              help="Why, for the record.")
@click.pass_obj
def disable(ctx: Any, reason: str) -> None:
    """Kill switch: detach every CUDA uprobe at once; they stay off (across restarts of the
    probes) until `gpuwhy cuda enable`. Waits up to 2 s for the probes process to confirm."""
    config = ctx.config()
    try:
        cudactl.disable(config, reason)
    except OSError as exc:
        raise click.ClickException(f"cannot set the kill switch in "
                                   f"{config['probes.cuda_control_dir']}: {exc}") from None
    set_at = time.time()
    deadline = time.monotonic() + CONFIRM_SECONDS
    while time.monotonic() < deadline:
        state = cudactl.read_state(config)
        if state and not state.get("enabled") and state.get("updated", 0) >= set_at:
            detach = state.get("last_detach_ms")
            took = f" in {detach:.0f} ms" if detach is not None else ""
            click.echo(f"cuda uprobes off: detached{took} "
                       f"({state.get('attached_probes', 0)} uprobes left)")
            return
        time.sleep(0.05)
    click.echo(f"kill switch set ({cudactl.kill_path(config)}); no running probes process "
               f"confirmed it: {_state_line(cudactl.read_state(config))}")


@cuda.command()
@click.pass_obj
def enable(ctx: Any) -> None:
    """Clear the kill switch (the probes attach again if probes.cuda_uprobes is true)."""
    config = ctx.config()
    was_set = cudactl.enable(config)
    click.echo("kill switch cleared" if was_set else "kill switch was not set")
    if not config["probes.cuda_uprobes"]:
        click.echo("note: probes.cuda_uprobes is false: nothing is attached until it is true")


@cuda.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def status(ctx: Any, as_json: bool) -> None:
    """Settings, kill switch and what the probes process holds."""
    config = ctx.config()
    allowed = parse_allowed(config["probes.cuda_allowed_build_ids"])
    report = {"cuda_uprobes": config["probes.cuda_uprobes"],
              "allowed_build_ids": "any" if allowed is None else sorted(allowed),
              "kill_switch": cudactl.disabled_reason(config),
              "state": cudactl.read_state(config)}
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"probes.cuda_uprobes: {report['cuda_uprobes']}")
    ids = report["allowed_build_ids"]
    click.echo(f"allowed build ids: {ids if ids == 'any' else (', '.join(ids) or 'none')}")
    click.echo(f"kill switch: {report['kill_switch'] or 'not set'}")
    click.echo(_state_line(report["state"]))
    for process in (report["state"] or {}).get("processes", []):
        libraries = ", ".join(f"{path} ({n} uprobes)"
                              for path, n in process.get("libraries", {}).items())
        extra = [f"refused {', '.join(process['refused'])}"] if process.get("refused") else []
        if process.get("detached"):
            extra.append(f"detached: {process['detached']}")
        click.echo(f"  pid {process['pid']}: {libraries or 'nothing attached'}"
                   f"{'; ' + '; '.join(extra) if extra else ''}")


@cuda.command("allow-build-id")
@click.argument("paths", nargs=-1, type=InputFile())
@click.option("--pid", type=int, help="Take the CUDA libraries this process has mapped.")
@click.pass_obj
def allow_build_id(ctx: Any, paths: tuple[str, ...], pid: int | None) -> None:
    """Print the build ids of CUDA libraries and the setting that allows them.

    gpuwhy does not edit the config file: add the printed line under [probes].
    """
    config = ctx.config()
    targets = list(paths)
    if pid is not None:
        targets += [lib.host_path for lib in mapped_libraries(pid, config["probes.proc_root"])]
    if not targets:
        raise click.UsageError("give library paths or --pid")
    current = parse_allowed(config["probes.cuda_allowed_build_ids"])
    ids = set(current or ())
    for path in targets:
        try:
            found = build_id(path)
        except ElfError as exc:
            raise click.ClickException(str(exc)) from None
        if found is None:
            raise click.ClickException(f"{path}: has no GNU build id; it cannot be allowed")
        state = "already allowed" if current is None or found in current else "new"
        click.echo(f"{found}  {path}  ({state})")
        ids.add(found)
    if current is None:
        click.echo("probes.cuda_allowed_build_ids is * (any library): nothing to add")
        return
    click.echo("\nAdd to the config file, under [probes]:")
    click.echo(f'cuda_allowed_build_ids = "{",".join(sorted(ids))}"')
