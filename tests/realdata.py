"""Reading the real-GPU recordings' files (tests/data/real/<gpu>/) as gpuwhy's sources would."""

from __future__ import annotations

from pathlib import Path

from gpuwhy.probes.klog.lines import RawLine
from gpuwhy.probes.klog.parse import KernelLogParser
from gpuwhy.probes.klog.source import record_event


def kernel_records(path: Path) -> list:
    """The records gpuwhy's kernel-log source makes of a recorded kernel log, line by line."""
    parser, records = KernelLogParser(), []
    for n, line in enumerate(path.read_text().splitlines()):
        for _lineno, record in parser.feed(line):
            records.append(record_event(RawLine(line, f"file:1:{n}", "boot"), record, "file", 1))
    for _lineno, record in parser.flush():
        records.append(record_event(RawLine("", "file:1:end", "boot"), record, "file", 1))
    return records
