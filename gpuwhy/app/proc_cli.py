"""`gpuwhy proc PID`: what gpuwhy's /proc scan sees of one process, without eBPF or root."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from gpuwhy.app.clitypes import InputDir
from gpuwhy.config import environment_names
from gpuwhy.errors import NoSuchProcess
from gpuwhy.identity import GpuIdentity, classify_device
from gpuwhy.probes.gpu.source import proc_identities
from gpuwhy.probes.procscan import scan_open_devices
from gpuwhy.proc import read_process
from gpuwhy.text import printable


def process_report(pid: int, device_glob: str, proc_root: str = "/proc",
                   environment: frozenset[str] = frozenset()) -> dict:
    """The process as gpuwhy records it (``environment``: the variables the probes record,
    ``probes.environment``), its open NVIDIA device fds (the start-up scan's view) and the
    GPUs those fds bind it to (``/dev/nvidiaN`` minor → the driver's list).
    Raises :class:`NoSuchProcess`."""
    seen = read_process(pid, time.time_ns(), proc_root, environment)
    fds: list[dict[str, Any]] = []
    for device in scan_open_devices(device_glob, proc_root, only_pid=pid):
        kind, minor = classify_device(device.path)
        fds.append({"fd": device.fd, "path": device.path, "kind": kind, "minor": minor})
    by_minor = {g.minor: g for g in proc_identities(proc_root) if g.minor is not None}
    minors = sorted({f["minor"] for f in fds if f["kind"] == "nvidiaN"})
    gpus = []
    for minor in minors:
        known = by_minor.get(minor)
        identity = known or GpuIdentity(minor=minor)
        gpus.append({"minor": minor, "gpu_id": identity.id, "uuid": identity.uuid,
                     "pci_bus_id": identity.pci_bus_id, "known_to_driver": known is not None})
    return {"pid": seen.process.pid, "start_time": seen.process.start_time, "comm": seen.comm,
            "cmdline": seen.cmdline, "exe": seen.exe, "ppid": seen.ppid, "uid": seen.uid,
            "cgroup": seen.cgroup, "container_id": seen.container_id, "pod_uid": seen.pod_uid,
            "unit": seen.unit, "tag": seen.tag, "env": dict(seen.env),
            "device_glob": device_glob,
            "device_fds": sorted(fds, key=lambda f: f["fd"]), "gpus": gpus}


@click.command("proc")
@click.argument("pid", type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--proc-root", default="/proc", show_default=True, hidden=True, type=InputDir())
@click.pass_obj
def proc(ctx: Any, pid: int, as_json: bool, proc_root: str) -> None:
    """One process as gpuwhy sees it in /proc: identity, cgroup, the environment variables
    the probes record (probes.environment), NVIDIA device fds and the GPUs they bind it to.
    Needs no root for your own processes (root for others' fds and environment).

    \b
    Examples:
      gpuwhy proc 4242
      gpuwhy proc "$(pgrep -f train.py | head -1)" --json | jq .gpus
    """
    config = ctx.config()
    glob = config["probes.device_glob"]
    try:
        report = process_report(pid, glob, proc_root,
                                environment_names(config["probes.environment"]))
    except NoSuchProcess:
        raise click.ClickException(f"no process {pid}") from None
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"pid {report['pid']} ({printable(report['comm'], 64)}) started "
               f"{report['start_time']} uid {report['uid']}")
    click.echo(f"  cmdline: {printable(report['cmdline'], 200)}")
    click.echo(f"  cgroup:  {printable(report['cgroup'], 200)}")
    for name, value in sorted(report["env"].items()):      # the process set them: escaped
        click.echo(f"  env:     {printable(name, 64)}={printable(value, 200)}")
    for f in report["device_fds"]:
        click.echo(f"  fd {f['fd']:>4} {printable(f['path'])} ({f['kind']})")
    if not report["device_fds"]:
        click.echo(f"  no open fd matches {printable(glob)}")
    for g in report["gpus"]:
        click.echo(f"  bound to GPU {printable(g['gpu_id'])} (minor {g['minor']})")
