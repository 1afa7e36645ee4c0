"""The file descriptors systemd passed to this process (socket units, sd_listen_fds(3)), by name.

systemd-python's ``listen_fds_with_names`` reads ``$LISTEN_PID``/``$LISTEN_FDS``/
``$LISTEN_FDNAMES`` and unsets them, so they are read once, here, and each fd is handed out
once: to the first caller asking for its ``FileDescriptorName=``. The environment is unset
so that nothing else (a child process, cheroot's own start-up) takes them for its own.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_passed: dict[str, int] | None = None


def _read() -> dict[str, int]:
    try:
        from systemd import daemon
    except ImportError:
        return {}
    passed = daemon.listen_fds_with_names(unset_environment=True)
    for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(key, None)     # libsystemd unsets the C environment, not Python's copy
    return {name: fd for fd, name in passed.items()}


def take_passed_fd(name: str) -> int | None:
    """The fd systemd passed under ``name`` (None: none was, or it was taken already)."""
    global _passed
    with _lock:
        if _passed is None:
            _passed = _read()
        return _passed.pop(name, None)
