"""Parse NVIDIA kernel-log lines (Xid, SXid, fallen off the bus, adapter init, UUID, GSP,
driver load) into records. Pure and fast: no I/O, no clocks.

Any prefix is accepted because patterns are searched, not anchored: raw ``/dev/kmsg``
records (``prio,seq,usec,flags;text``), journald ``MESSAGE`` with the ``NVRM:``
prefix split off, dmesg (``[ 123.4]``, ``-T``, ``--decode``), syslog/kern.log and
ftrace lines. Formats follow open-gpu-kernel-modules ``kernel_rc.c`` (515..595),
``osinit.c``, ``osapi.c``, ``kernel_gsp.c`` and ``nvswitch``; the ``'<unknown>'``
pid/name defaults of 515..565 become None. Names and messages come from the kernel but
name a process (``current->comm``): bounded here, escaped wherever shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuwhy.events import KernelLogFacts
from gpuwhy.identity import normalize_pci

MAX_LINE = 8192
MAX_MESSAGE = 2048
MAX_NAME = 64

_ADDR = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_PREFILTER = re.compile(r"Xid|NVRM|GPU|fallen off")
_XID = re.compile(
    rf"(?<!\w)Xid \((?:PCI:)?(?P<pci>{_ADDR})(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\)"
    r": (?P<code>\d+)(?P<rest>.*)$")
_XID_REST = re.compile(
    r",(?: pid=(?P<pid>'<unknown>'|<unknown>|<n/a>|\d+),)?(?: name=(?P<name>[^,]*),)?"
    r" ?(?P<msg>.*)$")
_SXID = re.compile(rf"(?:nvidia-nvswitch(?P<sw>\d+): )?(?<!\w)SXid \((?:PCI:)?(?P<pci>{_ADDR})\)"
                   r": (?P<code>\d+),? ?(?P<msg>.*)$")
_UUID = re.compile(rf"(?<!\w)GPU at (?:PCI:)?(?P<pci>{_ADDR}): (?P<uuid>GPU-[0-9a-fA-F-]+)")
_FALLEN = re.compile(rf"(?<!\w)GPU (?:at )?(?:PCI:)?(?P<pci>{_ADDR}):? (?:GPU )?has fallen off "
                     r"the bus")
_FALLEN_MERGED = re.compile(rf"(?s)The NVIDIA GPU (?P<pci>{_ADDR})\s.*?\(PCI ID: (?P<id>[0-9a-fA-F"
                            r"]{4}:[0-9a-fA-F]{4})\).*?fallen off the bus and is not responding")
_FALLEN_HEAD = re.compile(rf"The NVIDIA GPU (?P<pci>{_ADDR})\s*$")
_FALLEN_MID = re.compile(r"\(PCI ID: (?P<id>[0-9a-fA-F]{4}:[0-9a-fA-F]{4})\) installed in this "
                         r"system has\s*$")
_FALLEN_TAIL = re.compile(r"fallen off the bus and is not responding to commands")
_RM_INIT = re.compile(rf"(?<!\w)GPU (?P<pci>{_ADDR}): RmInitAdapter failed! \((?P<init>0x[0-9a-f"
                      r"A-F]+):(?P<rm>0x[0-9a-fA-F]+):(?P<line>\d+)\)")
_RM_INIT_MINOR = re.compile(rf"(?<!\w)GPU (?P<pci>{_ADDR}): rm_init_adapter failed, device minor"
                            r" number (?P<minor>\d+)")
_DRIVER = re.compile(r"(?:^|NVRM: |[\s;\]])loading (?P<module>NVIDIA UNIX .*?)\s+"
                     r"(?P<version>\d{3}\.\d+(?:\.\d+)?)\s")
_SERIAL = re.compile(r"(?<!\w)GPU Board Serial Number: (?P<serial>[\w-]+)")
_SERIAL_AT = re.compile(rf"(?<!\w)GPU (?P<pci>{_ADDR}): GPU serial number is (?P<serial>[\w-]+)")
_GSP_BANNER = re.compile(r"(?<!\w)GPU(?P<gpu>\d+) _kgspLogRpcTimeout: \**\s*GSP Timeout")
_GSP_RATE = re.compile(rf"Rate limiting GSP RPC error prints for GPU at (?:PCI:)?(?P<pci>{_ADDR})"
                       r" \(printing 1 of every (?P<every>\d+)\)")
_GSP_RPC_FAILED = re.compile(r"(?<!\w)rpcRmApi(?P<op>\w+)_GSP: (?P<msg>GspRm\w+ failed: .*)$")
_KEY_VALUE = re.compile(r"(\w+)=(0x[0-9a-fA-F]+|\d+)")

_GSP_TIMEOUT = re.compile(
    r"Timeout (?:after (?P<secs>\d+)s of waiting for RPC response from GPU(?P<gpu>\d+) GSP"
    r"|waiting for RPC from GSP(?P<gsp>\d+))! Expected function (?P<fn>\d+) \((?P<fnname>\w+)\)"
    r"(?: sequence (?P<seq>\d+))?(?: \((?P<d0>0x[0-9a-fA-F]+) (?P<d1>0x[0-9a-fA-F]+)\))?")
_RECOVERY = re.compile(r"GPU recovery action changed from (?P<old>0x[0-9a-fA-F]+) "
                       r"\((?P<oldname>[^)]*)\) to (?P<new>0x[0-9a-fA-F]+) \((?P<newname>[^)]*)\)")
_CONTAINED = re.compile(r"(?P<kind>Contained|Uncontained): (?P<unit>[^(.]+?)(?: \([^)]*\))?\."
                        r"(?: physAddr: (?P<pa>0x[0-9a-fA-F]+))? RST: (?P<rst>Yes|No), "
                        r"D-RST: (?P<drst>Yes|No)")
_NVLINK5 = re.compile(r"^(?P<sub>\w+) (?P<sev>Fatal|Nonfatal) XC(?P<xc>\d+) i(?P<inst>\d+) "
                      r"Link (?P<link>-?\d+)")
_CAUSED_BY = re.compile(r" caused by previous Xid (?P<root>\d+)\s*$")
_PHYS_ADDR = re.compile(r"physAddr (?P<pa>0x[0-9a-fA-F]+)")
_NVLINK_LINK = re.compile(r"NVLink: .*? on link (?P<link>\d+)")
_SXID_LINK = re.compile(r"(?:^|, )(?P<sev>Fatal|Non-fatal|Correctable), Link (?P<link>\d+)")


@dataclass(frozen=True)
class KernelRecord(KernelLogFacts):
    """One recognised kernel-log fact. ``kind``: ``xid``, ``sxid``, ``fallen_off_bus``,
    ``rm_init_failed``, ``gpu_uuid``, ``gpu_serial``, ``driver_loaded``, ``gsp_timeout``,
    ``gsp_rate_limited`` or ``gsp_rpc_failed``; the facts are those of :class:`KernelLogFacts`."""

    kind: str


def _pci(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        return normalize_pci(text)
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def _bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    return text.strip()[:limit]


def _xid_details(code: int, message: str) -> dict[str, str | int | bool]:
    details: dict[str, str | int | bool] = {}
    if match := _CAUSED_BY.search(message):
        details["root_cause_xid"] = int(match["root"])
    if match := _GSP_TIMEOUT.search(message):
        details["gsp_function"] = int(match["fn"])
        details["gsp_function_name"] = match["fnname"]
        if match["secs"]:
            details["timeout_s"] = int(match["secs"])
        if match["seq"]:
            details["sequence"] = int(match["seq"])
        if match["d0"]:
            details["data0"], details["data1"] = match["d0"], match["d1"]
    if match := _RECOVERY.search(message):
        details.update(recovery_from=match["oldname"], recovery_to=match["newname"],
                       recovery_from_code=int(match["old"], 16),
                       recovery_to_code=int(match["new"], 16))
    if match := _CONTAINED.search(message):
        details.update(contained=match["kind"] == "Contained", unit=match["unit"].strip(),
                       reset_required=match["rst"] == "Yes",
                       drain_and_reset_required=match["drst"] == "Yes")
        if match["pa"]:
            details["phys_addr"] = match["pa"]
    if 144 <= code <= 150 and (match := _NVLINK5.search(message)):
        details.update(subcode=match["sub"], fatal=match["sev"] == "Fatal",
                       link=int(match["link"]))
    if code == 48 and (match := _PHYS_ADDR.search(message)):
        details["phys_addr"] = match["pa"]
    if code == 74 and (match := _NVLINK_LINK.search(message)):
        details["link"] = int(match["link"])
    return details


def _parse_xid(match: re.Match[str]) -> KernelRecord:
    code = int(match["code"])
    rest = _XID_REST.match(match["rest"])
    pid = name = None
    message = match["rest"].lstrip(", ")
    if rest:
        pid = _int(rest["pid"])
        name = rest["name"]
        if name is not None and name in ("<unknown>", "'<unknown>'", ""):
            name = None
        message = rest["msg"]
    message = _bounded(message)
    return KernelRecord("xid", message=message, xid=code, pci=_pci(match["pci"]), pid=pid,
                        name=name[:MAX_NAME] if name else None,
                        gpu_instance=_int(match["gi"]), compute_instance=_int(match["ci"]),
                        details=_xid_details(code, message))


def _parse_sxid(match: re.Match[str]) -> KernelRecord:
    message = _bounded(match["msg"])
    details: dict[str, str | int | bool] = {}
    if match["sw"]:
        details["switch"] = int(match["sw"])
    if link := _SXID_LINK.search(message):
        details.update(fatal=link["sev"] == "Fatal", severity=link["sev"].lower(),
                       link=int(link["link"]))
    return KernelRecord("sxid", message=message, sxid=int(match["code"]), pci=_pci(match["pci"]),
                        details=details)


def parse_line(line: str) -> KernelRecord | None:
    """The record in one kernel-log line, or None. Never raises on any text.

    >>> parse_line("NVRM: Xid (PCI:0000:0A:00): 79, pid=1234, name=python, GPU has "
    ...            "fallen off the bus.").pci
    '0000:0a:00'
    """
    line = line[:MAX_LINE]
    if not _PREFILTER.search(line):
        return None
    if match := _XID.search(line):
        return _parse_xid(match)
    if match := _SXID.search(line):
        return _parse_sxid(match)
    if match := _UUID.search(line):
        uuid = "GPU-" + match["uuid"][4:].lower()
        return KernelRecord("gpu_uuid", message=uuid, pci=_pci(match["pci"]), uuid=uuid)
    if match := _FALLEN.search(line) or _FALLEN_MERGED.search(line):
        details = {"pci_id": match["id"].lower()} if "id" in match.groupdict() else {}
        return KernelRecord("fallen_off_bus", message="GPU has fallen off the bus",
                            pci=_pci(match["pci"]), details=details)
    if match := _RM_INIT.search(line):
        return KernelRecord("rm_init_failed", message="RmInitAdapter failed",
                            pci=_pci(match["pci"]),
                            details={"init_status": match["init"], "rm_status": match["rm"],
                                     "source_line": int(match["line"])})
    if match := _RM_INIT_MINOR.search(line):
        return KernelRecord("rm_init_failed", message="rm_init_adapter failed",
                            pci=_pci(match["pci"]), details={"minor": int(match["minor"])})
    return _parse_other(line)


def _parse_other(line: str) -> KernelRecord | None:
    if match := _DRIVER.search(line):
        flavour = "open" if "Open Kernel Module" in match["module"] else "proprietary"
        return KernelRecord("driver_loaded", message=_bounded(match["module"]),
                            driver_version=match["version"], details={"flavour": flavour})
    if match := _SERIAL_AT.search(line):
        return KernelRecord("gpu_serial", message="", pci=_pci(match["pci"]),
                            details={"serial": match["serial"]})
    if match := _SERIAL.search(line):
        return KernelRecord("gpu_serial", message="", details={"serial": match["serial"]})
    if match := _GSP_BANNER.search(line):
        return KernelRecord("gsp_timeout", message="GSP Timeout",
                            details={"rm_gpu": int(match["gpu"])})
    if match := _GSP_RATE.search(line):
        return KernelRecord("gsp_rate_limited",
                            message="GSP RPC error prints rate-limited; the GPU likely needs "
                                    "to be reset", pci=_pci(match["pci"]),
                            details={"printing_one_of": int(match["every"])})
    if match := _GSP_RPC_FAILED.search(line):
        details: dict[str, str | int | bool] = {"operation": match["op"]}
        details.update({k: v for k, v in _KEY_VALUE.findall(match["msg"])[:12]})
        return KernelRecord("gsp_rpc_failed", message=_bounded(match["msg"]), details=details)
    return None


class KernelLogParser:
    """Line-by-line parser with the little state the log needs: the three-line
    fallen-off-the-bus report (``The NVIDIA GPU`` / ``(PCI ID: …)`` / ``fallen off the
    bus…``), and the board serial that follows a UUID line without naming the GPU.

    :meth:`feed` returns ``(lineno, record)`` pairs; ``lineno`` (1-based) is the line
    where the fact starts. :attr:`pending` is true while a multi-line report is open:
    a reader must not checkpoint past its first line then.
    """

    def __init__(self) -> None:
        self.lineno = 0
        self._head: tuple[int, str | None, str | None] | None = None   # lineno, pci, pci_id
        self._last_uuid_pci: str | None = None

    @property
    def pending(self) -> bool:
        return self._head is not None

    def feed(self, line: str) -> list[tuple[int, KernelRecord]]:
        self.lineno += 1
        if "\n" not in line and (match := _FALLEN_HEAD.search(line[:MAX_LINE])):
            self._head = (self.lineno, _pci(match["pci"]), None)
            return []
        if self._head is not None:
            head_lineno, pci, pci_id = self._head
            if pci_id is None and (match := _FALLEN_MID.search(line[:MAX_LINE])):
                self._head = (head_lineno, pci, match["id"].lower())
                return []
            self._head = None
            if _FALLEN_TAIL.search(line[:MAX_LINE]):
                details = {"pci_id": pci_id} if pci_id else {}
                return [(head_lineno, KernelRecord("fallen_off_bus",
                                                   message="GPU has fallen off the bus",
                                                   pci=pci, details=details))]
        record = parse_line(line)
        if record is None:
            return []
        if record.kind == "gpu_uuid":
            self._last_uuid_pci = record.pci
        elif record.kind == "gpu_serial" and record.pci is None and self._last_uuid_pci:
            record = KernelRecord("gpu_serial", message=record.message, pci=self._last_uuid_pci,
                                  details=record.details)
        return [(self.lineno, record)]
