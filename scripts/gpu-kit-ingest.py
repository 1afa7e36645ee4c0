#!/usr/bin/env python3
"""Copy a gpu-kit.sh recording's files into tests/data/real/<model>/, as test fixtures.

    scripts/gpu-kit-ingest.py OUT_DIR --model h200            # → tests/data/real/h200/
    scripts/gpu-kit-ingest.py gpu-kit.tar.gz --model h200     # the kit's packed folder
    scripts/gpu-kit-ingest.py OUT_DIR --model h200 --dest DIR --force

Keeps what the tests read (tests/data/real/README.md): summary.json, env.json, host/,
gpuwhy/, nvml/, xid/, service/, nvtrace/ (the recorded driver calls, gzipped), probes/ (the
probe's trace of the same calls, gzipped; P1 on the driver), service/capture.jsonl gzipped,
work/phases.jsonl and
work/work.json; leaves out logs/ and the kit's handshake files. A file over --max-file-kib
is left out and named; the whole copy must stay under --max-total-mib. The result must pass
the layout check, else nothing is kept.
"""

from __future__ import annotations

import argparse
import gzip
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_kit import layout_problems  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
KEPT_TOP = ("summary.json", "env.json")
KEPT_DIRS = ("host", "gpuwhy", "nvml", "nvtrace", "xid", "service", "probes")
# driver calls and bus traffic: long, and compress well
GZIPPED = ("nvtrace/calls.nvt", "probes/trace.jsonl", "service/capture.jsonl")
KEPT_WORK = ("work/phases.jsonl", "work/work.json")


def selected(recording: Path) -> list[Path]:
    """The files of ``recording`` that become fixtures, relative to it."""
    files = [Path(n) for n in KEPT_TOP + KEPT_WORK if (recording / n).is_file()]
    for top in KEPT_DIRS:
        files += [p.relative_to(recording) for p in sorted((recording / top).rglob("*"))
                  if p.is_file() and not p.is_symlink()]
    return files


def ingest(recording: Path, dest: Path, max_file: int, max_total: int,
           force: bool = False) -> list[str]:
    """Copy; returns what was left out (and why). Raises ValueError when the copy would be
    too big or not a readable recording, leaving ``dest`` as it was."""
    problems = layout_problems(recording)
    if problems:
        raise ValueError(f"{recording} is not a complete recording: " + "; ".join(problems))
    if dest.exists() and not force:
        raise ValueError(f"{dest} exists (--force replaces it)")
    left_out, total = [], 0
    with tempfile.TemporaryDirectory(dir=dest.parent if dest.parent.exists() else None) as tmp:
        staged = Path(tmp) / dest.name
        for rel in selected(recording):
            size = (recording / rel).stat().st_size
            if str(rel) in GZIPPED:
                size = len(gzip.compress((recording / rel).read_bytes(), 6))
            if size > max_file:
                left_out.append(f"{rel} ({size} bytes, over {max_file})")
                continue
            total += size
            if total > max_total:
                raise ValueError(f"over {max_total} bytes in all: raise --max-total-mib or "
                                 f"lower --max-file-kib")
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            if str(rel) in GZIPPED:
                with open(recording / rel, "rb") as src, \
                        gzip.open(staged / rel.with_name(rel.name + ".gz"), "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copyfile(recording / rel, staged / rel)
        problems = layout_problems(staged)
        if problems:
            raise ValueError("the copy would not be readable: " + "; ".join(problems))
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(staged, dest)
    return left_out


def unpacked(recording: Path, into: Path) -> Path:
    """A recording packed by the kit (``gpu-kit.tar.gz``), unpacked under ``into``: the
    folder in it that holds summary.json. A folder is returned as it is."""
    if recording.is_dir():
        return recording
    with tarfile.open(recording) as tar:
        members = tar.getmembers()
        for member in members:   # a recording is plain files and folders, inside `into`
            if not (member.isfile() or member.isdir()) or member.name.startswith("/") \
                    or ".." in Path(member.name).parts:
                raise ValueError(f"{recording}: {member.name!r} is not a recording's file")
        tar.extractall(into, members=members)
    found = sorted(into.rglob("summary.json"))
    if not found:
        raise ValueError(f"{recording}: no summary.json in it")
    return found[0].parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--model", required=True, help="fixture folder name, e.g. h200")
    parser.add_argument("--dest", type=Path, help="default: tests/data/real/<model>")
    parser.add_argument("--max-file-kib", type=int, default=1024)
    parser.add_argument("--max-total-mib", type=int, default=8)
    parser.add_argument("--force", action="store_true", help="replace an existing folder")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,39}", args.model):
        parser.error(f"--model: lower-case letters, digits and dashes, not {args.model!r}")
    dest = args.dest or REPO / "tests" / "data" / "real" / args.model
    try:
        with tempfile.TemporaryDirectory() as tmp:
            left_out = ingest(unpacked(args.recording, Path(tmp)), dest,
                              args.max_file_kib * 1024, args.max_total_mib * 2 ** 20,
                              args.force)
    except (ValueError, tarfile.TarError) as exc:
        print(f"gpu-kit-ingest: {exc}", file=sys.stderr)
        return 1
    for line in left_out:
        print(f"left out: {line}")
    print(f"gpu-kit-ingest: {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
