#!/usr/bin/env python3
"""bench_cuda_uprobes: what the CUDA uprobes cost a traced process, per call.

USAGE: sudo .venv/bin/python scripts/bench_cuda_uprobes.py [--calls 200000] [--repeat 5]
                                                           [--json FILE]

Builds the stand-in libcuda.so.1/libcudart.so.12 and tests/replay/cudaprog.c, and times, in
that program, ns per call of:
  - a traced driver function (cuGraphLaunch: one uprobe + one uretprobe),
  - a traced runtime function (cudaGraphLaunch, which calls cuGraphLaunch: two pairs, one
    counted),
  - an untraced function of the same library (cuDriverGetVersion),
in three setups: no probes; the CUDA probe attached (its real programs); attached but
turned off in the kernel (what the kill switch leaves for the moment before the links are
closed: the trap alone). Each figure is the median of --repeat runs. Prints a markdown
table and, with --json, writes the figures. The stand-in functions do almost nothing, so
the added cost is the probes' whole cost: expect microseconds per traced call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "replay"))

import fakecuda  # noqa: E402

from gpuwhy.config import load_config  # noqa: E402
from gpuwhy.proc import process_key  # noqa: E402

ROWS = (("traced driver call (cuGraphLaunch)", "traced_ns"),
        ("traced runtime call (cudaGraphLaunch -> cuGraphLaunch)", "traced_nested_ns"),
        ("untraced call, same library (cuDriverGetVersion)", "untraced_ns"))


def measure(program: subprocess.Popen, calls: int, repeat: int) -> dict[str, float]:
    runs = []
    for _ in range(repeat):
        program.stdin.write(f"bench {calls}\n")
        program.stdin.flush()
        runs.append(json.loads(program.stdout.readline()))
    medians = {key: statistics.median(run[key] for run in runs) for _, key in ROWS}
    return {**medians, **{f"{key}_runs": [run[key] for run in runs] for _, key in ROWS}}


def run(calls: int = 200_000, repeat: int = 5) -> dict[str, dict]:
    """{setup: {figure key: median ns, key_runs: [ns of each run]}} for the three setups."""
    from gpuwhy.probes.cuda.probe import CudaProbe

    with tempfile.TemporaryDirectory() as workdir:
        work = Path(workdir)
        built = fakecuda.build(work)
        device = work / "nvidiactl"
        device.touch()
        program = subprocess.Popen([str(built["prog"]), str(device)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        pid = json.loads(program.stdout.readline())["pid"]
        results = {"no probes": measure(program, calls, repeat)}
        config = load_config(environ={"GPUWHY_CUDA_UPROBES": "1",
                                      "GPUWHY_CUDA_ALLOWED_BUILD_IDS": "*",
                                      "GPUWHY_CUDA_CONTROL_DIR": str(work / "ctl"),
                                      "GPUWHY_CUDA_MAX_OVERHEAD_PCT": "100000"})
        events: list = []
        probe = CudaProbe(config, events.append)
        probe.load()
        probe.watch(process_key(pid))
        deadline = time.monotonic() + 30
        while probe.counts["attached_probes"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        results["cuda uprobes"] = measure(program, calls, repeat)
        probe.set_enabled(False, "benchmark")   # programs return at once; uprobes stay
        results["uprobes, programs off"] = measure(program, calls, repeat)
        probe.close()
        program.stdin.write("quit\n")
        program.stdin.flush()
        program.wait(10)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = run(args.calls, args.repeat)
    base = results["no probes"]
    print(f"ns per call, median of {args.repeat} runs of {args.calls} calls\n")
    print("| call | no probes | cuda uprobes | added | uprobes, programs off | added |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, key in ROWS:
        on, off = results["cuda uprobes"][key], results["uprobes, programs off"][key]
        print(f"| {label} | {base[key]:.0f} | {on:.0f} | +{on - base[key]:.0f} | {off:.0f} | "
              f"+{off - base[key]:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
