"""Child processes that die with the process that started them (Linux ``PR_SET_PDEATHSIG``).

``gpuwhy up`` runs the probes as a child. Killed with SIGKILL the service cleans nothing
up, and a probes process left behind is re-parented (to PID 1 or a subreaper), reconnects
to the next service on the same bus and publishes every process event a second time. The
kernel ends such a child instead: the child asks it for a signal when its parent goes.

Two properties of that interface (prctl(2)) shape this module:

- The child arms the signal itself, after exec: a ``preexec_fn`` is not safe in a parent
  with threads, and the service has many. By then the parent may be gone already and the
  signal would never come, so the parent passes its pid (``GPUWHY_PARENT_PID``) and the
  child compares ``getppid()`` after arming, and exits when they differ.
- The "parent" is the *thread* that forked the child: the signal comes when that thread
  ends, even while its process runs on. A parent must start such a child from a thread that
  lives as long as the child should (gpuwhy.app.service keeps one until it stops the probes).
  ``getppid()`` names the process, not the thread, so the check above cannot see a thread
  that ended first (the kernel hands its children to another thread of the process).

The marker also names the child's parent to the service's start-up check for orphans
(gpuwhy.app.service): a process that carries it and whose parent is no longer that pid was
left behind.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
from collections.abc import Mapping, MutableMapping

from gpuwhy.errors import GpuwhyError

log = logging.getLogger(__name__)

PARENT_PID_ENV = "GPUWHY_PARENT_PID"
PR_SET_PDEATHSIG = 1          # <linux/prctl.h>


class ParentGone(GpuwhyError):
    """The process that started this one exited before the parent-death signal was armed."""


def child_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) naming this process as the parent a
    child started with it must die with (see :func:`die_with_parent_named_in`)."""
    return {**(os.environ if base is None else base), PARENT_PID_ENV: str(os.getpid())}


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> None:
    """Have the kernel send ``signum`` to this process when the thread of ``parent`` that
    started it ends; raises ParentGone when ``parent`` is no longer this process's parent
    (it died first: the signal will never come), OSError when prctl fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    # Checked after arming, not before: a parent that dies from here on sends the signal.
    if os.getppid() != parent:
        raise ParentGone(f"started by process {parent}, which is gone (parent now "
                         f"{os.getppid()})")


def die_with_parent_named_in(environ: MutableMapping[str, str] = os.environ,
                             signum: int = signal.SIGKILL) -> int | None:
    """:func:`die_with_parent` for the parent named in ``GPUWHY_PARENT_PID`` (set by
    :func:`child_environment`); returns its pid, None when the variable is not set (started
    by hand or by systemd: nothing to die with). Raises ParentGone as die_with_parent does.

    A failing prctl is logged and ignored: the process runs on, and the next service's
    start-up check for orphans ends it if it is left behind. The variable is removed from
    ``environ``, so that this process's own children do not take it for their own marker.
    """
    value = environ.pop(PARENT_PID_ENV, None)
    if not value:
        return None
    try:
        parent = int(value)
    except ValueError:
        log.warning("ignoring %s=%r: not a pid", PARENT_PID_ENV, value)
        return None
    try:
        die_with_parent(parent, signum)
    except OSError as exc:
        log.warning("cannot arrange to end with the parent process %d (%s); a service that "
                    "starts later stops this process if it is left behind", parent, exc)
    return parent
