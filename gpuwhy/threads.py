"""gpuwhy's threads, named in the kernel as in Python (``/proc/PID/task/*/comm``).

``top -H``, ``ps -L`` and the wake-up profile in BENCHMARKS.md can then say which of the
service's threads runs; without it every thread reads ``gpuwhy`` or ``python``.
"""

from __future__ import annotations

import ctypes
import logging
import threading

log = logging.getLogger(__name__)

PR_SET_NAME = 15          # <linux/prctl.h>
TASK_COMM_LEN = 16        # the kernel keeps 15 bytes and a NUL

_libc = ctypes.CDLL(None, use_errno=True)


def os_name(name: str) -> str:
    """The kernel's name for a thread called ``name``: without the ``gpuwhy-`` prefix that
    every name shares, cut to the 15 bytes the kernel keeps."""
    return name.removeprefix("gpuwhy-").encode("ascii", "replace")[:TASK_COMM_LEN - 1].decode()


def name_this_thread(name: str) -> None:
    """Set the calling thread's kernel name; a failure costs only the name."""
    if _libc.prctl(PR_SET_NAME, os_name(name).encode(), 0, 0, 0) != 0:
        log.debug("prctl(PR_SET_NAME, %r) failed: errno %d", name, ctypes.get_errno())


class Thread(threading.Thread):
    """A ``threading.Thread`` that gives itself its Python name in the kernel too."""

    def run(self) -> None:
        name_this_thread(self.name)
        super().run()
