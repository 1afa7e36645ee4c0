#!/usr/bin/env python3
"""bench_attach: what each way of attaching to ioctl costs before any work is done.

USAGE: sudo .venv/bin/python scripts/bench_attach.py [--repeat 5] [--device /dev/nvidiactl]

Loads a bare program pair (one array lookup, scripts/bench_attach.bpf.c) on each
attachment a probe could use to see ioctl enter and exit, and measures with
scripts/bench_probes.c the ns added to an ioctl and to getppid (any other syscall). This is
the floor under fdtrack's figures: no program body can cost less than its attachment.
Attachments the kernel refuses (kprobes and fentry where ftrace or BTF is missing) are
reported with the kernel's reason instead of a figure.

The same bare program on every tracepoint the probes attach (read from their sources:
``probe_tracepoints``) is P2's floor: what any probe there adds to a context switch and a
syscall before its body does anything (``attach_probes_floor``; bench_probes.py uses it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_probes import bpf_stats, compile_bench, measure  # noqa: E402

VARIANTS = {
    "tp_pair": "syscalls:sys_enter_ioctl + sys_exit_ioctl tracepoints",
    "tp_enter": "syscalls:sys_enter_ioctl only (no latency, no return)",
    "raw_pair": "raw tracepoints sys_enter + sys_exit, filtered on the syscall number",
    "raw_enter": "raw tracepoint sys_enter only, filtered on the syscall number",
    "kprobe": "kprobe + kretprobe on __x64_sys_ioctl",
    "fentry": "fentry + fexit on __x64_sys_ioctl (BTF trampolines)",
}
CHOSEN = "tp_pair"

# What `gpuwhy probes` loads (probes/privileged.py): fdtrack, lifecycle, sched, printk.
PROBE_SOURCES = ("fdtrack.bpf.c", "lifecycle.bpf.c", "sched.bpf.c", "printk.bpf.c")
_PROBE_MACRO = re.compile(r"^(RAW_)?TRACEPOINT_PROBE\((\w+)(?:,\s*(\w+))?\)", re.M)
TRACEFS = Path("/sys/kernel/tracing")


def probe_tracepoints(tracefs: Path = TRACEFS) -> list[tuple[str, str]]:
    """(category, event) of each tracepoint the probes' sources attach, ("raw", event) for a
    raw one, each once; the tracepoints this kernel lacks (sys_enter_open on arm64,
    sock_recv_length before 6.4) are left out, as the probes leave them out."""
    from gpuwhy import probes

    found: list[tuple[str, str]] = []
    for name in PROBE_SOURCES:
        text = (Path(probes.__file__).parent / name).read_text()
        for raw, first, second in _PROBE_MACRO.findall(text):
            where = ("raw", first) if raw else (first, second)
            exists = any((tracefs / "events").glob(f"*/{first}")) if raw else \
                (tracefs / "events" / first / second).is_dir()
            if exists and where not in found:
                found.append(where)
    return found


def attach_probes_floor():
    """The loaded bcc.BPF of a bare program (one array lookup) on each of
    ``probe_tracepoints()``: the probes' attachments with nothing in them."""
    from bcc import BPF

    prelude = (HERE / "bench_attach.bpf.c").read_text()
    bare = "{ return untracked() ? 0 : 1; }"
    programs = [f"RAW_TRACEPOINT_PROBE({event}) {bare}" if category == "raw" else
                f"TRACEPOINT_PROBE({category}, {event}) {bare}"
                for category, event in probe_tracepoints()]
    return BPF(text=prelude + "\n" + "\n".join(programs))


def attach(variant: str):
    """The loaded bcc.BPF for one variant; raises what bcc raises when the kernel refuses."""
    from bcc import BPF

    bpf = BPF(src_file=str(HERE / "bench_attach.bpf.c"), cflags=[f"-DVARIANT_{variant.upper()}"])
    if variant == "kprobe":
        try:
            bpf.attach_kprobe(event="__x64_sys_ioctl", fn_name="on_ioctl")
            bpf.attach_kretprobe(event="__x64_sys_ioctl", fn_name="on_ioctl")
        except Exception:
            bpf.cleanup()
            raise
    return bpf


def refusal(variant: str, exc: BaseException) -> str:
    """The kernel's reason, in its words where bcc's message would mislead."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    text = lines[-1][:160] if lines else type(exc).__name__
    if "super-user" in text and os.geteuid() == 0:
        # bcc words every EPERM as a privilege problem; as root it means the kernel has
        # no trampoline for this function (no ftrace direct calls, or no BTF for it)
        return f"loading was refused with EPERM although running as root ({variant})"
    if variant == "kprobe" and not Path("/sys/kernel/tracing/kprobe_events").exists():
        return "no kprobe_events in tracefs: the kernel has no kprobes for BPF"
    return text


def run(repeat: int = 5, n_calls: int = 300_000, device: str | None = None) -> dict:
    """{variant: {"ioctl": ns added, "getppid": ns added, "runs": {...}} or {"refused": why}},
    plus "baseline" (ns per call with nothing attached, measured before and after).
    ``device``: the ioctl is a real RM control on that NVIDIA device (as bench_probes.py
    --device times it), so that the floor is taken on the very call P1 traces."""
    with tempfile.TemporaryDirectory() as tmp, bpf_stats(False):
        bench = str(compile_bench(Path(tmp)))
        target = Path(tmp) / "plain-file"
        target.touch()
        traced = [bench, "rmcontrol", device] if device else [bench, "ioctl", str(target)]
        cases = {"ioctl": [*traced, str(n_calls)],
                 "getppid": [bench, "getppid", str(3 * n_calls)]}

        def baseline() -> dict[str, list[float]]:
            return {case: measure(command, repeat) for case, command in cases.items()}

        before = baseline()
        results: dict = {}
        for variant in VARIANTS:
            try:
                bpf = attach(variant)
            except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception
                results[variant] = {"refused": refusal(variant, exc)}
                continue
            try:
                time.sleep(0.2)
                runs = {case: measure(command, repeat) for case, command in cases.items()}
            finally:
                bpf.cleanup()
            results[variant] = {"runs": runs}
        after = baseline()
        base = {case: statistics.median(before[case] + after[case]) for case in cases}
        for figures in results.values():
            if "runs" in figures:
                for case in cases:
                    figures[case] = statistics.median(figures["runs"][case]) - base[case]
        results["baseline"] = base
        return results


def table(results: dict) -> str:
    base = results["baseline"]
    lines = ["| attachment (bare programs) | ioctl added (ns) | other syscall added (ns) |",
             "|---|---|---|",
             f"| nothing attached | {base['ioctl']:.0f} per call "
             f"| {base['getppid']:.0f} per call |"]
    for variant, label in VARIANTS.items():
        figures = results[variant]
        chosen = " (fdtrack's)" if variant == CHOSEN else ""
        if "refused" in figures:
            lines.append(f"| {label} | refused: {figures['refused']} | |")
        else:
            lines.append(f"| {label}{chosen} | {figures['ioctl']:+.0f} "
                         f"| {figures['getppid']:+.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", help="time a real RM control on this NVIDIA device")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_attach: needs root (it loads eBPF programs)")
    results = run(args.repeat, device=args.device)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
