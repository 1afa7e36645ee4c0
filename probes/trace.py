"""`gpuwhy trace`: a live view of decoded NVIDIA driver calls, one line per call (bcc style).

Loads its own copy of fdtrack in trace mode (every call on a tracked fd becomes a record),
so it works whether or not `gpuwhy up` runs, and prints as calls happen.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections import defaultdict
from typing import Any, TextIO

import click

from gpuwhy.errors import GpuwhyError
from gpuwhy.events import DriverCall, Event
from gpuwhy.nvioctl import escape_nr

HEADER = (f"{'TIME(s)':<9} {'COMM':<15} {'PID':>7} {'TID':>7} {'DEVICE':<11} {'FD':>3} "
          f"{'OP':<28} {'LAT(us)':>9} {'RET':>4} {'STATUS':<12} DETAIL")


def call_json(call: DriverCall, comm: str) -> dict:
    """One call as `--json` prints it: the documented keys, plus the ones that apply."""
    record = {"ts": call.ts, "pid": call.process.pid, "start_time": call.process.start_time,
              "comm": comm, "device": call.device, "fd": call.fd, "cmd": call.cmd,
              "nr": call.nr, "op": call.op, "latency_ns": call.latency_ns, "ret": call.ret,
              "tid": call.tid, "status": call.status, "status_name": call.status_name,
              "size": call.size}
    nr = None if call.device.startswith("nvidia-uvm") else escape_nr(call.cmd)
    if nr in (0x27, 0x2B):
        record.update(rm_class=call.sub, rm_class_name=call.sub_name)
    elif nr == 0x2A:
        record.update(rm_control=call.sub, rm_control_name=call.sub_name)
    if call.bytes:
        record["bytes"] = call.bytes
    if call.version is not None:
        record["version"] = call.version
    if call.gpu_ids is not None:
        record["gpu_ids"] = call.gpu_ids
    return record


def call_line(call: DriverCall, comm: str, started_ns: int) -> str:
    detail = []
    if call.sub_name:
        detail.append(call.sub_name)
    if call.bytes:
        detail.append(f"{call.bytes} bytes")
    if call.version:
        detail.append(f"version {call.version}")
    if call.gpu_ids:
        detail.append("gpus " + ",".join(f"0x{i:x}" for i in call.gpu_ids))
    status = call.status_name if call.status else ""
    return (f"{(call.ts - started_ns) / 1e9:<9.3f} {comm[:15]:<15} {call.process.pid:>7} "
            f"{call.tid:>7} {call.device:<11} {call.fd:>3} {call.op[:28]:<28} "
            f"{call.latency_ns / 1000:>9.1f} {call.ret:>4} {status:<12} {' '.join(detail)}")


class Summary:
    """Per process and operation: calls, errors, mean and max latency."""

    def __init__(self) -> None:
        self.rows: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])

    def add(self, call: DriverCall, comm: str) -> None:
        row = self.rows[(call.process.pid, comm, call.op, call.sub_name or "")]
        row[0] += 1
        row[1] += call.ret != 0 or call.status != 0
        row[2] += call.latency_ns
        row[3] = max(row[3], call.latency_ns)

    def print(self, out: TextIO) -> None:
        out.write(f"\n{'PID':>7} {'COMM':<15} {'OP':<28} {'SUB':<40} {'CALLS':>8} "
                  f"{'ERRORS':>7} {'AVG(us)':>9} {'MAX(us)':>9}\n")
        for (pid, comm, op, sub), (calls, errors, total, peak) in sorted(
                self.rows.items(), key=lambda item: -item[1][0]):
            out.write(f"{pid:>7} {comm[:15]:<15} {op[:28]:<28} {sub[:40]:<40} {calls:>8} "
                      f"{errors:>7} {total / calls / 1000:>9.1f} {peak / 1000:>9.1f}\n")


@click.command("trace", epilog="""\b
Examples:
  sudo gpuwhy trace                          # every driver call, as it happens
  sudo gpuwhy trace --pid 4242 --summary     # one process, with a table at the end
  sudo gpuwhy trace --comm python --json --duration 10 > calls.jsonl
  sudo gpuwhy trace --device-glob '/tmp/fake-dev/nvidia*' --duration 5
""")
@click.option("--pid", type=int, default=0, help="Only this process (its tgid).")
@click.option("--comm", help="Only processes whose name (comm) is this.")
@click.option("--device-glob", help="Device files to trace [probes.device_glob].")
@click.option("--duration", type=float, help="Stop after this many seconds.")
@click.option("--summary", is_flag=True, help="Print a per-process table at the end.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per call.")
@click.pass_obj
def trace(ctx: Any, pid: int, comm: str | None, device_glob: str | None,
          duration: float | None, summary: bool, as_json: bool) -> None:
    """Trace decoded NVIDIA driver calls live (needs root; works without `gpuwhy up`).

    Each line is one ioctl on a tracked device fd: the driver's name for it, its latency,
    the syscall return and the RM status inside the struct, and the arguments that matter
    (RM class of an alloc, control command, bytes, the driver version string).

    \b
    Example:
      sudo gpuwhy trace --pid 4242 --summary
    """
    from gpuwhy.probes.fdtrack import FdTrackProbe

    config = ctx.config(**{"probes.device_glob": device_glob})
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    out = sys.stdout
    table = Summary()
    started_ns = time.time_ns()

    def on_event(event: Event) -> None:
        if not isinstance(event, DriverCall):
            return
        seen = probe.table.processes.get(event.process.pid)
        name = seen.comm if seen is not None else ""
        if comm and name != comm:
            return
        if summary:
            table.add(event, name)
        if as_json:
            out.write(json.dumps(call_json(event, name)) + "\n")
        elif not summary:
            out.write(call_line(event, name, started_ns) + "\n")
        out.flush()

    probe = FdTrackProbe(config, on_event, trace=True, pid=pid)
    try:
        probe.load()
    except GpuwhyError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Tracing driver calls on {probe.device_glob}... Hit Ctrl-C to end.", err=True)
    if not as_json and not summary:
        out.write(HEADER + "\n")
        out.flush()
    deadline = time.monotonic() + duration if duration else None
    try:
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            probe.poll(100)
        probe.poll(0)
        lost = probe.counters()["dropped_ringbuf_full"]
    finally:
        probe.close()
    if summary:
        table.print(out)
    if lost:
        click.echo(f"lost {lost} call records (ring buffer full)", err=True)
