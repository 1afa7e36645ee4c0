"""`gpuwhy xid`: explain the NVIDIA lines of a kernel log (dmesg, journalctl -k, kern.log)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from typing import IO

import click

from gpuwhy.app.clitypes import InputFile
from gpuwhy.probes.klog.parse import MAX_LINE, KernelLogParser, KernelRecord
from gpuwhy.text import printable
from gpuwhy.xid import catalogue_fields

_JSON_FIELDS = ("kind", "xid", "sxid", "pci", "pid", "name", "gpu_instance",
                "compute_instance", "message", "uuid", "driver_version", "details")
# The rest of a line longer than MAX_LINE bytes is read past in pieces this big and
# dropped: the parser looks at no more, and a line without end must not fill memory.
_DRAIN_BYTES = 1 << 16


def record_json(lineno: int, record: KernelRecord) -> dict:
    """One recognised line as the JSON object `gpuwhy xid --json` prints."""
    body: dict = {"lineno": lineno}
    body.update({name: getattr(record, name) for name in _JSON_FIELDS})
    code = record.xid if record.kind == "xid" else record.sxid
    body.update(catalogue_fields(record.kind, code, record.details))
    return body


def _gpu(record: KernelRecord) -> str:
    where = f"GPU {record.pci}" if record.pci else "a GPU"
    if record.gpu_instance is not None:
        where += f" (MIG GPU instance {record.gpu_instance}"
        if record.compute_instance is not None:
            where += f", compute instance {record.compute_instance}"
        where += ")"
    return where


def _process(record: KernelRecord) -> str:
    if record.pid is None and record.name is None:
        return ""
    parts = [f"process '{printable(record.name)}'" if record.name else "a process",
             f"pid {record.pid}" if record.pid is not None else "pid unknown"]
    return f", {', '.join(parts)}"


def _needs(fields: dict) -> str:
    if fields.get("reboot"):
        return " Recovery: reboot the node."
    if fields.get("gpu_reset"):
        return " Recovery: reset the GPU."
    return ""


_PLAIN = {
    "fallen_off_bus": "{gpu} has fallen off the bus: it no longer answers the CPU.",
    "rm_init_failed": "The driver could not initialise {gpu} ({message}); the GPU is not "
                      "usable until this is fixed.",
    "probe_failed": "The driver did not take {gpu} when it probed it ({message}); the GPU "
                    "is not usable until this is fixed.",
    "api_mismatch": "{client} has the user-space driver version {client_version}, but the "
                    "loaded kernel module is version {kernel_version}: CUDA and NVML clients "
                    "fail until the two match (reload the kernel module or reboot).",
    "gpu_uuid": "{gpu} is {uuid} (the driver names a GPU this way before its first Xid).",
    "gpu_serial": "{gpu} has board serial number {serial}.",
    "driver_loaded": "NVIDIA driver {driver_version} loaded ({flavour} kernel module).",
    "gsp_timeout": "The GSP firmware of RM GPU {rm_gpu} stopped answering (GSP timeout "
                   "banner; Xid 119 lines follow).",
    "gsp_rate_limited": "So many GSP errors on {gpu} that the driver now prints only some: "
                        "the GPU likely needs a reset.",
    "gsp_rpc_failed": "A driver call forwarded to the GSP firmware failed: {message}.",
    "unparsed": "{what} that could not be parsed, skipped: {reason}.",
}


def explain(lineno: int, record: KernelRecord) -> str:
    """A plain-words explanation of one recognised line."""
    fields = record_json(lineno, record)
    if record.kind in ("xid", "sxid"):
        label = f"Xid {record.xid}" if record.kind == "xid" else f"SXid {record.sxid} " \
            f"(NVSwitch {record.details.get('switch', '?')})"
        head = (f"line {lineno}: {label} on {_gpu(record)}{_process(record)}: "
                f"{fields['title']} [{fields['severity']}, likely {fields['origin']}].")
        body = f"  {fields['action']}{_needs(fields)}"
        if record.kind == "xid" and record.xid == 154 and "recovery_to" in record.details:
            body += f" The driver now asks for: {printable(str(record.details['recovery_to']))}."
        if "root_cause_xid" in record.details:
            body += f" Caused by an earlier Xid {record.details['root_cause_xid']}."
        return f"{head}\n{body}\n  message: {printable(record.message)}"
    values = {**{k: printable(str(v)) for k, v in record.details.items()},
              "gpu": _gpu(record), "uuid": record.uuid, "message": printable(record.message),
              "driver_version": record.driver_version}
    if record.kind == "api_mismatch":
        values["client"] = "A driver client"
        if record.name or record.pid is not None:
            values["client"] = f"Process '{printable(record.name or '?')}' (pid " \
                f"{record.pid if record.pid is not None else 'unknown'})"
    if record.kind == "unparsed":
        kind = record.details.get("parsed_as")
        values["what"] = f"an NVIDIA {printable(str(kind))} line" if kind else "an NVIDIA line"
    text = _PLAIN[record.kind].format_map(_Missing(values))
    if record.kind == "fallen_off_bus":
        text += f"{_needs(fields)} {fields['action']}"
    return f"line {lineno}: {text}"


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def scan(lines: Iterable[str]) -> Iterator[tuple[int, KernelRecord]]:
    """Every recognised record of a stream of lines, with its 1-based line number."""
    parser = KernelLogParser()
    for line in lines:
        yield from parser.feed(line.rstrip("\r\n"))
    yield from parser.flush()


def _read_lines(stream: IO[bytes]) -> Iterator[str]:
    """Each line's first MAX_LINE bytes, decoded (bytes that are not UTF-8 replaced); a read
    error is one clear error naming the input."""
    name = getattr(stream, "name", "-")
    try:
        while raw := stream.readline(MAX_LINE):
            if len(raw) == MAX_LINE and not raw.endswith(b"\n"):
                while (more := stream.readline(_DRAIN_BYTES)) and not more.endswith(b"\n"):
                    pass
            yield raw.decode("utf-8", errors="replace")
    except OSError as exc:
        where = "standard input" if name in ("-", "<stdin>") else name
        raise click.ClickException(f"cannot read {where}: {exc.strerror or exc}") from None


@click.command()
@click.argument("files", nargs=-1, type=InputFile(opened=True, allow_dash=True))
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object per recognised line (lineno, kind, xid/sxid, pci, pid, "
                   "name, gpu_instance, compute_instance, message, catalogue fields).")
def xid(files: tuple[IO[bytes], ...], as_json: bool) -> None:
    """Explain the NVIDIA lines (Xid, SXid, fallen off the bus, ...) of a kernel log.

    Reads FILES, or standard input when none is given. Lines it does not recognise are
    skipped silently; an NVIDIA line it cannot parse (a number of thousands of digits, an
    over-long UUID) is reported as such, with why. Only the first 8192 bytes of a line are
    read; line numbers count across all inputs.

    \b
    Examples:
      dmesg | gpuwhy xid
      journalctl -k -b -1 | gpuwhy xid --json | jq 'select(.gpu_reset)'
      gpuwhy xid /var/log/kern.log
    """
    streams = files or (click.open_file("-", "rb"),)
    lines = (line for stream in streams for line in _read_lines(stream))
    try:
        for lineno, record in scan(lines):
            if as_json:
                click.echo(json.dumps(record_json(lineno, record), ensure_ascii=True))
            else:
                click.echo(explain(lineno, record))
    except BrokenPipeError:
        # the reader left (`gpuwhy xid | head`): stop quietly, as cat does; the interpreter
        # would otherwise fail once more flushing stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
