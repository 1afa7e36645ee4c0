"""Parse NVIDIA kernel-log lines (Xid, SXid, fallen off the bus, adapter init, probe
failures, API mismatch, UUID, GSP, driver load) into records. Pure and fast: no I/O, no clocks.

Any prefix is accepted because patterns are searched, not anchored: raw ``/dev/kmsg``
records (``prio,seq,usec,flags;text``), journald ``MESSAGE`` with the ``NVRM:``
prefix split off, dmesg (``[ 123.4]``, ``-T``, ``--decode``), syslog/kern.log and
ftrace lines. Formats follow open-gpu-kernel-modules ``kernel_rc.c`` (515..595),
``osinit.c``, ``osapi.c``, ``kernel_gsp.c`` and ``nvswitch``; the ``'<unknown>'``
pid/name defaults of 515..565 become None. Names and messages come from the kernel but
name a process (``current->comm``): bounded here, escaped wherever shown.

Everything in a line is bounded before it is converted: the line (:data:`MAX_LINE`), each
decimal field (:data:`MAX_DIGITS`: far below Python's 4 300-digit ``int()`` limit, and
under 2**63 so SQLite and JSON take it), each hex field, identifiers (UUID, serial,
version) and free text. A line that names an NVIDIA fact but breaks a bound, or that the
parser fails on for any other reason, is an ``unparsed`` record whose ``details["reason"]``
says why: stored like any record, so its cursor moves past it and it is seen, not lost.
So is a driver line (``NVRM:``, ``nvidia-nvswitchN:``) that names an Xid or SXid in no
format the driver is known to print.
Patterns are ASCII (``\\d`` is ``[0-9]``: the kernel prints no other digits) and their gaps
are bounded, so no line costs more than a few milliseconds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from gpuwhy.events import KernelLogFacts
from gpuwhy.identity import normalize_pci

MAX_LINE = 8192          # characters of a line parsed; the rest is never looked at
MAX_MESSAGE = 2048
MAX_NAME = 64
MAX_DIGITS = 18          # a decimal field: < 2**63 (SQLite INTEGER, JSON), << int()'s limit
MAX_HEX = 16             # hex digits after 0x: a 64-bit register, status or address
MAX_TOKEN = 64           # UUID, serial, version, function and unit names
MAX_REASON = 200
UNPARSED = "unparsed"

# ASCII: \d is [0-9] and \w is [A-Za-z0-9_] (int() takes other digits, the kernel prints
# none). The codes' digit runs end in a look-ahead: without it, backtracking into a
# 5 000-digit run before a line end that never comes (a "\n" further on) cost 0.4 s a
# line. (Not possessive quantifiers: Python 3.11.2, Debian 12's, matches wrongly with them.)
_A = re.ASCII
_ADDR = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_PREFILTER = re.compile(r"Xid|NVRM|GPU|fallen off|probe ")
_XID = re.compile(
    rf"(?<!\w)Xid \((?:PCI:)?(?P<pci>{_ADDR})(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\)"
    r": (?P<code>\d+)(?!\d)(?P<rest>.*)$", _A)
_XID_REST = re.compile(
    r",(?: pid=(?P<pid>'<unknown>'|<unknown>|<n/a>|\d+),)?(?: name=(?P<name>[^,]*),)?"
    r" ?(?P<msg>.*)$", _A)
_SXID = re.compile(rf"(?:nvidia-nvswitch(?P<sw>\d+): )?(?<!\w)SXid \((?:PCI:)?(?P<pci>{_ADDR})\)"
                   r": (?P<code>\d+)(?!\d),? ?(?P<msg>.*)$", _A)
_UUID = re.compile(rf"(?<!\w)GPU at (?:PCI:)?(?P<pci>{_ADDR}): (?P<uuid>GPU-[0-9a-fA-F-]+)", _A)
_FALLEN = re.compile(rf"(?<!\w)GPU (?:at )?(?:PCI:)?(?P<pci>{_ADDR}):? (?:GPU )?has fallen off "
                     r"the bus", _A)
# The gaps are bounded (the real ones are ~10 and ~40 characters): unbounded lazy gaps
# made a line of repeated "The NVIDIA GPU 00:00 (PCI ID: 0000:0000) " cost 0.9 s.
_FALLEN_MERGED = re.compile(rf"(?s)The NVIDIA GPU (?P<pci>{_ADDR})\s.{{0,200}}?\(PCI ID: "
                            r"(?P<id>[0-9a-fA-F]{4}:[0-9a-fA-F]{4})\).{0,200}?fallen off the "
                            r"bus and is not responding", _A)
_FALLEN_HEAD = re.compile(rf"The NVIDIA GPU (?P<pci>{_ADDR})\s*$", _A)
_FALLEN_MID = re.compile(r"\(PCI ID: (?P<id>[0-9a-fA-F]{4}:[0-9a-fA-F]{4})\) installed in this "
                         r"system has\s*$", _A)
_FALLEN_TAIL = re.compile(r"fallen off the bus and is not responding to commands")
# Since ~R450 with the GPU named (NV_DEV_PRINTF); older drivers printed no address, and
# "rm_init_adapter failed for device bearing minor number N".
_RM_INIT = re.compile(rf"(?:(?<!\w)GPU (?P<pci>{_ADDR}): )?RmInitAdapter failed! \((?P<init>0x"
                      r"[0-9a-fA-F]+):(?P<rm>0x[0-9a-fA-F]+):(?P<line>\d+)\)", _A)
_RM_INIT_MINOR = re.compile(rf"(?:(?<!\w)GPU (?P<pci>{_ADDR}): )?rm_init_adapter failed(?:,| for)"
                            r" device (?:bearing )?minor number (?P<minor>\d+)(?!\d)", _A)
# What separates the lines of one printk once they are one text: a newline (journald), the
# escaped one of /dev/kmsg ("\x0a") or of rsyslog ("#012"), dmesg's indentation and each
# line's "NVRM:". Bounded, and its alternatives start differently: no backtracking.
_GAP = r"(?:[ \t\r\n]|\\x0a|#012|NVRM:){1,80}"
_END = r"(?=\s|\\x0a|#012|$)"
# API mismatch (osapi.c RmPerformVersionCheck, nv.c): a client (libcuda, NVML) of another
# version than the loaded module. Printed as one printk of 4 lines ("the client has the
# version %s, but" / "this kernel module has the version %s.  Please" ...); by newer
# drivers (open-gpu-kernel-modules main, seen with R595) of 5 ("the client '%s' (pid %u)" /
# "has the version %s, but this kernel module has" / "the version %s.  Please make sure
# that this" ...). A text log splits them into lines, each half of which is recognised
# alone (KernelLogParser puts them back together).
_API_HEAD = re.compile(
    r"API mismatch: the client(?: '(?P<proc>[^\n]{0,64}?)')?(?: \(pid (?P<pid>\d+)\))?"
    rf"(?:{_GAP}has the version (?P<client>[^\s,']+),{_GAP}but(?:{_GAP}this kernel module has"
    rf"{_GAP}the version (?P<kernel>\S+?)\.{_END})?)?", _A)
_API_CLIENT = re.compile(
    rf"(?<!\w)has the version (?P<client>[^\s,']+),{_GAP}but(?:{_GAP}this kernel module has"
    rf"(?:{_GAP}the version (?P<kernel>\S+?)\.{_END})?)?", _A)
_API_KERNEL = re.compile(rf"(?<!\w)this kernel module has{_GAP}the version (?P<kernel>\S+?)\."
                         rf"{_END}", _A)
_API_KERNEL_NEW = re.compile(rf"(?<!\w)the version (?P<kernel>\S+?)\.{_GAP}Please make sure "
                             rf"that this{_END}", _A)
# A GPU the driver does not take at probe time (nv.c nv_pci_probe / osapi.c): one printk of
# two or three lines, "The NVIDIA GPU %s (PCI ID: %04x:%04x)" then "installed in this system
# is not supported by ..." / "requires use of the NVIDIA open kernel modules." (line breaks
# vary between releases). _GPU_HEAD is its first line alone.
_PCI_ID = r"\(PCI ID: (?P<id>[0-9a-fA-F]{4}:[0-9a-fA-F]{4})\)"
_UNSUPPORTED = re.compile(
    rf"The NVIDIA GPU (?P<pci>{_ADDR}){_GAP}{_PCI_ID}{_GAP}installed in this system{_GAP}"
    r"(?:(?P<open>requires use of the NVIDIA open kernel modules)"
    rf"|is not supported by{_GAP}(?P<by>open nvidia\.ko|the(?:{_GAP}(?:NVIDIA )?"
    r"(?P<version>\d{1,4}\.\d{1,4}(?:\.\d{1,4})?)(?!\d))?))", _A)
_GPU_HEAD = re.compile(rf"The NVIDIA GPU (?P<pci>{_ADDR}) {_PCI_ID}(?: installed in this "
                       r"system)?\s*$", _A)
# The kernel's driver core when nvidia.ko's probe returns an error (drivers/base/dd.c:
# "%s: probe of %s failed with error %d"; since Linux 6.x "probe with driver %s failed ...").
_PROBE = re.compile(rf"(?:(?<![\w-])nvidia|NVRM): probe of (?P<pci>{_ADDR}) failed with error "
                    r"(?P<error>-?\d+)(?!\d)", _A)
_PROBE_WITH = re.compile(rf"(?<![\w-])nvidia (?P<pci>{_ADDR}): probe with driver nvidia failed "
                         r"with error (?P<error>-?\d+)(?!\d)", _A)
_DRIVER = re.compile(r"(?:^|NVRM: |[\s;\]])loading (?P<module>NVIDIA UNIX .{0,200}?)\s+"
                     r"(?P<version>\d{3}\.\d+(?:\.\d+)?)\s", _A)
_SERIAL = re.compile(r"(?<!\w)GPU Board Serial Number: (?P<serial>[\w-]+)", _A)
_SERIAL_AT = re.compile(rf"(?<!\w)GPU (?P<pci>{_ADDR}): GPU serial number is (?P<serial>[\w-]+)",
                        _A)
_GSP_BANNER = re.compile(r"(?<!\w)GPU(?P<gpu>\d+) _kgspLogRpcTimeout: \**\s*GSP Timeout", _A)
_GSP_RATE = re.compile(rf"Rate limiting GSP RPC error prints for GPU at (?:PCI:)?(?P<pci>{_ADDR})"
                       r" \(printing 1 of every (?P<every>\d+)\)", _A)
_GSP_RPC_FAILED = re.compile(r"(?<!\w)rpcRmApi(?P<op>\w+)_GSP: (?P<msg>GspRm\w+ failed: .*)$", _A)
# Anchored at a word start, key and value bounded: "\w+=" tried at every offset of a long
# word was quadratic (0.6 s for an 8 KiB line); a value over its bound is left out whole.
_KEY_VALUE = re.compile(rf"(?<!\w)(\w{{1,{MAX_TOKEN}}})=(0x[0-9a-fA-F]{{1,{MAX_HEX}}}"
                        rf"|\d{{1,{MAX_DIGITS}}})(?!\w)", _A)

_GSP_TIMEOUT = re.compile(
    r"Timeout (?:after (?P<secs>\d+)s of waiting for RPC response from GPU(?P<gpu>\d+) GSP"
    r"|waiting for RPC from GSP(?P<gsp>\d+))! Expected function (?P<fn>\d+) \((?P<fnname>\w+)\)"
    r"(?: sequence (?P<seq>\d+))?(?: \((?P<d0>0x[0-9a-fA-F]+) (?P<d1>0x[0-9a-fA-F]+)\))?", _A)
_RECOVERY = re.compile(r"GPU recovery action changed from (?P<old>0x[0-9a-fA-F]+) "
                       r"\((?P<oldname>[^)]*)\) to (?P<new>0x[0-9a-fA-F]+) \((?P<newname>[^)]*)\)",
                       _A)
_CONTAINED = re.compile(r"(?P<kind>Contained|Uncontained): (?P<unit>[^(.]{1,200}?)"
                        r"(?: \([^)]*\))?\.(?: physAddr: (?P<pa>0x[0-9a-fA-F]+))? RST: "
                        r"(?P<rst>Yes|No), D-RST: (?P<drst>Yes|No)", _A)
_NVLINK5 = re.compile(r"^(?P<sub>\w+) (?P<sev>Fatal|Nonfatal) XC(?P<xc>\d+) i(?P<inst>\d+) "
                      r"Link (?P<link>-?\d+)(?: \((?P<intr>0x[0-9a-fA-F]+) "
                      r"(?P<status>0x[0-9a-fA-F]+))?", _A)
_CAUSED_BY = re.compile(r" caused by previous Xid (?P<root>\d+)\s*$", _A)
_PHYS_ADDR = re.compile(r"physAddr (?P<pa>0x[0-9a-fA-F]+)", _A)
_NVLINK_LINK = re.compile(r"NVLink: .{0,200}? on link (?P<link>\d+)", _A)
_SXID_LINK = re.compile(r"(?:^|, )(?P<sev>Fatal|Non-fatal|Correctable), Link (?P<link>\d+)", _A)


@dataclass(frozen=True)
class KernelRecord(KernelLogFacts):
    """One recognised kernel-log fact. ``kind``: ``xid``, ``sxid``, ``fallen_off_bus``,
    ``rm_init_failed``, ``probe_failed`` (the driver did not take a GPU at probe time: the
    driver core's error, or a GPU this driver does not support), ``api_mismatch`` (a client of
    another driver version than the loaded module: ``details`` ``client_version`` and
    ``kernel_version``, either missing when its half of the report was not seen),
    ``gpu_uuid``, ``gpu_serial``, ``driver_loaded``, ``gsp_timeout``, ``gsp_rate_limited`` or
    ``gsp_rpc_failed``; the facts are those of :class:`KernelLogFacts`.

    ``unparsed``: an NVIDIA line that could not be read (a field over its bound, or a
    parser failure); ``details["reason"]`` says why, ``details["parsed_as"]`` (when known)
    what it looked like, and no other fact is set: nothing of a line that lies is trusted.
    """

    kind: str


class Unparsable(ValueError):
    """A recognised line breaks a bound. Raised and caught inside this module only."""


def unparsed_record(reason: str, parsed_as: str | None = None) -> KernelRecord:
    """The record of a line that could not be parsed, with why (bounded: it may quote the
    line)."""
    reason = _bounded(reason, MAX_REASON) or "unknown"
    details: dict[str, str | int | bool] = {"reason": reason}
    what = "NVIDIA kernel-log line"
    if parsed_as:
        details["parsed_as"] = parsed_as
        what = f"{parsed_as} line"
    return KernelRecord(UNPARSED, message=f"{what} not parsed: {reason}", details=details)


def _pci(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        return normalize_pci(text)
    except ValueError:
        return None


def _int(text: str, field: str) -> int:
    """A decimal field, its length checked *before* int() (which raises past 4 300 digits
    and is quadratic below that)."""
    digits = text[1:] if text.startswith("-") else text
    if len(digits) > MAX_DIGITS:
        raise Unparsable(f"{field} has {len(digits)} digits (at most {MAX_DIGITS} are read)")
    if not (digits.isascii() and digits.isdigit()):
        raise Unparsable(f"{field} is not a decimal number")
    return int(text)


def _maybe_int(text: str | None, field: str) -> int | None:
    return None if text is None else _int(text, field)


def _hex(text: str, field: str) -> str:
    """A ``0x…`` field kept as text, its length checked."""
    if len(text) - 2 > MAX_HEX:
        raise Unparsable(f"{field} has {len(text) - 2} hex digits (at most {MAX_HEX} are read)")
    return text


def _hex_int(text: str, field: str) -> int:
    return int(_hex(text, field), 16)


def _token(text: str, field: str, limit: int = MAX_TOKEN) -> str:
    """An identifier (UUID, serial, version, name of a function): over its bound the line is
    not what it claims to be, so it is not cut down to look like one."""
    if len(text) > limit:
        raise Unparsable(f"{field} is {len(text)} characters long (at most {limit} are read)")
    return text


def _cut(text: str, limit: int) -> str:
    """Free text cut to ``limit``. A lone surrogate (only a reader that is not journald,
    kmsg or a file can hand one over) becomes "?": SQLite refuses it."""
    text = text[:limit]
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    return _cut(text.strip(), limit)


def _xid_details(code: int, message: str) -> dict[str, str | int | bool]:
    details: dict[str, str | int | bool] = {}
    if match := _CAUSED_BY.search(message):
        details["root_cause_xid"] = _int(match["root"], "the root-cause Xid")
    if match := _GSP_TIMEOUT.search(message):
        details["gsp_function"] = _int(match["fn"], "the GSP function")
        details["gsp_function_name"] = _token(match["fnname"], "the GSP function name")
        if match["secs"]:
            details["timeout_s"] = _int(match["secs"], "the GSP timeout")
        if match["seq"]:
            details["sequence"] = _int(match["seq"], "the GSP sequence")
        if match["d0"]:
            details["data0"] = _hex(match["d0"], "the GSP data")
            details["data1"] = _hex(match["d1"], "the GSP data")
    if match := _RECOVERY.search(message):
        details.update(recovery_from=_bounded(match["oldname"], MAX_TOKEN),
                       recovery_to=_bounded(match["newname"], MAX_TOKEN),
                       recovery_from_code=_hex_int(match["old"], "the recovery action"),
                       recovery_to_code=_hex_int(match["new"], "the recovery action"))
    if match := _CONTAINED.search(message):
        details.update(contained=match["kind"] == "Contained",
                       unit=_bounded(match["unit"], MAX_TOKEN),
                       reset_required=match["rst"] == "Yes",
                       drain_and_reset_required=match["drst"] == "Yes")
        if match["pa"]:
            details["phys_addr"] = _hex(match["pa"], "physAddr")
    if 144 <= code <= 150 and (match := _NVLINK5.search(message)):
        details.update(subcode=_token(match["sub"], "the NVLink sub-code"),
                       fatal=match["sev"] == "Fatal", link=_int(match["link"], "the link"))
        if match["intr"]:   # NVIDIA's 144-150 decode reads these two words (gpuwhy.xid)
            details.update(intrinfo=_hex(match["intr"], "IntrInfo"),
                           error_status=_hex(match["status"], "the error status"))
    if code == 48 and (match := _PHYS_ADDR.search(message)):
        details["phys_addr"] = _hex(match["pa"], "physAddr")
    if code == 74 and (match := _NVLINK_LINK.search(message)):
        details["link"] = _int(match["link"], "the link")
    return details


def _parse_xid(match: re.Match[str]) -> KernelRecord:
    code = _int(match["code"], "the Xid code")
    rest = _XID_REST.match(match["rest"])
    pid = name = None
    message = match["rest"].lstrip(", ")
    if rest:
        if rest["pid"] and rest["pid"][0].isdigit():      # not '<unknown>' nor <n/a>
            pid = _int(rest["pid"], "pid")
        name = rest["name"]
        if name is not None and name in ("<unknown>", "'<unknown>'", ""):
            name = None
        message = rest["msg"]
    message = _bounded(message)
    return KernelRecord("xid", message=message, xid=code, pci=_pci(match["pci"]), pid=pid,
                        name=_cut(name, MAX_NAME) if name else None,
                        gpu_instance=_maybe_int(match["gi"], "the GPU instance"),
                        compute_instance=_maybe_int(match["ci"], "the compute instance"),
                        details=_xid_details(code, message))


def _parse_sxid(match: re.Match[str]) -> KernelRecord:
    message = _bounded(match["msg"])
    details: dict[str, str | int | bool] = {}
    if match["sw"]:
        details["switch"] = _int(match["sw"], "the NVSwitch number")
    if link := _SXID_LINK.search(message):
        details.update(fatal=link["sev"] == "Fatal", severity=link["sev"].lower(),
                       link=_int(link["link"], "the link"))
    return KernelRecord("sxid", message=message, sxid=_int(match["code"], "the SXid code"),
                        pci=_pci(match["pci"]), details=details)


def _parse_uuid(match: re.Match[str]) -> KernelRecord:
    uuid = "GPU-" + _token(match["uuid"], "the UUID")[4:].lower()
    return KernelRecord("gpu_uuid", message=uuid, pci=_pci(match["pci"]), uuid=uuid)


def _parse_fallen(match: re.Match[str]) -> KernelRecord:
    details = {"pci_id": match["id"].lower()} if "id" in match.groupdict() else {}
    return KernelRecord("fallen_off_bus", message="GPU has fallen off the bus",
                        pci=_pci(match["pci"]), details=details)


def _parse_rm_init(match: re.Match[str]) -> KernelRecord:
    return KernelRecord("rm_init_failed", message="RmInitAdapter failed", pci=_pci(match["pci"]),
                        details={"init_status": _hex(match["init"], "the init status"),
                                 "rm_status": _hex(match["rm"], "the RM status"),
                                 "source_line": _int(match["line"], "the source line")})


def _parse_rm_init_minor(match: re.Match[str]) -> KernelRecord:
    return KernelRecord("rm_init_failed", message="rm_init_adapter failed",
                        pci=_pci(match["pci"]),
                        details={"minor": _int(match["minor"], "the device minor")})


def api_record(client: str | None, kernel: str | None, name: str | None = None,
               pid: int | None = None) -> KernelRecord:
    """The ``api_mismatch`` record of the versions read (each already bounded)."""
    details: dict[str, str | int | bool] = {}
    if client is not None:
        details["client_version"] = client
    if kernel is not None:
        details["kernel_version"] = kernel
    message = _bounded(f"API mismatch: client version {client or '(not read)'}, kernel module "
                       f"version {kernel or '(not read)'}")
    return KernelRecord("api_mismatch", message=message, pid=pid, name=name,
                        driver_version=kernel, details=details)


def _parse_api_mismatch(match: re.Match[str]) -> KernelRecord:
    found = match.groupdict()
    client, kernel, name = found.get("client"), found.get("kernel"), found.get("proc")
    return api_record(_token(client, "the client version") if client else None,
                      _token(kernel, "the kernel module version") if kernel else None,
                      _cut(name, MAX_NAME) if name else None,
                      _maybe_int(found.get("pid"), "pid"))


def _parse_unsupported(match: re.Match[str]) -> KernelRecord:
    details: dict[str, str | int | bool] = {"pci_id": match["id"].lower()}
    if match["open"]:
        details["reason"] = "needs_open_kernel_modules"
        message = "the GPU requires the NVIDIA open kernel modules"
    elif match["by"] == "open nvidia.ko":
        details["reason"] = "not_supported_by_open_kernel_modules"
        message = "the GPU is not supported by the open kernel modules (it has no GSP)"
    else:
        details["reason"] = "not_supported_by_driver"
        message = "the GPU is not supported by this driver release"
    version = match["version"]
    return KernelRecord("probe_failed", message=message, pci=_pci(match["pci"]),
                        driver_version=_token(version, "the driver version") if version else None,
                        details=details)


def _parse_probe(match: re.Match[str]) -> KernelRecord:
    error = _int(match["error"], "the probe error")
    return KernelRecord("probe_failed", message=f"the driver's probe of the GPU failed "
                        f"(error {error})", pci=_pci(match["pci"]),
                        details={"reason": "probe_error", "error": error})


def _parse_driver(match: re.Match[str]) -> KernelRecord:
    flavour = "open" if "Open Kernel Module" in match["module"] else "proprietary"
    return KernelRecord("driver_loaded", message=_bounded(match["module"]),
                        driver_version=_token(match["version"], "the driver version"),
                        details={"flavour": flavour})


def _parse_serial(match: re.Match[str]) -> KernelRecord:
    pci = _pci(match["pci"]) if "pci" in match.groupdict() else None
    return KernelRecord("gpu_serial", message="", pci=pci,
                        details={"serial": _token(match["serial"], "the serial number")})


def _parse_gsp_banner(match: re.Match[str]) -> KernelRecord:
    return KernelRecord("gsp_timeout", message="GSP Timeout",
                        details={"rm_gpu": _int(match["gpu"], "the GPU number")})


def _parse_gsp_rate(match: re.Match[str]) -> KernelRecord:
    return KernelRecord("gsp_rate_limited",
                        message="GSP RPC error prints rate-limited; the GPU likely needs "
                                "to be reset", pci=_pci(match["pci"]),
                        details={"printing_one_of": _int(match["every"], "the rate")})


def _parse_gsp_rpc_failed(match: re.Match[str]) -> KernelRecord:
    message = _bounded(match["msg"])
    details: dict[str, str | int | bool] = {"operation": _token(match["op"], "the operation")}
    details.update({k: v for k, v in _KEY_VALUE.findall(message)[:12]})
    return KernelRecord("gsp_rpc_failed", message=message, details=details)


# Tried in this order; the first pattern found decides what the line is. Each is tried only
# when its literal is in the line: ``in`` is a fast C search, while a pattern that starts
# with a look-behind or an alternation is tried at every offset of an 8 KiB line.
_Builder = Callable[[re.Match[str]], KernelRecord]
_RULES: tuple[tuple[str, str, re.Pattern[str], _Builder], ...] = (
    ("xid", "Xid (", _XID, _parse_xid),
    ("sxid", "SXid (", _SXID, _parse_sxid),
    ("gpu_uuid", "GPU at ", _UUID, _parse_uuid),
    ("fallen_off_bus", " has fallen off the bus", _FALLEN, _parse_fallen),
    ("fallen_off_bus", "The NVIDIA GPU ", _FALLEN_MERGED, _parse_fallen),
    ("probe_failed", "The NVIDIA GPU ", _UNSUPPORTED, _parse_unsupported),
    ("rm_init_failed", "RmInitAdapter failed! (", _RM_INIT, _parse_rm_init),
    ("rm_init_failed", "rm_init_adapter failed", _RM_INIT_MINOR, _parse_rm_init_minor),
    ("probe_failed", "probe of ", _PROBE, _parse_probe),
    ("probe_failed", ": probe with driver nvidia ", _PROBE_WITH, _parse_probe),
    ("api_mismatch", "API mismatch: the client", _API_HEAD, _parse_api_mismatch),
    ("api_mismatch", "has the version ", _API_CLIENT, _parse_api_mismatch),
    ("api_mismatch", "this kernel module has", _API_KERNEL, _parse_api_mismatch),
    ("api_mismatch", "Please make sure that this", _API_KERNEL_NEW, _parse_api_mismatch),
    ("driver_loaded", "loading NVIDIA UNIX ", _DRIVER, _parse_driver),
    ("gpu_serial", ": GPU serial number is ", _SERIAL_AT, _parse_serial),
    ("gpu_serial", "GPU Board Serial Number: ", _SERIAL, _parse_serial),
    ("gsp_timeout", " _kgspLogRpcTimeout: ", _GSP_BANNER, _parse_gsp_banner),
    ("gsp_rate_limited", "Rate limiting GSP RPC ", _GSP_RATE, _parse_gsp_rate),
    ("gsp_rpc_failed", "rpcRmApi", _GSP_RPC_FAILED, _parse_gsp_rpc_failed),
)


# A driver line that says Xid or SXid but in no form the driver prints: kept (unparsed, with
# why), not dropped, since it may be a driver this parser does not know yet.
_DRIVER_LINE = re.compile(r"(?<![\w-])(?:NVRM|nvidia-nvswitch\d{0,4}):")
_CODE_WORD = re.compile(r"(?<!\w)(?P<word>S?Xid) \(", _A)


def parse_line(line: str) -> KernelRecord | None:
    """The record in one kernel-log line, or None. Never raises on any text: a line that
    breaks a bound, or that the parser fails on, is an ``unparsed`` record with its reason.

    >>> parse_line("NVRM: Xid (PCI:0000:0A:00): 79, pid=1234, name=python, GPU has "
    ...            "fallen off the bus.").pci
    '0000:0a:00'
    >>> parse_line("NVRM: Xid (PCI:0000:0A:00): 79, pid=" + "9" * 5000 + ", name=x, y"
    ...            ).details["reason"]
    'pid has 5000 digits (at most 18 are read)'
    """
    try:
        line = line[:MAX_LINE]
        if not _PREFILTER.search(line):
            return None
        for kind, literal, pattern, build in _RULES:
            if literal in line and (match := pattern.search(line)):
                try:
                    return build(match)
                except Unparsable as exc:
                    return unparsed_record(str(exc), kind)
        if "Xid (" in line and (code := _CODE_WORD.search(line)) and \
                _DRIVER_LINE.search(line, 0, code.start()):
            return unparsed_record(f"a driver line naming an {code['word']} in no known "
                                   f"format", code["word"].lower())
        return None
    except Exception as exc:  # noqa: BLE001 - a parser bug must cost one line, not the source
        return unparsed_record(_failure(exc))


def _failure(exc: Exception) -> str:
    return f"parser error: {type(exc).__name__}: {exc}"


# A report split over lines is taken for this many lines at most (API mismatch: 5).
MAX_REPORT_LINES = 5
_PROBE_REPORT_LINES = 3


@dataclass
class _Report:
    """A multi-line report being read: ``kind`` ``api_mismatch`` (its lines' records, merged)
    or ``probe_failed`` (a GPU named at probe time: the text after each line's ``NVRM:``)."""

    lineno: int
    kind: str
    parts: list[KernelRecord]
    text: str = ""
    lines: int = 1


def merge_api(parts: list[KernelRecord]) -> KernelRecord:
    """One ``api_mismatch`` record of the records of a report's lines: each fact from the
    first line that gives it."""
    def first(get):  # noqa: ANN001, ANN202
        return next((value for part in parts if (value := get(part)) is not None), None)
    return api_record(first(lambda r: r.details.get("client_version")),
                      first(lambda r: r.details.get("kernel_version")),
                      first(lambda r: r.name), first(lambda r: r.pid))


class KernelLogParser:
    """Line-by-line parser with the little state the log needs: the multi-line reports a
    text log splits into lines (fallen off the bus: ``The NVIDIA GPU`` / ``(PCI ID: …)`` /
    ``fallen off the bus…``; a GPU refused at probe time: ``The NVIDIA GPU … (PCI ID: …)`` /
    ``installed in this system is not supported by …``; API mismatch: four or five lines,
    each half recognised alone), and the board serial that follows a UUID line without
    naming the GPU.

    :meth:`feed` returns ``(lineno, record)`` pairs; ``lineno`` (1-based) is the line
    where the fact starts. :attr:`pending` is true while a multi-line report is open:
    a reader must not checkpoint past its first line then; :meth:`flush` (at the end of an
    input) gives what an open report already says. :meth:`feed` never raises: a line it
    fails on is an ``unparsed`` record, and any open report is dropped.
    """

    def __init__(self) -> None:
        self.lineno = 0
        self._head: tuple[int, str | None, str | None] | None = None   # lineno, pci, pci_id
        self._report: _Report | None = None
        self._last_uuid_pci: str | None = None

    @property
    def pending(self) -> bool:
        return self._head is not None or self._report is not None

    def feed(self, line: str) -> list[tuple[int, KernelRecord]]:
        self.lineno += 1
        try:
            return self._feed(line[:MAX_LINE])
        except Exception as exc:  # noqa: BLE001 - see parse_line
            self._head = self._report = None
            return [(self.lineno, unparsed_record(_failure(exc)))]

    def flush(self) -> list[tuple[int, KernelRecord]]:
        """The end of the input: an open API-mismatch report gives what its lines said; an
        unfinished probe or fallen-off-the-bus report gives nothing (its first line alone
        is no failure)."""
        self._head = None
        try:
            return self._close_report()
        except Exception as exc:  # noqa: BLE001 - see parse_line
            self._report = None
            return [(self.lineno, unparsed_record(_failure(exc)))]

    def _feed(self, line: str) -> list[tuple[int, KernelRecord]]:
        if self._report is not None:
            taken, records = self._report_line(line)
            if taken:
                return records
            return self._close_report() + self._line(line)
        return self._line(line)

    def _line(self, line: str) -> list[tuple[int, KernelRecord]]:
        if "\n" not in line and (match := _FALLEN_HEAD.search(line)):
            self._head = (self.lineno, _pci(match["pci"]), None)
            return []
        if self._head is not None:
            head_lineno, pci, pci_id = self._head
            if pci_id is None and (match := _FALLEN_MID.search(line)):
                self._head = (head_lineno, pci, match["id"].lower())
                return []
            self._head = None
            if _FALLEN_TAIL.search(line):
                details = {"pci_id": pci_id} if pci_id else {}
                return [(head_lineno, KernelRecord("fallen_off_bus",
                                                   message="GPU has fallen off the bus",
                                                   pci=pci, details=details))]
        record = parse_line(line)
        if record is None:
            if "\n" not in line and _GPU_HEAD.search(line):
                self._report = _Report(self.lineno, "probe_failed", [], line)
            return []
        if record.kind == "api_mismatch" and "kernel_version" not in record.details:
            self._report = _Report(self.lineno, "api_mismatch", [record])   # more to come
            return []
        if record.kind == "gpu_uuid":
            self._last_uuid_pci = record.pci
        elif record.kind == "gpu_serial" and record.pci is None and self._last_uuid_pci:
            record = KernelRecord("gpu_serial", message=record.message, pci=self._last_uuid_pci,
                                  details=record.details)
        return [(self.lineno, record)]

    def _report_line(self, line: str) -> tuple[bool, list[tuple[int, KernelRecord]]]:
        """Whether ``line`` continues the open report, and the records it completes. A line
        that starts another report, or says something else, does not continue it."""
        report = self._report
        assert report is not None
        if "NVRM:" not in line or "API mismatch" in line or _FALLEN_HEAD.search(line) or \
                _GPU_HEAD.search(line):
            return False, []
        record = parse_line(line)
        if report.kind == "api_mismatch":
            if record is None or record.kind != "api_mismatch":
                return False, []
            report.parts.append(record)
            report.lines += 1
            merged = merge_api(report.parts)
            if "client_version" in merged.details and "kernel_version" in merged.details or \
                    report.lines >= MAX_REPORT_LINES:
                self._report = None
                return True, [(report.lineno, merged)]
            return True, []
        if record is not None:
            return False, []
        report.text += "\n" + line.split("NVRM:", 1)[1]
        report.lines += 1
        for kind, pattern, build in (("probe_failed", _UNSUPPORTED, _parse_unsupported),
                                     ("fallen_off_bus", _FALLEN_MERGED, _parse_fallen)):
            if match := pattern.search(report.text):
                self._report = None
                try:
                    return True, [(report.lineno, build(match))]
                except Unparsable as exc:
                    return True, [(report.lineno, unparsed_record(str(exc), kind))]
        if report.lines >= _PROBE_REPORT_LINES:
            self._report = None          # a GPU named, no failure said: nothing
        return True, []

    def _close_report(self) -> list[tuple[int, KernelRecord]]:
        report, self._report = self._report, None
        if report is None or report.kind != "api_mismatch":
            return []
        return [(report.lineno, merge_api(report.parts))]
