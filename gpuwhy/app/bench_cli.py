"""`gpuwhy bench`: run scripts/bench.py, the benchmark suite of a gpuwhy checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

BENCH_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
               add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> None:
    """Every performance figure in one table, beside its reference and goal.

    Runs scripts/bench.py of this checkout; `gpuwhy bench --help` shows its options
    (--quick, --only, --json, --write-md). Most benchmarks need root (eBPF).

    \b
    Examples:
      sudo gpuwhy bench --quick
      sudo gpuwhy bench --only sidecar,probes --json bench.json
      sudo gpuwhy bench --write-md BENCHMARKS.md
    """
    if not BENCH_SCRIPT.is_file():
        raise click.ClickException(f"the benchmarks live in a gpuwhy checkout ({BENCH_SCRIPT} "
                                   "is missing): run gpuwhy bench from one")
    sys.exit(subprocess.run([sys.executable, str(BENCH_SCRIPT), *args]).returncode)
