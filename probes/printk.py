"""printk: counts the records the kernel logs, so a kernel-log source that reads none is seen.

Loads ``printk.bpf.c`` (one tracepoint, ``printk:console``, one array). Its count goes out
in the probe's health beat (``records``, ``last_ns``); the correlator's kernel-log liveness
check (``correlator/klog_liveness.py``) sets it against the lines the kernel-log source read.
Cost: one map update per kernel log record; nothing on any other path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwhy.probes.bpfdefs import Define, cflags
from gpuwhy.probes.fdtrack import load_bpf

NAME = "printk"
BPF_SOURCE = Path(__file__).with_name("printk.bpf.c")


def bpf_defines() -> dict[str, Define]:
    """printk.bpf.c shares no constant with Python."""
    return {}


CFLAGS = cflags(bpf_defines())


class PrintkProbe:
    """``load()``, then ``counters()`` whenever; ``close()`` detaches."""

    def __init__(self) -> None:
        self._bpf: Any = None      # the loaded bcc.BPF (bcc has no types); None before load()

    def load(self) -> None:
        """Compile and attach (raises ProbeLoadError)."""
        self._bpf = load_bpf(NAME, BPF_SOURCE, CFLAGS)

    @property
    def bpf(self) -> Any:
        """The loaded bcc program (None before ``load()``)."""
        return self._bpf

    def counters(self) -> dict[str, int]:
        """Kernel log records since the probe was loaded, and the newest one's monotonic ns."""
        if self._bpf is None:
            return {"records": 0, "last_ns": 0}
        beat = self._bpf[b"beat"][0]
        return {"records": int(beat.records), "last_ns": int(beat.last_ns)}

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
