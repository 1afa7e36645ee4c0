"""Which Linux capabilities this process holds (the effective set, from /proc/self/status)."""

from __future__ import annotations

from pathlib import Path

# capability(7) numbers, for the ones gpuwhy cares about
CAPABILITY_BITS = {
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_RESOURCE": 24,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
}
# What the probes use, and why: systemd/gpuwhy-probes.service grants exactly these.
PROBE_CAPABILITIES = {
    "CAP_BPF": "load BPF programs and create maps",
    "CAP_PERFMON": "attach to tracepoints, read kernel memory from BPF",
    "CAP_DAC_READ_SEARCH": "list /proc/PID/fd of every process, read tracefs",
    "CAP_SYS_PTRACE": "read /proc/PID/fd links, environ and exe of other users' processes",
}


def effective_capabilities(status: str | Path = "/proc/self/status") -> set[str]:
    """Names (of CAPABILITY_BITS) in the CapEff mask of ``status``."""
    for line in Path(status).read_text().splitlines():
        if line.startswith("CapEff:"):
            mask = int(line.split()[1], 16)
            return {name for name, bit in CAPABILITY_BITS.items() if mask >> bit & 1}
    return set()


def can_load_bpf(held: set[str] | None = None) -> bool:
    """CAP_BPF with CAP_PERFMON (Linux 5.8+), or CAP_SYS_ADMIN (what older kernels ask)."""
    held = effective_capabilities() if held is None else held
    return {"CAP_BPF", "CAP_PERFMON"} <= held or "CAP_SYS_ADMIN" in held
